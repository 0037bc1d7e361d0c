//! What a recipe may touch: its node's clock, sleep, spawn, randomness, and the network.
//!
//! Recipes never call madsim directly. Going through [`Ctx`] is what makes per-node clocks work (a
//! recipe's "now" is its node's wall clock, its sleeps run at its node's clock rate) and is the seam
//! where the same recipe runs on a real tokio runtime against real servers: [`Ctx::real`], for real
//! mode's client processes, reads real time (through the [`RealTime`] its caller hands it: nothing in
//! `sim/` reads the machine's clock), sleeps with `tokio::time::sleep` and spawns with
//! `tokio::task::spawn_local` (a current-thread runtime inside a `LocalSet`). It has no simulated
//! network: [`Ctx::rpc`] and [`Ctx::clock`] are the simulator's alone.

use crate::clock::Clock;
use crate::fault::TriggerEvent;
use crate::history::{NodeIx, Recorder};
use crate::net::Rpc;
use crate::rng::{stream, ChaCha8Rng, Rng, RngCore, Stream};
use crate::world::NodeEnv;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

/// A recipe's view of its node. Cheap to clone; clones share the node's endpoint and random stream.
#[derive(Clone)]
pub struct Ctx {
    flavour: Flavour,
    rng: Rc<RefCell<ChaCha8Rng>>,
    /// The run's seed and this node life's stream index, for the node's other streams ([`Ctx::stream`]).
    seed: u64,
    index: u64,
    /// One value per type for the whole node, e.g. the router that hands each of the node's ZooKeeper
    /// sessions its own notifications.
    node_wide: Rc<RefCell<BTreeMap<TypeId, Rc<dyn Any>>>>,
}

/// Where a context's time and network come from.
#[derive(Clone)]
enum Flavour {
    /// A simulated node: its clock, its endpoint, and the run's recorder (for points).
    Sim { clock: Clock, rpc: Rc<Rpc>, recorder: Recorder, me: NodeIx },
    /// A real process: real time, real sockets (the family clients open their own).
    Real(RealTime),
}

/// Real time for [`Ctx::real`], read by functions its caller supplies (the binary reads the machine's
/// clock; `sim/` never does).
#[derive(Clone, Copy, Debug)]
pub struct RealTime {
    /// Wall time, Unix milliseconds (`SystemTime`).
    pub wall_ms: fn() -> i64,
    /// A monotonic clock in milliseconds (`Instant`): what deadlines that must survive a clock step use.
    pub monotonic_ms: fn() -> i64,
}

impl Ctx {
    /// The context of the node described by `env`, speaking through `rpc`.
    pub fn new(env: &NodeEnv, rpc: Rc<Rpc>) -> Ctx {
        let index = (u64::from(env.me.0) << 16) | u64::from(env.incarnation);
        let rng = Rc::new(RefCell::new(stream(env.seed, Stream::Recipe, index)));
        let flavour = Flavour::Sim { clock: env.clock.clone(), rpc, recorder: env.recorder.clone(), me: env.me };
        Ctx { flavour, rng, seed: env.seed, index, node_wide: Rc::default() }
    }

    /// The context of a real client process (real mode), drawing from the `Recipe` stream of `seed` at
    /// `index`. Its tasks must run inside a `tokio::task::LocalSet` on a runtime with time enabled.
    pub fn real(seed: u64, index: u64, time: RealTime) -> Ctx {
        let rng = Rc::new(RefCell::new(stream(seed, Stream::Recipe, index)));
        Ctx { flavour: Flavour::Real(time), rng, seed, index, node_wide: Rc::default() }
    }

    /// Whether this is a real process's context ([`Ctx::real`]): its family clients speak to real
    /// servers.
    pub fn is_real(&self) -> bool {
        matches!(self.flavour, Flavour::Real(_))
    }

    /// A name for this client that its peers tell apart (a candidate's value in an election): a simulated
    /// node's index, or a real process's name drawn from its random stream.
    pub fn name(&self) -> String {
        match &self.flavour {
            Flavour::Sim { me, .. } => format!("node-{}", me.0),
            Flavour::Real(_) => format!("candidate-{:016x}", self.random_u64()),
        }
    }

    /// The node's one value of type `T`, made with `make` on first use.
    /// `make` may itself ask for node-wide values (a shared session's router).
    pub fn node_wide<T: 'static>(&self, make: impl FnOnce() -> T) -> Rc<T> {
        let found = self.node_wide.borrow().get(&TypeId::of::<T>()).cloned();
        let value = found.unwrap_or_else(|| {
            let made = Rc::new(make()) as Rc<dyn Any>;
            self.node_wide.borrow_mut().entry(TypeId::of::<T>()).or_insert(made).clone()
        });
        value.downcast::<T>().expect("keyed by its type")
    }

    /// This node's wall clock, in Unix-style milliseconds (jumps move it; it may go backwards).
    pub fn now_ms(&self) -> i64 {
        match &self.flavour {
            Flavour::Sim { clock, .. } => clock.now_ms(),
            Flavour::Real(time) => (time.wall_ms)(),
        }
    }

    /// This node's monotonic clock in milliseconds (see [`Clock::monotonic_ms`]).
    pub fn monotonic_ms(&self) -> i64 {
        match &self.flavour {
            Flavour::Sim { clock, .. } => clock.monotonic_ms(),
            Flavour::Real(time) => (time.monotonic_ms)(),
        }
    }

    /// Sleep for `d` as this node's timers measure it.
    pub async fn sleep(&self, d: Duration) {
        match &self.flavour {
            Flavour::Sim { clock, .. } => clock.sleep(d).await,
            Flavour::Real(_) => tokio::time::sleep(d).await,
        }
    }

    /// The recipe has reached `point` ([`TriggerEvent::Declared`], one of its `RecipeSpec::points`): a
    /// fault armed for it starts here, before the recipe's next step — the recipe yields until the world
    /// has started it (a pause then holds it at this point). It records nothing, and without a fault
    /// armed for the point it does not yield, so a run is the same whether or not its recipe passes
    /// points. A real process has no armed faults (real mode refuses `on`).
    pub async fn point(&self, point: TriggerEvent) {
        if let Flavour::Sim { recorder, me, .. } = &self.flavour {
            recorder.pass(*me, point).await;
        }
    }

    /// The recipe took over a lock whose lease had passed (ShedLock's row past its `lock_until`, which no
    /// server expires): a client still believing it holds it has lost its lease — hazard
    /// `lease-expired-while-held` (counted beside the history; a real process counts none).
    pub fn took_over(&self) {
        if let Flavour::Sim { recorder, me, .. } = &self.flavour {
            recorder.took_over(*me);
        }
    }

    /// The grant this client is about to report lives in the server's lease `lease` (a ZooKeeper lock
    /// node's session), which need not be the client's newest: its end is hazard
    /// `lease-expired-while-held` (counted beside the history; a real process counts none).
    pub fn held_in(&self, lease: u64) {
        if let Flavour::Sim { recorder, me, .. } = &self.flavour {
            recorder.held_in(*me, lease);
        }
    }

    /// The node's endpoint for backend calls (a simulated node's only: a real client has sockets).
    pub fn rpc(&self) -> &Rpc {
        match &self.flavour {
            Flavour::Sim { rpc, .. } => rpc,
            Flavour::Real(_) => panic!("a real client process has no simulated network (Ctx::rpc)"),
        }
    }

    /// Run `task` in the background on this node; it stops when the returned handle is dropped.
    pub fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background {
        match &self.flavour {
            Flavour::Sim { .. } => Background::spawn(task),
            Flavour::Real(_) => Background(Task::Real(tokio::task::spawn_local(task))),
        }
    }

    /// This node's clock (a simulated node's only: a real process reads [`Ctx::now_ms`],
    /// [`Ctx::monotonic_ms`]).
    pub fn clock(&self) -> &Clock {
        match &self.flavour {
            Flavour::Sim { clock, .. } => clock,
            Flavour::Real(_) => panic!("a real client process has no simulated clock (Ctx::clock)"),
        }
    }

    /// A generator of `of` for this node's life (a real process: its index), apart from the recipe's
    /// own stream: what a client library draws for itself does not shift the recipe's draws.
    pub fn stream(&self, of: Stream) -> ChaCha8Rng {
        stream(self.seed, of, self.index)
    }

    pub fn random_u64(&self) -> u64 {
        self.rng.borrow_mut().next_u64()
    }

    /// A duration drawn uniformly from `[lo, hi]`.
    pub fn random_duration(&self, lo: Duration, hi: Duration) -> Duration {
        if hi <= lo {
            return lo;
        }
        Duration::from_nanos(self.rng.borrow_mut().gen_range(lo.as_nanos() as u64..=hi.as_nanos() as u64))
    }
}

/// A background task (a keep-alive, a renewal watchdog, a client's pinger); aborted when dropped.
pub struct Background(Task);

enum Task {
    Sim(madsim::task::JoinHandle<()>),
    Real(tokio::task::JoinHandle<()>),
}

impl Background {
    /// Run `task` on the current simulated node ([`Ctx::spawn`] runs it where its context lives).
    pub fn spawn(task: impl Future<Output = ()> + 'static) -> Background {
        Background(Task::Sim(madsim::task::spawn_local(task)))
    }

    /// Whether the task has run to its end.
    pub fn finished(&self) -> bool {
        match &self.0 {
            Task::Sim(handle) => handle.is_finished(),
            Task::Real(handle) => handle.is_finished(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        match &self.0 {
            Task::Sim(handle) => handle.abort(),
            Task::Real(handle) => handle.abort(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A real context reads the time it is handed, sleeps and spawns on tokio, and aborts a dropped
    /// background task.
    #[test]
    fn a_real_context_keeps_time_and_tasks_on_tokio() {
        let ctx = Ctx::real(7, 1, RealTime { wall_ms: || 1_700_000_000_000, monotonic_ms: || 42 });
        assert!(ctx.is_real());
        assert_eq!((ctx.now_ms(), ctx.monotonic_ms()), (1_700_000_000_000, 42));
        let again = Ctx::real(7, 1, RealTime { wall_ms: || 0, monotonic_ms: || 0 });
        assert_eq!(ctx.random_u64(), again.random_u64(), "the seed's Recipe stream at the index");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let ran = Rc::new(Cell::new(0));
            let (done, stopped) = (ran.clone(), ran.clone());
            let finishing = ctx.spawn(async move { done.set(done.get() + 1) });
            let forever = ctx.spawn(async move {
                std::future::pending::<()>().await;
                stopped.set(100);
            });
            ctx.sleep(Duration::from_millis(5)).await;
            assert!(finishing.finished() && !forever.finished());
            drop(forever);
            ctx.sleep(Duration::from_millis(5)).await;
            assert_eq!(ran.get(), 1);
        });
    }
}
