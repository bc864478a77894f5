//! Throughput and latency over time in fixed intervals of the measured phase: the
//! failure timeline of SWARM's Figure 11 (§7.7), where a crashed memory node must not
//! show as an interval without throughput.
//!
//! Each client thread records every measured operation into its own [`Timeline`] after
//! taking the operation's end time (no sharing, no lock); the threads' timelines are
//! merged at the end. An interval keeps a count, an error count and a coarse
//! log-linear latency histogram (4 buckets per power of two: percentiles within 19 %),
//! about 700 bytes, so a minute of 10 ms intervals costs a few MiB per thread.

use serde::{Deserialize, Serialize};

/// Histogram buckets per interval: 4 per power of two up to 2^48 ns.
const BUCKETS: usize = 4 * 48;

/// One interval's counters.
#[derive(Clone, Debug)]
struct Interval {
    ops: u64,
    errors: u64,
    buckets: Box<[u32; BUCKETS]>,
}

impl Default for Interval {
    fn default() -> Self {
        Self {
            ops: 0,
            errors: 0,
            buckets: Box::new([0; BUCKETS]),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    let ns = ns.max(1);
    let log = 63 - ns.leading_zeros() as usize;
    // The two bits below the leading one.
    let mantissa = if log >= 2 {
        (ns >> (log - 2)) & 3
    } else {
        (ns << (2 - log)) & 3
    } as usize;
    (4 * log + mantissa).min(BUCKETS - 1)
}

/// The upper bound of bucket `b`, ns.
fn bucket_top(b: usize) -> u64 {
    let (log, mantissa) = (b / 4, (b % 4) as u64);
    if log >= 2 {
        ((4 + mantissa + 1) << (log - 2)) - 1
    } else {
        ((4 + mantissa + 1) >> (2 - log)).max(1)
    }
}

/// A client thread's measured operations per interval, by end time.
#[derive(Clone, Debug)]
pub struct Timeline {
    interval_ns: u64,
    /// Interval `i` covers `[i, i + 1) * interval_ns` since the run's origin.
    intervals: Vec<Interval>,
    /// The interval of the last record and the times it covers, `[start, end)`: the
    /// next record most likely falls in it too (no division to find it).
    last: (usize, u64, u64),
}

impl Timeline {
    /// An empty timeline of `interval_ns` intervals (at least 1 ns).
    pub fn new(interval_ns: u64) -> Self {
        Self {
            interval_ns: interval_ns.max(1),
            intervals: Vec::new(),
            last: (0, 0, 0),
        }
    }

    #[inline]
    fn at(&mut self, end_ns: u64) -> &mut Interval {
        let (last, start, end) = self.last;
        if start <= end_ns && end_ns < end {
            return &mut self.intervals[last];
        }
        self.at_new(end_ns)
    }

    fn at_new(&mut self, end_ns: u64) -> &mut Interval {
        let n = end_ns / self.interval_ns;
        let i = usize::try_from(n).unwrap_or(usize::MAX).min(1 << 24);
        if self.intervals.len() <= i {
            self.intervals.resize_with(i + 1, Interval::default);
        }
        // A clamped interval (past 2^24 of them) is never the last one.
        self.last = if i as u64 == n {
            let start = n * self.interval_ns;
            (i, start, start.saturating_add(self.interval_ns))
        } else {
            (0, 0, 0)
        };
        &mut self.intervals[i]
    }

    /// An operation that completed at `end_ns` (since the origin) in `latency_ns`.
    pub fn record(&mut self, end_ns: u64, latency_ns: u64) {
        let interval = self.at(end_ns);
        interval.ops += 1;
        interval.buckets[bucket_of(latency_ns)] += 1;
    }

    /// An operation that failed at `end_ns`.
    pub fn record_error(&mut self, end_ns: u64) {
        self.at(end_ns).errors += 1;
    }

    /// Adds another thread's timeline (same interval).
    pub fn merge(&mut self, other: &Self) {
        if self.intervals.len() < other.intervals.len() {
            self.intervals
                .resize_with(other.intervals.len(), Interval::default);
        }
        for (mine, theirs) in self.intervals.iter_mut().zip(&other.intervals) {
            mine.ops += theirs.ops;
            mine.errors += theirs.errors;
            for (a, b) in mine.buckets.iter_mut().zip(theirs.buckets.iter()) {
                *a += b;
            }
        }
    }

    /// The points from `start_ns` (the measured phase's start) to `end_ns`, with times
    /// relative to `start_ns`.
    pub fn points(&self, start_ns: u64, end_ns: u64) -> Vec<TimelinePoint> {
        let first = start_ns / self.interval_ns;
        let last = end_ns.div_ceil(self.interval_ns);
        (first..last)
            .map(|i| {
                let interval = usize::try_from(i)
                    .ok()
                    .and_then(|i| self.intervals.get(i))
                    .cloned()
                    .unwrap_or_default();
                let quantile = |q: f64| {
                    let rank = ((interval.ops as f64) * q).ceil().max(1.0) as u64;
                    let mut seen = 0;
                    for (b, &count) in interval.buckets.iter().enumerate() {
                        seen += u64::from(count);
                        if seen >= rank {
                            return bucket_top(b);
                        }
                    }
                    0
                };
                let (p50_ns, p99_ns) = if interval.ops == 0 {
                    (0, 0)
                } else {
                    (quantile(0.5), quantile(0.99))
                };
                TimelinePoint {
                    t_ms: (i * self.interval_ns).saturating_sub(start_ns) as f64 / 1e6,
                    ops: interval.ops,
                    throughput_ops_s: interval.ops as f64 * 1e9 / self.interval_ns as f64,
                    p50_ns,
                    p99_ns,
                    errors: interval.errors,
                }
            })
            .collect()
    }
}

/// One interval of the measured phase.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Start of the interval, ms since the measured phase began.
    pub t_ms: f64,
    /// Operations completed in it without error.
    pub ops: u64,
    /// `ops` per second.
    pub throughput_ops_s: f64,
    /// Median latency of those operations (upper bound of its bucket, within 19 %).
    pub p50_ns: u64,
    /// 99th percentile latency, likewise.
    pub p99_ns: u64,
    /// Operations that failed in it.
    pub errors: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_values_within_a_fifth() {
        for ns in [
            1u64,
            2,
            3,
            5,
            7,
            100,
            999,
            1_500,
            65_537,
            10_000_000,
            1 << 40,
        ] {
            let top = bucket_top(bucket_of(ns));
            assert!(top >= ns, "{ns} above its bucket's top {top}");
            assert!(top as f64 <= ns as f64 * 1.25 + 1.0, "{ns}: top {top}");
        }
    }

    #[test]
    fn intervals_count_every_operation_and_merge() {
        let mut a = Timeline::new(10);
        let mut b = Timeline::new(10);
        for t in 0..100 {
            a.record(t, 5);
        }
        b.record(55, 1_000);
        b.record_error(95);
        a.merge(&b);
        let points = a.points(20, 100);
        assert_eq!(points.len(), 8);
        assert_eq!(points.iter().map(|p| p.ops).sum::<u64>(), 81);
        assert_eq!(points[0].t_ms, 0.0);
        assert_eq!(points[3].ops, 11);
        assert!(points[3].p99_ns >= 1_000 && points[3].p50_ns < 10);
        assert_eq!(points[7].errors, 1);
        assert_eq!(points[0].throughput_ops_s, 1e9);
    }

    /// Records out of order and across intervals land where a division puts them.
    #[test]
    fn records_land_in_their_interval_whatever_came_before() {
        let mut t = Timeline::new(10);
        let ends = [5u64, 9, 10, 3, 19, 20, 15, 0, 29, 11, 25, 21, 200, 199, 7];
        for &end in &ends {
            t.record(end, 1);
        }
        let expect = |i: usize| ends.iter().filter(|&&e| (e / 10) as usize == i).count() as u64;
        for i in 0..t.intervals.len() {
            assert_eq!(t.intervals[i].ops, expect(i), "interval {i}");
        }
        assert_eq!(t.intervals.len(), 21);
    }
}
