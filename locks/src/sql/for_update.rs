//! `sql.for-update` (the lock-row pattern of the database-lock articles): the lock is a row, held by a transaction that selected it FOR UPDATE.
//!
//! Source: the common "lock row" recipe (a lock table row taken FOR UPDATE), and PostgreSQL's row locks (§13.3.2):
//! 1. On the client's connection: `SET lock_timeout`; `BEGIN`; `SELECT * FROM lock_rows WHERE key =
//!    'lock' FOR UPDATE` — it waits while another transaction holds the row. Then `nextval('fence')` in
//!    the same transaction: the fencing token.
//! 2. Release: `COMMIT`.
//!
//! A waiting statement that passes `lock_timeout` fails (the transaction is rolled back). A client whose
//! socket read timeout passes closes its connection; the server may still grant it the row, and then
//! ends its session when the close arrives.
//!
//! Expected (catalog): a crashed holder keeps the row locked until the server notices the dead
//! connection (TCP keep-alive), so recovery takes about `tcp_keepalives_idle` + `count` × `interval`.
//! A paused holder keeps its row (its kernel answers the keep-alive): safe, but everyone waits. A
//! database crash while a paused holder holds can hand its token out again (the sequence's log is not
//! flushed before the holder's commit), and the resource then takes the stale write
//! (`sql-for-update-db-crash-fencing`).

use super::{Db, LOCK_TIMEOUT, SOCKET_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::{SqlResult, Stmt};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "sql.for-update",
    family: &super::FAMILY,
    summary: "BEGIN; SELECT … FOR UPDATE holds the row lock until COMMIT",
    source: "the lock-row recipe; PostgreSQL row-level locks",
    params: &[SOCKET_TIMEOUT, LOCK_TIMEOUT],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[],
    validate: super::pooler_settings,
    build,
};

struct ForUpdate {
    db: Db,
    params: Params,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(ForUpdate { db: Db::new(&ctx, servers, params), params: params.clone() })
}

impl ForUpdate {
    async fn lock_row(&mut self) -> Result<u64, Outcome<()>> {
        self.db.run(Stmt::SetLockTimeout(self.params.duration("lock_timeout"))).await?;
        self.db.run(Stmt::Begin).await?;
        let row = Stmt::Select { table: "lock_rows".into(), key: "lock".into(), for_update: true };
        match self.db.run(row).await? {
            SqlResult::Rows(rows) if rows.len() == 1 => self.db.fence().await,
            other => Err(Outcome::Fail(format!("the lock row is missing: {other:?}"))),
        }
    }
}

#[async_trait(?Send)]
impl Lock for ForUpdate {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let taken = self.lock_row().await;
        self.db.granted_in_transaction(taken).await
    }

    async fn release(&mut self) -> Outcome<()> {
        self.db.commit().await
    }
}
