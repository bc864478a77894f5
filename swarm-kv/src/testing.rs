//! Internals that swarm-kv's own integration tests (`swarm-kv/tests/`) drive
//! directly: the replicated index on its own, the configuration record, a repair
//! run step by step on a simulated fabric, a writer id registered for a foreign
//! process, and the on-memory offsets the tests corrupt on purpose. Hidden from the
//! docs and not part of the API: anything here may change with any release. Tools
//! use [`crate::admin`].

use swarm_core::Fabric;

use crate::KvError;
use crate::admin::{NodeLayout, OwnerLiveness};

pub use crate::client::register_loc_for;
pub use crate::configuration::{CONFIG_AT, Configuration};
pub use crate::layout::{BUCKET_BYTES, SUPERBLOCK_AT, SUPERBLOCK_BYTES, encode_key_header};
pub use crate::registers::journal::ROW_BYTES as JOURNAL_ROW_BYTES;

/// The repair journal's entries and node (`tests/soak_regressions.rs`).
pub mod journal {
    pub use crate::registers::journal::{entry, journal_node};
}
pub use crate::repair::repair_node;
pub use crate::store::{read_configuration, write_configuration};

/// The replicated index on its own (`tests/index_mem.rs`, `tests/index_sim.rs`).
pub mod index {
    pub use crate::index::word::{Ballot, Meta, Proposal};
    pub use crate::index::{HEADER_REREADS, Index, InsertOutcome, MappingTag, SLOTS, Withdrawal};
}

/// Placement records, written as the coming add-node and rebalance will
/// (`tests/placed_chunks.rs`).
pub mod placement {
    pub use crate::placement::{PlacementRecord, Spot, write_record};
}

/// Process identities as writer-id rows record them (`tests/owner_process.rs`).
pub mod owner_process {
    pub use crate::membership::owner_process::{alive, identity, identity_of, this_process};
}

/// Registers a writer id on a cluster of `nodes` nodes for the incarnation `token`
/// of the process `owner` (an [`owner_process`] identity), as that process's client
/// would, and returns the id; nothing renews its lease afterwards (a stopped owner).
pub async fn register_writer<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    owner: u64,
    owners: OwnerLiveness,
) -> Result<u16, KvError> {
    let (registration, _lease) = crate::membership::writer_ids::register(
        fabric,
        layout,
        layout.metadata_nodes(nodes),
        token,
        owner,
        owners,
        0,
    )
    .await?;
    Ok(registration.writer)
}
