//! The memory-node header: the first page of every memory node, on every transport.
//!
//! A memory node is passive memory; the only thing that says what it is and which
//! cluster it belongs to is this header. swarm-shm writes it at the start of each
//! node file and swarm-rdma's daemon at the start of its registered region, and both
//! validate it before use. Memory read from a shared file or a remote node is
//! untrusted, so [`NodeHeader::decode`] checks everything and never panics.
//!
//! Layout (little endian), [`HEADER_SIZE`] bytes reserved:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 8 | magic `b"SWARMMEM"` |
//! | 8  | 4 | format version ([`FORMAT_VERSION`]) |
//! | 12 | 2 | node id |
//! | 14 | 2 | node count |
//! | 16 | 8 | node size in bytes, header included |
//! | 24 | 8 | cluster id (random, identical on every node of a cluster) |
//! | 32 | 8 | cluster epoch: Unix time in ns that timestamp tick 0 stands for |
//! | 40 | 8 | tick length in ns |
//! | 48 | 8 | xxh3-64 of bytes 0..48 |
//! | 56 | .. | zero up to [`INCARNATION_AT`] |
//! | 64 | 8 | node incarnation (random, nonzero; 0 in files of older builds) |
//! | 72 | 8 | xxh3-64 of bytes 64..72 |
//! | 80 | 8 | retired word: 0 while this memory serves; nonzero once it is declared lost ([`RETIRED_AT`]) |
//! | 88 | .. | zero up to [`HEADER_SIZE`] |
//!
//! **Incarnations** (issue 12). The incarnation word is drawn at random when a node's
//! memory is created (a node file, by swarm-shm; RDMA memory nodes carry theirs in the
//! bootstrap instead) and never changes while that memory lives. The store's
//! configuration records the incarnation of every member node; a node whose
//! incarnation differs (a node file recreated, a restored copy of another node) is
//! not a member and is never read as a replica. It is kept outside the checksummed
//! fields above so that the RDMA bootstrap's encoding of [`NodeHeader`] is unchanged
//! and files of older builds (zeros there: incarnation 0, "legacy") still open.

use xxhash_rust::xxh3::xxh3_64;

/// Bytes reserved for the header; node data starts here.
pub const HEADER_SIZE: u64 = 4096;
/// The magic bytes every node starts with.
pub const MAGIC: [u8; 8] = *b"SWARMMEM";
/// The header format this build reads and writes. Version 2 gave every register a
/// delete word after its metadata words ([`crate::layout`]), which moves every
/// register of a node: a node of version 1 is refused, not misread.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes of the encoded header that carry information (the rest is zero).
pub const ENCODED_LEN: usize = 56;

/// Offset of the node incarnation word in the header page (see the module docs).
pub const INCARNATION_AT: usize = 64;
/// Bytes of the encoded incarnation: the word and its checksum.
pub const INCARNATION_LEN: usize = 16;
/// Offset of the *retired* word in the header page: zero while the node's memory
/// serves, nonzero once it has been declared lost (a shared-memory node file that was
/// replaced or crashed on purpose, `swarm-shm`'s `ShmCluster::retire_node`). A
/// transport that maps the memory checks it on every batch and fails the batch as a
/// crashed node's: a process that still maps lost memory must not keep using it as a
/// replica once a repair may be copying the others (issue 12, `swarm_kv::repair`).
pub const RETIRED_AT: usize = 80;

/// Encodes a node incarnation: the caller writes it at [`INCARNATION_AT`].
pub fn encode_incarnation(incarnation: u64) -> [u8; INCARNATION_LEN] {
    let mut out = [0u8; INCARNATION_LEN];
    out[..8].copy_from_slice(&incarnation.to_le_bytes());
    let sum = xxh3_64(&out[..8]);
    out[8..].copy_from_slice(&sum.to_le_bytes());
    out
}

/// Decodes an incarnation read at [`INCARNATION_AT`]: `Ok(0)` for all zeros (a file
/// written before incarnations existed), [`HeaderError::BadChecksum`] if corrupted.
pub fn decode_incarnation(bytes: &[u8]) -> Result<u64, HeaderError> {
    let bytes = bytes
        .get(..INCARNATION_LEN)
        .ok_or(HeaderError::Truncated { len: 0 })?;
    if bytes.iter().all(|b| *b == 0) {
        return Ok(0);
    }
    if le_u64(bytes, 8) != xxh3_64(&bytes[..8]) {
        return Err(HeaderError::BadChecksum);
    }
    Ok(le_u64(bytes, 0))
}

/// Why a header was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer bytes than a header: the node file or region is truncated.
    #[error("memory node is truncated: {len} bytes, a header alone needs {HEADER_SIZE}")]
    Truncated {
        /// Bytes available.
        len: u64,
    },
    /// The magic bytes are wrong: this is not a SWARM memory node.
    #[error("not a SWARM memory node (bad magic bytes)")]
    BadMagic,
    /// Written by another format version.
    #[error(
        "memory node format version {found} is not supported (this build reads {FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The checksum does not match: the header is corrupted.
    #[error("memory node header is corrupted (checksum mismatch)")]
    BadChecksum,
    /// A field is out of range or inconsistent with the others.
    #[error("memory node header is invalid: {0}")]
    Invalid(&'static str),
    /// The nodes given do not form one cluster.
    #[error("memory nodes do not form one cluster: {0}")]
    Mismatch(&'static str),
}

/// The decoded header of one memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHeader {
    /// This node's id, `0..node_count`.
    pub node_id: u16,
    /// Number of memory nodes in the cluster.
    pub node_count: u16,
    /// Size of the node in bytes, header included.
    pub size: u64,
    /// Random id shared by all nodes of one cluster.
    pub cluster_id: u64,
    /// Unix time (ns) of timestamp tick 0.
    pub epoch_unix_ns: u64,
    /// Length of a timestamp tick in ns.
    pub tick_ns: u64,
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

impl NodeHeader {
    /// Encodes the header; the caller writes these bytes at offset 0 and zeroes the
    /// rest of the first [`HEADER_SIZE`] bytes.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..14].copy_from_slice(&self.node_id.to_le_bytes());
        out[14..16].copy_from_slice(&self.node_count.to_le_bytes());
        out[16..24].copy_from_slice(&self.size.to_le_bytes());
        out[24..32].copy_from_slice(&self.cluster_id.to_le_bytes());
        out[32..40].copy_from_slice(&self.epoch_unix_ns.to_le_bytes());
        out[40..48].copy_from_slice(&self.tick_ns.to_le_bytes());
        let checksum = xxh3_64(&out[..48]);
        out[48..56].copy_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Decodes and validates a header from the first bytes of a node whose actual
    /// size is `actual_size` bytes.
    pub fn decode(bytes: &[u8], actual_size: u64) -> Result<Self, HeaderError> {
        if actual_size < HEADER_SIZE || bytes.len() < ENCODED_LEN {
            return Err(HeaderError::Truncated { len: actual_size });
        }
        if bytes[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != FORMAT_VERSION {
            return Err(HeaderError::UnsupportedVersion { found: version });
        }
        if le_u64(bytes, 48) != xxh3_64(&bytes[..48]) {
            return Err(HeaderError::BadChecksum);
        }
        let header = Self {
            node_id: u16::from_le_bytes([bytes[12], bytes[13]]),
            node_count: u16::from_le_bytes([bytes[14], bytes[15]]),
            size: le_u64(bytes, 16),
            cluster_id: le_u64(bytes, 24),
            epoch_unix_ns: le_u64(bytes, 32),
            tick_ns: le_u64(bytes, 40),
        };
        header.validate()?;
        if header.size > actual_size {
            return Err(HeaderError::Truncated { len: actual_size });
        }
        Ok(header)
    }

    /// Checks the fields' ranges (not the checksum).
    pub fn validate(&self) -> Result<(), HeaderError> {
        if self.node_count == 0 {
            return Err(HeaderError::Invalid("node count is zero"));
        }
        if self.node_id >= self.node_count {
            return Err(HeaderError::Invalid("node id is not below the node count"));
        }
        if self.size < HEADER_SIZE {
            return Err(HeaderError::Invalid("node size is smaller than its header"));
        }
        if self.tick_ns == 0 {
            return Err(HeaderError::Invalid("tick length is zero"));
        }
        Ok(())
    }

    /// Checks that `headers` are the nodes `0..n` of one cluster, in order.
    pub fn check_cluster(headers: &[NodeHeader]) -> Result<(), HeaderError> {
        Self::check_nodes(headers.len(), headers.iter().enumerate())
    }

    /// Like [`check_cluster`](Self::check_cluster) for a cluster some of whose nodes
    /// could not be reached: `headers[i]` is node `i`'s header, `None` if unreachable.
    /// The reachable ones must agree and at least one must be reachable.
    pub fn check_reachable(headers: &[Option<NodeHeader>]) -> Result<(), HeaderError> {
        let known = headers
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|h| (i, h)));
        Self::check_nodes(headers.len(), known)
    }

    /// Checks that the `(position, header)` pairs describe nodes of one cluster of
    /// `count` nodes, each at its own position.
    fn check_nodes<'a>(
        count: usize,
        mut headers: impl Iterator<Item = (usize, &'a NodeHeader)>,
    ) -> Result<(), HeaderError> {
        let Some((i, first)) = headers.next() else {
            return Err(HeaderError::Mismatch("no memory node"));
        };
        if usize::from(first.node_count) != count {
            return Err(HeaderError::Mismatch(
                "the number of nodes differs from the node count in their headers",
            ));
        }
        for (i, h) in core::iter::once((i, first)).chain(headers) {
            if usize::from(h.node_id) != i {
                return Err(HeaderError::Mismatch("node ids are not 0..n in order"));
            }
            if h.cluster_id != first.cluster_id {
                return Err(HeaderError::Mismatch("nodes belong to different clusters"));
            }
            if (h.node_count, h.epoch_unix_ns, h.tick_ns)
                != (first.node_count, first.epoch_unix_ns, first.tick_ns)
            {
                return Err(HeaderError::Mismatch(
                    "node headers disagree on cluster parameters",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> NodeHeader {
        NodeHeader {
            node_id: 1,
            node_count: 3,
            size: 1 << 20,
            cluster_id: 0xfeed,
            epoch_unix_ns: 1_700_000_000_000_000_000,
            tick_ns: 1000,
        }
    }

    #[test]
    fn every_corruption_is_refused() {
        let good = sample().encode();
        assert_eq!(NodeHeader::decode(&good, 1 << 20), Ok(sample()));
        assert_eq!(
            NodeHeader::decode(&good[..10], 10),
            Err(HeaderError::Truncated { len: 10 })
        );
        assert_eq!(
            NodeHeader::decode(&good, 1 << 19),
            Err(HeaderError::Truncated { len: 1 << 19 })
        );
        let mut bad = good;
        bad[0] ^= 1;
        assert_eq!(
            NodeHeader::decode(&bad, 1 << 20),
            Err(HeaderError::BadMagic)
        );
        let mut bad = good;
        bad[8] = 9;
        assert_eq!(
            NodeHeader::decode(&bad, 1 << 20),
            Err(HeaderError::UnsupportedVersion { found: 9 })
        );
        let mut bad = good;
        bad[20] ^= 1;
        assert_eq!(
            NodeHeader::decode(&bad, 1 << 20),
            Err(HeaderError::BadChecksum)
        );
    }

    #[test]
    fn cluster_check_catches_mixed_nodes() {
        let mut nodes: [NodeHeader; 3] = core::array::from_fn(|i| NodeHeader {
            node_id: i as u16,
            ..sample()
        });
        assert_eq!(NodeHeader::check_cluster(&nodes), Ok(()));
        nodes[2].cluster_id = 1;
        assert!(NodeHeader::check_cluster(&nodes).is_err());
        assert!(NodeHeader::check_cluster(&nodes[..2]).is_err());
    }

    #[test]
    fn incarnations_roundtrip_old_files_read_as_zero_and_corruption_is_refused() {
        assert_eq!(decode_incarnation(&encode_incarnation(0xabcd)), Ok(0xabcd));
        assert_eq!(decode_incarnation(&[0; INCARNATION_LEN]), Ok(0));
        let mut bad = encode_incarnation(7);
        bad[1] ^= 1;
        assert_eq!(decode_incarnation(&bad), Err(HeaderError::BadChecksum));
        assert!(decode_incarnation(&[1; 3]).is_err());
    }

    proptest! {
        #[test]
        fn roundtrip(id in 0u16..u16::MAX, extra in 1u16..=u16::MAX, size in HEADER_SIZE..u64::MAX,
                     cluster_id: u64, epoch: u64, tick in 1u64..=u64::MAX) {
            let count = id.saturating_add(extra).max(id + 1);
            let h = NodeHeader { node_id: id, node_count: count, size, cluster_id, epoch_unix_ns: epoch, tick_ns: tick };
            prop_assert_eq!(NodeHeader::decode(&h.encode(), size), Ok(h));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80), size: u64) {
            let _ = NodeHeader::decode(&bytes, size);
        }
    }
}
