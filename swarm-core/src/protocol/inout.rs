//! In-n-Out: one fallible max register on one memory node (SWARM §4).
//!
//! This module only builds batches and interprets their results; waiting for them is
//! the reliable max register's job ([`super::maxreg`]).
//!
//! * **Write** (§4.3, Algorithm "ino-write"): one ordered batch — write the record
//!   into the writer's out-of-place buffer, then MAX the metadata word. Batch order
//!   guarantees that whoever sees the word also sees the buffer (§2.1, third
//!   property), so the write takes one roundtrip.
//! * **MAX** (§4.4) is a CAS with the expected value the client last saw in its own
//!   metadata word. If the CAS finds another value that is still below ours, the
//!   client adopts it and retries; if it finds a value at least as large, the MAX is
//!   already done.
//! * **Read** (§4.3, Algorithm "ino-read"): one READ of the in-place block and the
//!   metadata words (the in-place block only on the primary). If the in-place record
//!   is valid and is the maximum's write, done; otherwise a second READ fetches the
//!   maximum's out-of-place buffer, whose record must carry the same write.

use alloc::vec::Vec;
use core::ops::Range;

use crate::encoding::Tsp;
use crate::fabric::{Batch, Completion, FabricError, Op, Payload};
use crate::layout::{Layout, RECORD_HEADER, SLOT_LOCK_BYTES, decode_record};

/// What one node's reply to a register read says.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// The maximum of the register's metadata words on that node (its delete word
    /// included).
    pub max: Tsp,
    /// The node's delete word: its first tombstone, or the life marker
    /// ([`crate::RegisterCache`]) before any.
    pub delete: Tsp,
    /// The in-place record, if read and valid: its write and payload.
    pub inplace: Option<(Tsp, Vec<u8>)>,
}

/// The operation reading a register on one node: metadata only, or in-place block
/// and metadata together.
pub fn read_op(layout: &Layout, addr: u64, with_inplace: bool) -> Op {
    if with_inplace {
        Op::Read {
            addr,
            len: layout.register_bytes() as u32,
        }
    } else {
        Op::Read {
            addr: addr + layout.meta_offset(),
            len: layout.meta_bytes() as u32,
        }
    }
}

/// The maximum of metadata words given as little-endian bytes ([`Tsp`] orders as its
/// word; a trailing partial word is ignored).
pub fn max_word(meta: &[u8]) -> Tsp {
    // One branch-free pass over whole words (`Tsp` orders as its word, and ⊥ is 0).
    let (words, _) = meta.as_chunks::<8>();
    Tsp::from_word(
        words
            .iter()
            .fold(0, |max, w| max.max(u64::from_le_bytes(*w))),
    )
}

/// The delete word of metadata given as little-endian bytes (the last whole word;
/// ⊥ if there is none).
pub fn delete_word(meta: &[u8]) -> Tsp {
    let (words, _) = meta.as_chunks::<8>();
    words
        .last()
        .map_or(Tsp::EMPTY, |w| Tsp::from_word(u64::from_le_bytes(*w)))
}

/// Interprets the bytes returned by a [`read_op`] without the in-place block: the
/// metadata words alone (borrowed, so that their buffer can go back to the fabric).
pub fn parse_meta(bytes: &[u8]) -> NodeView {
    NodeView {
        max: max_word(bytes),
        delete: delete_word(bytes),
        inplace: None,
    }
}

/// Interprets the bytes returned by [`read_op`].
pub fn parse_read(layout: &Layout, mut bytes: Vec<u8>, with_inplace: bool) -> NodeView {
    if !with_inplace {
        return parse_meta(&bytes);
    }
    let (mut view, record) = parse_block(layout, &mut bytes);
    view.inplace = record.map(|(tsp, payload)| {
        // The payload moves to the front of the buffer it was read into, which becomes
        // the value: no second allocation and copy on every in-place read.
        let len = payload.len();
        bytes.copy_within(payload, 0);
        bytes.truncate(len);
        (tsp, bytes)
    });
    view
}

/// Interprets the bytes of a [`read_op`] with the in-place block, where they lie:
/// the view of the metadata words (its `inplace` left `None`), and the in-place
/// record's write and the range of its payload in `bytes` if the record validates
/// ([`decode_record`]: its length and xxh3 hash; `bytes` is modified). For a reader
/// that consumes the payload in place ([`crate::Client::read_start_with`]).
pub fn parse_block(layout: &Layout, bytes: &mut [u8]) -> (NodeView, Option<(Tsp, Range<usize>)>) {
    let meta_at = (layout.meta_offset() as usize).min(bytes.len());
    let view = parse_meta(&bytes[meta_at..]);
    let (record, _) = bytes.split_at_mut(meta_at);
    let start = RECORD_HEADER as usize;
    let record = decode_record(record, layout.payload_max())
        .map(|r| (r.tsp, start..start + r.payload.len()));
    (view, record)
}

/// The expected value of a MAX's CAS, from the caller's `hint` of the word's content.
///
/// A MAX must never lower a word, so its CAS must expect a value *below* `new`: a
/// hint at or above `new` (learned from another writer sharing the word, §4.4) would
/// make the CAS replace a larger value with a smaller one. In that case the CAS
/// expects ⊥ instead, which either installs `new` in an empty word or reports the
/// word's value, from which [`max_outcome`] decides.
pub fn max_expected(hint: Tsp, new: Tsp) -> Tsp {
    if hint < new { hint } else { Tsp::EMPTY }
}

/// Appends a MAX of `new` into `writer`'s metadata word, CAS-expecting `expected`
/// (which must come from [`max_expected`]).
pub fn push_max(
    batch: &mut Batch,
    layout: &Layout,
    addr: u64,
    writer: crate::encoding::WriterId,
    expected: Tsp,
    new: Tsp,
) -> Result<(), FabricError> {
    debug_assert!(expected < new, "a MAX must not lower a word");
    batch.push(Op::Cas {
        addr: layout.meta_word_addr(addr, writer),
        expected: expected.word(),
        new: new.word(),
    })?;
    Ok(())
}

/// The operation that returns the delete word of the register at `addr` and changes
/// nothing: a CAS from `life` (the caller's life marker, [`crate::RegisterCache`]) to
/// itself. Cheaper than a read (its answer is one word, no buffer) wherever a CAS
/// answer is parsed anyway.
pub fn delete_word_probe_op(layout: &Layout, addr: u64, life: Tsp) -> Op {
    Op::Cas {
        addr: layout.delete_word_addr(addr),
        expected: life.word(),
        new: life.word(),
    }
}

/// The operation writing `record` (from [`crate::layout::encode_record`]) into the
/// out-of-place buffer at `buffer_addr`, leaving its lock word alone.
pub fn buffer_write_op(buffer_addr: u64, record: Payload) -> Op {
    Op::Write {
        addr: buffer_addr + u64::from(SLOT_LOCK_BYTES),
        data: record,
    }
}

/// The operation reading the record of the out-of-place buffer at `buffer_addr`.
pub fn buffer_read_op(layout: &Layout, buffer_addr: u64) -> Op {
    Op::Read {
        addr: buffer_addr + u64::from(SLOT_LOCK_BYTES),
        len: layout.record_bytes() as u32,
    }
}

/// Outcome of one MAX attempt, from the CAS's previous value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxOutcome {
    /// The word now holds a value `>= new`: the MAX is complete. Carries the word's
    /// value (ours if the CAS swapped).
    Done(Tsp),
    /// The word held a smaller value than expected: retry expecting it.
    Retry(Tsp),
}

/// Interprets the CAS of a MAX of `new` that expected `expected`.
pub fn max_outcome(expected: Tsp, new: Tsp, previous: Tsp) -> MaxOutcome {
    if previous == expected {
        MaxOutcome::Done(new)
    } else if previous >= new {
        MaxOutcome::Done(previous)
    } else {
        MaxOutcome::Retry(previous)
    }
}

/// MAX `new` into the word at `addr` of `node` (§4.4, Algorithm "max"): CAS expecting
/// `expected` (the caller's cached value), adopt what the CAS found and retry while it
/// is still below `new`. Each attempt is one roundtrip. Returns the word's value once
/// it is at least `new`. The reliable register pipelines the first attempt with the
/// buffer write (see [`super::maxreg`]) and applies the same rule per replica.
#[cfg_attr(not(loom), allow(dead_code))] // The unit MAX step that tests/loom.rs model-checks.
pub async fn max_on_node<F: crate::fabric::Fabric + ?Sized>(
    fabric: &F,
    stats: &crate::roundtrip::OpStats,
    node: crate::fabric::NodeId,
    addr: u64,
    hint: Tsp,
    new: Tsp,
) -> Result<Tsp, FabricError> {
    let mut expected = max_expected(hint, new);
    loop {
        let mut rt = crate::roundtrip::Roundtrip::start(fabric, stats);
        rt.post(node, Batch::cas(addr, expected.word(), new.word()))?;
        rt.wait(1).await?;
        let previous = cas_result(&rt.replies()[0].1, 0).unwrap_or(expected);
        match max_outcome(expected, new, previous) {
            MaxOutcome::Done(now) => return Ok(now),
            MaxOutcome::Retry(found) => expected = found,
        }
    }
}

/// The CAS result at `index` of a completion, as a [`Tsp`].
pub fn cas_result(completion: &Completion, index: usize) -> Option<Tsp> {
    completion.cas(index).map(Tsp::from_word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::{Flag, Timestamp, WriterId};
    use crate::layout::encode_record;

    fn tsp(t: u64, w: u32) -> Tsp {
        Tsp::new(
            Timestamp::new(t, WriterId::new(w).unwrap()).unwrap(),
            Flag::Guessed,
        )
    }

    #[test]
    fn max_outcomes() {
        assert_eq!(
            max_outcome(tsp(1, 0), tsp(5, 0), tsp(1, 0)),
            MaxOutcome::Done(tsp(5, 0))
        );
        assert_eq!(
            max_outcome(tsp(1, 0), tsp(5, 0), tsp(7, 1)),
            MaxOutcome::Done(tsp(7, 1))
        );
        assert_eq!(
            max_outcome(tsp(1, 0), tsp(5, 0), tsp(3, 1)),
            MaxOutcome::Retry(tsp(3, 1))
        );
    }

    #[test]
    fn parse_register_read() {
        let layout = Layout::builder()
            .payload_max(16)
            .meta_words(3)
            .log_base(4096)
            .writers(2)
            .slots_per_writer(4)
            .build()
            .unwrap();
        let mut bytes = alloc::vec![0u8; layout.register_bytes() as usize];
        let record = encode_record(tsp(9, 1), b"hello");
        bytes[..record.len()].copy_from_slice(&record);
        let meta = layout.meta_offset() as usize;
        bytes[meta + 8..meta + 16].copy_from_slice(&tsp(9, 1).word().to_le_bytes());
        bytes[meta..meta + 8].copy_from_slice(&tsp(4, 0).word().to_le_bytes());
        let view = parse_read(&layout, bytes.clone(), true);
        assert_eq!(view.max, tsp(9, 1));
        assert_eq!(view.inplace, Some((tsp(9, 1), b"hello".to_vec())));
        // The same, where the bytes lie.
        let mut block = bytes.clone();
        let (view, record) = parse_block(&layout, &mut block);
        assert_eq!(
            (view.max, view.delete, view.inplace),
            (tsp(9, 1), Tsp::EMPTY, None)
        );
        let (write, payload) = record.unwrap();
        assert_eq!((write, &block[payload]), (tsp(9, 1), &b"hello"[..]));
        bytes[33] ^= 0xff; // tear the payload
        assert_eq!(parse_block(&layout, &mut bytes.clone()).1, None);
        assert_eq!(parse_read(&layout, bytes, true).inplace, None);
        assert_eq!(parse_read(&layout, alloc::vec![0; 3], true).max, Tsp::EMPTY);
    }

    proptest::proptest! {
        /// The plain maximum of the whole little-endian words, whatever the bytes
        /// (memory read from a node is untrusted); a partial last word is ignored.
        #[test]
        fn max_word_is_the_largest_whole_word(
            words in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..12),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
        ) {
            let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            bytes.extend_from_slice(&tail);
            let expected = words.iter().copied().max().map_or(Tsp::EMPTY, Tsp::from_word);
            proptest::prop_assert_eq!(max_word(&bytes), expected);
            let last = words.last().map_or(Tsp::EMPTY, |&w| Tsp::from_word(w));
            proptest::prop_assert_eq!(delete_word(&bytes), last);
        }
    }
}
