//! Seeded protocol scenarios on the simulated fabric, checked for linearizability.
//!
//! A scenario runs closed-loop clients, each issuing reads and writes on a few
//! replicated registers through Safe-Guess (or DM-ABD, for comparison), over a
//! [`SimWorld`] with the failures of SWARM §2.2 injected ([`Faults`]): a crashed
//! minority of memory nodes, slow nodes, slow spells and slow client-node links,
//! late messages, nodes that stall between the operations of a batch, clock skew
//! and clock jumps that make timestamp guesses stale, clients that crash
//! mid-operation, and torn reads (the simulation tears every write that overlaps a
//! read). A client may keep several operations in flight on one writer id
//! ([`Scenario::inflight`]), and keys may be deleted and re-inserted
//! ([`Scenario::delete_percent`]), which turns the history into a key-value one.
//! Every operation is recorded in a [`History`] for the linearizability checker
//! (`swarm-checker`), with its roundtrips and, for Safe-Guess reads, its loop
//! iterations (appendix C bounds them by `2·writers + 1`).
//!
//! The protocol tests and the `sim-history` example are thin wrappers around
//! [`run`], so that any failing test can be replayed from the command line with the
//! seed it prints.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::format;
use std::rc::Rc;
use std::string::{String, ToString};
use std::vec::Vec;

use crate::{
    ClientId, Fault, RunReport, SimClock, SimConfig, SimError, SimFabric, SimRng, SimRunner,
    SimWorld,
};
use swarm_checker::{History, OpKind, Operation};
use swarm_core::encoding::{Tsp, WriterId};
use swarm_core::fabric::{Batch, INLINE_BATCH_OPS, NodeId, Op};
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::quorum::{broadcast_until, majority};
use swarm_core::summary::LogSummary;
use swarm_core::{Client, Fabric, OpStats};
use swarm_core::{
    ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, SwarmError, WriteOutcome,
};

/// Which replication protocol the clients run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Safe-Guess over In-n-Out (SWARM).
    SafeGuess,
    /// DM-ABD, the two-roundtrip baseline.
    Abd,
}

/// Which faults to inject.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Crash `f` of the `2f + 1` nodes at random times.
    pub crash_minority: bool,
    /// Slow one node down by 20× for part of the run.
    pub slow_node: bool,
    /// Skew client clocks by up to ±[`Scenario::max_skew_ns`], so guesses go stale.
    pub clock_skew: bool,
    /// Crash up to a quarter of the clients mid-operation.
    pub crash_clients: bool,
    /// Delay about one message in eight by 5 to 40 µs (a per-node tail), so that a
    /// new tuple often sits on a minority while a majority still holds older ones:
    /// the new-old inversions that read write-backs and the same-writer rule of
    /// Safe-Guess must handle (appendix A, Lemma A.3; appendix C).
    pub late_messages: bool,
    /// Nodes take turns being 5 to 40 times slower for 5 to 50 µs: messages sent to
    /// a node in its spell arrive late, so tuples land on different majorities in
    /// different orders, and clients suspect different nodes (§6 fallbacks).
    pub slow_spells: bool,
    /// About a third of the client-node links are 3 to 15 times slower, redrawn
    /// every 40 µs or so: clients disagree about which nodes answer first, so one
    /// client's majority holds a tuple that another's misses (the wrong maximum of
    /// a max-register read concurrent with writes, SWARM §3.2 Figure 2).
    pub slow_links: bool,
    /// Nodes stall for up to 5 µs between two operations of one batch (one gap in
    /// five), so that other clients land between a buffer write and the CAS that
    /// publishes it, or between a pipelined read and its CAS (SWARM §2.1, §4.3).
    pub node_stalls: bool,
    /// Before about one operation in eight, a client's clock jumps to a new skew in
    /// ±[`Scenario::max_skew_ns`], so guesses go stale again after every
    /// re-synchronisation and writes take the slow path often (§3.2, §6).
    pub clock_jumps: bool,
    /// Before about one operation in four, a client starts suspecting a random node
    /// (as a timeout would make it): clients then contact different majorities
    /// (§6), so a tuple or tombstone on one client's majority can be missing from
    /// another's, and racing deletes reach different nodes first. Not in
    /// [`Faults::ALL`], whose scenarios' seeds the mutant record refers to
    /// (`scripts/mutants.sh`): tests ask for it.
    pub suspicions: bool,
    /// A few times during the run, node 1's copy of every out-of-place record (not
    /// the timestamp-lock words) is overwritten, as writes landing later than the
    /// delivery margin would overwrite recycled slots (`swarm_core::slot_recycling`): a
    /// maximum's buffer can be unusable on some of its holders (only node 1 is
    /// hit). Combine it with no node crash, which could take the last intact copy,
    /// and no client crash, which can leave a write on node 1 alone. Reads must find
    /// an intact copy: value fetches meet foreign records, so
    /// [`Outcome::recycled_fetches`] is not zero under this fault.
    pub wiped_copies: bool,
}

impl Faults {
    /// No fault at all.
    pub const NONE: Self = Self {
        crash_minority: false,
        slow_node: false,
        clock_skew: false,
        crash_clients: false,
        late_messages: false,
        slow_spells: false,
        slow_links: false,
        node_stalls: false,
        clock_jumps: false,
        suspicions: false,
        wiped_copies: false,
    };
    /// Every fault.
    pub const ALL: Self = Self {
        crash_minority: true,
        slow_node: true,
        clock_skew: true,
        crash_clients: true,
        late_messages: true,
        slow_spells: true,
        slow_links: true,
        node_stalls: true,
        clock_jumps: true,
        suspicions: false,
        wiped_copies: false,
    };
}

/// A scenario's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Seed of the world and of every random choice.
    pub seed: u64,
    /// Operations per client (all its in-flight lanes together).
    pub ops_per_client: u32,
    /// Number of clients (each one writer).
    pub clients: u32,
    /// Operations each client keeps in flight at once, on one [`Client`] (one
    /// writer id): its lanes pick keys independently, so one writer may have two
    /// writes in flight on one register.
    pub inflight: u32,
    /// Number of keys.
    pub keys: u32,
    /// Replicas per register (`2f + 1`); the cluster has this many nodes.
    pub replicas: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// The faults.
    pub faults: Faults,
    /// Fraction of writes among operations, in percent.
    pub write_percent: u32,
    /// Fraction of deletes among operations, in percent (Safe-Guess only). Above 0,
    /// the history is a key-value one (SWARM-KV §5.3): reads are gets, writes are
    /// updates (which fail on a deleted key), and as many operations again are
    /// inserts, which re-create a deleted key in a fresh register.
    pub delete_percent: u32,
    /// Metadata words per register (`W`, §4.4).
    pub meta_words: u16,
    /// Virtual nanoseconds a client pauses between operations.
    pub think_ns: u64,
    /// Whether each lane's first operation is a write (an insert with deletes on),
    /// so that reads find values.
    pub write_first: bool,
    /// Length of a timestamp tick in virtual nanoseconds. Ticks longer than a
    /// roundtrip make concurrent writers guess the same ticks, which only the writer
    /// id orders, so the lower ids take the slow path.
    pub tick_ns: u64,
    /// Largest clock skew of [`Faults::clock_skew`] and [`Faults::clock_jumps`].
    pub max_skew_ns: u64,
    /// Log slot recycling (SWARM §4.5): `None` sizes every log for the whole run,
    /// as if nothing were recycled; `Some` gives each writer a tiny log and runs a
    /// background slot-recycling task per client.
    pub recycling: Option<Recycling>,
    /// Incarnations per client (1: one for the whole run). With more, each client's
    /// operations are split among that many incarnations of its writer id, one after
    /// the other: an incarnation stops cleanly once its operations returned, hands
    /// its log summary on (`swarm_core::summary`, through its encoding), and the next
    /// one resumes from it and examines the carried slots in the background.
    pub incarnations: u32,
    /// With [`Scenario::incarnations`] above 1: every incarnation but the last
    /// *crashes* instead of stopping cleanly, in the middle of one of its writes (at
    /// its first, second, ... post, [`Fault::CrashClientAtPost`]: the write reaches
    /// some replicas only, other lanes' operations stay in flight), and leaves no
    /// summary. A delivery margin later, the successor takes the writer id over as
    /// SWARM-KV does after a crash: it reads the id's tick ceiling from a majority,
    /// resumes with `Client::resume_crashed` above it (every slot carried, examined
    /// lazily) and persists the ceiling with `Client::set_tick_ceiling`, as every
    /// incarnation does. Client crash faults ([`Faults::crash_clients`]) are not
    /// scheduled: these crashes replace them. See [`Outcome::crash_resumes`].
    pub crash_restarts: bool,
    /// Largest value of a register (`Layout::payload_max`), which sizes log slots:
    /// larger slots make a writer's log span several examination steps of a resumed
    /// incarnation (`swarm_core::protocol::carried`, 64 KiB per node per step).
    pub payload_max: u32,
}

/// A scenario's log slot recycling (see `swarm_core::slot_recycling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recycling {
    /// Slots in each writer's log (the tombstone slot included).
    pub log_slots: u32,
    /// The operation fence, `ProtocolConfig::max_op_ns`.
    pub max_op_ns: u64,
    /// `ProtocolConfig::delivery_margin_ns`: the simulated links deliver within
    /// microseconds, even late messages and slow spells.
    pub delivery_margin_ns: u64,
    /// Registers per background slot-recycling check, one check every `interval_ns`.
    pub budget: usize,
    /// Time between two background slot-recycling ticks.
    pub interval_ns: u64,
}

impl Scenario {
    /// A fault-free Safe-Guess scenario with 4 clients, 4 keys, 3 replicas, 50% writes.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ops_per_client: 50,
            clients: 4,
            inflight: 1,
            keys: 4,
            replicas: 3,
            protocol: Protocol::SafeGuess,
            faults: Faults::NONE,
            write_percent: 50,
            delete_percent: 0,
            meta_words: 4,
            think_ns: 0,
            write_first: false,
            tick_ns: 100,
            max_skew_ns: 20_000,
            recycling: None,
            incarnations: 1,
            crash_restarts: false,
            payload_max: 32,
        }
    }

    /// Whether the history uses the key-value model (deletes and inserts).
    fn key_value(&self) -> bool {
        self.delete_percent > 0 && self.protocol == Protocol::SafeGuess
    }
}

/// Roundtrips taken by operations of one kind: `counts[i]` operations took `i + 1`
/// roundtrips, the last bucket counting 4 or more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundtripHistogram {
    /// Operations by roundtrips: 1, 2, 3, 4+.
    pub counts: [u64; 4],
}

impl RoundtripHistogram {
    fn add(&mut self, roundtrips: u32) {
        let bucket = (roundtrips.max(1) as usize - 1).min(3);
        self.counts[bucket] += 1;
    }

    /// Operations counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Fraction of operations that took exactly one roundtrip.
    pub fn one_roundtrip_fraction(&self) -> f64 {
        if self.total() == 0 {
            return 0.0;
        }
        self.counts[0] as f64 / self.total() as f64
    }
}

impl core::fmt::Display for RoundtripHistogram {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let total = self.total().max(1) as f64;
        let pct = |i: usize| 100.0 * self.counts[i] as f64 / total;
        write!(
            f,
            "1: {:.1}%  2: {:.1}%  3: {:.1}%  4+: {:.1}%  (n={})",
            pct(0),
            pct(1),
            pct(2),
            pct(3),
            self.total()
        )
    }
}

/// What a scenario produced.
#[derive(Debug)]
pub struct Outcome {
    /// Every operation, crashed ones without an end.
    pub history: History,
    /// Roundtrips of completed reads.
    pub reads: RoundtripHistogram,
    /// Roundtrips of completed writes.
    pub writes: RoundtripHistogram,
    /// The most iterations any Safe-Guess read needed.
    pub max_read_iterations: u32,
    /// Operations that returned an error (recorded as crashed: outcome unknown).
    pub errors: Vec<String>,
    /// The simulation run.
    pub run: RunReport,
    /// Log slots recycled, all clients together (clients that crashed excluded).
    pub recycled_slots: u64,
    /// The most log slots any surviving writer had in use when it finished.
    pub max_slots_in_use: u32,
    /// The longest operation that returned, in virtual ns (to size a fence).
    pub longest_op_ns: u64,
    /// Value fetches that found their buffer recycled and read again
    /// (`OpStats::recycled_fetches`, all operations together): zero when recycling
    /// keeps its rules, since every operation here has a deadline.
    pub recycled_fetches: u64,
    /// Deletes that raced another delete of the same value
    /// (`swarm_core::DeleteOutcome::Raced`), recorded with an unknown outcome.
    pub raced_deletes: u64,
    /// Incarnations that resumed from a log summary ([`Scenario::incarnations`]).
    pub summary_resumes: u64,
    /// Slots those incarnations carried over, all together.
    pub carried_slots: u64,
    /// Carried slots examined before their incarnation stopped, all together.
    pub carried_examined: u64,
    /// Incarnations that took a crashed writer id over
    /// ([`Scenario::crash_restarts`]).
    pub crash_resumes: u64,
    /// Writes of crashed incarnations that left for a minority of the replicas of
    /// their register only (abandoned there: the crash came between two posts).
    pub partial_writes: u64,
    /// The fewest writes that any incarnation which took a crashed writer id over
    /// completed (`u64::MAX` if none did): it started with every slot of its log
    /// taken, so beyond the log's size it wrote into slots that came back.
    pub min_writes_after_crash: u64,
    /// Writes (first or rewrite) of an incarnation whose timestamp is at or below
    /// one that an earlier incarnation of the same writer id sent for the same
    /// register ([`Scenario::crash_restarts`]): each must be empty.
    pub ticks_not_above_predecessors: Vec<String>,
}

#[derive(Default)]
struct Record {
    history: Vec<Operation>,
    reads: RoundtripHistogram,
    writes: RoundtripHistogram,
    max_iterations: u32,
    errors: Vec<String>,
    recycled: u64,
    max_in_use: u32,
    longest_op_ns: u64,
    recycled_fetches: u64,
    raced_deletes: u64,
    summary_resumes: u64,
    carried_slots: u64,
    carried_examined: u64,
    crash_resumes: u64,
    min_writes_after_crash: Option<u64>,
    /// Per incarnation of a crash-restarting client: its simulated client, writer
    /// index, incarnation number, and whether it crashed.
    incarnations: Vec<(ClientId, u32, u32, bool)>,
}

/// The writes that left the clients, seen as they were posted (crash restarts only):
/// per timestamp (ticks, writer), the first client that sent a record with it, the
/// register, the record, and the nodes that client sent it to. A later batch with
/// the same timestamp is a write-back of that write by another operation (a read
/// copies the buffer to the nodes that lack it), unless its record differs.
#[derive(Default)]
struct SentWrites {
    sent: BTreeMap<(u64, u16), SentWrite>,
    /// Timestamps sent again with another record (a timestamp used twice).
    reused: Vec<String>,
}

/// The first sending of one timestamp ([`SentWrites`]).
struct SentWrite {
    client: ClientId,
    register: u32,
    record: Vec<u8>,
    nodes: u32,
}

impl SentWrites {
    /// Notes `batch` if it writes a record: a record written into a log slot and a
    /// CAS of a register's metadata word to that record's timestamp.
    fn see(&mut self, layout: &Layout, ceilings: u64, client: ClientId, batch: &Batch) {
        let mut record = None;
        let mut register = None;
        for op in batch.ops() {
            match op {
                Op::Write { addr, data } if *addr >= layout.log_base() => record = Some(data),
                Op::Cas { addr, new, .. } if (HEADER_SIZE..ceilings).contains(addr) => {
                    let index = (addr - HEADER_SIZE) / layout.register_bytes();
                    register = Some((index as u32, *new));
                }
                _ => {}
            }
        }
        let (Some(record), Some((register, meta))) = (record, register) else {
            return;
        };
        let Some(word) = record.get(..8).and_then(|w| w.try_into().ok()) else {
            return;
        };
        let ts = Tsp::from_word(u64::from_le_bytes(word)).ts();
        if ts != Tsp::from_word(meta).ts() || ts.is_tombstone() {
            return;
        }
        let first = self
            .sent
            .entry((ts.ticks(), ts.writer().get()))
            .or_insert_with(|| SentWrite {
                client,
                register,
                record: record.to_vec(),
                nodes: 0,
            });
        if first.record[..] != record[..] || first.register != register {
            self.reused.push(format!(
                "{ts:?} sent by {client} for register {register}, first by {} for register {}",
                first.client, first.register
            ));
        } else if first.client == client {
            first.nodes += 1;
        }
    }
}

/// The register a log record names, from its address (untrusted: checked).
fn locate(layout: &Layout, replicas: u16, addr: u64) -> Option<RegisterLoc> {
    let offset = addr.checked_sub(HEADER_SIZE)?;
    let index = u32::try_from(offset / layout.register_bytes()).ok()?;
    (offset % layout.register_bytes() == 0).then(|| register(layout, replicas, index))
}

/// Register number `index` of a scenario's layout.
fn register(layout: &Layout, replicas: u16, index: u32) -> RegisterLoc {
    RegisterLoc {
        addr: HEADER_SIZE + u64::from(index) * layout.register_bytes(),
        replicas: Replicas::all(usize::from(replicas), u64::from(index))
            .unwrap_or_else(|_| Replicas::all(3, u64::from(index)).expect("3 replicas are valid")),
    }
}

/// Which register holds each key now, in the key-value model: a key absent from
/// the start or after a delete has none until an insert publishes a fresh register
/// with the value already written (as SWARM-KV's index does, §5.3.1). Publishing is
/// an atomic compare-and-set in virtual time, so it is the insert's linearization
/// point, and every operation on a register started before the key moved away
/// from it.
struct Directory {
    current: Vec<Option<u32>>,
    next_free: u32,
    capacity: u32,
}

impl Directory {
    fn new(keys: u32, capacity: u32) -> Self {
        Self {
            current: (0..keys).map(|_| None).collect(),
            next_free: 0,
            capacity,
        }
    }

    fn allocate(&mut self) -> Option<u32> {
        (self.next_free < self.capacity).then(|| {
            self.next_free += 1;
            self.next_free - 1
        })
    }
}

/// Runs `scenario`; fails only if the simulation stalls or exceeds its time limit
/// (a wait-freedom violation while a majority is alive).
pub fn run(scenario: &Scenario) -> Result<Outcome, SimError> {
    let writers = scenario.clients.max(1) as u16;
    // Without recycling every write uses a fresh log slot, a rewrite or an insert
    // into a fresh register one more: size the logs for it.
    let slots = match scenario.recycling {
        Some(r) => r.log_slots,
        None => (scenario.ops_per_client * 3 + 16).next_power_of_two(),
    };
    // With deletes, a key may move to a fresh register at every insert.
    let registers = if scenario.key_value() {
        scenario.clients * scenario.ops_per_client + scenario.keys
    } else {
        scenario.keys
    };
    let shape = |log_base| {
        Layout::builder()
            .payload_max(scenario.payload_max)
            .meta_words(scenario.meta_words)
            .log_base(log_base)
            .writers(writers)
            .slots_per_writer(slots)
            .build()
    };
    let register_bytes = shape(0)
        .expect("scenario layouts are valid")
        .register_bytes();
    let registers_end = HEADER_SIZE + u64::from(registers) * register_bytes;
    // The tick-ceiling words of crash restarts, one per writer id, after the registers.
    let ceilings = registers_end.next_multiple_of(8);
    let logs_from = if scenario.crash_restarts {
        ceilings + 8 * u64::from(writers)
    } else {
        registers_end
    };
    let layout = shape(logs_from.next_multiple_of(4096)).expect("scenario layouts are valid");
    let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
    let mut rng = SimRng::new(scenario.seed ^ 0x5ca1_ab1e);
    let config = sim_config(scenario, node_bytes);
    let world = SimWorld::new(scenario.seed, config);
    let sent = Rc::new(RefCell::new(SentWrites::default()));
    if scenario.crash_restarts {
        let sent = sent.clone();
        world.observe_posts(move |client, _, batch| {
            sent.borrow_mut().see(&layout, ceilings, client, batch);
        });
    }
    let mut runner = SimRunner::new(&world);
    let record = Rc::new(RefCell::new(Record::default()));
    let directory = Rc::new(RefCell::new(Directory::new(scenario.keys, registers)));
    if !scenario.key_value() {
        // One register per key, for good.
        let mut dir = directory.borrow_mut();
        for key in 0..scenario.keys {
            dir.current[key as usize] = dir.allocate();
        }
    }
    // Rough length of the run, to place faults inside it. Crash restarts run about
    // fifteen times longer: each successor starts with a full log, and the tiny logs
    // they run with make writes wait for slots to come back.
    let mut span = u64::from(scenario.ops_per_client) * (3_000 + scenario.think_ns);
    if scenario.crash_restarts {
        span *= 16;
    }
    schedule_faults(scenario, &runner, &mut rng, span);

    for c in 0..scenario.clients {
        let fabric = world.client();
        let id = fabric.id();
        if scenario.faults.crash_clients && !scenario.crash_restarts && c % 4 == 3 {
            runner.at(rng.between(span / 4, span), Fault::CrashClient(id));
        }
        if scenario.faults.slow_links {
            schedule_slow_links(scenario, &world, &mut rng, id, 0, span);
        }
        let skew = if scenario.faults.clock_skew {
            random_skew(&mut rng, scenario.max_skew_ns)
        } else {
            0
        };
        let clock = SimClock::new(&world, scenario.tick_ns).with_skew(skew);
        let mut config = ProtocolConfig::default()
            .with_slow_after_ns(10_000)
            .with_suspect_ns(200_000);
        if let Some(r) = scenario.recycling {
            config = config
                .with_max_op_ns(r.max_op_ns)
                .with_delivery_margin_ns(r.delivery_margin_ns)
                .with_slot_recycling_interval_ns(r.interval_ns);
        }
        runner.spawn(
            id,
            incarnations_task(Incarnations {
                scenario: *scenario,
                spawner: runner.spawner(),
                fabric,
                clock,
                config,
                index: c,
                layout,
                directory: directory.clone(),
                record: record.clone(),
                seed: rng.next_u64(),
                ceilings,
                span,
            }),
        );
    }
    if scenario.faults.wiped_copies {
        let fabric = world.client();
        let id = fabric.id();
        let times: Vec<u64> = (0..16).map(|_| rng.between(span / 16, span)).collect();
        runner.spawn(id, wipe_copies(fabric, layout, NodeId(1), times));
    }
    // A livelock guard only: slow links and spells stretch operations to tens of
    // microseconds, hundreds with retries.
    runner.time_limit(span * 400 + 10_000_000);
    let report = runner.run()?;
    let record = Rc::try_unwrap(record)
        .map(RefCell::into_inner)
        .unwrap_or_else(|shared| core::mem::take(&mut *shared.borrow_mut()));
    let (partial_writes, ticks_not_above_predecessors) =
        crash_restart_writes(&record.incarnations, &sent.borrow(), scenario.replicas);
    let mut history = History::new();
    for op in record.history {
        // Operations built by this module are always well formed.
        let _ = history.push(op);
    }
    Ok(Outcome {
        history,
        reads: record.reads,
        writes: record.writes,
        max_read_iterations: record.max_iterations,
        errors: record.errors,
        run: report,
        recycled_slots: record.recycled,
        max_slots_in_use: record.max_in_use,
        longest_op_ns: record.longest_op_ns,
        recycled_fetches: record.recycled_fetches,
        raced_deletes: record.raced_deletes,
        summary_resumes: record.summary_resumes,
        carried_slots: record.carried_slots,
        carried_examined: record.carried_examined,
        crash_resumes: record.crash_resumes,
        partial_writes,
        min_writes_after_crash: record.min_writes_after_crash.unwrap_or(u64::MAX),
        ticks_not_above_predecessors,
    })
}

/// What the writes seen leaving the clients say about crash restarts: how many
/// writes of crashed incarnations left for some replicas only, and every write of an
/// incarnation whose timestamp is not above all those an earlier incarnation of its
/// writer id sent for the same register.
fn crash_restart_writes(
    incarnations: &[(ClientId, u32, u32, bool)],
    sent: &SentWrites,
    replicas: u16,
) -> (u64, Vec<String>) {
    let of = |client: ClientId| incarnations.iter().find(|i| i.0 == client);
    let mut partial = 0;
    // Per (writer, register, incarnation): the ticks it used first.
    let mut ticks: BTreeMap<(u32, u32, u32), Vec<u64>> = BTreeMap::new();
    for (&(ticks_of, ts_writer), first) in &sent.sent {
        let Some(&(_, writer, k, crashed)) = of(first.client) else {
            continue;
        };
        if u32::from(ts_writer) != writer {
            continue;
        }
        if crashed && (first.nodes as usize) < majority(usize::from(replicas)) {
            partial += 1;
        }
        ticks
            .entry((writer, first.register, k))
            .or_default()
            .push(ticks_of);
    }
    let mut violations = sent.reused.clone();
    for (&(writer, register, k), later) in &ticks {
        for (&(w, r, earlier_k), earlier) in
            ticks.range((writer, register, 0)..(writer, register, k))
        {
            debug_assert!(w == writer && r == register && earlier_k < k);
            let highest = earlier.iter().copied().max().unwrap_or(0);
            for &t in later.iter().filter(|&&t| t <= highest) {
                violations.push(format!(
                    "writer {writer} register {register}: incarnation {k} wrote at tick {t}, \
                     incarnation {earlier_k} at tick {highest}"
                ));
            }
        }
    }
    (partial, violations)
}

/// What a client's incarnations share ([`Scenario::incarnations`]).
struct Incarnations {
    scenario: Scenario,
    spawner: crate::runner::Spawner,
    fabric: SimFabric,
    clock: SimClock,
    config: ProtocolConfig,
    index: u32,
    layout: Layout,
    directory: Rc<RefCell<Directory>>,
    record: Rc<RefCell<Record>>,
    seed: u64,
    /// Address of writer 0's tick-ceiling word ([`Scenario::crash_restarts`]).
    ceilings: u64,
    /// Rough length of the run.
    span: u64,
}

/// Ticks a crash-restarting incarnation persists its tick ceiling beyond the
/// timestamp that needs a raise: at the scenarios' ticks of microseconds, a raise
/// every few operations (and operations that wait for another's raise), yet most
/// writes start with their own posts (where the crashes are placed).
const CEILING_HEADROOM: u64 = 256;

/// Runs a client's operations through its incarnations, one after the other (one
/// incarnation unless [`Scenario::incarnations`] says more): each runs its lanes and
/// its slot-recycling task, and, once its lanes are done, hands its log summary to the
/// next; or, with [`Scenario::crash_restarts`], crashes mid-write and leaves the
/// next one to take its writer id over.
async fn incarnations_task(ctx: Incarnations) {
    let Incarnations {
        scenario,
        spawner,
        fabric,
        clock,
        config,
        index,
        layout,
        directory,
        record,
        seed,
        ceilings,
        span,
    } = ctx;
    let inflight = scenario.inflight.max(1);
    let incarnations = scenario.incarnations.max(1);
    let per = scenario.ops_per_client.div_ceil(incarnations);
    let writer = WriterId::new(index).expect("scenarios stay below the writer limit");
    let mut rng = SimRng::new(seed);
    let mut summary: Option<LogSummary> = None;
    let world = fabric.world().clone();
    // The skew of the last incarnation's clock when it stopped.
    let mut last_skew = clock.skew();
    for k in 0..incarnations {
        let first_op = k * per;
        if first_op >= scenario.ops_per_client {
            break;
        }
        // A restart may run on another host, whose clock may lag: later incarnations
        // get a clock of their own, skewed afresh under clock faults.
        let clock = if k > 0 && scenario.faults.clock_skew && scenario.crash_restarts {
            // The host a crashed writer id is taken over on lags the dead one's clock
            // (by up to twice the largest skew): without its predecessor's ticks, it
            // would guess below them.
            let lag = rng.between(0, 2 * scenario.max_skew_ns.min(i64::MAX as u64 / 4));
            SimClock::new(&world, scenario.tick_ns).with_skew(last_skew - lag as i64)
        } else if k > 0 && scenario.faults.clock_skew {
            SimClock::new(&world, scenario.tick_ns)
                .with_skew(random_skew(&mut rng, scenario.max_skew_ns))
        } else {
            clock.clone()
        };
        // A crash-restarting incarnation is a process of its own (crashing it drops
        // its tasks, not this one).
        let fabric = if scenario.crash_restarts {
            let own = world.client();
            if scenario.faults.slow_links {
                let now = world.now();
                schedule_slow_links(&scenario, &world, &mut rng, own.id(), now, span.max(now));
            }
            own
        } else {
            fabric.clone()
        };
        let id = fabric.id();
        let client = match Client::new(fabric.clone(), clock, layout, writer, config) {
            Ok(client) => Rc::new(client),
            Err(e) => {
                record.borrow_mut().errors.push(e.to_string());
                return;
            }
        };
        let replicas = scenario.replicas;
        if scenario.crash_restarts {
            let addr = ceilings + 8 * u64::from(index);
            let held = match read_ceiling(&fabric, addr).await {
                Ok(held) => held,
                Err(e) => {
                    record.borrow_mut().errors.push(e.to_string());
                    return;
                }
            };
            if k > 0 {
                // As SWARM-KV's client does on a writer id whose holder crashed.
                client.resume_crashed(held, move |addr| locate(&layout, replicas, addr));
                let mut r = record.borrow_mut();
                r.crash_resumes += 1;
                r.carried_slots += client.carried_remaining() as u64;
            }
            client.set_tick_ceiling(addr, held, CEILING_HEADROOM);
            let crashes = k + 1 < incarnations;
            record
                .borrow_mut()
                .incarnations
                .push((id, index, k, crashes));
        } else if let Some(summary) = &summary {
            client.resume_summary(summary, move |addr| locate(&layout, replicas, addr));
            let mut r = record.borrow_mut();
            r.summary_resumes += 1;
            r.carried_slots += client.carried_remaining() as u64;
        }
        let ops = per.min(scenario.ops_per_client - first_op);
        // Where a crashing incarnation dies: at its first write from a random
        // operation of its last quarter on (lane 0), at one of that write's posts.
        let crash = (scenario.crash_restarts && k + 1 < incarnations).then(|| CrashAt {
            op: rng.between(u64::from(ops * 3 / 4), u64::from(ops.saturating_sub(1))) as u32,
            post: rng.between(1, u64::from(replicas)) as u32,
        });
        let lanes_left = Rc::new(core::cell::Cell::new(inflight));
        let writes_done = Rc::new(core::cell::Cell::new(0u64));
        if let Some(r) = scenario.recycling {
            spawner.spawn(
                id,
                slot_recycling_task(SlotRecycling {
                    client: client.clone(),
                    recycling: r,
                    lanes_left: lanes_left.clone(),
                    record: record.clone(),
                }),
            );
        }
        for lane in 0..inflight {
            let task = lane_task(Lane {
                scenario: Scenario {
                    ops_per_client: ops,
                    ..scenario
                },
                client: client.clone(),
                index,
                lane,
                first_op,
                layout,
                directory: directory.clone(),
                record: record.clone(),
                seed: rng.next_u64(),
                lanes_left: lanes_left.clone(),
                crash: if lane == 0 { crash } else { None },
                writes_done: writes_done.clone(),
            });
            spawner.spawn(id, task);
        }
        while lanes_left.get() > 0 {
            world.sleep(10_000).await;
        }
        last_skew = client.clock().skew();
        if scenario.crash_restarts {
            if k > 0 {
                let mut r = record.borrow_mut();
                let fewest = r.min_writes_after_crash.unwrap_or(u64::MAX);
                r.min_writes_after_crash = Some(fewest.min(writes_done.get()));
            }
            if crash.is_some() {
                // Dead for good, even if lane 0 found no write to die in.
                world.crash_client(id);
                // Its successor is given the writer id once what it posted landed
                // (as a lease that expired long after: a delivery margin here).
                let margin = scenario.recycling.map_or(100_000, |r| r.delivery_margin_ns);
                world.sleep(margin).await;
            }
            continue;
        }
        // A clean stop: every operation of this incarnation returned. Its summary
        // goes through its encoding, as a store hands it on through memory.
        let stamp = u64::from(k) + 1;
        let slots = layout.slots_per_writer();
        summary = LogSummary::decode(&client.log_summary().encode(stamp), stamp, slots).ok();
    }
}

/// Reads a writer's tick-ceiling word at `addr` from a majority of nodes (and every
/// other node that answers in time): the largest value read.
async fn read_ceiling(fabric: &SimFabric, addr: u64) -> Result<u64, SwarmError> {
    let stats = OpStats::new();
    let nodes = fabric.node_count();
    let rt = broadcast_until(
        fabric,
        &stats,
        majority(nodes),
        100_000,
        |_| Ok(Some(Batch::read(addr, 8))),
        |replies| replies.len() == nodes,
    )
    .await?;
    Ok(rt
        .replies()
        .iter()
        .filter_map(|(_, completion)| completion.read(0))
        .filter_map(|bytes| bytes.try_into().ok().map(u64::from_le_bytes))
        .max()
        .unwrap_or(0))
}

/// What a client's background recycling needs.
struct SlotRecycling {
    client: Rc<Client<SimFabric, SimClock>>,
    recycling: Recycling,
    lanes_left: Rc<core::cell::Cell<u32>>,
    record: Rc<RefCell<Record>>,
}

/// A client's background recycling: a slot-recycling tick (and a step of the examination
/// of carried slots) every `interval_ns` while its lanes run, then the client's log
/// counters into the record.
async fn slot_recycling_task(ctx: SlotRecycling) {
    let SlotRecycling {
        client,
        recycling,
        lanes_left,
        record,
    } = ctx;
    let carried = client.carried_remaining();
    while lanes_left.get() > 0 {
        client.recycle_slots_tick(recycling.budget);
        client.examine_carried_tick(client.fabric().now());
        client.fabric().sleep(recycling.interval_ns).await;
    }
    record.borrow_mut().carried_examined += (carried - client.carried_remaining()) as u64;
    client.cancel_slot_recycling();
    let counters = client.slot_counters();
    let mut r = record.borrow_mut();
    r.recycled += counters.recycled;
    r.max_in_use = r.max_in_use.max(counters.in_use);
}

/// [`Faults::wiped_copies`]: at each of `times`, overwrites the record header (its
/// timestamp word and length) of every log slot of every writer on `node` with
/// zeros, leaving the timestamp-lock words that precede the records alone.
async fn wipe_copies(fabric: SimFabric, layout: Layout, node: NodeId, mut times: Vec<u64>) {
    times.sort_unstable();
    for at in times {
        fabric.sleep(at.saturating_sub(fabric.now())).await;
        for writer in 0..layout.writers() {
            let Ok(writer) = WriterId::new(u32::from(writer)) else {
                continue;
            };
            let slots: Vec<u32> = (0..layout.slots_per_writer()).collect();
            for chunk in slots.chunks(INLINE_BATCH_OPS) {
                let mut batch = Batch::new();
                for &slot in chunk {
                    let Some(addr) = layout.slot_addr(writer, slot) else {
                        continue;
                    };
                    let record = addr + u64::from(swarm_core::layout::SLOT_LOCK_BYTES);
                    // At most INLINE_BATCH_OPS operations: cannot fail.
                    let _ = batch.push(Op::Write {
                        addr: record,
                        data: std::vec![0; 16].into(),
                    });
                }
                let ticket = fabric.post(node, batch);
                fabric.forget(ticket);
            }
        }
    }
}

/// Probability that a message is late under [`Faults::late_messages`].
const LATE_PROBABILITY: f64 = 0.125;
/// Longest extra delay of a late message: each draws its own in `0..=LATE_MAX_NS`,
/// a few roundtrips to a few slow-path timeouts.
const LATE_MAX_NS: u64 = 40_000;

/// The simulated cluster: late messages and stalls per [`Faults`].
fn sim_config(scenario: &Scenario, node_bytes: usize) -> SimConfig {
    let mut config = SimConfig::new(usize::from(scenario.replicas), node_bytes).keep_trace(false);
    if scenario.faults.late_messages {
        for node in &mut config.nodes {
            node.latency = node.latency.with_tail_upto(LATE_PROBABILITY, LATE_MAX_NS);
        }
    }
    if scenario.faults.node_stalls {
        config = config.stalls(0.2, 5_000);
    }
    config
}

/// A skew in `±max_ns`.
fn random_skew(rng: &mut SimRng, max_ns: u64) -> i64 {
    let max = max_ns.min(i64::MAX as u64 / 2);
    rng.between(0, 2 * max) as i64 - max as i64
}

fn schedule_faults(scenario: &Scenario, runner: &SimRunner, rng: &mut SimRng, span: u64) {
    let n = scenario.replicas;
    let mut nodes: Vec<u16> = (0..n).collect();
    rng.shuffle(&mut nodes);
    if scenario.faults.crash_minority {
        for &node in nodes.iter().take(usize::from((n - 1) / 2)) {
            runner.at(rng.between(0, span / 2), Fault::Crash(NodeId(node)));
        }
    }
    if scenario.faults.slow_node {
        let node = NodeId(nodes[usize::from(n - 1)]);
        let from = rng.between(0, span / 2);
        runner.at(from, Fault::Slow(node, 20));
        runner.at(from + span / 4, Fault::Slow(node, 1));
    }
    if scenario.faults.slow_spells {
        // About one spell every 20 µs of the run, each on a random node.
        for _ in 0..span / 20_000 + 1 {
            let node = NodeId(rng.below(u64::from(n)) as u16);
            let from = rng.between(0, span);
            let factor = rng.between(5, 40) as u32;
            runner.at(from, Fault::Slow(node, factor));
            runner.at(from + rng.between(5_000, 50_000), Fault::Slow(node, 1));
        }
    }
}

/// Slows a third of `client`'s links from `from` (virtual time), then redraws one of
/// them every 40 µs or so until `until`, when they all heal.
fn schedule_slow_links(
    scenario: &Scenario,
    world: &SimWorld,
    rng: &mut SimRng,
    client: ClientId,
    from: u64,
    until: u64,
) {
    let draw = |rng: &mut SimRng| match rng.below(10) {
        0..4 => 1,
        4..7 => rng.between(2, 4) as u32,
        _ => rng.between(10, 30) as u32,
    };
    for node in 0..scenario.replicas {
        world.at(from, Fault::SlowLink(client, NodeId(node), draw(rng)));
    }
    for _ in 0..until.saturating_sub(from) / 40_000 {
        let node = NodeId(rng.below(u64::from(scenario.replicas)) as u16);
        let at = rng.between(from, until);
        world.at(at, Fault::SlowLink(client, node, draw(rng)));
    }
    // Every link heals by the end: a read whose holders all answer slower than
    // `slow_after_ns` retries until one answers in time (see the report of issue 10).
    for node in 0..scenario.replicas {
        world.at(until.max(from), Fault::SlowLink(client, NodeId(node), 1));
    }
}

/// One operation a lane issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Read,
    Write,
    Delete,
    Insert,
}

impl Action {
    fn pick(scenario: &Scenario, first: bool, rng: &mut SimRng) -> Self {
        let insert = if scenario.key_value() {
            Self::Insert
        } else {
            Self::Write
        };
        if scenario.write_first && first {
            return insert;
        }
        let roll = rng.below(100);
        let deletes = if scenario.key_value() {
            u64::from(scenario.delete_percent)
        } else {
            0
        };
        let writes = u64::from(scenario.write_percent);
        if roll < deletes {
            Self::Delete
        } else if roll < 2 * deletes {
            insert
        } else if roll < 2 * deletes + writes {
            Self::Write
        } else {
            Self::Read
        }
    }

    /// How the history names it.
    fn kind(self, key_value: bool) -> OpKind {
        match (self, key_value) {
            (Self::Read, false) => OpKind::Read,
            (Self::Write, false) => OpKind::Write,
            (Self::Read, true) => OpKind::Get,
            (Self::Write, true) => OpKind::Update,
            (Self::Delete, _) => OpKind::Delete,
            (Self::Insert, _) => OpKind::Insert,
        }
    }
}

/// One of a client's concurrent sequences of operations.
struct Lane {
    scenario: Scenario,
    client: Rc<Client<SimFabric, SimClock>>,
    index: u32,
    lane: u32,
    /// The client's operation number of this incarnation's first (values stay unique
    /// across incarnations).
    first_op: u32,
    layout: Layout,
    directory: Rc<RefCell<Directory>>,
    record: Rc<RefCell<Record>>,
    seed: u64,
    /// Lanes of this client still running (its slot-recycling task stops at zero).
    lanes_left: Rc<core::cell::Cell<u32>>,
    /// Where this lane's incarnation crashes, if it does.
    crash: Option<CrashAt>,
    /// Writes of this incarnation that returned.
    writes_done: Rc<core::cell::Cell<u64>>,
}

/// Where a crash-restarting incarnation crashes ([`Scenario::crash_restarts`]).
#[derive(Clone, Copy, Debug)]
struct CrashAt {
    /// The lane's first write from this operation number on (of the incarnation's).
    op: u32,
    /// At this post from the write's start (1: before anything leaves).
    post: u32,
}

/// What an operation returned, for the history.
struct Done {
    /// `None`: unknown (a delete that raced another, `DeleteOutcome::Raced`).
    ok: Option<bool>,
    /// The value a read returned.
    value: Option<String>,
    /// Whether it read (for the roundtrip histograms).
    read: bool,
}

async fn lane_task(lane: Lane) {
    let Lane {
        scenario,
        client,
        index,
        lane,
        first_op,
        layout,
        directory,
        record,
        seed,
        lanes_left,
        mut crash,
        writes_done,
    } = lane;
    // Counts this lane down when it ends (also when a client crash drops it).
    struct LaneDone(Rc<core::cell::Cell<u32>>);
    impl Drop for LaneDone {
        fn drop(&mut self) {
            self.0.set(self.0.get().saturating_sub(1));
        }
    }
    let _done = LaneDone(lanes_left);
    let world = client.fabric().world().clone();
    let inflight = scenario.inflight.max(1);
    let process = u64::from(index) * u64::from(inflight) + u64::from(lane);
    let key_value = scenario.key_value();
    let mut rng = SimRng::new(seed);
    let mut ops = OpContext {
        scenario,
        client: &client,
        layout,
        directory: &directory,
        caches: BTreeMap::new(),
    };
    for (n, i) in (lane..scenario.ops_per_client)
        .step_by(inflight as usize)
        .enumerate()
    {
        if scenario.think_ns > 0 {
            client.fabric().sleep(scenario.think_ns).await;
        }
        if scenario.faults.clock_jumps && rng.chance(0.125) {
            client
                .clock()
                .set_skew(random_skew(&mut rng, scenario.max_skew_ns));
        }
        if scenario.faults.suspicions && rng.chance(0.25) {
            let node = NodeId(rng.below(u64::from(scenario.replicas)) as u16);
            client.suspicion().suspect(node, world.now());
        }
        let key = rng.below(u64::from(scenario.keys.max(1))) as u32;
        let action = Action::pick(&scenario, n == 0, &mut rng);
        let value = format!("c{index}-{}", first_op + i);
        if let Some(at) = crash.filter(|at| i >= at.op && action == Action::Write) {
            world.apply(Fault::CrashClientAtPost(client.fabric().id(), at.post));
            crash = None;
        }
        let start = world.now();
        // Recorded as crashed until it completes: a client crash drops this task here.
        let slot = {
            let mut r = record.borrow_mut();
            let written = matches!(action, Action::Write | Action::Insert).then_some(&*value);
            r.history.push(Operation::crashed(
                process,
                action.kind(key_value),
                key.to_string(),
                written,
                start,
            ));
            r.history.len() - 1
        };
        let stats = OpStats::new();
        let result = ops.run(action, key, &value, &stats).await;
        let end = world.now();
        let mut r = record.borrow_mut();
        r.longest_op_ns = r.longest_op_ns.max(end - start);
        r.recycled_fetches += u64::from(stats.recycled_fetches());
        match result {
            Ok(done) => {
                // A delete that raced another goes into the history with an unknown
                // outcome: it took effect, reporting neither answer.
                r.raced_deletes += u64::from(action == Action::Delete && done.ok.is_none());
                let op = &mut r.history[slot];
                op.end = Some(end);
                op.ok = done.ok;
                if done.read {
                    op.value = done.value;
                    r.reads.add(stats.roundtrips());
                    r.max_iterations = r.max_iterations.max(stats.iterations());
                } else {
                    r.writes.add(stats.roundtrips());
                    writes_done.set(writes_done.get() + 1);
                }
            }
            Err(e) => r.errors.push(format!(
                "client {index} op {i} ({:?}, {} ns, {} roundtrips): {e}",
                action,
                end - start,
                stats.roundtrips()
            )),
        }
    }
}

/// Why a scenario operation failed.
#[derive(Debug, thiserror::Error)]
enum OpError {
    /// The protocol failed.
    #[error(transparent)]
    Swarm(#[from] SwarmError),
    /// Every register of the layout went to an earlier insert.
    #[error("no free register left for an insert: size the scenario's layout larger")]
    NoFreeRegister,
}

/// What a lane needs to run operations: its caches are its own, so two lanes of one
/// client are two independent operations of one writer.
struct OpContext<'a> {
    scenario: Scenario,
    client: &'a Client<SimFabric, SimClock>,
    layout: Layout,
    directory: &'a RefCell<Directory>,
    caches: BTreeMap<u32, RegisterCache>,
}

impl OpContext<'_> {
    async fn run(
        &mut self,
        action: Action,
        key: u32,
        value: &str,
        stats: &OpStats,
    ) -> Result<Done, OpError> {
        let client = self.client;
        let current = self.directory.borrow().current[key as usize];
        // A get of an absent key returns nothing; the other operations fail.
        let absent = Done {
            ok: Some(action == Action::Read),
            value: None,
            read: action == Action::Read,
        };
        match (action, current) {
            (Action::Insert, _) => self.insert(key, current, value, stats).await,
            (_, None) => Ok(absent),
            (Action::Read, Some(reg)) => {
                let read = match self.scenario.protocol {
                    Protocol::SafeGuess => {
                        let (loc, cache) = self.register(reg);
                        client.read(&loc, cache, stats).await?
                    }
                    Protocol::Abd => {
                        let (loc, cache) = self.register(reg);
                        client.abd_read(&loc, cache, stats).await?
                    }
                };
                let value = match read {
                    ReadValue::Value(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                    ReadValue::Empty | ReadValue::Deleted => None,
                };
                Ok(Done {
                    ok: Some(true),
                    value,
                    read: true,
                })
            }
            (Action::Write, Some(reg)) => {
                let outcome = match self.scenario.protocol {
                    Protocol::SafeGuess => {
                        let (loc, cache) = self.register(reg);
                        client.write(&loc, cache, stats, value.as_bytes()).await?
                    }
                    Protocol::Abd => {
                        let (loc, cache) = self.register(reg);
                        client
                            .abd_write(&loc, cache, stats, value.as_bytes())
                            .await?
                    }
                };
                Ok(Done {
                    // A register write always takes effect; an update fails on a
                    // deleted key.
                    ok: Some(!self.scenario.key_value() || outcome == WriteOutcome::Written),
                    value: None,
                    read: false,
                })
            }
            (Action::Delete, Some(reg)) => {
                let (loc, cache) = self.register(reg);
                let outcome = client.delete(&loc, cache, stats).await?;
                Ok(Done {
                    ok: outcome.removed(),
                    value: None,
                    read: false,
                })
            }
        }
    }

    /// Insert: an update of the current register if the key is there; otherwise
    /// (absent, or the update found it deleted) the value goes into a fresh register,
    /// published if the key has not moved meanwhile, else tried again.
    async fn insert(
        &mut self,
        key: u32,
        mut current: Option<u32>,
        value: &str,
        stats: &OpStats,
    ) -> Result<Done, OpError> {
        let client = self.client;
        let written = Done {
            ok: Some(true),
            value: None,
            read: false,
        };
        loop {
            if let Some(reg) = current {
                let (loc, cache) = self.register(reg);
                if client.write(&loc, cache, stats, value.as_bytes()).await?
                    == WriteOutcome::Written
                {
                    return Ok(written);
                }
            }
            let Some(fresh) = self.directory.borrow_mut().allocate() else {
                return Err(OpError::NoFreeRegister);
            };
            let (loc, cache) = self.register(fresh);
            client.write(&loc, cache, stats, value.as_bytes()).await?;
            let mut dir = self.directory.borrow_mut();
            let slot = &mut dir.current[key as usize];
            if *slot == current {
                *slot = Some(fresh);
                return Ok(written);
            }
            current = *slot;
        }
    }

    fn register(&mut self, index: u32) -> (RegisterLoc, &mut RegisterCache) {
        let loc = register(&self.layout, self.scenario.replicas, index);
        (loc, self.caches.entry(index).or_default())
    }
}
