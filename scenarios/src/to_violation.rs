//! How many seeds it takes to find a violation — what a user sweeping seeds for a bug pays for it.
//!
//! Seeds are played in order from a start. From the range's first seed, it takes [`ToViolation::first`]
//! seeds (up to and including the first unsafe one). That one number depends on where the range
//! happens to start, so the statistic to compare two ways of finding a bug (a uniform nemesis against an
//! aimed one) is [`ToViolation::median`]: over every start seed of the range, the median number of seeds
//! played from it to the first unsafe seed at or after it. Starts after the last unsafe seed find none
//! in the range: they count as longer than any, so the median is unknown when they are half or more.
//! For a bug found at rate `p` it is about `ln 2 / p` seeds.
//!
//! Counted from the unsafe seeds' positions alone (each gap between two unsafe seeds, by how often it
//! occurs), so memory stays flat however many seeds run, and shards judged alone each count their own.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;

/// Seeds to a violation over a range of seeds (present when some seed was unsafe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToViolation {
    /// The first unsafe seed.
    pub first_seed: u64,
    /// Seeds played from the range's start up to and including it.
    pub first: u64,
    /// The median, over every start seed in the range, of the seeds played to the next unsafe seed
    /// (`None`: half of the starts or more found none before the range ended).
    pub median: Option<u64>,
}

/// Counts the gaps between unsafe seeds as seeds come in order.
#[derive(Debug, Clone)]
pub struct Gaps {
    range: Range<u64>,
    /// The seed after the last unsafe one (the range's start before any).
    after_last: u64,
    first_seed: Option<u64>,
    /// Gap length (seeds from a start to the unsafe seed ending it, both included) → how many.
    gaps: BTreeMap<u64, u64>,
}

impl Gaps {
    pub fn new(range: Range<u64>) -> Gaps {
        Gaps { after_last: range.start, range, first_seed: None, gaps: BTreeMap::new() }
    }

    /// Seed `seed` was unsafe; seeds come in increasing order.
    pub fn unsafe_seed(&mut self, seed: u64) {
        debug_assert!(seed >= self.after_last, "seeds in order");
        self.first_seed.get_or_insert(seed);
        *self.gaps.entry(seed - self.after_last + 1).or_default() += 1;
        self.after_last = seed + 1;
    }

    /// The statistic over the whole range (`None`: no unsafe seed).
    pub fn finish(&self) -> Option<ToViolation> {
        let first_seed = self.first_seed?;
        let starts = self.range.end - self.range.start;
        // Starts within a gap of length g are 1, 2, …, g seeds from its unsafe seed: those within d of
        // theirs number min(g, d). The median is the least d that half of all starts reach.
        let reached = |d: u64| self.gaps.iter().map(|(g, n)| g.min(&d) * n).sum::<u64>();
        let longest = *self.gaps.keys().next_back().expect("an unsafe seed makes a gap");
        let median = (2 * reached(longest) >= starts).then(|| {
            let (mut lo, mut hi) = (1, longest);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if 2 * reached(mid) >= starts {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        });
        Some(ToViolation { first_seed, first: first_seed - self.range.start + 1, median })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(range: Range<u64>, unsafe_seeds: &[u64]) -> Option<ToViolation> {
        let mut gaps = Gaps::new(range);
        unsafe_seeds.iter().for_each(|s| gaps.unsafe_seed(*s));
        gaps.finish()
    }

    /// The median by brute force: from every start, walk to the next unsafe seed.
    fn walked(range: Range<u64>, unsafe_seeds: &[u64]) -> Option<u64> {
        let mut reached: Vec<Option<u64>> =
            range.clone().map(|s| unsafe_seeds.iter().find(|u| **u >= s).map(|u| u - s + 1)).collect();
        reached.sort_by_key(|d| d.unwrap_or(u64::MAX));
        reached[(reached.len() - 1) / 2]
    }

    #[test]
    fn every_seed_unsafe_is_one_seed_and_none_is_nothing() {
        assert_eq!(
            of(10..20, &(10..20).collect::<Vec<_>>()),
            Some(ToViolation { first_seed: 10, first: 1, median: Some(1) })
        );
        assert_eq!(of(0..100, &[]), None);
    }

    #[test]
    fn one_in_ten_takes_about_five_seeds_from_a_start() {
        let every_tenth: Vec<u64> = (0..1000).filter(|s| s % 10 == 9).collect();
        assert_eq!(of(0..1000, &every_tenth), Some(ToViolation { first_seed: 9, first: 10, median: Some(5) }));
    }

    #[test]
    fn when_most_starts_find_no_violation_before_the_end_the_median_is_unknown() {
        assert_eq!(of(0..100, &[30]), Some(ToViolation { first_seed: 30, first: 31, median: None }));
        assert_eq!(of(0..100, &[48]).and_then(|t| t.median), None, "49 of 100 starts reach it");
        assert_eq!(of(0..100, &[49]).and_then(|t| t.median), Some(50), "50 of 100 starts reach it");
        assert_eq!(of(0..100, &[90]).and_then(|t| t.median), Some(50));
    }

    #[test]
    fn the_counted_median_is_the_walked_one() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..200 {
            let n = 1 + case % 60;
            let unsafe_seeds: Vec<u64> = (100..100 + n)
                .filter(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x.is_multiple_of(4)
                })
                .collect();
            let counted = of(100..100 + n, &unsafe_seeds).and_then(|t| t.median);
            assert_eq!(counted, walked(100..100 + n, &unsafe_seeds), "case {case}: {unsafe_seeds:?} of {n}");
        }
    }
}
