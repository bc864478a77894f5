//! **update** (SWARM §5.3.3): locate, then one Safe-Guess write; fails if the key is
//! absent. A write that finds a tombstone changed nothing (the protocol locks its
//! guess out): flush, and retry through the index; a register the index named in
//! this attempt is unmapped first, in case its deleter crashed (one reached through
//! the cache is not: the tombstone may end a later life of it, `crate::cache`).

use swarm_core::{Clock, Fabric, OpStats, WriteOutcome};

use crate::KvError;
use crate::layout::encode_payload_into;

use super::{KvClient, MAX_RETRIES};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Replaces the value of a present key; `Ok(false)` if the key is absent.
    ///
    /// An update that runs past its deadline (a stall) stops with
    /// [`KvError::Fenced`]: its outcome is unknown (it may have written the value).
    /// It is not retried here: a second write of the value, after another client's
    /// write or delete, would make one update take effect twice.
    pub async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        // Encoded into the buffer of the previous update: no allocation.
        let mut payload = self.payload_buffer.take();
        encode_payload_into(&mut payload, key, value);
        let outcome = self.update_payload(key, &payload, stats).await;
        self.payload_buffer.set(payload);
        outcome
    }

    /// [`KvClient::update`] of the checked `key` with its encoded `payload`.
    async fn update_payload(
        &self,
        key: &[u8],
        payload: &[u8],
        stats: &OpStats,
    ) -> Result<bool, KvError> {
        if stats.is_interleaved() {
            self.hint_cached(key).await;
        }
        let started = self.begin_write(stats).await?;
        let (start, deadline) = (started.start, started.deadline);
        // The index hash only when the index is asked (a cache hit that knows a write
        // never needs it), then once for every index call the update makes.
        let mut hashed = None;
        for attempt in 0..MAX_RETRIES {
            let now = self.attempt_now(attempt, start, deadline)?;
            let cached = self
                .cached_found(key, now)
                .filter(|(located, _)| located.knowledge.knows_a_write());
            let (located, found, resolved) = match cached {
                Some((located, found)) => (Some(located), Some(found), false),
                None => {
                    let hashed = self.hashed(&mut hashed, key)?;
                    let (located, resolved) = self.locate_written(hashed, stats, now).await?;
                    (located, None, resolved)
                }
            };
            let Some(mut located) = located else {
                return Ok(false);
            };
            if resolved {
                self.fence(deadline)?;
            }
            match self.write_register(&mut located, stats, payload).await {
                Ok(WriteOutcome::Written) => {
                    // Into the entry the lookup found: one hash of the key.
                    match found {
                        Some(found) => self.remember_found(key, &located, found),
                        None => self.remember(key, &located),
                    }
                    return Ok(true);
                }
                // Found through the index in this attempt: the register is the key's
                // and deleted (no reset can come before this operation's end, the
                // register grace): unmap it in case its deleter crashed, and retry.
                Ok(WriteOutcome::Deleted) if resolved => {
                    let hashed = self.hashed(&mut hashed, key)?;
                    Box::pin(self.forget_deleted(hashed, located.register, stats, deadline))
                        .await?;
                }
                // Through the cache: a tombstone does not say whose life it ends. It
                // may end a later life of the register, which may be reset and hold
                // this key again by the time an unmap ran. The write changed nothing
                // (a write below a tombstone never takes effect): ask the index.
                Ok(WriteOutcome::Deleted) => {
                    self.cache.borrow_mut().remove(key);
                }
                // The register was reset for another life since it was located (a
                // stale cache entry): the write changed nothing there. Ask the index.
                Err(error) if error.is_recycled() => {
                    self.cache.borrow_mut().remove(key);
                }
                Err(error) => return Err(error),
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }
}
