//! The memory node's bootstrap server: one accept thread, one thread per client that
//! sleeps on the idle connection until the client leaves.
//!
//! Unauthenticated peers are cheap to be and must stay cheap to serve: a connection
//! first takes a slot in a small pre-authentication pool, at most a few per source
//! address, and has one absolute deadline for the whole handshake. Only a client
//! that proved the token takes one of the (many) client slots, each holding a queue
//! pair; its idle connection then gets TCP keepalive so that a vanished host frees
//! its slot.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::deadline::{Deadline, configure_idle_connection};
use super::{Acceptor, DEFAULT_TIMEOUT, Session, server_handshake};
use crate::auth::Token;
use crate::error::RdmaError;
use crate::lease_watch::{CutReason, Verdict, WordWatch};
use crate::wire::{Message, RefuseReason};

/// How long a refused connection is drained (in total) so that the refusal is
/// delivered before the socket closes.
const DRAIN_DEADLINE: Duration = Duration::from_millis(100);

/// Limits of a bootstrap server.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Time for a whole handshake, from accepting the connection to sending
    /// `Accept`; a peer that is not done by then is disconnected.
    pub handshake_deadline: Duration,
    /// Authenticated clients connected at once (each holds a queue pair); more
    /// are refused with [`crate::wire::RefuseReason::TooManyClients`].
    pub max_clients: usize,
    /// Connections handshaking at once (not yet authenticated); more are closed
    /// at once.
    pub max_handshakes: usize,
    /// Connections handshaking at once from one IP address; more are closed at
    /// once, so that one host cannot fill the pre-authentication pool.
    pub max_handshakes_per_address: usize,
    /// How often watched lease words are read ([`crate::lease_watch`]).
    pub watch_period: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            handshake_deadline: DEFAULT_TIMEOUT,
            max_clients: 1024,
            max_handshakes: 64,
            max_handshakes_per_address: 8,
            watch_period: Duration::from_millis(10),
        }
    }
}

/// Connections still handshaking, in total and per source address.
#[derive(Debug, Default)]
struct Handshaking {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// A slot in the pre-authentication pool, given back on drop.
struct HandshakeSlot {
    pool: Arc<Mutex<Handshaking>>,
    address: IpAddr,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.total -= 1;
        if let Some(count) = pool.per_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                pool.per_address.remove(&self.address);
            }
        }
    }
}

/// A slot among the authenticated clients, given back on drop.
struct ClientSlot<'a>(&'a AtomicUsize);

impl Drop for ClientSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running bootstrap server: accepts clients on a thread, one thread per client
/// that blocks on the idle connection until the client goes away.
#[derive(Debug)]
pub struct Server {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    clients: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    accept_thread: Option<JoinHandle<()>>,
    watch_thread: Option<JoinHandle<()>>,
}

/// A client whose lease word is watched: at most one per connected client.
struct Watched {
    watch: WordWatch,
    /// Shut down (for reading) to wake the client's thread when it is cut.
    stream: TcpStream,
    /// Set once the client is cut off, and why.
    cut: Option<CutReason>,
}

struct Shared<A> {
    token: Token,
    acceptor: A,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    /// Authenticated clients connected.
    live: AtomicUsize,
    handshaking: Arc<Mutex<Handshaking>>,
    next_id: AtomicU64,
    clients: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    /// Watched clients by connection id.
    watches: Mutex<HashMap<u64, Watched>>,
    /// Zero of the watch clock.
    epoch: Instant,
}

impl Server {
    /// Starts serving `listener`.
    pub fn start<A: Acceptor>(
        listener: TcpListener,
        token: Token,
        acceptor: A,
        limits: ServerLimits,
    ) -> Result<Self, RdmaError> {
        let local_addr = listener
            .local_addr()
            .map_err(|e| RdmaError::io("cannot read the listening address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let clients = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(Shared {
            token,
            acceptor,
            limits,
            stop: stop.clone(),
            live: AtomicUsize::new(0),
            handshaking: Arc::default(),
            next_id: AtomicU64::new(0),
            clients: clients.clone(),
            watches: Mutex::default(),
            epoch: Instant::now(),
        });
        let watcher = shared.clone();
        let watch_thread = std::thread::Builder::new()
            .name("swarm-rdma-lease-watch".into())
            .spawn(move || watch_loop(&watcher))
            .map_err(|e| RdmaError::io("cannot start the lease watch thread", e))?;
        let accept_thread = std::thread::Builder::new()
            .name("swarm-rdma-accept".into())
            .spawn(move || accept_loop(&listener, &shared))
            .map_err(|e| RdmaError::io("cannot start the bootstrap thread", e))?;
        Ok(Self {
            local_addr,
            stop,
            clients,
            accept_thread: Some(accept_thread),
            watch_thread: Some(watch_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Disconnects every client now (their queue pairs are destroyed) and keeps
    /// serving: clients see their requests fail and connect again. Returns how many
    /// clients were connected.
    pub fn disconnect_clients(&self) -> usize {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, client) in clients.iter() {
            let _ = client.shutdown(Shutdown::Both);
        }
        clients.len()
    }

    /// Blocks until the server stops (only [`Server::shutdown`] stops it).
    pub fn wait(mut self) {
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }

    /// Stops accepting, disconnects every client (their queue pairs are destroyed)
    /// and waits for the accept thread.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept() with a throwaway connection.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_secs(1));
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        if let Some(thread) = self.watch_thread.take() {
            let _ = thread.join();
        }
        if let Ok(clients) = self.clients.lock() {
            for (_, client) in clients.iter() {
                let _ = client.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.accept_thread.is_some() {
            self.stop_now();
        }
    }
}

impl<A> Shared<A> {
    /// A pre-authentication slot for a connection from `address`, if the pool and
    /// the address's share of it have room.
    fn start_handshake(&self, address: IpAddr) -> Option<HandshakeSlot> {
        let mut pool = self
            .handshaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let from_address = pool.per_address.get(&address).copied().unwrap_or(0);
        if pool.total >= self.limits.max_handshakes
            || from_address >= self.limits.max_handshakes_per_address
        {
            return None;
        }
        pool.total += 1;
        *pool.per_address.entry(address).or_insert(0) += 1;
        Some(HandshakeSlot {
            pool: self.handshaking.clone(),
            address,
        })
    }

    /// A client slot for an authenticated client, if any is left.
    fn admit_client(&self) -> Option<ClientSlot<'_>> {
        let admitted = self
            .live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |live| {
                (live < self.limits.max_clients).then(|| live + 1)
            })
            .is_ok();
        admitted.then(|| ClientSlot(&self.live))
    }
}

fn accept_loop<A: Acceptor>(listener: &TcpListener, shared: &Arc<Shared<A>>) {
    for incoming in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match incoming {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "accepting a bootstrap connection failed");
                // Transient (EMFILE, ECONNABORTED): back off instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Ok(peer_addr) = stream.peer_addr() else {
            continue;
        };
        let peer = peer_addr.to_string();
        let Some(slot) = shared.start_handshake(peer_addr.ip()) else {
            tracing::warn!(%peer, "too many connections handshaking, closing");
            continue;
        };
        let worker = shared.clone();
        // If the thread cannot start, the closure is dropped and the slot with it.
        let spawned = std::thread::Builder::new()
            .name("swarm-rdma-client".into())
            .spawn(move || serve_client(stream, &peer, &worker, slot));
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start a client thread");
        }
    }
}

fn serve_client<A: Acceptor>(
    mut stream: TcpStream,
    peer: &str,
    shared: &Shared<A>,
    handshake_slot: HandshakeSlot,
) {
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + shared.limits.handshake_deadline;
    let handshake = server_handshake(
        &mut Deadline::new(&stream, deadline),
        peer,
        &shared.token,
        &shared.acceptor,
        || shared.admit_client(),
    );
    drop(handshake_slot);
    let (connection, _client_slot, mut session) = match handshake {
        Ok(accepted) => accepted,
        Err(error) => {
            tracing::warn!(%peer, %error, "refused a client");
            close_gracefully(&mut stream);
            return;
        }
    };
    tracing::info!(%peer, "client connected");
    // Register the stream so that shutdown can disconnect it.
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if let (Ok(clone), Ok(mut clients)) = (stream.try_clone(), shared.clients.lock()) {
        clients.push((id, clone));
    }
    if !shared.stop.load(Ordering::SeqCst) {
        if let Err(error) = configure_idle_connection(&stream) {
            tracing::warn!(%peer, %error, "cannot enable keepalive on the client's connection");
        }
        // Passive from now on: block until the client closes the connection or
        // the watcher cuts it; the only request it may send is a lease watch.
        serve_watch_requests(&mut stream, peer, id, shared, &mut session);
    }
    if let Ok(mut clients) = shared.clients.lock() {
        clients.retain(|(other, _)| *other != id);
    }
    let watched = shared
        .watches
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
    // The queue pair goes first: once the client hears why, nothing more lands.
    drop(connection);
    if let Some(reason) = watched.and_then(|w| w.cut) {
        tracing::warn!(%peer, %reason, "client cut off: lease expired; its queue pair is destroyed");
        let refusal = Message::Refuse {
            reason: RefuseReason::LeaseExpired,
            proof: [0; crate::auth::PROOF_LEN],
        };
        let mut deadline = Deadline::new(&stream, Instant::now() + DRAIN_DEADLINE);
        let _ = session.send_proved(&mut deadline, &refusal);
        close_gracefully(&mut stream);
        return;
    }
    tracing::info!(%peer, "client disconnected; its queue pair is destroyed");
}

/// Serves a connected client's lease-watch requests until the connection ends (the
/// client left, or the watcher cut it). A bad request is refused and ends the
/// connection (its queue pair is destroyed).
fn serve_watch_requests<A: Acceptor>(
    stream: &mut TcpStream,
    peer: &str,
    id: u64,
    shared: &Shared<A>,
    session: &mut Session,
) {
    loop {
        let request = match session.receive_watch(stream) {
            Ok(request) => request,
            Err(crate::wire::WireError::Truncated | crate::wire::WireError::Io(_)) => return,
            Err(error) => {
                tracing::warn!(%peer, %error, "malformed request after the handshake; disconnecting");
                let _ = session.send_proved(stream, &refuse(RefuseReason::Malformed));
                return;
            }
        };
        let size = shared.acceptor.region().size;
        let armed = request.check(size).and_then(|()| {
            let word = shared.acceptor.read_word(request.offset).ok_or(
                crate::lease_watch::WatchError::OutOfRegion {
                    offset: request.offset,
                    size,
                },
            )?;
            WordWatch::arm(request, shared.now_ns(), word)
        });
        let watch = match armed {
            Ok(watch) => watch,
            Err(error) => {
                let reason = match error {
                    crate::lease_watch::WatchError::Killed => RefuseReason::LeaseExpired,
                    _ => RefuseReason::BadWatch,
                };
                tracing::warn!(%peer, %error, "lease watch refused; disconnecting");
                let _ = session.send_proved(stream, &refuse(reason));
                return;
            }
        };
        let Ok(clone) = stream.try_clone() else {
            return;
        };
        // One watch per client: a new request replaces the old one.
        shared
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                Watched {
                    watch,
                    stream: clone,
                    cut: None,
                },
            );
        tracing::info!(
            %peer,
            offset = format_args!("{:#x}", request.offset),
            stall_ms = request.stall_ns / 1_000_000,
            "watching the client's lease word"
        );
        let watching = Message::Watching {
            proof: [0; crate::auth::PROOF_LEN],
        };
        if session.send_proved(stream, &watching).is_err() {
            return;
        }
    }
}

fn refuse(reason: RefuseReason) -> Message {
    Message::Refuse {
        reason,
        proof: [0; crate::auth::PROOF_LEN],
    }
}

impl<A: Acceptor> Shared<A> {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Reads every watched word once; cuts the clients whose lease expired (their
    /// threads wake, destroy the queue pair and tell them why).
    fn check_watches(&self) {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        for watched in watches.values_mut().filter(|w| w.cut.is_none()) {
            let offset = watched.watch.request().offset;
            let Some(word) = self.acceptor.read_word(offset) else {
                continue;
            };
            if let Verdict::Cut(reason) = watched.watch.observe(self.now_ns(), word) {
                watched.cut = Some(reason);
                let _ = watched.stream.shutdown(Shutdown::Read);
            }
        }
    }
}

fn watch_loop<A: Acceptor>(shared: &Shared<A>) {
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(shared.limits.watch_period);
        shared.check_watches();
    }
}

/// Closes a refused connection so that the refusal is delivered: send FIN, then
/// drain what the client still sends until a short deadline (closing with unread
/// input would make the kernel send a reset, which can discard the refusal in
/// flight). The deadline is absolute: a peer trickling bytes cannot stretch it.
fn close_gracefully(stream: &mut TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let mut drain = Deadline::new(stream, Instant::now() + DRAIN_DEADLINE);
    let mut sink = [0u8; 256];
    while let Ok(1..) = std::io::Read::read(&mut drain, &mut sink) {}
}
