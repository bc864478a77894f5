//! SWARM-KV over RDMA memory nodes (`swarm memnode`, see `swarm-rdma`).
//!
//! Memory nodes are passive: each `swarm memnode` registers zeroed memory with the
//! node header, and the first client formats the store by writing the superblock
//! ([`RdmaStore::format`], `swarm format`). After that, [`RdmaStore::open`] works like
//! its shared-memory counterpart, and every command and the benchmark run unchanged
//! through the [`Store`] trait.
//!
//! Without an RDMA device both fail with the transport's `no RDMA device found: ...`
//! error.

use std::sync::Arc;

use swarm_core::header::NodeHeader;
use swarm_rdma::{RdmaCluster, RdmaConfig, RdmaError, RdmaFabric};

use crate::KvError;
use crate::layout::{ClusterParams, NodeLayout, ParamsError};
use crate::store::{Store, open_layout, write_superblock};

/// A SWARM-KV cluster on RDMA memory nodes, opened by this process.
#[derive(Debug, Clone)]
pub struct RdmaStore {
    cluster: Arc<RdmaCluster>,
    layout: NodeLayout,
    header: NodeHeader,
}

fn first_header(fabric: &RdmaFabric) -> Result<NodeHeader, KvError> {
    Ok(fabric
        .headers()
        .iter()
        .flatten()
        .next()
        .copied()
        .ok_or(ParamsError::NotInitialized)?)
}

impl RdmaStore {
    /// Connects to the memory nodes of `config`.
    pub fn open(config: RdmaConfig) -> Result<Self, KvError> {
        let cluster = Arc::new(RdmaCluster::open(config).map_err(rdma)?);
        let fabric = cluster.client().map_err(rdma)?;
        let header = first_header(&fabric)?;
        let layout = open_layout(&fabric, &header)?;
        Ok(Self {
            cluster,
            layout,
            header,
        })
    }

    /// Writes the superblock of a fresh store on the memory nodes of `config`, with
    /// capacities derived from `params` and the nodes' size.
    pub fn format(config: RdmaConfig, params: ClusterParams) -> Result<Self, KvError> {
        let cluster = RdmaCluster::open(config.clone()).map_err(rdma)?;
        let fabric = cluster.client().map_err(rdma)?;
        let header = first_header(&fabric)?;
        let params = params.for_node_size(header.size)?;
        write_superblock(&fabric, &params)?;
        drop(fabric);
        drop(cluster);
        Self::open(config)
    }
}

fn rdma(e: RdmaError) -> KvError {
    KvError::Rdma(e)
}

impl Store for RdmaStore {
    type Fabric = RdmaFabric;

    fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    fn header(&self) -> &NodeHeader {
        &self.header
    }

    fn fabric(&self) -> Result<RdmaFabric, KvError> {
        self.cluster.client().map_err(rdma)
    }
}
