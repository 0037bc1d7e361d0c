//! The history of a real run: the simulator's events ([`locksim_sim::history`]), stamped with real time.
//!
//! `t` is nanoseconds of a monotonic [`Instant`] since the run started, read under the recorder's lock
//! so that the order of recording is the order of `t`. It keeps who holds the lock and who waits for it
//! now as the simulator's recorder does ([`Holds`]), for `target = "holder"` and `"waiter"`; and how
//! long some fault has been in force (from its `FaultStart` to its `FaultEnd`), which a request's
//! deadline does not count.

use locksim_sim::history::{Event, EventKind, History, Holds, NodeIx, EVENT_BUDGET};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Recorder {
    start: Instant,
    state: Mutex<State>,
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
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder { start, state: Mutex::new(State::default()) }
    }

    /// Real time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn record(&self, node: NodeIx, kind: EventKind) {
        let mut s = self.state.lock().expect("recorder lock");
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
            _ => {}
        }
        if s.events.len() >= EVENT_BUDGET {
            s.over_budget = true;
            return;
        }
        s.events.push(Event { t, node, kind });
    }

    /// A crashed client believes and waits for nothing any more.
    pub fn forget(&self, node: NodeIx) {
        let mut s = self.state.lock().expect("recorder lock");
        s.holds.retain(|n| *n != node);
    }

    /// The clients that believe they hold the lock now, in node order.
    pub fn holders(&self) -> Vec<NodeIx> {
        self.state.lock().expect("recorder lock").holds.holders().iter().copied().collect()
    }

    /// The clients waiting inside `acquire` now, in node order.
    pub fn waiters(&self) -> Vec<NodeIx> {
        self.state.lock().expect("recorder lock").holds.waiters().iter().copied().collect()
    }

    /// Real time since the run started during which some fault was in force.
    pub fn fault_time(&self) -> Duration {
        let s = self.state.lock().expect("recorder lock");
        let now = self.start.elapsed().as_nanos() as u64;
        let ongoing = if s.in_force.is_empty() { 0 } else { now.saturating_sub(s.in_force_since) };
        Duration::from_nanos(s.fault_ns + ongoing)
    }

    pub fn over_budget(&self) -> bool {
        self.state.lock().expect("recorder lock").over_budget
    }

    /// The history, ending now.
    pub fn finish(&self, nodes: Vec<String>) -> History {
        let mut s = self.state.lock().expect("recorder lock");
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
