//! Register recycling (SWARM §5.4, `swarm_kv::registers::recycle`) on a shared-memory cluster
//! whose clients share a *virtual* clock: the tests move time past cache lifetimes
//! and recycling graces without sleeping, and nothing depends on the machine's speed.
//!
//! What is checked: a retired register is reused only after its grace; a client
//! whose cache is older than the time-to-live never writes into a reused register; a
//! reset reaches every replica before reuse; a put that turned into an update and a
//! delete whose unmap was lost both give their register back; a churn of ten times
//! the register capacity completes with a linearizable history.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use swarm_checker::{History, OpKind, Operation};
use swarm_core::encoding::Tsp;
use swarm_core::fabric::{Completion, FabricError, FailureCause, Op, Ticket};
use swarm_core::layout::decode_record;
use swarm_core::{Batch, Fabric, NodeId, OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::admin::NodeLayout;
use swarm_kv::admin::RecycleStats;
use swarm_kv::admin::RepairOptions;
use swarm_kv::admin::write_superblock;
use swarm_kv::testing::{CONFIG_AT, Configuration};
use swarm_kv::testing::{read_configuration, write_configuration};
use swarm_kv::{DeleteOutcome, KvClient, KvConfig, KvError, ShmStore};
use swarm_shm::{CreateOptions, EmulatedFabric, ScratchDir, ShmCluster};

/// Test knobs shared by the fabrics of one test's clients.
#[derive(Default)]
struct World {
    /// Virtual time, ns.
    now: Cell<u64>,
    /// Nodes that swallow batches (never applied, never answered).
    silent: RefCell<Vec<NodeId>>,
    /// A stall to model at the next post: virtual time jumps by this much right
    /// after the batch passed its fence check (a preempted or paused client).
    stall_next_post: Cell<u64>,
    /// Posts left before the stall of [`Self::stall_at_post`] (0: none armed).
    stall_countdown: Cell<u32>,
    /// The stall the countdown leads to.
    stall_at_post: Cell<u64>,
}

impl World {
    fn new() -> Rc<Self> {
        let world = Self::default();
        world.now.set(1_000_000_000);
        Rc::new(world)
    }

    fn advance(&self, ns: u64) {
        self.now.set(self.now.get() + ns);
    }
}

/// The store's fabric, with the shared virtual clock, silent nodes, and per-client
/// failed nodes and refused address ranges (batches there fail at once).
struct TestFabric {
    inner: EmulatedFabric,
    world: Rc<World>,
    /// Deadlines asked for with `wake_at` and not reached yet.
    wakes: RefCell<std::collections::BTreeSet<u64>>,
    failed: RefCell<Vec<NodeId>>,
    refused: RefCell<Option<Range<u64>>>,
    /// While set, batches touching this range are applied at once but their
    /// completions are withheld: the client is paused right after posting them.
    paused_on: RefCell<Option<Range<u64>>>,
    /// Inner tickets of withheld completions, by ticket number minus `HELD`.
    held: RefCell<Vec<Ticket>>,
    /// Batches that `paused_on` would pause which still pass, answered, first.
    pause_after: Cell<u32>,
    /// A node whose batches that `paused_on` pauses are held unapplied instead (as
    /// `unapplied_on`'s): still on their way when the client stopped.
    pause_slow: Cell<Option<NodeId>>,
    /// While set, batches touching this range are neither applied nor answered:
    /// the client is paused between its fence check and its stores. They land when
    /// the test calls [`TestFabric::land_unapplied`].
    unapplied_on: RefCell<Option<Range<u64>>>,
    /// Batches held unapplied (taken when they land) and, once landed, their inner
    /// tickets; by ticket number minus `UNAPPLIED`.
    unapplied: RefCell<Vec<Unapplied>>,
    /// Results of batches not passed to `inner`, by ticket number minus `OURS`.
    ours: RefCell<Vec<Option<Result<Completion, FabricError>>>>,
}

/// A batch held unapplied (taken when it lands), and its inner ticket once landed.
type Unapplied = (Option<(NodeId, Batch)>, Option<Ticket>);

const OURS: u32 = 1 << 31;
const HELD: u32 = 1 << 30;
const UNAPPLIED: u32 = 1 << 29;
/// A ticket that never completes (a silent node).
const NEVER: u32 = u32::MAX;

impl TestFabric {
    fn new(inner: EmulatedFabric, world: &Rc<World>) -> Self {
        Self {
            inner,
            world: world.clone(),
            wakes: RefCell::default(),
            failed: RefCell::new(Vec::new()),
            refused: RefCell::new(None),
            paused_on: RefCell::new(None),
            held: RefCell::new(Vec::new()),
            pause_after: Cell::new(0),
            pause_slow: Cell::new(None),
            unapplied_on: RefCell::new(None),
            unapplied: RefCell::new(Vec::new()),
            ours: RefCell::new(Vec::new()),
        }
    }

    /// Lands every batch held unapplied, in the order they were posted: the paused
    /// client's stores reach memory now, whatever happened meanwhile.
    fn land_unapplied(&self) {
        *self.unapplied_on.borrow_mut() = None;
        for entry in self.unapplied.borrow_mut().iter_mut() {
            if let Some((node, batch)) = entry.0.take() {
                entry.1 = Some(self.inner.post(node, batch));
            }
        }
    }

    /// Whether a batch is held unapplied now (landed ones do not count).
    fn holds_unapplied(&self) -> bool {
        self.unapplied
            .borrow()
            .iter()
            .any(|entry| entry.0.is_some())
    }

    fn touches(batch: &Batch, range: &Range<u64>) -> bool {
        batch.ops().iter().any(|op| {
            let addr = match op {
                Op::Read { addr, .. } | Op::Write { addr, .. } | Op::Cas { addr, .. } => *addr,
            };
            range.contains(&addr)
        })
    }
}

impl Fabric for TestFabric {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.world.advance(self.world.stall_next_post.take());
        let countdown = self.world.stall_countdown.get();
        if countdown > 0 {
            self.world.stall_countdown.set(countdown - 1);
            if countdown == 1 {
                self.world.advance(self.world.stall_at_post.take());
            }
        }
        if self.world.silent.borrow().contains(&node) {
            return Ticket(NEVER);
        }
        let refused = self
            .refused
            .borrow()
            .as_ref()
            .is_some_and(|r| Self::touches(&batch, r));
        let mut paused = self
            .paused_on
            .borrow()
            .as_ref()
            .is_some_and(|r| Self::touches(&batch, r));
        if paused && self.pause_after.get() > 0 {
            self.pause_after.set(self.pause_after.get() - 1);
            paused = false;
        }
        let unapplied_slow = paused && self.pause_slow.get() == Some(node);
        let unapplied = self
            .unapplied_on
            .borrow()
            .as_ref()
            .is_some_and(|r| Self::touches(&batch, r));
        if (unapplied || unapplied_slow) && !refused && !self.failed.borrow().contains(&node) {
            let mut queue = self.unapplied.borrow_mut();
            queue.push((Some((node, batch)), None));
            return Ticket(UNAPPLIED | (queue.len() as u32 - 1));
        }
        if paused && !refused && !self.failed.borrow().contains(&node) {
            let mut held = self.held.borrow_mut();
            held.push(self.inner.post(node, batch));
            return Ticket(HELD | (held.len() as u32 - 1));
        }
        if !refused && !self.failed.borrow().contains(&node) {
            return self.inner.post(node, batch);
        }
        let mut ours = self.ours.borrow_mut();
        ours.push(Some(Err(FabricError::NodeFailed {
            node,
            cause: FailureCause::Crashed,
        })));
        Ticket(OURS | (ours.len() as u32 - 1))
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 == NEVER {
            return Poll::Pending;
        }
        if ticket.0 & (OURS | HELD) == 0 && ticket.0 & UNAPPLIED != 0 {
            return match self.unapplied.borrow()[(ticket.0 & !UNAPPLIED) as usize].1 {
                Some(inner) => self.inner.poll(inner),
                None => Poll::Pending,
            };
        }
        if ticket.0 & OURS == 0 && ticket.0 & HELD != 0 {
            if self.paused_on.borrow().is_some() {
                return Poll::Pending;
            }
            let inner = self.held.borrow()[(ticket.0 & !HELD) as usize];
            return self.inner.poll(inner);
        }
        if ticket.0 & OURS == 0 {
            return self.inner.poll(ticket);
        }
        match self.ours.borrow_mut()[(ticket.0 & !OURS) as usize].take() {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & (OURS | HELD) == 0 && ticket.0 & UNAPPLIED != 0 {
            if let Some(inner) = self.unapplied.borrow()[(ticket.0 & !UNAPPLIED) as usize].1 {
                self.inner.forget(inner);
            }
        } else if ticket.0 & OURS == 0 && ticket.0 & HELD != 0 {
            let inner = self.held.borrow()[(ticket.0 & !HELD) as usize];
            self.inner.forget(inner);
        } else if ticket.0 & OURS == 0 {
            self.inner.forget(ticket);
        }
    }
    fn progress(&self) -> bool {
        // Everything completes inside `post`; the only events are deadlines, and
        // virtual time jumps to them: to the earliest one still ahead (jumping further
        // would skip past another waiter's, an operation's fence among them); the
        // later ones stay pending, as `Fabric::wake_at` requires.
        let now = self.world.now.get();
        let mut wakes = self.wakes.borrow_mut();
        wakes.retain(|&t| t > now);
        match wakes.pop_first() {
            Some(wake) => {
                self.world.now.set(wake);
                true
            }
            None => false,
        }
    }
    fn now(&self) -> u64 {
        self.world.now.get()
    }
    fn wake_at(&self, deadline: u64) {
        self.wakes.borrow_mut().insert(deadline);
    }
    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.memory_lost(node, incarnation)
    }
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.admit(node, incarnation)
    }
}

/// Timestamp ticks from the virtual clock too: with the machine's clock, which
/// slots writes take (and so which runs meet a reused slot) would depend on its
/// speed, and a seed would not replay.
struct WorldClock {
    world: Rc<World>,
    tick_ns: u64,
}

impl swarm_core::Clock for WorldClock {
    fn ticks(&self) -> u64 {
        self.world.now.get() / self.tick_ns
    }
}

type Client = KvClient<TestFabric, WorldClock>;

/// Cache lifetime and operation deadline of the tests' clients: 1 ms each, so the
/// recycling grace is 2 ms + 1/8 + 10 ms.
const TTL_NS: u64 = 1_000_000;
const MAX_OP_NS: u64 = 1_000_000;

fn config(store: &ShmStore) -> KvConfig {
    store.config()
}

fn grace(store: &ShmStore) -> u64 {
    store.layout().params.register_grace_ns()
}

/// A tiny cluster: 3 nodes, 3 replicas per key, `registers` registers or a few more.
fn tiny(dir: &ScratchDir, node_bytes: u64) -> ShmStore {
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 8,
        chunk_registers: 8,
        meta_words: 4,
        cache_ttl_ns: TTL_NS,
        max_op_ns: MAX_OP_NS,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, node_bytes, params).expect("create")
}

/// A cluster of exactly `registers` registers whose logs are large enough for a
/// long churn: out-of-place log slots are not recycled on this branch (the slots
/// work does that), so every write takes one for good.
fn exact(dir: &ScratchDir, registers: u64, log_slots: u32) -> ShmStore {
    exact_with(dir, registers, log_slots, |_| {})
}

/// [`exact`] with `tweak` applied to its parameters.
fn exact_with(
    dir: &ScratchDir,
    registers: u64,
    log_slots: u32,
    tweak: impl FnOnce(&mut ClusterParams),
) -> ShmStore {
    let mut params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 4,
        chunk_registers: 8,
        meta_words: 4,
        registers,
        index_buckets: (registers / 2).next_power_of_two(),
        log_slots,
        cache_ttl_ns: TTL_NS,
        max_op_ns: MAX_OP_NS,
        ..ClusterParams::default()
    };
    tweak(&mut params);
    let node_bytes = NodeLayout::new(params)
        .unwrap()
        .end()
        .next_multiple_of(4096);
    let shm = std::sync::Arc::new(
        ShmCluster::create_with(dir.path(), 3, node_bytes, &CreateOptions::default())
            .expect("create"),
    );
    write_superblock(&shm.client(), &params).expect("superblock");
    let members = shm.incarnations().iter().map(|i| i.unwrap()).collect();
    write_configuration(&shm.client(), &Configuration::new(1, members)).expect("configuration");
    drop(shm);
    ShmStore::open(dir.path()).expect("open")
}

fn client(store: &ShmStore, world: &Rc<World>) -> Client {
    client_with(store, world, config(store))
}

/// A client of `store` in `world` with its own configuration.
fn client_with(store: &ShmStore, world: &Rc<World>, config: KvConfig) -> Client {
    let header = *store.header();
    KvClient::connect(
        TestFabric::new(store.fabric(), world),
        WorldClock {
            world: world.clone(),
            tick_ns: header.tick_ns.max(1),
        },
        *store.layout(),
        config,
    )
    .expect("connect")
}

fn get(c: &Client, key: &str) -> Option<String> {
    block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new()))
        .expect("get")
        .map(|v| String::from_utf8(v).unwrap())
}

fn insert(c: &Client, key: &str, value: &str) {
    block_on(
        c.fabric(),
        c.insert(key.as_bytes(), value.as_bytes(), &OpStats::new()),
    )
    .expect("insert");
}

fn update(c: &Client, key: &str, value: &str) -> bool {
    block_on(
        c.fabric(),
        c.update(key.as_bytes(), value.as_bytes(), &OpStats::new()),
    )
    .expect("update")
}

/// Whether the delete removed the key's value (these tests never race two deletes).
fn delete(c: &Client, key: &str) -> bool {
    block_on(c.fabric(), c.delete(key.as_bytes(), &OpStats::new())).expect("delete")
        == DeleteOutcome::Removed
}

fn register_of(c: &Client, key: &str) -> Option<u64> {
    let f = c.fabric();
    block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes())).expect("resolve")
}

/// A delete's unmap left to run late (`KvConfig::deferred_unmaps`) must not unmap a
/// later life of its key that landed in the same register: `a` deletes `k` and
/// defers the unmap; `b` re-inserts `k` elsewhere (retiring `r`), recycles `r`,
/// deletes `k` and inserts it once more, into `r`. `a`'s unmap then finds `k → r`
/// mapped again, and must leave it.
#[test]
fn a_late_deferred_unmap_leaves_a_new_life_of_its_key_in_the_same_register() {
    let dir = ScratchDir::new("kv-recycle-late-unmap").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let a = client_with(
        &store,
        &world,
        KvConfig {
            deferred_unmaps: 4,
            ..config(&store)
        },
    );
    let b = client(&store, &world);
    insert(&a, "k", "v1");
    let r = register_of(&a, "k").unwrap();
    assert!(delete(&a, "k"));
    assert!(a.has_deferred_unmaps(), "a's unmap waits");
    // b's insert finds k mapped to a tombstone and replaces the mapping: b retires r.
    insert(&b, "k", "v2");
    assert_ne!(register_of(&b, "k"), Some(r));
    assert_eq!(b.registers_in_limbo(), 1);
    world.advance(grace(&store) + 1);
    // b resets r during its next operations; its next insert of k gets r back
    // (recycled registers are handed out newest first).
    assert!(delete(&b, "k"));
    insert(&b, "k", "v3");
    assert_eq!(register_of(&b, "k"), Some(r), "k lives in r again");
    assert_eq!(
        block_on(a.fabric(), a.run_deferred_unmaps()).expect("run the unmap"),
        1
    );
    assert_eq!(
        a.deferred_unmap_stats().unmapped,
        0,
        "{:?}",
        a.deferred_unmap_stats()
    );
    assert_eq!(
        register_of(&b, "k"),
        Some(r),
        "k's new life is still mapped"
    );
    let c = client(&store, &world);
    assert_eq!(get(&c, "k").as_deref(), Some("v3"));
}

/// A client that stalls past an operation's deadline (here: virtual time jumps
/// right after a batch passed its fence check): a get retries the read itself (a
/// stall is not a failed get); a write stops with `Fenced`, its outcome unknown, and
/// is not retried (a second write of its value after another client's write would
/// make one write take effect twice).
#[test]
fn a_get_that_stalls_past_its_deadline_is_retried_and_a_write_is_not() {
    let dir = ScratchDir::new("kv-recycle-stall").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    let stall = || world.stall_next_post.set(5 * MAX_OP_NS);
    insert(&a, "k", "v1");
    assert_eq!(get(&b, "k").as_deref(), Some("v1"));
    stall();
    assert_eq!(
        get(&a, "k").as_deref(),
        Some("v1"),
        "the stalled get was retried"
    );
    assert_eq!(world.stall_next_post.get(), 0, "the stall happened");
    stall();
    let updated = block_on(a.fabric(), a.update(b"k", b"v2", &OpStats::new()));
    assert_eq!(world.stall_next_post.get(), 0, "the stall happened");
    match updated {
        Ok(true) => assert_eq!(get(&b, "k").as_deref(), Some("v2")),
        Err(error) => {
            assert!(error.is_fenced(), "{error}");
            let now = get(&b, "k");
            assert!(
                matches!(now.as_deref(), Some("v1" | "v2")),
                "outcome unknown, but one of the two: {now:?}"
            );
        }
        Ok(false) => panic!("k is present"),
    }
}

#[test]
fn a_stale_cached_location_never_writes_into_the_reused_register() {
    let dir = ScratchDir::new("kv-recycle-stale").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k1", "v1");
    let r = register_of(&a, "k1").unwrap();
    assert_eq!(get(&a, "k1").as_deref(), Some("v1"), "a caches k1 -> r");
    // b deletes k1: its remove unmaps r, so b owns r.
    assert!(delete(&b, "k1"));
    assert_eq!(b.registers_in_limbo(), 1);
    // Past the grace (so past a's cache lifetime), b reuses r for another key.
    world.advance(grace(&store) + 1);
    insert(&b, "k2", "v2");
    assert_eq!(register_of(&b, "k2"), Some(r), "r was recycled");
    assert_eq!(b.recycle_stats().recycled, 1);
    // a's cache still names r for k1, but the entry is older than the ttl: a goes
    // through the index, finds k1 absent, and writes nothing.
    assert!(!update(&a, "k1", "stale"), "k1 was deleted");
    assert!(a.cache_expired() >= 1);
    let c = client(&store, &world);
    assert_eq!(get(&c, "k2").as_deref(), Some("v2"));
    assert_eq!(get(&c, "k1"), None);
    assert_eq!(get(&a, "k2").as_deref(), Some("v2"));
}

#[test]
fn a_register_is_not_reused_within_its_grace() {
    let dir = ScratchDir::new("kv-recycle-grace").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k1", "v1");
    let r = register_of(&a, "k1").unwrap();
    assert!(delete(&b, "k1"));
    // Within a's cache lifetime: a still writes to r blindly, so r must not hold
    // another key yet.
    world.advance(TTL_NS / 2);
    insert(&b, "k2", "v2");
    // a's blind update meets r's tombstone: k1 stays deleted, k2 untouched.
    assert!(!update(&a, "k1", "stale"), "a stale write resurrected k1");
    assert_eq!(get(&a, "k2").as_deref(), Some("v2"));
    assert_eq!(get(&b, "k1"), None);
    assert_ne!(register_of(&b, "k2"), Some(r), "r reused within its grace");
    // Even just before the grace ends, r stays in limbo.
    world.advance(grace(&store) - TTL_NS / 2 - 1);
    insert(&b, "k3", "v3");
    assert_ne!(register_of(&b, "k3"), Some(r));
    world.advance(1);
    insert(&b, "k4", "v4");
    assert_eq!(
        register_of(&b, "k4"),
        Some(r),
        "reused once the grace passed"
    );
}

#[test]
fn a_silent_replica_keeps_the_register_in_limbo() {
    let dir = ScratchDir::new("kv-recycle-silent").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k1", "v1");
    let r = register_of(&a, "k1").unwrap();
    assert!(delete(&b, "k1"));
    world.advance(grace(&store) + 1);
    // Node 2 (a replica of r: every node is) does not answer the reset.
    world.silent.borrow_mut().push(NodeId(2));
    insert(&b, "k2", "v2");
    assert_ne!(
        register_of(&b, "k2"),
        Some(r),
        "reused before every replica was reset"
    );
    assert_eq!(b.registers_in_limbo(), 1);
    assert_eq!(b.recycle_stats().recycled, 0);
    world.silent.borrow_mut().clear();
    assert_eq!(get(&a, "k2").as_deref(), Some("v2"));
}

#[test]
fn a_reset_reaches_every_replica_so_a_lagging_one_reads_as_fresh_memory() {
    let dir = ScratchDir::new("kv-recycle-all").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    for lagging in (0..3).map(NodeId) {
        let (k1, k2) = (format!("a{}", lagging.0), format!("b{}", lagging.0));
        insert(&a, &k1, "v1");
        let r = register_of(&a, &k1).unwrap();
        assert!(delete(&b, &k1));
        world.advance(grace(&store) + 1);
        // Any operation of b runs its recycler: r is reset on every replica.
        assert!(!delete(&b, "absent"));
        assert_eq!(b.registers_in_limbo(), 0);
        // The lagging replica misses the whole insert that reuses r.
        world.silent.borrow_mut().push(lagging);
        insert(&b, &k2, "v2");
        assert_eq!(register_of(&b, &k2), Some(r), "r recycled");
        world.silent.borrow_mut().clear();
        // Clients that cannot reach one up-to-date replica read the lagging one:
        // it must look like fresh memory (no old key header, no tombstone).
        for failed in (0..3).map(NodeId).filter(|n| *n != lagging) {
            let c = client(&store, &world);
            c.fabric().failed.borrow_mut().push(failed);
            assert_eq!(
                get(&c, &k2).as_deref(),
                Some("v2"),
                "lagging {lagging:?}, failed {failed:?}"
            );
            let s = OpStats::new();
            block_on(c.fabric(), c.insert(k2.as_bytes(), b"v3", &s)).unwrap_or_else(|e| {
                panic!("insert over lagging {lagging:?} with {failed:?} failed: {e}")
            });
            assert_eq!(get(&c, &k2).as_deref(), Some("v3"));
            block_on(c.fabric(), c.update(k2.as_bytes(), b"v2", &s)).unwrap();
            c.fabric().failed.borrow_mut().clear();
            c.close();
        }
    }
}

/// Free registers sit in per-client pools, so pools drift with the mix of work:
/// here one client only inserts and another only deletes. The deleter keeps a
/// chunk's worth in its pool and donates the registers it resets beyond that; the
/// inserter, once every chunk is claimed and its pool is empty, takes the donations
/// in a reclamation pass (`swarm_kv::registers::recycle`, "donations"). Without donations the
/// inserter got `RegistersFull` after about 48 of these inserts, with the deleter
/// holding the other free registers.
#[test]
fn an_insert_only_client_lives_on_registers_a_delete_only_client_donates() {
    let dir = ScratchDir::new("kv-recycle-donate").unwrap();
    let capacity = 64;
    let store = exact(&dir, capacity, 1 << 12);
    let chunk = u64::from(store.layout().params.chunk_registers);
    let world = World::new();
    let (inserter, deleter) = (client(&store, &world), client(&store, &world));
    let live = 16;
    let rounds = 10 * capacity;
    let mut deleter_pool_max = 0;
    for i in 0..rounds {
        let s = OpStats::new();
        let f = inserter.fabric();
        if let Err(e) = block_on(f, inserter.insert(format!("key{i}").as_bytes(), b"v", &s)) {
            panic!(
                "insert {i}: {e}; inserter {:?}, deleter {:?} with {} pooled",
                inserter.recycle_stats(),
                deleter.recycle_stats(),
                deleter.registers_pooled()
            );
        }
        if i >= live {
            assert!(delete(&deleter, &format!("key{}", i - live)), "delete {i}");
        }
        deleter_pool_max = deleter_pool_max.max(deleter.registers_pooled());
        world.advance(500_000);
    }
    let (given, taken) = (deleter.recycle_stats(), inserter.recycle_stats());
    assert!(
        given.donated > 0 && taken.reclaimed_donations > 0,
        "{given:?} {taken:?}"
    );
    assert_eq!(given.donations_incomplete, 0);
    assert!(
        taken.reclaimed_donations <= given.donated,
        "only donated registers are taken as donations: {given:?} {taken:?}"
    );
    assert!(
        deleter_pool_max <= chunk + 8,
        "the deleter's pool stays near a chunk's worth ({chunk}): {deleter_pool_max}"
    );
    for i in rounds - live..rounds {
        assert_eq!(
            get(&deleter, &format!("key{i}")).as_deref(),
            Some("v"),
            "key{i}"
        );
    }
    for i in [0, rounds / 2, rounds - live - 1] {
        assert_eq!(
            get(&inserter, &format!("key{i}")),
            None,
            "key{i} was deleted"
        );
    }
}

/// `donor` fills every register but four chunks' worth, deletes every key, and,
/// past the grace, resets the registers it retired: it keeps a chunk's worth and
/// donates the others. Returns its recycling counters.
fn donate_all_but_four_chunks(store: &ShmStore, world: &World, donor: &Client) -> RecycleStats {
    let params = store.layout().params;
    let chunk = u64::from(params.chunk_registers);
    let donated = params.registers - 4 * chunk;
    for i in 0..donated {
        insert(donor, &format!("d{i}"), "v");
    }
    for i in 0..donated {
        assert!(delete(donor, &format!("d{i}")), "delete d{i}");
    }
    // (A delete moves the recycling along, even of an absent key.)
    world.advance(grace(store) + 1);
    for _ in 0..donated {
        if donor.registers_in_limbo() == 0 {
            break;
        }
        assert!(!delete(donor, "absent"));
        world.advance(100_000);
    }
    let given = donor.recycle_stats();
    assert!(
        given.donated >= donated - 2 * chunk,
        "the donor donated what it reset beyond a chunk's worth: {given:?}"
    );
    given
}

/// A client that runs dry while many registers are on offer as donations (here a
/// donor freed nearly every register of the cluster; in a store, the registers of a
/// gone client, donated as its reclaimer resets them) drains the offer in a few
/// reclamation passes: each takes half of what the last one left, or a chunk's
/// worth if that is more, and an insert that runs dry before the next pass is due
/// waits for it.
///
/// `short_settle`: the delivery margin is 100 µs, so that a pass is short next to
/// the interval between two (`min(lease, register grace)`), as on shared memory;
/// otherwise it is the default, and a pass lasts about the interval.
///
/// Before, each pass took a chunk's worth (8 registers here): the 194 inserts took
/// 38 passes' intervals of virtual time with the default margin, and with the short
/// one the 41st insert failed with `RegistersFull` (the dry client had used its 8
/// donations before the next pass was due) while 200 donations sat on offer.
fn drain_a_large_offer_of_donations(short_settle: bool) {
    let dir = ScratchDir::new("kv-recycle-offer").unwrap();
    let registers = 256;
    let store = exact_with(&dir, registers, 1 << 12, |params| {
        if short_settle {
            params.delivery_margin_ns = 100_000;
        }
    });
    let params = store.layout().params;
    let chunk = u64::from(params.chunk_registers);
    let interval = params.lease_ns.min(params.register_grace_ns());
    let world = World::new();
    let (donor, dry) = (client(&store, &world), client(&store, &world));
    let given = donate_all_but_four_chunks(&store, &world, &donor);
    // The dry client uses up the last unclaimed chunks, then lives on donations.
    let started = world.now.get();
    let inserts = 4 * chunk + given.donated * 3 / 4;
    for i in 0..inserts {
        let s = OpStats::new();
        if let Err(e) = block_on(
            dry.fabric(),
            dry.insert(format!("k{i}").as_bytes(), b"v", &s),
        ) {
            panic!(
                "insert {i} of {inserts}: {e}; dry {:?}, donor {:?}",
                dry.recycle_stats(),
                donor.recycle_stats()
            );
        }
    }
    let elapsed = world.now.get() - started;
    let taken = dry.recycle_stats().reclaimed_donations;
    assert!(
        taken >= given.donated / 2 && taken <= given.donated,
        "{taken} of {} donations taken",
        given.donated
    );
    // Passes take 8, then half of the rest each: about five of them (a chunk per
    // pass would need twenty), each a settle wait and at most `interval` apart.
    assert!(
        elapsed <= 6 * interval,
        "{inserts} inserts took {elapsed} ns of virtual time ({} passes' intervals)",
        elapsed / interval
    );
    for i in [0, inserts / 2, inserts - 1] {
        assert_eq!(get(&donor, &format!("k{i}")).as_deref(), Some("v"), "k{i}");
    }
}

/// A client that runs dry while registers it retired itself wait out their grace
/// (every put of a key that exists retires the fresh register it wrote) takes the
/// donations its last pass left on offer rather than wait for its own: taken, a
/// donation is ready after the delivery margin, its own registers after a whole
/// grace. Here the grace (400 ms of cache lifetime: a cluster made before
/// superblock version 7, whose graces wait for the cache) is twenty times the interval
/// between two passes (a 20 ms lease): the 108 inserts take 40 ms of virtual time.
/// Before, the dry client waited for its own seven retired registers, a whole
/// grace (451 ms), before its next pass; `swarm bench` run again and again on one
/// cluster stalled on it, its clients living on a trickle of their own retired
/// registers while hundreds of thousands were on offer.
#[test]
fn a_dry_client_takes_donations_on_offer_rather_than_wait_a_grace_for_its_own() {
    let dir = ScratchDir::new("kv-recycle-offer-limbo").unwrap();
    let registers = 256;
    let store = exact_with(&dir, registers, 1 << 12, |params| {
        params.cache_ttl_ns = 400_000_000;
        params.cached_lives = false;
        params.lease_ns = 20_000_000;
        params.lease_renew_ns = 5_000_000;
        // A pass's settle wait well within the lease.
        params.delivery_margin_ns = 100_000;
    });
    let params = store.layout().params;
    let chunk = u64::from(params.chunk_registers);
    let world = World::new();
    let (donor, dry) = (client(&store, &world), client(&store, &world));
    let given = donate_all_but_four_chunks(&store, &world, &donor).donated;
    // The last unclaimed chunks, then a first pass (nothing retired yet): it takes
    // a chunk's worth and leaves the rest on offer.
    for i in 0..4 * chunk + 1 {
        insert(&dry, &format!("k{i}"), "v");
    }
    assert_eq!(dry.recycle_stats().reclaimed_donations, chunk);
    // Puts of keys that exist: each retires the fresh register it wrote.
    for i in 0..chunk - 1 {
        insert(&dry, &format!("k{i}"), "v2");
    }
    assert!(dry.registers_in_limbo() > 0);
    let started = world.now.get();
    let inserts = given / 2;
    for i in 0..inserts {
        let s = OpStats::new();
        let key = format!("n{i}");
        if let Err(e) = block_on(dry.fabric(), dry.insert(key.as_bytes(), b"v", &s)) {
            panic!(
                "insert {i} of {inserts}: {e}; dry {:?}",
                dry.recycle_stats()
            );
        }
    }
    let elapsed = world.now.get() - started;
    assert!(
        elapsed < grace(&store) / 2,
        "{inserts} inserts took {elapsed} ns of virtual time (a grace is {} ns): {:?}",
        grace(&store),
        dry.recycle_stats()
    );
    for key in ["k0", "n0"] {
        assert!(get(&dry, key).is_some(), "{key}");
    }
}

#[test]
fn a_client_that_runs_dry_drains_a_large_offer_of_donations_in_a_few_passes() {
    drain_a_large_offer_of_donations(false);
}

#[test]
fn a_client_that_runs_dry_between_two_short_passes_waits_for_the_next_one() {
    drain_a_large_offer_of_donations(true);
}

#[test]
fn a_put_that_turned_into_an_update_gives_its_fresh_register_back() {
    let dir = ScratchDir::new("kv-recycle-put").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k", "va");
    // b's insert writes a fresh register, then finds k present: an update.
    insert(&b, "k", "vb");
    assert_eq!(
        b.recycle_stats().retired,
        1,
        "the unpublished register is retired"
    );
    assert_eq!(get(&a, "k").as_deref(), Some("vb"));
    world.advance(grace(&store) + 1);
    insert(&b, "k2", "v2");
    assert_eq!(b.recycle_stats().recycled, 1);
    assert_eq!(b.registers_in_limbo(), 0);
    let c = client(&store, &world);
    assert_eq!(get(&c, "k").as_deref(), Some("vb"));
    assert_eq!(get(&c, "k2").as_deref(), Some("v2"));
    assert_ne!(register_of(&c, "k"), register_of(&c, "k2"));
}

/// Clients that come and go on one writer id, each putting the same keys again and
/// closing before its retired registers pass their grace, leave that id's log
/// full of the last values of registers nobody resets (one `swarm bench` after
/// another on one cluster). A later client of the id reclaims those registers,
/// resets them, and gets the slots back: its puts go on. (Before, the ninth
/// generation's log held 126 of its 128 slots for as many dead registers and its
/// puts failed.)
#[test]
fn a_log_left_full_by_clients_that_came_and_went_comes_back() {
    const GENERATIONS: u32 = 16;
    const KEYS: u32 = 16;
    let dir = ScratchDir::new("kv-recycle-log-left-full").unwrap();
    let store = exact(&dir, 1024, 128);
    let world = World::new();
    let mut writer = None;
    for generation in 0..GENERATIONS {
        let c = client(&store, &world);
        assert_eq!(
            *writer.get_or_insert(c.writer()),
            c.writer(),
            "one writer id"
        );
        for k in 0..KEYS {
            let (key, value) = (format!("k{k}"), format!("v{generation}"));
            let stats = OpStats::new();
            let put = c.insert(key.as_bytes(), value.as_bytes(), &stats);
            if let Err(e) = block_on(c.fabric(), put) {
                panic!(
                    "generation {generation}, {key}: {e:?}; log {:?}; {} registers in limbo",
                    c.log_counters(),
                    c.registers_in_limbo()
                );
            }
        }
        c.close();
        world.advance(1_000_000);
    }
    let c = client(&store, &world);
    let last = format!("v{}", GENERATIONS - 1);
    for k in 0..KEYS {
        assert_eq!(get(&c, &format!("k{k}")), Some(last.clone()), "k{k}");
    }
}

#[test]
fn a_delete_that_crashed_before_its_unmap_leaves_a_register_the_next_insert_recycles() {
    let dir = ScratchDir::new("kv-recycle-crash").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k", "v1");
    let r = register_of(&a, "k").unwrap();
    // a's delete writes the tombstone, then loses the index (as if it crashed
    // there): the mapping k -> r stays, and nobody retired r.
    let layout = *store.layout();
    *a.fabric().refused.borrow_mut() = Some(layout.index_at..layout.registers_at);
    assert!(delete(&a, "k"));
    *a.fabric().refused.borrow_mut() = None;
    assert_eq!(a.registers_in_limbo(), 0);
    assert_eq!(
        register_of(&b, "k"),
        Some(r),
        "still mapped (to a tombstone)"
    );
    assert_eq!(get(&b, "k"), None);
    // b's insert replaces the dead mapping: b unmapped r, so b owns it.
    insert(&b, "k", "v2");
    assert_eq!(b.recycle_stats().retired, 1);
    world.advance(grace(&store) + 1);
    // b deletes k (retiring its register too) and inserts another key: it gets r.
    assert!(delete(&b, "k"));
    insert(&b, "k3", "v3");
    assert_eq!(register_of(&b, "k3"), Some(r));
    assert_eq!(get(&a, "k3").as_deref(), Some("v3"));
    assert_eq!(get(&a, "k"), None);
}

#[test]
fn a_delete_paused_past_its_deadline_never_unmaps_its_register_reused_for_the_same_key() {
    let dir = ScratchDir::new("kv-recycle-paused").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (p, b) = (client(&store, &world), client(&store, &world));
    insert(&p, "k", "v1");
    let r = register_of(&p, "k").unwrap();
    // p deletes k: the tombstone lands, then p pauses right after posting its
    // first index read (the unmap has not started deciding anything).
    let layout = *store.layout();
    *p.fabric().paused_on.borrow_mut() = Some(layout.index_at..layout.registers_at);
    let stats = OpStats::new();
    let mut paused = std::pin::pin!(p.delete(b"k", &stats));
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..3 {
        assert!(paused.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(get(&b, "k"), None, "the tombstone is written");
    // Long after p's deadline, b re-inserts k (replacing the dead mapping: b owns
    // r), deletes it, and after r's grace inserts k again: into r.
    world.advance(MAX_OP_NS + 1);
    insert(&b, "k", "v2");
    world.advance(grace(&store) + 1);
    assert!(delete(&b, "k"));
    insert(&b, "k", "v3");
    assert_eq!(register_of(&b, "k"), Some(r), "r holds k again");
    // p resumes. Its unmap would find k -> r (same key, same register) and clear
    // the live mapping; its deadline passed, so it posts no CAS.
    *p.fabric().paused_on.borrow_mut() = None;
    assert_eq!(
        block_on(p.fabric(), paused).expect("the tombstone was written: deleted"),
        DeleteOutcome::Removed
    );
    let c = client(&store, &world);
    assert_eq!(
        get(&c, "k").as_deref(),
        Some("v3"),
        "the paused delete unmapped k"
    );
    assert_eq!(register_of(&c, "k"), Some(r));
}

/// A client paused between its fence check and its stores (its batches held
/// unapplied, for longer than any grace) must not destroy a recycled register's new
/// value when they land: `a` deletes `k1` through its cache and pauses before its
/// tombstone CAS (expecting the delete word empty) reaches any replica; `b` deletes
/// `k1`, recycles its register `r` and inserts `k2` into it; then `a`'s CASes land.
///
/// `a`'s CAS expects `r`'s first life's delete word, which the reset raised to the
/// next life's marker (`swarm_kv::registers::reset`): it changes nothing, and `a`,
/// told `Recycled`, asks the index.
#[test]
fn a_paused_delete_whose_cas_lands_after_recycling_leaves_the_new_key_alone() {
    let dir = ScratchDir::new("kv-recycle-paused-cas").unwrap();
    let store = tiny(&dir, 256 << 10);
    let world = World::new();
    let (a, b) = (client(&store, &world), client(&store, &world));
    insert(&a, "k1", "v1");
    let r = register_of(&a, "k1").unwrap();
    assert_eq!(get(&a, "k1").as_deref(), Some("v1"), "a caches k1 -> r");
    let layout = *store.layout();
    let at = layout.register(r).unwrap();
    *a.fabric().unapplied_on.borrow_mut() = Some(at..at + layout.register_slot_bytes);
    let stats = OpStats::new();
    let mut paused = std::pin::pin!(a.delete(b"k1", &stats));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(paused.as_mut().poll(&mut cx).is_pending());
    assert!(
        !a.fabric().unapplied.borrow().is_empty(),
        "a's tombstone CASes wait unapplied"
    );
    // Meanwhile b deletes k1, retires r, and past the grace reuses it for k2.
    assert!(delete(&b, "k1"));
    world.advance(grace(&store) + 1);
    insert(&b, "k2", "v2");
    assert_eq!(register_of(&b, "k2"), Some(r), "r was recycled for k2");
    // a's stores land now; then a resumes.
    a.fabric().land_unapplied();
    // Its CAS found another life's marker: it changed nothing, and its delete ends
    // past its deadline (its outcome unknown) or, asking the index, not `Removed`.
    let outcome = block_on(a.fabric(), paused);
    let c = client(&store, &world);
    assert_eq!(
        get(&c, "k2").as_deref(),
        Some("v2"),
        "k2 survives a's late CAS"
    );
    match outcome {
        Ok(outcome) => assert_ne!(
            outcome,
            DeleteOutcome::Removed,
            "b's delete removed k1's value"
        ),
        Err(error) => assert!(error.is_fenced(), "{error}"),
    }
    assert_eq!(get(&c, "k1"), None);
}

/// Splitmix64: the churn's seeded choices.
fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Faults a churn injects.
#[derive(Clone, Copy, Debug, Default)]
struct ChurnFaults {
    /// About one operation in a hundred runs while its client cannot reach the index
    /// (its unmap is lost, or it fails and counts as crashed: it may or may not have
    /// taken effect).
    outages: bool,
    /// About one delete or update in forty pauses after its checks, before its
    /// stores reach any register (its batches to register memory are held), while
    /// the other clients run for several register graces; then its stores land and
    /// it resumes (a SIGSTOP, a long preemption, a VM's stolen time).
    pauses: bool,
    /// Deletes leave their index unmap to run later (`KvConfig::deferred_unmaps`,
    /// 4 waiting at most), and a client runs its waiting unmaps about once in
    /// twenty operations, possibly after others deleted and re-inserted the key.
    deferred: bool,
    /// About one update in five reaches one replica only (its client cannot reach
    /// the other two: it fails, and may or may not have taken effect), so reads find
    /// values on a minority and write them back into their writers' logs; and about
    /// one get in three pauses before its write-back's stores (its batches into the
    /// logs are held), or before its write-back guard goes up, while the others run
    /// for several slot graces, with logs small
    /// enough that their writers reuse slots meanwhile. After each pause, every
    /// register's current value must have an intact copy on each replica that holds
    /// it (a late write-back into a reused slot would garble one).
    write_backs: bool,
    /// About one delete or update in five pauses with its index batches held (it
    /// went to the index: a cache miss, or its write through the cache met a
    /// tombstone or another life), while one other client inserts the same key (a
    /// register reset meanwhile may take it), then resumes within its deadline.
    index_pauses: bool,
    /// Node 2's memory is lost after two capacities of inserts, and a repair
    /// rebuilds it a quarter of a capacity later, with operations running during
    /// its copy (so that resets leave the node out, then go through the repair
    /// journal).
    repair: bool,
    /// About one insert in 16 (up to three capacities of inserts, through the
    /// node's loss and repair) stalls past its deadline right after one of its
    /// first dozen posts (chosen at random): in its register write, its index read
    /// or blind round, or an index call, so that it ends `Fenced` wherever it was
    /// (an outcome unknown), and retires its fresh register only where it knows
    /// the index did not map it (`KvClient::insert`).
    stalled_inserts: bool,
    /// About one insert in four stops right after some of its index batches landed
    /// (after 0 to 5 of them, at random), their answers unread and its batches to one
    /// node (at random) still on their way, while another client deletes the key
    /// (its lookup finishes the insert's change where a quorum holds it) and unmaps
    /// it; the insert resumes past the index's acknowledgement wait (a shorter one
    /// here: 250 µs), within its deadline (docs/pauses.md, H10).
    insert_pauses: bool,
}

/// Churn operations run during a repair's copy (see [`ChurnFaults::repair`]).
const REPAIR_OPS: u32 = 60;

/// What a churn operation returns: whether it took effect (`None`: unknown) and the
/// value it read or wrote.
type ChurnResult = Result<(Option<bool>, Option<String>), KvError>;

/// Whether a churn operation that failed with `e` may or may not have taken effect
/// (besides those whose fabric failed on purpose): it stopped past its deadline, or
/// a delete that could not tell with a node lost ([`KvError::DeleteUndecided`]).
fn outcome_unknown(e: &KvError) -> bool {
    e.is_fenced() || matches!(e, KvError::DeleteUndecided { .. })
}

/// An insert that lost track of its index change and found no sign of its fate
/// (docs/pauses.md, H10): its outcome is unknown.
fn index_outcome_unknown(e: &KvError) -> bool {
    matches!(e, KvError::Index(_))
        && e.to_string()
            .contains("the outcome of this index update is unknown")
}

/// A paused churn operation's future.
type PausedFuture<'c> = std::pin::Pin<Box<dyn std::future::Future<Output = ChurnResult> + 'c>>;

/// A churn operation paused with its register stores held (see [`ChurnFaults`]).
struct Paused<'c> {
    client: usize,
    kind: OpKind,
    key: String,
    value: Option<String>,
    start: u64,
    /// Other clients' operations left before it resumes.
    left: u32,
    future: PausedFuture<'c>,
}

/// One churn run: three clients on one thread, `10 × capacity` inserts over a key
/// space of a quarter of the capacity, with deletes, gets and updates, and `faults`.
/// Returns the registers recycled.
fn churn(seed: u64, faults: ChurnFaults) -> u64 {
    let dir = ScratchDir::new("kv-recycle-churn").unwrap();
    // A paused client's pool and limbo are out of use while it sleeps: twice the
    // registers, so that the others do not run dry meanwhile.
    // So is a lost node's share of retirements whose marks cannot all land (they
    // leak rather than risk a second owner, `swarm_kv::registers::recycle`).
    let capacity = if faults.repair {
        4 * CHURN_REGISTERS
    } else if faults.pauses {
        2 * CHURN_REGISTERS
    } else {
        CHURN_REGISTERS
    };
    // Small logs with write-backs: writers reuse slots within a pause.
    let log_slots = if faults.write_backs { 48 } else { 1 << 12 };
    // Cache entries that outlive every register grace (the default lifetime, 10 s
    // of virtual time: the churn takes about 1 s): clients keep using stale
    // locations across their registers' reuse, which only the register's life
    // tells apart (`swarm_kv::cache`, "Stale entries").
    // Every other seed, one metadata word per register: every writer's CAS then
    // expects the word all writers share, so a stale CAS through such an entry finds
    // a later life's write (not its marker) there, and only the delete word tells
    // the lives apart.
    let store = exact_with(&dir, capacity, log_slots, |p| {
        p.cache_ttl_ns = ClusterParams::default().cache_ttl_ns;
        if seed % 2 == 1 {
            p.meta_words = 1;
        }
    });
    let layout = *store.layout();
    let world = World::new();
    let mut config = KvConfig {
        deferred_unmaps: if faults.deferred { 4 } else { 0 },
        ..config(&store)
    };
    if faults.insert_pauses {
        // An acknowledgement wait well within the operation deadline (1 ms), as
        // with the defaults (1 ms within 200 ms), so that an insert stopped past it
        // still goes on.
        config.index.slow_after_ns = 25_000;
        config.index.max_backoff_ns = 50_000;
        config.index.ack_wait_ns = 250_000;
    }
    let clients: Vec<Client> = (0..3)
        .map(|_| client_with(&store, &world, config))
        .collect();
    // Fewer keys than registers: live keys, retired registers and the clients'
    // pools share the rest. Pools are per client: see `CHURN_REGISTERS`.
    let keys = capacity / 4;
    let mut history = History::new();
    let mut x = seed;
    let mut inserts = 0u64;
    let mut clock = 0u64;
    let mut op = 0u64;
    let (mut cut_offs, mut crashed, mut pauses, mut index_paused) = (0u32, 0u32, 0u32, 0u32);
    let mut insert_paused = 0u32;
    let mut paused: Option<Paused<'_>> = None;
    // The key an index pause left for another client to insert next, and that client.
    let mut racing_insert: Option<(String, usize)> = None;
    // The key an insert pause left for another client to delete next, and that client.
    let mut racing_delete: Option<(String, usize)> = None;
    let registers = layout.registers_at..layout.end();
    // One churn operation (or a paused one's end); returns the inserts so far.
    let mut step = || {
        op += 1;
        if op.is_multiple_of(AUDIT_EVERY) {
            let by = (0..3).find(|c| paused.as_ref().is_none_or(|p| p.client != *c));
            audit_mapped_registers(&store, &clients[by.unwrap()], keys, seed, op);
        }
        if let Some(p) = paused.as_mut() {
            p.left = p.left.saturating_sub(1);
        }
        if paused.as_ref().is_some_and(|p| p.left == 0) {
            // The paused client wakes up: its held stores land, then it goes on.
            let p = paused.take().unwrap();
            let fabric = clients[p.client].fabric();
            fabric.land_unapplied();
            // An insert pause's withheld answers are read now.
            *fabric.paused_on.borrow_mut() = None;
            fabric.pause_slow.set(None);
            let result = block_on(fabric, p.future);
            let record = match result {
                Ok((Some(ok), value)) => Operation::completed(
                    p.client as u64,
                    p.kind,
                    p.key,
                    value.as_deref(),
                    ok,
                    p.start,
                    clock,
                ),
                Ok((None, value)) => Operation::completed_unknown(
                    p.client as u64,
                    p.kind,
                    p.key,
                    value.as_deref(),
                    p.start,
                    clock,
                ),
                // Past its deadline, undecided, or an insert that lost track of its
                // index change: the outcome is unknown.
                Err(e) if outcome_unknown(&e) || index_outcome_unknown(&e) => {
                    crashed += 1;
                    Operation::crashed(p.client as u64, p.kind, p.key, p.value.as_deref(), p.start)
                }
                Err(e) => panic!(
                    "seed {seed} (CHURN_SEED to replay): paused {:?} failed: {e}",
                    p.kind
                ),
            };
            clock += 2;
            history.push(record).unwrap();
            if faults.write_backs {
                audit_current_copies(&store, seed, op);
            }
        }
        let r = next(&mut x);
        let mut c = (r % 3) as usize;
        if paused.as_ref().is_some_and(|p| p.client == c) {
            c = (c + 1) % 3;
        }
        let client = &clients[c];
        if faults.deferred && (r >> 20).is_multiple_of(20) {
            // Late unmaps: whatever happened to their keys since.
            block_on(client.fabric(), client.run_deferred_unmaps())
                .unwrap_or_else(|e| panic!("seed {seed}: deferred unmaps failed: {e}"));
        }
        let key = format!("key{}", (r >> 8) % keys);
        let value = format!("v{op}");
        let kind = match (r >> 32) % 10 {
            0..=3 => OpKind::Insert,
            4..=6 => OpKind::Delete,
            7..=8 => OpKind::Get,
            _ => OpKind::Update,
        };
        let (c, key, kind) = match (racing_insert.take(), racing_delete.take()) {
            (Some((key, by)), _) => (by, key, OpKind::Insert),
            (None, Some((key, by))) => (by, key, OpKind::Delete),
            (None, None) => (c, key, kind),
        };
        let client = &clients[c];
        let cut_off = faults.outages && (r >> 48).is_multiple_of(100);
        let pause_write_back = faults.write_backs
            && paused.is_none()
            && kind == OpKind::Get
            && (r >> 40).is_multiple_of(3);
        if pause_write_back {
            // A get that writes a value back pauses right before the write-back's
            // stores into the writer's log land, or right before its write-back guard
            // goes up (it may hold nothing: then it ends).
            let fabric = client.fabric();
            let start = clock;
            clock += 2;
            let held = if (r >> 56).is_multiple_of(2) {
                layout.swarm.log_base()..layout.swarm.log_base() + layout.swarm.log_bytes()
            } else {
                let guard = layout.client_row(client.writer()) + 56;
                guard..guard + 8
            };
            *fabric.unapplied_on.borrow_mut() = Some(held);
            let k = key.clone();
            let mut future: PausedFuture<'_> = Box::pin(async move {
                client
                    .get(k.as_bytes(), &OpStats::new())
                    .await
                    .map(|v| (Some(true), v.map(|v| String::from_utf8(v).unwrap())))
            });
            let mut cx = Context::from_waker(Waker::noop());
            let mut done = None;
            for _ in 0..1000 {
                if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                    done = Some(result);
                    break;
                }
                if fabric.holds_unapplied() {
                    break;
                }
                fabric.progress();
            }
            match done {
                Some(result) => {
                    fabric.land_unapplied();
                    let (ok, v) = result.unwrap_or_else(|e| {
                        panic!("seed {seed} (CHURN_SEED to replay): op {op} (get) failed: {e}")
                    });
                    history
                        .push(Operation::completed(
                            c as u64,
                            OpKind::Get,
                            key,
                            v.as_deref(),
                            ok.unwrap_or(true),
                            start,
                            clock,
                        ))
                        .unwrap();
                }
                None => {
                    pauses += 1;
                    paused = Some(Paused {
                        client: c,
                        kind: OpKind::Get,
                        key,
                        value: None,
                        start,
                        left: 120,
                        future,
                    });
                }
            }
            world.advance(500_000);
            return inserts;
        }
        // A torn update: its stores reach one replica, chosen at random.
        let torn = faults.write_backs && kind == OpKind::Update && (r >> 44).is_multiple_of(5);
        if torn {
            let reached = (r >> 52) % 3;
            client
                .fabric()
                .failed
                .borrow_mut()
                .extend((0..3).filter(|&n| n != reached).map(|n| NodeId(n as u16)));
        }
        if faults.insert_pauses
            && paused.is_none()
            && kind == OpKind::Insert
            && (r >> 40).is_multiple_of(4)
        {
            let fabric = client.fabric();
            let start = clock;
            clock += 2;
            *fabric.paused_on.borrow_mut() = Some(layout.index_at..layout.registers_at);
            fabric.pause_after.set(((r >> 52) % 6) as u32);
            fabric.pause_slow.set(Some(NodeId(((r >> 56) % 3) as u16)));
            let (k, v) = (key.clone(), value.clone());
            let mut future: PausedFuture<'_> = Box::pin(async move {
                client
                    .insert(k.as_bytes(), v.as_bytes(), &OpStats::new())
                    .await
                    .map(|()| (Some(true), Some(v)))
            });
            let mut cx = Context::from_waker(Waker::noop());
            let mut done = None;
            for _ in 0..1000 {
                if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                    done = Some(result);
                    break;
                }
                if fabric.holds_unapplied() {
                    break;
                }
                fabric.progress();
            }
            inserts += 1;
            match done {
                Some(result) => {
                    fabric.land_unapplied();
                    *fabric.paused_on.borrow_mut() = None;
                    fabric.pause_slow.set(None);
                    fabric.pause_after.set(0);
                    let record = match result {
                        Ok((_, v)) => Operation::completed(
                            c as u64,
                            kind,
                            key,
                            v.as_deref(),
                            true,
                            start,
                            clock,
                        ),
                        Err(e) if outcome_unknown(&e) || index_outcome_unknown(&e) => {
                            crashed += 1;
                            Operation::crashed(c as u64, kind, key, Some(&value), start)
                        }
                        Err(e) => panic!("seed {seed}: op {op} ({kind:?}) failed: {e}"),
                    };
                    history.push(record).unwrap();
                    world.advance(500_000);
                }
                None => {
                    insert_paused += 1;
                    racing_delete = Some((key.clone(), (c + 1 + (r >> 60) as usize % 2) % 3));
                    paused = Some(Paused {
                        client: c,
                        kind,
                        key,
                        value: Some(value),
                        start,
                        // The racing delete, then it resumes.
                        left: 2,
                        future,
                    });
                }
            }
            return inserts;
        }
        if faults.index_pauses
            && paused.is_none()
            && matches!(kind, OpKind::Delete | OpKind::Update)
            && (r >> 40).is_multiple_of(5)
        {
            // This operation pauses at its first index batch, held unapplied, while
            // one other client inserts its key; it resumes before its deadline.
            let fabric = client.fabric();
            let start = clock;
            clock += 2;
            *fabric.unapplied_on.borrow_mut() = Some(layout.index_at..layout.registers_at);
            let (k, v) = (key.clone(), value.clone());
            let mut future: PausedFuture<'_> = if kind == OpKind::Delete {
                Box::pin(async move {
                    client
                        .delete(k.as_bytes(), &OpStats::new())
                        .await
                        .map(|d| (d.removed(), None))
                })
            } else {
                Box::pin(async move {
                    client
                        .update(k.as_bytes(), v.as_bytes(), &OpStats::new())
                        .await
                        .map(|ok| (Some(ok), Some(v)))
                })
            };
            let mut cx = Context::from_waker(Waker::noop());
            let mut done = None;
            for _ in 0..1000 {
                if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                    done = Some(result);
                    break;
                }
                if fabric.holds_unapplied() {
                    break;
                }
                fabric.progress();
            }
            match done {
                Some(result) => {
                    fabric.land_unapplied();
                    let record = match result {
                        Ok((Some(ok), v)) => Operation::completed(
                            c as u64,
                            kind,
                            key,
                            v.as_deref(),
                            ok,
                            start,
                            clock,
                        ),
                        Ok((None, v)) => Operation::completed_unknown(
                            c as u64,
                            kind,
                            key,
                            v.as_deref(),
                            start,
                            clock,
                        ),
                        Err(e) if outcome_unknown(&e) => {
                            let written = (kind == OpKind::Update).then_some(value.clone());
                            Operation::crashed(c as u64, kind, key, written.as_deref(), start)
                        }
                        Err(e) => panic!("seed {seed}: op {op} ({kind:?}) failed: {e}"),
                    };
                    history.push(record).unwrap();
                    world.advance(500_000);
                }
                None => {
                    index_paused += 1;
                    racing_insert = Some((key.clone(), (c + 1 + (r >> 60) as usize % 2) % 3));
                    let value = (kind == OpKind::Update).then_some(value);
                    paused = Some(Paused {
                        client: c,
                        kind,
                        key,
                        value,
                        start,
                        // One other operation (the racing insert), then it resumes.
                        left: 2,
                        future,
                    });
                }
            }
            return inserts;
        }
        if faults.pauses
            && paused.is_none()
            && matches!(kind, OpKind::Delete | OpKind::Update)
            && (r >> 40).is_multiple_of(40)
        {
            // This operation pauses between its checks and its register stores. A
            // get first caches the key's register, so that the operation's first
            // register batch carries its CAS (a delete's tombstone, a write's MAX).
            pauses += 1;
            let fabric = client.fabric();
            let (start, got) = (clock, get(client, &key));
            history
                .push(Operation::completed(
                    c as u64,
                    OpKind::Get,
                    key.clone(),
                    got.as_deref(),
                    true,
                    start,
                    start + 1,
                ))
                .unwrap();
            clock += 2;
            let start = clock;
            clock += 2;
            *fabric.unapplied_on.borrow_mut() = Some(registers.clone());
            let (k, v) = (key.clone(), value.clone());
            let mut future: PausedFuture<'_> = if kind == OpKind::Delete {
                Box::pin(async move {
                    client
                        .delete(k.as_bytes(), &OpStats::new())
                        .await
                        .map(|d| (d.removed(), None))
                })
            } else {
                Box::pin(async move {
                    client
                        .update(k.as_bytes(), v.as_bytes(), &OpStats::new())
                        .await
                        .map(|ok| (Some(ok), Some(v)))
                })
            };
            let mut cx = Context::from_waker(Waker::noop());
            // Polled until its first register store is held (or it ends without one).
            let mut done = None;
            for _ in 0..1000 {
                if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                    done = Some(result);
                    break;
                }
                if fabric.holds_unapplied() {
                    break;
                }
                fabric.progress();
            }
            match done {
                Some(result) => {
                    // Whatever it held meanwhile (a reset it started) lands now.
                    fabric.land_unapplied();
                    let record = match result {
                        Ok((Some(ok), v)) => Operation::completed(
                            c as u64,
                            kind,
                            key,
                            v.as_deref(),
                            ok,
                            start,
                            clock,
                        ),
                        Ok((None, v)) => Operation::completed_unknown(
                            c as u64,
                            kind,
                            key,
                            v.as_deref(),
                            start,
                            clock,
                        ),
                        Err(e) if outcome_unknown(&e) => {
                            let written = (kind == OpKind::Update).then_some(value.clone());
                            Operation::crashed(c as u64, kind, key, written.as_deref(), start)
                        }
                        Err(e) => panic!("seed {seed}: op {op} ({kind:?}) failed: {e}"),
                    };
                    history.push(record).unwrap();
                }
                None => {
                    let value = (kind == OpKind::Update).then_some(value);
                    paused = Some(Paused {
                        client: c,
                        kind,
                        key,
                        value,
                        start,
                        // Longer than a few register graces: the others recycle meanwhile.
                        left: 120,
                        future,
                    });
                }
            }
            world.advance(500_000);
            return inserts;
        }
        if cut_off {
            cut_offs += 1;
            *client.fabric().refused.borrow_mut() = Some(layout.index_at..layout.registers_at);
        }
        // Until the repair is well over: a stalled insert whose index call may have
        // mapped its register leaks it (never a second owner), so stalls all along
        // would run the churn's registers out.
        let stalled = faults.stalled_inserts
            && kind == OpKind::Insert
            && inserts < 3 * capacity
            && (r >> 40).is_multiple_of(16);
        if stalled {
            world.stall_at_post.set(2 * MAX_OP_NS);
            world.stall_countdown.set(1 + ((r >> 52) % 12) as u32);
        }
        let f = client.fabric();
        let s = OpStats::new();
        let start = clock;
        // `None`: a delete that found a tombstone of an earlier, failed attempt of
        // its own client (Raced), recorded with an unknown outcome.
        let result: ChurnResult = match kind {
            OpKind::Insert => {
                inserts += 1;
                block_on(f, client.insert(key.as_bytes(), value.as_bytes(), &s))
                    .map(|()| (Some(true), Some(value.clone())))
            }
            OpKind::Delete => {
                block_on(f, client.delete(key.as_bytes(), &s)).map(|d| (d.removed(), None))
            }
            OpKind::Get => block_on(f, client.get(key.as_bytes(), &s))
                .map(|v| (Some(true), v.map(|v| String::from_utf8(v).unwrap()))),
            _ => block_on(f, client.update(key.as_bytes(), value.as_bytes(), &s))
                .map(|ok| (Some(ok), Some(value.clone()))),
        };
        *client.fabric().refused.borrow_mut() = None;
        world.stall_countdown.set(0);
        world.stall_at_post.set(0);
        if torn {
            client.fabric().failed.borrow_mut().clear();
        }
        clock += 2;
        let record = match result {
            Ok((Some(ok), value)) => {
                Operation::completed(c as u64, kind, key, value.as_deref(), ok, start, start + 1)
            }
            Ok((None, value)) => Operation::completed_unknown(
                c as u64,
                kind,
                key,
                value.as_deref(),
                start,
                start + 1,
            ),
            Err(e) if cut_off || torn || stalled || outcome_unknown(&e) => {
                crashed += 1;
                let written = matches!(kind, OpKind::Insert | OpKind::Update).then_some(value);
                Operation::crashed(c as u64, kind, key, written.as_deref(), start)
            }
            Err(e) => {
                let stats: Vec<_> = clients.iter().map(|c| c.recycle_stats()).collect();
                panic!(
                    "seed {seed} (CHURN_SEED to replay): op {op} ({kind:?} {key}) failed: {e}; recycling: {stats:?}"
                )
            }
        };
        history.push(record).unwrap();
        // Clients run at a modest pace: 500 µs of virtual time per operation, so
        // about 25 operations' retired registers wait for their grace at any time.
        world.advance(500_000);
        inserts
    };
    // With a node lost and repaired, outages, pauses and stalls leak a register now
    // and then (never a second owner): six capacities of inserts, not ten, keep
    // the churn clear of running out (about one seed in 250 did at ten).
    let limit = if faults.repair { 6 } else { 10 } * capacity;
    let (mut lost, mut repaired, mut during) = (false, false, 0u32);
    loop {
        let done = step();
        if done >= limit {
            break;
        }
        if faults.repair && !lost && done >= 2 * capacity {
            // Node 2's memory is lost (its file retired); the churn goes on without it.
            assert!(ShmCluster::retire_node(dir.path(), 2).unwrap());
            lost = true;
        }
        if faults.repair && lost && !repaired && done >= 2 * capacity + capacity / 4 {
            // A repair rebuilds node 2 while the churn goes on: a few operations each
            // time the copy reports progress, with lease renewals due, so that the
            // clients follow its announcement and its admission meanwhile (resets go
            // through the repair journal, `swarm_kv::registers::journal`).
            ShmStore::repair(
                dir.path(),
                2,
                RepairOptions {
                    quiesce_ns: Some(0),
                    replace: false,
                    ..RepairOptions::DEFAULT
                },
                |_, _| {
                    if during < REPAIR_OPS {
                        world.advance(layout.params.lease_renew_ns / 4);
                        for _ in 0..3 {
                            during += 1;
                            step();
                        }
                    }
                },
            )
            .unwrap_or_else(|e| panic!("seed {seed}: repair of node 2: {e}"));
            repaired = true;
            let journaled: u64 = clients
                .iter()
                .map(|c| c.recycle_stats().reset_through_journal)
                .sum();
            eprintln!(
                "seed {seed}: {during} operations during the repair, {journaled} resets journaled"
            );
        }
    }
    assert!(
        !faults.outages || cut_offs > 0,
        "seed {seed}: no outage injected"
    );
    assert!(
        !faults.pauses || pauses > 0,
        "seed {seed}: no pause injected"
    );
    assert!(
        !faults.insert_pauses || insert_paused > 0,
        "seed {seed}: no insert pause injected"
    );
    eprintln!(
        "seed {seed}: {op} operations, {cut_offs} index outages, {pauses} pauses, \
         {index_paused} index pauses, {insert_paused} insert pauses, {crashed} failed"
    );
    if let Some(p) = paused.take() {
        let fabric = clients[p.client].fabric();
        fabric.land_unapplied();
        *fabric.paused_on.borrow_mut() = None;
        fabric.pause_slow.set(None);
        let _ = block_on(fabric, p.future);
        history
            .push(Operation::crashed(
                p.client as u64,
                p.kind,
                p.key,
                p.value.as_deref(),
                p.start,
            ))
            .unwrap();
    }
    audit_mapped_registers(&store, &clients[0], keys, seed, op);
    let report = swarm_checker::check(&history);
    assert!(
        report.is_linearizable(),
        "seed {seed} (CHURN_SEED to replay), faults {faults:?}: {report}"
    );
    clients.iter().map(|c| c.recycle_stats().recycled).sum()
}

/// Checks that every register's current value (the largest word any replica holds,
/// unless it is a tombstone or a reset's life marker) has an intact copy on each
/// replica whose metadata holds it: the record in its writer's log slot validates and
/// names it. A write-back that landed in a slot its writer had reused would garble one
/// (`swarm_core::write_back_guard`). Reads node memory directly.
fn audit_current_copies(store: &ShmStore, seed: u64, op: u64) {
    let raw = store.fabric();
    let layout = store.layout();
    let swarm = layout.swarm;
    let read = |node: u16, addr: u64, len: u64| -> Vec<u8> {
        let ticket = raw.post(NodeId(node), Batch::read(addr, len as u32));
        loop {
            if let Poll::Ready(result) = raw.poll(ticket) {
                return result.expect("audit read").take_read(0).unwrap();
            }
            raw.progress();
        }
    };
    for register in 0..layout.params.registers {
        let addr = layout.register(register).unwrap();
        let maxima: Vec<Tsp> = (0..3)
            .map(|node| {
                read(node, addr + swarm.meta_offset(), swarm.meta_bytes())
                    .chunks_exact(8)
                    .map(|w| Tsp::from_word(u64::from_le_bytes(w.try_into().unwrap())))
                    .max()
                    .unwrap()
            })
            .collect();
        let current = *maxima.iter().max().unwrap();
        if current.is_void() || current.is_tombstone() {
            continue;
        }
        for (node, _) in maxima.iter().enumerate().filter(|(_, m)| **m == current) {
            let slot = swarm.buffer_addr(current.ts()).unwrap();
            let mut record = read(node as u16, slot + 8, swarm.record_bytes());
            let held = decode_record(&mut record, swarm.payload_max()).map(|r| r.tsp.ts());
            assert_eq!(
                held,
                Some(current.ts()),
                "seed {seed} (CHURN_SEED to replay), after op {op}: register {register}'s \
                 current value {current:?} has no intact copy on node {node}"
            );
        }
    }
}

/// Checks that no register the index maps was retired or reset in its current life
/// (issue 43, "key header missing"): for every key, each register a slot of the
/// key's buckets maps holds a key on some node that is not lost (an insert writes
/// the key header, `(len, 0)`, on a majority before it publishes, one node may be
/// lost, a repair copies a kept key to the rebuilt node, and only a reset blanks
/// it; the index reports the header missing when every copy it reads is blank), and
/// no copy holding the key carries a holder tag (`(len, t)`: a retirement mark or a
/// take, which prove the life ended, `swarm_kv::registers::limbo`). A client that
/// retired a register the index maps, or a second owner that reset one, breaks it
/// at once, before an insert of the key meets the blank header. Reads node memory
/// directly, and the index through `client`.
fn audit_mapped_registers(store: &ShmStore, client: &Client, keys: u64, seed: u64, op: u64) {
    let raw = store.fabric();
    let layout = store.layout();
    // A node whose memory is lost answers as crashed: its copies are not read.
    let read = |node: u16, addr: u64, len: u64| -> Option<Vec<u8>> {
        let ticket = raw.post(NodeId(node), Batch::read(addr, len as u32));
        loop {
            if let Poll::Ready(result) = raw.poll(ticket) {
                return result.ok()?.take_read(0);
            }
            raw.progress();
        }
    };
    let header_bytes = layout.params.key_header_bytes();
    for k in 0..keys {
        let key = format!("key{k}");
        let found = block_on(
            client.fabric(),
            client
                .index()
                .lookup(client.fabric(), &OpStats::new(), key.as_bytes()),
        )
        .unwrap_or_else(|e| panic!("seed {seed}, after op {op}: audit lookup of {key}: {e}"));
        for register in found.registers {
            let at = layout
                .key_header(register)
                .expect("a mapped register exists");
            // Per node not lost: the key length, the holder tag, and the key bytes.
            let copies: Vec<(u32, u32, Vec<u8>)> = (0..raw.node_count() as u16)
                .filter_map(|node| read(node, at, header_bytes))
                .map(|h| {
                    let len = u32::from_le_bytes(h[0..4].try_into().unwrap());
                    let tag = u32::from_le_bytes(h[4..8].try_into().unwrap());
                    let key = h.get(8..8 + len as usize).unwrap_or_default().to_vec();
                    (len, tag, key)
                })
                .collect();
            let words: Vec<(u32, u32)> = copies.iter().map(|(l, t, _)| (*l, *t)).collect();
            assert!(
                copies.iter().any(|(len, _, _)| *len != 0),
                "seed {seed} (CHURN_SEED to replay), after op {op}: register {register}, \
                 which the index maps (a candidate of {key}), holds no key on any node \
                 read: (len, holder tag) per node {words:?}"
            );
            let retired = copies
                .iter()
                .position(|(len, tag, k)| *len != 0 && *tag != 0 && k.as_slice() == key.as_bytes());
            assert!(
                retired.is_none(),
                "seed {seed} (CHURN_SEED to replay), after op {op}: register {register}, \
                 which the index maps to {key}, carries a holder tag (retired or taken \
                 while mapped): (len, holder tag) per node {words:?}"
            );
        }
    }
}

/// How often (in churn operations) [`audit_mapped_registers`] runs, besides once at
/// the end.
const AUDIT_EVERY: u64 = 16;

/// Registers of a churn's cluster. Free registers sit in per-client pools: an insert
/// takes one from its client's pool, a delete's unmap gives one to its client's, and
/// the churn picks clients at random, so each client's share drifts as a random
/// walk, about √ops. Before donations (`swarm_kv::registers::recycle`, "donations") about 2 %
/// of seeds drove one client to an empty pool with every chunk claimed while the
/// others held ~50 free registers: `RegistersFull`, no register leaked (seeds 119,
/// 121, 143, 203, 265, 276, 318, 395 of 0..400 with faults, 10 of 400 without).
/// With donations, and a reclamation pass taking at most a chunk's worth of them,
/// no seed of 0..400 fails either way, so the churn keeps this small size: it
/// exercises donations.
const CHURN_REGISTERS: u64 = 64;

/// The churn's seeds: `CHURN_SEED` alone if set, else four, plus `replays`.
fn churn_seeds(replays: &[u64]) -> Vec<u64> {
    churn_seeds_n(4, replays)
}

/// [`churn_seeds`] with `count` seeds from the run's base.
fn churn_seeds_n(count: u64, replays: &[u64]) -> Vec<u64> {
    match std::env::var("CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        // `count` seeds from the run's base (`SWARM_SIM_SEED_BASE`: CI explores new
        // ones each run), then the regression seeds.
        None => (0..count)
            .map(|i| (0x5eed_u64 + i).wrapping_add(swarm_sim::seed_base()))
            .chain(replays.iter().copied())
            .collect(),
    }
}

#[test]
fn a_churn_of_ten_times_the_register_capacity_completes_and_is_linearizable() {
    // Seeds 55 and 185 ran a client dry (`RegistersFull`) when a reclamation pass took
    // every donation it found: the first dry client hoarded them (`CHURN_REGISTERS`).
    for seed in churn_seeds(&[55, 185]) {
        let recycled = churn(seed, ChurnFaults::default());
        assert!(
            recycled >= 8 * CHURN_REGISTERS,
            "seed {seed}: only {recycled} registers recycled for {} inserts on {CHURN_REGISTERS} registers",
            10 * CHURN_REGISTERS
        );
    }
}

#[test]
fn a_churn_with_index_outages_stays_linearizable() {
    // Seed 108's schedule met a slot-recycling check whose reads predated a write on a
    // register reset and reused meanwhile: the write's slot was recycled while it
    // was the register's value, and a later read failed validation
    // (`swarm_core::slot_recycling`, rule 3). Seed 92 ran a client dry when a reclamation
    // pass took every donation it found.
    for seed in churn_seeds(&[108, 92]) {
        churn(
            seed,
            ChurnFaults {
                outages: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// Deletes whose index unmaps run late (after other clients deleted, recycled and
/// re-inserted their keys), with clients paused before their stores as above: a
/// late unmap never unmaps a later life of its key (`deferred_unmap.rs`).
#[test]
fn a_churn_with_late_deferred_unmaps_stays_linearizable() {
    for seed in churn_seeds(&[]) {
        churn(
            seed,
            ChurnFaults {
                pauses: true,
                deferred: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// Clients paused between their checks and their register stores, for several
/// register graces, while the others delete, recycle and re-insert: their stores
/// land on registers recycled meanwhile and must change nothing there (a reset
/// raises every word to a marker no earlier life's CAS expects,
/// `swarm_kv::registers::reset`).
#[test]
fn a_churn_with_clients_paused_before_their_stores_stays_linearizable() {
    for seed in churn_seeds(&[]) {
        churn(
            seed,
            ChurnFaults {
                pauses: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// Deletes and updates paused at their index batches while another client inserts
/// the same key, with cache entries that outlive their registers' lives: one whose
/// write through a stale entry met a tombstone must not unmap the key's life of now,
/// nor let an outcome decided in another life of its register stand (the register
/// may have been reset and taken by that insert meanwhile): the randomized form of
/// `a_stale_write_meets_a_later_lifes_tombstone`. Seeds are cheap (under 0.1 s); an
/// update that unmaps through its stale entry fails about one seed in 25, a delete
/// whose stale outcome stands about one in 10 (mutants
/// `kv-update-unmaps-through-a-stale-cache`, `kv-delete-stale-outcome-stands-in-a-new-life`).
#[test]
fn a_churn_with_index_pauses_and_racing_reinserts_stays_linearizable() {
    for seed in churn_seeds_n(96, &[]) {
        churn(
            seed,
            ChurnFaults {
                index_pauses: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// Reads that write values back, paused before their stores for several slot graces
/// while writers reuse their log slots: every current value keeps intact copies
/// (`swarm_core::write_back_guard`).
#[test]
fn a_churn_with_reads_paused_before_their_write_backs_keeps_every_copy() {
    // Sixteen seeds (a third of a second each): a writer that ignores guards garbles
    // a copy on about two seeds in three.
    for seed in churn_seeds_n(16, &[]) {
        churn(
            seed,
            ChurnFaults {
                write_backs: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// Issue 43 ("key header missing"): a churn with index outages, index pauses and
/// inserts stalled past their deadline (operations that fail or stop, their outcome
/// unknown) while
/// node 2 is lost and then rebuilt by a repair that runs during the churn. No
/// register the index maps may be retired or reset meanwhile
/// ([`audit_mapped_registers`], every [`AUDIT_EVERY`] operations).
#[test]
fn a_churn_through_a_node_loss_and_its_repair_never_retires_a_mapped_register() {
    for seed in churn_seeds(&[]) {
        churn(
            seed,
            ChurnFaults {
                outages: true,
                index_pauses: true,
                repair: true,
                stalled_inserts: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// H10 (docs/pauses.md): inserts stopped right after some of their index batches
/// landed, answers unread, while another client finishes, deletes and unmaps their
/// change; when they resume they must never map their register again (its unmapper
/// owns it): [`audit_mapped_registers`] finds a mapped register retired or reset.
#[test]
fn a_churn_with_inserts_stopped_after_their_index_batches_landed_never_maps_a_retired_register() {
    for seed in churn_seeds_n(32, &[]) {
        churn(
            seed,
            ChurnFaults {
                insert_pauses: true,
                ..ChurnFaults::default()
            },
        );
    }
}

/// One churn step of [`a_lost_node_out_of_service_does_not_stop_register_recycling`]:
/// a random insert, delete, get or update by one of `clients`, checked against
/// `model` (the clients run one operation at a time, with no faults).
fn churn_step(clients: &[Client], model: &mut HashMap<String, String>, x: &mut u64, op: u64) {
    let r = next(x);
    let client = &clients[(r % clients.len() as u64) as usize];
    let key = format!("key{}", (r >> 8) % 16);
    let value = format!("v{op}");
    let s = OpStats::new();
    let f = client.fabric();
    match (r >> 32) % 10 {
        0..=3 => {
            block_on(f, client.insert(key.as_bytes(), value.as_bytes(), &s))
                .unwrap_or_else(|e| panic!("op {op}: insert {key}: {e}"));
            model.insert(key, value);
        }
        4..=6 => {
            let deleted = block_on(f, client.delete(key.as_bytes(), &s))
                .unwrap_or_else(|e| panic!("op {op}: delete {key}: {e}"));
            assert_eq!(
                deleted.removed(),
                Some(model.remove(&key).is_some()),
                "op {op}: delete {key}"
            );
        }
        7..=8 => assert_eq!(
            get(client, &key).as_ref(),
            model.get(&key),
            "op {op}: get {key}"
        ),
        _ => {
            let updated = block_on(f, client.update(key.as_bytes(), value.as_bytes(), &s))
                .unwrap_or_else(|e| panic!("op {op}: update {key}: {e}"));
            assert_eq!(updated, model.contains_key(&key), "op {op}: update {key}");
            if updated {
                model.insert(key, value);
            }
        }
    }
    clients[0].fabric().world.advance(500_000);
}

/// A churn of [`churn_step`]s from one seed, numbering its operations.
struct Churn {
    x: u64,
    op: u64,
}

impl Churn {
    fn new(seed: u64) -> Self {
        Self { x: seed, op: 0 }
    }

    fn run(&mut self, clients: &[Client], model: &mut HashMap<String, String>, ops: u64) {
        for _ in 0..ops {
            self.op += 1;
            churn_step(clients, model, &mut self.x, self.op);
        }
    }
}

fn total_recycled(clients: &[Client]) -> u64 {
    clients.iter().map(|c| c.recycle_stats().recycled).sum()
}

/// Writes `config` to nodes `nodes` only (a repair's announcement on the donors).
fn write_config_to(store: &ShmStore, config: &Configuration, nodes: &[u16]) {
    let f = store.fabric();
    for &n in nodes {
        let t = f.post(NodeId(n), Batch::write(CONFIG_AT, config.encode()));
        block_on(&f, core::future::poll_fn(|_| f.poll(t))).expect("config written");
    }
}

/// Retires node 0 (after a repair of node 2: nodes 1 and 2 must hold every key's
/// state), checks every churn key against `model` with a new client, and closes
/// `clients`.
fn lose_node_0_and_read_every_key(
    dir: &ScratchDir,
    store: &ShmStore,
    world: &Rc<World>,
    model: &HashMap<String, String>,
    clients: Vec<Client>,
) {
    assert!(ShmCluster::retire_node(dir.path(), 0).unwrap());
    let reader = client(store, world);
    for k in 0..16 {
        let key = format!("key{k}");
        assert_eq!(
            get(&reader, &key).as_ref(),
            model.get(&key),
            "{key} after losing node 0"
        );
    }
    for c in clients {
        c.close();
    }
}

/// Nonzero entries in node 0's repair journal (`swarm_kv::registers::journal`).
fn journal_entries(store: &ShmStore) -> usize {
    let layout = store.layout();
    let f = store.fabric();
    let len = u64::from(layout.params.writers) * swarm_kv::testing::JOURNAL_ROW_BYTES;
    let t = f.post(
        NodeId(0),
        Batch::read(layout.journal_at.expect("a journal"), len as u32),
    );
    let c = block_on(&f, core::future::poll_fn(|_| f.poll(t))).expect("journal read");
    c.read(0)
        .unwrap()
        .chunks_exact(8)
        .filter(|w| w.iter().any(|&b| b != 0))
        .count()
}

/// Issue 12: while a node's memory is lost and out of service, register resets
/// leave it out, so a churn of many times the register capacity goes on; once a
/// repair announced itself, the registers reset without the node wait in the
/// repair journal until a repair copies them (none runs here at first, so inserts
/// wait up to 30 s, then fail); the repair rebuilds it with
/// the recycled registers' fresh state, so losing another node afterwards loses
/// nothing and reads no stale tombstone.
#[test]
fn a_lost_node_out_of_service_does_not_stop_register_recycling() {
    let dir = ScratchDir::new("kv-recycle-lost").unwrap();
    let capacity = 64;
    let store = exact(&dir, capacity, 1 << 12);
    let world = World::new();
    let clients: Vec<Client> = (0..2).map(|_| client(&store, &world)).collect();
    let mut model = HashMap::new();
    let mut churn = Churn::new(0x1057);
    churn.run(&clients, &mut model, 300);

    // Node 2's memory is lost: its file retired (a crash that takes the memory).
    assert!(ShmCluster::retire_node(dir.path(), 2).unwrap());
    let before = total_recycled(&clients);
    // Ten times the capacity in inserts (about 4 in 10 operations).
    churn.run(&clients, &mut model, 1600);
    let degraded = total_recycled(&clients) - before;
    assert!(
        degraded >= 4 * capacity,
        "only {degraded} registers recycled with node 2 out"
    );
    let without: u64 = clients
        .iter()
        .map(|c| c.recycle_stats().reset_without_lost)
        .sum();
    assert!(
        without >= degraded,
        "{without} of {degraded} counted as reset without node 2"
    );

    // A reset without node 2 hands its register out only once two lease renewals
    // posted after it read no announcement: let the last ones come back.
    for _ in 0..6 {
        clients[0]
            .fabric()
            .world
            .advance(store.layout().params.lease_renew_ns);
        for c in &clients {
            // A delete (of no key) moves the client's resets along; a get renews.
            get(c, "key0");
            assert!(!delete(c, "no such key"));
        }
    }
    // A repair of node 2 announces itself: resets still leave node 2 out, but the
    // registers wait in the repair journal until the repair copied them to node 2
    // (here no repair runs yet, so they wait).
    let mut announced = read_configuration(&store.fabric()).unwrap();
    announced.epoch += 1;
    announced.set_repairing(2, true);
    write_config_to(&store, &announced, &[0, 1]);
    // A lease renewal shows the new epoch, and a later operation follows it (until
    // then a client may still reset without node 2: the repair's quiescence wait
    // covers those resets).
    clients[0]
        .fabric()
        .world
        .advance(store.layout().params.lease_renew_ns * 2);
    for _ in 0..3 {
        for c in &clients {
            get(c, "key0");
        }
    }
    let recycled = total_recycled(&clients);
    for i in 0..6 {
        for c in &clients {
            let key = format!("announced{i}");
            insert(c, &key, "x");
            assert!(delete(c, &key));
        }
        clients[0].fabric().world.advance(grace(&store) + 1);
    }
    assert_eq!(
        total_recycled(&clients),
        recycled,
        "a register came back after the announcement before any repair copied it"
    );
    assert!(
        journal_entries(&store) > 0,
        "no reset journaled after the announcement"
    );

    // Out of registers while the repair runs, an insert waits for the admission (up
    // to 30 s) instead of failing after two graces.
    let waited_from = world.now.get();
    let mut i = 0;
    let error = loop {
        let key = format!("waiting{i}");
        i += 1;
        assert!(i < 1000, "registers never ran out");
        let c = &clients[0];
        match block_on(c.fabric(), c.insert(key.as_bytes(), b"x", &OpStats::new())) {
            Ok(()) => assert!(delete(c, &key)),
            Err(error) => break error,
        }
    };
    assert!(matches!(error, KvError::RegistersFull { .. }), "{error}");
    let waited = world.now.get() - waited_from;
    assert!(waited >= 30_000_000_000, "gave up after {waited} ns");

    // The repair rebuilds node 2 (from nodes 0 and 1, whose registers the resets
    // above brought back), and the clients admit it.
    let report = ShmStore::repair(
        dir.path(),
        2,
        RepairOptions {
            quiesce_ns: Some(0),
            replace: false,
            ..RepairOptions::DEFAULT
        },
        |_, _| {},
    )
    .expect("repair");
    assert_eq!(report.epoch, announced.epoch + 2);
    clients[0]
        .fabric()
        .world
        .advance(store.layout().params.lease_renew_ns * 2);
    churn.run(&clients, &mut model, 800);
    assert!(total_recycled(&clients) > recycled, "recycling resumed");
    assert!(
        clients
            .iter()
            .map(|c| c.recycle_stats().reset_through_journal)
            .sum::<u64>()
            > 0,
        "the journaled registers came back"
    );
    assert_eq!(
        journal_entries(&store),
        0,
        "the repair serviced the journal"
    );

    // Node 0 lost too: nodes 1 and 2 hold every key's state.
    lose_node_0_and_read_every_key(&dir, &store, &world, &model, clients);
}

/// Issue 12, the repair journal (`swarm_kv::registers::journal`): registers retired before a
/// repair copies them (their tombstones go to the rebuilt node) and reset after it,
/// while the repair still runs, leave the rebuilt node out of their reset and wait
/// in the journal; the repair copies their reset state to the node before it
/// admits it, so losing another node afterwards reads no stale tombstone under a
/// reused register's new key.
#[test]
fn registers_reset_during_a_repair_come_back_through_the_journal() {
    let dir = ScratchDir::new("kv-recycle-journal").unwrap();
    let store = exact(&dir, 64, 1 << 12);
    let world = World::new();
    let clients: Vec<Client> = (0..2).map(|_| client(&store, &world)).collect();
    let mut model = HashMap::new();
    let mut churn = Churn::new(0x10_0a1);
    churn.run(&clients, &mut model, 200);
    assert!(ShmCluster::retire_node(dir.path(), 2).unwrap());
    churn.run(&clients, &mut model, 100);
    // Retire every key's register now: the copy reads their tombstones, their
    // resets come after it.
    for k in 0..16 {
        let key = format!("key{k}");
        let c = &clients[k % 2];
        assert_eq!(delete(c, &key), model.remove(&key).is_some(), "{key}");
    }
    let layout = *store.layout();
    let registers_end = 128
        + u64::from(layout.params.writers) * 64
        + 8 * layout.chunks()
        + 64 * layout.params.index_buckets
        + layout.params.registers * layout.register_slot_bytes;
    let mut during = None;
    let report = ShmStore::repair(
        dir.path(),
        2,
        RepairOptions {
            quiesce_ns: Some(0),
            replace: false,
            ..RepairOptions::DEFAULT
        },
        |done, _| {
            if done < registers_end || during.is_some() {
                return;
            }
            // The registers area is copied; the repair has not admitted node 2.
            // The clients follow its announcement, the retired registers pass
            // their grace, and a churn resets and reuses registers.
            world.advance(layout.params.lease_renew_ns * 2);
            for c in &clients {
                get(c, "key0");
                get(c, "key1");
            }
            world.advance(grace(&store) + 1);
            let recycled = total_recycled(&clients);
            churn.run(&clients, &mut model, 40);
            let entries = journal_entries(&store);
            during = Some((total_recycled(&clients) - recycled, entries));
        },
    )
    .expect("repair");
    let (handed_out, entries) = during.expect("the repair copied the registers area");
    assert!(entries > 0, "no reset journaled during the repair");
    assert_eq!(
        handed_out, 0,
        "a register reset without node 2 came back before the repair copied it"
    );
    assert!(report.journaled >= entries as u64, "{report:?}");
    world.advance(layout.params.lease_renew_ns * 2);
    churn.run(&clients, &mut model, 300);
    assert!(
        clients
            .iter()
            .map(|c| c.recycle_stats().reset_through_journal)
            .sum::<u64>()
            >= entries as u64,
        "the journaled registers came back"
    );
    // Node 0 lost: nodes 1 and 2 hold every key's state, no old tombstone.
    lose_node_0_and_read_every_key(&dir, &store, &world, &model, clients);
}

/// A tiny cluster whose location-cache entries do not expire within a test (the
/// default lifetime, 10 s of virtual time, far beyond the register grace): a
/// client's stale entry stays in use however often its register is recycled.
fn tiny_lasting_cache(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 8,
        chunk_registers: 8,
        meta_words: 4,
        max_op_ns: MAX_OP_NS,
        ..ClusterParams::default()
    };
    assert!(params.register_grace_ns() < params.cache_ttl_ns / 100);
    ShmStore::create(dir.path(), 3, 256 << 10, params).expect("create")
}

/// A history of sequential operations (each ends before the next starts), unless
/// the test opens one with [`Recorded::start`] and closes it later.
#[derive(Default)]
struct Recorded {
    history: History,
    clock: u64,
}

impl Recorded {
    fn start(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn done(&mut self, c: u64, kind: OpKind, key: &str, value: Option<&str>, ok: bool, start: u64) {
        self.clock += 1;
        self.history
            .push(Operation::completed(
                c, kind, key, value, ok, start, self.clock,
            ))
            .unwrap();
    }

    fn insert(&mut self, c: (u64, &Client), key: &str, value: &str) {
        let start = self.start();
        insert(c.1, key, value);
        self.done(c.0, OpKind::Insert, key, Some(value), true, start);
    }

    fn get(&mut self, c: (u64, &Client), key: &str) -> Option<String> {
        let start = self.start();
        let got = get(c.1, key);
        self.done(c.0, OpKind::Get, key, got.as_deref(), true, start);
        got
    }

    fn update(&mut self, c: (u64, &Client), key: &str, value: &str) -> bool {
        let start = self.start();
        let ok = update(c.1, key, value);
        self.done(c.0, OpKind::Update, key, Some(value), ok, start);
        ok
    }

    fn delete(&mut self, c: (u64, &Client), key: &str) -> DeleteOutcome {
        let start = self.start();
        let outcome =
            block_on(c.1.fabric(), c.1.delete(key.as_bytes(), &OpStats::new())).expect("delete");
        let ok = outcome.removed().expect("no racing deletes here");
        self.done(c.0, OpKind::Delete, key, None, ok, start);
        outcome
    }

    fn check(&self) {
        let report = swarm_checker::check(&self.history);
        assert!(report.is_linearizable(), "{report}");
    }
}

/// A client keeps a cached location across its register's reuse: `b` deletes the
/// key, the register passes its grace (far shorter than the cache lifetime) and
/// is reset for another life holding another key, or this key again, or a later
/// life that was deleted too. Every get, update and delete through the stale entry
/// must see that the register is not in the entry's life (another marker, or a
/// tombstone it cannot place), change nothing there, and go through the index.
#[test]
fn a_stale_cached_location_across_its_registers_reuse_goes_through_the_index() {
    let dir = ScratchDir::new("kv-recycle-stale-lives").unwrap();
    let store = tiny_lasting_cache(&dir);
    let world = World::new();
    let (a, b, c) = (
        client(&store, &world),
        client(&store, &world),
        client(&store, &world),
    );
    let (a, b, c) = ((0, &a), (1, &b), (2, &c));
    let mut h = Recorded::default();
    // `a` caches `key` → r (its life known), `b` deletes it; past the grace `b`
    // inserts `next` (a key), which gets r back in a new life. Returns r.
    let stale = |h: &mut Recorded, key: &str, next: &str, value: &str| -> u64 {
        h.insert(a, key, "old");
        let r = register_of(a.1, key).unwrap();
        assert_eq!(h.get(a, key).as_deref(), Some("old"), "a caches {key} -> r");
        assert_eq!(h.delete(b, key), DeleteOutcome::Removed);
        world.advance(grace(&store) + 1);
        h.insert(b, next, value);
        assert_eq!(register_of(b.1, next), Some(r), "r is reused for {next}");
        r
    };
    // Another key in r: the entry's key is absent.
    stale(&mut h, "g1", "o1", "x1");
    assert_eq!(h.get(a, "g1"), None);
    stale(&mut h, "u1", "o2", "x2");
    assert!(!h.update(a, "u1", "stale"), "u1 is absent");
    stale(&mut h, "d1", "o3", "x3");
    assert_eq!(h.delete(a, "d1"), DeleteOutcome::Absent);
    for (key, value) in [("o1", "x1"), ("o2", "x2"), ("o3", "x3")] {
        assert_eq!(h.get(c, key).as_deref(), Some(value), "{key} untouched");
    }
    // The same key again, in the same register's next life: found through the index.
    stale(&mut h, "g2", "g2", "new");
    assert_eq!(h.get(a, "g2").as_deref(), Some("new"));
    stale(&mut h, "u2", "u2", "new");
    assert!(h.update(a, "u2", "a's"));
    assert_eq!(h.get(c, "u2").as_deref(), Some("a's"));
    stale(&mut h, "d2", "d2", "new");
    assert_eq!(h.delete(a, "d2"), DeleteOutcome::Removed);
    assert_eq!(h.get(c, "d2"), None);
    // A later life deleted too (its tombstone does not say whose life it ends),
    // with the entry's key living elsewhere meanwhile (`c` deletes and inserts, so
    // that `b`'s pool holds only the register `stale` recycles).
    for (key, other) in [("g3", "o4"), ("u3", "o5"), ("d3", "o6")] {
        stale(&mut h, key, other, "x");
        assert_eq!(h.delete(c, other), DeleteOutcome::Removed);
        h.insert(c, key, "moved");
    }
    assert_eq!(h.get(a, "g3").as_deref(), Some("moved"));
    assert!(h.update(a, "u3", "a's"));
    assert_eq!(h.get(c, "u3").as_deref(), Some("a's"));
    assert_eq!(h.delete(a, "d3"), DeleteOutcome::Removed);
    assert_eq!(h.get(c, "d3"), None);
    assert_eq!(
        a.1.cache_expired(),
        0,
        "every stale entry was used, none expired"
    );
    h.check();
}

/// The window an unmap through a stale cached location would open: `a`'s entry
/// names r in an old life; r's later life is deleted and retired, its grace over.
/// `a`'s update (or delete) through the entry finds that life's tombstone (its
/// CAS finds a write of that life in its own metadata word, not a marker); while
/// `a`'s next index batch is held (a paused client), r is reset and the same key
/// inserted into it. `a` must not unmap the key's new life (an update that unmapped
/// `key → r` through the cache did; a delete that let its outcome stand because the
/// index still named r did too), and the history must stay linearizable.
fn a_stale_write_meets_a_later_lifes_tombstone(delete_it: bool) {
    let dir = ScratchDir::new("kv-recycle-stale-tombstone").unwrap();
    let store = tiny_lasting_cache(&dir);
    let layout = *store.layout();
    let world = World::new();
    let (a, b, c) = (
        client(&store, &world),
        client(&store, &world),
        client(&store, &world),
    );
    let mut h = Recorded::default();
    h.insert((0, &a), "k", "v1");
    let r = register_of(&a, "k").unwrap();
    assert_eq!(
        h.get((0, &a), "k").as_deref(),
        Some("v1"),
        "a caches k -> r"
    );
    assert_eq!(h.delete((1, &b), "k"), DeleteOutcome::Removed);
    world.advance(grace(&store) + 1);
    h.insert((1, &b), "other", "x");
    assert_eq!(register_of(&b, "other"), Some(r));
    // `a` writes r's second life too, so that its own metadata word there holds a
    // write, not the life's marker (which its stale CAS would find and report as
    // another life's): then only the tombstone is left for it to meet.
    assert!(h.update((0, &a), "other", "y"));
    assert_eq!(h.delete((1, &b), "other"), DeleteOutcome::Removed);
    // r's second life is deleted and retired; its grace passes (its reset waits for
    // b's next operation).
    world.advance(grace(&store) + 1);
    let fabric = a.fabric();
    *fabric.unapplied_on.borrow_mut() = Some(layout.index_at..layout.registers_at);
    let start = h.start();
    let mut future: PausedFuture<'_> = if delete_it {
        Box::pin(async {
            a.delete(b"k", &OpStats::new())
                .await
                .map(|d| (d.removed(), None))
        })
    } else {
        Box::pin(async {
            a.update(b"k", b"a's", &OpStats::new())
                .await
                .map(|ok| (Some(ok), Some("a's".to_string())))
        })
    };
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1000 {
        assert!(
            future.as_mut().poll(&mut cx).is_pending(),
            "a went to the index after meeting the tombstone"
        );
        if fabric.holds_unapplied() {
            break;
        }
        fabric.progress();
    }
    assert!(fabric.holds_unapplied(), "a's index batch is held");
    // Meanwhile b resets r and inserts k into it.
    h.insert((1, &b), "k", "v3");
    assert_eq!(register_of(&b, "k"), Some(r), "k lives in r again");
    fabric.land_unapplied();
    let (ok, value) = block_on(fabric, future).expect("a's operation");
    let kind = if delete_it {
        OpKind::Delete
    } else {
        OpKind::Update
    };
    h.done(
        0,
        kind,
        "k",
        value.as_deref(),
        ok.expect("no racing deletes"),
        start,
    );
    let now = h.get((2, &c), "k");
    if delete_it {
        assert_eq!(ok, Some(true), "a deleted k's new life");
        assert_eq!(now, None);
    } else {
        assert_eq!(ok, Some(true), "a updated k's new life");
        assert_eq!(now.as_deref(), Some("a's"));
    }
    assert_eq!(
        a.recycle_stats().retired,
        u64::from(delete_it),
        "a unmapped nothing through its stale entry"
    );
    h.check();
}

#[test]
fn a_stale_update_that_meets_a_later_lifes_tombstone_unmaps_nothing() {
    a_stale_write_meets_a_later_lifes_tombstone(false);
}

#[test]
fn a_stale_delete_that_meets_a_later_lifes_tombstone_deletes_the_keys_life_of_now() {
    a_stale_write_meets_a_later_lifes_tombstone(true);
}
