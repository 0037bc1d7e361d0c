//! pgbouncer in front of the server: clients' connections end at the pooler, which runs their
//! statements on server connections (backends) of its own pool. What belongs to a PostgreSQL session —
//! session advisory locks and their counts, `SET` settings — belongs to the backend, so a client sees
//! whatever the backend it is handed carries.
//!
//! Modelled from pgbouncer 1.18 (Debian 12), `src/objects.c`, `src/server.c` and `src/janitor.c`:
//! - `pool_mode = transaction`: a client is handed a backend when it sends a statement outside a
//!   transaction, and gives it back when the backend reports itself idle again (`ReadyForQuery` with
//!   status `I`: an autocommit statement done, `COMMIT`/`ROLLBACK` done) — `release_server` in
//!   `server_proto`'s handling of `ReadyForQuery`. No reset query runs between clients
//!   (`server_reset_query_always = 0`): a session advisory lock, or a `SET lock_timeout`, stays on the
//!   backend for the next client.
//! - `pool_mode = session`: a client keeps its backend until it disconnects; the backend then runs
//!   `server_reset_query` (`DISCARD ALL`: every session advisory lock released, settings reset) and goes
//!   back to the pool. `server_reset_query_always = 1` runs it in transaction mode too, each time a
//!   backend goes back to the pool (`release_server`, `reset_on_release`).
//! - Idle backends are handed out last released first (`server_round_robin = 0`, the default: LIFO).
//!   The pool opens backends up to `default_pool_size` (20); beyond that a client waits, first come
//!   first served, for one to come free.
//! - A client that disconnects while its backend is inside a transaction (or has a statement waiting
//!   on a lock) makes pgbouncer close that backend ("client disconnect while server was not ready"):
//!   PostgreSQL reads the end of the connection and ends the session, rolling back and freeing its
//!   locks — a statement waiting on a lock keeps its place until it runs, as for a direct client.
//! - A backend whose session the server ends (`idle_in_transaction_session_timeout`) takes its client's
//!   connection with it: pgbouncer closes the client, whose next statement finds it gone.
//!
//! - Unused backends (idle in the pool, linked to no client) are closed by the janitor
//!   (`janitor.c`, `check_unused_servers`, every third of a second): one whose last packet is more
//!   than `server_idle_timeout` (600 s) old, or one connected at least `server_lifetime` (3600 s) ago —
//!   lifetime closes spaced `server_lifetime / default_pool_size` apart (`life_over`). A backend past
//!   its lifetime is also closed as it is released (`release_server`: "enforce lifetime immediately on
//!   release"), so `server_lifetime = 0` uses each backend once. A backend linked to a client (session
//!   mode, or inside a transaction) is never closed by either. Closing a backend ends its PostgreSQL
//!   session: the session advisory locks a transaction-pooled client left on it are freed. pgbouncer
//!   reads both ages from libusual's `get_time_usec`, which is `gettimeofday`: the database host's
//!   wall clock, so a clock stepped forward closes old backends at once — and so does one stepped
//!   back, since the ages are unsigned (`usec_t` is `uint64_t`) and wrap. The model looks on the
//!   server's 100 ms tick rather than every 333 ms: a close comes up to 100 ms after its due time
//!   rather than up to 333 ms.
//!
//! The pooler runs on the database host (as a sidecar or beside PostgreSQL), so its backends' peer is
//! always alive: the server's keep-alive never ends them. Not modelled yet: pgbouncer's own keep-alive
//! toward clients (a client host that dies silently keeps its backend; the OS default is two hours),
//! `query_wait_timeout`, `min_pool_size`, and faults of the pooler itself.

use super::ConnId;
use crate::history::NodeIx;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// pgbouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
}

/// The pooler's settings.
#[derive(Debug, Clone, Copy)]
pub struct Pooler {
    pub mode: PoolMode,
    /// `default_pool_size`: the most backends the pool opens.
    pub size: usize,
    /// `server_reset_query_always`: `DISCARD ALL` on every release, in transaction mode too.
    pub reset_always: bool,
    /// `server_idle_timeout`: an unused backend whose last packet is older is closed; zero: never.
    pub idle_timeout: Duration,
    /// `server_lifetime`: an unused backend connected this long ago is closed; zero: each is used once.
    pub lifetime: Duration,
}

impl Pooler {
    /// pgbouncer 1.18's defaults (`main.c`), in `mode`.
    pub fn new(mode: PoolMode) -> Pooler {
        Pooler {
            mode,
            size: 20,
            reset_always: false,
            idle_timeout: Duration::from_secs(600),
            lifetime: Duration::from_secs(3600),
        }
    }
}

/// A client's connection to the pooler.
#[derive(Debug, Clone)]
struct Client {
    node: NodeIx,
    incarnation: u32,
    /// The backend it holds now.
    server: Option<ConnId>,
    /// Its statement waiting for a backend.
    next: Option<Waiting>,
    /// Its backend's session ended under it: pgbouncer closed its connection.
    closed: bool,
}

/// A statement waiting for a backend.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    pub seq: u64,
    pub stmt: super::Stmt,
}

/// The pool's state.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    pub settings: Pooler,
    clients: BTreeMap<ConnId, Client>,
    /// Idle backends, the last released last (handed out first).
    idle: Vec<ConnId>,
    /// Backends open now (each a server session of its own).
    open: usize,
    /// Backends opened so far: the next one's number.
    opened: u64,
    /// Clients waiting for a backend, first come first served.
    queue: VecDeque<ConnId>,
    /// Each open backend's times and last client.
    backends: BTreeMap<ConnId, Server>,
    /// When the janitor last closed a backend for its lifetime (wall ms).
    last_lifetime_close_ms: Option<i64>,
}

/// What the pooler keeps of an open backend (pgbouncer's `PgSocket` of a server), times by the
/// database host's wall clock (ms).
#[derive(Debug, Clone)]
struct Server {
    /// `connect_time`.
    connected_ms: i64,
    /// `request_time`: its last packet. A backend is released on its last result (or its reset's),
    /// so this is when it went back to the pool.
    last_packet_ms: i64,
    /// The client it was last handed to, and that client's node.
    last_client: Option<(ConnId, NodeIx)>,
}

/// What happens to a client's backend when the client goes.
pub(super) enum Left {
    /// It had none.
    Nothing,
    /// Back to the pool after `DISCARD ALL` (session mode, the backend idle).
    Reset(ConnId),
    /// Closed, and why: it was not idle (inside a transaction, or a statement of it waits), or the
    /// pool does not reset it, or its lifetime is over.
    Close(ConnId, &'static str),
}

/// What becomes of a backend its transaction-pooled client gives back.
pub(super) enum Released {
    /// Still the client's (session pooling), or no client's.
    Kept,
    /// Back in the pool; whether it is reset (`DISCARD ALL`) as it goes.
    Pooled { reset: bool },
    /// Closed: its lifetime is over.
    Closed,
}

/// Why pgbouncer closes a backend whose client left it not idle.
const NOT_IDLE: &str = "closed by pgbouncer: its client disconnected while it was not idle";
/// Why pgbouncer closes an unused backend.
pub(super) const IDLE_TIMEOUT: &str = "closed by pgbouncer: server idle timeout";
pub(super) const LIFETIME_OVER: &str = "closed by pgbouncer: server lifetime over";

/// A backend handed to a client for its waiting statement.
pub(super) struct Handed {
    pub client: ConnId,
    pub server: ConnId,
    /// A backend the pool opens now: it needs a session.
    pub new: bool,
    /// Another client was the last to hold it.
    pub other_client: bool,
    pub waiting: Waiting,
}

impl Pool {
    pub fn new(settings: Pooler) -> Pool {
        Pool {
            settings,
            clients: BTreeMap::new(),
            idle: Vec::new(),
            open: 0,
            opened: 0,
            queue: VecDeque::new(),
            backends: BTreeMap::new(),
            last_lifetime_close_ms: None,
        }
    }

    /// A client connected.
    pub fn connect(&mut self, conn: ConnId, node: NodeIx, incarnation: u32) {
        let client = Client { node, incarnation, server: None, next: None, closed: false };
        self.clients.insert(conn, client);
    }

    /// Whether `conn` is a client of the pool (its statements go through it).
    pub fn has_client(&self, conn: ConnId) -> bool {
        self.clients.contains_key(&conn)
    }

    /// The backend a client's statement runs on now; `Err(true)`: the client's connection is gone;
    /// `Err(false)`: it has none, and the statement waits for one.
    pub fn server_of(&mut self, conn: ConnId, waiting: Waiting) -> Result<ConnId, bool> {
        let Some(client) = self.clients.get_mut(&conn).filter(|c| !c.closed) else { return Err(true) };
        match client.server {
            Some(server) => Ok(server),
            None => {
                client.next = Some(waiting);
                self.queue.push_back(conn);
                Err(false)
            }
        }
    }

    /// The client a backend's results go to, and its node.
    pub fn client_of(&self, server: ConnId) -> Option<(ConnId, NodeIx)> {
        self.clients.iter().find(|(_, c)| c.server == Some(server)).map(|(conn, c)| (*conn, c.node))
    }

    /// Hand the first waiting client a backend: an idle one (the last released), or a new one while
    /// the pool is below its size (`now_ms`: the wall clock).
    pub fn hand_out(&mut self, now_ms: i64) -> Option<Handed> {
        let client = *self.queue.front()?;
        let (server, new) = match self.idle.pop() {
            Some(server) => (server, false),
            None if self.open < self.settings.size => {
                (self.open, self.opened) = (self.open + 1, self.opened + 1);
                (server_conn(self.opened), true)
            }
            None => return None,
        };
        self.queue.pop_front();
        let c = self.clients.get_mut(&client).expect("a queued client is connected");
        c.server = Some(server);
        let waiting = c.next.take().expect("a queued client has a statement");
        let node = c.node;
        let fresh = Server { connected_ms: now_ms, last_packet_ms: now_ms, last_client: None };
        let backend = self.backends.entry(server).or_insert(fresh);
        let last = backend.last_client.replace((client, node));
        let other_client = last.is_some_and(|(last, _)| last != client);
        Some(Handed { client, server, new, other_client, waiting })
    }

    /// The node and life of a client (a backend handed to it serves that node).
    pub fn client_node(&self, conn: ConnId) -> (NodeIx, u32) {
        let c = &self.clients[&conn];
        (c.node, c.incarnation)
    }

    /// A backend reported itself idle (`ReadyForQuery`, status `I`) at `now_ms`: in transaction mode
    /// its client gives it back.
    pub fn idle_again(&mut self, server: ConnId, now_ms: i64) -> Released {
        if let Some(backend) = self.backends.get_mut(&server) {
            backend.last_packet_ms = now_ms;
        }
        if self.settings.mode != PoolMode::Transaction {
            return Released::Kept;
        }
        let Some(client) = self.clients.values_mut().find(|c| c.server == Some(server)) else { return Released::Kept };
        client.server = None;
        if self.life_over(server, now_ms) {
            self.last_lifetime_close_ms = Some(now_ms);
            return Released::Closed;
        }
        self.idle.push(server);
        Released::Pooled { reset: self.settings.reset_always }
    }

    /// pgbouncer's `life_over`: `server` is at least `server_lifetime` old, and no backend was closed
    /// for its lifetime in the last `server_lifetime / default_pool_size` (so that a pool opened at
    /// once is not closed at once).
    fn life_over(&self, server: ConnId, now_ms: i64) -> bool {
        let lifetime = self.settings.lifetime.as_millis() as i64;
        let Some(backend) = self.backends.get(&server) else { return false };
        let gap = lifetime / self.settings.size as i64;
        since(now_ms, backend.connected_ms) >= lifetime
            && self.last_lifetime_close_ms.is_none_or(|at| since(now_ms, at) >= gap)
    }

    /// The janitor at `now_ms`: the unused backends to close, and why (`check_unused_servers`).
    pub fn janitor(&mut self, now_ms: i64) -> Vec<(ConnId, &'static str)> {
        let idle_timeout = self.settings.idle_timeout.as_millis() as i64;
        let mut closed = Vec::new();
        for server in self.idle.clone() {
            let backend = &self.backends[&server];
            if idle_timeout > 0 && since(now_ms, backend.last_packet_ms) > idle_timeout {
                closed.push((server, IDLE_TIMEOUT));
            } else if self.life_over(server, now_ms) {
                self.last_lifetime_close_ms = Some(now_ms);
                closed.push((server, LIFETIME_OVER));
            }
        }
        closed
    }

    /// The client `server` was last handed to, and its node, if it is one of the pool's backends.
    pub fn last_client(&self, server: ConnId) -> Option<(ConnId, NodeIx)> {
        self.backends.get(&server).and_then(|b| b.last_client)
    }

    /// Client `conn` disconnected at `now_ms`: what becomes of its backend (`idle`: whether the
    /// backend is idle).
    pub fn client_gone(&mut self, conn: ConnId, idle: impl Fn(ConnId) -> bool, now_ms: i64) -> Left {
        self.queue.retain(|c| *c != conn);
        let Some(server) = self.clients.remove(&conn).and_then(|c| c.server) else { return Left::Nothing };
        if self.settings.mode != PoolMode::Session || !idle(server) {
            return Left::Close(server, NOT_IDLE);
        }
        if self.life_over(server, now_ms) {
            self.last_lifetime_close_ms = Some(now_ms);
            return Left::Close(server, LIFETIME_OVER);
        }
        // The reset's results are the backend's last packets.
        if let Some(backend) = self.backends.get_mut(&server) {
            backend.last_packet_ms = now_ms;
        }
        self.idle.push(server);
        Left::Reset(server)
    }

    /// A backend's session ended: it leaves the pool (which may open another in its place), and its
    /// client's connection is closed.
    pub fn server_gone(&mut self, server: ConnId) {
        self.open -= 1;
        self.idle.retain(|s| *s != server);
        self.backends.remove(&server);
        if let Some(client) = self.clients.values_mut().find(|c| c.server == Some(server)) {
            client.server = None;
            client.closed = true;
        }
    }

    /// The clients on `node` in its life `incarnation` (whose process died).
    pub fn clients_of(&self, node: NodeIx, incarnation: u32) -> Vec<ConnId> {
        self.clients
            .iter()
            .filter(|(_, c)| c.node == node && c.incarnation == incarnation)
            .map(|(conn, _)| *conn)
            .collect()
    }
}

/// `now - then` as pgbouncer computes an age, in unsigned microseconds (`usec_t`): a wall clock stepped
/// back before `then` wraps it past any setting.
fn since(now_ms: i64, then_ms: i64) -> i64 {
    match now_ms >= then_ms {
        true => now_ms - then_ms,
        false => i64::MAX,
    }
}

/// The id of the pool's `n`-th backend: from the top of the id space, which clients' connection ids
/// (drawn from the seed) do not reach in practice, so both live in one map of sessions.
fn server_conn(n: u64) -> ConnId {
    u64::MAX - n
}
