//! A flood of silent, unauthenticated connections against memory nodes' bootstrap
//! ports, from loopback source addresses: the attack of issue 47 (item 2), for the
//! soft-RoCE phase (`scripts/softroce/test.sh`) to run while an honest client works.
//!
//! ```text
//! cargo run -p swarm-rdma --example bootstrap_flood -- SECONDS HOST:PORT...
//! ```
//!
//! For each target, 8 source addresses (127.0.0.2-9) × 8 silent sockets, each one
//! reopened as soon as the node closes it, for SECONDS seconds (then it stops by
//! itself). No token is needed. Prints `flood: ...` with the sockets opened per
//! target, every 10 s so far and at the end (a flood killed early has said how
//! much it did). Loopback sources reach a node listening on any of the host's own
//! addresses.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SOURCES: u8 = 8;
const SOCKETS: usize = 8;

fn connect_from(local: [u8; 4], server: SocketAddr) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::from((local, 0)).into()).ok()?;
    socket
        .connect_timeout(&server.into(), Duration::from_secs(1))
        .ok()?;
    Some(socket.into())
}

/// Whether the node closed `stream` (end of file or an error; never blocks).
fn closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    !matches!(stream.peek(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(seconds) = args.next().and_then(|s| s.parse::<u64>().ok()) else {
        eprintln!("usage: bootstrap_flood SECONDS HOST:PORT...");
        std::process::exit(2);
    };
    let targets: Vec<SocketAddr> = args
        .filter_map(|a| a.to_socket_addrs().ok().and_then(|mut i| i.next()))
        .filter(SocketAddr::is_ipv4)
        .collect();
    if targets.is_empty() {
        eprintln!("bootstrap_flood: no IPv4 target given");
        std::process::exit(2);
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let opened: Vec<Arc<AtomicU64>> = targets.iter().map(|_| Arc::default()).collect();
    let threads: Vec<_> = targets
        .iter()
        .zip(&opened)
        .flat_map(|(&target, count)| (0..SOURCES).map(move |k| (target, count.clone(), k)))
        .map(|(target, count, k)| {
            std::thread::spawn(move || {
                let source = [127, 0, 0, 2 + k];
                let mut sockets: Vec<Option<TcpStream>> = (0..SOCKETS).map(|_| None).collect();
                while Instant::now() < until {
                    for socket in &mut sockets {
                        if socket.as_ref().is_none_or(closed) {
                            *socket = connect_from(source, target);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    let report = || {
        let elapsed = started.elapsed().as_secs();
        for (target, count) in targets.iter().zip(&opened) {
            println!(
                "flood: {target}: {} silent sockets opened from {SOURCES} addresses over {elapsed} s",
                count.load(Ordering::Relaxed)
            );
        }
    };
    let mut next_report = started + Duration::from_secs(10);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() >= next_report {
            report();
            next_report += Duration::from_secs(10);
        }
    }
    for thread in threads {
        let _ = thread.join();
    }
    report();
}
