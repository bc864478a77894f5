//! Guessing timestamps (SWARM §3.2 `guessTs`, §6).
//!
//! A writer guesses a timestamp from its loosely synchronised clock; the guess is
//! fresh in the common case, which lets a Safe-Guess write finish in one roundtrip.
//! Two rules keep guesses useful:
//!
//! * guesses are strictly increasing per writer, whatever the clock does;
//! * when a writer observes a larger timestamp than its clock would give (its guess
//!   was stale), it *re-synchronises*: it pushes its clock forward past the observed
//!   timestamp, so that its next guesses are fresh again (§6: "re-synchronize every
//!   time they guess a stale timestamp").

/// Per-writer timestamp state.
#[derive(Clone, Debug, Default)]
pub struct TimestampGuesser {
    last: u64,
    /// Ticks added to the clock after re-synchronisation.
    offset: u64,
}

impl TimestampGuesser {
    /// A guesser that has not guessed yet.
    pub const fn new() -> Self {
        Self { last: 0, offset: 0 }
    }

    /// The next guess given the clock's reading: at least the adjusted clock and
    /// strictly above every previous guess.
    pub fn next(&mut self, clock_ticks: u64) -> u64 {
        let guess = clock_ticks
            .saturating_add(self.offset)
            .max(self.last.saturating_add(1));
        self.last = guess;
        guess
    }

    /// The largest tick count guessed or used so far (0 before the first).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The next timestamp of at least `min_ticks` (not a clock reading: no offset).
    pub fn at_least(&mut self, min_ticks: u64) -> u64 {
        let t = min_ticks.max(self.last.saturating_add(1));
        self.last = t;
        t
    }

    /// Records that a write used `ticks` (possibly bumped to find a free log slot).
    pub fn used(&mut self, ticks: u64) {
        self.last = self.last.max(ticks);
    }

    /// Re-synchronises after observing `ticks` from another writer when the clock
    /// reads `clock_ticks`: later guesses will exceed `ticks`.
    pub fn observe(&mut self, ticks: u64, clock_ticks: u64) {
        if ticks >= clock_ticks.saturating_add(self.offset) {
            self.offset = ticks - clock_ticks + 1;
        }
        self.last = self.last.max(ticks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_increase_and_resync_forward() {
        let mut g = TimestampGuesser::new();
        assert_eq!(g.next(100), 100);
        assert_eq!(g.next(100), 101, "strictly increasing on a stuck clock");
        assert_eq!(g.next(50), 102, "clock going back does not matter");
        g.observe(1_000, 200);
        assert!(g.next(200) > 1_000, "stale guesses re-synchronise");
        assert!(g.next(201) > 1_001, "the offset persists");
    }

    #[test]
    fn a_minimum_is_not_a_clock_reading() {
        let mut g = TimestampGuesser::new();
        g.observe(1_000, 200); // offset 801
        // A rewrite above a timestamp must not add the clock offset on top of it, or
        // stale guesses would inflate timestamps without bound.
        assert_eq!(g.at_least(1_001), 1_001);
        assert_eq!(g.at_least(500), 1_002, "still strictly increasing");
    }
}
