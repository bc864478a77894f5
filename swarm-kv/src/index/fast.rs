//! The fast round of an insert: one roundtrip after the read (module docs of
//! [`super`], "fast inserts"), or none of its own when it is blind and rides in the
//! register's write ([`BlindInsert`], module docs of [`super`], "one-roundtrip
//! inserts").
//!
//! A classic insert needs three roundtrips after its read: promise both buckets,
//! fence the other one, accept. When the read shows the key's *first* bucket settled
//! (no change in flight) and the key in neither bucket, the insert instead CASes the
//! first bucket's meta word on every node, from the word every node read showed, to
//! its `SET` accepted under a fresh ballot with the fast flag: phase 1 and phase 2
//! at once, as in Fast Paxos's fast rounds, with every node as the fast quorum. It
//! is decided when every node took it; otherwise the classic insert takes over, and
//! whatever the fast round left behind is judged by [`super::bucket::newest_accepted`]
//! (a fast value counts only where every copy of a quorum holds it).
//!
//! Why a fast round needs no fence, and only ever targets the first bucket: two
//! inserts of one key that both try it race on the same meta words, and at most one
//! takes every node. A classic insert of the key into the second bucket promises the
//! first one on a quorum before it accepts anything: if that promise reached a node
//! before the fast CAS did, the CAS fails there (the word changed) and the fast
//! round is not decided; if the fast CAS came first on every node of the quorum, the
//! promise reads it back on the whole quorum and the classic insert must finish it,
//! after which it finds the key. The fast CAS expects the exact word read, so
//! between the read and the CAS nothing was decided in the first bucket, and a key
//! inserted into the second bucket in that window would have promised the first.
//!
//! The one ordering that CAS cannot catch: the classic insert promised both buckets
//! *and fenced the first* before the fast round read it, and has not accepted its
//! `SET` in the second bucket yet. The fast round then reads a settled first bucket
//! and a second one without the key. But that insert's promise on the second bucket
//! completed before its fence began, so by the time any node shows the fence, the
//! promise sits on a quorum of second-bucket copies; the read, which reads the first
//! bucket before the second in one ordered batch per node, meets one of them, a
//! copy that promised more than it accepted, and the fast round is not tried while
//! that is so (found by a 3,000-seed run of `tests/index_sim.rs`).

use swarm_core::Fabric;
use swarm_core::fabric::{Batch, Completion, NodeId, Op, OpOutput};
use swarm_core::quorum::broadcast_until_among;

use super::IndexError;
use super::bucket::{Status, View, first_free_slot, free_slots};
use super::engine::{Engine, MAX_BUCKETS};
use super::hash::KeyHash;
use super::lookup::candidates;
use super::word::{Ballot, Meta, Proposal, SLOTS};

/// The bucket a fast round may target: a key's first candidate.
const FIRST: usize = 0;

/// Free slots the first bucket needs for a fast round when the second bucket has
/// more: below that, the classic insert's choice of the emptier bucket (RACE's two
/// choices, FUSEE §4.2) keeps buckets from filling unevenly, and keys whose two
/// candidates coincide from finding theirs full.
const FAST_MIN_FREE: usize = SLOTS / 2 + 1;

/// A fast round an insert may try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// The meta word every node read showed for the first bucket, expected on every
    /// node.
    pub expected: u64,
    /// A ballot newer than that word's promise.
    pub ballot: Ballot,
    /// The `SET` of the first free slot of the first bucket.
    pub proposal: Proposal,
}

/// The fast round an insert may try after a read that produced `views`, or `None`
/// when the classic insert must run: the nodes read disagree on the first bucket's
/// meta word, that word promised more than it accepted, that bucket has a change in
/// flight or fewer free slots than both [`FAST_MIN_FREE`] and the second bucket,
/// the second bucket has a promise outstanding, a bucket is not readable, or a
/// fingerprint matches (telling keys apart needs their headers).
///
/// The word's promise must be its accepted ballot so that no classic proposer that
/// promised before the read can still accept under an older ballot than the fast
/// one: every change under an older ballot is then done or dead, which is what lets
/// [`super::bucket::newest_accepted`] drop a fast value some node lacks without
/// looking further back.
///
/// The nodes must agree on the word, not just merge into a settled view: a read
/// that straddles a decided change's arrival sees it on one node only, and
/// [`super::bucket::newest_accepted`] rightly ignores a fast value some copy lacks;
/// CASing from that node's word would then replace a decided, unapplied change.
pub(super) fn plan<F: Fabric>(
    eng: &Engine<'_, F>,
    views: &[View],
    hash: &KeyHash,
    register: u64,
) -> Option<Plan> {
    let expected = eng.agreed_meta(FIRST)?;
    let settled = Meta::decode(expected).is_ok_and(|m| match m.accepted {
        Some((ballot, _)) => m.promised == ballot,
        None => m.promised == Ballot(0),
    });
    if !settled {
        return None;
    }
    let first = views.get(FIRST)?;
    if first.status() != Status::Free {
        return None;
    }
    if views.iter().skip(FIRST + 1).any(promise_outstanding) {
        return None;
    }
    let states: Option<heapless::Vec<_, MAX_BUCKETS>> = views.iter().map(View::readable).collect();
    let states = states?;
    if !candidates(&states, hash).is_empty() {
        return None;
    }
    let others_free = states.iter().skip(FIRST + 1).map(free_slots).max();
    let first_free = free_slots(&states[FIRST]);
    if first_free < FAST_MIN_FREE && others_free.is_some_and(|o| first_free < o) {
        return None;
    }
    let slot = first_free_slot(&states[FIRST])?;
    let proposal = Proposal::Set {
        slot: slot as u8,
        register,
    };
    Some(Plan {
        expected,
        ballot: eng.next_ballot(FIRST),
        proposal,
    })
}

/// A blind fast round (module docs of [`super`], "one-roundtrip inserts"): the CAS
/// of the key's first bucket's meta word from all zeros, the word of a bucket that
/// never changed, to the `SET` of its first slot accepted under ballot 1 with the
/// fast flag, sent with no read before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlindInsert {
    /// The key's hash: the insert goes on from it when the round is not decided.
    pub(super) hash: KeyHash,
    /// The register the round maps the key to.
    pub(super) register: u64,
    /// The first bucket's meta word.
    addr: u64,
    /// What the CAS writes there.
    word: u64,
    ballot: Ballot,
    proposal: Proposal,
}

/// The word a blind fast round expects: a bucket that never changed.
const NEVER_CHANGED: u64 = 0;

impl BlindInsert {
    /// The blind fast round of an insert of the key of `hash` → `register`, whose
    /// first bucket's meta word is at `addr`.
    pub(super) fn new(hash: KeyHash, addr: u64, register: u64) -> Self {
        let ballot = Ballot(0).next();
        let proposal = Proposal::Set { slot: 0, register };
        Self {
            hash,
            register,
            addr,
            word: Meta::accepting(ballot, proposal, true).encode(),
            ballot,
            proposal,
        }
    }

    /// The CAS to run on every node, after the register's value and key header are
    /// written there (in the same ordered batch).
    pub fn op(&self) -> Op {
        Op::Cas {
            addr: self.addr,
            expected: NEVER_CHANGED,
            new: self.word,
        }
    }
}

/// How many nodes took a blind fast round whose CAS answered `took` (at most one
/// answer per node).
pub(super) fn blind_taken(took: &[(NodeId, OpOutput)]) -> usize {
    took.iter()
        .filter(|(_, output)| *output == OpOutput::Cas(NEVER_CHANGED))
        .count()
}

impl<F: Fabric> Engine<'_, F> {
    /// Learns what the blind fast round `blind`, sent at `sent`, found on the nodes
    /// that answered (`took`: what each node's CAS answered), and watches its
    /// proposal. True when every node of the index took it: decided.
    pub(super) fn learn_blind(
        &mut self,
        blind: &BlindInsert,
        took: &[(NodeId, OpOutput)],
        sent: swarm_core::fabric::Nanos,
    ) -> bool {
        self.watch_since(FIRST, blind.proposal, blind.ballot, sent);
        for (node, output) in took {
            let previous = match output {
                OpOutput::Cas(previous) => Some(*previous),
                _ => None,
            };
            self.learn_cas(*node, FIRST, Some(NEVER_CHANGED), previous, blind.word);
        }
        let decided = self.ix.blind_decided(took);
        if !decided {
            tracing::debug!(
                bucket = self.bucket(FIRST),
                taken = blind_taken(took),
                nodes = self.ix.nodes,
                "index: blind fast round not taken by every node (a bucket in use, a \
                 racing change, or a node down or slow); the insert goes on from a read"
            );
        }
        decided
    }

    /// Applies a decided blind fast round in the background.
    pub(super) async fn apply_blind(
        &mut self,
        blind: &BlindInsert,
        fp: u32,
    ) -> Result<(), IndexError> {
        self.apply(FIRST, blind.ballot, blind.proposal, Some(fp), false)
            .await
            .map(drop)
    }
}

/// Whether some copy merged into `view` promised a ballot newer than anything
/// accepted: a proposer may be between its phase 1 and its accept, such as a classic
/// insert of the same key into this bucket that already fenced the first one.
fn promise_outstanding(view: &View) -> bool {
    match view.latest {
        Some(latest) => view.max_promised.is_newer_than(latest.ballot),
        None => view.max_promised != Ballot(0),
    }
}

impl<F: Fabric> Engine<'_, F> {
    /// The fast round: CASes the first bucket's meta word on every node from
    /// `plan.expected` to its `SET` accepted under its ballot with the fast flag.
    /// True when every node took it: decided. Waits for every node only while they
    /// keep answering (a straggler gets `slow_after_ns`); a node that is down makes
    /// the round fail, not stall.
    pub(super) async fn fast_accept(&mut self, plan: Plan) -> Result<bool, IndexError> {
        self.fence()?;
        let nodes = self.ix.nodes;
        let addr = self.meta_addr(FIRST);
        let new = Meta::accepting(plan.ballot, plan.proposal, true).encode();
        let expected = plan.expected;
        let took = |(_, c): &(NodeId, Completion)| c.cas(0) == Some(expected);
        let rt = broadcast_until_among(
            self.fabric,
            self.stats,
            swarm_core::quorum::nodes(self.ix.nodes),
            self.quorum(),
            self.ix.config.slow_after_ns,
            |_| Ok(Some(Batch::cas(addr, expected, new))),
            |replies| replies.len() >= nodes || !replies.iter().all(took),
        )
        .await?;
        let all = rt.replies().len() >= nodes && rt.replies().iter().all(took);
        if !all {
            tracing::debug!(
                bucket = self.bucket(FIRST),
                took = rt.replies().iter().filter(|r| took(r)).count(),
                nodes,
                "index: fast round not taken by every node (a racing change, or a node \
                 down or slow); the classic insert takes over"
            );
        }
        let seen: Vec<(NodeId, Option<u64>)> =
            rt.replies().iter().map(|(n, c)| (*n, c.cas(0))).collect();
        drop(rt);
        for (node, previous) in seen {
            self.learn_cas(node, FIRST, Some(expected), previous, new);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::bucket::{NodeBucket, applied_slot};
    use crate::index::word::Slot;

    fn copy(meta: Meta, slots: [Slot; SLOTS]) -> NodeBucket {
        NodeBucket::of(meta, slots)
    }

    #[test]
    fn a_settled_empty_pair_of_buckets_plans_a_fast_set() {
        use crate::index::IndexConfig;
        use swarm_core::{MemCluster, OpStats};
        let ix = crate::index::tiny_test_index(IndexConfig::new(1));
        let cluster = MemCluster::new(3, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let hash = ix.key_hash(b"k").unwrap();
        let mut eng = Engine::new(&ix, &fabric, &stats, &hash.buckets(), 1);
        // Nothing read yet: no agreed word, no fast round.
        let empty = [Slot::EMPTY; SLOTS];
        let free = View::merge(&[copy(Meta::EMPTY, empty); 2], 2).unwrap();
        assert_eq!(plan(&eng, &[free, free], &hash, 5), None);
        eng.learn_meta(NodeId(0), FIRST, 0);
        eng.learn_meta(NodeId(1), FIRST, 0);
        let Plan {
            expected,
            ballot,
            proposal: p,
        } = plan(&eng, &[free, free], &hash, 5).unwrap();
        assert_eq!((expected, ballot), (0, Ballot(1)));
        assert_eq!(
            p,
            Proposal::Set {
                slot: 0,
                register: 5
            }
        );
        // A change in flight in the first bucket: classic.
        let open = View::merge(
            &[
                copy(Meta::accepting(Ballot(2), p, false), empty),
                copy(Meta::EMPTY, empty),
            ],
            2,
        )
        .unwrap();
        assert_eq!(plan(&eng, &[open, free], &hash, 5), None);
        // A fingerprint match in the second bucket: classic (headers decide).
        let mut taken = empty;
        taken[3] = applied_slot(
            Ballot(1),
            Proposal::Set {
                slot: 3,
                register: 9,
            },
            Some(hash.fp),
        );
        let matching = View::merge(&[copy(Meta::EMPTY, taken); 2], 2).unwrap();
        assert_eq!(plan(&eng, &[free, matching], &hash, 5), None);
        // A full first bucket: classic (it may use the second).
        let full = [applied_slot(
            Ballot(1),
            Proposal::Set {
                slot: 0,
                register: 9,
            },
            Some(hash.fp ^ 1),
        ); SLOTS];
        let full = View::merge(&[copy(Meta::EMPTY, full); 2], 2).unwrap();
        assert_eq!(plan(&eng, &[full, free], &hash, 5), None);
        // The nodes read disagree on the meta word: classic, even if the view is
        // settled.
        eng.learn_meta(
            NodeId(1),
            FIRST,
            Meta::accepting(Ballot(1), p, true).encode(),
        );
        assert_eq!(plan(&eng, &[free, free], &hash, 5), None);
    }
}
