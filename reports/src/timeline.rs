//! One seed as a picture: a lane per client showing when it waited for the lock, held it, was paused,
//! cut off or down; the lease a grant carries when the recipe's lock expires by itself; and the
//! findings — two holders' overlap shaded across their lanes, a stale write marked.

use locksim_scenarios::checkers::{Finding, FindingKind};
use locksim_sim::fault::{FaultKind, Shade};
use locksim_sim::history::{EventKind, History, NodeIx};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

const FONT: &str = "sans-serif";
// Waiting, holding and holding shared must tell apart at a glance: green, blue, purple.
const WAITING: RGBColor = RGBColor(161, 217, 155);
const HOLDING: RGBColor = RGBColor(49, 130, 189);
const SHARED: RGBColor = RGBColor(136, 86, 167);
const PAUSED: RGBColor = RGBColor(120, 120, 120);
const CUT: RGBColor = RGBColor(253, 174, 107);
const DOWN: RGBColor = RGBColor(30, 30, 30);
const LEASE: RGBColor = RGBColor(255, 170, 0);
const OVERLAP: RGBColor = RGBColor(220, 30, 30);
/// An accepted stale write: magenta, not the two holders' red that it often sits on.
const UNSAFE_WRITE: RGBColor = RGBColor(197, 27, 138);

/// A bar on a lane: [from, to) seconds, what it is.
struct Span {
    lane: usize,
    from: f64,
    to: f64,
    what: Bar,
}

#[derive(Clone, Copy, PartialEq)]
enum Bar {
    Waiting,
    Holding { shared: bool },
    Lease,
    Fault(FaultKind),
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The spans of `h`'s client lanes; `lease` is how long a grant stays valid without renewal.
fn spans(h: &History, lanes: &BTreeMap<NodeIx, usize>, lease: Option<Duration>) -> Vec<Span> {
    let end = secs(h.end);
    let mut out = Vec::new();
    let mut waiting: BTreeMap<NodeIx, f64> = BTreeMap::new();
    let mut holding: BTreeMap<NodeIx, (f64, bool)> = BTreeMap::new();
    let mut faults: BTreeMap<u32, (NodeIx, f64, FaultKind)> = BTreeMap::new();
    for e in &h.events {
        let (t, Some(&lane)) = (secs(e.t), lanes.get(&e.node)) else {
            if let EventKind::FaultEnd { id } = e.kind {
                faults.remove(&id);
            }
            continue;
        };
        match &e.kind {
            EventKind::AcquireInvoke => {
                waiting.insert(e.node, t);
            }
            EventKind::AcquireOk { shared, .. } => {
                if let Some(from) = waiting.remove(&e.node) {
                    out.push(Span { lane, from, to: t, what: Bar::Waiting });
                }
                holding.insert(e.node, (t, *shared));
                if let Some(lease) = lease {
                    out.push(Span { lane, from: t, to: (t + lease.as_secs_f64()).min(end), what: Bar::Lease });
                }
            }
            EventKind::AcquireFail { .. } | EventKind::AcquireUnknown { .. } => {
                if let Some(from) = waiting.remove(&e.node) {
                    out.push(Span { lane, from, to: t, what: Bar::Waiting });
                }
            }
            EventKind::ReleaseInvoke | EventKind::LockLost { .. } => {
                if let Some((from, shared)) = holding.remove(&e.node) {
                    out.push(Span { lane, from, to: t, what: Bar::Holding { shared } });
                }
            }
            EventKind::FaultStart { id, fault, .. } => {
                if fault.is_crash() {
                    // A dead process neither waits nor holds.
                    if let Some(from) = waiting.remove(&e.node) {
                        out.push(Span { lane, from, to: t, what: Bar::Waiting });
                    }
                    if let Some((from, shared)) = holding.remove(&e.node) {
                        out.push(Span { lane, from, to: t, what: Bar::Holding { shared } });
                    }
                }
                faults.insert(*id, (e.node, t, *fault));
            }
            EventKind::FaultEnd { id } => {
                if let Some((node, from, fault)) = faults.remove(id) {
                    out.push(Span { lane: lanes[&node], from, to: t, what: Bar::Fault(fault) });
                }
            }
            _ => {}
        }
    }
    let open = waiting.into_iter().map(|(n, from)| Span { lane: lanes[&n], from, to: end, what: Bar::Waiting });
    out.extend(open);
    let held = holding.into_iter().map(|(n, (from, shared))| Span {
        lane: lanes[&n],
        from,
        to: end,
        what: Bar::Holding { shared },
    });
    out.extend(held);
    out.extend(faults.into_values().map(|(n, from, fault)| Span {
        lane: lanes[&n],
        from,
        to: end,
        what: Bar::Fault(fault),
    }));
    out
}

/// The timeline of a seed as SVG. `title` heads it; `lease` draws each grant's validity.
pub fn timeline(title: &str, h: &History, findings: &[Finding], lease: Option<Duration>) -> String {
    let clients: Vec<(NodeIx, &str)> = h
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.starts_with("client-"))
        .map(|(i, n)| (NodeIx(i as u32), n.as_str()))
        .collect();
    let lanes: BTreeMap<NodeIx, usize> = clients.iter().enumerate().map(|(i, (n, _))| (*n, i)).collect();
    let spans = spans(h, &lanes, lease);
    let end = secs(h.end).max(1e-3);
    let lane_of = |name: &str| clients.iter().position(|(_, n)| *n == name);
    let height = 120 + 48 * clients.len() as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1100, height)).into_drawing_area();
        root.fill(&WHITE).expect("draw");
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 17))
            .margin(10)
            .margin_top(40)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..end, 0.0..clients.len() as f64)
            .expect("chart");
        let n = clients.len();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let i = y.floor() as usize;
                match (y - i as f64 - 0.5).abs() < 0.01 && i < n {
                    true => clients[n - 1 - i].1.to_string(),
                    false => String::new(),
                }
            })
            .x_desc("simulated seconds")
            .label_style((FONT, 12))
            .draw()
            .expect("mesh");
        let row = |lane: usize| (n - 1 - lane) as f64;
        let bar = |s: &Span, lo: f64, hi: f64, style: ShapeStyle| {
            Rectangle::new([(s.from, row(s.lane) + lo), (s.to.max(s.from + end / 2000.0), row(s.lane) + hi)], style)
        };
        // Faults behind, then waits and holds, then the lease line, then the findings on top.
        let faults = spans.iter().filter_map(|s| match s.what {
            Bar::Fault(kind) => Some(bar(
                s,
                0.05,
                0.95,
                match kind.spec().means.shade {
                    Shade::Paused => PAUSED.mix(0.35).filled(),
                    Shade::Down => DOWN.mix(0.6).filled(),
                    Shade::Cut => CUT.mix(0.45).filled(),
                    Shade::Disturbed => CUT.mix(0.2).filled(),
                },
            )),
            _ => None,
        });
        chart.draw_series(faults).expect("faults");
        let locks = spans.iter().filter_map(|s| match s.what {
            Bar::Waiting => Some(bar(s, 0.35, 0.65, WAITING.filled())),
            Bar::Holding { shared: false } => Some(bar(s, 0.25, 0.75, HOLDING.filled())),
            Bar::Holding { shared: true } => Some(bar(s, 0.25, 0.75, SHARED.filled())),
            _ => None,
        });
        chart.draw_series(locks).expect("locks");
        let leases = spans.iter().filter(|s| s.what == Bar::Lease).map(|s| bar(s, 0.15, 0.21, LEASE.filled()));
        chart.draw_series(leases).expect("leases");
        for f in findings {
            let lanes: Vec<usize> = f.clients.iter().filter_map(|c| lane_of(c)).collect();
            let (from, to) = (secs(f.from_ns), secs(f.to_ns));
            match f.kind {
                FindingKind::DoubleHolder => {
                    for lane in &lanes {
                        let s = Span { lane: *lane, from, to, what: Bar::Waiting };
                        chart.draw_series([bar(&s, 0.0, 1.0, OVERLAP.mix(0.35).filled())]).expect("overlap");
                    }
                }
                FindingKind::UnsafeWrite | FindingKind::Invariant | FindingKind::StaleWriteRejected => {
                    if let Some(lane) = lanes.first() {
                        let marker = if f.kind == FindingKind::StaleWriteRejected { SERIES_OK } else { UNSAFE_WRITE };
                        let at = (to, row(*lane) + 0.5);
                        chart.draw_series([Cross::new(at, 7, marker.stroke_width(3))]).expect("write");
                    }
                }
                _ => {}
            }
        }
        // The legend, drawn as a strip below the title.
        let legend: [(&str, RGBColor); 10] = [
            ("waiting", WAITING),
            ("holding", HOLDING),
            ("holding shared", SHARED),
            ("lease (no renewal)", LEASE),
            ("paused", PAUSED),
            ("cut off", CUT),
            ("down", DOWN),
            ("two holders", OVERLAP),
            ("unsafe write: x", UNSAFE_WRITE),
            ("stale write refused: x", SERIES_OK),
        ];
        let mut x = 90;
        for (label, colour) in legend {
            root.draw(&Rectangle::new([(x, 30), (x + 14, 42)], colour.mix(0.8).filled())).expect("legend");
            root.draw_text(label, &TextStyle::from((FONT, 12)), (x + 18, 30)).expect("legend");
            x += 26 + 13 * label.len() as i32 / 2;
        }
        root.present().expect("svg");
    }
    out
}

/// A refused stale write: the defence working.
const SERIES_OK: RGBColor = RGBColor(46, 139, 87);
