//! `etcd.mutex`: clientv3 `concurrency.Mutex` — a queue of keys ordered by create_revision, each waiter
//! waiting for the deletion of the key just ahead of its own.
//!
//! Source: etcd 3.5 `client/v3/concurrency/mutex.go` and `key.go`, step by step:
//! 1. The client's session: a lease of `ttl`, kept alive (reused across locks; a new one once its
//!    keep-alive has stopped).
//! 2. `tryAcquire`: one Txn If(CreateRevision(prefix/{lease}) = 0) Then(Put(prefix/{lease}, WithLease),
//!    Get(prefix, WithFirstCreate)) Else(Get(prefix/{lease}), Get(prefix, WithFirstCreate)). Our revision
//!    is the transaction's (or our existing key's create_revision). If there is no owner or the owner is
//!    us: acquired.
//! 3. `waitDeletes(prefix, myRev - 1)`: Get the newest key created before ours; if none, done; else watch
//!    it from the Get's revision until its DELETE, and look again. On timeout: Unlock, fail.
//! 4. The fix of PR #11408, first released in etcd 3.5.0 (`recheck = true`): Get our own key; if it is
//!    gone — our lease expired while we waited — fail with ErrSessionExpired. Every 3.4.x release
//!    (`recheck = false`; checked up to 3.4.45) returned here as the holder
//!    regardless: the bug Jepsen found with process pauses and a 2 s TTL.
//! 5. Unlock: Delete our key.
//!
//! The fencing token is our key's create_revision.
//!
//! Expected (catalog): one wake-up per release; FIFO by create_revision. A waiter paused past its TTL
//! while queued becomes a second holder with `recheck = false`, and not with the fix.

use super::{connect_as, live_session, lost_while_held, wait_deletes, whole_seconds, EtcdApi, Session};
use super::{ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON, TTL};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::etcd::{Cmp, Compare, Op, OpResult, Range, Target};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Point, TriggerEvent};

const RECHECK: ParamSpec = ParamSpec {
    name: "recheck",
    kind: ParamKind::Bool,
    default: ParamValue::Bool(true),
    doc: "after waiting, check that our key still exists (etcd >= 3.5.0); false is every 3.4.x Lock",
};

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "etcd.mutex",
    family: &super::FAMILY,
    summary: "clientv3 concurrency.Mutex: keys queued by create_revision, wait for the one just ahead",
    source: "etcd client/v3/concurrency Mutex (3.5; recheck = false is every 3.4.x)",
    params: &[TTL, ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON, RECHECK],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[MUTEX_CHECKED, LEASE_RENEW],
    validate: whole_seconds,
    build,
};

/// The wait for the keys ahead has ended and the re-check found our key (3.5) — or, without it (3.4.x),
/// the wait has just ended — and the grant is returned next. A pause here outlives the lease before the
/// client records its grant: the window the re-check cannot close.
pub const MUTEX_CHECKED: Point = Point {
    name: "etcd-mutex-checked",
    doc: "etcd.mutex: the wait is over and the re-check found our key; the grant is returned next",
};

const PREFIX: &str = "/mutex/";

struct Mutex {
    ctx: Ctx,
    params: Params,
    etcd: super::EtcdConn,
    session: Option<Session>,
    /// Our key and its create_revision while we hold the lock.
    held: Option<(String, i64)>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let etcd = connect_as(&ctx, servers, params);
    Box::new(Mutex { ctx, params: params.clone(), etcd, session: None, held: None })
}

/// The keys of a Range result.
fn kvs(result: &OpResult) -> &[locksim_sim::backend::etcd::KeyValue] {
    match result {
        OpResult::Range { kvs, .. } => kvs,
        other => unreachable!("a Get answered with {other:?}"),
    }
}

impl Mutex {
    /// Step 2: our key and revision, and whether we hold the lock already.
    async fn try_acquire(&self, lease: i64) -> Result<(String, i64, bool), Outcome<Grant>> {
        let my_key = format!("{PREFIX}{lease:x}");
        let absent = Compare { key: my_key.clone(), cmp: Cmp::Equal, target: Target::CreateRevision(0) };
        let put = Op::Put { key: my_key.clone(), value: String::new(), lease };
        let owner = Op::Range(Range::first_created(PREFIX));
        let txn = self
            .etcd
            .txn(vec![absent], vec![put, owner.clone()], vec![Op::Range(Range::key(&my_key)), owner])
            .await
            .map_err(|e| e.outcome("txn"))?;
        let my_rev = match txn.succeeded {
            true => txn.revision,
            false => kvs(&txn.results[0]).first().map_or(txn.revision, |kv| kv.create_revision),
        };
        let first = kvs(&txn.results[1]).first().map(|kv| kv.create_revision);
        Ok((my_key, my_rev, first.is_none_or(|rev| rev == my_rev)))
    }

    /// Steps 3–4, bounded by `acquire_timeout`. A failed wait or Get unlocks (deletes our key), as
    /// `Lock` does; a lost key is simply reported.
    async fn wait_for_turn(&self, my_key: &str, my_rev: i64) -> Result<(), Outcome<Grant>> {
        let waited = tokio::select! {
            biased;
            waited = wait_deletes(&self.etcd, PREFIX, my_rev - 1) => waited.map_err(|e| e.outcome("wait")),
            () = self.ctx.sleep(self.params.duration("acquire_timeout")) => Err(Outcome::Fail("timed out waiting".into())),
        };
        let checked = match waited {
            Ok(()) if self.params.bool("recheck") => {
                self.etcd.get(Range::key(my_key)).await.map_err(|e| e.outcome("get"))
            }
            Ok(()) => {
                self.ctx.point(TriggerEvent::Declared(&MUTEX_CHECKED)).await;
                return Ok(());
            }
            Err(outcome) => Err(outcome),
        };
        match checked {
            Ok((mine, _)) if mine.is_empty() => Err(Outcome::Fail("session expired: our key is gone".into())),
            Ok(_) => {
                // The window the re-check cannot close: our key was there when etcd answered.
                self.ctx.point(TriggerEvent::Declared(&MUTEX_CHECKED)).await;
                Ok(())
            }
            Err(outcome) => {
                let _ = self.etcd.delete(my_key).await;
                Err(outcome)
            }
        }
    }
}

#[async_trait(?Send)]
impl Lock for Mutex {
    async fn acquire(&mut self) -> Outcome<Grant> {
        if let Err(e) = live_session(&mut self.session, &self.etcd, self.params.duration("ttl")).await {
            return e.outcome("session");
        }
        let lease = self.session.as_ref().expect("live").lease;
        let (my_key, my_rev, owner) = match self.try_acquire(lease).await {
            Ok(attempt) => attempt,
            Err(outcome) => return outcome,
        };
        if !owner {
            if let Err(outcome) = self.wait_for_turn(&my_key, my_rev).await {
                return outcome;
            }
        }
        self.held = Some((my_key, my_rev));
        Outcome::Ok(Grant { token: Some(my_rev as u64) })
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some((my_key, _)) = self.held.take() else { return Outcome::Fail("not held by this client".into()) };
        match self.etcd.delete(&my_key).await {
            Ok(()) => Outcome::Ok(()),
            Err(e) => e.outcome("delete"),
        }
    }

    async fn lost(&self) -> String {
        lost_while_held(&self.held, &self.session, &self.params).await
    }
}
