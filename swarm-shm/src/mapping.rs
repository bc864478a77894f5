//! The `unsafe` code of node memory: viewing a mapped node file as atomic words,
//! reserving a node file's space, and prefetch hints on the mapping.
//!
//! A node file is mapped `MAP_SHARED` with `memmap2::MmapRaw`, which hands out raw
//! pointers only. We turn the mapping into a `&[AtomicU64]` and nothing else:
//!
//! - never a `&[u8]` or `&mut [u8]`: other processes write the file concurrently,
//!   which would break the immutability (or exclusivity) such references promise;
//! - atomic words permit exactly that concurrent mutation (`AtomicU64` is an
//!   `UnsafeCell`), and every access to node memory in this crate is an 8-byte
//!   aligned atomic operation of one size, so no access of ours is a data race even
//!   though the memory is racy by nature. Torn multi-word data is expected and is
//!   detected by the protocol's hashes and timestamps (SWARM §4).

use std::fs::File;
use std::io;
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};

/// A node file mapped read-write and shared, viewed as `words` atomic words.
#[derive(Debug)]
pub(crate) struct Mapping {
    map: MmapRaw,
    words: usize,
}

impl Mapping {
    /// Maps the first `len` bytes of `file`.
    ///
    /// The caller must have checked with `metadata` that the file is at least `len`
    /// bytes long: mapping past the end of a file is allowed by `mmap`, but touching
    /// those pages raises `SIGBUS`. `len` must be a nonzero multiple of 8.
    pub(crate) fn new(file: &File, len: u64) -> io::Result<Self> {
        let bytes = usize::try_from(len)
            .ok()
            .filter(|b| *b > 0 && b.is_multiple_of(8))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cannot map {len} bytes: need a nonzero multiple of 8"),
                )
            })?;
        let map = MmapOptions::new().len(bytes).map_raw(file)?;
        // `mmap` of offset 0 returns a page-aligned address; check rather than assume,
        // since `words` relies on it.
        if map.len() != bytes || !map.as_ptr().cast::<AtomicU64>().is_aligned() {
            return Err(io::Error::other(
                "the kernel returned a mapping of the wrong length or alignment",
            ));
        }
        Ok(Self {
            map,
            words: bytes / 8,
        })
    }

    /// Asks the kernel to read the whole mapping ahead, in the background: for a
    /// node file on a disk-backed filesystem ([`crate::Backing`]), whose pages would
    /// otherwise be read at their first touch, inside an operation. Best effort.
    pub(crate) fn read_ahead(&self) {
        if let Err(error) = self.map.advise(memmap2::Advice::WillNeed) {
            tracing::debug!(%error, "madvise(WILLNEED) on a node file failed");
        }
    }

    /// Hints the processor to fetch the cache lines of bytes `addr..addr + len` (the
    /// part inside the mapping) into its caches. Changes no memory and no result.
    #[inline]
    pub(crate) fn prefetch(&self, addr: u64, len: u64) {
        const LINE: u64 = 64;
        let end = addr.saturating_add(len).min(self.words as u64 * 8);
        let mut line = addr & !(LINE - 1);
        while line < end {
            // Inside the mapping (`line < end <= mapped bytes`), though a hint would
            // not fault anywhere.
            crate::hint::prefetch_line(self.map.as_ptr().wrapping_add(line as usize));
            line += LINE;
        }
    }

    /// The mapped memory as atomic words.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY:
        // - the pointer is non-null and 8-byte aligned (checked in `new`: the mapping
        //   starts on a page boundary), and `words * 8` bytes are mapped, readable and
        //   writable for as long as `self.map` lives, which bounds the returned
        //   lifetime; the length fits in `isize` since the kernel mapped it;
        // - `AtomicU64` has the size and alignment of `u64` and every bit pattern is a
        //   valid value, so any file content is a valid `[AtomicU64]`;
        // - the memory is mutated concurrently by other threads and processes, which a
        //   shared slice of atomics allows (interior mutability), and this crate only
        //   ever accesses it through these atomics, all of one size (8 bytes);
        // - the file was checked to be at least `len` bytes before mapping and this
        //   crate never shrinks it, so no access touches a page past its end (a process
        //   that truncates it anyway causes `SIGBUS`, not undefined behaviour).
        unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().cast::<AtomicU64>(), self.words) }
    }
}

/// Reserves the file's blocks up front, so that a full tmpfs fails cluster creation
/// with `ENOSPC` instead of raising `SIGBUS` later, on the first touch of a sparse
/// page. File systems that cannot preallocate leave the file sparse.
#[cfg(target_os = "linux")]
pub(crate) fn preallocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;

    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "node size exceeds off_t"))?;
    // SAFETY: `posix_fallocate` takes plain integers and no pointer; the descriptor is
    // owned by `file`, which is borrowed (hence open) for the whole call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 | libc::EOPNOTSUPP => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    }
}

/// Preallocation is Linux-only; elsewhere the file stays sparse.
#[cfg(not(target_os = "linux"))]
pub(crate) fn preallocate(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}
