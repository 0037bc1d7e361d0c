//! A ZooKeeper ensemble with a follower cut off from its leader: the model's ensemble
//! (`sim/src/backend/zk/ensemble.rs`) against three real ZooKeeper 3.8 servers whose peer links go
//! through locksim's proxies, each side with the same client library (the model's `ClientCnxn`; on a
//! real clock and TCP for real), so that what differs is the servers.
//!
//! A plan: an ensemble of three with tickTime t and syncLimit s (a follower's patience P = s·t), whose
//! leader is `zk-2` (the model's always is: every vote ties on epoch and zxid, and the highest id wins;
//! a real ensemble that elected another is played again). A holder's session of timeout T on follower
//! `zk-0` or `zk-1` alone creates an ephemeral `/x` at 300 ms; an observer on `zk-2` looks for `/x`
//! every 100 ms. Then the holder's server is cut off from the leader, not from its clients, past both T
//! and P; halfway between T and P after the cut the holder reads `/x`. What the timeline holds:
//! - `observer: /x gone`: the leader expired the session it no longer hears of, about T after the cut
//!   (the follower reports its clients' pings only in its replies to the leader's);
//! - `disconnected`: the follower gave up on its leader, P after the last packet it had from it, and
//!   closed its clients' connections;
//! - the holder's read: with T < P (*window open*) its server still answers, from its own copy, where
//!   `/x` is still there — `get /x: ok` after the leader deleted it, the double holder's cause; with
//!   T > P (*window shut*) its server has given up by then and the read fails.
//!
//! The play ends shortly after the heal: what comes after it (the follower's return, the holder's
//! `Expired`) turns on TCP's retransmission backoff and election notification timeouts, not on a rule a
//! verdict depends on.

use super::{model_play, real_play, Client, EnsembleFamily, Model, Seen};
use crate::conform::client::zk::{said, DISCONNECTED, GET_LOST};
use crate::conform::client::{Late, Margin, Timeline, UNDECIDED};
use crate::servers::{Cluster, Launcher};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::zk::{ZkServers, ZkSession, BACKEND_PARAMS, FAMILY};
use locksim_locks::{Family, Servers};
use locksim_sim::backend::zk::client::{ConnState, ZkClient};
use locksim_sim::backend::zk::{CreateMode, ZkOp, ZkReply};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::time::Duration;

/// One plan (times from the moment the clients start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub tick_ms: u64,
    pub sync_limit: u64,
    /// The holder's session timeout, a whole number of ticks.
    pub timeout_ms: u64,
    /// The holder's server: `zk-0` or `zk-1`, a follower.
    pub follower: usize,
    pub cut_at_ms: u64,
    pub cut_ms: u64,
}

/// When the holder creates `/x`.
const CREATE_MS: u64 = 300;
/// How often the observer looks for `/x`.
const POLL_MS: u64 = 100;
/// The observer's server, the leader.
const LEADER: usize = 2;

pub const GONE: &str = "observer: /x gone";

impl Plan {
    /// syncLimit·tickTime: how long a follower waits for its leader.
    fn patience_ms(&self) -> u64 {
        self.tick_ms * self.sync_limit
    }

    fn window_open(&self) -> bool {
        self.timeout_ms < self.patience_ms()
    }

    /// When the holder reads `/x`: halfway between the leader's expiry and the follower's giving up.
    fn ask_ms(&self) -> u64 {
        self.cut_at_ms + (self.timeout_ms + self.patience_ms()) / 2
    }

    fn end_ms(&self) -> u64 {
        self.cut_at_ms + self.cut_ms + 300
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tickTime {} ms, syncLimit {} (patience {} ms); session timeout {} ms on zk-{}; create -e /x at \
             {CREATE_MS} ms; at {} ms zk-{} is cut off from the leader zk-{LEADER} for {} ms; get /x at {} ms",
            self.tick_ms,
            self.sync_limit,
            self.patience_ms(),
            self.timeout_ms,
            self.follower,
            self.cut_at_ms,
            self.follower,
            self.cut_ms,
            self.ask_ms()
        )
    }
}

/// The ZooKeeper ensemble; `planted`: the model's followers wait that many ticks longer than
/// `syncLimit` for their leader (a planted bug the tests show conformance catches).
#[derive(Default)]
pub struct ZkEnsemble {
    pub planted: u64,
}

impl EnsembleFamily for ZkEnsemble {
    const NAME: &'static str = "zk-ensemble";
    const ABOUT: &'static str =
        "Ensemble: three real ZooKeeper servers, a follower cut off from its leader — when the \
                                 leader expires its client's session, when the follower gives up, what it answers \
                                 meanwhile (needs java).";
    type Plan = Plan;

    fn launcher() -> &'static Launcher {
        &crate::servers::ZOOKEEPER
    }

    fn family() -> &'static Family {
        &FAMILY
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        let tick_ms: u64 = [300, 400, 500][rng.gen_range(0..3)];
        let sync_limit = rng.gen_range(6..=12);
        let patience = tick_ms * sync_limit;
        // Each case a second or more clear of the other, so that neither side's jitter crosses it; the
        // session between 2 and 20 ticks, as the server negotiates it.
        let open = (2 * tick_ms).max(1200).div_ceil(tick_ms)..=(patience - 1200) / tick_ms;
        let shut = (patience + 1200).div_ceil(tick_ms)..=20;
        let ticks = match rng.gen_bool(0.5) && !open.is_empty() {
            true => rng.gen_range(open),
            false => rng.gen_range(shut),
        };
        let timeout_ms = ticks * tick_ms;
        Plan {
            tick_ms,
            sync_limit,
            timeout_ms,
            follower: rng.gen_range(0..2),
            cut_at_ms: CREATE_MS + 700 + rng.gen_range(0..10) * 100,
            cut_ms: timeout_ms.max(patience) + 1500,
        }
    }

    fn kind(plan: &Plan) -> &'static str {
        match plan.window_open() {
            true => "window open (T < syncLimit·tickTime)",
            false => "window shut (T > syncLimit·tickTime)",
        }
    }

    fn backend(plan: &Plan) -> Params {
        backend(plan, 0)
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        model(plan, seed, self.planted)
    }

    fn real(&self, plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
        real(plan, cluster)
    }

    fn margin(plan: &Plan, what: &str) -> Margin {
        let (tick, third) = (plan.tick_ms, plan.timeout_ms / 3);
        match what {
            // The session's last touch reaches the leader with a reply to one of its pings (every half
            // tick) after the holder's last ping before the cut (one a third of T), and the leader
            // expires sessions on its tick boundaries: each side lands somewhere in that span.
            GONE => Margin { early_ms: third + tick * 3 / 2 + 200, late_ms: third + tick * 3 / 2 + 200 },
            // P after the last packet from the leader, whose pings come every half tick.
            DISCONNECTED => Margin { early_ms: tick / 2 + 150, late_ms: tick / 2 + 300 },
            // A read made while disconnected fails at the next connect attempt, which each side makes
            // 1–2 s after the one before (its own random draw): within 2 s after the read on either side.
            GET_LOST => Margin { early_ms: 2100, late_ms: 2100 },
            _ => Margin { early_ms: 150, late_ms: 300 },
        }
    }
}

/// The ensemble's `[backend]`, its followers `planted` ticks more patient.
fn backend(plan: &Plan, planted: u64) -> Params {
    Params::resolve(
        BACKEND_PARAMS,
        [
            ("servers", ParamValue::Int(3)),
            ("tick_time", ParamValue::Duration(Duration::from_millis(plan.tick_ms))),
            ("sync_limit", ParamValue::Int((plan.sync_limit + planted) as i64)),
        ],
    )
}

/// The plan in a simulated world: the model's ensemble, the model's client, the cut as a scenario's
/// partition of the holder's server from the leader.
fn model(plan: &Plan, seed: u64, planted: u64) -> Timeline {
    let cut = Fault {
        at: Duration::from_millis(plan.cut_at_ms),
        target: Target::Node(format!("zk-{}", plan.follower)),
        action: Action::Partition {
            peers: vec![format!("zk-{LEADER}")],
            duration: Some(Duration::from_millis(plan.cut_ms)),
        },
        on: None,
    };
    let model = Model { family: &FAMILY, backend: &backend(plan, planted), pin: ZkServers::pinned };
    model_play(seed, model, plan, &clients(plan), vec![cut], plan.end_ms())
}

/// The plan on a real ensemble, the cut made by the cluster's peer proxies.
fn real(plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
    match cluster.leader() {
        Some(LEADER) => {}
        other => {
            let elected = other.map_or("no leader".to_string(), |m| format!("zk-{m}"));
            let why = format!("{UNDECIDED} the real ensemble elected {elected}, where the model's elects zk-{LEADER}");
            return Err(Late(why).into());
        }
    }
    let backend = backend(plan, 0);
    let deployment = Model { family: &FAMILY, backend: &backend, pin: ZkServers::pinned };
    real_play(cluster, &deployment, plan, &clients(plan), plan.end_ms(), |play| {
        play.at(plan.cut_at_ms, "the cut");
        cluster.cut(plan.follower, LEADER, true);
        play.at(plan.cut_at_ms + plan.cut_ms, "the heal");
        cluster.cut(plan.follower, LEADER, false);
        Ok(())
    })
}

/// The holder, on its follower alone, and the observer, on the leader alone.
fn clients(plan: &Plan) -> [Client<Plan>; 2] {
    [
        Client {
            name: "client-0",
            member: Some(plan.follower),
            run: |plan, ctx, servers, seen| Box::pin(holder(plan, ctx, servers, seen)),
        },
        Client {
            name: "client-1",
            member: Some(LEADER),
            run: |_, ctx, servers, seen| Box::pin(observer(ctx, servers, seen)),
        },
    ]
}

/// The holder: a session of the plan's timeout, `/x` created, then read at the plan's time; and
/// `disconnected` the first time its connection is lost.
async fn holder(plan: Plan, ctx: Ctx, servers: Servers, seen: Seen) {
    let session = ZkSession::new(&ctx, &servers, Duration::from_millis(plan.timeout_ms));
    let Some(zk) = session.live().await else { return seen.record("the holder could not connect") };
    let states = seen.clone();
    let _states = ctx.spawn(disconnection(zk.clone(), move || states.record(DISCONNECTED)));
    seen.until(&ctx, CREATE_MS).await;
    let create = ZkOp::Create { path: "/x".into(), data: "held".into(), mode: CreateMode::Ephemeral };
    seen.record(said(zk.call(create).await));
    seen.until(&ctx, plan.ask_ms()).await;
    seen.record(said(zk.call(ZkOp::GetData { path: "/x".into(), watch: false }).await));
    std::future::pending::<()>().await
}

/// The observer: looks for `/x` every [`POLL_MS`] from just after its creation; `gone` once it is not
/// there after it was.
async fn observer(ctx: Ctx, servers: Servers, seen: Seen) {
    let session = ZkSession::new(&ctx, &servers, Duration::from_secs(10));
    let Some(zk) = session.live().await else { return seen.record("the observer could not connect") };
    let mut there = false;
    for at in (CREATE_MS + POLL_MS..).step_by(POLL_MS as usize) {
        seen.until(&ctx, at).await;
        match zk.call(ZkOp::Exists { path: "/x".into(), watch: false }).await {
            Ok((ZkReply::Exists(Some(_)), _)) => there = true,
            Ok((ZkReply::Exists(None), _)) if there => return seen.record(GONE),
            _ => {}
        }
    }
}

/// `disconnected` the first time the session's connection is lost.
async fn disconnection(zk: ZkClient, disconnected: impl Fn()) {
    let mut state = zk.state();
    state.borrow_and_update();
    while state.changed().await.is_ok() {
        if *state.borrow_and_update() == ConnState::Disconnected {
            return disconnected();
        }
    }
}
