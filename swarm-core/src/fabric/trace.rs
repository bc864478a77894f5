//! Watching what a client asks of its fabric, in the manner of smoltcp's `Tracer`
//! device: [`Traced`] wraps any fabric, is itself a [`Fabric`], and shows every batch
//! and every memory hint to a [`Tracer`] on its way through, changing nothing.
//!
//! Tests use it to check the order of a protocol's hints and posts
//! (`swarm-core/tests/prefetch_hints.rs`, `swarm-kv/tests/kv_hints.rs`) and to run
//! another client's operation at a chosen instant of this one's, right after a given
//! batch was posted (on shared memory, executed). Every other method is forwarded as
//! it is, [`Fabric::submit`] included, so the fast path of a synchronous fabric
//! survives the wrapper.

use core::task::Poll;

use super::{Batch, Completion, Fabric, FabricError, Nanos, NodeId, Submitted, Ticket};

/// What a [`Traced`] fabric shows: each method is called on the thread of the client
/// that posts, and does nothing by default.
pub trait Tracer {
    /// `batch` is about to go to `node` through [`Fabric::post`] or
    /// [`Fabric::submit`]: a step will wait for its result.
    fn batch(&self, node: NodeId, batch: &Batch) {
        let _ = (node, batch);
    }

    /// `batch` is about to go to `node` through [`Fabric::post_detached`]: background
    /// work nobody waits for. The default shows it as any other [`Tracer::batch`].
    fn detached(&self, node: NodeId, batch: &Batch) {
        self.batch(node, batch);
    }

    /// The batch shown last ([`Tracer::batch`], [`Tracer::detached`]) was handed to
    /// the inner fabric; a fabric over local memory (shared memory, the in-process
    /// fabric) has executed it by now.
    fn posted(&self, node: NodeId) {
        let _ = node;
    }

    /// A hint that a batch about to go to `node` touches `addr..addr + len`
    /// ([`Fabric::prefetch`]).
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        let _ = (node, addr, len);
    }
}

impl<T: Tracer + ?Sized> Tracer for &T {
    fn batch(&self, node: NodeId, batch: &Batch) {
        (**self).batch(node, batch)
    }
    fn detached(&self, node: NodeId, batch: &Batch) {
        (**self).detached(node, batch)
    }
    fn posted(&self, node: NodeId) {
        (**self).posted(node)
    }
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        (**self).prefetch(node, addr, len)
    }
}

/// A fabric that shows every batch and hint to a [`Tracer`]; see the module docs.
#[derive(Debug)]
pub struct Traced<F, T> {
    inner: F,
    tracer: T,
}

impl<F: Fabric, T: Tracer> Traced<F, T> {
    /// Wraps `inner`, showing what goes through it to `tracer`.
    pub fn new(inner: F, tracer: T) -> Self {
        Self { inner, tracer }
    }

    /// The wrapped fabric.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// The tracer, to read what it recorded.
    pub fn tracer(&self) -> &T {
        &self.tracer
    }
}

impl<F: Fabric, T: Tracer> Fabric for Traced<F, T> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.tracer.batch(node, &batch);
        let ticket = self.inner.post(node, batch);
        self.tracer.posted(node);
        ticket
    }

    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        self.tracer.batch(node, batch);
        let submitted = self.inner.submit(node, batch, reply);
        self.tracer.posted(node);
        submitted
    }

    fn give_back(&self, buffer: alloc::vec::Vec<u8>) {
        self.inner.give_back(buffer);
    }

    fn take_buffer(&self, len: usize) -> alloc::vec::Vec<u8> {
        self.inner.take_buffer(len)
    }

    fn completes_in_submit(&self) -> bool {
        self.inner.completes_in_submit()
    }

    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        self.tracer.prefetch(node, addr, len);
        self.inner.prefetch(node, addr, len);
    }

    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        self.tracer.detached(node, batch);
        self.inner.post_detached(node, batch);
        self.tracer.posted(node);
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket);
    }

    fn settled(&self, ticket: Ticket) -> bool {
        self.inner.settled(ticket)
    }

    fn progress(&self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemCluster;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    #[derive(Default)]
    struct Log(RefCell<Vec<&'static str>>);

    impl Tracer for Log {
        fn batch(&self, _: NodeId, _: &Batch) {
            self.0.borrow_mut().push("batch");
        }
        fn posted(&self, _: NodeId) {
            self.0.borrow_mut().push("posted");
        }
        fn prefetch(&self, _: NodeId, _: u64, _: u64) {
            self.0.borrow_mut().push("prefetch");
        }
    }

    #[test]
    fn every_batch_and_hint_is_shown_in_order_and_results_are_unchanged() {
        let cluster = MemCluster::new(1, 4096);
        let fabric = Traced::new(cluster.client(), Log::default());
        let node = NodeId(0);
        fabric.prefetch(node, 0, 8);
        let mut batch = Batch::write(0, alloc::vec![7u8; 8]);
        let mut reply = Completion::new();
        let submitted = fabric.submit(node, &mut batch, &mut reply);
        assert!(matches!(submitted, Submitted::Done), "{submitted:?}");
        fabric.post_detached(node, &mut Batch::write(8, alloc::vec![9u8; 8]));
        let ticket = fabric.post(node, Batch::read(0, 16));
        let Poll::Ready(Ok(read)) = fabric.poll(ticket) else {
            panic!("the in-process fabric completes a read at once");
        };
        let mut expected = alloc::vec![7u8; 8];
        expected.extend([9u8; 8]);
        assert_eq!(read.read(0), Some(&expected[..]));
        assert_eq!(
            *fabric.tracer().0.borrow(),
            [
                "prefetch", "batch", "posted", "batch", "posted", "batch", "posted"
            ]
        );
    }
}
