//! A simulated Redis 7 server: strings with millisecond expiry, named atomic scripts, and asynchronous
//! replication to one replica with Sentinel-style failover.
//!
//! Modelled behaviour, from the Redis 7 command reference:
//! - `SET k v [NX|XX] [PX ms]` replies `OK`, or nil when the NX/XX condition fails; a successful SET
//!   discards any previous TTL. `GET` replies the value or nil. `DEL` replies the number of keys removed.
//!   `GETSET` replies the old value (or nil), sets the new one and discards the TTL. `PEXPIRE` replies 1,
//!   or 0 when the key does not exist; a non-positive TTL deletes the key. `PTTL` replies -2 for a missing
//!   key, -1 for a key without expiry, else the remaining milliseconds. `INCR` treats a missing key as 0,
//!   keeps the TTL, and errors on a non-integer value.
//! - Expiry is by the server's wall clock: a key stores its absolute expiry time in Unix milliseconds
//!   ("Expires and clock" in the EXPIRE docs), so a forward clock jump on the server expires keys early.
//!   Expired keys are removed lazily on access; the removal is replicated as a `DEL`, as Redis does.
//! - `EVAL` runs atomically (Redis is single-threaded). The two scripts every lock library ships are named
//!   here rather than interpreted: compare-and-delete (`if GET == ARGV[1] then DEL`) and
//!   compare-and-pexpire (`if GET == ARGV[1] then PEXPIRE`).
//! - Replication is asynchronous: the master acknowledges a write before the replica has it, and ships its
//!   effects (SET with an absolute expiry, DEL) after a lag. A failover promotes the replica with whatever
//!   it has: writes not yet shipped are lost, as the Redis replication docs warn.
//! - `WAIT numreplicas timeout` blocks until the replica has acknowledged every write this client made so
//!   far, or the timeout (ms; 0 = forever) passes, and replies how many replicas acknowledged (0 or 1).
//!   The replica acknowledges each batch it applies by its replication offset (`REPLCONF ACK`).
//! - Persistence: with `persist = false` (no AOF) a crashed server restarts empty.

use super::{Backend, Now, Out};
use crate::history::NodeIx;
use crate::net::Rpc;
use crate::world::NodeEnv;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The NX/XX option of SET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCondition {
    Always,
    /// Only if the key does not exist.
    Nx,
    /// Only if the key exists.
    Xx,
}

/// The atomic Lua scripts lock libraries send with EVAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// `if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end`
    CompareAndDelete,
    /// `if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end`
    CompareAndPexpire { ms: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisRequest {
    Set {
        key: String,
        value: String,
        condition: SetCondition,
        px_ms: Option<i64>,
    },
    Get {
        key: String,
    },
    Del {
        key: String,
    },
    GetSet {
        key: String,
        value: String,
    },
    PExpire {
        key: String,
        ms: i64,
    },
    PTtl {
        key: String,
    },
    Incr {
        key: String,
    },
    Eval {
        script: Script,
        key: String,
        arg: String,
    },
    /// `INFO replication`, reduced to `connected_slaves`.
    InfoReplicas,
    /// `WAIT numreplicas timeout_ms`.
    Wait {
        numreplicas: i64,
        timeout_ms: i64,
    },
    /// Replication stream from the master, up to the master's replication offset `offset` (never sent
    /// by clients).
    Replicate {
        ops: Vec<ReplOp>,
        offset: u64,
    },
    /// The replica's acknowledgement: it has applied everything up to `offset` (`REPLCONF ACK`).
    ReplAck {
        offset: u64,
    },
}

/// RESP replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisReply {
    Ok,
    Nil,
    Int(i64),
    Bulk(String),
    Error(String),
}

/// The effect of a write, as shipped to the replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplOp {
    Set { key: String, value: String, expires_at_ms: Option<i64> },
    Del { key: String },
}

#[derive(Debug, Clone)]
struct Entry {
    value: String,
    expires_at_ms: Option<i64>,
}

/// One Redis server's dataset.
#[derive(Debug, Default)]
pub struct RedisState {
    keys: BTreeMap<String, Entry>,
    /// Effects not yet shipped to the replica; `None` when there is no replica.
    backlog: Option<Vec<ReplOp>>,
    shipper: Arc<Notify>,
    /// Effects propagated so far (the replication offset), and how far the replica has acknowledged.
    offset: u64,
    replica_acked: u64,
    /// The replication offset after each client's last write (what its `WAIT` waits for).
    written: BTreeMap<NodeIx, u64>,
}

impl RedisState {
    /// A server whose writes are shipped to a replica.
    pub fn with_replica() -> RedisState {
        RedisState { backlog: Some(Vec::new()), ..RedisState::default() }
    }

    fn propagate(&mut self, op: ReplOp) {
        if let Some(backlog) = &mut self.backlog {
            backlog.push(op);
            self.offset += 1;
            self.shipper.notify_one();
        }
    }

    /// Replicas that have acknowledged every write `client` made (0 or 1).
    fn synced(&self, client: NodeIx) -> i64 {
        let has_replica = self.backlog.is_some();
        i64::from(has_replica && self.replica_acked >= self.written.get(&client).copied().unwrap_or(0))
    }

    /// The live entry for `key`, expiring it first if its time has come.
    fn live(&mut self, key: &str, now_ms: i64) -> Option<&mut Entry> {
        let expired = self.keys.get(key)?.expires_at_ms.is_some_and(|at| at <= now_ms);
        if expired {
            self.keys.remove(key);
            self.propagate(ReplOp::Del { key: key.to_string() });
            return None;
        }
        self.keys.get_mut(key)
    }

    fn write(&mut self, key: &str, value: String, expires_at_ms: Option<i64>) {
        self.keys.insert(key.to_string(), Entry { value: value.clone(), expires_at_ms });
        self.propagate(ReplOp::Set { key: key.to_string(), value, expires_at_ms });
    }

    fn delete(&mut self, key: &str, now_ms: i64) -> i64 {
        if self.live(key, now_ms).is_none() {
            return 0;
        }
        self.keys.remove(key);
        self.propagate(ReplOp::Del { key: key.to_string() });
        1
    }

    fn pexpire(&mut self, key: &str, ms: i64, now_ms: i64) -> i64 {
        let Some(entry) = self.live(key, now_ms) else {
            return 0;
        };
        if ms <= 0 {
            return self.delete(key, now_ms);
        }
        entry.expires_at_ms = Some(now_ms + ms);
        let value = entry.value.clone();
        self.propagate(ReplOp::Set { key: key.to_string(), value, expires_at_ms: Some(now_ms + ms) });
        1
    }

    fn get(&mut self, key: &str, now_ms: i64) -> Option<String> {
        self.live(key, now_ms).map(|e| e.value.clone())
    }

    fn eval(&mut self, script: Script, key: &str, arg: &str, now_ms: i64) -> RedisReply {
        if self.get(key, now_ms).as_deref() != Some(arg) {
            return RedisReply::Int(0);
        }
        RedisReply::Int(match script {
            Script::CompareAndDelete => self.delete(key, now_ms),
            Script::CompareAndPexpire { ms } => self.pexpire(key, ms, now_ms),
        })
    }

    fn replicate(&mut self, ops: Vec<ReplOp>) {
        for op in ops {
            match op {
                ReplOp::Set { key, value, expires_at_ms } => self.write(&key, value, expires_at_ms),
                ReplOp::Del { key } => {
                    self.keys.remove(&key);
                }
            }
        }
    }
}

impl Backend for RedisState {
    type Request = RedisRequest;
    type Reply = RedisReply;

    /// Key expiry follows the wall clock: Redis 7 stores absolute Unix-time deadlines (`mstime()`),
    /// so a jump of the server's clock expires keys early or late.
    fn apply(&mut self, now: Now, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        let offset = self.offset;
        let reply = self.command(now.wall_ms, from, request, out);
        if self.offset > offset {
            self.written.insert(from, self.offset);
        }
        reply
    }

    fn parks(&self, request: &RedisRequest) -> Option<Duration> {
        match request {
            // 0: wait for ever (a day is for ever in a run).
            RedisRequest::Wait { timeout_ms: 0, .. } => Some(Duration::from_secs(86_400)),
            RedisRequest::Wait { timeout_ms, .. } => Some(Duration::from_millis(*timeout_ms as u64)),
            _ => None,
        }
    }

    fn answer_parked(&mut self, from: NodeIx, request: &RedisRequest, timed_out: bool) -> Option<RedisReply> {
        let RedisRequest::Wait { numreplicas, .. } = request else { return None };
        let synced = self.synced(from);
        (synced >= *numreplicas || timed_out).then_some(RedisReply::Int(synced))
    }
}

impl RedisState {
    fn command(&mut self, now_ms: i64, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        use RedisReply::*;
        match request {
            RedisRequest::Set { key, value, condition, px_ms } => {
                let exists = self.live(&key, now_ms).is_some();
                match (condition, exists) {
                    (SetCondition::Nx, true) | (SetCondition::Xx, false) => Nil,
                    _ => {
                        self.write(&key, value, px_ms.map(|ms| now_ms + ms));
                        Ok
                    }
                }
            }
            RedisRequest::Get { key } => self.get(&key, now_ms).map_or(Nil, Bulk),
            RedisRequest::Del { key } => Int(self.delete(&key, now_ms)),
            RedisRequest::GetSet { key, value } => {
                let old = self.get(&key, now_ms);
                self.write(&key, value, None);
                old.map_or(Nil, Bulk)
            }
            RedisRequest::PExpire { key, ms } => Int(self.pexpire(&key, ms, now_ms)),
            RedisRequest::PTtl { key } => match self.live(&key, now_ms) {
                None => Int(-2),
                Some(Entry { expires_at_ms: None, .. }) => Int(-1),
                Some(Entry { expires_at_ms: Some(at), .. }) => Int(*at - now_ms),
            },
            RedisRequest::Incr { key } => {
                let entry = self.live(&key, now_ms).cloned();
                let current = entry.as_ref().map_or(Some(0), |e| e.value.parse::<i64>().ok());
                match current.and_then(|n| n.checked_add(1)) {
                    None => Error("ERR value is not an integer or out of range".into()),
                    Some(n) => {
                        self.write(&key, n.to_string(), entry.and_then(|e| e.expires_at_ms));
                        Int(n)
                    }
                }
            }
            RedisRequest::Eval { script, key, arg } => self.eval(script, &key, &arg, now_ms),
            RedisRequest::Replicate { ops, offset } => {
                self.replicate(ops);
                out.push(from, RedisRequest::ReplAck { offset });
                Ok
            }
            RedisRequest::ReplAck { offset } => {
                self.replica_acked = self.replica_acked.max(offset);
                Ok
            }
            RedisRequest::Wait { .. } => Int(self.synced(from)),
            RedisRequest::InfoReplicas => Int(i64::from(self.backlog.is_some())),
        }
    }
}

/// Which node is the master of each Redis shard now; failover rewrites it. Clients look it up per call,
/// as a Sentinel-aware client does after a `+switch-master` event.
#[derive(Clone, Debug)]
pub struct Shards(Arc<Mutex<Vec<NodeIx>>>);

impl Shards {
    pub fn new(masters: Vec<NodeIx>) -> Shards {
        Shards(Arc::new(Mutex::new(masters)))
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("shards lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn master(&self, shard: usize) -> NodeIx {
        self.0.lock().expect("shards lock")[shard]
    }

    /// Make `replica` the master of the shard `old` served; returns the shard, if `old` was a master.
    pub fn promote(&self, old: NodeIx, replica: NodeIx) -> Option<usize> {
        let mut masters = self.0.lock().expect("shards lock");
        let shard = masters.iter().position(|m| *m == old)?;
        masters[shard] = replica;
        Some(shard)
    }
}

/// How a Redis server node runs.
#[derive(Clone, Debug)]
pub struct RedisNode {
    pub state: Arc<Mutex<RedisState>>,
    /// Restart with the dataset (AOF with fsync always) or empty.
    pub persist: bool,
    /// The replica this master ships its writes to, and after how long.
    pub replica: Option<(NodeIx, Duration)>,
}

impl RedisNode {
    /// The node's program: serve requests, and ship writes to the replica if there is one.
    pub async fn run(self, env: NodeEnv) {
        if !self.persist {
            let fresh = if self.replica.is_some() { RedisState::with_replica() } else { RedisState::default() };
            *self.state.lock().expect("redis lock") = fresh;
        }
        let rpc = std::rc::Rc::new(Rpc::bind(&env));
        if let Some((replica, lag)) = self.replica {
            let (state, rpc) = (self.state.clone(), rpc.clone());
            madsim::task::spawn_local(async move { ship(state, &rpc, replica, lag).await });
        }
        super::serve(self.state, &rpc, &env.clock, &env.recorder).await
    }
}

async fn ship(state: Arc<Mutex<RedisState>>, rpc: &Rpc, replica: NodeIx, lag: Duration) {
    let shipper = state.lock().expect("redis lock").shipper.clone();
    loop {
        shipper.notified().await;
        madsim::time::sleep(lag).await;
        let mut s = state.lock().expect("redis lock");
        let (ops, offset) = (std::mem::take(s.backlog.get_or_insert_with(Vec::new)), s.offset);
        drop(s);
        if !ops.is_empty() {
            rpc.tell(replica, RedisRequest::Replicate { ops, offset });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RedisReply::*;
    use super::*;

    fn set(key: &str, value: &str, condition: SetCondition, px_ms: Option<i64>) -> RedisRequest {
        RedisRequest::Set { key: key.into(), value: value.into(), condition, px_ms }
    }

    fn key(k: &str) -> String {
        k.to_string()
    }

    /// Apply `(now_ms, request, expected reply)` rows in order to one server.
    fn table(state: &mut RedisState, rows: Vec<(i64, RedisRequest, RedisReply)>) {
        for (i, (now, req, want)) in rows.into_iter().enumerate() {
            let got = state.apply(Now::at(now), NodeIx(0), req.clone(), &mut Out::default());
            assert_eq!(got, want, "row {i}: {req:?} at {now} ms");
        }
    }

    #[test]
    fn set_nx_px_takes_a_free_key_and_expires_by_the_server_clock() {
        use SetCondition::*;
        table(
            &mut RedisState::default(),
            vec![
                (0, set("lock", "a", Nx, Some(5000)), Ok),
                (1, set("lock", "b", Nx, Some(5000)), Nil),
                (4999, RedisRequest::PTtl { key: key("lock") }, Int(1)),
                (4999, RedisRequest::Get { key: key("lock") }, Bulk("a".into())),
                (5000, RedisRequest::Get { key: key("lock") }, Nil),
                (5000, RedisRequest::PTtl { key: key("lock") }, Int(-2)),
                (5001, set("lock", "b", Nx, Some(5000)), Ok),
                (5002, set("lock", "c", Xx, None), Ok),
                (5003, RedisRequest::PTtl { key: key("lock") }, Int(-1)),
                (5004, set("other", "x", Xx, None), Nil),
            ],
        );
    }

    #[test]
    fn del_and_compare_and_delete() {
        use SetCondition::*;
        let cad =
            |arg: &str| RedisRequest::Eval { script: Script::CompareAndDelete, key: key("lock"), arg: arg.into() };
        table(
            &mut RedisState::default(),
            vec![
                (0, set("lock", "mine", Nx, Some(100)), Ok),
                (1, cad("yours"), Int(0)),
                (2, cad("mine"), Int(1)),
                (3, RedisRequest::Del { key: key("lock") }, Int(0)),
                (4, set("lock", "theirs", Nx, Some(100)), Ok),
                // A plain DEL removes whoever's key is there: the bug of `release = "del"`.
                (5, RedisRequest::Del { key: key("lock") }, Int(1)),
            ],
        );
    }

    #[test]
    fn getset_pexpire_and_incr() {
        use SetCondition::*;
        let cap = |arg: &str, ms| RedisRequest::Eval {
            script: Script::CompareAndPexpire { ms },
            key: key("l"),
            arg: arg.into(),
        };
        table(
            &mut RedisState::default(),
            vec![
                (0, RedisRequest::GetSet { key: key("l"), value: "1".into() }, Nil),
                (0, RedisRequest::GetSet { key: key("l"), value: "2".into() }, Bulk("1".into())),
                (0, RedisRequest::PExpire { key: key("missing"), ms: 10 }, Int(0)),
                (0, RedisRequest::PExpire { key: key("l"), ms: 10 }, Int(1)),
                (0, cap("1", 1000), Int(0)),
                (0, cap("2", 1000), Int(1)),
                (999, RedisRequest::Incr { key: key("l") }, Int(3)),
                (999, RedisRequest::PTtl { key: key("l") }, Int(1)),
                (0, RedisRequest::Incr { key: key("fence") }, Int(1)),
                (0, RedisRequest::Incr { key: key("fence") }, Int(2)),
                (0, set("s", "x", Always, None), Ok),
                (0, RedisRequest::Incr { key: key("s") }, Error("ERR value is not an integer or out of range".into())),
                (0, RedisRequest::PExpire { key: key("s"), ms: 0 }, Int(1)),
                (0, RedisRequest::Get { key: key("s") }, Nil),
            ],
        );
    }

    #[test]
    fn a_forward_jump_of_the_server_clock_expires_keys_early() {
        let mut s = RedisState::default();
        table(&mut s, vec![(1_000, set("lock", "a", SetCondition::Nx, Some(30_000)), Ok)]);
        // The server's clock jumps 40 s ahead: the 30 s lock is gone after 0 s of real time.
        table(&mut s, vec![(41_000, set("lock", "b", SetCondition::Nx, Some(30_000)), Ok)]);
    }

    #[test]
    fn writes_are_shipped_as_effects_and_a_replica_applies_them() {
        let mut master = RedisState::with_replica();
        table(
            &mut master,
            vec![
                (0, set("lock", "a", SetCondition::Nx, Some(100)), Ok),
                (50, RedisRequest::Incr { key: key("fence") }, Int(1)),
                (200, RedisRequest::Get { key: key("lock") }, Nil),
            ],
        );
        let ops = master.backlog.take().unwrap();
        assert_eq!(
            ops,
            vec![
                ReplOp::Set { key: key("lock"), value: "a".into(), expires_at_ms: Some(100) },
                ReplOp::Set { key: key("fence"), value: "1".into(), expires_at_ms: None },
                ReplOp::Del { key: key("lock") },
            ]
        );
        let mut replica = RedisState::default();
        table(&mut replica, vec![(60, RedisRequest::Replicate { ops: ops[..2].to_vec(), offset: 2 }, Ok)]);
        table(&mut replica, vec![(60, RedisRequest::Get { key: key("lock") }, Bulk("a".into()))]);
    }

    #[test]
    fn promotion_redirects_the_shard() {
        let shards = Shards::new(vec![NodeIx(1), NodeIx(3)]);
        assert_eq!(shards.promote(NodeIx(3), NodeIx(4)), Some(1));
        assert_eq!(shards.master(1), NodeIx(4));
        assert_eq!(shards.promote(NodeIx(9), NodeIx(4)), None);
    }

    #[test]
    fn wait_answers_once_the_replica_acknowledged_the_clients_writes_or_at_its_timeout() {
        let mut master = RedisState::with_replica();
        let (c1, c2, replica) = (NodeIx(1), NodeIx(2), NodeIx(9));
        let mut out = Out::default();
        let wait = RedisRequest::Wait { numreplicas: 1, timeout_ms: 1000 };
        assert_eq!(master.parks(&wait), Some(Duration::from_millis(1000)));
        master.apply(Now::at(0), c1, set("lock", "a", SetCondition::Nx, Some(10_000)), &mut out);
        assert_eq!(master.answer_parked(c1, &wait, false), None, "the replica has not acknowledged it yet");
        assert_eq!(master.answer_parked(c2, &wait, false), Some(Int(1)), "c2 wrote nothing: nothing to wait for");
        master.apply(Now::at(50), replica, RedisRequest::ReplAck { offset: 1 }, &mut out);
        assert_eq!(master.answer_parked(c1, &wait, false), Some(Int(1)));
        master.apply(Now::at(60), c1, RedisRequest::Incr { key: key("n") }, &mut out);
        assert_eq!(master.answer_parked(c1, &wait, true), Some(Int(0)), "timed out: no replica has the INCR");
        let mut alone = RedisState::default();
        alone.apply(Now::at(0), c1, set("lock", "a", SetCondition::Nx, None), &mut out);
        assert_eq!(alone.answer_parked(c1, &wait, true), Some(Int(0)), "no replica: 0 at the timeout");
    }

    #[test]
    fn a_replica_acknowledges_each_batch_by_its_offset() {
        let mut replica = RedisState::default();
        let mut out = Out::default();
        let ops = vec![ReplOp::Set { key: key("lock"), value: "a".into(), expires_at_ms: None }];
        replica.apply(Now::at(0), NodeIx(0), RedisRequest::Replicate { ops, offset: 7 }, &mut out);
        let ack = out.pushes.pop().expect("an ack").1.downcast::<RedisRequest>().unwrap();
        assert_eq!(*ack, RedisRequest::ReplAck { offset: 7 });
    }
}
