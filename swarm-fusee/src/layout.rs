//! Where everything lives on a memory node (identical on every node).
//!
//! ```text
//! 0            node header (swarm_core::header, written by the cluster)
//! 4096         FUSEE superblock: magic and the parameters below
//! index        buckets x 64 B (RACE hashing, FUSEE §4.2); replica on every node
//! blocks table blocks x 8 B: the client id + 1 that claimed each block (FUSEE §4.4)
//! log heads    max_clients x 8 B: address of each client's first object (§4.5)
//! blocks       blocks x block_bytes: objects of object_bytes each
//! ```
//!
//! On the primary node the index is the *primary* replica, on the others a *backup*
//! (SNAPSHOT, FUSEE §4.3); objects and tables are written to every node.

use swarm_core::header::HEADER_SIZE;

use crate::error::FuseeError;
use crate::object;
use crate::slot::BUCKET_BYTES;

/// Magic of the superblock.
pub const MAGIC: [u8; 8] = *b"FUSEEKV1";
const SUPERBLOCK_BYTES: u64 = 64;

/// The shape of a FUSEE store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseeParams {
    /// Index buckets (8 slots each, two candidates per key).
    pub buckets: u64,
    /// Largest key, bytes.
    pub key_max: u32,
    /// Largest value, bytes.
    pub value_max: u32,
    /// Objects per coarse block.
    pub objects_per_block: u32,
    /// Coarse blocks.
    pub blocks: u64,
    /// Clients that may ever connect.
    pub max_clients: u16,
}

impl FuseeParams {
    /// Parameters for `keys` keys and `writes` object allocations over the store's
    /// life (inserts, updates and deletes: objects are not recycled), with headroom.
    pub fn for_workload(
        keys: u64,
        writes: u64,
        key_max: u32,
        value_max: u32,
        clients: u16,
    ) -> Self {
        // Two candidate buckets of 8 slots each: at a quarter full (2 keys per bucket)
        // a key whose both buckets are full is vanishingly rare; at half full, 100 000
        // keys already met ~30 of them. (RACE adds overflow buckets instead.)
        let buckets = (keys / 2).max(16);
        let objects_per_block = 256;
        let clients = clients.max(1);
        // Each client may hold a current and a reserve block, and leaves a partial one.
        let blocks =
            (keys + writes).div_ceil(u64::from(objects_per_block)) + 3 * u64::from(clients) + 4;
        Self {
            buckets,
            key_max,
            value_max,
            objects_per_block,
            blocks,
            max_clients: clients,
        }
    }
}

/// Addresses derived from [`FuseeParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseeLayout {
    params: FuseeParams,
    object_bytes: u64,
    index_base: u64,
    block_table_base: u64,
    log_heads_base: u64,
    blocks_base: u64,
    end: u64,
}

impl FuseeLayout {
    /// The layout of `params`, or why it is not one.
    pub fn new(params: FuseeParams) -> Result<Self, FuseeError> {
        let invalid = |why: &str| Err(FuseeError::InvalidParams(why.to_string()));
        if params.buckets < 2 {
            return invalid("at least 2 index buckets are needed");
        }
        if params.key_max == 0 || params.key_max > u32::from(u16::MAX) {
            return invalid("key_max must be 1 to 65535 bytes");
        }
        if params.objects_per_block == 0 || params.blocks == 0 || params.max_clients == 0 {
            return invalid("objects_per_block, blocks and max_clients must be positive");
        }
        let object_bytes = object::object_bytes(params.key_max, params.value_max);
        let index_base = HEADER_SIZE + SUPERBLOCK_BYTES;
        let regions = (|| {
            let block_table_base =
                index_base.checked_add(params.buckets.checked_mul(BUCKET_BYTES)?)?;
            let log_heads_base = block_table_base.checked_add(params.blocks.checked_mul(8)?)?;
            let blocks_base = log_heads_base
                .checked_add(u64::from(params.max_clients) * 8)?
                .checked_next_multiple_of(64)?;
            let block_bytes = object_bytes.checked_mul(u64::from(params.objects_per_block))?;
            let end = params
                .blocks
                .checked_mul(block_bytes)?
                .checked_add(blocks_base)
                .filter(|&end| end < (1 << 48))?;
            Some((block_table_base, log_heads_base, blocks_base, end))
        })();
        let Some((block_table_base, log_heads_base, blocks_base, end)) = regions else {
            return invalid("the store does not fit in 2^48 bytes per node");
        };
        Ok(Self {
            params,
            object_bytes,
            index_base,
            block_table_base,
            log_heads_base,
            blocks_base,
            end,
        })
    }

    /// The parameters.
    pub fn params(&self) -> FuseeParams {
        self.params
    }

    /// Bytes each memory node needs.
    pub fn node_bytes(&self) -> u64 {
        self.end
    }

    /// Bytes of one object (header, key, value, checksum, log entry, used word).
    pub fn object_bytes(&self) -> u64 {
        self.object_bytes
    }

    /// Address of bucket `b`.
    pub fn bucket(&self, b: u64) -> u64 {
        self.index_base + b * BUCKET_BYTES
    }

    /// The whole index: base and length.
    pub fn index(&self) -> (u64, u64) {
        (self.index_base, self.params.buckets * BUCKET_BYTES)
    }

    /// Whether `addr` is a slot of the index.
    pub fn is_slot(&self, addr: u64) -> bool {
        addr >= self.index_base && addr < self.block_table_base && addr.is_multiple_of(8)
    }

    /// Address of block `b`'s entry in the block table.
    pub fn block_entry(&self, b: u64) -> u64 {
        self.block_table_base + b * 8
    }

    /// Address of client `cid`'s log head.
    pub fn log_head(&self, cid: u16) -> u64 {
        self.log_heads_base + u64::from(cid) * 8
    }

    /// Address of object `o` of block `b`.
    pub fn object(&self, b: u64, o: u32) -> u64 {
        self.blocks_base
            + (b * u64::from(self.params.objects_per_block) + u64::from(o)) * self.object_bytes
    }

    /// Whether `addr` is the start of an object.
    pub fn is_object(&self, addr: u64) -> bool {
        addr >= self.blocks_base
            && addr < self.end
            && (addr - self.blocks_base).is_multiple_of(self.object_bytes)
    }

    /// The superblock's bytes and address.
    pub fn superblock(&self) -> (u64, Vec<u8>) {
        let p = &self.params;
        let mut b = Vec::with_capacity(SUPERBLOCK_BYTES as usize);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&p.buckets.to_le_bytes());
        b.extend_from_slice(&p.key_max.to_le_bytes());
        b.extend_from_slice(&p.value_max.to_le_bytes());
        b.extend_from_slice(&u64::from(p.objects_per_block).to_le_bytes());
        b.extend_from_slice(&p.blocks.to_le_bytes());
        b.extend_from_slice(&u64::from(p.max_clients).to_le_bytes());
        b.resize(SUPERBLOCK_BYTES as usize, 0);
        (HEADER_SIZE, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_objects_are_aligned() {
        let params = FuseeParams::for_workload(1000, 5000, 24, 64, 4);
        let l = FuseeLayout::new(params).expect("valid");
        let (index, len) = l.index();
        assert!(index >= HEADER_SIZE + SUPERBLOCK_BYTES);
        assert!(l.block_entry(0) >= index + len);
        assert!(l.log_head(0) >= l.block_entry(params.blocks - 1) + 8);
        assert!(l.object(0, 0) >= l.log_head(params.max_clients - 1) + 8);
        assert_eq!(l.object(0, 0) % 64, 0);
        assert_eq!(l.object_bytes() % 8, 0);
        let last = l.object(params.blocks - 1, params.objects_per_block - 1);
        assert_eq!(last + l.object_bytes(), l.node_bytes());
        assert!(l.is_object(last) && !l.is_object(last + 8));
    }

    #[test]
    fn nonsense_parameters_are_refused() {
        let mut p = FuseeParams::for_workload(10, 10, 24, 64, 1);
        p.buckets = 1;
        assert!(FuseeLayout::new(p).is_err());
        let mut p = FuseeParams::for_workload(10, 10, 24, 64, 1);
        p.blocks = u64::MAX / 2;
        assert!(FuseeLayout::new(p).is_err());
    }
}
