//! What a recipe may touch: its node's clock, sleep, spawn, randomness, and the network.
//!
//! Recipes never call madsim directly. Going through [`Ctx`] is what makes per-node clocks work (a
//! recipe's "now" is its node's wall clock, its sleeps run at its node's clock rate) and is the seam
//! where the same recipe could later run on a real tokio runtime against real servers.

use crate::clock::Clock;
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
    clock: Clock,
    rpc: Rc<Rpc>,
    rng: Rc<RefCell<ChaCha8Rng>>,
    /// One value per type for the whole node, e.g. the router that hands each of the node's ZooKeeper
    /// sessions its own notifications.
    node_wide: Rc<RefCell<BTreeMap<TypeId, Rc<dyn Any>>>>,
}

impl Ctx {
    /// The context of the node described by `env`, speaking through `rpc`.
    pub fn new(env: &NodeEnv, rpc: Rc<Rpc>) -> Ctx {
        let index = (u64::from(env.me.0) << 16) | u64::from(env.incarnation);
        let rng = Rc::new(RefCell::new(stream(env.seed, Stream::Recipe, index)));
        Ctx { clock: env.clock.clone(), rpc, rng, node_wide: Rc::default() }
    }

    /// The node's one value of type `T`, made with `make` on first use.
    pub fn node_wide<T: 'static>(&self, make: impl FnOnce() -> T) -> Rc<T> {
        let mut map = self.node_wide.borrow_mut();
        let value = map.entry(TypeId::of::<T>()).or_insert_with(|| Rc::new(make()) as Rc<dyn Any>).clone();
        value.downcast::<T>().expect("keyed by its type")
    }

    /// This node's wall clock, in Unix-style milliseconds (jumps move it; it may go backwards).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Sleep for `d` as this node's timers measure it.
    pub async fn sleep(&self, d: Duration) {
        self.clock.sleep(d).await
    }

    /// The node's endpoint for backend calls.
    pub fn rpc(&self) -> &Rpc {
        &self.rpc
    }

    /// Run `task` in the background on this node; it stops when the returned handle is dropped.
    pub fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background {
        Background::spawn(task)
    }

    /// This node's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
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
pub struct Background(madsim::task::JoinHandle<()>);

impl Background {
    /// Run `task` on the current node.
    pub fn spawn(task: impl Future<Output = ()> + 'static) -> Background {
        Background(madsim::task::spawn_local(task))
    }

    /// Whether the task has run to its end.
    pub fn finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}
