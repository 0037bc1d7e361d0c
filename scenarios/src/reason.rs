//! Why a sweep's seeds did not meet the scenario's expectation: one [`Reason`] per unmet part, shown as
//! one line of text. Results files and users' CI see the text; code decides on the variant (a shard
//! fails only on what no other shard's seeds can change).

use crate::checkers::FindingKind;
use locksim_sim::hazard::Hazard;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// No seed's faults took effect: `why` says how they failed to (`seeds`: how many seeds).
    NoFaultFired { seeds: u64, why: String },
    /// Safe was expected, and some seeds found these violations.
    UnsafeFound { kinds: Vec<FindingKind> },
    /// Unsafe was expected, and every seed was safe.
    EverySeedSafe,
    /// An expected finding that no seed found.
    FindingNotFound(FindingKind),
    /// A finding expected absent, which `seed` found.
    AbsentFound { kind: FindingKind, seed: u64 },
    /// A hazard the scenario requires that none of `seeds` reached.
    HazardNotReached { scenario: String, hazard: Hazard, seeds: Range<u64> },
    /// A reason as a results file wrote it, read back only to be shown: results are judged again from
    /// their seeds ([`crate::sweep::merge`]), never from their reasons.
    Written(String),
}

impl Reason {
    /// Whether the reason is that no seed did something, which seeds outside those judged (another
    /// shard's) may yet do.
    pub fn in_no_seed(&self) -> bool {
        match self {
            Reason::NoFaultFired { .. }
            | Reason::EverySeedSafe
            | Reason::FindingNotFound(_)
            | Reason::HazardNotReached { .. } => true,
            Reason::UnsafeFound { .. } | Reason::AbsentFound { .. } | Reason::Written(_) => false,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoFaultFired { seeds, why } => write!(f, "no fault fired in any of the {seeds} seeds: {why}"),
            Reason::UnsafeFound { kinds } => {
                let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
                write!(f, "expected safe, but some seeds found {}", kinds.join(", "))
            }
            Reason::EverySeedSafe => write!(f, "expected unsafe, but every seed was safe"),
            Reason::FindingNotFound(kind) => write!(f, "expected {}, but no seed found it", kind.name()),
            Reason::AbsentFound { kind, seed } => write!(f, "expected no {}, but seed {seed} found it", kind.name()),
            Reason::HazardNotReached { scenario, hazard, seeds } => {
                write!(f, "{scenario} requires hazard {hazard}, but no seed reached it (seeds {seeds:?})")
            }
            Reason::Written(text) => write!(f, "{text}"),
        }
    }
}

/// The reasons' lines joined by `separator`.
pub fn join(reasons: &[Reason], separator: &str) -> String {
    reasons.iter().map(Reason::to_string).collect::<Vec<_>>().join(separator)
}

/// Written as its text, so that results files stay what they were.
impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Reason::Written)
    }
}
