//! Hazards: the dangerous situations a run reached, counted beside the history (never in it).
//!
//! A hazard is not a finding: it says a fault *bit* — a lease really expired under a holder, a release
//! really went unanswered — whether or not a checker then found damage. Suites require hazards
//! (`[[run]] hazards = [...]`) so that a fault schedule that silently stopped biting fails CI.
//!
//! Marks are kept by the [`crate::history::Recorder`] in a per-seed counter, so the history and its hash
//! stay exactly what they were. Each variant's doc names where it is marked.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How many times each hazard was reached (in one seed, or summed over seeds).
pub type HazardCounts = BTreeMap<Hazard, u64>;

/// The closed vocabulary of hazards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hazard {
    /// A server ended the lease of a client that believed it held the lock (between its `acquire-ok`
    /// and its release or `lock-lost`): a Redis key it set expired (noticed when the key is next
    /// touched, `backend/redis/data.rs`), a ZooKeeper session expired by the tracker (`backend/zk`
    /// tick), an etcd lease expired by the lessor (`backend/etcd` tick), a database session ended by
    /// keep-alive or idle timeout (`backend/sql` `end_session`), a ShedLock row's `lock_until` passed
    /// and another client took the row over (`Ctx::took_over`, from `locks/src/sql/shedlock.rs`).
    LeaseExpiredWhileHeld,
    /// A holder paused past the end of its lease resumed still believing it held the lock (the world's
    /// resume, `world.rs`): the stale-holder window.
    StaleHolderResumed,
    /// A client was granted the lock after a server had ended one of its sessions or leases during that
    /// same `acquire` (the workload's `acquire-ok` in the recorder, after a backend's expiry).
    GrantToExpiredSession,
    /// A release ended `unknown` (its reply was lost or timed out): it may or may not have let go
    /// (`workload.rs`).
    ReleaseReplyLost,
    /// An acquire ended `unknown`: the lock may have been taken for a client that thinks it was not, an
    /// orphan (`workload.rs`).
    AcquireReplyLost,
    /// A ZooKeeper watch notification reached a client while it believed its session disconnected or
    /// expired (`backend/zk/client.rs`, the node's event router).
    WatchFiredWhileDisconnected,
    /// A Redis failover promoted a replica that lacked a key with an expiry (a lock key) the failed master
    /// held, or held an older value of it (the failover hook in `locks/src/redis/mod.rs`).
    LockKeyLostInFailover,
    /// A clock jump hit a client holding the lock, or a server while some client held it (`world.rs`).
    ClockJumpDuringHold,
    /// A client crashed (or was restarted) while it believed it held the lock: the lock is orphaned
    /// until its lease or session ends, or for good (`world.rs`).
    HolderCrashed,
    /// An etcd member served a linearizable read from a store older than what the cluster had committed
    /// when the member took the read (`backend/etcd/cluster.rs`, `serve_read`): a stale read, as
    /// etcd#20418's.
    StaleRead,
    /// A connection pooler handed a backend holding a session advisory lock to another client than the
    /// last one it served (pgbouncer's transaction pooling, `backend/sql/pool.rs`): that client's
    /// statements run in the lock holder's session.
    PooledSessionLock,
    /// A Redis master took a client's write after the Sentinels had promoted another server in its
    /// place (the newest configuration epoch names another master): the split brain (`backend/redis/mod.rs`, `RedisState::apply`).
    DeposedMasterWrite,
}

impl Hazard {
    pub const ALL: [Hazard; 12] = [
        Hazard::LeaseExpiredWhileHeld,
        Hazard::StaleHolderResumed,
        Hazard::GrantToExpiredSession,
        Hazard::ReleaseReplyLost,
        Hazard::AcquireReplyLost,
        Hazard::WatchFiredWhileDisconnected,
        Hazard::LockKeyLostInFailover,
        Hazard::ClockJumpDuringHold,
        Hazard::HolderCrashed,
        Hazard::StaleRead,
        Hazard::PooledSessionLock,
        Hazard::DeposedMasterWrite,
    ];

    /// The kebab-case id suites and results use.
    pub fn name(self) -> &'static str {
        match self {
            Hazard::LeaseExpiredWhileHeld => "lease-expired-while-held",
            Hazard::StaleHolderResumed => "stale-holder-resumed",
            Hazard::GrantToExpiredSession => "grant-to-expired-session",
            Hazard::ReleaseReplyLost => "release-reply-lost",
            Hazard::AcquireReplyLost => "acquire-reply-lost",
            Hazard::WatchFiredWhileDisconnected => "watch-fired-while-disconnected",
            Hazard::LockKeyLostInFailover => "lock-key-lost-in-failover",
            Hazard::ClockJumpDuringHold => "clock-jump-during-hold",
            Hazard::HolderCrashed => "holder-crashed",
            Hazard::StaleRead => "stale-read",
            Hazard::PooledSessionLock => "pooled-session-lock",
            Hazard::DeposedMasterWrite => "deposed-master-write",
        }
    }

    pub fn parse(name: &str) -> Option<Hazard> {
        Hazard::ALL.into_iter().find(|h| h.name() == name)
    }

    /// One line for `locksim list hazards`.
    pub fn describe(self) -> &'static str {
        match self {
            Hazard::LeaseExpiredWhileHeld => {
                "a server ended the lease (Redis key, ZooKeeper session, etcd lease, database session, a ShedLock \
                 row taken over past its lock_until) of a client that believed it held the lock"
            }
            Hazard::StaleHolderResumed => "a holder paused past the end of its lease resumed, still believing it held",
            Hazard::GrantToExpiredSession => {
                "a client was granted the lock after a server ended one of its sessions or leases during that acquire"
            }
            Hazard::ReleaseReplyLost => "a release ended unknown: it may or may not have let go",
            Hazard::AcquireReplyLost => "an acquire ended unknown: the lock may be held for a client that gave up",
            Hazard::WatchFiredWhileDisconnected => {
                "a ZooKeeper watch notification reached a client that believed its session disconnected or expired"
            }
            Hazard::LockKeyLostInFailover => {
                "a Redis failover promoted a replica missing a lock key (a key with an expiry) of the failed master"
            }
            Hazard::ClockJumpDuringHold => {
                "a clock jump hit a client holding the lock, or a server while a client held it"
            }
            Hazard::HolderCrashed => "a client crashed or restarted while it believed it held the lock",
            Hazard::StaleRead => {
                "an etcd member answered a linearizable read from a store older than the cluster had committed when \
                 it took the read"
            }
            Hazard::PooledSessionLock => {
                "a connection pooler handed a backend holding a session advisory lock to another client (pgbouncer's \
                 transaction pooling)"
            }
            Hazard::DeposedMasterWrite => {
                "a Redis master took a client's write after the Sentinels had promoted another server in its place \
                 (a split brain)"
            }
        }
    }
}

impl std::fmt::Display for Hazard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Add `from`'s counts into `into`.
pub fn add_counts(into: &mut HazardCounts, from: &HazardCounts) {
    for (h, n) in from {
        *into.entry(*h).or_default() += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hazard_parses_from_its_name_and_serialises_as_it() {
        for h in Hazard::ALL {
            assert_eq!(Hazard::parse(h.name()), Some(h));
            assert_eq!(serde_json::to_string(&h).unwrap(), format!("\"{}\"", h.name()));
        }
        assert_eq!(Hazard::parse("lease-expired"), None);
    }
}
