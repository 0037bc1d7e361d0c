//! A user's own critical section and the invariant it keeps: what a lock protects when it is not the
//! built-in counter.
//!
//! A [`WorkSpec`] is to the workload what a [`crate::RecipeSpec`] is to the lock: registered with
//! [`crate::Registry::with_work`] and named by scenario files (`[workload] kind = "<id>"`). Each time a
//! client holds the lock, the workload runs the spec's `critical` section with a [`Section`]: a
//! [`Store`] — a key/value store on the resource node, fenced like the counter, every access recorded
//! in the history — and the client's clock. After the run the spec's `check` reads every store access
//! the store let through, in the order it applied them, and names each point where the user's
//! invariant broke: each is an `invariant` finding.
//!
//! The section may be cut short at any await: when the recipe learns its lock is gone, the workload
//! stops the holder (as a real lock's holder would stop on a lost-lock callback) and releases.

use locksim_sim::ctx::Ctx;
pub use locksim_sim::resource::{Store, StoreError};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// One critical section, as the workload hands it to a [`WorkSpec`].
pub struct Section {
    /// The store, with this holder's fencing token on every access.
    pub store: Store,
    /// The client's clock, sleep and spawn.
    pub ctx: Ctx,
    /// How long this section should take: drawn from the workload's `hold`; sleep it where the work
    /// takes its time (between a read and the write that depends on it, to open the race).
    pub hold: Duration,
    /// The client's name (`client-0`, …), e.g. to write who did what.
    pub client: String,
    /// The lock is held shared, as a reader (`reads` > 0 with a read-write lock): only read.
    pub shared: bool,
}

/// A critical section's future: a boxed `async` block (`Box::pin(async move { … })`).
pub type SectionFuture = Pin<Box<dyn Future<Output = ()>>>;

/// One store access the store let through, as an invariant reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Who made it (`client-0`, …).
    pub client: String,
    /// Simulated nanoseconds since the run started.
    pub at_ns: u64,
    pub token: Option<u64>,
    pub key: String,
    /// A put: the value written. A get: the value read (`None`: nothing there).
    pub value: Option<String>,
    pub put: bool,
}

/// Where the invariant broke: the access at `at` (an index into the accesses) and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub at: usize,
    pub why: String,
}

/// A user's workload: a critical section and the invariant it keeps.
#[derive(Clone, Copy)]
pub struct WorkSpec {
    /// The `kind` scenario files give it (not `counter` or `flash-sale`).
    pub id: &'static str,
    /// One line: what a holder does.
    pub summary: &'static str,
    /// One critical section of one holder.
    pub critical: fn(Section) -> SectionFuture,
    /// Every point where the accesses, in the order the store applied them, break the invariant.
    pub check: fn(&[Access]) -> Vec<Broken>,
}

impl std::fmt::Debug for WorkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkSpec({})", self.id)
    }
}

/// Two specs are the same workload when they have the same id (a registry holds one per id).
impl PartialEq for WorkSpec {
    fn eq(&self, other: &WorkSpec) -> bool {
        self.id == other.id
    }
}
