//! A validated scenario: everything one run needs, converted once from the file (docs/scenarios.md).

use crate::checkers::starvation::Bounds;
use crate::checkers::{CheckConfig, FindingKind};
use crate::duration::DurRange;
use crate::file::{CheckFile, ExpectFile, ScenarioError, ScenarioFile, Section, Source, Table};
use locksim_locks::params::Params;
use locksim_locks::work::WorkSpec;
use locksim_locks::{Family, Guard, RealServer, RecipeSpec, Registry, REAL_SERVERS};
use locksim_sim::fault::{
    Action, Fault, FaultKind, FaultParams, Nemesis, RandomFaults, Slot, Target, Topology, Trigger, TriggerEvent,
};
use locksim_sim::hazard::Hazard;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;
use toml::Spanned;

/// The most clients a scenario runs: a fleet. Each client is a simulated node with its own session or
/// connection (about 90 KB each at 1,000 ZooKeeper clients); a queue lock's cost grows with the
/// clients, a herd's with their square, as the real recipes' do.
pub const MAX_CLIENTS: i64 = 1000;

/// The most workers (`[workload] workers`) one client runs.
pub const MAX_WORKERS: usize = 16;

/// `clients` of a workload or a suite's run: 1 to [`MAX_CLIENTS`].
pub(crate) fn check_clients(src: &Source, clients: &Spanned<i64>) -> Result<(), ScenarioError> {
    let n = *clients.get_ref();
    if (1..=MAX_CLIENTS).contains(&n) {
        return Ok(());
    }
    Err(src.error(clients.span(), format!("clients: expected a whole number from 1 to {MAX_CLIENTS}, found {n}")))
}

/// What a scenario expects of every seed it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Safe,
    Unsafe,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expect {
    pub verdict: Verdict,
    /// Each must occur in some seed (for `unsafe`).
    pub findings: Vec<FindingKind>,
    /// None may occur in any seed.
    pub absent: Vec<FindingKind>,
    /// Each must be reached in some seed (a suite's `[[run]] hazards`): the faults still bite.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hazards: Vec<Hazard>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub clients: usize,
    /// Lock objects each client drives at once (`workers`, default 1): loops of their own in one
    /// process, built from one context, so that locks sharing a session there can be tested. A worker
    /// beyond the first is a history node of its own, `client-0/w1`, …; its faults are its client's.
    pub workers: usize,
    /// Simulated time the run lasts.
    pub duration: Duration,
    pub hold: (Duration, Duration),
    pub think: (Duration, Duration),
    /// The resource rejects stale fencing tokens.
    pub fencing: bool,
    /// The share of acquisitions that take the lock shared, to read only (recipes with a shared mode).
    pub reads: f64,
    /// `Some(items)`: a flash sale of this stock (`kind = "flash-sale"`); `None`: the counter.
    pub stock: Option<i64>,
    /// A user's critical section on the store instead of the counter (`kind = "<its id>"`).
    pub work: Option<WorkSpec>,
}

#[derive(Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// The file it came from, as given on the command line (for repro lines).
    pub path: String,
    pub recipe: RecipeSpec,
    pub recipe_params: Params,
    pub backend_params: Params,
    pub workload: Workload,
    /// Written-out faults.
    pub schedule: Vec<Fault>,
    /// The nemesis, if any.
    pub random: Option<RandomFaults>,
    pub check: CheckConfig,
    pub expect: Expect,
    /// `[recipe] command = [...]`: a lock in any language, run in real mode. `recipe` is then its
    /// `[model]`, which a simulated run runs, or without one the registry's `command` recipe, which
    /// runs only in real mode ([`Scenario::only_real`]).
    pub command: Option<CommandRecipe>,
    /// `[expect] real_runs`: how many real runs it takes to see the verdict (a fault aimed at the holder
    /// misses a run where nobody holds the lock at its time); `run --real` makes this many by default.
    pub real_runs: Option<u64>,
}

/// The most real runs `[expect] real_runs` may ask for (as `run --real --runs`).
pub const REAL_RUNS_MAX: u64 = 10_000;

/// `[recipe] command = ["prog", "arg", ...]` and its other keys, as the client processes get them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecipe {
    /// The program and its arguments, as written (relative to the scenario file's directory).
    pub argv: Vec<String>,
    /// Every other `[recipe]` key, its value as a string (`"1s"`, `5`, `true` → `"1s"`, `"5"`, `"true"`).
    pub params: std::collections::BTreeMap<String, String>,
    /// `server = "..."`: the real server its processes talk to (default Redis).
    pub server: &'static RealServer,
    /// `request_timeout = "..."`: how long real mode waits for the answer to one request (locksim's,
    /// not passed to the processes); `None`: real mode's default.
    pub request_timeout: Option<Duration>,
}

impl CommandRecipe {
    /// How results name it: `command <its last argument's file name>` (the adapter, as a rule).
    pub fn label(&self) -> String {
        let last = self.argv.last().map_or("", |a| a.rsplit('/').next().unwrap_or(a));
        format!("command {last}")
    }
}

/// A file that could not be read, or could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The OS error is part of the message, not a source: printed once.
    #[error("{path}: {}", io_words(error))]
    Io { path: String, error: std::io::Error },
    #[error(transparent)]
    Invalid(#[from] ScenarioError),
}

/// An I/O error in words, once.
fn io_words(e: &std::io::Error) -> String {
    e.to_string()
}

/// A file's text; a byte that is not UTF-8 is an error at its line and column.
pub(crate) fn read_text(path: &Path, shown: &str) -> Result<String, LoadError> {
    let bytes = std::fs::read(path).map_err(|error| LoadError::Io { path: shown.to_string(), error })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let before = std::str::from_utf8(&e.as_bytes()[..valid]).expect("valid up to here");
        let src = Source { path: shown, text: before };
        src.error(valid..valid, "expected UTF-8 text, found a byte that is not").into()
    })
}

impl Scenario {
    pub fn client_name(i: usize) -> String {
        format!("client-{i}")
    }

    /// Every node of the world this scenario builds (clients, servers; the resource is `resource`).
    pub fn topology(&self) -> Topology {
        topology(&self.recipe, &self.backend_params, self.command.as_ref(), self.workload.clients)
    }

    /// A command recipe without a `[model]`: nothing to simulate.
    pub fn only_real(&self) -> bool {
        self.recipe.id == locksim_locks::command::ID
    }

    /// Read and validate a scenario file.
    pub fn load(path: &Path, registry: &Registry) -> Result<Scenario, LoadError> {
        let shown = path.display().to_string();
        let text = read_text(path, &shown)?;
        Ok(Scenario::parse(&shown, &text, registry)?)
    }

    /// Validate scenario `text`; errors name `path`, line and column.
    pub fn parse(path: &str, text: &str, registry: &Registry) -> Result<Scenario, ScenarioError> {
        let src = Source { path, text };
        let file = src.parse()?;
        check_name(&src, &file.name)?;
        let (recipe, recipe_params, command) = recipe(&src, &file.recipe, file.model.as_ref(), registry)?;
        // A command without a `[model]` has no family of servers to simulate: its `[backend]` sets up the
        // real server it names (Redis's persistence, PostgreSQL's session settings), with that family's keys.
        let family = match (&command, file.model.is_some()) {
            (Some(c), false) => server_family(registry, c.server).unwrap_or(recipe.family),
            _ => recipe.family,
        };
        let mut backend = Section::new(&src, format!("[backend] of the {} family", family.name), &file.backend);
        let backend_params = backend.params(family.params)?;
        backend.finish(&names(family.params))?;
        (recipe.validate)(&recipe_params, &backend_params).map_err(|m| src.error(file.recipe.span(), m))?;
        if let (Some(c), Some(model)) = (&command, &file.model) {
            // Faults name the real run's nodes, so the model's world must have the same one server.
            let servers = (recipe.family.topology)(&backend_params).servers;
            if servers != [c.server.node] {
                let m = format!(
                    "[model]: its world has the servers {}, but a real run has one, {}: the model must run on one server",
                    servers.join(", "),
                    c.server.node
                );
                return Err(src.error(model.span(), m));
            }
        }
        let workload = workload(&src, &file, &recipe, registry)?;
        let (stock, invariant) = (workload.stock, workload.work);
        let topo = topology(&recipe, &backend_params, command.as_ref(), workload.clients);
        let schedule: Vec<Fault> = file
            .faults
            .schedule
            .iter()
            .map(|t| fault(&src, t, &topo, workload.duration, registry, recipe.id))
            .collect::<Result<_, _>>()?;
        check_restarts(&src, &file.faults.schedule, &schedule)?;
        let random = file.faults.random.as_ref().map(|r| random(&src, r, &topo)).transpose()?;
        let liveness = file.check.liveness.as_ref().map_or(Ok(Duration::from_secs(30)), |l| {
            let d = l.get_ref().0;
            if d.is_zero() {
                Err(src.error(l.span(), "liveness: expected a duration above zero"))
            } else {
                Ok(d)
            }
        })?;
        let liveness = match file.check.deadlock.as_ref().map(|d| (*d.get_ref(), d.span())) {
            Some((false, span)) if file.check.liveness.is_some() => {
                return Err(src.error(span, "deadlock = false: `liveness` is the deadlock check's window; drop one"));
            }
            Some((false, _)) => None,
            _ if recipe.guard == Guard::Lock && liveness >= workload.duration => {
                return Err(wedge_unseen(&src, &file, liveness, workload.duration));
            }
            _ => Some(liveness),
        };
        let herd_max = file.check.herd_max.as_ref().map(|h| {
            u32::try_from(*h.get_ref())
                .map_err(|_| src.error(h.span(), "herd_max: expected a whole number of clients, 0 or more"))
        });
        let herd_max = herd_max.transpose()?;
        let starvation = starvation(&src, &file.check)?;
        let expect =
            file.expect.as_ref().map_or(
                Ok(Expect { verdict: Verdict::Safe, findings: vec![], absent: vec![], hazards: vec![] }),
                |e| expect(&src, e),
            )?;
        let real_runs = file.expect.as_ref().and_then(|e| e.real_runs.as_ref()).map(|r| {
            u64::try_from(*r.get_ref()).ok().filter(|n| (1..=REAL_RUNS_MAX).contains(n)).ok_or_else(|| {
                src.error(r.span(), format!("real_runs: expected a whole number from 1 to {REAL_RUNS_MAX}"))
            })
        });
        let real_runs = real_runs.transpose()?;
        let fenced = workload.fencing;
        Ok(Scenario {
            name: file.name.get_ref().clone(),
            description: file.description.clone(),
            path: path.to_string(),
            recipe,
            recipe_params,
            backend_params,
            workload,
            schedule,
            random,
            check: CheckConfig {
                liveness,
                herd_max,
                fifo: file.check.fifo.unwrap_or(recipe.promises_fifo),
                fifo_margin: crate::checkers::FIFO_MARGIN,
                starvation,
                stock,
                invariant,
                exclusive: recipe.guard == locksim_locks::Guard::Lock,
                fenced,
            },
            expect,
            command,
            real_runs,
        })
    }
}

/// `[check] starvation`, `starvation_grants`, `starvation_wait`: the bounds, or `None` when turned off.
fn starvation(src: &Source, check: &CheckFile) -> Result<Option<Bounds>, ScenarioError> {
    let on = check.starvation.as_ref().is_none_or(|s| *s.get_ref());
    if !on {
        let set = check.starvation_grants.as_ref().map(|g| (g.span(), "starvation_grants"));
        let set = set.or(check.starvation_wait.as_ref().map(|w| (w.span(), "starvation_wait")));
        if let Some((span, key)) = set {
            return Err(src.error(span, format!("{key}: starvation is not checked (starvation = false); leave it out")));
        }
        return Ok(None);
    }
    let mut bounds = Bounds::default();
    if let Some(g) = &check.starvation_grants {
        bounds.grants = u32::try_from(*g.get_ref()).map_err(|_| {
            src.error(g.span(), "starvation_grants: expected a whole number of grants to one other client, 0 or more")
        })?;
    }
    if let Some(w) = &check.starvation_wait {
        bounds.wait = w.get_ref().0;
        if bounds.wait.is_zero() {
            return Err(src.error(w.span(), "starvation_wait: expected a duration above zero"));
        }
    }
    Ok(Some(bounds))
}

/// A scenario's name becomes part of file names (shrunk repros) and reports: an identifier of ASCII
/// letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most 100 characters.
fn check_name(src: &Source, name: &toml::Spanned<String>) -> Result<(), ScenarioError> {
    let n = name.get_ref();
    let ok = n.len() <= 100
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        return Ok(());
    }
    let m = format!(
        "name: expected an identifier of letters, digits, '.', '_' and '-' starting with a letter or digit, at most \
         100 characters (it names output files), found {n:?}"
    );
    Err(src.error(name.span(), m))
}

fn names(specs: &[locksim_locks::params::ParamSpec]) -> Vec<&'static str> {
    specs.iter().map(|s| s.name).collect()
}

/// The family of the real server `server`, as this registry's recipes declare it (`None`: no recipe of
/// the registry is of that family).
fn server_family(registry: &Registry, server: &RealServer) -> Option<&'static Family> {
    registry.recipes().iter().map(|r| r.family).find(|f| f.real.is_some_and(|real| real.name == server.name))
}

/// The nodes of the world: the family's servers, or a command recipe's one real server (named as in
/// the history of its real runs, so that a fault can aim at it; its `[model]`'s world has the same);
/// and the points its recipe passes, for the aimed nemesis.
fn topology(recipe: &RecipeSpec, backend: &Params, command: Option<&CommandRecipe>, clients: usize) -> Topology {
    let mut topo = match command {
        Some(c) => Topology { servers: vec![c.server.node.to_string()], ..Topology::default() },
        None => (recipe.family.topology)(backend),
    };
    topo.clients = (0..clients).map(Scenario::client_name).collect();
    topo.points = recipe.points.iter().map(TriggerEvent::Declared).collect();
    topo
}

type RecipeParts = (RecipeSpec, Params, Option<CommandRecipe>);

/// `[recipe]`, and a command recipe's `[model]`: the recipe a simulated run runs (a command's model, or
/// without one the registry's `command` recipe, which runs only in real mode) and the command, if any.
fn recipe(
    src: &Source,
    table: &Spanned<Table>,
    model: Option<&Spanned<Table>>,
    registry: &Registry,
) -> Result<RecipeParts, ScenarioError> {
    let mut section = Section::new(src, "[recipe]", table.get_ref());
    let Some(argv) = section.take("command") else {
        if let Some(model) = model {
            let m =
                "[model] is the simulator's model of a command recipe; this [recipe] has an `id`: leave [model] out";
            return Err(src.error(model.span(), m));
        }
        let (spec, params) = builtin(src, "[recipe]", table, registry)?;
        return Ok((spec, params, None));
    };
    if let Some(id) = section.take("id") {
        return Err(src.error(id.span(), "[recipe] has `command`, so no `id`: leave one of them out"));
    }
    let command = command(&section, &argv, table.get_ref())?;
    let Some(model) = model else {
        let spec = *registry
            .command()
            .ok_or_else(|| src.error(argv.span(), "command: this locksim has no `command` recipe in its registry"))?;
        return Ok((spec, Params::resolve(&[], []), Some(command)));
    };
    let (spec, params) = builtin(src, "[model]", model, registry)?;
    if spec.family.real != Some(command.server) {
        let family = server_family(registry, command.server).map_or(command.server.name, |f| f.name);
        let m = format!(
            "[model]: {} is a {} recipe, but the command's server is {}: the model must be a {family} recipe",
            spec.id, spec.family.name, command.server.name
        );
        return Err(src.error(model.span(), m));
    }
    Ok((spec, params, Some(command)))
}

/// A built-in recipe's table (`[recipe]`, or a command's `[model]`): its `id` and parameters.
fn builtin(
    src: &Source,
    what: &str,
    table: &Spanned<Table>,
    registry: &Registry,
) -> Result<(RecipeSpec, Params), ScenarioError> {
    let mut section = Section::new(src, what, table.get_ref());
    let id = section.take("id").ok_or_else(|| {
        let or = if what == "[recipe]" { " or `command`" } else { "" };
        src.error(table.span(), format!("{what} needs `id` (see `locksim list recipes`){or}"))
    })?;
    let name = section.string("id", &id)?;
    if name == locksim_locks::command::ID {
        let m = "id: the command recipe is written `command = [\"program\", \"arg\"]`, without an id";
        return Err(src.error(id.span(), m));
    }
    let spec = *registry.get(&name).ok_or_else(|| {
        let known: Vec<&str> =
            registry.recipes().iter().map(|r| r.id).filter(|id| *id != locksim_locks::command::ID).collect();
        src.error(id.span(), format!("unknown recipe id \"{name}\"; expected one of: {}", known.join(", ")))
    })?;
    let mut section = Section::new(src, format!("{what} of {name}"), table.get_ref());
    section.take("id");
    let params = section.params(spec.params)?;
    let mut accepted = vec!["id"];
    accepted.extend(names(spec.params));
    section.finish(&accepted)?;
    Ok((spec, params))
}

/// `command = [...]` and the `[recipe]` keys beside it, which become `LOCKSIM_PARAM_<KEY>` strings.
fn command(section: &Section, argv: &Spanned<toml::Value>, table: &Table) -> Result<CommandRecipe, ScenarioError> {
    let bad = || {
        section.error(argv.span(), "command: expected a non-empty array of strings, e.g. [\"python3\", \"lock.py\"]")
    };
    let items = argv.get_ref().as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
    let argv: Vec<String> =
        items.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(bad)?;
    let mut server = &locksim_locks::redis::REAL;
    if let Some((key, value)) = table.iter().find(|(k, _)| k.get_ref() == "server") {
        let name = value.get_ref().as_str().unwrap_or_default();
        server = RealServer::named(name).ok_or_else(|| {
            let known: Vec<&str> = REAL_SERVERS.iter().map(|s| s.name).collect();
            let m = format!(
                "server: expected one of {} (the real server locksim starts), found {}",
                known.join(", "),
                value.get_ref()
            );
            section.error(key.span(), m)
        })?;
    }
    let request_timeout = match table.iter().find(|(k, _)| k.get_ref() == "request_timeout") {
        Some((_, value)) => match section.duration("request_timeout", value, false)? {
            (_, d) if d.is_zero() => {
                return Err(section.error(value.span(), "request_timeout: expected a duration above zero"))
            }
            (_, d) => Some(d),
        },
        None => None,
    };
    let mut params = std::collections::BTreeMap::new();
    let own = ["command", "server", "request_timeout"];
    for (key, value) in table.iter().filter(|(k, _)| !own.contains(&k.get_ref().as_str())) {
        let name = key.get_ref();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            let m = format!("{name:?}: a command's parameter names are lower-case letters, digits and '_' (they become LOCKSIM_PARAM_<KEY>)");
            return Err(section.error(key.span(), m));
        }
        let text = match value.get_ref() {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => {
                let m = format!("{name}: a command's parameter is a string, number or boolean (passed as a string)");
                return Err(section.error(value.span(), m));
            }
        };
        params.insert(name.clone(), text);
    }
    Ok(CommandRecipe { argv, params, server, request_timeout })
}

fn range(r: &DurRange) -> (Duration, Duration) {
    (r.0, r.1)
}

fn workload(
    src: &Source,
    file: &ScenarioFile,
    recipe: &RecipeSpec,
    registry: &Registry,
) -> Result<Workload, ScenarioError> {
    let w = &file.workload;
    let (flash_sale, work) = match w.kind.get_ref().as_str() {
        "counter" => (false, None),
        "flash-sale" => (true, None),
        other => match registry.work(other) {
            Some(work) => (false, Some(*work)),
            None => {
                let mut known = vec!["\"counter\"".to_string(), "\"flash-sale\"".to_string()];
                known.extend(registry.works().iter().map(|w| format!("\"{}\"", w.id)));
                let m = format!("kind: expected one of {}, found \"{other}\"", known.join(", "));
                return Err(src.error(w.kind.span(), m));
            }
        },
    };
    if let Some(work) = work.filter(|_| recipe.guard == locksim_locks::Guard::ConditionalUpdate) {
        let m = format!(
            "kind = \"{}\" runs its own critical section under a lock, and {} is no lock (its work is one \
             conditional UPDATE); use a lock, or `none` for no lock at all",
            work.id, recipe.id
        );
        return Err(src.error(w.kind.span(), m));
    }
    let stock = match (&w.stock, flash_sale) {
        (None, true) => return Err(src.error(w.kind.span(), "a flash sale needs `stock`, the items on sale")),
        (Some(s), false) => {
            return Err(src.error(s.span(), "stock: only a flash sale (kind = \"flash-sale\") has stock"))
        }
        (Some(s), true) if !(1..=1_000_000).contains(s.get_ref()) => {
            let m = format!("stock: expected a whole number of items from 1 to 1000000, found {}", s.get_ref());
            return Err(src.error(s.span(), m));
        }
        (s, _) => s.as_ref().map(|s| *s.get_ref()),
    };
    let clients = *w.clients.get_ref();
    check_clients(src, &w.clients)?;
    let workers = match &w.workers {
        None => 1,
        Some(n) if (1..=MAX_WORKERS as i64).contains(n.get_ref()) => *n.get_ref() as usize,
        Some(n) => {
            let m = format!(
                "workers: expected a whole number of lock objects per client from 1 to {MAX_WORKERS}, found {}",
                n.get_ref()
            );
            return Err(src.error(n.span(), m));
        }
    };
    let duration = w.duration.get_ref().0;
    if duration.is_zero() || duration > Duration::from_secs(24 * 3600) {
        return Err(src.error(w.duration.span(), "duration: expected a simulated time above zero and at most 24h"));
    }
    let fencing = w.fencing.as_ref().is_some_and(|f| *f.get_ref());
    if let Some(f) = w.fencing.as_ref().filter(|_| fencing && !recipe.offers_token) {
        let m = format!("fencing = true needs a fencing token, and {} offers none", recipe.id);
        return Err(src.error(f.span(), m));
    }
    let reads = w.reads.as_ref().map_or(0.0, |r| *r.get_ref());
    if let Some(r) = &w.reads {
        if !(0.0..=1.0).contains(&reads) {
            return Err(src.error(r.span(), format!("reads: expected a share from 0.0 to 1.0, found {reads}")));
        }
        if reads > 0.0 && !recipe.offers_shared {
            let m = format!("reads > 0 needs a recipe with a shared (read) mode, and {} has none", recipe.id);
            return Err(src.error(r.span(), m));
        }
    }
    if let Some(r) = w.reads.as_ref().filter(|_| flash_sale && reads > 0.0) {
        return Err(src.error(r.span(), "reads: buyers in a flash sale always write; leave reads out"));
    }
    let (hold, think) = (range(&w.hold), range(&w.think));
    Ok(Workload { clients: clients as usize, workers, duration, hold, think, fencing, reads, stock, work })
}

fn fault_kind(section: &Section, v: &Spanned<toml::Value>) -> Result<FaultKind, ScenarioError> {
    let name = section.string("kind", v)?;
    FaultKind::parse(&name).ok_or_else(|| {
        let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        let why = match name.as_str() {
            "expire-session" => "expire-session needs a backend with sessions (zk, etcd); Redis has none".to_string(),
            _ => format!("unknown fault kind \"{name}\"; expected one of: {}", known.join(", ")),
        };
        section.error(v.span(), why)
    })
}

fn node_name(section: &Section, key: &str, v: &Spanned<toml::Value>, topo: &Topology) -> Result<String, ScenarioError> {
    let name = section.string(key, v)?;
    let all: Vec<&str> = topo.clients.iter().chain(&topo.servers).map(String::as_str).collect();
    let roles = topo.roles.iter().map(|(role, _)| *role);
    if name == "resource" || all.contains(&name.as_str()) || roles.clone().any(|r| r == name) {
        return Ok(name);
    }
    let list: Vec<&str> = all.into_iter().chain(["resource"]).chain(roles).collect();
    Err(section
        .error(v.span(), format!("{key}: no node \"{name}\" in this scenario; expected one of: {}", list.join(", "))))
}

/// `target = ...`: a node name, `holder`, `waiter`, `random-client` or (with `on`) `trigger`.
fn target(s: &Section, v: &Spanned<toml::Value>, topo: &Topology) -> Result<Target, ScenarioError> {
    Ok(match s.string("target", v)?.as_str() {
        "holder" => Target::Holder,
        "waiter" => Target::Waiter,
        "random-client" => Target::RandomClient,
        "trigger" => Target::Trigger,
        _ => Target::Node(node_name(s, "target", v, topo)?),
    })
}

/// `peers = [...]`: nodes of the scenario, at least one of them other than the fault's own target.
fn peers(
    s: &Section,
    v: &Spanned<toml::Value>,
    topo: &Topology,
    own_name: Option<&str>,
) -> Result<Vec<String>, ScenarioError> {
    let items = v.get_ref().as_array().ok_or_else(|| s.error(v.span(), "peers: expected an array of node names"))?;
    let peers: Vec<String> = items
        .iter()
        .map(|i| node_name(s, "peers", &Spanned::new(v.span(), i.clone()), topo))
        .collect::<Result<_, _>>()?;
    if peers.iter().all(|p| Some(p.as_str()) == own_name) {
        let m =
            "peers: expected at least one node other than the target (leave `peers` out to cut it off from everyone)";
        return Err(s.error(v.span(), m));
    }
    Ok(peers)
}

/// A run no longer than its liveness window can never call a wedged lock a deadlock: a crashed holder
/// whose lock never frees would pass as safe. Refused, at `liveness` or else at the run's `duration`.
fn wedge_unseen(src: &Source, file: &ScenarioFile, liveness: Duration, duration: Duration) -> ScenarioError {
    let show = locksim_sim::fault::fmt_duration;
    let (span, whose) = match &file.check.liveness {
        Some(l) => (l.span(), String::new()),
        None => (file.workload.duration.span(), " (the default)".to_string()),
    };
    src.error(
        span,
        format!(
            "liveness {}{whose} is not shorter than the run's duration {}: the deadlock check could never fire, \
             so a wedged lock would pass as safe; set [check] liveness below the duration (e.g. \"{}\"), run longer, \
             or say `deadlock = false` to judge safety alone",
            show(liveness),
            show(duration),
            show(duration / 2)
        ),
    )
}

/// A `restart` brings back a node that an earlier `crash` without `duration` left down; anything else
/// would silently crash and restart a running node.
fn check_restarts(src: &Source, tables: &[Spanned<Table>], schedule: &[Fault]) -> Result<(), ScenarioError> {
    let mut order: Vec<usize> = (0..schedule.len()).collect();
    order.sort_by_key(|i| schedule[*i].at);
    let mut down: std::collections::BTreeSet<&str> = Default::default();
    for i in order {
        let (fault, node) = (
            &schedule[i],
            match &schedule[i].target {
                Target::Node(n) => Some(n.as_str()),
                _ => None,
            },
        );
        match (&fault.action, node) {
            // An aimed crash may fire late or never: a timed `restart` cannot count on it.
            (Action::Crash { restart_after: None, .. }, Some(n)) if fault.on.is_none() => {
                down.insert(n);
            }
            (Action::Restart, Some(n)) if down.remove(n) => {}
            (Action::Restart, _) => {
                let m = format!(
                    "a `restart` brings back a node left down by an earlier `crash` or `host-crash` without `duration`; {} is not down at {}",
                    node.unwrap_or("its target"),
                    locksim_sim::fault::fmt_duration(fault.at)
                );
                return Err(src.error(tables[i].span(), m));
            }
            _ => {}
        }
    }
    Ok(())
}

/// One `[[faults.schedule]]` entry: `at`, `kind`, `target`, and the keys its kind takes. A fault that
/// could never take effect in a run of `run_for` is refused: a fault test must not pass without its fault.
fn fault(
    src: &Source,
    table: &Spanned<Table>,
    topo: &Topology,
    run_for: Duration,
    registry: &Registry,
    recipe: &str,
) -> Result<Fault, ScenarioError> {
    let mut s = Section::new(src, "[[faults.schedule]]", table.get_ref());
    let on = trigger(&mut s, topo, registry, recipe)?;
    let at = match s.take("at") {
        Some(at_v) => {
            let at = s.duration("at", &at_v, false)?.1;
            if at >= run_for {
                let (run, at) = (locksim_sim::fault::fmt_duration(run_for), locksim_sim::fault::fmt_duration(at));
                let m = match on {
                    Some(_) => format!("at: the run lasts {run}; a trigger armed at {at} would never fire"),
                    None => format!("at: the run lasts {run}; a fault at {at} would never start"),
                };
                return Err(s.error(at_v.span(), m));
            }
            at
        }
        None if on.is_some() => Duration::ZERO,
        None => s
            .require("at", "when it starts, e.g. \"10s\", or `on`: the event that starts it")
            .map(|_| Duration::ZERO)?,
    };
    let kind_v = s.require("kind", "one of the fault kinds, see `locksim list faults`")?;
    let kind = fault_kind(&s, &kind_v)?;
    let target_v = s.require("target", "a node name, \"holder\", \"waiter\", \"random-client\" or \"trigger\"")?;
    let target = target(&s, &target_v, topo)?;
    if target == Target::Trigger && on.is_none() {
        let m = "target: \"trigger\" means the node whose event started the fault; it needs `on` (e.g. on = \"acquire-ok\")";
        return Err(s.error(target_v.span(), m));
    }
    let spec = kind.spec();
    if let (Some(why), Some(_)) = (spec.means.not_aimed, &on) {
        return Err(s.error(kind_v.span(), format!("on: {why}")));
    }
    if let (true, Target::Node(n)) = (spec.means.needs_replica, &target) {
        if !topo.failover_masters.contains(n) {
            let m = format!(
                "target: {} needs a master with a replica and no Sentinel ([backend] replicas = 1, sentinels = 0: \
                 Sentinels fail a master over themselves); \"{n}\" is not one",
                spec.name
            );
            return Err(s.error(target_v.span(), m));
        }
    }
    if let Some(need) = spec.means.needs_member {
        // The trigger of a leader change is the new leader.
        let named = match (&target, &on) {
            (Target::Node(n), _) => Some(n.as_str()),
            (Target::Trigger, Some(t)) if t.event == TriggerEvent::LeaderChange => Some("leader"),
            _ => None,
        };
        if !named.is_some_and(|n| need.members(topo).iter().any(|m| m == n)) {
            let (does, which) = need.what();
            let m = format!("target: {} {does}; \"{target}\" is not one ({which})", spec.name);
            return Err(s.error(target_v.span(), m));
        }
    }
    let mut s = Section::new(src, format!("a `{}` fault", spec.name), table.get_ref());
    for k in ["at", "kind", "target", "on", "nth", "client", "after"] {
        s.take(k);
    }
    let own_name = match &target {
        Target::Node(n) => Some(n.clone()),
        _ => None,
    };
    let mut params = FaultParams::default();
    for key in spec.keys {
        let name = key.slot.name();
        let v = match key.required {
            Some(what) => s.require(name, what)?,
            None => match s.take(name) {
                Some(v) => v,
                None => continue,
            },
        };
        match &key.slot {
            Slot::Duration => params.duration = Some(s.duration(name, &v, false)?.1),
            Slot::Latency => params.latency = Some(s.duration(name, &v, false)?.1),
            Slot::Delta => {
                let (negative, d) = s.duration(name, &v, true)?;
                let ms = d.as_millis() as i64;
                params.delta_ms = Some(if negative { -ms } else { ms });
            }
            Slot::Rate(range) => params.rate = Some(s.number(name, &v, range.clone())?),
            Slot::Peers => params.peers = peers(&s, &v, topo, own_name.as_deref())?,
        }
    }
    let action = (spec.build)(params);
    let mut accepted = vec!["at", "kind", "target", "on", "nth", "client", "after"];
    accepted.extend(spec.keys.iter().map(|k| k.slot.name()));
    s.finish(&accepted)?;
    Ok(Fault { at, target, action, on })
}

/// `on = "<event>"`, with `nth`, `client` and `after`: what starts an aimed fault (taken out of `s`). A point
/// inside a recipe must be one the scenario's recipe declares (its topology's): a point of another
/// recipe in the registry would never be passed, and the fault would never start.
fn trigger(
    s: &mut Section,
    topo: &Topology,
    registry: &Registry,
    recipe: &str,
) -> Result<Option<Trigger>, ScenarioError> {
    let (on_v, nth_v, client_v, after_v) = (s.take("on"), s.take("nth"), s.take("client"), s.take("after"));
    let Some(on_v) = on_v else {
        if let Some(v) = nth_v.or(client_v).or(after_v) {
            return Err(s.error(
                v.span(),
                "nth, client and after choose the event of `on`; add on = \"<event>\" or remove them",
            ));
        }
        return Ok(None);
    };
    let name = s.string("on", &on_v)?;
    let ours = topo.points.iter().copied().find(|p| p.name() == name);
    let Some(event) = TriggerEvent::parse(&name).or(ours) else {
        let passing = registry.passing(&name);
        let m = if passing.is_empty() {
            let points = registry.points().into_iter().map(TriggerEvent::Declared);
            let known: Vec<&str> = TriggerEvent::ALL.into_iter().chain(points).map(|e| e.name()).collect();
            format!("on: unknown event \"{name}\"; expected one of: {}", known.join(", "))
        } else {
            format!(
                "on: \"{name}\" is a point inside {}, and this scenario's recipe is {recipe}: it would never start",
                passing.join(", ")
            )
        };
        return Err(s.error(on_v.span(), m));
    };
    if event == TriggerEvent::LeaderChange && !topo.roles.iter().any(|(role, _)| *role == "leader") {
        let m = "on: \"leader-change\" comes from a ZooKeeper ensemble or an etcd cluster, and this scenario's \
                 servers elect no leader: set [backend] servers = 3 (docs/ensembles.md)";
        return Err(s.error(on_v.span(), m));
    }
    if event == TriggerEvent::ReadIndex && topo.stallable.is_empty() {
        let m = "on: \"read-index\" comes from an etcd cluster's leader, and this scenario has none: use the \
                 etcd family with [backend] servers = 3 (docs/ensembles.md)";
        return Err(s.error(on_v.span(), m));
    }
    let nth = match &nth_v {
        None => 1,
        Some(v) => match v.get_ref() {
            toml::Value::Integer(n) if (1..=1_000_000).contains(n) => *n as u32,
            _ => {
                let m = "nth: expected a whole number from 1 to 1000000 (1: the first matching event after `at`)";
                return Err(s.error(v.span(), m));
            }
        },
    };
    let client = match &client_v {
        None => None,
        Some(v) => {
            let name = s.string("client", v)?;
            if !topo.clients.contains(&name) {
                let m = format!(
                    "client: no client \"{name}\" in this scenario; expected one of: {}",
                    topo.clients.join(", ")
                );
                return Err(s.error(v.span(), m));
            }
            Some(name)
        }
    };
    let after = match &after_v {
        None => Duration::ZERO,
        Some(v) => s.duration("after", v, false)?.1,
    };
    Ok(Some(Trigger { event, nth, client, after }))
}

fn random(src: &Source, r: &crate::file::RandomFile, topo: &Topology) -> Result<RandomFaults, ScenarioError> {
    let empty = Table::new();
    let section = Section::new(src, "[faults.random]", &empty);
    if r.kinds.get_ref().is_empty() {
        return Err(
            src.error(r.kinds.span(), "kinds: expected at least one fault kind (an empty nemesis injects nothing)")
        );
    }
    let mut kinds = Vec::new();
    for k in r.kinds.get_ref() {
        let kind = fault_kind(&section, &Spanned::new(k.span(), toml::Value::String(k.get_ref().clone())))?;
        let spec = kind.spec();
        if let Nemesis::Never(why) = spec.nemesis {
            return Err(src.error(k.span(), format!("kinds: {why}")));
        }
        if spec.means.needs_replica && topo.failover_masters.is_empty() {
            let m = format!(
                "kinds: {} needs [backend] replicas = 1 and sentinels = 0 (Sentinels fail a master over themselves)",
                spec.name
            );
            return Err(src.error(k.span(), m));
        }
        kinds.push(kind);
    }
    let every = *r.every.get_ref();
    if every.0.is_zero() {
        return Err(src.error(r.every.span(), "every: the shortest gap between faults must be above zero"));
    }
    let target = r.target.as_ref().map(|t| {
        let v = Spanned::new(t.span(), toml::Value::String(t.get_ref().clone()));
        target(&section, &v, topo)
    });
    let target = target.transpose()?;
    if let (Some(Target::Trigger), Some(t)) = (&target, &r.target) {
        return Err(src.error(t.span(), "target: \"trigger\" is what `aim = true` does; leave target out"));
    }
    Ok(RandomFaults { kinds, every: (every.0, every.1), duration: (r.duration.0, r.duration.1), target, aim: r.aim })
}

pub(crate) fn expect(src: &Source, e: &ExpectFile) -> Result<Expect, ScenarioError> {
    let verdict = match e.verdict.get_ref().as_str() {
        "safe" => Verdict::Safe,
        "unsafe" => Verdict::Unsafe,
        other => {
            return Err(
                src.error(e.verdict.span(), format!("verdict: expected \"safe\" or \"unsafe\", found \"{other}\""))
            )
        }
    };
    let kinds = |list: &[Spanned<String>]| -> Result<Vec<FindingKind>, ScenarioError> {
        list.iter()
            .map(|f| {
                FindingKind::parse(f.get_ref()).ok_or_else(|| {
                    let known: Vec<&str> = FindingKind::ALL.iter().map(|k| k.name()).collect();
                    src.error(
                        f.span(),
                        format!("unknown finding kind \"{}\"; expected one of: {}", f.get_ref(), known.join(", ")),
                    )
                })
            })
            .collect()
    };
    let (findings, absent) = (kinds(&e.findings)?, kinds(&e.absent)?);
    if verdict == Verdict::Safe {
        if let Some(bad) = e.findings.iter().find(|f| FindingKind::parse(f.get_ref()).is_some_and(|k| k.is_violation()))
        {
            return Err(src.error(bad.span(), "findings: a \"safe\" verdict cannot expect a violation"));
        }
    }
    Ok(Expect { verdict, findings, absent, hazards: vec![] })
}
