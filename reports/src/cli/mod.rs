//! The command line (DESIGN §9). Exit codes: 0 every verdict as expected, 1 some verdict differed,
//! 2 bad input or a harness error.

mod list;
mod repro;
mod run;

use clap::{Parser, Subcommand};
use locksim_locks::Registry;
use locksim_scenarios::Scenario;
use std::path::Path;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "locksim",
    version,
    about = "Is this distributed lock safe? Run lock recipes against simulated Redis under GC pauses, \
             partitions, crashes and clock jumps, and check for two holders at once.",
    long_about = None,
    after_help = "Start with:\n  locksim list\n  locksim run scenarios/catalog/redis-del-gc-pause.toml --seeds 0..200\n  \
                  locksim repro scenarios/catalog/redis-del-gc-pause.toml --seed 0 --trace\n\n\
                  Exit codes: 0 as expected, 1 a verdict differed from the scenario's [expect], 2 bad input."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List recipes (with their parameters), fault kinds, or shipped scenarios.
    List(list::Args),
    /// Run a scenario over a range of seeds and compare the verdicts with its [expect].
    Run(run::Args),
    /// Replay one seed exactly: its faults, findings, measurements and (with --trace) every event.
    Repro(repro::Args),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::List(args) => list::list(args),
        Command::Run(args) => run::run(args),
        Command::Repro(args) => repro::repro(args),
    }
}

/// Load a scenario with the built-in recipes; errors are bad input (exit 2).
fn load(path: &Path) -> anyhow::Result<Scenario> {
    Ok(Scenario::load(path, &Registry::builtin())?)
}

/// Write `text` to stdout; a reader that stopped reading (`| head`) is a normal end, not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `A..B` (B exclusive) or a single seed `A`.
fn parse_seeds(text: &str) -> Result<std::ops::Range<u64>, String> {
    let bad = || format!("expected a seed range such as 0..200 (end exclusive) or one seed, found {text:?}");
    let range = match text.split_once("..") {
        Some((a, b)) => a.parse().map_err(|_| bad())?..b.parse().map_err(|_| bad())?,
        None => {
            let one: u64 = text.parse().map_err(|_| bad())?;
            one..one.checked_add(1).ok_or_else(bad)?
        }
    };
    if range.is_empty() {
        return Err(format!("the seed range {text:?} is empty"));
    }
    Ok(range)
}
