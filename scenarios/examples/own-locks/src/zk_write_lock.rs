//! ZooKeeper's own lock recipe, `WriteLock` (zookeeper-recipes-lock), as an application uses it: it
//! names its node after its session, so that after a lost connection it can find the node its create
//! made before the reply was lost.
//!
//! Take (`my.zk-write-lock`; `WriteLock.lock()`, waiting as its `LockListener` would):
//! 1. With no node yet: the prefix `x-<session id>-` (`zookeeper.getSessionId()`); a child of the lock
//!    directory with that prefix is ours, from a create whose reply was lost; if there is none, create
//!    `<dir>/x-<session id>-` ephemeral and sequential.
//! 2. List the children, sorted by their sequence number: ours first — held; its `czxid` is the token.
//! 3. Else watch the child just before ours (`exists` with a watch): when it goes, back to 2.
//!
//! Every step is retried on a connection loss (`ProtocolSupport.retryOperation`: 10 tries, sleeping
//! 500 ms × the try number between them). Release: delete our node. `scenarios/zk-write-lock-drop-reply.toml`
//! loses replies at random — creates among them — and the lock stays safe and live: the session's
//! prefix finds the node a lost create made. With `find_by_session = false` (a copy that skips the
//! lookup) a lost create leaves an orphan node ahead of everyone for as long as its session lives:
//! `zk-write-lock-orphan.toml` finds that `deadlock`.
//!
//! With `shared_session = true` and two workers per client (`zk-write-lock-shared-session.toml`), two
//! lock objects live on one session, as in an application with one `ZooKeeper` handle: the second finds
//! the first's node by the session's prefix, takes it for its own, and both hold the lock —
//! `double-holder`. The prefix names a session, not a lock object.

use locksim_locks::params::{ParamKind, ParamSpec, ParamValue, Params};
use locksim_locks::zk::{ensure_path, words, ZkApi, ZkSession, FAMILY, SESSION_TIMEOUT};
use locksim_locks::{async_trait, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, ZkClient};
use locksim_sim::backend::zk::{CreateMode, ZkError};
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "my.zk-write-lock",
    family: &FAMILY,
    summary: "ZooKeeper's WriteLock: a node x-<session id>-N, found again by its session's prefix after a lost reply",
    source: "ZooKeeper zookeeper-recipes-lock WriteLock (examples/own-locks)",
    params: &[
        SESSION_TIMEOUT,
        ParamSpec {
            name: "find_by_session",
            kind: ParamKind::Bool,
            default: ParamValue::Bool(true),
            doc: "look for a node of our session's prefix before creating one (false: a copy without the lookup)",
        },
        ParamSpec {
            name: "shared_session",
            kind: ParamKind::Bool,
            default: ParamValue::Bool(false),
            doc: "every lock object of a client on one ZooKeeper handle (an application's one `ZooKeeper`), \
                  as `[workload] workers` drives them; false: a handle of its own per lock",
        },
    ],
    offers_token: true,
    offers_shared: false,
    guard: Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: locksim_locks::zk::positive_session,
    build,
};

const DIR: &str = "/my-locks/write-lock";

/// `ProtocolSupport`: tries, and the sleep before the n-th retry is n times this.
const RETRIES: u32 = 10;
const RETRY_DELAY: Duration = Duration::from_millis(500);

struct WriteLock {
    ctx: Ctx,
    session: ZkSession,
    /// Our node (`id`), its czxid, and the session it lives in.
    id: Option<(String, u64, ZkClient)>,
    find_by_session: bool,
    holding: bool,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let open = || ZkSession::new(&ctx, servers, params.duration("session_timeout"));
    // One handle per client process, whichever lock object asks first (clones share its session).
    let session = if params.bool("shared_session") { (*ctx.node_wide(open)).clone() } else { open() };
    let find_by_session = params.bool("find_by_session");
    Box::new(WriteLock { ctx, session, id: None, find_by_session, holding: false })
}

/// A child's sequence number: what follows its last `-`.
fn sequence(name: &str) -> u64 {
    name.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
}

impl WriteLock {
    /// Step 1: our node — found by the session's prefix, or created.
    async fn node(&mut self) -> Result<(String, u64, ZkClient), ClientError> {
        let zk = self.session.live().await.ok_or(ClientError::ConnectionLoss)?;
        if let Some(id) = self.id.as_ref().filter(|(_, _, s)| s.session_id() == zk.session_id()) {
            return Ok(id.clone());
        }
        ensure_path(&zk, DIR).await?;
        let prefix = format!("x-{}-", zk.session_id()); // ZooKeeper.getSessionId()
        let mut found = None;
        if self.find_by_session {
            found = zk.get_children(DIR).await?.into_iter().find(|name| name.starts_with(&prefix));
        }
        let (path, czxid) = match found {
            Some(name) => {
                let path = format!("{DIR}/{name}");
                let stat = zk.exists(&path).await?.ok_or(ClientError::Zk(ZkError::NoNode))?;
                (path, stat.czxid)
            }
            None => {
                let (path, stat) = zk.create(&format!("{DIR}/{prefix}"), CreateMode::EphemeralSequential).await?;
                (path, stat.czxid)
            }
        };
        self.id = Some((path, czxid, zk));
        Ok(self.id.clone().expect("just set"))
    }

    /// Steps 1 to 3, until we hold the lock.
    async fn lock(&mut self) -> Result<u64, ClientError> {
        let (path, token, zk) = self.node().await?;
        let ours = path.rsplit('/').next().expect("a child").to_string();
        loop {
            let mut children = zk.get_children(DIR).await?;
            children.sort_by_key(|name| sequence(name));
            let Some(at) = children.iter().position(|name| *name == ours) else {
                // Our node is gone (its session expired): make a new one.
                self.id = None;
                return Err(ClientError::Zk(ZkError::NoNode));
            };
            if at == 0 {
                return Ok(token);
            }
            // The one before ours still there: wait for it to go; gone already: look again.
            if let (Some(_), watch) = zk.exists_watch(&format!("{DIR}/{}", children[at - 1])).await? {
                watch.fired().await;
            }
        }
    }
}

#[async_trait(?Send)]
impl Lock for WriteLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        for attempt in 0..RETRIES {
            if attempt > 0 {
                self.ctx.sleep(RETRY_DELAY * attempt).await;
            }
            match self.lock().await {
                Ok(token) => {
                    self.holding = true;
                    return Outcome::Ok(Grant { token: Some(token) });
                }
                Err(ClientError::ConnectionLoss) | Err(ClientError::Zk(ZkError::NoNode)) => {}
                Err(e) => return Outcome::Fail(words(e)),
            }
        }
        Outcome::Unknown(format!("no lock after {RETRIES} tries"))
    }

    async fn release(&mut self) -> Outcome<()> {
        if !std::mem::take(&mut self.holding) {
            return Outcome::Fail("not held".into());
        }
        let Some((path, _, zk)) = self.id.take() else { return Outcome::Fail("no node".into()) };
        for attempt in 0..RETRIES {
            if attempt > 0 {
                self.ctx.sleep(RETRY_DELAY * attempt).await;
            }
            match zk.delete(&path).await {
                Ok(()) | Err(ClientError::Zk(ZkError::NoNode)) => return Outcome::Ok(()),
                Err(ClientError::ConnectionLoss) => {}
                Err(e) => return Outcome::Fail(words(e)),
            }
        }
        Outcome::Unknown(format!("delete: no answer after {RETRIES} tries"))
    }
}
