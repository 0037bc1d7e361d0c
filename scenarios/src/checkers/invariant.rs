//! `invariant`: a user's own invariant over the store (see `locksim_locks::work`), broken.
//!
//! The checker gathers every store access the store let through (`Get`/`Put` with `accepted`), in the
//! order it applied them, hands them to the workload's `check`, and turns each point it names into a
//! finding at that access. Refused accesses are left out: fencing kept them from the state.

use super::{FindingKind, Raw};
use locksim_locks::work::{Access, WorkSpec};
use locksim_sim::history::{EventKind, History, NodeIx};

pub(super) fn check(h: &History, work: Option<&WorkSpec>) -> Vec<Raw> {
    let Some(work) = work else { return vec![] };
    let mut nodes: Vec<NodeIx> = Vec::new();
    let mut accesses: Vec<Access> = Vec::new();
    for e in &h.events {
        let (key, value, token, put) = match &e.kind {
            EventKind::Get { key, value, token, accepted: true } => (key, value.clone(), token, false),
            EventKind::Put { key, value, token, accepted: true } => (key, Some(value.clone()), token, true),
            _ => continue,
        };
        nodes.push(e.node);
        let client = h.name(e.node).to_string();
        accesses.push(Access { client, at_ns: e.t, token: *token, key: key.clone(), value, put });
    }
    (work.check)(&accesses)
        .into_iter()
        .map(|broken| {
            // An index past the accesses is the user's slip; the end of the run stands in for it.
            let (clients, at) = match (nodes.get(broken.at), accesses.get(broken.at)) {
                (Some(node), Some(access)) => (vec![*node], access.at_ns),
                _ => (vec![], h.end),
            };
            Raw { kind: FindingKind::Invariant, clients, from: at, to: at, detail: broken.why }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_history::history;
    use super::*;
    use locksim_locks::work::{Broken, Section, SectionFuture};

    fn put(key: &str, value: &str, accepted: bool) -> EventKind {
        EventKind::Put { key: key.into(), value: value.into(), token: None, accepted }
    }

    /// No key is written twice.
    fn write_once(accesses: &[Access]) -> Vec<Broken> {
        let mut seen = std::collections::BTreeSet::new();
        let mut broken = Vec::new();
        for (at, a) in accesses.iter().enumerate().filter(|(_, a)| a.put) {
            if !seen.insert(a.key.clone()) {
                broken.push(Broken { at, why: format!("{} written twice", a.key) });
            }
        }
        broken
    }

    fn nothing(_: Section) -> SectionFuture {
        Box::pin(async {})
    }

    const WRITE_ONCE: WorkSpec = WorkSpec { id: "write-once", summary: "", critical: nothing, check: write_once };

    #[test]
    fn a_broken_invariant_is_found_at_the_access_that_broke_it() {
        let h = history(
            10.0,
            vec![
                (1.0, 0, put("slot/0", "a", true)),
                (2.0, 1, EventKind::Get { key: "slot/0".into(), value: Some("a".into()), token: None, accepted: true }),
                (3.0, 1, put("slot/0", "b", true)),
            ],
        );
        let found = check(&h, Some(&WRITE_ONCE));
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].kind, &found[0].clients, found[0].from),
            (FindingKind::Invariant, &vec![NodeIx(1)], 3_000_000_000)
        );
        assert_eq!(found[0].detail, "slot/0 written twice");
    }

    #[test]
    fn refused_accesses_never_reach_the_invariant() {
        let h = history(10.0, vec![(1.0, 0, put("slot/0", "a", true)), (3.0, 1, put("slot/0", "b", false))]);
        assert!(check(&h, Some(&WRITE_ONCE)).is_empty());
        assert!(check(&h, None).is_empty(), "no user workload, nothing to check");
    }
}
