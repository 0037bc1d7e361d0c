"""locksim adapter for PostgreSQL's session-level advisory lock through psycopg 3
(https://github.com/psycopg/psycopg; PostgreSQL 15 manual, 13.3.5 "Advisory Locks" and 9.27.10
"Advisory Lock Functions"), as locksim's `sql.advisory` recipe does.

acquire: `SELECT pg_advisory_lock(hashtext(name))` in autocommit mode, which waits until no other
session holds the key; release: `SELECT pg_advisory_unlock(hashtext(name))`, false if this session did
not hold it. The lock belongs to the session, not to a transaction: it lasts until it is unlocked or the
session ends. PostgreSQL ends an idle session only by `idle_session_timeout` (off by default) or when TCP
keep-alive finds the peer gone (after 2 h by default) — and the kernel of a stopped process keeps its
connection open — so a pause alone does not pass the lock on. No fencing token, no parameters. The
protocol is in locksim_adapter.
"""
import psycopg

from locksim_adapter import LOCK_NAME, postgres_dsn, serve

conn = psycopg.connect(postgres_dsn(), autocommit=True)


def acquire():
    try:
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (LOCK_NAME,))
        return {"ok": True, "token": None}
    except psycopg.Error as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        (unlocked,) = conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (LOCK_NAME,)).fetchone()
        if unlocked:
            return {"ok": True}
        return {"ok": False, "reason": "pg_advisory_unlock: this session did not hold the lock"}
    except psycopg.Error as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
