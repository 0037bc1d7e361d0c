//! The CI side of the command line: suites, JUnit, sharding and merging, shrinking, reports.

mod common;

use common::{locksim, root, stderr, stdout};
use std::path::Path;

/// A fresh directory for one test's files, removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("locksim-suite-test-{name}-")).tempdir().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_smoke_suite_passes_with_junit_and_a_flipped_expectation_fails_it() {
    let dir = scratch("smoke");
    let junit = dir.path().join("junit.xml");
    let o = locksim(&["suite", "scenarios/suites/smoke.toml", "--junit", junit.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("as expected, 0 not"), "{}", stdout(&o));
    let xml = read(&junit);
    assert!(xml.contains("<testsuite name=\"smoke\"") && xml.contains("failures=\"0\""), "{xml}");

    // The same suite, its scenarios named by absolute path, with the first expectation flipped.
    let catalog = root().join("scenarios/catalog/");
    let text = read(&root().join("scenarios/suites/smoke.toml")).replace("../catalog/", catalog.to_str().unwrap());
    let flipped = text.replacen("seeds = \"0..50\"\n", "seeds = \"0..50\"\n[run.expect]\nverdict = \"safe\"\n", 1);
    assert_ne!(flipped, text);
    let suite = dir.path().join("flipped.toml");
    std::fs::write(&suite, flipped).unwrap();
    let shrunk = dir.path().join("shrunk");
    let o = locksim(&[
        "suite",
        suite.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
        "--shrink-dir",
        shrunk.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("FAIL redis-del-gc-pause"), "{out}");
    assert!(out.contains("expected safe, but some seeds found double-holder"), "{out}");
    assert!(out.contains("shrunk: redis-del-gc-pause seed"), "a failure names its shrunk repro: {out}");
    let xml = read(&junit);
    assert!(xml.contains("failures=\"1\"") && xml.contains("<failure message=\"expected safe"), "{xml}");
}

#[test]
fn a_bad_suite_file_is_one_precise_error_and_exit_2() {
    let dir = scratch("bad");
    let suite = dir.path().join("bad.toml");
    std::fs::write(&suite, "name = \"x\"\n[[run]]\nscenario = \"../catalog/nope.toml\"\nseeds = \"0..5\"\n").unwrap();
    let o = locksim(&["suite", suite.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("bad.toml:3:12: scenario: cannot read"), "{err}");
    std::fs::write(&suite, "[[run]]\nscenario = \"x.toml\"\nseeds = \"5..1\"\n").unwrap();
    let err = String::from_utf8_lossy(&locksim(&["suite", suite.to_str().unwrap()]).stderr).into_owned();
    assert!(err.contains("bad.toml:3:9: seeds: the seed range \"5..1\" is empty"), "{err}");
    std::fs::write(
        &suite,
        "[[run]]\nscenario = \"x.toml\"\nseeds = \"0..5\"\nhazards = \"lease-expired-while-held\"\n",
    )
    .unwrap();
    let o = locksim(&["suite", suite.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let wanted = "bad.toml:4:11: hazards: expected a list of hazard names, like [\"lease-expired-while-held\"], \
                  found string \"lease-expired-while-held\"";
    assert!(err.contains(wanted), "{err}");
}

/// The numbers a report shows for each run, as text.
fn numbers(results: &Path) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(&read(results)).unwrap();
    json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!("{} {} {} {} {}", r["scenario"], r["seeds"], r["unsafe_seeds"], r["as_expected"], r["summary"])
        })
        .collect()
}

#[test]
fn two_shards_merged_by_report_give_the_numbers_of_one_unsharded_run() {
    let dir = scratch("shards");
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let scenario = "scenarios/catalog/redis-nemesis-del.toml";
    for (shard, file) in [("1/2", "a.json"), ("2/2", "b.json")] {
        let o = locksim(&["run", scenario, "--seeds", "0..41", "--shard", shard, "--json", &path(file)]);
        assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    }
    assert_eq!(locksim(&["run", scenario, "--seeds", "0..41", "--json", &path("all.json")]).status.code(), Some(0));
    let o = locksim(&["report", &path("a.json"), &path("b.json"), "--out", &path("merged")]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // The report's inputs merged, written back as results, equal the unsharded run's.
    let merged = locksim_reports::results::ResultsFile::merge(vec![
        locksim_reports::results::ResultsFile::read(&dir.path().join("a.json")).unwrap(),
        locksim_reports::results::ResultsFile::read(&dir.path().join("b.json")).unwrap(),
    ]);
    merged.unwrap().write(&dir.path().join("merged.json")).unwrap();
    assert_eq!(numbers(&dir.path().join("merged.json")), numbers(&dir.path().join("all.json")));
    assert!(read(&dir.path().join("merged/report.md")).contains("redis-nemesis-del"));
}

#[test]
fn report_refuses_missing_or_repeated_shards_and_an_empty_shard_runs_nothing_and_passes() {
    let dir = scratch("missing-shards");
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let scenario = "scenarios/catalog/redis-nemesis-del.toml";
    for shard in ["1/3", "3/3"] {
        let o = locksim(&[
            "run",
            scenario,
            "--seeds",
            "0..30",
            "--shard",
            shard,
            "--json",
            &path(&format!("{}.json", &shard[..1])),
        ]);
        assert!(o.status.code().is_some(), "{}", stderr(&o));
    }
    let o = locksim(&["report", &path("1.json"), &path("3.json"), "--out", &path("r")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("missing shards of seeds 0..30: 2/3 (seeds 10..20)"), "{}", stderr(&o));
    let o = locksim(&["report", &path("1.json"), &path("1.json"), "--out", &path("r")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("shard 1/3 of seeds 0..30 is given twice"), "{}", stderr(&o));
    // 5 seeds into 8 shards: the 8th has none. It runs nothing, says so, and does not fail.
    let o = locksim(&["run", scenario, "--seeds", "0..5", "--shard", "8/8"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("shard 8/8 of seeds 0..5 has no seeds: nothing to run"), "{}", stdout(&o));
}

#[test]
fn a_random_nemesis_seed_of_set_nx_px_with_del_shrinks_to_one_pause_that_repro_replays() {
    let dir = scratch("shrink");
    let out = dir.path().join("shrunk.toml");
    let scenario = "scenarios/catalog/redis-nemesis-del.toml";
    let o = locksim(&["shrink", scenario, "--seed", "2", "--finding", "double-holder", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let said = stdout(&o);
    assert!(said.contains("shrunk to 1, still double-holder"), "{said}");
    let text = read(&out);
    assert_eq!(text.matches("[[faults.schedule]]").count(), 1, "{text}");
    assert!(text.contains("kind = \"pause\""), "{text}");
    assert!(!text.contains("[faults.random]"), "{text}");
    let replay = locksim(&["repro", out.to_str().unwrap(), "--seed", "2"]);
    assert!(stdout(&replay).contains("double-holder"), "{}", stdout(&replay));
    // And the shrunk file is a scenario that passes as written: unsafe, with that finding.
    assert_eq!(locksim(&["run", out.to_str().unwrap(), "--seeds", "2"]).status.code(), Some(0));
}

#[test]
fn the_report_has_every_chart_and_a_timeline_draws_the_overlap() {
    let dir = scratch("report");
    let results = dir.path().join("r.json");
    let o = locksim(&["suite", "scenarios/suites/smoke.toml", "--json", results.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let out = dir.path().join("report");
    assert_eq!(locksim(&["report", results.to_str().unwrap(), "--out", out.to_str().unwrap()]).status.code(), Some(0));
    let html = read(&out.join("index.html"));
    for title in ["Safety matrix", "Herd curve", "Flash sale", "Latency", "Throughput", "Messages and notifications"] {
        assert!(html.contains(&format!("<h2>{title}</h2>\n<svg")), "{title} is drawn inline");
    }
    let md = read(&out.join("report.md"));
    assert!(md.contains("![Safety matrix](safety-matrix.svg)") && out.join("safety-matrix.svg").exists());
    let timeline = dir.path().join("t.svg");
    let o = locksim(&[
        "repro",
        "scenarios/catalog/redis-del-gc-pause.toml",
        "--seed",
        "0",
        "--timeline",
        timeline.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let svg = read(&timeline);
    assert!(svg.starts_with("<svg") && svg.contains("client-2"), "one lane per client");
    // The overlap band is drawn in the two-holders colour (220, 30, 30) over the lanes.
    assert!(svg.contains("fill=\"#DC1E1E\""), "the overlap of two holders is marked");
}

#[test]
fn a_suite_requiring_a_hazard_its_scenario_cannot_reach_fails_naming_it_and_an_unknown_one_is_exit_2() {
    let dir = scratch("hazards");
    let catalog = root().join("scenarios/catalog/redis-redlock-no-faults.toml");
    let suite = dir.path().join("hazards.toml");
    let run = |hazards: &str| format!("[[run]]\nscenario = {catalog:?}\nseeds = \"0..2\"\nhazards = [{hazards}]\n");
    std::fs::write(&suite, run("\"lease-expired-while-held\"")).unwrap();
    let o = locksim(&["suite", suite.to_str().unwrap(), "--no-shrink"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("FAIL redis-redlock-no-faults"), "{out}");
    assert!(
        out.contains("redis-redlock-no-faults requires hazard lease-expired-while-held, but no seed reached it"),
        "{out}"
    );

    std::fs::write(&suite, run("\"lease-expired\"")).unwrap();
    let o = locksim(&["suite", suite.to_str().unwrap(), "--no-shrink"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("hazards.toml:4:12: hazards: unknown hazard \"lease-expired\""), "{err}");
    assert!(err.contains("expected one of: lease-expired-while-held, stale-holder-resumed"), "{err}");
}

#[test]
fn a_hazard_listed_twice_or_one_the_scenario_can_never_reach_is_bad_input_at_its_line() {
    let dir = scratch("unreachable");
    let catalog = root().join("scenarios/catalog/redis-del-gc-pause.toml");
    let suite = dir.path().join("hazards.toml");
    let run = |hazards: &str| format!("[[run]]\nscenario = {catalog:?}\nseeds = \"0..2\"\nhazards = [{hazards}]\n");
    let cases = [
        (
            "\"stale-holder-resumed\", \"stale-holder-resumed\"",
            "hazards.toml:4:36: hazards: stale-holder-resumed is listed twice",
        ),
        (
            "\"watch-fired-while-disconnected\"",
            "hazards.toml:4:12: hazards: redis-del-gc-pause can never reach watch-fired-while-disconnected: it is \
             marked by the zk family only, and redis.set-nx-px is redis",
        ),
        (
            "\"holder-crashed\"",
            "hazards.toml:4:12: hazards: redis-del-gc-pause can never reach holder-crashed: it needs a crash, \
             host-crash or restart fault, and the scenario has none",
        ),
        (
            "\"stale-read\"",
            "hazards.toml:4:12: hazards: redis-del-gc-pause can never reach stale-read: it is marked by the etcd \
             family only, and redis.set-nx-px is redis",
        ),
        ("\"lock-key-lost-in-failover\"", "it needs a failover fault"),
        ("\"clock-jump-during-hold\"", "it needs a clock-jump fault"),
    ];
    for (hazards, said) in cases {
        std::fs::write(&suite, run(hazards)).unwrap();
        let o = locksim(&["suite", suite.to_str().unwrap(), "--no-shrink"]);
        assert_eq!(o.status.code(), Some(2), "{hazards}: {}", stdout(&o));
        assert!(stderr(&o).contains(said), "{hazards}: {}", stderr(&o));
        assert!(!stdout(&o).contains("seeds 0..2"), "nothing ran: {}", stdout(&o));
    }
}

#[test]
fn run_prints_the_hazards_reached_and_list_names_every_hazard() {
    // The pause is aimed at a grant: every seed has a holder whose key expires under it.
    let o = locksim(&["run", "scenarios/catalog/redis-cad-pause-on-grant.toml", "--seeds", "0..3"]);
    let out = stdout(&o);
    assert!(out.contains("hazards: lease-expired-while-held in 3 seeds"), "{out}");
    let out = stdout(&locksim(&["list", "hazards"]));
    for h in locksim_sim::hazard::Hazard::ALL {
        assert!(out.contains(h.name()), "{out}");
    }
}
