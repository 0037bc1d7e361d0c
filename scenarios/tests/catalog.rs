//! Every shipped scenario runs at the seeds the full suite pins, with its expected verdict asserted.

mod common;

use common::{assert_as_expected, catalog_dir};
use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::suite::Suite;
use std::path::Path;

/// The full suite: every catalog scenario over the seeds its verdict is shown on (and more runs).
fn full_suite() -> Suite {
    let path = catalog_dir().join("../suites/full.toml");
    Suite::load(&path, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_catalog_scenario_is_in_the_full_suite() {
    let mut files: Vec<String> = std::fs::read_dir(catalog_dir())
        .unwrap()
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut in_suite: Vec<String> = full_suite()
        .runs
        .iter()
        .map(|r| Path::new(&r.scenario.path).file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    in_suite.sort();
    in_suite.dedup();
    assert_eq!(
        files, in_suite,
        "add new catalog files to scenarios/suites/full.toml with the seeds their verdict holds on"
    );
}

#[test]
fn every_run_of_the_full_suite_meets_its_expectation() {
    for run in full_suite().runs {
        let result = common::run(&run.scenario, run.seeds.clone());
        assert!(
            result.as_expected,
            "{}: {:?} (example seed {:?})",
            run.scenario.name, result.reasons, result.example_seed
        );
    }
}

#[test]
fn del_under_a_long_pause_is_caught_as_two_holders_and_a_stale_write() {
    let r = assert_as_expected("redis-del-gc-pause", 0..50);
    assert!(r.unsafe_seeds > 25, "most seeds pause a holder past its TTL; got {}", r.unsafe_seeds);
}

#[test]
fn fencing_turns_the_stale_write_into_a_refusal() {
    let r = assert_as_expected("redis-cad-fencing-gc-pause", 0..50);
    let seen = |k| r.results.iter().any(|s| s.counts.contains_key(&k));
    assert!(seen(FindingKind::DoubleHolder), "fencing does not stop two clients believing they hold the lock");
    assert!(seen(FindingKind::StaleWriteRejected));
    assert!(!seen(FindingKind::UnsafeWrite));
}

#[test]
fn a_ttl_frees_the_lock_of_a_crashed_holder_after_about_the_ttl() {
    let r = assert_as_expected("redis-set-nx-px-crash", 0..50);
    let recoveries: Vec<f64> = r.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
    assert!(recoveries.len() > 25, "most seeds crash a holder");
    // TTL 5 s, counted from the holder's SET; the next poll comes within `retry` (100 ms) after expiry.
    for ms in recoveries {
        assert!((3_000.0..5_500.0).contains(&ms), "recovery of {ms} ms is not about the 5 s TTL");
    }
}

#[test]
fn redlock_without_faults_is_safe_over_1000_seeds() {
    assert_as_expected("redis-redlock-no-faults", 0..1000);
}

#[test]
fn compare_and_delete_with_fencing_never_lets_a_stale_write_through_over_1000_seeds() {
    let r = assert_as_expected("redis-cad-fencing-partitions", 0..1000);
    assert!(r.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)));
}
