"""locksim adapter for kazoo's ReadLock and WriteLock (https://github.com/python-zk/kazoo,
kazoo/recipe/lock.py).

Both are kazoo's Lock with other node names under one path: a writer makes `__lock__` nodes and waits for
every lower `__lock__` and `__rlock__`, a reader makes `__rlock__` nodes and waits only for lower
`__lock__` ones, so readers share the lock and a writer has it alone. Each node is ephemeral: it lives as
long as the session, and a process stopped past the session timeout has its session expired and its node
deleted by the server, handing the lock on. kazoo reports the session LOST to its listeners, passed on to
locksim as `lost`, once the process runs again and its connection thread notices. locksim asks for the
read side with `{"op":"acquire","shared":true}` (the scenario's `[workload] reads`). The scenario's
[recipe] keys: SESSION_TIMEOUT (e.g. "2s") and TIMEOUT (how long acquire waits). The protocol is in
locksim_adapter.
"""
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, LockTimeout

from locksim_adapter import CLIENT, LOCK_NAME, lost, param, seconds, serve, zookeeper_hosts

zk = KazooClient(hosts=zookeeper_hosts(), timeout=seconds(param("session_timeout", "10s")))
zk.start()
path = "/locksim/" + LOCK_NAME.replace(":", "-")
read_lock, write_lock = zk.ReadLock(path, identifier=CLIENT), zk.WriteLock(path, identifier=CLIENT)
wait = seconds(param("timeout", "5s"))
held = None  # the lock acquired last, which release gives up


def listener(state):
    if state == KazooState.LOST and held is not None and held.is_acquired:
        lost("kazoo: session LOST")


zk.add_listener(listener)


def take(lock):
    global held
    try:
        if lock.acquire(timeout=wait):
            held = lock
            return {"ok": True, "token": None}  # kazoo's locks offer no fencing token
        return {"ok": False, "reason": "not acquired"}
    except LockTimeout as e:
        return {"ok": False, "reason": f"LockTimeout: {e}"}
    except KazooException as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        if held is not None and held.release():
            return {"ok": True}
        return {"ok": False, "reason": "not held"}
    except KazooException as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(lambda: take(write_lock), release, acquire_shared=lambda: take(read_lock))
