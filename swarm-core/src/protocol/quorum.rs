//! Quorum steps: post one batch to each of several memory nodes and wait for enough
//! of them, the shape of every step of the protocol (SWARM §2.1, fourth property:
//! batches to different nodes are in flight at once and a step waits for a quorum,
//! never for all).
//!
//! Three shapes, all built on [`Roundtrip`] (so each counts its roundtrips):
//!
//! * [`broadcast`] posts to every node of a set and waits until `k` answered: the
//!   plain majority step (writing a key header, claiming a word, reading a
//!   superblock).
//! * [`broadcast_until`] (and [`broadcast_until_among`] a set of nodes) also posts
//!   to every node at once, waits for a quorum, then for more replies while they are not `enough`, giving each
//!   straggler a deadline. Steps whose every copy matters use it (a log scan that
//!   must see a minority's records, a fresh register's write that carries a store's
//!   operation to every replica).
//! * [`preferred_step`] asks a *preferred* set first and everybody else only once
//!   one of them is slow, failed or returned something unusable (SWARM §6, the
//!   preferred majority that keeps the common case at `f + 1` batches).
//!
//! A step returns its [`Roundtrip`]: the caller reads the completions with
//! [`Roundtrip::replies`] and [`Roundtrip::failures`], and dropping it forgets the
//! batches still outstanding (they execute, their results are discarded). The steps
//! never block: like every protocol future they return `Pending` and rely on whoever
//! drives them to call [`Fabric::progress`] (the executor contract of
//! [`crate::exec`]); deadlines are on [`Fabric::now`] and announced with
//! [`Fabric::wake_at`], so a simulated fabric does not mistake a wait for a stall.

use crate::fabric::{Batch, Completion, Fabric, FabricError, Nanos, NodeId};
use crate::roundtrip::{OpStats, Roundtrip, WaitOutcome};

/// A majority of `n` nodes: `⌊n/2⌋ + 1`, the quorum size of `n = 2f + 1` replicas.
pub const fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The nodes `0..n` of a cluster, in order.
pub fn nodes(n: usize) -> impl Iterator<Item = NodeId> + Clone {
    (0..n).map(|i| NodeId(i as u16))
}

/// Posts `build(node)` to each of `nodes` and waits until `k` of them answered
/// successfully.
///
/// Fails with [`FabricError::NotEnoughLiveNodes`] as soon as too few posted nodes can
/// still answer, and with [`FabricError::TooManyPosts`] for more than
/// [`crate::roundtrip::MAX_NODES`] nodes. Replies that arrive after the `k`-th are
/// not waited for; whatever had arrived when the wait ended is in the returned
/// roundtrip, so a caller may find more than `k` replies there.
pub async fn broadcast<'a, F, B>(
    fabric: &'a F,
    stats: &'a OpStats,
    nodes: impl IntoIterator<Item = NodeId>,
    k: usize,
    mut build: B,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Batch, FabricError>,
{
    let mut rt = Roundtrip::start(fabric, stats);
    for node in nodes {
        rt.post(node, build(node)?)?;
    }
    rt.wait(k).await?;
    Ok(rt)
}

/// Posts `build(node)` (when it returns a batch) to every node of the fabric, waits
/// for a quorum of `q` replies, then for more while the replies are not `enough`:
/// [`broadcast_until_among`] the whole cluster.
pub fn broadcast_until<'a, F, B, E>(
    fabric: &'a F,
    stats: &'a OpStats,
    q: usize,
    slow_after: Nanos,
    build: B,
    enough: E,
) -> impl Future<Output = Result<Roundtrip<'a, F>, FabricError>>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Option<Batch>, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    let all = nodes(fabric.node_count());
    broadcast_until_among(fabric, stats, all, q, slow_after, build, enough)
}

/// Posts `build(node)` (when it returns a batch) to each of `nodes`, waits for a
/// quorum of `q` replies, then for more while the replies are not `enough`, giving
/// each straggler `slow_after` to answer. Returns once `enough` holds, every
/// posted node answered or failed, or a straggler's deadline passed; the caller
/// judges the replies it gets.
///
/// The wait for `q` replies only ends while `q` of the nodes posted to are alive:
/// callers post to every node that may be needed (a read where a write is not
/// allowed). Fails with [`FabricError::NotEnoughLiveNodes`] when fewer than `q`
/// nodes were posted to or too few of them can still answer.
pub async fn broadcast_until_among<'a, F, B, E>(
    fabric: &'a F,
    stats: &'a OpStats,
    nodes: impl IntoIterator<Item = NodeId>,
    q: usize,
    slow_after: Nanos,
    build: B,
    enough: E,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Option<Batch>, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    let mut rt = Roundtrip::start(fabric, stats);
    broadcast_until_among_in(&mut rt, fabric, nodes, q, slow_after, build, enough).await?;
    Ok(rt)
}

/// [`broadcast_until_among`] in the roundtrip `rt` of `fabric` (just started,
/// nothing posted), which the caller owns: one that keeps the tickets still
/// outstanding ([`Roundtrip::keep_outstanding_in`]) keeps them also when this fails.
pub async fn broadcast_until_among_in<F, B, E>(
    rt: &mut Roundtrip<'_, F>,
    fabric: &F,
    nodes: impl IntoIterator<Item = NodeId>,
    q: usize,
    slow_after: Nanos,
    mut build: B,
    mut enough: E,
) -> Result<(), FabricError>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Option<Batch>, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    let mut posted = 0;
    for node in nodes {
        if let Some(batch) = build(node)? {
            rt.post(node, batch)?;
            posted += 1;
        }
    }
    if posted < q {
        return Err(FabricError::NotEnoughLiveNodes {
            needed: q,
            live: posted,
        });
    }
    rt.wait(q).await?;
    loop {
        if enough(rt.replies()) || rt.replies().len() + rt.failures().len() >= posted {
            return Ok(());
        }
        let have = rt.replies().len();
        let deadline = fabric.now().saturating_add(slow_after);
        if rt.wait_until(have + 1, deadline).await == WaitOutcome::Short {
            return Ok(());
        }
    }
}

/// Posts `build(node)` to the first `k` nodes of `order`; once they are slow (no new
/// reply within `slow_after`) or their replies are not `enough`, counts one more
/// roundtrip and posts to the rest of `order` too, then waits until the replies are
/// `enough`. Fails with [`FabricError::NotEnoughLiveNodes`] when every node of
/// `order` answered or failed and the replies are still not enough.
pub async fn preferred_step<'a, F, B, E>(
    fabric: &'a F,
    stats: &'a OpStats,
    order: &[NodeId],
    k: usize,
    slow_after: Nanos,
    build: B,
    enough: E,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Batch, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    preferred_step_reporting_late(fabric, stats, order, k, slow_after, build, enough, |_| {}).await
}

/// [`preferred_step`], also calling `late(node)` for each preferred node that had
/// not answered when the step gave up waiting for the preferred set: the hook a
/// caller uses to *suspect* slow nodes and order them last next time (SWARM §6).
#[allow(clippy::too_many_arguments)]
pub async fn preferred_step_reporting_late<'a, F, B, E, L>(
    fabric: &'a F,
    stats: &'a OpStats,
    order: &[NodeId],
    k: usize,
    slow_after: Nanos,
    mut build: B,
    mut enough: E,
    mut late: L,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric + ?Sized,
    B: FnMut(NodeId) -> Result<Batch, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
    L: FnMut(NodeId),
{
    let mut rt = Roundtrip::start(fabric, stats);
    let first = k.min(order.len());
    for &node in &order[..first] {
        rt.post(node, build(node)?)?;
    }
    // A fabric that completes batches inside `post` (shared memory) has answered
    // already: collect those replies before reading the clock for the deadline.
    let _ = rt.reached(first);
    if enough(rt.replies()) {
        return Ok(rt);
    }
    let deadline = fabric.now().saturating_add(slow_after);
    loop {
        if enough(rt.replies()) {
            return Ok(rt);
        }
        let have = rt.replies().len();
        if rt.wait_until(have + 1, deadline).await == WaitOutcome::Short {
            break;
        }
    }
    for &node in &order[..first] {
        if !rt.replies().iter().any(|(n, _)| *n == node) {
            late(node);
        }
    }
    if order.len() > first {
        rt.escalate();
        for &node in &order[first..] {
            rt.post(node, build(node)?)?;
        }
    }
    loop {
        if enough(rt.replies()) {
            return Ok(rt);
        }
        let have = rt.replies().len();
        rt.wait(have + 1).await?;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use alloc::vec::Vec;

    use super::*;
    use crate::exec::{block_on, block_on_future};
    use crate::mem::MemCluster;

    fn answered(rt: &Roundtrip<'_, impl Fabric>) -> Vec<u16> {
        let mut nodes: Vec<u16> = rt.replies().iter().map(|(n, _)| n.0).collect();
        nodes.sort_unstable();
        nodes
    }

    #[test]
    fn majorities() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
        assert_eq!(majority(5), 3);
        assert_eq!(
            nodes(3).map(|n| n.0).collect::<Vec<_>>(),
            [0, 1, 2],
            "nodes are numbered from 0"
        );
    }

    #[test]
    fn broadcast_waits_for_k_and_stalls_without_a_majority() {
        let cluster = MemCluster::new(3, 64);
        let fabric = crate::fabric::FailNodes::new(cluster.client());
        let stats = OpStats::new();
        let rt = block_on(
            &fabric,
            broadcast(&fabric, &stats, nodes(3), 2, |n| {
                Ok(Batch::write(8, alloc::vec![n.0 as u8 + 1; 8]))
            }),
        )
        .unwrap();
        assert!(rt.replies().len() >= 2);
        drop(rt);
        assert_eq!(stats.roundtrips(), 1);
        // Every node got its own batch.
        let rt = block_on(
            &fabric,
            broadcast(&fabric, &stats, nodes(3), 3, |_| Ok(Batch::read(8, 8))),
        )
        .unwrap();
        for (node, completion) in rt.replies() {
            assert_eq!(completion.read(0), Some(&[node.0 as u8 + 1; 8][..]));
        }
        drop(rt);
        // This fabric never completes a batch to a failed node: with two of three
        // failed, the step cannot finish and the executor reports the stall.
        fabric.fail_node(NodeId(1));
        fabric.fail_node(NodeId(2));
        let lost = block_on_future(
            &fabric,
            broadcast(&fabric, &stats, nodes(3), 2, |_| Ok(Batch::read(8, 8))),
        );
        assert!(matches!(lost, Err(FabricError::Stalled)));
    }

    #[test]
    fn broadcast_until_skips_nodes_without_a_batch_and_needs_a_quorum_of_posts() {
        let cluster = MemCluster::new(3, 64);
        let fabric = crate::fabric::FailNodes::new(cluster.client());
        let stats = OpStats::new();
        let rt = block_on(
            &fabric,
            broadcast_until(
                &fabric,
                &stats,
                2,
                1_000,
                |n| Ok((n.0 != 1).then(|| Batch::read(0, 8))),
                |replies| replies.len() >= 3,
            ),
        )
        .unwrap();
        assert_eq!(answered(&rt), [0, 2], "node 1 had no batch");
        drop(rt);
        let refused = block_on_future(
            &fabric,
            broadcast_until(
                &fabric,
                &stats,
                2,
                1_000,
                |n| Ok((n.0 == 0).then(|| Batch::read(0, 8))),
                |_| true,
            ),
        )
        .unwrap();
        assert!(matches!(
            refused.map(|_| ()),
            Err(FabricError::NotEnoughLiveNodes { needed: 2, live: 1 })
        ));
    }

    #[test]
    fn preferred_step_escalates_only_when_the_preferred_replies_are_not_enough() {
        let cluster = MemCluster::new(3, 64);
        let fabric = crate::fabric::FailNodes::new(cluster.client());
        let order = [NodeId(2), NodeId(0), NodeId(1)];
        let stats = OpStats::new();
        let rt = block_on(
            &fabric,
            preferred_step(
                &fabric,
                &stats,
                &order,
                2,
                1_000,
                |_| Ok(Batch::read(0, 8)),
                |r| r.len() >= 2,
            ),
        )
        .unwrap();
        assert_eq!(answered(&rt), [0, 2], "the first two of the order");
        drop(rt);
        assert_eq!(stats.roundtrips(), 1);
        // Replies from node 2 are unusable: the step asks the others too.
        let stats = OpStats::new();
        let rt = block_on(
            &fabric,
            preferred_step(
                &fabric,
                &stats,
                &order,
                2,
                1_000,
                |_| Ok(Batch::read(0, 8)),
                |r| r.iter().filter(|(n, _)| n.0 != 2).count() >= 2,
            ),
        )
        .unwrap();
        assert_eq!(answered(&rt), [0, 1, 2]);
        drop(rt);
        assert_eq!(stats.roundtrips(), 2, "the escalation counts a roundtrip");
        // Never enough, every node answered: the step fails instead of waiting.
        let never = block_on_future(
            &fabric,
            preferred_step(
                &fabric,
                &stats,
                &order,
                2,
                1_000,
                |_| Ok(Batch::read(0, 8)),
                |_| false,
            ),
        )
        .unwrap();
        assert!(matches!(
            never.map(|_| ()),
            Err(FabricError::NotEnoughLiveNodes { .. })
        ));
        // A failed preferred node is reported late, once, and the others answer.
        fabric.fail_node(NodeId(0));
        let mut late = Vec::new();
        let rt = block_on(
            &fabric,
            preferred_step_reporting_late(
                &fabric,
                &stats,
                &order,
                2,
                1_000,
                |_| Ok(Batch::read(0, 8)),
                |r| r.len() >= 2,
                |node| late.push(node),
            ),
        )
        .unwrap();
        assert_eq!(answered(&rt), [1, 2]);
        drop(rt);
        assert_eq!(late, [NodeId(0)]);
    }
}
