//! Giving back, on a clean close, the registers a client never used (issue 43 §5).
//!
//! A client claims a whole chunk of registers ([`crate::registers::alloc`]) when its pool
//! is empty, and a one-shot client (`swarm put`) uses one register of it. Left
//! behind, the rest came back only by adoption: once every chunk was claimed, a
//! client that ran dry adopted the gone clients' chunks and took their blank
//! registers into its limbo, to hand them out a register grace later
//! ([`crate::registers::limbo`], rules 3 and 4), holding its writer id all that time. A
//! cluster with room for 44,288 keys ran out of writer ids after about 180 one-shot
//! puts. But a register that was never handed out needs no grace: nothing can name it.
//! So [`crate::KvClient::close`] gives back, before it gives its writer id back:
//!
//! * **whole chunks** none of whose registers it handed out: their claim word goes
//!   back from its token to 0 on every node (by CAS, [`release_chunks`]), and the next
//!   client that needs a chunk claims them as fresh ones. Only chunks the client
//!   *claimed* (a CAS from 0 to its token on a majority), never adopted ones: their
//!   registers were never handed out by anybody, since the claim word of a chunk is
//!   0 on a majority only while no client owns it, a chunk's fresh registers are
//!   handed out only by its owner ([`crate::registers::alloc`]) or, once adopted, taken
//!   one by one by CAS on their key headers ([`crate::registers::limbo`], rule 4), and a
//!   word back at 0 is one this client released with nothing handed out. A copy
//!   that still holds another token (a loser's claim, a stale copy) is left alone:
//!   the CAS expects this client's token, so claim-word ownership
//!   ([`crate::membership::claim`]) is untouched and at most one client owns the chunk;
//! * **never-handed-out registers of chunks it partly used, and its recycled pool**:
//!   donated ([`donate`]), their key-header word 0 CASed on every replica to
//!   `(0, donated_tag(M))` from what this client left there: `(0, 0)` for a register
//!   never used (`M`'s ticks 0), `(0, its tag)` for one its reset pooled with the life
//!   marker `M`. That marker was donated by no reset (a donating reset pools
//!   nothing), and a never-used register is donated once before its first reset, so
//!   the word is this donation's alone (`crate::registers::limbo`, "Exactly one taker"). A client that runs dry takes
//!   them after the delivery margin, not a grace ([`crate::registers::limbo`], rule 3,
//!   `Verdict::Donated`). The chunks stay claimed: the registers of them that hold
//!   keys are used.
//!
//! What is not given back: the limbo (retired registers whose grace has not passed)
//! stays tagged with the client's tag for reclaimers, as before (a register a
//! location-cache entry or an operation may still name needs its grace); so do the
//! registers whose donation reached too few replicas (they read as a gone client's
//! pool, rule 3, and come back after a grace).
//!
//! # Why a donation without a grace is safe here
//!
//! Rule 3 takes a donated register after the delivery margin because its donor reset
//! it a grace after its last life ended: no cache entry or operation names it, and
//! only the donation itself may still be on its way to a replica. The same holds of
//! what a closing client donates:
//!
//! * a **never-handed-out** register was never written by an insert, so never
//!   published in the index, never in a location cache, never the target of any
//!   operation, a retire mark or a reset: its words are still the zeros of a new
//!   cluster (nobody else hands out a register of a chunk this client owns, see
//!   above). Nothing but this donation CASes them;
//! * a **pooled** register was reset on every replica, a grace after its last life
//!   ended, and was not handed out since (the client is closing, no operation is in
//!   flight): exactly what a donation at reset time gives away.
//!
//! A donation CAS that lands late is harmless: it expects `(0, 0)` or `(0, this
//! client's tag)`, and neither comes back once the register was taken and reset by
//! anyone else (a reset writes the resetter's tag, an insert a non-zero key length,
//! and this client's tag belongs to this incarnation alone, which resets nothing more).
//! The donation is posted under a valid lease (like every take and reset: the lease
//! argument of [`crate::membership::lease`] then says it lands before any reclaimer,
//! which waits [`crate::registers::limbo::settle_ns`] after reading the client table,
//! judges the register), only while every node is in service and no repair is
//! announced (as donations at reset time), and before the close gives the writer id
//! back.
//!
//! # Adoption of a chunk whose rest was donated
//!
//! Once the client is gone its partly used chunks are orphans, and a client that runs
//! dry adopts them ([`crate::registers::orphans`]). Adoption hands out no register as
//! fresh ([`crate::registers::alloc::RegisterAllocator::adopt`]): every register is judged
//! by its key-header copies and taken by CAS, one taker each ([`crate::registers::limbo`]).
//! A donated register is `(0, d)`, `d` a donated tag, on its copies, so `Verdict::Donated` (or
//! `Verdict::Pool` where the donation reached only some copies), never
//! `Verdict::Fresh`, which needs every copy `(0, 0)`; a register taken before the
//! adoption shows its taker's tag. So no register is handed out twice.
//!
//! # Bounded, best effort
//!
//! Everything runs under one deadline (the caller's `OpStats`, `max_op_ns`), one
//! batch of up to [`swarm_core::fabric::MAX_BATCH_OPS`] CASes per node and roundtrip,
//! and never fails the close: what did not reach a majority stays as it was (a chunk
//! its owner's token holds is adopted once the owner is gone; a register without
//! the donation on every copy comes back through rule 3 or 4, after a grace).

use swarm_core::fabric::MAX_BATCH_OPS;
use swarm_core::quorum::majority;
use swarm_core::{Batch, Fabric, NodeId, OpStats, RegisterLoc, Roundtrip};

use crate::layout::NodeLayout;
use swarm_core::encoding::Tsp;

use crate::registers::limbo::{donated_tag, header_word};
use crate::{KvError, RegisterId};

/// What a close gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GivenBack {
    /// Chunks whose claim word went back to 0 on a majority of nodes.
    pub chunks: u64,
    /// Registers donated on every replica.
    pub donated: u64,
    /// Registers whose donation reached some replicas only, or none (left as they
    /// were where it did not land; see the module docs).
    pub incomplete: u64,
}

/// Posts one batch per node and waits, up to the deadline armed on `stats`, for every
/// one of them; the replies.
async fn round<'a, F: Fabric>(
    fabric: &'a F,
    stats: &'a OpStats,
    batches: Vec<(NodeId, Batch)>,
) -> Result<Roundtrip<'a, F>, KvError> {
    let mut rt = Roundtrip::start(fabric, stats);
    for (node, batch) in batches {
        rt.post(node, batch)?;
    }
    // The deadline bounds the wait (a node down never answers); what answered is
    // what the caller counts.
    let deadline = stats.deadline().unwrap_or_else(|| {
        fabric
            .now()
            .saturating_add(crate::membership::claim::STRAGGLER_NS)
    });
    let _ = rt.settle_until(deadline).await;
    Ok(rt)
}

/// Sets the claim word of each of `chunks` back from `token` to 0 on every node (see
/// the module docs). Returns how many went back on a majority.
pub async fn release_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    chunks: &[u64],
    token: u64,
) -> Result<u64, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let mut released = 0;
    for group in chunks.chunks(MAX_BATCH_OPS) {
        let mut batches = Vec::with_capacity(nodes);
        for node in swarm_core::quorum::nodes(nodes) {
            let mut batch = Batch::new();
            for chunk in group {
                batch.push(swarm_core::fabric::Op::Cas {
                    addr: layout.chunk_word(*chunk),
                    expected: token,
                    new: 0,
                })?;
            }
            batches.push((node, batch));
        }
        let rt = round(fabric, stats, batches).await?;
        for (i, chunk) in group.iter().enumerate() {
            // A copy that held the token (now 0) or was 0 already (the claim
            // never landed there).
            let free = rt
                .replies()
                .iter()
                .filter(|(_, c)| c.cas(i).is_some_and(|p| p == token || p == 0))
                .count();
            if free >= majority(nodes) {
                released += 1;
            } else {
                tracing::debug!(
                    chunk,
                    free,
                    "closing: a chunk's claim went back on too few nodes; it is adopted once this client is gone"
                );
            }
        }
    }
    Ok(released)
}

/// The key-header word 0 that donates a register whose life marker is `marker`
/// (`None`: never used): `(0, donated_tag(its ticks))`, one word per donation
/// ([`crate::registers::limbo::donated_tag`]).
pub fn donation_word(marker: Option<Tsp>) -> u64 {
    header_word(0, donated_tag(marker.map_or(0, |m| m.ts().ticks())))
}

/// Donates `registers` (with the key-header word 0 this client left on their
/// replicas, `(0, 0)` or `(0, its tag)`, and the life marker its reset installed,
/// `None` for a register never used) by CAS to [`donation_word`] on every replica
/// `loc` names (see the module docs). Returns `(donated on every replica, the
/// others)`.
pub async fn donate<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    registers: &[(RegisterId, u64, Option<Tsp>)],
    loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
) -> Result<(u64, u64), KvError> {
    let (mut complete, mut incomplete) = (0u64, 0u64);
    // A register has at most one replica per node: a group of `MAX_BATCH_OPS`
    // registers is at most that many CASes on any node, one batch each.
    for group in registers.chunks(MAX_BATCH_OPS) {
        let mut per_node: Vec<(NodeId, Batch, Vec<usize>)> = Vec::new();
        let mut replicas = vec![0usize; group.len()];
        for (i, (register, from, marker)) in group.iter().enumerate() {
            let to = donation_word(*marker);
            let Some(loc) = loc(*register) else {
                continue;
            };
            for node in loc.replicas.nodes() {
                let Some(addr) = layout.header_on(&loc, *node) else {
                    continue;
                };
                replicas[i] += 1;
                let at = match per_node.iter().position(|(n, _, _)| n == node) {
                    Some(at) => at,
                    None => {
                        per_node.push((*node, Batch::new(), Vec::new()));
                        per_node.len() - 1
                    }
                };
                let (_, batch, which) = &mut per_node[at];
                batch.push(swarm_core::fabric::Op::Cas {
                    addr,
                    expected: *from,
                    new: to,
                })?;
                which.push(i);
            }
        }
        let order: Vec<(NodeId, Vec<usize>)> = per_node
            .iter()
            .map(|(n, _, which)| (*n, which.clone()))
            .collect();
        let rt = round(
            fabric,
            stats,
            per_node.into_iter().map(|(n, b, _)| (n, b)).collect(),
        )
        .await?;
        let mut landed = vec![0usize; group.len()];
        for (node, completion) in rt.replies() {
            let Some((_, which)) = order.iter().find(|(n, _)| n == node) else {
                continue;
            };
            for (op, &i) in which.iter().enumerate() {
                let (_, from, marker) = group[i];
                let to = donation_word(marker);
                if completion.cas(op).is_some_and(|p| p == from || p == to) {
                    landed[i] += 1;
                }
            }
        }
        for (i, (register, _, _)) in group.iter().enumerate() {
            if replicas[i] > 0 && landed[i] == replicas[i] {
                complete += 1;
            } else {
                incomplete += 1;
                tracing::debug!(
                    register,
                    landed = landed[i],
                    replicas = replicas[i],
                    "closing: a donation reached some replicas only; the register comes back after a grace"
                );
            }
        }
    }
    Ok((complete, incomplete))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use swarm_core::fabric::EmulatedRtt;
    use swarm_core::{MemCluster, block_on, join};

    use super::*;
    use crate::placement::SharedPlacements;
    use crate::registers::alloc::RegisterAllocator;

    use crate::test_support::small_layout as layout;

    fn word(fabric: &swarm_core::MemFabric, node: u16, addr: u64) -> u64 {
        swarm_core::block_on_future(fabric, async {
            let s = OpStats::new();
            let mut rt = Roundtrip::start(fabric, &s);
            rt.post(NodeId(node), Batch::cas(addr, u64::MAX, u64::MAX))
                .unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.cas(0).unwrap()
        })
        .unwrap()
    }

    /// Four allocations in flight claim four chunks and take all of the first one's
    /// registers: the three untouched chunks go back to the chunk table, the others'
    /// clients claim them as fresh chunks at once, and a partly used chunk's rest is
    /// donated and stays claimed.
    #[test]
    fn a_closing_allocator_gives_back_the_chunks_and_registers_it_never_handed_out() {
        let computed = SharedPlacements::default();
        let layout = layout();
        let cluster = MemCluster::new(3, layout.end() as usize);
        let used: HashSet<u64>;
        let (token, tag) = (0xabc, crate::registers::limbo::holder_tag(1, 0xabc));
        let alloc = RegisterAllocator::new(&layout, 1, token);
        let stats = OpStats::new();
        {
            // Emulated latency: the claims are really in flight together.
            let fabric = EmulatedRtt::new(cluster.client(), 1_000);
            let one = || alloc.allocate(&fabric, &stats, &layout, 3, &computed);
            let ((a, b), (c, d)) = block_on(&fabric, async {
                Ok::<_, swarm_core::FabricError>(join(join(one(), one()), join(one(), one())).await)
            })
            .unwrap();
            used = [a, b, c, d].into_iter().map(|r| r.unwrap().0).collect();
        }
        let fabric = cluster.client();
        assert_eq!(alloc.chunks_claimed(), 4);
        // One more: a fresh register of the second chunk.
        let (fifth, _) = block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                alloc.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap()
        .unwrap();
        let per = u64::from(layout.params.chunk_registers);
        let full = *used.iter().next().unwrap() / per;
        assert!(used.iter().all(|r| r / per == full), "{used:?}");
        let partly = fifth / per;
        let marker = swarm_core::encoding::Tsp::reset_marker(7).unwrap();
        alloc.give_back(full * per, marker);
        let unused = alloc.take_unused();
        assert_eq!(unused.chunks.len(), 2, "{unused:?}");
        assert!(!unused.chunks.contains(&full) && !unused.chunks.contains(&partly));
        assert_eq!(
            unused.fresh,
            ((fifth + 1)..(partly + 1) * per).collect::<Vec<_>>()
        );
        assert_eq!(unused.recycled, [(full * per, marker)]);
        assert_eq!(alloc.pooled(), 0, "the pool is empty");

        // Give back: what the close does.
        let stats = OpStats::new();
        let released = block_on(
            &fabric,
            release_chunks(&fabric, &stats, &layout, &unused.chunks, token),
        )
        .unwrap();
        assert_eq!(released, 2);
        // The recycled one's reset left (0, tag); the fresh ones hold zeros.
        for node in 0..3 {
            let at = layout.key_header(full * per).unwrap();
            swarm_core::block_on_future(&fabric, async {
                let mut rt = Roundtrip::start(&fabric, &stats);
                rt.post(NodeId(node), Batch::cas(at, 0, header_word(0, tag)))
                    .unwrap();
                rt.wait(1).await.unwrap();
            })
            .unwrap();
        }
        let mut registers: Vec<(RegisterId, u64, Option<Tsp>)> =
            unused.fresh.iter().map(|r| (*r, 0, None)).collect();
        registers.push((full * per, header_word(0, tag), Some(marker)));
        let loc = |r| crate::client::register_loc_for(&layout, 3, r).ok();
        let (donated, incomplete) =
            block_on(&fabric, donate(&fabric, &stats, &layout, &registers, loc)).unwrap();
        assert_eq!((donated, incomplete), (registers.len() as u64, 0));
        for (register, _, marker) in &registers {
            for node in loc(*register).unwrap().replicas.nodes() {
                let at = layout.key_header(*register).unwrap();
                assert_eq!(
                    word(&fabric, node.0, at),
                    donation_word(*marker),
                    "register {register} on {node:?}"
                );
            }
        }
        for chunk in 0..layout.chunks() {
            let expected = if unused.chunks.contains(&chunk) || ![full, partly].contains(&chunk) {
                0
            } else {
                token
            };
            for node in 0..3 {
                assert_eq!(
                    word(&fabric, node, layout.chunk_word(chunk)),
                    expected,
                    "chunk {chunk}"
                );
            }
        }
        // A donation CAS that lands again (late) changes nothing once a taker holds
        // the register.
        let (again, missed) = block_on(
            &fabric,
            donate(&fabric, &stats, &layout, &registers[..1], loc),
        )
        .unwrap();
        assert_eq!((again, missed), (1, 0), "already donated: idempotent");

        // Another client claims the released chunks as fresh ones, and never the
        // partly used one.
        let other = RegisterAllocator::new(&layout, 2, 0xdef);
        let mut seen = HashSet::new();
        while let Ok((register, marker)) = block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                other.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap()
        {
            assert_eq!(marker, None);
            assert!(seen.insert(register));
        }
        for chunk in &unused.chunks {
            assert!(
                (chunk * per..(chunk + 1) * per).all(|r| seen.contains(&r)),
                "released chunk {chunk} handed out again"
            );
        }
        assert!(seen.iter().all(|r| r / per != full && r / per != partly));
        assert_eq!(
            other.chunks_claimed(),
            layout.chunks() - 2,
            "every chunk but the two that hold used registers"
        );
    }

    /// A client that inserted one key closes: the three other registers of its chunk
    /// are donated, and a client that fills the cluster takes them after the delivery
    /// margin. Before, they came back by adoption (rule 4), a register grace later.
    #[test]
    fn a_closed_clients_unused_registers_come_back_without_a_grace() {
        use crate::test_support::{MS, connect, small_cluster};
        let (cluster, layout) = small_cluster(400 * MS);
        let registers = layout.params.registers;
        let a = connect(&cluster, layout);
        block_on(a.fabric(), a.insert(b"a0", b"A", &OpStats::new())).expect("inserted");
        a.close();
        let census = |c: &crate::KvClient<swarm_core::MemFabric, swarm_core::FixedClock>| {
            block_on(
                c.fabric(),
                crate::registers::limbo::census(c.fabric(), &layout, |r| {
                    crate::client::register_loc_for(&layout, 3, r).ok()
                }),
            )
            .expect("a census")
        };
        let b = connect(&cluster, layout);
        let after_close = census(&b);
        assert_eq!(after_close.keyed, 1, "{after_close:?}");
        assert_eq!(after_close.donated, 3, "{after_close:?}");
        assert_eq!(after_close.pooled_gone, 3, "{after_close:?}");
        let started = b.fabric().now();
        let mut inserted = 0u64;
        loop {
            let key = format!("b{inserted}");
            match block_on(b.fabric(), b.insert(key.as_bytes(), b"B", &OpStats::new())) {
                Ok(()) => inserted += 1,
                Err(KvError::RegistersFull { .. }) => break,
                Err(other) => panic!("insert {key}: {other}"),
            }
            assert!(inserted <= registers, "more keys than registers");
        }
        let took = b.fabric().now() - started;
        assert_eq!(inserted, registers - 1, "every register but A's key");
        let stats = b.recycle_stats();
        assert_eq!(stats.reclaimed_donations, 3, "{stats:?}");
        assert_eq!(stats.reclaimed_pool + stats.reclaimed_limbo, 0, "{stats:?}");
        assert!(
            took < layout.params.register_grace_ns(),
            "filled in {took} ns: no register grace waited"
        );
        let got = block_on(b.fabric(), b.get(b"a0", &OpStats::new())).expect("a get");
        assert_eq!(got.as_deref(), Some(&b"A"[..]));
    }
}
