//! `swarm-shm-demo`: creates a shared-memory cluster (emulated CXL memory nodes) and
//! exercises the fabric: replicated writes and reads waiting for a majority, an
//! ordered write-then-CAS pipeline, CAS from several threads, a crashed node, and
//! per-roundtrip timings. The cluster is removed at the end unless `--keep` is given.

use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use swarm_core::header::HEADER_SIZE;
use swarm_core::{
    Batch, Completion, Fabric, FabricError, NodeId, Op, OpStats, Roundtrip, block_on,
};
use swarm_shm::{CreateOptions, ScratchDir, ShmCluster, ShmFabric, node_file_name};

/// Creates a SWARM shared-memory cluster and exercises it through the fabric.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Cluster directory (default: a fresh directory under /dev/shm or the temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Number of memory nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    nodes: u16,
    /// Bytes per memory node, header included (a multiple of 8).
    #[arg(long, default_value_t = 1 << 20)]
    node_bytes: u64,
    /// Emulated roundtrip time in ns (e.g. 300 for CXL-like, 1500 for RDMA-like).
    #[arg(long, default_value_t = 0)]
    rtt_ns: u64,
    /// Roundtrips per timing measurement.
    #[arg(long, default_value_t = 20_000)]
    ops: u32,
    /// Client threads incrementing a shared word.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Replace an existing cluster in --dir.
    #[arg(long)]
    overwrite: bool,
    /// Leave the cluster in place at the end.
    #[arg(long)]
    keep: bool,
}

/// Data addresses used by the demo (node data starts after the header page).
const VALUE: u64 = HEADER_SIZE;
const VERSION: u64 = HEADER_SIZE + 64;
const COUNTER: u64 = HEADER_SIZE + 128;
const VALUE_LEN: u32 = 64;

fn main() -> Result<()> {
    let args = Args::parse();
    let (dir, scratch) = match &args.dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let scratch =
                ScratchDir::new("swarm-shm-demo").context("cannot create a scratch directory")?;
            (scratch.path().to_path_buf(), Some(scratch))
        }
    };
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
    drop(created);

    let outcome = run(&dir, &args);
    if args.keep {
        scratch.map(ScratchDir::keep);
        println!("kept the cluster in {}", dir.display());
    } else {
        // A scratch directory goes away with its content when dropped.
        remove_cluster(&dir, args.nodes);
    }
    outcome
}

fn remove_cluster(dir: &Path, nodes: u16) {
    for i in 0..nodes {
        let _ = std::fs::remove_file(dir.join(node_file_name(i)));
    }
    println!("removed the node files from {}", dir.display());
}

fn run(dir: &Path, args: &Args) -> Result<()> {
    // Open it again, as any other client process would: every header is validated.
    let cluster = Arc::new(ShmCluster::open(dir)?);
    println!("opened and validated {} node files", cluster.node_count());
    let fabric = cluster.client().with_rtt_ns(args.rtt_ns);
    let n = fabric.node_count();
    let majority = n / 2 + 1;

    // 1. A replicated write: one batch per node, wait for a majority.
    let value: Vec<u8> = (0..VALUE_LEN as u8).collect();
    let stats = OpStats::new();
    on_nodes(&fabric, &stats, n, majority, |_| {
        Batch::write(VALUE, value.clone())
    })?;
    println!(
        "wrote {VALUE_LEN} bytes to {n} nodes, {majority} acknowledged: {} roundtrip",
        stats.roundtrips()
    );

    // 2. Read it back from a majority.
    let stats = OpStats::new();
    let replies = on_nodes(&fabric, &stats, n, majority, |_| {
        Batch::read(VALUE, VALUE_LEN)
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

    // 3. An ordered pipeline: write a new value, then CAS its version word, in one batch.
    let stats = OpStats::new();
    let next: Vec<u8> = value.iter().map(|b| b.wrapping_add(1)).collect();
    let replies = on_nodes(&fabric, &stats, n, majority, |_| {
        let mut batch = Batch::new();
        let _ = batch.push(Op::Write {
            addr: VALUE,
            data: next.clone(),
        });
        let _ = batch.push(Op::Cas {
            addr: VERSION,
            expected: 0,
            new: 1,
        });
        batch
    })?;
    ensure!(
        replies.iter().all(|(_, c)| c.cas(1) == Some(0)),
        "the version CAS did not find 0"
    );
    println!(
        "pipelined write + CAS on {} nodes: {} roundtrip",
        replies.len(),
        stats.roundtrips()
    );

    // 4. Several client threads, one fabric handle each, incrementing one word.
    let per_thread = u64::from(args.ops);
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads)
        .map(|_| {
            let cluster = Arc::clone(&cluster);
            let rtt = args.rtt_ns;
            std::thread::spawn(move || increments(&cluster.client().with_rtt_ns(rtt), per_thread))
        })
        .collect();
    let mut retries = 0;
    for thread in threads {
        retries += thread
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    let total = read_u64(&fabric, COUNTER)?;
    ensure!(
        total == per_thread * u64::from(args.threads),
        "the counter is {total}, increments were lost"
    );
    println!(
        "{} threads × {per_thread} CAS increments on node 0: counter = {total} ({retries} retries, {:.1} ms)",
        args.threads,
        start.elapsed().as_secs_f64() * 1e3
    );

    // 5. A crashed minority does not block a majority; a crashed majority does.
    if n >= 3 {
        let client = cluster.client().with_rtt_ns(args.rtt_ns);
        client.fail_node(NodeId(n as u16 - 1));
        let stats = OpStats::new();
        on_nodes(&client, &stats, n, majority, |_| {
            Batch::read(VALUE, VALUE_LEN)
        })?;
        println!(
            "node {} crashed for a client: a majority read still takes {} roundtrip",
            n - 1,
            stats.roundtrips()
        );
        match on_nodes(&client, &stats, n, n, |_| Batch::read(VALUE, VALUE_LEN)) {
            Err(error) if error.downcast_ref() == Some(&FabricError::Stalled) => {
                println!("waiting for all {n} nodes instead reports: {error}");
            }
            other => bail!("waiting on a crashed node should stall, got {other:?}"),
        }
    }

    // 6. Timings per roundtrip.
    println!(
        "latency per roundtrip over {} roundtrips (rtt {} ns):",
        args.ops, args.rtt_ns
    );
    time("  read 64 B from a majority", args.ops, || {
        on_nodes(&fabric, &OpStats::new(), n, majority, |_| {
            Batch::read(VALUE, VALUE_LEN)
        })
        .map(drop)
    })?;
    time("  write 64 B to a majority ", args.ops, || {
        on_nodes(&fabric, &OpStats::new(), n, majority, |_| {
            Batch::write(VALUE, value.clone())
        })
        .map(drop)
    })?;
    let mut version = 1;
    time("  CAS on one node          ", args.ops, || {
        let stats = OpStats::new();
        let replies = on_nodes(&fabric, &stats, 1, 1, |_| {
            Batch::cas(VERSION, version, version + 1)
        })?;
        ensure!(
            replies[0].1.cas(0) == Some(version),
            "the version word moved under us"
        );
        version += 1;
        Ok(())
    })?;
    Ok(())
}

/// One roundtrip: `batch(node)` posted to nodes `0..nodes`, waiting for `k` replies.
fn on_nodes(
    fabric: &ShmFabric,
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
    })??;
    Ok(replies)
}

fn read_u64(fabric: &ShmFabric, addr: u64) -> Result<u64> {
    let replies = on_nodes(fabric, &OpStats::new(), 1, 1, |_| Batch::read(addr, 8))?;
    let bytes = replies[0].1.read(0).context("read returned no bytes")?;
    Ok(u64::from_le_bytes(bytes.try_into()?))
}

/// `count` CAS increments of the counter on node 0; returns the number of retries.
fn increments(fabric: &ShmFabric, count: u64) -> Result<u64> {
    let (mut expected, mut retries) = (0, 0);
    for _ in 0..count {
        loop {
            let replies = on_nodes(fabric, &OpStats::new(), 1, 1, |_| {
                Batch::cas(COUNTER, expected, expected + 1)
            })?;
            let previous = replies[0].1.cas(0).context("CAS returned no value")?;
            if previous == expected {
                expected += 1;
                break;
            }
            expected = previous;
            retries += 1;
        }
    }
    Ok(retries)
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
