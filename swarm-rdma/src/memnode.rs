//! The memory-node daemon (`swarm memnode`): passive memory served over RDMA.
//!
//! A SWARM memory node runs no protocol code (SWARM §2.1): it
//! allocates memory, writes the node header every transport shares
//! ([`swarm_core::header`]) at its start, registers it for remote READ, WRITE and
//! atomics, and accepts clients on a TCP port. For each authenticated client
//! ([`crate::bootstrap`]) it creates one RC queue pair; from then on the client's
//! one-sided verbs are served by the NIC alone and the daemon's threads sleep in
//! `accept`/`read` until a client leaves (its queue pair is then destroyed).
//!
//! One daemon thread does wake up: the **lease watch** ([`crate::lease_watch`],
//! [`crate::bootstrap`]). A SWARM-KV client names its lease word after claiming its
//! writer row; every 10 ms the node loads each watched word from its own memory (an
//! atomic load; no protocol logic, no knowledge of the KV layout) and destroys the
//! queue pair of a client whose word is killed or has stopped changing for the stall
//! time it asked for, then tells it why (`Refuse(LeaseExpired)`) and closes its
//! bootstrap connection. A hung or partitioned client that wakes up late then cannot
//! write through its old queue pair: defence in depth behind its self-fence.
//!
//! A reclaimer's **revocation** ([`crate::lease_watch`], "Revocation") arrives on its
//! own bootstrap connection and is served on that connection's thread: where the
//! named lease word is killed, the node destroys the queue pair of every client
//! watching it for a revoked generation, then acknowledges, and from then on refuses
//! to watch that generation again. A takeover waits for that acknowledgement from
//! every node, so it does not depend on the watch's period.
//!
//! Memory is zero-filled anonymous memory, on 2 MiB huge pages when the system has
//! them reserved (`vm.nr_hugepages`), normal pages otherwise. It is not persistent:
//! a restarted memory node comes back empty, with a new rkey, and clients that used
//! the old one see it as failed (SWARM tolerates that for a minority of nodes).
//!
//! **Device errors.** The daemon watches its device's asynchronous events
//! ([`crate::verbs::events`]), as clients do. While the port is down it refuses new
//! clients (`NoResources`: they retry). After a fatal device error no queue pair it
//! hands out can work, so it stops serving at once: it closes its listening socket
//! and every client connection (clients see the node fail and retry with backoff,
//! instead of looping on refusals), and [`Memnode::wait`] returns
//! [`RdmaError::DeviceFatal`], so that `swarm memnode` exits with an error (restart
//! it: its memory is gone anyway).
//!
//! On a machine without RDMA, [`Memnode::start`] fails first thing — before
//! allocating anything — with [`RdmaError::NoDevice`] ("no RDMA device found: ...").

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use swarm_core::header::{ENCODED_LEN, HEADER_SIZE, NodeHeader};

use crate::auth::Token;
use crate::bootstrap::{Acceptor, Server, ServerLimits};
use crate::config::{ClusterConfig, PathConfig, check_listen_address, parse_size};
use crate::error::RdmaError;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::device::{Device, PortInfo, open_device};
use crate::verbs::events::{DeviceEvents, DeviceHealth};
use crate::verbs::gid::GidChoice;
use crate::verbs::memory::{Access, Mapping, MemoryRegion};
use crate::verbs::qp::{QpSettings, QueuePair, Role};
use crate::wire::{QpInfo, RegionInfo};

/// Everything a memory node needs to start.
#[derive(Clone, Debug)]
pub struct MemnodeConfig {
    /// `ADDR:PORT` to accept bootstrap connections on.
    pub listen: String,
    /// Bytes of memory served, node header included (a multiple of 8, at least
    /// [`HEADER_SIZE`]).
    pub size: u64,
    /// RDMA device name; `None` for the first device.
    pub device: Option<String>,
    /// Device port, GID, traffic class and service level.
    pub path: PathConfig,
    /// The cluster token clients must prove they know.
    pub token: Token,
    /// This node's id in the cluster.
    pub node_id: u16,
    /// Nodes in the cluster.
    pub node_count: u16,
    /// The cluster's random id.
    pub cluster_id: u64,
    /// Unix time (ns) of timestamp tick 0.
    pub epoch_unix_ns: u64,
    /// Timestamp tick length (ns).
    pub tick_ns: u64,
    /// Try huge pages first.
    pub huge_pages: bool,
    /// Bootstrap timeouts and client limit.
    pub limits: ServerLimits,
}

impl MemnodeConfig {
    /// The configuration of the node listening on `listen` in `cluster` (its node id
    /// is its position in the cluster's node list), loading the token file.
    pub fn from_cluster(
        cluster: &ClusterConfig,
        listen: &str,
        size: u64,
        device: Option<String>,
    ) -> Result<Self, RdmaError> {
        Ok(Self {
            listen: listen.to_owned(),
            size,
            device,
            path: cluster.path,
            token: Token::load(&cluster.token_file)?,
            node_id: cluster.node_id(listen)?,
            // At most u16::MAX nodes: checked when the cluster file was parsed.
            node_count: cluster.nodes.len() as u16,
            cluster_id: cluster.cluster_id,
            epoch_unix_ns: cluster.epoch_unix_ns,
            tick_ns: cluster.tick_ns,
            huge_pages: true,
            limits: ServerLimits::default(),
        })
    }

    /// The header this node writes at offset 0.
    pub fn header(&self) -> NodeHeader {
        NodeHeader {
            node_id: self.node_id,
            node_count: self.node_count,
            size: self.size,
            cluster_id: self.cluster_id,
            epoch_unix_ns: self.epoch_unix_ns,
            tick_ns: self.tick_ns,
        }
    }

    /// Checks the configuration without touching any device.
    pub fn validate(&self) -> Result<(), RdmaError> {
        check_listen_address(&self.listen)?;
        self.path.validate()?;
        if self.size < 2 * HEADER_SIZE || !self.size.is_multiple_of(8) {
            return Err(RdmaError::Config(format!(
                "memory node size {} is invalid: it must be a multiple of 8 bytes and at least {} bytes",
                self.size,
                2 * HEADER_SIZE
            )));
        }
        if usize::try_from(self.size).is_err() {
            return Err(RdmaError::Config(
                "memory node size exceeds the address space".into(),
            ));
        }
        self.header()
            .validate()
            .map_err(|e| RdmaError::Config(format!("cluster parameters: {e}")))
    }
}

/// The daemon's side of accepting a client: a new queue pair, connected and ready.
#[derive(Debug)]
struct VerbsAcceptor {
    cq: Arc<CompletionQueue>,
    settings: QpSettings,
    region: RegionInfo,
    /// The served memory, for the lease watch's reads.
    memory: Arc<MemoryRegion>,
    /// The device's health: no queue pairs while it is unusable.
    health: Arc<DeviceHealth>,
}

impl Acceptor for VerbsAcceptor {
    type Connection = QueuePair;

    fn region(&self) -> RegionInfo {
        self.region
    }

    fn accept(&self, client: &QpInfo) -> Result<(QpInfo, QueuePair), RdmaError> {
        check_health(&self.health, &self.region)?;
        let mut qp = QueuePair::new(self.cq.clone(), self.settings)?;
        qp.connect(client)?;
        Ok((qp.info(), qp))
    }

    fn read_word(&self, offset: u64) -> Option<u64> {
        self.memory.memory().load_u64(offset)
    }
}

/// Refuses new queue pairs while the device is unusable (the client is told
/// `NoResources` and retries).
fn check_health(health: &DeviceHealth, region: &RegionInfo) -> Result<(), RdmaError> {
    if health.is_usable() {
        return Ok(());
    }
    Err(RdmaError::Config(format!(
        "memory node {} cannot create queue pairs: its RDMA device {}",
        region.header.node_id,
        if health.is_fatal() {
            "had a fatal error"
        } else {
            "port is down"
        }
    )))
}

/// How often [`Memnode::wait`] looks at the device's health.
const HEALTH_CHECK: Duration = Duration::from_millis(100);

/// Serves with `server` until `health` reports a fatal device error, then stops
/// serving (no more bootstraps; every client disconnected, its queue pair destroyed)
/// and says so. Returns only then.
fn serve_until_fatal(server: Server, health: &DeviceHealth, device: &str) -> RdmaError {
    while !health.is_fatal() {
        std::thread::sleep(HEALTH_CHECK);
    }
    tracing::error!(
        device,
        "RDMA device fatal error: the memory node stops serving (restart it; its memory is lost)"
    );
    server.shutdown();
    RdmaError::DeviceFatal {
        device: device.to_owned(),
    }
}

/// A fresh random incarnation (never zero).
fn new_incarnation() -> Result<u64, RdmaError> {
    loop {
        let bytes = crate::auth::random_bytes::<8>()
            .map_err(|e| RdmaError::io("cannot draw the memory node's incarnation", e))?;
        let incarnation = u64::from_le_bytes(bytes);
        if incarnation != 0 {
            return Ok(incarnation);
        }
    }
}

/// A running memory node.
#[derive(Debug)]
pub struct Memnode {
    // Drop order: stop serving (clients disconnect, their QPs go), then deregister
    // and unmap the memory, then close the device.
    server: Server,
    region: RegionInfo,
    port: PortInfo,
    huge_pages: bool,
    _memory: Arc<MemoryRegion>,
    events: DeviceEvents,
    device: Arc<Device>,
}

impl Memnode {
    /// Opens the device, allocates and registers the memory, writes the node header
    /// and starts accepting clients. Returns once the node is serving.
    pub fn start(config: MemnodeConfig) -> Result<Self, RdmaError> {
        config.validate()?;
        let device = Arc::new(open_device(config.device.as_deref())?);
        let caps = device.caps();
        if !caps.atomics {
            return Err(RdmaError::Unsupported {
                device: device.name().to_owned(),
                what: "it does not support RDMA atomics (compare-and-swap)".into(),
            });
        }
        if config.size > caps.max_mr_size {
            return Err(RdmaError::Unsupported {
                device: device.name().to_owned(),
                what: format!(
                    "it registers at most {} bytes per region; lower --size",
                    caps.max_mr_size
                ),
            });
        }
        // The GID of the address clients reach us on; on a wildcard address, the
        // first RoCE v2 IPv4 GID (a multi-homed host then needs --gid-index).
        let listen_ip = config
            .listen
            .parse::<SocketAddr>()
            .ok()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        let port = device
            .port(config.path.port())?
            .address(config.path.gid, listen_ip)?;
        let header = config.header();
        // Checked by validate(): the size fits in usize.
        let mut memory = Mapping::new(config.size as usize, config.huge_pages)?;
        let huge_pages = memory.huge_pages();
        if let Some(bytes) = memory.slice_mut(0, ENCODED_LEN) {
            bytes.copy_from_slice(&header.encode());
        }
        let memory = Arc::new(MemoryRegion::register(
            device.clone(),
            memory,
            Access::Remote,
        )?);
        let region = RegionInfo {
            addr: memory.memory().addr(),
            rkey: memory.rkey(),
            size: config.size,
            header,
            incarnation: new_incarnation()?,
        };
        let cq = Arc::new(CompletionQueue::new(device.clone(), 16)?);
        let events = DeviceEvents::start(device.clone(), port.port)?;
        let acceptor = VerbsAcceptor {
            health: events.health().clone(),
            cq,
            settings: QpSettings {
                role: Role::MemoryNode,
                port,
                send_depth: 1,
                max_inline: 0,
                responder_depth: caps.max_qp_rd_atom.max(1),
                initiator_depth: 1,
                ack_timeout: 14,
                retry_count: 7,
                traffic_class: config.path.traffic_class,
                service_level: config.path.service_level,
            },
            region,
            memory: memory.clone(),
        };
        let listener = TcpListener::bind(&config.listen).map_err(|e| {
            RdmaError::io(
                format!(
                    "cannot listen on {} (is another memory node using the port?)",
                    config.listen
                ),
                e,
            )
        })?;
        let server = Server::start(listener, config.token.clone(), acceptor, config.limits)?;
        tracing::info!(
            listen = %server.local_addr(),
            device = device.name(),
            node = header.node_id,
            nodes = header.node_count,
            bytes = config.size,
            huge_pages,
            incarnation = format_args!("{:#018x}", region.incarnation),
            gid_index = port.gid_index,
            token = %config.token.fingerprint(),
            "memory node serving"
        );
        Ok(Self {
            server,
            region,
            port,
            huge_pages,
            _memory: memory,
            events,
            device,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// What clients are told about the memory.
    pub fn region(&self) -> RegionInfo {
        self.region
    }

    /// The port and GID queue pairs use.
    pub fn port(&self) -> PortInfo {
        self.port
    }

    /// Whether huge pages back the memory.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The device serving the memory.
    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    /// Disconnects every client (destroying its queue pair) and keeps serving, as
    /// a memory node that evicts its clients would; they reconnect on their own.
    /// Returns how many were connected.
    pub fn disconnect_clients(&self) -> usize {
        self.server.disconnect_clients()
    }

    /// Serves until the device has a fatal error (see the module docs, "Device
    /// errors"), then stops serving and returns [`RdmaError::DeviceFatal`]; never
    /// returns otherwise.
    pub fn wait(self) -> Result<(), RdmaError> {
        let Self {
            server,
            events,
            device,
            ..
        } = self;
        Err(serve_until_fatal(server, events.health(), device.name()))
    }

    /// Disconnects every client and releases the memory.
    pub fn shutdown(self) {
        let Self { server, .. } = self;
        server.shutdown();
    }
}

/// What a memory node is started with, as given on its command line (`swarm memnode`'s
/// flags, parsed by the `swarm` command): its address and size, the cluster file that
/// names it, and the device path's overrides. [`MemnodeOptions::config`] resolves it
/// into a [`MemnodeConfig`]; [`serve`] runs it.
#[derive(Clone, Debug)]
pub struct MemnodeOptions {
    /// Address to accept clients on (must be listed in the cluster file).
    pub listen: String,
    /// Memory to serve, e.g. `4GiB` (see [`parse_size`]).
    pub size: String,
    /// RDMA device (default: the first one).
    pub device: Option<String>,
    /// The cluster file written by `swarm init --rdma` (default: `swarm-cluster.conf`).
    pub cluster: PathBuf,
    /// Device port (default: the cluster file's, or 1).
    pub port: Option<u8>,
    /// GID table index, or auto (default: the cluster file's, or auto: the RoCE v2
    /// GID of the `listen` address).
    pub gid_index: Option<GidChoice>,
}

impl MemnodeOptions {
    /// The cluster file's name when none is given.
    pub const DEFAULT_CLUSTER_FILE: &'static str = "swarm-cluster.conf";

    /// A node listening on `listen` and serving `size` (e.g. `4GiB`), with the cluster
    /// file `swarm-cluster.conf` and no override of device, port or GID.
    pub fn new(listen: impl Into<String>, size: impl Into<String>) -> Self {
        Self {
            listen: listen.into(),
            size: size.into(),
            device: None,
            cluster: PathBuf::from(Self::DEFAULT_CLUSTER_FILE),
            port: None,
            gid_index: None,
        }
    }

    /// The node's configuration: the cluster file's, for the node at `listen`.
    pub fn config(&self) -> Result<MemnodeConfig, RdmaError> {
        let cluster = ClusterConfig::load(&self.cluster)?;
        let mut config = MemnodeConfig::from_cluster(
            &cluster,
            &self.listen,
            parse_size(&self.size)?,
            self.device.clone(),
        )?;
        config.path = config.path.overridden_by(self.port, self.gid_index);
        Ok(config)
    }
}

/// Runs a memory node until the process ends: what `swarm memnode` calls. Says on
/// standard error what it serves once it accepts clients. Returns only on a setup
/// failure (no device, bad configuration, port in use, ...) or a fatal device error
/// ([`Memnode::wait`]).
pub fn serve(options: &MemnodeOptions) -> Result<(), RdmaError> {
    let config = options.config()?;
    let (id, count) = (config.node_id, config.node_count);
    let node = Memnode::start(config)?;
    eprintln!(
        "memory node {id} of {count}: serving {} on {} from {} port {} GID index {} \
         (huge pages: {}, incarnation {:#018x}); Ctrl-C to stop",
        options.size,
        node.local_addr(),
        node.device_name(),
        node.port().port,
        node.port().gid_index,
        node.huge_pages(),
        node.region().incarnation,
    );
    node.wait()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MemnodeConfig {
        MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 1 << 20,
            device: None,
            path: PathConfig::default(),
            token: Token::from_bytes([7; 32]),
            node_id: 0,
            node_count: 3,
            cluster_id: 42,
            epoch_unix_ns: 1,
            tick_ns: 1000,
            huge_pages: true,
            limits: ServerLimits::default(),
        }
    }

    #[test]
    fn bad_configurations_are_refused_before_any_device_work() {
        type Mutation = fn(&mut MemnodeConfig);
        let cases: [(&str, Mutation); 5] = [
            ("listen", |c| c.listen = "nowhere".into()),
            ("size", |c| c.size = 100),
            ("size", |c| c.size = (1 << 20) + 1),
            ("node id", |c| c.node_id = 3),
            ("tick", |c| c.tick_ns = 0),
        ];
        for (what, mutate) in cases {
            let mut c = config();
            mutate(&mut c);
            let error = Memnode::start(c).unwrap_err();
            assert!(matches!(error, RdmaError::Config(_)), "{what}: {error}");
        }
    }

    #[test]
    fn without_a_device_the_node_fails_early_with_the_no_device_message() {
        if crate::verbs::device::device_names().is_ok() {
            println!("SKIPPED memnode no-device check: this machine has an RDMA device");
            return;
        }
        // 1 TiB: the device check must come before the allocation.
        let mut c = config();
        c.size = 1 << 40;
        let error = Memnode::start(c).map(drop).unwrap_err();
        assert!(matches!(error, RdmaError::NoDevice { .. }), "{error}");
        assert!(
            error.to_string().starts_with("no RDMA device found: "),
            "{error}"
        );
    }

    #[test]
    fn cluster_files_give_the_node_its_header() {
        let dir = std::env::temp_dir().join(format!("swarm-rdma-memnode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = Token::generate().unwrap();
        token.write(&dir.join("swarm.token"), true).unwrap();
        let cluster = ClusterConfig {
            nodes: vec!["10.0.0.1:7471".into(), "10.0.0.2:7471".into()],
            cluster_id: 9,
            epoch_unix_ns: 5,
            tick_ns: 1000,
            token_file: dir.join("swarm.token"),
            path: PathConfig::default(),
        };
        let c = MemnodeConfig::from_cluster(&cluster, "10.0.0.2:7471", 1 << 30, None).unwrap();
        assert_eq!(c.token, token);
        assert_eq!(
            c.header(),
            NodeHeader {
                node_id: 1,
                node_count: 2,
                size: 1 << 30,
                cluster_id: 9,
                epoch_unix_ns: 5,
                tick_ns: 1000
            }
        );
        assert!(MemnodeConfig::from_cluster(&cluster, "10.0.0.3:7471", 1 << 30, None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An acceptor without a device that refuses like [`VerbsAcceptor`] while the
    /// device is unusable.
    struct Healthy {
        health: Arc<DeviceHealth>,
        region: RegionInfo,
    }

    impl Acceptor for Healthy {
        type Connection = ();

        fn region(&self) -> RegionInfo {
            self.region
        }

        fn accept(&self, client: &QpInfo) -> Result<(QpInfo, ()), RdmaError> {
            check_health(&self.health, &self.region)?;
            Ok((*client, ()))
        }
    }

    #[test]
    fn a_fatal_device_error_stops_the_node_serving_and_ends_wait_with_an_error() {
        use crate::bootstrap::connect;
        use crate::verbs::events::EventEffect;
        use crate::wire::RefuseReason;

        let token = Token::generate().unwrap();
        let health = Arc::new(DeviceHealth::new(1));
        let region = RegionInfo {
            addr: 0x1000,
            rkey: 1,
            size: 1 << 20,
            header: config().header(),
            incarnation: 7,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let acceptor = Healthy {
            health: health.clone(),
            region,
        };
        let server =
            Server::start(listener, token.clone(), acceptor, ServerLimits::default()).unwrap();
        let qp = QpInfo {
            lid: 0,
            gid: [0; 16],
            qpn: 1,
            psn: 1,
            mtu: 5,
            max_rd_atomic: 1,
        };
        let timeout = Duration::from_secs(5);
        let client = connect(&addr, &token, &qp, timeout).expect("a healthy node serves");
        // Port down: new clients are refused (and retry); the node keeps serving.
        health.record(EventEffect::PortDown(1));
        let refused = connect(&addr, &token, &qp, timeout).unwrap_err();
        assert!(
            matches!(
                refused,
                RdmaError::Refused {
                    reason: RefuseReason::NoResources,
                    ..
                }
            ),
            "{refused}"
        );
        health.record(EventEffect::PortUp(1));
        drop(connect(&addr, &token, &qp, timeout).expect("the port is back"));
        // Fatal: wait returns with the error, the connected client is cut and the
        // node accepts nobody any more.
        let waiter = {
            let health = health.clone();
            std::thread::spawn(move || serve_until_fatal(server, &health, "emu0"))
        };
        health.record(EventEffect::DeviceFatal);
        let error = waiter.join().unwrap();
        assert!(matches!(error, RdmaError::DeviceFatal { .. }), "{error}");
        let mut stream = client.stream;
        stream.set_read_timeout(Some(timeout)).unwrap();
        let mut byte = [0u8; 1];
        assert!(
            matches!(std::io::Read::read(&mut stream, &mut byte), Ok(0) | Err(_)),
            "the client's connection outlived a fatal device error"
        );
        assert!(connect(&addr, &token, &qp, timeout).is_err());
    }
}
