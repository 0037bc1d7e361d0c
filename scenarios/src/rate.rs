//! How often something happened, with the confidence a number of seeds gives it: `k` of `n` seeds as a
//! rate and its 95% interval.
//!
//! - Between the extremes, the Wilson score interval (Wilson 1927; Agresti & Coull 1998): unlike the
//!   normal approximation it stays inside [0, 1] and keeps its coverage for small `k`.
//! - At 0 of `n` (and `n` of `n`), the exact one-sided 95% bound, `1 − 0.05^(1/n)` (Clopper–Pearson with
//!   one tail; ≈ 3/n, the "rule of three"): a sweep that found nothing in 200 seeds says the rate is
//!   below 1.5%, not that it is 0.

use serde::{Deserialize, Serialize};
use std::fmt;

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// `k` of `n`, with its 95% interval `[low, high]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub k: u64,
    pub n: u64,
    pub low: f64,
    pub high: f64,
}

impl Rate {
    /// `k` of `n` (`k ≤ n`); with `n = 0` nothing is known: `[0, 1]`.
    pub fn of(k: u64, n: u64) -> Rate {
        assert!(k <= n, "{k} of {n}");
        let (low, high) = match (k, n) {
            (_, 0) => (0.0, 1.0),
            (0, n) => (0.0, one_sided(n)),
            (k, n) if k == n => (1.0 - one_sided(n), 1.0),
            (k, n) => wilson(k, n),
        };
        Rate { k, n, low, high }
    }

    /// The point estimate `k / n` (0 when `n = 0`).
    pub fn value(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.k as f64 / self.n as f64
        }
    }

    /// The rate without its count, for a line that already says `k`: `(5.0%, 95% CI 2.2–11.2%)`,
    /// `(rate < 1.5%)`; empty at 0 of 0.
    pub fn interval(&self) -> String {
        let Rate { k, n, low, high } = *self;
        match (k, n) {
            (_, 0) => String::new(),
            (0, _) => format!("(rate < {})", percent(high)),
            (k, n) if k == n => format!("(rate > {})", percent(low)),
            _ => {
                let (low, high) = (percent(low), percent(high));
                format!("({}, 95% CI {}–{high})", percent(self.value()), low.trim_end_matches('%'))
            }
        }
    }
}

/// The exact one-sided 95% bound on the rate when none of `n` showed it.
fn one_sided(n: u64) -> f64 {
    1.0 - 0.05f64.powf(1.0 / n as f64)
}

fn wilson(k: u64, n: u64) -> (f64, f64) {
    let (n, p) = (n as f64, k as f64 / n as f64);
    let z2 = Z95 * Z95;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// A percentage as people read it: one decimal, or two below 1%.
fn percent(x: f64) -> String {
    let pct = 100.0 * x;
    if pct > 0.0 && pct < 1.0 {
        format!("{pct:.2}%")
    } else {
        format!("{pct:.1}%")
    }
}

/// `5/100 (5.0%, 95% CI 2.2–11.2%)`, `0/200 (rate < 1.5%)`, `100/100 (rate > 97.0%)`.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.n {
            0 => write!(f, "0/0"),
            n => write!(f, "{}/{n} {}", self.k, self.interval()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-5
    }

    #[test]
    fn none_of_200_bounds_the_rate_below_one_and_a_half_percent() {
        let r = Rate::of(0, 200);
        assert_eq!(r.low, 0.0);
        assert!(close(r.high, 0.014867), "{r:?}");
        assert_eq!(r.to_string(), "0/200 (rate < 1.5%)");
    }

    #[test]
    fn five_of_100_is_the_published_wilson_interval() {
        // Wilson 95% for 5/100: 0.0215–0.1118 (e.g. Newcombe 1998, Table I, method 3).
        let r = Rate::of(5, 100);
        assert!(close(r.low, 0.021543) && close(r.high, 0.111750), "{r:?}");
        assert_eq!(r.to_string(), "5/100 (5.0%, 95% CI 2.2–11.2%)");
    }

    #[test]
    fn all_of_100_bounds_the_rate_above_ninety_seven_percent() {
        let r = Rate::of(100, 100);
        assert!(close(r.low, 0.970487) && r.high == 1.0, "{r:?}");
        assert_eq!(r.to_string(), "100/100 (rate > 97.0%)");
    }

    #[test]
    fn the_interval_holds_the_estimate_and_narrows_with_more_seeds() {
        for (k, n) in [(1, 10), (3, 7), (50, 100), (99, 100), (1, 1000)] {
            let r = Rate::of(k, n);
            assert!(r.low <= r.value() && r.value() <= r.high && r.low >= 0.0 && r.high <= 1.0, "{r:?}");
            let more = Rate::of(k * 10, n * 10);
            assert!(more.high - more.low < r.high - r.low, "{r:?} vs {more:?}");
        }
        assert_eq!(Rate::of(0, 0).to_string(), "0/0");
        assert_eq!(Rate::of(81, 200).interval(), "(40.5%, 95% CI 33.9–47.4%)");
        assert_eq!(Rate::of(1, 1000).to_string(), "1/1000 (0.10%, 95% CI 0.02–0.56%)");
    }
}
