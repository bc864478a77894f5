//! [`InPlaceReply`]: where a batch executed inside [`super::Fabric::submit_in_place`]
//! leaves its results, on the caller's stack.
//!
//! A [`super::Completion`] holds one output per operation, and each read's bytes in a
//! buffer of their own, which the transport takes from its spares and the caller
//! gives back ([`super::Fabric::give_back`]). A protocol step on local memory that
//! reads a few words and CASes a few more (a Safe-Guess write's first round, SWARM
//! §3.2 line 6 and §4.3) needs none of that: its reads land one after the other in a
//! byte buffer the caller owns, and each CAS's answer in a word, so nothing is
//! allocated, pushed, taken or given back.

use super::{Batch, MAX_BATCH_OPS, Op};

/// The results of one batch executed in place: the bytes of its reads, one after
/// the other in batch order, in a buffer of the caller's, and the value each CAS
/// found, by operation index.
#[derive(Debug)]
pub struct InPlaceReply<'a> {
    /// Where the reads land; the first `filled` bytes are theirs.
    reads: &'a mut [u8],
    filled: usize,
    /// The value CAS `i` found, if operation `i` was a CAS (bit `i` of `cas_at`).
    cas: [u64; MAX_BATCH_OPS],
    cas_at: u16,
}

impl<'a> InPlaceReply<'a> {
    /// An empty reply whose reads land in `reads`.
    #[inline]
    pub fn new(reads: &'a mut [u8]) -> Self {
        Self {
            reads,
            filled: 0,
            cas: [0; MAX_BATCH_OPS],
            cas_at: 0,
        }
    }

    /// Whether the reads of `batch` fit in the reply's buffer together: a transport
    /// executes a batch in place only if they do (and declines it otherwise).
    #[inline]
    pub fn fits(&self, batch: &Batch) -> bool {
        let read: u64 = batch
            .ops()
            .iter()
            .map(|op| match op {
                Op::Read { len, .. } => u64::from(*len),
                _ => 0,
            })
            .sum();
        read <= self.reads.len() as u64
    }

    /// The bytes the batch's reads returned, one read after the other in batch
    /// order.
    #[inline]
    pub fn reads(&self) -> &[u8] {
        &self.reads[..self.filled]
    }

    /// The value CAS `i` found (it swapped iff this equals its `expected`), or
    /// `None` if operation `i` was not a CAS of the batch.
    #[inline]
    pub fn cas(&self, i: usize) -> Option<u64> {
        (self.cas_at & (1 << i) != 0).then(|| self.cas[i])
    }

    /// The next `len` bytes of the buffer, for the next read of the batch to fill
    /// (transports only: the batch [`InPlaceReply::fits`]). Panics past the buffer.
    #[inline]
    pub fn next_read(&mut self, len: usize) -> &mut [u8] {
        let start = self.filled;
        self.filled += len;
        &mut self.reads[start..self.filled]
    }

    /// Records that operation `i`, a CAS, found `previous` (transports only).
    #[inline]
    pub fn set_cas(&mut self, i: usize, previous: u64) {
        self.cas[i] = previous;
        self.cas_at |= 1 << i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_land_one_after_the_other_and_cases_by_index() {
        let mut buffer = [0u8; 16];
        let mut reply = InPlaceReply::new(&mut buffer);
        let mut batch = Batch::read(0, 8);
        batch
            .push(Op::Cas {
                addr: 8,
                expected: 0,
                new: 1,
            })
            .unwrap()
            .push(Op::Read { addr: 16, len: 8 })
            .unwrap();
        assert!(reply.fits(&batch));
        reply.next_read(8).fill(1);
        reply.set_cas(1, 7);
        reply.next_read(8).fill(2);
        assert_eq!(
            reply.reads(),
            &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
        );
        assert_eq!(
            (reply.cas(0), reply.cas(1), reply.cas(2)),
            (None, Some(7), None)
        );
        batch.push(Op::Read { addr: 0, len: 1 }).unwrap();
        assert!(!reply.fits(&batch), "17 bytes of reads in 16");
    }
}
