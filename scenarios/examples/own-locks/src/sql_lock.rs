//! A PostgreSQL lock of our own: a row of our own table, locked `FOR UPDATE`, its fencing token a
//! counter in the row.
//!
//! The schema is made on first use (as a migration would make it): a table `job_locks` keyed by job
//! name, with a row per job. To take the lock of job `nightly-report`: `BEGIN`, `SELECT … FOR UPDATE`
//! the job's row (waiting while another transaction has it), bump the row's `fence` and read it back
//! as the fencing token. To release: `COMMIT`. The row lock lives in the connection's session: a
//! client that crashes keeps it until the server's TCP keep-alive ends the session, and a cut-off
//! client's late write is refused by the token. `scenarios/sql-job-lock-nemesis.toml` checks that it
//! stays safe under client partitions and crashes.
//!
//! The statements are written as SQL, as they would be for PostgreSQL, and prepared once, against the
//! table's `CREATE TABLE`: the model runs the statements they stand for, and real mode sends them as
//! written.

use locksim_locks::params::Params;
use locksim_locks::sql::{grant_outcome, outcome, SqlApi, SqlClient, FAMILY, SOCKET_TIMEOUT};
use locksim_locks::{async_trait, no_constraints, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::text::Schema;
use locksim_sim::backend::sql::{SqlError, SqlResult, Stmt, Value};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "my.sql-job-lock",
    family: &FAMILY,
    summary: "BEGIN; SELECT … FOR UPDATE on our own job_locks table; the row's fence counter is the token",
    source: "a hand-rolled lock (examples/own-locks)",
    params: &[SOCKET_TIMEOUT],
    offers_token: true,
    offers_shared: false,
    guard: Guard::Lock,
    // PostgreSQL queues a row's waiters in order, but not this lock's first use: see `schema_ready`.
    promises_fifo: false,
    points: &[],
    validate: no_constraints,
    build,
};

/// Our statements, in PostgreSQL's SQL.
const CREATE: &str = "CREATE TABLE IF NOT EXISTS job_locks (name text PRIMARY KEY, fence bigint NOT NULL)";
const INSERT: &str = "INSERT INTO job_locks (name, fence) VALUES ('nightly-report', 0)";
const LOCK: &str = "SELECT * FROM job_locks WHERE name = 'nightly-report' FOR UPDATE";
const BUMP: &str = "UPDATE job_locks SET fence = fence + 1 WHERE name = 'nightly-report'";
const READ: &str = "SELECT fence FROM job_locks WHERE name = 'nightly-report'";

/// The statements, parsed into the model's.
struct Statements {
    create: Stmt,
    insert: Stmt,
    lock: Stmt,
    bump: Stmt,
    read: Stmt,
}

impl Statements {
    fn parse() -> Statements {
        let mut schema = Schema::new();
        // Constant SQL: a mistake in it is ours, found by the first test that runs the lock.
        // As text (no `$n` to bind): the model runs what it stands for, a real server the text itself.
        let mut parse = |sql| {
            let text = schema.prepare(sql).and_then(|sql| sql.bind(&[]));
            text.unwrap_or_else(|e| panic!("my.sql-job-lock: {e}"))
        };
        Statements {
            create: parse(CREATE),
            insert: parse(INSERT),
            lock: parse(LOCK),
            bump: parse(BUMP),
            read: parse(READ),
        }
    }
}

struct JobLock {
    db: SqlClient,
    sql: Statements,
    holding: bool,
    /// Whether this client has made sure of the table and the row. Once is enough — and every time
    /// would be unfair: an INSERT of the row waits for the holder's transaction (which updated it),
    /// outside the row lock's queue, and the waiters then race (locksim found it as `unfair`). Once is
    /// still unfair at first use: a client whose INSERT comes after the first holder's UPDATE waits
    /// out that holder and the next outside the queue, and a later request overtakes it (locksim found
    /// that too, seed 20 of `sql-job-lock-nemesis`). Making the row inside the locking transaction
    /// moves the race, not ends it — so this lock does not promise first-come-first-served; a
    /// migration that makes the row before any client starts would let it.
    schema_ready: bool,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let db = SqlClient::new(&ctx, servers, params.duration("socket_timeout"));
    Box::new(JobLock { db, sql: Statements::parse(), holding: false, schema_ready: false })
}

impl JobLock {
    /// The table and the job's row, if they are not there yet.
    async fn schema(&mut self) -> Result<(), Outcome<()>> {
        if self.schema_ready {
            return Ok(());
        }
        outcome(self.db.execute(self.sql.create.clone()).await)?;
        match self.db.execute(self.sql.insert.clone()).await {
            Ok(SqlResult::Error(SqlError::UniqueViolation)) => {}
            result => drop(outcome(result)?),
        }
        self.schema_ready = true;
        Ok(())
    }

    /// Steps of the lock, all on one connection: the row lock is its session's.
    async fn lock_row(&mut self) -> Result<u64, Outcome<()>> {
        self.schema().await?;
        let conn = self.db.connection().await.ok_or(Outcome::Fail("cannot reach the database".into()))?;
        let run = |stmt| async { outcome(conn.execute(stmt).await) };
        run(Stmt::Begin).await?;
        run(self.sql.lock.clone()).await?;
        run(self.sql.bump.clone()).await?;
        match run(self.sql.read.clone()).await? {
            SqlResult::Rows(rows) => match rows.first().and_then(|r| r.get("fence")) {
                Some(Value::Int(fence)) => Ok(*fence as u64),
                other => Err(Outcome::Fail(format!("no fence in the job's row: {other:?}"))),
            },
            other => Err(Outcome::Fail(format!("reading the fence: {other:?}"))),
        }
    }
}

#[async_trait(?Send)]
impl Lock for JobLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        match self.lock_row().await {
            Ok(token) => {
                self.holding = true;
                Outcome::Ok(Grant { token: Some(token) })
            }
            Err(failed) => {
                // A failed transaction must be rolled back before the connection is usable again.
                if let Some(conn) = self.db.current() {
                    let _ = conn.execute(Stmt::Rollback).await;
                }
                grant_outcome(failed)
            }
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        if !std::mem::take(&mut self.holding) {
            return Outcome::Fail("not held".into());
        }
        // Only the connection that took the row can commit: a new one would hold nothing.
        let Some(conn) = self.db.current() else {
            return Outcome::Fail("the connection, and the lock, are gone".into());
        };
        match outcome(conn.execute(Stmt::Commit).await) {
            Ok(_) => Outcome::Ok(()),
            Err(failed) => failed,
        }
    }
}
