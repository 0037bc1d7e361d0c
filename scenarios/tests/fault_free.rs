//! Without faults nothing is lost: no call of any catalog scenario times out and no lock call ends
//! `Unknown`. A message lost with no fault to blame (a request sent before its server had started, say)
//! would skew every latency and throughput figure and could fake a `deadlock`.

mod common;

use common::catalog_dir;
use locksim_locks::Registry;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;

/// Scenarios whose own settings leave outcomes unknown without a fault: a socket read timeout shorter
/// than the wait for the lock; a replica slower than Redisson's `WAIT`.
const UNKNOWN_BY_DESIGN: &[&str] =
    &["sql-for-update-socket-timeout", "sql-for-update-db-crash-fencing", "redis-watchdog-slow-replica"];

#[test]
fn no_call_times_out_and_no_outcome_is_unknown_without_faults() {
    let mut checked = 0;
    for entry in std::fs::read_dir(catalog_dir()).unwrap() {
        let path = entry.unwrap().path();
        let mut scenario = Scenario::load(&path, &Registry::builtin()).unwrap();
        if UNKNOWN_BY_DESIGN.contains(&scenario.name.as_str()) {
            continue;
        }
        scenario.schedule.clear();
        scenario.random = None;
        for seed in 0..5 {
            let run = run_seed(&scenario, seed).unwrap();
            let m = &run.result.measurements;
            assert_eq!(m.call_timeouts, 0, "{} seed {seed}: calls timed out without a fault", path.display());
            let unknown = run
                .history
                .events
                .iter()
                .find(|e| matches!(e.kind, EventKind::AcquireUnknown { .. } | EventKind::ReleaseUnknown { .. }));
            assert!(unknown.is_none(), "{} seed {seed}: {unknown:?} without a fault", path.display());
            checked += 1;
        }
    }
    assert!(checked > 400, "the whole catalog: {checked} runs");
}
