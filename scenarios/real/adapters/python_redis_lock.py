"""locksim adapter for python-redis-lock (https://github.com/ionelmc/python-redis-lock, redis_lock).

Its Lock waits on a BLPOP signal list rather than polling, and with `auto_renewal` a thread renews the
key every expire × 2/3 — a thread that a stop-the-world pause of the process stops too. The scenario's
[recipe] keys: EXPIRE (the key's expiry, e.g. "1s"), AUTO_RENEWAL ("true"/"false") and TIMEOUT (how long
acquire waits). The protocol is in locksim_adapter.
"""
import redis
import redis_lock
from redis.exceptions import RedisError

from locksim_adapter import LOCK_NAME, param, redis_address, seconds, serve

host, port = redis_address()
client = redis.Redis(host=host, port=port, socket_timeout=2.0)
expire = max(1, round(seconds(param("expire", "10s"))))  # whole seconds, as the library takes them
wait = seconds(param("timeout", "5s"))
auto_renewal = param("auto_renewal", "false") == "true"
lock = None


def acquire():
    # A Lock per acquire, as the library's docs use it (`with redis_lock.Lock(conn, name):`). One Lock
    # reused cannot be acquired again once its renewal thread has died on an expired key: release()
    # leaves the dead thread set (4.0.0, `_stop_lock_renewer`), and acquire() raises AlreadyStarted.
    global lock
    lock = redis_lock.Lock(client, LOCK_NAME, expire=expire, auto_renewal=auto_renewal)
    try:
        if lock.acquire(blocking=True, timeout=wait):
            return {"ok": True, "token": None}  # no fencing token
        return {"ok": False, "reason": "timeout passed"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        lock.release()
        return {"ok": True}
    except redis_lock.NotAcquired as e:  # it expired (and maybe someone else took it)
        return {"ok": False, "reason": f"NotAcquired: {e}"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
