//! `deadlock`: a client wanted the lock for longer than the liveness bound while nobody held it.
//!
//! A client wants the lock from its first `AcquireInvoke` until an `AcquireOk` (failed attempts and the
//! pauses between them do not end the wanting) or until it crashes. Nobody holds the lock in the gaps
//! between hold intervals. A want that spans `liveness` of one such gap is a deadlock: the lock is free
//! by every client's own account, yet nobody can take it — an orphaned key, a holder that died.
//!
//! A client that crashes while it wants the lock, just after a watch told it the node or key ahead of
//! its own was gone, may have been granted the lock without recording so: the grant was on its way.
//! It is an orphan of its own, which its lease or session frees in its time, so the wait starts afresh
//! at that crash. Crashes of one new grantee after another, each freed within its TTL as a real lease
//! lock is, do not add up to a deadlock that no single orphan made; a crash of a client that was
//! merely queued restarts nothing.

use super::holds::{kills, Hold};
use super::{fmt_span, FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) fn check(h: &History, holds: &[Hold], liveness: Duration) -> Vec<Raw> {
    let wants = wants(h);
    let bound = liveness.as_nanos() as u64;
    let fresh_orphans: Vec<u64> = wants.iter().filter(|w| w.maybe_granted).map(|w| w.to).collect();
    let mut found = Vec::new();
    for (free_from, free_to) in split(free_gaps(holds, h.end), fresh_orphans) {
        let stuck: Vec<(NodeIx, u64, u64)> = wants
            .iter()
            .map(|w| (w.client, w.from.max(free_from), w.to.min(free_to)))
            .filter(|(_, s, e)| e > s && e - s >= bound)
            .collect();
        if stuck.is_empty() {
            continue;
        }
        let from = stuck.iter().map(|w| w.1).min().expect("non-empty");
        let to = stuck.iter().map(|w| w.2).max().expect("non-empty");
        let mut clients: Vec<NodeIx> = stuck.iter().map(|w| w.0).collect();
        clients.dedup();
        found.push(Raw {
            kind: FindingKind::Deadlock,
            clients,
            from,
            to,
            detail: format!(
                "the lock was free by every client's account, yet wanted and not granted for {}",
                fmt_span(to - from)
            ),
        });
    }
    found
}

/// How soon after its watch fired a waiter may have been granted the lock: a read or two (the etcd
/// `Mutex`'s re-check, a ZooKeeper lock's `getChildren`) take a few tens of milliseconds.
const GRANT_IN_FLIGHT_NS: u64 = 100_000_000;

/// One stretch of wanting the lock, and whether the client crashed at its end with a grant maybe on
/// its way (within [`GRANT_IN_FLIGHT_NS`] of a notification).
struct Want {
    client: NodeIx,
    from: u64,
    to: u64,
    maybe_granted: bool,
}

/// Every stretch of wanting the lock.
fn wants(h: &History) -> Vec<Want> {
    let mut since: BTreeMap<NodeIx, u64> = BTreeMap::new();
    let mut notified: BTreeMap<NodeIx, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for e in &h.events {
        let mut end = |maybe_granted| {
            out.extend(since.remove(&e.node).map(|from| Want { client: e.node, from, to: e.t, maybe_granted }))
        };
        match &e.kind {
            EventKind::AcquireInvoke => {
                since.entry(e.node).or_insert(e.t);
            }
            EventKind::AcquireOk { .. } => end(false),
            EventKind::Notify { .. } => {
                notified.insert(e.node, e.t);
            }
            k if kills(k) => {
                // A notification reaches the node; any of its workers may have been granted.
                let maybe_granted = notified.get(&e.node).is_some_and(|n| e.t - n <= GRANT_IN_FLIGHT_NS);
                for client in h.residents(e.node) {
                    out.extend(since.remove(&client).map(|from| Want { client, from, to: e.t, maybe_granted }));
                }
            }
            _ => {}
        }
    }
    out.extend(since.into_iter().map(|(client, from)| Want { client, from, to: h.end, maybe_granted: false }));
    out
}

/// `gaps` cut at each of `at` that falls inside one.
fn split(gaps: Vec<(u64, u64)>, mut at: Vec<u64>) -> Vec<(u64, u64)> {
    at.sort_unstable();
    let mut out = Vec::new();
    for (from, to) in gaps {
        let mut start = from;
        for &t in at.iter().filter(|t| from < **t && **t < to) {
            out.push((start, t));
            start = t;
        }
        out.push((start, to));
    }
    out
}

/// The gaps in `[0, end]` covered by no hold.
fn free_gaps(holds: &[Hold], end: u64) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut covered_to = 0;
    for hold in holds {
        if hold.start > covered_to {
            gaps.push((covered_to, hold.start));
        }
        covered_to = covered_to.max(hold.end);
    }
    if end > covered_to {
        gaps.push((covered_to, end));
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::super::holds::holds;
    use super::super::test_history::{crash, history, ok};
    use super::*;
    use locksim_sim::history::EventKind::*;

    fn run(h: &History) -> Vec<Raw> {
        check(h, &holds(h), Duration::from_secs(30))
    }

    #[test]
    fn a_crashed_holder_that_never_frees_the_lock_deadlocks_the_waiters() {
        let h = history(
            60.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (1.1, 0, ok(1)),
                (2.0, 1, AcquireInvoke),
                (5.0, 0, crash("client-0")),
                (12.0, 1, AcquireFail { reason: "timed out waiting".into() }),
                (12.1, 1, AcquireInvoke),
            ],
        );
        let found = run(&h);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].clients, vec![NodeIx(1)]);
        assert_eq!((found[0].from, found[0].to), (5_000_000_000, 60_000_000_000));
    }

    #[test]
    fn a_lock_that_frees_within_the_bound_is_quiet() {
        let h = history(
            60.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (1.1, 0, ok(1)),
                (2.0, 1, AcquireInvoke),
                (5.0, 0, crash("client-0")),
                (15.0, 1, ok(2)),
            ],
        );
        assert!(run(&h).is_empty());
    }

    #[test]
    fn new_grantees_crashing_one_after_another_are_orphans_freed_in_turn_not_a_deadlock() {
        // Client 0 releases at 2.1 s; each 10 s after, the lease of a crashed would-be holder expires.
        // Each time the next waiter's watch fires and it crashes `lag` later: 40 s without a holder,
        // yet with a short lag each was the next grantee and no orphan was older than 10 s.
        let events = |lag: f64| {
            let mut e = vec![(1.0, 0, AcquireInvoke), (1.1, 0, ok(1))];
            e.extend((1..=4).map(|i| (1.5, i, AcquireInvoke)));
            e.extend([(2.0, 0, ReleaseInvoke), (2.1, 0, ReleaseOk)]);
            for i in 1..=4 {
                let freed = 2.1 + 10.0 * f64::from(i - 1);
                e.push((freed, i, Notify { cause: "DELETE /mutex/ahead".into() }));
                e.push((freed + lag, i, crash(&format!("client-{i}"))));
            }
            e.extend([(45.0, 0, AcquireInvoke), (46.0, 0, ok(2))]);
            e
        };
        assert!(run(&history(60.0, events(0.05))).is_empty());
        // A crash long after the watch fired: the client was merely queued, and the wait goes on.
        assert_eq!(run(&history(60.0, events(1.0))).len(), 1);
    }

    #[test]
    fn waiting_on_a_live_holder_is_not_a_deadlock() {
        let h = history(60.0, vec![(1.0, 0, AcquireInvoke), (1.1, 0, ok(1)), (2.0, 1, AcquireInvoke)]);
        assert!(run(&h).is_empty(), "a holder that keeps the lock is slow, not deadlocked");
    }

    #[test]
    fn an_unknown_acquire_does_not_count_as_holding() {
        // The SET's reply was lost: the key is ours but we do not know it, and nobody else can take it.
        let h = history(
            60.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (2.0, 0, AcquireUnknown { reason: "timeout".into() }),
                (2.1, 0, AcquireInvoke),
            ],
        );
        assert_eq!(run(&h).len(), 1);
    }
}
