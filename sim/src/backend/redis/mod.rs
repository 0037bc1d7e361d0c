//! A simulated Redis 7 server: strings and hashes with millisecond expiry, Lua scripts, pub/sub, and
//! asynchronous replication to one replica with Sentinel-style failover.
//!
//! Modelled behaviour, from the Redis 7.0 command reference and source (`src/t_string.c`, `t_hash.c`,
//! `expire.c`, `pubsub.c`, `eval.c`, `script_lua.c`, `replication.c`):
//! - A key holds a string or a hash. `SET k v [NX|XX] [PX ms|EX s]` replies `OK`, or nil when the NX/XX
//!   condition fails, and discards any previous TTL. `GET` replies the value or nil. `DEL` and `EXISTS`
//!   count keys. `GETSET` replies the old value (or nil), sets the new one and discards the TTL.
//!   `PEXPIRE` replies 1, or 0 when the key does not exist; a non-positive TTL deletes the key. `PTTL`
//!   replies -2 for a missing key, -1 for a key without expiry, else the remaining milliseconds. `INCR`
//!   treats a missing key as 0, keeps the TTL, and errors on a non-integer value. `HSET` replies the
//!   fields it added, `HGET` the value or nil, `HINCRBY` the new value (a missing key or field counts as
//!   0), `HEXISTS` 1 or 0, `HDEL` the fields removed (a hash left empty is deleted). A string command on
//!   a hash, or a hash command on a string, is a `WRONGTYPE` error.
//! - Commands arrive typed or as a command line (`COMMAND`, and a script's `redis.call`), parsed with
//!   Redis's arity checks and error messages (`command.rs`); both run the same code (`data.rs`).
//! - Expiry is by the server's wall clock: a key stores its absolute expiry time in Unix milliseconds
//!   ("Expires and clock" in the EXPIRE docs), so a forward clock jump on the server expires keys early.
//!   Expired keys are removed lazily on access; the removal is replicated as a `DEL`, as Redis does.
//! - `EVAL`, `EVALSHA` and `SCRIPT LOAD` run Lua 5.1 scripts atomically (`lua.rs`): a script runs
//!   inside one request. `EVALSHA` of a script this server life has not seen is `NOSCRIPT`.
//! - `PUBLISH` pushes the message to every node subscribed to the channel, as a stream message (a
//!   partition delays it; a subscriber that crashes loses it), and replies how many there were.
//!   `SUBSCRIBE`/`UNSUBSCRIBE` reply `[kind, channel, count]`. The model keeps one pub/sub connection
//!   per client node.
//! - Replication is asynchronous: the master acknowledges a write before the replica has it. It writes
//!   the write's effects (the key's new value with an absolute expiry, or its deletion — a script's
//!   effects too, never the script) to the replica link in the same event-loop pass as the client's
//!   reply: Redis 7.0's `call()` propagates the command (`propagatePendingCommands` →
//!   `replicationFeedSlaves`, `server.c`/`replication.c`) into the replica's output buffer before the
//!   reply is written, and `beforeSleep` → `handleClientsWithPendingWritesUsingThreads` writes both. So
//!   on a healthy link the batch arrives one network delay after it was sent, like the reply. Lag is
//!   modelled only where it is real: a cut replica link holds the stream (TCP retransmits it after the
//!   heal), and `replication_lag` (default 0) keeps each write that long in the master's output buffer
//!   — a slow replica; what waits there dies with the master. A restarted replica asks for a full
//!   resynchronisation, and a restarted master sends one: the replica empties its dataset and loads the
//!   master's (a master restarted without persistence empties its replica, as the replication docs warn).
//! - A failover (Sentinel) promotes the replica at the instant the master dies, first delivering what
//!   the master had put on the wire to it (see [`RedisState::promote`]): writes held on a cut link or
//!   waiting in a slow link's buffer are lost, as the Redis replication docs warn; the promoted server
//!   ignores the old master's stream from then on (`REPLICAOF NO ONE`).
//! - `WAIT numreplicas timeout` blocks until the replica has acknowledged every write this client made so
//!   far, or the timeout (ms; 0 = forever) passes, and replies how many replicas acknowledged (0 or 1).
//!   The replica acknowledges each batch it applies by its replication offset (`REPLCONF ACK`).
//! - Persistence: with `persist = false` (no AOF) a crashed server restarts empty. Whatever `persist`
//!   says, a restart forgets loaded scripts and subscriptions, which live only in the process.

pub mod client;
mod command;
mod data;
mod lua;
pub mod sentinel;
#[cfg(test)]
mod tests;

pub use command::{parse, parse_int, Caller};
pub use lua::{format_g17, sha1_hex, INSTRUCTION_BUDGET};

use super::{Backend, Now, Out};
use crate::clock::sim_now_ns;
use crate::history::NodeIx;
use crate::net::{Connection, Rpc};
use crate::world::NodeEnv;
use data::Data;
use lua::Scripting;
use std::collections::{BTreeMap, BTreeSet};
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
        keys: Vec<String>,
    },
    Exists {
        keys: Vec<String>,
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
    HSet {
        key: String,
        pairs: Vec<(String, String)>,
    },
    HGet {
        key: String,
        field: String,
    },
    HIncrBy {
        key: String,
        field: String,
        by: i64,
    },
    HExists {
        key: String,
        field: String,
    },
    HDel {
        key: String,
        fields: Vec<String>,
    },
    Publish {
        channel: String,
        message: String,
    },
    /// Subscribe the sending node to a channel; messages arrive as [`PubSubMessage`] pushes.
    Subscribe {
        channel: String,
    },
    Unsubscribe {
        channel: String,
    },
    Ping,
    /// `EVAL script numkeys key… arg…`.
    Eval {
        script: String,
        keys: Vec<String>,
        args: Vec<String>,
    },
    /// `EVALSHA sha1 numkeys key… arg…`.
    EvalSha {
        sha: String,
        keys: Vec<String>,
        args: Vec<String>,
    },
    /// `SCRIPT LOAD script`.
    ScriptLoad {
        script: String,
    },
    /// Any command as a command line, parsed by the server ([`RedisRequest::parse`]).
    Command {
        args: Vec<String>,
    },
    /// `INFO replication`, reduced to `connected_slaves`.
    InfoReplicas,
    /// `WAIT numreplicas timeout_ms`.
    Wait {
        numreplicas: i64,
        timeout_ms: i64,
    },
    /// Replication stream from the master, up to the master's replication offset `offset` in its
    /// stream `stream` (its life: a restarted master starts a new one), never sent by clients.
    Replicate {
        ops: Vec<ReplOp>,
        offset: u64,
        stream: u32,
    },
    /// The replica's acknowledgement: it has applied everything up to `offset` (`REPLCONF ACK`).
    ReplAck {
        offset: u64,
    },
    /// A restarted replica asks its master for the stream (`PSYNC`): the master answers with a full
    /// resynchronisation, its whole dataset, on the replica link.
    ReplSync,
    /// A replica leaves the master it followed (`REPLICAOF` another, or `NO ONE`): it closes its link,
    /// and the master, reading the connection's end after whatever the link still held, frees the
    /// replica (`replicationSetMaster`/`replicationUnsetMaster` → `freeClient(server.master)`; on the
    /// master `freeClient` → `refreshGoodSlavesCount`): it no longer counts for `min-replicas-*` or
    /// `WAIT`, and is fed no more.
    ReplClose,
    /// `REPLICAOF host port`, or `REPLICAOF NO ONE` (`None`), as Sentinel sends it.
    ReplicaOf {
        master: Option<NodeIx>,
    },
    /// Sentinel's traffic ([`sentinel`]).
    Sentinel(sentinel::SentinelMsg),
}

/// RESP2 replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisReply {
    /// The status `OK`.
    Ok,
    /// Any other status (`PONG`, a script's `{ok = …}`).
    Status(String),
    Nil,
    Int(i64),
    Bulk(String),
    Array(Vec<RedisReply>),
    Error(String),
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Hash(BTreeMap<String, String>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}

/// The effect of a write, as shipped to the replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplOp {
    Set {
        key: String,
        value: Value,
        expires_at_ms: Option<i64>,
    },
    Del {
        key: String,
    },
    /// A full resynchronisation begins: the replica empties its dataset, then loads the master's (the
    /// `Set`s that follow), as it does with the RDB a full sync sends (`replicaofCommand` → `PSYNC`,
    /// `readSyncBulkPayload` → `emptyData`, `replication.c`, 7.0).
    Reset,
}

/// A batch a master wrote to its replica link: when (simulated ns), in which of its streams, up to
/// which offset, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    pub sent_ns: u64,
    pub stream: u32,
    pub offset: u64,
    pub ops: Vec<ReplOp>,
}

/// A message pushed to a subscribed node (RESP's `message` push).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubMessage {
    pub channel: String,
    pub message: String,
}

/// One Redis server: its dataset, and the Lua VM of this life of its process (made at the first
/// script).
#[derive(Debug, Default)]
pub struct RedisState {
    data: Data,
    scripting: Option<Scripting>,
    /// Wakes the task that ships the backlog to the replicas.
    shipper: Arc<Notify>,
    /// Under Sentinel: roles change, replicas acknowledge every second, and `min-replicas-*` apply.
    managed: Option<Managed>,
    /// As a replica: the master it follows (`REPLICAOF`); it refuses writes (`replica-read-only`).
    replica_of: Option<NodeIx>,
    /// This server's node and the Sentinels watching it, for hazard marks only.
    watched: Option<(NodeIx, sentinel::Sentinels)>,
    /// As a master under `min-replicas-*`: how many replicas it last counted good (see [`Managed`]).
    good_replicas: usize,
    /// Under Sentinel: the connections clients sent commands on (normal and pub/sub clients; not a
    /// replica's link, not a Sentinel's), which a Sentinel's `REPLICAOF` closes (see
    /// [`RedisState::replicaof`]).
    clients: BTreeSet<Connection>,
}

/// A server under Sentinel ([`sentinel`]): its role changes at `REPLICAOF`, as a replica it sends
/// `REPLCONF ACK` every second (`replicationCron` → `replicationSendAck`), and as a master it refuses
/// writes while fewer than `min_replicas_to_write` replicas acknowledged within `min_replicas_max_lag`.
///
/// `min-replicas-*` (`processCommand` → `checkGoodReplicasStatus`, `replication.c`, 7.0): a replica
/// is good while `unixtime - repl_ack_time <= min-replicas-max-lag`, both in whole seconds of the
/// master's wall clock; a write command is refused with `NOREPLICAS`, and so is each write a script
/// makes (`scriptVerifyWriteCommandAllow`). The count a write is checked against is the one Redis last
/// made (`refreshGoodSlavesCount`): once a second (`replicationCron`, the server's tick here), when a
/// replica comes online (its first acknowledgement here, as after its synchronisation) and when one
/// is freed (its link closed, [`RedisRequest::ReplClose`]) — not at each acknowledgement. So an
/// acknowledgement that a cut held back, arriving just before the replica's close, never counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Managed {
    pub min_replicas_to_write: u32,
    pub min_replicas_max_lag: Duration,
}

const READONLY: &str = "READONLY You can't write against a read only replica.";
const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

impl RedisState {
    /// A server whose writes are shipped to `replicas`.
    pub fn feeding(replicas: &[NodeIx]) -> RedisState {
        let mut state = RedisState::default();
        state.data.feed(replicas);
        state
    }

    /// How many keys with an expiry (lock keys) this server holds that `replica` lacks or holds another
    /// value of: what a failover to `replica` now would lose (hazard `lock-key-lost-in-failover`).
    pub fn lock_keys_missing_from(&self, replica: &RedisState) -> usize {
        self.data.expiring_keys_missing_from(&replica.data)
    }

    /// The server process restarted with its dataset (AOF): what lives only in the process is gone —
    /// the script cache, the subscriptions and the replica link's buffers.
    pub fn restart(&mut self) {
        self.scripting = None;
        self.clients.clear();
        self.data.forget_subscribers();
        self.data.shipped.clear();
    }

    /// What this master has written to its replica link and the replica has not acknowledged, but for
    /// what is held on the cut link since `held_since` (simulated ns, [`crate::net::Net::held_since`]):
    /// what the replica still receives if this master dies now — its kernel has put it on the wire.
    pub fn on_the_wire(&self, held_since: Option<u64>) -> Vec<Shipped> {
        let sent = |b: &&Shipped| held_since.is_none_or(|first| b.sent_ns < first);
        self.data.shipped.iter().filter(sent).cloned().collect()
    }

    /// Promote this replica to master (Sentinel's `REPLICAOF NO ONE`), after applying `in_flight`, what
    /// its old master had put on the wire to it ([`RedisState::on_the_wire`]); from then on it ignores
    /// the old master's stream.
    ///
    /// Promotion is instant: the model promotes at the moment the master dies. Real Sentinel first
    /// waits `down-after-milliseconds` (30 s by default) of silence, agrees on the failover (quorum,
    /// leader election) and picks the replica (`sentinelFailoverSelectSlave`, `sentinel.c`, 7.0) — by
    /// then everything on the wire has arrived, which is why `in_flight` is applied first; clients
    /// meanwhile reach no master. That wait, and the windows it opens and closes, are a later Sentinel
    /// issue; an instant promotion that dropped what was on the wire would open a window the real
    /// system lacks.
    pub fn promote(&mut self, in_flight: Vec<Shipped>) {
        for b in in_flight {
            self.data.follow(b.stream, b.offset, b.ops);
        }
        self.data.promoted = true;
        self.replica_of = None;
    }

    /// Why writes are refused now, if they are: a replica's `READONLY`, a master's
    /// `NOREPLICAS` (see [`Managed`]).
    fn refusal(&self) -> Option<&'static str> {
        if self.replica_of.is_some() {
            return Some(READONLY);
        }
        let managed = self.managed.filter(|m| m.min_replicas_to_write > 0)?;
        (self.good_replicas < managed.min_replicas_to_write as usize).then_some(NOREPLICAS)
    }

    /// `refreshGoodSlavesCount` at wall time `wall_ms` (see [`Managed`]).
    fn recount(&mut self, wall_ms: i64) {
        let Some(managed) = self.managed else { return };
        let max_lag_s = managed.min_replicas_max_lag.as_secs() as i64;
        let good = |at_ms: i64| wall_ms.div_euclid(1000) - at_ms.div_euclid(1000) <= max_lag_s;
        self.good_replicas = self.data.replicas.values().filter(|a| a.at_ms.is_some_and(good)).count();
    }

    /// `REPLICAOF NO ONE` (`None`): stop following, keep the dataset, take writes. `REPLICAOF m`:
    /// follow `m` — drop this server's own replica link and ask `m` for a full resynchronisation, which
    /// empties the dataset first (`replicationSetMaster`, `replication.c`, 7.0). Already following `m`:
    /// nothing changes ("Already connected to specified master").
    ///
    /// Sentinel sends it in a transaction with `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub`
    /// (`sentinelSendSlaveOf`, `sentinel.c`, 7.0: "to trigger the ask-master-on-reconnection protocol
    /// for connected clients"): every client's connection is closed, so a client on a master just
    /// made a replica sees its connection end, not `READONLY`, and asks the Sentinels again.
    fn replicaof(&mut self, master: Option<NodeIx>, out: &mut Out) -> RedisReply {
        std::mem::take(&mut self.clients).into_iter().for_each(|c| out.close(c));
        match master {
            None => {
                if let Some(old) = self.replica_of.take() {
                    self.data.promoted = true;
                    out.push(old, RedisRequest::ReplClose);
                }
            }
            Some(m) if self.replica_of == Some(m) => {}
            Some(m) => {
                if let Some(old) = self.replica_of.replace(m) {
                    out.push(old, RedisRequest::ReplClose);
                }
                self.data.feed(&[]);
                self.data.shipped.clear();
                self.data.resync.clear();
                self.data.promoted = false;
                self.data.following = None;
                out.push(m, RedisRequest::ReplSync);
            }
        }
        RedisReply::Ok
    }

    /// What `INFO replication` says of this server's role.
    fn role(&self) -> sentinel::Role {
        match self.replica_of {
            Some(m) => sentinel::Role { replica_of: Some(m), offset: self.data.applied() },
            None => sentinel::Role { replica_of: None, offset: self.data.offset },
        }
    }

    fn command(&mut self, now_ms: i64, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        let data = &mut self.data;
        match request {
            RedisRequest::Eval { script, keys, args } => {
                let lua = self.scripting.get_or_insert_with(Scripting::new);
                lua.eval(data, out, now_ms, from, &script, keys, args)
            }
            RedisRequest::EvalSha { sha, keys, args } => match &mut self.scripting {
                Some(lua) => lua.evalsha(data, out, now_ms, from, &sha, keys, args),
                None => RedisReply::Error("NOSCRIPT No matching script. Please use EVAL.".into()),
            },
            RedisRequest::ScriptLoad { script } => self.scripting.get_or_insert_with(Scripting::new).load(&script),
            RedisRequest::Command { args } => match RedisRequest::parse(&args) {
                Ok(RedisRequest::Command { .. }) => unreachable!("a command line never parses to a command line"),
                Ok(request) => self.command(now_ms, from, request, out),
                Err(e) => RedisReply::Error(e),
            },
            request => data.execute(now_ms, from, request, out),
        }
    }
}

impl Backend for RedisState {
    type Request = RedisRequest;
    type Reply = RedisReply;

    /// Under Sentinel a client's connection is kept, for the `CLIENT KILL` that comes with a Sentinel's
    /// `REPLICAOF`.
    fn apply_via(&mut self, now: Now, via: Connection, request: RedisRequest, out: &mut Out) -> RedisReply {
        if self.managed.is_some() && request.from_a_client() {
            self.clients.insert(via);
        }
        self.apply(now, via.peer, request, out)
    }

    /// Key expiry follows the wall clock: Redis 7 stores absolute Unix-time deadlines (`mstime()`),
    /// so a jump of the server's clock expires keys early or late.
    fn apply(&mut self, now: Now, from: NodeIx, request: RedisRequest, out: &mut Out) -> RedisReply {
        match request {
            RedisRequest::ReplicaOf { master } => return self.replicaof(master, out),
            RedisRequest::Sentinel(sentinel::SentinelMsg::Probe { info }) => {
                let role = info.then(|| self.role());
                out.push(from, RedisRequest::Sentinel(sentinel::SentinelMsg::Probed { role }));
                return RedisReply::Status("PONG".into());
            }
            RedisRequest::Sentinel(_) => return RedisReply::Error("ERR unknown command 'SENTINEL'".into()),
            // The stream of a master this server does not follow: a link from before a role change (an
            // acknowledgement from a replica it no longer feeds is dropped by the data, which knows its
            // replicas).
            RedisRequest::Replicate { .. } if self.replica_of.is_some_and(|m| m != from) => return RedisReply::Ok,
            // A server under Sentinel feeds whichever replica asks, as Redis does.
            RedisRequest::ReplSync if self.managed.is_some() => {
                self.data.replicas.insert(from, Default::default());
                self.data.backlog.get_or_insert_with(Vec::new);
            }
            _ => {}
        }
        self.data.refusal = self.refusal();
        // A replica online (its first acknowledgement) or freed changes the count at once.
        let recount = match request {
            RedisRequest::ReplClose => true,
            RedisRequest::ReplAck { .. } => self.data.replicas.get(&from).is_some_and(|a| a.at_ms.is_none()),
            _ => false,
        };
        let offset = self.data.offset;
        // A client's write (or a script, or a command line, that may write) — not a read that expired a key.
        let writes = request.is_write()
            || matches!(
                request,
                RedisRequest::Eval { .. } | RedisRequest::EvalSha { .. } | RedisRequest::Command { .. }
            );
        let reply = self.command(now.wall_ms, from, request, out);
        if recount {
            self.recount(now.wall_ms);
        }
        if self.data.offset > offset && writes && self.watched.as_ref().is_some_and(|(me, s)| s.deposed(*me)) {
            out.mark(crate::hazard::Hazard::DeposedMasterWrite);
        }
        if self.data.offset > offset {
            self.data.written.insert(from, self.data.offset);
            self.shipper.notify_one();
        }
        if !self.data.resync.is_empty() {
            self.shipper.notify_one();
        }
        reply
    }

    /// Under Sentinel, `replicationCron` every second: a replica acknowledges, a master recounts its
    /// good replicas.
    fn tick_interval(&self) -> Option<Duration> {
        self.managed.map(|_| Duration::from_secs(1))
    }

    fn tick(&mut self, now: Now, out: &mut Out) {
        match self.replica_of {
            Some(master) => out.push(master, RedisRequest::ReplAck { offset: self.data.applied() }),
            None => self.recount(now.wall_ms),
        }
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
        let synced = self.data.synced(from);
        (synced >= *numreplicas || timed_out).then_some(RedisReply::Int(synced))
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
    /// The replicas this master writes its stream to.
    pub replicas: Vec<NodeIx>,
    /// How long each write first waits in the master's output buffer (a slow replica; zero: written
    /// with the reply).
    pub lag: Duration,
    /// The master this replica follows: a restarted replica asks it for a full resynchronisation.
    pub master: Option<NodeIx>,
    /// Under Sentinel: its role changes, and survives a restart (Sentinel has it rewrite its config).
    pub managed: Option<Managed>,
    /// The Sentinels watching it (hazard marks).
    pub sentinels: sentinel::Sentinels,
}

impl RedisNode {
    /// The node's program: serve requests, and ship writes to its replicas if it has any.
    pub async fn run(self, env: NodeEnv) {
        let (replica_of, feeds) = {
            let mut state = self.state.lock().expect("redis lock");
            // Its role: as configured, or as Sentinel last made it.
            let (replica_of, replicas) = match (self.managed, env.incarnation) {
                (Some(_), 1..) => (state.replica_of, state.data.replicas.keys().copied().collect()),
                _ => (self.master, self.replicas.clone()),
            };
            match self.persist {
                false => *state = RedisState::feeding(&replicas),
                true => state.restart(),
            }
            (state.managed, state.replica_of) = (self.managed, replica_of);
            state.watched = (!self.sentinels.0.is_empty()).then(|| (env.me, self.sentinels.clone()));
            (replica_of, !replicas.is_empty())
        };
        let rpc = std::rc::Rc::new(env.rpc());
        if let (Some(master), true) = (replica_of, env.incarnation > 0) {
            // A restarted replica reconnects and asks for the stream; a restarted master (below) sends
            // its dataset on its own, as a replica's PSYNC after the master's restart finds a new
            // replication ID and gets a full sync.
            rpc.tell(master, RedisRequest::ReplSync);
        }
        if let (Some(master), 0, Some(_)) = (replica_of, env.incarnation, self.managed) {
            // A replica's first acknowledgement, as after its first synchronisation: a master that
            // counts good replicas (`min-replicas-*`) takes writes from the start.
            rpc.tell(master, RedisRequest::ReplAck { offset: 0 });
        }
        // Under Sentinel any server may come to feed a replica.
        if feeds || self.managed.is_some() {
            if env.incarnation > 0 {
                let mut state = self.state.lock().expect("redis lock");
                state.data.resync = state.data.replicas.keys().copied().collect();
            }
            let (state, rpc, stream, lag) = (self.state.clone(), rpc.clone(), env.incarnation, self.lag);
            madsim::task::spawn_local(async move { ship(state, &rpc, lag, stream).await });
        }
        super::serve(self.state, &rpc, &env.clock, &env.recorder).await
    }
}

/// How long a batch written to the replica link is remembered unacknowledged: longer than Linux keeps
/// retransmitting (`tcp_retries2`, about 924 s).
const SHIPPED_KEPT_NS: u64 = 1_000_000_000_000;

/// The replica links' writer: each write's effects go out `lag` after the write (at once by default,
/// the same instant as the reply), in order, to every replica, and are kept until acknowledged. A full
/// resynchronisation goes to the replicas that asked for it. What waits in `waiting` lives in the
/// process and dies with it.
async fn ship(state: Arc<Mutex<RedisState>>, rpc: &Rpc, lag: Duration, stream: u32) {
    let shipper = state.lock().expect("redis lock").shipper.clone();
    // (due, to whom — `None`: every replica —, ops, offset after them), in the order written.
    let mut waiting: std::collections::VecDeque<(u64, Option<NodeIx>, Vec<ReplOp>, u64)> = Default::default();
    loop {
        let now = sim_now_ns();
        {
            let mut s = state.lock().expect("redis lock");
            let (due, offset) = (now + lag.as_nanos() as u64, s.data.offset);
            let mut ops = s.data.backlog.as_mut().map(std::mem::take).unwrap_or_default();
            let resync = std::mem::take(&mut s.data.resync);
            if !resync.is_empty() && resync.iter().eq(s.data.replicas.keys()) {
                // A full sync carries the dataset as it is now: what waited to be written is in it.
                waiting.clear();
                ops = s.data.snapshot();
            } else {
                // Some replicas only: the others keep their stream, and these take theirs after the
                // snapshot, from its offset on.
                waiting.extend(resync.into_iter().map(|r| (due, Some(r), s.data.snapshot(), offset)));
            }
            if !ops.is_empty() {
                waiting.push_back((due, None, ops, offset));
            }
        }
        match waiting.front() {
            Some((due, ..)) if *due <= now => {
                let (_, to, ops, offset) = waiting.pop_front().expect("just looked");
                let mut s = state.lock().expect("redis lock");
                // A replica no longer fed (`REPLICAOF`) has lost its link.
                let replicas: Vec<NodeIx> = match to {
                    None => s.data.replicas.keys().copied().collect(),
                    Some(r) => s.data.replicas.contains_key(&r).then_some(r).into_iter().collect(),
                };
                if to.is_none() {
                    // Older batches were delivered or died with their link (TCP gives up after ~924 s):
                    // forget them, so a replica that never acknowledges cannot grow the log without bound.
                    s.data.shipped.retain(|b| b.sent_ns + SHIPPED_KEPT_NS > now);
                    s.data.shipped.push(Shipped { sent_ns: now, stream, offset, ops: ops.clone() });
                }
                drop(s);
                if let Some((last, others)) = replicas.split_last() {
                    for replica in others {
                        rpc.tell(*replica, RedisRequest::Replicate { ops: ops.clone(), offset, stream });
                    }
                    rpc.tell(*last, RedisRequest::Replicate { ops, offset, stream });
                }
            }
            Some((due, ..)) => {
                let wait = crate::clock::sleep(Duration::from_nanos(due - now));
                tokio::select! {
                    biased;
                    _ = shipper.notified() => {}
                    _ = wait => {}
                }
            }
            None => shipper.notified().await,
        }
    }
}
