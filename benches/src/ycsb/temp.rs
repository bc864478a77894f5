//! Throw-away clusters for benchmarks and tests: a shared-memory SWARM-KV cluster in a
//! scratch directory (under `/dev/shm` when it exists), sized for one run and
//! removed when dropped.

use swarm_shm::ScratchDir;

use super::config::BenchConfig;
use super::error::BenchError;
use super::sizing::cluster_for;
use swarm_kv::ShmStore;

/// A cluster that lives as long as this value.
#[derive(Debug)]
pub struct TempStore {
    store: ShmStore,
    // Dropped after `store`, so the node files outlive their mappings' users.
    _dir: ScratchDir,
}

impl TempStore {
    /// A fresh cluster of `nodes` memory nodes, just large enough for `config`, with
    /// keys replicated on `replicas` of them.
    pub fn new(config: &BenchConfig, nodes: u16, replicas: u16) -> Result<Self, BenchError> {
        let (params, node_bytes) = cluster_for(config, replicas)?;
        let dir = ScratchDir::new("swarm-ycsb").map_err(BenchError::TempDir)?;
        let store = ShmStore::create(dir.path(), nodes, node_bytes, params)?;
        Ok(Self { store, _dir: dir })
    }

    /// The cluster.
    pub fn store(&self) -> &ShmStore {
        &self.store
    }
}
