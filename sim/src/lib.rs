//! The world of locksim: everything that happens inside one deterministic run.
//!
//! Module map:
//! - [`world`]: nodes and their programs, the fault schedule applied to them.
//! - [`clock`]: per-node clocks (offset and drift over madsim's simulated time).
//! - [`net`]: typed messages between nodes: seeded latency, per-link order, cuts, delay, loss, lost replies.
//! - [`fault`]: the fault kinds (one declaration each), written-out schedules and the random nemesis.
//! - [`history`]: the event log of a run and its determinism fingerprint.
//! - [`hazard`]: the dangerous situations a run reached, counted beside the history (never in it).
//! - [`resource`]: the thing a lock protects, with or without fencing.
//! - [`backend`]: simulated servers as sans-IO state machines behind one shell (`redis`).
//! - [`ctx`]: what a recipe may touch: its clock, sleep, spawn, randomness, the network.
//! - [`rng`]: seeded random streams.
//!
//! Architecture invariants: nothing here reads the wall clock of the machine or an unseeded random
//! source; every map that is iterated is a `BTreeMap`; backends do no I/O.

#[cfg(not(madsim))]
compile_error!(
    "locksim must be built with `--cfg madsim` (set in .cargo/config.toml). A RUSTFLAGS environment \
     variable replaces that setting: add `--cfg madsim` to it, or unset it."
);

pub mod backend;
pub mod clock;
pub mod ctx;
pub mod fault;
pub mod hazard;
pub mod history;
pub mod net;
pub mod resource;
pub mod rng;
pub mod signal;
pub mod world;

pub use std::time::Duration;
