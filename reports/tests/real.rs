//! Real mode (`locksim run FILE --real`): what it refuses before starting anything, and shipped real
//! scenarios on real Redis, etcd and PostgreSQL with the Python adapters. Where a server
//! (`.ci/install-servers`) or the adapters' virtualenv (`scenarios/real/setup`) is missing, the real run
//! says so and passes, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it, so that in CI it
//! fails instead.

mod common;

use common::{locksim, root, stderr, stdout};

const SCENARIO: &str = "scenarios/real/redis-py-lock-pause.toml";

#[test]
fn a_simulated_run_of_a_command_recipe_says_it_runs_only_with_real() {
    for args in [vec!["run", SCENARIO], vec!["repro", SCENARIO, "--seed", "0"], vec!["shrink", SCENARIO, "--seed", "0"]]
    {
        let out = locksim(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).trim(),
            format!("locksim: {SCENARIO}: recipe `command` runs only with --real"),
            "{args:?}"
        );
    }
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
    assert!(stderr(&out).contains("--real runs a scenario whose [recipe] is a `command`"), "{}", stderr(&out));
}

/// Whether the real run can happen here: `server` (`redis-server`, `etcd`, `postgres`, `zookeeper`) is
/// installed and the adapters' virtualenv made; if not, why (a failure under `LOCKSIM_REQUIRE_SERVERS`).
fn ready_for_real(server: &str) -> bool {
    let venv = root().join("scenarios/real/.venv/bin/python");
    let known: &[&str] = match server {
        "redis-server" => &["/usr/bin/redis-server"],
        "etcd" => &["/usr/bin/etcd"],
        "postgres" => &["/usr/lib/postgresql/15/bin/postgres"],
        "zookeeper" => &["/usr/share/java/zookeeper.jar"],
        _ => panic!("no server {server}"),
    };
    let installed = known.iter().any(|p| std::path::Path::new(p).exists()) || which(server).is_some();
    let missing = if !installed {
        Some(format!("{server} is not installed (run .ci/install-servers as root)"))
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
    if !ready_for_real("redis-server") {
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
    assert!(text.contains("redis-py-lock-pause (command): 3 real runs, "), "{text}");
    assert!(text.contains("expected unsafe [double-holder, unsafe-write]: as expected"), "{text}");
    assert!(text.contains("  double-holder client-"), "a finding is shown: {text}");
    assert!(text.contains("seeds 0..3 drew hold and think (real runs are not reproducible from their seed)"), "{text}");
    // Every client process and the server are gone.
    let ps = std::process::Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.lines().any(|l| l.contains("adapters/redis_py_lock.py")), "a client process was left: {ps}");
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
    if !ready_for_real("redis-server") {
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
    if !ready_for_real("redis-server") {
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

/// Run a shipped real scenario `runs` times; its stdout, once it ended as expected (exit 0).
fn run_shipped(name: &str, runs: &str) -> String {
    let path = format!("scenarios/real/{name}.toml");
    let out = locksim(&["run", &path, "--real", "--runs", runs]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains(&format!("{name} (command): {runs} real runs, ")), "{text}");
    text
}

#[test]
fn python_etcd3_lock_paused_past_its_lease_is_caught_on_real_etcd() {
    if !ready_for_real("etcd") {
        return;
    }
    let text = run_shipped("etcd3-lock-pause", "3");
    assert!(text.contains("expected unsafe [double-holder, unsafe-write]: as expected"), "{text}");
}

#[test]
fn the_fenced_set_nx_px_lock_has_its_stale_write_refused_on_real_redis() {
    if !ready_for_real("redis-server") {
        return;
    }
    let text = run_shipped("redis-set-nx-px-fencing-pause", "3");
    // Two clients believed they held the lock, but no stale write got through (`absent = ["unsafe-write"]`,
    // judged with the verdict): the INCR token fenced it.
    assert!(text.contains("expected unsafe [double-holder, stale-write-rejected]: as expected"), "{text}");
    assert!(!text.contains("unsafe-write in"), "{text}");
}

#[test]
fn a_row_lock_whose_session_postgresql_ends_for_idling_is_caught_on_real_postgresql() {
    if !ready_for_real("postgres") {
        return;
    }
    let text = run_shipped("psycopg-for-update-idle-timeout-pause", "2");
    assert!(text.contains("expected unsafe [double-holder, unsafe-write]: as expected"), "{text}");
}

#[test]
fn readers_are_asked_to_acquire_shared_and_recorded_shared() {
    if !ready_for_real("redis-server") {
        return;
    }
    // An adapter that takes every shared acquisition at once and answers an exclusive one with a line
    // that breaks the protocol: all readers (reads = 1) overlap, and only `shared` keeps that safe.
    let dir = tempfile::tempdir().unwrap();
    let adapter = dir.path().join("readers.py");
    let adapters = root().join("scenarios/real/adapters");
    std::fs::write(
        &adapter,
        format!(
            "import sys\nsys.path.insert(0, {:?})\nfrom locksim_adapter import serve\n\
             serve(lambda: {{\"exclusive\": True}}, lambda: {{\"ok\": True}}, acquire_shared=lambda: {{\"ok\": True}})\n",
            adapters.display().to_string()
        ),
    )
    .unwrap();
    let text = format!(
        "name = \"t\"\n[recipe]\ncommand = [\"{}\", \"readers.py\"]\n[workload]\nkind = \"counter\"\nclients = 3\n\
         duration = \"2s\"\nhold = [\"300ms\", \"500ms\"]\nreads = 1.0\n",
        root().join("scenarios/real/.venv/bin/python").display()
    );
    let path = dir.path().join("t.toml");
    std::fs::write(&path, text).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("expected safe: as expected"), "{text}");
}
