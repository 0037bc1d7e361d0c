//! `redis.getset-expiry`: the timestamp lock of the old `SETNX` docs, with `GETSET` to break stale locks.
//!
//! Source: Redis `SETNX` documentation, "Handling deadlocks" (the algorithm it later warned against).
//! The lock's value is the client's own clock time at which it expires:
//! 1. `SETNX lock <now + ttl + 1>` (now by this client's clock). Success: acquired.
//! 2. Otherwise `GET lock`. If that timestamp is still in the future: taken; sleep `retry` and go to 1.
//! 3. If it is in the past the holder is presumed dead: `GETSET lock <now + ttl + 1>`. If the old value
//!    returned is still in the past, we won the race: acquired. Otherwise another client got there first.
//! 4. `INCR lock:fence` for a fencing token.
//! 5. Release: `DEL lock`, but only while our own timestamp is still in the future by our clock.
//!
//! Expected failures (catalog): expiry is judged by the *contender's* clock. A contender whose clock jumps
//! ahead by more than `ttl` sees a live lock as expired and takes it over — `double-holder`.

use super::{spin, Attempt, RedisApi, RedisConn, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY, TTL};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::redis::{RedisReply, SetCondition};
use locksim_sim::ctx::Ctx;
use locksim_sim::net::CallError;
use std::cell::Cell;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.getset-expiry",
    family: &super::FAMILY,
    summary: "SETNX of an expiry timestamp; GETSET takes over a lock that looks expired by the caller's clock",
    source: "Redis docs, SETNX: handling deadlocks",
    params: &[TTL, RETRY, ACQUIRE_TIMEOUT, CALL_TIMEOUT],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: super::one_master,
    build,
};

struct GetsetExpiry {
    ctx: Ctx,
    params: Params,
    redis: RedisConn,
    /// Our lock's expiry timestamp (our clock, ms).
    expires_ms: Cell<i64>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    Box::new(GetsetExpiry { ctx, params: params.clone(), redis, expires_ms: Cell::new(0) })
}

/// Is the timestamp stored in `reply` in the past at `now_ms`? A missing key counts as expired.
fn expired(reply: &RedisReply, now_ms: i64) -> bool {
    match reply {
        RedisReply::Bulk(v) => v.parse::<i64>().map_or(true, |at| at < now_ms),
        _ => true,
    }
}

impl GetsetExpiry {
    async fn attempt(&self) -> Result<Attempt, CallError> {
        let ttl_ms = self.params.duration("ttl").as_millis() as i64;
        let ours = self.ctx.now_ms() + ttl_ms + 1;
        if self.redis.set(LOCK_KEY, &ours.to_string(), SetCondition::Nx, None).await? == RedisReply::Ok {
            self.expires_ms.set(ours);
            return Ok(Attempt::Taken);
        }
        if !expired(&self.redis.get(LOCK_KEY).await?, self.ctx.now_ms()) {
            return Ok(Attempt::Busy);
        }
        let ours = self.ctx.now_ms() + ttl_ms + 1;
        let old = self.redis.getset(LOCK_KEY, &ours.to_string()).await?;
        if expired(&old, self.ctx.now_ms()) {
            self.expires_ms.set(ours);
            return Ok(Attempt::Taken);
        }
        Ok(Attempt::Busy)
    }
}

#[async_trait(?Send)]
impl Lock for GetsetExpiry {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let this = &*self;
        spin(&this.ctx, &this.params, &this.redis, || async {
            this.attempt().await.unwrap_or_else(|_| Attempt::Unknown("a lock command timed out".into()))
        })
        .await
    }

    async fn release(&mut self) -> Outcome<()> {
        if self.ctx.now_ms() >= self.expires_ms.get() {
            return Outcome::Fail("our timestamp has passed: the key may be someone else's, not deleting".into());
        }
        super::released(self.redis.del(LOCK_KEY).await)
    }
}
