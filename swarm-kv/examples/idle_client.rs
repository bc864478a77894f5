//! One RDMA client that idles longer than its lease, then keeps working: the check
//! behind the soft-RoCE phase's idle step (`scripts/softroce/test.sh`), and an example
//! of a long-lived application holding one client.
//!
//! ```text
//! cargo run -p swarm-kv --features rdma --example idle_client -- CLUSTER_FILE IDLE_SECS
//! ```
//!
//! Opens the cluster, writes `idle-before`, sleeps `IDLE_SECS` without any operation
//! (the memory nodes' lease watch cuts the client off once its lease word has not
//! changed for the watch's stall time), then writes and reads `idle-after` and prints
//! `idle client: ...` on success. The client's own log (`RUST_LOG`, default `info`
//! for swarm_kv and swarm_rdma) shows the cut and the revival. Exits non-zero if any
//! operation fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use swarm_core::OpStats;
use swarm_kv::{RdmaStore, Store};
use swarm_rdma::RdmaConfig;
use swarm_rdma::config::ClusterConfig;

fn main() -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(
        std::env::var("RUST_LOG").unwrap_or_else(|_| "swarm_kv=info,swarm_rdma=info".into()),
    );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let (Some(file), Some(idle)) = (args.next(), args.next()) else {
        bail!("usage: idle_client CLUSTER_FILE IDLE_SECS");
    };
    let idle: f64 = idle
        .parse()
        .context("IDLE_SECS must be a number of seconds")?;
    let idle = Duration::try_from_secs_f64(idle).context("IDLE_SECS must be a positive number")?;
    let file = PathBuf::from(file);
    let cluster = ClusterConfig::load(&file)
        .with_context(|| format!("cannot load the cluster file {}", file.display()))?;
    let store = RdmaStore::open(RdmaConfig::from_cluster(&cluster)?)?;
    let client = store.client()?;
    let fabric = client.fabric();
    swarm_core::block_on(fabric, client.insert(b"idle-before", b"1", &OpStats::new()))?;
    let renewals = client.lease_renewals();
    eprintln!("idle client: writer {}, idling {idle:?}", client.writer());
    std::thread::sleep(idle);
    let started = Instant::now();
    swarm_core::block_on(
        fabric,
        client.insert(b"idle-after", b"yes", &OpStats::new()),
    )
    .context("the first operation after the idle period failed")?;
    let first_op = started.elapsed();
    let got = swarm_core::block_on(fabric, client.get(b"idle-after", &OpStats::new()))?;
    if got.as_deref() != Some(b"yes".as_slice()) {
        bail!("read back {got:?} after the idle period, expected \"yes\"");
    }
    println!(
        "idle client: put and get after {idle:?} idle succeeded (first operation took {} ms; \
         {} lease renewals since the idle period began)",
        first_op.as_millis(),
        client.lease_renewals() - renewals
    );
    Ok(())
}
