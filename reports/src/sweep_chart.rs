//! The chart of a breaking-point sweep (`locksim sweep --out`): the unsafe rate against the varied
//! value, with its 95% interval as a band, so that a reader sees both where the lock breaks and how
//! sure the seeds make that.

use locksim_scenarios::rate::Rate;
use locksim_scenarios::vary::{BreakingPoint, Value};
use plotters::prelude::*;

const FONT: &str = "sans-serif";
const LINE: RGBColor = RGBColor(200, 40, 40);
const SAFE: RGBColor = RGBColor(46, 139, 87);

/// The SVG text of the chart: `points` are the values in increasing order with their unsafe rates.
pub fn chart(title: &str, key: &str, points: &[(Value, Rate)], breaking: &BreakingPoint) -> String {
    let durations = matches!(points.first(), Some((Value::Duration(_), _)));
    let x_desc = if durations { format!("{key} (s)") } else { key.to_string() };
    let xs: Vec<f64> = points.iter().map(|(v, _)| v.as_f64()).collect();
    let (lo, hi) = (xs.first().copied().unwrap_or(0.0), xs.last().copied().unwrap_or(1.0));
    // A single value still needs a width to be drawn in.
    let pad = if hi > lo { (hi - lo) * 0.05 } else { 1.0 };
    let pct = |x: f64| 100.0 * x;
    let title = match breaking.breaks_at {
        Some((value, _)) => format!("{title}: breaks at {key} = {value}"),
        None => format!("{title}: no violation in this range"),
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (760, 420)).into_drawing_area();
        root.fill(&WHITE).expect("an SVG string can be drawn on");
        let mut chart = ChartBuilder::on(&root)
            .caption(&title, (FONT, 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo - pad..hi + pad, 0.0..100.0)
            .expect("chart");
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("seeds unsafe (%), 95% interval shaded")
            .label_style((FONT, 12))
            .draw()
            .expect("mesh");
        // The band: the upper ends left to right, then the lower ends back.
        let mut band: Vec<(f64, f64)> = points.iter().map(|(v, r)| (v.as_f64(), pct(r.high))).collect();
        band.extend(points.iter().rev().map(|(v, r)| (v.as_f64(), pct(r.low))));
        chart
            .draw_series(std::iter::once(Polygon::new(band, LINE.mix(0.2).filled())))
            .expect("band")
            .label("95% interval")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], LINE.mix(0.2).filled()));
        if let Some(safe) = breaking.safe_to {
            // Where the seeds found nothing: shaded green from the safe end to the breaking point.
            let (from, to, said) = match breaking.rising {
                true => (lo - pad, safe.as_f64(), format!("no violation up to {safe}")),
                false => (safe.as_f64(), hi + pad, format!("no violation from {safe} up")),
            };
            let area = vec![(from, 0.0), (to, 0.0), (to, 100.0), (from, 100.0)];
            chart
                .draw_series(std::iter::once(Polygon::new(area, SAFE.mix(0.08).filled())))
                .expect("safe area")
                .label(said)
                .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], SAFE.mix(0.3).filled()));
        }
        let line: Vec<(f64, f64)> = points.iter().map(|(v, r)| (v.as_f64(), pct(r.value()))).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), LINE.stroke_width(2)))
            .expect("line")
            .label("seeds unsafe")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], LINE.stroke_width(2)));
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, LINE.filled()))).expect("points");
        chart
            .configure_series_labels()
            // On the safe side, where the line runs along the bottom.
            .position(if breaking.rising { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::UpperRight })
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 12))
            .draw()
            .expect("legend");
        root.present().expect("an SVG string can be written");
    }
    out
}
