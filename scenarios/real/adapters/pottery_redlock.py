"""locksim adapter for pottery's Redlock (https://github.com/brainix/pottery, pottery/redlock.py).

Redlock over the masters locksim gives (one, in real mode today): SET NX PX on each, valid only while
less than the auto-release time has passed, minus clock drift. The scenario's [recipe] keys:
AUTO_RELEASE_TIME (e.g. "1s") and TIMEOUT (how long acquire retries). The protocol is in locksim_adapter.
"""
import redis
from pottery import Redlock
from pottery.exceptions import ReleaseUnlockedLock
from redis.exceptions import RedisError

from locksim_adapter import LOCK_NAME, param, redis_address, seconds, serve

host, port = redis_address()
masters = {redis.Redis(host=host, port=port, socket_timeout=2.0)}
lock = Redlock(key=LOCK_NAME, masters=masters, auto_release_time=seconds(param("auto_release_time", "10s")))
wait = seconds(param("timeout", "5s"))


def acquire():
    try:
        if lock.acquire(timeout=wait):
            return {"ok": True, "token": None}  # Redlock offers no fencing token
        return {"ok": False, "reason": "timeout passed"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        lock.release()
        return {"ok": True}
    except ReleaseUnlockedLock as e:  # it expired (and maybe someone else took it)
        return {"ok": False, "reason": f"ReleaseUnlockedLock: {e}"}
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
