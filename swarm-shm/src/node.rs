//! One mapped memory node and the three fabric operations on it (SWARM §2.1).
//!
//! Every access is an 8-byte aligned atomic on the node's words (see the crate docs
//! for why): reads load words `Relaxed`, writes store whole words `Relaxed` and merge
//! partial edge words with a CAS loop, and CAS is `AcqRel`. Each operation ends with an
//! `AcqRel` fence, which is what makes a batch ordered: a release fence before the
//! next operation's stores, an acquire fence after the previous operation's loads.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};

use swarm_core::fabric::{check_bounds, check_cas};
use swarm_core::{Batch, Completion, FabricError, NodeId, Op, OpOutput};

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
        read_words(self.mapping.words(), addr as usize, out);
        fence(Ordering::AcqRel);
        Ok(())
    }

    /// Writes `data` at `addr`. Not atomic: concurrent writes may interleave at 8-byte
    /// granularity, but bytes outside `addr..addr + data.len()` are never changed.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), FabricError> {
        check_bounds(self.id, addr, data.len() as u64, self.size())?;
        write_words(self.mapping.words(), addr as usize, data);
        fence(Ordering::AcqRel);
        Ok(())
    }

    /// Atomically replaces the word at `addr` (8-byte aligned) by `new` if it equals
    /// `expected`; returns the previous value either way.
    pub fn cas(&self, addr: u64, expected: u64, new: u64) -> Result<u64, FabricError> {
        check_cas(self.id, addr, self.size())?;
        let word = &self.mapping.words()[addr as usize / 8];
        let previous =
            match word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(previous) | Err(previous) => previous,
            };
        fence(Ordering::AcqRel);
        Ok(previous)
    }

    /// Executes an ordered batch. The whole batch is checked first, so a batch with an
    /// invalid operation has no effect at all.
    pub fn execute(&self, batch: &Batch) -> Result<Completion, FabricError> {
        swarm_core::fabric::check_batch(self.id, batch, self.size())?;
        let mut completion = Completion::new();
        for op in batch.ops() {
            let output = match op {
                Op::Read { addr, len } => {
                    // `malloc` + `memset`, not `vec![0; len]`: that is `calloc`,
                    // which bypasses the thread cache in glibc 2.36 and costs ~250
                    // instructions for a small buffer, more than the copy itself.
                    #[allow(clippy::slow_vector_initialization)]
                    let mut buf = Vec::with_capacity(*len as usize);
                    buf.resize(*len as usize, 0);
                    self.read(*addr, &mut buf)?;
                    OpOutput::Read(buf)
                }
                Op::Write { addr, data } => {
                    self.write(*addr, data)?;
                    OpOutput::Written
                }
                Op::Cas {
                    addr,
                    expected,
                    new,
                } => OpOutput::Cas(self.cas(*addr, *expected, *new)?),
            };
            completion.push(output)?;
        }
        Ok(completion)
    }
}

/// Copies the bytes at `addr..addr + out.len()` (in bounds) out of `words`: a partial
/// first word, whole words, a partial last word.
fn read_words(words: &[AtomicU64], addr: usize, out: &mut [u8]) {
    let (mut index, offset) = (addr / 8, addr % 8);
    let mut out = out;
    if offset != 0 && !out.is_empty() {
        let take = (8 - offset).min(out.len());
        let value = words[index].load(Ordering::Relaxed).to_le_bytes();
        let (head, rest) = out.split_at_mut(take);
        head.copy_from_slice(&value[offset..offset + take]);
        out = rest;
        index += 1;
    }
    let mut chunks = out.chunks_exact_mut(8);
    let whole = chunks.len();
    for (chunk, word) in (&mut chunks).zip(&words[index..index + whole]) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let value = words[index + whole].load(Ordering::Relaxed).to_le_bytes();
        tail.copy_from_slice(&value[..tail.len()]);
    }
}

/// Stores `data` at `addr..addr + data.len()` (in bounds) into `words`: whole words
/// are stored, partial words at either end are merged.
fn write_words(words: &[AtomicU64], addr: usize, data: &[u8]) {
    let (mut index, offset) = (addr / 8, addr % 8);
    let mut data = data;
    if offset != 0 && !data.is_empty() {
        let take = (8 - offset).min(data.len());
        let (head, rest) = data.split_at(take);
        merge(&words[index], offset, head);
        data = rest;
        index += 1;
    }
    let chunks = data.chunks_exact(8);
    let whole = chunks.len();
    let tail = chunks.remainder();
    for (chunk, word) in chunks.zip(&words[index..index + whole]) {
        let mut value = [0u8; 8];
        value.copy_from_slice(chunk);
        word.store(u64::from_le_bytes(value), Ordering::Relaxed);
    }
    if !tail.is_empty() {
        merge(&words[index + whole], 0, tail);
    }
}

/// Writes `bytes` at byte `offset` of `word`, keeping its other bytes: a CAS loop, so
/// that concurrent writers of the other bytes (and CASes on the word) are not
/// clobbered.
fn merge(word: &AtomicU64, offset: usize, bytes: &[u8]) {
    let update = |current: u64| {
        let mut value = current.to_le_bytes();
        value[offset..offset + bytes.len()].copy_from_slice(bytes);
        Some(u64::from_le_bytes(value))
    };
    // The closure always returns `Some`, so the update always succeeds.
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, update);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn words(bytes: usize) -> Vec<AtomicU64> {
        (0..bytes / 8).map(|_| AtomicU64::new(0)).collect()
    }

    fn snapshot(words: &[AtomicU64]) -> Vec<u8> {
        let mut out = vec![0; words.len() * 8];
        read_words(words, 0, &mut out);
        out
    }

    #[test]
    fn unaligned_writes_do_not_clobber_neighbours() {
        let mem = words(32);
        write_words(&mem, 0, &[0xAA; 32]);
        write_words(&mem, 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let out = snapshot(&mem);
        assert_eq!(&out[..3], &[0xAA; 3]);
        assert_eq!(&out[3..13], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(&out[13..], &[0xAA; 19]);
    }

    #[test]
    fn bytes_are_little_endian_words() {
        let mem = words(16);
        write_words(&mem, 8, &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(mem[1].load(Ordering::Relaxed), 0x0102_0304_0506_0708);
    }

    proptest! {
        /// Any sequence of writes followed by any read agrees with a plain byte array.
        #[test]
        fn matches_a_byte_array_model(
            writes in proptest::collection::vec((0usize..200, proptest::collection::vec(any::<u8>(), 0..60)), 0..20),
            read_at in 0usize..256,
            read_len in 0usize..256,
        ) {
            let mem = words(256);
            let mut model = vec![0u8; 256];
            for (addr, data) in &writes {
                let len = data.len().min(256 - addr);
                write_words(&mem, *addr, &data[..len]);
                model[*addr..addr + len].copy_from_slice(&data[..len]);
            }
            let len = read_len.min(256 - read_at);
            let mut out = vec![0; len];
            read_words(&mem, read_at, &mut out);
            prop_assert_eq!(&out[..], &model[read_at..read_at + len]);
        }
    }
}
