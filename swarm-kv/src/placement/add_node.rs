//! Adding a memory node to a running cluster (issue 46 step 2; ARCHITECTURE.md,
//! "Per-replica placement", and "Why adding a node is safe under arbitrary pauses").
//!
//! **What.** The new node (slot `n`, after the `n` the configuration lists) gets the
//! cluster's superblock; chunks no client holds get placement records that move one
//! replica each onto it; configuration `e + 1` lists its incarnation and publishes
//! the records. The metadata group stays the nodes the cluster was created with
//! (`NodeLayout::metadata_nodes`): the new node holds registers only.
//!
//! **How**, under the repair lock (one configuration change at a time, and a
//! stopped tool's late records never land after a later one's):
//!
//! 1. read configuration `e`; write the superblock on the new node;
//! 2. per chunk to move, claim its chunk word on the metadata group with a
//!    *hold token* ([`is_hold_token`]: even, where clients' tokens are odd, so that
//!    no reclamation pass takes the chunk for a dead client's), and only if that
//!    claim wins, write its record at epoch `e + 1` on **every** node of the
//!    metadata group;
//! 3. write configuration `e + 1` (the members, and the new node's incarnation) on
//!    every node of the metadata group;
//! 4. wait a quiescence (`crate::repair::quiescence_ns`: a lease observer's wait,
//!    an operation deadline, the delivery margin);
//! 5. free the chunk words it holds (its token back to 0).
//!
//! **Why a chunk is never filled under two placements.** Writers: a client fills a
//! chunk only after winning its claim, whose batch reads the chunk's record after
//! the CAS on each node (`crate::membership::claim::claim_reading`), and only if
//! the newest copy among the nodes it won is the record it follows
//! (`crate::registers::alloc`). The tool's claim won a majority `T`, the client's a
//! majority `Q`; on a node of `Q ∩ T` the client's copy went from 0 to its token
//! after the tool's token left it (while the tool's token is there, the client's
//! CAS fails, and the client's own won copy stays until it closes), so after the
//! tool's release there, which follows the record's write there (step 2 waits
//! for every node before step 5 starts). So the client reads the new record,
//! however long it was stopped between reading its table and claiming, and gives
//! the chunk back unless it follows epoch `e + 1`. A tool stopped anywhere holds its
//! chunks: nobody fills them. Readers: a register of a moved chunk is mapped in the
//! index only after step 5, by a client following `e + 1`. An operation that reads
//! it started with a valid lease (`crate::client::begin`) after step 5, so after a
//! lease renewal posted after step 3, which read epoch `e + 1` on a majority; the
//! operation starts only once the client follows what its renewals saw
//! (`KvClient::begin_op`). An operation that started before counts nothing after
//! its deadline, which ends before step 4 does. So no reader locates a moved
//! register where it was computed.
//!
//! **Stopped or failed.** A tool that fails before step 3 gives the lock back and
//! leaves its held chunks held (and its records at `e + 1`, never published, or
//! published by a later change for chunks nobody can claim): chunks lost to the
//! cluster, never a placement in doubt. A later add counts their spots as taken.

use std::collections::HashMap;

use swarm_core::fabric::Batch;
use swarm_core::quorum::{broadcast, nodes as node_ids};
use swarm_core::{Fabric, FabricError, NodeId, OpStats};
use xxhash_rust::xxh3::xxh3_64;

use super::{PlacementRecord, Placements, Spot};
use crate::configuration::{CONFIG_AT, Configuration};
use crate::layout::{NodeLayout, SUPERBLOCK_AT};
use crate::membership::claim::{Claim, claim};
use crate::membership::owner_process::OwnerLiveness;
use crate::repair::lock;

/// Options of an add-node (`ShmStore::add_node`).
#[derive(Clone, Copy, Debug, Default)]
pub struct AddNodeOptions {
    /// Wait this long between publishing the configuration and freeing the moved
    /// chunks instead of `crate::repair::quiescence_ns` (tests; never shorter in
    /// production).
    pub quiesce_ns: Option<u64>,
    /// Chunks to move onto the new node at most (`None`: its fair share, the
    /// cluster's chunk replicas over its nodes).
    pub chunks: Option<u64>,
    /// How a repair lock held by another process is judged (`crate::repair::lock`).
    pub liveness: OwnerLiveness,
}

/// What an add-node (`ShmStore::add_node`) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddNodeReport {
    /// The node added.
    pub node: NodeId,
    /// The configuration epoch that lists it.
    pub epoch: u64,
    /// Chunks recorded with a replica on it.
    pub moved: Vec<u64>,
}

/// Why an add-node (`ShmStore::add_node`) failed; the cluster keeps serving with the
/// nodes it had.
#[derive(Debug, thiserror::Error)]
pub enum AddNodeError {
    /// The cluster has no placement table (created before superblock version 10).
    #[error(
        "this cluster has no placement table (made by a build before superblock version 10): nodes can be added only to a cluster made by `swarm init` of this build"
    )]
    NoTable,
    /// The node to add is not the next slot after the configuration's members.
    #[error(
        "node {node} is not the next node of the cluster ({members} are members): add node {members}"
    )]
    NotNext {
        /// The node asked for.
        node: NodeId,
        /// The members the configuration lists.
        members: usize,
    },
    /// The cluster already has the most nodes a cluster can have.
    #[error("the cluster has {0} nodes, the most a cluster can have")]
    Full(usize),
    /// Another repair or add-node holds the repair lock, or a node of the metadata
    /// group failed while it was taken.
    #[error(transparent)]
    Lock(#[from] crate::repair::RepairError),
    /// A node of the metadata group, or the new node, did not answer.
    #[error(
        "a memory node did not answer ({0}): bring it back and run add-node again (the chunks it held stay unused)"
    )]
    Fabric(#[from] FabricError),
    /// The configuration or the placement table could not be read.
    #[error("cannot read the cluster's configuration or placement table: {0}")]
    Read(String),
}

/// Whether `token` in a chunk word is a configuration change's hold ([`add_node`]),
/// never a client's: client tokens are odd (`crate::client::connect`), holds even
/// and nonzero. A reclamation pass never takes such a chunk for a dead client's.
pub(crate) fn is_hold_token(token: u64) -> bool {
    token != 0 && token & 1 == 0
}

/// A hold token for the change whose repair-lock token is `lock` (even, nonzero).
fn hold_token(lock: u64) -> u64 {
    (xxh3_64(&lock.to_le_bytes()) & !1).max(2)
}

/// Adds node `node`, whose memory `fabric` reaches with incarnation `incarnation`,
/// to the cluster laid out by `layout` (module docs). Clients keep running; they
/// follow the new configuration at their next lease renewal.
pub async fn add_node<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    node: NodeId,
    incarnation: u64,
    options: AddNodeOptions,
) -> Result<AddNodeReport, AddNodeError> {
    if layout.placements_at.is_none() {
        return Err(AddNodeError::NoTable);
    }
    let stats = OpStats::new();
    let meta = layout.metadata_nodes(fabric.node_count());
    let meta_nodes: Vec<NodeId> = node_ids(meta).collect();
    let held = lock::take(fabric, &stats, &meta_nodes, options.liveness, false).await?;
    let result = add_locked(
        fabric,
        &stats,
        layout,
        meta,
        node,
        incarnation,
        options,
        hold_token(held.token()),
    )
    .await;
    lock::give_back(fabric, &stats, &meta_nodes, &held).await;
    drop(held);
    result
}

#[allow(clippy::too_many_arguments)]
async fn add_locked<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    meta: usize,
    node: NodeId,
    incarnation: u64,
    options: AddNodeOptions,
    token: u64,
) -> Result<AddNodeReport, AddNodeError> {
    let straggler_ns = swarm_core::ProtocolConfig::default().slow_after_ns;
    // Step 1: the configuration, from the whole metadata group.
    let config =
        crate::repair::read_configuration_within(fabric, stats, meta, meta, straggler_ns).await?;
    let members = config.incarnations.len();
    if node.index() != members {
        return Err(AddNodeError::NotNext { node, members });
    }
    if members >= swarm_core::MAX_CLUSTER_NODES {
        return Err(AddNodeError::Full(members));
    }
    let epoch = config.epoch + 1;
    let epoch32 = u32::try_from(epoch).map_err(|_| AddNodeError::Read("epoch overflow".into()))?;
    broadcast(fabric, stats, [node], 1, |_| {
        Ok(Batch::write(SUPERBLOCK_AT, layout.params.encode().to_vec()))
    })
    .await?;
    // Every record of any epoch: a stopped add's unpublished ones hold their spots.
    let table = super::read(fabric, stats, layout, meta, u64::MAX, straggler_ns)
        .await
        .map_err(|e| AddNodeError::Read(e.to_string()))?;
    let moves = plan(
        layout,
        &table,
        &chunk_words(fabric, stats, layout, meta).await?,
        node,
        epoch32,
        options.chunks,
    );

    // Step 2: hold each chunk, then record it on every metadata node.
    let mut moved = Vec::new();
    for (chunk, record) in moves {
        let won = claim(
            fabric,
            stats,
            meta,
            layout.chunk_word(chunk),
            token,
            layout.params.max_op_ns,
        )
        .await?;
        if won != Claim::Won {
            continue; // A client claimed it meanwhile: it stays where it is.
        }
        moved.push(chunk);
        super::write_record(fabric, stats, layout, meta, chunk, &record)
            .await
            .map_err(|e| AddNodeError::Read(e.to_string()))?;
    }

    // Step 3: publish.
    let mut next = Configuration {
        epoch,
        incarnations: config.incarnations.clone(),
        repairing: config.repairing,
    };
    next.incarnations.push(incarnation);
    broadcast(fabric, stats, node_ids(meta), meta, |_| {
        Ok(Batch::write(CONFIG_AT, next.encode()))
    })
    .await?;
    tracing::info!(%node, epoch, moved = moved.len(), "node added: configuration published");

    // Step 4: every client either follows it or is fenced.
    let quiesce = options
        .quiesce_ns
        .unwrap_or_else(|| crate::repair::quiescence_ns(layout));
    swarm_core::sleep(fabric, quiesce).await;

    // Step 5: free the moved chunks.
    for &chunk in &moved {
        let word = layout.chunk_word(chunk);
        if let Err(error) = broadcast(fabric, stats, node_ids(meta), meta, |_| {
            Ok(Batch::cas(word, token, 0))
        })
        .await
        {
            tracing::warn!(chunk, %error, "cannot free a moved chunk on every node: it stays unused");
        }
    }
    Ok(AddNodeReport { node, epoch, moved })
}

/// Each chunk's word on every node of the metadata group that answers (a
/// majority at least): which chunks look unclaimed.
async fn chunk_words<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    meta: usize,
) -> Result<Vec<bool>, AddNodeError> {
    let bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| AddNodeError::Read("a chunk table larger than 4 GiB".into()))?;
    let rt = broadcast(
        fabric,
        stats,
        node_ids(meta),
        swarm_core::quorum::majority(meta),
        |_| Ok(Batch::read(layout.chunks_at, bytes)),
    )
    .await?;
    let mut free = vec![true; layout.chunks() as usize];
    for (_, completion) in rt.replies() {
        let table = completion.read(0).unwrap_or_default();
        for (flag, word) in free.iter_mut().zip(table.chunks_exact(8)) {
            *flag &= word.iter().all(|b| *b == 0);
        }
    }
    Ok(free)
}

/// Which unclaimed chunks move one replica onto `node`, and their records at
/// `epoch`: up to the new node's fair share (`limit` if smaller), each giving up
/// its spot on its most loaded node, on the new node's free slots in order.
fn plan(
    layout: &NodeLayout,
    table: &Placements,
    free: &[bool],
    node: NodeId,
    epoch: u32,
    limit: Option<u64>,
) -> Vec<(u64, PlacementRecord)> {
    let r = u64::from(layout.params.replicas);
    let chunks = layout.chunks();
    let new = node.index() as u8;
    let spots = |chunk: u64| -> Vec<Spot> {
        match table.record(chunk) {
            Some(record) => record.replicas.clone(),
            None => computed_spots(layout, chunk),
        }
    };
    let mut load: HashMap<u8, u64> = HashMap::new();
    let mut taken: Vec<u32> = Vec::new();
    for chunk in 0..chunks {
        for spot in spots(chunk) {
            *load.entry(spot.node).or_default() += 1;
            if spot.node == new {
                taken.push(spot.slot);
            }
        }
    }
    let nodes = node.index() as u64 + 1;
    let share = (chunks * r / nodes).min(limit.unwrap_or(u64::MAX));
    let mut slots = (0..layout.slots() as u32).filter(|s| !taken.contains(s));
    let mut out = Vec::new();
    // From the last chunk down: clients' cursors spread over the whole table, and
    // the first chunks are the likeliest claimed by the time the tool runs.
    for chunk in (0..chunks).rev() {
        if out.len() as u64 >= share.saturating_sub(load.get(&new).copied().unwrap_or(0)) {
            break;
        }
        if !free.get(chunk as usize).copied().unwrap_or(false) {
            continue;
        }
        let mut replicas = spots(chunk);
        if replicas.iter().any(|s| s.node == new) || replicas.is_empty() {
            continue;
        }
        let Some(slot) = slots.next() else { break };
        let heaviest = (0..replicas.len())
            .max_by_key(|&i| load.get(&replicas[i].node).copied().unwrap_or(0))
            .unwrap_or(0);
        *load.entry(replicas[heaviest].node).or_default() -= 1;
        replicas[heaviest] = Spot { node: new, slot };
        out.push((
            chunk,
            PlacementRecord {
                epoch,
                replicas,
                destination: None,
            },
        ));
    }
    out
}

/// Chunk `chunk`'s computed spots (its replica group's nodes, at its band).
fn computed_spots(layout: &NodeLayout, chunk: u64) -> Vec<Spot> {
    let g = layout.params.groups();
    let band = chunk / g;
    (0..usize::from(layout.params.placement_nodes))
        .filter(|&n| layout.chunk_on(chunk, n))
        .map(|n| Spot {
            node: n as u8,
            slot: band as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ClusterParams;

    fn layout() -> NodeLayout {
        NodeLayout::new(ClusterParams {
            placement_nodes: 3,
            placement_table: true,
            chunk_registers: 4,
            registers: 4 * 30,
            key_max: 8,
            value_max: 8,
            ..ClusterParams::default()
        })
        .unwrap()
    }

    /// Holds are told apart from clients' tokens, which are odd.
    #[test]
    fn hold_tokens_are_even_and_never_zero() {
        for lock in [0u64, 1, 2, u64::MAX, 0x8000_0000_1234_5678] {
            assert!(is_hold_token(hold_token(lock)));
        }
        assert!(!is_hold_token(0) && !is_hold_token(0xabc | 1));
    }

    /// The plan moves free chunks only, one replica each, onto distinct free slots
    /// of the new node, up to its fair share, and the table it gives passes the
    /// clients' checks.
    #[test]
    fn a_plan_moves_free_chunks_onto_distinct_slots_up_to_a_fair_share() {
        let l = layout();
        let mut free = vec![true; l.chunks() as usize];
        free[29] = false;
        let moves = plan(&l, &Placements::computed(), &free, NodeId(3), 2, None);
        // 30 chunks of 3 replicas over 4 nodes: 22 on the new one.
        assert_eq!(moves.len(), 22);
        assert!(moves.iter().all(|(c, _)| *c != 29));
        let mut slots: Vec<u32> = Vec::new();
        let mut table = vec![0u8; l.chunks() as usize * super::super::RECORD_BYTES];
        for (chunk, record) in &moves {
            let on_new: Vec<&Spot> = record.replicas.iter().filter(|s| s.node == 3).collect();
            assert_eq!(on_new.len(), 1);
            slots.push(on_new[0].slot);
            let at = *chunk as usize * super::super::RECORD_BYTES;
            table[at..at + super::super::RECORD_BYTES].copy_from_slice(&record.encode().unwrap());
        }
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), moves.len(), "distinct slots");
        let adopted = Placements::adopt(&l, 4, &[(NodeId(0), &table)], 2).unwrap();
        assert_eq!(adopted.recorded(), 22);
        let limited = plan(&l, &Placements::computed(), &free, NodeId(3), 2, Some(5));
        assert_eq!(limited.len(), 5);
    }
}
