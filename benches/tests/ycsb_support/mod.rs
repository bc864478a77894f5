//! Shared fixtures of the YCSB harness tests: small runs on throw-away 3-node
//! clusters, and the linearizability check of their histories.

#![allow(dead_code)]

use std::path::Path;

use swarm_benches::ycsb::{BenchConfig, BenchReport, OpType, System, TempStore, Workload, run};
use swarm_checker::History;

/// The seed of every run: `SWARM_TEST_SEED` if set, else a fixed one.
pub fn seed() -> u64 {
    std::env::var("SWARM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7E57)
}

/// A small run: `keys` keys, `ops` measured operations, `clients` clients.
pub fn small(
    system: System,
    workload: Workload,
    keys: u64,
    ops: u64,
    clients: usize,
) -> BenchConfig {
    let mut config = BenchConfig::new(system, workload);
    config.keys = keys;
    config.ops = ops;
    config.clients = clients;
    config.seed = seed();
    config
}

/// Runs `config` on a fresh 3-node cluster with 3 replicas per key.
pub fn run_fresh(config: &BenchConfig) -> BenchReport {
    let store = TempStore::new(config, 3, 3).expect("temporary cluster");
    run(store.store(), config).unwrap_or_else(|e| panic!("seed {}: run failed: {e}", config.seed))
}

/// Asserts the run had no failed operation and every key it looked for was there.
pub fn assert_clean(report: &BenchReport) {
    assert_eq!(
        report.errors, 0,
        "seed {}: failed operations:\n{report}",
        report.seed
    );
    for (op, r) in &report.ops_by_type {
        assert_eq!(
            r.misses, 0,
            "seed {}: {op}s missed loaded keys:\n{report}",
            report.seed
        );
    }
    let completed: u64 = report.ops_by_type.values().map(|r| r.count).sum();
    assert_eq!(completed, report.ops, "seed {}:\n{report}", report.seed);
    assert_eq!(
        report.load.ops, report.keys,
        "seed {}:\n{report}",
        report.seed
    );
    assert!(report.op(OpType::Insert).is_none());
}

/// Parses the history at `path` and asserts it is linearizable and complete.
pub fn assert_linearizable(path: &Path, report: &BenchReport) {
    let file = std::fs::File::open(path).expect("history written");
    let history = History::from_jsonl(std::io::BufReader::new(file)).expect("history parses");
    let warm = if report.warm_cache {
        report.keys * report.clients as u64
    } else {
        0
    };
    let expected = report.keys + warm + report.warmup_ops + report.ops;
    assert_eq!(
        history.len() as u64,
        expected,
        "seed {}: operations in the history",
        report.seed
    );
    // Each client (in-flight slot) runs one operation at a time, with real intervals:
    // if the recorded times were loose, the check below would prove little.
    let mut by_client = std::collections::BTreeMap::<u64, Vec<(u64, u64)>>::new();
    for op in history.operations() {
        let end = op
            .op
            .end
            .unwrap_or_else(|| panic!("seed {}: unfinished operation {op}", report.seed));
        assert!(
            op.op.start < end,
            "seed {}: empty interval {op}",
            report.seed
        );
        by_client
            .entry(op.op.client)
            .or_default()
            .push((op.op.start, end));
    }
    for (client, mut intervals) in by_client {
        intervals.sort_unstable();
        for pair in intervals.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "seed {}: client {client} overlaps itself: {pair:?}",
                report.seed
            );
        }
    }
    let what = format!("seed {}: history {}", report.seed, path.display());
    swarm_checker::assert_linearizable_keeping(&history, &what, None);
}
