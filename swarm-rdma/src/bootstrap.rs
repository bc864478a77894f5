//! The TCP bootstrap: how a client and a memory node authenticate each other and
//! exchange what their queue pairs need, before one-sided verbs take over.
//!
//! ```text
//! client                                   memory node
//!   ClientHello { client nonce }      ─────▶
//!                                     ◀─────  ServerHello { node nonce, node proof }
//!   (checks the node's proof)
//!   ClientAuth { client proof, QP }   ─────▶
//!                                            (checks the client's proof, creates a QP
//!                                             for the client and moves it to RTR)
//!                                     ◀─────  Accept { QP, region } | Refuse { reason }
//!   (moves its own QP to RTR, RTS)
//! ```
//!
//! The token never crosses the wire (see [`crate::auth`]). The TCP connection then
//! stays open, idle, for as long as the client uses the queue pair: when it closes
//! (the client exits or crashes), the memory node destroys that client's queue pair.
//! Apart from that the memory node's CPU does nothing (DESIGN.md §1: passive memory).
//!
//! Everything here is device-independent: the memory node plugs its verbs-specific
//! part in through [`Acceptor`], so the whole exchange is tested on loopback TCP.
//! Sockets have read/write timeouts during the handshake, and a malformed message is
//! answered with a refusal and a closed connection, never a panic.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::auth::{Token, proof_matches, random_nonce};
use crate::error::RdmaError;
use crate::wire::{Message, QpInfo, RefuseReason, RegionInfo, WireError};

/// Default limit on each handshake read or write.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The memory node's side of accepting one client, supplied by the daemon.
pub trait Acceptor: Send + Sync + 'static {
    /// What the memory node keeps per client (its queue pair); dropped when the
    /// client's bootstrap connection closes.
    type Connection: Send + 'static;

    /// The region every client is told about.
    fn region(&self) -> RegionInfo;

    /// Creates a queue pair connected to `client` and ready to serve it (RTR).
    fn accept(&self, client: &QpInfo) -> Result<(QpInfo, Self::Connection), RdmaError>;
}

/// What a client learns from a successful handshake.
#[derive(Debug)]
pub struct Accepted {
    /// The memory node's queue pair for this client.
    pub qp: QpInfo,
    /// The memory node's memory.
    pub region: RegionInfo,
    /// The bootstrap connection: keep it open while the queue pair is used.
    pub stream: TcpStream,
}

/// Connects to the memory node at `addr` and runs the client side of the handshake.
/// `local_qp` describes the client's queue pair (already created, in INIT).
pub fn connect(
    addr: &str,
    token: &Token,
    local_qp: &QpInfo,
    timeout: Duration,
) -> Result<Accepted, RdmaError> {
    let mut stream = open(addr, timeout)?;
    let (qp, region) = client_handshake(&mut stream, addr, token, local_qp)?;
    // The connection now only signals liveness: no more timeouts on it.
    let _ = stream.set_read_timeout(None);
    Ok(Accepted { qp, region, stream })
}

fn open(addr: &str, timeout: Duration) -> Result<TcpStream, RdmaError> {
    let candidates: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| RdmaError::io(format!("cannot resolve memory node address {addr}"), e))?
        .collect();
    let mut last = None;
    for candidate in candidates {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => {
                set_timeouts(&stream, timeout)
                    .map_err(|e| RdmaError::io(format!("cannot configure socket to {addr}"), e))?;
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    let error = last.unwrap_or_else(|| std::io::Error::other("the name resolved to no address"));
    Err(RdmaError::io(
        format!("cannot connect to memory node {addr} (is `swarm memnode` running there?)"),
        error,
    ))
}

fn set_timeouts(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}

/// The client side of the handshake over an already connected stream.
pub fn client_handshake<S: std::io::Read + Write>(
    stream: &mut S,
    peer: &str,
    token: &Token,
    local_qp: &QpInfo,
) -> Result<(QpInfo, RegionInfo), RdmaError> {
    let wire = |e| RdmaError::wire(peer, e);
    let client_nonce = random_nonce().map_err(|e| RdmaError::io("cannot draw a nonce", e))?;
    Message::ClientHello {
        nonce: client_nonce,
    }
    .write_to(stream)
    .map_err(wire)?;
    let server_nonce = match Message::read_from(stream).map_err(wire)? {
        Message::ServerHello { nonce, proof } => {
            if !proof_matches(&token.server_proof(&client_nonce, &nonce), &proof) {
                return Err(RdmaError::BadToken {
                    peer: peer.to_owned(),
                });
            }
            nonce
        }
        Message::Refuse { reason } => {
            return Err(RdmaError::Refused {
                peer: peer.to_owned(),
                reason,
            });
        }
        other => return Err(wire(unexpected("ServerHello", &other))),
    };
    Message::ClientAuth {
        proof: token.client_proof(&client_nonce, &server_nonce),
        qp: *local_qp,
    }
    .write_to(stream)
    .map_err(wire)?;
    match Message::read_from(stream).map_err(wire)? {
        Message::Accept { qp, region } => Ok((qp, region)),
        Message::Refuse { reason } => Err(RdmaError::Refused {
            peer: peer.to_owned(),
            reason,
        }),
        other => Err(wire(unexpected("Accept", &other))),
    }
}

fn unexpected(expected: &'static str, found: &Message) -> WireError {
    WireError::Unexpected {
        expected,
        found: found.kind(),
    }
}

/// The memory node's side of the handshake over an accepted stream. On any failure
/// the client is sent a refusal (best effort) and the error is returned.
pub fn server_handshake<S: std::io::Read + Write, A: Acceptor>(
    stream: &mut S,
    peer: &str,
    token: &Token,
    acceptor: &A,
) -> Result<A::Connection, RdmaError> {
    let refuse = |stream: &mut S, reason| {
        let _ = Message::Refuse { reason }.write_to(stream);
    };
    let malformed = |stream: &mut S, error: WireError| {
        let reason = match error {
            WireError::UnsupportedVersion { .. } => Some(RefuseReason::UnsupportedVersion),
            WireError::Truncated | WireError::TimedOut | WireError::Io(_) => None,
            _ => Some(RefuseReason::Malformed),
        };
        if let Some(reason) = reason {
            refuse(stream, reason);
        }
        RdmaError::wire(peer, error)
    };

    let client_nonce = match Message::read_from(stream) {
        Ok(Message::ClientHello { nonce }) => nonce,
        Ok(other) => return Err(malformed(stream, unexpected("ClientHello", &other))),
        Err(e) => return Err(malformed(stream, e)),
    };
    let server_nonce = random_nonce().map_err(|e| RdmaError::io("cannot draw a nonce", e))?;
    Message::ServerHello {
        nonce: server_nonce,
        proof: token.server_proof(&client_nonce, &server_nonce),
    }
    .write_to(stream)
    .map_err(|e| RdmaError::wire(peer, e))?;
    let client_qp = match Message::read_from(stream) {
        Ok(Message::ClientAuth { proof, qp }) => {
            if !proof_matches(&token.client_proof(&client_nonce, &server_nonce), &proof) {
                refuse(stream, RefuseReason::BadToken);
                return Err(RdmaError::BadToken {
                    peer: peer.to_owned(),
                });
            }
            qp
        }
        Ok(other) => return Err(malformed(stream, unexpected("ClientAuth", &other))),
        Err(e) => return Err(malformed(stream, e)),
    };
    let (qp, connection) = match acceptor.accept(&client_qp) {
        Ok(accepted) => accepted,
        Err(e) => {
            refuse(stream, RefuseReason::NoResources);
            return Err(e);
        }
    };
    Message::Accept {
        qp,
        region: acceptor.region(),
    }
    .write_to(stream)
    .map_err(|e| RdmaError::wire(peer, e))?;
    Ok(connection)
}

/// Limits of a bootstrap server.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Limit on each handshake read or write.
    pub timeout: Duration,
    /// Clients connected at once (handshaking or holding a queue pair); more
    /// connections are closed at once.
    pub max_clients: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            max_clients: 1024,
        }
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
}

struct Shared<A> {
    token: Token,
    acceptor: A,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    live: AtomicUsize,
    next_id: AtomicU64,
    clients: Arc<Mutex<Vec<(u64, TcpStream)>>>,
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
            next_id: AtomicU64::new(0),
            clients: clients.clone(),
        });
        let accept_thread = std::thread::Builder::new()
            .name("swarm-rdma-accept".into())
            .spawn(move || accept_loop(&listener, &shared))
            .map_err(|e| RdmaError::io("cannot start the bootstrap thread", e))?;
        Ok(Self {
            local_addr,
            stop,
            clients,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "unknown peer".to_owned(), |a| a.to_string());
        if shared.live.fetch_add(1, Ordering::SeqCst) >= shared.limits.max_clients {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%peer, max = shared.limits.max_clients, "too many clients, closing");
            continue;
        }
        let worker = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("swarm-rdma-client".into())
            .spawn(move || {
                serve_client(stream, &peer, &worker);
                worker.live.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(error) = spawned {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%error, "cannot start a client thread");
        }
    }
}

fn serve_client<A: Acceptor>(mut stream: TcpStream, peer: &str, shared: &Shared<A>) {
    if set_timeouts(&stream, shared.limits.timeout).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let connection = match server_handshake(&mut stream, peer, &shared.token, &shared.acceptor) {
        Ok(connection) => connection,
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
        // Passive from now on: block until the client closes the connection.
        let _ = stream.set_read_timeout(None);
        let mut sink = [0u8; 64];
        // Clients send nothing after the handshake; stray bytes are ignored.
        while let Ok(1..) = std::io::Read::read(&mut stream, &mut sink) {}
    }
    if let Ok(mut clients) = shared.clients.lock() {
        clients.retain(|(other, _)| *other != id);
    }
    drop(connection);
    tracing::info!(%peer, "client disconnected; its queue pair is destroyed");
}

/// Closes a refused connection so that the refusal is delivered: send FIN, then
/// drain what the client still sends for a moment (closing with unread input would
/// make the kernel send a reset, which can discard the refusal in flight).
fn close_gracefully(stream: &mut TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut sink = [0u8; 256];
    let mut budget: usize = 64 * 1024;
    while budget > 0 {
        match std::io::Read::read(stream, &mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => budget = budget.saturating_sub(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::{sample_header, sample_qp};
    use std::io::Read;
    use std::sync::atomic::AtomicU32;

    /// An acceptor without a device: hands out fake queue pair numbers and counts
    /// live connections.
    struct FakeAcceptor {
        next_qpn: AtomicU32,
        live: Arc<AtomicUsize>,
        fail: bool,
    }

    struct FakeConnection(Arc<AtomicUsize>);

    impl Drop for FakeConnection {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Acceptor for FakeAcceptor {
        type Connection = FakeConnection;

        fn region(&self) -> RegionInfo {
            RegionInfo {
                addr: 0x1000_0000,
                rkey: 0x42,
                size: 1 << 20,
                header: sample_header(1 << 20),
            }
        }

        fn accept(&self, client: &QpInfo) -> Result<(QpInfo, FakeConnection), RdmaError> {
            if self.fail {
                return Err(RdmaError::Config("no queue pairs left".into()));
            }
            self.live.fetch_add(1, Ordering::SeqCst);
            let qp = QpInfo {
                qpn: self.next_qpn.fetch_add(1, Ordering::SeqCst),
                psn: client.psn ^ 1,
                ..*client
            };
            Ok((qp, FakeConnection(self.live.clone())))
        }
    }

    fn start(token: &Token, fail: bool) -> (Server, Arc<AtomicUsize>) {
        let live = Arc::new(AtomicUsize::new(0));
        let acceptor = FakeAcceptor {
            next_qpn: AtomicU32::new(100),
            live: live.clone(),
            fail,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let limits = ServerLimits {
            timeout: Duration::from_millis(500),
            max_clients: 8,
        };
        let server = Server::start(listener, token.clone(), acceptor, limits).unwrap();
        (server, live)
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn handshake_exchanges_queue_pairs_and_region_and_tracks_liveness() {
        let token = Token::generate().unwrap();
        let (server, live) = start(&token, false);
        let addr = server.local_addr().to_string();
        let a = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let b = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        assert_eq!(a.region.rkey, 0x42);
        assert_eq!(a.region.header, sample_header(1 << 20));
        assert_eq!(a.qp.psn, sample_qp().psn ^ 1);
        assert_ne!(a.qp.qpn, b.qp.qpn, "one queue pair per client");
        assert_eq!(live.load(Ordering::SeqCst), 2);
        // Closing a client's connection destroys its queue pair on the node.
        drop(a);
        wait_for("the first queue pair to go", || {
            live.load(Ordering::SeqCst) == 1
        });
        server.shutdown();
        wait_for("every queue pair to go", || {
            live.load(Ordering::SeqCst) == 0
        });
        drop(b);
    }

    #[test]
    fn wrong_token_is_refused_both_ways() {
        let token = Token::generate().unwrap();
        let other = Token::generate().unwrap();
        let (server, live) = start(&token, false);
        let addr = server.local_addr().to_string();
        // The client holds another token: the node's proof does not verify, so the
        // client stops before proving anything.
        let error = connect(&addr, &other, &sample_qp(), DEFAULT_TIMEOUT).unwrap_err();
        assert!(matches!(error, RdmaError::BadToken { .. }), "{error}");
        assert!(error.to_string().contains("token"));
        // A client that skips the check and answers with a bad proof is refused.
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        Message::ClientHello { nonce: [9; 32] }
            .write_to(&mut stream)
            .unwrap();
        let Message::ServerHello { .. } = Message::read_from(&mut stream).unwrap() else {
            panic!("expected ServerHello")
        };
        Message::ClientAuth {
            proof: [0; 32],
            qp: sample_qp(),
        }
        .write_to(&mut stream)
        .unwrap();
        assert_eq!(
            Message::read_from(&mut stream).unwrap(),
            Message::Refuse {
                reason: RefuseReason::BadToken
            }
        );
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "no queue pair for intruders"
        );
        // The server still serves good clients.
        connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        server.shutdown();
    }

    #[test]
    fn malformed_messages_are_refused_without_stopping_the_server() {
        let token = Token::generate().unwrap();
        let (server, live) = start(&token, false);
        let garbage: [&[u8]; 4] = [
            b"GET / HTTP/1.1\r\n\r\n",
            &[0xff; 64],
            // A valid header announcing an oversized payload.
            &{
                let mut frame = Message::ClientHello { nonce: [0; 32] }.encode();
                frame[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
                frame
            },
            // The right message type out of turn.
            &Message::Refuse {
                reason: RefuseReason::Malformed,
            }
            .encode(),
        ];
        for bytes in garbage {
            let mut stream = TcpStream::connect(server.local_addr()).unwrap();
            stream.write_all(bytes).unwrap();
            let reply = Message::read_from(&mut stream).unwrap();
            assert_eq!(
                reply,
                Message::Refuse {
                    reason: RefuseReason::Malformed
                }
            );
            // And the node closed the connection.
            let mut rest = Vec::new();
            assert_eq!(stream.read_to_end(&mut rest).unwrap_or(0), 0);
        }
        // A client that sends half a message and stalls is timed out.
        let mut stalled = TcpStream::connect(server.local_addr()).unwrap();
        stalled
            .write_all(&Message::ClientHello { nonce: [0; 32] }.encode()[..5])
            .unwrap();
        let mut rest = Vec::new();
        stalled
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(stalled.read_to_end(&mut rest).unwrap_or(0), 0);
        assert_eq!(live.load(Ordering::SeqCst), 0);
        let addr = server.local_addr().to_string();
        connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        server.shutdown();
    }

    #[test]
    fn client_refuses_a_non_swarm_server_and_reports_refusals() {
        // A "server" that answers with garbage.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut hello = [0u8; 44];
            stream.read_exact(&mut hello).unwrap();
            stream.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").unwrap();
        });
        let token = Token::generate().unwrap();
        let error = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap_err();
        assert!(
            matches!(
                error,
                RdmaError::Wire {
                    source: WireError::BadMagic,
                    ..
                }
            ),
            "{error}"
        );
        fake.join().unwrap();

        // A memory node that cannot create a queue pair refuses cleanly.
        let (server, _) = start(&token, true);
        let error = connect(
            &server.local_addr().to_string(),
            &token,
            &sample_qp(),
            DEFAULT_TIMEOUT,
        )
        .unwrap_err();
        assert!(
            matches!(
                error,
                RdmaError::Refused {
                    reason: RefuseReason::NoResources,
                    ..
                }
            ),
            "{error}"
        );
        server.shutdown();
    }

    #[test]
    fn unreachable_node_is_a_clear_error() {
        // Bind then drop: nothing listens on that port any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let token = Token::generate().unwrap();
        let error = connect(&addr, &token, &sample_qp(), Duration::from_millis(500)).unwrap_err();
        assert!(error.to_string().contains("swarm memnode"), "{error}");
    }
}
