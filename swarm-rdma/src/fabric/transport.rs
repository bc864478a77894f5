//! What an [`RdmaFabric`](super::RdmaFabric) runs on: how it connects a queue pair to
//! one memory node (the TCP bootstrap), how a reconnected queue pair replaces the old
//! one in its NIC, and the device's health.
//!
//! The fabric's own logic — which nodes serve, reconnects and their incarnation
//! checks, [`Fabric::admit`](swarm_core::Fabric::admit) and
//! [`Fabric::memory_lost`](swarm_core::Fabric::memory_lost) — is the same whatever
//! the transport. In production it is verbs ([`super::VerbsTransport`]); without a
//! device it is the emulated provider behind the same authenticated bootstrap
//! ([`crate::emu::EmuTransport`]), so that logic is tested on any machine.

use std::net::TcpStream;
use std::time::Duration;

use crate::auth::Token;
use crate::bootstrap::{self, Accepted, Session};
use crate::error::RdmaError;
use crate::fabric::engine::{Nic, NodeLink};
use crate::fabric::reconnect::{IncarnationPins, Known};
use crate::lease_watch::{RevokeRequest, WatchRequest};
use crate::verbs::events::DeviceHealth;
use crate::wire::QpInfo;
use swarm_core::header::HeaderError;

/// What an [`RdmaFabric`](super::RdmaFabric) needs below it. One per client thread
/// (it may hold that client's completion queue); reconnect attempts run it on
/// short-lived threads.
pub trait Transport: std::fmt::Debug + Send + Sync + 'static {
    /// The engine's NIC: the client's queue pairs, staging buffer and completions.
    type Nic: Nic + std::fmt::Debug;
    /// A client queue pair connected to one memory node.
    type Qp: std::fmt::Debug + Send + 'static;

    /// Memory nodes in the cluster.
    fn node_count(&self) -> usize;

    /// Node `index`'s bootstrap address (`HOST:PORT`).
    fn node_addr(&self, index: usize) -> &str;

    /// Limit on each bootstrap step, lease watch requests included.
    fn bootstrap_timeout(&self) -> Duration;

    /// A new queue pair connected to node `index` through its bootstrap, with the
    /// lease watch re-armed first if `watch` is set ([`bootstrap_node`] does the
    /// device-independent part).
    fn connect_node(
        &self,
        index: usize,
        watch: Option<WatchRequest>,
    ) -> Result<Connected<Self::Qp>, RdmaError>;

    /// Puts `qp` in place of node `index`'s queue pair in `nic` (after a reconnect)
    /// and returns the old one, for the caller to destroy before the engine reuses
    /// the staging of the old one's chains.
    fn replace_qp(nic: &mut Self::Nic, index: usize, qp: Self::Qp) -> Option<Self::Qp>;

    /// The device's health, as its asynchronous events last said.
    fn health(&self) -> &DeviceHealth;

    /// The incarnations pinned for the cluster handle this transport belongs to,
    /// shared by all its clients ([`IncarnationPins`]).
    fn pins(&self) -> &IncarnationPins;
}

/// A queue pair connected to a memory node, and what the client learnt doing it.
#[derive(Debug)]
pub struct Connected<Q> {
    /// The client's queue pair.
    pub qp: Q,
    /// What the engine needs to reach the node's memory over it.
    pub link: NodeLink,
    /// The node's header and incarnation, as the bootstrap reported them.
    pub known: Known,
    /// The bootstrap connection: kept open while the queue pair is in use.
    pub stream: TcpStream,
    /// The bootstrap's session, for lease watch requests on `stream`.
    pub session: Session,
}

/// The transport-independent part of connecting node `index` at `addr`: the
/// authenticated bootstrap announcing `local_qp`, the lease watch re-armed when
/// `watch` is set (before the queue pair is used: the node refuses it if the lease
/// was killed meanwhile), and a check that the node is the one at that position in
/// the node list.
pub fn bootstrap_node(
    addr: &str,
    index: usize,
    token: &Token,
    local_qp: &QpInfo,
    timeout: Duration,
    watch: Option<WatchRequest>,
) -> Result<Accepted, RdmaError> {
    let mut accepted = bootstrap::connect(addr, token, local_qp, timeout)?;
    if let Some(request) = watch {
        request_watch(
            &mut accepted.stream,
            &mut accepted.session,
            addr,
            request,
            timeout,
        )?;
    }
    if usize::from(accepted.region.header.node_id) != index {
        return Err(RdmaError::Cluster {
            nodes: addr.to_owned(),
            source: HeaderError::Mismatch(
                "the memory node's id differs from its position in the node list",
            ),
        });
    }
    Ok(accepted)
}

/// Asks the node behind `stream` to watch a lease word, within `timeout`.
pub fn request_watch(
    stream: &mut TcpStream,
    session: &mut Session,
    addr: &str,
    request: WatchRequest,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let result = session.request_watch(stream, addr, request);
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    result
}

/// Asks the node behind `stream` to revoke the clients fenced under a lease word,
/// within `timeout`; the word as the node read it ([`Session::request_revoke`]).
pub fn request_revoke(
    stream: &mut TcpStream,
    session: &mut Session,
    addr: &str,
    request: RevokeRequest,
    timeout: Duration,
) -> Result<u64, RdmaError> {
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let result = session.request_revoke(stream, addr, request);
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    result
}
