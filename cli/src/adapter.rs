//! `locksim adapter` (hidden from `--help`): the client process real mode starts for a built-in recipe
//! (see [`locksim_live::real::adapter`]). Not for people: it speaks JSON lines on stdin and stdout.

use locksim_locks::Registry;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The scenario whose recipe this process runs (an absolute path: it runs in the scenario's
    /// directory).
    scenario: PathBuf,
    /// The real run's seed: the recipe's random stream (lock values) is drawn from it.
    #[arg(long)]
    seed: u64,
}

pub fn adapter(args: Args, registry: &Registry) -> anyhow::Result<ExitCode> {
    let scenario = super::load_any(&args.scenario, registry)?;
    locksim_live::real::adapter::main(&scenario, args.seed)?;
    Ok(ExitCode::SUCCESS)
}
