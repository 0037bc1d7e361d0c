//! One server's copy of the database (ZooKeeper 3.8 `ZKDatabase`: the `DataTree` and the sessions it
//! knows): the tree, the watches set on it, the last transaction applied, and each session's owner and
//! ephemerals. Transactions change it in zxid order; reads and watches are answered from it as it
//! stands. A standalone server has one; each server of an ensemble has its own, which the commits of
//! the leader's proposals bring up to date.

use super::tree::{self, parent, Tree};
use super::watch::Watches;
use super::{CreateMode, EventType, SessionId, TxnOp, WatchEvent, ZkError, ZkOp, ZkReply};
use crate::backend::Out;
use crate::history::{EventKind, NodeIx};
use std::collections::{BTreeMap, BTreeSet};

/// What the database keeps of a session: where its watch events go and the ephemerals it owns
/// (`DataTree.ephemerals`).
#[derive(Debug, Clone)]
struct Owned {
    owner: NodeIx,
    /// Its negotiated timeout (`ZKDatabase.sessionsWithTimeouts`): a new leader tracks every session
    /// it finds with it.
    timeout_ms: i64,
    ephemerals: BTreeSet<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Replica {
    tree: Tree,
    watches: Watches,
    /// The last transaction applied (`lastProcessedZxid`).
    zxid: u64,
    sessions: BTreeMap<SessionId, Owned>,
}

impl Replica {
    /// A session of timeout `timeout_ms` begins (`createSession`): its events go to `owner`.
    pub fn open_session(&mut self, id: SessionId, owner: NodeIx, timeout_ms: i64) {
        self.sessions.insert(id, Owned { owner, timeout_ms, ephemerals: BTreeSet::new() });
    }

    /// Every live session and its timeout, in id order.
    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, i64)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.timeout_ms))
    }

    /// The last transaction applied.
    pub fn zxid(&self) -> u64 {
        self.zxid
    }

    /// Apply transaction `zxid` of an ensemble — `session`'s operation, or (`op` `None`) the end of
    /// `session` — whatever zxids came before it: an ensemble's zxids carry the epoch in their high
    /// half (`ZxidUtils`), and an error transaction takes its zxid too.
    pub fn apply(
        &mut self,
        zxid: u64,
        session: SessionId,
        op: Option<ZkOp>,
        out: &mut Out,
    ) -> Result<ZkReply, ZkError> {
        self.zxid = zxid - 1;
        let reply = match op {
            Some(op) => self.op(session, op, out),
            None => {
                self.end_session(session, out);
                Ok(ZkReply::Closed)
            }
        };
        self.zxid = zxid;
        reply
    }

    /// A transaction that changes nothing here was applied (an ensemble's `createSession`, whose
    /// session [`Replica::open_session`] opened).
    pub fn advance_to(&mut self, zxid: u64) {
        self.zxid = zxid;
    }

    /// This database as a learner receives it in a snapshot (`SNAP`): the tree and the sessions, not the
    /// watches, which are each server's own (its clients set them on it).
    pub fn snapshot(&self) -> Replica {
        Replica { watches: Watches::default(), ..self.clone() }
    }

    /// The node `session`'s watch events go to, while it lives.
    pub fn owner(&self, session: SessionId) -> Option<NodeIx> {
        self.sessions.get(&session).map(|s| s.owner)
    }

    /// End a session (closed, or expired by the tracker): its watches are forgotten and its ephemerals
    /// deleted, firing their watches — all in one `closeSession` transaction, so in one zxid
    /// (PrepRequestProcessor turns the session's ephemerals into the txn's deletes).
    pub fn end_session(&mut self, id: SessionId, out: &mut Out) {
        let ephemerals = self.sessions.remove(&id).map(|s| s.ephemerals).unwrap_or_default();
        self.watches.forget(id);
        self.zxid += 1;
        for path in ephemerals {
            let _ = self.delete_in(&path, -1, self.zxid, out);
        }
    }

    /// Notify every session watching `path` for `event`.
    fn fire(&mut self, path: &str, event: EventType, out: &mut Out) {
        for session in self.watches.fire(path, event) {
            if let Some(owner) = self.owner(session) {
                out.record(owner, EventKind::Notify { cause: format!("{event:?} {path}") });
                out.push(owner, WatchEvent { session, path: path.to_string(), event });
            }
        }
    }

    /// Delete `path` in transaction `zxid` and fire its watches.
    fn delete_in(&mut self, path: &str, version: i32, zxid: u64, out: &mut Out) -> Result<(), ZkError> {
        let owner = self.tree.stat(path).map(|s| s.ephemeral_owner);
        self.tree.delete(path, version, zxid)?;
        if let Some(session) = owner.and_then(|o| self.sessions.get_mut(&o)) {
            session.ephemerals.remove(path);
        }
        self.fire(path, EventType::NodeDeleted, out);
        self.fire(parent(path), EventType::NodeChildrenChanged, out);
        Ok(())
    }

    /// Apply one write as part of transaction `zxid`, firing its watches into `out`.
    fn write(&mut self, session: SessionId, op: TxnOp, zxid: u64, out: &mut Out) -> Result<ZkReply, ZkError> {
        Ok(match op {
            TxnOp::Create { path, data, mode } => {
                let path = self.tree.create(&path, &data, mode, session, zxid)?;
                if matches!(mode, CreateMode::Ephemeral | CreateMode::EphemeralSequential) {
                    self.sessions.get_mut(&session).expect("a live session").ephemerals.insert(path.clone());
                }
                self.fire(&path, EventType::NodeCreated, out);
                self.fire(parent(&path), EventType::NodeChildrenChanged, out);
                let stat = *self.tree.stat(&path).expect("just created");
                ZkReply::Created { path, stat: tree::copy_stat(&stat) }
            }
            TxnOp::Delete { path, version } => {
                self.delete_in(&path, version, zxid, out)?;
                ZkReply::Deleted
            }
            TxnOp::SetData { path, data, version } => {
                let stat = self.tree.set_data(&path, &data, version, zxid)?;
                self.fire(&path, EventType::NodeDataChanged, out);
                ZkReply::DataSet(tree::copy_stat(&stat))
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

    /// Apply `session`'s operation: a write as a transaction, a read (and its watch) from the tree as
    /// it stands. `Close` and `Sync` are the server's, not the database's.
    pub fn op(&mut self, session: SessionId, op: ZkOp, out: &mut Out) -> Result<ZkReply, ZkError> {
        Ok(match op {
            ZkOp::Ping => ZkReply::Pong,
            ZkOp::Create { path, data, mode } => self.write_alone(session, TxnOp::Create { path, data, mode }, out)?,
            ZkOp::Delete { path, version } => self.write_alone(session, TxnOp::Delete { path, version }, out)?,
            ZkOp::SetData { path, data, version } => {
                self.write_alone(session, TxnOp::SetData { path, data, version }, out)?
            }
            ZkOp::Multi(ops) => self.multi(session, ops, out),
            ZkOp::Exists { path, watch } => {
                if watch {
                    self.watches.watch_data(&path, session);
                }
                ZkReply::Exists(self.tree.stat(&path).map(tree::copy_stat))
            }
            ZkOp::GetData { path, watch } => {
                let (data, stat) = self.tree.data(&path).ok_or(ZkError::NoNode)?;
                let reply = ZkReply::Data { data: data.to_string(), stat: tree::copy_stat(stat) };
                if watch {
                    self.watches.watch_data(&path, session);
                }
                reply
            }
            ZkOp::GetChildren { path, watch } => {
                let (children, stat) = self.tree.children(&path).ok_or(ZkError::NoNode)?;
                let reply = ZkReply::Children { children, stat: tree::copy_stat(stat) };
                if watch {
                    self.watches.watch_children(&path, session);
                }
                reply
            }
            ZkOp::RemoveWatches { path } => match self.watches.remove(&path, session) {
                true => ZkReply::WatchesRemoved,
                false => return Err(ZkError::NoWatcher),
            },
            ZkOp::Sync { .. } | ZkOp::Close => unreachable!("the server's, not the database's"),
        })
    }
}
