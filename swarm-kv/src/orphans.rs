//! Adopting the register chunks of dead clients (SWARM §5.4; issue 11 items 1, 3).
//!
//! A chunk's claim word holds the incarnation token of the client that claimed it
//! ([`crate::register_alloc`]), and that token is also the claim word of the
//! client's row in the client table ([`crate::writer_ids`]) for as long as the client
//! is registered. A client registers its row before it claims any chunk, so a chunk
//! whose token is in **no** copy of the client table, read on a majority of nodes,
//! belongs to an incarnation that is no longer registered on a majority: it closed
//! (gave its row back, with no operation in flight), or its lease was killed and its
//! row taken over or released ([`crate::reclaim`]), which by the lease argument
//! ([`crate::lease`]) happens only after its last operation and its last register
//! reset (resets are started only under a valid lease, [`crate::recycle::Recycler::step`])
//! posted. (A token still in one copy is treated as alive: conservative.)
//!
//! # Adoption
//!
//! A client that runs out of chunks reads both tables, and CASes each such chunk's
//! claim word from what it read (the dead token, or 0 where the dead claim never
//! landed) to its own token, on every node; it owns the chunk once a majority
//! answered with the value it expected (or its own token): claim-word ownership as in
//! [`crate::claim`], so two adopters never both own a chunk. A loser hands its copies
//! back to the value it read.
//!
//! # Sorting the registers of an adopted chunk
//!
//! The dead client's pool and limbo died with it, and registers move between clients
//! through recycling (client U may retire a register of T's chunk when U's delete
//! unmaps it, and hold it in its limbo or, reset, in its pool). So "in a dead chunk"
//! does not mean "nobody's". The adopter reads each register's key header on a
//! majority of its replicas and takes a register only when every copy is **blank**
//! (length 0) with a holder mark of 0 (never reset) or of a token that is in no
//! client-table copy (reset and pooled by a client now gone). Such a register is held
//! by no live client:
//!
//! * a live client holds a register of another's chunk only after retiring it, which
//!   needs it to have been published (its key header was written to a majority of its
//!   replicas before the index mapped it, and a header copy only ever changes to
//!   another header or to a holder mark, never back to blank-and-unmarked), or after
//!   its own insert of a register from its pool, which is a register it reset
//!   (marked with its own, live, token on every replica);
//! * the index maps only registers whose key header is on a majority of replicas
//!   (and never changes it while mapped), so a mapped register is never blank on a
//!   majority read: live data is never taken.
//!
//! A taken register is *retired* into the adopter's recycler limbo
//! ([`crate::recycle`]): it is reset on every replica and pooled only after the
//! register grace, so any batch of the dead incarnation still in flight (a clean
//! close does not wait for its last resets to land) has landed before the register is
//! handed out. Registers holding a key, or marked by a live client, stay where they
//! are: live data, a live client's pool or limbo, or (not returned yet) the dead
//! client's own limbo and unpublished inserts, which cannot be told apart from a live
//! client's limbo without a per-register holder word written at retirement.

use std::collections::HashSet;

use swarm_core::quorum::{broadcast, broadcast_until, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, NodeId, OpStats};

use crate::layout::{CLIENT_ROW_BYTES, NodeLayout};
use crate::reclaim::STRAGGLER_NS;
use crate::{KvError, RegisterId};

/// What one adoption round found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Chunks now owned by the adopter.
    pub chunks: Vec<u64>,
    /// Registers of those chunks that nobody holds: to retire into the adopter's limbo.
    pub free: Vec<RegisterId>,
    /// Registers of those chunks left alone (a key, or a live client's mark).
    pub kept: u64,
}

/// Tokens of every client-table row copy on the nodes that answered (a majority at
/// least): a token absent from all of them is registered on no majority.
async fn registered_tokens<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
) -> Result<HashSet<u64>, KvError> {
    let nodes = fabric.node_count();
    let bytes = u32::try_from(u64::from(layout.params.writers) * CLIENT_ROW_BYTES)
        .map_err(|_| KvError::Unsupported("a client table larger than 4 GiB"))?;
    let rt = broadcast_until(
        fabric,
        stats,
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(layout.clients_at, bytes))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut tokens = HashSet::new();
    for (_, completion) in rt.replies() {
        let data = completion.read(0).unwrap_or_default();
        for row in data.chunks_exact(CLIENT_ROW_BYTES as usize) {
            tokens.insert(word(row, 0));
        }
    }
    tokens.remove(&0);
    Ok(tokens)
}

fn word(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// Chunks whose claim word, on the nodes that answered, shows a token other than
/// `mine` that is not registered; with the word seen on each node.
async fn orphaned_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    registered: &HashSet<u64>,
    mine: u64,
) -> Result<Vec<(u64, Vec<Option<u64>>)>, KvError> {
    let nodes = fabric.node_count();
    let bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| KvError::Unsupported("a chunk table larger than 4 GiB"))?;
    let rt = broadcast_until(
        fabric,
        stats,
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(layout.chunks_at, bytes))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let chunks = layout.chunks() as usize;
    let mut seen = vec![vec![None; nodes]; chunks];
    for (node, completion) in rt.replies() {
        let data = completion.read(0).unwrap_or_default();
        for (chunk, w) in data.chunks_exact(8).enumerate().take(chunks) {
            if let Some(slot) = seen[chunk].get_mut(node.index()) {
                *slot = Some(word(w, 0));
            }
        }
    }
    Ok(seen
        .into_iter()
        .enumerate()
        .filter(|(_, words)| {
            let tokens: Vec<u64> = words
                .iter()
                .flatten()
                .copied()
                .filter(|t| *t != 0)
                .collect();
            !tokens.is_empty() && tokens.iter().all(|t| *t != mine && !registered.contains(t))
        })
        .map(|(chunk, words)| (chunk as u64, words))
        .collect())
}

/// CASes the chunk word from what was seen on each node to `mine`; whether a
/// majority is now `mine` (otherwise the copies taken are handed back).
async fn adopt_chunk<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    chunk: u64,
    seen: &[Option<u64>],
    mine: u64,
) -> Result<bool, KvError> {
    let nodes = fabric.node_count();
    let addr = layout.chunk_word(chunk);
    let targets: Vec<NodeId> = node_ids(nodes)
        .filter(|n| seen.get(n.index()).copied().flatten().is_some())
        .collect();
    if targets.len() < majority(nodes) {
        return Ok(false);
    }
    let expected = |n: NodeId| seen.get(n.index()).copied().flatten().unwrap_or(0);
    let rt = broadcast(fabric, stats, targets.iter().copied(), targets.len(), |n| {
        Ok(Batch::cas(addr, expected(n), mine))
    })
    .await?;
    let won = rt
        .replies()
        .iter()
        .filter(|(n, c)| c.cas(0).is_some_and(|p| p == expected(*n) || p == mine))
        .count();
    if won >= majority(nodes) {
        return Ok(true);
    }
    for (node, _) in rt.replies() {
        give_back_one(fabric, addr, *node, mine, expected(*node));
    }
    Ok(false)
}

fn give_back_one<F: Fabric>(fabric: &F, addr: u64, node: NodeId, mine: u64, to: u64) {
    swarm_core::post_background(fabric, node, Batch::cas(addr, mine, to));
}

/// Whether key-header copies (a majority of the register's replicas) say that no
/// live client holds the register: every copy blank, with no mark or a dead one.
pub fn nobody_holds(copies: &[Vec<u8>], registered: &HashSet<u64>) -> bool {
    copies.iter().all(|copy| {
        let keyed = copy.get(0..4).is_none_or(|b| b.iter().any(|x| *x != 0));
        let mark = word(copy, 8);
        copy.len() >= 16 && !keyed && (mark == 0 || !registered.contains(&mark))
    })
}

/// Adopts every chunk of an unregistered incarnation (see the module docs) for the
/// client whose token is `mine`, and sorts their registers. `loc` gives a register's
/// replicas.
pub async fn adopt_orphans<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    mine: u64,
    loc: impl Fn(RegisterId) -> Option<swarm_core::RegisterLoc>,
) -> Result<Adopted, KvError> {
    let stats = OpStats::new();
    let registered = registered_tokens(fabric, &stats, layout).await?;
    let orphans = orphaned_chunks(fabric, &stats, layout, &registered, mine).await?;
    let mut out = Adopted::default();
    let per = u64::from(layout.params.chunk_registers);
    for (chunk, seen) in orphans {
        if !adopt_chunk(fabric, &stats, layout, chunk, &seen, mine).await? {
            continue;
        }
        tracing::info!(chunk, "adopted the register chunk of a dead client");
        out.chunks.push(chunk);
        let first = chunk * per;
        let end = (first + per).min(layout.params.registers);
        for register in first..end {
            let (Some(loc), Some(at)) = (loc(register), layout.key_header(register)) else {
                continue;
            };
            let len = 16u32;
            let rt = broadcast(
                fabric,
                &stats,
                loc.replicas.nodes().iter().copied(),
                loc.replicas.quorum(),
                |_| Ok(Batch::read(at, len)),
            )
            .await?;
            let copies: Vec<Vec<u8>> = rt
                .replies()
                .iter()
                .map(|(_, c)| c.read(0).unwrap_or_default().to_vec())
                .collect();
            if copies.len() >= loc.replicas.quorum() && nobody_holds(&copies, &registered) {
                out.free.push(register);
            } else {
                out.kept += 1;
            }
        }
    }
    if !out.chunks.is_empty() {
        tracing::info!(
            chunks = out.chunks.len(),
            free = out.free.len(),
            kept = out.kept,
            "adopted dead clients' chunks: free registers go through the grace"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use swarm_core::{FixedClock, MemCluster, MemFabric, block_on};

    use super::*;
    use crate::layout::ClusterParams;
    use crate::{KvClient, KvConfig};

    const MS: u64 = 1_000_000;

    fn cluster() -> (MemCluster, NodeLayout) {
        let params = ClusterParams {
            key_max: 16,
            value_max: 16,
            writers: 4,
            chunk_registers: 4,
            lease_ns: 200 * MS,
            lease_renew_ns: 20 * MS,
            max_op_ns: 50 * MS,
            cache_ttl_ns: 10 * MS,
            ..ClusterParams::default()
        }
        .for_node_size(1 << 20)
        .expect("a 1 MiB node fits a small cluster");
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, 1 << 20);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        (cluster, layout)
    }

    fn connect(cluster: &MemCluster, layout: NodeLayout) -> KvClient<MemFabric, FixedClock> {
        KvClient::connect(
            cluster.client(),
            FixedClock(1_000),
            layout,
            KvConfig::new(0, 1),
        )
        .expect("a free writer id")
    }

    fn get(client: &KvClient<MemFabric, FixedClock>, key: &str) -> Option<Vec<u8>> {
        block_on(client.fabric(), client.get(key.as_bytes(), &OpStats::new())).expect("a get")
    }

    /// A closed client's unused registers come back to a client that runs out of
    /// chunks; a live client's pool and every published key are left alone.
    #[test]
    fn a_gone_clients_unused_registers_are_adopted_and_nothing_live_is_taken() {
        let (cluster, layout) = cluster();
        let registers = layout.params.registers;
        let stats = OpStats::new();
        // A takes a chunk, publishes one key and goes away: 3 unused registers.
        let a = connect(&cluster, layout);
        block_on(a.fabric(), a.insert(b"a0", b"A", &stats)).expect("inserted");
        a.close();
        // B takes a chunk, publishes one key and stays: 3 registers in its pool.
        let b = connect(&cluster, layout);
        block_on(b.fabric(), b.insert(b"b0", b"B", &stats)).expect("inserted");
        // C fills the cluster.
        let c = connect(&cluster, layout);
        let mut inserted = 0u64;
        loop {
            let key = format!("c{inserted}");
            match block_on(c.fabric(), c.insert(key.as_bytes(), b"C", &stats)) {
                Ok(()) => inserted += 1,
                Err(KvError::RegistersFull { .. }) => break,
                Err(other) => panic!("insert {key}: {other}"),
            }
            assert!(inserted <= registers, "more keys than registers");
        }
        // Everything but A's key and B's chunk: A's three unused registers came back.
        assert_eq!(inserted, registers - 1 - 4, "registers: {registers}");
        assert_eq!(c.recycle_stats().recycled, 3);
        // B's pool was not taken: its inserts land in registers nobody else uses.
        for i in 0..3 {
            let key = format!("b{}", i + 1);
            block_on(b.fabric(), b.insert(key.as_bytes(), b"B", &stats)).expect("B's pool");
        }
        assert_eq!(
            get(&c, "a0").as_deref(),
            Some(&b"A"[..]),
            "A's key survives"
        );
        for i in 0..4 {
            let key = format!("b{i}");
            assert_eq!(get(&c, &key).as_deref(), Some(&b"B"[..]), "{key}");
        }
        for i in 0..inserted {
            let key = format!("c{i}");
            assert_eq!(get(&b, &key).as_deref(), Some(&b"C"[..]), "{key}");
        }
    }

    fn header(len: u32, mark: u64) -> Vec<u8> {
        let mut h = vec![0u8; 16];
        h[0..4].copy_from_slice(&len.to_le_bytes());
        h[8..16].copy_from_slice(&mark.to_le_bytes());
        h
    }

    #[test]
    fn only_blank_registers_with_no_live_mark_are_free() {
        let live: HashSet<u64> = [7].into_iter().collect();
        assert!(nobody_holds(&[header(0, 0), header(0, 0)], &live));
        assert!(
            nobody_holds(&[header(0, 9), header(0, 0)], &live),
            "dead mark"
        );
        assert!(!nobody_holds(&[header(0, 0), header(3, 0)], &live), "a key");
        assert!(
            !nobody_holds(&[header(0, 7), header(0, 0)], &live),
            "live mark"
        );
        assert!(!nobody_holds(&[vec![0; 8]], &live), "short read");
    }
}
