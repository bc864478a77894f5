//! Errors of SWARM-KV operations.

use swarm_core::{FabricError, NodeId, SwarmError};

use crate::index::IndexError;
use crate::layout::ParamsError;

/// Why a SWARM-KV operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// Keys must not be empty.
    #[error("empty keys are not allowed")]
    EmptyKey,
    /// The key is longer than the cluster's limit.
    #[error(
        "key of {len} B exceeds the cluster's limit of {max} B (set at `swarm init --key-max`)"
    )]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The value is larger than the cluster's limit.
    #[error(
        "value of {len} B exceeds the cluster's limit of {max} B (set at `swarm init --value-max`)"
    )]
    ValueTooLarge {
        /// The value's length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// Every register slot is claimed and this client has none free or due soon.
    #[error(
        "the register area is full ({registers} keys): delete keys (their registers are reused after the recycling grace, by the client that unmapped them or, beyond the chunk's worth that client keeps, by any client) or create a larger cluster with `swarm init --size`"
    )]
    RegistersFull {
        /// The cluster's capacity.
        registers: u64,
    },
    /// A chunk this client claimed was placed by a configuration newer than the one
    /// it follows (a node was added meanwhile): it gave the chunk back unused.
    #[error(
        "chunk {chunk} was placed by a newer cluster configuration than this client follows (a node was added): retry; the client follows the new configuration at its next lease renewal"
    )]
    PlacementBehind {
        /// The chunk.
        chunk: u64,
    },
    /// A lease renewal read a newer cluster configuration than the client follows,
    /// and the client could not read it yet (its placement table among it): no
    /// operation starts until it does.
    #[error(
        "the cluster configuration changed (epoch {seen}) and this client could not follow it yet (it follows epoch {followed}): retry; a majority of the metadata nodes must answer"
    )]
    ConfigurationBehind {
        /// The epoch the renewals read.
        seen: u64,
        /// The epoch the client follows.
        followed: u64,
    },
    /// Every writer id is taken, by live clients that gave none back within the
    /// connect's wait ([`crate::KvConfig::writer_wait_ns`]).
    #[error(
        "all {writers} writer ids are taken by running clients, and none was given back in time: stop some clients or create the cluster with more `--writers`"
    )]
    WritersFull {
        /// The cluster's writer ids.
        writers: u16,
    },
    /// This client's transport may deliver a batch later after its post than the
    /// cluster's delivery margin allows: memory could be recycled under its writes.
    #[error(
        "this client's transport may land a write up to {transport_ns} ns after posting it, \
         beyond the cluster's delivery margin of {cluster_ns} ns: lower the queue pairs' \
         ack_timeout or retry_count, or format the cluster with a larger --delivery-margin"
    )]
    DeliveryMargin {
        /// The transport's bound, ns.
        transport_ns: u64,
        /// The cluster's margin (superblock), ns.
        cluster_ns: u64,
    },
    /// The cluster has fewer nodes than its replication factor.
    #[error("the cluster has {nodes} memory nodes but keys are replicated on {replicas}")]
    TooFewNodes {
        /// Nodes reachable.
        nodes: usize,
        /// Replicas per key.
        replicas: u16,
    },
    /// Fewer than a majority of the memory nodes can serve (missing, corrupted, empty,
    /// or of an incarnation the configuration does not list).
    #[error(
        "only {usable} of the {nodes} memory nodes can serve and a majority is needed: \
         {problems}; restore the missing node files or memory nodes (a lost majority \
         cannot be repaired from the rest)"
    )]
    NoMajority {
        /// Nodes that can serve.
        usable: usize,
        /// The cluster's node count.
        nodes: usize,
        /// Each node that cannot serve, and why.
        problems: String,
    },
    /// `swarm format` found a store already on the memory nodes.
    #[error(
        "memory node {node} already holds a SWARM-KV store: formatting again would make \
         restarted (empty) memory nodes look like replicas of it; to start over, restart \
         every memory node (their memory is then empty) and format again"
    )]
    AlreadyFormatted {
        /// A node holding a superblock.
        node: NodeId,
    },
    /// A register holds data that does not belong to the key that maps to it.
    #[error("register {register} holds data of another key: the index or memory is corrupted")]
    Corrupted {
        /// The register.
        register: u64,
    },
    /// The key's register was deleted under the operation every time it tried: other
    /// clients keep deleting and re-inserting the key.
    #[error(
        "the key was deleted concurrently on each of {attempts} attempts: retry the operation, and spread writes to this key over fewer clients"
    )]
    Contended {
        /// Attempts made.
        attempts: u32,
    },
    /// A delete reached the key's register through this client's cache and raced
    /// another delete there, the key now lives in another register, and too few
    /// memory nodes answered to tell whether the cached register was still the key's
    /// when the delete began (`KvClient::delete`). The delete may or may not have
    /// removed a value: nothing else was changed.
    #[error(
        "the delete raced another delete of the key and the key was re-inserted meanwhile; with a memory node unreachable it cannot tell whether it removed the earlier value: it may or may not have taken effect. Read the key and retry the delete if it is still there"
    )]
    DeleteUndecided {
        /// The register the delete reached.
        register: u64,
    },
    /// `swarm evict` refused: the writer renewed its lease while it was watched.
    #[error(
        "writer {writer} renewed its lease during the {watched_secs:.1} s it was watched: it is \
         alive. Stop that client, or evict it anyway with --force (it then stops at its next \
         operation with a lease error)"
    )]
    LeaseFresh {
        /// The writer id.
        writer: u16,
        /// How long it was watched, seconds.
        watched_secs: f64,
    },
    /// The lease of a writer id lapsed, but its owner process still runs on this
    /// host (stopped, or stuck): its id is not released, since its stores may still
    /// land (`crate::membership::owner_process`).
    #[error(
        "writer id {writer}'s lease lapsed, but its owner process still runs (stopped or stuck, \
         see `swarm stat` for its pid): continue or kill that process, or evict it anyway with \
         --force once you know it will never run again"
    )]
    OwnerRunning {
        /// The writer id.
        writer: u16,
    },
    /// The lease of a writer id is killed, but not every memory node acknowledged
    /// that its owner's queue pairs are cut (RDMA): its id is not released, since the
    /// owner's late stores could still land (`crate::membership::writer_takeover`).
    #[error(
        "writer id {writer}'s lease is killed, but not every memory node acknowledged that its \
         owner is cut off (a node is unreachable, or another client took the id meanwhile): \
         retry once every memory node answers"
    )]
    OwnerNotCut {
        /// The writer id.
        writer: u16,
    },
    /// The client could not prove its lease valid for a whole operation and stopped
    /// (self-fencing): it must reconnect.
    #[error(
        "the lease of writer id {writer} expired and could not be renewed (a majority of memory \
         nodes is unreachable, or the client paused so long that its id was reclaimed): this \
         client stopped issuing operations; reconnect (open a new client) to continue"
    )]
    LeaseExpired {
        /// The writer id the client held.
        writer: u16,
    },
    /// A writer id beyond the cluster's table.
    #[error("no writer {writer}: the cluster has writer ids 0 to {}", writers.saturating_sub(1))]
    NoSuchWriter {
        /// The writer id asked for.
        writer: u16,
        /// Writer ids in the cluster.
        writers: u16,
    },
    /// The operation ran past its deadline (start + `KvConfig::max_op_ns`).
    #[error(
        "the operation ran longer than max_op_ns ({max_op_ns} ns) and stopped so that memory it may still reference can be recycled (a get retries such stalls itself before reporting this); a write's outcome is unknown: read the key, and write again if needed"
    )]
    Fenced {
        /// The operation deadline, ns.
        max_op_ns: u64,
    },
    /// The operation is not available with the chosen register protocol.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// The replication protocol failed (no majority, log full, ...).
    #[error(transparent)]
    Swarm(#[from] SwarmError),
    /// The index failed.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The fabric failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The cluster's parameters or superblock are invalid.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// Opening or creating the shared-memory cluster failed.
    #[error(transparent)]
    Shm(#[from] swarm_shm::ShmError),
    /// The placement table could not be adopted (`crate::placement`).
    #[error(transparent)]
    Placement(#[from] crate::placement::PlacementError),
    /// Repairing a memory node failed (`crate::repair`); the node stays out of service.
    #[error(transparent)]
    Repair(#[from] crate::repair::RepairError),
    /// Adding a memory node failed (`crate::placement::add_node`); the cluster keeps
    /// the nodes it had.
    #[error(transparent)]
    AddNode(#[from] crate::placement::AddNodeError),
    /// Connecting to RDMA memory nodes failed.
    #[cfg(feature = "rdma")]
    #[error(transparent)]
    Rdma(swarm_rdma::RdmaError),
    /// The worker thread of an [`crate::AsyncKv`] could not be started.
    #[error(
        "cannot start the worker thread of an async SWARM-KV client: {0}; raise the process's thread limit or use fewer async clients"
    )]
    WorkerSpawn(#[source] std::io::Error),
    /// The worker thread of an [`crate::AsyncKv`] stopped before answering (it
    /// panicked): the operation may or may not have taken effect.
    #[error(
        "the worker thread of this async SWARM-KV client stopped unexpectedly (see the log for a panic): the operation may or may not have taken effect; read the key to see its state, and connect a new client"
    )]
    WorkerStopped,
}

impl KvError {
    /// Whether the operation stopped at its deadline (the operation fence), at any
    /// layer: the operation may be retried as a new one.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. }
                | Self::Swarm(SwarmError::Fenced)
                | Self::Index(IndexError::Fenced { .. })
                | Self::Index(IndexError::Fabric(FabricError::Fenced))
                | Self::Fabric(FabricError::Fenced)
        )
    }

    /// Whether a register operation found its register reset for another life
    /// (`swarm_core::SwarmError::Recycled`): it changed nothing there, and the
    /// client looks the key up again.
    pub(crate) fn is_recycled(&self) -> bool {
        matches!(self, Self::Swarm(SwarmError::Recycled { .. }))
    }
}
