//! `own-locks`: the `locksim` command with locks of our own added (ZooKeeper, PostgreSQL, etcd), and
//! our own state for a lock to protect (a ledger with its invariant) — a crate outside locksim's
//! workspace, using only its public API, as a team's CI gate would.
//!
//! ```sh
//! cargo run --release -- run scenarios/zk-poll-gc-pause.toml --seeds 0..50
//! cargo run --release -- repro scenarios/zk-poll-gc-pause.toml --seed 0 --trace
//! cargo run --release -- suite suite.toml
//! ```

mod etcd_lock;
mod ledger;
mod sql_lease;
mod sql_lock;
mod zk_lock;
mod zk_write_lock;

use locksim_locks::Registry;

/// The built-in recipes and ours, and our workload: scenario files name ours by id (`my.zk-poll`, …,
/// `[workload] kind = "ledger"`).
pub fn registry() -> Registry {
    Registry::builtin()
        .with(zk_lock::RECIPE)
        .with(sql_lock::RECIPE)
        .with(sql_lease::RECIPE)
        .with(zk_write_lock::RECIPE)
        .with(etcd_lock::RECIPE)
        .with_work(ledger::WORK)
}

fn main() -> std::process::ExitCode {
    locksim_cli::main(registry())
}
