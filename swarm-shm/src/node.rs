//! One mapped memory node and the three fabric operations on it (SWARM §2.1).
//!
//! Every access is an 8-byte aligned atomic on the node's words (see the crate docs
//! for why), executed by [`swarm_core::words`]: the word-level code the in-process
//! fabric runs and `loom` checks, with its memory orderings argued once there. This
//! module adds what a mapped file needs: every address is checked against the
//! mapping's size before any access.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use swarm_core::fabric::InPlaceReply;
use swarm_core::fabric::{ReadBuffers, check_bounds, check_cas};
use swarm_core::header::RETIRED_AT;
use swarm_core::words;
use swarm_core::{Batch, Completion, FabricError, FailureCause, NodeId, Op, OpOutput};

use crate::mapping::Mapping;

/// One memory node of an opened [`crate::ShmCluster`]: a mapped node file.
///
/// Protocols go through [`crate::ShmFabric`], which adds fault injection, emulated
/// latency and tickets. This direct interface is for tools and for measuring the
/// transport's own overhead; its operations are ordered exactly like a batch's.
pub struct NodeMemory {
    id: NodeId,
    path: PathBuf,
    mapping: Mapping,
}

impl fmt::Debug for NodeMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeMemory")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("size", &self.size())
            .finish()
    }
}

impl NodeMemory {
    pub(crate) fn new(id: NodeId, path: PathBuf, mapping: Mapping) -> Self {
        Self { id, path, mapping }
    }

    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The node file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The node's size in bytes, header included: valid addresses are `0..size`.
    pub fn size(&self) -> u64 {
        self.mapping.words().len() as u64 * 8
    }

    /// Reads `out.len()` bytes at `addr`. Not atomic: a concurrent write may be seen
    /// torn at 8-byte granularity.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), FabricError> {
        check_bounds(self.id, addr, out.len() as u64, self.size())?;
        words::read(self.mapping.words(), addr as usize, out);
        Ok(())
    }

    /// Writes `data` at `addr`. Not atomic: concurrent writes may interleave at 8-byte
    /// granularity, but bytes outside `addr..addr + data.len()` are never changed.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), FabricError> {
        check_bounds(self.id, addr, data.len() as u64, self.size())?;
        words::write(self.mapping.words(), addr as usize, data);
        Ok(())
    }

    /// Atomically replaces the word at `addr` (8-byte aligned) by `new` if it equals
    /// `expected`; returns the previous value either way.
    pub fn cas(&self, addr: u64, expected: u64, new: u64) -> Result<u64, FabricError> {
        check_cas(self.id, addr, self.size())?;
        Ok(words::cas(
            self.mapping.words(),
            addr as usize,
            expected,
            new,
        ))
    }

    /// Executes an ordered batch. The whole batch is checked first, so a batch with an
    /// invalid operation has no effect at all. Memory that was declared lost
    /// ([`NodeMemory::is_retired`]) fails every batch as a crashed node would.
    #[inline]
    pub fn execute(&self, batch: &Batch) -> Result<Completion, FabricError> {
        let mut completion = Completion::new();
        self.execute_into(batch, &mut completion)?;
        Ok(completion)
    }

    /// Starts fetching the cache lines of bytes `addr..addr + len` into this core's
    /// caches (a hint: no effect on any result; lines out of bounds are skipped).
    #[inline]
    pub fn prefetch(&self, addr: u64, len: u64) {
        self.mapping.prefetch(addr, len);
    }

    /// [`NodeMemory::execute`], the outputs appended to `out` (empty on entry): the
    /// fabric's fast path writes them where the caller keeps its reply.
    #[inline]
    pub fn execute_into(&self, batch: &Batch, out: &mut Completion) -> Result<(), FabricError> {
        self.execute_reusing(batch, out, &ReadBuffers::new())
    }

    /// A retired memory (`swarm_core::header::RETIRED_AT`) answers every batch as a
    /// crashed node: nothing of the batch executes.
    #[inline]
    fn check_live(&self) -> Result<(), FabricError> {
        if self.is_retired() {
            return Err(FabricError::NodeFailed {
                node: self.id,
                cause: FailureCause::Crashed,
            });
        }
        Ok(())
    }

    /// [`NodeMemory::execute_into`], reads filled into spare buffers of `buffers`
    /// (see [`ReadBuffers`]) instead of new allocations.
    #[inline]
    pub fn execute_reusing(
        &self,
        batch: &Batch,
        out: &mut Completion,
        buffers: &ReadBuffers,
    ) -> Result<(), FabricError> {
        self.check_live()?;
        // One read (most steps' batches): checked and executed in one pass, with no
        // loop over the batch twice. Nothing is touched before the check passes.
        if let [Op::Read { addr, len }] = batch.ops() {
            check_bounds(self.id, *addr, u64::from(*len), self.size())?;
            let mut bytes = buffers.take_for_read(*len as usize);
            words::read(self.mapping.words(), *addr as usize, &mut bytes);
            // An empty completion has room for one output.
            let _ = out.push(OpOutput::Read(bytes));
            return Ok(());
        }
        swarm_core::fabric::check_batch(self.id, batch, self.size())?;
        words::execute_reusing(self.mapping.words(), batch, out, buffers);
        Ok(())
    }

    /// [`NodeMemory::execute_into`], its results left in `reply`
    /// ([`swarm_core::Fabric::submit_in_place`]), whose buffer must have room for the
    /// batch's reads ([`InPlaceReply::fits`]). The same checks first: an invalid
    /// batch or a retired node changes nothing.
    #[inline]
    pub fn execute_in_place(
        &self,
        batch: &Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Result<(), FabricError> {
        self.check_live()?;
        swarm_core::fabric::check_batch(self.id, batch, self.size())?;
        words::execute_in_place(self.mapping.words(), batch, reply);
        Ok(())
    }

    /// [`NodeMemory::execute_reusing`] for a batch whose result nobody looks at
    /// ([`swarm_core::Fabric::post_detached`]): the same checks first (an invalid
    /// batch or a retired node changes nothing), the same effects in order, but no
    /// outputs (`swarm_core::words::execute_effects`: no completion filled, no read
    /// buffer taken).
    #[inline]
    pub fn execute_detached(&self, batch: &Batch) -> Result<(), FabricError> {
        self.check_live()?;
        swarm_core::fabric::check_batch(self.id, batch, self.size())?;
        words::execute_effects(self.mapping.words(), batch);
        Ok(())
    }

    /// Whether this memory was declared lost (its header's retired word,
    /// `swarm_core::header::RETIRED_AT`, is set: the node file was replaced or
    /// crashed on purpose, [`crate::ShmCluster::retire_node`]). Checked on every
    /// batch: one load of a word that stays in cache.
    #[inline]
    pub fn is_retired(&self) -> bool {
        // The mapping is at least a header long (checked at open), so the word exists.
        self.mapping
            .words()
            .get(RETIRED_AT / 8)
            .is_some_and(|w| w.load(Ordering::Relaxed) != 0)
    }
}
