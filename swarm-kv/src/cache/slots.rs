//! The location cache's table: entry indices by key hash, in open addressing with
//! linear probing.
//!
//! Each slot is one `u64`: the top 32 bits of the key's hash (its *tag*) and the
//! entry's index plus one (0 is an empty slot). A key's probe starts at its tag
//! modulo the table size, so the first cache line a lookup touches is known from the
//! hash alone ([`Slots::home`]): an interleaved get hints that line, lets the other
//! operations in flight run while it arrives, and only then probes (the cache's
//! module docs, "Interleaved lookups"). A general-purpose map does not say where its
//! probe starts; this one is small enough to own.
//!
//! Removal shifts the rest of a probe run back (no tombstones), so a lookup stops
//! at the first empty slot however many keys came and went. The table doubles when
//! it is three quarters full.

/// Slots in a table's first allocation.
const MIN_SLOTS: usize = 16;

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Slots {
    slots: Vec<u64>,
    /// Occupied slots.
    len: usize,
}

/// The tag of `hash`: what a slot keeps of it, and where its probe starts.
fn tag(hash: u64) -> u64 {
    hash >> 32
}

fn slot(hash: u64, index: u32) -> u64 {
    (tag(hash) << 32) | (u64::from(index) + 1)
}

/// The entry index a non-empty slot holds.
fn index_of(slot: u64) -> u32 {
    (slot as u32).wrapping_sub(1)
}

impl Slots {
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// Where the probe of a slot (or hash) tagged `tag` starts.
    fn start(&self, tag: u64) -> usize {
        tag as usize & self.mask()
    }

    /// The slot where the probe for `hash` starts, for a hint: `None` while the
    /// table is empty.
    pub(super) fn home(&self, hash: u64) -> Option<&u64> {
        self.slots.get(self.start(tag(hash)))
    }

    /// The first entry index in `hash`'s probe run, among the slots with its tag,
    /// that `matches` accepts.
    #[inline]
    pub(super) fn find(&self, hash: u64, mut matches: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let tag = tag(hash);
        let mut at = self.start(tag);
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                return None;
            }
            if slot >> 32 == tag && matches(index_of(slot)) {
                return Some(index_of(slot));
            }
            at = (at + 1) & self.mask();
        }
    }

    /// Adds entry `index` under `hash`.
    pub(super) fn insert(&mut self, hash: u64, index: u32) {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        self.place(slot(hash, index));
        self.len += 1;
    }

    /// Removes the slot of entry `index` under `hash`, if there is one.
    pub(super) fn remove(&mut self, hash: u64, index: u32) {
        let Some(mut hole) = self.position(hash, index) else {
            return;
        };
        let mask = self.mask();
        // Shift the rest of the run back: a slot moves into the hole unless its probe
        // starts after the hole (cyclically), where a lookup would no longer reach it.
        let mut at = (hole + 1) & mask;
        while self.slots[at] != 0 {
            let start = self.start(self.slots[at] >> 32);
            if (at.wrapping_sub(start) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[at];
                hole = at;
            }
            at = (at + 1) & mask;
        }
        self.slots[hole] = 0;
        self.len -= 1;
    }

    /// Points the slot of entry `from` under `hash` at entry `to` instead (an entry
    /// moved in the entry vector).
    pub(super) fn renumber(&mut self, hash: u64, from: u32, to: u32) {
        if let Some(at) = self.position(hash, from) {
            self.slots[at] = slot(hash, to);
        }
    }

    fn position(&self, hash: u64, index: u32) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let wanted = slot(hash, index);
        let mut at = self.start(tag(hash));
        loop {
            match self.slots[at] {
                0 => return None,
                slot if slot == wanted => return Some(at),
                _ => at = (at + 1) & self.mask(),
            }
        }
    }

    /// Puts `slot` in the first empty slot of its run (there is one: the table is
    /// at most three quarters full).
    fn place(&mut self, slot: u64) {
        let mut at = self.start(slot >> 32);
        while self.slots[at] != 0 {
            at = (at + 1) & self.mask();
        }
        self.slots[at] = slot;
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        for slot in old.into_iter().filter(|&slot| slot != 0) {
            self.place(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A hash whose tag is `tag`: tests pick tags to force long probe runs.
    fn hash_tagged(tag: u64, low: u64) -> u64 {
        (tag << 32) | (low & 0xFFFF_FFFF)
    }

    proptest! {
        /// The table agrees with a map of (hash, index) pairs through any sequence of
        /// inserts, removals and renumberings, with hashes from a few tags so that
        /// runs are long, wrap around the end, and are shifted back by removals.
        #[test]
        fn agrees_with_a_map(ops in proptest::collection::vec((0u8..3, 0u64..24, 0u32..64), 1..400)) {
            let mut slots = Slots::default();
            let mut model: HashMap<u32, u64> = HashMap::new();
            for (op, tag, index) in ops {
                let hash = hash_tagged(tag * 0x9E37, u64::from(index));
                match op {
                    0 if !model.contains_key(&index) => {
                        slots.insert(hash, index);
                        model.insert(index, hash);
                    }
                    1 => {
                        if let Some(hash) = model.remove(&index) {
                            slots.remove(hash, index);
                        }
                    }
                    _ => {
                        // Move `index` to a free index, as a swap-remove does.
                        if let Some(hash) = model.remove(&index) {
                            let to = 64 + index;
                            if !model.contains_key(&to) {
                                slots.renumber(hash, index, to);
                                model.insert(to, hash);
                            } else {
                                model.insert(index, hash);
                            }
                        }
                    }
                }
                prop_assert_eq!(slots.len, model.len());
                for (&index, &hash) in &model {
                    prop_assert_eq!(slots.find(hash, |i| i == index), Some(index));
                }
            }
            for index in 0..128 {
                if !model.contains_key(&index) {
                    let hash = hash_tagged(0, u64::from(index));
                    prop_assert_eq!(slots.find(hash, |i| i == index), None);
                }
            }
        }
    }

    #[test]
    fn a_probe_starts_at_the_home_slot() {
        let mut slots = Slots::default();
        assert!(slots.home(7).is_none(), "nothing to hint in an empty table");
        let hash = hash_tagged(5, 0);
        slots.insert(hash, 3);
        let home = slots.home(hash).expect("a table");
        assert_eq!(
            *home,
            slot(hash, 3),
            "an uncontended key sits at its home slot"
        );
    }

    #[test]
    fn the_table_stays_at_most_three_quarters_full() {
        let mut slots = Slots::default();
        for index in 0..10_000u32 {
            slots.insert(u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15), index);
            assert!(slots.len * 4 <= slots.slots.len() * 3);
        }
    }
}
