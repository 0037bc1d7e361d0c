//! `locksim adapter SCENARIO --seed S` (hidden): the client process of a built-in recipe in real mode.
//!
//! Real mode starts it as it starts a command recipe's processes — one per scenario client, in its own
//! process group, paused and killed by the faults — with `LOCKSIM_CLIENT` and the server's variable
//! (`LOCKSIM_REDIS`, …) naming the client's proxy. It loads the scenario (the same registry as the
//! `locksim` that started it), builds the scenario's recipe with a real [`Ctx`] (real time, tokio
//! timers, a current-thread runtime and a `LocalSet`) and [`Servers::Real`], and speaks the JSON-lines
//! protocol of [`super`] on stdin and stdout: the recipe's code is the simulator's, line for line.
//!
//! While it holds the lock it also watches [`Lock::lost`], and says `{"lost":...}` once per hold when
//! the recipe learns its lock is gone. Its random stream is the seed's `Recipe` stream at the client's
//! number and process id (each life of a client draws other lock values, as a new process would).

use locksim_locks::{Lock, Outcome, RealServers, Servers};
use locksim_scenarios::Scenario;
use locksim_sim::ctx::{Ctx, RealTime};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncBufReadExt;

/// The machine's clocks, for [`Ctx::real`] (a real process's, and conformance's real plays).
pub const REAL_TIME: RealTime = RealTime { wall_ms, monotonic_ms };

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn monotonic_ms() -> i64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as i64
}

/// Run the client process of `scenario`'s recipe until locksim closes its stdin.
pub fn main(scenario: &Scenario, seed: u64) -> anyhow::Result<()> {
    let client = std::env::var(super::ENV_CLIENT).map_err(|_| anyhow::anyhow!("{} is not set", super::ENV_CLIENT))?;
    let number: u64 = client
        .strip_prefix("client-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{}={client}: expected client-N", super::ENV_CLIENT))?;
    let servers = Servers::Real(RealServers::from_env(|name| std::env::var(name).ok()));
    let index = (number << 16) | u64::from(std::process::id() & 0xffff);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let ctx = Ctx::real(seed, index, REAL_TIME);
        let lock = (scenario.recipe.build)(&scenario.recipe_params, ctx, &servers);
        serve(lock).await
    })
}

/// Answer locksim's lines until its stdin closes.
async fn serve(mut lock: Box<dyn Lock>) -> anyhow::Result<()> {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut held = false;
    loop {
        let line = if held {
            tokio::select! {
                biased;
                line = lines.next_line() => line?,
                reason = lock.lost() => {
                    say(&json!({ "lost": reason }))?;
                    held = false;
                    continue;
                }
            }
        } else {
            lines.next_line().await?
        };
        let Some(line) = line else { return Ok(()) };
        let request: Value = serde_json::from_str(&line)?;
        let shared = request.get("shared").and_then(Value::as_bool).unwrap_or(false);
        let answer = match request.get("op").and_then(Value::as_str) {
            Some("acquire") => {
                let outcome = if shared { lock.acquire_shared().await } else { lock.acquire().await };
                held = outcome.is_ok();
                answer(outcome, |grant| grant.token)
            }
            Some("release") => {
                held = false;
                answer(lock.release().await, |()| None)
            }
            Some("enter") => json!({ "entered": true }),
            Some("write") => json!({ "writing": true }),
            _ => anyhow::bail!("not a request: {line}"),
        };
        say(&answer)?;
    }
}

/// An outcome as its line: `token` is the grant's fencing token (a release has none).
fn answer<T>(outcome: Outcome<T>, token: fn(T) -> Option<u64>) -> Value {
    match outcome {
        Outcome::Ok(value) => json!({ "ok": true, "token": token(value) }),
        Outcome::Fail(reason) => json!({ "ok": false, "reason": reason }),
        Outcome::Unknown(reason) => json!({ "unknown": reason }),
    }
}

/// One line to locksim.
fn say(message: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{message}")?;
    out.flush()?;
    Ok(())
}
