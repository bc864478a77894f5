//! Which memory nodes a client currently suspects of having failed (SWARM §6).
//!
//! A node that misses a deadline (`slow_after_ns`) is suspected for `suspect_ns`: the
//! client orders it last when it picks the nodes to contact first, so that a crashed
//! node costs one timeout, not one per operation. Every path that prefers some nodes
//! over others consults the same table: register reads and writes in this crate, and
//! the index and key-header reads of a store built on it (SWARM-KV), which share the
//! table of their register client ([`crate::Client::suspicion`]).
//!
//! Plain atomics, not the loom facade: the table is one client's view, not shared
//! disaggregated memory, and a stale read of it only costs a timeout.

use core::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

use crate::fabric::{Nanos, NodeId};
use crate::roundtrip::{MAX_CLUSTER_NODES, MAX_NODES};

/// Per node, suspected until a fabric time (0: trusted). See the module docs.
#[derive(Debug)]
pub struct Suspicion {
    until: [AtomicU64; MAX_CLUSTER_NODES],
    /// Bit `i` set while `until[i]` is not 0 (set after it, cleared after it and set
    /// again if it is not 0 any more), so that [`Suspicion::any`], asked on every
    /// quorum step, loads one word.
    suspected: AtomicU64,
    suspect_ns: Nanos,
}

impl Suspicion {
    /// A table that suspects a late node for `suspect_ns`.
    pub fn new(suspect_ns: Nanos) -> Self {
        Self {
            until: core::array::from_fn(|_| AtomicU64::new(0)),
            suspected: AtomicU64::new(0),
            suspect_ns,
        }
    }

    /// How long a late node stays suspected.
    pub fn suspect_ns(&self) -> Nanos {
        self.suspect_ns
    }

    fn slot(&self, node: NodeId) -> Option<&AtomicU64> {
        self.until.get(node.index())
    }

    /// Whether `node` is suspected at fabric time `now`.
    pub fn suspects(&self, node: NodeId, now: Nanos) -> bool {
        self.suspects_with(node, || now)
    }

    /// Whether `node` is suspected, reading the clock (`now`) only if it was suspected
    /// at some point: a trusted node, the common case, costs one load.
    pub fn suspects_with(&self, node: NodeId, now: impl FnOnce() -> Nanos) -> bool {
        match self.slot(node).map(|s| s.load(Relaxed)) {
            None | Some(0) => false,
            Some(until) => until > now(),
        }
    }

    /// Whether any node is suspected at all (a cheap test before reading a clock).
    #[inline]
    pub fn any(&self) -> bool {
        self.suspected.load(Relaxed) != 0
    }

    /// Suspects `node` from `now` on; whether it was trusted until then.
    pub fn suspect(&self, node: NodeId, now: Nanos) -> bool {
        let Some(slot) = self.slot(node) else {
            return false;
        };
        let until = now.saturating_add(self.suspect_ns);
        let previous = slot.swap(until, SeqCst);
        if until != 0 {
            self.suspected.fetch_or(Self::bit(node), SeqCst);
        }
        previous == 0 || previous <= now
    }

    /// The bit of `node` in `suspected` (a node with a slot has one:
    /// `MAX_CLUSTER_NODES` <= 64).
    fn bit(node: NodeId) -> u64 {
        1 << (node.index() % 64)
    }

    /// Trusts `node` again; whether it was suspected. A plain load when it was not (the
    /// hot path: every timely answer trusts its node).
    pub fn trust(&self, node: NodeId) -> bool {
        let Some(slot) = self.slot(node) else {
            return false;
        };
        if slot.load(Relaxed) == 0 || slot.swap(0, SeqCst) == 0 {
            return false;
        }
        self.suspected.fetch_and(!Self::bit(node), SeqCst);
        // A `suspect` of another thread may have stored its slot in between: its bit
        // stays set then (it sets the bit after the slot, and every step is SeqCst).
        if slot.load(SeqCst) != 0 {
            self.suspected.fetch_or(Self::bit(node), SeqCst);
        }
        true
    }

    /// Moves the nodes suspected at `now` to the end of `order`, keeping the relative
    /// order of the trusted ones and of the suspected ones.
    pub fn trusted_first(&self, order: &mut [NodeId], now: Nanos) {
        if !self.any() {
            return;
        }
        // A stable partition of at most MAX_NODES elements.
        let mut sorted: heapless::Vec<NodeId, MAX_NODES> = heapless::Vec::new();
        for pass in [false, true] {
            for &node in order.iter() {
                if self.suspects(node, now) == pass {
                    let _ = sorted.push(node);
                }
            }
        }
        if sorted.len() == order.len() {
            order.copy_from_slice(&sorted);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_late_node_is_ordered_last_until_its_suspicion_expires() {
        let s = Suspicion::new(100);
        let mut order = [NodeId(2), NodeId(0), NodeId(1)];
        s.trusted_first(&mut order, 5);
        assert_eq!(order, [NodeId(2), NodeId(0), NodeId(1)]);
        assert!(s.suspect(NodeId(2), 10));
        assert!(!s.suspect(NodeId(2), 20), "already suspected");
        s.trusted_first(&mut order, 50);
        assert_eq!(order, [NodeId(0), NodeId(1), NodeId(2)]);
        assert!(s.suspects(NodeId(2), 119) && !s.suspects(NodeId(2), 120));
        let mut order = [NodeId(2), NodeId(0), NodeId(1)];
        s.trusted_first(&mut order, 500);
        assert_eq!(order, [NodeId(2), NodeId(0), NodeId(1)], "expired");
        assert!(s.any());
        assert!(s.trust(NodeId(2)) && !s.trust(NodeId(2)));
        assert!(!s.any(), "nothing suspected any more");
        assert!(s.suspect(NodeId(15), 10) && s.suspect(NodeId(3), 10));
        assert!(s.trust(NodeId(15)));
        assert!(s.any(), "node 3 still is");
        assert!(s.trust(NodeId(3)));
        assert!(!s.any());
        assert!(!s.suspect(NodeId(99), 0), "unknown nodes are ignored");
    }
}
