//! **get** (SWARM §5.3.4): find the key's register in the location cache (or, on a
//! miss, through the index: one roundtrip), then one Safe-Guess read. The payload
//! carries the key, so a register that does not hold this key is never mistaken for
//! it. A tombstone means the cached location is stale: flush it and go through the
//! index again.
//!
//! The common get (a cached key, no upkeep due, a fabric that completes batches
//! inside `submit`) is one plain function, `KvClient::get_now`: the lease check, the
//! deadline armed from the start, the cache entry used in place and the register
//! read's common case (`swarm_core::Client::read_start_with`; RAW's one READ,
//! `raw_read_now_with`), whose payload is checked (it carries the key) and copied
//! into the caller's buffer where it was read, on the stack, with no future built.
//! Any other case takes the general path, which builds the futures.

use swarm_core::{
    Clock, DeadlineScope, Fabric, OpStats, PendingRead, ReadInPlace, ReadStart, ReadValue,
    RegisterCache, SwarmError,
};

/// Copies the value of `payload` (as read from a register: the key first) into
/// `value` if the payload is `key`'s: whether it was.
#[inline]
fn copy_value(key: &[u8], payload: &[u8], value: &mut Vec<u8>) -> bool {
    match decode_payload(payload) {
        Some((k, v)) if k == key => {
            value.extend_from_slice(v);
            true
        }
        _ => false,
    }
}

use crate::KvError;
use crate::cache::Found;
use crate::layout::decode_payload;

use super::{FENCED_ATTEMPTS, KvClient, Located, RegisterProtocol};

/// How a get through the location cache began on the immediate path
/// ([`KvClient::get_now`]).
enum GetNow<'s> {
    /// It came to an end, or handed over to the general path.
    Settled(Settled),
    /// The read's first majority read did not settle it: finish it (cold).
    Reading(Box<Reading<'s>>),
}

/// What a get through the location cache came to.
enum Settled {
    /// The key's value: `payload[value_at..]` (the payload as read, key first).
    Found { payload: Vec<u8>, value_at: usize },
    /// The key's value, copied into the caller's buffer already (read in place).
    Copied,
    /// The operation failed.
    Failed(KvError),
    /// Not through the cache (a miss, a stale entry, another protocol, an interleaved
    /// operation, upkeep due): the general path, from attempt `next`.
    General { next: u32 },
}

/// A cached get whose read [`swarm_core::Client::read_start`] left pending.
struct Reading<'s> {
    /// The operation's deadline, armed until the read ends.
    _scope: DeadlineScope<'s>,
    located: Located,
    /// The entry's knowledge before the read.
    known: RegisterCache,
    found: Found,
    pending: PendingRead,
}

/// What a cached get's register read holds for its key.
enum Judged {
    /// The key's value, at `payload[value_at..]`.
    Holds { payload: Vec<u8>, value_at: usize },
    /// A tombstone, nothing, another key's value, or a register reset since it was
    /// cached: the entry is stale.
    Not,
    /// The read failed.
    Failed(KvError),
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// The key's current value, or `None` if it is absent.
    ///
    /// An attempt that ran past its deadline (a stall: preemption, a page fault, a
    /// paused process) is retried, up to `FENCED_ATTEMPTS` (4) attempts in all: a read
    /// that stopped changed nothing a reader could tell.
    pub async fn get(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        // Through the location cache first (`get_now`), the rest of a pending read's
        // future built only when needed, on the heap.
        let mut value = Vec::new();
        let settled = match self.get_now(key, stats, &mut value) {
            GetNow::Settled(settled) => settled,
            GetNow::Reading(reading) => Box::pin(self.finish_reading(key, stats, reading)).await,
        };
        let next = match settled {
            Settled::Copied => return Ok(Some(value)),
            Settled::Found {
                mut payload,
                value_at,
            } => {
                // The value moves to the front of the payload's buffer, which becomes
                // the value: no allocation and copy of its own.
                payload.copy_within(value_at.., 0);
                payload.truncate(payload.len() - value_at);
                return Ok(Some(payload));
            }
            Settled::Failed(error) => return Err(error),
            Settled::General { next } => next,
        };
        self.get_from(key, stats, next).await
    }

    /// [`Self::get`]'s general path, from attempt `attempt`.
    async fn get_from(
        &self,
        key: &[u8],
        stats: &OpStats,
        mut attempt: u32,
    ) -> Result<Option<Vec<u8>>, KvError> {
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
        // Through the location cache first (`get_now`), the rest of a pending read's
        // future built only when needed, on the heap.
        let settled = match self.get_now(key, stats, value) {
            GetNow::Settled(settled) => settled,
            GetNow::Reading(reading) => Box::pin(self.finish_reading(key, stats, reading)).await,
        };
        let next = match settled {
            Settled::Copied => return Ok(true),
            Settled::Found { payload, value_at } => {
                value.extend_from_slice(&payload[value_at..]);
                self.fabric().give_back(payload);
                return Ok(true);
            }
            Settled::Failed(error) => return Err(error),
            Settled::General { next } => next,
        };
        let Some(read) = self.get_from(key, stats, next).await? else {
            return Ok(false);
        };
        value.extend_from_slice(&read);
        self.fabric().give_back(read);
        Ok(true)
    }

    /// The common get, as one plain function that builds no future: a key in the
    /// location cache, nothing of the upkeep due ([`Self::begin_quiet`]: the same
    /// lease check as every operation's), and the register read's common case on a
    /// fabric that completes batches inside `submit`
    /// ([`swarm_core::Client::read_start`]), with the operation's deadline armed
    /// from its start as [`Self::begin`] arms it. The entry is used where it is
    /// (its location not cloned; one hash of the key), and the read learns into a
    /// copy of its knowledge, written back only when the read returned the key's
    /// value and learned something (a read that failed or was fenced leaves the
    /// entry as it was, as the general path does). A stale entry is dropped and the
    /// general path asks the index, as a new attempt; so does a first attempt that
    /// ran past its deadline. A read that settles at once copies the value into
    /// `value` (empty on entry, left empty unless it returns [`Settled::Copied`]);
    /// one finished on the general path returns the payload as read.
    #[inline(always)]
    fn get_now<'s>(&self, key: &[u8], stats: &'s OpStats, value: &mut Vec<u8>) -> GetNow<'s> {
        if !self.get_now_applies(stats) {
            return GetNow::Settled(Settled::General { next: 1 });
        }
        self.get_now_cached(key, stats, value)
    }

    /// Whether [`Self::get_now`] may apply at all: elsewhere `read_start` could only
    /// leave the read pending (and `raw_read_now_with` decline), so the general path
    /// (which checks the key) runs at the cost of these comparisons, inlined. DM-ABD's gets
    /// always take the general path.
    #[inline(always)]
    fn get_now_applies(&self, stats: &OpStats) -> bool {
        !stats.is_interleaved()
            && matches!(
                self.protocol,
                RegisterProtocol::SafeGuess | RegisterProtocol::Raw
            )
            && self.fabric().completes_in_submit()
    }

    /// [`Self::get_now`] once it applies.
    fn get_now_cached<'s>(
        &self,
        key: &[u8],
        stats: &'s OpStats,
        value: &mut Vec<u8>,
    ) -> GetNow<'s> {
        let general = GetNow::Settled(Settled::General { next: 1 });
        if let Err(error) = self.check_key(key) {
            return GetNow::Settled(Settled::Failed(error));
        }
        let Ok(deadline) = self.begin_quiet() else {
            return general;
        };
        let scope = stats.arm_deadline(deadline);
        let start = deadline.saturating_sub(self.max_op_ns);
        let mut cache = self.cache.borrow_mut();
        let Some((entry, found)) = cache.lookup_mut(key, start) else {
            return general;
        };
        // The payload is checked (it carries the key) and its value copied out where
        // it was read, once the read counts.
        let consume = |payload: &[u8]| copy_value(key, payload, value);
        let stale = if self.protocol == RegisterProtocol::Raw {
            // RAW keeps no knowledge of its registers: one READ of the primary.
            match self.swarm.raw_read_now_with(&entry.loc, stats, consume) {
                Ok(None) => return general,
                Ok(Some(ReadInPlace::Value(true))) => return GetNow::Settled(Settled::Copied),
                Ok(Some(ReadInPlace::Value(false) | ReadInPlace::Empty)) => None,
                Err(error) => Self::read_error(error),
            }
        } else {
            let mut knowledge = entry.knowledge.clone();
            match self
                .swarm
                .read_start_with(&entry.loc, &mut knowledge, stats, consume)
            {
                Ok(ReadStart::Done(ReadInPlace::Value(true))) => {
                    // What the read learned, into the entry (it only grows: the merge
                    // is the read's copy), as `remember_found` writes it back.
                    if knowledge != entry.knowledge {
                        entry.knowledge.merge(&knowledge);
                    }
                    return GetNow::Settled(Settled::Copied);
                }
                Ok(ReadStart::Done(ReadInPlace::Value(false) | ReadInPlace::Empty)) => None,
                Ok(ReadStart::Pending(pending)) => {
                    return GetNow::Reading(Box::new(Reading {
                        _scope: scope,
                        located: Located {
                            register: entry.register,
                            loc: entry.loc.clone(),
                            knowledge,
                            vouched_at: entry.vouched_at,
                        },
                        known: entry.knowledge.clone(),
                        found,
                        pending,
                    }));
                }
                Err(error) => Self::read_error(error),
            }
        };
        // Another key's value, nothing, or a register reset since it was cached: the
        // entry is stale.
        GetNow::Settled(match stale {
            None => {
                cache.remove(key);
                Settled::General { next: 1 }
            }
            Some(error) => Self::failed_first(error),
        })
    }

    /// The rest of a cached get whose read [`Self::get_now`] left pending.
    async fn finish_reading(
        &self,
        key: &[u8],
        stats: &OpStats,
        reading: Box<Reading<'_>>,
    ) -> Settled {
        let Reading {
            _scope,
            mut located,
            known,
            found,
            pending,
        } = *reading;
        let read = self
            .swarm
            .read_finish(&located.loc, &mut located.knowledge, stats, pending)
            .await;
        match self.judge(key, read) {
            Judged::Holds { payload, value_at } => {
                if located.knowledge != known {
                    self.remember_found(key, &located, found);
                }
                Settled::Found { payload, value_at }
            }
            Judged::Not => {
                self.cache.borrow_mut().remove(key);
                Settled::General { next: 1 }
            }
            Judged::Failed(error) => Self::failed_first(error),
        }
    }

    /// What a cached get's register read found for `key` (the checks of
    /// `read_keyed`: the payload carries its key).
    fn judge(&self, key: &[u8], read: Result<ReadValue, SwarmError>) -> Judged {
        match read {
            Ok(ReadValue::Value(payload)) => match decode_payload(&payload) {
                Some((k, v)) if k == key => Judged::Holds {
                    value_at: payload.len() - v.len(),
                    payload,
                },
                _ => Judged::Not,
            },
            Ok(ReadValue::Deleted | ReadValue::Empty) => Judged::Not,
            Err(error) => match Self::read_error(error) {
                None => Judged::Not,
                Some(error) => Judged::Failed(error),
            },
        }
    }

    /// A cached get's register read that failed with `error`: `None` if the register
    /// was reset for another life since it was cached (not the key's any more: the
    /// entry is stale), else the operation's error.
    fn read_error(error: SwarmError) -> Option<KvError> {
        let error = KvError::from(error);
        (!error.is_recycled()).then_some(error)
    }

    /// A first attempt that failed with `error`: retried as the general path's
    /// second attempt if it ran past its deadline (as [`Self::get`] retries).
    fn failed_first(error: KvError) -> Settled {
        if error.is_fenced() && 1 < FENCED_ATTEMPTS {
            tracing::debug!(%error, attempt = 1, "get: stalled past its deadline; retrying");
            Settled::General { next: 2 }
        } else {
            Settled::Failed(error)
        }
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
