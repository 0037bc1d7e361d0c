//! The shell of one member of a replicated service (a ZooKeeper ensemble's server): a state machine
//! that, unlike a single server's ([`super::Backend`]), talks to its peers, answers a client request
//! only once its peers have done their part (a write committed by a quorum), and keeps timers of its
//! own (elections, pings, the leader's session expiry).
//!
//! As with [`super::serve`], the state machine does no I/O and draws no randomness: [`serve_member`]
//! reads the node's input — clients' requests, peers' messages, closed connections — hands each to the
//! member with the time by the node's clocks, wakes it when its next timer is due, and sends what it
//! asked: replies (by the [`RequestId`] the shell gave the request), messages to peers (on the pair's
//! TCP connection: a cut holds them, a heal delivers them in order), history events, pushes, closes.

use super::{Now, Out};
use crate::clock::Clock;
use crate::history::{NodeIx, Recorder};
use crate::net::{Connection, Input, Payload, ReplyTo, Rpc};
use crate::world::{MemberFault, MemberFaultFn};
use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A client request the member has not answered yet, as the shell numbered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestId(u64);

impl RequestId {
    /// A request id of a test's own (the shell numbers real ones).
    #[cfg(test)]
    pub fn new(n: u64) -> RequestId {
        RequestId(n)
    }
}

/// What a member asks the shell to do: what any server asks ([`Out`]), plus replies to clients' requests
/// and messages to peers.
pub struct MemberOut<R, P> {
    pub out: Out,
    pub replies: Vec<(RequestId, R)>,
    pub peers: Vec<(NodeIx, P)>,
}

impl<R, P> Default for MemberOut<R, P> {
    fn default() -> Self {
        MemberOut { out: Out::default(), replies: Vec::new(), peers: Vec::new() }
    }
}

impl<R, P> MemberOut<R, P> {
    /// Answer request `id`.
    pub fn reply(&mut self, id: RequestId, reply: R) {
        self.replies.push((id, reply));
    }

    /// Send `msg` to the peer on node `to`.
    pub fn tell(&mut self, to: NodeIx, msg: P) {
        self.peers.push((to, msg));
    }
}

/// A member's state machine.
pub trait Member: Send + 'static {
    type Request: Any + Send;
    type Reply: Any + Send;
    /// What members say to each other.
    type Peer: Any + Send;

    /// Its process starts, first or after a crash.
    fn start(&mut self, now: Now, out: &mut MemberOut<Self::Reply, Self::Peer>);

    /// A client's request, which came on connection `via`; answered now or later by `id`.
    fn request(
        &mut self,
        now: Now,
        via: Connection,
        id: RequestId,
        request: Self::Request,
        out: &mut MemberOut<Self::Reply, Self::Peer>,
    );

    /// A message from the peer on node `from`.
    fn peer(&mut self, now: Now, from: NodeIx, msg: Self::Peer, out: &mut MemberOut<Self::Reply, Self::Peer>);

    /// Life `life` of `peer`'s process died and its kernel closed its connections to this member (a
    /// client's, or a peer's).
    fn closed(&mut self, now: Now, peer: NodeIx, life: u32, out: &mut MemberOut<Self::Reply, Self::Peer>);

    /// Its timers: called when the time [`Member::next_wake_ms`] gave has come (monotonic ms).
    fn wake(&mut self, now: Now, out: &mut MemberOut<Self::Reply, Self::Peer>);

    /// When it wants to be woken next, on the node's monotonic clock.
    fn next_wake_ms(&self) -> Option<i64>;

    /// Take a fault only a member can ([`MemberFault`]), or say why this member cannot.
    fn member_fault(&mut self, fault: MemberFault) -> Result<(), String>;

    /// The real server reads each connection on a thread of its own (etcd's gRPC and rafthttp
    /// goroutines), and its timers wake threads of their own too (etcd's read loop, ticker and
    /// lessor): what piled up while its process was paused is taken in each connection's order, the
    /// connections' and the due timers' in whatever order the threads run ([`Member::backlog_order`]).
    /// `false` (the default): in the order it arrived, the timers once the first input is taken.
    const READS_ON_THREADS: bool = false;

    /// With [`Member::READS_ON_THREADS`], the order to take a backlog in: indexes into `sources`,
    /// where each input came from, in the order they arrived (the due timers last).
    fn backlog_order(&mut self, sources: &[Source]) -> Vec<usize> {
        (0..sources.len()).collect()
    }
}

/// Where an input of a backlog comes from: a connection, or the member's own timers that came due
/// while it was paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Connection(Connection),
    Timers,
}

/// One step of a member: an input, or its due timers ([`Member::wake`]).
enum Step {
    Input(Input<Payload>),
    Wake,
}

/// How the members of a cluster, on `nodes`, take the faults only members can
/// ([`crate::world::World::set_member_faults`]).
pub fn member_faults<M: Member>(nodes: Vec<NodeIx>, states: Vec<Arc<Mutex<M>>>) -> MemberFaultFn {
    Box::new(move |node, fault| {
        let i = nodes.iter().position(|m| *m == node).ok_or("only a cluster's member can take it")?;
        states[i].lock().expect("member lock").member_fault(fault)
    })
}

/// Serve `state` on this node until the node dies: the [`Member`] shell.
pub async fn serve_member<M: Member>(state: Arc<Mutex<M>>, rpc: &Rpc, clock: &Clock, recorder: &Recorder) {
    let mut pending: BTreeMap<RequestId, ReplyTo> = BTreeMap::new();
    let mut next_id = 0u64;
    let mut out = MemberOut::<M::Reply, M::Peer>::default();
    state.lock().expect("member lock").start(Now::of(clock), &mut out);
    send(&mut out, &mut pending, rpc, recorder);
    // A backlog taken at once, in the member's order; its due timers are a step of it, if they are.
    let mut backlog: VecDeque<Step> = VecDeque::new();
    loop {
        let wake = state.lock().expect("member lock").next_wake_ms();
        let timers_queued = backlog.iter().any(|step| matches!(step, Step::Wake));
        let step = match wake {
            _ if timers_queued => backlog.pop_front().expect("queued"),
            Some(at) if at <= clock.monotonic_ms() => Step::Wake,
            _ if !backlog.is_empty() => backlog.pop_front().expect("not empty"),
            Some(at) => tokio::select! {
                biased;
                input = rpc.next_input_any() => Step::Input(input),
                () = clock.sleep(Duration::from_millis((at - clock.monotonic_ms()).max(1) as u64)) => Step::Wake,
            },
            None => Step::Input(rpc.next_input_any().await),
        };
        let step = match step {
            Step::Input(first) if M::READS_ON_THREADS && backlog.is_empty() => {
                let due = wake.is_some_and(|at| at <= clock.monotonic_ms());
                backlog = arrived(first, due, rpc, &state);
                backlog.pop_front().expect("the first input")
            }
            step => step,
        };
        let mut s = state.lock().expect("member lock");
        let now = Now::of(clock);
        match step {
            Step::Wake => s.wake(now, &mut out),
            Step::Input(Input::Closed { peer, life, socket: None, .. }) => s.closed(now, peer, life, &mut out),
            // Only servers close connections of their own.
            Step::Input(Input::Closed { socket: Some(_), .. }) => continue,
            Step::Input(Input::Request(reply_to, body)) => match downcast::<M>(body) {
                Ok(request) => {
                    next_id += 1;
                    let id = RequestId(next_id);
                    let via = reply_to.connection();
                    pending.insert(id, reply_to);
                    s.request(now, via, id, request, &mut out);
                }
                Err(msg) => s.peer(now, reply_to.from, msg, &mut out),
            },
        }
        drop(s);
        send(&mut out, &mut pending, rpc, recorder);
    }
}

/// `first` and what else has arrived by now, in the order the member takes them
/// ([`Member::backlog_order`]), with its timers among them when they are `due` (a process resumed
/// from a pause); with a connection's close among them, as they came, the timers after the first.
fn arrived<M: Member>(first: Input<Payload>, due: bool, rpc: &Rpc, state: &Mutex<M>) -> VecDeque<Step> {
    let mut inputs = vec![first];
    while let Some(input) = rpc.arrived_input() {
        inputs.push(input);
    }
    let sources: Option<Vec<Source>> = inputs
        .iter()
        .map(|input| match input {
            Input::Request(reply_to, _) => Some(Source::Connection(reply_to.connection())),
            Input::Closed { .. } => None,
        })
        .chain(due.then_some(Some(Source::Timers)))
        .collect();
    let mut steps: Vec<Option<Step>> = inputs.into_iter().map(|input| Some(Step::Input(input))).collect();
    let Some(sources) = sources.filter(|c| c.len() > 1) else { return steps.into_iter().flatten().collect() };
    if due {
        steps.push(Some(Step::Wake));
    }
    let order = state.lock().expect("member lock").backlog_order(&sources);
    order.into_iter().map(|i| steps[i].take().expect("an order takes each input once")).collect()
}

/// Say what the member asked to be said.
fn send<R: Any + Send, P: Any + Send>(
    out: &mut MemberOut<R, P>,
    pending: &mut BTreeMap<RequestId, ReplyTo>,
    rpc: &Rpc,
    recorder: &Recorder,
) {
    for (id, reply) in out.replies.drain(..) {
        if let Some(reply_to) = pending.remove(&id) {
            rpc.reply(&reply_to, reply);
        }
    }
    for (to, msg) in out.peers.drain(..) {
        rpc.tell(to, msg);
    }
    // A closed connection's requests go unanswered: its client's calls ended with the close.
    for closed in &out.out.closes {
        pending.retain(|_, reply_to| reply_to.connection() != *closed);
    }
    out.out.flush(rpc, recorder);
}

/// A client's request, or else a peer's message.
fn downcast<M: Member>(body: Payload) -> Result<M::Request, M::Peer> {
    match body.downcast::<M::Request>() {
        Ok(request) => Ok(*request),
        Err(body) => Err(*body
            .downcast::<M::Peer>()
            .expect("a member receives only its clients' requests and its peers' messages")),
    }
}

/// Worlds of members for tests: members a test deploys, and one client node that speaks to them.
#[cfg(test)]
pub mod testing {
    use crate::fault::Fault;
    use crate::history::{EventKind, NodeIx};
    use crate::world::{NodeEnv, Program, World};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// What the client writes down.
    pub type Log = Arc<Mutex<Vec<String>>>;
    /// The client's program: its node, the members' nodes, its log.
    pub type Client = fn(NodeEnv, Vec<NodeIx>, Log) -> Pin<Box<dyn Future<Output = ()>>>;
    /// The members' states at the end, what the client logged, and the history's events.
    pub type Ran<S> = (Vec<Arc<Mutex<S>>>, Vec<String>, Vec<(NodeIx, EventKind)>);

    /// Run the members `deploy` adds and a client node (`client-0`, after them) running `client` for
    /// `secs` under `faults`, with `log` as the client's log (a test may write in it first).
    pub fn run<S: 'static>(
        seed: u64,
        secs: u64,
        faults: Vec<Fault>,
        deploy: impl FnOnce(&mut World) -> (Vec<NodeIx>, Vec<Arc<Mutex<S>>>),
        client: Client,
        log: Log,
    ) -> Ran<S> {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        let log2 = log.clone();
        let (states, events) = runtime.block_on(async move {
            let mut world = World::new(seed);
            let (members, states) = deploy(&mut world);
            let program: Program = Arc::new(move |env| client(env, members.clone(), log2.clone()));
            world.add_node("client-0", program);
            world.run(&faults, Duration::from_secs(secs)).await;
            let events = world.recorder().finish(world.names()).events.into_iter().map(|e| (e.node, e.kind));
            (states, events.collect::<Vec<_>>())
        });
        let log = log.lock().expect("log lock").clone();
        (states, log, events)
    }
}
