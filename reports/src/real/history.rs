//! The history of a real run: the simulator's events ([`locksim_sim::history`]), stamped with real time.
//!
//! `t` is nanoseconds of a monotonic [`Instant`] since the run started, read under the recorder's lock
//! so that the order of recording is the order of `t`. Like the simulator's recorder it knows who holds
//! the lock and who waits for it now, for `target = "holder"` and `"waiter"`.

use locksim_sim::history::{Event, EventKind, History, NodeIx, EVENT_BUDGET};
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
    holders: BTreeSet<NodeIx>,
    waiters: BTreeSet<NodeIx>,
    over_budget: bool,
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
        match &kind {
            EventKind::AcquireInvoke => {
                s.waiters.insert(node);
            }
            EventKind::AcquireOk { .. } => {
                s.waiters.remove(&node);
                s.holders.insert(node);
            }
            EventKind::AcquireFail { .. } | EventKind::AcquireUnknown { .. } => {
                s.waiters.remove(&node);
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                s.holders.remove(&node);
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
        s.holders.remove(&node);
        s.waiters.remove(&node);
    }

    /// The clients that believe they hold the lock now, in node order.
    pub fn holders(&self) -> Vec<NodeIx> {
        self.state.lock().expect("recorder lock").holders.iter().copied().collect()
    }

    /// The clients waiting inside `acquire` now, in node order.
    pub fn waiters(&self) -> Vec<NodeIx> {
        self.state.lock().expect("recorder lock").waiters.iter().copied().collect()
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
