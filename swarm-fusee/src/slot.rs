//! RACE hashing slots and buckets (FUSEE §4.2).
//!
//! A key hashes to two candidate buckets; each bucket is [`SLOTS_PER_BUCKET`] 8-byte
//! slots. A slot word is `0` when empty, otherwise
//! `tombstone (1 bit) | fingerprint (8 bits) | object address (48 bits)`: the address of
//! the out-of-place object (key, value, embedded log entry) it maps its key to.
//!
//! Every write of a slot installs the address of a freshly allocated object, and objects
//! are never reused, so **a slot never holds the same value twice**: SNAPSHOT's rules
//! rely on conflicting writers proposing different values (FUSEE §4.3), and its CASes
//! with an old value must never succeed against a later round (no ABA). A delete
//! installs a tombstone object of the key rather than `0`, for the same reason; so a
//! slot, once used by a key, belongs to that key forever (see the crate docs).

use xxhash_rust::xxh3::xxh3_64;

/// Slots in one bucket (64-byte buckets).
pub const SLOTS_PER_BUCKET: usize = 8;
/// Bytes of one bucket.
pub const BUCKET_BYTES: u64 = (SLOTS_PER_BUCKET * 8) as u64;

const ADDR_BITS: u32 = 48;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
const FP_SHIFT: u32 = 48;
const TOMBSTONE: u64 = 1 << 56;

/// A decoded non-empty slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotValue {
    /// Address of the object (same on every memory node).
    pub addr: u64,
    /// 8 bits of the key's hash.
    pub fingerprint: u8,
    /// The object is a delete's tombstone: the key is absent.
    pub tombstone: bool,
}

impl SlotValue {
    /// The slot word; `None` when `addr` does not fit in 48 bits or is 0.
    pub fn encode(self) -> Option<u64> {
        if self.addr == 0 || self.addr > ADDR_MASK {
            return None;
        }
        let tomb = if self.tombstone { TOMBSTONE } else { 0 };
        Some(tomb | (u64::from(self.fingerprint) << FP_SHIFT) | self.addr)
    }

    /// Decodes a slot word; `None` for an empty slot.
    pub fn decode(word: u64) -> Option<Self> {
        if word == 0 {
            return None;
        }
        Some(Self {
            addr: word & ADDR_MASK,
            fingerprint: (word >> FP_SHIFT) as u8,
            tombstone: word & TOMBSTONE != 0,
        })
    }
}

/// Where a key may live: two candidate buckets and a fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    /// The two candidate buckets, in the order slots are tried.
    pub buckets: [u64; 2],
    /// 8 bits of the hash, stored in the slot to skip most foreign objects.
    pub fingerprint: u8,
}

impl KeyHash {
    /// The candidate buckets of `key` among `buckets` (at least 2).
    pub fn of(key: &[u8], buckets: u64) -> Self {
        let h = xxh3_64(key);
        let first = h % buckets;
        let mut second = (h.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15) % buckets;
        if second == first {
            second = (first + 1) % buckets;
        }
        Self {
            buckets: [first, second],
            fingerprint: (h >> 56) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn slot_words_round_trip(addr in 1u64..(1 << 48), fingerprint: u8, tombstone: bool) {
            let v = SlotValue { addr, fingerprint, tombstone };
            let word = v.encode().expect("fits");
            prop_assert_ne!(word, 0);
            prop_assert_eq!(SlotValue::decode(word), Some(v));
        }

        #[test]
        fn candidate_buckets_differ_and_are_in_range(key: Vec<u8>, buckets in 2u64..10_000) {
            let h = KeyHash::of(&key, buckets);
            prop_assert!(h.buckets[0] < buckets && h.buckets[1] < buckets);
            prop_assert_ne!(h.buckets[0], h.buckets[1]);
        }
    }

    #[test]
    fn empty_and_out_of_range_addresses_are_not_slot_values() {
        assert_eq!(SlotValue::decode(0), None);
        let v = |addr| SlotValue {
            addr,
            fingerprint: 1,
            tombstone: false,
        };
        assert_eq!(v(0).encode(), None);
        assert_eq!(v(1 << 48).encode(), None);
    }
}
