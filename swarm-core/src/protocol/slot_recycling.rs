//! Recycling out-of-place log slots (SWARM §4.5), with the operation fence.
//!
//! Every write of a writer takes a slot of its log (`Layout::slot_of(ts)`, §4.3).
//! A slot can be given back to the writer's [`crate::layout::SlotAllocator`] once no
//! operation of any client can still read it, lock in it or write it back. This
//! module decides when that is, with two rules.
//!
//! **The fence.** Every operation has a deadline, its start plus
//! [`super::ProtocolConfig::max_op_ns`] on the fabric clock ([`crate::OpStats`]
//! carries it; a [`super::Client`] operation arms it when it starts, or, if it
//! observes nothing before its first post, at that post, from the clock reading that
//! checks it: [`crate::OpStats::arm_at_first_post`]). No batch of
//! the operation is posted after it: [`crate::Roundtrip::post`] fails with
//! [`crate::FabricError::Fenced`] (surfacing as [`super::SwarmError::Fenced`]) and
//! background posts are dropped (`post_background_for`).
//!
//! **Supersession, then grace.** The buffer of this writer's write `ts` on register
//! `R` is *superseded* once a majority of `R`'s replicas hold a metadata word above
//! `ts` (a tombstone counts). From then on every operation that *starts* reads a
//! majority of `R` (every Safe-Guess and ABD step does, appendix A), which intersects
//! that majority, so its maximum is above `ts`: it never fetches `ts`'s buffer, never
//! locks `ts` (a read locks only a maximum it saw twice, §3.2) and never writes `ts`
//! back (`inner_write` writes the maximum of its read). Only operations that started
//! *before* the supersession can still touch the slot, and each of those stops
//! posting at its start plus `max_op_ns`. So the writer stamps a superseded slot
//! with its fabric clock at the moment it *learns* of the supersession (which is
//! after the supersession happened), keeps it in a *limbo* queue, and releases it
//! [`grace_ns`] later: `max_op_ns` as the other clients' clocks measure it, scaled
//! for the rate drift of two clocks ([`CLOCK_DRIFT_DIV`]: each within 1/8 of real
//! time, so `· 9/7`), plus a delivery margin ([`super::ProtocolConfig::delivery_margin_ns`],
//! 10 ms by default) for a batch posted just before a deadline to take effect on its
//! memory node.
//!
//! **The delivery margin is the transport's, and cluster-wide.** Other clients write
//! into this writer's slots too: a read's write-back copies the maximum's record into
//! its buffer (appendix A), and a read locks in the slot's lock word. So the grace of
//! *this* writer must cover how late *any* client's batch may land. Shared memory
//! lands a batch when the posting thread runs it (10 ms covers scheduling). RDMA
//! lands it when the NIC gets an acknowledgement: a lost packet is sent again after
//! each ACK timeout until the queue pair's retries run out (≈ 0.55 s with the default
//! `ack_timeout` 14 and 7 retries), so a write-back posted just before its deadline
//! can overwrite a slot reused 268 ms later. SWARM-KV keeps the margin in its
//! superblock, raised to the RDMA retry window when the nodes are formatted, and
//! refuses clients whose transport could land later. A transport that queues batches
//! before they reach the wire must also not start one after its operation's deadline
//! ([`crate::Batch::deadline`]): the RDMA engine fails such a batch with
//! [`crate::FabricError::Fenced`] instead of posting it late.
//!
//! **Write-back guards.** The grace bounds when a read *posts* its write-back, not
//! when a stopped thread's stores land. So with a guard table in the layout
//! ([`crate::layout::GuardTable`]), a slot whose grace is over goes back to the
//! allocator only once a read of every other writer's guard word on a majority of
//! the nodes, posted after the grace, found none naming its write, and a delivery
//! margin after that read ([`super::write_back_guard`] has the argument). That makes
//! slot reuse safe whatever the timing; the grace stays, for liveness: without it a
//! read that fetches a superseded buffer would find it reused more often.
//!
//! **The writer's own batches.** The grace and the guards bound when *other*
//! clients' stores may land. The writer's own stores into a slot (its write's record,
//! its read's write-back of its own record) are posted before it reuses the slot, but
//! the fabric contract orders the operations of one batch, not two batches to one
//! node: a write's batch to a slow replica, left in flight when the write returned
//! with a majority, could land after the slot's reuse and overwrite the new record
//! (docs/pauses.md, H9). So a round writing into one of this writer's slots is
//! registered while it runs and keeps the tickets of its batches still outstanding
//! when it ends (`OwnBatches`, `OwnRound`), and a slot whose grace (and guard
//! check) is over goes back to the allocator only once none of them is left for its
//! write: each completed (acknowledged or failed: over RDMA a failed ticket's queue
//! pair executes nothing more) or is settled ([`Fabric::settled`]). Until then it
//! waits in a `landing` list, looked at again at each expiry. That is an event, never
//! a time. A fabric that runs every batch inside the call that posts it
//! ([`Fabric::completes_in_submit`]: shared memory) leaves nothing outstanding that
//! could land later, so its writes register nothing: the common path costs one
//! call that returns a constant.
//!
//! Operations without a deadline (an [`crate::OpStats`] built by hand
//! and used with the lower-level steps) are not covered by this argument; readers
//! defend themselves anyway (see `fetch_value` in the `maxreg` module: a buffer whose
//! record names another write is treated as superseded and the register re-read).
//!
//! **How the writer learns of supersession** (cheapest first):
//!
//! 1. Its own later write to `R` completes (any [`super::WriteOutcome`]): a word at
//!    least the new write's is then on a majority (the write's `inner_write`, its
//!    slow path's strong read, or the tombstone it found), and every earlier write
//!    of this writer is below it (timestamps of one writer only grow). A slow-path
//!    write's own guess is superseded too when something above it is on a majority.
//! 2. Its delete of `R` completes: the tombstone is on a majority.
//! 3. A slot-recycling check ([`super::Client::recycle_slots_tick`], [`super::Client::recycle_slots_step`])
//!    reads the metadata words of a majority of `R`'s replicas and finds a majority
//!    above `ts`; or, for a write known to have completed (a majority once held a
//!    word `>= ts`), a majority showing only words below `ts`: words only go up
//!    except when the register is reset for reuse, which happens only after its
//!    tombstone was on a majority (SWARM-KV register recycling). A check judges only
//!    the writes tracked (for the second half, completed) before it posted its
//!    reads: replies read earlier say nothing about a later write, and a register
//!    reset and reused in between would show the reset's empty words, below the
//!    write that is its new value. A write of unknown outcome needs words below it
//!    on *every* replica: it may sit on a minority that a reader's majority
//!    includes. That frees a write resumed from an earlier incarnation of this
//!    writer id ([`super::resume`]) once its register was reset: the incarnation's
//!    batches have all landed or never will (its successor took the id after its
//!    lease and the grace ran out, or after it closed), so a timestamp on no replica
//!    stays on none, except through a write-back by an operation that started
//!    before the check, which the grace covers as for any superseded write. Writes
//!    of this incarnation are not freed so: one may still be on its way to the
//!    nodes.
//!
//! Writes that failed (an error, a dropped future) stay tracked: they may have
//! reached some nodes, so only rule 3 (a majority above them) frees them.
//!
//! **Bounded use.** A writer's slots in use are: at most one completed write per
//! register it wrote that nobody overwrote since it last checked, writes that
//! failed, writes in flight, the tombstone slot, slots resumed from an earlier
//! incarnation, the limbo, which holds the writes of the last grace period, and
//! slots waiting for a batch of their own write to complete (none on shared memory).
//! When the log is full and the limbo is not empty, an allocation waits for the
//! oldest limbo slot (while its operation's deadline allows), which bounds the
//! writer's write rate by `slots / grace` rather than failing.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::hash::{BuildHasherDefault, Hasher};

use crate::encoding::{Timestamp, Tsp, WriterId};
use crate::fabric::{Batch, Fabric, Nanos, Ticket};
use crate::layout::{Layout, SlotAllocator};

use super::inout;
use super::register::{MAX_REPLICAS, RegisterLoc};
use super::write_back_guard::GuardCheck;

/// Default delivery margin: how long a batch posted before its operation's deadline
/// may take to take effect on a memory node.
pub const DEFAULT_DELIVERY_MARGIN_NS: Nanos = 10_000_000;

/// The clock model, one for the whole system (every grace here, swarm-kv's register
/// recycling and leases): every party measures time on its own monotonic clock, and
/// every clock's *rate* is within `1 / CLOCK_DRIFT_DIV` of real time. Offsets do not
/// matter (no interval is measured across two clocks), and nothing else about
/// timing is assumed: timing bounds when memory comes back, never what a reader
/// sees (ARCHITECTURE.md, "Timing").
pub const CLOCK_DRIFT_DIV: u64 = 8;

/// The longest that an interval of `ns` on one clock may measure on another under
/// the clock model: the first clock `1/8` slow makes it last `ns · 8/7` real time,
/// which the second, `1/8` fast, measures as `ns · 9/7` (rounded up, saturating).
pub const fn skewed_ns(ns: Nanos) -> Nanos {
    ns.saturating_add(ns.saturating_mul(2).div_ceil(CLOCK_DRIFT_DIV - 1))
}

/// The longest that `ns` of real time may measure on a clock of the model: `ns · 9/8`
/// (rounded up, saturating).
pub const fn real_on_clock_ns(ns: Nanos) -> Nanos {
    ns.saturating_add(ns.div_ceil(CLOCK_DRIFT_DIV))
}

/// The grace after which memory that became unreachable for new operations may be
/// reused: an operation's `max_op_ns` measured on the poster's clock, as the waiter's
/// clock may measure it ([`skewed_ns`], `· 9/7`), plus the 10 ms delivery margin of
/// real time ([`real_on_clock_ns`], `· 9/8`). See the module docs.
pub const fn grace_ns(max_op_ns: Nanos) -> Nanos {
    grace_with_margin_ns(max_op_ns, DEFAULT_DELIVERY_MARGIN_NS)
}

/// [`grace_ns`] with another delivery margin (simulations with microsecond links).
pub const fn grace_with_margin_ns(max_op_ns: Nanos, delivery_margin_ns: Nanos) -> Nanos {
    skewed_ns(max_op_ns).saturating_add(real_on_clock_ns(delivery_margin_ns))
}

/// The batches of this writer's own stores into its log slots (its writes' records,
/// and its reads' write-backs of its own records) that may still land: a slot leaves
/// the limbo only once none of them is left for its write ([`SlotTracker::expire`];
/// module docs, "The writer's own batches").
///
/// Two batches to one node are not ordered (the fabric contract), so a write's batch
/// to a slow replica, posted before the write returned with the other replicas, may
/// land after the writer superseded the write, let its grace run out and reused the
/// slot, and overwrite the new record there (docs/pauses.md, H9). So a round that
/// writes into one of this writer's slots registers the slot's write while it runs
/// ([`OwnRound`]) and, when it ends with batches still outstanding, keeps their
/// tickets here, tagged with that write. Nothing is ever outstanding on a transport
/// that runs a batch inside the call that posts it (shared memory): both lists stay
/// empty there.
#[derive(Debug, Default)]
pub(crate) struct OwnBatches {
    /// The writes whose slot a round of this client is writing into now (one entry
    /// per round alive, also while its operation is not being polled).
    live: RefCell<Vec<Timestamp>>,
    /// Batches outstanding when their round ended, with the write whose slot they
    /// write into.
    kept: RefCell<Vec<(Timestamp, Ticket)>>,
}

impl OwnBatches {
    /// Whether every batch of this writer that writes into the slot of `ts` is
    /// *done*: no round writing it is alive, and each batch such a round left
    /// outstanding completed (acknowledged or failed) or can no longer land
    /// ([`Fabric::settled`]). An event, never a time: a batch whose ticket never
    /// completes keeps the slot out of use (liveness only). Never waits.
    pub(crate) fn done<F: Fabric + ?Sized>(&self, fabric: &F, ts: Timestamp) -> bool {
        if self.live.borrow().contains(&ts) {
            return false;
        }
        let mut kept = self.kept.borrow_mut();
        if kept.is_empty() {
            return true;
        }
        kept.retain(|&(_, ticket)| match fabric.poll(ticket) {
            core::task::Poll::Ready(_) => false,
            core::task::Poll::Pending if fabric.settled(ticket) => {
                fabric.forget(ticket);
                false
            }
            core::task::Poll::Pending => true,
        });
        !kept.iter().any(|&(t, _)| t == ts)
    }
}

/// A round writing into the slot of this writer's write `ts`, registered in
/// [`OwnBatches`] from its creation to its drop; its steps hand it their batches
/// still outstanding (`Roundtrip::keep_outstanding_in(&round.tickets)`), which it
/// keeps in [`OwnBatches`] when dropped, whatever the operation's fate.
#[derive(Debug)]
pub(crate) struct OwnRound<'a> {
    own: &'a OwnBatches,
    ts: Timestamp,
    /// The tickets the round's steps left outstanding.
    pub(crate) tickets: RefCell<Vec<Ticket>>,
}

impl<'a> OwnRound<'a> {
    /// Registers a round writing into the slot of `ts`.
    pub(crate) fn new(own: &'a OwnBatches, ts: Timestamp) -> Self {
        own.live.borrow_mut().push(ts);
        Self {
            own,
            ts,
            tickets: RefCell::new(Vec::new()),
        }
    }
}

impl Drop for OwnRound<'_> {
    fn drop(&mut self) {
        let mut live = self.own.live.borrow_mut();
        if let Some(i) = live.iter().position(|&t| t == self.ts) {
            live.swap_remove(i);
        }
        let tickets = self.tickets.get_mut();
        if !tickets.is_empty() {
            let ts = self.ts;
            self.own
                .kept
                .borrow_mut()
                .extend(tickets.drain(..).map(|ticket| (ts, ticket)));
        }
    }
}

/// Counters of a writer's log, for `swarm stat` and bench reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounters {
    /// Slots of the log in use (live, in flight, failed, in limbo, reserved).
    pub in_use: u32,
    /// Slots superseded and not given back yet (in their grace, or waiting for a
    /// guard check or for a batch of their write to complete).
    pub in_limbo: u32,
    /// Slots given back to the allocator since this client started.
    pub recycled: u64,
    /// Registers with a tracked write of this writer.
    pub tracked_registers: u32,
    /// Slots carried over from an earlier incarnation's summary and not examined yet
    /// (they count in `in_use`; see `swarm_core::protocol::carried`).
    pub carried: u32,
}

/// One tracked write of this writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tracked {
    ts: Timestamp,
    /// A majority of the register's replicas held a word `>= ts` at some point.
    completed: bool,
    /// A write of an earlier incarnation of this writer id (resumed from its log):
    /// none of its batches can still land (module docs, rule 3).
    resumed: bool,
    /// The tracker's event count ([`SlotTracker::events`]) when this write was
    /// tracked or, once completed, when it completed: a check judges the write only
    /// if it started later (see [`SlotTracker::observe`]).
    known_at: u64,
}

/// Writes of one register kept inline: the steady state is one (the last completed
/// write), two while the next write is in flight.
const INLINE_WRITES: usize = 2;

/// This writer's writes on one register that are not known to be superseded: inline
/// up to [`INLINE_WRITES`], on the heap beyond (writes that failed pile up there
/// until a check frees them). Inline so that tracking a write costs no pointer chase
/// and no allocation.
#[derive(Clone, Debug)]
enum Writes {
    Inline(heapless::Vec<Tracked, INLINE_WRITES, u8>),
    Heap(Vec<Tracked>),
}

impl Writes {
    const fn new() -> Self {
        Self::Inline(heapless::Vec::new())
    }

    fn push(&mut self, write: Tracked) {
        match self {
            Self::Inline(inline) => {
                if let Err(write) = inline.push(write) {
                    let mut heap = Vec::with_capacity(2 * INLINE_WRITES);
                    heap.extend(inline.drain(..));
                    heap.push(write);
                    *self = Self::Heap(heap);
                }
            }
            Self::Heap(heap) => heap.push(write),
        }
    }

    /// Keeps the writes `keep` returns `true` for; back inline once they fit.
    fn retain_mut(&mut self, keep: impl FnMut(&mut Tracked) -> bool) {
        match self {
            Self::Inline(inline) => inline.retain_mut(keep),
            Self::Heap(heap) => {
                heap.retain_mut(keep);
                if heap.len() <= INLINE_WRITES {
                    *self = Self::Inline(heap.drain(..).collect());
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Inline(inline) => inline.is_empty(),
            Self::Heap(heap) => heap.is_empty(),
        }
    }
}

/// A register this writer has tracked writes on, as its table's index holds it.
#[derive(Clone, Debug)]
struct RegisterWrites {
    /// Its position in [`RegisterTable::order`].
    position: u32,
    writes: Writes,
}

/// A slot-recycling check in flight: metadata reads of a few registers' replicas.
#[derive(Debug)]
struct Check {
    started: Nanos,
    /// The tracker's event count when the check posted its reads.
    events: u64,
    /// Register identity ([`RegisterLoc::id`]), its replicas' maxima by position, and who answered.
    regs: Vec<(u64, [Tsp; MAX_REPLICAS], u16)>,
    /// (index in `regs`, replica position, ticket) still outstanding.
    outstanding: Vec<(usize, usize, Ticket)>,
}

/// Hashes a register identity (an address in every store so far, and a multiple of 8
/// for an owner tag to name it: its low bits are zero, so it cannot be its own hash)
/// by a folded multiply: the 128-bit product with
/// an odd constant, high half xor low half, mixes every input bit into both the low
/// bits (the bucket) and the top seven (the tag) `hashbrown` uses, in two
/// multiplications. Identities are not attacker-chosen (they come from this client's
/// own writes), so a keyed hash buys nothing here; this runs twice per write.
#[derive(Default)]
struct AddrHasher(u64);

impl AddrHasher {
    const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

    fn fold(x: u64) -> u64 {
        let product = u128::from(x) * u128::from(Self::MULTIPLIER);
        (product as u64) ^ ((product >> 64) as u64)
    }

    fn mix(&mut self, word: u64) {
        // Twice: once leaves the low bits weak for addresses that differ only in
        // high bits (huge strides).
        self.0 = Self::fold(Self::fold(self.0 ^ word));
    }
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, addr: u64) {
        self.mix(addr);
    }
}

/// The registers this writer has tracked writes on: a map from register identity
/// ([`RegisterLoc::id`]) to its writes (inline), so that a write's `track` costs one
/// hash probe and no pointer chase, and its `settle` a second probe of the same,
/// cached, bucket; and a dense vector of their locations (replicas and offsets), which
/// slot-recycling checks walk round robin by position. (A `BTreeMap` of 100,000 registers cost 6 % of a YCSB A run on shared
/// memory; a map to positions in a vector of heap-allocated writes, about three cache
/// misses per `track`.)
#[derive(Debug, Default)]
struct RegisterTable {
    writes: hashbrown::HashMap<u64, RegisterWrites, BuildHasherDefault<AddrHasher>>,
    order: Vec<RegisterLoc>,
}

impl RegisterTable {
    fn len(&self) -> usize {
        self.order.len()
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The writes on register `id` and its location.
    fn get_mut(&mut self, id: u64) -> Option<(&mut Writes, &RegisterLoc)> {
        let entry = self.writes.get_mut(&id)?;
        Some((&mut entry.writes, &self.order[entry.position as usize]))
    }

    /// The writes on register `id`, with none yet and `loc` recorded if it has none.
    fn get_or_insert(&mut self, id: u64, loc: impl FnOnce() -> RegisterLoc) -> &mut Writes {
        let order = &mut self.order;
        let entry = self.writes.entry(id).or_insert_with(|| {
            order.push(loc());
            RegisterWrites {
                position: (order.len() - 1) as u32,
                writes: Writes::new(),
            }
        });
        &mut entry.writes
    }

    /// Forgets register `id`; the last entry takes its position (a check in progress
    /// round robin may then skip that one entry until its next pass).
    fn remove(&mut self, id: u64) {
        let Some(removed) = self.writes.remove(&id) else {
            return;
        };
        let at = removed.position;
        self.order.swap_remove(at as usize);
        if let Some(moved) = self.order.get(at as usize)
            && let Some(entry) = self.writes.get_mut(&moved.id)
        {
            entry.position = at;
        }
    }

    /// The location of the entry at `position`.
    fn at(&self, position: usize) -> &RegisterLoc {
        &self.order[position]
    }
}

/// What a writer knows about the use of its log slots. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct SlotTracker {
    registers: RegisterTable,
    /// Superseded writes, with the fabric time their supersession was learned.
    limbo: VecDeque<(Nanos, Timestamp)>,
    recycled: u64,
    /// Position in `registers` the next slot-recycling check starts from.
    cursor: usize,
    check: Option<Check>,
    /// Fabric time the last check started.
    last_check: Option<Nanos>,
    /// Checks ended or abandoned so far.
    checks_ended: u64,
    /// Writes tracked and completed so far: orders what the tracker learns against
    /// the reads of a check.
    events: u64,
    /// With write-back guards ([`super::write_back_guard`]): writes whose grace is
    /// over, waiting for a guard check.
    unchecked: Vec<Timestamp>,
    /// The guard check in flight, judging the writes it took from `unchecked`.
    guard_check: Option<GuardCheck>,
    /// No guard check starts before this (after one that found a guard up).
    next_guard_check: Nanos,
    /// Writes a guard check cleared, and when their slots may be reused.
    cleared: VecDeque<(Nanos, Timestamp)>,
    /// Writes whose slots are otherwise free to reuse but may still receive a batch
    /// of this writer's own ([`OwnBatches`]): reused once it is done.
    landing: Vec<Timestamp>,
    /// When to look at `landing` again.
    landing_poll_at: Nanos,
    /// When to look at the guard check in flight again.
    guard_poll_at: Nanos,
    /// Before this fabric time a background tick has nothing to do
    /// ([`Self::quiet_until`]): no check in flight, no check to start, no limbo or
    /// cleared slot and no guard check due. A lower bound of when something is due:
    /// computed by [`Self::refresh_quiet`] after a tick, and lowered whenever
    /// something is queued between ticks (a register tracked while none was, a slot
    /// put in limbo, a check started, an expiry run outside a tick).
    quiet_until: Nanos,
}

/// The times that rule when a limbo slot goes back to the allocator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseTiming {
    /// The nodes holding the guard table: `0..table_nodes`
    /// ([`super::ProtocolConfig::table_nodes`]).
    pub(crate) table_nodes: usize,
    /// The grace after supersession ([`grace_ns`]).
    pub(crate) grace: Nanos,
    /// The delivery margin: a cleared slot is reused this long (on the writer's
    /// clock, [`real_on_clock_ns`]) after the guard check that cleared it.
    pub(crate) margin: Nanos,
    /// How long a guard check waits for every node before judging on a majority.
    pub(crate) timeout: Nanos,
    /// Least time between the starts of two guard checks (a check reads the whole
    /// guard table), and how often a waiting allocation looks at one in flight.
    pub(crate) recheck: Nanos,
}

impl SlotTracker {
    /// A write of `ts` to `reg` is about to be posted.
    pub(crate) fn track(&mut self, reg: &RegisterLoc, ts: Timestamp) {
        self.track_write(reg, ts, false);
    }

    /// A write of `ts` to `reg` by an earlier incarnation of this writer id, found in
    /// its log: its outcome is unknown, but none of its batches can land any more.
    pub(crate) fn track_resumed(&mut self, reg: &RegisterLoc, ts: Timestamp) {
        self.track_write(reg, ts, true);
    }

    fn track_write(&mut self, reg: &RegisterLoc, ts: Timestamp, resumed: bool) {
        if self.registers.is_empty() {
            // A check may be due as soon as there is something to check.
            self.quiet_until = 0;
        }
        let writes = self.registers.get_or_insert(reg.id, || reg.clone());
        self.events += 1;
        writes.push(Tracked {
            ts,
            completed: false,
            resumed,
            known_at: self.events,
        });
    }

    /// A majority of `reg`'s replicas holds a word `>= floor`, learned at `now`:
    /// this writer's writes below `floor` are superseded; a write equal to it is
    /// completed.
    pub(crate) fn settle(&mut self, id: u64, floor: Tsp, now: Nanos) {
        let Some((writes, _)) = self.registers.get_mut(id) else {
            return;
        };
        let floor = floor.ts();
        let was_empty = self.limbo.is_empty();
        let limbo = &mut self.limbo;
        self.events += 1;
        let events = self.events;
        writes.retain_mut(|w| {
            if w.ts < floor {
                limbo.push_back((now, w.ts));
                false
            } else {
                if w.ts == floor && !w.completed {
                    w.completed = true;
                    w.known_at = events;
                }
                true
            }
        });
        if writes.is_empty() {
            self.registers.remove(id);
        }
        self.queued_limbo(was_empty, now);
    }

    /// After a push to the limbo at `now`: a limbo that was empty has a new front,
    /// due a grace from `now` (the next tick computes when; a push behind the front
    /// does not move it).
    fn queued_limbo(&mut self, was_empty: bool, now: Nanos) {
        if was_empty && !self.limbo.is_empty() {
            self.quiet_until = self.quiet_until.min(now);
        }
    }

    /// A majority read of register `id`'s metadata words answered with `maxima` (by replica
    /// position; `answered` has bit `p` set for each reply), at `now` (rule 3), for a
    /// check that posted its reads when the event count was `events`.
    ///
    /// Only writes tracked (and, for the "below" half of the rule, completed) before
    /// the reads were posted are judged: replies read earlier say nothing about a
    /// later write. The register may even have been reset and reused in between, the
    /// reads showing the empty words of the reset: a write completed on it since
    /// would look like a write of the register's previous life, its slot recycled
    /// while it is the register's current value.
    fn observe(
        &mut self,
        id: u64,
        maxima: &[Tsp; MAX_REPLICAS],
        answered: u16,
        now: Nanos,
        events: u64,
    ) {
        let Some((writes, loc)) = self.registers.get_mut(id) else {
            return;
        };
        let n = loc.replicas.len();
        let q = loc.replicas.quorum();
        let replies = || {
            (0..n)
                .filter(|&p| answered & (1 << p) != 0)
                .map(|p| maxima[p])
        };
        if replies().count() < q {
            return;
        }
        let was_empty = self.limbo.is_empty();
        let limbo = &mut self.limbo;
        writes.retain_mut(|w| {
            if w.known_at > events {
                return true;
            }
            let above = replies().filter(|m| m.ts() > w.ts).count();
            let below = replies().filter(|m| m.is_empty() || m.ts() < w.ts).count();
            // A resumed write below every replica's words is on no replica.
            let nowhere = w.resumed && below == n;
            let superseded = above >= q || (w.completed && below >= q) || nowhere;
            if superseded {
                limbo.push_back((now, w.ts));
            }
            !superseded
        });
        if writes.is_empty() {
            self.registers.remove(id);
        }
        self.queued_limbo(was_empty, now);
    }

    /// Gives back to `slots` every limbo slot whose grace has passed at `now`; with
    /// write-back guards in `layout`, only once a guard check of `writer`'s slots
    /// found no guard naming them, a delivery margin after it
    /// ([`super::write_back_guard`]); and in any case only once no batch of this
    /// writer's own that writes into it can still land (`own`, [`OwnBatches::done`]).
    /// Never waits: a guard check runs across calls.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expire<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        slots: &mut SlotAllocator,
        layout: &Layout,
        writer: WriterId,
        now: Nanos,
        timing: &ReleaseTiming,
        own: &OwnBatches,
    ) {
        // What this moves along (to a guard check, to the cleared queue) may be
        // due at other times: the next tick computes when.
        self.quiet_until = 0;
        if !self.landing.is_empty() {
            let mut released = 0;
            self.landing.retain(|&ts| {
                let done = own.done(fabric, ts);
                if done {
                    slots.release(layout, ts);
                    released += 1;
                }
                !done
            });
            self.recycled += released;
        }
        let guarded = layout.guards().is_some();
        while let Some(&(at, ts)) = self.limbo.front() {
            if now < at.saturating_add(timing.grace) {
                break;
            }
            self.limbo.pop_front();
            if guarded {
                self.unchecked.push(ts);
            } else {
                self.release(fabric, slots, layout, ts, own);
            }
        }
        if guarded {
            self.poll_guards(fabric, layout, writer, now, timing);
            if self.guard_check.is_none()
                && !self.unchecked.is_empty()
                && now >= self.next_guard_check
            {
                // Judges only writes whose supersession it follows (module docs of
                // `write_back_guard`): those already here.
                let judged = core::mem::take(&mut self.unchecked);
                self.guard_check =
                    GuardCheck::start(fabric, layout, judged, now, timing.table_nodes);
                self.next_guard_check = now.saturating_add(timing.recheck);
                // A transport that completes at once answers it now.
                self.poll_guards(fabric, layout, writer, now, timing);
            }
            while let Some(&(at, ts)) = self.cleared.front() {
                if now < at {
                    break;
                }
                self.cleared.pop_front();
                self.release(fabric, slots, layout, ts, own);
            }
        }
        if !self.landing.is_empty() {
            self.landing_poll_at = now.saturating_add(timing.recheck);
        }
    }

    /// Gives the slot of `ts` back to `slots` if no batch of this writer's own can
    /// still land in it (`own`); otherwise keeps it in `landing`, for a later call.
    fn release<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        slots: &mut SlotAllocator,
        layout: &Layout,
        ts: Timestamp,
        own: &OwnBatches,
    ) {
        if own.done(fabric, ts) {
            slots.release(layout, ts);
            self.recycled += 1;
        } else {
            self.landing.push(ts);
        }
    }

    /// Collects the guard check in flight, if it is over.
    fn poll_guards<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        layout: &Layout,
        writer: WriterId,
        now: Nanos,
        timing: &ReleaseTiming,
    ) {
        let Some(check) = self.guard_check.as_mut() else {
            return;
        };
        let Some(verdict) = check.poll(fabric, layout, writer, now, timing.timeout) else {
            self.guard_poll_at = now.saturating_add(timing.recheck);
            return;
        };
        self.guard_check = None;
        let reusable_at = now.saturating_add(real_on_clock_ns(timing.margin));
        self.cleared
            .extend(verdict.clear.into_iter().map(|ts| (reusable_at, ts)));
        if !verdict.kept.is_empty() {
            tracing::debug!(
                writer = writer.get(),
                kept = verdict.kept.len(),
                "log slots kept: a reader's write-back guard names them"
            );
            self.unchecked.extend(verdict.kept);
        }
    }

    /// When a limbo slot may next come back (or a guard check be looked at again),
    /// if any is waiting.
    pub(crate) fn next_expiry(&self, timing: &ReleaseTiming) -> Option<Nanos> {
        let limbo = self
            .limbo
            .front()
            .map(|(at, _)| at.saturating_add(timing.grace));
        let cleared = self.cleared.front().map(|&(at, _)| at);
        let check = match &self.guard_check {
            Some(_) => Some(self.guard_poll_at),
            None => (!self.unchecked.is_empty()).then_some(self.next_guard_check),
        };
        let landing = (!self.landing.is_empty()).then_some(self.landing_poll_at);
        [limbo, cleared, check, landing].into_iter().flatten().min()
    }

    /// Before this fabric time a background tick ([`super::Client::recycle_slots_tick_at`])
    /// has nothing to do: it would collect no check (none in flight), start none
    /// (the last one started less than the interval ago, or nothing is tracked), and
    /// release no slot (none is due, [`Self::next_expiry`]). Never later than any of
    /// these is due; see the field's docs for what lowers it.
    pub(crate) fn quiet_until(&self) -> Nanos {
        self.quiet_until
    }

    /// One background tick at `now` ([`super::Client::recycle_slots_tick_at`]): with
    /// nothing due, one comparison; otherwise collects the check in flight, gives
    /// back the limbo slots that are due (to `slots`), starts a check of up to
    /// `budget` registers if the last started `interval` ago or more, and computes
    /// when the next tick has something to do.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tick<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        slots: &mut SlotAllocator,
        layout: &Layout,
        writer: WriterId,
        now: Nanos,
        timing: &ReleaseTiming,
        own: &OwnBatches,
        budget: usize,
        interval: Nanos,
    ) {
        if now < self.quiet_until {
            return;
        }
        self.poll_check(fabric, timing.timeout);
        if let Some(at) = self.next_expiry(timing)
            && now >= at
        {
            self.expire(fabric, slots, layout, writer, now, timing, own);
        }
        self.start_check(fabric, layout, budget, interval, now);
        self.refresh_quiet(timing, interval);
    }

    /// Computes [`Self::quiet_until`] after a tick: 0 with a check in flight (its
    /// replies are collected at the next tick), otherwise the earliest of the next
    /// expiry and the next check's start (`interval` after the last one; at once if
    /// none ran yet), or never with nothing queued and nothing tracked.
    fn refresh_quiet(&mut self, timing: &ReleaseTiming, interval: Nanos) {
        self.quiet_until = if self.check.is_some() {
            0
        } else {
            let check = if self.registers.is_empty() {
                Nanos::MAX
            } else {
                self.last_check
                    .map_or(0, |last| last.saturating_add(interval))
            };
            self.next_expiry(timing).map_or(check, |at| at.min(check))
        };
    }

    /// Slots superseded and not yet given back: in their grace, waiting for or in a
    /// guard check, cleared and waiting out the delivery margin, or waiting for a
    /// batch of their own write to complete.
    fn awaiting_release(&self) -> usize {
        self.limbo.len()
            + self.unchecked.len()
            + self.guard_check.as_ref().map_or(0, GuardCheck::judged)
            + self.cleared.len()
            + self.landing.len()
    }

    pub(crate) fn counters(&self, in_use: u32) -> SlotCounters {
        SlotCounters {
            in_use,
            in_limbo: self.awaiting_release() as u32,
            recycled: self.recycled,
            tracked_registers: self.registers.len() as u32,
            carried: 0,
        }
    }

    /// Starts a check of up to `budget` tracked registers, round robin from the
    /// cursor, unless one is in flight or the last started less than `interval` ago.
    /// Returns whether a check started.
    pub(crate) fn start_check<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        layout: &Layout,
        budget: usize,
        interval: Nanos,
        now: Nanos,
    ) -> bool {
        if self.check.is_some() || self.registers.is_empty() || budget == 0 {
            return false;
        }
        if let Some(last) = self.last_check
            && now < last.saturating_add(interval)
        {
            return false;
        }
        self.last_check = Some(now);
        // Its replies are collected at the next tick.
        self.quiet_until = 0;
        let len = self.registers.len();
        let start = self.cursor % len;
        let picked: Vec<RegisterLoc> = (0..budget.min(len))
            .map(|i| self.registers.at((start + i) % len).clone())
            .collect();
        self.cursor = (start + picked.len()) % len;
        let mut check = Check {
            started: now,
            events: self.events,
            regs: Vec::with_capacity(picked.len()),
            outstanding: Vec::new(),
        };
        for (i, loc) in picked.into_iter().enumerate() {
            check.regs.push((loc.id, [Tsp::EMPTY; MAX_REPLICAS], 0));
            for p in 0..loc.replicas.len() {
                let mut batch = Batch::new();
                // Cannot fail: the batch is empty.
                let _ = batch.push(inout::read_op(layout, loc.offset(p), false));
                let ticket = fabric.post(loc.replicas.node(p), batch);
                check.outstanding.push((i, p, ticket));
            }
        }
        self.check = Some(check);
        true
    }

    /// Collects the replies of the check in flight; once all arrived or `timeout`
    /// passed, applies what it learned (rule 3) and ends it. Returns whether a check
    /// ended.
    pub(crate) fn poll_check<F: Fabric + ?Sized>(&mut self, fabric: &F, timeout: Nanos) -> bool {
        let Some(check) = self.check.as_mut() else {
            return false;
        };
        let now = fabric.now();
        let mut i = 0;
        while i < check.outstanding.len() {
            let (r, p, ticket) = check.outstanding[i];
            match fabric.poll(ticket) {
                core::task::Poll::Pending => i += 1,
                core::task::Poll::Ready(result) => {
                    check.outstanding.swap_remove(i);
                    if let Ok(mut completion) = result {
                        let bytes = completion.take_read(0).unwrap_or_default();
                        let entry = &mut check.regs[r];
                        entry.1[p] = inout::max_word(&bytes);
                        entry.2 |= 1 << p;
                    }
                }
            }
        }
        if !check.outstanding.is_empty() && now < check.started.saturating_add(timeout) {
            return false;
        }
        let Some(check) = self.check.take() else {
            return false;
        };
        self.checks_ended += 1;
        for (_, _, ticket) in &check.outstanding {
            fabric.forget(*ticket);
        }
        // Stamped now, after every reply it uses was read on its node.
        for (id, maxima, answered) in &check.regs {
            self.observe(*id, maxima, *answered, now, check.events);
        }
        true
    }

    /// Whether a check is in flight.
    pub(crate) fn checking(&self) -> bool {
        self.check.is_some()
    }

    /// Checks ended (or abandoned) so far: at most one is in flight, so the first
    /// check to end after one started is that one.
    pub(crate) fn checks_ended(&self) -> u64 {
        self.checks_ended
    }

    /// Abandons the checks in flight (the client is going away).
    pub(crate) fn cancel_check<F: Fabric + ?Sized>(&mut self, fabric: &F) {
        if let Some(check) = self.check.take() {
            self.checks_ended += 1;
            for (_, _, ticket) in check.outstanding {
                fabric.forget(ticket);
            }
        }
        if let Some(check) = self.guard_check.take() {
            check.cancel(fabric);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::Flag;
    use crate::fabric::NodeId;
    use crate::protocol::register::Replicas;

    fn ts(t: u64) -> Timestamp {
        Timestamp::new(t, WriterId::new(1).unwrap()).unwrap()
    }

    fn reg() -> RegisterLoc {
        RegisterLoc::at(4096, Replicas::all(3, 0).unwrap())
    }

    /// Four writers' logs of 16 slots and a write-back guard table.
    fn guarded_layout() -> Layout {
        Layout::builder()
            .writers(4)
            .slots_per_writer(16)
            .log_base(1 << 16)
            .write_back_guards(2048, 8)
            .build()
            .unwrap()
    }

    fn layout() -> Layout {
        Layout::builder()
            .writers(2)
            .slots_per_writer(16)
            .build()
            .unwrap()
    }

    /// Register `id`'s location: its replicas at offsets that differ per node and
    /// from the identity, as a chunk placed per node would have them.
    fn loc_of(id: u64) -> RegisterLoc {
        let replicas = Replicas::all(3, id / 512).unwrap();
        let offsets: alloc::vec::Vec<(NodeId, u64)> = (0..3u16)
            .map(|n| (NodeId(n), 1 << 20 | (id + 4096 * u64::from(n))))
            .collect();
        RegisterLoc::placed(id, replicas, &offsets).unwrap()
    }

    /// Aligned register addresses spread over buckets (low bits) and tags (top seven
    /// bits) like random numbers would: a weak hash would turn every probe into a
    /// scan of a long run.
    #[test]
    fn register_addresses_hash_evenly() {
        let hash = |addr: u64| {
            let mut h = AddrHasher::default();
            h.write_u64(addr);
            h.finish()
        };
        for stride in [64u64, 512, 4096, 1 << 20] {
            let n = 1 << 12;
            let mut buckets = alloc::collections::BTreeSet::new();
            let mut tags = alloc::collections::BTreeSet::new();
            for i in 0..n {
                let h = hash(4096 + i * stride);
                buckets.insert(h & (n - 1));
                tags.insert(h >> 57);
            }
            // 4096 random values in 4096 buckets fill about 63 % of them.
            assert!(
                buckets.len() > 2400,
                "stride {stride}: {} buckets",
                buckets.len()
            );
            assert_eq!(tags.len(), 128, "stride {stride}");
        }
    }

    proptest::proptest! {
        /// The table agrees with a map under any sequence of inserts and removals,
        /// and a round robin over its positions visits every register.
        #[test]
        fn the_register_table_is_a_map_with_positions(
            ops in proptest::collection::vec((proptest::bool::ANY, 0u64..40), 0..200),
        ) {
            let mut table = RegisterTable::default();
            let mut model = alloc::collections::BTreeSet::new();
            for (insert, key) in ops {
                let addr = 4096 + key * 512;
                if insert {
                    table.get_or_insert(addr, || loc_of(addr)).push(Tracked {
                        ts: ts(key + 1),
                        completed: false,
                        resumed: false,
                        known_at: 0,
                    });
                    model.insert(addr);
                } else {
                    table.remove(addr);
                    model.remove(&addr);
                }
                proptest::prop_assert_eq!(table.len(), model.len());
                for &addr in &model {
                    let (writes, loc) = table.get_mut(addr).expect("tracked");
                    proptest::prop_assert!(!writes.is_empty());
                    proptest::prop_assert_eq!(loc, &loc_of(addr));
                }
                let visited: alloc::collections::BTreeSet<u64> =
                    (0..table.len()).map(|i| table.at(i).id).collect();
                proptest::prop_assert_eq!(&visited, &model);
            }
        }
    }

    proptest::proptest! {
        /// A register's writes, inline or spilled to the heap, agree with a vector
        /// under any sequence of pushes and retains.
        #[test]
        fn writes_are_a_vector_inline_or_not(
            ops in proptest::collection::vec((proptest::bool::ANY, 0u64..8), 0..100),
        ) {
            let mut writes = Writes::new();
            let mut model: Vec<u64> = Vec::new();
            for (push, t) in ops {
                if push {
                    writes.push(Tracked { ts: ts(t + 1), completed: false, resumed: false, known_at: 0 });
                    model.push(t + 1);
                } else {
                    // Drop the writes at or below `t`, as a settle does.
                    writes.retain_mut(|w| w.ts.ticks() > t);
                    model.retain(|&m| m > t);
                }
                proptest::prop_assert_eq!(writes.is_empty(), model.is_empty());
                let mut seen = Vec::new();
                writes.retain_mut(|w| {
                    seen.push(w.ts.ticks());
                    true
                });
                proptest::prop_assert_eq!(&seen, &model);
                proptest::prop_assert_eq!(
                    matches!(writes, Writes::Inline(_)),
                    model.len() <= INLINE_WRITES
                );
            }
        }
    }

    /// The earliest time a tick has something to do, from the tracker's state as
    /// [`SlotTracker::tick`] reads it: what [`SlotTracker::quiet_until`] must never
    /// exceed.
    fn due(t: &SlotTracker, timing: &ReleaseTiming, interval: Nanos) -> Nanos {
        if t.check.is_some() {
            return 0;
        }
        let check = if t.registers.is_empty() {
            Nanos::MAX
        } else {
            t.last_check.map_or(0, |last| last.saturating_add(interval))
        };
        t.next_expiry(timing).map_or(check, |at| at.min(check))
    }

    proptest::proptest! {
        /// Whatever happens between ticks (writes tracked and settled, checks run
        /// and expiries by a waiting allocation, guard words raised and lowered), a
        /// tick skipped because it is before [`SlotTracker::quiet_until`] had
        /// nothing to do: no check to collect or start, no slot to give back.
        #[test]
        fn a_quiet_tick_has_nothing_to_do(
            ops in proptest::collection::vec((0u8..8, 0u64..40), 0..300),
            interval in proptest::prop_oneof![proptest::strategy::Just(3u64), proptest::strategy::Just(500)],
            (margin, recheck) in proptest::prop_oneof![
                proptest::strategy::Just((8u64, 5u64)),
                proptest::strategy::Just((1, 40)),
            ],
        ) {
            let layout = guarded_layout();
            let cluster = crate::MemCluster::new(3, 2 << 20);
            let fabric = cluster.client();
            let me = WriterId::new(1).unwrap();
            let mut slots = SlotAllocator::new(&layout, me).unwrap();
            let mut t = SlotTracker::default();
            let timing = ReleaseTiming { table_nodes: 3, grace: 50, margin, timeout: 10, recheck };
            let regs: Vec<RegisterLoc> = (0..3u64)
                .map(|i| RegisterLoc::at(4096 + i * 512, Replicas::all(3, i).unwrap()))
                .collect();
            let mut last: Vec<Option<Timestamp>> = alloc::vec![None; regs.len()];
            let mut now = 0;
            for (op, x) in ops {
                let r = (x % 3) as usize;
                match op {
                    0 | 1 => now += x,
                    2 => {
                        let floor = last[r].map_or(1, |ts| ts.ticks() + 1);
                        if let Ok(ts) = slots.allocate(&layout, floor) {
                            t.track(&regs[r], ts);
                            last[r] = Some(ts);
                        }
                    }
                    3 => {
                        // The last write on `r` completed, or a tombstone landed.
                        let floor = match last[r] {
                            Some(ts) if x % 4 != 0 => Tsp::new(ts, Flag::Verified),
                            _ => Tsp::new(Timestamp::tombstone(me), Flag::Verified),
                        };
                        t.settle(regs[r].id, floor, now);
                    }
                    4 => {
                        t.tick(&fabric, &mut slots, &layout, me, now, &timing, &OwnBatches::default(), 2, interval);
                    }
                    5 => {
                        // A waiting allocation's expiry, outside any tick.
                        t.expire(&fabric, &mut slots, &layout, me, now, &timing, &OwnBatches::default());
                    }
                    6 => {
                        // A whole check, as `Client::check_tracked` runs it.
                        t.poll_check(&fabric, timing.timeout);
                        t.start_check(&fabric, &layout, usize::MAX, 0, now);
                        if x % 2 == 0 {
                            t.poll_check(&fabric, timing.timeout);
                        }
                    }
                    _ => {
                        // Another writer's guard names one of this writer's writes,
                        // or goes down.
                        let word = last[r].filter(|_| x % 2 == 0).map_or(0, |ts| Tsp::new(ts, Flag::Guessed).word());
                        for node in 0..2 {
                            let ticket = fabric.post(NodeId(node), Batch::write(2048 + 16, word.to_le_bytes().to_vec()));
                            fabric.forget(ticket);
                        }
                    }
                }
                let due = due(&t, &timing, interval);
                proptest::prop_assert!(
                    t.quiet_until() <= due,
                    "quiet until {} but something is due at {due} (now {now}, op {op})",
                    t.quiet_until()
                );
            }
        }
    }

    #[test]
    fn checks_walk_every_tracked_register_round_robin() {
        let layout = Layout::builder()
            .writers(2)
            .slots_per_writer(16)
            .log_base(1 << 20)
            .build()
            .unwrap();
        let cluster = crate::MemCluster::new(3, 2 << 20);
        let fabric = cluster.client();
        let mut t = SlotTracker::default();
        for i in 0..10u64 {
            let reg = RegisterLoc::at(4096 + i * 512, Replicas::all(3, i).unwrap());
            t.track(&reg, ts(i + 1));
        }
        let mut seen = alloc::collections::BTreeMap::<u64, u32>::new();
        for round in 0..5u64 {
            assert!(t.start_check(&fabric, &layout, 4, 0, round));
            let check = t.check.as_ref().unwrap();
            for (addr, _, _) in &check.regs {
                *seen.entry(*addr).or_default() += 1;
            }
            assert!(t.poll_check(&fabric, u64::MAX));
        }
        // 5 checks of 4 out of 10 registers: each visited twice.
        assert_eq!(seen.len(), 10);
        assert!(seen.values().all(|&n| n == 2), "{seen:?}");
    }

    #[test]
    fn the_grace_covers_the_fence_drift_and_delivery() {
        // 1 s · 9/7 = 1,285,714,285.7 up, plus 10 ms · 9/8.
        assert_eq!(grace_ns(1_000_000_000), 1_285_714_286 + 11_250_000);
        assert_eq!(grace_with_margin_ns(700, 80), 900 + 90);
        assert_eq!(skewed_ns(7), 9);
        assert_eq!(skewed_ns(1), 2, "rounded up");
        assert_eq!(real_on_clock_ns(8), 9);
        assert_eq!(skewed_ns(Nanos::MAX), Nanos::MAX, "saturates");
        assert_eq!(grace_ns(Nanos::MAX), Nanos::MAX, "saturates");
    }

    #[test]
    fn a_completed_later_write_supersedes_earlier_ones_after_the_grace() {
        let layout = layout();
        let mut slots = SlotAllocator::new(&layout, WriterId::new(1).unwrap()).unwrap();
        let mut t = SlotTracker::default();
        let a = slots.allocate(&layout, 10).unwrap();
        t.track(&reg(), a);
        let b = slots.allocate(&layout, a.ticks() + 1).unwrap();
        t.track(&reg(), b);
        assert_eq!(slots.in_use(), 2);
        t.settle(4096, Tsp::new(b, Flag::Guessed), 100);
        assert_eq!(t.counters(slots.in_use()).in_limbo, 1);
        let fabric = crate::MemCluster::new(3, 2 << 20).client();
        let me = WriterId::new(1).unwrap();
        let timing = ReleaseTiming {
            table_nodes: 3,
            grace: 50,
            margin: 0,
            timeout: 10,
            recheck: 5,
        };
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            100 + 49,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(slots.in_use(), 2, "not before the grace");
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            150,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(slots.in_use(), 1);
        assert_eq!(t.counters(1).recycled, 1);
        assert_eq!(t.counters(1).tracked_registers, 1, "b is live");
        // A tombstone supersedes everything.
        t.settle(
            4096,
            Tsp::new(Timestamp::tombstone(b.writer()), Flag::Verified),
            200,
        );
        assert_eq!(t.counters(1).tracked_registers, 0);
        assert_eq!(t.next_expiry(&timing), Some(250));
    }

    #[test]
    fn with_guards_a_slot_comes_back_only_unnamed_and_a_margin_after_the_check() {
        let layout = guarded_layout();
        let cluster = crate::MemCluster::new(3, 2 << 20);
        let fabric = cluster.client();
        let me = WriterId::new(1).unwrap();
        let mut slots = SlotAllocator::new(&layout, me).unwrap();
        let mut t = SlotTracker::default();
        let a = slots.allocate(&layout, 10).unwrap();
        let b = slots.allocate(&layout, a.ticks() + 1).unwrap();
        t.track(&reg(), a);
        t.track(&reg(), b);
        let in_use = slots.in_use();
        let guard = |node: u16, word: u64| {
            let ticket = fabric.post(
                NodeId(node),
                Batch::write(2048 + 16, word.to_le_bytes().to_vec()),
            );
            fabric.forget(ticket);
        };
        // Writer 2's guard names `a` on a majority; `b` is named nowhere.
        for node in [0, 1] {
            guard(node, Tsp::new(a, Flag::Guessed).word());
        }
        t.settle(
            4096,
            Tsp::new(Timestamp::tombstone(me), Flag::Verified),
            100,
        );
        let timing = ReleaseTiming {
            table_nodes: 3,
            grace: 50,
            margin: 8,
            timeout: 10,
            recheck: 5,
        };
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            149,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(
            t.counters(slots.in_use()).in_limbo,
            2,
            "not before the grace"
        );
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            150,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(
            slots.in_use(),
            in_use,
            "not before the margin after the check"
        );
        assert_eq!(
            t.next_expiry(&timing),
            Some(150 + 5),
            "a is looked at again first; b comes back at 150 + 9 (the margin on this clock)"
        );
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            158,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(
            slots.in_use(),
            in_use,
            "not before the margin after the check"
        );
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            159,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(slots.in_use(), in_use - 1, "b is back, a is named");
        // The guard goes down on one node only: a check reads a majority, and the
        // node it reads first still names `a`.
        guard(0, 0);
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            170,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(
            t.counters(slots.in_use()).in_limbo,
            1,
            "a is still named on node 1"
        );
        guard(1, 0);
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            180,
            &timing,
            &OwnBatches::default(),
        );
        t.expire(
            &fabric,
            &mut slots,
            &layout,
            me,
            190,
            &timing,
            &OwnBatches::default(),
        );
        assert_eq!(
            slots.in_use(),
            in_use - 2,
            "a is back once no guard names it"
        );
        assert_eq!(t.counters(slots.in_use()).recycled, 2);
        assert_eq!(t.next_expiry(&timing), None);
    }

    #[test]
    fn a_check_frees_writes_a_majority_is_above_and_completed_writes_of_a_reset() {
        let mut t = SlotTracker::default();
        // A write that failed midway: tracked, not completed.
        t.track(&reg(), ts(10));
        let word = |x| Tsp::new(ts(x), Flag::Verified);
        let mut maxima = [Tsp::EMPTY; MAX_REPLICAS];
        // Only one replica above 10: not enough.
        maxima[0] = word(15);
        maxima[1] = word(5);
        t.observe(4096, &maxima, 0b011, 2, t.events);
        assert_eq!(t.limbo.len(), 0);
        // An incomplete write is not freed by words below it on a majority (it may
        // sit on a minority that a reader's majority includes).
        maxima[0] = word(5);
        t.observe(4096, &maxima, 0b011, 2, t.events);
        assert_eq!(t.limbo.len(), 0);
        // A minority of answers decides nothing.
        maxima[0] = word(15);
        maxima[1] = word(15);
        t.observe(4096, &maxima, 0b001, 2, t.events);
        assert_eq!(t.limbo.len(), 0);
        t.observe(4096, &maxima, 0b011, 3, t.events);
        assert_eq!(t.limbo.len(), 1, "10 superseded");
        assert!(t.registers.is_empty());
        // A completed write: words below it on a majority mean a reset register.
        t.track(&reg(), ts(20));
        t.settle(4096, word(20), 4);
        maxima[1] = word(20);
        t.observe(4096, &maxima, 0b011, 5, t.events);
        assert_eq!(t.limbo.len(), 1, "20 is live: a majority holds 20 or more");
        maxima[0] = Tsp::EMPTY;
        maxima[1] = word(3);
        t.observe(4096, &maxima, 0b011, 6, t.events);
        assert_eq!(t.limbo.len(), 2);
        assert!(t.registers.is_empty());
    }

    /// A write resumed from an earlier incarnation, of unknown outcome, is freed by
    /// words below it on every replica (its register was reset), never on fewer;
    /// this incarnation's own unfinished write is not (it may still land).
    #[test]
    fn a_resumed_write_is_freed_once_no_replica_can_hold_it() {
        let word = |x| Tsp::new(ts(x), Flag::Verified);
        let mut t = SlotTracker::default();
        t.track_resumed(&reg(), ts(10));
        t.track(&reg(), ts(11));
        let mut maxima = [Tsp::EMPTY; MAX_REPLICAS];
        maxima[1] = word(3);
        // Two replicas of three show nothing above 10: the third may hold 10.
        t.observe(4096, &maxima, 0b011, 1, t.events);
        assert_eq!(t.limbo.len(), 0);
        // One replica holds 10 itself.
        maxima[2] = word(10);
        t.observe(4096, &maxima, 0b111, 2, t.events);
        assert_eq!(t.limbo.len(), 0);
        // Every replica reset (or below): 10 is nowhere; 11, still this
        // incarnation's and unfinished, stays.
        maxima[2] = Tsp::EMPTY;
        t.observe(4096, &maxima, 0b111, 3, t.events);
        assert_eq!(
            t.limbo.iter().map(|(_, w)| *w).collect::<Vec<_>>(),
            [ts(10)]
        );
        assert_eq!(t.counters(0).tracked_registers, 1, "11 is still tracked");
    }

    /// A check whose reads were posted before a write was tracked (or completed)
    /// says nothing about it: here the reads saw the empty words of a register reset
    /// for reuse, and the writer then wrote the register's new value.
    #[test]
    fn a_check_posted_before_a_write_does_not_judge_it() {
        let mut t = SlotTracker::default();
        let word = |x| Tsp::new(ts(x), Flag::Verified);
        // The register's previous life.
        t.track(&reg(), ts(10));
        t.settle(4096, word(10), 1);
        // A check posts its reads now: the register was reset, its words are empty.
        let posted = t.events;
        let empty = [Tsp::EMPTY; MAX_REPLICAS];
        // Its new life: this writer's write of 20 completes (and supersedes 10).
        t.track(&reg(), ts(20));
        t.settle(4096, word(20), 2);
        assert_eq!(t.limbo.len(), 1, "10 superseded");
        t.observe(4096, &empty, 0b111, 3, posted);
        assert_eq!(
            t.limbo.len(),
            1,
            "20 is the register's value: the reads predate it"
        );
        // The same replies from a check posted after 20 completed mean a reset.
        t.observe(4096, &empty, 0b111, 4, t.events);
        assert_eq!(t.limbo.len(), 2);
    }
}
