//! Safe-Guess: one-roundtrip linearizable, wait-free reads and writes (SWARM §3.2,
//! appendix C), over the reliable max register `M` and per-writer timestamp locks.
//!
//! ```text
//! WRITE(v):
//!   w = (guessTs(), GUESSED, v)
//!   in parallel: m = M.READ_weak();  M.WRITE(w)       # one pipelined batch per node
//!   if m <= w: background M.WRITE((w.ts, VERIFIED, v)); return      # fast path
//!   a = M.READ()                                     # slow path: something above w
//!   if a <= w: background M.WRITE((w.ts, VERIFIED, v)); return      # is on a majority
//!   if TSL[tid].TRYLOCK(w.ts, WRITE):                # no reader can ever return w
//!      M.WRITE(((max(m, a).ts.counter+1, tid), VERIFIED, v))
//!   return                                           # else a reader deemed w fresh
//!
//! READ():
//!   seen = {}                                        # writer -> tuple seen earlier
//!   loop:
//!     m = M.READ()
//!     if m.flag == VERIFIED: return m.v
//!     if m was seen in an earlier iteration:         # read twice => fresh
//!        if TSL[m.ts.tid].TRYLOCK(m.ts, READ):       # its writer will never rewrite it
//!           background M.WRITE((m.ts, VERIFIED, m.v)); return m.v
//!     if seen[m.ts.tid] exists and != m:             # that writer started a newer
//!        return seen[m.ts.tid].v                     # write, so the older completed
//!     seen[m.ts.tid] = m
//! ```
//!
//! The paper's line 6 is a full `M.READ`; ours is weak (no value fetched, nothing
//! written back) so that the fast path stays at one roundtrip. The slow path makes up
//! for it with the strong `M.READ` above (skipped when the weak read already saw `m` or
//! more on a majority), *before* the WRITE lock: Lemma C.5 case (ii)
//! (wait-freedom) needs the tuple that sent the write to its slow path on a majority
//! by then, so that a reader whose READ lock on `w` fails finds something newer on its
//! next read even if this writer crashes before rewriting. If that read finds nothing
//! above `w` (what the weak read saw was on a minority and is not on the majority read
//! now), `w` is the maximum of a majority and is as fresh as on the fast path: every
//! write or read that completed before this write began is at most `w` (Lemmas A.3
//! and C.4), so the write completes like the fast path.
//!
//! Deletes (SWARM-KV §5.3.2) write the tombstone timestamp, which is above every
//! write. A tombstone is fresh by construction and its writer never rewrites it, so it
//! is written VERIFIED directly and readers return "deleted" at once. A write that
//! finds a tombstone (`m > w` with `m` a tombstone) must not rewrite above it (there
//! is no timestamp above). It writes the tombstone back to a majority first (the weak
//! read may have seen it on one node only; it has no value to fetch, so this is the
//! slow path's strong read), then locks its guess in WRITE mode: if that succeeds no
//! reader ever returns `w`, and the write reports [`WriteOutcome::Deleted`] (the
//! delete took effect, and is linearized before this write); if the lock fails, a
//! reader may have returned `w`, so the write took effect (before the delete).
//! Tombstones live in the register's write-once delete word, and the delete itself
//! is in [`super::delete`], with what it reports when deletes race.
//!
//! Background VERIFIED marks (§3.2 line 8 and the read's line 17) CAS the flag into
//! the replicas known to hold the guessed tuple and write the in-place copy on the
//! primary (§6: in-place data is written when a tuple is marked verified).

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::clock::Clock;
use crate::encoding::{Flag, LockMode, Tsp};
use crate::fabric::{Batch, Fabric, Nanos, Op, Payload};
use crate::layout::encode_record_for;
use crate::roundtrip::OpStats;

use super::maxreg::{ReadNow, Views, WriteProgress};
use super::register::{RegisterCache, RegisterLoc};
use super::{Client, ReadInPlace, ReadValue, SwarmError, WriteOutcome};

/// How a Safe-Guess read began ([`Client::read_start`], or
/// [`Client::read_start_with`] with `V` a [`ReadInPlace`]).
#[derive(Debug)]
pub enum ReadStart<V = ReadValue> {
    /// The read is complete (its common case): its result.
    Done(V),
    /// Not the common case: finish it with [`Client::read_finish`].
    Pending(PendingRead),
}

/// A Safe-Guess read that [`Client::read_start`] began and did not complete: what its
/// first majority read found, if it took one.
#[derive(Debug)]
pub struct PendingRead(Option<Box<Views>>);

/// A common-case read's owned value as [`ReadValue`].
fn owned(value: ReadInPlace<Vec<u8>>) -> ReadValue {
    match value {
        ReadInPlace::Empty => ReadValue::Empty,
        ReadInPlace::Value(value) => ReadValue::Value(value),
    }
}

impl<F: Fabric, C: Clock> Client<F, C> {
    /// Safe-Guess `WRITE(payload)`.
    pub async fn write(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
    ) -> Result<WriteOutcome, SwarmError> {
        self.check_payload(payload)?;
        let _slot = self.write_slot(reg).await;
        // Nothing observed yet: a full log may hold the write back before its fence
        // is armed (unless the caller armed one already).
        let ts = self.allocate_waiting(stats, || self.guess_ts()).await?;
        let _deadline = self.arm_at_first_post(stats);
        let w = Tsp::new(ts, Flag::Guessed);
        let mut progress = WriteProgress::default();
        // Records carry the write without its flag: the same bytes serve as the
        // out-of-place buffer and, once verified, as the in-place copy.
        let record = self.shared_record(w, reg, payload);
        // Before the slot tracking: its cache miss overlaps the hinted ones.
        self.hint_guessed_write(reg, w, record.len() as u64);
        progress.first_round_hinted = true;
        self.track(reg, ts);
        let m = self
            .write_round(reg, cache, stats, w, &record, &mut progress, true)
            .await?;
        if m <= w {
            // `w` is on a majority: this writer's earlier writes here are superseded.
            let now = self.settle(reg, stats, w)?;
            self.mark_verified(reg, cache, stats, w, record, now);
            return Ok(WriteOutcome::Written);
        }
        // The guess may have been stale. The slow path's future (strong read, lock,
        // rewrite) is built on the heap rather than kept in the state of every write.
        Box::pin(self.write_after_stale_guess(reg, cache, stats, payload, w, m, record)).await
    }

    /// The slow path of [`Self::write`] (SWARM §3.2, Algorithm sg-write lines 9–11):
    /// the first round of the guessed write `w`, whose shared record is `record`,
    /// found `m` above it. Re-synchronise, then make sure no reader returns `w`
    /// before writing again with a fresh timestamp.
    #[allow(clippy::too_many_arguments)]
    async fn write_after_stale_guess(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
        w: Tsp,
        m: Tsp,
        record: Payload,
    ) -> Result<WriteOutcome, SwarmError> {
        let ts = w.ts();
        self.observe(m.ts());
        tracing::debug!(
            writer = self.writer.get(),
            guess = ?w,
            seen = ?m,
            "stale timestamp guess: slow path"
        );
        // Lemma C.5 (ii) needs a tuple above `w` on a majority *before* the WRITE lock:
        // a reader that then fails its READ lock on `w` must find something newer on
        // its next majority read, or it would see `w` forever if this writer crashes
        // before rewriting (wait-freedom). The weak read may have seen `m` on one node
        // only, so read the register strongly (`M.READ` writes its maximum back,
        // Lemma A.3); a tombstone carries no value, so write it back directly.
        let above = if cache.holding(reg.replicas.len(), m) >= reg.replicas.quorum() {
            // The weak read itself saw `m` or more on a majority (word values never go
            // down): nothing to do.
            m
        } else if m.is_tombstone() {
            self.inner_write(reg, cache, stats, m, &[], &mut WriteProgress::default())
                .await?;
            m
        } else {
            self.max_read(reg, cache, stats, false).await?.0
        };
        if above.ts() <= w.ts() {
            // What `m` stood for never reached a majority and is gone from the one
            // the strong read saw: `w` is the maximum of a majority now, as on the
            // fast path (every write that completed before this one is at most `w`).
            let now = self.settle(reg, stats, w)?;
            self.mark_verified(reg, cache, stats, w, record, now);
            return Ok(WriteOutcome::Written);
        }
        if !self.trylock(reg, stats, ts, LockMode::Write).await? {
            // A reader locked `w` first and may have returned it: the write took effect.
            // `above` (> `w`) is on a majority: `w`'s buffer is superseded as well.
            self.settle(reg, stats, above)?;
            return Ok(WriteOutcome::Written);
        }
        // No reader will ever return `w` (Lemma C.3). A tombstone above it (now on a
        // majority: the delete took effect) means the register was deleted first and
        // this write never takes effect; otherwise rewrite above everything seen,
        // VERIFIED, as Lemma C.4's second case needs.
        if above.is_tombstone() {
            self.settle(reg, stats, above)?;
            return Ok(WriteOutcome::Deleted);
        }
        let min_ticks = m.max(above).ts().ticks() + 1;
        let fresh = self
            .allocate_waiting(stats, || self.allocate_ts(min_ticks))
            .await?;
        self.track(reg, fresh);
        let v = Tsp::new(fresh, Flag::Verified);
        self.inner_write(reg, cache, stats, v, payload, &mut WriteProgress::default())
            .await?;
        self.settle(reg, stats, v)?;
        self.write_inplace(reg, stats, encode_record_for(v, Some(reg.id), payload));
        Ok(WriteOutcome::Written)
    }

    /// Hints the memory a common-case write of `w` (a record of `record_len` bytes)
    /// touches: what its first round reads and writes on the replicas a quorum step
    /// asks first when no node is suspected ([`Self::round_touches`]), and the
    /// primary's in-place block that `mark_verified` writes after it. Their cache
    /// misses then overlap each other and whatever the caller does before posting.
    /// The round does not hint them again ([`WriteProgress`]'s `first_round_hinted`)
    /// unless a suspected node changes which replicas it asks first.
    fn hint_guessed_write(&self, reg: &RegisterLoc, w: Tsp, record_len: u64) {
        if let Some(buffer) = self.layout.buffer_addr(w.ts()) {
            // One offset on every replica (the common case): one set of ranges for all.
            let same = reg
                .same_offset()
                .map(|at| self.round_touches(at, buffer, record_len, false, true));
            let touches = |p: usize| {
                same.unwrap_or_else(|| {
                    self.round_touches(reg.offset(p), buffer, record_len, false, true)
                })
            };
            self.hint_touches(reg, 0..reg.replicas.quorum(), touches);
        }
        let primary = self.primary(reg);
        self.fabric
            .prefetch(reg.replicas.node(primary), reg.offset(primary), record_len);
    }

    /// Safe-Guess `READ()`.
    pub async fn read(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<ReadValue, SwarmError> {
        let _deadline = self.arm_at_first_post(stats);
        // The common case, with no future built (`Client::read_now_with`).
        let first = match self.read_now_with(reg, cache, stats, <[u8]>::to_vec)? {
            ReadNow::Done(value) => {
                stats.count_iteration();
                return Ok(owned(value));
            }
            ReadNow::Continue(views) => views,
        };
        self.read_rest(reg, cache, stats, first).await
    }

    /// The common case of [`Self::read`] as a plain function, for a caller that runs
    /// several steps per operation and armed its deadline first
    /// ([`OpStats::arm_deadline`], which must stay armed until the read ends): the
    /// read's first majority read on a fabric that completes batches inside `submit`,
    /// and when that settles it (the maximum empty, or VERIFIED with its value in place
    /// and known to be on a majority), the result, with no future built
    /// ([`ReadStart::Done`]). Otherwise [`ReadStart::Pending`], to be finished with
    /// [`Self::read_finish`]: the read goes on from what its first majority read
    /// found, and takes the roundtrips [`Self::read`] takes. With no deadline armed
    /// it posts nothing and returns `Pending` ([`Self::read_finish`] arms one at its
    /// first post, as [`Self::read`] does). The fence is the same as `read`'s: no
    /// post after the deadline, and the answers checked against it after the burst.
    pub fn read_start(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<ReadStart, SwarmError> {
        Ok(
            match self.read_start_with(reg, cache, stats, <[u8]>::to_vec)? {
                ReadStart::Done(value) => ReadStart::Done(owned(value)),
                ReadStart::Pending(pending) => ReadStart::Pending(pending),
            },
        )
    }

    /// [`Self::read_start`] for a caller that consumes the value where it was read:
    /// when the common case settles the read, [`ReadStart::Done`] with what `consume`
    /// made of the payload ([`ReadInPlace::Value`]), or [`ReadInPlace::Empty`]. On
    /// shared memory the primary's in-place block is read into a buffer on the
    /// stack and `consume` reads the payload there, once its record validated (its
    /// length and xxh3 hash) and the fence passed: no read buffer taken from the
    /// fabric, moved or given back, no copy but the caller's. `consume` is not
    /// called when the read is left [`ReadStart::Pending`] ([`Self::read_finish`]
    /// then returns the value as [`ReadValue`]).
    pub fn read_start_with<R>(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<ReadStart<ReadInPlace<R>>, SwarmError> {
        if !stats.is_armed() {
            return Ok(ReadStart::Pending(PendingRead(None)));
        }
        Ok(match self.read_now_with(reg, cache, stats, consume)? {
            ReadNow::Done(value) => {
                stats.count_iteration();
                ReadStart::Done(value)
            }
            ReadNow::Continue(views) => ReadStart::Pending(PendingRead(views)),
        })
    }

    /// Finishes a read [`Self::read_start`] began and left `pending`, with the same
    /// `reg`, `cache` and `stats`.
    pub async fn read_finish(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        pending: PendingRead,
    ) -> Result<ReadValue, SwarmError> {
        let _deadline = self.arm_at_first_post(stats);
        self.read_rest(reg, cache, stats, pending.0).await
    }

    /// [`Self::read`] past its common case: the loop of SWARM §3.2's READ, its first
    /// majority read's views in `first` when it took one.
    async fn read_rest(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        mut first: Option<Box<Views>>,
    ) -> Result<ReadValue, SwarmError> {
        // One entry per writer seen: at most one per concurrent writer.
        let mut seen: Vec<(Tsp, Vec<u8>)> = Vec::new();
        let bound = 2 * u32::from(self.layout.writers()) + 1;
        // This read's own iterations: `stats` sums those of every read of the
        // operation (a KV insert that retries reads its key's register several times),
        // and the bound is per read.
        let mut iteration = 0u32;
        loop {
            stats.count_iteration();
            iteration += 1;
            if iteration > bound {
                tracing::warn!(
                    writer = self.writer.get(),
                    iterations = iteration - 1,
                    bound,
                    "read gave up after the wait-freedom bound (2 x writers + 1 iterations): \
                     more writers than the layout allows, or a protocol bug"
                );
                return Err(SwarmError::ReadBoundExceeded(iteration - 1));
            }
            let (m, value) = self
                .max_read_from(reg, cache, stats, true, first.take())
                .await?;
            // The answers may have been counted across a stop (`super::maxreg`,
            // "Quorums counted across a repair"). The immediate path
            // (`Client::read_now_with`) checks after its burst instead.
            self.confirm(stats)?;
            if m.is_void() {
                return Ok(ReadValue::Empty);
            }
            if m.is_tombstone() {
                return Ok(ReadValue::Deleted);
            }
            if m.flag() == Flag::Verified {
                return Ok(ReadValue::Value(value));
            }
            let writer = m.ts().writer();
            let earlier = seen.iter().position(|(s, _)| s.ts().writer() == writer);
            if let Some(i) = earlier {
                if seen[i].0 == m {
                    // Cold (a guessed write seen twice): the lock's future is built on
                    // the heap rather than kept in the state of every read.
                    if Box::pin(self.trylock(reg, stats, m.ts(), LockMode::Read)).await? {
                        let now = self.confirm(stats)?;
                        self.mark_verified(
                            reg,
                            cache,
                            stats,
                            m,
                            encode_record_for(m, Some(reg.id), &value).into(),
                            now,
                        );
                        return Ok(ReadValue::Value(value));
                    }
                } else {
                    // The writer began a newer write, so the one seen earlier completed.
                    return Ok(ReadValue::Value(core::mem::take(&mut seen[i].1)));
                }
                seen[i] = (m, value);
            } else {
                seen.push((m, value));
            }
        }
    }

    /// [`Self::read`] into the caller's buffer: `value`'s content is replaced by the
    /// payload read (its allocation reused) when the register holds one, and emptied
    /// otherwise. Returns what the read found, with [`ReadValue::Value`]'s payload
    /// left empty (it is in `value`). The common case copies the payload into
    /// `value` where it was read (`Client::read_now_with`); past it, the buffer the
    /// payload was read into goes back to the fabric ([`Fabric::give_back`]). Either
    /// way a steady stream of reads on shared memory allocates nothing once `value`
    /// has the capacity of a payload.
    pub async fn read_into(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        value: &mut Vec<u8>,
    ) -> Result<ReadValue, SwarmError> {
        value.clear();
        let _deadline = self.arm_at_first_post(stats);
        // The common case copies the payload into `value` where it was read.
        let first = match self.read_now_with(reg, cache, stats, |payload| {
            value.extend_from_slice(payload);
        })? {
            ReadNow::Done(read) => {
                stats.count_iteration();
                return Ok(match read {
                    ReadInPlace::Empty => ReadValue::Empty,
                    ReadInPlace::Value(()) => ReadValue::Value(Vec::new()),
                });
            }
            ReadNow::Continue(views) => views,
        };
        Ok(match self.read_rest(reg, cache, stats, first).await? {
            ReadValue::Value(read) => {
                value.extend_from_slice(&read);
                self.fabric.give_back(read);
                ReadValue::Value(Vec::new())
            }
            other => other,
        })
    }

    /// Background `M.WRITE((ts, VERIFIED, v))`: CAS the flag into the replicas known
    /// to hold the guessed tuple, and write the in-place copy (`record`, from
    /// [`encode_record_for`]) on the primary, in the same batch as its CAS: whoever sees
    /// the flag there also finds the in-place copy.
    ///
    /// `now` is a fabric clock reading taken since the operation last waited (a write
    /// passes the one its `settle` just took): the posts below follow it within
    /// microseconds, like the posts of one burst after their fence check
    /// ([`crate::Roundtrip::post`]), which the recycling grace's delivery margin
    /// covers.
    fn mark_verified(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        guessed: Tsp,
        record: Payload,
        now: Nanos,
    ) {
        // One fence check for the burst of background posts below.
        if stats.is_fenced(now) {
            tracing::debug!("operation past its deadline: VERIFIED marks dropped (fenced)");
            return;
        }
        let verified = guessed.with_flag(Flag::Verified);
        let primary = self.primary(reg);
        // One offset on every replica (the common case): one word address for all.
        let same_word = reg
            .same_offset()
            .map(|at| self.layout.meta_word_addr(at, self.writer));
        let mut inplace = Some(record);
        // One batch for every replica, filled, posted and emptied in turn: the fabric
        // borrows it (`Fabric::post_detached`), so no batch is built, moved or
        // dropped per replica.
        let mut batch = Batch::new();
        for p in 0..reg.replicas.len() {
            if p == primary
                && let Some(record) = inplace.take()
            {
                // Cannot fail: the batch is empty.
                let _ = batch.push(Op::Write {
                    addr: reg.offset(p),
                    data: record,
                });
            }
            // Only where the guessed tuple is the known maximum, and only with a CAS
            // that cannot lower the word (see `inout::max_expected`).
            let expected = cache.own_word.get(p);
            if cache.known_max.get(p) == guessed && expected < verified {
                // Cannot fail: the batch holds at most one operation so far.
                let _ = batch.push(Op::Cas {
                    addr: same_word
                        .unwrap_or_else(|| self.layout.meta_word_addr(reg.offset(p), self.writer)),
                    expected: expected.word(),
                    new: verified.word(),
                });
                // A hint for the next CAS only; `known_max` waits for a real answer.
                cache.own_word.set(p, verified);
            }
            if !batch.is_empty() {
                // A transport that keeps the batch takes it (deadline and all).
                batch.set_deadline(stats.deadline());
                self.fabric.post_detached(reg.replicas.node(p), &mut batch);
                batch.clear();
            }
        }
    }
}
