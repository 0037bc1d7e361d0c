//! locksim's front end: the `locksim` command line, and what it writes.
//!
//! Module map:
//! - [`cli`]: the command line; `cli::main(registry)` is `locksim` with your own recipes added.
//! - [`text`]: plain-text results, shared by the commands.
//! - [`results`]: the JSON results files `run` and `suite` write and `report` merges.
//! - [`junit`]: JUnit XML for CI.
//! - [`decide`]: the decision table: per lock variant, its worst violation, herd, recovery, speed, verdict.
//! - [`charts`]: SVG charts (plotters) of a set of results.
//! - [`report`]: the comparison report — `index.html` and `report.md` with the charts.
//! - [`sweep_chart`]: the chart of a breaking-point sweep (`locksim sweep --out`).
//! - [`timeline`]: one seed drawn as lanes of waiting, holding and faults.
//! - [`conform`]: the simulated servers against the real ones on loopback (`locksim conform`).
//! - [`real`]: real mode (`locksim run FILE --real`): a command recipe's client processes against a real Redis.

pub mod charts;
pub mod cli;
pub mod conform;
pub mod decide;
pub mod junit;
pub mod real;
pub mod report;
pub mod results;
pub mod sweep_chart;
pub mod text;
pub mod timeline;
