//! A ZooKeeper lock of our own: a queue of sequential nodes, with the turn found by polling.
//!
//! A lock people write when they find watches fiddly: create an ephemeral sequential node under
//! `/my-locks/orders`, then list the children every 200 ms until ours sorts first; release by deleting
//! it. It keeps mutual exclusion while the session lives — but the holder never listens for the
//! session's state, so a stop-the-world pause longer than the session timeout lets the server expire
//! the session, delete the node and hand the lock to the next client while the paused one, on waking,
//! still believes it holds it. `scenarios/zk-poll-gc-pause.toml` shows it.

use locksim_locks::params::{ParamSpec, Params};
use locksim_locks::zk::{ensure_path, words, ZkApi, ZkSession, FAMILY, SESSION_TIMEOUT};
use locksim_locks::{async_trait, Grant, Guard, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, ZkClient};
use locksim_sim::backend::zk::CreateMode;
use locksim_sim::ctx::Ctx;
use std::time::Duration;

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "my.zk-poll",
    family: &FAMILY,
    summary: "ephemeral sequential node; poll the children until ours is first",
    source: "a hand-rolled lock (examples/own-locks)",
    params: &[SESSION_TIMEOUT, ParamSpec::duration("poll", 200, "time between looks at the queue")],
    offers_token: true,
    offers_shared: false,
    guard: Guard::Lock,
    promises_fifo: false,
    points: &[],
    validate: locksim_locks::zk::positive_session,
    build,
};

const DIR: &str = "/my-locks/orders";

struct PollLock {
    ctx: Ctx,
    /// Our ZooKeeper handle: one session, opened anew after it expires. Its state changes go to the
    /// history (and `--trace`) by themselves.
    session: ZkSession,
    poll: Duration,
    /// The node we hold the lock by, and the session it lives in.
    held: Option<(String, ZkClient)>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let session = ZkSession::new(&ctx, servers, params.duration("session_timeout"));
    Box::new(PollLock { ctx, session, poll: params.duration("poll"), held: None })
}

#[async_trait(?Send)]
impl Lock for PollLock {
    async fn acquire(&mut self) -> Outcome<Grant> {
        let Some(zk) = self.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        if let Err(e) = ensure_path(&zk, DIR).await {
            return Outcome::Fail(words(e));
        }
        let (path, stat) = match zk.create(&format!("{DIR}/lock-"), CreateMode::EphemeralSequential).await {
            Ok(created) => created,
            Err(ClientError::ConnectionLoss) => return Outcome::Unknown("create: connection loss".into()),
            Err(e) => return Outcome::Fail(words(e)),
        };
        let ours = path.rsplit('/').next().unwrap_or_default().to_string();
        for _ in 0..150 {
            match zk.get_children(DIR).await {
                // Sequence numbers are ten digits after the same prefix: the least sorts first.
                Ok(children) if children.iter().min() == Some(&ours) => {
                    self.held = Some((path, zk));
                    return Outcome::Ok(Grant { token: Some(stat.czxid) });
                }
                Ok(_) => self.ctx.sleep(self.poll).await,
                Err(e) => return Outcome::Fail(words(e)),
            }
        }
        let _ = zk.delete(&path).await;
        Outcome::Fail("gave up waiting".into())
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some((path, zk)) = self.held.take() else { return Outcome::Fail("not held".into()) };
        match zk.delete(&path).await {
            Ok(()) => Outcome::Ok(()),
            Err(ClientError::ConnectionLoss) => Outcome::Unknown("delete: connection loss".into()),
            Err(e) => Outcome::Fail(words(e)),
        }
    }
}
