//! Running a benchmark on a SWARM-KV store ([`run`]), as the paper does (§7).
//!
//! `clients` threads, each with its own [`KvClient`] using the chosen register
//! protocol, go through three phases separated by [`Gate`]s, so each phase is timed
//! on its own:
//!
//! 1. **load**: the keys are split into one contiguous range per client, and each
//!    client inserts its range;
//! 2. **warm-up** (unmeasured): with `warm_cache`, every client gets every key once,
//!    starting at a different key per client, so every location cache holds every
//!    key, as in the paper's setting; then `warmup_ops` workload operations;
//! 3. **measured**: `ops` workload operations in total, claimed one at a time from a
//!    shared counter by whichever client is free (closed loop);
//! 4. **drain** (`drain`, unmeasured): each client deletes its range of every key
//!    the run names (churn's whole key space), so the run leaves no key behind.
//!
//! A client keeps `inflight` operations going at once on one thread with a
//! [`SlotExecutor`] (the paper's §7.2): as soon as one finishes, the next is issued
//! in its slot. An operation's latency runs from its issue (when its slot is handed
//! it: with several in flight, the wait for its first poll counts, as it would for an
//! application) to the poll that sees it complete; its stats, history record and
//! progress are written only after the end time is taken.
//!
//! With a [`FailPlan`](super::FailPlan), every client marks the node failed on its
//! own fabric (`FailNodes::fail_node`, in `EmulatedFabric`) when it claims the measured operation
//! numbered `after_ops`: from then on that node never answers it, which is how a
//! crashed memory node looks to a client (§7.7). Operations must go on with no error.
//!
//! With [`FailMode::LoseMemory`](super::config::FailMode) the claiming client instead
//! replaces the node's file (`ShmCluster::replace_node`: the old memory is retired,
//! which every client sees at once, and an empty node with a new incarnation takes
//! its place, left out); with `FailMode::Repair` a background thread then rebuilds it
//! (`ShmStore::repair`) while the clients run, and they admit it back: the report
//! marks the repair's start, the end of its quiescence wait and its end on the
//! timeline (issue 12). Shared memory only.
//!
//! A client thread waiting at a phase boundary for the others keeps its lease
//! ([`BenchClient::keep_alive`]): renewals ride on operations, and a lease that does
//! not move for a reclaimer's watch may be killed where owner processes cannot be
//! judged (RDMA). A client whose lease is lost anyway (killed: every later operation
//! would fail with `LeaseExpired`) is replaced by a new client, once per thread, and
//! the thread's logs say so ([`Reconnect`]).
//!
//! Failed operations are counted per kind with example messages, recorded in the
//! history without an end (their effect is unknown), and the run goes on. If every
//! operation in flight on a client waits on failed nodes only, the executor reports a
//! stall: those operations fail with [`FabricError::Stalled`] and the client moves on.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use swarm_checker::{OpKind, Operation};
use swarm_core::fabric::FailNodes;
use swarm_core::{DeleteOutcome, Fabric, FabricError, NodeId, OpStats, SlotExecutor, step_rounds};

use super::bench_client::{BenchClient, OpError, Recycling};
use super::config::FailMode;
use super::config::{BenchConfig, System};
use super::error::BenchError;
use super::gate::Gate;
use super::history::{self, HistoryPart};
use super::report::RepairMarks;
use super::report::{BenchReport, MemoryUse, RunStats};
use super::sizing::{check_capacity, registers_needed, unclaimed_registers};
use super::stats::PhaseRecorder;
use super::timeline::Timeline;
use super::workload::{KeySpace, OpChooser, OpType, value};
use swarm_kv::admin::{self, RegisterProtocol};
use swarm_kv::{KvClient, KvError, ShmStore, Store, SystemClock};

/// Progress is reported to the bar in batches of this many operations.
const PROGRESS_BATCH: u64 = 256;

/// How often a client thread waiting at a phase boundary keeps its lease
/// ([`BenchClient::keep_alive`]: a tick, which renews only when a renewal is due).
const KEEP_ALIVE_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// The register protocol a system runs on SWARM-KV's store; `None` for FUSEE, which
/// has a store and protocol of its own ([`run_fusee`]).
pub fn register_protocol(system: System) -> Option<RegisterProtocol> {
    match system {
        System::Swarm => Some(RegisterProtocol::SafeGuess),
        System::Abd => Some(RegisterProtocol::Abd),
        System::Raw => Some(RegisterProtocol::Raw),
        System::Fusee => None,
    }
}

/// Runs `config` on `store` and reports the figures. Failed operations do not stop
/// the run: they are counted in the report.
///
/// The store may already hold the benchmark's keys (an earlier run): the load then
/// overwrites them, and the history stays checkable because every key is inserted
/// before any other operation touches it. Each insert of a key that is already there
/// allocated a fresh register before finding it; that register is retired and reused
/// after the recycling grace (`swarm_kv::registers::recycle`).
pub fn run(store: &ShmStore, config: &BenchConfig) -> Result<BenchReport, BenchError> {
    config.validate()?;
    let nodes = store.fabric().node_count();
    check_fail_node(config, nodes)?;
    if config.system == System::Fusee {
        let nodes = u16::try_from(nodes).unwrap_or(u16::MAX);
        return run_fusee(nodes, config);
    }
    check_store_capacity(store, config)?;
    let memory_start = memory_use(store)?;
    // The shared-memory fabric already carries the fault injector.
    let store = store.clone().with_rtt_ns(config.rtt_ns);
    let clients = connect(&store, config, || Ok(store.fabric()))?;
    let reconnect = || connect_one(&store, config, 0, || Ok(store.fabric()));
    let report = run_clients(
        clients,
        config,
        Some(store.shm().dir().to_path_buf()),
        Some(&reconnect),
    )?;
    with_memory(report, memory_start, memory_use(&store)?)
}

/// Runs `config` on any SWARM-KV store — over RDMA, say (`swarm bench --cluster`) —
/// with its real latency: `rtt_ns` (emulated latency) must be 0 and FUSEE, which
/// has a store of its own, is not available. [`run`] is the shared-memory version.
pub fn run_on<S: Store + Sync>(store: &S, config: &BenchConfig) -> Result<BenchReport, BenchError>
where
    S::Fabric: Send,
{
    config.validate()?;
    if config.rtt_ns != 0 {
        return Err(BenchError::InvalidConfig(
            "--rtt-ns emulates network latency on shared memory; this cluster has a real \
             network: leave it at 0"
                .into(),
        ));
    }
    if config.system == System::Fusee {
        return Err(BenchError::InvalidConfig(
            "FUSEE runs on a shared-memory store of its own: use --dir (or leave --system \
             at swarm, abd or raw)"
                .into(),
        ));
    }
    let nodes = store.fabric()?.node_count();
    check_fail_node(config, nodes)?;
    if config.fail.is_some() && config.fail_mode != FailMode::Stop {
        return Err(BenchError::InvalidConfig(
            "--fail-mode lose-memory and repair replace a node file: shared memory (--dir) \
             only; over RDMA, kill and restart a `swarm memnode` and run `swarm repair`"
                .into(),
        ));
    }
    check_store_capacity(store, config)?;
    let memory_start = memory_use(store)?;
    let clients = connect(store, config, || store.fabric().map(FailNodes::new))?;
    let reconnect = || connect_one(store, config, 0, || store.fabric().map(FailNodes::new));
    let report = run_clients(clients, config, None, Some(&reconnect))?;
    with_memory(report, memory_start, memory_use(store)?)
}

/// Memory in use on `store` now: registers in claimed chunks, and keys in the index.
pub fn memory_use<S: Store>(store: &S) -> Result<MemoryUse, BenchError> {
    let fabric = store.fabric()?;
    let layout = store.layout();
    let chunks = claimed_chunks(store)?;
    let keys = admin::count_keys(&fabric, layout)?;
    Ok(MemoryUse {
        registers_claimed: chunks
            .saturating_mul(u64::from(layout.params.chunk_registers))
            .min(layout.params.registers),
        keys,
        log_slots_in_use: None,
    })
}

fn with_memory(
    mut report: BenchReport,
    start: MemoryUse,
    end: MemoryUse,
) -> Result<BenchReport, BenchError> {
    report.memory_start = Some(start);
    // The log slots the run's clients held when they stopped: each client counts its
    // own writer's log (live values and slots waiting out the grace).
    report.memory_end = Some(MemoryUse {
        log_slots_in_use: report.log_slots_in_use_at_end,
        ..end
    });
    Ok(report)
}

/// Runs `config` with `--system fusee` on a fresh FUSEE store of `nodes` shared-memory
/// nodes in a scratch directory, sized for the run (FUSEE formats its nodes its own
/// way, so it cannot share a SWARM-KV cluster; the fabric and its emulated latency
/// are the same).
pub fn run_fusee(nodes: u16, config: &BenchConfig) -> Result<BenchReport, BenchError> {
    config.validate()?;
    check_fail_node(config, usize::from(nodes))?;
    let store = super::fusee::TempFusee::new(config, nodes)?;
    if config.fail.is_some() && config.fail_mode != FailMode::Stop {
        return Err(BenchError::InvalidConfig(
            "--fail-mode lose-memory and repair need a SWARM-KV store: not with --system fusee"
                .into(),
        ));
    }
    let clients = store.connect(config)?;
    run_clients(clients, config, None, None)
}

/// Checks that `store` can run `config` ([`check_capacity`]). Registers that earlier
/// clients claimed are counted as reclaimable only when the unclaimed ones are too
/// few: that takes a census, which reads the key headers of every claimed chunk.
fn check_store_capacity<S: Store>(store: &S, config: &BenchConfig) -> Result<(), BenchError> {
    let layout = store.layout();
    let chunks = claimed_chunks(store)?;
    let needed = registers_needed(config, layout.params.chunk_registers);
    let reclaimable = if unclaimed_registers(layout, chunks) < needed {
        admin::census(&store.fabric()?, layout)?.reclaimable()
    } else {
        0
    };
    check_capacity(layout, chunks, reclaimable, config)
}

/// Register chunks earlier clients of `store` claimed (not free for this run).
fn claimed_chunks<S: Store>(store: &S) -> Result<u64, BenchError> {
    Ok(admin::claimed_chunks(&store.fabric()?, store.layout())?)
}

fn check_fail_node(config: &BenchConfig, nodes: usize) -> Result<(), BenchError> {
    if let Some(fail) = config.fail
        && usize::from(fail.node) >= nodes
    {
        return Err(BenchError::InvalidConfig(format!(
            "--fail-node {} does not exist: the cluster has nodes 0 to {}",
            fail.node,
            nodes.saturating_sub(1)
        )));
    }
    Ok(())
}

/// `--fail-mode lose-memory|repair`: replaces node `node`'s file (every client sees
/// the old memory crashed at once; the empty one stays out) and, for `repair`,
/// rebuilds it in a background thread (see the module docs). Once per run.
fn lose_memory(shared: &Shared<'_>, dir: &std::path::Path, node: u16, mode: FailMode) {
    if shared.fail_triggered.swap(true, Ordering::Relaxed) {
        return;
    }
    // The crash itself, at once and cheap (one word of the old file's header)...
    if let Err(error) = swarm_shm::ShmCluster::retire_node(dir, node) {
        tracing::warn!(%error, node, "bench: could not retire the node file");
        return;
    }
    // ...then, off the clients' threads, the restart with empty memory (a new file)
    // and, for `repair`, the rebuild.
    let (dir, origin) = (dir.to_path_buf(), shared.origin);
    let since = move || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let spawned = thread::Builder::new()
        .name("swarm-bench-repair".into())
        .spawn(move || {
            if let Err(error) = swarm_kv::ShmStore::replace_node_file(&dir, node) {
                tracing::warn!(%error, node, "bench: could not re-create the node file");
                return None;
            }
            if mode != FailMode::Repair {
                return None;
            }
            let started_ns = since();
            let options = admin::RepairOptions::default();
            let result = swarm_kv::ShmStore::repair(&dir, node, options, |_, _| {});
            let done = since();
            Some(match result {
                Ok(report) => RepairMarks {
                    started_ns,
                    copy_from_ns: Some(started_ns + report.quiesce_ms * 1_000_000),
                    done_ns: Some(done),
                    bytes: report.bytes,
                    error: None,
                },
                Err(error) => RepairMarks {
                    started_ns,
                    copy_from_ns: None,
                    done_ns: None,
                    bytes: 0,
                    error: Some(error.to_string()),
                },
            })
        });
    match spawned {
        Ok(handle) => {
            if let Ok(mut slot) = shared.repair.lock() {
                *slot = Some(handle);
            }
        }
        Err(error) => tracing::warn!(%error, "bench: could not start the repair thread"),
    }
}

/// Runs the phases with `clients`, one thread each; a thread whose client lost its
/// lease connects a new one with `reconnect`, once ([`Reconnect`]).
fn run_clients<C: BenchClient + Send>(
    clients: Vec<C>,
    config: &BenchConfig,
    fail_dir: Option<PathBuf>,
    reconnect: Option<Connector<'_, C>>,
) -> Result<BenchReport, BenchError> {
    // Churn names `CHURN_SPACE` windows of keys (see `Workload::Churn`).
    let setup = KeySpace::with_offset(config.key_numbers(), config.key_size, config.key_offset)
        .and_then(|keys| Ok((keys, OpChooser::new(config.workload, config.keys)?)));
    let (keys, chooser) = match setup {
        Ok(setup) => setup,
        Err(e) => {
            // Give the writer ids back.
            clients.into_iter().for_each(BenchClient::close);
            return Err(e);
        }
    };
    let parts = match &config.history {
        None => None,
        Some(dest) => {
            let mut parts = Vec::with_capacity(config.clients);
            for index in 0..config.clients {
                match HistoryPart::create(dest, index) {
                    Ok(part) => parts.push(part),
                    Err(e) => {
                        history::discard(parts);
                        clients.into_iter().for_each(BenchClient::close);
                        return Err(e);
                    }
                }
            }
            Some(parts)
        }
    };
    let shared = Shared {
        config,
        keys: &keys,
        chooser: &chooser,
        gate: Gate::new(config.clients + 1),
        origin: Instant::now(),
        measured_claimed: AtomicU64::new(0),
        warmup_claimed: AtomicU64::new(0),
        fail_triggered: AtomicBool::new(false),
        fail_at_ns: AtomicU64::new(u64::MAX),
        fail_dir,
        repair: Mutex::new(None),
        progress: progress_bar(config),
    };
    let (outputs, times) = run_threads(&shared, clients, parts, reconnect);
    shared.progress.finish_and_clear();
    // A repair still running finishes before the report (its marks need it).
    let repair = shared
        .repair
        .lock()
        .map(|mut r| r.take())
        .unwrap_or_default()
        .and_then(|thread| thread.join().ok())
        .flatten();

    let mut stats = RunStats::default();
    let mut timeline = Timeline::new(config.timeline_interval_ns);
    let mut history_parts = Vec::new();
    let mut failure = None;
    for (client, output) in outputs.into_iter().enumerate() {
        match output {
            Ok(output) => {
                stats.load.merge(&output.load.finish());
                stats.warmup.merge(&output.warmup.finish());
                stats.measured.merge(&output.measured.finish());
                stats.drain.merge(&output.drain.finish());
                stats.lease_renewals += output.lease_renewals;
                stats.recycled_slots += output.recycling.slots;
                stats.recycled_registers += output.recycling.registers;
                stats.reclaimed_registers += output.recycling.reclaimed_registers;
                stats.donated_registers += output.recycling.donated_registers;
                stats.deferred_unmaps += output.recycling.deferred_unmaps;
                stats.deferred_unmap_roundtrips += output.recycling.deferred_unmap_roundtrips;
                if let Some(in_use) = output.recycling.log_slots_in_use {
                    *stats.log_slots_in_use.get_or_insert(0) += in_use;
                }
                timeline.merge(&output.timeline);
                match output.history {
                    Some(Ok(path)) => history_parts.push(path),
                    Some(Err(e)) => failure = failure.or(Some(e)),
                    None => {}
                }
            }
            Err(e) => {
                failure = failure.or(Some(match e {
                    ThreadFailure::Spawn(message) => BenchError::ClientStart { client, message },
                    ThreadFailure::Panic(message) => BenchError::ClientPanicked { client, message },
                }));
            }
        }
    }
    if let Some(e) = failure {
        for part in history_parts {
            let _ = std::fs::remove_file(part);
        }
        return Err(e);
    }
    if let Some(dest) = &config.history {
        history::merge(&history_parts, dest)?;
    }
    let seconds = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    stats.load_seconds = seconds(times[0], times[1]);
    stats.warmup_seconds = seconds(times[1], times[2]);
    stats.measured_seconds = seconds(times[2], times[3]);
    stats.drain_seconds = seconds(times[3], times[4]);
    stats.fail_triggered = shared.fail_triggered.load(Ordering::Relaxed);
    let since_origin = |t: Instant| {
        u64::try_from(t.saturating_duration_since(shared.origin).as_nanos()).unwrap_or(u64::MAX)
    };
    let measured_start = since_origin(times[2]);
    stats.timeline = timeline.points(measured_start, since_origin(times[3]));
    stats.fail_at_ns = match shared.fail_at_ns.load(Ordering::Relaxed) {
        u64::MAX => None,
        at => Some(at.saturating_sub(measured_start)),
    };
    stats.repair = repair.map(|r| RepairMarks {
        started_ns: r.started_ns.saturating_sub(measured_start),
        copy_from_ns: r.copy_from_ns.map(|t| t.saturating_sub(measured_start)),
        done_ns: r.done_ns.map(|t| t.saturating_sub(measured_start)),
        ..r
    });
    Ok(BenchReport::new(config, &stats))
}

/// One client per thread of the run, each registered as its own writer with the
/// run's protocol, on its own fabric handle from `fabric`, which wraps the store's
/// in the fault injector that `--fail-node` uses. Each client fences itself on the
/// memory nodes when it registers (`swarm_core::Fabric::fence_owner`), through the
/// injector.
fn connect<S: Store, T: Fabric>(
    store: &S,
    config: &BenchConfig,
    fabric: impl Fn() -> Result<FailNodes<T>, KvError>,
) -> Result<Vec<KvClient<FailNodes<T>, SystemClock>>, BenchError> {
    let mut clients = Vec::with_capacity(config.clients);
    for index in 0..config.clients {
        match connect_one(store, config, index, &fabric) {
            Ok(client) => clients.push(client),
            Err(e) => {
                // Give the writer ids taken so far back.
                clients.into_iter().for_each(KvClient::close);
                return Err(e);
            }
        }
    }
    Ok(clients)
}

/// One client of the run ([`connect`]), for client thread `index`: also the new
/// client of a thread whose lease was lost ([`Reconnect`]).
fn connect_one<S: Store, T: Fabric>(
    store: &S,
    config: &BenchConfig,
    index: usize,
    fabric: impl FnOnce() -> Result<FailNodes<T>, KvError>,
) -> Result<KvClient<FailNodes<T>, SystemClock>, BenchError> {
    let mut kv_config = store.config();
    kv_config.deferred_unmaps = config.deferred_unmaps;
    kv_config.register_protocol = register_protocol(config.system).ok_or_else(|| {
        BenchError::InvalidConfig("FUSEE runs on a store of its own: use run_fusee".into())
    })?;
    let header = *store.header();
    fabric()
        .and_then(|fabric| {
            let clock = SystemClock::new(header.epoch_unix_ns, header.tick_ns);
            KvClient::connect(fabric, clock, *store.layout(), kv_config)
        })
        .map_err(|e| BenchError::ClientStart {
            client: index,
            message: e.to_string(),
        })
}

/// Connects a new client for a client thread.
type Connector<'r, C> = &'r (dyn Fn() -> Result<C, BenchError> + Sync);

/// A client thread's one reconnection: a client whose lease was lost for good (killed
/// by a reclaimer: it did not renew for a watch, say while its process connected its
/// other clients, or waited for them) fails every later operation with
/// `LeaseExpired`. The thread connects a new client once, and logs it; a second loss
/// (or a failed reconnection) is not retried: its operations fail, counted, as
/// before.
struct Reconnect<'r, C> {
    connect: Option<Connector<'r, C>>,
    used: bool,
    /// The writer id of the client lost (for the operations failed without one).
    lost_writer: u16,
}

impl<C: BenchClient> Reconnect<'_, C> {
    /// Whether this thread may still reconnect.
    fn available(&self) -> bool {
        self.connect.is_some() && !self.used
    }

    /// Closes `lost` (which gives its writer id back: with every id claimed, the new
    /// client needs it) and connects a new client for thread `index` in its place;
    /// `None` if that fails.
    fn once(&mut self, index: usize, lost: Option<C>) -> Option<C> {
        let connect = self.connect.filter(|_| !self.used)?;
        self.used = true;
        let writer = lost.as_ref().and_then(BenchClient::writer);
        self.lost_writer = writer.unwrap_or_default();
        tracing::warn!(
            client = index,
            ?writer,
            "bench: the client's lease was lost (killed by a reclaimer): closing it and \
             connecting a new client in its place, once"
        );
        if let Some(lost) = lost {
            lost.close();
        }
        match connect() {
            Ok(client) => {
                tracing::warn!(
                    client = index,
                    writer = ?client.writer(),
                    "bench: reconnected: the thread goes on with a new client"
                );
                Some(client)
            }
            Err(error) => {
                tracing::warn!(
                    client = index,
                    %error,
                    "bench: could not reconnect: this thread's operations fail"
                );
                None
            }
        }
    }

    /// Fails every operation `next` still plans (a thread left without a client: its
    /// lease lost, and no new one connected), as the lost client would have.
    fn fail_all(
        &self,
        shared: &Shared<'_>,
        index: usize,
        next: &mut dyn FnMut() -> Option<Planned>,
        finish: &mut dyn FnMut(&Done),
    ) {
        while let Some(planned) = next() {
            let now = shared.now_ns();
            let written = written(shared, index, planned.op, planned.seq);
            finish(&Done {
                slot: 0,
                op: planned.op,
                keynum: planned.keynum,
                written,
                result: Err(OpError::Kv(KvError::LeaseExpired {
                    writer: self.lost_writer,
                })),
                start: now,
                end: now,
                roundtrips: 0,
            });
        }
    }
}

/// A progress bar over every operation of the run, on stderr when it is a terminal.
fn progress_bar(config: &BenchConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let warm = if config.warm_cache {
        config.keys.saturating_mul(config.clients as u64)
    } else {
        0
    };
    let total = config
        .keys
        .saturating_add(warm)
        .saturating_add(config.warmup_ops)
        .saturating_add(config.ops);
    // A --duration run without --ops has no known length.
    let total = (config.ops != u64::MAX).then_some(total);
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>9} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ops ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_message("starting");
    bar
}

/// State every client thread reads.
struct Shared<'a> {
    config: &'a BenchConfig,
    keys: &'a KeySpace,
    chooser: &'a OpChooser,
    gate: Gate,
    /// Zero of every timestamp (latencies and history).
    origin: Instant,
    measured_claimed: AtomicU64,
    warmup_claimed: AtomicU64,
    fail_triggered: AtomicBool,
    /// When the planned node crash happened, ns since `origin` (`u64::MAX`: not yet).
    fail_at_ns: AtomicU64,
    /// The shared-memory cluster's directory, for `--fail-mode lose-memory|repair`.
    fail_dir: Option<PathBuf>,
    /// The background repair of `--fail-mode repair`, once started.
    repair: Mutex<Option<thread::JoinHandle<Option<RepairMarks>>>>,
    progress: ProgressBar,
}

impl Shared<'_> {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Why a client thread produced no measurements.
enum ThreadFailure {
    Spawn(String),
    Panic(String),
}

/// Runs one thread per client and times the phases from the coordinating thread:
/// `times` are the instants every client was ready, finished loading, finished the
/// warm-up, finished the measured phase, and finished the drain.
fn run_threads<C: BenchClient + Send>(
    shared: &Shared<'_>,
    clients: Vec<C>,
    parts: Option<Vec<HistoryPart>>,
    reconnect: Option<Connector<'_, C>>,
) -> (Vec<Result<WorkerOutput, ThreadFailure>>, [Instant; 5]) {
    let mut parts: Vec<Option<HistoryPart>> = match parts {
        Some(parts) => parts.into_iter().map(Some).collect(),
        None => clients.iter().map(|_| None).collect(),
    };
    let mut times = [Instant::now(); 5];
    let outputs = thread::scope(|scope| {
        let mut handles = Vec::with_capacity(clients.len());
        for (index, (client, part)) in clients.into_iter().zip(parts.iter_mut()).enumerate() {
            let part = part.take();
            let spawned = thread::Builder::new()
                .name(format!("ycsb-client-{index}"))
                .spawn_scoped(scope, move || {
                    let reconnect = Reconnect {
                        connect: reconnect,
                        used: false,
                        lost_writer: 0,
                    };
                    worker(shared, index, client, part, reconnect)
                });
            match spawned {
                Ok(handle) => handles.push(Ok(handle)),
                Err(e) => {
                    // The others would wait for this one at every phase: release them.
                    shared.gate.abort();
                    handles.push(Err(e.to_string()));
                }
            }
        }
        for (time, message) in times
            .iter_mut()
            .zip(["load", "warm-up", "measure", "drain", "done"])
        {
            let Some(opened) = shared.gate.wait_timed() else {
                break;
            };
            *time = opened;
            shared.progress.set_message(message);
        }
        handles
            .into_iter()
            .map(|handle| match handle {
                Err(message) => Err(ThreadFailure::Spawn(message)),
                Ok(handle) => handle.join().map_err(|panic| {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic payload".into());
                    ThreadFailure::Panic(message)
                }),
            })
            .collect()
    });
    (outputs, times)
}

/// Releases the other threads if this one unwinds, so that nobody waits for it.
struct AbortOnPanic<'a>(&'a Gate);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.abort();
        }
    }
}

/// A client thread's measurements.
struct WorkerOutput {
    load: PhaseRecorder,
    warmup: PhaseRecorder,
    measured: PhaseRecorder,
    /// The drain's deletes (`--drain`).
    drain: PhaseRecorder,
    /// The measured operations per interval.
    timeline: Timeline,
    /// The finished history part, if one is written.
    history: Option<Result<std::path::PathBuf, BenchError>>,
    /// Lease renewals the client's writer id got.
    lease_renewals: u64,
    /// What the client recycled, and the log slots it held when it stopped.
    recycling: Recycling,
}

/// What a client thread records as operations finish.
struct Sink<'a> {
    shared: &'a Shared<'a>,
    /// Client thread index.
    index: usize,
    history: Option<HistoryPart>,
    /// Operations finished but not yet reported to the progress bar.
    unreported: u64,
}

impl Sink<'_> {
    fn finish(&mut self, stats: &mut PhaseRecorder, done: &Done) {
        let latency = done.end.saturating_sub(done.start);
        match &done.result {
            Ok(outcome) => stats.record(done.op, latency, done.roundtrips, outcome.hit()),
            Err(e) => stats.record_error(done.op, e),
        }
        let sampled = || {
            self.shared
                .config
                .history_keys
                .is_none_or(|keys| done.keynum < keys)
        };
        if self.history.is_some() && sampled() {
            let op = self.operation(done);
            if let Some(history) = &mut self.history {
                history.record(&op);
            }
        }
        self.unreported += 1;
        if self.unreported >= PROGRESS_BATCH {
            self.flush_progress();
        }
    }

    fn flush_progress(&mut self) {
        self.shared.progress.inc(self.unreported);
        self.unreported = 0;
    }

    /// The history record of `done`; each in-flight slot of a client thread is its
    /// own history client (one operation at a time).
    fn operation(&self, done: &Done) -> Operation {
        let client = (self.index * self.shared.config.inflight + done.slot) as u64;
        let key = self.shared.keys.key(done.keynum);
        let written = done
            .written
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let kind = match done.op {
            OpType::Get => OpKind::Get,
            OpType::Update => OpKind::Update,
            OpType::Insert => OpKind::Insert,
            OpType::Delete => OpKind::Delete,
        };
        match &done.result {
            Ok(Outcome::Got(value)) => {
                let read = value.as_deref().map(String::from_utf8_lossy);
                Operation::completed(
                    client,
                    kind,
                    key,
                    read.as_deref(),
                    true,
                    done.start,
                    done.end,
                )
            }
            Ok(Outcome::Updated(ok)) => Operation::completed(
                client,
                kind,
                key,
                written.as_deref(),
                *ok,
                done.start,
                done.end,
            ),
            Ok(Outcome::Deleted(outcome)) => match outcome.removed() {
                Some(ok) => Operation::completed(client, kind, key, None, ok, done.start, done.end),
                // Raced another delete: took effect, removed the value or not.
                None => Operation::completed_unknown(client, kind, key, None, done.start, done.end),
            },
            Ok(Outcome::Inserted) => Operation::completed(
                client,
                kind,
                key,
                written.as_deref(),
                true,
                done.start,
                done.end,
            ),
            Err(_) => Operation::crashed(client, kind, key, written.as_deref(), done.start),
        }
    }
}

/// The body of client thread `index`: the three phases, between gates.
fn worker<C: BenchClient>(
    shared: &Shared<'_>,
    index: usize,
    client: C,
    history: Option<HistoryPart>,
    mut reconnect: Reconnect<'_, C>,
) -> WorkerOutput {
    let _release = AbortOnPanic(&shared.gate);
    // Replaced, between two drives, if its lease is lost (`Reconnect`).
    let client = RefCell::new(Some(client));
    let config = shared.config;
    let mut out = WorkerOutput {
        load: PhaseRecorder::new(),
        warmup: PhaseRecorder::new(),
        measured: PhaseRecorder::new(),
        drain: PhaseRecorder::new(),
        timeline: Timeline::new(config.timeline_interval_ns),
        history: None,
        lease_renewals: 0,
        recycling: Recycling::default(),
    };
    let mut sink = Sink {
        shared,
        index,
        history,
        unreported: 0,
    };
    let mut seq = 0u64;
    let mut next_seq = || {
        seq += 1;
        seq - 1
    };
    let thread_seed = config
        .seed
        .wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(thread_seed);
    let n = config.keys;
    let clients = config.clients as u64;
    let share = |i: u64| (u128::from(n) * u128::from(i) / u128::from(clients)) as u64;

    'phases: {
        if !shared
            .gate
            .wait_ticking(KEEP_ALIVE_EVERY, || keep_alive(&client))
        {
            break 'phases;
        }
        // 1. Load: this client's range of keys (churn loads nothing).
        let mut next_key = if config.workload.loads_keys() {
            share(index as u64)..share(index as u64 + 1)
        } else {
            0..0
        };
        drive_phase(
            &client,
            &mut reconnect,
            shared,
            index,
            &mut || {
                let keynum = next_key.next()?;
                Some(Planned {
                    op: OpType::Insert,
                    keynum,
                    seq: next_seq(),
                })
            },
            &mut |done| sink.finish(&mut out.load, done),
        );
        sink.flush_progress();
        if !shared
            .gate
            .wait_ticking(KEEP_ALIVE_EVERY, || keep_alive(&client))
        {
            break 'phases;
        }
        // 2. Warm-up: every key once from this client's first key, then workload ops.
        let mut warm = if config.warm_cache && config.workload.loads_keys() {
            0..n
        } else {
            0..0
        };
        let offset = share(index as u64);
        drive_phase(
            &client,
            &mut reconnect,
            shared,
            index,
            &mut || {
                if let Some(i) = warm.next() {
                    return Some(Planned {
                        op: OpType::Get,
                        keynum: (offset + i) % n,
                        seq: next_seq(),
                    });
                }
                if shared.warmup_claimed.fetch_add(1, Ordering::Relaxed) >= config.warmup_ops {
                    return None;
                }
                let (op, keynum) = shared.chooser.next(&mut rng);
                Some(Planned {
                    op,
                    keynum,
                    seq: next_seq(),
                })
            },
            &mut |done| sink.finish(&mut out.warmup, done),
        );
        sink.flush_progress();
        if !shared
            .gate
            .wait_ticking(KEEP_ALIVE_EVERY, || keep_alive(&client))
        {
            break 'phases;
        }
        // 3. Measured: claim operations until `ops` were issued by all clients, or
        // the run's duration has passed.
        let mut failed = false;
        let deadline = config
            .duration_ns
            .map(|d| shared.now_ns().saturating_add(d));
        drive_phase(
            &client,
            &mut reconnect,
            shared,
            index,
            &mut || {
                if deadline.is_some_and(|d| shared.now_ns() >= d) {
                    return None;
                }
                let number = shared.measured_claimed.fetch_add(1, Ordering::Relaxed);
                if number >= config.ops {
                    return None;
                }
                if let Some(fail) = config.fail
                    && (failed || number >= fail.after_ops)
                {
                    let node = NodeId(fail.node);
                    match (config.fail_mode, &shared.fail_dir) {
                        // Each client stops the node on its own fabric; one connected
                        // since the failure (`Reconnect`) has a fabric of its own, on
                        // which the node is still up.
                        (FailMode::Stop, _) | (_, None) => {
                            if let Some(client) = client.borrow().as_ref()
                                && !client.fabric().is_failed(node)
                            {
                                client.fabric().fail_node(node);
                            }
                        }
                        (mode, Some(dir)) => {
                            if !failed {
                                lose_memory(shared, dir, fail.node, mode);
                            }
                        }
                    }
                    if !failed {
                        shared.fail_triggered.store(true, Ordering::Relaxed);
                        shared
                            .fail_at_ns
                            .fetch_min(shared.now_ns(), Ordering::Relaxed);
                        failed = true;
                    }
                }
                let (op, keynum) = shared.chooser.next(&mut rng);
                Some(Planned {
                    op,
                    keynum,
                    seq: next_seq(),
                })
            },
            &mut |done| {
                if done.result.is_ok() {
                    out.timeline
                        .record(done.end, done.end.saturating_sub(done.start));
                } else {
                    out.timeline.record_error(done.end);
                }
                sink.finish(&mut out.measured, done)
            },
        );
        sink.flush_progress();
        if !shared
            .gate
            .wait_ticking(KEEP_ALIVE_EVERY, || keep_alive(&client))
        {
            break 'phases;
        }
        // 4. Drain (`--drain`): delete this client's share of every key the run
        // names, churn's whole key space included (deleting an absent key is
        // harmless), so that the run leaves none behind.
        let names = config.key_numbers();
        let mut next_key = if config.drain {
            let share = |i: u64| (u128::from(names) * u128::from(i) / u128::from(clients)) as u64;
            share(index as u64)..share(index as u64 + 1)
        } else {
            0..0
        };
        drive_phase(
            &client,
            &mut reconnect,
            shared,
            index,
            &mut || {
                let keynum = next_key.next()?;
                Some(Planned {
                    op: OpType::Delete,
                    keynum,
                    seq: next_seq(),
                })
            },
            &mut |done| sink.finish(&mut out.drain, done),
        );
        sink.flush_progress();
        shared
            .gate
            .wait_ticking(KEEP_ALIVE_EVERY, || keep_alive(&client));
    }
    // None: its lease was lost and no new client could connect (`Reconnect`).
    if let Some(client) = client.into_inner() {
        out.lease_renewals = client.lease_renewals();
        out.recycling = client.recycling();
        client.close();
    }
    out.history = sink.history.take().map(HistoryPart::finish);
    out
}

/// An operation to issue.
struct Planned {
    op: OpType,
    keynum: u64,
    /// The client's operation number: an update or insert writes the value tagged
    /// with it (see [`value`]).
    seq: u64,
}

/// What an operation returned.
enum Outcome {
    /// A get: `None` if the key was absent; else its value when a history is
    /// recorded, an empty one otherwise.
    Got(Option<Vec<u8>>),
    /// An update: whether the key was present.
    Updated(bool),
    /// An insert.
    Inserted,
    /// A delete: whether it removed the value (or raced another delete).
    Deleted(DeleteOutcome),
}

impl Outcome {
    /// Whether the operation found its key.
    fn hit(&self) -> bool {
        match self {
            Self::Got(value) => value.is_some(),
            Self::Updated(present) => *present,
            Self::Deleted(outcome) => *outcome != DeleteOutcome::Absent,
            Self::Inserted => true,
        }
    }
}

/// A finished operation.
struct Done {
    /// The in-flight slot it ran in.
    slot: usize,
    op: OpType,
    keynum: u64,
    written: Option<Vec<u8>>,
    result: Result<Outcome, OpError>,
    /// ns since the run's origin.
    start: u64,
    end: u64,
    roundtrips: u32,
}

/// The index unmaps of deletes that returned at their tombstone, run as a task of its
/// own next to a client's operations.
type DeferredWork<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// [`drive`] on the thread's client until `next` runs dry; if the client's lease is
/// lost meanwhile, connects a new client in its place ([`Reconnect::once`]) and goes
/// on with it (the lost one is closed). Without a reconnection the phase goes on
/// with the lost client, whose operations fail, counted.
fn drive_phase<C: BenchClient>(
    client: &RefCell<Option<C>>,
    reconnect: &mut Reconnect<'_, C>,
    shared: &Shared<'_>,
    index: usize,
    next: &mut dyn FnMut() -> Option<Planned>,
    finish: &mut dyn FnMut(&Done),
) {
    let mut stop_on_loss = true;
    loop {
        let lost = match client.borrow().as_ref() {
            Some(client) => drive(client, shared, index, stop_on_loss, next, finish),
            None => {
                reconnect.fail_all(shared, index, next, finish);
                return;
            }
        };
        if !lost {
            return;
        }
        if !reconnect.available() {
            stop_on_loss = false;
            continue;
        }
        let lost = client.borrow_mut().take();
        let fresh = reconnect.once(index, lost);
        *client.borrow_mut() = fresh;
    }
}

/// [`BenchClient::keep_alive`] on the thread's client, if it has one.
fn keep_alive<C: BenchClient>(client: &RefCell<Option<C>>) {
    if let Some(client) = client.borrow().as_ref() {
        client.keep_alive();
    }
}

/// The clock an operation is timed by, in ns since the run's origin: the client's
/// fabric clock shifted onto the origin ([`Shared::now_ns`]) when no history is
/// written, [`Shared::now_ns`] itself when one is. On shared memory the fabric's
/// clock is one `clock_gettime` (about 40 instructions a reading under callgrind,
/// against about 150 for an `Instant` and its conversion); an operation's latency,
/// its two readings on one thread's clock, is the same either way. Only a history's
/// timestamps need the one clock of every client thread (real-time order across
/// threads); the timeline's 10 ms intervals take the shift's error (the time between
/// its two readings) without a difference.
#[derive(Clone, Copy, Debug)]
struct OpClock {
    on_fabric: bool,
    /// Run origin minus the fabric's clock, wrapping.
    shift: u64,
}

impl OpClock {
    fn new<F: Fabric + ?Sized>(shared: &Shared<'_>, fabric: &F) -> Self {
        Self {
            on_fabric: shared.config.history.is_none(),
            shift: shared.now_ns().wrapping_sub(fabric.now()),
        }
    }

    #[inline]
    fn now<F: Fabric + ?Sized>(self, shared: &Shared<'_>, fabric: &F) -> u64 {
        if self.on_fabric {
            fabric.now().wrapping_add(self.shift)
        } else {
            shared.now_ns()
        }
    }
}

/// Issues `op` on `key` number `keynum` (a get reads into `read`, an update or an
/// insert writes `written`); returns its result and the roundtrips it took.
async fn issue<C: BenchClient>(
    client: &C,
    shared: &Shared<'_>,
    op: OpType,
    keynum: u64,
    written: Option<&[u8]>,
    read: &mut Vec<u8>,
) -> (Result<Outcome, OpError>, u32) {
    // With others in flight on this thread, the operation yields after each hint of
    // its memory, so that their cache misses overlap (`OpStats::interleaved`).
    let stats = if shared.config.inflight > 1 {
        OpStats::interleaved()
    } else {
        OpStats::new()
    };
    let key = shared.keys.key(keynum).as_bytes();
    let result = match op {
        OpType::Get => client.get_into(key, read, &stats).await.map(|present| {
            // The history needs the value; the statistics only whether it was there.
            Outcome::Got(present.then(|| match shared.config.history {
                Some(_) => read.clone(),
                None => Vec::new(),
            }))
        }),
        OpType::Update => client
            .update(key, written.unwrap_or_default(), &stats)
            .await
            .map(Outcome::Updated),
        OpType::Insert => client
            .insert(key, written.unwrap_or_default(), &stats)
            .await
            .map(|()| Outcome::Inserted),
        OpType::Delete => client.delete(key, &stats).await.map(Outcome::Deleted),
    };
    (result, stats.roundtrips())
}

/// The operation in flight in a slot, as issued.
#[derive(Clone, Copy)]
struct InFlight {
    op: OpType,
    keynum: u64,
    seq: u64,
    issued_at: u64,
}

/// What the slot workers of one [`drive`] share: where their operations come from and
/// where they go, borrowed by one worker at a time between two awaits (the workers
/// run on one thread, polled one after the other, so a borrow never meets another).
struct Lanes<'n> {
    next: RefCell<&'n mut dyn FnMut() -> Option<Planned>>,
    finish: RefCell<&'n mut dyn FnMut(&Done)>,
    /// Each slot's operation in flight, as issued (failed if the executor stalls).
    in_flight: Vec<Cell<Option<InFlight>>>,
    /// Operations finished so far (a round that finishes none may be a stall).
    finished: Cell<usize>,
    /// An operation failed and the client's lease is lost for good: issue nothing more.
    lost: Cell<bool>,
    stop_on_loss: bool,
}

impl Lanes<'_> {
    /// The next operation, issued now in `slot` (its latency runs from here).
    fn plan(&self, slot: usize, now: impl FnOnce() -> u64) -> Option<InFlight> {
        if self.lost.get() {
            return None;
        }
        let planned = (*self.next.borrow_mut())()?;
        let issued = InFlight {
            op: planned.op,
            keynum: planned.keynum,
            seq: planned.seq,
            issued_at: now(),
        };
        self.in_flight[slot].set(Some(issued));
        Some(issued)
    }
}

/// The value an update or insert of thread `index` numbered `seq` writes.
fn written(shared: &Shared<'_>, index: usize, op: OpType, seq: u64) -> Option<Vec<u8>> {
    match op {
        OpType::Get | OpType::Delete => None,
        // `validate` checked that every tag fits in `value_size`.
        OpType::Update | OpType::Insert => value(index as u32, seq, shared.config.value_size),
    }
}

/// Pending once, then ready: lets the executor's round go on to the other slots.
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|_| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            Poll::Pending
        }
    })
    .await;
}

/// The operations of one in-flight slot, one after the other, for the whole
/// [`drive`]: it takes each operation from `lanes.next`, issues it ([`issue`]), times
/// it and hands it to `lanes.finish`, with no operation, result or finished record
/// moved between futures. An operation's future (kilobytes: the largest of the
/// client's get, update, insert and delete) is built in place in the worker's state,
/// where a future per operation moved into its slot cost two copies of it per
/// operation (about 600 instructions, as many as a register read's roundtrip).
///
/// An operation is issued (its latency starts) as soon as the one before it in the
/// slot finished, and first polled in the executor's next round, after the other
/// slots' turns: with several in flight, that wait counts, as it would for an
/// application.
async fn slot_worker<C: BenchClient>(
    client: &C,
    shared: &Shared<'_>,
    clock: OpClock,
    index: usize,
    slot: usize,
    lanes: &Lanes<'_>,
) {
    let fabric = client.fabric();
    let now = || clock.now(shared, fabric);
    // Every get of the slot reads into this buffer.
    let mut read = Vec::new();
    let Some(mut issued) = lanes.plan(slot, now) else {
        return;
    };
    loop {
        let written = written(shared, index, issued.op, issued.seq);
        let (result, roundtrips) = issue(
            client,
            shared,
            issued.op,
            issued.keynum,
            written.as_deref(),
            &mut read,
        )
        .await;
        let end = now();
        lanes.in_flight[slot].set(None);
        if lanes.stop_on_loss && result.is_err() && client.lease_lost() {
            lanes.lost.set(true);
        }
        (*lanes.finish.borrow_mut())(&Done {
            slot,
            op: issued.op,
            keynum: issued.keynum,
            written,
            result,
            start: issued.issued_at,
            end,
            roundtrips,
        });
        lanes.finished.set(lanes.finished.get() + 1);
        let Some(next) = lanes.plan(slot, now) else {
            return;
        };
        issued = next;
        yield_once().await;
    }
}

/// Keeps `inflight` operations from `next` going on `client` until `next` runs dry,
/// handing each to `finish` as it completes. Each slot's operations run in its
/// [`slot_worker`], polled by a [`SlotExecutor`] (no allocation per operation). Next
/// to them, whenever the client has deferred work (the index unmaps of deletes that
/// returned at their tombstone), one task runs it: off the operations' critical
/// path, but on the client's thread, as an application would run it.
///
/// With `stop_on_loss`, once an operation fails and the client's lease is lost for
/// good ([`BenchClient::lease_lost`]), issues nothing more, lets the operations in
/// flight end, and returns `true` (the caller connects a new client).
fn drive<'a, C: BenchClient>(
    client: &'a C,
    shared: &'a Shared<'a>,
    index: usize,
    stop_on_loss: bool,
    next: &mut dyn FnMut() -> Option<Planned>,
    finish: &mut dyn FnMut(&Done),
) -> bool {
    let inflight = shared.config.inflight;
    let fabric = client.fabric();
    let clock = OpClock::new(shared, fabric);
    let lanes = Lanes {
        next: RefCell::new(next),
        finish: RefCell::new(finish),
        in_flight: (0..inflight).map(|_| Cell::new(None)).collect(),
        finished: Cell::new(0),
        lost: Cell::new(false),
        stop_on_loss,
    };
    let mut workers = SlotExecutor::new(inflight);
    let start_workers = |workers: &mut SlotExecutor<_>| {
        for slot in 0..inflight {
            workers.start(
                slot,
                slot_worker(client, shared, clock, index, slot, &lanes),
            );
        }
    };
    start_workers(&mut workers);
    let mut deferred: Option<DeferredWork<'a>> = None;
    while workers.live() > 0 || deferred.is_some() {
        // One round polls every worker and the deferred work once.
        let stepped = step_rounds(fabric, || {
            // Operations finished, and workers that ran out of operations.
            let before = lanes.finished.get();
            let mut count = workers.poll_once(|_, ()| {});
            count += lanes.finished.get() - before;
            if deferred.as_mut().is_some_and(|work| {
                work.as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_ready()
            }) {
                deferred = None;
                count += 1;
            }
            count
        });
        if stepped.is_err() {
            // Every operation in flight waits on failed nodes only: give up on them,
            // with the workers that ran them.
            workers.clear();
            deferred = None;
            for slot in 0..inflight {
                if let Some(lost) = lanes.in_flight[slot].take() {
                    (*lanes.finish.borrow_mut())(&Done {
                        slot,
                        op: lost.op,
                        keynum: lost.keynum,
                        written: written(shared, index, lost.op, lost.seq),
                        result: Err(OpError::Kv(KvError::Fabric(FabricError::Stalled))),
                        start: lost.issued_at,
                        end: clock.now(shared, fabric),
                        roundtrips: 0,
                    });
                }
            }
            start_workers(&mut workers);
            continue;
        }
        if deferred.is_none() && !lanes.lost.get() && client.has_deferred_work() {
            deferred = Some(Box::pin(client.run_deferred_work()));
        }
    }
    lanes.lost.get()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::temp::TempStore;
    use super::super::workload::Workload;
    use super::*;

    /// The client's fabric clock shifted onto the run's origin reads the run's clock,
    /// within the time between the two readings that set the shift (a bound from the
    /// readings themselves, not a timing). The run's origin is put 2 s back, so that
    /// a shift left out or of the wrong sign is far outside the bound.
    #[test]
    fn an_op_clock_reads_the_runs_clock() {
        let mut config = BenchConfig::new(System::Swarm, Workload::C);
        config.keys = 10;
        let store = TempStore::new(&config, 3, 3).unwrap();
        let fabric = store.store().fabric();
        let keys = KeySpace::new(10, 24).unwrap();
        let chooser = OpChooser::new(Workload::C, 10).unwrap();
        let shared = |config| Shared {
            config,
            keys: &keys,
            chooser: &chooser,
            gate: Gate::new(1),
            origin: Instant::now()
                .checked_sub(Duration::from_secs(2))
                .unwrap_or_else(Instant::now),
            measured_claimed: AtomicU64::new(0),
            warmup_claimed: AtomicU64::new(0),
            fail_triggered: AtomicBool::new(false),
            fail_at_ns: AtomicU64::new(u64::MAX),
            fail_dir: None,
            repair: Mutex::new(None),
            progress: ProgressBar::hidden(),
        };
        let run = shared(&config);
        let before = run.now_ns();
        let clock = OpClock::new(&run, &fabric);
        let slack = run.now_ns() - before;
        assert!(clock.on_fabric);
        for _ in 0..1000 {
            let a = run.now_ns();
            let x = clock.now(&run, &fabric);
            let b = run.now_ns();
            assert!(
                a <= x + slack && x <= b,
                "read {x} between {a} and {b} (slack {slack})"
            );
        }
        // With a history, the run's own clock.
        let mut with_history = config.clone();
        with_history.history = Some(std::path::PathBuf::from("unused"));
        let run = shared(&with_history);
        let clock = OpClock::new(&run, &fabric);
        assert!(!clock.on_fabric);
        let (a, x, b) = (run.now_ns(), clock.now(&run, &fabric), run.now_ns());
        assert!(a <= x && x <= b);
    }
}
