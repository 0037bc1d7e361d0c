//! Ensemble conformance against real ensembles on loopback: three ZooKeeper servers (their peer links
//! through locksim's proxies) or three etcd members started for each seed. Where a server is missing
//! these tests say so and pass, unless `LOCKSIM_REQUIRE_SERVERS` is set — as `.ci/run` sets it.

mod common;

use common::{locksim, stderr, stdout};
use locksim_live::conform::client::Outcome;
use locksim_live::conform::ensemble::etcd::EtcdCluster;
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
    // Two seeds in a row that play both kinds of plan; CI's `conform all` plays the breadth.
    let (open, shut) = ("window open (T < syncLimit·tickTime)", "window shut (T > syncLimit·tickTime)");
    let kind = |s: u64| ZkEnsemble::kind(&plan::<ZkEnsemble>(s));
    let first = (0..100).find(|s| kind(*s) != kind(s + 1)).expect("both kinds among the first seeds");
    let seeds = format!("{first}..{}", first + 2);
    let o = locksim(&["conform", "zk-ensemble", "--seeds", &seeds, "--jobs", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let said = format!("zk-ensemble: 2 seeds (seeds {seeds}): ");
    assert!(out.contains(&said) && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains(open) && out.contains(shut), "{out}");
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
    // Two seeds in a row that play both kinds of plan: the leader killed, the leader paused.
    let paused = |s: u64| EtcdCluster::kind(&plan::<EtcdCluster>(s)) == "leader paused, every member read";
    let first = (0..100).find(|s| paused(*s) != paused(s + 1)).expect("both kinds among the first seeds");
    let seeds = format!("{first}..{}", first + 2);
    let o = locksim(&["conform", "etcd-cluster", "--seeds", &seeds, "--jobs", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let said = format!("etcd-cluster: 2 seeds (seeds {seeds}): ");
    assert!(out.contains(&said) && out.contains(" agreed, 0 mismatched"), "{out}");
    assert!(out.contains("leader paused, every member read 1") && out.contains("leader killed 1"), "{out}");
}
