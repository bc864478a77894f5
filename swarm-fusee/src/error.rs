//! What can go wrong in the FUSEE baseline.

use swarm_core::FabricError;

/// Errors of FUSEE operations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FuseeError {
    /// The fabric failed in a way the protocol cannot work around.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The store's parameters do not describe a usable layout.
    #[error("invalid FUSEE parameters: {0}")]
    InvalidParams(String),
    /// A key longer than the store's `key_max`, or empty.
    #[error("a key of {len} bytes does not fit: keys must be 1 to {max} bytes")]
    KeySize {
        /// The key's length.
        len: usize,
        /// The largest key.
        max: u32,
    },
    /// A value longer than the store's `value_max`.
    #[error("a value of {len} bytes does not fit: values are at most {max} bytes")]
    ValueSize {
        /// The value's length.
        len: usize,
        /// The largest value.
        max: u32,
    },
    /// Both candidate buckets of a key are full of other keys.
    #[error("the index has no free slot for this key: create the store with more buckets")]
    IndexFull,
    /// Every coarse block is claimed.
    #[error("the store is out of memory blocks (objects are not recycled): create a larger store")]
    OutOfBlocks,
    /// More clients than the store was created for.
    #[error("all {max} client ids are taken: create the store with more clients")]
    TooManyClients {
        /// The store's client limit.
        max: u16,
    },
    /// An object read from a memory node does not validate.
    #[error("the object at {addr:#x} is corrupted ({why})")]
    CorruptObject {
        /// The object's address.
        addr: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An index slot points outside the object area.
    #[error("index slot at {slot:#x} holds {word:#x}, which is not an object address")]
    CorruptSlot {
        /// The slot's address.
        slot: u64,
        /// Its content.
        word: u64,
    },
    /// Memory nodes did not answer a recovery read (bit `i`: node `i`); run the
    /// recovery again once the master removed them.
    #[error("memory nodes {mask:#b} did not answer during recovery: retry it")]
    NodesUnreachable {
        /// The nodes, as a bit mask.
        mask: u16,
    },
    /// Every memory node was declared failed.
    #[error("no memory node is left alive in the configuration")]
    NoLiveNodes,
}
