//! Durations as scenario files spell them: `"250ms"`, `"1.5s"`, `"2m"`; ranges as `["0ms", "200ms"]`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

const UNITS: &[(&str, f64)] = &[("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9), ("m", 60e9), ("h", 3600e9)];

/// Parse `"250ms"`-style text. A leading `-` is allowed only where `signed` (clock jumps).
pub fn parse(text: &str, signed: bool) -> Result<(bool, Duration), String> {
    let expected = || format!("expected a duration such as \"250ms\", \"5s\" or \"2m\", found {text:?}");
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) if signed => (true, rest),
        _ => (false, text.strip_prefix('+').filter(|_| signed).unwrap_or(text)),
    };
    let split = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(expected)?;
    let (number, unit) = body.split_at(split);
    let per = UNITS.iter().find(|(u, _)| *u == unit).map(|(_, per)| *per).ok_or_else(expected)?;
    let value: f64 = number.parse().map_err(|_| expected())?;
    Ok((negative, Duration::from_nanos((value * per).round() as u64)))
}

/// An unsigned duration field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text, false).map(|(_, d)| Dur(d)).map_err(serde::de::Error::custom)
    }
}

/// A range of durations: `["100ms", "500ms"]`, or one duration meaning exactly that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurRange(pub Duration, pub Duration);

impl<'de> Deserialize<'de> for DurRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Two(Vec<String>),
        }
        let expected = "expected a duration or a two-element array such as [\"100ms\", \"500ms\"]";
        let raw = Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))?;
        let (lo, hi) = match raw {
            Raw::One(one) => (one.clone(), one),
            Raw::Two(two) if two.len() == 2 => (two[0].clone(), two[1].clone()),
            Raw::Two(_) => return Err(serde::de::Error::custom(expected)),
        };
        let (lo, hi) = (
            parse(&lo, false).map_err(serde::de::Error::custom)?.1,
            parse(&hi, false).map_err(serde::de::Error::custom)?.1,
        );
        if lo > hi {
            return Err(serde::de::Error::custom("the range's first duration is larger than its second"));
        }
        Ok(DurRange(lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_fractions() {
        assert_eq!(parse("250ms", false), Ok((false, Duration::from_millis(250))));
        assert_eq!(parse("1.5s", false), Ok((false, Duration::from_millis(1500))));
        assert_eq!(parse("2m", false), Ok((false, Duration::from_secs(120))));
        assert_eq!(parse("0s", false), Ok((false, Duration::ZERO)));
        assert_eq!(parse("-3s", true), Ok((true, Duration::from_secs(3))));
        assert_eq!(parse("+3s", true), Ok((false, Duration::from_secs(3))));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in ["5", "5 s", "s", "5sec", "-3s", "", "1.2.3s"] {
            assert!(parse(bad, false).is_err(), "{bad:?} should be rejected");
        }
    }
}
