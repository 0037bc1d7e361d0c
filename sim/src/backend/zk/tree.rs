//! The znode tree: paths, data, stats, ephemeral owners and sequential names (ZooKeeper 3.8 DataTree).

use super::{CreateMode, SessionId, Stat, ZkError};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
struct Znode {
    data: String,
    stat: Stat,
    children: BTreeSet<String>,
}

/// The tree, with `/` always present.
#[derive(Debug, Clone)]
pub struct Tree {
    nodes: BTreeMap<String, Znode>,
}

impl Default for Tree {
    fn default() -> Self {
        let root = Znode { data: String::new(), stat: Stat::default(), children: BTreeSet::new() };
        Tree { nodes: BTreeMap::from([("/".to_string(), root)]) }
    }
}

/// A stat as the server sends it (ZooKeeper's `DataNode.copyStat`): the tree counts only the creates of
/// children in `cversion` (what sequence suffixes use), but a client is told the count of every change
/// to the children, creates and deletes: `cversion * 2 - numChildren`. Found by `locksim conform zk` and
/// checked on 3.8.0: after creating `/l/n-0000000000` and `/l/x` and deleting `/l/x`, the server
/// reports cversion 3, and names the next sequential child `/l/n-0000000002`.
pub fn copy_stat(stat: &Stat) -> Stat {
    Stat { cversion: stat.cversion * 2 - stat.num_children, ..*stat }
}

/// `/a/b` → `/a`; `/a` → `/`.
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

fn name(path: &str) -> &str {
    &path[path.rfind('/').map_or(0, |i| i + 1)..]
}

impl Tree {
    pub fn stat(&self, path: &str) -> Option<&Stat> {
        self.nodes.get(path).map(|n| &n.stat)
    }

    pub fn data(&self, path: &str) -> Option<(&str, &Stat)> {
        self.nodes.get(path).map(|n| (n.data.as_str(), &n.stat))
    }

    /// Children names in name order (ZooKeeper returns them unordered; clients sort).
    pub fn children(&self, path: &str) -> Option<(Vec<String>, &Stat)> {
        self.nodes.get(path).map(|n| (n.children.iter().cloned().collect(), &n.stat))
    }

    /// Create `path` (with a sequence suffix for sequential modes) in transaction `zxid`; returns the
    /// path created. The suffix is the parent's cversion, zero-padded to 10 digits, as ZooKeeper does.
    pub fn create(
        &mut self,
        path: &str,
        data: &str,
        mode: CreateMode,
        owner: SessionId,
        zxid: u64,
    ) -> Result<String, ZkError> {
        let parent_path = parent(path).to_string();
        let parent = self.nodes.get_mut(&parent_path).ok_or(ZkError::NoNode)?;
        if parent.stat.ephemeral_owner != 0 {
            return Err(ZkError::NoChildrenForEphemerals);
        }
        let path = match mode {
            CreateMode::PersistentSequential | CreateMode::EphemeralSequential => {
                format!("{path}{:010}", parent.stat.cversion)
            }
            CreateMode::Persistent | CreateMode::Ephemeral => path.to_string(),
        };
        if parent.children.contains(name(&path)) {
            return Err(ZkError::NodeExists);
        }
        parent.children.insert(name(&path).to_string());
        parent.stat.cversion += 1;
        parent.stat.pzxid = zxid;
        parent.stat.num_children += 1;
        let ephemeral = matches!(mode, CreateMode::Ephemeral | CreateMode::EphemeralSequential);
        let stat = Stat {
            czxid: zxid,
            mzxid: zxid,
            pzxid: zxid,
            ephemeral_owner: if ephemeral { owner } else { 0 },
            ..Stat::default()
        };
        self.nodes.insert(path.clone(), Znode { data: data.to_string(), stat, children: BTreeSet::new() });
        Ok(path)
    }

    /// Replace `path`'s data if `version` is -1 or its version; its version counts up and mzxid moves.
    pub fn set_data(&mut self, path: &str, data: &str, version: i32, zxid: u64) -> Result<Stat, ZkError> {
        let node = self.nodes.get_mut(path).ok_or(ZkError::NoNode)?;
        if version != -1 && version != node.stat.version {
            return Err(ZkError::BadVersion);
        }
        node.data = data.to_string();
        node.stat.version += 1;
        node.stat.mzxid = zxid;
        Ok(node.stat)
    }

    /// Delete `path` if `version` is -1 or its version, and it has no children.
    pub fn delete(&mut self, path: &str, version: i32, zxid: u64) -> Result<(), ZkError> {
        let node = self.nodes.get(path).ok_or(ZkError::NoNode)?;
        if version != -1 && version != node.stat.version {
            return Err(ZkError::BadVersion);
        }
        if !node.children.is_empty() {
            return Err(ZkError::NotEmpty);
        }
        self.nodes.remove(path);
        let parent = self.nodes.get_mut(parent(path)).expect("a node's parent exists");
        parent.children.remove(name(path));
        // Only pzxid moves: a delete leaves the parent's cversion alone (DataTree.deleteNode and
        // PrepRequestProcessor's delete), so sequence suffixes count creates only.
        parent.stat.pzxid = parent.stat.pzxid.max(zxid);
        parent.stat.num_children -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_names() {
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert_eq!(name("/a/lock-0000000003"), "lock-0000000003");
    }

    #[test]
    fn sequence_suffixes_come_from_the_parents_cversion() {
        let mut t = Tree::default();
        t.create("/l", "", CreateMode::Persistent, 0, 1).unwrap();
        assert_eq!(t.create("/l/n-", "", CreateMode::EphemeralSequential, 7, 2), Ok("/l/n-0000000000".into()));
        assert_eq!(t.create("/l/x", "", CreateMode::Persistent, 7, 3), Ok("/l/x".into()));
        t.delete("/l/x", -1, 4).unwrap();
        // Creates bump cversion, deletes do not: the next suffix is 2 (ZooKeeper 3.8's deleteNode).
        assert_eq!(t.stat("/l").unwrap().pzxid, 4, "a delete moves the parent's pzxid");
        assert_eq!(t.create("/l/n-", "", CreateMode::EphemeralSequential, 7, 5), Ok("/l/n-0000000002".into()));
        assert_eq!(t.stat("/l/n-0000000002").unwrap().ephemeral_owner, 7);
        assert_eq!(t.stat("/l/n-0000000002").unwrap().czxid, 5);
        // Told to a client: 3 creates and 1 delete.
        assert_eq!(copy_stat(t.stat("/l").unwrap()).cversion, 4);
    }

    #[test]
    fn create_and_delete_errors_match_zookeeper() {
        let mut t = Tree::default();
        assert_eq!(t.create("/a/b", "", CreateMode::Persistent, 0, 1), Err(ZkError::NoNode));
        t.create("/e", "", CreateMode::Ephemeral, 9, 2).unwrap();
        assert_eq!(t.create("/e", "", CreateMode::Ephemeral, 9, 3), Err(ZkError::NodeExists));
        assert_eq!(t.create("/e/c", "", CreateMode::Persistent, 9, 4), Err(ZkError::NoChildrenForEphemerals));
        t.create("/p", "", CreateMode::Persistent, 0, 5).unwrap();
        t.create("/p/c", "", CreateMode::Persistent, 0, 6).unwrap();
        assert_eq!(t.delete("/p", -1, 7), Err(ZkError::NotEmpty));
        assert_eq!(t.delete("/p/c", 3, 8), Err(ZkError::BadVersion));
        assert_eq!(t.delete("/p/c", 0, 9), Ok(()));
        assert_eq!(t.delete("/p/c", -1, 10), Err(ZkError::NoNode));
    }
}
