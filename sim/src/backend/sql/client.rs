//! A database client's connection (libpq / JDBC), as recipes use it.
//!
//! - A connection is a TCP stream: statements go out and results come back as stream messages, in
//!   order; a partition delays them. A statement that waits on a lock answers when it finishes.
//! - The socket read timeout (JDBC `socketTimeout`, seed 003; zero: wait for ever, the default): a client
//!   that hears nothing for that long gives up on the statement and closes the connection. The server may
//!   still run what it sent, and learns of the close only when the close reaches it.
//! - A connection the server has ended answers every statement with `Terminated`.
//! - A server process that dies (its kernel closes the connection) breaks the connection at once:
//!   the statement waiting for its result, and every later one, fail as closed (libpq: "server closed
//!   the connection unexpectedly"; the connection is bad).

use super::{ConnId, SqlError, SqlRequest, SqlResponse, SqlResult, Stmt};

use crate::ctx::Background;

use crate::history::NodeIx;
use crate::net::Rpc;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Where a client lives and whom it talks to; its router is the node's reader of statement results.
pub type ClientEnv = crate::backend::ClientEnv<Router>;

/// Hands each result that reaches the node to the statement waiting for it.
#[derive(Default)]
pub struct Router {
    waiting: RefCell<BTreeMap<(ConnId, u64), oneshot::Sender<SqlResult>>>,
    /// Each open connection's server and the life of it that the connection was opened with.
    servers: RefCell<BTreeMap<ConnId, (NodeIx, u32)>>,
    /// Server lives whose process died: their kernel closed every connection to them.
    closed: RefCell<BTreeSet<(NodeIx, u32)>>,
    thread: RefCell<Option<Background>>,
}

impl Router {
    fn start(self: &Rc<Self>, rpc: &Rpc) {
        if self.thread.borrow().is_none() {
            *self.thread.borrow_mut() = Some(super::super::listen_closed(rpc, self, Router::deliver, Router::closed));
        }
    }

    fn deliver(&self, response: SqlResponse) {
        if let Some(waiter) = self.waiting.borrow_mut().remove(&(response.conn, response.seq)) {
            let _ = waiter.send(response.result);
        }
    }

    /// The server's process died: every connection to that life of it reads the end of its stream.
    /// (A simulated PostgreSQL closes no connection of its own: `_socket` is always `None`. The
    /// driver reads its socket on the application's thread: the close is the next statement's.)
    fn closed(&self, server: NodeIx, life: u32, _socket: Option<crate::net::Socket>, _arrived_ns: u64) {
        self.closed.borrow_mut().insert((server, life));
        let conns: BTreeSet<ConnId> =
            self.servers.borrow().iter().filter(|(_, s)| **s == (server, life)).map(|(c, _)| *c).collect();
        let broken: Vec<(ConnId, u64)> =
            self.waiting.borrow().keys().filter(|(c, _)| conns.contains(c)).copied().collect();
        for key in broken {
            if let Some(waiter) = self.waiting.borrow_mut().remove(&key) {
                let _ = waiter.send(SqlResult::Error(SqlError::Terminated));
            }
        }
    }

    fn is_closed(&self, conn: ConnId) -> bool {
        self.servers.borrow().get(&conn).is_some_and(|s| self.closed.borrow().contains(s))
    }
}

/// How long opening a connection may take (JDBC's connectTimeout, 10 s by default).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a statement got no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// Nothing came back within the socket read timeout: the statement may or may not have run, and
    /// the connection is closed.
    ReadTimeout,
    /// The connection is closed (by us after a timeout, or by the server).
    Closed,
}

/// One connection, one server session.
pub struct Connection {
    env: ClientEnv,
    conn: ConnId,
    next_seq: Cell<u64>,
    read_timeout: Duration,
    closed: Cell<bool>,
}

impl Connection {
    /// Connect as `conn` (an id unique in the run, e.g. drawn at random): the TCP handshake and the
    /// session's start-up, within `CONNECT_TIMEOUT`. `None`: the server could not be reached.
    pub async fn open(env: ClientEnv, conn: ConnId, read_timeout: Duration) -> Option<Connection> {
        env.router.start(&env.rpc);
        let hello = SqlRequest::Connect { conn, incarnation: env.rpc.incarnation() };
        let ((), life) = env.rpc.call_on::<_, ()>(env.server, None, None, hello, CONNECT_TIMEOUT).await.ok()?;
        env.router.servers.borrow_mut().insert(conn, (env.server, life));
        Some(Connection { env, conn, next_seq: Cell::new(1), read_timeout, closed: Cell::new(false) })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Run one statement and wait for its result.
    pub async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        if self.env.router.is_closed(self.conn) {
            self.closed.set(true);
        }
        if self.closed.get() {
            return Err(ClientError::Closed);
        }
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        let (tx, rx) = oneshot::channel();
        self.env.router.waiting.borrow_mut().insert((self.conn, seq), tx);
        self.env.rpc.tell(self.env.server, SqlRequest::Execute { conn: self.conn, seq, stmt });
        let result = match self.read_timeout.is_zero() {
            true => rx.await.ok(),
            false => tokio::select! {
                biased;
                result = rx => result.ok(),
                () = self.env.clock.sleep(self.read_timeout) => None,
            },
        };
        match result {
            Some(SqlResult::Error(SqlError::Terminated)) => {
                self.closed.set(true);
                Err(ClientError::Closed)
            }
            Some(result) => Ok(result),
            None => {
                self.env.router.waiting.borrow_mut().remove(&(self.conn, seq));
                self.close();
                Err(ClientError::ReadTimeout)
            }
        }
    }

    /// Close the socket; the server ends the session when the close reaches it.
    pub fn close(&self) {
        if !self.closed.replace(true) {
            self.env.rpc.tell(self.env.server, SqlRequest::Close { conn: self.conn });
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
        self.env.router.servers.borrow_mut().remove(&self.conn);
    }
}
