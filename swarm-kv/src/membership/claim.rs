//! Claiming a word on a majority of memory nodes (writer ids, allocation chunks).
//!
//! Memory nodes only offer CAS, and a word replicated on `n` nodes has no single
//! owner: a client *owns* the replicated word when its token is in a majority of the
//! copies. Tokens are only ever CASed from 0 to a token, or from a client's own token
//! back to 0, so once a client holds a majority nobody else can hold one: at most one
//! client believes it owns a word. When contenders split the copies so that nobody
//! has a majority (possible with a crashed node, or more than two contenders), each
//! gives its copies back and reports [`Claim::Undecided`]; the caller retries later or
//! elsewhere. That is obstruction-free, not wait-free, which is fine for the rare
//! operations that use it (a client starting, a chunk of registers running out).
//!
//! # A round counts its answers over time
//!
//! A claimer counts each node's answer as it lands, and a claimer stopped between
//! two posts of its round (SIGSTOP, a long preemption: the round's fence is checked
//! once, before its first post) counts an answer from before its stop together with
//! answers from after it, when the word may have gone back to 0 (a release) and been
//! claimed again. So "a majority of my CASes succeeded" proves ownership only if a
//! copy holding a token never leaves it while its claimer's round may still count
//! it: a copy with token `T` goes back to 0 only by `T`'s own claimer, after its
//! round (a loser's release, a close). Then all the copies a winner counted hold its
//! token at once when its round ends, and two winners would hold two disjoint
//! majorities at once. A winner therefore does **not** take the copies that show
//! another token: a take of a stopped contender's early copy, followed by the
//! winner's release at close, let that contender's late CASes find 0 again and win
//! a second majority over time (`a_claimer_paused_between_its_posts_never_shares_a_win`).
//! A stale copy costs nothing but one node of redundancy.
//!
//! # A round that straddles a repair
//!
//! The argument above assumes that a copy keeps its token while its claimer's round
//! may count it. One event breaks that without any client's doing: a node loses its
//! memory and a repair rebuilds it from the others, which may not hold the token yet.
//! A claimer x that counted node X's answer and then stopped inside its round
//! (between two posts, or before it read its last answer) could meet, on waking up:
//!
//! 1. X rebuilt from donors that showed 0, and a second claimer y that won X and a
//!    donor D₂ (a majority, y's chunk);
//! 2. x's late CAS landing on the other donor D₁, which still showed 0.
//!
//! x then counts X (from before the loss) and D₁: a majority over time, and two
//! claimers own the word (SWARM-KV: two owners of one chunk's registers, each
//! resetting and publishing keys in them). So a round is fenced like a register
//! operation (`docs/pauses.md`, H3'): it posts nothing after `budget` from its start
//! (the operation's deadline when one is armed already), and it counts its answers
//! only if a clock reading taken *after* the last of them is within that deadline.
//! Answers counted by the deadline landed before a repair's copy began: the repair
//! waits out its quiescence (which holds `max_op_ns`) after the node's loss, and a
//! round that counted the lost node's answer started before that loss. A round that
//! fails the check gives back its copies and reports [`Claim::Undecided`], however
//! many it counted: the caller retries with a round of its own.
//!
//! Rows of the client table are the one place where copies are still taken: an owner
//! whose lease renewal counted on a majority takes the copies it read with another
//! token ([`crate::membership::lease_renewal`]), so that one node's loss does not cost
//! it its lease. A stopped contender whose early copy it took may then count a win
//! over time; but the copies that contender won late, and the copies of whoever
//! claimed the row at the same time, all still hold their tokens when both rounds end
//! (neither has renewed, so neither takes), so its late copies are no majority, and
//! its first renewal, which reads the claim word in its own batch, counts on no
//! majority: it gives the row back before storing anything under it
//! ([`crate::membership::writer_ids`]).

use swarm_core::fabric::Nanos;
use swarm_core::post_background;
use swarm_core::quorum::{broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, OpStats};

/// How long a claim waits for each node's answer beyond the first majority.
pub const STRAGGLER_NS: Nanos = 50_000_000;

/// How a claim ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The caller's token is in a majority of copies: the word is the caller's.
    Won,
    /// Another token holds, or may still reach, a majority.
    Taken,
    /// Nobody holds a majority; the caller's copies were given back.
    Undecided,
}

/// Tries to claim the word at `addr` on nodes `0..nodes` with `token` (non-zero).
/// The round is fenced at `budget` from its start, or at the deadline `stats` holds
/// already if earlier (module docs, "A round that straddles a repair"): answers
/// checked past it count for nothing, and the round reports [`Claim::Undecided`].
pub async fn claim<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    nodes: usize,
    addr: u64,
    token: u64,
    budget: Nanos,
) -> Result<Claim, FabricError> {
    Ok(
        claim_reading(fabric, stats, nodes, addr, token, budget, None)
            .await?
            .0,
    )
}

/// [`claim`], each node's CAS followed in its batch by a read of `also` (address,
/// length); with the claim's outcome, the bytes read on the nodes whose copy the
/// round counted as the caller's. Such a read took effect after the node's copy
/// held the caller's token, so it sees whatever was stored there before that copy
/// was last free: a chunk's placement record, which `crate::placement::add_node`
/// writes before it frees the chunk word it holds.
pub async fn claim_reading<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    nodes: usize,
    addr: u64,
    token: u64,
    budget: Nanos,
    also: Option<(u64, u32)>,
) -> Result<(Claim, Vec<Vec<u8>>), FabricError> {
    debug_assert!(token != 0, "0 is the free word");
    let quorum = majority(nodes);
    let _fence = stats.arm_deadline(fabric.now().saturating_add(budget));
    // Every node's answer, stragglers included (up to `STRAGGLER_NS` each, within the
    // fence): a copy holding a stale token is only seen in its own answer.
    let rt = broadcast_until_among(
        fabric,
        stats,
        swarm_core::quorum::nodes(nodes),
        quorum,
        STRAGGLER_NS.min(budget / 4),
        |node| {
            if node.index() >= nodes {
                return Ok(None);
            }
            let mut batch = Batch::cas(addr, 0, token);
            if let Some((at, len)) = also {
                batch.push(swarm_core::Op::Read { addr: at, len })?;
            }
            Ok(Some(batch))
        },
        |_| false,
    )
    .await;
    let rt = match rt {
        Ok(rt) if !stats.is_fenced(fabric.now()) => rt,
        Err(error) if error != FabricError::Fenced => return Err(error),
        // Past the fence, whether at a post or after the last answer: whatever it
        // counted may straddle a repair. Give back what it took.
        fenced => {
            drop(fenced);
            tracing::debug!(
                addr,
                "claim round ran past its fence: given back, undecided"
            );
            release(fabric, nodes, addr, token);
            return Ok((Claim::Undecided, Vec::new()));
        }
    };
    let mut mine = 0;
    let mut read = Vec::new();
    let mut others: heapless::Vec<(u64, usize), 16> = heapless::Vec::new();
    for (_, completion) in rt.replies() {
        match completion.cas(0) {
            Some(t) if t == 0 || t == token => {
                mine += 1;
                if let Some(bytes) = completion.read(1) {
                    read.push(bytes.to_vec());
                }
            }
            Some(t) => match others.iter_mut().find(|(o, _)| *o == t) {
                Some((_, count)) => *count += 1,
                None => {
                    let _ = others.push((t, 1));
                }
            },
            None => {}
        }
    }
    if mine >= quorum {
        // Won. Another token on a copy is stale (an earlier owner's release that
        // never reached this node) or a contender's whose round may still be
        // counting it, however long that contender stays stopped: it is left alone
        // (module docs, "A round counts its answers over time"). A row's owner takes
        // stale copies once its lease renewal counts on a majority
        // (`crate::membership::lease_renewal`).
        return Ok((Claim::Won, read));
    }
    let unanswered = nodes - rt.replies().len();
    let other_can_win = others.iter().any(|(_, c)| c + unanswered >= quorum);
    // Give back whatever we took, on every node (late CASes included).
    drop(rt);
    release(fabric, nodes, addr, token);
    let outcome = if other_can_win {
        Claim::Taken
    } else {
        Claim::Undecided
    };
    Ok((outcome, Vec::new()))
}

/// Gives a claimed word back on every node.
pub fn release<F: Fabric + ?Sized>(fabric: &F, nodes: usize, addr: u64, token: u64) {
    give_back(fabric, nodes, addr, token, 0);
}

/// Sets the word back from `mine` to `to` on every node that holds `mine` (posted,
/// not awaited): a claim given up, or a takeover of a dead client's word that did not
/// reach a majority ([`crate::membership::writer_takeover`]) handing the copies back to the dead token.
pub fn give_back<F: Fabric + ?Sized>(fabric: &F, nodes: usize, addr: u64, mine: u64, to: u64) {
    for node in node_ids(nodes) {
        post_background(fabric, node, Batch::cas(addr, mine, to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarm_core::MemCluster;
    use swarm_core::{NodeId, Roundtrip, block_on, block_on_future};

    /// A claim round's fence in these tests: far longer than any of them takes.
    const BUDGET: Nanos = 10_000_000_000;

    /// CASes the word at 8 on `node` from `from` to `to`; returns what it found.
    fn cas_on<F: Fabric>(fabric: &F, node: u16, from: u64, to: u64) -> Option<u64> {
        let s = OpStats::new();
        block_on_future(fabric, async {
            let mut rt = Roundtrip::start(fabric, &s);
            rt.post(NodeId(node), Batch::cas(8, from, to)).unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.cas(0)
        })
        .unwrap()
    }

    /// The word at 8 on `node`.
    fn word_on<F: Fabric>(fabric: &F, node: u16) -> u64 {
        let s = OpStats::new();
        block_on_future(fabric, async {
            let mut rt = Roundtrip::start(fabric, &s);
            rt.post(NodeId(node), Batch::read(8, 8)).unwrap();
            rt.wait(1).await.unwrap();
            let bytes = rt.replies()[0].1.read(0).unwrap().to_vec();
            u64::from_le_bytes(bytes.try_into().unwrap())
        })
        .unwrap()
    }

    #[test]
    fn first_claimer_wins_and_others_see_it_taken() {
        let cluster = MemCluster::new(3, 64);
        let (a, b) = (cluster.client(), cluster.client());
        let s = OpStats::new();
        assert_eq!(
            block_on(&a, claim(&a, &s, 3, 8, 11, BUDGET)),
            Ok(Claim::Won)
        );
        assert_eq!(
            block_on(&a, claim(&a, &s, 3, 8, 11, BUDGET)),
            Ok(Claim::Won),
            "idempotent"
        );
        assert_eq!(
            block_on(&b, claim(&b, &s, 3, 8, 22, BUDGET)),
            Ok(Claim::Taken)
        );
        release(&a, 3, 8, 11);
        assert_eq!(
            block_on(&b, claim(&b, &s, 3, 8, 22, BUDGET)),
            Ok(Claim::Won)
        );
    }

    /// An earlier owner's release that reached only nodes 0 and 2 left its token on
    /// node 1 (or a contender stopped in its round holds it); the next claimer wins
    /// nodes 0 and 2 and leaves node 1's copy alone (module docs: a take lets a
    /// stopped contender win a second majority over time).
    #[test]
    fn a_winner_leaves_the_copies_of_other_tokens_alone() {
        let cluster = MemCluster::new(3, 64);
        let c = cluster.client();
        let s = OpStats::new();
        cas_on(&c, 1, 0, 77);
        assert_eq!(
            block_on(&c, claim(&c, &s, 3, 8, 11, BUDGET)),
            Ok(Claim::Won)
        );
        for (node, want) in [(0u16, 11u64), (1, 77), (2, 11)] {
            assert_eq!(word_on(&c, node), want, "node {node}");
        }
    }

    #[test]
    fn a_loser_gives_its_copies_back() {
        let cluster = MemCluster::new(3, 64);
        let (a, b) = (
            swarm_core::fabric::FailNodes::new(cluster.client()),
            swarm_core::fabric::FailNodes::new(cluster.client()),
        );
        let s = OpStats::new();
        // a holds node 0, b holds node 1, node 2 is down for both.
        a.fail_node(NodeId(2));
        b.fail_node(NodeId(2));
        cas_on(&a, 0, 0, 11);
        // b holds only node 1 and cannot tell whether silent node 2 holds a's token:
        // it reports Taken (a may still win) and gives its copy back.
        assert_eq!(
            block_on(&b, claim(&b, &s, 3, 8, 22, BUDGET)),
            Ok(Claim::Taken)
        );
        // b gave node 1 back, so a can now win nodes 0 and 1.
        assert_eq!(
            block_on(&a, claim(&a, &s, 3, 8, 11, BUDGET)),
            Ok(Claim::Won)
        );
    }

    #[test]
    fn a_three_way_split_is_undecided() {
        let cluster = MemCluster::new(3, 64);
        let c = cluster.client();
        let s = OpStats::new();
        // Tokens 1 and 2 each hold one node; a third contender takes node 2 and sees
        // every node answer with no token on a majority.
        for (node, token) in [(0u16, 1u64), (1, 2)] {
            cas_on(&c, node, 0, token);
        }
        assert_eq!(
            block_on(&c, claim(&c, &s, 3, 8, 33, BUDGET)),
            Ok(Claim::Undecided)
        );
        // Its copy on node 2 was given back.
        assert_eq!(cas_on(&c, 2, 0, 0), Some(0));
    }

    /// A claimer stopped between its posts to node 0 and to nodes 1 and 2 counts
    /// node 0's answer from before its pause. Meanwhile a winner takes node 0's copy
    /// and, closing cleanly with nothing used, releases the word to 0 everywhere, and
    /// a third claimer takes nodes 0 and 1. The first one's late CASes then win node
    /// 2: each of the two counts a majority of "won" copies, at different times, and
    /// both hand out the chunk's registers. A copy with a claimer's token stopped being
    /// its own while its round was still counting (the winner's take, which winners
    /// no longer do), and the word came back to 0 (the release): the late CAS found
    /// the value it expected.
    #[test]
    fn a_claimer_paused_between_its_posts_never_shares_a_win() {
        let cluster = MemCluster::new(3, 64);
        let s = OpStats::new();
        // x posts its CAS everywhere; only node 0's lands before x stops.
        let x = crate::test_support::Holding::new(cluster.client(), &[1, 2]);
        let sx = OpStats::new();
        let mut fx = core::pin::pin!(claim(&x, &sx, 3, 8, 11, BUDGET));
        assert!(crate::test_support::poll_once(fx.as_mut()).is_pending());
        // a wins nodes 1 and 2, takes node 0's copy, and releases everything.
        let a = cluster.client();
        assert_eq!(
            block_on(&a, claim(&a, &s, 3, 8, 22, BUDGET)),
            Ok(Claim::Won)
        );
        release(&a, 3, 8, 22);
        // b's CASes land on nodes 0 and 1; its node-2 CAS is slow.
        let b = crate::test_support::Holding::new(cluster.client(), &[2]);
        let sb = OpStats::new();
        let mut fb = core::pin::pin!(claim(&b, &sb, 3, 8, 33, BUDGET));
        assert!(crate::test_support::poll_once(fb.as_mut()).is_pending());
        // x wakes up: node 1 says 33, node 2 takes x's token.
        x.land();
        let x_won =
            crate::test_support::poll_once(fx.as_mut()) == core::task::Poll::Ready(Ok(Claim::Won));
        b.land();
        let b_won =
            crate::test_support::poll_once(fb.as_mut()) == core::task::Poll::Ready(Ok(Claim::Won));
        assert!(!(x_won && b_won), "both claimers believe they own the word");
    }

    /// A claimer x counts node 0's answer and stops before its CASes to nodes 1 and 2
    /// land. Node 0 loses its memory and is rebuilt from donors that show the word
    /// free; y then wins nodes 0 and 1 (its node-2 CAS is slow). x wakes up past its
    /// round's fence: its late CAS wins node 2, which still showed 0, and with node
    /// 0's answer from before the loss it counts a majority. It must not report a win
    /// (module docs, "A round that straddles a repair"), and it gives node 2 back.
    #[test]
    fn a_claim_counted_across_a_repair_never_shares_a_win() {
        let cluster = MemCluster::new(3, 64);
        let s = OpStats::new();
        let x = crate::test_support::Holding::new(cluster.client(), &[1, 2]);
        let sx = OpStats::new();
        let mut fx = core::pin::pin!(claim(&x, &sx, 3, 8, 11, BUDGET));
        assert!(crate::test_support::poll_once(fx.as_mut()).is_pending());
        // Node 0 is rebuilt from the donors' copies: the word is free there again.
        let admin = cluster.client();
        cas_on(&admin, 0, 11, 0);
        let y = crate::test_support::Holding::new(cluster.client(), &[2]);
        assert_eq!(
            block_on(&y, claim(&y, &s, 3, 8, 22, BUDGET)),
            Ok(Claim::Won)
        );
        // x stopped longer than its fence, then its held CASes land.
        x.sleep(BUDGET + 1);
        x.land();
        let x_outcome = crate::test_support::poll_once(fx.as_mut());
        assert!(
            matches!(x_outcome, core::task::Poll::Ready(Ok(Claim::Undecided))),
            "a round counted across a repair: {x_outcome:?}"
        );
        // x gave node 2 back: y's slow CAS finds it free.
        y.land();
        let node2 = word_on(&admin, 2);
        assert_ne!(node2, 11, "x's late copy on node 2 is given back");
    }
}
