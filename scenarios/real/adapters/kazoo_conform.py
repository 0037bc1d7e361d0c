"""kazoo's side of `locksim conform kazoo-client` (reports/src/conform/client/zk.rs).

One KazooClient (kazoo 2.10, its defaults but the session timeout), driven by the commands zkCli takes
on stdin — `create -e PATH DATA`, `get PATH`, `quit` — and saying on stdout what it saw, one event a
line, each stamped with CLOCK_MONOTONIC in nanoseconds (the clock locksim's play keeps):

    <ns> connected                     the first session is connected (the play's time 0)
    <ns> disconnected | reconnected | expired   KazooState SUSPENDED, CONNECTED again, LOST
    <ns> create /x: ok | get /x: ok | get /x: connection loss | get /x: no node | get /x: session expired

Requests are asynchronous (`*_async`), so that a request kazoo holds while disconnected does not hold up
the next command. After LOST kazoo opens a new session by itself; locksim's model leaves that to the
recipe's next call, so states after LOST are not reported. `quit` waits (up to 30 s) for requests still
out, then closes the session.

Usage: kazoo_conform.py HOST:PORT SESSION_TIMEOUT_MS
"""
import sys
import threading
import time

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

_SAY = threading.Lock()


def say(what):
    ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    with _SAY:
        sys.stdout.write(f"{ns} {what}\n")
        sys.stdout.flush()


hosts, timeout_ms = sys.argv[1], int(sys.argv[2])
zk = KazooClient(hosts=hosts, timeout=timeout_ms / 1000.0)
lost = threading.Event()
suspended = threading.Event()


def listener(state):
    if lost.is_set():
        return
    if state == KazooState.SUSPENDED:
        suspended.set()
        say("disconnected")
    elif state == KazooState.LOST:
        lost.set()
        say("expired")
    elif state == KazooState.CONNECTED and suspended.is_set():
        suspended.clear()
        say("reconnected")


zk.start()
zk.add_listener(listener)
say("connected")

outstanding = []


def outcome(op, result):
    try:
        result.get()
        return f"{op}: ok"
    except ConnectionLoss:
        return f"{op}: connection loss"
    except NoNodeError:
        return f"{op}: no node"
    except SessionExpiredError:
        return f"{op}: session expired"
    except Exception as e:  # noqa: BLE001 - said, so that a surprise shows in the timeline
        return f"{op}: {type(e).__name__}"


def track(op, result):
    done = threading.Event()
    outstanding.append(done)

    def report(r):
        say(outcome(op, r))
        done.set()

    result.rawlink(report)


for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "create" and words[1] == "-e":
        track("create /x", zk.create_async(words[2], words[3].encode(), ephemeral=True))
    elif words[0] == "get":
        track("get /x", zk.get_async(words[1]))
    elif words[0] == "quit":
        break
for done in outstanding:
    done.wait(30)
lost.set()
zk.stop()
zk.close()
