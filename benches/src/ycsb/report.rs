//! The result of a run: [`BenchReport`], its JSON form and its human-readable table.
//!
//! # JSON schema
//!
//! One object per run (`swarm bench --json FILE`); times in ns unless named
//! otherwise; fields may be added, never renamed:
//!
//! ```json
//! {
//!   "system": "swarm",            // register protocol: "swarm", "abd" or "raw"
//!   "workload": "b",              // YCSB core workload: "a", "b" or "c"
//!   "clients": 4,                 // client threads, one KvClient each
//!   "inflight": 1,                // operations in flight per client (closed loop)
//!   "keys": 100000,               // keys loaded before the measured phase
//!   "ops": 1000000,               // measured operations requested, all clients
//!                                 // (18446744073709551615: no limit, a --duration run)
//!   "duration_ns": 60000000000,   // only with --duration: the measured phase's length
//!   "key_size": 24, "value_size": 64,
//!   "rtt_ns": 0,                  // emulated network roundtrip time
//!   "seed": 1592613450,
//!   "warmup_ops": 0,              // unmeasured workload operations before the measured ones
//!   "warm_cache": true,           // every client read every key once after the load
//!   "seconds": 0.81,              // wall time of the measured phase
//!   "throughput_ops_s": 1.2e6,    // measured operations completed without error per second
//!   "errors": 0,                  // failed operations of all phases (load, warm-up, measured)
//!   "error_samples": [{"message": "update: ...", "count": 3}],   // only when errors > 0
//!   "ops_by_type": {              // measured phase, one entry per operation kind that ran
//!     "get": {
//!       "count": 950000,          // completed without error
//!       "errors": 0,              // failed with an error (not in the figures below)
//!       "misses": 0,              // gets that found nothing, updates of an absent key
//!       "mean_ns": 2400.0, "p50_ns": 2300, "p90_ns": 2600, "p99_ns": 2900,
//!       "p999_ns": 5000, "max_ns": 90000,
//!       "roundtrips": {"1": 0.995, "2": 0.004, "3": 0.001, "4+": 0.0},
//!                                 // fraction of `count` taking that many roundtrips;
//!                                 // a "0" entry appears only if some took none
//!       "roundtrips_mean": 1.006
//!     },
//!     "update": { ... }
//!   },
//!   "load":   {"ops": 100000, "seconds": 0.3, "throughput_ops_s": 3.3e5, "errors": 0},
//!   "load_inserts": { ... },      // the load phase's inserts, like an "ops_by_type" entry
//!   "warmup": {"ops": 400000, "seconds": 0.5, "throughput_ops_s": 8.0e5, "errors": 0},
//!                                 // cache warm-up and warm-up operations together
//!   "drain": {"ops": 100000, ...}, // only with --drain: the deletes after the measured phase
//!   "fail_node": {"node": 1, "after_ops": 500000, "triggered": true},  // only with --fail-node
//!   "fail_at_ms": 412.5,          // when it happened, since the measured phase began
//!   "memory_start": {             // cluster memory in use before the run (SWARM-KV stores)
//!     "registers_claimed": 1024,  // register slots in chunks claimed by clients
//!     "keys": 0,                  // keys in the index (registers holding live keys)
//!     "log_slots_in_use": null    // memory_start: null (not counted); memory_end: the log
//!                                 // slots the run's clients held when they stopped (live
//!                                 // values and slots waiting out the recycling grace)
//!   },
//!   "memory_end": { ... },        // the same after the run (clients closed)
//!   "lease_renewals": 480,        // client lease renewals a majority acknowledged, all clients
//!   "recycled_slots": 1190000,    // log slots given back to their writers during the run
//!   "recycled_registers": 0,      // registers reset and handed out again during the run
//!   "reclaimed_registers": 0,     // registers taken from gone clients' limbos and pools
//!   "donated_registers": 0,       // registers reset for any client, beyond the pool a
//!                                 // client keeps (taken by clients that ran dry)
//!   "deferred_unmaps": 0,         // index unmaps run after their delete returned (at its
//!                                 // tombstone), all phases and clients
//!   "deferred_unmap_roundtrips": 0, // their roundtrips (not in the deletes' counts)
//!   "timeline_interval_ms": 10.0,
//!   "timeline": [                 // the measured phase per interval (Figure 11)
//!     {"t_ms": 0.0, "ops": 9100, "throughput_ops_s": 9.1e5, "p50_ns": 2300, "p99_ns": 3100,
//!      "errors": 0}
//!   ]
//! }
//! ```
//!
//! Each operation kind also has `"cdf": [[latency_ns, fraction], ...]`, the latency
//! distribution at fractions 0.01 ... 0.99, 0.995, 0.999, 0.9995, 0.9999 and 1 (Figure 5).
//!
//! Percentiles come from HDR histograms with three significant digits (0.1 %).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use super::config::{BenchConfig, FailPlan, System};
use super::stats::{OpTypeStats, PhaseStats};
pub use super::timeline::TimelinePoint;
use super::workload::{OpType, Workload};

/// Roundtrip distribution of one operation kind: fractions of the completed
/// operations (SWARM Table 2 counts the same thing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundtripFractions {
    /// Took no roundtrip (not expected from any operation; shown only if nonzero).
    #[serde(rename = "0", default, skip_serializing_if = "is_zero")]
    pub zero: f64,
    /// One roundtrip.
    #[serde(rename = "1")]
    pub one: f64,
    /// Two roundtrips.
    #[serde(rename = "2")]
    pub two: f64,
    /// Three roundtrips.
    #[serde(rename = "3")]
    pub three: f64,
    /// Four or more.
    #[serde(rename = "4+")]
    pub four_plus: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// Figures of one operation kind in the measured phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpTypeReport {
    /// Operations completed without error.
    pub count: u64,
    /// Operations that failed with an error.
    pub errors: u64,
    /// Gets that found nothing, updates of an absent key.
    pub misses: u64,
    /// Mean latency.
    pub mean_ns: f64,
    /// Median latency.
    pub p50_ns: u64,
    /// 90th percentile latency.
    pub p90_ns: u64,
    /// 99th percentile latency.
    pub p99_ns: u64,
    /// 99.9th percentile latency.
    pub p999_ns: u64,
    /// Largest latency.
    pub max_ns: u64,
    /// Roundtrip distribution.
    pub roundtrips: RoundtripFractions,
    /// Mean roundtrips per operation.
    pub roundtrips_mean: f64,
    /// The latency distribution: `[latency_ns, fraction of operations at most that
    /// slow]`, fractions from 0.01 to 1, finer toward the tail (SWARM Figure 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdf: Vec<(u64, f64)>,
}

/// The quantiles of [`OpTypeReport::cdf`].
fn cdf_quantiles() -> impl Iterator<Item = f64> {
    (1..100)
        .map(|i| f64::from(i) / 100.0)
        .chain([0.995, 0.999, 0.9995, 0.9999, 1.0])
}

impl OpTypeReport {
    /// The figures of `stats`.
    pub fn from_stats(stats: &OpTypeStats) -> Self {
        let h = &stats.latency;
        let count = stats.count();
        let (mean_ns, roundtrips_mean) = if count == 0 {
            (0.0, 0.0)
        } else {
            (h.mean(), stats.roundtrips_total as f64 / count as f64)
        };
        Self {
            count,
            errors: stats.errors,
            misses: stats.misses,
            mean_ns,
            p50_ns: h.value_at_quantile(0.5),
            p90_ns: h.value_at_quantile(0.9),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            roundtrips: RoundtripFractions {
                zero: stats.roundtrip_fraction(0),
                one: stats.roundtrip_fraction(1),
                two: stats.roundtrip_fraction(2),
                three: stats.roundtrip_fraction(3),
                four_plus: stats.roundtrip_fraction(4),
            },
            roundtrips_mean,
            cdf: if count == 0 {
                Vec::new()
            } else {
                cdf_quantiles()
                    .map(|q| (h.value_at_quantile(q), q))
                    .collect()
            },
        }
    }
}

/// Totals of an unmeasured phase (load, warm-up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    /// Operations completed without error.
    pub ops: u64,
    /// Wall time.
    pub seconds: f64,
    /// `ops / seconds`.
    pub throughput_ops_s: f64,
    /// Operations that failed.
    pub errors: u64,
}

impl PhaseSummary {
    /// The totals of `stats` over `seconds`.
    pub fn from_stats(stats: &PhaseStats, seconds: f64) -> Self {
        let ops = stats.completed();
        Self {
            ops,
            seconds,
            throughput_ops_s: per_second(ops, seconds),
            errors: stats.errors(),
        }
    }
}

fn per_second(ops: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        ops as f64 / seconds
    } else {
        0.0
    }
}

/// An error message seen during the run and how often.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorSample {
    /// `"<op>: <error>"`.
    pub message: String,
    /// Occurrences.
    pub count: u64,
}

/// Whether and when the planned node crash happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailReport {
    /// The crashed node.
    pub node: u16,
    /// Measured operations issued before the crash.
    pub after_ops: u64,
    /// Whether the run got that far (false if `after_ops >= ops`).
    pub triggered: bool,
}

/// When a bench's background repair (`--fail-mode repair`) started, copied and
/// ended, ns (since the measured phase began, in a report).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairMarks {
    /// The repair started (its quiescence wait).
    pub started_ns: u64,
    /// The copy started (the quiescence wait ended).
    pub copy_from_ns: Option<u64>,
    /// The node was rebuilt and admitted (configuration written).
    pub done_ns: Option<u64>,
    /// Bytes copied.
    pub bytes: u64,
    /// Why the repair failed, if it did.
    pub error: Option<String>,
}

/// Cluster memory in use at one moment (a SWARM-KV store's, read from the memory
/// nodes; see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// Register slots in chunks claimed by clients, handed out or not.
    pub registers_claimed: u64,
    /// Keys in the index: registers holding live keys.
    pub keys: u64,
    /// Log slots in use, all the run's writers together, as the clients counted
    /// them when they stopped; `None` where not counted (before the run, other
    /// systems).
    pub log_slots_in_use: Option<u64>,
}

/// The measured phases of a run, as [`BenchReport::new`] takes them.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// The load phase.
    pub load: PhaseStats,
    /// Its wall time, seconds.
    pub load_seconds: f64,
    /// Cache warm-up and warm-up operations.
    pub warmup: PhaseStats,
    /// Their wall time, seconds.
    pub warmup_seconds: f64,
    /// The measured phase.
    pub measured: PhaseStats,
    /// Its wall time, seconds.
    pub measured_seconds: f64,
    /// The drain (`--drain`: every key deleted after the measured phase).
    pub drain: PhaseStats,
    /// Its wall time, seconds.
    pub drain_seconds: f64,
    /// Whether the planned node crash happened.
    pub fail_triggered: bool,
    /// The measured phase per interval.
    pub timeline: Vec<TimelinePoint>,
    /// When the planned node crash happened, ns since the measured phase began.
    pub fail_at_ns: Option<u64>,
    /// The background repair of `--fail-mode repair` (times since the measured phase
    /// began).
    pub repair: Option<RepairMarks>,
    /// Lease renewals acknowledged, all clients.
    pub lease_renewals: u64,
    /// Memory in use before the run.
    pub memory_start: Option<MemoryUse>,
    /// Memory in use after the run.
    pub memory_end: Option<MemoryUse>,
    /// Log slots given back to their writers' logs, all clients.
    pub recycled_slots: u64,
    /// Registers reset and handed out again, all clients.
    pub recycled_registers: u64,
    /// Registers taken from gone clients' limbos and pools, all clients.
    pub reclaimed_registers: u64,
    /// Registers reset for any client beyond the pool a client keeps, all clients.
    pub donated_registers: u64,
    /// Log slots the clients held when they stopped, all clients (`None`: a system
    /// that does not count them).
    pub log_slots_in_use: Option<u64>,
    /// Index unmaps run after their delete returned, all clients.
    pub deferred_unmaps: u64,
    /// Roundtrips of those unmaps, all clients.
    pub deferred_unmap_roundtrips: u64,
}

/// The result of a run; see the module docs for its JSON form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Register protocol.
    pub system: System,
    /// YCSB workload.
    pub workload: Workload,
    /// Client threads.
    pub clients: usize,
    /// Operations in flight per client.
    pub inflight: usize,
    /// Keys loaded.
    pub keys: u64,
    /// Measured operations requested.
    pub ops: u64,
    /// Bytes per key.
    pub key_size: usize,
    /// Bytes per value.
    pub value_size: usize,
    /// Emulated roundtrip time, ns.
    pub rtt_ns: u64,
    /// Seed of the run.
    pub seed: u64,
    /// Unmeasured workload operations before the measured phase.
    pub warmup_ops: u64,
    /// Whether every client read every key after the load.
    pub warm_cache: bool,
    /// Wall time of the measured phase.
    pub seconds: f64,
    /// Measured operations completed without error per second.
    pub throughput_ops_s: f64,
    /// Failed operations of all phases.
    pub errors: u64,
    /// Examples of the errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_samples: Vec<ErrorSample>,
    /// Measured figures per operation kind.
    pub ops_by_type: BTreeMap<OpType, OpTypeReport>,
    /// The load phase.
    pub load: PhaseSummary,
    /// The load phase's inserts, with latencies and roundtrips like the measured
    /// kinds (SWARM-KV inserts into an empty store: their cost is the insert path's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_inserts: Option<OpTypeReport>,
    /// The warm-up (cache warm-up and warm-up operations).
    pub warmup: PhaseSummary,
    /// The drain after the measured phase (`--drain`), if one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<PhaseSummary>,
    /// The node crash, if one was planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_node: Option<FailReport>,
    /// Length of a timeline interval, ms.
    #[serde(default)]
    pub timeline_interval_ms: f64,
    /// The measured phase per interval (SWARM Figure 11).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelinePoint>,
    /// When the planned node crash happened, ms since the measured phase began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_at_ms: Option<f64>,
    /// The background repair of `--fail-mode repair` (ns since the measured phase
    /// began; see [`RepairMarks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairMarks>,
    /// The measured phase's length limit (`--duration`), ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// Memory in use before the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_start: Option<MemoryUse>,
    /// Memory in use after the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_end: Option<MemoryUse>,
    /// Lease renewals acknowledged, all clients.
    #[serde(default)]
    pub lease_renewals: u64,
    /// Log slots given back to their writers' logs during the run, all clients
    /// (SWARM §4.5, `swarm_core::slot_recycling`).
    #[serde(default)]
    pub recycled_slots: u64,
    /// Registers reset and handed out again during the run, all clients (SWARM
    /// §5.4, `swarm_kv::registers::recycle`).
    #[serde(default)]
    pub recycled_registers: u64,
    /// Registers taken from gone clients' limbos and pools during the run, all
    /// clients (SWARM §5.4, `swarm_kv::registers::limbo`).
    #[serde(default)]
    pub reclaimed_registers: u64,
    /// Registers reset for any client during the run, beyond the pool a client
    /// keeps, all clients (`swarm_kv::registers::recycle`, "donations").
    #[serde(default)]
    pub donated_registers: u64,
    /// Index unmaps that ran after their delete returned (at its tombstone, SWARM
    /// §5.3.2), all phases and clients: their roundtrips are not in the deletes'.
    #[serde(default)]
    pub deferred_unmaps: u64,
    /// Roundtrips those unmaps took, in all.
    #[serde(default)]
    pub deferred_unmap_roundtrips: u64,
    /// Log slots the run's clients held when they stopped (copied into
    /// `memory_end.log_slots_in_use`).
    #[serde(skip)]
    pub log_slots_in_use_at_end: Option<u64>,
}

impl BenchReport {
    /// The report of `config`'s run.
    pub fn new(config: &BenchConfig, stats: &RunStats) -> Self {
        let measured = &stats.measured;
        let ops_by_type = OpType::ALL
            .into_iter()
            .filter(|&op| measured.get(op).count() + measured.get(op).errors > 0)
            .map(|op| (op, OpTypeReport::from_stats(measured.get(op))))
            .collect();
        let mut all = stats.load.clone();
        all.merge(&stats.warmup);
        all.merge(measured);
        all.merge(&stats.drain);
        let error_samples = all
            .error_samples()
            .iter()
            .map(|(message, count)| ErrorSample {
                message: message.clone(),
                count: *count,
            })
            .collect();
        Self {
            system: config.system,
            workload: config.workload,
            clients: config.clients,
            inflight: config.inflight,
            keys: config.keys,
            ops: config.ops,
            key_size: config.key_size,
            value_size: config.value_size,
            rtt_ns: config.rtt_ns,
            seed: config.seed,
            warmup_ops: config.warmup_ops,
            warm_cache: config.warm_cache,
            seconds: stats.measured_seconds,
            throughput_ops_s: per_second(measured.completed(), stats.measured_seconds),
            errors: all.errors(),
            error_samples,
            ops_by_type,
            load: PhaseSummary::from_stats(&stats.load, stats.load_seconds),
            load_inserts: Some(stats.load.get(OpType::Insert))
                .filter(|s| s.count() + s.errors > 0)
                .map(OpTypeReport::from_stats),
            warmup: PhaseSummary::from_stats(&stats.warmup, stats.warmup_seconds),
            drain: config
                .drain
                .then(|| PhaseSummary::from_stats(&stats.drain, stats.drain_seconds)),
            fail_node: config.fail.map(|FailPlan { node, after_ops }| FailReport {
                node,
                after_ops,
                triggered: stats.fail_triggered,
            }),
            timeline_interval_ms: config.timeline_interval_ns as f64 / 1e6,
            timeline: stats.timeline.clone(),
            fail_at_ms: stats.fail_at_ns.map(|ns| ns as f64 / 1e6),
            repair: stats.repair.clone(),
            duration_ns: config.duration_ns,
            memory_start: stats.memory_start,
            memory_end: stats.memory_end,
            lease_renewals: stats.lease_renewals,
            recycled_slots: stats.recycled_slots,
            recycled_registers: stats.recycled_registers,
            reclaimed_registers: stats.reclaimed_registers,
            donated_registers: stats.donated_registers,
            deferred_unmaps: stats.deferred_unmaps,
            deferred_unmap_roundtrips: stats.deferred_unmap_roundtrips,
            log_slots_in_use_at_end: stats.log_slots_in_use,
        }
    }

    /// Failed operations of every phase; a run with any is not a clean run (the CLI
    /// exits non-zero).
    pub fn total_errors(&self) -> u64 {
        self.errors
    }

    /// The figures of `op`, if any ran.
    pub fn op(&self, op: OpType) -> Option<&OpTypeReport> {
        self.ops_by_type.get(&op)
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Only numbers, strings and maps with string keys: serialization cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// `1234` → `"1.23µs"`: a latency with three significant digits.
pub fn format_ns(ns: f64) -> String {
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    let decimals = if value >= 100.0 || unit == "ns" {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.decimals$}{unit}")
}

/// `1_234_000.0` → `"1.23 Mops/s"`.
pub fn format_rate(ops_s: f64) -> String {
    if ops_s >= 1e6 {
        format!("{:.2} Mops/s", ops_s / 1e6)
    } else if ops_s >= 1e3 {
        format!("{:.1} kops/s", ops_s / 1e3)
    } else {
        format!("{ops_s:.0} ops/s")
    }
}

/// A fraction as a percentage with one decimal, `"-"` for exactly zero.
pub fn format_fraction(x: f64) -> String {
    if x == 0.0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * x)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {}: {} clients x {} in flight, {} keys of {} B, {} B values, rtt {} ns, seed {}",
            self.system,
            self.workload,
            self.clients,
            self.inflight,
            self.keys,
            self.key_size,
            self.value_size,
            self.rtt_ns,
            self.seed
        );
        let phase = |name: &str, p: &PhaseSummary| {
            format!(
                "{name:<8} {} ops in {:.2} s ({}), {} errors",
                p.ops,
                p.seconds,
                format_rate(p.throughput_ops_s),
                p.errors
            )
        };
        let _ = writeln!(out, "{}", phase("load", &self.load));
        if self.warmup.ops + self.warmup.errors > 0 {
            let _ = writeln!(out, "{}", phase("warm-up", &self.warmup));
        }
        if let Some(drain) = &self.drain {
            let _ = writeln!(out, "{}", phase("drain", drain));
        }
        if let (Some(start), Some(end)) = (&self.memory_start, &self.memory_end) {
            let held = end
                .log_slots_in_use
                .map(|n| format!(" ({n} log slots held at the end)"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "memory   registers claimed {} -> {}, keys {} -> {}; {} lease renewals; recycled {} log slots{held}, {} registers ({} reclaimed from gone clients, {} donated between clients)",
                start.registers_claimed,
                end.registers_claimed,
                start.keys,
                end.keys,
                self.lease_renewals,
                self.recycled_slots,
                self.recycled_registers,
                self.reclaimed_registers,
                self.donated_registers
            );
        }
        if self.deferred_unmaps > 0 {
            let _ = writeln!(
                out,
                "deletes  {} index unmaps ran after their delete returned ({:.2} roundtrips each, not in the deletes' counts)",
                self.deferred_unmaps,
                self.deferred_unmap_roundtrips as f64 / self.deferred_unmaps as f64
            );
        }
        let completed: u64 = self.ops_by_type.values().map(|r| r.count).sum();
        let measured_errors: u64 = self.ops_by_type.values().map(|r| r.errors).sum();
        let _ = writeln!(
            out,
            "measured {completed} ops in {:.2} s: {}, {measured_errors} errors",
            self.seconds,
            format_rate(self.throughput_ops_s)
        );
        let _ = writeln!(
            out,
            "{:<7} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} {:>6} {:>7}",
            "op",
            "count",
            "misses",
            "mean",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "1 RT",
            "2 RT",
            "3 RT",
            "4+ RT",
            "mean RT"
        );
        let load_row = self.load_inserts.as_ref().map(|r| ("insert*", r));
        let rows = self
            .ops_by_type
            .iter()
            .map(|(op, r)| (op.name(), r))
            .chain(load_row);
        for (name, r) in rows {
            let _ = writeln!(
                out,
                "{:<7} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} {:>6} {:>7.3}",
                name,
                r.count,
                r.misses,
                format_ns(r.mean_ns),
                format_ns(r.p50_ns as f64),
                format_ns(r.p90_ns as f64),
                format_ns(r.p99_ns as f64),
                format_ns(r.p999_ns as f64),
                format_ns(r.max_ns as f64),
                format_fraction(r.roundtrips.one),
                format_fraction(r.roundtrips.two),
                format_fraction(r.roundtrips.three),
                format_fraction(r.roundtrips.four_plus),
                r.roundtrips_mean
            );
        }
        if self.load_inserts.is_some() {
            let _ = writeln!(
                out,
                "* load phase (keys inserted before the measured phase)"
            );
        }
        if let Some(fail) = self.fail_node {
            let _ = writeln!(
                out,
                "node {} {} after {} measured ops",
                fail.node,
                if fail.triggered {
                    "crashed"
                } else {
                    "was to crash (not reached)"
                },
                fail.after_ops
            );
            if let Some(r) = &self.repair {
                let ms = |ns: Option<u64>| {
                    ns.map_or("-".to_owned(), |ns| format!("{:.0} ms", ns as f64 / 1e6))
                };
                let _ = writeln!(
                    out,
                    "repair of node {}: started at {}, copying from {}, admitted at {} ({} MiB){}",
                    fail.node,
                    ms(Some(r.started_ns)),
                    ms(r.copy_from_ns),
                    ms(r.done_ns),
                    r.bytes >> 20,
                    r.error
                        .as_deref()
                        .map(|e| format!("; FAILED: {e}"))
                        .unwrap_or_default()
                );
            }
        }
        if self.errors > 0 {
            let _ = writeln!(
                out,
                "{} failed operations in all phases, for example:",
                self.errors
            );
            for sample in &self.error_samples {
                let _ = writeln!(out, "  {}x {}", sample.count, sample.message);
            }
        }
        f.write_str(out.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::workload::Workload;

    fn sample_report() -> BenchReport {
        let mut config = BenchConfig::new(System::Swarm, Workload::B);
        config.fail = Some(FailPlan {
            node: 1,
            after_ops: 10,
        });
        let mut stats = RunStats {
            load_seconds: 0.5,
            warmup_seconds: 0.25,
            measured_seconds: 2.0,
            fail_triggered: true,
            ..RunStats::default()
        };
        for _ in 0..100 {
            stats.load.record(OpType::Insert, 5_000, 3, true);
            stats.warmup.record(OpType::Get, 2_000, 2, true);
        }
        for i in 0..1000u64 {
            stats
                .measured
                .record(OpType::Get, 2_000 + i, if i < 995 { 1 } else { 2 }, true);
        }
        for _ in 0..50 {
            stats.measured.record(OpType::Update, 3_000, 1, true);
        }
        stats.measured.record_error(OpType::Update, "no majority");
        stats.load.record_error(OpType::Insert, "full");
        BenchReport::new(&config, &stats)
    }

    #[test]
    fn report_has_the_documented_schema() {
        let report = sample_report();
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["system"], "swarm");
        assert_eq!(json["workload"], "b");
        assert_eq!(json["clients"], 4);
        assert_eq!(json["keys"], 100_000);
        assert_eq!(json["ops"], 1_000_000);
        assert_eq!(json["throughput_ops_s"], 525.0);
        assert_eq!(json["errors"], 2);
        let get = &json["ops_by_type"]["get"];
        assert_eq!(get["count"], 1000);
        let p50 = get["p50_ns"].as_u64().unwrap();
        assert!((2_490..=2_510).contains(&p50), "p50 {p50}");
        assert!(get["p90_ns"].as_u64().unwrap() >= p50);
        assert!(get["p99_ns"].as_u64().unwrap() >= get["p90_ns"].as_u64().unwrap());
        assert!(get["p999_ns"].as_u64().unwrap() >= get["p99_ns"].as_u64().unwrap());
        assert_eq!(get["roundtrips"]["1"], 0.995);
        assert_eq!(get["roundtrips"]["2"], 0.005);
        assert_eq!(get["roundtrips"]["3"], 0.0);
        assert_eq!(get["roundtrips"]["4+"], 0.0);
        assert!(get["roundtrips"].get("0").is_none());
        assert_eq!(json["ops_by_type"]["update"]["errors"], 1);
        assert!(json["ops_by_type"].get("insert").is_none());
        assert_eq!(json["load"]["ops"], 100);
        assert_eq!(json["load"]["errors"], 1);
        assert_eq!(json["warmup"]["ops"], 100);
        assert_eq!(json["fail_node"]["triggered"], true);
        assert_eq!(json["error_samples"][0]["message"], "insert: full");
        let back: BenchReport = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn table_shows_every_figure() {
        let text = sample_report().to_string();
        assert!(
            text.starts_with("swarm YCSB-B: 4 clients x 1 in flight"),
            "{text}"
        );
        assert!(text.contains("525 ops/s"), "{text}");
        assert!(text.contains("99.5%"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("get ")), "{text}");
        assert!(text.lines().any(|l| l.starts_with("update ")), "{text}");
        assert!(
            text.contains("node 1 crashed after 10 measured ops"),
            "{text}"
        );
        assert!(text.contains("1x update: no majority"), "{text}");
    }

    #[test]
    fn formats() {
        assert_eq!(format_ns(850.0), "850ns");
        assert_eq!(format_ns(2_412.0), "2.41µs");
        assert_eq!(format_ns(31_000.0), "31.0µs");
        assert_eq!(format_ns(1_500_000.0), "1.50ms");
        assert_eq!(format_ns(2e9), "2.00s");
        assert_eq!(format_rate(1_234_000.0), "1.23 Mops/s");
        assert_eq!(format_rate(81_300.0), "81.3 kops/s");
        assert_eq!(format_fraction(0.0), "-");
        assert_eq!(format_fraction(0.995), "99.5%");
    }
}
