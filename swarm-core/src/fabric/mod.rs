//! The fabric contract: what SWARM needs from disaggregated memory.
//!
//! The paper's setting (SWARM §2.1) is the whole contract, and this module is its
//! Rust spelling:
//!
//! 1. [`Op::Read`] and [`Op::Write`] move bytes and are **not atomic**: concurrent
//!    writes may clobber each other and a read concurrent with a write may return torn
//!    data (at 8-byte granularity on every transport we ship).
//! 2. [`Op::Cas`] is an atomic 8-byte compare-and-swap on an 8-byte aligned word and
//!    returns the previous value.
//! 3. A [`Batch`] is an ordered pipeline of operations to one node: if a later
//!    operation's effect is visible, so are the earlier ones' (on RDMA: one chain of
//!    work requests on one RC queue pair; on shared memory: program order plus
//!    fences). A batch completes in one roundtrip. Two batches, even to the same
//!    node, are **not** ordered with each other: a transport may execute a batch
//!    before an earlier one has completed (RDMA does not fence the first request of
//!    a chain against the previous chain's atomics, and the simulated fabric
//!    reorders batches on purpose). A protocol that needs one batch's effects
//!    before another's waits for the first one's completion.
//! 4. Batches to different nodes are in flight at once. Waiting for a quorum of them
//!    is the job of [`crate::Roundtrip`], which is also the only place roundtrips are
//!    counted, so protocol code cannot forget to count one.
//!
//! A transport implements [`Fabric`]: it *posts* batches and hands back a [`Ticket`],
//! reports completions through [`Fabric::poll`], and makes progress (polls a
//! completion queue, advances a virtual clock, spins out an emulated latency) in
//! [`Fabric::progress`].
//!
//! **Synchronous completion, the fast path.** A transport whose memory is local
//! (shared memory, CXL, the in-process fabric) executes a batch while it is posted.
//! Protocol code posts through [`Fabric::submit`], which lets such a transport write
//! the result at once into a completion the caller provides ([`Submitted::Done`])
//! instead of parking it behind a ticket: no ticket bookkeeping, no second borrow of
//! the transport's state, no poll, no copy of the result on its way (a [`crate::Roundtrip`]
//! passes the slot its reply is kept in), and the roundtrip that posted it is
//! complete before it first waits (its future is `Ready` on the first poll, so the
//! executor never calls `progress`).
//! `submit`'s default posts and returns the ticket ([`Submitted::Posted`]), so
//! asynchronous transports (RDMA, the simulator) and wrappers that only override
//! `post` keep their exact behaviour; there is one protocol code path for both.
//!
//! A transport never blocks inside `post`, `submit` or `poll`, so one client thread
//! can keep several protocol operations in flight on the small executor in
//! [`crate::exec`], whose module docs state who must call `progress` (the executor
//! contract, also for foreign executors). A failed node surfaces either as an error
//! completion or as a ticket that never completes; the protocol treats both alike
//! and moves on with a majority. A completion, failed or not, says that nothing of
//! the batch lands afterwards (RDMA fails a chain in flight only once its queue pair
//! is in the error state): a write-back guard waits for that before it goes down
//! ([`crate::write_back_guard`], "The lower"), so a transport that knows a pending
//! batch can never land says so ([`Fabric::settled`]), and one that can should
//! complete every ticket within a bound from its post.

mod batch;
mod error;
mod faults;
mod in_place;
mod owner;
mod read_buffers;
mod slab;
mod trace;

pub use batch::{Batch, Completion, INLINE_BATCH_OPS, MAX_BATCH_OPS, Op, OpOutput, Payload};
pub use error::{FabricError, FailureCause};
pub use faults::{Crash, EmulatedRtt, FailNodes};
pub use in_place::InPlaceReply;
pub use owner::{OwnerFence, Revocation};
pub use read_buffers::ReadBuffers;
pub use slab::TicketSlab;
pub use trace::{Traced, Tracer};

use alloc::vec::Vec;
use core::fmt;
use core::task::Poll;

/// Identifies a memory node of the cluster: `0..Fabric::node_count()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u16);

impl NodeId {
    /// The node's position, usable as an index into per-node arrays.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Time as nanoseconds on the fabric's own clock (real or virtual).
pub type Nanos = u64;

/// A handle to a posted batch, redeemed with [`Fabric::poll`] or dropped with
/// [`Fabric::forget`]. Tickets are only meaningful to the fabric that issued them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(pub u32);

/// What [`Fabric::submit`] did with a batch.
#[derive(Debug)]
pub enum Submitted {
    /// The transport executed the batch inside `submit`: its outputs are in the
    /// completion the caller passed, exactly what [`Fabric::poll`] would have returned
    /// for its ticket. Nothing is left to poll or forget.
    Done,
    /// The transport refused or failed the batch inside `submit` (a bad address, a
    /// crashed node): the error [`Fabric::poll`] would have returned for its ticket.
    /// Nothing is left to poll or forget.
    Failed(FabricError),
    /// The batch is in flight: redeem the ticket with [`Fabric::poll`] or drop it with
    /// [`Fabric::forget`], as for [`Fabric::post`].
    Posted(Ticket),
}

impl Submitted {
    /// What a transport that executed a batch inside [`Fabric::submit`] returns:
    /// `Done` (its outputs are in the reply) or `Failed` with the error.
    pub fn executed(result: Result<(), FabricError>) -> Self {
        match result {
            Ok(()) => Self::Done,
            Err(error) => Self::Failed(error),
        }
    }
}

/// A memory-node transport as seen by one client thread.
///
/// Methods take `&self` because several protocol operations of the same thread hold
/// the fabric at once; implementations use interior mutability and are typically
/// `!Sync` (one handle per client thread over shared memory nodes).
pub trait Fabric {
    /// How many memory nodes the cluster has.
    fn node_count(&self) -> usize;

    /// Posts an ordered batch to `node` and returns at once. Errors (bad address,
    /// failed node) are reported by [`Fabric::poll`] on the returned ticket.
    fn post(&self, node: NodeId, batch: Batch) -> Ticket;

    /// Posts an ordered batch to `node`, like [`Fabric::post`], but lets a transport
    /// that executes it synchronously deliver the result at once, into `reply`, which
    /// the caller owns and passes empty ([`Submitted::Done`], or
    /// [`Submitted::Failed`]); see the module docs. A transport that keeps the batch
    /// takes it out of `batch` (the caller drops what is left): a synchronous one
    /// only reads it, so the batch is never moved on the fast path. The batch's
    /// effects and its result are those `post` + `poll` would give; only the
    /// bookkeeping differs. `reply` is left empty unless the result is `Done`. The
    /// default posts and returns the ticket. Wrappers forward it to their inner
    /// fabric so the fast path survives them.
    #[inline]
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        let _ = reply;
        Submitted::Posted(self.post(node, core::mem::take(batch)))
    }

    /// Reads `out.len()` bytes at `addr` of `node` into `out` inside the call, with
    /// the checks, effects and result a batch of that one read submitted with
    /// [`Fabric::submit`] would have, for a transport that can do it without a batch,
    /// a completion or a buffer of its own (local memory with no emulated latency):
    /// the metadata read of a Safe-Guess read's majority step. `None` when it does
    /// not (the default; a crashed node behind a [`FailNodes`], an emulated
    /// latency): the caller submits the read as a batch instead, so a `None` costs
    /// that batch, never a result. Wrappers forward it only where their `submit`
    /// would hand the batch to the inner fabric unchanged.
    #[inline]
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        let _ = (node, addr, out);
        None
    }

    /// Executes `batch` on `node` inside the call, with the checks, effects and
    /// result [`Fabric::submit`] would give it, its results left in `reply` (each
    /// read's bytes one after the other in the caller's buffer, each CAS's answer by
    /// index) instead of a [`Completion`]: no read buffer taken or given back, no
    /// output pushed. For a transport over local memory with no emulated latency:
    /// a Safe-Guess write's first round. `None` when it does not (the default; a
    /// crashed node behind a [`FailNodes`], an emulated latency, reads that do not
    /// fit in `reply`, [`InPlaceReply::fits`]): nothing was executed, and the caller
    /// submits the batch instead, so a `None` costs that submit, never a result.
    /// Wrappers forward it only where their `submit` would hand the batch to the
    /// inner fabric unchanged.
    #[inline]
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        let _ = (node, batch, reply);
        None
    }

    /// Whether [`Fabric::submit`] executes a batch to a live node inside the call
    /// ([`Submitted::Done`] or [`Submitted::Failed`], never a ticket): local memory
    /// with no emulated latency. Protocol steps that can then fold each reply into
    /// their state as it is handed back, with no [`crate::Roundtrip`], do so when
    /// this says `true` (a Safe-Guess read's majority read), and take the general
    /// path for a batch that did not complete after all (a crashed node behind a
    /// [`FailNodes`]), so a wrong `true` costs a duplicate post, never a result. A
    /// writer's slot recycling relies on `true` as well: a batch that such a fabric
    /// did not execute inside its post never executes (a [`FailNodes`] crashed node
    /// never runs what it held back), so nothing of a write can land in its slot
    /// after the write's round ended (`protocol::slot_recycling`, "The writer's own
    /// batches"). The default is `false`: asynchronous transports never post a step
    /// twice.
    #[inline]
    fn completes_in_submit(&self) -> bool {
        false
    }

    /// Hints that a batch about to be posted to `node` touches bytes `addr..addr +
    /// len` (reads or writes them): a transport over local memory may start
    /// fetching them, so that a protocol step touching several replicas, or several
    /// places of one, waits for their memory once, not once per cache miss. No
    /// effect on any result, whatever the range (out of bounds included); the
    /// default does nothing.
    #[inline]
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        let _ = (node, addr, len);
    }

    /// Posts `batch` to `node` for its effects only: nobody will look at its result
    /// (background work, [`crate::roundtrip::post_background`]). Exactly `submit` then
    /// `forget`, which the default does; a wrapper that would only hold the result
    /// back (an emulated latency) skips that bookkeeping. As for `submit`, a
    /// transport that keeps the batch takes it out of `batch` (the caller drops what
    /// is left), and one that executes it inside the call only reads it: the batch
    /// is not moved through the wrappers on the fast path.
    #[inline]
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        if let Submitted::Posted(ticket) = self.submit(node, batch, &mut Completion::new()) {
            self.forget(ticket);
        }
    }

    /// Reports whether the batch behind `ticket` has completed. A `Ready` result
    /// consumes the ticket; polling it again is a logic error and yields
    /// [`FabricError::UnknownTicket`].
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>>;

    /// Declares that nobody will poll `ticket`: the batch still executes (it may be a
    /// background write), but its result is discarded when it completes.
    fn forget(&self, ticket: Ticket);

    /// Whether nothing of the batch behind `ticket`, which [`Fabric::poll`] still
    /// reports pending, can take effect on its node any more: it never left this
    /// client (a node crashed for it by [`FailNodes`], which never executes such a
    /// batch), or its effects are all in already (a completion held back only to
    /// emulate latency, [`EmulatedRtt`]). `false` means *not known*, and is the
    /// default: a transport whose pending batch may still land completes its ticket
    /// once it landed or never can (RDMA: its queue pair went to the error state or
    /// was destroyed; the simulator: a batch lost to a crashed node fails a queue
    /// pair timeout after its post). A write-back guard goes down only once every
    /// batch of its write-back completed or is settled
    /// ([`crate::write_back_guard`], "The lower").
    #[inline]
    fn settled(&self, ticket: Ticket) -> bool {
        let _ = ticket;
        false
    }

    /// Drives the transport one step: delivers completions that are due. Returns
    /// `false` when nothing outstanding can ever complete (nothing posted, or every
    /// outstanding batch is stuck on a failed node); executors use that to report a
    /// stall instead of spinning forever.
    fn progress(&self) -> bool;

    /// The fabric's clock, used for timeouts (falling back from a slow preferred
    /// majority). Never used for timestamps, which come from a [`crate::Clock`].
    fn now(&self) -> Nanos;

    /// A recent reading of [`Fabric::now`]: not later than `now()`, and not earlier
    /// than the clock at the last call of [`Fabric::progress`] or `now()`. For
    /// timeouts that tolerate a clock one executor round behind (a quorum step's
    /// fallback to slower nodes, [`crate::Roundtrip::wait_until`]), which a client
    /// with many operations in flight checks at every poll of each; never for the
    /// operation fence, which needs `now()`. A transport whose roundtrips complete
    /// by its own clock readings ([`EmulatedRtt`]) keeps the last one; the default
    /// reads the clock.
    #[inline]
    fn recent_now(&self) -> Nanos {
        self.now()
    }

    /// Asks the fabric to keep making progress until its clock reaches `deadline`,
    /// even if no batch completes before then: [`Fabric::progress`] must not return
    /// `false` while such a wake-up is due later. A roundtrip waiting with a deadline
    /// calls this, so that an executor does not report a stall while the protocol is
    /// about to fall back to other nodes. A simulated fabric schedules a timer event;
    /// a real-time fabric just keeps spinning until the deadline.
    fn wake_at(&self, deadline: Nanos);

    /// A task of this thread yielded: it returned `Pending` with nothing posted, to
    /// let the thread's other tasks run first ([`crate::OpStats::interleaved`]).
    /// The next [`Fabric::progress`] must return `true`, so that the executor polls
    /// that task again instead of reporting a stall. The default asks for a wake-up
    /// one nanosecond ahead ([`Fabric::wake_at`]); a transport overrides it when that
    /// is not enough (its `progress` may find such a deadline passed and report
    /// nothing to do) or costs a clock reading it can do without.
    #[inline]
    fn yielded(&self) {
        self.wake_at(self.now().saturating_add(1));
    }

    /// Puts memory node `node` in service with the memory of incarnation
    /// `incarnation`, if the transport can reach that memory: a node that a repair
    /// rebuilt and a configuration change admitted (`swarm_kv::repair`). Returns
    /// whether batches to `node` now reach that incarnation, or will once the
    /// transport has connected to it in the background (RDMA); `true` also when they
    /// did already. The caller has read a configuration that lists it; a transport
    /// must never serve another incarnation's memory under it. The default cannot
    /// admit anything.
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        let _ = (node, incarnation);
        false
    }

    /// Whether the memory of `node`'s incarnation `incarnation` is known to be gone
    /// for good: it can never answer again as that incarnation (a retired node file,
    /// a memory node that came back with another incarnation). Only a repair brings
    /// the node back, by rebuilding a new incarnation from the others. A store may
    /// then leave that memory out of work that otherwise needs every replica
    /// (`swarm_kv::registers::recycle`, register resets). `false` means *not known*: a node
    /// that does not answer may come back with its memory. The default knows nothing.
    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        let _ = (node, incarnation);
        false
    }

    /// Asks the memory nodes to fence this client under its lease word
    /// ([`OwnerFence`], whose docs say why): from now on a revocation of that word
    /// ([`Fabric::revoke_owner`]) destroys this client's access to every node, and a
    /// node may also cut it once the word is killed or has not changed for
    /// `fence.stall_ns`. Called once the client holds its writer row and its lease,
    /// before it stores anything under it; a transport re-arms the fence on every
    /// reconnect. Returns how many nodes armed it; the default fences nothing and
    /// returns 0 (a transport whose [`Fabric::revoke_owner`] says
    /// [`Revocation::NotNeeded`]).
    fn fence_owner(&self, fence: OwnerFence) -> usize {
        let _ = fence;
        0
    }

    /// Revokes every client fenced under `lease_word` with a generation base at or
    /// below `floor` ([`Fabric::fence_owner`]) on every memory node that may serve
    /// again, and returns once each acknowledged, or says which did not. A memory
    /// node revokes only while the word is killed on it. Blocks the calling thread
    /// for at most a few bootstrap timeouts. The default needs none
    /// ([`Revocation::NotNeeded`]): a transport over one host's memory, where the
    /// caller judges the owner by its process.
    fn revoke_owner(&self, lease_word: u64, floor: u64) -> Revocation {
        let _ = (lease_word, floor);
        Revocation::NotNeeded
    }

    /// Hands back the buffer of a read's output ([`OpOutput::Read`]) that its
    /// taker is done with, so that a transport which fills reads synchronously may
    /// fill a later read into it instead of allocating one ([`ReadBuffers`]).
    /// Protocol code calls it for the buffers it does not keep (a
    /// [`crate::Roundtrip`] gives back its replies' buffers when dropped). No effect
    /// on any result; the default drops the buffer.
    #[inline]
    fn give_back(&self, buffer: Vec<u8>) {
        drop(buffer);
    }

    /// A buffer of `len` bytes (their values unspecified) for a read the caller has
    /// the fabric fill in place ([`Fabric::read_direct`]): one given back earlier
    /// ([`Fabric::give_back`]) where the transport keeps them, so that a steady
    /// stream of such reads allocates nothing; a new one otherwise (the default).
    #[inline]
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        alloc::vec![0; len]
    }
}

impl<F: Fabric + ?Sized> Fabric for &F {
    fn node_count(&self) -> usize {
        (**self).node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        (**self).post(node, batch)
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        (**self).submit(node, batch, reply)
    }
    fn completes_in_submit(&self) -> bool {
        (**self).completes_in_submit()
    }
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        (**self).read_direct(node, addr, out)
    }
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        (**self).submit_in_place(node, batch, reply)
    }
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        (**self).prefetch(node, addr, len)
    }
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        (**self).post_detached(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        (**self).poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        (**self).forget(ticket)
    }
    fn settled(&self, ticket: Ticket) -> bool {
        (**self).settled(ticket)
    }
    fn progress(&self) -> bool {
        (**self).progress()
    }
    fn now(&self) -> Nanos {
        (**self).now()
    }
    fn recent_now(&self) -> Nanos {
        (**self).recent_now()
    }
    fn wake_at(&self, deadline: Nanos) {
        (**self).wake_at(deadline)
    }
    fn yielded(&self) {
        (**self).yielded()
    }
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        (**self).admit(node, incarnation)
    }
    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        (**self).memory_lost(node, incarnation)
    }
    fn fence_owner(&self, fence: OwnerFence) -> usize {
        (**self).fence_owner(fence)
    }
    fn revoke_owner(&self, lease_word: u64, floor: u64) -> Revocation {
        (**self).revoke_owner(lease_word, floor)
    }
    fn give_back(&self, buffer: Vec<u8>) {
        (**self).give_back(buffer)
    }
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        (**self).take_buffer(len)
    }
}

/// Checks that `[addr, addr + len)` lies inside a node of `size` bytes: the check
/// every transport runs before touching memory.
#[inline]
pub fn check_bounds(node: NodeId, addr: u64, len: u64, size: u64) -> Result<(), FabricError> {
    match addr.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(FabricError::OutOfBounds {
            node,
            addr,
            len,
            size,
        }),
    }
}

/// Checks a CAS target: in bounds and 8-byte aligned.
#[inline]
pub fn check_cas(node: NodeId, addr: u64, size: u64) -> Result<(), FabricError> {
    if !addr.is_multiple_of(8) {
        return Err(FabricError::Misaligned { node, addr });
    }
    check_bounds(node, addr, 8, size)
}

/// Checks every operation of a batch against a node of `size` bytes.
pub fn check_batch(node: NodeId, batch: &Batch, size: u64) -> Result<(), FabricError> {
    for op in batch.ops() {
        match op {
            Op::Read { addr, len } => check_bounds(node, *addr, u64::from(*len), size)?,
            Op::Write { addr, data } => check_bounds(node, *addr, data.len() as u64, size)?,
            Op::Cas { addr, .. } => check_cas(node, *addr, size)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_reject_overflow_and_past_end() {
        let n = NodeId(1);
        assert!(check_bounds(n, 0, 64, 64).is_ok());
        assert!(check_bounds(n, 1, 64, 64).is_err());
        assert!(check_bounds(n, u64::MAX, 2, 64).is_err());
        assert!(check_cas(n, 4, 64).is_err());
        assert!(check_cas(n, 56, 64).is_ok());
        assert!(check_cas(n, 64, 64).is_err());
    }
}
