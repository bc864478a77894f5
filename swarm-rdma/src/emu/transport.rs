//! [`RdmaFabric`] over the emulated provider: clients of
//! [`EmulatedMemnode`](super::EmulatedMemnode)s connect through the real bootstrap
//! and run the real fabric — reconnects, incarnation checks,
//! [`Fabric::admit`](swarm_core::Fabric::admit),
//! [`Fabric::memory_lost`](swarm_core::Fabric::memory_lost), lease watches — with
//! [`EmuNic`] in place of verbs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::EmuOptions;
use super::memnode::EmuWire;
use super::nic::{EmuConnection, EmuNic};
use super::queue::EmuQp;
use crate::auth::Token;
use crate::error::RdmaError;
use crate::fabric::engine::NodeLink;
use crate::fabric::reconnect::{IncarnationPins, Known};
use crate::fabric::transport::{self, Connected, Transport};
use crate::fabric::{ClusterHandle, RdmaFabric};
use crate::lease_watch::WatchRequest;
use crate::verbs::events::DeviceHealth;
use crate::wire::QpInfo;
use crate::wr::{ChainLimits, RemoteRegion};

/// How long a client of emulated nodes waits for a bootstrap step.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(2);

/// After how long a chain in flight is reported overdue (emulated queue pairs
/// execute only when their client polls, so this is never reached in practice).
const WARN_OVERDUE_AFTER_NS: u64 = 2_000_000_000;

/// Emulated memory nodes as clients reach them: their bootstrap addresses, the
/// token, and the network between them ([`EmuWire`]).
#[derive(Debug)]
pub struct EmuTransport {
    wire: Arc<EmuWire>,
    nodes: Vec<String>,
    token: Token,
    options: EmuOptions,
    /// Always healthy unless a test records device events on it.
    health: DeviceHealth,
    /// The nodes' incarnations, pinned for every client made from this transport
    /// (as an [`crate::RdmaCluster`] pins them for its clients).
    pins: IncarnationPins,
    /// The schedule seed of the next client made through [`ClusterHandle::client`].
    seeds: AtomicU64,
}

impl EmuTransport {
    /// Clients of the memory nodes at `nodes` (node `i` is `nodes[i]`) on `wire`.
    pub fn new(wire: Arc<EmuWire>, nodes: Vec<String>, token: Token, options: EmuOptions) -> Self {
        let pins = IncarnationPins::new(nodes.len());
        Self {
            wire,
            nodes,
            token,
            options,
            health: DeviceHealth::new(1),
            pins,
            seeds: AtomicU64::new(1),
        }
    }

    /// Connects a new client (one per thread) to every node, its schedule drawn
    /// from `seed`; fails without a majority, as [`crate::RdmaCluster::client`].
    pub fn client(self: &Arc<Self>, seed: u64) -> Result<RdmaFabric<EmuTransport>, RdmaError> {
        let o = self.options;
        RdmaFabric::connect_all(self.clone(), WARN_OVERDUE_AFTER_NS, |connections| {
            EmuNic::with_connections(connections, o.staging, o.device_cas_reply, seed)
        })
    }
}

/// Emulated memory nodes as a cluster handle: each client gets the next schedule
/// seed; requests take effect only while their client polls, so nothing lands late.
impl ClusterHandle for Arc<EmuTransport> {
    type Transport = EmuTransport;

    fn client(&self) -> Result<RdmaFabric<EmuTransport>, RdmaError> {
        EmuTransport::client(self, self.seeds.fetch_add(1, Ordering::Relaxed))
    }

    fn node_addr(&self, index: usize) -> &str {
        self.nodes.get(index).map_or("?", String::as_str)
    }

    fn delivery_bound_ns(&self) -> u64 {
        0
    }
}

impl Transport for EmuTransport {
    type Nic = EmuNic;
    type Qp = EmuConnection;

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn node_addr(&self, index: usize) -> &str {
        &self.nodes[index]
    }

    fn bootstrap_timeout(&self) -> Duration {
        BOOTSTRAP_TIMEOUT
    }

    fn connect_node(
        &self,
        index: usize,
        watch: Option<WatchRequest>,
    ) -> Result<Connected<EmuConnection>, RdmaError> {
        let addr = self.node_addr(index);
        let qpn = self.wire.next_qpn();
        let local = QpInfo {
            lid: 0,
            gid: [0; 16],
            qpn,
            psn: qpn,
            mtu: 5,
            max_rd_atomic: 16,
        };
        let accepted =
            transport::bootstrap_node(addr, index, &self.token, &local, BOOTSTRAP_TIMEOUT, watch)?;
        // The node's queue pair, as the network reaches it; gone if the node
        // destroyed it since (it dropped this client or stopped).
        let route = self.wire.route(accepted.qp.qpn).ok_or_else(|| {
            RdmaError::Config(format!(
                "memory node {addr} destroyed its queue pair during the bootstrap"
            ))
        })?;
        let o = self.options;
        Ok(Connected {
            qp: EmuConnection {
                qp: EmuQp::connected(qpn, o.depth, o.max_inline, route.alive),
                node: route.node,
            },
            link: NodeLink {
                region: RemoteRegion {
                    addr: accepted.region.addr,
                    rkey: accepted.region.rkey,
                    size: accepted.region.size,
                },
                limits: ChainLimits {
                    max_inline: o.max_inline,
                    max_message: 1 << 30,
                    ordering: o.ordering,
                    cas_reply: o.decode_cas_reply,
                },
                depth: o.depth,
            },
            known: Known {
                header: accepted.region.header,
                incarnation: accepted.region.incarnation,
            },
            stream: accepted.stream,
            session: accepted.session,
        })
    }

    fn replace_qp(nic: &mut EmuNic, index: usize, qp: EmuConnection) -> Option<EmuConnection> {
        nic.replace_connection(index, qp)
    }

    fn health(&self) -> &DeviceHealth {
        &self.health
    }

    fn pins(&self) -> &IncarnationPins {
        &self.pins
    }
}
