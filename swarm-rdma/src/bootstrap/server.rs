//! The memory node's bootstrap server: one accept thread, one thread per client that
//! sleeps on the idle connection until the client leaves.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Acceptor, DEFAULT_TIMEOUT, server_handshake, set_timeouts};
use crate::auth::Token;
use crate::error::RdmaError;

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
