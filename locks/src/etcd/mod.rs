//! The etcd family: the client trait recipes speak, sessions (a lease kept alive), the deployment, and
//! the recipes.
//!
//! Recipes talk to etcd through [`EtcdApi`], whose methods mirror clientv3's calls (Txn, Get, Delete,
//! Grant, Revoke, Watch, KeepAlive). The simulated client library (`locksim_sim::backend::etcd::client`)
//! keeps leases alive as clientv3's lessor does.
//!
//! When is a held lock lost? `lost_on` chooses what the holder's code listens for: `"never"` (the
//! common case: nothing reads the keep-alive channel or `Session.Done()`), or `"keepalive"` (the holder
//! stops when its lease's keep-alive stops — the server said the lease expired, or no answer came for a
//! TTL).

mod election;
pub mod gateway;
pub mod http;
mod mutex;
pub mod real;
mod txn_lease;

pub use election::observe;

use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Family, Outcome, RealServer, Servers};
use locksim_sim::backend::etcd::client::{ClientEnv, EtcdClient, KeepAlive, Router, Watcher};
use locksim_sim::backend::etcd::{
    cluster, Compare, EtcdError, EtcdReply, EtcdRequest, EtcdState, EventType, KeyValue, LeaseId, Op, OpResult, Range,
    EXPIRY_CHECK,
};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;
use locksim_sim::history::{NodeIx, Recorder};
use locksim_sim::net::CallError;
use locksim_sim::world::{Program, World};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const RECIPES: &[crate::RecipeSpec] = &[txn_lease::FAIL_FAST, txn_lease::WAIT, mutex::RECIPE, election::RECIPE];

/// The etcd members of one world (one, or a cluster's), and where their clients record the end of
/// their keep-alives.
#[derive(Clone, Debug)]
pub struct EtcdServers {
    pub servers: Vec<NodeIx>,
    recorder: Recorder,
}

impl EtcdServers {
    /// The etcd servers among a world's servers (every recipe of this family is handed them).
    pub fn from(servers: &Servers) -> &EtcdServers {
        servers.sim()
    }

    /// The same world's servers with the `i`-th member alone as endpoint: a client that stays on one
    /// member (ensemble conformance reads each member on its own).
    pub fn pinned(servers: &Servers, i: usize) -> Servers {
        let etcd = EtcdServers::from(servers);
        Servers::new(EtcdServers { servers: vec![etcd.servers[i]], recorder: etcd.recorder.clone() })
    }
}

/// `[backend]` keys of the etcd family.
pub const BACKEND_PARAMS: &[ParamSpec] = &[
    ParamSpec::int(
        "servers",
        (1, 7),
        1,
        "members of the cluster: 1 is a single member; 3, 5 or 7 elect a leader by Raft (docs/ensembles.md)",
    ),
    ParamSpec {
        name: "version",
        kind: ParamKind::Choice(&["3.5.28", "3.5.13", "3.5.12"]),
        default: ParamValue::Choice("3.5.28"),
        doc: "a cluster's etcd release where they differ: up to 3.5.27 a read index is asked again under \
              the same id, and an acknowledgement of an old heartbeat can confirm it: a stale read on a \
              leader that was paused (etcd#20418); up to 3.5.12 a leader stuck after losing its leadership also goes on \
              renewing leases (etcd#15247)",
    },
];

pub static FAMILY: Family = Family {
    name: "etcd",
    summary: "etcd 3.5: MVCC revisions, transactions, leases expiring by the server clock, watches",
    params: BACKEND_PARAMS,
    topology,
    deploy,
    real: Some(&REAL),
    // A cluster's members mark `stale-read` (`cluster.rs`).
    marks: |h| crate::LEASE_HAZARDS.contains(&h) || h == locksim_sim::hazard::Hazard::StaleRead,
};

/// etcd (Debian 12 `etcd-server`, 3.4; or a 3.5 binary from PyPI): one member, or a cluster of
/// `[backend] servers` members (each client spreads its calls over them); its store and leases
/// outlive a crash (the WAL).
pub static REAL: RealServer = RealServer {
    name: "etcd",
    node: "etcd-0",
    env: "LOCKSIM_ETCD",
    package: "etcd-server",
    client_built: true,
    refuses: |_| Ok(()),
    keeps_data: |_| true,
    address: RealServer::host_port,
};

/// What a fault may name in a cluster besides its members' names.
const ROLES: &[(&str, &str)] = &[("leader", "the member leading the cluster when the fault starts")];

fn topology(params: &Params) -> Topology {
    match params.int("servers") {
        1 => Topology { servers: vec![REAL.node.into()], ..Topology::default() },
        n => {
            let servers: Vec<String> = (0..n).map(|i| format!("etcd-{i}")).collect();
            let members: Vec<String> =
                servers.iter().cloned().chain(ROLES.iter().map(|(role, _)| role.to_string())).collect();
            Topology {
                servers,
                roles: ROLES.to_vec(),
                stallable: members.clone(),
                laggable: members,
                ..Topology::default()
            }
        }
    }
}

fn deploy(world: &mut World, params: &Params) -> Servers {
    let n = params.int("servers") as usize;
    if n > 1 {
        let version = match params.choice("version") {
            "3.5.12" => cluster::Version::V3_5_12,
            "3.5.13" => cluster::Version::V3_5_13,
            _ => cluster::Version::V3_5_28,
        };
        return deploy_cluster(world, n, version);
    }
    // A single-member cluster; its store and leases outlive a crash (the WAL).
    let state = Arc::new(Mutex::new(EtcdState::default()));
    let program: Program = Arc::new(move |env| {
        let state = state.clone();
        {
            let mut etcd = state.lock().expect("etcd lock");
            let now_ms = env.clock.monotonic_ms();
            if env.incarnation > 0 {
                etcd.recover(now_ms);
            }
            etcd.start_lessor(now_ms + env.timer_start(EXPIRY_CHECK).as_millis() as i64);
        }
        Box::pin(async move {
            let rpc = env.rpc();
            locksim_sim::backend::serve(state, &rpc, &env.clock, &env.recorder).await
        })
    });
    let server = world.add_server(REAL.node, program);
    Servers::new(EtcdServers { servers: vec![server], recorder: world.recorder().clone() })
}

/// A cluster of `n` members (`etcd-0` …) and its role for faults.
fn deploy_cluster(world: &mut World, n: usize, version: cluster::Version) -> Servers {
    let (servers, states) = cluster::deploy(world, n, version);
    let nodes = servers.clone();
    world.set_roles(Box::new(move |role, _| {
        (role == "leader").then(|| {
            // The leader of the highest term: a deposed one may not know yet.
            let leading = |i: &usize| {
                let m = states[*i].lock().expect("etcd member lock");
                m.leads().then(|| m.term())
            };
            let leader = (0..nodes.len()).filter_map(|i| leading(&i).map(|term| (term, i))).max();
            leader.map(|(_, i)| nodes[i]).ok_or_else(|| "the cluster has no leader".to_string())
        })
    }));
    Servers::new(EtcdServers { servers, recorder: world.recorder().clone() })
}

/// Why a call did not succeed: no answer in time (it may have been applied), or an etcd error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// No answer in time, or the connection broke after the request went through: it may have been
    /// applied.
    Timeout,
    /// The connection was reset (the server restarted): the call was not applied.
    Unavailable,
    Etcd(EtcdError),
}

impl Failed {
    /// As a lock outcome of the call `what` (its name opens the reason): a timeout leaves the call's
    /// effect unknown (`Unknown`); a reset connection (not applied) and an etcd error are `Fail`. The
    /// counterpart of [`crate::sql::outcome`].
    pub fn outcome<T>(self, what: &str) -> Outcome<T> {
        match self {
            Failed::Timeout => Outcome::Unknown(format!("{what}: timed out")),
            Failed::Unavailable => Outcome::Fail(format!("{what}: unavailable (the server restarted)")),
            Failed::Etcd(e) => Outcome::Fail(format!("{what}: {e:?}")),
        }
    }
}

/// What a transaction answered.
pub struct TxnResult {
    pub succeeded: bool,
    /// The store's revision after it (the response header's).
    pub revision: i64,
    pub results: Vec<OpResult>,
}

/// An etcd client's calls.
#[async_trait(?Send)]
pub trait EtcdApi {
    async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError>;
    async fn watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<Watcher, CallError>;
    fn keep_alive(&self, lease: LeaseId, ttl: Duration) -> KeepAlive;

    async fn call(&self, request: EtcdRequest) -> Result<EtcdReply, Failed> {
        match self.request(request).await {
            Ok(EtcdReply::Error(e)) => Err(Failed::Etcd(e)),
            Ok(reply) => Ok(reply),
            // A connection broken after the request went through: applied or not, as after a timeout.
            Err(CallError::Timeout | CallError::Broken) => Err(Failed::Timeout),
            Err(CallError::Reset) => Err(Failed::Unavailable),
        }
    }

    async fn txn(&self, compare: Vec<Compare>, success: Vec<Op>, failure: Vec<Op>) -> Result<TxnResult, Failed> {
        match self.call(EtcdRequest::Txn { compare, success, failure }).await? {
            EtcdReply::Txn { revision, succeeded, results } => Ok(TxnResult { succeeded, revision, results }),
            other => unreachable!("txn answered with {other:?}"),
        }
    }

    /// `Get`: the keys and the store's revision.
    async fn get(&self, range: Range) -> Result<(Vec<KeyValue>, i64), Failed> {
        match self.call(EtcdRequest::Op(Op::Range(range))).await? {
            EtcdReply::Op { revision, result: OpResult::Range { kvs, .. } } => Ok((kvs, revision)),
            other => unreachable!("get answered with {other:?}"),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), Failed> {
        self.call(EtcdRequest::Op(Op::Delete { key: key.into(), prefix: false })).await.map(drop)
    }

    /// `Grant`: the lease and its TTL in whole seconds.
    async fn grant(&self, ttl: Duration) -> Result<(LeaseId, Duration), Failed> {
        let ttl_s = ttl.as_secs().max(1) as i64;
        match self.call(EtcdRequest::LeaseGrant { ttl_s }).await? {
            EtcdReply::LeaseGranted { id, ttl_s } => Ok((id, Duration::from_secs(ttl_s as u64))),
            other => unreachable!("grant answered with {other:?}"),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), Failed> {
        self.call(EtcdRequest::LeaseRevoke { id: lease }).await.map(drop)
    }
}

#[async_trait(?Send)]
impl EtcdApi for EtcdClient {
    async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError> {
        EtcdClient::request(self, request).await
    }

    async fn watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<Watcher, CallError> {
        EtcdClient::watch(self, key, prefix, start_revision).await
    }

    fn keep_alive(&self, lease: LeaseId, ttl: Duration) -> KeepAlive {
        EtcdClient::keep_alive(self, lease, ttl)
    }
}

/// A recipe's etcd client: of the simulated server, or (real mode) of a real one. Enum dispatch: the
/// simulated path stays as direct as before.
#[derive(Clone)]
pub enum EtcdConn {
    Sim(EtcdClient),
    Real(real::RealEtcd),
}

#[async_trait(?Send)]
impl EtcdApi for EtcdConn {
    async fn request(&self, request: EtcdRequest) -> Result<EtcdReply, CallError> {
        match self {
            EtcdConn::Sim(sim) => sim.request(request).await,
            EtcdConn::Real(real) => real.request(request).await,
        }
    }

    async fn watch(&self, key: &str, prefix: bool, start_revision: i64) -> Result<Watcher, CallError> {
        match self {
            EtcdConn::Sim(sim) => sim.watch(key, prefix, start_revision).await,
            EtcdConn::Real(real) => real.watch(key, prefix, start_revision).await,
        }
    }

    fn keep_alive(&self, lease: LeaseId, ttl: Duration) -> KeepAlive {
        match self {
            EtcdConn::Sim(sim) => sim.keep_alive(lease, ttl),
            EtcdConn::Real(real) => real.keep_alive(lease, ttl),
        }
    }
}

/// Parameters every etcd recipe shares; a user's recipe may list them in its `params` too.
pub const TTL: ParamSpec =
    ParamSpec::duration("ttl", 5_000, "lease TTL in whole seconds (etcd grants at least 2s); kept alive every TTL/3");
pub const ACQUIRE_TIMEOUT: ParamSpec =
    ParamSpec::duration("acquire_timeout", 30_000, "give up waiting after this long (the request context)");
pub const CALL_TIMEOUT: ParamSpec =
    ParamSpec::duration("call_timeout", 5_000, "deadline of each call; a call that passes it may have been applied");
pub const ENDPOINTS: ParamSpec = ParamSpec {
    name: "endpoints",
    kind: ParamKind::Choice(&["all", "one"]),
    default: ParamValue::Choice("all"),
    doc: "the cluster's members the client is given: all (clientv3 spreads its calls over them) or one, \
          drawn from the seed (a client given one endpoint, or an address in front of the cluster)",
};
pub const LOST_ON: ParamSpec = ParamSpec {
    name: "lost_on",
    kind: ParamKind::Choice(&["never", "keepalive"]),
    default: ParamValue::Choice("never"),
    doc: "when the holder treats the lock as lost: never, or when its lease's keep-alive stops",
};

/// A lease TTL must be whole seconds, as etcd grants them: a `validate` for recipes with [`TTL`].
pub fn whole_seconds(recipe: &Params, _: &Params) -> Result<(), String> {
    let ttl = recipe.duration("ttl");
    if ttl.is_zero() || ttl.subsec_nanos() != 0 {
        return Err(format!("ttl: etcd leases last whole seconds, at least 1s; found {}ms", ttl.as_millis()));
    }
    Ok(())
}

/// A client of this world's etcd from `ctx`'s node (or, in real mode, of the real server), given every
/// member, whose calls wait up to `call_timeout`.
pub fn connect(ctx: &Ctx, servers: &Servers, call_timeout: Duration) -> EtcdConn {
    open(ctx, servers, call_timeout, false)
}

/// [`connect`] as a recipe's parameters say: its [`CALL_TIMEOUT`] and [`ENDPOINTS`].
pub fn connect_as(ctx: &Ctx, servers: &Servers, params: &Params) -> EtcdConn {
    open(ctx, servers, params.duration("call_timeout"), params.choice("endpoints") == "one")
}

fn open(ctx: &Ctx, servers: &Servers, call_timeout: Duration, one: bool) -> EtcdConn {
    if let Servers::Real(real) = servers {
        let endpoints: Vec<String> = real.of(&REAL).split(',').map(str::to_string).collect();
        let (first, given) = given(ctx, &endpoints, one);
        return EtcdConn::Real(real::RealEtcd::new(ctx.clone(), given.into(), first, call_timeout));
    }
    let etcd = EtcdServers::from(servers);
    let router = ctx.node_wide(|| {
        let connection = ctx.random_u64();
        let (first, given) = given(ctx, &etcd.servers, one);
        Router::new(connection, given.into(), first)
    });
    let env = ClientEnv {
        rpc: ctx.rpc().clone(),
        clock: ctx.clock().clone(),
        recorder: etcd.recorder.clone(),
        server: etcd.servers[0],
        router,
    };
    EtcdConn::Sim(EtcdClient::new(env, call_timeout))
}

/// The endpoints a client node is given of a cluster's (`one`: one of them), and the one its calls
/// start on: drawn from the seed, so that each client node starts on a member of its own (one
/// member: no draw).
fn given<T: Clone>(ctx: &Ctx, endpoints: &[T], one: bool) -> (usize, Vec<T>) {
    let n = endpoints.len();
    let first = if n > 1 { (ctx.random_u64() % n as u64) as usize } else { 0 };
    match one {
        true => (0, vec![endpoints[first].clone()]),
        false => (first, endpoints.to_vec()),
    }
}

/// A lease kept alive: clientv3's `concurrency.Session`. The end of its keep-alive is recorded in the
/// history as a `Session` event. To test two lock objects on one session (as `concurrency.NewMutex(s,
/// …)` twice with one `s`), share it: `Rc<Session>`.
pub struct Session {
    pub lease: LeaseId,
    keep_alive: KeepAlive,
}

impl Session {
    /// `NewSession`: grant a lease of `ttl` (whole seconds) and keep it alive every TTL/3.
    pub async fn new(etcd: &impl EtcdApi, ttl: Duration) -> Result<Session, Failed> {
        let (lease, ttl) = etcd.grant(ttl).await?;
        Ok(Session { lease, keep_alive: etcd.keep_alive(lease, ttl) })
    }

    /// Whether its keep-alive has stopped (`Session.Done()` is closed).
    pub fn done(&self) -> bool {
        self.keep_alive.has_stopped()
    }

    /// Resolves, with the reason, when its keep-alive stops (`<-Session.Done()`): the server said the
    /// lease expired, or no answer came for a TTL.
    pub async fn stopped(&self) -> String {
        format!("lease keep-alive stopped: {}", self.keep_alive.stopped().await)
    }

    /// Resolves, with the reason, when the holder must treat its lock as lost by `lost_on`.
    async fn lost(&self, params: &Params) -> String {
        match params.choice("lost_on") {
            "keepalive" => self.stopped().await,
            _ => std::future::pending().await,
        }
    }
}

/// `Lock::lost` of a recipe whose grant lives in `session`: only a holder listens.
async fn lost_while_held<T>(held: &Option<T>, session: &Option<Session>, params: &Params) -> String {
    match (held, session) {
        (Some(_), Some(session)) => session.lost(params).await,
        _ => std::future::pending().await,
    }
}

/// The session a client reuses across acquisitions, replaced once its lease is gone.
async fn live_session(slot: &mut Option<Session>, etcd: &impl EtcdApi, ttl: Duration) -> Result<(), Failed> {
    if slot.as_ref().is_none_or(Session::done) {
        *slot = Some(Session::new(etcd, ttl).await?);
    }
    Ok(())
}

/// clientv3 `concurrency.waitDeletes`: wait until no key under `prefix` created at or before
/// `max_create` is left — each time watching the newest such key for its deletion.
pub async fn wait_deletes(etcd: &impl EtcdApi, prefix: &str, max_create: i64) -> Result<(), Failed> {
    loop {
        let (kvs, revision) = etcd.get(Range::last_created_by(prefix, max_create)).await?;
        let Some(last) = kvs.first() else { return Ok(()) };
        wait_delete(etcd, &last.key, revision).await?;
    }
}

/// clientv3 `concurrency.waitDelete`: watch `key` from `revision` until it is deleted.
pub async fn wait_delete(etcd: &impl EtcdApi, key: &str, revision: i64) -> Result<(), Failed> {
    let mut watcher = etcd.watch(key, false, revision).await.map_err(|_| Failed::Timeout)?;
    while let Some(response) = watcher.next().await {
        if response.events.iter().any(|e| e.kind == EventType::Delete) {
            return Ok(());
        }
    }
    Err(Failed::Timeout)
}
