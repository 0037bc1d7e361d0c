//! Hold intervals: when each client believed it held the lock, derived from its own events.
//!
//! A hold starts at `AcquireOk` and ends at the client's `ReleaseInvoke` (from then on it no longer acts
//! as holder), at `LockLost` (the recipe told it the lock is gone), at its crash (a dead process believes
//! nothing), or at the end of the run.

use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub client: NodeIx,
    pub start: u64,
    pub end: u64,
    pub token: Option<u64>,
    /// Held shared, as a reader of a read-write lock.
    pub shared: bool,
}

/// Does this event end every belief the node had (a crash or restart of it), and its workers'?
pub fn kills(kind: &EventKind) -> bool {
    matches!(kind, EventKind::FaultStart { fault, .. } if fault.spec().means.ends_beliefs)
}

/// Every hold of the run, in order of start.
pub fn holds(h: &History) -> Vec<Hold> {
    let mut open: BTreeMap<NodeIx, (u64, Option<u64>, bool)> = BTreeMap::new();
    let mut done = Vec::new();
    let mut close = |open: &mut BTreeMap<NodeIx, (u64, Option<u64>, bool)>, client: NodeIx, end: u64| {
        if let Some((start, token, shared)) = open.remove(&client) {
            done.push(Hold { client, start, end, token, shared });
        }
    };
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireOk { token, shared } => {
                open.insert(e.node, (e.t, *token, *shared));
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => close(&mut open, e.node, e.t),
            k if kills(k) => h.residents(e.node).into_iter().for_each(|n| close(&mut open, n, e.t)),
            _ => {}
        }
    }
    let still: Vec<NodeIx> = open.keys().copied().collect();
    for client in still {
        close(&mut open, client, h.end);
    }
    done.sort_by_key(|hold| (hold.start, hold.client));
    done
}
