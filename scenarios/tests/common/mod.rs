//! Helpers shared by the scenario-level tests.
#![allow(dead_code)]

use locksim_locks::params::{ParamValue, Params};
use locksim_locks::{Lock, Registry, Servers};
use locksim_scenarios::run::run_seed;
use locksim_scenarios::sweep::{sweep, ScenarioResult};
use locksim_scenarios::Scenario;
use locksim_sim::ctx::Ctx;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// A shipped catalog scenario by file stem.
pub fn catalog(stem: &str) -> Scenario {
    let path = catalog_dir().join(format!("{stem}.toml"));
    Scenario::load(&path, &Registry::builtin()).unwrap_or_else(|e| panic!("{e}"))
}

pub fn catalog_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog")
}

/// Sweep seeds on two threads.
pub fn run(scenario: &Scenario, seeds: std::ops::Range<u64>) -> ScenarioResult {
    sweep(scenario, seeds, 2, &|| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// Sweep and assert the scenario's own `[expect]` holds.
pub fn assert_as_expected(stem: &str, seeds: std::ops::Range<u64>) -> ScenarioResult {
    let result = run(&catalog(stem), seeds);
    assert!(result.as_expected, "{stem}: {:?} (example seed {:?})", result.reasons, result.example_seed);
    result
}

/// The most clients one release woke, for `stem` with `clients` clients.
pub fn herd(stem: &str, clients: usize) -> u64 {
    let mut s = catalog(stem);
    s.workload.clients = clients;
    s.workload.duration = Duration::from_secs(20);
    s.check.herd_max = None;
    run_seed(&s, 1).unwrap().result.measurements.notifications_per_release_max
}

pub type Say = Rc<dyn Fn(String)>;
pub type Make = Rc<dyn Fn() -> Box<dyn Lock>>;
/// What one client node does with the recipe: `make` builds a lock (a new session each), `say` logs.
pub type Script = fn(Ctx, Make, Say, Servers) -> Pin<Box<dyn Future<Output = ()>>>;

/// Run `script` on one client node of a world with `recipe`'s servers and these parameters; returns
/// what it said.
pub fn drive(recipe: &str, given: &[(&'static str, ParamValue)], script: Script) -> Vec<String> {
    use locksim_sim::world::{Program, World};
    use std::sync::{Arc, Mutex};

    let log = Arc::new(Mutex::new(Vec::new()));
    let spec = *Registry::builtin().get(recipe).unwrap();
    let (shared, given) = (log.clone(), given.to_vec());
    madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default()).block_on(async move {
        let mut world = World::new(1);
        let servers = (spec.family.deploy)(&mut world, &Params::resolve(spec.family.params, []));
        let params = Params::resolve(spec.params, given);
        let program: Program = Arc::new(move |env| {
            let (servers, params, log) = (servers.clone(), params.clone(), shared.clone());
            let ctx = Ctx::new(&env, Rc::new(env.rpc()));
            let make_ctx = ctx.clone();
            let script_servers = servers.clone();
            let make: Make = Rc::new(move || (spec.build)(&params, make_ctx.clone(), &servers));
            let say: Say = Rc::new(move |what| log.lock().unwrap().push(what));
            script(ctx, make, say, script_servers)
        });
        world.add_node("client-0", program);
        world.run(&[], Duration::from_secs(30)).await;
    });
    let log = log.lock().unwrap().clone();
    log
}
