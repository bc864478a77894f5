//! The buffer a read's common case reads a register's in-place record into, where
//! the fabric reads in place ([`crate::Fabric::read_direct`]: shared memory): one
//! per client, reused by every such read (`Client::read_now_with`,
//! `Client::raw_read_now_with`), so that a read neither zeroes a buffer on its
//! stack nor takes one from the fabric and gives it back (issue 45: zeroing a
//! 512-byte stack buffer cost about 49 instructions per get).
//!
//! It carries nothing from one read to the next that could be taken for data: a
//! direct read fills the whole range it is given or fails, a failed read's bytes
//! are not looked at, and the record found there is validated (its length and xxh3
//! hash, [`crate::layout::decode_record`]) before any byte of it is used.

use alloc::boxed::Box;
use alloc::vec;
use core::cell::Cell;
use core::ops::{Deref, DerefMut};

/// A client's reusable read buffer, [`crate::Layout::register_bytes`] long (an
/// in-place block and its metadata words, or a RAW record, fit).
pub(crate) struct ReadBlocks {
    spare: Cell<Option<Box<[u8]>>>,
    len: usize,
}

impl core::fmt::Debug for ReadBlocks {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadBlocks")
            .field("len", &self.len)
            .finish()
    }
}

impl ReadBlocks {
    /// A buffer of `len` bytes, allocated now rather than by the first read.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            spare: Cell::new(Some(vec![0; len].into_boxed_slice())),
            len,
        }
    }

    /// The buffer until the returned guard drops: the client's one, or a fresh one
    /// while that is in use (a read within another read's `consume`).
    #[inline]
    pub(crate) fn take(&self) -> ReadBlock<'_> {
        let bytes = self
            .spare
            .take()
            .unwrap_or_else(|| vec![0; self.len].into_boxed_slice());
        ReadBlock {
            home: &self.spare,
            bytes,
        }
    }
}

/// A [`ReadBlocks`] buffer in use; goes back to the client on drop.
pub(crate) struct ReadBlock<'a> {
    home: &'a Cell<Option<Box<[u8]>>>,
    bytes: Box<[u8]>,
}

impl Deref for ReadBlock<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for ReadBlock<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for ReadBlock<'_> {
    #[inline]
    fn drop(&mut self) {
        self.home.set(Some(core::mem::take(&mut self.bytes)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One buffer, reused; a second one taken while it is in use is a fresh one of
    /// the same length, and the first taken back is kept.
    #[test]
    fn the_buffer_is_reused_and_a_nested_take_gets_its_own() {
        let blocks = ReadBlocks::new(24);
        let first_at = {
            let mut block = blocks.take();
            block[0] = 7;
            let nested = blocks.take();
            assert_eq!(nested.len(), 24);
            assert_ne!(nested.as_ptr(), block.as_ptr());
            block.as_ptr()
        };
        let again = blocks.take();
        assert_eq!((again.len(), again.as_ptr()), (24, first_at));
    }
}
