//! `redis.set-nx-px`: `SET lock <id> NX PX <ttl>`, released by `DEL` or by compare-and-delete.
//!
//! Source: the Redis `SET` documentation ("Patterns: a simple locking primitive"), redis-py `Lock`.
//! 1. `SET lock <random id> NX PX ttl`; nil means taken: sleep `retry`, try again up to `acquire_timeout`.
//! 2. `INCR lock:fence` for a fencing token.
//! 3. Release with `release = "del"`: `DEL lock` — whoever's key it is.
//!    With `release = "compare-and-delete"`: redis-py's release script (`if GET == id then DEL`), by
//!    `EVALSHA`, loaded with `SCRIPT LOAD` when the server answers `NOSCRIPT` — only our own key.
//!
//! Expected failures (catalog): a holder paused longer than `ttl` loses the key while it still believes it
//! holds the lock — `double-holder`, and without fencing `unsafe-write`. With `del`, the paused holder's
//! release then deletes the *next* holder's key, letting a third client in. Compare-and-delete fixes the
//! release but not the pause; fencing (`fencing = true`) stops the stale write at the resource.

use super::scripts::REDIS_PY_RELEASE;
use super::{spin, try_set_nx, LuaScript, RedisApi, RedisConn, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY, TTL};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.set-nx-px",
    family: &super::FAMILY,
    summary: "SET NX PX with a TTL; release by DEL or compare-and-delete",
    source: "Redis docs, SET (simple locking primitive); redis-py Lock",
    params: &[
        TTL,
        ParamSpec {
            name: "release",
            kind: ParamKind::Choice(&["del", "compare-and-delete"]),
            default: ParamValue::Choice("compare-and-delete"),
            doc: "DEL whatever key is there, or delete only our own value (Lua script)",
        },
        RETRY,
        ACQUIRE_TIMEOUT,
        CALL_TIMEOUT,
    ],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: super::one_master,
    build,
};

struct SetNxPx {
    ctx: Ctx,
    params: Params,
    redis: RedisConn,
    value: String,
    release_script: LuaScript,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    let release_script = LuaScript::new(REDIS_PY_RELEASE);
    Box::new(SetNxPx { ctx, params: params.clone(), redis, value: String::new(), release_script })
}

#[async_trait(?Send)]
impl Lock for SetNxPx {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.value = super::lock_value(&self.ctx);
        let ttl_ms = self.params.duration("ttl").as_millis() as i64;
        let (redis, value) = (&self.redis, &self.value);
        spin(&self.ctx, &self.params, redis, || try_set_nx(redis, value, Some(ttl_ms))).await
    }

    async fn release(&mut self) -> Outcome<()> {
        let reply = match self.params.choice("release") {
            "del" => self.redis.del(LOCK_KEY).await,
            _ => self.release_script.run(&self.redis, &[LOCK_KEY], &[&self.value]).await,
        };
        super::released(reply)
    }
}
