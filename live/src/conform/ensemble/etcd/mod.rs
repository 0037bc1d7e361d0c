//! An etcd cluster under a fault at its leader: the model's cluster (`sim/src/backend/etcd/cluster.rs`)
//! against three real etcd members on loopback, each side with the same client (the model's, over
//! etcd's JSON gateway for real), so that what differs is the members. A plan is one of two kinds.
//!
//! **The leader killed while a lease is out.** A client grants a lease of TTL t at 300 ms and asks its
//! remaining TTL (`LeaseTimeToLive`) every 100 ms; between 1 and 2 s the leader is killed, and started
//! again with its data a while later. The client's endpoints are all three members; it moves to the
//! next when one cannot be reached. What the timeline holds:
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
//!
//! **The leader paused past an election while every member is read** ([`reads`]). A client on each
//! member alone reads a key (linearizably) every 100 ms; between 1 and 2 s the leader is paused
//! (SIGSTOP) for 4–6 s; the others elect a leader, and 3 s into the pause every client writes the key
//! through its member (the first acknowledgement is `written`). What the timeline holds:
//! - `written`;
//! - `paused member fresh`: the first read on the paused member answered with the write, after it
//!   resumes — how long the old leader takes to learn of the new one and confirm a read index with it;
//! - `stale read on the paused member` / `stale read on a follower`: a read sent after `written` and
//!   answered without it. A follower's is compared as any event (neither side should see one). The
//!   paused member's is the stale read of etcd#20418, which needs one order of its backlog — an
//!   acknowledgement of the old round, the read loop's retry, another acknowledgement, all before the
//!   new leader's first message: the model draws that order from the seed, a real member takes it as
//!   Go's scheduler has it, and nothing outside the process chooses it. So a stale read the model alone
//!   drew is not a mismatch ([`EtcdCluster::drawn`]: the seed is counted and named); one the real
//!   member showed and the model did not is.
//!
//! The real members are Debian's etcd 3.4.23, which asks a read index again under the same id (fixed in
//! 3.4.42, as in 3.5.28) and renews leases on a stuck leader's word (fixed in 3.4.31, as in 3.5.13):
//! the model plays them as `version = "3.5.12"`.

use super::{model_play, real_play, Client, EnsembleFamily, Model, Seen};
use crate::conform::client::{Margin, Timeline};
use crate::servers::{Cluster, Launcher};
use locksim_locks::etcd::{connect, EtcdApi, EtcdServers, BACKEND_PARAMS, FAMILY};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::{Family, Servers};
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, LeaseId};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::time::Duration;

pub mod reads;

/// One plan (times from the moment the clients start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The leader killed while a lease is out.
    Kill(Kill),
    /// The leader paused past an election while every member is read.
    Pause(reads::Pause),
}

/// The leader killed while a lease is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
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
        match self {
            // The election (up to 2 s), the TTL plus the election timeout, the lessor's look, and room.
            Plan::Kill(k) => k.kill_ms + 2000 + k.ttl_s * 1000 + 1000 + 2500,
            Plan::Pause(p) => p.end_ms(),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Kill(k) => write!(
                f,
                "grant a lease of TTL {} s at {GRANT_MS} ms, ask its TTL every {POLL_MS} ms; at {} ms the leader \
                 is killed, started again {} ms later",
                k.ttl_s, k.kill_ms, k.down_ms
            ),
            Plan::Pause(p) => write!(f, "{p}"),
        }
    }
}

/// The etcd cluster.
#[derive(Default)]
pub struct EtcdCluster;

impl EnsembleFamily for EtcdCluster {
    const NAME: &'static str = "etcd-cluster";
    const ABOUT: &'static str = "Ensemble: three real etcd members, the leader killed while a lease is out — when the \
                                 new leader extends the lease, when it expires — or paused past an election while \
                                 every member is read — when the old leader's reads are fresh again, and whether \
                                 any was stale.";
    type Plan = Plan;

    fn launcher() -> &'static Launcher {
        &crate::servers::ETCD
    }

    fn family() -> &'static Family {
        &FAMILY
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        match rng.gen_bool(0.5) {
            true => Plan::Kill(Kill {
                ttl_s: rng.gen_range(3..=6),
                kill_ms: rng.gen_range(10..=20) * 100,
                down_ms: rng.gen_range(15..=30) * 100,
            }),
            false => Plan::Pause(reads::Pause::draw(rng)),
        }
    }

    fn kind(plan: &Plan) -> &'static str {
        match plan {
            Plan::Kill(Kill { ttl_s: 3 | 4, .. }) => "short lease, leader killed",
            Plan::Kill(_) => "long lease, leader killed",
            Plan::Pause(_) => "leader paused, every member read",
        }
    }

    fn backend(_: &Plan) -> Params {
        // Debian's etcd 3.4.23 has both fixes' bugs, as 3.5.12 has (the module's doc).
        Params::resolve(BACKEND_PARAMS, [("servers", ParamValue::Int(3)), ("version", ParamValue::Choice("3.5.12"))])
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        let (clients, fault): (&[Client<Plan>], _) = match plan {
            Plan::Kill(k) => (&KILL_CLIENTS, kill(k)),
            Plan::Pause(p) => (&reads::CLIENTS, p.fault()),
        };
        model_play(seed, deployment(&EtcdCluster::backend(plan)), plan, clients, vec![fault], plan.end_ms())
    }

    fn real(&self, plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
        match plan {
            Plan::Kill(k) => real_kill(plan, k, cluster),
            Plan::Pause(p) => p.real(plan, cluster),
        }
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
            what => reads::margin(what).unwrap_or(Margin { early_ms: 150, late_ms: 300 }),
        }
    }

    fn drawn(_: &Plan, what: &str) -> bool {
        what == reads::STALE_ON_PAUSED
    }
}

/// The cluster of `backend`, on either side.
fn deployment(backend: &Params) -> Model<'_> {
    Model { family: &FAMILY, backend, pin: EtcdServers::pinned }
}

/// The kill as a scenario's crash of the `leader`.
fn kill(k: &Kill) -> Fault {
    Fault {
        at: Duration::from_millis(k.kill_ms),
        target: Target::Node("leader".into()),
        action: Action::Crash { restart_after: Some(Duration::from_millis(k.down_ms)), host: false },
        on: None,
    }
}

/// The kill on a real cluster: the leader killed (SIGKILL) and started again with its data.
fn real_kill(plan: &Plan, k: &Kill, cluster: &Cluster) -> anyhow::Result<Timeline> {
    real_play(cluster, &deployment(&EtcdCluster::backend(plan)), plan, &KILL_CLIENTS, plan.end_ms(), |play| {
        play.at(k.kill_ms, "the kill");
        let Some(leader) = cluster.leader() else { anyhow::bail!("the real cluster had no leader at the kill") };
        cluster.member(leader).crash()?;
        play.at(k.kill_ms + k.down_ms, "the restart");
        cluster.member(leader).relaunch(true)
    })
}

/// One client, whose endpoints are every member.
const KILL_CLIENTS: [Client<Plan>; 1] = [Client {
    name: "client-0",
    member: None,
    run: |plan, ctx, servers, seen| Box::pin(lease_client(plan, ctx, servers, seen)),
}];

/// The client: grant the lease, then ask its remaining TTL until it is gone or the plan ends.
async fn lease_client(plan: Plan, ctx: Ctx, servers: Servers, seen: Seen) {
    let Plan::Kill(k) = &plan else { unreachable!("the kill's client plays a kill") };
    let etcd = connect(&ctx, &servers, CALL_TIMEOUT);
    seen.until(&ctx, GRANT_MS).await;
    let granted = etcd.request(EtcdRequest::LeaseGrant { ttl_s: k.ttl_s as i64 }).await;
    let Ok(EtcdReply::LeaseGranted { id, .. }) = granted else { return seen.record("grant failed") };
    seen.record(GRANTED);
    // The expiry it was granted with, and how far past it an answer must put the lease (the remaining
    // TTL is whole seconds, rounded down) to tell the promotion's extension.
    let granted_expiry = seen.now_ms() + k.ttl_s * 1000;
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
