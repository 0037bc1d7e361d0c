//! The history: the ordered event log of one run, and the only thing checkers read.
//!
//! Events are recorded at the boundaries — by the workload around each lock call, by the resource for
//! each access, by the world for each fault — never by recipes. Every event carries the simulated time
//! `t` (nanoseconds, the one true time, not any node's clock) and the node it concerns. Order is the order
//! of recording, which is simulated-time order because the world runs on one thread.
//!
//! Serialised as JSON lines; the FNV-1a hash of those bytes is the run's determinism fingerprint.

use crate::fault::FaultKind;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// Index of a node in [`History::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeIx(pub u32);

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EventKind {
    /// A client called `acquire`.
    AcquireInvoke,
    /// `acquire` returned: the client now believes it holds the lock — exclusively, or `shared` with
    /// other readers (a read-write lock's read side; left out of the JSON when false).
    AcquireOk {
        token: Option<u64>,
        #[serde(default, skip_serializing_if = "is_false")]
        shared: bool,
    },
    /// `acquire` returned a definite failure: the client does not hold the lock.
    AcquireFail {
        reason: String,
    },
    /// `acquire` ended without knowing (a timeout): the lock may or may not have been taken for it.
    AcquireUnknown {
        reason: String,
    },
    /// A client called `release`: from here on it no longer believes it holds the lock.
    ReleaseInvoke,
    ReleaseOk,
    ReleaseFail {
        reason: String,
    },
    ReleaseUnknown {
        reason: String,
    },
    /// The resource saw a client begin its critical section.
    Enter {
        token: Option<u64>,
    },
    Read {
        value: i64,
        token: Option<u64>,
        accepted: bool,
    },
    Write {
        value: i64,
        token: Option<u64>,
        accepted: bool,
    },
    /// The resource saw a client end its critical section.
    Exit,
    /// The store (a user's state beside the counter) answered a get: `value` is what the key held
    /// (`None`: nothing, or fencing refused the token).
    Get {
        key: String,
        value: Option<String>,
        token: Option<u64>,
        accepted: bool,
    },
    /// The store applied (`accepted`) or refused a put of `value` under `key`.
    Put {
        key: String,
        value: String,
        token: Option<u64>,
        accepted: bool,
    },
    /// Flash sale: the resource recorded an order for this buyer with its accepted write.
    Order,
    /// The client lost its lock by its own account (its session or lease is gone) and stops acting on it.
    LockLost {
        reason: String,
    },
    /// A server notified a client of a watched change (the herd count).
    Notify {
        cause: String,
    },
    /// A client's session changed state (connected, disconnected, expired), or the server expired it.
    Session {
        state: String,
    },
    /// A fault began. `target` is the node it was aimed at; `detail` says the rest in words.
    FaultStart {
        id: u32,
        fault: FaultKind,
        target: String,
        detail: String,
    },
    FaultEnd {
        id: u32,
    },
    /// A scheduled fault found nothing to act on (e.g. `target = "holder"` while nobody held the lock).
    FaultSkipped {
        id: u32,
        fault: FaultKind,
        reason: String,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Simulated nanoseconds since the world started.
    pub t: u64,
    pub node: NodeIx,
    pub kind: EventKind,
}

/// A finished run's events and the names of its nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub nodes: Vec<String>,
    pub events: Vec<Event>,
    /// Simulated nanoseconds at which the run stopped.
    pub end: u64,
}

#[derive(Serialize)]
struct EventLine<'a> {
    t: u64,
    node: &'a str,
    #[serde(flatten)]
    kind: &'a EventKind,
}

impl History {
    pub fn name(&self, node: NodeIx) -> &str {
        &self.nodes[node.0 as usize]
    }

    /// The history as JSON lines: one event per line, node names spelled out.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::with_capacity(self.events.len() * 64);
        for e in &self.events {
            let line = EventLine { t: e.t, node: self.name(e.node), kind: &e.kind };
            out.push_str(&serde_json::to_string(&line).expect("events serialise"));
            out.push('\n');
        }
        out
    }

    /// The determinism fingerprint: FNV-1a over [`History::to_jsonl`], hashed as it is written (the
    /// text is never kept).
    pub fn hash(&self) -> u64 {
        let mut hasher = Fnv1a(FNV_OFFSET);
        for e in &self.events {
            let line = EventLine { t: e.t, node: self.name(e.node), kind: &e.kind };
            serde_json::to_writer(&mut hasher, &line).expect("events serialise");
            hasher.add(b"\n");
        }
        hasher.0
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a: tiny, portable and stable across Rust versions (std's `Hash` is not promised to be).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a(FNV_OFFSET);
    hasher.add(bytes);
    hasher.0
}

/// FNV-1a as a sink for text: the hash so far.
struct Fnv1a(u64);

impl Fnv1a {
    fn add(&mut self, bytes: &[u8]) {
        self.0 = bytes.iter().fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    }
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.add(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The most events one run may record. A seed is milliseconds of work; one that records this many
/// (millions of acquisitions) would take minutes and gigabytes, so the world stops it and the runner
/// reports it as too big for one seed.
pub const EVENT_BUDGET: usize = 2_000_000;

/// Appends events during a run; shared by every node of the world.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<RecorderState>>);

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

#[derive(Default)]
struct RecorderState {
    events: Vec<Event>,
    /// Who believes it holds the lock now, in node order (for `target = "holder"`).
    holders: std::collections::BTreeSet<NodeIx>,
    /// Who is inside `acquire` now (for `target = "waiter"`).
    waiters: std::collections::BTreeSet<NodeIx>,
    /// When the run used up its event budget, if it did, and who is told then.
    over_budget_at: Option<u64>,
    exhausted: Arc<tokio::sync::Notify>,
}

impl Recorder {
    pub fn record(&self, node: NodeIx, kind: EventKind) {
        let t = crate::clock::sim_now_ns();
        let mut s = self.0.lock().expect("recorder lock");
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
            if s.over_budget_at.is_none() {
                s.over_budget_at = Some(t);
                s.exhausted.notify_one();
            }
            return;
        }
        s.events.push(Event { t, node, kind });
    }

    /// When the run used up its event budget ([`EVENT_BUDGET`]), if it has.
    pub fn over_budget_at(&self) -> Option<u64> {
        self.0.lock().expect("recorder lock").over_budget_at
    }

    /// Resolves once the run has used up its event budget.
    pub async fn exhausted(&self) {
        let exhausted = self.0.lock().expect("recorder lock").exhausted.clone();
        exhausted.notified().await
    }

    /// A node that crashed believes and waits for nothing any more.
    pub fn forget(&self, node: NodeIx) {
        let mut s = self.0.lock().expect("recorder lock");
        s.holders.remove(&node);
        s.waiters.remove(&node);
    }

    /// The nodes that believe they hold the lock now, in node order.
    pub fn holders(&self) -> Vec<NodeIx> {
        self.0.lock().expect("recorder lock").holders.iter().copied().collect()
    }

    /// The nodes waiting inside `acquire` now, in node order.
    pub fn waiters(&self) -> Vec<NodeIx> {
        self.0.lock().expect("recorder lock").waiters.iter().copied().collect()
    }

    /// The history so far, ending now.
    pub fn finish(&self, nodes: Vec<String>) -> History {
        let events = std::mem::take(&mut self.0.lock().expect("recorder lock").events);
        History { nodes, events, end: crate::clock::sim_now_ns() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_spells_out_kinds_and_names() {
        let h = History {
            nodes: vec!["client-0".into()],
            events: vec![Event { t: 5, node: NodeIx(0), kind: EventKind::AcquireOk { token: Some(3), shared: false } }],
            end: 10,
        };
        assert_eq!(h.to_jsonl(), "{\"t\":5,\"node\":\"client-0\",\"kind\":\"acquire-ok\",\"token\":3}\n");
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn the_hash_is_fnv1a_of_the_json_lines() {
        let h = History {
            nodes: vec!["client-0".into(), "redis-0".into()],
            events: vec![
                Event { t: 5, node: NodeIx(0), kind: EventKind::AcquireOk { token: Some(3), shared: false } },
                Event { t: 9, node: NodeIx(1), kind: EventKind::Notify { cause: "deleted \"x\"".into() } },
            ],
            end: 10,
        };
        assert_eq!(h.hash(), fnv1a(h.to_jsonl().as_bytes()));
    }
}
