//! `locksim run`: many seeds of one scenario, judged against its `[expect]`.

use locksim_reports::results::ResultsWriter;
use locksim_reports::text;
use locksim_scenarios::run::SeedResult;
use locksim_scenarios::scenario::Verdict;
use locksim_scenarios::scenario::REAL_RUNS_MAX;
use locksim_scenarios::sweep::{sweep_each, ScenarioResult};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The scenario file (see `locksim list scenarios`).
    scenario: PathBuf,
    /// Seeds to run: `A..B` (B exclusive) or one seed [default: 0..100]. Any number: results are judged
    /// as they come and not kept, so memory stays flat. With --real: one real run per seed.
    #[arg(long, value_parser = super::parse_seeds)]
    seeds: Option<std::ops::Range<u64>>,
    /// Seeds run at once (default: the number of cores). Results do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: Option<u16>,
    /// Write every seed's result (findings, measurements, history hash, schedule) to this JSON file,
    /// for `locksim report`: one line per seed, written as the seeds finish.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only part `i` of `n` of the seeds (a contiguous part), e.g. `--shard 2/4` in a CI matrix;
    /// `locksim report` merges the parts' JSON files. A shard checks only what its seeds can show.
    #[arg(long, value_parser = super::parse_shard)]
    shard: Option<(u64, u64)>,
    /// Run on real servers and real client processes instead of simulating (a `command` recipe against
    /// a real Redis on loopback; see docs/real-mode.md). Not reproducible from a seed.
    #[arg(long)]
    real: bool,
    /// With --real: how many real runs, with seeds 0..N (or as many as --seeds has) [default: the
    /// scenario's `[expect] real_runs`, else 1].
    #[arg(long, requires = "real", value_parser = clap::value_parser!(u64).range(1..=REAL_RUNS_MAX))]
    runs: Option<u64>,
    /// With --real: write the history of every unsafe run here, as `<scenario>-seed-<N>.jsonl` (the
    /// JSON lines `repro --history` writes), to inspect what really happened.
    #[arg(long, requires = "real")]
    history_dir: Option<PathBuf>,
}

/// What `run` prints: the counts, the verdict against `[expect]`, and the repro line.
pub fn summary(result: &ScenarioResult, seeds: u64) -> String {
    let kinds = text::kinds_summary(result);
    let mut out = format!(
        "{} ({}): {}, {}{}\n",
        result.scenario,
        result.recipe,
        text::count(seeds, "seed", "seeds"),
        text::unsafe_count(result),
        if kinds.is_empty() { String::new() } else { format!(" — {kinds}") }
    );
    let expected: Vec<&str> = result.expect.findings.iter().map(|k| k.name()).collect();
    let verdict = format!("{:?}", result.expect.verdict).to_lowercase();
    let label = if expected.is_empty() { verdict } else { format!("{verdict} [{}]", expected.join(", ")) };
    if result.as_expected {
        out.push_str(&format!("expected {label}: as expected\n"));
    } else {
        out.push_str(&format!("expected {label}: NOT as expected\n"));
        for reason in &result.reasons {
            out.push_str(&format!("  - {reason}\n"));
        }
    }
    if let Some(line) = text::fault_coverage(result) {
        out.push_str(&format!("faults: {line}\n"));
    }
    if let Some(line) = text::to_violation(result) {
        out.push_str(&format!("to a violation: {line}\n"));
    }
    let hazards = text::hazards_summary(result);
    out.push_str(&format!("hazards: {}\n", if hazards.is_empty() { "none reached".into() } else { hazards }));
    out.push_str(&format!("measured: {}\n", text::summary(&result.summary)));
    if let Some(seed) = result.example_seed {
        out.push_str(&format!("reproduce: {}\n", text::repro_line(&result.path, seed)));
    }
    out
}

pub fn run(args: Args, registry: &locksim_locks::Registry) -> anyhow::Result<ExitCode> {
    if args.real {
        return real(args, registry);
    }
    let scenario = super::load(&args.scenario, registry)?;
    super::check_outputs([&args.json], [])?;
    let jobs = super::jobs(args.jobs);
    let all = args.seeds.clone().unwrap_or(0..100);
    let range = super::shard(all.clone(), args.shard);
    let seeds = range.end - range.start;
    // Seed results go straight to the file as they finish, in seed order: nothing is kept per seed, so
    // memory stays flat over any number of seeds.
    let mut json = args.json.as_deref().map(|path| ResultsWriter::create(path, &scenario.name)).transpose()?;
    let started = Instant::now();
    // When the first violation came, in wall time: what finding this bug costs here.
    let mut first_violation = None;
    let mut save = |seed: SeedResult| {
        if seed.verdict == Verdict::Unsafe {
            first_violation.get_or_insert_with(|| started.elapsed().as_secs_f64());
        }
        json.as_mut().map_or(Ok(()), |out| out.seed(&seed))
    };
    let empty = super::empty_shard(&all, args.shard).filter(|_| range.is_empty());
    // Drawn only on a terminal: indicatif hides itself when stderr is not one (CI logs stay clean).
    let bar = indicatif::ProgressBar::new(seeds);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta}")
            .expect("valid template"),
    );
    let mut result = sweep_each(&scenario, range, jobs, &|| bar.inc(1), &mut save)?;
    result.shard = super::shard_record(&all, args.shard);
    let wall = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if let Some(mut out) = json {
        out.run(&result)?;
        out.finish()?;
    }
    if let Some(note) = empty {
        super::emit(&note)?;
        return Ok(ExitCode::SUCCESS);
    }
    super::emit(&summary(&result, seeds))?;
    let simulated = seeds as f64 * scenario.workload.duration.as_secs_f64();
    let first = first_violation.map_or(String::new(), |s| format!("; the first violation after {s:.2} s"));
    eprintln!(
        "{} in {wall:.2} s on {jobs} jobs: {:.0} seeds/s, {:.0} simulated s per wall s{first}",
        text::count(seeds, "seed", "seeds"),
        seeds as f64 / wall,
        simulated / wall
    );
    Ok(if super::shard_ok(&result, args.shard.is_some()) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `run --real`: real runs, one after another, judged as a sweep is.
fn real(args: Args, registry: &locksim_locks::Registry) -> anyhow::Result<ExitCode> {
    if args.shard.is_some() || args.jobs.is_some() {
        anyhow::bail!("--real runs one run at a time, on one machine: it does not take --shard or --jobs");
    }
    let scenario = super::load_any(&args.scenario, registry)?;
    super::check_outputs([&args.json], [])?;
    if let Some(dir) = &args.history_dir {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    let seeds = real_seeds(args.seeds.clone(), args.runs, scenario.real_runs)?;
    let runs = seeds.end - seeds.start;
    if let Some(note) = too_few_runs(&scenario, runs) {
        eprintln!("{note}");
    }
    let mut json = args.json.as_deref().map(|path| ResultsWriter::create(path, &scenario.name)).transpose()?;
    let started = Instant::now();
    let mut result = locksim_live::real::run(&scenario, runs, seeds.start, |run| {
        let r = &run.result;
        if let Some(out) = json.as_mut() {
            out.seed(r)?;
        }
        let saved = match &args.history_dir {
            Some(dir) if r.verdict == locksim_scenarios::Verdict::Unsafe => {
                let path = dir.join(format!("{}-seed-{}.jsonl", scenario.name, r.seed));
                std::fs::write(&path, run.history.to_jsonl())
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                Some(path)
            }
            _ => None,
        };
        let kinds: Vec<String> = r.counts.iter().map(|(k, n)| format!("{} {n}", k.name())).collect();
        let verdict = format!("{:?}", r.verdict).to_lowercase();
        let kinds = if kinds.is_empty() { String::new() } else { format!(" — {}", kinds.join(", ")) };
        let mut text = format!("real run with seed {}: {verdict}{kinds}\n", r.seed);
        let mut shown = std::collections::BTreeSet::new();
        for f in r.findings.iter().filter(|f| f.kind.is_violation() && shown.insert(f.kind)) {
            text.push_str(&format!("  {}\n", text::finding(f)));
        }
        if let Some(path) = saved {
            text.push_str(&format!("  history: {}\n", path.display()));
        }
        super::emit(&text)
    })?;
    result.real = true;
    if let Some(mut out) = json {
        out.run(&result)?;
        out.finish()?;
    }
    super::emit(&real_summary(&result, runs))?;
    if let Some(note) = too_few_runs(&scenario, runs).filter(|_| !result.as_expected) {
        super::emit(&format!("{note}\n"))?;
    }
    eprintln!("{} in {:.1} s", text::count(runs, "real run", "real runs"), started.elapsed().as_secs_f64());
    Ok(if result.as_expected { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The seeds of `run --real`, one run each: `--seeds`, or `--runs` from 0, or the scenario's
/// `[expect] real_runs` from 0, or seed 0; refused when `--seeds` and `--runs` disagree.
pub fn real_seeds(
    seeds: Option<std::ops::Range<u64>>,
    runs: Option<u64>,
    real_runs: Option<u64>,
) -> anyhow::Result<std::ops::Range<u64>> {
    let seeds = match (seeds, runs) {
        (Some(s), Some(n)) if s.end - s.start != n => anyhow::bail!(
            "--seeds {}..{} are {} runs, but --runs {n}: with --real each seed is one run; give one of them",
            s.start,
            s.end,
            s.end - s.start
        ),
        (Some(s), _) => s,
        (None, runs) => 0..runs.or(real_runs).unwrap_or(1),
    };
    if seeds.end - seeds.start > REAL_RUNS_MAX {
        anyhow::bail!("--seeds {}..{}: --real makes at most {REAL_RUNS_MAX} runs", seeds.start, seeds.end);
    }
    Ok(seeds)
}

/// A note when `runs` is fewer than the scenario's `[expect] real_runs`: its verdict may not show.
pub fn too_few_runs(scenario: &locksim_scenarios::Scenario, runs: u64) -> Option<String> {
    let needs = scenario.real_runs.filter(|n| runs < *n)?;
    Some(format!(
        "note: {} needs {needs} real runs to show its verdict ([expect] real_runs = {needs}: its fault bites in some \
         runs only); {runs} may miss it",
        scenario.name
    ))
}

/// What `run --real` prints: `run`'s lines, in runs, with the seeds instead of a repro line (a real
/// run does not replay).
pub fn real_summary(result: &ScenarioResult, runs: u64) -> String {
    let mut out = String::new();
    for line in summary(result, runs).lines() {
        // Hazards are marked by the simulated backends and world only: a real run has none to show.
        if line.starts_with("reproduce:") || line.starts_with("hazards:") {
            continue;
        }
        let seeds = text::count(runs, "seed", "seeds");
        let line = match line.split_once(&format!("): {seeds}, ")) {
            Some((head, tail)) => format!("{head}): {}, {tail}", text::count(runs, "real run", "real runs")),
            // No messages are counted on real servers.
            None if line.starts_with("measured:") => {
                let line = line.replace(" per seed;", " per run;").replace("(median over seeds)", "(median over runs)");
                line.split("; 0 messages per acquisition").collect()
            }
            None => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    let (start, end) = (result.seeds.start, result.seeds.end);
    out.push_str(&format!(
        "seeds {start}..{end} drew hold and think (real runs are not reproducible from their seed){}\n",
        result.example_seed.map_or(String::new(), |s| format!("; first unsafe run: seed {s}"))
    ));
    out
}
