//! Small statistics shared by the simulator, the predictors and the
//! reports: medians, nearest-rank percentiles, bounded windows of recent
//! samples, and counting overlapping executions the way the Redshift
//! measurements count them; and the seeded lognormal noise the simulators
//! draw per query.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng, rngs::SmallRng};

use crate::model::QueryId;
use crate::time::Instant;

/// The median of a non-empty slice.
///
/// # Panics
///
/// If `values` is empty.
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
}

/// Appends `value` to a window of the most recent `bound` samples (at
/// least one), and hands back the oldest one if it made room for it.
pub fn push_bounded<T>(window: &mut VecDeque<T>, value: T, bound: usize) -> Option<T> {
    let evicted = if window.len() >= bound.max(1) { window.pop_front() } else { None };
    window.push_back(value);
    evicted
}

/// The `q`-quantile (nearest rank) of sorted values; 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// For each interval, the others that intersect it (`a.start < b.end` and
/// `b.start < a.end`), each listed in start order (ties by index): one
/// sweep over the intervals sorted by start, O(n log n) plus the pairs
/// found.
pub fn overlapping<T: PartialOrd + Copy>(intervals: &[(T, T)]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by(|&a, &b| intervals[a].0.partial_cmp(&intervals[b].0).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
    let mut found = vec![Vec::new(); intervals.len()];
    for (pos, &i) in order.iter().enumerate() {
        let (start_i, end_i) = intervals[i];
        for &j in &order[pos + 1..] {
            let (start_j, end_j) = intervals[j];
            // Sorted by start: none after `j` starts before `i` ends.
            if start_j.partial_cmp(&end_i) != Some(std::cmp::Ordering::Less) {
                break;
            }
            if end_j > start_i {
                // Earlier intervals reach `j` before `i` adds its later
                // ones, so each list stays in start order.
                found[i].push(j);
                found[j].push(i);
            }
        }
    }
    found
}

/// Each execution's number of overlapping neighbours, counted as the data
/// counts them: client-side intervals that intersect.
pub fn count_overlapping_neighbours(intervals: &[(Instant, Instant)]) -> Vec<u32> {
    overlapping(intervals).iter().map(|others| others.len() as u32).collect()
}

/// The lognormal noise factor of one query: a pure function of the seed and
/// the query id, so every policy sees the same draw for the same query.
pub fn noise_factor(seed: u64, query: QueryId, sigma: f64) -> f64 {
    if sigma <= 0.0 {
        return 1.0;
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ query.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (sigma * z).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_neighbours_count_intersecting_intervals() {
        let s = Instant::from_secs_f64;
        let counts = count_overlapping_neighbours(&[(s(0.0), s(10.0)), (s(5.0), s(6.0)), (s(10.0), s(12.0)), (s(11.0), s(20.0))]);
        assert_eq!(counts, vec![1, 1, 1, 1]);
    }

    proptest::proptest! {
        #[test]
        fn a_bounded_window_keeps_the_newest_and_hands_back_the_oldest(values in proptest::collection::vec(0u32..100, 0..50), bound in 0usize..8) {
            let mut window = VecDeque::new();
            for (i, &value) in values.iter().enumerate() {
                let evicted = push_bounded(&mut window, value, bound);
                let kept = bound.max(1);
                proptest::prop_assert_eq!(evicted, i.checked_sub(kept).map(|oldest| values[oldest]));
                proptest::prop_assert!(window.iter().copied().eq(values[(i + 1).saturating_sub(kept)..=i].iter().copied()));
            }
        }
    }

    #[test]
    fn median_and_percentile_use_the_middle_and_nearest_rank() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&sorted, 0.5), percentile(&sorted, 0.99)), (50.0, 99.0));
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
