//! Typed parameters of recipes and backends, declared once and checked when a scenario is loaded.
//!
//! Each recipe and backend family lists its parameters as [`ParamSpec`]s: name, type, default and a line
//! of documentation. The scenario loader checks a file's keys against that list (unknown keys and bad
//! values are errors with their line), `locksim list recipes` prints it, and the recipe reads typed
//! values from [`Params`] without re-validating.

use std::collections::BTreeMap;
use std::time::Duration;

/// The type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamKind {
    /// A duration string: `"250ms"`, `"5s"`, `"2m"`.
    Duration,
    Bool,
    /// A whole number in the inclusive range.
    Int {
        min: i64,
        max: i64,
    },
    /// One of the listed strings.
    Choice(&'static [&'static str]),
}

/// A parameter's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    Duration(Duration),
    Bool(bool),
    Int(i64),
    Choice(&'static str),
}

/// A declared parameter.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: ParamKind,
    pub default: ParamValue,
    pub doc: &'static str,
}

impl ParamSpec {
    /// A whole-number parameter from `min` to `max` (inclusive).
    pub const fn int(name: &'static str, (min, max): (i64, i64), default: i64, doc: &'static str) -> ParamSpec {
        ParamSpec { name, kind: ParamKind::Int { min, max }, default: ParamValue::Int(default), doc }
    }

    /// A duration parameter with its default in milliseconds.
    pub const fn duration(name: &'static str, default_ms: u64, doc: &'static str) -> ParamSpec {
        ParamSpec { name, kind: ParamKind::Duration, default: ms(default_ms), doc }
    }

    /// The value spelled as in a scenario file.
    pub fn show(value: &ParamValue) -> String {
        match value {
            ParamValue::Duration(d) => format!("\"{}\"", locksim_sim::fault::fmt_duration(*d)),
            ParamValue::Bool(b) => b.to_string(),
            ParamValue::Int(i) => i.to_string(),
            ParamValue::Choice(c) => format!("\"{c}\""),
        }
    }

    /// What a value of this parameter must look like, for error messages.
    pub fn expected(&self) -> String {
        match self.kind {
            ParamKind::Duration => "a duration string such as \"250ms\", \"5s\" or \"2m\"".into(),
            ParamKind::Bool => "true or false".into(),
            ParamKind::Int { min, max } => format!("a whole number from {min} to {max}"),
            ParamKind::Choice(options) => {
                let quoted: Vec<String> = options.iter().map(|o| format!("\"{o}\"")).collect();
                format!("one of {}", quoted.join(", "))
            }
        }
    }
}

/// Resolved parameter values: every declared parameter, from the file or its default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params(BTreeMap<&'static str, ParamValue>);

impl Params {
    /// Defaults for every spec, overridden by `given`.
    pub fn resolve(specs: &[ParamSpec], given: impl IntoIterator<Item = (&'static str, ParamValue)>) -> Params {
        let mut values: BTreeMap<_, _> = specs.iter().map(|s| (s.name, s.default)).collect();
        values.extend(given);
        Params(values)
    }

    /// Whether the recipe or backend declares `name`.
    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn get(&self, name: &str) -> ParamValue {
        *self.0.get(name).unwrap_or_else(|| panic!("parameter {name} is declared by its recipe or backend"))
    }

    pub fn duration(&self, name: &str) -> Duration {
        match self.get(name) {
            ParamValue::Duration(d) => d,
            other => panic!("parameter {name} is a duration, not {other:?}"),
        }
    }

    pub fn bool(&self, name: &str) -> bool {
        match self.get(name) {
            ParamValue::Bool(b) => b,
            other => panic!("parameter {name} is a bool, not {other:?}"),
        }
    }

    pub fn int(&self, name: &str) -> i64 {
        match self.get(name) {
            ParamValue::Int(i) => i,
            other => panic!("parameter {name} is an int, not {other:?}"),
        }
    }

    pub fn choice(&self, name: &str) -> &'static str {
        match self.get(name) {
            ParamValue::Choice(c) => c,
            other => panic!("parameter {name} is a choice, not {other:?}"),
        }
    }

    /// Every value, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &ParamValue)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }
}

/// Shorthands for declaring parameter tables.
pub const fn ms(n: u64) -> ParamValue {
    ParamValue::Duration(Duration::from_millis(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[ParamSpec] = &[
        ParamSpec { name: "ttl", kind: ParamKind::Duration, default: ms(5000), doc: "" },
        ParamSpec {
            name: "release",
            kind: ParamKind::Choice(&["del", "cad"]),
            default: ParamValue::Choice("del"),
            doc: "",
        },
    ];

    #[test]
    fn defaults_fill_what_is_not_given() {
        let p = Params::resolve(SPECS, [("release", ParamValue::Choice("cad"))]);
        assert_eq!(p.duration("ttl"), Duration::from_secs(5));
        assert_eq!(p.choice("release"), "cad");
        assert_eq!(ParamSpec::show(&ms(5000)), "\"5s\"");
        assert_eq!(SPECS[1].expected(), "one of \"del\", \"cad\"");
    }
}
