//! A simulated ZooKeeper 3.8 server: znodes, sessions, ephemerals, sequential nodes and one-shot watches.
//!
//! Modelled behaviour, from the ZooKeeper 3.8 programmer's guide and server code:
//! - Every successful write is a transaction with the next zxid; a node's stat keeps czxid (its
//!   creation), mzxid, pzxid, version, cversion (changes to its children) and its ephemeral owner.
//! - `create` fails with NoNode without a parent, NodeExists if taken, NoChildrenForEphemerals under an
//!   ephemeral. Sequential modes append the parent's cversion as 10 zero-padded digits (`lock-0000000007`);
//!   cversion counts creates of children (a delete moves only the parent's pzxid), so the suffix keeps
//!   counting and restarts from 0 if the parent is recreated. Clients are told `cversion * 2 -
//!   numChildren`, the count of creates and deletes (`copy_stat`).
//! - `delete` takes a version (-1: any) and fails with BadVersion or NotEmpty; `setData` takes a version
//!   too, counts the node's version up and fires its data watches (NodeDataChanged).
//! - `exists` and `getData` leave a data watch, `getChildren` a child watch; a watch fires once. A watch
//!   on a deleted node's predecessor or a lock node is how recipes wait; each notification sent is
//!   recorded in the history as `Notify` (the herd count).
//! - `multi` (3.4+, `PrepRequestProcessor`'s MultiTxn): creates, deletes, setData and `check` (a version
//!   test) as one transaction — each sees the ones before it, all get one zxid and fire their watches,
//!   or one failing, none is applied and the answer names it. A create's answer is its path alone. `removeWatches` (3.5+) drops a session's
//!   watches on a path (NoWatcher if none). `sync` on a single server answers once what came before is
//!   applied, which it always is.
//! - Sessions: timeouts negotiated into [2, 20] × tickTime; each request or ping renews one; the server
//!   expires a session whose bucket's tick passes, deleting its ephemerals and firing their watches,
//!   and closes the session's connection (`FinalRequestProcessor`: a `closeSession` without a
//!   connection of its own — the tracker's — closes the session's `ServerCnxn`). Its client reads the
//!   end of the stream and is disconnected at once, even idle; it learns the session expired when it
//!   re-attaches (seen on Debian's ZooKeeper 3.8 with kazoo: SUSPENDED as the server closed the
//!   connection, LOST on the re-attach 0.1 s later).
//!   Buckets are the multiples of tickTime on the host's monotonic clock (`ExpiryQueue` over
//!   `Time.currentElapsedTime()`, i.e. `System.nanoTime`, which counts from the host's boot): their
//!   phase is the host's uptime, drawn per seed (`World::add_server`) and kept across restarts.
//!   A re-attach of an expired session fails with SessionExpired, which is how a client learns of it
//!   (the real server answers a `ConnectResponse` with timeout 0; the client library reports
//!   Expired); so does a request that reaches the server on another connection.
//! - Durability: every transaction is logged to disk before it is acknowledged, so a restarted server
//!   recovers its tree and its sessions, and gives each session a fresh timeout to reconnect in
//!   (SessionTrackerImpl on load). Watches are kept: a real client sets its watches again when it
//!   reconnects (SetWatches), and the server fires any whose change it missed.

pub mod client;
mod session;
mod tree;
mod watch;

use super::{Backend, Now, Out};
use crate::history::{EventKind, NodeIx};
use crate::net::Connection;
use std::time::Duration;

pub use tree::{copy_stat, parent};

pub type SessionId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    Persistent,
    Ephemeral,
    PersistentSequential,
    EphemeralSequential,
}

/// A znode's stat (the fields recipes use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    pub czxid: u64,
    pub mzxid: u64,
    pub pzxid: u64,
    pub version: i32,
    pub cversion: i32,
    /// The owning session of an ephemeral node; 0 for persistent nodes.
    pub ephemeral_owner: SessionId,
    pub num_children: i32,
}

/// KeeperException codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZkError {
    NoNode,
    NodeExists,
    BadVersion,
    NotEmpty,
    NoChildrenForEphemerals,
    SessionExpired,
    /// `removeWatches` found no watch of this session on the path.
    NoWatcher,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    NodeCreated,
    NodeDeleted,
    NodeDataChanged,
    NodeChildrenChanged,
}

/// A watch notification, pushed to the client that owns the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub session: SessionId,
    pub path: String,
    pub event: EventType,
}

/// An operation within a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZkOp {
    Ping,
    Create {
        path: String,
        data: String,
        mode: CreateMode,
    },
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: String,
        version: i32,
    },
    Exists {
        path: String,
        watch: bool,
    },
    GetData {
        path: String,
        watch: bool,
    },
    GetChildren {
        path: String,
        watch: bool,
    },
    /// `removeWatches(path, Any)`: drop this session's watches on `path` (ZooKeeper 3.5+).
    RemoveWatches {
        path: String,
    },
    /// `multi`: the writes of one transaction, applied all together in one zxid or not at all.
    Multi(Vec<TxnOp>),
    /// `sync(path)`: answered once every write the server had accepted before it is applied.
    Sync {
        path: String,
    },
    Close,
}

/// An operation of a `multi` transaction (ZooKeeper's `Op`): the writes, and `check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Create {
        path: String,
        data: String,
        mode: CreateMode,
    },
    Delete {
        path: String,
        version: i32,
    },
    SetData {
        path: String,
        data: String,
        version: i32,
    },
    /// `Op.check`: fails the transaction unless `path` exists at `version` (-1: any).
    Check {
        path: String,
        version: i32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZkRequest {
    /// Open a session, or re-attach to `session` after a disconnection.
    Connect {
        requested_ms: i64,
        session: Option<SessionId>,
    },
    Op {
        session: SessionId,
        op: ZkOp,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZkReply {
    Connected {
        session: SessionId,
        timeout_ms: i64,
    },
    Pong,
    Created {
        path: String,
        stat: Stat,
    },
    Deleted,
    DataSet(Stat),
    Exists(Option<Stat>),
    Data {
        data: String,
        stat: Stat,
    },
    Children {
        children: Vec<String>,
        stat: Stat,
    },
    WatchesRemoved,
    /// A `multi`'s answer: every operation's reply, or — nothing applied — the index of the first
    /// operation that failed and its error (what the Java client's `KeeperException` carries).
    Multi(Result<Vec<ZkReply>, (usize, ZkError)>),
    /// CheckResult: a `check` in a `multi` held.
    Checked,
    /// A create inside a `multi`: its path alone — ZooKeeper 3.8 answers it with a `CreateResult`
    /// without a stat (seen by `locksim conform zk`).
    CreatedPath {
        path: String,
    },
    Synced {
        path: String,
    },
    Closed,
    Error(ZkError),
}

/// One ZooKeeper server's state (a single-server ensemble).
#[derive(Debug)]
pub struct ZkState {
    tree: tree::Tree,
    sessions: session::Sessions,
    watches: watch::Watches,
    zxid: u64,
    tick_ms: i64,
}

impl ZkState {
    pub fn new(tick: Duration) -> ZkState {
        let tick_ms = tick.as_millis() as i64;
        ZkState {
            tree: tree::Tree::default(),
            sessions: session::Sessions::new(tick_ms),
            watches: Default::default(),
            zxid: 0,
            tick_ms,
        }
    }

    /// After a restart: the tree and sessions are recovered from the log, and every session gets a full
    /// timeout from now to reconnect. Watches stand for the ones clients set again on reconnecting.
    pub fn recover(&mut self, now_ms: i64) {
        self.sessions.renew_all(now_ms);
    }

    /// Notify every session watching `path` for `event`.
    fn fire(&mut self, path: &str, event: EventType, out: &mut Out) {
        for session in self.watches.fire(path, event) {
            if let Some(owner) = self.sessions.owner(session) {
                out.record(owner, EventKind::Notify { cause: format!("{event:?} {path}") });
                out.push(owner, WatchEvent { session, path: path.to_string(), event });
            }
        }
    }

    /// Delete `path` in transaction `zxid` and fire its watches.
    fn delete_in(&mut self, path: &str, version: i32, zxid: u64, out: &mut Out) -> Result<(), ZkError> {
        let owner = self.tree.stat(path).map(|s| s.ephemeral_owner);
        self.tree.delete(path, version, zxid)?;
        if let Some(session) = owner.and_then(|o| self.sessions.get_mut(o)) {
            session.ephemerals.remove(path);
        }
        self.fire(path, EventType::NodeDeleted, out);
        self.fire(parent(path), EventType::NodeChildrenChanged, out);
        Ok(())
    }

    /// End a session (closed, or expired by the tracker): its watches are forgotten and its ephemerals
    /// deleted, firing their watches — all in one `closeSession` transaction, so in one zxid
    /// (PrepRequestProcessor turns the session's ephemerals into the txn's deletes).
    fn end_session(&mut self, ephemerals: impl IntoIterator<Item = String>, id: SessionId, out: &mut Out) {
        self.watches.forget(id);
        self.zxid += 1;
        for path in ephemerals {
            let _ = self.delete_in(&path, -1, self.zxid, out);
        }
    }

    /// Apply one write as part of transaction `zxid`, firing its watches into `out`.
    fn write(&mut self, session: SessionId, op: TxnOp, zxid: u64, out: &mut Out) -> Result<ZkReply, ZkError> {
        Ok(match op {
            TxnOp::Create { path, data, mode } => {
                let path = self.tree.create(&path, &data, mode, session, zxid)?;
                if matches!(mode, CreateMode::Ephemeral | CreateMode::EphemeralSequential) {
                    self.sessions.get_mut(session).expect("touched").ephemerals.insert(path.clone());
                }
                self.fire(&path, EventType::NodeCreated, out);
                self.fire(parent(&path), EventType::NodeChildrenChanged, out);
                let stat = *self.tree.stat(&path).expect("just created");
                ZkReply::Created { path, stat: copy_stat(&stat) }
            }
            TxnOp::Delete { path, version } => {
                self.delete_in(&path, version, zxid, out)?;
                ZkReply::Deleted
            }
            TxnOp::SetData { path, data, version } => {
                let stat = self.tree.set_data(&path, &data, version, zxid)?;
                self.fire(&path, EventType::NodeDataChanged, out);
                ZkReply::DataSet(copy_stat(&stat))
            }
            TxnOp::Check { path, version } => match self.tree.stat(&path) {
                None => return Err(ZkError::NoNode),
                Some(stat) if version != -1 && stat.version != version => return Err(ZkError::BadVersion),
                Some(_) => ZkReply::Checked,
            },
        })
    }

    /// One write in a transaction of its own.
    fn write_alone(&mut self, session: SessionId, op: TxnOp, out: &mut Out) -> Result<ZkReply, ZkError> {
        let reply = self.write(session, op, self.zxid + 1, out)?;
        self.zxid += 1;
        Ok(reply)
    }

    /// `multi` (PrepRequestProcessor's MultiTxn): each operation sees the ones before it; all are
    /// applied in one zxid, or — one failing — none, and no watch fires.
    fn multi(&mut self, session: SessionId, ops: Vec<TxnOp>, out: &mut Out) -> ZkReply {
        let before = (self.tree.clone(), self.sessions.clone(), self.watches.clone());
        let mut fired = Out::default();
        let mut replies = Vec::with_capacity(ops.len());
        for (i, op) in ops.into_iter().enumerate() {
            match self.write(session, op, self.zxid + 1, &mut fired) {
                Ok(ZkReply::Created { path, .. }) => replies.push(ZkReply::CreatedPath { path }),
                Ok(reply) => replies.push(reply),
                Err(e) => {
                    (self.tree, self.sessions, self.watches) = before;
                    return ZkReply::Multi(Err((i, e)));
                }
            }
        }
        self.zxid += 1;
        out.events.extend(fired.events);
        out.pushes.extend(fired.pushes);
        ZkReply::Multi(Ok(replies))
    }

    fn op(&mut self, session: SessionId, op: ZkOp, out: &mut Out) -> Result<ZkReply, ZkError> {
        Ok(match op {
            ZkOp::Ping => ZkReply::Pong,
            ZkOp::Create { path, data, mode } => self.write_alone(session, TxnOp::Create { path, data, mode }, out)?,
            ZkOp::Delete { path, version } => self.write_alone(session, TxnOp::Delete { path, version }, out)?,
            ZkOp::SetData { path, data, version } => {
                self.write_alone(session, TxnOp::SetData { path, data, version }, out)?
            }
            ZkOp::Multi(ops) => self.multi(session, ops, out),
            // One server applies requests in order: everything accepted before is applied already.
            ZkOp::Sync { path } => ZkReply::Synced { path },
            ZkOp::Exists { path, watch } => {
                if watch {
                    self.watches.watch_data(&path, session);
                }
                ZkReply::Exists(self.tree.stat(&path).map(copy_stat))
            }
            ZkOp::GetData { path, watch } => {
                let (data, stat) = self.tree.data(&path).ok_or(ZkError::NoNode)?;
                let reply = ZkReply::Data { data: data.to_string(), stat: copy_stat(stat) };
                if watch {
                    self.watches.watch_data(&path, session);
                }
                reply
            }
            ZkOp::GetChildren { path, watch } => {
                let (children, stat) = self.tree.children(&path).ok_or(ZkError::NoNode)?;
                let reply = ZkReply::Children { children, stat: copy_stat(stat) };
                if watch {
                    self.watches.watch_children(&path, session);
                }
                reply
            }
            ZkOp::RemoveWatches { path } => match self.watches.remove(&path, session) {
                true => ZkReply::WatchesRemoved,
                false => return Err(ZkError::NoWatcher),
            },
            ZkOp::Close => {
                let closed = self.sessions.close(session).expect("touched");
                self.end_session(closed.ephemerals, session, out);
                ZkReply::Closed
            }
        })
    }
}

impl Backend for ZkState {
    type Request = ZkRequest;
    type Reply = ZkReply;

    fn apply(&mut self, now: Now, from: NodeIx, request: ZkRequest, out: &mut Out) -> ZkReply {
        self.apply_via(now, Connection::shared(from), request, out)
    }

    /// Sessions are timed on the monotonic clock (`ExpiryQueue` and `SessionTrackerImpl` read
    /// `Time.currentElapsedTime()`, i.e. `System.nanoTime`): a wall-clock jump changes nothing.
    fn apply_via(&mut self, now: Now, via: Connection, request: ZkRequest, out: &mut Out) -> ZkReply {
        let now_ms = now.mono_ms;
        match request {
            ZkRequest::Connect { requested_ms, session: None } => {
                let (session, timeout_ms) = self.sessions.open(via, requested_ms, now_ms);
                out.lease_started(via.peer, session); // hazard marks: a new session
                ZkReply::Connected { session, timeout_ms }
            }
            ZkRequest::Connect { session: Some(id), .. } => match self.sessions.touch(id, now_ms) {
                Some(s) => {
                    s.connection = via;
                    ZkReply::Connected { session: id, timeout_ms: s.timeout_ms }
                }
                None => ZkReply::Error(ZkError::SessionExpired),
            },
            ZkRequest::Op { session, op } => {
                if self.sessions.touch(session, now_ms).is_none() {
                    return ZkReply::Error(ZkError::SessionExpired);
                }
                self.op(session, op, out).unwrap_or_else(ZkReply::Error)
            }
        }
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.tick_ms as u64))
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        for (id, session) in self.sessions.expire(now.mono_ms) {
            out.record(session.owner, EventKind::Session { state: "expired by the server".into() });
            out.lease_ended(session.owner, id); // hazard: lease-expired-while-held (if it held)
            self.end_session(session.ephemerals, id, out);
            out.close(session.connection);
        }
    }
}

#[cfg(test)]
mod tests;
