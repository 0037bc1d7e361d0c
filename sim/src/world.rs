//! The world: one deterministic run's nodes, their clocks, and the faults injected into them.
//!
//! Each node is a madsim node with its own address and a *program* — an async function of its
//! [`NodeEnv`] — that madsim runs when the node is built and again on every restart, so a restarted node
//! starts from its program with whatever state its program chooses to keep. Faults are applied by the
//! supervisor (the future passed to `block_on`), which is never paused or killed itself.

use crate::clock::{Clock, TimeCache};
use crate::fault::{Action, Fault, Target};
use crate::history::{Armed, EventKind, NodeIx, Recorder, WORKER_MARK};
use crate::net::{Net, Rpc};
use crate::rng::{stream, ChaCha8Rng, Rng, Stream};
use madsim::runtime::Handle;
use madsim::task::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a node program is given each time it starts.
#[derive(Clone)]
pub struct NodeEnv {
    pub me: NodeIx,
    pub clock: Clock,
    pub net: Net,
    pub recorder: Recorder,
    /// The run's seed, for the node's own random streams.
    pub seed: u64,
    /// 0 on the first start, then one more on each restart.
    pub incarnation: u32,
}

/// A server host's uptime at the run's start is drawn below this (see [`World::add_server`]): a multiple
/// of every tick interval a server uses, so each phase is equally likely.
const UPTIME_MAX_MS: u64 = 1_000_000;

/// The [`Stream::TickPhase`] generator of `node`'s life `life` (life 0 also draws the host's uptime).
fn tick_index(node: NodeIx, life: u32) -> u64 {
    (u64::from(node.0) << 32) | u64::from(life)
}

impl NodeEnv {
    /// This node life's endpoint on the network (see [`Rpc::bind`]).
    pub fn rpc(&self) -> Rpc {
        Rpc::bind(&self.net, &self.clock, self.me, self.incarnation)
    }

    /// When this life's periodic timer of period `every` first fires, after the program starts: drawn
    /// from the seed ([`Stream::TickPhase`], per node and life), uniform over the whole milliseconds of `[0, every)`. A timer a
    /// server starts with its process — etcd's lessor loop (`lessor.runLoop`: revoke, then
    /// `time.After(500ms)`, 3.5) — has the phase of the process's start, which no two real runs share.
    pub fn timer_start(&self, every: Duration) -> Duration {
        let mut rng = stream(self.seed, Stream::TickPhase, tick_index(self.me, self.incarnation));
        if self.incarnation == 0 {
            rng.gen_range(0..UPTIME_MAX_MS); // life 0's first draw is the host's uptime
        }
        Duration::from_millis(rng.gen_range(0..(every.as_millis() as u64).max(1)))
    }
}

/// A node's program, run on start and on every restart.
pub type Program = Arc<dyn Fn(NodeEnv) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// Promote the replica of a failed master: returns the promoted node, or why there is none.
pub type FailoverFn = Box<dyn FnMut(NodeIx) -> Result<NodeIx, String>>;

/// A fault that only a replicated family's members can give meaning to, as it starts or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberFault {
    /// Stall (`true`) or release (`false`) the member's consensus loop (`stall`).
    Stall(bool),
    /// Apply the leader's commits this late from now on (`lag`; `None`: at once, as it ends).
    Lag(Option<Duration>),
}

/// Give the member on a node a [`MemberFault`]; `Err`: why the node cannot take it.
pub type MemberFaultFn = Box<dyn FnMut(NodeIx, MemberFault) -> Result<(), String>>;

/// The node a role of the family's names now (see [`crate::fault::Topology::roles`]), given who holds
/// the lock: `None` if the name is no role, else the node or why no node has the role now (an
/// ensemble's `leader` during an election).
pub type RolesFn = Box<dyn Fn(&str, &[NodeIx]) -> Option<Result<NodeIx, String>>>;

struct WorldNode {
    name: String,
    id: NodeId,
    clock: Clock,
    /// The life the node's program runs (or will run next): 0, then one more on each restart.
    incarnation: Arc<AtomicU32>,
}

pub struct World {
    handle: Handle,
    seed: u64,
    net: Net,
    recorder: Recorder,
    nodes: Vec<WorldNode>,
    /// The names of the workers beyond each client's first (`[workload] workers`): history nodes after
    /// the world's, with no program of their own (they run inside their client's).
    workers: Vec<String>,
    /// Overlapping pauses of one node: it resumes when the last one ends.
    pauses: BTreeMap<NodeIx, u32>,
    /// Nodes crashed by a fault that has not restarted them yet.
    down: BTreeSet<NodeIx>,
    failover: Option<FailoverFn>,
    member_faults: Option<MemberFaultFn>,
    roles: Option<RolesFn>,
    /// The peers each cut in force was made from.
    cut_off: BTreeMap<u32, Vec<NodeIx>>,
    /// Choices made while the run goes on (which of several holders a fault hits).
    rng: ChaCha8Rng,
    /// Time readings go straight to this runtime's clock while the world lives.
    _time: TimeCache,
}

/// Why the supervisor woke.
enum Wake {
    /// The run used up its event budget and must stop (see [`crate::history::EVENT_BUDGET`]).
    OverBudget,
    /// A trigger of an aimed fault fired.
    Fired,
    /// The next step (or the end of the run) is due.
    Due,
}

impl World {
    /// A world for the current madsim runtime (call inside `block_on`).
    pub fn new(seed: u64) -> World {
        World {
            _time: TimeCache::install(),
            handle: Handle::current(),
            seed,
            net: Net::new(seed),
            recorder: Recorder::default(),
            nodes: Vec::new(),
            workers: Vec::new(),
            pauses: BTreeMap::new(),
            down: BTreeSet::new(),
            failover: None,
            member_faults: None,
            roles: None,
            cut_off: BTreeMap::new(),
            rng: stream(seed, Stream::Nemesis, 2),
        }
    }

    pub fn net(&self) -> &Net {
        &self.net
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// The history's nodes: the world's, then the workers.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).chain(self.workers.iter().cloned()).collect()
    }

    /// Give the client node `host` `count` more workers, named `<host>/w1`, `<host>/w2`, …: history
    /// nodes of their own, whose faults are `host`'s. Added after every node, before the run.
    pub fn add_workers(&mut self, host: NodeIx, count: u32) {
        for w in 1..=count {
            let worker = NodeIx((self.nodes.len() + self.workers.len()) as u32);
            self.workers.push(format!("{}{WORKER_MARK}{w}", self.nodes[host.0 as usize].name));
            self.recorder.add_worker(worker, host);
        }
    }

    pub fn index(&self, name: &str) -> Option<NodeIx> {
        self.nodes.iter().position(|n| n.name == name).map(|i| NodeIx(i as u32))
    }

    /// The index the next added node will get (for programs that must know their peers up front).
    pub fn next_index(&self) -> NodeIx {
        NodeIx(self.nodes.len() as u32)
    }

    pub fn set_failover(&mut self, f: FailoverFn) {
        self.failover = Some(f);
    }

    /// How a member of this world's cluster takes the faults only members can (`stall`, `lag`).
    pub fn set_member_faults(&mut self, f: MemberFaultFn) {
        self.member_faults = Some(f);
    }

    pub fn set_roles(&mut self, f: RolesFn) {
        self.roles = Some(f);
    }

    /// The node `name` names now: a node's name, or a role's.
    fn named(&self, name: &str) -> Result<NodeIx, String> {
        if let Some(node) = self.index(name) {
            return Ok(node);
        }
        let role = self.roles.as_ref().and_then(|roles| roles(name, &self.recorder.holders()));
        role.expect("targets and peers are validated against the topology")
    }

    /// Add a node running `program`; it starts at once.
    pub fn add_node(&mut self, name: &str, program: Program) -> NodeIx {
        self.add_host(name, program, Clock::default())
    }

    /// Add a server node running `program`, on a host booted a while before the run: its monotonic
    /// clock starts at an uptime drawn from the seed ([`Stream::TickPhase`], per node), uniform over
    /// 1,000 s. Real servers do not tick in step: ZooKeeper's session tracker expires sessions on the
    /// multiples of `tickTime` of `System.nanoTime` (`ExpiryQueue.roundToNextInterval`, 3.8), which
    /// counts from the host's boot, so the phase of its ticks is the host's uptime modulo the tick.
    pub fn add_server(&mut self, name: &str, program: Program) -> NodeIx {
        let me = self.next_index();
        let uptime_ms = stream(self.seed, Stream::TickPhase, tick_index(me, 0)).gen_range(0..UPTIME_MAX_MS);
        self.add_host(name, program, Clock::booted_ago(Duration::from_millis(uptime_ms)))
    }

    fn add_host(&mut self, name: &str, program: Program, clock: Clock) -> NodeIx {
        assert!(self.workers.is_empty(), "workers are added after every node");
        let me = self.next_index();
        let env = NodeEnv {
            me,
            clock: clock.clone(),
            net: self.net.clone(),
            recorder: self.recorder.clone(),
            seed: self.seed,
            incarnation: 0,
        };
        let incarnation = Arc::new(AtomicU32::new(0));
        let life = incarnation.clone();
        // The host is up before its program first runs (madsim starts programs in a random order).
        self.net.bind_host(me, 0);
        let node = self
            .handle
            .create_node()
            .name(name)
            .init(move || program(NodeEnv { incarnation: life.load(Ordering::Relaxed), ..env.clone() }))
            .build();
        self.nodes.push(WorldNode { name: name.to_string(), id: node.id(), clock, incarnation });
        me
    }

    /// Apply `schedule` while the nodes run, then stop every node at `run_for`.
    ///
    /// A time-ordered queue of steps: each timed fault's start and end. An aimed fault (`on`) has no
    /// start step: its trigger is armed in the recorder, and when the recorder sees the event it wakes
    /// this loop at the same simulated instant, which starts the fault and queues its end. A schedule
    /// without triggers waits on nothing more than before, so its run is unchanged.
    pub async fn run(&mut self, schedule: &[Fault], run_for: Duration) {
        // (time, is an end, schedule index): at equal times a start before an end, then schedule order.
        let mut steps: BTreeSet<(Duration, bool, usize)> = BTreeSet::new();
        for (i, f) in schedule.iter().enumerate().filter(|(_, f)| f.on.is_none()) {
            steps.insert((f.at, false, i));
            if let Some(d) = f.action.duration() {
                steps.insert((f.at + d, true, i));
            }
        }
        let aimed = self.arm(schedule);
        let mut hit: BTreeMap<usize, NodeIx> = BTreeMap::new();
        // Aimed faults whose trigger fired, waiting out their `after`: the trigger's node.
        let mut waiting: BTreeMap<usize, NodeIx> = BTreeMap::new();
        loop {
            let next = steps.first().copied().filter(|(at, _, _)| *at < run_for);
            match self.wait(next.map_or(run_for, |(at, _, _)| at), aimed).await {
                Wake::OverBudget => break,
                Wake::Fired => {
                    for fired in self.recorder.take_fired() {
                        let i = fired.id as usize;
                        match schedule[i].on.as_ref().map_or(Duration::ZERO, |on| on.after) {
                            after if after.is_zero() => self.start_aimed(i, schedule, fired.node, &mut hit, &mut steps),
                            after => {
                                waiting.insert(i, fired.node);
                                steps.insert((now() + after, false, i));
                            }
                        }
                    }
                }
                Wake::Due => {
                    let Some(step) = next else {
                        break;
                    };
                    steps.remove(&step);
                    let (_, end, i) = step;
                    if let (false, Some(trigger)) = (end, waiting.remove(&i)) {
                        self.start_aimed(i, schedule, trigger, &mut hit, &mut steps);
                    } else if !end {
                        if let Some(node) = self.start(i as u32, &schedule[i], None) {
                            hit.insert(i, node);
                        }
                    } else if let Some(node) = hit.remove(&i) {
                        self.end(i as u32, &schedule[i], node);
                    }
                }
            }
        }
        if aimed && self.recorder.over_budget_at().is_none() {
            self.skip_unfired(schedule, waiting.keys());
        }
        self.shutdown();
    }

    /// Start aimed fault `i`, whose trigger `trigger` fired (`after` ago), and queue its end.
    fn start_aimed(
        &mut self,
        i: usize,
        schedule: &[Fault],
        trigger: NodeIx,
        hit: &mut BTreeMap<usize, NodeIx>,
        steps: &mut BTreeSet<(Duration, bool, usize)>,
    ) {
        let fault = &schedule[i];
        if let Some(node) = self.start(i as u32, fault, Some(trigger)) {
            hit.insert(i, node);
            if let Some(d) = fault.action.duration() {
                steps.insert((now() + d, true, i));
            }
        }
    }

    /// Arm the triggers of the schedule's aimed faults; whether it has any.
    fn arm(&self, schedule: &[Fault]) -> bool {
        let armed: Vec<Armed> = schedule
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let on = f.on.as_ref()?;
                Some(Armed {
                    id: i as u32,
                    from_ns: f.at.as_nanos() as u64,
                    event: on.event,
                    node: on.client.as_ref().map(|c| self.index(c).expect("trigger clients are validated")),
                    left: on.nth,
                })
            })
            .collect();
        let aimed = !armed.is_empty();
        if aimed {
            self.recorder.arm(armed);
        }
        aimed
    }

    /// A trigger that never fired is a fault that never took effect: say so in the history; so is
    /// one whose `after` (`waiting`, by schedule index) outlasted the run.
    fn skip_unfired<'a>(&self, schedule: &[Fault], waiting: impl Iterator<Item = &'a usize>) {
        let late = self.recorder.take_fired().into_iter().map(|f| (f.id, false));
        let late = late.chain(waiting.map(|i| (*i as u32, false)));
        let never = self.recorder.disarm().into_iter().map(|a| (a.id, true));
        for (id, never) in late.chain(never) {
            let fault = &schedule[id as usize];
            let on = fault.on.as_ref().expect("armed faults have a trigger");
            let reason = match never {
                false => format!("{on} came as the run ended"),
                true if fault.at.is_zero() => format!("{on} never happened"),
                true => format!("{on} never happened after {}", crate::fault::fmt_duration(fault.at)),
            };
            let kind = fault.action.kind();
            self.recorder.record(NodeIx(0), EventKind::FaultSkipped { id, fault: kind, reason });
        }
    }

    /// Sleep until `at`, unless the run uses up its event budget first, or (`aimed`) a trigger fires.
    /// Waiting on the budget adds no timer, so runs within it are scheduled exactly as without the check;
    /// nor does waiting on triggers, which only a schedule with aimed faults does.
    async fn wait(&self, at: Duration, aimed: bool) -> Wake {
        if self.recorder.over_budget_at().is_some() {
            return Wake::OverBudget;
        }
        tokio::select! {
            biased;
            _ = self.recorder.exhausted() => Wake::OverBudget,
            _ = self.recorder.fired(), if aimed => Wake::Fired,
            _ = sleep_until(at) => Wake::Due,
        }
    }

    /// Kill every node, so that no task outlives the run (madsim issue #242).
    pub fn shutdown(&self) {
        for n in &self.nodes {
            self.handle.kill(n.id);
        }
    }

    /// The node a target means now; `holder` and `waiter` pick among several from the nemesis stream;
    /// `trigger` is the node whose event fired the fault.
    fn resolve(&mut self, target: &Target, trigger: Option<NodeIx>) -> Result<NodeIx, String> {
        let (candidates, nobody) = match target {
            Target::Trigger => return Ok(trigger.expect("target = \"trigger\" is validated to come with `on`")),
            Target::Node(name) => return self.named(name),
            Target::RandomClient => unreachable!("random-client targets are resolved before the run"),
            Target::Holder => (self.recorder.holders(), "nobody held the lock"),
            Target::Waiter => (self.recorder.waiters(), "nobody was waiting for the lock"),
        };
        match candidates.len() {
            0 => Err(nobody.to_string()),
            n => Ok(candidates[self.rng.gen_range(0..n)]),
        }
    }

    fn start(&mut self, id: u32, fault: &Fault, trigger: Option<NodeIx>) -> Option<NodeIx> {
        let kind = fault.action.kind();
        let node = match self.resolve(&fault.target, trigger) {
            Ok(node) => node,
            Err(reason) => {
                self.recorder.record(NodeIx(0), EventKind::FaultSkipped { id, fault: kind, reason });
                return None;
            }
        };
        let target = self.nodes[node.0 as usize].name.clone();
        if matches!(fault.action, Action::Crash { .. }) && self.down.contains(&node) {
            // Its own crash fault brings it back; a second one would restart it early.
            let reason = format!("{target} is already down");
            self.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
            return None;
        }
        let mut detail = fault.action.detail();
        match &fault.action {
            Action::Pause { .. } => self.pause(node),
            Action::Crash { host, .. } => {
                self.crash(node, *host);
                self.down.insert(node);
            }
            Action::Restart => {
                self.down.remove(&node);
                self.restart(node);
            }
            Action::Partition { peers, .. } | Action::Clog { peers, .. } => {
                let peers = match self.peers(node, peers) {
                    Ok(peers) => peers,
                    Err(reason) => {
                        self.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
                        return None;
                    }
                };
                let both_ways = matches!(fault.action, Action::Partition { .. });
                for peer in &peers {
                    self.cut(node, *peer, true);
                    if both_ways {
                        self.cut(*peer, node, true);
                    }
                }
                // A role's node may change while the cut lasts: its end heals what its start cut.
                self.cut_off.insert(id, peers);
            }
            Action::Delay { latency, .. } => self.net.set_delay(node, Some(*latency)),
            Action::Loss { rate, duration } => self.net.set_loss(node, Some(*rate), *duration),
            Action::DropReply { rate, .. } => self.net.set_drop_reply(node, Some(*rate)),
            Action::ClockJump { delta_ms } => {
                self.nodes[node.0 as usize].clock.jump(*delta_ms);
                self.mark_clock_jump(node);
            }
            Action::ClockDrift { rate, .. } => self.nodes[node.0 as usize].clock.set_rate(*rate),
            Action::Stall { .. } | Action::Lag { .. } => {
                let what = match fault.action {
                    Action::Lag { latency, .. } => MemberFault::Lag(Some(latency)),
                    _ => MemberFault::Stall(true),
                };
                let target = &self.nodes[node.0 as usize].name;
                let no = || Err(format!("{target} is no member of a replicated cluster"));
                if let Err(reason) = self.member_faults.as_mut().map_or_else(no, |f| f(node, what)) {
                    self.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
                    return None;
                }
            }
            Action::Failover => {
                let promoted = self.failover.as_mut().map_or(Err("no replica to promote".to_string()), |f| f(node));
                match promoted {
                    Ok(replica) => {
                        // Sentinel fails over a master it cannot reach: its host is silent.
                        self.crash(node, true);
                        detail = format!("{} promoted", self.nodes[replica.0 as usize].name);
                    }
                    Err(reason) => {
                        self.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
                        return None;
                    }
                }
            }
        }
        self.recorder.record(node, EventKind::FaultStart { id, fault: kind, target, detail });
        Some(node)
    }

    fn end(&mut self, id: u32, fault: &Fault, node: NodeIx) {
        match &fault.action {
            Action::Pause { .. } => self.resume(node),
            Action::Crash { .. } => {
                // Unless a `restart` fault brought it back already.
                if self.down.remove(&node) {
                    self.restart(node);
                }
            }
            Action::Partition { .. } | Action::Clog { .. } => {
                let both_ways = matches!(fault.action, Action::Partition { .. });
                for peer in self.cut_off.remove(&id).unwrap_or_default() {
                    self.cut(node, peer, false);
                    if both_ways {
                        self.cut(peer, node, false);
                    }
                }
            }
            Action::Delay { .. } => self.net.set_delay(node, None),
            Action::Loss { .. } => self.net.set_loss(node, None, None),
            Action::DropReply { .. } => self.net.set_drop_reply(node, None),
            Action::ClockDrift { .. } => self.nodes[node.0 as usize].clock.set_rate(1.0),
            Action::Stall { .. } | Action::Lag { .. } => {
                let what = match fault.action {
                    Action::Lag { .. } => MemberFault::Lag(None),
                    _ => MemberFault::Stall(false),
                };
                if let Some(member_faults) = self.member_faults.as_mut() {
                    let _ = member_faults(node, what);
                }
            }
            Action::Restart | Action::ClockJump { .. } | Action::Failover => return,
        }
        self.recorder.record(node, EventKind::FaultEnd { id });
    }

    fn peers(&self, node: NodeIx, named: &[String]) -> Result<Vec<NodeIx>, String> {
        if named.is_empty() {
            return Ok((0..self.nodes.len() as u32).map(NodeIx).filter(|n| *n != node).collect());
        }
        let peers: Vec<NodeIx> = named.iter().map(|n| self.named(n)).collect::<Result<_, _>>()?;
        match peers.iter().all(|p| *p == node) {
            true => Err(format!("{} is every peer named", self.nodes[node.0 as usize].name)),
            false => Ok(peers),
        }
    }

    fn pause(&mut self, node: NodeIx) {
        let depth = self.pauses.entry(node).or_default();
        *depth += 1;
        if *depth == 1 {
            self.handle.pause(self.nodes[node.0 as usize].id);
        }
    }

    fn resume(&mut self, node: NodeIx) {
        let Some(depth) = self.pauses.get_mut(&node) else {
            return;
        };
        *depth -= 1;
        if *depth == 0 {
            self.pauses.remove(&node);
            self.handle.resume(self.nodes[node.0 as usize].id);
            self.recorder.resumed(node); // hazard: stale-holder-resumed
        }
    }

    /// Hazard `clock-jump-during-hold`: the jumped node holds the lock, or is not a client while some
    /// client holds it (a server's clock, or the resource's).
    fn mark_clock_jump(&self, node: NodeIx) {
        let holders = self.recorder.holders();
        let client = self.nodes[node.0 as usize].name.starts_with("client-");
        if holders.contains(&node) || (!client && !holders.is_empty()) {
            self.recorder.mark(crate::hazard::Hazard::ClockJumpDuringHold);
        }
    }

    /// Kill the node: its process (`host` false: its kernel closes its connections, peers see them
    /// closed; see [`Net::kill_process`]) or its whole host (silence).
    fn crash(&mut self, node: NodeIx, host: bool) {
        if self.recorder.holders().contains(&node) {
            self.recorder.mark(crate::hazard::Hazard::HolderCrashed);
        }
        // Before its tasks are dropped: what its dying code would say is not said, and a dead host's
        // endpoint is gone.
        match host {
            true => self.net.unbind(node),
            false => self.net.kill_process(node),
        }
        self.handle.kill(self.nodes[node.0 as usize].id);
        self.pauses.remove(&node);
        self.recorder.forget(node);
    }

    /// Start the node's program afresh (after killing it, if it still runs).
    fn restart(&mut self, node: NodeIx) {
        // A process crash left its host up; the new life comes with a new endpoint either way.
        self.crash(node, true);
        let n = &self.nodes[node.0 as usize];
        let life = n.incarnation.fetch_add(1, Ordering::Relaxed) + 1;
        self.net.bind_host(node, life);
        self.handle.restart(n.id);
    }

    fn cut(&mut self, from: NodeIx, to: NodeIx, on: bool) {
        self.net.cut(from, to, on);
    }
}

fn now() -> Duration {
    Duration::from_nanos(crate::clock::sim_now_ns())
}

async fn sleep_until(at: Duration) {
    let now = Duration::from_nanos(crate::clock::sim_now_ns());
    if at > now {
        crate::clock::sleep(at - now).await;
    }
}
