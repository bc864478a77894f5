//! Fixtures shared by this crate's unit tests: a small formatted in-memory cluster
//! and a client of it.

use swarm_core::{FixedClock, MemCluster, MemFabric};

use crate::layout::{ClusterParams, NodeLayout};
use crate::{KvClient, KvConfig};

pub(crate) const MS: u64 = 1_000_000;

/// Three in-memory nodes of `node_bytes` each, formatted with `params` (fitted to
/// the node size).
pub(crate) fn cluster_with(params: ClusterParams, node_bytes: usize) -> (MemCluster, NodeLayout) {
    let params = params
        .for_node_size(node_bytes as u64)
        .expect("the parameters fit the node size");
    let layout = NodeLayout::new(params).expect("a valid layout");
    let cluster = MemCluster::new(3, node_bytes);
    crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
    (cluster, layout)
}

/// The small cluster of the recycling tests: 1 MiB nodes, keys and values of up to
/// 16 B, 4 writers, chunks of 4 registers, a lease of `lease_ns` renewed every
/// 20 ms, and a 50 ms operation fence, hence a short grace (each client's in-memory
/// fabric has its own logical clock).
pub(crate) fn small_cluster(lease_ns: u64) -> (MemCluster, NodeLayout) {
    let params = ClusterParams {
        key_max: 16,
        value_max: 16,
        writers: 4,
        chunk_registers: 4,
        lease_ns,
        lease_renew_ns: 20 * MS,
        max_op_ns: 50 * MS,
        cache_ttl_ns: 10 * MS,
        ..ClusterParams::default()
    };
    cluster_with(params, 1 << 20)
}

/// The layout of a 1 MiB node with keys and values of up to 16 B, 4 writers and
/// chunks of 4 registers (no cluster formatted: the allocation tests' fixture).
pub(crate) fn small_layout() -> NodeLayout {
    let params = ClusterParams {
        key_max: 16,
        value_max: 16,
        writers: 4,
        chunk_registers: 4,
        ..ClusterParams::default()
    }
    .for_node_size(1 << 20)
    .expect("the parameters fit the node size");
    NodeLayout::new(params).expect("a valid layout")
}

/// A client of `cluster` with writer preference 0. Every client reads the same
/// frozen clock: without resuming its writer id's log, a later one would guess the
/// very timestamps (and slots) an earlier one used.
pub(crate) fn connect(cluster: &MemCluster, layout: NodeLayout) -> KvClient<MemFabric, FixedClock> {
    KvClient::connect(
        cluster.client(),
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a free writer id")
}
