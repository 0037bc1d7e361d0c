//! Breaking-point sweeps: one key of a scenario file varied over a grid of values, and where the
//! violation rate stops being zero.
//!
//! A key is addressed as written in the file, its tables and array entries joined by dots:
//! `recipe.ttl`, `workload.clients`, `faults.schedule.0.duration` (entry 0 of `[[faults.schedule]]`),
//! `faults.random.duration`. The tables must be in the file; the last key may be left out of it (the
//! recipe's default), and is then whatever its values look like. Every grid point is the file's text
//! with that one value replaced, parsed again by [`Scenario::parse`], so every check a file gets applies
//! to every point.

use crate::duration;
use crate::rate::Rate;
use crate::Scenario;
use locksim_locks::Registry;
use locksim_sim::fault::fmt_duration;
use std::fmt;
use std::time::Duration;

/// The most values one sweep may have: each runs every seed.
pub const MAX_VALUES: usize = 200;

/// One value of the varied key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    Duration(Duration),
    Integer(i64),
}

impl Value {
    /// What a chart plots: seconds for durations.
    pub fn as_f64(&self) -> f64 {
        match self {
            Value::Duration(d) => d.as_secs_f64(),
            Value::Integer(i) => *i as f64,
        }
    }

    fn to_toml(self) -> toml::Value {
        match self {
            Value::Duration(d) => toml::Value::String(fmt_duration(d)),
            Value::Integer(i) => toml::Value::Integer(i),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Duration(d) => write!(f, "{}", fmt_duration(*d)),
            Value::Integer(i) => write!(f, "{i}"),
        }
    }
}

/// `--vary KEY=FROM..TO/STEP`: the key and its values, `FROM` to `TO` inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct Vary {
    pub key: String,
    pub values: Vec<Value>,
}

impl Vary {
    /// Parse `faults.schedule.0.duration=1s..10s/1s` or `workload.clients=2..16/2`.
    pub fn parse(text: &str) -> Result<Vary, String> {
        let expected =
            "expected KEY=FROM..TO/STEP, e.g. faults.schedule.0.duration=1s..10s/1s or workload.clients=2..16/2";
        let (key, grid) = text.split_once('=').ok_or_else(|| format!("{expected}, found {text:?}"))?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(format!("--vary {text:?}: the key must be dotted names, e.g. recipe.ttl"));
        }
        let (range, step) = grid.rsplit_once('/').ok_or_else(|| format!("--vary {key}: {expected}"))?;
        let (from, to) = range.split_once("..").ok_or_else(|| format!("--vary {key}: {expected}"))?;
        let (from, to, step) = (value(key, from)?, value(key, to)?, value(key, step)?);
        let values = match (from, to, step) {
            (Value::Duration(a), Value::Duration(b), Value::Duration(s)) => {
                let ns = |d: Duration| i64::try_from(d.as_nanos()).map_err(|_| format!("--vary {key}: {d:?} is too long"));
                grid_of(key, ns(a)?, ns(b)?, ns(s)?)?.map(|ns| Value::Duration(Duration::from_nanos(ns as u64))).collect()
            }
            (Value::Integer(a), Value::Integer(b), Value::Integer(s)) => {
                grid_of(key, a, b, s)?.map(Value::Integer).collect()
            }
            _ => {
                return Err(format!(
                    "--vary {key}: FROM, TO and STEP must be all durations (1s..10s/1s) or all integers (2..16/2), found {grid:?}"
                ))
            }
        };
        Ok(Vary { key: key.to_string(), values })
    }

    /// The scenario `text` (from `path`) with the key set to `value`, validated as any file is.
    pub fn scenario(&self, path: &str, text: &str, value: Value, registry: &Registry) -> Result<Scenario, String> {
        let mut file: toml::Table = toml::from_str(text).map_err(|e| format!("{path}: {e}"))?;
        let parts: Vec<&str> = self.key.split('.').collect();
        set(&mut file, &parts, "", value).map_err(|e| format!("{path}: --vary {}: {e}", self.key))?;
        let edited = toml::to_string(&file).expect("a TOML table serializes");
        let shown = format!("{path} (with {} = {value})", self.key);
        let e = match Scenario::parse(&shown, &edited, registry) {
            Ok(scenario) => return Ok(scenario),
            Err(e) => e,
        };
        // The edited text is laid out anew, so its line numbers are not the user's. A fault of the file
        // itself is shown at its own line; one at the varied key, at that key's line in the file (when
        // it is written there); any other names the key and value, and no line.
        if let Err(own) = Scenario::parse(path, text, registry) {
            return Err(own.to_string());
        }
        let with = format!("--vary {} = {value}", self.key);
        match (key_line(&edited, &parts), key_line(text, &parts)) {
            (Some(at), Some(own)) if at.0 == e.line => {
                Err(format!("{path}:{}:{}: {} (with {with})", own.0, own.1, e.message))
            }
            _ => Err(format!("{path}: with {with}: {}", e.message)),
        }
    }
}

/// The line and the value's column (from 1) of the key `parts` in `text`, for keys written as
/// `key = value` under a `[table]` or an `[[array]]` entry header (an entry is addressed by its index).
fn key_line(text: &str, parts: &[&str]) -> Option<(usize, usize)> {
    let (key, table) = parts.split_last()?;
    let table = table.join(".");
    let mut here = String::new();
    let mut entries: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let name = |t: &str| t.split('#').next().unwrap_or("").replace([' ', '"'], "");
        if let Some(rest) = trimmed.strip_prefix("[[") {
            let array = name(rest.split("]]").next().unwrap_or(""));
            let n = entries.entry(array.clone()).or_insert(0);
            here = format!("{array}.{n}");
            *n += 1;
        } else if let Some(rest) = trimmed.strip_prefix('[') {
            here = name(rest.split(']').next().unwrap_or(""));
        } else if here == table {
            let Some((k, v)) = line.split_once('=') else { continue };
            if k.trim().trim_matches('"') == *key {
                let col = line.len() - v.trim_start().len() + 1;
                return Some((i + 1, col));
            }
        }
    }
    None
}

/// Set `parts` (what is left of the key, below `walked`) in `table` to `value`.
fn set(table: &mut toml::Table, parts: &[&str], walked: &str, value: Value) -> Result<(), String> {
    let (part, rest) = parts.split_first().expect("a key has a part");
    let here = if walked.is_empty() { part.to_string() } else { format!("{walked}.{part}") };
    if rest.is_empty() {
        return put(table, part, &here, value);
    }
    match table.get_mut(*part) {
        None => Err(format!("the file has no `{here}`")),
        Some(toml::Value::Table(t)) => set(t, rest, &here, value),
        Some(toml::Value::Array(entries)) => {
            let n = entries.len();
            let (index, rest) = rest.split_first().expect("not the last part");
            let entry = index.parse::<usize>().ok().and_then(|i| entries.get_mut(i));
            let entry =
                entry.ok_or_else(|| format!("`{here}` has {n} entries: expected an index 0..{n}, found `{index}`"))?;
            let here = format!("{here}.{index}");
            match (entry, rest.is_empty()) {
                (toml::Value::Table(t), false) => set(t, rest, &here, value),
                (_, true) => Err(format!("`{here}` is an array entry: name a key in it, e.g. `{here}.duration`")),
                (_, false) => Err(format!("`{here}` is not a table")),
            }
        }
        Some(_) => Err(format!("`{here}` is a value, not a table")),
    }
}

/// Put `value` at `key`, if the value written there (if any) is of the same type.
fn put(table: &mut toml::Table, key: &str, here: &str, value: Value) -> Result<(), String> {
    let same = match (table.get(key), value) {
        (None, _) | (Some(toml::Value::Integer(_)), Value::Integer(_)) => true,
        (Some(toml::Value::String(s)), Value::Duration(_)) => duration::parse(s, true).is_ok(),
        _ => false,
    };
    if !same {
        let written = &table[key];
        let given = match value {
            Value::Duration(_) => "durations",
            Value::Integer(_) => "integers",
        };
        return Err(format!("`{here}` is {written} in the file, but the values given are {given}"));
    }
    table.insert(key.to_string(), value.to_toml());
    Ok(())
}

/// One of FROM, TO, STEP: a duration (`250ms`) or an integer.
fn value(key: &str, text: &str) -> Result<Value, String> {
    let text = text.trim();
    if let Ok(i) = text.parse::<i64>() {
        return Ok(Value::Integer(i));
    }
    duration::parse(text, false)
        .map(|(_, d)| Value::Duration(d))
        .map_err(|_| format!("--vary {key}: expected a duration such as \"250ms\" or an integer, found {text:?}"))
}

/// `from`, `from + step`, … up to `to` inclusive.
fn grid_of(key: &str, from: i64, to: i64, step: i64) -> Result<impl Iterator<Item = i64>, String> {
    if step <= 0 {
        return Err(format!("--vary {key}: the step must be above zero"));
    }
    if from > to {
        return Err(format!("--vary {key}: the range is empty (FROM is above TO)"));
    }
    let count = (to - from) / step + 1;
    if count as u64 > MAX_VALUES as u64 {
        return Err(format!("--vary {key}: {count} values; at most {MAX_VALUES} (take a larger step)"));
    }
    Ok((0..count).map(move |i| from + i * step))
}

/// Where a sweep's violations begin, over its values in increasing order. A key either puts the lock
/// in more danger as it grows (a pause, a partition, clients: violations from some value up) or in less
/// (a TTL, a session timeout: violations up to some value); which, the sweep tells, from whether its
/// first value was the safe end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakingPoint {
    /// Violations come with larger values: the first value is safe, or no value is.
    pub rising: bool,
    /// The value where the safe side ends: rising, the largest before the first violation; falling,
    /// the smallest after the last. No seed found a violation at it or beyond it on its side.
    pub safe_to: Option<Value>,
    /// The first value next to the safe side that some seed violated, with its rate. One violating
    /// seed is proof, not chance (a seed replays), so its interval's low end is above 0 at any
    /// `k ≥ 1`: it is also the first value whose rate is above 0 with 95% confidence.
    pub breaks_at: Option<(Value, Rate)>,
}

/// The breaking point of `points`, each a value and its unsafe rate, in increasing order of value.
pub fn breaking_point(points: &[(Value, Rate)]) -> BreakingPoint {
    let unsafe_at = |i: usize| points[i].1.k > 0;
    let rising = points.is_empty() || !unsafe_at(0) || unsafe_at(points.len() - 1);
    let point = |i: usize| points[i];
    if rising {
        let first = (0..points.len()).find(|i| unsafe_at(*i));
        let safe = first.unwrap_or(points.len()).checked_sub(1);
        BreakingPoint { rising, safe_to: safe.map(|i| point(i).0), breaks_at: first.map(point) }
    } else {
        let last = (0..points.len()).rev().find(|i| unsafe_at(*i)).expect("the first value is unsafe");
        BreakingPoint { rising, safe_to: Some(point(last + 1).0), breaks_at: Some(point(last)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Value {
        Value::Duration(Duration::from_secs(s))
    }

    #[test]
    fn a_grid_runs_from_from_to_to_by_step() {
        let v = Vary::parse("faults.schedule.0.duration=1s..4s/1500ms").unwrap();
        assert_eq!(v.key, "faults.schedule.0.duration");
        assert_eq!(v.values, [secs(1), Value::Duration(Duration::from_millis(2500)), secs(4)]);
        assert_eq!(Vary::parse("workload.clients=2..8/3").unwrap().values, [2, 5, 8].map(Value::Integer));
    }

    #[test]
    fn a_bad_grid_names_the_key_and_what_was_expected() {
        for (text, said) in [
            ("recipe.ttl=1s..2s/0s", "recipe.ttl: the step must be above zero"),
            ("recipe.ttl=5s..2s/1s", "recipe.ttl: the range is empty"),
            ("recipe.ttl=1s..5/1s", "all durations (1s..10s/1s) or all integers"),
            ("recipe.ttl=1s..2s", "expected KEY=FROM..TO/STEP"),
            ("recipe.ttl=1x..2s/1s", "expected a duration such as \"250ms\" or an integer, found \"1x\""),
            ("recipe..ttl=1s..2s/1s", "the key must be dotted names"),
            ("workload.clients=1..1000/1", "1000 values; at most 200"),
        ] {
            let e = Vary::parse(text).unwrap_err();
            assert!(e.contains(said), "{text}: {e}");
        }
    }

    #[test]
    fn the_breaking_point_is_the_last_value_before_the_first_violation() {
        let point = |s, k| (secs(s), Rate::of(k, 100));
        let b = breaking_point(&[point(1, 0), point(2, 0), point(3, 4), point(4, 0), point(5, 60)]);
        assert_eq!((b.rising, b.safe_to, b.breaks_at), (true, Some(secs(2)), Some(point(3, 4))));
        assert!(b.breaks_at.unwrap().1.low > 0.0);
        let safe = breaking_point(&[point(1, 0), point(2, 0)]);
        assert_eq!((safe.safe_to, safe.breaks_at), (Some(secs(2)), None));
        let broken = breaking_point(&[point(1, 3), point(2, 5)]);
        assert_eq!((broken.rising, broken.safe_to, broken.breaks_at), (true, None, Some(point(1, 3))));
    }

    #[test]
    fn a_key_that_makes_the_lock_safer_as_it_grows_breaks_below_its_safe_side() {
        // A session timeout against a fixed pause: too short, the session expires under the holder.
        let point = |s, k| (secs(s), Rate::of(k, 50));
        let b = breaking_point(&[point(4, 45), point(10, 0), point(14, 45), point(16, 0), point(18, 0)]);
        assert_eq!((b.rising, b.safe_to, b.breaks_at), (false, Some(secs(16)), Some(point(14, 45))));
    }
}
