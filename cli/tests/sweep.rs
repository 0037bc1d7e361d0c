//! `locksim sweep`: one key varied over a grid, and the breaking point it finds.

mod common;

use common::{locksim, scenario_file, stderr, stdout};
use std::path::{Path, PathBuf};

/// A 20 s counter of three clients under `SET NX PX` with a 5 s TTL, the holder paused at 5 s.
const PAUSE: &str = r#"name = "pause-vs-ttl"
[recipe]
id = "redis.set-nx-px"
ttl = "5s"
release = "del"
[workload]
kind = "counter"
clients = 3
duration = "20s"
[[faults.schedule]]
at = "5s"
kind = "pause"
target = "holder"
duration = "8s"
[check]
liveness = "10s"
[expect]
verdict = "unsafe"
"#;

fn pause_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    scenario_file("pause-vs-ttl.toml", text)
}

fn sweep(file: &Path, vary: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec!["sweep", file.to_str().unwrap(), "--vary", vary, "--seeds", "0..10"];
    args.extend_from_slice(more);
    locksim(&args)
}

#[test]
fn a_pause_shorter_than_the_ttl_never_breaks_the_lock_and_a_longer_one_does() {
    let (dir, file) = pause_file(PAUSE);
    let out = dir.path().join("out");
    let one = sweep(&file, "faults.schedule.0.duration=2s..8s/2s", &["--jobs", "1", "--out", out.to_str().unwrap()]);
    assert_eq!(one.status.code(), Some(0), "{}{}", stdout(&one), stderr(&one));
    let text = stdout(&one);
    // A holder holds at most 500 ms, so one paused for 4 s resumes and lets go before its 5 s TTL ends.
    assert!(text.contains("\n2s                          0/10 (rate < 25.9%)\n"), "{text}");
    assert!(text.contains("\n4s                          0/10 (rate < 25.9%)\n"), "{text}");
    assert!(text.contains("no violation up to faults.schedule.0.duration = 4s; breaks at 6s: "), "{text}");
    let eight = text.lines().find(|l| l.starts_with("8s ")).expect("a row for 8s");
    assert!(!eight.contains(" 0/10") && eight.contains("double-holder in"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(
        (json["rising"].as_bool(), json["safe_to"].as_str(), json["breaks_at"].as_str()),
        (Some(true), Some("4s"), Some("6s"))
    );
    assert!(json["points"][3]["unsafe_rate"]["low"].as_f64().unwrap() > 0.0, "{json}");
    assert!(std::fs::read_to_string(out.join("sweep.svg")).unwrap().contains("no violation up to 4s"));
    assert!(std::fs::read_to_string(out.join("sweep.md")).unwrap().contains("| 6s | "));

    // Seeds are independent: the jobs that run them change nothing printed.
    let two = sweep(&file, "faults.schedule.0.duration=2s..8s/2s", &["--jobs", "2"]);
    assert_eq!(text.replace(&format!("wrote {}\n", out.join("sweep.svg").display()), ""), stdout(&two));
}

#[test]
fn a_bad_vary_names_the_file_and_key_and_exits_2() {
    let (_dir, file) = pause_file(PAUSE);
    let name = file.display().to_string();
    for (vary, said) in [
        ("recipe.tll=1s..2s/1s", ": with --vary recipe.tll = 1s: unknown key `tll` in [recipe] of redis.set-nx-px"),
        ("faults.schedule.3.duration=1s..2s/1s", "--vary faults.schedule.3.duration: `faults.schedule` has 1 entries"),
        ("backend.masters=1..2/1", "--vary backend.masters: the file has no `backend`"),
        (
            "workload.clients=1s..2s/1s",
            "--vary workload.clients: `workload.clients` is 3 in the file, but the values given are durations",
        ),
        (
            "faults.schedule.0.target=1..2/1",
            "`faults.schedule.0.target` is \"holder\" in the file, but the values given are integers",
        ),
        ("recipe.ttl=5s..1s/1s", "--vary recipe.ttl: the range is empty"),
        ("recipe.ttl=1s..5s/0s", "--vary recipe.ttl: the step must be above zero"),
        // At the user's line of the varied key, not a line of the text rewritten with its value.
        (
            "workload.clients=0..2/1",
            ":8:11: clients: expected a whole number from 1 to 1000, found 0 (with --vary workload.clients = 0)",
        ),
        (
            "workload.duration=1s..2s/1s",
            ": with --vary workload.duration = 1s: at: the run lasts 1s; a fault at 5s would never start",
        ),
    ] {
        let o = sweep(&file, vary, &[]);
        assert_eq!(o.status.code(), Some(2), "{vary}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains(&format!("{name}{said}")) || !said.starts_with(':'), "{vary}: {}", stderr(&o));
        assert!(stderr(&o).contains(&name) && stderr(&o).contains(said), "{vary}: {}", stderr(&o));
        assert_eq!(stdout(&o), "", "{vary}: nothing runs");
    }
    // A fault of the file itself is shown at its own line.
    let (_dir, typo) = pause_file(&PAUSE.replace("release = \"del\"", "releas = \"del\""));
    let o = sweep(&typo, "recipe.ttl=1s..2s/1s", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{}:5:1: unknown key `releas`", typo.display())), "{}", stderr(&o));
}

#[test]
fn the_shards_of_a_sweep_merge_into_the_sweep_of_all_their_seeds() {
    let (dir, file) = pause_file(PAUSE);
    let vary = "faults.schedule.0.duration=2s..8s/3s";
    let part = |i: u64| dir.path().join(format!("part-{i}"));
    for i in 1..=2 {
        let shard = format!("{i}/2");
        let o = sweep(&file, vary, &["--shard", &shard, "--out", part(i).to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
        assert!(stdout(&o).contains(&format!("(shard {i}/2): seeds unsafe by")), "{}", stdout(&o));
    }
    let whole = sweep(&file, vary, &[]);
    let (one, two) = (part(1), part(2));
    let merged = locksim(&[
        "sweep",
        file.to_str().unwrap(),
        "--vary",
        vary,
        "--merge",
        one.to_str().unwrap(),
        two.to_str().unwrap(),
    ]);
    assert_eq!(merged.status.code(), Some(0), "{}", stderr(&merged));
    assert_eq!(stdout(&merged), stdout(&whole), "merged shards print what one sweep of their seeds prints");
    assert!(stdout(&whole).contains("breaks at 5s"), "{}", stdout(&whole));

    // A shard missing, or another key, is refused, naming what is wrong.
    let o = locksim(&["sweep", file.to_str().unwrap(), "--vary", vary, "--merge", one.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("missing shards of seeds 0..10: 2/2 (seeds 5..10)"), "{}", stderr(&o));
    let o =
        locksim(&["sweep", file.to_str().unwrap(), "--vary", "recipe.ttl=2s..8s/3s", "--merge", one.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("by faults.schedule.0.duration, not of"), "{}", stderr(&o));
}

#[test]
fn out_creates_only_its_last_directory_as_mkdir_does() {
    let (dir, file) = pause_file(PAUSE);
    let deep = dir.path().join("no/such/sweep");
    let o = sweep(&file, "recipe.ttl=1s..2s/1s", &["--out", deep.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let wanted =
        format!("its parent {} does not exist (create it first); nothing was run", deep.parent().unwrap().display());
    assert!(stderr(&o).contains(&wanted), "{}", stderr(&o));
    assert!(!dir.path().join("no").exists(), "no parent was made");
    assert_eq!(stdout(&o), "");
    let out = dir.path().join("sweep");
    let o = sweep(&file, "recipe.ttl=1s..2s/1s", &["--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(out.join("sweep.svg").exists());
}
