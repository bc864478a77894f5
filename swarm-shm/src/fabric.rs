//! [`ShmFabric`]: one client thread's [`Fabric`] over a shared-memory cluster.
//!
//! Batches execute synchronously inside [`Fabric::post`]: the memory is local, so
//! there is nothing to wait for, and [`Fabric::submit`] (the path protocol code
//! takes) hands the result back at once, with no ticket. Faults and latency are wrappers around any fabric
//! (`swarm_core::fabric`): [`EmulatedRtt`] delivers completions a roundtrip after
//! posting, for latency experiments on one host (batches posted to several nodes in
//! one protocol step overlap and cost one roundtrip together, as on RDMA), and
//! [`FailNodes`] makes nodes crashed *for one client* (their batches are not executed
//! and never complete, which is how a crashed memory node looks to a client, SWARM
//! §2.1). [`ShmCluster::client_with`] builds both around a handle.
//!
//! [`EmulatedRtt`]: swarm_core::fabric::EmulatedRtt
//! [`FailNodes`]: swarm_core::fabric::FailNodes

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use swarm_core::fabric::{InPlaceReply, Nanos, ReadBuffers, Submitted, TicketSlab};
use swarm_core::{Batch, Completion, Fabric, FabricError, FailureCause, NodeId, Ticket};

use crate::cluster::ShmCluster;
use crate::monotonic::monotonic_ns;

/// Waits longer than this (ns) sleep in [`Fabric::progress`] instead of spinning.
const SLEEP_ABOVE_NS: u64 = 2_000_000;

/// A [`ShmFabric`] with an emulated roundtrip and nodes that can be crashed for it
/// ([`ShmCluster::client_with`]).
pub type EmulatedFabric = swarm_core::fabric::FailNodes<swarm_core::fabric::EmulatedRtt<ShmFabric>>;

/// One client thread's handle on a [`ShmCluster`]; see the module docs.
///
/// Not `Sync` (it keeps per-thread ticket state in cells); create one per thread with
/// [`ShmCluster::client`] or [`ShmFabric::new`].
pub struct ShmFabric {
    cluster: Arc<ShmCluster>,
    /// `CLOCK_MONOTONIC` when the handle was made: [`Fabric::now`] counts from it.
    origin: u64,
    /// Results not yet taken: every batch completes inside `post`.
    slab: RefCell<TicketSlab<()>>,
    /// The latest deadline asked for with [`Fabric::wake_at`] and not reported yet.
    wake: Cell<Nanos>,
    /// Read buffers given back ([`Fabric::give_back`]) for the next reads to fill.
    buffers: ReadBuffers,
}

impl fmt::Debug for ShmFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmFabric")
            .field("dir", &self.cluster.dir())
            .field("slab", &self.slab.borrow())
            .finish()
    }
}

impl ShmFabric {
    /// A client handle.
    pub fn new(cluster: Arc<ShmCluster>) -> Self {
        Self {
            cluster,
            origin: monotonic_ns(),
            slab: RefCell::new(TicketSlab::new()),
            wake: Cell::new(0),
            buffers: ReadBuffers::new(),
        }
    }

    /// The cluster this handle operates on.
    pub fn cluster(&self) -> &Arc<ShmCluster> {
        &self.cluster
    }

    /// Checks the whole batch, then executes it on `node`. Invalid batches are
    /// refused at once, like a local validation error, without a roundtrip.
    #[inline]
    fn execute(
        &self,
        node: NodeId,
        batch: &Batch,
        out: &mut Completion,
    ) -> Result<(), FabricError> {
        match self.cluster.node(node) {
            Some(memory) => memory.execute_reusing(batch, out, &self.buffers),
            // Absent (its file was unusable at open): it behaves as crashed.
            None if node.index() < self.cluster.node_count() => Err(FabricError::NodeFailed {
                node,
                cause: FailureCause::Crashed,
            }),
            None => Err(FabricError::NoSuchNode {
                node,
                nodes: self.cluster.node_count(),
            }),
        }
    }
}

impl Fabric for ShmFabric {
    fn node_count(&self) -> usize {
        self.cluster.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.slab
            .borrow_mut()
            .insert_executed(|out| self.execute(node, &batch, out))
    }

    #[inline]
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        Submitted::executed(self.execute(node, batch, reply))
    }

    /// Executes the batch at once, as `submit` would, but fills no completion for
    /// the result nobody looks at ([`NodeMemory::execute_detached`]). An invalid
    /// batch, an absent or a retired node: nothing happens, as `submit` then
    /// `forget` would leave it.
    ///
    /// [`NodeMemory::execute_detached`]: crate::NodeMemory::execute_detached
    #[inline]
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        if let Some(memory) = self.cluster.node(node) {
            let _ = memory.execute_detached(batch);
        }
    }

    #[inline]
    fn completes_in_submit(&self) -> bool {
        true
    }

    /// The read a one-read batch would do ([`crate::NodeMemory::read`]: bounds
    /// checked against the mapping first). An absent or retired node: `None`, and
    /// the batch path fails the read as [`Fabric::submit`] does.
    #[inline]
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        let memory = self.cluster.node(node)?;
        if memory.is_retired() {
            return None;
        }
        Some(memory.read(addr, out))
    }

    /// The batch `submit` would execute ([`crate::NodeMemory::execute_in_place`]:
    /// checked first, a retired node failing it). An absent node, or reads that do
    /// not fit in `reply`: `None`, and the batch path does it.
    #[inline]
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        let memory = self.cluster.node(node)?;
        if !reply.fits(batch) {
            return None;
        }
        Some(memory.execute_in_place(batch, reply))
    }

    #[inline]
    fn give_back(&self, buffer: Vec<u8>) {
        self.buffers.give_back(buffer);
    }

    #[inline]
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        self.buffers.take_for_read(len)
    }

    #[inline]
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        if let Some(memory) = self.cluster.node(node) {
            memory.prefetch(addr, len);
        }
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.slab.borrow_mut().poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.slab.borrow_mut().forget(ticket);
    }

    fn progress(&self) -> bool {
        // Nothing is ever in flight here: the only event is a deadline a waiter set.
        let wake = self.wake.get();
        if wake == 0 {
            return false;
        }
        // Sleep through most of a long wait (a repair's quiescence, a full log's wait
        // for a slot's grace): spinning would take a core from the other clients. The
        // last stretch spins, since a sleep may overshoot by tens of microseconds.
        let now = self.now();
        if wake.saturating_sub(now) > SLEEP_ABOVE_NS {
            std::thread::sleep(std::time::Duration::from_nanos(
                wake - now - SLEEP_ABOVE_NS / 2,
            ));
        }
        // Spin until it passes (a deadline that passed since the last call is an event
        // the waiter has not seen yet: its thread may have been descheduled).
        while self.now() < wake {
            std::hint::spin_loop();
        }
        self.wake.set(0);
        true
    }

    fn now(&self) -> Nanos {
        monotonic_ns().saturating_sub(self.origin)
    }

    fn wake_at(&self, deadline: Nanos) {
        self.wake.set(self.wake.get().max(deadline));
    }

    // A deadline long passed: the next `progress` returns `true` without reading the
    // clock here (the default's `now() + 1`).
    fn yielded(&self) {
        self.wake.set(self.wake.get().max(1));
    }

    /// Maps the node's file if it holds `incarnation` ([`ShmCluster::admit`]); every
    /// handle on the same opened cluster reaches it from then on.
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        match self.cluster.admit(node, incarnation) {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%node, %error, "cannot admit the memory node");
                false
            }
        }
    }

    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.cluster.memory_lost(node, incarnation)
    }
}

#[cfg(test)]
mod tests;
