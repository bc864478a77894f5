//! Where a key lives in the index: its two candidate buckets (RACE hashing, FUSEE
//! §4.2) and its fingerprint.
//!
//! Both buckets and the fingerprint come from two independently seeded xxh3 hashes:
//! the first bucket from the low bits of one, the fingerprint from its high bits, the
//! second bucket from the other. A key whose two buckets coincide simply has one.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::word::{FP_BITS, FP_MASK};

const SEED_FIRST: u64 = 0x5357_4152_4d49_4458; // "SWARMIDX"
const SEED_SECOND: u64 = 0x5241_4345_3248_4153; // "RACE2HAS"

/// A key's place in an index of `buckets` buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    /// First candidate bucket.
    pub first: u64,
    /// Second candidate bucket (may equal the first).
    pub second: u64,
    /// Fingerprint, `1..=FP_MASK` (0 is reserved for "unknown").
    pub fp: u32,
}

impl KeyHash {
    /// Hashes `key` for an index of `buckets` buckets (a power of two).
    pub fn new(key: &[u8], buckets: u64) -> Self {
        #[cfg(test)]
        HASHED.with(|hashed| hashed.set(hashed.get() + 1));
        let h1 = xxh3_64_with_seed(key, SEED_FIRST);
        let h2 = xxh3_64_with_seed(key, SEED_SECOND);
        let mask = buckets.max(1) - 1;
        let fp = ((h1 >> (64 - FP_BITS)) as u32) & FP_MASK;
        Self {
            first: h1 & mask,
            second: h2 & mask,
            fp: fp.max(1),
        }
    }

    /// The distinct candidate buckets, first bucket first.
    pub fn buckets(&self) -> heapless::Vec<u64, 2> {
        let mut out = heapless::Vec::new();
        let _ = out.push(self.first);
        if self.second != self.first {
            let _ = out.push(self.second);
        }
        out
    }

    /// Whether a slot fingerprint may belong to this key (0 matches every key).
    pub fn matches(&self, fp: u32) -> bool {
        fp == 0 || fp == self.fp
    }
}

/// A key with its [`KeyHash`], hashed once (by [`crate::index::Index::hash_key`],
/// which also checks its length) for everything one KV operation asks of the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashedKey<'k> {
    bytes: &'k [u8],
    hash: KeyHash,
}

impl<'k> HashedKey<'k> {
    /// `key`, whose length the caller checked, hashed for an index of `buckets`.
    pub(crate) fn new(key: &'k [u8], buckets: u64) -> Self {
        Self {
            bytes: key,
            hash: KeyHash::new(key, buckets),
        }
    }

    /// The key's bytes.
    pub fn bytes(&self) -> &'k [u8] {
        self.bytes
    }

    /// The key's candidate buckets and fingerprint.
    pub fn hash(&self) -> KeyHash {
        self.hash
    }
}

#[cfg(test)]
thread_local! {
    /// Keys hashed by this thread ([`KeyHash::new`] calls), for tests that count
    /// hashes per operation.
    static HASHED: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// Keys this thread hashed so far (tests: an operation hashes its key once).
#[cfg(test)]
pub(crate) fn hashed_on_this_thread() -> u64 {
    HASHED.with(|hashed| hashed.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_spread_and_fingerprints_are_never_zero() {
        let buckets = 64u64;
        let mut hits = [0u32; 64];
        for i in 0..6400u32 {
            let h = KeyHash::new(&i.to_le_bytes(), buckets);
            assert!(h.first < buckets && h.second < buckets);
            assert!(h.fp != 0 && h.fp <= FP_MASK);
            hits[h.first as usize] += 1;
            hits[h.second as usize] += 1;
        }
        assert!(hits.iter().all(|&h| h > 100), "uneven spread: {hits:?}");
        let one = KeyHash::new(b"k", 1);
        assert_eq!((one.first, one.second), (0, 0));
        assert_eq!(one.buckets().len(), 1);
    }

    proptest! {
        #[test]
        fn hashing_is_deterministic_and_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), log in 0u32..20) {
            let buckets = 1u64 << log;
            let h = KeyHash::new(&key, buckets);
            prop_assert_eq!(h, KeyHash::new(&key, buckets));
            prop_assert!(h.first < buckets && h.second < buckets);
            prop_assert!(h.matches(h.fp) && h.matches(0));
        }
    }
}
