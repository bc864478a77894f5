//! What every transport's store provides, and the superblock I/O they share.
//!
//! A *store* is a SWARM-KV cluster opened by this process over one transport: shared
//! memory ([`crate::ShmStore`]) or RDMA (`rdma::RdmaStore`, feature `rdma`). The `swarm`
//! command and the benchmark only need the [`Store`] trait, so they run unchanged on
//! either.

use swarm_core::fabric::NodeId;
use swarm_core::header::NodeHeader;
use swarm_core::quorum::{broadcast, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, OpStats, block_on};

use crate::KvError;
use crate::client::{KvClient, KvConfig};
use crate::clock::SystemClock;
use crate::layout::{ClusterParams, NodeLayout, ParamsError, SUPERBLOCK_AT};

/// A SWARM-KV cluster opened over some transport.
pub trait Store {
    /// The transport's per-thread fabric handle.
    type Fabric: Fabric;

    /// The cluster layout (from the superblock).
    fn layout(&self) -> &NodeLayout;

    /// The header of node 0 (epoch, tick, size).
    fn header(&self) -> &NodeHeader;

    /// A raw fabric handle for the calling thread (for tools).
    fn fabric(&self) -> Result<Self::Fabric, KvError>;

    /// Nodes left out when the cluster was opened, and why (a minority of nodes may be
    /// unusable: the others serve). Empty when every node is in use.
    fn unusable_nodes(&self) -> Vec<(NodeId, String)> {
        Vec::new()
    }

    /// Default client settings for this cluster.
    fn config(&self) -> KvConfig {
        KvConfig::new(self.header().epoch_unix_ns, self.header().tick_ns)
    }

    /// A client for the calling thread, with explicit settings (registers a writer id).
    fn client_with(
        &self,
        config: KvConfig,
    ) -> Result<KvClient<Self::Fabric, SystemClock>, KvError> {
        let fabric = self.fabric()?;
        let clock = SystemClock::new(self.header().epoch_unix_ns, self.header().tick_ns);
        KvClient::connect(fabric, clock, *self.layout(), config)
    }

    /// A client for the calling thread with default settings.
    fn client(&self) -> Result<KvClient<Self::Fabric, SystemClock>, KvError> {
        self.client_with(self.config())
    }
}

/// Writes the superblock of `params` on every node (they must all answer).
pub fn write_superblock<F: Fabric>(fabric: &F, params: &ClusterParams) -> Result<(), KvError> {
    let nodes = fabric.node_count();
    let stats = OpStats::new();
    block_on(
        fabric,
        broadcast(fabric, &stats, node_ids(nodes), nodes, |_| {
            Ok(Batch::write(SUPERBLOCK_AT, params.encode().to_vec()))
        }),
    )?;
    Ok(())
}

/// Reads the superblock from a majority of nodes; they must agree.
pub fn read_superblock<F: Fabric>(fabric: &F) -> Result<ClusterParams, KvError> {
    let nodes = fabric.node_count();
    let stats = OpStats::new();
    let decoded = block_on(fabric, async {
        let rt = broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
            Ok(Batch::read(SUPERBLOCK_AT, 64))
        })
        .await?;
        Ok::<_, FabricError>(
            rt.replies()
                .iter()
                .map(|(_, c)| ClusterParams::decode(c.read(0).unwrap_or_default()))
                .collect::<Vec<_>>(),
        )
    })?;
    let mut params: Option<ClusterParams> = None;
    for p in decoded {
        let p = p?;
        if params.is_some_and(|q| q != p) {
            return Err(ParamsError::Disagree.into());
        }
        params = Some(p);
    }
    Ok(params.ok_or(ParamsError::NotInitialized)?)
}

/// The layout in the superblock, checked against the node size.
pub fn open_layout<F: Fabric>(fabric: &F, header: &NodeHeader) -> Result<NodeLayout, KvError> {
    let layout = NodeLayout::new(read_superblock(fabric)?)?;
    if layout.end() > header.size {
        return Err(ParamsError::TooSmall {
            node_bytes: header.size,
            needed: layout.end(),
        }
        .into());
    }
    Ok(layout)
}
