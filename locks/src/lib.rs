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
use locksim_sim::world::World;
use params::{ParamSpec, Params};

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
    Redis(redis::RedisServers),
    Zk(zk::ZkServers),
    Etcd(etcd::EtcdServers),
    Sql(sql::SqlServers),
    /// The `none` baseline's: nothing.
    None,
    /// Real servers on loopback, for a built-in recipe run in a real mode client process (`locksim
    /// adapter`): each family's connection then speaks to its real server with a real client crate.
    Real(RealServers),
}

/// Where a real client process finds its real servers (real mode sets one, through its proxy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RealServers {
    /// `host:port` of one Redis master (`LOCKSIM_REDIS`).
    pub redis: Option<String>,
    /// `host:port` of one ZooKeeper server (`LOCKSIM_ZOOKEEPER`).
    pub zookeeper: Option<String>,
    /// `host:port` of one etcd's client port (`LOCKSIM_ETCD`).
    pub etcd: Option<String>,
    /// A libpq connection string (`LOCKSIM_POSTGRES`).
    pub postgres: Option<String>,
}

impl RealServers {
    /// The servers named by the `LOCKSIM_*` variables of `env` (a process's environment).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> RealServers {
        RealServers {
            redis: env("LOCKSIM_REDIS"),
            zookeeper: env("LOCKSIM_ZOOKEEPER"),
            etcd: env("LOCKSIM_ETCD"),
            postgres: env("LOCKSIM_POSTGRES"),
        }
    }
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
}

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
