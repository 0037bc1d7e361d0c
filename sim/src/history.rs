//! The history: the ordered event log of one run, and the only thing checkers read.
//!
//! Events are recorded at the boundaries — by the workload around each lock call, by the resource for
//! each access, by the world for each fault — never by recipes. Every event carries the simulated time
//! `t` (nanoseconds, the one true time, not any node's clock) and the node it concerns. Order is the order
//! of recording, which is simulated-time order because the world runs on one thread.
//!
//! Serialised as JSON lines; the XXH3-64 hash of those bytes is the run's determinism fingerprint.

use crate::fault::{FaultKind, TriggerEvent};
use crate::hazard::{Hazard, HazardCounts};
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

impl EventKind {
    /// The trigger event this is, if a fault can be triggered by it (`on = "..."`).
    pub fn trigger_event(&self) -> Option<TriggerEvent> {
        Some(match self {
            EventKind::AcquireInvoke => TriggerEvent::Acquire,
            EventKind::AcquireOk { .. } => TriggerEvent::AcquireOk,
            EventKind::Enter { .. } => TriggerEvent::Enter,
            EventKind::ReleaseInvoke => TriggerEvent::Release,
            EventKind::LockLost { .. } => TriggerEvent::LockLost,
            _ => return None,
        })
    }
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

/// What joins a client's name and a worker's number in the worker's name: `client-0/w1` is the second
/// worker of `client-0` (`[workload] workers`); the first records as `client-0` itself.
pub const WORKER_MARK: &str = "/w";

impl History {
    pub fn name(&self, node: NodeIx) -> &str {
        &self.nodes[node.0 as usize]
    }

    /// The node `node` runs on: itself, or for a worker (`client-0/w1`) its client node, whose faults
    /// (a crash, a pause, a cut) are the worker's too.
    pub fn host(&self, node: NodeIx) -> NodeIx {
        let Some((client, _)) = self.name(node).rsplit_once(WORKER_MARK) else { return node };
        self.nodes.iter().position(|n| n == client).map_or(node, |i| NodeIx(i as u32))
    }

    /// `node` and the workers that run on it.
    pub fn residents(&self, node: NodeIx) -> Vec<NodeIx> {
        (0..self.nodes.len() as u32).map(NodeIx).filter(|n| *n == node || self.host(*n) == node).collect()
    }

    /// [`History::host`] of every node, by index: for checkers that ask it of every event.
    pub fn hosts(&self) -> Vec<NodeIx> {
        (0..self.nodes.len() as u32).map(|n| self.host(NodeIx(n))).collect()
    }

    /// The history as JSON lines: one event per line, node names spelled out.
    pub fn to_jsonl(&self) -> String {
        String::from_utf8(self.jsonl_bytes()).expect("JSON is UTF-8")
    }

    /// The determinism fingerprint: XXH3-64 of [`History::to_jsonl`] (what `xxhsum -H3` prints for the
    /// file `repro --history` writes).
    pub fn hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.jsonl_bytes())
    }

    fn jsonl_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.events.len() * 72);
        for e in &self.events {
            let line = EventLine { t: e.t, node: self.name(e.node), kind: &e.kind };
            serde_json::to_writer(&mut out, &line).expect("events serialise");
            out.push(b'\n');
        }
        out
    }
}

/// 64-bit FNV-1a: tiny, portable and stable across Rust versions (std's `Hash` is not promised to be);
/// names a lease by its key in the hazard marks.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
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
    /// Who believes it holds the lock now and who is inside `acquire` (for `target = "holder"` and
    /// `"waiter"`).
    holds: Holds,
    /// The hazards reached so far (beside the history, so its hash never changes).
    hazards: HazardCounts,
    /// Holders whose lease a server ended during their hold (for `stale-holder-resumed`).
    lease_ended_in_hold: std::collections::BTreeSet<NodeIx>,
    /// Waiters whose session or lease a server ended during their acquire (`grant-to-expired-session`).
    lease_ended_in_wait: std::collections::BTreeSet<NodeIx>,
    /// Each node's newest lease (by the backend's id): only its end counts, not that of a session the
    /// node abandoned (a crashed client's old session expiring after its restart).
    newest_lease: std::collections::BTreeMap<NodeIx, u64>,
    /// The lease each node's latest grant lives in, when its recipe says ([`Recorder::held_in`]): its end
    /// during a hold counts too, newest or not (a ZooKeeper lock node a Curator 4 client took over from
    /// the session it had given up: CURATOR-498).
    hold_lease: std::collections::BTreeMap<NodeIx, u64>,
    /// When the run used up its event budget, if it did, and who is told then.
    over_budget_at: Option<u64>,
    exhausted: Arc<tokio::sync::Notify>,
    /// Triggers of aimed faults not fired yet, in schedule order (empty for timed schedules).
    armed: Vec<Armed>,
    /// Fired triggers the supervisor has not taken yet, in recording order, and who is told.
    fired: Vec<Fired>,
    fire: Arc<tokio::sync::Notify>,
    /// Each worker's client node (`[workload] workers`): the node its faults and leases are of.
    hosts: std::collections::BTreeMap<NodeIx, NodeIx>,
}

/// Who believes it holds the lock and who waits inside `acquire`, kept from the events as they are
/// recorded, for faults aimed at `holder` and `waiter`: the simulator's [`Recorder`] and real mode's keep
/// it alike.
#[derive(Debug, Default)]
pub struct Holds {
    holders: std::collections::BTreeSet<NodeIx>,
    waiters: std::collections::BTreeSet<NodeIx>,
}

/// What an event changed for its node ([`Holds::note`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It began to wait: an `acquire` was invoked.
    Waits,
    /// It was granted the lock.
    Holds,
    /// Its `acquire` ended without the lock.
    GaveUp,
    /// It let go of the lock, or learned it had lost it.
    LetGo,
    /// Nothing about the lock.
    Nothing,
}

impl Holds {
    /// Take `kind`, just recorded for `node`, into account.
    pub fn note(&mut self, node: NodeIx, kind: &EventKind) -> Change {
        match kind {
            EventKind::AcquireInvoke => {
                self.waiters.insert(node);
                Change::Waits
            }
            EventKind::AcquireOk { .. } => {
                self.waiters.remove(&node);
                self.holders.insert(node);
                Change::Holds
            }
            EventKind::AcquireFail { .. } | EventKind::AcquireUnknown { .. } => {
                self.waiters.remove(&node);
                Change::GaveUp
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                self.holders.remove(&node);
                Change::LetGo
            }
            _ => Change::Nothing,
        }
    }

    /// Keep only the nodes `keep` accepts (a crashed node believes and waits for nothing any more).
    pub fn retain(&mut self, keep: impl Fn(&NodeIx) -> bool) {
        self.holders.retain(&keep);
        self.waiters.retain(&keep);
    }

    /// The nodes that believe they hold the lock, in node order.
    pub fn holders(&self) -> &std::collections::BTreeSet<NodeIx> {
        &self.holders
    }

    /// The nodes inside `acquire`, in node order.
    pub fn waiters(&self) -> &std::collections::BTreeSet<NodeIx> {
        &self.waiters
    }
}

/// An aimed fault's trigger, waiting for its event ([`Recorder::arm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Armed {
    /// The fault's index in the schedule.
    pub id: u32,
    /// Events recorded before this simulated time do not count.
    pub from_ns: u64,
    pub event: TriggerEvent,
    /// Only this node's events count (`None`: any node's).
    pub node: Option<NodeIx>,
    /// Matching events still to come before it fires (the n-th fires it).
    pub left: u32,
}

/// A trigger that fired: fault `id`, by an event of `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    pub id: u32,
    pub node: NodeIx,
}

impl RecorderState {
    /// The node `node` runs on: itself, or a worker's client node.
    fn host(&self, node: NodeIx) -> NodeIx {
        self.hosts.get(&node).copied().unwrap_or(node)
    }

    /// A trigger fires on the node the event's client runs on: faults hit nodes, not workers.
    fn fire_triggers(&mut self, t: u64, node: NodeIx, event: TriggerEvent) {
        let node = self.host(node);
        let fired = Armed::fire(&mut self.armed, t, node, event);
        if !fired.is_empty() {
            self.fired.extend(fired);
            self.fire.notify_one();
        }
    }
}

impl Armed {
    /// `node`'s `event` at `t` counts towards each trigger of `armed` it matches; the triggers it fires
    /// (their n-th matching event), in `armed`'s order, are taken out of it. The simulator's recorder
    /// and real mode's fire triggers alike.
    pub fn fire(armed: &mut Vec<Armed>, t: u64, node: NodeIx, event: TriggerEvent) -> Vec<Fired> {
        let mut fired = Vec::new();
        for a in armed.iter_mut() {
            if a.event == event && t >= a.from_ns && a.node.is_none_or(|n| n == node) {
                a.left -= 1;
                if a.left == 0 {
                    fired.push(Fired { id: a.id, node });
                }
            }
        }
        armed.retain(|a| a.left > 0);
        fired
    }
}

impl RecorderState {
    fn count(&mut self, hazard: Hazard) {
        *self.hazards.entry(hazard).or_default() += 1;
    }
}

impl Recorder {
    pub fn record(&self, node: NodeIx, kind: EventKind) {
        let t = crate::clock::sim_now_ns();
        let mut s = self.0.lock().expect("recorder lock");
        match s.holds.note(node, &kind) {
            Change::Waits => {
                s.lease_ended_in_wait.remove(&node);
            }
            Change::Holds if s.lease_ended_in_wait.remove(&node) => s.count(Hazard::GrantToExpiredSession),
            Change::LetGo => {
                s.lease_ended_in_hold.remove(&node);
            }
            Change::Holds | Change::GaveUp | Change::Nothing => {}
        }
        if s.events.len() >= EVENT_BUDGET {
            if s.over_budget_at.is_none() {
                s.over_budget_at = Some(t);
                s.exhausted.notify_one();
            }
            return;
        }
        let event = kind.trigger_event();
        s.events.push(Event { t, node, kind });
        if let Some(event) = event.filter(|_| !s.armed.is_empty()) {
            s.fire_triggers(t, node, event);
        }
    }

    /// `node` passed a point inside its recipe ([`TriggerEvent::Declared`]): it fires the triggers armed
    /// for it, and records nothing (a history is the same whether or not anyone watches a point).
    /// Whether it fired one.
    pub fn point(&self, node: NodeIx, point: TriggerEvent) -> bool {
        let t = crate::clock::sim_now_ns();
        let mut s = self.0.lock().expect("recorder lock");
        if s.armed.is_empty() || s.over_budget_at.is_some() {
            return false;
        }
        let before = s.fired.len();
        s.fire_triggers(t, node, point);
        s.fired.len() > before
    }

    /// `node` passes `point` ([`Recorder::point`]); if that fired a trigger, it yields until the world
    /// has started the fault, so that a pause holds it here and not a step later.
    pub async fn pass(&self, node: NodeIx, point: TriggerEvent) {
        if self.point(node, point) {
            while self.fired_pending() {
                YieldOnce(false).await;
            }
        }
    }

    /// Whether a fired trigger waits for the world to start its fault.
    pub fn fired_pending(&self) -> bool {
        !self.0.lock().expect("recorder lock").fired.is_empty()
    }

    /// Arm the triggers of aimed faults; [`Recorder::fired`] resolves when one fires.
    pub fn arm(&self, triggers: Vec<Armed>) {
        self.0.lock().expect("recorder lock").armed = triggers;
    }

    /// The triggers fired since the last call, in recording order (ties: schedule order).
    pub fn take_fired(&self) -> Vec<Fired> {
        std::mem::take(&mut self.0.lock().expect("recorder lock").fired)
    }

    /// Resolves once a trigger has fired that [`Recorder::take_fired`] has not taken.
    pub async fn fired(&self) {
        let fire = {
            let s = self.0.lock().expect("recorder lock");
            if !s.fired.is_empty() {
                return;
            }
            s.fire.clone()
        };
        fire.notified().await
    }

    /// Take back the triggers that never fired (the run is over).
    pub fn disarm(&self) -> Vec<Armed> {
        std::mem::take(&mut self.0.lock().expect("recorder lock").armed)
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

    /// `worker` is a worker of the client node `host` (`[workload] workers`): its events are its own,
    /// its faults and leases `host`'s.
    pub fn add_worker(&self, worker: NodeIx, host: NodeIx) {
        self.0.lock().expect("recorder lock").hosts.insert(worker, host);
    }

    /// The workers of `host` beyond its first (which records as `host` itself), in order.
    pub fn workers_of(&self, host: NodeIx) -> Vec<NodeIx> {
        let s = self.0.lock().expect("recorder lock");
        s.hosts.iter().filter(|(_, h)| **h == host).map(|(w, _)| *w).collect()
    }

    /// A node that crashed believes and waits for nothing any more, nor do its workers.
    pub fn forget(&self, node: NodeIx) {
        let mut s = self.0.lock().expect("recorder lock");
        let hosts = s.hosts.clone();
        let elsewhere = |n: &NodeIx| hosts.get(n).copied().unwrap_or(*n) != node;
        s.holds.retain(elsewhere);
        s.lease_ended_in_hold.retain(elsewhere);
        s.lease_ended_in_wait.retain(elsewhere);
    }

    /// Count one `hazard` reached.
    pub fn mark(&self, hazard: Hazard) {
        self.0.lock().expect("recorder lock").count(hazard);
    }

    /// A server ended the lease `lease` of `node` (a Redis key it set expired, its ZooKeeper session, etcd
    /// lease or database session ended without it asking; ignored unless it is the node's newest): `lease-expired-while-held` if it believes it holds the
    /// lock; remembered for `stale-holder-resumed` and `grant-to-expired-session`.
    pub fn lease_ended(&self, node: NodeIx, lease: u64) {
        let mut s = self.0.lock().expect("recorder lock");
        // A lease the node's hold lives in counts while it holds (a lease it has left since, no more).
        let holds = |s: &RecorderState| s.holds.holders().iter().any(|h| s.host(*h) == node);
        let hold_lease = s.hold_lease.get(&node) == Some(&lease) && holds(&s);
        if s.newest_lease.get(&node) != Some(&lease) && !hold_lease {
            return;
        }
        if !s.armed.is_empty() && s.over_budget_at.is_none() {
            s.fire_triggers(crate::clock::sim_now_ns(), node, TriggerEvent::LeaseExpired);
        }
        // The node's workers share its leases' fate when they share a session; with sessions of their
        // own, which worker's lease ended is not told, and every worker of the node counts.
        let on_node = |set: &std::collections::BTreeSet<NodeIx>| -> Vec<NodeIx> {
            set.iter().copied().filter(|n| s.host(*n) == node).collect()
        };
        let (holding, waiting) = (on_node(s.holds.holders()), on_node(s.holds.waiters()));
        if !holding.is_empty() {
            s.count(Hazard::LeaseExpiredWhileHeld);
            s.lease_ended_in_hold.extend(holding);
        } else {
            s.lease_ended_in_wait.extend(waiting);
        }
    }

    /// `node` took over a lock whose lease had passed (a ShedLock row past its `lock_until`): every other
    /// node that still believes it holds the lock had its lease end under it, as [`Recorder::lease_ended`]
    /// counts.
    pub fn took_over(&self, node: NodeIx) {
        let mut s = self.0.lock().expect("recorder lock");
        let stale: Vec<NodeIx> = s.holds.holders().iter().copied().filter(|h| s.host(*h) != node).collect();
        for holder in stale {
            s.count(Hazard::LeaseExpiredWhileHeld);
            s.lease_ended_in_hold.insert(holder);
        }
    }

    /// The grant `node` is about to report lives in lease `lease` (its lock node's session), which need
    /// not be its newest: when a server ends that lease, [`Recorder::lease_ended`] counts it.
    pub fn held_in(&self, node: NodeIx, lease: u64) {
        let mut s = self.0.lock().expect("recorder lock");
        let host = s.host(node);
        s.hold_lease.insert(host, lease);
    }

    /// A server granted `node` the lease `lease`: its newest; a grant from now on is not to an expired
    /// session.
    pub fn lease_started(&self, node: NodeIx, lease: u64) {
        let mut s = self.0.lock().expect("recorder lock");
        let hosts = s.hosts.clone();
        s.lease_ended_in_wait.retain(|n| hosts.get(n).copied().unwrap_or(*n) != node);
        s.newest_lease.insert(node, lease);
    }

    /// `node` resumed from a pause: `stale-holder-resumed` if it still believes it holds the lock and a
    /// server ended its lease during the hold.
    pub fn resumed(&self, node: NodeIx) {
        let mut s = self.0.lock().expect("recorder lock");
        if s.holds.holders().iter().any(|h| s.host(*h) == node && s.lease_ended_in_hold.contains(h)) {
            s.count(Hazard::StaleHolderResumed);
        }
    }

    /// The hazards reached so far.
    pub fn hazards(&self) -> HazardCounts {
        self.0.lock().expect("recorder lock").hazards.clone()
    }

    /// The nodes that believe they hold the lock now (through any of their workers), in node order.
    pub fn holders(&self) -> Vec<NodeIx> {
        let s = self.0.lock().expect("recorder lock");
        s.holds.holders().iter().map(|n| s.host(*n)).collect::<std::collections::BTreeSet<_>>().into_iter().collect()
    }

    /// The nodes waiting inside `acquire` now (through any of their workers), in node order.
    pub fn waiters(&self) -> Vec<NodeIx> {
        let s = self.0.lock().expect("recorder lock");
        s.holds.waiters().iter().map(|n| s.host(*n)).collect::<std::collections::BTreeSet<_>>().into_iter().collect()
    }

    /// The history so far, ending now.
    pub fn finish(&self, nodes: Vec<String>) -> History {
        let events = std::mem::take(&mut self.0.lock().expect("recorder lock").events);
        History { nodes, events, end: crate::clock::sim_now_ns() }
    }
}

/// Lets every other ready task run once before this one goes on.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
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

    fn in_runtime(f: impl FnOnce()) {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move { f() });
    }

    #[test]
    fn a_lease_ended_under_its_holder_is_counted_and_marks_its_resume_stale() {
        in_runtime(|| {
            let (r, a, b) = (Recorder::default(), NodeIx(1), NodeIx(2));
            r.lease_started(a, 7);
            r.record(a, EventKind::AcquireInvoke);
            r.record(a, EventKind::AcquireOk { token: None, shared: false });
            r.resumed(a);
            assert!(r.hazards().is_empty(), "a resume with the lease alive is no hazard");
            r.lease_ended(b, 9);
            r.lease_ended(a, 7);
            r.resumed(a);
            assert_eq!(r.hazards(), [(Hazard::LeaseExpiredWhileHeld, 1), (Hazard::StaleHolderResumed, 1)].into());
            assert_eq!(r.finish(vec![]).events.len(), 2, "hazards are never events");
        });
    }

    #[test]
    fn only_the_end_of_a_nodes_newest_lease_counts() {
        in_runtime(|| {
            let (r, a) = (Recorder::default(), NodeIx(1));
            r.lease_started(a, 1);
            r.lease_started(a, 2); // a restarted client's new session
            r.record(a, EventKind::AcquireOk { token: None, shared: false });
            r.lease_ended(a, 1);
            assert!(r.hazards().is_empty(), "the abandoned session's end is not the holder's");
        });
    }

    #[test]
    fn the_end_of_the_lease_a_hold_lives_in_counts_while_it_is_held() {
        in_runtime(|| {
            let (r, a) = (Recorder::default(), NodeIx(1));
            r.lease_started(a, 1);
            r.lease_started(a, 2); // a new session, and a lock node adopted from the old one
            r.held_in(a, 1);
            r.record(a, EventKind::AcquireOk { token: None, shared: false });
            r.lease_ended(a, 1);
            assert_eq!(r.hazards(), [(Hazard::LeaseExpiredWhileHeld, 1)].into(), "the hold's lease ended");
            r.record(a, EventKind::ReleaseInvoke);
            r.record(a, EventKind::ReleaseOk);
            r.lease_ended(a, 1);
            assert_eq!(r.hazards(), [(Hazard::LeaseExpiredWhileHeld, 1)].into(), "released: no longer counts");
        });
    }

    #[test]
    fn a_grant_after_the_waiters_lease_ended_is_to_an_expired_session_unless_a_new_one_started() {
        in_runtime(|| {
            let (r, a) = (Recorder::default(), NodeIx(1));
            r.lease_started(a, 1);
            r.record(a, EventKind::AcquireInvoke);
            r.lease_ended(a, 1);
            r.record(a, EventKind::AcquireOk { token: None, shared: false });
            assert_eq!(r.hazards(), [(Hazard::GrantToExpiredSession, 1)].into());
            r.record(a, EventKind::ReleaseInvoke);
            r.record(a, EventKind::AcquireInvoke);
            r.lease_ended(a, 1);
            r.lease_started(a, 2);
            r.record(a, EventKind::AcquireOk { token: None, shared: false });
            assert_eq!(r.hazards(), [(Hazard::GrantToExpiredSession, 1)].into(), "granted on its new session");
        });
    }

    #[test]
    fn a_trigger_fires_on_the_nth_matching_event_after_arming_once() {
        madsim::runtime::Runtime::new().block_on(async {
            let r = Recorder::default();
            let armed = |id, node, left| Armed { id, from_ns: 0, event: TriggerEvent::AcquireOk, node, left };
            r.arm(vec![armed(0, None, 2), armed(1, Some(NodeIx(1)), 1), armed(2, None, 1)]);
            let ok = EventKind::AcquireOk { token: None, shared: false };
            r.record(NodeIx(0), EventKind::AcquireInvoke);
            assert!(r.take_fired().is_empty(), "another event");
            r.record(NodeIx(0), ok.clone());
            assert_eq!(r.take_fired(), vec![Fired { id: 2, node: NodeIx(0) }], "the first of any client's");
            r.record(NodeIx(1), ok.clone());
            let both = vec![Fired { id: 0, node: NodeIx(1) }, Fired { id: 1, node: NodeIx(1) }];
            assert_eq!(r.take_fired(), both, "the second, and client 1's first, in schedule order");
            r.record(NodeIx(1), ok);
            assert!(r.take_fired().is_empty() && r.disarm().is_empty(), "each fires once");
        });
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn the_hash_is_xxh3_of_the_json_lines() {
        let h = History {
            nodes: vec!["client-0".into(), "redis-0".into()],
            events: vec![
                Event { t: 5, node: NodeIx(0), kind: EventKind::AcquireOk { token: Some(3), shared: false } },
                Event { t: 9, node: NodeIx(1), kind: EventKind::Notify { cause: "deleted \"x\"".into() } },
            ],
            end: 10,
        };
        assert_eq!(h.hash(), xxhash_rust::xxh3::xxh3_64(h.to_jsonl().as_bytes()));
        assert_eq!(
            h.to_jsonl(),
            "{\"t\":5,\"node\":\"client-0\",\"kind\":\"acquire-ok\",\"token\":3}\n\
             {\"t\":9,\"node\":\"redis-0\",\"kind\":\"notify\",\"cause\":\"deleted \\\"x\\\"\"}\n"
        );
        // XXH3-64 of no bytes, seed 0 (the reference implementation's value): what `xxhsum -H3` agrees with.
        let empty = History { nodes: vec![], events: vec![], end: 0 };
        assert_eq!(empty.hash(), 0x2d06_8005_38d3_94c2);
    }
}
