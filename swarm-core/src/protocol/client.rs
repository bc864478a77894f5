//! A protocol client: one per client thread.

use alloc::vec::Vec;
use core::cell::RefCell;

use crate::clock::Clock;
use crate::encoding::{Timestamp, WriterId};
use crate::fabric::{Fabric, Nanos, NodeId};
use alloc::sync::Arc;

use super::Suspicion;

use super::RegisterLoc;
use crate::layout::{Layout, SlotAllocator};

use super::SwarmError;
use super::guess::TimestampGuesser;

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
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        Self {
            slow_after_ns: 50_000,
            suspect_ns: 100_000_000,
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
}

/// Writer-local state: which log slots are in use, and the timestamp guesser.
#[derive(Debug)]
pub(crate) struct WriterState {
    pub(crate) slots: SlotAllocator,
    pub(crate) guesser: TimestampGuesser,
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
    /// Addresses of the registers with a write or delete of this client in flight.
    writing: RefCell<Vec<u64>>,
}

/// A register's write slot of one client, held by the write or delete in flight on it
/// (see [`Client`]); given back on drop, also when the operation is dropped midway.
#[derive(Debug)]
pub(crate) struct WriteSlot<'a> {
    writing: &'a RefCell<Vec<u64>>,
    addr: u64,
}

impl Drop for WriteSlot<'_> {
    fn drop(&mut self) {
        let mut writing = self.writing.borrow_mut();
        if let Some(i) = writing.iter().position(|&a| a == self.addr) {
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
            }),
            suspicion: Arc::new(Suspicion::new(config.suspect_ns)),
            writing: RefCell::new(Vec::new()),
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

    /// Log slots in use by this writer.
    pub fn slots_in_use(&self) -> u32 {
        self.state.borrow().slots.in_use()
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

    /// Waits until no other write or delete of this client is in flight on `reg`,
    /// then holds its write slot until the returned guard is dropped.
    pub(crate) async fn write_slot(&self, reg: &RegisterLoc) -> WriteSlot<'_> {
        core::future::poll_fn(|cx| {
            let mut writing = self.writing.borrow_mut();
            if writing.contains(&reg.addr) {
                // Busy re-poll, as everywhere in this crate (see `crate::exec`).
                cx.waker().wake_by_ref();
                return core::task::Poll::Pending;
            }
            writing.push(reg.addr);
            core::task::Poll::Ready(())
        })
        .await;
        WriteSlot {
            writing: &self.writing,
            addr: reg.addr,
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
        let WriterState { slots, guesser } = &mut *state;
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
