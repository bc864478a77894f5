//! Where and when the index sends its quorum steps: the preferred order of nodes,
//! backoff between contended attempts, and sleeps on the fabric's clock.
//!
//! The steps themselves are the protocol core's (`swarm_core::quorum`):
//! * reads use `preferred_step`, asking a *preferred majority* first (a
//!   [`rotation`] of the nodes, spread by bucket) and everybody else only when one
//!   of them is slow, failed or returned something unusable (SWARM §6);
//! * CAS phases use `broadcast_until`, sending to every node at once and returning
//!   as soon as a quorum of useful answers arrived, waiting a little for stragglers
//!   otherwise: every node should see every promise and accept, so that the copies
//!   stay alike and later reads are settled in one roundtrip.

use swarm_core::fabric::{Nanos, NodeId};

/// Nodes `0..n`, starting at `start % n`: spreads preferred majorities over nodes.
pub fn rotation(n: usize, start: u64) -> Vec<NodeId> {
    let n = n.max(1);
    let first = (start % n as u64) as usize;
    (0..n).map(|i| NodeId(((first + i) % n) as u16)).collect()
}

pub use swarm_core::sleep;

/// A small deterministic generator for backoff jitter (splitmix64): deterministic so
/// that a simulation replays from its seed.
#[derive(Clone, Copy, Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from anything that differs between concurrent callers.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The pause before attempt `attempt` (1-based): exponential in the attempt,
    /// capped, with a uniform factor in `[0.5, 1.5)`.
    pub fn backoff(&mut self, attempt: u32, base: Nanos, cap: Nanos) -> Nanos {
        let exp = base.saturating_mul(1 << attempt.min(16)).min(cap.max(base));
        let half = exp / 2;
        half + self.next_u64() % (exp.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotations_cover_every_node_once() {
        let r = rotation(5, 7);
        assert_eq!(r.iter().map(|n| n.0).collect::<Vec<_>>(), [2, 3, 4, 0, 1]);
        assert_eq!(rotation(1, 99), [NodeId(0)]);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut j = Jitter::new(1);
        for attempt in 1..40 {
            let b = j.backoff(attempt, 1_000, 64_000);
            let exp = (1_000u64 << attempt.min(16)).min(64_000);
            assert!(b >= exp / 2 && b < exp / 2 + exp, "attempt {attempt}: {b}");
        }
    }
}
