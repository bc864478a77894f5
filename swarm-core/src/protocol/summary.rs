//! A writer's log summary: what a clean stop hands to the next incarnation of its
//! writer id, so that resuming the log reads a bitmap instead of the whole log.
//!
//! [`super::resume`] explains why a new incarnation of a writer id must know which
//! slots of the log may still hold a buffer a register points to, and a tick count
//! above every timestamp the earlier incarnations used. Without help it learns both by
//! reading the whole log on every node ([`super::resume::scan_log`]): about 90 MB per
//! node for a one-shot `swarm put` on a 1 GiB cluster with 8 writers.
//!
//! A writer that stops cleanly knows both already: its allocator's bitmap of used
//! slots (every slot it or an earlier incarnation wrote or locked in and that was not
//! recycled after its grace) and its guesser's last tick count (above every timestamp
//! it allocated, hence above every lock word naming one of its timestamps, since a
//! reader locks only timestamps it read). [`LogSummary`] is that pair, encoded with a
//! *stamp* (the store's name for the incarnation that wrote it) and a checksum, so
//! that a reader can tell it from an earlier incarnation's summary, a torn copy or
//! garbage:
//!
//! ```text
//! 0   magic "SWLOGSUM"
//! 8   stamp        u64   chosen by the store (unique per incarnation)
//! 16  last ticks   u64
//! 24  slots        u32   slots per writer (the bitmap's length in bits)
//! 28  in use       u32   bits set in the bitmap
//! 32  checksum     u64   xxh3-64 of bytes 0..32 followed by the bitmap
//! 40  bitmap       ceil(slots / 64) little-endian u64 words, bit s = slot s used
//! ```
//!
//! Where the summary lives, when it may be trusted and how the next incarnation finds
//! out which stamp to expect are the store's business (swarm-kv's `writer_ids`): the
//! summary only ever *adds* knowledge that the whole-log scan would give, and the
//! next incarnation reads the slots it marks lazily ([`super::Client::resume_summary`]).

use alloc::vec::Vec;

/// Magic bytes of an encoded summary.
pub const SUMMARY_MAGIC: [u8; 8] = *b"SWLOGSUM";
/// Bytes before the bitmap.
pub const SUMMARY_HEADER_BYTES: usize = 40;

/// Why a summary read from memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SummaryError {
    /// Fewer bytes than a summary of this log needs.
    #[error("log summary truncated: {got} bytes, {needed} needed")]
    Truncated {
        /// Bytes given.
        got: usize,
        /// Bytes a summary of this log takes.
        needed: usize,
    },
    /// No summary was ever written here (or something else was).
    #[error("no log summary here (bad magic)")]
    Magic,
    /// A summary of another incarnation (an earlier one, usually).
    #[error("log summary of another incarnation (stamp {found:#x}, expected {expected:#x})")]
    Stamp {
        /// The stamp found.
        found: u64,
        /// The stamp expected.
        expected: u64,
    },
    /// A summary of a log of another size.
    #[error("log summary for {found} slots, the log has {expected}")]
    Slots {
        /// Slots the summary describes.
        found: u32,
        /// Slots the log has.
        expected: u32,
    },
    /// The checksum does not match: a torn or corrupted copy.
    #[error("log summary checksum mismatch (torn or corrupted copy)")]
    Checksum,
    /// The header's count or the bits beyond the log disagree with the bitmap.
    #[error("log summary bitmap is inconsistent with its header")]
    Bitmap,
}

/// The used slots and last tick count of a writer's log (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSummary {
    /// A tick count at or above every timestamp the writer ever used.
    pub last_ticks: u64,
    slots: u32,
    used: Vec<u64>,
}

impl LogSummary {
    /// A summary of a log of `slots` slots from its allocator bitmap (`used`, bit `s`
    /// set for slot `s`; words beyond `slots` bits are dropped, bits beyond cleared).
    pub fn new(slots: u32, mut used: Vec<u64>, last_ticks: u64) -> Self {
        let words = slots.div_ceil(64) as usize;
        used.resize(words, 0);
        if let Some(last) = used.last_mut()
            && !slots.is_multiple_of(64)
        {
            *last &= (1u64 << (slots % 64)) - 1;
        }
        Self {
            last_ticks,
            slots,
            used,
        }
    }

    /// Slots of the log.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Whether slot `slot` is marked used.
    pub fn is_used(&self, slot: u32) -> bool {
        slot < self.slots && self.used[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    /// Slots marked used.
    pub fn in_use(&self) -> u32 {
        self.used.iter().map(|w| w.count_ones()).sum()
    }

    /// The used slots, in increasing order.
    pub fn used_slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0u32..)
            .zip(&self.used)
            .flat_map(|(word, &bits)| {
                (0..64u32)
                    .filter(move |bit| bits & (1 << bit) != 0)
                    .map(move |bit| word * 64 + bit)
            })
            .filter(|&slot| slot < self.slots)
    }

    /// Bytes of an encoded summary of a log of `slots` slots.
    pub fn encoded_len(slots: u32) -> usize {
        SUMMARY_HEADER_BYTES + slots.div_ceil(64) as usize * 8
    }

    /// Encodes the summary with `stamp` (see the module docs for the format).
    pub fn encode(&self, stamp: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.slots));
        out.extend_from_slice(&SUMMARY_MAGIC);
        out.extend_from_slice(&stamp.to_le_bytes());
        out.extend_from_slice(&self.last_ticks.to_le_bytes());
        out.extend_from_slice(&self.slots.to_le_bytes());
        out.extend_from_slice(&self.in_use().to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        for word in &self.used {
            out.extend_from_slice(&word.to_le_bytes());
        }
        let sum = checksum(&out);
        out[32..40].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes a summary read from untrusted memory, refusing anything but a whole,
    /// intact summary of a `slots`-slot log stamped `stamp`.
    pub fn decode(bytes: &[u8], stamp: u64, slots: u32) -> Result<Self, SummaryError> {
        let needed = Self::encoded_len(slots);
        let bytes = bytes.get(..needed).ok_or(SummaryError::Truncated {
            got: bytes.len(),
            needed,
        })?;
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let u32_at = |at: usize| {
            let mut word = [0u8; 4];
            word.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(word)
        };
        if bytes[..8] != SUMMARY_MAGIC {
            return Err(SummaryError::Magic);
        }
        let found = u64_at(8);
        if found != stamp {
            return Err(SummaryError::Stamp {
                found,
                expected: stamp,
            });
        }
        if u32_at(24) != slots {
            return Err(SummaryError::Slots {
                found: u32_at(24),
                expected: slots,
            });
        }
        if u64_at(32) != checksum(bytes) {
            return Err(SummaryError::Checksum);
        }
        let used: Vec<u64> = (SUMMARY_HEADER_BYTES..needed)
            .step_by(8)
            .map(u64_at)
            .collect();
        let summary = Self::new(slots, used.clone(), u64_at(16));
        if summary.used != used || summary.in_use() != u32_at(28) {
            return Err(SummaryError::Bitmap);
        }
        Ok(summary)
    }
}

/// The checksum of an encoded summary: xxh3-64 of its bytes with the checksum field
/// read as zero.
fn checksum(encoded: &[u8]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&encoded[..32]);
    hasher.update(&[0; 8]);
    hasher.update(&encoded[SUMMARY_HEADER_BYTES..]);
    hasher.digest()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_summary_round_trips_and_lists_its_slots() {
        let summary = LogSummary::new(130, alloc::vec![0b101, 1 << 63, 0b11], 77);
        assert_eq!(
            summary.used_slots().collect::<Vec<_>>(),
            [0, 2, 127, 128, 129]
        );
        assert_eq!(summary.in_use(), 5);
        let bytes = summary.encode(9);
        assert_eq!(bytes.len(), LogSummary::encoded_len(130));
        assert_eq!(LogSummary::decode(&bytes, 9, 130), Ok(summary));
    }

    #[test]
    fn bits_beyond_the_log_are_dropped() {
        let summary = LogSummary::new(3, alloc::vec![u64::MAX, u64::MAX], 0);
        assert_eq!(summary.used_slots().collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn another_stamp_size_or_a_torn_copy_is_refused() {
        let bytes = LogSummary::new(64, alloc::vec![1], 5).encode(3);
        assert!(matches!(
            LogSummary::decode(&bytes, 4, 64),
            Err(SummaryError::Stamp { found: 3, .. })
        ));
        assert!(matches!(
            LogSummary::decode(&bytes, 3, 128),
            Err(SummaryError::Truncated { .. })
        ));
        assert_eq!(
            LogSummary::decode(&[0; 48], 3, 64),
            Err(SummaryError::Magic)
        );
        let mut torn = bytes.clone();
        torn[45] ^= 1;
        assert_eq!(
            LogSummary::decode(&torn, 3, 64),
            Err(SummaryError::Checksum)
        );
    }

    proptest! {
        /// Whatever the bitmap, encoding then decoding gives the summary back, and
        /// flipping any one byte is refused.
        #[test]
        fn encode_decode_and_any_flipped_byte(
            slots in 1u32..300,
            words in proptest::collection::vec(any::<u64>(), 0..6),
            ticks in any::<u64>(),
            stamp in any::<u64>(),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let summary = LogSummary::new(slots, words, ticks);
            let bytes = summary.encode(stamp);
            prop_assert_eq!(LogSummary::decode(&bytes, stamp, slots), Ok(summary));
            let mut bad = bytes.clone();
            bad[flip.index(bytes.len())] ^= 1 << bit;
            prop_assert!(LogSummary::decode(&bad, stamp, slots).is_err());
        }
    }
}
