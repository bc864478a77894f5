//! Cache hints: ask the processor to start fetching lines that code is about to
//! touch, so that several cache misses overlap instead of coming one after another.
//!
//! The transport hints node memory ([`swarm_core::Fabric::prefetch`] on a mapping);
//! [`prefetch_local`] hints a client's own memory (`swarm-kv`'s location cache, whose
//! lookups miss on many keys). A hint changes no memory and no result; on targets
//! without one it does nothing.

/// Bytes per cache line.
const LINE: usize = 64;

/// Hints the cache line that holds `ptr`. Any address will do: a prefetch never
/// faults and never writes.
#[inline]
pub(crate) fn prefetch_line(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 target has. It is a hint:
    // it never faults (an address outside the process is ignored), never changes
    // memory, and never reads into anything the program sees.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Hints every cache line of `value` (its own bytes, not what it points to).
#[inline]
pub fn prefetch_local<T: ?Sized>(value: &T) {
    let start = (value as *const T).cast::<u8>();
    let offset = start as usize % LINE;
    let lines = (offset + core::mem::size_of_val(value))
        .div_ceil(LINE)
        .max(1);
    let first = start.wrapping_sub(offset);
    for line in 0..lines {
        prefetch_line(first.wrapping_add(line * LINE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_change_nothing() {
        let values = [7u64; 40];
        prefetch_local(&values);
        prefetch_local(&values[3..5]);
        prefetch_local(&());
        prefetch_line(core::ptr::null());
        assert_eq!(values, [7; 40]);
    }
}
