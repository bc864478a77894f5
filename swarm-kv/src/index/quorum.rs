//! Quorum steps over the memory nodes, built on [`Roundtrip`] (the only place
//! roundtrips are counted), and a backoff sleep on the fabric's clock.
//!
//! Two shapes, as in the protocol core (`swarm_core::protocol::maxreg`):
//! * [`preferred_step`] asks a *preferred majority* first and everybody else only
//!   when one of them is slow, failed or returned something unusable (SWARM §6);
//! * [`broadcast_step`] sends to every node at once and returns as soon as a quorum
//!   of useful answers arrived, waiting a little for stragglers otherwise. CAS
//!   phases use it: every node should see every promise and accept, so that the
//!   copies stay alike and later reads are settled in one roundtrip.

use core::future::poll_fn;
use core::task::Poll;

use swarm_core::fabric::{Batch, Completion, Fabric, FabricError, Nanos, NodeId};
use swarm_core::{OpStats, Roundtrip, WaitOutcome};

/// A majority of `n` nodes.
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Nodes `0..n`, starting at `start % n`: spreads preferred majorities over nodes.
pub fn rotation(n: usize, start: u64) -> Vec<NodeId> {
    let n = n.max(1);
    let first = (start % n as u64) as usize;
    (0..n).map(|i| NodeId(((first + i) % n) as u16)).collect()
}

/// Posts `build(node)` to the first `k` nodes of `order`; once they are slow or the
/// replies are not `enough`, counts one more roundtrip and posts to the rest too.
/// Fails when every node answered and the replies are still not enough.
pub async fn preferred_step<'a, F, B, E>(
    fabric: &'a F,
    stats: &'a OpStats,
    order: &[NodeId],
    k: usize,
    slow_after: Nanos,
    mut build: B,
    mut enough: E,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric,
    B: FnMut(NodeId) -> Result<Batch, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    let mut rt = Roundtrip::start(fabric, stats);
    let first = k.min(order.len());
    for &node in &order[..first] {
        rt.post(node, build(node)?)?;
    }
    let deadline = fabric.now().saturating_add(slow_after);
    loop {
        if enough(rt.replies()) {
            return Ok(rt);
        }
        let have = rt.replies().len();
        if rt.wait_until(have + 1, deadline).await == WaitOutcome::Short {
            break;
        }
    }
    if order.len() > first {
        rt.escalate();
        for &node in &order[first..] {
            rt.post(node, build(node)?)?;
        }
    }
    loop {
        if enough(rt.replies()) {
            return Ok(rt);
        }
        let have = rt.replies().len();
        rt.wait(have + 1).await?;
    }
}

/// Posts `build(node)` (when it returns a batch) to every node, waits for a quorum
/// of `q` replies, then for more while the replies are not `enough`, giving each
/// straggler `slow_after` to answer. The caller judges the replies it gets. The wait
/// for `q` replies only ends while `q` of the nodes posted to are alive: callers
/// post to every node that may be needed (a read where a write is not allowed).
pub async fn broadcast_step<'a, F, B, E>(
    fabric: &'a F,
    stats: &'a OpStats,
    q: usize,
    slow_after: Nanos,
    mut build: B,
    mut enough: E,
) -> Result<Roundtrip<'a, F>, FabricError>
where
    F: Fabric,
    B: FnMut(NodeId) -> Result<Option<Batch>, FabricError>,
    E: FnMut(&[(NodeId, Completion)]) -> bool,
{
    let mut rt = Roundtrip::start(fabric, stats);
    let mut posted = 0;
    for n in 0..fabric.node_count() {
        let node = NodeId(n as u16);
        if let Some(batch) = build(node)? {
            rt.post(node, batch)?;
            posted += 1;
        }
    }
    if posted < q {
        return Err(FabricError::NotEnoughLiveNodes {
            needed: q,
            live: posted,
        });
    }
    rt.wait(q).await?;
    loop {
        if enough(rt.replies()) || rt.replies().len() + rt.failures().len() >= posted {
            return Ok(rt);
        }
        let have = rt.replies().len();
        let deadline = fabric.now().saturating_add(slow_after);
        if rt.wait_until(have + 1, deadline).await == WaitOutcome::Short {
            return Ok(rt);
        }
    }
}

/// Sleeps `ns` on the fabric's clock (asks the fabric to wake up then, so that a
/// simulated fabric's executor does not mistake the pause for a stall).
pub async fn sleep<F: Fabric + ?Sized>(fabric: &F, ns: Nanos) {
    let deadline = fabric.now().saturating_add(ns);
    fabric.wake_at(deadline);
    poll_fn(|cx| {
        if fabric.now() >= deadline {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

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
        assert_eq!(majority(3), 2);
        assert_eq!(majority(5), 3);
        assert_eq!(majority(1), 1);
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
