//! The etcd cluster's second kind of plan: the leader paused past an election while a client on each
//! member reads (the module above says what it measures and why a stale read on the paused member is
//! counted one way only).

use super::{deployment, EtcdCluster, Plan};
use crate::conform::client::{Margin, Timeline};
use crate::conform::ensemble::{real_play, Client, EnsembleFamily, Seen};
use crate::servers::Cluster;
use locksim_locks::etcd::{connect, EtcdApi};
use locksim_locks::Servers;
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, Op, OpResult, Range};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::time::Duration;

/// The leader paused, and the write, on the plan's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    pub pause_ms: u64,
    /// How long the leader stays paused.
    pub down_ms: u64,
}

/// When the clients start reading.
const READ_FROM_MS: u64 = 300;
/// How often each reads.
const POLL_MS: u64 = 100;
/// Each call's deadline: a read on the paused member gives up after it and the next goes out.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How far into the pause the clients write: the others have elected a leader by then (an election
/// timeout of 1–2 s, then a pre-vote and a vote).
const WRITE_INTO_PAUSE_MS: u64 = 3000;
/// The key read and written.
const KEY: &str = "locksim/read";

pub const WRITTEN: &str = "written";
pub const FRESH: &str = "paused member fresh";
pub const STALE_ON_PAUSED: &str = "stale read on the paused member";
pub const STALE_ON_FOLLOWER: &str = "stale read on a follower";

impl Pause {
    pub fn draw(rng: &mut ChaCha8Rng) -> Pause {
        Pause { pause_ms: rng.gen_range(10..=20) * 100, down_ms: rng.gen_range(40..=60) * 100 }
    }

    fn write_ms(&self) -> u64 {
        self.pause_ms + WRITE_INTO_PAUSE_MS
    }

    fn resume_ms(&self) -> u64 {
        self.pause_ms + self.down_ms
    }

    pub(super) fn end_ms(&self) -> u64 {
        self.resume_ms() + 4000
    }

    /// The pause as a scenario's pause of the `leader`.
    pub(super) fn fault(&self) -> Fault {
        Fault {
            at: Duration::from_millis(self.pause_ms),
            target: Target::Node("leader".into()),
            action: Action::Pause { duration: Duration::from_millis(self.down_ms) },
            on: None,
        }
    }

    /// The plan on a real cluster: the leader stopped (SIGSTOP) and continued (SIGCONT).
    pub(super) fn real(&self, plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
        real_play(cluster, &deployment(&EtcdCluster::backend(plan)), plan, &CLIENTS, self.end_ms(), |play| {
            play.at(self.pause_ms, "the pause");
            let Some(leader) = cluster.leader() else { anyhow::bail!("the real cluster had no leader at the pause") };
            cluster.member(leader).stop()?;
            play.at(self.resume_ms(), "the resume");
            cluster.member(leader).resume()
        })
    }
}

impl fmt::Display for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a client on each member reads {KEY} every {POLL_MS} ms from {READ_FROM_MS} ms; at {} ms the leader is \
             paused for {} ms; at {} ms each client writes {KEY}",
            self.pause_ms,
            self.down_ms,
            self.write_ms()
        )
    }
}

/// How far from the model's time a real event of this kind may come (`None`: not one of its events).
pub(super) fn margin(what: &str) -> Option<Margin> {
    match what {
        // The resumed leader hears of the new term from its backlog, forwards its reads' index to the
        // new leader and answers: within 70 ms of the model's time over the first real plays (the
        // model's comes 30–45 ms after the resume); the rest is a busy machine's room.
        FRESH => Some(Margin { early_ms: 300, late_ms: 500 }),
        _ => None,
    }
}

/// A client on each member alone.
pub(super) const CLIENTS: [Client<Plan>; 3] = [
    Client {
        name: "client-0",
        member: Some(0),
        run: |plan, ctx, servers, seen| Box::pin(reader(plan, ctx, servers, seen)),
    },
    Client {
        name: "client-1",
        member: Some(1),
        run: |plan, ctx, servers, seen| Box::pin(reader(plan, ctx, servers, seen)),
    },
    Client {
        name: "client-2",
        member: Some(2),
        run: |plan, ctx, servers, seen| Box::pin(reader(plan, ctx, servers, seen)),
    },
];

/// A client of one member: reads the key every [`POLL_MS`], writes it once at the plan's time. Its
/// member is the paused one if it answered nothing from the write until the resume.
async fn reader(plan: Plan, ctx: Ctx, servers: Servers, seen: Seen) {
    let Plan::Pause(p) = &plan else { unreachable!("the readers play a pause") };
    let etcd = connect(&ctx, &servers, CALL_TIMEOUT);
    let (mut wrote, mut paused, mut fresh, mut stale) = (false, None, false, false);
    let mut at = READ_FROM_MS;
    while at < p.end_ms() {
        seen.until(&ctx, at).await;
        let sent = seen.now_ms();
        if !wrote && sent >= p.write_ms() {
            wrote = true;
            let put = Op::Put { key: KEY.into(), value: WRITTEN.into(), lease: 0 };
            if etcd.request(EtcdRequest::Op(put)).await.is_ok() && seen.at(WRITTEN).is_none() {
                seen.record(WRITTEN);
            }
        } else if let (Some(there), now) = (read(&etcd).await, seen.now_ms()) {
            // Which member this is, by its first answer from the write on.
            let paused = match now >= p.write_ms() {
                true => *paused.get_or_insert(now >= p.resume_ms()),
                false => false,
            };
            if paused && there && !fresh {
                fresh = true;
                seen.record(FRESH);
            }
            if seen.at(WRITTEN).is_some_and(|w| sent >= w) && !there && !stale {
                stale = true;
                seen.record(if paused { STALE_ON_PAUSED } else { STALE_ON_FOLLOWER });
            }
        }
        at = (at + POLL_MS).max(seen.now_ms());
    }
}

/// Whether a linearizable read finds the key (`None`: the call failed).
async fn read(etcd: &impl EtcdApi) -> Option<bool> {
    match etcd.request(EtcdRequest::Op(Op::Range(Range::key(KEY)))).await {
        Ok(EtcdReply::Op { result: OpResult::Range { kvs, .. }, .. }) => Some(!kvs.is_empty()),
        _ => None,
    }
}
