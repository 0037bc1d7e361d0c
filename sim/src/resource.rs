//! The resource the lock protects: a counter that records every access with the caller and its token,
//! and beside it a key/value store for a user's own state ([`Store`]).
//!
//! A client in its critical section reads the value and later writes a new one (read-modify-write). The
//! resource records `Enter` and `Read` for the read, `Write` and `Exit` for the write. A reader under a
//! shared lock only reads: `Enter`, `Read` and `Exit` at once.
//!
//! With `fencing` on it behaves like the storage in Kleppmann's fencing scheme: it remembers the highest
//! token it has seen on any access and refuses an exclusive access (a writer's read or write) with a lower
//! one (recorded with `accepted = false`). Readers share the lock, so their tokens arrive in any order: a
//! shared read is refused only below the highest token of an exclusive access.
//!
//! The store is fenced by the same rule, every get and put being an exclusive access: a user's critical
//! section may read and write any keys, and each access is recorded (`Get`, `Put`) for the checkers —
//! `unsafe-write` treats them as it treats the counter's reads and writes, and a user's invariant reads
//! the accepted ones.

use crate::backend::{Backend, Now, Out};
use crate::history::{EventKind, NodeIx};
use crate::net::{CallError, Rpc};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceRequest {
    /// `shared`: a reader under a shared lock (its whole access; no write follows).
    Read { token: Option<u64>, shared: bool },
    /// Write `value`; with `order`, record a flash-sale order in the same transaction.
    Write { token: Option<u64>, value: i64, order: bool },
    /// One atomic conditional statement: `SET n = n + delta WHERE n + delta >= floor` (no floor:
    /// always), recording an order with it if asked — the flash sale's `UPDATE stock SET n = n - 1
    /// WHERE n > 0`. Answers `Written`, or `Value` with the unchanged value when the condition fails.
    Add { token: Option<u64>, delta: i64, floor: Option<i64>, order: bool },
    /// The store: what `key` holds. Answers `Stored`.
    Get { token: Option<u64>, key: String },
    /// The store: let `key` hold `value`. Answers `Written`.
    Put { token: Option<u64>, key: String, value: String },
    /// `request` from one of the caller's workers (`[workload] workers`): recorded as `worker`'s.
    For { worker: NodeIx, request: Box<ResourceRequest> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceReply {
    Value(i64),
    /// What a store key holds (`None`: nothing yet).
    Stored(Option<String>),
    Written,
    /// Fencing refused a token lower than one already seen.
    StaleToken {
        highest: u64,
    },
}

#[derive(Debug, Default)]
pub struct ResourceState {
    pub value: i64,
    pub fencing: bool,
    highest: Option<u64>,
    highest_exclusive: Option<u64>,
    store: BTreeMap<String, String>,
}

impl ResourceState {
    /// A resource starting at `value` (0 for the counter, the stock for a flash sale).
    pub fn new(fencing: bool, value: i64) -> ResourceState {
        ResourceState { value, fencing, highest: None, highest_exclusive: None, store: BTreeMap::new() }
    }

    /// Write `value` if `token` is admitted: the events of a write that ends a critical section.
    fn write(&mut self, from: NodeIx, token: Option<u64>, value: i64, order: bool, out: &mut Out) -> ResourceReply {
        let admitted = self.admit(token, false);
        let accepted = admitted.is_ok();
        if accepted {
            self.value = value;
        }
        out.record(from, EventKind::Write { value, token, accepted });
        if accepted && order {
            out.record(from, EventKind::Order);
        }
        out.record(from, EventKind::Exit);
        match admitted {
            Ok(()) => ResourceReply::Written,
            Err(highest) => ResourceReply::StaleToken { highest },
        }
    }

    /// Check a token against the highest seen (by an exclusive access, for a shared one); remember it
    /// when accepted.
    fn admit(&mut self, token: Option<u64>, shared: bool) -> Result<(), u64> {
        if !self.fencing {
            return Ok(());
        }
        let bar = if shared { self.highest_exclusive } else { self.highest };
        match (token, bar) {
            (Some(t), Some(h)) if t < h => Err(h),
            (None, Some(h)) => Err(h),
            _ => {
                self.highest = token.max(self.highest);
                if !shared {
                    self.highest_exclusive = token.max(self.highest_exclusive);
                }
                Ok(())
            }
        }
    }
}

impl Backend for ResourceState {
    type Request = ResourceRequest;
    type Reply = ResourceReply;

    fn apply(&mut self, _now: Now, from: NodeIx, request: ResourceRequest, out: &mut Out) -> ResourceReply {
        // A worker's request is recorded as the worker's.
        let (from, request) = match request {
            ResourceRequest::For { worker, request } => (worker, *request),
            request => (from, request),
        };
        match request {
            ResourceRequest::For { .. } => unreachable!("a worker's request is not a worker's again"),
            ResourceRequest::Read { token, shared } => {
                let admitted = self.admit(token, shared);
                let accepted = admitted.is_ok();
                out.record(from, EventKind::Enter { token });
                out.record(from, EventKind::Read { value: self.value, token, accepted });
                if shared || !accepted {
                    out.record(from, EventKind::Exit);
                }
                match admitted {
                    Ok(()) => ResourceReply::Value(self.value),
                    Err(highest) => ResourceReply::StaleToken { highest },
                }
            }
            ResourceRequest::Write { token, value, order } => self.write(from, token, value, order, out),
            ResourceRequest::Add { token, delta, floor, order } => {
                let value = self.value + delta;
                out.record(from, EventKind::Enter { token });
                if floor.is_none_or(|f| value >= f) {
                    self.write(from, token, value, order, out)
                } else {
                    out.record(from, EventKind::Read { value: self.value, token, accepted: true });
                    out.record(from, EventKind::Exit);
                    ResourceReply::Value(self.value)
                }
            }
            ResourceRequest::Get { token, key } => {
                let admitted = self.admit(token, false);
                let value = admitted.ok().and_then(|()| self.store.get(&key).cloned());
                out.record(from, EventKind::Get { key, value: value.clone(), token, accepted: admitted.is_ok() });
                match admitted {
                    Ok(()) => ResourceReply::Stored(value),
                    Err(highest) => ResourceReply::StaleToken { highest },
                }
            }
            ResourceRequest::Put { token, key, value } => {
                let admitted = self.admit(token, false);
                if admitted.is_ok() {
                    self.store.insert(key.clone(), value.clone());
                }
                out.record(from, EventKind::Put { key, value, token, accepted: admitted.is_ok() });
                match admitted {
                    Ok(()) => ResourceReply::Written,
                    Err(highest) => ResourceReply::StaleToken { highest },
                }
            }
        }
    }
}

/// `request` as `worker`'s, if it is a worker's ([`ResourceRequest::For`]).
pub fn on_behalf(worker: Option<NodeIx>, request: ResourceRequest) -> ResourceRequest {
    match worker {
        Some(worker) => ResourceRequest::For { worker, request: Box::new(request) },
        None => request,
    }
}

/// How long a store access waits for the resource to answer.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a store access did not happen as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Fencing refused the holder's token: a later holder has been at the store.
    Stale { highest: u64 },
    /// No answer within [`STORE_TIMEOUT`] (a partition, a pause): it may or may not have happened.
    Unknown,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Stale { highest } => write!(f, "fencing refused the token: the store has seen token {highest}"),
            StoreError::Unknown => f.write_str("the store did not answer; the access may have happened"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A holder's handle on the store for one critical section: every access carries the holder's
/// fencing token (refused below one seen, when the scenario fences).
#[derive(Clone)]
pub struct Store {
    rpc: Rc<Rpc>,
    resource: NodeIx,
    token: Option<u64>,
    /// The worker whose section this is, when it is not its client's first.
    worker: Option<NodeIx>,
}

impl Store {
    /// The store at `resource`, reached with `rpc`, for a holder with `token`.
    pub fn new(rpc: Rc<Rpc>, resource: NodeIx, token: Option<u64>) -> Store {
        Store { rpc, resource, token, worker: None }
    }

    /// The same store for the worker `worker` of the caller's node (`[workload] workers`), whose
    /// accesses are recorded as its own.
    pub fn for_worker(self, worker: Option<NodeIx>) -> Store {
        Store { worker, ..self }
    }

    /// The token this holder's accesses carry.
    pub fn token(&self) -> Option<u64> {
        self.token
    }

    /// What `key` holds (`None`: nothing yet).
    pub async fn get(&self, key: &str) -> Result<Option<String>, StoreError> {
        match self.call(ResourceRequest::Get { token: self.token, key: key.to_string() }).await? {
            ResourceReply::Stored(value) => Ok(value),
            other => unreachable!("a get is answered with what is stored, not {other:?}"),
        }
    }

    /// Let `key` hold `value`.
    pub async fn put(&self, key: &str, value: impl Into<String>) -> Result<(), StoreError> {
        let request = ResourceRequest::Put { token: self.token, key: key.to_string(), value: value.into() };
        match self.call(request).await? {
            ResourceReply::Written => Ok(()),
            other => unreachable!("a put is answered `Written`, not {other:?}"),
        }
    }

    async fn call(&self, request: ResourceRequest) -> Result<ResourceReply, StoreError> {
        let request = on_behalf(self.worker, request);
        let reply = self.rpc.call::<_, ResourceReply>(self.resource, request, STORE_TIMEOUT).await;
        // A plain call opens a fresh connection, so its only failure is no answer.
        match reply.map_err(|_: CallError| StoreError::Unknown)? {
            ResourceReply::StaleToken { highest } => Err(StoreError::Stale { highest }),
            reply => Ok(reply),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(r: &mut ResourceState, req: ResourceRequest) -> ResourceReply {
        r.apply(Now::at(0), NodeIx(1), req, &mut Out::default())
    }

    #[test]
    fn without_fencing_every_write_lands() {
        let mut r = ResourceState::new(false, 0);
        assert_eq!(
            apply(&mut r, ResourceRequest::Write { token: Some(5), value: 1, order: false }),
            ResourceReply::Written
        );
        assert_eq!(
            apply(&mut r, ResourceRequest::Write { token: Some(4), value: 2, order: false }),
            ResourceReply::Written
        );
        assert_eq!(apply(&mut r, ResourceRequest::Read { token: None, shared: false }), ResourceReply::Value(2));
    }

    #[test]
    fn fencing_refuses_a_token_lower_than_one_seen_on_any_access() {
        let mut r = ResourceState::new(true, 0);
        assert_eq!(apply(&mut r, ResourceRequest::Read { token: Some(5), shared: false }), ResourceReply::Value(0));
        // A paused holder with token 4 wakes up and writes after token 5 has read.
        assert_eq!(
            apply(&mut r, ResourceRequest::Write { token: Some(4), value: 1, order: false }),
            ResourceReply::StaleToken { highest: 5 }
        );
        assert_eq!(
            apply(&mut r, ResourceRequest::Write { token: Some(5), value: 1, order: false }),
            ResourceReply::Written
        );
        assert_eq!(r.value, 1);
    }

    #[test]
    fn fenced_readers_share_in_any_order_but_not_below_a_writer() {
        let mut r = ResourceState::new(true, 0);
        let read = |token, shared| ResourceRequest::Read { token: Some(token), shared };
        assert_eq!(apply(&mut r, read(12, true)), ResourceReply::Value(0));
        assert_eq!(apply(&mut r, read(10, true)), ResourceReply::Value(0), "two readers hold the lock together");
        // A writer paused since before both readers wakes up: refused.
        assert_eq!(apply(&mut r, read(8, false)), ResourceReply::StaleToken { highest: 12 });
        assert_eq!(apply(&mut r, read(15, false)), ResourceReply::Value(0));
        // A reader paused since before that writer wakes up: refused.
        assert_eq!(apply(&mut r, read(11, true)), ResourceReply::StaleToken { highest: 15 });
    }

    #[test]
    fn a_conditional_decrement_never_goes_below_its_floor_and_records_the_order() {
        let mut r = ResourceState::new(false, 1);
        let buy = ResourceRequest::Add { token: None, delta: -1, floor: Some(0), order: true };
        let mut out = Out::default();
        assert_eq!(r.apply(Now::at(0), NodeIx(2), buy.clone(), &mut out), ResourceReply::Written);
        assert_eq!(r.apply(Now::at(0), NodeIx(3), buy, &mut out), ResourceReply::Value(0), "sold out");
        let kinds: Vec<_> = out.events.into_iter().map(|(n, k)| (n.0, k)).collect();
        assert_eq!(
            kinds,
            vec![
                (2, EventKind::Enter { token: None }),
                (2, EventKind::Write { value: 0, token: None, accepted: true }),
                (2, EventKind::Order),
                (2, EventKind::Exit),
                (3, EventKind::Enter { token: None }),
                (3, EventKind::Read { value: 0, token: None, accepted: true }),
                (3, EventKind::Exit),
            ]
        );
    }

    #[test]
    fn the_store_keeps_keys_and_fences_them_with_the_counter() {
        let mut r = ResourceState::new(true, 0);
        let get = |token| ResourceRequest::Get { token: Some(token), key: "k".into() };
        let put =
            |token, value: &str| ResourceRequest::Put { token: Some(token), key: "k".into(), value: value.into() };
        assert_eq!(apply(&mut r, get(3)), ResourceReply::Stored(None));
        assert_eq!(apply(&mut r, put(3, "a")), ResourceReply::Written);
        assert_eq!(apply(&mut r, get(3)), ResourceReply::Stored(Some("a".into())));
        // A holder with token 4 reads the counter; a stale put to the store is refused.
        assert_eq!(apply(&mut r, ResourceRequest::Read { token: Some(4), shared: false }), ResourceReply::Value(0));
        let mut out = Out::default();
        assert_eq!(r.apply(Now::at(0), NodeIx(2), put(3, "b"), &mut out), ResourceReply::StaleToken { highest: 4 });
        let refused = EventKind::Put { key: "k".into(), value: "b".into(), token: Some(3), accepted: false };
        assert_eq!(out.events, vec![(NodeIx(2), refused)]);
        assert_eq!(apply(&mut r, get(4)), ResourceReply::Stored(Some("a".into())));
    }

    #[test]
    fn accesses_are_recorded_for_the_caller() {
        let mut r = ResourceState::new(true, 0);
        let mut out = Out::default();
        r.apply(Now::at(0), NodeIx(2), ResourceRequest::Read { token: Some(1), shared: false }, &mut out);
        r.apply(Now::at(0), NodeIx(2), ResourceRequest::Write { token: Some(1), value: 1, order: false }, &mut out);
        let kinds: Vec<_> = out.events.into_iter().map(|(n, k)| (n.0, k)).collect();
        assert_eq!(
            kinds,
            vec![
                (2, EventKind::Enter { token: Some(1) }),
                (2, EventKind::Read { value: 0, token: Some(1), accepted: true }),
                (2, EventKind::Write { value: 1, token: Some(1), accepted: true }),
                (2, EventKind::Exit),
            ]
        );
    }
}
