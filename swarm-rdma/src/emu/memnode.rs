//! Emulated memory node processes: the real bootstrap server ([`crate::bootstrap`],
//! authenticated, on loopback TCP) in front of an [`EmuNode`], handing out emulated
//! queue pairs and the node's incarnation, so that clients connect, reconnect and
//! check incarnations exactly as over verbs ([`super::EmuTransport`]).
//!
//! What the network does between queue pairs is [`EmuWire`]: a queue pair number
//! routes to the node's memory while the node's end of that queue pair exists. A
//! node process that stops destroys every client's queue pair (their requests then
//! fail, as with a crashed node), and its memory is gone: restarting it
//! ([`EmulatedMemnode::restart`]) serves fresh, zeroed memory under a new
//! incarnation at the same address, as `swarm memnode` does after a restart.
//!
//! The cut is the real server's: a revocation or a lease watch drops the node's end
//! of a client's queue pair (`EmuServerQp`), which unroutes it before the node
//! answers, so requests the client's emulated queue pair still holds fail when they
//! execute (nothing acknowledges them) and none lands.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use swarm_core::header::{ENCODED_LEN, NodeHeader};

use super::memory::EmuNode;
use crate::auth::Token;
use crate::bootstrap::{Acceptor, Server, ServerLimits};
use crate::error::RdmaError;
use crate::wire::{QpInfo, RegionInfo};

/// Queue pair numbers are 24 bits.
const QPN_MASK: u32 = (1 << 24) - 1;

/// How long [`EmulatedMemnode::stop`] and [`EmulatedMemnode::disconnect_clients`]
/// wait for the node's ends of its clients' queue pairs to be destroyed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The emulated network: which memory a memory node's queue pair reaches, while
/// that queue pair exists. Shared by the emulated nodes and their clients.
#[derive(Debug, Default)]
pub struct EmuWire {
    next_qpn: AtomicU32,
    next_rkey: AtomicU32,
    routes: Mutex<HashMap<u32, Route>>,
}

/// Where a memory node's queue pair leads.
#[derive(Clone, Debug)]
pub struct Route {
    /// The node's memory.
    pub node: Arc<EmuNode>,
    /// Cleared when the node destroys its queue pair.
    pub alive: Arc<AtomicBool>,
}

impl EmuWire {
    /// An empty network.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A fresh queue pair number (24 bits, never zero).
    pub fn next_qpn(&self) -> u32 {
        (self.next_qpn.fetch_add(1, Ordering::Relaxed) % QPN_MASK) + 1
    }

    /// Where the memory node's queue pair `qpn` leads, if it exists.
    pub fn route(&self, qpn: u32) -> Option<Route> {
        self.routes().get(&qpn).cloned()
    }

    fn next_rkey(&self) -> u32 {
        0x5000 + self.next_rkey.fetch_add(1, Ordering::Relaxed)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Route>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A memory node's end of one client's queue pair: destroyed (unrouted) when the
/// client's bootstrap connection closes or the node stops.
#[derive(Debug)]
struct EmuServerQp {
    qpn: u32,
    alive: Arc<AtomicBool>,
    wire: Arc<EmuWire>,
    live: Arc<AtomicUsize>,
}

impl Drop for EmuServerQp {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        self.wire.routes().remove(&self.qpn);
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The bootstrap's view of an emulated memory node.
#[derive(Debug)]
struct EmuAcceptor {
    wire: Arc<EmuWire>,
    node: Arc<EmuNode>,
    region: RegionInfo,
    /// The node's queue pairs that exist.
    live: Arc<AtomicUsize>,
    /// Set while the node refuses new clients ([`EmulatedMemnode::refuse_clients`]).
    refusing: Arc<AtomicBool>,
}

impl Acceptor for EmuAcceptor {
    type Connection = EmuServerQp;

    fn region(&self) -> RegionInfo {
        self.region
    }

    fn accept(&self, client: &QpInfo) -> Result<(QpInfo, EmuServerQp), RdmaError> {
        if self.refusing.load(Ordering::Acquire) {
            return Err(RdmaError::Config(
                "this emulated memory node refuses new clients".into(),
            ));
        }
        let qpn = self.wire.next_qpn();
        let alive = Arc::new(AtomicBool::new(true));
        self.live.fetch_add(1, Ordering::AcqRel);
        self.wire.routes().insert(
            qpn,
            Route {
                node: self.node.clone(),
                alive: alive.clone(),
            },
        );
        let qp = QpInfo {
            qpn,
            psn: client.psn ^ 1,
            ..*client
        };
        let connection = EmuServerQp {
            qpn,
            alive,
            wire: self.wire.clone(),
            live: self.live.clone(),
        };
        Ok((qp, connection))
    }

    fn read_word(&self, offset: u64) -> Option<u64> {
        let start = usize::try_from(offset).ok()?;
        if !start.is_multiple_of(8) {
            return None;
        }
        self.node.with(|bytes| {
            let word = bytes.get(start..start.checked_add(8)?)?;
            Some(u64::from_ne_bytes(word.try_into().ok()?))
        })
    }
}

/// A running incarnation of an emulated memory node.
#[derive(Debug)]
struct Process {
    server: Server,
    node: Arc<EmuNode>,
    incarnation: u64,
    /// The node's ends of client queue pairs that exist.
    live: Arc<AtomicUsize>,
}

impl Process {
    fn wait_for_no_queue_pairs(&self) -> Result<(), RdmaError> {
        wait_for_no_queue_pairs(&self.live)
    }
}

/// Waits until `live` (a node's client queue pairs) drops to zero: the server
/// destroys them on its client threads once their connections are shut down.
fn wait_for_no_queue_pairs(live: &AtomicUsize) -> Result<(), RdmaError> {
    let deadline = Instant::now() + STOP_TIMEOUT;
    while live.load(Ordering::Acquire) > 0 {
        if Instant::now() >= deadline {
            return Err(RdmaError::Config(
                "an emulated memory node's client queue pairs outlived their connections".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// An emulated memory node process at a fixed loopback address, which can be
/// stopped and restarted (with empty memory and another incarnation).
#[derive(Debug)]
pub struct EmulatedMemnode {
    wire: Arc<EmuWire>,
    token: Token,
    header: NodeHeader,
    addr: SocketAddr,
    process: Option<Process>,
    /// Whether the node refuses new clients (kept across restarts).
    refusing: Arc<AtomicBool>,
    /// The bootstrap server's limits (kept across restarts).
    limits: ServerLimits,
}

impl EmulatedMemnode {
    /// Starts a node on a free loopback port serving zeroed memory of
    /// `header.size` bytes that starts with `header`, under `incarnation`.
    pub fn start(
        wire: Arc<EmuWire>,
        token: Token,
        header: NodeHeader,
        incarnation: u64,
    ) -> Result<Self, RdmaError> {
        let limits = ServerLimits {
            handshake_deadline: Duration::from_secs(2),
            ..ServerLimits::default()
        };
        Self::start_with_limits(wire, token, header, incarnation, limits)
    }

    /// [`EmulatedMemnode::start`] with the bootstrap server's limits given (say, a
    /// lease watch that polls rarely, so that only revocations cut clients in time).
    pub fn start_with_limits(
        wire: Arc<EmuWire>,
        token: Token,
        header: NodeHeader,
        incarnation: u64,
        limits: ServerLimits,
    ) -> Result<Self, RdmaError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| RdmaError::io("cannot listen on loopback", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| RdmaError::io("cannot read the listening address", e))?;
        let mut node = Self {
            wire,
            token,
            header,
            addr,
            process: None,
            refusing: Arc::default(),
            limits,
        };
        node.process = Some(node.spawn(listener, incarnation)?);
        Ok(node)
    }

    /// The bootstrap address (`HOST:PORT`) clients connect to.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The running incarnation; `None` while stopped.
    pub fn incarnation(&self) -> Option<u64> {
        self.process.as_ref().map(|p| p.incarnation)
    }

    /// The running incarnation's memory; `None` while stopped.
    pub fn memory(&self) -> Option<&Arc<EmuNode>> {
        self.process.as_ref().map(|p| &p.node)
    }

    /// While `refuse` is set, the node answers every new bootstrap with a refusal
    /// (`NoResources`, as a node out of queue pairs does) and keeps serving the
    /// clients it has, with the same memory: to the new ones it is unreachable.
    pub fn refuse_clients(&self, refuse: bool) {
        self.refusing.store(refuse, Ordering::Release);
    }

    /// Disconnects every client and keeps serving the same memory, as a node that
    /// dropped its clients does; returns once their queue pairs are destroyed (their
    /// requests fail from then on), with how many clients there were.
    pub fn disconnect_clients(&self) -> Result<usize, RdmaError> {
        let Some(process) = &self.process else {
            return Ok(0);
        };
        let clients = process.server.disconnect_clients();
        process.wait_for_no_queue_pairs()?;
        Ok(clients)
    }

    /// Stops the process: no more bootstraps, every client's queue pair destroyed
    /// (returns once they are), the memory gone.
    pub fn stop(&mut self) -> Result<(), RdmaError> {
        let Some(process) = self.process.take() else {
            return Ok(());
        };
        let live = process.live.clone();
        process.server.shutdown();
        wait_for_no_queue_pairs(&live)
    }

    /// Stops the process if it runs and starts a new one at the same address, with
    /// zeroed memory (its header only) under `incarnation`.
    pub fn restart(&mut self, incarnation: u64) -> Result<(), RdmaError> {
        self.stop()?;
        let listener = TcpListener::bind(self.addr)
            .map_err(|e| RdmaError::io(format!("cannot listen on {} again", self.addr), e))?;
        self.process = Some(self.spawn(listener, incarnation)?);
        Ok(())
    }

    fn spawn(&self, listener: TcpListener, incarnation: u64) -> Result<Process, RdmaError> {
        let size = usize::try_from(self.header.size)
            .map_err(|_| RdmaError::Config("node size exceeds the address space".into()))?;
        if size < ENCODED_LEN {
            return Err(RdmaError::Config("node smaller than its header".into()));
        }
        let rkey = self.wire.next_rkey();
        // A distinct address per process, as a restarted daemon maps its memory
        // anew: a stale link would fail its bounds or key check.
        let base = 0x7f00_0000_0000 + (u64::from(rkey & 0xfff) << 36);
        let node = Arc::new(EmuNode::new(base, rkey, size));
        node.with(|bytes| bytes[..ENCODED_LEN].copy_from_slice(&self.header.encode()));
        let live = Arc::new(AtomicUsize::new(0));
        let acceptor = EmuAcceptor {
            wire: self.wire.clone(),
            node: node.clone(),
            region: RegionInfo {
                addr: base,
                rkey,
                size: self.header.size,
                header: self.header,
                incarnation,
            },
            live: live.clone(),
            refusing: self.refusing.clone(),
        };
        let server = Server::start(listener, self.token.clone(), acceptor, self.limits)?;
        Ok(Process {
            server,
            node,
            incarnation,
            live,
        })
    }
}

impl Drop for EmulatedMemnode {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
