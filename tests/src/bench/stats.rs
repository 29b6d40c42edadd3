//! Percentiles and summaries of measured durations.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `q`-th percentile (0–100) of `values` by the nearest-rank method:
/// the smallest value such that at least `q`% of the values are ≤ it.
/// `None` for an empty slice.
pub fn percentile(values: &[Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let q = q.clamp(0.0, 100.0);
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Summary of a sample of durations, in milliseconds (what reports show).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Median.
    pub p50_ms: Option<f64>,
    /// 90th percentile.
    pub p90_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Largest value.
    pub max_ms: Option<f64>,
    /// Arithmetic mean.
    pub mean_ms: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Summary {
    /// Summarizes `values`.
    pub fn of(values: &[Duration]) -> Summary {
        let mean = (!values.is_empty()).then(|| {
            values.iter().map(|d| d.as_secs_f64()).sum::<f64>() / values.len() as f64 * 1000.0
        });
        Summary {
            n: values.len(),
            p50_ms: percentile(values, 50.0).map(ms),
            p90_ms: percentile(values, 90.0).map(ms),
            p99_ms: percentile(values, 99.0).map(ms),
            max_ms: values.iter().max().copied().map(ms),
            mean_ms: mean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).rev().map(d).collect();
        assert_eq!(percentile(&v, 50.0), Some(d(50)));
        assert_eq!(percentile(&v, 99.0), Some(d(99)));
        assert_eq!(percentile(&v, 100.0), Some(d(100)));
        assert_eq!(percentile(&v, 0.0), Some(d(1)));
        assert_eq!(percentile(&[d(7)], 99.0), Some(d(7)));
        assert_eq!(percentile(&[], 50.0), None);
        // Small samples: p99 of 10 values is the largest.
        let ten: Vec<Duration> = (1..=10).map(d).collect();
        assert_eq!(percentile(&ten, 99.0), Some(d(10)));
        assert_eq!(percentile(&ten, 50.0), Some(d(5)));
    }

    #[test]
    fn summary_in_milliseconds() {
        let s = Summary::of(&[d(1), d(3), d(2)]);
        assert_eq!(s.n, 3);
        assert_eq!(s.p50_ms, Some(2.0));
        assert_eq!(s.max_ms, Some(3.0));
        assert_eq!(s.mean_ms, Some(2.0));
        assert_eq!(Summary::of(&[]).p50_ms, None);
    }
}
