//! Watchers (etcd `mvcc.watchableStore`): a key or a prefix, from a revision on; each change is sent to
//! every matching watcher, in revision order.
//!
//! Watches live on a client's connection (its gRPC watch stream). A client that restarts opens a new
//! connection, and the server drops the old one's watchers when the new one shows up (the old TCP
//! connection is reset). A client that crashes for good keeps its watchers until the server gives up on
//! the connection — hours by default, so never in a run.

use super::mvcc::matches;
use super::WatchId;
use crate::history::NodeIx;
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct Watcher {
    pub key: String,
    pub prefix: bool,
    /// The first revision it is sent: its start revision, even one still in the future (etcd's
    /// `watcherGroup` skips a watcher while `w.minRev > rev`).
    pub min_revision: i64,
}

#[derive(Debug, Default)]
pub struct Watchers {
    by_client: BTreeMap<(NodeIx, WatchId), Watcher>,
    /// Each client node's current connection.
    connection: BTreeMap<NodeIx, u64>,
}

impl Watchers {
    pub fn add(&mut self, node: NodeIx, connection: u64, id: WatchId, watcher: Watcher) {
        if self.connection.insert(node, connection).is_some_and(|old| old != connection) {
            self.by_client.retain(|(n, _), _| *n != node);
        }
        self.by_client.insert((node, id), watcher);
    }

    pub fn cancel(&mut self, node: NodeIx, id: WatchId) {
        self.by_client.remove(&(node, id));
    }

    /// The watchers of a change to `key` at `revision`, in (node, id) order.
    pub fn of(&self, key: &str, revision: i64) -> Vec<(NodeIx, WatchId)> {
        let wants = |w: &Watcher| matches(&w.key, w.prefix, key) && w.min_revision <= revision;
        self.by_client.iter().filter(|(_, w)| wants(w)).map(|(k, _)| *k).collect()
    }
}
