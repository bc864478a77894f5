//! Inserts that ended without knowing whether they mapped their fresh register:
//! the register is judged again later, so that it is recycled rather than leaked.
//!
//! An insert's index call can end without telling whether it mapped the key to the
//! insert's fresh register: it stalled past its deadline (`KvError::Fenced`), the
//! withdrawal that would settle it failed (a node out, contention), or the register
//! could not be read after it (`publish.rs`, `judge_unknown`). The caller gets an
//! unknown outcome. The register may be mapped (the key's live register), mapped and
//! unmapped since (its unmapper's, SWARM §5.4), or never mapped. Only in the last case
//! is it still this client's, and retiring it then is what frees it; in the first two,
//! retiring it would give it two owners (docs/pauses.md, H10). Until it is judged the
//! register is simply not recycled.
//!
//! So the insert queues `key → register` here, and a later operation of this client
//! judges it as an operation of its own (lease check, deadline): the index withdraws
//! every proposal of the register for good
//! ([`crate::index::Index::withdraw_until_hashed`]), and then the register's content
//! tells the rest, exactly as `judge_unknown` does inside the insert. A register the
//! withdrawal finds unmapped and that holds the insert's value, or no value at all
//! (the insert's write reached no majority), is retired as unpublished: no proposal of
//! it can take effect any more, so nothing can name it. A mapped register, or one
//! whose content shows a delete or another life, is left to whoever owns it.
//!
//! **Whenever it runs.** The judgement is safe at any time after the insert: the
//! withdrawal is Paxos under this client's promise (it changes nothing a quorum
//! decided), and the read happens after it, so no mapping can appear between the
//! two (docs/pauses.md, H10: "stopped after `Withdrawn`, before reading the
//! register"). A client stopped anywhere in it wakes up to a judgement that still
//! holds, or fails and is queued again.
//!
//! **Who runs it.** Each insert first judges the oldest waiting entry, if any
//! (inserts are what an undecided register is missing from: the pool);
//! [`KvClient::judge_undecided_inserts`] judges them all, and [`KvClient::close`]
//! calls it. A judgement that cannot tell (the index or the register unreachable) is
//! queued again. **Bounded:** at most [`UNDECIDED_CAPACITY`] wait per client; beyond
//! that the oldest is dropped with a warning, and its register stays taken (a leak,
//! ARCHITECTURE.md "Limitations"), as is everything waiting here when a client
//! crashes.

use std::collections::VecDeque;

use swarm_core::{Clock, Fabric, OpStats, RegisterCache, RegisterLoc};

use super::publish::Judged;
use super::{KvClient, Located};
use crate::registers::recycle::Retired;
use crate::{KvError, RegisterId};

/// Undecided inserts waiting per client, at most.
pub const UNDECIDED_CAPACITY: usize = 64;

/// One insert's fresh register, waiting to be judged.
#[derive(Debug)]
struct Undecided {
    key: Vec<u8>,
    register: RegisterId,
    loc: RegisterLoc,
    /// What the insert learned of the register (its reset's life marker, its own
    /// write): a read that meets a later life then reports it (`Recycled`) instead
    /// of taking another life's content for the insert's.
    knowledge: RegisterCache,
}

/// What the judgements of a client's undecided inserts did, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UndecidedStats {
    /// Inserts waiting to be judged now.
    pub waiting: usize,
    /// Registers found never mapped, and retired.
    pub retired: u64,
    /// Registers found mapped, or unmapped by another client since: not this
    /// client's to recycle.
    pub owned_elsewhere: u64,
    /// Judgements that could not tell, and were queued again.
    pub requeued: u64,
    /// Entries dropped because the queue was full (their registers stay taken).
    pub dropped: u64,
}

/// A client's queue of undecided inserts (module docs).
#[derive(Debug, Default)]
pub(super) struct UndecidedInserts {
    queue: VecDeque<Undecided>,
    stats: UndecidedStats,
}

impl UndecidedInserts {
    /// Queues `key → fresh`, dropping the oldest entry if the queue is full.
    pub(super) fn push(&mut self, key: &[u8], fresh: &Located) {
        if self.queue.len() >= UNDECIDED_CAPACITY
            && let Some(dropped) = self.queue.pop_front()
        {
            self.stats.dropped += 1;
            tracing::warn!(
                register = dropped.register,
                "too many inserts with an unknown outcome wait to be judged: the oldest one's register stays taken"
            );
        }
        self.queue.push_back(Undecided {
            key: key.to_vec(),
            register: fresh.register,
            loc: fresh.loc.clone(),
            knowledge: fresh.knowledge.clone(),
        });
    }

    fn pop(&mut self) -> Option<Undecided> {
        self.queue.pop_front()
    }

    fn requeue(&mut self, entry: Undecided) {
        self.stats.requeued += 1;
        self.queue.push_back(entry);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn stats(&self) -> UndecidedStats {
        UndecidedStats {
            waiting: self.queue.len(),
            ..self.stats
        }
    }
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// What the judgements of this client's undecided inserts did, and how many wait
    /// (module docs of `undecided`: inserts whose outcome stayed unknown).
    pub fn undecided_insert_stats(&self) -> UndecidedStats {
        self.undecided.borrow().stats()
    }

    /// The registers waiting to be judged, oldest first.
    #[cfg(test)]
    pub(super) fn undecided_registers(&self) -> Vec<RegisterId> {
        self.undecided
            .borrow()
            .queue
            .iter()
            .map(|e| e.register)
            .collect()
    }

    /// Judges every insert of this client whose outcome stayed unknown, each as an
    /// operation of its own: its fresh register is retired if it was never mapped,
    /// left to its owner otherwise. Returns how many were judged; those that could not
    /// be judged (a node out, the index contended) wait for a later call.
    ///
    /// # Errors
    /// [`KvError::LeaseExpired`] (or another start failure) when no operation can
    /// start: nothing more is judged, and everything waits.
    pub async fn judge_undecided_inserts(&self) -> Result<usize, KvError> {
        let waiting = self.undecided.borrow().stats().waiting;
        let mut judged = 0;
        for _ in 0..waiting {
            if self.judge_one_undecided().await? {
                judged += 1;
            }
        }
        Ok(judged)
    }

    /// Judges the oldest undecided insert, if one waits. `Ok(true)` if it was judged,
    /// `Ok(false)` if none waited or the judgement could not tell (queued again).
    pub(super) async fn judge_one_undecided(&self) -> Result<bool, KvError> {
        let Some(entry) = self.undecided.borrow_mut().pop() else {
            return Ok(false);
        };
        let stats = OpStats::new();
        let started = match self.begin(&stats).await {
            Ok(started) => started,
            Err(error) => {
                self.undecided.borrow_mut().requeue(entry);
                return Err(error);
            }
        };
        let judged = async {
            let key = self.index.hash_key(&entry.key)?;
            let mut located = Located {
                register: entry.register,
                loc: entry.loc.clone(),
                knowledge: entry.knowledge.clone(),
                vouched_at: started.start,
            };
            self.judge_unknown(&key, &mut located, &stats, started.deadline)
                .await
        };
        let verdict = match judged.await {
            Ok(Judged::Withdrawn | Judged::Unwritten) => {
                self.retire_marked(
                    entry.register,
                    entry.key.len(),
                    Retired::Unpublished,
                    started.deadline,
                );
                self.undecided.borrow_mut().stats.retired += 1;
                true
            }
            Ok(Judged::Mapped | Judged::Undone) => {
                self.undecided.borrow_mut().stats.owned_elsewhere += 1;
                true
            }
            Ok(Judged::Unknown) => false,
            Err(error) => {
                tracing::debug!(
                    register = entry.register,
                    %error,
                    "an insert's unknown outcome could not be judged yet; tried again later"
                );
                false
            }
        };
        if !verdict {
            self.undecided.borrow_mut().requeue(entry);
        }
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(register: RegisterId) -> Located {
        Located {
            register,
            loc: RegisterLoc::at(
                register * 4096,
                swarm_core::Replicas::all(3, 0).expect("replicas"),
            ),
            knowledge: RegisterCache::new(),
            vouched_at: 0,
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_entry_and_counts_it() {
        let mut queue = UndecidedInserts::default();
        for register in 0..UNDECIDED_CAPACITY as u64 + 1 {
            queue.push(b"k", &fresh(register));
        }
        let stats = queue.stats();
        assert_eq!((stats.waiting, stats.dropped), (UNDECIDED_CAPACITY, 1));
        assert_eq!(queue.pop().map(|e| e.register), Some(1), "0 was dropped");
    }

    #[test]
    fn a_requeued_entry_goes_behind_the_others() {
        let mut queue = UndecidedInserts::default();
        queue.push(b"a", &fresh(1));
        queue.push(b"b", &fresh(2));
        let first = queue.pop().expect("an entry");
        queue.requeue(first);
        assert_eq!(queue.pop().map(|e| e.register), Some(2));
        assert_eq!(queue.pop().map(|e| e.register), Some(1));
        assert!(queue.is_empty());
        assert_eq!(queue.stats().requeued, 1);
    }
}
