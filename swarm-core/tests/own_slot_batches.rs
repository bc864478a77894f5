//! A writer's own buffer batch that lands after its slot's reuse (docs/pauses.md, H9).
//!
//! The fabric contract orders the operations of one batch, not two batches to one node.
//! Writer W writes `t1` to register X; its batch to replica C (the record into
//! `t1`'s slot, then the metadata CAS) is held in flight, a slow queue pair, and the
//! write returns with A and B. W writes X on (B now down for it, so its writes go to A
//! and C) until `t1`'s slot comes up for reuse, its virtual clock past every grace.
//! Then C's held batch lands, and A loses its memory (down for the reader), so a read
//! sees B and C only.
//!
//! Before the fix, W reused `t1`'s slot for a later write `t2` while the batch was in
//! flight: it landed on C over `t2`'s record, and the read, finding `t2` on C with no
//! intact copy of its record anywhere, did not return `t2`. With the fix, the slot
//! stays out of use until the batch completed, and the read returns W's newest value.

use std::cell::RefCell;
use std::ops::Range;
use std::task::Poll;

use swarm_core::encoding::{Timestamp, Tsp, WriterId};
use swarm_core::fabric::FailureCause;
use swarm_core::layout::{Layout, decode_record};
use swarm_core::{
    Batch, Client, Completion, Fabric, FabricError, FixedClock, MemCluster, MemFabric, NodeId, Op,
    OpStats, ProtocolConfig, RegisterCache, RegisterLoc, Replicas, Ticket, block_on,
    block_on_future,
};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);
const C: NodeId = NodeId(2);
const LOG_BASE: u64 = 1 << 16;
const GUARDS: u64 = 2048;
/// The grace of these clients in ticks of their fabric's logical clock
/// (`max_op_ns` 3, `· 9/7` up, no delivery margin).
const GRACE: u64 = 4;

fn layout(guards: bool) -> Layout {
    let builder = Layout::builder()
        .payload_max(16)
        .meta_words(2)
        .log_base(LOG_BASE)
        .writers(4)
        .slots_per_writer(4);
    let builder = if guards {
        builder.write_back_guards(GUARDS, 8)
    } else {
        builder
    };
    builder.build().unwrap()
}

/// Register `i`: 512 bytes apart from 4096, on all three nodes.
fn reg(i: u64) -> RegisterLoc {
    RegisterLoc::at(4096 + i * 512, Replicas::all(3, i).unwrap())
}

/// What became of a batch posted through a [`Gate`] rather than to its inner fabric.
enum Entry {
    /// Posted to a node that is down for this client: fails once polled.
    Failed(Option<FabricError>),
    /// Held in flight (a slow queue pair), then landed.
    Held(Option<(NodeId, Batch)>),
    Landed(Ticket),
}

const OURS: u32 = 1 << 31;

/// A client's fabric with nodes that are down for it, and batches to one node that
/// write into a range, held in flight until [`Gate::land`].
struct Gate {
    inner: MemFabric,
    down: RefCell<Vec<NodeId>>,
    /// Batches to these nodes that write into this range are held.
    hold: RefCell<Option<(Vec<NodeId>, Range<u64>)>>,
    ours: RefCell<Vec<Entry>>,
}

impl Gate {
    fn new(cluster: &MemCluster) -> Self {
        Self {
            inner: cluster.client(),
            down: RefCell::default(),
            hold: RefCell::default(),
            ours: RefCell::default(),
        }
    }

    fn held(&self) -> usize {
        let ours = self.ours.borrow();
        ours.iter()
            .filter(|e| matches!(e, Entry::Held(Some(_))))
            .count()
    }

    /// The held batches reach memory now, in the order they were posted.
    fn land(&self) {
        *self.hold.borrow_mut() = None;
        for entry in self.ours.borrow_mut().iter_mut() {
            if let Entry::Held(held) = entry
                && let Some((node, batch)) = held.take()
            {
                *entry = Entry::Landed(self.inner.post(node, batch));
            }
        }
    }

    fn ours(&self, entry: Entry) -> Ticket {
        let mut ours = self.ours.borrow_mut();
        ours.push(entry);
        Ticket(OURS | (ours.len() as u32 - 1))
    }
}

impl Fabric for Gate {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.down.borrow().contains(&node) {
            return self.ours(Entry::Failed(Some(FabricError::NodeFailed {
                node,
                cause: FailureCause::Crashed,
            })));
        }
        let held = self.hold.borrow().as_ref().is_some_and(|(nodes, range)| {
            nodes.contains(&node)
                && batch
                    .ops()
                    .iter()
                    .any(|op| matches!(op, Op::Write { addr, .. } if range.contains(addr)))
        });
        if held {
            return self.ours(Entry::Held(Some((node, batch))));
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 & OURS == 0 {
            return self.inner.poll(ticket);
        }
        let mut ours = self.ours.borrow_mut();
        match &mut ours[(ticket.0 & !OURS) as usize] {
            Entry::Failed(error) => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => Poll::Ready(Err(FabricError::UnknownTicket(ticket.0))),
            },
            Entry::Held(_) => Poll::Pending,
            Entry::Landed(inner) => self.inner.poll(*inner),
        }
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & OURS == 0 {
            self.inner.forget(ticket);
        } else if let Entry::Landed(inner) = self.ours.borrow()[(ticket.0 & !OURS) as usize] {
            self.inner.forget(inner);
        }
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn wake_at(&self, deadline: u64) {
        self.inner.wake_at(deadline);
    }
}

type Node = Client<Gate, FixedClock>;

/// A client whose steps fall back to the third replica one tick after a slow one.
fn client(cluster: &MemCluster, layout: Layout, writer: u32, clock: u64) -> Node {
    let config = ProtocolConfig::default()
        .with_slow_after_ns(1)
        .with_max_op_ns(3)
        .with_delivery_margin_ns(0);
    assert_eq!(config.grace_ns(), GRACE);
    Client::new(
        Gate::new(cluster),
        FixedClock(clock),
        layout,
        WriterId::new(writer).unwrap(),
        config,
    )
    .unwrap()
}

fn write(c: &Node, r: &RegisterLoc, v: &[u8]) -> Result<(), swarm_core::SwarmError> {
    let stats = OpStats::new();
    block_on(c.fabric(), c.write(r, &mut RegisterCache::new(), &stats, v)).map(|_| ())
}

/// One slot-recycling step of `c`, then its logical clock past a grace, then another.
fn recycle(c: &Node) {
    block_on_future(c.fabric(), c.recycle_slots_step(8)).unwrap();
    for _ in 0..=GRACE {
        c.fabric().progress();
    }
    block_on_future(c.fabric(), c.recycle_slots_step(8)).unwrap();
}

/// Reads `len` bytes at `addr` of `node`, straight from memory.
fn peek(cluster: &MemCluster, node: NodeId, addr: u64, len: u32) -> Vec<u8> {
    let fabric = cluster.client();
    let ticket = fabric.post(node, Batch::read(addr, len));
    match fabric.poll(ticket) {
        Poll::Ready(Ok(mut completion)) => completion.take_read(0).unwrap(),
        other => panic!("direct read failed: {other:?}"),
    }
}

/// The largest word of `r`'s metadata on `node`.
fn max_word(cluster: &MemCluster, layout: &Layout, node: NodeId, r: &RegisterLoc) -> Tsp {
    let bytes = peek(
        cluster,
        node,
        r.offset(0) + layout.meta_offset(),
        layout.meta_bytes() as u32,
    );
    let max = bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .max()
        .unwrap();
    Tsp::from_word(max)
}

/// The write whose record the slot of `ts` holds on `node`, if one validates.
fn record_in_slot(
    cluster: &MemCluster,
    layout: &Layout,
    node: NodeId,
    ts: Timestamp,
) -> Option<Timestamp> {
    let addr = layout.buffer_addr(ts).unwrap() + 8;
    let mut bytes = peek(cluster, node, addr, layout.record_bytes() as u32);
    decode_record(&mut bytes, layout.payload_max()).map(|r| r.tsp.ts())
}

struct Schedule {
    cluster: MemCluster,
    layout: Layout,
    w: Node,
    /// W's register: one whose quorum steps ask C first or second, so that C gets
    /// a batch of `t1`'s write.
    x: RegisterLoc,
    t1: Timestamp,
}

impl Schedule {
    /// W writes `t1` to X; its batch to C is held in flight and the write returns
    /// with A and B.
    fn new(guards: bool) -> Self {
        let cluster = MemCluster::new(3, 1 << 20);
        let layout = layout(guards);
        let w = client(&cluster, layout, 1, 100);
        let x = (0..16)
            .map(reg)
            .find(|r| r.replicas.node(0) == C || r.replicas.node(1) == C)
            .expect("a register whose quorum steps ask C first");
        *w.fabric().hold.borrow_mut() = Some((vec![C], LOG_BASE..LOG_BASE + layout.log_bytes()));
        write(&w, &x, b"t1").expect("W's write returns with A and B");
        assert_eq!(w.fabric().held(), 1, "W's batch to C is in flight");
        // Only that batch is held: W's later batches to C go through.
        *w.fabric().hold.borrow_mut() = None;
        let t1 = max_word(&cluster, &layout, A, &x).ts();
        assert_eq!(t1.writer(), WriterId::new(1).unwrap());
        assert_eq!(max_word(&cluster, &layout, B, &x).ts(), t1);
        assert!(max_word(&cluster, &layout, C, &x).is_empty());
        Self {
            cluster,
            layout,
            w,
            x,
            t1,
        }
    }

    /// W writes X on (to A and C: B is down for it), recycling between writes, until
    /// a write reuses `t1`'s slot (returned), or 40 times (`None`). The value of
    /// write `i` is `[i]`.
    fn write_until_reuse(&self) -> Option<(Timestamp, u8)> {
        let slot = self.layout.slot_of(self.t1);
        *self.w.fabric().down.borrow_mut() = vec![B];
        let mut reused = None;
        for i in 0..40u8 {
            recycle(&self.w);
            write(&self.w, &self.x, &[i]).unwrap();
            let newest = max_word(&self.cluster, &self.layout, A, &self.x).ts();
            assert_eq!(
                max_word(&self.cluster, &self.layout, C, &self.x).ts(),
                newest
            );
            if self.layout.slot_of(newest) == slot {
                reused = Some((newest, i));
                break;
            }
        }
        self.w.fabric().down.borrow_mut().clear();
        reused
    }

    /// A read by another client that sees B and C only (A lost its memory).
    fn read_without_a(&self) -> Result<(Timestamp, Vec<u8>), swarm_core::SwarmError> {
        let r = client(&self.cluster, self.layout, 2, 50);
        r.fabric().down.borrow_mut().push(A);
        let stats = OpStats::new();
        let mut cache = RegisterCache::new();
        block_on(r.fabric(), r.max_read(&self.x, &mut cache, &stats, false))
            .map(|(t, value)| (t.ts(), value))
    }
}

fn a_write_batch_in_flight_keeps_its_slot_until_it_landed(guards: bool) {
    let s = Schedule::new(guards);
    let reused = s.write_until_reuse();
    assert!(
        s.w.slot_counters().recycled > 0,
        "W recycled its other slots meanwhile"
    );
    // C's held batch lands now (W's process woke up, or its queue pair moved on).
    s.w.fabric().land();
    if let Some((t2, i)) = reused {
        // What a reuse with the batch in flight did: t2's record on C is t1's now,
        // and a read that sees B and C does not return t2.
        assert_eq!(
            s.read_without_a(),
            Ok((t2, vec![i])),
            "a read without A returns W's newest write"
        );
        assert_eq!(
            record_in_slot(&s.cluster, &s.layout, C, t2),
            Some(t2),
            "W's late batch overwrote t2's record on C"
        );
    }
    assert_eq!(
        reused, None,
        "W reused t1's slot while its batch to C was in flight"
    );
    assert_eq!(
        record_in_slot(&s.cluster, &s.layout, C, s.t1),
        Some(s.t1),
        "t1's late batch wrote t1's record into t1's slot on C"
    );

    // The batch completed: W's next recycling gives the slot back, and its reuse is
    // intact on every node that holds it.
    let (t2, i) = s
        .write_until_reuse()
        .expect("W reuses t1's slot once its batch landed");
    for node in [A, C] {
        assert_eq!(
            record_in_slot(&s.cluster, &s.layout, node, t2),
            Some(t2),
            "t2's record on {node:?}"
        );
    }
    assert_eq!(s.read_without_a().unwrap(), (t2, vec![i]));
}

#[test]
fn a_write_batch_in_flight_keeps_its_slot_until_it_landed_without_guards() {
    a_write_batch_in_flight_keeps_its_slot_until_it_landed(false);
}

#[test]
fn a_write_batch_in_flight_keeps_its_slot_until_it_landed_with_guards() {
    a_write_batch_in_flight_keeps_its_slot_until_it_landed(true);
}

/// A write that fails (too few replicas answer) while its batch to C is in flight
/// keeps its slot out of use too, until the batch landed: its round ends with the
/// batch outstanding, as when an operation is dropped midway.
#[test]
fn a_failed_write_with_a_batch_in_flight_keeps_its_slot_until_it_landed() {
    let cluster = MemCluster::new(3, 1 << 20);
    let layout = layout(false);
    let w = client(&cluster, layout, 1, 100);
    let x = (0..16)
        .map(reg)
        .find(|r| r.replicas.node(0) == C || r.replicas.node(1) == C)
        .unwrap();
    // C's batch is held, and the other two nodes are down for W.
    *w.fabric().hold.borrow_mut() = Some((vec![C], LOG_BASE..LOG_BASE + layout.log_bytes()));
    *w.fabric().down.borrow_mut() = vec![A, B];
    assert!(write(&w, &x, b"t1").is_err(), "W's write needs a majority");
    assert_eq!(w.fabric().held(), 1, "W's batch to C is in flight");
    w.fabric().down.borrow_mut().clear();
    *w.fabric().hold.borrow_mut() = None;
    let t1 = held_record(&w);
    let s = Schedule {
        cluster,
        layout,
        w,
        x,
        t1,
    };
    let reused = s.write_until_reuse();
    s.w.fabric().land();
    assert_eq!(
        reused, None,
        "W reused the failed write's slot while its batch was in flight"
    );
    assert_eq!(
        record_in_slot(&s.cluster, &s.layout, C, t1),
        Some(t1),
        "the late batch wrote t1's record into t1's slot on C"
    );
    let (t2, _) = s
        .write_until_reuse()
        .expect("W reuses the slot once the batch landed");
    for node in [A, C] {
        assert_eq!(record_in_slot(&s.cluster, &s.layout, node, t2), Some(t2));
    }
}

/// The write whose record the held batch of `w` carries.
fn held_record(w: &Node) -> Timestamp {
    let ours = w.fabric().ours.borrow();
    ours.iter()
        .filter_map(|entry| match entry {
            Entry::Held(Some((_, batch))) => Some(batch),
            _ => None,
        })
        .flat_map(|batch| batch.ops())
        .find_map(|op| match op {
            Op::Write { data, .. } => {
                let mut bytes = data.to_vec();
                decode_record(&mut bytes, 16).map(|record| record.tsp.ts())
            }
            _ => None,
        })
        .expect("a record in the held batch")
}

/// A write whose operation is still alive, not polled, with batches to B and C in
/// flight (its round waits for them), keeps its slot out of use even once another
/// writer superseded it and the grace ran out: its round has not handed its tickets
/// over yet, so the slot's write is registered as being written.
#[test]
fn a_write_alive_with_batches_in_flight_keeps_its_slot_until_it_landed() {
    let cluster = MemCluster::new(3, 1 << 20);
    let layout = layout(false);
    let w = client(&cluster, layout, 1, 100);
    let x = (0..16)
        .map(reg)
        .find(|r| r.replicas.node(0) == C || r.replicas.node(1) == C)
        .unwrap();
    let y = reg(x.id / 512);
    assert_ne!(x.id, y.id);
    *w.fabric().hold.borrow_mut() = Some((vec![B, C], LOG_BASE..LOG_BASE + layout.log_bytes()));
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let mut op = Box::pin(w.write(&x, &mut cache, &stats, b"t1"));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..100 {
        assert!(op.as_mut().poll(&mut cx).is_pending(), "W's write waits");
        if w.fabric().held() == 2 {
            break;
        }
        w.fabric().progress();
    }
    assert_eq!(w.fabric().held(), 2, "W's batches to B and C are in flight");
    *w.fabric().hold.borrow_mut() = None;
    let t1 = held_record(&w);
    // Another writer supersedes t1 on every node; W learns it and its grace runs out.
    let other = client(&cluster, layout, 3, 200);
    write(&other, &x, b"x").unwrap();
    let slot = layout.slot_of(t1);
    let write_until_reuse = || {
        for i in 0..40u8 {
            recycle(&w);
            write(&w, &y, &[i]).unwrap();
            let newest = max_word(&cluster, &layout, A, &y)
                .max(max_word(&cluster, &layout, B, &y))
                .ts();
            if layout.slot_of(newest) == slot {
                return Some(newest);
            }
        }
        None
    };
    let reused = write_until_reuse();
    assert!(w.slot_counters().recycled > 0, "W recycled other slots");
    // The batches land; the operation is given up.
    w.fabric().land();
    drop(op);
    if let Some(t2) = reused {
        for node in [A, B, C] {
            if max_word(&cluster, &layout, node, &y).ts() == t2 {
                assert_eq!(
                    record_in_slot(&cluster, &layout, node, t2),
                    Some(t2),
                    "t2's record on {node:?}"
                );
            }
        }
    }
    assert_eq!(
        reused, None,
        "W reused t1's slot while its write's round was alive with batches in flight"
    );
    let t2 = write_until_reuse().expect("W reuses the slot once its batches landed");
    for node in [A, B, C] {
        if max_word(&cluster, &layout, node, &y).ts() == t2 {
            assert_eq!(record_in_slot(&cluster, &layout, node, t2), Some(t2));
        }
    }
}
