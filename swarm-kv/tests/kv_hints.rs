//! Interleaved KV operations (`OpStats::interleaved`, what `swarm bench --inflight N`
//! runs above one in flight) hint the memory of their first step, then yield, so that
//! every operation in flight on a thread has hinted before any of them touches its
//! own memory and their cache misses overlap (ARCHITECTURE "Speed on shared memory").
//!
//! Checked on shared memory through a traced fabric (`Traced`) that records, in
//! order, every hint and every batch: a get or update whose key is cached hints its
//! register; one whose key is not (a fresh client) hints its index buckets first.
//! Without interleaving (the control case, which shows the test tells the two apart)
//! the first operation posts before the others have hinted anything. The operations'
//! answers are checked too.

use std::cell::RefCell;
use std::ops::Range;

use swarm_core::fabric::{Op, Traced, Tracer};
use swarm_core::{Batch, LocalExecutor, NodeId, OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::SystemClock;
use swarm_kv::{KvClient, ShmStore};
use swarm_shm::{EmulatedFabric, ScratchDir};

/// Operations in flight at once.
const OPS: usize = 4;

/// What a [`Recorder`] saw, in order.
#[derive(Clone, Debug)]
enum Event {
    /// A hint of `addr..addr + len` on a node.
    Hint { addr: u64, len: u64 },
    /// A batch posted (waited for or in the background): its operations' addresses.
    Post { addrs: Vec<u64> },
}

/// A tracer that records every hint and batch, in order.
#[derive(Default)]
struct Recorder {
    events: RefCell<Vec<Event>>,
}

impl Recorder {
    /// Forgets what was recorded.
    fn reset(&self) {
        self.events.borrow_mut().clear();
    }
}

impl Tracer for Recorder {
    fn batch(&self, _: NodeId, batch: &Batch) {
        let addrs = batch
            .ops()
            .iter()
            .map(|op| match op {
                Op::Read { addr, .. } | Op::Write { addr, .. } | Op::Cas { addr, .. } => *addr,
            })
            .collect();
        self.events.borrow_mut().push(Event::Post { addrs });
    }
    fn prefetch(&self, _: NodeId, addr: u64, len: u64) {
        self.events.borrow_mut().push(Event::Hint { addr, len });
    }
}

type Client = KvClient<Traced<EmulatedFabric, Recorder>, SystemClock>;

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 4,
        replicas: 3,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

fn client(store: &ShmStore) -> Client {
    let header = *store.header();
    let mut config = store.config();
    // No background slot-recycling check while the operations run: it reads the same
    // metadata words, and its posts would be taken for theirs.
    config.protocol = config
        .protocol
        .with_slot_recycling_interval_ns(3_600 * 1_000_000_000);
    KvClient::connect(
        Traced::new(store.fabric(), Recorder::default()),
        SystemClock::new(header.epoch_unix_ns, header.tick_ns),
        *store.layout(),
        config,
    )
    .expect("connect")
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn value(i: usize, round: u8) -> Vec<u8> {
    vec![round.wrapping_mul(16).wrapping_add(i as u8); 20]
}

fn stats(interleaved: bool) -> OpStats {
    if interleaved {
        OpStats::interleaved()
    } else {
        OpStats::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Get,
    Update,
}

/// Runs `OPS` operations of `kind` at once on `c`, one per key, and checks their
/// answers (an update writes round `round`'s values, a get expects them).
fn run(c: &Client, kind: Kind, interleaved: bool, round: u8) {
    // Past the default reclaim interval (1 ms), as on a slow host: the test does
    // not depend on how fast the host is (the client's check is off, see `client`).
    std::thread::sleep(std::time::Duration::from_millis(3));
    c.fabric().tracer().reset();
    let mut executor = LocalExecutor::new();
    for i in 0..OPS {
        executor.spawn(async move {
            let stats = stats(interleaved);
            match kind {
                Kind::Get => c.get(&key(i), &stats).await.map(|v| (i, v)),
                Kind::Update => c
                    .update(&key(i), &value(i, round), &stats)
                    .await
                    .map(|found| (i, found.then(|| value(i, round)))),
            }
            .map_err(|error| error.to_string())
        });
    }
    let mut answers = Vec::new();
    executor
        .run(c.fabric(), |_, answer| answers.push(answer))
        .expect("no stall");
    answers.sort_by_key(|answer| answer.as_ref().map(|(i, _)| *i).ok());
    let expected: Vec<_> = (0..OPS).map(|i| Ok((i, Some(value(i, round))))).collect();
    assert_eq!(answers, expected, "{kind:?} (interleaved: {interleaved})");
}

/// How many of `lines` (one per operation) were hinted before the first batch that
/// touches any address in `area`.
fn hinted_before_first_post(events: &[Event], lines: &[Range<u64>], area: &Range<u64>) -> usize {
    let first_post = events
        .iter()
        .position(|e| matches!(e, Event::Post { addrs } if addrs.iter().any(|a| area.contains(a))))
        .expect("the operations posted to the area");
    lines
        .iter()
        .filter(|line| {
            events[..first_post].iter().any(|e| {
                matches!(e, Event::Hint { addr, len }
                    if *addr < line.end && line.start < addr + len)
            })
        })
        .count()
}

/// Registers of the keys, as the addresses of their register slots.
fn register_lines(c: &Client) -> Vec<Range<u64>> {
    let stats = OpStats::new();
    let f = c.fabric();
    (0..OPS)
        .map(|i| {
            let register = block_on(f, c.index().resolve(f, &stats, &key(i)))
                .expect("resolve")
                .expect("mapped");
            let addr = c.register_loc(register).expect("register").offset(0);
            addr..addr + 8
        })
        .collect()
}

#[test]
fn interleaved_gets_and_updates_of_cached_keys_hint_every_register_before_any_posts() {
    let dir = ScratchDir::new("kv-hints-warm").unwrap();
    let store = store(&dir);
    let c = client(&store);
    for i in 0..OPS {
        block_on(c.fabric(), c.insert(&key(i), &value(i, 0), &OpStats::new())).expect("insert");
    }
    let registers = register_lines(&c);
    let layout = *c.layout();
    let register_area = layout.registers_at..layout.swarm.log_base();
    let mut round = 0;
    for kind in [Kind::Get, Kind::Update] {
        for interleaved in [true, false] {
            if kind == Kind::Update {
                round += 1;
            }
            run(&c, kind, interleaved, round);
            let events = c.fabric().tracer().events.borrow();
            let before = hinted_before_first_post(&events, &registers, &register_area);
            let expected = if interleaved { OPS } else { 1 };
            assert_eq!(
                before, expected,
                "{kind:?} of cached keys (interleaved: {interleaved}): registers hinted \
                 before the first register post; events: {events:?}"
            );
        }
    }
}

#[test]
fn interleaved_gets_of_uncached_keys_hint_their_buckets_before_any_reads_them() {
    let dir = ScratchDir::new("kv-hints-cold").unwrap();
    let store = store(&dir);
    let writer = client(&store);
    for i in 0..OPS {
        block_on(
            writer.fabric(),
            writer.insert(&key(i), &value(i, 0), &OpStats::new()),
        )
        .expect("insert");
    }
    let layout = *writer.layout();
    let index_area = layout.index_at..layout.registers_at;
    // What one get hints before it reads the index: the control case measures it.
    let mut per_get = None;
    for interleaved in [false, true] {
        // A fresh client: no key is cached, every get asks the index first.
        let c = client(&store);
        run(&c, Kind::Get, interleaved, 0);
        let events = c.fabric().tracer().events.borrow();
        let first_index_post = events
            .iter()
            .position(|e| matches!(e, Event::Post { addrs } if addrs.iter().any(|a| index_area.contains(a))))
            .expect("the gets read the index");
        let bucket_hints = events[..first_index_post]
            .iter()
            .filter(|e| matches!(e, Event::Hint { addr, .. } if index_area.contains(addr)))
            .count();
        match per_get {
            // Without interleaving, the first get posts before the others run: the
            // hints are its own.
            None => {
                assert!(
                    bucket_hints > 0,
                    "a get hints its buckets; events: {events:?}"
                );
                per_get = Some(bucket_hints);
            }
            // Each key has its own buckets, hinted on as many nodes.
            Some(one) => assert_eq!(
                bucket_hints,
                OPS * one,
                "every interleaved get hints its buckets before the first index read \
                 ({one} hints per get); events: {events:?}"
            ),
        }
    }
}
