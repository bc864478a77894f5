//! Errors a fabric reports.

use super::NodeId;

/// Why a node is considered failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureCause {
    /// The node was marked failed (fault injection) or crashed.
    Crashed,
    /// The node did not answer in time.
    TimedOut,
    /// The transport reported an error status (for RDMA, the `ibv_wc_status` code).
    Transport(u32),
    /// The connection to the node is gone.
    Disconnected,
}

impl core::fmt::Display for FailureCause {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Crashed => f.write_str("crashed or marked failed"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Transport(code) => write!(f, "transport error status {code}"),
            Self::Disconnected => f.write_str("disconnected"),
        }
    }
}

/// What can go wrong on the fabric.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// A memory node failed to execute a batch; the protocol carries on with a majority.
    #[error("memory node {node} failed ({cause}); operations continue while a majority is alive")]
    NodeFailed {
        /// The failed node.
        node: NodeId,
        /// Why it is considered failed.
        cause: FailureCause,
    },
    /// An access falls outside the node's memory: a layout bug or corrupted metadata.
    #[error("access of {len} bytes at {addr:#x} is outside node {node}'s {size} bytes")]
    OutOfBounds {
        /// The node addressed.
        node: NodeId,
        /// First byte of the access.
        addr: u64,
        /// Length of the access.
        len: u64,
        /// Size of the node's memory.
        size: u64,
    },
    /// A compare-and-swap target is not 8-byte aligned.
    #[error("compare-and-swap at {addr:#x} on node {node} is not 8-byte aligned")]
    Misaligned {
        /// The node addressed.
        node: NodeId,
        /// The misaligned address.
        addr: u64,
    },
    /// A node id past the cluster's node count.
    #[error("node {node} does not exist: the cluster has {nodes} nodes")]
    NoSuchNode {
        /// The node addressed.
        node: NodeId,
        /// The cluster's node count.
        nodes: usize,
    },
    /// Too few nodes answered for a quorum; a majority of nodes must be reachable.
    #[error("only {live} memory nodes can answer but {needed} are needed: bring a majority back")]
    NotEnoughLiveNodes {
        /// Replies needed.
        needed: usize,
        /// Nodes that answered or may still answer.
        live: usize,
    },
    /// A register's replica list names the same memory node twice.
    #[error("memory node {node} is listed twice among a register's replicas: list each node once")]
    DuplicateReplica {
        /// The node listed twice.
        node: NodeId,
    },
    /// A register's placement gives no offset for one of its replicas, or an offset
    /// for a node that is not one of them.
    #[error(
        "memory node {node} has no offset in a register's placement, or is not its replica: give one offset per replica"
    )]
    UnplacedReplica {
        /// The node without an offset (or with one but not a replica).
        node: NodeId,
    },
    /// A register was given more replicas than a client can address.
    #[error(
        "a register has {count} replicas but at most {max} are supported: replicate on fewer nodes"
    )]
    TooManyReplicas {
        /// Replicas asked for.
        count: usize,
        /// The most a register can have.
        max: usize,
    },
    /// One roundtrip was asked to post more batches than it can track (one per node).
    #[error(
        "a roundtrip posts at most {max} batches, one per memory node: post to fewer nodes or start another roundtrip"
    )]
    TooManyPosts {
        /// The most batches a roundtrip holds.
        max: usize,
    },
    /// A batch was given more operations than it can hold.
    #[error("a batch holds at most {} operations", super::MAX_BATCH_OPS)]
    BatchFull,
    /// A ticket that this fabric did not issue, or that was already redeemed.
    #[error("unknown or already redeemed ticket {0}")]
    UnknownTicket(u32),
    /// Nothing outstanding can complete any more: every pending batch is stuck on a
    /// failed node.
    #[error("the operation stalled: every pending batch waits on a failed memory node")]
    Stalled,
    /// The operation passed its deadline ([`crate::OpStats::deadline`]) and posted
    /// nothing more, so that memory it may still reference can be recycled.
    #[error(
        "the operation ran past its deadline (max_op_ns) and stopped posting so that memory it may still reference can be recycled; retry it"
    )]
    Fenced,
}

impl FabricError {
    /// Whether the fabric refused the batch before sending it (an invalid address or
    /// node, a full batch): such errors come back at once, without a roundtrip.
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            Self::OutOfBounds { .. }
                | Self::Misaligned { .. }
                | Self::NoSuchNode { .. }
                | Self::BatchFull
                | Self::UnknownTicket(_)
        )
    }
}
