//! Operations, ordered batches of them, and what a completed batch returns.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Deref;

use super::FabricError;

/// The most operations one batch may hold. SWARM's longest pipeline is a Safe-Guess
/// write: read the metadata, write the out-of-place buffer, CAS the metadata word.
pub const MAX_BATCH_OPS: usize = 4;

/// One remote memory operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Reads `len` bytes at `addr`. Not atomic: may observe a concurrent write torn.
    Read {
        /// Byte offset in the node's memory.
        addr: u64,
        /// Number of bytes.
        len: u32,
    },
    /// Writes `data` at `addr`. Not atomic: concurrent writes may clobber each other.
    Write {
        /// Byte offset in the node's memory.
        addr: u64,
        /// The bytes to store.
        data: Payload,
    },
    /// Atomically replaces the 8-byte word at `addr` (8-byte aligned) by `new` if it
    /// equals `expected`; returns the previous value either way.
    Cas {
        /// Byte offset of the word; must be a multiple of 8.
        addr: u64,
        /// The value the word must hold for the swap to happen.
        expected: u64,
        /// The value to store.
        new: u64,
    },
}

/// The bytes of a write: owned by its batch, or shared by the batches of one step
/// that write the same bytes to several replicas (a Safe-Guess record goes to every
/// replica and, in place, to the primary: one buffer, not one copy per batch).
/// Dereferences to the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Bytes of this write only.
    Owned(Vec<u8>),
    /// Bytes shared with other writes (cloning shares them).
    Shared(Arc<[u8]>),
}

impl Default for Payload {
    fn default() -> Self {
        Self::Owned(Vec::new())
    }
}

impl Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(bytes) => bytes,
            Self::Shared(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Owned(bytes)
    }
}

impl From<Arc<[u8]>> for Payload {
    fn from(bytes: Arc<[u8]>) -> Self {
        Self::Shared(bytes)
    }
}

/// An ordered batch of operations to one node (SWARM §2.1, third property): a later
/// operation's effect is only visible once the earlier ones' are.
///
/// A batch may carry the *deadline* of the operation that posts it (the operation
/// fence, [`crate::reclaim`]): a transport that cannot hand the batch to the memory
/// node at once (RDMA's software queue behind a full send queue) must fail it with
/// [`FabricError::Fenced`] rather than start it after that instant on its clock
/// ([`super::Fabric::now`]), since the memory it names may be recycled by then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    ops: heapless::Vec<Op, MAX_BATCH_OPS>,
    deadline: Option<super::Nanos>,
}

impl Batch {
    /// An empty batch.
    pub const fn new() -> Self {
        Self {
            ops: heapless::Vec::new(),
            deadline: None,
        }
    }

    /// Sets the instant after which the batch must not start (see the type docs);
    /// `None` for no deadline.
    pub fn set_deadline(&mut self, deadline: Option<super::Nanos>) -> &mut Self {
        self.deadline = deadline;
        self
    }

    /// The instant after which the batch must not start, if any.
    pub fn deadline(&self) -> Option<super::Nanos> {
        self.deadline
    }

    /// Appends `op`; fails with [`FabricError::BatchFull`] past [`MAX_BATCH_OPS`].
    pub fn push(&mut self, op: Op) -> Result<&mut Self, FabricError> {
        self.ops.push(op).map_err(|_| FabricError::BatchFull)?;
        Ok(self)
    }

    /// A batch with a single read.
    pub fn read(addr: u64, len: u32) -> Self {
        Self::one(Op::Read { addr, len })
    }

    /// A batch with a single write.
    pub fn write(addr: u64, data: impl Into<Payload>) -> Self {
        Self::one(Op::Write {
            addr,
            data: data.into(),
        })
    }

    /// A batch with a single CAS.
    pub fn cas(addr: u64, expected: u64, new: u64) -> Self {
        Self::one(Op::Cas {
            addr,
            expected,
            new,
        })
    }

    fn one(op: Op) -> Self {
        let mut batch = Self::new();
        // A fresh batch has room for one operation.
        let _ = batch.ops.push(op);
        batch
    }

    /// The operations, in execution order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The result of one operation of a completed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutput {
    /// The bytes a read returned.
    Read(Vec<u8>),
    /// A write was applied.
    Written,
    /// The value a CAS found (it swapped iff this equals its `expected`).
    Cas(u64),
}

/// The results of a completed batch, one per operation, in batch order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    outputs: heapless::Vec<OpOutput, MAX_BATCH_OPS>,
}

impl Completion {
    /// An empty completion, to be filled by a transport in batch order.
    pub const fn new() -> Self {
        Self {
            outputs: heapless::Vec::new(),
        }
    }

    /// Appends the output of the next operation (transports only).
    pub fn push(&mut self, output: OpOutput) -> Result<(), FabricError> {
        self.outputs
            .push(output)
            .map_err(|_| FabricError::BatchFull)
    }

    /// Drops every output: the completion is empty again, ready to be reused.
    pub fn clear(&mut self) {
        self.outputs.clear();
    }

    /// All outputs in batch order.
    pub fn outputs(&self) -> &[OpOutput] {
        &self.outputs
    }

    /// The bytes read by operation `i`, or `None` if it was not a read.
    pub fn read(&self, i: usize) -> Option<&[u8]> {
        match self.outputs.get(i) {
            Some(OpOutput::Read(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Takes the bytes read by operation `i` out of the completion.
    pub fn take_read(&mut self, i: usize) -> Option<Vec<u8>> {
        match self.outputs.get_mut(i) {
            Some(OpOutput::Read(bytes)) => Some(core::mem::take(bytes)),
            _ => None,
        }
    }

    /// The previous value found by CAS `i`, or `None` if it was not a CAS.
    pub fn cas(&self, i: usize) -> Option<u64> {
        match self.outputs.get(i) {
            Some(OpOutput::Cas(previous)) => Some(*previous),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn batch_is_bounded() {
        let mut b = Batch::new();
        for i in 0..MAX_BATCH_OPS as u64 {
            b.push(Op::Cas {
                addr: i * 8,
                expected: 0,
                new: 1,
            })
            .unwrap();
        }
        assert_eq!(
            b.push(Op::Read { addr: 0, len: 8 }),
            Err(FabricError::BatchFull)
        );
        assert_eq!(b.len(), MAX_BATCH_OPS);
    }

    #[test]
    fn completion_accessors_match_kinds() {
        let mut c = Completion::new();
        c.push(OpOutput::Read(vec![1, 2])).unwrap();
        c.push(OpOutput::Cas(7)).unwrap();
        assert_eq!(c.read(0), Some(&[1u8, 2][..]));
        assert_eq!(c.cas(0), None);
        assert_eq!(c.cas(1), Some(7));
        assert_eq!(c.take_read(0), Some(vec![1, 2]));
    }
}
