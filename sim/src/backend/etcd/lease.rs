//! Leases (etcd `lease.Lessor`): granted with a TTL, renewed by keep-alives, expired by the server's
//! clock; an expired or revoked lease deletes every key attached to it.

use super::LeaseId;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug)]
pub struct Lease {
    pub ttl_s: i64,
    pub expiry_ms: i64,
    pub keys: BTreeSet<String>,
}

#[derive(Debug, Default)]
pub struct Leases {
    next_id: LeaseId,
    leases: BTreeMap<LeaseId, Lease>,
}

/// etcd's minimum TTL: 3/2 of the election timeout (1 s by default), rounded up to whole seconds.
pub const MIN_TTL_S: i64 = 2;

impl Leases {
    pub fn grant(&mut self, ttl_s: i64, now_ms: i64) -> (LeaseId, i64) {
        self.next_id += 1;
        let ttl_s = ttl_s.max(MIN_TTL_S);
        self.leases.insert(self.next_id, Lease { ttl_s, expiry_ms: now_ms + ttl_s * 1000, keys: BTreeSet::new() });
        (self.next_id, ttl_s)
    }

    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// Renew to a full TTL from now; the TTL, or `None` if the lease is gone — or has expired and only
    /// waits for the periodic revoke: once `l.expired()`, etcd's `lessor.Renew` waits for the revoke
    /// and answers `ErrLeaseNotFound`, so a late keep-alive never revives a lease whose keys are about
    /// to go. (A single server answers at once, its revoke being sure; a cluster's leader holds the
    /// keep-alive until the revoke or its demotion: `cluster.rs`, `answer_from_lessor`.)
    pub fn renew(&mut self, id: LeaseId, now_ms: i64) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        if lease.expiry_ms <= now_ms {
            return None;
        }
        lease.expiry_ms = now_ms + lease.ttl_s * 1000;
        Some(lease.ttl_s)
    }

    /// Every lease gets a full TTL from `from_ms` (a restarted server, like a new leader, must not
    /// expire leases whose keep-alives it could not have heard).
    pub fn renew_all(&mut self, from_ms: i64) {
        for lease in self.leases.values_mut() {
            lease.expiry_ms = from_ms + lease.ttl_s * 1000;
        }
    }

    pub fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        self.leases.remove(&id)
    }

    /// Attach `key` to `lease` (and detach it from `previous`).
    pub fn attach(&mut self, key: &str, lease: LeaseId, previous: LeaseId) {
        self.detach(key, previous);
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.insert(key.to_string());
        }
    }

    pub fn detach(&mut self, key: &str, lease: LeaseId) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.remove(key);
        }
    }

    /// The leases whose time is up, in id order.
    pub fn expired(&self, now_ms: i64) -> Vec<LeaseId> {
        self.leases.iter().filter(|(_, l)| l.expiry_ms <= now_ms).map(|(id, _)| *id).collect()
    }
}
