//! Allocation of the client's registered staging buffer among in-flight chains.
//!
//! RDMA READs and CAS results land in local registered memory, and writes too large
//! to inline are read by the NIC from there. Each client thread registers one
//! staging buffer at start-up (registration is far too slow for the data path) and
//! hands every posted chain a slice of it, returned when the chain's last work
//! request completes. Chains to different memory nodes complete in any order, so
//! this is a first-fit allocator over free extents, with coalescing on free.

use std::collections::BTreeMap;

use crate::wr::STAGING_ALIGN;

/// A slice of the staging buffer: `[offset, offset + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First byte, a multiple of [`STAGING_ALIGN`].
    pub offset: u64,
    /// Bytes, a multiple of [`STAGING_ALIGN`].
    pub len: u64,
}

/// First-fit allocator over a buffer of `capacity` bytes.
#[derive(Debug)]
pub struct StagingAllocator {
    capacity: u64,
    /// Free extents: offset → length, never adjacent (always coalesced).
    free: BTreeMap<u64, u64>,
    in_use: u64,
}

impl StagingAllocator {
    /// An allocator over `capacity` bytes (rounded down to the alignment).
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity - capacity % STAGING_ALIGN;
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self {
            capacity,
            free,
            in_use: 0,
        }
    }

    /// Bytes managed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes currently allocated.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Allocates `len` bytes (rounded up to the alignment); `None` when no free
    /// extent is large enough right now. Zero bytes always succeed.
    pub fn allocate(&mut self, len: u64) -> Option<Extent> {
        let len = len.checked_next_multiple_of(STAGING_ALIGN)?;
        if len == 0 {
            return Some(Extent { offset: 0, len: 0 });
        }
        let (&offset, &free_len) = self.free.iter().find(|&(_, &l)| l >= len)?;
        self.free.remove(&offset);
        if free_len > len {
            self.free.insert(offset + len, free_len - len);
        }
        self.in_use += len;
        Some(Extent { offset, len })
    }

    /// Returns an extent obtained from [`Self::allocate`].
    pub fn release(&mut self, extent: Extent) {
        if extent.len == 0 {
            return;
        }
        debug_assert!(extent.offset + extent.len <= self.capacity);
        self.in_use -= extent.len;
        let mut offset = extent.offset;
        let mut len = extent.len;
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back()
            && prev + prev_len == offset
        {
            self.free.remove(&prev);
            offset = prev;
            len += prev_len;
        }
        if let Some(next_len) = self.free.remove(&(extent.offset + extent.len)) {
            len += next_len;
        }
        self.free.insert(offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allocates_first_fit_and_coalesces() {
        let mut a = StagingAllocator::new(100);
        assert_eq!(a.capacity(), 96);
        let x = a.allocate(10).unwrap();
        let y = a.allocate(8).unwrap();
        let z = a.allocate(64).unwrap();
        assert_eq!((x.offset, x.len), (0, 16));
        assert_eq!((y.offset, z.offset), (16, 24));
        assert_eq!(a.allocate(9), None, "only 8 bytes are left");
        a.release(y);
        a.release(x);
        // x and y coalesced into one 24-byte hole at 0.
        assert_eq!(a.allocate(24).unwrap().offset, 0);
        a.release(Extent { offset: 0, len: 24 });
        a.release(z);
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.allocate(96).unwrap(), Extent { offset: 0, len: 96 });
        assert_eq!(a.allocate(0), Some(Extent { offset: 0, len: 0 }));
        assert_eq!(a.allocate(u64::MAX), None);
    }

    proptest! {
        /// Random allocate/release sequences: extents stay in bounds, never overlap,
        /// and everything released makes the whole buffer allocatable again.
        #[test]
        fn extents_never_overlap(steps in proptest::collection::vec((any::<bool>(), 0u64..200), 0..200)) {
            let mut a = StagingAllocator::new(1024);
            let mut live: Vec<Extent> = Vec::new();
            for (alloc, n) in steps {
                if alloc || live.is_empty() {
                    if let Some(e) = a.allocate(n) {
                        if e.len == 0 { continue; }
                        prop_assert!(e.offset % STAGING_ALIGN == 0 && e.offset + e.len <= 1024);
                        for other in &live {
                            prop_assert!(e.offset + e.len <= other.offset || other.offset + other.len <= e.offset,
                                "{:?} overlaps {:?}", e, other);
                        }
                        live.push(e);
                    }
                } else {
                    let e = live.swap_remove(n as usize % live.len());
                    a.release(e);
                }
                prop_assert_eq!(a.in_use(), live.iter().map(|e| e.len).sum::<u64>());
            }
            for e in live.drain(..) {
                a.release(e);
            }
            prop_assert_eq!(a.allocate(1024), Some(Extent { offset: 0, len: 1024 }));
        }
    }
}
