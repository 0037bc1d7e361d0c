//! A user's own SQL-text lock runs on a real PostgreSQL as it runs in simulation: `examples/own-locks`'
//! `my.sql-lease` — its own table (`VARCHAR(64)`, `TIMESTAMP`, `PRIMARY KEY (name)`), `$n` parameters,
//! `INSERT … ON CONFLICT (name) DO NOTHING` — is granted, refused while the lease runs, and granted
//! again after a release, in both; the table reaches the server as written; and what the model cannot
//! answer is a harness error with its SQLSTATE, never a lock outcome. Where PostgreSQL is not installed
//! the real half says so and passes, unless `LOCKSIM_REQUIRE_SERVERS` is set (as `.ci/run` sets it).

#[path = "../../scenarios/examples/own-locks/src/sql_lease.rs"]
mod sql_lease;

use locksim_live::servers::{Server, POSTGRES};
use locksim_live::wire::pgwire;
use locksim_locks::params::{ParamValue, Params};
use locksim_locks::sql::real::RealConnection;
use locksim_locks::{Lock, Outcome, RealServers, Registry, Servers};
use locksim_scenarios::run::run_seed;
use locksim_scenarios::Scenario;
use locksim_sim::backend::sql::Stmt;
use locksim_sim::ctx::{Ctx, RealTime};
use locksim_sim::history::EventKind;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// PostgreSQL, or `None` (said on stderr) where it is not installed and not required.
fn server() -> Option<Server> {
    match Server::start(&POSTGRES) {
        Ok(server) => Some(server),
        Err(e) if std::env::var_os("LOCKSIM_REQUIRE_SERVERS").is_none() => {
            eprintln!("skipped: {e:#} (set LOCKSIM_REQUIRE_SERVERS=1 to make this a failure)");
            None
        }
        Err(e) => panic!("{e:#}"),
    }
}

fn conninfo(server: &Server) -> String {
    (locksim_locks::sql::REAL.address)(server.addr().0)
}

const TIME: RealTime = RealTime { wall_ms, monotonic_ms };

fn wall_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn monotonic_ms() -> i64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as i64
}

/// Run `f` as a real client process runs a lock: a current-thread runtime and a `LocalSet`.
fn real<T>(f: impl Future<Output = T>) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio::task::LocalSet::new().block_on(&runtime, f)
}

/// The lease lock as real client `client` of `servers`, giving up on a held lease after 1 s.
fn lease_lock(servers: &Servers, client: u64) -> Box<dyn Lock> {
    let params = Params::resolve(
        sql_lease::RECIPE.params,
        [
            ("acquire_timeout", ParamValue::Duration(Duration::from_secs(1))),
            ("lease", ParamValue::Duration(Duration::from_secs(30))),
        ],
    );
    (sql_lease::RECIPE.build)(&params, Ctx::real(0, client, TIME), servers)
}

fn token(outcome: Outcome<locksim_locks::Grant>) -> Option<u64> {
    match outcome {
        Outcome::Ok(grant) => grant.token,
        other => panic!("not granted: {other:?}"),
    }
}

#[test]
fn a_users_sql_text_lease_lock_is_granted_on_a_real_postgresql_as_in_simulation() {
    // Simulated: granted, again and again, by the model.
    let registry = Registry::builtin().with(sql_lease::RECIPE);
    let path =
        format!("{}/../scenarios/examples/own-locks/scenarios/sql-lease-gc-pause.toml", env!("CARGO_MANIFEST_DIR"));
    let scenario = Scenario::load(std::path::Path::new(&path), &registry).unwrap_or_else(|e| panic!("{e}"));
    let run = run_seed(&scenario, 0).unwrap();
    let grants = run.history.events.iter().filter(|e| matches!(e.kind, EventKind::AcquireOk { .. })).count();
    assert!(grants > 10, "simulated: granted {grants} times");

    // Real: the same lock, its statements as written.
    let Some(server) = server() else { return };
    let servers = Servers::Real(RealServers::default().with(&locksim_locks::sql::REAL, conninfo(&server)));
    real(async {
        let (mut a, mut b) = (lease_lock(&servers, 1), lease_lock(&servers, 2));
        assert_eq!(token(a.acquire().await), Some(1), "a new row: INSERT … ON CONFLICT DO NOTHING inserted it");
        match b.acquire().await {
            Outcome::Fail(why) => assert_eq!(why, "the lease is someone else's"),
            other => panic!("granted while a's lease runs: {other:?}"),
        }
        assert_eq!(a.release().await, Outcome::Ok(()));
        assert_eq!(
            token(b.acquire().await),
            Some(2),
            "the released lease, taken over by UPDATE … WHERE lock_until <= now()"
        );
        assert_eq!(b.release().await, Outcome::Ok(()));
    });
    let mut conn = pgwire::Conn::connect(server.addr().0, Duration::from_secs(5)).unwrap();
    let columns = conn
        .query(
            "SELECT column_name || ' ' || data_type || coalesce('(' || character_maximum_length || ')', '') FROM \
             information_schema.columns WHERE table_name = 'job_lease' ORDER BY ordinal_position",
        )
        .unwrap();
    let columns: Vec<String> = columns.rows.into_iter().map(|r| r[0].clone().unwrap_or_default()).collect();
    assert_eq!(
        columns,
        [
            "name character varying(64)",
            "lock_until timestamp without time zone",
            "locked_at timestamp without time zone",
            "locked_by character varying(255)"
        ],
        "the table as the user wrote it"
    );
}

/// What a statement on `server` panics with (`None`: it did not).
fn panics_with(server: &Server, stmt: Stmt) -> Option<String> {
    let conninfo = conninfo(server);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        real(async {
            let conn = RealConnection::open(&conninfo, Duration::ZERO).await.expect("connected");
            let _ = conn.execute(stmt).await;
        })
    }));
    let payload = run.err()?;
    payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

#[test]
fn what_the_model_cannot_answer_on_a_real_postgresql_is_a_harness_error_with_its_sqlstate() {
    let Some(server) = server() else { return };
    let mut conn = pgwire::Conn::connect(server.addr().0, Duration::from_secs(5)).unwrap();
    conn.query(sql_lease::CREATE_TABLE).unwrap();
    // A Stmt names the key `k`; the user's table keys by `name`: PostgreSQL says 42703.
    let select = Stmt::Select { table: "job_lease".into(), key: "x".into(), for_update: false };
    let why = panics_with(&server, select).expect("a harness error, not a lock outcome");
    assert!(why.contains("SQLSTATE 42703") && why.contains("column \"k\" does not exist"), "{why}");
    let create = Stmt::CreateTable { table: "jobs".into(), if_not_exists: true };
    let why = panics_with(&server, create).expect("refused");
    assert!(why.contains("does not say its columns"), "{why}");
}
