//! Client conformance: the model's client side — its client library, its network, what a fault does
//! to a connection — against a real client of a real server. Server conformance ([`super`]) drives the
//! model's state machine directly, so it can never see a client library that fails a request too late,
//! a keep-alive that gives up one probe early, or a crash that closes nothing; here the verdict-deciding
//! behaviours of the client side are played for real.
//!
//! From a seed, a family draws a *plan*: a client's settings, what it does when, and one fault on its
//! connection (a cut, its process killed). The plan is played twice:
//! - on the model: a simulated world (the model's server, network and client library, the fault as a
//!   scenario's fault), and
//! - for real: the real server and a real client, both in a private network namespace
//!   ([`netns`]) where a cut drops segments as they arrive — TCP retransmits into it and
//!   keep-alive probes go unanswered, as on a real network (a user-space proxy would answer them).
//!
//! Each play writes a [`Timeline`]: what the client and an observer saw, and when. They agree when they
//! hold the same events in the same order, each real one within its [`Margin`] of the model's time: a
//! family states per event how early or late the real one may come (a loaded machine is late by tens
//! of milliseconds; a real client library's random reconnect delay spreads some events by a second).
//! A real play that could not keep the plan's times is *inconclusive*: played once more, never reported
//! as a mismatch.

pub mod etcd;
pub mod kazoo;
pub mod netns;
pub mod sql;
pub mod zk;

use crate::servers::{Launcher, Server};
use locksim_sim::rng::{stream, ChaCha8Rng, Stream};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One thing the client (or the observer beside it) saw, at `at_ms` of the plan's time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    pub at_ms: u64,
    pub what: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>6} ms  {}", self.at_ms, self.what)
    }
}

/// What one play saw, in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Timeline(pub Vec<Event>);

impl Timeline {
    pub fn push(&mut self, at_ms: u64, what: impl Into<String>) {
        self.0.push(Event { at_ms, what: what.into() });
    }

    /// When `what` was first seen.
    pub fn at(&self, what: &str) -> Option<u64> {
        self.0.iter().find(|e| e.what == what).map(|e| e.at_ms)
    }

    /// Whether `what` was seen.
    pub fn saw(&self, what: &str) -> bool {
        self.at(what).is_some()
    }

    /// What was seen, each as often as it was, in alphabetical order.
    pub fn whats(&self) -> Vec<&str> {
        let mut whats: Vec<&str> = self.0.iter().map(|e| e.what.as_str()).collect();
        whats.sort();
        whats
    }

    /// In time order (events of one instant keep the order they were pushed in).
    pub fn sorted(mut self) -> Timeline {
        self.0.sort_by_key(|e| e.at_ms);
        self
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.0 {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

/// How far from the model's time a real event may come and still agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Margin {
    pub early_ms: u64,
    pub late_ms: u64,
}

/// A client library checked against a real one.
pub trait ClientFamily: Sync {
    /// `sql-client`, `zk-client`, `kazoo-client`, `etcd-client`: `locksim conform`'s argument.
    const NAME: &'static str;
    /// One line for `locksim conform --help`: the client, its faults, what is compared, what it needs.
    const ABOUT: &'static str;
    type Plan: fmt::Display + Clone + Send + Sync;

    /// The real server the plans are played on.
    fn server() -> &'static Launcher;
    /// A plan from a random stream.
    fn plan(rng: &mut ChaCha8Rng) -> Self::Plan;
    /// The name of a plan's kind (its fault), for the coverage counts.
    fn kind(plan: &Self::Plan) -> &'static str;
    /// The model's timeline of `plan` (a simulated world run with `seed`).
    fn model(&self, plan: &Self::Plan, seed: u64) -> Timeline;
    /// The real timeline of `plan`: played on `server`, from the calling thread, which is in the
    /// server's network namespace `net`. `Err` with [`Late`] inside: the machine could not keep the
    /// plan's times (inconclusive).
    fn real(&self, plan: &Self::Plan, server: &mut Server, net: &netns::Netns) -> anyhow::Result<Timeline>;
    /// How far from the model's time a real event `what` of `plan` may come.
    fn margin(plan: &Self::Plan, what: &str) -> Margin;
    /// Why `model` and `real` cannot be compared, if they cannot: the plan's outcome turned on
    /// something neither side controls (the real play is then played once more, and if it is
    /// undecided again the seed is inconclusive). None by default.
    fn undecided(_plan: &Self::Plan, _model: &Timeline, _real: &Timeline) -> Option<String> {
        None
    }
}

/// How a reason from [`ClientFamily::undecided`] begins (a late play's says what was late).
pub const UNDECIDED: &str = "undecided:";

/// Start a real client's process so that it dies with locksim, however locksim ends (Ctrl-C
/// included), rather than run on after its play (see `crate::real::client`).
pub fn spawn_dying_with_locksim(command: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    crate::process::die_with_parent(command);
    command.spawn()
}

/// A real play missed a time of the plan by more than it can afford: inconclusive, not a mismatch.
#[derive(Debug)]
pub struct Late(pub String);

impl fmt::Display for Late {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for Late {}

/// How late a real step may start and the play still be compared.
const STEP_MARGIN_MS: u64 = 40;

/// A real play's clock, and the first step it could not start on time.
pub struct Play {
    start: Instant,
    late: Mutex<Option<String>>,
}

impl Play {
    /// A play whose time 0 is `lead` from now (time to set the first steps up).
    pub fn starting_in(lead: Duration) -> Play {
        Play::starting_at(Instant::now() + lead)
    }

    pub fn starting_at(start: Instant) -> Play {
        Play { start, late: Mutex::new(None) }
    }

    /// The play's time now, in ms.
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// The play's time at `t`, in ms.
    pub fn ms_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_millis() as u64
    }

    /// Wait until `ms` of the plan, for step `what`; note it if the step starts too late.
    pub fn at(&self, ms: u64, what: &str) {
        let due = self.start + Duration::from_millis(ms);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let now = self.now_ms();
        if now > ms + STEP_MARGIN_MS {
            self.late.lock().expect("late lock").get_or_insert(format!("{what} at {now} ms, planned at {ms} ms"));
        }
    }

    /// Note it if the play is past `ms` of the plan, by when step `what` should have been done (a
    /// real server's restart that the machine made slow).
    pub fn by(&self, ms: u64, what: &str) {
        let now = self.now_ms();
        if now > ms {
            self.late.lock().expect("late lock").get_or_insert(format!("{what} at {now} ms, due by {ms} ms"));
        }
    }

    /// `Err(Late)` if a step started too late.
    pub fn on_time(self) -> anyhow::Result<()> {
        match self.late.into_inner().expect("late lock") {
            Some(why) => Err(Late(why).into()),
            None => Ok(()),
        }
    }
}

/// What playing one seed showed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Agree,
    /// Agreed on everything compared; the model alone saw these events, which its seed draws and
    /// the real server's own scheduling decides (`ensemble::EnsembleFamily::drawn`).
    DrawnAlone(String),
    Mismatch {
        plan: String,
        model: Timeline,
        real: Timeline,
        why: String,
    },
    Inconclusive(String),
}

/// The plan of `seed` for family `F` (stream `Conformance`, index 1: the server scripts use index 0).
pub fn plan<F: ClientFamily>(seed: u64) -> F::Plan {
    F::plan(&mut stream(seed, Stream::Conformance, 1))
}

/// Play `seed` on the model and on `server` (in namespace `net`); a real play that was late, or
/// [`ClientFamily::undecided`], is played once more.
pub fn check<F: ClientFamily>(
    family: &F,
    server: &mut Server,
    net: &netns::Netns,
    seed: u64,
) -> anyhow::Result<Outcome> {
    let plan = plan::<F>(seed);
    let model = family.model(&plan, seed);
    let mut late = String::new();
    for _ in 0..2 {
        match family.real(&plan, server, net) {
            Ok(real) => {
                if let Some(why) = F::undecided(&plan, &model, &real) {
                    late = why;
                    continue;
                }
                return Ok(match differ(&model, &real, |what| F::margin(&plan, what)) {
                    None => Outcome::Agree,
                    Some(why) => Outcome::Mismatch { plan: plan.to_string(), model, real, why },
                });
            }
            Err(e) => match e.downcast::<Late>() {
                Ok(Late(why)) => late = why,
                Err(e) => return Err(e),
            },
        }
    }
    Ok(Outcome::Inconclusive(late))
}

/// Why `real` does not agree with `model`, if it does not: an event one saw and the other did not, or
/// one outside its margin of the model's time. Events are matched by what they are (the k-th of a kind
/// with the k-th of that kind), not by their order: two events of the same instant, like a release and
/// the grant it makes, may reach the record in either order.
pub fn differ(model: &Timeline, real: &Timeline, margin: impl Fn(&str) -> Margin) -> Option<String> {
    let kth = |t: &Timeline, what: &str, k: usize| t.0.iter().filter(|e| e.what == what).nth(k).cloned();
    let nth_of_its_kind = |t: &Timeline, i: usize| t.0[..i].iter().filter(|e| e.what == t.0[i].what).count();
    for (i, m) in model.0.iter().enumerate() {
        let Some(r) = kth(real, &m.what, nth_of_its_kind(model, i)) else {
            return Some(format!("the real client never saw `{}` (the model did, at {} ms)", m.what, m.at_ms));
        };
        let Margin { early_ms, late_ms } = margin(&m.what);
        if r.at_ms + early_ms < m.at_ms || r.at_ms > m.at_ms + late_ms {
            return Some(format!(
                "`{}` at {} ms for real, {} ms in the model (allowed: {} ms early, {} ms late)",
                m.what, r.at_ms, m.at_ms, early_ms, late_ms
            ));
        }
    }
    let extra = (0..real.0.len()).find(|&i| kth(model, &real.0[i].what, nth_of_its_kind(real, i)).is_none());
    extra.map(|i| format!("the model never saw `{}` (the real client did, at {} ms)", real.0[i].what, real.0[i].at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(events: &[(u64, &str)]) -> Timeline {
        let mut t = Timeline::default();
        for (at, what) in events {
            t.push(*at, *what);
        }
        t
    }

    const M: Margin = Margin { early_ms: 10, late_ms: 100 };

    #[test]
    fn timelines_agree_within_the_margins_and_differ_outside_them() {
        let model = timeline(&[(100, "granted"), (5000, "ended")]);
        assert_eq!(differ(&model, &timeline(&[(95, "granted"), (5090, "ended")]), |_| M), None);
        let early = differ(&model, &timeline(&[(100, "granted"), (4900, "ended")]), |_| M).unwrap();
        assert_eq!(early, "`ended` at 4900 ms for real, 5000 ms in the model (allowed: 10 ms early, 100 ms late)");
        assert!(differ(&model, &timeline(&[(100, "granted"), (5101, "ended")]), |_| M).is_some(), "late");
    }

    #[test]
    fn events_of_one_instant_agree_in_either_order() {
        let model = timeline(&[(100, "granted"), (3433, "observer granted"), (3438, "unlocked")]);
        assert_eq!(
            differ(&model, &timeline(&[(95, "granted"), (3430, "unlocked"), (3430, "observer granted")]), |_| M),
            None
        );
    }

    #[test]
    fn a_different_event_or_a_missing_one_is_a_mismatch() {
        let model = timeline(&[(100, "granted"), (5000, "ended")]);
        let other = differ(&model, &timeline(&[(100, "granted"), (5000, "failed")]), |_| M).unwrap();
        assert_eq!(other, "the real client never saw `ended` (the model did, at 5000 ms)");
        let missing = differ(&model, &timeline(&[(100, "granted")]), |_| M).unwrap();
        assert_eq!(missing, "the real client never saw `ended` (the model did, at 5000 ms)");
        let extra = differ(&timeline(&[(100, "granted")]), &model, |_| M).unwrap();
        assert_eq!(extra, "the model never saw `ended` (the real client did, at 5000 ms)");
        let twice = differ(&model, &timeline(&[(100, "granted"), (200, "granted"), (5000, "ended")]), |_| M);
        assert_eq!(twice.unwrap(), "the model never saw `granted` (the real client did, at 200 ms)");
    }
}
