//! The etcd family's promises: herd counts, lease expiry, recovery within the TTL, the 3.4.x bug, and
//! safety under client faults.

mod common;

use common::{assert_as_expected, catalog, drive, herd, run, Make, Say};
use locksim_locks::Servers;
use locksim_scenarios::checkers::FindingKind;
use locksim_sim::ctx::Ctx;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

#[test]
fn fail_fast_wakes_nobody_watch_and_retry_wakes_everyone_and_the_mutex_one() {
    for clients in [2, 4, 8, 16, 32, 64] {
        assert_eq!(herd("etcd-txn-lease-herd", clients), 0, "etcd.txn-lease with {clients} clients: nobody waits");
        assert_eq!(herd("etcd-mutex-herd", clients), 1, "etcd.mutex with {clients} clients: the next key only");
        // Everyone but the holder watches the one key.
        assert_eq!(herd("etcd-txn-lease-wait-herd", clients), clients as u64 - 1, "etcd.txn-lease-wait, {clients}");
    }
}

#[test]
fn a_lease_lost_during_a_long_critical_section_gives_two_holders_and_fencing_stops_the_write() {
    for stem in ["etcd-txn-lease-gc-pause", "etcd-txn-lease-partition", "etcd-election-gc-pause"] {
        let r = assert_as_expected(stem, 0..30);
        assert!(r.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)), "{stem}");
    }
    for stem in ["etcd-txn-lease-gc-pause-fencing", "etcd-mutex-gc-pause-fencing"] {
        let r = assert_as_expected(stem, 0..30);
        assert!(r.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)), "{stem}");
        assert!(r.results.iter().any(|s| s.counts.contains_key(&FindingKind::StaleWriteRejected)), "{stem}");
    }
}

#[test]
fn the_mutex_is_safe_and_fifo_fair_over_1000_seeds_of_client_crashes_and_short_partitions() {
    assert!(catalog("etcd-mutex-nemesis").check.fifo, "etcd.mutex promises FIFO, so `unfair` is checked");
    assert_as_expected("etcd-mutex-nemesis", 0..1000);
}

#[test]
fn the_mutex_has_neither_deadlock_nor_herd_over_1000_seeds_of_client_partitions_and_server_crashes() {
    assert!(catalog("etcd-mutex-server-crash-nemesis").check.herd_max == Some(1));
    assert_as_expected("etcd-mutex-server-crash-nemesis", 0..1000);
}

#[test]
fn a_crashed_holder_frees_the_lock_within_the_lease_ttl_and_never_before() {
    let scenario = catalog("etcd-mutex-crash");
    let ttl_ms = 5_000.0;
    let r = run(&scenario, 0..50);
    assert!(r.as_expected, "{:?}", r.reasons);
    let recoveries: Vec<f64> = r.results.iter().flat_map(|s| s.measurements.recovery_ms.clone()).collect();
    assert!(recoveries.len() >= 40, "most seeds crash a holder: {}", recoveries.len());
    for ms in recoveries {
        // Keep-alives renew the lease TTL/3 after the last, at the loop's next look (every 500 ms), so
        // it expires between 2/3·TTL − 500 ms and TTL after the crash; the server looks for expired
        // leases every 500 ms, and the next waiter needs a round trip.
        assert!(ms >= ttl_ms * 2.0 / 3.0 - 500.0, "granted {ms} ms after the crash: before the lease could expire");
        assert!(ms <= ttl_ms + 600.0, "granted {ms} ms after the crash: later than the TTL");
    }
}

#[test]
fn the_mutex_of_etcd_3_4_3_grants_an_expired_waiter_and_the_fix_all_but_closes_it() {
    let count = |stem: &str| {
        let r = run(&catalog(stem), 0..100);
        r.results.iter().filter(|s| s.counts.contains_key(&FindingKind::DoubleHolder)).count()
    };
    let (before, after) = (count("etcd-mutex-waiter-pause-3.4"), count("etcd-mutex-waiter-pause"));
    assert!(before >= 90, "3.4.x: two holders in {before} of 100 seeds");
    assert!(after <= 5, "with the recheck: two holders in {after} of 100 seeds");
    // Campaign never got the recheck.
    assert_as_expected("etcd-election-waiter-pause", 0..20);
}

#[test]
fn bad_etcd_parameters_are_errors_with_their_line() {
    let text = |extra: &str| {
        format!("name = \"t\"\n[recipe]\nid = \"etcd.mutex\"\n{extra}\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \"5s\"\n")
    };
    let parse =
        |extra: &str| locksim_scenarios::Scenario::parse("e.toml", &text(extra), &locksim_locks::Registry::builtin());
    let err = parse("tll = \"5s\"").err().unwrap().to_string();
    assert!(err.starts_with("e.toml:4:1: unknown key `tll`"), "{err}");
    let err = parse("ttl = \"2500ms\"").err().unwrap().to_string();
    assert!(err.contains("ttl: etcd leases last whole seconds"), "{err}");
    let err = parse("ttl = \"0s\"").err().unwrap().to_string();
    assert!(err.contains("ttl: etcd leases last whole seconds"), "{err}");
    let err = parse("recheck = \"yes\"").err().unwrap().to_string();
    assert!(err.starts_with("e.toml:4:11: recheck: expected"), "{err}");
}

/// Two candidates take turns while a follower observes the election.
fn election(ctx: Ctx, make: Make, say: Say, servers: Servers) -> Pin<Box<dyn Future<Output = ()>>> {
    Box::pin(async move {
        let follower = locksim_locks::etcd::connect(&ctx, &servers, Duration::from_secs(5));
        let observer = async {
            let watching = say.clone();
            locksim_locks::etcd::observe(&follower, move |kv| watching(format!("observed {}", kv.key))).await;
        };
        let candidates = async {
            let (mut a, mut b) = (make(), make());
            say(format!("a campaigns: {}", a.acquire().await.is_ok()));
            let b_campaigns = async { say(format!("b leads: {}", b.acquire().await.is_ok())) };
            let a_resigns = async {
                ctx.sleep(Duration::from_secs(1)).await;
                say(format!("a resigns: {}", a.release().await.is_ok()));
            };
            tokio::join!(b_campaigns, a_resigns);
            say(format!("b resigns: {}", b.release().await.is_ok()));
        };
        tokio::select! {
            () = observer => {}
            () = candidates => {}
        }
        ctx.sleep(Duration::from_millis(100)).await;
    })
}

#[test]
fn a_follower_observes_each_leader_in_turn() {
    let log = drive("etcd.election", &[], election);
    // The follower sees a's key (lease 1) as soon as it is put, and b's once a resigns. b's campaign
    // returns when its own watch sees a's key go: the follower's watch may hear of b's key first or
    // second, as two clients' watches do.
    let at = |line: &str| log.iter().position(|l| l == line).unwrap_or_else(|| panic!("{line:?} in {log:?}"));
    assert_eq!(log.len(), 6, "{log:?}");
    assert_eq!(&log[..3], ["observed /election/1", "a campaigns: true", "a resigns: true"]);
    assert!(at("a resigns: true") < at("b leads: true"), "{log:?}");
    assert!(at("a resigns: true") < at("observed /election/2"), "{log:?}");
    assert_eq!(log[5], "b resigns: true");
}

/// The times (ms into the run) at which the server revoked a lease, in `stem` (a catalog scenario, or
/// `real/<name>`) over `seeds`: the first revocation of each seed.
fn first_revocations_ms(path: &std::path::Path, seeds: std::ops::Range<u64>) -> Vec<u64> {
    use locksim_scenarios::run::run_seed;
    use locksim_sim::history::EventKind;
    let scenario = locksim_scenarios::Scenario::load(path, &locksim_locks::Registry::builtin()).unwrap();
    seeds
        .filter_map(|seed| {
            let run = run_seed(&scenario, seed).unwrap();
            let revoked =
                |k: &EventKind| matches!(k, EventKind::Session { state } if state.contains("expired by the server"));
            run.history.events.iter().find(|e| revoked(&e.kind)).map(|e| e.t / 1_000_000)
        })
        .collect()
}

#[test]
fn each_seed_draws_when_the_lessor_looks_for_expired_leases() {
    // Real etcd granted the next holder of builtin-etcd-mutex-pause 3.80–4.14 s into the run; the model,
    // whose lessor looked on the multiples of 500 ms from t = 0 in every seed, always at 4.01–4.04 s.
    let path = common::catalog_dir().join("../real/builtin-etcd-mutex-pause.toml");
    let revoked = first_revocations_ms(&path, 0..24);
    assert!(revoked.len() >= 20, "the paused holder's lease is revoked in most seeds: {revoked:?}");
    let phases: std::collections::BTreeSet<u64> = revoked.iter().map(|ms| ms % 500 / 50).collect();
    assert!(phases.len() >= 6, "revocations spread over the 500 ms between looks: {revoked:?}");
}
