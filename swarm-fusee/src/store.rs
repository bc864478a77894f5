//! A FUSEE store on shared memory (`swarm_shm`), as the benchmark harness uses it.

use std::path::Path;
use std::sync::Arc;

use swarm_core::NodeId;
use swarm_core::fabric::Nanos;
use swarm_shm::{EmulatedFabric, ShmCluster};

use crate::client::{FuseeClient, FuseeConfig};
use crate::error::FuseeError;
use crate::layout::{FuseeLayout, FuseeParams};
use crate::master::Master;

/// A cluster of shared-memory nodes formatted for FUSEE, with its master.
#[derive(Debug, Clone)]
pub struct FuseeStore {
    cluster: Arc<ShmCluster>,
    layout: FuseeLayout,
    master: Arc<Master>,
}

impl FuseeStore {
    /// Creates `nodes` node files in `dir` (which must not hold a cluster) sized for
    /// `params`, and formats them.
    pub fn create(
        dir: impl AsRef<Path>,
        nodes: u16,
        params: FuseeParams,
    ) -> Result<Self, FuseeError> {
        let layout = FuseeLayout::new(params)?;
        let master = Arc::new(Master::new(usize::from(nodes), params.max_clients)?);
        let cluster = ShmCluster::create(dir, nodes, layout.node_bytes())
            .map_err(|e| FuseeError::InvalidParams(format!("cannot create the node files: {e}")))?;
        let (addr, superblock) = layout.superblock();
        for n in 0..nodes {
            let node = cluster.node(NodeId(n)).ok_or(FuseeError::NoLiveNodes)?;
            node.write(addr, &superblock)?;
        }
        Ok(Self {
            cluster: Arc::new(cluster),
            layout,
            master,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &FuseeLayout {
        &self.layout
    }

    /// The master.
    pub fn master(&self) -> &Arc<Master> {
        &self.master
    }

    /// Memory nodes.
    pub fn node_count(&self) -> usize {
        self.cluster.node_count()
    }

    /// A client for one thread, with an emulated roundtrip time of `rtt_ns`.
    pub fn client_with(
        &self,
        rtt_ns: Nanos,
        config: FuseeConfig,
    ) -> Result<FuseeClient<EmulatedFabric>, FuseeError> {
        FuseeClient::new(
            self.cluster.client_with(rtt_ns),
            self.layout,
            self.master.clone(),
            config,
        )
    }
}
