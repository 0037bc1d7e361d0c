//! The dataset and what acts on it: keys holding strings or hashes with millisecond expiry, their
//! replication backlog, and the pub/sub channels. [`Data::execute`] applies every command but the
//! scripting ones — for clients and for a script's `redis.call` alike.

use super::command::{parse, parse_int, Caller, NOT_AN_INTEGER};
use super::{PubSubMessage, RedisReply, RedisRequest, ReplOp, SetCondition, Shipped, Value};
use crate::backend::Out;
use crate::history::{fnv1a, EventKind, NodeIx};
use std::collections::{BTreeMap, BTreeSet};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    expires_at_ms: Option<i64>,
}

/// One server's dataset and its replication and pub/sub bookkeeping. `Default` holds nothing and
/// allocates nothing (a script borrows the whole of it for its run).
#[derive(Debug, Default)]
pub(super) struct Data {
    keys: BTreeMap<String, Entry>,
    /// Effects not yet shipped to the replicas; `None` when there is none.
    pub(super) backlog: Option<Vec<ReplOp>>,
    /// Effects propagated so far (the replication offset).
    pub(super) offset: u64,
    /// As a master: the replicas it feeds, each with what it last acknowledged.
    pub(super) replicas: BTreeMap<NodeIx, Ack>,
    /// Why write commands are refused now (`READONLY`, `NOREPLICAS`), set before each command.
    pub(super) refusal: Option<&'static str>,
    /// The replication offset after each client's last write (what its `WAIT` waits for).
    pub(super) written: BTreeMap<NodeIx, u64>,
    /// As a master: the batches written to the replica link and not yet acknowledged.
    pub(super) shipped: Vec<Shipped>,
    /// As a replica: the master's stream it follows (the master's life) and the offset applied in it.
    pub(super) following: Option<(u32, u64)>,
    /// A replica promoted to master: it follows no stream any more (`REPLICAOF NO ONE`).
    pub(super) promoted: bool,
    /// As a master: the replicas that asked for a full resynchronisation (all of them: this master
    /// restarted).
    pub(super) resync: BTreeSet<NodeIx>,
    /// The nodes subscribed to each channel (one pub/sub connection per client node).
    subscribers: BTreeMap<String, BTreeSet<NodeIx>>,
    /// Who last set each key (by its lease name, [`fnv1a`] of the key) by SET, HSET or HINCRBY (hazard
    /// marks only; not replicated).
    setters: BTreeMap<u64, NodeIx>,
    /// Setters of keys expired during the current command, for [`Out::lease_ended`].
    expired_setters: Vec<(NodeIx, u64)>,
}

type Reply = Result<RedisReply, String>;

/// A replica's last acknowledgement (`REPLCONF ACK`): its offset, and when it came (wall ms,
/// `repl_ack_time`; `None`: not since it was attached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Ack {
    pub(super) offset: u64,
    pub(super) at_ms: Option<i64>,
}

impl Data {
    /// Ship the effect `op` makes (made only when there is a replica to ship it to).
    fn propagate(&mut self, op: impl FnOnce() -> ReplOp) {
        if let Some(backlog) = &mut self.backlog {
            backlog.push(op());
            self.offset += 1;
        }
    }

    /// Feed `replicas` (a master's configured replicas, or none).
    pub(super) fn feed(&mut self, replicas: &[NodeIx]) {
        self.replicas = replicas.iter().map(|r| (*r, Ack::default())).collect();
        self.backlog = (!replicas.is_empty()).then(Vec::new);
    }

    /// Replicas that have acknowledged every write `client` made.
    pub(super) fn synced(&self, client: NodeIx) -> i64 {
        let written = self.written.get(&client).copied().unwrap_or(0);
        self.replicas.values().filter(|a| a.offset >= written).count() as i64
    }

    /// The whole dataset as a full resynchronisation sends it: empty the replica, then every key.
    pub(super) fn snapshot(&self) -> Vec<ReplOp> {
        let set = |(k, e): (&String, &Entry)| ReplOp::Set {
            key: k.clone(),
            value: e.value.clone(),
            expires_at_ms: e.expires_at_ms,
        };
        std::iter::once(ReplOp::Reset).chain(self.keys.iter().map(set)).collect()
    }

    /// As a replica: the offset of the master's stream applied so far (what `REPLCONF ACK` says).
    pub(super) fn applied(&self) -> u64 {
        self.following.map_or(0, |(_, offset)| offset)
    }

    /// Keys with an expiry here that `other` lacks or holds another value of.
    pub(super) fn expiring_keys_missing_from(&self, other: &Data) -> usize {
        let differs = |(k, e): &(&String, &Entry)| other.keys.get(*k).is_none_or(|o| o.value != e.value);
        self.keys.iter().filter(|(_, e)| e.expires_at_ms.is_some()).filter(|ke| differs(ke)).count()
    }

    /// Pub/sub ends with the server process: a restarted server has no subscribers.
    pub(super) fn forget_subscribers(&mut self) {
        self.subscribers.clear();
    }

    /// The live entry for `key`, expiring it first if its time has come.
    fn live(&mut self, key: &str, now_ms: i64) -> Option<&mut Entry> {
        let expired = self.keys.get(key)?.expires_at_ms.is_some_and(|at| at <= now_ms);
        if expired {
            self.keys.remove(key);
            let lease = fnv1a(key.as_bytes());
            self.expired_setters.extend(self.setters.remove(&lease).map(|setter| (setter, lease)));
            self.propagate(|| ReplOp::Del { key: key.to_string() });
            return None;
        }
        self.keys.get_mut(key)
    }

    fn write(&mut self, key: &str, value: Value, expires_at_ms: Option<i64>) {
        let key = key.to_string();
        self.propagate(|| ReplOp::Set { key: key.clone(), value: value.clone(), expires_at_ms });
        self.keys.insert(key, Entry { value, expires_at_ms });
    }

    /// Ship `key`'s entry as it is now (after a change in place).
    fn propagate_key(&mut self, key: &str) {
        if self.backlog.is_none() {
            return;
        }
        let op = match self.keys.get(key) {
            Some(e) => ReplOp::Set { key: key.into(), value: e.value.clone(), expires_at_ms: e.expires_at_ms },
            None => ReplOp::Del { key: key.into() },
        };
        self.propagate(|| op);
    }

    fn delete(&mut self, key: &str, now_ms: i64) -> i64 {
        if self.live(key, now_ms).is_none() {
            return 0;
        }
        self.keys.remove(key);
        self.propagate(|| ReplOp::Del { key: key.to_string() });
        1
    }

    fn pexpire(&mut self, key: &str, ms: i64, now_ms: i64) -> i64 {
        let Some(entry) = self.live(key, now_ms) else {
            return 0;
        };
        if ms <= 0 {
            return self.delete(key, now_ms);
        }
        entry.expires_at_ms = Some(now_ms.saturating_add(ms));
        self.propagate_key(key);
        1
    }

    /// The string at `key` (`None`: no key); a hash there is a `WRONGTYPE` error.
    fn string(&mut self, key: &str, now_ms: i64) -> Result<Option<String>, String> {
        match self.live(key, now_ms) {
            None => Ok(None),
            Some(Entry { value: Value::Str(s), .. }) => Ok(Some(s.clone())),
            Some(_) => Err(WRONGTYPE.into()),
        }
    }

    /// The hash at `key` (`None`: no key); a string there is a `WRONGTYPE` error.
    fn hash(&mut self, key: &str, now_ms: i64) -> Result<Option<&mut BTreeMap<String, String>>, String> {
        match self.live(key, now_ms) {
            None => Ok(None),
            Some(Entry { value: Value::Hash(h), .. }) => Ok(Some(h)),
            Some(_) => Err(WRONGTYPE.into()),
        }
    }

    /// The hash at `key`, made empty if there is none (HSET, HINCRBY).
    fn hash_or_new(&mut self, key: &str, now_ms: i64) -> Result<&mut BTreeMap<String, String>, String> {
        if self.hash(key, now_ms)?.is_none() {
            self.keys.insert(key.into(), Entry { value: Value::Hash(BTreeMap::new()), expires_at_ms: None });
        }
        Ok(self.hash(key, now_ms)?.expect("just made"))
    }

    /// Apply one command. Scripting commands are the server's (they hold the Lua VM), not the data's.
    pub(super) fn execute(&mut self, now_ms: i64, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        let taken = match &request {
            RedisRequest::Set { key, .. } | RedisRequest::HSet { key, .. } | RedisRequest::HIncrBy { key, .. } => {
                Some(fnv1a(key.as_bytes()))
            }
            _ => None,
        };
        let reply = self.run(now_ms, from, request, out).unwrap_or_else(RedisReply::Error);
        // Hazard: lease-expired-while-held, when an expired key's setter still believes it holds the lock.
        for (setter, lease) in self.expired_setters.drain(..) {
            out.lease_ended(setter, lease);
        }
        if let Some(lease) = taken.filter(|_| !matches!(reply, RedisReply::Nil | RedisReply::Error(_))) {
            out.lease_started(from, lease);
            self.setters.insert(lease, from);
        }
        reply
    }

    /// A script's `redis.call`: the command line parsed as scripts see it, then applied.
    pub(super) fn script_call(&mut self, now_ms: i64, from: NodeIx, args: &[String], out: &mut Out) -> RedisReply {
        match parse(args, Caller::Script) {
            Ok(request) => self.execute(now_ms, from, request, out),
            Err(e) => RedisReply::Error(e),
        }
    }

    fn run(&mut self, now_ms: i64, from: NodeIx, request: RedisRequest, out: &mut Out) -> Reply {
        use RedisReply::*;
        if let Some(refusal) = self.refusal.filter(|_| request.is_write()) {
            return Err(refusal.into());
        }
        Reply::Ok(match request {
            RedisRequest::Set { key, value, condition, px_ms } => self.set(key, value, condition, px_ms, now_ms)?,
            RedisRequest::Get { key } => self.string(&key, now_ms)?.map_or(Nil, Bulk),
            RedisRequest::Del { keys } => Int(keys.iter().map(|k| self.delete(k, now_ms)).sum()),
            RedisRequest::Exists { keys } => Int(keys.iter().filter(|k| self.live(k, now_ms).is_some()).count() as i64),
            RedisRequest::GetSet { key, value } => {
                let old = self.string(&key, now_ms)?;
                self.write(&key, Value::Str(value), None);
                old.map_or(Nil, Bulk)
            }
            RedisRequest::PExpire { key, ms } => Int(self.pexpire(&key, ms, now_ms)),
            RedisRequest::PTtl { key } => match self.live(&key, now_ms) {
                None => Int(-2),
                Some(Entry { expires_at_ms: None, .. }) => Int(-1),
                Some(Entry { expires_at_ms: Some(at), .. }) => Int(*at - now_ms),
            },
            RedisRequest::Incr { key } => self.incr(&key, now_ms)?,
            RedisRequest::HSet { key, pairs } => {
                let hash = self.hash_or_new(&key, now_ms)?;
                let added = pairs.into_iter().filter(|(f, v)| hash.insert(f.clone(), v.clone()).is_none()).count();
                self.propagate_key(&key);
                Int(added as i64)
            }
            RedisRequest::HGet { key, field } => {
                self.hash(&key, now_ms)?.and_then(|h| h.get(&field).cloned()).map_or(Nil, Bulk)
            }
            RedisRequest::HIncrBy { key, field, by } => self.hincrby(&key, field, by, now_ms)?,
            RedisRequest::HExists { key, field } => {
                Int(i64::from(self.hash(&key, now_ms)?.is_some_and(|h| h.contains_key(&field))))
            }
            RedisRequest::HDel { key, fields } => self.hdel(&key, &fields, now_ms)?,
            RedisRequest::Publish { channel, message } => Int(self.publish(channel, message, out)),
            RedisRequest::Subscribe { channel } => {
                self.subscribers.entry(channel.clone()).or_default().insert(from);
                self.pubsub_reply("subscribe", channel, from)
            }
            RedisRequest::Unsubscribe { channel } => {
                if let Some(nodes) = self.subscribers.get_mut(&channel) {
                    nodes.remove(&from);
                    if nodes.is_empty() {
                        self.subscribers.remove(&channel);
                    }
                }
                self.pubsub_reply("unsubscribe", channel, from)
            }
            RedisRequest::Ping => Status("PONG".into()),
            RedisRequest::Command { args } => match parse(&args, Caller::Client)? {
                RedisRequest::Command { .. } => unreachable!("a command line never parses to a command line"),
                request => self.run(now_ms, from, request, out)?,
            },
            RedisRequest::Replicate { ops, offset, stream } => {
                if self.follow(stream, offset, ops) {
                    out.push(from, RedisRequest::ReplAck { offset });
                }
                Ok
            }
            RedisRequest::ReplAck { offset } => {
                if let Some(ack) = self.replicas.get_mut(&from) {
                    *ack = Ack { offset: ack.offset.max(offset), at_ms: Some(now_ms) };
                }
                let everywhere = self.replicas.values().map(|a| a.offset).min().unwrap_or(offset);
                self.shipped.retain(|b| b.offset > everywhere);
                Ok
            }
            RedisRequest::ReplSync => {
                if self.replicas.contains_key(&from) {
                    self.resync.insert(from);
                }
                Ok
            }
            RedisRequest::ReplClose => {
                self.replicas.remove(&from);
                self.resync.remove(&from);
                Ok
            }
            RedisRequest::Wait { .. } => Int(self.synced(from)),
            RedisRequest::InfoReplicas => Int(self.replicas.len() as i64),
            RedisRequest::Eval { .. }
            | RedisRequest::EvalSha { .. }
            | RedisRequest::ScriptLoad { .. }
            | RedisRequest::ReplicaOf { .. }
            | RedisRequest::Sentinel(_) => {
                unreachable!("the server runs scripts, and changes its role")
            }
        })
    }

    fn set(&mut self, key: String, value: String, condition: SetCondition, px_ms: Option<i64>, now_ms: i64) -> Reply {
        if px_ms.is_some_and(|ms| ms <= 0) {
            return Err("ERR invalid expire time in 'set' command".into());
        }
        let exists = self.live(&key, now_ms).is_some();
        Ok(match (condition, exists) {
            (SetCondition::Nx, true) | (SetCondition::Xx, false) => RedisReply::Nil,
            _ => {
                self.write(&key, Value::Str(value), px_ms.map(|ms| now_ms.saturating_add(ms)));
                RedisReply::Ok
            }
        })
    }

    /// `INCR` treats a missing key as 0 and keeps the TTL.
    fn incr(&mut self, key: &str, now_ms: i64) -> Reply {
        let current = match self.string(key, now_ms)? {
            None => 0,
            Some(s) => parse_int(&s).ok_or(NOT_AN_INTEGER)?,
        };
        let n = current.checked_add(1).ok_or("ERR increment or decrement would overflow")?;
        let expires_at_ms = self.live(key, now_ms).and_then(|e| e.expires_at_ms);
        self.write(key, Value::Str(n.to_string()), expires_at_ms);
        Ok(RedisReply::Int(n))
    }

    fn hincrby(&mut self, key: &str, field: String, by: i64, now_ms: i64) -> Reply {
        let hash = self.hash_or_new(key, now_ms)?;
        let current = match hash.get(&field) {
            None => 0,
            Some(s) => parse_int(s).ok_or("ERR hash value is not an integer")?,
        };
        let n = current.checked_add(by).ok_or("ERR increment or decrement would overflow")?;
        hash.insert(field, n.to_string());
        self.propagate_key(key);
        Ok(RedisReply::Int(n))
    }

    /// `HDEL`: a hash left empty is deleted, as Redis deletes empty aggregates.
    fn hdel(&mut self, key: &str, fields: &[String], now_ms: i64) -> Reply {
        let Some(hash) = self.hash(key, now_ms)? else { return Ok(RedisReply::Int(0)) };
        let removed = fields.iter().filter(|f| hash.remove(*f).is_some()).count();
        if hash.is_empty() {
            self.keys.remove(key);
        }
        if removed > 0 {
            self.propagate_key(key);
        }
        Ok(RedisReply::Int(removed as i64))
    }

    /// Push `message` to every subscriber of `channel`; how many there were.
    fn publish(&mut self, channel: String, message: String, out: &mut Out) -> i64 {
        let Some(nodes) = self.subscribers.get(&channel) else { return 0 };
        for node in nodes {
            out.record(*node, EventKind::Notify { cause: format!("message {channel}") });
            out.push(*node, PubSubMessage { channel: channel.clone(), message: message.clone() });
        }
        nodes.len() as i64
    }

    /// `["subscribe", channel, channels this connection is subscribed to]`.
    fn pubsub_reply(&self, kind: &str, channel: String, from: NodeIx) -> RedisReply {
        let count = self.subscribers.values().filter(|nodes| nodes.contains(&from)).count();
        RedisReply::Array(vec![RedisReply::Bulk(kind.into()), RedisReply::Bulk(channel), RedisReply::Int(count as i64)])
    }

    /// As a replica: apply the batch of the master's stream `stream` (its life) up to `offset`, unless
    /// it has it already (delivered when it was promoted) or was promoted; whether it is this
    /// replica's to acknowledge.
    pub(super) fn follow(&mut self, stream: u32, offset: u64, ops: Vec<ReplOp>) -> bool {
        if self.promoted {
            return false;
        }
        if !self.following.is_some_and(|(s, applied)| s == stream && offset <= applied) {
            self.replicate(ops);
            self.following = Some((stream, offset));
        }
        true
    }

    fn replicate(&mut self, ops: Vec<ReplOp>) {
        for op in ops {
            match op {
                ReplOp::Set { key, value, expires_at_ms } => self.write(&key, value, expires_at_ms),
                ReplOp::Del { key } => {
                    self.keys.remove(&key);
                }
                ReplOp::Reset => self.keys.clear(),
            }
        }
    }
}
