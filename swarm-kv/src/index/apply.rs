//! Writing decided changes into their slots, and keeping slot tags comparable
//! (module docs of [`super`]).
//!
//! A decided change is written into its slot tagged with its ballot, by a CAS that
//! only moves tags forward, so the proposer, helpers and late duplicates may all do
//! it (rTX's idempotent CAS commit, rTX §4.3).

use swarm_core::Fabric;
use swarm_core::fabric::{Batch, Completion, NodeId, Op};
use swarm_core::post_background;
use swarm_core::quorum::broadcast_until_among;

use super::IndexError;
use super::bucket::{applied_slot, earlier_life_floor, holds_change};
use super::engine::Engine;
use super::word::{Ballot, Proposal, SLOTS, Slot};

/// Slots whose tag is this many ballots behind get rewritten with a current tag.
pub const REFRESH_AGE: u16 = 1 << 13;

/// What an apply batch does at one node.
#[derive(Clone, Copy, Debug)]
struct ApplyPlan {
    /// The word the slot is expected to hold.
    current: u64,
    /// The word to write instead.
    new: u64,
    /// Also mark a copy written by a helper (the owner's apply).
    mark_helper: bool,
}

impl<F: Fabric> Engine<'_, F> {
    /// Writes a decided change into its slot on every node where the slot does not
    /// already hold it (or something newer): a CAS that only moves tags forward.
    /// `owner_fp` is `Some(fingerprint)` when the change's owner applies it (which
    /// also marks it acknowledged). With `wait`, returns whether a quorum of nodes
    /// confirmed holding it in this call (CASes that lost a race are retried; nodes
    /// that already hold it confirm with a CAS that changes nothing); otherwise posts
    /// the writes in the background.
    pub async fn apply(
        &mut self,
        i: usize,
        ballot: Ballot,
        proposal: Proposal,
        owner_fp: Option<u32>,
        wait: bool,
    ) -> Result<bool, IndexError> {
        let (Some(s), Some(content)) = (proposal.slot(), proposal.content()) else {
            return Ok(true);
        };
        self.fence()?;
        let q = self.quorum();
        let addr = self.slot_addr(i, s);
        let target = applied_slot(ballot, proposal, owner_fp);
        let helper_word = applied_slot(ballot, proposal, None).encode();
        self.refresh(i, Some(s), ballot)?;
        let mut confirmed = vec![false; self.ix.nodes];
        for _round in 0..3 {
            // Whether `slot` is the change itself, not a copy of an earlier life of the
            // mapping, as far as the copies known tell (`bucket`'s module docs): such
            // a copy is overwritten like any older word.
            let floor = earlier_life_floor(
                (0..self.ix.nodes)
                    .filter_map(|node| Slot::decode(self.expected_slot(node, i, s)).ok()),
                ballot,
                content,
            );
            let is_change = |slot: &Slot| holds_change(*slot, content, floor);
            // Whether the slot, as `word`, already holds the change as needed.
            let holds = |word: u64| {
                Slot::decode(word).is_ok_and(|slot| {
                    if is_change(&slot) {
                        owner_fp.is_none() || slot.by_owner()
                    } else {
                        slot.content() != content && slot.tag.is_newer_than(ballot)
                    }
                })
            };
            // One batch per unconfirmed node, with the word its first CAS expects and
            // writes; a second CAS marks a copy a helper wrote first.
            let mut plans: Vec<Option<ApplyPlan>> = Vec::with_capacity(self.ix.nodes);
            for (node, done) in confirmed.iter().enumerate() {
                let current = self.expected_slot(node, i, s);
                let plan = match Slot::decode(current) {
                    _ if *done => None,
                    _ if holds(current) => wait.then_some(ApplyPlan {
                        current,
                        new: current,
                        mark_helper: false,
                    }),
                    Ok(slot) if is_change(&slot) => Some(ApplyPlan {
                        current,
                        new: Slot {
                            tag: slot.tag,
                            state: target.state,
                        }
                        .encode(),
                        mark_helper: false,
                    }),
                    _ => Some(ApplyPlan {
                        current,
                        new: target.encode(),
                        mark_helper: owner_fp.is_some() && current != helper_word,
                    }),
                };
                plans.push(plan);
            }
            let batch = |plan: &ApplyPlan| -> Result<Batch, swarm_core::FabricError> {
                let mut batch = Batch::cas(addr, plan.current, plan.new);
                if plan.mark_helper {
                    batch.push(Op::Cas {
                        addr,
                        expected: helper_word,
                        new: target.encode(),
                    })?;
                }
                Ok(batch)
            };
            if !wait {
                for (node, plan) in plans.iter().enumerate() {
                    if let Some(plan) = plan {
                        post_background(self.fabric, NodeId(node as u16), batch(plan)?);
                    }
                }
                return Ok(true);
            }
            let already = confirmed.iter().filter(|c| **c).count();
            // The slot's word after the batch, as far as the replies tell.
            let after = |plan: &ApplyPlan, c: &Completion| -> Option<u64> {
                match (c.cas(0), c.cas(1)) {
                    (Some(p), _) if p == plan.current => Some(plan.new),
                    (_, Some(p)) if p == helper_word => Some(target.encode()),
                    (_, Some(p)) => Some(p),
                    (p, None) => p,
                }
            };
            let rt = broadcast_until_among(
                self.fabric,
                self.stats,
                swarm_core::quorum::nodes(self.ix.nodes),
                q.saturating_sub(already).max(1),
                self.ix.config.slow_after_ns,
                |node| plans[node.index()].as_ref().map(&batch).transpose(),
                |replies| {
                    already
                        + replies
                            .iter()
                            .filter(|(node, c)| {
                                plans[node.index()]
                                    .as_ref()
                                    .and_then(|plan| after(plan, c))
                                    .is_some_and(holds)
                            })
                            .count()
                        >= q
                },
            )
            .await?;
            let replies: Vec<(NodeId, Completion)> = rt.replies().to_vec();
            drop(rt);
            for (node, c) in &replies {
                let Some(word) = plans[node.index()].as_ref().and_then(|plan| after(plan, c))
                else {
                    continue;
                };
                confirmed[node.index()] |= holds(word);
                self.learn_slot(*node, i, s, word);
            }
            if confirmed.iter().filter(|c| **c).count() >= q {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Keeps slot tags comparable (module docs of [`super`], "limits"): tags are
    /// 16-bit serial numbers, so a slot left untouched for `2^15` ballots would look
    /// newer than current ballots. Rewrites every slot of bucket `i` but `except`
    /// whose newest known copy is [`REFRESH_AGE`] or more behind `ballot` with that
    /// copy's content and tag `ballot`. Callers pass a ballot under which nothing but
    /// a change of slot `except` is decided, and call it once the bucket's other slots
    /// are settled (when applying a change, or after fencing the bucket): no later
    /// change can get an older ballot, and a refresh that lost a race fails its CAS.
    /// Posted in the background; whatever does not land is retried by a later update.
    pub fn refresh(
        &mut self,
        i: usize,
        except: Option<usize>,
        ballot: Ballot,
    ) -> Result<(), IndexError> {
        let mut aged: heapless::Vec<(usize, Slot), SLOTS> = heapless::Vec::new();
        for s in (0..SLOTS).filter(|s| Some(*s) != except) {
            let Some(newest) = self.newest_known(i, s) else {
                continue;
            };
            if ballot.0.wrapping_sub(newest.tag.0) >= REFRESH_AGE {
                let _ = aged.push((s, newest));
            }
        }
        if aged.is_empty() {
            return Ok(());
        }
        for node in 0..self.ix.nodes {
            for chunk in aged.chunks(swarm_core::fabric::INLINE_BATCH_OPS) {
                let mut batch = Batch::new();
                for &(s, newest) in chunk {
                    let expected = self.expected_slot(node, i, s);
                    let new = Slot {
                        tag: ballot,
                        state: newest.state,
                    }
                    .encode();
                    if expected != new {
                        batch.push(Op::Cas {
                            addr: self.slot_addr(i, s),
                            expected,
                            new,
                        })?;
                    }
                }
                if !batch.is_empty() {
                    post_background(self.fabric, NodeId(node as u16), batch);
                }
            }
        }
        Ok(())
    }
}
