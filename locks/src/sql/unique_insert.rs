//! `sql.unique-insert`: the lock is a row keyed by the lock's name; the primary key keeps it unique.
//!
//! Source: the common "lock table" pattern:
//! 1. `INSERT INTO locks VALUES ('lock', owner)`: inserted — acquired (then `nextval('fence')`, the
//!    fencing token). A unique violation: someone holds it; try again after `retry`, until
//!    `acquire_timeout`.
//! 2. Release: `DELETE FROM locks WHERE key = 'lock' AND owner = <us>`.
//!
//! Nothing ever expires the row.
//!
//! Expected (catalog): a holder that crashes leaves its row for good — nobody gets the lock again
//! (`deadlock`).

use super::{grant_outcome, text, Db, SOCKET_TIMEOUT};
use crate::params::{ParamSpec, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::{Cond, Op, SqlResult, Stmt};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "sql.unique-insert",
    family: &super::FAMILY,
    summary: "INSERT a row keyed by the lock name (unique key); DELETE it to release; no expiry",
    source: "the lock-table pattern",
    params: &[
        SOCKET_TIMEOUT,
        ParamSpec::duration("retry", 100, "wait between attempts while the row exists"),
        ParamSpec::duration("acquire_timeout", 30_000, "give up after this long"),
    ],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: super::pooler_settings,
    build,
};

struct UniqueInsert {
    ctx: Ctx,
    db: Db,
    params: Params,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(UniqueInsert { db: Db::new(&ctx, servers, params), ctx, params: params.clone() })
}

impl UniqueInsert {
    /// One attempt: `Ok(true)` inserted, `Ok(false)` taken.
    async fn insert(&mut self) -> Result<bool, Outcome<()>> {
        let row = vec![("owner".to_string(), text(&self.db.owner))];
        self.db.insert("locks", "lock", row).await
    }
}

#[async_trait(?Send)]
impl Lock for UniqueInsert {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let deadline = self.ctx.monotonic_ms() + self.params.duration("acquire_timeout").as_millis() as i64;
        loop {
            match self.insert().await {
                Ok(true) => break,
                Ok(false) if self.ctx.monotonic_ms() < deadline => self.ctx.sleep(self.params.duration("retry")).await,
                Ok(false) => return Outcome::Fail("timed out: the lock row exists".into()),
                Err(outcome) => return grant_outcome(outcome),
            }
        }
        let token = self.db.fence().await;
        self.db.granted(token)
    }

    async fn release(&mut self) -> Outcome<()> {
        if let Err(refused) = self.db.releasing(false) {
            return refused;
        }
        let ours = Cond { column: "owner".into(), op: Op::Eq, rhs: text(&self.db.owner) };
        match self.db.run(Stmt::Delete { table: "locks".into(), key: "lock".into(), cond: vec![ours] }).await {
            Ok(SqlResult::Affected(1)) => Outcome::Ok(()),
            Ok(_) => Outcome::Fail("our row was gone".into()),
            Err(outcome) => outcome,
        }
    }
}
