//! The locks of `examples/own-locks` — a crate outside the workspace, written with only the public API —
//! are judged like built-in ones: the polling ZooKeeper one is caught, ZooKeeper's `WriteLock` finds its
//! node by its session id (and deadlocks without), the SQL row lock and the etcd one stay clean, the
//! SQL-text lease lock is overtaken past its lease, and their sessions' events reach the history. Its own state, a ledger with its invariant, is broken by
//! an unfenced pause and kept whole by fencing.

#[path = "../examples/own-locks/src/etcd_lock.rs"]
mod etcd_lock;
#[path = "../examples/own-locks/src/ledger.rs"]
mod ledger;
#[path = "../examples/own-locks/src/sql_lease.rs"]
mod sql_lease;
#[path = "../examples/own-locks/src/sql_lock.rs"]
mod sql_lock;
#[path = "../examples/own-locks/src/zk_lock.rs"]
mod zk_lock;
#[path = "../examples/own-locks/src/zk_write_lock.rs"]
mod zk_write_lock;

use locksim_locks::params::{ParamValue::Bool, Params};
use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::sweep::{sweep, ScenarioResult};
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;

fn registry() -> Registry {
    Registry::builtin()
        .with(zk_lock::RECIPE)
        .with(sql_lock::RECIPE)
        .with(sql_lease::RECIPE)
        .with(zk_write_lock::RECIPE)
        .with(etcd_lock::RECIPE)
        .with_work(ledger::WORK)
}

fn scenario(name: &str) -> Scenario {
    let registry = registry();
    let path = format!("{}/examples/own-locks/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    Scenario::load(std::path::Path::new(&path), &registry).unwrap_or_else(|e| panic!("{e}"))
}

fn swept(name: &str, seeds: std::ops::Range<u64>) -> ScenarioResult {
    sweep(&scenario(name), seeds, 2, &|| {}).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_polling_zookeeper_lock_gives_two_holders_when_its_holder_outlives_its_session() {
    let result = swept("zk-poll-gc-pause", 0..30);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert!(result.results.iter().any(|r| r.counts.contains_key(&FindingKind::DoubleHolder)));
    let run = run_seed(&scenario("zk-poll-gc-pause"), 0).unwrap();
    let states: Vec<&str> = run
        .history
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Session { state } => Some(state.as_str()),
            _ => None,
        })
        .collect();
    for state in ["connected", "expired by the server", "disconnected", "expired"] {
        assert!(states.contains(&state), "the user's session reports {state:?}: {states:?}");
    }
}

#[test]
fn the_job_row_lock_stays_safe_under_client_partitions_and_crashes() {
    let result = swept("sql-job-lock-nemesis", 0..200);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 0);
    assert!(result.results.iter().any(|r| r.counts.contains_key(&FindingKind::StaleWriteRejected)), "faults bite");
    let run = run_seed(&scenario("sql-job-lock-nemesis"), 0).unwrap();
    let ended = run
        .history
        .events
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Session { state } if state.contains("database session ended")));
    assert!(ended, "a crashed client's database session ends in the history");
}

#[test]
fn the_sql_text_lease_lock_is_granted_and_overtaken_when_its_holder_pauses_past_the_lease() {
    let result = swept("sql-lease-gc-pause", 0..20);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert!(result.results.iter().all(|r| r.measurements.acquisitions > 10), "granted, again and again");
    assert!(result.results.iter().any(|r| r.counts.contains_key(&FindingKind::DoubleHolder)));
}

#[test]
fn zookeepers_write_lock_finds_its_node_by_its_session_id_when_replies_are_lost() {
    let result = swept("zk-write-lock-drop-reply", 0..30);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 0);
    assert!(result.results.iter().all(|r| r.measurements.acquisitions > 20), "the lock does work between losses");
    // Without the lookup by the session's prefix, a lost create's node waits ahead of everyone.
    let orphaned = swept("zk-write-lock-orphan", 0..30);
    assert!(orphaned.as_expected, "{:?}", orphaned.reasons);
    assert!(orphaned.results.iter().any(|r| r.counts.contains_key(&FindingKind::Deadlock)));
}

#[test]
fn two_write_locks_on_one_session_both_hold_and_the_workers_are_named_in_the_history() {
    let shared = scenario("zk-write-lock-shared-session");
    assert_eq!(shared.workload.workers, 2);
    let result = sweep(&shared, 0..20, 2, &|| {}).unwrap();
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 20, "the second lock takes the first's node for its own in every seed");
    let run = run_seed(&shared, 0).unwrap();
    // Two lock objects wait on one session's state: woken in a fixed order, the run replays exactly.
    assert_eq!(run.history.to_jsonl(), run_seed(&shared, 0).unwrap().history.to_jsonl());
    assert!(run.history.nodes.iter().any(|n| n == "client-1/w1"), "{:?}", run.history.nodes);
    let w1 = run.history.nodes.iter().position(|n| n == "client-0/w1").unwrap() as u32;
    let w1_holds =
        run.history.events.iter().filter(|e| e.node.0 == w1 && matches!(e.kind, EventKind::AcquireOk { .. }));
    assert!(w1_holds.count() > 5, "the second worker drives its own lock");
    let holders = |f: &locksim_scenarios::checkers::Finding| f.clients.join(" & ");
    assert!(
        run.result.findings.iter().any(|f| f.kind == FindingKind::DoubleHolder && holders(f).contains("/w1")),
        "two workers of one client hold at once: {:?}",
        run.result.findings
    );
    // A handle of its own per lock object: the same workers stay safe.
    let mut own = shared.clone();
    let unshared = shared.recipe_params.iter().map(|(k, v)| (k, if k == "shared_session" { Bool(false) } else { *v }));
    own.recipe_params = Params::resolve(shared.recipe.params, unshared);
    let separate = sweep(&own, 0..20, 2, &|| {}).unwrap();
    assert_eq!(separate.unsafe_seeds, 0, "{:?}", separate.results.iter().map(|r| &r.findings).collect::<Vec<_>>());
}

#[test]
fn the_lease_key_lock_stays_safe_when_holders_crash() {
    let result = swept("etcd-lease-key-crash", 0..200);
    assert!(result.as_expected, "{:?}", result.reasons);
    assert_eq!(result.unsafe_seeds, 0);
    assert!(result.results.iter().all(|r| r.measurements.acquisitions > 20), "the lock does work between crashes");
}

#[test]
fn the_ledger_loses_entries_to_a_paused_holder_unless_the_store_is_fenced() {
    let unfenced = swept("ledger-gc-pause", 0..30);
    assert!(unfenced.as_expected, "{:?}", unfenced.reasons);
    assert!(unfenced.results.iter().any(|r| r.counts.contains_key(&FindingKind::Invariant)));
    let run = run_seed(&scenario("ledger-gc-pause"), 1).unwrap();
    let lost = run.result.findings.iter().find(|f| f.kind == FindingKind::Invariant).expect("seed 1 loses an entry");
    assert!(lost.detail.contains("append lost"), "{}", lost.detail);
    let stores = run.history.events.iter().filter(|e| matches!(e.kind, EventKind::Put { accepted: true, .. })).count();
    assert!(stores > 100, "every critical section writes the ledger: {stores}");

    let fenced = swept("ledger-gc-pause-fencing", 0..100);
    assert!(fenced.as_expected, "{:?}", fenced.reasons);
    assert!(fenced.results.iter().all(|r| !r.counts.contains_key(&FindingKind::Invariant)));
    let refused = fenced.results.iter().filter(|r| r.counts.contains_key(&FindingKind::StaleWriteRejected)).count();
    assert!(refused > 50, "the pause bites and fencing refuses the stale append: {refused} of 100");
}

#[test]
fn a_fault_on_enter_fires_inside_a_users_critical_section() {
    let text = std::fs::read_to_string(scenario("ledger-gc-pause").path).unwrap();
    let aimed =
        text.replace("at = \"10s\"\nkind", "at = \"10s\"\non = \"enter\"\nkind").replace("\"holder\"", "\"trigger\"");
    let s = Scenario::parse("ledger-enter.toml", &aimed, &registry()).unwrap_or_else(|e| panic!("{e}"));
    let run = run_seed(&s, 0).unwrap();
    let started = run.history.events.iter().filter(|e| matches!(e.kind, EventKind::FaultStart { .. })).count();
    assert_eq!((started, run.result.faults_skipped), (1, 0), "the section's start fires the pause");
    let result = sweep(&s, 0..20, 2, &|| {}).unwrap();
    assert!(result.fault_coverage.is_some_and(|c| c.complete()), "{:?}", result.fault_coverage);
}

#[test]
fn a_workload_kind_is_one_of_the_registrys_and_needs_a_lock() {
    let text = |recipe: &str, kind: &str| {
        format!("name = \"t\"\n[recipe]\nid = \"{recipe}\"\n[workload]\nkind = \"{kind}\"\nclients = 2\nduration = \"60s\"\n")
    };
    let parse = |recipe: &str, kind: &str| {
        Scenario::parse("f.toml", &text(recipe, kind), &registry()).err().map(|e| e.to_string())
    };
    assert_eq!(parse("redis.set-nx-px", "ledger"), None);
    assert_eq!(
        parse("redis.set-nx-px", "ledgr").as_deref(),
        Some("f.toml:5:8: kind: expected one of \"counter\", \"flash-sale\", \"ledger\", found \"ledgr\"")
    );
    let no_lock = parse("sql.conditional-update", "ledger").expect("refused");
    assert!(
        no_lock.starts_with("f.toml:5:8: kind = \"ledger\" runs its own critical section under a lock"),
        "{no_lock}"
    );
}

/// docs/own-lock.md's ```rust blocks.
fn readme_blocks() -> Vec<String> {
    let section = std::fs::read_to_string(format!("{}/../docs/own-lock.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    section.split("```rust\n").skip(1).map(|b| b.split("```").next().unwrap().to_string()).collect()
}

#[test]
fn the_readme_shows_the_session_id_a_shared_session_and_sql_as_the_examples_write_them() {
    let blocks = readme_blocks();
    let source = include_str!("../examples/own-locks/src/zk_write_lock.rs");
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    for shown in ["session_id()", "node_wide("] {
        let zk = blocks.iter().find(|b| b.contains(shown)).unwrap_or_else(|| panic!("{shown} in the README"));
        for line in zk.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(lines.contains(&line), "the README's {line:?} is not in zk_write_lock.rs");
        }
    }
    let sql = blocks.iter().find(|b| b.contains("schema.prepare(")).expect("SQL text in the README");
    // Each `schema.prepare("…")`, its `\` continuations joined as Rust joins them.
    let joined = sql.split("\\\n").map(str::trim_start).collect::<String>();
    let mut schema = locksim_sim::backend::sql::text::Schema::new();
    let prepared: Vec<_> = joined
        .split("schema.prepare(\"")
        .skip(1)
        .map(|rest| {
            schema.prepare(rest.split("\")").next().unwrap()).unwrap_or_else(|e| panic!("the README's SQL: {e}"))
        })
        .collect();
    assert_eq!(
        prepared.iter().map(|p| p.params()).collect::<Vec<_>>(),
        [0, 2],
        "CREATE TABLE, then INSERT with $1, $2"
    );
    let insert = prepared[1].bind(&[&"nightly-report", &"host-1"]).unwrap();
    assert!(matches!(insert.model(), locksim_sim::backend::sql::Stmt::InsertOnConflictDoNothing { .. }));
}
