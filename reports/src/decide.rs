//! The decision table the report opens with: one row per lock variant (recipe + what sets it apart, see
//! `locksim_scenarios::variant`), its worst violation across the faults it ran, its herd, its recovery
//! after a crash, its speed without faults, and a verdict derived from those numbers.
//!
//! Runs of different variants are never added up: a broken variant and its fix must stay side by side.

use locksim_scenarios::checkers::FindingKind;
use locksim_scenarios::rate::Rate;
use locksim_scenarios::run::SeedResult;
use locksim_scenarios::sweep::ScenarioResult;
use std::collections::BTreeMap;

/// How the report names a run's lock: `redis.set-nx-px (release=del, ttl=5s)`; real runs say so.
pub fn lock_name(run: &ScenarioResult) -> String {
    let mut name = run.recipe.clone();
    if !run.variant.is_empty() {
        name = format!("{name} ({})", run.variant);
    }
    if run.real {
        name.push_str(" [real]");
    }
    name
}

/// How a run's faults are named: "none", a kind or a few, or a nemesis of many kinds.
pub fn fault_label(run: &ScenarioResult) -> String {
    match run.fault_kinds.as_slice() {
        [] => "none".into(),
        kinds if kinds.len() <= 3 => kinds.join("+"),
        kinds => format!("nemesis of {} kinds", kinds.len()),
    }
}

fn fenced(run: &ScenarioResult) -> bool {
    run.variant.split(", ").any(|p| p == "fencing")
}

/// Whether a seed's lock failed at its job. With fencing, two holders are what fencing exists for: the
/// resource refused the stale one, so only the damage (unsafe writes, oversells, lost updates) counts.
pub fn broke(run: &ScenarioResult, seed: &SeedResult) -> bool {
    seed.counts.keys().any(|k| match k {
        FindingKind::DoubleHolder => !fenced(run),
        k => breaks_the_lock(*k),
    })
}

/// What counts as a broken lock: anything but the service findings (herd, unfairness, starvation) and
/// refused stale writes.
pub fn breaks_the_lock(kind: FindingKind) -> bool {
    !matches!(kind, FindingKind::StaleWriteRejected) && !is_service(kind)
}

/// Findings about the service a lock gives rather than its safety.
pub fn is_service(kind: FindingKind) -> bool {
    matches!(kind, FindingKind::Herd | FindingKind::Unfair | FindingKind::Starvation)
}

/// Whether a seed tested its lock under the run's faults: a seed whose every fault was skipped when due
/// ran without one, and says nothing of the lock under it — unless the lock broke anyway.
pub fn tested(run: &ScenarioResult, seed: &SeedResult) -> bool {
    run.fault_kinds.is_empty() || seed.fault_fired() || broke(run, seed)
}

/// Seeds of `run` whose lock broke, of the seeds that tested it (see [`tested`]), as a rate.
pub fn broken_rate(run: &ScenarioResult) -> Rate {
    let tested: Vec<&SeedResult> = run.results.iter().filter(|s| tested(run, s)).collect();
    Rate::of(tested.iter().filter(|s| broke(run, s)).count() as u64, tested.len() as u64)
}

/// One row of the decision table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub lock: String,
    pub recipe: String,
    /// The resource refuses stale tokens (`fencing = true`).
    pub fenced: bool,
    /// The faults (as [`fault_label`]) with the highest rate of broken seeds, and that rate; with no
    /// violation anywhere, the run whose bound is the weakest (fewest seeds).
    pub worst: (String, Rate),
    /// The fault labels under which some seed broke, in order.
    pub broke_under: Vec<String>,
    /// The fault labels it ran under, in some seed of which a fault fired.
    pub faults: Vec<String>,
    /// The fault labels it ran under with no fault firing in any seed: untested, never "safe under".
    pub untested: Vec<String>,
    /// Service findings over every seed of the variant: kind and how many seeds of how many.
    pub service: Vec<(FindingKind, Rate)>,
    /// Without faults, at the most clients run: clients woken per release (mean over seeds), waiters.
    pub herd: Option<(f64, usize)>,
    /// Holder crash to the next grant over every crash (median, max ms), and crashes never recovered.
    pub recovery: Option<(f64, f64, u64)>,
    pub speed: Option<Speed>,
    pub verdict: String,
}

/// Latency and throughput without faults, from flash sales where the variant ran one (the same work
/// for every lock), else counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Speed {
    pub workload: String,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    /// Acquisitions of attempts: a lock that fails fast is fast only for the attempts it grants.
    pub granted: Option<Rate>,
    pub per_second: f64,
}

/// The table: one row per simulated variant, in name order.
pub fn rows(runs: &[ScenarioResult]) -> Vec<Row> {
    let mut by_lock: BTreeMap<String, Vec<&ScenarioResult>> = BTreeMap::new();
    for run in runs.iter().filter(|r| !r.real && !r.results.is_empty()) {
        by_lock.entry(lock_name(run)).or_default().push(run);
    }
    let mut rows: Vec<Row> = by_lock.into_iter().map(|(lock, runs)| row(lock, &runs)).collect();
    let verdicts: Vec<String> = rows.iter().map(|r| verdict(r, &rows)).collect();
    for (row, verdict) in rows.iter_mut().zip(verdicts) {
        row.verdict = verdict;
    }
    rows
}

fn row(lock: String, runs: &[&ScenarioResult]) -> Row {
    let mut per_fault: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for run in runs {
        let rate = broken_rate(run);
        let cell = per_fault.entry(fault_label(run)).or_default();
        *cell = (cell.0 + rate.k, cell.1 + rate.n);
    }
    // A fault label none of whose seeds tested the lock is untested, not "safe under" it.
    let untested: Vec<String> = per_fault.iter().filter(|(_, (_, n))| *n == 0).map(|(f, _)| f.clone()).collect();
    let rates: Vec<(String, Rate)> =
        per_fault.into_iter().filter(|(_, (_, n))| *n > 0).map(|(f, (k, n))| (f, Rate::of(k, n))).collect();
    let worst = rates
        .iter()
        .max_by(|a, b| (a.1.value(), a.1.high).partial_cmp(&(b.1.value(), b.1.high)).expect("rates are numbers"))
        .cloned()
        .unwrap_or_else(|| (untested[0].clone(), Rate::of(0, 0)));
    let seeds: Vec<&SeedResult> = runs.iter().flat_map(|r| &r.results).collect();
    let service = FindingKind::ALL
        .into_iter()
        .filter(|k| is_service(*k))
        .map(|k| (k, Rate::of(seeds.iter().filter(|s| s.counts.contains_key(&k)).count() as u64, seeds.len() as u64)))
        .filter(|(_, rate)| rate.k > 0)
        .collect();
    Row {
        lock,
        recipe: runs[0].recipe.clone(),
        fenced: fenced(runs[0]),
        worst,
        broke_under: rates.iter().filter(|(_, r)| r.k > 0).map(|(f, _)| f.clone()).collect(),
        faults: rates.iter().map(|(f, _)| f.clone()).collect(),
        untested,
        service,
        herd: herd(runs),
        recovery: recovery(runs),
        speed: speed(runs),
        verdict: String::new(),
    }
}

fn herd(runs: &[&ScenarioResult]) -> Option<(f64, usize)> {
    let widest = runs.iter().filter(|r| r.fault_kinds.is_empty()).max_by_key(|r| r.clients)?;
    let woken: u64 = widest.results.iter().map(|s| s.measurements.notifications_per_release_max).sum();
    Some((woken as f64 / widest.results.len() as f64, widest.clients - 1))
}

fn recovery(runs: &[&ScenarioResult]) -> Option<(f64, f64, u64)> {
    let crashed = || runs.iter().flat_map(|r| &r.results).map(|s| &s.measurements);
    let mut times: Vec<f64> = crashed().flat_map(|m| m.recovery_ms.iter().copied()).collect();
    let unrecovered = crashed().map(|m| m.unrecovered).sum();
    if times.is_empty() && unrecovered == 0 {
        return None;
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len().saturating_sub(1) / 2).copied().unwrap_or(f64::NAN);
    Some((median, times.last().copied().unwrap_or(f64::NAN), unrecovered))
}

fn speed(runs: &[&ScenarioResult]) -> Option<Speed> {
    let quiet = |w: &str| runs.iter().copied().find(|r| r.fault_kinds.is_empty() && r.workload == w);
    let run = quiet("flash-sale").or_else(|| quiet("counter"))?;
    let m = || run.results.iter().map(|s| &s.measurements);
    let (acquisitions, attempts) = (m().map(|m| m.acquisitions).sum::<u64>(), m().map(|m| m.attempts).sum::<u64>());
    let busy_s = m().map(|m| m.busy_ms).sum::<f64>() / 1000.0;
    Some(Speed {
        workload: run.workload.clone(),
        latency_ms_p50: run.summary.latency_ms_p50,
        latency_ms_p99: run.summary.latency_ms_p99_max,
        // Results written before attempts were counted have none: then the share is unknown.
        granted: (attempts >= acquisitions && attempts > 0).then(|| Rate::of(acquisitions, attempts)),
        per_second: acquisitions as f64 / busy_s.max(1e-9),
    })
}

/// Faults in words: `pause+crash` → "pauses and crashes".
fn in_words(label: &str) -> String {
    if label.starts_with("nemesis") {
        return format!("a {label}");
    }
    let word = |kind| match kind {
        "pause" => "pauses",
        "crash" => "crashes",
        "host-crash" => "host crashes",
        "restart" => "restarts",
        "partition" => "partitions",
        "clog" => "one-way cuts",
        "delay" => "delays",
        "loss" => "message loss",
        "drop-reply" => "lost replies",
        "clock-jump" => "clock jumps",
        "clock-drift" => "clock drift",
        "failover" => "failovers",
        other => other,
    };
    label.split('+').map(word).collect::<Vec<_>>().join(" and ")
}

/// One line from the numbers: what broke it, and whether another variant of its recipe held under the
/// same faults (fencing first, as the usual fix).
fn verdict(row: &Row, all: &[Row]) -> String {
    let untested = match row.untested.as_slice() {
        [] => String::new(),
        faults => format!(
            "; untested under {} (no fault fired)",
            faults.iter().map(|f| in_words(f)).collect::<Vec<_>>().join(", ")
        ),
    };
    if row.broke_under.is_empty() {
        let ran: Vec<String> =
            row.faults.iter().map(|f| if f == "none" { "no faults".into() } else { in_words(f) }).collect();
        let mut line = match ran.is_empty() {
            true => "untested: no fault fired in any seed".to_string(),
            false => format!("safe under {}{untested}", ran.join(", ")),
        };
        for (kind, rate) in &row.service {
            line.push_str(&format!("; {} in {}/{} seeds", kind.name(), rate.k, rate.n));
        }
        return line;
    }
    let mut line = match row.broke_under.iter().any(|f| f == "none") {
        true => "unsafe even without faults".to_string(),
        false => format!("unsafe under {}", row.broke_under.iter().map(|f| in_words(f)).collect::<Vec<_>>().join(", ")),
    };
    let holds = |other: &&Row| {
        other.recipe == row.recipe
            && other.lock != row.lock
            && row.broke_under.iter().all(|f| other.faults.contains(f) && !other.broke_under.contains(f))
    };
    let fixes: Vec<&Row> = all.iter().filter(holds).collect();
    match fixes.iter().find(|r| r.fenced) {
        Some(_) if !row.fenced => line.push_str("; fence it (the fenced variant holds)"),
        _ => match fixes.first() {
            Some(fix) => line.push_str(&format!("; {} holds", fix.lock)),
            None => line.push_str(&partly_fenced(row, all)),
        },
    }
    line + &untested
}

/// When no variant held under every fault that broke `row`: a clean fenced variant that ran some of them,
/// naming those it held under and those it never ran (a gap in the catalog, not a proof either way).
fn partly_fenced(row: &Row, all: &[Row]) -> String {
    let ran = |other: &Row, f: &String| other.faults.contains(f);
    let fenced = all.iter().find(|o| {
        o.recipe == row.recipe
            && o.fenced
            && !row.fenced
            && o.broke_under.is_empty()
            && row.broke_under.iter().any(|f| ran(o, f))
    });
    let Some(fenced) = fenced else { return "; no variant here holds under them".into() };
    let (held, untried): (Vec<&String>, Vec<&String>) = row.broke_under.iter().partition(|f| ran(fenced, f));
    let words = |fs: Vec<&String>| fs.into_iter().map(|f| in_words(f)).collect::<Vec<_>>().join(", ");
    format!("; fenced, it holds under {} (not run under {})", words(held), words(untried))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use locksim_scenarios::checkers::Measurements;
    use locksim_scenarios::scenario::{Expect, Verdict};
    use locksim_scenarios::sweep::Summary;

    fn seed(seed: u64, kinds: Vec<FindingKind>) -> SeedResult {
        SeedResult {
            seed,
            verdict: if kinds.is_empty() { Verdict::Safe } else { Verdict::Unsafe },
            counts: kinds.iter().map(|k| (*k, 1)).collect(),
            findings: vec![],
            measurements: Measurements::default(),
            history_hash: String::new(),
            schedule: vec![],
            faults_skipped: 0,
            hazards: BTreeMap::new(),
        }
    }

    /// `bad` of `n` seeds with `kind`, of `recipe (variant)` under `faults`.
    pub(crate) fn run(variant: &str, faults: &[&str], bad: u64, n: u64, kind: FindingKind) -> ScenarioResult {
        ScenarioResult {
            scenario: format!("{variant}-{}", faults.join("+")),
            path: String::new(),
            recipe: "redis.set-nx-px".into(),
            variant: variant.into(),
            fault_kinds: faults.iter().map(|f| f.to_string()).collect(),
            workload: "counter".into(),
            clients: 3,
            duration_s: 60.0,
            seeds: 0..n,
            expect: Expect { verdict: Verdict::Safe, findings: vec![], absent: vec![], hazards: vec![] },
            as_expected: true,
            reasons: vec![],
            example_seed: None,
            unsafe_seeds: bad,
            unsafe_rate: locksim_scenarios::rate::Rate::of(bad, n),
            seeds_with: BTreeMap::new(),
            rate_with: BTreeMap::new(),
            seeds_with_hazard: BTreeMap::new(),
            hazard_counts: BTreeMap::new(),
            to_violation: None,
            summary: Summary::default(),
            results: (0..n)
                .map(|s| SeedResult {
                    // Each seed's one fault fired (see `fired` for seeds that skipped theirs).
                    schedule: faults.iter().take(1).map(|f| format!("at 5s {f} holder")).collect(),
                    ..seed(s, if s < bad { vec![kind] } else { vec![] })
                })
                .collect(),
            shard: None,
            real: false,
            fault_coverage: None,
        }
    }

    #[test]
    fn a_row_per_variant_never_pooling_a_broken_one_with_its_fix() {
        let runs = [
            run("release=del", &["pause"], 16, 20, FindingKind::DoubleHolder),
            run("", &["pause"], 12, 20, FindingKind::DoubleHolder),
            // Fenced: two holders, but the resource refused the stale writes.
            run("fencing", &["pause"], 20, 20, FindingKind::DoubleHolder),
        ];
        let rows = rows(&runs);
        let names: Vec<&str> = rows.iter().map(|r| r.lock.as_str()).collect();
        assert_eq!(names, ["redis.set-nx-px", "redis.set-nx-px (fencing)", "redis.set-nx-px (release=del)"]);
        let worst: Vec<(u64, u64)> = rows.iter().map(|r| (r.worst.1.k, r.worst.1.n)).collect();
        assert_eq!(worst, [(12, 20), (0, 20), (16, 20)]);
        assert_eq!(rows[2].verdict, "unsafe under pauses; fence it (the fenced variant holds)");
        assert_eq!(rows[1].verdict, "safe under pauses");
    }

    #[test]
    fn the_verdict_names_what_broke_it_and_what_holds_or_that_nothing_does() {
        let runs = [
            run("", &[], 3, 20, FindingKind::UnsafeWrite),
            run("", &["crash", "pause"], 5, 20, FindingKind::UnsafeWrite),
            run("ttl=30s", &["crash", "pause"], 0, 20, FindingKind::UnsafeWrite),
        ];
        let rows = rows(&runs);
        assert_eq!(rows[0].broke_under, ["crash+pause", "none"]);
        assert_eq!(rows[0].verdict, "unsafe even without faults; no variant here holds under them");
        assert_eq!(rows[0].worst.0, "crash+pause", "5/20 is worse than 3/20");
        let runs = [runs[1].clone(), runs[2].clone()];
        let rows = super::rows(&runs);
        assert_eq!(rows[0].verdict, "unsafe under crashes and pauses; redis.set-nx-px (ttl=30s) holds");
        let runs = [
            run("", &["partition"], 5, 20, FindingKind::DoubleHolder),
            run("", &["pause"], 5, 20, FindingKind::DoubleHolder),
            run("fencing", &["pause"], 20, 20, FindingKind::DoubleHolder),
        ];
        let rows = super::rows(&runs);
        assert_eq!(
            rows[0].verdict,
            "unsafe under partitions, pauses; fenced, it holds under pauses (not run under partitions)"
        );
    }

    #[test]
    fn service_findings_do_not_break_a_lock_but_are_named() {
        let rows = rows(&[run("", &[], 4, 10, FindingKind::Herd)]);
        assert!(rows[0].broke_under.is_empty());
        assert_eq!(rows[0].verdict, "safe under no faults; herd in 4/10 seeds");
        assert_eq!(rows[0].service, [(FindingKind::Herd, Rate::of(4, 10))]);
    }

    /// `run` whose first `fired` seeds' one fault started and the rest's was skipped when due.
    fn fired(mut run: ScenarioResult, fired: u64) -> ScenarioResult {
        for s in &mut run.results {
            s.schedule = vec!["at 5s pause holder for 8s".into()];
            s.faults_skipped = u64::from(s.seed >= fired);
        }
        run
    }

    #[test]
    fn safe_under_a_fault_counts_only_seeds_whose_fault_fired() {
        // A DEL-released lock whose pause never found a holder is not "safe under pauses".
        let rows = rows(&[fired(run("release=del", &["pause"], 0, 20, FindingKind::DoubleHolder), 0)]);
        assert_eq!(rows[0].verdict, "untested: no fault fired in any seed");
        assert_eq!(rows[0].untested, ["pause"]);
        // 5 seeds of 20 bit: the bound is over those 5.
        let rows = super::rows(&[fired(run("", &["pause"], 0, 20, FindingKind::DoubleHolder), 5)]);
        assert_eq!(rows[0].verdict, "safe under pauses");
        assert_eq!((rows[0].worst.1.k, rows[0].worst.1.n), (0, 5));
        // A seed that broke without its fault still counts: the lock broke.
        let rows = super::rows(&[fired(run("", &["pause"], 3, 20, FindingKind::DoubleHolder), 0)]);
        assert_eq!((rows[0].worst.1.k, rows[0].worst.1.n), (3, 3));
        // Tested under one fault kind, not the other.
        let rows = super::rows(&[
            run("", &["crash"], 0, 20, FindingKind::DoubleHolder),
            fired(run("", &["pause"], 0, 20, FindingKind::DoubleHolder), 0),
        ]);
        assert_eq!(rows[0].verdict, "safe under crashes; untested under pauses (no fault fired)");
    }

    #[test]
    fn the_lock_breaks_on_everything_but_service_findings_and_refused_stale_writes() {
        let broken: Vec<&str> =
            FindingKind::ALL.into_iter().filter(|k| breaks_the_lock(*k)).map(|k| k.name()).collect();
        assert_eq!(broken, ["double-holder", "unsafe-write", "deadlock", "oversell", "lost-update", "invariant"]);
    }
}
