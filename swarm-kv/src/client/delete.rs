//! **delete** (SWARM §5.3.2): a Safe-Guess write of the tombstone, then the mapping
//! is removed. Clients holding the location in their cache see the tombstone, flush
//! and retry through the index. With [`KvConfig::deferred_unmaps`] the delete returns
//! at its tombstone and the unmap runs afterwards ([`KvClient::run_deferred_unmaps`];
//! `deferred_unmap` has the argument). The remover whose unmap took effect owns the
//! register and retires it (SWARM §5.4).

use swarm_core::encoding::Tsp;
use swarm_core::fabric::Nanos;
use swarm_core::{Clock, DeleteOutcome, DeleteVotes, Fabric, FirstDeleter, OpStats, RegisterLoc};

use crate::index::IndexError;
use crate::index::MappingTag;
use crate::registers::recycle::Retired;
use crate::{KvError, RegisterId};

use crate::index::hash::HashedKey;

use super::{KvClient, MAX_RETRIES, RegisterProtocol};

/// A delete through the cache that did not report `Removed` (`KvClient::delete`).
struct FromCache {
    register: RegisterId,
    loc: RegisterLoc,
    outcome: DeleteOutcome,
    votes: DeleteVotes,
    /// The register's life the cache entry named.
    life: Option<Tsp>,
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Deletes `key`: [`DeleteOutcome::Removed`] if this call removed its value,
    /// [`DeleteOutcome::Absent`] if the key was absent, and [`DeleteOutcome::Raced`] if
    /// another delete of the same value ran at the same time: the key is absent either
    /// way, and which of the racing deletes removed the value is undecided (deciding
    /// it is consensus, which no wait-free protocol over crash-prone memory nodes
    /// solves; `swarm_core::protocol::delete`).
    ///
    /// A register found in this client's cache may no longer be the key's: deleted
    /// by another client, the key re-inserted into another register since, or the
    /// register itself recycled, deleted again in a later life, or holding the key
    /// again. Its delete then finds another tombstone first on some replica, exactly
    /// as if another delete were racing it, and a tombstone does not say whose life
    /// it ends. So a delete through the cache that did not remove the value asks the
    /// index: if the key maps to nothing, it was absent then; if it maps to the same
    /// register in the same life (which the tombstones seen make impossible), the
    /// outcome stands; otherwise, if this delete's tombstone landed nowhere, it
    /// changed nothing and deletes the key's register of now; else it deletes that
    /// one unless its tombstone may be first on a majority of the cached register
    /// (then it may be the delete that removed the value there, and reports
    /// [`DeleteOutcome::Raced`]). If a memory node does not answer, that may be
    /// undecidable: [`KvError::DeleteUndecided`], rare, with nothing changed but
    /// perhaps that value.
    ///
    /// A delete that runs past its deadline (a stall) stops with [`KvError::Fenced`]:
    /// its outcome is unknown (its tombstone may be on some replicas, and a reader
    /// may complete it). It is not retried here: a retry after another client
    /// re-inserted the key would delete the key's next life too.
    pub async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, KvError> {
        self.check_key(key)?;
        if self.protocol == RegisterProtocol::Raw {
            return Err(KvError::Unsupported(
                "delete with the RAW baseline protocol",
            ));
        }
        // The key is hashed once, for the cache's misses and every index call.
        let key = &self.index.hash_key(key)?;
        if stats.is_interleaved() {
            self.hint_cached(key.bytes()).await;
        }
        let started = self.begin_write(stats).await?;
        // Hand out the registers whose reset completed and start the resets due
        // (never waits): deletes retire registers, so they also move them along.
        // After the lease check: resets start only under a valid lease.
        self.recycle_step();
        let (start, deadline) = (started.start, started.deadline);
        // A register this call found deleted and could not unmap.
        let mut found_deleted = None;
        // A register reached through the cache whose delete did not report `Removed`,
        // with where it is, that outcome and the life the cache entry named: the
        // index decides next whether it was still the key's register (see the method
        // docs).
        let mut from_cache: Option<FromCache> = None;
        for attempt in 0..MAX_RETRIES {
            let now = self.attempt_now(attempt, start, deadline)?;
            let (located, resolved, tombstoned) =
                self.locate_written_noting_deleted(key, stats, now).await?;
            let Some(mut located) = located else {
                // The key maps to nothing now (or to a tombstone): it was absent at
                // that moment, which agrees with either outcome of a delete of a
                // cached register.
                if let Some((register, tag)) = tombstoned {
                    Box::pin(self.unmap_tombstone(key, register, tag, stats, deadline)).await;
                }
                return Ok(from_cache.map_or(DeleteOutcome::Absent, |c| {
                    if c.votes.landed_nowhere() {
                        // It changed nothing: the key was absent when the index was read.
                        DeleteOutcome::Absent
                    } else {
                        c.outcome
                    }
                }));
            };
            if resolved && found_deleted == Some(located.register) {
                // The index, read just now, still maps the key to the register found
                // deleted: the key was absent when the index was read.
                return Ok(DeleteOutcome::Absent);
            }
            if resolved {
                self.fence(deadline)?;
            }
            let known = match from_cache.take() {
                // Still the key's register, in the life the cache named: its delete's
                // outcome stands. (Not expected: the index's read just found a value
                // there, which a majority of tombstones in that life rules out.)
                Some(c) if c.register == located.register && c.life == located.knowledge.life() => {
                    Some((c.outcome, c.votes))
                }
                // The key moved to another register, or the cached one is in another
                // life (recycled since the entry was made, and holding the key
                // again): what this delete found there says nothing about the key
                // now. If its tombstone landed nowhere, it changed nothing.
                Some(c) if c.votes.landed_nowhere() => None,
                // If this delete's tombstone may be first on a majority of the cached
                // register, it may be the delete that removed the value there, and
                // must not remove another. (Its CASes expect the cached life's
                // marker: they take effect in that life or nowhere.)
                Some(c) if c.outcome == DeleteOutcome::Raced => {
                    match self.swarm.first_deleter(&c.loc, &c.votes, stats).await? {
                        FirstDeleter::NotMe => None,
                        FirstDeleter::Me => return Ok(DeleteOutcome::Raced),
                        FirstDeleter::Unknown => {
                            return Err(KvError::DeleteUndecided {
                                register: c.register,
                            });
                        }
                    }
                }
                _ => None,
            };
            let life = located.knowledge.life();
            let (outcome, votes) = match known {
                Some(known) => known,
                None => match self
                    .swarm
                    .delete_with_votes(&located.loc, &mut located.knowledge, stats)
                    .await
                {
                    Ok(voted) => voted,
                    // Reset for another life since it was located (a stale cache
                    // entry): the tombstone went nowhere. Ask the index.
                    Err(swarm_core::SwarmError::Recycled { .. }) => {
                        self.cache.borrow_mut().remove(key.bytes());
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                },
            };
            if !resolved && outcome != DeleteOutcome::Removed {
                // Another delete's tombstone was there first somewhere: perhaps long
                // ago, and the key lives elsewhere now. Ask the index.
                self.cache.borrow_mut().remove(key.bytes());
                from_cache = Some(FromCache {
                    register: located.register,
                    loc: located.loc.clone(),
                    outcome,
                    votes,
                    life,
                });
                continue;
            }
            match outcome {
                outcome @ (DeleteOutcome::Removed | DeleteOutcome::Raced) => {
                    // The tombstone is the delete's linearization point (SWARM
                    // §5.3.2): the key is gone whatever the unmap does. An index
                    // that cannot unmap now (contention, a stalled client, a lost
                    // majority, the deadline) leaves `key → tombstone`, which reads
                    // as absent and which the next insert of the key replaces. So
                    // the unmap may also wait until after the delete returned
                    // (`deferred_unmap`).
                    if self
                        .deferred
                        .borrow_mut()
                        .defer(key.bytes(), located.register)
                    {
                        self.cache.borrow_mut().remove(key.bytes());
                        return Ok(outcome);
                    }
                    if let Err(error) =
                        Box::pin(self.forget_deleted(key, located.register, stats, deadline)).await
                    {
                        tracing::debug!(%error, register = located.register, "delete: unmapping the tombstoned register failed; the mapping stays (it reads as absent)");
                    }
                    return Ok(outcome);
                }
                // Already deleted by someone else: the key may live elsewhere now.
                DeleteOutcome::Absent => {
                    match Box::pin(self.forget_deleted(key, located.register, stats, deadline))
                        .await
                    {
                        Ok(()) => {}
                        // The unmap raced other index operations on the key's bucket
                        // (its deleter's own unmap, a re-insert): look the key up again.
                        Err(KvError::Index(
                            error @ (IndexError::OutcomeUnknown { .. }
                            | IndexError::Contention { .. }),
                        )) => {
                            tracing::debug!(%error, register = located.register, "delete: unmapping a register found deleted did not settle; looking the key up again");
                            found_deleted = Some(located.register);
                        }
                        Err(error) => return Err(error),
                    }
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Unmaps `key → register`, found mapped by a slot tagged `tag` to a register
    /// holding a tombstone, which a delete through the index reads as absent: its
    /// deleter crashed before its unmap, its unmap failed, or it waits in a client's
    /// queue of deferred unmaps. Nothing else would ever unmap it but a re-insert of
    /// the key, so without this, the key of a crashed deleter kept its slot and its
    /// register for ever (`swarm stat` counts it as a key). The remove is
    /// conditional on `tag` and checks the register's key header
    /// (`Index::remove_tagged_until`): a later life of the mapping, or a register of
    /// another key with the same fingerprint, is left alone, whenever this runs,
    /// exactly as for a late deferred unmap (`deferred_unmap`, "Late unmaps"). A
    /// mapping this client's own queue will unmap is left to it. If the remove
    /// unmapped it, this client owns the register and retires it. A failure changes
    /// nothing the caller sees: the key reads as absent either way.
    async fn unmap_tombstone(
        &self,
        key: &HashedKey<'_>,
        register: RegisterId,
        tag: MappingTag,
        stats: &OpStats,
        deadline: Nanos,
    ) {
        if self.deferred.borrow().holds(key.bytes(), register) {
            return;
        }
        if self.fence(deadline).is_err() {
            return;
        }
        match self
            .index
            .remove_tagged_until_hashed(self.swarm.fabric(), stats, key, register, tag, deadline)
            .await
        {
            Ok(true) => {
                self.retire_marked(register, key.bytes().len(), Retired::Unmapped, deadline);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(%error, register, "delete: unmapping a mapping to a tombstone failed; it stays (it reads as absent)");
            }
        }
    }

    /// Flushes a deleted register from the cache and unmaps it from the index (a
    /// no-op if its deleter already did, or a re-insert replaced it). If this call's
    /// remove is the one that unmapped it, this client owns the register and retires
    /// it (`crate::registers::recycle`).
    pub(super) async fn forget_deleted(
        &self,
        key: &HashedKey<'_>,
        register: RegisterId,
        stats: &OpStats,
        deadline: Nanos,
    ) -> Result<(), KvError> {
        self.cache.borrow_mut().remove(key.bytes());
        self.fence(deadline)?;
        let fabric = self.swarm.fabric();
        if self
            .index
            .remove_until_hashed(fabric, stats, key, register, deadline)
            .await?
        {
            self.retire_marked(register, key.bytes().len(), Retired::Unmapped, deadline);
        }
        Ok(())
    }
}
