//! `swarm-shm-demo`: creates a shared-memory cluster (emulated CXL memory nodes) and
//! exercises the fabric: replicated writes and reads that wait for a majority, an
//! ordered write-then-CAS pipeline, CAS from several threads, a crashed node, and
//! per-roundtrip timings.
//!
//! The cluster is removed at the end unless `--keep` is given. With `--attach` the
//! demo opens an existing cluster instead (for example one kept by another demo, to
//! run several processes on it at once) and leaves it in place.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use swarm_core::header::HEADER_SIZE;
use swarm_core::{
    Batch, Completion, Fabric, FabricError, NodeId, Op, OpStats, Roundtrip, block_on,
};
use swarm_shm::{CreateOptions, EmulatedFabric, ScratchDir, ShmCluster, node_file_name};

/// Creates a SWARM shared-memory cluster and exercises it through the fabric.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Cluster directory (default: a fresh directory under /dev/shm or the temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Open the existing cluster in --dir instead of creating one; it is kept.
    #[arg(long, requires = "dir", conflicts_with = "overwrite")]
    attach: bool,
    /// Replace an existing cluster in --dir.
    #[arg(long)]
    overwrite: bool,
    /// Leave the cluster in place at the end.
    #[arg(long)]
    keep: bool,
    /// Number of memory nodes to create.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    nodes: u16,
    /// Bytes per memory node to create, header included (a multiple of 8).
    #[arg(long, default_value_t = 1 << 20)]
    node_bytes: u64,
    /// Emulated roundtrip time in ns (e.g. 300 for CXL-like, 1500 for RDMA-like).
    #[arg(long, default_value_t = 0)]
    rtt_ns: u64,
    /// Roundtrips per timing measurement, and CAS increments per thread.
    #[arg(long, default_value_t = 20_000)]
    ops: u32,
    /// Client threads incrementing a shared word.
    #[arg(long, default_value_t = 2)]
    threads: u32,
}

/// Node 0's word from which each demo run claims a slot with CAS.
const SLOT_COUNTER: u64 = HEADER_SIZE;
/// Node 0's word that every client thread of every run increments.
const SHARED_COUNTER: u64 = HEADER_SIZE + 8;
/// Per-run slots start here, on every node: a value, then a version word.
const SLOTS: u64 = HEADER_SIZE + 4096;
const SLOT_LEN: u64 = 128;
const VALUE_LEN: u32 = 64;

fn main() -> ExitCode {
    match demo(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: &Args) -> Result<()> {
    let (dir, scratch) = match &args.dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let scratch =
                ScratchDir::new("swarm-shm-demo").context("cannot create a scratch directory")?;
            (scratch.path().to_path_buf(), Some(scratch))
        }
    };
    if !args.attach {
        let options = CreateOptions {
            overwrite: args.overwrite,
            ..CreateOptions::default()
        };
        let created = ShmCluster::create_with(&dir, args.nodes, args.node_bytes, &options)?;
        println!(
            "created {} memory nodes of {} bytes in {} (cluster id {:#018x}, tick {} ns)",
            created.node_count(),
            args.node_bytes,
            dir.display(),
            created.cluster_id(),
            created.tick_ns()
        );
    }

    let outcome = run(&dir, args);
    if args.keep || args.attach {
        scratch.map(ScratchDir::keep);
        if outcome.is_ok() {
            println!("the cluster stays in {}", dir.display());
        }
    } else {
        // A scratch directory also goes away with its content when dropped.
        for i in 0..args.nodes {
            let _ = std::fs::remove_file(dir.join(node_file_name(i)));
        }
        println!("removed the cluster from {}", dir.display());
    }
    outcome
}

fn run(dir: &Path, args: &Args) -> Result<()> {
    // Open the cluster as any client process does: every node file is validated, and
    // a minority of unusable ones is reported and left out.
    let cluster = Arc::new(ShmCluster::open(dir)?);
    for absent in cluster.absent() {
        eprintln!(
            "warning: memory node {} is unusable and left out (the others serve): {}",
            absent.node.0, absent.error
        );
    }
    let fabric = cluster.client_with(args.rtt_ns);
    let n = fabric.node_count();
    let majority = n / 2 + 1;
    println!(
        "opened and validated {n} node files of cluster {:#018x}; quorum {majority} of {n}",
        cluster.cluster_id()
    );

    // 1. Claim a slot of our own with CAS, so that demos attached to the same cluster
    //    do not disturb each other's checks.
    let node0_size = cluster.header().size;
    let slot = increment(&fabric, SLOT_COUNTER, 0)?.0 - 1;
    let value_addr = SLOTS + slot * SLOT_LEN;
    let version_addr = value_addr + u64::from(VALUE_LEN);
    ensure!(
        value_addr + SLOT_LEN <= node0_size,
        "the cluster has no room for another demo slot: recreate it"
    );
    println!("claimed slot {slot} with a CAS on node 0");

    // 2. A replicated write: one batch per node in one roundtrip, a majority acks.
    let value: Vec<u8> = (0..VALUE_LEN as u8).map(|b| b ^ slot as u8).collect();
    let stats = OpStats::new();
    let acks = on_nodes(&fabric, &stats, n, majority, |_| {
        Batch::write(value_addr, value.clone())
    })?;
    println!(
        "wrote {VALUE_LEN} bytes to {n} nodes, {} acknowledged: {} roundtrip",
        acks.len(),
        stats.roundtrips()
    );

    // 3. Read it back from a majority.
    let stats = OpStats::new();
    let replies = on_nodes(&fabric, &stats, n, majority, |_| {
        Batch::read(value_addr, VALUE_LEN)
    })?;
    for (node, completion) in &replies {
        ensure!(
            completion.read(0) == Some(&value[..]),
            "node {node} returned other bytes"
        );
    }
    println!(
        "read it back from {} nodes: {} roundtrip",
        replies.len(),
        stats.roundtrips()
    );

    // 4. An ordered pipeline: a new value, then its version word by CAS, in one batch
    //    per node; whoever sees version 1 is guaranteed to see the new value.
    let stats = OpStats::new();
    let next: Vec<u8> = value.iter().map(|b| b.wrapping_add(1)).collect();
    let replies = on_nodes(&fabric, &stats, n, majority, |_| {
        let mut batch = Batch::new();
        let _ = batch.push(Op::Write {
            addr: value_addr,
            data: next.clone().into(),
        });
        let _ = batch.push(Op::Cas {
            addr: version_addr,
            expected: 0,
            new: 1,
        });
        batch
    })?;
    ensure!(
        replies.iter().all(|(_, c)| c.cas(1) == Some(0)),
        "the version word of our slot was not 0"
    );
    println!(
        "pipelined write + CAS on {} nodes: {} roundtrip",
        replies.len(),
        stats.roundtrips()
    );

    // 5. Several client threads, one fabric handle each, incrementing one word.
    let per_thread = u64::from(args.ops);
    let before = read_u64(&fabric, SHARED_COUNTER)?;
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads)
        .map(|_| {
            let fabric = cluster.client_with(args.rtt_ns);
            std::thread::spawn(move || -> Result<u64> {
                let (mut value, mut retries) = (before, 0);
                for _ in 0..per_thread {
                    let (new, failed) = increment(&fabric, SHARED_COUNTER, value)?;
                    (value, retries) = (new, retries + failed);
                }
                Ok(retries)
            })
        })
        .collect();
    let mut retries = 0;
    for thread in threads {
        retries += thread
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    let elapsed = start.elapsed();
    let ours = per_thread * u64::from(args.threads);
    let after = read_u64(&fabric, SHARED_COUNTER)?;
    // Other processes attached to the cluster may have incremented it too.
    ensure!(
        after >= before + ours,
        "the counter went from {before} to {after}: increments were lost"
    );
    println!(
        "{} threads × {per_thread} CAS increments on node 0: counter {before} -> {after} \
         ({retries} retries, {:.1} ms)",
        args.threads,
        elapsed.as_secs_f64() * 1e3
    );

    // 6. A crashed minority does not block a majority; a crashed majority does.
    if n >= 3 {
        let client = cluster.client_with(args.rtt_ns);
        client.fail_node(NodeId(n as u16 - 1));
        let stats = OpStats::new();
        on_nodes(&client, &stats, n, majority, |_| {
            Batch::read(value_addr, VALUE_LEN)
        })?;
        println!(
            "node {} crashed for a client: a majority read still takes {} roundtrip",
            n - 1,
            stats.roundtrips()
        );
        match on_nodes(&client, &stats, n, n, |_| {
            Batch::read(value_addr, VALUE_LEN)
        }) {
            Err(error) if error.downcast_ref() == Some(&FabricError::Stalled) => {
                println!("waiting for all {n} nodes instead reports: {error}");
            }
            other => bail!("waiting on a crashed node should stall, got {other:?}"),
        }
    }

    // 7. Timings per roundtrip.
    println!(
        "latency per roundtrip over {} roundtrips (emulated rtt {} ns):",
        args.ops, args.rtt_ns
    );
    time("  read 64 B from a majority", args.ops, || {
        on_nodes(&fabric, &OpStats::new(), n, majority, |_| {
            Batch::read(value_addr, VALUE_LEN)
        })
        .map(drop)
    })?;
    time("  write 64 B to a majority ", args.ops, || {
        on_nodes(&fabric, &OpStats::new(), n, majority, |_| {
            Batch::write(value_addr, next.clone())
        })
        .map(drop)
    })?;
    let mut version = 1;
    time("  CAS on one node          ", args.ops, || {
        let replies = on_nodes(&fabric, &OpStats::new(), 1, 1, |_| {
            Batch::cas(version_addr, version, version + 1)
        })?;
        ensure!(
            replies[0].1.cas(0) == Some(version),
            "our version word moved"
        );
        version += 1;
        Ok(())
    })?;
    Ok(())
}

/// One roundtrip: `batch(node)` posted to nodes `0..nodes`, waiting for `k` replies.
fn on_nodes(
    fabric: &EmulatedFabric,
    stats: &OpStats,
    nodes: usize,
    k: usize,
    batch: impl Fn(NodeId) -> Batch,
) -> Result<Vec<(NodeId, Completion)>> {
    let replies = block_on(fabric, async {
        let mut rt = Roundtrip::start(fabric, stats);
        for i in 0..nodes {
            let node = NodeId(i as u16);
            rt.post(node, batch(node))?;
        }
        rt.wait(k).await?;
        Ok::<_, FabricError>(rt.replies().to_vec())
    })?;
    Ok(replies)
}

fn read_u64(fabric: &EmulatedFabric, addr: u64) -> Result<u64> {
    let replies = on_nodes(fabric, &OpStats::new(), 1, 1, |_| Batch::read(addr, 8))?;
    let bytes = replies[0].1.read(0).context("the read returned no bytes")?;
    Ok(u64::from_le_bytes(bytes.try_into()?))
}

/// Adds 1 to the word at `addr` on node 0 with CAS, first expecting `guess` and then
/// whatever the failed CAS found; returns the new value and the number of retries.
fn increment(fabric: &EmulatedFabric, addr: u64, guess: u64) -> Result<(u64, u64)> {
    let (mut expected, mut retries) = (guess, 0);
    loop {
        let replies = on_nodes(fabric, &OpStats::new(), 1, 1, |_| {
            Batch::cas(addr, expected, expected + 1)
        })?;
        let previous = replies[0].1.cas(0).context("the CAS returned no value")?;
        if previous == expected {
            return Ok((expected + 1, retries));
        }
        expected = previous;
        retries += 1;
    }
}

/// Runs `op` `count` times and prints mean, median and 99th percentile.
fn time(label: &str, count: u32, mut op: impl FnMut() -> Result<()>) -> Result<()> {
    let mut samples = Vec::with_capacity(count as usize);
    for _ in 0..count.max(1) {
        let start = Instant::now();
        op()?;
        samples.push(start.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    let mean = samples.iter().sum::<u64>() / samples.len() as u64;
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{label}: mean {mean:>6} ns   p50 {:>6} ns   p99 {:>6} ns",
        at(0.5),
        at(0.99)
    );
    Ok(())
}
