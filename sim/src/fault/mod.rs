//! Faults: what can be injected into a world, the written-out schedule, and the random nemesis.
//!
//! A [`Fault`] is one scheduled injection: when, at whom, and what. The nemesis ([`RandomFaults`]) draws a
//! schedule from its own random stream before the run starts, so a drawn schedule and the same schedule
//! written out produce the same run (ARCHITECTURE.md, "Invariants").
//!
//! A fault starts at its time (`at`) or, with a [`Trigger`] (`on = "acquire-ok"`), at the moment the history
//! records the n-th matching client event after `at`, or the n-th time a client passes a point inside its
//! recipe (a [`Point`] the recipe declares): an *aimed* fault. Three server-side moments are triggers
//! as well: a server ending a client's lease (`lease-expired`; `lease-renew` is the client's side of
//! it), an ensemble or cluster getting a new leader (`leader-change`), and an etcd leader taking a read
//! index (`read-index`).
//!
//! What a fault *does* is its kind's: each kind is one declaration ([`Spec`], `kind.rs`; the kinds in
//! `kinds.rs`), which the scenario reader, the nemesis, the shrinker, the checkers and the report read.

mod kind;
pub mod kinds;

pub use kind::{Action, Draw, FaultKind, FaultParams, Key, Meaning, MemberNeed, Nemesis, Shade, Slot, Spec};

use crate::rng::{ChaCha8Rng, Rng};
use std::time::Duration;

/// Whom a fault hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A node by name: `client-2`, `redis-0`, `resource`.
    Node(String),
    /// Whoever believes it holds the lock when the fault starts (skipped when nobody does).
    Holder,
    /// A client waiting inside `acquire` when the fault starts (skipped when none is).
    Waiter,
    /// A client drawn from the nemesis stream when the schedule is resolved.
    RandomClient,
    /// The node whose event fired the fault's trigger (only with `on`).
    Trigger,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Node(n) => f.write_str(n),
            Target::Holder => f.write_str("holder"),
            Target::Waiter => f.write_str("waiter"),
            Target::RandomClient => f.write_str("random-client"),
            Target::Trigger => f.write_str("trigger"),
        }
    }
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// When it starts; with a trigger, when the trigger is armed (events before it do not count).
    pub at: Duration,
    pub target: Target,
    pub action: Action,
    /// `on = "<event>"`: start when the history records this event instead of at `at`.
    pub on: Option<Trigger>,
}

/// What a fault can be triggered by (`on = "..."`): a client event of the history, or a point inside
/// the recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TriggerEvent {
    /// `AcquireInvoke`: a client starts waiting for the lock.
    Acquire,
    /// `AcquireOk`: a client was granted the lock.
    AcquireOk,
    /// `Enter`: a critical section begins (between a grant and its first read or write).
    Enter,
    /// `ReleaseInvoke`: right after a client sends its release.
    Release,
    /// `LockLost`: a client learned that its lock is gone.
    LockLost,
    /// A server ended a client's newest lease without the client's asking (the
    /// `lease-expired-while-held` mark's moment, held or not): the event's node is the client.
    LeaseExpired,
    /// A ZooKeeper ensemble's new leader is established, or an etcd member won an election: the
    /// event's node is the new leader.
    LeaderChange,
    /// An etcd cluster's leader took a read index — a linearizable read's or, from 3.5.13, a
    /// keep-alive's — and sent the heartbeats that confirm it: the event's node is the leader.
    ReadIndex,
    /// A point a recipe declares (`RecipeSpec::points` in locksim-locks) and passes with
    /// [`crate::ctx::Ctx::point`], or its family's client library does ([`crate::backend::LEASE_RENEW`]).
    Declared(&'static Point),
}

/// A point inside a recipe: a moment between two of its steps, which the history does not show, that a
/// fault can start at (`on = "<name>"`). The recipes that pass it declare it; one passed by several
/// (`lease-renew`) is one constant beside the code that passes it. Points compare by value: each use of
/// a constant may be its own copy.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Point {
    /// What scenario files write after `on =`: lowercase words joined by `-`, none of the history
    /// events' names ([`TriggerEvent::ALL`]).
    pub name: &'static str,
    /// One line for `locksim list`: where in the recipe, and what a fault started there hits.
    pub doc: &'static str,
}

impl TriggerEvent {
    /// The events a fault can be triggered by besides a recipe's points: the history's client events,
    /// then the servers'.
    pub const ALL: [TriggerEvent; 8] = [
        TriggerEvent::Acquire,
        TriggerEvent::AcquireOk,
        TriggerEvent::Enter,
        TriggerEvent::Release,
        TriggerEvent::LockLost,
        TriggerEvent::LeaseExpired,
        TriggerEvent::LeaderChange,
        TriggerEvent::ReadIndex,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TriggerEvent::Acquire => "acquire",
            TriggerEvent::AcquireOk => "acquire-ok",
            TriggerEvent::Enter => "enter",
            TriggerEvent::Release => "release",
            TriggerEvent::LockLost => "lock-lost",
            TriggerEvent::LeaseExpired => "lease-expired",
            TriggerEvent::LeaderChange => "leader-change",
            TriggerEvent::ReadIndex => "read-index",
            TriggerEvent::Declared(point) => point.name,
        }
    }

    /// A client's event, which the history records as it happens ([`crate::history::EventKind::trigger_event`]);
    /// the others happen inside a server or a recipe.
    pub fn is_client(self) -> bool {
        matches!(
            self,
            TriggerEvent::Acquire
                | TriggerEvent::AcquireOk
                | TriggerEvent::Enter
                | TriggerEvent::Release
                | TriggerEvent::LockLost
        )
    }

    /// A history event by its name (a point is found among its recipe's: `RecipeSpec::points`).
    pub fn parse(name: &str) -> Option<TriggerEvent> {
        TriggerEvent::ALL.into_iter().find(|e| e.name() == name)
    }

    /// One line for `locksim list faults`.
    pub fn describe(self) -> &'static str {
        match self {
            TriggerEvent::Acquire => "a client calls acquire (it starts waiting)",
            TriggerEvent::AcquireOk => "acquire returns ok (the client now believes it holds the lock)",
            TriggerEvent::Enter => "the resource sees a critical section begin (after the grant, before any write)",
            TriggerEvent::Release => "a client calls release (its release is on its way)",
            TriggerEvent::LockLost => "a client learns its lock is gone (session or lease lost)",
            TriggerEvent::LeaseExpired => {
                "a server ends a client's lease without its asking (a ZooKeeper session expired by the leader, an \
                 etcd lease revoked, a Redis key expired when next touched, a database session ended); the trigger is \
                 the client"
            }
            TriggerEvent::LeaderChange => {
                "an ensemble or cluster has a new leader (ZooKeeper: established; etcd: won its election); the \
                 trigger is the new leader"
            }
            TriggerEvent::ReadIndex => {
                "an etcd cluster's leader takes a read index (a linearizable read's, or from 3.5.13 a keep-alive's) \
                 and sends the heartbeats that confirm it; the trigger is the leader"
            }
            TriggerEvent::Declared(point) => point.doc,
        }
    }
}

/// `on`, `nth`, `client`, `after`: which event starts an aimed fault, and how long after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    pub event: TriggerEvent,
    /// The n-th matching event after arming (1: the first).
    pub nth: u32,
    /// Only this client's events (`None`: any node's).
    pub client: Option<String>,
    /// How long after the event the fault starts (zero: at once, before any message the event's node
    /// sends has arrived anywhere; more: while what it sent is on its way, e.g. a request applied and
    /// its reply not yet back).
    pub after: Duration,
}

impl std::fmt::Display for Trigger {
    /// `acquire-ok`, `acquire-ok #3 of client-2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.event.name())?;
        if self.nth != 1 {
            write!(f, " #{}", self.nth)?;
        }
        if let Some(c) = &self.client {
            write!(f, " of {c}")?;
        }
        if !self.after.is_zero() {
            write!(f, " + {}", fmt_duration(self.after))?;
        }
        Ok(())
    }
}

/// The nodes a schedule can aim at.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    pub clients: Vec<String>,
    pub servers: Vec<String>,
    /// Masters that have a replica to fail over to.
    pub failover_masters: Vec<String>,
    /// Servers, and roles naming one, that a `stall` can stop: members of a cluster whose consensus loop
    /// runs apart from their client side (an etcd cluster's).
    pub stallable: Vec<String>,
    /// Servers, and roles naming one, whose apply a `lag` can slow: members that apply what a leader
    /// commits (a ZooKeeper ensemble's followers, an etcd cluster's members).
    pub laggable: Vec<String>,
    /// Names of servers by what they are at the moment a fault starts (an ensemble's `leader`), with
    /// what each means: targets and peers as node names are.
    pub roles: Vec<(&'static str, &'static str)>,
    /// The points the recipe declares, in its order: the aimed nemesis weighs them in with the history's
    /// events and draws among them by index, so their order is part of a seed's schedule.
    pub points: Vec<TriggerEvent>,
}

/// `[faults.random]`: a nemesis that draws faults of the given kinds at random intervals.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomFaults {
    pub kinds: Vec<FaultKind>,
    /// Gap between one fault's start and the next, drawn uniformly.
    pub every: (Duration, Duration),
    /// How long each fault lasts (and how far a clock jumps), drawn uniformly.
    pub duration: (Duration, Duration),
    /// Aim every fault here instead of drawing a target per kind.
    pub target: Option<Target>,
    /// `aim = true`: each drawn fault is armed at its drawn time and triggered by a lock-relevant event
    /// ([`RandomFaults::AIM_WEIGHTS`]) or a point of the recipe ([`RandomFaults::AIM_AT_POINTS`]),
    /// hitting the node of that event (servers' faults keep their server; a `target` other than
    /// `random-client` is kept).
    pub aim: bool,
}

impl RandomFaults {
    /// Draw the schedule of one run of `run_for`, from the nemesis stream.
    pub fn draw(&self, rng: &mut ChaCha8Rng, run_for: Duration, topo: &Topology) -> Vec<Fault> {
        let mut faults = Vec::new();
        let mut at = Duration::ZERO;
        loop {
            at += uniform(rng, self.every);
            if at >= run_for || self.kinds.is_empty() {
                return faults;
            }
            let kind = self.kinds[rng.gen_range(0..self.kinds.len())];
            let duration = uniform(rng, self.duration);
            if let Some((target, action)) = self.draw_one(rng, kind, duration, topo) {
                let mut fault = Fault { at, target: self.target.clone().unwrap_or(target), action, on: None };
                if self.aim {
                    // Drawn after the fault's other choices: without `aim` the stream is used as before.
                    self.aim_at_event(rng, &mut fault, &topo.points);
                }
                faults.push(fault);
            }
        }
    }

    /// How the aimed nemesis weighs the history's events it triggers on (in percent): the moments where
    /// a pause or a cut does the most harm to a lock — just granted, inside the critical section,
    /// releasing, waiting.
    pub const AIM_WEIGHTS: [(TriggerEvent, u32); 4] = [
        (TriggerEvent::AcquireOk, 40),
        (TriggerEvent::Enter, 25),
        (TriggerEvent::Release, 20),
        (TriggerEvent::Acquire, 15),
    ];

    /// The share of aimed faults (in percent) started at a point of the recipe, when it passes any
    /// ([`Topology::points`]), drawn evenly among its points. A point marks a window between two of
    /// the recipe's own steps that no history event starts a fault in: the etcd `Mutex` re-check,
    /// a ZooKeeper lock's create. Like BUGGIFY's sites, they are where the recipe's author knew it
    /// was fragile, so they get as much weight as all of the history's events together.
    pub const AIM_AT_POINTS: u32 = 50;

    fn aim_at_event(&self, rng: &mut ChaCha8Rng, fault: &mut Fault, points: &[TriggerEvent]) {
        let mut roll = rng.gen_range(0..100u32);
        let event = if !points.is_empty() && roll < Self::AIM_AT_POINTS {
            points[rng.gen_range(0..points.len())]
        } else {
            if !points.is_empty() {
                // The rest of the roll, spread back over 0..100 for the history's weights.
                roll = (roll - Self::AIM_AT_POINTS) * 100 / (100 - Self::AIM_AT_POINTS);
            }
            Self::AIM_WEIGHTS
                .into_iter()
                .find(|(_, w)| {
                    let hit = roll < *w;
                    roll = roll.saturating_sub(*w);
                    hit
                })
                .map_or(TriggerEvent::AcquireOk, |(e, _)| e)
        };
        fault.on = Some(Trigger { event, nth: 1, client: None, after: Duration::ZERO });
        let on_servers = fault.action.kind().spec().means.on_servers;
        // `random-client` leaves the client to the nemesis: aimed, that is the client whose event it
        // chose. A named node, `holder` or `waiter` stays what the scenario says.
        if matches!(self.target, None | Some(Target::RandomClient)) && !on_servers {
            fault.target = Target::Trigger;
        }
    }

    /// One fault of `kind`, drawn as its declaration says ([`Spec::nemesis`]). Targets are drawn even
    /// when `self.target` overrides them, so that setting it changes only where faults land, not when or
    /// what they are.
    fn draw_one(
        &self,
        rng: &mut ChaCha8Rng,
        kind: FaultKind,
        duration: Duration,
        topo: &Topology,
    ) -> Option<(Target, Action)> {
        let spec = kind.spec();
        let Nemesis::Draws(draw) = spec.nemesis else { return None };
        draw(rng, duration, topo).map(|(target, params)| (target, (spec.build)(params)))
    }
}

/// Resolve `random-client` targets from the nemesis stream, in schedule order.
pub fn resolve_random_clients(faults: &mut [Fault], rng: &mut ChaCha8Rng, clients: &[String]) {
    for f in faults.iter_mut().filter(|f| f.target == Target::RandomClient) {
        f.target = Target::Node(clients[rng.gen_range(0..clients.len())].clone());
    }
}

/// A duration drawn uniformly from `[lo, hi]`, in whole milliseconds (so a drawn schedule reads
/// cleanly when written out).
fn uniform(rng: &mut ChaCha8Rng, (lo, hi): (Duration, Duration)) -> Duration {
    let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
    Duration::from_millis(if hi <= lo { lo } else { rng.gen_range(lo..=hi) })
}

/// `1.5s`, `250ms`, `2m`: the shortest exact spelling in the scenario-file units.
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, per) in [("h", 3_600_000_000_000u128), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000)] {
        if ns >= per && ns.is_multiple_of(per) {
            return format!("{}{unit}", ns / per);
        }
    }
    match ns {
        0 => "0s".into(),
        ns if ns >= 1_000_000 => format!("{}ms", ns as f64 / 1e6),
        ns if ns.is_multiple_of(1_000) => format!("{}us", ns / 1_000),
        ns => format!("{ns}ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{stream, Stream};

    fn topo() -> Topology {
        Topology {
            clients: vec!["client-0".into(), "client-1".into()],
            servers: vec!["redis-0".into()],
            ..Topology::default()
        }
    }

    #[test]
    fn the_nemesis_draws_the_same_schedule_from_the_same_seed() {
        let nemesis = RandomFaults {
            kinds: vec![FaultKind::Pause, FaultKind::Partition, FaultKind::Crash],
            every: (Duration::from_secs(2), Duration::from_secs(10)),
            duration: (Duration::from_secs(1), Duration::from_secs(15)),
            target: None,
            aim: false,
        };
        let draw = |seed| nemesis.draw(&mut stream(seed, Stream::Nemesis, 0), Duration::from_secs(60), &topo());
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        let faults = draw(3);
        assert!(faults.len() >= 5, "60 s at most 10 s apart gives at least 5 faults, got {}", faults.len());
        assert!(faults.windows(2).all(|w| w[0].at < w[1].at));
        assert!(faults.iter().all(|f| f.at < Duration::from_secs(60)));
    }

    #[test]
    fn the_nemesis_draws_process_and_host_crashes_apart() {
        let nemesis = RandomFaults {
            kinds: vec![FaultKind::Crash, FaultKind::HostCrash],
            every: (Duration::from_secs(1), Duration::from_secs(1)),
            duration: (Duration::from_secs(1), Duration::from_secs(1)),
            target: None,
            aim: false,
        };
        let faults = nemesis.draw(&mut stream(2, Stream::Nemesis, 0), Duration::from_secs(40), &topo());
        let kinds: std::collections::BTreeSet<FaultKind> = faults.iter().map(|f| f.action.kind()).collect();
        assert_eq!(kinds, [FaultKind::Crash, FaultKind::HostCrash].into(), "{faults:?}");
        for f in &faults {
            let host = f.action.kind() == FaultKind::HostCrash;
            assert_eq!(f.action, Action::Crash { restart_after: Some(Duration::from_secs(1)), host });
            assert!(f.action.kind().is_crash());
        }
        assert_eq!(FaultKind::parse("host-crash"), Some(FaultKind::HostCrash));
    }

    #[test]
    fn failover_is_not_drawn_without_a_replica() {
        let nemesis = RandomFaults {
            kinds: vec![FaultKind::Failover],
            every: (Duration::from_secs(1), Duration::from_secs(1)),
            duration: (Duration::from_secs(1), Duration::from_secs(1)),
            target: None,
            aim: false,
        };
        assert!(nemesis.draw(&mut stream(1, Stream::Nemesis, 0), Duration::from_secs(10), &topo()).is_empty());
    }

    #[test]
    fn the_aimed_nemesis_keeps_kinds_and_times_and_aims_client_faults_at_the_trigger() {
        let mut nemesis = RandomFaults {
            kinds: vec![FaultKind::Pause, FaultKind::Crash, FaultKind::DropReply],
            every: (Duration::from_secs(1), Duration::from_secs(3)),
            duration: (Duration::from_secs(1), Duration::from_secs(5)),
            target: None,
            aim: false,
        };
        let uniform = nemesis.draw(&mut stream(9, Stream::Nemesis, 0), Duration::from_secs(60), &topo());
        nemesis.aim = true;
        let aimed = nemesis.draw(&mut stream(9, Stream::Nemesis, 0), Duration::from_secs(60), &topo());
        assert_eq!((uniform[0].at, uniform[0].action.kind()), (aimed[0].at, aimed[0].action.kind()));
        assert!(uniform.iter().all(|f| f.on.is_none()) && aimed.iter().all(|f| f.on.is_some()));
        for f in &aimed {
            let on_server = f.action.kind() == FaultKind::DropReply;
            assert_eq!(on_server, f.target != Target::Trigger, "{f:?}");
        }
        let events: std::collections::BTreeSet<TriggerEvent> =
            aimed.iter().map(|f| f.on.as_ref().unwrap().event).collect();
        assert!(events.len() >= 3, "{events:?}");
        // `random-client` is the aim's client too; a role or a named node is kept.
        for (target, aimed_at) in [
            (Target::RandomClient, Target::Trigger),
            (Target::Waiter, Target::Waiter),
            (Target::Node("client-1".into()), Target::Node("client-1".into())),
        ] {
            nemesis.target = Some(target);
            let faults = nemesis.draw(&mut stream(9, Stream::Nemesis, 0), Duration::from_secs(60), &topo());
            let client_faults: Vec<&Fault> =
                faults.iter().filter(|f| f.action.kind() != FaultKind::DropReply).collect();
            assert!(client_faults.len() > 3 && client_faults.iter().all(|f| f.target == aimed_at), "{aimed_at:?}");
        }
    }

    #[test]
    fn the_aimed_nemesis_starts_about_half_its_faults_at_the_recipes_points() {
        const CHECKED: Point = Point { name: "checked", doc: "a recipe's own point" };
        let nemesis = RandomFaults {
            kinds: vec![FaultKind::Pause],
            every: (Duration::from_millis(100), Duration::from_millis(100)),
            duration: (Duration::from_secs(1), Duration::from_secs(1)),
            target: None,
            aim: true,
        };
        let (checked, renew) = (TriggerEvent::Declared(&CHECKED), TriggerEvent::Declared(&crate::backend::LEASE_RENEW));
        let two = Topology { points: vec![checked, renew], ..topo() };
        let draw = |topo: &Topology| nemesis.draw(&mut stream(5, Stream::Nemesis, 0), Duration::from_secs(100), topo);
        let at = |faults: &[Fault], point| faults.iter().filter(|f| f.on.as_ref().unwrap().event == point).count();
        let aimed = draw(&two);
        assert_eq!(aimed.len(), 999);
        let (checked, renew) = (at(&aimed, checked), at(&aimed, renew));
        assert!((400..600).contains(&(checked + renew)), "{checked} + {renew} of 999 at the points");
        assert!((180..320).contains(&checked) && (180..320).contains(&renew), "{checked} and {renew}: evenly");
        assert!(aimed.iter().all(|f| f.target == Target::Trigger));
        // The rest still covers every history event; a recipe without points is never aimed at one.
        let events: std::collections::BTreeSet<TriggerEvent> =
            aimed.iter().map(|f| f.on.as_ref().unwrap().event).collect();
        assert_eq!(events.len(), 2 + RandomFaults::AIM_WEIGHTS.len(), "{events:?}");
        let plain = draw(&topo());
        assert!(plain.iter().all(|f| TriggerEvent::ALL.contains(&f.on.as_ref().unwrap().event)));
    }

    #[test]
    fn triggers_print_as_their_event_number_and_client() {
        let on =
            Trigger { event: TriggerEvent::AcquireOk, nth: 3, client: Some("client-2".into()), after: Duration::ZERO };
        assert_eq!(on.to_string(), "acquire-ok #3 of client-2");
        let enter = Trigger { event: TriggerEvent::Enter, nth: 1, client: None, after: Duration::ZERO };
        assert_eq!(enter.to_string(), "enter");
        let later = Trigger { after: Duration::from_millis(15), ..enter };
        assert_eq!(later.to_string(), "enter + 15ms");
        assert!(TriggerEvent::ALL.iter().all(|e| TriggerEvent::parse(e.name()) == Some(*e)));
    }

    #[test]
    fn durations_print_in_scenario_units() {
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(fmt_duration(Duration::from_secs(8)), "8s");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1.5ms");
    }
}
