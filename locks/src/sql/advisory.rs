//! `sql.advisory`: a PostgreSQL session advisory lock.
//!
//! Source: PostgreSQL §9.27.10 and §13.3.5:
//! 1. `SET lock_timeout`; `SELECT pg_advisory_lock(42)` — it waits while another session holds the key.
//!    Then `nextval('fence')`: the fencing token.
//! 2. Release: `SELECT pg_advisory_unlock(42)`.
//!
//! The lock belongs to the session, not to a transaction: it is held until unlocked or until the session
//! ends — by the client closing its connection, or the server finding the connection dead.
//!
//! Expected (catalog): like `sql.for-update`, a crashed holder's lock outlives it until TCP keep-alive
//! ends its session.

use super::{Db, LOCK_TIMEOUT, SOCKET_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::{SqlResult, Stmt};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "sql.advisory",
    family: &super::FAMILY,
    summary: "pg_advisory_lock / pg_advisory_unlock: a lock held by the database session",
    source: "PostgreSQL advisory lock functions",
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

struct Advisory {
    db: Db,
    params: Params,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(Advisory { db: Db::new(&ctx, servers, params), params: params.clone() })
}

impl Advisory {
    async fn lock(&mut self) -> Result<u64, Outcome<()>> {
        self.db.run(Stmt::SetLockTimeout(self.params.duration("lock_timeout"))).await?;
        self.db.run(Stmt::AdvisoryLock(KEY)).await?;
        self.db.fence().await
    }
}

#[async_trait(?Send)]
impl Lock for Advisory {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let taken = self.lock().await;
        self.db.granted(taken)
    }

    async fn release(&mut self) -> Outcome<()> {
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
