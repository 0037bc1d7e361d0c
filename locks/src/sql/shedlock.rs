//! `sql.unique-insert-expiry`: ShedLock's JDBC lock provider — a row with a `lock_until` column, taken
//! over once that time has passed.
//!
//! Source: ShedLock `JdbcTemplateStorageAccessor` and its SQL statement sources:
//! 1. `INSERT INTO shedlock (name, lock_until, locked_at, locked_by) VALUES ('lock', now + lockAtMostFor,
//!    now, <us>)`. Inserted: acquired.
//! 2. On a unique violation: `UPDATE shedlock SET lock_until = now + lockAtMostFor, locked_at = now,
//!    locked_by = <us> WHERE name = 'lock' AND lock_until <= now`. One row: acquired; none: the lock is
//!    held — ShedLock does not wait, the task is skipped (the workload tries again after its think time).
//! 3. The fencing token: `nextval('fence')`.
//! 4. Release: `UPDATE shedlock SET lock_until = now WHERE name = 'lock'` (lockAtLeastFor = 0).
//!
//! `clock = "db"` (`usingDbTime()`): `now` is the database's `now()`, and the release also checks
//! `locked_by = <us>`. `clock = "client"` (the default statements): `now` is the client's clock, and
//! the release does not check the owner — a late release frees a lock someone else has taken over.
//!
//! Expected (catalog): a crashed holder's lock comes free after `lock_at_most_for`; a holder paused longer
//! than that is overtaken while it still works.

use super::{grant_outcome, text, Db, SOCKET_TIMEOUT};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::sql::{Cond, Expr, Op, SqlResult, Stmt, Value};
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "sql.unique-insert-expiry",
    family: &super::FAMILY,
    summary: "ShedLock: a row with lock_until, taken over once it has passed; fails fast when held",
    source: "ShedLock JdbcTemplateLockProvider",
    params: &[
        SOCKET_TIMEOUT,
        ParamSpec::duration("lock_at_most_for", 10_000, "ShedLock's lockAtMostFor: how long a lock lasts at most"),
        ParamSpec {
            name: "clock",
            kind: ParamKind::Choice(&["db", "client"]),
            default: ParamValue::Choice("db"),
            doc: "whose clock sets and checks lock_until: the database's now() (usingDbTime) or the client's",
        },
    ],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: super::pooler_settings,
    build,
};

struct ShedLock {
    ctx: Ctx,
    db: Db,
    params: Params,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(ShedLock { db: Db::new(&ctx, servers, params), ctx, params: params.clone() })
}

impl ShedLock {
    /// `now + offset` by the configured clock.
    fn now_plus(&self, offset_ms: i64) -> Expr {
        match self.params.choice("clock") {
            "db" => Expr::NowPlus(offset_ms),
            _ => Expr::Value(Value::Int(self.ctx.now_ms() + offset_ms)),
        }
    }

    async fn take(&mut self) -> Result<bool, Outcome<()>> {
        let at_most = self.params.duration("lock_at_most_for").as_millis() as i64;
        let row = vec![
            ("lock_until".to_string(), self.now_plus(at_most)),
            ("locked_at".to_string(), self.now_plus(0)),
            ("locked_by".to_string(), text(&self.db.owner)),
        ];
        if self.db.insert("shedlock", "lock", row.clone()).await? {
            return Ok(true);
        }
        let expired = Cond { column: "lock_until".into(), op: Op::Le, rhs: self.now_plus(0) };
        let update = Stmt::Update { table: "shedlock".into(), key: "lock".into(), set: row, cond: vec![expired] };
        let taken = self.db.run(update).await? == SqlResult::Affected(1);
        if taken {
            // The row's lease had passed: whoever still believes it holds the lock holds nothing now.
            self.ctx.took_over();
        }
        Ok(taken)
    }
}

#[async_trait(?Send)]
impl Lock for ShedLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        match self.take().await {
            Ok(true) => {}
            Ok(false) => return Outcome::Fail("locked by another client".into()),
            Err(outcome) => return grant_outcome(outcome),
        }
        let token = self.db.fence().await;
        self.db.granted(token)
    }

    async fn release(&mut self) -> Outcome<()> {
        if let Err(refused) = self.db.releasing(false) {
            return refused;
        }
        let mut cond = Vec::new();
        if self.params.choice("clock") == "db" {
            cond.push(Cond { column: "locked_by".into(), op: Op::Eq, rhs: text(&self.db.owner) });
        }
        let until_now = vec![("lock_until".into(), self.now_plus(0))];
        let unlock = Stmt::Update { table: "shedlock".into(), key: "lock".into(), set: until_now, cond };
        match self.db.run(unlock).await {
            Ok(_) => Outcome::Ok(()),
            Err(outcome) => outcome,
        }
    }
}
