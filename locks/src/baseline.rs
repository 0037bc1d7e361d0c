//! The flash sale's floor: `none`, no lock at all (read, then write). Its ceiling,
//! `sql.conditional-update`, is a database recipe ([`crate::sql`]) built on the same [`no_lock`].

use crate::params::Params;
use crate::{async_trait, Family, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;

/// No lock: `acquire` and `release` succeed at once.
struct NoLock;

#[async_trait(?Send)]
impl Lock for NoLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        Outcome::Ok(Grant::default())
    }

    async fn release(&mut self) -> Outcome<()> {
        Outcome::Ok(())
    }
}

/// A lock that is no lock: for the recipes whose clients need none.
pub fn no_lock(_: &Params, _: Ctx, _: &Servers) -> Box<dyn Lock> {
    Box::new(NoLock)
}

/// The family of the `none` baseline: no servers.
pub static NO_SERVERS: Family = Family {
    name: "none",
    summary: "no lock service at all",
    params: &[],
    topology: |_| Topology::default(),
    deploy: |_, _| Servers::new(()),
    real: None,
    marks: |_| false,
};

pub const NONE: RecipeSpec = RecipeSpec {
    id: "none",
    family: &NO_SERVERS,
    summary: "no lock at all: every client reads, holds and writes as it pleases",
    source: "the flash-sale baseline: no lock at all",
    params: &[],
    offers_token: false,
    offers_shared: false,
    guard: Guard::Nothing,
    promises_fifo: false,
    points: &[],
    validate: crate::no_constraints,
    build: no_lock,
};
