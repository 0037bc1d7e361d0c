//! Real mode (`locksim run FILE --real`): what it refuses before starting anything, and shipped real
//! scenarios on real Redis, ZooKeeper, etcd and PostgreSQL, built-in and with the Python adapters. Where a server
//! (`.ci/install-servers`) or the adapters' virtualenv (`scenarios/real/setup`) is missing, the real run
//! says so and passes, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it, so that in CI it
//! fails instead.

mod common;

use common::{locksim, root, stderr, stdout, Marked};
use locksim_scenarios::Scenario;
use locksim_sim::history::{Event, EventKind, History};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

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
    assert!(
        text.contains("real runs with seeds 0..2: 2 unsafe (rate > 22.4%) — oversell in 2, lost-update in 2"),
        "{text}"
    );
    assert!(text.contains("suite both (real runs): 2 runs, 2 as expected, 0 not"), "{text}");
    let report = dir.path().join("report");
    let out = locksim(&["report", sim.to_str().unwrap(), live.to_str().unwrap(), "--out", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(
        md.contains(
            "| flash-sale-none | none: 20/20 \\(rate &gt; 86.1%\\) seeds unsafe | none: 2/2 \\(rate &gt; 22.4%\\) runs unsafe |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| flash-sale-conditional-update | sql.conditional-update: 0/20 \\(rate &lt; 13.9%\\) seeds unsafe |"
        ),
        "{md}"
    );
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(page.contains("<h2>Simulated and real</h2>"), "{page}");
}

/// A test scenario, judged on safety alone unless it has a `[check]` of its own: these runs last a few
/// seconds, shorter than the default liveness window, and locksim refuses a window no run can see.
fn safety_only(text: &str) -> String {
    if text.contains("[check]") {
        text.to_string()
    } else {
        format!("{text}\n[check]\ndeadlock = false\n")
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
    std::fs::write(&path, safety_only(&text)).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn real_mode_refuses_before_starting_a_fault_it_cannot_do_naming_it() {
    let cases = [
        (
            "kind = \"partition\"\ntarget = \"client-0\"\nduration = \"1s\"",
            "fault `at 1s partition client-0 from everyone for 1s`: --real cuts a client from the server only",
        ),
        (
            "kind = \"clog\"\ntarget = \"holder\"\npeers = [\"client-1\"]",
            "fault `at 1s clog holder outgoing to client-1 until the end`: --real cuts a client from the server only",
        ),
        ("kind = \"partition\"\ntarget = \"redis-0\"\npeers = [\"resource\"]", "--real cuts redis-0 from clients only"),
        (
            "kind = \"clock-jump\"\ntarget = \"client-1\"\ndelta = \"5s\"",
            "fault `at 1s clock-jump client-1 +5000ms`: --real cannot move one process's clock",
        ),
        (
            "kind = \"loss\"\ntarget = \"redis-0\"\nrate = 0.5",
            "fault `at 1s loss redis-0 rate 0.5 until the end`: --real does not draw lost segments",
        ),
        ("kind = \"drop-reply\"\ntarget = \"client-0\"", "aim drop-reply at redis-0 (a client sends none)"),
        ("kind = \"crash\"\ntarget = \"resource\"", "--real cannot fault the resource"),
        (
            "kind = \"host-crash\"\ntarget = \"client-0\"",
            "fault `at 1s host-crash client-0 stays down`: --real cannot crash a host",
        ),
        ("kind = \"host-crash\"\ntarget = \"redis-0\"\nduration = \"1s\"", "--real cannot crash a host"),
        ("kind = \"pause\"\ntarget = \"resource\"\nduration = \"1s\"", "--real cannot fault the resource"),
        (
            "on = \"lease-expired\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"1s\"",
            "fault `at 1s on lease-expired pause trigger for 1s`: --real starts aimed faults on the clients' events \
             (acquire, acquire-ok, enter, release, lock-lost), which locksim records; `lease-expired` happens inside \
             a server",
        ),
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
    let (_dir, path) = scenario("");
    let workers = std::fs::read_to_string(&path).unwrap().replace("clients = 2", "clients = 2\nworkers = 2");
    std::fs::write(&path, workers).unwrap();
    let out = locksim(&["run", &path, "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("workers = 2 runs in simulation only"), "{}", stderr(&out));
}

#[test]
fn a_zookeeper_scenario_aims_faults_at_zk_0() {
    let (_dir, path) = scenario("[[faults.schedule]]\nat = \"1s\"\nkind = \"drop-reply\"\ntarget = \"redis-0\"\n");
    let zk = std::fs::read_to_string(&path).unwrap().replace("[workload]", "server = \"zookeeper\"\n[workload]");
    std::fs::write(&path, safety_only(&zk)).unwrap();
    let out = locksim(&["run", &path, "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no node \"redis-0\" in this scenario; expected one of: client-0, client-1, zk-0"),
        "{}",
        stderr(&out)
    );
}

/// A real cluster takes the faults its proxies and signals can make: a member cut from its leader, but
/// no clog between members, and no stall anywhere. Refused before anything starts, naming why.
#[test]
fn real_mode_refuses_what_a_real_cluster_cannot_do() {
    let cases = [
        (
            "etcd.mutex",
            "kind = \"clog\"\ntarget = \"etcd-0\"\npeers = [\"etcd-1\"]",
            "clogs a member's links to clients only",
        ),
        ("etcd.mutex", "kind = \"stall\"\ntarget = \"leader\"\nduration = \"1s\"", "cannot stall a member's consensus"),
        (
            "zk.sequential",
            "kind = \"clog\"\ntarget = \"zk-0\"\npeers = [\"leader\"]",
            "clogs a member's links to clients only",
        ),
        ("zk.sequential", "kind = \"partition\"\ntarget = \"client-0\"", "cuts a client from servers only"),
    ];
    for (recipe, fault, said) in cases {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "name = \"t\"\n[recipe]\nid = \"{recipe}\"\n[backend]\nservers = 3\n[workload]\nkind = \"counter\"\n\
             clients = 2\nduration = \"3s\"\n[[faults.schedule]]\nat = \"1s\"\n{fault}\n"
        );
        let path = dir.path().join("t.toml");
        std::fs::write(&path, safety_only(&text)).unwrap();
        let out = locksim(&["run", path.to_str().unwrap(), "--real", "--runs", "1"]);
        assert_eq!(out.status.code(), Some(2), "{fault}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{fault}: {}", stderr(&out));
    }
}

/// A built-in recipe runs for real only where its scenario maps to real servers locksim starts; the refusal comes before anything starts, naming why.
#[test]
fn real_mode_refuses_a_built_in_recipe_it_cannot_map_to_one_real_server() {
    for (scenario, why) in [
        (
            "redis-redlock-checked-pause.toml",
            "redis.redlock with [backend] masters = 5: --real starts one Redis master",
        ),
        (
            "redis-failover.toml",
            "with [backend] replicas = 1 and no Sentinels: --real fails a master over only as Sentinel",
        ),
        (
            "zk-ephemeral-gc-pause.toml",
            "zk.ephemeral with [backend] tick_time = 2000ms: --real starts ZooKeeper with tickTime 200ms",
        ),
    ] {
        let out = locksim(&["run", &format!("scenarios/catalog/{scenario}"), "--real"]);
        assert_eq!(out.status.code(), Some(2), "{scenario}");
        assert!(stderr(&out).contains(why), "{scenario}: {}", stderr(&out));
    }
}

/// The flash sale's baselines need no server and no process: they run on any machine.
#[test]
fn a_real_flash_sale_without_a_lock_oversells_and_with_a_conditional_update_never_does() {
    let out = locksim(&["run", "scenarios/real/flash-sale-none.toml", "--real", "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2 real runs, 2 unsafe (rate > 22.4%) — oversell in 2, lost-update in 2"), "{text}");
    assert!(text.contains("orders for a stock of 20"), "{text}");

    let out = locksim(&["run", "scenarios/real/flash-sale-conditional-update.toml", "--real", "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("2 real runs, 0 unsafe (rate < 77.6%)"), "{}", stdout(&out));
}

/// `--real --seeds A..B` makes one run per seed of that range (refused when `--runs` disagrees); without
/// either, a scenario's `[expect] real_runs` says how many runs it takes, and fewer get a note.
#[test]
fn real_seeds_runs_and_a_scenarios_real_runs_agree() {
    let flash = "scenarios/real/flash-sale-none.toml";
    let out = locksim(&["run", flash, "--real", "--seeds", "3..5"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("flash-sale-none (none): 2 real runs, "), "{}", stdout(&out));
    assert!(stdout(&out).contains("seeds 3..5 drew hold and think"), "{}", stdout(&out));
    let out = locksim(&["run", flash, "--real", "--seeds", "3..5", "--runs", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--seeds 3..5 are 2 runs, but --runs 3: with --real each seed is one run"));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = std::fs::read_to_string(root().join(flash)).unwrap();
    std::fs::write(&path, text.replace("verdict = \"unsafe\"\n", "verdict = \"unsafe\"\nreal_runs = 2\n")).unwrap();
    let path = path.to_str().unwrap();
    let out = locksim(&["run", path, "--real"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(": 2 real runs, "), "[expect] real_runs is the default: {}", stdout(&out));
    assert!(!stderr(&out).contains("note:"), "{}", stderr(&out));
    let out = locksim(&["run", path, "--real", "--runs", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "note: flash-sale-none needs 2 real runs to show its verdict ([expect] real_runs = 2: its fault bites in \
             some runs only); 1 may miss it"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_real_baseline_refuses_faults_it_has_no_process_to_apply_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = "name = \"t\"\n[recipe]\nid = \"none\"\n[workload]\nkind = \"flash-sale\"\nstock = 5\nclients = 2\n\
                duration = \"3s\"\n[[faults.schedule]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"client-0\"\n\
                duration = \"1s\"\n";
    std::fs::write(&path, safety_only(text)).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("fault `at 1s pause client-0 for 1s`: --real runs a baseline's clients as threads"),
        "{}",
        stderr(&out)
    );
}

/// Whether the real run can happen here: `server` (`redis-server`, `etcd`, `postgres`, `zookeeper`) is
/// installed and the adapters' virtualenv made; if not, why (a failure under `LOCKSIM_REQUIRE_SERVERS`).
fn ready_for_real(server: &str) -> bool {
    let venv = root().join("scenarios/real/.venv/bin/python");
    let missing = match installed(server) {
        Some(why) => Some(why),
        None if !venv.exists() => Some(format!("{} is missing (run scenarios/real/setup)", venv.display())),
        None => None,
    };
    ready_or_skipped(missing)
}

/// Whether `server` is installed, for a built-in recipe's real run (no virtualenv: its clients are
/// `locksim adapter`); if not, why (a failure under `LOCKSIM_REQUIRE_SERVERS`).
fn server_ready(server: &str) -> bool {
    ready_or_skipped(installed(server))
}

/// Why `server` cannot run here, if it cannot.
fn installed(server: &str) -> Option<String> {
    let known: &[&str] = match server {
        "redis-server" => &["/usr/bin/redis-server"],
        "etcd" => &["/usr/bin/etcd"],
        "postgres" => &["/usr/lib/postgresql/15/bin/postgres"],
        "zookeeper" => &["/usr/share/java/zookeeper.jar"],
        _ => panic!("no server {server}"),
    };
    let found = known.iter().any(|p| std::path::Path::new(p).exists()) || which(server).is_some();
    (!found).then(|| format!("{server} is not installed (run .ci/install-servers as root)"))
}

fn ready_or_skipped(missing: Option<String>) -> bool {
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
    assert!(text.contains("redis-py-lock-pause (command redis_py_lock.py): 3 real runs, "), "{text}");
    assert!(text.contains("expected unsafe [double-holder, unsafe-write]: as expected"), "{text}");
    assert!(text.contains("  double-holder client-"), "a finding is shown: {text}");
    assert!(text.contains("seeds 0..3 drew hold and think (real runs are not reproducible from their seed)"), "{text}");
    // That no process outlives a run is checked by its own test, on processes this test marks (other
    // runs may be going on on this machine).
}

/// The simulator's own `redis.set-nx-px`, run for real as `locksim adapter` processes on a real Redis:
/// released by DEL, a holder paused past its TTL writes after the next holder's read; with
/// compare-and-delete and fencing, the resource refuses that stale write.
#[test]
fn builtin_redis_set_nx_px_paused_past_its_ttl_is_caught_and_fencing_refuses_the_stale_write() {
    if !server_ready("redis-server") {
        return;
    }
    built_in_runs_as_expected(&[
        ("builtin-redis-set-nx-px-del-pause", "redis.set-nx-px", "expected unsafe [double-holder, unsafe-write]"),
        (
            "builtin-redis-set-nx-px-fencing-pause",
            "redis.set-nx-px",
            "expected unsafe [double-holder, stale-write-rejected]",
        ),
    ]);
}

/// The simulator's own database recipes, run for real on a real PostgreSQL: the row lock's session is
/// ended by `idle_in_transaction_session_timeout` under a paused holder, whose write then lands; the
/// advisory lock's session outlives the pause, and nothing is unsafe; ShedLock's row expires under a
/// paused holder; the lock-table row of a killed holder stays, and nobody gets the lock again.
#[test]
fn builtin_sql_recipes_on_real_postgresql_are_caught_where_the_simulator_catches_them() {
    if !server_ready("postgres") {
        return;
    }
    built_in_runs_as_expected(&[
        (
            "builtin-sql-for-update-idle-timeout-pause",
            "sql.for-update",
            "expected unsafe [double-holder, unsafe-write]",
        ),
        ("builtin-sql-advisory-pause", "sql.advisory", "expected safe"),
        // A killed holder's kernel closes its connection: the session and its lock end at once, with
        // no deadlock, in real runs as in the simulator's process crash.
        ("builtin-sql-advisory-crash", "sql.advisory", "expected safe"),
        (
            "builtin-sql-unique-insert-expiry-pause",
            "sql.unique-insert-expiry",
            "expected unsafe [double-holder, unsafe-write]",
        ),
        ("builtin-sql-unique-insert-crash", "sql.unique-insert", "expected unsafe [deadlock]"),
    ]);
}

/// A fault aimed at a client's event starts in a real run when the event is recorded, and is in force
/// before the client's next step: a pause aimed at each grant (`on = "acquire-ok"`, `target =
/// "trigger"`) stops the new holder before it enters, so every run has a holder paused past its key's
/// TTL, and in the history the holder's `acquire-ok` is followed by the pause, not by its `enter`.
#[test]
fn a_fault_aimed_at_a_grant_stops_the_new_holder_before_it_enters() {
    if !server_ready("redis-server") {
        return;
    }
    let shipped =
        std::fs::read_to_string(root().join("scenarios/real/builtin-redis-set-nx-px-del-pause.toml")).unwrap();
    let aimed = shipped.replace("target = \"holder\"", "on = \"acquire-ok\"\ntarget = \"trigger\"");
    assert_ne!(aimed, shipped);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aimed.toml");
    std::fs::write(&path, aimed).unwrap();
    let histories = dir.path().join("histories");
    let out = locksim(
        &["run", path.to_str().unwrap(), "--real", "--runs", "2", "--history-dir"]
            .into_iter()
            .chain([histories.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("2 real runs, 2 unsafe"), "{text}");
    assert!(text.contains("faults: fired in every seed (2)"), "{text}");
    for seed in 0..2 {
        let history =
            std::fs::read_to_string(histories.join(format!("builtin-redis-set-nx-px-del-pause-seed-{seed}.jsonl")))
                .unwrap();
        let events: Vec<serde_json::Value> = history.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let start = events.iter().position(|e| e["kind"] == "fault-start").expect("the pause started");
        let holder = &events[start]["node"];
        let before: Vec<&str> =
            events[..start].iter().filter(|e| e["node"] == *holder).map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(before.last(), Some(&"acquire-ok"), "seed {seed}: {holder}'s events before the pause: {before:?}");
    }
}

/// Each shipped real scenario of a built-in recipe, `(scenario, recipe, expectation)`, run for real twice
/// (a fault aimed at the holder is skipped in a run where nobody holds the lock when it is due, and an
/// unsafe verdict needs one run where it bites), ends as expected.
fn built_in_runs_as_expected(runs: &[(&str, &str, &str)]) {
    for (scenario, recipe, expected) in runs {
        let path = format!("scenarios/real/{scenario}.toml");
        let out = locksim(&["run", &path, "--real", "--runs", "2"]);
        let (text, err) = (stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{scenario}: {text}\n{err}");
        assert!(text.contains(&format!("{scenario} ({recipe}): 2 real runs, ")), "{text}");
        assert!(text.contains(&format!("{expected}: as expected")), "{text}");
    }
}

/// The simulator's own `etcd.mutex` (clientv3 `concurrency.Mutex`), run for real as `locksim adapter`
/// processes on a real etcd through its JSON gateway: a holder paused past its lease's TTL is revoked,
/// the next waiter is granted, and the paused holder's write lands after its read; with fencing, the
/// resource refuses that write's older create_revision.
#[test]
fn builtin_etcd_mutex_paused_past_its_lease_is_caught_and_fencing_refuses_the_stale_write() {
    if !server_ready("etcd") {
        return;
    }
    built_in_runs_as_expected(&[
        ("builtin-etcd-mutex-pause", "etcd.mutex", "expected unsafe [double-holder, unsafe-write]"),
        ("builtin-etcd-mutex-fencing-pause", "etcd.mutex", "expected unsafe [double-holder, stale-write-rejected]"),
    ]);
}

/// The simulator's own `zk.sequential` (Curator's `InterProcessMutex`), run for real as `locksim
/// adapter` processes on a real ZooKeeper: a holder paused past its session timeout loses its session and
/// its node, the next in line is granted, and the resumed holder writes before its client hears that its
/// connection is gone; with fencing, the resource refuses the older czxid.
#[test]
fn builtin_zk_sequential_paused_past_its_session_is_caught_and_fencing_refuses_the_stale_write() {
    if !server_ready("zookeeper") {
        return;
    }
    built_in_runs_as_expected(&[
        ("builtin-zk-sequential-pause", "zk.sequential", "expected unsafe [double-holder, unsafe-write]"),
        (
            "builtin-zk-sequential-fencing-pause",
            "zk.sequential",
            "expected unsafe [double-holder, stale-write-rejected]",
        ),
    ]);
}

/// Every built-in etcd and ZooKeeper recipe runs in real client processes on its real server, and
/// without faults stays safe while its clients take turns.
#[test]
fn every_builtin_etcd_and_zookeeper_recipe_runs_for_real_and_stays_safe_without_faults() {
    let etcd: &[&str] = &["etcd.txn-lease", "etcd.txn-lease-wait", "etcd.mutex", "etcd.election"];
    let zk: &[&str] = &[
        "zk.ephemeral",
        "zk.sequential",
        "zk.sequential-unprotected",
        "zk.rwlock",
        "zk.semaphore-mutex",
        "zk.leader-election",
    ];
    let families = [
        ("etcd", etcd, "ttl = \"2s\"\n"),
        ("zookeeper", zk, "session_timeout = \"2s\"\n[backend]\ntick_time = \"200ms\"\n"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (server, ids, keys) in families {
        if !server_ready(server) {
            continue;
        }
        for id in ids {
            let path = dir.path().join(format!("{id}.toml"));
            let text = format!(
                "name = \"calm\"\n[recipe]\nid = \"{id}\"\n{keys}[workload]\nkind = \"counter\"\nclients = 2\n\
                 duration = \"3s\"\nhold = [\"50ms\", \"100ms\"]\n"
            );
            std::fs::write(&path, safety_only(&text)).unwrap();
            let out = locksim(&["run", path.to_str().unwrap(), "--real", "--runs", "1"]);
            let text = stdout(&out);
            assert_eq!(out.status.code(), Some(0), "{id}: {text}\n{}", stderr(&out));
            assert!(text.contains(&format!("calm ({id}): 1 real run, 0 unsafe")), "{text}");
            let acquisitions: f64 = text
                .split("measured: ")
                .nth(1)
                .and_then(|m| m.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{id}: no acquisitions measured: {text}"));
            assert!(acquisitions >= 2.0, "{id}: {text}");
        }
    }
}

/// Under real Sentinel (a master, two replicas, three Sentinels, their links through locksim's proxies)
/// the built-in Redis recipes' clients ask a Sentinel for the master and take turns; and when the master
/// is killed for good, the Sentinels promote a replica and the clients find it: the lock is granted again
/// within the liveness window, or the run would find a `deadlock`.
#[test]
fn builtin_redis_recipes_follow_real_sentinel_to_the_promoted_replica() {
    if !server_ready("redis-server") {
        return;
    }
    let backend = "[backend]\nreplicas = 2\nsentinels = 3\ndown_after = \"1s\"\nfailover_timeout = \"3s\"\n";
    let dir = tempfile::tempdir().unwrap();
    for (id, keys, faults) in [
        ("redis.set-nx-px", "ttl = \"1s\"\n", ""),
        ("redis.watchdog", "", ""),
        (
            "redis.set-nx-px",
            "ttl = \"1s\"\n",
            "[[faults.schedule]]\nat = \"2s\"\nkind = \"crash\"\ntarget = \"redis-0\"\n[check]\nliveness = \"6s\"\n",
        ),
    ] {
        let path = dir.path().join("sentinel.toml");
        let text = format!(
            "name = \"sentinel\"\n[recipe]\nid = \"{id}\"\n{keys}{backend}[workload]\nkind = \"counter\"\nclients = 2\n\
             duration = \"10s\"\nhold = [\"50ms\", \"100ms\"]\n{faults}"
        );
        std::fs::write(&path, safety_only(&text)).unwrap();
        let out = locksim(&["run", path.to_str().unwrap(), "--real", "--runs", "1"]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{id} {faults}: {text}\n{}", stderr(&out));
        assert!(text.contains(&format!("sentinel ({id}): 1 real run, 0 unsafe")), "{id} {faults}: {text}");
    }
}

/// A built-in recipe that listens for the loss of its lock (`lost_on`) says so unprompted: cut off from
/// etcd, the holder's real keep-alive hears nothing for the lease's TTL and stops; cut off from ZooKeeper,
/// its real client hears nothing for 2/3 of the session timeout and is disconnected (Curator's SUSPENDED).
/// The adapter's `{"lost":...}` line becomes `lock-lost` in the real history, inside the hold and the cut.
#[test]
fn a_builtin_holder_cut_off_from_etcd_or_zookeeper_says_lost_unprompted() {
    if server_ready("etcd") {
        let recipe = "id = \"etcd.mutex\"\nttl = \"2s\"\nlost_on = \"keepalive\"\n";
        cut_off_holder_says_lost(recipe, "etcd-0", "lease keep-alive stopped: no answer for the lease TTL");
    }
    if server_ready("zookeeper") {
        let recipe = "id = \"zk.sequential\"\nsession_timeout = \"2s\"\nlost_on = \"suspended\"\n\
                      [backend]\ntick_time = \"200ms\"\n";
        cut_off_holder_says_lost(recipe, "zk-0", "connection suspended");
    }
}

/// Run `recipe` (its `[recipe]` keys, and any `[backend]`) for real, the holder cut off from `server` for
/// 4 s while it holds for 4 s, and check it said `lost` for `reason` in the cut, a second or more in.
fn cut_off_holder_says_lost(recipe: &str, server: &str, reason: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = format!(
        "name = \"t\"\n[recipe]\n{recipe}[workload]\nkind = \"counter\"\nclients = 2\nduration = \"6s\"\n\
         hold = \"4s\"\nthink = \"0ms\"\n[[faults.schedule]]\nat = \"1s\"\nkind = \"partition\"\n\
         target = \"holder\"\npeers = [\"{server}\"]\nduration = \"4s\"\n"
    );
    let history = one_real_run(&path, &text);
    let (node, start, end) = fault_window(&history);
    let client = history.nodes.iter().position(|n| *n == node).unwrap() as u32;
    let lost = history.events.iter().find(|e| e.node.0 == client && matches!(e.kind, EventKind::LockLost { .. }));
    let lost = lost.unwrap_or_else(|| panic!("{recipe}: {node} never said lost: {:#?}", history.events));
    let EventKind::LockLost { reason: said } = &lost.kind else { unreachable!() };
    assert!(said.contains(reason), "{recipe}: {said}");
    let at = lost.t as f64 / 1e9;
    assert!(at > start + 1.0 && at < end, "{recipe}: lost at {at}s, the cut {start}..{end}");
}

/// A built-in recipe's real Redis client keeps the simulated client's contract: a command that gets no
/// answer within `call_timeout` (here: its client is cut from the server for 2 s) ends `Unknown`, and
/// the client goes on after the heal with a new connection.
#[test]
fn a_builtin_redis_call_cut_off_past_its_timeout_is_unknown_and_the_client_goes_on() {
    if !server_ready("redis-server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = "name = \"t\"\n[recipe]\nid = \"redis.set-nx-px\"\nttl = \"1s\"\nretry = \"10ms\"\n\
                call_timeout = \"500ms\"\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \"5s\"\n\
                [[faults.schedule]]\nat = \"1s\"\nkind = \"partition\"\ntarget = \"client-0\"\n\
                peers = [\"redis-0\"]\nduration = \"2s\"\n";
    let history = one_real_run(&path, text);
    let (node, start, end) = fault_window(&history);
    assert_eq!(node, "client-0");
    let client = history.nodes.iter().position(|n| n == "client-0").unwrap() as u32;
    let at = |e: &Event| e.t as f64 / 1e9;
    let ours = |e: &&Event| e.node.0 == client;
    let unknown = history
        .events
        .iter()
        .filter(ours)
        .find(|e| matches!(e.kind, EventKind::AcquireUnknown { .. } | EventKind::ReleaseUnknown { .. }));
    let unknown = unknown.unwrap_or_else(|| panic!("no unknown call under the cut: {:#?}", history.events));
    assert!(at(unknown) >= start + 0.4 && at(unknown) <= end + 0.2, "{} in {start}..{end}", at(unknown));
    let after =
        history.events.iter().filter(ours).any(|e| at(e) > end && matches!(e.kind, EventKind::AcquireOk { .. }));
    assert!(after, "client-0 never took the lock again after the heal");
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
    std::fs::write(&path, safety_only(&text)).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

#[test]
fn a_crashed_holder_comes_back_as_a_new_process_and_the_lock_recovers() {
    if !ready_for_real("redis-server") {
        return;
    }
    let (_dir, path) = redis_py_scenario(
        // Long holds and short thinks keep the lock held nearly all the time, and the crashes come
        // late enough for Python clients started on a loaded machine to be holding by then. One crash
        // still found nobody holding now and then (between a release and the next grant), so there are
        // two: either tests the recovery.
        "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"6s\"\nhold = [\"300ms\", \"500ms\"]\n\
         think = [\"0ms\", \"50ms\"]\n\
         [[faults.schedule]]\nat = \"2s\"\nkind = \"crash\"\ntarget = \"holder\"\nduration = \"500ms\"\n\
         [[faults.schedule]]\nat = \"3500ms\"\nkind = \"crash\"\ntarget = \"holder\"\nduration = \"500ms\"\n",
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
    std::fs::write(&path, safety_only(text)).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("client-0: bad line from the command: \"hello\": not JSON"), "{}", stderr(&out));
}

/// One real run of `body` (after the redis-py `[recipe]`) through the library, for its history.
fn real_history(body: &str) -> History {
    let (_dir, path) = redis_py_scenario(body);
    let scenario = Scenario::load(Path::new(&path), &locksim_locks::Registry::builtin()).unwrap();
    let mut history = None;
    locksim_live::real::run(&scenario, 1, 0, |run| {
        history = Some(run.history.clone());
        Ok(())
    })
    .unwrap();
    history.expect("one run")
}

/// When fault 0 started and ended (seconds since the run's start), on which node.
/// The history of one real run of the scenario `text`, written at `path`, run by the library as a
/// program of yours would (`locksim_live::real::run`).
fn one_real_run(path: &Path, text: &str) -> History {
    std::fs::write(path, safety_only(text)).unwrap();
    let scenario = Scenario::load(path, &locksim_locks::Registry::builtin()).unwrap();
    // This test's own executable is no `locksim`: name the one whose `adapter` runs the clients.
    std::env::set_var(locksim_live::real::ENV_EXE, env!("CARGO_BIN_EXE_locksim"));
    let mut history = None;
    locksim_live::real::run(&scenario, 1, 0, |run| {
        history = Some(run.history.clone());
        Ok(())
    })
    .unwrap();
    history.expect("one run")
}

fn fault_window(h: &History) -> (String, f64, f64) {
    let at = |e: &Event| e.t as f64 / 1e9;
    let start = h.events.iter().find(|e| matches!(e.kind, EventKind::FaultStart { id: 0, .. })).expect("it started");
    let end = h.events.iter().find(|e| matches!(e.kind, EventKind::FaultEnd { id: 0 })).expect("it ended");
    (h.nodes[start.node.0 as usize].clone(), at(start), at(end))
}

fn times<'a>(h: &'a History, kind: impl Fn(&EventKind) -> bool + 'a) -> impl Iterator<Item = f64> + 'a {
    h.events.iter().filter(move |e| kind(&e.kind)).map(|e| e.t as f64 / 1e9)
}

#[test]
fn a_crashed_server_is_recorded_restarted_and_answers_again() {
    if !ready_for_real("redis-server") {
        return;
    }
    let h = real_history(
        "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"4s\"\n\
         [[faults.schedule]]\nat = \"1s\"\nkind = \"crash\"\ntarget = \"redis-0\"\nduration = \"500ms\"\n",
    );
    let (node, start, end) = fault_window(&h);
    assert_eq!(node, "redis-0");
    // Back once it answers: after `duration`, within the time a Redis takes to start.
    assert!((0.49..3.0).contains(&(end - start)), "down {start}..{end}");
    let grants_after: Vec<f64> = times(&h, |k| matches!(k, EventKind::AcquireOk { .. })).filter(|t| *t > end).collect();
    assert!(!grants_after.is_empty(), "the lock is granted again after the restart: {h:?}");
    let refused = times(&h, |k| matches!(k, EventKind::AcquireUnknown { .. } | EventKind::ReleaseUnknown { .. }));
    assert!(refused.into_iter().any(|t| t > start && t < end), "a call while Redis was down failed: {h:?}");
}

#[test]
fn a_partitioned_client_hears_nothing_until_the_heal() {
    if !ready_for_real("redis-server") {
        return;
    }
    // redis-py's socket timeout is 2 s: its first call in the 2.5 s cut times out, unknown.
    let h = real_history(
        "[workload]\nkind = \"counter\"\nclients = 1\nduration = \"5s\"\n\
         [[faults.schedule]]\nat = \"1s\"\nkind = \"partition\"\ntarget = \"client-0\"\npeers = [\"redis-0\"]\n\
         duration = \"2500ms\"\n",
    );
    let (node, start, end) = fault_window(&h);
    assert_eq!(node, "client-0");
    assert!((2.49..2.6).contains(&(end - start)), "cut {start}..{end}");
    let answered = times(&h, |k| matches!(k, EventKind::AcquireOk { .. } | EventKind::ReleaseOk));
    let answered: Vec<f64> = answered.filter(|t| *t > start + 0.05 && *t < end).collect();
    assert!(answered.is_empty(), "no answer from Redis during the cut: {answered:?} in {start}..{end}");
    let timed_out = times(&h, |k| match k {
        EventKind::AcquireUnknown { reason } | EventKind::ReleaseUnknown { reason } => reason.contains("Timeout"),
        _ => false,
    });
    assert!(timed_out.into_iter().any(|t| t > start && t < end + 0.1), "a call timed out in the cut: {h:?}");
    let grants = times(&h, |k| matches!(k, EventKind::AcquireOk { .. }));
    assert!(grants.into_iter().any(|t| t > end), "the lock is granted again after the heal: {h:?}");
}

/// A scenario whose command records its proxy's address and its pid in `record`, then runs `then`.
fn recording_scenario(dir: &Path, record: &Path, then: &str) -> String {
    let text = format!(
        "name = \"t\"\n[recipe]\ncommand = [\"sh\", \"-c\", \"echo $LOCKSIM_REDIS $$ >> {}; {then}\"]\ntimeout = \"1s\"\n\
         [workload]\nkind = \"counter\"\nclients = 2\nduration = \"3s\"\n\
         [[faults.schedule]]\nat = \"2s\"\nkind = \"partition\"\ntarget = \"redis-0\"\nduration = \"5s\"\n",
        record.display()
    );
    let path = dir.join("t.toml");
    std::fs::write(&path, safety_only(&text)).unwrap();
    path.display().to_string()
}

#[test]
fn a_real_run_leaves_no_process_port_or_directory_behind_even_when_it_fails() {
    if !ready_for_real("redis-server") {
        return;
    }
    let real = root().join("scenarios/real");
    let adapter = format!(
        "exec {} {}",
        real.join(".venv/bin/python").display(),
        real.join("adapters/redis_py_lock.py").display()
    );
    // A run that ends well (a partition still on at the end), and one whose command breaks the protocol.
    // The broken command waits until both clients have recorded themselves: the harness error stops the
    // run at once, and a client it stops before its shell writes the record could not be checked.
    let broken = |record: &Path| {
        format!("read l; while [ $(wc -l < {}) -lt 2 ]; do sleep 0.05; done; echo hello; sleep 30", record.display())
    };
    for (broke, code) in [(false, 0), (true, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let record = dir.path().join("record");
        let then = if broke { broken(&record) } else { adapter.clone() };
        let path = recording_scenario(dir.path(), &record, &then);
        let out = Command::new(env!("CARGO_BIN_EXE_locksim"))
            .args(["run", &path, "--real"])
            .env("TMPDIR", &tmp)
            .current_dir(root())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{}\n{}", stdout(&out), stderr(&out));
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(left.is_empty(), "the server's directory is removed: {left:?}");
        let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        let ps = String::from_utf8_lossy(&ps.stdout);
        assert!(!ps.lines().any(|l| l.contains(tmp.to_str().unwrap())), "the server was stopped: {ps}");
        let recorded = std::fs::read_to_string(&record).unwrap();
        assert!(recorded.lines().count() >= 2, "every client started: {recorded}");
        for line in recorded.lines() {
            let (proxy, pid) = line.split_once(' ').unwrap();
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "client process {pid} is gone");
            assert!(TcpStream::connect(proxy).is_err(), "nothing listens on the proxy's {proxy} any more");
        }
    }
}

#[test]
fn no_process_or_temporary_file_outlives_a_run_a_failing_run_or_ctrl_c() {
    if !ready_for_real("redis-server") {
        return;
    }
    let counter = |duration: &str| format!("[workload]\nkind = \"counter\"\nclients = 2\nduration = \"{duration}\"\n");

    // Each client starts a daemon (`setsid`: out of its process group) that would sleep on.
    let marked = Marked::new();
    let (_dir, path) = redis_py_scenario(&counter("2s"));
    daemonise(&path);
    let out = marked.command(&["run", &path, "--real"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    marked.assert_nothing_left("a run as expected");

    // A harness error: the command answers garbage, while processes it started sleep on.
    let marked = Marked::new();
    let dir = tempfile::tempdir().unwrap();
    let script = "sleep 600 & setsid sleep 601 & read line; echo garbage; wait";
    let text = format!("name = \"t\"\n[recipe]\ncommand = [\"sh\", \"-c\", \"{script}\"]\n{}", counter("5s"));
    let bad = dir.path().join("t.toml");
    std::fs::write(&bad, safety_only(&text)).unwrap();
    let out = marked.command(&["run", bad.to_str().unwrap(), "--real"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad line from the command: \"garbage"), "{}", stderr(&out));
    marked.assert_nothing_left("a harness error");

    // Ctrl-C once the clients run: exit 130, the server and every client stopped.
    let marked = Marked::new();
    let (_dir, path) = redis_py_scenario(&counter("60s"));
    daemonise(&path);
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

/// Make the scenario at `path` (a `redis_py_scenario`) start a daemon in each client, with `setsid`,
/// before the adapter: out of the client's process group, it lives on unless locksim finds it.
fn daemonise(path: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let (head, rest) = text.split_once("command = [\"").unwrap();
    let (argv, tail) = rest.split_once("\"]").unwrap();
    let argv = argv.replace("\", \"", " ");
    let command = format!("command = [\"sh\", \"-c\", \"setsid sh -c 'sleep 600 & sleep 601' & exec {argv}\"]");
    std::fs::write(path, format!("{head}{command}{tail}")).unwrap();
}

#[test]
fn the_real_library_run_joins_its_proxies_before_it_returns() {
    if !ready_for_real("redis-server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record");
    let path = recording_scenario(dir.path(), &record, "read l; echo hello; sleep 30");
    let scenario = Scenario::load(Path::new(&path), &locksim_locks::Registry::builtin()).unwrap();
    let err = locksim_live::real::run(&scenario, 1, 0, |_| Ok(())).map(|_| ()).expect_err("a harness error");
    assert!(format!("{err:#}").contains("bad line from the command"), "{err:#}");
    // In this process, which goes on: the proxies' listeners are closed.
    for line in std::fs::read_to_string(&record).unwrap().lines() {
        let proxy = line.split_once(' ').unwrap().0;
        assert!(TcpStream::connect(proxy).is_err(), "nothing listens on the proxy's {proxy} any more");
    }
}

/// Run a shipped real scenario `runs` times; its stdout, once it ended as expected (exit 0).
fn run_shipped(name: &str, runs: &str) -> String {
    let path = format!("scenarios/real/{name}.toml");
    let out = locksim(&["run", &path, "--real", "--runs", runs]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains(&format!("{name} (command ")) && text.contains(&format!(": {runs} real runs, ")), "{text}");
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
    std::fs::write(&path, safety_only(&text)).unwrap();
    let out = locksim(&["run", path.to_str().unwrap(), "--real"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("expected safe: as expected"), "{text}");
}

/// A scenario in a fresh directory whose command is `sh adapter.sh`, the shell `script` beside it, with
/// `recipe` more `[recipe]` keys and `body` after them.
fn shell_scenario(script: &str, recipe: &str, body: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("adapter.sh"), script).unwrap();
    let text = format!("name = \"t\"\n[recipe]\ncommand = [\"sh\", \"adapter.sh\"]\n{recipe}{body}");
    let path = dir.path().join("t.toml");
    std::fs::write(&path, safety_only(&text)).unwrap();
    let path = path.display().to_string();
    (dir, path)
}

/// A shell adapter of a lock that is no lock: it answers every request at once, `ok` (so a run of it
/// is unsafe); `acquire` as `$ACQUIRE` says (a shell command that prints the answer, or nothing).
fn fake_lock(acquire: &str) -> String {
    format!(
        "while read line; do\n  case \"$line\" in\n    *acquire*) {acquire} ;;\n    *enter*) echo '{{\"entered\":true}}' ;;\n    \
         *write*) echo '{{\"writing\":true}}' ;;\n    *) echo '{{\"ok\":true}}' ;;\n  esac\ndone\n"
    )
}

const TWO_CLIENTS: &str = "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"3s\"\n";

/// A command that never answers ran nothing: no acquisition, which is no safe run but a harness error
/// naming each client and its unanswered `acquire` (it used to be "safe, 0 acquisitions", exit 0).
#[test]
fn a_command_that_never_answers_tested_nothing_and_is_a_harness_error() {
    if !server_ready("redis-server") {
        return;
    }
    let (_dir, path) = shell_scenario("exec sleep 600\n", "", TWO_CLIENTS);
    let out = locksim(&["run", &path, "--real"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}\n{err}", stdout(&out));
    assert!(err.contains("real run with seed 0: nothing was tested: no client acquired the lock in "), "{err}");
    for client in ["client-0", "client-1"] {
        let said = format!("{client}: 1 acquire requests, the last sent at ");
        assert!(err.contains(&said), "{err}");
    }
    assert!(err.contains("unanswered when the run ended at "), "{err}");
}

/// A request has a deadline (`[recipe] request_timeout`): a command that answers everything but
/// `acquire` is a harness error once it passes, naming the client and the request.
#[test]
fn a_command_answering_nothing_to_acquire_is_a_harness_error_past_the_request_deadline() {
    if !server_ready("redis-server") {
        return;
    }
    // Long enough that only the deadline, not the run's end, can stop the wait.
    let body = "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"60s\"\n";
    let (_dir, path) = shell_scenario(&fake_lock(":"), "request_timeout = \"1s\"\n", body);
    let out = locksim(&["run", &path, "--real"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}\n{err}", stdout(&out));
    assert!(
        err.contains(": no answer to acquire within its deadline of 1s ([recipe] request_timeout): sent at "),
        "{err}"
    );
    assert!(err.contains("real run with seed 0: client-"), "{err}");
}

/// `enter` and `write` are acknowledgements owed at once: an adapter that is granted the lock and then
/// hangs is a harness error within a short run (its 60 s request deadline would outlast the run).
#[test]
fn a_command_that_hangs_after_its_grant_is_a_harness_error_within_a_short_run() {
    if !server_ready("redis-server") {
        return;
    }
    let script = "while read line; do\n  case \"$line\" in\n    *acquire*) echo '{\"ok\":true}' ;;\n    *enter*) exec sleep 600 ;;\n  \
                  esac\ndone\n";
    let (_dir, path) = shell_scenario(script, "", TWO_CLIENTS);
    let out = locksim(&["run", &path, "--real"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}\n{err}", stdout(&out));
    assert!(err.contains(": no answer to enter within its deadline of 2s (an acknowledgement, owed at once)"), "{err}");
}

/// A client process is watched as a process: one that exits while something it started still holds
/// its stdout open is a harness error at once (not when the run ends, as "safe"), with its status, the
/// request it left unanswered and the last lines of its stderr; so is one that exits at once.
#[test]
fn a_command_that_exits_is_a_harness_error_even_while_a_child_holds_its_stdout() {
    if !server_ready("redis-server") {
        return;
    }
    let long = "[workload]\nkind = \"counter\"\nclients = 1\nduration = \"60s\"\n";
    for (script, status) in [
        ("sleep 600 &\nread line\necho 'cannot reach the lock service' >&2\nexit 3\n", "exit status: 3"),
        (
            "echo 'Traceback (most recent call last):' >&2\necho 'ModuleNotFoundError: redis' >&2\nexit 1\n",
            "exit status: 1",
        ),
    ] {
        let marked = Marked::new();
        let (_dir, path) = shell_scenario(script, "", long);
        let out = marked.command(&["run", &path, "--real"]).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{script}: {}\n{err}", stdout(&out));
        assert!(err.contains(&format!("client-0: the command ended ({status})")), "{script}: {err}");
        let last = script.lines().rfind(|l| l.contains(">&2")).unwrap();
        let last = last.trim_start_matches("echo '").split('\'').next().unwrap();
        assert!(err.contains("its stderr ends:\n    ") && err.contains(last), "{script}: {err}");
        if script.starts_with("sleep") {
            assert!(err.contains("while locksim waited for its answer to acquire"), "{err}");
        }
        marked.assert_nothing_left(script);
    }
}

/// The deadline does not count time under a fault: a client stopped for 4 s in the middle of its slow
/// `acquire` (0.5 s) is within a 2 s deadline; the same run without that rule would stop at the pause.
#[test]
fn a_request_deadline_does_not_count_a_pause() {
    if !server_ready("redis-server") {
        return;
    }
    // Hold and think nothing: the clients spend their time inside `acquire`, where the pause finds one.
    let body = "[workload]\nkind = \"counter\"\nclients = 2\nduration = \"7s\"\nhold = \"0ms\"\nthink = \"0ms\"\n\
                [[faults.schedule]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"waiter\"\nduration = \"4s\"\n\
                [expect]\nverdict = \"unsafe\"\n";
    let acquire = "sleep 0.5; echo '{\"ok\":true,\"token\":null}'";
    let (_dir, path) = shell_scenario(&fake_lock(acquire), "request_timeout = \"2s\"\n", body);
    let history = real_history_of(&path);
    let (node, start, end) = fault_window(&history);
    let client = history.nodes.iter().position(|n| *n == node).unwrap() as u32;
    let at = |e: &Event| e.t as f64 / 1e9;
    let mine: Vec<&Event> = history.events.iter().filter(|e| e.node.0 == client).collect();
    let asked = mine.iter().rfind(|e| matches!(e.kind, EventKind::AcquireInvoke) && at(e) < start);
    let asked = at(asked.expect("asked before the pause"));
    let answered = mine.iter().find(|e| matches!(e.kind, EventKind::AcquireOk { .. }) && at(e) > asked);
    let answered = at(answered.expect("answered"));
    assert!(answered > end - 0.1, "{node}'s acquire of {asked} s, paused in {start}..{end}, answered at {answered} s");
}

/// One real run of the scenario at `path` through the library (the clients are its command).
fn real_history_of(path: &str) -> History {
    let scenario = Scenario::load(Path::new(path), &locksim_locks::Registry::builtin()).unwrap();
    let mut history = None;
    locksim_live::real::run(&scenario, 1, 0, |run| {
        history = Some(run.history.clone());
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    history.expect("one run")
}
