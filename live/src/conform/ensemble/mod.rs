//! Ensemble conformance: the simulated ensembles (`sim/src/backend/zk/ensemble.rs`) against real ones
//! on loopback ([`crate::servers::Cluster`]). Server conformance ([`super`]) checks one server's state
//! machine and client conformance ([`super::client`]) one client library; what decides a verdict on an
//! ensemble is how its members treat each other under a fault — when the leader expires a session
//! whose server it cannot hear, how long a follower cut off from its leader goes on answering its
//! clients — and that is played here, on the model and for real.
//!
//! From a seed, a family draws a *plan*: the ensemble's timing, what its clients do when, and one fault
//! among the members. The plan is played on a simulated world (the model's members, network and
//! client library, the fault as a scenario's: [`model_play`]) and on a real ensemble started afresh for
//! it, with the same client library on a real clock ([`real_play`]). A client is written once for both
//! ([`Client`]); each play writes a [`Timeline`], and the two are compared as client conformance
//! compares them ([`differ`]), each event within its [`Margin`]. A real play that could not keep the
//! plan's times is inconclusive: played once more, never reported as a mismatch.

pub mod etcd;
pub mod sentinel;
pub mod zk;

use super::client::{differ, Late, Margin, Outcome, Play, Timeline};
use crate::servers::{Cluster, Launcher};
use locksim_locks::params::Params;
use locksim_locks::{Family, RealServer, RealServers, Servers, CLUSTER_VARS};
use locksim_sim::clock::sim_now_ns;
use locksim_sim::ctx::Ctx;
use locksim_sim::fault::Fault;
use locksim_sim::rng::{stream, ChaCha8Rng, Stream};
use locksim_sim::world::{Program, World};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An ensemble checked against a real one.
pub trait EnsembleFamily: Sync {
    /// `zk-ensemble`, `etcd-cluster`: `locksim conform`'s argument.
    const NAME: &'static str;
    /// One line for `locksim conform --help`.
    const ABOUT: &'static str;
    type Plan: fmt::Display + Clone + Send + Sync;
    /// How many seeds may play at once, each on a cluster started for it: two by default (three JVMs
    /// starting together, for ZooKeeper, are a lot for a small machine).
    const AT_ONCE: usize = 2;

    /// The real server whose members the plans are played on.
    fn launcher() -> &'static Launcher;
    /// The model's family: its topology names the members, in the order the cluster starts them.
    fn family() -> &'static Family;
    /// A plan from a random stream.
    fn plan(rng: &mut ChaCha8Rng) -> Self::Plan;
    /// The name of a plan's kind, for the coverage counts.
    fn kind(plan: &Self::Plan) -> &'static str;
    /// The ensemble's `[backend]`: its members and timing.
    fn backend(plan: &Self::Plan) -> Params;
    /// The model's timeline of `plan` (a simulated world run with `seed`).
    fn model(&self, plan: &Self::Plan, seed: u64) -> Timeline;
    /// The real timeline of `plan` on `cluster`, just started. `Err` with [`Late`] inside: the machine
    /// could not keep the plan's times (inconclusive).
    fn real(&self, plan: &Self::Plan, cluster: &Cluster) -> anyhow::Result<Timeline>;
    /// How far from the model's time a real event `what` of `plan` may come.
    fn margin(plan: &Self::Plan, what: &str) -> Margin;
    /// Whether `what` is an event the model draws from its seed where a real member's own scheduling
    /// decides, which nothing outside the process can choose: the model seeing it alone is no
    /// mismatch (the seed is counted as [`Outcome::DrawnAlone`]); the real one seeing it alone is.
    /// None by default.
    fn drawn(_plan: &Self::Plan, _what: &str) -> bool {
        false
    }
}

/// The plan of `seed` for family `F` (stream `Conformance`, index 2: server scripts use 0, client plans 1).
pub fn plan<F: EnsembleFamily>(seed: u64) -> F::Plan {
    F::plan(&mut stream(seed, Stream::Conformance, 2))
}

/// Play `seed` on the model and on a fresh real ensemble; a real play that was late is played once
/// more, on another fresh ensemble.
pub fn check<F: EnsembleFamily>(family: &F, seed: u64) -> anyhow::Result<Outcome> {
    let plan = plan::<F>(seed);
    let model = family.model(&plan, seed);
    let backend = F::backend(&plan);
    let mut late = String::new();
    for _ in 0..2 {
        let members = (F::family().topology)(&backend).servers.len();
        let cluster = Cluster::start(F::launcher(), members, &backend, seed)?;
        match family.real(&plan, &cluster) {
            Ok(real) => {
                let (compared, alone) = without_drawn_alone::<F>(&plan, &model, &real);
                return Ok(match differ(&compared, &real, |what| F::margin(&plan, what)) {
                    Some(why) => Outcome::Mismatch { plan: plan.to_string(), model, real, why },
                    None if alone.is_empty() => Outcome::Agree,
                    None => Outcome::DrawnAlone(alone.join("; ")),
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

/// The model's timeline without the [`EnsembleFamily::drawn`] events the real one lacks, and those
/// events, each named with its time.
fn without_drawn_alone<F: EnsembleFamily>(
    plan: &F::Plan,
    model: &Timeline,
    real: &Timeline,
) -> (Timeline, Vec<String>) {
    let (mut compared, mut alone) = (Timeline::default(), Vec::new());
    for e in &model.0 {
        match F::drawn(plan, &e.what) && !real.saw(&e.what) {
            true => alone.push(format!("`{}` at {} ms", e.what, e.at_ms)),
            false => compared.push(e.at_ms, e.what.clone()),
        }
    }
    (compared, alone)
}

/// One client of a plan, the same code on both sides.
pub struct Client<P> {
    /// Its node in the model's world.
    pub name: &'static str,
    /// The member it talks to alone, or `None`: every member (its endpoints, its connect string).
    pub member: Option<usize>,
    /// What it does.
    pub run: Run<P>,
}

/// A client's code: given the plan, its context (simulated or real), the servers as its family's
/// recipes take them, and the timeline to record into.
pub type Run<P> = fn(P, Ctx, Servers, Seen) -> Pin<Box<dyn Future<Output = ()>>>;

/// The model's ensemble: `family`'s servers deployed with `backend`; a client of one member gets the
/// servers `pin` makes of it.
pub struct Model<'a> {
    pub family: &'a Family,
    pub backend: &'a Params,
    pub pin: fn(&Servers, usize) -> Servers,
}

/// A play's timeline, and its clock: the plan's time in milliseconds on either side.
#[derive(Clone)]
pub struct Seen {
    timeline: Arc<Mutex<Timeline>>,
    clock: Clock,
}

#[derive(Clone)]
enum Clock {
    /// The simulated world's, the plan starting at [`MODEL_START_MS`].
    Model,
    /// A real play's.
    Real(Arc<Play>),
}

/// Where the model's plan starts: its ensemble has elected a leader well before.
const MODEL_START_MS: u64 = 4000;

/// How late a real client's step may start and the play still be compared.
const STEP_MARGIN_MS: u64 = 40;

impl Seen {
    /// The plan's time now.
    pub fn now_ms(&self) -> u64 {
        match &self.clock {
            Clock::Model => (sim_now_ns() / 1_000_000).saturating_sub(MODEL_START_MS),
            Clock::Real(play) => play.now_ms(),
        }
    }

    /// When `what` was first recorded, so far.
    pub fn at(&self, what: &str) -> Option<u64> {
        self.timeline.lock().expect("timeline lock").at(what)
    }

    /// Record `what` now.
    pub fn record(&self, what: &'static str) {
        self.record_at(self.now_ms(), what);
    }

    /// Record `what` at `ms` of the plan: a time the client read from the servers (when the write a
    /// server kept was made).
    pub fn record_at(&self, ms: u64, what: &'static str) {
        self.timeline.lock().expect("timeline lock").push(ms, what);
    }

    /// Sleep on `ctx` until `ms` of the plan; a real step that starts late is noted (inconclusive).
    pub async fn until(&self, ctx: &Ctx, ms: u64) {
        ctx.sleep(Duration::from_millis(ms.saturating_sub(self.now_ms()))).await;
        if let Clock::Real(play) = &self.clock {
            play.by(ms + STEP_MARGIN_MS, "a client's step");
        }
    }

    fn timeline(&self) -> Timeline {
        self.timeline.lock().expect("timeline lock").clone().sorted()
    }
}

/// Play `plan` on `model` in a world of `seed`: each of `clients` on a node of its own from the plan's
/// start, `faults` at their plan times, until `end_ms`.
pub fn model_play<P: Clone + Send + Sync + 'static>(
    seed: u64,
    model: Model,
    plan: &P,
    clients: &[Client<P>],
    faults: Vec<Fault>,
    end_ms: u64,
) -> Timeline {
    let seen = Seen { timeline: Arc::default(), clock: Clock::Model };
    let begin = Duration::from_millis(MODEL_START_MS);
    madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async {
        let mut world = World::new(seed);
        let servers = (model.family.deploy)(&mut world, model.backend);
        for client in clients {
            let on = client.member.map_or_else(|| servers.clone(), |m| (model.pin)(&servers, m));
            let (plan, seen, run) = (plan.clone(), seen.clone(), client.run);
            let program: Program = Arc::new(move |env| {
                let (plan, on, seen) = (plan.clone(), on.clone(), seen.clone());
                Box::pin(async move {
                    let ctx = Ctx::new(&env, Rc::new(env.rpc()));
                    ctx.sleep(begin).await;
                    run(plan, ctx, on, seen).await;
                })
            });
            world.add_node(client.name, program);
        }
        let faults: Vec<Fault> = faults.into_iter().map(|f| Fault { at: begin + f.at, ..f }).collect();
        world.run(&faults, begin + Duration::from_millis(end_ms)).await;
        world.shutdown();
    });
    seen.timeline()
}

/// Play `plan` on `cluster`, the real members of `deployment`: `clients` on a current-thread runtime
/// with real contexts and clocks, each reaching its member (or every member) directly on loopback,
/// until `end_ms`; `faults` on the calling thread meanwhile, on the play's clock. `Err` with [`Late`]
/// inside if a step started late.
pub fn real_play<P: Clone + Send + Sync + 'static>(
    cluster: &Cluster,
    deployment: &Model,
    plan: &P,
    clients: &[Client<P>],
    end_ms: u64,
    faults: impl FnOnce(&Play) -> anyhow::Result<()>,
) -> anyhow::Result<Timeline> {
    let server = deployment.family.real.expect("an ensemble family has a real server");
    let addrs: Vec<String> = cluster.addrs().iter().map(|a| (server.address)(*a)).collect();
    let nodes = (deployment.family.topology)(deployment.backend).servers;
    // Time to start the clients before the plan's time 0.
    let start = Instant::now() + Duration::from_millis(500);
    let play = Arc::new(Play::starting_at(start));
    let seen = Seen { timeline: Arc::default(), clock: Clock::Real(play.clone()) };
    let planned: Vec<(Option<usize>, Run<P>)> = clients.iter().map(|c| (c.member, c.run)).collect();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let (seen, plan) = (seen.clone(), plan.clone());
        let runner = scope.spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async {
                let mut running = Vec::new();
                for (i, (member, run)) in planned.into_iter().enumerate() {
                    let servers = Servers::Real(reach(cluster, server, &addrs, &nodes, member));
                    let ctx = Ctx::real(0, i as u64, crate::real::adapter::REAL_TIME);
                    let (plan, seen) = (plan.clone(), seen.clone());
                    running.push(tokio::task::spawn_local(async move {
                        tokio::time::sleep_until(start.into()).await;
                        run(plan, ctx, servers, seen).await;
                    }));
                }
                tokio::time::sleep_until((start + Duration::from_millis(end_ms)).into()).await;
                running.iter().for_each(tokio::task::JoinHandle::abort);
            });
            Ok(())
        });
        let faulted = faults(&play);
        let ran = runner.join().map_err(|_| anyhow::anyhow!("the real clients' thread panicked"))?;
        faulted.and(ran)
    })?;
    let timeline = seen.timeline();
    drop(seen);
    Arc::into_inner(play).expect("the play's clients are gone").on_time()?;
    Ok(timeline)
}

/// The real servers as a client of `member` (or of every member) is told of them, as real mode tells
/// a client process ([`RealServers`]): its member's address, or every member's with their nodes and
/// the addresses they announce to each other.
fn reach(
    cluster: &Cluster,
    server: &RealServer,
    addrs: &[String],
    nodes: &[String],
    member: Option<usize>,
) -> RealServers {
    let Some(m) = member else {
        let announced = cluster.announced().map(|a| a.iter().map(|a| (server.address)(*a)).collect::<Vec<_>>());
        let [nodes_var, announced_var] = CLUSTER_VARS.map(|suffix| format!("{}{suffix}", server.env));
        return RealServers::from_env(|var| match var {
            _ if var == server.env => Some(addrs.join(",")),
            _ if var == nodes_var => Some(nodes.join(",")),
            _ if var == announced_var => announced.as_ref().map(|a| a.join(",")),
            _ => None,
        });
    };
    RealServers::from_env(|_| None).with(server, addrs[m].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(events: &[(u64, &str)]) -> Timeline {
        let mut t = Timeline::default();
        events.iter().for_each(|(at, what)| t.push(*at, *what));
        t
    }

    /// A family whose `drawn` event is `stale`.
    struct Drawn;

    impl EnsembleFamily for Drawn {
        const NAME: &'static str = "drawn";
        const ABOUT: &'static str = "";
        type Plan = String;
        fn launcher() -> &'static Launcher {
            &crate::servers::ETCD
        }
        fn family() -> &'static Family {
            &locksim_locks::etcd::FAMILY
        }
        fn plan(_: &mut ChaCha8Rng) -> String {
            String::new()
        }
        fn kind(_: &String) -> &'static str {
            ""
        }
        fn backend(_: &String) -> Params {
            unreachable!("not played")
        }
        fn model(&self, _: &String, _: u64) -> Timeline {
            unreachable!("not played")
        }
        fn real(&self, _: &String, _: &Cluster) -> anyhow::Result<Timeline> {
            unreachable!("not played")
        }
        fn margin(_: &String, _: &str) -> Margin {
            Margin { early_ms: 10, late_ms: 10 }
        }
        fn drawn(_: &String, what: &str) -> bool {
            what == "stale"
        }
    }

    #[test]
    fn a_drawn_event_the_model_alone_saw_is_set_aside_and_one_the_real_side_alone_saw_is_not() {
        let plan = String::new();
        let model = timeline(&[(100, "written"), (200, "stale"), (300, "fresh")]);
        let fresh = timeline(&[(105, "written"), (295, "fresh")]);
        let (compared, alone) = without_drawn_alone::<Drawn>(&plan, &model, &fresh);
        assert_eq!(alone, ["`stale` at 200 ms"]);
        assert_eq!(differ(&compared, &fresh, |w| Drawn::margin(&plan, w)), None);
        // Seen on both sides, it is compared as any event.
        let both = timeline(&[(105, "written"), (150, "stale"), (295, "fresh")]);
        let (compared, alone) = without_drawn_alone::<Drawn>(&plan, &model, &both);
        assert!(alone.is_empty());
        assert!(differ(&compared, &both, |w| Drawn::margin(&plan, w)).unwrap().contains("`stale`"));
        // The real side alone: a mismatch.
        let model = timeline(&[(100, "written"), (300, "fresh")]);
        let (compared, _) = without_drawn_alone::<Drawn>(&plan, &model, &both);
        let why = differ(&compared, &both, |w| Drawn::margin(&plan, w)).unwrap();
        assert_eq!(why, "the model never saw `stale` (the real client did, at 150 ms)");
    }
}
