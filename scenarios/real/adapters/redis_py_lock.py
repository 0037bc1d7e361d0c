"""locksim adapter for redis-py's Lock (https://github.com/redis/redis-py, redis/lock.py).

One process per client. locksim writes one JSON request per line on stdin and reads one JSON reply per
line on stdout (README, "Real mode"). Copy this file for your own lock library: only `acquire` and
`release` below are about redis-py.

Environment: LOCKSIM_REDIS (host:port), LOCKSIM_CLIENT, LOCKSIM_LOCK (the lock's name), and the
scenario's [recipe] keys as LOCKSIM_PARAM_<KEY>: here TIMEOUT (the lock's expiry, e.g. "1s"),
BLOCKING_TIMEOUT (how long acquire waits, e.g. "5s") and SLEEP (how often a waiter polls, e.g. "100ms").
"""
import json
import os
import sys

import redis
from redis.exceptions import LockError, RedisError


def seconds(text):
    """A locksim duration ("250ms", "1s", "2m") in seconds."""
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"not a duration: {text!r}")


host, port = os.environ["LOCKSIM_REDIS"].rsplit(":", 1)
client = redis.Redis(host=host, port=int(port), socket_timeout=2.0)
lock = client.lock(
    os.environ["LOCKSIM_LOCK"],
    timeout=seconds(os.environ.get("LOCKSIM_PARAM_TIMEOUT", "10s")),
    blocking_timeout=seconds(os.environ.get("LOCKSIM_PARAM_BLOCKING_TIMEOUT", "5s")),
    sleep=seconds(os.environ.get("LOCKSIM_PARAM_SLEEP", "100ms")),
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


ANSWERS = {
    "acquire": acquire,
    "release": release,
    # The critical section: locksim reads and writes its resource when we answer.
    "enter": lambda: {"entered": True},
    "write": lambda: {"writing": True},
}

for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps(ANSWERS[request["op"]]()), flush=True)
