//! Finding a key's register (SWARM §5.3.4): the location cache first, then the
//! index, whose candidates are read until one holds the key (the payload carries the
//! key, so a register that does not hold it is never mistaken for it). What the index
//! vouched for is remembered in the cache with the register's life, which is what
//! lets an operation through a stale entry detect a recycled register (`crate::cache`,
//! "Stale entries"); entries also expire `cache_ttl_ns` after the index vouched.

use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, OpStats, RegisterCache, yield_now};

use crate::cache::{Found, Location};
use crate::index::MappingTag;
use crate::{KvError, RegisterId};

use crate::index::hash::HashedKey;

use super::register_io::Keyed;
use super::{KvClient, Located, RegisterProtocol};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// For an operation interleaved with others on this thread
    /// ([`OpStats::interleaved`]): hints the location cache's slot for `key`, yields,
    /// hints the entry that slot names, and yields again, so that the lookup that
    /// follows finds both in the processor's cache while the other operations'
    /// misses overlap these (`cache` module docs, "Interleaved lookups").
    ///
    /// The caller checks [`OpStats::is_interleaved`] first: a future that does
    /// nothing still costs every get and update its state and poll.
    pub(super) async fn hint_cached(&self, key: &[u8]) {
        let hash = self.cache.borrow().hint_slot(key);
        yield_now(self.fabric()).await;
        self.cache.borrow().hint_entry(hash);
        yield_now(self.fabric()).await;
    }

    /// The cached location of `key` at time `now` (expired entries are dropped).
    pub(super) fn cached_at(&self, key: &[u8], now: Nanos) -> Option<Located> {
        self.cached_found(key, now).map(|(located, _)| located)
    }

    /// [`Self::cached_at`], and where the cache holds it, for [`Self::remember_found`]:
    /// one hash of the key per operation.
    pub(super) fn cached_found(&self, key: &[u8], now: Nanos) -> Option<(Located, Found)> {
        let (location, found) = self.cache.borrow_mut().lookup(key, now)?;
        Some((
            Located {
                register: location.register,
                loc: location.loc,
                knowledge: location.knowledge,
                vouched_at: location.vouched_at,
            },
            found,
        ))
    }

    /// Whether `located` may be cached: not a location whose register's life is
    /// unknown (no read or write of it saw a delete word that was not a tombstone):
    /// an operation through it would take whatever life it meets for the key's
    /// (`crate::cache`, "Stale entries"). RAW keeps no life and recycles nothing it
    /// cached.
    fn cacheable(&self, located: &Located) -> bool {
        if located.knowledge.life().is_none() && self.protocol != RegisterProtocol::Raw {
            tracing::debug!(
                register = located.register,
                "a location whose register's life is unknown is not cached"
            );
            return false;
        }
        true
    }

    /// [`Self::remember`] of a location found in the cache ([`Self::cached_found`]):
    /// written back into the entry the lookup found, if it is still the key's for
    /// that register (no second hash and probe), else remembered anew.
    pub(super) fn remember_found(&self, key: &[u8], located: &Located, found: Found) {
        if !self.cacheable(located) {
            return;
        }
        let written = self.cache.borrow_mut().write_back(
            found,
            key,
            located.register,
            &located.knowledge,
            located.vouched_at,
        );
        if !written {
            self.remember(key, located);
        }
    }

    /// Caches `key → located`, unless its register's life is unknown
    /// ([`Self::cacheable`]).
    pub(super) fn remember(&self, key: &[u8], located: &Located) {
        if !self.cacheable(located) {
            return;
        }
        self.cache.borrow_mut().put(
            key,
            Location {
                register: located.register,
                loc: located.loc.clone(),
                knowledge: located.knowledge.clone(),
                vouched_at: located.vouched_at,
            },
        );
    }

    /// `key`'s index hash, computed into `slot` the first time it is asked for: an
    /// operation that may not need the index hashes only when it does.
    pub(super) fn hashed<'s, 'k>(
        &self,
        slot: &'s mut Option<HashedKey<'k>>,
        key: &'k [u8],
    ) -> Result<&'s HashedKey<'k>, KvError> {
        Ok(match slot {
            Some(hashed) => hashed,
            None => slot.insert(self.index.hash_key(key)?),
        })
    }

    /// The register of `key` for an update or a delete: the cached one if the cache
    /// knows it holds a write, otherwise the one the index resolves (`None`: absent).
    /// `now` is the current time (the cache entry's age is judged at it); the flag
    /// tells whether the index was asked (time passed: fence before the next step).
    pub(super) async fn locate_written(
        &self,
        key: &HashedKey<'_>,
        stats: &OpStats,
        now: Nanos,
    ) -> Result<(Option<Located>, bool), KvError> {
        let (located, resolved, _) = self.locate_written_noting_deleted(key, stats, now).await?;
        Ok((located, resolved))
    }

    /// [`Self::locate_written`], and when the index was asked, the first candidate
    /// that held a tombstone with the tag of the slot that maps it (a delete unmaps
    /// it: `delete.rs`).
    pub(super) async fn locate_written_noting_deleted(
        &self,
        key: &HashedKey<'_>,
        stats: &OpStats,
        now: Nanos,
    ) -> Result<(Option<Located>, bool, Option<(RegisterId, MappingTag)>), KvError> {
        match self.cached_at(key.bytes(), now) {
            Some(located) if located.knowledge.knows_a_write() => Ok((Some(located), false, None)),
            // Boxed, here and on the other rare paths (a get's miss, an insert's
            // publication, an unmap): inline, they would make every operation's future
            // as large as the largest of them, and executors move futures when they
            // spawn them (`tests/kv_semantics.rs`, `operation_futures_stay_small`).
            _ => {
                let (found, deleted) = Box::pin(self.resolve_noting_deleted(key, stats)).await?;
                Ok((found.map(|(located, _)| located), true, deleted))
            }
        }
    }

    /// Finds `key` through the index: the first candidate register that holds it.
    pub(super) async fn resolve(
        &self,
        key: &HashedKey<'_>,
        stats: &OpStats,
    ) -> Result<Option<(Located, Vec<u8>)>, KvError> {
        Ok(self.resolve_noting_deleted(key, stats).await?.0)
    }

    /// [`Self::resolve`], and the first candidate read before the one that holds the
    /// key (or before the end) that held a tombstone, with its slot's tag. A tombstone
    /// does not name its key: the key header tells, which the index's remove checks.
    async fn resolve_noting_deleted(
        &self,
        key: &HashedKey<'_>,
        stats: &OpStats,
    ) -> Result<(Option<(Located, Vec<u8>)>, Option<(RegisterId, MappingTag)>), KvError> {
        let asked = self.swarm.fabric().now();
        let candidates = self
            .index
            .lookup_hashed(self.swarm.fabric(), stats, key)
            .await?;
        let mut deleted = None;
        for (&register, &tag) in candidates.registers.iter().zip(&candidates.tags) {
            let mut located = Located {
                register,
                loc: self.register_loc(register)?,
                knowledge: RegisterCache::new(),
                vouched_at: asked,
            };
            match self.read_keyed(key.bytes(), &mut located, stats).await? {
                Keyed::Holds(value) => {
                    self.remember(key.bytes(), &located);
                    return Ok((Some((located, value)), deleted));
                }
                Keyed::Deleted => {
                    deleted.get_or_insert((register, tag));
                }
                Keyed::Not => {}
            }
        }
        Ok((None, deleted))
    }
}
