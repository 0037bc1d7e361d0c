//! Conformance: the simulated servers against the real ones. From a seed, a family draws a script —
//! operations of several clients at fixed times, and server faults between them — and plays it twice:
//! on the model (the `sim` crate's state machine, driven directly at the script's times) and on the
//! real server on loopback (one thread and one connection per client). Each step's answer is
//! normalised to text on both sides; the first step whose answers differ is a mismatch.
//!
//! Time is what makes such a comparison flaky, so scripts are drawn on a grid: every operation is
//! sent on a multiple of [`SLOT_MS`], and every expiry the script sets (a TTL, a timeout) falls half a
//! slot between two of them. An answer that depends on time is then the same whether the real server
//! saw the request a few milliseconds late or not, as long as it was seen within [`MARGIN_MS`] of its
//! time. The real run checks that for every step (sent no later than the margin, answered no later
//! than the margin after the model answered), and a run that missed it — a loaded machine — is
//! *inconclusive*: played again, and never reported as a mismatch.
//!
//! When an answer comes is compared too, where it says something a loaded machine cannot: a real answer
//! a slot or more *before* the model's (the model made a request wait that the server did not), or a
//! slot or more *after* it at the same step in both plays (the server made it wait and the model did
//! not; a busy machine is rarely late twice at one step by a whole slot — and when other scripts were
//! played beside it, [`replay_alone`] plays it once more with nothing beside it).

pub mod client;
pub mod ensemble;
pub mod etcd;
pub mod redis;
pub mod sql;
pub mod zk;

use crate::servers::{Addr, Server};
use locksim_sim::backend::Backend;
use locksim_sim::rng::{stream, ChaCha8Rng, Stream};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The grid of a script's times, in milliseconds.
pub const SLOT_MS: u64 = 100;

/// How late (real against model) a step may be sent or answered and still be compared.
pub const MARGIN_MS: u64 = 40;

/// What happens at one step of a script.
#[derive(Debug, Clone, PartialEq)]
pub enum Action<Op> {
    /// Client `client` sends `op` and waits for the answer.
    Client { client: usize, op: Op },
    /// The server is killed and started again; `keep`: with its data (persistence, a data directory).
    Restart { keep: bool },
    /// The server is stopped (SIGSTOP) for `ms`, then continued.
    Stop { ms: u64 },
}

/// One step: at `at_ms` after the start, `action`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<Op> {
    pub at_ms: u64,
    pub action: Action<Op>,
}

impl<Op: fmt::Display> fmt::Display for Step<Op> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.action {
            Action::Client { client, op } => write!(f, "{:>6} ms  client-{client}  {op}", self.at_ms),
            Action::Restart { keep: true } => write!(f, "{:>6} ms  server    restart (data kept)", self.at_ms),
            Action::Restart { keep: false } => write!(f, "{:>6} ms  server    restart (data lost)", self.at_ms),
            Action::Stop { ms } => write!(f, "{:>6} ms  server    stop for {ms} ms", self.at_ms),
        }
    }
}

/// The model's answer to a step, and when (script time) it was given.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub text: String,
    pub at_ms: u64,
}

/// A model a family checks: the simulated server ([`Backend`], driven directly at a script's times),
/// and what a crash or restart of the real server does to it — which the simulated world does by
/// running the server's program again, and a script must do by hand.
pub trait Recover: Backend {
    /// The server was killed and started again, up at `now_ms` on its monotonic clock: it keeps what
    /// the real one keeps across a restart (Redis its AOF, ZooKeeper its tree and sessions, etcd its
    /// store and leases, PostgreSQL its committed rows) and loses the rest.
    fn recover(&mut self, now_ms: i64);
}

/// A model speaking `B`'s requests and replies: `B` itself, or a test's broken copy of it.
pub type ModelOf<B> = dyn Recover<Request = <B as Backend>::Request, Reply = <B as Backend>::Reply>;

/// A server family: how to draw scripts, play them on the model, and speak to the real server.
pub trait Family {
    /// `redis`, `zk`, `etcd` or `sql`: `locksim conform`'s argument.
    const NAME: &'static str;
    /// One line for `locksim conform --help`: the real server and how it is spoken to.
    const ABOUT: &'static str;
    type Op: Clone + fmt::Display + Send + Sync;
    /// One client's connection to the real server.
    type Conn: Send;
    /// What the clients of one real run share (etcd: where the revisions start, the lease ids).
    type Shared: Send + Sync;

    /// The real server this family is checked against.
    fn server() -> &'static crate::servers::Launcher;
    /// A pooler started in front of the server for each play, and the `[backend]` that configures it
    /// (`pgbouncer`): the clients reach the pooler, the faults the server. None by default.
    fn front() -> Option<(&'static crate::servers::Launcher, locksim_locks::params::Params)> {
        None
    }
    /// A script from a random stream: steps in time order, on the grid.
    fn script(rng: &mut ChaCha8Rng) -> Vec<Step<Self::Op>>;
    /// A script without server faults, for a server locksim did not start: by default the script with
    /// its restarts and stops taken out (a family whose scripts follow the model's state draws anew).
    fn script_without_faults(rng: &mut ChaCha8Rng) -> Vec<Step<Self::Op>> {
        let mut steps = Self::script(rng);
        steps.retain(|s| matches!(s.action, Action::Client { .. }));
        steps
    }
    /// The name of an operation's kind, for the coverage counts.
    fn kind(op: &Self::Op) -> &'static str;
    /// The model's answers to a script's client steps, in step order (server steps get none).
    fn model(&self, steps: &[Step<Self::Op>]) -> Vec<Answer>;
    /// Prepare the real server for a fresh script (empty it).
    fn reset(server: &Server) -> anyhow::Result<Self::Shared>;
    /// The script starts now: at `epoch_ms` on the wall clock the real server reads (PostgreSQL's
    /// `now()` is written relative to it).
    fn started(_shared: &Self::Shared, _epoch_ms: i64) {}
    /// Client number `client`'s connection (opened now, or when first used).
    fn connect(addr: &Addr, shared: &Arc<Self::Shared>, client: usize) -> anyhow::Result<Self::Conn>;
    /// Send `op` and normalise the answer as [`Family::model`] does.
    fn send(conn: &mut Self::Conn, op: &Self::Op) -> anyhow::Result<String>;
    /// The server restarted: the connection is gone, open a new one before the next request.
    fn reconnect(conn: &mut Self::Conn);
    /// Whether a script keeps the rules scripts are drawn by (the shrinker removes steps; a script
    /// that breaks a rule could differ for a reason that is not the model's).
    fn valid(_steps: &[Step<Self::Op>]) -> bool {
        true
    }
}

/// What playing one seed showed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<Op> {
    Agree,
    /// Step `step` (of `steps`) answered differently.
    Mismatch {
        steps: Vec<Step<Op>>,
        step: usize,
        model: String,
        real: String,
        /// The real answer came a slot or more after the model's, in both plays: the server made the
        /// request wait and the model did not — or a machine loaded past the rule of thumb made both
        /// plays late. [`replay_alone`] tells them apart.
        late: bool,
    },
    /// The real run could not keep to the script's times (the reason), twice.
    Inconclusive(String),
}

/// The script of `seed` for family `F`.
pub fn script<F: Family>(seed: u64) -> Vec<Step<F::Op>> {
    F::script(&mut stream(seed, Stream::Conformance, 0))
}

/// The script of `seed` as it is played on `server`: without restarts and stops on a server locksim
/// did not start (and so may not restart or stop).
pub fn script_for<F: Family>(server: &Server, seed: u64) -> Vec<Step<F::Op>> {
    match server.is_own() {
        true => script::<F>(seed),
        false => F::script_without_faults(&mut stream(seed, Stream::Conformance, 0)),
    }
}

/// Play `seed` on the model and on `server`, and shrink a mismatch to the fewest steps that still show it.
pub fn check<F: Family>(family: &F, server: &mut Server, seed: u64) -> anyhow::Result<Outcome<F::Op>> {
    let steps = script_for::<F>(server, seed);
    let first = compare(family, server, &steps)?;
    let Outcome::Mismatch { .. } = first else { return Ok(first) };
    shrink(family, server, steps, first)
}

/// Play `steps` on both sides; an inconclusive real run is played once more.
pub fn compare<F: Family>(family: &F, server: &mut Server, steps: &[Step<F::Op>]) -> anyhow::Result<Outcome<F::Op>> {
    let model = family.model(steps);
    let clients: Vec<usize> =
        steps.iter().enumerate().filter(|(_, s)| matches!(s.action, Action::Client { .. })).map(|(i, _)| i).collect();
    let differ = |k: usize, real: &Real, timed: bool, late: bool| {
        let (m, r) = (&model[k], real);
        let (model, real) = match timed {
            true => (format!("{} (at {} ms)", m.text, m.at_ms), format!("{} (at {} ms)", r.text, r.at_ms)),
            false => (m.text.clone(), r.text.clone()),
        };
        Outcome::Mismatch { steps: steps.to_vec(), step: clients[k], model, real, late }
    };
    let mut plays = Vec::new();
    for _ in 0..2 {
        let played = play::<F>(server, steps, &model)?;
        // Nothing makes a real answer early but the model.
        if let Some(k) = (0..model.len()).find(|k| played.answers[*k].at_ms + SLOT_MS <= model[*k].at_ms) {
            return Ok(differ(k, &played.answers[k], true, false));
        }
        if played.late.is_none() {
            return Ok(match (0..model.len()).find(|k| model[*k].text != played.answers[*k].text) {
                Some(k) => differ(k, &played.answers[k], false, false),
                None => Outcome::Agree,
            });
        }
        plays.push(played);
    }
    let waited = |p: &Played, k: usize| p.answers[k].at_ms >= model[k].at_ms + SLOT_MS;
    if let Some(k) = (0..model.len()).find(|k| plays.iter().all(|p| waited(p, *k))) {
        return Ok(differ(k, &plays[1].answers[k], true, true));
    }
    Ok(Outcome::Inconclusive(plays.pop().and_then(|p| p.late).unwrap_or_default()))
}

/// Play `steps` again on a fresh server of its own, nothing else played meanwhile: for an
/// [`Outcome::Mismatch`] found `late` while other scripts ran beside it. A server that makes the
/// request wait is late again alone; a machine that was too busy to answer in time is not.
pub fn replay_alone<F: Family>(family: &F, steps: &[Step<F::Op>]) -> anyhow::Result<Outcome<F::Op>> {
    compare(family, &mut Server::start(F::server())?, steps)
}

/// Replays a shrink may make: each takes the script's real time (seconds), so a long script stops
/// shrinking here, with what it has.
const SHRINK_TRIES: usize = 40;

/// Cut the steps after the mismatch, then remove steps, a chunk at a time and then one by one, while
/// the script still shows a mismatch. Every try replays the script on the real server, so the cut
/// (usually most of the script) comes first.
fn shrink<F: Family>(
    family: &F,
    server: &mut Server,
    mut steps: Vec<Step<F::Op>>,
    mut found: Outcome<F::Op>,
) -> anyhow::Result<Outcome<F::Op>> {
    if let Outcome::Mismatch { step, .. } = found {
        let cut = steps[..=step].to_vec();
        if let shows @ Outcome::Mismatch { .. } = compare(family, server, &cut)? {
            (steps, found) = (cut, shows);
        }
    }
    let mut chunk = steps.len() / 2;
    let mut tries = 0;
    while chunk >= 1 {
        let mut start = 0;
        while start < steps.len() && tries < SHRINK_TRIES {
            let mut fewer = steps.clone();
            fewer.drain(start..(start + chunk).min(steps.len()));
            if !F::valid(&fewer) {
                start += chunk;
                continue;
            }
            tries += 1;
            match compare(family, server, &fewer)? {
                shows @ Outcome::Mismatch { .. } => {
                    steps = fewer;
                    found = shows;
                }
                _ => start += chunk,
            }
        }
        chunk /= 2;
    }
    Ok(found)
}

/// A real run of a script.
struct Played {
    /// The real answers to the client steps, in step order.
    answers: Vec<Real>,
    /// A step that missed its time by more than the margin, if any.
    late: Option<String>,
}

/// A real answer, and when it came (script time, rounded down to the millisecond).
struct Real {
    text: String,
    at_ms: u64,
}

/// Play `steps` on the real server: a thread per client, server faults on this thread.
fn play<F: Family>(server: &mut Server, steps: &[Step<F::Op>], model: &[Answer]) -> anyhow::Result<Played> {
    let shared = Arc::new(F::reset(server)?);
    let clients = steps.iter().filter_map(|s| match s.action {
        Action::Client { client, .. } => Some(client + 1),
        _ => None,
    });
    let clients = clients.max().unwrap_or(0);
    // A fresh pooler for each play, once the server is reset: its pool starts empty.
    let front = match F::front() {
        Some((pooler, backend)) => {
            let upstream = crate::servers::Upstream { port: server.addr().0.port(), backend };
            Some(Server::start_in_front(pooler, upstream)?)
        }
        None => None,
    };
    let addr = front.as_ref().map_or(server.addr(), Server::addr);
    let mut conns = (0..clients).map(|c| F::connect(&addr, &shared, c)).collect::<anyhow::Result<Vec<_>>>()?;
    // Restarts so far: a client that sees a new one reconnects before its next request.
    let restarts = AtomicUsize::new(0);
    // Each client step's index among client steps, so answers line up with the model's.
    let mut numbered = Vec::new();
    let mut n = 0;
    for s in steps {
        numbered.push(matches!(s.action, Action::Client { .. }).then(|| {
            n += 1;
            n - 1
        }));
    }
    let answers: Vec<Mutex<Option<Real>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let late: Mutex<Option<String>> = Mutex::new(None);
    let start = Instant::now() + Duration::from_millis(SLOT_MS);
    let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    F::started(&shared, (epoch + Duration::from_millis(SLOT_MS)).as_millis() as i64);
    let at = |ms: u64| start + Duration::from_millis(ms);
    let miss = |what: String| {
        late.lock().expect("late lock").get_or_insert(what);
    };
    let mut faults = Vec::new();
    std::thread::scope(|scope| {
        for (client, conn) in conns.iter_mut().enumerate() {
            let (answers, numbered, miss, at, restarts) = (&answers, &numbered, &miss, &at, &restarts);
            scope.spawn(move || {
                let mut seen = 0;
                for (i, s) in steps.iter().enumerate() {
                    let Action::Client { client: c, op } = &s.action else { continue };
                    if *c != client {
                        continue;
                    }
                    let k = numbered[i].expect("a client step");
                    sleep_until(at(s.at_ms));
                    if restarts.load(Ordering::SeqCst) != seen {
                        seen = restarts.load(Ordering::SeqCst);
                        F::reconnect(conn);
                    }
                    let sent = Instant::now();
                    let text = F::send(conn, op).unwrap_or_else(|e| format!("no answer: {e:#}"));
                    let answered = Instant::now();
                    if sent > at(s.at_ms) + Duration::from_millis(MARGIN_MS) {
                        miss(format!("step {i} sent {} ms late", (sent - at(s.at_ms)).as_millis()));
                    }
                    if answered > at(model[k].at_ms) + Duration::from_millis(MARGIN_MS) {
                        miss(format!("step {i} answered {} ms late", (answered - at(model[k].at_ms)).as_millis()));
                    }
                    let at_ms = answered.saturating_duration_since(start).as_millis() as u64;
                    *answers[k].lock().expect("answer lock") = Some(Real { text, at_ms });
                }
            });
        }
        for (i, s) in steps.iter().enumerate() {
            let fault = match &s.action {
                Action::Client { .. } => continue,
                Action::Restart { keep } => {
                    sleep_until(at(s.at_ms));
                    let done = server.restart(*keep);
                    restarts.fetch_add(1, Ordering::SeqCst);
                    // The script left room for the restart; a slower one makes the next step late.
                    if let Some(next) = steps.get(i + 1) {
                        if Instant::now() > at(next.at_ms) {
                            miss(format!("the restart at step {i} took until after step {}", i + 1));
                        }
                    }
                    done
                }
                Action::Stop { ms } => {
                    sleep_until(at(s.at_ms));
                    server.pause(Duration::from_millis(*ms))
                }
            };
            faults.push(fault.map_err(|e| anyhow::anyhow!("step {i}: {e:#}")));
        }
    });
    faults.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let answers = answers.into_iter().map(|a| a.into_inner().expect("answer lock").expect("every step ran"));
    Ok(Played { answers: answers.collect(), late: late.into_inner().expect("late lock") })
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// How many steps of each operation kind (and server fault) `steps` hold.
pub fn coverage<F: Family>(steps: &[Step<F::Op>], counts: &mut std::collections::BTreeMap<&'static str, u64>) {
    for s in steps {
        let kind = match &s.action {
            Action::Client { op, .. } => F::kind(op),
            Action::Restart { keep: true } => "restart (data kept)",
            Action::Restart { keep: false } => "restart (data lost)",
            Action::Stop { .. } => "stop",
        };
        *counts.entry(kind).or_insert(0) += 1;
    }
}

/// A model server's periodic ticks (every `period` ms of script time) from `next` up to `at`, calling
/// `tick` with each one's time; a tick due while the server is stopped (`stop`: from, to) happens when
/// it continues. Returns the next tick still due.
pub fn ticks(period: u64, mut next: u64, stop: (u64, u64), at: u64, mut tick: impl FnMut(u64)) -> u64 {
    while next <= at {
        let when = if (stop.0..stop.1).contains(&next) { stop.1 } else { next };
        if when > at {
            break;
        }
        tick(when);
        next += period;
    }
    next
}
