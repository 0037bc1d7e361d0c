//! `locksim repro`: replay one seed exactly and show what happened.

use locksim_reports::text;
use locksim_scenarios::run::run_seed;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The scenario file.
    scenario: PathBuf,
    /// The seed to replay.
    #[arg(long)]
    seed: u64,
    /// Print every event of the history, one per line.
    #[arg(long)]
    trace: bool,
    /// Write the history as JSON lines to this file.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Draw the seed as an SVG timeline: a lane per client (waiting, holding, paused, cut off, down),
    /// each grant's lease, the overlap of two holders and any stale write.
    #[arg(long)]
    timeline: Option<PathBuf>,
}

/// How long a grant of this recipe stays valid without renewal, if its lock expires by itself.
fn lease(scenario: &locksim_scenarios::Scenario) -> Option<std::time::Duration> {
    let renewed = ["redis.watchdog"];
    let expires = scenario.recipe.family.name == "redis" && !renewed.contains(&scenario.recipe.id);
    scenario
        .recipe
        .params
        .iter()
        .any(|p| p.name == "ttl")
        .then(|| scenario.recipe_params.duration("ttl"))
        .filter(|_| expires)
}

pub fn repro(args: Args, registry: &locksim_locks::Registry) -> anyhow::Result<ExitCode> {
    let scenario = super::load(&args.scenario, registry)?;
    super::check_outputs([&args.timeline, &args.history], [])?;
    let run = run_seed(&scenario, args.seed)?;
    let r = &run.result;
    let mut out = format!("{} ({}) seed {}: {:?}\nfaults:\n", scenario.name, scenario.recipe.id, r.seed, r.verdict);
    if r.schedule.is_empty() {
        out.push_str("  none\n");
    }
    for f in &r.schedule {
        out.push_str(&format!("  {f}\n"));
    }
    out.push_str("findings:\n");
    if r.findings.is_empty() {
        out.push_str("  none\n");
    }
    for f in &r.findings {
        out.push_str(&format!("  {}\n", text::finding(f)));
    }
    let hidden: u64 = r.counts.values().sum::<u64>() - r.findings.len() as u64;
    if hidden > 0 {
        out.push_str(&format!("  (and {hidden} more of the same kinds)\n"));
    }
    out.push_str(&format!("measurements: {}\n", text::measurements(r)));
    out.push_str(&format!("history: {} events, hash {}\n", run.history.events.len(), r.history_hash));
    if args.trace {
        out.push_str(&text::trace(&run.history));
    }
    super::emit(&out)?;
    if let Some(path) = &args.timeline {
        let title = format!("{} seed {}: {:?}", scenario.name, r.seed, r.verdict);
        let svg = locksim_reports::timeline::timeline(&title, &run.history, &r.findings, lease(&scenario));
        std::fs::write(path, svg).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.history {
        std::fs::write(path, run.history.to_jsonl()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
