//! `swarm-memnode`: try the RDMA transport before the `swarm` command exists.
//!
//! ```text
//! # once, anywhere: a cluster file and a token file for three memory nodes
//! cargo run --release -p swarm-cli --features rdma --bin swarm-memnode -- \
//!     init --rdma 10.0.0.1:7471,10.0.0.2:7471,10.0.0.3:7471 --dir cluster
//! # on each memory-node host (with its own address), after copying `cluster/`
//! cargo run --release -p swarm-cli --features rdma --bin swarm-memnode -- \
//!     run --listen 10.0.0.1:7471 --size 4GiB --cluster cluster/swarm-cluster.conf
//! # from a client host: connect, validate the headers, time one-sided reads
//! cargo run --release -p swarm-cli --features rdma --bin swarm-memnode -- \
//!     check --cluster cluster/swarm-cluster.conf
//! ```
//!
//! `swarm memnode`, `swarm init` and `swarm --rdma` call the same library functions
//! (see swarm-rdma's crate docs). It logs as `swarm` does (`RUST_LOG`, default:
//! warnings and errors, on standard error).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use swarm_cli::MemnodeArgs;
use swarm_core::fabric::{Batch, NodeId};
use swarm_core::header::{ENCODED_LEN, NodeHeader};
use swarm_core::{Fabric, block_on};
use swarm_core::{OpStats, Roundtrip};
use swarm_rdma::auth::Token;
use swarm_rdma::config::{ClusterConfig, PathConfig, parse_nodes};
use swarm_rdma::{RdmaCluster, RdmaConfig};

#[derive(Parser)]
#[command(about = "SWARM memory node over RDMA (stand-in for `swarm memnode`)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a cluster file and a fresh token file.
    Init {
        /// Memory nodes, in node-id order: HOST:PORT,HOST:PORT,...
        #[arg(long)]
        rdma: String,
        /// Directory for `swarm-cluster.conf` and `swarm.token`.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Timestamp tick length in nanoseconds.
        #[arg(long, default_value_t = 1000)]
        tick_ns: u64,
    },
    /// Serve memory until killed.
    Run(MemnodeArgs),
    /// Connect to every memory node, check its header, and time 8-byte reads.
    Check {
        /// The cluster file written by `init`.
        #[arg(long, default_value = "swarm-cluster.conf")]
        cluster: PathBuf,
        /// RDMA device (default: the first one).
        #[arg(long)]
        device: Option<String>,
        /// Reads per node to time.
        #[arg(long, default_value_t = 10_000)]
        reads: usize,
    },
}

fn main() -> ExitCode {
    swarm_cli::init_logging();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Init { rdma, dir, tick_ns } => init(&rdma, &dir, tick_ns),
        Command::Run(args) => Ok(swarm_rdma::memnode::serve(&args.options())?),
        Command::Check {
            cluster,
            device,
            reads,
        } => check(&ClusterConfig::load(&cluster)?, device, reads),
    }
}

fn init(rdma: &str, dir: &std::path::Path, tick_ns: u64) -> Result<()> {
    let nodes = parse_nodes(rdma)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let token = Token::generate()?;
    let token_path = dir.join("swarm.token");
    token.write(&token_path, false)?;
    let id = swarm_rdma::auth::random_bytes::<8>()?;
    let epoch_unix_ns = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos())?;
    let cluster = ClusterConfig {
        nodes,
        cluster_id: u64::from_le_bytes(id),
        epoch_unix_ns,
        tick_ns,
        token_file: PathBuf::from("swarm.token"),
        path: PathConfig::default(),
    };
    let cluster_path = dir.join("swarm-cluster.conf");
    std::fs::write(&cluster_path, cluster.render())
        .with_context(|| format!("writing {}", cluster_path.display()))?;
    println!(
        "wrote {} and {} (token fingerprint {})",
        cluster_path.display(),
        token_path.display(),
        token.fingerprint()
    );
    Ok(())
}

fn check(cluster: &ClusterConfig, device: Option<String>, reads: usize) -> Result<()> {
    let mut config = RdmaConfig::from_cluster(cluster)?;
    config.device = device;
    let rdma = RdmaCluster::open(config)?;
    let fabric = rdma.client()?;
    println!("device {}", rdma.device().name());
    for node in 0..fabric.node_count() {
        let id = NodeId(node as u16);
        let Some(expected) = fabric.headers()[node] else {
            println!("node {node} ({}): unreachable", cluster.nodes[node]);
            continue;
        };
        // The header, read back with a one-sided READ, must match the bootstrap's.
        let ticket = fabric.post(id, Batch::read(0, ENCODED_LEN as u32));
        let completion = block_on(&fabric, async {
            std::future::poll_fn(|_| fabric.poll(ticket)).await
        })?;
        let header = NodeHeader::decode(completion.read(0).unwrap_or_default(), expected.size)?;
        if header != expected {
            bail!("node {node}: the header read over RDMA differs from the bootstrap's");
        }
        let mut micros = Vec::with_capacity(reads);
        let stats = OpStats::new();
        for _ in 0..reads {
            let start = Instant::now();
            block_on(&fabric, async {
                let mut rt = Roundtrip::start(&fabric, &stats);
                rt.post(id, Batch::read(0, 8))?;
                rt.wait(1).await
            })?;
            micros.push(start.elapsed().as_secs_f64() * 1e6);
        }
        micros.sort_by(f64::total_cmp);
        let median = micros.get(micros.len() / 2).copied().unwrap_or(f64::NAN);
        let p99 = micros
            .get(micros.len() * 99 / 100)
            .copied()
            .unwrap_or(f64::NAN);
        println!(
            "node {node} ({}): header ok, {} bytes; {reads} 8-byte reads: median {median:.2} µs, p99 {p99:.2} µs",
            cluster.nodes[node], header.size
        );
    }
    Ok(())
}
