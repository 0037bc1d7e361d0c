//! One-shot watches (ZooKeeper 3.8 WatchManager): set by a read, fired once by the next change.
//!
//! `exists` and `getData` set a data watch, fired by NodeCreated, NodeDeleted (and NodeDataChanged);
//! `getChildren` sets a child watch, fired by NodeChildrenChanged and by the node's own deletion.

use super::{EventType, SessionId};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default, Clone)]
pub struct Watches {
    data: BTreeMap<String, BTreeSet<SessionId>>,
    child: BTreeMap<String, BTreeSet<SessionId>>,
}

impl Watches {
    pub fn watch_data(&mut self, path: &str, session: SessionId) {
        self.data.entry(path.to_string()).or_default().insert(session);
    }

    pub fn watch_children(&mut self, path: &str, session: SessionId) {
        self.child.entry(path.to_string()).or_default().insert(session);
    }

    /// The sessions to notify of `event` on `path`; their watches are used up.
    pub fn fire(&mut self, path: &str, event: EventType) -> BTreeSet<SessionId> {
        let mut fired = BTreeSet::new();
        if matches!(event, EventType::NodeCreated | EventType::NodeDeleted | EventType::NodeDataChanged) {
            fired.extend(self.data.remove(path).unwrap_or_default());
        }
        if matches!(event, EventType::NodeChildrenChanged | EventType::NodeDeleted) {
            fired.extend(self.child.remove(path).unwrap_or_default());
        }
        fired
    }

    /// `removeWatches(path, WatcherType.Any)`: drop `session`'s watches on `path`; whether it had any.
    pub fn remove(&mut self, path: &str, session: SessionId) -> bool {
        let mut removed = false;
        for sessions in [self.data.get_mut(path), self.child.get_mut(path)].into_iter().flatten() {
            removed |= sessions.remove(&session);
        }
        removed
    }

    /// A closed or expired session's watches go with it.
    pub fn forget(&mut self, session: SessionId) {
        for sessions in self.data.values_mut().chain(self.child.values_mut()) {
            sessions.remove(&session);
        }
    }
}
