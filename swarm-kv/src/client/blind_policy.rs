//! When an insert tries the index's blind fast round (`crate::index`, "One-roundtrip
//! inserts").
//!
//! A blind round is decided only in a first bucket in which nothing was ever
//! accepted. Decided, the insert takes one roundtrip. Not decided, the insert reads
//! the buckets after it: three roundtrips, where the read-first path (the read
//! alongside the register's write, then the fast round) takes two. A blind round
//! therefore pays while more than half of them are decided: a store loading keys
//! into a sparse index, not one whose buckets are mostly used (an index only gets
//! denser: a bucket that accepted a change never reads as unused again).
//!
//! The policy follows the recent outcomes with a bounded credit, a random walk that
//! drifts up exactly when more than half of the rounds are decided: a decided round
//! adds one, another takes one away. Inserts try blind rounds while the credit is
//! positive, and otherwise one insert in [`PROBE_EVERY`], so that a client that
//! moves on to a part of the key space with unused buckets (a new load) finds out.
//! In a dense index that costs one roundtrip on one insert in [`PROBE_EVERY`].

use std::cell::Cell;

/// Highest credit: how many undecided rounds in a row it takes, after a long run of
/// decided ones, to stop trying.
const CREDIT_MAX: i8 = 16;
/// Lowest credit: how many decided rounds in a row it takes, after a long run of
/// undecided ones, to try every insert again.
const CREDIT_MIN: i8 = -16;
/// Without credit, one insert in this many still tries a blind round.
pub const PROBE_EVERY: u8 = 32;
/// A new client's credit: its first inserts try blind rounds (a new client of a
/// store that is being loaded is the case blind rounds are for).
const CREDIT_START: i8 = 4;

/// Whether this client's next insert tries a blind fast round (module docs).
#[derive(Debug)]
pub struct BlindPolicy {
    credit: Cell<i8>,
    since_probe: Cell<u8>,
}

impl Default for BlindPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl BlindPolicy {
    /// A policy that tries the first inserts' rounds.
    pub fn new() -> Self {
        Self {
            credit: Cell::new(CREDIT_START),
            since_probe: Cell::new(0),
        }
    }

    /// Whether the insert about to start tries a blind round (a probe counts as one
    /// of the inserts between two probes).
    pub fn should_try(&self) -> bool {
        if self.credit.get() > 0 {
            return true;
        }
        let next = self.since_probe.get() + 1;
        if next >= PROBE_EVERY {
            self.since_probe.set(0);
            true
        } else {
            self.since_probe.set(next);
            false
        }
    }

    /// Records whether a blind round was decided.
    pub fn record(&self, decided: bool) {
        let credit = self.credit.get();
        self.credit.set(if decided {
            (credit + 1).min(CREDIT_MAX)
        } else {
            (credit - 1).max(CREDIT_MIN)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `n` inserts try a blind round when each decided with
    /// `decided(i)`.
    fn tries(policy: &BlindPolicy, n: usize, decided: impl Fn(usize) -> bool) -> usize {
        let mut tried = 0;
        for i in 0..n {
            if policy.should_try() {
                tried += 1;
                policy.record(decided(i));
            }
        }
        tried
    }

    #[test]
    fn a_sparse_index_keeps_every_insert_blind() {
        let policy = BlindPolicy::new();
        // Two of three decided: the credit climbs and stays up.
        assert_eq!(tries(&policy, 1000, |i| i % 3 != 0), 1000);
    }

    #[test]
    fn a_dense_index_is_probed_one_insert_in_probe_every() {
        let policy = BlindPolicy::new();
        // Nothing decided: the first inserts try until the credit is spent, then
        // probes only.
        let start = CREDIT_START as usize;
        let tried = tries(&policy, 32 * 100, |_| false);
        assert_eq!(tried, start + (32 * 100 - start) / usize::from(PROBE_EVERY));
        // A new load into unused buckets: the probes find it and every insert tries
        // again after enough decided rounds to climb out of the floor.
        let policy_after = tries(&policy, 32 * 40, |_| true);
        assert!(policy_after > 32 * 40 - 32 * 17, "{policy_after}");
        assert!(policy.should_try());
    }

    #[test]
    fn a_coin_flip_index_settles_near_the_break_even() {
        // One in three decided: below the break-even, so mostly probes.
        let policy = BlindPolicy::new();
        let tried = tries(&policy, 3200, |i| i % 3 == 0);
        assert!(tried < 3200 / 4, "{tried}");
    }
}
