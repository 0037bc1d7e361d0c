//! `locksim suite`: many scenarios over seed ranges — the CI gate.

use locksim_locks::Registry;
use locksim_reports::junit::junit;
use locksim_reports::results::ResultsWriter;
use locksim_reports::text;
use locksim_scenarios::run::run_seed;
use locksim_scenarios::scenario::{Scenario, Verdict};
use locksim_scenarios::suite::Suite;
use locksim_scenarios::sweep::{sweep_each, ScenarioResult};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The suite file: a list of [[run]] with scenario and seeds (see scenarios/suites/).
    suite: PathBuf,
    /// Write a JUnit XML report here (one test case per run).
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Write every run's results here, for `locksim report`.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seeds run at once (default: the number of cores). Results do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: Option<u16>,
    /// Run only part `i` of `n` of each run's seeds, e.g. `--shard 2/4`; merge with `locksim report`.
    #[arg(long, value_parser = super::parse_shard)]
    shard: Option<(u64, u64)>,
    /// Where failing seeds are shrunk to (one scenario file each).
    #[arg(long, default_value = "target/locksim-shrunk")]
    shrink_dir: PathBuf,
    /// Do not shrink failing seeds.
    #[arg(long)]
    no_shrink: bool,
    /// Run each scenario on real servers with real client processes instead of simulating (see
    /// docs/real-mode.md): `--runs` runs each, from its seeds' start. Every scenario needs a `[model]` or is a
    /// baseline, so that the same suite also runs simulated, for `report` to set the two side by side.
    #[arg(long, conflicts_with_all = ["shard", "jobs"])]
    real: bool,
    /// With --real: how many real runs of each scenario [default: its `[expect] real_runs`, else 1].
    #[arg(long, requires = "real", value_parser = clap::value_parser!(u64).range(1..=locksim_scenarios::scenario::REAL_RUNS_MAX))]
    runs: Option<u64>,
}

/// One line for a run: `ok` or `FAIL`, what it found, and for a failure why and how to replay it.
fn line(run: &ScenarioResult, ok: bool) -> String {
    let kinds = text::kinds_summary(run);
    let mut out = format!(
        "{} {:<44} {:<26} {} {}..{}: {}{}",
        if ok { "ok  " } else { "FAIL" },
        run.scenario,
        run.recipe,
        if run.real { "real runs with seeds" } else { "seeds" },
        run.seeds.start,
        run.seeds.end,
        text::unsafe_count(run),
        if kinds.is_empty() { String::new() } else { format!(" — {kinds}") }
    );
    let hazards = text::hazards_compact(run);
    if !hazards.is_empty() {
        out.push_str(&format!("\n     hazards: {hazards}"));
    }
    // Said only when some seed tested nothing: then the rate above is over fewer seeds than it names.
    if let Some(coverage) = text::fault_coverage(run).filter(|_| run.fault_coverage.is_some_and(|c| !c.complete())) {
        out.push_str(&format!("\n     faults: {coverage}"));
    }
    if !ok {
        for reason in &run.reasons {
            out.push_str(&format!("\n     - {reason}"));
        }
        if let Some(example) = text::example_line(run) {
            out.push_str(&format!("\n     {}: {example}", if run.real { "example" } else { "reproduce" }));
        }
    }
    out
}

/// Shrink the seed that shows a failing run's unwanted finding; the line naming the shrunk repro.
fn shrunk(scenario: &Scenario, registry: &Registry, run: &ScenarioResult, dir: &Path) -> Option<String> {
    let seed = run.example_seed?;
    // Run again rather than kept: a sweep keeps no seed's result.
    let bad = run_seed(scenario, seed).ok()?.result;
    let kind = *bad
        .counts
        .keys()
        .find(|k| k.is_violation() && (run.expect.verdict == Verdict::Safe || run.expect.absent.contains(k)))?;
    std::fs::create_dir_all(dir).ok()?;
    let out = dir.join(format!("{}-seed-{seed}.toml", run.scenario));
    match super::shrink::shrink_to(Path::new(&run.path), registry, seed, Some(kind), &out) {
        Ok((_, said)) => Some(format!("     shrunk: {said}")),
        Err(e) => Some(format!("     could not shrink: {e:#}")),
    }
}

pub fn suite(args: Args, registry: &Registry) -> anyhow::Result<ExitCode> {
    let suite = Suite::load(&args.suite, registry)?;
    let shrink_dir = (!args.no_shrink).then_some(args.shrink_dir.as_path());
    super::check_outputs([&args.junit, &args.json], shrink_dir)?;
    if args.real {
        return real(&args, &suite);
    }
    let jobs = super::jobs(args.jobs);
    let ranges: Vec<_> = suite.runs.iter().map(|r| super::shard(r.seeds.clone(), args.shard)).collect();
    let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta} {msg}")
            .expect("valid template"),
    );
    let started = Instant::now();
    let (mut results, mut seconds, mut failed) = (Vec::new(), Vec::new(), 0);
    // Seed results go straight to the file, run after run: nothing is kept per seed.
    let mut json = args.json.as_deref().map(|path| ResultsWriter::create(path, &suite.name)).transpose()?;
    for (run, range) in suite.runs.iter().zip(ranges) {
        bar.set_message(run.scenario.name.clone());
        let run_started = Instant::now();
        let empty = range.is_empty();
        let save = |seed| json.as_mut().map_or(Ok(()), |out| out.seed(&seed));
        let mut result = sweep_each(&run.scenario, range, jobs, &|| bar.inc(1), save)?;
        result.shard = super::shard_record(&run.seeds, args.shard);
        if let Some(out) = json.as_mut() {
            out.run(&result)?;
        }
        seconds.push(run_started.elapsed().as_secs_f64());
        let ok = empty || super::shard_ok(&result, args.shard.is_some());
        let mut said = match super::empty_shard(&run.seeds, args.shard).filter(|_| empty) {
            Some(note) => format!("ok   {:<44} {note}", result.scenario).trim_end().to_string(),
            None => line(&result, ok),
        };
        if !ok {
            failed += 1;
            if !args.no_shrink {
                if let Some(shrunk) = shrunk(&run.scenario, registry, &result, &args.shrink_dir) {
                    said.push('\n');
                    said.push_str(&shrunk);
                }
            }
        }
        bar.suspend(|| super::emit(&(said + "\n")))?;
        results.push(result);
    }
    bar.finish_and_clear();
    let runs = results.len();
    super::emit(&format!("suite {}: {runs} runs, {} as expected, {failed} not\n", suite.name, runs - failed))?;
    eprintln!("{total} seeds in {:.1} s on {jobs} jobs", started.elapsed().as_secs_f64());
    if let Some(path) = &args.junit {
        let xml = junit(&suite.name, &results, &seconds);
        std::fs::write(path, xml).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    if let Some(out) = json {
        out.finish()?;
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `suite --real`: each run's scenario `--runs` times (or its `[expect] real_runs`) for real, one run after another; its line and
/// JUnit case as a simulated run's, its results marked real.
fn real(args: &Args, suite: &Suite) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let name = format!("{} (real runs)", suite.name);
    let mut json = args.json.as_deref().map(|path| ResultsWriter::create(path, &name)).transpose()?;
    let (mut results, mut seconds, mut failed, mut total) = (Vec::new(), Vec::new(), 0, 0);
    for run in &suite.runs {
        let run_started = Instant::now();
        // Hazards are counted by the simulated models only: a real run cannot be held to them.
        let mut scenario = run.scenario.clone();
        scenario.expect.hazards.clear();
        let runs = args.runs.or(scenario.real_runs).unwrap_or(1);
        let note = super::run::too_few_runs(&scenario, runs);
        total += runs;
        let mut result = locksim_live::real::run(&scenario, runs, run.seeds.start, |r| {
            json.as_mut().map_or(Ok(()), |out| out.seed(&r.result))
        })?;
        result.real = true;
        if let Some(out) = json.as_mut() {
            out.run(&result)?;
        }
        seconds.push(run_started.elapsed().as_secs_f64());
        failed += usize::from(!result.as_expected);
        super::emit(&format!("{}\n", line(&result, result.as_expected)))?;
        if let Some(note) = note.filter(|_| !result.as_expected) {
            super::emit(&format!("     {note}\n"))?;
        }
        results.push(result);
    }
    let runs = results.len();
    super::emit(&format!("suite {name}: {runs} runs, {} as expected, {failed} not\n", runs - failed))?;
    eprintln!("{} in {:.1} s", text::count(total, "real run", "real runs"), started.elapsed().as_secs_f64());
    if let Some(path) = &args.junit {
        let xml = junit(&name, &results, &seconds);
        std::fs::write(path, xml).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    if let Some(out) = json {
        out.finish()?;
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
