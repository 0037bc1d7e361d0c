//! The `counter` workload: each client loops acquire → read → hold → write → release → think.
//!
//! The workload is the harness around a recipe: it records every lock call and its outcome in the
//! history (recipes never do), and it is the only code that touches the resource. Hold and think times
//! come from the client's own `Workload` random stream, so adding a fault does not shift them.

use crate::scenario::Workload;
use locksim_locks::params::Params;
use locksim_locks::{Outcome, RecipeSpec, Servers};
use locksim_sim::clock::sim_now_ns;
use locksim_sim::ctx::Ctx;
use locksim_sim::history::{EventKind, NodeIx};
use locksim_sim::net::Rpc;
use locksim_sim::resource::{ResourceReply, ResourceRequest};
use locksim_sim::rng::{stream, Rng, Stream};
use locksim_sim::world::{NodeEnv, Program};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// How long a client waits for the resource to answer before abandoning its critical section.
const RESOURCE_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything a client program needs; shared by all clients of a run.
pub struct ClientPlan {
    pub recipe: RecipeSpec,
    pub params: Params,
    pub servers: Servers,
    pub resource: NodeIx,
    pub workload: Workload,
}

/// The program of every client node.
pub fn client_program(plan: Arc<ClientPlan>) -> Program {
    Arc::new(move |env| {
        let plan = plan.clone();
        Box::pin(async move { client(env, &plan).await })
    })
}

async fn client(env: NodeEnv, plan: &ClientPlan) {
    let rpc = Rc::new(Rpc::bind(&env));
    let ctx = Ctx::new(&env, rpc.clone());
    let mut lock = (plan.recipe.build)(&plan.params, ctx.clone(), &plan.servers);
    let mut rng = stream(env.seed, Stream::Workload, (u64::from(env.me.0) << 16) | u64::from(env.incarnation));
    let mut draw = |(lo, hi): (Duration, Duration)| {
        if hi <= lo {
            lo
        } else {
            Duration::from_nanos(rng.gen_range(lo.as_nanos() as u64..=hi.as_nanos() as u64))
        }
    };
    let record = |kind| env.recorder.record(env.me, kind);
    let end = plan.workload.duration.as_nanos() as u64;
    while sim_now_ns() < end {
        record(EventKind::AcquireInvoke);
        match lock.acquire().await {
            Outcome::Ok(grant) => {
                record(EventKind::AcquireOk { token: grant.token });
                let work = critical_section(&rpc, plan.resource, grant.token, &ctx, draw(plan.workload.hold));
                // A recipe that learns its lock is gone stops its holder before the write.
                tokio::select! {
                    biased;
                    reason = lock.lost() => record(EventKind::LockLost { reason }),
                    () = work => {}
                }
                record(EventKind::ReleaseInvoke);
                record(match lock.release().await {
                    Outcome::Ok(()) => EventKind::ReleaseOk,
                    Outcome::Fail(reason) => EventKind::ReleaseFail { reason },
                    Outcome::Unknown(reason) => EventKind::ReleaseUnknown { reason },
                });
            }
            Outcome::Fail(reason) => record(EventKind::AcquireFail { reason }),
            Outcome::Unknown(reason) => record(EventKind::AcquireUnknown { reason }),
        }
        ctx.sleep(draw(plan.workload.think)).await;
    }
}

/// Read the counter, hold the lock for `hold`, write the counter plus one.
async fn critical_section(rpc: &Rpc, resource: NodeIx, token: Option<u64>, ctx: &Ctx, hold: Duration) {
    let read = rpc.call(resource, ResourceRequest::Read { token }, RESOURCE_TIMEOUT).await;
    let Ok(ResourceReply::Value(value)) = read else {
        return;
    };
    ctx.sleep(hold).await;
    let _: Result<ResourceReply, _> =
        rpc.call(resource, ResourceRequest::Write { token, value: value + 1 }, RESOURCE_TIMEOUT).await;
}
