//! The first write of a fresh register: one batch per replica, no guess, no
//! background step (SWARM §5.3.1: "Clients pre-allocate cleared buffers so that this
//! step completes in one roundtrip").
//!
//! A store that hands out registers (SWARM-KV's inserts) owns a *fresh* one until it
//! publishes it: the register was reset on every replica (its metadata words cleared,
//! SWARM §5.3.1) and no other client can name it, since it is in no index, cache or
//! operation (the recycling grace, [`super::slot_recycling`] and the store's own recycling,
//! guarantees it). Its first write races nothing, so the Safe-Guess machinery
//! ([`super::safeguess`]) has nothing to arbitrate:
//!
//! ```text
//! WRITE_FRESH(v, prefix):                        # the register is unpublished
//!   w = (guessTs(), VERIFIED, v)
//!   on a majority, one ordered batch per replica:   # a quorum step (§6)
//!     read the metadata words                       # all ⊥ if the register is fresh
//!     write v's record into w's out-of-place buffer
//!     write prefix ++ v's record, ending in place   # the store's bytes, then the in-place copy
//!     CAS own metadata word: ⊥ -> w
//!   written iff a majority read only ⊥ and their CAS found ⊥
//! ```
//!
//! * **VERIFIED at once.** A Safe-Guess write marks its tuple VERIFIED once it is on a
//!   majority (Lemma C.4); readers return a VERIFIED maximum without locking it. No
//!   one reads the register before the store publishes it, which it does only after
//!   this write returned, so by then `w` is on a majority, as VERIFIED requires.
//! * **A quorum step, as a write round.** The batches go to the register's preferred
//!   majority first, and to the other replicas when one of those is slow or failed
//!   ([`super::maxreg`]'s quorum step): a batch lost to a node that was down never
//!   completes, and a broadcast to every replica that waited for any majority could
//!   then wait for ever once a second node crashed (found by a 100-seed run of
//!   `swarm-kv/tests/repair_sim.rs`). The replicas left out hold neither the prefix nor
//!   the value, as after any write round; a store's prefix must be judged from a
//!   majority (SWARM-KV's key headers are).
//! * **In place on the whole majority.** The record is written in place on every
//!   replica the step reaches, not only the primary (In-n-Out keeps it there, §4.3):
//!   the prefix goes there anyway, and the copy lets the other replica of the majority
//!   answer in place when it serves as the primary after a failover. In-place records
//!   are self-validating (tsp and hash, [`super::maxreg`]), so a copy on a non-primary
//!   replica can only ever match its own write.
//! * **The out-of-place buffer** is written too, first: a reader that finds the
//!   in-place copy torn (a write still landing) fetches the buffer, as for any write.
//! * **The read and the CAS** check that the register is clean. One that is not (a
//!   store's bug) never loses what it holds: the CAS only replaces a cleared word,
//!   and any other writer's word, or a tombstone, stays the maximum where it is
//!   above ours. [`FreshOutcome::NotFresh`] then tells the caller to run an ordinary
//!   [`Client::write`], which handles any state. (The prefix and the in-place copy
//!   were written anyway; the in-place copy is self-validating, and a reader that
//!   finds it is not the maximum's write fetches the maximum's buffer.)
//!
//! The prefix lets a store write its own bytes just before the register in the same
//! operation: SWARM-KV's key header, which must be on a majority before the key is
//! indexed (`swarm_kv::index`, "Limits").
//!
//! ## Carrying a store's operation ([`Client::write_fresh_carrying`])
//!
//! A store may append one operation of its own to every replica's batch, after the
//! CAS: SWARM-KV's one-roundtrip insert puts its index CAS there (SWARM §5.3.1: the
//! value and the index mapping "in parallel"). Batches execute in order (§2.1), so on
//! every replica the carried operation takes effect only after the prefix, the record
//! and the CAS did: a store that publishes the register by it publishes it, on each
//! replica, only where the value already is. The carried operation must be on every
//! replica (an index decided on all of them), so the batches go to every replica at
//! once rather than to the preferred majority: the write waits for a majority, as
//! always, then gives the others `slow_after_ns` to answer, and reports what the
//! carried operation returned on every replica that did.

use crate::clock::Clock;
use crate::encoding::{Flag, Tsp};
use crate::fabric::{Batch, Fabric, FabricError, NodeId, Op, OpOutput, Payload};
use crate::layout::SLOT_LOCK_BYTES;
use crate::roundtrip::{OpStats, Roundtrip};

use super::inout::{self, MaxOutcome};
use super::maxreg::NO_TOUCHES;
use super::quorum;
use super::register::{MAX_REPLICAS, RegisterCache, RegisterLoc};
use super::slot_recycling::OwnRound;
use super::{Client, SwarmError};

/// How a [`Client::write_fresh`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreshOutcome {
    /// The value is on a majority, VERIFIED, and the prefix with it.
    Written,
    /// Fewer than a majority of the replicas showed every metadata word cleared: the
    /// register was not fresh. The prefix was written where they answered;
    /// nothing that was in the register is lost. Write the value with
    /// [`Client::write`].
    NotFresh,
}

/// What the operation a [`Client::write_fresh_carrying`] carried returned, on each
/// replica that answered in time.
pub type Carried = heapless::Vec<(NodeId, OpOutput), MAX_REPLICAS>;

/// Position of the carried operation in a fresh write's batch.
const CARRIED_AT: usize = 4;

impl<F: Fabric, C: Clock> Client<F, C> {
    /// The first write of `payload` into a fresh, unpublished register (see the
    /// module docs), with `prefix` stored right before the register, in the same
    /// batch, on a majority of its replicas. One roundtrip when the preferred
    /// majority answers in time.
    ///
    /// The caller guarantees that no other client can reach `reg` until this returns
    /// (the register is in no index or cache). `cache` must be the register's fresh
    /// knowledge; it learns the words the CASes found.
    pub async fn write_fresh(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
        prefix: &[u8],
    ) -> Result<FreshOutcome, SwarmError> {
        let (outcome, _) = self
            .fresh_write(reg, cache, stats, payload, prefix, None)
            .await?;
        Ok(outcome)
    }

    /// [`Self::write_fresh`], with `carried` appended to every replica's batch after
    /// the write (module docs, "Carrying a store's operation"). The batches go to
    /// every replica at once; the write waits for a majority, then up to
    /// `slow_after_ns` for the others, and returns what `carried` returned on each
    /// replica that answered. The carried operation ran on those, and may have run on
    /// the others; on an error, on any of them.
    pub async fn write_fresh_carrying(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
        prefix: &[u8],
        carried: Op,
    ) -> Result<(FreshOutcome, Carried), SwarmError> {
        self.fresh_write(reg, cache, stats, payload, prefix, Some(carried))
            .await
    }

    async fn fresh_write(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
        prefix: &[u8],
        carried: Option<Op>,
    ) -> Result<(FreshOutcome, Carried), SwarmError> {
        self.check_payload(payload)?;
        // Where the prefix starts on the replica at position `p`: right before the
        // register's offset there.
        let prefix_at = |p: usize| reg.offset(p).checked_sub(prefix.len() as u64);
        if let Some(p) = reg
            .replicas
            .positions()
            .iter()
            .find(|&&p| prefix_at(p).is_none())
        {
            return Err(SwarmError::PrefixTooLong {
                len: prefix.len(),
                addr: reg.offset(*p),
            });
        }
        let prefix_at = |p: usize| prefix_at(p).unwrap_or(0);
        let _slot = self.write_slot(reg).await;
        // What every word of a pre-cleared register holds: the marker its reset left
        // (⊥ in memory never reset). The write goes above it.
        let cleared = cache.untombstoned();
        let above_marker = cleared.ts().ticks().saturating_add(1);
        let ts = self
            .allocate_waiting(stats, || {
                let guess = self.guess_ts()?;
                if cleared.is_empty() || guess.ticks() >= above_marker {
                    Ok(guess)
                } else {
                    self.allocate_ts(above_marker)
                }
            })
            .await?;
        let _deadline = self.arm_deadline(stats);
        let verified = Tsp::new(ts, Flag::Verified);
        // Records carry their write without its flag (as `Client::write`'s do).
        let record = self.shared_record(Tsp::new(ts, Flag::Guessed), reg, payload);
        let buffer = self.layout.buffer_addr(ts).ok_or(SwarmError::Slot(
            crate::layout::SlotError::NoLog(ts.writer()),
        ))?;
        let image = Payload::Shared(prefix.iter().chain(record.iter()).copied().collect());
        let word = |p: usize| self.layout.meta_word_addr(reg.offset(p), self.writer);
        let record_at = buffer + u64::from(SLOT_LOCK_BYTES);
        let q = reg.replicas.quorum();
        let asked = if carried.is_some() {
            reg.replicas.len()
        } else {
            q
        };
        // The lines of the replicas asked first at once: their cache misses overlap.
        for p in 0..asked {
            let node = reg.replicas.node(p);
            self.fabric.prefetch(node, record_at, record.len() as u64);
            self.fabric.prefetch(node, prefix_at(p), image.len() as u64);
            self.fabric.prefetch(node, word(p), 8);
        }
        if stats.is_interleaved() {
            crate::exec::yield_now(&self.fabric).await;
        }
        self.track(reg, ts);
        let everyone = reg.replicas.positions();
        let build = |p: usize, batch: &mut Batch| {
            batch.push(inout::read_op(&self.layout, reg.offset(p), false))?;
            batch.push(inout::buffer_write_op(buffer, record.clone()))?;
            batch.push(Op::Write {
                addr: prefix_at(p),
                data: image.clone(),
            })?;
            batch.push(Op::Cas {
                addr: word(p),
                expected: cleared.word(),
                new: verified.word(),
            })?;
            if let Some(op) = &carried {
                batch.push(op.clone())?;
            }
            Ok(())
        };
        // The slot of `ts` stays out of use until every batch of this step is done
        // (`OwnBatches`): a batch to a slow replica may land after the write returned.
        let own_round =
            (!self.fabric.completes_in_submit()).then(|| OwnRound::new(&self.own_batches, ts));
        let mut rt = Roundtrip::start(&self.fabric, stats);
        if let Some(round) = &own_round {
            rt.keep_outstanding_in(&round.tickets);
        }
        match carried {
            None => {
                self.quorum_step_touching(&mut rt, reg, everyone, q, |_| NO_TOUCHES, false, build)
                    .await?;
            }
            Some(_) => self.every_replica_step(&mut rt, reg, build).await?,
        }
        let mut outputs = Carried::new();
        if carried.is_some() {
            for (node, completion) in rt.replies() {
                if let Some(output) = completion.outputs().get(CARRIED_AT) {
                    // At most one reply per replica: cannot overflow.
                    let _ = outputs.push((*node, output.clone()));
                }
            }
        }
        let mut holding = 0;
        for (node, completion) in rt.replies() {
            let (Some(p), Some(meta), Some(previous)) = (
                reg.replicas.position(*node),
                completion.read(0),
                inout::cas_result(completion, 3),
            ) else {
                continue;
            };
            cache.learn_life(inout::delete_word(meta))?;
            let found = inout::max_word(meta);
            let now = match inout::max_outcome(cleared, verified, previous) {
                MaxOutcome::Done(now) | MaxOutcome::Retry(now) => now,
            };
            cache.own_word.set(p, now);
            cache.learn(p, found.max(now));
            if found == cleared && previous == cleared {
                holding += 1;
            }
        }
        if holding < q {
            tracing::warn!(
                writer = self.writer.get(),
                register = reg.id,
                holding,
                "a fresh register's metadata was not cleared on a majority: writing it the ordinary way"
            );
            return Ok((FreshOutcome::NotFresh, outputs));
        }
        self.settle(reg, stats, verified)?;
        Ok((FreshOutcome::Written, outputs))
    }

    /// Posts `build()` to every replica at once, waits for a majority (as any
    /// write), then gives the others `slow_after_ns` to answer
    /// ([`quorum::broadcast_until_among`]); those that do not are suspected, as by a quorum
    /// step.
    async fn every_replica_step(
        &self,
        rt: &mut Roundtrip<'_, F>,
        reg: &RegisterLoc,
        mut build: impl FnMut(usize, &mut Batch) -> Result<(), FabricError>,
    ) -> Result<(), SwarmError> {
        let replicas = (0..reg.replicas.len()).map(|p| reg.replicas.node(p));
        let answered = |replies: &[(NodeId, _)], node| replies.iter().any(|(r, _)| *r == node);
        quorum::broadcast_until_among_in(
            rt,
            &self.fabric,
            replicas.clone(),
            reg.replicas.quorum(),
            self.config.slow_after_ns,
            |node| {
                let mut batch = Batch::new();
                // Every node given is a replica (`replicas` above).
                let p = reg.replicas.position(node).unwrap_or(0);
                build(p, &mut batch)?;
                Ok(Some(batch))
            },
            |replies| replies.len() == reg.replicas.len(),
        )
        .await?;
        for node in replicas {
            if answered(rt.replies(), node) {
                self.trust(node);
            } else {
                self.suspect(node);
            }
        }
        Ok(())
    }
}
