"""locksim adapter for python-etcd3's Lock (https://github.com/kragniz/python-etcd3, etcd3/locks.py).

`Lock.acquire` grants a lease of `ttl` seconds, then puts the key /locks/<name> with it in a transaction
that requires the key not to exist (create revision 0); when it exists, it waits for any event on the key
(`watch_once`) and tries again. Nothing renews the lease (only an explicit `refresh()` would), so the
lock lasts `ttl` whatever the holder does; `release` deletes the key if it still holds our uuid.

The library keeps no revision ("TODO: save the created revision"), so with FENCING_TOKEN = "revision"
this adapter reads the key back after acquiring it and, if it still holds our uuid, answers its create
revision as the fencing token: etcd's revisions only grow, so each new holder's key has a higher one.
The scenario's [recipe] keys: TTL (whole seconds, e.g. "2s"; the server raises a TTL below its minimum,
2 s with etcd's default election timeout), TIMEOUT (how long acquire waits) and FENCING_TOKEN ("none",
the default, or "revision"). The protocol is in locksim_adapter.
"""
import etcd3
from etcd3.exceptions import Etcd3Exception

from locksim_adapter import LOCK_NAME, etcd_address, param, seconds, serve

host, port = etcd_address()
client = etcd3.client(host=host, port=port)
lock = client.lock(LOCK_NAME, ttl=max(1, round(seconds(param("ttl", "10s")))))
wait = seconds(param("timeout", "5s"))
fencing = param("fencing_token", "none")
if fencing not in ("none", "revision"):
    raise SystemExit(f"etcd3_lock: FENCING_TOKEN is \"none\" or \"revision\", not {fencing!r}")


def token():
    """The lock key's create revision if the key is still ours, else None (the lease already ran out)."""
    value, meta = client.get(lock.key)
    return meta.create_revision if value == lock.uuid else None


def acquire():
    try:
        if not lock.acquire(timeout=wait):
            return {"ok": False, "reason": "timeout passed"}
        return {"ok": True, "token": token() if fencing == "revision" else None}
    except Etcd3Exception as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        if lock.release():
            return {"ok": True}
        return {"ok": False, "reason": "the key holds another uuid (the lease ran out)"}
    except Etcd3Exception as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
