//! Hazards: a scenario's faults reach the hazards they exist for, and only then; counts are the same
//! seed for seed at any number of jobs, and never touch the history.

mod common;

use common::{catalog, run};
use locksim_scenarios::run::run_seed;
use locksim_sim::hazard::Hazard;

#[test]
fn a_pause_past_the_ttl_reaches_lease_expired_while_held_and_no_pause_does_not() {
    let paused = catalog("redis-del-gc-pause");
    let r = run(&paused, 0..10);
    assert!(r.seeds_with_hazard.get(&Hazard::LeaseExpiredWhileHeld).is_some_and(|n| *n >= 8), "{r:?}");
    assert!(r.seeds_with_hazard.contains_key(&Hazard::StaleHolderResumed));

    let mut calm = paused.clone();
    calm.schedule.clear();
    let r = run(&calm, 0..10);
    assert!(!r.seeds_with_hazard.contains_key(&Hazard::LeaseExpiredWhileHeld), "{:?}", r.seeds_with_hazard);
    assert!(!r.seeds_with_hazard.contains_key(&Hazard::StaleHolderResumed), "{:?}", r.seeds_with_hazard);
}

#[test]
fn the_etcd_3_4_waiter_pause_reaches_grant_to_expired_session() {
    let r = run(&catalog("etcd-mutex-waiter-pause-3.4"), 0..3);
    assert_eq!(r.seeds_with_hazard.get(&Hazard::GrantToExpiredSession), Some(&3), "{:?}", r.seeds_with_hazard);
}

#[test]
fn a_crashed_holder_is_counted_and_a_crashed_waiter_is_not() {
    let r = run(&catalog("redis-set-nx-crash"), 0..10);
    assert!(r.seeds_with_hazard.get(&Hazard::HolderCrashed).is_some_and(|n| *n >= 8), "{:?}", r.seeds_with_hazard);
    let r = run(&catalog("zk-sequential-crash-waiter"), 0..10);
    assert!(!r.seeds_with_hazard.contains_key(&Hazard::HolderCrashed), "{:?}", r.seeds_with_hazard);
}

#[test]
fn a_shedlock_row_taken_over_under_a_paused_holder_is_its_lease_expiring() {
    // No server expires the row: the takeover past `lock_until` is the moment the holder lost it.
    let r = run(&catalog("sql-unique-insert-expiry-gc-pause"), 0..10);
    assert!(
        r.seeds_with_hazard.get(&Hazard::LeaseExpiredWhileHeld).is_some_and(|n| *n >= 8),
        "{:?}",
        r.seeds_with_hazard
    );
    assert!(r.seeds_with_hazard.contains_key(&Hazard::StaleHolderResumed), "{:?}", r.seeds_with_hazard);
    let mut calm = catalog("sql-unique-insert-expiry-gc-pause");
    calm.schedule.clear();
    let r = run(&calm, 0..10);
    assert!(!r.seeds_with_hazard.contains_key(&Hazard::LeaseExpiredWhileHeld), "{:?}", r.seeds_with_hazard);
}

#[test]
fn a_lost_release_reply_is_counted() {
    let r = run(&catalog("redis-set-nx-drop-reply"), 0..5);
    assert!(r.seeds_with_hazard.contains_key(&Hazard::ReleaseReplyLost), "{:?}", r.seeds_with_hazard);
}

#[test]
fn hazard_counts_are_the_same_seed_for_seed_at_any_jobs() {
    let scenario = catalog("zk-sequential-nemesis");
    let one = locksim_scenarios::sweep::sweep(&scenario, 0..12, 1, &|| {}).unwrap();
    let two = locksim_scenarios::sweep::sweep(&scenario, 0..12, 2, &|| {}).unwrap();
    let per_seed = |r: &locksim_scenarios::sweep::ScenarioResult| {
        r.results.iter().map(|s| (s.seed, s.hazards.clone())).collect::<Vec<_>>()
    };
    assert_eq!(per_seed(&one), per_seed(&two));
    assert_eq!(one.hazard_counts, two.hazard_counts);
    assert!(!one.hazard_counts.is_empty(), "the nemesis reaches some hazard in 12 seeds");
    let again = run_seed(&scenario, 3).unwrap().result;
    assert_eq!(again.hazards, one.results[3].hazards);
}

#[test]
fn a_required_hazard_no_seed_reached_fails_the_run_naming_it() {
    let mut calm = catalog("redis-del-gc-pause");
    calm.schedule.clear();
    calm.expect = locksim_scenarios::scenario::Expect {
        verdict: locksim_scenarios::scenario::Verdict::Safe,
        findings: vec![],
        absent: vec![],
        hazards: vec![Hazard::LeaseExpiredWhileHeld],
    };
    let r = run(&calm, 0..3);
    assert!(!r.as_expected);
    assert!(
        r.reasons
            .iter()
            .any(|m| m.to_string().contains("requires hazard lease-expired-while-held, but no seed reached it")),
        "{:?}",
        r.reasons
    );
}

#[test]
fn results_without_hazards_still_load() {
    let r = run(&catalog("redis-del-gc-pause"), 0..1);
    let mut json: serde_json::Value = serde_json::to_value(&r).unwrap();
    json.as_object_mut().unwrap().remove("seeds_with_hazard");
    json.as_object_mut().unwrap().remove("hazard_counts");
    for seed in json["results"].as_array_mut().unwrap() {
        seed.as_object_mut().unwrap().remove("hazards");
    }
    let old: locksim_scenarios::sweep::ScenarioResult = serde_json::from_value(json).unwrap();
    assert!(old.hazard_counts.is_empty() && old.results[0].hazards.is_empty());
}

/// etcd#20418 both ways: a leader paused as it confirms a read index answers stale reads when it
/// resumes up to 3.5.27, and never from 3.5.28; and no other etcd cluster fault — cuts, crashes,
/// pauses of members and clients, stalls — ever makes a read stale, in either release.
#[test]
fn a_paused_leader_answers_stale_reads_until_3_5_28_and_nothing_else_does() {
    let stale = |stem: &str, seeds| run(&catalog(stem), seeds).seeds_with_hazard.get(&Hazard::StaleRead).copied();
    assert!(stale("etcd-cluster-paused-leader-stale-reads", 0..60).is_some_and(|n| n >= 3));
    assert_eq!(stale("etcd-cluster-paused-leader-stale-reads-fixed", 0..60), None);
    for stem in ["etcd-cluster-nemesis", "etcd-cluster-stuck-leader-renews-fixed", "etcd-cluster-minority-waiter"] {
        assert_eq!(stale(stem, 0..40), None, "{stem}");
    }
}
