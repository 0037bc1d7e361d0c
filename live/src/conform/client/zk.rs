//! ZooKeeper's client library under a fault: the model's client (`sim/src/backend/zk/client.rs`, which
//! claims to be the Java `ClientCnxn`) against the real one — ZooKeeper 3.8's `ZooKeeperMain` (zkCli,
//! from Debian's `zookeeper` jar), whose watcher prints every change of connection state — when
//! `Disconnected` comes, which requests fail and when, whether the session comes back or `Expired`.
//!
//! A plan: the client opens a session of timeout T, creates an ephemeral `/x` at 300 ms, then one fault:
//! - a *short cut* of its connection (well inside the read timeout 2/3·T): a `get /x` sent during it is
//!   held by TCP and answered after the heal, and nothing else happens;
//! - a *long cut* (past T by seconds): the `get /x` sent during it fails with `ConnectionLoss` at the
//!   moment the client gives up on the connection (`Disconnected`, read timeout after the last word from
//!   the server), and after the heal the client learns its session `Expired`;
//! - a *server kill* (SIGKILL, restarted with its data after a while): `Disconnected` at once (its
//!   kernel closes the connection), a `get /x` made meanwhile fails, and the client re-attaches its
//!   session once the server is back; a final `get /x` finds the ephemeral still there;
//! - a *client pause* (SIGSTOP, past T by seconds): the server expires the session and closes its
//!   connection meanwhile, so the resumed client reads the end of its stream — `Disconnected` at once —
//!   and learns the session `Expired` at its re-attach (1–2 s later for the Java client, 0.1 s for
//!   kazoo); no `get` is sent.
//!
//! Cuts are either well inside the read timeout or past the session's expiry by seconds: between the
//! two, whether the session survives depends on the real client's random re-attach delay. The times of
//! re-attach and expiry are compared with wide margins for the same reason (a second of jitter, up to
//! a connect timeout of waiting); the moment of `Disconnected` and of a failed request closely.

use super::netns::Netns;
use super::{spawn_dying_with_locksim, ClientFamily, Late, Margin, Play, Timeline};
use crate::servers::{Launcher, Server};
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::zk::{ZkSession, BACKEND_PARAMS, FAMILY};
use locksim_sim::backend::zk::client::{ClientError, ConnState, Library, ZkClient};
use locksim_sim::backend::zk::{CreateMode, ZkError, ZkOp, ZkReply};
use locksim_sim::clock::sim_now_ns;
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::rng::{ChaCha8Rng, Rng};
use locksim_sim::world::{Program, World};
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The fault of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZkFault {
    /// The client's connection cut for `ms` (short: inside the read timeout; long: past expiry).
    Cut { ms: u64 },
    /// The server killed, and started again with its data `down_ms` later.
    ServerKill { down_ms: u64 },
    /// The client's process stopped for `ms` (past its session's expiry), then resumed.
    Pause { ms: u64 },
}

/// One plan (times from the moment the session is connected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The session timeout asked for (the conformance server's tickTime of 200 ms keeps it).
    pub timeout_ms: u64,
    pub fault_ms: u64,
    pub fault: ZkFault,
}

/// When the plan's client creates `/x`.
const CREATE_MS: u64 = 300;

impl Plan {
    fn read_timeout_ms(&self) -> u64 {
        self.timeout_ms * 2 / 3
    }

    /// When the `get /x` during the fault is sent (none to a stopped process).
    fn ask_ms(&self) -> Option<u64> {
        match self.fault {
            ZkFault::Cut { .. } => Some(self.fault_ms + 50),
            ZkFault::ServerKill { .. } => Some(self.fault_ms + 300),
            ZkFault::Pause { .. } => None,
        }
    }

    /// The `get /x`s, in order.
    fn gets_ms(&self) -> impl Iterator<Item = u64> {
        self.ask_ms().into_iter().chain(self.final_ms())
    }

    /// When a final `get /x` is sent, for the plans whose session lives on.
    fn final_ms(&self) -> Option<u64> {
        match self.fault {
            ZkFault::Cut { ms } if ms < self.read_timeout_ms() => Some(self.fault_ms + ms + 1500),
            ZkFault::Cut { .. } | ZkFault::Pause { .. } => None,
            ZkFault::ServerKill { down_ms } => Some(self.fault_ms + down_ms + 7000),
        }
    }

    fn end_ms(&self) -> u64 {
        match self.fault {
            ZkFault::Cut { ms } => self.final_ms().unwrap_or(self.fault_ms + ms + self.timeout_ms + 4000) + 1000,
            ZkFault::ServerKill { .. } => self.final_ms().expect("a final get") + 1000,
            ZkFault::Pause { ms } => self.fault_ms + ms + 4000,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session timeout {} ms; create -e /x at {CREATE_MS} ms; at {} ms ", self.timeout_ms, self.fault_ms)?;
        match self.fault {
            ZkFault::Cut { ms } => write!(f, "the connection is cut for {ms} ms")?,
            ZkFault::ServerKill { down_ms } => write!(f, "the server is killed, restarted {down_ms} ms later")?,
            ZkFault::Pause { ms } => write!(f, "the client's process is stopped for {ms} ms")?,
        }
        let gets: Vec<String> = self.gets_ms().map(|at| format!("{at} ms")).collect();
        if !gets.is_empty() {
            write!(f, "; get /x at {}", gets.join(" and at "))?;
        }
        Ok(())
    }
}

/// How long after the heal of a cut past the session's expiry a client learns it `Expired`, at most
/// (see [`ZkClientSide::margin`]), with the few milliseconds of a connect's round trip.
const EXPIRED_WITHIN_MS: u64 = 4200;

/// The ZooKeeper client side.
#[derive(Default)]
pub struct ZkClientSide;

pub(crate) const CREATED: &str = "create /x: ok";
pub(crate) const GOT: &str = "get /x: ok";
pub(crate) const GET_LOST: &str = "get /x: connection loss";
pub(crate) const NO_NODE: &str = "get /x: no node";
pub(crate) const GET_EXPIRED: &str = "get /x: session expired";
pub(crate) const DISCONNECTED: &str = "disconnected";
pub(crate) const RECONNECTED: &str = "reconnected";
pub(crate) const EXPIRED: &str = "expired";

impl ClientFamily for ZkClientSide {
    const NAME: &'static str = "zk-client";
    const ABOUT: &'static str =
        "Client side: the Java ZooKeeper client (zkCli) under cuts, a server kill and a client pause — when it is \
         disconnected, which requests fail, whether its session comes back (needs root and java).";
    type Plan = Plan;

    fn server() -> &'static Launcher {
        &crate::servers::ZOOKEEPER
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        let fault_ms = rng.gen_range(10..=20) * 100;
        match rng.gen_range(0..10) {
            // Short cuts need a read timeout long enough to leave room for TCP's retransmission, and
            // heal 50 ms or more clear of the `get`'s loss probe (200 ms after it, 208 ms on a real
            // kernel): it gets through at the probe or at the retransmission 200 ms later.
            0..=2 => {
                let timeout_ms = 4000;
                let ms = if rng.gen_bool(0.5) { rng.gen_range(100..=200) } else { rng.gen_range(300..=350) };
                Plan { timeout_ms, fault_ms, fault: ZkFault::Cut { ms } }
            }
            3..=6 => {
                let timeout_ms = rng.gen_range(2..=4) * 1000;
                let ms = timeout_ms + rng.gen_range(25..=40) * 100;
                Plan { timeout_ms, fault_ms, fault: ZkFault::Cut { ms } }
            }
            // Stopped past T by seconds, so the server has expired the session and closed its
            // connection well before the resume.
            7 => {
                let timeout_ms = rng.gen_range(2..=4) * 1000;
                let ms = timeout_ms + rng.gen_range(25..=40) * 100;
                Plan { timeout_ms, fault_ms, fault: ZkFault::Pause { ms } }
            }
            // Down long enough for a connect attempt to be refused first (the client tries 1–2 s after
            // the disconnect): the request made meanwhile fails then, rather than racing the restart.
            _ => Plan {
                timeout_ms: 4000,
                fault_ms,
                fault: ZkFault::ServerKill { down_ms: rng.gen_range(25..=35) * 100 },
            },
        }
    }

    fn kind(plan: &Plan) -> &'static str {
        match plan.fault {
            ZkFault::Cut { ms } if ms < plan.read_timeout_ms() => "short cut",
            ZkFault::Cut { .. } => "cut past expiry",
            ZkFault::ServerKill { .. } => "server kill",
            ZkFault::Pause { .. } => "client pause past expiry",
        }
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        model(plan, seed)
    }

    fn real(&self, plan: &Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
        real(plan, server, net)
    }

    fn margin(plan: &Plan, what: &str) -> Margin {
        let kill = matches!(plan.fault, ZkFault::ServerKill { .. });
        match what {
            // The real client re-attaches after 1 s plus a random second, and a connect attempt waits
            // up to T for an answer; the real server takes a second or two to start.
            RECONNECTED => Margin { early_ms: 2000, late_ms: plan.timeout_ms + 3000 },
            // Learnt at the first re-attach attempt that gets through after the heal. The one in
            // progress at the heal gets through at its SYN's next retransmission (1 or 3 s after the
            // SYN) if that comes before its connect timeout T; if not, it fails within 1 s of the heal
            // (T of 2 or 4 s) or 2 s (T of 3 s: the SYN at 3 s comes with the timeout), and the next
            // attempt, 1–2 s later, goes at once. Each side learns it within 4 s of the heal, where its
            // own random waits put it (docs/models.md, deliberate differences).
            EXPIRED => Margin { early_ms: EXPIRED_WITHIN_MS, late_ms: EXPIRED_WITHIN_MS },
            // A request made while disconnected waits for the next connect attempt, 1–2 s later, and
            // fails when it is refused.
            GET_LOST if kill => Margin { early_ms: 1500, late_ms: 1500 },
            _ => Margin { early_ms: 150, late_ms: 300 },
        }
    }
}

/// The words of a call's outcome.
pub(crate) fn said(
    reply: Result<(ZkReply, Option<locksim_sim::backend::zk::client::Watch>), ClientError>,
) -> &'static str {
    match reply {
        Ok((ZkReply::Created { .. }, _)) => CREATED,
        Ok((ZkReply::Data { .. }, _)) => GOT,
        Err(ClientError::ConnectionLoss) => GET_LOST,
        Err(ClientError::Zk(ZkError::NoNode)) => NO_NODE,
        Err(ClientError::Zk(ZkError::SessionExpired)) => GET_EXPIRED,
        _ => "unexpected",
    }
}

/// The plan in a simulated world: the model's ZooKeeper (tickTime as the conformance server's), the
/// model's client, the fault as a scenario injects it.
fn model(plan: &Plan, seed: u64) -> Timeline {
    model_with(plan, seed, false)
}

/// The model's timeline, with the server's kill taken for its host's death (`host`: its kernel closes nothing) —
/// a planted bug the tests show conformance catches.
pub fn model_with(plan: &Plan, seed: u64, host: bool) -> Timeline {
    model_as(plan, seed, host, Library::Java)
}

/// The model's timeline with its client speaking as `library` (`host`: as [`model_with`]).
pub fn model_as(plan: &Plan, seed: u64, host: bool, library: Library) -> Timeline {
    let seen = Arc::new(Mutex::new(Timeline::default()));
    let timeline = seen.clone();
    let plan = plan.clone();
    madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async move {
        let mut world = World::new(seed);
        let tick = Duration::from_millis(crate::servers::ZK_TICK_MS);
        let params = Params::resolve(BACKEND_PARAMS, [("tick_time", ParamValue::Duration(tick))]);
        let servers = (FAMILY.deploy)(&mut world, &params);
        let start = sim_now_ns();
        let client_plan = plan.clone();
        let program: Program = Arc::new(move |env| {
            let (plan, servers, seen) = (client_plan.clone(), servers.clone(), seen.clone());
            Box::pin(async move {
                let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                let now_ms = || (sim_now_ns() - start) / 1_000_000;
                let record = |what: &'static str| seen.lock().expect("timeline lock").push(now_ms(), what);
                let until = |ms: u64| ctx.sleep(Duration::from_millis(ms.saturating_sub(now_ms())));
                let session = ZkSession::new(&ctx, &servers, Duration::from_millis(plan.timeout_ms)).speaking(library);
                let Some(zk) = session.live().await else { return };
                let _states = ctx.spawn(states(zk.clone(), record_into(seen.clone(), start)));
                until(CREATE_MS).await;
                let create = ZkOp::Create { path: "/x".into(), data: "held".into(), mode: CreateMode::Ephemeral };
                record(said(zk.call(create).await));
                // Each get on its own, as a real client's asynchronous request: one the client holds
                // (kazoo queues it while disconnected) does not hold up the next.
                let mut gets = Vec::new();
                for at in plan.gets_ms() {
                    until(at).await;
                    let (zk, record) = (zk.clone(), record_into(seen.clone(), start));
                    gets.push(ctx.spawn(async move {
                        record(said(zk.call(ZkOp::GetData { path: "/x".into(), watch: false }).await));
                    }));
                }
                std::future::pending::<()>().await
            })
        });
        world.add_node("client-0", program);
        let fault = match plan.fault {
            ZkFault::Cut { ms } => Fault {
                at: Duration::from_millis(plan.fault_ms),
                target: Target::Node("client-0".into()),
                action: Action::Partition { peers: vec!["zk-0".into()], duration: Some(Duration::from_millis(ms)) },
                on: None,
            },
            ZkFault::ServerKill { down_ms } => Fault {
                at: Duration::from_millis(plan.fault_ms),
                target: Target::Node("zk-0".into()),
                action: Action::Crash { restart_after: Some(Duration::from_millis(down_ms)), host },
                on: None,
            },
            ZkFault::Pause { ms } => Fault {
                at: Duration::from_millis(plan.fault_ms),
                target: Target::Node("client-0".into()),
                action: Action::Pause { duration: Duration::from_millis(ms) },
                on: None,
            },
        };
        world.run(&[fault], Duration::from_millis(plan.end_ms())).await;
        world.shutdown();
    });
    let timeline = timeline.lock().expect("timeline lock").clone();
    timeline.sorted()
}

fn record_into(seen: Arc<Mutex<Timeline>>, start: u64) -> impl Fn(&'static str) {
    move |what| seen.lock().expect("timeline lock").push((sim_now_ns() - start) / 1_000_000, what)
}

/// Each change of the session's connection state, as the Java client's default watcher prints it.
async fn states(zk: ZkClient, record: impl Fn(&'static str)) {
    let mut state = zk.state();
    state.borrow_and_update();
    let mut was = ConnState::Connected;
    while state.changed().await.is_ok() {
        let now = *state.borrow_and_update();
        match (was, now) {
            (_, ConnState::Disconnected) => record(DISCONNECTED),
            (ConnState::Disconnected, ConnState::Connected) => record(RECONNECTED),
            (_, ConnState::Expired) => record(EXPIRED),
            _ => {}
        }
        was = now;
    }
}

/// How long the real client may take to start and connect.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// A real ZooKeeper client library, driven by zkCli's commands on its stdin (`create -e PATH DATA`,
/// `get PATH`, `quit`) and read from its output: the Java client's `ZooKeeperMain`, or kazoo's driver
/// (`super::kazoo`). The plans, the play and the comparison are the same for both.
pub struct RealClient {
    /// Its name in errors.
    pub name: &'static str,
    /// Start it, connecting to `addr` with a session timeout of `timeout_ms`.
    pub spawn: fn(addr: std::net::SocketAddr, timeout_ms: u64) -> anyhow::Result<std::process::Child>,
    /// A line of its output, read at `at`, and the path the play uses: what it says.
    pub line: fn(line: &str, at: Instant, path: &str) -> Said,
}

/// What a line of a real client's output says.
pub enum Said {
    /// The session is connected: the play's time 0, if it is the first.
    Connected(Instant),
    /// An event of the timeline, at that moment.
    Event(Instant, &'static str),
    Nothing,
}

/// The Java client: ZooKeeper's `ZooKeeperMain` from Debian's jar.
const JAVA: RealClient = RealClient { name: "the ZooKeeper Java client", spawn: java_spawn, line: java_line };

fn java_spawn(addr: std::net::SocketAddr, timeout_ms: u64) -> anyhow::Result<std::process::Child> {
    let jar = "/usr/share/java/zookeeper.jar";
    let mut java = Command::new("java");
    java.args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", jar])
        .arg("org.apache.zookeeper.ZooKeeperMain")
        .args(["-timeout", &timeout_ms.to_string(), "-server", &addr.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_dying_with_locksim(&mut java)
        .map_err(|e| anyhow::anyhow!("cannot start the ZooKeeper Java client (zookeeper, java): {e}"))
}

/// zkCli's lines, stamped when read: answers come on stdout, errors (and `Created`) on stderr, every
/// change of connection state from its watcher.
fn java_line(line: &str, at: Instant, path: &str) -> Said {
    let line = line.trim();
    let what = match line {
        l if l.contains("state:SyncConnected") => return Said::Connected(at),
        l if l.contains("state:Disconnected") => DISCONNECTED,
        l if l.contains("state:Expired") => EXPIRED,
        l if l == format!("Created {path}") => CREATED,
        "held" => GOT,
        l if l.ends_with(&format!("ConnectionLoss for {path}")) => GET_LOST,
        l if l == format!("Node does not exist: {path}") => NO_NODE,
        l if l.ends_with(&format!("Session expired for {path}")) => GET_EXPIRED,
        _ => return Said::Nothing,
    };
    Said::Event(at, what)
}

/// The plan with the real Java client, `ZooKeeperMain` reading its commands from a pipe, in `net`.
fn real(plan: &Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
    play_real(plan, server, net, &JAVA)
}

/// The plan with `client` in `net`: its commands at the plan's times, the fault from a thread beside
/// them, and what it said, as a timeline from its first connection.
pub fn play_real(plan: &Plan, server: &mut Server, net: &Netns, client: &RealClient) -> anyhow::Result<Timeline> {
    let addr = server.addr().0;
    let mut child = (client.spawn)(addr, plan.timeout_ms)?;
    let pid = child.id() as libc::pid_t;
    let reaped = Reaped(&mut child);
    let mut stdin = reaped.0.stdin.take().expect("piped");
    // Every line, stamped when it is read.
    let (lines, read) = mpsc::channel::<(Instant, String)>();
    let stdout: Box<dyn std::io::Read + Send> = Box::new(reaped.0.stdout.take().expect("piped"));
    let stderr: Box<dyn std::io::Read + Send> = Box::new(reaped.0.stderr.take().expect("piped"));
    for output in [stdout, stderr] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if lines.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
    }
    drop(lines);
    // A path of this play's own: a play before it on the same server may have left its session (and
    // so its ephemeral) behind until the session expires.
    static PLAYS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = format!("/x{}", PLAYS.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
    // Time 0: the session is connected.
    let deadline = Instant::now() + START_PATIENCE;
    let connected = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match read.recv_timeout(left) {
            Ok((at, line)) => match (client.line)(&line, at, &path) {
                Said::Connected(at) => break at,
                _ => continue,
            },
            Err(_) => anyhow::bail!("{} did not connect to {addr} within {START_PATIENCE:?}", client.name),
        }
    };
    let play = Play::starting_at(connected);
    let mut send = |ms: u64, command: &str| -> anyhow::Result<()> {
        play.at(ms, command);
        writeln!(stdin, "{command}")?;
        Ok(stdin.flush()?)
    };
    let get = format!("get {path}");
    send(CREATE_MS, &format!("create -e {path} held"))?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let faults = scope.spawn(|| -> anyhow::Result<()> {
            match plan.fault {
                ZkFault::Cut { ms } => {
                    play.at(plan.fault_ms, "the cut");
                    let cut = net.cut(addr.port())?;
                    play.at(plan.fault_ms + ms, "the heal");
                    net.heal(cut)
                }
                ZkFault::ServerKill { down_ms } => {
                    play.at(plan.fault_ms, "the kill");
                    server.crash()?;
                    // A real server takes a second or more to start: the client's steps go on meanwhile.
                    play.at(plan.fault_ms + down_ms, "the restart");
                    server.relaunch(true)?;
                    // The margins allow the restarted server a few seconds to load; one the machine kept
                    // from serving longer than that leaves the client nothing to re-attach to in time.
                    play.by(plan.fault_ms + down_ms + RESTART_WITHIN_MS, "the restarted server ready");
                    Ok(())
                }
                ZkFault::Pause { ms } => {
                    play.at(plan.fault_ms, "the stop");
                    signal(pid, libc::SIGSTOP)?;
                    play.at(plan.fault_ms + ms, "the resume");
                    signal(pid, libc::SIGCONT)
                }
            }
        });
        for at in plan.gets_ms() {
            send(at, &get)?;
        }
        faults.join().expect("the fault thread")
    })?;
    play.at(plan.end_ms(), "the end");
    // Close the session, so that its ephemeral goes now; the client says what it still has to say
    // before it exits.
    send(plan.end_ms(), "quit")?;
    drop(stdin);
    let mut seen = Timeline::default();
    let patience = Instant::now() + QUIT_PATIENCE;
    while let Ok((at, line)) = read.recv_timeout(patience.saturating_duration_since(Instant::now())) {
        match (client.line)(&line, at, &path) {
            // The first was time 0: each after it is the session re-attached.
            Said::Connected(at) => seen.push(play.ms_at(at), RECONNECTED),
            Said::Event(at, what) => seen.push(play.ms_at(at), what),
            Said::Nothing => {}
        }
    }
    play.on_time()?;
    // The create goes before any fault, and a real server answers it within milliseconds: an answer a
    // margin late can only be a slow machine (the client's process starved), never the model's error
    // (kazoo's margin for it is the same).
    let slowest = CREATE_MS + ZkClientSide::margin(plan, CREATED).late_ms;
    if let Some(at) = seen.at(CREATED).filter(|at| *at > slowest && *at < plan.fault_ms) {
        return Err(Late(format!("{} answered the create at {at} ms, before any fault", client.name)).into());
    }
    Ok(seen.sorted())
}

/// Send `sig` to the client's process.
fn signal(pid: libc::pid_t, sig: libc::c_int) -> anyhow::Result<()> {
    // SAFETY: `kill` only sends a signal; `pid` is our own child, not yet reaped.
    match unsafe { libc::kill(pid, sig) } {
        0 => Ok(()),
        _ => Err(anyhow::anyhow!("cannot signal the client ({pid}): {}", std::io::Error::last_os_error())),
    }
}

/// How long a restarted real ZooKeeper may take to serve (a JVM's start, its data loaded) before the
/// play is the machine's, not the client's: a second or two when the machine is idle.
const RESTART_WITHIN_MS: u64 = 4000;

/// How long a client may take, after `quit`, to say what it still has to say (kazoo's driver waits for
/// requests it still holds) and exit.
const QUIT_PATIENCE: Duration = Duration::from_secs(40);

/// The client's process, reaped when the play ends: given a moment to act on a `quit` (closing its
/// session), then killed (on an error too).
struct Reaped<'a>(&'a mut std::process::Child);

impl Drop for Reaped<'_> {
    fn drop(&mut self) {
        let patience = Instant::now() + Duration::from_secs(2);
        while Instant::now() < patience && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::client::plan;

    #[test]
    fn plans_keep_clear_of_the_survival_edge_and_every_fault_is_drawn() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let p = plan::<ZkClientSide>(seed);
            kinds.insert(ZkClientSide::kind(&p));
            if let ZkFault::Cut { ms } = p.fault {
                // Short: the held request is sent again (at 0.2, 0.4, 0.8 s after it was sent) well
                // before the read timeout; long: healed seconds after the session expired.
                assert!(ms <= 350 || ms >= p.timeout_ms + 2500, "seed {seed}: {p}");
                // Clear of the `get`'s loss probe, sent 50 ms into the cut and probed 200 ms later.
                assert!(ms.abs_diff(250) >= 50 || ms > 350, "seed {seed}: {p}");
            }
        }
        assert_eq!(kinds.len(), 4, "{kinds:?}");
    }

    #[test]
    fn the_model_fails_the_held_request_at_the_disconnect_and_expires_after_a_long_cut() {
        let p = Plan { timeout_ms: 3000, fault_ms: 1000, fault: ZkFault::Cut { ms: 6000 } };
        let t = ZkClientSide.model(&p, 1);
        assert_eq!(t.whats(), [CREATED, DISCONNECTED, EXPIRED, GET_LOST], "{t}");
        let at = |what| t.at(what).unwrap();
        assert_eq!(at(DISCONNECTED), at(GET_LOST), "failed at the disconnect (ClientCnxn.cleanup): {t}");
        assert!(at(EXPIRED) > 7000, "learnt only after the heal: {t}");
    }

    #[test]
    fn after_a_cut_past_expiry_the_model_learns_it_within_one_reattach_of_the_heal() {
        let mut played = 0;
        for seed in 0..60 {
            let p = plan::<ZkClientSide>(seed);
            let ZkFault::Cut { ms } = p.fault else { continue };
            if ms < p.read_timeout_ms() {
                continue;
            }
            let t = ZkClientSide.model(&p, seed);
            let expired = t.at(EXPIRED).expect("expired");
            let heal = p.fault_ms + ms;
            // Not behind what the old connection still holds: its retransmissions (at 6.4, 12.8 s … after
            // the cut's first send) once made it up to ~6 s.
            assert!(expired >= heal && expired <= heal + EXPIRED_WITHIN_MS, "seed {seed}: {p}\n{t}");
            played += 1;
        }
        assert!(played >= 10, "{played}");
    }

    /// Debian's ZooKeeper 3.8 closes an expired session's connection (kazoo went SUSPENDED the moment
    /// its stopped process resumed, LOST 0.1 s later): the model's resumed client reads the close first,
    /// and learns of the expiry only at its re-attach.
    #[test]
    fn a_client_stopped_past_expiry_is_disconnected_on_resume_and_expired_at_its_reattach() {
        let p = Plan { timeout_ms: 2000, fault_ms: 1000, fault: ZkFault::Pause { ms: 5000 } };
        for (library, within) in [(Library::Java, 1000..2100), (Library::Kazoo, 50..200)] {
            let t = model_as(&p, 1, false, library);
            assert_eq!(t.whats(), [CREATED, DISCONNECTED, EXPIRED], "{library:?}: {t}");
            let at = |what| t.at(what).unwrap();
            assert!((6000..6050).contains(&at(DISCONNECTED)), "at the resume: {library:?} {t}");
            assert!(within.contains(&(at(EXPIRED) - at(DISCONNECTED))), "at the re-attach: {library:?} {t}");
        }
    }
}
