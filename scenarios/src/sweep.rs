//! Many seeds of one scenario, in parallel, and whether the results meet the scenario's expectation.
//!
//! Seeds are independent, so `--jobs` only changes how fast results arrive: results are kept in seed
//! order and everything printed or saved from them is the same at any `--jobs`. For the same reason a
//! sweep splits into shards (contiguous parts of the seed range, one per CI job), and [`merge`] puts
//! the shards' results back together into what one unsharded sweep gives.

use crate::checkers::FindingKind;
use crate::run::{run_seed, HarnessError, SeedResult};
use crate::scenario::{Expect, Scenario, Verdict};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The results of one scenario over a range of seeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub path: String,
    pub recipe: String,
    /// The kinds of fault it injects, scheduled or drawn (empty: none), for the safety matrix.
    pub fault_kinds: Vec<String>,
    /// `counter` or `flash-sale`.
    pub workload: String,
    pub clients: usize,
    /// Simulated seconds each seed runs.
    pub duration_s: f64,
    pub seeds: Range<u64>,
    pub expect: Expect,
    /// Did the seeds meet the expectation?
    pub as_expected: bool,
    /// Why not (or, when met, what met it), one line each.
    pub reasons: Vec<String>,
    /// The seed that best shows what happened: the first unexpected one, or the first unsafe one.
    pub example_seed: Option<u64>,
    pub unsafe_seeds: u64,
    /// Measurements over all seeds.
    pub summary: Summary,
    pub results: Vec<SeedResult>,
    /// Which part of a sharded sweep this is (`None`: the whole of `seeds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

/// Part `index` (from 1) of `count` of the seed range `of`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
    pub of: Range<u64>,
}

/// Measurements aggregated over the seeds of a sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub acquisitions_per_seed: f64,
    /// The median over seeds of each seed's p50, and the largest p99 of any seed (simulated ms).
    pub latency_ms_p50: f64,
    pub latency_ms_p99_max: f64,
    pub messages_per_acquisition: f64,
    /// Time from a holder's crash to the next grant, over every such crash: min, median, max (ms).
    pub recovery_ms: Option<(f64, f64, f64)>,
    pub recoveries: u64,
    pub unrecovered: u64,
}

fn summarise(results: &[SeedResult]) -> Summary {
    if results.is_empty() {
        return Summary::default();
    }
    let n = results.len() as f64;
    let m = |r: &SeedResult| r.measurements.clone();
    let mut p50: Vec<f64> = results.iter().map(|r| m(r).latency_ms_p50).collect();
    p50.sort_by(f64::total_cmp);
    let mut recoveries: Vec<f64> = results.iter().flat_map(|r| m(r).recovery_ms).collect();
    recoveries.sort_by(f64::total_cmp);
    let acquisitions: u64 = results.iter().map(|r| r.measurements.acquisitions).sum();
    let messages: u64 = results.iter().map(|r| r.measurements.messages).sum();
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Summary {
        acquisitions_per_seed: round(acquisitions as f64 / n),
        latency_ms_p50: p50[p50.len() / 2],
        latency_ms_p99_max: results.iter().map(|r| r.measurements.latency_ms_p99).fold(0.0, f64::max),
        messages_per_acquisition: if acquisitions == 0 { 0.0 } else { round(messages as f64 / acquisitions as f64) },
        recovery_ms: (!recoveries.is_empty())
            .then(|| (recoveries[0], recoveries[recoveries.len() / 2], recoveries[recoveries.len() - 1])),
        recoveries: recoveries.len() as u64,
        unrecovered: results.iter().map(|r| r.measurements.unrecovered).sum(),
    }
}

/// Run `seeds` of `scenario` on `jobs` threads; `progress` is called once per finished seed.
pub fn sweep(
    scenario: &Scenario,
    seeds: Range<u64>,
    jobs: usize,
    progress: &(dyn Fn() + Sync),
) -> Result<ScenarioResult, HarnessError> {
    // Claimed one by one, never past the end: a shared counter that ran on would wrap at u64::MAX.
    let next = AtomicU64::new(seeds.start);
    let results: Mutex<Vec<Result<SeedResult, HarnessError>>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let claim = next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| (s < seeds.end).then(|| s + 1));
                let Ok(seed) = claim else { return };
                let result = run_seed(scenario, seed).map(|run| run.result);
                results.lock().expect("results lock").push(result);
                progress();
            });
        }
    });
    let mut results = results.into_inner().expect("results lock").into_iter().collect::<Result<Vec<_>, _>>()?;
    results.sort_by_key(|r| r.seed);
    Ok(judge(Meta::of(scenario), seeds, results))
}

/// Shard `shard` (1-based) of `shards` of a seed range: its contiguous part, possibly empty.
pub fn shard_of(seeds: Range<u64>, shard: u64, shards: u64) -> Range<u64> {
    let chunk = (seeds.end - seeds.start).div_ceil(shards);
    let start = seeds.start.saturating_add((shard - 1).saturating_mul(chunk)).min(seeds.end);
    start..start.saturating_add(chunk).min(seeds.end)
}

/// What a result says about its scenario, besides the seeds.
pub struct Meta {
    pub scenario: String,
    pub path: String,
    pub recipe: String,
    pub fault_kinds: Vec<String>,
    pub workload: String,
    pub clients: usize,
    pub duration_s: f64,
    pub expect: Expect,
}

impl Meta {
    pub fn of(s: &Scenario) -> Meta {
        let mut kinds: Vec<String> = s.schedule.iter().map(|f| f.action.kind().name().to_string()).collect();
        kinds.extend(s.random.iter().flat_map(|r| r.kinds.iter().map(|k| k.name().to_string())));
        kinds.sort();
        kinds.dedup();
        Meta {
            scenario: s.name.clone(),
            path: s.path.clone(),
            recipe: s.recipe.id.to_string(),
            fault_kinds: kinds,
            workload: if s.workload.stock.is_some() { "flash-sale" } else { "counter" }.to_string(),
            clients: s.workload.clients,
            duration_s: s.workload.duration.as_secs_f64(),
            expect: s.expect.clone(),
        }
    }

    fn of_result(r: &ScenarioResult) -> Meta {
        Meta {
            scenario: r.scenario.clone(),
            path: r.path.clone(),
            recipe: r.recipe.clone(),
            fault_kinds: r.fault_kinds.clone(),
            workload: r.workload.clone(),
            clients: r.clients,
            duration_s: r.duration_s,
            expect: r.expect.clone(),
        }
    }
}

/// The parts of one scenario's sweep (same scenario, path and expectation), as one sweep: its seeds
/// the union of theirs, judged again as a whole. Refused, naming what is wrong, when the parts cannot
/// stand for one sweep: shards of one split missing or given twice, or seeds that leave a gap — a
/// merged result must never claim seeds that were not run. Unsharded runs may overlap (a seed's result
/// is the same in every run).
pub fn merge(parts: Vec<ScenarioResult>) -> Result<ScenarioResult, String> {
    let meta = Meta::of_result(&parts[0]);
    let name = meta.scenario.clone();
    check_shards(&name, &parts)?;
    let mut ranges: Vec<Range<u64>> = parts.iter().map(|p| p.seeds.clone()).filter(|r| !r.is_empty()).collect();
    ranges.sort_by_key(|r| (r.start, r.end));
    let (start, mut end) = ranges.first().map_or((0, 0), |r| (r.start, r.end));
    for r in &ranges[1..] {
        if r.start > end {
            return Err(format!(
                "{name}: seeds {}..{} were not run (the results given cover {})",
                end,
                r.start,
                show(&ranges)
            ));
        }
        end = end.max(r.end);
    }
    let mut results: Vec<SeedResult> = parts.into_iter().flat_map(|p| p.results).collect();
    results.sort_by_key(|r| r.seed);
    results.dedup_by_key(|r| r.seed);
    Ok(judge(meta, start..end, results))
}

fn show(ranges: &[Range<u64>]) -> String {
    ranges.iter().map(|r| format!("{}..{}", r.start, r.end)).collect::<Vec<_>>().join(", ")
}

/// Shards of one split must all be there, once each.
fn check_shards(name: &str, parts: &[ScenarioResult]) -> Result<(), String> {
    let mut splits: std::collections::BTreeMap<(u64, u64, u64), Vec<u64>> = Default::default();
    for s in parts.iter().filter_map(|p| p.shard.as_ref()) {
        splits.entry((s.of.start, s.of.end, s.count)).or_default().push(s.index);
    }
    for ((start, end, count), mut got) in splits {
        got.sort_unstable();
        if let Some(twice) = got.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("{name}: shard {}/{count} of seeds {start}..{end} is given twice", twice[0]));
        }
        let missing: Vec<String> = (1..=count)
            .filter(|i| !got.contains(i))
            .map(|i| {
                let seeds = shard_of(start..end, i, count);
                format!("{i}/{count} (seeds {}..{})", seeds.start, seeds.end)
            })
            .collect();
        if !missing.is_empty() {
            return Err(format!("{name}: missing shards of seeds {start}..{end}: {}", missing.join(", ")));
        }
    }
    Ok(())
}

/// Compare seed results with the scenario's `[expect]`.
pub fn judge(meta: Meta, seeds: Range<u64>, results: Vec<SeedResult>) -> ScenarioResult {
    let expect = &meta.expect;
    let has = |r: &SeedResult, k: FindingKind| r.counts.contains_key(&k);
    let first_with = |k: FindingKind| results.iter().find(|r| has(r, k)).map(|r| r.seed);
    let first_unsafe = results.iter().find(|r| r.verdict == Verdict::Unsafe).map(|r| r.seed);
    let mut reasons = Vec::new();
    let mut unexpected_seed = None;
    let mut flag = |why: String, seed: Option<u64>| {
        reasons.push(why);
        unexpected_seed = unexpected_seed.or(seed);
    };
    match expect.verdict {
        Verdict::Safe => {
            if let Some(seed) = first_unsafe {
                let kinds = results.iter().filter(|r| r.verdict == Verdict::Unsafe).flat_map(|r| r.counts.keys());
                let mut kinds: Vec<&str> = kinds.filter(|k| k.is_violation()).map(|k| k.name()).collect();
                kinds.sort_unstable();
                kinds.dedup();
                flag(format!("expected safe, but some seeds found {}", kinds.join(", ")), Some(seed));
            }
        }
        Verdict::Unsafe => {
            // A fault test whose faults never took effect must not pass for the wrong reason, nor fail
            // without saying why.
            let never = !results.is_empty()
                && results.iter().all(|r| !r.schedule.is_empty() && r.faults_skipped == r.schedule.len() as u64);
            if first_unsafe.is_none() && never {
                flag(
                    "expected unsafe, but every seed was safe: every fault of every seed was skipped when due".into(),
                    None,
                );
            } else if first_unsafe.is_none() {
                flag("expected unsafe, but every seed was safe".into(), None);
            }
        }
    }
    for kind in &expect.findings {
        if first_with(*kind).is_none() {
            flag(format!("expected {}, but no seed found it", kind.name()), None);
        }
    }
    for kind in &expect.absent {
        if let Some(seed) = first_with(*kind) {
            flag(format!("expected no {}, but seed {seed} found it", kind.name()), Some(seed));
        }
    }
    let as_expected = reasons.is_empty();
    let example_seed = unexpected_seed.or(first_unsafe);
    let unsafe_seeds = results.iter().filter(|r| r.verdict == Verdict::Unsafe).count() as u64;
    ScenarioResult {
        expect: meta.expect.clone(),
        scenario: meta.scenario,
        path: meta.path,
        recipe: meta.recipe,
        fault_kinds: meta.fault_kinds,
        workload: meta.workload,
        clients: meta.clients,
        duration_s: meta.duration_s,
        seeds,
        as_expected,
        reasons,
        example_seed,
        unsafe_seeds,
        summary: summarise(&results),
        results,
        shard: None,
    }
}
