//! Reads: `lookup` (the candidates of a key), `resolve` (the register a key maps
//! to) and `count`.
//!
//! A lookup reads both candidate buckets of the key from a preferred majority in one
//! batch per node: one roundtrip. When a bucket's newest accepted change is *open*
//! (accepted somewhere, not provably decided: an update is in flight), the lookup
//! re-reads a few times, then settles the bucket itself with a Paxos round (module
//! docs of [`super`], "reads").

use swarm_core::fabric::{Batch, Op};
use swarm_core::quorum::preferred_step;
use swarm_core::{Fabric, OpStats};

use super::bucket::Status;
use super::engine::{Engine, MAX_BUCKETS, Settled};
use super::hash::{HashedKey, KeyHash};
use super::header;
use super::word::{Ballot, SLOTS, Slot};
use super::{Candidates, Index, IndexError, RegisterId};
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

/// The registers of `slots` whose fingerprint may be `hash`'s, newest tag first.
pub fn candidates(slots: &[[Slot; SLOTS]], hash: &KeyHash) -> Vec<(Ballot, RegisterId)> {
    let mut out: Vec<(Ballot, RegisterId)> = Vec::new();
    for slot in slots.iter().flatten() {
        if let super::word::SlotState::Used { fp, register } = slot.state
            && hash.matches(fp)
            && !out.iter().any(|(_, r)| *r == register)
        {
            out.push((slot.tag, register));
        }
    }
    out.sort_by(|a, b| {
        if a.0.is_newer_than(b.0) {
            core::cmp::Ordering::Less
        } else if b.0.is_newer_than(a.0) {
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
    let (tags, registers) = candidates(&states, &hash).into_iter().unzip();
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

/// `Index::count`: reads the index area of one node, 256 KiB per roundtrip.
pub async fn count<F: Fabric>(ix: &Index, fabric: &F, stats: &OpStats) -> Result<u64, IndexError> {
    const CHUNK: u64 = 64 * 1024;
    let total = ix.layout.params.index_buckets * BUCKET_BYTES;
    let start = ix.layout.index_at;
    let mut offset = 0;
    let mut used = 0;
    let mut preferred = 0u64;
    while offset < total {
        let mut reads = Vec::new();
        while reads.len() < swarm_core::fabric::INLINE_BATCH_OPS && offset < total {
            let len = CHUNK.min(total - offset);
            reads.push((start + offset, len as u32));
            offset += len;
        }
        let order = ix.order(fabric, preferred);
        let rt = preferred_step(
            fabric,
            stats,
            &order,
            1,
            ix.config.slow_after_ns,
            |_| {
                let mut batch = Batch::new();
                for &(addr, len) in &reads {
                    batch.push(Op::Read { addr, len })?;
                }
                Ok(batch)
            },
            |replies| !replies.is_empty(),
        )
        .await?;
        let Some((node, completion)) = rt.replies().first() else {
            continue;
        };
        preferred = u64::from(node.0);
        for k in 0..reads.len() {
            for bucket in completion
                .read(k)
                .unwrap_or_default()
                .chunks_exact(BUCKET_BYTES as usize)
            {
                for word in bucket.chunks_exact(8).skip(1) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(word);
                    if Slot::decode(u64::from_le_bytes(w)).is_ok_and(|s| s.register().is_some()) {
                        used += 1;
                    }
                }
            }
        }
    }
    Ok(used)
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
        assert_eq!(found, vec![(Ballot(8), 12), (Ballot(5), 10)]);
    }
}
