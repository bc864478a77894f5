//! The reliable max register over `n = 2f + 1` In-n-Out replicas (SWARM §2.3,
//! appendix A, Algorithm "wmr").
//!
//! ```text
//! inner_write(v):
//!   for each replica i with cache[i] < v: async { MAX v into i; cache[i] = max(cache[i], v) }
//!   wait until a majority of cache[i] >= v            # 0 RTT if already true
//! READ():
//!   for each replica i: async { r = read i; cache[i] = max(cache[i], r) }
//!   wait for a majority of replies
//!   v = max(replies); inner_write(v); return v       # write-back only if not on a majority
//! ```
//!
//! Implementation notes (§6):
//! * Steps contact the register's *preferred majority* first and the other replicas
//!   only when one of those is slow ([`super::ProtocolConfig::slow_after_ns`]) or
//!   failed; see `Client::quorum_step`.
//! * `READ` returns the maximum of this read's replies rather than of the whole
//!   cache: Lemma A.3 (a majority read after a completed `inner_write(v)` returns
//!   something `>= v`) is all that read-read and write-read monotonicity need, and the
//!   value of a reply is certainly fetchable from the node that sent it.
//! * In-place data lives on the primary only; when it does not match the maximum,
//!   the value comes from the maximum's out-of-place buffer (In-n-Out, §4.3). If the
//!   maximum is VERIFIED, the read also rewrites the primary's in-place copy in the
//!   background: after a failover the new primary has none, and without the repair
//!   every read of a key would cost two roundtrips until its next write. In-place
//!   writes are unlocked and self-validating (tsp and hash), so a repair racing a
//!   newer write can only cost a later read its fast path, never its correctness.
//!
//! Recycled log slots (§4.5, [`super::slot_recycling`]):
//! * A value fetch takes a buffer as `t`'s value only if its record validates and
//!   names `t`. Another record (the slot was recycled) or an invalid one (it is being
//!   rewritten) makes the read read the register again, never return foreign data
//!   and never fail — unless the same maximum's buffer stays unusable for
//!   `SUPERSEDED_RETRIES` (8) reads in a row, which recycling cannot cause (the next
//!   majority read after a supersession returns something above `t`) and which is
//!   then reported as `Corrupted` (but see "Lost copies" below: a re-read leaves out
//!   the replicas whose copy was unusable).
//! * The write-back (`inner_write(t)` writes `t`'s record into `t`'s slot on the
//!   replicas that lack `t`) could clobber a recycled slot's new buffer. With a guard
//!   table in the layout (SWARM-KV's), it cannot, however long the reader stops
//!   between two instructions: a write-back of another writer's record runs under the
//!   reader's write-back guard, and the writer keeps every slot a guard names
//!   ([`super::write_back_guard`] has the argument). Without one (the simulator's
//!   layouts), only the grace protects it: the read that writes `t` back saw `t` as
//!   the maximum of a majority, so it started before `t` was superseded; it posts
//!   nothing after its start plus `max_op_ns` (the fence); and `t`'s writer reuses the
//!   slot only `grace_ns` after it *learned* of the supersession, later than the
//!   read's last post plus the delivery margin, even with the clocks' rates drifting
//!   by up to 1/8, as long as no thread stops between its fence check and its stores.
//!   A stale `TRYLOCK(t)` needs neither (`tslock`).
//! * Wait-freedom, precisely: a read still returns after a bounded number of its own
//!   steps (appendix C, Lemma C.5, plus at most `SUPERSEDED_RETRIES` re-reads per
//!   maximum, each of which only happens when `t` was superseded, i.e. the maximum
//!   grew, or when a copy of `t` was lost, which the next re-read leaves out); in
//!   time, every operation is bounded by its fence: one that would run past
//!   `max_op_ns` (a slow or partitioned client, a majority that answers too slowly)
//!   fails with `SwarmError::Fenced` instead and may be retried. Recycling never makes
//!   a read fail or retry while its fence holds and the grace rules are kept
//!   (`swarm-sim/tests/sim_recycling.rs` asserts that no fetch meets a recycled slot).
//!
//! Lost copies (a replica's copy of its own maximum is unusable):
//! * A replica's buffer of `t` can be overwritten while `t` is still its maximum (a
//!   write landing later than the delivery margin, or memory lost on that node: the
//!   simulator's `Faults::wiped_copies`), at a time when `t` is on no other replica:
//!   its write has reached only that one so far (its batches to the others are slow,
//!   or its writer crashed). Re-reading does not help while `t` is on no other
//!   replica (`t`'s writer writes each replica's buffer once, and no read writes `t`
//!   back before it fetched `t`'s value), and waiting for `t`'s writer is not
//!   wait-free. So after a value fetch met unusable copies, the re-read (which asks
//!   every replica) *leaves out* each replica whose maximum is still the write its
//!   copy was found unusable for, as long as the replies left form a majority, and
//!   takes the maximum of those (`Views::leave_out`).
//! * That is a READ of Algorithm "wmr" (appendix A) all the same. A replica whose
//!   In-n-Out read (§4.3, Algorithm "ino-read") cannot produce its maximum's value is
//!   a replica whose read has not answered, which in an asynchronous system no one
//!   can tell from a slow one; READ waits for *a* majority of replies, any one.
//!   Lemma A.3 holds for the majority left, `Q`: if `inner_write(v)` completed before
//!   the read, the majority holding `v` or more intersects `Q`, so `Q`'s maximum is at
//!   least `v`, and validity and read-read and write-read monotonicity (Theorems A.1,
//!   A.4, A.5) follow as in the paper; Safe-Guess (appendix C) uses `M` through those
//!   properties only. In particular a `t` left out had not completed when the read
//!   began (or a replica of `Q` would hold `t` or more), so the read goes before
//!   `t`'s write; and if `Q`'s maximum is `t`, a replica of `Q` holds `t` and its copy
//!   is fetched. Replies left out still raised the cache: what they reported is on
//!   their node, as with the paper's replies that arrive after READ returned
//!   (`cache[i]` is raised asynchronously).
//! * A replica is left out only for the write whose copy it failed to serve: once
//!   its maximum moves on, its replies count again. If the replies left would not
//!   form a majority (a replica did not answer within the patience), the read takes
//!   the maximum of every reply as before and retries with more patience.
//!
//! Quorums counted across a repair (a stop inside a step):
//! * A step checks the fence once per burst of posts, so a client stopped inside a
//!   burst counts answers from both sides of the stop. If a node that answered
//!   before lost its memory meanwhile and was rebuilt (SWARM-KV's repair), the late
//!   answers may land after the copy read the donors: the "majority" is then the
//!   rebuilt node, which lacks the value, and one donor. The repair's quiescence
//!   wait covers only what an operation observed or stored by its deadline.
//! * So an operation returns from a majority only if a clock reading taken after the
//!   step's last counted answer is within its deadline; otherwise it fails with
//!   `SwarmError::Fenced` (outcome unknown). A write ends with `Client::settle`, whose
//!   reading (the stamp of its superseded slots) makes the check; a read returns
//!   through `Client::confirm`, or, on the immediate path (`Client::read_now_with`), its
//!   one step reads the clock after its burst instead of before it when the
//!   operation's deadline is armed already (every SWARM-KV operation's is:
//!   `roundtrip::Immediate`, "When the fence is checked"), so a common-case get
//!   still reads the clock once. Answers counted before the deadline landed before
//!   the repair's copy began, so the donors hold them and the merge gives them to
//!   the rebuilt node.
//! * Without the check on reads, a read stopped inside its burst across a repair
//!   could count a tuple written VERIFIED in its round (a slow-path rewrite, a fresh
//!   write) by a writer stopped across the same repair, which got `Fenced`, and
//!   return it; later reads of the rebuilt node and a donor would miss it.
//!

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Range;

use crate::clock::Clock;
use crate::encoding::{Flag, Tsp};
use crate::exec::yield_now;
use crate::fabric::{Batch, Completion, Fabric, FabricError, InPlaceReply, Payload};
use crate::layout::{
    SLOT_LOCK_BYTES, decode_record, encode_record_for, encode_record_into, record_len,
};
use crate::roundtrip::{Immediate, OpStats, Roundtrip, WaitOutcome, post_background_for};

use super::inout::{self, MaxOutcome, NodeView};
use super::register::{MAX_REPLICAS, RegisterCache, RegisterLoc};
use super::slot_recycling::OwnRound;
use super::write_back_guard::GuardedWriteBack;
use super::{Client, ReadInPlace, SwarmError};

impl<F: Fabric, C: Clock> Client<F, C> {
    /// `encode_record_for(tsp, Some(reg.id), payload)` in one buffer, which the
    /// batches to every replica (and the in-place copy) share instead of copying it
    /// each. Encoded in place in the shared buffer, which is the client's spare one
    /// when no batch holds it any more (the previous write's batches completed and
    /// were dropped, as on a transport that completes them inside `submit`): then no
    /// allocation at all, otherwise one.
    pub(crate) fn shared_record(&self, tsp: Tsp, reg: &RegisterLoc, payload: &[u8]) -> Payload {
        let len = record_len(payload.len());
        // An exact-size iterator: `collect` allocates the `Arc` once, at its length.
        let fresh = || core::iter::repeat_n(0u8, len).collect::<Arc<[u8]>>();
        let spare = self.spare_record.borrow_mut().take();
        let mut record = spare
            .filter(|spare| spare.len() == len)
            .unwrap_or_else(fresh);
        // Shared: a batch still holds it (in flight), so it must not change.
        if Arc::get_mut(&mut record).is_none() {
            record = fresh();
        }
        let bytes = Arc::get_mut(&mut record).expect("a new or unshared Arc");
        // `encode_record_into` wants it zeroed (the hash covers the hash field as
        // zeros, and the padding).
        bytes.fill(0);
        encode_record_into(tsp, Some(reg.id), payload, bytes);
        *self.spare_record.borrow_mut() = Some(Arc::clone(&record));
        Payload::Shared(record)
    }
}

/// What [`Client::read_now_with`] found.
pub(crate) enum ReadNow<R> {
    /// The read is complete: its result.
    Done(ReadInPlace<R>),
    /// Not the common case: the read goes on from the views of its first majority
    /// read, or from scratch (`None`).
    Continue(Option<Box<Views>>),
}

/// What one majority read found: each answering replica's maximum, by preference
/// position, and the in-place record of the replica read as the primary. Compact on
/// purpose: it lives in the state of every read future, which is moved and dropped on
/// every operation.
#[derive(Debug, Default)]
pub(crate) struct Views {
    max: [Tsp; MAX_REPLICAS],
    /// Bit `p` set: replica `p` answered.
    answered: u16,
    /// The primary's in-place record, if read and valid.
    inplace: Option<(Tsp, Vec<u8>)>,
    /// Whether the primary answered a read of its in-place block (valid or not).
    inplace_read: bool,
}

impl Views {
    fn set(&mut self, p: usize, view: NodeView, with_inplace: bool) {
        self.max[p] = view.max;
        self.answered |= 1 << p;
        if with_inplace {
            self.inplace_read = true;
        }
        if view.inplace.is_some() {
            self.inplace = view.inplace;
        }
    }

    /// The value of write `t`, the maximum of these views, when it needs no
    /// roundtrip: none for an empty register or a tombstone, the primary's in-place
    /// record when it holds `t` (taken out of the views).
    fn value_at_hand(&mut self, t: Tsp) -> Option<Vec<u8>> {
        if t.is_void() || t.is_tombstone() {
            return Some(Vec::new());
        }
        self.inplace
            .take()
            .and_then(|(tsp, payload)| tsp.same_write(t).then_some(payload))
    }

    /// The largest maximum any replica reported.
    pub(crate) fn max(&self) -> Tsp {
        // Over the positions that answered (a majority of a few), not every one.
        let mut max = Tsp::EMPTY;
        let mut answered = self.answered;
        while answered != 0 {
            let p = answered.trailing_zeros() as usize;
            answered &= answered - 1;
            if let Some(&tsp) = self.max.get(p) {
                max = max.max(tsp);
            }
        }
        max
    }

    /// Whether replica `p` answered with `t`'s write as its maximum.
    fn holds(&self, p: usize, t: Tsp) -> bool {
        self.answered & (1 << p) != 0 && self.max[p].same_write(t)
    }

    /// Treats as not answered each replica `p` whose maximum is the write `lost[p]`
    /// (whose copy there was found unusable), if at least `quorum` replies are left;
    /// otherwise leaves the views as they are. See the module docs, "Lost copies".
    fn leave_out(&mut self, lost: &[Tsp; MAX_REPLICAS], quorum: usize) {
        let out = (0..MAX_REPLICAS)
            .filter(|&p| !lost[p].is_empty() && self.holds(p, lost[p]))
            .fold(0u16, |out, p| out | 1 << p);
        let left = self.answered & !out;
        if out != 0 && left.count_ones() as usize >= quorum {
            self.answered = left;
        }
    }
}

/// What a value fetch found.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// The value of the write asked for.
    Value(Vec<u8>),
    /// No holder answered in time: read the register again, with more patience.
    NoAnswer,
    /// The holders answered with a record of another write, or one that fails
    /// validation: the slot was recycled (the write was superseded, see
    /// [`super::slot_recycling`]), is being rewritten, or lost its copy (module
    /// docs, "Lost copies"). Read the register again. Bit `p` of `unusable` is set
    /// for each replica position whose copy was read and unusable.
    Superseded {
        /// The positions of the holders whose copy was unusable.
        unusable: u16,
    },
}

/// Consecutive re-reads that find the same maximum's buffer unusable before a read
/// reports [`SwarmError::Corrupted`]: a recycled buffer belongs to a superseded
/// write, which the next majority read no longer returns as the maximum, so only
/// memory corruption (or recycling that broke its rules) repeats.
const SUPERSEDED_RETRIES: u32 = 8;

/// The largest metadata read (`W` words and the delete word: `W` up to 31) that the
/// immediate majority read takes on the stack ([`crate::Fabric::read_direct`]);
/// larger ones go through a batch.
const DIRECT_META_BYTES: usize = 256;

/// The caller's buffer for the primary's in-place block in
/// [`Client::read_views_now`] (exactly [`crate::Layout::register_bytes`] long),
/// and what the read left there.
pub(crate) struct InPlaceBlock<'b> {
    /// Where the block is read.
    bytes: &'b mut [u8],
    /// The in-place record's write and its payload's range in `bytes`, if it was
    /// read there and validates.
    record: Option<(Tsp, Range<usize>)>,
}

/// Progress of one `inner_write` across its roundtrips.
#[derive(Debug, Default)]
pub(crate) struct WriteProgress {
    buffer_written: [bool; MAX_REPLICAS],
    failed: [bool; MAX_REPLICAS],
    /// A write-back under this client's guard: the batches its rounds leave in
    /// flight are kept for the guard's lower (`super::write_back_guard`), not
    /// forgotten.
    pub(crate) guarded: bool,
    /// The caller hinted the memory of the first round's batches to the preferred
    /// majority (`Client::hint_guessed_write`): that round does not hint it again,
    /// unless a suspected node changes which replicas it asks first.
    pub(crate) first_round_hinted: bool,
}

/// Fails with [`FabricError::NotEnoughLiveNodes`] if fewer than `need` replicas are
/// left to ask (the others failed, or already answered).
pub(crate) fn enough_candidates(candidates: &[usize], need: usize) -> Result<(), SwarmError> {
    if candidates.len() < need {
        return Err(FabricError::NotEnoughLiveNodes {
            needed: need,
            live: candidates.len(),
        }
        .into());
    }
    Ok(())
}

/// What a write round's batch to one replica holds ([`Client::push_round_ops`]).
struct RoundBatch {
    /// Where the register starts on the replica.
    at: u64,
    /// The out-of-place buffer the record goes to; `None` once written there.
    buffer: Option<u64>,
    /// The round reads the metadata words first (SWARM §3.2 line 6).
    read_first: bool,
    /// This writer's metadata word there, as last known (the CAS's expected value
    /// comes from it, `inout::max_expected`).
    own: Tsp,
    /// The register's life, which the delete-word probe expects.
    life: Tsp,
}

/// What a write round's batch to one replica ([`Client::push_round_ops`]) answered:
/// the metadata words it read first (first round only), what the CAS of this
/// writer's metadata word found, and the delete word its last operation probed.
struct RoundAnswer<'a> {
    meta: Option<&'a [u8]>,
    previous: Option<Tsp>,
    delete: Option<Tsp>,
}

impl<'a> RoundAnswer<'a> {
    /// The answer of a first-round batch of `len` operations executed in place
    /// (its one read, the metadata words, first).
    #[inline]
    fn in_place(reply: &'a InPlaceReply<'_>, len: usize) -> Self {
        let last = len.saturating_sub(1);
        Self {
            meta: Some(reply.reads()),
            previous: reply.cas(last.saturating_sub(1)).map(Tsp::from_word),
            delete: reply.cas(last).map(Tsp::from_word),
        }
    }
}

/// The byte ranges `(addr, len)` one batch touches ([`Client::quorum_step_touching`]);
/// a range of length 0 stands for none.
pub(crate) type Touches = [(u64, u64); 2];

/// No range.
const NO_TOUCH: (u64, u64) = (0, 0);

/// No range at all.
pub(crate) const NO_TOUCHES: Touches = [NO_TOUCH; 2];

impl<F: Fabric, C: Clock> Client<F, C> {
    /// One quorum step: posts the batch `build(p, batch)` fills in to the first `k`
    /// of `candidates` (replica positions in preference order) and waits for `k`
    /// replies; if they are slow or fail, counts one more roundtrip and posts to the
    /// remaining candidates too.
    pub(crate) async fn quorum_step<'a>(
        &'a self,
        stats: &'a OpStats,
        reg: &RegisterLoc,
        candidates: &[usize],
        k: usize,
        build: impl FnMut(usize, &mut Batch) -> Result<(), FabricError>,
    ) -> Result<Roundtrip<'a, F>, SwarmError> {
        let mut rt = Roundtrip::start(&self.fabric, stats);
        self.quorum_step_touching(&mut rt, reg, candidates, k, |_| NO_TOUCHES, false, build)
            .await?;
        Ok(rt)
    }

    /// [`Self::quorum_step`] in the roundtrip `rt` (just started, nothing posted),
    /// with memory hints: `touches(p)` are the byte ranges that position `p`'s batch
    /// reads or writes. Before the first burst of posts, every range is hinted to
    /// the fabric ([`Fabric::prefetch`]), so that on local memory the cache misses
    /// of the replicas, and of the places in one, overlap instead of coming one
    /// batch or one operation after the other. With `hinted`, the caller hinted the
    /// first burst's ranges itself (those `touches` gives for the first `k`
    /// candidates): they are not hinted again, and the step goes on as if it had
    /// hinted them (an interleaved operation yields before its posts).
    ///
    /// The caller owns `rt`: a `Roundtrip` is a few hundred bytes (its replies are
    /// kept inline), and returning it from this future would copy it about three
    /// times (out of the future, out of the `Result`, into the caller's state) on
    /// every read and write round.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn quorum_step_touching(
        &self,
        rt: &mut Roundtrip<'_, F>,
        reg: &RegisterLoc,
        candidates: &[usize],
        k: usize,
        touches: impl Fn(usize) -> Touches,
        hinted: bool,
        mut build: impl FnMut(usize, &mut Batch) -> Result<(), FabricError>,
    ) -> Result<(), SwarmError> {
        // Suspected nodes go last, keeping the preference order otherwise (nothing to
        // reorder in the common case: no node suspected at all).
        let reordered: Option<heapless::Vec<usize, MAX_REPLICAS>> =
            self.suspicion.any().then(|| {
                let (trusted, suspected): (
                    heapless::Vec<usize, MAX_REPLICAS>,
                    heapless::Vec<usize, MAX_REPLICAS>,
                ) = candidates
                    .iter()
                    .partition(|&&p| !self.suspects(reg.replicas.node(p)));
                trusted.iter().chain(&suspected).copied().collect()
            });
        let ordered = reordered.as_deref().unwrap_or(candidates);
        let first = k.min(ordered.len());
        let hinted = hinted || self.hint_touches(reg, ordered[..first].iter().copied(), &touches);
        // An interleaved operation lets the others in flight run while its lines
        // arrive (`OpStats::interleaved`).
        if hinted && rt.stats().is_interleaved() {
            yield_now(&self.fabric).await;
        }
        for &p in &ordered[..first] {
            rt.post_with(reg.replicas.node(p), |batch| build(p, batch))?;
        }
        // A fabric that completes batches inside `post` (shared memory) has answered
        // already: look before reading the clock for the fallback deadline.
        if rt.reached(k) {
            self.trust_replies(rt);
            return Ok(());
        }
        // A fallback timer, not a fence: the clock as the posts just read it will do.
        let deadline = self
            .fabric
            .recent_now()
            .saturating_add(self.config.slow_after_ns);
        if rt.wait_until(k, deadline).await == WaitOutcome::Reached {
            self.trust_replies(rt);
            return Ok(());
        }
        // Whoever was asked and did not answer in time is suspected from now on.
        for &p in &ordered[..first] {
            let node = reg.replicas.node(p);
            if !rt.replies().iter().any(|(n, _)| *n == node) {
                self.suspect(node);
            }
        }
        if ordered.len() > first {
            rt.escalate();
            for &p in &ordered[first..] {
                rt.post_with(reg.replicas.node(p), |batch| build(p, batch))?;
            }
        }
        rt.wait(k).await?;
        self.trust_replies(rt);
        Ok(())
    }

    /// Hints the fabric at every byte range `touches` gives for the replicas at
    /// `positions` of `reg`; returns whether there was any.
    pub(crate) fn hint_touches(
        &self,
        reg: &RegisterLoc,
        positions: impl IntoIterator<Item = usize>,
        touches: impl Fn(usize) -> Touches,
    ) -> bool {
        let mut hinted = false;
        for p in positions {
            for (addr, len) in touches(p) {
                if len > 0 {
                    self.fabric.prefetch(reg.replicas.node(p), addr, len);
                    hinted = true;
                }
            }
        }
        hinted
    }

    fn trust_replies(&self, rt: &Roundtrip<'_, F>) {
        // Nothing to trust again while nothing is suspected: the common case.
        if !self.suspicion.any() {
            return;
        }
        for (node, _) in rt.replies() {
            self.trust(*node);
        }
    }

    /// Reads the register's metadata (and the primary's in-place block when
    /// `with_inplace`) from a majority; raises the cache with what it learns.
    pub(crate) async fn read_views(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        with_inplace: bool,
    ) -> Result<Views, SwarmError> {
        let mut views = Views::default();
        self.read_views_from(reg, cache, stats, with_inplace, None, &mut views)
            .await?;
        Ok(views)
    }

    /// [`Self::read_views`], or with `every_replica = Some(patience)`: the metadata
    /// of every replica that answers within `patience` times `slow_after_ns` (and of
    /// a majority in any case), for a read whose maximum's buffer was unusable on
    /// every holder a majority read found. A holder outside that majority may still
    /// have an intact copy: a write lands on a majority `{A, B}`, the read asks
    /// `{B, C}`, and `B`'s copy was overwritten (see [`super::slot_recycling`]: a write that
    /// landed later than the delivery margin); `A`'s copy is the value. A maximum of
    /// more than a majority's replies is a correct read all the same (appendix A).
    ///
    /// The views go into `views` (empty on entry), which the caller keeps: they are
    /// too large to move out of this future and into the caller's on every read.
    async fn read_views_from(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        with_inplace: bool,
        every_replica: Option<u64>,
        views: &mut Views,
    ) -> Result<(), SwarmError> {
        let n = reg.replicas.len();
        let positions = reg.replicas.positions();
        let layout = self.layout;
        let primary = self.primary(reg);
        let build = |p: usize, batch: &mut Batch| {
            batch.push(inout::read_op(
                &layout,
                reg.offset(p),
                with_inplace && p == primary,
            ))?;
            Ok(())
        };
        let touches =
            |p: usize| match inout::read_op(&layout, reg.offset(p), with_inplace && p == primary) {
                crate::fabric::Op::Read { addr, len } => [(addr, u64::from(len)), NO_TOUCH],
                _ => NO_TOUCHES,
            };
        if every_replica.is_none()
            && self.read_views_now(reg, cache, stats, with_inplace, touches, views, None)?
        {
            return Ok(());
        }
        let mut rt = Roundtrip::start(&self.fabric, stats);
        match every_replica {
            None => {
                let q = reg.replicas.quorum();
                self.quorum_step_touching(&mut rt, reg, positions, q, touches, false, build)
                    .await?;
            }
            Some(patience) => {
                for &p in positions {
                    rt.post_with(reg.replicas.node(p), |batch| build(p, batch))?;
                }
                let wait = self.config.slow_after_ns.saturating_mul(patience);
                let deadline = self.fabric.now().saturating_add(wait);
                let _ = rt.wait_until(n, deadline).await;
                rt.wait(reg.replicas.quorum()).await?;
                self.trust_replies(&rt);
            }
        }
        for (node, completion) in rt.replies_mut() {
            let Some(p) = reg.replicas.position(*node) else {
                continue;
            };
            self.fold_view(cache, views, p, with_inplace && p == primary, completion)?;
        }
        Ok(())
    }

    /// Folds replica `p`'s answer to [`inout::read_op`] into `views` and `cache`:
    /// what every majority read does with each reply. Only the in-place block is
    /// taken out of `completion` (it becomes the value); a metadata read's buffer
    /// stays there, for its owner to give back to the fabric.
    #[inline]
    fn fold_view(
        &self,
        cache: &mut RegisterCache,
        views: &mut Views,
        p: usize,
        inplace: bool,
        completion: &mut Completion,
    ) -> Result<(), SwarmError> {
        let view = if inplace {
            inout::parse_read(
                &self.layout,
                completion.take_read(0).unwrap_or_default(),
                true,
            )
        } else {
            inout::parse_meta(completion.read(0).unwrap_or_default())
        };
        self.fold_parsed(cache, views, p, inplace, view)
    }

    /// [`Self::fold_view`] of replica `p`'s answer, parsed.
    #[inline]
    fn fold_parsed(
        &self,
        cache: &mut RegisterCache,
        views: &mut Views,
        p: usize,
        inplace: bool,
        view: NodeView,
    ) -> Result<(), SwarmError> {
        cache.learn_life(view.delete)?;
        cache.learn(p, view.max);
        views.set(p, view, inplace);
        Ok(())
    }

    /// The common case of [`Self::read_views_from`]'s majority read, as one plain
    /// function: on a fabric that executes batches inside [`Fabric::submit`]
    /// ([`Fabric::completes_in_submit`]: shared memory, the in-process fabric), each
    /// replica of the preferred majority is read and its answer folded into `views`
    /// and `cache` at once ([`Self::fold_view`]), with no [`Roundtrip`], no reply
    /// slots and no waiting. It does what the general path does when every answer
    /// is in at its first poll: the same memory hints first, the same fence check
    /// before the burst of posts (the operation posts nothing after its deadline),
    /// the same reads of the same replicas, one roundtrip counted. Where the fabric
    /// reads in place ([`Fabric::read_direct`]: no batch, no reply), a metadata-only
    /// read goes into a buffer on the stack, and the primary's read of its in-place
    /// block into the caller's `block` when given (its record, if it validates,
    /// left there: [`InPlaceBlock`]), else into one the fabric hands out
    /// ([`Fabric::take_buffer`]), which becomes the value in `views`; elsewhere
    /// they go as batches (the in-place record into `views`).
    ///
    /// `Ok(false)`, with nothing counted, `views` empty again and whatever was
    /// learned kept (answers are real observations), when it does not apply: another
    /// fabric, a suspected node (the general path reorders the candidates), an
    /// interleaved operation (it yields after its hints), or a batch that did not
    /// complete inside `submit` (a crashed node: its ticket is forgotten). The
    /// caller then takes the general path, which reads the majority again: a read
    /// changes nothing, so the duplicate costs its time only.
    #[allow(clippy::too_many_arguments)]
    fn read_views_now(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        with_inplace: bool,
        touches: impl Fn(usize) -> Touches,
        views: &mut Views,
        mut block: Option<&mut InPlaceBlock<'_>>,
    ) -> Result<bool, SwarmError> {
        if !self.fabric.completes_in_submit() || self.suspicion.any() || stats.is_interleaved() {
            return Ok(false);
        }
        let primary = self.primary(reg);
        let first = &reg.replicas.positions()[..reg.replicas.quorum()];
        self.hint_touches(reg, first.iter().copied(), touches);
        let mut step = Immediate::start(&self.fabric, stats)?;
        // A metadata read lands here, on the stack, when the fabric reads in place.
        let mut meta = [0u8; DIRECT_META_BYTES];
        let meta_len = self.layout.meta_bytes() as usize;
        for &p in first {
            let inplace = with_inplace && p == primary;
            let node = reg.replicas.node(p);
            // `Some(read)`: the fabric read in place (`Fabric::read_direct`).
            let direct = if inplace && let Some(block) = block.as_deref_mut() {
                // The in-place block and the metadata, into the caller's buffer, where
                // the record stays (`inout::parse_block`).
                match step.read_direct(node, reg.offset(p), block.bytes) {
                    Some(Ok(())) => {
                        let (view, record) = inout::parse_block(&self.layout, block.bytes);
                        block.record = record;
                        self.fold_parsed(cache, views, p, true, view)?;
                        continue;
                    }
                    other => other,
                }
            } else if inplace {
                // The in-place block and the metadata, into a buffer that becomes the
                // value (`inout::parse_read`) or goes back to the fabric.
                let mut bytes = self
                    .fabric
                    .take_buffer(self.layout.register_bytes() as usize);
                match step.read_direct(node, reg.offset(p), &mut bytes) {
                    Some(Ok(())) => {
                        let view = inout::parse_read(&self.layout, bytes, true);
                        self.fold_parsed(cache, views, p, true, view)?;
                        continue;
                    }
                    other => {
                        self.fabric.give_back(bytes);
                        other
                    }
                }
            } else if let Some(bytes) = meta.get_mut(..meta_len) {
                match step.read_direct(node, reg.offset(p) + self.layout.meta_offset(), bytes) {
                    Some(Ok(())) => {
                        self.fold_parsed(cache, views, p, false, inout::parse_meta(bytes))?;
                        continue;
                    }
                    other => other,
                }
            } else {
                None
            };
            if direct.is_some() {
                // Refused or failed at once: the general path reads the majority again.
                *views = Views::default();
                return Ok(false);
            }
            // Not read in place: as a batch.
            let mut batch = Batch::new();
            batch.push(inout::read_op(&self.layout, reg.offset(p), inplace))?;
            let Some(reply) = step.submit(reg.replicas.node(p), &mut batch) else {
                *views = Views::default();
                return Ok(false);
            };
            self.fold_view(cache, views, p, inplace, reply)?;
        }
        step.complete()?;
        Ok(true)
    }

    /// The value of write `t`, the maximum of `views`: from the primary's in-place
    /// block when it holds `t`, otherwise from `t`'s out-of-place buffer on a replica
    /// whose maximum is `t` (one more roundtrip). [`Fetched::NoAnswer`] when no such
    /// replica answered within `patience` times `slow_after_ns` (they may have
    /// crashed since the metadata read): the caller reads a majority again, with more
    /// patience, so that holders that are alive but slower than `slow_after_ns` are
    /// waited for in the end (a read whose every retry had the same deadline would
    /// never return).
    ///
    /// A buffer is only ever taken as `t`'s value if its record validates and names
    /// `t`. Any other record means the slot was recycled after `t` was superseded
    /// (or is being rewritten, or that copy was lost): [`Fetched::Superseded`], never
    /// foreign data and never an error; the caller reads the register again, and a
    /// majority read after the supersession returns something above `t` (see
    /// [`super::slot_recycling`]), or one that leaves out the lost copies does
    /// (module docs, "Lost copies").
    ///
    /// Only for a `t` whose value is not at hand: the common cases, which need no
    /// roundtrip, are [`Views::value_at_hand`], which the caller tries first (taking
    /// the in-place record out of `views`), and only then builds this future, on the
    /// heap (its state, a roundtrip of its own, would otherwise be part of every
    /// read's).
    pub(crate) async fn fetch_value(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        views: &mut Views,
        t: Tsp,
        patience: u64,
    ) -> Result<Fetched, SwarmError> {
        debug_assert!(
            !t.is_void() && !t.is_tombstone(),
            "an empty register or a tombstone has its value at hand"
        );
        let corrupted = SwarmError::Corrupted {
            node: reg.replicas.node(0),
            tsp: t,
        };
        let buffer = self.layout.buffer_addr(t.ts()).ok_or(corrupted)?;
        let holders: heapless::Vec<usize, MAX_REPLICAS> = (0..reg.replicas.len())
            .filter(|&p| views.holds(p, t))
            .collect();
        // Ask the first holder; on a timeout, or if its copy is not `t`'s, all of them
        // (one holder's copy may have been overwritten while another's is intact:
        // any copy that validates and names `t` is `t`'s value); if none answers in
        // time (they crashed since the metadata read), give up and let the caller
        // re-read.
        // The positions of the holders whose copy was read and unusable.
        let mut unusable = 0u16;
        let mut rt = Roundtrip::start(&self.fabric, stats);
        let mut asked = 0;
        let mut answered = false;
        for upto in [1, holders.len()] {
            if upto <= asked {
                break;
            }
            if asked > 0 {
                rt.escalate();
            }
            for &p in &holders[asked..upto] {
                let mut batch = Batch::new();
                batch.push(inout::buffer_read_op(&self.layout, buffer))?;
                rt.post(reg.replicas.node(p), batch)?;
            }
            asked = upto;
            let wait = self.config.slow_after_ns.saturating_mul(patience);
            let deadline = self.fabric.now().saturating_add(wait);
            let want = if upto == 1 { 1 } else { holders.len() };
            let _ = rt.wait_until(want, deadline).await;
            for (node, completion) in rt.replies_mut() {
                answered = true;
                let Some(mut bytes) = completion.take_read(0) else {
                    continue;
                };
                let record = decode_record(&mut bytes, self.layout.payload_max());
                if !record.as_ref().is_some_and(|r| r.tsp.same_write(t)) {
                    if let Some(p) = reg.replicas.position(*node) {
                        unusable |= 1 << p;
                    }
                    // What the slot held instead: an older write of the same writer
                    // points at a late write into a recycled slot, nothing at all at
                    // a torn or never-written buffer.
                    tracing::debug!(
                        writer = self.writer.get(),
                        tsp = ?t,
                        %node,
                        found = ?record.as_ref().map(|r| r.tsp),
                        "a holder's buffer does not hold the maximum's write"
                    );
                }
                if let Some(record) = record
                    && record.tsp.same_write(t)
                {
                    // The primary answered without `t` in place although `t` is
                    // verified: its in-place write was lost, or the primary changed
                    // because a node is suspected (§6). Repair it so later reads take
                    // one roundtrip again.
                    if views.inplace_read && t.flag() == Flag::Verified {
                        self.write_inplace(
                            reg,
                            stats,
                            encode_record_for(t, Some(reg.id), record.payload),
                        );
                    }
                    return Ok(Fetched::Value(record.payload.to_vec()));
                }
            }
        }
        if answered {
            tracing::debug!(
                writer = self.writer.get(),
                tsp = ?t,
                "the buffer of the maximum holds another write (recycled slot): \
                 reading the register again"
            );
            Ok(Fetched::Superseded { unusable })
        } else {
            Ok(Fetched::NoAnswer)
        }
    }

    /// Background in-place write of `record` (from [`encode_record_for`]) on the primary
    /// (lazy and unlocked, §4.3 line 7; readers check its tsp and hash); dropped if
    /// the operation of `stats` is past its deadline.
    pub(crate) fn write_inplace(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        record: impl Into<Payload>,
    ) {
        let primary = self.primary(reg);
        post_background_for(
            &self.fabric,
            stats,
            reg.replicas.node(primary),
            Batch::write(reg.offset(primary), record),
        );
    }

    /// `M.READ()`: the maximum tuple on a majority and its value, written back to a
    /// majority first if it is not known to be on one (appendix A).
    pub async fn max_read(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        with_inplace: bool,
    ) -> Result<(Tsp, Vec<u8>), SwarmError> {
        self.max_read_from(reg, cache, stats, with_inplace, None)
            .await
    }

    /// The common case of a Safe-Guess read (`Client::read`), as one plain function
    /// that builds no future: the majority read of [`Self::read_views_now`], and
    /// when its maximum is empty, or VERIFIED with its value in place and known to
    /// be on a majority (no write-back), the read's result: what `consume` makes of
    /// the value's payload. Where the fabric reads in place, the primary's block is
    /// read into the client's read buffer (`super::read_block`) and `consume` reads
    /// the payload there (validated first: its length and xxh3 hash,
    /// `inout::parse_block`): no read buffer zeroed, taken, moved or given back.
    /// `consume` runs only once the read counts (the fence passed after the burst,
    /// as in [`Self::read_views_now`]).
    ///
    /// Otherwise the read goes on from the views it took ([`ReadNow::Continue`]: the
    /// first majority read of [`Self::max_read_from`], the in-place record copied
    /// into them), so that it takes the roundtrips the general path takes; or from
    /// scratch where the majority read does not apply. `consume` is then not called.
    pub(crate) fn read_now_with<R>(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<ReadNow<R>, SwarmError> {
        let layout = self.layout;
        let primary = self.primary(reg);
        let touches = |p: usize| match inout::read_op(&layout, reg.offset(p), p == primary) {
            crate::fabric::Op::Read { addr, len } => [(addr, u64::from(len)), NO_TOUCH],
            _ => NO_TOUCHES,
        };
        let mut views = Views::default();
        let mut buffer = self.read_blocks.take();
        let mut block = InPlaceBlock {
            bytes: &mut buffer[..layout.register_bytes() as usize],
            record: None,
        };
        if !self.read_views_now(
            reg,
            cache,
            stats,
            true,
            touches,
            &mut views,
            Some(&mut block),
        )? {
            return Ok(ReadNow::Continue(None));
        }
        let t = views.max();
        if t.is_void() {
            return Ok(ReadNow::Done(ReadInPlace::Empty));
        }
        let record = block.record.clone();
        if t.flag() == Flag::Verified && !t.is_tombstone() && Self::on_a_majority(reg, cache, t) {
            match record.clone() {
                // Read into the client's buffer: the payload where it lies.
                Some((write, payload)) if write.same_write(t) => {
                    return Ok(ReadNow::Done(ReadInPlace::Value(consume(
                        &block.bytes[payload],
                    ))));
                }
                // Read as a batch: the payload in `views`.
                None => {
                    if let Some(value) = views.value_at_hand(t) {
                        let consumed = consume(&value);
                        self.fabric.give_back(value);
                        return Ok(ReadNow::Done(ReadInPlace::Value(consumed)));
                    }
                }
                _ => {}
            }
        }
        // Cold: the in-place record copied into the views, boxed so that the read's
        // future does not carry them.
        if let Some((write, payload)) = record {
            views.inplace = Some((write, block.bytes[payload].to_vec()));
        }
        Ok(ReadNow::Continue(Some(Box::new(views))))
    }

    /// [`Self::max_read`], its first majority read already taken when `first` is
    /// given ([`Self::read_now_with`]).
    pub(crate) async fn max_read_from(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        with_inplace: bool,
        mut first: Option<Box<Views>>,
    ) -> Result<(Tsp, Vec<u8>), SwarmError> {
        // Doubles on every retry, without a cap: a holder that is alive is waited for
        // long enough in the end, however slow its link (wait-freedom).
        let mut patience = 1;
        // Re-reads in a row that found the same maximum's buffer unusable.
        let mut unusable: (Tsp, u32) = (Tsp::EMPTY, 0);
        // By replica position, the write whose copy there was found unusable (see
        // "Lost copies" in the module docs). Cold: allocated on the first such copy.
        let mut lost: Option<Box<[Tsp; MAX_REPLICAS]>> = None;
        'read: loop {
            let (t, value) = loop {
                // After a maximum's buffer was unusable on every holder that answered,
                // ask every replica: another holder may have an intact copy.
                let every_replica = (unusable.1 > 0).then_some(patience);
                let mut views = Views::default();
                match first.take() {
                    Some(first) => views = *first,
                    None => {
                        self.read_views_from(
                            reg,
                            cache,
                            stats,
                            with_inplace,
                            every_replica,
                            &mut views,
                        )
                        .await?
                    }
                }
                if let Some(lost) = &lost {
                    views.leave_out(lost, reg.replicas.quorum());
                }
                let t = views.max();
                let fetched = match views.value_at_hand(t) {
                    Some(value) => Fetched::Value(value),
                    // Cold: on the heap, out of every read's future (see `fetch_value`).
                    None => Box::pin(self.fetch_value(reg, stats, &mut views, t, patience)).await?,
                };
                match fetched {
                    Fetched::Value(value) => break (t, value),
                    Fetched::Superseded {
                        unusable: positions,
                    } => {
                        stats.count_recycled_fetch();
                        let lost = lost.get_or_insert_with(|| Box::new([Tsp::EMPTY; MAX_REPLICAS]));
                        for (p, write) in lost.iter_mut().enumerate() {
                            if positions & (1 << p) != 0 {
                                *write = t;
                            }
                        }
                        unusable = if unusable.0 == t {
                            (t, unusable.1 + 1)
                        } else {
                            (t, 1)
                        };
                        if unusable.1 >= SUPERSEDED_RETRIES {
                            return Err(SwarmError::Corrupted {
                                node: reg.replicas.node(0),
                                tsp: t,
                            });
                        }
                        // The next read asks every replica: wait longer for each in turn,
                        // so that an intact holder that is slow, or that this client
                        // suspects, is heard before the retries run out.
                        patience = patience.saturating_mul(2);
                        continue;
                    }
                    Fetched::NoAnswer => {}
                }
                patience = patience.saturating_mul(2);
                tracing::debug!(
                    writer = self.writer.get(),
                    tsp = ?t,
                    patience,
                    "no replica holding the maximum answered a value fetch in time: \
                     reading the register again, waiting longer"
                );
            };
            // The common case, checked here rather than in `inner_write` alone: a majority
            // already holds `t`. Otherwise the write-back's future, a write round's, is
            // built on the heap rather than kept in the state of every read.
            // A reset's marker needs none: a reset reaches every replica before the
            // register's next life begins.
            // Another writer's record goes back into that writer's log under this
            // client's write-back guard (`super::write_back_guard`); given up, and the
            // register read again, if `t` was superseded meanwhile.
            if !t.is_void() && !Self::on_a_majority(reg, cache, t) {
                match self.write_back_guard(t) {
                    Some(guard) => {
                        let guarded = self.guarded_write_back(reg, cache, stats, t, &value, guard);
                        if Box::pin(guarded).await? == GuardedWriteBack::Superseded {
                            continue 'read;
                        }
                    }
                    None => {
                        Box::pin(self.inner_write(
                            reg,
                            cache,
                            stats,
                            t,
                            &value,
                            &mut WriteProgress::default(),
                        ))
                        .await?;
                    }
                }
                // The write-back's majority may have been counted across a stop
                // (module docs, "Quorums counted across a repair").
                self.confirm(stats)?;
            }
            return Ok((t, value));
        }
    }

    /// `M.READ_weak()`: the maximum tuple on a majority, without fetching its value or
    /// writing it back (enough to pick a fresh timestamp, appendix A.2).
    pub async fn max_read_weak(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<Tsp, SwarmError> {
        let views = self.read_views(reg, cache, stats, false).await?;
        Ok(views.max())
    }

    /// The byte ranges a write round's batch to one replica, where the register
    /// starts at `addr`, touches: the out-of-place buffer at `buffer` that a record of `record_len` bytes goes to
    /// (unless `buffer_written` there already), and the metadata words: every one
    /// of them in a round that reads them first, this writer's otherwise.
    pub(crate) fn round_touches(
        &self,
        addr: u64,
        buffer: u64,
        record_len: u64,
        buffer_written: bool,
        read_first: bool,
    ) -> Touches {
        let layout = &self.layout;
        let buffer = if buffer_written {
            NO_TOUCH
        } else {
            (buffer + u64::from(SLOT_LOCK_BYTES), record_len)
        };
        let meta = if read_first {
            (addr + layout.meta_offset(), layout.meta_bytes())
        } else {
            (layout.meta_word_addr(addr, self.writer), 8)
        };
        [buffer, meta]
    }

    /// Whether a majority of `reg`'s replicas is known to hold `tsp` (a write, not a
    /// tombstone: those live in the delete word, which the cache does not follow) or
    /// more: then `inner_write(tsp)` has nothing to do.
    fn on_a_majority(reg: &RegisterLoc, cache: &RegisterCache, tsp: Tsp) -> bool {
        !tsp.is_tombstone() && cache.holding(reg.replicas.len(), tsp) >= reg.replicas.quorum()
    }

    /// `inner_write(tsp)`: MAX `tsp` (with `payload` in its out-of-place buffer) into
    /// replicas until a majority is known to hold `tsp` or more.
    pub(crate) async fn inner_write(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        tsp: Tsp,
        payload: &[u8],
        progress: &mut WriteProgress,
    ) -> Result<(), SwarmError> {
        if tsp.is_tombstone() {
            // Tombstones go to the write-once delete word, never to a metadata word
            // (`super::delete`); their records carry no value and need no buffer.
            return self.tombstone_round(reg, cache, stats, tsp, None).await;
        }
        // The common case of a read's write-back: a majority already holds `tsp`.
        // Return before hashing the slot address and encoding the record.
        if Self::on_a_majority(reg, cache, tsp) {
            return Ok(());
        }
        let record = self.shared_record(tsp, reg, payload);
        self.write_round(reg, cache, stats, tsp, &record, progress, false)
            .await?;
        Ok(())
    }

    /// Runs `inner_write` rounds until a majority holds `tsp`, whose encoded record
    /// (`encode_record_for(tsp, Some(reg.id), payload)`) is `record`. With `read_first`, the
    /// first round also reads the metadata words *before* writing (one pipelined batch
    /// per node, SWARM §3.2 line 6) and contacts a majority even if the cache says it
    /// is not needed; the maximum of those reads is returned (`Tsp::EMPTY` otherwise).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_round(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        tsp: Tsp,
        record: &Payload,
        progress: &mut WriteProgress,
        read_first: bool,
    ) -> Result<Tsp, SwarmError> {
        debug_assert!(
            !tsp.is_tombstone(),
            "tombstones go to the delete word (inner_write, super::delete)"
        );
        let n = reg.replicas.len();
        let q = reg.replicas.quorum();
        let layout = self.layout;
        let buffer = layout.buffer_addr(tsp.ts()).ok_or(SwarmError::Slot(
            crate::layout::SlotError::NoLog(tsp.ts().writer()),
        ))?;
        let writer = self.writer;
        // Stores into this writer's own slot: the slot stays out of use until every
        // batch of these rounds is done (`OwnBatches`; a guarded write-back waits
        // for its batches under its guard instead). Nothing to keep on a fabric
        // that runs each batch inside its post (shared memory).
        let own_round = (!progress.guarded
            && tsp.ts().writer() == writer
            && !self.fabric.completes_in_submit())
        .then(|| OwnRound::new(&self.own_batches, tsp.ts()));
        let mut read_max = Tsp::EMPTY;
        let mut first = read_first;
        // The replicas whose first-round batch the immediate path folded in already.
        let mut answered = [false; MAX_REPLICAS];
        if first && own_round.is_none() {
            let done = self.write_round_now(
                reg,
                cache,
                stats,
                tsp,
                buffer,
                record,
                progress,
                &mut read_max,
                &mut answered,
            )?;
            // The whole first round (its reads from a majority) ran there.
            first = done < q;
        }
        loop {
            let have = if first {
                answered.iter().filter(|&&a| a).count()
            } else {
                cache.holding(n, tsp)
            };
            if have >= q {
                return Ok(read_max);
            }
            let candidates: heapless::Vec<usize, MAX_REPLICAS> = (0..n)
                .filter(|&p| {
                    !progress.failed[p]
                        && if first {
                            !answered[p]
                        } else {
                            cache.known_max.get(p) < tsp
                        }
                })
                .collect();
            let need = q - have;
            enough_candidates(&candidates, need)?;
            let mut rt = Roundtrip::start(&self.fabric, stats);
            if progress.guarded {
                rt.keep_outstanding_in(&self.guard_tickets);
            } else if let Some(round) = &own_round {
                rt.keep_outstanding_in(&round.tickets);
            }
            {
                let own = cache.own_word.clone();
                let life = cache.untombstoned();
                let written = progress.buffer_written;
                let record_len = record.len() as u64;
                let touches = |p: usize| {
                    self.round_touches(reg.offset(p), buffer, record_len, written[p], first)
                };
                // The preferred majority in preference order, as the caller hinted it.
                let hinted = first && progress.first_round_hinted && !self.suspicion.any();
                let rt = &mut rt;
                self.quorum_step_touching(
                    rt,
                    reg,
                    &candidates,
                    need,
                    touches,
                    hinted,
                    |p, batch| {
                        let round = RoundBatch {
                            at: reg.offset(p),
                            buffer: (!written[p]).then_some(buffer),
                            read_first: first,
                            own: own.get(p),
                            life,
                        };
                        self.push_round_ops(batch, &round, record, tsp)
                    },
                )
                .await?;
            }
            for (node, error) in rt.failures() {
                let _ = error;
                if let Some(p) = reg.replicas.position(*node) {
                    progress.failed[p] = true;
                }
            }
            for (node, completion) in rt.replies_mut() {
                let Some(p) = reg.replicas.position(*node) else {
                    continue;
                };
                Self::fold_round_reply(cache, progress, p, completion, first, tsp, &mut read_max)?;
            }
            first = false;
        }
    }

    /// The first round of [`Self::write_round`] (the one that reads the metadata
    /// words before writing) on a fabric that completes batches inside `submit`
    /// (shared memory), with no [`Roundtrip`]: the same batch to each replica of the
    /// preferred majority, each reply folded in as it comes back
    /// ([`Self::fold_round_reply`]), the same fence (checked once before the burst,
    /// since the batches store: [`Immediate::start_storing`]) and one roundtrip
    /// counted. Returns how many replicas answered; each is marked in `answered`.
    /// Fewer than a majority (a batch that did not complete inside its post: a
    /// crashed node) leaves the rest of the round to the general path, which asks
    /// the replicas not marked; nothing is posted twice but to a fabric that said
    /// it completes batches inside `submit` and did not ([`Fabric::completes_in_submit`]).
    /// Returns 0 at once where the general path is needed from the start: another
    /// fabric, a suspected node (the preference order changes), an interleaved
    /// operation (it yields before its posts), a guarded write-back (its tickets are
    /// kept for the guard's lower).
    #[allow(clippy::too_many_arguments)]
    fn write_round_now(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        tsp: Tsp,
        buffer: u64,
        record: &Payload,
        progress: &mut WriteProgress,
        read_max: &mut Tsp,
        answered: &mut [bool; MAX_REPLICAS],
    ) -> Result<usize, SwarmError> {
        if !self.fabric.completes_in_submit()
            || self.suspicion.any()
            || stats.is_interleaved()
            || progress.guarded
        {
            return Ok(0);
        }
        let first = &reg.replicas.positions()[..reg.replicas.quorum()];
        if !progress.first_round_hinted {
            let touches = |p: usize| {
                self.round_touches(reg.offset(p), buffer, record.len() as u64, false, true)
            };
            self.hint_touches(reg, first.iter().copied(), touches);
        }
        let mut step = Immediate::start_storing(&self.fabric, stats)?;
        let life = cache.untombstoned();
        // The metadata words land here, on the stack, when the fabric executes the
        // batch in place ([`Fabric::submit_in_place`]).
        let mut meta = [0u8; DIRECT_META_BYTES];
        let mut done = 0;
        for &p in first {
            let round = RoundBatch {
                at: reg.offset(p),
                buffer: Some(buffer),
                read_first: true,
                own: cache.own_word.get(p),
                life,
            };
            let mut batch = Batch::new();
            self.push_round_ops(&mut batch, &round, record, tsp)?;
            let node = reg.replicas.node(p);
            let mut reply = InPlaceReply::new(&mut meta);
            match step.submit_in_place(node, &mut batch, &mut reply) {
                Some(Ok(())) => {
                    let answer = RoundAnswer::in_place(&reply, batch.len());
                    Self::fold_round_answer(cache, progress, p, answer, tsp, read_max)?;
                }
                // Failed at once, as `submit` would have: the general path asks the
                // replicas not marked.
                Some(Err(_)) => return Ok(done),
                // Not executed: as a batch with a completion.
                None => {
                    let Some(reply) = step.submit(node, &mut batch) else {
                        return Ok(done);
                    };
                    Self::fold_round_reply(cache, progress, p, reply, true, tsp, read_max)?;
                }
            }
            answered[p] = true;
            done += 1;
        }
        step.complete()?;
        Ok(done)
    }

    /// Fills `batch` with a write round's operations for one replica (`round`), to
    /// MAX `tsp`, whose record is `record`, into it: the metadata words read (first
    /// round only), the record written into its out-of-place buffer (unless there
    /// already), the CAS of this writer's metadata word, and the delete-word probe.
    #[inline(always)]
    fn push_round_ops(
        &self,
        batch: &mut Batch,
        round: &RoundBatch,
        record: &Payload,
        tsp: Tsp,
    ) -> Result<(), FabricError> {
        let layout = &self.layout;
        if round.read_first {
            batch.push(inout::read_op(layout, round.at, false))?;
        }
        if let Some(buffer) = round.buffer {
            batch.push(inout::buffer_write_op(buffer, record.clone()))?;
        }
        let expected = inout::max_expected(round.own, tsp);
        inout::push_max(batch, layout, round.at, self.writer, expected, tsp)?;
        // The delete word after the CAS: if the CAS found a word of a later life,
        // this probe shows that life's marker or tombstone (batch order), and no
        // further round acts on that word.
        batch.push(inout::delete_word_probe_op(layout, round.at, round.life))?;
        Ok(())
    }

    /// Folds replica `p`'s reply to a write round's batch (`first`: the round that
    /// read its metadata words first, whose maximum joins `read_max`) into `cache`
    /// and `progress`: what the metadata read, the CAS and the delete-word probe
    /// found.
    fn fold_round_reply(
        cache: &mut RegisterCache,
        progress: &mut WriteProgress,
        p: usize,
        completion: &Completion,
        first: bool,
        tsp: Tsp,
        read_max: &mut Tsp,
    ) -> Result<(), SwarmError> {
        let last = completion.outputs().len().saturating_sub(1);
        let answer = RoundAnswer {
            meta: first.then(|| completion.read(0).unwrap_or_default()),
            previous: inout::cas_result(completion, last.saturating_sub(1)),
            delete: inout::cas_result(completion, last),
        };
        Self::fold_round_answer(cache, progress, p, answer, tsp, read_max)
    }

    /// [`Self::fold_round_reply`] of an answer, wherever its batch's results landed.
    #[inline]
    fn fold_round_answer(
        cache: &mut RegisterCache,
        progress: &mut WriteProgress,
        p: usize,
        answer: RoundAnswer<'_>,
        tsp: Tsp,
        read_max: &mut Tsp,
    ) -> Result<(), SwarmError> {
        if let Some(meta) = answer.meta {
            cache.learn_life(inout::delete_word(meta))?;
            let seen = inout::max_word(meta);
            *read_max = (*read_max).max(seen);
            cache.learn(p, seen);
        }
        progress.buffer_written[p] = true;
        if let Some(delete) = answer.delete {
            cache.learn_life(delete)?;
        }
        let Some(previous) = answer.previous else {
            return Ok(());
        };
        cache.check_marker(previous)?;
        let expected = inout::max_expected(cache.own_word.get(p), tsp);
        match inout::max_outcome(expected, tsp, previous) {
            MaxOutcome::Done(now) => {
                cache.own_word.set(p, now);
                cache.learn(p, now);
            }
            MaxOutcome::Retry(found) => {
                cache.own_word.set(p, found);
                cache.learn(p, found);
            }
        }
        Ok(())
    }
}
