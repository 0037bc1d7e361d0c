//! One seed of one scenario: build the world, run it, check the history.
//!
//! Each seed runs on a fresh OS thread with a fresh madsim runtime, and every node is killed before the
//! seed returns (dropping a runtime does not cancel live tasks, madsim issue #242). Nothing of one seed
//! reaches the next: the result depends on the scenario and the seed alone.

use crate::checkers::{check, measure, Finding, FindingKind, Measurements};
use crate::scenario::{Scenario, Verdict};
use crate::workload::{client_program, ClientPlan};
use locksim_sim::backend::serve;
use locksim_sim::fault::{fmt_duration, resolve_random_clients, Fault};
use locksim_sim::hazard::HazardCounts;
use locksim_sim::history::{EventKind, History};
use locksim_sim::resource::ResourceState;
use locksim_sim::rng::{stream, Stream};
use locksim_sim::world::{Program, World};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// At most this many findings of one kind are kept per seed (all are counted).
const FINDINGS_KEPT_PER_KIND: usize = 5;

/// What one seed produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    pub verdict: Verdict,
    /// How many findings of each kind.
    pub counts: BTreeMap<FindingKind, u64>,
    /// The first few findings of each kind.
    pub findings: Vec<Finding>,
    pub measurements: Measurements,
    /// XXH3-64 of the history's JSON lines, in hex: the determinism fingerprint.
    pub history_hash: String,
    /// The faults this seed ran, written out (the nemesis's draws resolved).
    pub schedule: Vec<String>,
    /// How many of them were skipped when due (no holder to hit, a node already down).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub faults_skipped: u64,
    /// The hazards this seed reached and how often (counted beside the history, never in it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hazards: HazardCounts,
}

impl SeedResult {
    /// The judge of a seed's history, simulated or real: its findings and verdict under the scenario's
    /// checks, its measurements, its fingerprint, and the faults it ran. `traffic`: the messages sent and
    /// the calls timed out (a real run counts neither); `hazards`: those counted beside the history.
    pub fn judge(
        seed: u64,
        history: &History,
        scenario: &Scenario,
        faults: &[Fault],
        traffic: (u64, u64),
        hazards: HazardCounts,
    ) -> SeedResult {
        let findings = check(history, &scenario.check);
        let skipped = history.events.iter().filter(|e| matches!(e.kind, EventKind::FaultSkipped { .. }));
        SeedResult {
            seed,
            verdict: if findings.iter().any(|f| f.kind.is_violation()) { Verdict::Unsafe } else { Verdict::Safe },
            counts: findings.iter().fold(BTreeMap::new(), |mut m, f| {
                *m.entry(f.kind).or_default() += 1;
                m
            }),
            findings: keep_first(findings),
            measurements: measure(history, traffic.0, traffic.1),
            history_hash: format!("{:016x}", history.hash()),
            schedule: faults.iter().map(describe).collect(),
            faults_skipped: skipped.count() as u64,
            hazards,
        }
    }

    /// How many of its faults started (the rest were skipped when due).
    pub fn faults_fired(&self) -> u64 {
        (self.schedule.len() as u64).saturating_sub(self.faults_skipped)
    }

    /// At least one of its faults started: the seed tested the lock under a fault.
    pub fn fault_fired(&self) -> bool {
        self.faults_fired() > 0
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A seed's result and its full history.
pub struct SeedRun {
    pub result: SeedResult,
    pub history: History,
    pub faults: Vec<Fault>,
}

/// Why a seed could not be run.
#[derive(Debug, Clone, thiserror::Error)]
#[error("seed {seed}: the simulation failed: {message}")]
pub struct HarnessError {
    pub seed: u64,
    pub message: String,
}

/// The faults one seed runs: the written ones and the nemesis's draws, in time order.
pub fn resolve_schedule(scenario: &Scenario, seed: u64) -> Vec<Fault> {
    let topo = scenario.topology();
    let mut faults = scenario.schedule.clone();
    if let Some(nemesis) = &scenario.random {
        faults.extend(nemesis.draw(&mut stream(seed, Stream::Nemesis, 0), scenario.workload.duration, &topo));
    }
    faults.sort_by_key(|f| f.at);
    resolve_random_clients(&mut faults, &mut stream(seed, Stream::Nemesis, 1), &topo.clients);
    faults
}

/// Wall-clock time one seed may take before the runner gives up on it. A seed normally takes
/// milliseconds; one that takes this long is stuck (a bug in the simulation, not a finding), and a CI
/// run must end with an error rather than hang.
const SEED_WALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Run one seed on a fresh thread.
pub fn run_seed(scenario: &Scenario, seed: u64) -> Result<SeedRun, HarnessError> {
    let scenario = scenario.clone();
    let (done, result) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new().name(format!("seed-{seed}")).spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| simulate(&scenario, seed)));
        let _ = done.send(outcome.map_err(|panic| panic_text(&panic)).and_then(|run| run));
    });
    thread.expect("the OS can start a thread");
    match result.recv_timeout(SEED_WALL_LIMIT) {
        Ok(outcome) => outcome.map_err(|message| HarnessError { seed, message }),
        Err(_) => Err(HarnessError {
            seed,
            message: format!("no result after {SEED_WALL_LIMIT:?} of wall time: the simulation is stuck"),
        }),
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn simulate(scenario: &Scenario, seed: u64) -> Result<SeedRun, String> {
    let faults = resolve_schedule(scenario, seed);
    let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    let (history, hazards, messages) = runtime.block_on({
        let faults = faults.clone();
        let scenario = scenario.clone();
        async move {
            let mut world = World::new(seed);
            let servers = (scenario.recipe.family.deploy)(&mut world, &scenario.backend_params);
            let resource = world.add_node(
                "resource",
                resource_program(scenario.workload.fencing, scenario.workload.stock.unwrap_or(0)),
            );
            let plan = Arc::new(ClientPlan {
                recipe: scenario.recipe,
                params: scenario.recipe_params.clone(),
                servers,
                resource,
                workload: scenario.workload.clone(),
            });
            let clients: Vec<_> = (0..scenario.workload.clients)
                .map(|i| {
                    let name = Scenario::client_name(i);
                    world.add_node(&name, client_program(plan.clone(), name.clone()))
                })
                .collect();
            for client in clients {
                world.add_workers(client, scenario.workload.workers as u32 - 1);
            }
            world.run(&faults, scenario.workload.duration).await;
            if let Some(at) = world.recorder().over_budget_at() {
                return Err(format!(
                    "the run used up its budget of {} history events at {:.1} s of simulated time: too big for one \
                     seed (fewer clients, a shorter duration or more think time)",
                    locksim_sim::history::EVENT_BUDGET,
                    at as f64 / 1e9
                ));
            }
            let history = world.recorder().finish(world.names());
            Ok((history, world.recorder().hazards(), (world.net().messages(), world.net().call_timeouts())))
        }
    })?;
    let result = SeedResult::judge(seed, &history, scenario, &faults, messages, hazards);
    Ok(SeedRun { result, history, faults })
}

/// The first few findings of each kind (five).
fn keep_first(findings: Vec<Finding>) -> Vec<Finding> {
    let mut seen: BTreeMap<FindingKind, usize> = BTreeMap::new();
    findings
        .into_iter()
        .filter(|f| {
            let n = seen.entry(f.kind).or_default();
            *n += 1;
            *n <= FINDINGS_KEPT_PER_KIND
        })
        .collect()
}

/// `at 12.5s pause holder for 8s`; aimed: `at 0s on acquire-ok #2 pause trigger for 8s`
pub fn describe(f: &Fault) -> String {
    let detail = f.action.detail();
    let on = f.on.as_ref().map_or(String::new(), |on| format!(" on {on}"));
    let mut words = format!("at {}{on} {} {}", fmt_duration(f.at), f.action.kind().name(), f.target);
    if !detail.is_empty() {
        words = format!("{words} {detail}");
    }
    words
}

fn resource_program(fencing: bool, initial: i64) -> Program {
    // The resource is durable: a restart keeps its value (it is the system of record).
    let state = Arc::new(Mutex::new(ResourceState::new(fencing, initial)));
    Arc::new(move |env| {
        let state = state.clone();
        Box::pin(async move {
            let rpc = env.rpc();
            serve(state, &rpc, &env.clock, &env.recorder).await
        })
    })
}
