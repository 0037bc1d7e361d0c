//! `sql.advisory-xact`: a PostgreSQL transaction-level advisory lock, held by a transaction left open
//! for the critical section.
//!
//! Source: PostgreSQL §9.27.10 (`pg_advisory_xact_lock`) and §13.3.5:
//! 1. `SET lock_timeout`; `BEGIN`; `SELECT pg_advisory_xact_lock(42)` — it waits while another session
//!    holds the key. Then `nextval('fence')` in the same transaction: the fencing token.
//! 2. Release: `COMMIT` (there is no unlock: the lock ends with its transaction).
//!
//! Unlike `sql.advisory`, the lock cannot outlive the transaction: an error in it, a rollback or the
//! session's end frees it, and a transaction pooler (pgbouncer's `pool_mode = transaction`) cannot hand
//! it to another client's statements — the reason this form is recommended behind one.
//!
//! Expected (catalog): like `sql.for-update` — a paused holder keeps its transaction and so its lock
//! (its kernel answers the keep-alive): safe; a crashed holder's lock outlives it until TCP keep-alive
//! ends its session.

use super::{Db, LOCK_TIMEOUT, SOCKET_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::Stmt;
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
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
    validate: crate::no_constraints,
    build,
};

const KEY: i64 = 42;

struct AdvisoryXact {
    db: Db,
    params: Params,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(AdvisoryXact { db: Db::new(&ctx, servers, params), params: params.clone() })
}

impl AdvisoryXact {
    async fn lock(&mut self) -> Result<u64, Outcome<()>> {
        self.db.run(Stmt::SetLockTimeout(self.params.duration("lock_timeout"))).await?;
        self.db.run(Stmt::Begin).await?;
        self.db.run(Stmt::AdvisoryXactLock(KEY)).await?;
        self.db.fence().await
    }
}

#[async_trait(?Send)]
impl Lock for AdvisoryXact {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let taken = self.lock().await;
        self.db.granted_in_transaction(taken).await
    }

    async fn release(&mut self) -> Outcome<()> {
        self.db.commit().await
    }
}
