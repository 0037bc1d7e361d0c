//! The ZooKeeper family: the client trait recipes speak, sessions, the deployment, and the recipes.
//!
//! Recipes talk to ZooKeeper through [`ZkApi`], whose methods mirror the ZooKeeper client's calls
//! (create, delete, exists, getData, getChildren, with watches). The simulated client library
//! (`locksim_sim::backend::zk::client`) keeps the session alive, and a recipe opens a new session when
//! its old one has expired, as Curator does.
//!
//! When is a held lock lost? `lost_on` chooses what the holder's application listens for:
//! - `"never"`: nothing (InterProcessMutex used without a ConnectionStateListener);
//! - `"suspended"`: the first disconnection (Curator's documented advice: SUSPENDED means the lock may be
//!   gone), 2/3·T after the last word from the server — before the server can expire the session;
//! - `"lost"`: only LOST — expiry learned on reconnect, or Curator 3's simulated expiry T after
//!   SUSPENDED — which leaves a window of about 2/3·T in which another client may hold the lock.

#[cfg(test)]
mod client_tests;
mod ephemeral;
pub mod jute;
mod leader;
pub mod real;
mod rwlock;
mod semaphore;
mod sequential;

use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Family, RealServer, Servers};
use locksim_sim::backend::zk::client::{ClientEnv, ClientError, ConnState, Host, Library, Router, Watch, ZkClient};
use locksim_sim::backend::zk::{ensemble, CreateMode, SessionId, Stat, TxnOp, ZkError, ZkOp, ZkReply, ZkState};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;
use locksim_sim::hazard::Hazard;
use locksim_sim::history::{NodeIx, Recorder};
use locksim_sim::rng::Stream;
use locksim_sim::world::{Program, World};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;

pub const RECIPES: &[crate::RecipeSpec] = &[
    ephemeral::RECIPE,
    sequential::PROTECTED,
    sequential::UNPROTECTED,
    rwlock::RECIPE,
    semaphore::RECIPE,
    leader::RECIPE,
];

/// The ZooKeeper servers of one world (a standalone server, or an ensemble's), and where its clients
/// record their session changes.
#[derive(Clone, Debug)]
pub struct ZkServers {
    pub servers: Vec<NodeIx>,
    recorder: Recorder,
}

impl ZkServers {
    /// The ZooKeeper servers among a world's servers (every recipe of this family is handed them).
    pub fn from(servers: &Servers) -> &ZkServers {
        servers.sim()
    }

    /// The same world's servers with a connect string of the `i`-th alone: a client that stays on one
    /// member (ensemble conformance cuts that member off from its leader).
    pub fn pinned(servers: &Servers, i: usize) -> Servers {
        let zk = ZkServers::from(servers);
        Servers::new(ZkServers { servers: vec![zk.servers[i]], recorder: zk.recorder.clone() })
    }
}

/// `[backend]` keys of the ZooKeeper family.
pub const BACKEND_PARAMS: &[ParamSpec] = &[
    ParamSpec::duration(
        "tick_time",
        2_000,
        "the server's tickTime: sessions expire on its ticks, timeouts are negotiated into 2..20 ticks",
    ),
    ParamSpec::int(
        "servers",
        (1, 7),
        1,
        "servers in the ensemble: 1 is a standalone server; 3, 5 or 7 elect a leader (docs/ensembles.md)",
    ),
    ParamSpec::int(
        "sync_limit",
        (1, 100),
        5,
        "an ensemble's syncLimit: ticks a follower and its leader may go without hearing from each other",
    ),
    ParamSpec::int(
        "init_limit",
        (1, 100),
        10,
        "an ensemble's initLimit: ticks a follower has to connect to and sync with a new leader",
    ),
    ParamSpec::duration(
        "apply_lag",
        0,
        "an ensemble's apply lag: how late a follower applies each commit, and answers what waited for it",
    ),
];

pub static FAMILY: Family = Family {
    name: "zk",
    summary: "ZooKeeper 3.8: znodes, ephemeral and sequential nodes, one-shot watches, sessions expiring on ticks",
    params: BACKEND_PARAMS,
    topology,
    deploy,
    real: Some(&REAL),
    marks: |h| crate::LEASE_HAZARDS.contains(&h) || h == Hazard::WatchFiredWhileDisconnected,
};

/// The tickTime of the ZooKeeper real mode and conformance start (their `zoo.cfg`): sessions are
/// negotiated into [400 ms, 4 s].
pub const REAL_TICK: Duration = Duration::from_millis(200);

/// ZooKeeper 3.8 (Debian 12 `zookeeper`): standalone, with tickTime [`REAL_TICK`], or an ensemble of
/// `[backend] servers` with the ensemble's `tick_time`, `sync_limit` and `init_limit`; its data outlives
/// a crash (the transaction log).
pub static REAL: RealServer = RealServer {
    name: "zookeeper",
    node: "zk-0",
    env: "LOCKSIM_ZOOKEEPER",
    package: "zookeeper",
    client_built: true,
    refuses: |backend| match backend.duration("tick_time") {
        _ if !backend.duration("apply_lag").is_zero() => {
            Err("with [backend] apply_lag: a real server applies each commit as fast as it can".into())
        }
        // An ensemble's members are started with its [backend] timing.
        _ if backend.int("servers") > 1 => Ok(()),
        tick if tick == REAL_TICK => Ok(()),
        tick => Err(format!(
            "with [backend] tick_time = {}ms: --real starts ZooKeeper with tickTime {}ms (standalone; an \
             ensemble is started with its [backend] timing), which bounds the sessions it grants (2 to 20 ticks); \
             set [backend] tick_time = \"{}ms\" so that the simulated and the real server negotiate the same \
             session timeout",
            tick.as_millis(),
            REAL_TICK.as_millis(),
            REAL_TICK.as_millis()
        )),
    },
    keeps_data: |_| true,
    address: RealServer::host_port,
};

/// What a fault may name in an ensemble besides its servers' names.
const ROLES: &[(&str, &str)] = &[
    ("leader", "the server leading the ensemble when the fault starts"),
    ("holder-server", "the server the lock holder's session is on when the fault starts"),
];

fn topology(params: &Params) -> Topology {
    match params.int("servers") {
        1 => Topology { servers: vec![REAL.node.into()], ..Topology::default() },
        n => {
            let servers: Vec<String> = (0..n).map(|i| format!("zk-{i}")).collect();
            // A leader applies at its commit: a lag on it tells only once it follows.
            let laggable = servers.iter().cloned().chain(["holder-server".to_string()]).collect();
            Topology { servers, roles: ROLES.to_vec(), laggable, ..Topology::default() }
        }
    }
}

fn deploy(world: &mut World, params: &Params) -> Servers {
    let n = params.int("servers") as usize;
    if n > 1 {
        return deploy_ensemble(world, params, n);
    }
    let tick = params.duration("tick_time");
    // A single-server ensemble. Its state outlives a crash: ZooKeeper logs each transaction to disk
    // before acknowledging it, and a restarted server recovers tree and sessions from the log.
    let state = Arc::new(Mutex::new(ZkState::new(tick)));
    let program: Program = Arc::new(move |env| {
        let state = state.clone();
        if env.incarnation > 0 {
            state.lock().expect("zk lock").recover(env.clock.monotonic_ms());
        }
        Box::pin(async move {
            let rpc = env.rpc();
            locksim_sim::backend::serve(state, &rpc, &env.clock, &env.recorder).await
        })
    });
    let server = world.add_server(REAL.node, program);
    Servers::new(ZkServers { servers: vec![server], recorder: world.recorder().clone() })
}

/// An ensemble of `n` servers (`zk-0` …), and its roles for faults.
fn deploy_ensemble(world: &mut World, params: &Params, n: usize) -> Servers {
    let timing = ensemble::Timing {
        tick_ms: params.duration("tick_time").as_millis() as i64,
        init_limit: params.int("init_limit"),
        sync_limit: params.int("sync_limit"),
        apply_lag_ms: params.duration("apply_lag").as_millis() as i64,
    };
    let (servers, states) = ensemble::deploy(world, n, timing);
    let nodes = servers.clone();
    world.set_roles(Box::new(move |role, holders| {
        let found = |f: &dyn Fn(&ensemble::ZkMember) -> bool| {
            states.iter().position(|s| f(&s.lock().expect("zk lock"))).map(|i| nodes[i])
        };
        Some(match role {
            "leader" => found(&|m| m.leads()).ok_or_else(|| "the ensemble has no leader".to_string()),
            "holder-server" => match holders.first() {
                None => Err("nobody held the lock".to_string()),
                Some(holder) => {
                    found(&|m| m.serves(*holder)).ok_or_else(|| "the holder is connected nowhere".to_string())
                }
            },
            _ => return None,
        })
    }));
    Servers::new(ZkServers { servers, recorder: world.recorder().clone() })
}

/// A ZooKeeper client's calls, as the Java client's (`org.apache.zookeeper.ZooKeeper`) and Curator's.
/// Implement [`ZkApi::call`] and the rest follow; [`ZkClient`] (one session) and [`ZkSession`] (the
/// live session of a handle) implement it. A failed call is `ClientError::Zk` (the server's
/// `KeeperException` code) or `ClientError::ConnectionLoss` (no answer within 2/3 of the session
/// timeout: the request may have been applied).
#[async_trait(?Send)]
pub trait ZkApi {
    /// Run one operation; watches come back with the reply that set them.
    async fn call(&self, op: ZkOp) -> Result<(ZkReply, Option<Watch>), ClientError>;

    async fn create(&self, path: &str, mode: CreateMode) -> Result<(String, Stat), ClientError> {
        match self.call(ZkOp::Create { path: path.into(), data: String::new(), mode }).await? {
            (ZkReply::Created { path, stat }, _) => Ok((path, stat)),
            other => unreachable!("create answered with {other:?}"),
        }
    }

    async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.call(ZkOp::Delete { path: path.into(), version: -1 }).await.map(drop)
    }

    /// `setData` at any version: the node's new stat.
    async fn set_data(&self, path: &str, data: &str) -> Result<Stat, ClientError> {
        match self.call(ZkOp::SetData { path: path.into(), data: data.into(), version: -1 }).await? {
            (ZkReply::DataSet(stat), _) => Ok(stat),
            other => unreachable!("setData answered with {other:?}"),
        }
    }

    /// `exists` without a watch: the node's stat, if any.
    async fn exists(&self, path: &str) -> Result<Option<Stat>, ClientError> {
        match self.call(ZkOp::Exists { path: path.into(), watch: false }).await? {
            (ZkReply::Exists(stat), _) => Ok(stat),
            other => unreachable!("exists answered with {other:?}"),
        }
    }

    /// `exists` with a watch: the node's stat (if any) and the watch.
    async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch), ClientError> {
        match self.call(ZkOp::Exists { path: path.into(), watch: true }).await? {
            (ZkReply::Exists(stat), Some(watch)) => Ok((stat, watch)),
            other => unreachable!("exists answered with {other:?}"),
        }
    }

    /// `getData` with a watch (NoNode if it is gone).
    async fn get_data_watch(&self, path: &str) -> Result<Watch, ClientError> {
        match self.call(ZkOp::GetData { path: path.into(), watch: true }).await? {
            (ZkReply::Data { .. }, Some(watch)) => Ok(watch),
            other => unreachable!("getData answered with {other:?}"),
        }
    }

    /// `getChildren` with a watch on the list.
    async fn get_children_watch(&self, path: &str) -> Result<(Vec<String>, Watch), ClientError> {
        match self.call(ZkOp::GetChildren { path: path.into(), watch: true }).await? {
            (ZkReply::Children { children, .. }, Some(watch)) => Ok((children, watch)),
            other => unreachable!("getChildren answered with {other:?}"),
        }
    }

    /// `removeWatches(path, Any)`, quietly (Curator's `removeWatchers`): no watch left is no error.
    async fn remove_watches(&self, path: &str) -> Result<(), ClientError> {
        match self.call(ZkOp::RemoveWatches { path: path.into() }).await {
            Ok(_) | Err(ClientError::Zk(ZkError::NoWatcher)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `multi`: the writes applied together in one transaction, each one's reply; or, nothing applied,
    /// the first failing operation's error (as the Java client's `KeeperException`; its index is in
    /// [`ZkReply::Multi`] from [`ZkApi::call`]).
    async fn multi(&self, ops: Vec<TxnOp>) -> Result<Vec<ZkReply>, ClientError> {
        match self.call(ZkOp::Multi(ops)).await? {
            (ZkReply::Multi(Ok(replies)), _) => Ok(replies),
            (ZkReply::Multi(Err((_, e))), _) => Err(ClientError::Zk(e)),
            other => unreachable!("multi answered with {other:?}"),
        }
    }

    /// `sync(path)`: a read after it sees every write the server accepted before it.
    async fn sync(&self, path: &str) -> Result<(), ClientError> {
        self.call(ZkOp::Sync { path: path.into() }).await.map(drop)
    }

    async fn get_children(&self, path: &str) -> Result<Vec<String>, ClientError> {
        match self.call(ZkOp::GetChildren { path: path.into(), watch: false }).await? {
            (ZkReply::Children { children, .. }, _) => Ok(children),
            other => unreachable!("getChildren answered with {other:?}"),
        }
    }

    /// The id of the session calls go to (`ZooKeeper.getSessionId()`; through Curator,
    /// `getZookeeperClient().getZooKeeper().getSessionId()`, which first waits for a connection): the
    /// same across re-attaches, another once the session has expired and a new one is open. `None`: no
    /// session could be opened — or an implementation that does not know (the default).
    async fn session_id(&self) -> Option<SessionId> {
        None
    }
}

#[async_trait(?Send)]
impl ZkApi for ZkClient {
    async fn call(&self, op: ZkOp) -> Result<(ZkReply, Option<Watch>), ClientError> {
        ZkClient::call(self, op).await
    }

    /// This client's one session (see [`ZkClient::session_id`]).
    async fn session_id(&self) -> Option<SessionId> {
        Some(ZkClient::session_id(self))
    }
}

/// Parameters every ZooKeeper recipe shares; a user's recipe may list them in its `params` too.
pub const SESSION_TIMEOUT: ParamSpec = ParamSpec::duration(
    "session_timeout",
    6_000,
    "requested session timeout T (Curator's default is 60s); the server negotiates it into 2..20 ticks",
);
pub const ACQUIRE_TIMEOUT: ParamSpec =
    ParamSpec::duration("acquire_timeout", 30_000, "give up waiting after this long, deleting our node");
pub const LOST_ON: ParamSpec = ParamSpec {
    name: "lost_on",
    kind: ParamKind::Choice(&["suspended", "lost", "never"]),
    default: ParamValue::Choice("suspended"),
    doc: "when the holder treats the lock as lost: first disconnection, session loss, or never",
};

/// The client library a Curator-style queue recipe runs on: `"curator"` (ZooKeeper's Java client and
/// Curator's `RetryLoop`), `"curator-4.0"` and `"curator-4.2"` (the same, with Curator's injected
/// expiry and its protected create across sessions, before and after CURATOR-498's fix), or `"kazoo"`
/// (kazoo 2.10: its connection handler, [`Library::Kazoo`], and its recipes' `KazooRetry`); see
/// [`Flavour`].
pub const CLIENT: ParamSpec = ParamSpec {
    name: "client",
    kind: ParamKind::Choice(&["curator", "curator-4.0", "curator-4.2", "kazoo"]),
    default: ParamValue::Choice("curator"),
    doc: "the client library: Curator on ZooKeeper's Java client; curator-4.0 / curator-4.2, whose handle opens a new session T after SUSPENDED and whose protected create finds its node across sessions (4.0 adopts the old session's node: CURATOR-498); or kazoo 2.10 (its pings, reconnects, retries, and LOST only on expiry)",
};

/// Which client library's rules a recipe follows around its calls, from its [`CLIENT`] parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// Curator on the Java client: `RetryLoop` waits up to 15 s for a connection, then
    /// `ExponentialBackoffRetry(1000, 3)`; LOST also T after SUSPENDED (Curator 3). Its handle keeps
    /// its session until the server says it expired (Curator's injected expiry is the 4.x flavours').
    Curator,
    /// Curator 4.0.x: as [`Flavour::Curator`], and when SUSPENDED has lasted the session timeout its
    /// `ConnectionStateManager` injects an expiry and the handle opens a new session
    /// ([`ZkSession::injecting_expiry`]). A protected create whose reply was lost is tried again on the
    /// handle's session of the moment, and takes any child with its GUID as its own — a node of the
    /// old session, which the server has not expired yet, included (CURATOR-498).
    Curator40,
    /// Curator 4.2.0 on: as [`Flavour::Curator40`], but the protected create remembers the session of
    /// its first attempt (`ProtectedMode.checkSetSessionId`) and, finding its node after the session
    /// changed, deletes it in the background and creates another (`ProtectedMode.validateFoundNode`:
    /// CURATOR-498's fix).
    Curator42,
    /// kazoo: no wait for a connection (a request made while disconnected is queued by the client);
    /// `KazooRetry(max_tries=None)` (`Lock._retry`, `KazooClient.retry`): 0.1 s × uniform(0.6, 1.4),
    /// doubling, at most 60 s; LOST only when the session expired.
    Kazoo,
}

impl Flavour {
    /// The flavour a recipe's parameters choose (Curator where the recipe has no [`CLIENT`]).
    pub fn of(params: &Params) -> Flavour {
        match params.has("client").then(|| params.choice("client")) {
            Some("kazoo") => Flavour::Kazoo,
            Some("curator-4.0") => Flavour::Curator40,
            Some("curator-4.2") => Flavour::Curator42,
            _ => Flavour::Curator,
        }
    }

    /// The client library sessions speak.
    pub fn library(self) -> Library {
        match self {
            Flavour::Curator | Flavour::Curator40 | Flavour::Curator42 => Library::Java,
            Flavour::Kazoo => Library::Kazoo,
        }
    }

    /// Whether the handle opens a new session when SUSPENDED has lasted the session timeout.
    pub fn injects_expiry(self) -> bool {
        matches!(self, Flavour::Curator40 | Flavour::Curator42)
    }
}

/// A session timeout of zero cannot keep a session: a `validate` for recipes with [`SESSION_TIMEOUT`].
pub fn positive_session(recipe: &Params, _: &Params) -> Result<(), String> {
    match recipe.duration("session_timeout") {
        d if d.is_zero() => Err("session_timeout must be above zero".into()),
        _ => Ok(()),
    }
}

/// A client's ZooKeeper connection as a lock holds it — Curator's `CuratorFramework`: one session at a
/// time, opened on first use and opened anew once the old one has expired. Its session's state changes
/// (connected, disconnected, reconnected, expired) are recorded in the history as `Session` events, as
/// for the built-in recipes.
///
/// Clones share the session: give two lock objects of one client clones of one `ZkSession` to test
/// code where both live on one ZooKeeper handle (one expiry loses both locks). Make several with
/// [`ZkSession::new`] for a client with several sessions. It also speaks [`ZkApi`] itself: each call
/// goes to the live session (Curator's `getZooKeeper()`), failing with `ConnectionLoss` when no session
/// can be opened.
#[derive(Clone)]
pub struct ZkSession {
    host: Host,
    requested: Duration,
    /// The client library its sessions behave as (the Java client's, unless [`ZkSession::speaking`]).
    library: Library,
    /// Held across a connect, so that two users of one handle never open two sessions.
    client: Rc<AsyncMutex<Option<ZkClient>>>,
    /// Curator's injected expiry, when the handle has it ([`ZkSession::injecting_expiry`]).
    injector: Option<Rc<Injector>>,
}

/// What a handle with Curator's injected expiry keeps: where its watches run, and the watch on each
/// session it opened (one at a time but for the moment a watch hands over to the next).
struct Injector {
    ctx: Ctx,
    watches: std::cell::RefCell<Vec<locksim_sim::ctx::Background>>,
}

/// A [`ZkSession`] that an injector's watch holds without keeping the handle alive.
struct WeakSession {
    host: Host,
    requested: Duration,
    library: Library,
    client: std::rc::Weak<AsyncMutex<Option<ZkClient>>>,
    injector: std::rc::Weak<Injector>,
}

impl WeakSession {
    fn upgrade(&self) -> Option<ZkSession> {
        Some(ZkSession {
            host: self.host.clone(),
            requested: self.requested,
            library: self.library,
            client: self.client.upgrade()?,
            injector: Some(self.injector.upgrade()?),
        })
    }
}

/// Curator's `ConnectionStateManager.checkSessionExpiration` (Curator 3.0 on) for one session of a
/// handle: when SUSPENDED (the client `Disconnected`) has lasted the negotiated session timeout, it
/// injects an expiry ([`ZkClient::inject_expiry`]: the old session is abandoned, never closed on the
/// server), and Curator's `ConnectionState` answers the Expired event with `reset()`: a new ZooKeeper
/// handle that connects at once — here the handle's next session, tried every second until one opens.
async fn expire_when_suspended(ctx: Ctx, zk: ZkClient, handle: WeakSession) {
    let mut state = zk.state();
    loop {
        let now = *state.borrow_and_update();
        match now {
            ConnState::Expired => return,
            ConnState::Connected => {
                if state.changed().await.is_err() {
                    return;
                }
            }
            ConnState::Disconnected => {
                tokio::select! {
                    biased;
                    changed = state.changed() => if changed.is_err() { return },
                    () = ctx.sleep(zk.timeout()) => break,
                }
            }
        }
    }
    zk.inject_expiry();
    while let Some(handle) = handle.upgrade() {
        if handle.live().await.is_some() {
            return;
        }
        drop(handle);
        ctx.sleep(Duration::from_secs(1)).await;
    }
}

impl ZkSession {
    /// A handle on this world's ZooKeeper from `ctx`'s node, asking for sessions of `session_timeout`
    /// (the server negotiates it into 2..20 ticks). No session is opened until first used.
    pub fn new(ctx: &Ctx, servers: &Servers, session_timeout: Duration) -> ZkSession {
        let router = ctx.node_wide(|| Router::new(ctx.stream(Stream::ZkReattach)));
        let host = match servers {
            Servers::Real(real) => {
                let connect = real.of(&REAL);
                let servers: Rc<[NodeIx]> = (0..connect.split(',').count() as u32).map(NodeIx).collect();
                let link = Rc::new(real::RealZk::new(ctx.clone(), connect, router.clone()));
                Host::Real { ctx: ctx.clone(), link, router, servers }
            }
            _ => {
                let zk = ZkServers::from(servers);
                let env = ClientEnv {
                    rpc: ctx.rpc().clone(),
                    clock: ctx.clock().clone(),
                    recorder: zk.recorder.clone(),
                    server: zk.servers[0],
                    router,
                };
                Host::Sim(env, zk.servers.as_slice().into())
            }
        };
        ZkSession { host, requested: session_timeout, library: Library::Java, client: Rc::default(), injector: None }
    }

    /// The same handle, its sessions behaving as `library` (go-zookeeper's keep their watches across a
    /// disconnection).
    pub fn speaking(self, library: Library) -> ZkSession {
        ZkSession { library, ..self }
    }

    /// The same handle with Curator's injected expiry (Curator 3.0 on; [`Flavour::injects_expiry`]):
    /// a session whose client has been disconnected for the session timeout is given up without a word
    /// to the server, and the handle opens a new one (see `expire_when_suspended`). Without it a
    /// handle keeps its session until the server says it expired.
    pub fn injecting_expiry(self, ctx: &Ctx) -> ZkSession {
        let injector = Injector { ctx: ctx.clone(), watches: Default::default() };
        ZkSession { injector: Some(Rc::new(injector)), ..self }
    }

    /// A live session: the current one, or a new one if there is none or it has expired (`None`: the
    /// server did not answer within the session timeout). The `ZkClient` it hands out keeps that one
    /// session: hold on to it to watch its state (see [`lost`]); it never becomes a new session.
    pub async fn live(&self) -> Option<ZkClient> {
        let mut client = self.client.lock().await;
        if client.as_ref().is_none_or(ZkClient::expired) {
            *client = ZkClient::connect_as(self.host.clone(), self.requested, self.library).await;
            if let (Some(zk), Some(injector)) = (client.as_ref(), &self.injector) {
                let handle = WeakSession {
                    host: self.host.clone(),
                    requested: self.requested,
                    library: self.library,
                    client: Rc::downgrade(&self.client),
                    injector: Rc::downgrade(injector),
                };
                let watch = injector.ctx.spawn(expire_when_suspended(injector.ctx.clone(), zk.clone(), handle));
                let mut watches = injector.watches.borrow_mut();
                watches.retain(|w| !w.finished());
                watches.push(watch);
            }
        }
        client.clone()
    }

    /// The session now, if one was opened (it may have expired since).
    pub fn current(&self) -> Option<ZkClient> {
        self.client.try_lock().ok().and_then(|c| c.clone())
    }
}

#[async_trait(?Send)]
impl ZkApi for ZkSession {
    async fn call(&self, op: ZkOp) -> Result<(ZkReply, Option<Watch>), ClientError> {
        match self.live().await {
            Some(zk) => zk.call(op).await,
            None => Err(ClientError::ConnectionLoss),
        }
    }

    /// The live session's id, opening a session if there is none or it has expired (as Curator's
    /// `getZooKeeper()` waits for one): stable while the session lives, another after its expiry.
    async fn session_id(&self) -> Option<SessionId> {
        self.live().await.map(|zk| zk.session_id())
    }
}

/// Resolves, with the reason, when a holder whose lock lives in `client`'s session must treat it as lost
/// by `policy` — the values of [`LOST_ON`]: `"never"`, `"suspended"` (the first disconnection) or
/// `"lost"` (expiry, or Curator 3's simulated expiry after a session timeout of disconnection).
///
/// kazoo has no simulated expiry: its LOST is the session's expiry (or the client's close) only
/// (`KazooClient._session_callback`: `KazooState.LOST` for `CLOSED_STATES`).
pub async fn lost(client: &ZkClient, policy: &str, ctx: &Ctx) -> String {
    let mut state = client.state();
    let curator = client.library() != Library::Kazoo;
    loop {
        let now = *state.borrow_and_update();
        match (policy, now) {
            ("never", _) => return std::future::pending().await,
            (_, ConnState::Expired) => return "session expired".into(),
            ("suspended", ConnState::Disconnected) => return "connection suspended".into(),
            ("lost", ConnState::Disconnected) if curator => {
                // Curator 3: LOST when SUSPENDED lasts the session timeout.
                let timeout = client.timeout();
                tokio::select! {
                    biased;
                    _ = state.changed() => continue,
                    _ = ctx.sleep(timeout) => return "suspended for the session timeout".into(),
                }
            }
            _ => {}
        }
        if state.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Create `path` and its parents as persistent nodes if missing (Curator's creatingParentsIfNeeded).
pub async fn ensure_path(zk: &impl ZkApi, path: &str) -> Result<(), ClientError> {
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        match zk.create(&at, CreateMode::Persistent).await {
            Ok(_) | Err(ClientError::Zk(ZkError::NodeExists)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Curator's `RetryLoop.callWithRetry` on `zk` under `ExponentialBackoffRetry(1000, 3)`, the policy most
/// Curator clients are built with: first wait while disconnected ([`until_connected`]), then call; a
/// connection loss is tried again up to 3 times, after sleeping `1000 ms × max(1, random(0..2^(n+1)))`
/// before the n-th retry. Other errors come back at once.
///
/// A kazoo session ([`Library::Kazoo`]) is retried as kazoo's recipes are ([`kazoo_retried`]).
pub async fn retried<T, F: std::future::Future<Output = Result<T, ClientError>>>(
    ctx: &Ctx,
    zk: &ZkClient,
    mut call: impl FnMut() -> F,
) -> Result<T, ClientError> {
    if zk.library() == Library::Kazoo {
        return kazoo_retried(ctx, call).await;
    }
    until_connected(ctx, zk).await;
    let mut retries = 0;
    loop {
        match call().await {
            Err(ClientError::ConnectionLoss) if retries < CURATOR_RETRIES => {
                back_off(ctx, retries).await;
                retries += 1;
            }
            other => return other,
        }
    }
}

/// How often `ExponentialBackoffRetry(1000, 3)` tries a call again.
pub const CURATOR_RETRIES: u32 = 3;

/// `ExponentialBackoffRetry(1000, 3)`'s sleep before retry `retries + 1`: `1000 ms × max(1,
/// random(0..2^(retries+1)))`.
pub async fn back_off(ctx: &Ctx, retries: u32) {
    const BASE_SLEEP: Duration = Duration::from_millis(1000);
    let factor = (ctx.random_u64() % (1 << (retries + 1))).max(1) as u32;
    ctx.sleep(BASE_SLEEP * factor).await;
}

/// kazoo's `KazooRetry(max_tries=None)` (`kazoo/retry.py`, as `Lock._retry` and `KazooClient.retry`
/// make it): a connection loss is tried again without end, after sleeping the current delay ×
/// `random.uniform(0.6, 1.4)` (first delay 0.1 s; the next is that sleep × 2, at most 60 s). There is no
/// wait for a connection first: the client queues a request made while disconnected. An expired
/// session is not retried here: it fails the call, and the recipe's next call opens a new session (kazoo
/// retries `SessionExpiredError` too, on the new session its client has opened meanwhile).
pub async fn kazoo_retried<T, F: std::future::Future<Output = Result<T, ClientError>>>(
    ctx: &Ctx,
    mut call: impl FnMut() -> F,
) -> Result<T, ClientError> {
    const MAX_DELAY_US: u64 = 60_000_000;
    let mut delay_us = 100_000;
    loop {
        match call().await {
            Err(ClientError::ConnectionLoss) => {
                let sleep_us = delay_us * (600 + ctx.random_u64() % 801) / 1000;
                delay_us = (sleep_us * 2).min(MAX_DELAY_US);
                ctx.sleep(Duration::from_micros(sleep_us)).await;
            }
            other => return other,
        }
    }
}

/// Curator's `connectionTimeoutMs` (`CuratorFrameworkFactory`: 15 s unless set).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);

/// Curator 5's `CuratorZookeeperClient.internalBlockUntilConnectedOrTimedOut`, which
/// `RetryLoop.callWithRetry` runs once before its first try: while `zk` is disconnected, wait for it to
/// be connected again, at most Curator's connection timeout (15 s). Then the operation is tried whatever
/// the state (Curator 5's `getZooKeeper` no longer checks timeouts): the ZooKeeper client queues it until
/// it reconnects, or fails it with `ConnectionLoss` when its attempt fails, and the retry policy decides.
/// An expired session is not waited for: its call fails at once.
///
/// kazoo has no such wait: on a kazoo session this returns at once.
pub async fn until_connected(ctx: &Ctx, zk: &ZkClient) {
    if zk.library() == Library::Kazoo {
        return;
    }
    let mut state = zk.state();
    let reconnected = async {
        while *state.borrow_and_update() == ConnState::Disconnected {
            if state.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        biased;
        () = reconnected => {}
        () = ctx.sleep(CONNECTION_TIMEOUT) => {}
    }
}

/// A call's failure in words, for a lock outcome.
pub fn words(e: ClientError) -> String {
    match e {
        ClientError::ConnectionLoss => "connection loss".into(),
        ClientError::Zk(e) => format!("{e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn clones_of_a_session_share_one_session_and_its_events_reach_the_history() {
        let states = Arc::new(Mutex::new(Vec::new()));
        let seen = states.clone();
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let mut world = World::new(1);
            let servers = deploy(&mut world, &Params::resolve(BACKEND_PARAMS, []));
            let client: Program = Arc::new(move |env| {
                let servers = servers.clone();
                Box::pin(async move {
                    let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                    // Two lock objects of one client on one handle, and a second handle of its own.
                    let first = ZkSession::new(&ctx, &servers, Duration::from_secs(6));
                    let second = first.clone();
                    let own = ZkSession::new(&ctx, &servers, Duration::from_secs(6));
                    let (a, b) = (first.live().await.unwrap(), second.live().await.unwrap());
                    a.create("/a", CreateMode::Ephemeral).await.unwrap();
                    let owner = |zk: ZkClient, path: &'static str| async move {
                        zk.exists(path).await.unwrap().unwrap().ephemeral_owner
                    };
                    let (c, _) = own.create("/c", CreateMode::Ephemeral).await.unwrap();
                    assert_eq!(c, "/c");
                    b.create("/b", CreateMode::Ephemeral).await.unwrap();
                    assert_eq!(owner(a.clone(), "/a").await, owner(a.clone(), "/b").await, "one session");
                    assert_ne!(owner(a.clone(), "/a").await, owner(a, "/c").await, "a session of its own");
                })
            });
            world.add_node("client-0", client);
            world.run(&[], Duration::from_secs(5)).await;
            let history = world.recorder().finish(vec!["zk-0".into(), "client-0".into()]);
            *seen.lock().unwrap() = history
                .events
                .iter()
                .filter_map(|e| match &e.kind {
                    locksim_sim::history::EventKind::Session { state } => Some(state.clone()),
                    _ => None,
                })
                .collect();
        });
        assert_eq!(*states.lock().unwrap(), ["connected", "connected"], "two sessions opened, each recorded");
    }

    #[test]
    fn the_session_id_survives_a_reattach_and_changes_after_expiry() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ids = seen.clone();
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let mut world = World::new(1);
            let servers = deploy(&mut world, &Params::resolve(BACKEND_PARAMS, []));
            let client: Program = Arc::new(move |env| {
                let (servers, ids) = (servers.clone(), ids.clone());
                Box::pin(async move {
                    let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                    let zk = ZkSession::new(&ctx, &servers, Duration::from_secs(6));
                    let first = zk.live().await.unwrap();
                    let (_, stat) = first.create("/mine", CreateMode::Ephemeral).await.unwrap();
                    let id = ZkApi::session_id(&zk).await.unwrap();
                    assert_eq!((id, first.session_id()), (stat.ephemeral_owner, id), "the server's id");
                    ids.lock().unwrap().push(id);
                    // The server restarts at 2 s: the session is re-attached on a new connection.
                    ctx.sleep(Duration::from_secs(4)).await;
                    let _ = first.exists("/mine").await;
                    let stat = retried(&ctx, &first, || first.exists("/mine")).await.unwrap().expect("still ours");
                    let id = ZkApi::session_id(&zk).await.unwrap();
                    ids.lock().unwrap().extend([id, stat.ephemeral_owner]);
                    // Paused from 8 s to 28 s, past the session timeout: the session expires.
                    while !first.expired() {
                        let _ = first.exists("/mine").await;
                        ctx.sleep(Duration::from_secs(1)).await;
                    }
                    let (_, stat) = zk.create("/again", CreateMode::Ephemeral).await.unwrap();
                    let id = ZkApi::session_id(&zk).await.unwrap();
                    ids.lock().unwrap().extend([id, stat.ephemeral_owner, first.session_id()]);
                })
            });
            world.add_node("client-0", client);
            let fault = |at, target: &str, action| locksim_sim::fault::Fault {
                at: Duration::from_secs(at),
                target: locksim_sim::fault::Target::Node(target.into()),
                action,
                on: None,
            };
            use locksim_sim::fault::Action;
            let crash = Action::Crash { restart_after: Some(Duration::from_secs(1)), host: true };
            let pause = Action::Pause { duration: Duration::from_secs(20) };
            world.run(&[fault(2, "zk-0", crash), fault(8, "client-0", pause)], Duration::from_secs(60)).await;
        });
        let ids = seen.lock().unwrap().clone();
        assert_eq!(ids.len(), 6, "every step ran: {ids:?}");
        assert_eq!(ids[..3], [ids[0]; 3], "one session across the server's restart: {ids:?}");
        assert_ne!(ids[3], ids[0], "a new session after expiry: {ids:?}");
        assert_eq!((ids[4], ids[5]), (ids[3], ids[0]), "its nodes are the new one's; the old handle keeps its id");
    }
}
