//! A protocol client: one per client thread.

use alloc::vec::Vec;
use core::cell::RefCell;

use crate::clock::Clock;
use crate::encoding::{Timestamp, WriterId};
use crate::fabric::{Fabric, FabricError, Nanos, NodeId};
use alloc::boxed::Box;
use alloc::sync::Arc;

use super::Suspicion;

use super::RegisterLoc;
use crate::layout::{Layout, SlotAllocator, SlotError};

use super::SwarmError;
use super::carried::CarriedSlots;
use super::guess::TimestampGuesser;
use super::read_block::ReadBlocks;
use super::slot_recycling::{OwnBatches, ReleaseTiming, SlotCounters, SlotTracker};
use super::summary::LogSummary;
use crate::encoding::Tsp;
use crate::roundtrip::OpStats;

/// Tunables of the protocol.
///
/// Start from [`ProtocolConfig::default`] and change what you need, so that a
/// tunable added later does not break your code:
///
/// ```
/// use swarm_core::ProtocolConfig;
///
/// let config = ProtocolConfig::default().with_slow_after_ns(10_000);
/// assert_eq!(config.slow_after_ns, 10_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProtocolConfig {
    /// How long to wait for the preferred majority before also contacting the other
    /// replicas (SWARM §6), on the fabric's clock.
    pub slow_after_ns: Nanos,
    /// How long a node that missed a deadline stays *suspected*: it is tried last
    /// instead of first, so one dead node does not cost every operation a timeout.
    pub suspect_ns: Nanos,
    /// The operation deadline (*fence*, see [`super::slot_recycling`]): an operation posts
    /// no batch after its start plus this, on the fabric's clock, and fails with
    /// [`SwarmError::Fenced`] instead. Log slots are recycled a grace of about this
    /// long after they were superseded. 1 s by default.
    pub max_op_ns: Nanos,
    /// How long a batch posted before its operation's deadline may take to take
    /// effect on a memory node; part of the recycling grace
    /// ([`super::slot_recycling::grace_with_margin_ns`]). 10 ms by default.
    pub delivery_margin_ns: Nanos,
    /// Least time between two background slot-recycling checks
    /// ([`Client::recycle_slots_tick`]). 1 ms by default.
    pub slot_recycling_interval_ns: Nanos,
    /// The nodes that hold the writers' table words (tick ceilings, write-back
    /// guards): nodes `0..table_nodes`, or every node when 0 (the default). A store
    /// whose cluster has more nodes than one roundtrip reaches keeps them on a
    /// group of at most [`crate::MAX_NODES`] (SWARM-KV's metadata group).
    pub table_nodes: usize,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        Self {
            slow_after_ns: 50_000,
            suspect_ns: 100_000_000,
            max_op_ns: 1_000_000_000,
            delivery_margin_ns: super::slot_recycling::DEFAULT_DELIVERY_MARGIN_NS,
            slot_recycling_interval_ns: 1_000_000,
            table_nodes: 0,
        }
    }
}

impl ProtocolConfig {
    /// This configuration with [`Self::slow_after_ns`] set.
    #[must_use]
    pub const fn with_slow_after_ns(mut self, ns: Nanos) -> Self {
        self.slow_after_ns = ns;
        self
    }

    /// This configuration with [`Self::suspect_ns`] set.
    #[must_use]
    pub const fn with_suspect_ns(mut self, ns: Nanos) -> Self {
        self.suspect_ns = ns;
        self
    }

    /// This configuration with [`Self::max_op_ns`] set.
    #[must_use]
    pub const fn with_max_op_ns(mut self, ns: Nanos) -> Self {
        self.max_op_ns = ns;
        self
    }

    /// This configuration with [`Self::delivery_margin_ns`] set.
    #[must_use]
    pub const fn with_delivery_margin_ns(mut self, ns: Nanos) -> Self {
        self.delivery_margin_ns = ns;
        self
    }

    /// This configuration with [`Self::slot_recycling_interval_ns`] set.
    #[must_use]
    pub const fn with_slot_recycling_interval_ns(mut self, ns: Nanos) -> Self {
        self.slot_recycling_interval_ns = ns;
        self
    }

    /// This configuration with [`Self::table_nodes`] set.
    #[must_use]
    pub const fn with_table_nodes(mut self, nodes: usize) -> Self {
        self.table_nodes = nodes;
        self
    }

    /// The nodes holding the writers' table words ([`Self::table_nodes`]) in a
    /// cluster of `nodes` nodes.
    pub const fn table_nodes_of(&self, nodes: usize) -> usize {
        if self.table_nodes == 0 || self.table_nodes > nodes {
            nodes
        } else {
            self.table_nodes
        }
    }

    /// The grace after which a superseded log slot is reused
    /// ([`super::slot_recycling::grace_with_margin_ns`] of `max_op_ns` and the margin).
    pub const fn grace_ns(&self) -> Nanos {
        super::slot_recycling::grace_with_margin_ns(self.max_op_ns, self.delivery_margin_ns)
    }
}

/// Writer-local state: which log slots are in use, the timestamp guesser, and what
/// the writer knows of its slots' supersession ([`super::slot_recycling`]).
#[derive(Debug)]
pub(crate) struct WriterState {
    pub(crate) slots: SlotAllocator,
    pub(crate) guesser: TimestampGuesser,
    pub(crate) tracker: SlotTracker,
    /// Slots carried over from an earlier incarnation's summary, examined lazily.
    pub(crate) carried: CarriedSlots,
    /// Maps a register identity read from a carried slot's record to its location
    /// (given with the summary, [`Client::resume_summary`]).
    pub(crate) locate: Option<Locator>,
    /// The tick ceiling this writer persists, if its store keeps one
    /// ([`Client::set_tick_ceiling`]).
    pub(crate) ceiling: Option<Ceiling>,
}

/// A tick ceiling persisted in memory: a word at `addr` on every node, which this
/// writer raises on a majority (never lowering it on any node) before it uses a
/// timestamp above it (see [`super::resume`], "Crash resume").
#[derive(Debug)]
pub(crate) struct Ceiling {
    addr: u64,
    /// Ticks persisted beyond the timestamp that needs a raise.
    headroom: u64,
    /// A value a majority of nodes holds (or held: the word only goes up).
    persisted: u64,
    /// What each node is believed to hold, by node index: the CAS expectations.
    known: Vec<u64>,
    /// A raise is in flight (by another operation of this client).
    raising: bool,
}

/// Maps a register identity read from a log record's owner tag (untrusted) to its
/// location ([`RegisterLoc::id`]).
pub(crate) struct Locator(alloc::boxed::Box<dyn Fn(u64) -> Option<RegisterLoc> + Send>);

impl core::fmt::Debug for Locator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Locator")
    }
}

/// A client thread's handle on SWARM: its fabric, clock, writer id and local state.
///
/// Operations take `&self`, so a thread can keep several in flight on one
/// [`crate::LocalExecutor`]; writer-local state sits in a `RefCell` that is never
/// borrowed across an `await`.
///
/// Writes and deletes of one client to one register run one at a time: a second one
/// waits (re-polled, like every future of this crate) until the first has returned.
/// Safe-Guess reads rely on it (appendix C, Assumption 2: one operation in flight per
/// writer): a reader that sees a newer tuple of a writer concludes that the writer's
/// older write on that register completed. Reads, and writes to other registers, are
/// not held back.
#[derive(Debug)]
pub struct Client<F, C> {
    pub(crate) fabric: F,
    pub(crate) clock: C,
    pub(crate) layout: Layout,
    pub(crate) config: ProtocolConfig,
    pub(crate) writer: WriterId,
    pub(crate) state: RefCell<WriterState>,
    /// The nodes this client suspects, shared with the store's other paths.
    pub(crate) suspicion: Arc<Suspicion>,
    /// Identities ([`RegisterLoc::id`]) of the registers with a write or delete of this
    /// client in flight.
    writing: RefCell<Vec<u64>>,
    /// An operation of this client has its write-back guard up
    /// ([`super::write_back_guard`]).
    pub(crate) guard_busy: core::cell::Cell<bool>,
    /// The batches of the guarded write-back (and of its raise) that had not
    /// completed when their steps ended: the guard goes down only once each completed or its fabric says it can
    /// no longer land ([`super::write_back_guard`], "The lower").
    pub(crate) guard_tickets: RefCell<Vec<crate::fabric::Ticket>>,
    /// The guard word whose lower waits for `guard_tickets`, if any: the guard stays
    /// up (and `guard_busy` set) until then.
    pub(crate) guard_lowering: core::cell::Cell<Option<u64>>,
    /// The lower of this client's guard is posted and its batches (in
    /// `guard_tickets`) are not all done: `guard_busy` stays set until they are, so
    /// that no later raise of the guard can be overwritten by it.
    pub(crate) guard_lower_landing: core::cell::Cell<bool>,
    /// This writer's own batches into its log slots that may still land: their
    /// slots stay out of use until they are done ([`OwnBatches`], docs/pauses.md H9).
    pub(crate) own_batches: OwnBatches,
    /// The record buffer of the last write, reused by the next one if no batch
    /// holds it any more (`Client::shared_record`).
    pub(crate) spare_record: RefCell<Option<Arc<[u8]>>>,
    /// The buffer the immediate reads read a register's in-place block into.
    pub(crate) read_blocks: ReadBlocks,
}

/// A register's write slot of one client, held by the write or delete in flight on it
/// (see [`Client`]); given back on drop, also when the operation is dropped midway.
#[derive(Debug)]
pub(crate) struct WriteSlot<'a> {
    writing: &'a RefCell<Vec<u64>>,
    id: u64,
}

impl Drop for WriteSlot<'_> {
    fn drop(&mut self) {
        let mut writing = self.writing.borrow_mut();
        if let Some(i) = writing.iter().position(|&a| a == self.id) {
            writing.swap_remove(i);
        }
    }
}

impl<F: Fabric, C: Clock> Client<F, C> {
    /// A client writing as `writer` (which must have a log in `layout`).
    pub fn new(
        fabric: F,
        clock: C,
        layout: Layout,
        writer: WriterId,
        config: ProtocolConfig,
    ) -> Result<Self, SwarmError> {
        let mut slots = SlotAllocator::new(&layout, writer)?;
        // Tombstones of this writer always use the same slot, with identical content
        // (§5.3.2): reserve it once so that no ordinary write lands on it.
        slots.reserve(&layout, Timestamp::tombstone(writer));
        Ok(Self {
            fabric,
            clock,
            layout,
            config,
            writer,
            state: RefCell::new(WriterState {
                slots,
                guesser: TimestampGuesser::new(),
                tracker: SlotTracker::default(),
                carried: CarriedSlots::default(),
                locate: None,
                ceiling: None,
            }),
            suspicion: Arc::new(Suspicion::new(config.suspect_ns)),
            writing: RefCell::new(Vec::new()),
            guard_busy: core::cell::Cell::new(false),
            guard_tickets: RefCell::new(Vec::new()),
            guard_lowering: core::cell::Cell::new(None),
            guard_lower_landing: core::cell::Cell::new(false),
            own_batches: OwnBatches::default(),
            spare_record: RefCell::new(None),
            read_blocks: ReadBlocks::new(layout.register_bytes() as usize),
        })
    }

    /// The fabric this client talks through.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// The clock this client guesses timestamps from.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The cluster layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// This client's writer id.
    pub fn writer(&self) -> WriterId {
        self.writer
    }

    /// The protocol's tunables.
    pub fn config(&self) -> &ProtocolConfig {
        &self.config
    }

    /// Log slots in use by this writer.
    pub fn slots_in_use(&self) -> u32 {
        self.state.borrow().slots.in_use()
    }

    /// Counters of this writer's log: slots in use, in limbo, recycled so far.
    pub fn slot_counters(&self) -> SlotCounters {
        let state = self.state.borrow();
        SlotCounters {
            carried: state.carried.remaining() as u32,
            ..state.tracker.counters(state.slots.in_use())
        }
    }

    /// Background recycling work, bounded and non-blocking (call it between
    /// operations, e.g. from a store's per-operation tick): gives back limbo slots
    /// whose grace has passed, collects the replies of the slot-recycling check in flight,
    /// and at most every [`ProtocolConfig::slot_recycling_interval_ns`] starts a new check
    /// of up to `budget` registers this writer has live buffers on (one metadata
    /// read per replica, posted without waiting; see [`super::slot_recycling`]).
    pub fn recycle_slots_tick(&self, budget: usize) {
        self.recycle_slots_tick_at(budget, self.fabric.now());
    }

    /// [`Self::recycle_slots_tick`] with the fabric clock already read (`now`): an
    /// operation that reads the clock as it starts passes it on.
    ///
    /// With nothing due (the common case) it is one comparison: the tracker keeps
    /// the earliest time something may be due, lowered whenever something is queued
    /// (`SlotTracker::quiet_until`).
    pub fn recycle_slots_tick_at(&self, budget: usize, now: Nanos) {
        if self.guard_lower_pending() {
            self.finish_guard_lower();
        }
        let mut state = self.state.borrow_mut();
        if now < state.tracker.quiet_until() {
            return;
        }
        let WriterState { slots, tracker, .. } = &mut *state;
        tracker.tick(
            &self.fabric,
            slots,
            &self.layout,
            self.writer,
            now,
            &self.release_timing(),
            &self.own_batches,
            budget,
            self.config.slot_recycling_interval_ns,
        );
    }

    /// Whether the background ticks ([`Self::recycle_slots_tick_at`],
    /// [`Self::examine_carried_tick`]) have nothing to do at `now`: a store's
    /// per-operation upkeep skips both when so (one borrow and two comparisons).
    pub fn background_quiet(&self, now: Nanos) -> bool {
        let state = self.state.borrow();
        now < state.tracker.quiet_until()
            && state.carried.remaining() == 0
            && !self.guard_lower_pending()
    }

    /// One slot-recycling check of up to `budget` tracked registers, waited for (at most
    /// `max_op_ns`), then the release of every limbo slot whose grace has passed.
    /// Returns the log's counters afterwards.
    pub async fn recycle_slots_step(&self, budget: usize) -> SlotCounters {
        if self.guard_lower_pending() {
            self.finish_guard_lower();
        }
        self.check_tracked(budget).await;
        let mut state = self.state.borrow_mut();
        let WriterState { slots, tracker, .. } = &mut *state;
        tracker.expire(
            &self.fabric,
            slots,
            &self.layout,
            self.writer,
            self.fabric.now(),
            &self.release_timing(),
            &self.own_batches,
        );
        tracker.counters(slots.in_use())
    }

    /// Runs one whole slot-recycling check of up to `budget` tracked registers (`usize::MAX`:
    /// all of them), after the one in flight, if any: at most one runs at a time.
    /// Another task (the background tick) may collect the replies, so this waits for
    /// the count of ended checks to move, never for itself to see the check end.
    async fn check_tracked(&self, budget: usize) {
        for _ in 0..2 {
            let (started, ended, checking) = {
                let mut state = self.state.borrow_mut();
                let tracker = &mut state.tracker;
                tracker.poll_check(&self.fabric, self.config.max_op_ns);
                let ended = tracker.checks_ended();
                let started =
                    tracker.start_check(&self.fabric, &self.layout, budget, 0, self.fabric.now());
                (started, ended, tracker.checking())
            };
            if !checking {
                // Nothing tracked (or a zero budget): nothing to check.
                return;
            }
            while self.poll_check_ended() == ended {
                crate::exec::sleep(&self.fabric, self.config.slow_after_ns).await;
            }
            if started {
                return;
            }
        }
    }

    /// Abandons the slot-recycling check and the carried-slot examination in flight, if any
    /// (their batches are forgotten).
    pub fn cancel_slot_recycling(&self) {
        let mut state = self.state.borrow_mut();
        state.tracker.cancel_check(&self.fabric);
        state.carried.cancel(&self.fabric);
    }

    /// Arms the operation fence for as long as the returned scope lives: `stats`'
    /// deadline becomes now plus [`ProtocolConfig::max_op_ns`] unless it has an
    /// earlier one. Every operation of this client does it when it starts; a store
    /// that runs several steps per operation (an index lookup, then a register read)
    /// arms its own deadline first ([`OpStats::arm_deadline`]), so that all of them
    /// are fenced from the operation's start.
    pub fn arm_deadline<'s>(&self, stats: &'s OpStats) -> crate::roundtrip::DeadlineScope<'s> {
        // An enclosing operation's deadline, armed when it started (before now), is
        // at most now plus `max_op_ns`: keep it without reading the clock.
        let deadline = if stats.is_armed() {
            Nanos::MAX
        } else {
            self.fabric.now().saturating_add(self.config.max_op_ns)
        };
        stats.arm_deadline(deadline)
    }

    /// [`Self::arm_deadline`] for an operation that observes nothing of the memory
    /// nodes before its first post (a Safe-Guess or RAW read or write): armed by the
    /// first post's fence check, from the clock reading that check takes anyway
    /// ([`OpStats::arm_at_first_post`]), so the operation reads the clock once fewer.
    pub(crate) fn arm_at_first_post<'s>(
        &self,
        stats: &'s OpStats,
    ) -> crate::roundtrip::DeadlineScope<'s> {
        stats.arm_at_first_post(self.config.max_op_ns)
    }

    /// A write of `ts` on `reg` is about to be posted: track its slot.
    pub(crate) fn track(&self, reg: &RegisterLoc, ts: Timestamp) {
        self.state.borrow_mut().tracker.track(reg, ts);
    }

    /// Reads the fabric clock after a step whose answers an operation is about to
    /// return from, and fails with [`SwarmError::Fenced`] if it is past the
    /// operation's deadline (the check [`Self::settle`] makes for writes). Returns
    /// the reading. Every read returns through it, except a common-case read on the
    /// immediate path, whose step makes the same check after its burst
    /// (`crate::roundtrip::Immediate`); see "Quorums counted across a repair" in
    /// [`super::maxreg`].
    pub(crate) fn confirm(&self, stats: &OpStats) -> Result<Nanos, SwarmError> {
        let now = self.fabric.now();
        if stats.is_fenced(now) {
            tracing::debug!("answers completed past the operation's deadline: fenced");
            return Err(SwarmError::Fenced);
        }
        Ok(now)
    }

    /// A majority of `reg`'s replicas holds `floor` or more: this writer's writes
    /// below it are superseded (see [`super::slot_recycling`]). Returns the fabric time they
    /// were stamped with (read now, after the supersession was learned), for the
    /// caller's next fence check if it posts without waiting in between.
    ///
    /// Fails with [`SwarmError::Fenced`], stamping nothing, when that reading is past
    /// the operation's deadline: the answers the majority was counted from may have
    /// come on both sides of a stop, and a node among them may have lost its memory
    /// and been rebuilt from donors that lack the write meanwhile (a repair's
    /// quiescence wait covers only what landed by the deadline). The outcome is then
    /// unknown. The reading is the one the stamp takes anyway: the check adds none.
    /// See "Quorums counted across a repair" in [`super::maxreg`].
    pub(crate) fn settle(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        floor: Tsp,
    ) -> Result<Nanos, SwarmError> {
        let now = self.fabric.now();
        if stats.is_fenced(now) {
            tracing::debug!(
                register = reg.id,
                "majority completed past the operation's deadline: outcome unknown (fenced)"
            );
            return Err(SwarmError::Fenced);
        }
        self.state.borrow_mut().tracker.settle(reg.id, floor, now);
        Ok(now)
    }

    /// A slot for a new write: `allocate` (a [`Self::guess_ts`] or
    /// [`Self::allocate_ts`] call) once the log has a free slot, waiting for limbo
    /// slots to come back (see [`Self::wait_for_slot`]) when it is full.
    pub(crate) async fn allocate_waiting(
        &self,
        stats: &OpStats,
        mut allocate: impl FnMut() -> Result<Timestamp, SwarmError>,
    ) -> Result<Timestamp, SwarmError> {
        loop {
            self.wait_for_slot(stats).await;
            match allocate() {
                Err(SwarmError::Slot(SlotError::LogFull(..))) => {
                    match self.limbo_expiry() {
                        // A limbo slot comes back before the deadline: wait for it.
                        Some(at) if stats.deadline().is_none_or(|d| at <= d) => {}
                        // Only after the deadline: the operation cannot go on within
                        // its fence.
                        Some(_) => return Err(SwarmError::Fenced),
                        // Carried slots not examined yet may come back: learn more
                        // (another operation of this client can take the slot that
                        // one examination step gave back, `learn_superseded` stopping
                        // there; each step examines more of the log).
                        None if self.carried_remaining() > 0 => {}
                        // Every slot holds live data: the log is too small.
                        None => return allocate(),
                    }
                }
                Ok(ts) if self.ceiling_covers(ts.ticks()) => return Ok(ts),
                Ok(ts) => {
                    // Nothing is posted with `ts` before the ceiling covers it. The
                    // raise (about once a second) is boxed, so that its state does
                    // not enlarge every write's future.
                    if let Err(e) = Box::pin(self.cover_ticks(stats, ts.ticks())).await {
                        self.state.borrow_mut().slots.release(&self.layout, ts);
                        return Err(e);
                    }
                    return Ok(ts);
                }
                other => return other,
            }
        }
    }

    /// Has this writer persist a *tick ceiling* at `addr` (a word on every node,
    /// which only this writer id writes, never lowered): from now on no timestamp
    /// above the ceiling is returned by an allocation before a majority of nodes
    /// holds a ceiling at or above it (one more roundtrip, a CAS per node, each time
    /// a timestamp passes it; the ceiling is then raised `headroom` ticks beyond
    /// it). `held` is the largest value read from the word on a majority, which the
    /// caller also resumes above after a crash ([`Self::resume_crashed`]). See
    /// [`super::resume`], "Crash resume".
    pub fn set_tick_ceiling(&self, addr: u64, held: u64, headroom: u64) {
        let nodes = self.table_nodes();
        self.state.borrow_mut().ceiling = Some(Ceiling {
            addr,
            headroom: headroom.max(1),
            persisted: held,
            known: alloc::vec![held; nodes],
            raising: false,
        });
    }

    /// The tick ceiling persisted on a majority, if this writer keeps one.
    pub fn tick_ceiling(&self) -> Option<u64> {
        self.state.borrow().ceiling.as_ref().map(|c| c.persisted)
    }

    /// Whether no raise is needed before using `ticks`: no ceiling is kept, or a
    /// majority holds one at or above it.
    fn ceiling_covers(&self, ticks: u64) -> bool {
        self.state
            .borrow()
            .ceiling
            .as_ref()
            .is_none_or(|c| c.persisted >= ticks)
    }

    /// Makes sure a majority of nodes holds a tick ceiling at or above `ticks`
    /// (no-op without a ceiling): raises it to `ticks + headroom` by CAS from the
    /// value each node is believed to hold, never lowering it. One raise at a time
    /// per client; another operation that needs one waits for it.
    async fn cover_ticks(&self, stats: &OpStats, ticks: u64) -> Result<(), SwarmError> {
        let (addr, target, mut known) = loop {
            {
                let mut state = self.state.borrow_mut();
                let Some(ceiling) = state.ceiling.as_mut() else {
                    return Ok(());
                };
                if ceiling.persisted >= ticks {
                    return Ok(());
                }
                if !ceiling.raising {
                    ceiling.raising = true;
                    let target = ticks
                        .saturating_add(ceiling.headroom)
                        .min(crate::encoding::MAX_TICKS)
                        .max(ticks);
                    break (ceiling.addr, target, ceiling.known.clone());
                }
            }
            crate::exec::sleep(&self.fabric, self.config.slow_after_ns).await;
        };
        // Clears the flag however this ends (an error, a dropped operation).
        struct Raising<'a>(&'a RefCell<WriterState>);
        impl Drop for Raising<'_> {
            fn drop(&mut self) {
                if let Some(ceiling) = self.0.borrow_mut().ceiling.as_mut() {
                    ceiling.raising = false;
                }
            }
        }
        let _raising = Raising(&self.state);
        let nodes = known.len();
        let needed = super::quorum::majority(nodes);
        let mut result = Err(SwarmError::Fabric(FabricError::NotEnoughLiveNodes {
            needed,
            live: 0,
        }));
        for _ in 0..8 {
            let done = known.iter().filter(|&&w| w >= target).count();
            if done >= needed {
                result = Ok(());
                break;
            }
            let behind: Vec<NodeId> = (0..nodes)
                .filter(|&i| known[i] < target)
                .map(|i| NodeId(i as u16))
                .collect();
            let expected = known.clone();
            let rt = super::quorum::broadcast(&self.fabric, stats, behind, needed - done, |node| {
                Ok(crate::fabric::Batch::cas(
                    addr,
                    expected[node.index()],
                    target,
                ))
            })
            .await;
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            };
            for (node, completion) in rt.replies() {
                if let (Some(held), Some(previous)) =
                    (known.get_mut(node.index()), completion.cas(0))
                {
                    *held = if previous == expected[node.index()] {
                        target
                    } else {
                        previous
                    };
                }
            }
        }
        let mut state = self.state.borrow_mut();
        if let Some(ceiling) = state.ceiling.as_mut() {
            for (mine, seen) in ceiling.known.iter_mut().zip(&known) {
                *mine = (*mine).max(*seen);
            }
            if result.is_ok() {
                ceiling.persisted = ceiling.persisted.max(target);
            }
        }
        result
    }

    /// When the oldest limbo slot comes back, if any.
    fn limbo_expiry(&self) -> Option<Nanos> {
        let state = self.state.borrow();
        state.tracker.next_expiry(&self.release_timing())
    }

    /// What rules when a limbo slot goes back to the allocator.
    /// The nodes holding the writers' table words ([`ProtocolConfig::table_nodes`]):
    /// nodes `0..` this.
    pub(crate) fn table_nodes(&self) -> usize {
        self.config.table_nodes_of(self.fabric.node_count())
    }

    fn release_timing(&self) -> ReleaseTiming {
        ReleaseTiming {
            table_nodes: self.table_nodes(),
            grace: self.config.grace_ns(),
            margin: self.config.delivery_margin_ns,
            timeout: self.config.max_op_ns,
            recheck: self
                .config
                .slot_recycling_interval_ns
                .min(self.config.grace_ns()),
        }
    }

    /// Waits, while the operation's deadline allows, until the log has a free slot
    /// or none can come back from the limbo; expired limbo slots are released.
    /// An operation that has not observed anything yet waits before arming its
    /// deadline, so a full log throttles its writer instead of failing.
    pub(crate) async fn wait_for_slot(&self, stats: &OpStats) {
        self.wait_for_slots(stats, 1).await;
    }

    /// [`Self::wait_for_slot`] for `needed` free slots (at least one).
    ///
    /// Returns once `needed` slots are free, or when none more can come back in
    /// time: nothing in limbo (before the deadline, if one is armed) and the last
    /// look at what the log holds ([`Self::learn_superseded`]) found nothing new.
    /// A limbo slot that came back short of `needed` is not the end of the wait:
    /// the log may hold more superseded buffers, not known as such yet, and a
    /// caller that starts an operation with fewer free slots than it writes would
    /// find the log full inside its deadline (a KV insert of a present key, which
    /// writes two registers, failed with `Fenced` that way).
    async fn wait_for_slots(&self, stats: &OpStats, needed: u32) {
        let needed = needed.max(1);
        let room = |in_use: u32| in_use.saturating_add(needed) <= self.layout.slots_per_writer();
        // The common case, with no clock read: the log has room.
        if room(self.state.borrow().slots.in_use()) {
            return;
        }
        // Set when a look at what the log holds learned nothing: then only the limbo
        // can still give slots back.
        let mut learned_nothing = false;
        loop {
            let limbo = {
                let state = self.state.borrow();
                let expiry = state.tracker.next_expiry(&self.release_timing());
                let full = !room(state.slots.in_use());
                match expiry {
                    None if !full || learned_nothing => return,
                    expiry => expiry,
                }
            };
            if limbo.is_none() {
                // Short of room, and nothing in limbo: the log may hold buffers
                // superseded since, not known as such yet (after a resume, or
                // overwritten by other writers). Learn, for as long as that frees
                // slots or puts some in limbo.
                tracing::debug!(
                    writer = self.writer.get(),
                    "log full with nothing in limbo: checking what it holds"
                );
                let before = self.slots_in_use();
                self.learn_superseded(needed).await;
                learned_nothing = self.slots_in_use() >= before && self.limbo_expiry().is_none();
                continue;
            }
            let wake = {
                let mut state = self.state.borrow_mut();
                let WriterState { slots, tracker, .. } = &mut *state;
                let timing = self.release_timing();
                let Some(at) = tracker.next_expiry(&timing) else {
                    continue;
                };
                let now = self.fabric.now();
                if now >= at {
                    tracker.expire(
                        &self.fabric,
                        slots,
                        &self.layout,
                        self.writer,
                        now,
                        &timing,
                        &self.own_batches,
                    );
                }
                if room(slots.in_use()) {
                    return;
                }
                match tracker
                    .next_expiry(&timing)
                    .map(|at| at.max(now.saturating_add(1)))
                {
                    Some(at) if stats.deadline().is_none_or(|d| at <= d) => at,
                    // Nothing left in limbo, and still short of room: learn again
                    // (the top of the loop).
                    None => continue,
                    // Nothing comes back in time: let the allocation report it.
                    Some(_) => return,
                }
            };
            tracing::debug!(
                writer = self.writer.get(),
                until = wake,
                "log full: waiting for a superseded slot's grace to pass"
            );
            let now = self.fabric.now();
            crate::exec::sleep(&self.fabric, wake.saturating_sub(now)).await;
        }
    }

    /// Resumes the log of an earlier incarnation of this writer id: marks `used`
    /// slots as taken and makes later timestamps exceed `last_ticks`, so that no
    /// buffer of the earlier incarnation is overwritten and no timestamp repeats.
    pub fn resume(&self, used: impl IntoIterator<Item = u32>, last_ticks: u64) {
        let mut state = self.state.borrow_mut();
        for slot in used {
            state.slots.mark_used(slot);
        }
        state.guesser.used(last_ticks);
    }

    /// What a clean stop hands to the next incarnation of this writer id (see
    /// [`super::summary`]): the used-slot bitmap (carried slots not examined yet
    /// included) and a tick count above every timestamp this writer used.
    ///
    /// Take it only once no operation of this client is in flight: a write allocated
    /// after it would be missing from it.
    pub fn log_summary(&self) -> LogSummary {
        let state = self.state.borrow();
        LogSummary::new(
            self.layout.slots_per_writer(),
            state.slots.bitmap().to_vec(),
            state.guesser.last(),
        )
    }

    /// Resumes an earlier incarnation's log from its [`LogSummary`] instead of a
    /// whole-log scan: marks its used slots as taken and makes later timestamps
    /// exceed its last tick count (as [`Self::resume`]), and queues the used slots
    /// for lazy examination ([`Self::examine_carried_tick`], and before a write would
    /// find the log full), which learns what they hold so that slot-recycling checks can
    /// free the superseded ones. `locate` maps the register identity a record names
    /// (untrusted) to the register's location, as for [`Self::resume_scan`]; `None`
    /// leaves that slot taken.
    pub fn resume_summary(
        &self,
        summary: &LogSummary,
        locate: impl Fn(u64) -> Option<RegisterLoc> + Send + 'static,
    ) {
        self.resume(summary.used_slots(), summary.last_ticks);
        // The tombstone slot's record is the same for every delete: nothing to learn.
        let tombstone = self.layout.slot_of(Timestamp::tombstone(self.writer));
        let mut state = self.state.borrow_mut();
        let mut pending: Vec<u32> = summary
            .used_slots()
            .filter(|&slot| slot != tombstone)
            .collect();
        pending.sort_unstable();
        state.carried = CarriedSlots::new(pending);
        state.locate = Some(Locator(alloc::boxed::Box::new(locate)));
    }

    /// Resumes the log of an earlier incarnation that left no summary (it crashed,
    /// or was evicted) without reading the log first: every slot but the tombstone's
    /// is *carried* (marked used and queued for the lazy examination, as after
    /// [`Self::resume_summary`]), and later timestamps exceed `last_ticks`, which
    /// must be at or above every tick the earlier incarnations used (their persisted
    /// tick ceiling, [`Self::set_tick_ceiling`]). The examination frees the slots it
    /// finds empty on every node that answered, and tracks the writes it finds, as
    /// after a whole-log scan. See [`super::resume`], "Crash resume".
    pub fn resume_crashed(
        &self,
        last_ticks: u64,
        locate: impl Fn(u64) -> Option<RegisterLoc> + Send + 'static,
    ) {
        let slots = self.layout.slots_per_writer();
        let tombstone = self.layout.slot_of(Timestamp::tombstone(self.writer));
        self.resume(0..slots, last_ticks);
        let mut state = self.state.borrow_mut();
        state.carried = CarriedSlots::new((0..slots).filter(|&s| s != tombstone).collect());
        state.locate = Some(Locator(alloc::boxed::Box::new(locate)));
    }

    /// One bounded, non-blocking step of the examination of carried slots (call it
    /// between operations, like [`Self::recycle_slots_tick`]; a no-op once every carried
    /// slot was examined): collects the read in flight and posts the next one (see
    /// `carried.rs`). Each write found whose register the summary's `locate` knows
    /// is tracked as a write of unknown outcome, as by [`Self::resume_scan`]; the
    /// guesser is raised above every tick found in a record or a lock word; and
    /// each slot empty on every copy read is given back to the allocator.
    pub fn examine_carried_tick(&self, now: Nanos) {
        let mut state = self.state.borrow_mut();
        if state.carried.remaining() == 0 {
            return;
        }
        let WriterState {
            carried,
            tracker,
            locate,
            slots,
            guesser,
            ..
        } = &mut *state;
        let found = carried.tick(
            &self.fabric,
            &self.layout,
            self.writer,
            now,
            self.config.max_op_ns,
        );
        // Before any of these slots can be allocated again (tslock.rs: a slot's new
        // write is above every lock and record it held).
        guesser.used(found.max_ticks);
        for slot in found.empty {
            slots.release_slot(slot);
        }
        let Some(Locator(locate)) = locate else {
            return;
        };
        for (_, ts, register) in found.writes {
            if let Some(reg) = locate(register) {
                tracker.track_resumed(&reg, ts);
            }
        }
    }

    /// Learns which slots of a full log can come back (a log short of `needed` free
    /// slots with nothing in limbo, typically just after a resume), reading only as
    /// much as that takes: one examination step of the carried slots at a time, each
    /// followed by a check of every tracked register, until `needed` slots are free,
    /// one is in limbo, or nothing is left to examine. Reads only.
    async fn learn_superseded(&self, needed: u32) {
        let room = |in_use: u32| in_use.saturating_add(needed) <= self.layout.slots_per_writer();
        loop {
            let before = self.carried_remaining();
            if before > 0 {
                // One whole step: post it (or collect the one in flight), then wait
                // until a read ends with a majority of copies.
                loop {
                    self.examine_carried_tick(self.fabric.now());
                    if self.carried_remaining() < before {
                        break;
                    }
                    crate::exec::sleep(&self.fabric, self.config.slow_after_ns).await;
                }
            }
            if room(self.slots_in_use()) {
                return;
            }
            self.check_tracked(usize::MAX).await;
            let progress = {
                let state = self.state.borrow();
                room(state.slots.in_use())
                    || state.tracker.next_expiry(&self.release_timing()).is_some()
            };
            if progress || self.carried_remaining() == 0 {
                return;
            }
        }
    }

    /// Makes room in a full log before any operation needs it (a client that just
    /// resumed a log full of its predecessors' buffers, say a one-shot command whose
    /// predecessors never lived long enough to recycle anything): learns which
    /// buffers are superseded, then waits, with no operation deadline, until the
    /// first of them is past its grace. Returns whether a slot is free; `false` means
    /// every slot holds a live buffer (the log is too small for this writer).
    pub async fn make_room(&self) -> bool {
        self.make_room_for(1).await
    }

    /// [`Self::make_room`] for `slots` writes (an operation that may write several
    /// registers); returns whether that many slots are free.
    pub async fn make_room_for(&self, slots: u32) -> bool {
        self.wait_for_slots(&OpStats::new(), slots).await;
        self.slots_in_use().saturating_add(slots.max(1)) <= self.layout.slots_per_writer()
    }

    /// Collects the replies of the slot-recycling check in flight; returns how many checks
    /// have ended so far.
    fn poll_check_ended(&self) -> u64 {
        let mut state = self.state.borrow_mut();
        state
            .tracker
            .poll_check(&self.fabric, self.config.max_op_ns);
        state.tracker.checks_ended()
    }

    /// Carried slots not examined yet (see [`Self::resume_summary`]).
    pub fn carried_remaining(&self) -> usize {
        self.state.borrow().carried.remaining()
    }

    /// Resumes an earlier incarnation's log from its scan (see [`super::resume`]):
    /// like [`Self::resume`], and each resumed write whose register `locate` knows
    /// (`None`: not a register of this store; the slot stays taken) is tracked as a
    /// write of unknown outcome, so that slot-recycling checks free its slot once a
    /// majority of its register holds something above it.
    pub fn resume_scan(
        &self,
        scan: &super::resume::LogScan,
        locate: impl Fn(u64) -> Option<RegisterLoc>,
    ) {
        self.resume(scan.used_slots.iter().copied(), scan.last_ticks);
        let mut state = self.state.borrow_mut();
        let tombstone = self.layout.slot_of(Timestamp::tombstone(self.writer));
        for write in &scan.resumed {
            if write.slot == tombstone || self.layout.slot_of(write.ts) != write.slot {
                continue;
            }
            if let Some(reg) = locate(write.register) {
                state.tracker.track_resumed(&reg, write.ts);
            }
        }
    }

    /// Waits until no other write or delete of this client is in flight on `reg`,
    /// then holds its write slot until the returned guard is dropped.
    pub(crate) async fn write_slot(&self, reg: &RegisterLoc) -> WriteSlot<'_> {
        core::future::poll_fn(|cx| {
            let mut writing = self.writing.borrow_mut();
            if writing.contains(&reg.id) {
                // Busy re-poll, as everywhere in this crate (see `crate::exec`).
                cx.waker().wake_by_ref();
                return core::task::Poll::Pending;
            }
            writing.push(reg.id);
            core::task::Poll::Ready(())
        })
        .await;
        WriteSlot {
            writing: &self.writing,
            id: reg.id,
        }
    }

    /// Whether `node` missed a deadline recently (see [`ProtocolConfig::suspect_ns`]).
    pub fn suspects(&self, node: NodeId) -> bool {
        // No clock read for a trusted node: the fast path.
        self.suspicion.suspects_with(node, || self.fabric.now())
    }

    /// The table of suspected nodes, for a store's other paths (index and header
    /// reads) to order and suspect nodes the same way.
    pub fn suspicion(&self) -> &Arc<Suspicion> {
        &self.suspicion
    }

    pub(crate) fn suspect(&self, node: NodeId) {
        if self.suspicion.suspect(node, self.fabric.now()) {
            tracing::info!(
                writer = self.writer.get(),
                node = node.index(),
                suspect_ns = self.config.suspect_ns,
                "memory node did not answer within slow_after_ns: suspected, \
                 its registers are served by the other replicas"
            );
        }
    }

    pub(crate) fn trust(&self, node: NodeId) {
        if self.suspicion.trust(node) {
            tracing::info!(
                writer = self.writer.get(),
                node = node.index(),
                "memory node answered in time again: trusted"
            );
        }
    }

    /// The replica position acting as the register's primary: the first one in
    /// preference order that is not suspected (in-place data lives there, §6).
    pub(crate) fn primary(&self, reg: &RegisterLoc) -> usize {
        if !self.suspicion.any() {
            return 0;
        }
        (0..reg.replicas.len())
            .find(|&p| !self.suspects(reg.replicas.node(p)))
            .unwrap_or(0)
    }

    pub(crate) fn check_payload(&self, payload: &[u8]) -> Result<(), SwarmError> {
        if payload.len() > self.layout.payload_max() as usize {
            return Err(SwarmError::PayloadTooLarge {
                len: payload.len(),
                max: self.layout.payload_max(),
            });
        }
        Ok(())
    }

    /// Allocates a log slot for a new write whose timestamp is at least `min_ticks`
    /// and above every earlier write of this writer (a rewrite after a stale guess, or
    /// an ABD write: `min_ticks` is a timestamp, not a clock reading).
    pub(crate) fn allocate_ts(&self, min_ticks: u64) -> Result<Timestamp, SwarmError> {
        self.allocate_with(|guesser| guesser.at_least(min_ticks))
    }

    /// A guessed timestamp from the clock (SWARM §3.2 `guessTs`): the clock reading
    /// plus the re-synchronisation offset.
    pub(crate) fn guess_ts(&self) -> Result<Timestamp, SwarmError> {
        let clock = self.clock.ticks();
        self.allocate_with(|guesser| guesser.next(clock))
    }

    fn allocate_with(
        &self,
        want: impl FnOnce(&mut TimestampGuesser) -> u64,
    ) -> Result<Timestamp, SwarmError> {
        let mut state = self.state.borrow_mut();
        // Limbo slots come back in `recycle_slots_tick` and, once the log is full, in
        // `wait_for_slot`: no clock read here.
        let WriterState { slots, guesser, .. } = &mut *state;
        let wanted = want(guesser);
        let ts = slots.allocate(&self.layout, wanted)?;
        guesser.used(ts.ticks());
        Ok(ts)
    }

    /// Re-synchronises the guesser after observing `ts` (ignores tombstones).
    pub(crate) fn observe(&self, ts: Timestamp) {
        if !ts.is_tombstone() {
            let now = self.clock.ticks();
            self.state.borrow_mut().guesser.observe(ts.ticks(), now);
        }
    }
}
