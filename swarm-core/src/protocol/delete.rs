//! Deletes, and which of several concurrent deletes removed the value (SWARM-KV
//! §5.3.2).
//!
//! A delete writes the tombstone, which is above every write, so the register stays
//! deleted whichever delete lands where. What a delete *reports* is harder: "I
//! removed the value" or "it was deleted already" is a test-and-set, and deciding one
//! winner among deletes racing over crash-prone memory nodes is consensus, which no
//! wait-free protocol solves. SWARM's deletes stay one-roundtrip and wait-free, so
//! they report only what they can know, and say so when they cannot.
//!
//! # The delete word
//!
//! Tombstones live in one place only: the register's **delete word**
//! ([`crate::layout::Layout::delete_word_addr`]), after the `W` metadata words. It is
//! written once per life: every tombstone write is a CAS that expects it to hold the
//! register's *life marker* (⊥ in memory never reset, else what the last reset left,
//! `crate::RegisterCache`), whether a delete writes its own tombstone
//! ([`tombstone_round`]) or a read or a write that found a tombstone on a minority
//! writes that tombstone back (`maxreg::write_round`). So each node's delete word
//! holds, from the first tombstone write that reached it on, the **first tombstone**
//! of that node, `T(p)`, and never changes (until the register is reset for another
//! life, which needs every replica, `swarm-kv`'s recycling). Reads take the delete
//! word into the node's maximum like any metadata word; which tombstone it holds does
//! not matter to them. A delete is complete on a node once its delete word holds any
//! tombstone.
//!
//! The CAS returns the word it found, atomically: the life marker means this delete
//! installed its tombstone as `T(p)`; a tombstone means `T(p)` is that one; another
//! marker means the register was reset for another life since the client learned
//! its marker: the CAS changed nothing, and the delete stops with
//! [`SwarmError::Recycled`]. A delete paused for any time between its checks and its
//! CAS therefore never tombstones a later life: that life's marker is above every
//! word of earlier lives, so the expected word is never there again.
//!
//! # What a delete reports, over the replicas that answered (always a majority)
//!
//! * [`DeleteOutcome::Removed`] if its CAS installed its tombstone on every one of
//!   them.
//! * [`DeleteOutcome::Absent`] if it found one same other writer's tombstone on every
//!   one of them (a writer: not [`UNOWNED_TOMBSTONE`]).
//! * [`DeleteOutcome::Raced`] otherwise: the register is deleted, and which delete
//!   removed the value is undecided; the caller must not claim either answer (a
//!   history records the outcome as unknown). This includes finding this writer's
//!   own tombstone: an earlier delete of the same writer may have put it there (the
//!   value was gone), or a reader may have carried this delete's there from a replica
//!   where it was first (this delete may have removed it).
//!
//! Why this is linearizable, for the deletes of one value `v` (a register holds one
//! value until it is deleted, and is never written again). Call *W* the writer whose
//! tombstone is first on a majority of nodes, if there is one: there is at most one
//! (majorities intersect and `T(p)` is unique), and *W*'s first delete of the
//! register is the one that put its tombstone anywhere.
//!
//! * An `Absent` delete found `T(W)` on a majority, so *W* exists; *W*'s delete
//!   answered on a node of that majority, where it found `⊥` or its own tombstone,
//!   so it is not `Absent` itself. A `Removed` delete installed its tombstone on the
//!   majority that answered: it is *W*'s, so there is at most one.
//! * *W*'s delete is the one that removed `v`. No operation reported `v` absent
//!   before it began: an operation that reports a tombstone returns only once a
//!   tombstone is on a majority (reads and writes write it back), and that majority
//!   shares a node with *W*'s, where the first tombstone, present then, is *W*'s.
//!   Every `Absent` delete found `T(W)` on nodes *W* had reached, so it ends after
//!   *W*'s delete began, and is linearized after it.
//! * Without such a *W* no delete is `Absent` or `Removed`: all are `Raced` (or still
//!   running, or crashed). The first operation `Z` to report `v` absent saw
//!   tombstones on a majority, not all of one writer; the first delete `D` of a writer
//!   whose tombstone is among them (an [`UNOWNED_TOMBSTONE`] stands for one a repair
//!   donor held) had begun before `Z` returned, and is linearized as the one that
//!   removed `v`, the other `Raced` deletes after it as having found it absent.
//!
//! `swarm-sim/tests/sim_concurrent_deletes.rs` shows each outcome; a KV store that
//! reaches a register through a cache must also make sure the register was still the
//! key's (`swarm-kv`'s `KvClient::delete`).

use crate::clock::Clock;
use crate::encoding::{Flag, Timestamp, Tsp, WriterId};
use crate::fabric::{Batch, Fabric, Op};
use crate::roundtrip::OpStats;

use super::register::{MAX_REPLICAS, RegisterCache, RegisterLoc};
use super::{Client, SwarmError};

/// How a delete ended (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// This delete removed the value: its tombstone came first on every replica that
    /// answered.
    Removed,
    /// The register (the key) was deleted already: another delete's tombstone came
    /// first on every replica that answered.
    Absent,
    /// Another delete ran at the same time (or a node missed an earlier one) and the
    /// replicas that answered disagree on which came first: the register is deleted,
    /// but which delete removed the value is undecided.
    Raced,
}

impl DeleteOutcome {
    /// `Some(true)` if this delete removed the value, `Some(false)` if it was absent,
    /// `None` if it raced another delete (the answer is unknown, not false).
    pub const fn removed(self) -> Option<bool> {
        match self {
            Self::Removed => Some(true),
            Self::Absent => Some(false),
            Self::Raced => None,
        }
    }
}

/// The tombstone that a repaired node's delete word gets where its donors disagree
/// (`swarm-kv`'s repair): a tombstone (the register is deleted) that is no writer's
/// first, because deletes and write-backs only ever write VERIFIED tombstones. A
/// delete that finds it on a node cannot tell who came first there.
pub const UNOWNED_TOMBSTONE: Tsp = Tsp::new(Timestamp::tombstone(WriterId::FIRST), Flag::Guessed);

/// Whose tombstone a register's delete words hold first, as far as one client knows
/// (see [`Client::first_deleter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstDeleter {
    /// This client's tombstone is first on a majority of replicas.
    Me,
    /// Other tombstones (or none yet) are first on so many replicas that this
    /// client's cannot be first on a majority.
    NotMe,
    /// Too few replicas answered to tell.
    Unknown,
}

/// What one delete learned of each replica's first tombstone, position by position:
/// from [`Client::delete_with_votes`], for [`Client::first_deleter`].
#[derive(Clone, Debug)]
pub struct DeleteVotes {
    writer: WriterId,
    /// What the delete words held in the register's life before any tombstone (what
    /// this delete's CAS expected).
    untombstoned: Tsp,
    /// What the replica's delete word held before this delete's CAS (or a read):
    /// `⊥` if this delete's CAS installed its tombstone, else the first tombstone.
    found: [Option<Tsp>; MAX_REPLICAS],
    /// Replicas sent a CAS of this delete whose answer was not taken in (failed,
    /// late, or not a delete word's content): the CAS may have landed there.
    unseen: [bool; MAX_REPLICAS],
}

impl DeleteVotes {
    /// Nothing learned yet, for a delete by `writer`.
    pub(crate) fn new(writer: WriterId, untombstoned: Tsp) -> Self {
        Self {
            writer,
            untombstoned,
            found: [None; MAX_REPLICAS],
            unseen: [false; MAX_REPLICAS],
        }
    }

    /// Whether this delete's tombstone is on no replica: every CAS it sent was
    /// answered, and none installed the tombstone. The delete then changed nothing,
    /// and a tombstone of this writer that it found is an earlier delete's: no reader
    /// can have carried this one's anywhere. (A KV store that reached the register
    /// through a cache may then look the key up and delete it anew, whatever life of
    /// the register those tombstones ended: `swarm-kv`'s `KvClient::delete`.)
    pub fn landed_nowhere(&self) -> bool {
        !self.unseen.iter().any(|&u| u) && !self.found.iter().flatten().any(|f| f.is_empty())
    }

    /// Replica `p`'s delete word held `found` when this delete's CAS reached it: `⊥`
    /// standing for "what the CAS expected" (the life's marker: it installed its
    /// tombstone), or a tombstone. Only the first answer counts.
    pub(crate) fn learn(&mut self, p: usize, found: Tsp) {
        debug_assert!(found.is_empty() || found.is_tombstone());
        self.found[p].get_or_insert(found);
    }

    /// Whether replica `p` answered.
    pub(crate) fn knows(&self, p: usize) -> bool {
        self.found[p].is_some()
    }

    /// This writer's tombstone, found where this delete did not install it: put there
    /// by an earlier delete of this writer, or carried by a reader from a replica where
    /// this delete installed it. Which of the two is unknown.
    fn own(&self, found: Tsp) -> bool {
        found.flag() == Flag::Verified && found.ts().writer() == self.writer
    }

    /// The outcome over the first `n` replicas, from those that answered (see the
    /// module docs).
    pub(crate) fn outcome(&self, n: usize) -> DeleteOutcome {
        let mut answered = self.found[..n].iter().flatten().copied();
        let Some(one) = answered.next() else {
            return DeleteOutcome::Raced;
        };
        let same = answered.all(|t| t == one);
        if same && one.is_empty() {
            DeleteOutcome::Removed
        } else if same && one != UNOWNED_TOMBSTONE && !self.own(one) {
            DeleteOutcome::Absent
        } else {
            DeleteOutcome::Raced
        }
    }

    /// Whether this delete's tombstone is first on a majority of the first `n`
    /// replicas. A replica counts as this delete's if its CAS installed the tombstone
    /// there; as unknown if it found this writer's tombstone there (this delete's,
    /// carried by a reader, or an earlier delete's) or did not answer.
    fn first_deleter(&self, n: usize, quorum: usize) -> FirstDeleter {
        let mut mine = 0;
        let mut unknown = 0;
        for found in &self.found[..n] {
            match found {
                Some(found) if found.is_empty() => mine += 1,
                Some(found) if self.own(*found) => unknown += 1,
                Some(_) => {}
                None => unknown += 1,
            }
        }
        if mine >= quorum {
            FirstDeleter::Me
        } else if mine + unknown < quorum {
            FirstDeleter::NotMe
        } else {
            FirstDeleter::Unknown
        }
    }
}

impl<F: Fabric, C: Clock> Client<F, C> {
    /// Writes tombstone `tomb` until a majority of the register's delete words hold a
    /// tombstone (any: see the module docs), CASing each delete word expecting it
    /// empty. With `votes` (a delete), a replica counts only once this CAS answered
    /// there, and `votes` learns what it found: a delete must learn a majority's first
    /// tombstones from its own CAS, even where the cache already knows one.
    pub(crate) async fn tombstone_round(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        tomb: Tsp,
        mut votes: Option<&mut DeleteVotes>,
    ) -> Result<(), SwarmError> {
        debug_assert!(tomb.is_tombstone());
        let n = reg.replicas.len();
        let q = reg.replicas.quorum();
        let layout = self.layout;
        let mut failed = [false; MAX_REPLICAS];
        // What the delete words hold in this life before a tombstone: its marker.
        let untombstoned = cache.untombstoned();
        loop {
            // A replica is done once its first tombstone is known: from this round's
            // answers for a delete, from anything learned for a write-back (the only
            // tombstone a node can hold is its delete word's).
            let done = |p: usize, votes: Option<&DeleteVotes>| match votes {
                Some(votes) => votes.knows(p),
                None => cache.known_max.get(p).is_tombstone(),
            };
            let have = (0..n).filter(|&p| done(p, votes.as_deref())).count();
            if have >= q {
                return Ok(());
            }
            let candidates: heapless::Vec<usize, MAX_REPLICAS> = (0..n)
                .filter(|&p| !failed[p] && !done(p, votes.as_deref()))
                .collect();
            let need = q - have;
            super::maxreg::enough_candidates(&candidates, need)?;
            let mut rt = self
                .quorum_step(stats, reg, &candidates, need, |p, batch| {
                    batch.push(Op::Cas {
                        addr: layout.delete_word_addr(reg.offset(p)),
                        expected: untombstoned.word(),
                        new: tomb.word(),
                    })?;
                    Ok(())
                })
                .await?;
            for (node, _) in rt.failures() {
                if let Some(p) = reg.replicas.position(*node) {
                    failed[p] = true;
                }
            }
            if let Some(votes) = votes.as_deref_mut() {
                // Every replica this step sent the CAS to and whose answer is not
                // taken in below may hold it (`DeleteVotes::landed_nowhere`).
                for &p in &candidates {
                    let node = reg.replicas.node(p);
                    let answered = rt.replies().iter().any(|(n, c)| {
                        *n == node
                            && super::inout::cas_result(c, 0)
                                .is_some_and(|f| f == untombstoned || f.is_tombstone())
                    });
                    if rt.contacted(node) && !answered {
                        votes.unseen[p] = true;
                    }
                }
            }
            for (node, completion) in rt.replies_mut() {
                let Some(p) = reg.replicas.position(*node) else {
                    continue;
                };
                let Some(found) = super::inout::cas_result(completion, 0) else {
                    continue;
                };
                if found != untombstoned && !found.is_tombstone() {
                    if found.is_reset() {
                        // Another life's marker: the register was reset since this
                        // client learned what it knows, and the CAS changed nothing.
                        return Err(SwarmError::Recycled { found });
                    }
                    // Not a delete word's content: only tombstones and reset markers
                    // are ever written there. Treat the node as not answering.
                    failed[p] = true;
                    continue;
                }
                let installed = found == untombstoned;
                cache.learn(p, if installed { tomb } else { found });
                if let Some(votes) = votes.as_deref_mut() {
                    votes.learn(p, if installed { Tsp::EMPTY } else { found });
                }
            }
        }
    }

    /// Deletes the register's value with this writer's tombstone (§5.3.2), and says
    /// whether this delete removed the value, found it deleted already, or raced
    /// another delete (see the module docs). One roundtrip when a majority answers in
    /// time.
    pub async fn delete(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<DeleteOutcome, SwarmError> {
        Ok(self.delete_with_votes(reg, cache, stats).await?.0)
    }

    /// [`Client::delete`], also returning what it learned of each replica, for a
    /// caller that may need [`Client::first_deleter`] next.
    pub async fn delete_with_votes(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<(DeleteOutcome, DeleteVotes), SwarmError> {
        let _deadline = self.arm_deadline(stats);
        let _slot = self.write_slot(reg).await;
        let tomb = Tsp::new(Timestamp::tombstone(self.writer), Flag::Verified);
        let mut votes = DeleteVotes::new(self.writer, cache.untombstoned());
        self.tombstone_round(reg, cache, stats, tomb, Some(&mut votes))
            .await?;
        // A tombstone is on a majority: every write of this writer here is superseded.
        self.settle(reg, stats, tomb)?;
        let outcome = votes.outcome(reg.replicas.len());
        if outcome == DeleteOutcome::Raced {
            tracing::debug!(
                writer = self.writer.get(),
                register = reg.id,
                "delete raced another delete of the same value (or a node missed an \
                 earlier one): the register is deleted, which delete removed the value \
                 is undecided"
            );
        }
        Ok((outcome, votes))
    }

    /// Completes the delete that learned `votes` on every replica that answers within
    /// a few times the slow-node patience (its tombstone CASed into each delete word
    /// it did not reach, as the delete could have done), and says whether its
    /// tombstone is first on a majority ([`FirstDeleter`]). One roundtrip; for a
    /// caller that found a delete `Raced` and must know whether it may have been the
    /// one that removed the value.
    pub async fn first_deleter(
        &self,
        reg: &RegisterLoc,
        votes: &DeleteVotes,
        stats: &OpStats,
    ) -> Result<FirstDeleter, SwarmError> {
        let _deadline = self.arm_deadline(stats);
        let n = reg.replicas.len();
        let tomb = Tsp::new(Timestamp::tombstone(self.writer), Flag::Verified);
        let untombstoned = votes.untombstoned;
        let mut votes = votes.clone();
        let mut rt = crate::roundtrip::Roundtrip::start(&self.fabric, stats);
        let mut asked = 0;
        for p in (0..n).filter(|&p| !votes.knows(p)) {
            rt.post(
                reg.replicas.node(p),
                Batch::cas(
                    self.layout.delete_word_addr(reg.offset(p)),
                    untombstoned.word(),
                    tomb.word(),
                ),
            )?;
            asked += 1;
        }
        let deadline = self
            .fabric
            .now()
            .saturating_add(self.config.slow_after_ns.saturating_mul(4));
        let _ = rt.wait_until(asked, deadline).await;
        for (node, completion) in rt.replies_mut() {
            let Some(p) = reg.replicas.position(*node) else {
                continue;
            };
            if let Some(found) = super::inout::cas_result(completion, 0) {
                if found == untombstoned {
                    votes.learn(p, Tsp::EMPTY);
                } else if found.is_tombstone() {
                    votes.learn(p, found);
                }
            }
        }
        Ok(votes.first_deleter(n, reg.replicas.quorum()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(id: u32) -> WriterId {
        WriterId::new(id).unwrap()
    }

    fn tomb(id: u32) -> Tsp {
        Tsp::new(Timestamp::tombstone(writer(id)), Flag::Verified)
    }

    /// A delete by `me` whose CAS found `found` on each replica listed.
    fn votes(me: u32, found: &[(usize, Tsp)]) -> DeleteVotes {
        let mut votes = DeleteVotes::new(writer(me), Tsp::EMPTY);
        for &(p, first) in found {
            votes.learn(p, first);
        }
        votes
    }

    const MINE: Tsp = Tsp::EMPTY;

    #[test]
    fn first_everywhere_removed_it() {
        let v = votes(1, &[(0, MINE), (2, MINE)]);
        assert_eq!(v.outcome(3), DeleteOutcome::Removed);
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::Me);
    }

    #[test]
    fn one_other_delete_first_everywhere_means_absent() {
        let v = votes(1, &[(0, tomb(2)), (1, tomb(2))]);
        assert_eq!(v.outcome(3), DeleteOutcome::Absent);
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::NotMe);
    }

    #[test]
    fn first_on_some_and_second_on_others_raced() {
        let v = votes(1, &[(0, MINE), (1, tomb(2))]);
        assert_eq!(v.outcome(3), DeleteOutcome::Raced);
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::Unknown);
        let mut third = v.clone();
        third.learn(2, tomb(2));
        assert_eq!(third.first_deleter(3, 2), FirstDeleter::NotMe);
        // Its own tombstone on the third replica: carried there by a reader from the
        // first (this delete came first on a majority), or an earlier delete's.
        let mut third = v.clone();
        third.learn(2, tomb(1));
        assert_eq!(third.first_deleter(3, 2), FirstDeleter::Unknown);
        let mut third = v;
        third.learn(2, MINE);
        assert_eq!(third.first_deleter(3, 2), FirstDeleter::Me);
    }

    #[test]
    fn its_own_tombstone_found_first_is_not_a_win() {
        // An earlier delete of the same writer put it there (the key was absent), or
        // a reader carried this delete's there (it may have removed the value).
        let v = votes(1, &[(0, tomb(1)), (1, tomb(1))]);
        assert_eq!(v.outcome(3), DeleteOutcome::Raced);
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::Unknown);
    }

    #[test]
    fn two_other_deletes_first_on_different_nodes_is_not_absent() {
        // Three deletes, each first on one node and answered by the other two: if
        // each reported `Absent`, none would have removed the value.
        let v = votes(1, &[(1, tomb(2)), (2, tomb(3))]);
        assert_eq!(v.outcome(3), DeleteOutcome::Raced);
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::NotMe);
    }

    #[test]
    fn an_unowned_tombstone_is_nobodys_first() {
        let v = votes(1, &[(0, UNOWNED_TOMBSTONE), (1, UNOWNED_TOMBSTONE)]);
        assert_eq!(v.outcome(3), DeleteOutcome::Raced);
        assert!(UNOWNED_TOMBSTONE.is_tombstone());
        assert_eq!(v.first_deleter(3, 2), FirstDeleter::NotMe);
    }

    #[test]
    fn the_first_answer_of_a_replica_is_the_one_that_counts() {
        let mut v = votes(1, &[(0, MINE), (1, MINE)]);
        v.learn(1, tomb(2));
        assert_eq!(v.outcome(3), DeleteOutcome::Removed);
    }

    #[test]
    fn a_delete_whose_every_cas_answered_without_installing_landed_nowhere() {
        // Others' tombstones, or this writer's own (an earlier delete's: no reader
        // can have carried this one's from anywhere).
        assert!(votes(1, &[(0, tomb(2)), (1, tomb(3))]).landed_nowhere());
        assert!(votes(1, &[(0, tomb(1)), (1, tomb(1))]).landed_nowhere());
        // Installed somewhere.
        assert!(!votes(1, &[(0, MINE), (1, tomb(2))]).landed_nowhere());
        // A CAS sent to a replica whose answer was not taken in may have landed.
        let mut v = votes(1, &[(0, tomb(2)), (1, tomb(2))]);
        v.unseen[2] = true;
        assert!(!v.landed_nowhere());
    }

    #[test]
    fn nothing_known_decides_nothing() {
        assert_eq!(votes(1, &[]).outcome(3), DeleteOutcome::Raced);
    }

    #[test]
    fn removed_maps_to_the_histories_outcome() {
        assert_eq!(DeleteOutcome::Removed.removed(), Some(true));
        assert_eq!(DeleteOutcome::Absent.removed(), Some(false));
        assert_eq!(DeleteOutcome::Raced.removed(), None);
    }
}
