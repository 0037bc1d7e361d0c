//! Typed request/response messages between nodes: the simulated network.
//!
//! Messages are values (no serialisation). A message goes straight into the receiver's inbox stamped
//! with its arrival time — now plus a latency drawn from the `Network` stream (1–10 ms), never before
//! the previous message on the same link, as over a TCP connection — and the receiver takes it when
//! that time comes. No task runs per message: that is most of what a simulated message costs. A paused
//! receiver finds its messages waiting when it resumes; a crashed one loses its inbox and all in it.
//! The network also applies the faults that act on messages: cut links (`partition`, `clog`), extra
//! latency (`delay`), lost segments (`loss`) and lost replies of a server that did apply the request
//! (`drop-reply`). Every decision draws from the `Network` stream, never from madsim's generator.
//!
//! Every message rides a TCP connection, and TCP removes nothing from a stream: data is delivered in
//! order, late, or the connection breaks. A cut link delays what is sent on it, as TCP does: the
//! sender's kernel sends a lone unacknowledged segment again `TCP_RTO_MIN` (200 ms) after it (a tail
//! loss probe), then on its retransmission timer, waiting 200 ms and doubling the wait each time up to
//! `TCP_RTO_MAX` (120 s) — at 0.2, 0.4, 0.8, 1.6 s … — and gives the connection up after `tcp_retries2`
//! = 15 retransmissions (about 15 min; [`retransmission_after`]). So a message sent during a cut
//! arrives at the first retransmission after the heal — requests, replies and one-way stream messages
//! alike, in order, and after anything sent on the link meanwhile is not let through earlier. A request
//! may therefore be applied long after its caller gave up waiting (a real socket's unsent data outlives
//! the caller's timeout, even a `close`). What was held dies with either end: a sender that crashed
//! (its kernel's buffers are gone) or a receiver that crashed or restarted (its new kernel resets the
//! old connection). A message already on the wire when a cut starts still arrives (the cut acts at
//! send time).
//!
//! A connection is a socket between two node lives, with its own retransmission timer and its own
//! order, as each Linux socket has (`icsk_retransmit_timer`, `icsk_backoff`): nothing one socket
//! holds delays another. A pair of nodes shares socket 0, which calls and messages without a socket
//! of their own ride (a restarted node's is a new connection, with its own schedule). A client library
//! that reconnects — ZooKeeper's `ClientCnxn` re-attaching a session — closes its socket
//! ([`Rpc::close`]) and opens a fresh one ([`Rpc::open`]), as the real one does, and the kernel's rules
//! decide what becomes of each:
//! - A new socket's first data waits for its handshake: sent into a cut, it goes at the first SYN
//!   retransmission after the heal — `TCP_TIMEOUT_INIT` (1 s) after the SYN, doubling: 1, 3, 7, 15,
//!   31, 63 s; `connect` fails at 127 s (`tcp_syn_retries` = 6, `net/ipv4/tcp_timer.c`) — rather than
//!   on data's 200 ms schedule.
//! - A closed socket whose handshake never got through (`SYN_SENT`: the client's connect timeout
//!   passed) is gone, with its SYN and its data (`tcp_close` → `tcp_set_state(TCP_CLOSE)`): an
//!   abandoned connect is never delivered.
//! - A closed socket with unacknowledged data is an orphan (`tcp_close` queues the FIN behind the
//!   data): its kernel retransmits it `TCP_ORPHAN_RETRIES` times, as for a killed process, so an old
//!   request may still reach the server after a heal. The server reads it if it arrives before the
//!   client's new connection; once the server has read from the new one, it has closed the old
//!   (ZooKeeper's `processConnectRequest`: `closeSession(sessionId, CLIENT_RECONNECT)`) and resets
//!   what comes on it, unread (only the ZooKeeper client opens sockets of its own: a server that
//!   reads on, as a PostgreSQL backend runs a statement that reaches it before the FIN, would need
//!   this rule per family). A late reply to a closed socket finds no call waiting. The FIN of a
//!   closed socket is not modelled: the servers learn of a client going away from its requests
//!   (`SqlRequest::Close`) or its process's death.
//! - A server that closes a client's connection itself ([`Rpc::close_connection`]: ZooKeeper, an
//!   expired session's) sends a FIN behind what it sent on it; the client reads the end of its stream,
//!   and what it sent on the connection meanwhile is reset unread.
//! - A server's pushes (watch notifications) go on the newest socket its client opened to it. One
//!   that reaches a socket its client has closed is still handed to the client: it stands for the
//!   replay of missed notifications on the new connection (ZooKeeper's `SetWatches` after a
//!   re-attach, which the model does not send), as it did before sockets had identities.
//!
//! `loss` loses single transmissions: a lost message is retransmitted on the same schedule, each
//! retransmission lost again at the fault's rate, so it arrives whole timeouts late and the
//! connection's later messages wait behind it; one lost on every retransmission while the fault
//! lasts goes at the first retransmission after it ends. `drop-reply` loses a server's reply to a
//! request it applied, which TCP cannot do without breaking the connection: the caller hears the
//! connection break ([`CallError::Broken`]) when the reply would have arrived, as real mode's proxy
//! resets it, and its client opens a new one. (The proxy also breaks the connection on a push, and
//! closes the server's end. The model breaks it only on a reply — PostgreSQL's results are pushes,
//! so only its connection handshake is — and tells the server nothing: ZooKeeper sessions and etcd
//! leases outlive a connection, and their clients restore their watches on the next one.)
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
//!   retransmitted, the kernel's buffers outliving the process, but only `TCP_ORPHAN_RETRIES`
//!   times: the kernel gives an orphaned socket up after about 102 s rather than 15 min.
//! - A dead *host* (power loss, a kernel panic — `host-crash`) says nothing: its peers learn only
//!   by their own timeouts and keep-alive, and what it held dies with it.

use crate::clock::{sim_now_ns, wake_at, Clock, WakeSlot};
use crate::history::NodeIx;
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Wake, Waker};
use std::time::Duration;
use tcp::{retransmission_within, retransmissions, TCP_ORPHAN_RETRIES, TCP_RETRIES2};

mod rpc;
mod tcp;

pub use rpc::{Input, Probe, Rpc};
pub use tcp::{retransmission_after, syn_retransmission_after};
/// Base latency of every message, drawn uniformly (madsim's default range).
const LATENCY_NS: (u64, u64) = (1_000_000, 10_000_000);

/// A message as it travels: any value, boxed (see [`Rpc::next_input_any`]).
pub type Payload = Box<dyn Any + Send>;

/// Why a call did not return a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// No reply within the timeout: the request may or may not have been applied.
    Timeout,
    /// The connection was reset and the request was not applied: it went on a connection to an
    /// earlier life of the peer, whose host has restarted since (see [`Rpc::call_on`]), or the peer's
    /// process was killed, and its kernel closed the connection (see [`Net::kill_process`]).
    Reset,
    /// The connection broke after the request went through: it may have been applied (it was, when
    /// the peer's reply was lost — `drop-reply`: TCP cannot lose data without breaking the
    /// connection). The client opens a new connection, as after a reset.
    Broken,
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
    /// Nodes whose messages are lost at a rate (`loss`), until when (sim ns): each lost transmission
    /// is retransmitted.
    loss: BTreeMap<NodeIx, (f64, u64)>,
    drop_reply: BTreeMap<NodeIx, f64>,
    /// When the last message on each connection's direction (link and socket) arrives: later ones
    /// never overtake it.
    link_clear_ns: BTreeMap<(NodeIx, NodeIx, u32), u64>,
    /// Sockets: see [`Sockets`].
    sockets: Sockets,
    /// Messages sent on a cut link, waiting to be retransmitted once it heals, per connection.
    held: BTreeMap<Conn, Held>,
    /// Nodes whose links to each other carry streams with a read timeout: see [`Net::set_read_timeout`].
    read_timeout: Option<(BTreeSet<NodeIx>, u64)>,
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

/// A reply on its way: when it arrives, the life of the node that sent it, and the body (or why there
/// is none: a reset, a broken connection).
type Reply = (u64, u32, Result<Payload, CallError>);

/// A call waiting for its reply: the reply once it is on its way, the caller's waker, and when the
/// caller gives up (sim ns).
struct Waiting {
    /// Whom the call went to, and on which socket: a close of its connection by that node (its
    /// kernel's, for a dead process; the server's own, for that socket) ends it.
    peer: NodeIx,
    socket: u32,
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
    /// Connections peers closed (a killed process's, or one socket its server closed): when the close
    /// arrives, who, which life, which socket (`None`: every connection of the dead process).
    closed: Vec<(u64, NodeIx, u32, Option<u32>)>,
    /// Requests by arrival time, then by send order.
    requests: BinaryHeap<Queued>,
    /// The newest socket each peer's requests came on: data on an older one is not read (see
    /// [`Inbox::take_request`]).
    newest: BTreeMap<NodeIx, u32>,
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
    /// The next request for `me` that has arrived by `now_ns`, skipping those that came on a socket
    /// its client closed once a newer socket of that client was read: a client opens a new connection
    /// after giving the old one up, and a server that has read from the new one has closed the old —
    /// ZooKeeper's `processConnectRequest` closes the session's other connection (`closeSession(
    /// sessionId, CLIENT_RECONNECT)`) as it re-attaches, and what arrives on it afterwards is reset
    /// unread (its RST finds the client's socket closed: nobody hears of it). Those on a socket `me`
    /// closed itself ([`Rpc::close_connection`]) are reset unread too: its FIN, on its way first, has
    /// ended the client's calls on it.
    fn take_request(&mut self, me: NodeIx, now_ns: u64, sockets: &Sockets) -> Option<Request> {
        while self.requests.peek().is_some_and(|q| q.at.0 <= now_ns) {
            let request = self.requests.pop().expect("just seen").request;
            let (from, socket) = (request.0.from, request.0.socket);
            if sockets.shut.contains(&(me, from, socket)) {
                continue;
            }
            let newest = self.newest.entry(from).or_default();
            if socket >= *newest || !sockets.closed.contains(&(from, socket)) {
                *newest = socket.max(*newest);
                return Some(request);
            }
        }
        None
    }

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
/// `life` of its sender (`body` an error: a reset, a broken connection).
enum Message {
    Request {
        reply_tag: u64,
        body: Payload,
        conn: Option<u32>,
    },
    Reply {
        tag: u64,
        body: Result<Payload, CallError>,
        life: u32,
    },
    /// The sender's kernel closed its connections: life `life` of its process died (`socket`
    /// `None`), or the process closed the one on `socket` ([`Rpc::close_connection`]).
    Closed {
        life: u32,
        socket: Option<u32>,
    },
}

/// One direction of one TCP connection as the model knows it: a link, the lives of its two ends and
/// the socket. Each connection has its own retransmission timer (Linux keeps it per socket:
/// `icsk_retransmit_timer`, `icsk_backoff`): one opened to a restarted peer, by a restarted node, or
/// by a client that reconnected ([`Rpc::reconnect`]) starts its own schedule however long the link has
/// been cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Conn {
    from: NodeIx,
    to: NodeIx,
    from_life: u32,
    to_life: u32,
    socket: u32,
}

/// A socket a client opened ([`Rpc::open`]): one TCP connection to its server, with its own
/// retransmission schedule. Numbered in the order sockets are opened in the world; a pair of nodes
/// also has a shared one, socket 0, which calls and messages without a socket of their own ride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket(u32);

/// The sockets between pairs of nodes.
#[derive(Default)]
struct Sockets {
    /// The newest socket opened between each pair of nodes, under both directions (absent: socket 0):
    /// what the pair says without a socket of its own goes on it — a server's pushes (a watch
    /// notification) on the connection its client opened last.
    newest: BTreeMap<(NodeIx, NodeIx), u32>,
    /// How many sockets were opened.
    opened: u32,
    /// Sockets opened whose handshake has not got through: their first data waits for the SYN.
    connecting: std::collections::BTreeSet<(NodeIx, NodeIx, u32)>,
    /// Sockets their owner closed: a server that has read a newer socket of the same client resets
    /// what arrives on them ([`Inbox::take_request`]).
    closed: std::collections::BTreeSet<(NodeIx, u32)>,
    /// Client connections their server closed ([`Rpc::close_connection`]), by server, client and socket
    /// (socket 0 is every pair's shared one): the server resets what arrives on them.
    shut: std::collections::BTreeSet<(NodeIx, NodeIx, u32)>,
}

impl Sockets {
    fn current(&self, from: NodeIx, to: NodeIx) -> u32 {
        self.newest.get(&(from, to)).copied().unwrap_or(0)
    }
}

/// The unacknowledged data of one connection: when the first of it was sent (the retransmission
/// timer counts from there), whether it waits for a SYN to get through (its socket's handshake, on a
/// SYN's schedule), how many retransmissions the sender's kernel makes before it gives up
/// ([`TCP_RETRIES2`], or [`TCP_ORPHAN_RETRIES`] once its process is dead or its socket closed), and
/// the messages in order.
struct Held {
    first_ns: u64,
    syn: bool,
    retries: u32,
    messages: Vec<Message>,
}

impl Held {
    /// When what is held gets through a link healed at `heal_ns`, if the kernel has not given up.
    fn through_after(&self, heal_ns: u64) -> Option<u64> {
        match self.syn {
            true => syn_retransmission_after(self.first_ns, heal_ns),
            false => retransmission_within(self.first_ns, heal_ns, self.retries),
        }
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
            sockets: Sockets::default(),
            held: BTreeMap::new(),
            read_timeout: None,
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
        let conns: Vec<Conn> = s.held.keys().filter(|c| (c.from, c.to) == (from, to)).copied().collect();
        conns.into_iter().for_each(|conn| s.release(conn, sim_now_ns()));
    }

    /// The links among `nodes` carry streams whose receiver closes a connection it has heard nothing on
    /// for `timeout` (etcd's rafthttp: `ConnReadTimeout`, 5 s, on every peer stream, kept busy by the
    /// leader's heartbeats and by link heartbeats every `ConnReadTimeout / 3`), and dials again. What
    /// a cut held on such a link for that long is never read: the receiver closed that connection, and
    /// the sender's retransmission after the heal meets a reset. The receiver last heard from the
    /// sender about when the cut began, taken as when the first held message was sent.
    pub fn set_read_timeout(&self, nodes: &[NodeIx], timeout: Duration) {
        self.state().read_timeout = Some((nodes.iter().copied().collect(), timeout.as_nanos() as u64));
    }

    /// When the oldest message now held on the cut link `from → to` was sent, if one is held: what was
    /// sent from then on is in the sender's kernel and dies with it; what was sent before is on the wire
    /// (a Redis failover asks, to know what its replica would still receive).
    pub fn held_since(&self, from: NodeIx, to: NodeIx) -> Option<u64> {
        let s = self.state();
        s.held.iter().filter(|(c, _)| (c.from, c.to) == (from, to)).map(|(_, h)| h.first_ns).min()
    }

    /// Extra latency on every message to or from `node` (`None` clears it).
    pub fn set_delay(&self, node: NodeIx, latency: Option<Duration>) {
        set_or_clear(&mut self.state().delay, node, latency);
    }

    /// Lose each transmission of a message to or from `node` with probability `rate` for `lasting`
    /// from now (`None`: to the run's end); `rate` `None` clears it. TCP removes nothing from a stream:
    /// a lost segment is retransmitted (`NetState::route`), so loss delays — and a retransmission
    /// after the fault's end gets through, which is why the network is told when it ends.
    pub fn set_loss(&self, node: NodeIx, rate: Option<f64>, lasting: Option<Duration>) {
        let until_ns = lasting.map_or(u64::MAX, |d| sim_now_ns().saturating_add(d.as_nanos() as u64));
        set_or_clear(&mut self.state().loss, node, rate.map(|r| (r, until_ns)));
    }

    /// `node` applies requests but loses each reply with probability `rate` (`None` clears it). TCP
    /// cannot lose a reply without breaking its connection (real mode's proxy resets it): the caller
    /// hears the connection break when the reply would have come, [`CallError::Broken`], its request
    /// applied.
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
            newest: BTreeMap::new(),
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
        // Its sockets are orphans now: their unacknowledged data gets fewer retransmissions.
        for (_, held) in s.held.iter_mut().filter(|(c, _)| c.from == node && c.from_life == life) {
            held.retries = TCP_ORPHAN_RETRIES;
        }
        let links = s.link_clear_ns.keys().map(|(a, b, _)| (*a, *b)).chain(s.held.keys().map(|c| (c.from, c.to)));
        let peers: std::collections::BTreeSet<NodeIx> =
            links.filter_map(|(a, b)| (a == node).then_some(b).or((b == node).then_some(a))).collect();
        let now = sim_now_ns();
        for peer in peers {
            let socket = s.sockets.current(node, peer);
            match s.conn(node, peer, socket) {
                Some(conn) if s.holds(&conn) => s.hold(conn, Message::Closed { life, socket: None }, now),
                // A cut link to a host that is down: nothing to close.
                None if s.cuts.contains_key(&(node, peer)) => {}
                _ => s.deliver(node, peer, socket, Message::Closed { life, socket: None }, now),
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

    /// Send `msg` from `from` to `to` now, on the socket the two talk on.
    fn send(&self, from: NodeIx, to: NodeIx, msg: Message) {
        let mut s = self.state();
        let socket = s.sockets.current(from, to);
        s.send(from, to, socket, msg, sim_now_ns());
    }
}

impl NetState {
    /// Send `msg` from `from` to `to` on `socket` at `now_ns`: count it, hold it while the link is
    /// cut, else deliver it (a connecting socket's handshake is then through).
    fn send(&mut self, from: NodeIx, to: NodeIx, socket: u32, msg: Message, now_ns: u64) {
        // A crashed host sends nothing: what its dying code tries to say (a socket closed as its
        // tasks are dropped) dies with it.
        // A killed process sends nothing either (its kernel's own FINs go by `Net::kill_process`).
        if self.inboxes.get(&from).is_none_or(|i| i.process_dead) {
            return;
        }
        self.messages += 1;
        match self.conn(from, to, socket) {
            Some(conn) if self.holds(&conn) => self.hold(conn, msg, now_ns),
            // A host that is down cannot take the retransmissions; one restarted later resets them.
            None if self.cuts.contains_key(&(from, to)) => {}
            _ => {
                self.sockets.connecting.remove(&(from, to, socket));
                self.deliver(from, to, socket, msg, now_ns);
            }
        }
    }

    /// The connection `from → to` on `socket` between the nodes' lives now, unless either host is down.
    fn conn(&self, from: NodeIx, to: NodeIx, socket: u32) -> Option<Conn> {
        let life = |n: NodeIx| self.inboxes.get(&n).map(|i| i.incarnation);
        Some(Conn { from, to, from_life: life(from)?, to_life: life(to)?, socket })
    }

    /// Whether data on `conn` must wait for a retransmission: its link is cut, or earlier data waits
    /// (nothing overtakes it on a TCP connection).
    fn holds(&self, conn: &Conn) -> bool {
        self.cuts.contains_key(&(conn.from, conn.to)) || self.held.contains_key(conn)
    }

    /// Keep `msg`, sent at `sent_ns`, in its sender's kernel until `conn` gets through: the first
    /// data of a connecting socket waits for its SYN.
    fn hold(&mut self, conn: Conn, msg: Message, sent_ns: u64) {
        let orphan = self.inboxes.get(&conn.from).is_some_and(|i| i.process_dead);
        let retries = if orphan { TCP_ORPHAN_RETRIES } else { TCP_RETRIES2 };
        let syn = self.sockets.connecting.contains(&(conn.from, conn.to, conn.socket));
        let held =
            self.held.entry(conn).or_insert_with(|| Held { first_ns: sent_ns, syn, retries, messages: Vec::new() });
        held.messages.push(msg);
    }

    /// `conn`'s link healed at `now_ns`: what it held goes, in order, at the sender's next
    /// retransmission (of the SYN, on a socket still connecting) — unless the sender gave up by then,
    /// or either end has a new life (a crashed sender's buffers are gone; a restarted receiver resets
    /// the old connection).
    fn release(&mut self, conn: Conn, now_ns: u64) {
        let Some(held) = self.held.remove(&conn) else { return };
        let Some(retransmit_ns) = held.through_after(now_ns) else { return };
        if self.conn(conn.from, conn.to, conn.socket) != Some(conn) {
            return;
        }
        if self.read_timed_out(conn, held.first_ns, retransmit_ns) {
            return;
        }
        self.sockets.connecting.remove(&(conn.from, conn.to, conn.socket));
        for msg in held.messages {
            self.deliver(conn.from, conn.to, conn.socket, msg, retransmit_ns);
        }
    }

    /// Whether the receiver of `conn`, a stream with a read timeout, closed it before data held since
    /// `first_ns` gets through at `through_ns`.
    fn read_timed_out(&self, conn: Conn, first_ns: u64, through_ns: u64) -> bool {
        self.read_timeout.as_ref().is_some_and(|(nodes, timeout)| {
            nodes.contains(&conn.from) && nodes.contains(&conn.to) && through_ns - first_ns >= *timeout
        })
    }

    /// `node` opens a socket to `peer` ([`Rpc::open`]).
    fn open(&mut self, node: NodeIx, peer: NodeIx) -> Socket {
        self.sockets.opened += 1;
        let socket = self.sockets.opened;
        self.sockets.newest.insert((node, peer), socket);
        self.sockets.newest.insert((peer, node), socket);
        self.sockets.connecting.insert((node, peer, socket));
        Socket(socket)
    }

    /// The socket `node` and `peer` last opened between them (0: none, the pair's shared one).
    fn newest_socket(&self, node: NodeIx, peer: NodeIx) -> Socket {
        Socket(self.sockets.newest.get(&(node, peer)).copied().unwrap_or(0))
    }

    /// `node` closes its socket to `peer` ([`Rpc::close`]).
    fn close(&mut self, node: NodeIx, peer: NodeIx, Socket(socket): Socket) {
        self.sockets.closed.insert((node, socket));
        self.sockets.connecting.remove(&(node, peer, socket));
        let life = self.inboxes.get(&node).map(|i| i.incarnation);
        let mine = |c: &Conn| (c.from, c.to, c.socket) == (node, peer, socket) && Some(c.from_life) == life;
        let held: Vec<Conn> = self.held.keys().filter(|c| mine(c)).copied().collect();
        for conn in held {
            match self.held.get(&conn).is_some_and(|h| h.syn) {
                // `tcp_close` on a `SYN_SENT` socket: it is gone, and its SYN with it.
                true => drop(self.held.remove(&conn)),
                // `tcp_close` with data unacknowledged: an orphan, retransmitting to its end.
                false => self.held.get_mut(&conn).expect("just seen").retries = TCP_ORPHAN_RETRIES,
            }
        }
    }

    /// Put `msg`, sent (or retransmitted) at `sent_ns` on `socket`, into the receiver's inbox, unless
    /// its sender's kernel gave up retransmitting it ([`NetState::route`]). A reply that `drop-reply`
    /// loses breaks its connection instead ([`CallError::Broken`]).
    fn deliver(&mut self, from: NodeIx, to: NodeIx, socket: u32, msg: Message, sent_ns: u64) {
        let msg = match msg {
            Message::Reply { tag, body: Ok(_), life } if self.drops_reply(from) => {
                Message::Reply { tag, body: Err(CallError::Broken), life }
            }
            msg => msg,
        };
        let arrive_ns = match msg {
            Message::Closed { .. } => self.route_kernel(from, to, socket, sent_ns),
            Message::Reply { .. } | Message::Request { .. } => self.route(from, to, socket, sent_ns),
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
                let reset = Message::Reply { tag: reply_tag, body: Err(CallError::Reset), life: inbox.incarnation };
                if reply_tag != 0 {
                    self.deliver(to, from, socket, reset, arrive_ns);
                }
            }
            Message::Request { reply_tag, .. } if inbox.process_dead => {
                // No process listens: the kernel resets the connection (`tcp_v4_send_reset`).
                if reply_tag != 0 {
                    let reset = Message::Reply { tag: reply_tag, body: Err(CallError::Reset), life: inbox.incarnation };
                    self.deliver_kernel(to, from, socket, reset, arrive_ns);
                }
            }
            Message::Reply { .. } | Message::Closed { .. } if inbox.process_dead => {}
            Message::Closed { life, socket: closed } => {
                inbox.closed.push((arrive_ns, from, life, closed));
                wake_at(arrive_ns, &inbox.reader);
                // Calls still waiting on the closed connection (all of a dead process's) end with it.
                let mut reset = false;
                let on_it = |w: &Waiting| w.peer == from && closed.is_none_or(|s| s == w.socket);
                for (_, w) in inbox.waiting.iter_mut().filter(|(_, w)| on_it(w)) {
                    reset |= w.reply.is_none();
                    w.reply.get_or_insert((arrive_ns, life, Err(CallError::Reset)));
                }
                if reset {
                    wake_at(arrive_ns, &inbox.replies);
                }
            }
            // The receiver is woken when the message arrives, not before: a message costs one timer
            // and one wake-up of the task that takes it.
            Message::Request { reply_tag, body, .. } => {
                let reply_to = ReplyTo { from, reply_tag, socket };
                inbox.requests.push(Queued { at: (arrive_ns, seq), request: (reply_to, body) });
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
    fn deliver_kernel(&mut self, from: NodeIx, to: NodeIx, socket: u32, msg: Message, sent_ns: u64) {
        let Some(arrive_ns) = self.route_kernel(from, to, socket, sent_ns) else { return };
        let Some(inbox) = self.inboxes.get_mut(&to) else { return };
        if let Message::Reply { tag, body, life } = msg {
            if let Some(waiting) = inbox.waiting(tag) {
                waiting.reply.get_or_insert((arrive_ns, life, body));
                wake_at(arrive_ns, &inbox.replies);
            }
        }
    }

    /// When what a kernel sends on its own (a FIN, an RST) from `from` to `to` on `socket` at
    /// `sent_ns` arrives: a latency from the kernel's stream, never before the connection's earlier
    /// messages. Not lost.
    fn route_kernel(&mut self, from: NodeIx, to: NodeIx, socket: u32, sent_ns: u64) -> Option<u64> {
        let extra =
            self.delay.get(&from).copied().unwrap_or_default() + self.delay.get(&to).copied().unwrap_or_default();
        let latency = self.kernel_rng.gen_range(LATENCY_NS.0..=LATENCY_NS.1) + extra.as_nanos() as u64;
        let clear = self.link_clear_ns.entry((from, to, socket)).or_default();
        *clear = (sent_ns + latency).max(*clear);
        Some(*clear)
    }

    /// Whether `drop-reply` on `from` loses the reply it sends now.
    fn drops_reply(&mut self, from: NodeIx) -> bool {
        let rate = self.drop_reply.get(&from).copied().unwrap_or(0.0);
        rate > 0.0 && self.rng.gen_bool(rate.min(1.0))
    }

    /// When a message put on the wire at `sent_ns` from `from` to `to` on `socket` arrives, or `None`
    /// if `loss` lost it and all [`TCP_RETRIES2`] retransmissions (the kernel gives the connection
    /// up); never before the connection's earlier messages. Each
    /// transmission is lost at the higher rate of the two ends' `loss` faults still on when it goes;
    /// the sender's kernel retransmits after each loss ([`retransmissions`]), so a lost message
    /// arrives a retransmission timeout or more late, and the link's later messages wait behind it —
    /// TCP delivers a stream in order, with nothing removed.
    fn route(&mut self, from: NodeIx, to: NodeIx, socket: u32, sent_ns: u64) -> Option<u64> {
        let lossy = [from, to].iter().any(|n| self.loss.contains_key(n));
        let mut sent_ns = sent_ns;
        if lossy {
            let rate_at = |at: u64, loss: &BTreeMap<NodeIx, (f64, u64)>| {
                let on = [from, to].into_iter().filter_map(|n| loss.get(&n)).filter(|(_, until)| at < *until);
                on.map(|(rate, _)| rate.min(1.0)).fold(0.0, f64::max)
            };
            let mut transmissions =
                std::iter::once(sent_ns).chain(retransmissions(sent_ns).take(TCP_RETRIES2 as usize + 1));
            sent_ns = transmissions.find(|at| {
                let rate = rate_at(*at, &self.loss);
                rate <= 0.0 || !self.rng.gen_bool(rate)
            })?;
        }
        let extra =
            self.delay.get(&from).copied().unwrap_or_default() + self.delay.get(&to).copied().unwrap_or_default();
        let latency = self.rng.gen_range(LATENCY_NS.0..=LATENCY_NS.1) + extra.as_nanos() as u64;
        let clear = self.link_clear_ns.entry((from, to, socket)).or_default();
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

/// A received request's body as the type its node serves.
fn downcast_request<Q: Any + Send>(body: Payload) -> Q {
    *body.downcast::<Q>().expect("a node receives only the requests it serves")
}

/// Where the answer to a received request goes (see [`Rpc::reply`]): back on the socket it came on.
pub struct ReplyTo {
    pub from: NodeIx,
    reply_tag: u64,
    socket: u32,
}

impl ReplyTo {
    /// The connection the request came on.
    pub fn connection(&self) -> Connection {
        Connection { peer: self.from, socket: self.socket }
    }
}

/// A client's connection as its server knows it: the peer, and the socket its requests come on. A
/// server that ends connections itself keeps it (ZooKeeper closes an expired session's connection:
/// [`Rpc::close_connection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Connection {
    pub peer: NodeIx,
    socket: u32,
}

impl Connection {
    /// The connection `peer`'s calls without a socket of their own share (socket 0): a server's state
    /// machine driven outside the network (tests, conformance) sees every request on it.
    pub fn shared(peer: NodeIx) -> Connection {
        Connection { peer, socket: 0 }
    }

    /// A client's connection on its socket number `socket` (tests of state machines).
    #[cfg(test)]
    pub(crate) fn on(peer: NodeIx, socket: u32) -> Connection {
        Connection { peer, socket }
    }
}

#[cfg(test)]
mod tests;
