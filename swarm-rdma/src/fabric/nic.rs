//! The engine's NIC over real verbs: a queue pair per node, one completion queue,
//! one registered staging buffer.

use std::sync::Arc;

use swarm_core::fabric::Batch;

use crate::fabric::engine::{Nic, PostFailure};
use crate::verbs::cq::{CompletionQueue, WorkCompletion};
use crate::verbs::memory::MemoryRegion;
use crate::verbs::post::{StagingSlice, post_chain};
use crate::verbs::qp::QueuePair;
use crate::wr::Chain;

/// Verbs objects of one client thread. Field order is drop order: queue pairs, then
/// the staging region, then the completion queue.
#[derive(Debug)]
pub struct VerbsNic {
    qps: Vec<Option<QueuePair>>,
    staging: MemoryRegion,
    cq: Arc<CompletionQueue>,
}

impl VerbsNic {
    /// Bundles the client's verbs objects; `qps[i]` is node `i`'s queue pair.
    pub fn new(
        qps: Vec<Option<QueuePair>>,
        staging: MemoryRegion,
        cq: Arc<CompletionQueue>,
    ) -> Self {
        Self { qps, staging, cq }
    }
}

impl VerbsNic {
    /// Puts `qp` in place of node `node`'s queue pair (after a reconnect) and
    /// returns the old one, for the caller to destroy before the engine reuses the
    /// staging of the old one's chains.
    pub fn replace_qp(&mut self, node: usize, qp: QueuePair) -> Option<QueuePair> {
        self.qps.get_mut(node).and_then(|slot| slot.replace(qp))
    }
}

impl Nic for VerbsNic {
    fn staging_capacity(&self) -> u64 {
        self.staging.memory().len() as u64
    }

    fn staging_mut(&mut self, offset: u64, len: u64) -> &mut [u8] {
        // The engine only asks for extents it allocated inside the capacity.
        self.staging.memory_mut().extent_mut(offset, len)
    }

    fn post(
        &mut self,
        node: usize,
        seq: u64,
        chain: &Chain,
        batch: &Batch,
        staging_offset: u64,
    ) -> Result<(), PostFailure> {
        let Some(Some(qp)) = self.qps.get(node) else {
            return Err(PostFailure {
                errno: libc::ENOTCONN,
                posted: 0,
            });
        };
        let slice = StagingSlice {
            addr: self.staging.memory().addr() + staging_offset,
            lkey: self.staging.lkey(),
        };
        post_chain(qp, chain, batch, slice, seq)
    }

    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32> {
        self.cq.poll(out)
    }

    fn abort(&mut self, node: usize) {
        if let Some(Some(qp)) = self.qps.get_mut(node)
            && let Err(error) = qp.to_error()
        {
            // The node is failed anyway; its queue pair is destroyed at the
            // reconnect.
            tracing::warn!(node, %error, "could not move a lost queue pair to the error state");
        }
    }
}
