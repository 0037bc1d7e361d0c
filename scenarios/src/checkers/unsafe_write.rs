//! `unsafe-write` (the damage) and `stale-write-rejected` (the defence), from the resource's events.
//!
//! A write by client A is unsafe when the resource accepted it after another client B, whose hold began
//! after A's hold began, had already been admitted to the resource (its read accepted): A is acting on a lock that has passed on, and
//! B has already read state A is about to overwrite. It is also unsafe when its token is lower than one
//! the resource already accepted. A refused access (`accepted = false`) is `stale-write-rejected`.
//!
//! When the resource fences, the tokens say which hold is the later one, not the grants' order: a
//! client granted after A with a lower token (a grant the lock should not have made, as etcd 3.4's mutex
//! makes to a waiter whose key is gone) that slipped in before A's first access is the *earlier* hold in
//! the resource's eyes — A's write after it is the fenced order working, and B's own write will be
//! refused.
//!
//! The store's accesses count as the counter's do: an accepted `Get` admits its client like a `Read`,
//! and a `Put` is judged like a `Write`.

use super::{FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;

pub(super) fn check(h: &History, fenced: bool) -> Vec<Raw> {
    let mut found = Vec::new();
    // When each client's current hold began, and the hold start of each client's latest entry.
    let mut hold_start: BTreeMap<NodeIx, u64> = BTreeMap::new();
    let mut entered: BTreeMap<NodeIx, Entry> = BTreeMap::new();
    let mut highest_accepted: Option<u64> = None;
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireOk { .. } => {
                hold_start.insert(e.node, e.t);
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                hold_start.remove(&e.node);
            }
            k if super::holds::kills(k) => {
                for client in h.residents(e.node) {
                    hold_start.remove(&client);
                }
            }
            EventKind::Read { accepted: true, token, .. } | EventKind::Get { accepted: true, token, .. } => {
                if let Some(start) = hold_start.get(&e.node) {
                    entered.insert(e.node, Entry { start: *start, at: e.t, token: *token });
                }
            }
            EventKind::Read { accepted: false, token, .. }
            | EventKind::Write { accepted: false, token, .. }
            | EventKind::Get { accepted: false, token, .. }
            | EventKind::Put { accepted: false, token, .. } => {
                found.push(Raw {
                    kind: FindingKind::StaleWriteRejected,
                    clients: vec![e.node],
                    from: e.t,
                    to: e.t,
                    detail: format!("the resource refused token {}", show(token)),
                });
            }
            EventKind::Write { accepted: true, token, .. } | EventKind::Put { accepted: true, token, .. } => {
                let mine = hold_start.get(&e.node).copied();
                let newer = entered.iter().find(|(c, entry)| {
                    **c != e.node
                        && mine.is_some_and(|start| entry.is_later_than(start, fenced.then_some(*token).flatten()))
                });
                if let Some((other, entry)) = newer {
                    found.push(Raw {
                        kind: FindingKind::UnsafeWrite,
                        clients: vec![e.node, *other],
                        from: entry.at,
                        to: e.t,
                        detail: format!("write with token {} accepted after a later holder entered", show(token)),
                    });
                } else if let (Some(t), Some(high)) = (token, highest_accepted) {
                    if *t < high {
                        found.push(Raw {
                            kind: FindingKind::UnsafeWrite,
                            clients: vec![e.node],
                            from: e.t,
                            to: e.t,
                            detail: format!("token {t} accepted after token {high}"),
                        });
                    }
                }
                highest_accepted = highest_accepted.max(*token);
            }
            _ => {}
        }
    }
    found
}

/// A client's latest admission to the resource: when its hold began, when its read was accepted, and
/// with which token.
struct Entry {
    start: u64,
    at: u64,
    token: Option<u64>,
}

impl Entry {
    /// Whether this hold is later than a writer's that began at `start` with `token` (`None` when the
    /// resource does not fence): by the tokens when both have one, else by when the holds began.
    fn is_later_than(&self, start: u64, token: Option<u64>) -> bool {
        match (self.token, token) {
            (Some(mine), Some(theirs)) if mine != theirs => mine > theirs,
            _ => self.start > start,
        }
    }
}

fn show(token: &Option<u64>) -> String {
    token.map_or("none".into(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::test_history::{history, ok};
    use super::*;
    use locksim_sim::history::EventKind::*;

    fn enter(t: u64) -> EventKind {
        Read { value: 0, token: Some(t), accepted: true }
    }
    fn write(token: u64, accepted: bool) -> EventKind {
        Write { value: 1, token: Some(token), accepted }
    }

    #[test]
    fn a_paused_holder_writing_after_the_next_holder_entered_is_unsafe() {
        let h = history(
            10.0,
            vec![(1.0, 0, ok(1)), (1.1, 0, enter(1)), (5.0, 1, ok(2)), (5.1, 1, enter(2)), (9.0, 0, write(1, true))],
        );
        let found = check(&h, false);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, FindingKind::UnsafeWrite);
        assert_eq!(found[0].clients, vec![NodeIx(0), NodeIx(1)]);
    }

    #[test]
    fn a_crash_of_a_client_ends_its_workers_holds_and_a_live_workers_late_write_is_unsafe() {
        // client-0/w1 (node 4) entered; client-1 entered after it; w1's write lands late.
        let late = |crashed: bool| {
            let mut events = vec![(1.0, 4, ok(1)), (1.1, 4, enter(1)), (5.0, 1, ok(2)), (5.1, 1, enter(2))];
            if crashed {
                events.insert(2, (2.0, 0, super::super::test_history::crash("client-0")));
            }
            events.push((9.0, 4, write(1, true)));
            let mut h = history(10.0, events);
            h.nodes.push("client-0/w1".into());
            check(&h, false).into_iter().filter(|f| f.kind == FindingKind::UnsafeWrite).count()
        };
        assert_eq!(late(false), 1, "the worker still believed it held: its write after a newer entry");
        assert_eq!(late(true), 0, "client-0's crash ended its worker's hold: no holder wrote late");
    }

    #[test]
    fn a_later_grant_with_a_lower_token_is_the_earlier_hold_when_the_resource_fences() {
        // client-1 is granted after client-0 but with token 1 (its key was gone: etcd 3.4's mutex), and
        // reads before client-0 does; client-0's write with token 2 is the fenced order, not a stale
        // write (client-1's own write will be refused).
        let h = history(
            10.0,
            vec![(1.0, 0, ok(2)), (2.0, 1, ok(1)), (2.1, 1, enter(1)), (3.0, 0, enter(2)), (4.0, 0, write(2, true))],
        );
        assert_eq!(check(&h, true).len(), 0);
        // Unfenced, the tokens mean nothing to the resource: client-1 began later and had read what
        // client-0 overwrote.
        assert_eq!(check(&h, false).iter().map(|f| f.kind).collect::<Vec<_>>(), vec![FindingKind::UnsafeWrite]);
    }

    #[test]
    fn the_same_write_refused_by_fencing_is_the_defence_working() {
        let h = history(
            10.0,
            vec![(1.0, 0, ok(1)), (1.1, 0, enter(1)), (5.0, 1, ok(2)), (5.1, 1, enter(2)), (9.0, 0, write(1, false))],
        );
        let kinds: Vec<_> = check(&h, true).iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![FindingKind::StaleWriteRejected]);
    }

    #[test]
    fn a_later_holder_whose_read_was_refused_has_not_entered() {
        // B's grant is recorded after A's, but B's token is lower (its INCR ran first, its reply came
        // late): the resource refuses B's read, so A's write is not stale.
        let h = history(
            10.0,
            vec![
                (1.0, 0, ok(6)),
                (1.1, 0, enter(6)),
                (1.2, 1, ok(5)),
                (1.3, 1, Read { value: 0, token: Some(5), accepted: false }),
                (1.5, 0, write(6, true)),
            ],
        );
        let kinds: Vec<_> = check(&h, true).iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![FindingKind::StaleWriteRejected]);
    }

    #[test]
    fn the_stores_gets_and_puts_are_judged_as_reads_and_writes() {
        let get = |token| Get { key: "k".into(), value: None, token: Some(token), accepted: true };
        let put = |token, accepted| Put { key: "k".into(), value: "v".into(), token: Some(token), accepted };
        let h = history(
            10.0,
            vec![(1.0, 0, ok(1)), (1.1, 0, get(1)), (5.0, 1, ok(2)), (5.1, 1, get(2)), (9.0, 0, put(1, true))],
        );
        let found = check(&h, false);
        assert_eq!((found.len(), found[0].kind), (1, FindingKind::UnsafeWrite));
        let fenced = history(10.0, vec![(1.0, 0, ok(1)), (5.0, 1, ok(2)), (5.1, 1, get(2)), (9.0, 0, put(1, false))]);
        let kinds: Vec<_> = check(&fenced, true).iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![FindingKind::StaleWriteRejected]);
    }

    #[test]
    fn sequential_holders_are_quiet() {
        let h = history(
            10.0,
            vec![
                (1.0, 0, ok(1)),
                (1.1, 0, enter(1)),
                (1.2, 0, write(1, true)),
                (1.3, 0, ReleaseInvoke),
                (2.0, 1, ok(2)),
                (2.1, 1, enter(2)),
                (2.2, 1, write(2, true)),
            ],
        );
        assert!(check(&h, false).is_empty());
    }

    #[test]
    fn an_accepted_lower_token_is_unsafe() {
        let h = history(
            10.0,
            vec![
                (1.0, 1, ok(5)),
                (1.1, 1, write(5, true)),
                (1.2, 1, ReleaseInvoke),
                (2.0, 0, ok(4)),
                (2.1, 0, write(4, true)),
            ],
        );
        let found = check(&h, false);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].detail, "token 4 accepted after token 5");
    }
}
