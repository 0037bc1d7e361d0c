//! The pub/sub side of a Redis client library (a Redisson or redis-py pub/sub connection).
//!
//! - `SUBSCRIBE` is a call; its messages come back as stream messages on the node, which one reader per
//!   node (the [`Router`]) hands to every local subscription of their channel. A partition delays them;
//!   a server restart ends the subscription without a word (the client library would resubscribe when
//!   it reconnects: here the next subscription subscribes again).
//! - A [`Subscription`] queues what reaches it, so a message that comes while nobody waits is not lost
//!   (Redisson counts unlock messages as semaphore permits). Dropping the last subscription of a channel
//!   sends `UNSUBSCRIBE` without waiting for the answer.

use super::{PubSubMessage, RedisReply, RedisRequest};
use crate::ctx::Background;
use crate::history::NodeIx;
use crate::net::{CallError, Rpc};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;
use tokio::sync::mpsc;

type Subscribers = BTreeMap<String, BTreeMap<u64, mpsc::UnboundedSender<String>>>;

/// Hands each message that reaches a node to the subscriptions of its channel.
#[derive(Default)]
pub struct Router {
    subscribers: RefCell<Subscribers>,
    next_id: Cell<u64>,
    thread: RefCell<Option<Background>>,
}

impl Router {
    fn start(self: &Rc<Self>, rpc: &Rpc) {
        if self.thread.borrow().is_none() {
            *self.thread.borrow_mut() = Some(crate::backend::listen(rpc, self, Router::deliver));
        }
    }

    fn deliver(&self, m: PubSubMessage) {
        for tx in self.subscribers.borrow().get(&m.channel).into_iter().flat_map(|subs| subs.values()) {
            let _ = tx.send(m.message.clone());
        }
    }

    fn add(&self, channel: &str) -> (u64, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.subscribers.borrow_mut().entry(channel.to_string()).or_default().insert(id, tx);
        (id, rx)
    }

    /// Remove one subscription; whether it was the channel's last on this node.
    fn remove(&self, channel: &str, id: u64) -> bool {
        let mut subscribers = self.subscribers.borrow_mut();
        let Some(subs) = subscribers.get_mut(channel) else { return false };
        subs.remove(&id);
        let last = subs.is_empty();
        if last {
            subscribers.remove(channel);
        }
        last
    }
}

/// One subscriber of a channel on `server`.
pub struct Subscription {
    channel: String,
    id: u64,
    router: Rc<Router>,
    rx: mpsc::UnboundedReceiver<String>,
    rpc: Rpc,
    server: NodeIx,
}

impl Subscription {
    /// `SUBSCRIBE channel` on `server`, waiting at most `timeout` for the confirmation.
    pub async fn open(
        rpc: &Rpc,
        router: &Rc<Router>,
        server: NodeIx,
        channel: &str,
        timeout: Duration,
    ) -> Result<Subscription, CallError> {
        router.start(rpc);
        let (id, rx) = router.add(channel);
        let sub = Subscription { channel: channel.into(), id, router: router.clone(), rx, rpc: rpc.clone(), server };
        let confirmed: RedisReply =
            rpc.call(server, RedisRequest::Subscribe { channel: channel.into() }, timeout).await?;
        debug_assert!(matches!(confirmed, RedisReply::Array(_)), "SUBSCRIBE answers [subscribe, channel, n]");
        Ok(sub)
    }

    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The next message on the channel, waiting for one if none has come.
    pub async fn message(&mut self) -> String {
        match self.rx.recv().await {
            Some(message) => message,
            None => std::future::pending().await,
        }
    }

    /// A message that has already come, if any.
    pub fn try_message(&mut self) -> Option<String> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.router.remove(&self.channel, self.id) {
            self.rpc.tell(self.server, RedisRequest::Unsubscribe { channel: self.channel.clone() });
        }
    }
}
