//! Operations, ordered batches of them, and what a completed batch returns.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Deref;

use super::FabricError;

/// The most operations one batch may hold. SWARM's longest pipeline is a fresh
/// register's write carrying a store's own CAS after it (SWARM-KV's one-roundtrip
/// insert: read the metadata, write the out-of-place buffer, write the key header and
/// the in-place copy, CAS the metadata word, CAS the index bucket).
pub const MAX_BATCH_OPS: usize = 8;

/// Operations a batch (and outputs a completion) holds without a heap allocation.
/// Every batch on a read or update path fits (a Safe-Guess write round is three
/// operations); only longer pipelines spill, so that the batches and completions
/// every operation moves stay small.
pub const INLINE_BATCH_OPS: usize = 4;

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

/// Up to [`MAX_BATCH_OPS`] items: the first [`INLINE_BATCH_OPS`] inline, more on the
/// heap (a batch's operations, a completion's outputs).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Spill<T> {
    /// At most [`INLINE_BATCH_OPS`] items, no allocation.
    Inline(heapless::Vec<T, INLINE_BATCH_OPS>),
    /// More, up to [`MAX_BATCH_OPS`].
    Heap(Vec<T>),
}

impl<T> Spill<T> {
    const fn new() -> Self {
        Self::Inline(heapless::Vec::new())
    }

    /// Appends `item`; fails with [`FabricError::BatchFull`] past [`MAX_BATCH_OPS`].
    /// Inlined: every batch a protocol step builds and every reply a transport fills
    /// goes through here, and the common case is one store into the inline array
    /// (`inline(always)`: left to itself, the compiler kept a call of about 45
    /// instructions per operation pushed on a write's path).
    #[inline(always)]
    fn push(&mut self, item: T) -> Result<(), FabricError> {
        match self {
            Self::Inline(items) => match items.push(item) {
                Ok(()) => Ok(()),
                Err(item) => {
                    self.spill(item);
                    Ok(())
                }
            },
            Self::Heap(items) if items.len() < MAX_BATCH_OPS => {
                items.push(item);
                Ok(())
            }
            Self::Heap(_) => Err(FabricError::BatchFull),
        }
    }

    /// Moves the full inline items to the heap, then appends `item`: the long
    /// pipelines only, kept out of [`Spill::push`]'s inlined body.
    #[cold]
    #[inline(never)]
    fn spill(&mut self, item: T) {
        let mut heap = Vec::with_capacity(MAX_BATCH_OPS);
        if let Self::Inline(items) = self {
            heap.extend(core::mem::take(items));
        }
        heap.push(item);
        *self = Self::Heap(heap);
    }

    fn as_slice(&self) -> &[T] {
        match self {
            Self::Inline(items) => items,
            Self::Heap(items) => items,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Self::Inline(items) => items,
            Self::Heap(items) => items,
        }
    }

    /// Empties it, keeping a heap allocation for the next use.
    fn clear(&mut self) {
        match self {
            Self::Inline(items) => items.clear(),
            Self::Heap(items) => items.clear(),
        }
    }
}

impl<T> Default for Spill<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// An ordered batch of operations to one node (SWARM §2.1, third property): a later
/// operation's effect is only visible once the earlier ones' are.
///
/// A batch may carry the *deadline* of the operation that posts it (the operation
/// fence, [`crate::slot_recycling`]): a transport that cannot hand the batch to the memory
/// node at once (RDMA's software queue behind a full send queue) must fail it with
/// [`FabricError::Fenced`] rather than start it after that instant on its clock
/// ([`super::Fabric::now`]), since the memory it names may be recycled by then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    ops: Spill<Op>,
    deadline: Option<super::Nanos>,
}

impl Batch {
    /// An empty batch.
    pub const fn new() -> Self {
        Self {
            ops: Spill::new(),
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
    #[inline]
    pub fn push(&mut self, op: Op) -> Result<&mut Self, FabricError> {
        self.ops.push(op)?;
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
        let mut ops = heapless::Vec::new();
        // An empty inline vector has room for one operation.
        let _ = ops.push(op);
        Self {
            ops: Spill::Inline(ops),
            deadline: None,
        }
    }

    /// Drops every operation, keeping the deadline: the batch is ready to be filled
    /// again, for a step that posts one batch after another without moving any
    /// ([`super::Fabric::post_detached`] borrows its batch).
    #[inline]
    pub fn clear(&mut self) {
        self.ops.clear();
    }

    /// The operations, in execution order.
    pub fn ops(&self) -> &[Op] {
        self.ops.as_slice()
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops().len()
    }

    /// Whether the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops().is_empty()
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
    outputs: Spill<OpOutput>,
}

impl Completion {
    /// An empty completion, to be filled by a transport in batch order.
    pub const fn new() -> Self {
        Self {
            outputs: Spill::new(),
        }
    }

    /// Appends the output of the next operation (transports only).
    #[inline]
    pub fn push(&mut self, output: OpOutput) -> Result<(), FabricError> {
        self.outputs.push(output)
    }

    /// Drops every output: the completion is empty again, ready to be reused.
    pub fn clear(&mut self) {
        self.outputs.clear();
    }

    /// All outputs in batch order.
    pub fn outputs(&self) -> &[OpOutput] {
        self.outputs.as_slice()
    }

    /// The bytes read by operation `i`, or `None` if it was not a read.
    pub fn read(&self, i: usize) -> Option<&[u8]> {
        match self.outputs().get(i) {
            Some(OpOutput::Read(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// The bytes read by operation `i`, mutable (to decode in place), or `None` if it
    /// was not a read.
    pub fn read_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        match self.outputs.as_mut_slice().get_mut(i) {
            Some(OpOutput::Read(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Takes the bytes read by operation `i` out of the completion.
    pub fn take_read(&mut self, i: usize) -> Option<Vec<u8>> {
        match self.outputs.as_mut_slice().get_mut(i) {
            Some(OpOutput::Read(bytes)) => Some(core::mem::take(bytes)),
            _ => None,
        }
    }

    /// Hands the buffer of every read output still in the completion to `give_back`
    /// (leaving them empty): how a finished step returns them to its fabric
    /// ([`super::Fabric::give_back`]).
    #[inline]
    pub fn give_back_reads(&mut self, mut give_back: impl FnMut(Vec<u8>)) {
        for output in self.outputs.as_mut_slice() {
            if let OpOutput::Read(bytes) = output
                && bytes.capacity() != 0
            {
                give_back(core::mem::take(bytes));
            }
        }
    }

    /// The previous value found by CAS `i`, or `None` if it was not a CAS.
    pub fn cas(&self, i: usize) -> Option<u64> {
        match self.outputs().get(i) {
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
        assert!(matches!(b.ops, Spill::Heap(_)));
        // Spilled operations keep their order.
        for (i, op) in b.ops().iter().enumerate() {
            assert!(matches!(op, Op::Cas { addr, .. } if *addr == i as u64 * 8));
        }
    }

    #[test]
    fn short_batches_and_completions_stay_inline() {
        let mut b = Batch::read(0, 8);
        for _ in 1..INLINE_BATCH_OPS {
            b.push(Op::Read { addr: 8, len: 8 }).unwrap();
        }
        assert!(matches!(b.ops, Spill::Inline(_)));
        let mut c = Completion::new();
        for i in 0..INLINE_BATCH_OPS as u64 {
            c.push(OpOutput::Cas(i)).unwrap();
        }
        assert!(matches!(c.outputs, Spill::Inline(_)));
        c.push(OpOutput::Written).unwrap();
        assert_eq!(c.cas(3), Some(3));
        assert_eq!(c.outputs().len(), INLINE_BATCH_OPS + 1);
        c.clear();
        assert!(c.outputs().is_empty());
    }

    #[test]
    fn a_cleared_batch_is_empty_and_keeps_its_deadline() {
        let mut b = Batch::read(0, 8);
        b.set_deadline(Some(5));
        b.clear();
        assert!(b.is_empty());
        assert_eq!(b.deadline(), Some(5));
        b.push(Op::Read { addr: 8, len: 8 }).unwrap();
        assert_eq!(b.ops(), &[Op::Read { addr: 8, len: 8 }]);
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
