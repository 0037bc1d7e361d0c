//! A lock written outside locksim, through the public `Lock` trait, is run and judged like a built-in one.

#[allow(dead_code)]
#[path = "../examples/custom_lock.rs"]
mod custom_lock;

use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::sweep::sweep;
use locksim_scenarios::Scenario;

#[test]
fn a_users_own_lock_is_loaded_by_id_run_and_caught() {
    let scenario = Scenario::parse("my-lock.toml", custom_lock::SCENARIO, &custom_lock::registry()).unwrap();
    assert_eq!(scenario.recipe.id, "my.get-then-del");
    let result = sweep(&scenario, 0..40, 2, &|| {}).unwrap();
    assert!(!result.as_expected, "the scenario hopes for safe; pauses past the TTL make it unsafe");
    let seen = |k| result.results.iter().any(|r| r.counts.contains_key(&k));
    assert!(seen(FindingKind::DoubleHolder));
    assert!(result.results.iter().any(|r| r.measurements.acquisitions > 10), "the lock does work between faults");
}

#[test]
fn without_registering_it_the_id_is_unknown() {
    let err =
        Scenario::parse("my-lock.toml", custom_lock::SCENARIO, &locksim_locks::Registry::builtin()).err().unwrap();
    assert!(err.to_string().contains("unknown recipe id \"my.get-then-del\""), "{err}");
}
