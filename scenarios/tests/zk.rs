//! The ZooKeeper family's promises: herd counts, the GC-pause warning, and safety under client faults.

mod common;

use common::{assert_as_expected, catalog, drive, herd, Make, Say};
use locksim_locks::params::ParamValue;
use locksim_locks::Servers;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use locksim_sim::ctx::Ctx;
use locksim_sim::history::EventKind;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

#[test]
fn one_release_wakes_every_waiter_of_the_ephemeral_lock_and_one_of_the_queue() {
    for clients in [2, 4, 8, 16, 32, 64] {
        let (flat, linear) = (herd("zk-sequential-herd", clients), herd("zk-ephemeral-herd", clients));
        assert_eq!(flat, 1, "zk.sequential with {clients} clients: each release wakes its successor only");
        // Everyone but the holder waits on /lock; a release wakes them all.
        assert_eq!(linear, clients as u64 - 1, "zk.ephemeral with {clients} clients");
    }
}

#[test]
fn a_pause_past_the_session_timeout_gives_two_holders_for_every_zk_recipe() {
    let every = locksim_locks::zk::RECIPES.iter().map(|r| r.id.trim_start_matches("zk."));
    for recipe in every.filter(|r| *r != "sequential-unprotected") {
        let r = assert_as_expected(&format!("zk-{recipe}-gc-pause"), 0..30);
        assert!(r.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)), "{recipe}");
    }
    for recipe in ["sequential", "rwlock", "leader-election"] {
        let fenced = assert_as_expected(&format!("zk-{recipe}-gc-pause-fencing"), 0..30);
        assert!(fenced.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)), "{recipe}");
        assert!(fenced.results.iter().any(|s| s.counts.contains_key(&FindingKind::StaleWriteRejected)), "{recipe}");
    }
}

#[test]
fn curators_mutex_is_safe_and_fifo_fair_over_1000_seeds_of_client_partitions_and_crashes() {
    let scenario = catalog("zk-sequential-nemesis");
    assert!(scenario.check.fifo, "zk.sequential promises FIFO, so `unfair` is checked");
    assert_as_expected("zk-sequential-nemesis", 0..1000);
}

#[test]
fn curators_mutex_has_no_deadlock_over_1000_seeds_of_client_partitions_and_server_crashes() {
    assert_as_expected("zk-sequential-server-crash-nemesis", 0..1000);
}

#[test]
fn bad_zookeeper_parameters_are_errors_with_their_line() {
    let text = |extra: &str| {
        format!("name = \"t\"\n[recipe]\nid = \"zk.sequential\"\n{extra}\n[workload]\nkind = \"counter\"\nclients = 2\nduration = \"5s\"\n")
    };
    let parse =
        |extra: &str| locksim_scenarios::Scenario::parse("z.toml", &text(extra), &locksim_locks::Registry::builtin());
    let err = parse("session_timout = \"6s\"").err().unwrap().to_string();
    assert!(err.starts_with("z.toml:4:1: unknown key `session_timout`"), "{err}");
    let err = parse("session_timeout = \"0s\"").err().unwrap().to_string();
    assert!(err.contains("session_timeout must be above zero"), "{err}");
    let err = parse("lost_on = \"sometimes\"").err().unwrap().to_string();
    assert!(err.starts_with("z.toml:4:11: lost_on: expected one of \"suspended\", \"lost\", \"never\""), "{err}");
}

/// Two `zk.sequential` locks (two sessions) on one node: reentrancy, and a release by a non-holder.
fn reentrancy(ctx: Ctx, make: Make, say: Say, _: Servers) -> Pin<Box<dyn Future<Output = ()>>> {
    Box::pin(async move {
        let (mut a, mut b) = (make(), make());
        say(format!("a acquire: {:?}", a.acquire().await));
        say(format!("a acquire again: {:?}", a.acquire().await));
        say(format!("b release: {:?}", b.release().await));
        say(format!("a release: {:?}", a.release().await));
        let waiter = async {
            let got = b.acquire().await;
            say(format!("b acquire: {got:?}"));
        };
        let holder = async {
            ctx.sleep(Duration::from_secs(2)).await;
            say("a releases the second time".into());
            say(format!("a release: {:?}", a.release().await));
        };
        tokio::join!(waiter, holder);
    })
}

#[test]
fn curators_mutex_is_reentrant_and_refuses_a_release_by_a_non_holder() {
    let log = drive("zk.sequential", &[], reentrancy);
    let token = log[0].trim_start_matches("a acquire: ").to_string();
    assert!(token.starts_with("Ok(Grant { token: Some("), "{log:?}");
    assert_eq!(log[1], format!("a acquire again: {token}"), "reentrant: the same grant");
    assert_eq!(log[2], "b release: Fail(\"not held by this client\")");
    assert_eq!(log[3], "a release: Ok(())");
    // One release of two: a still holds, so b waits until the second.
    assert_eq!(log[4], "a releases the second time");
    assert_eq!(log[5], "a release: Ok(())");
    assert!(log[6].starts_with("b acquire: Ok(Grant"), "{log:?}");
}

/// Curator's semaphore mutex: a holder that asks again waits for its own lease until its timeout.
fn not_reentrant(_: Ctx, make: Make, say: Say, _: Servers) -> Pin<Box<dyn Future<Output = ()>>> {
    Box::pin(async move {
        let (mut a, mut b) = (make(), make());
        say(format!("a acquire: {:?}", a.acquire().await));
        say(format!("a acquire again: {:?}", a.acquire().await));
        say(format!("a release: {:?}", a.release().await));
        say(format!("b acquire: {:?}", b.acquire().await));
    })
}

#[test]
fn the_semaphore_mutex_is_not_reentrant() {
    let log = drive(
        "zk.semaphore-mutex",
        &[("acquire_timeout", ParamValue::Duration(Duration::from_secs(3)))],
        not_reentrant,
    );
    assert!(log[0].starts_with("a acquire: Ok(Grant"), "{log:?}");
    assert_eq!(log[1], "a acquire again: Fail(\"timed out waiting for a lease\")");
    assert_eq!(log[2], "a release: Ok(())");
    assert!(log[3].starts_with("b acquire: Ok(Grant"), "{log:?}");
}

/// Curator's read-write lock from three clients' side (three sessions on one node).
fn read_write(ctx: Ctx, make: Make, say: Say, _: Servers) -> Pin<Box<dyn Future<Output = ()>>> {
    Box::pin(async move {
        let (mut r1, mut r2, mut w) = (make(), make(), make());
        say(format!("r1 read: {:?}", r1.acquire_shared().await.is_ok()));
        say(format!("r2 read beside r1: {:?}", r2.acquire_shared().await.is_ok()));
        let writer = async {
            let got = w.acquire().await.is_ok();
            say(format!("w write: {got}"));
        };
        let readers = async {
            ctx.sleep(Duration::from_secs(1)).await;
            say("r1 and r2 release".into());
            let _ = (r1.release().await, r2.release().await);
        };
        tokio::join!(writer, readers);
        // A writer may take the read lock too (downgrade) ...
        say(format!("w read while writing: {:?}", w.acquire_shared().await.is_ok()));
        say(format!("w releases both: {:?}", (w.release().await.is_ok(), w.release().await.is_ok())));
        // ... but a reader cannot upgrade: its write node queues behind its own read node.
        say(format!("r1 read: {:?}", r1.acquire_shared().await.is_ok()));
        say(format!("r1 write while reading: {:?}", r1.acquire().await));
    })
}

#[test]
fn the_rwlock_lets_readers_share_keeps_writers_out_and_allows_downgrade_only() {
    let log = drive("zk.rwlock", &[("acquire_timeout", ParamValue::Duration(Duration::from_secs(3)))], read_write);
    assert_eq!(
        log,
        vec![
            "r1 read: true",
            "r2 read beside r1: true",
            "r1 and r2 release",
            "w write: true",
            "w read while writing: true",
            "w releases both: (true, true)",
            "r1 read: true",
            "r1 write while reading: Fail(\"timed out waiting\")",
        ]
    );
}

#[test]
fn rwlock_readers_overlap_in_the_catalog_run_and_nothing_else_does() {
    let scenario = catalog("zk-rwlock-readers-share");
    let mut most_readers = 0;
    for seed in 0..10 {
        let run = run_seed(&scenario, seed).unwrap();
        assert!(run.result.findings.is_empty(), "seed {seed}: {:?}", run.result.findings);
        let mut readers = std::collections::BTreeSet::new();
        for e in &run.history.events {
            match e.kind {
                EventKind::AcquireOk { shared: true, .. } => {
                    readers.insert(e.node);
                    most_readers = most_readers.max(readers.len());
                }
                EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                    readers.remove(&e.node);
                }
                _ => {}
            }
        }
    }
    assert!(most_readers >= 3, "readers should share the lock; at most {most_readers} held it together");
}

#[test]
fn the_rwlock_is_safe_under_short_partitions_and_crashes() {
    // The election's nemesis is pinned at 1000 seeds in the catalog test: never two leaders (its
    // `absent` list), and a few seeds stall on a candidate that stopped with its node queued.
    assert_as_expected("zk-rwlock-nemesis", 0..1000);
}

/// One client, cut off from ZooKeeper at 10 s for 10 s, with a 6 s session (read timeout 4 s).
fn cut_off_client() -> locksim_scenarios::Scenario {
    let text =
        "name = \"t\"\n[recipe]\nid = \"zk.sequential\"\nsession_timeout = \"6s\"\n[workload]\nkind = \"counter\"\n\
                clients = 1\nduration = \"30s\"\n[[faults.schedule]]\nat = \"10s\"\nkind = \"partition\"\n\
                target = \"client-0\"\npeers = [\"zk-0\"]\nduration = \"10s\"\n[check]\ndeadlock = false\n";
    locksim_scenarios::Scenario::parse("t.toml", text, &locksim_locks::Registry::builtin()).unwrap()
}

#[test]
fn the_client_is_disconnected_the_moment_its_read_timeout_passes_in_silence() {
    for seed in 0..20 {
        let run = run_seed(&cut_off_client(), seed).unwrap();
        let t = run
            .history
            .events
            .iter()
            .find(|e| matches!(&e.kind, EventKind::Session { state } if state == "disconnected"))
            .map(|e| e.t as f64 / 1e9)
            .expect("disconnected");
        // An idle client pings every readTimeout/2 − 1 s = 1 s, so the last word came at most ~1 s
        // before the cut; the read timeout (4 s) after it, not at the next T/3 tick.
        assert!((13.0..=14.05).contains(&t), "seed {seed}: disconnected at {t} s");
    }
}

#[test]
fn a_resumed_holder_writes_before_it_hears_that_its_connection_is_gone() {
    // lost_on = "suspended": the holder gives up on SUSPENDED, yet the write it was about to make when
    // the pause ended goes first (kazoo on a real ZooKeeper: first in 8 of 10 runs).
    let r = common::run(&catalog("zk-sequential-gc-pause"), 0..100);
    let late_writes = r.results.iter().filter(|s| s.counts.contains_key(&FindingKind::UnsafeWrite)).count();
    assert!(late_writes >= 75, "the resumed holder's write came first in only {late_writes} of 100 seeds");
}

#[test]
fn the_semaphore_removes_its_watchers_so_a_grant_costs_two_wake_ups_not_three() {
    // One wake for the lease, one for the internal mutex; a lease granted at once used to leave a child
    // watch behind that woke its holder at the next change (Curator removes it in `finally`).
    let r = common::run(&catalog("zk-semaphore-mutex-herd"), 0..10);
    let (notified, acquired) =
        r.results.iter().fold((0, 0), |(n, a), s| (n + s.measurements.notifications, a + s.measurements.acquisitions));
    let per_grant = notified as f64 / acquired as f64;
    assert!(per_grant < 2.1, "{per_grant} wake-ups per grant");
}

/// Two clients of `recipe`: the first to take the lock holds it 20 s while the other waits; ZooKeeper
/// restarts at 5 s, resetting both connections (sessions and watches survive on the server).
fn waiter_across_a_restart(recipe: &str) -> locksim_scenarios::Scenario {
    let text = format!(
        "name = \"t\"\n[recipe]\nid = \"{recipe}\"\nsession_timeout = \"6s\"\n[workload]\nkind = \"counter\"\n\
         clients = 2\nduration = \"40s\"\nhold = [\"20s\", \"20s\"]\nthink = [\"0ms\", \"0ms\"]\n\
         [[faults.schedule]]\nat = \"5s\"\nkind = \"crash\"\ntarget = \"zk-0\"\nduration = \"1s\"\n\
         [check]\ndeadlock = false\n"
    );
    locksim_scenarios::Scenario::parse("t.toml", &text, &locksim_locks::Registry::builtin()).unwrap()
}

#[test]
fn a_go_zookeeper_waiter_keeps_its_watch_through_a_disconnection() {
    for seed in 0..10 {
        let run = run_seed(&waiter_across_a_restart("zk.leader-election"), seed).unwrap();
        let h = &run.history;
        let holder = h.events.iter().find(|e| matches!(e.kind, EventKind::AcquireOk { .. })).unwrap().node;
        let waiter = if h.name(holder) == "client-0" { "client-1" } else { "client-0" };
        let of_waiter = |e: &&locksim_sim::history::Event| h.name(e.node) == waiter;
        let disconnected = h
            .events
            .iter()
            .filter(of_waiter)
            .any(|e| matches!(&e.kind, EventKind::Session { state } if state == "disconnected"));
        assert!(disconnected, "seed {seed}: the restart reset the waiter's connection");
        // go-zookeeper closes a watch only when the session expires: the candidate waits on, and leads
        // once the holder resigns, without ever stopping (it used to stop, its node left queued).
        let stopped = h.events.iter().filter(of_waiter).any(|e| matches!(e.kind, EventKind::AcquireFail { .. }));
        assert!(!stopped, "seed {seed}: the waiter gave up on a disconnection");
        let led = h
            .events
            .iter()
            .filter(of_waiter)
            .any(|e| e.t > 20_000_000_000 && matches!(e.kind, EventKind::AcquireOk { .. }));
        assert!(led, "seed {seed}: the waiter leads after the holder resigns");
    }
}

#[test]
fn each_seed_draws_the_phase_of_the_session_trackers_ticks() {
    // ZooKeeper expires sessions on the multiples of tickTime (2 s) of the host's monotonic clock, which
    // counts from its boot: before, every seed's buckets fell on the multiples of 2 s from t = 0.
    let scenario = catalog("zk-ephemeral-gc-pause");
    let expired: Vec<u64> = (0..24)
        .filter_map(|seed| {
            let run = run_seed(&scenario, seed).unwrap();
            let by_server =
                |k: &EventKind| matches!(k, EventKind::Session { state } if state == "expired by the server");
            run.history.events.iter().find(|e| by_server(&e.kind)).map(|e| e.t / 1_000_000)
        })
        .collect();
    assert!(expired.len() >= 20, "the paused holder's session expires in most seeds: {expired:?}");
    let phases: std::collections::BTreeSet<u64> = expired.iter().map(|ms| ms % 2_000 / 200).collect();
    assert!(phases.len() >= 6, "expiries spread over the 2 s between ticks: {expired:?}");
}

/// The epochs (the zxid's high 32 bits) of the nodes `client` was granted the lock on after `from_s`.
fn grant_epochs(run: &locksim_scenarios::run::SeedRun, client: &str, from_s: u64) -> Vec<u64> {
    let node = run.history.nodes.iter().position(|n| n == client).expect("client");
    let events = run.history.events.iter().filter(|e| e.node.0 as usize == node && e.t >= from_s * 1_000_000_000);
    events
        .filter_map(|e| match e.kind {
            EventKind::AcquireOk { token, .. } => token.map(|t| t >> 32),
            _ => None,
        })
        .collect()
}

#[test]
fn curator_4_0_takes_the_old_sessions_node_after_an_injected_expiry_and_4_2_makes_another() {
    // Seed 1 of the catalog pair: client-1's create (epoch 1) is logged as the ensemble goes down; its
    // handle gives the session up 4 s later and opens a new one once the ensemble is back (epoch 2).
    let (bug, fix) = (catalog("zk-ensemble-curator-498"), catalog("zk-ensemble-curator-498-fixed"));
    let (bug, fix) = (run_seed(&bug, 1).unwrap(), run_seed(&fix, 1).unwrap());
    let sessions = |run: &locksim_scenarios::run::SeedRun| {
        let node = run.history.nodes.iter().position(|n| n == "client-1").unwrap();
        run.history
            .events
            .iter()
            .filter(|e| e.node.0 as usize == node)
            .filter_map(|e| match &e.kind {
                EventKind::Session { state } => Some(state.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    for run in [&bug, &fix] {
        let states = sessions(run);
        let expired = states.iter().position(|s| s == "expired").expect("the injected expiry");
        assert_eq!(states[expired - 1], "disconnected", "{states:?}");
        assert_eq!(states[expired + 1], "connected", "a new session after the injected expiry: {states:?}");
        // The old session was given up without a word: the server expires it later, on its own.
        assert!(states[expired + 2..].iter().any(|s| s == "expired by the server"), "{states:?}");
    }
    // 4.0: the first grant after the outage is on the node created before it, in the old session.
    assert_eq!(grant_epochs(&bug, "client-1", 6).first(), Some(&1), "4.0 adopts the epoch-1 node");
    assert!(bug.result.findings.iter().any(|f| f.kind == FindingKind::DoubleHolder), "{:?}", bug.result.findings);
    // 4.2: the session changed since the first attempt: the node found is deleted and a new one made.
    assert!(grant_epochs(&fix, "client-1", 6).first().is_some_and(|e| *e >= 2), "4.2 creates anew");
    assert!(fix.result.findings.is_empty(), "{:?}", fix.result.findings);
}
