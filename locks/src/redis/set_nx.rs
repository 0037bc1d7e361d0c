//! `redis.set-nx`: the naive lock — `SET lock <id> NX` with no expiry, released with `DEL`; and
//! `redis.set-nx-expire`, the same lock given its expiry by a second command.
//!
//! Source: the `SETNX` locking pattern in the Redis documentation, before it grew an expiry; and the
//! `SETNX` + `EXPIRE` pair that code written before Redis 2.6.12 used, which the `SET` documentation
//! replaced with one atomic `SET key value NX PX ttl` (`redis.set-nx-px`).
//! 1. `SET lock <random id> NX`; nil means taken: sleep `retry` and try again, up to `acquire_timeout`.
//! 2. `redis.set-nx-expire` only: `PEXPIRE lock ttl`, a command of its own once the key is ours.
//! 3. `INCR lock:fence` for a fencing token.
//! 4. Release: `DEL lock`.
//!
//! Expected failures (catalog): a holder that crashes never releases, and nothing else ever will —
//! `deadlock`. A `SET` whose reply is lost leaves a lock its owner does not know it has — `deadlock` too.
//! With the expiry, a crash frees the lock after `ttl` — unless it comes between the two commands
//! (the point `redis-set-nx-expire`): then the key never expires, and the lock is lost for good.

use super::{spin, try_set_nx, Attempt, RedisApi, RedisConn, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY, TTL};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Point, TriggerEvent};

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.set-nx",
    family: &super::FAMILY,
    summary: "SET NX with no expiry, DEL to release: a crashed holder locks everyone out",
    source: "Redis docs, SETNX locking pattern",
    params: &[RETRY, ACQUIRE_TIMEOUT, CALL_TIMEOUT],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: super::one_master,
    build,
};

pub const EXPIRE_RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.set-nx-expire",
    summary: "SET NX, then PEXPIRE as a second command: a crash between the two leaves a key that never expires",
    source: "the SETNX + EXPIRE pair before Redis 2.6.12 (SET docs: SET NX PX replaces it)",
    params: &[TTL, RETRY, ACQUIRE_TIMEOUT, CALL_TIMEOUT],
    points: &[SET_NX_EXPIRE],
    build: build_expire,
    ..RECIPE
};

/// `redis.set-nx-expire`: `SET NX` has taken the key and its `PEXPIRE` is next. A crash here leaves a key
/// that never expires.
pub const SET_NX_EXPIRE: Point = Point {
    name: "redis-set-nx-expire",
    doc: "redis.set-nx-expire: SET NX took the key; its PEXPIRE is the next command",
};

struct SetNx {
    ctx: Ctx,
    params: Params,
    redis: RedisConn,
    /// `redis.set-nx-expire`: the TTL its second command sets.
    expire_ms: Option<i64>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    Box::new(SetNx { ctx, params: params.clone(), redis, expire_ms: None })
}

fn build_expire(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    let expire_ms = Some(params.duration("ttl").as_millis() as i64);
    Box::new(SetNx { ctx, params: params.clone(), redis, expire_ms })
}

#[async_trait(?Send)]
impl Lock for SetNx {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let value = super::lock_value(&self.ctx);
        let (ctx, redis, value, expire_ms) = (&self.ctx, &self.redis, &value, self.expire_ms);
        spin(ctx, &self.params, redis, || async move {
            let attempt = try_set_nx(redis, value, None).await;
            if let (Attempt::Taken, Some(ms)) = (&attempt, expire_ms) {
                ctx.point(TriggerEvent::Declared(&SET_NX_EXPIRE)).await;
                // The pattern ignores the reply: the key is ours, with or without its expiry.
                let _ = redis.pexpire(LOCK_KEY, ms).await;
            }
            attempt
        })
        .await
    }

    async fn release(&mut self) -> Outcome<()> {
        super::released(self.redis.del(LOCK_KEY).await)
    }
}
