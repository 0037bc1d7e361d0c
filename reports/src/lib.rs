//! locksim's front end: the `locksim` command line (`src/main.rs`, `src/cli/`).
//!
//! Comparison reports with charts (DESIGN §10) will live here too; today the crate holds the output
//! formatting the command line shares.

pub mod text;
