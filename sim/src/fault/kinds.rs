//! The fault kinds, each one [`Spec`] (what a declaration holds: `kind.rs`).
//!
//! The nemesis' draws are part of every seed's schedule: a draw function's calls on the stream, and
//! their order, are as fixed as a history's format.

use super::kind::{for_how_long, Action, FaultKind, FaultParams, Key, Meaning, MemberNeed, Nemesis, Shade, Slot, Spec};
use super::{fmt_duration, Target, Topology};
use crate::hazard::Hazard;
use crate::rng::{ChaCha8Rng, Rng};

/// Every kind's declaration, in [`FaultKind::ALL`]'s order.
pub(super) static SPECS: [&Spec; 14] = [
    &PAUSE,
    &CRASH,
    &HOST_CRASH,
    &RESTART,
    &PARTITION,
    &CLOG,
    &DELAY,
    &LOSS,
    &DROP_REPLY,
    &CLOCK_JUMP,
    &CLOCK_DRIFT,
    &FAILOVER,
    &STALL,
    &LAG,
];

pub static PAUSE: Spec = Spec {
    kind: FaultKind::Pause,
    name: "pause",
    doc: "stop-the-world pause (GC): every task of the node freezes, timers fire late",
    keys: &[Key { slot: Slot::Duration, required: Some("how long the node stays paused"), doc: "" }],
    build: |p| Action::Pause { duration: required(p.duration) },
    params: |a| match a {
        Action::Pause { duration } => FaultParams { duration: Some(*duration), ..FaultParams::default() },
        _ => unreachable!("{a:?} is not a pause"),
    },
    detail: |p| for_how_long(p.duration),
    // Half of the pauses hit the holder: a pause matters most where the lock is held.
    nemesis: Nemesis::Draws(|rng, d, topo| {
        let target = if rng.gen_bool(0.5) { Target::Holder } else { any_node(rng, topo) };
        Some((target, lasting(d)))
    }),
    means: Meaning { shade: Shade::Paused, brings: &[Hazard::StaleHolderResumed], ..Meaning::LASTING },
};

/// `crash` and `host-crash`: one action, two ways to die.
const fn crash(host: bool) -> Spec {
    Spec {
        kind: if host { FaultKind::HostCrash } else { FaultKind::Crash },
        name: if host { "host-crash" } else { "crash" },
        doc: if host {
            "the node's host dies (power loss, kernel panic): silence, peers learn only by their timeouts and \
             keep-alive; volatile state lost"
        } else {
            "kill the node's process (OOM, deploy, segfault): its kernel closes its connections at once, peers see \
             them reset; volatile state lost"
        },
        keys: &[Key { slot: Slot::Duration, required: None, doc: "restart after it; omit to stay down" }],
        build: if host {
            |p| Action::Crash { restart_after: p.duration, host: true }
        } else {
            |p| Action::Crash { restart_after: p.duration, host: false }
        },
        params: |a| match a {
            Action::Crash { restart_after, .. } => FaultParams { duration: *restart_after, ..FaultParams::default() },
            _ => unreachable!("{a:?} is not a crash"),
        },
        detail: |p| p.duration.map_or("stays down".into(), |d| format!("restart after {}", fmt_duration(d))),
        nemesis: Nemesis::Draws(|rng, d, topo| Some((any_node(rng, topo), lasting(d)))),
        means: Meaning {
            crash: true,
            ends_beliefs: true,
            shade: Shade::Down,
            brings: &[Hazard::HolderCrashed],
            ..Meaning::LASTING
        },
    }
}

pub static CRASH: Spec = crash(false);
pub static HOST_CRASH: Spec = crash(true);

pub static RESTART: Spec = Spec {
    kind: FaultKind::Restart,
    name: "restart",
    doc: "restart a crashed node",
    keys: &[],
    build: |_| Action::Restart,
    params: |_| FaultParams::default(),
    detail: |_| String::new(),
    nemesis: Nemesis::Never("the nemesis restarts what it crashes; \"restart\" is for written schedules"),
    means: Meaning {
        not_aimed: Some("a restart brings back a node a crash left down; aim the crash (with a `duration`) instead"),
        revives: true,
        ends_beliefs: true,
        in_force: false,
        brings: &[Hazard::HolderCrashed],
        ..Meaning::LASTING
    },
};

/// `partition` and `clog`: both ways, or the node's outgoing messages only.
const fn cut(both_ways: bool) -> Spec {
    Spec {
        kind: if both_ways { FaultKind::Partition } else { FaultKind::Clog },
        name: if both_ways { "partition" } else { "clog" },
        doc: if both_ways {
            "cut the node off in both directions"
        } else {
            "drop the node's outgoing messages only (one-way partition)"
        },
        keys: if both_ways { PARTITION_KEYS } else { CLOG_KEYS },
        build: if both_ways {
            |p| Action::Partition { peers: p.peers, duration: p.duration }
        } else {
            |p| Action::Clog { peers: p.peers, duration: p.duration }
        },
        params: |a| match a {
            Action::Partition { peers, duration } | Action::Clog { peers, duration } => {
                FaultParams { duration: *duration, peers: peers.clone(), ..FaultParams::default() }
            }
            _ => unreachable!("{a:?} is not a cut"),
        },
        detail: if both_ways {
            |p| format!("from {} {}", peers(&p.peers), for_how_long(p.duration))
        } else {
            |p| format!("outgoing to {} {}", peers(&p.peers), for_how_long(p.duration))
        },
        nemesis: Nemesis::Draws(|rng, d, topo| Some((any_node(rng, topo), lasting(d)))),
        means: Meaning { shade: Shade::Cut, ..Meaning::LASTING },
    }
}

const PARTITION_KEYS: &[Key] = &[
    Key { slot: Slot::Duration, required: None, doc: "" },
    Key { slot: Slot::Peers, required: None, doc: "default: every other node" },
];
const CLOG_KEYS: &[Key] =
    &[Key { slot: Slot::Duration, required: None, doc: "" }, Key { slot: Slot::Peers, required: None, doc: "" }];

pub static PARTITION: Spec = cut(true);
pub static CLOG: Spec = cut(false);

pub static DELAY: Spec = Spec {
    kind: FaultKind::Delay,
    name: "delay",
    doc: "add latency to every message to or from the node",
    keys: &[
        Key { slot: Slot::Duration, required: None, doc: "" },
        Key { slot: Slot::Latency, required: Some("the extra latency, e.g. \"200ms\""), doc: "" },
    ],
    build: |p| Action::Delay { latency: required(p.latency), duration: p.duration },
    params: |a| match a {
        Action::Delay { latency, duration } => {
            FaultParams { duration: *duration, latency: Some(*latency), ..FaultParams::default() }
        }
        _ => unreachable!("{a:?} is not a delay"),
    },
    detail: |p| format!("+{} {}", fmt_duration(required(p.latency)), for_how_long(p.duration)),
    nemesis: Nemesis::Draws(|rng, d, topo| {
        Some((any_node(rng, topo), FaultParams { latency: Some(d / 10), ..lasting(d) }))
    }),
    means: Meaning::LASTING,
};

pub static LOSS: Spec = Spec {
    kind: FaultKind::Loss,
    name: "loss",
    doc: "lose each transmission to or from the node with a probability: TCP retransmits it (200 ms, doubling), so \
          messages arrive late and in order, none removed",
    keys: &[
        Key { slot: Slot::Duration, required: None, doc: "" },
        Key { slot: Slot::Rate(0.0..1.0), required: Some("the probability of losing each message, e.g. 0.3"), doc: "" },
    ],
    build: |p| Action::Loss { rate: required(p.rate), duration: p.duration },
    params: |a| match a {
        Action::Loss { rate, duration } => {
            FaultParams { duration: *duration, rate: Some(*rate), ..FaultParams::default() }
        }
        _ => unreachable!("{a:?} is not a loss"),
    },
    detail: rate_for_how_long,
    nemesis: Nemesis::Draws(|rng, d, topo| Some((any_node(rng, topo), FaultParams { rate: Some(0.5), ..lasting(d) }))),
    means: Meaning::LASTING,
};

pub static DROP_REPLY: Spec = Spec {
    kind: FaultKind::DropReply,
    name: "drop-reply",
    doc: "a server applies requests but loses each reply with a probability, which breaks the connection (TCP \
          loses no data otherwise): the caller does not know the outcome and reconnects",
    keys: &[
        Key { slot: Slot::Duration, required: None, doc: "" },
        Key { slot: Slot::Rate(0.0..1.0), required: None, doc: "default 1.0" },
    ],
    build: |p| Action::DropReply { rate: p.rate.unwrap_or(1.0), duration: p.duration },
    params: |a| match a {
        Action::DropReply { rate, duration } => {
            FaultParams { duration: *duration, rate: Some(*rate), ..FaultParams::default() }
        }
        _ => unreachable!("{a:?} is not a drop-reply"),
    },
    detail: rate_for_how_long,
    nemesis: Nemesis::Draws(|rng, d, topo| {
        Some((pick(rng, &topo.servers), FaultParams { rate: Some(1.0), ..lasting(d) }))
    }),
    means: Meaning { on_servers: true, ..Meaning::LASTING },
};

pub static CLOCK_JUMP: Spec = Spec {
    kind: FaultKind::ClockJump,
    name: "clock-jump",
    doc: "step the node's wall clock",
    keys: &[Key {
        slot: Slot::Delta,
        required: Some("how far the clock steps, e.g. \"10s\" or \"-3s\""),
        doc: "e.g. \"10s\" or \"-3s\"",
    }],
    build: |p| Action::ClockJump { delta_ms: required(p.delta_ms) },
    params: |a| match a {
        Action::ClockJump { delta_ms } => FaultParams { delta_ms: Some(*delta_ms), ..FaultParams::default() },
        _ => unreachable!("{a:?} is not a clock jump"),
    },
    detail: |p| format!("{:+}ms", required(p.delta_ms)),
    // Forward or back by the drawn duration.
    nemesis: Nemesis::Draws(|rng, d, topo| {
        let ms = d.as_millis() as i64;
        let delta_ms = if rng.gen_bool(0.5) { ms } else { -ms };
        Some((any_node(rng, topo), FaultParams { delta_ms: Some(delta_ms), ..FaultParams::default() }))
    }),
    means: Meaning { brings: &[Hazard::ClockJumpDuringHold], ..Meaning::LASTING },
};

pub static CLOCK_DRIFT: Spec = Spec {
    kind: FaultKind::ClockDrift,
    name: "clock-drift",
    doc: "run the node's clock fast or slow",
    keys: &[
        Key {
            slot: Slot::Rate(0.0..100.0),
            required: Some("the clock's speed, e.g. 1.5 (1.0 is exact)"),
            doc: "e.g. 1.5",
        },
        Key { slot: Slot::Duration, required: None, doc: "omit: for good" },
    ],
    build: |p| Action::ClockDrift { rate: required(p.rate), duration: p.duration },
    params: |a| match a {
        Action::ClockDrift { rate, duration } => {
            FaultParams { duration: *duration, rate: Some(*rate), ..FaultParams::default() }
        }
        _ => unreachable!("{a:?} is not a clock drift"),
    },
    detail: rate_for_how_long,
    // Twice as fast or half as fast.
    nemesis: Nemesis::Draws(|rng, d, topo| {
        let rate = if rng.gen_bool(0.5) { 2.0 } else { 0.5 };
        Some((any_node(rng, topo), FaultParams { rate: Some(rate), ..lasting(d) }))
    }),
    means: Meaning::LASTING,
};

pub static FAILOVER: Spec = Spec {
    kind: FaultKind::Failover,
    name: "failover",
    doc: "Sentinel-style failover: the master dies and its replica is promoted, losing unreplicated writes",
    keys: &[],
    build: |_| Action::Failover,
    params: |_| FaultParams::default(),
    detail: |_| String::new(),
    nemesis: Nemesis::Draws(|rng, _, topo| match topo.failover_masters.is_empty() {
        true => None,
        false => Some((pick(rng, &topo.failover_masters), FaultParams::default())),
    }),
    means: Meaning {
        on_servers: true,
        needs_replica: true,
        ends_beliefs: true,
        in_force: false,
        brings: &[Hazard::LockKeyLostInFailover],
        ..Meaning::LASTING
    },
};

pub static STALL: Spec = Spec {
    kind: FaultKind::Stall,
    name: "stall",
    doc: "a cluster member's consensus loop stops (a disk that blocks its log's writes) while its client side \
          goes on answering; etcd clusters only (`target = \"leader\"`: etcd#15247)",
    keys: &[Key { slot: Slot::Duration, required: None, doc: "omit: until the end" }],
    build: |p| Action::Stall { duration: p.duration },
    params: |a| match a {
        Action::Stall { duration } => FaultParams { duration: *duration, ..FaultParams::default() },
        _ => unreachable!("{a:?} is not a stall"),
    },
    detail: |p| for_how_long(p.duration),
    nemesis: Nemesis::Never("a stall is aimed by hand at a cluster member: write it in [[faults.schedule]]"),
    means: Meaning {
        on_servers: true,
        needs_member: Some(MemberNeed::Stallable),
        shade: Shade::Paused,
        ..Meaning::LASTING
    },
};

pub static LAG: Spec = Spec {
    kind: FaultKind::Lag,
    name: "lag",
    doc: "a cluster member applies what its leader commits `latency` late (an apply loop behind its log): its \
          reads, watches and answers run behind; ZooKeeper followers and etcd members",
    keys: &[
        Key { slot: Slot::Duration, required: None, doc: "omit: until the end" },
        Key { slot: Slot::Latency, required: Some("how far the apply runs behind the commits, e.g. \"2s\""), doc: "" },
    ],
    build: |p| Action::Lag { latency: required(p.latency), duration: p.duration },
    params: |a| match a {
        Action::Lag { latency, duration } => {
            FaultParams { duration: *duration, latency: Some(*latency), ..FaultParams::default() }
        }
        _ => unreachable!("{a:?} is not a lag"),
    },
    detail: |p| format!("{} behind {}", fmt_duration(required(p.latency)), for_how_long(p.duration)),
    nemesis: Nemesis::Never("a lag is aimed by hand at a cluster member: write it in [[faults.schedule]]"),
    means: Meaning { on_servers: true, needs_member: Some(MemberNeed::Laggable), ..Meaning::LASTING },
};

/// A key the reader made sure of ([`Key::required`]).
fn required<T>(value: Option<T>) -> T {
    value.expect("a required key: the scenario reader refuses a fault without it")
}

fn lasting(d: std::time::Duration) -> FaultParams {
    FaultParams { duration: Some(d), ..FaultParams::default() }
}

fn rate_for_how_long(p: &FaultParams) -> String {
    format!("rate {} {}", required(p.rate), for_how_long(p.duration))
}

fn peers(p: &[String]) -> String {
    if p.is_empty() {
        "everyone".to_string()
    } else {
        p.join(",")
    }
}

/// Any client or server, drawn evenly.
fn any_node(rng: &mut ChaCha8Rng, topo: &Topology) -> Target {
    let all: Vec<&String> = topo.clients.iter().chain(&topo.servers).collect();
    Target::Node(all[rng.gen_range(0..all.len())].clone())
}

fn pick(rng: &mut ChaCha8Rng, from: &[String]) -> Target {
    Target::Node(from[rng.gen_range(0..from.len())].clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_kind_is_declared_once_in_order_under_its_serialized_name() {
        for (i, kind) in FaultKind::ALL.into_iter().enumerate() {
            assert_eq!(SPECS[i].kind, kind);
            let serialized = serde_json::to_value(kind).unwrap();
            assert_eq!(serialized.as_str(), Some(kind.name()), "{kind:?}");
            assert_eq!(FaultKind::parse(kind.name()), Some(kind));
        }
    }

    #[test]
    fn an_action_is_rebuilt_from_its_keys_and_halves_by_its_duration() {
        let d = Duration::from_secs(4);
        let peers = vec!["client-1".to_string()];
        let actions = [
            Action::Pause { duration: d },
            Action::Crash { restart_after: Some(d), host: false },
            Action::Crash { restart_after: None, host: true },
            Action::Restart,
            Action::Partition { peers: peers.clone(), duration: Some(d) },
            Action::Clog { peers, duration: None },
            Action::Delay { latency: d / 10, duration: Some(d) },
            Action::Loss { rate: 0.3, duration: Some(d) },
            Action::DropReply { rate: 1.0, duration: None },
            Action::ClockJump { delta_ms: -3000 },
            Action::ClockDrift { rate: 1.5, duration: Some(d) },
            Action::Failover,
            Action::Stall { duration: Some(d) },
            Action::Lag { latency: d / 2, duration: None },
        ];
        for a in &actions {
            let spec = a.kind().spec();
            assert_eq!(&(spec.build)(a.params()), a);
            let declared: Vec<&str> = spec.keys.iter().map(|k| k.slot.name()).collect();
            assert_eq!(
                declared.contains(&"duration"),
                !matches!(a, Action::Restart | Action::ClockJump { .. } | Action::Failover),
                "{a:?}"
            );
            if a.duration().is_some() {
                assert_eq!(a.lasting(d / 2).duration(), Some(d / 2));
                assert_eq!(a.lasting(d / 2).kind(), a.kind());
            }
        }
        assert_eq!(actions[4].detail(), "from client-1 for 4s");
        assert_eq!(actions[2].detail(), "stays down");
        assert_eq!(actions[9].detail(), "-3000ms");
    }

    #[test]
    fn list_faults_names_each_kinds_keys() {
        assert_eq!(
            FaultKind::Delay.describe(),
            "add latency to every message to or from the node; keys: duration, latency"
        );
        assert_eq!(FaultKind::Restart.describe(), "restart a crashed node");
        assert!(FaultKind::Crash.describe().ends_with("; keys: duration (restart after it; omit to stay down)"));
    }
}
