//! Reads: `lookup` (the candidates of a key), `resolve` (the register a key maps
//! to) and `count`.
//!
//! A lookup reads both candidate buckets of the key from a preferred majority in one
//! batch per node: one roundtrip. When a bucket's newest accepted change is *open*
//! (accepted somewhere, not provably decided: an update is in flight), the lookup
//! re-reads a few times, then settles the bucket itself with a Paxos round (module
//! docs of [`super`], "reads").

use swarm_core::fabric::{Batch, Op};
use swarm_core::quorum::broadcast_until_among;
use swarm_core::{Fabric, OpStats};

use super::bucket::{NodeBucket, Status, View};
use super::engine::{Engine, MAX_BUCKETS, Settled};
use super::hash::{HashedKey, KeyHash};
use super::header;
use super::word::{Ballot, SLOTS, Slot};
use super::{Candidates, Index, IndexError, MappingTag, RegisterId};
use crate::layout::BUCKET_BYTES;

/// The settled slots of every bucket of `eng`: reads, waits out open changes, and
/// settles the ones that stay open.
pub async fn settled<F: Fabric>(
    eng: &mut Engine<'_, F>,
) -> Result<heapless::Vec<[Slot; SLOTS], MAX_BUCKETS>, IndexError> {
    let config = eng.index().config;
    let mut views = eng.read().await?;
    for round in 1..=config.max_attempts {
        let states: heapless::Vec<_, MAX_BUCKETS> =
            views.iter().filter_map(|v| v.readable()).collect();
        if states.len() == views.len() {
            return Ok(states);
        }
        if round <= config.read_retries {
            eng.pause(config.retry_delay_ns.saturating_mul(u64::from(round)))
                .await;
        } else {
            for i in 0..views.len() {
                if !matches!(views[i].status(), Status::Open { .. }) {
                    continue;
                }
                let mut ballots = [None; MAX_BUCKETS];
                ballots[i] = Some(eng.next_ballot(i));
                let promised = eng.promise(ballots, None).await?;
                let settled = match &promised.views[i] {
                    Some(view) if promised.ok[i] => eng.settle(i, view, ballots[i]).await?,
                    _ => Settled::Lost,
                };
                if settled == Settled::Lost {
                    eng.backoff(round - config.read_retries).await;
                }
            }
        }
        views = eng.read().await?;
    }
    Err(IndexError::Contention {
        attempts: config.max_attempts,
        bucket: eng.bucket(0),
    })
}

/// The registers of `slots` (one array per bucket) whose fingerprint may be `hash`'s,
/// with the position of their bucket in `slots` and their slot's tag, newest tag first.
pub fn candidates(slots: &[[Slot; SLOTS]], hash: &KeyHash) -> Vec<(usize, Ballot, RegisterId)> {
    let mut out: Vec<(usize, Ballot, RegisterId)> = Vec::new();
    for (i, bucket) in slots.iter().enumerate() {
        for slot in bucket {
            if let super::word::SlotState::Used { fp, register } = slot.state
                && hash.matches(fp)
                && !out.iter().any(|(_, _, r)| *r == register)
            {
                out.push((i, slot.tag, register));
            }
        }
    }
    out.sort_by(|a, b| {
        if a.1.is_newer_than(b.1) {
            core::cmp::Ordering::Less
        } else if b.1.is_newer_than(a.1) {
            core::cmp::Ordering::Greater
        } else {
            core::cmp::Ordering::Equal
        }
    });
    out
}

/// `Index::lookup`.
pub async fn lookup<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: &HashedKey<'_>,
) -> Result<Candidates, IndexError> {
    let hash = key.hash();
    let mut eng = Engine::new(ix, fabric, stats, &hash.buckets(), u64::from(hash.fp));
    let states = settled(&mut eng).await?;
    let (tags, registers) = candidates(&states, &hash)
        .into_iter()
        .map(|(i, ballot, register)| {
            let tag = MappingTag {
                bucket: eng.bucket(i),
                ballot,
            };
            (tag, register)
        })
        .unzip();
    Ok(Candidates { registers, tags })
}

/// `Index::resolve`.
pub async fn resolve<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: &HashedKey<'_>,
) -> Result<Option<RegisterId>, IndexError> {
    let found = lookup(ix, fabric, stats, key).await?;
    if found.registers.is_empty() {
        return Ok(None);
    }
    let same = header::verify(ix, fabric, stats, &found.registers, key.bytes()).await?;
    Ok(found
        .registers
        .iter()
        .zip(same)
        .find(|(_, same)| *same)
        .map(|(r, _)| *r))
}

/// `Index::count`: reads the index area of every node that answers (a quorum at
/// least), 256 KiB of each per roundtrip, and counts the used slots of each bucket as
/// a lookup reads them: the copies merged, newest tag first, with a decided change
/// that is not applied yet laid over them (`View::readable`). One node's copy alone
/// miscounts: a node that was out or rebuilt lags, and a remove decided on a quorum
/// of meta words whose apply never landed (its client stopped after the accept) still
/// shows its key in every slot copy, though every lookup finds it absent. A bucket
/// with an open change counts its merged slots; one whose copies contradict each
/// other (corrupted memory) counts the first copy's.
pub async fn count<F: Fabric>(ix: &Index, fabric: &F, stats: &OpStats) -> Result<u64, IndexError> {
    const CHUNK: u64 = 64 * 1024;
    let total = ix.layout.params.index_buckets * BUCKET_BYTES;
    let start = ix.layout.index_at;
    let registers = ix.layout.register_ids();
    let nodes = ix.nodes;
    let mut offset = 0;
    let mut used = 0;
    while offset < total {
        let mut reads = Vec::new();
        while reads.len() < swarm_core::fabric::INLINE_BATCH_OPS && offset < total {
            let len = CHUNK.min(total - offset);
            reads.push((start + offset, len as u32));
            offset += len;
        }
        let rt = broadcast_until_among(
            fabric,
            stats,
            swarm_core::quorum::nodes(ix.nodes),
            ix.quorum(),
            ix.config.slow_after_ns,
            |_| {
                let mut batch = Batch::new();
                for &(addr, len) in &reads {
                    batch.push(Op::Read { addr, len })?;
                }
                Ok(Some(batch))
            },
            |replies| replies.len() == nodes,
        )
        .await?;
        for (k, &(_, len)) in reads.iter().enumerate() {
            for b in 0..(u64::from(len) / BUCKET_BYTES) as usize {
                let range = b * BUCKET_BYTES as usize..(b + 1) * BUCKET_BYTES as usize;
                let raw: Vec<&[u8]> = rt
                    .replies()
                    .iter()
                    .filter_map(|(_, c)| c.read(k)?.get(range.clone()))
                    .collect();
                let copies: Vec<NodeBucket> = raw
                    .iter()
                    .filter_map(|bytes| NodeBucket::parse(bytes, registers).ok())
                    .collect();
                let slots = match View::merge(&copies, ix.quorum()) {
                    Ok(view) if !copies.is_empty() => view.readable().unwrap_or(view.slots),
                    _ => match raw.first() {
                        Some(bytes) => first_copy_slots(bytes),
                        None => continue,
                    },
                };
                used += slots.iter().filter(|s| s.register().is_some()).count() as u64;
            }
        }
    }
    Ok(used)
}

/// The slots of one bucket copy as they decode (undecodable ones count as empty).
fn first_copy_slots(bytes: &[u8]) -> [Slot; SLOTS] {
    let mut slots = [Slot::EMPTY; SLOTS];
    for (slot, word) in slots.iter_mut().zip(bytes.chunks_exact(8).skip(1)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        *slot = Slot::decode(u64::from_le_bytes(w)).unwrap_or(Slot::EMPTY);
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::word::SlotState;

    #[test]
    fn candidates_match_fingerprints_newest_first() {
        let hash = KeyHash {
            first: 0,
            second: 1,
            fp: 42,
        };
        let used = |tag: u16, fp: u32, register: u64| Slot {
            tag: Ballot(tag),
            state: SlotState::Used { fp, register },
        };
        let mut a = [Slot::EMPTY; SLOTS];
        a[0] = used(5, 42, 10);
        a[1] = used(9, 7, 11); // another key
        let mut b = [Slot::EMPTY; SLOTS];
        b[3] = used(8, 0, 12); // unknown fingerprint: a candidate
        b[4] = used(2, 42, 10); // same register again: listed once
        let found = candidates(&[a, b], &hash);
        assert_eq!(found, vec![(1, Ballot(8), 12), (0, Ballot(5), 10)]);
    }
}
