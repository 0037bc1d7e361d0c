//! Many seeds of one scenario, in parallel, and whether the results meet the scenario's expectation.
//!
//! Seeds are independent, so `--jobs` only changes how fast results arrive: results are kept in seed
//! order and everything printed or saved from them is the same at any `--jobs`. For the same reason a
//! sweep splits into shards (contiguous parts of the seed range, one per CI job), and [`merge`] puts
//! the shards' results back together into what one unsharded sweep gives.

use crate::checkers::FindingKind;
use crate::distribution::Distribution;
use crate::rate::Rate;
use crate::reason::Reason;
use crate::run::{run_seed, HarnessError, SeedResult};
use crate::scenario::{Expect, Scenario, Verdict};
use crate::to_violation::{Gaps, ToViolation};
use locksim_sim::hazard::{add_counts, Hazard, HazardCounts};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Condvar, Mutex};

/// The results of one scenario over a range of seeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub path: String,
    pub recipe: String,
    /// What sets this scenario's lock apart from the recipe as it ships (see [`crate::variant`]), so that
    /// the report never adds a broken variant's seeds to its fix's; empty in results written before it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
    /// The kinds of fault it injects, scheduled or drawn (empty: none), for the safety matrix.
    pub fault_kinds: Vec<String>,
    /// `counter`, `flash-sale`, or a user's workload id.
    pub workload: String,
    pub clients: usize,
    /// Simulated seconds each seed runs.
    pub duration_s: f64,
    pub seeds: Range<u64>,
    pub expect: Expect,
    /// Did the seeds meet the expectation?
    pub as_expected: bool,
    /// Why not, one line each.
    pub reasons: Vec<Reason>,
    /// The seed that best shows what happened: the first unexpected one, or the first unsafe one.
    pub example_seed: Option<u64>,
    pub unsafe_seeds: u64,
    /// How many seeds found each kind of finding.
    #[serde(default)]
    pub seeds_with: BTreeMap<FindingKind, u64>,
    /// `unsafe_seeds` of the seeds, as a rate with its 95% interval. Derived from the counts, never
    /// added up: [`merge`] judges the seeds again, and files written before rates existed get them from
    /// [`ScenarioResult::with_rates`] on read.
    #[serde(default = "unknown_rate")]
    pub unsafe_rate: Rate,
    /// `seeds_with` as rates.
    #[serde(default)]
    pub rate_with: BTreeMap<FindingKind, Rate>,
    /// How many seeds reached each hazard, and how often in all (empty in results written before
    /// hazards were counted).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seeds_with_hazard: BTreeMap<Hazard, u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hazard_counts: HazardCounts,
    /// How many seeds it took to find a violation (`None`: no unsafe seed, or results written before
    /// it was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_violation: Option<ToViolation>,
    /// How many seeds' faults took effect (`None`: the scenario injects none, or results written before
    /// coverage was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_coverage: Option<FaultCoverage>,
    /// Measurements over all seeds.
    pub summary: Summary,
    /// Every seed's result, in seed order (empty when the sweep did not keep them: see [`sweep_each`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<SeedResult>,
    /// Which part of a sharded sweep this is (`None`: the whole of `seeds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Real runs on real servers (`run --real`), not simulated seeds: each seed only drew the run's
    /// hold and think times, and replays nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub real: bool,
}

/// What a results file without rates says of them until [`ScenarioResult::with_rates`] computes them.
fn unknown_rate() -> Rate {
    Rate::of(0, 0)
}

/// The rates of `unsafe_seeds` and of each finding kind's seeds, of `n` seeds.
fn rates(n: u64, unsafe_seeds: u64, seeds_with: &BTreeMap<FindingKind, u64>) -> (Rate, BTreeMap<FindingKind, Rate>) {
    (Rate::of(unsafe_seeds, n), seeds_with.iter().map(|(kind, k)| (*kind, Rate::of(*k, n))).collect())
}

impl ScenarioResult {
    /// The result with its rates computed again from its counts over its seed range, as read from a
    /// results file (which may predate rates, or have been edited).
    pub fn with_rates(mut self) -> ScenarioResult {
        (self.unsafe_rate, self.rate_with) =
            rates(self.seeds.end - self.seeds.start, self.unsafe_seeds, &self.seeds_with);
        self
    }
}

/// Whether a fault test happened: a fault skipped when due (nobody holding, a trigger never reached,
/// its node already down) tests nothing, and a verdict over seeds whose faults all went that way is no
/// verdict at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCoverage {
    /// Seeds judged.
    pub seeds: u64,
    /// Seeds in which at least one fault started.
    pub seeds_fired: u64,
    /// Faults scheduled or drawn, over every seed.
    pub faults: u64,
    /// Of those, the faults that started.
    pub faults_fired: u64,
}

impl FaultCoverage {
    fn add(&mut self, r: &SeedResult) {
        self.seeds += 1;
        self.seeds_fired += u64::from(r.fault_fired());
        self.faults += r.schedule.len() as u64;
        self.faults_fired += r.faults_fired();
    }

    /// Every seed had a fault that fired.
    pub fn complete(&self) -> bool {
        self.seeds_fired == self.seeds
    }
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

/// Run `seeds` of `scenario` on `jobs` threads and keep every seed's result in `results`;
/// `progress` is called once per finished seed. For a long sweep use [`sweep_each`], which keeps none.
pub fn sweep(
    scenario: &Scenario,
    seeds: Range<u64>,
    jobs: usize,
    progress: &(dyn Fn() + Sync),
) -> Result<ScenarioResult, HarnessError> {
    let mut results = Vec::new();
    let mut result = sweep_each(scenario, seeds, jobs, progress, |r| {
        results.push(r);
        Ok::<(), HarnessError>(())
    })?;
    result.results = results;
    Ok(result)
}

/// How many seeds past the oldest unfinished one a job may start: the bound on results waiting to be
/// handed on in seed order (a seed that runs long holds the others back rather than letting them pile up).
pub const AHEAD_PER_JOB: u64 = 32;

/// Run `seeds` of `scenario` on `jobs` threads, handing each seed's result to `each` in seed order
/// (whatever `jobs` is) and keeping only the running judgement: memory stays flat however many seeds
/// run. The result's `results` is empty. The first failure in seed order — a seed the simulation could
/// not run, or an error from `each` — stops the sweep and is returned.
pub fn sweep_each<E: From<HarnessError>>(
    scenario: &Scenario,
    seeds: Range<u64>,
    jobs: usize,
    progress: &(dyn Fn() + Sync),
    mut each: impl FnMut(SeedResult) -> Result<(), E>,
) -> Result<ScenarioResult, E> {
    let jobs = jobs.max(1);
    let ahead = AHEAD_PER_JOB * jobs as u64;
    let flow = Mutex::new(Flow { next_claim: seeds.start, next_out: seeds.start, done: BTreeMap::new(), stop: false });
    let changed = Condvar::new();
    let mut judge = Judge::new(Meta::of(scenario), seeds.clone());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                while let Some(seed) = claim(&flow, &changed, seeds.end, ahead) {
                    let result = run_seed(scenario, seed).map(|run| run.result);
                    progress();
                    flow.lock().expect("sweep lock").done.insert(seed, result);
                    changed.notify_all();
                }
            });
        }
        let outcome = (|| -> Result<(), E> {
            while let Some(result) = next_in_order(&flow, &changed, seeds.end) {
                let result = result?;
                judge.add(&result);
                each(result)?;
            }
            Ok(())
        })();
        flow.lock().expect("sweep lock").stop = true;
        changed.notify_all();
        outcome
    })?;
    Ok(judge.finish())
}

/// The state the jobs of a sweep share.
struct Flow {
    /// The next seed to start.
    next_claim: u64,
    /// The next seed to hand on; every seed before it has been.
    next_out: u64,
    /// Finished seeds not yet handed on.
    done: BTreeMap<u64, Result<SeedResult, HarnessError>>,
    stop: bool,
}

/// The next seed for a job to run, waiting while it would run too far ahead; `None` when there are no
/// more. Claimed one by one, never past the end: a counter that ran on would wrap at `u64::MAX`.
fn claim(flow: &Mutex<Flow>, changed: &Condvar, end: u64, ahead: u64) -> Option<u64> {
    let mut f = flow.lock().expect("sweep lock");
    loop {
        if f.stop || f.next_claim >= end {
            return None;
        }
        if f.next_claim - f.next_out < ahead {
            f.next_claim += 1;
            return Some(f.next_claim - 1);
        }
        f = changed.wait(f).expect("sweep lock");
    }
}

/// The next seed's result in seed order, once it is done; `None` after the last.
fn next_in_order(flow: &Mutex<Flow>, changed: &Condvar, end: u64) -> Option<Result<SeedResult, HarnessError>> {
    let mut f = flow.lock().expect("sweep lock");
    loop {
        if f.next_out >= end {
            return None;
        }
        let seed = f.next_out;
        if let Some(result) = f.done.remove(&seed) {
            f.next_out += 1;
            changed.notify_all();
            return Some(result);
        }
        f = changed.wait(f).expect("sweep lock");
    }
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
    pub variant: String,
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
            variant: crate::variant::label(s),
            fault_kinds: kinds,
            workload: match (s.workload.work, s.workload.stock) {
                (Some(work), _) => work.id,
                (None, Some(_)) => "flash-sale",
                (None, None) => "counter",
            }
            .to_string(),
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
            variant: r.variant.clone(),
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
pub fn merge(mut parts: Vec<ScenarioResult>) -> Result<ScenarioResult, String> {
    let meta = Meta::of_result(&parts[0]);
    let name = meta.scenario.clone();
    // A real run's seeds do not replay: two real runs of the same seeds are different runs, and a
    // seed's result in one says nothing of the other.
    if parts.iter().any(|p| p.real) {
        if parts.len() > 1 {
            return Err(format!(
                "{name}: real runs are not merged with other runs of the scenario (their seeds do not replay)"
            ));
        }
        return Ok(parts.remove(0));
    }
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
    let mut splits: BTreeMap<(u64, u64, u64), Vec<u64>> = BTreeMap::new();
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

/// Seed results compared with the scenario's `[expect]` as they come, in memory that does not grow
/// with the number of seeds (see [`Distribution`] for the medians).
pub struct Judge {
    meta: Meta,
    seeds: Range<u64>,
    count: u64,
    unsafe_seeds: u64,
    first_unsafe: Option<u64>,
    gaps: Gaps,
    /// The violations the unsafe seeds found.
    unsafe_kinds: BTreeSet<FindingKind>,
    first_with: BTreeMap<FindingKind, u64>,
    seeds_with: BTreeMap<FindingKind, u64>,
    seeds_with_hazard: BTreeMap<Hazard, u64>,
    hazard_counts: HazardCounts,
    /// Counted when the scenario injects faults.
    coverage: Option<FaultCoverage>,
    acquisitions: u64,
    messages: u64,
    unrecovered: u64,
    latency_ms_p99_max: f64,
    latency_ms_p50: Distribution,
    recovery_ms: Distribution,
}

impl Judge {
    pub fn new(meta: Meta, seeds: Range<u64>) -> Judge {
        Judge {
            coverage: (!meta.fault_kinds.is_empty()).then(FaultCoverage::default),
            meta,
            seeds: seeds.clone(),
            count: 0,
            unsafe_seeds: 0,
            first_unsafe: None,
            gaps: Gaps::new(seeds),
            unsafe_kinds: BTreeSet::new(),
            first_with: BTreeMap::new(),
            seeds_with: BTreeMap::new(),
            seeds_with_hazard: BTreeMap::new(),
            hazard_counts: HazardCounts::new(),
            acquisitions: 0,
            messages: 0,
            unrecovered: 0,
            latency_ms_p99_max: 0.0,
            latency_ms_p50: Distribution::default(),
            recovery_ms: Distribution::default(),
        }
    }

    /// One seed's result; seeds may come in any order, and each must come once.
    pub fn add(&mut self, r: &SeedResult) {
        let earliest = |first: &mut Option<u64>| *first = Some(first.map_or(r.seed, |s| s.min(r.seed)));
        self.count += 1;
        if r.verdict == Verdict::Unsafe {
            self.unsafe_seeds += 1;
            earliest(&mut self.first_unsafe);
            self.gaps.unsafe_seed(r.seed);
            self.unsafe_kinds.extend(r.counts.keys().filter(|k| k.is_violation()));
        }
        for kind in r.counts.keys() {
            let first = self.first_with.entry(*kind).or_insert(r.seed);
            *first = (*first).min(r.seed);
            *self.seeds_with.entry(*kind).or_insert(0) += 1;
        }
        for hazard in r.hazards.keys() {
            *self.seeds_with_hazard.entry(*hazard).or_insert(0) += 1;
        }
        add_counts(&mut self.hazard_counts, &r.hazards);
        if let Some(coverage) = &mut self.coverage {
            coverage.add(r);
        }
        let m = &r.measurements;
        self.acquisitions += m.acquisitions;
        self.messages += m.messages;
        self.unrecovered += m.unrecovered;
        self.latency_ms_p99_max = self.latency_ms_p99_max.max(m.latency_ms_p99);
        self.latency_ms_p50.add(m.latency_ms_p50);
        m.recovery_ms.iter().for_each(|ms| self.recovery_ms.add(*ms));
    }

    /// The verdict over every seed added (`results` left empty).
    pub fn finish(self) -> ScenarioResult {
        let expect = &self.meta.expect;
        let mut reasons = Vec::new();
        let mut unexpected_seed = None;
        let mut flag = |why: Reason, seed: Option<u64>| {
            reasons.push(why);
            unexpected_seed = unexpected_seed.or(seed);
        };
        // A fault test whose faults never took effect tested nothing: whatever it expects, it must not
        // pass (a green "safe" for a lock nobody paused), nor fail without saying why.
        if let Some(c) = self.coverage.filter(|c| c.seeds > 0 && c.seeds_fired == 0) {
            flag(Reason::NoFaultFired { seeds: c.seeds, why: never_fired(&c) }, None);
        }
        match expect.verdict {
            Verdict::Safe => {
                if let Some(seed) = self.first_unsafe {
                    flag(Reason::UnsafeFound { kinds: self.unsafe_kinds.iter().copied().collect() }, Some(seed));
                }
            }
            Verdict::Unsafe if self.first_unsafe.is_none() => flag(Reason::EverySeedSafe, None),
            Verdict::Unsafe => {}
        }
        for kind in &expect.findings {
            if !self.first_with.contains_key(kind) {
                flag(Reason::FindingNotFound(*kind), None);
            }
        }
        for kind in &expect.absent {
            if let Some(seed) = self.first_with.get(kind) {
                flag(Reason::AbsentFound { kind: *kind, seed: *seed }, Some(*seed));
            }
        }
        for hazard in &expect.hazards {
            if !self.seeds_with_hazard.contains_key(hazard) {
                let (scenario, seeds) = (self.meta.scenario.clone(), self.seeds.clone());
                flag(Reason::HazardNotReached { scenario, hazard: *hazard, seeds }, None);
            }
        }
        let round = |x: f64| (x * 10.0).round() / 10.0;
        let summary = if self.count == 0 {
            Summary::default()
        } else {
            let r = &self.recovery_ms;
            Summary {
                acquisitions_per_seed: round(self.acquisitions as f64 / self.count as f64),
                latency_ms_p50: self.latency_ms_p50.median().unwrap_or(0.0),
                latency_ms_p99_max: self.latency_ms_p99_max,
                messages_per_acquisition: if self.acquisitions == 0 {
                    0.0
                } else {
                    round(self.messages as f64 / self.acquisitions as f64)
                },
                recovery_ms: r.min().zip(r.median()).zip(r.max()).map(|((min, median), max)| (min, median, max)),
                recoveries: r.len(),
                unrecovered: self.unrecovered,
            }
        };
        let meta = self.meta;
        let (unsafe_rate, rate_with) = rates(self.count, self.unsafe_seeds, &self.seeds_with);
        ScenarioResult {
            as_expected: reasons.is_empty(),
            reasons,
            example_seed: unexpected_seed.or(self.first_unsafe),
            expect: meta.expect,
            scenario: meta.scenario,
            path: meta.path,
            recipe: meta.recipe,
            variant: meta.variant,
            fault_kinds: meta.fault_kinds,
            workload: meta.workload,
            clients: meta.clients,
            duration_s: meta.duration_s,
            seeds: self.seeds,
            unsafe_seeds: self.unsafe_seeds,
            seeds_with: self.seeds_with,
            seeds_with_hazard: self.seeds_with_hazard,
            hazard_counts: self.hazard_counts,
            to_violation: self.gaps.finish(),
            fault_coverage: self.coverage,
            unsafe_rate,
            rate_with,
            summary,
            results: Vec::new(),
            shard: None,
            real: false,
        }
    }
}

/// Why a run's faults never fired, in words.
fn never_fired(c: &FaultCoverage) -> String {
    if c.faults == 0 {
        "no seed drew one (the run is shorter than the nemesis's interval)".into()
    } else {
        format!(
            "all {} were skipped when due (nobody in the role they target, a trigger the run never reached, \
             or a node already down), so nothing was tested",
            c.faults
        )
    }
}

/// Compare seed results with the scenario's `[expect]`, keeping them in the result.
pub fn judge(meta: Meta, seeds: Range<u64>, results: Vec<SeedResult>) -> ScenarioResult {
    let mut judge = Judge::new(meta, seeds);
    results.iter().for_each(|r| judge.add(r));
    ScenarioResult { results, ..judge.finish() }
}
