//! Same scenario and seed ⇒ the same history, byte for byte, whatever else runs.

mod common;

use common::{catalog, catalog_dir, run};
use locksim_locks::Registry;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::Scenario;

#[test]
fn every_catalog_scenario_replays_to_the_same_history() {
    for entry in std::fs::read_dir(catalog_dir()).unwrap() {
        let path = entry.unwrap().path();
        let scenario = Scenario::load(&path, &Registry::builtin()).unwrap();
        for seed in [0, 7] {
            let a = run_seed(&scenario, seed).unwrap();
            let b = run_seed(&scenario, seed).unwrap();
            assert_eq!(a.history.to_jsonl(), b.history.to_jsonl(), "{} seed {seed}", path.display());
            assert!(!a.history.events.is_empty());
        }
    }
}

#[test]
fn results_do_not_depend_on_the_number_of_jobs() {
    // A nemesis of each family whose client draws its own timing from the seed (ZooKeeper's
    // re-attach, etcd's keep-alive loop, Redis's retries); a ZooKeeper ensemble's, whose clients
    // shuffle their server lists from it; and an etcd cluster's, whose members draw their election
    // timeouts from it.
    for stem in [
        "redis-nemesis-del",
        "zk-leader-election-nemesis",
        "etcd-mutex-server-crash-nemesis",
        "zk-ensemble-nemesis",
        "etcd-cluster-nemesis",
    ] {
        assert_same_at_any_jobs(&catalog(stem), 0..40);
    }
}

/// `scenario` over `seeds` on one thread and on three: the same results, history hashes included.
fn assert_same_at_any_jobs(scenario: &Scenario, seeds: std::ops::Range<u64>) {
    let one = locksim_scenarios::sweep::sweep(scenario, seeds.clone(), 1, &|| {}).unwrap();
    let three = locksim_scenarios::sweep::sweep(scenario, seeds, 3, &|| {}).unwrap();
    assert_eq!(serde_json::to_string(&one).unwrap(), serde_json::to_string(&three).unwrap(), "{}", scenario.name);
}

#[test]
fn every_real_scenarios_model_gives_the_same_results_at_any_jobs() {
    // Their `[model]`s are what `locksim run` simulates without `--real`: kazoo's client among them.
    let real = catalog_dir().parent().unwrap().join("real");
    let mut played = 0;
    for entry in std::fs::read_dir(real).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        let suite = name == "suite.toml" || name.starts_with("smoke");
        if path.extension().is_some_and(|e| e == "toml") && !suite {
            assert_same_at_any_jobs(&Scenario::load(&path, &Registry::builtin()).unwrap(), 0..6);
            played += 1;
        }
    }
    assert!(played >= 30, "{played}");
}

#[test]
fn workers_replay_to_the_same_history_at_any_number_of_jobs() {
    let mut scenario = catalog("redis-nemesis-del");
    scenario.workload.workers = 3;
    let one = locksim_scenarios::sweep::sweep(&scenario, 0..20, 1, &|| {}).unwrap();
    let three = locksim_scenarios::sweep::sweep(&scenario, 0..20, 3, &|| {}).unwrap();
    assert_eq!(serde_json::to_string(&one).unwrap(), serde_json::to_string(&three).unwrap());
    let (a, b) = (run_seed(&scenario, 5).unwrap(), run_seed(&scenario, 5).unwrap());
    assert_eq!(a.history.to_jsonl(), b.history.to_jsonl());
    assert!(a.history.to_jsonl().contains("\"node\":\"client-2/w2\""), "the third worker of client-2 recorded");
}

#[test]
fn different_seeds_give_different_histories() {
    let r = run(&catalog("redis-nemesis-del"), 0..10);
    let mut hashes: Vec<&str> = r.results.iter().map(|s| s.history_hash.as_str()).collect();
    hashes.sort_unstable();
    hashes.dedup();
    assert_eq!(hashes.len(), 10);
}

#[test]
fn a_drawn_schedule_written_out_gives_the_same_run() {
    use locksim_scenarios::run::resolve_schedule;
    let drawn = catalog("redis-nemesis-del");
    let seed = 3;
    let mut written = drawn.clone();
    written.schedule = resolve_schedule(&drawn, seed);
    written.random = None;
    let a = run_seed(&drawn, seed).unwrap();
    let b = run_seed(&written, seed).unwrap();
    assert_eq!(a.history.hash(), b.history.hash(), "the nemesis draws from its own stream only");
}

#[test]
fn overlapping_simulated_runs_merge_but_real_runs_never_do() {
    let scenario = catalog("redis-del-gc-pause");
    let a = locksim_scenarios::sweep::sweep(&scenario, 0..6, 2, &|| {}).unwrap();
    let b = locksim_scenarios::sweep::sweep(&scenario, 3..9, 2, &|| {}).unwrap();
    let merged = locksim_scenarios::sweep::merge(vec![a.clone(), b.clone()]).unwrap();
    assert_eq!((merged.seeds, merged.results.len()), (0..9, 9), "a simulated seed's result is the same in every run");
    // Real runs of the same seeds are different runs: kept as they are alone, refused together.
    let real = |r: &locksim_scenarios::sweep::ScenarioResult| locksim_scenarios::sweep::ScenarioResult {
        real: true,
        ..r.clone()
    };
    let alone = locksim_scenarios::sweep::merge(vec![real(&a)]).unwrap();
    assert_eq!((alone.real, alone.results.len()), (true, 6));
    let refused = locksim_scenarios::sweep::merge(vec![real(&a), real(&b)]).unwrap_err();
    assert!(refused.contains("real runs are not merged"), "{refused}");
}
