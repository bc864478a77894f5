//! Protocol micro-benchmarks: one replicated read or write on emulated
//! disaggregated memory, next to the unreplicated RAW floor (SWARM §7 "Baselines",
//! Table 2).
//!
//! Groups `raw`, `safe_guess` and `abd`, each with `read` and `write`, at emulated
//! roundtrip times of 0 (the software cost alone), 300 ns (CXL-like) and 1500 ns
//! (RDMA-like) ([`ShmCluster::client_with`], an `EmulatedRtt` around the shm fabric), e.g. `safe_guess/write/rtt1500`.
//!
//! Setting: three memory nodes on shared memory (`/dev/shm`), one register per
//! protocol replicated on all three (RAW: on the primary only), `W = 8` metadata
//! words (SWARM-KV's default), 64-byte payloads, one client, no contention. That is
//! the paper's common case, where a Safe-Guess read and write each take one
//! roundtrip, DM-ABD's two, and RAW's one: every benchmark first checks (untimed)
//! that its operation takes exactly that many, and that reads return the value
//! written, so it measures the path it names. No node fails here, so the fallback
//! timer of a quorum step (`ProtocolConfig::slow_after_ns`, 50 µs by default) is set
//! to a second: a benchmark thread descheduled on a loaded host must not count a
//! fallback to the third replica as a slow node.
//!
//! Log slots: every Safe-Guess or ABD write takes a fresh out-of-place buffer, and
//! there is no log recycling yet (a full log fails with "log full"). So iterations
//! run in chunks of at most [`CHUNK`] operations, each chunk on a fresh [`Client`]
//! (a fresh slot allocator) that resumes the previous one's timestamps and keeps
//! the register cache; only the operations are timed, never the client set-up. A
//! chunk fills at most a quarter of the log, so finding a free slot costs about one
//! hash probe, as it would with recycling at a low fill. (With a single writer and
//! no reader running, reusing the slots of an earlier chunk is harmless.)
//!
//! Clock: wall time by default. On a shared, loaded host, `SWARM_BENCH_CLOCK=cpu`
//! times the benchmark thread's CPU time instead (`CLOCK_THREAD_CPUTIME_ID`), which
//! leaves out the time the thread spends descheduled. The client never blocks (an
//! emulated roundtrip is a spin), so on an idle host both clocks agree.
//!
//! ```text
//! cargo bench -p swarm-benches --bench protocol -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use swarm_benches::ShmFixture;
use swarm_core::encoding::WriterId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Client, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, WriteOutcome,
    block_on, block_on_future,
};
use swarm_kv::SystemClock;
use swarm_shm::{EmulatedFabric, ShmCluster};

const NODES: u16 = 3;
const PAYLOAD: usize = 64;
const META_WORDS: u16 = 8;
/// Slots in the (only) writer's log.
const SLOTS: u32 = 4096;
/// The most operations one client runs: a quarter of the log.
const CHUNK: u64 = SLOTS as u64 / 4;
/// Emulated roundtrip times: none, CXL-like, RDMA-like.
const RTTS_NS: [u64; 3] = [0, 300, 1500];
/// Operations checked (untimed) before each benchmark.
const CHECKED_OPS: u32 = 100;
/// No node is slow or failed: only a descheduled thread could reach this.
const SLOW_AFTER_NS: u64 = 1_000_000_000;
/// Selects the clock: `wall` (default) or `cpu`.
const CLOCK_VAR: &str = "SWARM_BENCH_CLOCK";

/// What the benchmarks time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Elapsed real time.
    Wall,
    /// CPU time of the calling thread.
    ThreadCpu,
}

impl Timer {
    fn from_env() -> Self {
        match std::env::var(CLOCK_VAR).as_deref() {
            Err(_) | Ok("wall") => Self::Wall,
            Ok("cpu") => Self::ThreadCpu,
            Ok(other) => panic!("{CLOCK_VAR}={other:?}: use \"wall\" or \"cpu\""),
        }
    }

    /// Nanoseconds on this timer's clock, from an arbitrary origin.
    fn now_ns(self) -> u64 {
        let clock = match self {
            Self::Wall => libc::CLOCK_MONOTONIC,
            Self::ThreadCpu => libc::CLOCK_THREAD_CPUTIME_ID,
        };
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable `timespec` that outlives the call, and
        // both clock ids are supported by every Linux kernel since 2.6.12.
        let rc = unsafe { libc::clock_gettime(clock, &mut now) };
        assert_eq!(rc, 0, "clock_gettime({clock}) failed");
        u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(now.tv_nsec).unwrap_or(0)
    }
}

/// Which protocol a benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// Unreplicated, in place, no concurrency control.
    Raw,
    /// Safe-Guess (SWARM §3).
    SafeGuess,
    /// DM-ABD (SWARM §2.3, §7).
    Abd,
}

impl Protocol {
    const ALL: [Self; 3] = [Self::Raw, Self::SafeGuess, Self::Abd];

    fn name(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::SafeGuess => "safe_guess",
            Self::Abd => "abd",
        }
    }

    /// Roundtrips of a read and of a write with no contention and no failure.
    fn roundtrips(self, kind: Kind) -> u32 {
        match (self, kind) {
            (Self::Raw | Self::SafeGuess, _) => 1,
            (Self::Abd, _) => 2,
        }
    }
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// The cluster and the three registers (one per protocol).
struct Setup {
    fixture: ShmFixture,
    layout: Layout,
    clock: SystemClock,
}

impl Setup {
    fn new() -> Self {
        let probe = Layout::builder()
            .payload_max(PAYLOAD as u32)
            .meta_words(META_WORDS)
            .log_base(0)
            .writers(1)
            .slots_per_writer(1)
            .build()
            .expect("a valid layout");
        let registers_end = HEADER_SIZE + 3 * probe.register_bytes();
        let layout = Layout::builder()
            .payload_max(PAYLOAD as u32)
            .meta_words(META_WORDS)
            .log_base(registers_end.next_multiple_of(4096))
            .writers(1)
            .slots_per_writer(SLOTS)
            .build()
            .expect("a valid layout");
        let fixture = ShmFixture::new(NODES, layout.log_base() + layout.log_bytes())
            .expect("benchmark cluster");
        let clock = SystemClock::new(fixture.cluster.epoch_unix_ns(), fixture.cluster.tick_ns());
        Self {
            fixture,
            layout,
            clock,
        }
    }

    fn cluster(&self) -> &Arc<ShmCluster> {
        &self.fixture.cluster
    }

    /// The register `protocol` works on; the primary is node 0 for all three.
    fn register(&self, protocol: Protocol) -> RegisterLoc {
        let index = Protocol::ALL
            .iter()
            .position(|p| *p == protocol)
            .expect("a known protocol") as u64;
        RegisterLoc::at(
            HEADER_SIZE + index * self.layout.register_bytes(),
            Replicas::all(usize::from(NODES), 0).expect("3 replicas"),
        )
    }
}

/// One benchmark's client-side state, carried from chunk to chunk.
struct Runner<'a> {
    setup: &'a Setup,
    timer: Timer,
    protocol: Protocol,
    kind: Kind,
    rtt_ns: u64,
    reg: RegisterLoc,
    cache: RegisterCache,
    payload: [u8; PAYLOAD],
}

impl<'a> Runner<'a> {
    fn new(setup: &'a Setup, protocol: Protocol, kind: Kind, rtt_ns: u64, timer: Timer) -> Self {
        let mut runner = Self {
            setup,
            timer,
            protocol,
            kind,
            rtt_ns,
            reg: setup.register(protocol),
            cache: RegisterCache::new(),
            payload: [0x5A; PAYLOAD],
        };
        // Reads need a value; a first write also warms up the cache.
        let client = runner.client();
        runner.op(&client, Kind::Write);
        runner
    }

    /// A fresh client (fresh slot allocator) continuing the timestamps written so far.
    fn client(&self) -> Client<EmulatedFabric, SystemClock> {
        let fabric = self.setup.cluster().client_with(self.rtt_ns);
        let writer = WriterId::new(0).expect("writer 0");
        let client = Client::new(
            fabric,
            self.setup.clock,
            self.setup.layout,
            writer,
            ProtocolConfig::default().with_slow_after_ns(SLOW_AFTER_NS),
        )
        .expect("a client for writer 0");
        let last = (0..self.reg.replicas.len())
            .map(|p| self.cache.known_max(p).ts().ticks())
            .max()
            .unwrap_or(0);
        client.resume([], last);
        client
    }

    /// Runs one operation of `kind`; returns its roundtrips.
    fn op(&mut self, client: &Client<EmulatedFabric, SystemClock>, kind: Kind) -> u32 {
        let stats = OpStats::new();
        let (reg, cache, payload) = (&self.reg, &mut self.cache, &self.payload);
        let fabric = client.fabric();
        let stalled = "no stall with every node alive";
        let read = match (self.protocol, kind) {
            (Protocol::Raw, Kind::Read) => {
                Some(block_on_future(fabric, client.raw_read(reg, &stats)).expect(stalled))
            }
            (Protocol::Raw, Kind::Write) => {
                block_on(fabric, client.raw_write(reg, &stats, payload)).expect("RAW write");
                None
            }
            (Protocol::SafeGuess, Kind::Read) => {
                Some(block_on_future(fabric, client.read(reg, cache, &stats)).expect(stalled))
            }
            (Protocol::SafeGuess, Kind::Write) => {
                let out = block_on_future(fabric, client.write(reg, cache, &stats, payload));
                assert_eq!(out, Ok(Ok(WriteOutcome::Written)), "Safe-Guess write");
                None
            }
            (Protocol::Abd, Kind::Read) => {
                Some(block_on_future(fabric, client.abd_read(reg, cache, &stats)).expect(stalled))
            }
            (Protocol::Abd, Kind::Write) => {
                let out = block_on_future(fabric, client.abd_write(reg, cache, &stats, payload));
                assert_eq!(out, Ok(Ok(WriteOutcome::Written)), "ABD write");
                None
            }
        };
        if let Some(read) = read {
            black_box(read.expect("read"));
        }
        stats.roundtrips()
    }

    /// Checks, untimed, that operations take the common-case roundtrips and that
    /// reads return what was written.
    fn check(&mut self) {
        let client = self.client();
        let expected = self.protocol.roundtrips(self.kind);
        for i in 0..CHECKED_OPS {
            let roundtrips = self.op(&client, self.kind);
            assert_eq!(
                roundtrips,
                expected,
                "{}/{} at rtt {} ns: operation {i} took {roundtrips} roundtrips, \
                 not the common case's {expected}",
                self.protocol.name(),
                self.kind.name(),
                self.rtt_ns
            );
        }
        if self.kind == Kind::Read {
            let value = self.read_value(&client);
            assert_eq!(value, ReadValue::Value(self.payload.to_vec()), "read value");
        }
    }

    fn read_value(&mut self, client: &Client<EmulatedFabric, SystemClock>) -> ReadValue {
        let stats = OpStats::new();
        let (reg, cache, fabric) = (&self.reg, &mut self.cache, client.fabric());
        let out = match self.protocol {
            Protocol::Raw => block_on_future(fabric, client.raw_read(reg, &stats)),
            Protocol::SafeGuess => block_on_future(fabric, client.read(reg, cache, &stats)),
            Protocol::Abd => block_on_future(fabric, client.abd_read(reg, cache, &stats)),
        };
        out.expect("no stall").expect("read")
    }

    /// Times `iters` operations, in chunks on fresh clients.
    fn time(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let chunk = left.min(CHUNK);
            let client = self.client();
            let start = self.timer.now_ns();
            for _ in 0..chunk {
                black_box(self.op(&client, self.kind));
            }
            total += Duration::from_nanos(self.timer.now_ns().saturating_sub(start));
            left -= chunk;
        }
        total
    }
}

fn protocols(c: &mut Criterion) {
    let setup = Setup::new();
    let timer = Timer::from_env();
    for protocol in Protocol::ALL {
        let mut group = c.benchmark_group(protocol.name());
        for kind in [Kind::Read, Kind::Write] {
            for rtt_ns in RTTS_NS {
                let mut runner = Runner::new(&setup, protocol, kind, rtt_ns, timer);
                runner.check();
                let id = BenchmarkId::new(kind.name(), format!("rtt{rtt_ns}"));
                group.bench_function(id, |b| b.iter_custom(|iters| runner.time(iters)));
            }
        }
        group.finish();
    }
}

criterion_group!(benches, protocols);
criterion_main!(benches);
