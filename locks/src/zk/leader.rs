//! `zk.leader-election`: a docker/leadership candidate over libkv's ZooKeeper store.
//!
//! Source: docker/leadership `Candidate.campaign`, on docker/libkv `store/zookeeper`, whose `Lock` is
//! go-zookeeper's `zk.Lock`: a protected ephemeral-sequential node under the election key, lowest wins,
//! each waiter watching the node just before its own — the queue of `zk.sequential`, not reentrant.
//! 1. Campaign: take the lock under the key, then `setData(key, <our name>)` so that followers can see
//!    who leads. Now the leader; the fencing token is our node's czxid. If the `setData` fails, libkv's
//!    `Lock` returns the error with the node still held, and the candidate stops campaigning for good.
//! 2. Lead until told to resign (the workload's hold ends): unlock (delete our node), campaign again.
//! 3. Deposed? libkv's `Lock` hands back a lost-channel that nothing ever closes
//!    (`lost_channel = "never"`, the default): a leader never learns that it was deposed. valkeyrie,
//!    libkv's successor, watches the key (`lost_channel = "watch"`): the channel closes when the watch
//!    cannot be set, when the session turns out to have expired, or when the key's data changes — a new
//!    leader announcing itself. Its watch outlives a disconnection (go-zookeeper sets it again).
//!
//! Expected (catalog): a leader paused past its session timeout comes back still leading while another
//! leads — two leaders (`double-holder`) with either channel, since a paused process hears nothing;
//! fencing with the czxid stops the old leader's writes.

use super::sequential::{Driver, Held, Queue, Sequential};
use super::{words, ZkApi, ACQUIRE_TIMEOUT, SESSION_TIMEOUT};
use crate::params::{ParamKind, ParamSpec, ParamValue, Params};
use crate::{async_trait, Grant, Lock, Outcome, RecipeSpec, Servers};
use locksim_sim::backend::zk::client::{ConnState, ZkClient};
use locksim_sim::backend::zk::EventType;
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
    params: &[SESSION_TIMEOUT, ACQUIRE_TIMEOUT, LOST_CHANNEL],
    offers_token: true,
    offers_shared: false,
    guard: crate::Guard::Lock,
    promises_fifo: true,
    validate: super::positive_session,
    build,
};

/// The election key; candidates queue under it.
const ELECTION: Queue = Queue { dir: "/leadership/leader", name: "lock-", driver: Driver::Exclusive };

struct Candidate {
    core: Sequential,
    /// Our node while we lead.
    held: Option<Held>,
    /// What we write into the key as leader.
    name: String,
    /// Why the candidate stopped campaigning, if it did.
    stopped: Option<String>,
}

fn build(params: &Params, ctx: Ctx, servers: &Servers) -> Box<dyn Lock> {
    let name = format!("node-{}", ctx.rpc().me().0);
    Box::new(Candidate { core: Sequential::new(params, ctx, servers, true), held: None, name, stopped: None })
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
            None if zk.expired() => return "session expired".into(),
            None => {
                // Disconnected: go-zookeeper keeps the watch and sets it again once reconnected.
                let mut state = zk.state();
                while *state.borrow_and_update() == ConnState::Disconnected {
                    if state.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            }
        }
    }
}

#[async_trait(?Send)]
impl Lock for Candidate {
    async fn acquire(&mut self) -> Outcome<Grant> {
        if let Some(why) = &self.stopped {
            return Outcome::Fail(format!("the candidate stopped campaigning: {why}"));
        }
        if self.held.is_some() {
            // go-zookeeper's Lock refuses a second Lock on the same lock (ErrDeadlock).
            return Outcome::Fail("already leading (deadlock)".into());
        }
        let grant = match self.core.acquire(&mut self.held, ELECTION).await {
            Outcome::Ok(grant) => grant,
            other => return other,
        };
        let zk = self.held.as_ref().expect("just acquired").zk.clone();
        match zk.set_data(ELECTION.dir, &self.name).await {
            Ok(_) => Outcome::Ok(grant),
            Err(e) => {
                let why = format!("setting the leader's name: {}", words(e));
                self.stopped = Some(why.clone());
                Outcome::Unknown(why)
            }
        }
    }

    async fn release(&mut self) -> Outcome<()> {
        self.core.release(&mut self.held).await
    }

    async fn lost(&self) -> String {
        match (&self.held, self.core.params.choice("lost_channel")) {
            (Some(held), "watch") => watch_key(&held.zk).await,
            _ => std::future::pending().await,
        }
    }
}
