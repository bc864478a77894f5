//! Fault-injecting fabrics shared by SWARM-KV's integration tests.

#![allow(dead_code)]

use std::cell::RefCell;
use std::task::Poll;

use swarm_core::fabric::{Completion, FabricError, FailureCause, Ticket};
use swarm_core::{Batch, Fabric, NodeId};

/// A fabric on which chosen nodes fail every batch at once with `NodeFailed`, as
/// crashed RDMA memory nodes do (the shared-memory fabric's `fail_node` makes them
/// silent instead, which stalls an operation that needs them).
pub struct ErroringNodes<F> {
    inner: F,
    failed: RefCell<Vec<bool>>,
    /// Results of batches posted to failed nodes, by ticket number minus `ERRORED`.
    errors: RefCell<Vec<Option<FabricError>>>,
}

const ERRORED: u32 = 1 << 31;

impl<F: Fabric> ErroringNodes<F> {
    /// Wraps `inner`, with every node up.
    pub fn new(inner: F) -> Self {
        let nodes = inner.node_count();
        Self {
            inner,
            failed: RefCell::new(vec![false; nodes]),
            errors: RefCell::new(Vec::new()),
        }
    }

    /// Crashes `node`: every batch posted to it from now on fails at once.
    pub fn fail(&self, node: NodeId) {
        self.failed.borrow_mut()[node.index()] = true;
    }
}

impl<F: Fabric> Fabric for ErroringNodes<F> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if !self
            .failed
            .borrow()
            .get(node.index())
            .copied()
            .unwrap_or(false)
        {
            return self.inner.post(node, batch);
        }
        let mut errors = self.errors.borrow_mut();
        errors.push(Some(FabricError::NodeFailed {
            node,
            cause: FailureCause::Crashed,
        }));
        Ticket(ERRORED | (errors.len() as u32 - 1))
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 & ERRORED == 0 {
            return self.inner.poll(ticket);
        }
        let error = self.errors.borrow_mut()[(ticket.0 & !ERRORED) as usize].take();
        Poll::Ready(Err(error.expect("polled once")))
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & ERRORED == 0 {
            self.inner.forget(ticket);
        }
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn wake_at(&self, deadline: u64) {
        self.inner.wake_at(deadline);
    }
}
