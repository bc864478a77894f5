//! The client's location cache: key → register, bounded in bytes, approximate LFU.
//!
//! SWARM §5.2: "When a client accesses a key-value pair for the first time, it finds
//! the location of its replicas via the index and caches it for subsequent
//! operations", which is what makes gets and updates one roundtrip. Each entry also
//! keeps the [`RegisterCache`] (what the client knows of the register's metadata
//! words), so the next MAX expects the right value (§4.4).
//!
//! Eviction is approximate LFU (as DINOMO's and FUSEE's caches): each entry counts
//! its hits; when the cache is over its byte budget it samples a few entries and
//! evicts the least used, and counts are halved every so often so that keys that
//! were hot long ago fade.

use std::collections::HashMap;

use swarm_core::RegisterCache;

use crate::RegisterId;

/// Entries examined per eviction.
const SAMPLE: usize = 8;

/// A cached location.
#[derive(Clone, Debug)]
pub struct Location {
    /// The key's register.
    pub register: RegisterId,
    /// What the client knows of that register.
    pub knowledge: RegisterCache,
}

struct Entry {
    key: Vec<u8>,
    location: Location,
    hits: u32,
}

/// See the module docs.
pub struct LocationCache {
    map: HashMap<Vec<u8>, usize>,
    entries: Vec<Entry>,
    bytes: usize,
    budget: usize,
    rng: u64,
    inserts: u64,
}

impl std::fmt::Debug for LocationCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocationCache")
            .field("entries", &self.entries.len())
            .field("bytes", &self.bytes)
            .field("budget", &self.budget)
            .finish()
    }
}

fn entry_bytes(key: &[u8]) -> usize {
    key.len() * 2 + std::mem::size_of::<Entry>() + std::mem::size_of::<(Vec<u8>, usize)>()
}

impl LocationCache {
    /// A cache holding at most about `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            map: HashMap::new(),
            entries: Vec::new(),
            bytes: 0,
            budget,
            rng: 0x9E37_79B9_7F4A_7C15,
            inserts: 0,
        }
    }

    /// Number of cached keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes used (approximately).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The location of `key`, counting a hit.
    pub fn get(&mut self, key: &[u8]) -> Option<Location> {
        let &i = self.map.get(key)?;
        let entry = &mut self.entries[i];
        entry.hits = entry.hits.saturating_add(1);
        Some(entry.location.clone())
    }

    /// Caches (or refreshes) `key`'s location.
    pub fn put(&mut self, key: &[u8], location: Location) {
        if let Some(&i) = self.map.get(key) {
            let entry = &mut self.entries[i];
            if entry.location.register == location.register {
                merge(&mut entry.location.knowledge, &location.knowledge);
            } else {
                entry.location = location;
            }
            return;
        }
        let size = entry_bytes(key);
        if size > self.budget {
            return;
        }
        while self.bytes + size > self.budget && !self.entries.is_empty() {
            self.evict_one();
        }
        self.inserts += 1;
        if self.inserts.is_multiple_of(1 << 16) {
            for e in &mut self.entries {
                e.hits /= 2;
            }
        }
        self.map.insert(key.to_vec(), self.entries.len());
        self.entries.push(Entry {
            key: key.to_vec(),
            location,
            hits: 1,
        });
        self.bytes += size;
    }

    /// Forgets `key` (a stale entry: the register was deleted).
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(i) = self.map.remove(key) {
            self.remove_at(i);
        }
    }

    fn next_random(&mut self) -> usize {
        // xorshift64*: cheap sampling, no need for quality.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize
    }

    fn evict_one(&mut self) {
        let n = self.entries.len();
        let mut victim = self.next_random() % n;
        for _ in 1..SAMPLE.min(n) {
            let i = self.next_random() % n;
            if self.entries[i].hits < self.entries[victim].hits {
                victim = i;
            }
        }
        let key = self.entries[victim].key.clone();
        self.map.remove(&key);
        self.remove_at(victim);
    }

    fn remove_at(&mut self, i: usize) {
        let entry = self.entries.swap_remove(i);
        self.bytes -= entry_bytes(&entry.key);
        if let Some(moved) = self.entries.get(i) {
            self.map.insert(moved.key.clone(), i);
        }
    }
}

/// Merges what two operations learned about one register: the larger knowledge wins.
fn merge(into: &mut RegisterCache, from: &RegisterCache) {
    into.merge(from);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(r: RegisterId) -> Location {
        Location {
            register: r,
            knowledge: RegisterCache::new(),
        }
    }

    #[test]
    fn bounded_and_keeps_hot_keys() {
        let per = entry_bytes(b"key-0000");
        let mut c = LocationCache::new(per * 100);
        c.put(b"hot", loc(1));
        for _ in 0..1000 {
            c.get(b"hot");
        }
        for i in 0..10_000u32 {
            c.put(format!("key-{i:04}").as_bytes(), loc(u64::from(i)));
            assert!(c.bytes() <= per * 100);
        }
        assert!(c.len() <= 100 && c.len() > 50);
        assert_eq!(
            c.get(b"hot").map(|l| l.register),
            Some(1),
            "LFU keeps the hot key"
        );
        c.remove(b"hot");
        assert!(c.get(b"hot").is_none());
        for i in 0..10_000u32 {
            let key = format!("key-{i:04}");
            if let Some(l) = c.get(key.as_bytes()) {
                assert_eq!(l.register, u64::from(i), "index map stays consistent");
            }
        }
    }
}
