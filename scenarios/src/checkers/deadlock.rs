//! `deadlock`: a client wanted the lock for longer than the liveness bound while nobody held it.
//!
//! A client wants the lock from its first `AcquireInvoke` until an `AcquireOk` (failed attempts and the
//! pauses between them do not end the wanting) or until it crashes. Nobody holds the lock in the gaps
//! between hold intervals. A want that spans `liveness` of one such gap is a deadlock: the lock is free
//! by every client's own account, yet nobody can take it — an orphaned key, a holder that died.

use super::holds::{kills, Hold};
use super::{fmt_span, FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) fn check(h: &History, holds: &[Hold], liveness: Duration) -> Vec<Raw> {
    let wants = wants(h);
    let bound = liveness.as_nanos() as u64;
    let mut found = Vec::new();
    for (free_from, free_to) in free_gaps(holds, h.end) {
        let stuck: Vec<(NodeIx, u64, u64)> = wants
            .iter()
            .map(|(c, s, e)| (*c, (*s).max(free_from), (*e).min(free_to)))
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

/// `(client, from, to)` for every stretch of wanting the lock.
fn wants(h: &History) -> Vec<(NodeIx, u64, u64)> {
    let mut since: BTreeMap<NodeIx, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke => {
                since.entry(e.node).or_insert(e.t);
            }
            EventKind::AcquireOk { .. } => out.extend(since.remove(&e.node).map(|s| (e.node, s, e.t))),
            k if kills(k) => out.extend(since.remove(&e.node).map(|s| (e.node, s, e.t))),
            _ => {}
        }
    }
    out.extend(since.into_iter().map(|(c, s)| (c, s, h.end)));
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
