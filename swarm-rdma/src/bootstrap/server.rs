//! The memory node's bootstrap server: one accept thread, one thread per client that
//! sleeps on the idle connection until the client leaves.
//!
//! Unauthenticated peers are cheap to be and must stay cheap to serve: a connection
//! first takes a slot in a small pre-authentication pool, at most a few per source
//! (an IPv4 address, or an IPv6 /64: one host usually has a whole /64), must send
//! its first message within a short deadline ([`ServerLimits::pre_auth_deadline`]:
//! an honest client sends its `ClientHello` as soon as it is connected) and finish
//! the handshake within [`ServerLimits::handshake_deadline`]. The short deadline
//! covers the first message only, not the roundtrip through this node that proving
//! the token takes: that roundtrip includes this node's own work and the client's,
//! which a loaded host stretches (on an emulated VM under a flood, honest clients
//! took over a second), and a peer that is merely slow must not be cut for it while
//! the pool has room; floods are dealt with by eviction. Only a client that proved
//! the token takes one of the (many) client slots, each holding a queue pair; its
//! idle connection then gets TCP keepalive so that a vanished host frees its slot.
//!
//! **Floods.** A full pool does not turn newcomers away, which would let anyone who
//! keeps it full with silent sockets lock every client out. A newcomer instead
//! evicts an unauthenticated connection: the oldest one of its own source if that
//! source is at its share, otherwise the oldest one of the source holding the most
//! slots. A flood from a few sources thus only ever evicts itself, and an honest
//! client (one connection, done within a roundtrip) is served while it runs; a
//! flood from as many sources as the pool has slots can still evict honest
//! clients, which then retry. Connections that proved the token are never evicted.
//! A slot is given back only once its thread is done with the connection (the
//! drain of a refusal included), so the threads of unauthenticated peers stay
//! bounded by the pool (plus evicted ones, whose sockets are shut down and end at
//! once).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::deadline::{Deadline, configure_idle_connection};
use super::{Acceptor, DEFAULT_TIMEOUT, Request, Session, server_handshake};
use crate::auth::Token;
use crate::error::RdmaError;
use crate::lease_watch::{
    CutReason, Revocations, RevokeRequest, RevokeVerdict, Verdict, WatchError, WordWatch,
};
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
    /// Time for a peer's first message, from accepting the connection to the end
    /// of its `ClientHello` (an honest client sends it as soon as it is connected);
    /// a peer that has not sent it by then is disconnected. The rest of the
    /// handshake, a roundtrip through this node, has until `handshake_deadline`.
    pub pre_auth_deadline: Duration,
    /// Authenticated clients connected at once (each holds a queue pair); more
    /// are refused with [`crate::wire::RefuseReason::TooManyClients`].
    pub max_clients: usize,
    /// Connections handshaking at once (not yet authenticated); a newcomer beyond
    /// it evicts one of them (module docs, "Floods").
    pub max_handshakes: usize,
    /// Connections handshaking at once from one source (an IPv4 address, an IPv6
    /// /64); a newcomer beyond it evicts that source's oldest, so that one host
    /// cannot fill the pre-authentication pool.
    pub max_handshakes_per_address: usize,
    /// How often watched lease words are read ([`crate::lease_watch`]).
    pub watch_period: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            handshake_deadline: DEFAULT_TIMEOUT,
            pre_auth_deadline: Duration::from_secs(1),
            max_clients: 1024,
            max_handshakes: 64,
            max_handshakes_per_address: 8,
            watch_period: Duration::from_millis(10),
        }
    }
}

/// The source a connection counts against: its IPv4 address, or its IPv6 /64
/// (IPv4-mapped IPv6 addresses count as IPv4).
pub(crate) fn source_of(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// A connection in the pre-authentication pool.
#[derive(Debug)]
struct Pending {
    /// Its source ([`source_of`]).
    source: IpAddr,
    /// Shut down to evict it.
    stream: TcpStream,
    /// It proved the token (now only waiting for its queue pair): never evicted.
    authenticated: bool,
}

/// Connections still handshaking, by admission order (oldest first), and what the
/// pool did so far.
#[derive(Debug, Default)]
struct Handshaking {
    next: u64,
    pending: BTreeMap<u64, Pending>,
    stats: PreAuthStats,
}

/// What the pre-authentication pool did since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreAuthStats {
    /// Connections handshaking now.
    pub handshaking: usize,
    /// Connections admitted to the pool.
    pub admitted: u64,
    /// Unauthenticated connections evicted to make room for a newcomer.
    pub evicted: u64,
    /// Newcomers closed at once (every connection in their way had proved the
    /// token, or the limits are zero).
    pub refused: u64,
}

impl Handshaking {
    /// Admits a connection from `source` within `limits`, evicting an
    /// unauthenticated one if the pool or the source's share is full; `None` if
    /// nobody can be evicted.
    fn admit(&mut self, source: IpAddr, stream: TcpStream, limits: &ServerLimits) -> Option<u64> {
        let from_source = self.pending.values().filter(|p| p.source == source).count();
        let victim = if from_source >= limits.max_handshakes_per_address {
            match self.oldest_evictable(|p| p.source == source) {
                Some(victim) => Some(victim),
                None => return self.refuse(),
            }
        } else if self.pending.len() >= limits.max_handshakes {
            match self.busiest_source() {
                Some(busiest) => self.oldest_evictable(|p| p.source == busiest),
                None => return self.refuse(),
            }
        } else {
            None
        };
        if let Some(victim) = victim.and_then(|id| self.pending.remove(&id)) {
            let _ = victim.stream.shutdown(Shutdown::Both);
            self.stats.evicted += 1;
        }
        let id = self.next;
        self.next += 1;
        self.pending.insert(
            id,
            Pending {
                source,
                stream,
                authenticated: false,
            },
        );
        self.stats.admitted += 1;
        Some(id)
    }

    fn refuse(&mut self) -> Option<u64> {
        self.stats.refused += 1;
        None
    }

    fn oldest_evictable(&self, mut which: impl FnMut(&Pending) -> bool) -> Option<u64> {
        self.pending
            .iter()
            .find(|(_, p)| !p.authenticated && which(p))
            .map(|(id, _)| *id)
    }

    /// The source with the most evictable connections (the one whose oldest is
    /// oldest, on a tie).
    fn busiest_source(&self) -> Option<IpAddr> {
        let mut counts: HashMap<IpAddr, (usize, u64)> = HashMap::new();
        for (id, p) in self.pending.iter().filter(|(_, p)| !p.authenticated) {
            counts.entry(p.source).or_insert((0, *id)).0 += 1;
        }
        counts
            .into_iter()
            .max_by_key(|(_, (count, oldest))| (*count, std::cmp::Reverse(*oldest)))
            .map(|(source, _)| source)
    }
}

/// A slot in the pre-authentication pool, given back on drop (if it was not
/// evicted meanwhile).
struct HandshakeSlot {
    pool: Arc<Mutex<Handshaking>>,
    id: u64,
}

impl HandshakeSlot {
    /// The connection proved the token: it may no longer be evicted.
    fn authenticated(&self) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pending) = pool.pending.get_mut(&self.id) {
            pending.authenticated = true;
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.pending.remove(&self.id);
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
    handshaking: Arc<Mutex<Handshaking>>,
    accept_thread: Option<JoinHandle<()>>,
    watch_thread: Option<JoinHandle<()>>,
}

/// A client's queue pair (the acceptor's connection), shared by the client's thread
/// and whoever revokes it: taken out and dropped (destroyed) by the first of them.
type ConnectionSlot<C> = Arc<Mutex<Option<C>>>;

/// Destroys the connection in `slot` now, if it is still there.
fn destroy<C>(slot: &ConnectionSlot<C>) {
    let connection = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    drop(connection);
}

/// A client whose lease word is watched: at most one per connected client.
struct Watched<C> {
    watch: WordWatch,
    /// Shut down (for reading) to wake the client's thread when it is cut.
    stream: TcpStream,
    /// Set once the client is cut off, and why.
    cut: Option<CutReason>,
    /// The client's queue pair, destroyed by a revocation before it is acknowledged.
    connection: ConnectionSlot<C>,
}

/// The watched clients by connection id, and the words revoked so far: one lock,
/// so that a watch is never armed past a revocation that should have cut it.
struct WatchTable<C> {
    entries: HashMap<u64, Watched<C>>,
    revoked: Revocations,
}

impl<C> Default for WatchTable<C> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            revoked: Revocations::new(),
        }
    }
}

struct Shared<A: Acceptor> {
    token: Token,
    acceptor: A,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    /// Authenticated clients connected.
    live: AtomicUsize,
    handshaking: Arc<Mutex<Handshaking>>,
    next_id: AtomicU64,
    clients: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    /// Watched clients by connection id, and revocations.
    watches: Mutex<WatchTable<A::Connection>>,
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
        let handshaking: Arc<Mutex<Handshaking>> = Arc::default();
        let shared = Arc::new(Shared {
            token,
            acceptor,
            limits,
            stop: stop.clone(),
            live: AtomicUsize::new(0),
            handshaking: handshaking.clone(),
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
            handshaking,
            accept_thread: Some(accept_thread),
            watch_thread: Some(watch_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the pre-authentication pool did so far, and how many connections are in
    /// it now (module docs, "Floods").
    pub fn pre_auth_stats(&self) -> PreAuthStats {
        let pool = self
            .handshaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        PreAuthStats {
            handshaking: pool.pending.len(),
            ..pool.stats
        }
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

impl<A: Acceptor> Shared<A> {
    /// A pre-authentication slot for `stream`, from `address`, evicting another
    /// connection if needed (module docs, "Floods"); `None` if none can be evicted.
    fn start_handshake(&self, address: IpAddr, stream: &TcpStream) -> Option<HandshakeSlot> {
        let clone = stream.try_clone().ok()?;
        let id = self
            .handshaking
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(source_of(address), clone, &self.limits)?;
        Some(HandshakeSlot {
            pool: self.handshaking.clone(),
            id,
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
        let Some(slot) = shared.start_handshake(peer_addr.ip(), &stream) else {
            tracing::warn!(%peer, "too many authenticated connections handshaking, closing");
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
    let accepted_at = Instant::now();
    let deadline = accepted_at + shared.limits.handshake_deadline;
    // Until the peer's first message is in, the shorter pre-authentication deadline.
    let proved_by = Cell::new(accepted_at + shared.limits.pre_auth_deadline);
    let handshake = server_handshake(
        &mut LiftAfter {
            inner: Deadline::new(&stream, deadline).bounded_by(&proved_by),
            left: client_hello_len(),
            limit: &proved_by,
            to: deadline,
        },
        peer,
        &shared.token,
        &shared.acceptor,
        || {
            let client = shared.admit_client()?;
            handshake_slot.authenticated();
            proved_by.set(deadline);
            Some(client)
        },
    );
    let (connection, _client_slot, mut session) = match handshake {
        Ok(accepted) => accepted,
        Err(error) => {
            if is_unauthenticated_noise(&error) {
                tracing::debug!(%peer, %error, "dropped a connection that did not authenticate");
            } else {
                tracing::warn!(%peer, %error, "refused a client");
            }
            close_gracefully(&mut stream);
            // Only now: the thread is done with the connection.
            drop(handshake_slot);
            return;
        }
    };
    drop(handshake_slot);
    let connection: ConnectionSlot<A::Connection> = Arc::new(Mutex::new(Some(connection)));
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
        // it is cut; the only requests it may send are a lease watch and a
        // revocation of another client's lease.
        serve_requests(&mut Requester {
            stream: &mut stream,
            peer,
            id,
            shared,
            session: &mut session,
            connection: &connection,
        });
    }
    if let Ok(mut clients) = shared.clients.lock() {
        clients.retain(|(other, _)| *other != id);
    }
    let watched = shared
        .watches
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entries
        .remove(&id);
    // The queue pair goes first: once the client hears why, nothing more lands.
    destroy(&connection);
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

/// The length of a `ClientHello` frame: the bytes a peer must send within the
/// pre-authentication deadline.
fn client_hello_len() -> usize {
    Message::ClientHello {
        nonce: [0; crate::auth::NONCE_LEN],
    }
    .encode()
    .len()
}

/// A stream whose `limit` moves to `to` once `left` more bytes have been read: the
/// pre-authentication deadline bounds the peer's first message only.
struct LiftAfter<'a, S> {
    inner: S,
    left: usize,
    limit: &'a Cell<Instant>,
    to: Instant,
}

impl<S: std::io::Read> std::io::Read for LiftAfter<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        if self.left > 0 {
            self.left = self.left.saturating_sub(read);
            if self.left == 0 {
                self.limit.set(self.limit.get().max(self.to));
            }
        }
        Ok(read)
    }
}

impl<S: std::io::Write> std::io::Write for LiftAfter<'_, S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A connected client's bootstrap connection, as its requests are served.
struct Requester<'a, A: Acceptor> {
    stream: &'a mut TcpStream,
    peer: &'a str,
    /// The connection id (the key of its watch).
    id: u64,
    shared: &'a Shared<A>,
    session: &'a mut Session,
    connection: &'a ConnectionSlot<A::Connection>,
}

impl<A: Acceptor> Requester<'_, A> {
    /// The word at `offset` of the served memory, if `checked` (the request's check
    /// against the region) passed.
    fn word(&self, offset: u64, checked: Result<(), WatchError>) -> Result<u64, WatchError> {
        checked?;
        let size = self.shared.acceptor.region().size;
        self.shared
            .acceptor
            .read_word(offset)
            .ok_or(WatchError::OutOfRegion { offset, size })
    }

    /// Refuses the request with `reason` (proved), says why in the log; always
    /// `false`: the connection ends.
    fn refuse(&mut self, reason: RefuseReason, error: &WatchError, what: &str) -> bool {
        tracing::warn!(peer = %self.peer, %error, "{what} refused; disconnecting");
        let _ = self.session.send_proved(self.stream, &refuse(reason));
        false
    }

    /// Sends `message`, proved; whether the connection still serves.
    fn answer(&mut self, message: &Message) -> bool {
        self.session.send_proved(self.stream, message).is_ok()
    }

    /// The watches and revocations, locked.
    fn watches(&self) -> std::sync::MutexGuard<'_, WatchTable<A::Connection>> {
        self.shared
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Serves a connected client's requests (lease watches, revocations) until the
/// connection ends (the client left, or it was cut). A bad request is refused and
/// ends the connection (its queue pair is destroyed).
fn serve_requests<A: Acceptor>(client: &mut Requester<'_, A>) {
    loop {
        let request = match client.session.receive_request(client.stream) {
            Ok(request) => request,
            Err(crate::wire::WireError::Truncated | crate::wire::WireError::Io(_)) => return,
            Err(error) => {
                tracing::warn!(peer = %client.peer, %error, "malformed request after the handshake; disconnecting");
                let _ = client
                    .session
                    .send_proved(client.stream, &refuse(RefuseReason::Malformed));
                return;
            }
        };
        let served = match request {
            Request::Watch(request) => serve_watch(client, request),
            Request::Revoke(request) => serve_revoke(client, request),
        };
        if !served {
            return;
        }
    }
}

/// Arms a lease watch (replacing the client's earlier one) and answers `Watching`,
/// or refuses it; `false` once the connection must end.
fn serve_watch<A: Acceptor>(
    client: &mut Requester<'_, A>,
    request: crate::lease_watch::WatchRequest,
) -> bool {
    let size = client.shared.acceptor.region().size;
    let armed = client
        .word(request.offset, request.check(size))
        .and_then(|word| WordWatch::arm(request, client.shared.now_ns(), word));
    let Ok(clone) = client.stream.try_clone() else {
        return false;
    };
    // One watch per client: a new request replaces the old one, unless the client
    // was cut meanwhile (then the cut stands: the connection ends and the client
    // hears why), and never for a revoked generation of the word.
    let armed = armed.and_then(|watch| {
        arm_watch(
            &mut client.watches(),
            client.id,
            Watched {
                watch,
                stream: clone,
                cut: None,
                connection: client.connection.clone(),
            },
        )
    });
    if let Err(error) = armed {
        let reason = match error {
            WatchError::Killed | WatchError::Revoked { .. } => RefuseReason::LeaseExpired,
            _ => RefuseReason::BadWatch,
        };
        return client.refuse(reason, &error, "lease watch");
    }
    tracing::info!(
        peer = %client.peer,
        offset = format_args!("{:#x}", request.offset),
        stall_ms = request.stall_ns / 1_000_000,
        base = request.base,
        "watching the client's lease word"
    );
    client.answer(&Message::Watching {
        proof: [0; crate::auth::PROOF_LEN],
    })
}

/// Revokes the clients watching a killed lease word ([`crate::lease_watch`],
/// "Revocation"): destroys their queue pairs, then answers `Revoked` with the word;
/// answers with the word alone (nothing revoked) if it is not killed here. `false`
/// once the connection must end.
fn serve_revoke<A: Acceptor>(client: &mut Requester<'_, A>, request: RevokeRequest) -> bool {
    let size = client.shared.acceptor.region().size;
    let cut = client
        .word(request.offset, request.check(size))
        .and_then(|word| {
            revoke(&mut client.watches(), client.id, request, word)
                .map(|(verdict, slots)| (word, verdict, slots))
        });
    let (word, verdict, slots) = match cut {
        Ok(cut) => cut,
        Err(error) => {
            let reason = match error {
                WatchError::TooManyRevoked => RefuseReason::NoResources,
                _ => RefuseReason::BadWatch,
            };
            return client.refuse(reason, &error, "revocation");
        }
    };
    // Destroyed before the acknowledgement: a queue pair that no longer exists
    // executes none of the requests its client queued or will post.
    let count = slots.len();
    for slot in &slots {
        destroy(slot);
    }
    match verdict {
        RevokeVerdict::Revoke { floor } => tracing::warn!(
            peer = %client.peer,
            offset = format_args!("{:#x}", request.offset),
            floor,
            cut = count,
            "lease revoked: the clients watching it are cut, their queue pairs destroyed"
        ),
        RevokeVerdict::NotKilled { word } => tracing::info!(
            peer = %client.peer,
            offset = format_args!("{:#x}", request.offset),
            word = format_args!("{word:#x}"),
            "revocation of a lease word that is not killed here: nothing revoked"
        ),
    }
    client.answer(&Message::Revoked {
        word,
        proof: [0; crate::auth::PROOF_LEN],
    })
}

/// Installs `watched` as connection `id`'s watch, replacing an earlier one, unless
/// the watcher already cut that connection (a cut entry is never replaced: the
/// client's thread must see it, destroy the queue pair and send
/// `Refuse(LeaseExpired)`) or a revocation covers the watch's generation. Runs under
/// the watches' lock, which the watcher and revocations hold while they cut.
fn arm_watch<C>(table: &mut WatchTable<C>, id: u64, watched: Watched<C>) -> Result<(), WatchError> {
    table.revoked.admits(&watched.watch.request())?;
    if let Some(reason) = table.entries.get(&id).and_then(|w| w.cut) {
        return Err(match reason {
            CutReason::Revoked { floor } => WatchError::Revoked {
                base: watched.watch.request().base,
                floor,
            },
            _ => WatchError::Killed,
        });
    }
    table.entries.insert(id, watched);
    Ok(())
}

/// Judges a revocation whose word reads `word` and, if it revokes, marks every
/// client it covers (but the asking connection `asker`) cut, wakes its thread, and
/// returns their queue pairs for the caller to destroy before it acknowledges. Runs
/// under the watches' lock.
#[allow(clippy::type_complexity)]
fn revoke<C>(
    table: &mut WatchTable<C>,
    asker: u64,
    request: RevokeRequest,
    word: u64,
) -> Result<(RevokeVerdict, Vec<ConnectionSlot<C>>), WatchError> {
    let verdict = table.revoked.revoke(request, word)?;
    let RevokeVerdict::Revoke { floor } = verdict else {
        return Ok((verdict, Vec::new()));
    };
    let mut slots = Vec::new();
    for (id, watched) in table.entries.iter_mut() {
        if *id == asker || !Revocations::cuts(request.offset, floor, &watched.watch.request()) {
            continue;
        }
        if watched.cut.is_none() {
            watched.cut = Some(CutReason::Revoked { floor });
            let _ = watched.stream.shutdown(Shutdown::Read);
        }
        slots.push(watched.connection.clone());
    }
    Ok((verdict, slots))
}

/// Whether a failed handshake is what floods and port scans produce (the peer went
/// silent, closed, or was evicted before a full message): logged at debug level
/// only, so that a flood does not flood the log too.
fn is_unauthenticated_noise(error: &RdmaError) -> bool {
    matches!(
        error,
        RdmaError::Wire {
            source: crate::wire::WireError::Truncated
                | crate::wire::WireError::TimedOut
                | crate::wire::WireError::Io(_),
            ..
        }
    )
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
        for watched in watches.entries.values_mut().filter(|w| w.cut.is_none()) {
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
    // Sleeps in short steps, so that a stop is seen soon whatever the period.
    const STEP: Duration = Duration::from_millis(10);
    let mut next = Instant::now() + shared.limits.watch_period;
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= next {
            shared.check_watches();
            next = now + shared.limits.watch_period;
        }
        std::thread::sleep(STEP.min(next.saturating_duration_since(now)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_watch::{MIN_STALL_NS, WatchRequest};
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn ipv6_sources_count_by_slash_64_and_ipv4_by_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            source_of(ip("2001:db8::1")),
            source_of(ip("2001:db8::ffff:1"))
        );
        assert_eq!(source_of(ip("2001:db8::1")), ip("2001:db8::"));
        assert_ne!(
            source_of(ip("2001:db8::1")),
            source_of(ip("2001:db8:0:1::1"))
        );
        assert_eq!(source_of(ip("::1")), ip("::"));
        assert_eq!(source_of(ip("::ffff:127.0.0.7")), ip("127.0.0.7"));
        assert_ne!(source_of(ip("127.0.0.7")), source_of(ip("127.0.0.8")));
    }

    #[test]
    fn one_ipv6_slash_64_gets_one_share_of_the_pool() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let stream = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let limits = ServerLimits {
            max_handshakes: 64,
            max_handshakes_per_address: 2,
            ..ServerLimits::default()
        };
        let mut pool = Handshaking::default();
        let host = |i: u16| source_of(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i)));
        // Three addresses of one /64: the third evicts the first.
        for i in 1..=3 {
            assert!(pool.admit(host(i), stream(), &limits).is_some());
        }
        assert_eq!(pool.pending.len(), 2);
        assert_eq!(pool.stats.evicted, 1);
    }

    #[test]
    fn connections_that_proved_the_token_are_never_evicted() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let stream = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let limits = ServerLimits {
            max_handshakes: 1,
            max_handshakes_per_address: 1,
            ..ServerLimits::default()
        };
        let pool = Arc::new(Mutex::new(Handshaking::default()));
        let source = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let id = pool
            .lock()
            .unwrap()
            .admit(source, stream(), &limits)
            .unwrap();
        let slot = HandshakeSlot {
            pool: pool.clone(),
            id,
        };
        slot.authenticated();
        assert!(
            pool.lock()
                .unwrap()
                .admit(source, stream(), &limits)
                .is_none()
        );
        assert_eq!(pool.lock().unwrap().stats.refused, 1);
        drop(slot);
        assert!(
            pool.lock()
                .unwrap()
                .admit(source, stream(), &limits)
                .is_some()
        );
    }

    fn watched(
        stream: TcpStream,
        base: u64,
        cut: Option<CutReason>,
    ) -> (Watched<u32>, ConnectionSlot<u32>) {
        let request = WatchRequest {
            offset: 4096,
            stall_ns: MIN_STALL_NS,
            base,
        };
        let connection = Arc::new(Mutex::new(Some(7)));
        let watched = Watched {
            watch: WordWatch::arm(request, 0, 1).unwrap(),
            stream,
            cut,
            connection: connection.clone(),
        };
        (watched, connection)
    }

    #[test]
    fn a_watch_request_never_replaces_a_cut_entry() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let stream = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut table = WatchTable::default();
        // A first watch, and a new request replacing it: fine.
        assert_eq!(
            arm_watch(&mut table, 7, watched(stream(), 1, None).0),
            Ok(())
        );
        assert_eq!(
            arm_watch(&mut table, 7, watched(stream(), 1, None).0),
            Ok(())
        );
        // The watcher cuts the client; a Watch handled meanwhile must not re-insert
        // an uncut entry (the client would never hear why and back off).
        let reason = CutReason::Killed { word: 1 << 63 };
        table.entries.get_mut(&7).unwrap().cut = Some(reason);
        assert_eq!(
            arm_watch(&mut table, 7, watched(stream(), 1, None).0),
            Err(WatchError::Killed)
        );
        assert_eq!(table.entries[&7].cut, Some(reason));
    }

    /// The memory node's side of a revocation, on the watch table: every client
    /// fenced under the word with a base at or below the floor is cut and its queue
    /// pair handed over for destruction, the asking connection and other words'
    /// clients are not, and the revoked generation can never be watched again (a
    /// reconnect), while the next owner's can.
    #[test]
    fn a_revocation_cuts_the_revoked_generation_and_keeps_it_out() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let stream = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut table = WatchTable::default();
        let (old, old_qp) = watched(stream(), 5, None);
        assert_eq!(arm_watch(&mut table, 1, old), Ok(()));
        let (asker, asker_qp) = watched(stream(), 5, None);
        assert_eq!(arm_watch(&mut table, 2, asker), Ok(()));
        let (mut other, other_qp) = watched(stream(), 5, None);
        other.watch = WordWatch::arm(
            WatchRequest {
                offset: 4104,
                ..other.watch.request()
            },
            0,
            1,
        )
        .unwrap();
        assert_eq!(arm_watch(&mut table, 3, other), Ok(()));
        let request = RevokeRequest {
            offset: 4096,
            floor: 6,
        };
        // Not killed on this node: nothing happens.
        let (verdict, slots) = revoke(&mut table, 2, request, 6).unwrap();
        assert_eq!(verdict, RevokeVerdict::NotKilled { word: 6 });
        assert!(slots.is_empty());
        assert!(table.entries.values().all(|w| w.cut.is_none()));
        // Killed: client 1 is cut and its queue pair handed over; the asker and the
        // other word's client are not.
        let (verdict, slots) = revoke(&mut table, 2, request, 6 | 1 << 63).unwrap();
        assert_eq!(verdict, RevokeVerdict::Revoke { floor: 6 });
        assert_eq!(slots.len(), 1);
        assert!(Arc::ptr_eq(&slots[0], &old_qp));
        for slot in &slots {
            destroy(slot);
        }
        assert_eq!(
            *old_qp.lock().unwrap(),
            None,
            "the revoked queue pair is destroyed"
        );
        assert_eq!(*asker_qp.lock().unwrap(), Some(7));
        assert_eq!(*other_qp.lock().unwrap(), Some(7));
        assert_eq!(table.entries[&1].cut, Some(CutReason::Revoked { floor: 6 }));
        assert_eq!(table.entries[&3].cut, None);
        // The revoked client reconnects (a new connection) and asks again: refused.
        assert_eq!(
            arm_watch(&mut table, 4, watched(stream(), 5, None).0),
            Err(WatchError::Revoked { base: 5, floor: 6 })
        );
        // The next owner's base is above the floor: watched.
        assert_eq!(
            arm_watch(&mut table, 5, watched(stream(), 7, None).0),
            Ok(())
        );
    }
}
