//! What to run: [`BenchConfig`], and [`BenchArgs`], the `swarm bench` flags that
//! build one.
//!
//! Defaults are the paper's setting (§7): YCSB B, 100 000 keys of 24 B, 64 B values,
//! 4 clients with one operation at a time, 1 000 000 measured operations.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::BenchError;
use super::workload::{CHURN_SPACE, MIN_KEY_SIZE, Workload, value_tag_len};

/// Timeline intervals: 10 ms, as in SWARM's Figure 11.
pub const DEFAULT_TIMELINE_INTERVAL_NS: u64 = 10_000_000;
/// Measured operations unless `--ops` or `--duration` is given.
pub const DEFAULT_OPS: u64 = 1_000_000;
/// The seed of a run unless one is given.
pub const DEFAULT_SEED: u64 = 0x5EED_5A4A;
/// The most client threads (SWARM-KV's writer-id space).
pub const MAX_CLIENTS: usize = swarm_core::encoding::MAX_WRITERS as usize;
/// The most operations one client keeps in flight.
pub const MAX_INFLIGHT: usize = 64;
/// Default [`BenchConfig::deferred_unmaps`]: deletes return at their tombstone, with
/// room for a burst of deletes while the client's background task unmaps.
pub const DEFAULT_DEFERRED_UNMAPS: usize = 64;
/// The largest key the benchmark builds.
pub const MAX_KEY_SIZE: usize = 4096;
/// The largest value the benchmark writes.
pub const MAX_VALUE_SIZE: usize = 1 << 20;

/// The register protocol behind every key: SWARM-KV or one of the paper's baselines
/// (§7), all on the same store, index and cache so that only the protocol differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// SWARM-KV: Safe-Guess over In-n-Out, one roundtrip per get and update.
    Swarm,
    /// DM-ABD: ABD with out-of-place data, two roundtrips per get and update.
    Abd,
    /// RAW: unreplicated, no concurrency control; the latency floor.
    Raw,
    /// FUSEE (FAST '23): SNAPSHOT-replicated index, out-of-place values; gets take 1-2
    /// roundtrips, updates 4 or more. Runs on its own store (`swarm_fusee`).
    Fusee,
}

impl System {
    /// Every system, baselines first (the order of comparison tables).
    pub const ALL: [Self; 4] = [Self::Raw, Self::Abd, Self::Fusee, Self::Swarm];

    /// `"swarm"`, `"abd"`, `"raw"` or `"fusee"`, as in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Swarm => "swarm",
            Self::Abd => "abd",
            Self::Raw => "raw",
            Self::Fusee => "fusee",
        }
    }
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What `--fail-node` does to the node (issue 12).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum FailMode {
    /// Every client stops reaching the node; its memory survives (a partition).
    #[default]
    Stop,
    /// The node crashes with its memory and restarts empty (shared memory: its file is
    /// retired, which every process sees at once, and re-created with a new
    /// incarnation): it stays out.
    LoseMemory,
    /// As `lose-memory`, then `swarm repair` rebuilds it online in the background and
    /// the clients admit it back.
    Repair,
}

/// Crash a memory node in the middle of the measured phase (SWARM §7.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailPlan {
    /// The node every client marks failed.
    pub node: u16,
    /// After this many measured operations (all clients together) were issued.
    pub after_ops: u64,
}

/// One benchmark run. See the module docs for the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// The register protocol.
    pub system: System,
    /// The operation mix.
    pub workload: Workload,
    /// Keys loaded before the measured phase.
    pub keys: u64,
    /// Measured operations, all clients together (`u64::MAX`: no limit, with
    /// `duration_ns`).
    pub ops: u64,
    /// Ends the measured phase after this long, even if `ops` were not all issued
    /// (`swarm bench --duration`): each client stops claiming operations once this
    /// long has passed since it entered the measured phase.
    pub duration_ns: Option<u64>,
    /// Client threads, each with its own `KvClient`.
    pub clients: usize,
    /// Operations each client keeps in flight (closed loop).
    pub inflight: usize,
    /// Index unmaps each SWARM-KV client's deletes may leave to a background task
    /// ([`swarm_kv::KvConfig::deferred_unmaps`]; `0`: deletes unmap before they return).
    pub deferred_unmaps: usize,
    /// Bytes per key.
    pub key_size: usize,
    /// Bytes per value.
    pub value_size: usize,
    /// Unmeasured operations of the workload run before the measured ones (the
    /// paper warms up with 1 000 000).
    pub warmup_ops: u64,
    /// After the load, every client gets every key once (unmeasured), so that
    /// location caches hold every key, as in the paper's setting ("index caches large
    /// enough to cache all key locations", warmed up). Without it, a client's first
    /// access to a key it did not insert goes through the index.
    pub warm_cache: bool,
    /// Emulated network roundtrip time of every client's fabric, ns.
    pub rtt_ns: u64,
    /// Seed of the clients' key and operation choices.
    pub seed: u64,
    /// Optional memory-node crash during the measured phase.
    pub fail: Option<FailPlan>,
    /// What the crash does (memory kept, lost, lost and repaired).
    pub fail_mode: FailMode,
    /// Write every operation (load, warm-up and measured) to this file as JSON Lines
    /// for the linearizability checker.
    pub history: Option<PathBuf>,
    /// Record in the history only operations on keys numbered below this (a sample
    /// key range whose history is complete, so it can be checked; churn runs over
    /// many distinct keys). `None`: every key.
    pub history_keys: Option<u64>,
    /// Added to every key number before it is named (`swarm bench --key-offset`):
    /// key `k` of the run is YCSB key `key_offset + k`, churn's ever-new sequence
    /// included. Runs whose key-number ranges (`key_offset` up to `key_offset +`
    /// [`BenchConfig::key_numbers`]) do not overlap name disjoint keys, so several
    /// runs can share one cluster and each one's history describes its own keys.
    pub key_offset: u64,
    /// After the measured phase, delete every key the run names (`swarm bench
    /// --drain`: the loaded keys, or churn's whole key space), so that a run leaves
    /// no key behind; recorded in the history like any operation.
    pub drain: bool,
    /// Show a progress bar on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// Length of the timeline's intervals (SWARM Figure 11), ns.
    pub timeline_interval_ns: u64,
}

impl BenchConfig {
    /// The paper's setting for `system` and `workload` (see the module docs).
    pub fn new(system: System, workload: Workload) -> Self {
        Self {
            system,
            workload,
            keys: 100_000,
            ops: DEFAULT_OPS,
            duration_ns: None,
            clients: 4,
            inflight: 1,
            deferred_unmaps: DEFAULT_DEFERRED_UNMAPS,
            key_size: 24,
            value_size: 64,
            warmup_ops: 0,
            warm_cache: true,
            rtt_ns: 0,
            seed: DEFAULT_SEED,
            fail: None,
            fail_mode: FailMode::Stop,
            history: None,
            history_keys: None,
            key_offset: 0,
            drain: false,
            progress: false,
            timeline_interval_ns: DEFAULT_TIMELINE_INTERVAL_NS,
        }
    }

    /// The most operations one client can run in the whole benchmark: its whole
    /// share of the load, the cache warm-up, and every other operation. Bounds the
    /// operation numbers in value tags.
    pub fn max_ops_per_client(&self) -> u64 {
        let warm = if self.warm_cache { self.keys } else { 0 };
        let drain = if self.drain { self.key_numbers() } else { 0 };
        self.keys
            .saturating_add(warm)
            .saturating_add(self.warmup_ops)
            .saturating_add(self.ops)
            .saturating_add(drain)
    }

    /// How many key numbers the run names: `keys` for the YCSB workloads, `keys x`
    /// [`CHURN_SPACE`] for churn (its names wrap after that many windows).
    pub fn key_numbers(&self) -> u64 {
        if self.workload.loads_keys() {
            self.keys
        } else {
            self.keys.saturating_mul(CHURN_SPACE)
        }
    }

    /// The smallest value size that holds every value tag of this run.
    pub fn min_value_size(&self) -> usize {
        let last_client = u32::try_from(self.clients.saturating_sub(1)).unwrap_or(u32::MAX);
        value_tag_len(last_client, self.max_ops_per_client())
    }

    /// Checks every setting; the error says which one and what is accepted.
    pub fn validate(&self) -> Result<(), BenchError> {
        let invalid = |msg: String| Err(BenchError::InvalidConfig(msg));
        if self.keys == 0 {
            return invalid("--keys must be at least 1".into());
        }
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return invalid(format!(
                "--clients must be 1 to {MAX_CLIENTS}, not {}",
                self.clients
            ));
        }
        if !(1..=MAX_INFLIGHT).contains(&self.inflight) {
            return invalid(format!(
                "--inflight must be 1 to {MAX_INFLIGHT}, not {}",
                self.inflight
            ));
        }
        if self.key_size < MIN_KEY_SIZE {
            return Err(BenchError::KeySizeTooSmall {
                size: self.key_size,
                min: MIN_KEY_SIZE,
            });
        }
        if self.key_size > MAX_KEY_SIZE {
            return invalid(format!(
                "--key-size must be at most {MAX_KEY_SIZE}, not {}",
                self.key_size
            ));
        }
        if self.value_size > MAX_VALUE_SIZE {
            return invalid(format!(
                "--value-size must be at most {MAX_VALUE_SIZE}, not {}",
                self.value_size
            ));
        }
        let min = self.min_value_size();
        if self.value_size < min {
            return Err(BenchError::ValueSizeTooSmall {
                size: self.value_size,
                min,
            });
        }
        if self.duration_ns == Some(0) {
            return invalid("--duration must be longer than 0".into());
        }
        if self.workload == Workload::Churn && matches!(self.system, System::Raw) {
            return invalid("--workload churn deletes keys, which RAW cannot do".into());
        }
        if self.history_keys == Some(0) {
            return invalid("--history-keys must be at least 1".into());
        }
        if self.key_offset.checked_add(self.key_numbers()).is_none() {
            return invalid(format!(
                "--key-offset {} plus the run's {} key numbers overflows 64 bits",
                self.key_offset,
                self.key_numbers()
            ));
        }
        if self.fail.is_some() && self.system == System::Raw {
            return invalid(
                "--fail-node needs a replicated system: RAW keeps each key on one node only".into(),
            );
        }
        Ok(())
    }
}

/// The flags of `swarm bench`; [`BenchArgs::to_config`] turns them into a
/// [`BenchConfig`].
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// YCSB workload: a (50 % updates), b (5 % updates), c (read only), u (update only).
    #[arg(long, value_enum, default_value_t = Workload::B)]
    pub workload: Workload,
    /// Keys inserted by the load phase.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Measured operations, all clients together (default 1000000, or no limit with
    /// --duration; with both, the measured phase ends at whichever comes first).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Length of the measured phase, e.g. 60s or 10m (a long-running run; see --ops).
    #[arg(long)]
    pub duration: Option<String>,
    /// Client threads; a list (`1,2,4,8`) runs once per count, one after the other on
    /// the same cluster, and compares them (throughput vs clients, Figure 6).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub clients: Vec<usize>,
    /// The contention experiment (SWARM §7.8): for each count in the list, that many
    /// clients update one single key (the update-only workload, `--keys` ignored).
    #[arg(long, value_delimiter = ',', conflicts_with = "clients")]
    pub contention: Option<Vec<usize>>,
    /// Operations each client keeps in flight.
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
    /// Index unmaps a client's deletes leave to a background task, at most (deletes
    /// return at their tombstone, SWARM §5.3.2); 0: every delete unmaps before it
    /// returns.
    #[arg(long, default_value_t = DEFAULT_DEFERRED_UNMAPS)]
    pub deferred_unmaps: usize,
    /// Bytes per key (YCSB key names are zero-padded to it; at least 23).
    #[arg(long, default_value_t = 24)]
    pub key_size: usize,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Emulated network roundtrip time in ns (0: shared-memory speed; ~1500 is RDMA-like).
    #[arg(long, default_value_t = 0)]
    pub rtt_ns: u64,
    /// Register protocol: swarm (SWARM-KV), abd (DM-ABD) or raw (unreplicated floor).
    #[arg(long, value_enum, default_value_t = System::Swarm)]
    pub system: System,
    /// Unmeasured workload operations before the measured ones.
    #[arg(long, default_value_t = 0)]
    pub warmup_ops: u64,
    /// Skip the cache warm-up (every client reading every key once after the load).
    #[arg(long)]
    pub no_warm_cache: bool,
    /// Seed of the key and operation choices.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Write the report as JSON to this file (an array when several runs are made).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the paper's figures of the run(s) into this directory as PNG files, with
    /// the JSON they were drawn from beside them.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Length of the timeline's intervals, ms (throughput and latency over time).
    #[arg(long, default_value_t = 10)]
    pub timeline_ms: u64,
    /// Write every operation as JSON Lines to this file (for `swarm check`).
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Crash this memory node during the measured phase (with --fail-after-ops).
    #[arg(long, requires = "fail_after_ops")]
    pub fail_node: Option<u16>,
    /// Measured operations (all clients) before --fail-node crashes.
    #[arg(long, requires = "fail_node")]
    pub fail_after_ops: Option<u64>,
    /// What --fail-node does: `stop` (clients stop reaching it, its memory survives),
    /// `lose-memory` (it restarts empty and stays out) or `repair` (then it is rebuilt
    /// online and admitted back); the last two on shared memory only.
    #[arg(long, value_enum, default_value_t = FailMode::Stop, requires = "fail_node")]
    pub fail_mode: FailMode,
    /// With --history, record only the operations on the first N keys (a sample
    /// range whose history is complete and checkable; useful with --workload churn,
    /// which inserts many distinct keys).
    #[arg(long, requires = "history")]
    pub history_keys: Option<u64>,
    /// Shift every key number by N: key k of the run is named like YCSB key N + k
    /// (churn's ever-new keys too). Runs on one cluster whose ranges N .. N + keys
    /// (N .. N + 16 x keys for churn) do not overlap use disjoint keys, so each run's
    /// --history describes its own keys alone. --history-keys counts from N.
    #[arg(long, default_value_t = 0)]
    pub key_offset: u64,
    /// After the measured phase, delete every key the run names (the loaded keys;
    /// for churn, its whole key space), so that the run leaves no key behind. The
    /// deletes are in the history and in the report's `drain` line.
    #[arg(long)]
    pub drain: bool,
}

impl BenchArgs {
    /// The run these flags describe, validated; with a list of client counts, the
    /// first. The progress bar is on unless `--json` is given (it only shows when
    /// stderr is a terminal).
    pub fn to_config(&self) -> Result<BenchConfig, BenchError> {
        self.to_configs()?
            .into_iter()
            .next()
            .ok_or_else(|| BenchError::InvalidConfig("--clients needs at least one count".into()))
    }

    /// Every run these flags describe, validated: one per `--clients` count, or one per
    /// `--contention` count (update-only on one key).
    pub fn to_configs(&self) -> Result<Vec<BenchConfig>, BenchError> {
        let fail = match (self.fail_node, self.fail_after_ops) {
            (Some(node), Some(after_ops)) => Some(FailPlan { node, after_ops }),
            (None, None) => None,
            _ => {
                return Err(BenchError::InvalidConfig(
                    "--fail-node and --fail-after-ops go together".into(),
                ));
            }
        };
        if self.timeline_ms == 0 {
            return Err(BenchError::InvalidConfig(
                "--timeline-ms must be at least 1".into(),
            ));
        }
        let (counts, contention) = match &self.contention {
            Some(counts) => (counts, true),
            None => (&self.clients, false),
        };
        if counts.is_empty() {
            return Err(BenchError::InvalidConfig(
                "give at least one client count".into(),
            ));
        }
        if counts.len() > 1 && self.history.is_some() {
            return Err(BenchError::InvalidConfig(
                "--history records one run: give a single client count".into(),
            ));
        }
        let duration_ns = match &self.duration {
            None => None,
            Some(text) => Some(
                crate::duration::parse_duration_ns(text)
                    .map_err(|e| BenchError::InvalidConfig(format!("--duration: {e}")))?,
            ),
        };
        let ops = match (self.ops, duration_ns) {
            (Some(ops), _) => ops,
            (None, Some(_)) => u64::MAX,
            (None, None) => DEFAULT_OPS,
        };
        counts
            .iter()
            .map(|&clients| {
                let config = BenchConfig {
                    system: self.system,
                    workload: if contention {
                        Workload::U
                    } else {
                        self.workload
                    },
                    keys: if contention { 1 } else { self.keys },
                    ops,
                    duration_ns,
                    clients,
                    inflight: self.inflight,
                    deferred_unmaps: self.deferred_unmaps,
                    key_size: self.key_size,
                    value_size: self.value_size,
                    warmup_ops: self.warmup_ops,
                    warm_cache: !self.no_warm_cache,
                    rtt_ns: self.rtt_ns,
                    seed: self.seed,
                    fail,
                    fail_mode: self.fail_mode,
                    history: self.history.clone(),
                    history_keys: self.history_keys,
                    key_offset: self.key_offset,
                    drain: self.drain,
                    // Quiet with --json (scripted runs) or when stderr is not a terminal.
                    progress: self.json.is_none(),
                    timeline_interval_ns: self.timeline_ms.saturating_mul(1_000_000),
                };
                config.validate()?;
                Ok(config)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn defaults_are_the_papers_setting() {
        let args = parse(&[]).unwrap();
        let config = args.to_config().unwrap();
        let mut expected = BenchConfig::new(System::Swarm, Workload::B);
        expected.progress = true;
        assert_eq!(config, expected);
        assert_eq!(args.json, None);
    }

    #[test]
    fn every_flag_reaches_the_config() {
        let args = parse(&[
            "--workload",
            "a",
            "--keys",
            "10",
            "--ops",
            "20",
            "--clients",
            "3",
            "--inflight",
            "2",
            "--key-size",
            "30",
            "--value-size",
            "100",
            "--rtt-ns",
            "1500",
            "--system",
            "abd",
            "--warmup-ops",
            "5",
            "--no-warm-cache",
            "--seed",
            "9",
            "--json",
            "r.json",
            "--history",
            "h.jsonl",
            "--fail-node",
            "1",
            "--fail-after-ops",
            "7",
            "--key-offset",
            "1000",
            "--drain",
        ])
        .unwrap();
        let c = args.to_config().unwrap();
        assert_eq!(
            (c.system, c.workload, c.keys, c.ops, c.clients, c.inflight),
            (System::Abd, Workload::A, 10, 20, 3, 2)
        );
        assert_eq!(
            (
                c.key_size,
                c.value_size,
                c.rtt_ns,
                c.warmup_ops,
                c.warm_cache,
                c.seed
            ),
            (30, 100, 1500, 5, false, 9)
        );
        assert_eq!(
            c.fail,
            Some(FailPlan {
                node: 1,
                after_ops: 7
            })
        );
        assert_eq!(c.history, Some(PathBuf::from("h.jsonl")));
        assert_eq!((c.key_offset, c.drain), (1000, true));
        assert_eq!(args.json, Some(PathBuf::from("r.json")));
    }

    #[test]
    fn bad_flags_are_refused_with_the_fix() {
        assert!(parse(&["--fail-node", "1"]).is_err());
        assert!(parse(&["--workload", "z"]).is_err());
        assert!(parse(&["--system", "fused"]).is_err());
        assert!(parse(&["--system", "fusee"]).is_ok());
        let refuse = |flags: &[&str]| {
            let mut all = vec![];
            all.extend_from_slice(flags);
            parse(&all).unwrap().to_config().unwrap_err().to_string()
        };
        assert!(refuse(&["--clients", "0"]).contains("--clients"));
        assert!(refuse(&["--inflight", "0"]).contains("--inflight"));
        assert!(refuse(&["--keys", "0"]).contains("--keys"));
        assert!(refuse(&["--key-size", "8"]).contains("--key-size 23"));
        assert!(refuse(&["--value-size", "4"]).contains("--value-size"));
        assert!(refuse(&["--key-offset", &u64::MAX.to_string()]).contains("--key-offset"));
        assert!(
            refuse(&[
                "--system",
                "raw",
                "--fail-node",
                "0",
                "--fail-after-ops",
                "1"
            ])
            .contains("RAW")
        );
    }

    #[test]
    fn value_size_bound_covers_every_tag() {
        let mut config = BenchConfig::new(System::Swarm, Workload::A);
        config.clients = 64;
        // 63 = "3f", up to 100k + 100k + 1M operations = "124f80": "3f.124f80." is 10 B.
        assert_eq!(config.min_value_size(), 10);
        config.value_size = 9;
        assert!(matches!(
            config.validate(),
            Err(BenchError::ValueSizeTooSmall { min: 10, .. })
        ));
        config.value_size = 10;
        config.validate().unwrap();
    }
}
