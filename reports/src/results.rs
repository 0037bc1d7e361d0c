//! Results files: what `run --json` and `suite --json` write and `report` reads — every run's seeds,
//! findings and measurements. Shards of one sweep, in separate files, merge into the unsharded result.

use locksim_scenarios::sweep::{merge, ScenarioResult};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultsFile {
    /// The suite's name, or the scenario's for `run`.
    pub name: String,
    pub runs: Vec<ScenarioResult>,
}

impl ResultsFile {
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(path, json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub fn read(path: &Path) -> anyhow::Result<ResultsFile> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!("{}:{}:{}: not a locksim results file: {e}", path.display(), e.line(), e.column())
        })
    }

    /// Several files (shards, or different suites) as one: runs of the same scenario file, name and
    /// client count are merged and judged again; the order is that of first appearance. Refused when a
    /// run's parts do not add up to one sweep (see [`merge`]).
    pub fn merge(files: Vec<ResultsFile>) -> Result<ResultsFile, String> {
        let name = files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(" + ");
        let mut order: Vec<(String, String, usize)> = Vec::new();
        let mut groups: BTreeMap<(String, String, usize), Vec<ScenarioResult>> = BTreeMap::new();
        for run in files.into_iter().flat_map(|f| f.runs) {
            let key = (run.path.clone(), run.scenario.clone(), run.clients);
            if !groups.contains_key(&key) {
                order.push(key.clone());
            }
            groups.entry(key).or_default().push(run);
        }
        let runs = order.into_iter().map(|k| merge(groups.remove(&k).expect("grouped"))).collect::<Result<_, _>>()?;
        Ok(ResultsFile { name, runs })
    }
}
