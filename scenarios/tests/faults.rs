//! Each fault kind does what it says, seen through the history of a small scenario.

use locksim_locks::Registry;
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::{run_seed, SeedRun};
use locksim_scenarios::Scenario;
use locksim_sim::history::EventKind;

/// A 3-client `redis.set-nx-px` scenario (TTL 5 s, 30 s) with `extra` appended (faults, overrides).
fn scenario(recipe_extra: &str, extra: &str) -> Scenario {
    let text = format!(
        "name = \"t\"\n[recipe]\nid = \"redis.set-nx-px\"\nttl = \"5s\"\n{recipe_extra}\n\
         [workload]\nkind = \"counter\"\nclients = 3\nduration = \"30s\"\n{extra}\n[check]\ndeadlock = false\n"
    );
    Scenario::parse("t.toml", &text, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

fn run(s: &Scenario, seed: u64) -> SeedRun {
    run_seed(s, seed).unwrap()
}

/// Seconds of simulated time of every `AcquireOk`.
fn grants(r: &SeedRun) -> Vec<f64> {
    let ok = |e: &&locksim_sim::history::Event| matches!(e.kind, EventKind::AcquireOk { .. });
    r.history.events.iter().filter(ok).map(|e| e.t as f64 / 1e9).collect()
}

#[test]
fn a_partitioned_server_grants_nothing_until_it_heals() {
    let s = scenario(
        "",
        "[[faults.schedule]]\nat = \"10s\"\nkind = \"partition\"\ntarget = \"redis-0\"\nduration = \"8s\"\n",
    );
    for seed in 0..5 {
        let r = run(&s, seed);
        // A grant decided just before 10 s may still be on its way back; none can start inside.
        assert!(grants(&r).iter().all(|t| !(10.05..18.0).contains(t)), "seed {seed}: {:?}", grants(&r));
        assert!(grants(&r).iter().any(|t| *t > 18.0), "seed {seed}: it heals");
    }
}

#[test]
fn partition_with_peers_cuts_only_those_links() {
    let s = scenario(
        "",
        "[[faults.schedule]]\nat = \"0s\"\nkind = \"partition\"\ntarget = \"client-0\"\npeers = [\"redis-0\"]\n",
    );
    let r = run(&s, 1);
    let by = |name: &str| r.history.events.iter().filter(|e| r.history.name(e.node) == name).count();
    let oks = |name: &str| {
        let node = r.history.nodes.iter().position(|n| n == name).unwrap() as u32;
        r.history.events.iter().filter(|e| e.node.0 == node && matches!(e.kind, EventKind::AcquireOk { .. })).count()
    };
    assert_eq!(oks("client-0"), 0, "client-0 cannot reach redis-0");
    assert!(by("client-0") > 0 && oks("client-1") > 0 && oks("client-2") > 0);
}

#[test]
fn clogging_a_servers_replies_makes_its_clients_time_out() {
    let s =
        scenario("", "[[faults.schedule]]\nat = \"5s\"\nkind = \"clog\"\ntarget = \"redis-0\"\nduration = \"10s\"\n");
    let r = run(&s, 2);
    let unknown = r.history.events.iter().filter(|e| matches!(e.kind, EventKind::AcquireUnknown { .. })).count();
    assert!(unknown > 0, "requests arrive, replies do not: outcomes are unknown");
}

#[test]
fn delay_raises_acquisition_latency() {
    let calm = scenario("", "");
    let slow =
        scenario("", "[[faults.schedule]]\nat = \"0s\"\nkind = \"delay\"\ntarget = \"redis-0\"\nlatency = \"200ms\"\n");
    let (a, b) = (run(&calm, 3).result.measurements, run(&slow, 3).result.measurements);
    assert!(b.latency_ms_p50 > a.latency_ms_p50 + 300.0, "{} vs {}", a.latency_ms_p50, b.latency_ms_p50);
}

#[test]
fn loss_makes_some_calls_time_out_but_not_all() {
    let s = scenario("", "[[faults.schedule]]\nat = \"0s\"\nkind = \"loss\"\ntarget = \"redis-0\"\nrate = 0.3\n");
    let r = run(&s, 4);
    let count = |f: fn(&EventKind) -> bool| r.history.events.iter().filter(|e| f(&e.kind)).count();
    assert!(count(|k| matches!(k, EventKind::AcquireUnknown { .. } | EventKind::ReleaseUnknown { .. })) > 0);
    // A lost SET reply leaves a key that blocks everyone until its TTL, so grants are few, not none.
    assert!(count(|k| matches!(k, EventKind::AcquireOk { .. })) > 3);
}

#[test]
fn a_fast_server_clock_expires_locks_early() {
    // Holds of 3-4 s under a 5 s TTL are safe; a server clock running at 2x makes the TTL 2.5 s.
    let hold = "hold = [\"3s\", \"4s\"]\n";
    let calm = scenario("", hold);
    let drift = scenario(
        "",
        &format!("{hold}[[faults.schedule]]\nat = \"0s\"\nkind = \"clock-drift\"\ntarget = \"redis-0\"\nrate = 2.0\n"),
    );
    let found = |s: &Scenario| (0..5).any(|seed| run(s, seed).result.counts.contains_key(&FindingKind::DoubleHolder));
    assert!(!found(&calm));
    assert!(found(&drift));
}

#[test]
fn a_crashed_client_restarts_and_takes_part_again() {
    let s = scenario("", "[[faults.schedule]]\nat = \"5s\"\nkind = \"crash\"\ntarget = \"client-1\"\n\n[[faults.schedule]]\nat = \"10s\"\nkind = \"restart\"\ntarget = \"client-1\"\n");
    let r = run(&s, 5);
    let client1 = r.history.nodes.iter().position(|n| n == "client-1").unwrap() as u32;
    let invokes: Vec<f64> = r
        .history
        .events
        .iter()
        .filter(|e| e.node.0 == client1 && matches!(e.kind, EventKind::AcquireInvoke))
        .map(|e| e.t as f64 / 1e9)
        .collect();
    assert!(invokes.iter().all(|t| !(5.0..10.0).contains(t)), "a dead client does nothing");
    assert!(invokes.iter().any(|t| *t >= 10.0), "the restarted client runs its program again");
}

#[test]
fn a_crash_of_a_client_already_down_is_skipped_and_does_not_restart_it_early() {
    let crash = |at: &str, duration: &str| {
        format!("[[faults.schedule]]\nat = \"{at}\"\nkind = \"crash\"\ntarget = \"client-1\"\nduration = \"{duration}\"\n\n")
    };
    let s = scenario("", &(crash("5s", "5s") + &crash("6s", "1s")));
    let r = run(&s, 5);
    let client1 = r.history.nodes.iter().position(|n| n == "client-1").unwrap() as u32;
    let mine = |e: &&locksim_sim::history::Event| e.node.0 == client1;
    let skipped = r
        .history
        .events
        .iter()
        .filter(mine)
        .any(|e| matches!(&e.kind, EventKind::FaultSkipped { reason, .. } if reason == "client-1 is already down"));
    assert!(skipped, "the second crash finds client-1 down");
    let invokes = r.history.events.iter().filter(mine).filter(|e| matches!(e.kind, EventKind::AcquireInvoke));
    assert!(invokes.map(|e| e.t as f64 / 1e9).all(|t| !(5.0..10.0).contains(&t)), "down until its own crash ends");
}

#[test]
fn a_fault_aimed_at_the_holder_is_skipped_when_nobody_holds() {
    // Nobody can take a lock when Redis is unreachable; the pause finds no holder.
    let s = scenario(
        "",
        "[[faults.schedule]]\nat = \"0s\"\nkind = \"partition\"\ntarget = \"redis-0\"\n\n\
         [[faults.schedule]]\nat = \"5s\"\nkind = \"pause\"\ntarget = \"holder\"\nduration = \"1s\"\n",
    );
    let r = run(&s, 6);
    assert!(r.history.events.iter().any(|e| matches!(e.kind, EventKind::FaultSkipped { .. })));
}
