//! SWARM-KV on shared-memory files (emulated CXL memory nodes, see `swarm-shm`).
//!
//! [`ShmStore::create`] lays a SWARM-KV cluster over a new `swarm-shm` cluster: it
//! writes the superblock on every node (the rest of the memory is zero, which is the
//! empty state of every structure). [`ShmStore::open`] maps an existing one, validates
//! every node header and superblock, and hands out one [`KvClient`] per thread.
//!
//! A minority of node files that are missing, corrupted, empty or of an incarnation
//! the configuration does not list (`crate::configuration`) is left out with a
//! warning ([`Store::unusable_nodes`], `swarm stat`); the rest serve.

use std::path::Path;
use std::sync::Arc;

use swarm_core::Fabric as _;
use swarm_core::fabric::NodeId;
use swarm_core::header::NodeHeader;
use swarm_shm::{CreateOptions, EmulatedFabric, ShmCluster};

use crate::KvError;
use crate::client::{KvClient, KvConfig};
use crate::clock::SystemClock;
use crate::configuration::Configuration;
use crate::layout::{ClusterParams, NodeLayout};
use crate::placement::{AddNodeOptions, AddNodeReport};
use crate::repair::{RepairError, RepairOptions, RepairReport, repair_node};
use crate::store::{OpenedLayout, Store, open_layout, write_superblock};

/// A SWARM-KV cluster on shared-memory node files, mapped by this process (the
/// shared-memory counterpart of `RdmaStore`, feature `rdma`).
#[derive(Debug, Clone)]
pub struct ShmStore {
    shm: Arc<ShmCluster>,
    layout: NodeLayout,
    header: NodeHeader,
    rtt_ns: u64,
}

impl ShmStore {
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

    /// [`ShmStore::create`] with an explicit timestamp tick length.
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
        // Replica groups over the cluster's nodes (`NodeLayout::placement`), and a
        // placement table for the records that place chunks elsewhere
        // (`crate::placement`: superblock version 10), with reserve chunks.
        // More nodes than one roundtrip reaches: a metadata group, unless the
        // caller chose one (`ClusterParams::metadata_nodes`).
        let sized = |max_nodes| {
            ClusterParams {
                placement_nodes: nodes,
                placement_table: true,
                metadata_nodes: if params.metadata_nodes == 0 {
                    crate::layout::default_metadata_nodes(nodes, params.replicas)
                } else {
                    params.metadata_nodes
                },
                max_nodes,
                ..params
            }
            .for_node_size(node_bytes)
        };
        // Room to grow by `swarm add-node` (reserve chunks: superblock version 11),
        // unless the caller chose how much; the default only where the node has
        // room for its index buckets (a node of a few MiB may not: none then).
        let params = if params.max_nodes == 0 {
            match sized(crate::layout::default_max_nodes(nodes)) {
                Err(crate::layout::ParamsError::TooSmall { .. }) => sized(0),
                sized => sized,
            }
        } else {
            sized(params.max_nodes)
        }?;
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
        write_superblock(&shm.client(), &params)?;
        let config = Configuration::new(
            1,
            shm.incarnations()
                .iter()
                .map(|i| i.unwrap_or_default())
                .collect(),
        );
        let meta = NodeLayout::new(params)?.metadata_nodes(usize::from(nodes));
        crate::store::write_configuration_on(&shm.client(), &config, meta)?;
        Self::from_shm(shm, 0)
    }

    /// Opens the cluster in `dir`.
    pub fn open(dir: &Path) -> Result<Self, KvError> {
        let shm = Arc::new(ShmCluster::open(dir)?);
        Self::from_shm(shm, 0)
    }

    fn from_shm(shm: Arc<ShmCluster>, rtt_ns: u64) -> Result<Self, KvError> {
        let header = *shm.header();
        let OpenedLayout {
            layout,
            left_out,
            lost,
        } = open_layout(&shm.client(), &header, shm.incarnations())?;
        let shm = if left_out.is_empty() {
            shm
        } else {
            // Nodes without the cluster's superblock (a node file recreated empty)
            // must never count as replicas: take them out of every client's fabric.
            let mut cluster = Arc::try_unwrap(shm).map_err(|_| {
                KvError::Unsupported("leaving out a node of a cluster that is already shared")
            })?;
            for (node, why) in left_out {
                cluster.leave_out(node, why);
            }
            for (node, incarnation) in lost {
                cluster.declare_lost(node, incarnation);
            }
            Arc::new(cluster)
        };
        Ok(Self {
            shm,
            layout,
            header,
            rtt_ns,
        })
    }

    /// Rebuilds node `node` of the cluster in `dir` from the other nodes and admits
    /// it back (`crate::repair`, which has the procedure and the argument), while
    /// clients of the cluster keep running; they start using the node within a lease
    /// renewal period. A node file that is missing, corrupted, retired (its memory
    /// declared lost) or otherwise left out by the store (no superblock: wiped in
    /// place) is first replaced by an empty one with a new incarnation
    /// ([`ShmCluster::replace_node`]); a node file whose incarnation is already a
    /// member is refused ([`crate::repair::RepairError::AlreadyMember`]) unless
    /// [`RepairOptions::replace`] asks to replace it anyway.
    /// `progress(done, total)` is called after every piece copied.
    pub fn repair(
        dir: &Path,
        node: u16,
        options: RepairOptions,
        progress: impl FnMut(u64, u64),
    ) -> Result<RepairReport, KvError> {
        let store = Self::open(dir)?;
        let nodes = store.shm.node_count();
        if usize::from(node) >= nodes {
            return Err(RepairError::NoSuchNode {
                node: NodeId(node),
                nodes,
            }
            .into());
        }
        // Reopened for the copy; `open` above named the unusable nodes already.
        let mut raw = ShmCluster::open_quietly(dir)?;
        // Every repair of this cluster is a process of this host (`crate::repair::lock`).
        let options = RepairOptions {
            liveness: crate::membership::owner_process::OwnerLiveness::ThisHost,
            ..options
        };
        // A repair that another one's lock refuses leaves the node file alone.
        // The repair lock is on the metadata group's donors.
        let donors = crate::repair::metadata_donors(&store.layout, nodes, NodeId(node));
        let probe = store.fabric();
        swarm_core::block_on(&probe, async {
            Ok::<_, swarm_core::FabricError>(
                crate::repair::lock::check(
                    &probe,
                    &swarm_core::OpStats::new(),
                    &donors,
                    options.liveness,
                    options.break_lock,
                )
                .await,
            )
        })??;
        // Left out by the store (no superblock, say: its memory was wiped in place,
        // incarnation and all) counts as lost too.
        let left_out = store.unusable_nodes().iter().any(|(n, _)| n.0 == node);
        if raw.node(NodeId(node)).is_none() || left_out || options.replace {
            tracing::warn!(
                node,
                replace = options.replace,
                "replacing the node file by an empty one to rebuild (its memory is declared lost)"
            );
            drop(raw);
            ShmCluster::replace_node(dir, node)?;
            raw = ShmCluster::open_quietly(dir)?;
        }
        let incarnation = raw
            .incarnation_of(NodeId(node))
            .ok_or(KvError::Unsupported(
                "repairing a node whose file cannot be opened",
            ))?;
        let raw = Arc::new(raw);
        let fabric = raw.client();
        let report = swarm_core::block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                repair_node(
                    &fabric,
                    store.layout(),
                    NodeId(node),
                    incarnation,
                    options,
                    progress,
                )
                .await,
            )
        })??;
        Ok(report)
    }

    /// Adds a memory node to the cluster in `dir` while its clients run
    /// (`crate::placement::add_node` has the procedure and the argument): a new node
    /// file in the first slot the configuration does not list (replacing the file of
    /// an add that stopped before publishing, which nobody uses), then the
    /// configuration change that lists it and moves unclaimed chunks onto it.
    /// Clients follow it within a lease renewal period.
    pub fn add_node(dir: &Path, options: AddNodeOptions) -> Result<AddNodeReport, KvError> {
        let store = Self::open(dir)?;
        let fabric = store.fabric();
        let config = crate::store::read_configuration_on(
            &fabric,
            store.layout.metadata_nodes(fabric.node_count()),
        )?;
        let index = u16::try_from(config.incarnations.len())
            .map_err(|_| KvError::Unsupported("more than 65535 nodes"))?;
        let leftover = usize::from(index) < store.shm.node_count();
        let layout = store.layout;
        drop(fabric);
        drop(store);
        let incarnation = ShmCluster::add_node(dir, index, leftover)?;
        // A raw handle: the store's clients would leave the new node out (no
        // superblock yet, an incarnation no configuration lists).
        let raw = Arc::new(ShmCluster::open_quietly(dir)?);
        let fabric = raw.client();
        let options = AddNodeOptions {
            // Every add-node of this cluster is a process of this host.
            liveness: crate::membership::owner_process::OwnerLiveness::ThisHost,
            ..options
        };
        let report = swarm_core::block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                crate::placement::add_node(&fabric, &layout, NodeId(index), incarnation, options)
                    .await,
            )
        })??;
        Ok(report)
    }

    /// Replaces node `node`'s file in `dir` by an empty one with a new incarnation
    /// ([`ShmCluster::replace_node`]): the node's memory is lost for every process
    /// at once (the old file is retired), and the new node stays out until a repair.
    pub fn replace_node_file(dir: &Path, node: u16) -> Result<(), KvError> {
        Ok(ShmCluster::replace_node(dir, node)?)
    }

    /// Emulates `rtt_ns` of network roundtrip on every client created from now on.
    pub fn with_rtt_ns(mut self, rtt_ns: u64) -> Self {
        self.rtt_ns = rtt_ns;
        self
    }

    /// The shared-memory cluster.
    pub fn shm(&self) -> &Arc<ShmCluster> {
        &self.shm
    }

    /// A raw fabric handle for the calling thread, with the store's emulated rtt.
    pub fn shm_fabric(&self) -> EmulatedFabric {
        self.shm.client_with(self.rtt_ns)
    }

    /// A raw fabric handle for the calling thread (same as [`ShmStore::shm_fabric`]).
    pub fn fabric(&self) -> EmulatedFabric {
        self.shm_fabric()
    }

    /// The layout.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// The header of node 0.
    pub fn header(&self) -> &NodeHeader {
        &self.header
    }

    /// Default client settings for this cluster.
    pub fn config(&self) -> KvConfig {
        Store::config(self)
    }

    /// A client for the calling thread (registers a writer id).
    pub fn client(&self) -> Result<KvClient<EmulatedFabric, SystemClock>, KvError> {
        Store::client(self)
    }

    /// A client with explicit settings.
    pub fn client_with(
        &self,
        config: KvConfig,
    ) -> Result<KvClient<EmulatedFabric, SystemClock>, KvError> {
        Store::client_with(self, config)
    }
}

impl Store for ShmStore {
    type Fabric = EmulatedFabric;

    fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    fn header(&self) -> &NodeHeader {
        &self.header
    }

    fn fabric(&self) -> Result<EmulatedFabric, KvError> {
        Ok(self.shm_fabric())
    }

    fn unusable_nodes(&self) -> Vec<(NodeId, String)> {
        self.shm
            .absent()
            .iter()
            .map(|a| (a.node, a.error.to_string()))
            .collect()
    }

    /// Shared memory: every client is a process of this host, so a writer id is
    /// taken over only once its owner's process is gone
    /// (`crate::membership::owner_process`).
    fn config(&self) -> KvConfig {
        KvConfig {
            owners: crate::membership::owner_process::OwnerLiveness::ThisHost,
            ..KvConfig::new(self.header.epoch_unix_ns, self.header.tick_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarm_core::{OpStats, block_on};

    /// A cluster as builds before placement tables made it (superblock version 8,
    /// no table: its index right after the chunk table) opens unchanged: its clients
    /// read no table, follow no record and place every register where the layout
    /// computes it.
    #[test]
    fn a_cluster_made_before_placement_tables_opens_unchanged() {
        let dir = swarm_shm::ScratchDir::new("kv-no-table").unwrap();
        let (nodes, node_bytes) = (6u16, 16u64 << 20);
        let params = ClusterParams {
            placement_nodes: nodes,
            key_max: 16,
            value_max: 32,
            writers: 4,
            ..ClusterParams::default()
        }
        .for_node_size(node_bytes)
        .unwrap();
        assert!(!params.placement_table);
        let shm = Arc::new(
            ShmCluster::create_with(dir.path(), nodes, node_bytes, &CreateOptions::default())
                .unwrap(),
        );
        write_superblock(&shm.client(), &params).unwrap();
        let incarnations = shm.incarnations().iter().map(|i| i.unwrap_or_default());
        let config = Configuration::new(1, incarnations.collect());
        crate::store::write_configuration_on(&shm.client(), &config, usize::from(nodes)).unwrap();
        drop(shm);

        let store = ShmStore::open(dir.path()).unwrap();
        assert_eq!(store.layout().params, params);
        assert_eq!(store.layout().placements_at, None);
        let c = store.client().unwrap();
        assert_eq!(c.recorded_chunks(), 0);
        let stats = OpStats::new();
        block_on(c.fabric(), c.insert(b"key", b"value", &stats)).unwrap();
        let got = block_on(c.fabric(), c.get(b"key", &stats)).unwrap();
        assert_eq!(got.as_deref(), Some(&b"value"[..]));
        for register in [0, params.registers - 1] {
            let computed = crate::client::register_loc_for(store.layout(), 6, register).unwrap();
            assert_eq!(c.register_loc(register).unwrap(), computed);
        }
        c.close();
    }
}
