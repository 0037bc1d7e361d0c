//! Test your own lock with locksim: implement [`Lock`], register it, and run a scenario that names it.
//!
//! The lock here is one people write to "fix" the `DEL` release without a Lua script: read the key with
//! GET, and DEL it only if the value is still ours. It is two commands, so it is not atomic, and the key
//! can change hands between them. Run it with `cargo run --release --example custom_lock`.

use locksim_locks::params::{ParamSpec, Params};
use locksim_locks::redis::{RedisApi, RedisConn, FAMILY};
use locksim_locks::{async_trait, no_constraints, Grant, Lock, Outcome, RecipeSpec, Registry, Servers};
use locksim_scenarios::sweep::sweep;
use locksim_scenarios::Scenario;
use locksim_sim::backend::redis::{RedisReply, SetCondition};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Point, TriggerEvent};

/// The recipe as scenario files name it: `[recipe] id = "my.get-then-del"`.
pub const GET_THEN_DEL: RecipeSpec = RecipeSpec {
    id: "my.get-then-del",
    family: &FAMILY,
    summary: "SET NX PX; release by GET, compare, then DEL (two commands)",
    source: "a hand-rolled lock",
    params: &[ParamSpec::duration("ttl", 5_000, "lock key expiry")],
    offers_token: true,
    offers_shared: false,
    guard: locksim_locks::Guard::Lock,
    promises_fifo: false,
    points: &[COMPARED],
    validate: no_constraints,
    build,
};

/// A point of our own, between the compare and the DEL: `on = "my-compared"` starts a fault there (a
/// pause past the TTL makes the DEL delete the next holder's key).
pub const COMPARED: Point =
    Point { name: "my-compared", doc: "my.get-then-del: GET found our value; the DEL is the next command" };

struct GetThenDel {
    ctx: Ctx,
    redis: RedisConn,
    ttl_ms: i64,
    value: String,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    // Simulated, or on a real Redis when real mode runs this lock (`locksim run --real`).
    let redis = RedisConn::new(ctx.clone(), servers, 0, std::time::Duration::from_secs(1));
    let ttl_ms = params.duration("ttl").as_millis() as i64;
    Box::new(GetThenDel { ctx, redis, ttl_ms, value: String::new() })
}

#[async_trait(?Send)]
impl Lock for GetThenDel {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.value = format!("{:x}", self.ctx.random_u64());
        for _ in 0..100 {
            match self.redis.set("my-lock", &self.value, SetCondition::Nx, Some(self.ttl_ms)).await {
                Ok(RedisReply::Ok) => {
                    let token = match self.redis.incr("my-lock:fence").await {
                        Ok(RedisReply::Int(n)) => Some(n as u64),
                        _ => None,
                    };
                    return Outcome::Ok(Grant { token });
                }
                Ok(_) => self.ctx.sleep(std::time::Duration::from_millis(100)).await,
                Err(_) => return Outcome::Unknown("SET timed out".into()),
            }
        }
        Outcome::Fail("gave up after 100 tries".into())
    }

    async fn release(&mut self) -> Outcome<()> {
        match self.redis.get("my-lock").await {
            Ok(RedisReply::Bulk(v)) if v == self.value => {
                self.ctx.point(TriggerEvent::Declared(&COMPARED)).await;
                match self.redis.del("my-lock").await {
                    Ok(_) => Outcome::Ok(()),
                    Err(_) => Outcome::Unknown("DEL timed out".into()),
                }
            }
            Ok(_) => Outcome::Fail("not ours any more".into()),
            Err(_) => Outcome::Unknown("GET timed out".into()),
        }
    }
}

/// The built-in recipes and this one.
pub fn registry() -> Registry {
    Registry::builtin().with(GET_THEN_DEL)
}

/// A scenario for it, as a user would write it in a file.
pub const SCENARIO: &str = r#"
name = "my-lock-gc-pause"
description = "my.get-then-del under a stop-the-world pause of the holder longer than its TTL"

[recipe]
id = "my.get-then-del"
ttl = "2s"

[workload]
kind = "counter"
clients = 3
duration = "30s"

[faults.random]
kinds = ["pause"]
every = ["1s", "3s"]
duration = ["1s", "4s"]

[check]
liveness = "20s"         # shorter than the run: a lock wedged for 20 s would be called a deadlock

[expect]
verdict = "safe"
"#;

fn main() {
    let scenario = Scenario::parse("my-lock.toml", SCENARIO, &registry()).unwrap_or_else(|e| panic!("{e}"));
    let result = sweep(&scenario, 0..100, 2, &|| {}).unwrap_or_else(|e| panic!("{e}"));
    println!("{}: {} of 100 seeds unsafe", result.scenario, result.unsafe_seeds);
    for reason in &result.reasons {
        println!("  {reason}");
    }
    if let Some(seed) = result.example_seed {
        let run = locksim_scenarios::run::run_seed(&scenario, seed).unwrap_or_else(|e| panic!("{e}"));
        println!("seed {seed}:");
        for f in &run.result.findings {
            println!("  {:?} {} — {}", f.kind, f.clients.join(" & "), f.detail);
        }
    }
}
