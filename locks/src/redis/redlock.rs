//! `redis.redlock`: the Redlock algorithm over N independent Redis masters.
//!
//! Source: "Distributed Locks with Redis" (redis.io) and its reference clients (redlock-rb, Redlock-py).
//! 1. Take the time t1 by this client's clock.
//! 2. For each master in turn: `SET lock <id> NX PX ttl` with a short `instance_timeout`; count the OKs.
//! 3. elapsed = now − t1; drift = ttl × 1% + 2 ms; validity = ttl − elapsed − drift.
//! 4. Acquired if a majority (N/2 + 1) said OK and validity > 0. Otherwise unlock on every master, sleep
//!    a random time up to `retry_delay`, and retry, `retry_count` times in all.
//! 5. Release: unlock on every master — `EVAL` of the page's script (`if GET == id then DEL`).
//!
//! Redlock offers no fencing token (Kleppmann's main objection), so it cannot be used with fencing.
//! With `check_validity = false` step 4 skips the validity test — a variant kept to show why it is there.
//!
//! Expected failures (catalog): safe without faults. `double-holder` when a master's clock jumps forward
//! and expires the key (Kleppmann's schedule), when a master without persistence crashes and restarts
//! empty, and — only without the validity check — when the client pauses between its SETs and counting
//! their replies for longer than the TTL.

use super::scripts::REDLOCK_UNLOCK;
use super::{RedisApi, RedisServers, SimRedis, LOCK_KEY, TTL};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::redis::{RedisReply, SetCondition};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Point, TriggerEvent};
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.redlock",
    family: &super::FAMILY,
    summary: "Redlock: majority of N masters, validity = TTL - elapsed - drift",
    source: "redis.io Distributed Locks with Redis; redlock-rb, Redlock-py",
    params: &[
        TTL,
        ParamSpec::int("retry_count", (1, 100), 3, "rounds of trying every master before giving up"),
        ParamSpec::duration("retry_delay", 200, "upper bound of the random sleep between rounds"),
        ParamSpec::duration(
            "instance_timeout",
            50,
            "timeout of each command to one master (much smaller than the TTL)",
        ),
        ParamSpec {
            name: "check_validity",
            kind: ParamKind::Bool,
            default: ParamValue::Bool(true),
            doc: "require validity = ttl - elapsed - drift > 0 (false: the broken variant)",
        },
    ],
    offers_token: false,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[REDLOCK_MAJORITY],
    validate: at_least_three_masters,
    build,
};

/// A round has just counted its majority of OKs, and is still to ask the masters after it and to compute
/// the lock's validity. A pause here longer than the TTL expires the keys it counted: the validity check
/// is what refuses them.
pub const REDLOCK_MAJORITY: Point = Point {
    name: "redlock-majority",
    doc: "redis.redlock: a round has its majority of OKs; the rest of the masters and the validity check follow",
};

fn at_least_three_masters(recipe: &Params, backend: &Params) -> Result<(), String> {
    super::positive_ttl(recipe)?;
    if backend.int("sentinels") > 0 {
        return Err(
            "redis.redlock over Sentinel-managed masters is not modelled yet: set [backend] sentinels = 0".into()
        );
    }
    super::sentinel_settings(backend)?;
    match backend.int("masters") {
        n if n >= 3 => Ok(()),
        n => Err(format!("redis.redlock needs at least 3 masters ([backend] masters), got {n}")),
    }
}

struct Redlock {
    ctx: Ctx,
    params: Params,
    masters: Vec<SimRedis>,
    value: String,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let servers = RedisServers::from(servers);
    let timeout = params.duration("instance_timeout");
    let masters = (0..servers.shards.len()).map(|i| SimRedis::new(ctx.clone(), servers, i, timeout)).collect();
    Box::new(Redlock { ctx, params: params.clone(), masters, value: String::new() })
}

impl Redlock {
    /// A majority of the masters.
    fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }

    /// Compare-and-delete our value on every master; how many deleted it, and whether all timed out.
    async fn unlock_all(&self) -> (usize, bool) {
        let (mut deleted, mut answered) = (0, false);
        for m in &self.masters {
            match m.eval(REDLOCK_UNLOCK, &[LOCK_KEY], &[&self.value]).await {
                Ok(RedisReply::Int(1)) => (deleted, answered) = (deleted + 1, true),
                Ok(_) => answered = true,
                Err(_) => {}
            }
        }
        (deleted, answered)
    }

    /// One round: the number of masters that said OK and the remaining validity in ms.
    async fn round(&self) -> (usize, i64) {
        let ttl_ms = self.params.duration("ttl").as_millis() as i64;
        let t1 = self.ctx.now_ms();
        let mut locked = 0;
        for m in &self.masters {
            if m.set(LOCK_KEY, &self.value, SetCondition::Nx, Some(ttl_ms)).await == Ok(RedisReply::Ok) {
                locked += 1;
                if locked == self.quorum() {
                    self.ctx.point(TriggerEvent::Declared(&REDLOCK_MAJORITY)).await;
                }
            }
        }
        let drift = ttl_ms / 100 + 2;
        (locked, ttl_ms - (self.ctx.now_ms() - t1) - drift)
    }
}

#[async_trait(?Send)]
impl Lock for Redlock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let quorum = self.quorum();
        for _ in 0..self.params.int("retry_count") {
            self.value = super::lock_value(&self.ctx);
            let (locked, validity_ms) = self.round().await;
            if locked >= quorum && (validity_ms > 0 || !self.params.bool("check_validity")) {
                return Outcome::Ok(Grant { token: None });
            }
            self.unlock_all().await;
            self.ctx.sleep(self.ctx.random_duration(Duration::ZERO, self.params.duration("retry_delay"))).await;
        }
        Outcome::Fail("no majority within the validity time".into())
    }

    async fn release(&mut self) -> Outcome<()> {
        match self.unlock_all().await {
            (_, false) => Outcome::Unknown("no master answered the unlock".into()),
            (n, true) if n >= self.quorum() => Outcome::Ok(()),
            (n, true) => Outcome::Fail(format!("only {n} masters still had our key")),
        }
    }
}
