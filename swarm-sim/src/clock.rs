//! [`SimClock`]: timestamp ticks from the virtual clock, with per-client skew.
//!
//! Safe-Guess guesses write timestamps from a loosely synchronised clock
//! (SWARM §3.1-3.2): a writer whose clock lags guesses stale timestamps and must take
//! the slow path (timestamp locks, a second write). To exercise that path
//! deterministically, each simulated client gets a clock that reads the world's
//! virtual time shifted by its own skew, which a test can set (negative = behind)
//! and change mid-run.

use core::cell::Cell;

use super::world::SimWorld;
use swarm_core::Clock;
use swarm_core::fabric::Nanos;

/// Ticks count from this many virtual nanoseconds *before* the world started, so
/// that negative skews up to one virtual second stay meaningful instead of
/// saturating at tick 0.
pub const CLOCK_EPOCH_NS: Nanos = 1_000_000_000;

/// A timestamp clock over a [`SimWorld`]'s virtual time:
/// `ticks = (CLOCK_EPOCH_NS + now + skew) / tick_ns`, saturating at 0.
#[derive(Debug, Clone)]
pub struct SimClock {
    world: SimWorld,
    tick_ns: u64,
    skew_ns: Cell<i64>,
}

impl SimClock {
    /// A clock with ticks of `tick_ns` nanoseconds (0 counts as 1) and no skew.
    pub fn new(world: &SimWorld, tick_ns: u64) -> Self {
        Self {
            world: world.clone(),
            tick_ns: tick_ns.max(1),
            skew_ns: Cell::new(0),
        }
    }

    /// The same clock, `skew_ns` ahead (or behind, if negative) of virtual time.
    pub fn with_skew(self, skew_ns: i64) -> Self {
        self.skew_ns.set(skew_ns);
        self
    }

    /// Changes the skew, e.g. to make a client's guesses stale mid-run.
    pub fn set_skew(&self, skew_ns: i64) {
        self.skew_ns.set(skew_ns);
    }

    /// The current skew in nanoseconds.
    pub fn skew(&self) -> i64 {
        self.skew_ns.get()
    }

    /// The tick length in nanoseconds.
    pub fn tick_ns(&self) -> u64 {
        self.tick_ns
    }
}

impl Clock for SimClock {
    fn ticks(&self) -> u64 {
        let now = i128::from(CLOCK_EPOCH_NS) + i128::from(self.world.now());
        let skewed = (now + i128::from(self.skew_ns.get())).max(0);
        // `skewed` is at most u64::MAX + 2^63 + 1e9 and `tick_ns` ≥ 1; clamp anyway.
        u64::try_from(skewed / i128::from(self.tick_ns)).unwrap_or(u64::MAX)
    }
}
