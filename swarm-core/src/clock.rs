//! Time is an input.
//!
//! The core never reads a clock. Safe-Guess guesses timestamps from a loosely
//! synchronised clock (SWARM §3.2, §6); whoever embeds the core passes one in through
//! this trait. Transports supply their own notion of *elapsed* time for timeouts
//! through [`crate::Fabric::now`]; the two are deliberately distinct, since
//! timestamps must be comparable across clients and timeouts need not be.

/// A source of timestamp ticks: ticks since the cluster epoch (the epoch and the tick
/// length are recorded in the cluster header, see [`crate::header`]).
pub trait Clock {
    /// Ticks elapsed since the cluster epoch. Need not be monotonic across calls; the
    /// timestamp guesser enforces strict monotonicity itself.
    fn ticks(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn ticks(&self) -> u64 {
        (**self).ticks()
    }
}

/// A clock that always reads the same tick value: deterministic tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn ticks(&self) -> u64 {
        self.0
    }
}
