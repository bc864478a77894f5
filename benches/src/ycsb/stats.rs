//! Per-thread measurements of a benchmark phase, merged when the threads finish:
//! for each kind of operation, an HDR latency histogram, how many roundtrips each
//! operation took (the paper's Table 2 is this count, §7.1), and how many failed.
//!
//! A client thread owns its [`PhaseStats`] and records into it after taking an
//! operation's end time, so recording never adds to a measured latency and threads
//! share nothing while measuring.

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

#[cfg(test)]
mod tests {
    use super::*;

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
