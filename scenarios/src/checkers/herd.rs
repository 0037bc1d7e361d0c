//! `herd`: one change woke more waiters than `check.herd_max`.
//!
//! Every notification a server sends is a `Notify` event; those caused by one change (one deletion, say)
//! share its instant and cause. Their count is how many clients that change woke.

use super::{FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;

/// `(instant, cause) → clients woken`, for every change that notified anyone.
pub fn wakeups(h: &History) -> BTreeMap<(u64, &str), Vec<NodeIx>> {
    let mut groups: BTreeMap<(u64, &str), Vec<NodeIx>> = BTreeMap::new();
    for e in &h.events {
        if let EventKind::Notify { cause } = &e.kind {
            groups.entry((e.t, cause.as_str())).or_default().push(e.node);
        }
    }
    groups
}

pub(super) fn check(h: &History, herd_max: Option<u32>) -> Vec<Raw> {
    let Some(max) = herd_max else { return vec![] };
    wakeups(h)
        .into_iter()
        .filter(|(_, woken)| woken.len() > max as usize)
        .map(|((t, cause), woken)| Raw {
            kind: FindingKind::Herd,
            detail: format!("{cause} woke {} clients (herd_max = {max})", woken.len()),
            clients: woken,
            from: t,
            to: t,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_history::history;
    use super::*;

    fn notify(cause: &str) -> EventKind {
        EventKind::Notify { cause: cause.into() }
    }

    #[test]
    fn one_deletion_waking_every_waiter_is_a_herd() {
        let h = history(
            10.0,
            vec![
                (1.0, 0, notify("NodeDeleted /lock")),
                (1.0, 1, notify("NodeDeleted /lock")),
                (1.0, 2, notify("NodeDeleted /lock")),
            ],
        );
        let found = check(&h, Some(1));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].clients.len(), 3);
    }

    #[test]
    fn one_waiter_per_change_is_quiet_and_no_bound_means_no_check() {
        let h = history(10.0, vec![(1.0, 0, notify("NodeDeleted /a")), (2.0, 1, notify("NodeDeleted /a"))]);
        assert!(check(&h, Some(1)).is_empty(), "two changes, one waiter each");
        let herd = history(10.0, vec![(1.0, 0, notify("NodeDeleted /a")), (1.0, 1, notify("NodeDeleted /a"))]);
        assert!(check(&herd, None).is_empty());
    }
}
