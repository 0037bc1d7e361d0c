//! The locks of `examples/own-locks` — a crate outside the workspace, written with only the public API —
//! are judged like built-in ones: the ZooKeeper one is caught, the SQL and etcd ones stay clean, and
//! their sessions' events reach the history.

#[path = "../examples/own-locks/src/etcd_lock.rs"]
mod etcd_lock;
#[path = "../examples/own-locks/src/sql_lock.rs"]
mod sql_lock;
#[path = "../examples/own-locks/src/zk_lock.rs"]
mod zk_lock;

use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::sweep::{sweep, ScenarioResult};
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;

fn scenario(name: &str) -> Scenario {
    let registry = Registry::builtin().with(zk_lock::RECIPE).with(sql_lock::RECIPE).with(etcd_lock::RECIPE);
    let path = format!("{}/examples/own-locks/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    Scenario::load(std::path::Path::new(&path), &registry).unwrap_or_else(|e| panic!("{e}"))
}

fn swept(name: &str, seeds: std::ops::Range<u64>) -> ScenarioResult {
    sweep(&scenario(name), seeds, 2, &|| {}).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_polling_zookeeper_lock_gives_two_holders_when_its_holder_outlives_its_session() {
    let result = swept("zk-poll-gc-pause", 0..30);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert!(result.results.iter().any(|r| r.counts.contains_key(&FindingKind::DoubleHolder)));
    let run = run_seed(&scenario("zk-poll-gc-pause"), 0).unwrap();
    let states: Vec<&str> = run
        .history
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Session { state } => Some(state.as_str()),
            _ => None,
        })
        .collect();
    for state in ["connected", "expired by the server", "disconnected", "expired"] {
        assert!(states.contains(&state), "the user's session reports {state:?}: {states:?}");
    }
}

#[test]
fn the_job_row_lock_stays_safe_under_client_partitions_and_crashes() {
    let result = swept("sql-job-lock-nemesis", 0..200);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 0);
    assert!(result.results.iter().any(|r| r.counts.contains_key(&FindingKind::StaleWriteRejected)), "faults bite");
    let run = run_seed(&scenario("sql-job-lock-nemesis"), 0).unwrap();
    let ended = run
        .history
        .events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Session { state } if state.contains("database session ended")));
    assert!(ended, "a crashed client's database session ends in the history");
}

#[test]
fn the_lease_key_lock_stays_safe_when_holders_crash() {
    let result = swept("etcd-lease-key-crash", 0..200);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 0);
    assert!(result.results.iter().all(|r| r.measurements.acquisitions > 20), "the lock does work between crashes");
}
