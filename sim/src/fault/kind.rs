//! What a fault kind is: the one declaration ([`Spec`]) every part of locksim reads a kind from.
//!
//! Each kind is a [`Spec`] in `kinds.rs`. The scenario file's reader, `locksim list faults`, the
//! nemesis, the shrinker, the checkers, suites' hazard requirements and the report's timeline all read
//! the kind from there; none of them names a kind. To add a fault kind:
//! 1. here: its [`FaultKind`] variant (and its place in [`FaultKind::ALL`]) and its [`Action`] variant;
//! 2. `kinds.rs`: its `Spec` and its line in `SPECS` (a test checks the two lists agree);
//! 3. what the compiler then asks for, two exhaustive matches over [`Action`] that only their place can
//!    hold: `World::start`/`World::end` in `sim/src/world.rs` (what it does to the simulated world,
//!    whose nodes, network and clocks are private there), and `live/src/real/fault.rs` (how real mode
//!    fires it, or why it refuses to);
//! 4. docs: its keys in `docs/scenarios.md`, its row in `docs/real-mode.md`'s faults table.

use super::{fmt_duration, Target, Topology};
use crate::hazard::Hazard;
use crate::rng::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::Duration;

/// The fault vocabulary of scenario files, results and reports (docs/scenarios.md, "Faults"). The
/// variant is what histories record (`FaultStart`), so its serialized name is part of every history hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Pause,
    Crash,
    HostCrash,
    Restart,
    Partition,
    Clog,
    Delay,
    Loss,
    DropReply,
    ClockJump,
    ClockDrift,
    Failover,
    Stall,
    Lag,
}

impl FaultKind {
    /// Every kind, in `locksim list faults` order (and `SPECS`' order).
    pub const ALL: [FaultKind; 14] = [
        FaultKind::Pause,
        FaultKind::Crash,
        FaultKind::HostCrash,
        FaultKind::Restart,
        FaultKind::Partition,
        FaultKind::Clog,
        FaultKind::Delay,
        FaultKind::Loss,
        FaultKind::DropReply,
        FaultKind::ClockJump,
        FaultKind::ClockDrift,
        FaultKind::Failover,
        FaultKind::Stall,
        FaultKind::Lag,
    ];

    /// Its declaration.
    pub fn spec(self) -> &'static Spec {
        super::kinds::SPECS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the fault kills the node (its process, or its whole host): see [`Meaning::crash`].
    pub fn is_crash(self) -> bool {
        self.spec().means.crash
    }

    /// One line for `locksim list faults`: what it does and the keys it takes beside `at` and `target`.
    pub fn describe(self) -> String {
        let spec = self.spec();
        let keys: Vec<String> = spec.keys.iter().map(Key::describe).collect();
        match keys.is_empty() {
            true => spec.doc.to_string(),
            false => format!("{}; keys: {}", spec.doc, keys.join(", ")),
        }
    }
}

/// What a fault does, with its parameters: what the world and real mode fire. A variant per kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Pause {
        duration: Duration,
    },
    /// `host`: the whole host dies (`host-crash`: silence) rather than the process (`crash`: its
    /// kernel closes its connections, so every peer sees them closed one network delay later).
    Crash {
        restart_after: Option<Duration>,
        host: bool,
    },
    Restart,
    Partition {
        peers: Vec<String>,
        duration: Option<Duration>,
    },
    Clog {
        peers: Vec<String>,
        duration: Option<Duration>,
    },
    Delay {
        latency: Duration,
        duration: Option<Duration>,
    },
    Loss {
        rate: f64,
        duration: Option<Duration>,
    },
    DropReply {
        rate: f64,
        duration: Option<Duration>,
    },
    ClockJump {
        delta_ms: i64,
    },
    ClockDrift {
        rate: f64,
        duration: Option<Duration>,
    },
    Failover,
    /// A cluster member's consensus loop stops while its client side goes on answering (a disk that
    /// blocks its log's writes): see [`crate::world::MemberFault::Stall`].
    Stall {
        duration: Option<Duration>,
    },
    /// A cluster member applies what its leader commits `latency` late (a slow apply loop): see
    /// [`crate::world::MemberFault::Lag`].
    Lag {
        latency: Duration,
        duration: Option<Duration>,
    },
}

impl Action {
    pub fn kind(&self) -> FaultKind {
        match self {
            Action::Pause { .. } => FaultKind::Pause,
            Action::Crash { host: false, .. } => FaultKind::Crash,
            Action::Crash { host: true, .. } => FaultKind::HostCrash,
            Action::Restart => FaultKind::Restart,
            Action::Partition { .. } => FaultKind::Partition,
            Action::Clog { .. } => FaultKind::Clog,
            Action::Delay { .. } => FaultKind::Delay,
            Action::Loss { .. } => FaultKind::Loss,
            Action::DropReply { .. } => FaultKind::DropReply,
            Action::ClockJump { .. } => FaultKind::ClockJump,
            Action::ClockDrift { .. } => FaultKind::ClockDrift,
            Action::Failover => FaultKind::Failover,
            Action::Stall { .. } => FaultKind::Stall,
            Action::Lag { .. } => FaultKind::Lag,
        }
    }

    /// Its keys' values.
    pub fn params(&self) -> FaultParams {
        (self.kind().spec().params)(self)
    }

    /// How long the fault lasts, for faults that end by themselves: its `duration` key. The shrinker
    /// halves it ([`Action::lasting`]).
    pub fn duration(&self) -> Option<Duration> {
        self.params().duration
    }

    /// The same fault lasting `d`.
    pub fn lasting(&self, d: Duration) -> Action {
        let spec = self.kind().spec();
        (spec.build)(FaultParams { duration: Some(d), ..(spec.params)(self) })
    }

    /// The parameters in words, for the history (`FaultStart`'s detail) and traces.
    pub fn detail(&self) -> String {
        (self.kind().spec().detail)(&self.params())
    }
}

/// A fault kind's declaration: what it is, its keys, how it is drawn, and what it means to the checkers
/// and the report. The two things a `Spec` cannot hold are named in the module doc.
pub struct Spec {
    pub kind: FaultKind,
    /// What scenario files write after `kind =`, and results and histories show (the variant's
    /// serialized name: a test checks they agree).
    pub name: &'static str,
    /// What it does, for `locksim list faults` (its keys follow, from `keys`).
    pub doc: &'static str,
    /// The keys it takes beside `at`, `kind`, `target` and `on`, in the order a written-out fault lists them.
    pub keys: &'static [Key],
    /// The action from its keys, as the scenario file's reader found them (required keys are present).
    pub build: fn(FaultParams) -> Action,
    /// Its keys back from an action: `build(params(a)) == a` (written-out schedules, shrinking).
    pub params: fn(&Action) -> FaultParams,
    /// The parameters in words, for the history: part of every history hash, so never reworded lightly.
    pub detail: fn(&FaultParams) -> String,
    /// How the nemesis draws one, or why it never does.
    pub nemesis: Nemesis,
    /// What it means to the rest of locksim: whom it may hit, the checkers, timelines and suites.
    pub means: Meaning,
}

/// What a fault kind means beyond its keys. Most kinds are [`Meaning::LASTING`] with a field or two changed.
#[derive(Clone, Copy)]
pub struct Meaning {
    /// Why `on` cannot start it, if it cannot.
    pub not_aimed: Option<&'static str>,
    /// It hits a server (a connection's server end, a replicated master): the aimed nemesis keeps the
    /// server it drew rather than aiming at the client whose event started it.
    pub on_servers: bool,
    /// It needs a master with a replica (`[backend] replicas = 1`): only such a node is its target.
    pub needs_replica: bool,
    /// It acts on a replicated cluster's member alone: only such a member (or a role naming one) that
    /// can take it is its target.
    pub needs_member: Option<MemberNeed>,
    /// It kills the node's process or host: its waits and holds end, its volatile state is lost, and a
    /// later `restart` ends it.
    pub crash: bool,
    /// It brings back a node a crash left down: that crash ends.
    pub revives: bool,
    /// It ends every belief its target had, and its workers' (holds end there: a crash, a restart, a
    /// failover's dead master).
    pub ends_beliefs: bool,
    /// It is in force from its start to its end (or the run's end, when it has none), disturbing the
    /// waiters it concerns meanwhile (`starvation`). An instant one (a restart, a failover) ends their
    /// stretches at once instead.
    pub in_force: bool,
    /// How the report's timeline draws it in its target's lane while it lasts.
    pub shade: Shade,
    /// The hazards a scenario can reach only with a fault of this kind (or of another kind listing
    /// them): a suite requiring one of them of a scenario with none of these faults is refused.
    pub brings: &'static [Hazard],
}

impl Meaning {
    /// A fault on any one node that lasts until its end, ends nothing and brings no hazard of its own.
    pub const LASTING: Meaning = Meaning {
        not_aimed: None,
        on_servers: false,
        needs_replica: false,
        needs_member: None,
        crash: false,
        revives: false,
        ends_beliefs: false,
        in_force: true,
        shade: Shade::Disturbed,
        brings: &[],
    };
}

/// Which members of a replicated cluster a member's fault can hit ([`Meaning::needs_member`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberNeed {
    /// A member whose consensus loop runs apart from its client side ([`Topology::stallable`]).
    Stallable,
    /// A member that applies its leader's commits ([`Topology::laggable`]).
    Laggable,
}

impl MemberNeed {
    /// The members (and roles) of `topo` that qualify.
    pub fn members(self, topo: &Topology) -> &[String] {
        match self {
            MemberNeed::Stallable => &topo.stallable,
            MemberNeed::Laggable => &topo.laggable,
        }
    }

    /// What the fault does and which targets qualify, for the error naming a target that does not.
    pub fn what(self) -> (&'static str, &'static str) {
        match self {
            MemberNeed::Stallable => (
                "stops a cluster member's consensus loop while its client side answers",
                "an etcd cluster's member or \"leader\", with [backend] servers = 3",
            ),
            MemberNeed::Laggable => (
                "slows the apply of a member that follows a leader",
                "a ZooKeeper ensemble's member or \"holder-server\", an etcd cluster's member or \"leader\", \
                 with [backend] servers = 3",
            ),
        }
    }
}

/// How the nemesis draws a fault of a kind: `(rng, duration, topology)`, with the duration drawn from
/// `[faults.random] duration`, gives its target and keys, or `None` when the topology has nothing it
/// could hit. Every draw comes from the nemesis stream, in a fixed order: part of a seed's schedule.
pub type Draw = fn(&mut ChaCha8Rng, Duration, &Topology) -> Option<(Target, FaultParams)>;

/// Whether `[faults.random] kinds` may list a kind.
pub enum Nemesis {
    Draws(Draw),
    /// Never drawn: the reason is the error for a scenario that lists it.
    Never(&'static str),
}

/// The values of a fault's keys: each kind reads the ones it declares ([`Spec::keys`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultParams {
    pub duration: Option<Duration>,
    pub latency: Option<Duration>,
    pub delta_ms: Option<i64>,
    pub rate: Option<f64>,
    pub peers: Vec<String>,
}

/// A key a fault kind takes.
pub struct Key {
    pub slot: Slot,
    /// `Some(what)`: the key must be given, and a file without it is told `what` it is.
    pub required: Option<&'static str>,
    /// For `locksim list faults`, after its name: what leaving it out means, or its unit (may be empty).
    pub doc: &'static str,
}

impl Key {
    fn describe(&self) -> String {
        match self.doc {
            "" => self.slot.name().to_string(),
            doc => format!("{} ({doc})", self.slot.name()),
        }
    }
}

/// What a key holds, and so how it is read and written: its name in scenario files is the slot's.
pub enum Slot {
    /// `duration = "10s"`: how long the fault lasts.
    Duration,
    /// `latency = "200ms"`.
    Latency,
    /// `delta = "-3s"`: a signed duration, kept in whole milliseconds.
    Delta,
    /// `rate = 0.5`: a number in the range.
    Rate(Range<f64>),
    /// `peers = ["client-1"]`: other nodes of the scenario (empty: every other node).
    Peers,
}

impl Slot {
    pub fn name(&self) -> &'static str {
        match self {
            Slot::Duration => "duration",
            Slot::Latency => "latency",
            Slot::Delta => "delta",
            Slot::Rate(_) => "rate",
            Slot::Peers => "peers",
        }
    }
}

/// A fault's bar in its target's timeline lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shade {
    /// Frozen (a pause).
    Paused,
    /// Dead (a crash).
    Down,
    /// Cut off (a partition, a clog).
    Cut,
    /// Anything else that lasts: slowed, lossy, its clock off.
    Disturbed,
}

/// `for 10s`, or `until the end` for a fault without a duration: how details say how long.
pub(super) fn for_how_long(d: Option<Duration>) -> String {
    d.map_or("until the end".to_string(), |d| format!("for {}", fmt_duration(d)))
}
