"""locksim adapter for redis-py's Lock (https://github.com/redis/redis-py, redis/lock.py).

The scenario's [recipe] keys: TIMEOUT (the lock's expiry, e.g. "1s"), BLOCKING_TIMEOUT (how long acquire
waits, e.g. "5s") and SLEEP (how often a waiter polls, e.g. "100ms"). The protocol is in locksim_adapter.
"""
import redis
from redis.exceptions import LockError, RedisError

from locksim_adapter import LOCK_NAME, param, redis_address, seconds, serve

host, port = redis_address()
client = redis.Redis(host=host, port=port, socket_timeout=2.0)
lock = client.lock(
    LOCK_NAME,
    timeout=seconds(param("timeout", "10s")),
    blocking_timeout=seconds(param("blocking_timeout", "5s")),
    sleep=seconds(param("sleep", "100ms")),
)


def acquire():
    try:
        if lock.acquire():
            return {"ok": True, "token": None}  # redis-py's Lock offers no fencing token
        return {"ok": False, "reason": "blocking_timeout passed"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        lock.release()
        return {"ok": True}
    except LockError as e:  # LockNotOwnedError: it expired (and maybe someone else took it)
        return {"ok": False, "reason": f"{type(e).__name__}: {e}"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
