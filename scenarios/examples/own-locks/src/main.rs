//! `own-locks`: the `locksim` command with three locks of our own added — a crate outside locksim's
//! workspace, using only its public API, as a team's CI gate would.
//!
//! ```sh
//! cargo run --release -- run scenarios/zk-poll-gc-pause.toml --seeds 0..50
//! cargo run --release -- repro scenarios/zk-poll-gc-pause.toml --seed 0 --trace
//! cargo run --release -- suite suite.toml
//! ```

mod etcd_lock;
mod sql_lock;
mod zk_lock;

use locksim_locks::Registry;

/// The built-in recipes and ours: scenario files name ours by id (`my.zk-poll`, …).
pub fn registry() -> Registry {
    Registry::builtin().with(zk_lock::RECIPE).with(sql_lock::RECIPE).with(etcd_lock::RECIPE)
}

fn main() -> std::process::ExitCode {
    locksim_reports::cli::main(registry())
}
