//! Lock recipes: real lock algorithms written as clients of the simulated backends.
//!
//! Module map:
//! - this file: the [`Lock`] trait every recipe implements, its [`Outcome`]s, and the [`Registry`] of
//!   recipes and backend families that scenario files name.
//! - [`params`]: typed recipe and backend parameters, declared once.
//! - [`redis`]: the Redis family — the `RedisApi` client trait, the simulated servers, and the recipes
//!   `redis.set-nx`, `redis.set-nx-px`, `redis.getset-expiry`, `redis.watchdog`, `redis.redlock`.
//! - [`zk`]: the ZooKeeper family — the `ZkApi` client trait, sessions, and `zk.ephemeral`,
//!   `zk.sequential`, `zk.sequential-unprotected`, `zk.rwlock`, `zk.semaphore-mutex`,
//!   `zk.leader-election`.
//! - [`sql`]: the database family — the `SqlApi` connection trait, the PostgreSQL deployment, and
//!   `sql.for-update`, `sql.unique-insert`, `sql.unique-insert-expiry`, `sql.advisory`.
//! - [`baseline`]: the flash sale's floor, `none` (its ceiling, `sql.conditional-update`, is in [`sql`]).
//! - [`command`]: `[recipe] command = [...]`, a lock in any language run as client processes (real mode).
//! - [`etcd`]: the etcd family — the `EtcdApi` client trait, sessions (leases kept alive), and
//!   `etcd.txn-lease`, `etcd.txn-lease-wait`, `etcd.mutex`, `etcd.election`.
//! - [`work`]: a user's own critical section on the fenced store, and the invariant it keeps.
//!
//! Architecture invariants: recipes see time, sleep, spawn and their backend only through
//! [`locksim_sim::ctx::Ctx`] and their family's client trait; they never write to the history (the
//! workload records around their calls); they never see checkers. The same recipe code runs simulated
//! and real: a family's connection (e.g. [`redis::RedisConn`]) is the simulated client or, given
//! [`Servers::Real`] (real mode's client processes, with a real `Ctx`), a real client crate keeping the
//! simulated client's documented contract (call timeouts, reconnects, keep-alives); a recipe never
//! tells which.

pub mod baseline;
pub mod command;
pub mod etcd;
pub mod params;
pub mod redis;
pub mod sql;
pub mod work;
pub mod zk;

use locksim_sim::ctx::Ctx;
use locksim_sim::fault::{Point, Topology, TriggerEvent};
use locksim_sim::hazard::Hazard;
use locksim_sim::world::World;
use params::{ParamSpec, Params};
use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

pub use async_trait::async_trait;

/// How a lock call ended. A timed-out call is `Unknown`: it may have taken effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    Ok(T),
    Fail(String),
    Unknown(String),
}

impl<T> Outcome<T> {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }
}

/// What a successful `acquire` hands the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// The fencing token the backend offers, if the recipe has one: larger for later holders.
    pub token: Option<u64>,
}

/// A distributed lock as one client uses it. One value per client; `acquire` and `release` alternate.
///
/// Implement this in your own crate to test your lock: see `scenarios/examples/custom_lock.rs`.
#[async_trait(?Send)]
pub trait Lock {
    /// Take the lock, waiting as the recipe waits (each recipe bounds its wait).
    async fn acquire(&mut self) -> Outcome<Grant>;
    /// Give the lock up (the most recent acquisition, shared or not).
    async fn release(&mut self) -> Outcome<()>;

    /// Take the lock shared, as a reader: readers may hold it together, never with a writer (`acquire`).
    /// Only recipes whose spec says `offers_shared` have a shared mode.
    async fn acquire_shared(&mut self) -> Outcome<Grant> {
        Outcome::Fail("this recipe has no shared mode".into())
    }

    /// Resolves, with the reason, when the recipe learns that the lock it holds is gone (its session or
    /// lease ended). Recipes that cannot tell never resolve: their holders find out from the damage.
    async fn lost(&self) -> String {
        std::future::pending().await
    }
}

/// The servers of one backend family in one world, as recipes reach them.
#[derive(Clone, Debug)]
pub enum Servers {
    /// Simulated: what the family's `deploy` made (e.g. [`redis::RedisServers`]), which only the
    /// family's own recipes look into ([`Servers::sim`]); `()` for a family without servers.
    Sim(Arc<dyn Any + Send + Sync>),
    /// Real servers on loopback, for a built-in recipe run in a real mode client process (`locksim
    /// adapter`): each family's connection then speaks to its real server with a real client crate.
    Real(RealServers),
}

impl Servers {
    /// A family's simulated servers, as its `deploy` made them.
    pub fn new<S: Any + Send + Sync>(servers: S) -> Servers {
        Servers::Sim(Arc::new(servers))
    }

    /// The simulated servers of family `S`. Panics if these are another family's: a recipe is
    /// deployed with its own family's servers.
    pub fn sim<S: Any>(&self) -> &S {
        let sim = match self {
            Servers::Sim(sim) => sim.downcast_ref(),
            Servers::Real(_) => None,
        };
        sim.unwrap_or_else(|| panic!("a recipe deployed with its own family's servers, not {self:?}"))
    }
}

/// The real server a family's recipes run against in real mode and conformance, declared beside the
/// family (e.g. [`redis::REAL`]) and listed once in [`REAL_SERVERS`]: what a scenario file, a history,
/// a client process and the installer call it. How it is launched is `locksim-live`'s, keyed by
/// [`RealServer::name`].
#[derive(Debug)]
pub struct RealServer {
    /// As `[recipe] server` names it, e.g. `redis`.
    pub name: &'static str,
    /// Its node in a history: the simulated family's first server, e.g. `redis-0`.
    pub node: &'static str,
    /// The environment variable that tells a client process where it is, e.g. `LOCKSIM_REDIS`.
    pub env: &'static str,
    /// The Debian 12 package that installs it (`.ci/install-servers`).
    pub package: &'static str,
    /// Whether this build has the real client the family's built-in recipes speak to it with (Redis's
    /// and PostgreSQL's are behind the `real-clients` feature).
    pub client_built: bool,
    /// What of the family's `[backend]` the one real server cannot be, said as the rest of "`recipe`
    /// with …"; `Ok` if it can run the scenario as the simulator does.
    pub refuses: fn(backend: &Params) -> Result<(), String>,
    /// Whether it keeps its data through a crash, as the family's `[backend]` sets it up.
    pub keeps_data: fn(backend: &Params) -> bool,
    /// The value of [`RealServer::env`] for a server listening at `addr`: `host:port`, or e.g. a
    /// libpq connection string.
    pub address: fn(addr: SocketAddr) -> String,
}

/// Every real server, in the order messages list them (`[recipe] server`'s values).
pub static REAL_SERVERS: &[&RealServer] = &[&redis::REAL, &zk::REAL, &etcd::REAL, &sql::REAL];

/// One real server is one name.
impl PartialEq for RealServer {
    fn eq(&self, other: &RealServer) -> bool {
        self.name == other.name
    }
}

impl Eq for RealServer {}

impl RealServer {
    /// The real server `[recipe] server` names.
    pub fn named(name: &str) -> Option<&'static RealServer> {
        REAL_SERVERS.iter().copied().find(|s| s.name == name)
    }

    /// `host:port` as [`RealServer::address`] for servers whose clients need no more.
    pub fn host_port(addr: SocketAddr) -> String {
        addr.to_string()
    }

    /// [`RealServer::refuses`] for a server that can run every `[backend]` of its family.
    pub fn refuses_nothing(_: &Params) -> Result<(), String> {
        Ok(())
    }
}

/// Where a real client process finds its real servers (real mode sets one, through its proxy): each
/// by its [`RealServer::env`] variable. A cluster's members are listed there with commas, and two more
/// variables describe them, in the same order: `<env>_NODES`, their nodes (`redis-0,…,sentinel-2`), and
/// `<env>_ANNOUNCED`, where members that announce an address of their own to each other say they are
/// (what a Redis Sentinel answers when asked for the master), for a client that maps one to the
/// other as redis-py's `address_remap` and Redisson's `natMapper` do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RealServers {
    addresses: std::collections::BTreeMap<&'static str, String>,
    /// `<env>_NODES` and `<env>_ANNOUNCED`, by variable.
    cluster: std::collections::BTreeMap<String, String>,
}

/// The suffixes of a cluster's variables (see [`RealServers`]).
pub const CLUSTER_VARS: [&str; 2] = ["_NODES", "_ANNOUNCED"];

impl RealServers {
    /// The servers named by the variables of `env` (a process's environment).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> RealServers {
        let found = REAL_SERVERS.iter().filter_map(|s| Some((s.name, env(s.env)?)));
        let vars = REAL_SERVERS.iter().flat_map(|s| CLUSTER_VARS.map(|suffix| format!("{}{suffix}", s.env)));
        let cluster = vars.filter_map(|var| Some((var.clone(), env(&var)?))).collect();
        RealServers { addresses: found.collect(), cluster }
    }

    /// These servers and `server` at `address` (as [`RealServer::address`] gives it).
    pub fn with(mut self, server: &RealServer, address: String) -> RealServers {
        self.addresses.insert(server.name, address);
        self
    }

    /// Where `server` is. Panics if the process was not told: real mode tells a recipe's process
    /// where its family's server is.
    pub fn of(&self, server: &RealServer) -> &str {
        let address = self.addresses.get(server.name);
        address.unwrap_or_else(|| panic!("a {} recipe's process is given {}", server.name, server.env))
    }

    /// A cluster's members, each as its node, the address this process reaches it at, and the one it
    /// announces to the others (the same if the cluster says none); `None` for a server that is no
    /// cluster.
    pub fn members(&self, server: &RealServer) -> Option<Vec<RealMember>> {
        let var = |suffix: &str| self.cluster.get(&format!("{}{suffix}", server.env));
        let list = |text: &String| text.split(',').map(str::to_string).collect::<Vec<_>>();
        let (nodes, reach) = (list(var(CLUSTER_VARS[0])?), list(&self.of(server).to_string()));
        let announced = var(CLUSTER_VARS[1]).map_or_else(|| reach.clone(), list);
        assert!(
            nodes.len() == reach.len() && reach.len() == announced.len(),
            "{}'s cluster variables list its members alike",
            server.env
        );
        let members = nodes.into_iter().zip(reach).zip(announced);
        Some(members.map(|((node, reach), announced)| RealMember { node, reach, announced }).collect())
    }
}

/// One member of a real cluster, as a client process is told of it ([`RealServers::members`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealMember {
    /// Its node, e.g. `sentinel-0`.
    pub node: String,
    /// Where this process reaches it.
    pub reach: String,
    /// Where the members say it is.
    pub announced: String,
}

/// A backend family: its `[backend]` parameters and how to start its servers in a world.
pub struct Family {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamSpec],
    /// The server nodes these parameters make (`servers` and `failover_masters`; no clients).
    pub topology: fn(&Params) -> Topology,
    /// Start the servers in a world; node names follow `topology`.
    pub deploy: fn(&mut World, &Params) -> Servers,
    /// The real server its recipes run against for real, if any.
    pub real: Option<&'static RealServer>,
    /// Whether its servers and clients mark a hazard (a suite refuses to require one of its recipes
    /// that they never mark).
    pub marks: fn(Hazard) -> bool,
}

/// The hazards of a family whose locks are leases (keys with a TTL, sessions, leases, rows with a
/// deadline): what ends them, and the replies a lock call may lose.
pub const LEASE_HAZARDS: &[Hazard] = &[
    Hazard::LeaseExpiredWhileHeld,
    Hazard::GrantToExpiredSession,
    Hazard::StaleHolderResumed,
    Hazard::ReleaseReplyLost,
    Hazard::AcquireReplyLost,
];

/// What keeps a recipe's clients apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A lock: holders must not overlap (`double-holder`, `unsafe-write` are checked).
    Lock,
    /// Nothing at all (`none`): clients read and write as they please.
    Nothing,
    /// No lock: the workload changes the resource with one conditional UPDATE instead of read, hold,
    /// write (`sql.conditional-update`) — the database's row lock keeps the update atomic.
    ConditionalUpdate,
}

/// A recipe as scenario files name it.
#[derive(Clone, Copy)]
pub struct RecipeSpec {
    /// `family.mechanism`, e.g. `redis.set-nx-px`.
    pub id: &'static str,
    pub family: &'static Family,
    /// One line: what it does.
    pub summary: &'static str,
    /// Where the algorithm comes from.
    pub source: &'static str,
    pub params: &'static [ParamSpec],
    /// Whether `acquire` returns a fencing token (needed for `fencing = true`).
    pub offers_token: bool,
    /// Whether `acquire_shared` takes the lock shared (a read-write lock).
    pub offers_shared: bool,
    /// What keeps clients apart: a lock, or (the flash sale's baselines) nothing.
    pub guard: Guard,
    /// Whether the recipe grants in request order (checked as `unfair` unless `[check] fifo = false`).
    pub promises_fifo: bool,
    /// Every point inside the recipe that its clients pass: its own, passed with
    /// [`Ctx::point`]`(TriggerEvent::Declared(&P))`, and its family's client's (e.g.
    /// [`locksim_sim::backend::LEASE_RENEW`]; a point several recipes pass is one constant, declared by
    /// each). Scenario files start faults there with `on = "<name>"`; the aimed nemesis weighs them in
    /// and draws among them in this order, so reordering them changes the schedules seeds draw.
    pub points: &'static [Point],
    /// Checks that need both parameter sets, e.g. Redlock's number of masters.
    pub validate: fn(recipe: &Params, backend: &Params) -> Result<(), String>,
    /// Build one client's lock on its node.
    pub build: fn(&Params, Ctx, &Servers) -> Box<dyn Lock>,
}

/// A recipe without cross-parameter constraints.
pub fn no_constraints(_: &Params, _: &Params) -> Result<(), String> {
    Ok(())
}

/// The recipes and workloads a scenario file may name: the built-in zoo plus any a user adds.
#[derive(Clone)]
pub struct Registry {
    recipes: Vec<RecipeSpec>,
    works: Vec<work::WorkSpec>,
}

impl Registry {
    /// The families of this registry's recipes, each once, in the order of their first recipe.
    pub fn families(&self) -> Vec<&'static Family> {
        let mut families: Vec<&'static Family> = Vec::new();
        for recipe in &self.recipes {
            if !families.iter().any(|f| std::ptr::eq(*f, recipe.family)) {
                families.push(recipe.family);
            }
        }
        families
    }

    /// Every recipe that ships with locksim.
    pub fn builtin() -> Registry {
        let families =
            [redis::RECIPES, &[command::COMMAND], zk::RECIPES, etcd::RECIPES, sql::RECIPES, &[baseline::NONE]];
        let empty = Registry { recipes: Vec::new(), works: Vec::new() };
        // Through `with`: the built-in recipes' points are held to the rules a user's are.
        families.into_iter().flatten().fold(empty, |registry, recipe| registry.with(*recipe))
    }

    /// This registry and `recipe` (e.g. a user's own lock). A name is one point: each of its points is
    /// declared once, takes no history event's name, and no other point's — a recipe passing a point
    /// that others pass too (its family's client passes [`locksim_sim::backend::LEASE_RENEW`])
    /// declares that same constant.
    pub fn with(mut self, recipe: RecipeSpec) -> Registry {
        for (i, point) in recipe.points.iter().enumerate() {
            let (id, name) = (recipe.id, point.name);
            assert!(TriggerEvent::parse(name).is_none(), "{id}: point {name:?} is a history event's name");
            assert!(recipe.points[..i].iter().all(|p| p.name != name), "{id}: point {name:?} is declared twice");
            assert!(
                self.point(name).is_none_or(|p| p == point),
                "{id}: point {name:?} is another point's name (declare that point, or name yours apart)"
            );
        }
        self.recipes.push(recipe);
        self
    }

    /// Every point the recipes declare, each once, in the order first declared: what `on = "..."` may
    /// name besides the history's events.
    pub fn points(&self) -> Vec<&'static Point> {
        let mut points: Vec<&'static Point> = Vec::new();
        for point in self.recipes.iter().flat_map(|r| r.points) {
            if !points.contains(&point) {
                points.push(point);
            }
        }
        points
    }

    /// The point named `name`, if a recipe declares it.
    pub fn point(&self, name: &str) -> Option<&'static Point> {
        self.recipes.iter().flat_map(|r| r.points).find(|p| p.name == name)
    }

    /// The recipes that declare the point named `name`: the only ones a fault armed for it can start in.
    pub fn passing(&self, name: &str) -> Vec<&'static str> {
        self.recipes.iter().filter(|r| r.points.iter().any(|p| p.name == name)).map(|r| r.id).collect()
    }

    /// This registry and `work`, a user's critical section and invariant (`[workload] kind = "<id>"`).
    /// Its id must not be `counter` or `flash-sale`, nor another work's.
    pub fn with_work(mut self, work: work::WorkSpec) -> Registry {
        assert!(
            !["counter", "flash-sale"].contains(&work.id) && self.work(work.id).is_none(),
            "workload kind {:?} is taken",
            work.id
        );
        self.works.push(work);
        self
    }

    /// The user's workload of this `kind`.
    pub fn work(&self, kind: &str) -> Option<&work::WorkSpec> {
        self.works.iter().find(|w| w.id == kind)
    }

    pub fn works(&self) -> &[work::WorkSpec] {
        &self.works
    }

    pub fn get(&self, id: &str) -> Option<&RecipeSpec> {
        self.recipes.iter().find(|r| r.id == id)
    }

    pub fn recipes(&self) -> &[RecipeSpec] {
        &self.recipes
    }

    /// The recipe `[recipe] command = [...]` stands for ([`command::COMMAND`]), if this registry has it.
    pub fn command(&self) -> Option<&RecipeSpec> {
        self.get(command::ID)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster's members, as real mode tells a client process of them: its own paths to them, their
    /// nodes and the addresses they announce to each other, in one order; a server alone has none.
    #[test]
    fn a_client_process_reads_a_clusters_members_from_its_environment() {
        let env = |name: &str| match name {
            "LOCKSIM_REDIS" => Some("127.0.0.1:1,127.0.0.1:2".to_string()),
            "LOCKSIM_REDIS_NODES" => Some("redis-0,sentinel-0".to_string()),
            "LOCKSIM_REDIS_ANNOUNCED" => Some("127.0.0.1:11,127.0.0.1:12".to_string()),
            "LOCKSIM_ETCD" => Some("127.0.0.1:3".to_string()),
            _ => None,
        };
        let servers = RealServers::from_env(env);
        let member = |node: &str, reach: &str, announced: &str| RealMember {
            node: node.into(),
            reach: reach.into(),
            announced: announced.into(),
        };
        assert_eq!(
            servers.members(&redis::REAL),
            Some(vec![
                member("redis-0", "127.0.0.1:1", "127.0.0.1:11"),
                member("sentinel-0", "127.0.0.1:2", "127.0.0.1:12")
            ])
        );
        assert_eq!(servers.members(&etcd::REAL), None);
        assert_eq!(servers.of(&etcd::REAL), "127.0.0.1:3");
    }

    /// redis-py's `discover_master`: the Sentinels in turn, the first to name a master goes to the front
    /// of the list for the next time.
    #[test]
    fn a_sentinel_that_names_the_master_is_asked_first_next_time() {
        let order = redis::SentinelOrder::default();
        let asked = std::cell::RefCell::new(Vec::new());
        let discover = |answers: [Option<&'static str>; 3]| {
            asked.borrow_mut().clear();
            let ask = async |s: &usize| {
                asked.borrow_mut().push(*s);
                answers[*s]
            };
            let future = std::pin::pin!(order.discover(&[0, 1, 2], ask));
            let polled = future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
            let std::task::Poll::Ready(master) = polled else { panic!("nothing here waits") };
            (master, asked.borrow().clone())
        };
        use std::future::Future;
        assert_eq!(discover([None, Some("m"), Some("n")]), (Some("m"), vec![0, 1]));
        assert_eq!(discover([None, Some("m"), None]), (Some("m"), vec![1]));
        assert_eq!(discover([None, None, None]), (None, vec![1, 0, 2]));
    }

    /// The recipes declaring each built-in point (what `on = "..."` accepts and the aimed nemesis draws);
    /// `scenarios/tests/aimed.rs` runs every recipe and checks that its clients pass exactly these.
    #[test]
    fn each_builtin_point_is_declared_by_the_recipes_whose_clients_pass_it() {
        let registry = Registry::builtin();
        let queues =
            ["zk.sequential", "zk.sequential-unprotected", "zk.rwlock", "zk.semaphore-mutex", "zk.leader-election"];
        let etcd = ["etcd.txn-lease", "etcd.txn-lease-wait", "etcd.mutex", "etcd.election"];
        let renewing = [&["redis.watchdog", "zk.ephemeral"][..], &queues, &etcd].concat();
        let builtin = [
            ("redis-set-nx-expire", vec!["redis.set-nx-expire"]),
            ("lease-renew", renewing),
            ("redlock-majority", vec!["redis.redlock"]),
            ("zk-queue-create", queues.to_vec()),
            ("etcd-mutex-checked", vec!["etcd.mutex"]),
        ];
        let names: Vec<&str> = registry.points().iter().map(|p| p.name).collect();
        assert_eq!(names, builtin.iter().map(|(name, _)| *name).collect::<Vec<_>>(), "each once, as first declared");
        for (name, recipes) in &builtin {
            assert_eq!(registry.passing(name), *recipes, "{name}");
        }
        // The aimed nemesis draws among a recipe's points by index: the order is part of every schedule.
        let order = |id| registry.get(id).unwrap().points.iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(order("etcd.mutex"), ["etcd-mutex-checked", "lease-renew"]);
        assert_eq!(order("zk.rwlock"), ["zk-queue-create", "lease-renew"]);
    }

    fn with_point(point: &'static [Point]) -> Registry {
        let spec = *Registry::builtin().get("none").unwrap();
        Registry::builtin().with(RecipeSpec { id: "my.lock", points: point, ..spec })
    }

    #[test]
    #[should_panic(expected = "my.lock: point \"lease-renew\" is another point's name")]
    fn a_users_point_cannot_take_a_builtin_points_name() {
        with_point(&[Point { name: "lease-renew", doc: "my own renewal" }]);
    }

    #[test]
    #[should_panic(expected = "my.lock: point \"enter\" is a history event's name")]
    fn a_users_point_cannot_take_a_history_events_name() {
        with_point(&[Point { name: "enter", doc: "my own entry" }]);
    }

    #[test]
    fn a_users_recipe_declares_a_builtin_point_its_client_passes() {
        let registry = with_point(&[locksim_sim::backend::LEASE_RENEW]);
        assert_eq!(registry.passing("lease-renew").last(), Some(&"my.lock"));
        assert_eq!(registry.points().len(), Registry::builtin().points().len(), "still one lease-renew");
    }
}
