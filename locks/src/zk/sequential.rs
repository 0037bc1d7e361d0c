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
//!    Each `getChildren` and `getData` runs in Curator's `RetryLoop`: a connection loss is retried by
//!    the client's retry policy (`ExponentialBackoffRetry(1000, 3)`), keeping our node and our place;
//!    only when the retries run out does the wait fail. Like every Curator operation (the create of
//!    step 1 and the delete of step 4 too), it first waits while disconnected, up to Curator's
//!    connection timeout of 15 s.
//!    Else wait for the watch, then go to 2 — always re-checking the children, so a predecessor that
//!    died while we waited does not make us the holder early. On timeout delete our node and fail.
//! 4. Reentrant: a holder that acquires again counts up; release counts down, and at zero deletes our
//!    node with Curator's guaranteed delete: if the reply is lost, it is retried in the background until
//!    it succeeds or the session is gone. A release by a client that does not hold the lock is refused.
//!
//! With `client = "kazoo"` the same queue runs as kazoo's `Lock` (`kazoo/recipe/lock.py`, whose
//! `_inner_acquire` is these steps with a `<uuid>__lock__` prefix found again after a connection loss)
//! on kazoo's client: no 15 s wait for a connection (kazoo queues the request), connection losses
//! retried by `KazooRetry` (0.1 s doubling, jittered, without end), watches ended at SUSPENDED (kazoo's
//! `_reset_watchers` wakes the waiter, which looks again), and LOST only when the session expired. Not
//! followed: kazoo's release retries its delete in the foreground (`client.retry`), here in the
//! background as Curator's guaranteed delete.
//!
//! With `client = "curator-4.0"` or `"curator-4.2"` the handle gives a session up once SUSPENDED has
//! lasted the session timeout and opens a new one ([`ZkSession::injecting_expiry`]), and step 1's create
//! runs each retry on the handle's session of the moment: 4.0 adopts its GUID's node even from the old
//! session, whose expiry then takes the lock away unseen (CURATOR-498); 4.2 deletes that node and creates
//! another. With every Curator flavour, a protected create given up after a connection loss has its
//! node looked for and deleted in the background (CURATOR-45).
//!
//! Expected (catalog): one notification per release (no herd). A holder paused past its session
//! timeout still believes it holds the lock (Curator Tech Note 10). Unprotected, a lost create reply
//! leaves an orphan ahead of everyone, held alive by our own session: nobody gets the lock.

use super::{
    back_off, lost, retried, until_connected, words, Flavour, ZkApi, ZkSession, ACQUIRE_TIMEOUT, CLIENT,
    CURATOR_RETRIES, LOST_ON, SESSION_TIMEOUT,
};
use crate::params::{ParamSpec, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, ZkClient};
use locksim_sim::backend::zk::{CreateMode, SessionId, Stat, ZkError};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::{Background, Ctx};
use locksim_sim::fault::{Point, TriggerEvent};
use std::time::Duration;

const PARAMS: &[ParamSpec] = &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_ON, CLIENT];

pub const PROTECTED: RecipeSpec = RecipeSpec {
    id: "zk.sequential",
    family: &super::FAMILY,
    summary: "Curator InterProcessMutex: sequential queue, watch the predecessor, protected create, reentrant",
    source: "Apache Curator LockInternals / InterProcessMutex",
    params: PARAMS,
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[QUEUE_CREATE, LEASE_RENEW],
    validate: super::positive_session,
    build: build_protected,
};

pub const UNPROTECTED: RecipeSpec = RecipeSpec {
    id: "zk.sequential-unprotected",
    summary: "the same queue without the GUID: a lost create reply leaves an orphaned node",
    build: build_unprotected,
    ..PROTECTED
};

/// A ZooKeeper queue lock (Curator's `createsTheLock`: every `zk.*` recipe but `zk.ephemeral`) is about
/// to create its sequential node. A `drop-reply` started here loses that create's reply, which the server
/// applied: the window of a retried create.
pub const QUEUE_CREATE: Point =
    Point { name: "zk-queue-create", doc: "a ZooKeeper queue lock is about to create its sequential node" };

/// Curator's mutex queue in these scenarios.
const MUTEX: Queue = Queue { dir: "/locks/mutex", name: "lock-", driver: Driver::Exclusive };
/// How often a create whose reply was lost is tried again.
const CREATE_TRIES: usize = 3;
/// Pause between background retries of a guaranteed delete.
const RETRY_DELETE: Duration = Duration::from_secs(1);

/// Who gets the lock, from the sorted children (Curator's `LockInternalsDriver.getsTheLock`).
#[derive(Clone, Copy)]
pub(super) enum Driver {
    /// One holder: the first node holds it; a waiter watches the node just before its own
    /// (StandardLockInternalsDriver with maxLeases = 1).
    Exclusive,
    /// A reader of a read-write lock: it holds the lock unless a writer's node (named `writer`) comes
    /// before its own, and then it watches the first such writer (`readLockPredicate`).
    Shared { writer: &'static str },
    /// At once: the client holds the write lock, and Curator lets a writer take the read lock too.
    Granted,
}

/// One Curator lock queue: its parent node, the name its nodes get, and who gets the lock.
#[derive(Clone, Copy)]
pub(super) struct Queue {
    pub(super) dir: &'static str,
    pub(super) name: &'static str,
    pub(super) driver: Driver,
}

impl Queue {
    /// The node to wait for, or `None` if the node at `index` of the sorted `children` holds the lock.
    fn blocker<'c>(&self, children: &'c [String], index: usize) -> Option<&'c String> {
        match self.driver {
            Driver::Exclusive => index.checked_sub(1).map(|before| &children[before]),
            Driver::Shared { writer } => children[..index].iter().find(|c| c.contains(writer)),
            Driver::Granted => None,
        }
    }
}

/// A lock node we hold: its path, czxid, the session it lives in, and the reentrancy count.
pub(super) struct Held {
    path: String,
    czxid: u64,
    pub(super) zk: ZkClient,
    count: u32,
}

/// The mechanism every Curator queue lock shares: one client's session, protected creates, waiting for
/// a turn, guaranteed deletes.
pub(super) struct Sequential {
    pub(super) ctx: Ctx,
    pub(super) params: Params,
    pub(super) session: ZkSession,
    flavour: Flavour,
    protected: bool,
    /// Guaranteed deletes still being retried.
    cleanup: Vec<Background>,
}

/// `zk.sequential` and `zk.sequential-unprotected`: one exclusive queue.
struct Mutex {
    core: Sequential,
    held: Option<Held>,
}

fn build_protected(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(Mutex { core: Sequential::new(params, ctx, servers, true), held: None })
}

fn build_unprotected(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    Box::new(Mutex { core: Sequential::new(params, ctx, servers, false), held: None })
}

/// The sequence suffix a child sorts by: ZooKeeper's ten digits, whatever the node's name before them
/// (Curator's `fixForSorting`, which for the read-write lock strips either lock name).
pub(super) fn sequence(child: &str) -> &str {
    &child[child.len().saturating_sub(10)..]
}

impl Sequential {
    pub(super) fn new(params: &Params, ctx: Ctx, servers: &Servers, protected: bool) -> Sequential {
        let flavour = Flavour::of(params);
        let mut session = ZkSession::new(&ctx, servers, params.duration("session_timeout")).speaking(flavour.library());
        if flavour.injects_expiry() {
            session = session.injecting_expiry(&ctx);
        }
        Sequential { ctx, params: params.clone(), session, flavour, protected, cleanup: Vec::new() }
    }

    /// Take the lock of `queue` into `slot`: count up if it is already ours (reentrant), else steps 1–3.
    pub(super) async fn acquire(&mut self, slot: &mut Option<Held>, queue: Queue) -> Outcome<Grant> {
        if let Some(held) = slot {
            held.count += 1;
            return Outcome::Ok(Grant { token: Some(held.czxid) });
        }
        let Some(zk) = self.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        let (path, stat, zk) = match self.create_in(&zk, queue.dir, queue.name).await {
            Ok(node) => node,
            Err(outcome) => return outcome,
        };
        let czxid = stat.czxid;
        if let Err(outcome) = self.wait_for_turn(&zk, queue, &path).await {
            self.delete(&zk, &path).await;
            return outcome;
        }
        self.ctx.held_in(stat.ephemeral_owner);
        *slot = Some(Held { path, czxid, zk, count: 1 });
        Outcome::Ok(Grant { token: Some(czxid) })
    }

    /// Step 4: count down; at zero, delete our node. Refused if `slot` holds nothing.
    pub(super) async fn release(&mut self, slot: &mut Option<Held>) -> Outcome<()> {
        match slot {
            None => Outcome::Fail("not held by this client".into()),
            Some(held) if held.count > 1 => {
                held.count -= 1;
                Outcome::Ok(())
            }
            Some(_) => {
                let held = slot.take().expect("matched");
                self.delete(&held.zk, &held.path).await
            }
        }
    }

    /// Resolves when the holder of `slot` must, by `lost_on`, treat its lock as lost.
    pub(super) async fn lost(&self, slot: &Option<Held>) -> String {
        match slot {
            Some(held) => lost(&held.zk, self.params.choice("lost_on"), &self.ctx).await,
            None => std::future::pending().await,
        }
    }

    /// Create `<dir>/<name>` EPHEMERAL_SEQUENTIAL (creating `dir` if needed); protected, adopt our node
    /// by its GUID if the reply was lost. Returns its path, its stat (the czxid our fencing token is, the
    /// session that owns it) and the client of the handle's session it was made or found through (`zk`,
    /// but for the flavours whose handle changes sessions: [`Sequential::create_on_handle`]).
    pub(super) async fn create_in(
        &mut self,
        zk: &ZkClient,
        dir: &str,
        name: &str,
    ) -> Result<(String, Stat, ZkClient), Outcome<Grant>> {
        // One `RetryLoop.callWithRetry` in Curator (`CreateBuilderImpl.pathInForeground`): it first waits
        // for a connection.
        until_connected(&self.ctx, zk).await;
        if self.flavour.injects_expiry() {
            return self.create_on_handle(dir, name).await;
        }
        super::ensure_path(zk, dir).await.map_err(|e| Outcome::Fail(words(e)))?;
        let guid = format!("_c_{:016x}-", self.ctx.random_u64());
        let path = if self.protected { format!("{dir}/{guid}{name}") } else { format!("{dir}/{name}") };
        // After a lost reply the node may exist: protected, look for our GUID before creating again
        // (Curator's findProtectedNodeInForeground), and never create again before we could look.
        let mut may_exist = false;
        for _ in 0..CREATE_TRIES {
            if may_exist && self.protected {
                match Self::find_ours(zk, dir, &guid).await {
                    Ok(Some((path, stat))) => return Ok((path, stat, zk.clone())),
                    Ok(None) => {}
                    Err(_) => continue,
                }
            }
            self.ctx.point(TriggerEvent::Declared(&QUEUE_CREATE)).await;
            match zk.create(&path, CreateMode::EphemeralSequential).await {
                Ok((path, stat)) => return Ok((path, stat, zk.clone())),
                Err(ClientError::ConnectionLoss) => may_exist = true,
                Err(e) => return Err(Outcome::Fail(words(e))),
            }
        }
        // Given up after a connection loss, the node may exist: Curator finds it by its GUID and
        // deletes it in the background (CURATOR-45), or it would block the queue for as long as its
        // session lives.
        if self.protected && self.flavour == Flavour::Curator {
            self.find_and_delete(dir, guid);
        }
        Err(Outcome::Unknown("create: connection loss".into()))
    }

    /// Curator 4's create (`CreateBuilderImpl.pathInForeground` in `RetryLoop.callWithRetry`) on a
    /// handle that opens a new session when the old one is given up ([`Flavour::injects_expiry`]):
    /// each attempt runs on the handle's session of the moment; each after the first, protected, first
    /// looks for our GUID (`findProtectedNodeInForeground`); a connection loss or an expired session is
    /// tried again under `ExponentialBackoffRetry(1000, 3)`.
    ///
    /// The node found may be the old session's, which the server keeps until it expires that session.
    /// Curator 4.0 takes it (CURATOR-498): the lock then lives in a session this client no longer
    /// has, and goes when the server expires it, unseen. Curator 4.2 remembers the session of the first
    /// attempt (`ProtectedMode.checkSetSessionId`) and, the session having changed, deletes the node
    /// found in the background and creates another (`validateFoundNode`).
    async fn create_on_handle(&mut self, dir: &str, name: &str) -> Result<(String, Stat, ZkClient), Outcome<Grant>> {
        super::ensure_path(&self.session, dir).await.map_err(|e| Outcome::Fail(words(e)))?;
        let guid = format!("_c_{:016x}-", self.ctx.random_u64());
        let path = if self.protected { format!("{dir}/{guid}{name}") } else { format!("{dir}/{name}") };
        // `ProtectedMode.sessionId`: the session of the first attempt, then of the last one that looked.
        let mut owner = None;
        let mut retries = 0;
        loop {
            let attempt = self.attempt_create(retries == 0, &mut owner, dir, &guid, &path).await;
            match attempt {
                Ok(node) => return Ok(node),
                Err(ClientError::ConnectionLoss | ClientError::Zk(ZkError::SessionExpired))
                    if retries < CURATOR_RETRIES =>
                {
                    back_off(&self.ctx, retries).await;
                    retries += 1;
                }
                Err(ClientError::ConnectionLoss) => {
                    if self.protected {
                        self.find_and_delete(dir, guid);
                    }
                    return Err(Outcome::Unknown("create: connection loss".into()));
                }
                Err(e) => return Err(Outcome::Fail(words(e))),
            }
        }
    }

    /// A protected create given up after a connection loss may have made its node: Curator looks for
    /// it by its GUID and deletes it in the background, on the handle's session of the moment, trying
    /// again after each connection loss (`protectedPathInForeground` →
    /// `FindAndDeleteProtectedNodeInBackground`, CURATOR-45 and CURATOR-79).
    fn find_and_delete(&mut self, dir: &str, guid: String) {
        let (ctx, session, dir) = (self.ctx.clone(), self.session.clone(), dir.to_string());
        self.cleanup.retain(|task| !task.finished());
        self.cleanup.push(self.ctx.spawn(async move {
            loop {
                let found = match session.live().await {
                    Some(zk) => Self::find_ours(&zk, &dir, &guid).await.map(|found| found.map(|(path, _)| (zk, path))),
                    None => Err(ClientError::ConnectionLoss),
                };
                let deleted = match found {
                    Ok(Some((zk, path))) => zk.delete(&path).await,
                    Ok(None) => return,
                    Err(e) => Err(e),
                };
                match deleted {
                    Err(ClientError::ConnectionLoss | ClientError::Zk(ZkError::SessionExpired)) => {
                        ctx.sleep(RETRY_DELETE).await
                    }
                    _ => return,
                }
            }
        }));
    }

    /// One attempt of [`Sequential::create_on_handle`].
    async fn attempt_create(
        &mut self,
        first: bool,
        owner: &mut Option<SessionId>,
        dir: &str,
        guid: &str,
        path: &str,
    ) -> Result<(String, Stat, ZkClient), ClientError> {
        let zk = self.session.live().await.ok_or(ClientError::ConnectionLoss)?;
        let session = zk.session_id();
        let first_session = *owner.get_or_insert(session);
        if !first && self.protected {
            let found = Self::find_ours(&zk, dir, guid).await?;
            let moved = self.flavour == Flavour::Curator42 && first_session != session;
            match found {
                Some((found, stat)) if !moved => return Ok((found, stat, zk)),
                Some((found, _)) => self.keep_deleting(zk.clone(), found),
                None => {}
            }
            if moved {
                *owner = Some(session);
            }
        }
        self.ctx.point(TriggerEvent::Declared(&QUEUE_CREATE)).await;
        let (path, stat) = zk.create(path, CreateMode::EphemeralSequential).await?;
        Ok((path, stat, zk))
    }

    /// Our node in `dir` by its GUID prefix, with its stat, if it exists. Curator's
    /// `findProtectedNodeInForeground` lists the children without a watch; the `exists` after it (also
    /// without a watch) only reads the czxid our fencing token needs, and the session it lives in.
    async fn find_ours(zk: &ZkClient, dir: &str, guid: &str) -> Result<Option<(String, Stat)>, ClientError> {
        let Some(ours) = zk.get_children(dir).await?.into_iter().find(|c| c.starts_with(guid)) else { return Ok(None) };
        let path = format!("{dir}/{ours}");
        Ok(zk.exists(&path).await?.map(|stat| (path, stat)))
    }

    /// Steps 2–3: wait until the queue's driver says our node holds the lock. `Err` carries the outcome
    /// of giving up.
    async fn wait_for_turn(&self, zk: &ZkClient, queue: Queue, ours: &str) -> Result<(), Outcome<Grant>> {
        let name = &ours[queue.dir.len() + 1..];
        let deadline = self.ctx.now_ms() + self.params.duration("acquire_timeout").as_millis() as i64;
        loop {
            let mut children =
                retried(&self.ctx, zk, || zk.get_children(queue.dir)).await.map_err(|e| Outcome::Fail(words(e)))?;
            children.sort_by(|a, b| sequence(a).cmp(sequence(b)));
            let index = children.iter().position(|c| c == name).ok_or(Outcome::Fail("our node is gone".into()))?;
            let Some(blocker) = queue.blocker(&children, index) else { return Ok(()) };
            let blocker = format!("{}/{blocker}", queue.dir);
            let watch = match retried(&self.ctx, zk, || zk.get_data_watch(&blocker)).await {
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
        // The first try is a `RetryLoop.callWithRetry` (`DeleteBuilderImpl.pathInForeground`): it first
        // waits for a connection.
        until_connected(&self.ctx, zk).await;
        match zk.delete(path).await {
            Ok(()) | Err(ClientError::Zk(ZkError::NoNode)) => Outcome::Ok(()),
            Err(ClientError::ConnectionLoss) => {
                self.keep_deleting(zk.clone(), path.to_string());
                Outcome::Unknown("delete: connection loss; retrying in the background".into())
            }
            Err(e) => Outcome::Fail(words(e)),
        }
    }

    /// Delete `path` in the background, trying again after each connection loss until it is done or
    /// the session is gone (Curator's `FailedDeleteManager` / GuaranteedDeleteBackgroundOperation).
    fn keep_deleting(&mut self, zk: ZkClient, path: String) {
        let ctx = self.ctx.clone();
        self.cleanup.retain(|task| !task.finished());
        self.cleanup.push(self.ctx.spawn(async move {
            while let Err(ClientError::ConnectionLoss) = zk.delete(&path).await {
                ctx.sleep(RETRY_DELETE).await;
            }
        }));
    }
}

#[async_trait(?Send)]
impl Lock for Mutex {
    async fn acquire(&mut self) -> Outcome<Grant> {
        self.core.acquire(&mut self.held, MUTEX).await
    }

    async fn release(&mut self) -> Outcome<()> {
        self.core.release(&mut self.held).await
    }

    async fn lost(&self) -> String {
        self.core.lost(&self.held).await
    }
}

#[cfg(test)]
mod tests {
    use super::sequence;

    #[test]
    fn children_sort_by_their_sequence_whatever_their_prefix() {
        let mut c = vec!["_c_ff-__WRIT__0000000003", "lock-0000000001", "_c_00-__READ__0000000002"];
        c.sort_by(|a, b| sequence(a).cmp(sequence(b)));
        assert_eq!(c, vec!["lock-0000000001", "_c_00-__READ__0000000002", "_c_ff-__WRIT__0000000003"]);
    }
}
