//! Write-back guards (`swarm_core::write_back_guard`): a reader paused in the middle of
//! writing another writer's record back never garbles a log slot that its writer
//! reused, however long it stays paused.
//!
//! The schedule: writer W's write `t1` reaches node A only (B and C are down for W).
//! Reader R reads A and B, finds `t1` on A alone and writes it back to B; R is paused
//! right before that write-back's stores land. Writer X then overwrites the register
//! on every node, which supersedes `t1`, and W writes on and on to another register,
//! recycling its log slots. Then R's stores land.
//!
//! Without guards, W reuses `t1`'s slot once the grace is over (a grace is all that
//! protects it) and R's late stores garble W's newest write there. With guards, W
//! keeps `t1`'s slot while R's guard names it, and reuses it once R is done.

use std::cell::RefCell;
use std::future::Future;
use std::ops::Range;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

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
    /// Held unapplied (the poster is paused before its stores), then landed.
    Held(Option<(NodeId, Batch)>),
    Landed(Ticket),
}

const OURS: u32 = 1 << 31;

/// A client's fabric with nodes that are down for it, and batches that write into a
/// range held unapplied until [`Gate::land`]: the client paused between its checks
/// and its stores.
struct Gate {
    inner: MemFabric,
    down: RefCell<Vec<NodeId>>,
    hold: RefCell<Option<Range<u64>>>,
    /// Holds only the batches to this node, if set (a slow queue pair).
    hold_node: RefCell<Option<NodeId>>,
    /// Holds the lowers of guards (a zero written into the guard table) until
    /// [`Gate::land_lowers`]: a slow queue pair behind which a lower waits.
    hold_lowers: RefCell<bool>,
    ours: RefCell<Vec<Entry>>,
}

impl Gate {
    fn new(cluster: &MemCluster) -> Self {
        Self {
            inner: cluster.client(),
            down: RefCell::default(),
            hold: RefCell::default(),
            hold_node: RefCell::default(),
            hold_lowers: RefCell::default(),
            ours: RefCell::default(),
        }
    }

    /// Whether `batch` lowers a guard: one write of a zero word into the guard table.
    fn is_lower(batch: &Batch) -> bool {
        matches!(batch.ops(), [Op::Write { addr, data }]
            if (GUARDS..GUARDS + 32).contains(addr) && data.iter().all(|&b| b == 0))
    }

    /// The held lowers reach memory now, in the order they were posted; other held
    /// batches stay held, and lowers posted from now on are not held.
    fn land_lowers(&self) {
        *self.hold_lowers.borrow_mut() = false;
        for entry in self.ours.borrow_mut().iter_mut() {
            if let Entry::Held(held) = entry
                && held
                    .as_ref()
                    .is_some_and(|(_, batch)| Self::is_lower(batch))
                && let Some((node, batch)) = held.take()
            {
                *entry = Entry::Landed(self.inner.post(node, batch));
            }
        }
    }

    fn writes_into(batch: &Batch, range: &Range<u64>) -> bool {
        batch
            .ops()
            .iter()
            .any(|op| matches!(op, Op::Write { addr, .. } if range.contains(addr)))
    }

    fn held(&self) -> usize {
        let ours = self.ours.borrow();
        ours.iter()
            .filter(|e| matches!(e, Entry::Held(Some(_))))
            .count()
    }

    /// Held batches other than lowers of guards.
    fn held_stores(&self) -> usize {
        let ours = self.ours.borrow();
        ours.iter()
            .filter(|e| matches!(e, Entry::Held(Some((_, batch))) if !Self::is_lower(batch)))
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
        let held = self
            .hold
            .borrow()
            .as_ref()
            .is_some_and(|range| Self::writes_into(&batch, range))
            && self.hold_node.borrow().is_none_or(|held| held == node);
        let held = held || (*self.hold_lowers.borrow() && Self::is_lower(&batch));
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

fn client(cluster: &MemCluster, layout: Layout, writer: u32, clock: u64) -> Node {
    client_with(cluster, layout, writer, clock, ProtocolConfig::default())
}

/// [`client`] with `config`'s fallback timer and suspicion.
fn client_with(
    cluster: &MemCluster,
    layout: Layout,
    writer: u32,
    clock: u64,
    config: ProtocolConfig,
) -> Node {
    let config = config.with_max_op_ns(3).with_delivery_margin_ns(0);
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
) -> Option<Tsp> {
    let addr = layout.buffer_addr(ts).unwrap() + 8;
    let mut bytes = peek(cluster, node, addr, layout.record_bytes() as u32);
    decode_record(&mut bytes, layout.payload_max()).map(|r| r.tsp)
}

/// Polls `future` (a paused client's operation) until its client holds a batch
/// unapplied, driving its fabric between polls.
fn run_until_held<F: Future>(c: &Node, future: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut future = future;
    for _ in 0..1000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        if c.fabric().held() > 0 {
            return None;
        }
        c.fabric().progress();
    }
    panic!("the operation neither finished nor posted a held batch");
}

fn run_to_end<F: Future>(c: &Node, mut future: std::pin::Pin<&mut F>) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..10_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        c.fabric().progress();
    }
    panic!("the operation did not finish");
}

/// Brings every node back up for a client when dropped.
struct Restore<'a>(&'a Node);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.0.fabric().down.borrow_mut().clear();
    }
}

/// The schedule of the module docs, up to the point where R's stores land. Returns
/// W's write `t1`, and W's newest write to the other register once `t1`'s slot was
/// reused (`None` if W never reused it in 40 writes).
struct Schedule {
    cluster: MemCluster,
    layout: Layout,
    w: Node,
    r: Node,
    t1: Timestamp,
}

impl Schedule {
    /// The nodes whose metadata holds W's write `newest` (on register 1) but whose
    /// copy of it in its slot does not validate as `newest`.
    fn garbled_copies(&self, newest: Timestamp) -> Vec<NodeId> {
        let holders: Vec<NodeId> = [A, B, C]
            .into_iter()
            .filter(|&node| max_word(&self.cluster, &self.layout, node, &reg(1)).ts() == newest)
            .collect();
        assert!(holders.len() >= 2, "a majority holds W's newest write");
        holders
            .into_iter()
            .filter(|&node| {
                record_in_slot(&self.cluster, &self.layout, node, newest).map(|t| t.ts())
                    != Some(newest)
            })
            .collect()
    }

    fn assert_intact(&self, newest: Timestamp) {
        assert_eq!(
            self.garbled_copies(newest),
            [],
            "garbled copies of W's newest write"
        );
    }

    fn new(guards: bool) -> Self {
        let cluster = MemCluster::new(3, 1 << 20);
        let layout = layout(guards);
        let w = client(&cluster, layout, 1, 100);
        let r = client(&cluster, layout, 2, 50);
        // W's write reaches A only.
        w.fabric().down.borrow_mut().extend([B, C]);
        assert!(
            write(&w, &reg(0), b"w1").is_err(),
            "W's write needs a majority"
        );
        w.fabric().down.borrow_mut().clear();
        let t1 = max_word(&cluster, &layout, A, &reg(0));
        assert_eq!(t1.ts().writer(), WriterId::new(1).unwrap());
        assert!(max_word(&cluster, &layout, B, &reg(0)).is_empty());
        Self {
            cluster,
            layout,
            w,
            r,
            t1: t1.ts(),
        }
    }

    /// X overwrites register 0 everywhere; W learns that `t1` is superseded and writes
    /// register 1 (on A and B) until it reuses `t1`'s slot (its newest write then), or
    /// 40 times.
    fn supersede_and_recycle(&self) -> Option<Timestamp> {
        let x = client(&self.cluster, self.layout, 3, 200);
        write(&x, &reg(0), b"x1").unwrap();
        let slot = self.layout.slot_of(self.t1);
        // W's writes go to A and B, so that B holds the write that reuses the slot.
        self.w.fabric().down.borrow_mut().push(C);
        let _up = Restore(&self.w);
        for i in 0..40u8 {
            recycle(&self.w);
            write(&self.w, &reg(1), &[i]).unwrap();
            let newest = [A, B, C]
                .map(|node| max_word(&self.cluster, &self.layout, node, &reg(1)))
                .into_iter()
                .max()
                .unwrap()
                .ts();
            assert_eq!(newest.writer(), WriterId::new(1).unwrap());
            if self.layout.slot_of(newest) == slot {
                return Some(newest);
            }
        }
        None
    }

    /// W writes `v` to register `r`, reaching A only; returns that write.
    fn write_on_a_only(&self, r: &RegisterLoc, v: &[u8]) -> Timestamp {
        self.w.fabric().down.borrow_mut().extend([B, C]);
        assert!(write(&self.w, r, v).is_err(), "W's write needs a majority");
        self.w.fabric().down.borrow_mut().clear();
        let t = max_word(&self.cluster, &self.layout, A, r);
        assert_eq!(t.ts().writer(), WriterId::new(1).unwrap());
        t.ts()
    }
}

#[test]
fn a_paused_write_back_keeps_the_slot_it_writes_into_until_it_landed() {
    let s = Schedule::new(true);
    // R's write-back of t1 to B goes as far as its stores, and stops there.
    *s.r.fabric().hold.borrow_mut() = Some(LOG_BASE..LOG_BASE + s.layout.log_bytes());
    s.r.fabric().down.borrow_mut().push(C);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg0 = reg(0);
    let mut read = pin!(s.r.max_read(&reg0, &mut cache, &stats, false));
    assert!(
        run_until_held(&s.r, read.as_mut()).is_none(),
        "R paused at its stores"
    );

    let reused = s.supersede_and_recycle();
    assert_eq!(reused, None, "W reused t1's slot while R's guard named it");
    assert!(
        s.w.slot_counters().recycled > 0,
        "W recycled its other slots meanwhile"
    );
    assert_eq!(
        record_in_slot(&s.cluster, &s.layout, A, s.t1).map(|t| t.ts()),
        Some(s.t1),
        "t1's slot still holds t1 on A"
    );

    // R wakes up: its stores land, its read returns t1 (it began before X's write),
    // and its guard goes down.
    s.r.fabric().land();
    let (t, value) = run_to_end(&s.r, read.as_mut()).unwrap();
    assert_eq!((t.ts(), value.as_slice()), (s.t1, b"w1".as_slice()));
    let guard = peek(&s.cluster, B, GUARDS + 8 * 2, 8);
    assert_eq!(guard, [0; 8], "R's guard is down");

    // Now W reuses t1's slot, and every copy of its newest write is intact.
    let newest = s
        .supersede_and_recycle()
        .expect("W reuses t1's slot once R is done");
    s.assert_intact(newest);
}

#[test]
fn a_write_back_paused_before_its_guard_gives_up_once_its_write_is_superseded() {
    let s = Schedule::new(true);
    // R stops before its guard reaches any node.
    *s.r.fabric().hold.borrow_mut() = Some(GUARDS..GUARDS + 32);
    s.r.fabric().down.borrow_mut().push(C);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg0 = reg(0);
    let mut read = pin!(s.r.max_read(&reg0, &mut cache, &stats, false));
    assert!(
        run_until_held(&s.r, read.as_mut()).is_none(),
        "R paused at its guard"
    );

    // Meanwhile t1 is superseded and W reuses its slot: no guard names it yet.
    let newest = s
        .supersede_and_recycle()
        .expect("W reuses t1's slot: R's guard never reached a node");

    // R wakes up: its guard goes up, its re-read sees X's write above t1, and it
    // writes nothing back; the read starts over and returns X's value.
    s.r.fabric().down.borrow_mut().clear();
    s.r.fabric().land();
    let (t, value) = run_to_end(&s.r, read.as_mut()).unwrap();
    assert_eq!(value, b"x1");
    assert_eq!(t.ts().writer(), WriterId::new(3).unwrap());
    s.assert_intact(newest);
}

/// The same schedule on a layout without guards: the hazard is real, and only a grace
/// stood in its way (this is what the guards fix).
#[test]
fn without_guards_a_paused_write_back_garbles_a_reused_slot() {
    let s = Schedule::new(false);
    *s.r.fabric().hold.borrow_mut() = Some(LOG_BASE..LOG_BASE + s.layout.log_bytes());
    s.r.fabric().down.borrow_mut().push(C);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg0 = reg(0);
    let mut read = pin!(s.r.max_read(&reg0, &mut cache, &stats, false));
    assert!(run_until_held(&s.r, read.as_mut()).is_none());
    let newest = s
        .supersede_and_recycle()
        .expect("without a guard, W reuses t1's slot after the grace");
    s.r.fabric().land();
    let _ = run_to_end(&s.r, read.as_mut());
    assert_eq!(
        s.garbled_copies(newest),
        [B],
        "R's late write-back overwrote W's newest write on B"
    );
    assert_eq!(
        record_in_slot(&s.cluster, &s.layout, B, newest).map(|t| t.ts()),
        Some(s.t1)
    );
}

/// Whether R's guard (writer 2) names `t1` on each node.
fn guard_up(s: &Schedule) -> [bool; 3] {
    guard_names(s, s.t1)
}

/// Whether R's guard (writer 2) names `t` on each node.
fn guard_names(s: &Schedule, t: Timestamp) -> [bool; 3] {
    [A, B, C].map(|node| {
        let word = peek(&s.cluster, node, GUARDS + 8 * 2, 8);
        Tsp::from_word(u64::from_le_bytes(word.try_into().unwrap())).ts() == t
    })
}

/// Over RDMA a step returns once a majority answered, and its batches to the other
/// replicas may still sit in a slow queue pair (a stopped client's engine gives none
/// up). R raises its guard and writes `t1` back; its batch to B is held (in flight,
/// not landed), so R falls back to C, which answers, and R's read returns with `t1`
/// on a majority. W then supersedes `t1`, reads the guard table and recycles; then
/// B's batch lands.
///
/// Had R lowered its guard when its read returned, W would have reused `t1`'s slot
/// and B's late batch would garble the copy of W's newest write there. The guard
/// stays up on every node until B's batch completed: W never reuses the slot under
/// it, and reuses it once the guard went down.
#[test]
fn a_write_back_batch_still_in_flight_keeps_the_guard_up_until_it_landed() {
    let mut s = Schedule::new(true);
    let config = ProtocolConfig::default()
        .with_slow_after_ns(1)
        .with_suspect_ns(1);
    s.r = client_with(&s.cluster, s.layout, 2, 50, config);
    *s.r.fabric().hold.borrow_mut() = Some(LOG_BASE..LOG_BASE + s.layout.log_bytes());
    *s.r.fabric().hold_node.borrow_mut() = Some(B);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg0 = reg(0);
    let read = pin!(s.r.max_read(&reg0, &mut cache, &stats, false));
    let (t, value) = run_to_end(&s.r, read).unwrap();
    assert_eq!((t.ts(), value.as_slice()), (s.t1, b"w1".as_slice()));
    assert_eq!(
        s.r.fabric().held(),
        1,
        "R's write-back batch to B is in flight"
    );
    // R's later ticks find the batch in flight and leave the guard up.
    s.r.recycle_slots_tick(8);
    let up_while_in_flight = guard_up(&s);

    let reused = s.supersede_and_recycle();
    // B's batch lands now (R's process woke up, or its queue pair moved on).
    s.r.fabric().land();
    if let Some(newest) = reused {
        // What the lower with a batch in flight did: the late batch overwrote the
        // copy of W's newest write in the reused slot.
        s.assert_intact(newest);
    }
    assert_eq!(
        reused, None,
        "W reused t1's slot while R's batch was in flight"
    );
    assert_eq!(
        up_while_in_flight, [true; 3],
        "R's guard is up on every node while its batch is in flight"
    );
    assert!(
        s.w.slot_counters().recycled > 0,
        "W recycled its other slots meanwhile"
    );
    assert_eq!(
        guard_up(&s),
        [true; 3],
        "the guard is up when the batch lands"
    );
    // R's next tick lowers the guard: the batch completed.
    s.r.recycle_slots_tick(8);
    assert_eq!(
        guard_up(&s),
        [false; 3],
        "R's guard is down once its batch landed"
    );
    let newest = s
        .supersede_and_recycle()
        .expect("W reuses t1's slot once R's write-back landed");
    s.assert_intact(newest);
}

/// An operation dropped while its write-back's batch is in flight (its future given
/// up by the caller) leaves the guard up until that batch completed.
#[test]
fn a_write_back_dropped_with_a_batch_in_flight_keeps_the_guard_up_until_it_landed() {
    let s = Schedule::new(true);
    *s.r.fabric().hold.borrow_mut() = Some(LOG_BASE..LOG_BASE + s.layout.log_bytes());
    s.r.fabric().down.borrow_mut().push(C);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg0 = reg(0);
    {
        let mut read = Box::pin(s.r.max_read(&reg0, &mut cache, &stats, false));
        assert!(
            run_until_held(&s.r, read.as_mut()).is_none(),
            "R paused at its stores"
        );
    }
    s.r.recycle_slots_tick(8);
    // C is down for R: the raise reached A and B.
    assert_eq!(
        guard_up(&s),
        [true, true, false],
        "R's guard is up after the drop"
    );
    s.r.fabric().land();
    s.r.recycle_slots_tick(8);
    assert_eq!(
        guard_up(&s),
        [false; 3],
        "R's guard is down once its batch landed"
    );
}

/// A lower still in flight never takes down the next raise of the same guard. R
/// writes `t1` back and its read returns; the lower of its guard waits in slow queue
/// pairs (posted to every node, landed on none). R then reads register 2, whose write
/// `t2` of W is on A alone, and writes it back under its guard, paused at its stores
/// (C is down for R). Then the old lower lands.
///
/// Had R raised its guard for `t2` while that lower was in flight (two batches to one
/// node are not ordered), the lower would land over the raise, and the guard would
/// name `t2` on no node while R's write-back is in flight: W's guard check would let
/// `t2`'s slot go once `t2` was superseded, and R's late stores would garble the copy
/// of W's next write there (what `sim_recycling`'s held batches found at seeds 1268,
/// 1906 and 2000; docs/pauses.md, H7). The raise waits for the lower's completion.
#[test]
fn a_lower_in_flight_never_takes_down_the_next_raise_of_the_guard() {
    let s = Schedule::new(true);
    let t2 = s.write_on_a_only(&reg(2), b"w2");
    *s.r.fabric().hold_lowers.borrow_mut() = true;
    let reg0 = reg(0);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let read = s.r.max_read(&reg0, &mut cache, &stats, false);
    let (t, _) = block_on(s.r.fabric(), read).unwrap();
    assert_eq!(t.ts(), s.t1, "R wrote t1 back");
    assert_eq!(
        s.r.fabric().held(),
        3,
        "R's lower is in flight to every node"
    );

    *s.r.fabric().hold.borrow_mut() = Some(LOG_BASE..LOG_BASE + s.layout.log_bytes());
    s.r.fabric().down.borrow_mut().push(C);
    let stats = OpStats::new();
    let mut cache = RegisterCache::new();
    let reg2 = reg(2);
    let mut read = pin!(s.r.max_read(&reg2, &mut cache, &stats, false));
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..100 {
        assert!(read.as_mut().poll(&mut cx).is_pending());
        if s.r.fabric().held_stores() > 0 {
            break;
        }
        s.r.fabric().progress();
    }
    // The old lower lands (its queue pairs moved on); R goes on to its stores.
    s.r.fabric().land_lowers();
    assert!(
        run_until_held(&s.r, read.as_mut()).is_none(),
        "R paused at its stores"
    );
    assert_eq!(
        guard_names(&s, t2),
        [true, true, false],
        "R's guard names t2 on A and B while its write-back is in flight"
    );

    // R's stores land: its read returns t2, and its guard goes down.
    s.r.fabric().land();
    let (t, value) = run_to_end(&s.r, read.as_mut()).unwrap();
    assert_eq!((t.ts(), value.as_slice()), (t2, b"w2".as_slice()));
    s.r.recycle_slots_tick(8);
    assert_eq!(guard_names(&s, t2), [false; 3], "R's guard is down");
    assert!(s.r.lower_guard_if_done(), "R's lower completed");
}
