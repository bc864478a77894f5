//! Loopback tests of the bootstrap: handshake, refusals, malformed input.

use super::*;
use crate::auth::PROOF_LEN;
use crate::auth::session::TAG_LEN;
use crate::wire::tests::{sample_header, sample_qp};
use crate::wire::{Message, RefuseReason, WireError};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// An acceptor without a device: hands out fake queue pair numbers and counts
/// live connections.
struct FakeAcceptor {
    next_qpn: AtomicU32,
    live: Arc<AtomicUsize>,
    fail: bool,
    /// The served memory's words that tests set (others read as zero).
    words: Words,
}

type Words = Arc<std::sync::Mutex<std::collections::HashMap<u64, u64>>>;

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
            incarnation: 0xfeed,
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

    fn read_word(&self, offset: u64) -> Option<u64> {
        (offset.is_multiple_of(8) && offset + 8 <= self.region().size).then(|| {
            self.words
                .lock()
                .unwrap()
                .get(&offset)
                .copied()
                .unwrap_or(0)
        })
    }
}

fn start(token: &Token, fail: bool) -> (Server, Arc<AtomicUsize>) {
    let limits = ServerLimits {
        handshake_deadline: Duration::from_millis(500),
        max_clients: 8,
        ..ServerLimits::default()
    };
    start_with(token, fail, limits)
}

fn start_with(token: &Token, fail: bool, limits: ServerLimits) -> (Server, Arc<AtomicUsize>) {
    let (server, live, _) = start_watched(token, fail, limits);
    (server, live)
}

fn start_watched(
    token: &Token,
    fail: bool,
    limits: ServerLimits,
) -> (Server, Arc<AtomicUsize>, Words) {
    let live = Arc::new(AtomicUsize::new(0));
    let words = Words::default();
    let acceptor = FakeAcceptor {
        next_qpn: AtomicU32::new(100),
        live: live.clone(),
        fail,
        words: words.clone(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(listener, token.clone(), acceptor, limits).unwrap();
    (server, live, words)
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
    // A client that skips the check and answers with a bad seal is refused.
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    Message::ClientHello { nonce: [9; 32] }
        .write_to(&mut stream)
        .unwrap();
    let Message::ServerHello { .. } = Message::read_from(&mut stream).unwrap() else {
        panic!("expected ServerHello")
    };
    Message::ClientAuth {
        sealed_qp: sample_qp().to_bytes(),
        tag: [0; TAG_LEN],
    }
    .write_to(&mut stream)
    .unwrap();
    assert!(matches!(
        Message::read_from(&mut stream).unwrap(),
        Message::Refuse {
            reason: RefuseReason::BadToken,
            ..
        }
    ));
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
            proof: [0; PROOF_LEN],
        }
        .encode(),
    ];
    for bytes in garbage {
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        stream.write_all(bytes).unwrap();
        let reply = Message::read_from(&mut stream).unwrap();
        assert!(
            matches!(
                reply,
                Message::Refuse {
                    reason: RefuseReason::Malformed,
                    ..
                }
            ),
            "{reply:?}"
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

/// A connection from `local` (any 127.x.y.z address) to `server`.
fn connect_from(local: [u8; 4], server: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local = SocketAddr::from((local, 0));
    socket.bind(&local.into()).unwrap();
    socket.connect(&server.into()).unwrap();
    socket.into()
}

/// Whether the server closed `stream` without a word (it reads end of file, or a
/// reset, and no message), waiting at most 10 s.
fn closed_without_reply(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// Runs a full handshake as a client bound to `local`.
fn handshake_from(local: [u8; 4], server: SocketAddr, token: &Token) -> Result<(), RdmaError> {
    let mut stream = connect_from(local, server);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client_handshake(&mut stream, "test server", token, &sample_qp()).map(drop)
}

#[test]
fn a_peer_trickling_bytes_is_dropped_at_the_handshake_deadline() {
    let token = Token::generate().unwrap();
    let limits = ServerLimits {
        handshake_deadline: Duration::from_millis(300),
        ..ServerLimits::default()
    };
    let (server, _) = start_with(&token, false, limits);
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    // One byte every 30 ms: each gap is far below the deadline, the whole hello
    // (44 bytes, over a second) far above it.
    let hello = Message::ClientHello { nonce: [5; 32] }.encode();
    for byte in &hello {
        if stream.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reply = Message::read_from(&mut stream);
    assert!(
        reply.is_err(),
        "the node answered a peer that took longer than the deadline: {reply:?}"
    );
    // The node still serves clients.
    connect(
        &server.local_addr().to_string(),
        &token,
        &sample_qp(),
        DEFAULT_TIMEOUT,
    )
    .unwrap();
    server.shutdown();
}

#[test]
fn unauthenticated_connections_do_not_take_client_slots() {
    let token = Token::generate().unwrap();
    let limits = ServerLimits {
        max_clients: 1,
        ..ServerLimits::default()
    };
    let (server, live) = start_with(&token, false, limits);
    let addr = server.local_addr().to_string();
    // Two silent connections (under the per-address cap of 8) hold no client slot.
    let _silent = [
        TcpStream::connect(server.local_addr()).unwrap(),
        TcpStream::connect(server.local_addr()).unwrap(),
    ];
    let first = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(live.load(Ordering::SeqCst), 1);
    // The one client slot is taken: the next authenticated client is refused, with
    // a proved refusal that says why.
    let error = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap_err();
    assert!(
        matches!(
            error,
            RdmaError::Refused {
                reason: RefuseReason::TooManyClients,
                ..
            }
        ),
        "{error}"
    );
    drop(first);
    wait_for("the client slot to free", || {
        connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).is_ok()
    });
    server.shutdown();
}

/// Whether the server keeps `stream` open and silent (nothing to read yet).
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let open =
        matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    open
}

#[test]
fn a_full_pre_authentication_pool_evicts_instead_of_refusing_newcomers() {
    let token = Token::generate().unwrap();
    // Deadlines far off: only evictions close the silent connections.
    let limits = ServerLimits {
        max_handshakes: 3,
        max_handshakes_per_address: 2,
        pre_auth_deadline: Duration::from_secs(60),
        handshake_deadline: Duration::from_secs(60),
        ..ServerLimits::default()
    };
    let (server, _) = start_with(&token, false, limits);
    let node = server.local_addr();
    let a = [127, 0, 0, 1];
    let server_ref = &server;
    let handshaking = |n| move || server_handshaking(server_ref) == n;
    // Address A fills its share with silent connections...
    let mut a1 = connect_from(a, node);
    let a2 = connect_from(a, node);
    wait_for("A's share to fill", handshaking(2));
    // ...and a third connection from A evicts A's oldest: a real client from A is
    // served, not closed at once.
    handshake_from(a, node, &token).unwrap();
    assert!(closed_without_reply(&mut a1), "A's oldest was not evicted");
    assert!(still_open(&a2));
    // C and D fill the pool with A's second: a newcomer from E evicts the oldest
    // of the busiest source (all hold one: A's, the oldest) and is served.
    let c = connect_from([127, 0, 0, 3], node);
    let d = connect_from([127, 0, 0, 4], node);
    wait_for("the pool to fill", handshaking(3));
    handshake_from([127, 0, 0, 5], node, &token).unwrap();
    let mut a2 = a2;
    assert!(closed_without_reply(&mut a2), "the oldest was not evicted");
    assert!(still_open(&c) && still_open(&d));
    // A busier source loses its own: with C and F's two in the pool, G's newcomer
    // evicts F's oldest, not C's older one.
    drop(d);
    wait_for("D's slot to free", handshaking(1));
    let mut f1 = connect_from([127, 0, 0, 6], node);
    let f2 = connect_from([127, 0, 0, 6], node);
    wait_for("the pool to fill again", handshaking(3));
    handshake_from([127, 0, 0, 7], node, &token).unwrap();
    assert!(
        closed_without_reply(&mut f1),
        "the busiest source kept its oldest"
    );
    assert!(still_open(&c) && still_open(&f2));
    server.shutdown();
}

fn server_handshaking(server: &Server) -> usize {
    server.pre_auth_stats().handshaking
}

#[test]
fn a_silent_peer_is_dropped_at_the_pre_authentication_deadline_and_a_stalled_one_at_the_handshake_deadline()
 {
    let token = Token::generate().unwrap();
    let limits = ServerLimits {
        pre_auth_deadline: Duration::from_millis(200),
        handshake_deadline: Duration::from_millis(1500),
        ..ServerLimits::default()
    };
    let (server, _) = start_with(&token, false, limits);
    // Silent: closed at the pre-authentication deadline, long before the
    // handshake's.
    let started = Instant::now();
    let mut silent = TcpStream::connect(server.local_addr()).unwrap();
    assert!(closed_without_reply(&mut silent));
    let silent_for = started.elapsed();
    assert!(
        silent_for < Duration::from_millis(1200),
        "a silent peer held its slot for {silent_for:?}"
    );
    // A hello, then silence: the node answers, then closes at the handshake
    // deadline (the pre-authentication one covers the first message only).
    let started = Instant::now();
    let mut stalled = TcpStream::connect(server.local_addr()).unwrap();
    stalled
        .write_all(&Message::ClientHello { nonce: [5; 32] }.encode())
        .unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(matches!(
        Message::read_from(&mut stalled),
        Ok(Message::ServerHello { .. })
    ));
    assert!(closed_without_reply(&mut stalled));
    let stalled_for = started.elapsed();
    assert!(
        stalled_for >= Duration::from_millis(1400),
        "a peer that sent its hello was cut after {stalled_for:?}, before the handshake deadline"
    );
    // An honest client is far quicker than that.
    connect(
        &server.local_addr().to_string(),
        &token,
        &sample_qp(),
        DEFAULT_TIMEOUT,
    )
    .unwrap();
    server.shutdown();
}

/// A client stream that pauses before its second message (its `ClientAuth`), as a
/// client starved of CPU between the node's `ServerHello` and its answer.
struct SlowAfterHello {
    stream: TcpStream,
    pause: Duration,
    flushed: usize,
}

impl Read for SlowAfterHello {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for SlowAfterHello {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.flushed == 1 {
            std::thread::sleep(self.pause);
            self.flushed += 1;
        }
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flushed += usize::from(self.flushed == 0);
        self.stream.flush()
    }
}

#[test]
fn a_slow_honest_client_is_served_past_the_pre_authentication_deadline() {
    let token = Token::generate().unwrap();
    let limits = ServerLimits {
        pre_auth_deadline: Duration::from_millis(200),
        handshake_deadline: Duration::from_secs(10),
        ..ServerLimits::default()
    };
    let (server, live) = start_with(&token, false, limits);
    let stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut slow = SlowAfterHello {
        stream,
        pause: Duration::from_millis(600),
        flushed: 0,
    };
    let accepted = client_handshake(&mut slow, "test server", &token, &sample_qp());
    assert!(
        accepted.is_ok(),
        "an honest client that answered the node's hello 600 ms late was cut: {:?}",
        accepted.err()
    );
    wait_for("the client to be registered", || {
        live.load(Ordering::SeqCst) == 1
    });
    server.shutdown();
}

mod lease_watch {
    //! The lease watch end to end on loopback: a client asks the node to watch its
    //! lease word; the node cuts it (drops its queue pair, says why) when the word is
    //! killed or stalls, and refuses bad requests.

    use super::*;
    use crate::lease_watch::{KILLED, MIN_STALL_NS, RevokeRequest, WatchRequest};

    const WORD: u64 = 4096;

    fn request(stall_ns: u64) -> WatchRequest {
        WatchRequest {
            offset: WORD,
            stall_ns,
            base: 1,
        }
    }

    fn set(words: &Words, value: u64) {
        words.lock().unwrap().insert(WORD, value);
    }

    /// Waits for the node's refusal on the client's connection.
    fn refusal(accepted: &mut Accepted) -> Option<RefuseReason> {
        accepted
            .stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let Accepted {
            stream, session, ..
        } = accepted;
        session.read_refusal(stream)
    }

    fn watched(addr: &str, token: &Token, words: &Words, stall_ns: u64) -> Accepted {
        set(words, 1);
        let mut accepted = connect(addr, token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let Accepted {
            stream, session, ..
        } = &mut accepted;
        session
            .request_watch(stream, addr, request(stall_ns))
            .unwrap();
        accepted
    }

    #[test]
    fn a_stalled_lease_word_gets_the_client_cut_with_its_reason() {
        let token = Token::generate().unwrap();
        let (server, live, words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        let mut client = watched(&addr, &token, &words, MIN_STALL_NS);
        assert_eq!(refusal(&mut client), Some(RefuseReason::LeaseExpired));
        // The queue pair was destroyed before the refusal was sent.
        assert_eq!(live.load(Ordering::SeqCst), 0);
        // An unwatched client on the same node is never cut.
        let other = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        std::thread::sleep(Duration::from_nanos(3 * MIN_STALL_NS));
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(other);
    }

    #[test]
    fn an_advancing_lease_word_keeps_the_client() {
        let token = Token::generate().unwrap();
        let (server, live, words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        // A generous stall time: renewals every 5 ms must never look stalled even on
        // a loaded machine.
        let stall_ns = 10 * MIN_STALL_NS;
        let mut client = watched(&addr, &token, &words, stall_ns);
        for value in 2..300 {
            set(&words, value);
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(live.load(Ordering::SeqCst), 1, "cut while renewing");
        }
        // Renewals stop: then it is cut.
        assert_eq!(refusal(&mut client), Some(RefuseReason::LeaseExpired));
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    /// A reclaimer's revocation cuts the revoked client before it is acknowledged,
    /// even when the watch would not look at the word for an hour (a kill and a
    /// takeover within one watch period), and the revoked generation cannot come
    /// back through a reconnect.
    #[test]
    fn a_revocation_cuts_before_it_is_acknowledged_within_one_watch_period() {
        let token = Token::generate().unwrap();
        let limits = ServerLimits {
            watch_period: Duration::from_secs(3600),
            ..ServerLimits::default()
        };
        let (server, live, words) = start_watched(&token, false, limits);
        let addr = server.local_addr().to_string();
        let mut owner = watched(&addr, &token, &words, 1000 * MIN_STALL_NS);
        let mut reclaimer = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        assert_eq!(live.load(Ordering::SeqCst), 2);
        let revoke = RevokeRequest {
            offset: WORD,
            floor: 1,
        };
        let Accepted {
            stream, session, ..
        } = &mut reclaimer;
        // Not killed yet: nothing is revoked, and the node says what it holds.
        assert_eq!(session.request_revoke(stream, &addr, revoke).unwrap(), 1);
        assert_eq!(live.load(Ordering::SeqCst), 2);
        // Killed: acknowledged only once the owner's queue pair is gone.
        set(&words, 1 | KILLED);
        assert_eq!(
            session.request_revoke(stream, &addr, revoke).unwrap(),
            1 | KILLED
        );
        assert_eq!(
            live.load(Ordering::SeqCst),
            1,
            "the revoked client's queue pair outlived the acknowledgement"
        );
        assert_eq!(refusal(&mut owner), Some(RefuseReason::LeaseExpired));
        // A new owner renews over the kill: the word is no longer killed, but the
        // revoked generation is still refused; the next one (a base above the
        // floor) is watched.
        set(&words, 5);
        let mut again = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let Accepted {
            stream, session, ..
        } = &mut again;
        let error = session
            .request_watch(stream, &addr, request(MIN_STALL_NS))
            .unwrap_err();
        assert!(
            matches!(
                error,
                RdmaError::Refused {
                    reason: RefuseReason::LeaseExpired,
                    ..
                }
            ),
            "{error}"
        );
        let mut next = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let Accepted {
            stream, session, ..
        } = &mut next;
        let newer = WatchRequest {
            base: 2,
            ..request(1000 * MIN_STALL_NS)
        };
        session.request_watch(stream, &addr, newer).unwrap();
    }

    #[test]
    fn a_killed_lease_word_is_cut_and_cannot_be_watched_again() {
        let token = Token::generate().unwrap();
        let (server, live, words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        let mut client = watched(&addr, &token, &words, 1000 * MIN_STALL_NS);
        set(&words, 1 | KILLED);
        assert_eq!(refusal(&mut client), Some(RefuseReason::LeaseExpired));
        assert_eq!(live.load(Ordering::SeqCst), 0);
        // Reconnecting does not help: the node refuses to watch a killed word, and
        // drops the new queue pair.
        let mut again = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let Accepted {
            stream, session, ..
        } = &mut again;
        let error = session
            .request_watch(stream, &addr, request(MIN_STALL_NS))
            .unwrap_err();
        assert!(
            matches!(
                error,
                RdmaError::Refused {
                    reason: RefuseReason::LeaseExpired,
                    ..
                }
            ),
            "{error}"
        );
        wait_for("the refused client's queue pair to go", || {
            live.load(Ordering::SeqCst) == 0
        });
    }

    #[test]
    fn bad_watch_requests_are_refused_and_disconnected() {
        let token = Token::generate().unwrap();
        let (server, live, _words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        for bad in [
            WatchRequest {
                offset: 4097,
                stall_ns: MIN_STALL_NS,
                base: 1,
            },
            WatchRequest {
                offset: 1 << 20,
                stall_ns: MIN_STALL_NS,
                base: 1,
            },
            WatchRequest {
                offset: 0,
                stall_ns: MIN_STALL_NS,
                base: 1,
            },
            WatchRequest {
                offset: WORD,
                stall_ns: 1,
                base: 1,
            },
        ] {
            let mut client = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
            let Accepted {
                stream, session, ..
            } = &mut client;
            let error = session.request_watch(stream, &addr, bad).unwrap_err();
            assert!(
                matches!(
                    error,
                    RdmaError::Refused {
                        reason: RefuseReason::BadWatch,
                        ..
                    }
                ),
                "{bad:?}: {error}"
            );
            wait_for("the refused client's queue pair to go", || {
                live.load(Ordering::SeqCst) == 0
            });
        }
    }

    #[test]
    fn a_watch_not_sealed_by_the_session_is_refused() {
        let token = Token::generate().unwrap();
        let (server, live, words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        set(&words, 1);
        let mut client = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        // A Watch in clear with a made-up tag (what an on-path attacker could send).
        Message::Watch {
            sealed: request(MIN_STALL_NS).to_bytes(),
            tag: [0; TAG_LEN],
        }
        .write_to(&mut client.stream)
        .unwrap();
        assert_eq!(
            unproved_refusal(&mut client.stream),
            Some(RefuseReason::Malformed)
        );
        wait_for("the client's queue pair to go", || {
            live.load(Ordering::SeqCst) == 0
        });
    }

    /// A stream that keeps a copy of what is written to it.
    struct Recorder<'s> {
        stream: &'s mut TcpStream,
        written: Vec<u8>,
    }

    impl Read for Recorder<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.stream.read(buf)
        }
    }

    impl Write for Recorder<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.stream.write(buf)?;
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.stream.flush()
        }
    }

    #[test]
    fn a_replayed_watch_is_refused() {
        let token = Token::generate().unwrap();
        let (server, live, words) = start_watched(&token, false, ServerLimits::default());
        let addr = server.local_addr().to_string();
        set(&words, 1);
        let mut client = connect(&addr, &token, &sample_qp(), DEFAULT_TIMEOUT).unwrap();
        let Accepted {
            stream, session, ..
        } = &mut client;
        let mut recorder = Recorder {
            stream,
            written: Vec::new(),
        };
        session
            .request_watch(&mut recorder, &addr, request(1000 * MIN_STALL_NS))
            .unwrap();
        let watch = recorder.written;
        // The same sealed bytes again: the node expects the next message index.
        stream.write_all(&watch).unwrap();
        assert_eq!(unproved_refusal(stream), Some(RefuseReason::Malformed));
        wait_for("the client's queue pair to go", || {
            live.load(Ordering::SeqCst) == 0
        });
    }

    /// The refusal sent after a forged frame (which is not in the client session's
    /// transcript, so its proof cannot be checked here).
    fn unproved_refusal(stream: &mut TcpStream) -> Option<RefuseReason> {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        match Message::read_from(stream).ok()? {
            Message::Refuse { reason, .. } => Some(reason),
            _ => None,
        }
    }
}
