//! The ZooKeeper family's promises: herd counts, the GC-pause warning, and safety under client faults.

mod common;

use common::{assert_as_expected, catalog};
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use std::time::Duration;

/// The most clients one release woke, for `stem` with `clients` clients.
fn herd(stem: &str, clients: usize) -> u64 {
    let mut s = catalog(stem);
    s.workload.clients = clients;
    s.workload.duration = Duration::from_secs(20);
    s.check.herd_max = None;
    run_seed(&s, 1).unwrap().result.measurements.notifications_per_release_max
}

#[test]
fn one_release_wakes_every_waiter_of_the_ephemeral_lock_and_one_of_the_queue() {
    for clients in [2, 4, 8, 16, 32, 64] {
        let (flat, linear) = (herd("zk-sequential-herd", clients), herd("zk-ephemeral-herd", clients));
        assert_eq!(flat, 1, "zk.sequential with {clients} clients: each release wakes its successor only");
        // Everyone but the holder waits on /lock; a release wakes them all.
        assert_eq!(linear, clients as u64 - 1, "zk.ephemeral with {clients} clients");
    }
}

#[test]
fn a_pause_past_the_session_timeout_gives_two_holders_for_every_zk_recipe() {
    for stem in ["zk-sequential-gc-pause", "zk-ephemeral-gc-pause"] {
        let r = assert_as_expected(stem, 0..30);
        assert!(r.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)), "{stem}");
    }
    let fenced = assert_as_expected("zk-sequential-gc-pause-fencing", 0..30);
    assert!(fenced.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)));
}

#[test]
fn curators_mutex_is_safe_over_1000_seeds_of_client_partitions_and_crashes() {
    assert_as_expected("zk-sequential-nemesis", 0..1000);
}

#[test]
fn bad_zookeeper_parameters_are_errors_with_their_line() {
    let text = |extra: &str| {
        format!("name = \"t\"\n[recipe]\nid = \"zk.sequential\"\n{extra}\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \"5s\"\n")
    };
    let parse =
        |extra: &str| locksim_scenarios::Scenario::parse("z.toml", &text(extra), &locksim_locks::Registry::builtin());
    let err = parse("session_timout = \"6s\"").err().unwrap().to_string();
    assert!(err.starts_with("z.toml:4:1: unknown key `session_timout`"), "{err}");
    let err = parse("session_timeout = \"0s\"").err().unwrap().to_string();
    assert!(err.contains("session_timeout must be above zero"), "{err}");
    let err = parse("lost_on = \"sometimes\"").err().unwrap().to_string();
    assert!(err.starts_with("z.toml:4:11: lost_on: expected one of \"suspended\", \"lost\", \"never\""), "{err}");
}
