//! Safe-Guess registers on shared memory, many threads: every recorded history must
//! be linearizable (SWARM §3, appendix C; ARCHITECTURE.md, "How correctness is tested").
//!
//! Eight client threads of one process share a three-node `ShmCluster` in a scratch
//! directory. Each has its own `ShmFabric`, `Client` and writer id, a wall clock in
//! cluster ticks, and runs 1,500 mixed reads and writes of unique values on one to
//! three registers, with no think time; threads yield every few operations so that
//! all eight interleave on two cores, and are also preempted mid-operation, which
//! stretches some operations across hundreds of others. Variants add what the
//! protocol must mask:
//!
//! - a memory node crashed for every client (`fail_node`): steps time out on it and
//!   fall back to the third replica (§6), and reads never find in-place data on a
//!   crashed primary;
//! - a single metadata word per register (`W = 1`, §4.4): every writer's MAX CASes the
//!   same word, the heaviest word sharing there is;
//! - skewed clocks, one of them stepped back and forth: stale guesses take the slow
//!   path (TRYLOCK in WRITE mode, rewrite), and readers that see a GUESSED tuple twice
//!   lock it in READ mode (§3.2, §3.3).
//!
//! Each test prints the workload seed on failure (`SWARM_SHM_SEED` replays the
//! operation mix; thread interleavings are not reproducible) and saves the history.

mod protocol_support;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use swarm_checker::History;
use swarm_core::FixedClock;
use swarm_core::{
    Client, Clock, NodeId, OpStats, ProtocolConfig, RegisterCache, WriteOutcome, block_on,
    block_on_future,
};
use swarm_shm::{ScratchDir, ShmCluster};

use protocol_support::{
    NODES, PauseBeforeProgress, Shape, Skew, Tally, WallClock, Worker, Workload,
    assert_linearizable, writer_id,
};

const THREADS: u32 = 8;
const OPS_PER_THREAD: u32 = 1500;

/// One multi-threaded run.
struct Variant {
    name: &'static str,
    keys: u32,
    meta_words: u16,
    /// A node that is crashed for every client from the start.
    failed_node: Option<NodeId>,
    /// Each thread's clock skew.
    skew: fn(u32) -> Skew,
}

impl Variant {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            keys: 3,
            meta_words: 4,
            failed_node: None,
            skew: |_| Skew::None,
        }
    }
}

/// Runs `variant`, checks the merged history, and returns the roundtrip tally.
fn run(variant: &Variant) -> Tally {
    let seed = protocol_support::seed();
    let shape = Shape {
        meta_words: variant.meta_words,
        writers: THREADS as u16,
        keys: variant.keys,
        writes_per_writer: OPS_PER_THREAD,
    };
    let dir = ScratchDir::new("swarm-shm-protocol-threads").expect("scratch directory");
    let cluster = Arc::new(
        ShmCluster::create(dir.path(), NODES, shape.node_bytes()).expect("create the cluster"),
    );
    let workload = Workload {
        seed,
        write_percent: 50,
    };
    let start = Barrier::new(THREADS as usize);
    let results: Vec<_> = thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cluster, start) = (&cluster, &start);
                scope.spawn(move || {
                    let fabric = cluster.client_with(0);
                    if let Some(node) = variant.failed_node {
                        fabric.fail_node(node);
                    }
                    let clock = WallClock::new(cluster, (variant.skew)(t));
                    let client = Client::new(
                        fabric,
                        clock,
                        shape.layout(),
                        writer_id(t),
                        ProtocolConfig::default(),
                    )
                    .expect("a client for a writer with a log");
                    let mut worker = Worker::new(client, shape, workload);
                    start.wait();
                    for i in 0..OPS_PER_THREAD {
                        worker.step(&mut |_| {});
                        // A thread finishes hundreds of operations within one time
                        // slice; yielding often interleaves all eight on two cores.
                        if i % 4 == 3 {
                            thread::yield_now();
                        }
                    }
                    (worker.ops, worker.tally)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });

    let mut history = History::new();
    let mut tally = Tally::default();
    for (ops, t) in results {
        tally.merge(&t);
        for op in ops {
            history
                .push(op)
                .expect("recorded operations are well formed");
        }
    }
    let what = format!("{} ({THREADS} threads, seed {seed})", variant.name);
    println!("{what}: {tally}");
    // Failed operations are in the history as crashed ones (outcome unknown).
    assert_linearizable(&history, variant.name, seed);
    assert!(
        tally.errors.is_empty(),
        "{what}: operations failed with a majority alive: {:#?}",
        tally.errors
    );
    tally
}

#[test]
fn threads_on_shared_registers_are_linearizable() {
    let tally = run(&Variant::new("threads"));
    assert!(tally.reads.iter().sum::<u64>() > 0 && tally.writes.iter().sum::<u64>() > 0);
}

#[test]
fn threads_with_a_crashed_node_are_linearizable_and_never_fail() {
    let tally = run(&Variant {
        keys: 2,
        failed_node: Some(NodeId(0)),
        ..Variant::new("threads, node 0 crashed")
    });
    // Key 0's primary and preferred majority include node 0: its steps time out and
    // fall back to the third replica, which costs a roundtrip.
    assert!(
        tally.multi_roundtrip() > 0,
        "no operation noticed the crashed node: {tally}"
    );
}

#[test]
fn threads_sharing_one_metadata_word_are_linearizable() {
    run(&Variant {
        keys: 2,
        meta_words: 1,
        ..Variant::new("threads, W=1")
    });
}

#[test]
fn threads_with_skewed_clocks_are_linearizable() {
    let tally = run(&Variant {
        keys: 2,
        skew: |t| match t {
            0 => Skew::Fixed(40_000),
            1 => Skew::Fixed(-40_000),
            2 => Skew::Flapping {
                amplitude_ns: 30_000,
                period_ns: 200_000,
            },
            _ => Skew::None,
        },
        ..Variant::new("threads, skewed clocks")
    });
    assert!(
        tally.slow_writes() > 0,
        "no stale guess took the slow path: {tally}"
    );
}

// ------------------------------------------------------------------------------
// Deterministic reproductions of what the threaded runs above found.

/// A clock the test sets by hand.
#[derive(Clone, Debug, Default)]
struct ManualClock(Rc<Cell<u64>>);

impl Clock for ManualClock {
    fn ticks(&self) -> u64 {
        self.0.get()
    }
}

/// The largest timestamp tick count in register `key`'s metadata words on `node`.
fn max_ticks(cluster: &ShmCluster, shape: &Shape, key: u32, node: NodeId) -> u64 {
    let layout = shape.layout();
    let mut words = vec![0u8; 8 * usize::from(shape.meta_words)];
    cluster
        .node(node)
        .expect("a node of the cluster")
        .read(
            shape.register(key).offset(0) + layout.meta_offset(),
            &mut words,
        )
        .expect("metadata words are in bounds");
    words
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")) >> TICK_SHIFT)
        .max()
        .unwrap_or(0)
}

/// Bits below the ticks in a metadata word: writer id and flag (SWARM §4.6 encoding).
const TICK_SHIFT: u32 = swarm_core::encoding::WRITER_BITS + swarm_core::encoding::FLAG_BITS;

/// Two writers whose clocks are 40 ticks apart alternate writes on one register.
///
/// SWARM §3.2/§6: the lagging writer's first guess is stale; it takes the slow path
/// once and re-synchronises, after which both writers' guesses are fresh again and
/// every write takes one roundtrip, with timestamps that track the clocks.
///
/// Found by `threads_with_skewed_clocks_are_linearizable`: `Client::allocate_ts(min)`
/// passes the minimum timestamp of a slow-path rewrite (`m.ticks + 1`) to
/// `TimestampGuesser::next`, which adds the re-synchronisation offset as if it were a
/// clock reading. The rewrite lands `offset` ticks above `m`, which makes the other
/// writer's next guess stale by as much, whose rewrite adds its own, larger offset:
/// every write takes the slow path (3 roundtrips) from then on and timestamps grow
/// geometrically (1000, 1042, 1076, 1184, 1350, 1722, 2416, 3844, ...) until writes
/// fail for good with "timestamp ... is past the cluster's horizon" after ~50 rounds.
#[test]
fn stale_guesses_resynchronise_instead_of_inflating_timestamps() {
    let shape = Shape {
        meta_words: 4,
        writers: 2,
        keys: 1,
        writes_per_writer: 200,
    };
    let dir = ScratchDir::new("swarm-shm-protocol-resync").expect("scratch directory");
    let cluster = Arc::new(
        ShmCluster::create(dir.path(), NODES, shape.node_bytes()).expect("create the cluster"),
    );
    let (ahead, behind) = (ManualClock::default(), ManualClock::default());
    let client = |clock: &ManualClock, id| {
        Client::new(
            cluster.client(),
            clock.clone(),
            shape.layout(),
            writer_id(id),
            ProtocolConfig::default(),
        )
        .expect("a client for a writer with a log")
    };
    let (a, b) = (client(&ahead, 0), client(&behind, 1));
    let reg = shape.register(0);
    let (mut cache_a, mut cache_b) = (RegisterCache::new(), RegisterCache::new());
    let mut slow_writes = 0;
    for round in 0..80u64 {
        ahead.0.set(1_000 + 10 * round);
        behind.0.set(960 + 10 * round);
        for (who, c, cache) in [("ahead", &a, &mut cache_a), ("behind", &b, &mut cache_b)] {
            let stats = OpStats::new();
            let out = block_on_future(c.fabric(), c.write(&reg, cache, &stats, b"v"));
            assert!(
                matches!(out, Ok(Ok(WriteOutcome::Written))),
                "round {round}: the {who} writer's write failed: {out:?}"
            );
            if stats.roundtrips() > 1 {
                slow_writes += 1;
            }
        }
        let ticks = max_ticks(&cluster, &shape, 0, reg.replicas.node(0));
        assert!(
            ticks <= 1_000 + 10 * round + 50,
            "round {round}: timestamps run away from the clocks: {ticks} ticks, \
             clocks at {} and {} ({slow_writes} slow-path writes so far)",
            1_000 + 10 * round,
            960 + 10 * round
        );
    }
    assert!(
        slow_writes <= 2,
        "{slow_writes} of 160 writes took the slow path: guesses never became fresh again"
    );
}

/// A write through a crashed primary must not fail when its thread is descheduled
/// while it waits for the fallback deadline (SWARM §2.1: a minority of crashed nodes
/// never stops an operation).
///
/// Found by `threads_with_a_crashed_node_are_linearizable_and_never_fail` (about one
/// run in 25 had one write fail with "the operation stalled: every pending batch waits
/// on a failed memory node"). The executor polls the roundtrip (deadline not reached:
/// pending), then calls `ShmFabric::progress`, which by then finds the deadline
/// passed and nothing in flight but the batch on the crashed node, and returns
/// `false`. `block_on` polls once more: the step falls back and completes, the
/// operation goes on to its next step (here the TRYLOCK of a stale guess), which
/// waits on the crashed node again, and `block_on` reports a stall. A deadline that
/// passed since the last `progress` is an event: `progress` should return `true` for
/// it (the in-process `MemFabric` does, its logical clock makes the deadline tick
/// itself count).
#[test]
fn a_deadline_passing_while_descheduled_is_not_a_stall() {
    let shape = Shape {
        meta_words: 4,
        writers: 2,
        keys: 1,
        writes_per_writer: 10,
    };
    let dir = ScratchDir::new("swarm-shm-protocol-deadline").expect("scratch directory");
    let cluster = Arc::new(
        ShmCluster::create(dir.path(), NODES, shape.node_bytes()).expect("create the cluster"),
    );
    let reg = shape.register(0);
    let fresh = Client::new(
        cluster.client(),
        FixedClock(1_000),
        shape.layout(),
        writer_id(0),
        ProtocolConfig::default(),
    )
    .expect("client");
    block_on(
        fresh.fabric(),
        fresh.write(&reg, &mut RegisterCache::new(), &OpStats::new(), b"first"),
    )
    .expect("write");

    // Descheduled for 200 µs before every `progress`.
    let fabric = PauseBeforeProgress {
        fabric: cluster.client_with(0),
        pause: || thread::sleep(Duration::from_micros(200)),
    };
    fabric.fabric.fail_node(reg.replicas.node(0));
    let stale = Client::new(
        fabric,
        FixedClock(10),
        shape.layout(),
        writer_id(1),
        ProtocolConfig::default(),
    )
    .expect("client");
    let stats = OpStats::new();
    let out = block_on_future(
        stale.fabric(),
        stale.write(&reg, &mut RegisterCache::new(), &stats, b"second"),
    );
    assert!(
        matches!(out, Ok(Ok(WriteOutcome::Written))),
        "a stale write with one crashed node failed after {} roundtrips: {out:?}",
        stats.roundtrips()
    );
}
