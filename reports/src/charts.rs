//! The report's charts, as SVG text drawn with plotters.
//!
//! Every chart reads a set of suite runs: the safety matrix all of them; latency, throughput and message
//! counts the flash sales without faults — the same workload for every recipe, so that they compare on
//! equal terms; the herd curve the fault-free counter runs of a recipe at several client counts; the
//! flash-sale chart every flash sale.

use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::sweep::ScenarioResult;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;

const FONT: &str = "sans-serif";
const SAFE: RGBColor = RGBColor(46, 139, 87);
const UNSAFE: RGBColor = RGBColor(200, 40, 40);
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

/// How a run's faults are named in the matrix: "none", a kind or a few, or a nemesis of many kinds.
pub fn fault_label(run: &ScenarioResult) -> String {
    match run.fault_kinds.as_slice() {
        [] => "none".into(),
        kinds if kinds.len() <= 3 => kinds.join("+"),
        kinds => format!("nemesis of {} kinds", kinds.len()),
    }
}

/// What the matrix counts as a broken lock: anything but the herd, unfairness, starvation and refused
/// stale writes.
fn breaks_the_lock(kind: FindingKind) -> bool {
    !matches!(kind, FindingKind::Herd | FindingKind::Unfair | FindingKind::Starvation | FindingKind::StaleWriteRejected)
}

/// Seeds of `run` that found `kind`.
fn seeds_with(run: &ScenarioResult, kind: FindingKind) -> u64 {
    run.seeds_with.get(&kind).copied().unwrap_or(0)
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

/// Recipe × fault kind: violating seeds / seeds, green when none, redder the more.
pub fn safety_matrix(runs: &[ScenarioResult]) -> String {
    let mut cells: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for run in runs {
        let cell = cells.entry((run.recipe.clone(), fault_label(run))).or_default();
        cell.0 += run.results.iter().filter(|r| r.counts.keys().any(|k| breaks_the_lock(*k))).count() as u64;
        cell.1 += run.results.len() as u64;
    }
    let mut recipes: Vec<&String> = cells.keys().map(|(r, _)| r).collect();
    recipes.dedup();
    let mut faults: Vec<&String> = cells.keys().map(|(_, f)| f).collect();
    faults.sort();
    faults.dedup();
    let longest = faults.iter().map(|f| f.len()).max().unwrap_or(4) as u32;
    let (label_w, cell_w, cell_h, head_h) = (190, 92, 26, 50 + 7 * longest);
    let width = (label_w + cell_w * faults.len() as u32 + 20).max(820);
    let height = head_h + cell_h * recipes.len() as u32 + 40;
    svg(width, height, |root| {
        let title = TextStyle::from((FONT, 18));
        let heading =
            "Safety matrix: seeds with two holders, unsafe writes, oversells, lost updates or deadlocks / seeds";
        root.draw_text(heading, &title, (10, 8)).expect("draw");
        for (j, fault) in faults.iter().enumerate() {
            let x = (label_w + cell_w * j as u32 + cell_w / 2) as i32;
            let style =
                TextStyle::from((FONT, 13)).transform(FontTransform::Rotate270).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw_text(fault, &style, (x, head_h as i32 - 6)).expect("draw");
        }
        for (i, recipe) in recipes.iter().enumerate() {
            let y = (head_h + cell_h * i as u32) as i32;
            let style = TextStyle::from((FONT, 13)).pos(Pos::new(HPos::Right, VPos::Center));
            root.draw_text(recipe, &style, (label_w as i32 - 8, y + cell_h as i32 / 2)).expect("draw");
            for (j, fault) in faults.iter().enumerate() {
                let x = (label_w + cell_w * j as u32) as i32;
                let corners = [(x + 1, y + 1), (x + cell_w as i32 - 1, y + cell_h as i32 - 1)];
                let Some((bad, all)) = cells.get(&((*recipe).clone(), (*fault).clone())) else {
                    root.draw(&Rectangle::new(corners, EMPTY.filled())).expect("draw");
                    continue;
                };
                let share = *bad as f64 / (*all).max(1) as f64;
                let fill = if *bad == 0 { SAFE.filled() } else { UNSAFE.mix(0.35 + 0.65 * share).filled() };
                root.draw(&Rectangle::new(corners, fill)).expect("draw");
                let text = TextStyle::from((FONT, 12)).color(&WHITE).pos(Pos::new(HPos::Center, VPos::Center));
                let at = (x + cell_w as i32 / 2, y + cell_h as i32 / 2);
                root.draw_text(&format!("{bad}/{all}"), &text, at).expect("draw");
            }
        }
    })
}

/// Per-recipe values from the flash sales without faults (the largest if a recipe has several).
fn per_recipe(runs: &[ScenarioResult], value: impl Fn(&ScenarioResult) -> f64) -> Vec<(String, f64)> {
    let mut best: BTreeMap<String, f64> = BTreeMap::new();
    let comparable =
        |r: &&ScenarioResult| r.fault_kinds.is_empty() && r.workload == "flash-sale" && !r.results.is_empty();
    for run in runs.iter().filter(comparable) {
        let v = value(run);
        let slot = best.entry(run.recipe.clone()).or_insert(v);
        *slot = slot.max(v);
    }
    best.into_iter().collect()
}

/// Horizontal bars, one group per recipe and one bar per series.
fn bars(title: &str, unit: &str, series: &[(&str, Vec<(String, f64)>)]) -> String {
    let recipes: Vec<String> = {
        let mut r: Vec<String> = series.iter().flat_map(|(_, v)| v.iter().map(|(k, _)| k.clone())).collect();
        r.sort();
        r.dedup();
        r
    };
    let top = series.iter().flat_map(|(_, v)| v.iter().map(|(_, x)| *x)).fold(0.0, f64::max).max(1e-9) * 1.15;
    let group = series.len() as f64;
    let height = 80 + 24 * recipes.len() as u32 * series.len().max(1) as u32;
    svg(760, height.max(160), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(190)
            .build_cartesian_2d(0.0..top, 0.0..recipes.len() as f64)
            .expect("chart");
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(recipes.len() * 2 + 1)
            .y_label_formatter(&|y| {
                let i = y.floor() as usize;
                if (y - i as f64 - 0.5).abs() < 0.01 && i < recipes.len() {
                    recipes[recipes.len() - 1 - i].clone()
                } else {
                    String::new()
                }
            })
            .x_desc(unit)
            .label_style((FONT, 12))
            .draw()
            .expect("mesh");
        for (s, (name, values)) in series.iter().enumerate() {
            let colour = SERIES[s % SERIES.len()];
            let rects = values.iter().map(|(recipe, v)| {
                let i = recipes.len() - 1 - recipes.iter().position(|r| r == recipe).expect("listed");
                let y0 = i as f64 + 0.1 + 0.8 * s as f64 / group;
                Rectangle::new([(0.0, y0), (*v, y0 + 0.8 / group - 0.02)], colour.filled())
            });
            chart
                .draw_series(rects)
                .expect("bars")
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .label_font((FONT, 12))
                .draw()
                .expect("legend");
        }
    })
}

/// Acquisition latency (p50, p99) per recipe, without faults.
pub fn latency(runs: &[ScenarioResult]) -> String {
    let p50 = per_recipe(runs, |r| r.summary.latency_ms_p50);
    let p99 = per_recipe(runs, |r| r.summary.latency_ms_p99_max);
    bars("Acquisition latency: flash sale, no faults (simulated)", "milliseconds", &[("p50", p50), ("p99", p99)])
}

/// Acquisitions per simulated second per recipe, without faults.
pub fn throughput(runs: &[ScenarioResult]) -> String {
    let rate = per_recipe(runs, |r| {
        let acquisitions: u64 = r.results.iter().map(|s| s.measurements.acquisitions).sum();
        let busy_s: f64 = r.results.iter().map(|s| s.measurements.busy_ms).sum::<f64>() / 1000.0;
        acquisitions as f64 / busy_s.max(1e-9)
    });
    bars("Throughput: flash sale, no faults", "acquisitions per simulated second", &[("throughput", rate)])
}

/// Messages and notifications per acquisition per recipe, without faults.
pub fn messages(runs: &[ScenarioResult]) -> String {
    let per_acquisition = |r: &ScenarioResult, f: &dyn Fn(&locksim_scenarios::run::SeedResult) -> u64| {
        let acquisitions: u64 = r.results.iter().map(|s| s.measurements.acquisitions).sum();
        r.results.iter().map(f).sum::<u64>() as f64 / acquisitions.max(1) as f64
    };
    let messages = per_recipe(runs, |r| per_acquisition(r, &|s| s.measurements.messages));
    let notifications = per_recipe(runs, |r| per_acquisition(r, &|s| s.measurements.notifications));
    let series = [("messages", messages), ("notifications", notifications)];
    bars("Cost per acquisition: flash sale, no faults", "per acquisition", &series)
}

/// Notifications one release sends against the number of waiters, one line per recipe that ran at
/// several client counts without faults.
pub fn herd_curve(runs: &[ScenarioResult]) -> String {
    let mut lines: BTreeMap<String, BTreeMap<usize, f64>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.fault_kinds.is_empty() && r.workload == "counter" && !r.results.is_empty()) {
        let max = run.results.iter().map(|s| s.measurements.notifications_per_release_max as f64).sum::<f64>();
        lines.entry(run.recipe.clone()).or_default().insert(run.clients - 1, max / run.results.len() as f64);
    }
    lines.retain(|_, points| points.len() >= 2);
    let x_max = lines.values().flat_map(|p| p.keys()).copied().max().unwrap_or(1).max(1) as f64;
    let y_max = lines.values().flat_map(|p| p.values()).copied().fold(1.0, f64::max);
    svg(760, 420, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Herd effect: clients woken by one release", (FONT, 18))
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
        for (i, (recipe, points)) in lines.iter().enumerate() {
            let colour = SERIES[i % SERIES.len()];
            let series: Vec<(f64, f64)> = points.iter().map(|(x, y)| (*x as f64, *y)).collect();
            chart
                .draw_series(LineSeries::new(series.clone(), colour.stroke_width(2)))
                .expect("line")
                .label(recipe.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
            chart.draw_series(series.into_iter().map(|p| Circle::new(p, 3, colour.filled()))).expect("points");
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

/// The flash sale: seeds that oversold or lost an update, per recipe.
pub fn flash_sale(runs: &[ScenarioResult]) -> String {
    let mut totals: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.workload == "flash-sale") {
        let t = totals.entry(format!("{} ({})", run.recipe, fault_label(run))).or_default();
        t.0 += seeds_with(run, FindingKind::Oversell);
        t.1 += seeds_with(run, FindingKind::LostUpdate);
        t.2 += run.results.len() as u64;
    }
    let share = |pick: fn(&(u64, u64, u64)) -> u64| -> Vec<(String, f64)> {
        totals.iter().map(|(k, t)| (k.clone(), 100.0 * pick(t) as f64 / t.2.max(1) as f64)).collect()
    };
    bars(
        "Flash sale: seeds that oversold or lost an update",
        "% of seeds",
        &[("oversell", share(|t| t.0)), ("lost-update", share(|t| t.1))],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_counts_broken_locks_not_slow_or_unfair_service() {
        let broken: Vec<&str> =
            FindingKind::ALL.into_iter().filter(|k| breaks_the_lock(*k)).map(|k| k.name()).collect();
        assert_eq!(broken, ["double-holder", "unsafe-write", "deadlock", "oversell", "lost-update", "invariant"]);
    }
}
