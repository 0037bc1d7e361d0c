//! Real faults, with the simulator's meaning where a real one has it, recorded as the simulator records
//! them: `FaultStart` with the target and detail, `FaultEnd` when the fault ends, `FaultSkipped` when
//! `holder` or `waiter` finds nobody or the target is down (or already down, for a crash).
//!
//! **Client processes** (signals to the process group each client leads): `pause` is SIGSTOP, then
//! SIGCONT after its duration (a stop-the-world pause: the kernel still holds its sockets); `crash` is
//! SIGKILL, and the client comes back as a new process after `duration` if given (its workload draws
//! from a new stream, as a restarted simulated node does), else stays down.
//!
//! **A server** (`redis-0`, `zk-0`; an ensemble's `zk-1`, or the member a role names when the fault
//! starts: `leader`, asked of the members themselves, and `holder-server`, the member the first holder's
//! connection goes to through its proxies; through [`Server`], whatever its kind): `pause` stops its
//! processes (SIGSTOP; the kernel still accepts connections and data, which wait for SIGCONT);
//! `crash` kills it (SIGKILL: Linux closes its sockets, so the clients' connections end) and, after
//! `duration`, starts it again on the same port — `FaultEnd` once it answers. What survives is what
//! survives a real crash of that server: Redis runs with an append-only file that it `write(2)`s
//! before it replies, so a killed process loses no acknowledged write (the kernel has it; `fsync`
//! matters only when the machine dies) — kept with `[backend] persist = true`, wiped with `false`
//! (the simulator's default: a Redis without persistence restarts empty); ZooKeeper logs every
//! transaction before it answers, and its data directory always survives (sessions too, with fresh
//! timeouts), as every server but Redis keeps its data.
//!
//! **The network** (the clients' links to the server, through each client's loopback proxy,
//! [`super::proxy`]): `partition` cuts a client's link both ways (or every client's, aimed at the
//! server), `clog` one way (the target's outgoing bytes: a client's requests, or the server's
//! replies), holding the bytes until the first TCP retransmission after the heal; `delay` adds
//! latency to every chunk to and from the target; `drop-reply` on the server loses its replies at
//! `rate`, which on TCP breaks the connection: the client is reset after its request was applied.
//! In a cluster the members' links to each other go through proxies too
//! ([`crate::servers::Cluster`]): a `partition` of a member with `peers` naming members (or roles) holds
//! the bytes between them both ways while their clients still reach both (`peers` may name clients
//! too, whose links to the member it cuts), and one with no `peers` cuts the member from its clients
//! and its peers alike.
//!
//! Refused before the run starts ([`refuse_unsupported`]), naming the fault and why:
//! - `loss`: TCP retransmits a lost segment, so loss is delay by whole retransmission timeouts — what
//!   the simulation makes of it — and the proxy does not draw lost segments (`delay` is the nearest);
//! - `clock-jump`, `clock-drift`: every process reads the kernel's one clock;
//! - `restart`: a crash with `duration` restarts the node; `failover`: a real master fails over only as
//!   real Sentinel fails it over (`[backend] sentinels = 3`);
//! - `stall`: SIGSTOP stops a member's client side with its consensus loop; `lag` (and ZooKeeper's
//!   `[backend] apply_lag`): a real server applies as fast as it can;
//! - a `clog` between members: a peer connection, opened by either member, carries both ways' messages;
//! - `host-crash`: a dead host is silent, but a process here runs on this machine's kernel, which
//!   closes its sockets when it dies, and the loopback proxy's kernel would still answer the peer's
//!   keep-alive probes and retransmissions: no signal or proxy makes a host fall silent;
//! - any fault on the `resource`, which is locksim's own (in its process);
//! - a client's `partition` or `clog` from anyone but servers (its only links here: the resource is
//!   locksim's, and clients do not talk to each other), so `peers = ["redis-0"]` is written out; a
//!   server's, from anyone but clients (and, in a ZooKeeper ensemble, members);
//! - `drop-reply` on a client (it sends no replies), and `[faults.random]`;
//! - faults aimed (`on`) at a server's event (`lease-expired`, `leader-change`, `read-index`) or at a
//!   point inside a recipe: locksim sees neither in a real run.
//!
//! **Aimed faults** on the clients' events (`on = "release"`) start when the recorder records the
//! event ([`super::history::Recorder`]): before the request it announces leaves locksim, as in the
//! simulator, or `after` it.

use super::proxy::{Dir, Link, Side};
use super::{Run, Slot};
use crate::servers::Server;
use locksim_scenarios::Scenario;
use locksim_sim::fault::{fmt_duration, Action, Fault, Target, Topology, TriggerEvent};
use locksim_sim::history::{Armed, EventKind, NodeIx};
use locksim_sim::rng::Rng;
use std::sync::MutexGuard;
use std::time::Duration;

/// The servers of a real run, as its faults name them.
pub struct Servers {
    /// Their nodes and roles.
    pub topology: Topology,
    /// Whether a fault can cut one member off from another ([`crate::servers::Launcher::peer_links`]).
    pub peer_cuts: bool,
}

impl Servers {
    /// Whether `name` is a server or a server's role.
    fn names(&self, name: &str) -> bool {
        self.topology.servers.iter().any(|s| s == name) || self.topology.roles.iter().any(|(r, _)| *r == name)
    }
}

/// Refuse, naming the fault, what real mode cannot do to `servers`.
pub fn refuse_unsupported(scenario: &Scenario, servers: &Servers) -> anyhow::Result<()> {
    if scenario.workload.workers > 1 {
        anyhow::bail!(
            "{}: [workload] workers = {} runs in simulation only: a real client process drives one lock (run \
             more clients instead)",
            scenario.path,
            scenario.workload.workers
        );
    }
    if scenario.random.is_some() {
        anyhow::bail!("{}: [faults.random] does not run with --real yet; write the faults out", scenario.path);
    }
    for f in &scenario.schedule {
        // The clients' events are recorded by locksim's own client threads (`super::workload`).
        if let Some(on) = f.on.as_ref().filter(|on| !on.event.is_client()) {
            let what = locksim_scenarios::run::describe(f);
            let clients: Vec<&str> = TriggerEvent::ALL.iter().filter(|e| e.is_client()).map(|e| e.name()).collect();
            anyhow::bail!(
                "{}: fault `{what}`: --real starts aimed faults on the clients' events ({}), which locksim records; \
                 `{}` happens inside a server or a recipe, which locksim does not see in a real run: give the \
                 fault `at` instead",
                scenario.path,
                clients.join(", "),
                on.event.name()
            );
        }
        if let Some(why) = refusal(f, servers) {
            let what = locksim_scenarios::run::describe(f);
            anyhow::bail!("{}: fault `{what}`: --real {why}", scenario.path);
        }
    }
    Ok(())
}

/// Why real mode cannot do `f`, if it cannot.
fn refusal(f: &Fault, servers: &Servers) -> Option<String> {
    let on_server = matches!(&f.target, Target::Node(name) if servers.names(name));
    let server = &servers.topology.servers[0];
    let cluster = servers.topology.servers.len() > 1;
    if f.target == Target::Node("resource".into()) {
        return Some("cannot fault the resource: it is locksim's own, inside its process".into());
    }
    let members = |peers: &[String]| !peers.is_empty() && peers.iter().all(|p| servers.names(p));
    // A server's peers: clients, and members too where their links can be cut (a partition only).
    let cuttable =
        |p: &String, clog: bool| p.starts_with("client-") || (servers.names(p) && servers.peer_cuts && !clog);
    let peers_ok = |peers: &[String], clog: bool| match on_server {
        true if peers.is_empty() => !cluster || (servers.peer_cuts && !clog),
        true => peers.iter().all(|p| cuttable(p, clog)),
        false => members(peers),
    };
    let peers_why = |clog: bool| match on_server {
        true if cluster && !servers.peer_cuts => {
            "cuts a member from clients only: these members reach each other directly (name the clients in peers)"
                .to_string()
        }
        true if cluster && clog => "clogs a member's links to clients only (name them in peers)".to_string(),
        true => format!("cuts {server} from clients only (the resource is locksim's own)"),
        false if cluster => "cuts a client from servers only, its links here (the resource is locksim's own and \
                             clients do not talk to each other): name the servers in peers"
            .to_string(),
        false => format!(
            "cuts a client from the server only, its one link here (the resource is locksim's own and clients do \
             not talk to each other): write peers = [\"{server}\"]"
        ),
    };
    Some(match &f.action {
        Action::Pause { .. } | Action::Crash { host: false, .. } | Action::Delay { .. } => return None,
        Action::Crash { host: true, .. } => "cannot crash a host: a killed process's kernel closes its connections \
                                             (that is `crash`), and the proxy's kernel would answer keep-alive \
                                             probes that a dead host leaves unanswered"
            .into(),
        Action::Partition { peers, .. } if peers_ok(peers, false) => return None,
        Action::Clog { peers, .. } if peers_ok(peers, true) => return None,
        Action::Partition { .. } => peers_why(false),
        Action::Clog { .. } => peers_why(true),
        Action::DropReply { .. } if on_server => return None,
        Action::DropReply { .. } => {
            format!("drops the server's replies: aim drop-reply at {server} (a client sends none)")
        }
        Action::Loss { .. } => "does not draw lost segments: TCP retransmits each (the simulation delays a lost \
                                message by whole retransmission timeouts), and the proxy only adds latency: use delay"
            .into(),
        Action::ClockJump { .. } | Action::ClockDrift { .. } => {
            "cannot move one process's clock (every process reads the kernel's)".into()
        }
        Action::Restart => "restarts a node only as a crash with a duration: give the crash `duration`".into(),
        Action::Failover => {
            "fails a master over only as real Sentinel does ([backend] sentinels = 3): the failover fault runs simulated \
             only"
                .into()
        }
        Action::Stall { .. } => "cannot stall a member's consensus loop alone: a SIGSTOP stops its client side too \
                                 (stall runs simulated only)"
            .into(),
        Action::Lag { .. } => "cannot slow a member's apply alone: a real server applies as fast as it can (lag runs \
                               simulated only)"
            .into(),
    })
}

/// The triggers of the schedule's aimed faults, for [`super::history::Recorder::arm`].
pub fn armed(run: &Run, schedule: &[Fault]) -> Vec<Armed> {
    let armed = schedule.iter().enumerate().filter_map(|(i, f)| {
        let on = f.on.as_ref()?;
        Some(Armed {
            id: i as u32,
            from_ns: f.at.as_nanos() as u64,
            event: on.event,
            node: on.client.as_ref().and_then(|c| run.node(c)),
            left: on.nth,
        })
    });
    armed.collect()
}

/// Apply fault `id` of the run at its time, or when its trigger fires (on its own thread); returns when
/// it has ended. An error (the server would not stop, or start again) is a harness error.
pub fn apply(run: &Run, id: u32, fault: &Fault) -> anyhow::Result<()> {
    let kind = fault.action.kind();
    let skip =
        |node: NodeIx, reason: String| run.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
    // When it starts, and the node whose event fired it (an aimed fault's).
    let (at, trigger) = match &fault.on {
        None if run.sleep_until(fault.at) => (fault.at, None),
        None => return Ok(()),
        Some(on) => {
            let Some((node, t)) = run.recorder.wait_fired(id, || run.over()) else {
                // The simulator's words for a trigger that never fired.
                skip(
                    NodeIx(0),
                    match fault.at.is_zero() {
                        true => format!("{on} never happened"),
                        false => format!("{on} never happened after {}", fmt_duration(fault.at)),
                    },
                );
                return Ok(());
            };
            if !on.after.is_zero() {
                // Nothing holds the event's node meanwhile.
                run.recorder.started(id);
                if !run.sleep_until(t + on.after) {
                    skip(NodeIx(0), format!("{on} came as the run ended"));
                    return Ok(());
                }
            }
            (t + on.after, Some(node))
        }
    };
    let node = match resolve(run, id, &fault.target, trigger) {
        Ok(node) => node,
        Err(reason) => {
            skip(NodeIx(0), reason);
            return Ok(());
        }
    };
    let network = match Network::of(run, id, node, &fault.action) {
        Ok(network) => network,
        Err(reason) => {
            skip(node, reason);
            return Ok(());
        }
    };
    let target = run.nodes[node.0 as usize].clone();
    let start = EventKind::FaultStart { id, fault: kind, target: target.clone(), detail: fault.action.detail() };
    let end = fault.action.duration().map(|d| at + d);
    if let Some(net) = network {
        run.recorder.record(node, start);
        net.set(run, true);
        run.recorder.started(id);
        if end.is_some_and(|at| run.sleep_until(at)) {
            net.set(run, false);
            run.recorder.record(node, EventKind::FaultEnd { id });
        }
        // Else it lasts until the end of the run, whose proxies go with it.
        return Ok(());
    }
    if let Some(member) = run.server_index(node) {
        return server_fault(run, member, id, fault, at, start);
    }
    let slot = &run.slots[run.client_index(node)];
    match fault.action {
        Action::Pause { duration } => {
            let Some(pid) = signal_live(run, slot, node, start, libc::SIGSTOP) else {
                skip(node, format!("{target} is down"));
                return Ok(());
            };
            run.recorder.started(id);
            if !run.sleep_until(at + duration) {
                // The run ended first: the process is killed with the others, as the simulator ends
                // the world with the node still paused.
                return Ok(());
            }
            let s = slot.lock().expect("slot lock");
            if s.pid == Some(pid) {
                send(pid, libc::SIGCONT);
            }
            drop(s);
            run.recorder.record(node, EventKind::FaultEnd { id });
        }
        Action::Crash { restart_after, host: false } => {
            let restart_at = restart_after.map(|d| at + d);
            {
                let mut s = slot.lock().expect("slot lock");
                let Some(pid) = s.pid.filter(|_| s.down.is_none()) else {
                    drop(s);
                    skip(node, format!("{target} is already down"));
                    return Ok(());
                };
                s.down = Some(restart_at);
                run.recorder.record(node, start);
                run.recorder.forget(node);
                // Under the slot's lock: the workload reaps the process only after taking it.
                send(pid, libc::SIGKILL);
            }
            run.recorder.started(id);
            if let Some(at) = restart_at {
                if run.sleep_until(at) {
                    // The workload starts the new process once it sees `down` lifted.
                    slot.lock().expect("slot lock").down = None;
                    run.recorder.record(node, EventKind::FaultEnd { id });
                }
            }
        }
        // Refused before the run (refuse_unsupported).
        _ => skip(node, format!("--real cannot do a {} fault", kind.name())),
    }
    Ok(())
}

/// `pause` or `crash` of server `member` (its node has the same index), through [`Server`], from `at`.
fn server_fault(
    run: &Run,
    member: usize,
    id: u32,
    fault: &Fault,
    at: Duration,
    start: EventKind,
) -> anyhow::Result<()> {
    let kind = fault.action.kind();
    let node = NodeIx(member as u32);
    let name = run.nodes[member].clone();
    let mut server = run.server(member);
    if server.is_down() {
        let already = if matches!(fault.action, Action::Crash { .. }) { "already " } else { "" };
        let reason = format!("{name} is {already}down");
        run.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
        return Ok(());
    }
    run.recorder.record(node, start);
    match fault.action {
        Action::Pause { duration } => {
            server.stop()?;
            drop(server);
            run.recorder.started(id);
            if !run.sleep_until(at + duration) {
                // The run ended first: the server is continued and killed as it stops.
                return Ok(());
            }
            let mut server = run.server(member);
            // A crash meanwhile ended the pause (a killed process is continued first).
            if !server.is_down() {
                server.resume()?;
            }
        }
        Action::Crash { restart_after, host: false } => {
            server.crash()?;
            drop(server);
            run.recorder.started(id);
            let Some(at) = restart_after.map(|d| at + d) else { return Ok(()) };
            if !run.sleep_until(at) {
                return Ok(());
            }
            run.server(member).relaunch(run.served().keep_data)?;
        }
        // Refused before the run (refuse_unsupported).
        _ => anyhow::bail!("--real cannot do a {} fault on {name}", kind.name()),
    }
    run.recorder.record(node, EventKind::FaultEnd { id });
    Ok(())
}

/// A network fault: what it sets on which clients' links, and which members it cuts from each other.
struct Network<'a> {
    links: Vec<&'a Link>,
    /// Pairs of members whose peer links it cuts.
    peer_cuts: Vec<(usize, usize)>,
    action: &'a Action,
    on_server: bool,
}

impl<'a> Network<'a> {
    /// The network fault `action` aimed at `node`, `None` for a fault of processes, or why it is skipped
    /// (a role that names nobody, or the target itself, now).
    fn of(run: &'a Run, id: u32, node: NodeIx, action: &'a Action) -> Result<Option<Network<'a>>, String> {
        let served = run.served();
        let server = run.server_index(node);
        let client = |c: NodeIx| run.client_index(c);
        let mut peer_cuts = Vec::new();
        let links: Vec<&Link> = match (action, server) {
            (Action::Partition { peers, .. } | Action::Clog { peers, .. }, Some(m)) if peers.is_empty() => {
                if matches!(action, Action::Partition { .. }) && served.cluster.can_cut() {
                    peer_cuts.extend((0..served.cluster.size()).filter(|k| *k != m).map(|k| (m, k)));
                }
                served.proxies.iter().map(|p| p[m].link()).collect()
            }
            (Action::Partition { peers, .. } | Action::Clog { peers, .. }, Some(m)) => {
                let mut links = Vec::new();
                for peer in peers {
                    let p = resolve_name(run, id, peer)?;
                    match run.server_index(p) {
                        Some(k) if k == m => return Err(format!("{} is {peer}", run.nodes[m])),
                        Some(k) => peer_cuts.push((m, k)),
                        None => links.push(served.proxies[client(p)][m].link()),
                    }
                }
                links
            }
            (Action::Partition { peers, .. } | Action::Clog { peers, .. }, None) => {
                let mut links = Vec::new();
                for peer in peers {
                    let m = resolve_name(run, id, peer).map(|p| run.server_index(p))?;
                    links.extend(m.map(|m| served.proxies[client(node)][m].link()));
                }
                links
            }
            (Action::Delay { .. } | Action::DropReply { .. }, Some(m)) => {
                served.proxies.iter().map(|p| p[m].link()).collect()
            }
            (Action::Delay { .. } | Action::DropReply { .. }, None) => {
                served.proxies[client(node)].iter().map(|p| p.link()).collect()
            }
            _ => return Ok(None),
        };
        Ok(Some(Network { links, peer_cuts, action, on_server: server.is_some() }))
    }

    /// Start (`on`) or end the fault on every link.
    fn set(&self, run: &Run, on: bool) {
        for (a, b) in &self.peer_cuts {
            run.served().cluster.cut(*a, *b, on);
        }
        for link in &self.links {
            match self.action {
                Action::Partition { .. } => {
                    link.cut(Dir::Up, on);
                    link.cut(Dir::Down, on);
                }
                // The target's outgoing bytes: the server's go down, a client's up.
                Action::Clog { .. } => link.cut(if self.on_server { Dir::Down } else { Dir::Up }, on),
                Action::Delay { latency, .. } => {
                    link.set_delay(if self.on_server { Side::Server } else { Side::Client }, on.then_some(*latency))
                }
                Action::DropReply { rate, .. } => link.set_drop_reply(on.then_some(*rate)),
                _ => unreachable!("Network::of takes network faults only"),
            }
        }
    }
}

/// Signal the target's live process, recording the fault's start first; `None` if it is down.
fn signal_live(run: &Run, slot: &std::sync::Mutex<Slot>, node: NodeIx, start: EventKind, sig: i32) -> Option<i32> {
    let s = slot.lock().expect("slot lock");
    let pid = s.pid.filter(|_| s.down.is_none())?;
    run.recorder.record(node, start);
    send(pid, sig);
    Some(pid)
}

/// The node `target` names now; `trigger`: the node whose event fired an aimed fault.
fn resolve(run: &Run, id: u32, target: &Target, trigger: Option<NodeIx>) -> Result<NodeIx, String> {
    let (candidates, nobody) = match target {
        Target::Node(name) => return resolve_name(run, id, name),
        Target::RandomClient => return Err("random-client was not resolved before the run".into()),
        Target::Trigger => return trigger.ok_or_else(|| "`target = \"trigger\"` needs `on`".into()),
        Target::Holder => (run.recorder.holders(), "nobody held the lock"),
        Target::Waiter => (run.recorder.waiters(), "nobody was waiting for the lock"),
    };
    match candidates.len() {
        0 => Err(nobody.to_string()),
        n => {
            let mut rng = locksim_sim::rng::stream(run.seed, locksim_sim::rng::Stream::Nemesis, 2 + u64::from(id));
            Ok(candidates[rng.gen_range(0..n)])
        }
    }
}

/// The node `name` names now: a node's own name, or a cluster's role — `leader`, the member that says
/// it leads; `holder-server`, the member the first holder's connection goes to through its proxies.
fn resolve_name(run: &Run, _id: u32, name: &str) -> Result<NodeIx, String> {
    let served = || run.served();
    match name {
        "leader" => match served().cluster.leader() {
            Some(m) => Ok(NodeIx(m as u32)),
            None => Err("no member leads the cluster".into()),
        },
        "holder-server" => {
            let holder = *run.recorder.holders().first().ok_or("nobody held the lock")?;
            let proxies = &served().proxies[run.client_index(holder)];
            let on = proxies.iter().position(|p| p.link().connected());
            on.map(|m| NodeIx(m as u32)).ok_or_else(|| "the holder is connected to no server".into())
        }
        _ => run.node(name).ok_or_else(|| format!("no node {name}")),
    }
}

/// Signal a client process's group (it leads one: the adapter and whatever it started), which locksim
/// started and has not reaped (the caller holds its slot, so the pid is still its group's). A group
/// already gone has nothing left to signal.
fn send(pid: i32, sig: i32) {
    let _ = crate::process::signal_group(pid, sig);
}

impl Run {
    /// Server `member`, for a fault to stop, crash or start again.
    fn server(&self, member: usize) -> MutexGuard<'_, Server> {
        self.served().cluster.member(member)
    }
}
