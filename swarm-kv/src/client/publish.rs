//! An insert's index publication (SWARM §5.3.1): the fresh register's write and the
//! first index step travel together — the index's blind fast round rides last in the
//! register's batch to every node (one roundtrip), or the read of the key's buckets
//! runs alongside the write — and the insert then maps the key, replaces a deleted
//! register's mapping (retiring that register, §5.4), or becomes an update of the
//! key's live register.

use std::cell::Cell;

use swarm_core::fabric::Nanos;
use swarm_core::{Carried, Clock, Fabric, OpStats, ReadValue, RegisterCache, WriteOutcome};

use crate::index::{BlindInsert, IndexError, InsertOutcome, Withdrawal};
use crate::layout::encode_key_header;
use crate::registers::recycle::Retired;
use crate::{KvError, RegisterId};

use crate::index::hash::HashedKey;

use super::{KvClient, Located, MAX_RETRIES, RegisterProtocol};

/// How an insert's fresh register ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Published {
    /// The key now maps to it.
    Yes,
    /// The key was present: the insert updated the existing register instead.
    No,
    /// The key was present and the insert was one only if absent: nothing written.
    Present,
}

/// What became of an insert's fresh register after an index call could not tell
/// whether it mapped it ([`KvClient::judge_unknown`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Judged {
    /// The key maps to it now.
    Mapped,
    /// It was mapped, and a delete unmapped it since: its unmapper owns it now.
    Undone,
    /// It was never mapped, and no proposal made so far can map it any more: the
    /// insert goes on with it as with a fresh register.
    Withdrawn,
    /// It was never mapped, no proposal made so far can map it any more, and it
    /// holds no value: the insert's write reached no majority. Never proposed
    /// again; retired by a later judgement (`undecided`).
    Unwritten,
    /// The register could not be read: the call's outcome is unknown.
    Unknown,
}

/// What an insert does when its key is present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IfPresent {
    /// Update the key's register with the value (an upsert, `KvClient::insert`).
    Update,
    /// Leave it (`KvClient::insert_if_absent`).
    Keep,
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// The blind fast round an insert of `key` → `register` carries in its register
    /// write (index module docs, "one-roundtrip inserts"), or `None` where there is
    /// none to try: a baseline protocol (no fresh-register write to carry it), fast
    /// inserts turned off, registers on fewer nodes than the index (the round is
    /// decided only by every node, and it may only run on a node after the register's
    /// write there), a node suspected (the round needs every node), or too few of this
    /// client's recent rounds decided for one more to pay (`blind_policy`).
    fn blind_insert(
        &self,
        key: &HashedKey<'_>,
        register: RegisterId,
    ) -> Result<Option<BlindInsert>, KvError> {
        if self.protocol != RegisterProtocol::SafeGuess
            || !self.index.config.fast_inserts
            || usize::from(self.layout.params.replicas) != self.nodes
            || self.swarm.suspicion().any()
            || !self.blind.should_try()
        {
            return Ok(None);
        }
        Ok(Some(self.index.blind_insert_hashed(key, register)?))
    }

    /// One roundtrip (§5.3.1, index "one-roundtrip inserts"): writes `fresh` (key
    /// `header` before it on each replica, and `payload`) with the index's `blind` fast round
    /// last in its batch to every node, so that no node maps the register before it
    /// holds the header and the value. Returns what the blind CAS found on each node
    /// that answered, and when it was sent.
    async fn write_fresh_blind(
        &self,
        fresh: &mut Located,
        stats: &OpStats,
        header: Vec<u8>,
        payload: &[u8],
        blind: &BlindInsert,
    ) -> Result<(Carried, Nanos), KvError> {
        // Watched from a recent reading: from a little earlier than the send is the
        // cautious side (`index::watch`).
        let sent = self.swarm.fabric().recent_now();
        let took = self
            .write_fresh(fresh, stats, header, payload, Some(blind.op()))
            .await?;
        self.blind.record(self.index.blind_decided(&took));
        Ok((took, sent))
    }

    /// What became of `fresh` after an index call (an insert, or a replace mapping
    /// it) could not tell whether it mapped it to `key` (it stalled past its
    /// acknowledgement window, or gave up under contention). That call's proposal may
    /// have been decided unseen (a lookup or another update finishes a change it
    /// finds), the key deleted and the register unmapped by another client, which
    /// owns it from then on and will reset it (`crate::registers::recycle`); or it
    /// may still be accepted on some nodes, for a later reader to finish. Mapping the
    /// register again, or retiring it, could then give it two owners: the next reset
    /// blanks the key header of a mapped register (the soak's "key header missing on
    /// a majority", docs/pauses.md H10).
    ///
    /// So the index first withdraws every proposal of it for good
    /// ([`crate::index::Index::withdraw_until_hashed`]: after that call none can take
    /// effect), and then the register's content tells the rest: a tombstone or
    /// another life means it was mapped and then deleted (only a delete through the
    /// index writes a tombstone, and only the client that unmapped a register resets
    /// it), so the call took effect and the register is its unmapper's (`Undone`);
    /// otherwise it is `Mapped` if the index maps it, or was never mapped
    /// (`Withdrawn`) and the insert may propose it again, or retire it. Read after the
    /// withdrawal, the content leaves no window: nothing can map the register between
    /// the two.
    pub(super) async fn judge_unknown(
        &self,
        key: &HashedKey<'_>,
        fresh: &mut Located,
        stats: &OpStats,
        deadline: Nanos,
    ) -> Result<Judged, KvError> {
        let fabric = self.swarm.fabric();
        self.fence(deadline)?;
        let withdrawal = self
            .index
            .withdraw_until_hashed(fabric, stats, *key, fresh.register, deadline)
            .await?;
        self.fence(deadline)?;
        Ok(match (self.read_register(fresh, stats).await, withdrawal) {
            (Ok(ReadValue::Deleted), _) => Judged::Undone,
            (Err(error), _) if error.is_recycled() => Judged::Undone,
            (Ok(ReadValue::Value(_)), Withdrawal::Mapped) => Judged::Mapped,
            (Ok(ReadValue::Value(_)), Withdrawal::Withdrawn) => Judged::Withdrawn,
            (Ok(ReadValue::Empty), Withdrawal::Withdrawn) => Judged::Unwritten,
            _ => Judged::Unknown,
        })
    }

    /// Writes `fresh` (key header and value) and maps `key` to it, or, if the key is
    /// present, updates its existing register (`if_present` = `Update`) or leaves it
    /// (`Keep`). Sets `uncertain` when an index call could not tell whether it
    /// mapped `fresh`.
    #[allow(clippy::too_many_arguments)] // one insert's state, named by its two callers
    pub(super) async fn publish(
        &self,
        key: &HashedKey<'_>,
        payload: &[u8],
        fresh: &mut Located,
        stats: &OpStats,
        deadline: Nanos,
        uncertain: &Cell<bool>,
        if_present: IfPresent,
    ) -> Result<Published, KvError> {
        let fabric = self.swarm.fabric();
        let register = fresh.register;
        let header = encode_key_header(key.bytes());
        let mut first = if let Some(blind) = self.blind_insert(key, register)? {
            let written = self.write_fresh_blind(fresh, stats, header, payload, &blind);
            let (took, sent) = match written.await {
                Ok(written) => written,
                Err(e) => {
                    // The CAS may have taken on every node.
                    uncertain.set(true);
                    return Err(e);
                }
            };
            if let Err(e) = self.fence(deadline) {
                uncertain.set(true);
                return Err(e);
            }
            let attempt = self
                .index
                .finish_blind_hashed(fabric, stats, *key, deadline, blind, sent, &took)
                .await;
            Some((attempt, sent))
        } else {
            // Two steps in flight together, one roundtrip: the key header with the
            // value, and the read of the key's index buckets (§5.3.1). The index
            // changes only once the header is on a majority (a register is never
            // indexed before its key header), in one more roundtrip on the fast path
            // (`index::fast`).
            let (write_stats, read_stats) = (stats.branch(), stats.branch());
            let write = self.write_fresh(fresh, &write_stats, header, payload, None);
            let read_sent = fabric.now();
            let read_index =
                self.index
                    .read_for_insert_hashed(fabric, &read_stats, *key, register, deadline);
            let (written, index_read) = swarm_core::join(write, read_index).await;
            stats.join_branches(&[&write_stats, &read_stats]);
            written?;
            // Nothing was proposed if the read failed: the register was not mapped.
            let read = index_read?;
            self.fence(deadline)?;
            Some((read.finish(stats).await, read_sent))
        };
        for _ in 0..MAX_RETRIES {
            let (attempt, asked) = match first.take() {
                Some(first) => first,
                None => {
                    self.fence(deadline)?;
                    let asked = fabric.now();
                    let attempt = self
                        .index
                        .insert_until_hashed(fabric, stats, *key, register, deadline)
                        .await;
                    (attempt, asked)
                }
            };
            let outcome = match attempt {
                Ok(outcome) => outcome,
                // The index could not tell whether our mapping took effect (this
                // client stalled past its acknowledgement window, or the call gave up
                // under contention after its accepts): find out (`judge_unknown`).
                Err(
                    error @ (IndexError::OutcomeUnknown { .. } | IndexError::Contention { .. }),
                ) => {
                    uncertain.set(true);
                    match self.judge_unknown(key, fresh, stats, deadline).await? {
                        Judged::Mapped => InsertOutcome::Inserted,
                        // Mapped, then deleted: the insert took effect, and the
                        // register is its unmapper's.
                        Judged::Undone => return Ok(Published::Yes),
                        // Nothing of it can take effect any more: start again.
                        Judged::Withdrawn => {
                            uncertain.set(false);
                            continue;
                        }
                        Judged::Unwritten | Judged::Unknown => return Err(error.into()),
                    }
                }
                Err(e) => {
                    uncertain.set(true);
                    return Err(e.into());
                }
            };
            match outcome {
                InsertOutcome::Inserted => {
                    self.remember(key.bytes(), fresh);
                    return Ok(Published::Yes);
                }
                InsertOutcome::Exists(existing) => {
                    let mut old = Located {
                        register: existing,
                        loc: self.register_loc(existing)?,
                        knowledge: RegisterCache::new(),
                        vouched_at: asked,
                    };
                    self.fence(deadline)?;
                    let value = self.read_register(&mut old, stats).await?;
                    if value == ReadValue::Deleted {
                        self.fence(deadline)?;
                        // Re-insert over a deleted key: take over its mapping.
                        let replaced = match self
                            .index
                            .replace_until_hashed(fabric, stats, key, existing, register, deadline)
                            .await
                        {
                            Ok(replaced) => replaced,
                            // As for the insert above (`judge_unknown`). Every earlier
                            // index call of this insert ended certain or was withdrawn,
                            // so only this replace can have mapped the register: if it
                            // did (mapped, or mapped and deleted since), it unmapped
                            // `existing`, which is then this client's to retire.
                            Err(
                                error @ (IndexError::OutcomeUnknown { .. }
                                | IndexError::Contention { .. }),
                            ) => {
                                uncertain.set(true);
                                match self.judge_unknown(key, fresh, stats, deadline).await? {
                                    Judged::Mapped => true,
                                    // The replace took effect and unmapped `existing`,
                                    // then a delete unmapped the register.
                                    Judged::Undone => {
                                        self.retire_marked(
                                            existing,
                                            key.bytes().len(),
                                            Retired::Unmapped,
                                            deadline,
                                        );
                                        return Ok(Published::Yes);
                                    }
                                    Judged::Withdrawn => {
                                        uncertain.set(false);
                                        false
                                    }
                                    Judged::Unwritten | Judged::Unknown => {
                                        return Err(error.into());
                                    }
                                }
                            }
                            Err(e) => {
                                uncertain.set(true);
                                return Err(e.into());
                            }
                        };
                        if replaced {
                            self.remember(key.bytes(), fresh);
                            // This call unmapped the deleted register: it owns it.
                            self.retire_marked(
                                existing,
                                key.bytes().len(),
                                Retired::Unmapped,
                                deadline,
                            );
                            return Ok(Published::Yes);
                        }
                        continue;
                    }
                    if if_present == IfPresent::Keep {
                        // The key held a value when it was read: an insert only if
                        // absent is linearized there, and writes nothing.
                        self.remember(key.bytes(), &old);
                        return Ok(Published::Present);
                    }
                    // The key is present: the insert becomes an update (§5.3.1).
                    self.fence(deadline)?;
                    match self.write_register(&mut old, stats, payload).await? {
                        WriteOutcome::Written => {
                            self.remember(key.bytes(), &old);
                            return Ok(Published::No);
                        }
                        WriteOutcome::Deleted => continue,
                    }
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }
}
