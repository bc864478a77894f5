//! One simulated memory node: passive bytes plus its fault state.
//!
//! The node only knows how to apply one *instantaneous* step: a whole read, a whole
//! CAS, or one chunk of a write. A chunk never crosses an 8-byte aligned word, which
//! is exactly the atomicity RDMA and CXL give (SWARM §4: "8 B in RDMA and CXLv3"), so
//! reads in the simulation tear at 8-byte granularity and never below it. Callers
//! check bounds and alignment with [`swarm_core::fabric::check_batch`] first.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use super::config::{Latency, NodeConfig};

/// The part of a write that lands in one aligned 8-byte word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// First byte in the node.
    pub(crate) addr: u64,
    /// The bytes of the write's data that go there.
    pub(crate) data: Range<usize>,
}

/// Splits a write of `len` bytes at `addr` into word-sized chunks, in address order.
pub(crate) fn chunks(addr: u64, len: usize) -> Vec<Chunk> {
    let mut out = Vec::with_capacity(len / 8 + 2);
    let mut pos = 0usize;
    while pos < len {
        let at = addr + pos as u64;
        let room = 8 - (at % 8) as usize;
        let take = room.min(len - pos);
        out.push(Chunk {
            addr: at,
            data: pos..pos + take,
        });
        pos += take;
    }
    out
}

pub(crate) struct Node {
    mem: Vec<u8>,
    pub(crate) crashed: bool,
    pub(crate) slow: u32,
    pub(crate) latency: Latency,
}

impl core::fmt::Debug for Node {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Not the memory itself: a megabyte of zeros helps nobody.
        f.debug_struct("Node")
            .field("bytes", &self.mem.len())
            .field("crashed", &self.crashed)
            .field("slow", &self.slow)
            .field("latency", &self.latency)
            .finish()
    }
}

impl Node {
    pub(crate) fn new(bytes: usize, config: NodeConfig) -> Self {
        Self {
            mem: vec![0; bytes.div_ceil(8) * 8],
            crashed: false,
            slow: config.slow.max(1),
            latency: config.latency,
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.mem.len() as u64
    }

    fn range(addr: u64, len: usize) -> Range<usize> {
        // Callers checked `addr + len <= size`, and size fits in usize.
        addr as usize..addr as usize + len
    }

    /// The bytes at `[addr, addr + len)`, all at this one instant.
    pub(crate) fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        self.mem[Self::range(addr, len)].to_vec()
    }

    /// Stores `data` at `addr` at once (used for chunks and for test setup).
    pub(crate) fn store(&mut self, addr: u64, data: &[u8]) {
        self.mem[Self::range(addr, data.len())].copy_from_slice(data);
    }

    /// Atomic compare-and-swap of the aligned word at `addr`; returns the old value.
    pub(crate) fn cas(&mut self, addr: u64, expected: u64, new: u64) -> u64 {
        let word = &mut self.mem[Self::range(addr, 8)];
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let previous = u64::from_le_bytes(bytes);
        if previous == expected {
            word.copy_from_slice(&new.to_le_bytes());
        }
        previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_never_cross_a_word_and_cover_the_write() {
        for addr in 0..17u64 {
            for len in 0..40usize {
                let parts = chunks(addr, len);
                let mut next = 0;
                for c in &parts {
                    assert_eq!(c.data.start, next, "chunks are contiguous");
                    assert!(!c.data.is_empty());
                    let first_word = c.addr / 8;
                    let last_word = (c.addr + c.data.len() as u64 - 1) / 8;
                    assert_eq!(first_word, last_word, "chunk {c:?} crosses a word");
                    assert_eq!(c.addr, addr + c.data.start as u64);
                    next = c.data.end;
                }
                assert_eq!(next, len);
            }
        }
        assert_eq!(chunks(3, 10).len(), 2);
        assert_eq!(chunks(0, 64).len(), 8);
    }

    #[test]
    fn cas_swaps_only_on_match_and_memory_is_zeroed() {
        let mut node = Node::new(13, NodeConfig::default());
        assert_eq!(node.size(), 16);
        assert_eq!(node.read(0, 16), vec![0; 16]);
        assert_eq!(node.cas(8, 1, 5), 0);
        assert_eq!(node.cas(8, 0, 5), 0);
        assert_eq!(node.cas(8, 0, 6), 5);
        node.store(0, &[9; 3]);
        assert_eq!(node.read(0, 4), vec![9, 9, 9, 0]);
        assert_eq!(node.read(8, 8), 5u64.to_le_bytes().to_vec());
    }
}
