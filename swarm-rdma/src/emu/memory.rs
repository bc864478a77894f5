//! The memory nodes of the emulated provider: registered regions that several
//! emulated clients share, with the remote address and key a client must name.

use std::sync::{Mutex, PoisonError};

/// One memory node's registered region.
#[derive(Debug)]
pub struct EmuNode {
    /// Remote address of byte 0 (never dereferenced: requests are translated).
    pub base: u64,
    /// Remote key the region was registered with.
    pub rkey: u32,
    bytes: Mutex<Vec<u8>>,
}

impl EmuNode {
    /// A zeroed region of `size` bytes at remote address `base`, key `rkey`.
    pub fn new(base: u64, rkey: u32, size: usize) -> Self {
        Self {
            base,
            rkey,
            bytes: Mutex::new(vec![0; size]),
        }
    }

    /// Bytes in the region.
    pub fn size(&self) -> u64 {
        self.with(|bytes| bytes.len() as u64)
    }

    /// Runs `f` on the region's bytes, alone: a CAS is atomic with respect to every
    /// other request on the region, as on a NIC.
    pub fn with<T>(&self, f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        let mut bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut bytes)
    }

    /// The offset of `[addr, addr + len)` in the region if `rkey` opens it.
    pub fn check(&self, rkey: u32, addr: u64, len: u64) -> Option<usize> {
        let offset = addr.checked_sub(self.base)?;
        let end = offset.checked_add(len)?;
        (rkey == self.rkey && end <= self.size()).then_some(offset as usize)
    }
}
