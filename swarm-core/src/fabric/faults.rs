//! Fault injection around any fabric, in the manner of smoltcp's `FaultInjector`: a
//! wrapper that is itself a [`Fabric`], so that tests, benchmarks and the `swarm bench`
//! harness inject the same faults into every transport (the in-process fabric, shared
//! memory, RDMA) instead of each transport carrying its own knobs.
//!
//! * [`FailNodes`] makes chosen memory nodes crashed *for this client* (SWARM §2.1: a
//!   crashed node stops answering): batches posted to them are not executed and never
//!   complete, and batches in flight to them when they fail are lost too. The protocol
//!   waits for a majority, never for all, so a crashed minority costs nothing. A node
//!   can also crash the way an RDMA memory node's crash looks to its clients
//!   ([`Crash::Erroring`]): its batches fail at once with
//!   [`FabricError::NodeFailed`].
//! * [`EmulatedRtt`] delivers every completion a fixed roundtrip time after its batch
//!   was posted, on the inner fabric's clock ([`Fabric::now`]), so that a fabric that
//!   completes batches at once (shared memory) behaves like one with network latency:
//!   batches posted to several nodes in one protocol step overlap and cost one
//!   roundtrip together, as on RDMA. The batch's effects are visible at once (on a real
//!   fabric they land about half a roundtrip after posting).
//!
//! Both forward [`Fabric::submit`]: a batch the inner fabric completed at once comes
//! back at once through [`FailNodes`] (unless its node failed), and through
//! [`EmulatedRtt`] when there is no roundtrip to emulate (`rtt` 0) or it was refused
//! locally; otherwise it gets a ticket that falls due a roundtrip after posting.
//!
//! Put [`FailNodes`] outside [`EmulatedRtt`] (`FailNodes<EmulatedRtt<F>>`) so that a
//! batch waiting for its roundtrip when its node fails is lost, as on a real network.

use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::task::Poll;

use super::{
    Batch, Completion, Fabric, FabricError, FailureCause, InPlaceReply, Nanos, NodeId, Submitted,
    Ticket,
};

/// Tickets of batches posted to a failed node carry this bit; the inner fabric's
/// tickets never do (see [`FailNodes`]).
const LOST: u32 = 1 << 31;

/// How a node crashed by [`FailNodes::fail_node_as`] looks to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// It stops answering: its batches, posted or in flight, never complete (a
    /// shared-memory node, or a network that drops everything).
    Silent,
    /// Its batches, posted or in flight, fail at once with
    /// [`FabricError::NodeFailed`] (cause [`FailureCause::Crashed`]), as the RDMA
    /// transport fails those of a node whose queue pair broke.
    Erroring,
}

/// A ticket of [`FailNodes`]' own, for a batch posted to a failed node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// The number is free.
    Free,
    /// The batch never completes.
    Lost,
    /// The batch failed: its error is due at the next poll.
    Failed(NodeId),
}

/// A fabric on which chosen nodes are crashed for this client; see the module docs.
///
/// Tickets of batches that reach the inner fabric are the inner fabric's own, which
/// keeps the wrapper free on the fast path; tickets of batches posted to a failed
/// node are numbered apart, with the top bit set (an inner fabric never has 2^31
/// batches in flight).
#[derive(Debug)]
pub struct FailNodes<F> {
    inner: F,
    failed: RefCell<Vec<Option<Crash>>>,
    /// Whether any node failed: until then, polls go straight to the inner fabric.
    any_failed: Cell<bool>,
    /// Node of each inner ticket, indexed by ticket number (a batch in flight to a
    /// node that fails is lost too).
    node_of: RefCell<Vec<u16>>,
    /// Batches posted to failed nodes and not polled to an error or forgotten yet,
    /// by ticket number without [`LOST`].
    held: RefCell<Vec<Held>>,
}

impl<F: Fabric> FailNodes<F> {
    /// Wraps `inner`, with every node alive.
    pub fn new(inner: F) -> Self {
        let nodes = inner.node_count();
        Self {
            inner,
            failed: RefCell::new(alloc::vec![None; nodes]),
            any_failed: Cell::new(false),
            node_of: RefCell::new(Vec::new()),
            held: RefCell::new(Vec::new()),
        }
    }

    /// Crashes `node` for this client, silently: batches posted to it from now on
    /// never complete, nor do those still in flight. Unknown nodes are ignored.
    pub fn fail_node(&self, node: NodeId) {
        self.fail_node_as(node, Crash::Silent);
    }

    /// Crashes `node` for this client the way `crash` says: batches posted to it
    /// from now on, and those still in flight, never complete ([`Crash::Silent`]) or
    /// fail at once ([`Crash::Erroring`]). Unknown nodes are ignored.
    pub fn fail_node_as(&self, node: NodeId, crash: Crash) {
        if let Some(state) = self.failed.borrow_mut().get_mut(node.index()) {
            *state = Some(crash);
            self.any_failed.set(true);
        }
    }

    /// Brings `node` back for this client: batches posted to it from now on reach it
    /// again (a network partition that healed). Batches posted while it was down stay
    /// as they were: a silent crash's never complete. Unknown nodes are ignored.
    pub fn recover_node(&self, node: NodeId) {
        if let Some(state) = self.failed.borrow_mut().get_mut(node.index()) {
            *state = None;
        }
    }

    /// Whether `node` was crashed with [`FailNodes::fail_node`] or
    /// [`FailNodes::fail_node_as`].
    pub fn is_failed(&self, node: NodeId) -> bool {
        self.crash_of(node).is_some()
    }

    /// How `node` crashed, if it did.
    fn crash_of(&self, node: NodeId) -> Option<Crash> {
        self.failed.borrow().get(node.index()).copied().flatten()
    }

    /// The wrapped fabric.
    pub fn inner(&self) -> &F {
        &self.inner
    }
}

impl<F: Fabric> FailNodes<F> {
    /// A ticket for a batch posted to `node`, which crashed as `crash` says.
    fn held_ticket(&self, node: NodeId, crash: Crash) -> Ticket {
        let mut held = self.held.borrow_mut();
        let index = match held.iter().position(|&h| h == Held::Free) {
            Some(free) => free,
            None => {
                held.push(Held::Free);
                held.len() - 1
            }
        };
        held[index] = match crash {
            Crash::Silent => Held::Lost,
            Crash::Erroring => Held::Failed(node),
        };
        Ticket(LOST | index as u32)
    }

    /// Remembers the node of an inner ticket (a batch in flight to a node that fails
    /// is lost too).
    fn track(&self, node: NodeId, ticket: Ticket) -> Ticket {
        debug_assert!(ticket.0 & LOST == 0, "inner fabric ticket {ticket:?}");
        let mut node_of = self.node_of.borrow_mut();
        let index = ticket.0 as usize;
        if node_of.len() <= index {
            node_of.resize(index + 1, 0);
        }
        node_of[index] = node.0;
        ticket
    }
}

impl<F: Fabric> Fabric for FailNodes<F> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.any_failed.get()
            && let Some(crash) = self.crash_of(node)
        {
            return self.held_ticket(node, crash);
        }
        let ticket = self.inner.post(node, batch);
        self.track(node, ticket)
    }

    fn give_back(&self, buffer: alloc::vec::Vec<u8>) {
        self.inner.give_back(buffer);
    }

    fn take_buffer(&self, len: usize) -> alloc::vec::Vec<u8> {
        self.inner.take_buffer(len)
    }

    /// As the inner fabric: a batch to a crashed node is held back (a ticket) or
    /// failed, which the steps that rely on this take their general path for.
    fn completes_in_submit(&self) -> bool {
        self.inner.completes_in_submit()
    }

    /// As the inner fabric, except on a crashed node: `None`, so that the read goes
    /// through [`Fabric::submit`], which holds it back or fails it.
    #[inline]
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        if self.any_failed.get() && self.crash_of(node).is_some() {
            return None;
        }
        self.inner.read_direct(node, addr, out)
    }

    /// As the inner fabric, except on a crashed node: `None`, so that the batch goes
    /// through [`Fabric::submit`], which holds it back or fails it.
    #[inline]
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        if self.any_failed.get() && self.crash_of(node).is_some() {
            return None;
        }
        self.inner.submit_in_place(node, batch, reply)
    }

    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        self.inner.prefetch(node, addr, len);
    }

    #[inline]
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        // A failed node executes nothing.
        if !(self.any_failed.get() && self.is_failed(node)) {
            self.inner.post_detached(node, batch);
        }
    }

    #[inline]
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        if self.any_failed.get()
            && let Some(crash) = self.crash_of(node)
        {
            return match crash {
                Crash::Silent => Submitted::Posted(self.held_ticket(node, crash)),
                Crash::Erroring => Submitted::Failed(crashed(node)),
            };
        }
        match self.inner.submit(node, batch, reply) {
            Submitted::Posted(ticket) => Submitted::Posted(self.track(node, ticket)),
            // Completed before the node could fail: as a completion that arrived.
            done_or_failed => done_or_failed,
        }
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if !self.any_failed.get() {
            return self.inner.poll(ticket);
        }
        if ticket.0 & LOST != 0 {
            let mut held = self.held.borrow_mut();
            let unknown = Poll::Ready(Err(FabricError::UnknownTicket(ticket.0)));
            let Some(h) = held.get_mut((ticket.0 & !LOST) as usize) else {
                return unknown;
            };
            return match *h {
                Held::Lost => Poll::Pending,
                Held::Failed(node) => {
                    *h = Held::Free;
                    Poll::Ready(Err(crashed(node)))
                }
                Held::Free => unknown,
            };
        }
        let node = self
            .node_of
            .borrow()
            .get(ticket.0 as usize)
            .map(|&n| NodeId(n));
        match node.map(|node| (node, self.crash_of(node))) {
            Some((_, Some(Crash::Silent))) => Poll::Pending,
            // In flight when its node crashed: it fails, and the inner fabric's
            // result, if it ever comes, is dropped.
            Some((node, Some(Crash::Erroring))) => {
                self.inner.forget(ticket);
                Poll::Ready(Err(crashed(node)))
            }
            Some((_, None)) | None => self.inner.poll(ticket),
        }
    }

    /// A batch held for a node crashed silently never reached the inner fabric: it
    /// never executes. A batch in flight to it when it crashed is as the inner
    /// fabric says.
    fn settled(&self, ticket: Ticket) -> bool {
        if ticket.0 & LOST != 0 {
            return true;
        }
        self.inner.settled(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        if ticket.0 & LOST != 0 {
            if let Some(h) = self.held.borrow_mut().get_mut((ticket.0 & !LOST) as usize) {
                *h = Held::Free;
            }
            return;
        }
        self.inner.forget(ticket);
    }

    fn progress(&self) -> bool {
        // Batches of failed nodes never complete: only the inner fabric can make
        // progress, and when it cannot, whatever is left waits on failed nodes.
        self.inner.progress()
    }

    fn now(&self) -> Nanos {
        self.inner.now()
    }

    fn recent_now(&self) -> Nanos {
        self.inner.recent_now()
    }

    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline);
    }

    fn yielded(&self) {
        self.inner.yielded();
    }

    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.admit(node, incarnation)
    }

    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.memory_lost(node, incarnation)
    }

    fn fence_owner(&self, fence: super::OwnerFence) -> usize {
        self.inner.fence_owner(fence)
    }

    fn revoke_owner(&self, lease_word: u64, floor: u64) -> super::Revocation {
        self.inner.revoke_owner(lease_word, floor)
    }
}

/// The error of a batch to a node crashed with [`Crash::Erroring`].
fn crashed(node: NodeId) -> FabricError {
    FabricError::NodeFailed {
        node,
        cause: FailureCause::Crashed,
    }
}

/// A fabric whose completions arrive a fixed roundtrip time after posting; see the
/// module docs. Errors the inner fabric reports at once (a batch refused before it
/// was sent: out of bounds, misaligned, no such node) are delivered at once, as
/// transports do.
///
/// With a roundtrip to emulate, tickets are the wrapper's own (the inner fabric may
/// reuse a ticket number as soon as it delivered the result, which the wrapper holds
/// back until the roundtrip elapsed); with none, they are the inner fabric's.
///
/// A ticket falls due by the clock's *last reading* through the wrapper ([`Fabric::now`],
/// [`Fabric::progress`], a post), not by a fresh one: an executor polls every
/// operation it runs after each `progress`, and with many operations in flight a clock
/// read per pending ticket was most of the client's CPU time. A waiter that reads
/// `now` and then polls (a roundtrip with a deadline) sees every completion due by
/// that reading, so it never mistakes a due completion for a slow node.
#[derive(Debug)]
pub struct EmulatedRtt<F> {
    inner: F,
    rtt: Nanos,
    /// The inner fabric's clock at its last reading through this wrapper.
    clock: Cell<Nanos>,
    /// Batches not yet delivered, by ticket number (`None`: a free number). A handful
    /// at a time.
    in_flight: RefCell<Vec<Option<InFlight>>>,
    /// The latest deadline asked for with [`Fabric::wake_at`] and not reported yet.
    wake: Cell<Nanos>,
}

#[derive(Debug)]
struct InFlight {
    /// The inner fabric's ticket, until it delivered the result.
    inner: Option<Ticket>,
    due: Nanos,
    result: Option<Result<Completion, FabricError>>,
    /// `progress` already reported this completion as due.
    announced: bool,
}

impl<F: Fabric> EmulatedRtt<F> {
    /// Wraps `inner`, delaying completions by `rtt` ns (e.g. ~300 for CXL-like and
    /// ~1500 for RDMA-like latency); 0 delivers them as the inner fabric does.
    pub fn new(inner: F, rtt: Nanos) -> Self {
        let clock = Cell::new(inner.now());
        Self {
            inner,
            rtt,
            clock,
            in_flight: RefCell::new(Vec::new()),
            wake: Cell::new(0),
        }
    }

    /// The emulated roundtrip time in ns.
    pub fn rtt_ns(&self) -> Nanos {
        self.rtt
    }

    /// The wrapped fabric.
    pub fn inner(&self) -> &F {
        &self.inner
    }
}

impl<F: Fabric> EmulatedRtt<F> {
    /// Reads the inner fabric's clock, and keeps the reading for [`Fabric::poll`].
    fn read_clock(&self) -> Nanos {
        let now = self.inner.now();
        self.clock.set(now);
        now
    }

    /// Whether a batch posted through this wrapper fell due by `now` and was not
    /// reported yet (each is reported once, so `while progress() {}` ends).
    fn newly_due(&self, now: Nanos) -> bool {
        let mut found = false;
        for entry in self.in_flight.borrow_mut().iter_mut().flatten() {
            if entry.due <= now && !entry.announced {
                entry.announced = true;
                found = true;
            }
        }
        found
    }
}

impl<F: Fabric> EmulatedRtt<F> {
    /// Holds back what the inner fabric did with a batch posted at `posted_at` until a
    /// roundtrip later: `submitted`, with the inner fabric's reply in `reply` if it
    /// was `Done`.
    ///
    /// `posted_at` is read *before* the inner fabric runs the batch: on a real
    /// fabric the memory node's work is part of the roundtrip, not added to it, and
    /// over shared memory that work is the client's own CPU running the batch.
    fn delay(&self, posted_at: Nanos, submitted: Submitted, reply: &mut Completion) -> Ticket {
        let due = posted_at.saturating_add(self.rtt);
        let (inner, result) = match submitted {
            Submitted::Posted(inner) => (Some(inner), None),
            Submitted::Done => (None, Some(Ok(core::mem::take(reply)))),
            Submitted::Failed(error) => (None, Some(Err(error))),
        };
        // Refused before it was sent: delivered at once, as transports do.
        let refused = matches!(&result, Some(Err(error)) if error.is_local());
        let entry = InFlight {
            inner,
            due: if refused { 0 } else { due },
            result,
            announced: false,
        };
        let mut in_flight = self.in_flight.borrow_mut();
        let index = match in_flight.iter().position(Option::is_none) {
            Some(free) => {
                in_flight[free] = Some(entry);
                free
            }
            None => {
                in_flight.push(Some(entry));
                in_flight.len() - 1
            }
        };
        Ticket(index as u32)
    }
}

impl<F: Fabric> Fabric for EmulatedRtt<F> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.rtt == 0 {
            return self.inner.post(node, batch);
        }
        let posted_at = self.read_clock();
        self.delay(
            posted_at,
            Submitted::Posted(self.inner.post(node, batch)),
            &mut Completion::new(),
        )
    }

    fn give_back(&self, buffer: alloc::vec::Vec<u8>) {
        self.inner.give_back(buffer);
    }

    fn take_buffer(&self, len: usize) -> alloc::vec::Vec<u8> {
        self.inner.take_buffer(len)
    }

    /// Only without an emulated latency: with one, every batch is held back.
    fn completes_in_submit(&self) -> bool {
        self.rtt == 0 && self.inner.completes_in_submit()
    }

    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        self.inner.prefetch(node, addr, len);
    }

    /// No ticket, hence no due time to hold a result to: the inner fabric executes
    /// the batch (or has it in flight) as for any post, and nobody waits for it.
    #[inline]
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        self.inner.post_detached(node, batch);
    }

    /// As the inner fabric without an emulated latency; `None` with one (the read
    /// must complete a roundtrip later, [`Fabric::submit`]).
    #[inline]
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        if self.rtt != 0 {
            return None;
        }
        self.inner.read_direct(node, addr, out)
    }

    /// As the inner fabric without an emulated latency; `None` with one (the batch
    /// must complete a roundtrip later, [`Fabric::submit`]).
    #[inline]
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        if self.rtt != 0 {
            return None;
        }
        self.inner.submit_in_place(node, batch, reply)
    }

    #[inline]
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        if self.rtt == 0 {
            return self.inner.submit(node, batch, reply);
        }
        let posted_at = self.read_clock();
        let submitted = self.inner.submit(node, batch, reply);
        if let Submitted::Failed(error) = &submitted
            && error.is_local()
        {
            return submitted;
        }
        Submitted::Posted(self.delay(posted_at, submitted, reply))
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if self.rtt == 0 {
            return self.inner.poll(ticket);
        }
        let mut in_flight = self.in_flight.borrow_mut();
        let Some(Some(entry)) = in_flight.get_mut(ticket.0 as usize) else {
            return Poll::Ready(Err(FabricError::UnknownTicket(ticket.0)));
        };
        if let Some(inner) = entry.inner {
            match self.inner.poll(inner) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    entry.inner = None;
                    let local = matches!(&result, Err(error) if error.is_local());
                    entry.result = Some(result);
                    if local {
                        entry.due = 0;
                    }
                }
            }
        }
        if entry.due > self.clock.get() {
            return Poll::Pending;
        }
        match in_flight[ticket.0 as usize].take().and_then(|e| e.result) {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }

    fn forget(&self, ticket: Ticket) {
        if self.rtt == 0 {
            return self.inner.forget(ticket);
        }
        let entry = self
            .in_flight
            .borrow_mut()
            .get_mut(ticket.0 as usize)
            .and_then(Option::take);
        if let Some(InFlight {
            inner: Some(inner), ..
        }) = entry
        {
            self.inner.forget(inner);
        }
    }

    /// A result held back for its roundtrip: the batch ran already. Otherwise as the
    /// inner fabric says.
    fn settled(&self, ticket: Ticket) -> bool {
        if self.rtt == 0 {
            return self.inner.settled(ticket);
        }
        match self.in_flight.borrow().get(ticket.0 as usize) {
            Some(Some(InFlight {
                inner: Some(inner), ..
            })) => self.inner.settled(*inner),
            Some(Some(_)) => true,
            None | Some(None) => false,
        }
    }

    fn progress(&self) -> bool {
        if self.inner.progress() {
            return true;
        }
        // A completion already due is an event now: its owner just has not polled it
        // yet (a thread busy elsewhere). Spinning to a later deadline instead would
        // stall every waiter for that long.
        let now = self.read_clock();
        if self.newly_due(now) {
            return true;
        }
        // Spin until the next event: a completion due, or a deadline a waiter set.
        let wake = self.wake.get();
        if wake != 0 && wake <= now {
            self.wake.set(0);
            return true;
        }
        let next_due = self
            .in_flight
            .borrow()
            .iter()
            .flatten()
            .map(|f| f.due)
            .filter(|&due| due > now)
            .min();
        let wake = Some(wake).filter(|&wake| wake > now);
        let Some(until) = next_due.into_iter().chain(wake).min() else {
            return false;
        };
        if next_due.is_none() {
            // Only a waiter's deadline is pending, and it may be stale (its waiter may
            // have finished early): spinning to it here would keep every other waiter
            // of this thread (a short pause) from being polled until then. Let the
            // executor poll, and come back.
            return true;
        }
        while self.read_clock() < until {
            core::hint::spin_loop();
            // An inner fabric with a logical clock moves it here.
            self.inner.progress();
        }
        if self.wake.get() <= self.clock.get() {
            self.wake.set(0);
        }
        true
    }

    fn now(&self) -> Nanos {
        self.read_clock()
    }

    fn recent_now(&self) -> Nanos {
        if self.rtt == 0 {
            return self.inner.recent_now();
        }
        self.clock.get()
    }

    fn wake_at(&self, deadline: Nanos) {
        // Kept here, not passed on: `progress` spins to the earlier of the next
        // completion due and this deadline, and an inner fabric told the deadline
        // could spin past completions due before it.
        self.wake.set(self.wake.get().max(deadline));
    }

    // `progress` asks the inner fabric first: its answer to the yield is ours.
    fn yielded(&self) {
        self.inner.yielded();
    }

    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.admit(node, incarnation)
    }

    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.memory_lost(node, incarnation)
    }

    fn fence_owner(&self, fence: super::OwnerFence) -> usize {
        self.inner.fence_owner(fence)
    }

    fn revoke_owner(&self, lease_word: u64, floor: u64) -> super::Revocation {
        self.inner.revoke_owner(lease_word, floor)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::MemCluster;
    use crate::fabric::{Op, OpOutput};

    fn ready<F: Fabric>(fabric: &F, ticket: Ticket) -> Option<Result<Completion, FabricError>> {
        match fabric.poll(ticket) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        }
    }

    /// `submit` through the wrappers: at once when nothing is emulated, never on a
    /// failed node, a roundtrip later with an emulated latency, and at once when the
    /// batch is refused locally.
    #[test]
    fn submit_keeps_the_fast_path_only_where_the_wrappers_allow_it() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 0));
        let mut reply = Completion::new();
        assert!(matches!(
            fabric.submit(
                NodeId(0),
                &mut Batch::write(8, alloc::vec![3; 8]),
                &mut reply
            ),
            Submitted::Done
        ));
        assert_eq!(reply.outputs(), &[OpOutput::Written]);
        fabric.fail_node(NodeId(2));
        let Submitted::Posted(lost) = fabric.submit(
            NodeId(2),
            &mut Batch::write(8, alloc::vec![3; 8]),
            &mut Completion::new(),
        ) else {
            panic!("a batch to a failed node completed");
        };
        assert!(ready(&fabric, lost).is_none());
        assert!(!fabric.progress(), "only a batch on a failed node is left");
        fabric.forget(lost);

        let delayed = EmulatedRtt::new(cluster.client(), 5);
        let mut reply = Completion::new();
        let Submitted::Posted(t) = delayed.submit(NodeId(0), &mut Batch::read(8, 8), &mut reply)
        else {
            panic!("a batch completed before its emulated roundtrip");
        };
        assert!(ready(&delayed, t).is_none());
        while delayed.progress() && ready_peek(&delayed, t) {}
        let read = ready(&delayed, t)
            .expect("due after the roundtrip")
            .unwrap();
        assert_eq!(read.read(0), Some(&[3u8; 8][..]));
        assert!(
            reply.outputs().is_empty(),
            "the reply came behind the ticket"
        );
        assert!(matches!(
            delayed.submit(NodeId(0), &mut Batch::read(60, 8), &mut Completion::new()),
            Submitted::Failed(FabricError::OutOfBounds { .. })
        ));
    }

    /// `read_direct` through the wrappers: it reads in place what a one-read batch
    /// reads (bounds checked the same way), and declines (`None`, the caller submits
    /// a batch) on a failed node and under an emulated latency, where `submit` would
    /// not complete the read at once.
    #[test]
    fn read_direct_is_a_one_read_batch_where_submit_completes_it() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 0));
        for node in 0..3u16 {
            let mut batch = Batch::write(8, alloc::vec![node as u8 + 1; 16]);
            assert!(matches!(
                fabric.submit(NodeId(node), &mut batch, &mut Completion::new()),
                Submitted::Done
            ));
        }
        let mut out = [0u8; 13];
        assert_eq!(fabric.read_direct(NodeId(1), 5, &mut out), Some(Ok(())));
        let mut reply = Completion::new();
        fabric.submit(NodeId(1), &mut Batch::read(5, 13), &mut reply);
        assert_eq!(reply.read(0), Some(&out[..]), "what the batch reads");
        assert_eq!(&out[..3], &[0; 3]);
        assert_eq!(&out[3..], &[2; 10]);
        assert!(matches!(
            fabric.read_direct(NodeId(0), 56, &mut out),
            Some(Err(FabricError::OutOfBounds { .. }))
        ));
        fabric.fail_node(NodeId(2));
        let mut untouched = [9u8; 8];
        assert_eq!(fabric.read_direct(NodeId(2), 8, &mut untouched), None);
        assert_eq!(untouched, [9; 8], "nothing read from a failed node");
        assert_eq!(
            fabric.read_direct(NodeId(0), 8, &mut untouched),
            Some(Ok(()))
        );
        assert_eq!(untouched, [1; 8]);
        let delayed = EmulatedRtt::new(cluster.client(), 5);
        assert_eq!(delayed.read_direct(NodeId(0), 8, &mut untouched), None);
    }

    /// `submit_in_place` through the wrappers: the effects and answers of the same
    /// batch submitted, and a decline (`None`, nothing executed: the caller
    /// submits) on a failed node, under an emulated latency, and for reads that do
    /// not fit in the reply.
    #[test]
    fn submit_in_place_is_a_submit_where_submit_completes_it() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 0));
        let batch = || {
            let mut batch = Batch::read(8, 16);
            batch
                .push(Op::Cas {
                    addr: 8,
                    expected: 0,
                    new: 5,
                })
                .unwrap();
            batch
        };
        let mut bytes = [0u8; 16];
        let mut reply = InPlaceReply::new(&mut bytes);
        assert_eq!(
            fabric.submit_in_place(NodeId(0), &batch(), &mut reply),
            Some(Ok(()))
        );
        let mut completion = Completion::new();
        fabric.submit(NodeId(1), &mut batch(), &mut completion);
        assert_eq!(Some(reply.reads()), completion.read(0));
        assert_eq!((reply.cas(1), completion.cas(1)), (Some(0), Some(0)));
        let mut short = [0u8; 15];
        assert_eq!(
            fabric.submit_in_place(NodeId(0), &batch(), &mut InPlaceReply::new(&mut short)),
            None
        );
        fabric.fail_node(NodeId(2));
        let mut reply = InPlaceReply::new(&mut bytes);
        assert_eq!(
            fabric.submit_in_place(NodeId(2), &batch(), &mut reply),
            None
        );
        let delayed = EmulatedRtt::new(cluster.client(), 5);
        assert_eq!(
            delayed.submit_in_place(NodeId(2), &batch(), &mut reply),
            None
        );
        let mut completion = Completion::new();
        cluster
            .client()
            .submit(NodeId(2), &mut batch(), &mut completion);
        assert_eq!(completion.cas(1), Some(0), "node 2 executed nothing");
    }

    /// A detached post executes at once through an emulated latency, leaves no
    /// ticket behind (and reads no clock), and never reaches a failed node.
    #[test]
    fn detached_posts_execute_without_bookkeeping_and_skip_failed_nodes() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 1_000));
        fabric.fail_node(NodeId(2));
        for node in 0..3 {
            fabric.post_detached(
                NodeId(node),
                &mut Batch::write(8, alloc::vec![node as u8 + 1; 8]),
            );
        }
        assert!(
            fabric
                .inner()
                .in_flight
                .borrow()
                .iter()
                .all(Option::is_none)
        );
        assert!(!fabric.progress(), "nothing is in flight");
        let check = cluster.client();
        for (node, want) in [(0u16, 1u8), (1, 2), (2, 0)] {
            let t = check.post(NodeId(node), Batch::read(8, 8));
            let Poll::Ready(Ok(done)) = check.poll(t) else {
                panic!("the in-process fabric completes at once");
            };
            assert_eq!(done.read(0), Some(&[want; 8][..]), "node {node}");
        }
    }

    /// A ticket falls due by the clock's last reading through the wrapper, which
    /// `recent_now` returns: polling many pending tickets reads no clock, and a
    /// waiter that reads `now` before it polls sees what fell due by then.
    #[test]
    fn completions_fall_due_by_the_last_clock_reading() {
        let cluster = MemCluster::new(1, 64);
        let inner = cluster.client();
        let delayed = EmulatedRtt::new(&inner, 5);
        let posted_at = delayed.now();
        let ticket = delayed.post(NodeId(0), Batch::read(0, 8));
        for _ in 0..10 {
            inner.progress(); // the inner clock moves on, unread by the wrapper
        }
        assert_eq!(delayed.recent_now(), posted_at);
        assert!(
            delayed.poll(ticket).is_pending(),
            "due by a clock not read yet"
        );
        assert_eq!(delayed.now(), posted_at + 10);
        assert_eq!(delayed.recent_now(), posted_at + 10);
        assert!(matches!(delayed.poll(ticket), Poll::Ready(Ok(_))));
        // Without a roundtrip to emulate, the inner fabric's clock as it is.
        let plain = EmulatedRtt::new(&inner, 0);
        inner.progress();
        assert_eq!(plain.recent_now(), inner.now());
    }

    /// Whether `ticket` is still pending, without consuming a result: the in-flight
    /// entry of an [`EmulatedRtt`] is only taken once it is due.
    fn ready_peek<F: Fabric>(fabric: &EmulatedRtt<F>, ticket: Ticket) -> bool {
        fabric.in_flight.borrow()[ticket.0 as usize]
            .as_ref()
            .is_some_and(|entry| entry.due > fabric.inner.now())
    }

    #[test]
    fn a_failed_node_never_completes_and_the_others_do() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(cluster.client());
        fabric.fail_node(NodeId(2));
        fabric.fail_node(NodeId(7)); // unknown: ignored
        assert!(fabric.is_failed(NodeId(2)) && !fabric.is_failed(NodeId(0)));
        let alive = fabric.post(NodeId(0), Batch::write(8, alloc::vec![1; 8]));
        let dead = fabric.post(NodeId(2), Batch::write(8, alloc::vec![1; 8]));
        assert!(matches!(ready(&fabric, alive), Some(Ok(_))));
        assert!(ready(&fabric, dead).is_none());
        assert!(!fabric.progress(), "only a batch on a failed node is left");
        // The failed node's memory was not touched.
        let check = cluster.client();
        let t = check.post(NodeId(2), Batch::read(8, 8));
        let read = ready(&check, t).unwrap().unwrap();
        assert_eq!(read.read(0), Some(&[0u8; 8][..]));
        // Forgotten lost tickets are reused, not piled up.
        fabric.forget(dead);
        let again = fabric.post(NodeId(2), Batch::read(0, 8));
        assert_eq!(again, dead);
    }

    /// A node crashed as an RDMA node's crash looks: its batches fail at once, posted
    /// or submitted, and so do those in flight when it crashed; its memory is not
    /// touched, and the other nodes are not affected.
    #[test]
    fn an_erroring_node_fails_every_batch_at_once_and_the_others_complete() {
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 5));
        let in_flight = fabric.post(NodeId(2), Batch::write(8, alloc::vec![1; 8]));
        let alive = fabric.post(NodeId(0), Batch::write(8, alloc::vec![1; 8]));
        fabric.fail_node_as(NodeId(2), Crash::Erroring);
        assert!(fabric.is_failed(NodeId(2)) && !fabric.is_failed(NodeId(0)));
        let error = FabricError::NodeFailed {
            node: NodeId(2),
            cause: FailureCause::Crashed,
        };
        let crashed = Err(error.clone());
        assert_eq!(ready(&fabric, in_flight), Some(crashed.clone()));
        let posted = fabric.post(NodeId(2), Batch::write(16, alloc::vec![2; 8]));
        assert_eq!(ready(&fabric, posted), Some(crashed));
        assert_eq!(
            ready(&fabric, posted),
            Some(Err(FabricError::UnknownTicket(posted.0))),
            "an error is delivered once"
        );
        assert_eq!(
            fabric.post(NodeId(2), Batch::read(0, 8)),
            posted,
            "polled tickets are reused"
        );
        let mut reply = Completion::new();
        let submitted = fabric.submit(NodeId(2), &mut Batch::read(0, 8), &mut reply);
        assert!(
            matches!(&submitted, Submitted::Failed(e) if *e == error),
            "{submitted:?}"
        );
        fabric.post_detached(NodeId(2), &mut Batch::write(24, alloc::vec![3; 8]));
        while ready_after_progress(&fabric, alive).is_none() {}
        let check = cluster.client();
        // The batch in flight when node 2 crashed had landed (an emulated latency
        // delays completions, not effects): only its completion failed. Nothing
        // posted to the node after the crash was executed.
        for (node, at, want) in [(0u16, 8, 1u8), (2, 8, 1), (2, 16, 0), (2, 24, 0)] {
            let t = check.post(NodeId(node), Batch::read(at, 8));
            let read = ready(&check, t).unwrap().unwrap();
            assert_eq!(read.read(0), Some(&[want; 8][..]), "node {node} at {at}");
        }
    }

    /// Polls `ticket` after one `progress` of `fabric`.
    fn ready_after_progress<F: Fabric>(
        fabric: &F,
        ticket: Ticket,
    ) -> Option<Result<Completion, FabricError>> {
        fabric.progress();
        ready(fabric, ticket)
    }

    #[test]
    fn a_completion_already_due_ends_progress_at_once_despite_a_later_wake_up() {
        let cluster = MemCluster::new(1, 64);
        let fabric = EmulatedRtt::new(cluster.client(), 3);
        let t = fabric.post(NodeId(0), Batch::read(0, 8));
        // A waiter far in the future (a timeout that will not be needed).
        fabric.wake_at(fabric.now() + 1_000_000);
        // The in-process clock moves one tick per inner `progress`: let the batch fall due.
        for _ in 0..3 {
            fabric.inner().progress();
        }
        let before = fabric.now();
        assert!(fabric.progress());
        assert!(
            fabric.now() < before + 10,
            "progress spun to the wake-up instead of reporting the due completion"
        );
        assert!(matches!(ready(&fabric, t), Some(Ok(_))));
    }

    #[test]
    fn batches_in_flight_to_a_node_that_fails_are_lost() {
        let cluster = MemCluster::new(2, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 5));
        let lost = fabric.post(NodeId(1), Batch::read(0, 8));
        let kept = fabric.post(NodeId(0), Batch::read(0, 8));
        fabric.fail_node(NodeId(1));
        while fabric.progress() {}
        assert!(matches!(ready(&fabric, kept), Some(Ok(_))));
        assert!(ready(&fabric, lost).is_none());
    }

    #[test]
    fn completions_arrive_one_rtt_after_posting_and_local_errors_at_once() {
        let cluster = MemCluster::new(2, 64);
        // The in-process fabric's clock is logical: one tick per `progress`.
        let fabric = EmulatedRtt::new(cluster.client(), 3);
        assert_eq!(fabric.rtt_ns(), 3);
        let start = fabric.now();
        let a = fabric.post(NodeId(0), Batch::write(0, alloc::vec![9; 8]));
        let b = fabric.post(NodeId(1), Batch::read(0, 8));
        let bad = fabric.post(NodeId(0), Batch::read(60, 8));
        assert!(matches!(
            ready(&fabric, bad),
            Some(Err(FabricError::OutOfBounds { .. }))
        ));
        assert!(ready(&fabric, a).is_none(), "the roundtrip has not elapsed");
        assert!(fabric.progress());
        assert!(fabric.now() >= start + 3);
        // Both overlap: one roundtrip for the two.
        assert!(matches!(ready(&fabric, a), Some(Ok(_))));
        assert!(matches!(ready(&fabric, b), Some(Ok(_))));
        assert!(!fabric.progress(), "nothing is left");
        // Forgotten batches still took effect.
        let c = fabric.post(NodeId(1), Batch::write(8, alloc::vec![5; 8]));
        fabric.forget(c);
        assert!(!fabric.progress());
        let check = cluster.client();
        let t = check.post(NodeId(1), Batch::read(8, 8));
        let read = ready(&check, t).unwrap().unwrap();
        assert_eq!(read.read(0), Some(&[5u8; 8][..]));
    }

    /// Moves the in-process fabric's logical clock `cost` ticks each time a batch has
    /// run: batches whose run takes time, as shared memory's take the client's CPU.
    struct RunTakes<'a> {
        clock: &'a crate::mem::MemFabric,
        cost: u32,
    }

    impl crate::fabric::Tracer for RunTakes<'_> {
        fn posted(&self, _: NodeId) {
            for _ in 0..self.cost {
                self.clock.progress();
            }
        }
    }

    /// The roundtrip starts when a batch is posted, not when the inner fabric has
    /// run it: on a real fabric the memory node's work is part of the roundtrip.
    #[test]
    fn the_roundtrip_counts_from_posting_not_from_the_end_of_the_inner_run() {
        let cluster = MemCluster::new(1, 64);
        let inner = cluster.client();
        let runs = RunTakes {
            clock: &inner,
            cost: 4,
        };
        let fabric = EmulatedRtt::new(crate::fabric::Traced::new(&inner, runs), 10);
        for how in ["post", "submit"] {
            let posted_at = fabric.now();
            let ticket = match how {
                "post" => fabric.post(NodeId(0), Batch::read(0, 8)),
                _ => match fabric.submit(NodeId(0), &mut Batch::read(0, 8), &mut Completion::new())
                {
                    Submitted::Posted(ticket) => ticket,
                    _ => panic!("a batch completed before its emulated roundtrip"),
                },
            };
            assert_eq!(inner.now(), posted_at + 4, "the run took 4 ticks");
            while inner.now() < posted_at + 10 {
                inner.progress();
            }
            assert_eq!(fabric.now(), posted_at + 10);
            assert!(
                ready(&fabric, ticket).is_some(),
                "{how}: due a roundtrip after posting, not after the run (+4)"
            );
        }
    }

    #[test]
    fn each_ticket_gets_its_own_result_when_the_inner_fabric_reuses_numbers() {
        let cluster = MemCluster::new(1, 64);
        let fabric = EmulatedRtt::new(cluster.client(), 3);
        let setup = cluster.client();
        let t = setup.post(NodeId(0), Batch::write(0, alloc::vec![1; 16]));
        assert!(matches!(ready(&setup, t), Some(Ok(_))));
        // The first poll takes `a`'s result from the inner fabric, which then gives
        // its ticket number to `b`.
        let a = fabric.post(NodeId(0), Batch::read(0, 8));
        assert!(ready(&fabric, a).is_none());
        let b = fabric.post(NodeId(0), Batch::read(0, 16));
        assert_ne!(a, b);
        while fabric.progress() {}
        let a = ready(&fabric, a).unwrap().unwrap();
        let b = ready(&fabric, b).unwrap().unwrap();
        assert_eq!(a.read(0).map(<[u8]>::len), Some(8));
        assert_eq!(b.read(0).map(<[u8]>::len), Some(16));
    }

    #[test]
    fn a_deadline_ends_the_spin_before_a_later_completion() {
        let cluster = MemCluster::new(1, 64);
        let fabric = EmulatedRtt::new(cluster.client(), 100);
        let t = fabric.post(NodeId(0), Batch::read(0, 8));
        let deadline = fabric.now() + 10;
        fabric.wake_at(deadline);
        assert!(fabric.progress());
        assert!(fabric.now() >= deadline && fabric.now() < deadline + 50);
        assert!(ready(&fabric, t).is_none());
        assert!(fabric.progress());
        assert!(matches!(ready(&fabric, t), Some(Ok(_))));
    }
}
