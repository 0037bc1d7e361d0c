"""The locksim side of an adapter: the environment and the JSON-lines loop (docs/real-mode.md).

An adapter is one process per client. It builds its library's lock from the environment, then hands
`serve` two functions, `acquire()` and `release()`, each returning a reply: `{"ok": True, "token": N}`
(`None`: no fencing token), `{"ok": False, "reason": ...}`, or `{"unknown": ...}` when it cannot tell
whether the call took effect — and, for a lock with a read mode, `acquire_shared()`, which locksim asks
for (`{"op":"acquire","shared":true}`) only when the scenario has `[workload] reads`. Copy this file with
the adapter you write for your own library.
"""
import json
import os
import sys
import threading


def seconds(text):
    """A locksim duration ("250ms", "1s", "2m") in seconds."""
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"not a duration: {text!r}")


def param(key, default):
    """The scenario's `[recipe] key = "..."` (LOCKSIM_PARAM_<KEY>), or `default`."""
    return os.environ.get(f"LOCKSIM_PARAM_{key.upper()}", default)


def redis_address():
    """The real Redis locksim started: (host, port)."""
    host, port = os.environ["LOCKSIM_REDIS"].rsplit(":", 1)
    return host, int(port)


def zookeeper_hosts():
    """The real ZooKeeper locksim started (`[recipe] server = "zookeeper"`): "host:port"."""
    return os.environ["LOCKSIM_ZOOKEEPER"]


def etcd_address():
    """The real etcd locksim started (`[recipe] server = "etcd"`): (host, port) of its gRPC API."""
    host, port = os.environ["LOCKSIM_ETCD"].rsplit(":", 1)
    return host, int(port)


def postgres_dsn():
    """The real PostgreSQL locksim started (`[recipe] server = "postgresql"`): a libpq connection
    string, "host=127.0.0.1 port=PORT user=postgres dbname=postgres"."""
    return os.environ["LOCKSIM_POSTGRES"]


LOCK_NAME = os.environ["LOCKSIM_LOCK"]
CLIENT = os.environ["LOCKSIM_CLIENT"]


_SAY = threading.Lock()


def _say(reply):
    with _SAY:
        print(json.dumps(reply), flush=True)


def lost(reason):
    """Tell locksim, unprompted, that the lock this client held is gone (from any thread)."""
    _say({"lost": reason})


def _no_shared_mode():
    return {"ok": False, "reason": "this adapter has no shared mode"}


def serve(acquire, release, acquire_shared=_no_shared_mode):
    """Answer locksim's requests until it closes stdin."""
    answers = {
        "acquire": acquire,
        "acquire-shared": acquire_shared,
        "release": release,
        # The critical section: locksim reads and writes its resource when we answer.
        "enter": lambda: {"entered": True},
        "write": lambda: {"writing": True},
    }
    for line in sys.stdin:
        request = json.loads(line)
        op = "acquire-shared" if request.get("shared") else request["op"]
        _say(answers[op]())
