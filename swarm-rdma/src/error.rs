//! Errors of the RDMA transport and the memory-node daemon.
//!
//! Failures of a *memory node* while batches are in flight are not [`RdmaError`]s:
//! they surface to the protocol as [`swarm_core::FabricError::NodeFailed`] (see
//! [`crate::status`]), so that a dead memory node is handled like any other failed
//! node. `RdmaError` covers setting things up: finding a device, registering memory,
//! the TCP bootstrap, configuration.

use std::io;

use swarm_core::header::HeaderError;

use crate::auth::TokenError;
use crate::wire::{RefuseReason, WireError};

/// What can go wrong while setting up RDMA clients and memory nodes.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// No RDMA device is usable on this machine (no hardware, no kernel support, or
    /// no soft-RoCE link configured).
    #[error(
        "no RDMA device found: {detail}. Check `ibv_devices`; without RDMA hardware, \
         load soft-RoCE (`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <iface>`) \
         or use the shared-memory transport (--dir)"
    )]
    NoDevice {
        /// What `ibv_get_device_list` reported.
        detail: String,
    },
    /// A device was asked for by name but does not exist.
    #[error("RDMA device {name:?} not found; devices present: {available}")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// Comma-separated names of the devices present.
        available: String,
    },
    /// A verbs call failed.
    #[error("{call} failed: {source}")]
    Verbs {
        /// The verbs call (and what it was for).
        call: &'static str,
        /// The errno it reported.
        source: io::Error,
    },
    /// The device port is not usable.
    #[error(
        "port {port} of RDMA device {device} is not active (state {state}): check the cable or link with `ibv_devinfo`"
    )]
    PortNotActive {
        /// The device.
        device: String,
        /// The port number.
        port: u8,
        /// The `ibv_port_state` code.
        state: u32,
    },
    /// No usable GID (address) on the port for the peers to reach.
    #[error("cannot address memory nodes from port {port} of RDMA device {device}: {detail}")]
    Addressing {
        /// The device.
        device: String,
        /// The port number.
        port: u8,
        /// What is wrong and what to pass instead.
        detail: String,
    },
    /// The device lacks a capability the transport needs.
    #[error("RDMA device {device} cannot be used: {what}")]
    Unsupported {
        /// The device.
        device: String,
        /// The missing capability.
        what: String,
    },
    /// Memory for the node or the client's staging buffers could not be allocated.
    #[error("cannot allocate {bytes} bytes of memory: {source}; lower the size or free memory")]
    Alloc {
        /// Bytes asked for.
        bytes: u64,
        /// The mmap error.
        source: io::Error,
    },
    /// Registering memory would exceed the process's locked-memory limit.
    #[error(
        "registering RDMA memory needs {needed} bytes of locked memory but RLIMIT_MEMLOCK \
         allows {limit}: raise it (`ulimit -l unlimited` in the shell, LimitMEMLOCK=infinity \
         in a systemd unit, `memlock` in /etc/security/limits.conf) or grant CAP_IPC_LOCK"
    )]
    MemlockLimit {
        /// Bytes this process would have registered in all.
        needed: u64,
        /// The soft limit, in bytes.
        limit: u64,
    },
    /// A socket operation of the bootstrap failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the peer address.
        context: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The peer sent bootstrap bytes that are not a valid message.
    #[error("bootstrap with {peer} failed: {source}")]
    Wire {
        /// The peer's address.
        peer: String,
        /// What was wrong.
        source: WireError,
    },
    /// The peer could not prove it knows the cluster token.
    #[error(
        "{peer} did not prove knowledge of the cluster token: it belongs to another cluster \
         or uses another token file than the one `swarm init` created"
    )]
    BadToken {
        /// The peer's address.
        peer: String,
    },
    /// A handshake message from a peer that had proved the token failed its check:
    /// something on the path altered, replayed or forged it.
    #[error(
        "the bootstrap with {peer} was tampered with: its {message} message is not \
         authenticated by the cluster token (altered, replayed or forged on the way); \
         check what sits on the network path to the memory node"
    )]
    Tampered {
        /// The peer's address.
        peer: String,
        /// The message that failed its check.
        message: &'static str,
    },
    /// The memory node refused the connection.
    #[error("memory node {peer} refused the connection: {reason}")]
    Refused {
        /// The memory node's address.
        peer: String,
        /// Why.
        reason: RefuseReason,
    },
    /// The memory node restarted (with empty memory) since this process's cluster
    /// handle first reached it: a new client leaves it out until a configuration
    /// change admits its new incarnation (after a repair).
    #[error(
        "memory node {peer} restarted with empty memory (incarnation {found:#018x}, this process knew {pinned:#018x}): left out until it is repaired"
    )]
    Restarted {
        /// The memory node's address.
        peer: String,
        /// The incarnation pinned for this node by the cluster handle.
        pinned: u64,
        /// The incarnation the node reported.
        found: u64,
    },
    /// The RDMA device had a fatal error: nothing it served works any more (the
    /// memory node stopped serving; restart the process).
    #[error("RDMA device {device} had a fatal error; restart the process")]
    DeviceFatal {
        /// The device.
        device: String,
    },
    /// The memory nodes' headers do not describe one cluster in the order given.
    #[error("memory nodes {nodes} do not form the expected cluster: {source}")]
    Cluster {
        /// The node addresses, in the order given.
        nodes: String,
        /// What is inconsistent.
        source: HeaderError,
    },
    /// Too few memory nodes could be connected for the protocol to make progress.
    #[error(
        "only {live} of {total} memory nodes are reachable but a majority ({needed}) is needed: {failures}"
    )]
    NoMajority {
        /// Nodes connected.
        live: usize,
        /// Nodes in the cluster.
        total: usize,
        /// The majority.
        needed: usize,
        /// Why each other node failed, one per node.
        failures: String,
    },
    /// The cluster token could not be loaded or generated.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A configuration value is invalid.
    #[error("invalid RDMA configuration: {0}")]
    Config(String),
}

impl RdmaError {
    /// A verbs error carrying the current `errno`.
    pub(crate) fn last_os(call: &'static str) -> Self {
        Self::Verbs {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// A verbs error from a returned error code (verbs calls that return errno).
    pub(crate) fn code(call: &'static str, code: i32) -> Self {
        Self::Verbs {
            call,
            source: io::Error::from_raw_os_error(code),
        }
    }

    /// An I/O error with context.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// A bootstrap decoding/protocol error with its peer.
    pub(crate) fn wire(peer: &str, source: WireError) -> Self {
        Self::Wire {
            peer: peer.to_owned(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_message_starts_with_the_required_prefix_and_says_what_to_do() {
        let error = RdmaError::NoDevice {
            detail: "ibv_get_device_list failed: Function not implemented (os error 38)".into(),
        };
        let text = error.to_string();
        assert!(text.starts_with("no RDMA device found: "), "{text}");
        assert!(text.contains("os error 38"));
        assert!(text.contains("rdma link add"));
    }
}
