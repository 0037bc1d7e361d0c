//! `zk.sequential`: Curator's InterProcessMutex — a queue of ephemeral-sequential nodes, each waiter
//! watching only its predecessor. `zk.sequential-unprotected`: the same without Curator's protection.
//!
//! Source: Curator `LockInternals.attemptLock` / `internalLockLoop` and `StandardLockInternalsDriver`.
//! 1. Create the parents if needed, then `create <base>/_c_<guid>-lock-` EPHEMERAL_SEQUENTIAL
//!    ("protected": the GUID prefix). If the create's reply is lost, list the children and adopt the one
//!    with our GUID if it was made, else create again. The unprotected variant just creates again,
//!    leaving an orphaned node of its own session behind if the lost create had been applied.
//! 2. `getChildren`, sorted by sequence suffix. If ours is first: acquired; the fencing token is our
//!    node's czxid (not its suffix, which restarts if the parent is recreated).
//! 3. Otherwise `getData` with a watch on the node just before ours. NoNode: it is gone, go to 2.
//!    Else wait for the watch, then go to 2 — always re-checking the children, so a predecessor that
//!    died while we waited does not make us the holder early. On timeout delete our node and fail.
//! 4. Reentrant: a holder that acquires again counts up; release counts down, and at zero deletes our
//!    node with Curator's guaranteed delete: if the reply is lost, it is retried in the background until
//!    it succeeds or the session is gone. A release by a client that does not hold the lock is refused.
//!
//! Expected (catalog): one notification per release (no herd). A holder paused past its session
//! timeout still believes it holds the lock (Curator Tech Note 10). Unprotected, a lost create reply
//! leaves an orphan ahead of everyone, held alive by our own session: nobody gets the lock.

use super::{lost, words, Session, ZkApi, ACQUIRE_TIMEOUT, LOST_ON, SESSION_TIMEOUT};
use crate::params::{ParamSpec, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, ZkClient};
use locksim_sim::backend::zk::{CreateMode, ZkError};
use locksim_sim::ctx::{Background, Ctx};
use std::time::Duration;

const PARAMS: &[ParamSpec] = &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_ON];

pub const PROTECTED: RecipeSpec = RecipeSpec {
    id: "zk.sequential",
    family: &super::FAMILY,
    summary: "Curator InterProcessMutex: sequential queue, watch the predecessor, protected create, reentrant",
    source: "Apache Curator LockInternals / InterProcessMutex",
    params: PARAMS,
    offers_token: true,
    promises_fifo: true,
    validate: super::positive_session,
    build: build_protected,
};

pub const UNPROTECTED: RecipeSpec = RecipeSpec {
    id: "zk.sequential-unprotected",
    summary: "the same queue without the GUID: a lost create reply leaves an orphaned node",
    build: build_unprotected,
    ..PROTECTED
};

/// Where Curator's mutex keeps its queue in these scenarios.
const BASE: &str = "/locks/mutex";
const LOCK_NAME: &str = "lock-";
/// How often a create whose reply was lost is tried again.
const CREATE_TRIES: usize = 3;
/// Pause between background retries of a guaranteed delete.
const RETRY_DELETE: Duration = Duration::from_secs(1);

pub(super) struct Sequential {
    pub(super) ctx: Ctx,
    pub(super) params: Params,
    pub(super) session: Session,
    protected: bool,
    /// The queue's parent node.
    base: &'static str,
    /// Our node, its czxid, the session holding it, and the reentrancy count.
    held: Option<(String, u64, ZkClient, u32)>,
    /// Guaranteed deletes still being retried.
    cleanup: Vec<Background>,
}

fn build_protected(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    build(params, ctx, servers, true)
}

fn build_unprotected(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    build(params, ctx, servers, false)
}

fn build(params: &Params, ctx: Ctx, servers: &Servers, protected: bool) -> Box<dyn Lock> {
    Box::new(Sequential::new(params, ctx, servers, protected, BASE))
}

/// The sequence suffix a child sorts by (Curator's `fixForSorting`).
fn sequence(child: &str) -> &str {
    child.rfind(LOCK_NAME).map_or(child, |i| &child[i + LOCK_NAME.len()..])
}

impl Sequential {
    pub(super) fn new(params: &Params, ctx: Ctx, servers: &Servers, protected: bool, base: &'static str) -> Sequential {
        let session = Session::new(&ctx, servers, params);
        Sequential { ctx, params: params.clone(), session, protected, base, held: None, cleanup: Vec::new() }
    }

    /// Step 1: our node's name and czxid.
    async fn create(&self, zk: &ZkClient) -> Result<(String, u64), Outcome<Grant>> {
        self.create_in(zk, self.base, LOCK_NAME).await
    }

    /// Create `<dir>/<name>` EPHEMERAL_SEQUENTIAL (creating `dir` if needed); protected, adopt our node
    /// by its GUID if the reply was lost. Returns its path and czxid.
    pub(super) async fn create_in(
        &self,
        zk: &ZkClient,
        dir: &str,
        name: &str,
    ) -> Result<(String, u64), Outcome<Grant>> {
        super::ensure_path(zk, dir).await.map_err(|e| Outcome::Fail(words(e)))?;
        let guid = format!("_c_{:016x}-", self.ctx.random_u64());
        let path = if self.protected { format!("{dir}/{guid}{name}") } else { format!("{dir}/{name}") };
        // After a lost reply the node may exist: protected, look for our GUID before creating again
        // (Curator's findProtectedNodeInForeground), and never create again before we could look.
        let mut may_exist = false;
        for _ in 0..CREATE_TRIES {
            if may_exist && self.protected {
                match Self::find_ours(zk, dir, &guid).await {
                    Ok(Some(found)) => return Ok(found),
                    Ok(None) => {}
                    Err(_) => continue,
                }
            }
            match zk.create(&path, CreateMode::EphemeralSequential).await {
                Ok((path, stat)) => return Ok((path, stat.czxid)),
                Err(ClientError::ConnectionLoss) => may_exist = true,
                Err(e) => return Err(Outcome::Fail(words(e))),
            }
        }
        Err(Outcome::Unknown("create: connection loss".into()))
    }

    /// Our node in `dir` by its GUID prefix, with its czxid, if it exists.
    async fn find_ours(zk: &ZkClient, dir: &str, guid: &str) -> Result<Option<(String, u64)>, ClientError> {
        let Some(ours) = zk.get_children(dir).await?.into_iter().find(|c| c.starts_with(guid)) else { return Ok(None) };
        let path = format!("{dir}/{ours}");
        Ok(zk.exists_watch(&path).await?.0.map(|stat| (path, stat.czxid)))
    }

    /// Steps 2–3: wait until our node is first. `Err` carries the outcome of giving up.
    async fn wait_for_turn(&self, zk: &ZkClient, ours: &str) -> Result<(), Outcome<Grant>> {
        let name = &ours[self.base.len() + 1..];
        let deadline = self.ctx.now_ms() + self.params.duration("acquire_timeout").as_millis() as i64;
        loop {
            let mut children = zk.get_children(self.base).await.map_err(|e| Outcome::Fail(words(e)))?;
            children.sort_by(|a, b| sequence(a).cmp(sequence(b)));
            let index = children.iter().position(|c| c == name).ok_or(Outcome::Fail("our node is gone".into()))?;
            if index == 0 {
                return Ok(());
            }
            let watch = match zk.get_data_watch(&format!("{}/{}", self.base, children[index - 1])).await {
                Err(ClientError::Zk(ZkError::NoNode)) => continue,
                Err(e) => return Err(Outcome::Fail(words(e))),
                Ok(watch) => watch,
            };
            let left = Duration::from_millis((deadline - self.ctx.now_ms()).max(0) as u64);
            tokio::select! {
                biased;
                _ = watch.fired() => {}
                _ = self.ctx.sleep(left) => return Err(Outcome::Fail("timed out waiting".into())),
            }
        }
    }

    /// Curator's guaranteed delete: one try now; if its reply is lost, keep trying in the background
    /// (Curator's GuaranteedDeleteBackgroundOperation) until it succeeds or the session is gone.
    pub(super) async fn delete(&mut self, zk: &ZkClient, path: &str) -> Outcome<()> {
        match zk.delete(path).await {
            Ok(()) | Err(ClientError::Zk(ZkError::NoNode)) => Outcome::Ok(()),
            Err(ClientError::ConnectionLoss) => {
                let (zk, path, ctx) = (zk.clone(), path.to_string(), self.ctx.clone());
                self.cleanup.retain(|task| !task.finished());
                self.cleanup.push(self.ctx.spawn(async move {
                    while let Err(ClientError::ConnectionLoss) = zk.delete(&path).await {
                        ctx.sleep(RETRY_DELETE).await;
                    }
                }));
                Outcome::Unknown("delete: connection loss; retrying in the background".into())
            }
            Err(e) => Outcome::Fail(words(e)),
        }
    }
}

#[async_trait(?Send)]
impl Lock for Sequential {
    async fn acquire(&mut self) -> Outcome<Grant> {
        if let Some((_, czxid, _, count)) = &mut self.held {
            *count += 1;
            return Outcome::Ok(Grant { token: Some(*czxid) });
        }
        let Some(zk) = self.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        let (ours, czxid) = match self.create(&zk).await {
            Ok(node) => node,
            Err(outcome) => return outcome,
        };
        if let Err(outcome) = self.wait_for_turn(&zk, &ours).await {
            self.delete(&zk, &ours).await;
            return outcome;
        }
        self.held = Some((ours, czxid, zk, 1));
        Outcome::Ok(Grant { token: Some(czxid) })
    }

    async fn release(&mut self) -> Outcome<()> {
        match &mut self.held {
            None => Outcome::Fail("not held by this client".into()),
            Some((_, _, _, count)) if *count > 1 => {
                *count -= 1;
                Outcome::Ok(())
            }
            Some(_) => {
                let (ours, _, zk, _) = self.held.take().expect("matched");
                self.delete(&zk, &ours).await
            }
        }
    }

    async fn lost(&self) -> String {
        match &self.held {
            Some((_, _, zk, _)) => lost(zk, self.params.choice("lost_on"), &self.ctx).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sequence;

    #[test]
    fn children_sort_by_their_sequence_whatever_their_prefix() {
        let mut c = vec!["_c_ff-lock-0000000003", "lock-0000000001", "_c_00-lock-0000000002"];
        c.sort_by(|a, b| sequence(a).cmp(sequence(b)));
        assert_eq!(c, vec!["lock-0000000001", "_c_00-lock-0000000002", "_c_ff-lock-0000000003"]);
    }
}
