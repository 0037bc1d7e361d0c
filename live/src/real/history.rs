//! The history of a real run: the simulator's events ([`locksim_sim::history`]), stamped with real time.
//!
//! `t` is nanoseconds of a monotonic [`Instant`] since the run started, read under the recorder's lock
//! so that the order of recording is the order of `t`. It keeps who holds the lock and who waits for it
//! now as the simulator's recorder does ([`Holds`]), for `target = "holder"` and `"waiter"`; and how
//! long some fault has been in force (from its `FaultStart` to its `FaultEnd`), which a request's
//! deadline does not count.
//!
//! **Aimed faults** (`on = "release"`): the recorder holds their triggers ([`Recorder::arm`]), as the
//! simulator's does, and a client event that fires one wakes the fault's thread
//! ([`Recorder::wait_fired`]). The client events are recorded before the request they announce is
//! sent (`acquire`, `release`) or as its answer is read, so the thread that records one waits until
//! the fault is in force ([`Recorder::started`]) before it goes on: a fault aimed at a release is in
//! force before the release leaves locksim, as in the simulator "before any message the event's node
//! sends has arrived anywhere".

use locksim_sim::history::{Armed, Event, EventKind, History, Holds, NodeIx, EVENT_BUDGET};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a client event waits for the faults it fired to be in force: starting one takes a signal
/// or a proxy's switch (and asking the members who leads); past this the client goes on regardless.
const START_PATIENCE: Duration = Duration::from_secs(5);
/// How often a waiting thread looks whether the run is over.
const POLL: Duration = Duration::from_millis(20);

pub struct Recorder {
    start: Instant,
    state: Mutex<State>,
    /// A trigger fired, or a fired fault is in force.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    events: Vec<Event>,
    holds: Holds,
    over_budget: bool,
    /// The faults started and not ended, and since when (ns) one has been.
    in_force: BTreeSet<u32>,
    in_force_since: u64,
    /// Time (ns) with some fault in force, up to `in_force_since` if one is.
    fault_ns: u64,
    /// Triggers of aimed faults not fired yet.
    armed: Vec<Armed>,
    /// Fired triggers, by fault: the node whose event fired it, and when (ns).
    fired: BTreeMap<u32, (NodeIx, u64)>,
    /// Fired faults in force now or given up: the events that fired them may go on.
    started: BTreeSet<u32>,
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder { start, state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("recorder lock")
    }

    /// Arm the triggers of aimed faults.
    pub fn arm(&self, triggers: Vec<Armed>) {
        self.state().armed = triggers;
    }

    /// Real time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Record `kind` of `node` now; if it fires aimed faults, return once they are in force.
    pub fn record(&self, node: NodeIx, kind: EventKind) {
        let mut s = self.state();
        let t = self.start.elapsed().as_nanos() as u64;
        s.holds.note(node, &kind);
        match &kind {
            EventKind::FaultStart { id, .. } => {
                if s.in_force.is_empty() {
                    s.in_force_since = t;
                }
                s.in_force.insert(*id);
            }
            EventKind::FaultEnd { id } if s.in_force.remove(id) && s.in_force.is_empty() => {
                s.fault_ns += t - s.in_force_since;
            }
            // A fault given up will never be in force: whatever fired it goes on.
            EventKind::FaultSkipped { id, .. } => {
                s.started.insert(*id);
                self.changed.notify_all();
            }
            _ => {}
        }
        if s.events.len() >= EVENT_BUDGET {
            s.over_budget = true;
            return;
        }
        let event = kind.trigger_event();
        s.events.push(Event { t, node, kind });
        let Some(event) = event.filter(|_| !s.armed.is_empty()) else { return };
        let fired = Armed::fire(&mut s.armed, t, node, event);
        if fired.is_empty() {
            return;
        }
        s.fired.extend(fired.iter().map(|f| (f.id, (f.node, t))));
        self.changed.notify_all();
        let deadline = Instant::now() + START_PATIENCE;
        while !fired.iter().all(|f| s.started.contains(&f.id)) && Instant::now() < deadline {
            s = self.changed.wait_timeout(s, POLL).expect("recorder lock").0;
        }
    }

    /// Wait until aimed fault `id`'s trigger fires: the node whose event fired it, and when (since the
    /// start); `None` if the run is `over` first.
    pub fn wait_fired(&self, id: u32, over: impl Fn() -> bool) -> Option<(NodeIx, Duration)> {
        let mut s = self.state();
        loop {
            if let Some((node, t)) = s.fired.get(&id) {
                return Some((*node, Duration::from_nanos(*t)));
            }
            if over() {
                return None;
            }
            s = self.changed.wait_timeout(s, POLL).expect("recorder lock").0;
        }
    }

    /// Fired fault `id` is in force (or will start later, with `after`): the event that fired it goes on.
    pub fn started(&self, id: u32) {
        self.state().started.insert(id);
        self.changed.notify_all();
    }

    /// A crashed client believes and waits for nothing any more.
    pub fn forget(&self, node: NodeIx) {
        let mut s = self.state();
        s.holds.retain(|n| *n != node);
    }

    /// The clients that believe they hold the lock now, in node order.
    pub fn holders(&self) -> Vec<NodeIx> {
        self.state().holds.holders().iter().copied().collect()
    }

    /// The clients waiting inside `acquire` now, in node order.
    pub fn waiters(&self) -> Vec<NodeIx> {
        self.state().holds.waiters().iter().copied().collect()
    }

    /// Real time since the run started during which some fault was in force.
    pub fn fault_time(&self) -> Duration {
        let s = self.state();
        let now = self.start.elapsed().as_nanos() as u64;
        let ongoing = if s.in_force.is_empty() { 0 } else { now.saturating_sub(s.in_force_since) };
        Duration::from_nanos(s.fault_ns + ongoing)
    }

    pub fn over_budget(&self) -> bool {
        self.state().over_budget
    }

    /// The history, ending now.
    pub fn finish(&self, nodes: Vec<String>) -> History {
        let mut s = self.state();
        let end = self.start.elapsed().as_nanos() as u64;
        History { nodes, events: std::mem::take(&mut s.events), end }
    }
}

/// Why a real run tested nothing, if it did not: no client acquired the lock. Names each client (nodes
/// from `first_client` on) with what became of its `acquire` requests.
pub fn untested(history: &History, first_client: usize) -> Option<String> {
    if history.events.iter().any(|e| matches!(e.kind, EventKind::AcquireOk { .. })) {
        return None;
    }
    let secs = |t: u64| t as f64 / 1e9;
    let mut lines = Vec::new();
    for (i, name) in history.nodes.iter().enumerate().skip(first_client) {
        let mine = || history.events.iter().filter(move |e| e.node.0 as usize == i);
        let asked = mine().filter(|e| matches!(e.kind, EventKind::AcquireInvoke)).count();
        let step = |k: &EventKind| {
            matches!(k, EventKind::AcquireInvoke | EventKind::AcquireFail { .. } | EventKind::AcquireUnknown { .. })
        };
        let last = mine().rfind(|e| step(&e.kind));
        let said = match last.map(|e| (e, &e.kind)) {
            None => "never asked: its process never got to an acquire".to_string(),
            Some((e, EventKind::AcquireInvoke)) => format!(
                "{asked} acquire requests, the last sent at {:.2} s and unanswered when the run ended at {:.2} s",
                secs(e.t),
                secs(history.end)
            ),
            Some((_, EventKind::AcquireFail { reason } | EventKind::AcquireUnknown { reason })) => {
                format!("{asked} acquire requests, none granted (the last: {reason:?})")
            }
            Some(_) => format!("{asked} acquire requests, none granted"),
        };
        lines.push(format!("  {name}: {said}"));
    }
    Some(format!("nothing was tested: no client acquired the lock in {:.2} s\n{}", secs(history.end), lines.join("\n")))
}
