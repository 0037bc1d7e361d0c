//! etcd's keep-alive loop under a fault: the model's (`sim/src/backend/etcd/client.rs`, which claims to
//! be clientv3's `lessor`) against the real one — `etcdctl lease keep-alive` (Debian's `etcd-client`),
//! which runs clientv3's `KeepAlive` and prints every answer, and says when the keep-alive channel
//! closes. This is how a holder of an etcd lock learns it lost its lease (`lost_on = "keepalive"`):
//! when does the loop give up, and does it come back after a heal or a restart.
//!
//! A plan: a lease of TTL t is granted and a key put on it; the keep-alive starts (time 0 is its first
//! answer); then one fault:
//! - a *short cut* of the connection (well inside the TTL): keep-alives sent during it are held by TCP
//!   and answered after the heal; the keep-alive goes on and the lease lives;
//! - a *long cut* (past the TTL by seconds): the loop gives up a TTL after its last answer (clientv3
//!   `deadlineLoop`, which looks once a second), and the server revokes the lease;
//! - a *server kill* (SIGKILL, restarted with its data): short enough, and the keep-alive resumes on the
//!   new server, which kept the lease (the WAL); longer than the TTL, and the loop gives up while the
//!   server is down, and the lease expires on the restarted server.
//!
//! The timeline holds the last answer before the fault starts, the first after it, the moment the loop gave up, and whether
//! the lease is still there at the end (`LeaseTimeToLive`). A plan keeps each outcome seconds clear of
//! its edge: the real server takes a second or two to start, and the real client reconnects on gRPC's
//! backoff (1 s, then 1.6 times longer, each ±20%), where the model restarts at once and retries every
//! 500 ms.

use super::netns::Netns;
use super::{ClientFamily, Late, Margin, Play, Timeline};
use crate::servers::{Launcher, Server};
use crate::wire::http;
use locksim_locks::etcd::{connect, gateway, EtcdApi, EtcdConn, FAMILY};
use locksim_locks::params::Params;
use locksim_sim::backend::etcd::client::{EtcdClient, KeepAlive, Lessor};
use locksim_sim::backend::etcd::{EtcdReply, EtcdRequest, LeaseId, Op};
use locksim_sim::clock::sim_now_ns;
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::net::CallError;
use locksim_sim::rng::{ChaCha8Rng, Rng};
use locksim_sim::world::{Program, World};
use std::cell::RefCell;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The fault of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdFault {
    /// The client's connection cut for `ms`.
    Cut { ms: u64 },
    /// The server killed, and started again with its data `down_ms` later.
    ServerKill { down_ms: u64 },
}

/// One plan (times from the keep-alive's first answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub ttl_s: u64,
    pub fault_ms: u64,
    pub fault: EtcdFault,
}

impl Plan {
    fn ttl_ms(&self) -> u64 {
        self.ttl_s * 1000
    }

    /// The fault outlasts the lease: the keep-alive gives up.
    fn gives_up(&self) -> bool {
        match self.fault {
            EtcdFault::Cut { ms } | EtcdFault::ServerKill { down_ms: ms } => ms > self.ttl_ms(),
        }
    }

    /// When the fault ends.
    fn healed_ms(&self) -> u64 {
        match self.fault {
            EtcdFault::Cut { ms } | EtcdFault::ServerKill { down_ms: ms } => self.fault_ms + ms,
        }
    }

    /// When the lease is looked up: after the heal, past the moment a lease nobody keeps alive any more
    /// expires on the restarted server (its TTL and the election timeout from the restart, plus the
    /// real server's start).
    fn end_ms(&self) -> u64 {
        let settle = if self.gives_up() { self.ttl_ms() + 4000 } else { 3000 };
        self.healed_ms() + settle
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease TTL {} s kept alive; at {} ms ", self.ttl_s, self.fault_ms)?;
        match self.fault {
            EtcdFault::Cut { ms } => write!(f, "the connection is cut for {ms} ms")?,
            EtcdFault::ServerKill { down_ms } => write!(f, "the server is killed, restarted {down_ms} ms later")?,
        }
        write!(f, "; the lease looked up at {} ms", self.end_ms())
    }
}

/// The etcd client side.
#[derive(Default)]
pub struct EtcdClientSide;

const LAST_BEFORE: &str = "last keep-alive answer before the fault";
const RESUMED: &str = "first keep-alive answer after the fault";
const GAVE_UP: &str = "keep-alive gave up";
const LEASE_LIVES: &str = "lease lives";
const LEASE_GONE: &str = "lease gone";

impl ClientFamily for EtcdClientSide {
    const NAME: &'static str = "etcd-client";
    const ABOUT: &'static str =
        "Client side: clientv3's lease keep-alive loop (`etcdctl lease keep-alive`, Debian's etcd-client) \
         under cuts and a server kill — when it gives up, whether it comes back (needs root).";
    type Plan = Plan;

    fn server() -> &'static Launcher {
        &crate::servers::ETCD
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        // Midway between two of the loop's looks (every 500 ms from the first answer): a keep-alive
        // sent a few milliseconds either side of the fault's start is a race on a real machine.
        let fault_ms = rng.gen_range(4..=8) * 500 + 250;
        match rng.gen_range(0..4) {
            // A keep-alive held by the cut is retransmitted at most 1.4 s after it was sent, and the
            // last answer before the cut came at most TTL/3 + 0.5 s before it: with TTL ≥ 5 s the
            // loop's deadline stays over a second clear.
            0 => {
                let ttl_s = rng.gen_range(5..=6);
                Plan { ttl_s, fault_ms, fault: EtcdFault::Cut { ms: rng.gen_range(3..=12) * 100 } }
            }
            1 => {
                let ttl_s = rng.gen_range(3..=5);
                Plan { ttl_s, fault_ms, fault: EtcdFault::Cut { ms: ttl_s * 1000 + rng.gen_range(15..=40) * 100 } }
            }
            // Back within seconds, with a TTL long enough for the real server's start and the real
            // client's reconnect backoff.
            2 => Plan { ttl_s: 10, fault_ms, fault: EtcdFault::ServerKill { down_ms: rng.gen_range(10..=20) * 100 } },
            _ => {
                let ttl_s = rng.gen_range(3..=4);
                let down_ms = ttl_s * 1000 + rng.gen_range(20..=40) * 100;
                Plan { ttl_s, fault_ms, fault: EtcdFault::ServerKill { down_ms } }
            }
        }
    }

    fn kind(plan: &Plan) -> &'static str {
        match (plan.fault, plan.gives_up()) {
            (EtcdFault::Cut { .. }, false) => "short cut",
            (EtcdFault::Cut { .. }, true) => "cut past the TTL",
            (EtcdFault::ServerKill { .. }, false) => "server kill",
            (EtcdFault::ServerKill { .. }, true) => "server down past the TTL",
        }
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        model(plan, seed)
    }

    fn real(&self, plan: &Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
        real(plan, server, net)
    }

    fn margin(plan: &Plan, what: &str) -> Margin {
        match what {
            // The real server starts in a second or two, and the real client reconnects on gRPC's
            // backoff in the background, its calls waiting meanwhile (`WaitForReady`); the model's
            // server is back at once, but its client learns of the new server only when a call on the
            // old connection fails, and tries again at the loop's next look (docs/models.md, deliberate
            // differences).
            RESUMED if matches!(plan.fault, EtcdFault::ServerKill { .. }) => Margin { early_ms: 1100, late_ms: 4000 },
            // The send loop looks every 500 ms: a keep-alive due during a cut may leave just before it
            // (held, retransmitted after the heal) or just after it.
            RESUMED => Margin { early_ms: 600, late_ms: 600 },
            // The deadline loop looks once a second: a deadline a few milliseconds either side of its
            // look is found then or a second later.
            GAVE_UP => Margin { early_ms: 1100, late_ms: 1100 },
            // A look either way, or a keep-alive earlier when the look it moved to is past the
            // fault's start (see `undecided`).
            LAST_BEFORE => {
                Margin { early_ms: one_keep_alive_and_a_look(plan), late_ms: one_keep_alive_and_a_look(plan) }
            }
            _ => Margin { early_ms: LOOK_RACE_MS, late_ms: LOOK_RACE_MS },
        }
    }

    fn undecided(plan: &Plan, model: &Timeline, real: &Timeline) -> Option<String> {
        undecided(plan, model, real)
    }
}

/// How far apart the two sides' last answers before the fault may be when one lost the race: a
/// keep-alive (TTL/3) and a look, and the race's own slack.
fn one_keep_alive_and_a_look(plan: &Plan) -> u64 {
    plan.ttl_ms() / 3 + 500 + LOOK_RACE_MS
}

/// How far apart the two sides' keep-alive answers may fall before the real one is taken for one that
/// missed its look.
const LOOK_RACE_MS: u64 = 300;

/// The send loop looks every 500 ms for keep-alives due TTL/3 after their answer; an answer comes a few
/// milliseconds after the look that sent it, so the next one falls due a few milliseconds after a look
/// too, and whether that look still sends it is a race of milliseconds (the loop re-arms its 500 ms
/// *after* each look, so its looks drift later). The real loop loses that race now and then, more
/// often on a loaded machine: that keep-alive goes one look later, and so does every one after it. The
/// real client's last answer before the fault is then a look later than the model's, or — when that
/// look is past the fault's start — a keep-alive earlier; its deadline, and so its give-up, moves with
/// it. When the two last answers before the fault are further apart than the race allows but no more
/// than a keep-alive and a look, and the timelines then differ, the plan's outcome turned on that race:
/// undecided.
fn undecided(plan: &Plan, model: &Timeline, real: &Timeline) -> Option<String> {
    let (model_at, real_at) = (model.at(LAST_BEFORE)?, real.at(LAST_BEFORE)?);
    let apart = model_at.abs_diff(real_at);
    if apart <= LOOK_RACE_MS || apart > one_keep_alive_and_a_look(plan) {
        return None;
    }
    // The race moved the schedule; it decided nothing if the rest agrees all the same.
    super::differ(model, real, |what| EtcdClientSide::margin(plan, what))?;
    Some(format!(
        "{} the real keep-alive's last answer before the fault came at {real_at} ms, the model's at \
         {model_at} ms: a keep-alive went a look later on the real machine, which moved the give-up with it",
        super::UNDECIDED
    ))
}

/// What a play saw, on the play's clock from the keep-alive's start: the keep-alive's answers, when it
/// gave up, and whether the lease was there at the end.
struct Seen {
    answers: Vec<u64>,
    gave_up: Option<u64>,
    lease_lives: bool,
}

impl Seen {
    /// The timeline, with the first answer as time 0.
    fn timeline(&self, plan: &Plan) -> Timeline {
        let mut timeline = Timeline::default();
        let Some(&zero) = self.answers.first() else {
            timeline.push(0, "no keep-alive answer at all");
            return timeline;
        };
        if let Some(at) = self.answers.iter().rev().find(|&&at| at < zero + plan.fault_ms) {
            timeline.push(at - zero, LAST_BEFORE);
        }
        if let Some(at) = self.answers.iter().find(|&&at| at >= zero + plan.fault_ms) {
            timeline.push(at - zero, RESUMED);
        }
        if let Some(at) = self.gave_up {
            timeline.push(at.saturating_sub(zero), GAVE_UP);
        }
        timeline.push(plan.end_ms(), if self.lease_lives { LEASE_LIVES } else { LEASE_GONE });
        timeline.sorted()
    }
}

/// When the model's client starts its keep-alive (after the grant and the put).
const KEEP_ALIVE_FROM_MS: u64 = 1000;

/// The model's client with every keep-alive answer noted: the simulated client's loop as it is — or,
/// `planted`, with a bug the tests show conformance catches: a reset connection taken for a lost lease.
#[derive(Clone)]
struct Noted {
    client: EtcdClient,
    answers: Rc<RefCell<Vec<u64>>>,
    planted: bool,
}

impl Lessor for Noted {
    async fn keep_alive_once(&self, lease: LeaseId) -> Result<EtcdReply, CallError> {
        let answer = self.client.keep_alive_once(lease).await;
        if self.planted && answer == Err(CallError::Reset) {
            return Ok(EtcdReply::KeepAlive { id: lease, ttl_s: 0 });
        }
        if matches!(answer, Ok(EtcdReply::KeepAlive { ttl_s, .. }) if ttl_s > 0) {
            self.answers.borrow_mut().push(sim_now_ns() / 1_000_000);
        }
        answer
    }

    fn monotonic_ms(&self) -> i64 {
        self.client.monotonic_ms()
    }

    fn sleep(&self, d: Duration) -> impl std::future::Future<Output = ()> {
        self.client.sleep(d)
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + 'static) -> Background {
        self.client.spawn(task)
    }

    fn spawn_detached(&self, task: impl std::future::Future<Output = ()> + 'static) {
        self.client.spawn_detached(task)
    }

    fn stopped(&self, lease: LeaseId, why: &str) {
        self.client.stopped(lease, why)
    }
}

/// The plan in a simulated world: the model's etcd, the model's client, the fault as a scenario
/// injects it.
fn model(plan: &Plan, seed: u64) -> Timeline {
    model_with(plan, seed, false)
}

/// The model's timeline, with the planted bug of a keep-alive that takes a reset connection (a killed
/// server) for the end of its lease (`planted`).
pub fn model_with(plan: &Plan, seed: u64, planted: bool) -> Timeline {
    seen_in_model(plan, seed, planted).map(|s| s.timeline(plan)).unwrap_or_default()
}

/// What the model's client saw, on the world's clock.
fn seen_in_model(plan: &Plan, seed: u64, planted: bool) -> Option<Seen> {
    let seen = Arc::new(Mutex::new(None::<Seen>));
    let record = seen.clone();
    let plan = *plan;
    madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async move {
        let mut world = World::new(seed);
        let servers = (FAMILY.deploy)(&mut world, &Params::resolve(FAMILY.params, []));
        let program: Program = Arc::new(move |env| {
            let (servers, record) = (servers.clone(), record.clone());
            Box::pin(async move {
                let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                let EtcdConn::Sim(client) = connect(&ctx, &servers, Duration::from_secs(5)) else {
                    unreachable!("a simulated world's client")
                };
                let (lease, ttl) = client.grant(Duration::from_secs(plan.ttl_s)).await.expect("a grant");
                let put = Op::Put { key: "k".into(), value: "held".into(), lease };
                client.call(EtcdRequest::Op(put)).await.expect("a put");
                let ms = |ns: u64| ns / 1_000_000;
                ctx.sleep(Duration::from_millis(KEEP_ALIVE_FROM_MS.saturating_sub(ms(sim_now_ns())))).await;
                let answers = Rc::new(RefCell::new(Vec::new()));
                let keep_alive =
                    KeepAlive::start(Noted { client: client.clone(), answers: answers.clone(), planted }, lease, ttl);
                let end = KEEP_ALIVE_FROM_MS + plan.end_ms();
                let gave_up =
                    madsim::time::timeout(Duration::from_millis(end - KEEP_ALIVE_FROM_MS), keep_alive.stopped()).await;
                let gave_up = gave_up.ok().map(|_| ms(sim_now_ns()));
                ctx.sleep(Duration::from_millis(end.saturating_sub(ms(sim_now_ns())))).await;
                let lease_lives = matches!(
                    client.request(EtcdRequest::LeaseTimeToLive { id: lease }).await,
                    Ok(EtcdReply::TimeToLive { ttl_s, .. }) if ttl_s > 0
                );
                let answers = answers.borrow().clone();
                *record.lock().expect("seen lock") = Some(Seen { answers, gave_up, lease_lives });
                std::future::pending::<()>().await
            })
        });
        world.add_node("client-0", program);
        let at = Duration::from_millis(KEEP_ALIVE_FROM_MS + plan.fault_ms);
        let fault = match plan.fault {
            EtcdFault::Cut { ms } => Fault {
                at,
                target: Target::Node("client-0".into()),
                action: Action::Partition { peers: vec!["etcd-0".into()], duration: Some(Duration::from_millis(ms)) },
                on: None,
            },
            EtcdFault::ServerKill { down_ms } => Fault {
                at,
                target: Target::Node("etcd-0".into()),
                action: Action::Crash { restart_after: Some(Duration::from_millis(down_ms)), host: false },
                on: None,
            },
        };
        world.run(&[fault], Duration::from_millis(KEEP_ALIVE_FROM_MS + plan.end_ms() + 1000)).await;
        world.shutdown();
    });
    let mut seen = seen.lock().expect("seen lock");
    seen.take()
}

/// A unary request to the real server by its JSON gateway.
fn request(addr: std::net::SocketAddr, request: &EtcdRequest) -> anyhow::Result<EtcdReply> {
    let (path, body) = gateway::encode(request).expect("a unary request");
    let answer = http::post(addr, path, &body.to_string())?;
    Ok(gateway::decode(request, &serde_json::from_str(&answer)?))
}

/// How long the real client may take to start and answer.
const START_PATIENCE: Duration = Duration::from_secs(20);

/// The plan with the real clientv3 keep-alive loop (`etcdctl lease keep-alive`), in `net`.
fn real(plan: &Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
    let addr = server.addr().0;
    let lease = match request(addr, &EtcdRequest::LeaseGrant { ttl_s: plan.ttl_s as i64 })? {
        EtcdReply::LeaseGranted { id, .. } => id,
        other => anyhow::bail!("etcd answered a lease grant with {other:?}"),
    };
    let key = format!("k{lease:x}");
    request(addr, &EtcdRequest::Op(Op::Put { key, value: "held".into(), lease }))?;
    let mut command = Command::new("etcdctl");
    command
        .args(["--endpoints", &format!("http://{addr}"), "lease", "keep-alive", &format!("{lease:x}")])
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = super::spawn_dying_with_locksim(&mut command)
        .map_err(|e| anyhow::anyhow!("cannot start etcdctl (Debian's etcd-client; run .ci/install-servers): {e}"))?;
    let client = Killed(&mut child);
    // Every line, stamped when it is read: `lease … keepalived with TTL(n)` per answer, and `lease …
    // expired or revoked.` when the keep-alive channel closes.
    let (lines, read) = mpsc::channel::<(Instant, String)>();
    let stdout = client.0.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    let first = match read.recv_timeout(START_PATIENCE) {
        Ok((at, line)) if line.contains("keepalived") => at,
        Ok((_, line)) => anyhow::bail!("etcdctl lease keep-alive said {line:?} before any answer"),
        Err(_) => anyhow::bail!("etcdctl lease keep-alive had no answer from {addr} within {START_PATIENCE:?}"),
    };
    let play = Play::starting_at(first);
    match plan.fault {
        EtcdFault::Cut { ms } => {
            play.at(plan.fault_ms, "the cut");
            let cut = net.cut(addr.port())?;
            play.at(plan.fault_ms + ms, "the heal");
            net.heal(cut)?;
        }
        EtcdFault::ServerKill { down_ms } => {
            play.at(plan.fault_ms, "the kill");
            server.crash()?;
            play.at(plan.fault_ms + down_ms, "the restart");
            server.relaunch(true)?;
        }
    }
    play.at(plan.end_ms(), "the lookup");
    let lease_lives = matches!(
        request(addr, &EtcdRequest::LeaseTimeToLive { id: lease })?,
        EtcdReply::TimeToLive { ttl_s, .. } if ttl_s > 0
    );
    let mut seen = Seen { answers: vec![0], gave_up: None, lease_lives };
    while let Ok((at, line)) = read.try_recv() {
        if line.contains("keepalived") {
            seen.answers.push(play.ms_at(at));
        } else if line.contains("expired or revoked") {
            seen.gave_up = Some(play.ms_at(at));
        }
    }
    play.on_time()?;
    if seen.gave_up.is_some_and(|at| at > plan.end_ms()) {
        return Err(Late("etcdctl reported the keep-alive's end after the lookup".into()).into());
    }
    Ok(seen.timeline(plan))
}

/// The client's process, killed when the play ends (on an error too).
struct Killed<'a>(&'a mut std::process::Child);

impl Drop for Killed<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::client::plan;

    #[test]
    fn plans_keep_clear_of_the_edges_and_every_fault_is_drawn() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let p = plan::<EtcdClientSide>(seed);
            kinds.insert(EtcdClientSide::kind(&p));
            let ms = p.healed_ms() - p.fault_ms;
            match (p.fault, p.gives_up()) {
                (EtcdFault::Cut { .. }, false) => assert!(ms <= 1200 && p.ttl_s >= 5, "seed {seed}: {p}"),
                (_, true) => assert!(ms >= p.ttl_ms() + 1500, "seed {seed}: {p}"),
                (EtcdFault::ServerKill { .. }, false) => assert!(ms + 6000 <= p.ttl_ms(), "seed {seed}: {p}"),
            }
        }
        assert_eq!(kinds.len(), 4, "{kinds:?}");
    }

    #[test]
    fn the_models_keep_alive_gives_up_a_ttl_after_its_last_answer_and_comes_back_after_a_short_cut() {
        let long = Plan { ttl_s: 3, fault_ms: 2000, fault: EtcdFault::Cut { ms: 6000 } };
        let t = EtcdClientSide.model(&long, 1);
        // Answers at 0 and ~1.5 s (TTL/3 after the first, on the 500 ms grid); the deadline 3 s after
        // the last, found by the once-a-second look.
        let gave_up = t.at(GAVE_UP).unwrap_or_else(|| panic!("gave up: {t}"));
        assert!((4000..=5100).contains(&gave_up), "{t}");
        assert_eq!(t.at(LEASE_GONE), Some(long.end_ms()), "{t}");
        assert_eq!(t.at(RESUMED), None, "{t}");

        let short = Plan { ttl_s: 5, fault_ms: 2000, fault: EtcdFault::Cut { ms: 800 } };
        let t = EtcdClientSide.model(&short, 1);
        assert_eq!(t.at(GAVE_UP), None, "{t}");
        assert_eq!(t.at(LEASE_LIVES), Some(short.end_ms()), "{t}");
        assert!(t.at(RESUMED).is_some(), "{t}");
    }

    #[test]
    fn the_models_keep_alives_go_every_ttl_over_3_on_the_look_it_falls_on() {
        // TTL 3 s: the real client's answers come at 0, 1.00, 2.00, 3.00 s; had the model counted TTL/3
        // from each answer (a few milliseconds after its look), every keep-alive would wait one more
        // look: 0, 1.5, 3.0 s.
        let p = Plan { ttl_s: 3, fault_ms: 9000, fault: EtcdFault::Cut { ms: 100 } };
        let seen = seen_in_model(&p, 5, false).expect("a play");
        let from_first: Vec<u64> = seen.answers.iter().map(|at| at - seen.answers[0]).take(4).collect();
        for (k, at) in from_first.iter().enumerate() {
            assert!(at.abs_diff(k as u64 * 1000) < 25, "{from_first:?}");
        }
    }

    #[test]
    fn the_models_first_keep_alive_goes_at_once() {
        let p = Plan { ttl_s: 3, fault_ms: 100, fault: EtcdFault::Cut { ms: 6000 } };
        // Cut just after the first answer: the deadline is a TTL after it, found by the once-a-second
        // look that started with the loop, a few milliseconds before the first answer — at 4 s of
        // the loop. Had the first keep-alive waited for the loop's first 500 ms, it would be 3.5 s
        // after that answer.
        let t = EtcdClientSide.model(&p, 3);
        let gave_up = t.at(GAVE_UP).expect("gave up");
        assert!((3950..=4000).contains(&gave_up), "{t}");
    }

    #[test]
    fn a_real_keep_alive_a_look_off_before_the_fault_is_undecided_not_a_mismatch() {
        // CI's seed 0: TTL 3 s, the server killed at 4,250 ms; the real answer due at 4,000 ms went
        // a look later, into the kill, so the real client gave up two seconds before the model's.
        let p = Plan { ttl_s: 3, fault_ms: 4250, fault: EtcdFault::ServerKill { down_ms: 5900 } };
        let side = |last: u64, gave_up: u64| {
            let mut t = Timeline::default();
            t.push(last, LAST_BEFORE);
            t.push(gave_up, GAVE_UP);
            t.push(p.end_ms(), LEASE_GONE);
            t.sorted()
        };
        let model = side(4004, 7981);
        let why = EtcdClientSide::undecided(&p, &model, &side(3003, 6003)).expect("undecided");
        assert!(why.starts_with(super::super::UNDECIDED), "{why}");
        let agree = |real: &Timeline| super::super::differ(&model, real, |w| EtcdClientSide::margin(&p, w));
        // A look later (seeds 1 and 39 of a loaded run) whose give-up agrees all the same: compared.
        assert_eq!(EtcdClientSide::undecided(&p, &model, &side(4503, 7003)), None);
        assert_eq!(agree(&side(4503, 7003)), None);
        // A look later that moved the give-up past its margin: the same race, undecided.
        assert!(EtcdClientSide::undecided(&p, &model, &side(4503, 9100)).is_some());
        // Two keep-alives early is no race of one look: compared, and a mismatch.
        assert_eq!(EtcdClientSide::undecided(&p, &model, &side(2003, 5003)), None);
        assert!(agree(&side(2003, 5003)).is_some_and(|why| why.contains(LAST_BEFORE)));
        // The same answers on both sides: compared, and the give-up must agree.
        assert_eq!(EtcdClientSide::undecided(&p, &model, &side(4010, 6003)), None);
        assert!(agree(&side(4010, 6003)).is_some_and(|why| why.contains(GAVE_UP)));
    }
}
