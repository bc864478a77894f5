//! Self-removing scratch directories for clusters that live only as long as a test,
//! a benchmark or a demo run.
//!
//! They go under `/dev/shm` when it exists (tmpfs: node memory never hits a disk,
//! which is the closest a single host gets to fabric-attached memory), else under the
//! system temporary directory.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh, private (mode 0700) directory, removed with its content on drop.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// Creates `<base>/<prefix>-<pid>-<nanos>-<n>` under `/dev/shm` or the temporary
    /// directory.
    pub fn new(prefix: &str) -> io::Result<Self> {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        Self::new_in(&base, prefix)
    }

    /// Creates a fresh directory under `base`.
    pub fn new_in(base: &Path, prefix: &str) -> io::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}-{}-{nanos}-{n}", std::process::id()));
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self { path, keep: false }),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place when dropped; returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !self.keep {
            // Best effort: a leftover directory in /dev/shm is harmless.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_private_unique_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let a = ScratchDir::new("swarm-shm-scratch-test").unwrap();
        let b = ScratchDir::new("swarm-shm-scratch-test").unwrap();
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::write(a.path().join("f"), b"x").unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
        let kept = b.keep();
        assert!(kept.is_dir());
        std::fs::remove_dir_all(kept).unwrap();
    }
}
