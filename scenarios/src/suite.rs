//! Suites: many scenarios over seed ranges, each judged against its own `[expect]` or the suite's.
//!
//! ```toml
//! name = "smoke"
//!
//! [[run]]
//! scenario = "../catalog/redis-del-gc-pause.toml"   # relative to the suite file
//! seeds = "0..200"
//! # clients = 16                                    # optional: another number of clients
//! # hazards = ["lease-expired-while-held"]          # optional: some seed must reach each
//! # [run.expect]                                    # optional: overrides the scenario's [expect]
//! # verdict = "unsafe"
//! # findings = ["double-holder"]
//! ```

use crate::file::{ExpectFile, ScenarioError, Source};
use crate::scenario::{LoadError, Scenario};
use locksim_locks::Registry;
use locksim_sim::fault::{FaultKind, Target};
use locksim_sim::hazard::Hazard;
use serde::Deserialize;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    name: Option<String>,
    #[serde(default)]
    run: Vec<RunFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunFile {
    scenario: Spanned<String>,
    seeds: Spanned<String>,
    clients: Option<Spanned<i64>>,
    /// Hazards some seed of the run must reach (see [`locksim_sim::hazard`]).
    hazards: Option<Vec<Spanned<String>>>,
    expect: Option<ExpectFile>,
}

/// One run of a suite: a scenario (with the suite's overrides applied) and its seeds.
pub struct SuiteRun {
    pub scenario: Scenario,
    pub seeds: Range<u64>,
}

pub struct Suite {
    pub name: String,
    pub runs: Vec<SuiteRun>,
}

/// `A..B` (B exclusive) or one seed `A`.
pub fn parse_seeds(text: &str) -> Result<Range<u64>, String> {
    let bad = || format!("expected a seed range such as 0..200 (end exclusive) or one seed, found {text:?}");
    let range = match text.split_once("..") {
        Some((a, b)) => a.parse().map_err(|_| bad())?..b.parse().map_err(|_| bad())?,
        None => {
            let one: u64 = text.parse().map_err(|_| bad())?;
            one..one.checked_add(1).ok_or_else(bad)?
        }
    };
    if range.is_empty() {
        return Err(format!("the seed range {text:?} is empty"));
    }
    Ok(range)
}

/// `dir/rel` with `.` and `..` worked out, so that repro lines name files as a user would.
fn join(dir: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in dir.join(rel).components() {
        match part {
            Component::ParentDir if out.file_name().is_some_and(|n| n != "..") => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

impl Suite {
    /// Read a suite and every scenario it names. Errors name the file, line and column at fault.
    pub fn load(path: &Path, registry: &Registry) -> Result<Suite, LoadError> {
        let shown = path.display().to_string();
        let text = crate::scenario::read_text(path, &shown)?;
        let src = Source { path: &shown, text: &text };
        let file: SuiteFile = toml::from_str(&text).map_err(|e| src.toml_error(&e))?;
        if file.run.is_empty() {
            return Err(src.error(0..0, "a suite needs at least one [[run]] with scenario and seeds").into());
        }
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut runs = Vec::new();
        for run in &file.run {
            let seeds =
                parse_seeds(run.seeds.get_ref()).map_err(|m| src.error(run.seeds.span(), format!("seeds: {m}")))?;
            let scenario_path = join(dir, run.scenario.get_ref());
            let mut scenario = match Scenario::load(&scenario_path, registry) {
                Err(LoadError::Io { error, .. }) => {
                    let m = format!("scenario: cannot read {}: {error}", scenario_path.display());
                    return Err(src.error(run.scenario.span(), m).into());
                }
                other => other?,
            };
            if scenario.only_real() {
                let m = format!("scenario: {}: {}", scenario_path.display(), locksim_locks::command::ONLY_REAL);
                return Err(src.error(run.scenario.span(), m).into());
            }
            if let Some(clients) = &run.clients {
                override_clients(&src, &mut scenario, clients)?;
            }
            if let Some(expect) = &run.expect {
                scenario.expect = crate::scenario::expect(&src, expect)?;
            }
            for name in run.hazards.iter().flatten() {
                let h = hazard(&src, name)?;
                if scenario.expect.hazards.contains(&h) {
                    return Err(src.error(name.span(), format!("hazards: {h} is listed twice")).into());
                }
                if let Some(why) = unreachable(h, &scenario, registry) {
                    let m = format!("hazards: {} can never reach {h}: {why}", scenario.name);
                    return Err(src.error(name.span(), m).into());
                }
                scenario.expect.hazards.push(h);
            }
            runs.push(SuiteRun { scenario, seeds });
        }
        let name = file.name.unwrap_or_else(|| path.file_stem().map_or(shown.clone(), |s| s.to_string_lossy().into()));
        Ok(Suite { name, runs })
    }
}

/// A hazard by its name; an unknown one is an error listing the known ones.
fn hazard(src: &Source, name: &Spanned<String>) -> Result<Hazard, ScenarioError> {
    Hazard::parse(name.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = Hazard::ALL.iter().map(|h| h.name()).collect();
        let m = format!("hazards: unknown hazard {:?}; expected one of: {}", name.get_ref(), known.join(", "));
        src.error(name.span(), m)
    })
}

/// Why `scenario` can never reach `hazard` (`None`: it can), so that a requirement no seed could meet is
/// refused before anything runs rather than failing after every seed has.
fn unreachable(hazard: Hazard, scenario: &Scenario, registry: &Registry) -> Option<String> {
    let family = scenario.recipe.family;
    let has = |kind: FaultKind| {
        scenario.schedule.iter().any(|f| f.action.kind() == kind)
            || scenario.random.as_ref().is_some_and(|r| r.kinds.contains(&kind))
    };
    let marked = || {
        (!(family.marks)(hazard)).then(|| {
            let by = registry.families().into_iter().filter(|f| (f.marks)(hazard)).map(|f| f.name);
            let by: Vec<&str> = by.collect();
            format!(
                "it is marked by the {} family only, and {} is {}",
                by.join(" or "),
                scenario.recipe.id,
                family.name
            )
        })
    };
    // The faults that bring it about, as their kinds declare (`Spec::brings`).
    let kinds: Vec<FaultKind> =
        FaultKind::ALL.into_iter().filter(|k| k.spec().means.brings.contains(&hazard)).collect();
    let needs = || {
        (!kinds.is_empty() && !kinds.iter().any(|k| has(*k))).then(|| {
            let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            let names = match names.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                _ => names.join(""),
            };
            format!("it needs a {names} fault, and the scenario has none")
        })
    };
    // A hazard some family's servers or clients mark needs that family; the world marks the others.
    let by_families = registry.families().into_iter().any(|f| (f.marks)(hazard));
    match by_families {
        true => marked().or_else(needs),
        false => needs(),
    }
}

fn override_clients(src: &Source, scenario: &mut Scenario, clients: &Spanned<i64>) -> Result<(), ScenarioError> {
    crate::scenario::check_clients(src, clients)?;
    let n = *clients.get_ref();
    scenario.workload.clients = n as usize;
    scenario.name = format!("{}-{n}-clients", scenario.name);
    let topology = scenario.topology();
    let known =
        |name: &String| name == "resource" || topology.clients.contains(name) || topology.servers.contains(name);
    let gone =
        scenario.schedule.iter().find_map(|f| match (&f.target, f.on.as_ref().and_then(|on| on.client.as_ref())) {
            (Target::Node(name), _) | (_, Some(name)) if !known(name) => Some(name.clone()),
            _ => None,
        });
    if let Some(gone) = gone {
        let m = format!("clients: {} names {gone}, which {n} clients do not have", scenario.name);
        return Err(src.error(clients.span(), m));
    }
    Ok(())
}
