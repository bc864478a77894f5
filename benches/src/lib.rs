//! Shared helpers for the benchmarks, and the YCSB harness of SWARM-KV.
//!
//! * [`ycsb`] — the YCSB benchmark harness behind `swarm bench` (and the `ycsb` bench).
//! * [`ShmFixture`] — a throw-away shared-memory cluster for the criterion benchmarks.
//! * [`duration`] — durations on the command line (`swarm bench` and `swarm`'s flags).
//!
//! ## Features
//! - `rdma` (off by default): builds swarm-kv with its `rdma` feature, so that the
//!   harness can run on `swarm_kv::RdmaStore` (`cargo test --features rdma --test
//!   rdma_emulated`). Needs the rdma-core headers and libclang, and links libibverbs.
#![warn(missing_docs)]

use std::io;
use std::sync::Arc;

use swarm_shm::{ScratchDir, ShmCluster, ShmError};

pub mod duration;
pub mod ycsb;

/// Why a benchmark fixture could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// No scratch directory could be created under /dev/shm or the temp directory.
    #[error("cannot create a scratch directory for the benchmark cluster: {0}")]
    Scratch(#[from] io::Error),
    /// The cluster could not be created in the scratch directory.
    #[error(transparent)]
    Cluster(#[from] ShmError),
}

/// A shared-memory cluster in a scratch directory, removed when dropped.
#[derive(Debug)]
pub struct ShmFixture {
    /// The opened cluster.
    pub cluster: Arc<ShmCluster>,
    // Dropped after `cluster`, so the files outlive the mappings' users.
    _dir: ScratchDir,
}

impl ShmFixture {
    /// `nodes` memory nodes of `bytes_per_node` bytes (header included) under
    /// /dev/shm when available.
    pub fn new(nodes: u16, bytes_per_node: u64) -> Result<Self, FixtureError> {
        let dir = ScratchDir::new("swarm-bench")?;
        let cluster = Arc::new(ShmCluster::create(dir.path(), nodes, bytes_per_node)?);
        Ok(Self { cluster, _dir: dir })
    }
}
