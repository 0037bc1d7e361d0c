//! The ZooKeeper client library, as the real one (ClientCnxn, ZooKeeper 3.8) behaves.
//!
//! - It opens a session with a requested timeout; the server negotiates T. Its read timeout is 2/3·T.
//! - Its send thread (`ClientCnxn.SendThread.run`) pings when it has sent nothing for half the read
//!   timeout, less a second when that is over a second (`readTimeout/2 - idleSend - 1000`), and at
//!   least every 10 s; any request counts as sending. The moment it has heard nothing for the read
//!   timeout it is `Disconnected` (Curator: SUSPENDED). All of it on the node's monotonic clock
//!   (`System.nanoTime`).
//! - Disconnected, it tries to re-attach its session on a new connection, attempt after attempt, each
//!   after a wait (`Library::reattach_delay`) and given a time (`Library::connect_timeout`). The
//!   Java client waits 1 s (`StaticHostProvider.next(1000)`: with one server it has always been round
//!   its list) plus a random 0–999 ms (`startConnect`), drawn from the seed (the client node's
//!   [`Stream::ZkReattach`](crate::rng::Stream::ZkReattach)), and gives the attempt T
//!   (`connectTimeout` = T / servers, while `CONNECTING`); a refused connection (the server's process
//!   is down) fails at once. go-zookeeper waits 1 s and dials for 1 s. Each attempt opens a socket of
//!   its own (`ClientCnxnSocketNIO.connect`) and one that fails is closed (`cleanup`), as is the
//!   connection given up: see [`crate::net`] for what the kernel does with each. So a client cut off
//!   for longer than its read timeout re-attaches only once an attempt gets through: one sent into the
//!   cut gets through after the heal at its SYN's next retransmission (1, 3, 7 s … after it) if that
//!   is within its T — nothing the old connection still holds delays it — and otherwise the next
//!   attempt starts 1–2 s after it gave up, its abandoned connect never delivered. kazoo
//!   ([`Library::Kazoo`]) keeps time its own way: jittered pings, disconnected by an unanswered ping,
//!   re-attaching on an exponential backoff from 0.1 s, and queueing requests while disconnected.
//! - A server that restarted resets the old connection: the next request on it fails at once
//!   (`ConnectionLoss`, not applied) and the client is `Disconnected`.
//! - A server process that dies (its kernel closes the connection) is noticed at once, idle or not:
//!   the send thread's read ends (`ClientCnxnSocketNIO.doIO`: `EndOfStreamException`, "likely server
//!   has closed socket"), the client is `Disconnected` and its requests in flight fail. A dead host
//!   closes nothing: the client notices only by its read timeout.
//! - It keeps the zxid of the last reply to one of its requests (`ClientCnxn.lastZxid`, pings' aside;
//!   kazoo's `last_zxid` and go-zookeeper's `lastZxid` alike) and re-attaches with it
//!   (`lastZxidSeen`): an ensemble's server that has applied less closes the attempt, which fails as
//!   any refused one, and the next attempt goes to the next server. A new handle has seen nothing.
//! - It learns that its session `Expired` (Curator: LOST) only when a re-attach is refused: a client cut
//!   off from the server believes its session alive for as long as the cut lasts.
//! - A request unanswered within 2/3·T fails with `ConnectionLoss`: it may or may not have been applied.
//!   Every request still waiting when the connection is declared lost fails then, at once
//!   (`ClientCnxn.cleanup`; go-zookeeper's `flushRequests(ErrConnectionClosed)`). A request made while
//!   disconnected waits for the session to be re-attached, and fails with `ConnectionLoss`, unsent,
//!   when an attempt fails (`ClientCnxn`'s `outgoingQueue`; go-zookeeper's `sendChan`).
//! - Anything from the server counts as hearing from it: a reply, and a watch notification too (the
//!   read timeout is on the socket, whatever arrives).
//! - Watch notifications are handed to the watcher registered for that session and path. With the Java
//!   client ([`Library::Java`]) a change of connection state (disconnected, expired) reaches every
//!   watcher too, as `ClientCnxn` delivers state events to all of them: here their watch ends, and a
//!   recipe waiting on one looks again. go-zookeeper ([`Library::Go`]) ends its watches only when the
//!   session expires, and sets them again on the new connection.
//! - Notifications travel as stream messages, which a short partition delays rather than loses (the
//!   real client's TCP connection; a reconnect would replay missed ones with SetWatches).
//! - Its timers run on the client's node: a paused client neither pings nor notices it is disconnected
//!   until it resumes — and then its application code runs first: the send thread that wakes late
//!   hands the disconnection over only after the application's next step (with kazoo on a real
//!   ZooKeeper, SUSPENDED reached the application about 1 ms after the resume, and the resumed
//!   holder's write came first in 8 of 10 runs). So a holder that gives up on SUSPENDED still makes
//!   the write it was about to make when a pause ends.
//!
//! The client records each change of its connection state in the history as `Session`.
//!
//! The same client runs in real mode's processes ([`Host::Real`]): there a [`Link`] carries its
//! requests to a real server over TCP, and its timers are the process's (its random waits come from the
//! process's seed, as in the simulator).

use super::{SessionId, Stamped, WatchEvent, ZkError, ZkOp, ZkReply, ZkRequest};
use crate::backend::LEASE_RENEW;
use crate::ctx::{Background, Ctx};
use crate::fault::TriggerEvent;
use crate::history::EventKind;
use crate::history::NodeIx;
use crate::net::{CallError, Rpc, Socket};
use crate::rng::{ChaCha8Rng, Rng};
use crate::signal;
use rand::seq::SliceRandom;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::oneshot;

mod send_loop;
use send_loop::pinger;

/// The client library a session behaves as, where the libraries differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Library {
    /// ZooKeeper's Java client (`ClientCnxn`, 3.8; Curator's): a disconnection is an event every watcher
    /// gets (`Watcher.process` with `KeeperState.Disconnected`), which ends the wait of a recipe.
    #[default]
    Java,
    /// go-zookeeper (`zk/conn.go`): a watch channel is closed only when the session expires
    /// (`invalidateWatches` after `authenticate` returns `ErrSessionExpired`); across a disconnection it
    /// stays and is set again on the new connection (`sendSetWatches`), so a waiter keeps waiting. It
    /// pings on a fixed ticker (`sendLoop`: `time.NewTicker(c.pingInterval)`, `pingInterval` =
    /// `recvTimeout / 2`, `recvTimeout` = T·2/3), started with each connection and never put back by a
    /// send; it is disconnected when a read waits `recvTimeout` (`recvLoop`'s `SetReadDeadline`).
    Go,
    /// kazoo 2.10 (`kazoo/protocol/connection.py` `ConnectionHandler`, `kazoo/client.py`), its rules
    /// differing from the Java client's in every step:
    /// - *Pings* (`_connect_attempt`'s loop): each time round, after every send, receive or timeout, it
    ///   draws a jitter `random.randint(1, 40) / 100` s and waits until `last_send + read_timeout/2 −
    ///   jitter` (at least the jitter); a ping goes out when that passes. Only sends put the ping back
    ///   (`last_send`); receiving does not.
    /// - *Disconnected* (SUSPENDED) when a wait of that loop ends in silence while a ping is outstanding
    ///   (`ConnectionDropped("outstanding heartbeat ping not received")`): about a read timeout after the
    ///   last send, whatever was heard since — not a read timeout after the last word from the server.
    ///   A closed connection (`socket connection broken`) is noticed at once, as with Java.
    /// - *Requests* have no timeout of their own: one in flight fails with `ConnectionLoss` when the
    ///   connection is declared lost (`_session_callback` → `_notify_pending`); one made while
    ///   disconnected is queued (`_call`: `CONNECTING` is no reason to refuse) and sent once the session is
    ///   re-attached, however many attempts fail first (a failed attempt leaves the state `CONNECTING`,
    ///   so nothing is notified); it fails with `SessionExpiredError` when the session turns out expired.
    /// - *Re-attaching* is `KazooClient`'s `connection_retry`, a `KazooRetry(max_tries=None, delay=0.1,
    ///   backoff=2, max_jitter=0.4, max_delay=3600)` (`_RETRY_COMPAT_DEFAULTS`): before each attempt it
    ///   sleeps its current delay × `random.uniform(0.6, 1.4)`, and the next delay is that sleep × 2;
    ///   a connection that gets its session resets it to 0.1 s (`retry.reset()` in `_connect_attempt`).
    ///   An attempt is given T to connect and T for the `ConnectResponse` (`create_connection(timeout=
    ///   T)`, `_invoke(T / hosts)`); a refused one fails at once.
    /// - *Watches* end at SUSPENDED: `_reset_watchers` hands every watcher a `NONE` event and forgets
    ///   it, and kazoo sends no `SetWatches` on the new connection (as the model's Java arm: a waiter
    ///   looks again).
    /// - After an expiry the real client opens a new session on its own, a retry delay later; here
    ///   [`ZkClient`] ends with its session and the recipe's handle opens the next one when next used.
    Kazoo,
}

impl Library {
    /// How long the client waits after losing its connection, and after each failed attempt, before
    /// it tries the next server of its list; `wrapped`: that server is the one it was last connected
    /// to — it has been round its list (with one server: every time). Java: `StaticHostProvider.next(
    /// 1000)` sleeps `spinDelay` = 1 s only then, and `SendThread.startConnect` sleeps
    /// `ThreadLocalRandom.nextLong(1000)` ms before every connection but the first. go-zookeeper:
    /// `Conn.connect` waits `time.Second` when the host provider says it went round (`retryStart`),
    /// with no random part. kazoo tries every host in one attempt of its connection retry
    /// (`_connect_loop`), and sleeps before the next round: `KazooRetry.__call__` sleeps `_cur_delay ×
    /// uniform(1 − max_jitter, 1 + max_jitter)` and makes the next delay that sleep × `backoff`, at most
    /// `max_delay` (`retry` holds the current delay, in µs).
    fn reattach_delay(self, jitter: &mut ChaCha8Rng, retry: &Cell<u64>, wrapped: bool) -> Duration {
        match self {
            Library::Java => Duration::from_millis(if wrapped { 1000 } else { 0 } + jitter.gen_range(0..1000)),
            Library::Go | Library::Kazoo if !wrapped => Duration::ZERO,
            Library::Go => Duration::from_secs(1),
            Library::Kazoo => {
                let sleep_us = retry.get() * jitter.gen_range(600..=1400) / 1000;
                retry.set((sleep_us * KAZOO_RETRY_BACKOFF).min(KAZOO_RETRY_MAX_DELAY_US));
                Duration::from_micros(sleep_us)
            }
        }
    }

    /// How long one attempt to re-attach may take. Java: while `CONNECTING` the send thread waits
    /// `connectTimeout - idleRecv`, `connectTimeout` = negotiated T / number of servers (`onConnected`),
    /// from the attempt's start, then throws `SessionTimeoutException`. go-zookeeper: its dialer's
    /// `connectTimeout`, 1 s by default (the `ConnectRequest` after a dial that succeeded may take ten
    /// read timeouts, which only a paused server would use: not modelled).
    /// kazoo: `_connect` opens the socket with `timeout = T` (the requested session timeout, which the
    /// conformance server keeps), then reads the `ConnectResponse` within T / hosts; the model's attempt
    /// is one call, given T.
    fn connect_timeout(self, session_timeout: Duration, servers: usize) -> Duration {
        match self {
            Library::Java | Library::Kazoo => session_timeout / servers as u32,
            Library::Go => Duration::from_secs(1),
        }
    }

    /// How long a request may wait for its reply before it fails with `ConnectionLoss`: the read timeout
    /// (Java, go-zookeeper); kazoo's wait has no end of its own (`AsyncResult.get()`), a request fails
    /// only when the connection is declared lost.
    fn request_timeout(self, read_timeout: Duration) -> Duration {
        match self {
            Library::Java | Library::Go => read_timeout,
            Library::Kazoo => KAZOO_REQUEST_WAIT,
        }
    }
}

/// kazoo's connection retry (`KazooRetry` with `_RETRY_COMPAT_DEFAULTS`): first delay 0.1 s, doubled
/// after each sleep, at most an hour.
const KAZOO_RETRY_DELAY_US: u64 = 100_000;
const KAZOO_RETRY_BACKOFF: u64 = 2;
const KAZOO_RETRY_MAX_DELAY_US: u64 = 3_600_000_000;

/// A kazoo request's wait for its reply: longer than any run (the connection's loss ends it first).
const KAZOO_REQUEST_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The servers of a client's connect string, and where it is in it (`StaticHostProvider`: the list
/// shuffled once, then taken round robin).
struct HostProvider {
    servers: Rc<[NodeIx]>,
    /// The server of the current (or last) attempt, and the one it last connected to.
    current: Cell<usize>,
    last_connected: Cell<usize>,
}

impl HostProvider {
    /// `servers` in the order the client tries them: shuffled from the node's stream when there are
    /// several (Java's `StaticHostProvider`, kazoo's `randomize_hosts`, go-zookeeper's
    /// `stringShuffle`); one server draws nothing.
    fn new(servers: &Rc<[NodeIx]>, jitter: &mut ChaCha8Rng) -> HostProvider {
        let mut order: Vec<NodeIx> = servers.to_vec();
        if order.len() > 1 {
            order.shuffle(jitter);
        }
        HostProvider { servers: order.into(), current: Cell::new(0), last_connected: Cell::new(0) }
    }

    /// The next server to try, and whether the list wrapped round to the one last connected to.
    fn next(&self) -> (NodeIx, bool) {
        let next = (self.current.get() + 1) % self.servers.len();
        self.current.set(next);
        (self.servers[next], next == self.last_connected.get())
    }

    fn connected(&self) {
        self.last_connected.set(self.current.get());
    }
}

/// The connection state of a session, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    Connected,
    Disconnected,
    Expired,
}

/// Why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// The server answered with an error.
    Zk(ZkError),
    /// No answer in time: the request may or may not have been applied.
    ConnectionLoss,
}

/// A one-shot watch: resolves with the event, or `None` if the session ended first.
#[derive(Debug)]
pub struct Watch(oneshot::Receiver<WatchEvent>);

impl Watch {
    pub async fn fired(self) -> Option<WatchEvent> {
        self.0.await.ok()
    }
}

/// Where a client lives and whom it talks to; its router is the node's ZooKeeper event router.
pub type ClientEnv = crate::backend::ClientEnv<Router>;

/// Where a client's sessions live: a simulated node, or a real process (real mode) whose connections to a
/// real server are a [`Link`]. The client itself — pings, timeouts, states, watches — is the same.
#[derive(Clone)]
pub enum Host {
    /// A simulated node, and the servers of its connect string, in their order there (one for a
    /// standalone server; `env.server` is the first).
    Sim(ClientEnv, Rc<[NodeIx]>),
    /// A real process: its time and tasks (`ctx`, [`Ctx::real`]), its connection to the servers, its
    /// router, to which the link hands the watch notifications it reads, and the servers of its connect
    /// string as the link numbers them (`NodeIx(0)`, … in their order there).
    Real { ctx: Ctx, link: Rc<dyn Link>, router: Rc<Router>, servers: Rc<[NodeIx]> },
}

/// A real client's connection to a real server (real mode; `locksim-locks` has one over TCP): a call as
/// the simulated network's [`Rpc::call_on`] makes it.
pub trait Link {
    /// Send `request` on connection `conn` and wait at most `timeout` for its reply, and the connection
    /// it came on. A `Connect` opens a new connection to `server` (closing the old one). `Reset`: the connection is
    /// gone — no longer the open one (the request was not sent), or broken with the request out (it may
    /// have been applied); either way the client reports `ConnectionLoss` and is `Disconnected` at once, as
    /// `ClientCnxn` does on a socket error. `Timeout`: no reply in time.
    fn call_on(&self, server: NodeIx, conn: Option<u32>, request: ZkRequest, timeout: Duration) -> LinkCall;
}

/// What [`Link::call_on`] answers.
pub type LinkCall = Pin<Box<dyn Future<Output = Result<(Stamped, u32), CallError>>>>;

impl Host {
    fn router(&self) -> &Rc<Router> {
        match self {
            Host::Sim(env, _) => &env.router,
            Host::Real { router, .. } => router,
        }
    }

    /// Send `request` to `server` (a simulated client's) on `socket` and connection `conn`.
    async fn call_on(
        &self,
        server: NodeIx,
        socket: Option<Socket>,
        conn: Option<u32>,
        request: ZkRequest,
        timeout: Duration,
    ) -> Result<(Stamped, u32), CallError> {
        match self {
            Host::Sim(env, _) => env.rpc.call_on(server, socket, conn, request, timeout).await,
            Host::Real { link, .. } => link.call_on(server, conn, request, timeout).await,
        }
    }

    /// A new socket to `server`, for a connect (a real process's [`Link`] opens its own on a
    /// `Connect`).
    fn open(&self, server: NodeIx) -> Option<Socket> {
        match self {
            Host::Sim(env, _) => Some(env.rpc.open(server)),
            Host::Real { .. } => None,
        }
    }

    /// Close a socket [`Host::open`] gave.
    fn close(&self, server: NodeIx, socket: Socket) {
        if let Host::Sim(env, _) = self {
            env.rpc.close(server, socket);
        }
    }

    fn monotonic_ms(&self) -> i64 {
        match self {
            Host::Sim(env, _) => env.clock.monotonic_ms(),
            Host::Real { ctx, .. } => ctx.monotonic_ms(),
        }
    }

    async fn sleep(&self, d: Duration) {
        match self {
            Host::Sim(env, _) => env.clock.sleep(d).await,
            Host::Real { ctx, .. } => ctx.sleep(d).await,
        }
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) -> Background {
        match self {
            Host::Sim(..) => Background::spawn(task),
            Host::Real { ctx, .. } => ctx.spawn(task),
        }
    }

    /// Run `task` to its end beside the caller.
    fn spawn_detached(&self, task: impl Future<Output = ()> + 'static) {
        match self {
            Host::Sim(..) => drop(madsim::task::spawn_local(task)),
            Host::Real { .. } => drop(tokio::task::spawn_local(task)),
        }
    }

    /// The point [`LEASE_RENEW`]: the session is about to be renewed by a ping (a real process has no
    /// armed faults).
    async fn renewal_due(&self) {
        if let Host::Sim(env, _) = self {
            env.recorder.pass(env.rpc.me(), TriggerEvent::Declared(&LEASE_RENEW)).await;
        }
    }

    /// A change of the session's connection state, in the history (a real process's history is its
    /// adapter's lines: there the change reaches it only as a holder's `lost`).
    fn record(&self, state: &str) {
        if let Host::Sim(env, _) = self {
            env.recorder.record(env.rpc.me(), EventKind::Session { state: state.into() });
        }
    }
}

type Watchers = BTreeMap<(SessionId, String), Vec<oneshot::Sender<WatchEvent>>>;

/// Hands each notification that reaches a node to the watchers of its session — like the real client's
/// event thread, one per node, however many sessions the node has.
pub struct Router {
    watchers: RefCell<Watchers>,
    thread: RefCell<Option<Background>>,
    /// Sessions their client believes disconnected or expired, and where to mark a notification that
    /// reaches one (hazard `watch-fired-while-disconnected`).
    disconnected: RefCell<std::collections::BTreeSet<SessionId>>,
    /// Each session's client, which a notification tells it heard from the server.
    clients: RefCell<BTreeMap<SessionId, std::rc::Weak<Shared>>>,
    recorder: RefCell<Option<crate::history::Recorder>>,
    /// The node's sessions, told when a server's kernel closes their connection.
    sessions: RefCell<Vec<std::rc::Weak<Shared>>>,
    /// The random part of the node's sessions' waits before re-attaching ([`Library::reattach_delay`]).
    jitter: RefCell<ChaCha8Rng>,
}

impl Router {
    /// The router of a node whose sessions draw their re-attach waits from `jitter` (the node's
    /// [`Stream::ZkReattach`](crate::rng::Stream::ZkReattach)).
    pub fn new(jitter: ChaCha8Rng) -> Router {
        Router {
            watchers: RefCell::default(),
            thread: RefCell::default(),
            disconnected: RefCell::default(),
            clients: RefCell::default(),
            recorder: RefCell::default(),
            sessions: RefCell::default(),
            jitter: RefCell::new(jitter),
        }
    }

    fn start(self: &Rc<Self>, rpc: &Rpc, recorder: &crate::history::Recorder) {
        if self.thread.borrow().is_none() {
            *self.recorder.borrow_mut() = Some(recorder.clone());
            *self.thread.borrow_mut() = Some(super::super::listen_closed(rpc, self, Router::deliver, Router::closed));
        }
    }

    /// The server closed a session's connection (`socket`: it expired the session), or life `life` of
    /// its process died and its kernel closed every connection to it (`None`): each session on one of
    /// them reads the end of its stream (`ClientCnxnSocketNIO.doIO`: `EndOfStreamException`) and is
    /// `Disconnected`; its pinger then re-attaches, and hears whether the session is still alive.
    /// The send thread reads the socket: one that finds the close waiting when its paused process
    /// resumes hands it over after the application's next step, as with its timers (kazoo on a real
    /// ZooKeeper that had expired the session: SUSPENDED reached the application about 1 ms after the
    /// resume, and the resumed holder's write came first in 8 of 10 runs).
    fn closed(&self, server: crate::history::NodeIx, life: u32, socket: Option<Socket>, arrived_ns: u64) {
        self.sessions.borrow_mut().retain(|s| s.strong_count() > 0);
        let on_it = |shared: &Rc<Shared>| {
            if !matches!(shared.host, Host::Sim(..)) {
                return false;
            }
            let on_it = match socket {
                Some(socket) => shared.socket.get() == Some(socket),
                None => shared.conn.get() == Some(life),
            };
            shared.server.get() == server && on_it
        };
        let closed: Vec<Rc<Shared>> = self.sessions.borrow().iter().filter_map(|s| s.upgrade()).filter(on_it).collect();
        let disconnect = move || {
            for shared in closed {
                shared.drop_connection();
                shared.set_state(ConnState::Disconnected);
            }
        };
        if crate::clock::sim_now_ns() - arrived_ns >= crate::backend::RESUMED_LATE.as_nanos() as u64 {
            madsim::task::spawn_local(async move {
                crate::clock::sleep(Duration::from_millis(1)).await;
                disconnect();
            });
        } else {
            disconnect();
        }
    }

    /// A real process's connection `conn` of `session` ended (its [`Link`] read the end of its stream,
    /// or an error): if it is still the session's connection, the session is `Disconnected` at once and
    /// its pinger re-attaches, as `Router::closed` has it for a simulated one (`ClientCnxn`'s send
    /// thread reads the socket, idle or not).
    pub fn connection_ended(&self, session: SessionId, conn: u32) {
        let shared = self.clients.borrow().get(&session).and_then(std::rc::Weak::upgrade);
        if let Some(shared) = shared.filter(|s| s.conn.get() == Some(conn)) {
            shared.drop_connection();
            shared.set_state(ConnState::Disconnected);
        }
    }

    /// Hand a notification to the watchers of its session and path (each watch fires once).
    pub fn deliver(&self, event: WatchEvent) {
        if let Some(recorder) =
            self.recorder.borrow().as_ref().filter(|_| self.disconnected.borrow().contains(&event.session))
        {
            recorder.mark(crate::hazard::Hazard::WatchFiredWhileDisconnected);
        }
        let client = self.clients.borrow().get(&event.session).and_then(std::rc::Weak::upgrade);
        if let Some(client) = client {
            client.heard();
        }
        let fired = self.watchers.borrow_mut().remove(&(event.session, event.path.clone())).unwrap_or_default();
        for watcher in fired {
            let _ = watcher.send(event.clone());
        }
    }

    /// End every watch of `session` (the real client tells watchers of a state change).
    fn end_watches(&self, session: SessionId) {
        self.watchers.borrow_mut().retain(|(s, _), _| *s != session);
    }
}

struct Shared {
    host: Host,
    /// The servers it may connect to, and the one its connection is to.
    provider: HostProvider,
    server: Cell<NodeIx>,
    library: Library,
    session: SessionId,
    timeout: Duration,
    /// When the client last heard from the server, and last sent to it (monotonic ms).
    last_heard_ms: Cell<i64>,
    last_sent_ms: Cell<i64>,
    /// The last zxid a reply to one of its requests carried (`ClientCnxn.lastZxid`): it connects with it.
    last_zxid: Cell<u64>,
    /// The life of the server the current connection was opened to (`None`: none open).
    conn: Cell<Option<u32>>,
    /// The current connection's socket (a simulated client's): each connect opens its own, as
    /// `ClientCnxnSocketNIO.connect` does, and a connection given up is closed (`cleanup`).
    socket: Cell<Option<Socket>>,
    state: signal::Sender<ConnState>,
    /// Counts the connections lost: a request waiting when it changes fails at once.
    losses: signal::Sender<u64>,
    /// Counts the attempts to re-attach that failed: a request waiting to be sent fails with each.
    failed_reattaches: signal::Sender<u64>,
    /// Counts the sends and receives: the send thread looks again at each (`ClientCnxn.SendThread`'s
    /// loop runs when a packet is queued and when the socket has something to read).
    activity: signal::Sender<u64>,
    /// When the current connection got its session (monotonic ms): go-zookeeper's ping ticker starts
    /// then; and the last of its ticks a ping went out for.
    connected_ms: Cell<i64>,
    ticks_pinged: Cell<i64>,
    /// kazoo: a ping sent and not yet answered (`ConnectionHandler.ping_outstanding`).
    ping_outstanding: Cell<bool>,
    /// The handle was closed by an injected expiry ([`ZkClient::inject_expiry`]): its calls fail with
    /// `SessionExpired`, unsent (`ClientCnxn.conLossPacket` in state `CLOSED`).
    closed: Cell<bool>,
    /// kazoo: the connection retry's current delay, in µs ([`Library::reattach_delay`]).
    retry_delay_us: Cell<u64>,
}

/// A session with the ZooKeeper server. Clones share it; its pinger stops when the last clone is
/// dropped.
#[derive(Clone)]
pub struct ZkClient {
    shared: Rc<Shared>,
    _pinger: Rc<Background>,
}

impl ZkClient {
    /// Open a session as the Java client; `None` if the server did not answer within `requested`.
    pub async fn connect(host: Host, requested: Duration) -> Option<ZkClient> {
        ZkClient::connect_as(host, requested, Library::Java).await
    }

    /// Open a session as `library` behaves: try each server of the list once, each given the session
    /// timeout shared among them (`connectTimeout`; one server has it all).
    pub async fn connect_as(host: Host, requested: Duration, library: Library) -> Option<ZkClient> {
        let provider = match &host {
            Host::Sim(env, servers) => HostProvider::new(servers, &mut env.router.jitter.borrow_mut()),
            Host::Real { servers, .. } => HostProvider::new(servers, &mut host.router().jitter.borrow_mut()),
        };
        let n = provider.servers.len();
        let mut opened = None;
        for i in 0..n {
            let server = provider.servers[i];
            // A new handle has seen nothing.
            let request =
                ZkRequest::Connect { requested_ms: requested.as_millis() as i64, session: None, last_zxid: 0 };
            let socket = host.open(server);
            match host.call_on(server, socket, None, request, requested / n as u32).await {
                Ok((Stamped { reply: ZkReply::Connected { session, timeout_ms }, .. }, life)) => {
                    provider.current.set(i);
                    provider.connected();
                    opened = Some((server, socket, session, timeout_ms, life));
                    break;
                }
                _ => socket.into_iter().for_each(|s| host.close(server, s)),
            }
        }
        let (server, socket, session, timeout_ms, life) = opened?;
        let now = host.monotonic_ms();
        let shared = Rc::new(Shared {
            host,
            provider,
            server: Cell::new(server),
            library,
            session,
            timeout: Duration::from_millis(timeout_ms as u64),
            last_heard_ms: Cell::new(now),
            last_sent_ms: Cell::new(now),
            last_zxid: Cell::new(0),
            conn: Cell::new(Some(life)),
            socket: Cell::new(socket),
            state: signal::channel(ConnState::Connected).0,
            losses: signal::channel(0).0,
            failed_reattaches: signal::channel(0).0,
            activity: signal::channel(0).0,
            connected_ms: Cell::new(now),
            ticks_pinged: Cell::new(0),
            ping_outstanding: Cell::new(false),
            closed: Cell::new(false),
            retry_delay_us: Cell::new(KAZOO_RETRY_DELAY_US),
        });
        shared.host.router().clients.borrow_mut().insert(session, Rc::downgrade(&shared));
        shared.host.record("connected");
        if let Host::Sim(env, _) = &shared.host {
            env.router.start(&env.rpc, &env.recorder);
            env.router.sessions.borrow_mut().push(Rc::downgrade(&shared));
        }
        let pinger = shared.host.spawn(pinger(shared.clone()));
        Some(ZkClient { shared, _pinger: Rc::new(pinger) })
    }

    /// The session's id, as the server gave it when the session was opened (the Java client's
    /// `getSessionId()`; a real client learns it from the `ConnectResponse`). It stays the same when
    /// the client re-attaches the session on a new connection; an expired session is gone for good, and
    /// the next one has another id. Recipes name their nodes with it (ZooKeeper's `WriteLock`:
    /// `x-<session id>-`) to find, after a lost connection, the node they created before it.
    pub fn session_id(&self) -> SessionId {
        self.shared.session
    }

    /// The negotiated session timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// The connection state, and its changes.
    pub fn state(&self) -> signal::Receiver<ConnState> {
        self.shared.state.subscribe()
    }

    /// Whether the session is known to be gone.
    pub fn expired(&self) -> bool {
        self.shared.now() == ConnState::Expired
    }

    /// The client library the session behaves as.
    pub fn library(&self) -> Library {
        self.shared.library
    }

    /// Close this handle as if its session had expired, without telling the server: ZooKeeper's
    /// `Testable.injectSessionExpiration` (3.5+), which Curator's `ConnectionStateManager` calls when
    /// SUSPENDED has lasted the session timeout. The client is `Expired` (its watches end, its requests
    /// fail), its connection is closed and its send loop stops, so it never re-attaches; the server
    /// keeps the session — and its ephemeral nodes — until it expires it itself.
    pub fn inject_expiry(&self) {
        self.shared.closed.set(true);
        self.shared.drop_connection();
        self.shared.set_state(ConnState::Expired);
    }

    /// Run one operation; with `watch` set, also return the watch it registered (if the server set one).
    pub async fn call(&self, op: ZkOp) -> Result<(ZkReply, Option<Watch>), ClientError> {
        if self.shared.closed.get() {
            return Err(ClientError::Zk(ZkError::SessionExpired));
        }
        let watch_path = match &op {
            ZkOp::Exists { path, watch: true }
            | ZkOp::GetData { path, watch: true }
            | ZkOp::GetChildren { path, watch: true } => Some(path.clone()),
            _ => None,
        };
        // Registered before the request leaves, so that no notification can overtake it.
        let watch = watch_path.as_ref().map(|p| self.shared.register(p));
        if let ZkOp::RemoveWatches { path } = &op {
            self.shared.host.router().watchers.borrow_mut().remove(&(self.shared.session, path.clone()));
        }
        if self.shared.library == Library::Kazoo && self.shared.queued_until_reattached().await == ConnState::Expired {
            // `_notify_pending(EXPIRED_SESSION)`, and `_call` in that state: `SessionExpiredError`, unsent.
            return Err(ClientError::Zk(ZkError::SessionExpired));
        }
        let request = ZkRequest::Op { session: self.shared.session, op };
        let timeout = self.shared.library.request_timeout(self.shared.read_timeout());
        let reply = self.shared.request(request, timeout).await;
        if self.shared.closed.get() {
            // Closed while the request waited: `SendThread.cleanup` fails it so.
            return Err(ClientError::Zk(ZkError::SessionExpired));
        }
        match reply {
            Ok(ZkReply::Error(e)) => Err(ClientError::Zk(e)),
            Ok(reply) => Ok((reply, watch)),
            Err(CallError::Timeout | CallError::Reset | CallError::Broken) => Err(ClientError::ConnectionLoss),
        }
    }
}

impl Shared {
    /// The state now (copied out: a borrow held across a state change would deadlock the channel).
    fn now(&self) -> ConnState {
        *self.state.borrow()
    }

    fn set_state(&self, state: ConnState) {
        let current = self.now();
        if current == state || current == ConnState::Expired {
            return;
        }
        self.state.send_replace(state);
        self.host.record(match state {
            ConnState::Connected => "reconnected",
            ConnState::Disconnected => "disconnected",
            ConnState::Expired => "expired",
        });
        if state != ConnState::Connected {
            self.losses.send_modify(|n| *n += 1);
            if state == ConnState::Expired || self.library != Library::Go {
                // Every watcher hears of the state change: its watch ends.
                self.host.router().end_watches(self.session);
            }
            self.host.router().disconnected.borrow_mut().insert(self.session);
        } else {
            self.host.router().disconnected.borrow_mut().remove(&self.session);
        }
    }

    /// Give the connection up: its socket is closed (`ClientCnxn.SendThread.cleanup`), and what it
    /// still holds for the server is the kernel's (see [`Rpc::close`]).
    fn drop_connection(&self) {
        self.conn.set(None);
        if let Some(socket) = self.socket.take() {
            self.host.close(self.server.get(), socket);
        }
    }

    fn register(&self, path: &str) -> Watch {
        let (tx, rx) = oneshot::channel();
        self.host.router().watchers.borrow_mut().entry((self.session, path.to_string())).or_default().push(tx);
        Watch(rx)
    }

    fn read_timeout(&self) -> Duration {
        self.timeout * 2 / 3
    }

    /// Send a request on the connection, waiting at most `timeout`; any answer shows the connection is
    /// alive. A reset (the server restarted) drops the connection: the client is `Disconnected`.
    /// Something came from the server: a reply or a notification.
    fn heard(&self) {
        self.last_heard_ms.set(self.host.monotonic_ms());
        self.activity.send_modify(|n| *n += 1);
    }

    async fn request(&self, request: ZkRequest, timeout: Duration) -> Result<ZkReply, CallError> {
        if !matches!(request, ZkRequest::Connect { .. }) {
            self.until_connected().await?;
        }
        self.last_sent_ms.set(self.host.monotonic_ms());
        self.activity.send_modify(|n| *n += 1);
        // A ping's reply header does not count: the libraries read it apart.
        let counts = matches!(&request, ZkRequest::Op { op, .. } if *op != ZkOp::Ping);
        let (socket, conn) = (self.socket.get(), self.conn.get());
        let mut losses = self.losses.subscribe();
        losses.borrow_and_update();
        let reply = tokio::select! {
            biased;
            reply = self.host.call_on(self.server.get(), socket, conn, request, timeout) => reply,
            // The connection was declared lost meanwhile: the request fails now, applied or not.
            _ = losses.changed() => return Err(CallError::Timeout),
        };
        match reply {
            Ok((Stamped { zxid, reply }, life)) => {
                self.conn.set(Some(life));
                self.heard();
                if counts && zxid > 0 {
                    self.last_zxid.set(zxid);
                }
                match reply {
                    ZkReply::Error(ZkError::SessionExpired) => self.set_state(ConnState::Expired),
                    _ => self.set_state(ConnState::Connected),
                }
                Ok(reply)
            }
            Err(e @ (CallError::Reset | CallError::Broken)) => {
                if self.conn.get().is_some() {
                    self.drop_connection();
                    self.set_state(ConnState::Disconnected);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// A request made while disconnected is queued and sent once a new connection has the session;
    /// each attempt to re-attach that fails fails what is queued, unsent: the request was never
    /// applied. Java: `queuePacket` adds it to `outgoingQueue`, which `SendThread.cleanup` empties with
    /// `ConnectionLoss` after the failed attempt; go-zookeeper: `sendChan`, which the next connect cycle
    /// empties first (`flushUnsentRequests(ErrNoServer)`).
    async fn until_connected(&self) -> Result<(), CallError> {
        let (mut state, mut failed) = (self.state.subscribe(), self.failed_reattaches.subscribe());
        failed.borrow_and_update();
        while *state.borrow_and_update() == ConnState::Disconnected {
            tokio::select! {
                biased;
                changed = state.changed() => changed.map_err(|_| CallError::Reset)?,
                _ = failed.changed(), if self.library != Library::Kazoo => return Err(CallError::Reset),
            }
        }
        match self.closed.get() {
            true => Err(CallError::Reset),
            false => Ok(()),
        }
    }

    /// kazoo's queue (`KazooClient._call` → `_queue`): a request made while disconnected waits, whatever
    /// attempts fail meanwhile, until the session is re-attached or found expired; the state then.
    async fn queued_until_reattached(&self) -> ConnState {
        let mut state = self.state.subscribe();
        loop {
            let now = *state.borrow_and_update();
            if now != ConnState::Disconnected || state.changed().await.is_err() {
                return now;
            }
        }
    }

    /// A new connection has the session: the library's per-connection schedule starts again
    /// (go-zookeeper's ticker; kazoo's `last_send`, `ping_outstanding.clear()` and `retry.reset()`).
    fn reattached(&self) {
        let now = self.host.monotonic_ms();
        self.connected_ms.set(now);
        self.ticks_pinged.set(0);
        self.last_sent_ms.set(now);
        self.ping_outstanding.set(false);
        self.retry_delay_us.set(KAZOO_RETRY_DELAY_US);
    }

    fn reattach_request(&self) -> ZkRequest {
        let requested_ms = self.timeout.as_millis() as i64;
        ZkRequest::Connect { requested_ms, session: Some(self.session), last_zxid: self.last_zxid.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{stream, Stream};

    #[test]
    fn kazoos_reattach_delays_double_from_a_tenth_of_a_second_with_forty_percent_jitter() {
        // `KazooRetry.__call__`: sleep `_cur_delay × uniform(0.6, 1.4)`, then `_cur_delay = sleep × 2`;
        // `reset()` puts it back to 0.1 s. The Java client: 1 s + random(0..1 s) every time.
        let mut jitter = stream(7, Stream::ZkReattach, 0);
        let retry = Cell::new(KAZOO_RETRY_DELAY_US);
        let mut last_us = None;
        for _ in 0..12 {
            let delay = Library::Kazoo.reattach_delay(&mut jitter, &retry, true).as_micros() as u64;
            let base = last_us.map_or(KAZOO_RETRY_DELAY_US, |l: u64| l * 2);
            assert!((base * 6 / 10..=base * 14 / 10).contains(&delay), "{delay} µs after {last_us:?}");
            last_us = Some(delay);
        }
        assert!(last_us.unwrap() > 20_000_000, "doubling: {last_us:?} µs after twelve attempts");
        for _ in 0..12 {
            let java = Library::Java.reattach_delay(&mut jitter, &retry, true);
            assert!((1000..2000).contains(&java.as_millis()), "{java:?}");
        }
    }
}
