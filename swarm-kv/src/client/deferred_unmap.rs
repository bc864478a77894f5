//! Deletes that return at their tombstone: the index unmap runs afterwards (SWARM
//! §5.3.2, "the mapping is removed in the background").
//!
//! A delete is linearized when its tombstone is on a majority of the register's
//! replicas. Removing `key → register` from the index (a Paxos change of the key's
//! bucket, three roundtrips in the common case; a deferred one adds a lookup and a
//! read of the register, "Late unmaps" below) only lets the register be recycled;
//! it decides nothing any reader observes. With deferral on
//! ([`crate::KvConfig::deferred_unmaps`] > 0) a delete queues the unmap and returns
//! after the tombstone: one roundtrip when the location is cached.
//!
//! **Why returning before the unmap is safe.** Until the unmap, the index still maps
//! the key to the tombstoned register, and every path treats that as "absent", as it
//! already must for a deleter that crashed before its unmap:
//! * a get or an update reads the register through the index or a cache entry and
//!   finds the tombstone: the key is absent (the update writes nothing: the
//!   protocol's write locks the guess out, §5.3.2);
//! * an insert of the key finds the mapping, reads the tombstone and *replaces* the
//!   mapping with its fresh register (`Index::replace_until`, conditional on the
//!   tombstoned register); the replacer owns the unmapped register and retires it.
//!   The deferred unmap is a remove conditional on the same register
//!   (`Index::remove_until`): it then finds another mapping, changes nothing and
//!   returns `false`, so the register is retired exactly once (by whoever's change
//!   unmapped it, as between any two removers: `crate::index`, "Knowing one's fate
//!   (exactly once)").
//!
//! **Late unmaps.** An unmap may run long after its delete: the queue is polled
//! by the caller, a client whose lease lapsed puts it back, `close` runs those
//! left. Meanwhile the mapping may have ended (a re-insert replaced it and retired
//! the register), the register been recycled, and the *same key* inserted into it
//! again: the index then maps `key → register` once more, a new life of the key.
//! A remove conditional on the register alone would unmap that live key. So an
//! unmap looks the key up (which gives the mapping slot's tag, the ballot of the
//! change that mapped it), reads the register, and removes only if the register
//! holds no value of the key, and only the slot that still carries that tag
//! (`Index::remove_tagged_until`): a later life is in the other bucket or carries
//! another tag there (a tag names the bucket and the ballot, `MappingTag`), whenever
//! it began, so no timing is assumed.
//!
//! **The unmap is an operation of its own**: it starts with the lease check and runs
//! under its own deadline (the operation fence), like every operation, so the
//! recycling argument (`crate::registers::recycle`, a retired register is reset only a grace
//! after every operation that may name it) holds unchanged. The delete's own
//! deadline does not bound it: it may run long after the delete returned.
//!
//! **Bounded.** At most `deferred_unmaps` unmaps wait per client; a delete that finds
//! the queue full unmaps before it returns, as with deferral off. What waits is
//! memory not yet recycled: at most that many registers per client.
//!
//! **Who runs them.** The caller: [`KvClient::run_deferred_unmaps`] is a future to
//! keep running next to the operations (the bench harness spawns it on the client's
//! executor whenever unmaps wait), and [`KvClient::close`] runs those left. A client
//! that crashes with unmaps queued leaves mappings to tombstones: they read as absent,
//! and the next insert of such a key replaces the mapping, or the next delete of it
//! unmaps it (`delete.rs`, conditional on the slot's tag as here), and retires the
//! register; the register of a key never touched again stays taken, as after a
//! deleter that crashed before its unmap (ARCHITECTURE.md, "Limitations").

use std::collections::VecDeque;

use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, OpStats, RegisterCache};

use super::{KvClient, Located};
use crate::registers::recycle::Retired;
use crate::{KvError, RegisterId};

/// One delete's unmap, waiting to run.
#[derive(Debug)]
struct PendingUnmap {
    key: Vec<u8>,
    register: RegisterId,
    /// Runs that failed so far (an unmap that fails is tried again by a later call,
    /// up to [`UNMAP_ATTEMPTS`] runs in all).
    failed: u8,
}

/// Runs of one deferred unmap, at most: one that failed (a stall past its deadline on
/// a loaded host, a node out) is queued again for the next call, and dropped only
/// after this many (its mapping to the tombstone then stays: it reads as absent, and
/// `swarm stat` counts it as a key until the key is inserted again).
pub(super) const UNMAP_ATTEMPTS: u8 = 8;

/// What a client's deferred unmaps did, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredUnmapStats {
    /// Unmaps waiting now.
    pub waiting: usize,
    /// Unmaps run after their delete returned.
    pub ran: u64,
    /// Of those, the ones whose remove unmapped the register (this client retired it);
    /// the others found the key remapped by an insert, or failed (the mapping to the
    /// tombstone stays, which reads as absent).
    pub unmapped: u64,
    /// Roundtrips the deferred unmaps took, in all.
    pub roundtrips: u64,
    /// Deletes that unmapped before returning because the queue was full.
    pub overflowed: u64,
}

/// A client's queue of deferred unmaps (see the module docs).
#[derive(Debug)]
pub(super) struct DeferredUnmaps {
    queue: VecDeque<PendingUnmap>,
    capacity: usize,
    stats: DeferredUnmapStats,
}

impl DeferredUnmaps {
    /// A queue of at most `capacity` unmaps (`0`: deferral off).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            capacity,
            stats: DeferredUnmapStats::default(),
        }
    }

    /// Queues the unmap of `key → register`; `false` (nothing queued) when deferral
    /// is off or the queue is full: the delete must unmap before it returns.
    pub(super) fn defer(&mut self, key: &[u8], register: RegisterId) -> bool {
        if self.queue.len() >= self.capacity {
            if self.capacity > 0 {
                self.stats.overflowed += 1;
            }
            return false;
        }
        self.queue.push_back(PendingUnmap {
            key: key.to_vec(),
            register,
            failed: 0,
        });
        true
    }

    /// Whether the unmap of `key → register` waits in this queue.
    pub(super) fn holds(&self, key: &[u8], register: RegisterId) -> bool {
        self.queue
            .iter()
            .any(|u| u.register == register && u.key == key)
    }

    fn pop(&mut self) -> Option<PendingUnmap> {
        self.queue.pop_front()
    }

    /// Puts back an unmap that could not start (the lease check failed).
    fn put_back(&mut self, unmap: PendingUnmap) {
        self.queue.push_front(unmap);
    }

    /// Queues unmaps that failed again, behind the others.
    fn retry_later(&mut self, failed: Vec<PendingUnmap>) {
        self.queue.extend(failed);
    }

    fn ran(&mut self, unmapped: bool, roundtrips: u32) {
        self.stats.ran += 1;
        self.stats.unmapped += u64::from(unmapped);
        self.stats.roundtrips += u64::from(roundtrips);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn stats(&self) -> DeferredUnmapStats {
        DeferredUnmapStats {
            waiting: self.queue.len(),
            ..self.stats
        }
    }
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Whether deletes left index unmaps to run ([`Self::run_deferred_unmaps`]).
    pub fn has_deferred_unmaps(&self) -> bool {
        !self.deferred.borrow().is_empty()
    }

    /// What the deferred unmaps did so far, and how many wait.
    pub fn deferred_unmap_stats(&self) -> DeferredUnmapStats {
        self.deferred.borrow().stats()
    }

    /// Runs the index unmaps that deletes deferred, oldest first, each as an operation
    /// of its own (lease check, deadline), until none waits; returns how many ran.
    /// Keep it running next to the client's operations (on the same executor): a
    /// delete queues its unmap while this runs, and this takes it too. An unmap that
    /// fails is queued again for a later call, up to eight runs; then
    /// it leaves the mapping to the tombstone, which reads as absent (module docs).
    ///
    /// # Errors
    /// [`KvError::LeaseExpired`] when the lease cannot be renewed: the unmap that
    /// could not start waits again, for a later call.
    pub async fn run_deferred_unmaps(&self) -> Result<usize, KvError> {
        let mut ran = 0;
        // Unmaps that failed in this call: queued again for the next one.
        let mut failed = Vec::new();
        loop {
            let next = self.deferred.borrow_mut().pop();
            let Some(mut unmap) = next else {
                self.deferred.borrow_mut().retry_later(failed);
                return Ok(ran);
            };
            let stats = OpStats::new();
            let started = match self.begin(&stats).await {
                Ok(started) => started,
                Err(error) => {
                    let mut deferred = self.deferred.borrow_mut();
                    deferred.put_back(unmap);
                    deferred.retry_later(failed);
                    return Err(error);
                }
            };
            let unmapped = match self
                .unmap_if_still_deleted(&unmap.key, unmap.register, &stats, started.deadline)
                .await
            {
                Ok(unmapped) => unmapped,
                Err(error) if unmap.failed + 1 < UNMAP_ATTEMPTS => {
                    // Safe to run again, whenever: an unmap checks the mapping's tag
                    // and the register's value first (module docs, "late unmaps").
                    tracing::debug!(
                        %error,
                        register = unmap.register,
                        failed = unmap.failed + 1,
                        "deferred unmap failed; tried again later"
                    );
                    unmap.failed += 1;
                    failed.push(unmap);
                    continue;
                }
                Err(error) => {
                    tracing::debug!(
                        %error,
                        register = unmap.register,
                        "deferred unmap failed again; the mapping to the tombstone stays (it reads as absent)"
                    );
                    false
                }
            };
            if unmapped {
                // This remove unmapped the deleted register: this client owns it.
                self.retire_marked(
                    unmap.register,
                    unmap.key.len(),
                    Retired::Unmapped,
                    started.deadline,
                );
            }
            self.deferred.borrow_mut().ran(unmapped, stats.roundtrips());
            ran += 1;
        }
    }

    /// Unmaps `key → register` if that mapping is still the life whose delete
    /// queued this unmap (module docs, "Late unmaps"): the index maps the key to
    /// the register (a lookup, which also gives the slot's tag), the register holds
    /// no value of the key (a read), and the remove is conditional on that tag.
    /// `Ok(true)` if this call unmapped it (the caller then owns the register).
    async fn unmap_if_still_deleted(
        &self,
        key: &[u8],
        register: RegisterId,
        stats: &OpStats,
        deadline: Nanos,
    ) -> Result<bool, KvError> {
        let fabric = self.swarm.fabric();
        // Hashed once, for the lookup and the remove.
        let hashed = self.index.hash_key(key)?;
        let asked = fabric.now();
        let candidates = self.index.lookup_hashed(fabric, stats, &hashed).await?;
        let Some(tag) = candidates
            .registers
            .iter()
            .zip(&candidates.tags)
            .find_map(|(r, tag)| (*r == register).then_some(*tag))
        else {
            // Unmapped already (by a re-insert's replace, or another remover).
            return Ok(false);
        };
        self.fence(deadline)?;
        let mut located = Located {
            register,
            loc: self.register_loc(register)?,
            knowledge: RegisterCache::new(),
            vouched_at: asked,
        };
        if self.read_checked(key, &mut located, stats).await?.is_some() {
            // The key lives in the register again: the deleted life was unmapped,
            // the register recycled and handed to a new insert of the same key.
            // That life is not this unmap's to end.
            return Ok(false);
        }
        self.fence(deadline)?;
        Ok(self
            .index
            .remove_tagged_until_hashed(fabric, stats, &hashed, register, tag, deadline)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_defers_up_to_its_capacity_then_counts_overflows() {
        let mut queue = DeferredUnmaps::new(2);
        assert!(queue.defer(b"a", 1));
        assert!(queue.defer(b"b", 2));
        assert!(!queue.defer(b"c", 3), "full");
        assert_eq!(queue.stats().waiting, 2);
        assert_eq!(queue.stats().overflowed, 1);
        let first = queue.pop().unwrap();
        assert_eq!((first.key.as_slice(), first.register), (&b"a"[..], 1));
        queue.put_back(first);
        assert_eq!(queue.pop().unwrap().register, 1, "put back in front");
        queue.ran(true, 3);
        queue.ran(false, 2);
        let stats = queue.stats();
        assert_eq!((stats.ran, stats.unmapped, stats.roundtrips), (2, 1, 5));
        assert_eq!(queue.pop().unwrap().register, 2);
        assert!(queue.is_empty());
    }

    #[test]
    fn a_queue_of_capacity_zero_defers_nothing_and_counts_no_overflow() {
        let mut queue = DeferredUnmaps::new(0);
        assert!(!queue.defer(b"a", 1));
        assert_eq!(queue.stats(), DeferredUnmapStats::default());
    }
}
