//! The TCP bootstrap: how a client and a memory node authenticate each other and
//! exchange what their queue pairs need, before one-sided verbs take over.
//!
//! ```text
//! client                                   memory node
//!   ClientHello { client nonce }      ─────▶
//!                                     ◀─────  ServerHello { node nonce, proof(T) }
//!   (checks the node's proof)
//!   ClientAuth { seal_c(T, QP) }      ─────▶
//!                                            (opens it, which proves the client's
//!                                             token; creates a QP for the client
//!                                             and moves it to RTR)
//!                                     ◀─────  Accept { seal_n(T, QP, region) }
//!                                           | Refuse { reason, proof(T) }
//!   (opens it; moves its own QP to RTR, RTS)
//! ```
//!
//! `T` is the transcript: every byte of every earlier frame and the message's own
//! header, so each proof and seal binds both nonces and every field exchanged so
//! far; `seal_c`/`seal_n` encrypt under per-handshake keys derived from the token
//! (one per direction). A relay can neither swap the client's queue pair, nor read
//! or replace the region's address and rkey, nor forge or replay an `Accept` or a
//! `Refuse`: each makes the handshake fail ([`RdmaError::Tampered`],
//! [`RdmaError::BadToken`]). The token never crosses the wire; [`crate::auth::session`]
//! gives the construction and why it is not Noise. The TCP connection then
//! stays open, idle, for as long as the client uses the queue pair: when it closes
//! (the client exits or crashes), the memory node destroys that client's queue pair.
//! Apart from that the memory node's CPU does nothing (passive memory, SWARM §2.1).
//!
//! Everything here is device-independent: the memory node plugs its verbs-specific
//! part in through [`Acceptor`], so the whole exchange is tested on loopback TCP.
//! Each side gives the whole handshake one absolute deadline (not a per-read timeout
//! that a peer trickling bytes could stretch forever), and a malformed message is
//! answered with a refusal and a closed connection, never a panic. The memory node
//! also bounds unauthenticated connections ([`ServerLimits`]).
//!
//! After the handshake the connection stays open and may carry one more kind of
//! request: a **lease watch** ([`crate::lease_watch`], [`Session::request_watch`]).
//! The client names its lease word; the memory node reads it every
//! [`ServerLimits::watch_period`] and, once it is killed or stalled, destroys the
//! client's queue pair (no more of its verbs land), sends a proved
//! `Refuse(LeaseExpired)` and closes the connection. The request is sealed with the
//! session's keys under the next message index and covered by the transcript, like
//! the handshake's own messages, so nobody without the session can make a node cut
//! (or stop watching) someone else's client. State per client: one watch.
//!
//! A client may also send a **revocation** ([`Session::request_revoke`]): a
//! reclaimer asks the node to cut the clients watching a killed lease word, and the
//! node answers once their queue pairs are destroyed ([`crate::lease_watch`],
//! "Revocation"). Sealed and proved the same way; state per node: one revocation
//! floor per revoked word.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::auth::Token;
use crate::error::RdmaError;
use crate::wire::{QpInfo, RegionInfo};

#[cfg(test)]
mod attack_tests;
mod deadline;
mod handshake;
mod server;
#[cfg(test)]
mod tests;

pub use handshake::{
    Request, Session, client_handshake, client_handshake_session, server_handshake,
};
pub use server::{PreAuthStats, Server, ServerLimits};

/// Default time for a whole handshake (connecting included, on the client).
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

    /// The 8-byte word at `offset` of the served memory, read atomically, for the
    /// lease watch ([`crate::lease_watch`]); `None` if out of bounds or unaligned
    /// (then no client can be watched).
    fn read_word(&self, offset: u64) -> Option<u64> {
        let _ = offset;
        None
    }
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
    /// The handshake's session, for a lease watch on `stream`
    /// ([`Session::request_watch`]).
    pub session: Session,
}

/// Connects to the memory node at `addr` and runs the client side of the handshake,
/// all within `timeout`. `local_qp` describes the client's queue pair (already
/// created, in INIT).
pub fn connect(
    addr: &str,
    token: &Token,
    local_qp: &QpInfo,
    timeout: Duration,
) -> Result<Accepted, RdmaError> {
    let deadline = Instant::now() + timeout;
    let stream = open(addr, timeout)?;
    let (qp, region, session) = client_handshake_session(
        &mut deadline::Deadline::new(&stream, deadline),
        addr,
        token,
        local_qp,
    )?;
    // The connection now only signals liveness: no more timeouts on it.
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Ok(Accepted {
        qp,
        region,
        stream,
        session,
    })
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
