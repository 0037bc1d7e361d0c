//! Checkers: pure functions from a history to findings, one per finding kind (docs/scenarios.md, "Findings").
//!
//! Checkers read only the [`History`]; they know nothing of recipes or backends. Each is tested on
//! hand-built histories where it fires and where it stays quiet.

mod deadlock;
mod double_holder;
mod flash_sale;
pub mod herd;
pub mod holds;
mod invariant;
mod measure;
pub mod starvation;
mod unfair;
mod unsafe_write;

pub use measure::{measure, Measurements};

use locksim_locks::work::WorkSpec;
use locksim_sim::fault::{fmt_duration, FaultKind};
use locksim_sim::history::{EventKind, History, NodeIx};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The finding vocabulary of scenario files, results and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    DoubleHolder,
    UnsafeWrite,
    StaleWriteRejected,
    Deadlock,
    Herd,
    Unfair,
    Starvation,
    Oversell,
    LostUpdate,
    Invariant,
}

impl FindingKind {
    pub const ALL: [FindingKind; 10] = [
        FindingKind::DoubleHolder,
        FindingKind::UnsafeWrite,
        FindingKind::StaleWriteRejected,
        FindingKind::Deadlock,
        FindingKind::Herd,
        FindingKind::Unfair,
        FindingKind::Starvation,
        FindingKind::Oversell,
        FindingKind::LostUpdate,
        FindingKind::Invariant,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FindingKind::DoubleHolder => "double-holder",
            FindingKind::UnsafeWrite => "unsafe-write",
            FindingKind::StaleWriteRejected => "stale-write-rejected",
            FindingKind::Deadlock => "deadlock",
            FindingKind::Herd => "herd",
            FindingKind::Unfair => "unfair",
            FindingKind::Starvation => "starvation",
            FindingKind::Oversell => "oversell",
            FindingKind::LostUpdate => "lost-update",
            FindingKind::Invariant => "invariant",
        }
    }

    pub fn parse(name: &str) -> Option<FindingKind> {
        FindingKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this finding makes a seed `unsafe`; `stale-write-rejected` is the defence working.
    pub fn is_violation(self) -> bool {
        self != FindingKind::StaleWriteRejected
    }
}

/// One thing a checker found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The clients involved, by name.
    pub clients: Vec<String>,
    /// The window in simulated nanoseconds.
    pub from_ns: u64,
    pub to_ns: u64,
    /// The faults active in that window, in words.
    pub faults: Vec<String>,
    pub detail: String,
}

/// The simulator's [`CheckConfig::fifo_margin`]: longer than the round trips between asking and joining
/// a queue (session, parents, create).
pub const FIFO_MARGIN: Duration = Duration::from_millis(100);

/// Checker settings from the scenario's `[check]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckConfig {
    /// `deadlock` when clients wait this long while nobody holds the lock (unchecked when `None`:
    /// `[check] deadlock = false`).
    pub liveness: Option<Duration>,
    /// `herd` when one change wakes more clients than this (unchecked when `None`).
    pub herd_max: Option<u32>,
    /// Hold grants to request order (`unfair`): by default, whether the recipe promises FIFO.
    pub fifo: bool,
    /// How much later than another a request must be asked to overtake it unfairly: longer than the
    /// way from asking to joining the recipe's queue ([`FIFO_MARGIN`] in the simulator).
    pub fifo_margin: Duration,
    /// When a waiter passed over again and again is `starvation` (unchecked when `None`).
    pub starvation: Option<starvation::Bounds>,
    /// A flash sale's initial stock: `oversell` and `lost-update` are checked only then.
    pub stock: Option<i64>,
    /// A user's workload, whose invariant over the store is checked (`invariant`).
    pub invariant: Option<WorkSpec>,
    /// Whether the recipe is a lock (`double-holder` and `unsafe-write` are checked), or a baseline
    /// that keeps nobody apart.
    pub exclusive: bool,
    /// Whether the resource refuses stale fencing tokens: then the tokens, not the grants' order, say
    /// which of two holds is the later one (`unsafe-write`).
    pub fenced: bool,
}

/// A finding before the history's names and faults are attached.
struct Raw {
    kind: FindingKind,
    clients: Vec<NodeIx>,
    from: u64,
    to: u64,
    detail: String,
}

/// Run every checker over `h`.
pub fn check(h: &History, config: &CheckConfig) -> Vec<Finding> {
    let holds = holds::holds(h);
    let mut raw = Vec::new();
    if config.exclusive {
        raw.extend(double_holder::check(&holds));
        raw.extend(unsafe_write::check(h, config.fenced));
    }
    if let Some(liveness) = config.liveness {
        raw.extend(deadlock::check(h, &holds, liveness));
    }
    raw.extend(herd::check(h, config.herd_max));
    raw.extend(unfair::check(h, config.fifo, config.fifo_margin));
    raw.extend(starvation::check(h, config.starvation));
    raw.extend(flash_sale::check(h, config.stock));
    raw.extend(invariant::check(h, config.invariant.as_ref()));
    let faults = fault_windows(h);
    raw.into_iter()
        .map(|r| Finding {
            kind: r.kind,
            clients: r.clients.iter().map(|c| h.name(*c).to_string()).collect(),
            from_ns: r.from,
            to_ns: r.to,
            faults: faults.iter().filter(|f| f.0 <= r.to && r.from <= f.1).map(|f| f.2.clone()).collect(),
            detail: r.detail,
        })
        .collect()
}

/// `(start, end, words)` for every fault; lasting effects (a jump, a crash) run to the end.
fn fault_windows(h: &History) -> Vec<(u64, u64, String)> {
    let mut started: BTreeMap<u32, (u64, String)> = BTreeMap::new();
    let mut windows = Vec::new();
    for e in &h.events {
        match &e.kind {
            EventKind::FaultStart { id, fault, target, detail } => {
                started.insert(*id, (e.t, describe_fault(*fault, target, detail)));
            }
            EventKind::FaultEnd { id } => {
                if let Some((start, words)) = started.remove(id) {
                    windows.push((start, e.t, words));
                }
            }
            _ => {}
        }
    }
    windows.extend(started.into_values().map(|(start, words)| (start, h.end, words)));
    windows.sort();
    windows
}

fn describe_fault(kind: FaultKind, target: &str, detail: &str) -> String {
    [kind.name(), target, detail].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(" ")
}

/// `12.345s`: simulated time for people.
pub fn fmt_t(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// A duration for people, from nanoseconds.
pub fn fmt_span(ns: u64) -> String {
    fmt_duration(Duration::from_millis(ns / 1_000_000))
}

#[cfg(test)]
pub(crate) mod test_history {
    //! A tiny language for hand-built histories in checker tests.
    use locksim_sim::history::{Event, EventKind, History, NodeIx};

    pub fn history(end_s: f64, events: Vec<(f64, u32, EventKind)>) -> History {
        History {
            nodes: vec!["client-0".into(), "client-1".into(), "client-2".into(), "redis-0".into()],
            events: events
                .into_iter()
                .map(|(t, node, kind)| Event { t: (t * 1e9) as u64, node: NodeIx(node), kind })
                .collect(),
            end: (end_s * 1e9) as u64,
        }
    }

    pub fn ok(token: u64) -> EventKind {
        EventKind::AcquireOk { token: Some(token), shared: false }
    }

    pub fn crash(target: &str) -> EventKind {
        let fault = locksim_sim::fault::FaultKind::Crash;
        EventKind::FaultStart { id: 0, fault, target: target.into(), detail: String::new() }
    }
}
