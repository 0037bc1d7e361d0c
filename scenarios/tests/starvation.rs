//! `starvation` both ways: a client that re-takes a polling lock the moment it lets go starves the one
//! that polls; ordinary contention on the same lock, and the FIFO locks under their nemesis, starve
//! nobody.

mod common;

use common::{catalog, run};
use locksim_locks::Registry;
use locksim_scenarios::checkers::starvation::Bounds;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;
use std::time::Duration;

/// Two clients on `redis.set-nx-px`, with these lines added to `[recipe]` and `[workload]`.
fn polling(recipe: &str, workload: &str, expect: &str) -> Scenario {
    let text = format!(
        "name = \"polling\"\n[recipe]\nid = \"redis.set-nx-px\"\n{recipe}\n[workload]\nkind = \"counter\"\nclients = \
         2\nduration = \"60s\"\n{workload}\n[expect]\n{expect}\n"
    );
    Scenario::parse("polling.toml", &text, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

/// The holder asks again as soon as it has released (`think` 0), while the other polls once a second:
/// the key is free only between the holder's `DEL` and its next `SET`, a few milliseconds per hold.
fn tight_loop() -> Scenario {
    polling("retry = \"1s\"", "think = \"0ms\"", "verdict = \"unsafe\"\nfindings = [\"starvation\"]")
}

#[test]
fn a_client_that_retakes_a_polling_lock_at_once_starves_the_one_that_polls() {
    let r = run(&tight_loop(), 0..20);
    assert!(r.as_expected, "{:?}", r.reasons);
    assert_eq!(r.seeds_with.get(&FindingKind::Starvation), Some(&20), "every seed starves someone");
    let seed = run_seed(&tight_loop(), 0).unwrap();
    let found: Vec<_> = seed.result.findings.iter().filter(|f| f.kind == FindingKind::Starvation).collect();
    assert!(!found.is_empty());
    let h = &seed.history;
    for f in found {
        let (starved, winner) = (&f.clients[0], &f.clients[1]);
        assert_ne!(starved, winner);
        let grants_to = |name: &str| -> Vec<u64> {
            let granted = |e: &&locksim_sim::history::Event| matches!(e.kind, EventKind::AcquireOk { .. });
            let inside = |e: &&locksim_sim::history::Event| (f.from_ns..=f.to_ns).contains(&e.t);
            h.events.iter().filter(|e| h.name(e.node) == name).filter(granted).filter(inside).map(|e| e.t).collect()
        };
        let won = grants_to(winner).len();
        assert!(won > 20, "{winner} re-took the lock {won} times: {}", f.detail);
        assert!(grants_to(starved).iter().all(|t| *t == f.to_ns), "{starved} was granted only at the end, if at all");
        assert!(f.detail.starts_with(&format!("passed over by {won} grants in ")), "{}", f.detail);
    }
}

#[test]
fn ordinary_contention_on_the_same_polling_lock_is_not_starvation() {
    // Polling every 100 ms, thinking 0–200 ms between holds: a waiter loses a few rounds, not dozens.
    let r = run(&polling("", "", "verdict = \"safe\"\nabsent = [\"starvation\"]"), 0..300);
    assert!(r.as_expected, "{:?} (example seed {:?})", r.reasons, r.example_seed);
    let mut three = polling("", "", "verdict = \"safe\"\nabsent = [\"starvation\"]");
    three.workload.clients = 3;
    let r = run(&three, 0..300);
    assert!(r.as_expected, "{:?} (example seed {:?})", r.reasons, r.example_seed);
}

#[test]
fn fifo_locks_starve_nobody_over_1000_seeds_of_client_partitions_and_crashes() {
    for stem in ["zk-sequential-nemesis", "etcd-mutex-nemesis", "sql-for-update-nemesis"] {
        let s = catalog(stem);
        assert_eq!(s.check.starvation, Some(Bounds::default()), "{stem}: checked by default");
        let r = run(&s, 0..1000);
        assert!(r.as_expected, "{stem}: {:?} (example seed {:?})", r.reasons, r.example_seed);
        assert_eq!(r.seeds_with.get(&FindingKind::Starvation), None, "{stem} (example seed {:?})", r.example_seed);
    }
}

/// `[check]` with `lines`, parsed: the bounds, or the error.
fn check(lines: &str) -> Result<Option<Bounds>, String> {
    let text = format!(
        "name = \"t\"\n[recipe]\nid = \"redis.set-nx-px\"\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \
         \"60s\"\n[check]\n{lines}\n"
    );
    Scenario::parse("t.toml", &text, &Registry::builtin()).map(|s| s.check.starvation).map_err(|e| e.to_string())
}

#[test]
fn starvation_is_checked_by_default_tuned_or_turned_off_in_check() {
    assert_eq!(check(""), Ok(Some(Bounds { grants: 20, wait: Duration::from_secs(300) })));
    let tuned = check("starvation_grants = 5\nstarvation_wait = \"90s\"");
    assert_eq!(tuned, Ok(Some(Bounds { grants: 5, wait: Duration::from_secs(90) })));
    assert_eq!(check("starvation = false"), Ok(None));
    assert_eq!(check("starvation = true\nstarvation_grants = 0"), Ok(Some(Bounds { grants: 0, ..Bounds::default() })));
}

#[test]
fn bad_starvation_keys_are_refused_with_file_line_and_what_was_expected() {
    let cases = [
        (
            "starvation_grants = -1",
            "t.toml:9:21: starvation_grants: expected a whole number of grants to one other client, 0 or more",
        ),
        ("starvation_wait = \"0s\"", "t.toml:9:19: starvation_wait: expected a duration above zero"),
        ("starvation_wait = \"soon\"", "t.toml:9:19: starvation_wait: expected a duration such as"),
        ("starvation = \"off\"", "t.toml:9:14: starvation: invalid type: string \"off\", expected a boolean"),
        (
            "starvation = false\nstarvation_wait = \"1m\"",
            "t.toml:10:19: starvation_wait: starvation is not checked (starvation = false); leave it out",
        ),
    ];
    for (lines, expected) in cases {
        let err = check(lines).unwrap_err();
        assert!(err.starts_with(expected), "{lines:?}: {err}");
    }
}

#[test]
fn starvation_is_a_finding_kind_of_expect() {
    let s = polling("", "", "verdict = \"unsafe\"\nfindings = [\"starvation\"]\nabsent = [\"deadlock\"]");
    assert_eq!(s.expect.findings, vec![FindingKind::Starvation]);
    assert!(FindingKind::Starvation.is_violation());
    assert_eq!(FindingKind::parse("starvation"), Some(FindingKind::Starvation));
    let text =
        "name = \"t\"\n[recipe]\nid = \"redis.set-nx-px\"\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \
                \"60s\"\n[expect]\nverdict = \"safe\"\nfindings = [\"starvation\"]\n";
    let err = Scenario::parse("t.toml", text, &Registry::builtin()).err().unwrap().to_string();
    assert!(err.contains("a \"safe\" verdict cannot expect a violation"), "{err}");
}
