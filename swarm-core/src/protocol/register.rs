//! A replicated register as a client sees it: where its replicas are, and what the
//! client already knows about them.

use alloc::boxed::Box;

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

    /// Every preference position, `0..n`, in order: the candidates of a step that
    /// may ask any replica. A slice of a constant, so that the hot steps (every
    /// read's) build no list of their own.
    pub fn positions(&self) -> &'static [usize] {
        const ALL: [usize; MAX_REPLICAS] = {
            let mut all = [0; MAX_REPLICAS];
            let mut p = 0;
            while p < MAX_REPLICAS {
                all[p] = p;
                p += 1;
            }
            all
        };
        &ALL[..self.nodes.len()]
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

/// Where a register lives: its identity, its replicas, and its offset on each.
///
/// The *identity* ([`RegisterLoc::id`]) names the register in everything that
/// outlives one access: log records' owner tags, the slot trackers, the list of
/// registers a client is writing. An *offset* ([`RegisterLoc::offset`]) is where the
/// register (in-place block, then metadata words, then delete word) starts on one
/// replica, and every batch to that replica uses it. The two are separate so that a
/// register's replicas can sit at different offsets on different nodes (a chunk
/// placed, moved or grown per node: ARCHITECTURE.md, "Per-replica placement") while
/// its name stays the same. A store that places every replica at one address uses
/// that address as the identity too ([`RegisterLoc::at`]), so the owner tags of its
/// records are the addresses they always were.
///
/// The identity must be a multiple of 8 below 32 GiB for a log record to name it
/// (otherwise records carry the unknown owner tag, as
/// [`crate::Layout`]'s record format says); a client's locator maps it back to the
/// location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterLoc {
    /// The register's identity: its name in log records, slot trackers and write
    /// guards. Not an address on any node unless the store makes it one.
    pub id: u64,
    /// Its replicas, in preference order. The offsets are kept per preference
    /// position: build a new location (never edit this field) to change the replicas.
    pub replicas: Replicas,
    offsets: Offsets,
}

/// A register's offset on each replica: one for all of them (no allocation; the
/// common case, kept as small as it was), or one per preference position.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Offsets {
    Same(u64),
    PerReplica(Box<[u64; MAX_REPLICAS]>),
}

impl RegisterLoc {
    /// A register at offset `addr` on every replica, named by that address.
    pub fn at(addr: u64, replicas: Replicas) -> Self {
        Self {
            id: addr,
            replicas,
            offsets: Offsets::Same(addr),
        }
    }

    /// A register named `id` whose replica on node `n` starts at the offset paired with
    /// `n` in `offsets` (any order). Fails with
    /// [`FabricError::UnplacedReplica`] if a replica has no offset or an offset names
    /// a node that is not a replica, or with [`FabricError::Misaligned`] if an offset
    /// is not a multiple of 8 (its metadata words are CAS targets).
    pub fn placed(
        id: u64,
        replicas: Replicas,
        offsets: &[(NodeId, u64)],
    ) -> Result<Self, FabricError> {
        let mut by_position = Box::new([0u64; MAX_REPLICAS]);
        for (p, node) in replicas.nodes().iter().enumerate() {
            let Some(&(_, at)) = offsets.iter().find(|(n, _)| n == node) else {
                return Err(FabricError::UnplacedReplica { node: *node });
            };
            if !at.is_multiple_of(8) {
                return Err(FabricError::Misaligned {
                    node: *node,
                    addr: at,
                });
            }
            by_position[p] = at;
        }
        if let Some(&(node, _)) = offsets
            .iter()
            .find(|(n, _)| replicas.position(*n).is_none())
        {
            return Err(FabricError::UnplacedReplica { node });
        }
        Ok(Self {
            id,
            replicas,
            offsets: Offsets::PerReplica(by_position),
        })
    }

    /// The register's offset on the replica at preference position `p` (0 is the
    /// primary): where every batch to that replica reads, writes and CASes it.
    #[inline]
    pub fn offset(&self, p: usize) -> u64 {
        match &self.offsets {
            Offsets::Same(addr) => *addr,
            // Positions come from `replicas`, built together with the offsets, so `p`
            // is below MAX_REPLICAS; a wrong one reads slot 0's offset, never panics.
            Offsets::PerReplica(at) => at.get(p).copied().unwrap_or(at[0]),
        }
    }

    /// The register's offset on `node`, if `node` is one of its replicas.
    pub fn offset_on(&self, node: NodeId) -> Option<u64> {
        self.replicas.position(node).map(|p| self.offset(p))
    }

    /// The offset shared by every replica, if the register has one (built by
    /// [`RegisterLoc::at`]).
    pub fn same_offset(&self) -> Option<u64> {
        match self.offsets {
            Offsets::Same(addr) => Some(addr),
            Offsets::PerReplica(_) => None,
        }
    }
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
///
/// * `life` is the register's *life marker*, once known: the word a reset left in
///   every metadata word and delete word of every replica ([`Tsp::reset_marker`]),
///   or ⊥ for memory never reset. A replica's delete word holds the marker of the
///   current life until a tombstone replaces it, so a delete word read or CASed that
///   holds another marker proves the register was recycled since this knowledge was
///   learned: the operation stops with [`super::SwarmError::Recycled`] instead of
///   acting on another life (`swarm-kv`'s recycling, "a reset is a write").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterCache {
    pub(crate) known_max: ReplicaWords,
    pub(crate) own_word: ReplicaWords,
    life: Tsp,
}

/// [`RegisterCache::life`] not known yet: a tombstone, which no life marker is.
const UNKNOWN_LIFE: Tsp = Tsp::from_word(u64::MAX);

impl Default for RegisterCache {
    fn default() -> Self {
        Self {
            known_max: ReplicaWords::default(),
            own_word: ReplicaWords::default(),
            life: UNKNOWN_LIFE,
        }
    }
}

/// A delete word or CAS answer showed another life's marker than the one known: the
/// register was reset for another life since (see [`RegisterCache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OtherLife {
    /// The marker found.
    pub found: Tsp,
}

/// Replica positions whose words a [`RegisterCache`] keeps inline.
const INLINE_REPLICAS: usize = 4;

/// One word per replica position, as [`RegisterCache`] keeps them: the first
/// [`INLINE_REPLICAS`] inline, all [`MAX_REPLICAS`] on the heap once a later position
/// holds a word. A store caches this for every key it knows and copies it on every
/// cache hit, so the common 3-replica case must stay small (40 bytes, not 120).
#[derive(Debug)]
pub(crate) enum ReplicaWords {
    Inline([Tsp; INLINE_REPLICAS]),
    Heap(Box<[Tsp; MAX_REPLICAS]>),
}

impl Clone for ReplicaWords {
    /// A copy of the inline words, inlined into its caller (a cached get clones its
    /// entry's knowledge on every hit); the heap's, out of line.
    #[inline]
    fn clone(&self) -> Self {
        match self {
            Self::Inline(words) => Self::Inline(*words),
            Self::Heap(words) => Self::clone_heap(words),
        }
    }
}

impl ReplicaWords {
    #[cold]
    #[inline(never)]
    fn clone_heap(words: &[Tsp; MAX_REPLICAS]) -> Self {
        Self::Heap(Box::new(*words))
    }
}

impl Default for ReplicaWords {
    fn default() -> Self {
        Self::Inline([Tsp::EMPTY; INLINE_REPLICAS])
    }
}

impl ReplicaWords {
    /// The word of position `p` (empty if none was set).
    #[inline]
    pub(crate) fn get(&self, p: usize) -> Tsp {
        let words: &[Tsp] = match self {
            Self::Inline(words) => words,
            Self::Heap(words) => &words[..],
        };
        words.get(p).copied().unwrap_or(Tsp::EMPTY)
    }

    /// Sets the word of position `p` (ignored beyond [`MAX_REPLICAS`]).
    #[inline]
    pub(crate) fn set(&mut self, p: usize, word: Tsp) {
        match self {
            Self::Inline(words) if p < INLINE_REPLICAS => words[p] = word,
            Self::Inline(_) if word.is_empty() || p >= MAX_REPLICAS => {}
            Self::Inline(words) => {
                let mut all = Box::new([Tsp::EMPTY; MAX_REPLICAS]);
                all[..INLINE_REPLICAS].copy_from_slice(words);
                all[p] = word;
                *self = Self::Heap(all);
            }
            Self::Heap(words) => {
                if let Some(slot) = words.get_mut(p) {
                    *slot = word;
                }
            }
        }
    }

    /// The positions that may hold a word: every one set so far and maybe more.
    fn len(&self) -> usize {
        match self {
            Self::Inline(_) => INLINE_REPLICAS,
            Self::Heap(_) => MAX_REPLICAS,
        }
    }
}

impl PartialEq for ReplicaWords {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // The common case, compared at once (a store compares caches on every hit).
            (Self::Inline(a), Self::Inline(b)) => a == b,
            _ => (0..MAX_REPLICAS).all(|p| self.get(p) == other.get(p)),
        }
    }
}

impl Eq for ReplicaWords {}

impl RegisterCache {
    /// Knowledge of a register not read yet (its life unknown).
    pub fn new() -> Self {
        Self::default()
    }

    /// Knowledge of a register that a reset left with `marker` in every word of its
    /// first `n` replicas ([`Tsp::reset_marker`]; ⊥ for memory never written): what
    /// an insert into a pre-cleared register starts from.
    pub fn after_reset(marker: Tsp, n: usize) -> Self {
        let mut cache = Self::default();
        for p in 0..n.min(MAX_REPLICAS) {
            cache.known_max.set(p, marker);
            cache.own_word.set(p, marker);
        }
        cache.life = marker;
        cache
    }

    /// The register's life marker, if known (see the type's docs).
    pub fn life(&self) -> Option<Tsp> {
        (self.life != UNKNOWN_LIFE).then_some(self.life)
    }

    /// The word a delete word holds in the known life before any tombstone: what a
    /// tombstone CAS expects. ⊥ while the life is unknown, which can only match memory
    /// never reset (a reset never writes ⊥).
    pub(crate) fn untombstoned(&self) -> Tsp {
        self.life().unwrap_or(Tsp::EMPTY)
    }

    /// Takes in a delete word's content (read, or returned by a CAS): a tombstone says
    /// nothing of the life; any other word is the life's marker, which must be the
    /// known one if any. Fails if it is another life's.
    pub(crate) fn learn_life(&mut self, delete_word: Tsp) -> Result<(), OtherLife> {
        if delete_word.is_tombstone() {
            return Ok(());
        }
        match self.life() {
            None => {
                self.life = delete_word;
                Ok(())
            }
            Some(life) if life == delete_word => Ok(()),
            Some(_) => Err(OtherLife { found: delete_word }),
        }
    }

    /// Takes in a metadata word's content returned by a CAS: a reset's marker there
    /// must be the known life's (the words of one life are its marker or writes above
    /// it). Fails if it is another life's.
    pub(crate) fn check_marker(&self, word: Tsp) -> Result<(), OtherLife> {
        match self.life() {
            Some(life) if word.is_reset() && word != life => Err(OtherLife { found: word }),
            _ => Ok(()),
        }
    }

    /// The largest tuple known on replica `p`.
    pub fn known_max(&self, p: usize) -> Tsp {
        self.known_max.get(p)
    }

    /// Knowledge that a RAW (unreplicated, in-place) write stored a value: RAW keeps no
    /// metadata words, so this only records that the register is not empty.
    pub fn holding_raw_value() -> Self {
        let mut cache = Self::default();
        cache.known_max.set(0, Tsp::from_word(1 << 12));
        cache
    }

    /// Whether some replica is known to hold a write (or a tombstone): the register is
    /// not empty, and never will be again.
    pub fn knows_a_write(&self) -> bool {
        (0..self.known_max.len()).any(|p| !self.known_max.get(p).is_void())
    }

    /// Merges what another copy of this knowledge learned (two operations on the
    /// same register ran concurrently): words only grow, so the larger value wins.
    pub fn merge(&mut self, other: &Self) {
        let n = self.known_max.len().max(other.known_max.len());
        for p in 0..n {
            let known = self.known_max.get(p).max(other.known_max.get(p));
            self.known_max.set(p, known);
        }
        let n = self.own_word.len().max(other.own_word.len());
        for p in 0..n {
            let own = self.own_word.get(p).max(other.own_word.get(p));
            self.own_word.set(p, own);
        }
        // Two lives: the later one (markers only grow from life to life).
        match (self.life(), other.life()) {
            (None, Some(life)) => self.life = life,
            (Some(mine), Some(theirs)) if theirs > mine => self.life = theirs,
            _ => {}
        }
    }

    #[inline]
    pub(crate) fn learn(&mut self, p: usize, tsp: Tsp) {
        if tsp > self.known_max.get(p) {
            self.known_max.set(p, tsp);
        }
    }

    /// How many of the first `n` replicas are known to hold `tsp` or more.
    pub(crate) fn holding(&self, n: usize, tsp: Tsp) -> usize {
        (0..n).filter(|&p| self.known_max.get(p) >= tsp).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_words_stay_inline_for_small_registers_and_grow_for_large_ones() {
        let t = |w: u64| Tsp::from_word(w << 12);
        let mut a = RegisterCache::new();
        assert!(!a.knows_a_write());
        a.learn(2, t(5));
        a.own_word.set(1, t(3));
        assert!(matches!(a.known_max, ReplicaWords::Inline(_)));
        assert_eq!(
            (a.known_max(2), a.known_max(9), a.own_word.get(1)),
            (t(5), Tsp::EMPTY, t(3))
        );
        // An empty word beyond the inline ones needs no heap.
        a.known_max.set(9, Tsp::EMPTY);
        assert!(matches!(a.known_max, ReplicaWords::Inline(_)));
        let mut b = a.clone();
        b.learn(9, t(7));
        assert!(matches!(b.known_max, ReplicaWords::Heap(_)));
        assert_eq!((b.known_max(2), b.known_max(9)), (t(5), t(7)));
        assert_eq!(b.holding(10, t(5)), 2);
        // Equality and merging do not depend on where the words are kept.
        let mut c = a.clone();
        c.known_max.set(9, t(7));
        assert_eq!(b, c);
        assert_ne!(a, c, "a heap word beyond the inline ones differs from none");
        let mut d = a.clone();
        assert_eq!(a, d);
        d.own_word.set(2, t(4));
        assert_ne!(a, d, "inline words differ");
        let mut e = RegisterCache::new();
        e.known_max.set(9, t(7));
        e.known_max.set(9, Tsp::EMPTY);
        assert!(matches!(e.known_max, ReplicaWords::Heap(_)));
        assert_eq!(e, RegisterCache::new(), "an emptied heap word equals none");
        a.learn(0, t(8));
        a.merge(&b);
        assert_eq!(
            (a.known_max(0), a.known_max(2), a.known_max(9)),
            (t(8), t(5), t(7))
        );
        a.known_max.set(MAX_REPLICAS, t(1));
        assert_eq!(a.known_max(MAX_REPLICAS), Tsp::EMPTY, "no such position");
        assert!(core::mem::size_of::<RegisterCache>() <= 88);
    }

    #[test]
    fn a_life_marker_is_learned_once_and_another_one_is_refused() {
        let m1 = Tsp::reset_marker(10).unwrap();
        let m2 = Tsp::reset_marker(20).unwrap();
        let tomb = Tsp::new(
            crate::encoding::Timestamp::tombstone(crate::encoding::WriterId::FIRST),
            crate::encoding::Flag::Verified,
        );
        let mut a = RegisterCache::new();
        assert_eq!(a.life(), None);
        assert_eq!(
            a.untombstoned(),
            Tsp::EMPTY,
            "unknown: only never-reset memory matches"
        );
        assert_eq!(
            a.learn_life(tomb),
            Ok(()),
            "a tombstone says nothing of the life"
        );
        assert_eq!(a.life(), None);
        assert_eq!(a.learn_life(m1), Ok(()));
        assert_eq!((a.life(), a.untombstoned()), (Some(m1), m1));
        assert_eq!(a.learn_life(m1), Ok(()));
        assert_eq!(a.learn_life(m2), Err(OtherLife { found: m2 }));
        assert_eq!(a.check_marker(m2), Err(OtherLife { found: m2 }));
        assert_eq!(a.check_marker(m1), Ok(()), "its own life's marker");
        let write = Tsp::from_word(30 << 12);
        assert_eq!(
            a.check_marker(write),
            Ok(()),
            "a write says nothing of the life"
        );
        // After a reset, every position knows the marker and expects it.
        let b = RegisterCache::after_reset(m2, 3);
        assert_eq!(
            (b.life(), b.known_max(2), b.own_word.get(1)),
            (Some(m2), m2, m2)
        );
        assert!(!b.knows_a_write(), "a marker is no value");
        // Merging two lives keeps the later one.
        a.merge(&b);
        assert_eq!(a.life(), Some(m2));
    }

    #[test]
    fn positions_are_every_preference_position_in_order() {
        for n in 1..=MAX_REPLICAS {
            let r = Replicas::all(n, 7).unwrap();
            assert_eq!(r.positions(), (0..n).collect::<alloc::vec::Vec<_>>());
        }
    }

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

    #[test]
    fn a_location_keeps_each_replicas_offset_through_the_rotation() {
        let at = RegisterLoc::at(4096, Replicas::all(3, 4).unwrap());
        assert_eq!((at.id, at.same_offset()), (4096, Some(4096)));
        assert!((0..3).all(|p| at.offset(p) == 4096));
        // Offsets given by node, in any order: each position gets its node's.
        let offsets = [
            (NodeId(2), 3 << 12),
            (NodeId(0), 1 << 12),
            (NodeId(1), 2 << 12),
        ];
        for hash in 0..3 {
            let replicas = Replicas::all(3, hash).unwrap();
            let loc = RegisterLoc::placed(8, replicas.clone(), &offsets).unwrap();
            assert_eq!((loc.id, loc.same_offset()), (8, None));
            for p in 0..3 {
                let node = replicas.node(p);
                assert_eq!(loc.offset(p), u64::from(node.0 + 1) << 12);
                assert_eq!(loc.offset_on(node), Some(loc.offset(p)));
            }
            assert_eq!(loc.offset_on(NodeId(3)), None);
        }
        // A memory-size check: the uniform location is as small as before but for
        // one word and a tag (a store keeps one per cached key).
        assert!(core::mem::size_of::<RegisterLoc>() <= core::mem::size_of::<Replicas>() + 24);
    }

    #[test]
    fn a_placement_without_an_offset_for_each_replica_is_refused() {
        let replicas = Replicas::new(&[NodeId(0), NodeId(1), NodeId(2)], 0).unwrap();
        let some = [(NodeId(0), 64), (NodeId(1), 128)];
        assert_eq!(
            RegisterLoc::placed(64, replicas.clone(), &some),
            Err(FabricError::UnplacedReplica { node: NodeId(2) })
        );
        let extra = [
            (NodeId(0), 64),
            (NodeId(1), 128),
            (NodeId(2), 192),
            (NodeId(5), 8),
        ];
        assert_eq!(
            RegisterLoc::placed(64, replicas.clone(), &extra),
            Err(FabricError::UnplacedReplica { node: NodeId(5) })
        );
        let misaligned = [(NodeId(0), 64), (NodeId(1), 130), (NodeId(2), 192)];
        assert_eq!(
            RegisterLoc::placed(64, replicas, &misaligned),
            Err(FabricError::Misaligned {
                node: NodeId(1),
                addr: 130
            })
        );
    }
}
