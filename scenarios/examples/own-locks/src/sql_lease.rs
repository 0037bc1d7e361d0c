//! A PostgreSQL lease lock of our own, written as such locks are written: SQL text with `$1` bind
//! parameters on a table of our own, its columns as a migration would declare them (ShedLock's
//! PostgreSQL provider, usingDbTime, with a lease of our own length).
//!
//! Take (`my.sql-lease`):
//! 1. `INSERT … VALUES ($1, now() + lease, now(), $2) ON CONFLICT (name) DO NOTHING`: one row — taken;
//! 2. else `UPDATE … WHERE name = $1 AND lock_until <= now()`: one row — taken over an expired lease;
//! 3. else held by someone whose lease runs: look again after `poll`, up to `acquire_timeout`;
//! 4. the fencing token: `nextval` of our own sequence.
//!
//! Release: `UPDATE … SET lock_until = now() WHERE name = $1 AND locked_by = $2`. The lease is all
//! there is: a holder paused past it is overtaken while it still works, and locksim says so
//! (`scenarios/sql-lease-gc-pause.toml`: `double-holder`). The same statements run unchanged on a real
//! PostgreSQL (`locksim run … --real`): the table is made with these columns and types.

use locksim_locks::params::{ParamSpec, Params};
use locksim_locks::sql::{grant_outcome, outcome, SqlApi, SqlClient, FAMILY, SOCKET_TIMEOUT};
use locksim_locks::{async_trait, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::text::{Prepared, Schema};
use locksim_sim::backend::sql::{SqlResult, ToValue};
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "my.sql-lease",
    family: &FAMILY,
    summary: "a lease row: INSERT … ON CONFLICT DO NOTHING, else take over an expired lease; SQL text with $n",
    source: "a hand-rolled lock (examples/own-locks), after ShedLock's PostgreSQL statements",
    params: &[
        SOCKET_TIMEOUT,
        ParamSpec::duration("lease", 5_000, "how long a lease lasts (ShedLock's lockAtMostFor)"),
        ParamSpec::duration("poll", 250, "time between tries while the lease is someone else's"),
        ParamSpec::duration("acquire_timeout", 30_000, "give up waiting after this long"),
    ],
    offers_token: true,
    offers_shared: false,
    guard: Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: locksim_locks::no_constraints,
    build,
};

/// The lock's name: the row it lives in.
const JOB: &str = "nightly-report";

/// Our table and sequence, as the migration makes them.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS job_lease (
    name       VARCHAR(64)  NOT NULL,
    lock_until TIMESTAMP    NOT NULL,
    locked_at  TIMESTAMP    NOT NULL,
    locked_by  VARCHAR(255) NOT NULL,
    PRIMARY KEY (name)
)";
const CREATE_SEQUENCE: &str = "CREATE SEQUENCE IF NOT EXISTS job_lease_fence";

/// Our statements, prepared once against the table.
pub struct Statements {
    pub create_table: Prepared,
    create_sequence: Prepared,
    pub insert: Prepared,
    pub take_over: Prepared,
    pub release: Prepared,
    fence: Prepared,
}

impl Statements {
    /// The statements, with a lease of `lease`.
    pub fn prepare(lease: Duration) -> Statements {
        let lease = format!("now() + interval '{} milliseconds'", lease.as_millis());
        let mut schema = Schema::new();
        // Constant SQL: a mistake in it is ours, found by the first test that runs the lock.
        let mut prepare = |sql: &str| schema.prepare(sql).unwrap_or_else(|e| panic!("my.sql-lease: {e}"));
        Statements {
            create_table: prepare(CREATE_TABLE),
            create_sequence: prepare(CREATE_SEQUENCE),
            insert: prepare(&format!(
                "INSERT INTO job_lease (name, lock_until, locked_at, locked_by) VALUES ($1, {lease}, now(), $2) \
                 ON CONFLICT (name) DO NOTHING"
            )),
            take_over: prepare(&format!(
                "UPDATE job_lease SET lock_until = {lease}, locked_at = now(), locked_by = $2 \
                 WHERE name = $1 AND lock_until <= now()"
            )),
            release: prepare("UPDATE job_lease SET lock_until = now() WHERE name = $1 AND locked_by = $2"),
            fence: prepare("SELECT nextval('job_lease_fence')"),
        }
    }
}

struct LeaseLock {
    ctx: Ctx,
    db: SqlClient,
    sql: Statements,
    /// Who we are in `locked_by`.
    me: String,
    poll: Duration,
    acquire_timeout: Duration,
    schema_ready: bool,
    holding: bool,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let db = SqlClient::new(&ctx, servers, params.duration("socket_timeout"));
    let me = format!("host-{:08x}", ctx.random_u64() as u32);
    Box::new(LeaseLock {
        sql: Statements::prepare(params.duration("lease")),
        poll: params.duration("poll"),
        acquire_timeout: params.duration("acquire_timeout"),
        ctx,
        db,
        me,
        schema_ready: false,
        holding: false,
    })
}

impl LeaseLock {
    /// One try: whether we took the lease (a new row, or an expired one taken over).
    async fn take(&mut self) -> Result<bool, Outcome<()>> {
        if !self.schema_ready {
            outcome(self.db.query(&self.sql.create_table, &[]).await)?;
            outcome(self.db.query(&self.sql.create_sequence, &[]).await)?;
            self.schema_ready = true;
        }
        let who: [&dyn ToValue; 2] = [&JOB, &self.me];
        if outcome(self.db.query(&self.sql.insert, &who).await)? == SqlResult::Affected(1) {
            return Ok(true);
        }
        Ok(outcome(self.db.query(&self.sql.take_over, &who).await)? == SqlResult::Affected(1))
    }
}

#[async_trait(?Send)]
impl Lock for LeaseLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let deadline = self.ctx.monotonic_ms() + self.acquire_timeout.as_millis() as i64;
        loop {
            match self.take().await {
                Ok(true) => break,
                Ok(false) if self.ctx.monotonic_ms() < deadline => self.ctx.sleep(self.poll).await,
                Ok(false) => return Outcome::Fail("the lease is someone else's".into()),
                Err(failed) => return grant_outcome(failed),
            }
        }
        self.holding = true;
        match outcome(self.db.query(&self.sql.fence, &[]).await) {
            Ok(SqlResult::Int(token)) => Outcome::Ok(Grant { token: Some(token as u64) }),
            // We hold the lease all the same: the workload releases it.
            Ok(other) => Outcome::Fail(format!("nextval: {other:?}")),
            Err(failed) => grant_outcome(failed),
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        if !std::mem::take(&mut self.holding) {
            return Outcome::Fail("not held".into());
        }
        match outcome(self.db.query(&self.sql.release, &[&JOB, &self.me]).await) {
            Ok(SqlResult::Affected(1)) => Outcome::Ok(()),
            Ok(_) => Outcome::Fail("the lease was no longer ours".into()),
            Err(failed) => failed,
        }
    }
}
