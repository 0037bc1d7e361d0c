//! The ZooKeeper family's promises: herd counts, the GC-pause warning, and safety under client faults.

mod common;

use common::{assert_as_expected, catalog};
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::run_seed;
use std::time::Duration;

/// The most clients one release woke, for `stem` with `clients` clients.
fn herd(stem: &str, clients: usize) -> u64 {
    let mut s = catalog(stem);
    s.workload.clients = clients;
    s.workload.duration = Duration::from_secs(20);
    s.check.herd_max = None;
    run_seed(&s, 1).unwrap().result.measurements.notifications_per_release_max
}

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
    for stem in ["zk-sequential-gc-pause", "zk-ephemeral-gc-pause", "zk-semaphore-mutex-gc-pause"] {
        let r = assert_as_expected(stem, 0..30);
        assert!(r.results.iter().any(|s| s.counts.contains_key(&FindingKind::DoubleHolder)), "{stem}");
    }
    let fenced = assert_as_expected("zk-sequential-gc-pause-fencing", 0..30);
    assert!(fenced.results.iter().all(|s| !s.counts.contains_key(&FindingKind::UnsafeWrite)));
}

#[test]
fn curators_mutex_is_safe_and_fifo_fair_over_1000_seeds_of_client_partitions_and_crashes() {
    let scenario = catalog("zk-sequential-nemesis");
    assert!(scenario.check.fifo, "zk.sequential promises FIFO, so `unfair` is checked");
    assert_as_expected("zk-sequential-nemesis", 0..1000);
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

/// Drive two `zk.sequential` locks (two sessions) on one node in a hand-built world; returns the log.
fn reentrancy_log() -> Vec<String> {
    use locksim_locks::params::Params;
    use locksim_locks::Registry;
    use locksim_sim::ctx::Ctx;
    use locksim_sim::net::Rpc;
    use locksim_sim::world::{Program, World};
    use std::rc::Rc;
    use std::sync::{Arc, Mutex};

    let log = Arc::new(Mutex::new(Vec::new()));
    let spec = *Registry::builtin().get("zk.sequential").unwrap();
    let shared = log.clone();
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let servers = (spec.family.deploy)(&mut world, &Params::resolve(spec.family.params, []));
        let params = Params::resolve(spec.params, []);
        let program: Program = Arc::new(move |env| {
            let (servers, params, log) = (servers.clone(), params.clone(), shared.clone());
            Box::pin(async move {
                let ctx = Ctx::new(&env, Rc::new(Rpc::bind(&env)));
                let say = |what: String| log.lock().unwrap().push(what);
                let mut a = (spec.build)(&params, ctx.clone(), &servers);
                let mut b = (spec.build)(&params, ctx.clone(), &servers);
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
        });
        world.add_node("client-0", program);
        world.run(&[], Duration::from_secs(20)).await;
    });
    let log = log.lock().unwrap().clone();
    log
}

#[test]
fn curators_mutex_is_reentrant_and_refuses_a_release_by_a_non_holder() {
    let log = reentrancy_log();
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
