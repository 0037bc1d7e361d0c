//! `etcd.txn-lease`: the widely copied clientv3 Txn + Lease lock from blog posts — one key, a lease, fail fast.
//! `etcd.txn-lease-wait`: the same, but a loser watches the key and tries again when it is deleted.
//!
//! Source: the blog-post recipe's code, step by step:
//! 1. `Grant` a lease of `ttl` and `KeepAlive` it in the background (the keep-alive channel is only
//!    drained, so a stopped keep-alive goes unnoticed unless `lost_on = "keepalive"`).
//! 2. `Txn` If(CreateRevision(lock) = 0) Then(Put(lock, lease, WithLease(lease))) Else(Get(lock)).
//! 3. Succeeded: acquired. The fencing token is the key's create_revision (the transaction's revision).
//!    Failed: fail fast — cancel the keep-alive and revoke the lease (the `defer`s).
//!    `-wait`: watch the key from the next revision and on its DELETE go back to 2, until
//!    `acquire_timeout`; every waiter watches the same key, so every release wakes them all.
//! 4. Release: cancel the keep-alive and revoke the lease, which deletes the key.
//!
//! Expected (catalog): a holder whose keep-alive is cut off (a pause or a partition longer than the
//! TTL) loses the key while it still believes it holds the lock.

use super::{
    connect_as, whole_seconds, EtcdApi, Failed, Session, ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON, TTL,
};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::etcd::{Cmp, Compare, EventType, Op, Range, Target};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const FAIL_FAST: RecipeSpec = RecipeSpec {
    id: "etcd.txn-lease",
    family: &super::FAMILY,
    summary: "txn create_revision(lock) = 0 then put with a kept-alive lease; fail fast when taken",
    source: "the blog-post clientv3 Txn + Lease + KeepAlive lock",
    params: &[TTL, CALL_TIMEOUT, ENDPOINTS, LOST_ON],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[LEASE_RENEW],
    validate: whole_seconds,
    build: build_fail_fast,
};

pub const WAIT: RecipeSpec = RecipeSpec {
    id: "etcd.txn-lease-wait",
    summary: "the same lock, but a loser watches the key and retries on its deletion (every waiter wakes)",
    source: "the blog-post recipe's suggested improvement: watch and retry",
    params: &[TTL, ACQUIRE_TIMEOUT, CALL_TIMEOUT, ENDPOINTS, LOST_ON],
    build: build_wait,
    ..FAIL_FAST
};

const LOCK: &str = "/lock";

struct TxnLease {
    ctx: Ctx,
    params: Params,
    etcd: super::EtcdConn,
    wait: bool,
    held: Option<Session>,
}

fn build_fail_fast(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let etcd = connect_as(&ctx, servers, params);
    Box::new(TxnLease { ctx, params: params.clone(), etcd, wait: false, held: None })
}

fn build_wait(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let etcd = connect_as(&ctx, servers, params);
    Box::new(TxnLease { ctx, params: params.clone(), etcd, wait: true, held: None })
}

impl TxnLease {
    /// What is left of `acquire_timeout` since `start` (monotonic milliseconds).
    fn left(&self, start: i64) -> Duration {
        let waited = Duration::from_millis((self.ctx.monotonic_ms() - start).max(0) as u64);
        self.params.duration("acquire_timeout").saturating_sub(waited)
    }

    /// Step 3, `-wait`: until the key is deleted (`Ok(false)`: the wait timed out).
    async fn wait_for_delete(&self, revision: i64, left: Duration) -> Result<bool, Failed> {
        let mut watcher = self.etcd.watch(LOCK, false, revision + 1).await.map_err(|_| Failed::Timeout)?;
        let deleted = async {
            while let Some(response) = watcher.next().await {
                if response.events.iter().any(|e| e.kind == EventType::Delete) {
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            () = deleted => Ok(true),
            () = self.ctx.sleep(left) => Ok(false),
        }
    }

    /// The `defer`s: stop keeping the lease alive and revoke it (deleting the key if we made it).
    async fn give_up(&self, session: Session) {
        let lease = session.lease;
        drop(session);
        let _ = self.etcd.revoke(lease).await;
    }
}

#[async_trait(?Send)]
impl Lock for TxnLease {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let session = match Session::new(&self.etcd, self.params.duration("ttl")).await {
            Ok(session) => session,
            Err(e) => return e.outcome("grant"),
        };
        let start = self.ctx.monotonic_ms();
        loop {
            let free = Compare { key: LOCK.into(), cmp: Cmp::Equal, target: Target::CreateRevision(0) };
            let put = Op::Put { key: LOCK.into(), value: format!("{:x}", session.lease), lease: session.lease };
            let txn = match self.etcd.txn(vec![free], vec![put], vec![Op::Range(Range::key(LOCK))]).await {
                Ok(txn) => txn,
                Err(e) => {
                    self.give_up(session).await;
                    return e.outcome("txn");
                }
            };
            if txn.succeeded {
                self.held = Some(session);
                return Outcome::Ok(Grant { token: Some(txn.revision as u64) });
            }
            let outcome = match self.wait {
                false => Outcome::Fail("locked by another client".into()),
                true => match self.wait_for_delete(txn.revision, self.left(start)).await {
                    Ok(true) => continue,
                    Ok(false) => Outcome::Fail("timed out waiting".into()),
                    Err(e) => e.outcome("watch"),
                },
            };
            self.give_up(session).await;
            return outcome;
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some(session) = self.held.take() else { return Outcome::Fail("not held by this client".into()) };
        let lease = session.lease;
        drop(session);
        match self.etcd.revoke(lease).await {
            Ok(()) => Outcome::Ok(()),
            Err(e) => e.outcome("revoke"),
        }
    }

    async fn lost(&self) -> String {
        match &self.held {
            Some(session) => session.lost(&self.params).await,
            None => std::future::pending().await,
        }
    }
}
