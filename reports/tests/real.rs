//! Real mode (`locksim run FILE --real`): what it refuses before starting anything, and the shipped
//! real scenario on a real Redis with the Python adapter. Where redis-server (`.ci/install-servers`)
//! or the adapters' virtualenv (`scenarios/real/setup`) is missing, the real run says so and passes,
//! unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it, so that in CI it fails instead.

mod common;

use common::{locksim, root, stderr, stdout};

const SCENARIO: &str = "scenarios/real/redis-py-lock-pause.toml";

#[test]
fn a_simulated_run_of_a_command_recipe_without_a_model_says_it_runs_only_with_real() {
    let (_dir, path) = scenario("");
    for args in [vec!["run", &path], vec!["repro", &path, "--seed", "0"], vec!["shrink", &path, "--seed", "0"]] {
        let out = locksim(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).trim(), format!("locksim: {path}: {}", locksim_locks::command::ONLY_REAL), "{args:?}");
    }
}

/// The shipped real scenarios have a `[model]`, so a simulated run simulates it.
#[test]
fn a_simulated_run_of_a_real_scenario_runs_its_model() {
    let out = locksim(&["run", SCENARIO, "--seeds", "0..20"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("redis-py-lock-pause (redis.set-nx-px): 20 seeds, "), "{}", stdout(&out));
}

/// `suite --real` and a simulated `suite` of the same file, and the report setting them side by side
/// (the flash sale's baselines: no server needed).
#[test]
fn a_suite_runs_for_real_and_the_report_sets_it_beside_the_simulation() {
    let dir = tempfile::tempdir().unwrap();
    let real = root().join("scenarios/real");
    let suite = dir.path().join("suite.toml");
    let text = format!(
        "name = \"both\"\n[[run]]\nscenario = \"{}\"\nseeds = \"0..20\"\n[[run]]\nscenario = \"{}\"\nseeds = \"0..20\"\n",
        real.join("flash-sale-none.toml").display(),
        real.join("flash-sale-conditional-update.toml").display()
    );
    std::fs::write(&suite, text).unwrap();
    let (sim, live) = (dir.path().join("sim.json"), dir.path().join("real.json"));
    let suite = suite.to_str().unwrap();
    let out = locksim(&["suite", suite, "--json", sim.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = locksim(&["suite", suite, "--real", "--runs", "2", "--json", live.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("real runs with seeds 0..2: 2 unsafe (oversell in 2, lost-update in 2)"), "{text}");
    assert!(text.contains("suite both (real runs): 2 runs, 2 as expected, 0 not"), "{text}");
    let report = dir.path().join("report");
    let out = locksim(&["report", sim.to_str().unwrap(), live.to_str().unwrap(), "--out", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(
        md.contains("| flash-sale-none | none: 20/20 \\(100.0%\\) seeds unsafe | none: 2/2 \\(100.0%\\) runs unsafe |"),
        "{md}"
    );
    assert!(
        md.contains("| flash-sale-conditional-update | sql.conditional-update: 0/20 \\(0.0%\\) seeds unsafe |"),
        "{md}"
    );
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(page.contains("<h2>Simulated and real</h2>"), "{page}");
}

/// A scenario file in a fresh directory (a command that would fail if it ever started).
fn scenario(faults: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "name = \"t\"\n[recipe]\ncommand = [\"./never-started\"]\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \
         \"3s\"\n{faults}"
    );
    let path = dir.path().join("t.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn real_mode_refuses_before_starting_a_fault_it_cannot_do_naming_it() {
    let cases = [
        (
            "kind = \"partition\"\ntarget = \"client-0\"\nduration = \"1s\"",
            "fault `at 1s partition client-0 from everyone for 1s`",
        ),
        (
            "kind = \"clock-jump\"\ntarget = \"client-1\"\ndelta = \"5s\"",
            "fault `at 1s clock-jump client-1 +5000ms`: --real cannot move one process's clock",
        ),
        ("kind = \"pause\"\ntarget = \"redis-0\"\nduration = \"1s\"", "client processes only, not redis-0"),
        ("kind = \"crash\"\ntarget = \"resource\"", "client processes only, not resource"),
    ];
    for (fault, said) in cases {
        let (_dir, path) = scenario(&format!("[[faults.schedule]]\nat = \"1s\"\n{fault}\n"));
        let out = locksim(&["run", &path, "--real", "--runs", "1"]);
        assert_eq!(out.status.code(), Some(2), "{fault}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{fault}: {}", stderr(&out));
        assert!(!stderr(&out).contains("never-started"), "refused before any process started: {}", stderr(&out));
    }
    let (_dir, path) = scenario("[faults.random]\nkinds = [\"pause\"]\nevery = [\"1s\", \"2s\"]\nduration = \"1s\"\n");
    let out = locksim(&["run", &path, "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("[faults.random] does not run with --real yet"), "{}", stderr(&out));
}

#[test]
fn real_mode_refuses_a_built_in_recipe_for_now() {
    let out = locksim(&["run", "scenarios/catalog/redis-del-gc-pause.toml", "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--real runs a scenario whose [recipe] is a `command` or a baseline"),
        "{}",
        stderr(&out)
    );
}

/// The flash sale's baselines need no server and no process: they run on any machine.
#[test]
fn a_real_flash_sale_without_a_lock_oversells_and_with_a_conditional_update_never_does() {
    let out = locksim(&["run", "scenarios/real/flash-sale-none.toml", "--real", "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2 real runs, 2 unsafe — oversell in 2, lost-update in 2"), "{text}");
    assert!(text.contains("orders for a stock of 20"), "{text}");

    let out = locksim(&["run", "scenarios/real/flash-sale-conditional-update.toml", "--real", "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("2 real runs, 0 unsafe"), "{}", stdout(&out));
}

#[test]
fn a_real_baseline_refuses_faults_it_has_no_process_to_apply_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = "name = \"t\"\n[recipe]\nid = \"none\"\n[workload]\nkind = \"flash-sale\"\nstock = 5\nclients = 2\n\
                duration = \"3s\"\n[[faults.schedule]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"client-0\"\n\
                duration = \"1s\"\n";
    std::fs::write(&path, text).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("fault `at 1s pause client-0 for 1s`: --real runs a baseline's clients as threads"),
        "{}",
        stderr(&out)
    );
}

/// Whether the real run can happen here; if not, why (a failure under `LOCKSIM_REQUIRE_SERVERS`).
fn ready_for_real() -> bool {
    let venv = root().join("scenarios/real/.venv/bin/python");
    let missing = if !std::path::Path::new("/usr/bin/redis-server").exists() && which("redis-server").is_none() {
        Some("redis-server is not installed (run .ci/install-servers as root)".to_string())
    } else if !venv.exists() {
        Some(format!("{} is missing (run scenarios/real/setup)", venv.display()))
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {why} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            false
        }
        Some(why) => panic!("{why}"),
    }
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| p.is_file())
}

#[test]
fn redis_py_lock_paused_past_its_timeout_is_caught_on_real_redis() {
    if !ready_for_real() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (json, histories) = (dir.path().join("real.json"), dir.path().join("histories"));
    let (json_arg, histories_arg) = (json.to_str().unwrap(), histories.to_str().unwrap());
    let out = locksim(&["run", SCENARIO, "--real", "--runs", "3", "--json", json_arg, "--history-dir", histories_arg]);
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    // The results file is `run`'s, marked real; each unsafe run's history was kept, and said where.
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &results["runs"][0];
    assert_eq!((run["real"].as_bool(), run["results"].as_array().map(Vec::len)), (Some(true), Some(3)), "{run}");
    // A run whose pause found nobody holding the lock is safe (and keeps no history): look for any kept.
    let kept = std::fs::read_dir(&histories).unwrap().next().expect("an unsafe run's history").unwrap().path();
    assert!(text.contains(&format!("  history: {}", kept.display())), "{text}");
    let history = std::fs::read_to_string(&kept).unwrap();
    assert!(history.lines().any(|l| l.contains("\"kind\":\"acquire-ok\"")), "{history}");
    let report = dir.path().join("report");
    let out = locksim(&["report", json_arg, "--out", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(page.contains("(real runs do not replay"), "no repro line for a real run");
    assert!(text.contains("redis-py-lock-pause (command redis_py_lock.py): 3 real runs, "), "{text}");
    assert!(text.contains("expected unsafe [double-holder, unsafe-write]: as expected"), "{text}");
    assert!(text.contains("  double-holder client-"), "a finding is shown: {text}");
    assert!(text.contains("seeds 0..3 drew hold and think (real runs are not reproducible from their seed)"), "{text}");
    // That no process outlives a run is checked by its own test, on processes this test marks (other
    // runs may be going on on this machine).
}

/// A scenario in a fresh directory whose command is the redis-py adapter, by absolute path.
fn redis_py_scenario(body: &str) -> (tempfile::TempDir, String) {
    let real = root().join("scenarios/real");
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "name = \"t\"\n[recipe]\ncommand = [\"{}\", \"{}\"]\ntimeout = \"1s\"\nsleep = \"10ms\"\n{body}",
        real.join(".venv/bin/python").display(),
        real.join("adapters/redis_py_lock.py").display()
    );
    let path = dir.path().join("t.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn a_crashed_holder_comes_back_as_a_new_process_and_the_lock_recovers() {
    if !ready_for_real() {
        return;
    }
    let (_dir, path) = redis_py_scenario(
        "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"3s\"\n\
         [[faults.schedule]]\nat = \"1s\"\nkind = \"crash\"\ntarget = \"holder\"\nduration = \"500ms\"\n",
    );
    let out = locksim(&["run", &path, "--real"]);
    let (text, err) = (stdout(&out), stderr(&out));
    // The crashed holder's key expires after its 1 s timeout; the other client then takes the lock.
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    assert!(text.contains("expected safe: as expected"), "{text}");
    assert!(text.contains("recovery after a holder crash"), "the crash hit a holder: {text}");
    assert!(!text.contains("never recovered"), "{text}");
}

#[test]
fn a_command_that_breaks_the_protocol_is_a_harness_error_naming_the_client_and_the_line() {
    if !ready_for_real() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = "name = \"t\"\n[recipe]\ncommand = [\"sh\", \"-c\", \"read l; echo hello; sleep 10\"]\n\
                [workload]\nkind = \"counter\"\nclients = 1\nduration = \"3s\"\n";
    let path = dir.path().join("t.toml");
    std::fs::write(&path, text).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("client-0: bad line from the command: \"hello\": not JSON"), "{}", stderr(&out));
}

/// A run of locksim whose processes — locksim, the server it starts, the client processes and whatever
/// they start — all carry a mark in their environment, with its temporary files in a directory of its own.
struct Marked {
    mark: String,
    tmp: tempfile::TempDir,
}

impl Marked {
    fn new() -> Marked {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        Marked { mark: format!("locksim-test-{}-{nanos}", std::process::id()), tmp: tempfile::tempdir().unwrap() }
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_locksim"));
        cmd.args(args).current_dir(root()).env("LOCKSIM_TEST_MARK", &self.mark).env("TMPDIR", self.tmp.path());
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        cmd
    }

    /// Live processes (zombies hold no port or file) with the mark in their environment.
    fn processes(&self) -> Vec<String> {
        let needle = format!("LOCKSIM_TEST_MARK={}", self.mark);
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let proc = entry.path();
            let Ok(environ) = std::fs::read(proc.join("environ")) else { continue };
            if !environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
                continue;
            }
            let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").map_or("", |(_, rest)| &rest[..1]);
            if state != "Z" {
                let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
                found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
            }
        }
        found
    }

    /// Nothing marked still runs (given a moment: a parent-death signal is delivered asynchronously),
    /// and the temporary directory is empty.
    fn assert_nothing_left(&self, case: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut left = self.processes();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
            left = self.processes();
        }
        assert!(left.is_empty(), "{case}: processes left behind: {left:#?}");
        let files: Vec<_> = std::fs::read_dir(self.tmp.path()).unwrap().flatten().map(|e| e.path()).collect();
        assert!(files.is_empty(), "{case}: temporary files left behind: {files:?}");
    }
}

#[test]
fn no_process_or_temporary_file_outlives_a_run_a_failing_run_or_ctrl_c() {
    if !ready_for_real() {
        return;
    }
    let counter = |duration: &str| format!("[workload]\nkind = \"counter\"\nclients = 2\nduration = \"{duration}\"\n");

    let marked = Marked::new();
    let (_dir, path) = redis_py_scenario(&counter("2s"));
    let out = marked.command(&["run", &path, "--real"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    marked.assert_nothing_left("a run as expected");

    // A harness error: the command answers garbage, while a process it started sleeps on.
    let marked = Marked::new();
    let dir = tempfile::tempdir().unwrap();
    let script = "sleep 600 & read line; echo garbage; wait";
    let text = format!("name = \"t\"\n[recipe]\ncommand = [\"sh\", \"-c\", \"{script}\"]\n{}", counter("5s"));
    let bad = dir.path().join("t.toml");
    std::fs::write(&bad, text).unwrap();
    let out = marked.command(&["run", bad.to_str().unwrap(), "--real"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad line from the command: \"garbage"), "{}", stderr(&out));
    marked.assert_nothing_left("a harness error");

    // Ctrl-C once the clients run: exit 130, the server and every client stopped.
    let marked = Marked::new();
    let (_dir, path) = redis_py_scenario(&counter("60s"));
    let mut child = marked.command(&["run", &path, "--real"]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while marked.processes().iter().filter(|p| p.contains("redis_py_lock.py")).count() < 2 {
        assert!(std::time::Instant::now() < deadline, "the clients never started: {:#?}", marked.processes());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(1)); // the clients take and pass the lock meanwhile
                                                           // SAFETY: kill(2) on our own unreaped child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "Ctrl-C");
    marked.assert_nothing_left("Ctrl-C");
}
