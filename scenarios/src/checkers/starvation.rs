//! `starvation`: a healthy client kept wanting the lock while others were granted it again and again.
//!
//! Neither `deadlock` (the lock free, nobody granted) nor `unfair` (grants out of request order, only
//! among requests that were granted in the end, and only for recipes that promise FIFO) sees a client
//! that never gets its turn while the lock keeps changing hands. This checker does, for every recipe.
//!
//! A *want* runs from a client's first `AcquireInvoke` — failed attempts and the pauses between them do
//! not end it — to its `AcquireOk`, its crash or restart, or the end of the run. Only its *undisturbed*
//! stretches count, because what happens to a waiter under a fault is the fault's doing:
//! - a fault aimed at the waiter's node (paused, cut off, slowed, its clock moved), and the tail after
//!   it: what the waiter sent during a cut reaches the server at a TCP retransmission after the heal,
//!   up to about the cut's own length later (as in `unfair`);
//! - a fault on a node that never asks for the lock (a server, the resource), and its tail, disturbs
//!   every waiter: a restarted server resets every connection, and a lock a crashed server keeps from
//!   everyone is `deadlock`'s business;
//! - a change of the waiter's session (disconnected, expired, keep-alive ended) may rightly send it to
//!   the back of the queue;
//! - an attempt of the waiter's that ended `Unknown` may have been granted without its knowing (a `SET`
//!   applied, its reply lost): its turn may have come.
//!
//! Each of these ends the stretch being counted. Counting starts afresh with the waiter's first attempt
//! begun after the disturbance and its tail are over, not before: what becomes of an attempt a fault
//! touched is the fault's doing too (a connect begun while the database was down takes its whole
//! timeout to fail, and the lock changes hands twenty times meanwhile). Faults without an end disturb
//! until the end of the run (a clock jump) or until the node restarts (a crash without `duration`); a
//! `restart` or `failover` ends the stretches it concerns at once. Only grants the winners knew of
//! (`AcquireOk`) pass a waiter over: another client's `Unknown` may have been a grant, but counting it
//! could only invent starvation.
//!
//! A stretch is starved when (a) one other client was granted more than `grants` times in it, or (b) a
//! client was granted there a second time after the waiter had waited longer than `wait` in it. Both
//! look at repeated winners, not at all grants or the bare length of the wait: a FIFO lock passes a
//! waiter over once per other client (63 times, for half a minute, at 64 clients) and a long hold makes
//! everyone wait, yet neither passes anybody over twice. A racing lock (polling, or a watch that wakes
//! every waiter) lets one rival win a few times in a row by chance; a client that re-takes the lock the
//! moment it lets go wins every round. A want is reported once, for its stretch with the most grants to
//! one winner (the longest wait before a repeat on a tie), naming the waiter and that winner.

use super::holds::kills;
use super::{FindingKind, Raw};
use locksim_sim::fault::FaultKind;
use locksim_sim::history::{EventKind, History, NodeIx};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Stands for every client: where a fault on a server is kept.
const EVERYONE: NodeIx = NodeIx(u32::MAX);

/// When a stretch is starved (`[check] starvation_grants`, `starvation_wait`). The defaults come from
/// the full suite: the racing locks (`zk.ephemeral`, `etcd.txn-lease`, Redis polling) let one rival
/// win up to 15 times in a row over 1000 seeds at 8 clients, FIFO locks never more than twice; the
/// longest wait before a rival's second grant was 109 s (behind 70–80 s holds), and a minute (the whole
/// run) at 64 clients racing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Starved when one other client was granted more than this many times in a stretch.
    pub grants: u32,
    /// Starved when a client was granted a second time after the waiter had waited longer than this.
    pub wait: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds { grants: 20, wait: Duration::from_secs(300) }
    }
}

/// An undisturbed part of a want, and the grants to other clients in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stretch {
    pub from: u64,
    pub to: u64,
    /// Grants to each other client.
    pub wins: BTreeMap<NodeIx, u32>,
    /// The last of those grants that went to a client granted before in this stretch.
    pub last_repeat: Option<u64>,
}

impl Stretch {
    fn starting(from: u64) -> Stretch {
        Stretch { from, to: from, wins: BTreeMap::new(), last_repeat: None }
    }

    pub fn grants(&self) -> u32 {
        self.wins.values().sum()
    }

    /// The client granted most often, and how often (the lowest on a tie).
    pub fn top(&self) -> Option<(NodeIx, u32)> {
        self.wins.iter().map(|(c, n)| (*c, *n)).fold(None, |best, (c, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((c, n)),
        })
    }

    /// How long the waiter had waited when a client was last granted again.
    pub fn repeat_after(&self) -> u64 {
        self.last_repeat.map_or(0, |t| t - self.from)
    }
}

/// One client's wanting the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub client: NodeIx,
    pub from: u64,
    pub to: u64,
    /// The undisturbed stretches, in order.
    pub stretches: Vec<Stretch>,
}

struct Open {
    from: u64,
    done: Vec<Stretch>,
    /// The stretch being counted, if any.
    current: Option<Stretch>,
    /// While no stretch is counted: an attempt begun at or after this time starts one (`None` while a
    /// fault is in force).
    resume_from: Option<u64>,
}

impl Open {
    /// End the stretch being counted at `t`, keeping it if it lasted; the next one starts with an
    /// attempt begun from `resume_from`.
    fn cut(&mut self, t: u64, resume_from: Option<u64>) {
        if let Some(s) = self.current.take().filter(|s| s.from < t) {
            self.done.push(Stretch { to: t, ..s });
        }
        self.resume_from = resume_from;
    }

    /// An attempt begun at `t`: a stretch starts with it if none is being counted and nothing disturbs.
    fn attempt(&mut self, t: u64) {
        if self.current.is_none() && self.resume_from.is_some_and(|f| f <= t) {
            self.current = Some(Stretch::starting(t));
        }
    }
}

/// Which faults disturb whom, and until when.
#[derive(Default)]
struct Disturbances {
    /// Faults in force, by id: whom they disturb (a client, or [`EVERYONE`]), their node, their kind,
    /// and since when.
    active: BTreeMap<u32, (NodeIx, NodeIx, FaultKind, u64)>,
    /// The end of each scope's latest tail.
    tail_until: BTreeMap<NodeIx, u64>,
}

impl Disturbances {
    /// From when `client` counts as undisturbed, looking from `t`; `None` while a fault is in force.
    fn quiet_from(&self, client: NodeIx, t: u64) -> Option<u64> {
        if self.active.values().any(|(n, _, _, _)| *n == client || *n == EVERYONE) {
            return None;
        }
        let tail = [client, EVERYONE].iter().filter_map(|n| self.tail_until.get(n)).copied().max();
        Some(tail.unwrap_or(0).max(t))
    }

    fn end(&mut self, id: u32, t: u64) -> Option<NodeIx> {
        let (scope, _, _, start) = self.active.remove(&id)?;
        let until = self.tail_until.entry(scope).or_default();
        *until = (*until).max(t + (t - start));
        Some(scope)
    }
}

/// Every want of the run, in order of their ends, with their undisturbed stretches.
pub fn wants(h: &History) -> Vec<Want> {
    // Faults and session changes are of a node; a worker's wants are disturbed by its node's.
    let hosts = h.hosts();
    let host = |n: NodeIx| hosts[n.0 as usize];
    let clients: BTreeSet<NodeIx> =
        h.events.iter().filter(|e| matches!(e.kind, EventKind::AcquireInvoke)).map(|e| host(e.node)).collect();
    let scope = |n: NodeIx| if clients.contains(&n) { n } else { EVERYONE };
    let mut dist = Disturbances::default();
    let mut open: BTreeMap<NodeIx, Open> = BTreeMap::new();
    let mut done = Vec::new();
    let finish = |open: &mut BTreeMap<NodeIx, Open>, client: NodeIx, t: u64, done: &mut Vec<Want>| {
        if let Some(mut w) = open.remove(&client) {
            w.cut(t, None);
            done.push(Want { client, from: w.from, to: t, stretches: w.done });
        }
    };
    for e in &h.events {
        let t = e.t;
        match &e.kind {
            EventKind::AcquireInvoke => {
                let resume_from = dist.quiet_from(host(e.node), t);
                let w = open.entry(e.node).or_insert(Open { from: t, done: vec![], current: None, resume_from });
                w.attempt(t);
            }
            EventKind::AcquireOk { .. } => {
                for (_, w) in open.iter_mut().filter(|(c, _)| **c != e.node) {
                    if let Some(s) = w.current.as_mut() {
                        let wins = s.wins.entry(e.node).or_default();
                        *wins += 1;
                        if *wins > 1 {
                            s.last_repeat = Some(t);
                        }
                    }
                }
                finish(&mut open, e.node, t, &mut done);
            }
            EventKind::AcquireUnknown { .. } => {
                if let Some(w) = open.get_mut(&e.node) {
                    w.cut(t, dist.quiet_from(host(e.node), t));
                }
            }
            EventKind::Session { .. } => {
                for (c, w) in open.iter_mut().filter(|(c, _)| host(**c) == e.node) {
                    w.cut(t, dist.quiet_from(host(*c), t));
                }
            }
            EventKind::FaultStart { id, fault, .. } => {
                let whom = scope(e.node);
                if kills(&e.kind) {
                    for client in h.residents(e.node) {
                        finish(&mut open, client, t, &mut done);
                    }
                }
                if fault.spec().means.revives {
                    // A restart brings back what a crash without `duration` left down: that crash ends.
                    let crashes: Vec<u32> = (dist.active.iter())
                        .filter(|(_, (_, n, k, _))| *n == e.node && k.is_crash())
                        .map(|(id, _)| *id)
                        .collect();
                    for id in crashes {
                        dist.end(id, t);
                    }
                }
                if fault.spec().means.in_force {
                    dist.active.insert(*id, (whom, e.node, *fault, t));
                }
                for (c, w) in open.iter_mut().filter(|(c, _)| whom == EVERYONE || host(**c) == whom) {
                    w.cut(t, dist.quiet_from(host(*c), t));
                }
            }
            EventKind::FaultEnd { id } => {
                let Some(whom) = dist.end(*id, t) else { continue };
                for (c, w) in open.iter_mut().filter(|(c, _)| whom == EVERYONE || host(**c) == whom) {
                    w.resume_from = dist.quiet_from(host(*c), t);
                }
            }
            _ => {}
        }
    }
    let still: Vec<NodeIx> = open.keys().copied().collect();
    for client in still {
        finish(&mut open, client, h.end, &mut done);
    }
    done
}

fn bound_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `31.2s`.
fn secs(ns: u64) -> String {
    format!("{:.1}s", ns as f64 / 1e9)
}

fn starved(s: &Stretch, bounds: Bounds) -> bool {
    s.top().is_some_and(|(_, n)| n > bounds.grants) || s.repeat_after() > bound_ns(bounds.wait)
}

pub(super) fn check(h: &History, bounds: Option<Bounds>) -> Vec<Raw> {
    let Some(bounds) = bounds else { return vec![] };
    let mut found = Vec::new();
    for want in wants(h) {
        let worst = (want.stretches.iter())
            .filter(|s| starved(s, bounds))
            .max_by_key(|s| (s.top().map_or(0, |t| t.1), s.repeat_after(), std::cmp::Reverse(s.from)));
        let Some(s) = worst else { continue };
        let (winner, wins) = s.top().expect("a starved stretch saw a grant");
        let grants = s.grants();
        let mut detail = format!("passed over by {grants} grant{}", if grants == 1 { "" } else { "s" });
        if wins < grants {
            detail.push_str(&format!(" ({wins} to {})", h.name(winner)));
        }
        detail.push_str(&format!(" in {} of undisturbed waiting", secs(s.to - s.from)));
        if s.repeat_after() > bound_ns(bounds.wait) {
            detail.push_str(&format!("; a client granted again after {}", secs(s.repeat_after())));
        }
        found.push(Raw {
            kind: FindingKind::Starvation,
            clients: vec![want.client, winner],
            from: s.from,
            to: s.to,
            detail,
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::test_history::{crash, history, ok};
    use super::*;
    use locksim_sim::history::EventKind::*;

    type Events = Vec<(f64, u32, EventKind)>;

    /// `n` grants to `client`, each asked for 10 ms before, one every `every` seconds from `from`.
    fn grants(client: u32, from: f64, n: usize, every: f64) -> Events {
        let mut e = Vec::new();
        for i in 0..n {
            let t = from + i as f64 * every;
            e.extend([(t, client, AcquireInvoke), (t + 0.01, client, ok(i as u64))]);
        }
        e
    }

    fn run(mut events: Events) -> Vec<Raw> {
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        check(&history(100.0, events), Some(Bounds::default()))
    }

    fn partition(id: u32) -> EventKind {
        FaultStart { id, fault: FaultKind::Partition, target: String::new(), detail: String::new() }
    }

    #[test]
    fn a_waiter_passed_over_by_one_client_in_a_tight_loop_is_starved() {
        let mut e = vec![(1.0, 0, AcquireInvoke)];
        e.extend(grants(1, 2.0, 25, 1.0));
        let found = run(e);
        assert_eq!(found.len(), 1, "one finding per starved want");
        assert_eq!(found[0].clients, vec![NodeIx(0), NodeIx(1)], "the starved client, then the winner");
        assert_eq!((found[0].from, found[0].to), (1_000_000_000, 100_000_000_000), "it never got its turn");
        assert!(
            found[0].detail.starts_with("passed over by 25 grants in 99.0s of undisturbed waiting"),
            "{}",
            found[0].detail
        );
        assert!(check(&history(100.0, vec![]), None).is_empty());
    }

    #[test]
    fn taking_turns_and_losing_twenty_times_are_not_starvation() {
        // Three others granted in turn, seven times each: no one rival more than 20 times.
        let mut turns = vec![(1.0, 0, AcquireInvoke)];
        for c in 1..3 {
            turns.extend(grants(c, 2.0 + c as f64 * 0.3, 10, 1.0));
        }
        assert!(run(turns).is_empty(), "20 grants to two rivals, 10 each");
        let mut twenty = vec![(1.0, 0, AcquireInvoke)];
        twenty.extend(grants(1, 2.0, 20, 1.0));
        twenty.push((25.0, 0, ok(99)));
        assert!(run(twenty).is_empty(), "passed over by 20 is within the bound");
    }

    #[test]
    fn failed_attempts_do_not_end_the_want() {
        let mut e = vec![(1.0, 0, AcquireInvoke)];
        for i in 0..5 {
            let t = 10.0 * i as f64 + 10.5;
            e.extend([(t, 0, AcquireFail { reason: "timed out".into() }), (t + 0.1, 0, AcquireInvoke)]);
        }
        e.extend(grants(1, 2.0, 25, 2.0));
        assert_eq!(run(e).len(), 1);
    }

    #[test]
    fn an_unknown_attempt_may_have_been_the_waiters_turn() {
        // 15 grants, an attempt that may have taken the lock, 15 more: counted apart.
        let mut e = vec![(1.0, 0, AcquireInvoke), (17.5, 0, AcquireUnknown { reason: "timeout".into() })];
        e.push((17.6, 0, AcquireInvoke));
        e.extend(grants(1, 2.0, 30, 1.0));
        assert!(run(e.clone()).is_empty());
        e.extend(grants(1, 32.0, 10, 1.0));
        let found = run(e);
        assert_eq!(found.len(), 1, "25 after the unknown attempt");
        assert_eq!(found[0].from, 17_600_000_000);
    }

    #[test]
    fn grants_under_a_fault_on_the_waiter_and_in_its_tail_are_the_faults_doing() {
        // Cut off from 5 s to 15 s: its tail runs to 25 s; the attempt begun before the cut is spoilt.
        let mut e = vec![(1.0, 0, AcquireInvoke), (5.0, 0, partition(1)), (15.0, 0, FaultEnd { id: 1 })];
        e.extend(grants(1, 2.0, 70, 1.0));
        assert!(run(e.clone()).is_empty(), "3 grants before the cut, none counted after it");
        e.extend([(20.0, 0, AcquireFail { reason: "timed out".into() }), (20.1, 0, AcquireInvoke)]);
        assert!(run(e.clone()).is_empty(), "an attempt begun in the tail is disturbed too");
        e.extend([(30.0, 0, AcquireFail { reason: "timed out".into() }), (30.1, 0, AcquireInvoke)]);
        let found = run(e);
        assert_eq!(found.len(), 1, "an attempt begun once the tail had passed counts");
        assert_eq!(found[0].from, 30_100_000_000);
        assert!(found[0].detail.starts_with("passed over by 41 grants"), "{}", found[0].detail);
    }

    #[test]
    fn a_fault_on_a_server_disturbs_every_waiter_and_one_on_the_winner_none() {
        // Node 3 never asks for the lock: a server. Its crash disturbs client 0's wait.
        let mut e = vec![(1.0, 0, AcquireInvoke), (3.0, 3, crash("redis-0")), (4.0, 3, FaultEnd { id: 0 })];
        e.extend(grants(1, 2.0, 25, 1.0));
        assert!(run(e).is_empty());
        let mut e = vec![(1.0, 0, AcquireInvoke), (3.0, 1, partition(0)), (4.0, 1, FaultEnd { id: 0 })];
        e.extend(grants(1, 2.0, 25, 1.0));
        assert_eq!(run(e).len(), 1, "the winner's own faults do not excuse the lock");
    }

    #[test]
    fn a_server_left_down_disturbs_until_its_restart_and_the_tail_after() {
        let restart = |t, node| {
            (t, node, FaultStart { id: 1, fault: FaultKind::Restart, target: String::new(), detail: String::new() })
        };
        // Down from 3 s (no duration) until a restart at 10 s: the tail runs to 17 s.
        let mut e = vec![(1.0, 0, AcquireInvoke), (3.0, 3, crash("redis-0")), restart(10.0, 3)];
        e.extend([(16.0, 0, AcquireFail { reason: "timed out".into() }), (16.1, 0, AcquireInvoke)]);
        e.extend([(20.0, 0, AcquireFail { reason: "timed out".into() }), (20.1, 0, AcquireInvoke)]);
        e.extend(grants(1, 2.0, 44, 1.0));
        let found = run(e.clone());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].from, 20_100_000_000, "from the first attempt after the tail");
        assert!(found[0].detail.starts_with("passed over by 25 grants"), "{}", found[0].detail);
        // The restart of another node does not bring this one back.
        e.retain(|(t, _, _)| *t != 10.0);
        e.push(restart(10.0, 2));
        assert!(run(e).is_empty());
    }

    #[test]
    fn a_session_change_or_the_waiters_crash_ends_the_count() {
        let mut e = vec![(1.0, 0, AcquireInvoke), (14.5, 0, Session { state: "disconnected".into() })];
        e.extend(grants(1, 2.0, 25, 1.0));
        assert!(run(e).is_empty(), "counted afresh only from its next attempt");
        let mut e = vec![(1.0, 0, AcquireInvoke), (14.5, 0, crash("client-0"))];
        e.extend(grants(1, 2.0, 25, 1.0));
        assert!(run(e).is_empty(), "a crashed client wants nothing");
    }

    #[test]
    fn a_rival_granted_again_after_a_long_wait_is_starvation_and_a_long_queue_is_not() {
        let bounds = Some(Bounds { grants: 20, wait: Duration::from_secs(30) });
        // A queue: clients 1 and 2 hold for 20 s each, once.
        let queue = vec![(1.0, 0, AcquireInvoke), (2.0, 1, AcquireInvoke), (2.0, 1, ok(1)), (22.0, 2, ok(2))];
        let mut again = queue.clone();
        again.extend([(41.0, 1, AcquireInvoke), (42.0, 1, ok(3))]);
        assert!(check(&history(60.0, queue), bounds).is_empty());
        let found = check(&history(60.0, again), bounds);
        assert_eq!(found.len(), 1, "client 1 was granted again after client 0 had waited 41 s");
        assert_eq!(found[0].clients, vec![NodeIx(0), NodeIx(1)]);
        assert!(found[0].detail.ends_with("; a client granted again after 41.0s"), "{}", found[0].detail);
    }
}
