//! One chunk's placement record: its on-memory encoding and a decoder that never
//! panics and accepts only the one encoding of each record (ARCHITECTURE.md,
//! "Per-replica placement", step 1).
//!
//! ```text
//! word 0        63..32 epoch | 31..6 zero | 5..4 state (0 unset, 1 settled, 2 joint) | 3..0 r
//! words 1..=15  32-bit entries, two per word (even entry in the low half):
//!               31..24 node | 23..0 slot; the r replicas in group order (S), then,
//!               joint only, the r of the destination (S'); unused entries zero
//! words 16..=30 zero (reserved)
//! word 31       xxh3-64 of bytes 0..248
//! ```
//!
//! An unset record is all zeros (the table's memory as `swarm init` leaves it). The
//! checksum makes a copy read while its write lands (a record is written with a plain
//! write, bigger than a CAS) a copy that fails to decode, never another record.

use xxhash_rust::xxh3::xxh3_64;

/// Bytes of one record.
pub const RECORD_BYTES: usize = 256;
/// Entries a record holds: room for a joint record of 15 replicas.
pub const MAX_ENTRIES: usize = 30;
/// Largest slot an entry can name (24 bits).
pub const MAX_SLOT: u32 = (1 << 24) - 1;
/// Largest replica count a record holds (4 bits, odd: `2f + 1`).
pub const MAX_RECORD_REPLICAS: usize = 15;

// Words 1..=15 hold the entries: a joint record of the most replicas fits.
const _: () = assert!(2 * MAX_RECORD_REPLICAS <= MAX_ENTRIES && 8 + 4 * MAX_ENTRIES <= 128);

const STATE_SETTLED: u64 = 1;
const STATE_JOINT: u64 = 2;
const CHECKSUM_AT: usize = RECORD_BYTES - 8;

/// Where one replica of a chunk lives: a node and a slot of its register area
/// (`crate::layout::NodeLayout::slot_key_header`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spot {
    /// The node.
    pub node: u8,
    /// The slot, at most 2²⁴ − 1 (`MAX_SLOT`).
    pub slot: u32,
}

/// A chunk's recorded placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRecord {
    /// The configuration epoch that publishes it (at least 1): a client adopts it
    /// once it follows that epoch.
    pub epoch: u32,
    /// The chunk's replicas `S`, in group order (distinct nodes, odd count).
    pub replicas: Vec<Spot>,
    /// In the joint state of a move, the destination `S'` (as many, distinct
    /// nodes); `None` when settled.
    pub destination: Option<Vec<Spot>>,
}

/// Why a placement record copy was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Fewer than [`RECORD_BYTES`] bytes were read.
    #[error("a placement record is {0} bytes, not {RECORD_BYTES}: read the whole record")]
    Short(usize),
    /// The checksum does not match: read while its write landed, or corrupted.
    #[error(
        "a placement record's checksum does not match (read while it was written, or corrupted): read it again"
    )]
    Checksum,
    /// The record is not in its one encoding.
    #[error(
        "a placement record is not canonical ({0}): the placement table is corrupted or of a newer build"
    )]
    NotCanonical(&'static str),
}

impl PlacementRecord {
    /// Encodes the record, or `None` if it has no encoding (an epoch of 0, an even
    /// or too large replica count, a destination of another size, a slot beyond
    /// [`MAX_SLOT`], a node twice in one set).
    pub fn encode(&self) -> Option<[u8; RECORD_BYTES]> {
        let r = self.replicas.len();
        if self.epoch == 0 || r.is_multiple_of(2) || r > MAX_RECORD_REPLICAS {
            return None;
        }
        let destination = self.destination.as_deref().unwrap_or(&[]);
        if self.destination.is_some() && destination.len() != r {
            return None;
        }
        if !distinct(&self.replicas) || !distinct(destination) {
            return None;
        }
        let state = if self.destination.is_some() {
            STATE_JOINT
        } else {
            STATE_SETTLED
        };
        let mut out = [0u8; RECORD_BYTES];
        let head = u64::from(self.epoch) << 32 | state << 4 | r as u64;
        out[..8].copy_from_slice(&head.to_le_bytes());
        for (i, spot) in self.replicas.iter().chain(destination).enumerate() {
            if spot.slot > MAX_SLOT {
                return None;
            }
            let entry = u32::from(spot.node) << 24 | spot.slot;
            let at = 8 + 4 * i;
            out[at..at + 4].copy_from_slice(&entry.to_le_bytes());
        }
        let sum = xxh3_64(&out[..CHECKSUM_AT]);
        out[CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
        Some(out)
    }

    /// Decodes a record copy read from untrusted memory: `Ok(None)` for an unset
    /// record (all zeros). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RecordError> {
        let bytes = bytes
            .get(..RECORD_BYTES)
            .ok_or(RecordError::Short(bytes.len()))?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        if bytes.iter().all(|b| *b == 0) {
            return Ok(None);
        }
        if word(RECORD_BYTES / 8 - 1) != xxh3_64(&bytes[..CHECKSUM_AT]) {
            return Err(RecordError::Checksum);
        }
        let bad = |why| Err(RecordError::NotCanonical(why));
        let head = word(0);
        let (epoch, state, r) = ((head >> 32) as u32, (head >> 4) & 3, (head & 15) as usize);
        if head & 0xffff_ffc0 != 0 {
            return bad("reserved bits of word 0 set");
        }
        if epoch == 0 {
            return bad("a record of epoch 0");
        }
        if r.is_multiple_of(2) {
            return bad("an even replica count");
        }
        let used = match state {
            STATE_SETTLED => r,
            STATE_JOINT => 2 * r,
            _ => return bad("an unknown state"),
        };
        let entry = |i: usize| {
            let at = 8 + 4 * i;
            let e = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            Spot {
                node: (e >> 24) as u8,
                slot: e & MAX_SLOT,
            }
        };
        if bytes[8 + 4 * used..CHECKSUM_AT].iter().any(|b| *b != 0) {
            return bad("unused entries or reserved words set");
        }
        let replicas: Vec<Spot> = (0..r).map(entry).collect();
        let destination = (state == STATE_JOINT).then(|| (r..2 * r).map(entry).collect::<Vec<_>>());
        if !distinct(&replicas) || destination.as_deref().is_some_and(|d| !distinct(d)) {
            return bad("a node twice in one replica set");
        }
        Ok(Some(Self {
            epoch,
            replicas,
            destination,
        }))
    }
}

/// Whether no node appears twice among `spots`.
fn distinct(spots: &[Spot]) -> bool {
    spots
        .iter()
        .enumerate()
        .all(|(i, a)| spots[..i].iter().all(|b| b.node != a.node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spots() -> impl Strategy<Value = Vec<Spot>> {
        prop::sample::select(vec![1usize, 3, 5, 15]).prop_flat_map(|r| {
            prop::sample::subsequence((0u8..=255).collect::<Vec<_>>(), r).prop_flat_map(
                move |nodes| {
                    prop::collection::vec(0u32..=MAX_SLOT, r).prop_map(move |slots| {
                        nodes
                            .iter()
                            .zip(slots)
                            .map(|(&node, slot)| Spot { node, slot })
                            .collect()
                    })
                },
            )
        })
    }

    fn record() -> impl Strategy<Value = PlacementRecord> {
        (1u32.., spots(), any::<bool>()).prop_flat_map(|(epoch, replicas, joint)| {
            let r = replicas.len();
            let destination = if joint {
                prop::sample::subsequence((0u8..=255).collect::<Vec<_>>(), r)
                    .prop_map(move |nodes| {
                        Some(
                            nodes
                                .iter()
                                .enumerate()
                                .map(|(i, &node)| Spot {
                                    node,
                                    slot: i as u32,
                                })
                                .collect(),
                        )
                    })
                    .boxed()
            } else {
                Just(None).boxed()
            };
            destination.prop_map(move |destination| PlacementRecord {
                epoch,
                replicas: replicas.clone(),
                destination,
            })
        })
    }

    /// Re-seals `bytes` with a valid checksum, so that the canonical checks, not
    /// the checksum, judge them.
    fn sealed(mut bytes: [u8; RECORD_BYTES]) -> [u8; RECORD_BYTES] {
        let sum = xxh3_64(&bytes[..CHECKSUM_AT]);
        bytes[CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
        bytes
    }

    #[test]
    fn zeros_are_unset_and_short_copies_are_refused() {
        assert_eq!(PlacementRecord::decode(&[0; RECORD_BYTES]), Ok(None));
        assert_eq!(PlacementRecord::decode(&[0; 8]), Err(RecordError::Short(8)));
    }

    #[test]
    fn records_without_an_encoding_are_not_encoded() {
        let spot = |node| Spot { node, slot: 1 };
        let settled = |epoch, replicas: Vec<Spot>| PlacementRecord {
            epoch,
            replicas,
            destination: None,
        };
        assert!(settled(0, vec![spot(1)]).encode().is_none(), "epoch 0");
        assert!(
            settled(1, vec![spot(1), spot(2)]).encode().is_none(),
            "r even"
        );
        assert!(
            settled(1, vec![spot(1), spot(1), spot(2)])
                .encode()
                .is_none()
        );
        let far = Spot {
            node: 0,
            slot: MAX_SLOT + 1,
        };
        assert!(settled(1, vec![far]).encode().is_none());
        let joint = PlacementRecord {
            destination: Some(vec![spot(1), spot(2), spot(3)]),
            ..settled(1, vec![spot(1)])
        };
        assert!(joint.encode().is_none(), "a destination of another size");
    }

    /// A record whose every field is well formed but one: each is refused by the
    /// canonical checks, even with a valid checksum.
    #[test]
    fn non_canonical_words_are_refused() {
        let good = PlacementRecord {
            epoch: 7,
            replicas: vec![
                Spot { node: 1, slot: 2 },
                Spot { node: 4, slot: 9 },
                Spot { node: 5, slot: 0 },
            ],
            destination: None,
        }
        .encode()
        .unwrap();
        let refused = |edit: &dyn Fn(&mut [u8; RECORD_BYTES])| {
            let mut bytes = good;
            edit(&mut bytes);
            matches!(
                PlacementRecord::decode(&sealed(bytes)),
                Err(RecordError::NotCanonical(_))
            )
        };
        assert!(refused(&|b| b[1] |= 1), "a reserved bit of word 0");
        assert!(refused(&|b| b[4..8].fill(0)), "epoch 0");
        assert!(refused(&|b| b[0] = (b[0] & !15) | 2), "an even r");
        assert!(refused(&|b| b[0] |= 3 << 4), "state 3");
        assert!(refused(&|b| b[0] &= !(3 << 4)), "unset with entries");
        assert!(refused(&|b| b[8 + 4 * 3] = 1), "an unused entry");
        assert!(refused(&|b| b[200] = 1), "a reserved word");
        assert!(refused(&|b| b[15] = 1), "node 1 twice");
        let mut torn = good;
        torn[9] ^= 1;
        assert_eq!(
            PlacementRecord::decode(&torn),
            Err(RecordError::Checksum),
            "a copy read while its write landed"
        );
    }

    proptest! {
        #[test]
        fn records_roundtrip(record in record()) {
            let bytes = record.encode().expect("an encodable record");
            prop_assert_eq!(PlacementRecord::decode(&bytes), Ok(Some(record)));
        }

        /// Garbage never panics the decoder, and whatever it accepts encodes back
        /// to the same bytes: one encoding per record.
        #[test]
        fn garbage_is_refused_or_canonical(
            bytes in prop::collection::vec(any::<u8>(), 0..=RECORD_BYTES),
            seal in any::<bool>(),
        ) {
            let mut copy = [0u8; RECORD_BYTES];
            copy[..bytes.len()].copy_from_slice(&bytes);
            let copy = if seal { sealed(copy) } else { copy };
            let _ = PlacementRecord::decode(&bytes);
            if let Ok(Some(record)) = PlacementRecord::decode(&copy) {
                prop_assert_eq!(record.encode(), Some(copy));
            }
        }

        /// Sealed garbage in the entries of a valid header: canonical or refused.
        #[test]
        fn sealed_garbage_entries_are_refused_or_canonical(
            record in record(),
            garbage in prop::collection::vec(any::<u8>(), 1..64),
            at in 8usize..CHECKSUM_AT,
        ) {
            let mut bytes = record.encode().unwrap();
            for (i, b) in garbage.iter().enumerate() {
                if at + i < CHECKSUM_AT {
                    bytes[at + i] = *b;
                }
            }
            let bytes = sealed(bytes);
            if let Ok(Some(decoded)) = PlacementRecord::decode(&bytes) {
                prop_assert_eq!(decoded.encode(), Some(bytes));
            }
        }
    }
}
