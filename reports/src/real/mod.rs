//! Real mode (`locksim run FILE --real --runs N`): a scenario whose recipe is a command — a lock in any
//! language — against a real Redis, ZooKeeper, etcd or PostgreSQL that locksim starts on loopback, with real
//! client processes and real faults, checked by the same checkers as a simulated run.
//!
//! **The protocol.** One process per scenario client, started with `[recipe] command = [...]` in the
//! scenario file's directory (a program named with a `/` is found relative to that directory, a bare
//! name on `PATH`), with this environment:
//! - the server of this run, by `[recipe] server`: `LOCKSIM_REDIS=127.0.0.1:PORT` (`"redis"`, the
//!   default), `LOCKSIM_ZOOKEEPER=127.0.0.1:PORT` (`"zookeeper"`), `LOCKSIM_ETCD=127.0.0.1:PORT` (`"etcd"`,
//!   its gRPC client port) or `LOCKSIM_POSTGRES=host=127.0.0.1 port=PORT user=postgres dbname=postgres`
//!   (`"postgresql"`, a libpq connection string);
//! - `LOCKSIM_CLIENT=client-N`: which client it is;
//! - `LOCKSIM_LOCK=locksim:<scenario name>`: the lock's name;
//! - `LOCKSIM_PARAM_<KEY>`: every other `[recipe]` key, as a string (`timeout = "1s"` →
//!   `LOCKSIM_PARAM_TIMEOUT=1s`).
//!
//! locksim writes one JSON object per line to its stdin and reads one per line from its stdout:
//! | locksim sends | the process answers |
//! | --- | --- |
//! | `{"op":"acquire"}` | `{"ok":true,"token":N}` (or `null`: no fencing token), `{"ok":false,"reason":"..."}`, `{"unknown":"..."}` (it may have taken effect) |
//! | `{"op":"acquire","shared":true}` | as `acquire`: take the lock shared, as a reader (sent only when the scenario's `[workload] reads` > 0; the holder then reads, never writes) |
//! | `{"op":"enter"}` | `{"entered":true}`: locksim then reads the resource for it |
//! | `{"op":"write"}` | `{"writing":true}`: locksim then writes the resource for it |
//! | `{"op":"release"}` | as `acquire` |
//! | — | `{"lost":"reason"}` at any time: the library says the lock it held is gone |
//!
//! The workload loop runs in locksim ([`workload`]) and records every event when it sends or reads the
//! line. The critical section's accesses go to locksim's own resource ([`resource`]) — but only once
//! the process answers, so a paused holder answers late and its write lands late: a real stale write.
//! A line that is not one of these, or a process that dies unbidden, is a harness error (exit 2) that
//! names the client and the line (or the process's last stderr lines).
//!
//! **Time.** The history's `t` is real time: nanoseconds of a monotonic clock since the run started;
//! the scenario's `duration`, hold, think and fault times are real time too. A real run is not
//! reproducible from its seed: the seed only draws hold and think (and `holder`/`waiter` picks).
//!
//! Modules: [`protocol`] (the lines), [`client`] (a process), [`history`] (the recorder),
//! [`resource`] (the resource service), [`fault`] (pause, crash), [`workload`] (the loop).

pub mod client;
pub mod fault;
pub mod history;
pub mod protocol;
pub mod resource;
pub mod workload;

use crate::conform::servers::{Kind, Server};
use history::Recorder;
use locksim_scenarios::checkers::{check, measure};
use locksim_scenarios::run::{describe, keep_first, resolve_schedule, SeedResult};
use locksim_scenarios::scenario::{CommandRecipe, CommandServer, Workload};
use locksim_scenarios::sweep::{Judge, Meta, ScenarioResult};
use locksim_scenarios::{Scenario, Verdict};
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Nodes of a real run: the server (`redis-0`, `zk-0`, `etcd-0`, `db-0`), `resource`, then the clients.
pub const FIRST_CLIENT: usize = 2;

/// The client processes' environment variables, besides the server's and `LOCKSIM_PARAM_*`.
pub const ENV_CLIENT: &str = "LOCKSIM_CLIENT";
pub const ENV_LOCK: &str = "LOCKSIM_LOCK";

/// What the fault threads and a client's workload share about its process.
#[derive(Debug, Default)]
pub struct Slot {
    /// The live process, until the workload reaps it.
    pub pid: Option<libc::pid_t>,
    /// Crashed by a fault: `Some(restart time)` (`Some(None)`: stays down) until it restarts.
    pub down: Option<Option<Duration>>,
}

/// One real run in progress.
pub struct Run {
    pub seed: u64,
    pub recorder: Recorder,
    pub nodes: Vec<String>,
    pub slots: Vec<Mutex<Slot>>,
    pub resource: resource::Resource,
    pub workload: Workload,
    pub argv: Vec<String>,
    pub dir: PathBuf,
    /// When the run ends (real time since its start).
    pub end: Duration,
    start: Instant,
    env: Vec<(String, String)>,
    stop: AtomicBool,
}

impl Run {
    pub fn elapsed(&self) -> Duration {
        self.recorder.elapsed()
    }

    /// `at` (time since the start) as an instant.
    pub fn instant(&self, at: Duration) -> Instant {
        self.start + at
    }

    /// The run is over: its duration has passed, or a client failed.
    pub fn over(&self) -> bool {
        self.stopped() || self.elapsed() >= self.end
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleep until `at`; false if the run ended first.
    pub fn sleep_until(&self, at: Duration) -> bool {
        loop {
            if self.over() {
                return false;
            }
            let now = self.elapsed();
            if now >= at {
                return true;
            }
            std::thread::sleep((at - now).min(Duration::from_millis(20)));
        }
    }

    pub fn node(&self, name: &str) -> Option<NodeIx> {
        self.nodes.iter().position(|n| n == name).map(|i| NodeIx(i as u32))
    }

    pub fn client_index(&self, node: NodeIx) -> usize {
        node.0 as usize - FIRST_CLIENT
    }

    /// The environment of `client`'s process.
    pub fn env(&self, client: &str) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        env.push((ENV_CLIENT.into(), client.into()));
        env
    }
}

/// Refuse, before anything starts, what real mode cannot run (exit 2).
pub fn check_supported(scenario: &Scenario) -> anyhow::Result<&CommandRecipe> {
    let Some(command) = &scenario.command else {
        anyhow::bail!(
            "{}: --real runs a scenario whose [recipe] is a `command` (built-in recipes on real servers are not done \
             yet)",
            scenario.path
        );
    };
    if scenario.workload.stock.is_some() || scenario.workload.work.is_some() {
        anyhow::bail!(
            "{}: --real runs the counter workload only (not a flash sale or a workload of your own) yet",
            scenario.path
        );
    }
    let backend = &scenario.backend_params;
    if command.server == CommandServer::Redis && (backend.int("masters") != 1 || backend.int("replicas") != 0) {
        anyhow::bail!("{}: --real starts one Redis server: [backend] masters = 1, replicas = 0", scenario.path);
    }
    fault::refuse_unsupported(scenario)?;
    Ok(command)
}

/// One run's result and its history.
pub struct RealRun {
    pub result: SeedResult,
    pub history: History,
}

/// `runs` real runs of `scenario`, the i-th drawing from seed `first_seed + i`, judged against its
/// `[expect]` as a sweep of those seeds is; `each` gets every run as it ends.
pub fn run(
    scenario: &Scenario,
    runs: u64,
    first_seed: u64,
    mut each: impl FnMut(&RealRun) -> anyhow::Result<()>,
) -> anyhow::Result<ScenarioResult> {
    let command = check_supported(scenario)?;
    let seeds = first_seed..first_seed.saturating_add(runs);
    let mut judge = Judge::new(Meta::of(scenario), seeds.clone());
    for seed in seeds {
        let run = run_once(scenario, command, seed)?;
        judge.add(&run.result);
        each(&run)?;
    }
    Ok(judge.finish())
}

/// One real run: a fresh server, the client processes, the faults; every process killed and reaped
/// before it returns, whatever happened.
pub fn run_once(scenario: &Scenario, command: &CommandRecipe, seed: u64) -> anyhow::Result<RealRun> {
    let server = Server::start(match command.server {
        CommandServer::Redis => Kind::Redis,
        CommandServer::ZooKeeper => Kind::ZooKeeper,
        CommandServer::Etcd => Kind::Etcd,
        CommandServer::PostgreSql => Kind::Postgres,
    })?;
    let faults = resolve_schedule(scenario, seed);
    let clients = scenario.workload.clients;
    let mut nodes = vec![command.server.node().to_string(), "resource".to_string()];
    nodes.extend((0..clients).map(Scenario::client_name));
    let mut env = vec![
        (command.server.env().to_string(), server_env(command.server, &server)),
        (ENV_LOCK.to_string(), format!("locksim:{}", scenario.name)),
    ];
    env.extend(command.params.iter().map(|(k, v)| (format!("LOCKSIM_PARAM_{}", k.to_ascii_uppercase()), v.clone())));
    let dir = scenario_dir(&scenario.path)?;
    let start = Instant::now();
    let run = Run {
        seed,
        recorder: Recorder::new(start),
        nodes,
        slots: (0..clients).map(|_| Mutex::new(Slot::default())).collect(),
        resource: resource::Resource::new(scenario.workload.fencing),
        workload: scenario.workload.clone(),
        argv: command.argv.clone(),
        dir,
        end: scenario.workload.duration,
        start,
        env,
        stop: AtomicBool::new(false),
    };
    let outcomes: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let run = &run;
        let workers: Vec<_> = (0..clients)
            .map(|i| {
                scope.spawn(move || {
                    let outcome = workload::client(run, i);
                    if outcome.is_err() {
                        run.stop.store(true, Ordering::Relaxed);
                    }
                    outcome
                })
            })
            .collect();
        for (id, f) in faults.iter().enumerate() {
            scope.spawn(move || fault::apply(run, id as u32, f));
        }
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked"))))
            .collect()
    });
    drop(server);
    if let Some(e) = outcomes.into_iter().find_map(Result::err) {
        return Err(e.context(format!("{}: real run with seed {seed}", scenario.path)));
    }
    if run.recorder.over_budget() {
        anyhow::bail!("{}: the real run used up its budget of history events", scenario.path);
    }
    let history = run.recorder.finish(run.nodes.clone());
    let findings = check(&history, &scenario.check);
    let result = SeedResult {
        seed,
        verdict: if findings.iter().any(|f| f.kind.is_violation()) { Verdict::Unsafe } else { Verdict::Safe },
        counts: findings.iter().fold(BTreeMap::new(), |mut m, f| {
            *m.entry(f.kind).or_default() += 1;
            m
        }),
        findings: keep_first(findings),
        measurements: measure(&history, 0, 0),
        history_hash: format!("{:016x}", history.hash()),
        schedule: faults.iter().map(describe).collect(),
        faults_skipped: history.events.iter().filter(|e| matches!(e.kind, EventKind::FaultSkipped { .. })).count()
            as u64,
    };
    Ok(RealRun { result, history })
}

/// Where the processes find the server: `host:port`, or for PostgreSQL a libpq connection string (the
/// cluster `Server::start` makes trusts `postgres` on loopback, as conform connects).
fn server_env(kind: CommandServer, server: &Server) -> String {
    let addr = server.addr().0;
    match kind {
        CommandServer::PostgreSql => {
            format!("host={} port={} user=postgres dbname=postgres", addr.ip(), addr.port())
        }
        CommandServer::Redis | CommandServer::ZooKeeper | CommandServer::Etcd => addr.to_string(),
    }
}

/// The scenario file's directory, absolute: where its command runs.
fn scenario_dir(path: &str) -> anyhow::Result<PathBuf> {
    let parent = std::path::Path::new(path).parent().filter(|d| !d.as_os_str().is_empty());
    let dir = parent.unwrap_or(std::path::Path::new("."));
    dir.canonicalize().map_err(|e| anyhow::anyhow!("{}: cannot find its directory: {e}", dir.display()))
}
