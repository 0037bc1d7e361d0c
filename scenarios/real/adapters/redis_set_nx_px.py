"""locksim adapter for the raw Redis lock: `SET lock <id> NX PX ttl` through redis-py
(https://github.com/redis/redis-py; the Redis SET documentation, "a simple locking primitive"), as
locksim's built-in `redis.set-nx-px` recipe does it (locks/src/redis/set_nx_px.rs):

1. acquire: `SET <lock> <random id> NX PX ttl`; nil means taken: sleep RETRY, try again until
   ACQUIRE_TIMEOUT has passed.
2. `INCR <lock>:fence`: the fencing token, above every earlier holder's (the counter is never deleted).
3. release with RELEASE = "del": `DEL <lock>`, whoever's key it is; with "compare-and-delete" (the
   default): redis-py's own release script (`redis.lock.Lock.LUA_RELEASE_SCRIPT`, delete only if the key
   holds our id), sent as redis-py's `Script` sends it: EVALSHA, loaded on NOSCRIPT.

The key expires after TTL whatever its holder does; with `[workload] fencing = true` the resource
refuses the paused holder's lower token. The protocol is in locksim_adapter.
"""
import time
import uuid

import redis
from redis.exceptions import RedisError
from redis.lock import Lock

from locksim_adapter import LOCK_NAME, param, redis_address, seconds, serve

host, port = redis_address()
client = redis.Redis(host=host, port=port, socket_timeout=2.0)
ttl_ms = round(seconds(param("ttl", "10s")) * 1000)
retry = seconds(param("retry", "100ms"))
acquire_timeout = seconds(param("acquire_timeout", "10s"))
release_by = param("release", "compare-and-delete")
if release_by not in ("del", "compare-and-delete"):
    raise SystemExit(f"redis_set_nx_px: RELEASE is \"del\" or \"compare-and-delete\", not {release_by!r}")
compare_and_delete = client.register_script(Lock.LUA_RELEASE_SCRIPT)
value = None


def acquire():
    global value
    value = uuid.uuid4().hex
    deadline = time.monotonic() + acquire_timeout
    try:
        while not client.set(LOCK_NAME, value, nx=True, px=ttl_ms):
            if time.monotonic() >= deadline:
                return {"ok": False, "reason": "timed out waiting"}
            time.sleep(retry)
    except RedisError as e:
        return {"unknown": f"SET NX: {type(e).__name__}: {e}"}
    try:
        return {"ok": True, "token": client.incr(f"{LOCK_NAME}:fence")}
    except RedisError:
        return {"ok": True, "token": None}  # the lock is ours, without a token (as the built-in recipe)


def release():
    try:
        if release_by == "del":
            deleted = client.delete(LOCK_NAME)
        else:
            deleted = compare_and_delete(keys=[LOCK_NAME], args=[value])
    except RedisError as e:
        return {"unknown": f"{type(e).__name__}: {e}"}
    if deleted == 1:
        return {"ok": True}
    return {"ok": False, "reason": "the lock key was not ours any more"}


serve(acquire, release)
