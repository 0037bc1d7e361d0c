//! Real faults on client processes (signals to the process group each client leads): `pause` is
//! SIGSTOP, then SIGCONT after its duration (a stop-the-world pause: the kernel still holds its
//! sockets); `crash` is SIGKILL, and the client comes back as a new process after `duration` if given (its workload draws from a new stream, as a
//! restarted simulated node does), else stays down. They are recorded as the simulator records them:
//! `FaultStart` with the target and detail, `FaultEnd` when a pause ends or a crashed client restarts,
//! `FaultSkipped` when `holder` or `waiter` finds nobody or the target is down.
//!
//! Anything else — other kinds, a server or the resource as target, a random nemesis — is refused
//! before the run starts ([`refuse_unsupported`]).

use super::{Run, Slot};
use locksim_scenarios::Scenario;
use locksim_sim::fault::{Action, Fault, Target};
use locksim_sim::history::{EventKind, NodeIx};
use locksim_sim::rng::Rng;

/// Refuse, naming the fault, what real mode cannot do yet.
pub fn refuse_unsupported(scenario: &Scenario) -> anyhow::Result<()> {
    if scenario.random.is_some() {
        anyhow::bail!("{}: [faults.random] does not run with --real yet; write the faults out", scenario.path);
    }
    for f in &scenario.schedule {
        let what = locksim_scenarios::run::describe(f);
        if !matches!(f.action, Action::Pause { .. } | Action::Crash { .. }) {
            let why = if matches!(f.action, Action::ClockJump { .. } | Action::ClockDrift { .. }) {
                "cannot move one process's clock (every process reads the kernel's)"
            } else {
                "does not do this fault yet"
            };
            anyhow::bail!(
                "{}: fault `{what}`: --real {why}; it does only pause and crash of client processes",
                scenario.path
            );
        }
        if let Target::Node(n) = &f.target {
            if !n.starts_with("client-") {
                anyhow::bail!(
                    "{}: fault `{what}`: --real pauses and crashes client processes only, not {n}",
                    scenario.path
                );
            }
        }
    }
    Ok(())
}

/// Apply fault `id` of the run at its time (on its own thread); returns when it has ended.
pub fn apply(run: &Run, id: u32, fault: &Fault) {
    if !run.sleep_until(fault.at) {
        return;
    }
    let kind = fault.action.kind();
    let skip =
        |node: NodeIx, reason: String| run.recorder.record(node, EventKind::FaultSkipped { id, fault: kind, reason });
    let node = match resolve(run, id, &fault.target) {
        Ok(node) => node,
        Err(reason) => return skip(NodeIx(0), reason),
    };
    let slot = &run.slots[run.client_index(node)];
    let target = run.nodes[node.0 as usize].clone();
    let start = EventKind::FaultStart { id, fault: kind, target: target.clone(), detail: fault.action.detail() };
    match fault.action {
        Action::Pause { duration } => {
            let Some(pid) = signal_live(run, slot, node, start, libc::SIGSTOP) else {
                return skip(node, format!("{target} is down"));
            };
            if !run.sleep_until(fault.at + duration) {
                // The run ended first: the process is killed with the others, as the simulator ends
                // the world with the node still paused.
                return;
            }
            let s = slot.lock().expect("slot lock");
            if s.pid == Some(pid) {
                send(pid, libc::SIGCONT);
            }
            drop(s);
            run.recorder.record(node, EventKind::FaultEnd { id });
        }
        Action::Crash { restart_after } => {
            let restart_at = restart_after.map(|d| fault.at + d);
            {
                let mut s = slot.lock().expect("slot lock");
                let Some(pid) = s.pid.filter(|_| s.down.is_none()) else {
                    drop(s);
                    return skip(node, format!("{target} is already down"));
                };
                s.down = Some(restart_at);
                run.recorder.record(node, start);
                run.recorder.forget(node);
                // Under the slot's lock: the workload reaps the process only after taking it.
                send(pid, libc::SIGKILL);
            }
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
}

/// Signal the target's live process, recording the fault's start first; `None` if it is down.
fn signal_live(run: &Run, slot: &std::sync::Mutex<Slot>, node: NodeIx, start: EventKind, sig: i32) -> Option<i32> {
    let s = slot.lock().expect("slot lock");
    let pid = s.pid.filter(|_| s.down.is_none())?;
    run.recorder.record(node, start);
    send(pid, sig);
    Some(pid)
}

fn resolve(run: &Run, id: u32, target: &Target) -> Result<NodeIx, String> {
    let (candidates, nobody) = match target {
        Target::Node(name) => {
            return run.node(name).ok_or_else(|| format!("no node {name}"));
        }
        Target::RandomClient => return Err("random-client was not resolved before the run".into()),
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

/// kill(2) on a client process's group (it leads one: the adapter and whatever it started), which
/// locksim started and has not reaped (the caller holds its slot).
fn send(pid: i32, sig: i32) {
    // SAFETY: plain kill(2); the pid is our unreaped child's, and so its group's, while its slot is locked.
    unsafe {
        libc::kill(-pid, sig);
    }
}
