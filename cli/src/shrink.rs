//! `locksim shrink`: the smallest written-out schedule that still gives a failing seed its finding.

use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::shrink::{shrink as shrink_seed, Shrunk};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The scenario file.
    scenario: PathBuf,
    /// The failing seed.
    #[arg(long)]
    seed: u64,
    /// The finding to keep (default: the seed's first violation), e.g. double-holder.
    #[arg(long)]
    finding: Option<String>,
    /// Where to write the shrunk scenario (default: <scenario>-seed-<seed>-shrunk.toml here).
    #[arg(short = 'o', long = "out")]
    out: Option<PathBuf>,
}

/// Shrink `seed` of the scenario at `path` and write the result to `out`; a line saying what it did.
pub fn shrink_to(
    path: &Path,
    registry: &locksim_locks::Registry,
    seed: u64,
    kind: Option<FindingKind>,
    out: &Path,
) -> anyhow::Result<(Shrunk, String)> {
    let scenario = super::load(path, registry)?;
    let shrunk = shrink_seed(&scenario, seed, kind)?;
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let toml = shrunk.to_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    std::fs::write(out, toml).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    let line = format!(
        "{} seed {seed}: {} shrunk to {}, still {} ({} runs); replay: {}",
        scenario.name,
        locksim_reports::text::count(shrunk.faults_before as u64, "fault", "faults"),
        shrunk.scenario.schedule.len(),
        shrunk.kind.name(),
        shrunk.tries,
        locksim_reports::text::repro_line(&out.display().to_string(), seed)
    );
    Ok((shrunk, line))
}

pub fn shrink(args: Args, registry: &locksim_locks::Registry) -> anyhow::Result<ExitCode> {
    let kind = match &args.finding {
        Some(name) => Some(FindingKind::parse(name).ok_or_else(|| {
            let known: Vec<&str> = FindingKind::ALL.iter().map(|k| k.name()).collect();
            anyhow::anyhow!("--finding: unknown finding kind {name:?}; expected one of: {}", known.join(", "))
        })?),
        None => None,
    };
    let stem = args.scenario.file_stem().map_or("scenario".into(), |s| s.to_string_lossy().into_owned());
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("{stem}-seed-{}-shrunk.toml", args.seed)));
    super::check_outputs([&Some(out.clone())], [])?;
    let (shrunk, line) = shrink_to(&args.scenario, registry, args.seed, kind, &out)?;
    let mut text = format!("{line}\nfaults left:\n");
    for f in &shrunk.scenario.schedule {
        text.push_str(&format!("  {}\n", locksim_scenarios::run::describe(f)));
    }
    super::emit(&text)?;
    Ok(ExitCode::SUCCESS)
}
