//! Redis under Sentinel: the model's master, replicas and Sentinels (`sim/src/backend/redis/sentinel.rs`)
//! against a real Redis 7.0 master, its replicas and three real Sentinels on loopback, whose links to
//! each other go through locksim's proxies; each side with the same client, redis-py's Sentinel client
//! as the recipes have it ([`RedisConn`]: it asks a Sentinel for the master, stays on it until a
//! command fails or is refused with `READONLY`), so that what differs is the servers.
//!
//! One client writes `SET k <the plan's time>` every 100 ms from 200 ms. A plan is one of two kinds.
//!
//! **The master cut off from every other member** (replicas and Sentinels) for the failover and some
//! seconds more, while the client still reaches it: the documented split brain. The client stays on
//! the old master, whose writes after the cut are lost. With `min-replicas-to-write 1` the old master
//! refuses writes once its replicas' acknowledgements are older than `min-replicas-max-lag`; without
//! it, it takes them. After the heal the Sentinels see it report the master role and, 8 s later
//! (`sentinelRefreshInstanceInfo`), make it a replica of the new master.
//!
//! **The master killed** (SIGKILL, not started again): the Sentinels see it down after
//! `down-after-milliseconds`, agree, elect a leader and promote a replica; the client's writes fail
//! until a Sentinel names the new master.
//!
//! What the timeline holds, each the first time:
//! - `write failed`: a write that timed out or whose connection broke;
//! - `write refused: NOREPLICAS`: the `min-replicas-*` check (each replica acknowledges every second,
//!   and the master recounts its good replicas every second);
//! - `write refused: READONLY`: the old master converted to a replica;
//! - `kept`, at the time of the write the new master kept last: after a failure or `READONLY` the
//!   client reads `k` (through the Sentinels, from the new master) before it writes again — what the
//!   failover lost;
//! - `write ok again`: the first write acknowledged after a failure or a refusal.
//!
//! So it measures what the Sentinel catalog's verdicts turn on: how long a cut-off master takes
//! writes, when the failover completes, when the old master stops taking writes, and which writes
//! are lost. Real Sentinels' timers run at `hz` 10 with a random spread, PING once a second and
//! start a failover up to 1 s late (`SENTINEL_MAX_DESYNC`); the margins allow for it.

use super::{model_play, real_play, Client, EnsembleFamily, Model, Seen};
use crate::conform::client::{Margin, Timeline};
use crate::servers::{Cluster, Launcher};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::redis::{RedisApi, RedisConn, BACKEND_PARAMS, FAMILY};
use locksim_locks::{Family, Servers};
use locksim_sim::backend::redis::{RedisReply, RedisRequest, SetCondition};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use std::fmt;
use std::time::Duration;

/// One plan (times from the moment the client starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The master's replicas: 1 or 2.
    pub replicas: usize,
    /// `down-after-milliseconds`.
    pub down_after_ms: u64,
    pub fault: MasterFault,
}

/// A plan's fault, at the master `redis-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterFault {
    /// Cut off from every other member at `at_ms` for `cut_ms`; `min-replicas-to-write` and
    /// `min-replicas-max-lag` (whole seconds).
    Cut { at_ms: u64, cut_ms: u64, min_replicas: i64, max_lag_s: u64 },
    /// Killed at `at_ms`, for good.
    Kill { at_ms: u64 },
}

/// When the client writes first, and how often.
const WRITE_FROM_MS: u64 = 200;
const STEP_MS: u64 = 100;
/// Each command's timeout (redis-py's `socket_timeout`).
const CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// The key the client writes.
const KEY: &str = "k";

pub const FAILED: &str = "write failed";
pub const NOREPLICAS: &str = "write refused: NOREPLICAS";
pub const READONLY: &str = "write refused: READONLY";
pub const KEPT: &str = "kept";
pub const OK_AGAIN: &str = "write ok again";

impl Plan {
    fn end_ms(&self) -> u64 {
        match self.fault {
            // The heal; the Sentinels' new connections to the old master get through at their next
            // SYN (up to 4 s later); the conversion 8 s after their first INFO of it, seen on their
            // next INFO (every 10 s); the resynchronisation, and room.
            MasterFault::Cut { at_ms, cut_ms, .. } => at_ms + cut_ms + 17_000,
            // The failover: down-after, the quorum, the vote, the promotion, and room.
            MasterFault::Kill { at_ms } => at_ms + self.down_after_ms + 8_000,
        }
    }

    fn min_replicas(&self) -> i64 {
        match self.fault {
            MasterFault::Cut { min_replicas, .. } => min_replicas,
            MasterFault::Kill { .. } => 0,
        }
    }

    fn max_lag_s(&self) -> u64 {
        match self.fault {
            MasterFault::Cut { max_lag_s, .. } => max_lag_s,
            MasterFault::Kill { .. } => 10,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redis-0 and {} replica(s) under three Sentinels, down-after {} ms; SET {KEY} every {STEP_MS} ms from \
             {WRITE_FROM_MS} ms; ",
            self.replicas, self.down_after_ms
        )?;
        match self.fault {
            MasterFault::Cut { at_ms, cut_ms, min_replicas, max_lag_s } => write!(
                f,
                "min-replicas-to-write {min_replicas} (max lag {max_lag_s} s); at {at_ms} ms redis-0 is cut off from \
                 every other member for {cut_ms} ms"
            ),
            MasterFault::Kill { at_ms } => write!(f, "at {at_ms} ms redis-0 is killed"),
        }
    }
}

/// Redis under three Sentinels.
#[derive(Default)]
pub struct RedisSentinel;

impl EnsembleFamily for RedisSentinel {
    const NAME: &'static str = "redis-sentinel";
    const ABOUT: &'static str = "Ensemble: a real Redis master, its replicas and three real Sentinels, the master cut \
                                 off or killed — when it refuses writes (min-replicas-*), when the failover \
                                 completes, when the old master turns read-only, which writes are lost.";
    type Plan = Plan;
    /// Redis servers are small and mostly idle: four deployments at once.
    const AT_ONCE: usize = 4;

    fn launcher() -> &'static Launcher {
        &crate::servers::REDIS
    }

    fn family() -> &'static Family {
        &FAMILY
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        let replicas = rng.gen_range(1..=2);
        let down_after_ms = rng.gen_range(2..=6) * 500;
        let at_ms = rng.gen_range(10..=20) * 100;
        let fault = match rng.gen_bool(0.5) {
            true => MasterFault::Cut {
                at_ms,
                // The failover, and a few seconds of two masters.
                cut_ms: down_after_ms + rng.gen_range(60..=80) * 100,
                min_replicas: rng.gen_range(0..=1),
                max_lag_s: rng.gen_range(1..=3),
            },
            false => MasterFault::Kill { at_ms },
        };
        Plan { replicas, down_after_ms, fault }
    }

    fn kind(plan: &Plan) -> &'static str {
        match plan.fault {
            MasterFault::Cut { min_replicas: 0, .. } => "master cut off, min-replicas-to-write 0",
            MasterFault::Cut { .. } => "master cut off, min-replicas-to-write 1",
            MasterFault::Kill { .. } => "master killed",
        }
    }

    fn backend(plan: &Plan) -> Params {
        Params::resolve(
            BACKEND_PARAMS,
            [
                ("replicas", ParamValue::Int(plan.replicas as i64)),
                ("sentinels", ParamValue::Int(3)),
                ("down_after", ParamValue::Duration(Duration::from_millis(plan.down_after_ms))),
                ("min_replicas_to_write", ParamValue::Int(plan.min_replicas())),
                ("min_replicas_max_lag", ParamValue::Duration(Duration::from_secs(plan.max_lag_s()))),
            ],
        )
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        let backend = RedisSentinel::backend(plan);
        let fault = Fault {
            at: Duration::from_millis(match plan.fault {
                MasterFault::Cut { at_ms, .. } | MasterFault::Kill { at_ms } => at_ms,
            }),
            target: Target::Node("redis-0".into()),
            action: match plan.fault {
                MasterFault::Cut { cut_ms, .. } => Action::Partition {
                    peers: (FAMILY.topology)(&backend).servers.into_iter().skip(1).collect(),
                    duration: Some(Duration::from_millis(cut_ms)),
                },
                MasterFault::Kill { .. } => Action::Crash { restart_after: None, host: false },
            },
            on: None,
        };
        model_play(seed, deployment(&backend), plan, &CLIENTS, vec![fault], plan.end_ms())
    }

    fn real(&self, plan: &Plan, cluster: &Cluster) -> anyhow::Result<Timeline> {
        let backend = RedisSentinel::backend(plan);
        real_play(cluster, &deployment(&backend), plan, &CLIENTS, plan.end_ms(), |play| match plan.fault {
            MasterFault::Cut { at_ms, cut_ms, .. } => {
                play.at(at_ms, "the cut");
                (1..cluster.size()).for_each(|other| cluster.cut(0, other, true));
                play.at(at_ms + cut_ms, "the heal");
                (1..cluster.size()).for_each(|other| cluster.cut(0, other, false));
                Ok(())
            }
            MasterFault::Kill { at_ms } => {
                play.at(at_ms, "the kill");
                cluster.member(0).crash()
            }
        })
    }

    fn margin(plan: &Plan, what: &str) -> Margin {
        match what {
            // Each replica acknowledges once a second and the master recounts once a second, each on
            // its own phase.
            NOREPLICAS => Margin { early_ms: 1100, late_ms: 1100 },
            // Sentinels PING once a second, ask each other once a second, start a failover up to 1 s
            // late, and learn of the promotion on a replica's INFO (once a second in a failover).
            OK_AGAIN if matches!(plan.fault, MasterFault::Kill { .. }) => Margin { early_ms: 2500, late_ms: 2500 },
            // After the heal: the Sentinels' next INFO of the old master, 8 s after the first (each
            // Sentinel its own), and the resynchronisation.
            READONLY | OK_AGAIN => Margin { early_ms: 2500, late_ms: 2500 },
            FAILED if matches!(plan.fault, MasterFault::Cut { .. }) => Margin { early_ms: 2500, late_ms: 2500 },
            _ => Margin { early_ms: 150, late_ms: 300 },
        }
    }
}

/// The deployment of `backend`, on either side.
fn deployment(backend: &Params) -> Model<'_> {
    Model { family: &FAMILY, backend, pin: |servers, _| servers.clone() }
}

/// One client, whose servers are every member: it asks the Sentinels.
const CLIENTS: [Client<Plan>; 1] = [Client {
    name: "client-0",
    member: None,
    run: |plan, ctx, servers, seen| Box::pin(writer(plan, ctx, servers, seen)),
}];

/// The writer: `SET k <now>` every step; after a failure or `READONLY`, `GET k` until it answers (the
/// write the master it now reaches kept), then writes again.
async fn writer(plan: Plan, ctx: Ctx, servers: Servers, seen: Seen) {
    let redis = RedisConn::new(ctx.clone(), &servers, 0, CALL_TIMEOUT);
    let first = |what: &'static str| {
        if seen.at(what).is_none() {
            seen.record(what);
        }
    };
    // Since the last acknowledged write: a failure or a refusal (`ok again` is due), and whether
    // the write the servers kept is still to be read.
    let (mut troubled, mut unread) = (false, false);
    let mut at = WRITE_FROM_MS;
    while at < plan.end_ms() {
        seen.until(&ctx, at).await;
        if unread {
            match redis.request(RedisRequest::Get { key: KEY.into() }).await {
                Ok(RedisReply::Bulk(v)) => {
                    unread = false;
                    seen.record_at(v.parse().expect("the writer's own value"), KEPT);
                }
                Err(_) => first(FAILED),
                Ok(_) => {}
            }
        } else {
            let set = RedisRequest::Set {
                key: KEY.into(),
                value: at.to_string(),
                condition: SetCondition::Always,
                px_ms: None,
            };
            match redis.request(set).await {
                Ok(RedisReply::Ok) if troubled => {
                    troubled = false;
                    first(OK_AGAIN);
                }
                Ok(RedisReply::Error(e)) if e.starts_with("NOREPLICAS") => {
                    troubled = true;
                    first(NOREPLICAS);
                }
                Ok(RedisReply::Error(e)) if e.starts_with("READONLY") => {
                    (troubled, unread) = (true, seen.at(KEPT).is_none());
                    first(READONLY);
                }
                Err(_) => {
                    (troubled, unread) = (true, seen.at(KEPT).is_none());
                    first(FAILED);
                }
                Ok(_) => {}
            }
        }
        at = (at + STEP_MS).max(seen.now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::ensemble::plan;

    fn first_of(kind: &str) -> (u64, Plan) {
        let seed = (0..100).find(|s| RedisSentinel::kind(&plan::<RedisSentinel>(*s)) == kind).expect("drawn");
        (seed, plan::<RedisSentinel>(seed))
    }

    #[test]
    fn plans_draw_every_kind_and_cut_past_the_failover() {
        let plans: Vec<Plan> = (0..100).map(plan::<RedisSentinel>).collect();
        for kind in
            ["master cut off, min-replicas-to-write 0", "master cut off, min-replicas-to-write 1", "master killed"]
        {
            assert!(plans.iter().any(|p| RedisSentinel::kind(p) == kind), "{kind}");
        }
        for p in &plans {
            assert!((1..=2).contains(&p.replicas) && (1000..=3000).contains(&p.down_after_ms), "{p}");
            if let MasterFault::Cut { cut_ms, .. } = p.fault {
                assert!(cut_ms >= p.down_after_ms + 6000, "the cut outlasts the failover: {p}");
            }
        }
    }

    #[test]
    fn the_models_sentinels_fail_a_killed_master_over_and_keep_its_last_write() {
        let (seed, p) = first_of("master killed");
        let MasterFault::Kill { at_ms } = p.fault else { unreachable!() };
        let t = RedisSentinel.model(&p, seed);
        assert_eq!(t.at(KEPT), Some(at_ms - STEP_MS), "{t:?}");
        assert!(t.at(FAILED).is_some_and(|f| f >= at_ms && f < at_ms + STEP_MS), "{t:?}");
        // down-after, then the quorum, the vote and the promotion: a few seconds, not a split vote's
        // wait of twice failover-timeout.
        let again = t.at(OK_AGAIN).expect("failed over");
        assert!(again > at_ms + p.down_after_ms && again < at_ms + p.down_after_ms + 5000, "{t:?}");
        assert_eq!(t.at(READONLY), None, "{t:?}");
    }

    #[test]
    fn the_models_old_master_takes_writes_through_the_cut_then_drops_its_clients_and_loses_them() {
        let (seed, p) = first_of("master cut off, min-replicas-to-write 0");
        let MasterFault::Cut { at_ms, cut_ms, .. } = p.fault else { unreachable!() };
        let t = RedisSentinel.model(&p, seed);
        // What the old master took after the cut is lost: the new master has the last write before it.
        assert!(t.at(KEPT).is_some_and(|k| k < at_ms && k + STEP_MS >= at_ms), "{t:?}");
        // Converted 8 s after the Sentinels' first INFO of it, seen on their next INFO: its clients'
        // connections closed (CLIENT KILL), not refused with READONLY.
        let heal = at_ms + cut_ms;
        assert!(t.at(FAILED).is_some_and(|f| f > heal + 8000 && f < heal + 16_000), "{t:?}");
        assert_eq!((t.at(READONLY), t.at(NOREPLICAS)), (None, None), "{t:?}");
        assert!(t.at(OK_AGAIN) > t.at(FAILED), "{t:?}");
    }

    #[test]
    fn the_models_cut_off_master_refuses_writes_once_its_replicas_acknowledgements_are_too_old() {
        let (seed, p) = first_of("master cut off, min-replicas-to-write 1");
        let MasterFault::Cut { at_ms, max_lag_s, .. } = p.fault else { unreachable!() };
        let t = RedisSentinel.model(&p, seed);
        // The last acknowledgement came within a second before the cut; the lag is counted in whole
        // seconds, and the master recounts once a second.
        let lag = max_lag_s * 1000;
        assert!(t.at(NOREPLICAS).is_some_and(|n| n >= at_ms + lag - 1000 && n <= at_ms + lag + 2000), "{t:?}");
        assert!(t.at(FAILED).is_some() && t.at(OK_AGAIN) > t.at(FAILED), "{t:?}");
    }
}
