"""locksim adapter for kazoo's Lock (https://github.com/python-zk/kazoo, kazoo/recipe/lock.py).

Curator's recipe in Python: an ephemeral sequential node under the lock's path, a watch on the one
before it. The lock lives as long as the session: a process stopped past the session timeout has its
session expired by the server, its node deleted and the lock handed on. kazoo then reports the session
LOST to its listeners — which this adapter passes on to locksim as `lost` — but only once the process
runs again and its connection thread notices. The scenario's [recipe] keys: SESSION_TIMEOUT (e.g. "2s"),
TIMEOUT (how long acquire waits) and FENCING_TOKEN ("none", the default, or "sequence").

kazoo offers no fencing token, but with FENCING_TOKEN = "sequence" this adapter answers the sequence
number of its lock node (`Lock.node`, "<uuid>__lock__0000000007"): ZooKeeper numbers a parent's
sequential children in creation order, and kazoo grants the lock only to the lowest live node, so each
grant's number is above every earlier grant's. The protocol is in locksim_adapter.
"""
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, LockTimeout

from locksim_adapter import CLIENT, LOCK_NAME, lost, param, seconds, serve, zookeeper_hosts

zk = KazooClient(hosts=zookeeper_hosts(), timeout=seconds(param("session_timeout", "10s")))
zk.start()
lock = zk.Lock("/locksim/" + LOCK_NAME.replace(":", "-"), identifier=CLIENT)
wait = seconds(param("timeout", "5s"))
fencing = param("fencing_token", "none")
if fencing not in ("none", "sequence"):
    raise SystemExit(f"kazoo_lock: FENCING_TOKEN is \"none\" or \"sequence\", not {fencing!r}")


def listener(state):
    if state == KazooState.LOST and lock.is_acquired:
        lost("kazoo: session LOST")


zk.add_listener(listener)


def acquire():
    try:
        if lock.acquire(timeout=wait):
            return {"ok": True, "token": int(lock.node[len(lock.prefix) :]) if fencing == "sequence" else None}
        return {"ok": False, "reason": "not acquired"}
    except LockTimeout as e:
        return {"ok": False, "reason": f"LockTimeout: {e}"}
    except KazooException as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        if lock.release():
            return {"ok": True}
        return {"ok": False, "reason": "not held"}
    except KazooException as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
