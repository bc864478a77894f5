//! The batches of a register reset: a reset is a write, never an erasure.
//!
//! A reset prepares a retired register for its next life ([`crate::registers::recycle`]).
//! It used to store zeros, which brought every word back to a value it held before:
//! a CAS of an earlier life posted before the reset and landing after it (a client
//! paused between its checks and its stores, for any time) found the value it
//! expected and changed the next life. rTX's "fly WRITE" (seed `rtx.txt`) is the same
//! hazard; rTX's cure is ours: every word a CAS may target only ever takes values it
//! never held before.
//!
//! So a reset CASes each word from the value it read to a value above every value
//! that word held: the *life marker* `M` ([`Tsp::reset_marker`]), whose ticks are one
//! above the largest metadata word of every replica, written by the writer id no
//! client has. On every replica:
//!
//! * every metadata word and the delete word get `M`. Metadata words are max
//!   registers that now never go down, and `M` is above every word of the earlier
//!   lives, so no CAS built from an earlier life's knowledge ever finds its expected
//!   value again. Readers take `M` as "no value" ([`Tsp::is_void`]) and writes of the
//!   next life go above it. The delete word holds `M` until the next life's first
//!   tombstone: a tombstone CAS expects its life's marker, and a client that finds
//!   another marker knows the register was recycled (`swarm_core::SwarmError::Recycled`);
//! * key-header word 0 gets `(0, tag)`: blank, held by the resetter (or donated),
//!   by a CAS too, so a reset posted by a client that lost the register to a
//!   reclaimer meanwhile changes nothing there either;
//! * the in-place record header gets zeros, a plain write: an in-place record is
//!   used only when its tsp is the maximum's, which no record of an earlier life
//!   is, so this write (early or late) never changes what a read returns.
//!
//! **Delete words first.** Before the marker goes in, every replica's delete word must
//! hold a tombstone (a retired register's delete word may not: an insert that became
//! an update, a delete that reached a majority only). Then a read torn across one
//! replica's words (SWARM §2.1: a read is not atomic) that sees a word of the next
//! life together with a delete word from before the reset sees a tombstone, never a
//! word it could take for its own life's. The reset tombstones such delete words with
//! [`swarm_core::UNOWNED_TOMBSTONE`] (no delete counts it as its own) and reads again.
//!
//! A CAS that finds another value than the read showed (a late store of an earlier
//! life landed in between) makes the reset read again and take a higher marker.

use swarm_core::Fabric;
use swarm_core::UNOWNED_TOMBSTONE;
use swarm_core::encoding::Tsp;
use swarm_core::fabric::{Batch, Completion, MAX_BATCH_OPS, Op};
use swarm_core::layout::RECORD_HEADER;

use crate::layout::NodeLayout;
use crate::registers::limbo::header_word;

/// What one replica's read of a register showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Key-header word 0: key length and holder tag.
    pub header: u64,
    /// The metadata words, then the delete word.
    pub words: Vec<u64>,
}

impl Seen {
    /// The delete word.
    pub fn delete_word(&self) -> Tsp {
        Tsp::from_word(self.words.last().copied().unwrap_or(0))
    }

    /// The holder tag of key-header word 0.
    pub fn tag(&self) -> u32 {
        (self.header >> 32) as u32
    }

    /// The key length of key-header word 0 (0: blank).
    pub fn key_len(&self) -> u32 {
        self.header as u32
    }
}

/// The batch reading a register's key-header word 0, metadata words and delete word
/// on one replica, where the register starts at `register_at` (its offset there,
/// `swarm_core::RegisterLoc::offset_on`).
pub fn read_batch(layout: &NodeLayout, register_at: u64) -> Option<Batch> {
    let header_at = register_at.checked_sub(layout.params.key_header_bytes())?;
    let swarm = &layout.swarm;
    let meta_at = register_at + swarm.meta_offset();
    let mut batch = Batch::read(header_at, 8);
    batch
        .push(Op::Read {
            addr: meta_at,
            len: u32::try_from(swarm.meta_bytes()).ok()?,
        })
        .ok()?;
    Some(batch)
}

/// Parses the answer to [`read_batch`]; `None` if it is short.
pub fn parse_read(layout: &NodeLayout, completion: &Completion) -> Option<Seen> {
    let header = u64::from_le_bytes(completion.read(0)?.get(..8)?.try_into().ok()?);
    let meta = completion.read(1)?;
    let count = (layout.swarm.meta_bytes() / 8) as usize;
    if meta.len() < count * 8 {
        return None;
    }
    let words = meta
        .chunks_exact(8)
        .take(count)
        .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .collect();
    Some(Seen { header, words })
}

/// What every replica of the register `loc` locates that answers within the straggler window
/// shows: a read-only look for diagnostics (an insert that finds a register of its
/// own pool in another life logs it, `KvClient::insert`). Needs a majority; the
/// replicas that did not answer are left out.
pub async fn inspect<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    loc: &swarm_core::RegisterLoc,
) -> Option<Vec<(swarm_core::NodeId, Seen)>> {
    let replicas = loc.replicas.nodes();
    let stats = swarm_core::OpStats::new();
    let rt = swarm_core::quorum::broadcast_until_among(
        fabric,
        &stats,
        replicas.iter().copied(),
        loc.replicas.quorum(),
        crate::membership::writer_takeover::STRAGGLER_NS,
        |node| Ok(loc.offset_on(node).and_then(|at| read_batch(layout, at))),
        |replies| replies.len() == replicas.len(),
    )
    .await
    .ok()?;
    Some(
        rt.replies()
            .iter()
            .filter_map(|(node, completion)| Some((*node, parse_read(layout, completion)?)))
            .collect(),
    )
}

/// The batch tombstoning the delete word of the register at `register_at` on a
/// replica whose read showed `seen`, if it holds no tombstone (module docs, "delete
/// words first").
pub fn tombstone_batch(layout: &NodeLayout, register_at: u64, seen: &Seen) -> Option<Batch> {
    let found = seen.delete_word();
    if found.is_tombstone() {
        return None;
    }
    let at = layout.swarm.delete_word_addr(register_at);
    Some(Batch::cas(at, found.word(), UNOWNED_TOMBSTONE.word()))
}

/// The marker of the next life: above every word every replica showed. `None` past
/// the timestamp horizon (the register is then never reused).
pub fn marker_above<'a>(seen: impl IntoIterator<Item = &'a Seen>) -> Option<Tsp> {
    let top = seen
        .into_iter()
        .flat_map(|s| s.words.iter().copied().map(Tsp::from_word))
        .filter(|w| !w.is_tombstone())
        .max()
        .unwrap_or(Tsp::EMPTY);
    Tsp::reset_marker(top.ts().ticks().saturating_add(1))
}

/// One batch of an install and the values its CASes expect, in order.
#[derive(Debug)]
pub struct InstallBatch {
    /// The batch.
    pub batch: Batch,
    /// What each of its operations expects: `Some(word)` for a CAS, `None` for a
    /// write.
    pub expected: Vec<Option<u64>>,
}

impl InstallBatch {
    /// Whether every CAS of the batch found what it expected (the reset took there).
    pub fn took(&self, completion: &Completion) -> bool {
        self.expected
            .iter()
            .enumerate()
            .all(|(i, want)| want.is_none_or(|want| completion.cas(i) == Some(want)))
    }
}

/// The batches installing `marker` and holder tag `tag` into the register at
/// `register_at` on a replica whose read showed `seen` (module docs): CASes of the
/// delete word, the metadata words and key-header word 0, and the in-place record
/// header's zeros.
pub fn install_batches(
    layout: &NodeLayout,
    register_at: u64,
    seen: &Seen,
    marker: Tsp,
    tag: u32,
) -> Option<Vec<InstallBatch>> {
    let swarm = &layout.swarm;
    let meta_at = register_at + swarm.meta_offset();
    let mut ops: Vec<(Op, Option<u64>)> = Vec::with_capacity(seen.words.len() + 2);
    // The delete word first, then the metadata words (their order does not matter:
    // the delete word already holds a tombstone).
    let delete_at = swarm.delete_word_addr(register_at);
    let last = seen.words.len().checked_sub(1)?;
    ops.push((
        Op::Cas {
            addr: delete_at,
            expected: seen.words[last],
            new: marker.word(),
        },
        Some(seen.words[last]),
    ));
    for (i, &word) in seen.words[..last].iter().enumerate() {
        ops.push((
            Op::Cas {
                addr: meta_at + 8 * i as u64,
                expected: word,
                new: marker.word(),
            },
            Some(word),
        ));
    }
    ops.push((
        Op::Cas {
            addr: register_at.checked_sub(layout.params.key_header_bytes())?,
            expected: seen.header,
            new: header_word(0, tag),
        },
        Some(seen.header),
    ));
    let record_bytes = (RECORD_HEADER as u64).min(swarm.record_bytes()) as usize;
    ops.push((
        Op::Write {
            addr: register_at,
            data: vec![0; record_bytes].into(),
        },
        None,
    ));
    let mut batches = Vec::new();
    for chunk in ops.chunks(MAX_BATCH_OPS) {
        let mut batch = Batch::new();
        let mut expected = Vec::with_capacity(chunk.len());
        for (op, want) in chunk {
            batch.push(op.clone()).ok()?;
            expected.push(*want);
        }
        batches.push(InstallBatch { batch, expected });
    }
    Some(batches)
}

#[cfg(test)]
mod tests {
    use swarm_core::encoding::{Flag, Timestamp, WriterId};
    use swarm_core::{Fabric, MemFabric};

    use super::*;
    use crate::test_support::small_cluster;

    fn tsp(ticks: u64, writer: u32) -> u64 {
        Tsp::new(
            Timestamp::new(ticks, WriterId::new(writer).unwrap()).unwrap(),
            Flag::Verified,
        )
        .word()
    }

    #[test]
    fn the_marker_is_above_every_word_and_ignores_tombstones() {
        let tomb = Tsp::new(Timestamp::tombstone(WriterId::FIRST), Flag::Verified).word();
        let a = Seen {
            header: 0,
            words: vec![tsp(5, 1), tsp(9, 3), tomb],
        };
        let b = Seen {
            header: 0,
            words: vec![tsp(9, 7), 0, tomb],
        };
        let m = marker_above([&a, &b]).unwrap();
        assert!(m.is_reset() && m.is_void() && !m.is_tombstone());
        assert_eq!(m.ts().ticks(), 10);
        assert!(m > Tsp::from_word(tsp(9, 7)));
        // Never-written memory gets a marker above ⊥ (never ⊥ itself).
        let blank = Seen {
            header: 0,
            words: vec![0, 0, 0],
        };
        assert!(marker_above([&blank]).unwrap() > Tsp::EMPTY);
        // A second reset goes above the first one's marker.
        let again = Seen {
            header: 0,
            words: vec![m.word(), m.word(), m.word()],
        };
        assert!(marker_above([&again]).unwrap() > m);
    }

    #[test]
    fn an_install_lands_only_on_the_words_it_read() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let fabric: MemFabric = cluster.client();
        let node = swarm_core::NodeId(0);
        let register = layout.register(5).unwrap();
        let run = |batch: &mut Batch| {
            let mut reply = Completion::new();
            match fabric.submit(node, batch, &mut reply) {
                swarm_core::fabric::Submitted::Done => reply,
                other => panic!("not executed at once: {other:?}"),
            }
        };
        let seen = parse_read(&layout, &run(&mut read_batch(&layout, register).unwrap())).unwrap();
        assert!(seen.words.iter().all(|&w| w == 0));
        // Delete words first: a never-deleted register is tombstoned, then read again.
        run(&mut tombstone_batch(&layout, register, &seen).unwrap());
        let seen = parse_read(&layout, &run(&mut read_batch(&layout, register).unwrap())).unwrap();
        assert!(seen.delete_word().is_tombstone());
        assert!(tombstone_batch(&layout, register, &seen).is_none());
        let marker = marker_above([&seen]).unwrap();
        let batches = install_batches(&layout, register, &seen, marker, 0x8000_0007).unwrap();
        for b in &batches {
            let mut batch = b.batch.clone();
            assert!(b.took(&run(&mut batch)));
        }
        let after = parse_read(&layout, &run(&mut read_batch(&layout, register).unwrap())).unwrap();
        assert!(after.words.iter().all(|&w| w == marker.word()));
        assert_eq!(after.header, header_word(0, 0x8000_0007));
        // The same install again (a late copy of it) changes nothing and says so.
        for b in &batches {
            let mut batch = b.batch.clone();
            let reply = run(&mut batch);
            assert!(!b.took(&reply) || b.expected.iter().all(Option::is_none));
        }
        let again = parse_read(&layout, &run(&mut read_batch(&layout, register).unwrap())).unwrap();
        assert_eq!(again, after);
    }
}
