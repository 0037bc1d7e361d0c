//! `unfair`: a recipe that promises first-come-first-served granted the lock out of request order.
//!
//! The history shows when a client asked (`AcquireInvoke`) and was granted (`AcquireOk`), not when it
//! joined the recipe's queue, which comes a few round trips later. So a grant is unfair only when a
//! client that asked more than the margin ([`super::CheckConfig::fifo_margin`]) later was granted first, and the overtaken client's wait
//! was undisturbed: one continuous `acquire` with no fault aimed at its node (begun before or during the
//! wait) and no change of its session
//! (a crash, a partition or an expiry may rightly send it to the back of the queue). A fault's effects
//! outlast it: what a client sent during a cut reaches the server only at a TCP retransmission after
//! the heal, up to about the cut's own length later — so a wait that starts within that tail after a
//! fault on the client's node is disturbed too. Overlapping faults on one node make one cut, whose
//! tail is as long as all of it. A fault on a server (a node that never asks for the
//! lock) disturbs every wait: a restarted server resets every connection, and a recipe whose call fails
//! may rightly rejoin at the back. A client one of whose acquires or releases ended `Unknown`, or whose
//! release failed (a restarted server refused it), may still have its place in the queue — its node or
//! key survived, and the recipe reuses it, as etcd's Mutex does: until a release of its is known to have
//! gone through (`ReleaseOk`), its grants overtake nobody.

use super::{fmt_span, FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::{BTreeMap, BTreeSet};

/// Stands for every client: where a fault on a server is kept.
const EVERYONE: NodeIx = NodeIx(u32::MAX);

/// One granted request: who, when asked, when granted, whether anything disturbed the wait, and
/// whether the client may have kept an older place in the queue.
struct Wait {
    client: NodeIx,
    asked: u64,
    granted: u64,
    disturbed: bool,
    kept_place: bool,
}

fn waits(h: &History) -> Vec<Wait> {
    let mut open: BTreeMap<NodeIx, Wait> = BTreeMap::new();
    let mut unsure: BTreeSet<NodeIx> = BTreeSet::new();
    // Faults in force, by id, and the node each concerns: a wait that starts under one is disturbed
    // from the start; so is one that starts in the tail after it (see the module doc), until
    // `lingering`'s time.
    let mut active: BTreeMap<u32, NodeIx> = BTreeMap::new();
    let mut lingering: BTreeMap<NodeIx, u64> = BTreeMap::new();
    // Where each node's current stretch of overlapping faults began.
    let mut cut_since: BTreeMap<NodeIx, u64> = BTreeMap::new();
    // Faults and session changes are of a node; a worker's waits are disturbed by its node's.
    let hosts = h.hosts();
    let host = |n: NodeIx| hosts[n.0 as usize];
    let clients: BTreeSet<NodeIx> =
        h.events.iter().filter(|e| matches!(e.kind, EventKind::AcquireInvoke)).map(|e| host(e.node)).collect();
    // A fault on a server concerns every client: it is kept under this node.
    let everyone = |n: NodeIx| if clients.contains(&n) { n } else { EVERYONE };
    let mut done = Vec::new();
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke => {
                // Until a release is known to have gone through, the old node or key may still
                // stand, and every attempt may reuse it (a failed one leaves it too).
                let kept_place = unsure.contains(&e.node);
                let node = host(e.node);
                let disturbed = active.values().any(|n| *n == node || *n == EVERYONE)
                    || [node, EVERYONE].iter().any(|n| lingering.get(n).is_some_and(|until| *until > e.t));
                open.insert(e.node, Wait { client: e.node, asked: e.t, granted: 0, disturbed, kept_place });
            }
            EventKind::FaultEnd { id } => {
                if let Some(node) = active.remove(id) {
                    // Overlapping faults on a node are one cut: TCP's retransmission timer has backed
                    // off over all of it, so the tail is as long as the whole cut so far.
                    let since = cut_since[&node];
                    if !active.values().any(|n| *n == node) {
                        cut_since.remove(&node);
                    }
                    let until = lingering.entry(node).or_default();
                    *until = (*until).max(e.t + (e.t - since));
                }
            }
            EventKind::AcquireOk { .. } => {
                if let Some(wait) = open.remove(&e.node) {
                    done.push(Wait { granted: e.t, ..wait });
                }
            }
            EventKind::AcquireFail { .. } => {
                open.remove(&e.node);
            }
            EventKind::ReleaseOk => {
                unsure.remove(&e.node);
            }
            EventKind::AcquireUnknown { .. } | EventKind::ReleaseUnknown { .. } | EventKind::ReleaseFail { .. } => {
                open.remove(&e.node);
                unsure.insert(e.node);
            }
            EventKind::FaultStart { .. } | EventKind::Session { .. } => {
                let node = if matches!(e.kind, EventKind::FaultStart { .. }) { everyone(e.node) } else { e.node };
                if let EventKind::FaultStart { id, .. } = &e.kind {
                    active.insert(*id, node);
                    cut_since.entry(node).or_insert(e.t);
                }
                for wait in open.values_mut().filter(|w| node == EVERYONE || host(w.client) == node) {
                    wait.disturbed = true;
                }
            }
            _ => {}
        }
    }
    done
}

pub(super) fn check(h: &History, fifo: bool, margin: std::time::Duration) -> Vec<Raw> {
    let margin_ns = margin.as_nanos() as u64;
    if !fifo {
        return vec![];
    }
    let waits = waits(h);
    let mut found = Vec::new();
    for early in waits.iter().filter(|w| !w.disturbed) {
        let overtaker = waits.iter().find(|late| {
            late.client != early.client
                && !late.kept_place
                && late.asked > early.asked + margin_ns
                && late.granted < early.granted
        });
        if let Some(late) = overtaker {
            found.push(Raw {
                kind: FindingKind::Unfair,
                clients: vec![early.client, late.client],
                from: early.asked,
                to: early.granted,
                detail: format!("asked {} after, granted first", fmt_span(late.asked - early.asked)),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::test_history::{crash, history, ok};
    use super::super::FIFO_MARGIN;
    use super::*;
    use locksim_sim::history::EventKind::*;

    #[test]
    fn a_request_overtakes_only_when_asked_more_than_the_margin_later() {
        let h = history(10.0, vec![(1.0, 0, AcquireInvoke), (1.5, 1, AcquireInvoke), (3.0, 1, ok(2)), (4.0, 0, ok(3))]);
        assert_eq!(check(&h, true, FIFO_MARGIN).len(), 1, "half a second later, past the simulator's margin");
        assert!(check(&h, true, std::time::Duration::from_secs(1)).is_empty(), "within a real run's");
    }

    #[test]
    fn a_later_request_granted_first_is_unfair() {
        let h = history(10.0, vec![(1.0, 0, AcquireInvoke), (2.0, 1, AcquireInvoke), (3.0, 1, ok(2)), (4.0, 0, ok(3))]);
        let found = check(&h, true, FIFO_MARGIN);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].clients, vec![NodeIx(0), NodeIx(1)]);
        assert!(check(&h, false, FIFO_MARGIN).is_empty(), "only recipes that promise FIFO are held to it");
    }

    #[test]
    fn grants_in_request_order_and_near_ties_are_fair() {
        let in_order =
            history(10.0, vec![(1.0, 0, AcquireInvoke), (2.0, 1, AcquireInvoke), (3.0, 0, ok(2)), (4.0, 1, ok(3))]);
        assert!(check(&in_order, true, FIFO_MARGIN).is_empty());
        // Asked 50 ms apart: either may have joined the queue first.
        let tie =
            history(10.0, vec![(1.0, 0, AcquireInvoke), (1.05, 1, AcquireInvoke), (3.0, 1, ok(2)), (4.0, 0, ok(3))]);
        assert!(check(&tie, true, FIFO_MARGIN).is_empty());
    }

    #[test]
    fn a_disturbed_or_interrupted_wait_may_be_overtaken() {
        let crashed = history(
            10.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (1.5, 0, crash("client-0")),
                (2.0, 1, AcquireInvoke),
                (3.0, 1, ok(2)),
                (4.0, 0, ok(3)),
            ],
        );
        assert!(check(&crashed, true, FIFO_MARGIN).is_empty());
        let failed = history(
            10.0,
            vec![
                (1.0, 0, AcquireInvoke),
                (1.5, 0, AcquireUnknown { reason: "connection loss".into() }),
                (2.0, 1, AcquireInvoke),
                (3.0, 1, ok(2)),
                (3.5, 0, AcquireInvoke),
                (4.0, 0, ok(3)),
            ],
        );
        assert!(check(&failed, true, FIFO_MARGIN).is_empty(), "the second request came after the overtaker's");
    }

    #[test]
    fn a_client_unsure_of_its_release_keeps_its_place_across_failed_attempts() {
        let h = history(
            20.0,
            vec![
                (1.0, 0, ok(1)),
                (2.0, 0, ReleaseInvoke),
                (3.0, 0, ReleaseUnknown { reason: "delete: timed out".into() }),
                (4.0, 1, AcquireInvoke),
                (5.0, 0, AcquireInvoke),
                (5.1, 0, AcquireFail { reason: "txn: unavailable".into() }),
                (6.0, 0, AcquireInvoke),
                (6.5, 0, ok(2)),
                (7.0, 0, ReleaseInvoke),
                (7.5, 0, ReleaseOk),
                (8.0, 1, ok(3)),
            ],
        );
        assert!(check(&h, true, FIFO_MARGIN).is_empty(), "its key may still have stood ahead of client 1's");
    }

    #[test]
    fn a_client_unsure_whether_it_released_may_keep_its_place() {
        let h = history(
            20.0,
            vec![
                (1.0, 0, ok(1)),
                (2.0, 1, AcquireInvoke),
                (3.0, 0, ReleaseInvoke),
                (8.0, 0, ReleaseUnknown { reason: "delete: timed out".into() }),
                (9.0, 0, AcquireInvoke),
                (9.1, 0, ok(1)),
                (10.0, 0, ReleaseInvoke),
                (10.5, 0, ReleaseOk),
                (11.0, 1, ok(2)),
                (12.0, 0, AcquireInvoke),
                (12.5, 2, AcquireInvoke),
                (13.0, 2, ok(3)),
                (14.0, 0, ok(4)),
            ],
        );
        let found = check(&h, true, FIFO_MARGIN);
        assert_eq!(found.len(), 1, "its key may have survived; later requests are held to the queue again");
        assert_eq!(found[0].clients, vec![NodeIx(0), NodeIx(2)]);
    }

    #[test]
    fn a_client_whose_release_failed_keeps_its_key_and_its_place() {
        // etcd-mutex-server-crash-nemesis seed 3621: the server restarted under a release, which failed;
        // the Mutex's key stood, and its next acquire found it at the head of the queue at once.
        let events = |release_end| {
            vec![
                (1.0, 0, ok(1)),
                (2.0, 1, AcquireInvoke),
                (3.0, 0, ReleaseInvoke),
                (3.5, 0, release_end),
                (4.0, 0, AcquireInvoke),
                (4.1, 0, ok(1)),
                (5.0, 0, ReleaseInvoke),
                (5.1, 0, ReleaseOk),
                (5.2, 1, ok(2)),
            ]
        };
        let failed = ReleaseFail { reason: "unavailable (the server restarted)".into() };
        assert!(check(&history(10.0, events(failed)), true, FIFO_MARGIN).is_empty(), "it never let go");
        assert_eq!(
            check(&history(10.0, events(ReleaseOk)), true, FIFO_MARGIN).len(),
            1,
            "a release that went through lets go"
        );
    }

    #[test]
    fn a_wait_that_starts_under_a_fault_or_its_tail_is_disturbed_and_one_after_them_is_not() {
        let cut = |id| FaultStart {
            id,
            fault: locksim_sim::fault::FaultKind::Partition,
            target: "client-0".into(),
            detail: String::new(),
        };
        // A 400 ms cut from 0.5 s: its retransmissions may arrive until about 1.3 s.
        let events = |end_first: bool, asked: f64| {
            let mut e = vec![(0.5, 0, cut(1))];
            if end_first {
                e.push((0.9, 0, FaultEnd { id: 1 }));
            }
            e.extend([(asked, 0, AcquireInvoke), (2.0, 1, AcquireInvoke), (3.0, 1, ok(2)), (4.0, 0, ok(3))]);
            e
        };
        assert!(check(&history(10.0, events(false, 1.0)), true, FIFO_MARGIN).is_empty(), "asked while cut off");
        assert!(check(&history(10.0, events(true, 1.0)), true, FIFO_MARGIN).is_empty(), "asked in the cut's tail");
        assert_eq!(
            check(&history(10.0, events(true, 1.5)), true, FIFO_MARGIN).len(),
            1,
            "asked once the tail had passed"
        );
    }

    #[test]
    fn overlapping_faults_on_a_node_are_one_cut_with_one_long_tail() {
        let cut = |id| FaultStart {
            id,
            fault: locksim_sim::fault::FaultKind::Partition,
            target: "client-0".into(),
            detail: String::new(),
        };
        // Cuts of 0.5..2.5 s and 2.0..3.0 s: one cut of 2.5 s, whose retransmissions may arrive until
        // about 5.5 s, though the second fault alone lasted 1 s.
        let events = |asked: f64| {
            vec![
                (0.5, 0, cut(1)),
                (2.0, 0, cut(2)),
                (2.5, 0, FaultEnd { id: 1 }),
                (3.0, 0, FaultEnd { id: 2 }),
                (asked, 0, AcquireInvoke),
                (asked + 0.5, 1, AcquireInvoke),
                (7.0, 1, ok(2)),
                (8.0, 0, ok(3)),
            ]
        };
        assert!(check(&history(10.0, events(4.5)), true, FIFO_MARGIN).is_empty(), "asked in the whole cut's tail");
        assert_eq!(check(&history(10.0, events(5.6)), true, FIFO_MARGIN).len(), 1, "asked once the tail had passed");
    }

    #[test]
    fn a_fault_on_a_server_disturbs_every_wait() {
        let crash = FaultStart {
            id: 1,
            fault: locksim_sim::fault::FaultKind::Crash,
            target: "server".into(),
            detail: String::new(),
        };
        // Node 2 never asks for the lock: a server. Its crash at 1.5 s disturbs client 0's wait.
        let events = |server: u32| {
            vec![
                (1.0, 0, AcquireInvoke),
                (1.5, server, crash.clone()),
                (2.0, 1, AcquireInvoke),
                (3.0, 1, ok(2)),
                (4.0, 0, ok(3)),
            ]
        };
        assert!(check(&history(10.0, events(2)), true, FIFO_MARGIN).is_empty(), "a server crash");
        assert_eq!(check(&history(10.0, events(1)), true, FIFO_MARGIN).len(), 1, "a crash of the overtaking client");
    }
}
