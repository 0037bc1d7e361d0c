//! Typed request/response messaging between nodes over madsim's simulated network.
//!
//! Messages are passed as values through madsim's raw `Endpoint` (no serialisation: the cheap path).
//! madsim gives latency (1–10 ms), random delivery order and clogged links (our `partition` and `clog`).
//! What madsim cannot do per node, [`Net`] does on the way out: extra latency (`delay`), random loss
//! (`loss`) and lost replies of a server that did apply the request (`drop-reply`). Those decisions draw
//! from the `Network` stream, never from madsim's generator, so they do not disturb task order.
//!
//! A call that hears nothing back within its timeout ends as [`CallError::Timeout`]: the request may
//! or may not have been applied. That is the only failure a caller sees, as with a real socket timeout.

use crate::clock::Clock;
use crate::history::NodeIx;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use crate::world::NodeEnv;
use madsim::net::Endpoint;
use std::any::Any;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PORT: u16 = 7000;
/// Requests arrive on this tag; replies go back on the caller's per-call tag (always ≥ 1).
const REQUEST_TAG: u64 = 0;

/// The simulated address of a node.
pub fn addr_of(node: NodeIx) -> SocketAddr {
    let [_, _, hi, lo] = (node.0 + 1).to_be_bytes();
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, hi, lo)), PORT)
}

fn node_of(addr: SocketAddr) -> NodeIx {
    match addr.ip() {
        IpAddr::V4(ip) => {
            let [_, _, hi, lo] = ip.octets();
            NodeIx(u32::from_be_bytes([0, 0, hi, lo]) - 1)
        }
        IpAddr::V6(_) => unreachable!("locksim assigns IPv4 addresses only"),
    }
}

/// Why a call did not return a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// No reply within the timeout: the request may or may not have been applied.
    Timeout,
}

/// Network faults that the world sets and every node's sends obey. Shared by all nodes of a world.
#[derive(Clone)]
pub struct Net(Arc<Mutex<NetState>>);

struct NetState {
    delay: BTreeMap<NodeIx, Duration>,
    loss: BTreeMap<NodeIx, f64>,
    drop_reply: BTreeMap<NodeIx, f64>,
    rng: ChaCha8Rng,
    messages: u64,
}

impl Net {
    pub fn new(seed: u64) -> Net {
        Net(Arc::new(Mutex::new(NetState {
            delay: BTreeMap::new(),
            loss: BTreeMap::new(),
            drop_reply: BTreeMap::new(),
            rng: stream(seed, Stream::Network, 0),
            messages: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.0.lock().expect("net lock")
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

    /// Messages sent so far (requests, replies and one-way messages, lost ones included).
    pub fn messages(&self) -> u64 {
        self.state().messages
    }

    /// Count a message and decide its fate: `None` lost, `Some(extra)` delivered after extra latency.
    fn route(&self, from: NodeIx, to: NodeIx, is_reply: bool) -> Option<Duration> {
        let mut s = self.state();
        s.messages += 1;
        let mut lose = [from, to].iter().filter_map(|n| s.loss.get(n).copied()).fold(0.0, f64::max);
        if is_reply {
            lose = lose.max(s.drop_reply.get(&from).copied().unwrap_or(0.0));
        }
        if lose > 0.0 && s.rng.gen_bool(lose.min(1.0)) {
            return None;
        }
        Some(s.delay.get(&from).copied().unwrap_or_default() + s.delay.get(&to).copied().unwrap_or_default())
    }
}

fn set_or_clear<V>(map: &mut BTreeMap<NodeIx, V>, node: NodeIx, v: Option<V>) {
    match v {
        Some(v) => map.insert(node, v),
        None => map.remove(&node),
    };
}

struct Envelope<M> {
    reply_tag: u64,
    body: M,
}

/// Where the answer to a received request goes (see [`Rpc::reply`]).
pub struct ReplyTo {
    pub from: NodeIx,
    reply_tag: u64,
}

/// One node's endpoint: it makes calls and serves them.
pub struct Rpc {
    ep: Endpoint,
    me: NodeIx,
    net: Net,
    clock: Clock,
    next_tag: Cell<u64>,
}

impl Rpc {
    /// Bind the endpoint of the node `env` describes, for this life of the node.
    pub async fn bind(env: &NodeEnv) -> Rpc {
        let ep = Endpoint::bind(addr_of(env.me)).await.expect("each node binds its own address once per life");
        // Reply tags are unique across restarts: a late reply to a call of a previous life must not be
        // taken for the answer to a call of this one.
        let first_tag = (u64::from(env.incarnation) << 40) + 1;
        Rpc { ep, me: env.me, net: env.net.clone(), clock: env.clock.clone(), next_tag: Cell::new(first_tag) }
    }

    pub fn me(&self) -> NodeIx {
        self.me
    }

    async fn send<M: Any + Send + Sync>(&self, to: NodeIx, tag: u64, msg: M, is_reply: bool) {
        let Some(extra) = self.net.route(self.me, to, is_reply) else {
            return;
        };
        let payload: madsim::net::Payload = Box::new(msg);
        if extra.is_zero() {
            // A send to an unknown or unbound address is lost, as a datagram would be.
            let _ = self.ep.send_to_raw(addr_of(to), tag, payload).await;
        } else {
            let ep = self.ep.clone();
            madsim::task::spawn_local(async move {
                madsim::time::sleep(extra).await;
                let _ = ep.send_to_raw(addr_of(to), tag, payload).await;
            });
        }
    }

    /// Send `req` to `to` and wait for its reply, at most `timeout` by this node's clock.
    pub async fn call<Q, R>(&self, to: NodeIx, req: Q, timeout: Duration) -> Result<R, CallError>
    where
        Q: Any + Send + Sync,
        R: Any + Send + Sync,
    {
        let tag = self.next_tag.get();
        self.next_tag.set(tag + 1);
        self.send(to, REQUEST_TAG, Envelope { reply_tag: tag, body: req }, false).await;
        let wait = madsim::time::timeout(self.clock.real_duration(timeout), self.ep.recv_from_raw(tag));
        match wait.await {
            Ok(Ok((payload, _))) => Ok(*payload.downcast::<R>().expect("reply type matches the request type")),
            Ok(Err(_)) | Err(_) => Err(CallError::Timeout),
        }
    }

    /// Send `msg` to `to` without waiting for anything (replication streams).
    pub async fn tell<Q: Any + Send + Sync>(&self, to: NodeIx, msg: Q) {
        self.send(to, REQUEST_TAG, Envelope { reply_tag: 0, body: msg }, false).await;
    }

    /// The next request for this node. Panics if a node receives a request type it does not serve.
    pub async fn next_request<Q: Any + Send + Sync>(&self) -> (ReplyTo, Q) {
        let (payload, from) = self.ep.recv_from_raw(REQUEST_TAG).await.expect("the simulated network stays up");
        let env = payload.downcast::<Envelope<Q>>().expect("a node receives only the requests it serves");
        (ReplyTo { from: node_of(from), reply_tag: env.reply_tag }, env.body)
    }

    /// Answer a request (nothing is sent for one-way messages).
    pub async fn reply<R: Any + Send + Sync>(&self, to: &ReplyTo, reply: R) {
        if to.reply_tag != 0 {
            self.send(to.from, to.reply_tag, reply, true).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for n in [0, 1, 254, 255, 256, 65_534] {
            assert_eq!(node_of(addr_of(NodeIx(n))), NodeIx(n));
        }
    }

    #[test]
    fn drop_reply_loses_replies_but_not_requests() {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async {
            let net = Net::new(1);
            net.set_drop_reply(NodeIx(0), Some(1.0));
            assert_eq!(net.route(NodeIx(1), NodeIx(0), false), Some(Duration::ZERO));
            assert_eq!(net.route(NodeIx(0), NodeIx(1), true), None);
            net.set_drop_reply(NodeIx(0), None);
            assert_eq!(net.route(NodeIx(0), NodeIx(1), true), Some(Duration::ZERO));
            assert_eq!(net.messages(), 3);
        });
    }
}
