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
//!   connection, LOST on the re-attach 0.1 s later). The sessions of one bucket are expired one after
//!   the other, each by its own `closeSession` (`SessionTrackerImpl.run`): one expired later in the
//!   same tick still hears of the ephemerals deleted before its own close.
//! - The server's database (`replica.rs`: tree, watches, each session's owner and ephemerals)
//!   is apart from its session tracker, as in ZooKeeper (`ZKDatabase` and `SessionTrackerImpl`).
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
pub mod ensemble;
mod replica;
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
    /// Open a session, or re-attach to `session` after a disconnection. `last_zxid`: the last zxid a
    /// reply to the client carried (`ConnectRequest.lastZxidSeen`; 0 for a new handle): a server that
    /// has applied less refuses the connection (`ZooKeeperServer.processConnectRequest`, "Refusing
    /// session request for client … as it has seen zxid …": it closes it), and the client tries the
    /// next one.
    Connect {
        requested_ms: i64,
        session: Option<SessionId>,
        last_zxid: u64,
    },
    Op {
        session: SessionId,
        op: ZkOp,
    },
}

/// A reply as the wire carries it: its `ReplyHeader`'s zxid with it — the transaction a write made, else
/// the last one the answering server had applied (`FinalRequestProcessor`). The client keeps the last
/// one above 0 from its requests' replies (not pings': `ClientCnxn.readResponse` returns before) as
/// its `lastZxidSeen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamped {
    pub zxid: u64,
    pub reply: ZkReply,
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

/// One ZooKeeper server's state (a single-server ensemble): its database and its session tracker.
#[derive(Debug)]
pub struct ZkState {
    replica: replica::Replica,
    sessions: session::Sessions,
    tick_ms: i64,
}

impl ZkState {
    pub fn new(tick: Duration) -> ZkState {
        let tick_ms = tick.as_millis() as i64;
        ZkState { replica: replica::Replica::default(), sessions: session::Sessions::new(tick_ms), tick_ms }
    }

    /// After a restart: the tree and sessions are recovered from the log, and every session gets a full
    /// timeout from now to reconnect. Watches stand for the ones clients set again on reconnecting.
    pub fn recover(&mut self, now_ms: i64) {
        self.sessions.renew_all(now_ms);
    }

    fn op(&mut self, session: SessionId, op: ZkOp, out: &mut Out) -> Result<ZkReply, ZkError> {
        match op {
            // One server applies requests in order: everything accepted before is applied already.
            ZkOp::Sync { path } => Ok(ZkReply::Synced { path }),
            ZkOp::Close => {
                self.sessions.close(session).expect("touched");
                self.replica.end_session(session, out);
                Ok(ZkReply::Closed)
            }
            op => self.replica.op(session, op, out),
        }
    }
}

impl ZkState {
    /// Sessions are timed on the monotonic clock (`ExpiryQueue` and `SessionTrackerImpl` read
    /// `Time.currentElapsedTime()`, i.e. `System.nanoTime`): a wall-clock jump changes nothing. A
    /// standalone server refuses no `lastZxidSeen`: its log outlives a crash, so it has applied every
    /// zxid it ever answered with.
    fn answer(&mut self, now: Now, via: Connection, request: ZkRequest, out: &mut Out) -> ZkReply {
        let now_ms = now.mono_ms;
        match request {
            ZkRequest::Connect { requested_ms, session: None, .. } => {
                let (session, timeout_ms) = self.sessions.open(via, requested_ms, now_ms);
                self.replica.open_session(session, via.peer, timeout_ms);
                out.lease_started(via.peer, session); // hazard marks: a new session
                ZkReply::Connected { session, timeout_ms }
            }
            ZkRequest::Connect { session: Some(id), .. } => match self.sessions.touch(id, now_ms) {
                Some(s) => {
                    s.connection = Some(via);
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
}

impl Backend for ZkState {
    type Request = ZkRequest;
    type Reply = Stamped;

    fn apply(&mut self, now: Now, from: NodeIx, request: ZkRequest, out: &mut Out) -> Stamped {
        self.apply_via(now, Connection::shared(from), request, out)
    }

    fn apply_via(&mut self, now: Now, via: Connection, request: ZkRequest, out: &mut Out) -> Stamped {
        let reply = self.answer(now, via, request, out);
        Stamped { zxid: self.replica.zxid(), reply }
    }

    fn tick_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.tick_ms as u64))
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        for (id, session) in self.sessions.expire(now.mono_ms) {
            let owner = self.replica.owner(id).expect("a tracked session is in the database");
            out.record(owner, EventKind::Session { state: "expired by the server".into() });
            out.lease_ended(owner, id); // hazard: lease-expired-while-held (if it held)
            self.replica.end_session(id, out);
            out.close(session.connection.expect("a standalone server's sessions came on its connections"));
        }
    }
}

#[cfg(test)]
mod tests;
