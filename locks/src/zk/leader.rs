//! `zk.leader-election`: a docker/leadership candidate over libkv's ZooKeeper store.
//!
//! Source: docker/leadership `Candidate.campaign`, on docker/libkv `store/zookeeper`, whose `Lock` is
//! go-zookeeper's `zk.Lock` (`LockWithData`, `Unlock`), step by step:
//! 1. Campaign (each `acquire` is one `RunForElection`): a new `zk.Lock` creates a protected
//!    ephemeral-sequential node under the election key (`CreateProtectedEphemeralSequential`: after a
//!    lost reply, look for our GUID before creating again).
//! 2. `Children` of the key; lowest sequence wins. Otherwise `GetW` on the node just before ours and
//!    wait for its event — with no timeout at all — then list again. Any error (a connection loss
//!    included) returns it at once, leaving our node behind in the queue, alive with our session.
//! 3. Won: libkv's `Lock` then does `Set(key, <our name>)` so followers see who leads; if that fails it
//!    returns the error with the lock still taken. Either way `campaign` sends the error and returns:
//!    the candidate stops. The application runs for election again (our next `acquire`) with a new
//!    `zk.Lock` — a new node, queued behind the orphan of our own session, which nothing deletes.
//! 4. Lead until told to resign (the workload's hold ends): `Unlock` is one plain `Delete`; its error
//!    is ignored by docker/leadership, so a lost delete leaves the node (an orphan) too.
//! 5. Deposed? libkv's `Lock` hands back a lost-channel that nothing ever closes
//!    (`lost_channel = "never"`, the default): a leader never learns that it was deposed. valkeyrie,
//!    libkv's successor, watches the key (`lost_channel = "watch"`): the channel closes when the watch
//!    cannot be set, when the session turns out to have expired, or when the key's data changes — a new
//!    leader announcing itself. Its watch outlives a disconnection (go-zookeeper sets it again).
//!
//! Expected (catalog): a leader paused past its session timeout comes back still leading while another
//! leads — two leaders (`double-holder`) with either channel, since a paused process hears nothing;
//! fencing with the czxid stops the old leader's writes. Short partitions leave orphans that stall
//! the election until the session expires — which, with go-zookeeper reconnecting the session, is
//! never (`deadlock`).

use super::sequential::{sequence, Driver, Queue, Sequential, QUEUE_CREATE};
use super::{words, ZkApi, SESSION_TIMEOUT};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ClientError, Library, ZkClient};
use locksim_sim::backend::zk::{EventType, ZkError};
use locksim_sim::backend::LEASE_RENEW;
use locksim_sim::ctx::Ctx;

const LOST_CHANNEL: ParamSpec = ParamSpec {
    name: "lost_channel",
    kind: ParamKind::Choice(&["never", "watch"]),
    default: ParamValue::Choice("never"),
    doc: "how a leader learns it was deposed: never (docker/libkv) or by watching the key (valkeyrie)",
};

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "zk.leader-election",
    family: &super::FAMILY,
    summary: "docker/leadership candidate on libkv's ZooKeeper lock: lead, resign, run again",
    source: "docker/leadership Candidate; docker/libkv store/zookeeper; go-zookeeper zk.Lock",
    params: &[SESSION_TIMEOUT, LOST_CHANNEL],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    points: &[QUEUE_CREATE, LEASE_RENEW],
    validate: super::positive_session,
    build,
};

/// The election key; candidates queue under it.
const ELECTION: Queue = Queue { dir: "/leadership/leader", name: "lock-", driver: Driver::Exclusive };

struct Candidate {
    core: Sequential,
    /// Our node while we lead.
    led: Option<Led>,
    /// What we write into the key as leader.
    name: String,
}

/// The node of the lock we hold, and its session.
struct Led {
    path: String,
    zk: ZkClient,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let name = ctx.name();
    let mut core = Sequential::new(params, ctx, servers, true);
    core.session = core.session.clone().speaking(Library::Go);
    Box::new(Candidate { core, led: None, name })
}

/// Step 2: `LockWithData`'s loop, with no timeout; any error is returned as it is.
async fn wait_for_turn(zk: &ZkClient, ours: &str) -> Result<(), ClientError> {
    let name = &ours[ELECTION.dir.len() + 1..];
    loop {
        let mut children = zk.get_children(ELECTION.dir).await?;
        children.sort_by(|a, b| sequence(a).cmp(sequence(b)));
        let Some(index) = children.iter().position(|c| c == name) else { return Err(ClientError::Zk(ZkError::NoNode)) };
        let Some(before) = index.checked_sub(1) else { return Ok(()) };
        match zk.get_data_watch(&format!("{}/{}", ELECTION.dir, children[before])).await {
            Ok(watch) => {
                // go-zookeeper's watch outlives a disconnection; the session's expiry closes it with
                // `ErrSessionExpired`, which `Lock` returns.
                if watch.fired().await.is_none() {
                    return Err(ClientError::Zk(ZkError::SessionExpired));
                }
            }
            Err(ClientError::Zk(ZkError::NoNode)) => {}
            Err(e) => return Err(e),
        }
    }
}

/// valkeyrie's `monitorLock`: resolves when the leader must consider itself deposed.
async fn watch_key(zk: &ZkClient) -> String {
    loop {
        let watch = match zk.get_data_watch(ELECTION.dir).await {
            Ok(watch) => watch,
            Err(e) => return format!("could not watch the key: {}", words(e)),
        };
        match watch.fired().await {
            Some(event) if event.event == EventType::NodeDataChanged => return "another leader wrote the key".into(),
            Some(_) => {}
            // go-zookeeper keeps the watch across a disconnection: only the session's expiry ends it.
            None => return "session expired".into(),
        }
    }
}

#[async_trait(?Send)]
impl Lock for Candidate {
    async fn acquire(&mut self) -> Outcome<Grant> {
        if self.led.is_some() {
            // go-zookeeper's Lock refuses a second Lock on the same lock (ErrDeadlock).
            return Outcome::Fail("already leading (deadlock)".into());
        }
        let Some(zk) = self.core.session.live().await else { return Outcome::Fail("cannot reach ZooKeeper".into()) };
        let (path, czxid, zk) = match self.core.create_in(&zk, ELECTION.dir, ELECTION.name).await {
            Ok((path, stat, zk)) => (path, stat.czxid, zk),
            Err(outcome) => return outcome,
        };
        if let Err(e) = wait_for_turn(&zk, &path).await {
            return Outcome::Fail(format!("the candidate stopped: {}; its node stays queued", words(e)));
        }
        match zk.set_data(ELECTION.dir, &self.name).await {
            Ok(_) => {
                self.led = Some(Led { path, zk });
                Outcome::Ok(Grant { token: Some(czxid) })
            }
            Err(e) => Outcome::Unknown(format!("the candidate stopped: setting the leader's name: {}", words(e))),
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        let Some(led) = self.led.take() else { return Outcome::Fail("not leading".into()) };
        match led.zk.delete(&led.path).await {
            Ok(()) => Outcome::Ok(()),
            Err(e) => Outcome::Unknown(format!("unlock: {}; ignored by the candidate", words(e))),
        }
    }

    async fn lost(&self) -> String {
        match (&self.led, self.core.params.choice("lost_channel")) {
            (Some(led), "watch") => watch_key(&led.zk).await,
            _ => std::future::pending().await,
        }
    }
}
