//! Seeded protocol scenarios on the simulated fabric, checked for linearizability.
//!
//! A scenario runs closed-loop clients, each issuing reads and writes on a few
//! replicated registers through Safe-Guess (or DM-ABD, for comparison), over a
//! [`SimWorld`] with the failures of SWARM §2.2 injected: a crashed minority of
//! memory nodes, slow nodes, clock skew that makes timestamp guesses stale, clients
//! that crash mid-operation, and torn reads (the simulation tears every write that
//! overlaps a read). Every operation is recorded in a [`History`] for the
//! linearizability checker (DESIGN.md §7), with its roundtrips and, for Safe-Guess
//! reads, its loop iterations (appendix C bounds them by `2·writers + 1`).
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
    Fault, RunReport, SimClock, SimConfig, SimError, SimFabric, SimRng, SimRunner, SimWorld,
};
use swarm_checker::{History, OpKind, Operation};
use swarm_core::encoding::WriterId;
use swarm_core::fabric::NodeId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::protocol::{ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas};
use swarm_core::{Client, OpStats};

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
    /// Skew client clocks by up to ±20 µs (about ten roundtrips), so guesses go stale.
    pub clock_skew: bool,
    /// Crash up to a quarter of the clients mid-operation.
    pub crash_clients: bool,
}

impl Faults {
    /// No fault at all.
    pub const NONE: Self = Self {
        crash_minority: false,
        slow_node: false,
        clock_skew: false,
        crash_clients: false,
    };
    /// Every fault.
    pub const ALL: Self = Self {
        crash_minority: true,
        slow_node: true,
        clock_skew: true,
        crash_clients: true,
    };
}

/// A scenario's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Seed of the world and of every random choice.
    pub seed: u64,
    /// Operations per client.
    pub ops_per_client: u32,
    /// Number of clients (each one writer).
    pub clients: u32,
    /// Number of registers.
    pub keys: u32,
    /// Replicas per register (`2f + 1`); the cluster has this many nodes.
    pub replicas: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// The faults.
    pub faults: Faults,
    /// Fraction of writes among operations, in percent.
    pub write_percent: u32,
    /// Metadata words per register (`W`, §4.4).
    pub meta_words: u16,
    /// Virtual nanoseconds a client pauses between operations.
    pub think_ns: u64,
    /// Whether each client's first operation is a write, so that reads find values.
    pub write_first: bool,
}

impl Scenario {
    /// A fault-free Safe-Guess scenario with 4 clients, 4 keys, 3 replicas, 50% writes.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ops_per_client: 50,
            clients: 4,
            keys: 4,
            replicas: 3,
            protocol: Protocol::SafeGuess,
            faults: Faults::NONE,
            write_percent: 50,
            meta_words: 4,
            think_ns: 0,
            write_first: false,
        }
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
}

#[derive(Default)]
struct Record {
    history: Vec<Operation>,
    reads: RoundtripHistogram,
    writes: RoundtripHistogram,
    max_iterations: u32,
    errors: Vec<String>,
}

/// The register of key `k` in a scenario's layout.
fn register(layout: &Layout, replicas: u16, key: u32) -> RegisterLoc {
    RegisterLoc {
        addr: HEADER_SIZE + u64::from(key) * layout.register_bytes(),
        replicas: Replicas::all(usize::from(replicas), u64::from(key))
            .unwrap_or_else(|_| Replicas::all(3, u64::from(key)).expect("3 replicas are valid")),
    }
}

/// Runs `scenario`; fails only if the simulation stalls or exceeds its time limit
/// (a wait-freedom violation while a majority is alive).
pub fn run(scenario: &Scenario) -> Result<Outcome, SimError> {
    let writers = scenario.clients.max(1) as u16;
    // Every write uses a fresh log slot (no recycling yet): size the logs for it.
    let slots = (scenario.ops_per_client * 2 + 16).next_power_of_two();
    let shape = |log_base| {
        Layout::builder()
            .payload_max(32)
            .meta_words(scenario.meta_words)
            .log_base(log_base)
            .writers(writers)
            .slots_per_writer(slots)
            .build()
    };
    let register_bytes = shape(0)
        .expect("scenario layouts are valid")
        .register_bytes();
    let registers_end = HEADER_SIZE + u64::from(scenario.keys) * register_bytes;
    let layout = shape(registers_end.next_multiple_of(4096)).expect("scenario layouts are valid");
    let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
    let config = SimConfig::new(usize::from(scenario.replicas), node_bytes).keep_trace(false);
    let world = SimWorld::new(scenario.seed, config);
    let mut rng = SimRng::new(scenario.seed ^ 0x5ca1_ab1e);
    let mut runner = SimRunner::new(&world);
    let record = Rc::new(RefCell::new(Record::default()));
    // Rough length of the run, to place faults inside it.
    let span = u64::from(scenario.ops_per_client) * (3_000 + scenario.think_ns);
    schedule_faults(scenario, &runner, &mut rng, span);

    for c in 0..scenario.clients {
        let fabric = world.client();
        let id = fabric.id();
        if scenario.faults.crash_clients && c % 4 == 3 {
            runner.at(rng.between(span / 4, span), Fault::CrashClient(id));
        }
        let skew = if scenario.faults.clock_skew {
            rng.between(0, 40_000) as i64 - 20_000
        } else {
            0
        };
        let clock = SimClock::new(&world, 100).with_skew(skew);
        let seed = rng.next_u64();
        let task = client_task(ClientTask {
            scenario: *scenario,
            index: c,
            fabric,
            clock,
            layout,
            record: record.clone(),
            seed,
        });
        runner.spawn(id, task);
    }
    runner.time_limit(span * 50 + 10_000_000);
    let report = runner.run()?;
    let record = Rc::try_unwrap(record)
        .map(RefCell::into_inner)
        .unwrap_or_else(|shared| core::mem::take(&mut *shared.borrow_mut()));
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
    })
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
}

struct ClientTask {
    scenario: Scenario,
    index: u32,
    fabric: SimFabric,
    clock: SimClock,
    layout: Layout,
    record: Rc<RefCell<Record>>,
    seed: u64,
}

async fn client_task(task: ClientTask) {
    let ClientTask {
        scenario,
        index,
        fabric,
        clock,
        layout,
        record,
        seed,
    } = task;
    let world = fabric.world().clone();
    let writer = WriterId::new(index).expect("scenarios stay below the writer limit");
    let config = ProtocolConfig::default()
        .with_slow_after_ns(10_000)
        .with_suspect_ns(200_000);
    let client = match Client::new(fabric, clock, layout, writer, config) {
        Ok(client) => client,
        Err(e) => {
            record.borrow_mut().errors.push(e.to_string());
            return;
        }
    };
    let mut rng = SimRng::new(seed);
    let mut caches: BTreeMap<u32, RegisterCache> = BTreeMap::new();
    for i in 0..scenario.ops_per_client {
        if scenario.think_ns > 0 {
            client.fabric().sleep(scenario.think_ns).await;
        }
        let key = rng.below(u64::from(scenario.keys.max(1))) as u32;
        let reg = register(&layout, scenario.replicas, key);
        let cache = caches.entry(key).or_default();
        let is_write =
            (scenario.write_first && i == 0) || rng.below(100) < u64::from(scenario.write_percent);
        let value = format!("c{index}-{i}");
        let start = world.now();
        // Recorded as crashed until it completes: a client crash drops this task here.
        let slot = {
            let mut r = record.borrow_mut();
            let kind = if is_write {
                OpKind::Write
            } else {
                OpKind::Read
            };
            let written = is_write.then_some(value.as_str());
            r.history.push(Operation::crashed(
                u64::from(index),
                kind,
                key.to_string(),
                written,
                start,
            ));
            r.history.len() - 1
        };
        let stats = OpStats::new();
        let result = match (is_write, scenario.protocol) {
            (true, Protocol::SafeGuess) => client
                .write(&reg, cache, &stats, value.as_bytes())
                .await
                .map(|_| None),
            (true, Protocol::Abd) => client
                .abd_write(&reg, cache, &stats, value.as_bytes())
                .await
                .map(|_| None),
            (false, Protocol::SafeGuess) => client.read(&reg, cache, &stats).await.map(Some),
            (false, Protocol::Abd) => client.abd_read(&reg, cache, &stats).await.map(Some),
        };
        let end = world.now();
        let mut r = record.borrow_mut();
        match result {
            Ok(read) => {
                let op = &mut r.history[slot];
                op.end = Some(end);
                op.ok = true;
                if let Some(read) = read {
                    op.value = match read {
                        ReadValue::Value(bytes) => {
                            Some(String::from_utf8_lossy(&bytes).into_owned())
                        }
                        ReadValue::Empty | ReadValue::Deleted => None,
                    };
                    r.reads.add(stats.roundtrips());
                    r.max_iterations = r.max_iterations.max(stats.iterations());
                } else {
                    r.writes.add(stats.roundtrips());
                }
            }
            Err(e) => r.errors.push(format!("client {index} op {i}: {e}")),
        }
    }
}
