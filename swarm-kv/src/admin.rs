//! Operating a store: what the `swarm` command and the benchmark harness need beyond
//! an application's API.
//!
//! An application needs none of this: it opens a store and connects clients (the
//! crate root). An operator's tool inspects and mends a running cluster, and a
//! harness or a store over a transport of your own needs the cluster's shape. Each
//! function below that reads the cluster takes a raw fabric handle ([`Store::fabric`](crate::Store::fabric))
//! and the cluster's [`NodeLayout`] ([`Store::layout`](crate::Store::layout)), runs
//! to completion on the calling thread, and holds no writer id: it works on a
//! cluster whose writer ids are all taken.
//!
//! * **Inspecting** (`swarm stat`): [`count_keys`], [`claimed_chunks`], [`census`]
//!   (a [`Census`] of how registers are held: keys, limbos, pools, reclaimable),
//!   [`writer_table`] (a [`WriterRow`] per writer id: owner, pid, lease),
//!   [`takeover_wait_ns`].
//! * **Writer ids** (`swarm evict`): [`evict`] gives back a dead client's id
//!   ([`Eviction`]).
//! * **Index copies** (`swarm scrub`): [`scrub`] moves lagging copies forward
//!   ([`ScrubReport`]).
//! * **Node repair** (`swarm repair`): `ShmStore::repair` / `RdmaStore::repair`
//!   rebuild a lost memory node online, with [`RepairOptions`], reporting a
//!   [`RepairReport`] (with its [`Conflicts`]); [`quiescence_ns`] is what they wait
//!   before copying.
//! * **Adding a node** (`swarm add-node`): `ShmStore::add_node` adds a memory node
//!   online, with [`AddNodeOptions`], reporting an [`AddNodeReport`] (or an
//!   [`AddNodeError`]).
//! * **Formatting** on memory nodes of your own transport: [`write_superblock`],
//!   [`NodeLayout::new`].
//! * **Types the root's API mentions**: the tunables of [`KvConfig`](crate::KvConfig)
//!   ([`IndexConfig`], [`RegisterProtocol`], [`OwnerLiveness`]), a
//!   [`KvClient`](crate::KvClient)'s counters ([`RecycleStats`],
//!   [`DeferredUnmapStats`], [`UndecidedStats`]), and the errors [`KvError`] wraps ([`ParamsError`],
//!   [`IndexError`] with [`BucketError`], [`WordError`] and [`HeaderProblem`],
//!   [`RepairError`]).
//!
//! docs/operations.md says when to use each command; ARCHITECTURE.md maps the
//! mechanisms (leases, limbos, recycling, repair) to the paper.

use swarm_core::{Fabric, NodeId, OpStats, block_on};

use crate::KvError;
use crate::index::Index;
use crate::layout::ClusterParams;
use crate::membership::lease::{self, LeaseParams};

pub use crate::client::{DeferredUnmapStats, RegisterProtocol, UNDECIDED_CAPACITY, UndecidedStats};
pub use crate::index::word::WordError;
pub use crate::index::{BucketError, HeaderProblem, IndexConfig, IndexError, ScrubReport};
pub use crate::layout::{NodeLayout, ParamsError};
pub use crate::membership::owner_process::OwnerLiveness;
pub use crate::membership::writer_ids::{Eviction, Row as WriterRow};
pub use crate::placement::{AddNodeError, AddNodeOptions, AddNodeReport};
pub use crate::registers::limbo::Census;
pub use crate::registers::recycle::RecycleStats;
pub use crate::repair::merge::Conflicts;
pub use crate::repair::{RepairError, RepairOptions, RepairReport, quiescence_ns};
pub use crate::store::write_superblock;

/// The keys the index maps, counted from its buckets as lookups read them (one read of
/// the whole index on every node that answers).
pub fn count_keys<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<u64, KvError> {
    let index = index_of(fabric, layout)?;
    Ok(block_on(fabric, index.count(fabric, &OpStats::new()))?)
}

/// Keys the cluster holds: now (its computed registers, and those of the reserve
/// chunks the configuration a majority of the metadata group holds has recorded)
/// and at most, once grown to `ClusterParams::max_nodes` nodes by `swarm add-node`
/// (`NodeLayout::reserve_chunks`).
pub fn capacity<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<Capacity, KvError> {
    let table = block_on(fabric, async {
        Ok::<_, swarm_core::FabricError>(crate::placement::read_current(fabric, layout).await)
    })??;
    Ok(Capacity {
        now: table.capacity(layout),
        max: layout.capacity_max(),
    })
}

/// Per chunk, the nodes that hold a replica of it under the placement table a
/// majority of the metadata group follows: its record's, else its computed group
/// (every node without replica groups); none for a reserve chunk with no record.
pub fn chunk_holders<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
) -> Result<Vec<Vec<usize>>, KvError> {
    let table = block_on(fabric, crate::placement::read_current(fabric, layout))?;
    let nodes = fabric.node_count();
    Ok((0..layout.chunks())
        .map(|chunk| match table.record(chunk) {
            Some(record) => record
                .replicas
                .iter()
                .map(|spot| usize::from(spot.node))
                .collect(),
            None if layout.is_reserve(chunk) => Vec::new(),
            None => (0..nodes).filter(|&n| layout.chunk_on(chunk, n)).collect(),
        })
        .collect())
}

/// Keys a cluster holds ([`capacity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Keys it holds now.
    pub now: u64,
    /// Keys it holds once grown to `ClusterParams::max_nodes` nodes (`now` if it
    /// has no room to grow).
    pub max: u64,
}

/// How many register chunks clients have claimed so far, from the chunk tables of a
/// majority of nodes (an upper bound: a chunk counts if any node answering shows a
/// claim, so partial claims count too).
pub fn claimed_chunks<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<u64, KvError> {
    block_on(
        fabric,
        crate::registers::alloc::claimed_chunks(fabric, &OpStats::new(), layout),
    )
}

/// How the registers of every claimed chunk are held, by their key headers
/// (read-only; reads every claimed register's header, so it takes a roundtrip per
/// few hundred registers).
pub fn census<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<Census, KvError> {
    let nodes = fabric.node_count();
    let placements = block_on(fabric, crate::placement::read_current(fabric, layout))?;
    block_on(
        fabric,
        crate::registers::limbo::census(fabric, layout, |r| placements.loc(layout, nodes, r).ok()),
    )
}

/// The writer-id table as node `node` holds it: one row per writer id, free or
/// registered (`token != 0`), with its owner's pid and lease.
pub fn writer_table<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    node: NodeId,
) -> Result<Vec<WriterRow>, KvError> {
    Ok(block_on(
        fabric,
        crate::membership::writer_ids::read_table(fabric, layout, node),
    )?)
}

impl WriterRow {
    /// The lease's renewal counter: it moves while the owner is alive.
    pub fn lease_counter(&self) -> u64 {
        lease::counter(self.lease)
    }

    /// Whether the lease was killed (by an eviction with `force`, or a takeover): the
    /// id is reclaimable at once.
    pub fn lease_killed(&self) -> bool {
        lease::is_killed(self.lease)
    }
}

/// How long a client that stops renewing its lease keeps its writer id from a
/// client that needs one, ns: what a takeover and [`evict`] watch the lease for.
pub fn takeover_wait_ns(params: &ClusterParams) -> u64 {
    LeaseParams::from_params(params).observer_wait_ns()
}

/// Gives back the writer id `writer` so that a new client can claim it (the next
/// owner resumes its log like after a clean stop). Watches its lease for
/// [`takeover_wait_ns`] first and fails with [`KvError::LeaseFresh`] if the owner
/// renewed it meanwhile, or with [`KvError::OwnerRunning`] if `owners` is
/// [`OwnerLiveness::ThisHost`] and the owner's process still runs. With `force`, kills
/// the lease at once (a live owner stops at its next operation with
/// [`KvError::LeaseExpired`]) and releases the id after the same wait. Two clients
/// never share an id either way. Pass the store's `config().owners`.
pub fn evict<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    writer: u16,
    force: bool,
    owners: OwnerLiveness,
) -> Result<Eviction, KvError> {
    block_on(
        fabric,
        crate::membership::writer_ids::evict(fabric, layout, writer, force, owners),
    )
}

/// One pass of the index scrub over every bucket: reads each from every node that
/// answers and moves lagging slot copies forward (a scrub never removes a mapping).
pub fn scrub<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<ScrubReport, KvError> {
    let index = index_of(fabric, layout)?;
    let stats = OpStats::new();
    let report = block_on(fabric, async {
        Ok::<_, KvError>(index.scrub(fabric, &stats, 0..u64::MAX).await)
    })??;
    Ok(report)
}

/// The index of the cluster `fabric` reaches, with default tunables and no writer id.
fn index_of<F: Fabric>(fabric: &F, layout: &NodeLayout) -> Result<Index, KvError> {
    Ok(Index::new(
        layout,
        fabric.node_count(),
        IndexConfig::default(),
    )?)
}
