//! What every transport's store provides, and the superblock I/O they share.
//!
//! A *store* is a SWARM-KV cluster opened by this process over one transport: shared
//! memory ([`crate::ShmStore`]) or RDMA (`rdma::RdmaStore`, feature `rdma`). The `swarm`
//! command and the benchmark only need the [`Store`] trait, so they run unchanged on
//! either.

use swarm_core::fabric::NodeId;
use swarm_core::header::NodeHeader;
use swarm_core::quorum::{broadcast, broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, OpStats, block_on};

use crate::KvError;
use crate::client::{KvClient, KvConfig};
use crate::clock::SystemClock;
use crate::configuration::{CONFIG_AT, CONFIG_READ_BYTES, Configuration};
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

/// Writes the superblock of `params` on every node (they must all answer): one
/// roundtrip per [`swarm_core::MAX_NODES`] nodes.
pub fn write_superblock<F: Fabric>(fabric: &F, params: &ClusterParams) -> Result<(), KvError> {
    let nodes: Vec<NodeId> = node_ids(fabric.node_count()).collect();
    let stats = OpStats::new();
    for group in nodes.chunks(swarm_core::MAX_NODES) {
        block_on(
            fabric,
            broadcast(fabric, &stats, group.iter().copied(), group.len(), |_| {
                Ok(Batch::write(SUPERBLOCK_AT, params.encode().to_vec()))
            }),
        )?;
    }
    Ok(())
}

/// How long the superblock read waits for nodes beyond the first majority (on the
/// fabric's clock): a node that answers later is not judged, just used.
const SUPERBLOCK_STRAGGLER_NS: u64 = 50_000_000;

/// The superblock a majority of nodes agrees on, and the nodes that hold another
/// one or none: a memory node that restarted with empty memory (or a replaced,
/// unformatted one) answers with zeros, and must never be read as a replica — its
/// empty registers and index would count towards quorums that miss acknowledged
/// writes. Such nodes are left out of every client of this store until repaired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The cluster's parameters.
    pub params: ClusterParams,
    /// Nodes left out, and why.
    pub unusable: Vec<(NodeId, String)>,
}

/// Reads the superblock from every node that answers (at least a majority): a
/// majority of all nodes must hold the same one (see [`Superblock`]). More nodes
/// than one roundtrip posts to are read [`swarm_core::MAX_NODES`] at a time (a
/// majority of each group, and its stragglers).
pub fn read_superblock<F: Fabric>(fabric: &F) -> Result<Superblock, KvError> {
    let nodes = fabric.node_count();
    let all: Vec<NodeId> = node_ids(nodes).collect();
    let stats = OpStats::new();
    let mut decoded = Vec::with_capacity(nodes);
    for group in all.chunks(swarm_core::MAX_NODES) {
        decoded.extend(block_on(fabric, async {
            let rt = broadcast_until_among(
                fabric,
                &stats,
                group.iter().copied(),
                majority(group.len()),
                SUPERBLOCK_STRAGGLER_NS,
                |_| {
                    Ok(Some(Batch::read(
                        SUPERBLOCK_AT,
                        crate::layout::SUPERBLOCK_ENCODED_BYTES as u32,
                    )))
                },
                |_| false,
            )
            .await?;
            Ok::<_, FabricError>(
                rt.replies()
                    .iter()
                    .map(|(node, c)| (*node, ClusterParams::decode(c.read(0).unwrap_or_default())))
                    .collect::<Vec<_>>(),
            )
        })?);
    }
    judge_superblocks(nodes, &decoded)
}

/// The nodes that hold the configuration record (the metadata group, `0..` this):
/// from the superblock when a majority holds one, else every node.
fn configuration_nodes<F: Fabric>(fabric: &F) -> usize {
    let nodes = fabric.node_count();
    match read_superblock(fabric).and_then(|s| Ok(NodeLayout::new(s.params)?)) {
        Ok(layout) => layout.metadata_nodes(nodes),
        Err(_) => nodes,
    }
}

/// The verdict of [`read_superblock`] on what each answering node holds.
fn judge_superblocks(
    nodes: usize,
    decoded: &[(NodeId, Result<ClusterParams, ParamsError>)],
) -> Result<Superblock, KvError> {
    let agreeing = |p: &ClusterParams| {
        decoded
            .iter()
            .filter(|(_, q)| q.as_ref().is_ok_and(|q| q == p))
            .count()
    };
    let best = decoded
        .iter()
        .filter_map(|(_, p)| p.as_ref().ok())
        .max_by_key(|p| agreeing(p));
    let Some(params) = best.filter(|p| agreeing(p) >= majority(nodes)).copied() else {
        let formatted = decoded.iter().filter(|(_, p)| p.is_ok()).count();
        if formatted == 0 {
            // Every answer is "no superblock" (a fresh cluster) or unreadable.
            return Err(decoded
                .iter()
                .find_map(|(_, p)| p.clone().err())
                .unwrap_or(ParamsError::NotInitialized)
                .into());
        }
        return Err(ParamsError::Disagree.into());
    };
    let unusable = decoded
        .iter()
        .filter_map(|(node, p)| {
            let why = match p {
                Ok(p) if *p == params => return None,
                Ok(_) => "its SWARM-KV superblock differs from the majority's".to_owned(),
                Err(ParamsError::NotInitialized) => "it holds no SWARM-KV superblock: its memory \
                     is empty (a memory node that restarted or was replaced), so it must be \
                     repaired before it serves again"
                    .to_owned(),
                Err(e) => format!("its SWARM-KV superblock is unreadable ({e})"),
            };
            Some((*node, why))
        })
        .collect();
    Ok(Superblock { params, unusable })
}

/// Writes the configuration record (`crate::configuration`) on every node of the
/// metadata group (they must all answer; every node without one, or without a
/// superblock yet): at creation or format, with each node's incarnation.
pub fn write_configuration<F: Fabric>(fabric: &F, config: &Configuration) -> Result<(), KvError> {
    write_configuration_on(fabric, config, configuration_nodes(fabric))
}

/// [`write_configuration`] on nodes `0..nodes` (the metadata group).
pub fn write_configuration_on<F: Fabric>(
    fabric: &F,
    config: &Configuration,
    nodes: usize,
) -> Result<(), KvError> {
    let stats = OpStats::new();
    block_on(
        fabric,
        broadcast(fabric, &stats, node_ids(nodes), nodes, |_| {
            Ok(Batch::write(CONFIG_AT, config.encode()))
        }),
    )?;
    Ok(())
}

/// The configuration that wins among the copies of the nodes that answer (at least a
/// majority of the metadata group): see `crate::configuration`.
pub fn read_configuration<F: Fabric>(fabric: &F) -> Result<Configuration, KvError> {
    read_configuration_on(fabric, configuration_nodes(fabric))
}

/// [`read_configuration`] from nodes `0..meta` (the metadata group).
pub fn read_configuration_on<F: Fabric>(fabric: &F, meta: usize) -> Result<Configuration, KvError> {
    let nodes = fabric.node_count();
    let stats = OpStats::new();
    let copies = block_on(fabric, async {
        let rt = broadcast_until_among(
            fabric,
            &stats,
            node_ids(meta.min(nodes)),
            majority(meta.min(nodes)),
            SUPERBLOCK_STRAGGLER_NS,
            |_| Ok(Some(Batch::read(CONFIG_AT, CONFIG_READ_BYTES as u32))),
            |_| false,
        )
        .await?;
        Ok::<_, FabricError>(
            rt.replies()
                .iter()
                .map(|(_, c)| Configuration::decode(c.read(0).unwrap_or_default()))
                .collect::<Vec<_>>(),
        )
    })?;
    Ok(Configuration::newest(&copies, nodes))
}

/// The nodes whose incarnation (`incarnations[i]`, `None` when unknown: the node is
/// absent already) is not the member `config` records: never read as replicas.
pub fn foreign_incarnations(
    config: &Configuration,
    incarnations: &[Option<u64>],
) -> Vec<(NodeId, String)> {
    incarnations
        .iter()
        .enumerate()
        .filter_map(|(i, inc)| {
            let inc = (*inc)?;
            (!config.admits(i, inc)).then(|| {
                (
                    NodeId(i as u16),
                    format!(
                        "unknown incarnation {inc:#x} (configuration epoch {} admits {:#x}):                          its memory was re-created, so it must be repaired before it serves again",
                        config.epoch,
                        config.incarnations.get(i).copied().unwrap_or_default()
                    ),
                )
            })
        })
        .collect()
}

/// A store's layout as [`open_layout`] found it.
#[derive(Debug)]
pub struct OpenedLayout {
    /// The layout in the superblock, checked against the node size.
    pub layout: NodeLayout,
    /// The nodes left out, and why.
    pub left_out: Vec<(NodeId, String)>,
    /// Member incarnations whose memory is gone: another incarnation answers in
    /// their slot (a node file re-created, a memory node restarted), so the member's
    /// memory can never answer again (`swarm_core::Fabric::memory_lost`).
    pub lost: Vec<(NodeId, u64)>,
}

/// The layout in the superblock, checked against the node size, and the nodes
/// left out: those without the majority's superblock (see [`Superblock`]) and those
/// whose incarnation (`incarnations[i]`, `None` if unknown) the configuration does
/// not admit (`crate::configuration`).
pub fn open_layout<F: Fabric>(
    fabric: &F,
    header: &NodeHeader,
    incarnations: &[Option<u64>],
) -> Result<OpenedLayout, KvError> {
    let mut superblock = read_superblock(fabric)?;
    let meta = NodeLayout::new(superblock.params)?.metadata_nodes(fabric.node_count());
    let config = read_configuration_on(fabric, meta)?;
    let foreign = foreign_incarnations(&config, incarnations);
    let lost = foreign
        .iter()
        .filter(|_| config.epoch > 0)
        .filter_map(|(node, _)| Some((*node, *config.incarnations.get(node.index())?)))
        .collect();
    for (node, why) in foreign {
        if !superblock.unusable.iter().any(|(n, _)| *n == node) {
            superblock.unusable.push((node, why));
        }
    }
    superblock.unusable.sort_by_key(|(n, _)| *n);
    // Nodes absent already (their incarnation unknown) plus those left out here.
    let nodes = fabric.node_count();
    let out = (0..nodes)
        .filter(|&i| {
            incarnations.get(i).is_none_or(Option::is_none)
                || superblock.unusable.iter().any(|(n, _)| n.index() == i)
        })
        .count();
    if nodes - out < majority(nodes) {
        return Err(KvError::NoMajority {
            usable: nodes - out,
            nodes,
            problems: superblock
                .unusable
                .iter()
                .map(|(n, why)| format!("node {}: {why}", n.0))
                .chain(
                    (0..nodes)
                        .filter(|&i| incarnations.get(i).is_none_or(Option::is_none))
                        .map(|i| format!("node {i}: unusable when opened")),
                )
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    let layout = NodeLayout::new(superblock.params)?;
    let placed = usize::from(layout.params.placement_nodes);
    // Nodes past those the registers are computed over were added later
    // (`crate::placement::add_node`): only a cluster with a placement table has any.
    if placed != 0 && (placed > nodes || (placed < nodes && layout.placements_at.is_none())) {
        return Err(ParamsError::Invalid(format!(
            "the registers are placed over {placed} memory nodes but the cluster has {nodes}"
        ))
        .into());
    }
    if layout.end() > header.size {
        return Err(ParamsError::TooSmall {
            node_bytes: header.size,
            needed: layout.end(),
        }
        .into());
    }
    for (node, why) in &superblock.unusable {
        tracing::warn!(%node, "memory node left out: {why}");
    }
    Ok(OpenedLayout {
        layout,
        left_out: superblock.unusable,
        lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(value_max: u32) -> ClusterParams {
        ClusterParams {
            value_max,
            ..ClusterParams::default()
        }
    }

    #[test]
    fn a_majority_superblock_wins_and_the_others_are_left_out() {
        let (a, b) = (params(64), params(128));
        let replies = [
            (NodeId(0), Ok(a)),
            (NodeId(1), Err(ParamsError::NotInitialized)),
            (NodeId(2), Ok(a)),
            (NodeId(3), Ok(b)),
            (NodeId(4), Err(ParamsError::Checksum)),
        ];
        let judged = judge_superblocks(3, &replies[..3]).unwrap();
        assert_eq!(judged.params, a);
        assert_eq!(judged.unusable.len(), 1);
        assert_eq!(judged.unusable[0].0, NodeId(1));
        assert!(
            judged.unusable[0].1.contains("empty"),
            "{}",
            judged.unusable[0].1
        );
        // Two of five agreeing is not a majority, whatever the others hold.
        assert!(matches!(
            judge_superblocks(5, &replies),
            Err(KvError::Params(ParamsError::Disagree))
        ));
        let mut more = replies.to_vec();
        more[1].1 = Ok(a);
        let judged = judge_superblocks(5, &more).unwrap();
        let left: Vec<_> = judged.unusable.iter().map(|(n, _)| n.0).collect();
        assert_eq!(left, vec![3, 4]);
        assert!(judged.unusable[0].1.contains("differs"));
        assert!(judged.unusable[1].1.contains("unreadable"));
    }

    #[test]
    fn a_fresh_cluster_is_not_initialized() {
        let fresh = [
            (NodeId(0), Err(ParamsError::NotInitialized)),
            (NodeId(1), Err(ParamsError::NotInitialized)),
        ];
        assert!(matches!(
            judge_superblocks(3, &fresh),
            Err(KvError::Params(ParamsError::NotInitialized))
        ));
        // One formatted node of three: neither a store nor a fresh cluster.
        let partial = [
            (NodeId(0), Ok(params(64))),
            fresh[0].clone(),
            fresh[1].clone(),
        ];
        assert!(matches!(
            judge_superblocks(3, &partial),
            Err(KvError::Params(ParamsError::Disagree))
        ));
    }
}
