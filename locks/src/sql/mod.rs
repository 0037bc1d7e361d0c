//! The database family: the client trait recipes speak, the simulated PostgreSQL deployment, and the
//! recipes (and the flash sale's ceiling, `sql.conditional-update`).
//!
//! Recipes talk to the database through [`SqlApi`], a connection's `execute` (or `query`, SQL text with
//! bind parameters: see [`text::Schema`](locksim_sim::backend::sql::text::Schema)), as JDBC, libpq or tokio-postgres do. The
//! server's tables: `lock_rows` (one row, `lock`, for `SELECT … FOR UPDATE`), `locks` (empty; a lock
//! is a row keyed by its name), `shedlock` (ShedLock's table) and the sequence `fence` (fencing tokens).

mod advisory;
mod conditional_update;
mod for_update;
#[cfg(feature = "real-clients")]
pub mod real;
mod shedlock;
mod unique_insert;

use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Family, Grant, Outcome, RealServer, RecipeSpec, Servers};
use locksim_sim::backend::sql::client::{ClientEnv, ClientError, Connection, Router};
use locksim_sim::backend::sql::text::Prepared;
use locksim_sim::backend::sql::{
    Expr, PoolMode, Pooler, Row, Settings, SqlError, SqlResult, SqlState, Stmt, ToValue, Value,
};
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Topology;
use locksim_sim::history::NodeIx;
use locksim_sim::world::{Program, World};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;

pub const RECIPES: &[RecipeSpec] = &[
    for_update::RECIPE,
    unique_insert::RECIPE,
    shedlock::RECIPE,
    advisory::SESSION,
    advisory::TRANSACTION,
    conditional_update::RECIPE,
];

/// The tables and sequence the built-in recipes use, as real mode makes them on a fresh server (the
/// simulated server's, whose rows take any column: here typed as the recipes write them): `lock_rows`
/// with its one row `lock` (`sql.for-update`), `locks` (`sql.unique-insert`: the holder's `owner`),
/// `shedlock` (`sql.unique-insert-expiry`: ShedLock's `lock_until`, `locked_at` in epoch milliseconds,
/// and `locked_by`), and the sequence `fence`.
pub const SCHEMA: &str = "CREATE TABLE lock_rows (k text PRIMARY KEY); INSERT INTO lock_rows (k) VALUES ('lock'); \
                          CREATE TABLE locks (k text PRIMARY KEY, owner text); \
                          CREATE TABLE shedlock (k text PRIMARY KEY, lock_until bigint, locked_at bigint, \
                          locked_by text); \
                          CREATE SEQUENCE fence;";

/// The database server of one world.
#[derive(Clone, Debug)]
pub struct SqlServers {
    pub server: NodeIx,
    recorder: locksim_sim::history::Recorder,
}

impl SqlServers {
    /// The database among a world's servers (every recipe of this family is handed it).
    pub fn from(servers: &Servers) -> &SqlServers {
        servers.sim()
    }
}

/// `[backend]` keys of the database family: PostgreSQL's connection settings.
pub const BACKEND_PARAMS: &[ParamSpec] = &[
    ParamSpec::duration(
        "tcp_keepalives_idle",
        7_200_000,
        "silence before the server probes a client's connection (PostgreSQL uses the OS default, 2h)",
    ),
    ParamSpec::duration("tcp_keepalives_interval", 75_000, "time between unanswered keep-alive probes"),
    ParamSpec::int("tcp_keepalives_count", (1, 100), 9, "unanswered probes after which the server ends the session"),
    ParamSpec::duration(
        "idle_in_transaction_session_timeout",
        0,
        "end a session idle inside a transaction this long (0: never, the default)",
    ),
    ParamSpec {
        name: "pooler",
        kind: ParamKind::Choice(&["none", "session", "transaction"]),
        default: ParamValue::Choice("none"),
        doc: "pgbouncer in front of the server, and its pool_mode: \"session\" (a client keeps a backend until it \
              disconnects; DISCARD ALL then) or \"transaction\" (a backend per transaction, session state such as \
              advisory locks left on it for the next client); \"none\": clients connect to PostgreSQL",
    },
    ParamSpec::int("pool_size", (1, 1000), 20, "pgbouncer's default_pool_size: the most backends it opens"),
    ParamSpec {
        name: "server_reset_query_always",
        kind: ParamKind::Bool,
        default: ParamValue::Bool(false),
        doc: "pgbouncer's server_reset_query_always: DISCARD ALL each time a backend goes back to the pool, in \
              transaction pooling too (it frees a session advisory lock as its statement ends)",
    },
    ParamSpec::duration(
        "server_idle_timeout",
        600_000,
        "pgbouncer's server_idle_timeout: a backend left in the pool unused this long is closed, and the session \
         advisory locks on it are freed (0: never)",
    ),
    ParamSpec::duration(
        "server_lifetime",
        3_600_000,
        "pgbouncer's server_lifetime: a backend connected this long ago is closed when it is next unused (0: each \
         backend serves once)",
    ),
];

/// pgbouncer's `[backend]` keys: they mean something only with a `pooler`.
const POOLER_KEYS: [&str; 4] = ["pool_size", "server_reset_query_always", "server_idle_timeout", "server_lifetime"];

/// Every SQL recipe checks: a pgbouncer setting away from its default comes with a pooler, or the
/// scenario would run without the pooler it describes.
pub(crate) fn pooler_settings(_: &Params, backend: &Params) -> Result<(), String> {
    if backend.choice("pooler") != "none" {
        return Ok(());
    }
    let defaults = Params::resolve(BACKEND_PARAMS, []);
    let value = |params: &Params, key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    match POOLER_KEYS.into_iter().find(|key| value(backend, key) != value(&defaults, key)) {
        Some(key) => Err(format!(
            "[backend] {key} is pgbouncer's, but pooler = \"none\": set pooler = \"session\" or \"transaction\", or \
             drop {key}"
        )),
        None => Ok(()),
    }
}

pub static FAMILY: Family = Family {
    name: "sql",
    summary: "PostgreSQL 15 semantics: row locks, unique keys, advisory locks, sessions ended by keep-alive",
    params: BACKEND_PARAMS,
    topology,
    deploy,
    real: Some(&REAL),
    // The pooler marks `pooled-session-lock` (`sim/src/backend/sql/pool.rs`).
    marks: |h| crate::LEASE_HAZARDS.contains(&h) || h == locksim_sim::hazard::Hazard::PooledSessionLock,
};

/// PostgreSQL 15 (Debian 12 `postgresql-15`), a cluster of its own; committed rows outlive a crash (the
/// WAL). Its clients are given a libpq connection string (the cluster trusts `postgres` on loopback).
pub static REAL: RealServer = RealServer {
    name: "postgresql",
    node: "db-0",
    env: "LOCKSIM_POSTGRES",
    package: "postgresql-15",
    client_built: cfg!(feature = "real-clients"),
    refuses: RealServer::refuses_nothing,
    keeps_data: |_| true,
    address: |addr| format!("host={} port={} user=postgres dbname=postgres", addr.ip(), addr.port()),
};

fn topology(_: &Params) -> Topology {
    Topology { servers: vec![REAL.node.into()], ..Topology::default() }
}

/// How often, at least, the server's keep-alive looks for silent connections (it also wakes when a
/// session's timer is due).
const PROBE_EVERY: Duration = Duration::from_millis(500);

fn deploy(world: &mut World, params: &Params) -> Servers {
    let settings = Settings {
        tcp_keepalives_idle: params.duration("tcp_keepalives_idle"),
        tcp_keepalives_interval: params.duration("tcp_keepalives_interval"),
        tcp_keepalives_count: params.int("tcp_keepalives_count") as u32,
        idle_in_transaction_session_timeout: params.duration("idle_in_transaction_session_timeout"),
    };
    let mut db = SqlState::new(settings);
    let mode = match params.choice("pooler") {
        "session" => Some(PoolMode::Session),
        "transaction" => Some(PoolMode::Transaction),
        _ => None,
    };
    if let Some(mode) = mode {
        db = db.with_pooler(Pooler {
            mode,
            size: params.int("pool_size") as usize,
            reset_always: params.bool("server_reset_query_always"),
            idle_timeout: params.duration("server_idle_timeout"),
            lifetime: params.duration("server_lifetime"),
        });
    }
    db.create_table("lock_rows", [("lock".to_string(), Row::new())]);
    db.create_table("locks", []);
    db.create_table("shedlock", []);
    db.create_sequence("fence");
    // Committed rows survive a restart (the WAL); sessions do not.
    let state = Arc::new(Mutex::new(db));
    let program: Program = Arc::new(move |env| {
        let state = state.clone();
        if env.incarnation > 0 {
            state.lock().expect("db lock").recover();
        }
        Box::pin(async move {
            let rpc = env.rpc();
            // The kernel's keep-alive, beside the server: probe connections that have been silent.
            let (prober_state, prober_rpc, clock, recorder) =
                (state.clone(), rpc.clone(), env.clock.clone(), env.recorder.clone());
            let _prober = locksim_sim::ctx::Background::spawn(async move {
                let mut wait = PROBE_EVERY;
                loop {
                    clock.sleep(wait).await;
                    let now = locksim_sim::backend::Now::of(&clock);
                    let mut due = None;
                    locksim_sim::backend::act(&prober_state, &prober_rpc, &recorder, |db, out| {
                        due = db.keepalive(
                            now,
                            |node, life| prober_rpc.probe(node, life),
                            |node, life| prober_rpc.acked_ns(node, life).map(|ns| clock.monotonic_ms_at(ns)),
                            out,
                        )
                    });
                    // On time for the next timer known now; a session opened meanwhile is due an idle
                    // period after it opened, after the next look.
                    let until_due = due.map_or(PROBE_EVERY.as_millis() as i64, |d| d - now.mono_ms);
                    wait = Duration::from_millis(until_due.clamp(1, PROBE_EVERY.as_millis() as i64) as u64);
                }
            });
            locksim_sim::backend::serve(state, &rpc, &env.clock, &env.recorder).await
        })
    });
    let server = world.add_node(REAL.node, program);
    Servers::new(SqlServers { server, recorder: world.recorder().clone() })
}

/// A database connection's one call, as JDBC's `Statement.execute` or libpq's `PQexec`: one statement,
/// its result. Errors the server answers come back as `Ok(SqlResult::Error(…))` (see [`outcome`]); an
/// `Err` is the connection's: no result within the socket timeout (the statement may have run), or
/// the connection is closed.
#[async_trait(?Send)]
pub trait SqlApi {
    async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError>;
    /// Whether the connection is known to be closed (a closed one never opens again).
    fn is_closed(&self) -> bool;

    /// Run a statement of SQL text with its `$1`, `$2`, … values, as tokio-postgres's
    /// `query(&statement, &[&p])`: `statement` comes from
    /// [`Schema::prepare`](locksim_sim::backend::sql::text::Schema::prepare), the values are `&str`,
    /// `String`, integers, `Option`s of them (`None`: `NULL`) or [`Value`]s. The simulated server runs
    /// the statement the text stands for; a real one is sent the text as written, with the values.
    ///
    /// Values that do not fit the statement (too many, too few, of the wrong kind) are a bug in the
    /// lock, not something a server answers: it panics with [`Prepared::bind`]'s error, naming the
    /// statement and the column of the placeholder — a harness error of the run.
    async fn query(&self, statement: &Prepared, params: &[&dyn ToValue]) -> Result<SqlResult, ClientError> {
        let stmt = statement.bind(params).unwrap_or_else(|e| panic!("binding SQL text: {e}"));
        self.execute(stmt).await
    }
}

#[async_trait(?Send)]
impl SqlApi for Connection {
    async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        Connection::execute(self, stmt).await
    }

    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }
}

/// A client's database connection as a lock holds it: one connection at a time, opened on first use
/// and opened anew once the old one has closed (a pool of one, as a JDBC `DataSource` a lock is given).
/// The connection's session is PostgreSQL's: a transaction, row locks and advisory locks live in it
/// and die with it.
///
/// Clones share the connection: give two lock objects of one client clones to test code where both
/// live in one session (one session's death frees both). Make several with [`SqlClient::new`] for a
/// client with several connections. It speaks [`SqlApi`] itself, each statement on the open
/// connection (opened if needed; `Closed` when the server cannot be reached).
#[derive(Clone)]
pub struct SqlClient {
    ctx: Ctx,
    server: Server,
    socket_timeout: Duration,
    /// Held across an open, so that two users of one client never open two connections.
    conn: Rc<AsyncMutex<Option<Rc<SqlConnection>>>>,
}

/// Where a client's connections go: the simulated database, or (real mode) a real one.
#[derive(Clone)]
enum Server {
    Sim(ClientEnv),
    /// A libpq connection string.
    #[cfg(feature = "real-clients")]
    Real(String),
}

/// One connection and its session: simulated, or on a real server ([`real::RealConnection`]).
pub enum SqlConnection {
    Sim(Connection),
    #[cfg(feature = "real-clients")]
    Real(real::RealConnection),
}

impl SqlConnection {
    /// Run one statement and wait for its result (see [`SqlApi`]).
    pub async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        match self {
            SqlConnection::Sim(conn) => conn.execute(stmt).await,
            #[cfg(feature = "real-clients")]
            SqlConnection::Real(conn) => conn.execute(stmt).await,
        }
    }

    /// Whether the connection is known to be closed (a closed one never opens again).
    pub fn is_closed(&self) -> bool {
        match self {
            SqlConnection::Sim(conn) => conn.is_closed(),
            #[cfg(feature = "real-clients")]
            SqlConnection::Real(conn) => conn.is_closed(),
        }
    }
}

#[async_trait(?Send)]
impl SqlApi for SqlConnection {
    async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        SqlConnection::execute(self, stmt).await
    }

    fn is_closed(&self) -> bool {
        SqlConnection::is_closed(self)
    }
}

impl SqlClient {
    /// A client of this world's database from `ctx`'s node whose statements wait up to
    /// `socket_timeout` for their result (zero: for ever, JDBC's default; see [`SOCKET_TIMEOUT`]).
    /// No connection is opened until first used.
    pub fn new(ctx: &Ctx, servers: &Servers, socket_timeout: Duration) -> SqlClient {
        let server = match servers {
            #[cfg(feature = "real-clients")]
            Servers::Real(real) => Server::Real(real.of(&REAL).to_string()),
            servers => {
                let sql = SqlServers::from(servers);
                Server::Sim(ClientEnv {
                    rpc: ctx.rpc().clone(),
                    clock: ctx.clock().clone(),
                    recorder: sql.recorder.clone(),
                    server: sql.server,
                    router: ctx.node_wide(Router::default),
                })
            }
        };
        SqlClient { ctx: ctx.clone(), server, socket_timeout, conn: Rc::default() }
    }

    /// The open connection, or a new one if there is none or it has closed (`None`: the server did not
    /// answer within the connect timeout). Hold on to it to keep talking to one session.
    pub async fn connection(&self) -> Option<Rc<SqlConnection>> {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            *conn = match &self.server {
                Server::Sim(env) => {
                    let id = self.ctx.random_u64();
                    Connection::open(env.clone(), id, self.socket_timeout).await.map(SqlConnection::Sim)
                }
                #[cfg(feature = "real-clients")]
                Server::Real(conninfo) => {
                    real::RealConnection::open(conninfo, self.socket_timeout).await.map(SqlConnection::Real)
                }
            }
            .map(Rc::new);
        }
        conn.clone()
    }

    /// The connection now, if one was opened and is not known to be closed.
    pub fn current(&self) -> Option<Rc<SqlConnection>> {
        self.conn.try_lock().ok().and_then(|c| c.clone()).filter(|c| !c.is_closed())
    }
}

#[async_trait(?Send)]
impl SqlApi for SqlClient {
    async fn execute(&self, stmt: Stmt) -> Result<SqlResult, ClientError> {
        match self.connection().await {
            Some(conn) => conn.execute(stmt).await,
            None => Err(ClientError::Closed),
        }
    }

    fn is_closed(&self) -> bool {
        self.current().is_none()
    }
}

/// Parameters the database recipes share; a user's recipe may list them in its `params` too.
pub const SOCKET_TIMEOUT: ParamSpec = ParamSpec::duration(
    "socket_timeout",
    0,
    "client socket read timeout: give up on a statement and close the connection (0: wait for ever, JDBC's default)",
);
pub const LOCK_TIMEOUT: ParamSpec =
    ParamSpec::duration("lock_timeout", 0, "the session's lock_timeout: a waiting statement fails after it (0: never)");

/// The built-in recipes' client: its connection, and whether it holds the lock through it.
struct Db {
    client: SqlClient,
    holding: bool,
    /// How the client names itself in lock rows (ShedLock's `locked_by`: its host).
    owner: String,
}

impl Db {
    fn new(ctx: &Ctx, servers: &Servers, params: &Params) -> Db {
        let owner = match ctx.is_real() {
            // A real process has no node index: a host name of its own.
            true => format!("host-{:016x}", ctx.random_u64()),
            false => format!("node-{}", ctx.rpc().me().0),
        };
        Db { client: SqlClient::new(ctx, servers, params.duration("socket_timeout")), holding: false, owner }
    }

    /// The outcome of taking the lock with fencing token `token`; remembers that we hold it.
    fn granted(&mut self, taken: Result<u64, Outcome<()>>) -> Outcome<Grant> {
        match taken {
            Ok(token) => {
                self.holding = true;
                Outcome::Ok(Grant { token: Some(token) })
            }
            Err(outcome) => grant_outcome(outcome),
        }
    }

    /// [`Db::granted`] for a lock that lives in a transaction: a failed acquire first rolls back its
    /// aborted transaction, which the connection needs before it is usable again.
    async fn granted_in_transaction(&mut self, taken: Result<u64, Outcome<()>>) -> Outcome<Grant> {
        if taken.is_err() {
            if let Some(conn) = self.client.current() {
                let _ = conn.execute(Stmt::Rollback).await;
            }
        }
        self.granted(taken)
    }

    /// Release a lock that lives in a transaction: `COMMIT` ends it.
    async fn commit(&mut self) -> Outcome<()> {
        if let Err(refused) = self.releasing(true) {
            return refused;
        }
        match self.run(Stmt::Commit).await {
            Ok(_) => Outcome::Ok(()),
            Err(outcome) => outcome,
        }
    }

    /// Start a release: refused if we do not hold the lock, and — for a lock that lives in the
    /// session (`needs_session`) — if the connection that held it is gone.
    fn releasing(&mut self, needs_session: bool) -> Result<(), Outcome<()>> {
        if !std::mem::take(&mut self.holding) {
            return Err(Outcome::Fail("not held by this client".into()));
        }
        if needs_session && self.client.current().is_none() {
            return Err(Outcome::Fail("the connection is gone, and the lock with its session".into()));
        }
        Ok(())
    }

    /// Run `stmt` on the open connection (opening one if needed).
    async fn run(&mut self, stmt: Stmt) -> Result<SqlResult, Outcome<()>> {
        outcome(self.execute(stmt).await?)
    }

    /// Insert `row` as `key` of `table`: `Ok(false)` if the key is taken (a unique violation: someone
    /// else holds the lock).
    async fn insert(&mut self, table: &str, key: &str, row: Vec<(String, Expr)>) -> Result<bool, Outcome<()>> {
        let insert = Stmt::Insert { table: table.into(), key: key.into(), row };
        match self.execute(insert).await? {
            Ok(SqlResult::Error(SqlError::UniqueViolation)) => Ok(false),
            result => outcome(result).map(|_| true),
        }
    }

    /// `stmt`'s result on the open connection (opening one if needed); a failure if none opens.
    async fn execute(&mut self, stmt: Stmt) -> Result<Result<SqlResult, ClientError>, Outcome<()>> {
        let conn = self.client.connection().await.ok_or(Outcome::Fail("cannot reach the database".into()))?;
        Ok(conn.execute(stmt).await)
    }

    /// `nextval('fence')`: a fencing token.
    async fn fence(&mut self) -> Result<u64, Outcome<()>> {
        match self.run(Stmt::NextVal { sequence: "fence".into() }).await? {
            SqlResult::Int(n) => Ok(n as u64),
            other => Err(Outcome::Fail(format!("nextval: {other:?}"))),
        }
    }
}

/// A statement's result, or the lock outcome of its failing: a read timeout leaves the statement's
/// effect unknown, anything else (a server error, a closed connection) is a definite failure.
pub fn outcome(result: Result<SqlResult, ClientError>) -> Result<SqlResult, Outcome<()>> {
    match result {
        Ok(SqlResult::Error(e)) => Err(Outcome::Fail(format!("{e:?}"))),
        // pgjdbc (42.7) raises an error when COMMIT is answered ROLLBACK.
        Ok(SqlResult::RolledBack) => Err(Outcome::Fail("the transaction had failed: COMMIT rolled it back".into())),
        Ok(result) => Ok(result),
        Err(ClientError::ReadTimeout) => Err(Outcome::Unknown("socket read timeout".into())),
        Err(ClientError::Closed) => Err(Outcome::Fail("connection closed".into())),
    }
}

/// The same outcome for `acquire`.
pub fn grant_outcome(o: Outcome<()>) -> Outcome<Grant> {
    match o {
        Outcome::Ok(()) => Outcome::Ok(Grant::default()),
        Outcome::Fail(why) => Outcome::Fail(why),
        Outcome::Unknown(why) => Outcome::Unknown(why),
    }
}

fn text(s: &str) -> locksim_sim::backend::sql::Expr {
    locksim_sim::backend::sql::Expr::Value(Value::Text(s.into()))
}
