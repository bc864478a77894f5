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
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::auth::{Token, random_nonce};
use crate::error::RdmaError;
use crate::wire::{Message, QpInfo, RefuseReason, RegionInfo, WireError};

mod server;
#[cfg(test)]
mod tests;

pub use server::{Server, ServerLimits};

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
            if !token.verify_server_proof(&client_nonce, &nonce, &proof) {
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
            if !token.verify_client_proof(&client_nonce, &server_nonce, &proof) {
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
