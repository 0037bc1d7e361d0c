//! Helpers shared by the scenario-level tests.
#![allow(dead_code)]

use locksim_locks::Registry;
use locksim_scenarios::sweep::{sweep, ScenarioResult};
use locksim_scenarios::Scenario;
use std::path::{Path, PathBuf};

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
