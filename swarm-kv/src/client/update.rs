//! **update** (SWARM §5.3.3): locate, then one Safe-Guess write; fails if the key is
//! absent. A write that finds a tombstone changed nothing (the protocol locks its
//! guess out): flush, unmap the dead register in case its deleter crashed, and retry.

use swarm_core::{Clock, Fabric, OpStats, WriteOutcome};

use crate::KvError;
use crate::layout::encode_payload;

use super::{FENCED_ATTEMPTS, KvClient, MAX_RETRIES};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Replaces the value of a present key; `Ok(false)` if the key is absent.
    ///
    /// An attempt that ran past its deadline is retried (up to [`FENCED_ATTEMPTS`]
    /// in all): writing the same value again within the call is safe. If a retry
    /// finds the key absent, an earlier attempt may have written the value before a
    /// delete: that is [`KvError::OutcomeUnknown`], not `false`.
    pub async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, KvError> {
        let mut attempt = 1;
        loop {
            match self.update_once(key, value, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "update: stalled past its deadline; retrying");
                    attempt += 1;
                }
                Ok(false) if attempt > 1 => {
                    return Err(KvError::OutcomeUnknown {
                        op: "update",
                        attempts: attempt,
                    });
                }
                outcome => return outcome,
            }
        }
    }

    async fn update_once(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
    ) -> Result<bool, KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let payload = encode_payload(key, value);
        // The key is hashed once, for the cache's misses and every index call.
        let key = &self.index.hash_key(key)?;
        self.hint_cached(key.bytes(), stats).await;
        let started = self.begin_write(stats).await?;
        let (start, deadline) = (started.start, started.deadline);
        for attempt in 0..MAX_RETRIES {
            let now = self.attempt_now(attempt, start, deadline)?;
            let (located, resolved) = self.locate_written(key, stats, now).await?;
            let Some(mut located) = located else {
                return Ok(false);
            };
            if resolved {
                self.fence(deadline)?;
            }
            match self.write_register(&mut located, stats, &payload).await? {
                WriteOutcome::Written => {
                    self.remember(key.bytes(), &located);
                    return Ok(true);
                }
                WriteOutcome::Deleted => {
                    Box::pin(self.forget_deleted(key, located.register, stats, deadline)).await?;
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }
}
