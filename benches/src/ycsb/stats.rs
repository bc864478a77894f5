//! Per-thread measurements of a benchmark phase, merged when the threads finish:
//! for each kind of operation, an HDR latency histogram, how many roundtrips each
//! operation took (the paper's Table 2 is this count, §7.1), and how many failed.
//!
//! A client thread owns its [`PhaseRecorder`] and records into it after taking an
//! operation's end time, so recording never adds to a measured latency and threads
//! share nothing while measuring. The recorder counts latencies in a flat array
//! indexed as the HDR histogram indexes its own counts (about 20 instructions an
//! operation, against about 120 for `Histogram::record`) and fills the histograms
//! of a [`PhaseStats`] once, at the end of the phase: the same histograms.

use hdrhistogram::Histogram;

use super::workload::OpType;

/// Latencies are recorded from 1 ns to this bound (larger values saturate).
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;
/// Significant decimal digits of the latency histograms (0.1 % resolution).
const SIGNIFICANT_DIGITS: u8 = 3;
/// Roundtrip buckets: 0, 1, 2, 3 and "4 or more".
pub const ROUNDTRIP_BUCKETS: usize = 5;
/// Distinct error messages kept as examples.
const ERROR_SAMPLES: usize = 8;

/// Measurements of one kind of operation.
#[derive(Clone, Debug)]
pub struct OpTypeStats {
    /// Latencies of the operations that completed without error, in ns.
    pub latency: Histogram<u64>,
    /// `roundtrips[i]`: operations that completed in `i` roundtrips (`i = 4`: four or
    /// more).
    pub roundtrips: [u64; ROUNDTRIP_BUCKETS],
    /// Sum of all roundtrips, for the mean.
    pub roundtrips_total: u64,
    /// Gets that found no value, updates of an absent key.
    pub misses: u64,
    /// Operations that failed with an error.
    pub errors: u64,
}

impl Default for OpTypeStats {
    fn default() -> Self {
        Self::new()
    }
}

impl OpTypeStats {
    /// No operation yet.
    pub fn new() -> Self {
        Self {
            // The bounds are constants that hdrhistogram accepts (1 <= low, high >= 2 low,
            // 0..=5 digits); a failure here is a programming error caught by every test.
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid"),
            roundtrips: [0; ROUNDTRIP_BUCKETS],
            roundtrips_total: 0,
            misses: 0,
            errors: 0,
        }
    }

    /// Operations that completed without error.
    pub fn count(&self) -> u64 {
        self.latency.len()
    }

    /// Records an operation that completed in `latency_ns` and `roundtrips`
    /// roundtrips; `hit` is false for a get that found nothing or an update of an
    /// absent key.
    pub fn record(&mut self, latency_ns: u64, roundtrips: u32, hit: bool) {
        self.latency.saturating_record(latency_ns.max(1));
        self.count_outcome(roundtrips, hit);
    }

    /// What [`Self::record`] counts besides the latency.
    fn count_outcome(&mut self, roundtrips: u32, hit: bool) {
        self.roundtrips[(roundtrips as usize).min(ROUNDTRIP_BUCKETS - 1)] += 1;
        self.roundtrips_total += u64::from(roundtrips);
        self.misses += u64::from(!hit);
    }

    /// Adds another thread's measurements.
    pub fn merge(&mut self, other: &Self) {
        // Same bounds on both sides: `add` cannot fail.
        self.latency
            .add(&other.latency)
            .expect("histograms with identical bounds add");
        for (mine, theirs) in self.roundtrips.iter_mut().zip(other.roundtrips) {
            *mine += theirs;
        }
        self.roundtrips_total += other.roundtrips_total;
        self.misses += other.misses;
        self.errors += other.errors;
    }

    /// The fraction of completed operations in roundtrip bucket `bucket` (0 if none
    /// completed).
    pub fn roundtrip_fraction(&self, bucket: usize) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        self.roundtrips.get(bucket).copied().unwrap_or(0) as f64 / count as f64
    }
}

/// Measurements of one phase (load or measured run) of one or all client threads.
#[derive(Clone, Debug, Default)]
pub struct PhaseStats {
    by_type: [OpTypeStats; OpType::ALL.len()],
    /// Examples of the errors seen: message and how many times it occurred.
    error_samples: Vec<(String, u64)>,
}

impl PhaseStats {
    /// Nothing measured yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The measurements of `op`.
    pub fn get(&self, op: OpType) -> &OpTypeStats {
        &self.by_type[op.index()]
    }

    /// Records a completed operation (see [`OpTypeStats::record`]).
    pub fn record(&mut self, op: OpType, latency_ns: u64, roundtrips: u32, hit: bool) {
        self.by_type[op.index()].record(latency_ns, roundtrips, hit);
    }

    /// Records a failed operation and keeps its message as an example.
    pub fn record_error(&mut self, op: OpType, message: impl std::fmt::Display) {
        self.by_type[op.index()].errors += 1;
        let message = format!("{op}: {message}");
        if let Some(sample) = self.error_samples.iter_mut().find(|(m, _)| *m == message) {
            sample.1 += 1;
        } else if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push((message, 1));
        }
    }

    /// Adds another thread's measurements.
    pub fn merge(&mut self, other: &Self) {
        for (mine, theirs) in self.by_type.iter_mut().zip(&other.by_type) {
            mine.merge(theirs);
        }
        for (message, count) in &other.error_samples {
            if let Some(sample) = self.error_samples.iter_mut().find(|(m, _)| m == message) {
                sample.1 += count;
            } else if self.error_samples.len() < ERROR_SAMPLES {
                self.error_samples.push((message.clone(), *count));
            }
        }
    }

    /// Operations that completed without error.
    pub fn completed(&self) -> u64 {
        self.by_type.iter().map(OpTypeStats::count).sum()
    }

    /// Operations that failed.
    pub fn errors(&self) -> u64 {
        self.by_type.iter().map(|s| s.errors).sum()
    }

    /// Examples of the errors, with their counts (at most a few distinct messages).
    pub fn error_samples(&self) -> &[(String, u64)] {
        &self.error_samples
    }
}

/// How the latency histograms index their counts (`Histogram::new_with_bounds(1, _,
/// SIGNIFICANT_DIGITS)`): sub-buckets of `2^SUB_BITS` values (the smallest power of
/// two of at least `2·10^digits`), each bucket of the upper half twice as wide as the
/// one before. A test checks these against the histogram's own `lowest_equivalent`.
const SUB_BITS: u32 = {
    let mut single = 2u64;
    let mut d = 0;
    while d < SIGNIFICANT_DIGITS {
        single *= 10;
        d += 1;
    }
    u64::BITS - (single - 1).leading_zeros()
};
const HALF_BITS: u32 = SUB_BITS - 1;
const SUB_MASK: u64 = (1 << SUB_BITS) - 1;

/// How many counts a latency histogram has, and the index where it records a latency
/// past its last count: that of its highest trackable value (`Histogram::high`, at
/// least [`MAX_LATENCY_NS`]).
fn histogram_shape() -> (usize, usize) {
    static SHAPE: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| {
        let h = OpTypeStats::new().latency;
        (h.distinct_values(), latency_index(h.high()))
    })
}

/// The index of `ns` (at least 1) among the histogram's counts, if it has that many.
#[inline]
fn latency_index(ns: u64) -> usize {
    let bucket = (u64::BITS - SUB_BITS) - (ns | SUB_MASK).leading_zeros();
    let sub = ns >> bucket;
    (((u64::from(bucket) + 1) << HALF_BITS) + sub - (1 << HALF_BITS)) as usize
}

/// The smallest latency of index `index` ([`latency_index`]'s inverse).
fn index_latency(index: usize) -> u64 {
    let index = index as u64;
    let (bucket, sub) = match (index >> HALF_BITS).checked_sub(1) {
        Some(bucket) => (bucket, (index & ((1 << HALF_BITS) - 1)) + (1 << HALF_BITS)),
        None => (0, index),
    };
    sub << bucket
}

/// The counts of one phase of one client thread as it records them: latencies in flat
/// arrays (see the module docs), the rest in a [`PhaseStats`]. [`Self::finish`]
/// gives the phase's [`PhaseStats`].
#[derive(Debug, Default)]
pub struct PhaseRecorder {
    stats: PhaseStats,
    /// Per kind: how many latencies fell on each histogram index (empty until the
    /// kind's first one).
    latency: [Vec<u64>; OpType::ALL.len()],
}

impl PhaseRecorder {
    /// Nothing recorded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a completed operation (see [`OpTypeStats::record`]).
    #[inline]
    pub fn record(&mut self, op: OpType, latency_ns: u64, roundtrips: u32, hit: bool) {
        let counts = &mut self.latency[op.index()];
        if counts.is_empty() {
            counts.resize(histogram_shape().0, 0);
        }
        let index = latency_index(latency_ns.max(1));
        match counts.get_mut(index) {
            Some(count) => *count += 1,
            // Past the histogram's counts (over an hour): where it saturates too.
            None => counts[histogram_shape().1] += 1,
        }
        self.stats.by_type[op.index()].count_outcome(roundtrips, hit);
    }

    /// Records a failed operation (see [`PhaseStats::record_error`]).
    pub fn record_error(&mut self, op: OpType, message: impl std::fmt::Display) {
        self.stats.record_error(op, message);
    }

    /// The phase's measurements.
    pub fn finish(self) -> PhaseStats {
        let Self { mut stats, latency } = self;
        for (kind, counts) in stats.by_type.iter_mut().zip(latency) {
            for (index, count) in counts.into_iter().enumerate() {
                if count > 0 {
                    kind.latency
                        .saturating_record_n(index_latency(index), count);
                }
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_indexes_are_the_histograms() {
        let h = OpTypeStats::new().latency;
        let mut values: Vec<u64> = (1..5000).collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for shift in 0..42 {
            values.extend([(1 << shift) - 1, 1 << shift, (1 << shift) + 1]);
        }
        for _ in 0..100_000 {
            // xorshift: values spread over every magnitude.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push((x >> (x % 64)).clamp(1, MAX_LATENCY_NS));
        }
        values.push(MAX_LATENCY_NS);
        for v in values.into_iter().filter(|&v| v >= 1) {
            assert_eq!(
                index_latency(latency_index(v)),
                h.lowest_equivalent(v),
                "value {v}"
            );
            assert!(latency_index(v) <= latency_index(MAX_LATENCY_NS));
        }
    }

    #[test]
    fn the_recorder_fills_the_same_histograms() {
        let mut direct = PhaseStats::new();
        let mut recorder = PhaseRecorder::new();
        let mut x = 12345u64;
        for i in 0..50_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let latency = match i % 5 {
                0 => x % 3_000,
                1 => x % 3_000_000,
                2 => x >> (x % 64),
                3 => 0,
                _ => u64::MAX - i,
            };
            let op = OpType::ALL[(x % 3) as usize];
            let (roundtrips, hit) = ((x >> 8) as u32 % 6, !x.is_multiple_of(7));
            direct.record(op, latency, roundtrips, hit);
            recorder.record(op, latency, roundtrips, hit);
        }
        direct.record_error(OpType::Update, "boom");
        recorder.record_error(OpType::Update, "boom");
        let recorded = recorder.finish();
        for op in OpType::ALL {
            let (a, b) = (direct.get(op), recorded.get(op));
            assert_eq!(a.count(), b.count(), "{op}");
            assert_eq!(
                (a.roundtrips, a.roundtrips_total),
                (b.roundtrips, b.roundtrips_total)
            );
            assert_eq!((a.misses, a.errors), (b.misses, b.errors), "{op}");
            assert_eq!(
                (a.latency.min(), a.latency.max()),
                (b.latency.min(), b.latency.max())
            );
            assert_eq!(a.latency.mean(), b.latency.mean(), "{op}");
            for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(
                    a.latency.value_at_quantile(q),
                    b.latency.value_at_quantile(q),
                    "{op} q {q}"
                );
            }
        }
        assert_eq!(direct.error_samples(), recorded.error_samples());
        assert_eq!(PhaseRecorder::new().finish().completed(), 0);
    }

    #[test]
    fn records_latencies_roundtrips_and_misses() {
        let mut s = OpTypeStats::new();
        for i in 1..=100u64 {
            s.record(i * 1000, if i <= 97 { 1 } else { i as u32 - 96 }, i != 50);
        }
        assert_eq!(s.count(), 100);
        assert_eq!(s.roundtrips, [0, 97, 1, 1, 1]);
        assert_eq!(s.roundtrips_total, 97 + 2 + 3 + 4);
        assert_eq!(s.misses, 1);
        assert!((s.roundtrip_fraction(1) - 0.97).abs() < 1e-12);
        let p50 = s.latency.value_at_quantile(0.5);
        assert!((49_900..=50_100).contains(&p50), "p50 {p50}");
        // Zero and huge latencies neither panic nor get lost.
        s.record(0, 0, true);
        s.record(u64::MAX, 9, true);
        assert_eq!(s.count(), 102);
        assert_eq!(s.roundtrips[0], 1);
        assert_eq!(s.roundtrips[4], 2);
        assert_eq!(OpTypeStats::new().roundtrip_fraction(1), 0.0);
    }

    #[test]
    fn merge_adds_everything_and_keeps_a_few_error_samples() {
        let mut a = PhaseStats::new();
        let mut b = PhaseStats::new();
        a.record(OpType::Get, 1000, 1, true);
        b.record(OpType::Get, 3000, 2, false);
        b.record(OpType::Update, 5000, 1, true);
        for i in 0..20 {
            b.record_error(OpType::Update, format!("boom {}", i % 10));
        }
        a.record_error(OpType::Update, "boom 0");
        a.merge(&b);
        assert_eq!(a.completed(), 3);
        assert_eq!(a.errors(), 21);
        assert_eq!(a.get(OpType::Get).count(), 2);
        assert_eq!(a.get(OpType::Get).misses, 1);
        assert_eq!(a.get(OpType::Get).roundtrips, [0, 1, 1, 0, 0]);
        assert_eq!(a.get(OpType::Update).errors, 21);
        assert_eq!(a.error_samples().len(), ERROR_SAMPLES);
        assert_eq!(a.error_samples()[0], ("update: boom 0".to_string(), 3));
    }
}
