//! An in-process fabric: memory nodes as arrays of atomic words.
//!
//! This is the smallest honest implementation of the fabric contract and the one the
//! `loom` models run on: every byte lives in an `AtomicU64` of the crate's sync facade,
//! and batches execute with [`crate::words`], the word-level code `swarm-shm` runs too
//! (reads and writes word by word, tearing at 8-byte granularity as on RDMA and CXL;
//! CAS atomic; the operations of a batch in order). Batches complete synchronously
//! inside [`Fabric::post`], and [`Fabric::submit`] returns their results at once.
//!
//! [`MemCluster`] holds the nodes and is shared by threads; each thread talks to it
//! through its own [`MemFabric`] handle. To test protocols with a crashed minority,
//! wrap a handle in [`crate::fabric::FailNodes`].

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::task::Poll;

use crate::fabric::{
    Batch, Completion, Fabric, FabricError, InPlaceReply, Nanos, NodeId, Submitted, Ticket,
    TicketSlab, check_batch, check_bounds,
};
use crate::sync::{Arc, AtomicU64};
use crate::words;

/// One memory node: `words.len() * 8` bytes.
struct MemNode {
    words: Box<[AtomicU64]>,
}

impl MemNode {
    fn new(bytes: usize) -> Self {
        let words = (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Self { words }
    }

    fn size(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    fn execute(&self, batch: &Batch, out: &mut Completion) {
        words::execute_into(&self.words, batch, out);
    }
}

/// Memory nodes shared by every thread of a process.
#[derive(Clone)]
pub struct MemCluster {
    nodes: Arc<Vec<MemNode>>,
}

impl core::fmt::Debug for MemCluster {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemCluster")
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl MemCluster {
    /// `nodes` zeroed memory nodes of `bytes_per_node` bytes (rounded up to 8).
    pub fn new(nodes: usize, bytes_per_node: usize) -> Self {
        let nodes = (0..nodes).map(|_| MemNode::new(bytes_per_node)).collect();
        Self {
            nodes: Arc::new(nodes),
        }
    }

    /// A client handle for the calling thread.
    pub fn client(&self) -> MemFabric {
        MemFabric {
            cluster: self.clone(),
            slab: RefCell::new(TicketSlab::new()),
            tick: Cell::new(0),
            wake: Cell::new(0),
        }
    }
}

/// One thread's handle on a [`MemCluster`].
pub struct MemFabric {
    cluster: MemCluster,
    /// Every batch completes inside `post`: no entry is ever pending.
    slab: RefCell<TicketSlab<()>>,
    /// Logical time: one tick per `progress` call.
    tick: Cell<Nanos>,
    /// The latest wake-up asked for with `wake_at`.
    wake: Cell<Nanos>,
}

impl core::fmt::Debug for MemFabric {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemFabric")
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl MemFabric {
    /// Checks and executes `batch` on `node`, its outputs appended to `out`.
    fn execute(
        &self,
        node: NodeId,
        batch: &Batch,
        out: &mut Completion,
    ) -> Result<(), FabricError> {
        let Some(mem) = self.cluster.nodes.get(node.index()) else {
            return Err(FabricError::NoSuchNode {
                node,
                nodes: self.cluster.nodes.len(),
            });
        };
        check_batch(node, batch, mem.size()).map(|()| mem.execute(batch, out))
    }
}

impl Fabric for MemFabric {
    fn node_count(&self) -> usize {
        self.cluster.nodes.len()
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

    fn completes_in_submit(&self) -> bool {
        true
    }

    /// The read a one-read batch would do, bounds checked first ([`check_bounds`]).
    #[inline]
    fn read_direct(
        &self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        // An unknown node: the batch path reports it.
        let mem = self.cluster.nodes.get(node.index())?;
        Some(
            check_bounds(node, addr, out.len() as u64, mem.size()).map(|()| {
                words::read(&mem.words, addr as usize, out);
            }),
        )
    }

    /// The batch `submit` would execute, checked first ([`check_batch`]), its
    /// results left in `reply`. An unknown node, or reads that do not fit: `None`,
    /// and the batch path does it.
    #[inline]
    fn submit_in_place(
        &self,
        node: NodeId,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        let mem = self.cluster.nodes.get(node.index())?;
        if !reply.fits(batch) {
            return None;
        }
        Some(
            check_batch(node, batch, mem.size())
                .map(|()| words::execute_in_place(&mem.words, batch, reply)),
        )
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.slab.borrow_mut().poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.slab.borrow_mut().forget(ticket);
    }

    fn progress(&self) -> bool {
        // Everything completes inside `post`: nothing is ever pending here. Logical
        // time moves on so that deadlines pass (a wrapper such as `FailNodes` may be
        // waiting for one).
        self.tick.set(self.tick.get() + 1);
        self.tick.get() <= self.wake.get()
    }

    fn now(&self) -> Nanos {
        self.tick.get()
    }

    fn wake_at(&self, deadline: Nanos) {
        self.wake.set(self.wake.get().max(deadline));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::exec::block_on_future;
    use crate::fabric::Op;
    use crate::roundtrip::{OpStats, Roundtrip};

    #[test]
    fn batch_executes_in_order_and_reports_cas_previous() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        let mut batch = Batch::new();
        batch
            .push(Op::Write {
                addr: 8,
                data: alloc::vec![7; 8].into(),
            })
            .unwrap()
            .push(Op::Cas {
                addr: 0,
                expected: 0,
                new: 5,
            })
            .unwrap()
            .push(Op::Read { addr: 0, len: 16 })
            .unwrap();
        let stats = OpStats::new();
        let completion = block_on_future(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            rt.post(NodeId(0), batch).unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.clone()
        })
        .unwrap();
        assert_eq!(completion.cas(1), Some(0));
        let read = completion.read(2).unwrap();
        assert_eq!(u64::from_le_bytes(read[..8].try_into().unwrap()), 5);
        assert_eq!(&read[8..], &[7; 8]);
        assert_eq!(stats.roundtrips(), 1);
    }

    #[test]
    fn out_of_bounds_and_misaligned_are_errors() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        let t = fabric.post(NodeId(0), Batch::read(60, 8));
        assert!(matches!(
            fabric.poll(t),
            Poll::Ready(Err(FabricError::OutOfBounds { .. }))
        ));
        let t = fabric.post(NodeId(0), Batch::cas(4, 0, 1));
        assert!(matches!(
            fabric.poll(t),
            Poll::Ready(Err(FabricError::Misaligned { .. }))
        ));
        let t = fabric.post(NodeId(3), Batch::read(0, 8));
        assert!(matches!(
            fabric.poll(t),
            Poll::Ready(Err(FabricError::NoSuchNode { .. }))
        ));
    }

    /// A batch held for a node crashed silently never completes, and is settled: it
    /// never reached memory. A batch held back only for an emulated roundtrip ran
    /// already. Neither wrapper knows better than its inner fabric otherwise.
    #[test]
    fn batches_that_can_never_land_are_settled() {
        use crate::fabric::{EmulatedRtt, FailNodes};
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(EmulatedRtt::new(cluster.client(), 1_000));
        let in_flight = fabric.post(NodeId(0), Batch::write(0, alloc::vec![1; 8]));
        assert!(
            fabric.poll(in_flight).is_pending(),
            "held for its roundtrip"
        );
        assert!(fabric.settled(in_flight), "but it ran already");
        fabric.fail_node(NodeId(2));
        let lost = fabric.post(NodeId(2), Batch::write(0, alloc::vec![2; 8]));
        assert!(fabric.poll(lost).is_pending());
        assert!(fabric.settled(lost), "never sent");
        assert!(!cluster.client().settled(Ticket(0)), "not known by default");
    }

    #[test]
    fn majority_wait_ignores_a_failed_node_and_stalls_without_majority() {
        let cluster = MemCluster::new(3, 64);
        let fabric = crate::fabric::FailNodes::new(cluster.client());
        fabric.fail_node(NodeId(2));
        let stats = OpStats::new();
        let reached = block_on_future(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for n in 0..3 {
                rt.post(NodeId(n), Batch::read(0, 8)).unwrap();
            }
            rt.wait(2).await
        })
        .unwrap();
        assert_eq!(reached, Ok(()));

        fabric.fail_node(NodeId(1));
        let stalled = block_on_future(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for n in 0..3 {
                rt.post(NodeId(n), Batch::read(0, 8)).unwrap();
            }
            rt.wait(2).await
        });
        assert_eq!(stalled, Err(FabricError::Stalled));
    }
}
