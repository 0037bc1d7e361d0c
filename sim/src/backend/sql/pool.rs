//! pgbouncer in front of the server: clients' connections end at the pooler, which runs their
//! statements on server connections (backends) of its own pool. What belongs to a PostgreSQL session —
//! session advisory locks and their counts, `SET` settings — belongs to the backend, so a client sees
//! whatever the backend it is handed carries.
//!
//! Modelled from pgbouncer 1.18 (Debian 12), `src/objects.c` and `src/server.c`:
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
//! The pooler runs on the database host (as a sidecar or beside PostgreSQL), so its backends' peer is
//! always alive: the server's keep-alive never ends them. Not modelled yet: pgbouncer's own keep-alive
//! toward clients (a client host that dies silently keeps its backend; the OS default is two hours),
//! `server_idle_timeout`, `server_lifetime`, `query_wait_timeout`, and faults of the pooler itself.

use super::ConnId;
use crate::history::NodeIx;
use std::collections::{BTreeMap, VecDeque};

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
    /// Which client each backend was last handed to.
    last_client: BTreeMap<ConnId, ConnId>,
}

/// What happens to a client's backend when the client goes.
pub(super) enum Left {
    /// It had none.
    Nothing,
    /// Back to the pool after `DISCARD ALL` (session mode, the backend idle).
    Reset(ConnId),
    /// Closed: it was not idle (inside a transaction, or a statement of it waits), or the pool does
    /// not reset it.
    Close(ConnId),
}

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
            last_client: BTreeMap::new(),
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
    /// the pool is below its size.
    pub fn hand_out(&mut self) -> Option<Handed> {
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
        let other_client = self.last_client.insert(server, client).is_some_and(|last| last != client);
        Some(Handed { client, server, new, other_client, waiting })
    }

    /// The node and life of a client (a backend handed to it serves that node).
    pub fn client_node(&self, conn: ConnId) -> (NodeIx, u32) {
        let c = &self.clients[&conn];
        (c.node, c.incarnation)
    }

    /// A backend reported itself idle (`ReadyForQuery`, status `I`): in transaction mode its client
    /// gives it back. Whether it is reset (`DISCARD ALL`) as it goes.
    pub fn idle_again(&mut self, server: ConnId) -> bool {
        if self.settings.mode != PoolMode::Transaction {
            return false;
        }
        match self.clients.values_mut().find(|c| c.server == Some(server)) {
            Some(client) => {
                client.server = None;
                self.idle.push(server);
                self.settings.reset_always
            }
            None => false,
        }
    }

    /// Client `conn` disconnected: what becomes of its backend (`idle`: whether the backend is idle).
    pub fn client_gone(&mut self, conn: ConnId, idle: impl Fn(ConnId) -> bool) -> Left {
        self.queue.retain(|c| *c != conn);
        let Some(server) = self.clients.remove(&conn).and_then(|c| c.server) else { return Left::Nothing };
        match self.settings.mode == PoolMode::Session && idle(server) {
            true => {
                self.idle.push(server);
                Left::Reset(server)
            }
            false => Left::Close(server),
        }
    }

    /// A backend's session ended: it leaves the pool (which may open another in its place), and its
    /// client's connection is closed.
    pub fn server_gone(&mut self, server: ConnId) {
        self.open -= 1;
        self.idle.retain(|s| *s != server);
        self.last_client.remove(&server);
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

/// The id of the pool's `n`-th backend: from the top of the id space, which clients' connection ids
/// (drawn from the seed) do not reach in practice, so both live in one map of sessions.
fn server_conn(n: u64) -> ConnId {
    u64::MAX - n
}
