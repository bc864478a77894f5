//! Scrubbing: bringing lagging copies of the index's slots up to date.
//!
//! Every update applies its change on a quorum of nodes, so a node that was down,
//! partitioned or slow misses applies, and nothing ever writes them later: its copy
//! of a slot keeps an old tag. Lookups do not care (they merge a quorum's copies
//! and take the newest tag), but the lag never heals. It matters twice: the cluster
//! depends on that node's copy as soon as another node fails, and slot tags are
//! 16-bit serial numbers, so a copy that falls `2^15` ballots behind compares the
//! wrong way (module docs of [`super`], "Limits").
//!
//! A scrub reads every bucket from every node that answers, merges the copies as a
//! lookup does ([`super::bucket::View`]) and, on each node whose copy of a slot is
//! older than the newest copy, CASes the slot from the word it holds to the newest
//! word. That is exactly a helper's apply ([`super::apply`]): every slot word is a
//! decided change, and a CAS from the observed word only moves the slot forward, so
//! it is safe alongside any update in flight (an apply that loses the race to it
//! retries from the new word, as against another helper). Meta words (the Paxos
//! acceptors) are left alone: an acceptor that missed messages is still a correct
//! acceptor.

use std::ops::Range;

use swarm_core::fabric::{Batch, INLINE_BATCH_OPS, NodeId, Op};
use swarm_core::quorum::broadcast_until_among;
use swarm_core::{Fabric, OpStats, post_background};

use super::bucket::{NodeBucket, View};
use super::word::SLOTS;
use super::{Index, IndexError};
use crate::layout::BUCKET_BYTES;

/// Buckets read per batch (4 KiB).
const BUCKETS_PER_READ: u64 = 64;

/// What a scrub did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Buckets examined.
    pub buckets: u64,
    /// Slot copies found lagging, and moved forward (by a CAS posted in the
    /// background: one that loses a race to an update was overtaken anyway).
    pub repaired: u64,
    /// Buckets not judged: fewer than a quorum of well-formed copies answered.
    pub skipped: u64,
}

impl Index {
    /// Scrubs `buckets` (see the module docs): reads them from every node that
    /// answers and moves lagging slot copies forward.
    pub async fn scrub<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        buckets: Range<u64>,
    ) -> Result<ScrubReport, IndexError> {
        self.check_fabric(fabric)?;
        let end = buckets.end.min(self.layout.params.index_buckets);
        let mut report = ScrubReport::default();
        let mut first = buckets.start;
        while first < end {
            let count = (end - first).min(BUCKETS_PER_READ);
            self.scrub_range(fabric, stats, first, count, &mut report)
                .await?;
            first += count;
        }
        Ok(report)
    }

    async fn scrub_range<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        first: u64,
        count: u64,
        report: &mut ScrubReport,
    ) -> Result<(), IndexError> {
        let at = self.layout.bucket(first);
        let len = (count * BUCKET_BYTES) as u32;
        let nodes = self.nodes;
        let rt = broadcast_until_among(
            fabric,
            stats,
            swarm_core::quorum::nodes(self.nodes),
            self.quorum(),
            self.config.slow_after_ns,
            |_| Ok(Some(Batch::read(at, len))),
            |replies| replies.len() == nodes,
        )
        .await?;
        let registers = self.layout.register_ids();
        let mut repairs: Vec<Vec<Op>> = vec![Vec::new(); nodes];
        for b in 0..count as usize {
            let range = b * BUCKET_BYTES as usize..(b + 1) * BUCKET_BYTES as usize;
            let copies: Vec<(NodeId, NodeBucket)> = rt
                .replies()
                .iter()
                .filter_map(|(node, c)| {
                    let bytes = c.read(0)?.get(range.clone())?;
                    Some((*node, NodeBucket::parse(bytes, registers).ok()?))
                })
                .collect();
            report.buckets += 1;
            let merged: Vec<NodeBucket> = copies.iter().map(|(_, c)| *c).collect();
            let view = match View::merge(&merged, self.quorum()) {
                Ok(view) if copies.len() >= self.quorum() => view,
                _ => {
                    report.skipped += 1;
                    continue;
                }
            };
            let bucket_at = at + (b as u64) * BUCKET_BYTES;
            for (node, copy) in &copies {
                for s in 0..SLOTS {
                    let newest = view.slots[s];
                    if newest.tag.is_newer_than(copy.slots[s].tag) {
                        repairs[node.index()].push(Op::Cas {
                            addr: bucket_at + 8 * (s as u64 + 1),
                            expected: copy.slot_words[s],
                            new: newest.encode(),
                        });
                        report.repaired += 1;
                    }
                }
            }
        }
        drop(rt);
        for (node, ops) in repairs.into_iter().enumerate() {
            for chunk in ops.chunks(INLINE_BATCH_OPS) {
                let mut batch = Batch::new();
                for op in chunk {
                    // A chunk holds at most INLINE_BATCH_OPS operations.
                    let _ = batch.push(op.clone());
                }
                post_background(fabric, NodeId(node as u16), batch);
            }
        }
        Ok(())
    }
}
