//! A sweep hands its seeds on in seed order and keeps none of them: what `run --json` streams is what
//! a kept sweep holds, and however slowly the results are taken, the jobs never run far ahead.

mod common;

use common::catalog;
use locksim_scenarios::run::HarnessError;
use locksim_scenarios::sweep::{sweep, sweep_each, AHEAD_PER_JOB};
use std::sync::atomic::{AtomicU64, Ordering};

#[test]
fn streamed_seeds_come_in_seed_order_and_judge_as_a_kept_sweep() {
    let scenario = catalog("redis-nemesis-del");
    let kept = sweep(&scenario, 5..45, 1, &|| {}).unwrap();
    let mut streamed = Vec::new();
    let judged = sweep_each(&scenario, 5..45, 3, &|| {}, |r| {
        streamed.push(r);
        Ok::<(), HarnessError>(())
    })
    .unwrap();
    assert!(judged.results.is_empty(), "a streaming sweep keeps no seed");
    let seeds: Vec<u64> = streamed.iter().map(|r| r.seed).collect();
    assert_eq!(seeds, (5..45).collect::<Vec<_>>());
    assert_eq!(serde_json::to_string(&streamed).unwrap(), serde_json::to_string(&kept.results).unwrap());
    let without_seeds = locksim_scenarios::sweep::ScenarioResult { results: Vec::new(), ..kept };
    assert_eq!(serde_json::to_string(&judged).unwrap(), serde_json::to_string(&without_seeds).unwrap());
    assert!(judged.unsafe_seeds > 0 && !judged.seeds_with.is_empty(), "the scenario shows something to judge");
}

#[test]
fn jobs_never_run_far_ahead_of_a_slow_reader() {
    // The reader re-runs every seed it is handed, so it is slower than the four jobs together: without
    // the window, finished results would pile up waiting to be handed on.
    let scenario = catalog("redis-del-gc-pause");
    let jobs = 4;
    let (finished, handed, worst) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let progress = || {
        let waiting = finished.fetch_add(1, Ordering::SeqCst) + 1 - handed.load(Ordering::SeqCst);
        worst.fetch_max(waiting, Ordering::SeqCst);
    };
    sweep_each(&scenario, 0..(AHEAD_PER_JOB * jobs * 3), jobs as usize, &progress, |r| {
        locksim_scenarios::run::run_seed(&scenario, r.seed)?;
        handed.fetch_add(1, Ordering::SeqCst);
        Ok::<(), HarnessError>(())
    })
    .unwrap();
    let worst = worst.into_inner();
    assert!(worst <= AHEAD_PER_JOB * jobs + 1, "{worst} results were waiting");
}
