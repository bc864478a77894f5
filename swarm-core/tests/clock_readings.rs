//! Fabric clock readings per common-case operation, and the operation fence they
//! feed: a Safe-Guess read reads the fabric clock once (the fence check of its only
//! burst of posts, which also arms its deadline), a write twice (that check, and the
//! stamp of its superseded slots after its round), and every batch either posts
//! carries the deadline armed from the first reading.

use std::cell::{Cell, RefCell};
use std::task::Poll;

use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Nanos, Submitted, Ticket};
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Completion, Fabric, FabricError, FixedClock, MemCluster, MemFabric, NodeId,
    OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, SwarmError,
    WriteOutcome, block_on_future,
};

/// The in-process fabric, counting the readings of its clock ([`Fabric::now`]) and
/// recording the deadline of every batch posted.
struct Clocked {
    inner: MemFabric,
    readings: Cell<u32>,
    /// The value of the first reading since the last reset.
    first: Cell<Option<Nanos>>,
    deadlines: RefCell<Vec<Option<Nanos>>>,
    /// Added to the inner clock: lets a test move time forward.
    skew: Cell<Nanos>,
    /// After this many more batches are handed to the fabric, the clock jumps by
    /// `jump` (a client stopped inside its burst of posts).
    jump_after: Cell<Option<u32>>,
    jump: Cell<Nanos>,
    /// Whether batches complete inside `submit` (the immediate path), as on
    /// shared memory, or only once polled (the general path).
    immediate: bool,
}

impl Clocked {
    fn reset(&self) {
        self.readings.set(0);
        self.first.set(None);
        self.deadlines.borrow_mut().clear();
    }

    /// A batch is handed over: counts down to the jump.
    fn handed(&self) {
        match self.jump_after.get() {
            Some(0) | None => {}
            Some(1) => {
                self.jump_after.set(None);
                self.skew.set(self.skew.get() + self.jump.get());
            }
            Some(n) => self.jump_after.set(Some(n - 1)),
        }
    }
}

impl Fabric for Clocked {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.deadlines.borrow_mut().push(batch.deadline());
        let ticket = self.inner.post(node, batch);
        self.handed();
        ticket
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        self.deadlines.borrow_mut().push(batch.deadline());
        if !self.immediate {
            let ticket = self.inner.post(node, core::mem::take(batch));
            self.handed();
            return Submitted::Posted(ticket);
        }
        let submitted = self.inner.submit(node, batch, reply);
        self.handed();
        submitted
    }
    fn completes_in_submit(&self) -> bool {
        self.immediate && self.inner.completes_in_submit()
    }
    fn post_detached(&self, node: NodeId, batch: &mut Batch) {
        self.deadlines.borrow_mut().push(batch.deadline());
        self.inner.post_detached(node, batch);
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket);
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> Nanos {
        self.readings.set(self.readings.get() + 1);
        let now = self.inner.now() + self.skew.get();
        if self.first.get().is_none() {
            self.first.set(Some(now));
        }
        now
    }
    fn recent_now(&self) -> Nanos {
        self.inner.recent_now() + self.skew.get()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline.saturating_sub(self.skew.get()));
    }
    fn give_back(&self, buffer: Vec<u8>) {
        self.inner.give_back(buffer);
    }
}

const MAX_OP_NS: Nanos = 1_000;

fn client(cluster: &MemCluster) -> Client<Clocked, FixedClock> {
    client_with(cluster, true)
}

fn client_with(cluster: &MemCluster, immediate: bool) -> Client<Clocked, FixedClock> {
    let layout = Layout::builder()
        .payload_max(64)
        .meta_words(8)
        .log_base(1 << 16)
        .writers(4)
        .slots_per_writer(64)
        .build()
        .unwrap();
    let fabric = Clocked {
        inner: cluster.client(),
        readings: Cell::new(0),
        first: Cell::new(None),
        deadlines: RefCell::new(Vec::new()),
        skew: Cell::new(0),
        jump_after: Cell::new(None),
        jump: Cell::new(0),
        immediate,
    };
    Client::new(
        fabric,
        FixedClock(1_000),
        layout,
        WriterId::new(1).unwrap(),
        ProtocolConfig::default().with_max_op_ns(MAX_OP_NS),
    )
    .unwrap()
}

fn register() -> RegisterLoc {
    RegisterLoc::at(4096, Replicas::all(3, 0).unwrap())
}

/// A common-case read reads the fabric clock once and a write twice; each batch they
/// post (the write's background VERIFIED marks included) carries the deadline armed
/// from the first reading, and the deadline is disarmed once the operation returns.
#[test]
fn common_reads_read_the_clock_once_and_writes_twice() {
    let cluster = MemCluster::new(3, 1 << 20);
    let client = client(&cluster);
    let fabric = client.fabric();
    let reg = register();
    let mut cache = RegisterCache::new();
    for i in 0..4u8 {
        fabric.reset();
        let stats = OpStats::new();
        let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[i; 40]));
        assert_eq!(written, Ok(Ok(WriteOutcome::Written)), "write {i}");
        assert_eq!(stats.roundtrips(), 1, "write {i}: the common case");
        assert_eq!(fabric.readings.get(), 2, "write {i}: fabric clock readings");
        let deadline = fabric.first.get().map(|first| first + MAX_OP_NS);
        let deadlines = fabric.deadlines.borrow().clone();
        assert!(deadlines.len() >= 2, "write {i}: posts to a majority");
        assert!(
            deadlines.iter().all(|&d| d == deadline),
            "write {i}: batch deadlines {deadlines:?}, armed {deadline:?}"
        );
        assert!(!stats.is_armed(), "write {i}: disarmed on return");

        fabric.reset();
        let stats = OpStats::new();
        let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
        assert_eq!(read, Ok(Ok(ReadValue::Value(vec![i; 40]))), "read {i}");
        assert_eq!(stats.roundtrips(), 1, "read {i}: the common case");
        assert_eq!(fabric.readings.get(), 1, "read {i}: fabric clock readings");
        let deadline = fabric.first.get().map(|first| first + MAX_OP_NS);
        let deadlines = fabric.deadlines.borrow().clone();
        assert!(deadlines.len() >= 2, "read {i}: reads a majority");
        assert!(
            deadlines.iter().all(|&d| d == deadline),
            "read {i}: batch deadlines {deadlines:?}, armed {deadline:?}"
        );
        assert!(!stats.is_armed(), "read {i}: disarmed on return");
    }
}

/// An operation inside another keeps the enclosing deadline and reads the clock for
/// nothing but its fence checks; one whose enclosing deadline passed posts nothing.
#[test]
fn an_enclosing_deadline_is_kept_and_still_fences() {
    let cluster = MemCluster::new(3, 1 << 20);
    let client = client(&cluster);
    let fabric = client.fabric();
    let reg = register();
    let mut cache = RegisterCache::new();
    let stats = OpStats::new();
    let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[7; 40]));
    assert_eq!(written, Ok(Ok(WriteOutcome::Written)));

    let start = fabric.now();
    let stats = OpStats::new();
    let _enclosing = stats.arm_deadline(start + 10 * MAX_OP_NS);
    fabric.reset();
    let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
    assert_eq!(read, Ok(Ok(ReadValue::Value(vec![7; 40]))));
    assert_eq!(fabric.readings.get(), 1, "the fence check only");
    assert!(
        fabric
            .deadlines
            .borrow()
            .iter()
            .all(|&d| d == Some(start + 10 * MAX_OP_NS)),
        "the enclosing deadline"
    );

    // Past the enclosing deadline: fenced, from the one reading, taken after the
    // step's reads (a step that only reads posts nothing that changes memory).
    fabric.skew.set(20 * MAX_OP_NS);
    fabric.reset();
    let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
    assert_eq!(read, Ok(Err(SwarmError::Fenced)));
    assert_eq!(fabric.readings.get(), 1);
}

/// A read stopped inside its burst of posts past its deadline does not return what
/// it counted (docs/pauses.md, H3': answers from both sides of a stop may straddle
/// a repair's copy). The clock jumps past the enclosing deadline (a SWARM-KV
/// operation's) once the first of the read's batches was handed over; the read
/// must fail with `Fenced`, on the immediate path (batches complete inside
/// `submit`: the step's reading comes after its burst) and on the general one (the
/// read's return is confirmed).
#[test]
fn a_read_stopped_inside_its_burst_past_its_deadline_returns_nothing() {
    for immediate in [true, false] {
        let cluster = MemCluster::new(3, 1 << 20);
        let client = client_with(&cluster, immediate);
        let fabric = client.fabric();
        let reg = register();
        let mut cache = RegisterCache::new();
        let stats = OpStats::new();
        let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[7; 40]));
        assert_eq!(
            written,
            Ok(Ok(WriteOutcome::Written)),
            "immediate {immediate}"
        );
        for _ in 0..50 {
            fabric.progress();
        }

        // Within the deadline all along: the value.
        let stats = OpStats::new();
        let _enclosing = stats.arm_deadline(fabric.now() + MAX_OP_NS);
        let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
        assert_eq!(
            read,
            Ok(Ok(ReadValue::Value(vec![7; 40]))),
            "immediate {immediate}"
        );

        // Stopped after its first batch, past the deadline.
        let stats = OpStats::new();
        let _enclosing = stats.arm_deadline(fabric.now() + MAX_OP_NS);
        fabric.jump.set(20 * MAX_OP_NS);
        fabric.jump_after.set(Some(1));
        let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
        assert_eq!(
            read,
            Ok(Err(SwarmError::Fenced)),
            "immediate {immediate}: a read counted across its deadline returned"
        );
    }
}

/// A write whose enclosing deadline passed before it began posts nothing, on the
/// immediate path (its first round without a `Roundtrip`, `Client::write_round_now`:
/// stores, so the fence is checked before the burst, not after it as a read's) and
/// on the general one: a store posted past the deadline may land in a slot that was
/// recycled meanwhile (docs/pauses.md).
#[test]
fn a_write_past_its_deadline_posts_nothing() {
    for immediate in [true, false] {
        let cluster = MemCluster::new(3, 1 << 20);
        let client = client_with(&cluster, immediate);
        let fabric = client.fabric();
        let reg = register();
        let mut cache = RegisterCache::new();
        let stats = OpStats::new();
        let _enclosing = stats.arm_deadline(fabric.now() + MAX_OP_NS);
        fabric.skew.set(20 * MAX_OP_NS);
        fabric.reset();
        let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[7; 40]));
        assert_eq!(
            written,
            Ok(Err(SwarmError::Fenced)),
            "immediate {immediate}"
        );
        assert!(
            fabric.deadlines.borrow().is_empty(),
            "immediate {immediate}: batches posted past the deadline: {:?}",
            fabric.deadlines.borrow()
        );
    }
}
