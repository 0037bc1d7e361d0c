//! The command line as users and CI scripts meet it: output, exit codes, error messages.

mod common;

use common::{locksim, scenario_file, stderr, stdout};

const GOOD: &str = r#"name = "t"
[recipe]
id = "redis.set-nx-px"
ttl = "5s"
[workload]
kind = "counter"
clients = 3
duration = "20s"
[[faults.schedule]]
at = "5s"
kind = "pause"
target = "holder"
duration = "8s"
[expect]
verdict = "unsafe"
findings = ["double-holder"]
[check]
liveness = "10s"
"#;

#[test]
fn run_exits_0_when_the_verdict_is_as_expected_and_names_a_repro() {
    let o = locksim(&["run", "scenarios/catalog/redis-del-gc-pause.toml", "--seeds", "0..20"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("as expected"));
    assert!(stdout(&o).contains("reproduce: locksim repro scenarios/catalog/redis-del-gc-pause.toml --seed "));
}

/// An own-lock crate's binary runs `cli::main` under its own name; the lines to paste say that name.
#[test]
fn reproduce_lines_name_the_binary_that_printed_them() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("my-locks");
    std::fs::copy(env!("CARGO_BIN_EXE_locksim"), &mine).unwrap();
    let o = std::process::Command::new(&mine)
        .args(["run", "scenarios/catalog/redis-del-gc-pause.toml", "--seeds", "0..5"])
        .current_dir(common::root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("reproduce: my-locks repro scenarios/catalog/"), "{}", stdout(&o));
}

#[test]
fn run_exits_1_when_a_verdict_differs() {
    let (_dir, flipped) = scenario_file(
        "flipped.toml",
        &GOOD.replace("verdict = \"unsafe\"\nfindings = [\"double-holder\"]", "verdict = \"safe\""),
    );
    let o = locksim(&["run", flipped.to_str().unwrap(), "--seeds", "0..10"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("NOT as expected"));
    assert!(stdout(&o).contains("expected safe, but some seeds found double-holder"));
    assert!(stdout(&o).contains("reproduce: locksim repro"), "a failure prints the command that reproduces it");
}

/// Each bad file gets one line on stderr naming file:line:col and what was expected, and exit 2.
#[test]
fn bad_scenario_files_get_one_precise_line_and_exit_2() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "unknown-key.toml",
            "ttl = \"5s\"",
            "ttl = \"5s\"\ntll = \"1s\"",
            ":5:1: unknown key `tll` in [recipe] of redis.set-nx-px; expected one of: id, ttl, release",
        ),
        (
            "bad-duration.toml",
            "duration = \"20s\"",
            "duration = \"20 seconds\"",
            ":8:12: duration: expected a duration such as \"250ms\", \"5s\" or \"2m\", found \"20 seconds\"",
        ),
        (
            "unknown-recipe.toml",
            "id = \"redis.set-nx-px\"",
            "id = \"redis.setnx\"",
            ":3:6: unknown recipe id \"redis.setnx\"; expected one of: redis.set-nx, ",
        ),
        (
            "unknown-fault.toml",
            "kind = \"pause\"",
            "kind = \"gc\"",
            ":11:8: unknown fault kind \"gc\"; expected one of: pause, crash",
        ),
        ("unknown-section-key.toml", "clients = 3", "clients = 3\nclient = 4", ":8:1: unknown field `client`"),
        (
            "bad-target.toml",
            "target = \"holder\"",
            "target = \"client-9\"",
            ":12:10: target: no node \"client-9\" in this scenario; expected one of: client-0",
        ),
        (
            "bad-choice.toml",
            "ttl = \"5s\"",
            "ttl = \"5s\"\nrelease = \"unlink\"",
            ":5:11: release: expected one of \"del\", \"compare-and-delete\"",
        ),
        ("syntax.toml", "clients = 3", "clients = = 3", ":7:11: "),
        (
            "reads-range.toml",
            "clients = 3",
            "clients = 3\nreads = 1.5",
            ":8:9: reads: expected a share from 0.0 to 1.0",
        ),
        (
            "workers-range.toml",
            "clients = 3",
            "clients = 3\nworkers = 0",
            ":8:11: workers: expected a whole number of lock objects per client from 1 to 16, found 0",
        ),
        (
            "restart-a-running-node.toml",
            "kind = \"pause\"\ntarget = \"holder\"\nduration = \"8s\"",
            "kind = \"restart\"\ntarget = \"redis-0\"",
            ":9:1: a `restart` brings back a node left down by an earlier `crash` or `host-crash` without `duration`; redis-0 is not down",
        ),
        (
            "stall-no-cluster.toml",
            "kind = \"pause\"\ntarget = \"holder\"\nduration = \"8s\"",
            "kind = \"stall\"\ntarget = \"redis-0\"",
            ":12:10: target: stall stops a cluster member's consensus loop while its client side answers; \"redis-0\" is not one",
        ),
        (
            "lag-no-cluster.toml",
            "kind = \"pause\"\ntarget = \"holder\"\nduration = \"8s\"",
            "kind = \"lag\"\ntarget = \"redis-0\"\nlatency = \"1s\"",
            ":12:10: target: lag slows the apply of a member that follows a leader; \"redis-0\" is not one",
        ),
        (
            "missing-duration.toml",
            "duration = \"8s\"",
            "",
            ":10:1: a `pause` fault needs `duration`",
        ),
        ("too-large.toml", "clients = 3", "clients = 99999999999999999999", ":7:11: clients: expected a whole number within range"),
        ("not-a-number.toml", "clients = 3", "clients = \"3\"", ":7:11: clients: invalid type: string \"3\", expected a whole number"),
        ("zero-ttl.toml", "ttl = \"5s\"", "ttl = \"0ms\"", ":2:1: ttl must be at least 1ms (Redis refuses PX 0"),
        (
            "path-name.toml",
            "name = \"t\"",
            "name = \"../../x\"",
            ":1:8: name: expected an identifier of letters, digits, '.', '_' and '-'",
        ),
        (
            "fault-after-the-end.toml",
            "at = \"5s\"",
            "at = \"20s\"",
            ":10:6: at: the run lasts 20s; a fault at 20s would never start",
        ),
        (
            "cut-from-itself.toml",
            "kind = \"pause\"\ntarget = \"holder\"",
            "kind = \"partition\"\ntarget = \"client-0\"\npeers = [\"client-0\"]",
            ":13:9: peers: expected at least one node other than the target",
        ),
        (
            "empty-nemesis.toml",
            "[expect]",
            "[faults.random]\nkinds = []\nevery = \"2s\"\nduration = \"1s\"\n[expect]",
            ":15:9: kinds: expected at least one fault kind",
        ),
        (
            "nth-too-large.toml",
            "at = \"5s\"",
            "at = \"5s\"\non = \"acquire-ok\"\nnth = 99999999999999999999",
            ":12:7: nth: expected a whole number within range, found a larger one",
        ),
        (
            "nth-out-of-range.toml",
            "at = \"5s\"",
            "at = \"5s\"\non = \"acquire-ok\"\nnth = 0",
            ":12:7: nth: expected a whole number from 1 to 1000000",
        ),
        (
            "reads-exclusive.toml",
            "clients = 3",
            "clients = 3\nreads = 0.5",
            ":8:9: reads > 0 needs a recipe with a shared (read) mode, and redis.set-nx-px has none",
        ),
    ];
    for (name, from, to, expected) in cases {
        let (_dir, path) = scenario_file(name, &GOOD.replacen(from, to, 1));
        let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..2"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line, got {err:?}");
        let wanted = format!("{}{expected}", path.display());
        assert!(err.contains(&wanted), "{name}: expected {wanted:?} in {err:?}");
    }
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_the_run() {
    let nowhere = std::env::temp_dir().join(format!("locksim-no-such-dir-{}/r.json", std::process::id()));
    let o = locksim(&[
        "run",
        "scenarios/catalog/redis-del-gc-pause.toml",
        "--seeds",
        "0..2000",
        "--json",
        nowhere.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot write the output there"), "{}", stderr(&o));
    assert!(!stdout(&o).contains("seeds,"), "nothing was run: {}", stdout(&o));
    let o = locksim(&["repro", "scenarios/catalog/redis-del-gc-pause.toml", "--seed", "1", "--timeline", "/"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn a_fault_test_whose_faults_never_take_effect_fails_and_says_so() {
    // One buyer, one item: sold out and gone long before the pause is due, so there is no holder to hit.
    let text = GOOD.replace("kind = \"counter\"\nclients = 3", "kind = \"flash-sale\"\nstock = 1\nclients = 1");
    let (_dir, path) = scenario_file("no-waiter.toml", &text);
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..5"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("no fault fired in any of the 5 seeds"), "{}", stdout(&o));
    assert!(stdout(&o).contains("faults: fired in 0 of 5 seeds"), "{}", stdout(&o));
    // Expecting safe changes nothing: a test that never happened is not green.
    let (_dir, path) = scenario_file(
        "no-waiter-safe.toml",
        &text.replace("[expect]\nverdict = \"unsafe\"\nfindings = [\"double-holder\"]\n", ""),
    );
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..5"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("expected safe: NOT as expected"), "{}", stdout(&o));
}

#[test]
fn a_seed_too_big_for_its_event_budget_stops_with_a_clear_error() {
    let huge = "name = \"huge\"\n[recipe]\nid = \"none\"\n[workload]\nkind = \"flash-sale\"\nstock = 1000000\n\
                clients = 64\nduration = \"24h\"\nhold = [\"0ms\", \"0ms\"]\nthink = [\"0ms\", \"0ms\"]\n";
    let (_dir, path) = scenario_file("huge.toml", huge);
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("used up its budget of 2000000 history events"), "{}", stderr(&o));
}

#[test]
fn a_run_shorter_than_its_liveness_window_is_refused_and_a_wedge_in_it_is_called() {
    // A SETNX holder crashed for good in a 20 s run: with the default 30 s window the wedge was "safe".
    let wedged = "name = \"w\"\n[recipe]\nid = \"redis.set-nx\"\n[workload]\nkind = \"counter\"\nclients = 3\n\
                  duration = \"20s\"\n[[faults.schedule]]\nat = \"2s\"\nkind = \"crash\"\ntarget = \"holder\"\n";
    let (_dir, path) = scenario_file("wedged.toml", wedged);
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..5"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("wedged.toml:7:12: liveness 30s (the default) is not shorter than the run's duration 20s"),
        "{}",
        stderr(&o)
    );
    // With a window the run can see, the wedge is a deadlock: never exit 0.
    let (_dir, path) = scenario_file("wedged-10s.toml", &format!("{wedged}[check]\nliveness = \"10s\"\n"));
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", "0..5"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("expected safe, but some seeds found deadlock"), "{}", stdout(&o));
    // Judging safety alone is a choice the file states.
    let (_dir, path) = scenario_file("wedged-off.toml", &format!("{wedged}[check]\ndeadlock = false\n"));
    assert_eq!(locksim(&["run", path.to_str().unwrap(), "--seeds", "0..5"]).status.code(), Some(0));
}

#[test]
fn a_seed_range_ending_at_u64_max_finishes_at_any_jobs() {
    let (_dir, path) = scenario_file(
        "tiny.toml",
        &GOOD
            .replace("duration = \"20s\"", "duration = \"2s\"")
            .replace("at = \"5s\"", "at = \"1s\"")
            .replace("liveness = \"10s\"", "liveness = \"1s\""),
    );
    let top = format!("{}..{}", u64::MAX - 4, u64::MAX);
    let o = locksim(&["run", path.to_str().unwrap(), "--seeds", &top, "--jobs", "3"]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    assert!(stdout(&o).contains(": 4 seeds"), "{}", stdout(&o));
}

#[test]
fn a_missing_file_and_bad_arguments_exit_2() {
    let o = locksim(&["run", "no/such/file.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).matches("os error").count(), 1, "the OS error once: {}", stderr(&o));
    let o = locksim(&["run", "scenarios/catalog/redis-del-gc-pause.toml", "--jobs", "0"]);
    assert_eq!(o.status.code(), Some(2), "--jobs 0 is refused");
    let o = locksim(&["run", "scenarios/catalog/redis-del-gc-pause.toml", "--seeds", "7"]);
    assert!(stdout(&o).contains(": 1 seed,"), "one seed: {}", stdout(&o));
    let (_dir, binary) = scenario_file("latin1.toml", "");
    std::fs::write(&binary, b"name = \"caf\xe9\"\n").unwrap();
    let o = locksim(&["run", binary.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("latin1.toml:1:12: expected UTF-8 text"), "{}", stderr(&o));
    let o = locksim(&["run", "scenarios/catalog/redis-del-gc-pause.toml", "--seeds", "9..3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("empty"));
}

#[test]
fn repro_prints_a_byte_identical_trace_in_two_processes() {
    let args = ["repro", "scenarios/catalog/redis-del-gc-pause.toml", "--seed", "3", "--trace"];
    let (a, b) = (locksim(&args), locksim(&args));
    assert_eq!(a.status.code(), Some(0));
    assert!(stdout(&a).contains("double-holder"), "{}", stdout(&a));
    assert!(stdout(&a).lines().count() > 500, "the trace has every event");
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn json_results_are_the_same_at_any_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one.json"), dir.path().join("two.json"));
    let base = ["run", "scenarios/catalog/redis-nemesis-del.toml", "--seeds", "0..30"];
    let o1 = locksim(&[&base[..], &["--jobs", "1", "--json", one.to_str().unwrap()]].concat());
    let o2 = locksim(&[&base[..], &["--jobs", "2", "--json", two.to_str().unwrap()]].concat());
    assert_eq!((o1.status.code(), o2.status.code()), (Some(0), Some(0)));
    let (a, b) = (std::fs::read_to_string(one).unwrap(), std::fs::read_to_string(two).unwrap());
    assert_eq!(a, b);
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    let run = &v["runs"][0];
    assert_eq!(run["results"].as_array().unwrap().len(), 30);
    assert!(run["results"][0]["history_hash"].as_str().unwrap().len() == 16);
}

#[test]
fn list_shows_recipes_with_parameters_faults_and_scenarios() {
    let o = locksim(&["list"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for needle in ["redis.redlock", "check_validity", "clock-jump", "redis-del-gc-pause.toml", "replication_lag"] {
        assert!(out.contains(needle), "list output lacks {needle}");
    }
    assert!(!out.contains("(invalid"), "every shipped scenario loads:\n{out}");
}

#[test]
fn report_names_the_files_it_wrote_once_each_and_counts_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = locksim(&[
        "run",
        "scenarios/catalog/redis-del-gc-pause.toml",
        "--seeds",
        "0..1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("): 1 seed, "), "{}", stdout(&o));
    let out = format!("{}/", dir.path().join("report").display());
    let o = locksim(&["report", json.to_str().unwrap(), "--out", &out]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let said = stdout(&o);
    assert!(said.starts_with("1 run merged from 1 file: 1 as expected, 0 not\n"), "{said}");
    assert!(said.contains(&format!("wrote {out}index.html and {out}report.md")), "{said}");
}

/// The README's commands, run from a clone, leave nothing in it but under `target/`; none needs `sudo`
/// (a root machine has none); and the own-lock example is copied with its `Cargo.lock`.
#[test]
fn the_readme_commands_write_under_target_and_work_as_root() {
    let docs = std::fs::read_dir(common::root().join("docs")).unwrap().map(|e| e.unwrap().path());
    let pages = docs.filter(|p| p.extension().is_some_and(|e| e == "md")).chain([common::root().join("README.md")]);
    let readme: String = pages.map(|p| std::fs::read_to_string(p).unwrap()).collect();
    let mut checked = 0;
    for line in readme.lines().map(str::trim) {
        let command = line.strip_prefix("$ ").unwrap_or(line);
        assert!(!command.starts_with("sudo "), "{line:?}: say \"as root\" instead");
        if !(command.starts_with("locksim ") || command.starts_with("cargo run")) {
            continue;
        }
        let words: Vec<&str> = command.split('#').next().unwrap().split_whitespace().collect();
        for pair in words.windows(2) {
            if ["--out", "--json", "--junit", "-o", "--timeline", "--history", "--shrink-dir"].contains(&pair[0]) {
                assert!(pair[1].starts_with("target/"), "{line:?}: {} {} is not under target/", pair[0], pair[1]);
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} outputs found in the README's commands");
    assert!(readme.contains("`Cargo.lock`"), "the README tells users to copy own-locks/Cargo.lock");
}
