//! The Redis family: the client trait recipes speak, the simulated deployment, and the recipes.
//!
//! Recipes talk to one Redis master through [`RedisApi`], whose methods mirror a Redis client's commands
//! (redis-rs, Jedis, redis-py): strings, hashes, `PUBLISH`, Lua scripts (`EVAL`, `EVALSHA`, `SCRIPT
//! LOAD`, and [`LuaScript`], a script as client libraries hold one), `WAIT`, or any command line.
//! [`SimRedis`] implements it over the simulated network, following the shard's current master as a
//! Sentinel-aware client does, and subscribes to channels ([`SimRedis::subscribe`]); [`real::RealRedis`]
//! implements it on a real server (real mode). Recipes hold a [`RedisConn`], one or the other as their
//! [`Servers`] say. The scripts the recipes send are in [`scripts`], as the libraries send them.

mod getset_expiry;
#[cfg(feature = "real-clients")]
pub mod real;
mod redlock;
pub mod scripts;
mod set_nx;
mod set_nx_px;
mod watchdog;

use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{Family, Grant, Outcome, RealServer, RecipeSpec, Servers};
use locksim_sim::backend::redis::client::{Router, Subscription};
use locksim_sim::backend::redis::sentinel::{self, SentinelConfig, SentinelMsg, SentinelState, Sentinels};
use locksim_sim::backend::redis::{
    sha1_hex, Managed, RedisNode, RedisReply, RedisRequest, RedisState, SetCondition, Shards,
};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;
use locksim_sim::hazard::Hazard;
use locksim_sim::history::{NodeIx, Recorder};
use locksim_sim::net::CallError;
use locksim_sim::world::{Program, World};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every Redis recipe, for the registry.
pub const RECIPES: &[RecipeSpec] = &[
    set_nx::RECIPE,
    set_nx::EXPIRE_RECIPE,
    set_nx_px::RECIPE,
    getset_expiry::RECIPE,
    watchdog::RECIPE,
    redlock::RECIPE,
];

/// The key every Redis recipe locks, and the counter that hands out fencing tokens.
const LOCK_KEY: &str = "lock";
const FENCE_KEY: &str = "lock:fence";

/// A Redis connection's commands. Errors are network outcomes; Redis errors come back as replies.
/// Native `async fn`s rather than `async_trait`'s boxed futures: a command is the simulation's
/// commonest step, and each boxed layer (the command, the connection, the shard) cost an allocation
/// per command. Every implementation and caller is static (`impl RedisApi`); the futures need not be
/// `Send` (the simulator and real mode run a client on one thread).
#[allow(async_fn_in_trait)]
pub trait RedisApi {
    /// Send one command and wait for its reply.
    async fn request(&self, request: RedisRequest) -> Result<RedisReply, CallError>;

    /// Any command as a command line (`["HSET", "h", "f", "v"]`); the server parses it.
    async fn command(&self, args: &[&str]) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Command { args: owned(args) }).await
    }
    async fn set(
        &self,
        key: &str,
        value: &str,
        condition: SetCondition,
        px_ms: Option<i64>,
    ) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Set { key: key.into(), value: value.into(), condition, px_ms }).await
    }
    async fn get(&self, key: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Get { key: key.into() }).await
    }
    async fn del(&self, key: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Del { keys: vec![key.into()] }).await
    }
    async fn exists(&self, key: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Exists { keys: vec![key.into()] }).await
    }
    async fn getset(&self, key: &str, value: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::GetSet { key: key.into(), value: value.into() }).await
    }
    async fn incr(&self, key: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Incr { key: key.into() }).await
    }
    async fn pexpire(&self, key: &str, ms: i64) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::PExpire { key: key.into(), ms }).await
    }
    async fn pttl(&self, key: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::PTtl { key: key.into() }).await
    }
    async fn hset(&self, key: &str, field: &str, value: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::HSet { key: key.into(), pairs: vec![(field.into(), value.into())] }).await
    }
    async fn hget(&self, key: &str, field: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::HGet { key: key.into(), field: field.into() }).await
    }
    async fn hincrby(&self, key: &str, field: &str, by: i64) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::HIncrBy { key: key.into(), field: field.into(), by }).await
    }
    async fn hexists(&self, key: &str, field: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::HExists { key: key.into(), field: field.into() }).await
    }
    async fn hdel(&self, key: &str, field: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::HDel { key: key.into(), fields: vec![field.into()] }).await
    }
    /// `PUBLISH channel message`: how many subscribers got it.
    async fn publish(&self, channel: &str, message: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Publish { channel: channel.into(), message: message.into() }).await
    }
    /// `EVAL script numkeys key… arg…`.
    async fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Eval { script: script.into(), keys: owned(keys), args: owned(args) }).await
    }
    /// `EVALSHA sha1 numkeys key… arg…` (`NOSCRIPT` if this server life has not seen the script).
    async fn evalsha(&self, sha: &str, keys: &[&str], args: &[&str]) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::EvalSha { sha: sha.into(), keys: owned(keys), args: owned(args) }).await
    }
    /// `SCRIPT LOAD script`: its SHA1.
    async fn script_load(&self, script: &str) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::ScriptLoad { script: script.into() }).await
    }
    /// `INFO replication`'s `connected_slaves`: how many replicas the server feeds.
    async fn connected_replicas(&self) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::InfoReplicas).await
    }
    /// `WAIT numreplicas timeout_ms`: how many replicas have this connection's writes.
    async fn wait(&self, numreplicas: i64, timeout_ms: i64) -> Result<RedisReply, CallError> {
        self.request(RedisRequest::Wait { numreplicas, timeout_ms }).await
    }
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// A Lua script as client libraries hold one: its text and SHA1 (redis-py's `Script`, go-redis's
/// `NewScript`).
pub struct LuaScript {
    pub text: &'static str,
    pub sha: String,
}

impl LuaScript {
    pub fn new(text: &'static str) -> LuaScript {
        LuaScript { text, sha: sha1_hex(text) }
    }

    /// redis-py's `Script.__call__`: `EVALSHA`; on `NOSCRIPT` (a server that has not seen it, or has
    /// restarted since), `SCRIPT LOAD` and `EVALSHA` again.
    pub async fn run(&self, redis: &impl RedisApi, keys: &[&str], args: &[&str]) -> Result<RedisReply, CallError> {
        match redis.evalsha(&self.sha, keys, args).await? {
            RedisReply::Error(e) if e.starts_with("NOSCRIPT") => match redis.script_load(self.text).await? {
                RedisReply::Bulk(sha) => redis.evalsha(&sha, keys, args).await,
                other => Ok(other),
            },
            reply => Ok(reply),
        }
    }
}

/// A connection to one shard of the simulated Redis deployment.
pub struct SimRedis {
    ctx: Ctx,
    shards: Shards,
    shard: usize,
    timeout: Duration,
    /// The server every command goes to, when pinned (see [`SimRedis::pinned`]).
    pinned: Option<NodeIx>,
    /// The Sentinels to ask for the master, when Sentinel manages the shard (see [`SentinelClient`]).
    sentinels: Vec<NodeIx>,
}

/// A node's connection to the master Sentinel named, as redis-py's Sentinel client keeps it
/// (`SentinelConnectionPool`, `Sentinel.discover_master`, redis-py 5): on connecting, it asks the
/// Sentinels for the master ([`SentinelOrder`]). The connection then stays on that server, whatever the
/// Sentinels decide later, until a command on it times out or breaks, or is refused with `READONLY`
/// (`SentinelManagedConnection.read_response` disconnects): the next command connects again and asks
/// again.
#[derive(Default)]
struct SentinelClient {
    master: std::cell::Cell<Option<NodeIx>>,
    order: SentinelOrder<NodeIx>,
}

/// The order in which a client asks the Sentinels for the master (`Sentinel.discover_master`, redis-py
/// 5), simulated or real: each in turn, skipping one that does not answer within the call timeout or
/// says the master is down; the one that named it goes to the front of the list.
pub struct SentinelOrder<S>(std::cell::RefCell<Vec<S>>);

impl<S> Default for SentinelOrder<S> {
    fn default() -> Self {
        SentinelOrder(std::cell::RefCell::default())
    }
}

impl<S: Clone> SentinelOrder<S> {
    /// The master the first of `sentinels` to name one names (`ask`), or `None` (`MasterNotFoundError`).
    pub async fn discover<M>(&self, sentinels: &[S], ask: impl AsyncFn(&S) -> Option<M>) -> Option<M> {
        if self.0.borrow().is_empty() {
            *self.0.borrow_mut() = sentinels.to_vec();
        }
        let order = self.0.borrow().clone();
        for (i, sentinel) in order.iter().enumerate() {
            if let Some(master) = ask(sentinel).await {
                self.0.borrow_mut().swap(0, i);
                return Some(master);
            }
        }
        None
    }
}

/// The name real mode's Sentinels monitor the master by (`sentinel monitor mymaster …`).
pub const SENTINEL_MASTER: &str = "mymaster";

impl SimRedis {
    pub fn new(ctx: Ctx, servers: &RedisServers, shard: usize, timeout: Duration) -> SimRedis {
        let sentinels = servers.sentinels.clone();
        SimRedis { ctx, shards: servers.shards.clone(), shard, timeout, pinned: None, sentinels }
    }

    /// A connection to the shard's master of this moment (or to the server this one is pinned to), for
    /// commands that must reach the same server (a pipelined batch, such as Redisson's lock script and
    /// its `WAIT`), with its own timeout. Under Sentinel, the node's one connection is already pinned
    /// to a server until it fails.
    pub fn pinned(&self, timeout: Duration) -> SimRedis {
        let master = match self.sentinels.is_empty() {
            true => Some(self.pinned.unwrap_or_else(|| self.shards.master(self.shard))),
            false => self.pinned,
        };
        SimRedis {
            ctx: self.ctx.clone(),
            shards: self.shards.clone(),
            shard: self.shard,
            timeout,
            pinned: master,
            sentinels: self.sentinels.clone(),
        }
    }

    fn sentinel_client(&self) -> std::rc::Rc<SentinelClient> {
        self.ctx.node_wide(SentinelClient::default)
    }

    /// The server commands go to now: the shard's master, or under Sentinel the server this node's
    /// connection is on (asking the Sentinels if it has none; `Reset` when none names a master).
    async fn server(&self) -> Result<NodeIx, CallError> {
        if let Some(pinned) = self.pinned {
            return Ok(pinned);
        }
        if self.sentinels.is_empty() {
            return Ok(self.shards.master(self.shard));
        }
        let client = self.sentinel_client();
        if let Some(master) = client.master.get() {
            return Ok(master);
        }
        let ask = async |sentinel: &NodeIx| {
            let asked = self.ctx.rpc().call(*sentinel, RedisRequest::Sentinel(SentinelMsg::Masters), self.timeout);
            match asked.await {
                Ok(RedisReply::Array(answer)) => match answer[..] {
                    [RedisReply::Int(master), RedisReply::Int(0)] => Some(NodeIx(master as u32)),
                    _ => None,
                },
                _ => None,
            }
        };
        let master = client.order.discover(&self.sentinels, ask).await;
        client.master.set(master);
        master.ok_or(CallError::Reset) // MasterNotFoundError: nothing was sent
    }

    /// After a command's outcome: a connection that failed, or found a replica, is dropped.
    fn after(&self, reply: &Result<RedisReply, CallError>) {
        if self.sentinels.is_empty() {
            return;
        }
        let readonly = matches!(reply, Ok(RedisReply::Error(e)) if e.starts_with("READONLY"));
        if reply.is_err() || readonly {
            self.sentinel_client().master.set(None);
        }
    }

    /// `SUBSCRIBE channel` on the server of this moment, on the node's pub/sub connection, waiting at
    /// most `timeout` for the confirmation.
    pub async fn subscribe(&self, channel: &str, timeout: Duration) -> Result<Subscription, CallError> {
        let router = self.ctx.node_wide(Router::default);
        let server = self.server().await?;
        Subscription::open(self.ctx.rpc(), &router, server, channel, timeout).await
    }

    /// Send a command without waiting for its answer (Redisson's fire-and-forget `writeAsync`). Under
    /// Sentinel, a node whose connection has failed sends nothing (the write fails in the library).
    pub fn send(&self, request: RedisRequest) {
        let server = match self.sentinels.is_empty() {
            true => Some(self.pinned.unwrap_or_else(|| self.shards.master(self.shard))),
            false => self.pinned.or(self.sentinel_client().master.get()),
        };
        if let Some(server) = server {
            self.ctx.rpc().tell(server, request);
        }
    }
}

impl RedisApi for SimRedis {
    async fn request(&self, request: RedisRequest) -> Result<RedisReply, CallError> {
        let server = self.server().await?;
        let reply = self.ctx.rpc().call(server, request, self.timeout).await;
        self.after(&reply);
        reply
    }
}

/// A recipe's Redis connection: to a simulated shard, or (real mode) to a real server. Enum dispatch:
/// the simulated path stays as direct as before.
pub enum RedisConn {
    Sim(SimRedis),
    #[cfg(feature = "real-clients")]
    Real(real::RealRedis),
}

impl RedisConn {
    /// A connection to `shard` of `servers` (real servers have one), whose commands wait `timeout`.
    pub fn new(ctx: Ctx, servers: &Servers, shard: usize, timeout: Duration) -> RedisConn {
        match servers {
            #[cfg(feature = "real-clients")]
            Servers::Real(real) => {
                assert_eq!(shard, 0, "a real run has one Redis master");
                RedisConn::Real(real::RealRedis::new(real, timeout))
            }
            other => RedisConn::Sim(SimRedis::new(ctx, RedisServers::from(other), shard, timeout)),
        }
    }

    /// See [`SimRedis::pinned`]: the same server, with its own timeout.
    pub fn pinned(&self, timeout: Duration) -> RedisConn {
        match self {
            RedisConn::Sim(sim) => RedisConn::Sim(sim.pinned(timeout)),
            #[cfg(feature = "real-clients")]
            RedisConn::Real(real) => RedisConn::Real(real.pinned(timeout)),
        }
    }

    /// `SUBSCRIBE channel`, waiting at most `timeout` for the confirmation.
    pub async fn subscribe(&self, channel: &str, timeout: Duration) -> Result<RedisSubscription, CallError> {
        match self {
            RedisConn::Sim(sim) => sim.subscribe(channel, timeout).await.map(RedisSubscription::Sim),
            #[cfg(feature = "real-clients")]
            RedisConn::Real(real) => real.subscribe(channel, timeout).await.map(RedisSubscription::Real),
        }
    }

    /// Send a command without waiting for its answer (Redisson's fire-and-forget `writeAsync`).
    pub fn send(&self, request: RedisRequest) {
        match self {
            RedisConn::Sim(sim) => sim.send(request),
            #[cfg(feature = "real-clients")]
            RedisConn::Real(real) => real.send(request),
        }
    }
}

impl RedisApi for RedisConn {
    async fn request(&self, request: RedisRequest) -> Result<RedisReply, CallError> {
        match self {
            RedisConn::Sim(sim) => sim.request(request).await,
            #[cfg(feature = "real-clients")]
            RedisConn::Real(real) => real.request(&request).await,
        }
    }
}

/// A subscription to one channel, simulated or real.
pub enum RedisSubscription {
    Sim(Subscription),
    #[cfg(feature = "real-clients")]
    Real(real::RealSubscription),
}

impl RedisSubscription {
    /// The next message on the channel, waiting for one if none has come.
    pub async fn message(&mut self) -> String {
        match self {
            RedisSubscription::Sim(sim) => sim.message().await,
            #[cfg(feature = "real-clients")]
            RedisSubscription::Real(real) => real.message().await,
        }
    }
}

/// The Redis servers of one world.
#[derive(Clone, Debug)]
pub struct RedisServers {
    pub shards: Shards,
    /// The Sentinels clients ask for the master (none: clients follow [`Shards`]).
    pub sentinels: Vec<NodeIx>,
}

impl RedisServers {
    /// The Redis servers among a world's servers (every recipe of this family is handed them).
    pub fn from(servers: &Servers) -> &RedisServers {
        servers.sim()
    }
}

/// `[backend]` keys of the Redis family.
pub const BACKEND_PARAMS: &[ParamSpec] = &[
    ParamSpec::int("masters", (1, 9), 1, "independent Redis masters (Redlock uses several; other recipes one)"),
    ParamSpec::int(
        "replicas",
        (0, 2),
        0,
        "replicas per master, fed by asynchronous replication; `failover` promotes the one replica, Sentinel \
         (which 2 need) the most up to date",
    ),
    ParamSpec::duration(
        "replication_lag",
        0,
        "a slow replica: how long each write waits in the master's output buffer before it goes on the \
         replica link (0: with the reply, as Redis does); what waits there is lost if the master fails over",
    ),
    ParamSpec {
        name: "persist",
        kind: ParamKind::Bool,
        default: ParamValue::Bool(false),
        doc: "keep the dataset across a crash (AOF, fsync always); false restarts empty",
    },
    ParamSpec::int(
        "sentinels",
        (0, 3),
        0,
        "Redis Sentinels watching the master (0 or 3, one node each: sentinel-0..2); with 3, Sentinel finds the \
         master down and promotes its replica itself, and clients ask a Sentinel for the master (redis-py's \
         Sentinel client)",
    ),
    ParamSpec::duration(
        "down_after",
        30_000,
        "Sentinel's down-after-milliseconds: silence before a Sentinel sees the master down",
    ),
    ParamSpec::duration(
        "failover_timeout",
        180_000,
        "Sentinel's failover-timeout: a promotion not confirmed within it is abandoned, and no failover of the \
         master starts again within twice it",
    ),
    ParamSpec::int("quorum", (1, 3), 2, "Sentinels that must see the master down before one fails it over"),
    ParamSpec::int(
        "min_replicas_to_write",
        (0, 2),
        0,
        "min-replicas-to-write: the master refuses writes (NOREPLICAS) unless this many replicas acknowledged \
         within min_replicas_max_lag",
    ),
    ParamSpec::duration(
        "min_replicas_max_lag",
        10_000,
        "min-replicas-max-lag, in whole seconds: how old a replica's last acknowledgement (sent every second) may be",
    ),
];

/// The deployment's Sentinel and `min-replicas-*` settings are consistent (every Redis recipe checks).
fn sentinel_settings(backend: &Params) -> Result<(), String> {
    let (sentinels, replicas) = (backend.int("sentinels"), backend.int("replicas"));
    if ![0, 3].contains(&sentinels) {
        return Err(format!("[backend] sentinels = {sentinels}: the model runs 0 or 3 Sentinels"));
    }
    if sentinels > 0 && replicas == 0 {
        return Err("[backend] sentinels = 3 needs a replica to promote: set replicas = 1".into());
    }
    if sentinels == 0 && replicas > 1 {
        return Err(format!(
            "[backend] replicas = {replicas} is modelled under Sentinel (sentinels = 3); the failover fault promotes \
             the one replica of replicas = 1"
        ));
    }
    if backend.int("min_replicas_to_write") > replicas {
        return Err(format!(
            "[backend] min_replicas_to_write = {} with replicas = {replicas}: the master would refuse every write",
            backend.int("min_replicas_to_write")
        ));
    }
    if backend.duration("min_replicas_max_lag").subsec_nanos() != 0 {
        return Err("[backend] min_replicas_max_lag is whole seconds in Redis (e.g. \"10s\")".into());
    }
    if backend.int("quorum") > sentinels && sentinels > 0 {
        return Err(format!("[backend] quorum = {} is more than the {sentinels} Sentinels", backend.int("quorum")));
    }
    Ok(())
}

pub static FAMILY: Family = Family {
    name: "redis",
    summary: "Redis 7: strings, hashes, PX expiry by the server clock, Lua, pub/sub, async replica, Sentinel failover",
    params: BACKEND_PARAMS,
    topology,
    deploy,
    real: Some(&REAL),
    marks: |h| {
        crate::LEASE_HAZARDS.contains(&h) || [Hazard::LockKeyLostInFailover, Hazard::DeposedMasterWrite].contains(&h)
    },
};

/// Redis 7.0 (Debian 12 `redis-server`): one master, or one master with its replicas and three
/// Sentinels (`redis-server --sentinel`, what Debian's `redis-sentinel` runs); no Redlock's independent
/// masters, no replica without Sentinel (the `failover` fault is simulated only), no slowed replica. It
/// restarts empty unless `persist = true` (real mode then runs it with an append-only file).
pub static REAL: RealServer = RealServer {
    name: "redis",
    node: "redis-0",
    env: "LOCKSIM_REDIS",
    package: "redis-server",
    client_built: cfg!(feature = "real-clients"),
    refuses: |backend| {
        let (masters, replicas, sentinels) =
            (backend.int("masters"), backend.int("replicas"), backend.int("sentinels"));
        if masters != 1 {
            return Err(format!(
                "with [backend] masters = {masters}: --real starts one Redis master, and Redlock's independent \
                 masters would each need their own"
            ));
        }
        if replicas > 0 && sentinels == 0 {
            return Err(format!(
                "with [backend] replicas = {replicas} and no Sentinels: --real fails a master over only as \
                 Sentinel does (sentinels = 3); the `failover` fault is simulated only"
            ));
        }
        if !backend.duration("replication_lag").is_zero() {
            return Err("with [backend] replication_lag: a real replica is not slowed (it runs simulated only)".into());
        }
        Ok(())
    },
    keeps_data: |backend| backend.bool("persist"),
    address: RealServer::host_port,
};

fn master_name(shard: usize) -> String {
    format!("redis-{shard}")
}

/// The first replica of a master is `redis-0-replica`, the second `redis-0-replica-2`.
fn replica_name(shard: usize, k: usize) -> String {
    match k {
        0 => format!("redis-{shard}-replica"),
        k => format!("redis-{shard}-replica-{}", k + 1),
    }
}

fn sentinel_name(i: usize) -> String {
    format!("sentinel-{i}")
}

fn topology(params: &Params) -> Topology {
    let replicas = params.int("replicas") as usize;
    let sentinels = params.int("sentinels") as usize;
    let mut topo = Topology::default();
    for shard in 0..params.int("masters") as usize {
        topo.servers.push(master_name(shard));
        topo.servers.extend((0..replicas).map(|k| replica_name(shard, k)));
        // Under Sentinel a failover is Sentinel's to decide, not a fault's.
        if replicas == 1 && sentinels == 0 {
            topo.failover_masters.push(master_name(shard));
        }
    }
    topo.servers.extend((0..sentinels).map(sentinel_name));
    topo
}

/// How the servers run under Sentinel or `min-replicas-*`; `None`: as before either.
fn managed(params: &Params) -> Option<Managed> {
    let min_replicas_to_write = params.int("min_replicas_to_write") as u32;
    (params.int("sentinels") > 0 || min_replicas_to_write > 0)
        .then(|| Managed { min_replicas_to_write, min_replicas_max_lag: params.duration("min_replicas_max_lag") })
}

fn deploy(world: &mut World, params: &Params) -> Servers {
    let (shards, count) = (params.int("masters") as usize, params.int("replicas") as usize);
    let (lag, persist, managed) = (params.duration("replication_lag"), params.bool("persist"), managed(params));
    // Every node's index is known before any is added: each master, its replicas right after it, then
    // the Sentinels (made first, as the servers they watch mark a hazard by their view).
    let first = world.next_index().0 as usize;
    let master_ix = |shard: usize| NodeIx((first + shard * (count + 1)) as u32);
    let sentinels = sentinel_states(params, master_ix(0), NodeIx((first + shards * (count + 1)) as u32));
    let (mut masters, mut replica_of, mut states) = (Vec::new(), Vec::new(), Vec::new());
    for shard in 0..shards {
        let replicas: Vec<NodeIx> = (1..=count as u32).map(|k| NodeIx(master_ix(shard).0 + k)).collect();
        let state = Arc::new(Mutex::new(RedisState::feeding(&replicas)));
        let node = |state, replicas, lag, master| RedisNode {
            state,
            persist,
            replicas,
            lag,
            master,
            managed,
            sentinels: sentinels.clone(),
        };
        let master =
            world.add_node(&master_name(shard), redis_program(node(state.clone(), replicas.clone(), lag, None)));
        assert_eq!(master, master_ix(shard), "servers are added in order");
        masters.push(master);
        for (k, replica) in replicas.iter().enumerate() {
            let node = node(Arc::default(), Vec::new(), Duration::ZERO, Some(master));
            states.push((master, state.clone(), node.state.clone()));
            let added = world.add_node(&replica_name(shard, k), redis_program(node));
            assert_eq!(added, *replica, "replicas are added in order, after their master");
            replica_of.push((master, added));
        }
    }
    let sentinel_nodes: Vec<NodeIx> = sentinels
        .0
        .iter()
        .enumerate()
        .map(|(i, state)| world.add_server(&sentinel_name(i), sentinel::program(state.clone())))
        .collect();
    let shards = Shards::new(masters);
    let (directory, recorder, net) = (shards.clone(), world.recorder().clone(), world.net().clone());
    world.set_failover(Box::new(move |master| {
        let replica = replica_of.iter().find(|(m, _)| *m == master).map(|(_, r)| *r);
        let replica = replica.ok_or_else(|| "not a master with a replica".to_string())?;
        directory.promote(master, replica).ok_or_else(|| "already failed over".to_string())?;
        let Some((_, m, r)) = states.iter().find(|(n, _, _)| *n == master) else { unreachable!("a master") };
        let in_flight = m.lock().expect("redis lock").on_the_wire(net.held_since(master, replica));
        r.lock().expect("redis lock").promote(in_flight);
        mark_lost_lock_keys(&states, master, &recorder);
        Ok(replica)
    }));
    Servers::new(RedisServers { shards, sentinels: sentinel_nodes })
}

/// The Sentinels watching the one master (at `master`, its replicas right after it), to be added at
/// `first` on (`[backend] sentinels = 3`; none for 0).
fn sentinel_states(params: &Params, master: NodeIx, first: NodeIx) -> Sentinels {
    let (count, replicas) = (params.int("sentinels") as u32, params.int("replicas") as u32);
    let config = SentinelConfig {
        down_after: params.duration("down_after"),
        failover_timeout: params.duration("failover_timeout"),
        quorum: params.int("quorum") as usize,
    };
    let all: Vec<NodeIx> = (0..count).map(|i| NodeIx(first.0 + i)).collect();
    let watched: Vec<NodeIx> = (1..=replicas).map(|k| NodeIx(master.0 + k)).collect();
    let state = |me| Arc::new(Mutex::new(SentinelState::new(config, me, &all, master, watched.clone())));
    Sentinels(all.iter().map(|me| state(*me)).collect())
}

type SharedState = Arc<Mutex<RedisState>>;

/// Hazard `lock-key-lost-in-failover`: while a client holds the lock, the replica being promoted lacks a
/// lock key (a key with an expiry) of `master`, or has an older value of it.
fn mark_lost_lock_keys(states: &[(NodeIx, SharedState, SharedState)], master: NodeIx, recorder: &Recorder) {
    let Some((_, m, r)) = states.iter().find(|(n, _, _)| *n == master) else { return };
    let lost = m.lock().expect("redis lock").lock_keys_missing_from(&r.lock().expect("redis lock"));
    if lost > 0 && !recorder.holders().is_empty() {
        recorder.mark(Hazard::LockKeyLostInFailover);
    }
}

fn redis_program(node: RedisNode) -> Program {
    Arc::new(move |env| {
        let node = node.clone();
        Box::pin(async move { node.run(env).await })
    })
}

/// Parameters the single-instance Redis recipes share.
const RETRY: ParamSpec =
    ParamSpec::duration("retry", 100, "sleep between attempts while the lock is taken (redis-py's `sleep`)");
const ACQUIRE_TIMEOUT: ParamSpec =
    ParamSpec::duration("acquire_timeout", 10_000, "give up waiting after this long (redis-py's `blocking_timeout`)");
const CALL_TIMEOUT: ParamSpec = ParamSpec::duration(
    "call_timeout",
    1_000,
    "socket timeout of each Redis command; a timed-out command may still have run",
);
const TTL: ParamSpec = ParamSpec::duration("ttl", 10_000, "expiry of the lock key (PX)");

/// What one attempt to take a Redis lock found.
enum Attempt {
    Taken,
    Busy,
    Unknown(String),
}

/// Try `attempt` until it takes the lock, sleeping `retry` between tries, for at most `acquire_timeout`
/// by the client's clock; then ask for a fencing token. The loop every single-instance recipe shares.
async fn spin<F, Fut>(ctx: &Ctx, params: &Params, redis: &impl RedisApi, mut attempt: F) -> Outcome<Grant>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt>,
{
    let (retry, budget) = (params.duration("retry"), params.duration("acquire_timeout"));
    let deadline = ctx.now_ms() + budget.as_millis() as i64;
    loop {
        match attempt().await {
            Attempt::Taken => return Outcome::Ok(fencing_token(redis).await),
            Attempt::Unknown(why) => return Outcome::Unknown(why),
            Attempt::Busy if ctx.now_ms() >= deadline => return Outcome::Fail("timed out waiting".into()),
            Attempt::Busy => ctx.sleep(retry).await,
        }
    }
}

/// One `SET lock <value> NX [PX ttl]`: taken, busy, or unknown when it timed out (it may have run).
async fn try_set_nx(redis: &impl RedisApi, value: &str, px_ms: Option<i64>) -> Attempt {
    match redis.set(LOCK_KEY, value, SetCondition::Nx, px_ms).await {
        Ok(RedisReply::Ok) => Attempt::Taken,
        Ok(_) => Attempt::Busy,
        Err(_) => Attempt::Unknown("SET NX timed out".into()),
    }
}

/// `INCR lock:fence` after taking the lock: a token larger than every earlier holder's, as long as the
/// counter itself survives. A lost reply leaves the holder without a token.
async fn fencing_token(redis: &impl RedisApi) -> Grant {
    match redis.incr(FENCE_KEY).await {
        Ok(RedisReply::Int(n)) => Grant { token: Some(n as u64) },
        _ => Grant { token: None },
    }
}

/// A release's outcome from the reply of DEL or compare-and-delete.
fn released(reply: Result<RedisReply, CallError>) -> Outcome<()> {
    match reply {
        Ok(RedisReply::Int(1)) => Outcome::Ok(()),
        Ok(RedisReply::Int(_)) => Outcome::Fail("the lock key was not ours any more".into()),
        Ok(other) => Outcome::Fail(format!("unexpected reply {other:?}")),
        Err(CallError::Timeout) => Outcome::Unknown("release timed out".into()),
        Err(CallError::Broken) => Outcome::Unknown("connection broken after the release was sent".into()),
        Err(CallError::Reset) => Outcome::Fail("connection reset".into()),
    }
}

/// Redis refuses `PX 0` ("invalid expire time"): a key's TTL must be at least a millisecond.
fn positive_ttl(recipe: &Params) -> Result<(), String> {
    for name in ["ttl", "watchdog_timeout"] {
        if recipe.has(name) && recipe.duration(name).as_millis() == 0 {
            return Err(format!("{name} must be at least 1ms (Redis refuses PX 0: invalid expire time)"));
        }
    }
    Ok(())
}

/// A random lock value identifying this acquisition (a UUID in real clients).
fn lock_value(ctx: &Ctx) -> String {
    format!("{:016x}", ctx.random_u64())
}

/// A recipe that needs exactly one master.
fn one_master(recipe: &Params, backend: &Params) -> Result<(), String> {
    positive_ttl(recipe)?;
    sentinel_settings(backend)?;
    match backend.int("masters") {
        1 => Ok(()),
        n => Err(format!(
            "this recipe uses one Redis master, but [backend] masters = {n} (several masters are for redis.redlock)"
        )),
    }
}
