//! Results files: what `run --json` and `suite --json` write and `report` reads — every run's seeds,
//! findings and measurements. Shards of one sweep, in separate files, merge into the unsharded result.

use locksim_scenarios::run::SeedResult;
use locksim_scenarios::sweep::{merge, ScenarioResult};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultsFile {
    /// The suite's name, or the scenario's for `run`.
    pub name: String,
    pub runs: Vec<ScenarioResult>,
}

impl ResultsFile {
    pub fn write(self, path: &Path) -> anyhow::Result<()> {
        let mut out = ResultsWriter::create(path, &self.name)?;
        for mut run in self.runs {
            for seed in std::mem::take(&mut run.results) {
                out.seed(&seed)?;
            }
            out.run(&run)?;
        }
        out.finish()
    }

    pub fn read(path: &Path) -> anyhow::Result<ResultsFile> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let file: ResultsFile = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!("{}:{}:{}: not a locksim results file: {e}", path.display(), e.line(), e.column())
        })?;
        Ok(ResultsFile { runs: file.runs.into_iter().map(ScenarioResult::with_rates).collect(), ..file })
    }

    /// Several files (shards, or different suites) as one: runs of the same scenario file, name and
    /// client count (simulated, or one real run) are merged and judged again; the order is that of first appearance. Refused when a
    /// run's parts do not add up to one sweep (see [`merge`]).
    pub fn merge(files: Vec<ResultsFile>) -> Result<ResultsFile, String> {
        let name = files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(" + ");
        // Real runs stand beside the simulated runs of the same scenario, never merged with them.
        let mut order: Vec<(String, String, usize, bool)> = Vec::new();
        let mut groups: BTreeMap<(String, String, usize, bool), Vec<ScenarioResult>> = BTreeMap::new();
        for run in files.into_iter().flat_map(|f| f.runs) {
            let key = (run.path.clone(), run.scenario.clone(), run.clients, run.real);
            if !groups.contains_key(&key) {
                order.push(key.clone());
            }
            groups.entry(key).or_default().push(run);
        }
        let runs = order.into_iter().map(|k| merge(groups.remove(&k).expect("grouped"))).collect::<Result<_, _>>()?;
        Ok(ResultsFile { name, runs })
    }
}

/// Writes a results file as the seeds finish, so that a sweep never holds its seeds' results: one
/// line per seed result, then the run's judgement (one line per field, keys in alphabetical order).
/// The file is a [`ResultsFile`] in JSON; [`ResultsFile::write`] goes through here too, so there is
/// one layout.
pub struct ResultsWriter {
    out: BufWriter<File>,
    path: PathBuf,
    /// Runs written so far, and seeds written of the current run.
    runs: usize,
    seeds: usize,
}

impl ResultsWriter {
    pub fn create(path: &Path, name: &str) -> anyhow::Result<ResultsWriter> {
        let file = File::create(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut w = ResultsWriter { out: BufWriter::new(file), path: path.to_path_buf(), runs: 0, seeds: 0 };
        let name = serde_json::to_string(name)?;
        w.put(&format!("{{\n  \"name\": {name},\n  \"runs\": ["))?;
        Ok(w)
    }

    /// The next seed's result of the current run.
    pub fn seed(&mut self, seed: &SeedResult) -> anyhow::Result<()> {
        if self.seeds == 0 {
            self.open_run()?;
        }
        let sep = if self.seeds == 0 { "" } else { "," };
        self.seeds += 1;
        let json = serde_json::to_string(seed)?;
        self.put(&format!("{sep}\n        {json}"))
    }

    /// The current run's judgement, after its seeds; the next seed starts a new run.
    pub fn run(&mut self, run: &ScenarioResult) -> anyhow::Result<()> {
        if self.seeds == 0 {
            self.open_run()?;
        }
        let serde_json::Value::Object(fields) = serde_json::to_value(run)? else {
            unreachable!("a run serializes to a JSON object")
        };
        let mut text = String::from("\n      ]");
        for (key, value) in fields.iter().filter(|(k, _)| *k != "results") {
            text.push_str(&format!(",\n      {}: {}", serde_json::to_string(key)?, serde_json::to_string(value)?));
        }
        text.push_str("\n    }");
        self.runs += 1;
        self.seeds = 0;
        self.put(&text)
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.put("\n  ]\n}\n")?;
        self.out.flush().map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }

    fn open_run(&mut self) -> anyhow::Result<()> {
        let sep = if self.runs == 0 { "" } else { "," };
        self.put(&format!("{sep}\n    {{\n      \"results\": ["))
    }

    fn put(&mut self, text: &str) -> anyhow::Result<()> {
        self.out.write_all(text.as_bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }
}
