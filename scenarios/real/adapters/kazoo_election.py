"""locksim adapter for kazoo's Election (https://github.com/python-zk/kazoo, kazoo/recipe/election.py).

`Election.run(func)` contends for leadership with a kazoo Lock on the election path (an ephemeral
sequential node, a watch on the one before it) and calls `func` once elected; leadership lasts until
`func` returns. Here acquire runs for election in a thread and answers once elected (`func` has started),
and release steps down (makes `func` return, which deletes the node); an acquire that is not elected
within TIMEOUT cancels its candidacy (`Election.cancel`). The node lives as long as the session: a process
stopped past the session timeout has its session expired and its node deleted by the server, electing the
next candidate, while its own `func` still runs. kazoo reports the session LOST to its listeners, passed
on to locksim as `lost`, once the process runs again and its connection thread notices. The scenario's
[recipe] keys: SESSION_TIMEOUT (e.g. "2s") and TIMEOUT (how long acquire waits). The protocol is in
locksim_adapter.
"""
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException

from locksim_adapter import CLIENT, LOCK_NAME, lost, param, seconds, serve, zookeeper_hosts

zk = KazooClient(hosts=zookeeper_hosts(), timeout=seconds(param("session_timeout", "10s")))
zk.start()
election = zk.Election("/locksim/" + LOCK_NAME.replace(":", "-"), identifier=CLIENT)
wait = seconds(param("timeout", "5s"))
elected, step_down = threading.Event(), threading.Event()
candidacy = None  # the thread running for election, until it ends
failure = None  # what ended the candidacy with an error (a thread's exception would vanish)


def lead():
    elected.set()
    step_down.wait()


def listener(state):
    if state == KazooState.LOST and elected.is_set() and not step_down.is_set():
        lost("kazoo: session LOST")


zk.add_listener(listener)


def run_for_election():
    global failure
    try:
        election.run(lead)
    except KazooException as e:
        failure = e


def acquire():
    global candidacy, failure
    elected.clear()
    step_down.clear()
    failure = None
    candidacy = threading.Thread(target=run_for_election, daemon=True)
    candidacy.start()
    if elected.wait(wait):
        return {"ok": True, "token": None}  # kazoo's Election offers no fencing token
    # Stepping down first: elected between the timeout and the cancel, it leads not a moment longer.
    step_down.set()
    election.cancel()
    candidacy.join()
    if failure is not None:
        return {"unknown": f"{type(failure).__name__}: {failure}"}
    return {"ok": False, "reason": "not elected within the timeout"}


def release():
    step_down.set()
    candidacy.join()
    if failure is not None:
        return {"unknown": f"{type(failure).__name__}: {failure}"}
    return {"ok": True}


serve(acquire, release)
