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
/// Linux `TCP_TIMEOUT_INIT`: the retransmission timeout of a SYN (RFC 6298's initial 1 s).
const TCP_TIMEOUT_INIT_NS: u64 = 1_000_000_000;
/// Linux `net.ipv4.tcp_syn_retries` (default 6): SYN retransmissions before `connect` fails — at 1,
/// 3, 7, 15, 31 and 63 s, given up at 127 s (`tcp_write_timeout`, `net/ipv4/tcp_timer.c`).
const TCP_SYN_RETRIES: u32 = 6;
/// Linux `tcp_orphan_retries()` (`net/ipv4/tcp_timer.c`): the retransmissions of a socket no process
/// holds any more (its process was killed). `net.ipv4.tcp_orphan_retries` defaults to 0, which means
/// 8 for a connection whose timeout has not reached `TCP_RTO_MAX` ("8 corresponds to >100 seconds
/// with minimal RTO of 200msec"): after the loss probe at 0.2 s, the 8th goes at 51.2 s and the kernel gives up at 102.4 s.
const TCP_ORPHAN_RETRIES: u32 = 8;

/// When data first sent at `first_ns` and unacknowledged since gets through a link healed at
/// `heal_ns`: the first retransmission at or after the heal, or `None` if the kernel gave the
/// connection up before then. Real mode's proxies hold bytes across a partition by the same rule.
pub fn retransmission_after(first_ns: u64, heal_ns: u64) -> Option<u64> {
    retransmission_within(first_ns, heal_ns, TCP_RETRIES2)
}

/// [`retransmission_after`] for a connection that gives up after `retries` retransmissions by its
/// timer (the loss probe before them is not counted: `tcp_retransmit_timer` counts `icsk_retransmits`).
fn retransmission_within(first_ns: u64, heal_ns: u64, retries: u32) -> Option<u64> {
    retransmissions(first_ns).take(retries as usize + 1).find(|at| *at >= heal_ns)
}

/// When a SYN first sent at `first_ns` gets through a link healed at `heal_ns`: the first SYN
/// retransmission at or after the heal (Linux `tcp_retransmit_timer` on a `SYN_SENT` socket, from
/// `TCP_TIMEOUT_INIT`, no loss probe: 1, 3, 7, 15 s …), or `None` once `connect` has failed
/// (`tcp_syn_retries`).
pub fn syn_retransmission_after(first_ns: u64, heal_ns: u64) -> Option<u64> {
    doubling(first_ns + TCP_TIMEOUT_INIT_NS, 2 * TCP_TIMEOUT_INIT_NS)
        .take(TCP_SYN_RETRIES as usize)
        .find(|at| *at >= heal_ns)
}

/// When Linux sends data first sent at `first_ns` again while it goes unacknowledged. First a tail
/// loss probe (`tcp_schedule_loss_probe`, `net/ipv4/tcp_output.c`: 2·srtt + `TCP_RTO_MIN` after a
/// lone segment in flight, a round trip being negligible beside it); `tcp_send_loss_probe` then arms
/// the retransmission timer for the RTO (`TCP_RTO_MIN` on a millisecond round trip), and
/// `tcp_retransmit_timer` doubles it after each retransmission up to `TCP_RTO_MAX`. So: 0.2, 0.4, 0.8,
/// 1.6, 3.2 s … after the first send. Checked on a real kernel by `locksim conform zk-client` and
/// `etcd-client` (a lone segment dropped at the receiver until a heal at 0.5 s arrives at 0.83 s; one
/// healed at 1.2 s, at 1.67 s).
fn retransmissions(first_ns: u64) -> impl Iterator<Item = u64> {
    doubling(first_ns + TCP_RTO_MIN_NS, TCP_RTO_MIN_NS)
}

/// `at`, then `gap` later, the gap doubling each time up to `TCP_RTO_MAX`.
fn doubling(at: u64, gap: u64) -> impl Iterator<Item = u64> {
    let mut gap = gap;
    std::iter::successors(Some(at), move |at| {
        let next = at + gap;
        gap = (gap * 2).min(TCP_RTO_MAX_NS);
        Some(next)
    })
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
    /// The next request that has arrived by `now_ns`, skipping those that came on a socket its client
    /// closed once a newer socket of that client was read: a client opens a new connection after
    /// giving the old one up, and a server that has read from the new one has closed the old —
    /// ZooKeeper's `processConnectRequest` closes the session's other connection (`closeSession(
    /// sessionId, CLIENT_RECONNECT)`) as it re-attaches, and what arrives on it afterwards is reset
    /// unread (its RST finds the client's socket closed: nobody hears of it).
    fn take_request(&mut self, now_ns: u64, closed: &std::collections::BTreeSet<(NodeIx, u32)>) -> Option<Request> {
        while self.requests.peek().is_some_and(|q| q.at.0 <= now_ns) {
            let request = self.requests.pop().expect("just seen").request;
            let (from, socket) = (request.0.from, request.0.socket);
            let newest = self.newest.entry(from).or_default();
            if socket >= *newest || !closed.contains(&(from, socket)) {
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
    /// The sender's kernel closed its connections: life `life` of its process died.
    Closed {
        life: u32,
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
                Some(conn) if s.holds(&conn) => s.hold(conn, Message::Closed { life }, now),
                // A cut link to a host that is down: nothing to close.
                None if s.cuts.contains_key(&(node, peer)) => {}
                _ => s.deliver(node, peer, socket, Message::Closed { life }, now),
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
        self.sockets.connecting.remove(&(conn.from, conn.to, conn.socket));
        for msg in held.messages {
            self.deliver(conn.from, conn.to, conn.socket, msg, retransmit_ns);
        }
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
            Message::Closed { life } => {
                inbox.closed.push((arrive_ns, from, life));
                wake_at(arrive_ns, &inbox.reader);
                // Calls still waiting on the dead process end with the reset of their connection.
                let mut reset = false;
                for (_, w) in inbox.waiting.iter_mut().filter(|(_, w)| w.peer == from) {
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

/// Where the answer to a received request goes (see [`Rpc::reply`]): back on the socket it came on.
pub struct ReplyTo {
    pub from: NodeIx,
    reply_tag: u64,
    socket: u32,
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
        let socket = s.sockets.current(self.me, peer);
        let conn = Conn { from: self.me, to: peer, from_life: self.incarnation, to_life: incarnation, socket };
        if let Some(held) = s.held.get(&conn) {
            let gave_up = held.through_after(sim_now_ns()).is_none();
            return Probe::Retransmitting { gave_up };
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

    /// Open a new connection to `to` (`socket`, `connect`), for [`Rpc::call_on`]: its first data
    /// waits for its handshake — sent into a cut, it goes at the first SYN retransmission after the
    /// heal (1, 3, 7, 15, 31, 63 s after the SYN; given up at 127 s: `tcp_syn_retries`), not on data's
    /// 200 ms schedule — and nothing another socket holds delays it.
    pub fn open(&self, to: NodeIx) -> Socket {
        self.net.state().open(self.me, to)
    }

    /// Close `socket`, opened to `to`, as Linux's `tcp_close` does: unacknowledged data stays in the
    /// kernel, an orphan retransmitting `TCP_ORPHAN_RETRIES` times, and may still reach the peer after
    /// a heal; a socket whose handshake never got through (`SYN_SENT`) is gone, and its data with it —
    /// an abandoned connect is never delivered.
    pub fn close(&self, to: NodeIx, socket: Socket) {
        self.net.state().close(self.me, to, socket);
    }

    /// Send `req` to `to` and wait for its reply, at most `timeout` by this node's clock.
    pub async fn call<Q, R>(&self, to: NodeIx, req: Q, timeout: Duration) -> Result<R, CallError>
    where
        Q: Any + Send,
        R: Any + Send,
    {
        self.call_on(to, None, None, req, timeout).await.map(|(reply, _)| reply)
    }

    /// [`Rpc::call`] on a connection: `socket` is the one the caller opened ([`Rpc::open`]; `None`: the
    /// pair's shared connection), `conn` the life of `to` that the connection was opened with (`None`:
    /// open one now). The reply comes with the life that answered, which the caller keeps
    /// as its connection. A request on a connection to an earlier life is refused with
    /// [`CallError::Reset`] — a restarted host resets connections it does not know — and is not
    /// applied: that is how a client library learns that its server restarted, and reconnects.
    pub async fn call_on<Q, R>(
        &self,
        to: NodeIx,
        socket: Option<Socket>,
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
            let socket = socket.map_or_else(|| s.sockets.current(self.me, to), |Socket(s)| s);
            s.send(self.me, to, socket, Message::Request { reply_tag: tag, body: Box::new(req), conn }, now);
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
            Some((life, Ok(body))) => Ok((*body.downcast::<R>().expect("reply type matches the request type"), life)),
            Some((_, Err(e))) => Err(e),
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
            let s = &mut *s;
            let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
            match inbox.take_request(sim_now_ns(), &s.sockets.closed) {
                Some((reply_to, body)) => Poll::Ready((reply_to, downcast_request(body))),
                None => {
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
            let s = &mut *s;
            let inbox = s.inboxes.get_mut(&self.me).expect("a running node has its inbox");
            let now = sim_now_ns();
            if let Some(i) =
                (0..inbox.closed.len()).filter(|i| inbox.closed[*i].0 <= now).min_by_key(|i| inbox.closed[*i])
            {
                let (_, peer, life) = inbox.closed.remove(i);
                return Poll::Ready(Input::Closed { peer, life });
            }
            match inbox.take_request(now, &s.sockets.closed) {
                Some((reply_to, body)) => Poll::Ready(Input::Request(reply_to, downcast_request(body))),
                None => {
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
            let reply = Message::Reply { tag: to.reply_tag, body: Ok(Box::new(reply)), life: self.incarnation };
            self.net.state().send(self.me, to.from, to.socket, reply, sim_now_ns());
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

    /// [`in_world`] for a test that lets simulated time pass.
    fn in_world_async<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce(Net) -> F + 'static) {
        madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
            let net = Net::new(1);
            net.bind_host(A, 0);
            net.bind_host(B, 0);
            f(net).await;
        });
    }

    async fn sleep_until(at_ns: u64) {
        crate::clock::sleep(Duration::from_nanos(at_ns - sim_now_ns())).await;
    }

    /// `waiter` waits on a call with `tag` to `peer`.
    fn wait_on(net: &Net, waiter: NodeIx, peer: NodeIx, tag: u64) {
        let waiting = Waiting { peer, reply: None, caller: None, deadline_ns: u64::MAX };
        net.state().inboxes.get_mut(&waiter).unwrap().waiting.push((tag, waiting));
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
    fn messages_on_one_link_never_overtake_each_other() {
        in_world(|net| {
            let mut s = net.state();
            let arrivals: Vec<u64> = (0..50).map(|_| s.route(A, B, 0, 0).unwrap()).collect();
            assert!(arrivals.windows(2).all(|w| w[0] <= w[1]));
            assert!(arrivals[0] >= LATENCY_NS.0 && arrivals[0] <= LATENCY_NS.1);
        });
    }

    #[test]
    fn a_loss_probe_then_retransmissions_back_off_from_200ms_and_give_up_after_15() {
        let s = 1_000_000_000;
        // Sent at 0: probed at 0.2 s, retransmitted at 0.4, 0.8, 1.6, 3.2, 6.4 s …
        assert_eq!(retransmission_after(0, 0), Some(200_000_000));
        assert_eq!(retransmission_after(0, 300_000_000), Some(400_000_000));
        assert_eq!(retransmission_after(0, 500_000_000), Some(800_000_000), "a real kernel: 0.83 s");
        assert_eq!(retransmission_after(0, 1_200_000_000), Some(1_600_000_000), "a real kernel: 1.67 s");
        assert_eq!(retransmission_after(0, 5 * s), Some(6_400_000_000));
        // … then every 120 s once the timeout has stopped doubling; the 15th is at 804.8 s.
        assert_eq!(retransmission_after(0, 800 * s), Some(804_800_000_000));
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
            wait_on(net, B, A, 5);
            net.kill_process(A);
            let mut s = net.state();
            let closed = s.inboxes[&B].closed.clone();
            assert_eq!(closed.len(), 1, "B had a connection with A: it sees the close");
            let (at, peer, life) = closed[0];
            assert_eq!((peer, life), (A, 0));
            assert!(at >= s.link_clear_ns[&(A, B, 0)] && at <= LATENCY_NS.1, "one network delay later");
            let reply = s.inboxes.get_mut(&B).unwrap().waiting(5).unwrap().reply.take();
            assert!(matches!(reply, Some((_, 0, Err(CallError::Reset)))), "its call ends with a reset");
            drop(s);
            // The host is up: a new call is refused at once, a probe is reset, the dead process sends nothing.
            wait_on(net, B, A, 6);
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
                .is_some_and(|r| matches!(r.2, Err(CallError::Reset))));
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
            let at = s.route(A, B, 0, 0).unwrap();
            assert!(at >= 1_000_000_000 + LATENCY_NS.0);
        });
    }

    #[test]
    fn a_request_on_a_connection_to_an_earlier_life_is_reset_and_not_applied() {
        in_world(|net| {
            net.unbind(B);
            net.bind_host(B, 1);
            wait_on(net, A, B, 7);
            net.send(A, B, Message::Request { reply_tag: 7, body: Box::new(()), conn: Some(0) });
            assert!(queued(net, B).is_empty(), "not applied");
            let reset = net.state().inboxes.get_mut(&A).unwrap().waiting(7).unwrap().reply.take();
            let (_, life, body) = reset.expect("a reset comes back");
            assert!(matches!(body, Err(CallError::Reset)), "a reset carries no reply");
            assert_eq!(life, 1);
            net.send(A, B, Message::Request { reply_tag: 8, body: Box::new(()), conn: Some(1) });
            assert_eq!(queued(net, B).len(), 1, "a connection to the live host gets through");
        });
    }

    #[test]
    fn a_lost_message_is_retransmitted_not_removed() {
        in_world(|net| {
            // Everything to B is lost for 1 s: TCP sends again at 0.2, 0.4, 0.8 and 1.6 s; the last gets through.
            net.set_loss(B, Some(1.0), Some(Duration::from_secs(1)));
            tell(net, A, B, 3);
            tell(net, A, B, 4);
            let arrived = queued(net, B);
            assert_eq!(arrived.iter().map(|(_, tag)| *tag).collect::<Vec<_>>(), vec![3, 4], "in order");
            assert!(arrived.iter().all(|(at, _)| *at >= 1_600_000_000 && *at <= 1_600_000_000 + LATENCY_NS.1));
        });
    }

    #[test]
    fn a_partly_lost_link_delays_by_whole_retransmission_timeouts() {
        in_world(|net| {
            let mut s = net.state();
            s.loss.insert(B, (0.5, u64::MAX));
            // Sent 10 s apart, so that none waits behind an earlier one.
            let sent = (0..200).map(|i| i * 10_000_000_000);
            let delays: Vec<u64> = sent.map(|at| s.route(A, B, 0, at).expect("nothing is removed") - at).collect();
            let late = delays.iter().filter(|d| **d >= TCP_RTO_MIN_NS).count();
            assert!((60..140).contains(&late), "about half wait for a retransmission: {late}");
            assert!(delays.iter().all(|d| *d <= LATENCY_NS.1 || *d >= TCP_RTO_MIN_NS), "whole timeouts");
        });
    }

    #[test]
    fn a_dropped_reply_breaks_the_connection_after_the_request_was_applied() {
        in_world(|net| {
            net.set_drop_reply(B, Some(1.0));
            wait_on(net, A, B, 5);
            net.send(A, B, Message::Request { reply_tag: 5, body: Box::new(()), conn: None });
            assert_eq!(queued(net, B).len(), 1, "the request goes through");
            net.send(B, A, Message::Reply { tag: 5, body: Ok(Box::new(())), life: 0 });
            let reply = net.state().inboxes.get_mut(&A).unwrap().waiting(5).unwrap().reply.take();
            assert!(matches!(reply, Some((_, 0, Err(CallError::Broken)))), "the caller hears its connection break");
            // A request still goes through, and so does what the server sends on its own.
            tell(net, B, A, 0);
            assert_eq!(queued(net, A).len(), 1);
        });
    }

    #[test]
    fn a_connection_opened_during_a_cut_has_its_own_retransmission_schedule() {
        in_world_async(|net| async move {
            net.cut(A, B, true);
            tell(&net, A, B, 1);
            // B restarts 10 s into the cut; A's next message opens a connection to its new life.
            sleep_until(10_000_000_000).await;
            net.unbind(B);
            net.bind_host(B, 1);
            tell(&net, A, B, 2);
            sleep_until(10_500_000_000).await;
            net.cut(A, B, false);
            // Its own schedule: 10.2, 10.4, 10.8 s — not the old connection's 6.4, 12.8 s.
            let arrived = queued(&net, B);
            assert_eq!(arrived.len(), 1, "the old connection's data is reset");
            assert!(arrived[0].0 >= 10_800_000_000 && arrived[0].0 <= 10_800_000_000 + LATENCY_NS.1, "{arrived:?}");
        });
    }

    #[test]
    fn an_orphaned_socket_gives_up_after_tcp_orphan_retries() {
        for (heal_s, delivered) in [(50, true), (60, false)] {
            in_world_async(move |net| async move {
                net.cut(A, B, true);
                tell(&net, A, B, 1);
                net.kill_process(A);
                // Probed at 0.2 s, retransmitted at 0.4, 0.8, … 51.2 s (the 8th); then given up, not after 15 min.
                sleep_until(heal_s * 1_000_000_000).await;
                net.cut(A, B, false);
                assert_eq!(!queued(&net, B).is_empty(), delivered, "healed at {heal_s} s");
                assert_eq!(!net.state().inboxes[&B].closed.is_empty(), delivered, "the FIN too");
            });
        }
    }

    /// `A`'s endpoint, for calls on sockets of its own.
    fn rpc_a(net: &Net) -> Rpc {
        Rpc { me: A, incarnation: 0, net: net.clone(), clock: Clock::default(), next_tag: Rc::new(Cell::new(1)) }
    }

    /// `from` sends a request with `tag` to `to` on `socket`.
    fn tell_on(net: &Net, from: NodeIx, to: NodeIx, Socket(socket): Socket, tag: u64) {
        let request = Message::Request { reply_tag: tag, body: Box::new(()), conn: None };
        net.state().send(from, to, socket, request, sim_now_ns());
    }

    /// The reply tags of the requests `to`'s server reads now, in order ([`Inbox::take_request`]: data
    /// on a socket the server has closed is not read).
    fn requests_read(net: &Net, to: NodeIx) -> Vec<u64> {
        let s = &mut *net.state();
        let inbox = s.inboxes.get_mut(&to).unwrap();
        let read = std::iter::from_fn(|| inbox.take_request(sim_now_ns(), &s.sockets.closed));
        read.map(|(reply_to, _)| reply_to.reply_tag).collect()
    }

    #[test]
    fn syns_back_off_from_1s_and_give_up_after_tcp_syn_retries() {
        let s = 1_000_000_000;
        // Sent at 0: retransmitted at 1, 3, 7, 15, 31, 63 s; `connect` fails at 127 s.
        let at = |heal_s: u64| syn_retransmission_after(0, heal_s * s).map(|ns| ns / s);
        assert_eq!([at(0), at(2), at(4), at(8), at(16), at(40)], [1, 3, 7, 15, 31, 63].map(Some));
        assert_eq!(at(64), None, "tcp_syn_retries");
    }

    #[test]
    fn a_reconnect_after_a_cut_is_not_delayed_by_the_old_connections_retransmissions() {
        in_world_async(|net| async move {
            let rpc = rpc_a(&net);
            let old = rpc.open(B);
            tell_on(&net, A, B, old, 0);
            net.cut(A, B, true);
            tell_on(&net, A, B, old, 1);
            // The client gives the connection up 2 s into the cut and reconnects after the heal at
            // 7 s: the old socket retransmits at 6.4 and 12.8 s, the new one sends at once.
            sleep_until(2_000_000_000).await;
            rpc.close(B, old);
            sleep_until(7_000_000_000).await;
            net.cut(A, B, false);
            let new = rpc.open(B);
            tell_on(&net, A, B, new, 2);
            let arrived = queued(&net, B);
            let at = |tag| arrived.iter().find(|(_, t)| *t == tag).unwrap().0;
            assert!(at(2) <= 7_000_000_000 + LATENCY_NS.1, "{arrived:?}");
            assert!(at(1) >= 12_800_000_000, "the orphan still retransmits on its own schedule: {arrived:?}");
        });
    }

    #[test]
    fn a_connect_into_a_cut_gets_through_at_the_first_syn_retransmission_after_the_heal() {
        for (heal_ms, through_ms) in [(500, 1000), (2500, 3000), (5000, 7000)] {
            in_world_async(move |net| async move {
                net.cut(A, B, true);
                let socket = rpc_a(&net).open(B);
                tell_on(&net, A, B, socket, 1);
                sleep_until(heal_ms * 1_000_000).await;
                net.cut(A, B, false);
                let arrived = queued(&net, B);
                let through_ns = through_ms * 1_000_000;
                assert!(arrived.len() == 1 && arrived[0].0 >= through_ns, "healed at {heal_ms} ms: {arrived:?}");
                assert!(arrived[0].0 <= through_ns + LATENCY_NS.1, "healed at {heal_ms} ms: {arrived:?}");
            });
        }
    }

    #[test]
    fn an_abandoned_connect_is_never_delivered() {
        in_world_async(|net| async move {
            let rpc = rpc_a(&net);
            net.cut(A, B, true);
            let socket = rpc.open(B);
            tell_on(&net, A, B, socket, 1);
            // The client's connect timeout passes at 2 s: it closes the socket in `SYN_SENT`.
            sleep_until(2_000_000_000).await;
            rpc.close(B, socket);
            net.cut(A, B, false);
            sleep_until(200_000_000_000).await;
            assert!(queued(&net, B).is_empty());
            assert!(net.state().held.is_empty(), "nothing left to retransmit");
        });
    }

    #[test]
    fn a_closed_sockets_data_is_an_orphan_and_not_read_once_the_new_connection_was() {
        in_world_async(|net| async move {
            let rpc = rpc_a(&net);
            let old = rpc.open(B);
            tell_on(&net, A, B, old, 0);
            net.cut(A, B, true);
            tell_on(&net, A, B, old, 1);
            rpc.close(B, old);
            // An orphan: 8 retransmissions after the probe, the last at 51.2 s, given up at 102.4 s rather than after 15 min.
            assert_eq!(net.state().held.values().map(|h| h.retries).collect::<Vec<_>>(), [TCP_ORPHAN_RETRIES]);
            let new = rpc.open(B);
            tell_on(&net, A, B, new, 2);
            sleep_until(5_000_000_000).await;
            net.cut(A, B, false);
            sleep_until(10_000_000_000).await;
            let tags = requests_read(&net, B);
            // The orphan's data goes at 6.4 s, the new socket's SYN (sent at 0) at 7 s: the old
            // request is read, the server not having heard from the new connection yet.
            assert_eq!(tags, [0, 1, 2]);
        });
    }

    #[test]
    fn data_on_a_closed_socket_arriving_after_the_new_connection_is_not_read() {
        in_world_async(|net| async move {
            let rpc = rpc_a(&net);
            let old = rpc.open(B);
            tell_on(&net, A, B, old, 0);
            net.cut(A, B, true);
            sleep_until(1_000_000_000).await;
            tell_on(&net, A, B, old, 1);
            rpc.close(B, old);
            // Healed at 7.5 s: the orphan retransmits at 7.4 and 13.8 s, the new socket's SYN (sent at
            // 7 s) at 8 s.
            sleep_until(7_000_000_000).await;
            let new = rpc.open(B);
            tell_on(&net, A, B, new, 2);
            sleep_until(7_500_000_000).await;
            net.cut(A, B, false);
            sleep_until(20_000_000_000).await;
            let tags = requests_read(&net, B);
            assert_eq!(tags, [0, 2], "the server closed the old connection when it read the new one");
        });
    }
}
