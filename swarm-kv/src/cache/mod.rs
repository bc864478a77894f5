//! The client's location cache: key → register, bounded in bytes, approximate LFU.
//!
//! SWARM §5.2: "When a client accesses a key-value pair for the first time, it finds
//! the location of its replicas via the index and caches it for subsequent
//! operations", which is what makes gets and updates one roundtrip. Each entry also
//! keeps the [`RegisterCache`] (what the client knows of the register's metadata
//! words), so the next MAX expects the right value (§4.4).
//!
//! # Stale entries (why a cached location is safe to use, however old)
//!
//! Gets, updates and deletes go to a cached register without asking the index
//! whether the key still maps there. Meanwhile the key may have been deleted, the
//! register unmapped, retired, reset for another life ([`crate::registers::recycle`])
//! and given to another key, or to this key again. Nothing bounds when the entry is
//! used: recycling does not wait for it. What makes that safe is the register's
//! *life*, which every entry carries in its [`RegisterCache`]
//! ([`RegisterCache::life`]: the marker its last reset left in every metadata word and
//! delete word, or ⊥ for memory never reset, a life of its own). Only locations
//! whose life is known are cached (`KvClient::remember`): every read or write that
//! returned a value saw a delete word that was not a tombstone, and learned it.
//!
//! With the lens of a thread stopped between any two instructions, what an
//! operation through an entry of life `L` can meet, and what it does:
//!
//! * **`L` is over and a later life is not deleted**: every read and write round
//!   reads the delete word (a write after its CAS, in the same batch), which holds
//!   the later life's marker: the operation stops with `Recycled` having changed
//!   nothing (its CASes expect words of `L`, which never come back: a reset is a
//!   write above every word of every earlier life), and the client asks the index.
//! * **A tombstone**: it may end `L` or any later life; it does not say which. So
//!   an operation through the cache acts on a tombstone only by asking the index: a
//!   get reads the key's register anew through the index; an update's write below a
//!   tombstone never takes effect, and it drops the entry and asks the index without
//!   unmapping anything (an unmap through the cache could remove a later life of the
//!   key that landed in the same register meanwhile); a delete that did not install
//!   its tombstone everywhere asks the index and, unless the index shows the same
//!   register in the same life, re-decides (its tombstone CASes expect `L`'s marker:
//!   they take effect in `L` or nowhere; `KvClient::delete`).
//! * **`L` itself, no tombstone seen**: the register still holds `L`, whose key is
//!   the entry's (a life holds one key, and is unmapped only after it is deleted), so
//!   the value read is the key's current one and a write or a tombstone in `L` is the
//!   key's. A register reset while the read ran shows another marker or a tombstone
//!   on some replica of the quorum (a reset tombstones every replica before it
//!   installs the next marker, and needs every replica).
//! * **Another key's value in `L`'s register, or an unpublished one**: a payload
//!   carries its key, and a get checks it; an insert that turned into an update
//!   leaves its fresh register holding the key unpublished, in a life no entry names.
//! * **Plain stores and the key header**: an in-place record is read only when its
//!   tsp is the maximum's, which no record of an earlier life is; the index, not the
//!   cache, reads key headers, within one lookup (a reset blanks them, and the next
//!   insert writes its key's before the register is indexed).
//!
//! Entries made from an operation's own index lookup need more than the life for
//! the rest of that operation (an update or delete that finds the register deleted
//! unmaps it conditionally on the register alone): the register grace, one operation
//! deadline, keeps such a register in one life until the operation ends
//! (`crate::registers::recycle`, "When: the grace").
//!
//! What an entry's age still bounds ([`LocationCache::lookup`] drops entries older than
//! `KvConfig::cache_ttl_ns` after the index or this client's insert vouched for
//! them, [`Location::vouched_at`]): nothing safety or recycling needs. It is a
//! freshness bound on how long a client uses a location the index has not looked at
//! again, kept as a tunable; a stale entry costs one roundtrip more when next used.
//! A hit does not renew an entry; only a fresh index lookup or insert does
//! ([`LocationCache::put`] keeps the newer vouch).
//!
//! Eviction is approximate LFU (as DINOMO's and FUSEE's caches): each entry counts
//! its hits; when the cache is over its byte budget it samples a few entries and
//! evicts the least used, and counts are halved every so often so that keys that
//! were hot long ago fade.
//!
//! Keys are hashed with xxh3 under a seed drawn per cache from the standard
//! library's random keys (SipHash, the standard map's hasher, cost a few percent of a
//! YCSB run on shared memory). The seed keeps key sets chosen to collide from being
//! computed offline.
//!
//! # Layout (why one table of indices)
//!
//! Entries live in one vector (eviction samples it at random), and a table of slots
//! (`cache/slots.rs`) maps each key's hash to its entry's index. An entry holds its
//! key inline when it is short (YCSB's 24-byte keys are) and the key's full hash, so a lookup
//! touches the table and then one entry, where the hash and the key bytes sit next to
//! the location: a map keyed by heap-allocated keys cost a cache miss per probe on the
//! key bytes (the key comparison was a tenth of a YCSB A run on 20k keys).
//!
//! # Interleaved lookups
//!
//! With many keys, both of a lookup's steps miss the processor's caches: the slot,
//! then the entry it names. On shared memory those two misses were the largest item
//! of a YCSB get's profile, and they come one after the other. An operation that runs
//! next to others on its thread ([`swarm_core::OpStats::interleaved`]) hints the slot
//! ([`LocationCache::hint_slot`]), yields, hints the entry
//! ([`LocationCache::hint_entry`]), yields again, and then looks up: the other
//! operations' misses overlap its own. The table's probe therefore starts where the
//! hash alone says (`Slots::home`).

mod slots;

use std::hash::BuildHasher;

use slots::Slots;

use swarm_core::fabric::Nanos;
use swarm_core::{RegisterCache, RegisterLoc};

use crate::RegisterId;

/// Entries examined per eviction.
const SAMPLE: usize = 8;

/// Keys up to this long are stored inside their entry.
const INLINE_KEY: usize = 38;

/// A cached location.
#[derive(Clone, Debug)]
pub struct Location {
    /// The key's register.
    pub register: RegisterId,
    /// Where that register is: its replicas and its offset on each
    /// (`KvClient::register_loc`: the placement record the client followed when it
    /// cached the entry, else the computed place; a chunk's record changes only while
    /// no client holds the chunk until moves exist, `crate::placement`). Kept here so that
    /// a hit needs no placement hash (a quarter of a cached get's instructions
    /// outside the register read).
    pub loc: RegisterLoc,
    /// What the client knows of that register.
    pub knowledge: RegisterCache,
    /// When (the client's `Fabric::now()`) the index or this client's insert last
    /// vouched that the key maps to `register`: the start of that lookup or insert.
    pub vouched_at: Nanos,
}

/// Where a lookup found a key's entry ([`LocationCache::lookup`]): what the
/// operation then learned goes back there ([`LocationCache::write_back`]) without a
/// second hash of the key and probe of the table.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    index: u32,
    hash: u64,
}

/// A key's bytes: inline when short, else on the heap.
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

struct Entry {
    /// The key's hash ([`LocationCache::hash`]), compared before the key.
    hash: u64,
    key: KeyBytes,
    location: Location,
    hits: u32,
}

/// See the module docs.
pub struct LocationCache {
    /// Entry indices by key hash.
    table: Slots,
    entries: Vec<Entry>,
    /// The seed of the key hash (random per cache).
    seed: u64,
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

/// What an entry of `key` costs, approximately: the entry, its table slots (the
/// table is at least a quarter empty), and the key's bytes when they do not fit
/// inline.
fn entry_bytes(key: &[u8]) -> usize {
    let heap = if key.len() > INLINE_KEY { key.len() } else { 0 };
    heap + std::mem::size_of::<Entry>() + 2 * std::mem::size_of::<u64>()
}

impl LocationCache {
    /// A cache holding at most about `budget` bytes, whose entries expire `ttl_ns`
    /// after they were last vouched for.
    pub fn new(budget: usize, ttl_ns: Nanos) -> Self {
        Self {
            table: Slots::default(),
            entries: Vec::new(),
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            bytes: 0,
            budget,
            ttl_ns,
            rng: 0x9E37_79B9_7F4A_7C15,
            inserts: 0,
            expired: 0,
        }
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
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes used (approximately).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn hash(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed)
    }

    /// The index of `key`'s entry, if cached.
    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let entries = &self.entries;
        self.table
            .find(hash, |i| {
                let e = &entries[i as usize];
                e.hash == hash && e.key.as_slice() == key
            })
            .map(|i| i as usize)
    }

    /// Hints the processor at the table slot where the lookup of `key` starts, and
    /// returns the key's hash for [`Self::hint_entry`] (module docs, "Interleaved
    /// lookups").
    pub fn hint_slot(&self, key: &[u8]) -> u64 {
        let hash = self.hash(key);
        if let Some(slot) = self.table.home(hash) {
            swarm_shm::prefetch_local(slot);
        }
        hash
    }

    /// Hints the processor at the entries the lookup of `hash` will compare: best
    /// after [`Self::hint_slot`]'s line has arrived.
    pub fn hint_entry(&self, hash: u64) {
        let entries = &self.entries;
        self.table.find(hash, |i| {
            swarm_shm::prefetch_local(&entries[i as usize]);
            // Every candidate: the key is compared only in the lookup itself.
            false
        });
    }

    /// The location of `key` at time `now`, counting a hit, and where its entry
    /// is, for [`Self::write_back`]; `None` (and the entry dropped) if it was
    /// vouched for `ttl_ns` or longer ago (module docs, "Stale entries": a
    /// freshness bound, not a safety one).
    pub fn lookup(&mut self, key: &[u8], now: Nanos) -> Option<(Location, Found)> {
        let (location, found) = self.lookup_mut(key, now)?;
        Some((location.clone(), found))
    }

    /// [`Self::lookup`] by reference: the entry itself, for an operation that needs
    /// it only while it holds the cache (no clone of the location), and can write
    /// what it learned straight into it.
    #[inline]
    pub fn lookup_mut(&mut self, key: &[u8], now: Nanos) -> Option<(&mut Location, Found)> {
        let hash = self.hash(key);
        let i = self.find(hash, key)?;
        if now.saturating_sub(self.entries[i].location.vouched_at) >= self.ttl_ns {
            self.expired += 1;
            self.remove_at(i);
            return None;
        }
        let entry = &mut self.entries[i];
        entry.hits = entry.hits.saturating_add(1);
        Some((
            &mut entry.location,
            Found {
                index: i as u32,
                hash,
            },
        ))
    }

    /// [`Self::lookup`] without where (tests).
    #[cfg(test)]
    pub fn get(&mut self, key: &[u8], now: Nanos) -> Option<Location> {
        self.lookup(key, now).map(|(location, _)| location)
    }

    /// What an operation that looked `key` up ([`Self::lookup`], which returned
    /// `found`) learned of `register`, written back into that entry as
    /// [`Self::put`] would (the knowledge merged, the newer vouch kept), if it is
    /// still `key`'s entry for `register`: since the lookup, other operations may
    /// have moved it (an eviction or removal moves the last entry into the freed
    /// place), dropped it, or pointed the key elsewhere. Returns whether it was;
    /// if not, the caller [`Self::put`]s.
    pub fn write_back(
        &mut self,
        found: Found,
        key: &[u8],
        register: RegisterId,
        knowledge: &RegisterCache,
        vouched_at: Nanos,
    ) -> bool {
        let Some(entry) = self.entries.get_mut(found.index as usize) else {
            return false;
        };
        if entry.hash != found.hash
            || entry.location.register != register
            || entry.key.as_slice() != key
        {
            return false;
        }
        let location = &mut entry.location;
        location.knowledge.merge(knowledge);
        location.vouched_at = location.vouched_at.max(vouched_at);
        true
    }

    /// Caches (or refreshes) `key`'s location. For the register already cached, the
    /// knowledge is merged and the newer vouch kept: remembering a location found in
    /// the cache does not make it younger.
    pub fn put(&mut self, key: &[u8], location: Location) {
        let hash = self.hash(key);
        if let Some(i) = self.find(hash, key) {
            let entry = &mut self.entries[i];
            if entry.location.register == location.register {
                // What two operations learned of one register: the larger wins.
                entry.location.knowledge.merge(&location.knowledge);
                entry.location.vouched_at = entry.location.vouched_at.max(location.vouched_at);
            } else {
                entry.location = location;
            }
            return;
        }
        let size = entry_bytes(key);
        // Indices are `u32`: a cache of four billion entries is out of any budget.
        if size > self.budget || self.entries.len() >= u32::MAX as usize {
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
        let index = self.entries.len() as u32;
        self.table.insert(hash, index);
        self.entries.push(Entry {
            hash,
            key: KeyBytes::new(key),
            location,
            hits: 1,
        });
        self.bytes += size;
    }

    /// Forgets `key` (a stale entry: the register was deleted).
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(i) = self.find(self.hash(key), key) {
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
        self.remove_at(victim);
    }

    /// Drops entry `i` and its table slot; the last entry takes its place.
    fn remove_at(&mut self, i: usize) {
        self.table.remove(self.entries[i].hash, i as u32);
        let entry = self.entries.swap_remove(i);
        self.bytes -= entry_bytes(entry.key.as_slice());
        if let Some(moved) = self.entries.get(i) {
            let last = self.entries.len() as u32;
            self.table.renumber(moved.hash, last, i as u32);
        }
    }
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
            loc: RegisterLoc::at(r, swarm_core::Replicas::all(3, r).expect("replicas")),
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

    /// What an operation learned goes back into the entry its lookup found, as a
    /// `put` would, and only while that entry is still the key's for the same
    /// register: not once it was moved (another entry removed), replaced (the key
    /// now maps elsewhere) or dropped.
    #[test]
    fn write_back_reaches_only_the_entry_its_lookup_found() {
        let learned = RegisterCache::holding_raw_value();
        let mut c = LocationCache::new(1 << 20, 1_000);
        c.put(b"a", at(1, 100));
        c.put(b"b", at(2, 100));
        let (_, found) = c.lookup(b"b", 150).expect("cached");
        assert!(c.write_back(found, b"b", 2, &learned, 50));
        let b = c.get(b"b", 150).expect("cached");
        assert!(b.knowledge.knows_a_write(), "merged");
        assert_eq!(b.vouched_at, 100, "the newer vouch kept");
        // Another register, or another key, at that place: not written.
        assert!(!c.write_back(found, b"b", 3, &learned, 100));
        assert!(!c.write_back(found, b"a", 2, &learned, 100));
        // `a` removed: `b` moves into its place, the found one is past the end.
        let (_, found_b) = c.lookup(b"b", 150).expect("cached");
        c.remove(b"a");
        assert!(!c.write_back(found_b, b"b", 2, &learned, 100));
        // The key now maps to another register: the operation's one is not merged
        // into it.
        c.put(b"a", at(1, 100));
        let (_, found_a) = c.lookup(b"a", 150).expect("cached");
        c.put(b"a", at(4, 120));
        assert!(!c.write_back(found_a, b"a", 1, &learned, 100));
        assert!(!c.get(b"a", 150).expect("cached").knowledge.knows_a_write());
        // Dropped, then another key cached in the same place.
        c.remove(b"a");
        c.put(b"c", at(1, 100));
        assert!(!c.write_back(found_a, b"a", 1, &learned, 100));
        assert!(!c.get(b"c", 150).expect("cached").knowledge.knows_a_write());
    }

    #[test]
    fn behaves_as_a_map_for_short_and_long_keys() {
        use std::collections::HashMap;
        let mut c = LocationCache::new(usize::MAX, u64::MAX);
        let mut model: HashMap<Vec<u8>, RegisterId> = HashMap::new();
        let mut x = 7u64;
        for step in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Keys of 1 to 80 bytes: inline and on the heap, some sharing prefixes.
            let len = 1 + (x >> 40) as usize % 80;
            let key: Vec<u8> = (0..len)
                .map(|i| b'a' + ((x >> 20) as usize + i) as u8 % 3)
                .collect();
            match (x >> 60) % 3 {
                0 => {
                    c.put(&key, loc(step));
                    model.insert(key, step);
                }
                1 => {
                    c.remove(&key);
                    model.remove(&key);
                }
                _ => assert_eq!(c.get(&key, 0).map(|l| l.register), model.get(&key).copied()),
            }
            assert_eq!(c.len(), model.len());
        }
        for (key, register) in &model {
            assert_eq!(c.get(key, 0).map(|l| l.register), Some(*register));
        }
    }

    /// The hints of an interleaved lookup are hints: on an empty cache, on present
    /// and on absent keys, they change no entry and no answer.
    #[test]
    fn hints_change_nothing() {
        let mut c = LocationCache::new(1 << 20, u64::MAX);
        c.hint_entry(c.hint_slot(b"nothing yet"));
        for i in 0..100u64 {
            c.put(format!("key-{i}").as_bytes(), loc(i));
        }
        for i in 0..200u64 {
            let key = format!("key-{i}");
            let hash = c.hint_slot(key.as_bytes());
            assert_eq!(hash, c.hash(key.as_bytes()), "the lookup's own hash");
            c.hint_entry(hash);
            let expected = (i < 100).then_some(i);
            assert_eq!(c.get(key.as_bytes(), 0).map(|l| l.register), expected);
        }
        assert_eq!(c.len(), 100);
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
