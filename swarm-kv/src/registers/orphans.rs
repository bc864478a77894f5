//! Adopting the register chunks of dead clients (SWARM §5.4; issue 11 items 1, 3).
//!
//! A chunk's claim word holds the incarnation token of the client that claimed it
//! ([`crate::registers::alloc`]), and that token is also the claim word of the
//! client's row in the client table ([`crate::membership::writer_ids`]) for as long as the client
//! is registered. A client registers its row before it claims any chunk, so a chunk
//! whose token is in **no** copy of the client table, read on a majority of nodes,
//! belongs to an incarnation that is no longer registered on a majority: it closed
//! (gave its row back, with no operation in flight), or its lease was killed and its
//! row taken over or released ([`crate::membership::writer_takeover`]), which by the lease argument
//! ([`crate::membership::lease`]) happens only after its last operation and its last register
//! reset (resets are started only under a valid lease, [`crate::registers::recycle::Recycler::step`])
//! posted. (A token still in one copy is treated as alive: conservative.)
//!
//! # Adoption
//!
//! A client that runs out of chunks reads both tables, and CASes each such chunk's
//! claim word from what it read (the dead token, or 0 where the dead claim never
//! landed) to its own token, on every node; it owns the chunk once a majority
//! answered with the value it expected (or its own token): claim-word ownership as in
//! [`crate::membership::claim`], so two adopters never both own a chunk. A loser hands its copies
//! back to the value it read.
//!
//! # The registers of an adopted chunk
//!
//! The dead client's pool and limbo died with it, and registers move between clients
//! through recycling (client U may retire a register of T's chunk when U's delete
//! unmaps it, and hold it in its limbo or, reset, in its pool). So "in a dead chunk"
//! does not mean "nobody's", and a dead client's registers lie in live clients' chunks
//! too. Adoption only gives the adopter the chunk's *never-used* registers (their
//! fresh-register pool died with the owner); every register, in adopted chunks and in
//! all others, is then judged and taken one by one, by its key header's holder tag and
//! a CAS on it, by the reclamation pass of [`crate::registers::limbo`], which runs adoption first
//! and has the argument. An owner that closed cleanly donated the never-used registers
//! of its chunks ([`crate::registers::give_back`]): their headers show a donated tag, so
//! they are judged donated, never fresh, and taken once like any other.

use std::collections::HashSet;

use swarm_core::quorum::{broadcast, broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, NodeId, OpStats};

use crate::KvError;
use crate::layout::NodeLayout;
use crate::membership::writer_takeover::STRAGGLER_NS;
use crate::registers::limbo::Registered;

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
    let nodes = layout.metadata_nodes(fabric.node_count());
    let bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| KvError::Unsupported("a chunk table larger than 4 GiB"))?;
    let rt = broadcast_until_among(
        fabric,
        stats,
        swarm_core::quorum::nodes(nodes),
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
            // A configuration change's hold is nobody's to adopt (`crate::placement::add_node`).
            !tokens.is_empty()
                && tokens.iter().all(|t| {
                    *t != mine && !registered.contains(t) && !crate::placement::is_hold_token(*t)
                })
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
    let nodes = layout.metadata_nodes(fabric.node_count());
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

/// Adopts every chunk whose claim token is registered in no copy of the client table
/// (`registered`, read on a majority; see the module docs) for the client whose token
/// is `mine`. Returns the chunks now owned by `mine`.
pub async fn adopt_orphan_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    registered: &Registered,
    mine: u64,
) -> Result<Vec<u64>, KvError> {
    let orphans = orphaned_chunks(fabric, stats, layout, &registered.tokens, mine).await?;
    let mut adopted = Vec::new();
    for (chunk, seen) in orphans {
        if adopt_chunk(fabric, stats, layout, chunk, &seen, mine).await? {
            tracing::info!(chunk, "adopted the register chunk of a dead client");
            adopted.push(chunk);
        }
    }
    Ok(adopted)
}

#[cfg(test)]
mod tests {
    use swarm_core::{FixedClock, MemCluster, MemFabric, block_on};

    use super::*;
    use crate::KvClient;
    use crate::test_support::{MS, connect, small_cluster};

    fn cluster() -> (MemCluster, NodeLayout) {
        small_cluster(200 * MS)
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

    /// A chunk held by a configuration change (an add-node's hold token, even) is
    /// nobody's to adopt, though no client row carries its token: a client that
    /// fills the cluster leaves its registers alone (the add fills it under the
    /// record it writes, `crate::placement::add_node`).
    #[test]
    fn a_chunk_held_by_a_configuration_change_is_never_adopted() {
        let (cluster, layout) = cluster();
        let registers = layout.params.registers;
        let per = u64::from(layout.params.chunk_registers);
        let hold = 0x1234_5678_9abc_def0u64;
        assert!(crate::placement::is_hold_token(hold));
        let fabric = cluster.client();
        let stats = OpStats::new();
        let held = layout.chunks() - 1;
        block_on(
            &fabric,
            swarm_core::quorum::broadcast(&fabric, &stats, swarm_core::quorum::nodes(3), 3, |_| {
                Ok(Batch::cas(layout.chunk_word(held), 0, hold))
            }),
        )
        .expect("held");
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
        assert_eq!(inserted, registers - per, "the held chunk stays unused");
        let rt = block_on(
            &fabric,
            swarm_core::quorum::broadcast(&fabric, &stats, swarm_core::quorum::nodes(3), 3, |_| {
                Ok(Batch::read(layout.chunk_word(held), 8))
            }),
        )
        .expect("read");
        for (node, completion) in rt.replies() {
            let word = u64::from_le_bytes(completion.read(0).unwrap().try_into().unwrap());
            assert_eq!(word, hold, "node {node} still holds it");
        }
    }
}
