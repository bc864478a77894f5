//! SWARM-KV on shared-memory files (emulated CXL memory nodes, see `swarm-shm`).
//!
//! [`KvStore::create`] lays a SWARM-KV cluster over a new `swarm-shm` cluster: it
//! writes the superblock on every node (the rest of the memory is zero, which is the
//! empty state of every structure). [`KvStore::open`] maps an existing one, validates
//! every node header and superblock, and hands out one [`KvClient`] per thread.

use std::path::Path;
use std::sync::Arc;

use swarm_core::header::NodeHeader;
use swarm_core::{Batch, Fabric, NodeId, OpStats, Roundtrip, block_on};
use swarm_shm::{CreateOptions, ShmCluster, ShmFabric};

use crate::KvError;
use crate::client::{KvClient, KvConfig};
use crate::clock::SystemClock;
use crate::layout::{ClusterParams, NodeLayout, ParamsError, SUPERBLOCK_AT};

/// A SWARM-KV cluster mapped by this process.
#[derive(Debug, Clone)]
pub struct KvStore {
    shm: Arc<ShmCluster>,
    layout: NodeLayout,
    header: NodeHeader,
    rtt_ns: u64,
}

impl KvStore {
    /// Creates a cluster of `nodes` node files of `node_bytes` bytes in `dir`, with
    /// capacities derived from `params` and the node size.
    pub fn create(
        dir: &Path,
        nodes: u16,
        node_bytes: u64,
        params: ClusterParams,
    ) -> Result<Self, KvError> {
        Self::create_with_tick(
            dir,
            nodes,
            node_bytes,
            params,
            swarm_core::encoding::DEFAULT_TICK_NS,
        )
    }

    /// [`KvStore::create`] with an explicit timestamp tick length.
    pub fn create_with_tick(
        dir: &Path,
        nodes: u16,
        node_bytes: u64,
        params: ClusterParams,
        tick_ns: u64,
    ) -> Result<Self, KvError> {
        if nodes < params.replicas {
            return Err(KvError::TooFewNodes {
                nodes: usize::from(nodes),
                replicas: params.replicas,
            });
        }
        let params = params.for_node_size(node_bytes)?;
        // Validate the layout before touching the filesystem.
        NodeLayout::new(params)?;
        let shm = Arc::new(ShmCluster::create_with(
            dir,
            nodes,
            node_bytes,
            &CreateOptions {
                tick_ns,
                ..CreateOptions::default()
            },
        )?);
        let fabric = shm.client();
        let stats = OpStats::new();
        block_on(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for node in 0..nodes {
                rt.post(
                    NodeId(node),
                    Batch::write(SUPERBLOCK_AT, params.encode().to_vec()),
                )?;
            }
            rt.wait(usize::from(nodes)).await
        })??;
        Self::from_shm(shm, 0)
    }

    /// Opens the cluster in `dir`.
    pub fn open(dir: &Path) -> Result<Self, KvError> {
        let shm = Arc::new(ShmCluster::open(dir)?);
        Self::from_shm(shm, 0)
    }

    fn from_shm(shm: Arc<ShmCluster>, rtt_ns: u64) -> Result<Self, KvError> {
        let fabric = shm.client();
        let stats = OpStats::new();
        let nodes = fabric.node_count();
        let superblocks = block_on(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for node in 0..nodes {
                rt.post(NodeId(node as u16), Batch::read(SUPERBLOCK_AT, 64))?;
            }
            rt.wait(nodes).await?;
            Ok::<_, swarm_core::FabricError>(
                rt.replies()
                    .iter()
                    .map(|(_, c)| ClusterParams::decode(c.read(0).unwrap_or_default()))
                    .collect::<Vec<_>>(),
            )
        })??;
        let mut params = None;
        for decoded in superblocks {
            let p = decoded?;
            if params.is_some_and(|q| q != p) {
                return Err(ParamsError::Disagree.into());
            }
            params = Some(p);
        }
        let params = params.ok_or(ParamsError::NotInitialized)?;
        let layout = NodeLayout::new(params)?;
        let header = *shm.headers().first().ok_or(ParamsError::NotInitialized)?;
        if layout.end() > header.size {
            return Err(ParamsError::TooSmall {
                node_bytes: header.size,
                needed: layout.end(),
            }
            .into());
        }
        Ok(Self {
            shm,
            layout,
            header,
            rtt_ns,
        })
    }

    /// Emulates `rtt_ns` of network roundtrip on every client created from now on.
    pub fn with_rtt_ns(mut self, rtt_ns: u64) -> Self {
        self.rtt_ns = rtt_ns;
        self
    }

    /// The layout.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// The header of node 0 (epoch, tick, size...).
    pub fn header(&self) -> &NodeHeader {
        &self.header
    }

    /// The shared-memory cluster.
    pub fn shm(&self) -> &Arc<ShmCluster> {
        &self.shm
    }

    /// A raw fabric handle (for tools).
    pub fn fabric(&self) -> ShmFabric {
        self.shm.client().with_rtt_ns(self.rtt_ns)
    }

    /// Default client settings for this cluster.
    pub fn config(&self) -> KvConfig {
        KvConfig::new(self.header.epoch_unix_ns, self.header.tick_ns)
    }

    /// A client for the calling thread (registers a writer id).
    pub fn client(&self) -> Result<KvClient<ShmFabric, SystemClock>, KvError> {
        self.client_with(self.config())
    }

    /// A client with explicit settings.
    pub fn client_with(
        &self,
        config: KvConfig,
    ) -> Result<KvClient<ShmFabric, SystemClock>, KvError> {
        let fabric = self.fabric();
        let clock = SystemClock::new(self.header.epoch_unix_ns, self.header.tick_ns);
        let layout = self.layout;
        // The fabric moves into the client; connect drives itself on a second handle.
        let driver = self.shm.client();
        block_on(&driver, KvClient::connect(fabric, clock, layout, config))?
    }
}
