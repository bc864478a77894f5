//! Memory hints: a Safe-Guess read or write hints the fabric at every byte its
//! batches touch before posting them ([`Fabric::prefetch`]), so that on local memory
//! the cache misses of the replicas, and of the places in one replica, overlap.
//!
//! Hints change no result, so only a fabric that records them can tell whether they
//! are given: [`Hinted`] wraps the in-process fabric, records every hint of an
//! operation, and checks each batch the operation posts against them.

use std::cell::{Cell, RefCell};
use std::task::Poll;

use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Nanos, Submitted};
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Completion, Fabric, FabricError, FixedClock, MemCluster, MemFabric, NodeId, Op,
    OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, Ticket, WriteOutcome,
    block_on_future,
};

/// A fabric that records the hints it is given and, for every batch posted (waited
/// for or in the background), the operations of it whose bytes no earlier hint
/// covered.
struct Hinted<F> {
    inner: F,
    hints: RefCell<Vec<(NodeId, u64, u64)>>,
    /// `(node, op index, addr, len)` of every operation posted without a hint
    /// covering its bytes.
    unhinted: RefCell<Vec<(NodeId, usize, u64, u64)>>,
    /// Batches submitted so far.
    submitted: Cell<usize>,
}

impl<F: Fabric> Hinted<F> {
    fn new(inner: F) -> Self {
        Self {
            inner,
            hints: RefCell::default(),
            unhinted: RefCell::default(),
            submitted: Cell::new(0),
        }
    }

    /// Forgets what was recorded: the next operation starts with no hint.
    fn reset(&self) {
        self.hints.borrow_mut().clear();
        self.unhinted.borrow_mut().clear();
        self.submitted.set(0);
    }

    /// Records the operations of `batch` that no hint to `node` covers.
    fn check(&self, node: NodeId, batch: &Batch) {
        for (i, op) in batch.ops().iter().enumerate() {
            let (addr, len) = match op {
                Op::Read { addr, len } => (*addr, u64::from(*len)),
                Op::Write { addr, data } => (*addr, data.len() as u64),
                Op::Cas { addr, .. } => (*addr, 8),
            };
            if !self.covered(node, addr, len) {
                self.unhinted.borrow_mut().push((node, i, addr, len));
            }
        }
    }

    fn covered(&self, node: NodeId, addr: u64, len: u64) -> bool {
        self.hints
            .borrow()
            .iter()
            .any(|&(n, a, l)| n == node && a <= addr && addr + len <= a + l)
    }
}

impl<F: Fabric> Fabric for Hinted<F> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.inner.post(node, batch)
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        self.submitted.set(self.submitted.get() + 1);
        self.check(node, batch);
        self.inner.submit(node, batch, reply)
    }
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        self.hints.borrow_mut().push((node, addr, len));
        self.inner.prefetch(node, addr, len);
    }
    // Background posts (a write's VERIFIED marks and in-place copy) are checked too.
    fn post_detached(&self, node: NodeId, batch: Batch) {
        self.check(node, &batch);
        self.inner.post_detached(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline)
    }
}

fn client(cluster: &MemCluster) -> Client<Hinted<MemFabric>, FixedClock> {
    let layout = Layout::builder()
        .payload_max(64)
        .meta_words(8)
        .log_base(1 << 16)
        .writers(4)
        .slots_per_writer(64)
        .build()
        .unwrap();
    Client::new(
        Hinted::new(cluster.client()),
        FixedClock(1_000),
        layout,
        WriterId::new(1).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap()
}

/// Every batch a common-case write or read posts was hinted in full first: the
/// metadata words, the out-of-place buffer and the in-place block alike (a write's
/// VERIFIED marks and in-place copy, posted in the background, included).
#[test]
fn reads_and_writes_hint_every_byte_they_touch_before_posting() {
    let cluster = MemCluster::new(3, 1 << 20);
    let client = client(&cluster);
    let fabric = client.fabric();
    let reg = RegisterLoc {
        addr: 4096,
        replicas: Replicas::all(3, 0).unwrap(),
    };
    let mut cache = RegisterCache::new();
    for i in 0..4u8 {
        fabric.reset();
        let stats = OpStats::new();
        let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[i; 40]));
        assert_eq!(written, Ok(Ok(WriteOutcome::Written)), "write {i}");
        assert_eq!(stats.roundtrips(), 1, "write {i}: the common case");
        assert!(
            fabric.submitted.get() >= 2,
            "write {i}: posts to a majority"
        );
        assert_eq!(
            *fabric.unhinted.borrow(),
            [],
            "write {i}: operations posted without a hint (node, op, addr, len)"
        );

        fabric.reset();
        let stats = OpStats::new();
        let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
        assert_eq!(read, Ok(Ok(ReadValue::Value(vec![i; 40]))), "read {i}");
        assert!(fabric.submitted.get() >= 2, "read {i}: reads a majority");
        assert_eq!(
            *fabric.unhinted.borrow(),
            [],
            "read {i}: operations posted without a hint (node, op, addr, len)"
        );
    }
}
