//! The `counter` workload: each client loops acquire → read → hold → write → release → think. With
//! `reads`, that share of acquisitions takes the lock shared and only reads: acquire → read → hold → release.
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
    let rng = stream(env.seed, Stream::Workload, (u64::from(env.me.0) << 16) | u64::from(env.incarnation));
    let rng = std::cell::RefCell::new(rng);
    let draw = |(lo, hi): (Duration, Duration)| {
        if hi <= lo {
            lo
        } else {
            Duration::from_nanos(rng.borrow_mut().gen_range(lo.as_nanos() as u64..=hi.as_nanos() as u64))
        }
    };
    // Drawn only when the scenario has readers, so that other runs keep their streams.
    let reads = plan.workload.reads;
    let draw_shared = || reads > 0.0 && rng.borrow_mut().gen_bool(reads);
    let record = |kind| env.recorder.record(env.me, kind);
    let end = plan.workload.duration.as_nanos() as u64;
    while sim_now_ns() < end {
        let shared = draw_shared();
        record(EventKind::AcquireInvoke);
        let outcome = if shared { lock.acquire_shared().await } else { lock.acquire().await };
        match outcome {
            Outcome::Ok(grant) => {
                record(EventKind::AcquireOk { token: grant.token, shared });
                let access = Access { resource: plan.resource, token: grant.token, shared };
                let work = critical_section(&rpc, access, &ctx, draw(plan.workload.hold));
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

/// Where a critical section goes and what it shows there.
struct Access {
    resource: NodeIx,
    token: Option<u64>,
    /// A reader under a shared lock: it only reads.
    shared: bool,
}

/// Read the counter, hold the lock for `hold`, write the counter plus one (a reader only reads and holds).
async fn critical_section(rpc: &Rpc, access: Access, ctx: &Ctx, hold: Duration) {
    let Access { resource, token, shared } = access;
    let read = rpc.call(resource, ResourceRequest::Read { token, shared }, RESOURCE_TIMEOUT).await;
    let Ok(ResourceReply::Value(value)) = read else {
        return;
    };
    ctx.sleep(hold).await;
    if shared {
        return;
    }
    let _: Result<ResourceReply, _> =
        rpc.call(resource, ResourceRequest::Write { token, value: value + 1 }, RESOURCE_TIMEOUT).await;
}
