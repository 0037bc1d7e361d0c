//! An etcd cluster whose leader is killed while a lease is out: the model's cluster
//! (`sim/src/backend/etcd/cluster.rs`) against three real etcd members on loopback, each side with the
//! same client (the model's, over etcd's JSON gateway for real), so that what differs is the members.
//!
//! A plan: a client grants a lease of TTL t at 300 ms and asks its remaining TTL (`LeaseTimeToLive`)
//! every 100 ms; between 1 and 2 s the leader is killed, and started again with its data a while later.
//! The client's endpoints are all three members; it moves to the next when one cannot be reached. What
//! the timeline holds:
//! - `lease extended`: the first answer that puts the lease's expiry (now plus the remaining TTL) 2 s or
//!   more past the one it was granted with — the new leader promoted its lessor, giving every lease its
//!   TTL plus the election timeout afresh (`lessor.Promote`). (A question asked before the kill may wait
//!   out its deadline, so the first answer after the promotion can carry a shorter remaining TTL than
//!   the last one before the kill: the expiry, not the TTL, tells.)
//! - `lease gone`: the lease expired and was revoked, a TTL and an election timeout after that.
//!
//! So it measures what a lock's verdict turns on in a leader change: how long a dead holder's lease
//! outlives the election (etcd#9395). Each side draws its own election timeouts (1–2 s), which the
//! margins allow.

use super::{model_play, real_play, Client, EnsembleFamily, Model, Seen};
use crate::conform::client::{Margin, Timeline};
use crate::servers::{Cluster, Launcher};
use locksim_locks::etcd::{connect, EtcdApi, BACKEND_PARAMS, FAMILY, REAL};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::Servers;
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, LeaseId};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::time::Duration;

/// One plan (times from the moment the client starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ttl_s: u64,
    pub kill_ms: u64,
    /// How long the killed leader stays down.
    pub down_ms: u64,
}

/// When the client grants the lease.
const GRANT_MS: u64 = 300;
/// How often it asks the lease's remaining TTL.
const POLL_MS: u64 = 100;
/// Each call's deadline: a question asked during the election waits for its end.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub const GRANTED: &str = "granted";
pub const EXTENDED: &str = "lease extended";
pub const GONE: &str = "lease gone";

impl Plan {
    fn end_ms(&self) -> u64 {
        // The election (up to 2 s), the TTL plus the election timeout, the lessor's look, and room.
        self.kill_ms + 2000 + self.ttl_s * 1000 + 1000 + 2500
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "grant a lease of TTL {} s at {GRANT_MS} ms, ask its TTL every {POLL_MS} ms; at {} ms the leader is \
             killed, started again {} ms later",
            self.ttl_s, self.kill_ms, self.down_ms
        )
    }
}

/// The etcd cluster.
#[derive(Default)]
pub struct EtcdCluster;

impl EnsembleFamily for EtcdCluster {
    const NAME: &'static str = "etcd-cluster";
    const ABOUT: &'static str = "Ensemble: three real etcd members, the leader killed while a lease is out — when the \
                                 new leader extends the lease, when it expires.";
    type Plan = Plan;

    fn launcher() -> &'static Launcher {
        &crate::servers::ETCD
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        Plan {
            ttl_s: rng.gen_range(3..=6),
            kill_ms: rng.gen_range(10..=20) * 100,
            down_ms: rng.gen_range(15..=30) * 100,
        }
    }

    fn kind(plan: &Plan) -> &'static str {
        match plan.ttl_s {
            3 | 4 => "short lease, leader killed",
            _ => "long lease, leader killed",
        }
    }

    fn backend(_: &Plan) -> Params {
        Params::resolve(BACKEND_PARAMS, [("servers", ParamValue::Int(3))])
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        model(plan, seed)
    }

    fn real(&self, plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
        real(plan, cluster)
    }

    fn margin(_: &Plan, what: &str) -> Margin {
        match what {
            // Each side's followers wait their own election timeout, drawn from 1–2 s; and a lookup that
            // reached a follower as its leader died waits differently (docs/models.md, deliberate
            // differences): real etcd's `waitLeader` looks again each election timeout, the model's
            // lookup forwarded to the dead leader waits for its deadline (3 s here).
            EXTENDED => Margin { early_ms: 2600, late_ms: 2600 },
            // That, and the lessor's look for expired leases every 500 ms.
            GONE => Margin { early_ms: 1800, late_ms: 1800 },
            _ => Margin { early_ms: 150, late_ms: 300 },
        }
    }
}

/// The plan in a simulated world: the model's cluster and client, the kill as a scenario's crash of
/// the `leader`.
fn model(plan: &Plan, seed: u64) -> Timeline {
    let kill = Fault {
        at: Duration::from_millis(plan.kill_ms),
        target: Target::Node("leader".into()),
        action: Action::Crash { restart_after: Some(Duration::from_millis(plan.down_ms)), host: false },
        on: None,
    };
    // Its one client talks to every member: nothing to pin.
    let model = Model { family: &FAMILY, backend: &EtcdCluster::backend(plan), pin: |servers, _| servers.clone() };
    model_play(seed, model, plan, &CLIENTS, vec![kill], plan.end_ms())
}

/// The plan on a real cluster: the leader killed (SIGKILL) and started again with its data.
fn real(plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
    real_play(cluster, &REAL, plan, &CLIENTS, plan.end_ms(), |play| {
        play.at(plan.kill_ms, "the kill");
        let Some(leader) = cluster.leader() else { anyhow::bail!("the real cluster had no leader at the kill") };
        cluster.member(leader).crash()?;
        play.at(plan.kill_ms + plan.down_ms, "the restart");
        cluster.member(leader).relaunch(true)
    })
}

/// One client, whose endpoints are every member.
const CLIENTS: [Client<Plan>; 1] = [Client {
    name: "client-0",
    member: None,
    run: |plan, ctx, servers, seen| Box::pin(client(plan, ctx, servers, seen)),
}];

/// The client: grant the lease, then ask its remaining TTL until it is gone or the plan ends.
async fn client(plan: Plan, ctx: Ctx, servers: Servers, seen: Seen) {
    let etcd = connect(&ctx, &servers, CALL_TIMEOUT);
    seen.until(&ctx, GRANT_MS).await;
    let granted = etcd.request(EtcdRequest::LeaseGrant { ttl_s: plan.ttl_s as i64 }).await;
    let Ok(EtcdReply::LeaseGranted { id, .. }) = granted else { return seen.record("grant failed") };
    seen.record(GRANTED);
    // The expiry it was granted with, and how far past it an answer must put the lease (the remaining
    // TTL is whole seconds, rounded down) to tell the promotion's extension.
    let granted_expiry = seen.now_ms() + plan.ttl_s * 1000;
    let mut extended = false;
    let mut at = GRANT_MS + POLL_MS;
    while at < plan.end_ms() {
        seen.until(&ctx, at).await;
        match ttl(&etcd, id).await {
            Some(-1) => return seen.record(GONE),
            Some(ttl) if !extended && seen.now_ms() + ttl as u64 * 1000 >= granted_expiry + 2000 => {
                extended = true;
                seen.record(EXTENDED);
            }
            _ => {}
        }
        at = (at + POLL_MS).max(seen.now_ms());
    }
}

/// The lease's remaining TTL in whole seconds (−1: gone), or `None` if the call failed.
async fn ttl(etcd: &impl EtcdApi, id: LeaseId) -> Option<i64> {
    match etcd.request(EtcdRequest::LeaseTimeToLive { id }).await {
        Ok(EtcdReply::TimeToLive { ttl_s, .. }) => Some(ttl_s),
        _ => None,
    }
}
