//! The scenario file as written (docs/scenarios.md): serde structures, positions, and precise errors.
//!
//! Fixed sections are plain serde structs with `deny_unknown_fields`; sections whose keys depend on a
//! choice made in the file — `[recipe]` (on the recipe id), `[backend]` (on the family) and each
//! `[[faults.schedule]]` entry (on its kind) — are read as tables of spanned values and checked by a
//! [`Section`] against the keys that choice declares. Every error names file, line and column.

use crate::duration::{self, Dur, DurRange};
use locksim_locks::params::{ParamKind, ParamSpec, ParamValue, Params};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use toml::Spanned;

/// A table whose keys are checked after parsing, with the position of every key and value.
pub type Table = BTreeMap<Spanned<String>, Spanned<toml::Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    pub name: Spanned<String>,
    #[serde(default)]
    pub description: String,
    pub recipe: Spanned<Table>,
    /// A command recipe's simulated model: a built-in recipe's `[recipe]` table.
    pub model: Option<Spanned<Table>>,
    #[serde(default)]
    pub backend: Table,
    pub workload: WorkloadFile,
    #[serde(default)]
    pub faults: FaultsFile,
    #[serde(default)]
    pub check: CheckFile,
    pub expect: Option<ExpectFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    pub kind: Spanned<String>,
    pub clients: Spanned<i64>,
    pub workers: Option<Spanned<i64>>,
    pub duration: Spanned<Dur>,
    #[serde(default = "default_hold")]
    pub hold: DurRange,
    #[serde(default = "default_think")]
    pub think: DurRange,
    pub fencing: Option<Spanned<bool>>,
    pub reads: Option<Spanned<f64>>,
    pub stock: Option<Spanned<i64>>,
}

fn default_hold() -> DurRange {
    DurRange(std::time::Duration::from_millis(100), std::time::Duration::from_millis(500))
}

fn default_think() -> DurRange {
    DurRange(std::time::Duration::ZERO, std::time::Duration::from_millis(200))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FaultsFile {
    #[serde(default)]
    pub schedule: Vec<Spanned<Table>>,
    pub random: Option<RandomFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomFile {
    pub kinds: Spanned<Vec<Spanned<String>>>,
    pub every: Spanned<DurRange>,
    pub duration: DurRange,
    pub target: Option<Spanned<String>>,
    /// Trigger each drawn fault by a lock-relevant event of the history or a point of the recipe
    /// (docs/scenarios.md, "Aimed faults").
    #[serde(default)]
    pub aim: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CheckFile {
    pub liveness: Option<Spanned<Dur>>,
    pub deadlock: Option<Spanned<bool>>,
    pub herd_max: Option<Spanned<i64>>,
    pub fifo: Option<bool>,
    pub starvation: Option<Spanned<bool>>,
    pub starvation_grants: Option<Spanned<i64>>,
    pub starvation_wait: Option<Spanned<Dur>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectFile {
    pub verdict: Spanned<String>,
    #[serde(default)]
    pub findings: Vec<Spanned<String>>,
    #[serde(default)]
    pub absent: Vec<Spanned<String>>,
    /// How many real runs it takes to see the verdict (`run --real`'s default count).
    pub real_runs: Option<Spanned<i64>>,
}

/// A scenario file that could not be used: where, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}:{col}: {message}")]
pub struct ScenarioError {
    pub path: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// The text of a scenario file, for turning byte spans into lines and columns.
pub struct Source<'a> {
    pub path: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    pub fn error(&self, span: Range<usize>, message: impl Into<String>) -> ScenarioError {
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        // One line, whatever the message quotes from the file (a name with a newline in it).
        let message = message.into().replace('\r', "\\r").replace('\n', "\\n");
        ScenarioError { path: self.path.to_string(), line, col, message }
    }

    pub fn parse(&self) -> Result<ScenarioFile, ScenarioError> {
        toml::from_str(self.text).map_err(|e| self.toml_error(&e))
    }

    /// A TOML or serde error at its position, naming the key whose value is at fault (`nth: expected
    /// a whole number within range`, not a bare `expected ...`), and for a list key, what it lists.
    pub fn toml_error(&self, e: &toml::de::Error) -> ScenarioError {
        let span = e.span().unwrap_or(0..0);
        let message = toml_message(e);
        let message = match key_at(self.text, span.start) {
            Some(key) if !message.starts_with(&format!("{key}:")) => {
                // serde says "invalid type: string \"x\", expected a sequence" of a list that is not one.
                let not_a_list =
                    message.strip_prefix("invalid type: ").and_then(|m| m.strip_suffix(", expected a sequence"));
                match (list_of(key), not_a_list) {
                    (Some(list), Some(found)) => format!("{key}: expected {list}, found {found}"),
                    _ => format!("{key}: {message}"),
                }
            }
            _ => message,
        };
        self.error(span, message)
    }
}

/// The key of the `key = value` line whose value holds byte `at`, if `at` is past the `=`.
fn key_at(text: &str, at: usize) -> Option<&str> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].split('\n').next().unwrap_or("");
    let eq = line.find('=')?;
    let key = line[..eq].trim().trim_matches('"');
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    (plain && at > start + eq).then_some(key)
}

/// What a key that holds a list of names lists, with an example.
fn list_of(key: &str) -> Option<&'static str> {
    Some(match key {
        "hazards" => "a list of hazard names, like [\"lease-expired-while-held\"]",
        "findings" | "absent" => "a list of finding kinds, like [\"double-holder\"]",
        "kinds" => "a list of fault kinds, like [\"pause\", \"crash\"]",
        "peers" => "a list of node names, like [\"redis-0\"]",
        _ => return None,
    })
}

/// One table being checked key by key: take the keys you know, then [`Section::finish`] rejects the rest.
pub struct Section<'a> {
    src: &'a Source<'a>,
    /// How errors name this table, e.g. "[recipe] of redis.set-nx-px".
    name: String,
    entries: BTreeMap<String, (Range<usize>, Spanned<toml::Value>)>,
    /// Where the table's first key stands: where a missing key is reported.
    start: usize,
}

impl<'a> Section<'a> {
    pub fn new(src: &'a Source<'a>, name: impl Into<String>, table: &Table) -> Section<'a> {
        let entries: BTreeMap<String, (Range<usize>, Spanned<toml::Value>)> =
            table.iter().map(|(k, v)| (k.get_ref().clone(), (k.span(), v.clone()))).collect();
        let start = entries.values().map(|(k, _)| k.start).min().unwrap_or(0);
        Section { src, name: name.into(), entries, start }
    }

    pub fn take(&mut self, key: &str) -> Option<Spanned<toml::Value>> {
        self.entries.remove(key).map(|(_, v)| v)
    }

    pub fn error(&self, span: Range<usize>, message: impl Into<String>) -> ScenarioError {
        self.src.error(span, message)
    }

    /// A string value, or an error saying what was expected.
    pub fn string(&self, key: &str, v: &Spanned<toml::Value>) -> Result<String, ScenarioError> {
        v.get_ref()
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.error(v.span(), format!("{key}: expected a string")))
    }

    pub fn require(&mut self, key: &str, what: &str) -> Result<Spanned<toml::Value>, ScenarioError> {
        let (name, start) = (self.name.clone(), self.start);
        self.take(key).ok_or_else(|| self.src.error(start..start, format!("{name} needs `{key}` ({what})")))
    }

    pub fn duration(
        &self,
        key: &str,
        v: &Spanned<toml::Value>,
        signed: bool,
    ) -> Result<(bool, std::time::Duration), ScenarioError> {
        let text = self.string(key, v)?;
        duration::parse(&text, signed).map_err(|e| self.error(v.span(), format!("{key}: {e}")))
    }

    pub fn number(&self, key: &str, v: &Spanned<toml::Value>, range: Range<f64>) -> Result<f64, ScenarioError> {
        let n = match v.get_ref() {
            toml::Value::Float(f) => Some(*f),
            toml::Value::Integer(i) => Some(*i as f64),
            _ => None,
        };
        n.filter(|n| *n > range.start && *n <= range.end).ok_or_else(|| {
            self.error(
                v.span(),
                format!("{key}: expected a number greater than {} and at most {}", range.start, range.end),
            )
        })
    }

    /// Values for every declared parameter: the file's where given (checked), defaults elsewhere.
    pub fn params(&mut self, specs: &[ParamSpec]) -> Result<Params, ScenarioError> {
        let mut given = Vec::new();
        for spec in specs {
            if let Some(v) = self.take(spec.name) {
                given.push((spec.name, self.param(spec, &v)?));
            }
        }
        Ok(Params::resolve(specs, given))
    }

    fn param(&self, spec: &ParamSpec, v: &Spanned<toml::Value>) -> Result<ParamValue, ScenarioError> {
        let bad = || self.error(v.span(), format!("{}: expected {}", spec.name, spec.expected()));
        Ok(match (spec.kind, v.get_ref()) {
            (ParamKind::Duration, _) => ParamValue::Duration(self.duration(spec.name, v, false)?.1),
            (ParamKind::Bool, toml::Value::Boolean(b)) => ParamValue::Bool(*b),
            (ParamKind::Int { min, max }, toml::Value::Integer(i)) if (min..=max).contains(i) => ParamValue::Int(*i),
            (ParamKind::Choice(options), toml::Value::String(s)) => {
                ParamValue::Choice(options.iter().find(|o| *o == s).ok_or_else(bad)?)
            }
            _ => return Err(bad()),
        })
    }

    /// Reject any key not taken, naming the keys this table accepts.
    pub fn finish(self, accepted: &[&str]) -> Result<(), ScenarioError> {
        match self.entries.into_iter().next() {
            None => Ok(()),
            Some((key, (span, _))) => {
                let list = if accepted.is_empty() { "no keys".to_string() } else { accepted.join(", ") };
                Err(self.src.error(span, format!("unknown key `{key}` in {}; expected one of: {list}", self.name)))
            }
        }
    }
}

/// A TOML or serde error's message in a user's words, never empty.
pub fn toml_message(e: &toml::de::Error) -> String {
    let m = plain(e.message().trim()).replace('\n', "; ");
    if m.is_empty() {
        "expected a TOML value here (a string, number, boolean, array or table)".to_string()
    } else {
        m
    }
}

/// serde's messages in a user's words: no Rust type names.
fn plain(message: &str) -> String {
    message
        .replace("number too large to fit in target type", "expected a whole number within range, found a larger one")
        .replace("expected i64", "expected a whole number")
        .replace("expected u64", "expected a whole number from 0")
        .replace("expected f64", "expected a number")
        .replace("expected usize", "expected a whole number from 0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_lines_and_columns() {
        let src = Source { path: "x.toml", text: "a = 1\nbb = 2\n" };
        let e = src.error(9..10, "m");
        assert_eq!((e.line, e.col), (2, 4));
        assert_eq!(e.to_string(), "x.toml:2:4: m");
    }
}
