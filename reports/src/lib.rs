//! locksim's results: what the `locksim` commands write and show.
//!
//! Module map:
//! - [`text`]: plain-text results, shared by the commands.
//! - [`results`]: the JSON results files `run` and `suite` write and `report` merges.
//! - [`junit`]: JUnit XML for CI.
//! - [`decide`]: the decision table: per lock variant, its worst violation, herd, recovery, speed, verdict.
//! - [`charts`]: SVG charts (plotters) of a set of results.
//! - [`report`]: the comparison report — `index.html` and `report.md` with the charts.
//! - [`sweep_chart`]: the chart of a breaking-point sweep (`locksim sweep --out`).
//! - [`timeline`]: one seed drawn as lanes of waiting, holding and faults.

pub mod charts;
pub mod decide;
pub mod junit;
pub mod report;
pub mod results;
pub mod sweep_chart;
pub mod text;
pub mod timeline;
