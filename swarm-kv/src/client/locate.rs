//! Finding a key's register (SWARM §5.3.4): the location cache first, then the
//! index, whose candidates are read until one holds the key (the payload carries the
//! key, so a register that does not hold it is never mistaken for it). What the index
//! vouched for is remembered in the cache with the register's life, which is what
//! lets an operation through a stale entry detect a recycled register (`crate::cache`,
//! "Stale entries"); entries also expire `cache_ttl_ns` after the index vouched.

use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, OpStats, RegisterCache, yield_now};

use crate::KvError;
use crate::cache::Location;

use crate::index::hash::HashedKey;

use super::{KvClient, Located, RegisterProtocol};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// For an operation interleaved with others on this thread
    /// ([`OpStats::interleaved`]): hints the location cache's slot for `key`, yields,
    /// hints the entry that slot names, and yields again, so that the lookup that
    /// follows finds both in the processor's cache while the other operations'
    /// misses overlap these (`cache` module docs, "Interleaved lookups").
    pub(super) async fn hint_cached(&self, key: &[u8], stats: &OpStats) {
        if stats.is_interleaved() {
            let hash = self.cache.borrow().hint_slot(key);
            yield_now(self.fabric()).await;
            self.cache.borrow().hint_entry(hash);
            yield_now(self.fabric()).await;
        }
    }

    /// The cached location of `key` at time `now` (expired entries are dropped).
    pub(super) fn cached_at(&self, key: &[u8], now: Nanos) -> Result<Option<Located>, KvError> {
        let Some(location) = self.cache.borrow_mut().get(key, now) else {
            return Ok(None);
        };
        Ok(Some(Located {
            register: location.register,
            loc: self.register_loc(location.register)?,
            knowledge: location.knowledge,
            vouched_at: location.vouched_at,
        }))
    }

    /// Caches `key → located`. Not a location whose register's life is unknown (no
    /// read or write of it saw a delete word that was not a tombstone): an operation
    /// through it would take whatever life it meets for the key's (`crate::cache`,
    /// "Stale entries"). RAW keeps no life and recycles nothing it cached.
    pub(super) fn remember(&self, key: &[u8], located: &Located) {
        if located.knowledge.life().is_none() && self.protocol != RegisterProtocol::Raw {
            tracing::debug!(
                register = located.register,
                "a location whose register's life is unknown is not cached"
            );
            return;
        }
        self.cache.borrow_mut().put(
            key,
            Location {
                register: located.register,
                knowledge: located.knowledge.clone(),
                vouched_at: located.vouched_at,
            },
        );
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
        match self.cached_at(key.bytes(), now)? {
            Some(located) if located.knowledge.knows_a_write() => Ok((Some(located), false)),
            // Boxed, here and on the other rare paths (a get's miss, an insert's
            // publication, an unmap): inline, they would make every operation's future
            // as large as the largest of them, and executors move futures when they
            // spawn them (`tests/kv_semantics.rs`, `operation_futures_stay_small`).
            _ => Ok((
                Box::pin(self.resolve(key, stats))
                    .await?
                    .map(|(located, _)| located),
                true,
            )),
        }
    }

    /// Finds `key` through the index: the first candidate register that holds it.
    pub(super) async fn resolve(
        &self,
        key: &HashedKey<'_>,
        stats: &OpStats,
    ) -> Result<Option<(Located, Vec<u8>)>, KvError> {
        let asked = self.swarm.fabric().now();
        let candidates = self
            .index
            .lookup_hashed(self.swarm.fabric(), stats, key)
            .await?;
        for register in candidates.registers {
            let mut located = Located {
                register,
                loc: self.register_loc(register)?,
                knowledge: RegisterCache::new(),
                vouched_at: asked,
            };
            if let Some(value) = self.read_checked(key.bytes(), &mut located, stats).await? {
                self.remember(key.bytes(), &located);
                return Ok(Some((located, value)));
            }
        }
        Ok(None)
    }
}
