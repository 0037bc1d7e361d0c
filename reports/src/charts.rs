//! The report's charts, as SVG text drawn with plotters.
//!
//! Every chart's rows are lock variants ([`decide::lock_name`]), never recipes: a broken variant and its
//! fix are never added up. The safety matrix reads every run; latency, throughput and message counts the
//! flash sales without faults — the same workload for every lock, so that they compare on equal terms;
//! the herd curve the fault-free counter runs of a variant at several client counts; the flash-sale chart
//! the flash sales under faults beside the same locks without.

use crate::decide::{self, broke, fault_label, is_service, lock_name};
use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::run::SeedResult;
use locksim_scenarios::sweep::ScenarioResult;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;

const FONT: &str = "sans-serif";
const SAFE: RGBColor = RGBColor(46, 139, 87);
const UNSAFE: RGBColor = RGBColor(200, 40, 40);
/// Service findings only (herd, unfairness, starvation): a working lock that serves badly.
const SERVICE: RGBColor = RGBColor(235, 140, 0);
const EMPTY: RGBColor = RGBColor(235, 235, 235);
/// One colour per line or bar series, in order.
const SERIES: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Pixels a label of `text` takes at 12 px (a sans-serif glyph is about 6.5 px wide on average).
fn text_px(text: &str) -> u32 {
    (text.chars().count() as u32 * 13).div_ceil(2)
}

fn svg(width: u32, height: u32, draw: impl FnOnce(&DrawingArea<SVGBackend, plotters::coord::Shift>)) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).expect("an SVG string can be drawn on");
        draw(&root);
        root.present().expect("an SVG string can be written");
    }
    out
}

/// A legend as a strip of swatches at `y`, where nothing else is drawn (plotters' own legend box sits
/// inside the plot, where it can hide bars or fall below the fold).
fn legend_strip(root: &DrawingArea<SVGBackend, plotters::coord::Shift>, y: i32, items: &[(&str, RGBColor)]) {
    let mut x = 10;
    for (label, colour) in items {
        root.draw(&Rectangle::new([(x, y), (x + 14, y + 12)], colour.filled())).expect("legend");
        root.draw_text(label, &TextStyle::from((FONT, 12)), (x + 18, y)).expect("legend");
        x += 34 + text_px(label) as i32;
    }
}

/// One cell of the safety matrix: a lock variant under one set of faults.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Cell {
    pub seeds: u64,
    /// Seeds whose lock broke ([`decide::broke`]).
    pub broken: u64,
    /// Seeds whose lock held but served badly: a herd, unfairness or starvation.
    pub service: u64,
    /// Seeds with each finding counted in the cell's colour.
    pub kinds: BTreeMap<FindingKind, u64>,
}

/// The matrix's cells by (lock variant, faults).
pub fn matrix_cells(runs: &[ScenarioResult]) -> BTreeMap<(String, String), Cell> {
    let mut cells: BTreeMap<(String, String), Cell> = BTreeMap::new();
    for run in runs {
        let cell = cells.entry((lock_name(run), fault_label(run))).or_default();
        for seed in &run.results {
            cell.seeds += 1;
            let counted: Vec<FindingKind> = if broke(run, seed) {
                cell.broken += 1;
                seed.counts.keys().copied().filter(|k| decide::breaks_the_lock(*k)).collect()
            } else {
                let service: Vec<FindingKind> = seed.counts.keys().copied().filter(|k| is_service(*k)).collect();
                cell.service += !service.is_empty() as u64;
                service
            };
            for kind in counted {
                *cell.kinds.entry(kind).or_default() += 1;
            }
        }
    }
    cells
}

/// Lock variant × faults: seeds whose lock broke / seeds. Red however few (a rare violation is the one a
/// reader must not miss), amber when the lock held but herded or was unfair, green when neither.
pub fn safety_matrix(runs: &[ScenarioResult]) -> String {
    let cells = matrix_cells(runs);
    let mut locks: Vec<&String> = cells.keys().map(|(r, _)| r).collect();
    locks.dedup();
    let mut faults: Vec<&String> = cells.keys().map(|(_, f)| f).collect();
    faults.sort();
    faults.dedup();
    let longest = faults.iter().map(|f| text_px(f)).max().unwrap_or(30);
    let label_w = 20 + locks.iter().flat_map(|l| two_lines(l)).map(|l| text_px(&l)).max().unwrap_or(100);
    let (cell_w, cell_h, head_h) = (84, 34, 80 + longest);
    let width = (label_w + cell_w * faults.len() as u32 + 20).max(900);
    let height = head_h + cell_h * locks.len() as u32 + 20;
    svg(width, height, |root| {
        let heading = "Safety matrix: seeds in which the lock broke / seeds, per lock variant and faults";
        root.draw_text(heading, &TextStyle::from((FONT, 18)), (10, 8)).expect("draw");
        legend_strip(
            root,
            36,
            &[
                ("lock broke (two holders, unsafe write, oversell, lost update, deadlock)", UNSAFE),
                ("held, but herd, unfair or starved", SERVICE),
                ("no finding", SAFE),
            ],
        );
        let note = "With fencing, two holders whose stale writes the resource refused count as held.";
        root.draw_text(note, &TextStyle::from((FONT, 12)), (10, 56)).expect("draw");
        for (j, fault) in faults.iter().enumerate() {
            let x = (label_w + cell_w * j as u32 + cell_w / 2) as i32;
            let style =
                TextStyle::from((FONT, 13)).transform(FontTransform::Rotate270).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw_text(fault, &style, (x, head_h as i32 - 6)).expect("draw");
        }
        for (i, lock) in locks.iter().enumerate() {
            let y = (head_h + cell_h * i as u32) as i32;
            let style = TextStyle::from((FONT, 13)).pos(Pos::new(HPos::Right, VPos::Center));
            let lines = two_lines(lock);
            for (k, line) in lines.iter().enumerate() {
                let dy = cell_h as i32 / 2 + (2 * k as i32 - lines.len() as i32 + 1) * 8;
                root.draw_text(line, &style, (label_w as i32 - 8, y + dy)).expect("draw");
            }
            for (j, fault) in faults.iter().enumerate() {
                let x = (label_w + cell_w * j as u32) as i32;
                let corners = [(x + 1, y + 1), (x + cell_w as i32 - 1, y + cell_h as i32 - 1)];
                match cells.get(&((*lock).clone(), (*fault).clone())) {
                    Some(cell) => draw_cell(root, cell, corners),
                    None => root.draw(&Rectangle::new(corners, EMPTY.filled())).expect("draw"),
                }
            }
        }
    })
}

/// A long lock name split after the comma nearest its middle, so that the matrix keeps its width.
fn two_lines(name: &str) -> Vec<String> {
    let half = name.len() / 2;
    match name.match_indices(", ").min_by_key(|(i, _)| i.abs_diff(half)) {
        Some((i, _)) if name.len() > 48 => vec![name[..i + 1].to_string(), name[i + 2..].to_string()],
        _ => vec![name.to_string()],
    }
}

fn draw_cell(
    root: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    cell: &Cell,
    [(x0, y0), (x1, y1)]: [(i32, i32); 2],
) {
    let (fill, shown) = match (cell.broken, cell.service) {
        (0, 0) => (SAFE, 0),
        (0, service) => (SERVICE, service),
        (broken, _) => (UNSAFE, broken),
    };
    root.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill.filled())).expect("draw");
    let centre = (x0 + x1) / 2;
    let count = TextStyle::from((FONT, 13).into_font().style(FontStyle::Bold))
        .color(&WHITE)
        .pos(Pos::new(HPos::Center, VPos::Center));
    let mut kinds: Vec<(&FindingKind, &u64)> = cell.kinds.iter().collect();
    kinds.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
    let Some((top, _)) = kinds.first() else {
        root.draw_text(&format!("{shown}/{}", cell.seeds), &count, (centre, (y0 + y1) / 2)).expect("draw");
        return;
    };
    root.draw_text(&format!("{shown}/{}", cell.seeds), &count, (centre, y0 + 10)).expect("draw");
    let more = if kinds.len() > 1 { format!(" +{}", kinds.len() - 1) } else { String::new() };
    let small = TextStyle::from((FONT, 10)).color(&WHITE).pos(Pos::new(HPos::Center, VPos::Center));
    root.draw_text(&format!("{}{more}", top.name()), &small, (centre, y1 - 8)).expect("draw");
}

/// Per-lock values from the flash sales without faults (the largest if a variant has several).
fn per_lock(runs: &[ScenarioResult], value: impl Fn(&ScenarioResult) -> f64) -> Vec<(String, f64)> {
    let mut best: BTreeMap<String, f64> = BTreeMap::new();
    for run in runs.iter().filter(|r| quiet_flash_sale(r)) {
        let v = value(run);
        let slot = best.entry(lock_name(run)).or_insert(v);
        *slot = slot.max(v);
    }
    best.into_iter().collect()
}

fn quiet_flash_sale(r: &ScenarioResult) -> bool {
    r.fault_kinds.is_empty() && r.workload == "flash-sale" && !r.results.is_empty() && !r.real
}

/// Horizontal bars, one group per row label and one bar per series, each bar with its value written at
/// its end (a zero is a visible "0", not an empty row); `note` is a line under the title.
fn bars(title: &str, note: &str, unit: &str, series: &[(&str, Vec<(String, f64)>)]) -> String {
    let mut rows: Vec<String> = Vec::new();
    for (_, values) in series {
        for (row, _) in values {
            if !rows.contains(row) {
                rows.push(row.clone());
            }
        }
    }
    let top = series.iter().flat_map(|(_, v)| v.iter().map(|(_, x)| *x)).fold(0.0, f64::max).max(1e-9) * 1.2;
    let group = series.len() as f64;
    let label_w = 20 + rows.iter().map(|r| text_px(r)).max().unwrap_or(100);
    let height = 110 + (16.0 * group + 8.0) as u32 * rows.len() as u32;
    svg(label_w + 640, height, |root| {
        root.draw_text(title, &TextStyle::from((FONT, 18)), (10, 8)).expect("draw");
        root.draw_text(note, &TextStyle::from((FONT, 12)), (10, 32)).expect("draw");
        let legend: Vec<(&str, RGBColor)> =
            series.iter().enumerate().map(|(s, (name, _))| (*name, SERIES[s % SERIES.len()])).collect();
        legend_strip(root, 52, &legend);
        let area = root.margin(72, 0, 0, 0);
        let mut chart = ChartBuilder::on(&area)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..top, 0.0..rows.len() as f64)
            .expect("chart");
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows.len() * 2 + 1)
            .y_label_formatter(&|y| {
                let i = y.floor() as usize;
                match (y - i as f64 - 0.5).abs() < 0.01 && i < rows.len() {
                    true => rows[rows.len() - 1 - i].clone(),
                    false => String::new(),
                }
            })
            .x_desc(unit)
            .label_style((FONT, 12))
            .draw()
            .expect("mesh");
        for (s, (_, values)) in series.iter().enumerate() {
            let colour = SERIES[s % SERIES.len()];
            for (row, v) in values {
                let i = rows.len() - 1 - rows.iter().position(|r| r == row).expect("listed");
                // The first series on top, as the legend lists them.
                let y0 = i as f64 + 0.1 + 0.8 * (group - 1.0 - s as f64) / group;
                let y1 = y0 + 0.8 / group - 0.02;
                chart.draw_series([Rectangle::new([(0.0, y0), (*v, y1)], colour.filled())]).expect("bar");
                let text = Text::new(
                    short(*v),
                    (*v, (y0 + y1) / 2.0),
                    TextStyle::from((FONT, 11)).pos(Pos::new(HPos::Left, VPos::Center)),
                );
                chart.draw_series([text]).expect("value");
            }
        }
    })
}

/// A bar's value as its label: ` 0`, ` 3.2`, ` 1250`.
fn short(v: f64) -> String {
    match v {
        0.0 => " 0".into(),
        v if v >= 100.0 => format!(" {v:.0}"),
        v => format!(" {v:.2}").trim_end_matches('0').trim_end_matches('.').to_string(),
    }
}

/// Acquisition latency (p50, p99) per lock without faults, each lock with the share of its attempts it
/// granted: a lock that fails fast when the lock is taken "acquires" only when it is free.
pub fn latency(runs: &[ScenarioResult]) -> String {
    let granted = |r: &ScenarioResult| -> String {
        let m = || r.results.iter().map(|s| &s.measurements);
        let (ok, tried) = (m().map(|m| m.acquisitions).sum::<u64>(), m().map(|m| m.attempts).sum::<u64>());
        match tried >= ok && tried > 0 {
            true => format!("{}: {:.0}% of attempts granted", lock_name(r), 100.0 * ok as f64 / tried as f64),
            false => lock_name(r),
        }
    };
    let named = |value: fn(&ScenarioResult) -> f64| -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> =
            runs.iter().filter(|r| quiet_flash_sale(r)).map(|r| (granted(r), value(r))).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
        v
    };
    bars(
        "Acquisition latency: flash sale, no faults (simulated)",
        "Only granted attempts are timed: a lock that fails fast looks quick, so each lock shows the share of attempts it granted.",
        "milliseconds",
        &[("p50", named(|r| r.summary.latency_ms_p50)), ("p99", named(|r| r.summary.latency_ms_p99_max))],
    )
}

/// Acquisitions per simulated second per lock, without faults.
pub fn throughput(runs: &[ScenarioResult]) -> String {
    let rate = per_lock(runs, |r| {
        let acquisitions: u64 = r.results.iter().map(|s| s.measurements.acquisitions).sum();
        let busy_s: f64 = r.results.iter().map(|s| s.measurements.busy_ms).sum::<f64>() / 1000.0;
        acquisitions as f64 / busy_s.max(1e-9)
    });
    let note = "The same flash sale for every lock, from the first request to the last release.";
    bars("Throughput: flash sale, no faults", note, "acquisitions per simulated second", &[("throughput", rate)])
}

/// Messages and notifications per acquisition per lock, without faults.
pub fn messages(runs: &[ScenarioResult]) -> String {
    let per_acquisition = |r: &ScenarioResult, f: &dyn Fn(&SeedResult) -> u64| {
        let acquisitions: u64 = r.results.iter().map(|s| s.measurements.acquisitions).sum();
        r.results.iter().map(f).sum::<u64>() as f64 / acquisitions.max(1) as f64
    };
    let messages = per_lock(runs, |r| per_acquisition(r, &|s| s.measurements.messages));
    let notifications = per_lock(runs, |r| per_acquisition(r, &|s| s.measurements.notifications));
    let series = [("messages", messages), ("notifications", notifications)];
    let note = "Every message the run sent (requests, replies, replication), and the watch notifications among them.";
    bars("Cost per acquisition: flash sale, no faults", note, "per acquisition", &series)
}

/// A herd line's points: waiters, and clients one release woke.
type Points = Vec<(usize, f64)>;

/// The herd curve's lines: per lock variant run without faults at several client counts, the mean over
/// seeds of the most clients one release woke, by waiters. Variants with the very same points share one
/// line, named together, so that no line hides another.
pub fn herd_lines(runs: &[ScenarioResult]) -> Vec<(String, Points)> {
    let mut lines: BTreeMap<String, BTreeMap<usize, f64>> = BTreeMap::new();
    let counters = runs.iter().filter(|r| r.fault_kinds.is_empty() && r.workload == "counter" && !r.results.is_empty());
    for run in counters.filter(|r| !r.real) {
        let max = run.results.iter().map(|s| s.measurements.notifications_per_release_max as f64).sum::<f64>();
        lines.entry(lock_name(run)).or_default().insert(run.clients - 1, max / run.results.len() as f64);
    }
    let mut same: Vec<(Vec<String>, Points)> = Vec::new();
    for (lock, points) in lines.into_iter().filter(|(_, p)| p.len() >= 2) {
        let points: Points = points.into_iter().collect();
        match same.iter_mut().find(|(_, p)| *p == points) {
            Some((names, _)) => names.push(lock),
            None => same.push((vec![lock], points)),
        }
    }
    same.into_iter().map(|(names, points)| (names.join(" = "), points)).collect()
}

/// Notifications one release sends against the number of waiters, one line per variant (or per group of
/// variants with the same points), each with its own colour and marker.
pub fn herd_curve(runs: &[ScenarioResult]) -> String {
    let lines = herd_lines(runs);
    let x_max = lines.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).max().unwrap_or(1).max(1) as f64;
    let y_max = lines.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)).fold(1.0, f64::max);
    svg(900, 460, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Herd effect: clients woken by one release (no faults; \"a = b\": the same points)", (FONT, 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max * 1.1)
            .expect("chart");
        chart
            .configure_mesh()
            .x_desc("waiters (clients - 1)")
            .y_desc("notifications per release (max, mean over seeds)")
            .label_style((FONT, 12))
            .draw()
            .expect("mesh");
        for (i, (name, points)) in lines.iter().enumerate() {
            let colour = SERIES[i % SERIES.len()];
            let series: Vec<(f64, f64)> = points.iter().map(|(x, y)| (*x as f64, *y)).collect();
            chart
                .draw_series(LineSeries::new(series.clone(), colour.stroke_width(2)))
                .expect("line")
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(3)));
            // A marker of its own per line: where lines cross or nearly meet, each can still be followed.
            let markers = series.into_iter();
            match i % 4 {
                0 => chart.draw_series(markers.map(|p| Circle::new(p, 4, colour.filled()))),
                1 => chart.draw_series(markers.map(|p| TriangleMarker::new(p, 6, colour.filled()))),
                2 => chart.draw_series(markers.map(|p| Cross::new(p, 5, colour.stroke_width(2)))),
                _ => chart.draw_series(markers.map(|p| Circle::new(p, 5, colour.stroke_width(2)))),
            }
            .expect("points");
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 12))
            .draw()
            .expect("legend");
    })
}

/// Items one flash-sale seed oversold (orders beyond the stock) and updates it lost (stock writes that
/// overwrote another sale), read from its findings: the checker (`checkers::flash_sale`) writes them as
/// "N orders for a stock of S" and "L left in stock, but N orders from S leave I".
pub fn damage(seed: &SeedResult) -> (u64, u64) {
    let numbers = |detail: &str| -> Vec<i64> {
        detail.split(|c: char| !c.is_ascii_digit() && c != '-').filter_map(|w| w.parse().ok()).collect()
    };
    let mut damage = (0, 0);
    for f in &seed.findings {
        match (f.kind, numbers(&f.detail).as_slice()) {
            (FindingKind::Oversell, [orders, stock]) if f.detail.contains("orders for a stock") => {
                damage.0 = (orders - stock).max(0) as u64
            }
            (FindingKind::LostUpdate, [left, _, _, implied]) => damage.1 = left.abs_diff(*implied),
            _ => {}
        }
    }
    damage
}

/// The flash sales under faults, each lock beside its own runs without faults: oversold items and lost
/// updates per seed. (The unguarded floor, `none`, would set the scale and flatten every lock's bar: the
/// chart names it in its note instead.)
pub fn flash_sale_rows(runs: &[ScenarioResult]) -> Vec<(String, f64, f64)> {
    let sales: Vec<&ScenarioResult> =
        runs.iter().filter(|r| r.workload == "flash-sale" && !r.results.is_empty() && !r.real).collect();
    let faulted: Vec<&&ScenarioResult> = sales.iter().filter(|r| !r.fault_kinds.is_empty()).collect();
    let shown = |r: &ScenarioResult| !r.fault_kinds.is_empty() || faulted.iter().any(|f| f.recipe == r.recipe);
    let mut rows: Vec<(String, String, f64, f64)> = sales
        .iter()
        .filter(|r| shown(r))
        .map(|r| {
            let (oversold, lost) = r.results.iter().map(damage).fold((0, 0), |a, d| (a.0 + d.0, a.1 + d.1));
            let n = r.results.len() as f64;
            (fault_label(r), lock_name(r), oversold as f64 / n, lost as f64 / n)
        })
        .collect();
    // Without faults first (the baseline), then each fault with its locks together.
    rows.sort_by(|a, b| (a.0 != "none", &a.0, &a.1).cmp(&(b.0 != "none", &b.0, &b.1)));
    rows.into_iter().map(|(fault, lock, o, l)| (format!("{lock}, faults: {fault}"), o, l)).collect()
}

/// Oversold items and lost updates per seed, per lock under the same faults, with the baseline.
pub fn flash_sale(runs: &[ScenarioResult]) -> String {
    let rows = flash_sale_rows(runs);
    let floor: Vec<String> = runs
        .iter()
        .filter(|r| quiet_flash_sale(r) && r.recipe == "none")
        .map(|r| {
            let (oversold, lost) = r.results.iter().map(damage).fold((0, 0), |a, d| (a.0 + d.0, a.1 + d.1));
            let n = r.results.len() as f64;
            format!("without a lock, {:.1} oversold and {:.1} lost per seed", oversold as f64 / n, lost as f64 / n)
        })
        .collect();
    let mut note = "Mean per seed; the other flash sales are in the safety matrix and the decision table".to_string();
    if let Some(floor) = floor.first() {
        note = format!("{note}; {floor}");
    }
    let oversold = rows.iter().map(|(n, o, _)| (n.clone(), *o)).collect();
    let lost = rows.iter().map(|(n, _, l)| (n.clone(), *l)).collect();
    bars(
        "Flash sale: items sold beyond the stock, and updates lost",
        &note,
        "per seed (mean)",
        &[("oversold items (orders beyond stock)", oversold), ("lost updates (final stock off by)", lost)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::run;
    use locksim_scenarios::checkers::Finding;

    #[test]
    fn no_matrix_cell_pools_two_variants() {
        let runs = [
            run("release=del", &["pause"], 16, 20, FindingKind::DoubleHolder),
            run("fencing", &["pause"], 20, 20, FindingKind::DoubleHolder),
        ];
        let cells = matrix_cells(&runs);
        assert_eq!(cells.len(), 2);
        let del = &cells[&("redis.set-nx-px (release=del)".to_string(), "pause".to_string())];
        assert_eq!((del.broken, del.seeds), (16, 20));
        let fenced = &cells[&("redis.set-nx-px (fencing)".to_string(), "pause".to_string())];
        assert_eq!((fenced.broken, fenced.seeds), (0, 20));
    }

    #[test]
    fn herd_and_unfair_show_in_the_matrix() {
        let runs = [run("", &[], 75, 75, FindingKind::Herd), run("x=1", &[], 3, 75, FindingKind::Unfair)];
        let cells = matrix_cells(&runs);
        let herd = &cells[&("redis.set-nx-px".to_string(), "none".to_string())];
        assert_eq!((herd.broken, herd.service, herd.kinds.get(&FindingKind::Herd)), (0, 75, Some(&75)));
        let unfair = &cells[&("redis.set-nx-px (x=1)".to_string(), "none".to_string())];
        assert_eq!((unfair.service, unfair.kinds.get(&FindingKind::Unfair)), (3, Some(&3)));
        assert!(safety_matrix(&runs).contains("75/75"));
    }

    #[test]
    fn herd_lines_with_the_same_points_are_named_together() {
        let mut a = run("", &[], 0, 2, FindingKind::Herd);
        let mut b = a.clone();
        b.variant = "ttl=5s".into();
        let mut lines = Vec::new();
        for clients in [2, 8] {
            for r in [&mut a, &mut b] {
                r.clients = clients;
                lines.push(r.clone());
            }
        }
        let herd = herd_lines(&lines);
        assert_eq!(herd.len(), 1);
        assert_eq!(herd[0].0, "redis.set-nx-px = redis.set-nx-px (ttl=5s)");
    }

    #[test]
    fn a_flash_sale_seed_counts_the_items_oversold_and_the_updates_lost() {
        let finding = |kind, detail: &str| Finding {
            kind,
            clients: vec![],
            from_ns: 0,
            to_ns: 0,
            detail: detail.into(),
            faults: vec![],
        };
        let mut seed = run("", &[], 0, 1, FindingKind::Herd).results.remove(0);
        seed.findings = vec![
            finding(FindingKind::Oversell, "the stock went below zero, to -2"),
            finding(FindingKind::Oversell, "12 orders for a stock of 10"),
            finding(FindingKind::LostUpdate, "3 left in stock, but 12 orders from 10 leave -2"),
        ];
        assert_eq!(damage(&seed), (2, 5));
    }
}
