//! A simulated etcd 3.5 server (the v3 API): MVCC keys, transactions, leases and watches.
//!
//! Modelled behaviour, from the etcd 3.5 API reference and server code:
//! - One global revision, starting at 1. Every write transaction that changes something (a put, or a
//!   delete that deletes a key) commits as the next revision, however many keys it touches; a key keeps
//!   its `create_revision` until deleted, its `mod_revision` is the revision of its last change, and
//!   its `version` counts its puts since creation.
//! - `Range` reads one key or a prefix, optionally sorted (by key, create or mod revision), limited,
//!   and bounded by `max_create_revision` — which is how `concurrency.Mutex` finds the waiter just ahead.
//! - `Txn`: every compare must hold (value, version, create_revision or mod_revision against a
//!   constant); then the success list runs, else the failure list, atomically. A missing key compares
//!   as version, create and mod revision 0, and a value compare on a missing key always fails. A put
//!   naming a lease that does not exist fails the whole transaction (`LeaseNotFound`).
//! - Leases: granted with a TTL of at least 2 s (3/2 of the default election timeout), renewed to their
//!   full TTL by a keep-alive (whose answer carries the TTL; 0 for a lease that is gone), revoked on
//!   request or when the server's clock passes their expiry: either way every key attached to them is
//!   deleted in one revision. The lessor looks for expired leases every 500 ms after its previous look
//!   (`lessor.runLoop`), from a start whose phase each life draws from the seed (`start_lessor`).
//! - Watches on a key or a prefix from a start revision (past revisions are replayed; a future one
//!   holds back every change before it); each change's events go to every matching watcher in revision
//!   order, and each one delivered is recorded in the history as `Notify` (the herd count).
//! - Durability: the store and the leases survive a restart (the WAL), and every lease gets a full TTL
//!   plus the election timeout from the restart, as a new leader grants (`lessor.Promote`).

pub mod client;
pub mod cluster;
mod lease;
mod mvcc;
mod watch;

use super::{Backend, Now, Out};
use crate::history::{EventKind, NodeIx};
use std::time::Duration;

pub type LeaseId = i64;
pub type WatchId = u64;

/// A key as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// 0: no lease.
    pub lease: LeaseId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortTarget {
    Key,
    Create,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortOrder {
    Ascend,
    Descend,
}

/// A `Range` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub key: String,
    /// Every key starting with `key` (the client's `WithPrefix`).
    pub prefix: bool,
    pub sort: Option<(SortTarget, SortOrder)>,
    /// 0: no limit.
    pub limit: usize,
    /// 0: no bound.
    pub max_create_revision: i64,
}

impl Range {
    pub fn key(key: &str) -> Range {
        Range { key: key.into(), prefix: false, sort: None, limit: 0, max_create_revision: 0 }
    }

    /// The oldest key under `prefix` (the client's `WithFirstCreate`).
    pub fn first_created(prefix: &str) -> Range {
        Range { prefix: true, sort: Some((SortTarget::Create, SortOrder::Ascend)), limit: 1, ..Range::key(prefix) }
    }

    /// The newest key under `prefix` created at or before `max` (`WithLastCreate`, `WithMaxCreateRev`).
    pub fn last_created_by(prefix: &str, max: i64) -> Range {
        let sort = Some((SortTarget::Create, SortOrder::Descend));
        Range { prefix: true, sort, limit: 1, max_create_revision: max, ..Range::key(prefix) }
    }
}

/// One request inside a transaction (or on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Range(Range),
    Put { key: String, value: String, lease: LeaseId },
    Delete { key: String, prefix: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Range { kvs: Vec<KeyValue>, count: usize },
    Put,
    Delete { deleted: usize },
}

/// What a compare looks at, and the constant it compares with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Value(String),
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub cmp: Cmp,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdRequest {
    Op(Op),
    Txn {
        compare: Vec<Compare>,
        success: Vec<Op>,
        failure: Vec<Op>,
    },
    LeaseGrant {
        ttl_s: i64,
    },
    LeaseKeepAlive {
        id: LeaseId,
    },
    LeaseRevoke {
        id: LeaseId,
    },
    LeaseTimeToLive {
        id: LeaseId,
    },
    /// Watch from `start_revision` (0: from the next change) on the client's `connection`.
    Watch {
        id: WatchId,
        connection: u64,
        key: String,
        prefix: bool,
        start_revision: i64,
    },
    CancelWatch {
        id: WatchId,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdReply {
    /// `revision` is the response header's: the store's revision after the request.
    Op {
        revision: i64,
        result: OpResult,
    },
    Txn {
        revision: i64,
        succeeded: bool,
        results: Vec<OpResult>,
    },
    LeaseGranted {
        id: LeaseId,
        ttl_s: i64,
    },
    /// `ttl_s` 0: the lease is gone.
    KeepAlive {
        id: LeaseId,
        ttl_s: i64,
    },
    LeaseRevoked {
        revision: i64,
    },
    /// `ttl_s` -1: the lease is gone.
    TimeToLive {
        id: LeaseId,
        ttl_s: i64,
        granted_ttl_s: i64,
    },
    WatchCreated {
        id: WatchId,
        revision: i64,
    },
    WatchCanceled,
    Error(EtcdError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdError {
    LeaseNotFound,
    /// A cluster's member had no leader to take a write (raft's `ErrProposalDropped`, "raft proposal
    /// dropped"): not applied.
    ProposalDropped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Put,
    Delete,
}

/// One change to one key. A delete's `kv` has only the key and the deleting revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventType,
    pub kv: KeyValue,
}

/// Events pushed to one watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchResponse {
    pub watch_id: WatchId,
    pub revision: i64,
    pub events: Vec<Event>,
}

/// One etcd server's state (a single-member cluster).
#[derive(Debug, Default)]
pub struct EtcdState {
    store: mvcc::Store,
    leases: lease::Leases,
    /// Who granted each lease (for the history).
    owners: std::collections::BTreeMap<LeaseId, NodeIx>,
    watchers: watch::Watchers,
    /// When this life's lessor loop first looks for expired leases (monotonic ms): see
    /// [`EtcdState::start_lessor`].
    lessor_start_ms: Option<i64>,
}

/// How often the lessor looks for expired leases: `lessor.runLoop` (3.5) revokes what has expired,
/// then waits `time.After(500 * time.Millisecond)` — 500 ms after the previous round, not on a grid.
pub const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// etcd's default `--election-timeout`, which a new leader adds to every lease.
const ELECTION_TIMEOUT_MS: i64 = 1000;

impl EtcdState {
    /// After a restart: the store and leases come back from the WAL. When the member is leader again
    /// and has applied its term's first (empty) entry, etcd's `applyEntryNormal` calls
    /// `lessor.Promote(ElectionTimeout())`: every lease gets its TTL plus the election timeout (1 s by
    /// default) from then. Watches lived in the old process's memory: they are gone, and clients
    /// resume them.
    /// This life's lessor loop starts at `at_ms` on the server's monotonic clock: it looks for expired
    /// leases then and every [`EXPIRY_CHECK`] after each look (`lessor.runLoop`). The loop starts with
    /// the process (`NewLessor`), so its phase is the process's start: the node program draws it per
    /// seed and life ([`crate::world::NodeEnv::timer_start`]). Unset, the loop ticks on the multiples
    /// of 500 ms.
    pub fn start_lessor(&mut self, at_ms: i64) {
        self.lessor_start_ms = Some(at_ms);
    }

    pub fn recover(&mut self, now_ms: i64) {
        self.leases.renew_all(now_ms + ELECTION_TIMEOUT_MS);
        self.watchers = watch::Watchers::default();
    }

    fn compare(&self, c: &Compare) -> bool {
        let kv = self.store.get(&c.key);
        let field = |f: fn(&KeyValue) -> i64| kv.map_or(0, f);
        let order = match &c.target {
            Target::Value(v) => match kv {
                Some(kv) => kv.value.as_str().cmp(v.as_str()),
                None => return false,
            },
            Target::Version(v) => field(|kv| kv.version).cmp(v),
            Target::CreateRevision(v) => field(|kv| kv.create_revision).cmp(v),
            Target::ModRevision(v) => field(|kv| kv.mod_revision).cmp(v),
        };
        match c.cmp {
            Cmp::Equal => order.is_eq(),
            Cmp::NotEqual => order.is_ne(),
            Cmp::Less => order.is_lt(),
            Cmp::Greater => order.is_gt(),
        }
    }

    /// Apply `ops` as one write transaction; notify watchers of what changed.
    fn write(&mut self, ops: Vec<Op>, out: &mut Out) -> Result<Vec<OpResult>, EtcdError> {
        let missing_lease =
            |op: &Op| matches!(op, Op::Put { lease, .. } if *lease != 0 && self.leases.get(*lease).is_none());
        if ops.iter().any(missing_lease) {
            return Err(EtcdError::LeaseNotFound);
        }
        let revision = self.store.revision() + 1;
        let mut changed = false;
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            results.push(match op {
                Op::Range(r) => {
                    let (kvs, count) = self.store.range(&r);
                    OpResult::Range { kvs, count }
                }
                Op::Put { key, value, lease } => {
                    let previous = self.store.put(&key, &value, lease, revision);
                    self.leases.attach(&key, lease, previous.map_or(0, |p| p.lease));
                    changed = true;
                    OpResult::Put
                }
                Op::Delete { key, prefix } => {
                    let deleted = self.store.delete(&key, prefix, revision);
                    for kv in &deleted {
                        self.leases.detach(&kv.key, kv.lease);
                    }
                    changed |= !deleted.is_empty();
                    OpResult::Delete { deleted: deleted.len() }
                }
            });
        }
        self.store.commit(changed);
        if changed {
            self.send(self.store.events_since(revision).to_vec(), revision, None, out);
        }
        Ok(results)
    }

    /// Send `events` to every watcher they match (only to `only` if given: a new watch catching up).
    fn send(&self, events: Vec<Event>, revision: i64, only: Option<(NodeIx, WatchId)>, out: &mut Out) {
        let mut batches: std::collections::BTreeMap<(NodeIx, WatchId), Vec<Event>> = Default::default();
        for event in events {
            let watchers = self.watchers.of(&event.kv.key, event.kv.mod_revision);
            for watcher in watchers.into_iter().filter(|w| only.is_none_or(|o| o == *w)) {
                let kind = match event.kind {
                    EventType::Put => "PUT",
                    EventType::Delete => "DELETE",
                };
                let cause = format!("{kind} {}@{}", event.kv.key, event.kv.mod_revision);
                out.record(watcher.0, EventKind::Notify { cause });
                batches.entry(watcher).or_default().push(event.clone());
            }
        }
        for ((node, watch_id), events) in batches {
            out.push(node, WatchResponse { watch_id, revision, events });
        }
    }

    /// Record that the server found lease `id` expired (its revoke follows).
    fn mark_expired(&self, id: LeaseId, out: &mut Out) {
        if let Some(owner) = self.owners.get(&id).copied() {
            out.record(owner, EventKind::Session { state: format!("lease {id:x} expired by the server") });
            out.lease_ended(owner, id as u64); // hazard: lease-expired-while-held (if it held)
        }
    }

    /// Revoke a lease: delete its keys in one revision.
    fn revoke(&mut self, id: LeaseId, out: &mut Out) -> Option<()> {
        let lease = self.leases.remove(id)?;
        self.owners.remove(&id);
        let deletes = lease.keys.into_iter().map(|key| Op::Delete { key, prefix: false }).collect();
        self.write(deletes, out).expect("deletes name no lease");
        Some(())
    }

    fn request(
        &mut self,
        now_ms: i64,
        from: NodeIx,
        request: EtcdRequest,
        out: &mut Out,
    ) -> Result<EtcdReply, EtcdError> {
        Ok(match request {
            EtcdRequest::Op(Op::Range(r)) => {
                let (kvs, count) = self.store.range(&r);
                EtcdReply::Op { revision: self.store.revision(), result: OpResult::Range { kvs, count } }
            }
            EtcdRequest::Op(op) => {
                let result = self.write(vec![op], out)?.pop().expect("one op, one result");
                EtcdReply::Op { revision: self.store.revision(), result }
            }
            EtcdRequest::Txn { compare, success, failure } => {
                let succeeded = compare.iter().all(|c| self.compare(c));
                let results = self.write(if succeeded { success } else { failure }, out)?;
                EtcdReply::Txn { revision: self.store.revision(), succeeded, results }
            }
            EtcdRequest::LeaseGrant { ttl_s } => {
                let (id, ttl_s) = self.leases.grant(ttl_s, now_ms);
                self.owners.insert(id, from);
                out.lease_started(from, id as u64); // hazard marks: a new lease
                EtcdReply::LeaseGranted { id, ttl_s }
            }
            EtcdRequest::LeaseKeepAlive { id } => {
                EtcdReply::KeepAlive { id, ttl_s: self.leases.renew(id, now_ms).unwrap_or(0) }
            }
            EtcdRequest::LeaseRevoke { id } => {
                self.revoke(id, out).ok_or(EtcdError::LeaseNotFound)?;
                EtcdReply::LeaseRevoked { revision: self.store.revision() }
            }
            EtcdRequest::LeaseTimeToLive { id } => match self.leases.get(id) {
                Some(l) => {
                    EtcdReply::TimeToLive { id, ttl_s: (l.expiry_ms - now_ms).max(0) / 1000, granted_ttl_s: l.ttl_s }
                }
                None => EtcdReply::TimeToLive { id, ttl_s: -1, granted_ttl_s: 0 },
            },
            EtcdRequest::Watch { id, connection, key, prefix, start_revision } => {
                let revision = self.store.revision();
                let min_revision = if start_revision > 0 { start_revision } else { revision + 1 };
                self.watchers.add(from, connection, id, watch::Watcher { key, prefix, min_revision });
                if start_revision > 0 && start_revision <= revision {
                    self.send(self.store.events_since(start_revision).to_vec(), revision, Some((from, id)), out);
                }
                EtcdReply::WatchCreated { id, revision }
            }
            EtcdRequest::CancelWatch { id } => {
                self.watchers.cancel(from, id);
                EtcdReply::WatchCanceled
            }
        })
    }
}

impl Backend for EtcdState {
    type Request = EtcdRequest;
    type Reply = EtcdReply;

    /// Leases are timed on the monotonic clock (the lessor's `time.Now()` deadlines compare by Go's
    /// monotonic reading): a wall-clock jump changes nothing.
    fn apply(&mut self, now: Now, from: NodeIx, request: EtcdRequest, out: &mut Out) -> EtcdReply {
        self.request(now.mono_ms, from, request, out).unwrap_or_else(EtcdReply::Error)
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(EXPIRY_CHECK)
    }

    fn ticks_from(&self) -> Option<i64> {
        self.lessor_start_ms
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        for id in self.leases.expired(now.mono_ms) {
            self.mark_expired(id, out);
            self.revoke(id, out);
        }
    }
}

#[cfg(test)]
mod tests;
