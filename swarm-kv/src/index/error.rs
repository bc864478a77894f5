//! What can go wrong in the index.

use swarm_core::fabric::{FabricError, Nanos, NodeId};

use super::bucket::BucketError;

/// What is wrong with a key header the index read to tell keys apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderProblem {
    /// No node of a majority holds a well-formed header.
    #[error("missing on a majority of nodes")]
    Missing,
    /// Nodes disagree on the key.
    #[error("inconsistent across nodes")]
    Inconsistent,
}

/// Errors of index operations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The key is longer than the cluster's key limit.
    #[error("key of {len} B exceeds the cluster's {max} B key limit")]
    KeyTooLong {
        /// Its length.
        len: usize,
        /// The limit (`ClusterParams::key_max`).
        max: u32,
    },
    /// The key is empty; key headers cannot hold an empty key.
    #[error("empty keys cannot be indexed: use a key of at least one byte")]
    EmptyKey,
    /// A register id outside the register area.
    #[error("register {register} does not exist: the cluster has {registers} registers")]
    NoSuchRegister {
        /// The id given.
        register: u64,
        /// Registers in the cluster.
        registers: u64,
    },
    /// A replace was given the register it replaces as the new one.
    #[error("replace needs a fresh register: {0} is the register being replaced")]
    SameRegister(u64),
    /// The index cannot be built for these parameters.
    #[error("cannot build the index: {0}")]
    Config(String),
    /// The fabric has fewer nodes than the index was built for.
    #[error(
        "the fabric has {fabric} memory nodes but the index was built for {index}: build it from the cluster's node count"
    )]
    NodeCount {
        /// Nodes of the fabric.
        fabric: usize,
        /// Nodes the index expects.
        index: usize,
    },
    /// Both candidate buckets of the key are full.
    #[error(
        "index full: both candidate buckets ({first} and {second}) of this key have no free slot; \
         remove keys, or re-initialise the cluster with more index buckets"
    )]
    Full {
        /// First candidate bucket.
        first: u64,
        /// Second candidate bucket.
        second: u64,
    },
    /// Fewer than a majority of memory nodes answered.
    #[error("index unavailable: {0}")]
    NoMajority(FabricError),
    /// Too few nodes returned a well-formed copy of a bucket.
    #[error(
        "index bucket {bucket} is corrupted on node {node} ({detail}) and too few nodes hold a \
         valid copy: check the memory nodes"
    )]
    Corrupted {
        /// The bucket.
        bucket: u64,
        /// A node with a bad copy.
        node: NodeId,
        /// What is wrong.
        detail: BucketError,
    },
    /// A key header the index relies on is missing or inconsistent.
    #[error(
        "key header of register {register} is {problem}: write a register's key header to a \
         majority of nodes before indexing it"
    )]
    KeyHeader {
        /// The register.
        register: u64,
        /// What is wrong.
        problem: HeaderProblem,
    },
    /// Concurrent updates of the same buckets kept preempting this one.
    #[error("gave up after {attempts} attempts under contention on bucket {bucket}: retry later")]
    Contention {
        /// Attempts made.
        attempts: u32,
        /// The contended bucket.
        bucket: u64,
    },
    /// This client stalled for longer than the acknowledgement wait in the middle of
    /// an update, and others moved on: the update may or may not have taken effect.
    #[error(
        "the outcome of this index update is unknown: the client stalled for more than \
         {ack_wait_ns} ns mid-update while others moved on; look the key up to find out"
    )]
    OutcomeUnknown {
        /// The configured acknowledgement wait.
        ack_wait_ns: Nanos,
    },
    /// The operation reached its deadline before posting a CAS (the caller's
    /// operation deadline, `KvConfig::max_op_ns`).
    #[error(
        "the index update stopped at its deadline ({deadline} ns on the client's clock) so that \
         registers it may still name can be recycled; it may or may not have taken effect: \
         look the key up, or retry"
    )]
    Fenced {
        /// The deadline, on the fabric's clock.
        deadline: Nanos,
    },
    /// A fabric error other than a missing majority (a bad address: a layout bug).
    #[error(transparent)]
    Fabric(FabricError),
}

impl From<FabricError> for IndexError {
    fn from(error: FabricError) -> Self {
        match error {
            FabricError::NotEnoughLiveNodes { .. }
            | FabricError::Stalled
            | FabricError::NodeFailed { .. } => Self::NoMajority(error),
            other => Self::Fabric(other),
        }
    }
}
