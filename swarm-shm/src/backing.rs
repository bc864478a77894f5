//! What kind of memory a cluster directory's files live in.
//!
//! Node files belong in memory: tmpfs (`/dev/shm`), hugetlbfs, or a DAX filesystem
//! over real CXL or persistent memory. On a disk-backed filesystem the first touch
//! of each page reads or allocates a disk block, and under writeback pressure such a
//! fault can stall an operation for hundreds of milliseconds, past its deadline.
//! Operations survive that (they are retried), but slowly; so creating a cluster
//! there warns, and opening one asks the kernel to read the files ahead.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The filesystem under a cluster directory, as far as node files are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Memory: tmpfs or ramfs.
    Memory,
    /// Explicit huge pages: hugetlbfs.
    HugePages,
    /// Any other filesystem: backed by a block device (or not known to be memory;
    /// a DAX mount of ext4 or xfs also reports itself here).
    Disk {
        /// The filesystem's magic number (`statfs`'s `f_type`).
        fs_type: i64,
    },
}

const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

impl Backing {
    /// The backing of the filesystem that holds `dir`.
    pub fn of(dir: &Path) -> io::Result<Self> {
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
        let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
        // SAFETY: `path` is a valid NUL-terminated string for the call, and `stat`
        // points to writable memory the size of a `statfs`, which the call fills in
        // on success (and which is all-zero, a valid `statfs`, otherwise).
        let rc = unsafe { libc::statfs(path.as_ptr(), stat.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zero-initialised above and filled in by a successful `statfs`.
        let stat = unsafe { stat.assume_init() };
        #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs between targets.
        let fs_type = stat.f_type as i64;
        Ok(Self::from_magic(fs_type))
    }

    fn from_magic(fs_type: i64) -> Self {
        // The magic is 32 bits; some targets report it sign-extended, some not.
        match fs_type as u32 {
            TMPFS_MAGIC | RAMFS_MAGIC => Self::Memory,
            HUGETLBFS_MAGIC => Self::HugePages,
            _ => Self::Disk { fs_type },
        }
    }

    /// Whether node files here may stall on disk I/O at first touch.
    pub fn is_disk(self) -> bool {
        matches!(self, Self::Disk { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_map_to_their_backing_whatever_their_sign() {
        assert_eq!(Backing::from_magic(0x0102_1994), Backing::Memory);
        assert_eq!(Backing::from_magic(0x8584_58f6), Backing::Memory);
        assert_eq!(
            Backing::from_magic(i64::from(0x8584_58f6_u32 as i32)),
            Backing::Memory,
            "sign-extended"
        );
        assert_eq!(Backing::from_magic(0x9584_58f6), Backing::HugePages);
        assert_eq!(
            Backing::from_magic(i64::from(0x9584_58f6_u32 as i32)),
            Backing::HugePages
        );
        // ext4
        assert_eq!(
            Backing::from_magic(0xef53),
            Backing::Disk { fs_type: 0xef53 }
        );
    }

    #[test]
    fn dev_shm_is_memory_when_it_exists() {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            assert_eq!(Backing::of(shm).unwrap(), Backing::Memory);
        }
        assert!(Backing::of(Path::new("/nonexistent/dir")).is_err());
    }
}
