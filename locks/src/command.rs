//! `command`: a lock written in any language, run as one client process per scenario client.
//!
//! A scenario names it with `[recipe] command = ["prog", "arg", ...]` instead of an `id`; its other
//! `[recipe]` keys go to the process as `LOCKSIM_PARAM_<KEY>` strings. It runs only in real mode
//! (`locksim run FILE --real`), against real servers on loopback: the protocol and the process handling
//! are in the `locksim` binary (`live/src/real/`). Its server is the real one `[recipe] server`
//! names (Redis, ZooKeeper, etcd or PostgreSQL), so it has a family of its own, [`FAMILY`], with no
//! simulated server. Its `[backend]` takes the keys of the named server's family (they set that real
//! server up: Redis's persistence, PostgreSQL's session settings), or a `[model]`'s family's. A simulated run refuses it before starting; [`COMMAND`]'s `build`
//! exists only so that a simulation that got this far fails every acquisition with that reason rather
//! than panicking.

use crate::params::Params;
use crate::{no_constraints, Family, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;

/// The id the registry keeps the command recipe under. Scenario files never write it as `id`.
pub const ID: &str = "command";

/// Why a simulated run cannot run a command recipe.
pub const ONLY_REAL: &str =
    "recipe `command` runs only with --real (give it a [model], a built-in recipe, for the simulator to run)";

/// The family of the command recipe: whichever real server `[recipe] server` names, none simulated.
pub static FAMILY: Family = Family {
    name: "command",
    summary: "a lock in any language, run for real against the server [recipe] server names \
              ([backend]: that server's family's keys)",
    params: &[],
    topology: |_| Topology::default(),
    deploy: |_, _| Servers::new(()),
    real: None,
    marks: |_| false,
};

pub const COMMAND: RecipeSpec = RecipeSpec {
    id: ID,
    family: &FAMILY,
    summary: "any-language lock: [recipe] command = [\"prog\", \"arg\"], one process per client speaking JSON lines \
              (real mode only: locksim run FILE --real)",
    source: "your own lock library, through an adapter (scenarios/real/adapters/)",
    params: &[],
    // Whether a token comes depends on the adapter (`{"ok":true,"token":N}`).
    offers_token: true,
    // Whether a shared acquisition works depends on the adapter (`{"op":"acquire","shared":true}`).
    offers_shared: true,
    guard: Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: no_constraints,
    build,
};

struct OnlyReal;

#[crate::async_trait(?Send)]
impl Lock for OnlyReal {
    async fn acquire(&mut self) -> Outcome<Grant> {
        Outcome::Fail(ONLY_REAL.into())
    }

    async fn release(&mut self) -> Outcome<()> {
        Outcome::Fail(ONLY_REAL.into())
    }
}

fn build(_: &Params, _: Ctx, _: &Servers) -> Box<dyn Lock> {
    Box::new(OnlyReal)
}
