//! A replicated register as a client sees it: where its replicas are, and what the
//! client already knows about them.

use crate::encoding::Tsp;
use crate::fabric::{FabricError, NodeId};
use crate::roundtrip::MAX_NODES;

/// The most replicas a register can have (`n = 2f + 1 ≤ 15`).
pub const MAX_REPLICAS: usize = 15;

/// The memory nodes holding a register, in preference order.
///
/// SWARM §6: operations first contact a *preferred majority* chosen by hashing the
/// key, so that load spreads over the nodes, and fall back to the other replicas when
/// one of them is slow or dead. The first node in preference order is the register's
/// *primary*, the only replica that keeps in-place data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicas {
    nodes: heapless::Vec<NodeId, MAX_REPLICAS>,
}

impl Replicas {
    /// `nodes` rotated by `key_hash`: the hash picks the primary and the preferred
    /// majority. Fails on zero nodes, duplicates, or more than [`MAX_REPLICAS`].
    pub fn new(nodes: &[NodeId], key_hash: u64) -> Result<Self, FabricError> {
        if nodes.is_empty() {
            return Err(FabricError::NotEnoughLiveNodes { needed: 1, live: 0 });
        }
        if nodes.len() > MAX_REPLICAS.min(MAX_NODES) {
            return Err(FabricError::TooManyReplicas {
                count: nodes.len(),
                max: MAX_REPLICAS.min(MAX_NODES),
            });
        }
        for (i, a) in nodes.iter().enumerate() {
            if nodes[..i].contains(a) {
                return Err(FabricError::DuplicateReplica { node: *a });
            }
        }
        let start = (key_hash % nodes.len() as u64) as usize;
        let mut ordered = heapless::Vec::new();
        for i in 0..nodes.len() {
            // Capacity checked above.
            let _ = ordered.push(nodes[(start + i) % nodes.len()]);
        }
        Ok(Self { nodes: ordered })
    }

    /// All `n` nodes `0..n` of a cluster, rotated by `key_hash`.
    pub fn all(n: usize, key_hash: u64) -> Result<Self, FabricError> {
        if n > MAX_REPLICAS {
            return Err(FabricError::TooManyReplicas {
                count: n,
                max: MAX_REPLICAS,
            });
        }
        let nodes: heapless::Vec<NodeId, MAX_REPLICAS> = (0..n).map(|i| NodeId(i as u16)).collect();
        Self::new(&nodes, key_hash)
    }

    /// Number of replicas `n`.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: a register has at least one replica.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A majority: `⌊n/2⌋ + 1`.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The node at preference position `p` (0 is the primary).
    pub fn node(&self, p: usize) -> NodeId {
        self.nodes[p]
    }

    /// Nodes in preference order.
    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// Preference position of `node`, if it is a replica.
    pub fn position(&self, node: NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| *n == node)
    }
}

/// Where a register lives: the same byte offset on each of its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterLoc {
    /// Offset of the register (in-place block, then metadata) on every replica.
    pub addr: u64,
    /// Its replicas.
    pub replicas: Replicas,
}

/// What a client knows about one register, kept between operations (SWARM-KV keeps
/// it in its client cache).
///
/// * `known_max[p]` is the largest tuple the client *knows* replica `p` holds — the
///   reliable max register's `cache[i]` (appendix A). It is raised only by a
///   completed read or MAX, never optimistically: a write-back is skipped when a
///   majority is known to hold the value, so overestimating would lose writes.
/// * `own_word[p]` is the last value the client saw in its own metadata word on
///   replica `p`: the expected value of its next CAS (§4.4). A wrong guess costs a
///   retry, never safety.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterCache {
    pub(crate) known_max: [Tsp; MAX_REPLICAS],
    pub(crate) own_word: [Tsp; MAX_REPLICAS],
}

impl RegisterCache {
    /// Knowledge of a pre-cleared register: every word empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest tuple known on replica `p`.
    pub fn known_max(&self, p: usize) -> Tsp {
        self.known_max[p]
    }

    /// Knowledge that a RAW (unreplicated, in-place) write stored a value: RAW keeps no
    /// metadata words, so this only records that the register is not empty.
    pub fn holding_raw_value() -> Self {
        let mut cache = Self::default();
        cache.known_max[0] = Tsp::from_word(1 << 12);
        cache
    }

    /// Whether some replica is known to hold a write (or a tombstone): the register is
    /// not empty, and never will be again.
    pub fn knows_a_write(&self) -> bool {
        self.known_max.iter().any(|t| !t.is_empty())
    }

    /// Merges what another copy of this knowledge learned (two operations on the
    /// same register ran concurrently): words only grow, so the larger value wins.
    pub fn merge(&mut self, other: &Self) {
        for p in 0..MAX_REPLICAS {
            self.known_max[p] = self.known_max[p].max(other.known_max[p]);
            self.own_word[p] = self.own_word[p].max(other.own_word[p]);
        }
    }

    pub(crate) fn learn(&mut self, p: usize, tsp: Tsp) {
        if tsp > self.known_max[p] {
            self.known_max[p] = tsp;
        }
    }

    /// How many of the first `n` replicas are known to hold `tsp` or more.
    pub(crate) fn holding(&self, n: usize, tsp: Tsp) -> usize {
        self.known_max[..n].iter().filter(|m| **m >= tsp).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_rotate_by_hash_and_reject_bad_sets() {
        let r = Replicas::all(3, 4).unwrap();
        assert_eq!(r.nodes(), &[NodeId(1), NodeId(2), NodeId(0)]);
        assert_eq!(r.quorum(), 2);
        assert_eq!(Replicas::all(5, 0).unwrap().quorum(), 3);
        assert!(Replicas::new(&[], 0).is_err());
        assert!(Replicas::new(&[NodeId(1), NodeId(1)], 0).is_err());
        assert!(Replicas::all(16, 0).is_err());
        assert_eq!(
            Replicas::new(&[NodeId(0), NodeId(1), NodeId(0)], 0),
            Err(FabricError::DuplicateReplica { node: NodeId(0) })
        );
        assert_eq!(
            Replicas::all(16, 0),
            Err(FabricError::TooManyReplicas {
                count: 16,
                max: MAX_REPLICAS
            })
        );
    }
}
