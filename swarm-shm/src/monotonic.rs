//! The fabric's clock: `CLOCK_MONOTONIC` in nanoseconds, read without the detours of
//! `std::time::Instant` (a signed borrow-checked subtraction and a 128-bit
//! conversion), since every operation reads it for its fence and an emulated latency
//! reads it on every post and spin.

/// Nanoseconds of `CLOCK_MONOTONIC`: since an unspecified instant (the host's boot),
/// never going back, and the same clock in every process of the host.
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable `timespec` that outlives the call, which is
    // all `clock_gettime` writes to. `CLOCK_MONOTONIC` exists on every Unix this
    // crate builds for, so the call cannot fail (and a failure would leave `now` at
    // zero, a reading in the past, which no caller relies on beyond monotony).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    // Both fields are non-negative for this clock.
    (now.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_with_real_time() {
        let before = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = monotonic_ns();
        assert!(after >= before + 2_000_000, "{before} -> {after}");
        assert!(monotonic_ns() >= after, "never goes back");
    }
}
