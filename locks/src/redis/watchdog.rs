//! `redis.watchdog`: a lock whose TTL a background watchdog keeps renewing while it is held.
//!
//! Source: Redisson `RedissonLock` without a lease time (`lockWatchdogTimeout`, default 30 s).
//! 1. `SET lock <id> NX PX watchdog_timeout` (Redisson: a Lua script on a hash; the same effect for a
//!    non-reentrant holder); taken: sleep `retry` and try again (Redisson waits on a pub/sub channel; the
//!    polling here changes the wake-up latency, not safety).
//! 2. `INCR lock:fence` for a fencing token.
//!    With replicas (`checkLockSyncedSlaves`, on by default; their number from `INFO replication` on the
//!    current master, so none after a failover): `WAIT <replicas> 1000` in the same batch
//!    (`slavesSyncTimeout`). If no replica acknowledged, Redisson throws "None of slaves were synced" —
//!    and before 3.47 its handler never matched that message, so the key stays on the master with no
//!    watchdog to renew it: the caller was told it failed while the key blocks everyone until it
//!    expires. Fewer replicas than asked, but some, is no error.
//! 3. While held, every `watchdog_timeout / 3` the watchdog runs compare-and-pexpire(id, watchdog_timeout)
//!    through Redisson's command executor: each attempt waits `command_timeout` (Redisson `timeout`,
//!    3 s) for its reply and is sent again up to `retry_attempts` (3) times, `retry_interval` (1.5 s)
//!    apart, before the command fails. Then, by `renewal`:
//!    - `"3.44"` (Redisson 3.44 and later, `renewal/RenewalTask`): a failed command just schedules the
//!      next renewal; only a "not ours" answer (the key is gone or another's) stops it;
//!    - `"3.43"` (up to 3.43, `RedissonBaseLock.renewExpiration`): a failed command, or "not ours",
//!      stops the renewal for good; the holder is not told.
//! 4. Release: stop the watchdog, then compare-and-delete.
//!
//! Expected failures (catalog): the watchdog runs on the holder's node, so a pause of the holder longer
//! than `watchdog_timeout` stops the renewals too; the key expires under a holder that still believes it
//! holds the lock — `double-holder`. Shorter pauses and short partitions are absorbed: a renewal sent
//! during a cut is retransmitted after the heal, and the executor's retries outlast a few seconds. A
//! partition longer than the TTL lets the key expire whatever the version.

use super::{
    spin, try_set_nx, Attempt, RedisApi, RedisServers, SimRedis, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY, RETRY,
};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::redis::{RedisReply, Script};
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::net::CallError;
use std::time::Duration;

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
        ParamSpec {
            name: "renewal",
            kind: ParamKind::Choice(&["3.44", "3.43"]),
            default: ParamValue::Choice("3.44"),
            doc: "Redisson's renewal: 3.44+ keeps renewing after a failed command; up to 3.43 it stops for good",
        },
        ParamSpec::duration("command_timeout", 3_000, "Redisson `timeout`: how long one attempt of a renewal waits"),
        ParamSpec::int(
            "retry_attempts",
            (0, 100),
            3,
            "Redisson `retryAttempts`: a renewal is sent again this many times before it fails",
        ),
        ParamSpec::duration("retry_interval", 1_500, "Redisson `retryInterval`: the pause before a retry"),
    ],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    validate: super::one_master,
    build,
};

/// Redisson `slavesSyncTimeout`: how long the lock's `WAIT` waits for the replicas.
const SLAVES_SYNC_TIMEOUT_MS: i64 = 1000;

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

/// Redisson's `syncedEval`: with replicas, `WAIT` for them on the lock command's connection; none
/// acknowledging is an error ("None of slaves were synced") that leaves the key on the master.
async fn synced(conn: &SimRedis) -> Result<(), String> {
    let replicas = match conn.connected_replicas().await {
        Ok(RedisReply::Int(n)) => n,
        _ => return Err("INFO replication: no answer".into()),
    };
    if replicas == 0 {
        return Ok(());
    }
    match conn.wait(replicas, SLAVES_SYNC_TIMEOUT_MS).await {
        Ok(RedisReply::Int(0)) => Err("None of slaves were synced".into()),
        Ok(_) => Ok(()),
        Err(_) => Err("WAIT: no answer".into()),
    }
}

#[async_trait(?Send)]
impl Lock for Watchdog {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.value = super::lock_value(&self.ctx);
        let lease = self.params.duration("watchdog_timeout");
        let (redis, value) = (&self.redis, &self.value);
        let (call_timeout, batch_timeout) =
            (self.params.duration("call_timeout"), self.params.duration("command_timeout"));
        let outcome = spin(&self.ctx, &self.params, redis, || async move {
            // The lock command and its WAIT travel in one batch to one master.
            let conn = redis.pinned(call_timeout);
            match try_set_nx(&conn, value, Some(lease.as_millis() as i64)).await {
                Attempt::Taken => match synced(&conn.pinned(batch_timeout)).await {
                    Ok(()) => Attempt::Taken,
                    Err(why) => Attempt::Unknown(why),
                },
                other => other,
            }
        })
        .await;
        if let Outcome::Ok(_) = outcome {
            let redis = SimRedis::new(
                self.ctx.clone(),
                RedisServers::from(&self.servers),
                0,
                self.params.duration("command_timeout"),
            );
            let executor = Executor {
                ctx: self.ctx.clone(),
                redis,
                retry_attempts: self.params.int("retry_attempts") as u32,
                retry_interval: self.params.duration("retry_interval"),
            };
            let stop_on_error = self.params.choice("renewal") == "3.43";
            self.renewal = Some(self.ctx.spawn(renew(executor, lease, self.value.clone(), stop_on_error)));
        }
        outcome
    }

    async fn release(&mut self) -> Outcome<()> {
        self.renewal = None;
        super::released(self.redis.eval(Script::CompareAndDelete, LOCK_KEY, &self.value).await)
    }
}

/// Redisson's command executor for one command: attempts of `command_timeout` each, retried.
struct Executor {
    ctx: Ctx,
    redis: SimRedis,
    retry_attempts: u32,
    retry_interval: Duration,
}

impl Executor {
    async fn eval(&self, script: Script, value: &str) -> Result<RedisReply, CallError> {
        let mut attempt = 0;
        loop {
            match self.redis.eval(script, LOCK_KEY, value).await {
                Err(CallError::Timeout) if attempt < self.retry_attempts => {
                    attempt += 1;
                    self.ctx.sleep(self.retry_interval).await;
                }
                answer => return answer,
            }
        }
    }
}

/// Step 3: renew every third of the lease until the key is not ours (or, `stop_on_error`, a command
/// fails).
async fn renew(executor: Executor, lease: Duration, value: String, stop_on_error: bool) {
    let script = Script::CompareAndPexpire { ms: lease.as_millis() as i64 };
    loop {
        executor.ctx.sleep(lease / 3).await;
        match executor.eval(script, &value).await {
            Ok(RedisReply::Int(1)) => {}
            Err(CallError::Timeout) if !stop_on_error => {}
            _ => return,
        }
    }
}
