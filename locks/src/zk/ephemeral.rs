//! `zk.ephemeral`: every contender creates the same ephemeral node; the losers watch it.
//!
//! Source: the simplest ZooKeeper lock (the ZooKeeper recipes page warns of its herd effect).
//! 1. `create /lock` EPHEMERAL. Success: acquired; the fencing token is the node's czxid.
//! 2. NodeExists: `exists /lock` with a watch; if it is already gone, go to 1; else wait for the watch
//!    (any change), then go to 1. Give up after `acquire_timeout`.
//! 3. Release: `delete /lock`.
//!
//! Expected (catalog): every release wakes every waiter — the herd grows with the number of clients.
//! A holder paused past its session timeout loses the node while it still believes it holds the lock.

use super::{lost, words, ZkApi, ZkSession, ACQUIRE_TIMEOUT, LOST_ON, SESSION_TIMEOUT};
use crate::params::Params;
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, ZkClient};
use locksim_sim::backend::zk::{CreateMode, ZkError};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "zk.ephemeral",
    family: &super::FAMILY,
    summary: "one ephemeral node; every waiter watches it (herd effect)",
    source: "ZooKeeper recipes page (the naive lock it improves on)",
    params: &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_ON],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: false,
    points: &[LEASE_RENEW],
    validate: super::positive_session,
    build,
};

const LOCK: &str = "/lock";

struct Ephemeral {
    ctx: Ctx,
    params: Params,
    session: ZkSession,
    holding: Option<ZkClient>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let session = ZkSession::new(&ctx, servers, params.duration("session_timeout"));
    Box::new(Ephemeral { ctx, params: params.clone(), session, holding: None })
}

#[async_trait(?Send)]
impl Lock for Ephemeral {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let Some(zk) = self.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        let budget = self.params.duration("acquire_timeout");
        let deadline = self.ctx.now_ms() + budget.as_millis() as i64;
        loop {
            match zk.create(LOCK, CreateMode::Ephemeral).await {
                Ok((_, stat)) => {
                    self.holding = Some(zk);
                    return Outcome::Ok(Grant { token: Some(stat.czxid) });
                }
                Err(ClientError::Zk(ZkError::NodeExists)) => {}
                Err(ClientError::ConnectionLoss) => return Outcome::Unknown("create: connection loss".into()),
                Err(e) => return Outcome::Fail(words(e)),
            }
            let watch = match zk.exists_watch(LOCK).await {
                Ok((None, _)) => continue,
                Ok((Some(_), watch)) => watch,
                Err(e) => return Outcome::Fail(words(e)),
            };
            let left = (deadline - self.ctx.now_ms()).max(0) as u64;
            tokio::select! {
                biased;
                _ = watch.fired() => {}
                _ = self.ctx.sleep(std::time::Duration::from_millis(left)) => return Outcome::Fail("timed out waiting".into()),
            }
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some(zk) = self.holding.take() else { return Outcome::Fail("not held by this client".into()) };
        match zk.delete(LOCK).await {
            Ok(()) => Outcome::Ok(()),
            Err(ClientError::ConnectionLoss) => Outcome::Unknown("delete: connection loss".into()),
            Err(e) => Outcome::Fail(words(e)),
        }
    }

    async fn lost(&self) -> String {
        match &self.holding {
            Some(zk) => lost(zk, self.params.choice("lost_on"), &self.ctx).await,
            None => std::future::pending().await,
        }
    }
}
