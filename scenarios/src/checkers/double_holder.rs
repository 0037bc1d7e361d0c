//! `double-holder`: two clients each believed they held the lock at the same simulated instant — unless
//! both held it shared (two readers of a read-write lock); a reader and a writer together count.

use super::holds::Hold;
use super::{fmt_span, FindingKind, Raw};

pub(super) fn check(holds: &[Hold]) -> Vec<Raw> {
    let mut found = Vec::new();
    for (i, a) in holds.iter().enumerate() {
        // Holds are sorted by start: only later-starting holds that begin before `a` ends can overlap it.
        for b in holds[i + 1..].iter().take_while(|b| b.start < a.end) {
            if b.client == a.client || b.start >= b.end.max(a.start) || (a.shared && b.shared) {
                continue;
            }
            let (from, to) = (b.start, a.end.min(b.end));
            let what = match (a.shared, b.shared) {
                (false, false) => "both held the lock",
                _ => "a reader and a writer held the lock together",
            };
            found.push(Raw {
                kind: FindingKind::DoubleHolder,
                clients: vec![a.client, b.client],
                from,
                to,
                detail: format!("{what} for {}", fmt_span(to - from)),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::holds::holds;
    use super::super::test_history::{crash, history, ok};
    use super::*;
    use locksim_sim::history::EventKind::*;
    use locksim_sim::history::NodeIx;

    #[test]
    fn overlapping_holds_of_two_clients_are_found() {
        let h = history(10.0, vec![(1.0, 0, ok(1)), (2.0, 1, ok(2)), (3.0, 0, ReleaseInvoke), (4.0, 1, ReleaseInvoke)]);
        let found = check(&holds(&h));
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].from, found[0].to), (2_000_000_000, 3_000_000_000));
    }

    #[test]
    fn workers_of_one_client_are_holders_of_their_own_and_die_with_their_client() {
        let mut h = history(
            10.0,
            vec![
                (1.0, 0, ok(1)),
                (1.5, 4, ok(2)),
                (2.0, 0, crash("client-0")),
                (3.0, 1, ok(3)),
                (4.0, 1, ReleaseInvoke),
            ],
        );
        h.nodes.push("client-0/w1".into());
        let found = check(&holds(&h));
        // Two workers of client-0 held together; its crash ended both holds, so client-1's is alone.
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].clients, [NodeIx(0), NodeIx(4)]);
        assert_eq!((found[0].from, found[0].to), (1_500_000_000, 2_000_000_000));
        assert_eq!((h.host(NodeIx(4)), h.residents(NodeIx(0))), (NodeIx(0), vec![NodeIx(0), NodeIx(4)]));
    }

    #[test]
    fn a_clean_handoff_is_quiet() {
        let h = history(10.0, vec![(1.0, 0, ok(1)), (2.0, 0, ReleaseInvoke), (2.5, 1, ok(2)), (3.0, 1, ReleaseInvoke)]);
        assert!(check(&holds(&h)).is_empty());
    }

    #[test]
    fn an_unknown_acquire_is_not_a_belief_and_a_crash_ends_one() {
        let crash = crash("client-0");
        let h = history(
            10.0,
            vec![
                (1.0, 0, ok(1)),
                (2.0, 0, crash),
                (2.5, 1, AcquireUnknown { reason: "timeout".into() }),
                (3.0, 2, ok(2)),
            ],
        );
        assert!(check(&holds(&h)).is_empty());
    }

    #[test]
    fn a_client_told_its_lock_is_lost_stops_believing() {
        let lost = LockLost { reason: "session suspended".into() };
        let h = history(10.0, vec![(1.0, 0, ok(1)), (2.0, 0, lost), (3.0, 1, ok(2))]);
        assert!(check(&holds(&h)).is_empty());
    }

    #[test]
    fn readers_may_share_but_not_with_a_writer() {
        let read = |token| AcquireOk { token: Some(token), shared: true };
        let readers = history(10.0, vec![(1.0, 0, read(1)), (2.0, 1, read(2)), (3.0, 0, ReleaseInvoke)]);
        assert!(check(&holds(&readers)).is_empty());
        let mixed = history(10.0, vec![(1.0, 0, read(1)), (2.0, 1, ok(2)), (3.0, 0, ReleaseInvoke)]);
        let found = check(&holds(&mixed));
        assert_eq!(found.len(), 1);
        assert!(found[0].detail.starts_with("a reader and a writer"), "{}", found[0].detail);
    }

    #[test]
    fn a_hold_still_open_at_the_end_counts() {
        let h = history(10.0, vec![(1.0, 0, ok(1)), (9.0, 1, ok(2))]);
        assert_eq!(check(&holds(&h)).len(), 1);
    }
}
