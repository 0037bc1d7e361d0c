//! Rates with their intervals in `run`, `suite` and the JSON results.

mod common;

use common::{locksim, stderr, stdout};
use locksim_reports::results::ResultsFile;

/// Unsafe in every seed by construction (the pause is aimed at a grant, so it always finds a holder):
/// the rates below do not hang on how any one seed's schedule falls.
const ALWAYS_UNSAFE: &str = "redis-cad-pause-on-grant";

#[test]
fn run_and_suite_give_the_unsafe_rate_with_its_interval() {
    let o = locksim(&["run", &format!("scenarios/catalog/{ALWAYS_UNSAFE}.toml"), "--seeds", "0..20"]);
    assert!(stdout(&o).contains("20 seeds, 20 unsafe (rate > 86.1%) — double-holder in 20"), "{}", stdout(&o));
    let dir = tempfile::Builder::new().prefix("locksim-rates-test-").tempdir().unwrap();
    let suite = dir.path().join("suite.toml");
    let catalog = common::root().join("scenarios/catalog");
    std::fs::write(
        &suite,
        format!(
            "name = \"rates\"\n[[run]]\nscenario = \"{}\"\nseeds = \"0..20\"\n[[run]]\nscenario = \"{}\"\nseeds = \"0..20\"\n",
            catalog.join(format!("{ALWAYS_UNSAFE}.toml")).display(),
            catalog.join("redis-watchdog-partition.toml").display()
        ),
    )
    .unwrap();
    let o = locksim(&["suite", suite.to_str().unwrap(), "--no-shrink"]);
    let text = stdout(&o);
    assert!(text.contains("seeds 0..20: 20 unsafe (rate > 86.1%) — double-holder in 20"), "{text}");
    assert!(text.contains("seeds 0..20: 0 unsafe (rate < 13.9%)"), "{text}");
}

#[test]
fn json_results_carry_rates_recomputed_on_read_and_after_merging_shards() {
    let dir = tempfile::Builder::new().prefix("locksim-rates-test-").tempdir().unwrap();
    let part = |i: u64| {
        let path = dir.path().join(format!("part-{i}.json"));
        let shard = format!("{i}/2");
        let o = locksim(&[
            "run",
            &format!("scenarios/catalog/{ALWAYS_UNSAFE}.toml"),
            "--seeds",
            "0..10",
            "--shard",
            &shard,
            "--json",
            path.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        path
    };
    let (one, two) = (part(1), part(2));
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&one).unwrap()).unwrap();
    let rate = &written["runs"][0]["unsafe_rate"];
    assert_eq!((rate["k"].as_u64(), rate["n"].as_u64()), (Some(5), Some(5)), "{rate}");
    assert_eq!(written["runs"][0]["rate_with"]["double-holder"]["n"].as_u64(), Some(5));
    // A file from before rates: they come back from the counts.
    let mut old = written.clone();
    let run = old["runs"][0].as_object_mut().unwrap();
    run.remove("unsafe_rate");
    run.remove("rate_with");
    std::fs::write(&one, old.to_string()).unwrap();
    let read = ResultsFile::read(&one).unwrap();
    assert_eq!(read.runs[0].unsafe_rate, locksim_scenarios::rate::Rate::of(5, 5));
    // Merged shards are rated over all their seeds, not by adding up the parts' rates.
    let merged = ResultsFile::merge(vec![read, ResultsFile::read(&two).unwrap()]).unwrap();
    assert_eq!(merged.runs[0].unsafe_rate, locksim_scenarios::rate::Rate::of(10, 10));
    assert_eq!(merged.runs[0].rate_with[&locksim_scenarios::checkers::FindingKind::DoubleHolder].n, 10);
}
