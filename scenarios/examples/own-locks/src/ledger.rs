//! `ledger`: our own state under the lock, checked by our own invariant.
//!
//! The ledger is one key in locksim's store, a list of entries. A holder reads it, takes its time (the
//! workload's hold: validating the payment, say), and writes it back with its entry appended — a
//! read-modify-write, so two holders at once lose an entry. The invariant: every write extends the
//! ledger as it stood by exactly one entry; an append that drops entries written since its read is
//! caught, with the entries it lost.

use locksim_locks::work::{Access, Broken, Section, SectionFuture, WorkSpec};

pub const WORK: WorkSpec = WorkSpec {
    id: "ledger",
    summary: "append an entry to a ledger kept in one key: read it, hold, write it back longer",
    critical: append,
    check: append_only,
};

const KEY: &str = "ledger";

fn append(s: Section) -> SectionFuture {
    Box::pin(async move {
        // A refused or unanswered read ends the section: there is nothing to append to.
        let Ok(ledger) = s.store.get(KEY).await else { return };
        if s.shared {
            return;
        }
        s.ctx.sleep(s.hold).await;
        let entry = format!("{}@{}", s.client, s.ctx.now_ms());
        let longer = match ledger {
            Some(ledger) => format!("{ledger},{entry}"),
            None => entry,
        };
        // Refused by fencing, or unanswered: either way this holder is done.
        let _ = s.store.put(KEY, longer).await;
    })
}

/// Each accepted write of the ledger must be the one before it plus one entry.
fn append_only(accesses: &[Access]) -> Vec<Broken> {
    let mut broken = Vec::new();
    let mut before: Vec<&str> = Vec::new();
    for (at, access) in accesses.iter().enumerate().filter(|(_, a)| a.put && a.key == KEY) {
        let now: Vec<&str> = access.value.as_deref().unwrap_or_default().split(',').collect();
        let kept = now.len() == before.len() + 1 && now.starts_with(&before);
        if !kept {
            let lost: Vec<&str> = before.iter().copied().filter(|e| !now.contains(e)).collect();
            let entries = if lost.len() == 1 { "entry" } else { "entries" };
            let why = format!(
                "{}'s append lost {} {entries} written since it read: {}",
                access.client,
                lost.len(),
                lost.join(", ")
            );
            broken.push(Broken { at, why });
        }
        before = now;
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(client: &str, value: &str) -> Access {
        Access { client: client.into(), at_ns: 0, token: None, key: KEY.into(), value: Some(value.into()), put: true }
    }

    #[test]
    fn appends_in_turn_keep_the_ledger_and_a_stale_one_is_named() {
        let kept = [put("a", "a@1"), put("b", "a@1,b@2"), put("a", "a@1,b@2,a@3")];
        assert!(append_only(&kept).is_empty());
        let lost = [put("a", "a@1"), put("b", "a@1,b@2"), put("c", "a@1,c@3")];
        let broken = append_only(&lost);
        assert_eq!(broken, vec![Broken { at: 2, why: "c's append lost 1 entry written since it read: b@2".into() }]);
    }
}
