//! The comparison report: `index.html` (self-contained, charts inline) and `report.md` (for CI
//! summaries; charts as SVG files beside it), from a set of results.

use crate::charts;
use crate::results::ResultsFile;
use crate::text::{escape_markdown, escape_xml as escape, example_line, kinds_summary as findings};
use locksim_scenarios::sweep::ScenarioResult;
use std::fmt::Write;
use std::path::Path;

/// The charts of a report, by file name and title.
pub fn charts(runs: &[ScenarioResult]) -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("safety-matrix.svg", "Safety matrix", charts::safety_matrix(runs)),
        ("herd.svg", "Herd curve", charts::herd_curve(runs)),
        ("flash-sale.svg", "Flash sale", charts::flash_sale(runs)),
        ("latency.svg", "Latency", charts::latency(runs)),
        ("throughput.svg", "Throughput", charts::throughput(runs)),
        ("messages.svg", "Messages and notifications", charts::messages(runs)),
    ]
}

/// A scenario run for real, beside its simulated runs (of its `[model]`, or of the same baseline).
struct SimAndReal<'a> {
    real: &'a ScenarioResult,
    simulated: Vec<&'a ScenarioResult>,
}

/// Every real run, with the simulated runs of the same scenario file and name.
fn sim_and_real(runs: &[ScenarioResult]) -> Vec<SimAndReal<'_>> {
    let same = |a: &ScenarioResult, b: &ScenarioResult| a.path == b.path && a.scenario == b.scenario;
    runs.iter()
        .filter(|r| r.real)
        .map(|real| SimAndReal { real, simulated: runs.iter().filter(|r| !r.real && same(r, real)).collect() })
        .collect()
}

/// `unsafe/total (rate%) noun`, e.g. `16/200 (8.0%) seeds`.
fn rate(run: &ScenarioResult, noun: &str) -> String {
    let total = run.seeds.end - run.seeds.start;
    let pct = if total == 0 { 0.0 } else { 100.0 * run.unsafe_seeds as f64 / total as f64 };
    format!("{}/{total} ({pct:.1}%) {noun} unsafe", run.unsafe_seeds)
}

/// The rows of the simulated-and-real table: scenario, simulated (recipe: rate), real (recipe: rate).
fn sim_and_real_rows(runs: &[ScenarioResult]) -> Vec<[String; 3]> {
    sim_and_real(runs)
        .into_iter()
        .map(|p| {
            let sim: Vec<String> = p.simulated.iter().map(|r| format!("{}: {}", r.recipe, rate(r, "seeds"))).collect();
            let sim = if sim.is_empty() { "not simulated in these results".to_string() } else { sim.join("; ") };
            [p.real.scenario.clone(), sim, format!("{}: {}", p.real.recipe, rate(p.real, "runs"))]
        })
        .collect()
}

const SIM_AND_REAL: &str = "The same scenario simulated (its `[model]`, or the same baseline) and run on real servers \
                            with the real library (`run --real`).";

fn verdict(run: &ScenarioResult) -> &'static str {
    if run.as_expected {
        "as expected"
    } else {
        "NOT as expected"
    }
}

/// `report.md`.
pub fn markdown(results: &ResultsFile, charts: &[(&str, &str, String)]) -> String {
    let runs = &results.runs;
    let wrong = runs.iter().filter(|r| !r.as_expected).count();
    let seeds: usize = runs.iter().map(|r| r.results.len()).sum();
    let md_ = escape_markdown;
    let mut md = format!("# locksim report: {}\n\n", md_(&results.name));
    let _ = writeln!(md, "{} runs, {seeds} seeds: {} as expected, {wrong} not.\n", runs.len(), runs.len() - wrong);
    let pairs = sim_and_real_rows(runs);
    if !pairs.is_empty() {
        let _ = writeln!(
            md,
            "## Simulated and real\n\n{SIM_AND_REAL}\n\n| scenario | simulated | real |\n| --- | --- | --- |"
        );
        for row in &pairs {
            let _ = writeln!(md, "| {} | {} | {} |", md_(&row[0]), md_(&row[1]), md_(&row[2]));
        }
        md.push('\n');
    }
    for (file, title, _) in charts {
        let _ = writeln!(md, "## {title}\n\n![{title}]({file})\n");
    }
    md.push_str("## Runs\n\n| scenario | recipe | faults | seeds | unsafe | findings | verdict |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for run in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}..{} | {} | {} | {} |",
            md_(&run.scenario),
            md_(&run.recipe),
            md_(&charts::fault_label(run)),
            run.seeds.start,
            run.seeds.end,
            run.unsafe_seeds,
            md_(&findings(run)),
            verdict(run)
        );
    }
    let failing: Vec<&ScenarioResult> = runs.iter().filter(|r| !r.as_expected).collect();
    if !failing.is_empty() {
        md.push_str("\n## Not as expected\n\n");
        for run in failing {
            let _ = writeln!(md, "- **{}**: {}", md_(&run.scenario), md_(&run.reasons.join("; ")));
            if let Some(line) = example_line(run) {
                let _ = writeln!(md, "  `{}`", line.replace('`', "'"));
            }
        }
    }
    md
}

/// `index.html`: one page, no outside resources.
pub fn html(results: &ResultsFile, charts: &[(&str, &str, String)]) -> String {
    let runs = &results.runs;
    let wrong = runs.iter().filter(|r| !r.as_expected).count();
    let seeds: usize = runs.iter().map(|r| r.results.len()).sum();
    let mut page = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>locksim report</title>\n<style>\
         body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}\
         section{margin-bottom:2.5em}svg{max-width:100%;height:auto;border:1px solid #ddd}\
         table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}\
         tr.bad td{background:#fde0e0}code{font-size:12px}</style></head><body>\n",
    );
    let _ = writeln!(page, "<h1>locksim report: {}</h1>", escape(&results.name));
    let _ =
        writeln!(page, "<p>{} runs, {seeds} seeds: {} as expected, {wrong} not.</p>", runs.len(), runs.len() - wrong);
    let pairs = sim_and_real_rows(runs);
    if !pairs.is_empty() {
        let _ = writeln!(
            page,
            "<section><h2>Simulated and real</h2><p>{}</p><table><tr><th>scenario</th><th>simulated</th><th>real</th></tr>",
            escape(&SIM_AND_REAL.replace('`', ""))
        );
        for row in &pairs {
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&row[0]),
                escape(&row[1]),
                escape(&row[2])
            );
        }
        page.push_str("</table></section>\n");
    }
    for (_, title, svg) in charts {
        let body = svg.trim_start_matches(|c| c != '<');
        let _ = writeln!(page, "<section><h2>{title}</h2>\n{body}</section>");
    }
    page.push_str(
        "<section><h2>Runs</h2><table><tr><th>scenario</th><th>recipe</th><th>faults</th><th>seeds</th>\
                   <th>unsafe</th><th>findings</th><th>verdict</th><th>reproduce</th></tr>\n",
    );
    for run in runs {
        let repro = example_line(run).unwrap_or_default();
        let _ = writeln!(
            page,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}..{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            if run.as_expected { "" } else { " class=\"bad\"" },
            escape(&run.scenario),
            escape(&run.recipe),
            escape(&charts::fault_label(run)),
            run.seeds.start,
            run.seeds.end,
            run.unsafe_seeds,
            escape(&findings(run)),
            verdict(run),
            escape(&repro)
        );
    }
    page.push_str("</table></section></body></html>\n");
    page
}

/// Write the report into `dir`.
pub fn write(results: &ResultsFile, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let charts = charts(&results.runs);
    let put = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    };
    for (file, _, svg) in &charts {
        put(file, svg)?;
    }
    put("report.md", &markdown(results, &charts))?;
    put("index.html", &html(results, &charts))
}
