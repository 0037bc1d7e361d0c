//! `locksim report`: merge results files and write the comparison report.

use locksim_reports::results::ResultsFile;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Results files from `run --json` or `suite --json`; shards of one sweep are merged.
    #[arg(required = true)]
    results: Vec<PathBuf>,
    /// The directory to write index.html, report.md and the SVG charts into.
    #[arg(long)]
    out: PathBuf,
}

pub fn report(args: Args) -> anyhow::Result<ExitCode> {
    super::check_outputs([], [args.out.as_path()])?;
    let files = args.results.iter().map(|p| ResultsFile::read(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let merged = match ResultsFile::merge(files) {
        Ok(merged) => merged,
        Err(why) => {
            eprintln!("locksim: {why}; no report written");
            return Ok(ExitCode::from(1));
        }
    };
    locksim_reports::report::write(&merged, &args.out)?;
    let wrong: Vec<&str> = merged.runs.iter().filter(|r| !r.as_expected).map(|r| r.scenario.as_str()).collect();
    let mut said = format!(
        "{} merged from {}: {} as expected, {} not\nwrote {} and {}\n",
        locksim_reports::text::count(merged.runs.len() as u64, "run", "runs"),
        locksim_reports::text::count(args.results.len() as u64, "file", "files"),
        merged.runs.len() - wrong.len(),
        wrong.len(),
        args.out.join("index.html").display(),
        args.out.join("report.md").display()
    );
    for name in &wrong {
        said.push_str(&format!("  not as expected: {name}\n"));
    }
    super::emit(&said)?;
    Ok(if wrong.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
