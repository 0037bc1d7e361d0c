//! Typed request/response messages between nodes: the simulated network.
//!
//! Messages are values (no serialisation). A message goes straight into the receiver's inbox stamped
//! with its arrival time — now plus a latency drawn from the `Network` stream (1–10 ms), never before
//! the previous message on the same link, as over a TCP connection — and the receiver takes it when
//! that time comes. No task runs per message: that is most of what a simulated message costs. A paused
//! receiver finds its messages waiting when it resumes; a crashed one loses its inbox and all in it.
//! The network also applies the faults that act on messages: cut links (`partition`, `clog`; checked
//! when a message is sent and when the receiver takes it), extra latency (`delay`), random loss (`loss`)
//! and lost replies of a server that did apply the request (`drop-reply`). Every decision draws from
//! the `Network` stream, never from madsim's generator.
//!
//! Two kinds of traffic: a call (request and reply) is lost on a cut link, and its caller times out —
//! what a client sees of a connection that stops answering. A one-way stream message ([`Rpc::tell`]:
//! watch notifications, replication) rides a TCP connection that outlives a short cut: it waits for
//! the link to heal and is lost only if its receiver dies.
//!
//! A call that hears nothing back within its timeout ends as [`CallError::Timeout`]: the request may
//! or may not have been applied. That is the only failure a caller sees, as with a real socket timeout.

use crate::clock::{sim_now_ns, Clock};
use crate::history::NodeIx;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use crate::world::NodeEnv;
use std::any::Any;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

/// Base latency of every message, drawn uniformly (madsim's default range).
const LATENCY_NS: (u64, u64) = (1_000_000, 10_000_000);

type Payload = Box<dyn Any + Send>;

/// Why a call did not return a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// No reply within the timeout: the request may or may not have been applied.
    Timeout,
}

/// The network of one world, shared by all its nodes.
#[derive(Clone)]
pub struct Net(Arc<Mutex<NetState>>);

struct NetState {
    /// The live endpoint of each node (replaced on restart, removed on crash).
    inboxes: BTreeMap<NodeIx, Inbox>,
    /// Directed links that are cut, with how many faults cut them.
    cuts: BTreeMap<(NodeIx, NodeIx), u32>,
    delay: BTreeMap<NodeIx, Duration>,
    loss: BTreeMap<NodeIx, f64>,
    drop_reply: BTreeMap<NodeIx, f64>,
    /// When the last message on each link arrives: later ones never overtake it.
    link_clear_ns: BTreeMap<(NodeIx, NodeIx), u64>,
    /// Stream messages waiting for their cut link to heal.
    held: BTreeMap<(NodeIx, NodeIx), Vec<Message>>,
    rng: ChaCha8Rng,
    messages: u64,
}

/// A received request: who sent it, where the answer goes (nowhere for a stream message), the body.
type Request = (ReplyTo, Payload);

/// A reply on its way: when it arrives, from whom, the body.
type Reply = (u64, NodeIx, Payload);

struct Inbox {
    /// Which life of the node this inbox belongs to.
    incarnation: u32,
    /// Requests by arrival time, then by send order.
    requests: BTreeMap<(u64, u64), Request>,
    /// Wakes the node's server loop when a request is queued.
    queued: Arc<Notify>,
    /// Calls waiting for their reply, by tag.
    waiting: BTreeMap<u64, oneshot::Sender<Reply>>,
}

/// What travels: a request (answer to `reply_tag`; 0 for a stream message) or a reply to a call's tag.
enum Message {
    Request { reply_tag: u64, body: Payload },
    Reply { tag: u64, body: Payload },
}

impl Message {
    /// A one-way message on a connection that survives short cuts.
    fn is_stream(&self) -> bool {
        matches!(self, Message::Request { reply_tag: 0, .. })
    }
}

impl Net {
    pub fn new(seed: u64) -> Net {
        Net(Arc::new(Mutex::new(NetState {
            inboxes: BTreeMap::new(),
            cuts: BTreeMap::new(),
            delay: BTreeMap::new(),
            loss: BTreeMap::new(),
            drop_reply: BTreeMap::new(),
            link_clear_ns: BTreeMap::new(),
            held: BTreeMap::new(),
            rng: stream(seed, Stream::Network, 0),
            messages: 0,
        })))
    }

    fn state(&self) -> MutexGuard<'_, NetState> {
        self.0.lock().expect("net lock")
    }

    /// Cut (`on`) or heal one cut of the directed link `from → to`. A healed link delivers the stream
    /// messages held for it, in order.
    pub fn cut(&self, from: NodeIx, to: NodeIx, on: bool) {
        let mut s = self.state();
        let count = s.cuts.entry((from, to)).or_default();
        if on {
            *count += 1;
            return;
        }
        *count = count.saturating_sub(1);
        if *count > 0 {
            return;
        }
        s.cuts.remove(&(from, to));
        let held = s.held.remove(&(from, to)).unwrap_or_default();
        drop(s);
        for msg in held {
            self.send(from, to, msg);
        }
    }

    /// Extra latency on every message to or from `node` (`None` clears it).
    pub fn set_delay(&self, node: NodeIx, latency: Option<Duration>) {
        set_or_clear(&mut self.state().delay, node, latency);
    }

    /// Lose each message to or from `node` with probability `rate` (`None` clears it).
    pub fn set_loss(&self, node: NodeIx, rate: Option<f64>) {
        set_or_clear(&mut self.state().loss, node, rate);
    }

    /// `node` applies requests but loses each reply with probability `rate` (`None` clears it).
    pub fn set_drop_reply(&self, node: NodeIx, rate: Option<f64>) {
        set_or_clear(&mut self.state().drop_reply, node, rate);
    }

    /// A crashed node's endpoint is gone: messages on their way to it are lost.
    pub fn unbind(&self, node: NodeIx) {
        self.state().inboxes.remove(&node);
    }

    /// Messages sent so far (requests, replies and one-way messages, lost ones included).
    pub fn messages(&self) -> u64 {
        self.state().messages
    }

    /// Send `msg` from `from` to `to`: count it, decide its fate, and put it in the receiver's inbox.
    fn send(&self, from: NodeIx, to: NodeIx, msg: Message) {
        let mut s = self.state();
        // A crashed host sends nothing: what its dying code tries to say (a socket closed as its
        // tasks are dropped) dies with it.
        if !s.inboxes.contains_key(&from) {
            return;
        }
        s.messages += 1;
        if msg.is_stream() && s.cuts.contains_key(&(from, to)) {
            s.held.entry((from, to)).or_default().push(msg);
            return;
        }
        let Some(arrive_ns) = s.route(from, to, matches!(msg, Message::Reply { .. })) else { return };
        let seq = s.messages;
        // A receiver that is gone (its node died, its call timed out) loses the message.
        let Some(inbox) = s.inboxes.get_mut(&to) else { return };
        match msg {
            Message::Request { reply_tag, body } => {
                inbox.requests.insert((arrive_ns, seq), (ReplyTo { from, reply_tag }, body));
                inbox.queued.notify_one();
            }
            Message::Reply { tag, body } => {
                if let Some(waiter) = inbox.waiting.remove(&tag) {
                    let _ = waiter.send((arrive_ns, from, body));
                }
            }
        }
    }

    fn is_cut(&self, from: NodeIx, to: NodeIx) -> bool {
        self.state().cuts.contains_key(&(from, to))
    }
}

impl NetState {
    /// When a message sent now from `from` to `to` arrives, or `None` if it is lost.
    fn route(&mut self, from: NodeIx, to: NodeIx, is_reply: bool) -> Option<u64> {
        if self.cuts.contains_key(&(from, to)) {
            return None;
        }
        let mut lose = [from, to].iter().filter_map(|n| self.loss.get(n).copied()).fold(0.0, f64::max);
        if is_reply {
            lose = lose.max(self.drop_reply.get(&from).copied().unwrap_or(0.0));
        }
        if lose > 0.0 && self.rng.gen_bool(lose.min(1.0)) {
            return None;
        }
        let extra =
            self.delay.get(&from).copied().unwrap_or_default() + self.delay.get(&to).copied().unwrap_or_default();
        let latency = self.rng.gen_range(LATENCY_NS.0..=LATENCY_NS.1) + extra.as_nanos() as u64;
        let clear = self.link_clear_ns.entry((from, to)).or_default();
        *clear = (sim_now_ns() + latency).max(*clear);
        Some(*clear)
    }
}

fn set_or_clear<V>(map: &mut BTreeMap<NodeIx, V>, node: NodeIx, v: Option<V>) {
    match v {
        Some(v) => map.insert(node, v),
        None => map.remove(&node),
    };
}

/// Where the answer to a received request goes (see [`Rpc::reply`]).
pub struct ReplyTo {
    pub from: NodeIx,
    reply_tag: u64,
}

/// One node's endpoint for this life of the node: it makes calls and serves them. Clones share it.
#[derive(Clone)]
pub struct Rpc {
    me: NodeIx,
    incarnation: u32,
    net: Net,
    clock: Clock,
    next_tag: Rc<Cell<u64>>,
}

impl Rpc {
    /// Open the endpoint of the node `env` describes, replacing the one of its previous life.
    pub fn bind(env: &NodeEnv) -> Rpc {
        let inbox = Inbox {
            incarnation: env.incarnation,
            requests: BTreeMap::new(),
            queued: Arc::new(Notify::new()),
            waiting: BTreeMap::new(),
        };
        let old = env.net.state().inboxes.insert(env.me, inbox);
        assert!(old.is_none_or(|o| o.incarnation < env.incarnation), "one endpoint per node life");
        // Reply tags are unique across lives: a late reply to a call of a previous life must not be
        // taken for the answer to a call of this one.
        let first_tag = (u64::from(env.incarnation) << 40) + 1;
        let (me, incarnation) = (env.me, env.incarnation);
        Rpc { me, incarnation, net: env.net.clone(), clock: env.clock.clone(), next_tag: Rc::new(Cell::new(first_tag)) }
    }

    pub fn me(&self) -> NodeIx {
        self.me
    }

    /// Which life of this node the endpoint belongs to (0 until its first restart).
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// A TCP keep-alive probe of a peer's connection: answered by the peer's kernel if both directions of
    /// the link are up and the peer still runs the life that opened the connection. A paused process's
    /// kernel answers; a crashed host does not, and a restarted one resets the old connection.
    pub fn probe(&self, peer: NodeIx, incarnation: u32) -> bool {
        let s = self.net.state();
        let up = !s.cuts.contains_key(&(self.me, peer)) && !s.cuts.contains_key(&(peer, self.me));
        up && s.inboxes.get(&peer).is_some_and(|inbox| inbox.incarnation == incarnation)
    }

    /// Send `req` to `to` and wait for its reply, at most `timeout` by this node's clock.
    pub async fn call<Q, R>(&self, to: NodeIx, req: Q, timeout: Duration) -> Result<R, CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        let tag = self.next_tag.get();
        self.next_tag.set(tag + 1);
        let (tx, rx) = oneshot::channel();
        match self.net.state().inboxes.get_mut(&self.me) {
            Some(inbox) => inbox.waiting.insert(tag, tx),
            None => return Err(CallError::Timeout),
        };
        self.net.send(self.me, to, Message::Request { reply_tag: tag, body: Box::new(req) });
        let reply = async {
            let Ok((arrive_ns, from, body)) = rx.await else { return std::future::pending().await };
            sleep_until(arrive_ns).await;
            if self.net.is_cut(from, self.me) {
                return std::future::pending().await;
            }
            body
        };
        let reply = madsim::time::timeout(self.clock.real_duration(timeout), reply).await;
        if let Some(inbox) = self.net.state().inboxes.get_mut(&self.me) {
            inbox.waiting.remove(&tag);
        }
        match reply {
            Ok(body) => Ok(*body.downcast::<R>().expect("reply type matches the request type")),
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// Send `msg` to `to` without waiting for anything (replication streams).
    pub fn tell<Q: Any + Send>(&self, to: NodeIx, msg: Q) {
        self.tell_boxed(to, Box::new(msg));
    }

    /// [`Rpc::tell`] for a message already boxed.
    pub fn tell_boxed(&self, to: NodeIx, msg: Payload) {
        self.net.send(self.me, to, Message::Request { reply_tag: 0, body: msg });
    }

    /// The next request for this node, once it has arrived. Panics if a node receives a request type it
    /// does not serve.
    pub async fn next_request<Q: Any + Send>(&self) -> (ReplyTo, Q) {
        loop {
            let (next, queued) = {
                let mut s = self.net.state();
                let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
                match inbox.requests.first_key_value() {
                    Some(((at, _), _)) if *at <= sim_now_ns() => {
                        let (_, (reply_to, body)) = inbox.requests.pop_first().expect("just seen");
                        if s.cuts.contains_key(&(reply_to.from, self.me)) {
                            let msg = Message::Request { reply_tag: reply_to.reply_tag, body };
                            if msg.is_stream() {
                                s.held.entry((reply_to.from, self.me)).or_default().push(msg);
                            }
                            continue;
                        }
                        return (reply_to, *body.downcast::<Q>().expect("a node receives only the requests it serves"));
                    }
                    head => (head.map(|((at, _), _)| *at), inbox.queued.clone()),
                }
            };
            match next {
                Some(at) => tokio::select! {
                    biased;
                    _ = queued.notified() => {}
                    _ = sleep_until(at) => {}
                },
                None => queued.notified().await,
            }
        }
    }

    /// Answer a request (nothing is sent for one-way messages).
    pub fn reply<R: Any + Send>(&self, to: &ReplyTo, reply: R) {
        if to.reply_tag != 0 {
            self.net.send(self.me, to.from, Message::Reply { tag: to.reply_tag, body: Box::new(reply) });
        }
    }
}

async fn sleep_until(at_ns: u64) {
    let now = sim_now_ns();
    if at_ns > now {
        madsim::time::sleep(Duration::from_nanos(at_ns - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_world(f: impl FnOnce(&mut NetState)) {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let net = Net::new(1);
            f(&mut net.state());
        });
    }

    #[test]
    fn drop_reply_loses_replies_but_not_requests() {
        in_world(|s| {
            s.drop_reply.insert(NodeIx(0), 1.0);
            assert!(s.route(NodeIx(1), NodeIx(0), false).is_some());
            assert!(s.route(NodeIx(0), NodeIx(1), true).is_none());
        });
    }

    #[test]
    fn a_cut_link_loses_messages_one_way_only() {
        in_world(|s| {
            s.cuts.insert((NodeIx(0), NodeIx(1)), 1);
            assert!(s.route(NodeIx(0), NodeIx(1), false).is_none());
            assert!(s.route(NodeIx(1), NodeIx(0), false).is_some());
        });
    }

    #[test]
    fn messages_on_one_link_never_overtake_each_other() {
        in_world(|s| {
            let arrivals: Vec<u64> = (0..50).map(|_| s.route(NodeIx(0), NodeIx(1), false).unwrap()).collect();
            assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
            assert!(arrivals[0] >= LATENCY_NS.0 && arrivals[0] <= LATENCY_NS.1);
        });
    }

    #[test]
    fn a_stream_message_waits_for_a_cut_link_to_heal_and_a_call_does_not() {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async {
            let net = Net::new(1);
            let inbox = || Inbox {
                incarnation: 0,
                requests: BTreeMap::new(),
                queued: Arc::new(Notify::new()),
                waiting: BTreeMap::new(),
            };
            net.state().inboxes.insert(NodeIx(0), inbox());
            net.state().inboxes.insert(NodeIx(1), inbox());
            net.cut(NodeIx(0), NodeIx(1), true);
            net.send(NodeIx(0), NodeIx(1), Message::Request { reply_tag: 0, body: Box::new(1u8) });
            net.send(NodeIx(0), NodeIx(1), Message::Request { reply_tag: 7, body: Box::new(2u8) });
            assert!(net.state().inboxes[&NodeIx(1)].requests.is_empty());
            net.cut(NodeIx(0), NodeIx(1), false);
            let s = net.state();
            let queued: Vec<u64> = s.inboxes[&NodeIx(1)].requests.values().map(|(r, _)| r.reply_tag).collect();
            assert_eq!(queued, vec![0], "the stream message arrives after the heal; the call's request is gone");
        });
    }

    #[test]
    fn a_crashed_node_sends_nothing() {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async {
            let net = Net::new(1);
            let inbox = Inbox {
                incarnation: 0,
                requests: BTreeMap::new(),
                queued: Arc::new(Notify::new()),
                waiting: BTreeMap::new(),
            };
            net.state().inboxes.insert(NodeIx(1), inbox);
            // Node 0 has no inbox: it has crashed, and its dying tasks' last words are lost.
            net.send(NodeIx(0), NodeIx(1), Message::Request { reply_tag: 0, body: Box::new(1u8) });
            assert!(net.state().inboxes[&NodeIx(1)].requests.is_empty());
            assert_eq!(net.messages(), 0);
        });
    }

    #[test]
    fn delay_adds_to_the_latency() {
        in_world(|s| {
            s.delay.insert(NodeIx(1), Duration::from_secs(1));
            let at = s.route(NodeIx(0), NodeIx(1), false).unwrap();
            assert!(at >= 1_000_000_000 + LATENCY_NS.0);
        });
    }
}
