//! `redis.watchdog`: a lock whose TTL a background watchdog keeps renewing while it is held.
//!
//! Source: Redisson `RedissonLock` without a lease time (`lockWatchdogTimeout`, default 30 s).
//! 1. `SET lock <id> NX PX watchdog_timeout` (Redisson: a Lua script on a hash; the same effect for a
//!    non-reentrant holder); taken: sleep `retry` and try again (Redisson waits on a pub/sub channel; the
//!    polling here changes the wake-up latency, not safety).
//! 2. `INCR lock:fence` for a fencing token.
//! 3. While held, every `watchdog_timeout / 3` the watchdog runs compare-and-pexpire(id, watchdog_timeout).
//!    Any failure — the key is not ours, or the command fails — stops the renewal, as Redisson's
//!    `renewExpiration` does; the holder is not told.
//! 4. Release: stop the watchdog, then compare-and-delete.
//!
//! Expected failures (catalog): the watchdog runs on the holder's node, so a pause of the holder longer
//! than `watchdog_timeout` stops the renewals too; the key expires under a holder that still believes it
//! holds the lock — `double-holder`. Shorter pauses are absorbed by the renewals.

use super::{spin, try_set_nx, RedisApi, RedisServers, SimRedis, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY};
use crate::params::{ParamSpec, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::redis::{RedisReply, Script};
use locksim_sim::ctx::{Background, Ctx};

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.watchdog",
    family: &super::FAMILY,
    summary: "Redisson-style: TTL renewed by a background watchdog every timeout/3 while held",
    source: "Redisson RedissonLock, lockWatchdogTimeout",
    params: &[
        ParamSpec::duration(
            "watchdog_timeout",
            30_000,
            "the key's TTL, renewed every third of it (Redisson lockWatchdogTimeout)",
        ),
        RETRY,
        ACQUIRE_TIMEOUT,
        CALL_TIMEOUT,
    ],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    validate: super::one_master,
    build,
};

struct Watchdog {
    ctx: Ctx,
    params: Params,
    servers: Servers,
    redis: SimRedis,
    value: String,
    renewal: Option<Background>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = SimRedis::new(ctx.clone(), RedisServers::from(servers), 0, params.duration("call_timeout"));
    Box::new(Watchdog {
        ctx,
        params: params.clone(),
        servers: servers.clone(),
        redis,
        value: String::new(),
        renewal: None,
    })
}

#[async_trait(?Send)]
impl Lock for Watchdog {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.value = super::lock_value(&self.ctx);
        let lease = self.params.duration("watchdog_timeout");
        let (redis, value) = (&self.redis, &self.value);
        let outcome =
            spin(&self.ctx, &self.params, redis, || try_set_nx(redis, value, Some(lease.as_millis() as i64))).await;
        if let Outcome::Ok(_) = outcome {
            let redis = SimRedis::new(
                self.ctx.clone(),
                RedisServers::from(&self.servers),
                0,
                self.params.duration("call_timeout"),
            );
            let (ctx, value) = (self.ctx.clone(), self.value.clone());
            self.renewal = Some(self.ctx.spawn(async move {
                let script = Script::CompareAndPexpire { ms: lease.as_millis() as i64 };
                loop {
                    ctx.sleep(lease / 3).await;
                    if redis.eval(script, LOCK_KEY, &value).await != Ok(RedisReply::Int(1)) {
                        return;
                    }
                }
            }));
        }
        outcome
    }

    async fn release(&mut self) -> Outcome<()> {
        self.renewal = None;
        super::released(self.redis.eval(Script::CompareAndDelete, LOCK_KEY, &self.value).await)
    }
}
