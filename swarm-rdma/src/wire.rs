//! The bootstrap wire format: versioned, length-prefixed binary messages over TCP.
//!
//! Before one-sided verbs can flow, a client and a memory node must exchange what
//! each side's queue pair needs to connect (LID, GID, QP number, first PSN, MTU,
//! responder resources) and what the client needs to address the node's memory
//! (region address, rkey, size, node header). That exchange runs over a plain TCP
//! connection; this module is its encoding, and [`crate::bootstrap`] its sequence.
//!
//! Every frame is a 12-byte header followed by at most [`MAX_PAYLOAD`] bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | magic `b"SWRB"` |
//! | 4 | 2 | protocol version ([`PROTOCOL_VERSION`]) |
//! | 6 | 1 | message type |
//! | 7 | 1 | reserved, zero |
//! | 8 | 4 | payload length |
//!
//! All integers are little endian. Bytes from the network are untrusted: decoding
//! checks every length and field and fails with a [`WireError`], never a panic.
//!
//! Payloads of version 5 (every length is fixed):
//!
//! | message | payload |
//! |---------|---------|
//! | `ClientHello` | client nonce (32) |
//! | `ServerHello` | node nonce (32), proof (32) |
//! | `ClientAuth` | sealed [`QpInfo`] ([`QP_INFO_LEN`]), tag (16) |
//! | `Accept` | sealed [`QpInfo`] and [`RegionInfo`] ([`ACCEPT_BODY_LEN`]), tag (16) |
//! | `Refuse` | reason (1), proof (32; zero when the node could not read a `ClientHello`) |
//! | `Watch` | sealed [`WatchRequest`](crate::lease_watch::WatchRequest) ([`WATCH_REQUEST_LEN`]), tag (16) |
//! | `Watching` | proof (32) |
//! | `Revoke` | sealed [`RevokeRequest`](crate::lease_watch::RevokeRequest) ([`REVOKE_REQUEST_LEN`]), tag (16) |
//! | `Revoked` | the lease word as the node read it (8), proof (32) |
//!
//! Version 1 carried queue pairs, the region's address and its rkey in clear and
//! authenticated none of them; [`crate::auth::session`] says how version 2 proves and
//! seals them. Version 3 adds the memory node's incarnation to [`RegionInfo`]. Version 4
//! adds the lease watch after the handshake ([`crate::lease_watch`]): the client sends
//! `Watch` (sealed, its `n`th message under its key), the node answers `Watching` or
//! `Refuse` (proved over the transcript), and later cuts the client with a proved
//! `Refuse` ([`RefuseReason::LeaseExpired`]). Version 5 adds the owner's generation
//! base to the watch and the revocation (`Revoke`, answered by `Revoked` once the
//! node cut the revoked clients, or by a proved `Refuse`; [`crate::lease_watch`],
//! "Revocation"). Sealed fields are decoded with [`QpInfo::from_bytes`] and
//! [`decode_accept_body`] once opened.

use std::io::{self, Read, Write};

use swarm_core::header::{ENCODED_LEN, HEADER_SIZE, HeaderError, NodeHeader};

use crate::auth::session::{SealTag, TAG_LEN};
use crate::auth::{NONCE_LEN, Nonce, PROOF_LEN, Proof};
use crate::lease_watch::{REVOKE_REQUEST_LEN, WATCH_REQUEST_LEN};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"SWRB";
/// The bootstrap protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 5;
/// Bytes in a frame header.
pub const FRAME_HEADER_LEN: usize = 12;
/// The largest payload accepted; every valid message is far smaller.
pub const MAX_PAYLOAD: u32 = 1024;

/// Bytes of an encoded [`QpInfo`].
pub const QP_INFO_LEN: usize = 2 + 16 + 4 + 4 + 1 + 1;
const REGION_INFO_LEN: usize = 8 + 4 + 8 + 8 + ENCODED_LEN;
/// Bytes of `Accept`'s sealed body: the node's [`QpInfo`] and [`RegionInfo`].
pub const ACCEPT_BODY_LEN: usize = QP_INFO_LEN + REGION_INFO_LEN;
/// Queue pair numbers and packet sequence numbers are 24-bit quantities.
const MAX_24_BIT: u32 = (1 << 24) - 1;

/// Why bootstrap bytes were refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The connection ended in the middle of a frame.
    #[error("the connection closed in the middle of a bootstrap message")]
    Truncated,
    /// The peer did not send a complete message in time.
    #[error("timed out waiting for the peer's bootstrap message")]
    TimedOut,
    /// Reading or writing the socket failed.
    #[error("bootstrap connection failed: {0}")]
    Io(io::Error),
    /// The frame does not start with the magic bytes: not a swarm-rdma peer.
    #[error("not a swarm-rdma bootstrap message (bad magic bytes): is the address right?")]
    BadMagic,
    /// The peer speaks another protocol version.
    #[error(
        "bootstrap protocol version {found} is not supported (this build speaks {PROTOCOL_VERSION}): run the same swarm version on clients and memory nodes"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// The payload length is beyond [`MAX_PAYLOAD`].
    #[error("bootstrap message of {len} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    Oversized {
        /// The announced length.
        len: u32,
    },
    /// An unknown message type.
    #[error("unknown bootstrap message type {0}")]
    UnknownType(u8),
    /// A payload whose length does not match its type.
    #[error("{kind} message has {len} payload bytes, expected {expected}")]
    BadLength {
        /// The message type.
        kind: &'static str,
        /// Bytes found.
        len: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// A field is out of range.
    #[error("invalid bootstrap field: {0}")]
    BadField(&'static str),
    /// The node header carried in a region description is invalid.
    #[error("the memory node's header is invalid: {0}")]
    Header(HeaderError),
    /// A well-formed message arrived out of turn.
    #[error("expected a {expected} message, received {found}")]
    Unexpected {
        /// What the protocol expected.
        expected: &'static str,
        /// What arrived.
        found: &'static str,
    },
    /// Bytes followed the single frame that was expected.
    #[error("{0} trailing bytes after a bootstrap message")]
    Trailing(usize),
}

impl From<io::Error> for WireError {
    fn from(error: io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::UnexpectedEof => Self::Truncated,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::TimedOut,
            _ => Self::Io(error),
        }
    }
}

/// What one side's queue pair needs the other side to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// Port LID (InfiniBand); zero on RoCE.
    pub lid: u16,
    /// Port GID at the configured index (all zero when not using a GRH).
    pub gid: [u8; 16],
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// Active path MTU as an `ibv_mtu` code, 1 (256 B) to 5 (4096 B).
    pub mtu: u8,
    /// Outstanding RDMA READs/atomics this side can take as a responder (the
    /// memory node) or issue as a requester (the client); at least 1.
    pub max_rd_atomic: u8,
}

/// Where a memory node's registered memory is and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Virtual address of byte 0 of the node's memory on the memory node.
    pub addr: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
    /// Bytes registered, header included.
    pub size: u64,
    /// The node header stored in the first bytes of the region.
    pub header: NodeHeader,
    /// Random, non-zero, drawn when the memory node process started: a node that
    /// restarts (with empty memory) has a new one, so a client that knew the old
    /// one never takes it for the node it was talking to.
    pub incarnation: u64,
}

/// Why a memory node refused a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefuseReason {
    /// The client's proof of the cluster token is wrong.
    BadToken,
    /// The client speaks another protocol version.
    UnsupportedVersion,
    /// The client sent a malformed or unexpected message.
    Malformed,
    /// The memory node could not create a queue pair for the client.
    NoResources,
    /// The memory node already serves as many clients as it is configured for.
    TooManyClients,
    /// The client asked to watch a word outside the region, unaligned, or with a
    /// stall time out of range.
    BadWatch,
    /// The client's lease word was killed or stopped changing: its queue pair is cut.
    LeaseExpired,
}

impl RefuseReason {
    fn code(self) -> u8 {
        match self {
            Self::BadToken => 1,
            Self::UnsupportedVersion => 2,
            Self::Malformed => 3,
            Self::NoResources => 4,
            Self::TooManyClients => 5,
            Self::BadWatch => 6,
            Self::LeaseExpired => 7,
        }
    }

    fn from_code(code: u8) -> Result<Self, WireError> {
        Ok(match code {
            1 => Self::BadToken,
            2 => Self::UnsupportedVersion,
            3 => Self::Malformed,
            4 => Self::NoResources,
            5 => Self::TooManyClients,
            6 => Self::BadWatch,
            7 => Self::LeaseExpired,
            _ => return Err(WireError::BadField("unknown refusal reason")),
        })
    }
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::BadToken => {
                "wrong cluster token: use the token file created by `swarm init` for this cluster"
            }
            Self::UnsupportedVersion => {
                "unsupported protocol version: run the same swarm version everywhere"
            }
            Self::Malformed => "malformed bootstrap message",
            Self::NoResources => {
                "the memory node could not create a queue pair (see its log for the verbs error)"
            }
            Self::TooManyClients => {
                "the memory node serves its maximum number of clients; retry when some have left"
            }
            Self::BadWatch => {
                "the lease watch names a word outside the memory node's region or an invalid stall time (a client bug: see the memory node's log)"
            }
            Self::LeaseExpired => {
                "the client's lease expired (its lease word was killed or not renewed in time): the memory node cut its queue pair; open a new client"
            }
        })
    }
}

/// One bootstrap message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client → node: opens the handshake with the client's nonce.
    ClientHello {
        /// The client's fresh nonce.
        nonce: Nonce,
    },
    /// Node → client: the node's nonce and its proof of the token.
    ServerHello {
        /// The node's fresh nonce.
        nonce: Nonce,
        /// The node's proof over the transcript and this message's nonce.
        proof: Proof,
    },
    /// Client → node: the client's queue pair, sealed (which proves the token).
    ClientAuth {
        /// The client's [`QpInfo`], encrypted.
        sealed_qp: [u8; QP_INFO_LEN],
        /// Its authentication tag.
        tag: SealTag,
    },
    /// Node → client: the node's queue pair (already ready to receive) and region,
    /// sealed.
    Accept {
        /// The node's [`QpInfo`] and [`RegionInfo`], encrypted.
        sealed: [u8; ACCEPT_BODY_LEN],
        /// Their authentication tag.
        tag: SealTag,
    },
    /// Node → client: the connection is refused; the node closes it.
    Refuse {
        /// Why.
        reason: RefuseReason,
        /// The node's proof over the transcript and the reason; all zero when the
        /// node could not read the client's nonce (nothing to bind it to).
        proof: Proof,
    },
    /// Client → node, after `Accept`: watch my lease word ([`crate::lease_watch`]).
    Watch {
        /// The [`crate::lease_watch::WatchRequest`], encrypted.
        sealed: [u8; WATCH_REQUEST_LEN],
        /// Its authentication tag.
        tag: SealTag,
    },
    /// Node → client: the watch is armed.
    Watching {
        /// The node's proof over the transcript.
        proof: Proof,
    },
    /// Client → node, after `Accept`: revoke the clients watching a lease word
    /// ([`crate::lease_watch`], "Revocation").
    Revoke {
        /// The [`crate::lease_watch::RevokeRequest`], encrypted.
        sealed: [u8; REVOKE_REQUEST_LEN],
        /// Its authentication tag.
        tag: SealTag,
    },
    /// Node → client: the revocation is done if `word` is killed (every client it
    /// revokes is cut), else nothing was revoked.
    Revoked {
        /// The lease word as the node read it.
        word: u64,
        /// The node's proof over the transcript and the word.
        proof: Proof,
    },
}

impl Message {
    fn type_code(&self) -> u8 {
        match self {
            Self::ClientHello { .. } => 1,
            Self::ServerHello { .. } => 2,
            Self::ClientAuth { .. } => 3,
            Self::Accept { .. } => 4,
            Self::Refuse { .. } => 5,
            Self::Watch { .. } => 6,
            Self::Watching { .. } => 7,
            Self::Revoke { .. } => 8,
            Self::Revoked { .. } => 9,
        }
    }

    /// The message's name, for errors.
    pub fn kind(&self) -> &'static str {
        kind_name(self.type_code())
    }

    /// Encodes the message as one frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(128);
        match self {
            Self::ClientHello { nonce } => payload.extend_from_slice(nonce),
            Self::ServerHello { nonce, proof } => {
                payload.extend_from_slice(nonce);
                payload.extend_from_slice(proof);
            }
            Self::ClientAuth { sealed_qp, tag } => {
                payload.extend_from_slice(sealed_qp);
                payload.extend_from_slice(tag);
            }
            Self::Accept { sealed, tag } => {
                payload.extend_from_slice(sealed);
                payload.extend_from_slice(tag);
            }
            Self::Refuse { reason, proof } => {
                payload.push(reason.code());
                payload.extend_from_slice(proof);
            }
            Self::Watch { sealed, tag } => {
                payload.extend_from_slice(sealed);
                payload.extend_from_slice(tag);
            }
            Self::Watching { proof } => payload.extend_from_slice(proof),
            Self::Revoke { sealed, tag } => {
                payload.extend_from_slice(sealed);
                payload.extend_from_slice(tag);
            }
            Self::Revoked { word, proof } => {
                payload.extend_from_slice(&word.to_le_bytes());
                payload.extend_from_slice(proof);
            }
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        frame.push(self.type_code());
        frame.push(0);
        // Payloads are at most a few hundred bytes.
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&payload);
        frame
    }

    /// Decodes exactly one frame from `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let header = bytes.get(..FRAME_HEADER_LEN).ok_or(WireError::Truncated)?;
        let (type_code, len) = parse_frame_header(header)?;
        let payload = &bytes[FRAME_HEADER_LEN..];
        match payload.len().cmp(&(len as usize)) {
            std::cmp::Ordering::Less => Err(WireError::Truncated),
            std::cmp::Ordering::Greater => Err(WireError::Trailing(payload.len() - len as usize)),
            std::cmp::Ordering::Equal => decode_payload(type_code, payload),
        }
    }

    /// Writes the message to `stream`.
    pub fn write_to(&self, stream: &mut impl Write) -> Result<(), WireError> {
        stream.write_all(&self.encode())?;
        stream.flush()?;
        Ok(())
    }

    /// Reads one message from `stream` (never more than one frame's bytes).
    pub fn read_from(stream: &mut impl Read) -> Result<Self, WireError> {
        Self::read_frame(stream).map(|(message, _)| message)
    }

    /// Reads one message from `stream` and returns it with the exact bytes of its
    /// frame (for the handshake transcript).
    pub fn read_frame(stream: &mut impl Read) -> Result<(Self, Vec<u8>), WireError> {
        let mut frame = vec![0u8; FRAME_HEADER_LEN];
        stream.read_exact(&mut frame)?;
        let (type_code, len) = parse_frame_header(&frame)?;
        frame.resize(FRAME_HEADER_LEN + len as usize, 0);
        stream.read_exact(&mut frame[FRAME_HEADER_LEN..])?;
        let message = decode_payload(type_code, &frame[FRAME_HEADER_LEN..])?;
        Ok((message, frame))
    }
}

fn kind_name(type_code: u8) -> &'static str {
    match type_code {
        1 => "ClientHello",
        2 => "ServerHello",
        3 => "ClientAuth",
        4 => "Accept",
        5 => "Refuse",
        6 => "Watch",
        7 => "Watching",
        8 => "Revoke",
        9 => "Revoked",
        _ => "unknown",
    }
}

/// Validates a frame header; returns the message type and payload length.
fn parse_frame_header(header: &[u8]) -> Result<(u8, u32), WireError> {
    if header[0..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion { found: version });
    }
    let type_code = header[6];
    if kind_name(type_code) == "unknown" {
        return Err(WireError::UnknownType(type_code));
    }
    if header[7] != 0 {
        return Err(WireError::BadField("reserved header byte is not zero"));
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if len > MAX_PAYLOAD {
        return Err(WireError::Oversized { len });
    }
    Ok((type_code, len))
}

/// A cursor over a payload whose total length was checked up front.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.0[..N]);
        self.0 = &self.0[N..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

fn decode_payload(type_code: u8, payload: &[u8]) -> Result<Message, WireError> {
    let kind = kind_name(type_code);
    let expected = match type_code {
        1 => NONCE_LEN,
        2 => NONCE_LEN + PROOF_LEN,
        3 => QP_INFO_LEN + TAG_LEN,
        4 => ACCEPT_BODY_LEN + TAG_LEN,
        5 => 1 + PROOF_LEN,
        6 => WATCH_REQUEST_LEN + TAG_LEN,
        7 => PROOF_LEN,
        8 => REVOKE_REQUEST_LEN + TAG_LEN,
        9 => 8 + PROOF_LEN,
        other => return Err(WireError::UnknownType(other)),
    };
    if payload.len() != expected {
        return Err(WireError::BadLength {
            kind,
            len: payload.len(),
            expected,
        });
    }
    let mut f = Fields(payload);
    Ok(match type_code {
        1 => Message::ClientHello { nonce: f.take() },
        2 => Message::ServerHello {
            nonce: f.take(),
            proof: f.take(),
        },
        3 => Message::ClientAuth {
            sealed_qp: f.take(),
            tag: f.take(),
        },
        4 => Message::Accept {
            sealed: f.take(),
            tag: f.take(),
        },
        5 => Message::Refuse {
            reason: RefuseReason::from_code(f.u8())?,
            proof: f.take(),
        },
        6 => Message::Watch {
            sealed: f.take(),
            tag: f.take(),
        },
        7 => Message::Watching { proof: f.take() },
        8 => Message::Revoke {
            sealed: f.take(),
            tag: f.take(),
        },
        _ => Message::Revoked {
            word: f.u64(),
            proof: f.take(),
        },
    })
}

impl QpInfo {
    /// The encoded form (sealed inside `ClientAuth` and `Accept`).
    pub fn to_bytes(&self) -> [u8; QP_INFO_LEN] {
        let mut out = Vec::with_capacity(QP_INFO_LEN);
        encode_qp(self, &mut out);
        let mut bytes = [0u8; QP_INFO_LEN];
        bytes.copy_from_slice(&out);
        bytes
    }

    /// Decodes and checks an encoded queue pair description.
    pub fn from_bytes(bytes: &[u8; QP_INFO_LEN]) -> Result<Self, WireError> {
        decode_qp(&mut Fields(&bytes[..]))
    }
}

/// The body sealed inside `Accept`: the node's queue pair and region.
pub fn encode_accept_body(qp: &QpInfo, region: &RegionInfo) -> [u8; ACCEPT_BODY_LEN] {
    let mut out = Vec::with_capacity(ACCEPT_BODY_LEN);
    encode_qp(qp, &mut out);
    out.extend_from_slice(&region.addr.to_le_bytes());
    out.extend_from_slice(&region.rkey.to_le_bytes());
    out.extend_from_slice(&region.size.to_le_bytes());
    out.extend_from_slice(&region.incarnation.to_le_bytes());
    out.extend_from_slice(&region.header.encode());
    let mut bytes = [0u8; ACCEPT_BODY_LEN];
    bytes.copy_from_slice(&out);
    bytes
}

/// Decodes and checks an opened `Accept` body.
pub fn decode_accept_body(
    bytes: &[u8; ACCEPT_BODY_LEN],
) -> Result<(QpInfo, RegionInfo), WireError> {
    let mut f = Fields(&bytes[..]);
    let qp = decode_qp(&mut f)?;
    let addr = f.u64();
    let rkey = f.u32();
    let size = f.u64();
    let incarnation = f.u64();
    let header_bytes: [u8; ENCODED_LEN] = f.take();
    if incarnation == 0 {
        return Err(WireError::BadField("the memory node's incarnation is zero"));
    }
    if size < HEADER_SIZE {
        return Err(WireError::BadField("region is smaller than a node header"));
    }
    if addr.checked_add(size).is_none() {
        return Err(WireError::BadField("region wraps around the address space"));
    }
    let header = NodeHeader::decode(&header_bytes, size).map_err(WireError::Header)?;
    if header.size != size {
        return Err(WireError::BadField(
            "region size differs from the size in its node header",
        ));
    }
    Ok((
        qp,
        RegionInfo {
            addr,
            rkey,
            size,
            header,
            incarnation,
        },
    ))
}

fn encode_qp(qp: &QpInfo, out: &mut Vec<u8>) {
    out.extend_from_slice(&qp.lid.to_le_bytes());
    out.extend_from_slice(&qp.gid);
    out.extend_from_slice(&qp.qpn.to_le_bytes());
    out.extend_from_slice(&qp.psn.to_le_bytes());
    out.push(qp.mtu);
    out.push(qp.max_rd_atomic);
}

fn decode_qp(f: &mut Fields<'_>) -> Result<QpInfo, WireError> {
    let qp = QpInfo {
        lid: f.u16(),
        gid: f.take(),
        qpn: f.u32(),
        psn: f.u32(),
        mtu: f.u8(),
        max_rd_atomic: f.u8(),
    };
    if qp.qpn > MAX_24_BIT {
        return Err(WireError::BadField("queue pair number exceeds 24 bits"));
    }
    if qp.psn > MAX_24_BIT {
        return Err(WireError::BadField(
            "packet sequence number exceeds 24 bits",
        ));
    }
    if !(1..=5).contains(&qp.mtu) {
        return Err(WireError::BadField("path MTU code is not 1..=5"));
    }
    if qp.max_rd_atomic == 0 {
        return Err(WireError::BadField("zero outstanding reads/atomics"));
    }
    Ok(qp)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn sample_qp() -> QpInfo {
        QpInfo {
            lid: 7,
            gid: [0xfe; 16],
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            mtu: 3,
            max_rd_atomic: 16,
        }
    }

    pub(crate) fn sample_header(size: u64) -> NodeHeader {
        NodeHeader {
            node_id: 1,
            node_count: 3,
            size,
            cluster_id: 0xc1,
            epoch_unix_ns: 1_700_000_000_000_000_000,
            tick_ns: 1_000,
        }
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::ClientHello { nonce: [1; 32] },
            Message::ServerHello {
                nonce: [2; 32],
                proof: [3; 32],
            },
            Message::ClientAuth {
                sealed_qp: [4; QP_INFO_LEN],
                tag: [5; TAG_LEN],
            },
            Message::Accept {
                sealed: [6; ACCEPT_BODY_LEN],
                tag: [7; TAG_LEN],
            },
            Message::Refuse {
                reason: RefuseReason::BadToken,
                proof: [8; PROOF_LEN],
            },
            Message::Watch {
                sealed: [9; WATCH_REQUEST_LEN],
                tag: [10; TAG_LEN],
            },
            Message::Watching {
                proof: [11; PROOF_LEN],
            },
            Message::Refuse {
                reason: RefuseReason::LeaseExpired,
                proof: [12; PROOF_LEN],
            },
            Message::Revoke {
                sealed: [13; REVOKE_REQUEST_LEN],
                tag: [14; TAG_LEN],
            },
            Message::Revoked {
                word: 0x8000_0000_0000_0015,
                proof: [15; PROOF_LEN],
            },
        ]
    }

    #[test]
    fn every_message_roundtrips_through_bytes_and_streams() {
        for message in samples() {
            let bytes = message.encode();
            assert_eq!(Message::decode(&bytes).unwrap(), message);
            let mut cursor = std::io::Cursor::new(bytes);
            assert_eq!(Message::read_from(&mut cursor).unwrap(), message);
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        for message in samples() {
            let bytes = message.encode();
            for cut in 0..bytes.len() {
                assert!(
                    Message::decode(&bytes[..cut]).is_err(),
                    "{} cut at {cut} decoded",
                    message.kind()
                );
                let mut cursor = std::io::Cursor::new(&bytes[..cut]);
                assert!(matches!(
                    Message::read_from(&mut cursor),
                    Err(WireError::Truncated)
                ));
            }
        }
    }

    #[test]
    fn header_violations_are_named() {
        let good = Message::ClientHello { nonce: [0; 32] }.encode();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(Message::decode(&bad), Err(WireError::BadMagic)));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(
            Message::decode(&bad),
            Err(WireError::UnsupportedVersion { found: 9 })
        ));
        let mut bad = good.clone();
        bad[6] = 42;
        assert!(matches!(
            Message::decode(&bad),
            Err(WireError::UnknownType(42))
        ));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Message::read_from(&mut std::io::Cursor::new(bad)),
            Err(WireError::Oversized { len: u32::MAX })
        ));
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(Message::decode(&bad), Err(WireError::Trailing(1))));
    }

    fn sample_region() -> RegionInfo {
        RegionInfo {
            addr: 0x7f00_0000_0000,
            rkey: 0xdead,
            size: 1 << 20,
            header: sample_header(1 << 20),
            incarnation: 0x1ca7,
        }
    }

    #[test]
    fn sealed_bodies_roundtrip() {
        let qp = sample_qp();
        assert_eq!(QpInfo::from_bytes(&qp.to_bytes()).unwrap(), qp);
        let body = encode_accept_body(&qp, &sample_region());
        assert_eq!(decode_accept_body(&body).unwrap(), (qp, sample_region()));
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        let mut qp = sample_qp();
        qp.qpn = 1 << 24;
        assert!(matches!(
            QpInfo::from_bytes(&qp.to_bytes()),
            Err(WireError::BadField(_))
        ));
        for mtu in [0, 6] {
            let qp = QpInfo { mtu, ..sample_qp() };
            assert!(QpInfo::from_bytes(&qp.to_bytes()).is_err());
        }
        // A region whose header disagrees with its size.
        let region = RegionInfo {
            addr: 0,
            rkey: 1,
            size: 1 << 21,
            header: sample_header(1 << 20),
            incarnation: 1,
        };
        assert!(matches!(
            decode_accept_body(&encode_accept_body(&sample_qp(), &region)),
            Err(WireError::BadField(_))
        ));
        // A header that claims more bytes than the region has.
        let region = RegionInfo {
            addr: 0,
            rkey: 1,
            size: 1 << 20,
            header: sample_header(1 << 21),
            incarnation: 1,
        };
        assert!(matches!(
            decode_accept_body(&encode_accept_body(&sample_qp(), &region)),
            Err(WireError::Header(_))
        ));
        // A node without an incarnation.
        let region = RegionInfo {
            incarnation: 0,
            ..sample_region()
        };
        assert!(matches!(
            decode_accept_body(&encode_accept_body(&sample_qp(), &region)),
            Err(WireError::BadField(_))
        ));
        // An unknown refusal reason.
        let mut bytes = Message::Refuse {
            reason: RefuseReason::Malformed,
            proof: [0; PROOF_LEN],
        }
        .encode();
        bytes[FRAME_HEADER_LEN] = 99;
        assert!(matches!(
            Message::decode(&bytes),
            Err(WireError::BadField(_))
        ));
    }

    #[test]
    fn read_frame_returns_the_exact_bytes() {
        for message in samples() {
            let bytes = message.encode();
            let (read, frame) = Message::read_frame(&mut std::io::Cursor::new(&bytes)).unwrap();
            assert_eq!((read, frame), (message, bytes));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Random bytes never panic the decoder (proptest prints the failing input
        /// and persists its seed on failure).
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode(&bytes);
            let _ = Message::read_from(&mut std::io::Cursor::new(&bytes));
        }

        /// Valid frames with random payload bytes and random corruption never panic.
        #[test]
        fn corrupted_valid_frames_never_panic(which in 0usize..8, at in any::<prop::sample::Index>(), byte: u8) {
            let mut bytes = samples()[which].encode();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let _ = Message::decode(&bytes);
        }

        /// Random opened bodies never panic their decoders.
        #[test]
        fn random_bodies_never_panic(qp: [u8; QP_INFO_LEN], body in proptest::collection::vec(any::<u8>(), ACCEPT_BODY_LEN)) {
            let _ = QpInfo::from_bytes(&qp);
            let _ = decode_accept_body(&body.try_into().unwrap());
        }
    }
}
