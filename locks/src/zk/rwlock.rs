//! `zk.rwlock`: Curator's InterProcessReadWriteLock — readers share, writers hold alone.
//!
//! Source: Curator `InterProcessReadWriteLock`: two InterProcessMutexes over one parent node, whose
//! nodes are named `__WRIT__` and `__READ__` and sort together by their sequence suffix.
//! - Write lock: as `zk.sequential` — the first node of the queue holds it, and a waiting writer watches
//!   the node just before its own, reader or writer.
//! - Read lock: held while no writer's node comes before ours; otherwise a reader watches the first such
//!   writer (`readLockPredicate`), so every reader queued behind one writer wakes when it leaves.
//! - A holder of the write lock takes the read lock at once (Curator's downgrade path); a reader asking
//!   for the write lock queues behind its own read node and waits until its timeout (no upgrade).
//! - Each side is reentrant; `release` gives up the most recent acquisition. The fencing token is the
//!   node's czxid.
//!
//! Readers are granted together, so request order is not grant order among them: `unfair` is off.
//! Expected (catalog): readers overlap and no writer overlaps anyone; a holder paused past its session
//! timeout still believes it holds its side while the other side is granted (`double-holder`).

use super::sequential::{Driver, Held, Queue, Sequential, QUEUE_CREATE};
use super::{ACQUIRE_TIMEOUT, CLIENT, LOST_ON, SESSION_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "zk.rwlock",
    family: &super::FAMILY,
    summary: "Curator InterProcessReadWriteLock: one queue of read and write nodes; readers share (reads > 0)",
    source: "Apache Curator InterProcessReadWriteLock",
    params: &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_ON, CLIENT],
    offers_token: true,
    offers_shared: true,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[QUEUE_CREATE, LEASE_RENEW],
    validate: super::positive_session,
    build,
};

const DIR: &str = "/locks/rwlock";
const WRITER: &str = "__WRIT__";
const WRITE: Queue = Queue { dir: DIR, name: WRITER, driver: Driver::Exclusive };
const READ: Queue = Queue { dir: DIR, name: "__READ__", driver: Driver::Shared { writer: WRITER } };
const READ_WHILE_WRITING: Queue = Queue { driver: Driver::Granted, ..READ };

struct RwLock {
    core: Sequential,
    read: Option<Held>,
    write: Option<Held>,
    /// The sides taken, oldest first (`true`: read), so that `release` gives up the latest.
    taken: Vec<bool>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(RwLock { core: Sequential::new(params, ctx, servers, true), read: None, write: None, taken: Vec::new() })
}

impl RwLock {
    fn note(&mut self, outcome: Outcome<Grant>, read: bool) -> Outcome<Grant> {
        if let Outcome::Ok(_) = outcome {
            self.taken.push(read);
        }
        outcome
    }
}

#[async_trait(?Send)]
impl Lock for RwLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let outcome = self.core.acquire(&mut self.write, WRITE).await;
        self.note(outcome, false)
    }

    async fn acquire_shared(&mut self) -> Outcome<Grant> {
        let queue = if self.write.is_some() { READ_WHILE_WRITING } else { READ };
        let outcome = self.core.acquire(&mut self.read, queue).await;
        self.note(outcome, true)
    }

    async fn release(&mut self) -> Outcome<()> {
        match self.taken.pop() {
            None => Outcome::Fail("not held by this client".into()),
            Some(true) => self.core.release(&mut self.read).await,
            Some(false) => self.core.release(&mut self.write).await,
        }
    }

    async fn lost(&self) -> String {
        self.core.lost(if self.write.is_some() { &self.write } else { &self.read }).await
    }
}
