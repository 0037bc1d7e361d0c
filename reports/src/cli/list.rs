//! `locksim list`: what can go into a scenario file.

use locksim_locks::params::ParamSpec;
use locksim_locks::Registry;
use locksim_sim::fault::FaultKind;
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
    Faults,
    Scenarios,
}

pub fn list(args: Args) -> anyhow::Result<ExitCode> {
    let all = args.what.is_none();
    if all || args.what == Some(What::Recipes) {
        recipes();
    }
    if all || args.what == Some(What::Faults) {
        faults();
    }
    if all || args.what == Some(What::Scenarios) {
        scenarios(&args.dir)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn params(specs: &[ParamSpec], indent: &str) {
    for p in specs {
        println!("{indent}{:<18} = {:<22} {}", p.name, ParamSpec::show(&p.default), p.doc);
    }
}

fn recipes() {
    println!("Recipes ([recipe] id = ..., parameters beside it with their defaults):");
    let registry = Registry::builtin();
    let mut families: Vec<&str> = registry.recipes().iter().map(|r| r.family.name).collect();
    families.dedup();
    for family in families {
        let recipes: Vec<_> = registry.recipes().iter().filter(|r| r.family.name == family).collect();
        let spec = recipes[0].family;
        println!("\n  [backend] of the {} family — {}", spec.name, spec.summary);
        params(spec.params, "      ");
        for r in recipes {
            let token = if r.offers_token { "fencing token" } else { "no fencing token" };
            println!("\n  {}  — {} ({token}; {})", r.id, r.summary, r.source);
            params(r.params, "      ");
        }
    }
    println!();
}

fn faults() {
    println!("Fault kinds ([[faults.schedule]] kind = ..., with at and target; or [faults.random] kinds):");
    for k in FaultKind::ALL {
        println!("  {:<12} {}", k.name(), k.describe());
    }
    println!("  targets: a node (client-0, redis-0, redis-0-replica, resource), \"holder\", or \"random-client\"\n");
}

fn scenarios(dir: &PathBuf) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e} (run from the repository root, or pass --dir)", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.retain(|p| p.extension().is_some_and(|x| x == "toml"));
    paths.sort();
    println!("Scenarios in {}:", dir.display());
    for path in paths {
        match super::load(&path) {
            Ok(s) => println!(
                "  {:<48} {:<20} expects {:?}: {}",
                path.display(),
                s.recipe.id,
                s.expect.verdict,
                s.description
            ),
            Err(e) => println!("  {:<48} (invalid: {e})", path.display()),
        }
    }
    Ok(())
}
