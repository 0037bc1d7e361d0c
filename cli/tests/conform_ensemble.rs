//! Ensemble conformance against real ensembles on loopback: three ZooKeeper servers (their peer links
//! through locksim's proxies), three etcd members, or a Redis master with its replicas and three
//! Sentinels, started for each seed. Where a server is missing
//! these tests say so and pass, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it.

mod common;

use common::{locksim, stderr, stdout};
use locksim_live::conform::client::Outcome;
use locksim_live::conform::ensemble::etcd::EtcdCluster;
use locksim_live::conform::ensemble::sentinel::RedisSentinel;
use locksim_live::conform::ensemble::zk::ZkEnsemble;
use locksim_live::conform::ensemble::{check, plan, EnsembleFamily};
use locksim_live::servers::{self, Launcher, Server};

/// The tests take turns: a plan keeps time, and a busy machine makes it inconclusive.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether `launcher`'s server can be started here; where it cannot and is not required, say so.
fn here(launcher: &'static Launcher) -> bool {
    match Server::start(launcher) {
        Ok(_) => true,
        Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {e:#} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            false
        }
        Err(e) => panic!("{e:#}"),
    }
}

#[test]
fn conform_zk_ensemble_agrees_with_a_real_ensemble() {
    let _turn = turn();
    if !here(&servers::ZOOKEEPER) {
        return;
    }
    let (open, shut) = ("window open (T < syncLimit·tickTime)", "window shut (T > syncLimit·tickTime)");
    agrees_on_two_kinds::<ZkEnsemble>(open, &[open, shut]);
}

/// `conform F` on two seeds in a row, one whose plan is of kind `one` and one of another kind (CI's
/// `conform all` plays the breadth): every seed agrees, and the coverage line names each of `played`.
fn agrees_on_two_kinds<F: EnsembleFamily>(one: &str, played: &[&str]) {
    let is_one = |s: u64| F::kind(&plan::<F>(s)) == one;
    let first = (0..100).find(|s| is_one(*s) != is_one(s + 1)).expect("both kinds among the first seeds");
    let seeds = format!("{first}..{}", first + 2);
    let o = locksim(&["conform", F::NAME, "--seeds", &seeds, "--jobs", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let said = format!("{}: 2 seeds (seeds {seeds}): ", F::NAME);
    assert!(out.contains(&said) && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(played.iter().all(|p| out.contains(p)), "{out}");
}

/// The model's ensemble with a planted bug: its followers wait four ticks longer than `syncLimit` for
/// a silent leader, so its clients are disconnected late — and in a window-open plan the double
/// holder's window looks four ticks wider than it is.
#[test]
fn a_follower_more_patient_than_sync_limit_is_caught() {
    let _turn = turn();
    if !here(&servers::ZOOKEEPER) {
        return;
    }
    let planted = ZkEnsemble { planted: 4 };
    let mut inconclusive = Vec::new();
    for seed in 0..3 {
        match check(&planted, seed).unwrap() {
            Outcome::Mismatch { why, .. } => {
                assert!(why.contains("`disconnected`"), "seed {seed}: caught for another reason: {why}");
                // The faithful model agrees on the same plan.
                let faithful = check(&ZkEnsemble::default(), seed).unwrap();
                assert!(matches!(faithful, Outcome::Agree | Outcome::Inconclusive(_)), "seed {seed}: {faithful:?}");
                return;
            }
            Outcome::Inconclusive(why) => inconclusive.push(format!("seed {seed}: {why}")),
            Outcome::Agree | Outcome::DrawnAlone(_) => panic!("seed {seed}: the planted bug went unseen"),
        }
    }
    panic!("no seed decided, so the planted bug was never tested: {inconclusive:#?}");
}

#[test]
fn conform_etcd_cluster_agrees_with_a_real_cluster() {
    let _turn = turn();
    if !here(&servers::ETCD) {
        return;
    }
    let paused = "leader paused, every member read";
    agrees_on_two_kinds::<EtcdCluster>(paused, &["leader paused, every member read 1", "leader killed 1"]);
}

#[test]
fn conform_redis_sentinel_agrees_with_a_real_deployment() {
    let _turn = turn();
    if !here(&servers::REDIS) {
        return;
    }
    agrees_on_two_kinds::<RedisSentinel>("master killed", &["master killed 1", "master cut off"]);
}
