//! Runs one operation `N` times, for instruction counts that a loaded host does not
//! blur: run it under `valgrind --tool=callgrind` at two `N` and divide the
//! difference of the totals by the difference of the `N`s (`scripts/opcost.sh` does
//! exactly that for every operation).
//!
//! ```text
//! cargo run --release -p swarm-benches --example opcost -- sg-read 10000
//! ```
//!
//! Operations: `read-node` (64 B directly on the mapped node), `read-roundtrip`
//! (the same read as protocol code runs it: `block_on` + `Roundtrip`), `raw-read`,
//! `raw-write`, `sg-read`, `sg-write` (Safe-Guess, 3 replicas, W = 8, 64 B payloads,
//! rtt 0 through the `swarm bench` fabric stack `FailNodes<EmulatedRtt<ShmFabric>>`),
//! `sg-read-into` (`Client::read_into`: the same read into one reused buffer; the
//! read's own buffer goes back to the fabric, so no allocation per read).
//!
//! `kv-get`, `kv-update`: SWARM-KV's `KvClient::get_into` and `KvClient::update` of
//! 16 cached keys (24-byte keys, 64-byte values) on a 3-node shared-memory store
//! (`swarm bench`'s fabric stack), one `block_on` each. The store's time-driven upkeep
//! (the background slot-recycling check, every millisecond by default, and the
//! lease renewal) is set far apart, so that the count is the operation's own, not
//! a share of upkeep that a run under callgrind, 50 times slower, would inflate.
//!
//! `inflight-K` is not for callgrind: `K` Safe-Guess reads of `K` registers in flight
//! on one thread (`LocalExecutor`) at an emulated 1.5 µs roundtrip, `N` operations in
//! all; prints reads per second of wall time and of the thread's CPU time, to compare
//! `K` = 8 with `K` = 1 (SWARM §7.2's in-flight operations).
//!
//! `spread-K` and `spread-plain-K` are not for callgrind either: `K` Safe-Guess reads
//! in flight on one thread, with no latency, each of a register drawn at random among
//! 200,000 (40 MB of registers per node, beyond the processor's caches), `N` in all;
//! prints reads per second. `spread-K` runs them `OpStats::interleaved` (each yields
//! after hinting its memory, so the reads' cache misses overlap), `spread-plain-K`
//! with `OpStats::new`.

use std::hint::black_box;
use std::sync::Arc;

use swarm_benches::ShmFixture;
use swarm_core::encoding::WriterId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, NodeId, OpStats, ProtocolConfig, RegisterCache, RegisterLoc, Replicas,
    Roundtrip, block_on, block_on_future,
};
use swarm_kv::SystemClock;
use swarm_shm::{EmulatedFabric, ShmCluster};

const PAYLOAD: usize = 64;
/// Emulated roundtrip of the `inflight-N` mode.
const INFLIGHT_RTT_NS: u64 = 1500;
const SLOTS: u32 = 1 << 16;

/// Writer 0 on `cluster` through the `swarm bench` fabric stack with an emulated
/// roundtrip of `rtt_ns`, timestamps from the wall clock, and no fallback to the
/// third replica within a second (every node answers here).
fn shm_client(
    cluster: &Arc<ShmCluster>,
    layout: Layout,
    rtt_ns: u64,
) -> Client<EmulatedFabric, SystemClock> {
    let clock = SystemClock::new(cluster.epoch_unix_ns(), cluster.tick_ns());
    Client::new(
        cluster.client_with(rtt_ns),
        clock,
        layout,
        WriterId::new(0).expect("writer"),
        ProtocolConfig::default().with_slow_after_ns(1_000_000_000),
    )
    .expect("client")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "sg-read".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let layout = Layout::builder()
        .payload_max(PAYLOAD as u32)
        .meta_words(8)
        .log_base(HEADER_SIZE + 4096)
        .writers(1)
        .slots_per_writer(SLOTS)
        .build()
        .expect("layout");
    let fixture = ShmFixture::new(3, layout.log_base() + layout.log_bytes()).expect("cluster");
    let cluster = &fixture.cluster;
    let reg = RegisterLoc::at(HEADER_SIZE, Replicas::all(3, 0).expect("replicas"));
    let client = shm_client(cluster, layout, 0);
    let fabric = client.fabric();
    let mut cache = RegisterCache::new();
    let payload = [0x5Au8; PAYLOAD];
    let stats = OpStats::new();
    block_on(fabric, client.write(&reg, &mut cache, &stats, &payload)).expect("first write");
    block_on(fabric, client.raw_write(&reg, &stats, &payload)).expect("first raw write");
    if std::env::var_os("OPCOST_SIZES").is_some() {
        let read = client.read(&reg, &mut cache, &stats);
        eprintln!("read future: {} bytes", std::mem::size_of_val(&read));
        drop(read);
        let write = client.write(&reg, &mut cache, &stats, &payload);
        eprintln!("write future: {} bytes", std::mem::size_of_val(&write));
    }
    if let Some(rest) = op.strip_prefix("spread-") {
        let (interleaved, inflight) = match rest.strip_prefix("plain-") {
            Some(inflight) => (false, inflight),
            None => (true, rest),
        };
        spread(inflight.parse().expect("spread-K"), interleaved, n);
        return;
    }
    if let Some(kv_op) = op.strip_prefix("kv-") {
        kv(kv_op, n);
        return;
    }
    if let Some(inflight) = op.strip_prefix("inflight-") {
        let inflight: usize = inflight.parse().expect("inflight-N");
        in_flight(cluster, layout, inflight, n);
        return;
    }
    // Writes take a log slot each, and logs are not recycled.
    assert!(n < u64::from(SLOTS) / 2, "at most {} operations", SLOTS / 2);
    let node = cluster.node(NodeId(0)).expect("node 0");
    let plain = cluster.client();
    let mut out = [0u8; PAYLOAD];
    let mut value_out = Vec::with_capacity(PAYLOAD);
    for _ in 0..n {
        match op.as_str() {
            "read-node" => node.read(black_box(HEADER_SIZE), &mut out).expect("read"),
            "read-roundtrip" => {
                let stats = OpStats::new();
                // The reply is read where it is, as protocol steps read metadata:
                // its buffer goes back to the fabric with the roundtrip.
                let done = block_on_future(&plain, async {
                    let mut rt = Roundtrip::start(&plain, &stats);
                    rt.post(NodeId(0), Batch::read(black_box(HEADER_SIZE), 64))
                        .expect("post");
                    rt.wait(1).await.expect("answer");
                    rt.replies()[0].1.read(0).map(|bytes| bytes[0])
                });
                black_box(done.expect("no stall"));
            }
            "raw-read" => {
                let stats = OpStats::new();
                black_box(block_on(fabric, client.raw_read(&reg, &stats)).expect("raw read"));
            }
            "raw-write" => {
                let stats = OpStats::new();
                block_on(fabric, client.raw_write(&reg, &stats, &payload)).expect("raw write");
            }
            "sg-read" => {
                let stats = OpStats::new();
                let read = block_on(fabric, client.read(&reg, &mut cache, &stats));
                black_box(read.expect("read"));
            }
            "sg-read-into" => {
                let stats = OpStats::new();
                let read = block_on(
                    fabric,
                    client.read_into(&reg, &mut cache, &stats, &mut value_out),
                );
                black_box(read.expect("read"));
                black_box(&value_out);
            }
            "sg-write" => {
                let stats = OpStats::new();
                block_on(fabric, client.write(&reg, &mut cache, &stats, &payload)).expect("write");
            }
            other => panic!("unknown operation {other:?}"),
        }
    }
}

/// `n` KV operations `op` (`get` or `update`); see the module docs.
fn kv(op: &str, n: u64) {
    use swarm_kv::ClusterParams;
    use swarm_kv::ShmStore;
    const KEYS: u64 = 16;
    let dir = swarm_shm::ScratchDir::new("opcost-kv").expect("scratch directory");
    let params = ClusterParams {
        key_max: 32,
        value_max: PAYLOAD as u32,
        writers: 4,
        lease_ns: 600_000_000_000,
        lease_renew_ns: 200_000_000_000,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(dir.path(), 3, 64 << 20, params).expect("store");
    let mut config = store.config();
    config.protocol = config
        .protocol
        .with_slot_recycling_interval_ns(600_000_000_000);
    let client = store.client_with(config).expect("client");
    let fabric = client.fabric();
    let key = |i: u64| {
        let mut key = [b'k'; 24];
        key[16..].copy_from_slice(&(i % KEYS).to_be_bytes());
        key
    };
    let value = [0x5Au8; PAYLOAD];
    for i in 0..KEYS {
        block_on(fabric, client.insert(&key(i), &value, &OpStats::new())).expect("insert");
    }
    let mut out = Vec::with_capacity(PAYLOAD);
    for i in 0..n {
        let stats = OpStats::new();
        match op {
            "get" => {
                let found = block_on(fabric, client.get_into(&key(i), &mut out, &stats));
                assert!(found.expect("get"), "the key is present");
            }
            "update" => {
                let updated = block_on(fabric, client.update(&key(i), &value, &stats));
                assert!(updated.expect("update"), "the key is present");
            }
            other => panic!("unknown KV operation {other:?}"),
        }
    }
}

/// `inflight` Safe-Guess reads in flight at once on one client thread; see the
/// module docs.
fn in_flight(cluster: &Arc<ShmCluster>, layout: Layout, inflight: usize, total: u64) {
    use std::cell::Cell;
    let client = shm_client(cluster, layout, INFLIGHT_RTT_NS);
    let regs: Vec<RegisterLoc> = (0..inflight as u64)
        .map(|i| {
            RegisterLoc::at(
                HEADER_SIZE + i * layout.register_bytes(),
                Replicas::all(3, i).expect("replicas"),
            )
        })
        .collect();
    assert!(
        HEADER_SIZE + inflight as u64 * layout.register_bytes() <= layout.log_base(),
        "too many registers for the layout"
    );
    let caches: Vec<RegisterCache> = regs
        .iter()
        .map(|reg| {
            let mut cache = RegisterCache::new();
            let stats = OpStats::new();
            block_on(
                client.fabric(),
                client.write(reg, &mut cache, &stats, &[7; PAYLOAD]),
            )
            .expect("first write");
            cache
        })
        .collect();
    let left = Cell::new(total);
    let cpu = || {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec for the duration of the call.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
    };
    let (wall0, cpu0) = (std::time::Instant::now(), cpu());
    let mut exec = swarm_core::LocalExecutor::new();
    for (reg, mut cache) in regs.iter().zip(caches) {
        let (client, left) = (&client, &left);
        exec.spawn(async move {
            while left.get() > 0 {
                left.set(left.get() - 1);
                let stats = OpStats::new();
                let read = client.read(reg, &mut cache, &stats).await.expect("read");
                black_box(read);
            }
        });
    }
    exec.run(client.fabric(), |_, ()| {}).expect("no stall");
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu() - cpu0);
    println!(
        "inflight {inflight}: {:.0} reads/s wall, {:.0} reads per CPU second ({:.2} s wall, {:.2} s CPU)",
        total as f64 / wall,
        total as f64 / cpu,
        wall,
        cpu
    );
}

/// Registers the `spread-K` reads pick from.
const SPREAD_REGISTERS: u64 = 200_000;

/// `inflight` Safe-Guess reads in flight at once on one client thread, of registers
/// drawn at random, with no latency; see the module docs.
fn spread(inflight: usize, interleaved: bool, total: u64) {
    use std::cell::Cell;
    let layout_with = |log_base: u64| {
        Layout::builder()
            .payload_max(PAYLOAD as u32)
            .meta_words(8)
            .log_base(log_base)
            .writers(1)
            .slots_per_writer(1024)
            .build()
            .expect("layout")
    };
    let registers_end =
        HEADER_SIZE + SPREAD_REGISTERS * layout_with(HEADER_SIZE + 4096).register_bytes();
    let layout = layout_with(registers_end.next_multiple_of(4096));
    let fixture = ShmFixture::new(3, layout.log_base() + layout.log_bytes()).expect("cluster");
    let client = shm_client(&fixture.cluster, layout, 0);
    let left = Cell::new(total);
    let seed = Cell::new(0x9E37_79B9_7F4A_7C15_u64);
    // xorshift64: the register of the next read.
    let next_register = || {
        let mut x = seed.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        seed.set(x);
        x % SPREAD_REGISTERS
    };
    let started = std::time::Instant::now();
    let mut exec = swarm_core::LocalExecutor::new();
    for _ in 0..inflight {
        let (client, left, next_register) = (&client, &left, &next_register);
        exec.spawn(async move {
            while left.get() > 0 {
                left.set(left.get() - 1);
                let i = next_register();
                // Never written: a read still reads the metadata words of a majority
                // and the primary's in-place block, and finds the register empty.
                let reg = RegisterLoc::at(
                    HEADER_SIZE + i * layout.register_bytes(),
                    Replicas::all(3, i).expect("replicas"),
                );
                let stats = if interleaved {
                    OpStats::interleaved()
                } else {
                    OpStats::new()
                };
                let read = client.read(&reg, &mut RegisterCache::new(), &stats).await;
                black_box(read.expect("read"));
            }
        });
    }
    exec.run(client.fabric(), |_, ()| {}).expect("no stall");
    let wall = started.elapsed().as_secs_f64();
    println!(
        "spread {inflight} ({}): {:.0} reads/s ({wall:.2} s)",
        if interleaved { "interleaved" } else { "plain" },
        total as f64 / wall
    );
}
