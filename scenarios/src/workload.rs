//! The workloads.
//! - `counter`: each client loops acquire → read → hold → write value + 1 → release → think. With `reads`,
//!   that share of acquisitions takes the lock shared and only reads: acquire → read → hold → release.
//! - `flash-sale`: each buyer loops acquire → read the stock → if any is left, process the order (hold)
//!   and write stock − 1 with the order → release → think, and goes home once it has seen the stock
//!   sold out.
//!
//! - a user's own (`kind` = a [`WorkSpec`]'s id): each client loops acquire → the spec's critical
//!   section on the store, with a hold drawn as for the counter → release → think.
//!
//! Under a recipe guarded by a conditional update (no lock; the database does the locking) the critical section is
//! one conditional statement after the hold: `n = n + 1`, or `n = n − 1 WHERE n > 0` with the order.
//!
//! The workload is the harness around a recipe: it records every lock call and its outcome in the
//! history (recipes never do), and it is the only code that touches the resource. Hold and think times
//! come from the client's own `Workload` random stream, so adding a fault does not shift them.

use crate::scenario::Workload;
use locksim_locks::params::Params;
use locksim_locks::work::{Section, WorkSpec};
use locksim_locks::{Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::clock::sim_now_ns;
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::TriggerEvent;
use locksim_sim::hazard::Hazard;
use locksim_sim::history::{EventKind, NodeIx, WORKER_MARK};
use locksim_sim::net::Rpc;
use locksim_sim::resource::{on_behalf, ResourceReply, ResourceRequest, Store};
use locksim_sim::rng::{stream, ChaCha8Rng, Rng, Stream};
use locksim_sim::world::{NodeEnv, Program};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
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

/// The program of the client node `name`.
pub fn client_program(plan: Arc<ClientPlan>, name: String) -> Program {
    Arc::new(move |env| {
        let (plan, name) = (plan.clone(), name.clone());
        Box::pin(async move { client(env, &plan, name).await })
    })
}

/// One client node: its workers' loops, each with a lock of its own built from the node's one context
/// (so that a recipe may share a session between them through [`Ctx::node_wide`]).
async fn client(env: NodeEnv, plan: &ClientPlan, name: String) {
    let rpc = Rc::new(env.rpc());
    let ctx = Ctx::new(&env, rpc.clone());
    // The first worker is the client node itself, in the history and its random stream.
    let mut workers = vec![Worker { index: 0, node: env.me, name: name.clone() }];
    for (i, node) in env.recorder.workers_of(env.me).into_iter().enumerate() {
        workers.push(Worker { index: i as u64 + 1, node, name: format!("{name}{WORKER_MARK}{}", i + 1) });
    }
    // Every lock is built before any loop runs, in worker order: what the builds draw never depends on
    // how the loops interleave.
    let locks: Vec<_> = workers.iter().map(|_| (plan.recipe.build)(&plan.params, ctx.clone(), &plan.servers)).collect();
    let mut loops: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
    for (worker, lock) in workers.into_iter().zip(locks) {
        loops.push(Box::pin(worker_loop(&env, plan, &rpc, &ctx, worker, lock)));
    }
    join_all(loops).await
}

/// Poll every future in turn until all have ended: the workers of one client, in one task (as threads
/// of one process share its node's fate).
async fn join_all(mut futures: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>) {
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// One of a client's workers: its number, the history node it records as, and its name.
struct Worker {
    index: u64,
    node: NodeIx,
    name: String,
}

/// A worker's loop: acquire, the critical section, release, think, until the run's end.
async fn worker_loop(env: &NodeEnv, plan: &ClientPlan, rpc: &Rc<Rpc>, ctx: &Ctx, me: Worker, mut lock: Box<dyn Lock>) {
    let Worker { index, node, name } = me;
    let mut draws = Draws::new(env.seed, index, env.me, u64::from(env.incarnation));
    let worker = (index > 0).then_some(node);
    let record = |kind| env.recorder.record(node, kind);
    let end = plan.workload.duration.as_nanos() as u64;
    let mut sold_out = false;
    // A buyer who has seen the stock run out goes home.
    while sim_now_ns() < end && !sold_out {
        let shared = draws.shared(&plan.workload);
        record(EventKind::AcquireInvoke);
        let outcome = if shared { lock.acquire_shared().await } else { lock.acquire().await };
        match outcome {
            Outcome::Ok(grant) => {
                record(EventKind::AcquireOk { token: grant.token, shared });
                let work = Work::of(&plan.workload, plan.recipe.guard);
                let access = Access { resource: plan.resource, token: grant.token, shared, work, worker };
                let work = critical_section(rpc, access, ctx, draws.time(plan.workload.hold), &name);
                // A recipe that learns its lock is gone stops its holder before the write.
                tokio::select! {
                    biased;
                    reason = lock.lost() => record(EventKind::LockLost { reason }),
                    sold = work => sold_out = sold,
                }
                record(EventKind::ReleaseInvoke);
                record(match lock.release().await {
                    Outcome::Ok(()) => EventKind::ReleaseOk,
                    Outcome::Fail(reason) => EventKind::ReleaseFail { reason },
                    Outcome::Unknown(reason) => {
                        env.recorder.mark(Hazard::ReleaseReplyLost);
                        EventKind::ReleaseUnknown { reason }
                    }
                });
            }
            Outcome::Fail(reason) => record(EventKind::AcquireFail { reason }),
            Outcome::Unknown(reason) => {
                env.recorder.mark(Hazard::AcquireReplyLost);
                record(EventKind::AcquireUnknown { reason })
            }
        }
        ctx.sleep(draws.time(plan.workload.think)).await;
    }
}

/// What a client draws from its `Workload` stream, in the order it draws them: before each acquisition
/// whether it is shared (only when the scenario has readers, so that other runs keep their streams),
/// then its hold once granted, then its think time. Simulated and real clients draw alike, so a real
/// run holds and thinks for the seed's times.
pub struct Draws(ChaCha8Rng);

impl Draws {
    /// The stream of worker `worker` (0: the client itself) of the client node `client` in its
    /// `incarnation` (0 until its first restart).
    pub fn new(seed: u64, worker: u64, client: NodeIx, incarnation: u64) -> Draws {
        Draws(stream(seed, Stream::Workload, (worker << 48) | (u64::from(client.0) << 16) | incarnation))
    }

    /// Whether the next acquisition is shared.
    pub fn shared(&mut self, workload: &Workload) -> bool {
        workload.reads > 0.0 && self.0.gen_bool(workload.reads)
    }

    /// A hold or think time within `(lo, hi)`.
    pub fn time(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        if hi <= lo {
            lo
        } else {
            Duration::from_nanos(self.0.gen_range(lo.as_nanos() as u64..=hi.as_nanos() as u64))
        }
    }
}

/// What a critical section does to the resource: simulated and real clients do the same.
#[derive(Clone, Copy)]
pub enum Work {
    /// Read the counter, hold, write it plus one.
    Increment,
    /// Hold, then add one in a single statement.
    AtomicIncrement,
    /// Read the stock; if any is left, process the order (hold), write the stock minus one with the order.
    Buy,
    /// Process the order, then `UPDATE stock SET n = n - 1 WHERE n > 0` with the order.
    AtomicBuy,
    /// The user's critical section, on the store.
    User(WorkSpec),
}

impl Work {
    /// The work of `workload`'s clients under a recipe guarding them with `guard`.
    pub fn of(workload: &Workload, guard: Guard) -> Work {
        if let Some(spec) = workload.work {
            return Work::User(spec);
        }
        match (workload.stock.is_some(), guard == Guard::ConditionalUpdate) {
            (false, false) => Work::Increment,
            (false, true) => Work::AtomicIncrement,
            (true, false) => Work::Buy,
            (true, true) => Work::AtomicBuy,
        }
    }

    /// A buyer's: it sells stock, each write an order.
    pub fn buys(self) -> bool {
        matches!(self, Work::Buy | Work::AtomicBuy)
    }

    /// One conditional statement after the hold, with no read before it.
    pub fn is_atomic(self) -> bool {
        matches!(self, Work::AtomicIncrement | Work::AtomicBuy)
    }

    /// Whether a buyer who read `value` found the stock sold out (and goes home).
    pub fn sold_out(self, value: i64) -> bool {
        self.buys() && value <= 0
    }

    /// The write after the hold, of a section that read `value`.
    pub fn write(self, token: Option<u64>, value: i64) -> ResourceRequest {
        let next = if self.buys() { value - 1 } else { value + 1 };
        ResourceRequest::Write { token, value: next, order: self.buys() }
    }

    /// An atomic section's one statement: `n = n + 1`, or `n = n - 1 WHERE n > 0` with the order (an
    /// unchanged value answered means sold out).
    pub fn update(self, token: Option<u64>) -> ResourceRequest {
        let (delta, floor) = if self.buys() { (-1, Some(0)) } else { (1, None) };
        ResourceRequest::Add { token, delta, floor, order: self.buys() }
    }
}

/// Where a critical section goes and what it does there.
struct Access {
    resource: NodeIx,
    token: Option<u64>,
    /// A reader under a shared lock: it only reads.
    shared: bool,
    work: Work,
    /// The worker it is, when not its client's first.
    worker: Option<NodeIx>,
}

/// The critical section; true when it found the stock sold out.
async fn critical_section(rpc: &Rc<Rpc>, access: Access, ctx: &Ctx, hold: Duration, client: &str) -> bool {
    let Access { resource, token, shared, work, worker } = access;
    if let Work::User(spec) = work {
        // The store records no `Enter` (a section is what the user's code does), so the client passes it
        // as a point: `on = "enter"` and the aimed nemesis start here, before the section's first access.
        ctx.point(TriggerEvent::Enter).await;
        let store = Store::new(rpc.clone(), resource, token).for_worker(worker);
        let client = client.to_string();
        (spec.critical)(Section { store, ctx: ctx.clone(), hold, client, shared }).await;
        return false;
    }
    let call = |request| rpc.call::<_, ResourceReply>(resource, on_behalf(worker, request), RESOURCE_TIMEOUT);
    if work.is_atomic() {
        ctx.sleep(hold).await;
        let reply = call(work.update(token)).await;
        return work.buys() && matches!(reply, Ok(ResourceReply::Value(_)));
    }
    let Ok(ResourceReply::Value(value)) = call(ResourceRequest::Read { token, shared }).await else {
        return false;
    };
    if work.sold_out(value) {
        return true;
    }
    ctx.sleep(hold).await;
    if !shared {
        let _ = call(work.write(token, value)).await;
    }
    false
}
