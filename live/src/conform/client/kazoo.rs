//! kazoo's client library under a fault: the model's client speaking as kazoo 2.10
//! ([`Library::Kazoo`]) against the real kazoo (`scenarios/real/.venv`), on the plans of `zk-client`
//! ([`super::zk`]): a short cut, a cut past the session's expiry, a server kill. The plans, the model's
//! world and the play are `zk-client`'s; only the real client (a small Python driver,
//! `scenarios/real/adapters/kazoo_conform.py`, run with the venv's python in the lane's namespace) and
//! the library the model speaks differ — and the margins, where kazoo draws at random:
//! - its pings go out `read_timeout/2 − jitter` after the last send, the jitter (10–400 ms) drawn anew
//!   each time round its loop, and it gives up on an unanswered ping after the next such wait: the
//!   moment it is `disconnected` in a cut (and its request in flight fails) hangs on draws from the seed
//!   on one side and from Python's `random` on the other — whether a ping was already out when the
//!   request went into the cut among them — and falls anywhere in a span of T/3 + 380 ms;
//! - it re-attaches on a jittered exponential backoff (0.1 s × uniform(0.6, 1.4), each next delay twice
//!   the last sleep): after a server kill the attempt that finds the server back comes seconds apart on
//!   the two sides (the real server also takes a second or two to start), and with it the answer to the
//!   `get` kazoo held meanwhile;
//! - after a long cut it learns of the expiry at the first attempt after the heal, as the Java client
//!   does (the same wide margin as `zk-client`'s, for the same reason).

use super::netns::Netns;
use super::zk::{
    model_as, play_real, Plan, RealClient, Said, ZkClientSide, ZkFault, CREATED, DISCONNECTED, EXPIRED, GET_EXPIRED,
    GET_LOST, GOT, NO_NODE, RECONNECTED,
};
use super::{ClientFamily, Margin, Timeline};
use crate::servers::{Launcher, Server};
use locksim_sim::backend::zk::client::Library;
use locksim_sim::rng::ChaCha8Rng;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kazoo client side.
#[derive(Default)]
pub struct KazooClientSide;

impl ClientFamily for KazooClientSide {
    const NAME: &'static str = "kazoo-client";
    const ABOUT: &'static str =
        "Client side: kazoo 2.10 (scenarios/real/.venv, made by scenarios/real/setup) on zk-client's \
         plans — its jittered pings, its backoff, the requests it holds while disconnected (needs root).";
    type Plan = Plan;

    fn server() -> &'static Launcher {
        ZkClientSide::server()
    }

    fn plan(rng: &mut ChaCha8Rng) -> Plan {
        ZkClientSide::plan(rng)
    }

    fn kind(plan: &Plan) -> &'static str {
        ZkClientSide::kind(plan)
    }

    fn model(&self, plan: &Plan, seed: u64) -> Timeline {
        model_as(plan, seed, false, Library::Kazoo)
    }

    fn real(&self, plan: &Plan, server: &mut Server, net: &Netns) -> anyhow::Result<Timeline> {
        play_real(plan, server, net, &KAZOO)
    }

    fn margin(plan: &Plan, what: &str) -> Margin {
        margin(plan, what)
    }

    fn undecided(plan: &Plan, model: &Timeline, real: &Timeline) -> Option<String> {
        undecided(plan, model, real)
    }
}

/// After a server kill, whether kazoo re-attaches its session or finds it expired is a draw: its
/// backoff's gaps grow past a second or two by the time the server is back, and the restarted server
/// gives each session a fresh T from when it has loaded — which the real server does a second or two
/// after the model's. When exactly one side found the session expired, and no sooner than T after the
/// restart (so not an early expiry: the restarted server renewed it), the outcome turned on the draws
/// and the real server's start, not on a rule: undecided.
fn undecided(plan: &Plan, model: &Timeline, real: &Timeline) -> Option<String> {
    let ZkFault::ServerKill { down_ms } = plan.fault else { return None };
    let expired_at = |t: &Timeline| t.at(EXPIRED);
    let reattached = |t: &Timeline| t.saw(RECONNECTED);
    let renewed_until = plan.fault_ms + down_ms + plan.timeout_ms;
    let one_side = match (expired_at(model), expired_at(real)) {
        (None, Some(at)) if reattached(model) && !reattached(real) => Some(("real", at)),
        (Some(at), None) if reattached(real) && !reattached(model) => Some(("model's", at)),
        _ => None,
    };
    let (side, at) = one_side.filter(|(_, at)| *at + EXPIRY_TICK_MS >= renewed_until)?;
    Some(format!(
        "{} kazoo's backoff came back at {at} ms, after the restarted server had expired the {side} session \
         (the other re-attached in time): a draw of the backoff and the real server's start time",
        super::UNDECIDED
    ))
}

/// The conformance server's tickTime: a session expires on a tick, up to one before T is up.
const EXPIRY_TICK_MS: u64 = 200;

/// How far apart kazoo's disconnection in a cut may fall on the two sides: from the request sent into
/// the cut (its last send), it is dropped after one wait of `read_timeout/2 − jitter` if a ping was
/// already out unanswered when the request went, or after two (a ping, then the wait for its answer)
/// if not — and which, when the ping before the cut falls near it, is itself a draw of the jitter. So
/// from `read_timeout/2 − 400 ms` to `read_timeout − 20 ms` after the request: `read_timeout/2 + 380 ms`
/// wide (read timeout = T·2/3).
fn disconnect_spread_ms(plan: &Plan) -> u64 {
    plan.timeout_ms / 3 + 380
}

/// How far from the model's time a real event `what` of `plan` may come, for kazoo.
pub fn margin(plan: &Plan, what: &str) -> Margin {
    let kill = matches!(plan.fault, ZkFault::ServerKill { .. });
    let timely = Margin { early_ms: 150, late_ms: 300 };
    match what {
        // The backoff's attempts are random on both sides, and the real server starts a second or two
        // after the model's: the attempt that finds it back can be one doubling later, or earlier.
        RECONNECTED | GOT if kill => Margin { early_ms: 5000, late_ms: 10_000 },
        // As `zk-client`'s: the re-attach after a long cut waits behind what the model's old connection
        // still holds.
        EXPIRED => Margin { early_ms: plan.timeout_ms + 3000, late_ms: plan.timeout_ms + 3000 },
        // In a cut: the ping jitter, drawn on each side.
        DISCONNECTED | GET_LOST if !kill => Margin {
            early_ms: timely.early_ms + disconnect_spread_ms(plan),
            late_ms: timely.late_ms + disconnect_spread_ms(plan),
        },
        _ => timely,
    }
}

/// The driver beside the adapters, and the virtualenv `scenarios/real/setup` makes.
fn real_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/real")
}

/// kazoo's driver, run by the venv's python.
const KAZOO: RealClient = RealClient { name: "kazoo (scenarios/real/adapters/kazoo_conform.py)", spawn, line };

fn spawn(addr: std::net::SocketAddr, timeout_ms: u64) -> anyhow::Result<std::process::Child> {
    let dir = real_dir();
    let python = dir.join(".venv/bin/python");
    if !python.exists() {
        anyhow::bail!(
            "kazoo-client needs kazoo in {}: run scenarios/real/setup (python3 with venv; Debian: python3-venv)",
            python.display()
        );
    }
    let mut driver = Command::new(&python);
    driver
        .arg(dir.join("adapters/kazoo_conform.py"))
        .args([addr.to_string(), timeout_ms.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    super::spawn_dying_with_locksim(&mut driver)
        .map_err(|e| anyhow::anyhow!("cannot start kazoo's driver with {}: {e}", python.display()))
}

/// The driver's lines: `<CLOCK_MONOTONIC ns> <event>`, stamped by the driver when kazoo told it (read
/// `at`, the stamp is turned into an `Instant` of the same clock).
fn line(line: &str, at: Instant, _path: &str) -> Said {
    let Some((ns, what)) = line.trim().split_once(' ') else { return Said::Nothing };
    let Ok(ns) = ns.parse::<u64>() else { return Said::Nothing };
    let when = stamped(ns, at);
    let what = match what {
        "connected" => return Said::Connected(when),
        "disconnected" => DISCONNECTED,
        "reconnected" => RECONNECTED,
        "expired" => EXPIRED,
        "create /x: ok" => CREATED,
        "get /x: ok" => GOT,
        "get /x: connection loss" => GET_LOST,
        "get /x: no node" => NO_NODE,
        "get /x: session expired" => GET_EXPIRED,
        _ => return Said::Nothing,
    };
    Said::Event(when, what)
}

/// The `Instant` of CLOCK_MONOTONIC reading `ns` (Rust's `Instant` is that clock on Linux): `at`
/// (when the line was read) less how long ago `ns` was.
fn stamped(ns: u64, at: Instant) -> Instant {
    let now_ns = monotonic_ns();
    let read_ns = now_ns.saturating_sub(at.elapsed().as_nanos() as u64);
    match read_ns.checked_sub(ns) {
        Some(before) => at.checked_sub(Duration::from_nanos(before)).unwrap_or(at),
        None => at + Duration::from_nanos(ns - read_ns),
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_holds_a_request_through_a_server_kill_and_answers_it_on_the_re_attached_session() {
        // kazoo queues a request made while disconnected; the Java client fails it at the next refused
        // attempt.
        let p = Plan { timeout_ms: 4000, fault_ms: 1000, fault: ZkFault::ServerKill { down_ms: 3000 } };
        let kazoo = KazooClientSide.model(&p, 1);
        assert_eq!(kazoo.whats(), [CREATED, DISCONNECTED, GOT, GOT, RECONNECTED], "{kazoo}");
        let at = |what| kazoo.at(what).unwrap();
        assert!(at(GOT) >= at(RECONNECTED) && at(GOT) >= 4000, "answered once the server is back: {kazoo}");
        let java = ZkClientSide.model(&p, 1);
        assert!(java.saw(GET_LOST), "{java}");
    }

    fn timeline(events: &[(u64, &str)]) -> Timeline {
        let mut t = Timeline::default();
        for (at, what) in events {
            t.push(*at, *what);
        }
        t
    }

    #[test]
    fn a_session_lost_to_the_backoff_on_one_side_only_is_undecided_and_an_early_expiry_is_not() {
        // Seed 28 of a run: killed at 1.1 s, back at 4.1 s; the real kazoo's next attempt came at 9.3 s.
        let p = Plan { timeout_ms: 4000, fault_ms: 1100, fault: ZkFault::ServerKill { down_ms: 3000 } };
        let model = timeline(&[(313, CREATED), (1109, DISCONNECTED), (6141, RECONNECTED), (6152, GOT), (11108, GOT)]);
        let real =
            timeline(&[(302, CREATED), (1107, DISCONNECTED), (9305, EXPIRED), (9306, GET_EXPIRED), (11104, NO_NODE)]);
        assert!(undecided(&p, &model, &real).is_some_and(|why| why.starts_with(crate::conform::client::UNDECIDED)));
        // Expired before the restarted server could have: a mismatch to show, not a draw.
        let early = timeline(&[(302, CREATED), (1107, DISCONNECTED), (5000, EXPIRED), (11104, NO_NODE)]);
        assert_eq!(undecided(&p, &model, &early), None);
        assert_eq!(undecided(&p, &model, &model), None);
    }

    #[test]
    fn a_driver_line_is_stamped_by_the_drivers_clock() {
        let at = Instant::now();
        let ns = monotonic_ns() - 5_000_000;
        match line(&format!("{ns} disconnected"), at, "/x0") {
            Said::Event(when, DISCONNECTED) => {
                let ago = at.duration_since(when).as_millis();
                assert!((4..7).contains(&ago), "{ago} ms before it was read");
            }
            _ => panic!("an event"),
        }
        assert!(matches!(line("zk: some log line", at, "/x0"), Said::Nothing));
    }
}
