//! A compact, exact hash set of short `u32` arrays: the memo's storage.
//!
//! The search records millions of configurations per key in the worst case, each a
//! handful of words. A `HashSet<Box<[u32]>>` spends an allocation, a fat pointer and
//! allocator overhead on each (about 100 bytes); here the keys live back to back in
//! one arena (`[len, words...]`) and the table is open addressing with linear probing
//! over 8-byte slots holding a 32-bit hash tag and the record's offset, about 40
//! bytes per entry and no allocation per insert. Lookups compare the tag first, then
//! the words, so the set is exact.

use std::vec::Vec;

/// The smallest table (slots).
const MIN_SLOTS: usize = 64;

/// A set of `[u32]` keys.
#[derive(Debug, Default)]
pub(crate) struct KeySet {
    /// Records back to back: `[len, words...]`.
    arena: Vec<u32>,
    /// 0 when empty, else `tag << 32 | (offset + 1)`; a power of two long.
    slots: Vec<u64>,
    len: usize,
}

/// A well-mixed 64-bit hash of `key` (Fx-style multiply-add, then the murmur3
/// finalizer so that the low bits, used for the table index, are good too).
fn hash(key: &[u32]) -> u32 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = key.len() as u64;
    for &w in key {
        h = (h.rotate_left(5) ^ u64::from(w)).wrapping_mul(K);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h as u32
}

impl KeySet {
    /// How many keys the set holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The words at arena offset `at`.
    fn record(&self, at: usize) -> &[u32] {
        let len = self.arena[at] as usize;
        &self.arena[at + 1..at + 1 + len]
    }

    /// The slot holding `key`, or the empty slot where it would go.
    fn probe(&self, key: &[u32], tag: u32) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut i = tag as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return Err(i);
            }
            if (slot >> 32) as u32 == tag && self.record((slot as u32 - 1) as usize) == key {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Whether `key` is in the set.
    pub(crate) fn contains(&self, key: &[u32]) -> bool {
        !self.slots.is_empty() && self.probe(key, hash(key)).is_ok()
    }

    /// Adds `key`; returns whether it was new.
    pub(crate) fn insert(&mut self, key: &[u32]) -> bool {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let tag = hash(key);
        let Err(free) = self.probe(key, tag) else {
            return false;
        };
        if self.arena.len() + key.len() + 1 >= u32::MAX as usize {
            // Offsets would overflow: forgetting everything is always allowed (the
            // memo only prunes).
            self.clear();
            return self.insert(key);
        }
        let at = self.arena.len();
        self.arena.push(key.len() as u32);
        self.arena.extend_from_slice(key);
        self.slots[free] = u64::from(tag) << 32 | (at as u64 + 1);
        self.len += 1;
        true
    }

    /// Doubles the table, reinserting the slots by their tags.
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = core::mem::replace(&mut self.slots, std::vec![0; size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let mut i = (slot >> 32) as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = slot;
        }
    }

    /// Keeps only the keys for which `keep` holds, compacting the arena.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&[u32]) -> bool) {
        let arena = core::mem::take(&mut self.arena);
        self.clear();
        let mut at = 0;
        while at < arena.len() {
            let len = arena[at] as usize;
            let key = &arena[at + 1..at + 1 + len];
            if keep(key) {
                self.insert(key);
            }
            at += 1 + len;
        }
    }

    /// Removes every key and releases the memory.
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn stores_keys_exactly() {
        let mut set = KeySet::default();
        assert!(!set.contains(&[1, 2]));
        assert!(set.insert(&[1, 2]));
        assert!(!set.insert(&[1, 2]));
        assert!(set.insert(&[1, 2, 0]));
        assert!(set.insert(&[]));
        assert!(set.insert(&[2, 1]));
        assert!(set.contains(&[1, 2]) && set.contains(&[]) && !set.contains(&[1]));
        assert_eq!(set.len(), 4);
        set.retain(|k| k.first() == Some(&1));
        assert_eq!(set.len(), 2);
        assert!(set.contains(&[1, 2, 0]) && !set.contains(&[2, 1]) && !set.contains(&[]));
        set.clear();
        assert!(!set.contains(&[1, 2]));
    }

    proptest! {
        #[test]
        fn behaves_like_a_hash_set(
            keys in proptest::collection::vec(proptest::collection::vec(0u32..6, 0..4), 0..400),
            cut in 0u32..6,
        ) {
            let mut set = KeySet::default();
            let mut model: HashSet<Vec<u32>> = HashSet::new();
            for key in &keys {
                prop_assert_eq!(set.insert(key), model.insert(key.clone()));
            }
            prop_assert_eq!(set.len(), model.len());
            set.retain(|k| k.first().is_none_or(|&w| w >= cut));
            model.retain(|k| k.first().is_none_or(|&w| w >= cut));
            prop_assert_eq!(set.len(), model.len());
            for key in &keys {
                prop_assert_eq!(set.contains(key), model.contains(key));
            }
        }
    }
}
