//! Errors of protocol operations.

use crate::encoding::EncodingError;
use crate::fabric::{FabricError, NodeId};
use crate::layout::SlotError;

/// Why a SWARM operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SwarmError {
    /// The fabric failed in a way the protocol cannot mask (no majority, bad address).
    #[error(transparent)]
    Fabric(FabricError),
    /// The operation ran longer than `max_op_ns` ([`crate::ProtocolConfig::max_op_ns`])
    /// and stopped so that memory it may still reference can be recycled; retry it.
    #[error(
        "the operation ran longer than max_op_ns and stopped so that memory it may still reference can be recycled; retry it"
    )]
    Fenced,
    /// No out-of-place buffer could be allocated.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// A timestamp or writer id could not be encoded.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
    /// The payload exceeds the cluster's limit.
    #[error("payload of {len} B exceeds the cluster's limit of {max} B")]
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
        /// The limit ([`crate::layout::Layout::payload_max`]).
        max: u32,
    },
    /// A buffer named by a metadata word failed validation on every node that holds
    /// it: memory was corrupted, or the slot was recycled while still in use.
    #[error(
        "the data of write {tsp} on node {node} failed validation: memory is corrupted or was recycled too early"
    )]
    Corrupted {
        /// The last node tried.
        node: NodeId,
        /// The write whose data is unreadable.
        tsp: crate::encoding::Tsp,
    },
    /// The prefix of a fresh register's first write ([`crate::Client::write_fresh`])
    /// is longer than the memory before the register: the caller's layout is wrong.
    #[error(
        "a prefix of {len} B does not fit before the register at {addr:#x}: check the store's layout"
    )]
    PrefixTooLong {
        /// The prefix's length.
        len: usize,
        /// The register's offset on the replica where the prefix does not fit.
        addr: u64,
    },
    /// A Safe-Guess read exceeded its wait-freedom bound of `2·writers + 1`
    /// iterations (appendix C): a protocol bug, never expected.
    #[error(
        "read gave up after {0} iterations: wait-freedom bound exceeded (a bug: please report)"
    )]
    ReadBoundExceeded(u32),
    /// The register was reset for another life since the caller's knowledge of it
    /// was learned ([`crate::RegisterCache`]): nothing was changed in the new life.
    /// The caller looks the register up again (a key-value store: through its index).
    #[error("the register was recycled for another life (found marker {found}): look it up again")]
    Recycled {
        /// The other life's marker.
        found: crate::encoding::Tsp,
    },
}

impl From<super::register::OtherLife> for SwarmError {
    fn from(other: super::register::OtherLife) -> Self {
        Self::Recycled { found: other.found }
    }
}

impl From<FabricError> for SwarmError {
    fn from(error: FabricError) -> Self {
        match error {
            // A fence is the protocol's own decision, not a fabric failure.
            FabricError::Fenced => Self::Fenced,
            other => Self::Fabric(other),
        }
    }
}
