//! Real time as timestamp ticks since the cluster epoch.

use std::time::{SystemTime, UNIX_EPOCH};

use swarm_core::Clock;

/// The system clock read as ticks since the cluster epoch (both from the node header).
///
/// Safe-Guess needs clocks that are only *loosely* synchronised (SWARM §3.2, §6): a
/// client whose clock lags sees its guesses found stale and re-synchronises forward.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    epoch_unix_ns: u64,
    tick_ns: u64,
}

impl SystemClock {
    /// A clock for a cluster whose epoch and tick are given (tick 0 is refused: 1).
    pub fn new(epoch_unix_ns: u64, tick_ns: u64) -> Self {
        Self {
            epoch_unix_ns,
            tick_ns: tick_ns.max(1),
        }
    }

    /// Nanoseconds since the Unix epoch.
    pub fn unix_ns() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
            .unwrap_or(0)
    }
}

impl Clock for SystemClock {
    fn ticks(&self) -> u64 {
        Self::unix_ns().saturating_sub(self.epoch_unix_ns) / self.tick_ns
    }
}
