//! Many measurements (milliseconds, to the microsecond) in bounded memory, for medians over a sweep.
//!
//! A sweep of millions of seeds must not keep one number per seed, yet the everyday sweep's median
//! must stay exact, so that a report or a README never shows a value no seed measured. So values are
//! counted exactly, one entry per distinct microsecond value, until there are more than
//! [`EXACT_VALUES`] distinct values; from then on each value is counted in its log-linear bucket (as
//! HdrHistogram does, to [`SIGNIFICANT_BITS`] significant bits: values under 2.048 ms stay exact,
//! larger ones lose at most 1/1024 of themselves). Bucketing an already bucketed value changes nothing,
//! so the result depends only on the multiset of values, never on the order they came in: a sweep on
//! any number of jobs, or merged from shards, has the same medians.

use std::collections::BTreeMap;

/// Distinct values counted exactly before the counts become buckets (about 3 MB at most).
pub const EXACT_VALUES: usize = 1 << 16;

/// The precision of a bucket: values keep their top 11 bits.
pub const SIGNIFICANT_BITS: u32 = 11;

#[derive(Debug, Clone, Default)]
pub struct Distribution {
    /// Count per value in microseconds (exact), or per bucket's least value (bucketed).
    counts: BTreeMap<u64, u64>,
    bucketed: bool,
    n: u64,
    min: Option<u64>,
    max: Option<u64>,
}

impl Distribution {
    pub fn add(&mut self, ms: f64) {
        let us = (ms * 1000.0).round().max(0.0) as u64;
        self.n += 1;
        self.min = Some(self.min.map_or(us, |m| m.min(us)));
        self.max = Some(self.max.map_or(us, |m| m.max(us)));
        let key = if self.bucketed { bucket(us) } else { us };
        *self.counts.entry(key).or_insert(0) += 1;
        if !self.bucketed && self.counts.len() > EXACT_VALUES {
            self.bucketed = true;
            let mut coarse = BTreeMap::new();
            for (value, count) in std::mem::take(&mut self.counts) {
                *coarse.entry(bucket(value)).or_insert(0) += count;
            }
            self.counts = coarse;
        }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The value at sorted position `n / 2` (the upper median), in milliseconds.
    pub fn median(&self) -> Option<f64> {
        let mut rank = self.n / 2;
        for (value, count) in &self.counts {
            if rank < *count {
                return Some(ms(*value));
            }
            rank -= count;
        }
        None
    }

    /// The least and greatest values, always exact.
    pub fn min(&self) -> Option<f64> {
        self.min.map(ms)
    }

    pub fn max(&self) -> Option<f64> {
        self.max.map(ms)
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The least value of `us`'s log-linear bucket: its top [`SIGNIFICANT_BITS`] bits, the rest zero.
fn bucket(us: u64) -> u64 {
    let bits = u64::BITS - us.leading_zeros();
    let drop = bits.saturating_sub(SIGNIFICANT_BITS);
    us >> drop << drop
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(values: impl IntoIterator<Item = f64>) -> Distribution {
        let mut d = Distribution::default();
        values.into_iter().for_each(|v| d.add(v));
        d
    }

    #[test]
    fn the_median_of_few_values_is_exact_and_the_upper_one() {
        let d = of([3.5, 1.25, 2.0, 10.001]);
        assert_eq!(d.median(), Some(3.5));
        assert_eq!((d.min(), d.max(), d.len()), (Some(1.25), Some(10.001), 4));
        assert_eq!(Distribution::default().median(), None);
    }

    #[test]
    fn many_distinct_values_stay_in_bounded_memory_and_close_to_the_truth() {
        let values: Vec<f64> = (0..400_000u64).map(|i| (i * 7919 % 400_000 * 137) as f64 / 1000.0).collect();
        let d = of(values.iter().copied());
        assert!(d.counts.len() <= EXACT_VALUES, "{} buckets", d.counts.len());
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let exact = sorted[sorted.len() / 2];
        let median = d.median().unwrap();
        assert!(median <= exact && exact - median <= exact / 1024.0 + 0.001, "{median} vs {exact}");
        assert_eq!((d.min(), d.max()), (Some(sorted[0]), Some(*sorted.last().unwrap())));
    }

    #[test]
    fn the_result_does_not_depend_on_the_order_of_the_values() {
        let values: Vec<f64> = (0..200_000u64).map(|i| (i * 104_729 % 199_999) as f64 * 0.031).collect();
        let forward = of(values.iter().copied());
        let backward = of(values.iter().rev().copied());
        assert_eq!(forward.counts, backward.counts);
        assert_eq!(forward.median(), backward.median());
    }

    #[test]
    fn small_values_keep_every_microsecond_even_in_buckets() {
        assert_eq!(bucket(2047), 2047);
        assert_eq!(bucket(2049), 2048);
        assert_eq!(bucket(12_345), 12_344);
        assert_eq!(bucket(bucket(987_654_321)), bucket(987_654_321));
    }
}
