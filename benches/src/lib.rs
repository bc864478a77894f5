//! Shared helpers for the benchmarks.

use std::io;
use std::sync::Arc;

use swarm_shm::{ScratchDir, ShmCluster, ShmError};

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
