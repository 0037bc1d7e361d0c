//! Client conformance against the real servers and the real kernel: each play runs in a network
//! namespace of its own (root, iproute2 and nftables needed). Where that or a server is missing these tests say
//! so and pass, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it.

mod common;

use common::{locksim, stderr, stdout, Marked};
use locksim_live::conform::client::etcd::{self, EtcdClientSide, EtcdFault};
use locksim_live::conform::client::kazoo::KazooClientSide;
use locksim_live::conform::client::netns::Netns;
use locksim_live::conform::client::sql::{HolderFault, Plan, SqlClientSide};
use locksim_live::conform::client::zk::{self, ZkClientSide, ZkFault};
use locksim_live::conform::client::{self, check, ClientFamily, Margin, Outcome, Timeline};
use locksim_live::servers::{self, Launcher, Server};
use locksim_sim::backend::zk::client::Library;
use locksim_sim::rng::ChaCha8Rng;

/// The tests that play plans take turns: a plan keeps time, and a busy machine makes it inconclusive.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A namespace of this thread's own with `launcher`'s server in it, or `None` (said on stderr) where
/// either cannot be had and is not required.
fn isolated(launcher: &'static Launcher) -> Option<(Netns, Server)> {
    let made = Netns::enter().and_then(|net| Ok((net, Server::start(launcher)?)));
    match made {
        Ok(made) => Some(made),
        Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {e:#} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            None
        }
        Err(e) => panic!("{e:#}"),
    }
}

/// Family `F` with its model replaced by `model`, a planted bug, played against `F`'s real side: the
/// comparison must catch it.
struct Planted<F: ClientFamily> {
    family: F,
    model: fn(&F::Plan, u64) -> Timeline,
}

impl<F: ClientFamily> ClientFamily for Planted<F> {
    const NAME: &'static str = F::NAME;
    const ABOUT: &'static str = F::ABOUT;
    type Plan = F::Plan;

    fn server() -> &'static Launcher {
        F::server()
    }

    fn plan(rng: &mut ChaCha8Rng) -> F::Plan {
        F::plan(rng)
    }

    fn kind(plan: &F::Plan) -> &'static str {
        F::kind(plan)
    }

    fn model(&self, plan: &F::Plan, seed: u64) -> Timeline {
        (self.model)(plan, seed)
    }

    fn real(&self, plan: &F::Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
        self.family.real(plan, server, net)
    }

    fn margin(plan: &F::Plan, what: &str) -> Margin {
        F::margin(plan, what)
    }

    fn undecided(plan: &F::Plan, model: &Timeline, real: &Timeline) -> Option<String> {
        F::undecided(plan, model, real)
    }
}

/// Plays the planted bug on the first seeds whose plan `fits` until one decides, and returns that seed:
/// the bug must be caught as a mismatch whose reason names one of `signs`. A seed a busy machine made
/// inconclusive (a restart or a create later than its margin) proves nothing either way, so the next
/// fitting seed is played; if three in a row are inconclusive the test did not happen, and fails.
fn caught<F: ClientFamily>(
    planted: &Planted<F>,
    server: &mut Server,
    net: &Netns,
    fits: impl Fn(&F::Plan) -> bool,
    signs: &[&str],
) -> u64 {
    let mut inconclusive = Vec::new();
    for seed in (0..200).filter(|s| fits(&client::plan::<F>(*s))).take(3) {
        match check(planted, server, net, seed).unwrap() {
            Outcome::Mismatch { why, .. } => {
                assert!(signs.iter().any(|sign| why.contains(sign)), "seed {seed}: caught for another reason: {why}");
                return seed;
            }
            Outcome::Inconclusive(why) => inconclusive.push(format!("seed {seed}: {why}")),
            other => panic!("seed {seed}: the planted bug went unseen: {other:?}"),
        }
    }
    panic!("no fitting seed decided, so the planted bug was never tested: {inconclusive:#?}")
}

#[test]
fn conform_sql_client_agrees_with_postgres_and_the_kernel() {
    let _turn = turn();
    if std::thread::spawn(|| isolated(&servers::POSTGRES).is_none()).join().unwrap() {
        return;
    }
    // The fewest consecutive seeds that play every kind of plan; CI's `conform all` plays the breadth.
    let o = locksim(&["conform", "sql-client", "--seeds", "10..14", "--jobs", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // A seed may be inconclusive on a busy machine; none may mismatch.
    assert!(out.contains("sql-client: 4 seeds (seeds 10..14): ") && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains("cut") && out.contains("host crash") && out.contains("process kill"), "{out}");
}

/// The model's client side with a planted bug: a killed process's kernel closes nothing (its
/// connection goes as silent as a dead host's), the mistake locksim made before it told the two apart.
fn kill_is_silence(plan: &Plan, seed: u64) -> Timeline {
    let mut planted = plan.clone();
    if planted.fault == HolderFault::Kill {
        planted.fault = HolderFault::HostCrash;
    }
    SqlClientSide.model(&planted, seed)
}

#[test]
fn a_client_side_that_takes_a_process_kill_for_a_host_crash_is_caught() {
    let _turn = turn();
    std::thread::spawn(|| {
        let Some((net, mut server)) = isolated(&servers::POSTGRES) else { return };
        let planted = Planted { family: SqlClientSide, model: kill_is_silence };
        // The session ends at once for real.
        let is_kill = |p: &Plan| p.fault == HolderFault::Kill;
        let seed = caught(&planted, &mut server, &net, is_kill, &["`observer granted`"]);
        // The faithful model agrees on the same plan.
        assert!(matches!(
            check(&SqlClientSide, &mut server, &net, seed).unwrap(),
            Outcome::Agree | Outcome::Inconclusive(_)
        ));
    })
    .join()
    .unwrap();
}

#[test]
fn conform_zk_client_agrees_with_the_java_client() {
    let _turn = turn();
    if std::thread::spawn(|| isolated(&servers::ZOOKEEPER).is_none()).join().unwrap() {
        return;
    }
    // The fewest consecutive seeds that play every kind of plan; CI's `conform all` plays the breadth.
    let o = locksim(&["conform", "zk-client", "--seeds", "7..11", "--jobs", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("zk-client: 4 seeds (seeds 7..11): ") && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains("short cut") && out.contains("cut past expiry") && out.contains("server kill"), "{out}");
}

/// The model's ZooKeeper with a planted bug: a killed server's kernel closes nothing, so its clients
/// learn of it only by their read timeout.
fn server_kill_is_silence(plan: &zk::Plan, seed: u64) -> Timeline {
    zk::model_with(plan, seed, true)
}

#[test]
fn a_zookeeper_whose_killed_server_closes_nothing_is_caught() {
    let _turn = turn();
    std::thread::spawn(|| {
        let Some((net, mut server)) = isolated(&servers::ZOOKEEPER) else { return };
        let planted = Planted { family: ZkClientSide, model: server_kill_is_silence };
        // Noticed at once for real.
        let is_kill = |p: &zk::Plan| matches!(p.fault, ZkFault::ServerKill { .. });
        caught(&planted, &mut server, &net, is_kill, &["`disconnected`"]);
    })
    .join()
    .unwrap();
}

/// Whether kazoo's virtualenv is there (`scenarios/real/setup`); where it is not and not required, the
/// test says so and passes.
fn kazoo_ready() -> bool {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/real/.venv/bin/python");
    match std::path::Path::new(python).exists() {
        true => true,
        false if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!(
                "skipped: no {python} (run scenarios/real/setup; LOCKSIM_REQUIRE_SERVERS=1 makes this a failure)"
            );
            false
        }
        false => panic!("no {python}: run scenarios/real/setup"),
    }
}

#[test]
fn conform_kazoo_client_agrees_with_kazoo() {
    let _turn = turn();
    if !kazoo_ready() || std::thread::spawn(|| isolated(&servers::ZOOKEEPER).is_none()).join().unwrap() {
        return;
    }
    // The fewest consecutive seeds that play every kind of plan; CI's `conform all` plays the breadth.
    let o = locksim(&["conform", "kazoo-client", "--seeds", "7..11", "--jobs", "4"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("kazoo-client: 4 seeds (seeds 7..11): ") && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains("short cut") && out.contains("cut past expiry") && out.contains("server kill"), "{out}");
}

/// The model's kazoo with a planted bug: it speaks as the Java client, which fails a request made while
/// disconnected at the next refused attempt where kazoo holds it until the session is back.
fn kazoo_as_java(plan: &zk::Plan, seed: u64) -> Timeline {
    zk::model_as(plan, seed, false, Library::Java)
}

#[test]
fn a_kazoo_model_that_speaks_as_the_java_client_is_caught() {
    let _turn = turn();
    if !kazoo_ready() {
        return;
    }
    std::thread::spawn(|| {
        let Some((net, mut server)) = isolated(&servers::ZOOKEEPER) else { return };
        let planted = Planted { family: KazooClientSide, model: kazoo_as_java };
        // kazoo holds the request for real.
        let is_kill = |p: &zk::Plan| matches!(p.fault, ZkFault::ServerKill { .. });
        let seed = caught(&planted, &mut server, &net, is_kill, &["`get /x: connection loss`"]);
        // The faithful model agrees on the same plan.
        assert!(matches!(
            check(&KazooClientSide, &mut server, &net, seed).unwrap(),
            Outcome::Agree | Outcome::Inconclusive(_)
        ));
    })
    .join()
    .unwrap();
}

#[test]
fn conform_etcd_client_agrees_with_clientv3s_keep_alive() {
    let _turn = turn();
    if std::thread::spawn(|| isolated(&servers::ETCD).is_none()).join().unwrap() {
        return;
    }
    // The fewest consecutive seeds that play every kind of plan; CI's `conform all` plays the breadth.
    let o = locksim(&["conform", "etcd-client", "--seeds", "19..24", "--jobs", "5"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("etcd-client: 5 seeds (seeds 19..24): ") && out.contains(" agreed, 0 mismatched"), "{out}");
    for kind in ["short cut", "cut past the TTL", "server kill", "server down past the TTL"] {
        assert!(out.contains(kind), "{kind}: {out}");
    }
}

/// The model's etcd client with a planted bug: a keep-alive that takes its connection's reset (a
/// killed server) for the end of its lease, where clientv3 reconnects and keeps it alive.
fn reset_is_loss(plan: &etcd::Plan, seed: u64) -> Timeline {
    etcd::model_with(plan, seed, true)
}

#[test]
fn a_keep_alive_that_takes_a_reset_for_a_lost_lease_is_caught() {
    let _turn = turn();
    std::thread::spawn(|| {
        let Some((net, mut server)) = isolated(&servers::ETCD) else { return };
        let planted = Planted { family: EtcdClientSide, model: reset_is_loss };
        // Kept alive for real.
        let short_kill = |p: &etcd::Plan| {
            matches!(p.fault, EtcdFault::ServerKill { .. }) && EtcdClientSide::kind(p) == "server kill"
        };
        caught(&planted, &mut server, &net, short_kill, &["keep-alive gave up", "lease"]);
    })
    .join()
    .unwrap();
}

#[test]
fn ctrl_c_in_client_conformance_stops_the_server_and_the_real_client() {
    let _turn = turn();
    if std::thread::spawn(|| isolated(&servers::ETCD).is_none()).join().unwrap() {
        return;
    }
    let marked = Marked::new();
    let mut child = marked.command(&["conform", "etcd-client", "--seeds", "0..8", "--jobs", "1"]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !marked.processes().iter().any(|p| p.contains("lease keep-alive")) {
        assert!(std::time::Instant::now() < deadline, "the client never started: {:#?}", marked.processes());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own unreaped child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    assert_eq!(child.wait().unwrap().code(), Some(130), "Ctrl-C");
    marked.assert_nothing_left("Ctrl-C in etcd-client");
}
