//! What `protocol_threads.rs` and `protocol_processes.rs` share: the cluster shape,
//! a wall clock in cluster ticks, a seeded client workload that records every
//! operation for the linearizability checker, and the check itself.
//!
//! The workload, on real shared memory: closed-loop clients, each its own writer, doing
//! mixed Safe-Guess reads and writes (SWARM §3.2) of unique values on a few registers,
//! so that the history pins down which write every read saw. Every operation is
//! recorded with its call and return times on `CLOCK_MONOTONIC`, which all threads
//! *and* all processes of the host share, so histories recorded by different processes
//! merge into one.

use std::fmt;
use std::path::PathBuf;
use std::task::Poll;
use std::time::{SystemTime, UNIX_EPOCH};

use swarm_checker::{History, OpKind, Operation};
use swarm_core::encoding::WriterId;
use swarm_core::fabric::Nanos;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Clock, Completion, Fabric, FabricError, NodeId, OpStats, ReadValue,
    RegisterCache, RegisterLoc, Replicas, Ticket, WriteOutcome, block_on_future,
};
use swarm_shm::ShmCluster;

/// Memory nodes (and replicas of every register): `n = 2f + 1` with `f = 1`.
pub const NODES: u16 = 3;
/// Bytes after the node header that the tests keep for their own coordination words
/// (start flags, progress counters); registers start after them.
pub const CONTROL_BYTES: u64 = 4096;
/// Largest payload; written values are short strings like `w3-417`.
const PAYLOAD_MAX: u32 = 32;
/// Environment variable that fixes the workload seed of a rerun.
pub const SEED_VAR: &str = "SWARM_SHM_SEED";

/// The shape of a test cluster: registers, metadata words and writer logs.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Metadata words per register (`W`, SWARM §4.4).
    pub meta_words: u16,
    /// Writers that get a log (writer ids `0..writers`).
    pub writers: u16,
    /// Registers (keys `0..keys`).
    pub keys: u32,
    /// The most writes one writer issues: every write takes a fresh out-of-place slot
    /// (there is no log recycling yet), a stale guess takes two.
    pub writes_per_writer: u32,
}

impl Shape {
    /// The cluster layout every client of the test uses.
    pub fn layout(&self) -> Layout {
        let registers_end = self.registers_base() + u64::from(self.keys) * self.register_bytes();
        let slots = (2 * self.writes_per_writer + 16).next_power_of_two();
        Layout::builder()
            .payload_max(PAYLOAD_MAX)
            .meta_words(self.meta_words)
            .log_base(registers_end.next_multiple_of(4096))
            .writers(self.writers)
            .slots_per_writer(slots)
            .build()
            .expect("test layouts are valid")
    }

    fn register_bytes(&self) -> u64 {
        Layout::builder()
            .payload_max(PAYLOAD_MAX)
            .meta_words(self.meta_words)
            .log_base(0)
            .writers(1)
            .slots_per_writer(1)
            .build()
            .expect("test layouts are valid")
            .register_bytes()
    }

    fn registers_base(&self) -> u64 {
        HEADER_SIZE + CONTROL_BYTES
    }

    /// Bytes of each node file.
    pub fn node_bytes(&self) -> u64 {
        let layout = self.layout();
        layout.log_base() + layout.log_bytes()
    }

    /// Where register `key` lives: the same offset on all nodes, replicas rotated by
    /// the key so that primaries and preferred majorities differ between keys (§6).
    pub fn register(&self, key: u32) -> RegisterLoc {
        RegisterLoc::at(
            self.registers_base() + u64::from(key) * self.register_bytes(),
            Replicas::all(usize::from(NODES), u64::from(key)).expect("3 replicas are valid"),
        )
    }
}

/// How a client's clock deviates from the host's real time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skew {
    /// Reads real time.
    None,
    /// Always this many ns ahead (positive) or behind (negative).
    Fixed(i64),
    /// Alternately `amplitude_ns` ahead and behind, switching every `period_ns`, like
    /// a clock stepped back and forth by a synchronisation daemon: each step back
    /// makes this client's guesses stale again (the guesser only ever moves forward).
    Flapping {
        /// How far ahead or behind.
        amplitude_ns: i64,
        /// How long each phase lasts.
        period_ns: u64,
    },
}

/// A loosely synchronised clock: real time in the cluster's ticks since its epoch
/// (both from the node headers), `ticks = (now_unix_ns - epoch) / tick_ns`, shifted
/// by a [`Skew`] to make timestamp guesses stale on purpose (SWARM §3.2, §6).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    epoch_unix_ns: u64,
    tick_ns: u64,
    skew: Skew,
}

impl WallClock {
    /// A clock for `cluster`, skewed by `skew`.
    pub fn new(cluster: &ShmCluster, skew: Skew) -> Self {
        Self {
            epoch_unix_ns: cluster.epoch_unix_ns(),
            tick_ns: cluster.tick_ns(),
            skew,
        }
    }
}

impl Clock for WallClock {
    fn ticks(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let skew = match self.skew {
            Skew::None => 0,
            Skew::Fixed(ns) => ns,
            Skew::Flapping {
                amplitude_ns,
                period_ns,
            } => {
                if (now / period_ns.max(1)).is_multiple_of(2) {
                    amplitude_ns
                } else {
                    -amplitude_ns
                }
            }
        };
        now.saturating_add_signed(skew)
            .saturating_sub(self.epoch_unix_ns)
            / self.tick_ns
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for every thread and process of the
/// host, so operation intervals recorded by different processes are comparable.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable `timespec` that outlives the call, and
    // CLOCK_MONOTONIC is a clock id every Linux and POSIX host supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// The workload seed: `SWARM_SHM_SEED` if set, otherwise fresh. Thread and process
/// interleavings are not reproducible, but the operation mix of each client is.
pub fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_VAR}={text:?} is not an unsigned integer")),
        Err(_) => mix(monotonic_ns() ^ u64::from(std::process::id()) << 32),
    }
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A tiny deterministic generator (splitmix64): operation mixes replay from a seed.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0) % n.max(1)
    }
}

/// What each client does: which keys, how many writes.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Seed of the operation mix (each writer derives its own stream).
    pub seed: u64,
    /// Percentage of writes.
    pub write_percent: u64,
}

/// Operations that completed, by the roundtrips they took: 1, 2, 3, 4 or more.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Completed reads by roundtrips.
    pub reads: [u64; 4],
    /// Completed writes by roundtrips.
    pub writes: [u64; 4],
    /// The most loop iterations any read took (appendix C bounds them).
    pub max_read_iterations: u32,
    /// Operations that failed: their outcome is unknown, they are recorded as crashed.
    pub errors: Vec<String>,
}

impl Tally {
    fn add(bucket: &mut [u64; 4], roundtrips: u32) {
        bucket[(roundtrips.max(1) as usize - 1).min(3)] += 1;
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Tally) {
        for i in 0..4 {
            self.reads[i] += other.reads[i];
            self.writes[i] += other.writes[i];
        }
        self.max_read_iterations = self.max_read_iterations.max(other.max_read_iterations);
        self.errors.extend(other.errors.iter().cloned());
    }

    /// Writes whose guess was stale: read + write, TRYLOCK, rewrite (3+ roundtrips).
    pub fn slow_writes(&self) -> u64 {
        self.writes[2] + self.writes[3]
    }

    /// Operations that needed more than one roundtrip.
    pub fn multi_roundtrip(&self) -> u64 {
        self.reads[1..].iter().chain(&self.writes[1..]).sum()
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [r1, r2, r3, r4] = self.reads;
        let [w1, w2, w3, w4] = self.writes;
        write!(
            f,
            "reads by roundtrips 1/2/3/4+: {r1}/{r2}/{r3}/{r4}, writes: {w1}/{w2}/{w3}/{w4}, \
             max read iterations {}, errors {}",
            self.max_read_iterations,
            self.errors.len()
        )
    }
}

/// One client thread running the workload: Safe-Guess reads and writes of unique
/// values, each recorded as an [`Operation`] with monotonic call and return times.
#[derive(Debug)]
pub struct Worker<F, C> {
    client: Client<F, C>,
    shape: Shape,
    workload: Workload,
    caches: Vec<RegisterCache>,
    rng: Rng,
    /// Every operation issued, in order; failed ones as crashed (outcome unknown).
    pub ops: Vec<Operation>,
    /// Roundtrips and errors.
    pub tally: Tally,
}

impl<F: Fabric, C: Clock> Worker<F, C> {
    /// A worker for `client`, on `shape`'s registers.
    pub fn new(client: Client<F, C>, shape: Shape, workload: Workload) -> Self {
        let stream =
            workload.seed ^ u64::from(client.writer().get()).wrapping_mul(0x2545_f491_4f6c_dd1d);
        Self {
            client,
            shape,
            workload,
            caches: vec![RegisterCache::new(); shape.keys as usize],
            rng: Rng(stream),
            ops: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// Runs one operation. `observe` sees it twice: as crashed just before the call
    /// (a journal needs that to survive a kill) and in its final form after.
    pub fn step(&mut self, observe: &mut dyn FnMut(&Operation)) {
        let key = self.rng.below(u64::from(self.shape.keys)) as u32;
        let is_write = self.rng.below(100) < self.workload.write_percent;
        let writer = self.client.writer().get();
        let value = format!("w{writer}-{}", self.ops.len());
        let kind = if is_write {
            OpKind::Write
        } else {
            OpKind::Read
        };
        let reg = self.shape.register(key);
        let cache = &mut self.caches[key as usize];
        let stats = OpStats::new();
        let client = &self.client;
        let fabric = client.fabric();

        let mut op = Operation::crashed(
            u64::from(writer),
            kind,
            key_name(key),
            is_write.then_some(value.as_str()),
            monotonic_ns(),
        );
        observe(&op);
        let result = if is_write {
            match block_on_future(fabric, client.write(&reg, cache, &stats, value.as_bytes())) {
                Ok(Ok(WriteOutcome::Written)) => Ok(None),
                Ok(Ok(WriteOutcome::Deleted)) => {
                    Err("a write reported a delete, but nothing deletes".to_string())
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        } else {
            match block_on_future(fabric, client.read(&reg, cache, &stats)) {
                Ok(Ok(read)) => Ok(Some(read)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        let end = monotonic_ns();
        match result {
            Ok(read) => {
                op.end = Some(end);
                op.ok = Some(true);
                if let Some(read) = read {
                    op.value = match read {
                        ReadValue::Empty => None,
                        ReadValue::Value(bytes) => Some(
                            String::from_utf8(bytes)
                                .unwrap_or_else(|e| format!("<not utf-8: {:?}>", e.as_bytes())),
                        ),
                        // Never written by this workload: the checker rejects it.
                        ReadValue::Deleted => Some("<deleted>".to_string()),
                    };
                    Tally::add(&mut self.tally.reads, stats.roundtrips());
                    self.tally.max_read_iterations =
                        self.tally.max_read_iterations.max(stats.iterations());
                } else {
                    Tally::add(&mut self.tally.writes, stats.roundtrips());
                }
            }
            Err(e) => self.tally.errors.push(format!(
                "writer {writer}, op {} ({kind} on {}): {e}",
                self.ops.len(),
                key_name(key)
            )),
        }
        observe(&op);
        self.ops.push(op);
    }
}

/// The checker's name of register `key`.
pub fn key_name(key: u32) -> String {
    format!("r{key}")
}

/// Checks `history` and panics with the report, the seed, and the path of a copy of
/// the history (for `swarm-core`'s checker tools) if it is not linearizable.
pub fn assert_linearizable(history: &History, what: &str, seed: u64) {
    let path = kept_history_path(what, seed);
    let context = format!("{what} (seed {seed}, rerun with {SEED_VAR}={seed})");
    let report = swarm_checker::assert_linearizable_keeping(history, &context, Some(&path));
    print!("{what}: {report}");
}

fn kept_history_path(what: &str, seed: u64) -> PathBuf {
    let name: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!("swarm-shm-{name}-{seed}.jsonl"))
}

/// A writer id that the layout has a log for.
pub fn writer_id(id: u32) -> WriterId {
    WriterId::new(id).expect("test writer ids are small")
}

/// A client's [`ShmFabric`] that runs `pause` before every [`Fabric::progress`]: a
/// thread that gives up its core before it waits for a completion (as one blocking on
/// a completion queue would), or one descheduled between an executor's poll and its
/// next call to `progress`, as happens on a loaded host.
#[derive(Debug)]
pub struct PauseBeforeProgress {
    /// The fabric every call goes to.
    pub fabric: swarm_shm::EmulatedFabric,
    /// Runs before each `progress`.
    pub pause: fn(),
}

impl Fabric for PauseBeforeProgress {
    fn node_count(&self) -> usize {
        self.fabric.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.fabric.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.fabric.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.fabric.forget(ticket)
    }
    fn progress(&self) -> bool {
        (self.pause)();
        self.fabric.progress()
    }
    fn now(&self) -> Nanos {
        self.fabric.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.fabric.wake_at(deadline)
    }
}
