//! `redis.watchdog`: Redisson's `RLock` — a hash lock whose TTL a background watchdog keeps renewing
//! while it is held, and whose waiters are woken by pub/sub.
//!
//! Source: Redisson `RedissonLock.tryLock(waitTime)` without a lease time (`lockWatchdogTimeout`,
//! default 30 s), Redisson's own Lua scripts sent unchanged by `EVAL` (`scripts.rs`; `useScriptCache`
//! is off by default).
//! 1. The lock script on the hash `lock` with our lock name (`<instance id>:<thread id>`: one Redisson
//!    instance per client, and each acquisition from a new application thread, as request handlers
//!    from a pool would be): free or ours, the hold count goes up and the TTL is `watchdog_timeout` —
//!    taken; another holder's, the script answers the lock's PTTL.
//!    With replicas (`checkLockSyncedSlaves`, on by default; their number from `INFO replication` on the
//!    current master, so none after a failover): `WAIT <replicas> 1000` in the same batch
//!    (`slavesSyncTimeout`). If no replica acknowledged, Redisson throws "None of slaves were synced" —
//!    and before 3.47 its handler never matched that message, so the key stays on the master with no
//!    watchdog to renew it: the caller was told it failed while the key blocks everyone until it
//!    expires. Fewer replicas than asked, but some, is no error.
//! 2. Taken by another: `SUBSCRIBE redisson_lock__channel:{lock}` (waiting at most the time left), then
//!    until `acquire_timeout` is spent: try the lock script again; if still taken, wait for an unlock
//!    message (`RedissonLockEntry`'s latch: one queued message is one permit), at most the PTTL it
//!    answered — so a waiter whose message is lost (a restarted server forgets its subscribers) tries
//!    again when the lock would have expired. Unsubscribe at the end.
//! 3. `INCR lock:fence` for a fencing token.
//! 4. While held, every `watchdog_timeout / 3` the watchdog runs the renewal script through Redisson's
//!    command executor: each attempt waits `command_timeout` (Redisson `timeout`, 3 s) for its reply
//!    and is sent again up to `retry_attempts` (3) times, `retry_interval` (1.5 s) apart, before the
//!    command fails — after no reply, a broken connection, or a demoted master's `READONLY` (retried
//!    since 3.27.1; other error replies, such as `NOREPLICAS`, fail at once). Then, by `renewal`:
//!    - `"3.44"` (Redisson 3.44 and later, `renewal/LockTask`): a failed command — no reply, or an
//!      error reply such as a master's `NOREPLICAS` — just schedules the next renewal; only a "not
//!      ours" answer (the key is gone or another's) stops it;
//!    - `"3.43"` (up to 3.43, `RedissonBaseLock.renewExpiration`): a failed command, or "not ours",
//!      stops the renewal for good; the holder is not told.
//! 5. Release: stop the watchdog, then the unlock script: one hold less; at none it deletes the hash and
//!    publishes the unlock message, which wakes the waiters. The unlock latch key it writes is deleted
//!    after the answer, without waiting.
//!
//! Expected failures (catalog): the watchdog runs on the holder's node, so a pause of the holder longer
//! than `watchdog_timeout` stops the renewals too; the key expires under a holder that still believes it
//! holds the lock — `double-holder`. Shorter pauses and short partitions are absorbed: a renewal sent
//! during a cut is retransmitted after the heal, and the executor's retries outlast a few seconds. A
//! partition longer than the TTL lets the key expire whatever the version.

use super::scripts::{
    redisson_channel, redisson_unlock_latch, REDISSON_LOCK, REDISSON_RENEW, REDISSON_RENEW_3_43, REDISSON_UNLOCK,
    REDISSON_UNLOCK_MESSAGE,
};
use super::{RedisApi, RedisConn, ACQUIRE_TIMEOUT, CALL_TIMEOUT, LOCK_KEY};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::redis::{RedisReply, RedisRequest};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::fault::TriggerEvent;
use locksim_sim::net::CallError;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "redis.watchdog",
    family: &super::FAMILY,
    summary: "Redisson RLock: hash lock, TTL renewed by a watchdog every timeout/3 while held, pub/sub wake-up",
    source: "Redisson RedissonLock (tryLock, lockWatchdogTimeout) and its Lua scripts",
    params: &[
        ParamSpec::duration(
            "watchdog_timeout",
            30_000,
            "the key's TTL, renewed every third of it (Redisson lockWatchdogTimeout)",
        ),
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
    points: &[LEASE_RENEW],
    validate: super::one_master,
    build,
};

/// Redisson `slavesSyncTimeout`: how long the lock's `WAIT` waits for the replicas.
const SLAVES_SYNC_TIMEOUT_MS: i64 = 1000;

struct Watchdog {
    ctx: Ctx,
    params: Params,
    servers: Servers,
    redis: RedisConn,
    /// The Redisson instance's id (a UUID in Redisson), and the last application thread's number.
    instance: String,
    thread: u64,
    /// `<instance id>:<thread id>` of this acquisition: the hash field that says the lock is ours.
    lock_name: String,
    renewal: Option<Background>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let redis = RedisConn::new(ctx.clone(), servers, 0, params.duration("call_timeout"));
    let instance = super::lock_value(&ctx);
    let (params, servers) = (params.clone(), servers.clone());
    Box::new(Watchdog { ctx, params, servers, redis, instance, thread: 0, lock_name: String::new(), renewal: None })
}

/// Redisson's `syncedEval`: with replicas, `WAIT` for them on the lock command's connection; none
/// acknowledging is an error ("None of slaves were synced") that leaves the key on the master.
async fn synced(conn: &RedisConn) -> Result<(), String> {
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

/// What one run of the lock script found.
enum Try {
    Taken,
    /// Another holds it, for this many more milliseconds (-1: no TTL).
    Held(i64),
    Unknown(String),
}

impl Watchdog {
    fn lease_ms(&self) -> String {
        self.params.duration("watchdog_timeout").as_millis().to_string()
    }

    /// `tryAcquire`: the lock script and its `WAIT`, in one batch to one master.
    async fn try_acquire(&self) -> Try {
        let conn = self.redis.pinned(self.params.duration("call_timeout"));
        let lease = self.lease_ms();
        match conn.eval(REDISSON_LOCK, &[LOCK_KEY], &[&lease, &self.lock_name]).await {
            Ok(RedisReply::Nil) => match synced(&conn.pinned(self.params.duration("command_timeout"))).await {
                Ok(()) => Try::Taken,
                Err(why) => Try::Unknown(why),
            },
            Ok(RedisReply::Int(ttl)) => Try::Held(ttl),
            Ok(other) => Try::Unknown(format!("lock script answered {other:?}")),
            Err(_) => Try::Unknown("lock script timed out".into()),
        }
    }

    /// Steps 1–2: `tryLock(acquire_timeout)`; `Ok(true)` once taken.
    async fn try_lock(&self) -> Result<bool, String> {
        let budget_ms = self.params.duration("acquire_timeout").as_millis() as i64;
        let deadline = self.ctx.now_ms() + budget_ms;
        let left = || deadline - self.ctx.now_ms();
        match self.try_acquire().await {
            Try::Taken => return Ok(true),
            Try::Unknown(why) => return Err(why),
            Try::Held(_) if left() <= 0 => return Ok(false),
            Try::Held(_) => {}
        }
        let wait = Duration::from_millis(left() as u64);
        let Ok(mut subscription) = self.redis.subscribe(&redisson_channel(LOCK_KEY), wait).await else {
            return Ok(false);
        };
        loop {
            if left() <= 0 {
                return Ok(false);
            }
            let ttl = match self.try_acquire().await {
                Try::Taken => return Ok(true),
                Try::Unknown(why) => return Err(why),
                Try::Held(ttl) => ttl,
            };
            let time = left();
            if time <= 0 {
                return Ok(false);
            }
            let wait = if (0..time).contains(&ttl) { ttl } else { time };
            tokio::select! {
                biased;
                _ = subscription.message() => {}
                () = self.ctx.sleep(Duration::from_millis(wait as u64)) => {}
            }
        }
    }

    fn start_renewal(&mut self) {
        let redis = RedisConn::new(self.ctx.clone(), &self.servers, 0, self.params.duration("command_timeout"));
        let executor = Executor {
            ctx: self.ctx.clone(),
            redis,
            retry_attempts: self.params.int("retry_attempts") as u32,
            retry_interval: self.params.duration("retry_interval"),
        };
        let version = if self.params.choice("renewal") == "3.43" { Renewal::Stops } else { Renewal::Carries };
        let lease = self.params.duration("watchdog_timeout");
        self.renewal = Some(self.ctx.spawn(renew(executor, lease, self.lock_name.clone(), version)));
    }
}

#[async_trait(?Send)]
impl Lock for Watchdog {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.thread += 1;
        self.lock_name = format!("{}:{}", self.instance, self.thread);
        match self.try_lock().await {
            Ok(true) => {}
            Ok(false) => return Outcome::Fail("timed out waiting".into()),
            Err(why) => return Outcome::Unknown(why),
        }
        let grant = super::fencing_token(&self.redis).await;
        self.start_renewal();
        Outcome::Ok(grant)
    }

    async fn release(&mut self) -> Outcome<()> {
        self.renewal = None;
        let request_id = super::lock_value(&self.ctx);
        let (channel, latch) = (redisson_channel(LOCK_KEY), redisson_unlock_latch(LOCK_KEY, &request_id));
        // The latch lives as long as the executor might retry: (timeout + retryInterval) × retryAttempts.
        let per_attempt = self.params.duration("command_timeout") + self.params.duration("retry_interval");
        let latch_ms = (per_attempt.as_millis() as i64 * self.params.int("retry_attempts")).max(1).to_string();
        let (lease, message) = (self.lease_ms(), REDISSON_UNLOCK_MESSAGE);
        let args = [message, lease.as_str(), self.lock_name.as_str(), "publish", latch_ms.as_str()];
        let reply = self.redis.eval(REDISSON_UNLOCK, &[LOCK_KEY, &channel, &latch], &args).await;
        if reply.is_ok() {
            self.redis.send(RedisRequest::Del { keys: vec![latch] });
        }
        match reply {
            // 0: a hold of ours is left (re-entered); Redisson's unlock returns normally.
            Ok(RedisReply::Int(_)) => Outcome::Ok(()),
            Ok(RedisReply::Nil) => Outcome::Fail("attempt to unlock lock, not locked by current thread".into()),
            Ok(other) => Outcome::Fail(format!("unexpected reply {other:?}")),
            Err(CallError::Timeout) => Outcome::Unknown("unlock timed out".into()),
            Err(CallError::Broken) => Outcome::Unknown("connection broken after the unlock was sent".into()),
            Err(CallError::Reset) => Outcome::Fail("connection reset".into()),
        }
    }
}

/// Redisson's command executor for one command: attempts of `command_timeout` each, retried.
struct Executor {
    ctx: Ctx,
    redis: RedisConn,
    retry_attempts: u32,
    retry_interval: Duration,
}

impl Executor {
    async fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Result<RedisReply, CallError> {
        let mut attempt = 0;
        loop {
            let reply = self.redis.eval(script, keys, args).await;
            let again = match &reply {
                // A broken connection leaves the command's fate unknown, as a timeout does.
                Err(CallError::Timeout | CallError::Broken) => true,
                // A replica's READONLY (`RedisReadonlyException`, retried since 3.27.1), sent again on
                // the new connection to the master the client finds then.
                Ok(RedisReply::Error(e)) => e.starts_with("READONLY"),
                _ => false,
            };
            if !again || attempt >= self.retry_attempts {
                return reply;
            }
            attempt += 1;
            self.ctx.sleep(self.retry_interval).await;
        }
    }
}

/// Which renewal Redisson runs (the `renewal` parameter).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// 3.44+: `LockTask`, whose failed command waits for the next round.
    Carries,
    /// Up to 3.43: `renewExpiration`, which stops on a failed command.
    Stops,
}

/// Step 4: renew every third of the lease until the key is not ours (or, up to 3.43, a command fails).
async fn renew(executor: Executor, lease: Duration, lock_name: String, version: Renewal) {
    let lease_ms = lease.as_millis().to_string();
    let (script, held) = match version {
        Renewal::Carries => (REDISSON_RENEW, RedisReply::Array(vec![RedisReply::Int(1)])),
        Renewal::Stops => (REDISSON_RENEW_3_43, RedisReply::Int(1)),
    };
    loop {
        executor.ctx.sleep(lease / 3).await;
        executor.ctx.point(TriggerEvent::Declared(&LEASE_RENEW)).await;
        match executor.eval(script, &[LOCK_KEY], &[&lease_ms, &lock_name]).await {
            Ok(reply) if reply == held => {}
            // 3.44+ (`RenewalTask.run`): whatever the command failed with — no reply, a broken or reset
            // connection, or an error reply such as NOREPLICAS or READONLY — is logged, and the next
            // round is scheduled.
            Ok(RedisReply::Error(_)) | Err(_) if version == Renewal::Carries => {}
            _ => return,
        }
    }
}
