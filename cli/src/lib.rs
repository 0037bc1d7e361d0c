//! The command line (README.md, docs/ci.md). Exit codes: 0 every verdict as expected, 1 some verdict differed,
//! 2 bad input or a harness error.

mod adapter;
mod conform;
mod list;
mod report;
mod repro;
mod run;
mod shrink;
mod suite;
mod sweep;

use clap::{Parser, Subcommand};
use locksim_locks::Registry;
use locksim_scenarios::reason::Reason;
use locksim_scenarios::Scenario;
use std::path::Path;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "locksim",
    version,
    about = "Is this distributed lock safe? Run lock recipes against simulated Redis, ZooKeeper, etcd and \
             PostgreSQL under GC pauses, partitions, crashes and clock jumps, and check for two holders at \
             once, stale writes, deadlocks, herds, unfairness, starvation and oversold flash sales.",
    long_about = None,
    after_help = "Start with:\n  locksim list\n  locksim run scenarios/catalog/redis-del-gc-pause.toml --seeds 0..200\n  \
                  locksim repro scenarios/catalog/redis-del-gc-pause.toml --seed 0 --trace\n\n\
                  In CI:\n  locksim suite scenarios/suites/smoke.toml --junit target/junit.xml\n  \
                  locksim suite scenarios/suites/full.toml --json target/results.json && locksim report target/results.json --out target/report\n\n\
                  Exit codes: 0 as expected, 1 a verdict differed from the scenario's [expect], 2 bad input."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List recipes (with their parameters), workloads, fault kinds, or shipped scenarios.
    List(list::Args),
    /// Run a scenario over a range of seeds and compare the verdicts with its [expect].
    Run(run::Args),
    /// Replay one seed exactly: its faults, findings, measurements and (with --trace) every event.
    Repro(repro::Args),
    /// Turn a failing seed into the smallest written-out schedule that still fails, as a scenario file.
    Shrink(shrink::Args),
    /// Run a suite of scenarios over seed ranges, as CI does: a line per run, JUnit and JSON results.
    Suite(suite::Args),
    /// Vary one key of a scenario over a grid (a pause, a TTL, a session timeout, clients) and find
    /// where the lock breaks: the unsafe rate at each value with its 95% interval, and a chart.
    Sweep(sweep::Args),
    /// Merge results files (shards, suites) into a comparison report: index.html, report.md, SVG charts.
    Report(report::Args),
    /// Check the simulated servers against the real ones on loopback: the same operations, the same answers.
    Conform(conform::Args),
    /// The client process of a built-in recipe in real mode (started by `run --real`, not by people).
    #[command(hide = true)]
    Adapter(adapter::Args),
}

/// `locksim`'s `main`, with the recipes and workloads scenario files may name: `Registry::builtin()`
/// for the shipped command, or the built-ins and your own for a command of yours that tests your locks
/// (and your own state under them) —
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     locksim_cli::main(locksim_locks::Registry::builtin() /* .with(MY_LOCK).with_work(MY_WORK) */)
/// }
/// ```
///
/// Every subcommand, option and exit code is `locksim`'s.
pub fn main(registry: Registry) -> ExitCode {
    // A panic inside a simulation is a harness bug, reported once as an error with exit code 2 (the
    // runner names the seed); hundreds of seeds must not each print a backtrace.
    std::panic::set_hook(Box::new(|info| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("locksim: internal error: {info}"));
    }));
    // Lines to paste name the binary that printed them: an own-lock crate's, when it is one.
    if let Some(name) = std::env::args_os().next().as_deref().map(Path::new).and_then(Path::file_name) {
        locksim_reports::text::set_program(&name.to_string_lossy());
    }
    let args = Cli::parse();
    match dispatch(args, &registry) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("locksim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(cli: Cli, registry: &Registry) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::List(args) => list::list(args, registry),
        Command::Run(args) => run::run(args, registry),
        Command::Repro(args) => repro::repro(args, registry),
        Command::Shrink(args) => shrink::shrink(args, registry),
        Command::Suite(args) => suite::suite(args, registry),
        Command::Sweep(args) => sweep::sweep(args, registry),
        Command::Report(args) => report::report(args),
        Command::Conform(args) => conform::conform(args),
        Command::Adapter(args) => adapter::adapter(args, registry),
    }
}

/// Load a scenario to simulate, naming recipes of `registry`; errors are bad input (exit 2). A command
/// recipe runs only in real mode: see [`load_any`].
fn load(path: &Path, registry: &Registry) -> anyhow::Result<Scenario> {
    let scenario = load_any(path, registry)?;
    if scenario.only_real() {
        anyhow::bail!("{}: {}", path.display(), locksim_locks::command::ONLY_REAL);
    }
    Ok(scenario)
}

/// Load a scenario for a simulated or a real run.
fn load_any(path: &Path, registry: &Registry) -> anyhow::Result<Scenario> {
    Ok(Scenario::load(path, registry)?)
}

/// Write `text` to stdout; a reader that stopped reading (`| head`) is a normal end, not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Check, before a long run, that a file can be written at `path`: found only afterwards, a bad path
/// would throw the run's results away. Leaves an existing file as it was, and no new one behind.
fn writable_file(path: &std::path::Path) -> anyhow::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot write the output there ({e}); nothing was run", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// [`writable_file`] for an output directory: create it, and check that a file can be written in it.
fn writable_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("{}: cannot create the output directory ({e}); nothing was run", dir.display()))?;
    writable_file(&dir.join(".locksim-write-check"))
}

/// [`writable_dir`] creating only the last component, as `mkdir` does: a mistyped `--out` must not
/// leave a trail of directories behind (one trial made some at the filesystem root).
fn new_or_existing_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !parent.is_dir() {
            anyhow::bail!(
                "{}: cannot create the output directory: its parent {} does not exist (create it first); nothing was run",
                dir.display(),
                parent.display()
            );
        }
        std::fs::create_dir(dir).map_err(|e| {
            anyhow::anyhow!("{}: cannot create the output directory ({e}); nothing was run", dir.display())
        })?;
    }
    writable_dir(dir)
}

/// Check every output path a command was given, before it runs anything.
fn check_outputs<'a>(
    files: impl IntoIterator<Item = &'a Option<std::path::PathBuf>>,
    dirs: impl IntoIterator<Item = &'a std::path::Path>,
) -> anyhow::Result<()> {
    for path in files.into_iter().flatten() {
        writable_file(path)?;
    }
    for dir in dirs {
        writable_dir(dir)?;
    }
    Ok(())
}

/// `A..B` (B exclusive) or a single seed `A`.
fn parse_seeds(text: &str) -> Result<std::ops::Range<u64>, String> {
    locksim_scenarios::suite::parse_seeds(text)
}

/// `i/n`: part `i` (from 1) of `n`.
fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("expected a shard such as 2/4 (part 2 of 4), found {text:?}");
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n): (u64, u64) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
    if n == 0 || i == 0 || i > n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The seeds of this shard (all of them without one).
fn shard(seeds: std::ops::Range<u64>, shard: Option<(u64, u64)>) -> std::ops::Range<u64> {
    match shard {
        Some((i, n)) => locksim_scenarios::sweep::shard_of(seeds, i, n),
        None => seeds,
    }
}

/// What a run records of its shard, for `report` to check that every shard came back.
fn shard_record(seeds: &std::ops::Range<u64>, shard: Option<(u64, u64)>) -> Option<locksim_scenarios::sweep::Shard> {
    shard.map(|(index, count)| locksim_scenarios::sweep::Shard { index, count, of: seeds.clone() })
}

/// The line for a shard that got no seeds (more shards than seeds): it runs nothing and fails nothing.
fn empty_shard(seeds: &std::ops::Range<u64>, shard: Option<(u64, u64)>) -> Option<String> {
    shard.map(|(i, n)| format!("shard {i}/{n} of seeds {}..{} has no seeds: nothing to run\n", seeds.start, seeds.end))
}

/// Whether a run passes. A shard sees only some seeds, so it fails only on what no other shard can
/// change: a violation where none was allowed. Whether an expected finding occurred is judged when
/// `report` merges the shards.
fn shard_ok(result: &locksim_scenarios::sweep::ScenarioResult, sharded: bool) -> bool {
    if !sharded || result.as_expected {
        return result.as_expected;
    }
    result.reasons.iter().all(Reason::in_no_seed)
}

/// Seeds run at once: `--jobs`, or the number of cores.
fn jobs(jobs: Option<u16>) -> usize {
    jobs.map(usize::from).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
