//! Roundtrips: the one place where protocol code waits on the fabric.
//!
//! A *roundtrip* (SWARM §2.1) is one step "post ordered batches to some nodes, wait
//! for `k` of them". Protocol code can only obtain fabric results through a
//! [`Roundtrip`], and creating one increments the operation's [`OpStats`], so the
//! roundtrip count (the paper's Table 2) cannot be forgotten or faked. Extending a
//! step to fallback nodes after a timeout ([`Roundtrip::escalate`]) counts as one more
//! roundtrip: it costs the caller about one more network delay.
//!
//! A roundtrip waits for a quorum, never for all (SWARM §2.2: only a majority of memory
//! nodes is assumed alive): batches still outstanding when the quorum is reached are
//! *forgotten* when the roundtrip is dropped; they still execute, their results are
//! discarded.

use alloc::vec::Vec;
use core::cell::Cell;
use core::future::poll_fn;
use core::task::Poll;

use crate::fabric::{Batch, Completion, Fabric, FabricError, Nanos, NodeId, Ticket};

/// The most nodes one roundtrip can address (replication factors up to 15).
pub const MAX_NODES: usize = 16;

/// Statistics of one protocol operation; today, its roundtrip count.
#[derive(Debug, Default)]
pub struct OpStats {
    roundtrips: Cell<u32>,
    iterations: Cell<u32>,
}

impl OpStats {
    /// Fresh statistics, zero roundtrips.
    pub const fn new() -> Self {
        Self {
            roundtrips: Cell::new(0),
            iterations: Cell::new(0),
        }
    }

    /// Roundtrips the operation has waited for so far.
    pub fn roundtrips(&self) -> u32 {
        self.roundtrips.get()
    }

    /// Iterations of a Safe-Guess read loop (appendix C bounds them by
    /// `2·writers + 1`); zero for other operations.
    pub fn iterations(&self) -> u32 {
        self.iterations.get()
    }

    /// Counts one more read-loop iteration; returns the new count.
    pub fn count_iteration(&self) -> u32 {
        let next = self.iterations.get().saturating_add(1);
        self.iterations.set(next);
        next
    }

    fn count(&self) {
        self.roundtrips.set(self.roundtrips.get().saturating_add(1));
    }
}

/// How a bounded wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// At least `k` nodes answered successfully.
    Reached,
    /// The deadline passed first, or too few posted nodes can still answer: time to
    /// post to fallback nodes.
    Short,
}

/// One quorum step of a protocol operation. See the module docs.
#[derive(Debug)]
pub struct Roundtrip<'a, F: Fabric + ?Sized> {
    fabric: &'a F,
    stats: &'a OpStats,
    outstanding: heapless::Vec<(NodeId, Ticket), MAX_NODES>,
    // Heap-allocated: completions are large and a roundtrip is moved by value.
    replies: Vec<(NodeId, Completion)>,
    failures: Vec<(NodeId, FabricError)>,
}

impl<'a, F: Fabric + ?Sized> Roundtrip<'a, F> {
    /// Starts a roundtrip and counts it in `stats`.
    pub fn start(fabric: &'a F, stats: &'a OpStats) -> Self {
        stats.count();
        Self {
            fabric,
            stats,
            outstanding: heapless::Vec::new(),
            replies: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Posts `batch` to `node` as part of this step.
    pub fn post(&mut self, node: NodeId, batch: Batch) -> Result<(), FabricError> {
        if self.outstanding.len() + self.replies.len() + self.failures.len() >= MAX_NODES {
            return Err(FabricError::TooManyPosts { max: MAX_NODES });
        }
        let ticket = self.fabric.post(node, batch);
        // Capacity checked above.
        let _ = self.outstanding.push((node, ticket));
        Ok(())
    }

    /// Counts one more roundtrip: the caller is about to post to fallback nodes
    /// because the preferred ones were slow or failed.
    pub fn escalate(&mut self) {
        self.stats.count();
    }

    /// Whether `node` was already posted to in this step.
    pub fn contacted(&self, node: NodeId) -> bool {
        self.outstanding.iter().any(|(n, _)| *n == node)
            || self.replies.iter().any(|(n, _)| *n == node)
            || self.failures.iter().any(|(n, _)| *n == node)
    }

    /// Successful replies received so far, in arrival order.
    pub fn replies(&self) -> &[(NodeId, Completion)] {
        &self.replies
    }

    /// Mutable access to the replies (to take read buffers out of them).
    pub fn replies_mut(&mut self) -> &mut [(NodeId, Completion)] {
        &mut self.replies
    }

    /// Nodes that answered with an error in this step.
    pub fn failures(&self) -> &[(NodeId, FabricError)] {
        &self.failures
    }

    /// Collects whatever completed; returns how many successes there are now.
    fn collect(&mut self) -> usize {
        let mut i = 0;
        while i < self.outstanding.len() {
            let (node, ticket) = self.outstanding[i];
            match self.fabric.poll(ticket) {
                Poll::Pending => i += 1,
                Poll::Ready(result) => {
                    self.outstanding.swap_remove(i);
                    match result {
                        Ok(completion) => self.replies.push((node, completion)),
                        Err(error) => self.failures.push((node, error)),
                    }
                }
            }
        }
        self.replies.len()
    }

    /// Whether `k` posted nodes have answered successfully already, without waiting.
    /// Lets a caller skip work (such as reading the clock for a deadline) when a
    /// fabric completes batches inside `post`, as shared memory does.
    pub fn reached(&mut self, k: usize) -> bool {
        self.collect() >= k
    }

    /// Waits until `k` posted nodes answered successfully. Fails with
    /// [`FabricError::NotEnoughLiveNodes`] as soon as too few can still answer.
    pub async fn wait(&mut self, k: usize) -> Result<(), FabricError> {
        poll_fn(|cx| {
            let ok = self.collect();
            if ok >= k {
                return Poll::Ready(Ok(()));
            }
            if ok + self.outstanding.len() < k {
                return Poll::Ready(Err(FabricError::NotEnoughLiveNodes {
                    needed: k,
                    live: ok + self.outstanding.len(),
                }));
            }
            // Our futures are driven by re-polling after `Fabric::progress`; ask any
            // other executor to poll again too.
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    /// Waits until `k` posted nodes answered, the fabric clock reaches `deadline`, or
    /// too few posted nodes can still answer, whichever comes first.
    pub async fn wait_until(&mut self, k: usize, deadline: Nanos) -> WaitOutcome {
        self.fabric.wake_at(deadline);
        poll_fn(|cx| {
            // The clock is read *before* collecting: a thread preempted between the
            // two (more client threads than cores) must not find the deadline passed
            // while its completions, due long ago, sit uncollected.
            let now = self.fabric.now();
            let ok = self.collect();
            if ok >= k {
                return Poll::Ready(WaitOutcome::Reached);
            }
            if ok + self.outstanding.len() < k || now >= deadline {
                return Poll::Ready(WaitOutcome::Short);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }
}

impl<F: Fabric + ?Sized> Drop for Roundtrip<'_, F> {
    fn drop(&mut self) {
        for (_, ticket) in self.outstanding.drain(..) {
            self.fabric.forget(ticket);
        }
    }
}

/// Posts `batch` to `node` without waiting for it: background work such as a lazy
/// in-place write or marking a tuple VERIFIED (SWARM §3.2, §4.3). Costs no roundtrip.
pub fn post_background<F: Fabric + ?Sized>(fabric: &F, node: NodeId, batch: Batch) {
    let ticket = fabric.post(node, batch);
    fabric.forget(ticket);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemCluster;

    #[test]
    fn a_roundtrip_refuses_more_posts_than_it_can_track() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let mut step = Roundtrip::start(&fabric, &stats);
        for _ in 0..MAX_NODES {
            step.post(NodeId(0), Batch::read(0, 8)).unwrap();
        }
        assert_eq!(
            step.post(NodeId(0), Batch::read(0, 8)),
            Err(FabricError::TooManyPosts { max: MAX_NODES })
        );
    }
}
