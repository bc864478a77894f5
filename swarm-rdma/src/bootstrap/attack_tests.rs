//! Wire-level attacks on the handshake by an on-path relay that does not hold the
//! token: it sees every frame and may drop, alter, forge or replay any of them.
//! Each attack must end in a failed handshake, with no queue pair created for a
//! queue pair the relay chose and no region address or rkey visible on the wire.
//! (Protocol version 1 let every one of these through: its proofs covered the
//! nonces only, and `Accept` carried the rkey in clear.)

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::*;
use crate::auth::PROOF_LEN;
use crate::wire::tests::{sample_header, sample_qp};
use crate::wire::{ACCEPT_BODY_LEN, Message, RefuseReason, encode_accept_body};

const RKEY: u32 = 0x5eed_c0de;
const ADDR: u64 = 0x7f3a_9b1c_0000;

/// A device-free acceptor that records every client queue pair it connects.
#[derive(Default)]
struct RecordingAcceptor {
    accepted: Arc<Mutex<Vec<QpInfo>>>,
}

impl Acceptor for RecordingAcceptor {
    type Connection = ();

    fn region(&self) -> RegionInfo {
        RegionInfo {
            addr: ADDR,
            rkey: RKEY,
            size: 1 << 20,
            header: sample_header(1 << 20),
            incarnation: 7,
        }
    }

    fn accept(&self, client: &QpInfo) -> Result<(QpInfo, ()), RdmaError> {
        self.accepted.lock().unwrap().push(*client);
        Ok((
            QpInfo {
                qpn: 0x77,
                psn: 0x1234,
                ..*client
            },
            (),
        ))
    }
}

fn start(token: &Token) -> (Server, Arc<Mutex<Vec<QpInfo>>>) {
    let acceptor = RecordingAcceptor::default();
    let accepted = acceptor.accepted.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(listener, token.clone(), acceptor, ServerLimits::default()).unwrap();
    (server, accepted)
}

/// Which way a frame travels through the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    ToNode,
    ToClient,
}

/// What the relay does with one frame: forward these bytes instead (`None`: stop).
type Tamper = Box<dyn FnMut(Hop, Message, Vec<u8>) -> Option<Vec<u8>> + Send>;

/// A relay for one client between it and the memory node at `node`; returns the
/// address to give the client and the relay thread, which yields every byte it saw.
fn relay(node: SocketAddr, mut tamper: Tamper) -> (String, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let (mut client, _) = listener.accept().unwrap();
        let mut server = TcpStream::connect(node).unwrap();
        let mut seen = Vec::new();
        // The handshake alternates strictly: client, node, client, node.
        for hop in [Hop::ToNode, Hop::ToClient, Hop::ToNode, Hop::ToClient] {
            let (from, to) = match hop {
                Hop::ToNode => (&mut client, &mut server),
                Hop::ToClient => (&mut server, &mut client),
            };
            let Ok((message, frame)) = Message::read_frame(from) else {
                break;
            };
            seen.extend_from_slice(&frame);
            let Some(out) = tamper(hop, message, frame) else {
                break;
            };
            if std::io::Write::write_all(to, &out).is_err() {
                break;
            }
        }
        seen
    });
    (addr, thread)
}

fn honest() -> Tamper {
    Box::new(|_, _, frame| Some(frame))
}

fn connect_via(addr: &str, token: &Token) -> Result<Accepted, RdmaError> {
    connect(addr, token, &sample_qp(), DEFAULT_TIMEOUT)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn an_honest_relay_sees_no_address_rkey_or_queue_pair_in_clear() {
    let token = Token::generate().unwrap();
    let (server, accepted) = start(&token);
    let (addr, relay) = relay(server.local_addr(), honest());
    let session = connect_via(&addr, &token).unwrap();
    assert_eq!((session.region.rkey, session.region.addr), (RKEY, ADDR));
    assert_eq!(*accepted.lock().unwrap(), vec![sample_qp()]);
    let seen = relay.join().unwrap();
    assert!(!contains(&seen, &RKEY.to_le_bytes()), "rkey in clear");
    assert!(!contains(&seen, &ADDR.to_le_bytes()), "address in clear");
    assert!(
        !contains(&seen, &sample_qp().psn.to_le_bytes()[..3]),
        "PSN in clear"
    );
    server.shutdown();
}

#[test]
fn a_relay_swapping_the_client_queue_pair_gets_no_queue_pair() {
    let token = Token::generate().unwrap();
    let (server, accepted) = start(&token);
    let relay_qp = QpInfo {
        qpn: 0x66_6666,
        ..sample_qp()
    };
    // The relay cannot seal, so it replaces the sealed bytes with its own queue
    // pair, keeping the client's tag; or flips one sealed bit.
    let swaps: [Tamper; 2] = [
        Box::new(move |hop, message, frame| match (hop, message) {
            (Hop::ToNode, Message::ClientAuth { tag, .. }) => Some(
                Message::ClientAuth {
                    sealed_qp: relay_qp.to_bytes(),
                    tag,
                }
                .encode(),
            ),
            _ => Some(frame),
        }),
        Box::new(|hop, message, mut frame| {
            if let (Hop::ToNode, Message::ClientAuth { .. }) = (hop, message) {
                frame[crate::wire::FRAME_HEADER_LEN + 4] ^= 1;
            }
            Some(frame)
        }),
    ];
    for tamper in swaps {
        let (addr, relay) = relay(server.local_addr(), tamper);
        let error = connect_via(&addr, &token).unwrap_err();
        // The node's refusal answers the altered ClientAuth, which is not in the
        // client's transcript: the client sees that the exchange was tampered with.
        assert!(
            matches!(
                error,
                RdmaError::Tampered {
                    message: "Refuse",
                    ..
                }
            ),
            "{error}"
        );
        let seen = relay.join().unwrap();
        assert!(!contains(&seen, &RKEY.to_le_bytes()), "rkey leaked");
    }
    assert!(
        accepted.lock().unwrap().is_empty(),
        "a queue pair was connected for a tampered ClientAuth"
    );
    server.shutdown();
}

#[test]
fn a_forged_accept_is_refused() {
    let token = Token::generate().unwrap();
    let (server, _) = start(&token);
    let forged_region = RegionInfo {
        addr: 0x1000,
        rkey: 0x666,
        size: 1 << 20,
        header: sample_header(1 << 20),
        incarnation: 7,
    };
    let forgeries: [Tamper; 2] = [
        // An Accept in the relay's own terms, "sealed" without the key.
        Box::new(move |_, message, frame| match message {
            Message::Accept { tag, .. } => Some(
                Message::Accept {
                    sealed: encode_accept_body(&sample_qp(), &forged_region),
                    tag,
                }
                .encode(),
            ),
            _ => Some(frame),
        }),
        // The real Accept with one bit of its sealed body flipped.
        Box::new(|_, message, mut frame| {
            if let Message::Accept { .. } = message {
                frame[crate::wire::FRAME_HEADER_LEN + ACCEPT_BODY_LEN - 1] ^= 0x80;
            }
            Some(frame)
        }),
    ];
    for tamper in forgeries {
        let (addr, relay) = relay(server.local_addr(), tamper);
        let error = connect_via(&addr, &token).unwrap_err();
        assert!(
            matches!(
                error,
                RdmaError::Tampered {
                    message: "Accept",
                    ..
                }
            ),
            "{error}"
        );
        relay.join().unwrap();
    }
    server.shutdown();
}

#[test]
fn a_forged_refusal_is_not_believed() {
    let token = Token::generate().unwrap();
    let (server, _) = start(&token);
    let forge = |replace: &'static str| -> Tamper {
        Box::new(move |_, message, frame| {
            if message.kind() == replace {
                Some(
                    Message::Refuse {
                        reason: RefuseReason::BadToken,
                        proof: [0; PROOF_LEN],
                    }
                    .encode(),
                )
            } else {
                Some(frame)
            }
        })
    };
    for replaced in ["ServerHello", "Accept"] {
        let (addr, relay) = relay(server.local_addr(), forge(replaced));
        let error = connect_via(&addr, &token).unwrap_err();
        // Not "wrong cluster token": the refusal is not the node's.
        assert!(
            matches!(
                error,
                RdmaError::Tampered {
                    message: "Refuse",
                    ..
                }
            ),
            "refusal in place of {replaced}: {error}"
        );
        relay.join().unwrap();
    }
    server.shutdown();
}

#[test]
fn messages_replayed_from_an_earlier_session_are_refused() {
    let token = Token::generate().unwrap();
    let (server, accepted) = start(&token);
    // Session 1, recorded by an honest relay.
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let record = recorded.clone();
    let (addr, relay1) = relay(
        server.local_addr(),
        Box::new(move |_, message, frame| {
            record.lock().unwrap().push((message.kind(), frame.clone()));
            Some(frame)
        }),
    );
    connect_via(&addr, &token).unwrap();
    relay1.join().unwrap();
    let recorded = recorded.lock().unwrap().clone();
    let frame_of = |kind: &str| {
        recorded
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, frame)| frame.clone())
            .unwrap()
    };

    // Session 2: the old Accept (valid last time) replayed to the client.
    let old_accept = frame_of("Accept");
    let (addr, relay2) = relay(
        server.local_addr(),
        Box::new(move |_, message, frame| {
            Some(match message {
                Message::Accept { .. } => old_accept.clone(),
                _ => frame,
            })
        }),
    );
    let error = connect_via(&addr, &token).unwrap_err();
    assert!(
        matches!(
            error,
            RdmaError::Tampered {
                message: "Accept",
                ..
            }
        ),
        "{error}"
    );
    relay2.join().unwrap();

    // Session 3: the old ClientAuth replayed to the node.
    let old_auth = frame_of("ClientAuth");
    let (addr, relay3) = relay(
        server.local_addr(),
        Box::new(move |_, message, frame| {
            Some(match message {
                Message::ClientAuth { .. } => old_auth.clone(),
                _ => frame,
            })
        }),
    );
    let error = connect_via(&addr, &token).unwrap_err();
    assert!(
        matches!(
            error,
            RdmaError::Tampered {
                message: "Refuse",
                ..
            }
        ),
        "{error}"
    );
    relay3.join().unwrap();
    // Sessions 1 and 2 connected a queue pair each (the node cannot know that the
    // client of session 2 gave up); the replayed ClientAuth connected none.
    assert_eq!(accepted.lock().unwrap().len(), 2);
    server.shutdown();
}
