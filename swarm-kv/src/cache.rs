//! The client's location cache: key → register, bounded in bytes, approximate LFU.
//!
//! SWARM §5.2: "When a client accesses a key-value pair for the first time, it finds
//! the location of its replicas via the index and caches it for subsequent
//! operations", which is what makes gets and updates one roundtrip. Each entry also
//! keeps the [`RegisterCache`] (what the client knows of the register's metadata
//! words), so the next MAX expects the right value (§4.4).
//!
//! # Bounded age (why entries expire)
//!
//! Updates and deletes write to a cached register *blindly*: they do not ask the
//! index whether the key still maps there. That is only safe while the register
//! cannot have been reused for another key, so every entry records when the index
//! (or this client's own insert) last *vouched* for it ([`Location::vouched_at`], on
//! the client's `Fabric::now()`), and [`LocationCache::get`] drops entries older than
//! the cache's time-to-live (`KvConfig::cache_ttl_ns`). A hit on a cached location
//! does not renew it (the register was not re-checked against the index); only a
//! fresh index lookup or insert does ([`LocationCache::put`] keeps the newer vouch).
//!
//! So a register that became unreachable through the index at time `t` is named by
//! no cache entry used after `t + ttl` (the lookup that vouched for it began before
//! `t`), and by no operation posting after `t + ttl + max_op_ns` (SWARM §5.4; the
//! register recycler, `crate::recycle`, waits that long plus a clock-drift margin
//! before reusing it).
//!
//! Eviction is approximate LFU (as DINOMO's and FUSEE's caches): each entry counts
//! its hits; when the cache is over its byte budget it samples a few entries and
//! evicts the least used, and counts are halved every so often so that keys that
//! were hot long ago fade.
//!
//! Keys are hashed with xxh3 under a seed drawn per cache from the standard
//! library's random keys (every operation hashes its key at least twice here:
//! SipHash, the standard map's hasher, cost a few percent of a YCSB run on shared
//! memory). The seed keeps key sets chosen to collide from being computed offline.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use swarm_core::RegisterCache;
use swarm_core::fabric::Nanos;

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
    /// When (the client's `Fabric::now()`) the index or this client's insert last
    /// vouched that the key maps to `register`: the start of that lookup or insert.
    pub vouched_at: Nanos,
}

struct Entry {
    key: Vec<u8>,
    location: Location,
    hits: u32,
}

/// Builds [`KeyHasher`]s with this cache's random seed.
#[derive(Clone, Copy, Debug)]
struct SeededKeys(u64);

impl SeededKeys {
    fn random() -> Self {
        Self(std::collections::hash_map::RandomState::new().hash_one(0u64))
    }
}

impl BuildHasher for SeededKeys {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(self.0)
    }
}

/// xxh3 of the key bytes, seeded (a `[u8]` hashes its length, then its bytes).
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = self.0.rotate_left(29) ^ (n as u64);
    }
}

/// See the module docs.
pub struct LocationCache {
    map: HashMap<Vec<u8>, usize, SeededKeys>,
    entries: Vec<Entry>,
    bytes: usize,
    budget: usize,
    ttl_ns: Nanos,
    rng: u64,
    inserts: u64,
    expired: u64,
}

impl std::fmt::Debug for LocationCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocationCache")
            .field("entries", &self.entries.len())
            .field("bytes", &self.bytes)
            .field("budget", &self.budget)
            .field("ttl_ns", &self.ttl_ns)
            .field("expired", &self.expired)
            .finish()
    }
}

fn entry_bytes(key: &[u8]) -> usize {
    key.len() * 2 + std::mem::size_of::<Entry>() + std::mem::size_of::<(Vec<u8>, usize)>()
}

impl LocationCache {
    /// A cache holding at most about `budget` bytes, whose entries expire `ttl_ns`
    /// after they were last vouched for.
    pub fn new(budget: usize, ttl_ns: Nanos) -> Self {
        Self {
            map: HashMap::with_hasher(SeededKeys::random()),
            entries: Vec::new(),
            bytes: 0,
            budget,
            ttl_ns,
            rng: 0x9E37_79B9_7F4A_7C15,
            inserts: 0,
            expired: 0,
        }
    }

    /// The time-to-live of an entry, ns.
    pub fn ttl_ns(&self) -> Nanos {
        self.ttl_ns
    }

    /// Entries dropped so far because they outlived the time-to-live.
    pub fn expired(&self) -> u64 {
        self.expired
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

    /// The location of `key` at time `now`, counting a hit; `None` (and the entry
    /// dropped) if it was vouched for `ttl_ns` or longer ago: the register may have
    /// been recycled since (module docs).
    pub fn get(&mut self, key: &[u8], now: Nanos) -> Option<Location> {
        let &i = self.map.get(key)?;
        let entry = &mut self.entries[i];
        if now.saturating_sub(entry.location.vouched_at) >= self.ttl_ns {
            self.expired += 1;
            self.map.remove(key);
            self.remove_at(i);
            return None;
        }
        entry.hits = entry.hits.saturating_add(1);
        Some(entry.location.clone())
    }

    /// Caches (or refreshes) `key`'s location. For the register already cached, the
    /// knowledge is merged and the newer vouch kept: remembering a location found in
    /// the cache does not make it younger.
    pub fn put(&mut self, key: &[u8], location: Location) {
        if let Some(&i) = self.map.get(key) {
            let entry = &mut self.entries[i];
            if entry.location.register == location.register {
                merge(&mut entry.location.knowledge, &location.knowledge);
                entry.location.vouched_at = entry.location.vouched_at.max(location.vouched_at);
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
        at(r, 0)
    }

    fn at(r: RegisterId, vouched_at: Nanos) -> Location {
        Location {
            register: r,
            knowledge: RegisterCache::new(),
            vouched_at,
        }
    }

    #[test]
    fn entries_expire_ttl_after_their_last_vouch() {
        let mut c = LocationCache::new(1 << 20, 100);
        c.put(b"k", at(7, 1_000));
        assert_eq!(c.get(b"k", 1_099).map(|l| l.register), Some(7));
        // Remembering what a cache hit returned does not renew the entry.
        let hit = c.get(b"k", 1_050).unwrap();
        c.put(b"k", hit);
        assert!(c.get(b"k", 1_100).is_none(), "expired at vouch + ttl");
        assert_eq!(c.expired(), 1);
        assert!(c.is_empty(), "an expired entry is dropped");
        // A fresh index lookup (a newer vouch) renews it; an older one does not.
        c.put(b"k", at(7, 2_000));
        c.put(b"k", at(7, 2_050));
        c.put(b"k", at(7, 1_900));
        assert!(c.get(b"k", 2_149).is_some());
        assert!(c.get(b"k", 2_150).is_none());
        // Another register replaces the entry, vouch and all.
        c.put(b"k", at(7, 3_000));
        c.put(b"k", at(8, 2_500));
        assert_eq!(c.get(b"k", 2_599).map(|l| l.register), Some(8));
        assert!(c.get(b"k", 2_600).is_none());
    }

    #[test]
    fn bounded_and_keeps_hot_keys() {
        let per = entry_bytes(b"key-0000");
        let mut c = LocationCache::new(per * 100, u64::MAX);
        c.put(b"hot", loc(1));
        for _ in 0..1000 {
            c.get(b"hot", 0);
        }
        for i in 0..10_000u32 {
            c.put(format!("key-{i:04}").as_bytes(), loc(u64::from(i)));
            assert!(c.bytes() <= per * 100);
        }
        assert!(c.len() <= 100 && c.len() > 50);
        assert_eq!(
            c.get(b"hot", 0).map(|l| l.register),
            Some(1),
            "LFU keeps the hot key"
        );
        c.remove(b"hot");
        assert!(c.get(b"hot", 0).is_none());
        for i in 0..10_000u32 {
            let key = format!("key-{i:04}");
            if let Some(l) = c.get(key.as_bytes(), 0) {
                assert_eq!(l.register, u64::from(i), "index map stays consistent");
            }
        }
    }
}
