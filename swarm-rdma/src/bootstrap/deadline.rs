//! Absolute deadlines on a TCP stream, and the settings of an idle control
//! connection.
//!
//! A per-read timeout bounds the gap between two bytes, not the exchange: a peer
//! trickling one byte every few seconds would hold a handshake open for as long as
//! it likes. [`Deadline`] re-arms the socket's timeouts before every read and write
//! with the time *left* until one instant, so the whole exchange ends by then.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

/// A stream whose reads and writes all fail with `TimedOut` once `at` has passed
/// (or an earlier limit that its owner may move: [`Deadline::bounded_by`]).
#[derive(Debug)]
pub(crate) struct Deadline<'s> {
    stream: &'s TcpStream,
    at: Instant,
    limit: Option<&'s Cell<Instant>>,
}

impl<'s> Deadline<'s> {
    /// Reads and writes on `stream` until `at`.
    pub(crate) fn new(stream: &'s TcpStream, at: Instant) -> Self {
        Self {
            stream,
            at,
            limit: None,
        }
    }

    /// Also ends reads and writes at `limit`, as it stands at each read or write
    /// (the server moves it once a peer proved the token).
    pub(crate) fn bounded_by(self, limit: &'s Cell<Instant>) -> Self {
        Self {
            limit: Some(limit),
            ..self
        }
    }

    fn arm(&self) -> io::Result<()> {
        let at = self.limit.map_or(self.at, |limit| limit.get().min(self.at));
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        let mut stream = self.stream;
        stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut stream = self.stream;
        stream.flush()
    }
}

/// Idle time before the first keepalive probe on a control connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is declared dead.
const KEEPALIVE_PROBES: u32 = 3;
/// Longest time sent data may stay unacknowledged before the connection is dropped.
const USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Prepares an authenticated client's control connection for its idle life: no
/// timeouts on reads (it is silent by design), but TCP keepalive and
/// `TCP_USER_TIMEOUT`, so that a client whose host vanished without a FIN or RST
/// (power loss, partition) is noticed within about half a minute and its queue
/// pair destroyed, instead of being held until the kernel's two-hour default.
pub(crate) fn configure_idle_connection(stream: &TcpStream) -> io::Result<()> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let socket = SockRef::from(stream);
    socket.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    socket.set_tcp_user_timeout(Some(USER_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn a_passed_deadline_fails_every_read_and_write() {
        let (client, _server) = pair();
        let mut late = Deadline::new(&client, Instant::now());
        let mut buf = [0u8; 1];
        assert_eq!(
            late.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        assert_eq!(
            late.write(b"x").unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }

    #[test]
    fn a_silent_peer_times_out_at_the_deadline() {
        let (client, _server) = pair();
        let mut stream = Deadline::new(&client, Instant::now() + Duration::from_millis(50));
        let mut buf = [0u8; 1];
        let error = stream.read(&mut buf).unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{error}"
        );
    }

    #[test]
    fn idle_connections_get_keepalive_and_a_user_timeout() {
        let (client, _server) = pair();
        configure_idle_connection(&client).unwrap();
        let socket = SockRef::from(&client);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
        assert_eq!(client.read_timeout().unwrap(), None);
    }
}
