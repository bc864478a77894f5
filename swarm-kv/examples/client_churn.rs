//! One process that keeps making clients of one open store, each doing a put and a
//! get, with the history recorded: the check behind the soft-RoCE phase's restart
//! and flood steps (`scripts/softroce/test.sh`, issue 47).
//!
//! ```text
//! cargo run -p swarm-kv --features rdma --example client_churn -- CLUSTER_FILE ROUNDS HISTORY [PREFIX]
//! ```
//!
//! Opens the cluster once, then per round makes a new client (`Store::client`: a
//! fresh bootstrap to every node), inserts `{PREFIX}-{round % 4}` (PREFIX: `churn`
//! unless given; a run on a cluster that an earlier run wrote to needs keys of its
//! own, since the checker starts every key absent) and reads it back, recording
//! both operations (one that fails as crashed: it may still take effect); a client
//! that cannot be made counts as a failed round. Prints `round R: ...` per round on
//! standard error (with the nodes each client left out), writes the history to
//! HISTORY (JSON Lines, for `swarm check`) and prints `client churn: ...` with the
//! counts. Exits non-zero only if the
//! cluster cannot be opened or the history not written.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use swarm_checker::{OpKind, Recorder};
use swarm_core::{Fabric, NodeId, OpStats};
use swarm_kv::{RdmaStore, Store};
use swarm_rdma::RdmaConfig;
use swarm_rdma::config::ClusterConfig;
use swarm_rdma::fabric::NodeStatus;

fn main() -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(
        std::env::var("RUST_LOG").unwrap_or_else(|_| "swarm_kv=info,swarm_rdma=info".into()),
    );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let (Some(file), Some(rounds), Some(history)) = (args.next(), args.next(), args.next()) else {
        bail!("usage: client_churn CLUSTER_FILE ROUNDS HISTORY [PREFIX]");
    };
    let prefix = args.next().unwrap_or_else(|| "churn".into());
    let rounds: u64 = rounds.parse().context("ROUNDS must be a number")?;
    let file = PathBuf::from(file);
    let cluster = ClusterConfig::load(&file)
        .with_context(|| format!("cannot load the cluster file {}", file.display()))?;
    let store = RdmaStore::open(RdmaConfig::from_cluster(&cluster)?)?;
    let recorder = Recorder::new();
    let started = Instant::now();
    let now = || u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let (mut made, mut failed_clients, mut failed_ops) = (0u64, 0u64, 0u64);
    for round in 0..rounds {
        let client = match store.client() {
            Ok(client) => client,
            Err(error) => {
                failed_clients += 1;
                eprintln!("round {round}: no client: {error}");
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
        };
        made += 1;
        let fabric = client.fabric();
        let out: Vec<u16> = (0..fabric.node_count() as u16)
            .filter(|&i| fabric.node_status(NodeId(i)) != NodeStatus::Live)
            .collect();
        let key = format!("{prefix}-{}", round % 4);
        let value = format!("r{round}");
        let id = recorder.begin(round, OpKind::Insert, &key, Some(&value), now());
        let put = swarm_core::block_on(
            fabric,
            client.insert(key.as_bytes(), value.as_bytes(), &OpStats::new()),
        );
        // A failed operation may still take effect (its batches may land): it stays
        // in the history as crashed (never ended), which the checker lets take
        // effect or not. (Ended with an unknown outcome, it would have to.)
        if put.is_ok() {
            recorder.end(id, true, None, now())?;
        }
        let id = recorder.begin(round, OpKind::Get, &key, None, now());
        let got = swarm_core::block_on(fabric, client.get(key.as_bytes(), &OpStats::new()));
        let text = match &got {
            Ok(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        };
        if got.is_ok() {
            recorder.end(id, true, text.as_deref(), now())?;
        }
        if put.is_err() || got.is_err() {
            failed_ops += 1;
        }
        eprintln!(
            "round {round}: writer {}, nodes out {out:?}, put {}, get {}",
            client.writer(),
            put.map_or_else(|e| e.to_string(), |()| "ok".into()),
            got.map_or_else(
                |e| e.to_string(),
                |v| format!("{:?}", text.as_deref().filter(|_| v.is_some()))
            )
        );
        drop(client);
        std::thread::sleep(Duration::from_millis(250));
    }
    let out = std::fs::File::create(&history)
        .with_context(|| format!("cannot write the history to {history}"))?;
    recorder
        .history()?
        .write_jsonl(std::io::BufWriter::new(out))?;
    println!(
        "client churn: {rounds} rounds, {made} clients made, {failed_clients} could not be made, \
         {failed_ops} rounds with a failed operation"
    );
    Ok(())
}
