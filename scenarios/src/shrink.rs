//! Shrinking: the smallest written-out schedule that still gives a failing seed its finding.
//!
//! 1. The seed's faults are written out: the nemesis's draws become `[[faults.schedule]]` entries (the
//!    same run — the nemesis has its own random stream, so nothing else moves).
//! 2. Faults are removed, latest first, while the finding still occurs.
//! 3. Each remaining fault's duration is halved while it still occurs.
//! 4. Each fault is moved later, by halves of the time left in the run, while it still occurs.
//!
//! The result is a scenario file that `repro` replays at the same seed. An aimed fault keeps its trigger
//! (`on`, `nth`, `client`); postponing moves the time it is armed.

use crate::checkers::FindingKind;
use crate::run::{resolve_schedule, run_seed, HarnessError};
use crate::scenario::{Expect, Scenario, Verdict};
use locksim_sim::fault::{fmt_duration, Fault, Slot};
use std::time::Duration;

/// A shrunk schedule and what it still shows.
pub struct Shrunk {
    pub scenario: Scenario,
    pub seed: u64,
    pub kind: FindingKind,
    /// Faults the seed ran, and faults left.
    pub faults_before: usize,
    /// Runs it took.
    pub tries: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ShrinkError {
    #[error("seed {0} found no violation to shrink")]
    NothingToShrink(u64),
    #[error("seed {seed} did not find {kind}")]
    NotFound { seed: u64, kind: &'static str },
    #[error(transparent)]
    Harness(#[from] HarnessError),
}

struct Search<'a> {
    scenario: &'a Scenario,
    seed: u64,
    kind: FindingKind,
    tries: usize,
}

impl Search<'_> {
    /// Does `schedule` (written out) still give the finding?
    fn fails(&mut self, schedule: &[Fault]) -> Result<bool, HarnessError> {
        self.tries += 1;
        let mut s = self.scenario.clone();
        s.random = None;
        s.schedule = schedule.to_vec();
        s.schedule.sort_by_key(|f| f.at);
        Ok(run_seed(&s, self.seed)?.result.counts.contains_key(&self.kind))
    }
}

/// Whole milliseconds, so that written-out times read well.
fn ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Remove faults, latest first, while the finding still occurs.
fn remove(search: &mut Search, mut faults: Vec<Fault>) -> Result<Vec<Fault>, HarnessError> {
    for i in (0..faults.len()).rev() {
        let mut without = faults.clone();
        without.remove(i);
        if search.fails(&without)? {
            faults = without;
        }
    }
    Ok(faults)
}

/// Halve each fault's duration while the finding still occurs.
fn shorten(search: &mut Search, mut faults: Vec<Fault>) -> Result<Vec<Fault>, HarnessError> {
    for i in 0..faults.len() {
        while let Some(d) = faults[i].action.duration() {
            let mut shorter = faults.clone();
            shorter[i].action = faults[i].action.lasting(ms(d / 2));
            if d < Duration::from_millis(20) || !search.fails(&shorter)? {
                break;
            }
            faults = shorter;
        }
    }
    Ok(faults)
}

/// Move each fault later, by halves of the time left in the run, while the finding still occurs.
fn postpone(search: &mut Search, mut faults: Vec<Fault>, end: Duration) -> Result<Vec<Fault>, HarnessError> {
    for i in 0..faults.len() {
        let at = faults[i].at;
        let mut step = ms(end.saturating_sub(at) / 2);
        while step >= Duration::from_millis(100) {
            let mut later = faults.clone();
            let moved = later[i].at + step;
            if moved >= end {
                break;
            }
            later[i].at = moved;
            if search.fails(&later)? {
                faults = later;
            } else {
                step = ms(step / 2);
            }
        }
    }
    faults.sort_by_key(|f| f.at);
    Ok(faults)
}

/// Shrink `seed` of `scenario` keeping `kind` (default: the seed's first violation).
pub fn shrink(scenario: &Scenario, seed: u64, kind: Option<FindingKind>) -> Result<Shrunk, ShrinkError> {
    let first = run_seed(scenario, seed)?.result;
    let kind = match kind {
        Some(k) if first.counts.contains_key(&k) => k,
        Some(k) => return Err(ShrinkError::NotFound { seed, kind: k.name() }),
        None => *first.counts.keys().find(|k| k.is_violation()).ok_or(ShrinkError::NothingToShrink(seed))?,
    };
    let mut search = Search { scenario, seed, kind, tries: 1 };
    let mut faults = resolve_schedule(scenario, seed);
    let faults_before = faults.len();
    // Until a round changes nothing (a moved fault may have become unnecessary), at most a few rounds.
    for _ in 0..4 {
        let before = faults.len();
        let before_text: Vec<String> = faults.iter().map(crate::run::describe).collect();
        faults = remove(&mut search, faults)?;
        faults = shorten(&mut search, faults)?;
        faults = postpone(&mut search, faults, scenario.workload.duration)?;
        if faults.len() == before && faults.iter().map(crate::run::describe).collect::<Vec<_>>() == before_text {
            break;
        }
    }
    let mut shrunk = scenario.clone();
    shrunk.random = None;
    shrunk.schedule = faults;
    shrunk.name = format!("{}-seed-{seed}-shrunk", scenario.name);
    shrunk.description = format!(
        "{} (shrunk from {} seed {seed}: {} faults to {})",
        scenario.description,
        scenario.path,
        faults_before,
        shrunk.schedule.len()
    );
    shrunk.expect = Expect { verdict: Verdict::Unsafe, findings: vec![kind], absent: vec![], hazards: vec![] };
    Ok(Shrunk { scenario: shrunk, seed, kind, faults_before, tries: search.tries })
}

/// One fault as a `[[faults.schedule]]` table.
fn fault_table(f: &Fault) -> toml::Table {
    let mut t = toml::Table::new();
    let d = |d: &Duration| toml::Value::String(fmt_duration(*d));
    t.insert("at".into(), d(&f.at));
    t.insert("kind".into(), f.action.kind().name().into());
    t.insert("target".into(), f.target.to_string().into());
    if let Some(on) = &f.on {
        t.insert("on".into(), on.event.name().into());
        if on.nth != 1 {
            t.insert("nth".into(), i64::from(on.nth).into());
        }
        if let Some(client) = &on.client {
            t.insert("client".into(), client.clone().into());
        }
        if !on.after.is_zero() {
            t.insert("after".into(), d(&on.after));
        }
    }
    let params = f.action.params();
    for key in f.action.kind().spec().keys {
        let value = match key.slot {
            Slot::Duration => params.duration.as_ref().map(d),
            Slot::Latency => params.latency.as_ref().map(d),
            Slot::Delta => params.delta_ms.map(|ms| {
                let magnitude = fmt_duration(Duration::from_millis(ms.unsigned_abs()));
                toml::Value::String(if ms < 0 { format!("-{magnitude}") } else { magnitude })
            }),
            Slot::Rate(_) => params.rate.map(toml::Value::Float),
            Slot::Peers if params.peers.is_empty() => None,
            Slot::Peers => Some(toml::Value::Array(params.peers.iter().map(|n| n.clone().into()).collect())),
        };
        if let Some(value) = value {
            t.insert(key.slot.name().into(), value);
        }
    }
    t
}

impl Shrunk {
    /// The shrunk scenario as a file: the original's text with its faults written out and its
    /// expectation set to the finding.
    pub fn to_toml(&self, original_text: &str) -> Result<String, toml::de::Error> {
        let mut file: toml::Table = toml::from_str(original_text)?;
        let s = &self.scenario;
        file.insert("name".into(), s.name.clone().into());
        file.insert("description".into(), s.description.clone().into());
        let schedule = s.schedule.iter().map(|f| toml::Value::Table(fault_table(f))).collect();
        let mut faults = toml::Table::new();
        faults.insert("schedule".into(), toml::Value::Array(schedule));
        file.insert("faults".into(), toml::Value::Table(faults));
        let mut expect = toml::Table::new();
        expect.insert("verdict".into(), "unsafe".into());
        expect.insert("findings".into(), toml::Value::Array(vec![self.kind.name().into()]));
        file.insert("expect".into(), toml::Value::Table(expect));
        let header = format!(
            "# Shrunk by `locksim shrink` from {} seed {}; replay with --seed {}.\n",
            s.path, self.seed, self.seed
        );
        Ok(header + &in_file_order(&file))
    }
}

/// Sections in the order of the file format (docs/scenarios.md) and of the catalog's files.
const SECTIONS: [&str; 9] =
    ["name", "description", "recipe", "model", "backend", "workload", "faults", "check", "expect"];

/// Keys that lead their table, in this order (`id` of a recipe, `at` and `kind` of a fault, `kind` and
/// `clients` of a workload, `[[faults.schedule]]` before `[faults.random]`); the rest follow alphabetically.
const LEADING: [&str; 16] = [
    "id", "command", "at", "on", "nth", "client", "after", "kind", "clients", "target", "peers", "duration", "verdict",
    "findings", "schedule", "random",
];

fn key_rank(key: &str, order: &[&str]) -> (usize, String) {
    (order.iter().position(|k| *k == key).unwrap_or(order.len()), key.to_string())
}

/// `file` as TOML with its sections in the file format's order, not alphabetically (`[expect]`
/// before `[recipe]`, as `toml::to_string` writes a table).
pub fn in_file_order(file: &toml::Table) -> String {
    let mut out = String::new();
    write_table(&mut out, "", file, &SECTIONS);
    out
}

/// Write `table` (named `path`, "" at the top): its values, then its tables and arrays of tables.
fn write_table(out: &mut String, path: &str, table: &toml::Table, order: &[&str]) {
    let is_table = |v: &toml::Value| match v {
        toml::Value::Table(_) => true,
        toml::Value::Array(a) => !a.is_empty() && a.iter().all(toml::Value::is_table),
        _ => false,
    };
    let mut keys: Vec<&String> = table.keys().collect();
    keys.sort_by_key(|k| key_rank(k, order));
    for key in keys.iter().filter(|k| !is_table(&table[k.as_str()])) {
        out.push_str(&format!("{} = {}\n", toml_key(key), table[key.as_str()]));
    }
    for key in keys.iter().filter(|k| is_table(&table[k.as_str()])) {
        let name = if path.is_empty() { toml_key(key) } else { format!("{path}.{}", toml_key(key)) };
        match &table[key.as_str()] {
            toml::Value::Table(t) => {
                // A table holding only tables (`faults`) needs no header of its own.
                if t.is_empty() || t.values().any(|v| !is_table(v)) {
                    out.push_str(&format!("\n[{name}]\n"));
                }
                write_table(out, &name, t, &LEADING);
            }
            toml::Value::Array(entries) => {
                for t in entries.iter().filter_map(toml::Value::as_table) {
                    out.push_str(&format!("\n[[{name}]]\n"));
                    write_table(out, &name, t, &LEADING);
                }
            }
            _ => unreachable!("only tables and arrays of tables are left"),
        }
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        toml::Value::String(key.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shrunk_file_lists_its_sections_in_the_file_format_order() {
        let text = "name = \"t\"\ndescription = \"d\"\n[recipe]\nid = \"redis.set-nx-px\"\nttl = \"5s\"\n\
                    [workload]\nkind = \"counter\"\nclients = 3\nduration = \"20s\"\nhold = [\"1ms\", \"2ms\"]\n\
                    [[faults.schedule]]\nat = \"5s\"\nkind = \"pause\"\ntarget = \"holder\"\nduration = \"8s\"\n\
                    [faults.random]\nkinds = [\"pause\"]\n[check]\nliveness = \"10s\"\n\
                    [expect]\nverdict = \"unsafe\"\nfindings = [\"double-holder\"]\n";
        let file: toml::Table = toml::from_str(text).unwrap();
        let written = in_file_order(&file);
        let lines: Vec<&str> = written.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines, text.lines().collect::<Vec<_>>(), "{written}");
        assert_eq!(toml::from_str::<toml::Table>(&written).unwrap(), file);
    }

    /// Each fault kind, written out as a shrunk file writes it, reads back as the same fault: every kind
    /// on a Redis master with a replica, and `stall` and `lag` (a cluster member's) on an etcd cluster.
    #[test]
    fn every_kind_written_out_reads_back_as_the_same_fault() {
        let tail = "[workload]\nkind = \"counter\"\nclients = 3\nduration = \"60s\"\n\
                    [check]\nliveness = \"20s\"\n[expect]\nverdict = \"safe\"\n";
        let redis = format!(
            "name = \"t\"\ndescription = \"d\"\n[recipe]\nid = \"redis.set-nx-px\"\n[backend]\nreplicas = 1\n{tail}"
        );
        let etcd =
            format!("name = \"t\"\ndescription = \"d\"\n[recipe]\nid = \"etcd.mutex\"\n[backend]\nservers = 3\n{tail}");
        let on_redis = "[[faults.schedule]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"holder\"\nduration = \"2s\"\n\
            [[faults.schedule]]\nat = \"2s\"\nkind = \"crash\"\ntarget = \"client-0\"\nduration = \"1500ms\"\n\
            [[faults.schedule]]\nat = \"3s\"\nkind = \"host-crash\"\ntarget = \"client-1\"\n\
            [[faults.schedule]]\nat = \"9s\"\nkind = \"restart\"\ntarget = \"client-1\"\n\
            [[faults.schedule]]\nat = \"4s\"\nkind = \"partition\"\ntarget = \"client-2\"\npeers = [\"redis-0\"]\nduration = \"3s\"\n\
            [[faults.schedule]]\nat = \"5s\"\nkind = \"clog\"\ntarget = \"redis-0\"\n\
            [[faults.schedule]]\nat = \"6s\"\nkind = \"delay\"\ntarget = \"client-2\"\nlatency = \"250ms\"\nduration = \"2s\"\n\
            [[faults.schedule]]\nat = \"7s\"\nkind = \"loss\"\ntarget = \"client-0\"\nrate = 0.3\n\
            [[faults.schedule]]\nat = \"8s\"\nkind = \"drop-reply\"\ntarget = \"redis-0\"\nduration = \"1s\"\n\
            [[faults.schedule]]\nat = \"10s\"\nkind = \"clock-jump\"\ntarget = \"client-2\"\ndelta = \"-3s\"\n\
            [[faults.schedule]]\nat = \"11s\"\nkind = \"clock-drift\"\ntarget = \"redis-0\"\nrate = 1.5\n\
            [[faults.schedule]]\nat = \"12s\"\nkind = \"failover\"\ntarget = \"redis-0\"\n";
        let on_etcd = "[[faults.schedule]]\nat = \"13s\"\nkind = \"stall\"\ntarget = \"leader\"\nduration = \"2s\"\n\
            [[faults.schedule]]\nat = \"14s\"\nkind = \"lag\"\ntarget = \"etcd-1\"\nlatency = \"1s\"\nduration = \"3s\"\n";
        let registry = locksim_locks::Registry::builtin();
        let mut kinds = std::collections::BTreeSet::new();
        for (head, faults) in [(redis, on_redis), (etcd, on_etcd)] {
            let read = Scenario::parse("t.toml", &format!("{head}{faults}"), &registry).unwrap();
            kinds.extend(read.schedule.iter().map(|f| f.action.kind()));
            let schedule = read.schedule.iter().map(|f| toml::Value::Table(fault_table(f))).collect();
            let mut written = toml::Table::new();
            written.insert("schedule".into(), toml::Value::Array(schedule));
            let mut file = toml::Table::new();
            file.insert("faults".into(), toml::Value::Table(written));
            let text = format!("{head}{}", toml::to_string(&file).unwrap());
            let again = Scenario::parse("t.toml", &text, &registry).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(again.schedule, read.schedule, "{text}");
        }
        assert_eq!(kinds.len(), locksim_sim::fault::FaultKind::ALL.len(), "every kind: {kinds:?}");
    }
}
