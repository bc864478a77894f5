//! Scripted schedules around a recycled log slot (SWARM §4.5, `swarm_core::slot_recycling`).
//!
//! * A reader is held between its metadata read and its value fetch while the slot
//!   of the value it is about to fetch is superseded, recycled and rewritten with a
//!   write of *another register*. The reader has no effective fence (its
//!   `max_op_ns` is a second), so it does reach the slot: it must see that the slot
//!   holds another write, read the register again and return the current value —
//!   not the other register's data, and not an error.
//! * A reader with a short fence is slowed past it: it posts nothing after its
//!   deadline and fails with `Fenced`.
//!
//! Latencies are fixed (1 µs one way, no jitter), so each schedule is exact; each
//! test asserts that it went as scripted.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::Poll;

use swarm_core::encoding::WriterId;
use swarm_core::fabric::Nanos;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Completion, Fabric, FabricError, NodeId, Op, OpStats, ProtocolConfig, ReadValue,
    RegisterCache, RegisterLoc, Replicas, SwarmError, Ticket,
};
use swarm_sim::{Fault, Latency, SimClock, SimConfig, SimFabric, SimRunner, SimWorld};

const US: u64 = 1_000;

/// Registers of 32 B on three nodes; writer 0 has a log of 3 slots (the tombstone's,
/// one live buffer, one spare), writer 1 only reads.
fn layout() -> Layout {
    let shape = |log_base| {
        Layout::builder()
            .payload_max(32)
            .meta_words(2)
            .log_base(log_base)
            .writers(2)
            .slots_per_writer(3)
            .build()
    };
    let bytes = shape(0).expect("valid layout").register_bytes();
    shape((HEADER_SIZE + 4 * bytes).next_multiple_of(4096)).expect("valid layout")
}

fn world(layout: &Layout) -> SimWorld {
    let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
    SimWorld::new(
        3,
        SimConfig::new(3, node_bytes)
            .latency(Latency::new(US, 0))
            .keep_trace(false),
    )
}

fn register(layout: &Layout, index: u64) -> RegisterLoc {
    RegisterLoc::at(
        HEADER_SIZE + index * layout.register_bytes(),
        Replicas::all(3, 0).expect("three replicas"),
    )
}

fn client<F: Fabric>(
    world: &SimWorld,
    fabric: F,
    layout: Layout,
    writer: u32,
    max_op_ns: Nanos,
) -> Client<F, SimClock> {
    client_waiting(world, fabric, layout, writer, max_op_ns, 10 * US)
}

/// A client whose quorum steps wait `slow_after_ns` before falling back.
fn client_waiting<F: Fabric>(
    world: &SimWorld,
    fabric: F,
    layout: Layout,
    writer: u32,
    max_op_ns: Nanos,
    slow_after_ns: Nanos,
) -> Client<F, SimClock> {
    let config = ProtocolConfig::default()
        .with_slow_after_ns(slow_after_ns)
        .with_suspect_ns(1_000_000)
        .with_max_op_ns(max_op_ns)
        .with_delivery_margin_ns(5 * US);
    let writer = WriterId::new(writer).expect("valid writer");
    Client::new(fabric, SimClock::new(world, 100), layout, writer, config).expect("client")
}

/// A client fabric that slows every link of its client by `factor` when the client
/// posts its first value fetch (a READ in the logs), and records the fabric time of
/// every batch it posts.
struct SlowAtFetch {
    inner: SimFabric,
    log_base: u64,
    factor: u32,
    slowed: Cell<bool>,
    posts: Rc<RefCell<Vec<Nanos>>>,
}

impl SlowAtFetch {
    fn new(world: &SimWorld, layout: &Layout, factor: u32) -> Self {
        Self {
            inner: world.client(),
            log_base: layout.log_base(),
            factor,
            slowed: Cell::new(false),
            posts: Rc::default(),
        }
    }

    fn slow_all_links(&self) {
        for node in 0..self.inner.node_count() {
            let fault = Fault::SlowLink(self.inner.id(), NodeId(node as u16), self.factor);
            self.inner.world().apply(fault);
        }
    }
}

impl Fabric for SlowAtFetch {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let fetch = matches!(batch.ops(), [Op::Read { addr, .. }] if *addr >= self.log_base);
        if fetch && !self.slowed.replace(true) {
            self.slow_all_links();
        }
        self.posts.borrow_mut().push(self.inner.now());
        self.inner.post(node, batch)
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }

    fn settled(&self, ticket: Ticket) -> bool {
        self.inner.settled(ticket)
    }

    fn progress(&self) -> bool {
        self.inner.progress()
    }

    fn now(&self) -> Nanos {
        self.inner.now()
    }

    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline)
    }
}

#[test]
fn a_reader_that_meets_its_slot_recycled_reads_again_and_never_returns_foreign_data() {
    let layout = layout();
    let world = world(&layout);
    let mut runner = SimRunner::new(&world);
    let (a, b) = (register(&layout, 0), register(&layout, 1));
    // The writer recycles after a grace of 20 + 2.5 + 5 µs.
    let writer = Rc::new(client(&world, world.client(), layout, 0, 20 * US));
    let wid = writer.fabric().id();
    // The reader's fence is a second: nothing keeps it from the recycled slot. It
    // waits up to 5 ms for a reply before trying other replicas.
    let fabric = SlowAtFetch::new(&world, &layout, 500);
    let reader = client_waiting(&world, fabric, layout, 1, 1_000_000_000, 5_000 * US);
    let rid = reader.fabric().inner.id();
    // The reader ranks the replicas n1, n2, n0: its primary n1 has no in-place copy
    // (the writer's primary n0 has), so it fetches values from their log slots.
    let reader_a = RegisterLoc::at(a.id, Replicas::all(3, 1).expect("three replicas"));

    let write = |at: u64, reg: &RegisterLoc, value: &'static str| {
        let (w, reg) = (writer.clone(), reg.clone());
        runner.spawn_at(at, wid, async move {
            let stats = OpStats::new();
            let outcome = w
                .write(
                    &reg,
                    &mut RegisterCache::default(),
                    &stats,
                    value.as_bytes(),
                )
                .await;
            (outcome, w.slot_counters())
        })
    };
    // `a1` goes to A. The reader reads it at 100 µs and fetches it from its log
    // slot on n1; its links become 500 times slower as it posts that fetch (at
    // about 102 µs, arriving at about 602 µs).
    let a1 = write(0, &a, "a1");
    let reg = reader_a;
    let read = runner.spawn_at(100 * US, rid, async move {
        let stats = OpStats::new();
        let value = reader
            .read(&reg, &mut RegisterCache::default(), &stats)
            .await;
        (
            value,
            stats.recycled_fetches(),
            reader.fabric().slowed.get(),
        )
    });
    // `a2` supersedes `a1` (the writer's own later write completed); after the
    // grace `a1`'s slot is the only free one, so `b1`, a write to register B, lands
    // in it well before the reader's fetch arrives.
    let a2 = write(150 * US, &a, "a2");
    let b1 = write(300 * US, &b, "b1");
    runner.time_limit(1_000_000_000);
    runner.run().expect("the schedule runs to its end");

    for (what, handle) in [("a1", &a1), ("a2", &a2)] {
        let (outcome, _) = handle.take().unwrap_or_else(|| panic!("{what} finished"));
        outcome.unwrap_or_else(|e| panic!("{what} failed: {e}"));
    }
    let (outcome, counters) = b1.take().expect("b1 finished");
    outcome.expect("b1 is written");
    assert!(
        counters.recycled >= 1,
        "as scripted, b1 reused a1's slot: {counters:?}"
    );
    let (value, recycled_fetches, slowed) = read.take().expect("the read finished");
    assert!(slowed, "as scripted, the reader fetched from a log slot");
    assert_eq!(
        value.expect("a recycled slot is no error"),
        ReadValue::Value(b"a2".to_vec()),
        "the reader reads A again and returns its current value"
    );
    assert_eq!(
        recycled_fetches, 1,
        "as scripted, the reader's fetch met a1's slot holding b1"
    );
}

#[test]
fn an_operation_slowed_past_its_fence_posts_nothing_after_it() {
    let layout = layout();
    let world = world(&layout);
    let mut runner = SimRunner::new(&world);
    let a = register(&layout, 0);
    let writer = client(&world, world.client(), layout, 0, 20 * US);
    let wid = writer.fabric().id();
    // A 30 µs fence; the links become 50 times slower at the value fetch.
    let fabric = SlowAtFetch::new(&world, &layout, 50);
    let posts = fabric.posts.clone();
    let reader = client(&world, fabric, layout, 1, 30 * US);
    let rid = reader.fabric().inner.id();
    let reg = a.clone();
    runner.spawn_at(0, wid, async move {
        let stats = OpStats::new();
        let mut cache = RegisterCache::default();
        writer
            .write(&reg, &mut cache, &stats, b"a1")
            .await
            .map(drop)
    });
    runner.at(50 * US, Fault::Crash(NodeId(0)));
    let read = runner.spawn_at(100 * US, rid, async move {
        let stats = OpStats::new();
        let value = reader.read(&a, &mut RegisterCache::default(), &stats).await;
        // The deadline is the operation's own: armed while it runs, disarmed when
        // it returns (so one OpStats can serve operation after operation).
        let disarmed = stats.deadline().is_none();
        (value, disarmed, reader.fabric().slowed.get())
    });
    runner.time_limit(1_000_000_000);
    runner.run().expect("the schedule runs to its end");
    let (value, disarmed, slowed) = read.take().expect("the read finished");
    assert!(slowed, "as scripted, the reader fetched from a log slot");
    assert_eq!(value, Err(SwarmError::Fenced));
    assert!(disarmed, "the read's fence outlived the read");
    // The read started at 100 us with a 30 us fence.
    let deadline = 100 * US + 30 * US;
    let posts = posts.borrow();
    assert!(
        posts.len() >= 2,
        "as scripted, the reader posted: {posts:?}"
    );
    assert!(
        posts.iter().all(|&at| at <= deadline),
        "posts after the deadline {deadline}: {posts:?}"
    );
}
