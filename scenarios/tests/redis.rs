//! The Redis family's renewal under short partitions (Redisson's executor outlasts them) and in a
//! master's refusal window, what a failover loses, and Sentinel.

mod common;

use common::{assert_as_expected, catalog_dir, run};
use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::Scenario;
use locksim_sim::hazard::Hazard;

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

/// `catalog/<stem>.toml`, edited, parsed.
fn edited(stem: &str, edit: impl Fn(String) -> String) -> Result<Scenario, String> {
    let text = edit(std::fs::read_to_string(catalog_dir().join(format!("{stem}.toml"))).unwrap());
    Scenario::parse(&format!("{stem}.toml"), &text, &Registry::builtin()).map_err(|e| e.to_string())
}

#[test]
fn sentinel_fails_over_a_master_cut_off_alone_without_a_double_holder_over_300_seeds() {
    let r = assert_as_expected("redis-sentinel-isolated-master", 0..300);
    assert!(r.results.iter().all(|s| s.counts.is_empty()), "no finding of any kind, liveness included");
    assert!(!r.hazard_counts.contains_key(&Hazard::DeposedMasterWrite), "no client is left with the old master");
}

#[test]
fn sentinel_split_brain_grants_on_both_sides_and_only_a_short_min_replicas_lag_closes_it() {
    let split = assert_as_expected("redis-sentinel-split-brain", 0..40);
    assert!(split.results.iter().all(|s| s.counts.contains_key(&FindingKind::DoubleHolder)));
    assert_eq!(
        split.seeds_with_hazard.get(&Hazard::DeposedMasterWrite),
        Some(&40),
        "client-0 writes to the old master"
    );
    let ten = assert_as_expected("redis-sentinel-split-brain-min-replicas", 0..40);
    let both = ten.results.iter().filter(|s| s.counts.contains_key(&FindingKind::DoubleHolder)).count();
    assert!((20..40).contains(&both), "min-replicas-max-lag 10 narrows the window: two holders in {both} of 40");
    let closed = assert_as_expected("redis-sentinel-split-brain-min-replicas-1s", 0..300);
    assert!(!closed.hazard_counts.contains_key(&Hazard::DeposedMasterWrite), "refused before the switch");
    // One replica: the promoted server has no good replica either.
    let one = assert_as_expected("redis-sentinel-min-replicas-one-replica", 0..40);
    assert!(one.results.iter().all(|s| !s.counts.contains_key(&FindingKind::DoubleHolder)));
    assert!(one.results.iter().all(|s| s.counts.contains_key(&FindingKind::Deadlock)), "the new master refuses too");
}

/// A promoted replica expires lock keys by its own clock: 8 s ahead, it frees a held lock early; in step,
/// it never does.
#[test]
fn a_promoted_replica_with_a_clock_ahead_frees_a_held_lock_early() {
    let ahead = assert_as_expected("redis-sentinel-replica-clock-ahead", 0..100);
    assert!(ahead.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)));
    assert_as_expected("redis-sentinel-replica-clock-in-step", 0..300);
}

/// A master whose replicas are cut off refuses the watchdog's renewal (NOREPLICAS): Redisson up to 3.43
/// stops renewing and the key expires under its holder, with no failover; 3.44 renews in the next round.
/// A window longer than a renewal period fails two rounds in a row, and 3.44 loses the key too.
#[test]
fn a_renewal_refused_by_a_master_short_of_replicas_stops_redisson_3_43_and_not_3_44() {
    let stops = assert_as_expected("redis-sentinel-watchdog-refusal", 0..40);
    assert!(stops.results.iter().all(|s| s.counts.contains_key(&FindingKind::DoubleHolder)));
    assert!(!stops.hazard_counts.contains_key(&Hazard::DeposedMasterWrite), "nobody failed over");
    assert_as_expected("redis-sentinel-watchdog-refusal-3.44", 0..300);
    let longer =
        edited("redis-sentinel-watchdog-refusal-3.44", |t| t.replace("duration = \"12s\"", "duration = \"13s\""));
    let longer = run(&longer.unwrap(), 0..40);
    assert!(longer.results.iter().all(|s| s.counts.contains_key(&FindingKind::DoubleHolder)), "two renewals refused");
}

/// The split brain needs the promotion: the same cut without Sentinels (and without their cut) leaves
/// one master, and the clients cut off from it just wait.
#[test]
fn without_sentinels_the_same_cut_promotes_nobody_and_grants_on_one_side() {
    let scenario = edited("redis-sentinel-split-brain", |text| {
        let sentinel_cut = "[[faults.schedule]]\nat = \"10s\"\nkind = \"partition\"\ntarget = \"sentinel-0\"\npeers = \
                            [\"redis-0-replica\", \"redis-0-replica-2\", \"sentinel-1\", \"sentinel-2\", \"client-1\", \"client-2\"]\nduration = \"30s\"\n";
        assert!(text.contains(sentinel_cut));
        text.replace(sentinel_cut, "")
            .replace("sentinels = 3", "sentinels = 0")
            .replace("replicas = 2", "replicas = 1")
            .replace("\"redis-0-replica-2\", \"sentinel-1\", \"sentinel-2\", ", "")
    })
    .unwrap();
    let r = run(&scenario, 0..40);
    assert!(r.results.iter().all(|s| !s.counts.contains_key(&FindingKind::DoubleHolder)));
}

/// Why `edited` refuses the edit.
fn refused(stem: &str, edit: impl Fn(String) -> String) -> String {
    match edited(stem, edit) {
        Ok(_) => panic!("{stem}: the edit was accepted"),
        Err(e) => e,
    }
}

#[test]
fn sentinel_settings_that_cannot_run_are_refused_with_the_reason() {
    let stem = "redis-sentinel-isolated-master";
    let e = refused(stem, |t| t.replace("replicas = 1\n", ""));
    assert!(e.contains("needs a replica to promote"), "{e}");
    let e = refused(stem, |t| t + "\n[[faults.schedule]]\nat = \"5s\"\nkind = \"failover\"\ntarget = \"redis-0\"\n");
    assert!(e.contains("Sentinels fail a master over themselves"), "{e}");
    let e = refused(stem, |t| t.replace("[backend]\n", "[backend]\nmin_replicas_max_lag = \"1500ms\"\n"));
    assert!(e.contains("whole seconds"), "{e}");
    let no_replica = |t: String| {
        t.replace("sentinels = 3", "sentinels = 0").replace("replicas = 1", "replicas = 0\nmin_replicas_to_write = 1")
    };
    let e = refused(stem, no_replica);
    assert!(e.contains("would refuse every write"), "{e}");
    let redlock = |t: String| {
        t.replace("id = \"redis.set-nx-px\"", "id = \"redis.redlock\"")
            .replace("[backend]\n", "[backend]\nmasters = 3\n")
    };
    assert!(refused(stem, redlock).contains("not modelled yet"));
    let two_alone = |t: String| t.replace("sentinels = 3", "sentinels = 0").replace("replicas = 1", "replicas = 2");
    assert!(refused(stem, two_alone).contains("modelled under Sentinel"));
}
