//! `sql.advisory` and `sql.advisory-xact`: a PostgreSQL advisory lock on one key, held by the
//! database session or by a transaction left open for the critical section.
//!
//! Source: PostgreSQL §9.27.10 (advisory lock functions) and §13.3.5:
//! - `sql.advisory`, the session's:
//!   1. `SET lock_timeout`; `SELECT pg_advisory_lock(42)` — it waits while another session holds the
//!      key. Then `nextval('fence')`: the fencing token.
//!   2. Release: `SELECT pg_advisory_unlock(42)`.
//!
//!   The lock belongs to the session: it is held until unlocked or until the session ends — by the
//!   client closing its connection, or the server finding the connection dead.
//! - `sql.advisory-xact`, the transaction's:
//!   1. `SET lock_timeout`; `BEGIN`; `SELECT pg_advisory_xact_lock(42)` — it waits as above. Then
//!      `nextval('fence')` in the same transaction.
//!   2. Release: `COMMIT` (there is no unlock: the lock ends with its transaction).
//!
//!   The lock cannot outlive its transaction: an error in it, a rollback or the session's end frees
//!   it, and a transaction pooler (pgbouncer's `pool_mode = transaction`) cannot hand it to another
//!   client's statements — the reason this form is recommended behind one.
//!
//! Expected (catalog): like `sql.for-update`, a crashed holder's lock outlives it until TCP keep-alive
//! ends its session; a paused holder keeps it (its kernel answers the keep-alive) unless
//! `idle_in_transaction_session_timeout` ends the paused transaction's session
//! (`sql-advisory-xact-idle-timeout-gc-pause`).

use super::{Db, LOCK_TIMEOUT, SOCKET_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::{SqlResult, Stmt};
use locksim_sim::ctx::Ctx;

pub const SESSION: RecipeSpec = RecipeSpec {
    id: "sql.advisory",
    summary: "pg_advisory_lock / pg_advisory_unlock: a lock held by the database session",
    source: "PostgreSQL advisory lock functions",
    build: |params, ctx, servers| build(params, ctx, servers, Scope::Session),
    ..TRANSACTION
};

pub const TRANSACTION: RecipeSpec = RecipeSpec {
    id: "sql.advisory-xact",
    family: &super::FAMILY,
    summary: "BEGIN; pg_advisory_xact_lock holds the key until COMMIT",
    source: "PostgreSQL transaction-level advisory lock functions",
    params: &[SOCKET_TIMEOUT, LOCK_TIMEOUT],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[],
    validate: super::pooler_settings,
    build: |params, ctx, servers| build(params, ctx, servers, Scope::Transaction),
};

const KEY: i64 = 42;

/// What holds the key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Session,
    Transaction,
}

struct Advisory {
    db: Db,
    params: Params,
    scope: Scope,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers, scope: Scope) -> Box<dyn Lock> {
    Box::new(Advisory { db: Db::new(&ctx, servers, params), params: params.clone(), scope })
}

impl Advisory {
    async fn lock(&mut self) -> Result<u64, Outcome<()>> {
        self.db.run(Stmt::SetLockTimeout(self.params.duration("lock_timeout"))).await?;
        match self.scope {
            Scope::Session => self.db.run(Stmt::AdvisoryLock(KEY)).await?,
            Scope::Transaction => {
                self.db.run(Stmt::Begin).await?;
                self.db.run(Stmt::AdvisoryXactLock(KEY)).await?
            }
        };
        self.db.fence().await
    }
}

#[async_trait(?Send)]
impl Lock for Advisory {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let taken = self.lock().await;
        match self.scope {
            Scope::Session => self.db.granted(taken),
            Scope::Transaction => self.db.granted_in_transaction(taken).await,
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        if self.scope == Scope::Transaction {
            return self.db.commit().await;
        }
        if let Err(refused) = self.db.releasing(true) {
            return refused;
        }
        match self.db.run(Stmt::AdvisoryUnlock(KEY)).await {
            Ok(SqlResult::Bool(true)) => Outcome::Ok(()),
            Ok(other) => Outcome::Fail(format!("pg_advisory_unlock: {other:?}")),
            Err(outcome) => outcome,
        }
    }
}
