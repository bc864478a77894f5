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

use swarm_core::post_background;
use swarm_core::quorum::{broadcast, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, OpStats};

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
pub async fn claim<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    nodes: usize,
    addr: u64,
    token: u64,
) -> Result<Claim, FabricError> {
    debug_assert!(token != 0, "0 is the free word");
    let quorum = majority(nodes);
    let rt = broadcast(fabric, stats, node_ids(nodes), quorum, |_| {
        Ok(Batch::cas(addr, 0, token))
    })
    .await?;
    let mut mine = 0;
    let mut others: heapless::Vec<(u64, usize), 16> = heapless::Vec::new();
    for (_, completion) in rt.replies() {
        match completion.cas(0) {
            Some(0) => mine += 1,
            Some(t) if t == token => mine += 1,
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
        return Ok(Claim::Won);
    }
    let unanswered = nodes - rt.replies().len();
    let other_can_win = others.iter().any(|(_, c)| c + unanswered >= quorum);
    // Give back whatever we took, on every node (late CASes included).
    drop(rt);
    release(fabric, nodes, addr, token);
    Ok(if other_can_win {
        Claim::Taken
    } else {
        Claim::Undecided
    })
}

/// Gives a claimed word back on every node.
pub fn release<F: Fabric + ?Sized>(fabric: &F, nodes: usize, addr: u64, token: u64) {
    give_back(fabric, nodes, addr, token, 0);
}

/// Sets the word back from `mine` to `to` on every node that holds `mine` (posted,
/// not awaited): a claim given up, or a takeover of a dead client's word that did not
/// reach a majority ([`crate::reclaim`]) handing the copies back to the dead token.
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

    #[test]
    fn first_claimer_wins_and_others_see_it_taken() {
        let cluster = MemCluster::new(3, 64);
        let (a, b) = (cluster.client(), cluster.client());
        let s = OpStats::new();
        assert_eq!(block_on(&a, claim(&a, &s, 3, 8, 11)), Ok(Claim::Won));
        assert_eq!(
            block_on(&a, claim(&a, &s, 3, 8, 11)),
            Ok(Claim::Won),
            "idempotent"
        );
        assert_eq!(block_on(&b, claim(&b, &s, 3, 8, 22)), Ok(Claim::Taken));
        release(&a, 3, 8, 11);
        assert_eq!(block_on(&b, claim(&b, &s, 3, 8, 22)), Ok(Claim::Won));
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
        block_on(&a, async {
            let mut rt = Roundtrip::start(&a, &s);
            rt.post(NodeId(0), Batch::cas(8, 0, 11)).unwrap();
            rt.wait(1).await
        })
        .unwrap();
        // b holds only node 1 and cannot tell whether silent node 2 holds a's token:
        // it reports Taken (a may still win) and gives its copy back.
        assert_eq!(block_on(&b, claim(&b, &s, 3, 8, 22)), Ok(Claim::Taken));
        // b gave node 1 back, so a can now win nodes 0 and 1.
        assert_eq!(block_on(&a, claim(&a, &s, 3, 8, 11)), Ok(Claim::Won));
    }

    #[test]
    fn a_three_way_split_is_undecided() {
        let cluster = MemCluster::new(3, 64);
        let c = cluster.client();
        let s = OpStats::new();
        // Tokens 1 and 2 each hold one node; a third contender takes node 2 and sees
        // every node answer with no token on a majority.
        for (node, token) in [(0u16, 1u64), (1, 2)] {
            block_on(&c, async {
                let mut rt = Roundtrip::start(&c, &s);
                rt.post(NodeId(node), Batch::cas(8, 0, token)).unwrap();
                rt.wait(1).await
            })
            .unwrap();
        }
        assert_eq!(block_on(&c, claim(&c, &s, 3, 8, 33)), Ok(Claim::Undecided));
        // Its copy on node 2 was given back.
        let previous = block_on_future(&c, async {
            let mut rt = Roundtrip::start(&c, &s);
            rt.post(NodeId(2), Batch::cas(8, 0, 0)).unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.cas(0)
        })
        .unwrap();
        assert_eq!(previous, Some(0));
    }
}
