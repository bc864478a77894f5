//! **get** (SWARM §5.3.4): find the key's register in the location cache (or, on a
//! miss, through the index: one roundtrip), then one Safe-Guess read. The payload
//! carries the key, so a register that does not hold this key is never mistaken for
//! it. A tombstone means the cached location is stale: flush it and go through the
//! index again.

use swarm_core::{Clock, Fabric, OpStats};

use crate::KvError;

use super::{FENCED_ATTEMPTS, KvClient};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// The key's current value, or `None` if it is absent.
    ///
    /// An attempt that ran past its deadline (a stall: preemption, a page fault, a
    /// paused process) is retried, up to `FENCED_ATTEMPTS` (4) attempts in all: a read
    /// that stopped changed nothing a reader could tell.
    pub async fn get(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        let mut attempt = 1;
        loop {
            match self.get_once(key, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "get: stalled past its deadline; retrying");
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// [`KvClient::get`] into `value` (its content replaced, its allocation reused):
    /// `Ok(true)` if the key is present, `Ok(false)` (and `value` emptied) if absent.
    /// A steady stream of gets of cached keys allocates nothing on shared memory:
    /// the buffer the value was read into goes back to the fabric
    /// ([`Fabric::give_back`]) for the next read.
    pub async fn get_into(
        &self,
        key: &[u8],
        value: &mut Vec<u8>,
        stats: &OpStats,
    ) -> Result<bool, KvError> {
        value.clear();
        let Some(read) = self.get(key, stats).await? else {
            return Ok(false);
        };
        value.extend_from_slice(&read);
        self.fabric().give_back(read);
        Ok(true)
    }

    async fn get_once(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        self.check_key(key)?;
        if stats.is_interleaved() {
            self.hint_cached(key).await;
        }
        let started = self.begin(stats).await?;
        if let Some((mut located, found)) = self.cached_found(key, started.start) {
            let known = located.knowledge.clone();
            if let Some(value) = self.read_checked(key, &mut located, stats).await? {
                // The cache holds what the read knew before it: it needs the
                // knowledge again only if the read learned something (a cache
                // entry's knowledge only grows: merging what it held is a no-op),
                // then into the entry the lookup found.
                if located.knowledge != known {
                    self.remember_found(key, &located, found);
                }
                return Ok(Some(value));
            }
            // Deleted (or never this key's): the cached location is stale.
            self.cache.borrow_mut().remove(key);
        }
        // The index hash only on a miss (a hit never needs it), once for every
        // index call the resolve makes.
        let key = &self.index.hash_key(key)?;
        Ok(Box::pin(self.resolve(key, stats))
            .await?
            .map(|(_, value)| value))
    }
}
