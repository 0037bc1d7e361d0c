"""locksim adapter for a row lock held by an open transaction: `SELECT ... FOR UPDATE` through psycopg 3
(https://github.com/psycopg/psycopg, psycopg/connection.py), as locksim's `sql.for-update` recipe does.

1. Once per process: a table `locksim_locks (name text PRIMARY KEY)` with one row per lock (the
   processes start together, so the DDL runs under a transaction-scoped advisory lock), and the
   session's `idle_in_transaction_session_timeout` from IDLE_TIMEOUT.
2. acquire: `SELECT name FROM locksim_locks WHERE name = %s FOR UPDATE`. A psycopg connection that is
   not in autocommit opens a transaction at its first statement and keeps it open until `commit()`: the
   row lock is held until then, and the statement waits while another transaction holds it.
3. release: `commit()`, which ends the transaction and frees the row.

Between acquire and release the session is idle in its transaction. PostgreSQL terminates a session idle
in a transaction for longer than IDLE_TIMEOUT, rolling it back and handing the row to the next waiter;
a holder stopped that long still believes it holds the lock, and psycopg tells it otherwise only at its
next statement, the release's COMMIT. No fencing token. The scenario's [recipe] keys: IDLE_TIMEOUT (e.g.
"1s"; "0s" turns the timeout off). The protocol is in locksim_adapter.
"""
import psycopg

from locksim_adapter import LOCK_NAME, param, postgres_dsn, seconds, serve

IDLE_TIMEOUT_MS = round(seconds(param("idle_timeout", "0s")) * 1000)
# Any fixed key: it only keeps the processes' first CREATE TABLE IF NOT EXISTS from racing.
SETUP_KEY = 14


def connect():
    conn = psycopg.connect(postgres_dsn(), autocommit=False)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_KEY,))
    conn.execute("CREATE TABLE IF NOT EXISTS locksim_locks (name text PRIMARY KEY)")
    conn.execute("INSERT INTO locksim_locks VALUES (%s) ON CONFLICT DO NOTHING", (LOCK_NAME,))
    # set_config, not SET: SET takes no bound parameters. Session-wide (false: not just this transaction).
    conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (str(IDLE_TIMEOUT_MS),))
    conn.commit()
    return conn


conn = connect()


def acquire():
    global conn
    try:
        if conn.closed:  # the server ended the session (an idle timeout while we held the lock)
            conn = connect()
        conn.execute("SELECT name FROM locksim_locks WHERE name = %s FOR UPDATE", (LOCK_NAME,))
        return {"ok": True, "token": None}
    except psycopg.Error as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


def release():
    try:
        conn.commit()
        return {"ok": True}
    except psycopg.OperationalError as e:  # the session is gone, and its row lock with it
        return {"ok": False, "reason": f"{type(e).__name__}: {e}".strip()}
    except psycopg.Error as e:
        return {"unknown": f"{type(e).__name__}: {e}"}


serve(acquire, release)
