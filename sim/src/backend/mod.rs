//! Simulated servers: sans-IO state machines behind one thin node shell.
//!
//! A backend is a synchronous state machine: [`Backend::apply`] takes the server's wall-clock time, the
//! caller and a request, and returns the reply; [`Backend::tick`] lets time pass (session and lease
//! expiry). It does no I/O, never sleeps and draws no randomness, so it is unit-tested with plain tables
//! of requests and replies. What it wants said to the world goes into an [`Out`]: history events and
//! pushes to clients (watch notifications). [`serve`] is the shell every backend shares: receive, apply,
//! record, push, reply — and tick. Faults act on the shell's node, never inside the state machine.

pub mod etcd;
pub mod member;
pub mod redis;
pub mod sql;
pub mod zk;

use crate::clock::sim_now_ns;
use crate::clock::Clock;
use crate::ctx::Background;
use crate::fault::{Point, TriggerEvent};
use crate::hazard::Hazard;
use crate::history::{EventKind, NodeIx, Recorder};
use crate::net::{Connection, Input, ReplyTo, Rpc, Socket};
use std::any::Any;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The point every client that renews a lease or session in the background passes just before it sends
/// a renewal (etcd's keep-alive loop, ZooKeeper's ping here; Redisson's watchdog in locksim-locks): the
/// moment the lease is as close to expiring as the client lets it get, so a pause or a cut from here has
/// the least time left before the server expires it. Declared by every recipe on those clients.
pub const LEASE_RENEW: Point = Point {
    name: "lease-renew",
    doc: "a client is about to renew its lease or session (etcd keep-alive, ZooKeeper ping, Redisson watchdog)",
};

/// What a state machine asks the shell to do besides replying.
#[derive(Default)]
pub struct Out {
    /// History events, each about a node (usually the caller).
    pub events: Vec<(NodeIx, EventKind)>,
    /// One-way messages to clients, such as watch notifications.
    pub pushes: Vec<(NodeIx, Box<dyn Any + Send>)>,
    /// Clients whose lease the server granted (`true`) or ended without their asking (`false`), in order:
    /// hazard marks (see [`Recorder::lease_ended`]).
    pub leases: Vec<(NodeIx, u64, bool)>,
    /// Client connections the server closes, after its reply ([`Rpc::close_connection`]).
    pub closes: Vec<Connection>,
    /// Peers whose connection this node closes and opens again, before its pushes go
    /// ([`Rpc::reconnect`]: a Redis Sentinel's link to an instance).
    pub reconnects: Vec<NodeIx>,
    /// Server moments that start aimed faults, in order: a member that just became its cluster's leader
    /// ([`TriggerEvent::LeaderChange`]), a leader that just took a read index
    /// ([`TriggerEvent::ReadIndex`]). Triggers, never events in the history.
    pub points: Vec<(NodeIx, TriggerEvent)>,
    /// Hazards the server reached that are no client's lease (a stale read): marks beside the history.
    pub marks: Vec<Hazard>,
}

impl Out {
    pub fn record(&mut self, node: NodeIx, kind: EventKind) {
        self.events.push((node, kind));
    }

    pub fn push<M: Any + Send>(&mut self, to: NodeIx, msg: M) {
        self.pushes.push((to, Box::new(msg)));
    }

    /// The server ended `client`'s lease `lease` (a key it set expired, its session or lease timed out;
    /// the id is the backend's: session, lease, connection, a hash of the key): a hazard mark beside the
    /// history, never an event in it.
    pub fn lease_ended(&mut self, client: NodeIx, lease: u64) {
        self.leases.push((client, lease, false));
    }

    /// The server granted `client` a new lease (a session, an etcd lease, a key it set): a hazard mark.
    pub fn lease_started(&mut self, client: NodeIx, lease: u64) {
        self.leases.push((client, lease, true));
    }

    /// The server closes `connection` (ZooKeeper, an expired session's).
    pub fn close(&mut self, connection: Connection) {
        self.closes.push(connection);
    }

    /// This node closes its connection to `peer` and opens a new one ([`Rpc::reconnect`]); what it
    /// pushes to `peer` after that goes on the new one.
    pub fn reconnect(&mut self, peer: NodeIx) {
        self.reconnects.push(peer);
    }

    /// The server reached `hazard` (a mark beside the history, never an event in it).
    pub fn mark(&mut self, hazard: Hazard) {
        self.marks.push(hazard);
    }

    /// `leader` has just become its cluster's leader (a trigger for aimed faults).
    pub fn elected(&mut self, leader: NodeIx) {
        self.points.push((leader, TriggerEvent::LeaderChange));
    }

    /// `leader` has just taken a read index and sent the heartbeats that confirm it (a trigger for
    /// aimed faults).
    pub fn read_index(&mut self, leader: NodeIx) {
        self.points.push((leader, TriggerEvent::ReadIndex));
    }

    fn flush(&mut self, rpc: &Rpc, recorder: &Recorder) {
        for (node, point) in self.points.drain(..) {
            recorder.point(node, point);
        }
        for hazard in self.marks.drain(..) {
            recorder.mark(hazard);
        }
        for (node, lease, started) in self.leases.drain(..) {
            if started {
                recorder.lease_started(node, lease);
            } else {
                recorder.lease_ended(node, lease);
            }
        }
        for (node, kind) in self.events.drain(..) {
            recorder.record(node, kind);
        }
        for peer in self.reconnects.drain(..) {
            rpc.reconnect(peer);
        }
        for (to, msg) in self.pushes.drain(..) {
            rpc.tell_boxed(to, msg);
        }
        for connection in self.closes.drain(..) {
            rpc.close_connection(connection);
        }
    }
}

/// A server's two clocks at one instant. Which one a behaviour follows is part of the model: Redis key
/// expiry and PostgreSQL's `now()` read wall time (a `clock-jump` moves them), while ZooKeeper's session
/// tracker (`System.nanoTime`), etcd's lessor (Go's monotonic reading) and the kernel's TCP timers
/// measure intervals on the monotonic clock, which a jump does not move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// What `gettimeofday` returns, in milliseconds.
    pub wall_ms: i64,
    /// `CLOCK_MONOTONIC`, in milliseconds: drift changes its pace, jumps do not move it.
    pub mono_ms: i64,
}

impl Now {
    /// Both clocks reading `ms` (tests, and a node whose clock was never stepped).
    pub fn at(ms: i64) -> Now {
        Now { wall_ms: ms, mono_ms: ms }
    }

    /// `clock` now.
    pub fn of(clock: &Clock) -> Now {
        let (wall_ms, mono_ms) = clock.readings_ms();
        Now { wall_ms, mono_ms }
    }
}

/// A server's state machine.
pub trait Backend: Send + 'static {
    type Request: Any + Send;
    type Reply: Any + Send;

    /// Apply one request at `now` by the server's own clocks.
    fn apply(&mut self, now: Now, from: NodeIx, request: Self::Request, out: &mut Out) -> Self::Reply;

    /// [`Backend::apply`] to a request that came on connection `via`: what the shell calls. A server
    /// that closes connections itself ([`Out::close`]) keeps which one each client uses.
    fn apply_via(&mut self, now: Now, via: Connection, request: Self::Request, out: &mut Out) -> Self::Reply {
        self.apply(now, via.peer, request, out)
    }

    /// How often the server's clock ticks (`None`: this backend has no timers). Unless
    /// [`Backend::ticks_from`] says otherwise, ticks fall on the multiples of the interval on the
    /// server's monotonic clock, as ZooKeeper's session tracker wakes at each expiry bucket's boundary
    /// (`ExpiryQueue`) — after a restart or a pause too. A server host's monotonic clock starts at an
    /// uptime drawn per seed ([`crate::world::World::add_server`]), so the boundaries' phase differs
    /// from seed to seed, as real servers' do.
    fn tick_interval(&self) -> Option<Duration> {
        None
    }

    /// `Some(start_ms)`: the first tick of this life falls at `start_ms` on the monotonic clock and each
    /// later one an interval after the previous, as a loop that sleeps between rounds does (etcd's
    /// `lessor.runLoop`, `time.After(500ms)`): a pause pushes every later tick back. Read when the
    /// shell starts serving; [`Backend::tick_interval`] is then read again after each tick, so such a
    /// server may vary it (Redis Sentinel's timer).
    fn ticks_from(&self) -> Option<i64> {
        None
    }

    /// Let time pass to `now`: expire what has expired.
    fn tick(&mut self, _now: Now, _out: &mut Out) {}

    /// Life `life` of `peer`'s process died, and its kernel closed its connections to this server
    /// (see [`crate::net::Net::kill_process`]): the server reads the end of the stream (EOF, or a
    /// reset). ZooKeeper and etcd keep a session or lease past its connection, until its timeout;
    /// PostgreSQL ends the session.
    fn connection_closed(&mut self, _now: Now, _peer: NodeIx, _life: u32, _out: &mut Out) {}

    /// Whether `request` waits before it is answered (Redis `WAIT`), and for at most how long by the
    /// server's clock. A waiting request is asked [`Backend::answer_parked`] after every request the
    /// server applies and once its time is up.
    fn parks(&self, _request: &Self::Request) -> Option<Duration> {
        None
    }

    /// The answer to a waiting request from `from`, if it has one now; `timed_out`: its time is up, so
    /// it must answer.
    fn answer_parked(&mut self, _from: NodeIx, _request: &Self::Request, _timed_out: bool) -> Option<Self::Reply> {
        None
    }
}

/// A request waiting for its answer: where the answer goes, the request, and its deadline (sim ns).
struct Parked<Q> {
    reply_to: ReplyTo,
    request: Q,
    deadline_ns: u64,
}

/// Serve `state` on this node until the node dies.
pub async fn serve<B: Backend>(state: Arc<Mutex<B>>, rpc: &Rpc, clock: &Clock, recorder: &Recorder) {
    let (every, from) = {
        let s = state.lock().expect("backend lock");
        (s.tick_interval(), s.ticks_from())
    };
    if let Some(every) = every {
        // The ticker lives on the server's node: it stops with it, and runs late when it is paused.
        let (state, clock, recorder, rpc) = (state.clone(), clock.clone(), recorder.clone(), rpc.clone());
        madsim::task::spawn_local(async move {
            let mut out = Out::default();
            let every_ms = every.as_millis() as i64;
            let next_boundary = |now_ms: i64| (now_ms.div_euclid(every_ms) + 1) * every_ms;
            let mut next_ms = from.unwrap_or_else(|| next_boundary(clock.monotonic_ms()));
            loop {
                let now_ms = clock.monotonic_ms();
                if now_ms < next_ms {
                    clock.sleep(Duration::from_millis((next_ms - now_ms) as u64)).await;
                    continue;
                }
                let every_ms = {
                    let mut s = state.lock().expect("backend lock");
                    s.tick(Now::of(&clock), &mut out);
                    s.tick_interval().map_or(every_ms, |every| every.as_millis() as i64)
                };
                out.flush(&rpc, &recorder);
                next_ms = if from.is_some() { now_ms + every_ms } else { next_boundary(now_ms) };
            }
        });
    }
    let mut out = Out::default();
    let mut parked: Vec<Parked<B::Request>> = Vec::new();
    loop {
        let input = match parked.iter().map(|p| p.deadline_ns).min() {
            None => rpc.next_input::<B::Request>().await,
            Some(next) => tokio::select! {
                biased;
                got = rpc.next_input::<B::Request>() => got,
                _ = sleep_until_ns(next) => {
                    answer_parked(&state, rpc, &mut parked);
                    continue;
                }
            },
        };
        let (reply_to, request) = match input {
            Input::Request(reply_to, request) => (reply_to, request),
            Input::Closed { peer, life, socket: None, .. } => {
                state.lock().expect("backend lock").connection_closed(Now::of(clock), peer, life, &mut out);
                out.flush(rpc, recorder);
                continue;
            }
            // Only servers close connections of their own ([`Rpc::close_connection`]).
            Input::Closed { socket: Some(_), .. } => continue,
        };
        let mut s = state.lock().expect("backend lock");
        match s.parks(&request) {
            Some(wait) => {
                drop(s);
                let deadline_ns = sim_now_ns() + clock.real_duration(wait).as_nanos() as u64;
                parked.push(Parked { reply_to, request, deadline_ns });
            }
            None => {
                let reply = s.apply_via(Now::of(clock), reply_to.connection(), request, &mut out);
                drop(s);
                out.flush(rpc, recorder);
                rpc.reply(&reply_to, reply);
            }
        }
        if !parked.is_empty() {
            answer_parked(&state, rpc, &mut parked);
        }
    }
}

/// Answer the waiting requests that have their answer, or whose time is up.
fn answer_parked<B: Backend>(state: &Mutex<B>, rpc: &Rpc, parked: &mut Vec<Parked<B::Request>>) {
    let mut s = state.lock().expect("backend lock");
    let now = sim_now_ns();
    parked.retain(|p| match s.answer_parked(p.reply_to.from, &p.request, p.deadline_ns <= now) {
        Some(reply) => {
            rpc.reply(&p.reply_to, reply);
            false
        }
        None => true,
    });
}

async fn sleep_until_ns(at_ns: u64) {
    let now = sim_now_ns();
    if at_ns > now {
        crate::clock::sleep(Duration::from_nanos(at_ns - now)).await;
    }
}

/// Where a client library lives and whom it talks to: its node's endpoint and clock, the history, the
/// server, and `router`, the node's one reader of what servers push (`Ctx::node_wide`: one per node,
/// shared by every client on it, as the real libraries share a connection's reader thread).
pub struct ClientEnv<R> {
    pub rpc: Rpc,
    pub clock: Clock,
    pub recorder: Recorder,
    pub server: NodeIx,
    pub router: Rc<R>,
}

impl<R> Clone for ClientEnv<R> {
    fn clone(&self) -> Self {
        ClientEnv {
            rpc: self.rpc.clone(),
            clock: self.clock.clone(),
            recorder: self.recorder.clone(),
            server: self.server,
            router: self.router.clone(),
        }
    }
}

/// Act on a served state from beside its shell (e.g. a server's keep-alive prober), then say what it
/// asked to be said.
pub fn act<B: Backend>(state: &Mutex<B>, rpc: &Rpc, recorder: &Recorder, f: impl FnOnce(&mut B, &mut Out)) {
    let mut out = Out::default();
    f(&mut state.lock().expect("backend lock"), &mut out);
    out.flush(rpc, recorder);
}

/// A client library's event thread: hand every pushed message of type `M` that reaches this node to
/// `deliver` on `to`, for as long as `to` lives (the ZooKeeper and etcd clients route watch
/// notifications with it).
pub fn listen<M: Any + Send, T: 'static>(rpc: &Rpc, to: &Rc<T>, deliver: fn(&T, M)) -> Background {
    listen_closed(rpc, to, deliver, |_, _, _, _, _| {})
}

/// [`listen`], also handing `closed` each connection a peer closed — the socket its server closed, or
/// every connection of a process that died (`None`) — with when the close arrived: the library reads
/// the end of its stream (a database client's connection breaks; a ZooKeeper client is disconnected).
pub fn listen_closed<M: Any + Send, T: 'static>(
    rpc: &Rpc,
    to: &Rc<T>,
    deliver: fn(&T, M),
    closed: fn(&T, NodeIx, u32, Option<Socket>, u64),
) -> Background {
    let (to, rpc) = (Rc::downgrade(to), rpc.clone());
    Background::spawn(async move {
        loop {
            let input = rpc.next_input::<M>().await;
            let Some(to) = to.upgrade() else { return };
            match input {
                Input::Request(_, msg) => deliver(&to, msg),
                Input::Closed { peer, life, socket, arrived_ns } => closed(&to, peer, life, socket, arrived_ns),
            }
        }
    })
}

/// How late a client library's thread must take what waited for it (a timer, a close) for its node to
/// have been paused meanwhile: the application's next step then comes first.
pub(crate) const RESUMED_LATE: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{Program, World};
    use std::collections::BTreeSet;

    /// A server that only notes when its clock ticks (simulated and monotonic ms); `from`: its
    /// [`Backend::ticks_from`].
    #[derive(Default)]
    struct Ticks {
        seen: Vec<(i64, i64)>,
        from: Option<i64>,
    }

    impl Backend for Ticks {
        type Request = ();
        type Reply = ();

        fn apply(&mut self, _: Now, _: NodeIx, _: (), _: &mut Out) {}

        fn tick_interval(&self) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }

        fn ticks_from(&self) -> Option<i64> {
            self.from
        }

        fn tick(&mut self, now: Now, _: &mut Out) {
            self.seen.push(((sim_now_ns() / 1_000_000) as i64, now.mono_ms));
        }
    }

    #[test]
    fn ticks_fall_on_the_interval_boundaries_whenever_the_server_starts() {
        let ticks = Arc::new(Mutex::new(Ticks::default()));
        let state = ticks.clone();
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let mut world = World::new(1);
            let program: Program = Arc::new(move |env| {
                let state = state.clone();
                Box::pin(async move {
                    // Started (or restarted) between two boundaries.
                    env.clock.sleep(Duration::from_millis(700)).await;
                    let rpc = env.rpc();
                    serve(state, &rpc, &env.clock, &env.recorder).await
                })
            });
            world.add_node("server", program);
            world.run(&[], Duration::from_millis(3_500)).await;
        });
        // ZooKeeper's session tracker wakes at each bucket boundary, not a full interval after it started.
        assert_eq!(ticks.lock().unwrap().seen, vec![(1000, 1000), (2000, 2000), (3000, 3000)]);
    }

    /// The ticks of a server added with [`World::add_server`] in world `seed`, as (simulated ms, its
    /// monotonic ms), over 3.5 s; `start_after`: it ticks from that long after its program starts.
    fn server_ticks(seed: u64, start_after: Option<i64>) -> Vec<(i64, i64)> {
        let ticks = Arc::new(Mutex::new(Ticks::default()));
        let state = ticks.clone();
        madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async move {
            let mut world = World::new(seed);
            let program: Program = Arc::new(move |env| {
                let state = state.clone();
                state.lock().unwrap().from = start_after.map(|ms| env.clock.monotonic_ms() + ms);
                Box::pin(async move {
                    let rpc = env.rpc();
                    serve(state, &rpc, &env.clock, &env.recorder).await
                })
            });
            world.add_server("server", program);
            world.run(&[], Duration::from_millis(3_500)).await;
        });
        let ticks = ticks.lock().unwrap().seen.clone();
        ticks
    }

    #[test]
    fn each_seed_draws_a_servers_tick_phase_and_keeps_it() {
        let phases: BTreeSet<i64> = (0..8)
            .map(|seed| {
                let ticks = server_ticks(seed, None);
                assert_eq!(ticks, server_ticks(seed, None), "the phase is the seed's");
                assert!(ticks.iter().all(|(_, mono)| mono % 1000 == 0), "on the host clock's boundaries: {ticks:?}");
                assert!(ticks.windows(2).all(|w| w[1].0 - w[0].0 == 1000), "one interval apart: {ticks:?}");
                ticks[0].0
            })
            .collect();
        // Before, every seed ticked at 1000, 2000, 3000 ms of simulated time.
        assert!(phases.len() >= 6, "eight seeds, eight phases (or nearly): {phases:?}");
    }

    #[test]
    fn ticks_from_a_start_fall_an_interval_after_the_previous_one() {
        let ticks = server_ticks(3, Some(250));
        assert_eq!(ticks.iter().map(|(sim, _)| *sim).collect::<Vec<_>>(), vec![250, 1250, 2250, 3250]);
    }
}
