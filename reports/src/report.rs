//! The comparison report: `index.html` (self-contained, charts inline) and `report.md` (for CI
//! summaries; charts as SVG files beside it), from a set of results.

use crate::charts;
use crate::decide::{self, fault_label, lock_name, Row};
use crate::results::ResultsFile;
use crate::text::{escape_markdown, escape_xml as escape, example_line, kinds_summary as findings};
use locksim_scenarios::rate::Rate;
use locksim_scenarios::reason;
use locksim_scenarios::sweep::ScenarioResult;
use locksim_sim::hazard::{add_counts, HazardCounts};
use std::collections::BTreeMap;
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

/// Unsafe seeds (or runs) as a rate with its interval: `16/200 (8.0%, 95% CI 5.0–12.6%) seeds unsafe`.
fn rate(run: &ScenarioResult, noun: &str) -> String {
    format!("{} {noun} unsafe", unsafe_rate(run))
}

fn unsafe_rate(run: &ScenarioResult) -> Rate {
    Rate::of(run.unsafe_seeds, run.seeds.end - run.seeds.start)
}

const HAZARDS: &str = "Which hazards each lock variant's simulated seeds reached (a lease that expired under its \
holder, a lost release reply, ...), in how many seeds of how many: a fault that never bit proves nothing. \
`locksim list hazards` explains each.";

/// The hazard coverage rows: one per simulated lock variant, in name order — its seeds, and each hazard
/// its seeds reached with how many of them did (`none` when none).
fn hazard_rows(runs: &[ScenarioResult]) -> Vec<[String; 3]> {
    let mut by_lock: BTreeMap<String, (u64, HazardCounts)> = BTreeMap::new();
    for run in runs.iter().filter(|r| !r.real) {
        let (seeds, reached) = by_lock.entry(lock_name(run)).or_default();
        *seeds += run.seeds.end - run.seeds.start;
        add_counts(reached, &run.seeds_with_hazard);
    }
    by_lock
        .into_iter()
        .map(|(lock, (seeds, reached))| {
            let each: Vec<String> = reached.iter().map(|(h, n)| format!("{h} in {n}")).collect();
            [lock, seeds.to_string(), if each.is_empty() { "none".into() } else { each.join(", ") }]
        })
        .collect()
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

const DECISION_HEADS: [&str; 8] = [
    "lock (recipe: what differs from its defaults)",
    "worst violation: seeds in which the lock broke, under",
    "herd: woken per release, of waiters",
    "holder crash to next grant: median",
    "latency p50 / p99",
    "attempts granted",
    "throughput",
    "verdict",
];

/// A cell with nothing measured: the variant never ran what the column needs.
const NOT_RUN: &str = "–";

const DECISION: &str = "One row per lock variant, simulated. Worst violation: the faults under which the most seeds \
                        broke the lock (95% interval; with no violation, the weakest bound), counting only seeds whose fault \
                        fired or whose lock broke anyway: \"safe under\" a fault means under one that happened. Herd, latency, attempts granted and \
                        throughput: without faults, the herd at the most clients run, the rest from a flash sale \
                        where the variant ran one, else its counter. –: not run. Click a heading to sort.";

/// Simulated milliseconds as people read them.
fn ms(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

/// A decision-table row as cells: text, and the number it sorts by (`None`: nothing measured).
fn decision_cells(row: &Row) -> [(String, Option<f64>); 8] {
    let (faults, worst) = &row.worst;
    let speed = row.speed.as_ref();
    [
        (row.lock.clone(), None),
        match worst.n {
            // No seed's fault fired: nothing is known, which is not the same as nothing broke.
            0 => (format!("untested: no {faults} fault fired"), None),
            _ => (format!("{worst} under {faults}"), Some(worst.value() + worst.high / 1000.0)),
        },
        match row.herd {
            Some((woken, waiters)) => (format!("{woken:.1} of {waiters}"), Some(woken / waiters.max(1) as f64)),
            None => (NOT_RUN.into(), None),
        },
        match row.recovery {
            Some((_, _, never)) if never > 0 => (format!("{never} crashes never recovered"), Some(f64::MAX)),
            Some((median, max, _)) => (format!("{} (max {})", ms(median), ms(max)), Some(median)),
            None => (NOT_RUN.into(), None),
        },
        match speed {
            Some(s) => {
                let workload = if s.workload == "flash-sale" { String::new() } else { format!(" ({})", s.workload) };
                (format!("{} / {}{workload}", ms(s.latency_ms_p50), ms(s.latency_ms_p99)), Some(s.latency_ms_p50))
            }
            None => (NOT_RUN.into(), None),
        },
        match speed.and_then(|s| s.granted) {
            Some(g) => (g.to_string(), Some(g.value())),
            None => (NOT_RUN.into(), None),
        },
        match speed {
            Some(s) => (format!("{:.1}/s", s.per_second), Some(s.per_second)),
            None => (NOT_RUN.into(), None),
        },
        (row.verdict.clone(), None),
    ]
}

const SIM_AND_REAL: &str = "The same scenario simulated (its `[model]`, or the same baseline) and run on real servers \
                            with the real library (`run --real`).";

/// The fault coverage cell: `37/200 seeds`, `all 200 seeds`, or a dash for a run without faults (or
/// results written before coverage was counted).
fn fired_in(run: &ScenarioResult) -> String {
    match run.fault_coverage {
        Some(c) if c.complete() => format!("all {} seeds", c.seeds),
        Some(c) => format!("{}/{} seeds", c.seeds_fired, c.seeds),
        None => NOT_RUN.into(),
    }
}

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
    let _ =
        writeln!(md, "## Decision table\n\n{DECISION}\n\n| {} |\n|{}", DECISION_HEADS.join(" | "), " --- |".repeat(8));
    for row in decide::rows(runs) {
        let cells: Vec<String> = decision_cells(&row).iter().map(|(text, _)| md_(text)).collect();
        let _ = writeln!(md, "| {} |", cells.join(" | "));
    }
    md.push('\n');
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
    let _ = writeln!(
        md,
        "## Hazard coverage\n\n{HAZARDS}\n\n| lock | seeds | hazards reached (seeds) |\n| --- | --- | --- |"
    );
    for row in hazard_rows(runs) {
        let _ = writeln!(md, "| {} | {} | {} |", md_(&row[0]), row[1], md_(&row[2]));
    }
    md.push('\n');
    md.push_str("## Runs\n\n| scenario | lock | faults | seeds | faults fired in | unsafe | findings | verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for run in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}..{} | {} | {} | {} | {} |",
            md_(&run.scenario),
            md_(&lock_name(run)),
            md_(&fault_label(run)),
            run.seeds.start,
            run.seeds.end,
            fired_in(run),
            md_(&unsafe_rate(run).to_string()),
            md_(&findings(run)),
            verdict(run)
        );
    }
    let failing: Vec<&ScenarioResult> = runs.iter().filter(|r| !r.as_expected).collect();
    if !failing.is_empty() {
        md.push_str("\n## Not as expected\n\n");
        for run in failing {
            let _ = writeln!(md, "- **{}**: {}", md_(&run.scenario), md_(&reason::join(&run.reasons, "; ")));
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
         body{font-family:sans-serif;margin:1.5em;max-width:1360px;color:#222}\
         section{margin-bottom:2.5em}svg{max-width:100%;height:auto;border:1px solid #ddd}\
         table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}\
         tr.bad td{background:#fde0e0}code{font-size:12px}\
         table.decide{font-size:12px}table.decide td{padding:2px 6px}table.decide th{cursor:pointer;background:#f4f4f4}td.unsafe{background:#f6c7c7}td.service{background:#fde6bf}\
         td.safe{background:#d5efdc}</style></head><body>\n",
    );
    let _ = writeln!(page, "<h1>locksim report: {}</h1>", escape(&results.name));
    let _ =
        writeln!(page, "<p>{} runs, {seeds} seeds: {} as expected, {wrong} not.</p>", runs.len(), runs.len() - wrong);
    page.push_str(&decision_html(runs));
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
    let _ = writeln!(
        page,
        "<section><h2>Hazard coverage</h2><p>{}</p><table><tr><th>lock</th><th>seeds</th><th>hazards reached (seeds)</th></tr>",
        escape(&HAZARDS.replace('`', ""))
    );
    for row in hazard_rows(runs) {
        let _ = writeln!(page, "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", escape(&row[0]), row[1], escape(&row[2]));
    }
    page.push_str("</table></section>\n");
    page.push_str(
        "<section><h2>Runs</h2><table><tr><th>scenario</th><th>lock</th><th>faults</th><th>seeds</th>\
                   <th>faults fired in</th><th>unsafe</th><th>findings</th><th>verdict</th><th>reproduce</th></tr>\n",
    );
    for run in runs {
        let repro = example_line(run).unwrap_or_default();
        let _ = writeln!(
            page,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}..{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            if run.as_expected { "" } else { " class=\"bad\"" },
            escape(&run.scenario),
            escape(&lock_name(run)),
            escape(&fault_label(run)),
            run.seeds.start,
            run.seeds.end,
            fired_in(run),
            escape(&unsafe_rate(run).to_string()),
            escape(&findings(run)),
            verdict(run),
            escape(&repro)
        );
    }
    page.push_str("</table></section>\n");
    page.push_str(SORT_SCRIPT);
    page.push_str("</body></html>\n");
    page
}

/// Sorts a `table.decide` by the clicked column: by each cell's `data-v` number where it has one (cells
/// without a measurement last), else by text; a second click reverses.
const SORT_SCRIPT: &str = "<script>\
document.querySelectorAll('table.decide th').forEach((th,i)=>th.addEventListener('click',()=>{\
const body=th.closest('table').tBodies[0],up=th.dataset.up!=='1';th.dataset.up=up?'1':'0';\
const key=r=>{const c=r.cells[i];return c.dataset.v===undefined?c.textContent:(c.dataset.v===''?null:+c.dataset.v)};\
[...body.rows].sort((a,b)=>{const x=key(a),y=key(b);if(x===null||y===null)return (x===null)-(y===null);\
return (typeof x==='number'?x-y:String(x).localeCompare(y))*(up?1:-1)}).forEach(r=>body.appendChild(r))}));\
</script>\n";

/// The decision table as HTML, its verdicts coloured: red when the lock broke, amber when it held but
/// served badly, green otherwise.
fn decision_html(runs: &[ScenarioResult]) -> String {
    let mut html =
        format!("<section><h2>Decision table</h2><p>{}</p><table class=\"decide\"><thead><tr>", escape(DECISION));
    for head in DECISION_HEADS {
        let _ = write!(html, "<th>{}</th>", escape(head));
    }
    html.push_str("</tr></thead><tbody>\n");
    for row in decide::rows(runs) {
        let class = match (row.broke_under.is_empty(), row.service.is_empty()) {
            (false, _) => "unsafe",
            (true, false) => "service",
            (true, true) => "safe",
        };
        html.push_str("<tr>");
        for (i, (text, key)) in decision_cells(&row).iter().enumerate() {
            let v = match (i, key) {
                (0 | 7, _) => String::new(),
                (_, Some(k)) => format!(" data-v=\"{k}\""),
                (_, None) => " data-v=\"\"".into(),
            };
            let class = if i == 7 { format!(" class=\"{class}\"") } else { String::new() };
            let _ = write!(html, "<td{v}{class}>{}</td>", escape(text));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody></table></section>\n");
    html
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::run;
    use locksim_scenarios::checkers::FindingKind;

    #[test]
    fn hazard_coverage_lists_each_variant_with_the_seeds_that_reached_each_hazard() {
        use locksim_sim::hazard::Hazard;
        let mut a = run("release=del", &["pause"], 16, 20, FindingKind::DoubleHolder);
        a.seeds_with_hazard = [(Hazard::LeaseExpiredWhileHeld, 18), (Hazard::StaleHolderResumed, 17)].into();
        let mut b = run("release=del", &["partition"], 0, 10, FindingKind::DoubleHolder);
        b.seeds_with_hazard = [(Hazard::LeaseExpiredWhileHeld, 2)].into();
        let c = run("fencing", &["pause"], 0, 5, FindingKind::DoubleHolder);
        let results = ResultsFile { name: "t".into(), runs: vec![a, b, c] };
        let md = markdown(&results, &[]);
        let want =
            "| redis.set-nx-px \\(release=del\\) | 30 | lease-expired-while-held in 20, stale-holder-resumed in 17 |";
        assert!(md.contains("## Hazard coverage") && md.contains(want), "{md}");
        assert!(md.contains("| redis.set-nx-px \\(fencing\\) | 5 | none |"), "{md}");
        let page = html(&results, &[]);
        assert!(page.contains("<h2>Hazard coverage</h2>") && page.contains("<td>30</td>"), "{page}");
    }

    #[test]
    fn the_page_opens_with_the_decision_table_sortable_by_its_numbers() {
        let results = ResultsFile {
            name: "t".into(),
            runs: vec![
                run("release=del", &["pause"], 16, 20, FindingKind::DoubleHolder),
                run("fencing", &["pause"], 20, 20, FindingKind::DoubleHolder),
            ],
        };
        let page = html(&results, &charts(&results.runs));
        let (table, matrix) = (page.find("<h2>Decision table</h2>").unwrap(), page.find("<h2>Safety matrix").unwrap());
        assert!(table < matrix, "the decision table comes first");
        assert!(page.contains("<td data-v=\"0.8"), "the worst violation sorts by its rate");
        assert!(page.contains("16/20 (80.0%, 95% CI 58.4–91.9%) under pause"), "with its interval");
        assert!(page.contains("<td class=\"unsafe\">unsafe under pauses; fence it (the fenced variant holds)</td>"));
        assert!(page.contains("<script>") && !page.contains("src="), "sorting inline, no outside resources");
        let md = markdown(&results, &charts(&results.runs));
        assert!(md.contains("| redis.set-nx-px \\(fencing\\) | 0/20 \\(rate &lt; 13.9%\\) under pause |"), "{md}");
    }
}
