//! Scenarios, workloads, checkers and the seed runner.
//!
//! Module map:
//! - [`file`](mod@file): the scenario file as written, with positions and precise errors.
//! - [`scenario`]: the validated [`Scenario`] a run needs.
//! - [`rate`]: `k` of `n` seeds as a rate with its 95% interval.
//! - [`distribution`]: medians over millions of seeds in bounded memory.
//! - [`duration`]: `"250ms"`-style durations and ranges.
//! - [`workload`]: the client program around a recipe, and the only code touching the resource.
//! - [`checkers`]: pure functions from a history to findings, and the run's measurements.
//! - [`run`]: one seed: build the world, run it, check it.
//! - [`reason`]: why a sweep's seeds missed the expectation, typed, shown as a line each.
//! - [`sweep`]: many seeds in parallel, judged against the scenario's expectation; shards and merging.
//! - [`vary`]: one key of a scenario varied over a grid, for breaking-point sweeps.
//! - [`suite`]: many scenarios over seed ranges, as CI runs them.
//! - [`variant`]: what sets a scenario's lock apart from its recipe's defaults, for the report's rows.
//! - [`shrink`]: the smallest written-out schedule that still gives a seed's finding.
//!
//! Architecture invariants: checkers see only the history; the result of a seed depends on the scenario
//! and the seed alone (fresh thread, fresh runtime, every node killed before returning).

pub mod checkers;
pub mod distribution;
pub mod duration;
pub mod file;
pub mod rate;
pub mod reason;
pub mod run;
pub mod scenario;
pub mod shrink;
pub mod suite;
pub mod sweep;
pub mod to_violation;
pub mod variant;
pub mod vary;
pub mod workload;

pub use scenario::{Scenario, Verdict};
