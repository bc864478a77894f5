//! What a client's connect costs on shared memory: the batches it posts and its time,
//! and the time of the configuration read that `KvClient::connect` starts with (one
//! roundtrip to every node), with an emulated network roundtrip if asked.
//!
//! ```text
//! cargo run --release -p swarm-benches --example connect_cost -- [CONNECTS] [RTT_NS]
//! ```
//!
//! Creates a three-node store in a directory under /dev/shm (or the temporary
//! directory; removed at the end), then connects and closes CONNECTS clients (2000 unless given) with RTT_NS of
//! emulated roundtrip (0 unless given), and reads the configuration as many times.
//! Prints the batches per connect and the mean and median times.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use swarm_core::fabric::{Traced, Tracer};
use swarm_core::{Batch, NodeId};

use swarm_kv::{ClusterParams, KvClient, ShmStore, SystemClock};

/// Counts the batches a client posts.
struct Count(Rc<Cell<u64>>);

impl Tracer for Count {
    fn batch(&self, _node: NodeId, _batch: &Batch) {
        self.0.set(self.0.get() + 1);
    }
}

/// Removes the store's directory at the end.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn summary(mut times: Vec<Duration>) -> String {
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    format!("mean {mean:?}, median {median:?}")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let connects: usize = args.next().map_or(Ok(2000), |a| a.parse())?;
    let rtt_ns: u64 = args.next().map_or(Ok(0), |a| a.parse())?;
    let parent = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let base = Scratch(parent.join(format!("connect-cost-{}", std::process::id())));
    let params = ClusterParams {
        writers: 8,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(&base.0, 3, 64 << 20, params)?.with_rtt_ns(rtt_ns);
    let header = *store.header();
    let (mut connect_times, mut read_times, mut batches) = (Vec::new(), Vec::new(), 0);
    for _ in 0..connects {
        let count = Rc::new(Cell::new(0));
        let fabric = Traced::new(store.fabric(), Count(count.clone()));
        let clock = SystemClock::new(header.epoch_unix_ns, header.tick_ns);
        let started = Instant::now();
        let client = KvClient::connect(fabric, clock, *store.layout(), store.config())?;
        connect_times.push(started.elapsed());
        batches += count.get();
        client.close();
        let fabric = store.fabric();
        let started = Instant::now();
        swarm_kv::testing::read_configuration(&fabric)?;
        read_times.push(started.elapsed());
    }
    println!(
        "connect_cost: {connects} connects, rtt {rtt_ns} ns: {:.1} batches per connect; connect {}; a configuration read {}",
        batches as f64 / connects.max(1) as f64,
        summary(connect_times),
        summary(read_times)
    );
    Ok(())
}
