//! `redis.set-nx`: the naive lock — `SET lock <id> NX` with no expiry, released with `DEL`.
//!
//! Source: the `SETNX` locking pattern in the Redis documentation, before it grew an expiry.
//! 1. `SET lock <random id> NX`; nil means taken: sleep `retry` and try again, up to `acquire_timeout`.
//! 2. `INCR lock:fence` for a fencing token.
//! 3. Release: `DEL lock`.
//!
//! Expected failures (catalog): a holder that crashes never releases, and nothing else ever will —
//! `deadlock`. A `SET` whose reply is lost leaves a lock its owner does not know it has — `deadlock` too.

use super::{spin, try_set_nx, RedisApi, RedisConn, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::ctx::Ctx;

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
    validate: super::one_master,
    build,
};

struct SetNx {
    ctx: Ctx,
    params: Params,
    redis: RedisConn,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    Box::new(SetNx { ctx, params: params.clone(), redis })
}

#[async_trait(?Send)]
impl Lock for SetNx {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let value = super::lock_value(&self.ctx);
        let redis = &self.redis;
        spin(&self.ctx, &self.params, redis, || try_set_nx(redis, &value, None)).await
    }

    async fn release(&mut self) -> Outcome<()> {
        super::released(self.redis.del(LOCK_KEY).await)
    }
}
