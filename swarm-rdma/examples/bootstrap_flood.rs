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
//! itself). Each socket has a thread blocked reading it, which wakes when the node
//! closes it: the flood reopens at once and otherwise spends no CPU, as a flood from
//! another host would cost the node's host nothing but the node's own work (a flood
//! that polled its sockets every millisecond took most of the soft-RoCE VM's
//! emulated CPUs from the processes under test). No token is needed. Prints `flood: ...` with the sockets opened per
//! target, every 10 s so far and at the end (a flood killed early has said how
//! much it did). Loopback sources reach a node listening on any of the host's own
//! addresses.

use std::io::Read;
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

/// Keeps one silent socket from `source` open against `target` until `until`,
/// reopening it whenever the node closes it; adds the sockets opened to `count`.
fn hold(source: [u8; 4], target: SocketAddr, until: Instant, count: &AtomicU64) {
    let mut buf = [0u8; 64];
    while Instant::now() < until {
        let Some(mut socket) = connect_from(source, target) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        count.fetch_add(1, Ordering::Relaxed);
        // Silent: wait for the node to close it (end of file or an error), waking
        // every second to stop in time.
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if socket
                .set_read_timeout(Some(left.min(Duration::from_secs(1))))
                .is_err()
            {
                break;
            }
            match socket.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }
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
        .flat_map(|(&target, count)| {
            (0..SOURCES).flat_map(move |k| (0..SOCKETS).map(move |_| (target, count.clone(), k)))
        })
        .filter_map(|(target, count, k)| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || hold([127, 0, 0, 2 + k], target, until, &count))
                .ok()
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
