//! The cluster configuration: which memory-node incarnations are members, at which
//! epoch (issue 12, items 1 and 2).
//!
//! **Why.** A memory node whose memory was lost and re-created — a node file
//! recreated, an RDMA memory node restarted, a node replaced — must never be read as a
//! replica: its registers and index buckets would count towards quorums that miss
//! acknowledged writes (a write on `{A, X}`, `X` recreated, a read on `{B, X}` misses
//! it). An empty node is caught by its missing superblock (`crate::store`), but a node
//! whose first pages were copied from another (a half-finished repair, an operator's
//! `cp`) is not. So every node's memory carries a random *incarnation*
//! (`swarm_core::header`, drawn when the memory is created; RDMA memory nodes carry
//! theirs in the bootstrap), and the configuration lists, per node slot, the
//! incarnation that is a member. A node whose incarnation is not the one listed is
//! left out exactly like a crashed node.
//!
//! **Where.** In the superblock area of every node, at [`CONFIG_AT`], after the
//! parameters: `[magic "SWARMCFG" | version u32 | node count u16 | repairing u16 |
//! epoch u64 | incarnation u64 × node count | xxh3-64 of the preceding bytes]`.
//! Written on every node when the store is created or formatted. `repairing` has bit
//! `i` set while a repair of node `i` is under way ([`Configuration::repairing`]);
//! builds before it wrote 0 there and ignore it. A cluster of more than 16 nodes
//! writes format version 2: `[magic | version u32 | node count u16 | 0 u16 | epoch
//! u64 | repairing u64 | incarnation u64 × node count | xxh3-64]` (64 repairing
//! bits), on its metadata group only (`crate::layout::ClusterParams::metadata_nodes`);
//! clusters of up to 16 nodes keep version 1.
//!
//! **Which copy wins.** Opening reads the record from every node that answers (at
//! least a majority) and adopts the valid copy (checksum, node count) with the highest
//! epoch. A configuration change that admits a node (a repair: a rebuilt node rejoins
//! with its new incarnation) must write the new record to a majority of the members
//! *after* the rebuild is complete, and to the rejoining node last. Then any copy
//! that lists the new incarnation proves the rebuild finished, so a client that
//! adopts it may read the node; a client that still reads an older record treats the
//! node as failed, which is safe (its quorums are majorities of the same replica
//! sets, just without that node). A reader always reads a majority, so once the
//! record is on a majority every new opener sees it. (A repair changes the
//! configuration twice: `e + 1` announces it, same members, and `e + 2` admits the
//! node; `crate::repair`.) Writes that race the rebuild are the repair's
//! argument to make, not this record's. Records are plain writes, bigger than a
//! CAS: only the repair that holds the repair lock ([`REPAIR_LOCK_AT`],
//! `crate::repair::lock`) writes them, so a stopped repair's late record never
//! replaces a later repair's.
//!
//! **Older clusters.** A store created before configurations existed has no record:
//! it opens as epoch 0 ([`Configuration::legacy`]), which admits every incarnation
//! (RDMA memory nodes of such a store have incarnations no record lists); only the
//! superblock check protects it. Every store created or formatted by this build starts
//! at epoch 1.

use swarm_core::{MAX_CLUSTER_NODES, MAX_NODES};
use xxhash_rust::xxh3::xxh3_64;

use crate::layout::{SUPERBLOCK_AT, SUPERBLOCK_BYTES};

/// Offset of the configuration record (inside the superblock area).
pub const CONFIG_AT: u64 = SUPERBLOCK_AT + 1024;
/// Offset of the repair lock word (inside the superblock area, after the
/// configuration record): 0, or the token of the repair that may write configuration
/// records (`crate::repair::lock`). Only a repair's donors' copies are used.
pub const REPAIR_LOCK_AT: u64 = SUPERBLOCK_AT + 2048;
/// Magic bytes of the configuration record.
pub const CONFIG_MAGIC: [u8; 8] = *b"SWARMCFG";
/// Configuration record format version (clusters of up to [`MAX_NODES`] nodes).
pub const CONFIG_VERSION: u32 = 1;
/// Configuration record format version of clusters of more than [`MAX_NODES`]
/// nodes: a 64-bit `repairing` word.
pub const CONFIG_VERSION_WIDE: u32 = 2;
/// Bytes read for a configuration record (room for [`MAX_CLUSTER_NODES`] nodes).
pub const CONFIG_READ_BYTES: usize = 32 + 8 * MAX_CLUSTER_NODES + 8;

// `repairing` has a bit per node: 16 in version 1, 64 in version 2.
const _: () = assert!(MAX_NODES <= 16 && MAX_CLUSTER_NODES <= 64);
const _: () = assert!(CONFIG_AT + CONFIG_READ_BYTES as u64 <= SUPERBLOCK_AT + SUPERBLOCK_BYTES);
const _: () = assert!(CONFIG_AT + CONFIG_READ_BYTES as u64 <= REPAIR_LOCK_AT);
const _: () = assert!(REPAIR_LOCK_AT + 8 <= SUPERBLOCK_AT + SUPERBLOCK_BYTES);

/// Which node incarnations are members of the cluster, at which epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configuration {
    /// Bumped by every configuration change; the highest valid copy wins.
    pub epoch: u64,
    /// Per node slot, the incarnation that is a member (0: a node of an older build).
    pub incarnations: Vec<u64>,
    /// Bit `i`: a repair of node `i` announced itself and has not admitted the node
    /// yet (`crate::repair`). While it is set, no client may leave node `i`'s lost
    /// memory out of a register reset (`crate::registers::recycle`, "a node out of service").
    pub repairing: u64,
}

/// Why a configuration record was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No record (a store created by an older build, or a node with empty memory).
    #[error("no configuration record")]
    Missing,
    /// The record's checksum, version or node count is wrong.
    #[error("the configuration record is corrupted or of another format: {0}")]
    Corrupted(&'static str),
}

impl Configuration {
    /// The configuration of a store created before configurations existed.
    pub fn legacy(nodes: usize) -> Self {
        Self::new(0, vec![0; nodes])
    }

    /// Epoch `epoch` with these members and no repair under way.
    pub fn new(epoch: u64, incarnations: Vec<u64>) -> Self {
        Self {
            epoch,
            incarnations,
            repairing: 0,
        }
    }

    /// Sets or clears node slot `node`'s repairing bit (see [`Self::repairing`]).
    pub fn set_repairing(&mut self, node: usize, repairing: bool) {
        if node < MAX_CLUSTER_NODES {
            let bit = 1u64 << node;
            self.repairing = if repairing {
                self.repairing | bit
            } else {
                self.repairing & !bit
            };
        }
    }

    /// Whether a repair of node slot `node` is under way (see [`Self::repairing`]).
    pub fn is_repairing(&self, node: usize) -> bool {
        node < MAX_CLUSTER_NODES && self.repairing & (1 << node) != 0
    }

    /// Whether a node in slot `node` with incarnation `incarnation` is a member (any
    /// incarnation of an existing slot is, in a legacy configuration, epoch 0).
    pub fn admits(&self, node: usize, incarnation: u64) -> bool {
        match self.incarnations.get(node) {
            None => false,
            Some(_) if self.epoch == 0 => true,
            Some(member) => *member == incarnation,
        }
    }

    /// Encodes the record (at most [`CONFIG_READ_BYTES`] bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CONFIG_READ_BYTES);
        out.extend_from_slice(&CONFIG_MAGIC);
        let wide = self.incarnations.len() > MAX_NODES;
        if wide {
            out.extend_from_slice(&CONFIG_VERSION_WIDE.to_le_bytes());
            out.extend_from_slice(&(self.incarnations.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&self.epoch.to_le_bytes());
            out.extend_from_slice(&self.repairing.to_le_bytes());
        } else {
            out.extend_from_slice(&CONFIG_VERSION.to_le_bytes());
            out.extend_from_slice(&(self.incarnations.len() as u16).to_le_bytes());
            out.extend_from_slice(&(self.repairing as u16).to_le_bytes());
            out.extend_from_slice(&self.epoch.to_le_bytes());
        }
        for i in &self.incarnations {
            out.extend_from_slice(&i.to_le_bytes());
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes a record read from untrusted memory. Its node count is its own: a
    /// record may list more nodes than the reader has mapped (nodes added since it
    /// opened the cluster, which it admits on following it) or fewer (a node file
    /// of an add-node that never published its configuration: not a member).
    pub fn decode(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.get(..8).is_none_or(|m| m.iter().all(|b| *b == 0)) {
            return Err(ConfigError::Missing);
        }
        if bytes[..8] != CONFIG_MAGIC {
            return Err(ConfigError::Corrupted("bad magic bytes"));
        }
        let word = |at: usize| -> Result<u64, ConfigError> {
            let b = bytes
                .get(at..at + 8)
                .ok_or(ConfigError::Corrupted("truncated"))?;
            Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        };
        let head = word(8)?;
        let version = head as u32;
        let nodes = usize::from((head >> 32) as u16);
        if nodes == 0 || nodes > MAX_CLUSTER_NODES {
            return Err(ConfigError::Corrupted("no node count a cluster can have"));
        }
        // Version 1 up to 16 nodes, version 2 beyond: one encoding per node count.
        let wide = nodes > MAX_NODES;
        match (version, wide) {
            (CONFIG_VERSION, false) | (CONFIG_VERSION_WIDE, true) => {}
            _ => return Err(ConfigError::Corrupted("unknown version")),
        }
        let first = if wide { 32 } else { 24 };
        let end = first + 8 * nodes;
        if word(end)?
            != xxh3_64(
                bytes
                    .get(..end)
                    .ok_or(ConfigError::Corrupted("truncated"))?,
            )
        {
            return Err(ConfigError::Corrupted("checksum mismatch"));
        }
        let incarnations = (0..nodes)
            .map(|i| word(first + 8 * i))
            .collect::<Result<_, _>>()?;
        let repairing = if wide {
            word(24)?
        } else {
            u64::from((head >> 48) as u16)
        };
        Ok(Self {
            epoch: word(16)?,
            incarnations,
            repairing,
        })
    }

    /// The copy that wins among the records read from the nodes that answered: the
    /// valid one with the highest epoch; [`Configuration::legacy`] if no node holds one.
    pub fn newest<'a>(
        copies: impl IntoIterator<Item = &'a Result<Self, ConfigError>>,
        nodes: usize,
    ) -> Self {
        copies
            .into_iter()
            .filter_map(|c| c.as_ref().ok())
            .max_by_key(|c| c.epoch)
            .cloned()
            .unwrap_or_else(|| Self::legacy(nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrips_and_refuses_corruption_and_the_highest_epoch_wins() {
        let c = Configuration::new(3, vec![11, 22, 33]);
        let mut announced = Configuration::new(4, vec![11, 22, 33]);
        announced.set_repairing(2, true);
        assert_eq!(announced.repairing, 0b100);
        assert_eq!(
            Configuration::decode(&announced.encode()),
            Ok(announced.clone())
        );
        assert!(announced.is_repairing(2) && !announced.is_repairing(1) && !c.is_repairing(2));
        assert!(!announced.is_repairing(40));
        let mut cleared = announced.clone();
        cleared.set_repairing(2, false);
        cleared.set_repairing(70, true);
        assert_eq!(
            cleared.repairing, 0,
            "cleared, and no bit for a slot that cannot exist"
        );
        let bytes = c.encode();
        assert_eq!(Configuration::decode(&bytes), Ok(c.clone()));
        assert_eq!(
            Configuration::decode(&[0; CONFIG_READ_BYTES]),
            Err(ConfigError::Missing)
        );
        // A record listing more or fewer nodes than the reader maps is still read.
        let grown = Configuration::new(5, vec![11, 22, 33, 44]);
        assert_eq!(Configuration::decode(&grown.encode()), Ok(grown.clone()));
        let mut no_nodes = bytes.clone();
        no_nodes[12..14].copy_from_slice(&0u16.to_le_bytes());
        assert!(matches!(
            Configuration::decode(&no_nodes),
            Err(ConfigError::Corrupted(_))
        ));
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert!(matches!(
            Configuration::decode(&bad),
            Err(ConfigError::Corrupted(_))
        ));
        assert!(
            Configuration::legacy(3).admits(2, 99),
            "a legacy store checks no incarnation"
        );
        let newer = Configuration::new(4, vec![11, 44, 33]);
        let copies = [
            Ok(c.clone()),
            Err(ConfigError::Missing),
            Ok(newer.clone()),
            Err(ConfigError::Corrupted("x")),
        ];
        assert_eq!(Configuration::newest(&copies, 3), newer);
        assert_eq!(
            Configuration::newest(&[Err(ConfigError::Missing)], 3),
            Configuration::legacy(3)
        );
        assert!(newer.admits(1, 44) && !newer.admits(1, 22) && !newer.admits(9, 44));
    }

    #[test]
    fn a_cluster_of_more_than_16_nodes_has_64_repairing_bits() {
        let mut c = Configuration::new(7, (0..32).map(|i| 100 + i).collect());
        c.set_repairing(31, true);
        c.set_repairing(17, true);
        assert!(c.is_repairing(31) && c.is_repairing(17) && !c.is_repairing(16));
        let bytes = c.encode();
        assert!(bytes.len() <= CONFIG_READ_BYTES);
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            CONFIG_VERSION_WIDE
        );
        assert_eq!(Configuration::decode(&bytes), Ok(c.clone()));
        // The version goes with the node count: version 1 with 32 nodes is refused.
        let mut narrow = bytes.clone();
        narrow[8..12].copy_from_slice(&CONFIG_VERSION.to_le_bytes());
        assert!(matches!(
            Configuration::decode(&narrow),
            Err(ConfigError::Corrupted(_))
        ));
        let mut bad = bytes.clone();
        bad[24] ^= 1;
        assert!(matches!(
            Configuration::decode(&bad),
            Err(ConfigError::Corrupted(_))
        ));
        // Up to 16 nodes the record keeps version 1, byte for byte.
        let small = Configuration::new(3, vec![11, 22, 33]);
        assert_eq!(
            u32::from_le_bytes(small.encode()[8..12].try_into().unwrap()),
            CONFIG_VERSION
        );
        assert_eq!(small.encode().len(), 24 + 8 * 3 + 8);
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Configuration::decode(&bytes);
        }

        #[test]
        fn every_record_roundtrips(
            epoch in any::<u64>(),
            incarnations in proptest::collection::vec(any::<u64>(), 1..=MAX_CLUSTER_NODES),
            repairing in any::<u64>(),
        ) {
            // A bit per node slot: 16 in version 1 (up to 16 nodes), 64 in version 2.
            let repairing = if incarnations.len() <= MAX_NODES {
                repairing & 0xFFFF
            } else {
                repairing
            };
            let c = Configuration { epoch, incarnations, repairing };
            prop_assert_eq!(Configuration::decode(&c.encode()), Ok(c.clone()));
        }
    }
}
