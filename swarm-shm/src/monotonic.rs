//! The fabric's clock: `CLOCK_BOOTTIME` in nanoseconds (on Linux; `CLOCK_MONOTONIC`
//! elsewhere), read without the detours of `std::time::Instant` (a signed
//! borrow-checked subtraction and a 128-bit conversion), since every operation reads
//! it for its fence and an emulated latency reads it on every post and spin.
//!
//! Why boot time: leases, operation deadlines and recycling graces are judged on
//! this clock. `CLOCK_MONOTONIC` stops while the host is suspended, so a client whose
//! host slept through its lease would wake up believing the lease still valid while
//! other clients had taken its writer id. `CLOCK_BOOTTIME` counts the suspended time.

#[cfg(any(target_os = "linux", target_os = "android"))]
const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

/// Nanoseconds of the fabric clock (see the module docs): since an unspecified
/// instant (the host's boot), never going back, counting suspended time on Linux,
/// and the same clock in every process of the host. Tested through
/// [`swarm_core::Fabric::now`] (`fabric::tests::now_is_monotonic`).
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable `timespec` that outlives the call, which is
    // all `clock_gettime` writes to. `CLOCK` (boot time or monotonic) exists on every
    // Unix this crate builds for, so the call cannot fail (and a failure would leave
    // `now` at zero, a reading in the past, which no caller relies on beyond monotony).
    unsafe {
        libc::clock_gettime(CLOCK, &mut now);
    }
    // Both fields are non-negative for this clock.
    (now.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec as u64)
}
