//! The Redis family's renewal under short partitions (Redisson's executor outlasts them), and what a
//! failover loses.

mod common;

use common::{assert_as_expected, catalog_dir, run};
use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::Scenario;

/// `redis-watchdog-partition` with extra recipe parameters.
fn watchdog_partition(params: &str) -> Scenario {
    let path = catalog_dir().join("redis-watchdog-partition.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace("id = \"redis.watchdog\"", &format!("id = \"redis.watchdog\"\n{params}"));
    Scenario::parse("redis-watchdog-partition.toml", &text, &Registry::builtin()).unwrap()
}

#[test]
fn redissons_watchdog_survives_2s_partitions_in_both_versions_and_a_watchdog_that_stops_at_once_does_not() {
    for version in ["3.44", "3.43"] {
        let r = run(&watchdog_partition(&format!("renewal = \"{version}\"")), 0..200);
        assert!(r.as_expected, "Redisson {version}: {:?}", r.reasons);
    }
    // One 1 s attempt, no retries, stop on failure: the renewal dies in the first cut.
    let naive = run(&watchdog_partition("renewal = \"3.43\"\ncommand_timeout = \"1s\"\nretry_attempts = 0"), 0..200);
    assert!(!naive.as_expected, "a watchdog that gives up at once must lose its key under cuts");
}

#[test]
fn a_failover_loses_only_what_never_left_the_master() {
    // A healthy replica link: the stream leaves with the reply, so a failover at a grant keeps it (the
    // model used to ship 100 ms after a write, and lost grants here).
    assert_as_expected("redis-failover-healthy-link", 0..100);
    // A link cut before the failover: what the cut held dies with the master, fence counter included.
    let cut = assert_as_expected("redis-failover-replica-cut", 0..20);
    assert!(cut.results.iter().all(|s| s.counts.contains_key(&FindingKind::UnsafeWrite)), "tokens repeat");
    // A slow replica (`replication_lag`): a grant still in the master's buffer is lost.
    let slow = assert_as_expected("redis-failover-on-grant", 0..50);
    assert!(slow.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)));
}
