//! Real mode (`locksim run FILE --real --runs N`): a scenario whose recipe is a command — a lock in any
//! language — against a real Redis, ZooKeeper, etcd or PostgreSQL that locksim starts on loopback, with real
//! client processes and real faults, checked by the same checkers as a simulated run. A flash sale's
//! baselines (`none`, `sql.conditional-update`) run too, their clients being locksim's threads
//! ([`Clients::Baseline`]).
//!
//! **Built-in recipes.** A scenario whose `[recipe]` is a built-in lock (an `id`, no `command`) runs its
//! clients as processes of this very binary, `locksim adapter SCENARIO --seed S` ([`adapter`],
//! [`Clients::Builtin`]): the simulator's recipe code, on a real clock (`Ctx::real`) and a real client
//! crate (`Servers::Real`), speaking the protocol below through the same proxies, faults, resource and
//! checkers. Its backend must map to real servers locksim starts: the Redis family on one master (not
//! Redlock), alone or with its replicas under three Sentinels ([`crate::servers::Cluster`]; a client
//! asks a Sentinel for the master as redis-py's Sentinel client does), the ZooKeeper family
//! (standalone with the launcher's tickTime, or an ensemble of `[backend] servers` with its timing,
//! [`crate::servers::Cluster`]), the etcd family
//! (through etcd's JSON gateway; one member or a cluster), and the database family on PostgreSQL (its
//! tables and sequence made, and the `[backend]` settings set, on the fresh database before the clients
//! start); anything else is
//! refused before the run, saying why.
//!
//! **The protocol.** One process per scenario client, started with `[recipe] command = [...]` in the
//! scenario file's directory (a program named with a `/` is found relative to that directory, a bare
//! name on `PATH`), with this environment:
//! - the server of this run, by `[recipe] server` (a cluster's members comma-separated, built-in recipes
//!   only): `LOCKSIM_REDIS=127.0.0.1:PORT` (`"redis"`, the
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
//! **Green only when the test happened.** Every request has a deadline, [`REQUEST_TIMEOUT`] or the
//! command's `[recipe] request_timeout`, not counting time under faults ([`workload`]); a request past it
//! is a harness error naming the client and the request, and so is a run in which no client acquired
//! the lock ([`history::untested`]). A client's end is noticed by its process, not its stdout
//! ([`client`]), and what it started is killed with it, even out of its process group.
//!
//! **Time.** The history's `t` is real time: nanoseconds of a monotonic clock since the run started;
//! the scenario's `duration`, hold, think and fault times are real time too. A real run is not
//! reproducible from its seed: the seed only draws hold and think (and `holder`/`waiter` picks).
//!
//! **The network.** Each client process reaches the server through a loopback proxy of its own
//! ([`proxy`]): its `LOCKSIM_REDIS` (or `LOCKSIM_ZOOKEEPER`) names the proxy, which forwards every
//! connection to the server, and through which the network faults act ([`fault`]).
//!
//! Modules: [`protocol`] (the lines), [`adapter`] (a built-in recipe's process), [`client`] (a process), [`history`] (the recorder),
//! [`resource`] (the resource service), [`proxy`] (a client's path to the server), [`fault`] (pause,
//! crash, the network faults), [`workload`] (the loop).

pub mod adapter;
pub mod client;
pub mod fault;
pub mod history;
pub mod protocol;
pub mod proxy;
pub mod resource;
pub mod workload;

use crate::servers::{Cluster, Launcher, PeerLinks, Server, Upstream};
use history::Recorder;
use locksim_locks::{Guard, RealServer, REAL_SERVERS};
use locksim_scenarios::checkers::CheckConfig;
use locksim_scenarios::run::{describe, resolve_schedule, SeedResult};
use locksim_scenarios::scenario::{CommandRecipe, Workload};
use locksim_scenarios::sweep::{Judge, Meta, ScenarioResult};
use locksim_scenarios::Scenario;
use locksim_sim::fault::Topology;
use locksim_sim::history::{History, NodeIx};
use locksim_sim::rng::{stream, Stream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a client process may take to answer one request (`acquire`, `enter`, `write`, `release`),
/// not counting time under faults, unless its `[recipe] request_timeout` says otherwise. Twice the
/// default `[check] liveness` (30 s), so that a lock which leaves its waiters blocked is still found out
/// as a `deadlock` first, and far above the blocking timeouts of the shipped adapters (at most 10 s)
/// and the socket timeouts under them: a request this late is an adapter that hangs.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How much later than another a real client must ask to overtake it unfairly (`unfair`; the
/// simulator's margin is 100 ms of round trips): a client process on a busy machine can reach the
/// server this long after locksim recorded its request (a Python client once took more than 100 ms
/// in CI, beside conformance).
pub const REAL_FIFO_MARGIN: Duration = Duration::from_secs(1);

/// How long a client process may take to acknowledge `enter` or `write` (outside faults), if its
/// `request_timeout` is not shorter: these ask nothing of the lock service — the adapter answers at
/// once, only to show it still runs — so an adapter that answers `acquire` and then hangs is found out
/// within a short run, not only past [`REQUEST_TIMEOUT`].
pub const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// The client processes' environment variables, besides the server's and `LOCKSIM_PARAM_*`.
pub const ENV_CLIENT: &str = "LOCKSIM_CLIENT";
pub const ENV_LOCK: &str = "LOCKSIM_LOCK";
/// The `locksim` binary (`cli::main`) whose `adapter` runs a built-in recipe's clients; unset, this
/// process's own executable.
pub const ENV_EXE: &str = "LOCKSIM_EXE";

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
    /// The command each client runs; empty for a baseline, whose clients are locksim's own threads.
    pub argv: Vec<String>,
    /// What keeps the clients apart: the command's lock, or a baseline's nothing or conditional update.
    pub guard: Guard,
    pub dir: PathBuf,
    /// When the run ends (real time since its start).
    pub end: Duration,
    /// Each request's deadline (see [`workload`]).
    pub request_timeout: Duration,
    /// A command run's server and the clients' paths to it; a baseline has none.
    served: Option<Served>,
    start: Instant,
    env: Vec<(String, String)>,
    stop: AtomicBool,
}

/// A command run's servers (one, or a cluster's members: the first nodes of the run), and each
/// client's paths to them.
struct Served {
    /// The servers, which faults may stop, crash and start again.
    cluster: Cluster,
    /// The pooler in front of them, which the clients' proxies lead to: held so that it runs until
    /// the run ends (its drop stops it).
    _front: Option<Server>,
    /// Whether a server keeps its data through a crash (see [`fault`]).
    keep_data: bool,
    /// Each client's path to each server: `proxies[client][server]`.
    proxies: Vec<Vec<proxy::Proxy>>,
    /// Which server it is, for the variable that names it (its client's proxies) to a client process.
    server_of: &'static RealServer,
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

    /// Nodes of a real run: the servers (`redis-0`; `zk-0`, `zk-1`, `zk-2` for an ensemble; a baseline
    /// has none), `resource`, then the clients.
    pub fn first_client(&self) -> usize {
        self.nodes.len() - self.slots.len()
    }

    pub fn client_index(&self, node: NodeIx) -> usize {
        node.0 as usize - self.first_client()
    }

    /// The server (a cluster's member) that `node` is, if it is one.
    pub fn server_index(&self, node: NodeIx) -> Option<usize> {
        let servers = self.served.as_ref().map_or(0, |s| s.cluster.size());
        Some(node.0 as usize).filter(|i| *i < servers)
    }

    /// The environment of `client`'s process: the servers are its proxies (a cluster's members listed
    /// with commas, as a connect string or an endpoint list has them, and their nodes and announced
    /// addresses in the variables [`locksim_locks::RealServers`] reads).
    pub fn env(&self, client: &str) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        if let Some(served) = &self.served {
            if let Some(proxies) = self.node(client).map(|n| &served.proxies[self.client_index(n)]) {
                let address = |addr| (served.server_of.address)(addr);
                let addresses: Vec<String> = proxies.iter().map(|p| address(p.addr())).collect();
                let var = served.server_of.env;
                env.push((var.into(), addresses.join(",")));
                if served.cluster.size() > 1 {
                    let [nodes, announced] = locksim_locks::CLUSTER_VARS.map(|suffix| format!("{var}{suffix}"));
                    env.push((nodes, self.nodes[..served.cluster.size()].join(",")));
                    if let Some(addrs) = served.cluster.announced() {
                        env.push((announced, addrs.iter().map(|a| address(*a)).collect::<Vec<_>>().join(",")));
                    }
                }
            }
        }
        env.push((ENV_CLIENT.into(), client.into()));
        env
    }

    /// The server and the proxies, for a fault: only a command run has them (a baseline takes no
    /// faults: [`check_supported`]).
    fn served(&self) -> &Served {
        self.served.as_ref().expect("a baseline takes no faults")
    }
}

/// What the clients of a real run are.
#[derive(Debug, Clone, Copy)]
pub enum Clients<'a> {
    /// Processes of a command recipe, against its real server.
    Command(&'a CommandRecipe),
    /// Processes of a built-in recipe (`locksim adapter`, [`adapter`]), against its family's one real
    /// server.
    Builtin(&'static RealServer),
    /// A flash sale's baseline (`none`, `sql.conditional-update`): no lock and no server, so the clients
    /// are locksim's own threads, racing in real time on the resource.
    Baseline(Guard),
}

/// Refuse, before anything starts, what real mode cannot run (exit 2).
pub fn check_supported(scenario: &Scenario) -> anyhow::Result<Clients<'_>> {
    if scenario.workload.work.is_some() {
        anyhow::bail!("{}: --real runs the counter and the flash sale, not a workload of your own, yet", scenario.path);
    }
    let Some(command) = &scenario.command else {
        if scenario.recipe.guard == Guard::Lock {
            let server = builtin_server(scenario)?;
            let topology = (scenario.recipe.family.topology)(&scenario.backend_params);
            let peer_cuts = Launcher::of(server).peer_links != PeerLinks::Direct && topology.servers.len() > 1;
            fault::refuse_unsupported(scenario, &fault::Servers { topology, peer_cuts })?;
            return Ok(Clients::Builtin(server));
        }
        if let Some(f) = scenario.schedule.first() {
            anyhow::bail!(
                "{}: fault `{}`: --real runs a baseline's clients as threads of locksim, which it cannot pause \
                 or crash; a baseline runs without faults",
                scenario.path,
                describe(f)
            );
        }
        if scenario.random.is_some() {
            anyhow::bail!("{}: [faults.random]: --real runs a baseline without faults", scenario.path);
        }
        return Ok(Clients::Baseline(scenario.recipe.guard));
    };
    // One server: a command has no `[backend]` of its own, and loading refused a `[model]` whose world
    // has other servers than the real run's one (Redlock's masters, a replica).
    let topology = Topology { servers: vec![command.server.node.to_string()], ..Topology::default() };
    fault::refuse_unsupported(scenario, &fault::Servers { topology, peer_cuts: false })?;
    Ok(Clients::Command(command))
}

/// The one real server a built-in recipe's scenario maps to, or why real mode cannot run it.
fn builtin_server(scenario: &Scenario) -> anyhow::Result<&'static RealServer> {
    let (path, recipe, family) = (&scenario.path, scenario.recipe.id, scenario.recipe.family);
    let Some(server) = family.real else {
        let families: Vec<&str> = REAL_SERVERS.iter().map(|s| s.name).collect();
        anyhow::bail!(
            "{path}: {recipe}: --real runs the built-in recipes whose family has a real server ({}), not {}",
            families.join(", "),
            family.name
        );
    };
    if !server.client_built {
        anyhow::bail!(
            "{path}: {recipe}: this locksim was built without a real {} client; build it with the \
             `real-clients` feature of locksim-cli (on by default)",
            server.name
        );
    }
    (server.refuses)(&scenario.backend_params).map_err(|why| anyhow::anyhow!("{path}: {recipe} {why}"))?;
    Ok(server)
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
    let clients = check_supported(scenario)?;
    let seeds = first_seed..first_seed.saturating_add(runs);
    let mut meta = Meta::of(scenario);
    if let Clients::Command(command) = clients {
        // Not the `[model]`, which only the simulator runs.
        meta.recipe = command.label();
    }
    let mut judge = Judge::new(meta, seeds.clone());
    for seed in seeds {
        let run = run_once(scenario, clients, seed)?;
        judge.add(&run.result);
        each(&run)?;
    }
    Ok(judge.finish())
}

/// One real run: a fresh server, a proxy and a process per client, the faults; every process killed
/// and reaped, every proxy thread joined and the server stopped before it returns, whatever happened.
pub fn run_once(scenario: &Scenario, kind: Clients, seed: u64) -> anyhow::Result<RealRun> {
    let faults = resolve_schedule(scenario, seed);
    let clients = scenario.workload.clients;
    let mut nodes = vec!["resource".to_string()];
    let mut env = vec![(ENV_LOCK.to_string(), format!("locksim:{}", scenario.name))];
    let request_timeout = match kind {
        Clients::Command(command) => command.request_timeout.unwrap_or(REQUEST_TIMEOUT),
        Clients::Builtin(_) | Clients::Baseline(_) => REQUEST_TIMEOUT,
    };
    let (served, argv, guard) = match kind {
        Clients::Command(command) => {
            let params = command.params.iter();
            env.extend(params.map(|(k, v)| (format!("LOCKSIM_PARAM_{}", k.to_ascii_uppercase()), v.clone())));
            let served = serve(scenario, command.server, 1, seed, false)?;
            nodes.insert(0, command.server.node.to_string());
            (Some(served), command.argv.clone(), Guard::Lock)
        }
        Clients::Builtin(server) => {
            let servers = (scenario.recipe.family.topology)(&scenario.backend_params).servers;
            let served = serve(scenario, server, servers.len(), seed, true)?;
            nodes.splice(0..0, servers);
            (Some(served), adapter_argv(scenario, seed)?, Guard::Lock)
        }
        Clients::Baseline(guard) => (None, Vec::new(), guard),
    };
    nodes.extend((0..clients).map(Scenario::client_name));
    let dir = scenario_dir(&scenario.path)?;
    let start = Instant::now();
    let run = Run {
        seed,
        recorder: Recorder::new(start),
        nodes,
        slots: (0..clients).map(|_| Mutex::new(Slot::default())).collect(),
        resource: resource::Resource::new(scenario.workload.fencing, scenario.workload.stock.unwrap_or(0)),
        workload: scenario.workload.clone(),
        argv,
        guard,
        dir,
        end: scenario.workload.duration,
        request_timeout,
        served,
        start,
        env,
        stop: AtomicBool::new(false),
    };
    run.recorder.arm(fault::armed(&run, &faults));
    let outcomes: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let run = &run;
        let failing = |outcome: anyhow::Result<()>| {
            if outcome.is_err() {
                run.stop.store(true, Ordering::Relaxed);
            }
            outcome
        };
        let workers: Vec<_> = (0..clients).map(|i| scope.spawn(move || failing(workload::client(run, i)))).collect();
        let faults: Vec<_> = faults
            .iter()
            .enumerate()
            .map(|(id, f)| scope.spawn(move || failing(fault::apply(run, id as u32, f))))
            .collect();
        workers
            .into_iter()
            .chain(faults)
            .map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a client or fault thread panicked"))))
            .collect()
    });
    if let Some(e) = outcomes.into_iter().find_map(Result::err) {
        return Err(e.context(format!("{}: real run with seed {seed}", scenario.path)));
    }
    if run.recorder.over_budget() {
        anyhow::bail!("{}: the real run used up its budget of history events", scenario.path);
    }
    let history = run.recorder.finish(run.nodes.clone());
    if !run.argv.is_empty() {
        if let Some(why) = history::untested(&history, run.first_client()) {
            anyhow::bail!("{}: real run with seed {seed}: {why}", scenario.path);
        }
    }
    // A real client process asks when locksim records it, and reaches the server when its machine
    // lets it run: the way from asking to the lock's queue is no round trip but a scheduler's wait.
    let check = CheckConfig { fifo_margin: REAL_FIFO_MARGIN, ..scenario.check };
    let judged = Scenario { check, ..scenario.clone() };
    let result = SeedResult::judge(seed, &history, &judged, &faults, (0, 0), Default::default());
    Ok(RealRun { result, history })
}

/// Start `server` (`n` of them as a cluster), set up for a built-in recipe (`set_up`), the pooler its
/// `[backend]` puts in front of it, and a proxy per client and server (the pooler's, if there is one).
fn serve(
    scenario: &Scenario,
    server: &'static RealServer,
    n: usize,
    seed: u64,
    set_up: bool,
) -> anyhow::Result<Served> {
    let (launcher, backend) = (Launcher::of(server), &scenario.backend_params);
    let cluster = match n {
        1 => Cluster::single(Server::start(launcher)?),
        n => Cluster::start(launcher, n, backend, seed)?,
    };
    if set_up {
        let first = cluster.member(0);
        (launcher.set_up)(first.addr().0, backend)?;
    }
    // After the set-up, so that every backend the pooler opens has the settings it made.
    let front = match (launcher.front)(backend) {
        Some(pooler) => {
            let upstream = Upstream { port: cluster.member(0).addr().0.port(), backend: backend.clone() };
            Some(Server::start_in_front(pooler, upstream)?)
        }
        None => None,
    };
    let addrs = match &front {
        Some(pooler) => vec![pooler.addr().0],
        None => cluster.addrs(),
    };
    // One server keeps the streams of old: a client's proxy draws from its own number.
    let draw = |client: usize, member: usize| stream(seed, Stream::Network, (client + member * 100) as u64);
    let proxies = (0..scenario.workload.clients)
        .map(|i| addrs.iter().enumerate().map(|(m, addr)| proxy::Proxy::start(*addr, draw(i, m))).collect())
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Served { cluster, _front: front, keep_data: (server.keeps_data)(backend), proxies, server_of: server })
}

/// A built-in recipe's client process: the hidden `adapter` subcommand of this very binary (or of the
/// `locksim` binary [`ENV_EXE`] names, for a program that calls [`run`] but is no `locksim` itself),
/// given the scenario (absolute: the process runs in the scenario's directory) and the seed.
fn adapter_argv(scenario: &Scenario, seed: u64) -> anyhow::Result<Vec<String>> {
    let exe = match std::env::var_os(ENV_EXE) {
        Some(exe) => std::path::PathBuf::from(exe),
        None => std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find locksim's own executable: {e}"))?,
    };
    let path = std::path::Path::new(&scenario.path)
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("{}: cannot find the scenario file: {e}", scenario.path))?;
    let text = |p: &std::path::Path| p.to_str().map(str::to_string);
    let (Some(exe), Some(path)) = (text(&exe), text(&path)) else {
        anyhow::bail!("{}: the scenario's or locksim's own path is not UTF-8", scenario.path);
    };
    Ok(vec![exe, "adapter".into(), path, "--seed".into(), seed.to_string()])
}

/// The scenario file's directory, absolute: where its command runs.
fn scenario_dir(path: &str) -> anyhow::Result<PathBuf> {
    let parent = std::path::Path::new(path).parent().filter(|d| !d.as_os_str().is_empty());
    let dir = parent.unwrap_or(std::path::Path::new("."));
    dir.canonicalize().map_err(|e| anyhow::anyhow!("{}: cannot find its directory: {e}", dir.display()))
}
