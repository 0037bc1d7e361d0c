//! Aimed faults: `on = "<event>"` starts a fault when the history records a client event, and
//! `[faults.random] aim = true` draws such triggers.

use locksim_locks::Registry;
use locksim_scenarios::run::{resolve_schedule, run_seed};
use locksim_scenarios::scenario::Verdict;
use locksim_scenarios::Scenario;
use locksim_sim::fault::{FaultKind, Target, TriggerEvent};
use locksim_sim::history::EventKind;

/// A 3-client `redis.set-nx-px` scenario (TTL 2 s, 20 s) with `faults` appended.
fn scenario(faults: &str) -> Scenario {
    Scenario::parse("t.toml", &text(faults), &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

fn text(faults: &str) -> String {
    format!(
        "name = \"t\"\n[recipe]\nid = \"redis.set-nx-px\"\nttl = \"2s\"\n\
         [workload]\nkind = \"counter\"\nclients = 3\nduration = \"20s\"\n{faults}\n[check]\nliveness = \"10s\"\n"
    )
}

fn error(faults: &str) -> String {
    match Scenario::parse("t.toml", &text(faults), &Registry::builtin()) {
        Ok(_) => panic!("accepted: {faults}"),
        Err(e) => e.to_string(),
    }
}

const PAUSE_ON_GRANT: &str =
    "[[faults.schedule]]\non = \"acquire-ok\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"5s\"\n";

#[test]
fn on_nth_and_client_are_parsed() {
    let s = scenario(
        "[[faults.schedule]]\nat = \"3s\"\non = \"enter\"\nnth = 2\nclient = \"client-1\"\nkind = \"crash\"\n\
         target = \"trigger\"\nduration = \"1s\"\n",
    );
    let f = &s.schedule[0];
    let on = f.on.as_ref().unwrap();
    assert_eq!((on.event, on.nth, on.client.as_deref()), (TriggerEvent::Enter, 2, Some("client-1")));
    assert_eq!((f.at.as_secs(), &f.target), (3, &Target::Trigger));
    assert_eq!(locksim_scenarios::run::describe(f), "at 3s on enter #2 of client-1 crash trigger restart after 1s");
    assert_eq!(scenario(PAUSE_ON_GRANT).schedule[0].at.as_secs(), 0, "armed from the start by default");
}

#[test]
fn bad_triggers_are_refused_with_their_line() {
    let cases = [
        (
            "on = \"grant\"",
            "t.toml:10:6: on: unknown event \"grant\"; expected one of: acquire, acquire-ok, enter, release, lock-lost, \
             lease-expired, leader-change, read-index, redis-set-nx-expire, lease-renew, redlock-majority, zk-queue-create, \
             etcd-mutex-checked",
        ),
        (
            "on = \"leader-change\"",
            "t.toml:10:6: on: \"leader-change\" comes from a ZooKeeper ensemble or an etcd cluster, and this \
             scenario's servers elect no leader: set [backend] servers = 3 (docs/ensembles.md)",
        ),
        (
            "on = \"read-index\"",
            "t.toml:10:6: on: \"read-index\" comes from an etcd cluster's leader, and this scenario has none: use \
             the etcd family with [backend] servers = 3 (docs/ensembles.md)",
        ),
        ("on = \"enter\"\nnth = 0", "t.toml:11:7: nth: expected a whole number from 1 to 1000000"),
        ("on = \"enter\"\nclient = \"client-7\"", "t.toml:11:10: client: no client \"client-7\" in this scenario"),
        ("nth = 2", "t.toml:10:7: nth, client and after choose the event of `on`"),
        (
            "on = \"etcd-mutex-checked\"",
            "t.toml:10:6: on: \"etcd-mutex-checked\" is a point inside etcd.mutex, and this scenario's recipe is \
             redis.set-nx-px: it would never start",
        ),
        (
            "on = \"lease-renew\"",
            "t.toml:10:6: on: \"lease-renew\" is a point inside redis.watchdog, zk.ephemeral, zk.sequential, \
             zk.sequential-unprotected, zk.rwlock, zk.semaphore-mutex, zk.leader-election, etcd.txn-lease, \
             etcd.txn-lease-wait, etcd.mutex, etcd.election, and this scenario's recipe is redis.set-nx-px: it would \
             never start",
        ),
        ("at = \"30s\"\non = \"enter\"", "t.toml:10:6: at: the run lasts 20s; a trigger armed at 30s would never fire"),
    ];
    for (keys, want) in cases {
        let got =
            error(&format!("[[faults.schedule]]\n{keys}\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"1s\"\n"));
        assert!(got.starts_with(want), "{keys}:\n got {got}\nwant {want}");
    }
    let got = error("[[faults.schedule]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"1s\"\n");
    assert!(
        got.starts_with(
            "t.toml:12:10: target: \"trigger\" means the node whose event started the fault; it needs `on`"
        ),
        "{got}"
    );
    let got = error("[[faults.schedule]]\nkind = \"pause\"\ntarget = \"client-0\"\nduration = \"1s\"\n");
    assert!(got.contains("needs `at`"), "{got}");
}

#[test]
fn a_pause_on_the_grant_outlasting_the_ttl_is_caught_in_every_seed_a_timed_one_is_not() {
    let aimed = scenario(PAUSE_ON_GRANT);
    let timed =
        scenario("[[faults.schedule]]\nat = \"5s\"\nkind = \"pause\"\ntarget = \"client-0\"\nduration = \"5s\"\n");
    let seeds = 0..20;
    let caught = |s: &Scenario| {
        seeds.clone().filter(|seed| run_seed(s, *seed).unwrap().result.verdict == Verdict::Unsafe).count()
    };
    assert_eq!(caught(&aimed), 20, "the holder is paused the moment it is granted, for more than the TTL");
    assert!(caught(&timed) < 20, "a pause at a fixed time misses when its target does not hold the lock");
}

#[test]
fn the_fault_starts_at_the_instant_of_its_event_on_that_client() {
    let s = scenario(
        "[[faults.schedule]]\nat = \"4s\"\non = \"release\"\nnth = 2\nclient = \"client-2\"\nkind = \"pause\"\n\
         target = \"trigger\"\nduration = \"1s\"\n",
    );
    let r = run_seed(&s, 1).unwrap();
    let h = &r.history;
    let start = h.events.iter().position(|e| matches!(e.kind, EventKind::FaultStart { .. })).expect("it fired");
    let client2 = h.nodes.iter().position(|n| n == "client-2").unwrap() as u32;
    let releases: Vec<usize> = (0..start)
        .filter(|i| h.events[*i].node.0 == client2 && h.events[*i].kind == EventKind::ReleaseInvoke)
        .filter(|i| h.events[*i].t >= 4_000_000_000)
        .collect();
    assert_eq!(releases.len(), 2, "the second release of client-2 after 4 s fires it");
    let (release, fault) = (&h.events[releases[1]], &h.events[start]);
    // The same instant but for madsim's step of task scheduling (well under a message's 1 ms latency).
    assert!(fault.t - release.t < 1_000, "{} ns after its event", fault.t - release.t);
    assert_eq!(fault.node, release.node, "aimed at the trigger's node");
    let end = h.events.iter().find(|e| matches!(e.kind, EventKind::FaultEnd { .. })).unwrap();
    assert!((1_000_000_000..1_000_001_000).contains(&(end.t - fault.t)), "lasts its duration from the event");
}

/// The reasons of the faults a run skipped.
fn skipped(history: &locksim_sim::history::History) -> Vec<&str> {
    let reasons = history.events.iter().filter_map(|e| match &e.kind {
        EventKind::FaultSkipped { reason, .. } => Some(reason.as_str()),
        _ => None,
    });
    reasons.collect()
}

#[test]
fn after_delays_the_fault_from_its_event_and_one_due_past_the_end_is_skipped() {
    let faults = |after: &str| {
        format!(
            "[[faults.schedule]]\nat = \"4s\"\non = \"release\"\nclient = \"client-2\"\nafter = \"{after}\"\n\
             kind = \"pause\"\ntarget = \"trigger\"\nduration = \"1s\"\n"
        )
    };
    let (now, later) = (scenario(&faults("0ms")), scenario(&faults("250ms")));
    assert_eq!(later.schedule[0].on.as_ref().unwrap().after.as_millis(), 250);
    assert_eq!(
        locksim_scenarios::run::describe(&later.schedule[0]),
        "at 4s on release of client-2 + 250ms pause trigger for 1s"
    );
    let start = |s: &Scenario| {
        let h = run_seed(s, 1).unwrap().history;
        let client2 = h.nodes.iter().position(|n| n == "client-2").unwrap() as u32;
        let release =
            h.events.iter().find(|e| e.node.0 == client2 && e.kind == EventKind::ReleaseInvoke && e.t >= 4_000_000_000);
        let fault = h.events.iter().find(|e| matches!(e.kind, EventKind::FaultStart { .. })).expect("it started");
        assert_eq!(fault.node.0, client2, "aimed at the trigger's node, however late");
        fault.t - release.expect("client-2 released after 4 s").t
    };
    assert!(start(&now) < 1_000, "at once without `after`");
    // The same run up to the event (its trigger fired at the same instant), then 250 ms of it.
    assert!((250_000_000..250_001_000).contains(&start(&later)), "{} ns after its event", start(&later));
    let r = run_seed(&scenario(&faults("1h")), 1).unwrap();
    assert_eq!(skipped(&r.history), ["release of client-2 + 1h came as the run ended"]);
    let got = error("[[faults.schedule]]\nat = \"1s\"\nafter = \"1s\"\nkind = \"pause\"\ntarget = \"client-0\"\n");
    assert!(got.starts_with("t.toml:11:9: nth, client and after choose the event of `on`"), "{got}");
}

#[test]
fn a_trigger_never_reached_is_skipped_with_its_reason() {
    let s = scenario(
        "[[faults.schedule]]\nat = \"2s\"\non = \"acquire-ok\"\nnth = 100000\nkind = \"pause\"\ntarget = \"trigger\"\n\
         duration = \"5s\"\n[expect]\nverdict = \"unsafe\"\n",
    );
    let r = run_seed(&s, 0).unwrap();
    assert_eq!(skipped(&r.history), ["acquire-ok #100000 never happened after 2s"]);
    assert_eq!(r.result.faults_skipped, 1);
    let result = locksim_scenarios::sweep::sweep(&s, 0..2, 1, &|| {}).unwrap();
    assert!(!result.as_expected);
    let why = &result.reasons;
    assert!(why.iter().any(|w| w.to_string().contains("no fault fired in any of the 2 seeds")), "{why:?}");
    assert_eq!(result.fault_coverage.map(|c| (c.seeds, c.seeds_fired, c.faults, c.faults_fired)), Some((2, 0, 2, 0)));
}

#[test]
fn a_safe_verdict_needs_a_fault_that_fired() {
    // The trap: a DEL-released lock "safe under pauses" because the pause waited for an acquisition the
    // run never made. Not as expected, whatever the file expects.
    let never = "[[faults.schedule]]\nat = \"2s\"\non = \"acquire-ok\"\nnth = 1000000\nkind = \"pause\"\n\
                 target = \"trigger\"\nduration = \"10s\"\n";
    let result = locksim_scenarios::sweep::sweep(&scenario(never), 0..3, 1, &|| {}).unwrap();
    assert!(!result.as_expected, "{:?}", result.reasons);
    assert!(
        result.reasons[0].to_string().starts_with("no fault fired in any of the 3 seeds: all 3 were skipped"),
        "{:?}",
        result.reasons
    );
    // The same pause on the first acquisition fires in every seed: coverage complete, no complaint about it.
    let first = never.replace("nth = 1000000", "nth = 1");
    let result = locksim_scenarios::sweep::sweep(&scenario(&first), 0..3, 1, &|| {}).unwrap();
    let c = result.fault_coverage.unwrap();
    assert!(c.complete() && c.faults_fired == 3, "{c:?}");
    assert!(result.reasons.iter().all(|r| !r.to_string().contains("no fault fired")), "{:?}", result.reasons);
}

const AIMED_NEMESIS: &str =
    "[faults.random]\nkinds = [\"pause\", \"crash\", \"partition\"]\nevery = [\"2s\", \"6s\"]\n\
                             duration = [\"1s\", \"4s\"]\naim = true\n";

#[test]
fn the_aimed_nemesis_is_deterministic_and_written_out_replays_the_same_run() {
    let drawn = scenario(AIMED_NEMESIS);
    let faults = resolve_schedule(&drawn, 5);
    assert!(faults.iter().all(|f| f.on.is_some() && f.target == Target::Trigger), "{faults:?}");
    let a = run_seed(&drawn, 5).unwrap();
    assert_eq!(a.history.hash(), run_seed(&drawn, 5).unwrap().history.hash());
    assert!(a.history.events.iter().any(|e| matches!(e.kind, EventKind::FaultStart { .. })));
    let one = locksim_scenarios::sweep::sweep(&drawn, 0..8, 1, &|| {}).unwrap();
    let two = locksim_scenarios::sweep::sweep(&drawn, 0..8, 2, &|| {}).unwrap();
    assert_eq!(serde_json::to_string(&one).unwrap(), serde_json::to_string(&two).unwrap());
    // Written out as `shrink` writes it, then read back: the same run.
    let shrunk = locksim_scenarios::shrink::Shrunk {
        scenario: Scenario { schedule: faults, random: None, ..drawn.clone() },
        seed: 5,
        kind: locksim_scenarios::checkers::FindingKind::DoubleHolder,
        faults_before: 0,
        tries: 0,
    };
    let written = shrunk.to_toml(&text(AIMED_NEMESIS)).unwrap();
    assert!(written.contains("on = \"") && written.contains("target = \"trigger\""), "{written}");
    // In the file format's order, as the catalog's files are written: not alphabetically.
    let at = |section: &str| written.find(section).unwrap_or_else(|| panic!("{section} in {written}"));
    assert!(at("\nname =") < at("\n[recipe]") && at("\n[recipe]") < at("\n[workload]"), "{written}");
    assert!(
        at("\n[workload]") < at("\n[[faults.schedule]]\nat =") && at("[[faults.schedule]]") < at("\n[expect]"),
        "{written}"
    );
    let back = Scenario::parse("w.toml", &written, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}\n{written}"));
    assert_eq!(run_seed(&back, 5).unwrap().history.hash(), a.history.hash());
}

#[test]
fn aim_false_leaves_the_uniform_nemesis_unchanged() {
    let uniform = scenario(&AIMED_NEMESIS.replace("aim = true\n", ""));
    let explicit = scenario(&AIMED_NEMESIS.replace("aim = true", "aim = false"));
    assert_eq!(resolve_schedule(&uniform, 3), resolve_schedule(&explicit, 3));
    assert!(resolve_schedule(&uniform, 3).iter().all(|f| f.on.is_none()));
}

/// A pause at a point inside etcd's `Mutex`, between its re-check and its grant, holds the waiter there:
/// its lease expires before it records the grant, in every seed — where timed pauses of waiters land in
/// that window about once in a hundred seeds.
#[test]
fn a_pause_at_the_mutex_recheck_point_grants_to_an_expired_session_in_every_seed() {
    let text = |faults: &str| {
        format!(
            "name = \"t\"\n[recipe]\nid = \"etcd.mutex\"\nttl = \"2s\"\n\
             [workload]\nkind = \"counter\"\nclients = 4\nduration = \"20s\"\nhold = [\"1s\", \"3s\"]\n{faults}\n[check]\nliveness = \"10s\"\n"
        )
    };
    let parse = |faults: &str| Scenario::parse("t.toml", &text(faults), &Registry::builtin()).unwrap();
    let aimed = parse(
        "[[faults.schedule]]\nat = \"5s\"\non = \"etcd-mutex-checked\"\nkind = \"pause\"\ntarget = \"trigger\"\n\
         duration = \"5s\"\n",
    );
    for seed in 0..10 {
        let run = run_seed(&aimed, seed).unwrap();
        assert_eq!(run.result.verdict, Verdict::Unsafe, "seed {seed}");
        let hazards: Vec<String> = run.result.hazards.keys().map(|h| h.to_string()).collect();
        assert_eq!(hazards, ["grant-to-expired-session"], "seed {seed}: paused before its grant, not after");
    }
}

/// A catalog scenario as written, and with `aim = true` added to its `[faults.random]`.
fn catalog_uniform_and_aimed(name: &str) -> (Scenario, Scenario) {
    let path = format!("{}/catalog/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let aimed = text.replace("[faults.random]\n", "[faults.random]\naim = true\n");
    assert_ne!(aimed, text, "{path} has a [faults.random]");
    let parse = |t: &str| Scenario::parse(&path, t, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"));
    (parse(&text), parse(&aimed))
}

fn unsafe_seeds(s: &Scenario, seeds: std::ops::Range<u64>) -> usize {
    seeds.filter(|seed| run_seed(s, *seed).unwrap().result.verdict == Verdict::Unsafe).count()
}

/// The etcd `Mutex` re-check window has no history event: the aimed nemesis reaches it through the
/// recipe's point, where a uniform nemesis of waiter pauses lands about once in a hundred seeds.
#[test]
fn the_aimed_nemesis_pauses_waiters_at_the_mutex_recheck_point_and_finds_what_uniform_pauses_miss() {
    let (uniform, aimed) = catalog_uniform_and_aimed("etcd-mutex-waiter-pause-nemesis");
    let at_point = resolve_schedule(&aimed, 1)
        .iter()
        .filter(|f| f.on.as_ref().is_some_and(|on| on.event.name() == "etcd-mutex-checked"))
        .count();
    assert!(at_point > 0, "some of the drawn pauses start at the point");
    let (u, a) = (unsafe_seeds(&uniform, 0..20), unsafe_seeds(&aimed, 0..20));
    assert!(a >= 5 && a >= 5 * u, "aimed {a} of 20 seeds, uniform {u}");
    let run = (0..20).map(|seed| run_seed(&aimed, seed).unwrap()).find(|r| r.result.verdict == Verdict::Unsafe);
    let hazards: Vec<String> = run.unwrap().result.hazards.keys().map(|h| h.to_string()).collect();
    assert_eq!(hazards, ["grant-to-expired-session"]);
}

/// Aiming sharpens faults; it must not invent bugs: recipes that are safe under a nemesis stay safe
/// when it aims (Redlock with its validity check, paused at its own point), and the same point finds
/// the variant without the check.
#[test]
fn the_aimed_nemesis_keeps_correct_recipes_clean_and_catches_their_broken_twins() {
    for name in ["redis-redlock-checked-pause", "etcd-mutex-nemesis", "zk-sequential-nemesis"] {
        let (_, aimed) = catalog_uniform_and_aimed(name);
        assert_eq!(unsafe_seeds(&aimed, 0..30), 0, "{name} aimed");
    }
    let (_, unchecked) = catalog_uniform_and_aimed("redis-redlock-unchecked-pause");
    assert!(unsafe_seeds(&unchecked, 0..10) >= 8, "a pause at redlock-majority outlives the TTL");
}

/// Each recipe's clients pass exactly the points it declares (`RecipeSpec::points`, which is what the file
/// check and the aimed nemesis go by): in a run of long holds, a fault armed for one of its points starts,
/// and one armed for another recipe's point never does.
#[test]
fn every_recipe_passes_exactly_the_points_it_declares() {
    let registry = Registry::builtin();
    for recipe in registry.recipes().iter().filter(|r| r.id != locksim_locks::command::ID) {
        let backend = if recipe.id == "redis.redlock" { "[backend]\nmasters = 3\n" } else { "" };
        let text = format!(
            "name = \"t\"\n[recipe]\nid = \"{}\"\n{backend}[workload]\nkind = \"counter\"\nclients = 3\n\
             duration = \"40s\"\nhold = [\"12s\", \"15s\"]\n[[faults.schedule]]\nat = \"1s\"\non = \"acquire\"\n\
             kind = \"pause\"\ntarget = \"trigger\"\nduration = \"100ms\"\n",
            recipe.id
        );
        let mut s = Scenario::parse("t.toml", &text, &registry).unwrap_or_else(|e| panic!("{e}"));
        for point in registry.points() {
            // Armed by hand: the file check refuses a point the recipe does not declare.
            s.schedule[0].on.as_mut().unwrap().event = TriggerEvent::Declared(point);
            let run = run_seed(&s, 0).unwrap();
            let started = run.history.events.iter().any(|e| matches!(e.kind, EventKind::FaultStart { .. }));
            assert_eq!(started, recipe.points.contains(point), "{} and {}", recipe.id, point.name);
        }
    }
}

/// When each fault started, and whom it hit.
fn fault_starts(h: &locksim_sim::history::History) -> Vec<(u64, String)> {
    let starts = h.events.iter().filter_map(|e| match &e.kind {
        EventKind::FaultStart { target, .. } => Some((e.t, target.clone())),
        _ => None,
    });
    starts.collect()
}

/// A scenario of its own text (a cluster or an ensemble), parsed.
fn parsed(text: &str) -> Scenario {
    Scenario::parse("t.toml", text, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_fault_on_leader_change_hits_the_new_leader_as_it_wins() {
    // The leader crashes at 5 s for good; the fault armed then fires when a survivor wins.
    let s = parsed(
        "name = \"t\"\n[recipe]\nid = \"etcd.mutex\"\nttl = \"5s\"\n[backend]\nservers = 3\n\
         [workload]\nkind = \"counter\"\nclients = 2\nduration = \"15s\"\n\
         [[faults.schedule]]\nat = \"5s\"\nkind = \"crash\"\ntarget = \"leader\"\n\
         [[faults.schedule]]\nat = \"5s\"\non = \"leader-change\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"1s\"\n\
         [check]\ndeadlock = false\n",
    );
    for seed in 0..5 {
        let h = run_seed(&s, seed).unwrap().history;
        let starts = fault_starts(&h);
        let [(crashed_at, crashed), (paused_at, paused)] = &starts[..] else { panic!("seed {seed}: {starts:?}") };
        assert!(paused.starts_with("etcd-") && paused != crashed, "seed {seed}: a survivor won: {starts:?}");
        // A new election takes an election timeout (1–2 s, counted from the last heartbeat, up to a tick
        // before the crash) and a vote.
        let after_ms = (paused_at - crashed_at) / 1_000_000;
        assert!((900..3000).contains(&after_ms), "seed {seed}: {after_ms} ms after the crash");
    }
}

/// `read-index` fires at the leader as it takes a read index: with 3 s leases, a keep-alive reaches the
/// leader's lessor, which confirms it leads by a read index (3.5.13 and later), at least every second.
#[test]
fn a_fault_on_read_index_hits_the_leader_within_a_keep_alive() {
    let s = parsed(
        "name = \"t\"\n[recipe]\nid = \"etcd.mutex\"\nttl = \"3s\"\n[backend]\nservers = 3\n\
         [workload]\nkind = \"counter\"\nclients = 2\nduration = \"10s\"\n\
         [[faults.schedule]]\nat = \"5s\"\non = \"read-index\"\nkind = \"pause\"\ntarget = \"trigger\"\nduration = \"200ms\"\n\
         [check]\ndeadlock = false\n",
    );
    for seed in 0..5 {
        let h = run_seed(&s, seed).unwrap().history;
        let starts = fault_starts(&h);
        let [(at, paused)] = &starts[..] else { panic!("seed {seed}: {starts:?}") };
        assert!(paused.starts_with("etcd-"), "seed {seed}: {paused}");
        assert!((5_000..6_000).contains(&(at / 1_000_000)), "seed {seed}: at {at} ns");
    }
}

/// A member's fault (`stall`, `lag`) may aim at the trigger of a leader change — the new leader, a
/// member — where the family counts a leader among its targets: etcd's stall and lag, not ZooKeeper's lag
/// (a ZooKeeper leader applies at its commit).
#[test]
fn a_members_fault_aims_at_a_new_leader_where_a_leader_can_take_it() {
    let text = |recipe: &str, kind: &str| {
        format!(
            "name = \"t\"\n[recipe]\nid = \"{recipe}\"\n[backend]\nservers = 3\n\
             [workload]\nkind = \"counter\"\nclients = 2\nduration = \"60s\"\n\
             [[faults.schedule]]\nat = \"5s\"\non = \"leader-change\"\nkind = \"{kind}\"\ntarget = \"trigger\"\n\
             latency = \"1s\"\nduration = \"2s\"\n"
        )
    };
    let parse = |t: &str| Scenario::parse("t.toml", t, &Registry::builtin()).map(drop).map_err(|e| e.to_string());
    let stall = text("etcd.mutex", "stall").replace("latency = \"1s\"\n", "");
    assert_eq!(parse(&stall), Ok(()));
    assert_eq!(parse(&text("etcd.mutex", "lag")), Ok(()));
    let refused = parse(&text("zk.sequential", "lag")).unwrap_err();
    assert!(
        refused.contains("target: lag slows the apply of a member that follows a leader; \"trigger\" is not one"),
        "{refused}"
    );
}

#[test]
fn a_fault_on_lease_expired_hits_the_client_whose_session_the_server_ended() {
    // A client paused from 3 s for 8 s loses its session (4 s: the server's least, two ticks of 2 s);
    // the crash armed at 3 s hits that client when the server expires it, and no other.
    let s = parsed(
        "name = \"t\"\n[recipe]\nid = \"zk.ephemeral\"\nsession_timeout = \"2s\"\n\
         [workload]\nkind = \"counter\"\nclients = 3\nduration = \"20s\"\n\
         [[faults.schedule]]\nat = \"3s\"\nkind = \"pause\"\ntarget = \"client-1\"\nduration = \"8s\"\n\
         [[faults.schedule]]\nat = \"3s\"\non = \"lease-expired\"\nkind = \"crash\"\ntarget = \"trigger\"\nduration = \"1s\"\n\
         [check]\ndeadlock = false\n",
    );
    for seed in 0..5 {
        let h = run_seed(&s, seed).unwrap().history;
        let crash = h
            .events
            .iter()
            .find(|e| matches!(&e.kind, EventKind::FaultStart { fault, .. } if *fault == FaultKind::Crash))
            .unwrap_or_else(|| panic!("seed {seed}: the expiry fired nothing"));
        assert_eq!(h.nodes[crash.node.0 as usize], "client-1", "seed {seed}");
        // Expired 4 s to 4 s and a tick after its last word, before its pause ends.
        assert!((6_000_000_000..9_000_000_000).contains(&crash.t), "seed {seed}: at {} ns", crash.t);
    }
}
