//! The locked-memory limit, checked before registering memory.
//!
//! `ibv_reg_mr` pins the pages it registers, and Linux charges them to the process's
//! `RLIMIT_MEMLOCK` unless it holds `CAP_IPC_LOCK` (root does). Distributions default
//! to 64 KiB or 8 MiB, far below a memory node's gigabytes (or a few client threads'
//! staging buffers), and the kernel then fails the registration with a bare `ENOMEM`
//! or `EPERM`. We check first and say what to raise: [`RdmaError::MemlockLimit`].
//!
//! The process's registrations are counted here ([`Registered`]), so a limit that is
//! large enough for one client thread but not for eight is reported on the ninth
//! thread's registration, not as a mysterious failure. Memory the process locked by
//! other means (`mlock`) is not counted; the kernel still has the last word.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::RdmaError;

/// Bytes registered by this process and not yet deregistered.
static REGISTERED: AtomicU64 = AtomicU64::new(0);

/// `CAP_IPC_LOCK`'s bit in the capability sets of `/proc/self/status`.
const CAP_IPC_LOCK_BIT: u32 = 14;

/// A registration's share of the locked-memory budget, given back on drop.
#[derive(Debug)]
pub struct Registered {
    bytes: u64,
}

impl Registered {
    /// Checks that `bytes` more can be registered under the process's limit, and
    /// counts them until the returned value is dropped.
    pub fn reserve(bytes: u64) -> Result<Self, RdmaError> {
        let in_use = REGISTERED.fetch_add(bytes, Ordering::Relaxed);
        let this = Self { bytes };
        check(limit(), has_ipc_lock(), in_use, bytes)?;
        Ok(this)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        REGISTERED.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Whether registering `bytes` more, with `in_use` already registered, fits under
/// `limit` (`None`: unlimited). A process with `CAP_IPC_LOCK` is not limited.
fn check(limit: Option<u64>, ipc_lock: bool, in_use: u64, bytes: u64) -> Result<(), RdmaError> {
    let Some(limit) = limit else { return Ok(()) };
    let needed = in_use.saturating_add(bytes);
    if ipc_lock || needed <= limit {
        return Ok(());
    }
    Err(RdmaError::MemlockLimit { needed, limit })
}

/// The soft `RLIMIT_MEMLOCK` in bytes, `None` when unlimited (or unknown: then the
/// kernel decides).
fn limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-pointer for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Whether the process's effective capabilities include `CAP_IPC_LOCK`.
fn has_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_caps(&status))
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK_BIT) != 0)
}

/// The `CapEff:` mask of a `/proc/PID/status` text.
fn effective_caps(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_counts_what_is_already_registered_unless_the_process_may_lock_anything() {
        assert!(check(None, false, u64::MAX - 1, 10).is_ok());
        assert!(check(Some(64 << 10), true, 0, 1 << 30).is_ok());
        assert!(check(Some(8 << 20), false, 4 << 20, 4 << 20).is_ok());
        let error = check(Some(8 << 20), false, 4 << 20, (4 << 20) + 1).unwrap_err();
        assert!(
            matches!(error, RdmaError::MemlockLimit { needed, limit } if needed == (8 << 20) + 1 && limit == 8 << 20)
        );
        let text = error.to_string();
        assert!(text.contains("ulimit -l"), "{text}");
        assert!(text.contains("CAP_IPC_LOCK"), "{text}");
    }

    #[test]
    fn capabilities_are_read_from_proc_status() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(root), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("CapEff:\t0000000000004000\n"), Some(1 << 14));
        assert_eq!(effective_caps("Name:\tx\n"), None);
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
    }

    #[test]
    fn reservations_are_given_back_even_when_refused() {
        let huge = Registered::reserve(u64::MAX / 2);
        if limit().is_some() && !has_ipc_lock() {
            assert!(matches!(huge, Err(RdmaError::MemlockLimit { .. })));
        }
        drop(huge);
        // Other tests may hold a few megabytes; the huge share is gone either way.
        assert!(REGISTERED.load(Ordering::Relaxed) < u64::MAX / 4);
    }
}
