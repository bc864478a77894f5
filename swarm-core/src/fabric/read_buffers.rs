//! [`ReadBuffers`]: spare read buffers of one client thread's fabric handle, so that a
//! steady stream of reads allocates nothing.

use alloc::vec::Vec;
use core::cell::RefCell;

/// Spare buffers kept at most: more than a roundtrip's replies of a common-case
/// operation give back at once (a Safe-Guess write reads two or three replicas).
const SPARES: usize = 8;

/// Buffers given back by protocol code ([`super::Fabric::give_back`]) for the next
/// reads to fill: a transport that executes reads synchronously (shared memory, the
/// in-process fabric) takes its read outputs from here instead of allocating each.
///
/// At most a few are kept; a buffer given back beyond that is freed. A read takes a
/// spare only if it has room for its bytes; a spare is never shared, and the read
/// overwrites all of it, so a buffer holds only the bytes of the read that filled it. One per fabric
/// handle: it is not `Sync`.
#[derive(Debug, Default)]
pub struct ReadBuffers {
    spares: RefCell<heapless::Vec<Vec<u8>, SPARES>>,
}

impl ReadBuffers {
    /// No spare buffer yet.
    pub const fn new() -> Self {
        Self {
            spares: RefCell::new(heapless::Vec::new()),
        }
    }

    /// A buffer of `len` bytes for a read to fill, which overwrites every one of them
    /// (their content on return is unspecified: zeros, or bytes of an earlier read
    /// this client made): a spare with room for them if there is one (the smaller
    /// spares are kept for smaller reads), else a new allocation.
    #[inline]
    pub fn take_for_read(&self, len: usize) -> Vec<u8> {
        let spare = self.spares.try_borrow_mut().ok().and_then(|mut spares| {
            // The common case first: the last one given back fits (a stream of
            // reads of one size), taken without a search or a swap.
            if spares.last().is_some_and(|b| b.capacity() >= len) {
                return spares.pop();
            }
            let fits = spares.iter().rposition(|b| b.capacity() >= len)?;
            Some(spares.swap_remove(fits))
        });
        // `with_capacity`, not `vec![0; len]`: that is `calloc`, which bypasses the
        // thread cache in glibc 2.36 and costs more than the copy itself.
        let mut buffer = spare.unwrap_or_else(|| Vec::with_capacity(len));
        // A spare keeps its length: no zeroing of bytes the read overwrites anyway.
        buffer.resize(len, 0);
        buffer
    }

    /// Keeps `buffer` for a later [`ReadBuffers::take_for_read`] (freed if enough are kept
    /// already, or if it has no capacity).
    #[inline]
    pub fn give_back(&self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 {
            return;
        }
        if let Ok(mut spares) = self.spares.try_borrow_mut() {
            // Full: `buffer` is dropped.
            let _ = spares.push(buffer);
        }
    }

    /// How many spare buffers are kept.
    pub fn spares(&self) -> usize {
        self.spares.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_reused_at_the_length_asked() {
        let buffers = ReadBuffers::new();
        let mut first = buffers.take_for_read(16);
        assert_eq!(first.len(), 16);
        first.fill(7);
        let at = first.as_ptr();
        buffers.give_back(first);
        assert_eq!(buffers.spares(), 1);
        let second = buffers.take_for_read(8);
        assert_eq!(second.as_ptr(), at, "the spare's allocation");
        assert_eq!(second.len(), 8);
        assert_eq!(buffers.spares(), 0);
        // Empty vectors are not kept, and at most `SPARES` are.
        buffers.give_back(Vec::new());
        assert_eq!(buffers.spares(), 0);
        for _ in 0..SPARES + 3 {
            buffers.give_back(alloc::vec![1; 4]);
        }
        assert_eq!(buffers.spares(), SPARES);
        assert_eq!(
            buffers.take_for_read(32).len(),
            32,
            "no spare fits: a new one"
        );
        assert_eq!(buffers.spares(), SPARES);
        assert_eq!(buffers.take_for_read(4).len(), 4);
        assert_eq!(buffers.spares(), SPARES - 1);
    }

    /// What a reused buffer held is overwritten by the read that fills it: a read
    /// shows its own bytes only, whatever was read into the buffer before.
    #[test]
    fn a_reused_buffer_holds_only_the_bytes_of_its_read() {
        use crate::fabric::{Batch, Completion, OpOutput};
        use crate::sync::AtomicU64;
        let words: Vec<AtomicU64> = (0..8u64)
            .map(|i| AtomicU64::new(i * 0x0101_0101_0101_0101))
            .collect();
        let buffers = ReadBuffers::new();
        buffers.give_back(alloc::vec![0xEE; 64]);
        for (addr, len) in [(3u64, 13u32), (8, 8), (0, 64), (17, 1)] {
            let mut out = Completion::new();
            crate::words::execute_reusing(&words, &Batch::read(addr, len), &mut out, &buffers);
            let mut expected = alloc::vec![0u8; len as usize];
            crate::words::read(&words, addr as usize, &mut expected);
            assert_eq!(
                out.read(0),
                Some(&expected[..]),
                "read of {len} bytes at {addr}"
            );
            let Some(OpOutput::Read(bytes)) = out.outputs().first().cloned() else {
                panic!("a read output");
            };
            buffers.give_back(bytes);
        }
    }
}
