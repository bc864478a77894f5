//! Verbs failures mapped to the core's node failures.
//!
//! SWARM tolerates `f` crashed memory nodes by never waiting for more than a
//! majority (§2.1, fourth property). For that to work over RDMA, everything that goes
//! wrong with a queue pair — the node stopped answering (retry exceeded), refused an
//! access, the connection broke, a post failed — must reach the protocol as
//! [`FabricError::NodeFailed`], exactly like a crash in the simulated fabric. A queue
//! pair that reported an error is in the error state and never works again, so the
//! fabric also marks it dead: later batches to that node fail at once.

use rdma_sys::ibv_wc_status as s;
use swarm_core::fabric::{FabricError, FailureCause, NodeId};

/// What a work-completion status says about the memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    /// The work request succeeded.
    Success,
    /// Flushed because an earlier request on the queue pair failed: a consequence,
    /// not a cause.
    Flushed,
    /// The node did not answer (transport or RNR retries exhausted, response
    /// timeout): crashed, rebooted, or unreachable.
    Unreachable,
    /// The node answered with an error (access or operation refused): typically it
    /// restarted with a new memory region, or the region is smaller than expected.
    RemoteError,
    /// The local device rejected the request: a transport bug or a local fault.
    LocalError,
}

/// Classifies an `ibv_wc_status` code.
pub fn classify(status: u32) -> StatusClass {
    match status {
        s::IBV_WC_SUCCESS => StatusClass::Success,
        s::IBV_WC_WR_FLUSH_ERR => StatusClass::Flushed,
        s::IBV_WC_RETRY_EXC_ERR | s::IBV_WC_RNR_RETRY_EXC_ERR | s::IBV_WC_RESP_TIMEOUT_ERR => {
            StatusClass::Unreachable
        }
        s::IBV_WC_REM_INV_REQ_ERR
        | s::IBV_WC_REM_ACCESS_ERR
        | s::IBV_WC_REM_OP_ERR
        | s::IBV_WC_REM_INV_RD_REQ_ERR
        | s::IBV_WC_REM_ABORT_ERR
        | s::IBV_WC_BAD_RESP_ERR => StatusClass::RemoteError,
        _ => StatusClass::LocalError,
    }
}

/// The symbolic name of an `ibv_wc_status` code, for logs.
pub fn name(status: u32) -> &'static str {
    match status {
        s::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        s::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
        s::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
        s::IBV_WC_LOC_EEC_OP_ERR => "IBV_WC_LOC_EEC_OP_ERR",
        s::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
        s::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
        s::IBV_WC_MW_BIND_ERR => "IBV_WC_MW_BIND_ERR",
        s::IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        s::IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR",
        s::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
        s::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        s::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR",
        s::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        s::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        s::IBV_WC_LOC_RDD_VIOL_ERR => "IBV_WC_LOC_RDD_VIOL_ERR",
        s::IBV_WC_REM_INV_RD_REQ_ERR => "IBV_WC_REM_INV_RD_REQ_ERR",
        s::IBV_WC_REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR",
        s::IBV_WC_INV_EECN_ERR => "IBV_WC_INV_EECN_ERR",
        s::IBV_WC_INV_EEC_STATE_ERR => "IBV_WC_INV_EEC_STATE_ERR",
        s::IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR",
        s::IBV_WC_RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR",
        s::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR",
        _ => "unknown ibv_wc_status",
    }
}

/// The error a batch gets when one of its work requests completed with `status`
/// (anything but success).
pub fn completion_error(node: NodeId, status: u32) -> FabricError {
    FabricError::NodeFailed {
        node,
        cause: FailureCause::Transport(status),
    }
}

/// The error a batch gets when `ibv_post_send` refused its chain (`errno`), or when
/// it is posted to a queue pair already known to be dead: the connection to that
/// node is unusable.
pub fn post_error(node: NodeId) -> FabricError {
    FabricError::NodeFailed {
        node,
        cause: FailureCause::Disconnected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_status_is_a_node_failure_carrying_the_code() {
        for status in 1..=s::IBV_WC_TM_RNDV_INCOMPLETE {
            assert_ne!(classify(status), StatusClass::Success, "{}", name(status));
            let error = completion_error(NodeId(4), status);
            assert_eq!(
                error,
                FabricError::NodeFailed {
                    node: NodeId(4),
                    cause: FailureCause::Transport(status)
                }
            );
            assert!(error.to_string().contains("memory node 4 failed"));
        }
        assert_eq!(classify(s::IBV_WC_SUCCESS), StatusClass::Success);
    }

    #[test]
    fn classes_of_the_statuses_a_dead_node_produces() {
        assert_eq!(classify(s::IBV_WC_RETRY_EXC_ERR), StatusClass::Unreachable);
        assert_eq!(
            classify(s::IBV_WC_RNR_RETRY_EXC_ERR),
            StatusClass::Unreachable
        );
        assert_eq!(classify(s::IBV_WC_WR_FLUSH_ERR), StatusClass::Flushed);
        assert_eq!(classify(s::IBV_WC_REM_ACCESS_ERR), StatusClass::RemoteError);
        assert_eq!(classify(s::IBV_WC_LOC_PROT_ERR), StatusClass::LocalError);
        assert_eq!(classify(999), StatusClass::LocalError);
        assert_eq!(name(s::IBV_WC_RETRY_EXC_ERR), "IBV_WC_RETRY_EXC_ERR");
        assert_eq!(name(999), "unknown ibv_wc_status");
    }

    #[test]
    fn post_failures_are_node_failures() {
        assert_eq!(
            post_error(NodeId(1)),
            FabricError::NodeFailed {
                node: NodeId(1),
                cause: FailureCause::Disconnected
            }
        );
    }
}
