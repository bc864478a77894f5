//! [`RdmaFabric`]: SWARM's fabric contract ([`swarm_core::fabric`], SWARM §2.1) over
//! RDMA verbs.
//!
//! A process opens the device once ([`RdmaCluster::open`]); every client thread then
//! gets its own [`RdmaFabric`] ([`RdmaCluster::client`]) with its own completion
//! queue, staging buffer and one RC queue pair per memory node, connected through the
//! TCP bootstrap ([`crate::bootstrap`]). Batches become chains
//! ([`crate::wr`]), posted with one doorbell per node per roundtrip; completions are
//! polled in [`swarm_core::Fabric::progress`] ([`engine`]).
//!
//! Memory nodes that cannot be reached when a client starts are treated as failed
//! from the start, as long as a majority is reachable (SWARM tolerates a failed
//! minority with no reconfiguration, §6).

pub mod engine;
pub mod nic;
pub mod reconnect;
pub mod transport;

#[cfg(test)]
mod engine_tests;

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::{Arc, mpsc};
use std::task::Poll;
use std::time::{Duration, Instant};

use swarm_core::fabric::{
    Batch, Completion, Fabric, FabricError, Nanos, NodeId, OwnerFence, Revocation, Ticket,
};
use swarm_core::header::NodeHeader;

use crate::auth::Token;
use crate::bootstrap;
use crate::config::PathConfig;
use crate::config::{ClusterConfig, check_address};
use crate::error::RdmaError;
use crate::lease_watch::{KILLED, MAX_STALL_NS, MIN_STALL_NS, RevokeRequest, WatchRequest};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::device::{Device, PortAttr, PortInfo, open_device};
use crate::verbs::events::{DeviceEvents, DeviceHealth};
use crate::verbs::memory::{Access, Mapping, MemoryRegion};
use crate::verbs::qp::{QpSettings, QueuePair, Role};
use crate::verbs::selftest::{self, DeviceLoopback};
use crate::wire::RefuseReason;
use crate::wr::{CasReplyOrder, ChainLimits, ReadOrdering, RemoteRegion};
use engine::{Engine, EngineFabric, NodeLink};
use nic::VerbsNic;
use reconnect::{IncarnationPins, Known, Slot, Verdict, judge};
pub use transport::{Connected, Transport};

/// How a client connects to memory nodes.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Memory-node addresses (`HOST:PORT` of their bootstrap); node `i` is `nodes[i]`.
    pub nodes: Vec<String>,
    /// The cluster token.
    pub token: Token,
    /// RDMA device name; `None` for the first device.
    pub device: Option<String>,
    /// Device port, GID, traffic class and service level.
    pub path: PathConfig,
    /// Registered staging bytes per client thread: bounds the data of batches in
    /// flight at once (and the largest batch).
    pub staging_bytes: u64,
    /// Work requests in flight per queue pair.
    pub send_queue_depth: u32,
    /// Largest write to carry inline (the device may grant less).
    pub max_inline: u32,
    /// Read ordering within a batch (see [`crate::wr`]).
    pub ordering: ReadOrdering,
    /// Limit on each bootstrap step.
    pub bootstrap_timeout: Duration,
    /// ACK timeout exponent (4.096 µs · 2^n per retry; 14 ≈ 67 ms). 0 means *no*
    /// timeout in the InfiniBand spec (a silent node would never be reported), so it
    /// is refused; below [`MIN_SANE_ACK_TIMEOUT`] retries outpace a congested
    /// fabric's round trips and a warning is logged.
    pub ack_timeout: u8,
    /// Transport retries before a silent node is reported failed (at most 7).
    pub retry_count: u8,
}

impl RdmaConfig {
    /// Defaults for `nodes`, authenticated with `token`.
    pub fn new(nodes: Vec<String>, token: Token) -> Self {
        Self {
            nodes,
            token,
            device: None,
            path: PathConfig::default(),
            staging_bytes: 8 << 20,
            send_queue_depth: 256,
            max_inline: 128,
            ordering: ReadOrdering::default(),
            bootstrap_timeout: bootstrap::DEFAULT_TIMEOUT,
            ack_timeout: 14,
            retry_count: 7,
        }
    }

    /// How long after its post a work request may still take effect on a memory
    /// node: the queue pair's retry window, `4.096 µs · 2^ack_timeout` per try and
    /// `retry_count + 1` tries (a lost packet is sent again after each timeout; after
    /// the last the queue pair is in error and nothing more lands), plus
    /// [`SCHEDULING_SLACK_NS`] for the NIC (soft-RoCE: a kernel thread) to pick the
    /// request up. Recycling waits at least this for batches still in flight: a
    /// SWARM-KV cluster's delivery margin must cover it. Rounded up to a whole
    /// millisecond (defaults: 547 ms).
    pub fn delivery_bound_ns(&self) -> u64 {
        let per_try = 4_096u64 << self.ack_timeout.min(31);
        per_try
            .saturating_mul(u64::from(self.retry_count) + 1)
            .saturating_add(SCHEDULING_SLACK_NS)
            .div_ceil(1_000_000)
            .saturating_mul(1_000_000)
    }

    /// Defaults for the nodes of a cluster file, loading its token file.
    pub fn from_cluster(cluster: &ClusterConfig) -> Result<Self, RdmaError> {
        let mut config = Self::new(cluster.nodes.clone(), Token::load(&cluster.token_file)?);
        config.path = cluster.path;
        Ok(config)
    }

    fn validate(&self) -> Result<(), RdmaError> {
        if self.nodes.is_empty() {
            return Err(RdmaError::Config("no memory node given".into()));
        }
        self.path.validate()?;
        for node in &self.nodes {
            check_address(node)?;
        }
        if self.nodes.len() > usize::from(u16::MAX) {
            return Err(RdmaError::Config("too many memory nodes".into()));
        }
        if self.staging_bytes < 4096 {
            return Err(RdmaError::Config(
                "staging_bytes must be at least 4096".into(),
            ));
        }
        if self.send_queue_depth < swarm_core::fabric::MAX_BATCH_OPS as u32 {
            return Err(RdmaError::Config(format!(
                "send_queue_depth must be at least {} (one batch)",
                swarm_core::fabric::MAX_BATCH_OPS
            )));
        }
        if self.retry_count > 7 || self.ack_timeout > 31 {
            return Err(RdmaError::Config(
                "retry_count must be at most 7 and ack_timeout at most 31".into(),
            ));
        }
        if self.ack_timeout == 0 {
            return Err(RdmaError::Config(
                "ack_timeout 0 disables the transport timeout (InfiniBand: infinite), so a \
                 crashed memory node would stall its clients forever; use 12 to 18 \
                 (4.096 µs · 2^n: 17 ms to 1 s)"
                    .into(),
            ));
        }
        if self.ack_timeout < MIN_SANE_ACK_TIMEOUT {
            tracing::warn!(
                ack_timeout = self.ack_timeout,
                "ack_timeout below {MIN_SANE_ACK_TIMEOUT} (≈ 17 ms): retries may give up on a \
                 live but congested memory node and report it failed"
            );
        }
        Ok(())
    }
}

/// Allowance in [`RdmaConfig::delivery_bound_ns`] between posting a work request and
/// the NIC sending it.
pub const SCHEDULING_SLACK_NS: u64 = 10_000_000;

/// The smallest ACK timeout exponent that does not warn (4.096 µs · 2^12 ≈ 17 ms).
pub const MIN_SANE_ACK_TIMEOUT: u8 = 12;

/// An open device and the cluster to connect to; shared by a process's client
/// threads.
#[derive(Debug)]
pub struct RdmaCluster {
    shared: Arc<Shared>,
}

/// What client threads (and their background reconnects) share.
#[derive(Debug)]
struct Shared {
    // Drop order: stop the event thread, then close the device.
    events: DeviceEvents,
    device: Arc<Device>,
    port: PortAttr,
    config: RdmaConfig,
    /// How the device returns CAS results (its self-test at open).
    cas_reply: CasReplyOrder,
    /// The nodes' incarnations, pinned for every client of this cluster handle.
    pins: IncarnationPins,
}

impl RdmaCluster {
    /// Checks `config` and opens the device. On a machine without RDMA this fails
    /// with [`RdmaError::NoDevice`] ("no RDMA device found: ...").
    pub fn open(config: RdmaConfig) -> Result<Self, RdmaError> {
        config.validate()?;
        let device = Arc::new(open_device(config.device.as_deref())?);
        if !device.caps().atomics {
            return Err(RdmaError::Unsupported {
                device: device.name().to_owned(),
                what: "it does not support RDMA atomics (compare-and-swap)".into(),
            });
        }
        let port = device.port(config.path.port())?;
        // Fail now, not per node, when no GID can work whatever the route.
        port.address(config.path.gid, None)?;
        let events = DeviceEvents::start(device.clone(), port.port)?;
        // How this device returns CAS results (mlx4 byte-swaps them): one chain
        // over a loopback connection, before any client relies on a CAS.
        let loopback_port = port.address(config.path.gid, None)?;
        let cas_reply = selftest::cas_byte_order(
            &mut DeviceLoopback::new(&device, loopback_port)?,
            device.name(),
        )?;
        if cas_reply != CasReplyOrder::Native {
            tracing::warn!(
                device = device.name(),
                ?cas_reply,
                "this device returns CAS results byte-swapped (as ConnectX-3 does); decoding them accordingly"
            );
        }
        let pins = IncarnationPins::new(config.nodes.len());
        Ok(Self {
            shared: Arc::new(Shared {
                events,
                device,
                port,
                config,
                cas_reply,
                pins,
            }),
        })
    }

    /// The device in use.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// Whether the device and its port are usable, as its asynchronous events last
    /// said ([`crate::verbs::events`]).
    pub fn port_usable(&self) -> bool {
        self.shared.events.health().is_usable()
    }

    /// How the device returns CAS results, as its self-test at open found.
    pub fn cas_reply_order(&self) -> CasReplyOrder {
        self.shared.cas_reply
    }

    /// Connects a new client handle (one per thread) to every memory node. A node
    /// whose incarnation is not the one pinned for this cluster handle (the first
    /// one any of its clients reached, [`reconnect::IncarnationPins`]) restarted with
    /// empty memory meanwhile: the new client leaves it out and reports its pinned
    /// memory lost ([`Fabric::memory_lost`]).
    pub fn client(&self) -> Result<RdmaFabric, RdmaError> {
        RdmaFabric::connect(&self.shared)
    }
}

/// What makes the client handles of one cluster, one per thread, each checked
/// against the incarnations the handle pinned ([`reconnect::IncarnationPins`]): a
/// process's [`RdmaCluster`] over verbs, or emulated memory nodes'
/// [`crate::emu::EmuTransport`] in tests. SWARM-KV's store is generic over it.
pub trait ClusterHandle: std::fmt::Debug + Send + Sync + 'static {
    /// What the clients run on.
    type Transport: Transport;

    /// Connects a new client handle (one per thread) to every memory node.
    fn client(&self) -> Result<RdmaFabric<Self::Transport>, RdmaError>;

    /// Node `index`'s bootstrap address, for messages (`"?"` out of range).
    fn node_addr(&self, index: usize) -> &str;

    /// How late, at most, a request may take effect after its post
    /// ([`RdmaConfig::delivery_bound_ns`]).
    fn delivery_bound_ns(&self) -> u64;
}

impl ClusterHandle for RdmaCluster {
    type Transport = VerbsTransport;

    fn client(&self) -> Result<RdmaFabric, RdmaError> {
        RdmaCluster::client(self)
    }

    fn node_addr(&self, index: usize) -> &str {
        self.shared
            .config
            .nodes
            .get(index)
            .map_or("?", String::as_str)
    }

    fn delivery_bound_ns(&self) -> u64 {
        self.shared.config.delivery_bound_ns()
    }
}

impl Shared {
    /// Queue pair settings of a client's connection through `port`.
    fn client_settings(&self, port: PortInfo) -> QpSettings {
        let caps = self.device.caps();
        QpSettings {
            role: Role::Client,
            port,
            send_depth: self.config.send_queue_depth.min(caps.max_qp_wr),
            max_inline: self.config.max_inline,
            responder_depth: 1,
            initiator_depth: caps.max_qp_init_rd_atom.max(1),
            ack_timeout: self.config.ack_timeout,
            retry_count: self.config.retry_count,
            traffic_class: self.config.path.traffic_class,
            service_level: self.config.path.service_level,
        }
    }
}

/// Verbs under an [`RdmaFabric`]: the process's device (shared by its clients) and
/// one client's completion queue, which its queue pairs (reconnected ones too)
/// report to.
#[derive(Debug)]
pub struct VerbsTransport {
    shared: Arc<Shared>,
    cq: Arc<CompletionQueue>,
}

impl Transport for VerbsTransport {
    type Nic = VerbsNic;
    type Qp = QueuePair;

    fn node_count(&self) -> usize {
        self.shared.config.nodes.len()
    }

    fn node_addr(&self, index: usize) -> &str {
        &self.shared.config.nodes[index]
    }

    fn bootstrap_timeout(&self) -> Duration {
        self.shared.config.bootstrap_timeout
    }

    fn connect_node(
        &self,
        index: usize,
        watch: Option<WatchRequest>,
    ) -> Result<Connected<QueuePair>, RdmaError> {
        let shared = &self.shared;
        let addr = self.node_addr(index);
        let port = shared
            .port
            .address(shared.config.path.gid, route_source(addr))?;
        let settings = shared.client_settings(port);
        let mut qp = QueuePair::new(self.cq.clone(), settings)?;
        let accepted = transport::bootstrap_node(
            addr,
            index,
            &shared.config.token,
            &qp.info(),
            shared.config.bootstrap_timeout,
            watch,
        )?;
        qp.connect(&accepted.qp)?;
        let limits = ChainLimits {
            max_inline: qp.max_inline(),
            max_message: shared.port.max_msg_sz,
            ordering: shared.config.ordering,
            cas_reply: shared.cas_reply,
        };
        Ok(Connected {
            link: NodeLink {
                region: RemoteRegion {
                    addr: accepted.region.addr,
                    rkey: accepted.region.rkey,
                    size: accepted.region.size,
                },
                limits,
                depth: settings.send_depth,
            },
            qp,
            known: Known {
                header: accepted.region.header,
                incarnation: accepted.region.incarnation,
            },
            stream: accepted.stream,
            session: accepted.session,
        })
    }

    fn replace_qp(nic: &mut VerbsNic, index: usize, qp: QueuePair) -> Option<QueuePair> {
        nic.replace_qp(index, qp)
    }

    fn health(&self) -> &DeviceHealth {
        self.shared.events.health()
    }

    fn pins(&self) -> &IncarnationPins {
        &self.shared.pins
    }
}

/// How one memory node looks to a client thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStatus {
    /// Connected and answering.
    Live,
    /// Failed; reconnect attempts are running in the background (posts to a node
    /// given up on are parked meanwhile, see [`engine`]).
    Reconnecting,
    /// Failed for good for this client: unreachable when it started, restarted
    /// with empty memory (a new incarnation), replaced by another node, or the
    /// device died.
    Retired,
}

/// A reconnect attempt running on its own thread.
type Attempt<Q> = mpsc::Receiver<Result<Connected<Q>, RdmaError>>;

/// One client thread's fabric over RDMA. `!Sync`: create one per thread with
/// [`RdmaCluster::client`]. `T` is what it runs on: verbs, or the emulated provider
/// in tests ([`transport`]).
#[derive(Debug)]
pub struct RdmaFabric<T: Transport = VerbsTransport> {
    inner: EngineFabric<T::Nic>,
    headers: Vec<Option<NodeHeader>>,
    incarnations: Vec<Option<u64>>,
    /// Bootstrap connections, held open while the queue pairs are in use: closing
    /// one tells that memory node to destroy its side.
    streams: RefCell<Vec<Option<(TcpStream, bootstrap::Session)>>>,
    /// The lease word memory nodes watch for this client, once asked
    /// ([`RdmaFabric::watch_lease_word`]); re-armed on every reconnect.
    watch: Cell<Option<WatchRequest>>,
    transport: Arc<T>,
    slots: RefCell<Vec<Slot<Attempt<T::Qp>>>>,
    /// Per node, the incarnation a configuration change admitted after this client
    /// connected ([`Fabric::admit`]): a reconnect then expects it instead of the one
    /// of the bootstrap.
    admitted: RefCell<Vec<Option<u64>>>,
    /// Per node, an incarnation whose memory is known gone ([`Fabric::memory_lost`]):
    /// a reconnect found the node restarted with another one, or the store declared
    /// it ([`RdmaFabric::declare_lost`]).
    lost: RefCell<Vec<Option<u64>>>,
    /// The device health generation last acted on.
    health_seen: Cell<u64>,
    /// When this client last posted a batch (fabric clock): after an idle gap, the
    /// next post first looks for cut notices ([`RdmaFabric::probe_cuts`]).
    last_post: Cell<Nanos>,
}

/// An idle gap after which the next post first checks whether memory nodes cut
/// this client off (a lease watch fires only after its stall time, at least
/// [`crate::lease_watch::MIN_STALL_NS`]).
pub const IDLE_PROBE_NS: Nanos = 50_000_000;

impl RdmaFabric<VerbsTransport> {
    fn connect(shared: &Arc<Shared>) -> Result<Self, RdmaError> {
        let config = &shared.config;
        let caps = shared.device.caps();
        let n = config.nodes.len();
        let depth = config.send_queue_depth.min(caps.max_qp_wr);
        let cq_entries = depth
            .checked_mul(n as u32)
            .ok_or_else(|| RdmaError::Config("send_queue_depth × nodes overflows".into()))?;
        let cq = Arc::new(CompletionQueue::new(shared.device.clone(), cq_entries)?);
        let staging_len = usize::try_from(config.staging_bytes)
            .map_err(|_| RdmaError::Config("staging_bytes exceeds the address space".into()))?;
        let staging = MemoryRegion::register(
            shared.device.clone(),
            Mapping::new(staging_len, false)?,
            Access::Local,
        )?;
        let transport = Arc::new(VerbsTransport {
            shared: shared.clone(),
            cq: cq.clone(),
        });
        // Twice the retry window: a chain still in flight then was lost by the NIC
        // (engine module docs).
        let warn_overdue_after = config.delivery_bound_ns().saturating_mul(2);
        Self::connect_all(transport, warn_overdue_after, |qps| {
            Ok(VerbsNic::new(qps, staging, cq))
        })
    }
}

impl<T: Transport> RdmaFabric<T> {
    /// Connects to every memory node of `transport` at once, its NIC made by
    /// `make_nic` from the queue pairs (`None`: node unreachable or left out), and
    /// warns about chains in flight for longer than `warn_overdue_after`. Fails
    /// without a majority of reachable nodes of one cluster.
    pub(crate) fn connect_all(
        transport: Arc<T>,
        warn_overdue_after: Nanos,
        make_nic: impl FnOnce(Vec<Option<T::Qp>>) -> Result<T::Nic, RdmaError>,
    ) -> Result<Self, RdmaError> {
        let n = transport.node_count();
        let mut qps = Vec::with_capacity(n);
        let mut links = Vec::with_capacity(n);
        let mut headers = Vec::with_capacity(n);
        let mut incarnations = Vec::with_capacity(n);
        let mut streams = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut lost = vec![None; n];
        let mut failures = Vec::new();
        // All nodes at once: an unreachable node costs one bootstrap timeout, not one
        // per node before it in the list.
        let results = in_parallel(n, |i| transport.connect_node(i, None));
        for (i, result) in results.into_iter().enumerate() {
            let addr = transport.node_addr(i);
            // A node that restarted since this cluster handle first reached it has
            // empty memory: left out like an unreachable one, its old memory lost.
            let result =
                result.and_then(|c| match transport.pins().check(i, c.known.incarnation) {
                    Ok(()) => Ok(c),
                    Err(pinned) => {
                        lost[i] = Some(pinned);
                        Err(RdmaError::Restarted {
                            peer: addr.to_owned(),
                            pinned,
                            found: c.known.incarnation,
                        })
                    }
                });
            match result {
                Ok(c) => {
                    qps.push(Some(c.qp));
                    links.push(Some(c.link));
                    headers.push(Some(c.known.header));
                    incarnations.push(Some(c.known.incarnation));
                    streams.push(Some((c.stream, c.session)));
                    slots.push(Slot::Live);
                }
                Err(error) => {
                    tracing::warn!(node = i, %addr, %error, "memory node unreachable; treated as failed");
                    failures.push(format!("node {i} ({addr}): {error}"));
                    qps.push(None);
                    links.push(None);
                    headers.push(None);
                    incarnations.push(None);
                    streams.push(None);
                    // Its incarnation is unknown: it may be a restarted, empty node.
                    slots.push(Slot::Retired);
                }
            }
        }
        // A minority whose header disagrees with the others' (a memory node started
        // with another cluster file) is left out like an unreachable one.
        for i in outliers(&headers) {
            let addr = transport.node_addr(i);
            tracing::warn!(node = i, %addr, "memory node belongs to another cluster (its header differs from the majority's); treated as failed");
            failures.push(format!(
                "node {i} ({addr}): its header differs from the other nodes' (another cluster file?)"
            ));
            qps[i] = None;
            links[i] = None;
            headers[i] = None;
            incarnations[i] = None;
            streams[i] = None;
            slots[i] = Slot::Retired;
        }
        let live = n - failures.len();
        let needed = n / 2 + 1;
        if live < needed {
            return Err(RdmaError::NoMajority {
                live,
                total: n,
                needed,
                failures: failures.join("; "),
            });
        }
        NodeHeader::check_reachable(&headers).map_err(|source| RdmaError::Cluster {
            nodes: (0..n)
                .map(|i| transport.node_addr(i))
                .collect::<Vec<_>>()
                .join(","),
            source,
        })?;
        let nic = make_nic(qps)?;
        Ok(Self {
            inner: EngineFabric::new(
                Engine::new(nic, links).warn_overdue_after(warn_overdue_after),
            ),
            headers,
            incarnations,
            streams: RefCell::new(streams),
            watch: Cell::new(None),
            health_seen: Cell::new(transport.health().generation()),
            transport,
            slots: RefCell::new(slots),
            admitted: RefCell::new(vec![None; n]),
            lost: RefCell::new(lost),
            last_post: Cell::new(0),
        })
    }

    /// The node headers read during the bootstrap (`None`: node unreachable).
    pub fn headers(&self) -> &[Option<NodeHeader>] {
        &self.headers
    }

    /// The memory nodes' incarnations learnt during the bootstrap (`None`: node
    /// unreachable). A memory node process draws a new one each time it starts, so a
    /// changed incarnation means the node lost its memory.
    pub fn incarnations(&self) -> &[Option<u64>] {
        &self.incarnations
    }

    /// Whether this client considers `node` failed.
    pub fn is_failed(&self, node: NodeId) -> bool {
        self.inner.engine().is_dead(node)
    }

    /// Nodes this client gave up on because their queue pair held a chain (see
    /// [`engine`]'s module docs), so far.
    pub fn lost_chain_failures(&self) -> u64 {
        self.inner.engine().lost_chain_failures()
    }

    /// What parking posts to nodes given up on did so far (see
    /// [`engine`]'s module docs).
    pub fn park_stats(&self) -> engine::ParkStats {
        self.inner.engine().park_stats()
    }

    /// Gives up on `node`'s queue pair now, as the engine does when it holds a chain
    /// too long: for tests, which cannot make a device hold one. The node is
    /// reconnected at once and posts to it are parked meanwhile.
    #[doc(hidden)]
    pub fn give_up_on(&self, node: NodeId) {
        self.inner.engine().give_up_on(node);
    }

    /// Records that the memory of `node`'s incarnation `incarnation` is gone: the
    /// store found the node running another incarnation when it opened (a memory
    /// node process keeps its memory only while it runs).
    pub fn declare_lost(&self, node: NodeId, incarnation: u64) {
        if let Some(slot) = self.lost.borrow_mut().get_mut(node.index()) {
            *slot = Some(incarnation);
        }
    }

    /// Takes `node` out of service for good on this client (its contents are
    /// unusable: say, it restarted with empty memory): batches to it fail at once
    /// and it is never reconnected.
    pub fn retire(&self, node: NodeId) {
        if let Some(slot) = self.slots.borrow_mut().get_mut(node.index()) {
            *slot = Slot::Retired;
        }
        self.inner.engine().fail_node(node);
    }

    /// Makes sure none of this client's requests takes effect on a memory node later
    /// than `margin_ns` after its post, as far as the NIC can be stopped: a chain
    /// still in flight shortly before the margin runs out is given up on (its queue
    /// pair aborted, its node failed and reconnected at once, later posts to it
    /// parked until then; see [`engine`]'s module docs), before the
    /// client posts anything else, since a post may wake a queue pair that holds
    /// requests. The give-up limit is also the longest parking window. A SWARM-KV store
    /// passes its cluster's delivery margin, which its recyclers wait for. The give-up
    /// comes one overdue scan ([`engine::OVERDUE_SCAN_NS`]: scans are that far apart)
    /// and the NIC's scheduling slack early. With a margin under the queue pairs'
    /// retry window a node that retries that long is failed, which such a cluster's
    /// margin requires anyway.
    pub fn bound_delivery(&self, margin_ns: Nanos) {
        let give_up = margin_ns
            .saturating_sub(engine::OVERDUE_SCAN_NS + SCHEDULING_SLACK_NS)
            .max(engine::OVERDUE_SCAN_NS);
        self.inner.engine().set_fail_overdue_after(give_up);
    }

    /// Asks every live memory node to watch this client's lease word (an 8-byte
    /// word at `request.offset` of each node's memory, [`crate::lease_watch`]) and to
    /// cut the client off once it is killed (bit 63) or unchanged for
    /// `request.stall_ns`. Reconnects re-arm it. A node that refuses or does not
    /// answer is failed (and retried in the background, which re-arms the watch).
    /// Returns how many nodes watch the word now.
    pub fn watch_lease_word(&self, request: WatchRequest) -> usize {
        self.watch.set(Some(request));
        let mut armed = 0;
        let mut streams = self.streams.borrow_mut();
        for (index, entry) in streams.iter_mut().enumerate() {
            let node = NodeId(index as u16);
            let Some((stream, session)) = entry else {
                continue;
            };
            if self.inner.engine().is_dead(node) {
                continue;
            }
            let addr = self.transport.node_addr(index);
            let timeout = self.transport.bootstrap_timeout();
            match transport::request_watch(stream, session, addr, request, timeout) {
                Ok(()) => armed += 1,
                Err(error) => {
                    tracing::warn!(%node, %error, "memory node did not arm the lease watch; treating it as failed");
                    self.inner.engine().fail_node(node);
                }
            }
        }
        armed
    }

    /// Asks every memory node this client may use again to revoke the clients fenced
    /// under `request.offset` up to `request.floor` ([`crate::lease_watch`],
    /// "Revocation"), all nodes at once, each within the bootstrap timeout. A node
    /// whose memory this client knows lost is not asked until a configuration
    /// admits another incarnation of it ([`Fabric::admit`]): its process restarted,
    /// so the revoked client's queue pairs to the lost incarnation are gone, and the
    /// one running now holds no store (nobody fences on it) until a repair rebuilds
    /// it and a configuration admits it. A node rebuilt and admitted serves again,
    /// and a revoked client may have fenced itself on it: it is asked (and reported
    /// silent until this client has connected to it). Returns the nodes that did not
    /// acknowledge: with the word they hold if
    /// it is not killed there, `None` if they did not answer (their bootstrap
    /// connection is then failed, and the node reconnected in the background).
    /// Blocks the calling thread (this client's, which is registering or evicting:
    /// `swarm_core::fabric::OwnerFence`, "Where a revocation blocks") for one
    /// bootstrap timeout at most; other clients have fabrics of their own.
    pub fn revoke_lease_word(&self, request: RevokeRequest) -> Vec<(NodeId, Option<u64>)> {
        let timeout = self.transport.bootstrap_timeout();
        let admitted = self.admitted.borrow();
        let lost: Vec<bool> = self
            .lost
            .borrow()
            .iter()
            .enumerate()
            .map(|(i, lost)| lost.is_some() && (admitted[i].is_none() || admitted[i] == *lost))
            .collect();
        drop(admitted);
        let mut streams = self.streams.borrow_mut();
        let transport = &self.transport;
        let answers: Vec<(NodeId, Result<u64, Option<RdmaError>>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = streams
                .iter_mut()
                .enumerate()
                .filter(|(index, _)| !lost.get(*index).copied().unwrap_or(false))
                .map(|(index, entry)| {
                    let addr = transport.node_addr(index);
                    let handle = scope.spawn(move || match entry {
                        None => Err(None),
                        Some((stream, session)) => {
                            transport::request_revoke(stream, session, addr, request, timeout)
                                .map_err(Some)
                        }
                    });
                    (NodeId(index as u16), handle)
                })
                .collect();
            handles
                .into_iter()
                .map(|(node, handle)| (node, handle.join().unwrap_or(Err(None))))
                .collect()
        });
        drop(streams);
        let mut missing = Vec::new();
        for (node, answer) in answers {
            match answer {
                Ok(word) if word & KILLED != 0 => {}
                Ok(word) => missing.push((node, Some(word))),
                Err(error) => {
                    if let Some(error) = error {
                        tracing::warn!(%node, %error, "memory node did not acknowledge a revocation; treating it as failed");
                        self.inner.engine().fail_node(node);
                    }
                    missing.push((node, None));
                }
            }
        }
        missing
    }

    /// Runs `f` on this client's NIC: for tests, which hold or release an emulated
    /// queue pair's requests ([`crate::emu::EmuNic::set_mode`]).
    #[doc(hidden)]
    pub fn with_nic<R>(&self, f: impl FnOnce(&mut T::Nic) -> R) -> R {
        f(self.inner.engine().nic_mut())
    }

    /// Fails, now, every live node whose bootstrap connection shows that it cut this
    /// client off (a refusal waiting, or the connection closed): the memory node
    /// destroyed the queue pair, so a batch posted on it would only fail after the
    /// queue pair's whole retry window ([`RdmaConfig::delivery_bound_ns`]), and the
    /// reconnect that revives it would start that much later. One non-blocking
    /// `peek` per node; nothing is consumed ([`RdmaFabric::cut_reason`] reads the
    /// refusal when the failure is handled). Called by the first post after an idle
    /// gap of [`IDLE_PROBE_NS`]: an idle client is the one a lease watch cuts.
    /// Returns how many nodes it failed.
    fn probe_cuts(&self) -> usize {
        let mut failed = 0;
        let streams = self.streams.borrow();
        for (index, entry) in streams.iter().enumerate() {
            let node = NodeId(index as u16);
            let Some((stream, _)) = entry else {
                continue;
            };
            if !self.inner.engine().is_dead(node) && has_spoken(stream) {
                tracing::debug!(%node, "memory node closed this idle client's connection");
                self.inner.engine().fail_node(node);
                failed += 1;
            }
        }
        failed
    }

    /// Why node `index` cut this client off, if it said so before closing the
    /// bootstrap connection (read without blocking).
    fn cut_reason(&self, index: usize) -> Option<RefuseReason> {
        let mut streams = self.streams.borrow_mut();
        let (stream, session) = streams.get_mut(index)?.as_mut()?;
        stream.set_nonblocking(true).ok()?;
        let reason = session.read_refusal(stream);
        let _ = stream.set_nonblocking(false);
        reason
    }

    /// Where `node` stands for this client.
    pub fn node_status(&self, node: NodeId) -> NodeStatus {
        if !self.inner.engine().is_dead(node) {
            return NodeStatus::Live;
        }
        match self.slots.borrow().get(node.index()) {
            Some(Slot::Retired) | None => NodeStatus::Retired,
            Some(_) => NodeStatus::Reconnecting,
        }
    }

    /// Acts on device events (one atomic load when nothing happened): a port that
    /// went down fails every node now instead of letting batches hang; a fatal
    /// device error retires every node.
    fn watch_health(&self) {
        let health = self.transport.health();
        let generation = health.generation();
        if generation == self.health_seen.get() {
            return;
        }
        self.health_seen.set(generation);
        if health.is_usable() {
            // The port is back: try failed nodes now rather than after their backoff.
            let now = Instant::now();
            for slot in self.slots.borrow_mut().iter_mut() {
                if let Slot::Waiting { at, .. } = slot {
                    *at = now;
                }
            }
            return;
        }
        self.inner.engine().kill_all();
        if health.is_fatal() {
            for slot in self.slots.borrow_mut().iter_mut() {
                *slot = Slot::Retired;
            }
        }
    }

    /// Moves failed nodes along their reconnect path (see [`reconnect`]); cheap
    /// when every node is live.
    fn reconnect_failed(&self) {
        if !self.inner.engine().any_dead() {
            return;
        }
        let now = Instant::now();
        let usable = self.transport.health().is_usable();
        let mut slots = self.slots.borrow_mut();
        for (index, slot) in slots.iter_mut().enumerate() {
            let node = NodeId(index as u16);
            if !self.inner.engine().is_dead(node) {
                continue;
            }
            *slot = match std::mem::replace(slot, Slot::Retired) {
                Slot::Retired => Slot::Retired,
                Slot::Live => match self.cut_reason(index) {
                    Some(reason) => {
                        tracing::warn!(
                            %node,
                            %reason,
                            "memory node cut this client off; reconnecting in the background"
                        );
                        // The node is up (it just told us so): reconnect at once. A
                        // killed lease is refused then, and the node retired.
                        Slot::Waiting {
                            at: now,
                            backoff: reconnect::FIRST_RETRY,
                        }
                    }
                    None if self.inner.engine().is_parked(node) => {
                        tracing::info!(
                            %node,
                            "gave up on a queue pair of a memory node believed alive; \
                             reconnecting at once, posts to it parked meanwhile"
                        );
                        // Only the queue pair held a chain: the node is up, so no
                        // backoff (as after a cut notice), and parked operations wait.
                        Slot::Waiting {
                            at: now,
                            backoff: reconnect::FIRST_RETRY,
                        }
                    }
                    None => {
                        tracing::info!(%node, "memory node failed; reconnecting in the background");
                        Slot::failed(now)
                    }
                },
                Slot::Waiting { at, backoff } if now < at || !usable => {
                    Slot::Waiting { at, backoff }
                }
                Slot::Waiting { backoff, .. } => {
                    let (tx, rx) = mpsc::channel();
                    let transport = self.transport.clone();
                    let watch = self.watch.get();
                    let spawned = std::thread::Builder::new()
                        .name("swarm-rdma-reconnect".into())
                        .spawn(move || {
                            let _ = tx.send(transport.connect_node(index, watch));
                        });
                    match spawned {
                        Ok(_) => Slot::Trying {
                            attempt: rx,
                            backoff,
                        },
                        Err(_) => {
                            self.stop_parking(node, "could not start a reconnect attempt");
                            Slot::retry_later(now, backoff)
                        }
                    }
                }
                Slot::Trying { attempt, backoff } => match attempt.try_recv() {
                    Err(mpsc::TryRecvError::Empty) => Slot::Trying { attempt, backoff },
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.stop_parking(node, "the reconnect attempt died");
                        Slot::retry_later(now, backoff)
                    }
                    Ok(Err(
                        error @ RdmaError::Refused {
                            reason: RefuseReason::LeaseExpired,
                            ..
                        },
                    )) => {
                        tracing::warn!(%node, %error, "memory node refuses this client for good");
                        Slot::Retired
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%node, %error, "reconnect attempt failed; retrying later");
                        self.stop_parking(node, "the reconnect attempt failed");
                        Slot::retry_later(now, backoff)
                    }
                    Ok(Ok(connected)) => self.reinstate(node, connected),
                },
            };
            if matches!(slot, Slot::Retired) {
                self.stop_parking(node, "the memory node is retired");
            }
        }
    }

    /// Ends `node`'s parking window in failure, if it has one (engine module docs).
    fn stop_parking(&self, node: NodeId, why: &str) {
        self.inner.engine().stop_parking(node, why);
    }

    /// Puts a reconnected node back in service if it is the same process (same
    /// incarnation) as before.
    fn reinstate(&self, node: NodeId, connected: Connected<T::Qp>) -> Slot<Attempt<T::Qp>> {
        let admitted = self.admitted.borrow().get(node.index()).copied().flatten();
        let known = match admitted {
            // A rebuilt node, admitted by a configuration change: any header of this
            // cluster for this node id, and exactly the admitted incarnation.
            Some(incarnation) => {
                let Some(reference) = self.headers.iter().flatten().next().copied() else {
                    return Slot::Retired;
                };
                let theirs = connected.known.header;
                let identity =
                    |h: &NodeHeader| (h.cluster_id, h.node_count, h.epoch_unix_ns, h.tick_ns);
                let ours = theirs.node_id == node.0 && identity(&theirs) == identity(&reference);
                Known {
                    header: if ours { theirs } else { reference },
                    incarnation,
                }
            }
            None => {
                let Some(Some(header)) = self.headers.get(node.index()) else {
                    return Slot::Retired;
                };
                let Some(Some(incarnation)) = self.incarnations.get(node.index()) else {
                    return Slot::Retired;
                };
                Known {
                    header: *header,
                    incarnation: *incarnation,
                }
            }
        };
        match judge(&known, &connected.known.header, connected.known.incarnation) {
            Verdict::Same => {
                let Connected {
                    qp,
                    link,
                    stream,
                    session,
                    ..
                } = connected;
                let mut engine = self.inner.engine();
                // The old queue pair is destroyed here, before the engine releases
                // the staging of its chains.
                drop(T::replace_qp(engine.nic_mut(), node.index(), qp));
                engine.revive(node, link);
                // Closing the old bootstrap connection lets the node destroy its end.
                self.streams.borrow_mut()[node.index()] = Some((stream, session));
                if admitted.is_some() {
                    // Later clients of this cluster handle may use it from the start.
                    self.transport.pins().admit(node.index(), known.incarnation);
                }
                tracing::info!(%node, "memory node reconnected (same incarnation)");
                Slot::Live
            }
            Verdict::Restarted { old, new } => {
                // A memory node keeps its memory only while its process runs.
                self.declare_lost(node, old);
                tracing::warn!(
                    %node,
                    old = format_args!("{old:#018x}"),
                    new = format_args!("{new:#018x}"),
                    "memory node restarted with empty memory (new incarnation): it is not used again until it is repaired"
                );
                Slot::Retired
            }
            Verdict::Other => {
                tracing::warn!(%node, "another memory node answers at this node's address; it is not used");
                Slot::Retired
            }
        }
    }
}

/// Whether the memory node behind a bootstrap connection sent something or closed
/// it, without consuming anything or blocking. On a connection the node keeps open
/// nothing is ever waiting: the bootstrap exchange is over, and a watch or revocation
/// request is answered before [`RdmaFabric::watch_lease_word`] or
/// [`RdmaFabric::revoke_lease_word`] returns; so anything readable is
/// a cut notice (or the end of the connection). `false` if the socket cannot be
/// probed.
fn has_spoken(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let spoken = !matches!(
        stream.peek(&mut byte),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock
    );
    let _ = stream.set_nonblocking(false);
    spoken
}

/// The local IP address traffic to `addr` leaves from (the kernel's route; no packet
/// is sent), which names the GID to use on RoCE. `None` if it cannot be resolved:
/// the GID is then chosen without it, and the bootstrap reports the address.
fn route_source(addr: &str) -> Option<IpAddr> {
    let remote = addr.to_socket_addrs().ok()?.next()?;
    let any: SocketAddr = if remote.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(remote).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// The reachable nodes whose header does not describe the cluster that most
/// reachable nodes describe (cluster id, node count, timestamp epoch and tick). On a
/// tie nobody is an outlier: [`NodeHeader::check_reachable`] then refuses the lot.
fn outliers(headers: &[Option<NodeHeader>]) -> Vec<usize> {
    let key = |h: &NodeHeader| (h.cluster_id, h.node_count, h.epoch_unix_ns, h.tick_ns);
    let keys: Vec<_> = headers.iter().map(|h| h.as_ref().map(key)).collect();
    let count = |k| keys.iter().filter(|other| **other == Some(k)).count();
    let Some(best) = keys.iter().flatten().copied().max_by_key(|k| count(*k)) else {
        return Vec::new();
    };
    let reachable = keys.iter().flatten().count();
    if count(best) * 2 <= reachable {
        return Vec::new();
    }
    keys.iter()
        .enumerate()
        .filter(|(_, k)| k.is_some_and(|k| k != best))
        .map(|(i, _)| i)
        .collect()
}

/// `f(0)`, ..., `f(n - 1)`, each on its own thread, in index order.
fn in_parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..n).map(|i| scope.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl<T: Transport> Fabric for RdmaFabric<T> {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let now = self.inner.now();
        if now.saturating_sub(self.last_post.get()) >= IDLE_PROBE_NS && self.probe_cuts() > 0 {
            // Start the reconnects now rather than at the next progress.
            self.reconnect_failed();
        }
        self.last_post.set(now);
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket);
    }
    fn progress(&self) -> bool {
        self.watch_health();
        let more = self.inner.progress();
        self.reconnect_failed();
        more
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline);
    }
    fn yielded(&self) {
        self.inner.yielded();
    }

    /// Expects `incarnation` from `node` from now on and reconnects it in the
    /// background (the next [`Fabric::progress`] starts the attempt); the node serves
    /// once a reconnect finds exactly that incarnation. `true` if the node is in
    /// service with it already or a reconnect is scheduled; `false` (and nothing
    /// done) for an incarnation whose memory is known lost ([`Fabric::memory_lost`]).
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        let index = node.index();
        if index >= self.node_count() || self.memory_lost(node, incarnation) {
            // That incarnation's memory is gone for good: no node can serve it.
            return false;
        }
        let current = self.admitted.borrow()[index].or(self.incarnations[index]);
        let dead = self.inner.engine().is_dead(node);
        if current == Some(incarnation) && !dead {
            return true;
        }
        let mut slots = self.slots.borrow_mut();
        let reconnecting = matches!(slots[index], Slot::Waiting { .. } | Slot::Trying { .. });
        if current == Some(incarnation) && reconnecting {
            return true;
        }
        self.admitted.borrow_mut()[index] = Some(incarnation);
        if !dead {
            // Another incarnation's memory is not this node any more.
            self.inner.engine().fail_node(node);
        }
        slots[index] = Slot::Waiting {
            at: Instant::now(),
            backoff: reconnect::FIRST_RETRY,
        };
        tracing::info!(
            %node,
            incarnation = format_args!("{incarnation:#018x}"),
            "memory node admitted by a configuration change: connecting"
        );
        true
    }

    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.lost.borrow().get(node.index()).copied().flatten() == Some(incarnation)
    }

    /// Arms the memory nodes' lease watch on `fence.lease_word` for this client
    /// ([`RdmaFabric::watch_lease_word`]), with the stall time clamped to what a node
    /// accepts.
    fn fence_owner(&self, fence: OwnerFence) -> usize {
        self.watch_lease_word(WatchRequest {
            offset: fence.lease_word,
            stall_ns: fence.stall_ns.clamp(MIN_STALL_NS, MAX_STALL_NS),
            base: fence.base,
        })
    }

    /// [`RdmaFabric::revoke_lease_word`]: [`Revocation::Acknowledged`] once every
    /// node this client may use again acknowledged.
    fn revoke_owner(&self, lease_word: u64, floor: u64) -> Revocation {
        let missing = self.revoke_lease_word(RevokeRequest {
            offset: lease_word,
            floor,
        });
        if missing.is_empty() {
            Revocation::Acknowledged
        } else {
            Revocation::Incomplete(missing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(id: u16, count: u16) -> NodeHeader {
        NodeHeader {
            node_id: id,
            node_count: count,
            size: 1 << 20,
            cluster_id: 7,
            epoch_unix_ns: 1,
            tick_ns: 1000,
        }
    }

    #[test]
    fn headers_of_reachable_nodes_must_form_the_cluster() {
        let ok = [Some(header(0, 3)), None, Some(header(2, 3))];
        assert_eq!(NodeHeader::check_reachable(&ok), Ok(()));
        assert!(NodeHeader::check_reachable(&[None, None]).is_err());
        assert!(NodeHeader::check_reachable(&[Some(header(0, 3)), Some(header(1, 3))]).is_err());
        assert!(NodeHeader::check_reachable(&[Some(header(1, 2)), Some(header(0, 2))]).is_err());
        let mut other = header(1, 2);
        other.cluster_id = 8;
        assert!(NodeHeader::check_reachable(&[Some(header(0, 2)), Some(other)]).is_err());
        let mut other = header(1, 2);
        other.tick_ns = 1;
        assert!(NodeHeader::check_reachable(&[Some(header(0, 2)), Some(other)]).is_err());
    }

    #[test]
    fn the_delivery_bound_is_the_retry_window_plus_slack() {
        let mut config = RdmaConfig::new(vec![], Token::from_bytes([1; 32]));
        // 4.096 µs · 2^14 = 67.1 ms per try, 8 tries: 536.9 ms, and 10 ms of slack.
        assert_eq!(config.delivery_bound_ns(), 547_000_000);
        config.ack_timeout = 12;
        config.retry_count = 0;
        // 16.8 ms, one try.
        assert_eq!(config.delivery_bound_ns(), 27_000_000);
        config.ack_timeout = 31;
        config.retry_count = 7;
        assert!(config.delivery_bound_ns() > 60_000_000_000, "no overflow");
    }

    #[test]
    fn a_minority_of_foreign_headers_is_left_out() {
        let mut foreign = header(1, 3);
        foreign.cluster_id = 8;
        let headers = [Some(header(0, 3)), Some(foreign), Some(header(2, 3))];
        assert_eq!(outliers(&headers), vec![1]);
        let headers = [Some(header(0, 3)), Some(foreign), None];
        assert!(outliers(&headers).is_empty(), "a tie leaves nobody out");
        let headers = [Some(header(0, 3)), None, Some(header(2, 3))];
        assert!(outliers(&headers).is_empty());
        assert!(outliers(&[None, None]).is_empty());
    }

    #[test]
    fn the_route_names_the_local_address() {
        assert_eq!(
            route_source("127.0.0.1:7471"),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(route_source("no port"), None);
    }

    #[test]
    fn a_bootstrap_connection_has_spoken_once_the_node_writes_or_closes() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pair = || {
            let client = TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().unwrap();
            (client, server)
        };
        let settle = || std::thread::sleep(Duration::from_millis(50));
        // Open and quiet: nothing to say, and the probe does not block.
        let (client, server) = pair();
        assert!(!has_spoken(&client));
        // A refusal arrives: spoken, and still readable afterwards (peek only).
        let (mut client, mut server2) = (client, server);
        server2.write_all(b"R").unwrap();
        settle();
        assert!(has_spoken(&client));
        assert!(has_spoken(&client), "the probe consumed the notice");
        let mut byte = [0u8; 1];
        client.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"R");
        assert!(!has_spoken(&client));
        // The node closes the connection.
        drop(server2);
        settle();
        assert!(has_spoken(&client));
        // The stream is blocking again after a probe.
        let (mut client, server) = pair();
        assert!(!has_spoken(&client));
        client
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let started = Instant::now();
        assert!(client.read(&mut byte).is_err(), "nothing to read");
        assert!(
            started.elapsed() >= Duration::from_millis(90),
            "the read returned at once: the stream was left non-blocking"
        );
        drop(server);
    }

    #[test]
    fn nodes_are_connected_at_the_same_time() {
        // Every call waits until all have started: run one after the other, the
        // first would give up waiting and the test would fail.
        let started = std::sync::Mutex::new(0);
        let all = std::sync::Condvar::new();
        let results = in_parallel(5, |i| {
            let mut count = started.lock().unwrap();
            *count += 1;
            all.notify_all();
            let (count, timeout) = all
                .wait_timeout_while(count, Duration::from_secs(20), |c| *c < 5)
                .unwrap();
            assert!(
                !timeout.timed_out(),
                "call {i} ran alone ({} started)",
                *count
            );
            i * 10
        });
        assert_eq!(results, vec![0, 10, 20, 30, 40]);
    }

    #[test]
    fn config_is_validated_before_touching_the_device() {
        let token = Token::from_bytes([1; 32]);
        let mut config = RdmaConfig::new(vec!["a:1".into()], token.clone());
        assert!(config.validate().is_ok());
        config.send_queue_depth = 2;
        assert!(config.validate().is_err());
        let mut config = RdmaConfig::new(vec!["a:1".into()], token.clone());
        config.ack_timeout = 0;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("infinite"), "{error}");
        config.ack_timeout = 8;
        assert!(config.validate().is_ok(), "a short timeout only warns");
        let config = RdmaConfig::new(vec!["nope".into()], token.clone());
        assert!(matches!(
            RdmaCluster::open(config),
            Err(RdmaError::Config(_))
        ));
        let config = RdmaConfig::new(Vec::new(), token);
        assert!(matches!(
            RdmaCluster::open(config),
            Err(RdmaError::Config(_))
        ));
    }

    #[test]
    fn without_a_device_opening_fails_with_the_no_device_message() {
        if crate::verbs::device::device_names().is_ok() {
            println!("SKIPPED fabric no-device check: this machine has an RDMA device");
            return;
        }
        let config = RdmaConfig::new(vec!["127.0.0.1:7471".into()], Token::from_bytes([1; 32]));
        let error = RdmaCluster::open(config).unwrap_err();
        assert!(matches!(error, RdmaError::NoDevice { .. }), "{error}");
        assert!(
            error.to_string().starts_with("no RDMA device found: "),
            "{error}"
        );
    }
}
