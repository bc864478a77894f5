//! [`ShmFabric`]: one client thread's [`Fabric`] over a shared-memory cluster.
//!
//! Batches execute synchronously inside [`Fabric::post`]: the memory is local, so
//! there is nothing to wait for. To run latency experiments on one host, a fabric can
//! emulate a roundtrip time: a batch's effects are visible at once (on a real fabric
//! they land about half a roundtrip after posting), but its completion is delivered
//! only `rtt_ns` after it was posted. Batches posted to several nodes in one protocol
//! step thus overlap and cost one roundtrip together, as on RDMA. [`Fabric::progress`]
//! spins until the earliest pending completion is due.
//!
//! Fault injection: [`ShmFabric::fail_node`] makes a node crashed *for this client*.
//! Its batches are not executed and never complete, and batches to it still in flight
//! are lost, which is how a crashed memory node looks to a client (SWARM §2.1: the
//! protocol waits for a majority, never for all).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use swarm_core::fabric::{FailureCause, Nanos, TicketSlab};
use swarm_core::{Batch, Completion, Fabric, FabricError, NodeId, Ticket};

use crate::cluster::ShmCluster;

/// A batch whose completion is not delivered yet.
#[derive(Debug)]
struct InFlight {
    node: NodeId,
    /// When the completion is due, on [`ShmFabric::now`]'s clock.
    ready_at: Nanos,
    /// The batch's result; `None` if the node failed: then it never completes.
    result: Option<Result<Completion, FabricError>>,
}

/// One client thread's handle on a [`ShmCluster`]; see the module docs.
///
/// Not `Sync` (it keeps per-thread ticket state in cells); create one per thread with
/// [`ShmCluster::client`] or [`ShmFabric::new`].
pub struct ShmFabric {
    cluster: Arc<ShmCluster>,
    rtt_ns: Nanos,
    origin: Instant,
    failed: Box<[Cell<bool>]>,
    slab: RefCell<TicketSlab<InFlight>>,
    /// The latest deadline asked for with [`Fabric::wake_at`].
    wake: Cell<Nanos>,
}

impl fmt::Debug for ShmFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed: Vec<usize> = (0..self.failed.len())
            .filter(|&i| self.failed[i].get())
            .collect();
        f.debug_struct("ShmFabric")
            .field("dir", &self.cluster.dir())
            .field("rtt_ns", &self.rtt_ns)
            .field("failed", &failed)
            .field("slab", &self.slab.borrow())
            .finish()
    }
}

impl ShmFabric {
    /// A client handle with no emulated latency.
    pub fn new(cluster: Arc<ShmCluster>) -> Self {
        let failed = (0..cluster.node_count())
            .map(|_| Cell::new(false))
            .collect();
        Self {
            cluster,
            rtt_ns: 0,
            origin: Instant::now(),
            failed,
            slab: RefCell::new(TicketSlab::new()),
            wake: Cell::new(0),
        }
    }

    /// Emulates a roundtrip time: completions are delivered `rtt_ns` after posting
    /// (e.g. ~300 for CXL-like, ~1500 for RDMA-like latency; 0, the default, delivers
    /// them at once).
    pub fn with_rtt_ns(mut self, rtt_ns: Nanos) -> Self {
        self.rtt_ns = rtt_ns;
        self
    }

    /// The emulated roundtrip time in ns.
    pub fn rtt_ns(&self) -> Nanos {
        self.rtt_ns
    }

    /// The cluster this handle operates on.
    pub fn cluster(&self) -> &Arc<ShmCluster> {
        &self.cluster
    }

    /// Marks `node` crashed for this client: batches posted to it from now on never
    /// complete, nor do those still in flight. Unknown nodes are ignored.
    pub fn fail_node(&self, node: NodeId) {
        let Some(flag) = self.failed.get(node.index()) else {
            return;
        };
        flag.set(true);
        let mut slab = self.slab.borrow_mut();
        let lost: Vec<Ticket> = slab
            .pending_iter()
            .filter(|(_, batch)| batch.node == node)
            .map(|(ticket, _)| ticket)
            .collect();
        for ticket in lost {
            if let Some(batch) = slab.pending_mut(ticket) {
                batch.result = None;
            }
        }
    }

    /// Whether `node` was marked crashed for this client.
    pub fn is_failed(&self, node: NodeId) -> bool {
        self.failed.get(node.index()).is_some_and(Cell::get)
    }

    /// Delivers every completion due at `now`; returns how many.
    fn deliver(slab: &mut TicketSlab<InFlight>, now: Nanos) -> usize {
        let mut delivered = 0;
        loop {
            let due = slab
                .pending_iter()
                .find(|(_, batch)| batch.result.is_some() && batch.ready_at <= now)
                .map(|(ticket, _)| ticket);
            let Some(ticket) = due else {
                return delivered;
            };
            if let Some(result) = slab
                .pending_mut(ticket)
                .and_then(|batch| batch.result.take())
            {
                slab.complete(ticket, result);
                delivered += 1;
            }
        }
    }
}

impl Fabric for ShmFabric {
    fn node_count(&self) -> usize {
        self.cluster.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let mut slab = self.slab.borrow_mut();
        let Some(memory) = self.cluster.node(node) else {
            return slab.insert_done(Err(FabricError::NoSuchNode {
                node,
                nodes: self.cluster.node_count(),
            }));
        };
        if self.is_failed(node) {
            return slab.insert_pending(InFlight {
                node,
                ready_at: Nanos::MAX,
                result: None,
            });
        }
        // Checks the whole batch before executing any of it. Invalid batches are
        // refused at once, like a local validation error, without a roundtrip.
        let result = memory.execute(&batch);
        if self.rtt_ns == 0 || result.is_err() {
            return slab.insert_done(result);
        }
        slab.insert_pending(InFlight {
            node,
            ready_at: self.now().saturating_add(self.rtt_ns),
            result: Some(result),
        })
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.slab.borrow_mut().poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        let mut slab = self.slab.borrow_mut();
        slab.forget(ticket);
        // A forgotten batch stuck on a failed node would hold its slot forever: drop
        // it now (nobody will see the result).
        if let Some(batch) = slab.pending_mut(ticket)
            && batch.result.is_none()
        {
            let node = batch.node;
            slab.complete(
                ticket,
                Err(FabricError::NodeFailed {
                    node,
                    cause: FailureCause::Crashed,
                }),
            );
        }
    }

    fn progress(&self) -> bool {
        let mut slab = self.slab.borrow_mut();
        let now = self.now();
        if Self::deliver(&mut slab, now) > 0 {
            return true;
        }
        // A deadline that passed since the last call is an event the waiter has not
        // seen yet (its thread may have been descheduled after its last poll).
        let wake = self.wake.get();
        if wake != 0 && wake <= now {
            self.wake.set(0);
            return true;
        }
        let next_completion = slab
            .pending_iter()
            .filter(|(_, batch)| batch.result.is_some())
            .map(|(_, batch)| batch.ready_at)
            .min();
        let wake = Some(self.wake.get()).filter(|&wake| wake > now);
        // Spin until the next event: a completion due, or a deadline a waiter set.
        let Some(until) = next_completion.into_iter().chain(wake).min() else {
            // Nothing can complete and no deadline is pending: only batches stuck
            // on failed nodes (if any) remain.
            return false;
        };
        let mut now = now;
        while now < until {
            std::hint::spin_loop();
            now = self.now();
        }
        Self::deliver(&mut slab, now);
        if self.wake.get() <= now {
            // Reported by this call.
            self.wake.set(0);
        }
        true
    }

    fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn wake_at(&self, deadline: Nanos) {
        self.wake.set(self.wake.get().max(deadline));
    }
}

#[cfg(test)]
mod tests;
