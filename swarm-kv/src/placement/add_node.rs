//! Adding a memory node to a running cluster (issue 46 step 2; ARCHITECTURE.md,
//! "Per-replica placement", and "Why adding a node is safe under arbitrary pauses").
//!
//! **What.** The new node (slot `n`, after the `n` the configuration lists) gets the
//! cluster's superblock; reserve chunks (`NodeLayout::reserve_chunks`: the keys the
//! add gives the cluster) get records in free slots, the new node's and those that
//! moves free: chunks no client holds get records that move one replica each onto
//! the new node (`plan`); configuration `e + 1` lists its incarnation and publishes
//! the records. The metadata group stays the nodes the cluster was created with
//! (`NodeLayout::metadata_nodes`): the new node holds registers only.
//!
//! **How**, under the repair lock (one configuration change at a time, and a
//! stopped tool's late records never land after a later one's):
//!
//! 1. read configuration `e`; write the superblock on the new node;
//! 2. claim the chunk word of every chunk the plan records on the metadata group
//!    with a *hold token* ([`is_hold_token`]: even, where clients' tokens are odd,
//!    so that no reclamation pass takes the chunk for a dead client's), planning
//!    again without any chunk whose hold is lost (a reserve chunk never takes the
//!    old slot of a move not made); once all are held, write their records at epoch
//!    `e + 1` on **every** node of the metadata group, moves first (a copy showing
//!    a reserve chunk in a freed slot shows the move that freed it);
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
//! the chunk back unless it follows epoch `e + 1`. A reserve chunk is claimed only
//! by a client whose table has its record (`crate::registers::alloc`), so following
//! `e + 1`, published after the record is on every metadata node. A slot a move
//! freed was never written (the moved chunk was unclaimed: a chunk word returns to
//! 0 only when the chunk goes back unused). A tool stopped anywhere holds its
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
    /// Chunks that moved one replica onto it.
    pub moved: Vec<u64>,
    /// Reserve chunks recorded (`NodeLayout::reserve_chunks`): the keys the add
    /// gave the cluster, `chunk_registers` each.
    pub reserve: Vec<u64>,
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
    let mut free = chunk_words(fabric, stats, layout, meta).await?;

    // Step 2: hold every chunk the plan records (a chunk a client claimed meanwhile
    // is left where it is, and the plan made again without it: a move's old slot
    // is free for a reserve chunk only if the move is made), then record them on
    // every metadata node.
    let mut held: Vec<u64> = Vec::new();
    let plan = loop {
        let plan = plan(layout, &table, &free, node, epoch32, options.chunks);
        let mut lost = false;
        for &(chunk, _) in plan.moves.iter().chain(&plan.reserve) {
            if held.contains(&chunk) {
                continue;
            }
            let won = claim(
                fabric,
                stats,
                meta,
                layout.chunk_word(chunk),
                token,
                layout.params.max_op_ns,
            )
            .await?;
            if won == Claim::Won {
                held.push(chunk);
            } else {
                free[chunk as usize] = false;
                lost = true;
            }
        }
        if !lost {
            break plan;
        }
    };
    for (chunk, record) in plan.moves.iter().chain(&plan.reserve) {
        super::write_record(fabric, stats, layout, meta, *chunk, record)
            .await
            .map_err(|e| AddNodeError::Read(e.to_string()))?;
    }
    let moved: Vec<u64> = plan.moves.iter().map(|(c, _)| *c).collect();
    let reserve: Vec<u64> = plan.reserve.iter().map(|(c, _)| *c).collect();

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
    tracing::info!(
        %node,
        epoch,
        moved = moved.len(),
        reserve = reserve.len(),
        "node added: configuration published"
    );

    // Step 4: every client either follows it or is fenced.
    let quiesce = options
        .quiesce_ns
        .unwrap_or_else(|| crate::repair::quiescence_ns(layout));
    swarm_core::sleep(fabric, quiesce).await;

    // Step 5: free the held chunks (recorded or not).
    for &chunk in &held {
        let word = layout.chunk_word(chunk);
        if let Err(error) = broadcast(fabric, stats, node_ids(meta), meta, |_| {
            Ok(Batch::cas(word, token, 0))
        })
        .await
        {
            tracing::warn!(chunk, %error, "cannot free a moved chunk on every node: it stays unused");
        }
    }
    Ok(AddNodeReport {
        node,
        epoch,
        moved,
        reserve,
    })
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

/// What an add records at its epoch: chunks that move one replica onto the new
/// node, and reserve chunks placed in free slots.
#[derive(Debug, Default)]
struct Plan {
    moves: Vec<(u64, PlacementRecord)>,
    reserve: Vec<(u64, PlacementRecord)>,
}

/// What an add of `node` records at `epoch` (chunks whose word `free` shows
/// unclaimed only). Reserve chunks first: each on the `r` nodes with the most free
/// slots (the new node's, slots no chunk uses on the others: a band's nodes outside
/// its groups, and slots moves freed), while `r` nodes have one. When they do not,
/// one chunk moves a replica onto the new node, giving up its spot on its most
/// loaded node, which frees a slot there; `limit` caps the moves. Once no reserve
/// chunk is left to record, moves go on up to the new node's fair share of the
/// replicas. From the last chunk down: clients' cursors spread over the whole
/// table, and the first chunks are the likeliest claimed by the time the tool runs.
fn plan(
    layout: &NodeLayout,
    table: &Placements,
    free: &[bool],
    node: NodeId,
    epoch: u32,
    limit: Option<u64>,
) -> Plan {
    let r = usize::from(layout.params.replicas);
    let chunks = layout.chunks();
    let nodes = node.index() + 1;
    let new = node.index() as u8;
    let is_free = |chunk: u64| free.get(chunk as usize).copied().unwrap_or(false);
    let spots = |chunk: u64| -> Vec<Spot> {
        match table.record(chunk) {
            Some(record) => record.replicas.clone(),
            None if layout.is_reserve(chunk) => Vec::new(),
            None => computed_spots(layout, chunk),
        }
    };
    // Per node, its slots no chunk uses (highest first: `pop` takes the lowest).
    let mut used = vec![vec![false; layout.slots() as usize]; nodes];
    let mut replicas = 0usize;
    for chunk in 0..chunks {
        for spot in spots(chunk) {
            replicas += 1;
            if let Some(slot) = used
                .get_mut(usize::from(spot.node))
                .and_then(|u| u.get_mut(spot.slot as usize))
            {
                *slot = true;
            }
        }
    }
    let mut open: Vec<Vec<u32>> = used
        .iter()
        .map(|u| {
            (0..u.len() as u32)
                .rev()
                .filter(|&s| !u[s as usize])
                .collect()
        })
        .collect();
    let on_new = |out: &Plan| {
        out.moves.len()
            + out
                .reserve
                .iter()
                .filter(|(_, rec)| rec.replicas.iter().any(|s| s.node == new))
                .count()
    };
    let preexisting_on_new = used[node.index()].iter().filter(|u| **u).count();
    let mut reserve = (layout.computed_chunks()..chunks)
        .filter(|&c| table.record(c).is_none() && is_free(c))
        .peekable();
    let mut movable = (0..chunks)
        .rev()
        .filter(|&c| is_free(c) && !spots(c).is_empty() && spots(c).iter().all(|s| s.node != new));
    let mut moves_left = limit.unwrap_or(u64::MAX);
    let mut out = Plan::default();
    loop {
        if let Some(&chunk) = reserve.peek() {
            let mut by_room: Vec<usize> = (0..nodes).collect();
            by_room.sort_by_key(|&n| (std::cmp::Reverse(open[n].len()), n));
            if by_room.len() >= r && by_room[..r].iter().all(|&n| !open[n].is_empty()) {
                let mut chosen: Vec<usize> = by_room[..r].to_vec();
                chosen.sort_unstable();
                let replicas_of: Vec<Spot> = chosen
                    .iter()
                    .map(|&n| Spot {
                        node: n as u8,
                        slot: open[n].pop().unwrap_or_default(),
                    })
                    .collect();
                replicas += r;
                out.reserve.push((chunk, settled(epoch, replicas_of)));
                reserve.next();
                continue;
            }
        }
        let share = replicas / nodes;
        let wanted = reserve.peek().is_some() || preexisting_on_new + on_new(&out) < share;
        if moves_left == 0 || open[node.index()].is_empty() || !wanted {
            break;
        }
        let Some(chunk) = movable.next() else { break };
        let mut moved = spots(chunk);
        let heaviest = (0..moved.len())
            .min_by_key(|&i| {
                open.get(usize::from(moved[i].node))
                    .map_or(usize::MAX, Vec::len)
            })
            .unwrap_or(0);
        let given_up = moved[heaviest];
        if let Some(slots) = open.get_mut(usize::from(given_up.node)) {
            slots.push(given_up.slot);
            slots.sort_unstable_by(|a, b| b.cmp(a));
        }
        moved[heaviest] = Spot {
            node: new,
            slot: open[node.index()].pop().unwrap_or_default(),
        };
        out.moves.push((chunk, settled(epoch, moved)));
        moves_left -= 1;
    }
    out
}

/// A settled record.
fn settled(epoch: u32, replicas: Vec<Spot>) -> PlacementRecord {
    PlacementRecord {
        epoch,
        replicas,
        destination: None,
    }
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

    /// `plan`'s records as a table copy, adopted by a client of `nodes` nodes at
    /// `epoch`: they pass the clients' checks.
    fn adopted(l: &NodeLayout, plan: &Plan, nodes: usize, epoch: u64) -> Placements {
        let mut table = vec![0u8; l.chunks() as usize * super::super::RECORD_BYTES];
        for (chunk, record) in plan.moves.iter().chain(&plan.reserve) {
            let at = *chunk as usize * super::super::RECORD_BYTES;
            table[at..at + super::super::RECORD_BYTES].copy_from_slice(&record.encode().unwrap());
        }
        Placements::adopt(l, nodes, &[(NodeId(0), &table)], epoch).unwrap()
    }

    /// Without reserve chunks the plan moves free chunks only, one replica each,
    /// onto distinct free slots of the new node, up to its fair share, and the
    /// table it gives passes the clients' checks.
    #[test]
    fn a_plan_moves_free_chunks_onto_distinct_slots_up_to_a_fair_share() {
        let l = layout();
        assert_eq!(l.reserve_chunks(), 0);
        let mut free = vec![true; l.chunks() as usize];
        free[29] = false;
        let plan = plan(&l, &Placements::computed(), &free, NodeId(3), 2, None);
        // 30 chunks of 3 replicas over 4 nodes: 22 on the new one.
        assert_eq!(plan.moves.len(), 22);
        assert!(plan.reserve.is_empty());
        assert!(plan.moves.iter().all(|(c, _)| *c != 29));
        let mut slots: Vec<u32> = Vec::new();
        for (_, record) in &plan.moves {
            let on_new: Vec<&Spot> = record.replicas.iter().filter(|s| s.node == 3).collect();
            assert_eq!(on_new.len(), 1);
            slots.push(on_new[0].slot);
        }
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), plan.moves.len(), "distinct slots");
        assert_eq!(adopted(&l, &plan, 4, 2).recorded(), 22);
        let limited = super::plan(&l, &Placements::computed(), &free, NodeId(3), 2, Some(5));
        assert_eq!(limited.moves.len(), 5);
    }

    /// With room to grow, an add of a fourth node to three of three replicas fills
    /// every slot of every node: two moves free two old slots for each reserve
    /// chunk, which takes them and one of the new node's. The cluster then holds a
    /// third more chunks, each on three distinct nodes, the table passes the
    /// clients' checks, and a second add (a fifth node) records more.
    #[test]
    fn a_plan_records_reserve_chunks_in_the_slots_an_add_frees() {
        let l = NodeLayout::new(ClusterParams {
            max_nodes: 6,
            ..layout().params
        })
        .unwrap();
        assert_eq!((l.computed_chunks(), l.reserve_chunks()), (30, 30));
        let free = vec![true; l.chunks() as usize];
        let first = plan(&l, &Placements::computed(), &free, NodeId(3), 2, None);
        assert_eq!((first.moves.len(), first.reserve.len()), (20, 10));
        for (chunk, record) in &first.reserve {
            assert!(l.is_reserve(*chunk));
            let mut nodes: Vec<u8> = record.replicas.iter().map(|s| s.node).collect();
            nodes.dedup();
            assert_eq!(nodes.len(), 3, "distinct nodes");
        }
        let table = adopted(&l, &first, 4, 2);
        assert_eq!(table.capacity(&l), 40 * 4);
        // Every slot of every node is used once.
        let mut used = std::collections::HashSet::new();
        for chunk in 0..l.chunks() {
            let spots = match table.record(chunk) {
                Some(r) => r.replicas.clone(),
                None if l.is_reserve(chunk) => continue,
                None => computed_spots(&l, chunk),
            };
            for spot in spots {
                assert!(used.insert((spot.node, spot.slot)), "{spot:?} twice");
            }
        }
        assert_eq!(used.len(), 4 * 30);
        // A fifth node: 50 chunks fit 5 nodes of 30 slots.
        let mut free = free;
        let mut second_table = vec![0u8; l.chunks() as usize * super::super::RECORD_BYTES];
        for (chunk, record) in first.moves.iter().chain(&first.reserve) {
            let at = *chunk as usize * super::super::RECORD_BYTES;
            second_table[at..at + super::super::RECORD_BYTES]
                .copy_from_slice(&record.encode().unwrap());
        }
        free[0] = false; // claimed by a client: stays where it is
        let second = plan(&l, &table, &free, NodeId(4), 3, None);
        assert!(second.moves.iter().all(|(c, _)| *c != 0));
        let mut merged = second_table;
        for (chunk, record) in second.moves.iter().chain(&second.reserve) {
            let at = *chunk as usize * super::super::RECORD_BYTES;
            merged[at..at + super::super::RECORD_BYTES].copy_from_slice(&record.encode().unwrap());
        }
        let after = Placements::adopt(&l, 5, &[(NodeId(0), &merged)], 3).unwrap();
        assert_eq!(after.capacity(&l), 50 * 4);
    }
}
