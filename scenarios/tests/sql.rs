//! The database family and the flash sale: oversell without a lock, never with a conditional update,
//! the lease-based lock under a pause, and what a dead session costs each SQL lock.

mod common;

use common::{assert_as_expected, run};
use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;

fn found(r: &locksim_scenarios::sweep::ScenarioResult, kind: FindingKind) -> usize {
    r.results.iter().filter(|s| s.counts.contains_key(&kind)).count()
}

#[test]
fn without_a_lock_the_flash_sale_oversells_within_ten_seeds() {
    let r = assert_as_expected("flash-sale-none", 0..10);
    assert!(found(&r, FindingKind::Oversell) > 0);
}

#[test]
fn a_conditional_update_never_oversells_over_1000_seeds_of_every_client_fault() {
    let r = assert_as_expected("flash-sale-sql-conditional-update-nemesis", 0..1000);
    assert_eq!(found(&r, FindingKind::Oversell) + found(&r, FindingKind::LostUpdate), 0);
    let faults: usize = r.results.iter().map(|s| s.schedule.len()).sum();
    assert!(faults > 10_000, "the nemesis was busy: {faults} faults");
}

#[test]
fn a_pause_past_the_ttl_oversells_or_loses_updates_and_fencing_stops_both() {
    let r = assert_as_expected("flash-sale-redis-set-nx-px-gc-pause", 0..30);
    assert!(found(&r, FindingKind::Oversell) + found(&r, FindingKind::LostUpdate) > 0);
    let fenced = assert_as_expected("flash-sale-redis-set-nx-px-gc-pause-fencing", 0..30);
    assert_eq!(found(&fenced, FindingKind::Oversell) + found(&fenced, FindingKind::LostUpdate), 0);
    assert!(found(&fenced, FindingKind::StaleWriteRejected) > 0, "the stale write was refused");
}

#[test]
fn a_lock_row_without_expiry_wedges_and_lock_until_frees_it_after_lock_at_most_for() {
    let wedged = assert_as_expected("sql-unique-insert-crash", 0..30);
    assert!(found(&wedged, FindingKind::Deadlock) > 0);
    let r = assert_as_expected("sql-unique-insert-expiry-crash", 0..30);
    let recoveries: Vec<f64> = r.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
    assert!(!recoveries.is_empty());
    for ms in recoveries {
        // lock_until was set when the lock was taken, up to a hold (500 ms) before the crash.
        assert!((9_000.0..=10_500.0).contains(&ms), "recovered {ms} ms after the crash; lockAtMostFor is 10 s");
    }
    assert_as_expected("sql-unique-insert-expiry-gc-pause", 0..30);
}

/// `sql-for-update-crash` with the server's keep-alive idle time set to `idle_s`.
fn for_update_crash(idle_s: u64) -> Scenario {
    let path = common::catalog_dir().join("sql-for-update-crash.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replace("tcp_keepalives_idle = \"10s\"", &format!("tcp_keepalives_idle = \"{idle_s}s\""));
    Scenario::parse("sql-for-update-crash.toml", &text, &Registry::builtin()).unwrap()
}

#[test]
fn for_update_frees_a_crashed_holders_row_only_when_keepalive_finds_the_session_dead() {
    let mut previous = 0.0;
    for idle_s in [5, 10, 20] {
        let r = run(&for_update_crash(idle_s), 0..20);
        assert!(r.as_expected, "{:?}", r.reasons);
        let recoveries: Vec<f64> = r.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
        assert!(!recoveries.is_empty());
        // Idle, then three probes a second apart, each unanswered: idle + 3 s after the server last
        // heard from the holder — up to a hold (500 ms) before the crash — on time, as the kernel's
        // per-connection timer is.
        let expected = (idle_s * 1000 + 3000) as f64;
        for ms in &recoveries {
            assert!((expected - 600.0..expected + 100.0).contains(ms), "idle {idle_s}s: recovered after {ms} ms");
        }
        let longest = recoveries.iter().copied().fold(0.0, f64::max);
        assert!(longest > previous, "recovery grows with the keep-alive time");
        previous = longest;
    }
    assert_as_expected("sql-for-update-crash-default-keepalive", 0..20);
}

#[test]
fn bad_flash_sale_parameters_are_errors_with_their_line() {
    let text = |workload: &str| {
        format!("name = \"t\"\n[recipe]\nid = \"sql.for-update\"\n[workload]\nduration = \"5s\"\n{workload}\n")
    };
    let parse = |w: &str| Scenario::parse("f.toml", &text(w), &Registry::builtin()).err().map(|e| e.to_string());
    let cases = [
        (
            "kind = \"flash-sale\"\nclients = 3\nstock = 0",
            "f.toml:8:9: stock: expected a whole number of items from 1 to 1000000, found 0",
        ),
        (
            "kind = \"flash-sale\"\nclients = 3\nstock = -5",
            "f.toml:8:9: stock: expected a whole number of items from 1 to 1000000, found -5",
        ),
        (
            "kind = \"flash-sale\"\nclients = -2\nstock = 5",
            "f.toml:7:11: clients: expected a whole number from 1 to 1000, found -2",
        ),
        ("kind = \"flash-sale\"\nclients = 3", "f.toml:6:8: a flash sale needs `stock`, the items on sale"),
        (
            "kind = \"counter\"\nclients = 3\nstock = 5",
            "f.toml:8:9: stock: only a flash sale (kind = \"flash-sale\") has stock",
        ),
        (
            "kind = \"auction\"\nclients = 3",
            "f.toml:6:8: kind: expected one of \"counter\", \"flash-sale\", found \"auction\"",
        ),
    ];
    for (workload, expected) in cases {
        assert_eq!(parse(workload).as_deref(), Some(expected), "{workload}");
    }
}

/// A scenario file of `sql.advisory` whose holder is crashed at 10 s by `kind`, with the server's
/// keep-alive at the operating system's defaults (2 h idle) and a 20 s liveness window.
fn advisory_holder(kind: &str) -> Scenario {
    let text = format!(
        "name = \"advisory-{kind}\"\n[recipe]\nid = \"sql.advisory\"\n[workload]\nkind = \"counter\"\nclients = 3\n\
         duration = \"60s\"\n[[faults.schedule]]\nat = \"10s\"\nkind = \"{kind}\"\ntarget = \"holder\"\n\
         [check]\nliveness = \"20s\"\n"
    );
    Scenario::parse("advisory.toml", &text, &Registry::builtin()).unwrap()
}

#[test]
fn a_killed_holder_process_frees_its_advisory_lock_at_once_and_a_dead_host_keeps_it_until_keepalive() {
    // The kernel of a killed process closes its connection: PostgreSQL reads EOF and ends the session
    // one network delay later (a real server recovered in 3–31 ms; the old model, in which a crash
    // silenced the host, gave `deadlock` in 192 of 200 seeds).
    let killed = run(&advisory_holder("crash"), 0..20);
    assert_eq!(found(&killed, FindingKind::Deadlock), 0, "{:?}", killed.reasons);
    let recoveries: Vec<f64> = killed.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
    assert!(recoveries.len() >= 15, "the holder was crashed in most seeds: {recoveries:?}");
    assert!(recoveries.iter().all(|ms| *ms < 50.0), "granted within a network delay or two: {recoveries:?}");
    // A dead host closes nothing: the lock stays until keep-alive (2 h by default) ends the session.
    let silent = run(&advisory_holder("host-crash"), 0..20);
    assert!(found(&silent, FindingKind::Deadlock) >= 15, "{:?}", silent.reasons);
    assert_as_expected("sql-advisory-process-crash", 0..20);
}

#[test]
fn a_link_that_heals_after_the_last_keepalive_probe_still_loses_the_session() {
    // Linux resets the connection at the check after the count-th probe without probing again, so
    // the holder cut off for 7.5 s (idle 5 s, 3 probes 1 s apart) loses its session at 8 s though the
    // link came back at 7.5 s: the row goes to a waiter while the holder still holds it. The old model
    // sent a fourth probe, found the link up, and kept the session (0 of 200 seeds unsafe).
    let r = assert_as_expected("sql-for-update-keepalive-last-probe", 0..20);
    assert!(found(&r, FindingKind::DoubleHolder) >= 18, "{:?}", r.reasons);
    // Healed before the third probe (at 6.5 s): the probe at 7 s is answered, the session lives.
    let path = common::catalog_dir().join("sql-for-update-keepalive-last-probe.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace("duration = \"7500ms\"", "duration = \"6500ms\"");
    let healed = run(&Scenario::parse("healed.toml", &text, &Registry::builtin()).unwrap(), 0..20);
    assert_eq!(found(&healed, FindingKind::DoubleHolder), 0, "{:?}", healed.reasons);
}

/// pgbouncer's settings without a pooler are refused, naming the key; with one they run, and its
/// timeouts close backends under transaction-scoped locks without a double holder.
#[test]
fn pgbouncer_settings_need_a_pooler_and_its_timeouts_spare_linked_backends() {
    let text =
        std::fs::read_to_string(common::catalog_dir().join("sql-advisory-xact-pgbouncer-timeouts.toml")).unwrap();
    let parse = |text: &str| Scenario::parse("x.toml", text, &Registry::builtin()).map_err(|e| e.to_string());
    let direct = text.replace("pooler = \"transaction\"\n", "");
    let Err(err) = parse(&direct) else { panic!("pgbouncer's settings without a pooler were taken") };
    assert!(err.contains("server_idle_timeout is pgbouncer's") && err.contains("pooler"), "{err}");
    let r = assert_as_expected("sql-advisory-xact-pgbouncer-timeouts", 0..100);
    assert_eq!(found(&r, FindingKind::DoubleHolder), 0);
    // Not for want of closes: backends are closed both ways in every seed looked at.
    let scenario = common::catalog("sql-advisory-xact-pgbouncer-timeouts");
    for seed in 0..5 {
        let run = locksim_scenarios::run::run_seed(&scenario, seed).unwrap();
        let closed = |why: &str| {
            run.history.events.iter().any(|e| matches!(&e.kind, EventKind::Session { state } if state.ends_with(why)))
        };
        assert!(closed("server idle timeout") && closed("server lifetime over"), "seed {seed}");
    }
}
