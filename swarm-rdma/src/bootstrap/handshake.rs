//! Both sides of the bootstrap handshake over any byte stream.
//!
//! Every frame sent or received is appended to a [`Transcript`]; every message after
//! `ClientHello` is checked against the transcript of everything before it
//! ([`crate::auth::session`]), so a relay that swaps, forges, drops into or replays
//! any message makes the handshake fail instead of connecting a queue pair it chose.

use std::io::{Read, Write};

use crate::auth::session::{SealTag, Sender, SessionKeys, TAG_LEN, Transcript};
use crate::auth::{PROOF_LEN, Token, random_nonce};
use crate::error::RdmaError;
use crate::lease_watch::{RevokeRequest, WatchRequest};
use crate::wire::{
    ACCEPT_BODY_LEN, FRAME_HEADER_LEN, Message, QP_INFO_LEN, QpInfo, RefuseReason, RegionInfo,
    WireError, decode_accept_body, encode_accept_body,
};

use super::Acceptor;

/// One side's view of a handshake in progress: the stream and the transcript.
struct Conversation<'s, S> {
    stream: &'s mut S,
    transcript: Transcript,
}

impl<S: Read + Write> Conversation<'_, S> {
    /// Sends `frame` and appends it to the transcript.
    fn send_frame(&mut self, frame: &[u8]) -> Result<(), WireError> {
        self.stream.write_all(frame)?;
        self.stream.flush()?;
        self.transcript.record(frame);
        Ok(())
    }

    /// Sends a message whose last field is a proof (`ServerHello`, `Refuse`): the
    /// proof is computed over the transcript and the frame before it.
    fn send_proved(&mut self, token: &Token, message: &Message) -> Result<(), WireError> {
        let mut frame = message.encode();
        let cut = frame.len() - PROOF_LEN;
        let proof = token.prove(&self.transcript, &frame[..cut]);
        frame[cut..].copy_from_slice(&proof);
        self.send_frame(&frame)
    }

    /// Receives one message and its frame; the caller checks it, then records it.
    fn receive(&mut self) -> Result<(Message, Vec<u8>), WireError> {
        Message::read_frame(self.stream)
    }

    /// Whether the proof at the end of a received `frame` is the memory node's.
    fn proved(&self, token: &Token, frame: &[u8]) -> bool {
        let (prefix, proof) = frame.split_at(frame.len().saturating_sub(PROOF_LEN));
        proof
            .try_into()
            .is_ok_and(|proof| token.verify(&self.transcript, prefix, proof))
    }
}

/// The frame header of a message (its type and length, not its content): what a
/// sealed body's associated data covers besides the transcript.
fn header_of(message: &Message) -> [u8; FRAME_HEADER_LEN] {
    let mut header = [0u8; FRAME_HEADER_LEN];
    header.copy_from_slice(&message.encode()[..FRAME_HEADER_LEN]);
    header
}

fn unexpected(expected: &'static str, found: &Message) -> WireError {
    WireError::Unexpected {
        expected,
        found: found.kind(),
    }
}

/// The error for a node's answer to a request other than its proved `expected`
/// reply: a proved refusal, an unproved reply or refusal (tampered), or another
/// message.
fn answer_error(peer: &str, reply: &Message, proved: bool, expected: &'static str) -> RdmaError {
    match reply {
        Message::Refuse { reason, .. } if proved => RdmaError::Refused {
            peer: peer.to_owned(),
            reason: *reason,
        },
        Message::Refuse { .. } => RdmaError::Tampered {
            peer: peer.to_owned(),
            message: reply.kind(),
        },
        other if other.kind() == expected => RdmaError::Tampered {
            peer: peer.to_owned(),
            message: reply.kind(),
        },
        other => RdmaError::wire(peer, unexpected(expected, other)),
    }
}

/// A request a client may send after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Watch my lease word ([`crate::lease_watch`]).
    Watch(WatchRequest),
    /// Revoke the clients watching a lease word ([`crate::lease_watch`], "Revocation").
    Revoke(RevokeRequest),
}

/// What either side keeps of a finished handshake to exchange more authenticated
/// messages on the same connection (the lease watch, [`crate::lease_watch`]): the
/// session keys, the transcript so far, and how many messages the client sealed.
pub struct Session {
    token: Token,
    keys: SessionKeys,
    transcript: Transcript,
    /// Messages the client sealed after its `ClientAuth` (the next one's index is
    /// this plus one).
    client_sealed: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Session { .. }")
    }
}

impl Session {
    /// Client: asks the memory node to watch a lease word, and waits for its answer
    /// (`Watching`, or a proved `Refuse`: [`RdmaError::Refused`]).
    pub fn request_watch<S: Read + Write>(
        &mut self,
        stream: &mut S,
        peer: &str,
        request: WatchRequest,
    ) -> Result<(), RdmaError> {
        let (reply, proved) = self.exchange(stream, peer, request.to_bytes(), |sealed, tag| {
            Message::Watch { sealed, tag }
        })?;
        match reply {
            Message::Watching { .. } if proved => Ok(()),
            other => Err(answer_error(peer, &other, proved, "Watching")),
        }
    }

    /// Client: the proved refusal the memory node sent before closing the
    /// connection (say, [`RefuseReason::LeaseExpired`] when it cut the client), if
    /// one is waiting in `stream`; `None` if none is, or it is not the node's.
    pub fn read_refusal(&mut self, stream: &mut impl Read) -> Option<RefuseReason> {
        let (message, frame) = Message::read_frame(stream).ok()?;
        let proved = self.proved(&frame);
        self.transcript.record(&frame);
        match message {
            Message::Refuse { reason, .. } if proved => Some(reason),
            _ => None,
        }
    }

    /// Client: asks the memory node to revoke the clients watching a lease word
    /// ([`crate::lease_watch`], "Revocation") and waits for its answer: the word as
    /// the node read it (killed: the revocation is done, every client it revokes
    /// cut; not killed: nothing was revoked), or a proved `Refuse`
    /// ([`RdmaError::Refused`]).
    pub fn request_revoke<S: Read + Write>(
        &mut self,
        stream: &mut S,
        peer: &str,
        request: RevokeRequest,
    ) -> Result<u64, RdmaError> {
        let (reply, proved) = self.exchange(stream, peer, request.to_bytes(), |sealed, tag| {
            Message::Revoke { sealed, tag }
        })?;
        match reply {
            Message::Revoked { word, .. } if proved => Ok(word),
            other => Err(answer_error(peer, &other, proved, "Revoked")),
        }
    }

    /// Client: seals `body` as its next request (`message` builds the frame from the
    /// sealed body and its tag), sends it, and reads the node's answer: the answer
    /// and whether its proof over the transcript is the node's.
    fn exchange<S: Read + Write, const N: usize>(
        &mut self,
        stream: &mut S,
        peer: &str,
        mut body: [u8; N],
        message: impl Fn([u8; N], [u8; TAG_LEN]) -> Message,
    ) -> Result<(Message, bool), RdmaError> {
        let wire = |e| RdmaError::wire(peer, e);
        let header = header_of(&message([0; N], [0; TAG_LEN]));
        self.client_sealed += 1;
        let tag = self.keys.seal_nth(
            Sender::Client,
            self.client_sealed,
            &self.transcript,
            &header,
            &mut body,
        );
        let frame = message(body, tag).encode();
        stream.write_all(&frame).map_err(|e| wire(e.into()))?;
        stream.flush().map_err(|e| wire(e.into()))?;
        self.transcript.record(&frame);
        let (reply, frame) = Message::read_frame(stream).map_err(wire)?;
        let proved = self.proved(&frame);
        self.transcript.record(&frame);
        Ok((reply, proved))
    }

    /// Memory node: reads the client's next request (a `Watch` or a `Revoke`),
    /// opened and decoded (not yet checked against the region).
    pub fn receive_request(&mut self, stream: &mut impl Read) -> Result<Request, WireError> {
        let (message, frame) = Message::read_frame(stream)?;
        let header = &frame[..FRAME_HEADER_LEN];
        let result = match message {
            Message::Watch { mut sealed, tag } => self
                .open(
                    header,
                    &mut sealed,
                    &tag,
                    "the Watch message does not open with the session keys",
                )
                .map(|()| Request::Watch(WatchRequest::from_bytes(&sealed))),
            Message::Revoke { mut sealed, tag } => self
                .open(
                    header,
                    &mut sealed,
                    &tag,
                    "the Revoke message does not open with the session keys",
                )
                .map(|()| Request::Revoke(RevokeRequest::from_bytes(&sealed))),
            other => Err(unexpected("Watch", &other)),
        };
        self.transcript.record(&frame);
        result
    }

    /// Memory node: opens the client's next sealed body in place, under the frame
    /// `header`; fails with `refusal` if it does not open.
    fn open(
        &mut self,
        header: &[u8],
        sealed: &mut [u8],
        tag: &SealTag,
        refusal: &'static str,
    ) -> Result<(), WireError> {
        self.client_sealed += 1;
        if self.keys.open_nth(
            Sender::Client,
            self.client_sealed,
            &self.transcript,
            header,
            sealed,
            tag,
        ) {
            Ok(())
        } else {
            Err(WireError::BadField(refusal))
        }
    }

    /// Memory node: sends `Watching` or a refusal, proved over the transcript.
    pub fn send_proved(
        &mut self,
        stream: &mut impl Write,
        message: &Message,
    ) -> Result<(), WireError> {
        let mut frame = message.encode();
        let cut = frame.len() - PROOF_LEN;
        let proof = self.token.prove(&self.transcript, &frame[..cut]);
        frame[cut..].copy_from_slice(&proof);
        stream.write_all(&frame)?;
        stream.flush()?;
        self.transcript.record(&frame);
        Ok(())
    }

    fn proved(&self, frame: &[u8]) -> bool {
        let (prefix, proof) = frame.split_at(frame.len().saturating_sub(PROOF_LEN));
        proof
            .try_into()
            .is_ok_and(|proof| self.token.verify(&self.transcript, prefix, proof))
    }
}

/// The client side of the handshake over an already connected stream: returns the
/// memory node's queue pair and region.
pub fn client_handshake<S: Read + Write>(
    stream: &mut S,
    peer: &str,
    token: &Token,
    local_qp: &QpInfo,
) -> Result<(QpInfo, RegionInfo), RdmaError> {
    client_handshake_session(stream, peer, token, local_qp).map(|(qp, region, _)| (qp, region))
}

/// [`client_handshake`], also returning the session for later requests.
pub fn client_handshake_session<S: Read + Write>(
    stream: &mut S,
    peer: &str,
    token: &Token,
    local_qp: &QpInfo,
) -> Result<(QpInfo, RegionInfo, Session), RdmaError> {
    let wire = |e| RdmaError::wire(peer, e);
    let tampered = |message| RdmaError::Tampered {
        peer: peer.to_owned(),
        message,
    };
    let mut talk = Conversation {
        stream,
        transcript: Transcript::new(),
    };
    let client_nonce = random_nonce().map_err(|e| RdmaError::io("cannot draw a nonce", e))?;
    talk.send_frame(
        &Message::ClientHello {
            nonce: client_nonce,
        }
        .encode(),
    )
    .map_err(wire)?;

    // The node proves the token first, over our nonce and its own.
    let (reply, frame) = talk.receive().map_err(wire)?;
    let server_nonce = match reply {
        Message::ServerHello { nonce, .. } if talk.proved(token, &frame) => nonce,
        Message::ServerHello { .. } => {
            return Err(RdmaError::BadToken {
                peer: peer.to_owned(),
            });
        }
        Message::Refuse { reason, .. } if talk.proved(token, &frame) => {
            return Err(RdmaError::Refused {
                peer: peer.to_owned(),
                reason,
            });
        }
        Message::Refuse { .. } => return Err(tampered("Refuse")),
        other => return Err(wire(unexpected("ServerHello", &other))),
    };
    talk.transcript.record(&frame);
    let keys = token.session_keys(&client_nonce, &server_nonce);

    let mut sealed_qp = local_qp.to_bytes();
    let header = header_of(&Message::ClientAuth {
        sealed_qp: [0; QP_INFO_LEN],
        tag: [0; TAG_LEN],
    });
    let tag = keys.seal(Sender::Client, &talk.transcript, &header, &mut sealed_qp);
    talk.send_frame(&Message::ClientAuth { sealed_qp, tag }.encode())
        .map_err(wire)?;

    let (reply, frame) = talk.receive().map_err(wire)?;
    match reply {
        Message::Accept { mut sealed, tag } => {
            let header = &frame[..FRAME_HEADER_LEN];
            if !keys.open(
                Sender::MemoryNode,
                &talk.transcript,
                header,
                &mut sealed,
                &tag,
            ) {
                return Err(tampered("Accept"));
            }
            let (qp, region) = decode_accept_body(&sealed).map_err(wire)?;
            talk.transcript.record(&frame);
            Ok((
                qp,
                region,
                Session {
                    token: token.clone(),
                    keys,
                    transcript: talk.transcript,
                    client_sealed: 0,
                },
            ))
        }
        Message::Refuse { reason, .. } if talk.proved(token, &frame) => Err(RdmaError::Refused {
            peer: peer.to_owned(),
            reason,
        }),
        Message::Refuse { .. } => Err(tampered("Refuse")),
        other => Err(wire(unexpected("Accept", &other))),
    }
}

/// The memory node's side of the handshake over an accepted stream. On any failure
/// the client is sent a refusal (best effort; proved whenever the client's nonce is
/// known) and the error is returned. Only for a client that proved the token does
/// it call `admit` (which may refuse: too many clients) and then
/// [`Acceptor::accept`]; it returns the connection and what `admit` gave.
pub fn server_handshake<S: Read + Write, A: Acceptor, Slot>(
    stream: &mut S,
    peer: &str,
    token: &Token,
    acceptor: &A,
    admit: impl FnOnce() -> Option<Slot>,
) -> Result<(A::Connection, Slot, Session), RdmaError> {
    let mut talk = Conversation {
        stream,
        transcript: Transcript::new(),
    };
    let client_nonce = match talk.receive() {
        Ok((Message::ClientHello { nonce }, frame)) => {
            talk.transcript.record(&frame);
            nonce
        }
        // Nothing to bind a proof to: an unproved refusal (clients treat it as such).
        Ok((other, _)) => {
            let error = unexpected("ClientHello", &other);
            let _ = talk.send_frame(&refusal(RefuseReason::Malformed));
            return Err(RdmaError::wire(peer, error));
        }
        Err(error) => {
            if let Some(reason) = refusal_reason(&error) {
                let _ = talk.send_frame(&refusal(reason));
            }
            return Err(RdmaError::wire(peer, error));
        }
    };
    let refuse = |talk: &mut Conversation<'_, S>, reason| {
        let _ = talk.send_proved(
            token,
            &Message::Refuse {
                reason,
                proof: [0; PROOF_LEN],
            },
        );
    };

    let server_nonce = random_nonce().map_err(|e| RdmaError::io("cannot draw a nonce", e))?;
    talk.send_proved(
        token,
        &Message::ServerHello {
            nonce: server_nonce,
            proof: [0; PROOF_LEN],
        },
    )
    .map_err(|e| RdmaError::wire(peer, e))?;
    let keys = token.session_keys(&client_nonce, &server_nonce);

    let client_qp = match talk.receive() {
        Ok((Message::ClientAuth { mut sealed_qp, tag }, frame)) => {
            let opened = keys.open(
                Sender::Client,
                &talk.transcript,
                &frame[..FRAME_HEADER_LEN],
                &mut sealed_qp,
                &tag,
            );
            talk.transcript.record(&frame);
            if !opened {
                refuse(&mut talk, RefuseReason::BadToken);
                return Err(RdmaError::BadToken {
                    peer: peer.to_owned(),
                });
            }
            match QpInfo::from_bytes(&sealed_qp) {
                Ok(qp) => qp,
                Err(error) => {
                    refuse(&mut talk, RefuseReason::Malformed);
                    return Err(RdmaError::wire(peer, error));
                }
            }
        }
        Ok((other, frame)) => {
            talk.transcript.record(&frame);
            refuse(&mut talk, RefuseReason::Malformed);
            return Err(RdmaError::wire(peer, unexpected("ClientAuth", &other)));
        }
        Err(error) => {
            if let Some(reason) = refusal_reason(&error) {
                refuse(&mut talk, reason);
            }
            return Err(RdmaError::wire(peer, error));
        }
    };

    let Some(slot) = admit() else {
        refuse(&mut talk, RefuseReason::TooManyClients);
        return Err(RdmaError::Refused {
            peer: peer.to_owned(),
            reason: RefuseReason::TooManyClients,
        });
    };
    let (qp, connection) = match acceptor.accept(&client_qp) {
        Ok(accepted) => accepted,
        Err(e) => {
            refuse(&mut talk, RefuseReason::NoResources);
            return Err(e);
        }
    };
    let mut sealed = encode_accept_body(&qp, &acceptor.region());
    let header = header_of(&Message::Accept {
        sealed: [0; ACCEPT_BODY_LEN],
        tag: [0; TAG_LEN],
    });
    let tag = keys.seal(Sender::MemoryNode, &talk.transcript, &header, &mut sealed);
    talk.send_frame(&Message::Accept { sealed, tag }.encode())
        .map_err(|e| RdmaError::wire(peer, e))?;
    let session = Session {
        token: token.clone(),
        keys,
        transcript: talk.transcript,
        client_sealed: 0,
    };
    Ok((connection, slot, session))
}

/// An unproved refusal, for a peer whose nonce is unknown.
fn refusal(reason: RefuseReason) -> Vec<u8> {
    Message::Refuse {
        reason,
        proof: [0; PROOF_LEN],
    }
    .encode()
}

/// The refusal owed for a message that could not be read; none when the connection
/// itself failed (nobody would read it).
fn refusal_reason(error: &WireError) -> Option<RefuseReason> {
    match error {
        WireError::UnsupportedVersion { .. } => Some(RefuseReason::UnsupportedVersion),
        WireError::Truncated | WireError::TimedOut | WireError::Io(_) => None,
        _ => Some(RefuseReason::Malformed),
    }
}
