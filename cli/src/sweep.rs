//! `locksim sweep`: one key of a scenario varied over a grid of values, the same seeds run at each, and
//! where the lock breaks — the unsafe rate at each value with its 95% interval.

use locksim_locks::Registry;
use locksim_reports::text;
use locksim_scenarios::rate::Rate;
use locksim_scenarios::run::HarnessError;
use locksim_scenarios::sweep::{sweep_each, ScenarioResult};
use locksim_scenarios::vary::{breaking_point, BreakingPoint, Value, Vary};
use locksim_scenarios::Scenario;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    locksim sweep scenarios/catalog/redis-del-gc-pause.toml --vary faults.schedule.0.duration=1s..10s/1s --seeds 0..100\n  \
    locksim sweep scenarios/catalog/redis-del-gc-pause.toml --vary recipe.ttl=1s..12s/1s --out target/sweep\n  \
    locksim sweep scenarios/catalog/zk-ephemeral-herd.toml --vary workload.clients=2..16/2\n\n\
    Exit codes: 0 done (violations are results, not failures), 2 bad input or a harness error.")]
pub struct Args {
    /// The scenario file (see `locksim list scenarios`).
    scenario: PathBuf,
    /// The key to vary and its values, KEY=FROM..TO/STEP (TO included). KEY is written as in the file,
    /// its tables and array entries joined by dots: `recipe.ttl`, `recipe.session_timeout`,
    /// `workload.clients`, `faults.schedule.0.duration` (the first [[faults.schedule]]),
    /// `faults.schedule.0.delta` (a clock jump), `faults.random.every`. Its tables must be in the file;
    /// the key itself may be left out (the recipe's default). Values are durations (`1s..10s/1s`) or
    /// integers (`2..16/2`), as the key is; each value's scenario is checked as a file is.
    #[arg(long)]
    vary: String,
    /// Seeds run at each value: `A..B` (B exclusive) or one seed.
    #[arg(long, default_value = "0..100", value_parser = super::parse_seeds)]
    seeds: Range<u64>,
    /// Seeds run at once (default: the number of cores). Results do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    jobs: Option<u16>,
    /// Run only part `i` of `n` of the seeds at each value, e.g. `--shard 2/4`: the table then counts
    /// only this part's seeds. Give each part its own `--out`, then `--merge` them.
    #[arg(long, value_parser = super::parse_shard)]
    shard: Option<(u64, u64)>,
    /// Write the chart (sweep.svg: the unsafe rate against the value, its interval as a band), the
    /// table (sweep.md, sweep.json) and every seed's result (points.json, for `--merge`) into this
    /// directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run nothing: merge the `--out` directories of earlier sweeps of this file and `--vary` (the
    /// shards of one sweep, or runs of adjoining seeds) into one table, chart and breaking point.
    /// Refused when they are of another file, key or values, or leave seeds out.
    #[arg(long, num_args = 1.., value_name = "DIR", conflicts_with_all = ["seeds", "shard", "jobs"])]
    merge: Vec<PathBuf>,
}

/// The result at one value of the key.
struct Point {
    value: Value,
    result: ScenarioResult,
}

pub fn sweep(args: Args, registry: &Registry) -> anyhow::Result<ExitCode> {
    let shown = args.scenario.display().to_string();
    let text = std::fs::read_to_string(&args.scenario).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let vary = Vary::parse(&args.vary).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    // Every value is checked before a seed runs: a value found bad halfway would waste the sweep.
    let scenarios: Vec<Scenario> = vary
        .values
        .iter()
        .map(|v| vary.scenario(&shown, &text, *v, registry))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    if scenarios[0].only_real() {
        anyhow::bail!("{shown}: {}", locksim_locks::command::ONLY_REAL);
    }
    if let Some(dir) = &args.out {
        super::new_or_existing_dir(dir)?;
    }
    if !args.merge.is_empty() {
        let points = merge(&shown, &scenarios[0], &vary, &args.merge)?;
        return finish(&args, &scenarios[0], &vary.key, points);
    }
    let range = super::shard(args.seeds.clone(), args.shard);
    if let Some(note) = super::empty_shard(&args.seeds, args.shard).filter(|_| range.is_empty()) {
        super::emit(&note)?;
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = super::jobs(args.jobs);
    let seeds = range.end - range.start;
    // Drawn only on a terminal: indicatif hides itself when stderr is not one (CI logs stay clean).
    let bar = indicatif::ProgressBar::new(seeds * scenarios.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta} {msg}")
            .expect("valid template"),
    );
    let started = Instant::now();
    let mut points = Vec::new();
    for (value, scenario) in vary.values.iter().zip(&scenarios) {
        bar.set_message(format!("{} = {value}", vary.key));
        // Every seed's result is kept only for points.json, which only --out writes.
        let mut kept = Vec::new();
        let keep = |seed| {
            if args.out.is_some() {
                kept.push(seed);
            }
            Ok::<(), HarnessError>(())
        };
        let mut result = sweep_each(scenario, range.clone(), jobs, &|| bar.inc(1), keep)?;
        result.results = kept;
        result.shard = super::shard_record(&args.seeds, args.shard);
        points.push(Point { value: *value, result });
    }
    bar.finish_and_clear();
    finish(&args, &scenarios[0], &vary.key, points)?;
    eprintln!("{} seeds in {:.1} s on {jobs} jobs", seeds * vary.values.len() as u64, started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

/// Print the table and the breaking point; with `--out`, write them out with the chart and the points.
fn finish(args: &Args, scenario: &Scenario, key: &str, points: Vec<Point>) -> anyhow::Result<ExitCode> {
    let rates: Vec<(Value, Rate)> = points.iter().map(|p| (p.value, p.result.unsafe_rate)).collect();
    let breaking = breaking_point(&rates);
    let seeds = &points[0].result.seeds;
    let part = points[0].result.shard.as_ref().map_or(String::new(), |s| format!(" (shard {}/{})", s.index, s.count));
    let head = format!("{} ({}), seeds {}..{}{part}", scenario.name, scenario.recipe.id, seeds.start, seeds.end);
    super::emit(&table(&head, key, &points, &breaking))?;
    if let Some(dir) = &args.out {
        write_out(dir, &head, key, &points, &breaking)?;
        super::emit(&format!("wrote {}\n", dir.join("sweep.svg").display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What `--out` writes to points.json: every value's result with its seeds', for `--merge`.
#[derive(serde::Serialize, serde::Deserialize)]
struct PointsFile {
    path: String,
    key: String,
    points: Vec<PointFile>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PointFile {
    value: String,
    result: ScenarioResult,
}

/// `--merge`: the points of earlier sweeps' `--out` directories, merged value by value (their seeds
/// judged again as one sweep, as `report` merges a suite's shards).
fn merge(shown: &str, scenario: &Scenario, vary: &Vary, dirs: &[PathBuf]) -> anyhow::Result<Vec<Point>> {
    let values: Vec<String> = vary.values.iter().map(ToString::to_string).collect();
    let mut parts: Vec<Vec<ScenarioResult>> = vec![Vec::new(); values.len()];
    for dir in dirs {
        let path = dir.join("points.json");
        let at = path.display();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{at}: {e} (give the --out directory of a sweep run with this version)"))?;
        let file: PointsFile = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        let name = file.points.first().map_or("", |p| p.result.scenario.as_str());
        if name != scenario.name || file.key != vary.key {
            anyhow::bail!(
                "{at}: a sweep of `{name}` by {}, not of {shown} (`{}`) by {}",
                file.key,
                scenario.name,
                vary.key
            );
        }
        let theirs: Vec<&str> = file.points.iter().map(|p| p.value.as_str()).collect();
        if theirs != values {
            anyhow::bail!("{at}: its values are {}, not --vary's {}", theirs.join(", "), values.join(", "));
        }
        for (i, p) in file.points.into_iter().enumerate() {
            parts[i].push(p.result);
        }
    }
    let mut points = Vec::new();
    for ((value, parts), shown_value) in vary.values.iter().zip(parts).zip(&values) {
        let result =
            locksim_scenarios::sweep::merge(parts).map_err(|e| anyhow::anyhow!("{} = {shown_value}: {e}", vary.key))?;
        points.push(Point { value: *value, result });
    }
    Ok(points)
}

/// The printed table: a row per value, then the breaking point.
fn table(head: &str, key: &str, points: &[Point], breaking: &BreakingPoint) -> String {
    let width = points.iter().map(|p| p.value.to_string().len()).chain([key.len()]).max().unwrap_or(0);
    let mut out = format!("{head}: seeds unsafe by {key}\n{key:<width$}  unsafe seeds\n");
    for p in points {
        let kinds = text::kinds_summary(&p.result);
        let kinds = if kinds.is_empty() { String::new() } else { format!(" — {kinds}") };
        out.push_str(&format!("{:<width$}  {}{kinds}\n", p.value.to_string(), p.result.unsafe_rate));
    }
    out.push_str(&verdict(key, breaking));
    out.push('\n');
    out
}

/// The breaking point in words.
fn verdict(key: &str, breaking: &BreakingPoint) -> String {
    let safe = match breaking.safe_to {
        Some(value) if breaking.rising => format!("no violation up to {key} = {value}"),
        Some(value) => format!("no violation from {key} = {value} up"),
        None => format!("a violation at every value of {key}"),
    };
    match breaking.breaks_at {
        Some((value, rate)) => format!("{safe}; breaks at {value}: {rate} unsafe"),
        None => format!("{safe} (the last value): no breaking point in this range"),
    }
}

/// `--out`: the chart, and the table as Markdown and JSON.
fn write_out(
    dir: &std::path::Path,
    head: &str,
    key: &str,
    points: &[Point],
    breaking: &BreakingPoint,
) -> anyhow::Result<()> {
    let write = |name: &str, content: String| {
        let path = dir.join(name);
        std::fs::write(&path, content).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    };
    let rates: Vec<(Value, Rate)> = points.iter().map(|p| (p.value, p.result.unsafe_rate)).collect();
    write("sweep.svg", locksim_reports::sweep_chart::chart(head, key, &rates, breaking))?;
    let mut md = format!(
        "# {}\n\n| {} | unsafe seeds | findings |\n| --- | --- | --- |\n",
        text::escape_markdown(head),
        text::escape_markdown(key)
    );
    for p in points {
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            p.value,
            text::escape_markdown(&p.result.unsafe_rate.to_string()),
            text::escape_markdown(&text::kinds_summary(&p.result))
        ));
    }
    md.push_str(&format!(
        "\n{}\n\n![unsafe rate against {key}](sweep.svg)\n",
        text::escape_markdown(&verdict(key, breaking))
    ));
    write("sweep.md", md)?;
    let json = serde_json::json!({
        "scenario": points[0].result.scenario,
        "path": points[0].result.path,
        "recipe": points[0].result.recipe,
        "key": key,
        "seeds": points[0].result.seeds,
        "points": points.iter().map(|p| serde_json::json!({
            "value": p.value.to_string(),
            "unsafe_rate": p.result.unsafe_rate,
            "rate_with": p.result.rate_with,
            "example_seed": p.result.example_seed,
        })).collect::<Vec<_>>(),
        // Rising: violations above `breaks_at`, none up to `safe_to`; falling: the other way round.
        "rising": breaking.rising,
        "safe_to": breaking.safe_to.map(|v| v.to_string()),
        "breaks_at": breaking.breaks_at.map(|(v, _)| v.to_string()),
    });
    write("sweep.json", serde_json::to_string_pretty(&json)? + "\n")?;
    let file = PointsFile {
        path: points[0].result.path.clone(),
        key: key.to_string(),
        points: points.iter().map(|p| PointFile { value: p.value.to_string(), result: p.result.clone() }).collect(),
    };
    write("points.json", serde_json::to_string(&file)? + "\n")
}
