//! The multi-version key-value store (etcd `mvcc`): keys with create/mod revisions and versions, one
//! global revision, and the log of every change that watches replay from.

use super::{Event, EventType, KeyValue, LeaseId, Range, SortOrder, SortTarget};
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct Store {
    /// The revision of the last change (etcd starts at 1).
    revision: i64,
    keys: BTreeMap<String, KeyValue>,
    /// Every change, in revision order (compaction is not modelled).
    log: Vec<Event>,
}

impl Default for Store {
    fn default() -> Self {
        Store { revision: 1, keys: BTreeMap::new(), log: Vec::new() }
    }
}

/// Does `key` fall in the range of `from` (the key itself, or every key it prefixes)?
pub fn matches(from: &str, prefix: bool, key: &str) -> bool {
    if prefix {
        key.starts_with(from)
    } else {
        key == from
    }
}

impl Store {
    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn get(&self, key: &str) -> Option<&KeyValue> {
        self.keys.get(key)
    }

    /// The keys `r` selects, filtered, sorted and limited as it asks, and the count etcd answers with:
    /// every key in the range, before the `max_create_revision` filter and the limit — etcd's
    /// `v3_server` `Range` prunes the store's answer but keeps the store's `rr.Count` (found by
    /// `locksim conform etcd`, seed 8).
    pub fn range(&self, r: &Range) -> (Vec<KeyValue>, usize) {
        let in_range: Vec<&KeyValue> = self
            .keys
            .range(r.key.clone()..)
            .take_while(|(k, _)| matches(&r.key, r.prefix, k))
            .map(|(_, kv)| kv)
            .collect();
        let count = in_range.len();
        let mut kvs: Vec<KeyValue> = in_range
            .into_iter()
            .filter(|kv| r.max_create_revision == 0 || kv.create_revision <= r.max_create_revision)
            .cloned()
            .collect();
        if let Some((target, order)) = r.sort {
            // Stable: keys with equal targets stay in key order, as etcd sorts.
            kvs.sort_by_key(|kv| match target {
                SortTarget::Key => 0,
                SortTarget::Create => kv.create_revision,
                SortTarget::Mod => kv.mod_revision,
            });
            if order == SortOrder::Descend {
                kvs.reverse();
            }
        }
        if r.limit > 0 {
            kvs.truncate(r.limit);
        }
        (kvs, count)
    }

    /// Put `key` in the change at `revision` (the revision a write transaction will commit as).
    pub fn put(&mut self, key: &str, value: &str, lease: LeaseId, revision: i64) -> Option<KeyValue> {
        let previous = self.keys.get(key).cloned();
        let (create_revision, version) =
            previous.as_ref().map_or((revision, 1), |p| (p.create_revision, p.version + 1));
        let kv = KeyValue {
            key: key.to_string(),
            value: value.to_string(),
            create_revision,
            mod_revision: revision,
            version,
            lease,
        };
        self.keys.insert(key.to_string(), kv.clone());
        self.log.push(Event { kind: EventType::Put, kv });
        previous
    }

    /// Delete the keys `from` selects in the change at `revision`; returns them.
    pub fn delete(&mut self, from: &str, prefix: bool, revision: i64) -> Vec<KeyValue> {
        let doomed: Vec<String> = self
            .keys
            .range(from.to_string()..)
            .take_while(|(k, _)| matches(from, prefix, k))
            .map(|(k, _)| k.clone())
            .collect();
        let mut deleted = Vec::new();
        for key in doomed {
            let kv = self.keys.remove(&key).expect("listed");
            // A delete event carries the key and the revision that deleted it.
            let tombstone = KeyValue { key, mod_revision: revision, ..KeyValue::default() };
            self.log.push(Event { kind: EventType::Delete, kv: tombstone });
            deleted.push(kv);
        }
        deleted
    }

    /// Commit a write transaction: the revision moves on by one if it changed anything.
    pub fn commit(&mut self, changed: bool) {
        if changed {
            self.revision += 1;
        }
    }

    /// The events of revisions from `from` on (watches starting in the past replay them).
    pub fn events_since(&self, from: i64) -> &[Event] {
        let start = self.log.partition_point(|e| e.kv.mod_revision < from);
        &self.log[start..]
    }
}
