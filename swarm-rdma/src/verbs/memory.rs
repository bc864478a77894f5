//! Anonymous memory for a node's region or a client's staging buffer, and its
//! registration with the device.
//!
//! A memory node serves gigabytes; backing them with 2 MiB huge pages cuts the
//! NIC's address-translation misses, so the daemon asks for `MAP_HUGETLB` first and
//! falls back to normal pages (with a transparent-huge-page hint) when none are
//! reserved. The mapping is zero-filled, which is what an empty SWARM node is.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use crate::error::RdmaError;
use crate::verbs::device::Device;
use crate::verbs::memlock::Registered;

const HUGE_PAGE: usize = 2 << 20;
/// `MAP_HUGETLB` alone takes the system's *default* huge page size, which may be
/// 1 GiB: ask for 2 MiB pages explicitly, the size the length is rounded to (and
/// unmapped with).
const HUGE_FLAGS: i32 = libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
const _: () = assert!(libc::MAP_HUGE_2MB == 21 << libc::MAP_HUGE_SHIFT);

/// A private anonymous mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    /// Bytes usable by callers.
    len: usize,
    /// Bytes mapped (`len` rounded up to the page size in use).
    mapped: usize,
    huge: bool,
}

// SAFETY: the mapping is exclusively owned memory; moving it between threads is fine.
unsafe impl Send for Mapping {}
// SAFETY: shared references only expose the address and length; byte access needs
// `&mut self`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` zeroed bytes, with huge pages when `huge` and available.
    pub fn new(len: usize, huge: bool) -> Result<Self, RdmaError> {
        if len == 0 {
            return Err(RdmaError::Config("cannot map zero bytes".into()));
        }
        if huge {
            if let Some(mapped) = len.checked_next_multiple_of(HUGE_PAGE)
                && let Ok(ptr) = map(mapped, HUGE_FLAGS)
            {
                return Ok(Self {
                    ptr,
                    len,
                    mapped,
                    huge: true,
                });
            }
            tracing::info!(
                bytes = len,
                "no huge pages reserved (vm.nr_hugepages); using normal pages"
            );
        }
        let ptr = map(len, 0).map_err(|source| RdmaError::Alloc {
            bytes: len as u64,
            source,
        })?;
        if huge {
            // A hint only: transparent huge pages where the kernel allows them.
            // SAFETY: the range is exactly the mapping just created.
            unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(Self {
            ptr,
            len,
            mapped: len,
            huge: false,
        })
    }

    /// Usable bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: construction refuses zero bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `MAP_HUGETLB` pages back the mapping.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// The address of byte 0.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The 8-byte word at `offset`, loaded atomically (the NIC may write it at any
    /// moment); `None` if unaligned or out of bounds.
    pub fn load_u64(&self, offset: u64) -> Option<u64> {
        let offset = usize::try_from(offset).ok()?;
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `[offset, offset + 8)` is inside the live mapping (checked above)
        // and 8-byte aligned (the mapping is page aligned, the offset a multiple of
        // 8); an atomic load is sound even while the NIC or another atomic writes it,
        // and Rust code only ever writes registered memory before registration.
        let word = unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU64>()
        };
        Some(word.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The bytes `[offset, offset + len)` for a caller that counts in `u64` (the
    /// transport engine's staging extents); empty if out of bounds.
    pub fn extent_mut(&mut self, offset: u64, len: u64) -> &mut [u8] {
        let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return &mut [];
        };
        self.slice_mut(offset, len).unwrap_or_default()
    }

    /// The bytes `[offset, offset + len)`, or `None` if out of bounds.
    ///
    /// Registered memory can be written by the NIC at any time; callers only touch
    /// bytes no posted work request uses (a node header before registration, a
    /// staging extent before its chain is posted or after it completed).
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `[offset, end)` is inside the live mapping, and `&mut self`
        // guarantees no other Rust reference to it exists.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

fn map(len: usize, extra_flags: i32) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address chosen by the kernel has no
    // preconditions; failure is reported as MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range mapped in `new`, once. Registered memory
        // is deregistered first: MemoryRegion owns its Mapping and deregisters in its
        // own Drop before this runs.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

/// Access rights of a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A memory node's region: remote READ, WRITE and ATOMIC.
    Remote,
    /// A client's staging buffer: the local NIC writes read results into it.
    Local,
}

/// A [`Mapping`] registered with a device: deregistered, then unmapped, on drop.
#[derive(Debug)]
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    memory: Mapping,
    _device: Arc<Device>,
    _locked: Registered,
}

// SAFETY: the MR handle is only used through thread-safe verbs (dereg in Drop).
unsafe impl Send for MemoryRegion {}
// SAFETY: shared references only read the immutable keys and address.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `memory` on `device`, after checking the locked-memory limit
    /// ([`RdmaError::MemlockLimit`]).
    pub fn register(
        device: Arc<Device>,
        memory: Mapping,
        access: Access,
    ) -> Result<Self, RdmaError> {
        let flags = match access {
            Access::Remote => {
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_READ
                    | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC
            }
            Access::Local => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
        };
        let len = memory.len();
        let locked = Registered::reserve(len as u64)?;
        let addr = memory.ptr.as_ptr();
        // SAFETY: the PD is alive (we hold the device); `[addr, addr + len)` is a
        // live mapping owned by the returned region, which deregisters before it
        // unmaps. Relaxed ordering is deliberately not requested (see `wr`).
        let mr = unsafe { ibv_reg_mr(device.pd(), addr.cast(), len, flags.0 as i32) };
        let mr =
            NonNull::new(mr).ok_or_else(|| RdmaError::last_os("ibv_reg_mr (memory region)"))?;
        Ok(Self {
            mr,
            memory,
            _device: device,
            _locked: locked,
        })
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered until drop; its keys are immutable.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The registered memory.
    pub fn memory(&self) -> &Mapping {
        &self.memory
    }

    /// The registered memory, for byte access (see [`Mapping::slice_mut`]).
    pub fn memory_mut(&mut self) -> &mut Mapping {
        &mut self.memory
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once; afterwards the NIC no
        // longer accesses the memory, which `self.memory` then unmaps.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_dereg_mr failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_zeroed_bounded_and_fall_back_from_huge_pages() {
        // Huge pages are rarely reserved on test machines: this exercises the
        // fallback (or the huge path where they are).
        let mut m = Mapping::new(3 * 4096 + 5, true).unwrap();
        assert_eq!(m.len(), 3 * 4096 + 5);
        assert!(m.slice_mut(0, m.len()).unwrap().iter().all(|&b| b == 0));
        m.slice_mut(10, 3).unwrap().copy_from_slice(&[1, 2, 3]);
        assert_eq!(m.slice_mut(9, 5).unwrap(), &[0, 1, 2, 3, 0]);
        assert!(m.slice_mut(m.len(), 1).is_none());
        assert!(m.slice_mut(usize::MAX, 2).is_none());
        assert!(Mapping::new(0, false).is_err());
    }

    #[test]
    fn huge_mappings_ask_for_2_mib_pages_not_the_default_size() {
        assert_ne!(HUGE_FLAGS & libc::MAP_HUGETLB, 0);
        assert_eq!(
            HUGE_FLAGS & (0x3f << libc::MAP_HUGE_SHIFT),
            libc::MAP_HUGE_2MB
        );
        assert_eq!(HUGE_PAGE, 1 << 21);
    }

    #[test]
    fn impossible_sizes_are_allocation_errors() {
        let error = Mapping::new(usize::MAX / 2, false).unwrap_err();
        assert!(matches!(error, RdmaError::Alloc { .. }), "{error}");
    }
}
