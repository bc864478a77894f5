//! YCSB on SWARM-KV and its baselines, in one run (SWARM §7.1, Figure 5, Table 2).
//!
//! For each workload (A and B by default) and each system (RAW, DM-ABD, FUSEE, SWARM-KV), a
//! fresh 3-node shared-memory cluster (3 replicas per key) is loaded and measured with
//! `swarm_benches::ycsb::run`; then one table puts the systems side by side: throughput,
//! median and 99th percentile latency, and the roundtrip distribution of gets and
//! updates. Without emulated latency the latencies are those of shared memory; the
//! roundtrip counts are what the paper's Table 2 reports on RDMA.
//!
//! ```text
//! cargo bench -p swarm-benches --bench ycsb
//! SWARM_BENCH_KEYS=100000 SWARM_BENCH_OPS=1000000 SWARM_BENCH_RTT_NS=1500 \
//!     cargo bench -p swarm-benches --bench ycsb          # the paper's size, RDMA-like RTT
//! ```
//!
//! Settings (environment variables): `SWARM_BENCH_KEYS` (10 000), `SWARM_BENCH_OPS`
//! (100 000), `SWARM_BENCH_CLIENTS` (4; a list such as `1,2,4` sweeps), `SWARM_BENCH_INFLIGHT` (1),
//! `SWARM_BENCH_VALUE_SIZE` (64), `SWARM_BENCH_RTT_NS` (0), `SWARM_BENCH_WARMUP_OPS`
//! (0), `SWARM_BENCH_WORKLOADS` (`a,b`), `SWARM_BENCH_SYSTEMS` (`raw,abd,fusee,swarm`),
//! `SWARM_BENCH_JSON` (write every report to this file, as a JSON array),
//! `SWARM_BENCH_PLOT` (draw the paper's figures into this directory, see
//! `swarm_benches::ycsb::plot`), `SWARM_BENCH_CONTENTION` (e.g. `1,2,4,8`: also run the
//! contention experiment, that many clients updating one key, §7.8).
//!
//! Run by `cargo test --benches` (without `--bench`), it does a tiny smoke run
//! instead, so the test suite checks that it works without benchmarking.

use std::error::Error;
use std::process::ExitCode;
use std::str::FromStr;

use clap::ValueEnum;
use swarm_benches::ycsb::{
    BenchConfig, BenchReport, System, TempStore, Workload, comparison_table, run,
};

/// Memory nodes of every cluster, and replicas per key (the paper's setting).
const NODES: u16 = 3;
const REPLICAS: u16 = 3;

fn env_or<T: FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|_| format!("{name}={text:?} is not a valid number")),
    }
}

/// A comma-separated list of numbers, or `default` alone.
fn env_numbers(name: &str, default: usize) -> Result<Vec<usize>, String> {
    match std::env::var(name) {
        Err(_) => Ok(vec![default]),
        Ok(text) => text
            .split(',')
            .map(|item| {
                item.trim()
                    .parse()
                    .map_err(|_| format!("{name}: {item:?} is not a number (in {text:?})"))
            })
            .collect(),
    }
}

fn env_list<T: ValueEnum>(name: &str, default: &str) -> Result<Vec<T>, String> {
    let text = std::env::var(name).unwrap_or_else(|_| default.to_string());
    text.split(',')
        .map(|item| {
            T::from_str(item.trim(), true)
                .map_err(|_| format!("{name}: unknown entry {item:?} (in {text:?})"))
        })
        .collect()
}

fn main() -> ExitCode {
    match bench() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("some operations failed (see the error counts above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ycsb bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every configuration; `Ok(false)` if any operation failed.
fn bench() -> Result<bool, Box<dyn Error>> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: smoke run.
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let (default_keys, default_ops) = if benchmarking {
        (10_000, 100_000)
    } else {
        (200, 2_000)
    };
    let workloads: Vec<Workload> = env_list("SWARM_BENCH_WORKLOADS", "a,b")?;
    let client_counts: Vec<usize> = env_numbers("SWARM_BENCH_CLIENTS", 4)?;
    let systems: Vec<System> = env_list("SWARM_BENCH_SYSTEMS", "raw,abd,fusee,swarm")?;
    let mut reports: Vec<BenchReport> = Vec::new();
    for &workload in &workloads {
        for &clients in &client_counts {
            for &system in &systems {
                let mut config = BenchConfig::new(system, workload);
                config.keys = env_or("SWARM_BENCH_KEYS", default_keys)?;
                config.ops = env_or("SWARM_BENCH_OPS", default_ops)?;
                config.clients = clients;
                config.inflight = env_or("SWARM_BENCH_INFLIGHT", 1)?;
                config.value_size = env_or("SWARM_BENCH_VALUE_SIZE", 64)?;
                config.rtt_ns = env_or("SWARM_BENCH_RTT_NS", 0)?;
                config.warmup_ops = env_or("SWARM_BENCH_WARMUP_OPS", 0)?;
                config.progress = benchmarking;
                config.validate()?;
                eprintln!(
                    "running {system} {workload}: {} keys, {} ops, {} clients",
                    config.keys, config.ops, config.clients
                );
                let store = TempStore::new(&config, NODES, REPLICAS)?;
                let report = run(store.store(), &config)?;
                eprintln!("{report}\n");
                reports.push(report);
            }
        }
    }
    // The contention experiment (SWARM §7.8): N clients updating one key.
    if std::env::var("SWARM_BENCH_CONTENTION").is_ok() {
        for clients in env_numbers("SWARM_BENCH_CONTENTION", 4)? {
            for &system in &systems {
                let mut config = BenchConfig::new(system, Workload::U);
                config.keys = 1;
                config.clients = clients;
                config.ops = env_or("SWARM_BENCH_OPS", default_ops)?;
                config.rtt_ns = env_or("SWARM_BENCH_RTT_NS", 0)?;
                config.progress = benchmarking;
                config.validate()?;
                eprintln!("running {system} contention: {clients} clients on one key");
                let store = TempStore::new(&config, NODES, REPLICAS)?;
                let report = run(store.store(), &config)?;
                eprintln!("{report}\n");
                reports.push(report);
            }
        }
    }
    println!("{}", comparison_table(&reports));
    println!(
        "paper (RDMA, YCSB B, 4 clients): get p50 RAW 1.9µs, SWARM-KV 2.4µs, DM-ABD 4.3µs; \
         update p50 RAW 1.6µs, SWARM-KV 3.1µs, DM-ABD 4.9µs, FUSEE 8.5µs;\n\
         roundtrips (Table 2, common case): RAW 1/1, SWARM-KV 1/1, DM-ABD 2/2, FUSEE 1-2/4 (get/update)"
    );
    if let Ok(dir) = std::env::var("SWARM_BENCH_PLOT") {
        let written =
            swarm_benches::ycsb::plot::write_figures(&reports, std::path::Path::new(&dir))?;
        eprintln!("{} figures written to {dir}", written.len());
    }
    if let Ok(path) = std::env::var("SWARM_BENCH_JSON") {
        std::fs::write(&path, serde_json::to_string_pretty(&reports)?)
            .map_err(|e| format!("cannot write the reports to {path}: {e}"))?;
        eprintln!("reports written to {path}");
    }
    Ok(reports.iter().all(|r| r.total_errors() == 0))
}
