//! `locksim list`: what can go into a scenario file.

use locksim_locks::params::ParamSpec;
use locksim_locks::Registry;
use locksim_sim::fault::{FaultKind, TriggerEvent};
use locksim_sim::hazard::Hazard;
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// What to list.
    #[arg(value_enum)]
    what: Option<What>,
    /// Where the shipped scenarios are.
    #[arg(long, default_value = "scenarios/catalog")]
    dir: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq)]
enum What {
    Recipes,
    Workloads,
    Faults,
    Hazards,
    Scenarios,
}

pub fn list(args: Args, registry: &Registry) -> anyhow::Result<ExitCode> {
    let all = args.what.is_none();
    let mut out = String::new();
    if all || args.what == Some(What::Recipes) {
        recipes(&mut out, registry);
    }
    if all || args.what == Some(What::Workloads) {
        workloads(&mut out, registry);
    }
    if all || args.what == Some(What::Faults) {
        faults(&mut out, registry);
    }
    if all || args.what == Some(What::Hazards) {
        hazards(&mut out);
    }
    if all || args.what == Some(What::Scenarios) {
        scenarios(&mut out, &args.dir, registry)?;
    }
    super::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn params(out: &mut String, specs: &[ParamSpec], indent: &str) {
    for p in specs {
        let _ = writeln!(out, "{indent}{:<18} = {:<22} {}", p.name, ParamSpec::show(&p.default), p.doc);
    }
}

fn recipes(out: &mut String, registry: &Registry) {
    let _ = writeln!(out, "Recipes ([recipe] id = ..., parameters beside it with their defaults):");
    // Each family once, in the order it first appears: a user's recipes come after the built-ins and
    // may belong to a built-in family, so equal names need not be adjacent.
    let mut families: Vec<&str> = Vec::new();
    for r in registry.recipes() {
        if !families.contains(&r.family.name) {
            families.push(r.family.name);
        }
    }
    for family in families {
        let recipes: Vec<_> = registry.recipes().iter().filter(|r| r.family.name == family).collect();
        let spec = recipes[0].family;
        let _ = writeln!(out, "\n  [backend] of the {} family — {}", spec.name, spec.summary);
        params(out, spec.params, "      ");
        for r in recipes {
            let token = if r.offers_token { "fencing token" } else { "no fencing token" };
            let _ = writeln!(out, "\n  {}  — {} ({token}; {})", r.id, r.summary, r.source);
            params(out, r.params, "      ");
        }
    }
    out.push('\n');
}

fn workloads(out: &mut String, registry: &Registry) {
    let _ = writeln!(out, "Workloads ([workload] kind = ...):");
    let _ = writeln!(out, "  {:<12} read the counter, hold, write it plus one (readers only read)", "counter");
    let _ =
        writeln!(out, "  {:<12} buyers take one item each from `stock`; checks oversell and lost-update", "flash-sale");
    for w in registry.works() {
        let _ = writeln!(out, "  {:<12} {} (your own; its invariant is checked as `invariant`)", w.id, w.summary);
    }
    out.push('\n');
}

fn faults(out: &mut String, registry: &Registry) {
    let _ =
        writeln!(out, "Fault kinds ([[faults.schedule]] kind = ..., with at and target; or [faults.random] kinds):");
    for k in FaultKind::ALL {
        let _ = writeln!(out, "  {:<12} {}", k.name(), k.describe());
    }
    let _ = writeln!(
        out,
        "  targets: a node (client-0, redis-0, redis-0-replica, resource), \"holder\", \"waiter\" (a client inside \
         acquire), \"random-client\", or \"trigger\" (the node whose event started an aimed fault)"
    );
    let _ = writeln!(
        out,
        "Events that start an aimed fault (on = ..., with nth = N and client = \"client-N\"; at arms it):"
    );
    // The history's events, then the points the recipes declare (each once, though several pass it).
    let points = registry.points().into_iter().map(TriggerEvent::Declared);
    for e in TriggerEvent::ALL.into_iter().chain(points) {
        let _ = writeln!(out, "  {:<20} {}", e.name(), e.describe());
    }
    out.push('\n');
}

fn hazards(out: &mut String) {
    let _ = writeln!(
        out,
        "Hazards (what `run` and `suite` count per seed; a suite's [[run]] hazards = [...] requires them):"
    );
    for h in Hazard::ALL {
        let _ = writeln!(out, "  {:<30} {}", h.name(), h.describe());
    }
    out.push('\n');
}

fn scenarios(out: &mut String, dir: &PathBuf, registry: &Registry) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e} (run from the repository root, or pass --dir)", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.retain(|p| p.extension().is_some_and(|x| x == "toml"));
    paths.sort();
    let _ = writeln!(out, "Scenarios in {}:", dir.display());
    for path in paths {
        let _ = match super::load(&path, registry) {
            Ok(s) => {
                let expects = format!("{:?}", s.expect.verdict).to_lowercase();
                writeln!(out, "  {:<52} {:<20} {expects:<6}  {}", path.display(), s.recipe.id, s.description)
            }
            Err(e) => writeln!(out, "  {:<52} (invalid: {e})", path.display()),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_recipe_of_a_builtin_family_lists_that_family_once() {
        let builtin = Registry::builtin();
        let zk = *builtin.recipes().iter().find(|r| r.family.name == "zk").expect("a zk recipe");
        let registry = builtin.clone().with(locksim_locks::RecipeSpec { id: "my.zk-poll", ..zk });
        let mut out = String::new();
        recipes(&mut out, &registry);
        for family in ["redis", "zk", "etcd", "sql", "none"] {
            let heading = format!("[backend] of the {family} family");
            assert_eq!(out.matches(&heading).count(), 1, "{heading}:\n{out}");
        }
        let (zk_block, _) = out.split_once("[backend] of the etcd family").unwrap();
        assert!(zk_block.contains("my.zk-poll"), "the user's recipe sits in its family's block:\n{out}");
    }
}
