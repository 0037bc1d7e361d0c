//! Typed request/response messages between nodes: the simulated network.
//!
//! Messages are values (no serialisation). A message goes straight into the receiver's inbox stamped
//! with its arrival time — now plus a latency drawn from the `Network` stream (1–10 ms), never before
//! the previous message on the same link, as over a TCP connection — and the receiver takes it when
//! that time comes. No task runs per message: that is most of what a simulated message costs. A paused
//! receiver finds its messages waiting when it resumes; a crashed one loses its inbox and all in it.
//! The network also applies the faults that act on messages: cut links (`partition`, `clog`), extra
//! latency (`delay`), random loss (`loss`) and lost replies of a server that did apply the request
//! (`drop-reply`). Every decision draws from the `Network` stream, never from madsim's generator.
//!
//! A cut link delays what is sent on it, as TCP does (Linux `tcp_retransmit_timer`): the sender's
//! kernel retransmits the first unacknowledged segment after `TCP_RTO_MIN` (200 ms), doubling the wait
//! each time up to `TCP_RTO_MAX` (120 s), and gives the connection up after `tcp_retries2` = 15
//! retransmissions (about 924 s). So a message sent during a cut arrives at the first retransmission
//! after the heal — requests, replies and one-way stream messages alike, in order, and after anything
//! sent on the link meanwhile is not let through earlier. A request may therefore be applied long after
//! its caller gave up waiting (a real socket's unsent data outlives the caller's timeout, even a
//! `close`). What was held dies with either end: a sender that crashed (its kernel's buffers are gone)
//! or a receiver that crashed or restarted (its new kernel resets the old connection). A message
//! already on the wire when a cut starts still arrives (the cut acts at send time).
//!
//! A call that hears nothing back within its timeout ends as [`CallError::Timeout`]: the request may
//! or may not have been applied, as with a real socket timeout.
//!
//! Two ways to die ([`Net::kill_process`], [`Net::unbind`]):
//! - A killed *process* (OOM, a deploy, a segfault — `crash`) leaves its host's kernel running. Linux
//!   closes every socket of a dying process (`do_exit` → `exit_files` → `tcp_close`): a FIN, or an RST
//!   when unread data was left in the socket (`tcp_close`: "data was unread"). Every peer it had a
//!   connection with sees it closed one network delay later, behind what was already on the link
//!   (a cut link holds the FIN as it holds data); its calls still waiting on the dead process end as
//!   [`CallError::Reset`]; a server is told through [`Input::Closed`]. Until a new process starts, the
//!   kernel answers what arrives with an RST (no socket listens: `tcp_v4_send_reset`), so calls are
//!   refused at once and keep-alive probes are reset. Data it had sent on a cut link is still
//!   retransmitted: the kernel's buffers outlive the process.
//! - A dead *host* (power loss, a kernel panic — `host-crash`) says nothing: its peers learn only
//!   by their own timeouts and keep-alive, and what it held dies with it.

use crate::clock::{sim_now_ns, wake_at, Clock, WakeSlot};
use crate::history::NodeIx;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use crate::world::NodeEnv;
use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, BinaryHeap};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Wake, Waker};
use std::time::Duration;

/// Base latency of every message, drawn uniformly (madsim's default range).
const LATENCY_NS: (u64, u64) = (1_000_000, 10_000_000);

/// Linux `TCP_RTO_MIN`: the first retransmission timeout on a connection with a millisecond RTT.
const TCP_RTO_MIN_NS: u64 = 200_000_000;
/// Linux `TCP_RTO_MAX`: the retransmission timeout stops doubling here.
const TCP_RTO_MAX_NS: u64 = 120_000_000_000;
/// Linux `net.ipv4.tcp_retries2` (default 15): retransmissions before the connection is given up.
const TCP_RETRIES2: u32 = 15;

/// When data first sent at `first_ns` and unacknowledged since gets through a link healed at
/// `heal_ns`: the first retransmission at or after the heal, or `None` if the kernel gave the
/// connection up before then. Real mode's proxies hold bytes across a partition by the same rule.
pub fn retransmission_after(first_ns: u64, heal_ns: u64) -> Option<u64> {
    let (mut at, mut rto) = (first_ns, TCP_RTO_MIN_NS);
    for _ in 0..TCP_RETRIES2 {
        at += rto;
        if at >= heal_ns {
            return Some(at);
        }
        rto = (rto * 2).min(TCP_RTO_MAX_NS);
    }
    None
}

type Payload = Box<dyn Any + Send>;

/// Why a call did not return a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// No reply within the timeout: the request may or may not have been applied.
    Timeout,
    /// The connection was reset and the request was not applied: it went on a connection to an
    /// earlier life of the peer, whose host has restarted since (see [`Rpc::call_on`]), or the peer's
    /// process was killed, and its kernel closed the connection (see [`Net::kill_process`]).
    Reset,
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
    /// Messages sent on a cut link, waiting to be retransmitted once it heals.
    held: BTreeMap<(NodeIx, NodeIx), Held>,
    rng: ChaCha8Rng,
    /// The latencies of what kernels send on their own (a dead process's FINs): a stream of its own,
    /// so that runs without a process crash draw exactly what they drew before.
    kernel_rng: ChaCha8Rng,
    /// The last data each link delivered, with the life of its receiver: when its receiver's kernel
    /// acknowledged it (see [`Rpc::acked_ns`]).
    acked: BTreeMap<(NodeIx, NodeIx), (u32, u64)>,
    messages: u64,
    /// Calls that ended without a reply.
    call_timeouts: u64,
    /// Messages put into inboxes so far: orders those that arrive at the same instant.
    deliveries: u64,
}

/// A received request: who sent it, where the answer goes (nowhere for a stream message), the body.
type Request = (ReplyTo, Payload);

/// A request in an inbox, first out by arrival time, then by send order.
struct Queued {
    at: (u64, u64),
    request: Request,
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // `BinaryHeap` pops its greatest: the earliest is the greatest.
        other.at.cmp(&self.at)
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Queued {}

/// A reply on its way: when it arrives, the life of the node that sent it, and the body (`None`: a
/// reset).
type Reply = (u64, u32, Option<Payload>);

/// A call waiting for its reply: the reply once it is on its way, the caller's waker, and when the
/// caller gives up (sim ns).
struct Waiting {
    /// Whom the call went to: a reset of its connection by that node's kernel ends it.
    peer: NodeIx,
    reply: Option<Reply>,
    caller: Option<Waker>,
    deadline_ns: u64,
}

struct Inbox {
    /// Which life of the node this inbox belongs to.
    incarnation: u32,
    /// The node's process was killed and its host still runs ([`Net::kill_process`]): its kernel
    /// resets what arrives, and the node sends nothing.
    process_dead: bool,
    /// Connections peers' kernels closed (a killed process's): when the close arrives, who, which life.
    closed: Vec<(u64, NodeIx, u32)>,
    /// Requests by arrival time, then by send order.
    requests: BinaryHeap<Queued>,
    /// The node's reader of requests ([`Rpc::next_request`]), woken at each request's arrival time.
    reader: Arc<WakeSlot>,
    /// Calls waiting for their reply, with their tags: a few at most, so a list (a map would allocate
    /// and free a node for nearly every call).
    waiting: Vec<(u64, Waiting)>,
    /// Wakes the callers whose replies are on their way, at each reply's arrival.
    replies: Arc<Callers>,
    /// Wakes every caller, at the node's earliest deadline (see [`Callers`]).
    deadlines: Arc<Callers>,
    /// When the node's deadline timer is due, if one is set.
    deadline_timer_ns: Option<u64>,
}

impl Inbox {
    fn waiting(&mut self, tag: u64) -> Option<&mut Waiting> {
        self.waiting.iter_mut().find(|(t, _)| *t == tag).map(|(_, w)| w)
    }

    fn stop_waiting(&mut self, tag: u64) -> Option<Waiting> {
        let at = self.waiting.iter().position(|(t, _)| *t == tag)?;
        Some(self.waiting.swap_remove(at).1)
    }

    /// Have the node's deadline timer due by the earliest deadline of its calls still to come (one that
    /// has passed has woken its caller already).
    fn watch(&mut self, now: u64) {
        let deadlines = self.waiting.iter().map(|(_, w)| w.deadline_ns);
        let Some(earliest) = deadlines.filter(|d| *d > now).min() else { return };
        if self.deadline_timer_ns.is_some_and(|at| at <= earliest) {
            return;
        }
        self.deadline_timer_ns = Some(earliest);
        wake_at(earliest, &self.deadlines);
    }
}

/// What wakes a node's callers: its timers — one at each reply's arrival, and one for the deadlines
/// of all its calls rather than one per call. The callers look at the time themselves when they run
/// (madsim calls a timer's waker before it moves its clock to the timer's time).
///
/// Nearly every call is answered long before its timeout, and madsim's timers cannot be cancelled: a
/// timeout timer per call would cost a heap entry per call, and one wake-up of the caller per call,
/// for nothing. The deadline timer is set for the node's earliest deadline. When it fires it wakes
/// every caller of the node (a few at most): those whose time is up return, and the first that waits
/// on sets it again (a timer cannot be set from inside madsim's timer callback).
struct Callers {
    net: std::sync::Weak<Mutex<NetState>>,
    me: NodeIx,
    incarnation: u32,
    /// The deadline timer's (else a reply's).
    deadline: bool,
}

impl Wake for Callers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let Some(net) = self.net.upgrade() else { return };
        let mut s = net.lock().expect("net lock");
        let Some(inbox) = s.inboxes.get_mut(&self.me).filter(|i| i.incarnation == self.incarnation) else { return };
        if self.deadline {
            inbox.deadline_timer_ns = None;
        }
        // Waking a task only schedules it: nothing runs while the network is locked.
        for (_, w) in inbox.waiting.iter_mut().filter(|(_, w)| self.deadline || w.reply.is_some()) {
            if let Some(caller) = w.caller.take() {
                caller.wake();
            }
        }
    }
}

/// What travels: a request (answer to `reply_tag`; 0 for a stream message) on a connection to life
/// `conn` of the receiver (`None`: to whatever life it runs), or a reply to a call's tag from life
/// `life` of its sender (`body` `None`: a reset).
enum Message {
    Request {
        reply_tag: u64,
        body: Payload,
        conn: Option<u32>,
    },
    Reply {
        tag: u64,
        body: Option<Payload>,
        life: u32,
    },
    /// The sender's kernel closed its connections: life `life` of its process died.
    Closed {
        life: u32,
    },
}

/// The unacknowledged data of a cut link: when the first of it was sent (the retransmission timer
/// counts from there), and each message with the lives of both ends that it was sent between.
struct Held {
    first_ns: u64,
    messages: Vec<(u32, u32, Message)>,
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
            kernel_rng: stream(seed, Stream::Kernel, 0),
            acked: BTreeMap::new(),
            messages: 0,
            call_timeouts: 0,
            deliveries: 0,
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
        let Some(held) = s.held.remove(&(from, to)) else { return };
        let Some(retransmit_ns) = retransmission_after(held.first_ns, sim_now_ns()) else { return };
        let life = |s: &NetState, n: NodeIx| s.inboxes.get(&n).map(|i| i.incarnation);
        for (from_life, to_life, msg) in held.messages {
            if life(&s, from) == Some(from_life) && life(&s, to) == Some(to_life) {
                s.deliver(from, to, msg, retransmit_ns);
            }
        }
    }

    /// When the oldest message now held on the cut link `from → to` was sent, if one is held: what was
    /// sent from then on is in the sender's kernel and dies with it; what was sent before is on the wire
    /// (a Redis failover asks, to know what its replica would still receive).
    pub fn held_since(&self, from: NodeIx, to: NodeIx) -> Option<u64> {
        self.state().held.get(&(from, to)).map(|h| h.first_ns)
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

    /// Open the endpoint of life `incarnation` of `node`, before its program runs: a host's kernel
    /// accepts connections as soon as it is up, and what arrives before the program reads waits in
    /// its inbox (a listen backlog). Without this a client whose first request left before its
    /// server's program had started would lose it in a fault-free run.
    pub fn bind_host(&self, node: NodeIx, incarnation: u32) {
        let callers = |deadline| Arc::new(Callers { net: Arc::downgrade(&self.0), me: node, incarnation, deadline });
        let inbox = Inbox {
            incarnation,
            process_dead: false,
            closed: Vec::new(),
            requests: BinaryHeap::new(),
            reader: WakeSlot::new(),
            waiting: Vec::new(),
            replies: callers(false),
            deadlines: callers(true),
            deadline_timer_ns: None,
        };
        let old = self.state().inboxes.insert(node, inbox);
        assert!(old.is_none_or(|o| o.incarnation < incarnation), "one endpoint per node life");
    }

    /// A crashed host's endpoint is gone: messages on their way to it are lost, and its peers hear
    /// nothing (a power loss, a kernel panic).
    pub fn unbind(&self, node: NodeIx) {
        self.state().inboxes.remove(&node);
    }

    /// `node`'s process was killed; its host runs on. Its kernel closes every connection the process
    /// had (Linux `do_exit` → `exit_files` → `tcp_close`: FIN, or RST over unread data): each peer
    /// it has a link with sees the close one network delay later, behind the link's earlier data, and
    /// a cut link holds it as it holds data. What arrives afterwards is reset by the kernel, until
    /// the host starts a new life ([`Net::bind_host`]). Nothing is drawn from the `Network` stream.
    pub fn kill_process(&self, node: NodeIx) {
        let mut s = self.state();
        let Some(inbox) = s.inboxes.get_mut(&node).filter(|i| !i.process_dead) else { return };
        inbox.process_dead = true;
        inbox.requests.clear();
        inbox.waiting.clear();
        inbox.closed.clear();
        let life = inbox.incarnation;
        let peers: std::collections::BTreeSet<NodeIx> = s
            .link_clear_ns
            .keys()
            .filter_map(|&(a, b)| (a == node).then_some(b).or((b == node).then_some(a)))
            .collect();
        let now = sim_now_ns();
        for peer in peers {
            if s.cuts.contains_key(&(node, peer)) {
                let Some(to_life) = s.inboxes.get(&peer).map(|i| i.incarnation) else { continue };
                let held = s.held.entry((node, peer)).or_insert_with(|| Held { first_ns: now, messages: Vec::new() });
                held.messages.push((life, to_life, Message::Closed { life }));
            } else {
                s.deliver(node, peer, Message::Closed { life }, now);
            }
        }
    }

    /// Messages sent so far (requests, replies and one-way messages, lost ones included).
    pub fn messages(&self) -> u64 {
        self.state().messages
    }

    /// Calls that timed out so far: in a run without faults, none should.
    pub fn call_timeouts(&self) -> u64 {
        self.state().call_timeouts
    }

    /// Send `msg` from `from` to `to` now.
    fn send(&self, from: NodeIx, to: NodeIx, msg: Message) {
        self.state().send(from, to, msg, sim_now_ns());
    }
}

impl NetState {
    /// Send `msg` from `from` to `to` at `now_ns`: count it, hold it while the link is cut, else
    /// deliver it.
    fn send(&mut self, from: NodeIx, to: NodeIx, msg: Message, now_ns: u64) {
        // A crashed host sends nothing: what its dying code tries to say (a socket closed as its
        // tasks are dropped) dies with it.
        // A killed process sends nothing either (its kernel's own FINs go by `Net::kill_process`).
        let Some(from_life) = self.inboxes.get(&from).filter(|i| !i.process_dead).map(|i| i.incarnation) else {
            return;
        };
        self.messages += 1;
        if self.cuts.contains_key(&(from, to)) {
            // A host that is down cannot take the retransmissions; one restarted later resets them.
            let Some(to_life) = self.inboxes.get(&to).map(|i| i.incarnation) else { return };
            let held = self.held.entry((from, to)).or_insert_with(|| Held { first_ns: now_ns, messages: Vec::new() });
            held.messages.push((from_life, to_life, msg));
            return;
        }
        self.deliver(from, to, msg, now_ns);
    }

    /// Put `msg`, sent (or retransmitted) at `sent_ns`, into the receiver's inbox, unless it is lost.
    fn deliver(&mut self, from: NodeIx, to: NodeIx, msg: Message, sent_ns: u64) {
        let arrive_ns = match msg {
            Message::Closed { .. } => self.route_kernel(from, to, sent_ns),
            Message::Reply { .. } => self.route(from, to, true, sent_ns),
            Message::Request { .. } => self.route(from, to, false, sent_ns),
        };
        let Some(arrive_ns) = arrive_ns else { return };
        self.deliveries += 1;
        let seq = self.deliveries;
        // A receiver that is gone (its node died, its call timed out) loses the message.
        let Some(inbox) = self.inboxes.get_mut(&to) else { return };
        if !matches!(msg, Message::Closed { .. }) && !inbox.process_dead {
            self.acked.insert((from, to), (inbox.incarnation, arrive_ns));
        }
        match msg {
            Message::Request { reply_tag, conn: Some(life), .. } if life != inbox.incarnation => {
                // A connection to an earlier life: the restarted host's kernel resets it.
                let reset = Message::Reply { tag: reply_tag, body: None, life: inbox.incarnation };
                if reply_tag != 0 {
                    self.deliver(to, from, reset, arrive_ns);
                }
            }
            Message::Request { reply_tag, .. } if inbox.process_dead => {
                // No process listens: the kernel resets the connection (`tcp_v4_send_reset`).
                if reply_tag != 0 {
                    let reset = Message::Reply { tag: reply_tag, body: None, life: inbox.incarnation };
                    self.deliver_kernel(to, from, reset, arrive_ns);
                }
            }
            Message::Reply { .. } | Message::Closed { .. } if inbox.process_dead => {}
            Message::Closed { life } => {
                inbox.closed.push((arrive_ns, from, life));
                wake_at(arrive_ns, &inbox.reader);
                // Calls still waiting on the dead process end with the reset of their connection.
                let mut reset = false;
                for (_, w) in inbox.waiting.iter_mut().filter(|(_, w)| w.peer == from) {
                    reset |= w.reply.is_none();
                    w.reply.get_or_insert((arrive_ns, life, None));
                }
                if reset {
                    wake_at(arrive_ns, &inbox.replies);
                }
            }
            // The receiver is woken when the message arrives, not before: a message costs one timer
            // and one wake-up of the task that takes it.
            Message::Request { reply_tag, body, .. } => {
                inbox.requests.push(Queued { at: (arrive_ns, seq), request: (ReplyTo { from, reply_tag }, body) });
                wake_at(arrive_ns, &inbox.reader);
            }
            Message::Reply { tag, body, life } => {
                if let Some(waiting) = inbox.waiting(tag) {
                    waiting.reply.get_or_insert((arrive_ns, life, body));
                    wake_at(arrive_ns, &inbox.replies);
                }
            }
        }
    }

    /// A kernel's reply on a link: routed as a message, its latency drawn from the kernel's stream.
    fn deliver_kernel(&mut self, from: NodeIx, to: NodeIx, msg: Message, sent_ns: u64) {
        let Some(arrive_ns) = self.route_kernel(from, to, sent_ns) else { return };
        let Some(inbox) = self.inboxes.get_mut(&to) else { return };
        if let Message::Reply { tag, body, life } = msg {
            if let Some(waiting) = inbox.waiting(tag) {
                waiting.reply.get_or_insert((arrive_ns, life, body));
                wake_at(arrive_ns, &inbox.replies);
            }
        }
    }

    /// When what a kernel sends on its own (a FIN, an RST) from `from` to `to` at `sent_ns` arrives:
    /// a latency from the kernel's stream, never before the link's earlier messages. Not lost.
    fn route_kernel(&mut self, from: NodeIx, to: NodeIx, sent_ns: u64) -> Option<u64> {
        let extra =
            self.delay.get(&from).copied().unwrap_or_default() + self.delay.get(&to).copied().unwrap_or_default();
        let latency = self.kernel_rng.gen_range(LATENCY_NS.0..=LATENCY_NS.1) + extra.as_nanos() as u64;
        let clear = self.link_clear_ns.entry((from, to)).or_default();
        *clear = (sent_ns + latency).max(*clear);
        Some(*clear)
    }

    /// When a message put on the wire at `sent_ns` from `from` to `to` arrives, or `None` if it is lost.
    fn route(&mut self, from: NodeIx, to: NodeIx, is_reply: bool, sent_ns: u64) -> Option<u64> {
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
        *clear = (sent_ns + latency).max(*clear);
        Some(*clear)
    }
}

fn set_or_clear<V>(map: &mut BTreeMap<NodeIx, V>, node: NodeIx, v: Option<V>) {
    match v {
        Some(v) => map.insert(node, v),
        None => map.remove(&node),
    };
}

/// The fate of a TCP keep-alive probe (see [`Rpc::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The peer's kernel acknowledged it: the connection is alive.
    Acked,
    /// The peer's host restarted: its kernel resets the connection.
    Reset,
    /// Nothing came back (a cut link, a host that is down).
    Unanswered,
    /// Data to the peer is unacknowledged: no probe is sent; `gave_up` once the retransmissions have
    /// run out.
    Retransmitting { gave_up: bool },
}

/// A call on its way: it stops waiting when it returns or is dropped (a caller that gave up on it in a
/// `select!`), so neither its reply nor the deadline timer wakes the caller for it afterwards.
struct Pending<'a> {
    rpc: &'a Rpc,
    tag: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut s = self.rpc.net.state();
        if let Some(inbox) = s.inboxes.get_mut(&self.rpc.me) {
            inbox.stop_waiting(self.tag);
        }
    }
}

/// What reaches a node's reader ([`Rpc::next_input`]).
pub enum Input<Q> {
    /// A request or stream message, and where its answer goes.
    Request(ReplyTo, Q),
    /// Life `life` of `peer`'s process died and its kernel closed its connections to this node.
    Closed { peer: NodeIx, life: u32 },
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
    /// The endpoint of the node `env` describes, in this life: the world opened it when it started the
    /// node ([`Net::bind_host`]); a node built outside a world gets one here.
    pub fn bind(env: &NodeEnv) -> Rpc {
        let opened = env.net.state().inboxes.get(&env.me).is_some_and(|i| i.incarnation == env.incarnation);
        if !opened {
            env.net.bind_host(env.me, env.incarnation);
        }
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

    /// What this node's kernel finds on its connection to life `incarnation` of `peer` if it sends a
    /// keep-alive probe now. A paused process's kernel answers; a crashed host does not; a restarted
    /// one answers with a reset (it knows nothing of the old connection). While data sent to the peer
    /// waits for a retransmission, the kernel sends no probes (Linux `tcp_keepalive_timer` leaves the
    /// connection to the retransmission timer, which gives up after `tcp_retries2`).
    pub fn probe(&self, peer: NodeIx, incarnation: u32) -> Probe {
        let s = self.net.state();
        if let Some(held) = s.held.get(&(self.me, peer)) {
            return Probe::Retransmitting { gave_up: retransmission_after(held.first_ns, sim_now_ns()).is_none() };
        }
        if s.cuts.contains_key(&(self.me, peer)) || s.cuts.contains_key(&(peer, self.me)) {
            return Probe::Unanswered;
        }
        match s.inboxes.get(&peer) {
            None => Probe::Unanswered,
            Some(inbox) if inbox.incarnation != incarnation || inbox.process_dead => Probe::Reset,
            Some(_) => Probe::Acked,
        }
    }

    /// When the data this node last sent to life `incarnation` of `peer` reached it, if it has by now
    /// (sim ns): the peer's kernel acknowledged it then. Linux counts an ACK as hearing from the peer:
    /// `tcp_ack` sets `rcv_tstamp` and clears `icsk_probes_out`, and `keepalive_time_elapsed` counts the
    /// idle time from the later of the last data (`icsk_ack.lrcvtime`) and the last ACK received. (The
    /// ACK's own way back, a few milliseconds, is not counted.)
    pub fn acked_ns(&self, peer: NodeIx, incarnation: u32) -> Option<u64> {
        let s = self.net.state();
        let (life, at) = *s.acked.get(&(self.me, peer))?;
        (life == incarnation && at <= sim_now_ns()).then_some(at)
    }

    /// Send `req` to `to` and wait for its reply, at most `timeout` by this node's clock.
    pub async fn call<Q, R>(&self, to: NodeIx, req: Q, timeout: Duration) -> Result<R, CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        self.call_on(to, None, req, timeout).await.map(|(reply, _)| reply)
    }

    /// [`Rpc::call`] on a connection: `conn` is the life of `to` that the connection was opened with
    /// (`None`: open one now). The reply comes with the life that answered, which the caller keeps
    /// as its connection. A request on a connection to an earlier life is refused with
    /// [`CallError::Reset`] — a restarted host resets connections it does not know — and is not
    /// applied: that is how a client library learns that its server restarted, and reconnects.
    pub async fn call_on<Q, R>(
        &self,
        to: NodeIx,
        conn: Option<u32>,
        req: Q,
        timeout: Duration,
    ) -> Result<(R, u32), CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        let tag = self.next_tag.get();
        self.next_tag.set(tag + 1);
        // madsim's timers wait at least 1 ms.
        let now = sim_now_ns();
        let deadline_ns = now + self.clock.real_duration(timeout).max(Duration::from_millis(1)).as_nanos() as u64;
        let waiting = Waiting { peer: to, reply: None, caller: None, deadline_ns };
        {
            let mut s = self.net.state();
            match s.inboxes.get_mut(&self.me) {
                Some(inbox) => inbox.waiting.push((tag, waiting)),
                None => return Err(CallError::Timeout),
            };
            s.send(self.me, to, Message::Request { reply_tag: tag, body: Box::new(req), conn }, now);
        }
        let _pending = Pending { rpc: self, tag };
        // The reply once it has arrived, or `None` once the deadline has passed (a reply that arrives
        // at the deadline wins). A node that died meanwhile waits for ever (its tasks are being
        // dropped).
        let reply = std::future::poll_fn(|cx| {
            let mut s = self.net.state();
            let Some(inbox) = s.inboxes.get_mut(&self.me) else { return Poll::Pending };
            let now = sim_now_ns();
            let waiting = inbox.waiting(tag).expect("a call waits until it returns");
            if waiting.reply.as_ref().is_some_and(|(arrive_ns, ..)| *arrive_ns <= now) {
                let (_, life, body) = waiting.reply.take().expect("just seen");
                return Poll::Ready(Some((life, body)));
            }
            if deadline_ns <= now {
                s.call_timeouts += 1;
                return Poll::Ready(None);
            }
            if !waiting.caller.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                waiting.caller = Some(cx.waker().clone());
            }
            if inbox.deadline_timer_ns.is_none_or(|at| at > deadline_ns) {
                inbox.watch(now);
            }
            Poll::Pending
        })
        .await;
        match reply {
            Some((life, Some(body))) => Ok((*body.downcast::<R>().expect("reply type matches the request type"), life)),
            Some((_, None)) => Err(CallError::Reset),
            None => Err(CallError::Timeout),
        }
    }

    /// Send `msg` to `to` without waiting for anything (replication streams).
    pub fn tell<Q: Any + Send>(&self, to: NodeIx, msg: Q) {
        self.tell_boxed(to, Box::new(msg));
    }

    /// [`Rpc::tell`] for a message already boxed.
    pub fn tell_boxed(&self, to: NodeIx, msg: Payload) {
        self.net.send(self.me, to, Message::Request { reply_tag: 0, body: msg, conn: None });
    }

    /// The next request for this node, once it has arrived. Panics if a node receives a request type it
    /// does not serve.
    /// One task per node reads its requests (its server loop, or a client's listener): each request
    /// wakes it when it arrives.
    pub async fn next_request<Q: Any + Send>(&self) -> (ReplyTo, Q) {
        std::future::poll_fn(|cx| {
            let mut s = self.net.state();
            let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
            match inbox.requests.peek() {
                Some(Queued { at: (at, _), .. }) if *at <= sim_now_ns() => {
                    let (reply_to, body) = inbox.requests.pop().expect("just seen").request;
                    let body = body.downcast::<Q>().expect("a node receives only the requests it serves");
                    Poll::Ready((reply_to, *body))
                }
                _ => {
                    inbox.reader.set(cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// The next request for this node, or the next connection a peer's kernel closed (a killed
    /// process's, see [`Net::kill_process`]), whichever arrives first; closes first at one instant.
    /// One task per node reads its input, as with [`Rpc::next_request`].
    pub async fn next_input<Q: Any + Send>(&self) -> Input<Q> {
        std::future::poll_fn(|cx| {
            let mut s = self.net.state();
            let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
            let now = sim_now_ns();
            if let Some(i) =
                (0..inbox.closed.len()).filter(|i| inbox.closed[*i].0 <= now).min_by_key(|i| inbox.closed[*i])
            {
                let (_, peer, life) = inbox.closed.remove(i);
                return Poll::Ready(Input::Closed { peer, life });
            }
            match inbox.requests.peek() {
                Some(Queued { at: (at, _), .. }) if *at <= now => {
                    let (reply_to, body) = inbox.requests.pop().expect("just seen").request;
                    let body = body.downcast::<Q>().expect("a node receives only the requests it serves");
                    Poll::Ready(Input::Request(reply_to, *body))
                }
                _ => {
                    inbox.reader.set(cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Answer a request (nothing is sent for one-way messages).
    pub fn reply<R: Any + Send>(&self, to: &ReplyTo, reply: R) {
        if to.reply_tag != 0 {
            let reply = Message::Reply { tag: to.reply_tag, body: Some(Box::new(reply)), life: self.incarnation };
            self.net.send(self.me, to.from, reply);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeIx = NodeIx(0);
    const B: NodeIx = NodeIx(1);

    fn in_world(f: impl FnOnce(&Net) + 'static) {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let net = Net::new(1);
            net.bind_host(A, 0);
            net.bind_host(B, 0);
            f(&net);
        });
    }

    fn tell(net: &Net, from: NodeIx, to: NodeIx, tag: u64) {
        net.send(from, to, Message::Request { reply_tag: tag, body: Box::new(()), conn: None });
    }

    /// The reply tags waiting in `to`'s inbox, with their arrival times.
    fn queued(net: &Net, to: NodeIx) -> Vec<(u64, u64)> {
        let mut queued: Vec<_> =
            net.state().inboxes[&to].requests.iter().map(|q| (q.at, q.request.0.reply_tag)).collect();
        queued.sort();
        queued.into_iter().map(|((at, _), tag)| (at, tag)).collect()
    }

    #[test]
    fn drop_reply_loses_replies_but_not_requests() {
        in_world(|net| {
            let mut s = net.state();
            s.drop_reply.insert(A, 1.0);
            assert!(s.route(B, A, false, 0).is_some());
            assert!(s.route(A, B, true, 0).is_none());
        });
    }

    #[test]
    fn messages_on_one_link_never_overtake_each_other() {
        in_world(|net| {
            let mut s = net.state();
            let arrivals: Vec<u64> = (0..50).map(|_| s.route(A, B, false, 0).unwrap()).collect();
            assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
            assert!(arrivals[0] >= LATENCY_NS.0 && arrivals[0] <= LATENCY_NS.1);
        });
    }

    #[test]
    fn retransmissions_back_off_from_200ms_and_give_up_after_15() {
        let s = 1_000_000_000;
        // Sent at 0: retransmitted at 0.2, 0.6, 1.4, 3.0, 6.2 s …
        assert_eq!(retransmission_after(0, 0), Some(200_000_000));
        assert_eq!(retransmission_after(0, 2 * s), Some(3_000_000_000));
        assert_eq!(retransmission_after(0, 5 * s), Some(6_200_000_000));
        // … then every 120 s once the timeout has stopped doubling; the 15th is at 804.6 s.
        assert_eq!(retransmission_after(0, 800 * s), Some(804_600_000_000));
        assert_eq!(retransmission_after(0, 805 * s), None, "tcp_retries2: the connection is given up");
    }

    #[test]
    fn a_cut_link_delays_every_message_until_a_retransmission_after_the_heal() {
        in_world(|net| {
            net.cut(A, B, true);
            tell(net, A, B, 0);
            tell(net, A, B, 7);
            tell(net, B, A, 9);
            assert!(queued(net, B).is_empty(), "nothing crosses a cut link");
            assert_eq!(queued(net, A).len(), 1, "the other direction is up");
            net.cut(A, B, false);
            let arrived = queued(net, B);
            assert_eq!(arrived.iter().map(|(_, tag)| *tag).collect::<Vec<_>>(), vec![0, 7], "in order");
            assert!(arrived.iter().all(|(at, _)| *at >= TCP_RTO_MIN_NS), "at the first retransmission");
            // Sent after the heal, before the retransmission: still behind what was held.
            tell(net, A, B, 8);
            let last = queued(net, B);
            assert_eq!(last.last().unwrap().1, 8);
            assert!(last.windows(2).all(|w| w[0].0 <= w[1].0));
        });
    }

    #[test]
    fn held_messages_die_with_either_end() {
        in_world(|net| {
            net.cut(A, B, true);
            tell(net, A, B, 1);
            net.unbind(B);
            net.bind_host(B, 1);
            net.cut(A, B, false);
            assert!(queued(net, B).is_empty(), "a restarted receiver resets the old connection");
            net.cut(A, B, true);
            tell(net, A, B, 2);
            net.unbind(A);
            net.bind_host(A, 1);
            net.cut(A, B, false);
            assert!(queued(net, B).is_empty(), "a crashed sender's kernel buffers are gone");
        });
    }

    #[test]
    fn a_crashed_node_sends_nothing() {
        in_world(|net| {
            net.unbind(A);
            // Node 0 has no inbox: it has crashed, and its dying tasks' last words are lost.
            tell(net, A, B, 0);
            assert!(queued(net, B).is_empty());
            assert_eq!(net.messages(), 0);
        });
    }

    #[test]
    fn a_killed_process_kernel_closes_its_connections_and_resets_what_comes_after() {
        in_world(|net| {
            tell(net, A, B, 0);
            // B waits on a call to A when A's process dies.
            let waiting = Waiting { peer: A, reply: None, caller: None, deadline_ns: u64::MAX };
            net.state().inboxes.get_mut(&B).unwrap().waiting.push((5, waiting));
            net.kill_process(A);
            let mut s = net.state();
            let closed = s.inboxes[&B].closed.clone();
            assert_eq!(closed.len(), 1, "B had a connection with A: it sees the close");
            let (at, peer, life) = closed[0];
            assert_eq!((peer, life), (A, 0));
            assert!(at >= s.link_clear_ns[&(A, B)] && at <= LATENCY_NS.1, "one network delay later");
            let reply = s.inboxes.get_mut(&B).unwrap().waiting(5).unwrap().reply.take();
            assert!(matches!(reply, Some((_, 0, None))), "its call ends with a reset");
            drop(s);
            // The host is up: a new call is refused at once, a probe is reset, the dead process sends nothing.
            let waiting = Waiting { peer: A, reply: None, caller: None, deadline_ns: u64::MAX };
            net.state().inboxes.get_mut(&B).unwrap().waiting.push((6, waiting));
            net.send(B, A, Message::Request { reply_tag: 6, body: Box::new(()), conn: None });
            assert!(net
                .state()
                .inboxes
                .get_mut(&B)
                .unwrap()
                .waiting(6)
                .unwrap()
                .reply
                .as_ref()
                .is_some_and(|r| r.2.is_none()));
            let rpc_b = Rpc {
                me: B,
                incarnation: 0,
                net: net.clone(),
                clock: Clock::default(),
                next_tag: Rc::new(Cell::new(1)),
            };
            assert_eq!(rpc_b.probe(A, 0), Probe::Reset);
            let before = net.messages();
            tell(net, A, B, 1);
            assert_eq!(net.messages(), before);
        });
    }

    #[test]
    fn a_dead_hosts_peers_hear_nothing() {
        in_world(|net| {
            tell(net, A, B, 0);
            net.unbind(A);
            assert!(net.state().inboxes[&B].closed.is_empty());
        });
    }

    #[test]
    fn a_close_on_a_cut_link_waits_for_the_heal() {
        in_world(|net| {
            tell(net, A, B, 0);
            net.cut(A, B, true);
            net.kill_process(A);
            assert!(net.state().inboxes[&B].closed.is_empty(), "held by the cut");
            net.cut(A, B, false);
            assert_eq!(net.state().inboxes[&B].closed.len(), 1, "retransmitted after the heal");
        });
    }

    #[test]
    fn delay_adds_to_the_latency() {
        in_world(|net| {
            let mut s = net.state();
            s.delay.insert(B, Duration::from_secs(1));
            let at = s.route(A, B, false, 0).unwrap();
            assert!(at >= 1_000_000_000 + LATENCY_NS.0);
        });
    }

    #[test]
    fn a_request_on_a_connection_to_an_earlier_life_is_reset_and_not_applied() {
        in_world(|net| {
            net.unbind(B);
            net.bind_host(B, 1);
            let waiting = Waiting { peer: B, reply: None, caller: None, deadline_ns: u64::MAX };
            net.state().inboxes.get_mut(&A).unwrap().waiting.push((7, waiting));
            net.send(A, B, Message::Request { reply_tag: 7, body: Box::new(()), conn: Some(0) });
            assert!(queued(net, B).is_empty(), "not applied");
            let reset = net.state().inboxes.get_mut(&A).unwrap().waiting(7).unwrap().reply.take();
            let (_, life, body) = reset.expect("a reset comes back");
            assert!(body.is_none(), "a reset carries no reply");
            assert_eq!(life, 1);
            net.send(A, B, Message::Request { reply_tag: 8, body: Box::new(()), conn: Some(1) });
            assert_eq!(queued(net, B).len(), 1, "a connection to the live host gets through");
        });
    }
}
