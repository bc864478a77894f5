//! Leases end to end on in-memory nodes with a virtual clock shared by every client:
//! a client that stops renewing (a pause: it issues nothing while others run) loses
//! its writer id only after the lease expired, and then fails instead of writing; a
//! client that keeps renewing is never reclaimed; an idle client renews when it
//! comes back.

use std::cell::Cell;
use std::rc::Rc;
use std::task::Poll;

use swarm_core::fabric::{FailNodes, Nanos, Ticket};
use swarm_core::{
    Batch, Completion, Fabric, FabricError, FixedClock, MemCluster, MemFabric, NodeId, OpStats,
    block_on, block_on_future,
};

use crate::layout::{ClusterParams, NodeLayout};
use crate::membership::lease::LeaseParams;
use crate::membership::owner_process::OwnerLiveness;
use crate::membership::writer_takeover::take_over_expired;
use crate::{DeleteOutcome, KvClient, KvConfig, KvError};

const NODE_BYTES: u64 = 4 << 20;
const MS: Nanos = 1_000_000;
/// Virtual time that passes per `progress` call while somebody waits for a deadline.
const STEP: Nanos = MS;

/// A fabric on shared in-memory nodes whose clock is shared by every handle and moves
/// only while somebody waits for a deadline ([`Fabric::wake_at`]): whoever is not
/// running an operation then is *paused*.
struct Paced {
    inner: MemFabric,
    time: Rc<Cell<Nanos>>,
    wake: Rc<Cell<Nanos>>,
}

impl Fabric for Paced {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }
    fn progress(&self) -> bool {
        let inner = self.inner.progress();
        let now = self.time.get();
        if now < self.wake.get() {
            self.time.set((now + STEP).min(self.wake.get()));
            return true;
        }
        inner
    }
    fn now(&self) -> Nanos {
        self.time.get()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.wake.set(self.wake.get().max(deadline));
    }
}

struct World {
    cluster: MemCluster,
    layout: NodeLayout,
    time: Rc<Cell<Nanos>>,
    wake: Rc<Cell<Nanos>>,
}

impl World {
    fn new(writers: u16) -> Self {
        Self::with_params(writers, |params| params)
    }

    /// A world of `writers` writer ids whose cluster's parameters, once fitted to the
    /// node size, are `adjust`ed (made smaller).
    fn with_params(writers: u16, adjust: impl FnOnce(ClusterParams) -> ClusterParams) -> Self {
        let params = adjust(
            ClusterParams {
                writers,
                ..ClusterParams::default()
            }
            .for_node_size(NODE_BYTES)
            .expect("a 4 MiB node fits a small cluster"),
        );
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, NODE_BYTES as usize);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        Self {
            cluster,
            layout,
            time: Rc::new(Cell::new(1_000 * MS)),
            wake: Rc::new(Cell::new(0)),
        }
    }

    fn fabric(&self) -> Paced {
        Paced {
            inner: self.cluster.client(),
            time: self.time.clone(),
            wake: self.wake.clone(),
        }
    }

    fn connect(&self) -> KvClient<Paced, FixedClock> {
        KvClient::connect(
            self.fabric(),
            FixedClock(1_000),
            self.layout,
            KvConfig::new(0, 1),
        )
        .expect("a writer id")
    }

    /// A client whose memory node `down` never answers.
    fn connect_without(&self, down: u16) -> KvClient<FailNodes<Paced>, FixedClock> {
        let fabric = FailNodes::new(self.fabric());
        fabric.fail_node(NodeId(down));
        KvClient::connect(fabric, FixedClock(1_000), self.layout, KvConfig::new(0, 1))
            .expect("a writer id")
    }

    fn now(&self) -> Nanos {
        self.time.get()
    }

    fn lease(&self) -> LeaseParams {
        LeaseParams::from_params(&self.layout.params)
    }
}

fn get<F: Fabric>(c: &KvClient<F, FixedClock>, key: &str) -> Result<Option<Vec<u8>>, KvError> {
    block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new()))
}

fn insert<F: Fabric>(c: &KvClient<F, FixedClock>, key: &str, value: &str) -> Result<(), KvError> {
    block_on(
        c.fabric(),
        c.insert(key.as_bytes(), value.as_bytes(), &OpStats::new()),
    )
}

#[test]
fn a_paused_client_loses_its_id_only_after_expiry_and_then_fails_instead_of_writing() {
    let world = World::new(2);
    let a = world.connect();
    let b = world.connect();
    insert(&a, "a", "from a").expect("inserted");
    insert(&b, "b", "from b").expect("inserted");
    // Every id is taken; a and b now pause (issue nothing). A third client watches
    // both leases for the observer's wait, finds them unchanged, and takes one.
    let before = world.now();
    let c = world.connect();
    let waited = world.now() - before;
    assert!(
        waited >= world.lease().observer_wait_ns(),
        "an id was reclaimed after {waited} ns, before the lease could have expired"
    );
    assert_eq!(c.writer(), a.writer(), "the first dead row is taken over");
    // The dead client's acknowledged value stays readable (its log was resumed).
    assert_eq!(get(&c, "a").expect("read"), Some(b"from a".to_vec()));
    // The paused client comes back: it cannot renew a killed lease and stops.
    assert!(matches!(
        insert(&a, "a", "zombie"),
        Err(KvError::LeaseExpired { writer }) if writer == a.writer()
    ));
    assert!(matches!(get(&a, "a"), Err(KvError::LeaseExpired { .. })));
    assert_eq!(get(&c, "a").expect("read"), Some(b"from a".to_vec()));
    // The other dead row was released: the next client gets it without waiting.
    let before = world.now();
    let d = world.connect();
    assert_eq!(d.writer(), b.writer());
    assert!(world.now() - before < world.lease().observer_wait_ns());
    assert_eq!(get(&d, "b").expect("read"), Some(b"from b".to_vec()));
    assert!(matches!(
        insert(&b, "b", "zombie"),
        Err(KvError::LeaseExpired { .. })
    ));
    insert(&d, "b", "from d").expect("the new owner writes");
    assert_eq!(get(&c, "b").expect("read"), Some(b"from d".to_vec()));
}

#[test]
fn a_client_that_keeps_renewing_is_never_reclaimed() {
    for owners in [OwnerLiveness::Unknown, OwnerLiveness::ThisHost] {
        a_client_that_keeps_renewing_is_never_reclaimed_with(owners);
    }
}

/// [`a_client_that_keeps_renewing_is_never_reclaimed`], with a reclaimer that judges
/// owner processes by `owners` (on this host it reads the lease words again instead
/// of killing, and must still tell a renewed lease from a lapsed one).
fn a_client_that_keeps_renewing_is_never_reclaimed_with(owners: OwnerLiveness) {
    let world = World::new(1);
    let a = world.connect();
    insert(&a, "k", "v").expect("inserted");
    let watcher = world.fabric();
    let lease = world.lease();
    let watch = take_over_expired(&watcher, &world.layout, &lease, Some(77), None, owners);
    // Meanwhile a works at a slow pace: an operation every 100 ms of virtual time, for
    // longer than the watch.
    let work = async {
        for _ in 0..(lease.observer_wait_ns() / (100 * MS) + 10) {
            let got = a.get(b"k", &OpStats::new()).await;
            assert_eq!(got.expect("a keeps its lease"), Some(b"v".to_vec()));
            swarm_core::sleep(a.fabric(), 100 * MS).await;
        }
    };
    let (reclaimed, ()) =
        block_on_future(&watcher, swarm_core::join(watch, work)).expect("no stall");
    let reclaimed = reclaimed.expect("the watch ran");
    assert_eq!(reclaimed.taken, None, "a live client's id was taken");
    assert_eq!(reclaimed.alive, vec![a.writer()], "{owners:?}");
    assert!(a.lease_renewals() > 10);
    insert(&a, "k", "still mine").expect("a keeps writing");
}

/// A client that runs no operation but calls `keep_lease` (a benchmark thread
/// waiting for the others at a phase boundary) keeps its lease through a watch,
/// even where a reclaimer cannot judge owner processes and kills what did not move
/// (RDMA); and `lease_lost` tells a lost lease from a lapsed one.
#[test]
fn keep_lease_keeps_an_idle_client_through_a_watch_and_lease_lost_says_when_it_is_lost() {
    let world = World::new(2);
    let a = world.connect();
    insert(&a, "k", "v").expect("inserted");
    let watcher = world.fabric();
    let lease = world.lease();
    let watch = take_over_expired(
        &watcher,
        &world.layout,
        &lease,
        None,
        Some(a.writer()),
        OwnerLiveness::Unknown,
    );
    let keep = async {
        for _ in 0..(lease.observer_wait_ns() / (50 * MS) + 10) {
            assert!(a.keep_lease().await, "the lease stays valid");
            swarm_core::sleep(a.fabric(), 50 * MS).await;
        }
    };
    let (reclaimed, ()) =
        block_on_future(&watcher, swarm_core::join(watch, keep)).expect("no stall");
    let reclaimed = reclaimed.expect("the watch ran");
    assert_eq!(reclaimed.alive, vec![a.writer()]);
    assert!(!a.lease_lost());
    // Idle through a watch without it: killed (no owner process judged), and lost.
    let reclaimed = block_on(
        &watcher,
        take_over_expired(
            &watcher,
            &world.layout,
            &lease,
            None,
            Some(a.writer()),
            OwnerLiveness::Unknown,
        ),
    )
    .expect("the watch ran");
    assert_eq!(reclaimed.released, vec![a.writer()]);
    assert!(!block_on_future(a.fabric(), a.keep_lease()).expect("no stall"));
    assert!(a.lease_lost());
    assert!(matches!(get(&a, "k"), Err(KvError::LeaseExpired { .. })));
}

/// The soak's fill process connects its clients one after the other: a client that
/// connected first idles (it posts nothing, so its lease lapses) while a later
/// client of the same process finds every writer id claimed and watches the table
/// for the observer's wait. On this host the watch finds the idle client's lease
/// unchanged but its process running: it must leave the lease lapsed, not kill it,
/// so that the idle client's next operation revives it (`writer_takeover`, "A
/// running owner's lease is not killed"). Killed, every later operation of that
/// client failed with `LeaseExpired` (the soak's fill: 370,000 of them).
#[test]
fn an_idle_client_whose_process_runs_keeps_its_lease_through_a_registrants_watch() {
    use crate::membership::owner_process::{alive, this_process};
    if alive(this_process()).is_none() {
        eprintln!("no /proc on this host: process liveness is unknown here");
        return;
    }
    let world = World::new(1);
    let config = KvConfig {
        owners: OwnerLiveness::ThisHost,
        writer_wait_ns: 0,
        ..KvConfig::new(0, 1)
    };
    let connect = || KvClient::connect(world.fabric(), FixedClock(1_000), world.layout, config);
    let a = connect().expect("a writer id");
    insert(&a, "k", "v").expect("inserted");
    let before = world.now();
    assert!(
        matches!(connect(), Err(KvError::WritersFull { .. })),
        "the only writer id belongs to a running process"
    );
    assert!(
        world.now() - before >= world.lease().observer_wait_ns(),
        "the second client watched the table"
    );
    assert!(!a.lease_valid(), "a's lease lapsed during the watch");
    assert_eq!(
        get(&a, "k").expect("a revives its lapsed lease"),
        Some(b"v".to_vec())
    );
    assert!(a.lease_valid());
    insert(&a, "k2", "w").expect("a keeps writing");
    // A process that is gone is still taken over: the same watch, from a row whose
    // owner identity names no running process, takes it.
    let gone =
        crate::membership::owner_process::identity(std::process::id(), (this_process() >> 32) + 1);
    let pid_at = world.layout.client_row(a.writer()) + 16;
    let f = world.fabric();
    for node in 0..3u16 {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(
                NodeId(node),
                Batch::write(pid_at, gone.to_le_bytes().to_vec()),
            )
            .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    let c = connect().expect("the row of a gone process is taken over");
    assert_eq!(c.writer(), a.writer());
    assert_eq!(get(&c, "k2").expect("read"), Some(b"w".to_vec()));
    assert!(matches!(get(&a, "k"), Err(KvError::LeaseExpired { .. })));
}

#[test]
fn an_idle_client_renews_when_it_comes_back_if_nobody_reclaimed_its_id() {
    let world = World::new(1);
    let a = world.connect();
    insert(&a, "k", "v").expect("inserted");
    let renewals = a.lease_renewals();
    // Ten seconds without an operation: the lease lapsed, but nobody needed the id.
    world.time.set(world.now() + 10_000 * MS);
    assert!(!a.lease_valid());
    assert_eq!(
        get(&a, "k").expect("renewed synchronously"),
        Some(b"v".to_vec())
    );
    assert!(a.lease_renewals() > renewals);
    assert!(a.lease_valid());
}

#[test]
fn with_a_memory_node_down_leases_renew_and_expired_ids_are_still_reclaimed() {
    let world = World::new(1);
    let a = world.connect_without(2);
    insert(&a, "k", "v").expect("inserted with a majority");
    // Twenty operations 100 ms apart: the lease is renewed on the two live nodes.
    let renewals = a.lease_renewals();
    for _ in 0..20 {
        world.time.set(world.now() + 100 * MS);
        assert_eq!(get(&a, "k").expect("lease renewed"), Some(b"v".to_vec()));
    }
    assert!(a.lease_renewals() >= renewals + 5, "{}", a.lease_renewals());
    // a pauses; c, with the same node down, reclaims the only id after the wait.
    let before = world.now();
    let c = world.connect_without(2);
    assert_eq!(c.writer(), a.writer());
    assert!(world.now() - before >= world.lease().observer_wait_ns());
    assert_eq!(get(&c, "k").expect("read"), Some(b"v".to_vec()));
    assert!(matches!(
        insert(&a, "k", "zombie"),
        Err(KvError::LeaseExpired { .. })
    ));
    assert_eq!(get(&c, "k").expect("read"), Some(b"v".to_vec()));
}

#[test]
fn a_client_cut_off_from_a_majority_fences_itself() {
    let world = World::new(2);
    let fabric = FailNodes::new(world.fabric());
    let a = KvClient::connect(fabric, FixedClock(1_000), world.layout, KvConfig::new(0, 1))
        .expect("a writer id");
    insert(&a, "k", "v").expect("inserted");
    // A partition leaves a with node 0 only: its renewals reach a minority and must
    // not extend its lease. Once the term has passed it stops with a lease error,
    // not with a failed operation.
    a.fabric().fail_node(NodeId(1));
    a.fabric().fail_node(NodeId(2));
    world.time.set(world.now() + 2 * world.lease().lease_ns);
    assert!(matches!(get(&a, "k"), Err(KvError::LeaseExpired { .. })));
    assert!(matches!(
        insert(&a, "k", "cut off"),
        Err(KvError::LeaseExpired { .. })
    ));
    // The other side of the partition still reads the value a last wrote.
    let b = world.connect();
    assert_eq!(get(&b, "k").expect("read"), Some(b"v".to_vec()));
}

#[test]
fn two_clients_reclaiming_at_once_get_one_dead_id_each() {
    let world = World::new(2);
    let (a, b) = (world.connect(), world.connect());
    insert(&a, "a", "1").expect("inserted");
    insert(&b, "b", "2").expect("inserted");
    // Both pause; two new clients look for an id at the same time.
    let (fc, fd) = (world.fabric(), world.fabric());
    let both = swarm_core::join(
        crate::membership::writer_ids::register(
            &fc,
            &world.layout,
            3,
            101,
            1,
            OwnerLiveness::Unknown,
            0,
        ),
        crate::membership::writer_ids::register(
            &fd,
            &world.layout,
            3,
            202,
            2,
            OwnerLiveness::Unknown,
            0,
        ),
    );
    let (c, d) = block_on_future(&fc, both).expect("no stall");
    let (c, d) = (c.expect("an id for c").0, d.expect("an id for d").0);
    let mut ids = [c.writer, d.writer];
    ids.sort_unstable();
    assert_eq!(ids, [0, 1], "each took one dead id");
    assert!(c.reused && d.reused, "both logs are resumed");
    assert!(matches!(
        insert(&a, "a", "x"),
        Err(KvError::LeaseExpired { .. })
    ));
    assert!(matches!(
        insert(&b, "b", "x"),
        Err(KvError::LeaseExpired { .. })
    ));
}

/// A client killed mid-grace (it stops, its row stays registered): its limbo is left
/// alone while its row is registered, even once its lease lapsed, and is reclaimed
/// once its row was taken over by a new client, whose tag on the same writer id is
/// another (`crate::registers::limbo`).
#[test]
fn a_killed_clients_limbo_is_reclaimed_once_its_row_is_taken_over() {
    let world = World::new(2);
    let a = world.connect();
    insert(&a, "live", "A").expect("inserted");
    for i in 0..3 {
        let key = format!("k{i}");
        insert(&a, &key, "gone").expect("inserted");
        let deleted = block_on(a.fabric(), a.delete(key.as_bytes(), &OpStats::new()));
        assert_eq!(deleted.expect("delete"), DeleteOutcome::Removed);
    }
    assert_eq!(a.registers_in_limbo(), 3);
    // a is killed here: it never issues anything again.
    let b = world.connect();
    insert(&b, "b", "B").expect("inserted");
    block_on(b.fabric(), b.reclaim_gone_registers_now()).expect("a pass");
    assert_eq!(
        b.recycle_stats().reclaimed_limbo,
        0,
        "a registered client's limbo was taken"
    );
    // Every id is taken: c waits out a's lease and takes its row over.
    let c = world.connect();
    assert_eq!(c.writer(), a.writer());
    assert_ne!(c.recycler_tag(), a.recycler_tag());
    block_on(c.fabric(), c.reclaim_gone_registers_now()).expect("a pass");
    assert_eq!(
        c.recycle_stats().reclaimed_limbo,
        3,
        "{:?}",
        c.recycle_stats()
    );
    for i in 0..3 {
        assert_eq!(get(&c, &format!("k{i}")).expect("read"), None);
    }
    assert_eq!(get(&c, "live").expect("read"), Some(b"A".to_vec()));
    // b was idle meanwhile (its lease lapsed and c released its row too): its key stays.
    assert_eq!(get(&c, "b").expect("read"), Some(b"B".to_vec()));
    // The zombie cannot use what it held.
    assert!(matches!(
        insert(&a, "zombie", "Z"),
        Err(KvError::LeaseExpired { .. })
    ));
}

/// A fabric whose memory nodes cut this client off (as RDMA memory nodes do to a
/// client whose lease word stopped changing) until a reconnect completes at virtual
/// time `back_at`: batches posted before then fail, like batches on a cut queue pair.
struct Cut {
    inner: Paced,
    cut: Cell<bool>,
    back_at: Cell<Nanos>,
}

impl Cut {
    /// Cuts every node off until `reconnect_ns` from now.
    fn cut_for(&self, reconnect_ns: Nanos) {
        self.cut.set(true);
        self.back_at.set(self.inner.now() + reconnect_ns);
    }

    fn is_cut(&self) -> bool {
        self.cut.get() && self.inner.now() < self.back_at.get()
    }
}

impl Fabric for Cut {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.is_cut() {
            // A read past the node's end: the batch fails, as on a cut queue pair.
            return self.inner.post(node, Batch::read(NODE_BYTES, 8));
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
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

impl World {
    fn connect_cuttable(&self, lease_revive_ns: Nanos) -> KvClient<Cut, FixedClock> {
        let fabric = Cut {
            inner: self.fabric(),
            cut: Cell::new(false),
            back_at: Cell::new(0),
        };
        let config = KvConfig {
            lease_revive_ns,
            ..KvConfig::new(0, 1)
        };
        KvClient::connect(fabric, FixedClock(1_000), self.layout, config).expect("a writer id")
    }
}

#[test]
fn an_idle_client_cut_off_by_every_node_is_revived_once_they_reconnect() {
    let world = World::new(1);
    let a = world.connect_cuttable(crate::DEFAULT_LEASE_REVIVE_NS);
    insert(&a, "k", "v").expect("inserted");
    let renewals = a.lease_renewals();
    // Ten idle seconds: the lease lapsed, every node cut the client off, and the
    // transport's reconnects take 300 ms once it comes back.
    world.time.set(world.now() + 10_000 * MS);
    a.fabric().cut_for(300 * MS);
    let before = world.now();
    assert_eq!(get(&a, "k").expect("revived"), Some(b"v".to_vec()));
    assert!(
        world.now() - before >= 300 * MS,
        "the operation ran before any node was back"
    );
    assert!(a.lease_renewals() > renewals);
    assert!(a.lease_valid());
    insert(&a, "k2", "v2").expect("writes again");
    assert_eq!(get(&a, "k2").expect("read"), Some(b"v2".to_vec()));
}

#[test]
fn without_a_revive_window_an_idle_cut_client_fails_at_once() {
    let world = World::new(1);
    let a = world.connect_cuttable(0);
    insert(&a, "k", "v").expect("inserted");
    world.time.set(world.now() + 10_000 * MS);
    a.fabric().cut_for(300 * MS);
    assert!(matches!(get(&a, "k"), Err(KvError::LeaseExpired { .. })));
    // Once the nodes are back, the next operation renews.
    world.time.set(world.now() + 300 * MS);
    assert_eq!(get(&a, "k").expect("renewed"), Some(b"v".to_vec()));
}

#[test]
fn a_cut_client_gives_up_after_its_revive_window() {
    let world = World::new(1);
    let revive = 2_000 * MS;
    let a = world.connect_cuttable(revive);
    insert(&a, "k", "v").expect("inserted");
    world.time.set(world.now() + 10_000 * MS);
    // The nodes stay unreachable for longer than the window.
    a.fabric().cut_for(60_000 * MS);
    let before = world.now();
    assert!(matches!(get(&a, "k"), Err(KvError::LeaseExpired { .. })));
    let waited = world.now() - before;
    assert!(
        (revive..revive + 2 * world.lease().renew_ns).contains(&waited),
        "gave up after {waited} ns"
    );
}

#[test]
fn a_cut_client_whose_lease_was_killed_fails_even_once_the_nodes_are_back() {
    let world = World::new(1);
    let a = world.connect_cuttable(crate::DEFAULT_LEASE_REVIVE_NS);
    insert(&a, "k", "v").expect("inserted");
    // a idles and is cut off; meanwhile another client waits out its lease, kills
    // it and takes its writer id.
    let c = world.connect();
    assert_eq!(c.writer(), a.writer(), "the dead id is taken over");
    a.fabric().cut_for(300 * MS);
    let before = world.now();
    assert!(matches!(
        insert(&a, "k", "zombie"),
        Err(KvError::LeaseExpired { writer }) if writer == a.writer()
    ));
    // It stopped as soon as it saw the kill, not at the end of the window.
    assert!(world.now() - before < crate::DEFAULT_LEASE_REVIVE_NS / 2);
    assert_eq!(get(&c, "k").expect("read"), Some(b"v".to_vec()));
}

/// What a [`Recording`] fabric saw, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A batch with a plain write at this address.
    Write(u64),
    /// The client fenced itself.
    Fence,
}

/// A fabric that records plain writes and the client's fence, in posting order.
struct Recording {
    inner: Paced,
    seen: std::cell::RefCell<Vec<Seen>>,
}

impl Fabric for Recording {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        for op in batch.ops() {
            if let swarm_core::Op::Write { addr, .. } = op {
                self.seen.borrow_mut().push(Seen::Write(*addr));
            }
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
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
    fn fence_owner(&self, fence: swarm_core::fabric::OwnerFence) -> usize {
        self.seen.borrow_mut().push(Seen::Fence);
        self.inner.fence_owner(fence)
    }
}

/// A registration stores nothing but CASes before it fences itself
/// (`writer_takeover`, "A registration paused before its fence"): a revocation
/// acknowledged before the fence cuts nothing of it, so a plain store it posted then
/// (its wall clock on a renewal, a released row's write-back guard lowered) could
/// land whenever it runs again. Here it takes one dead row over and releases another.
#[test]
fn a_registration_posts_no_plain_store_before_its_fence() {
    let world = World::new(2);
    let a = world.connect();
    let b = world.connect();
    insert(&a, "a", "from a").expect("inserted");
    insert(&b, "b", "from b").expect("inserted");
    let fabric = Recording {
        inner: world.fabric(),
        seen: std::cell::RefCell::new(Vec::new()),
    };
    let c = KvClient::connect(fabric, FixedClock(1_000), world.layout, KvConfig::new(0, 1))
        .expect("a writer id");
    assert_eq!(c.writer(), a.writer(), "a's row was taken over");
    let seen = c.fabric().seen.borrow();
    let fence = seen
        .iter()
        .position(|s| *s == Seen::Fence)
        .expect("c fenced itself");
    let early: Vec<&Seen> = seen[..fence].iter().collect();
    assert!(
        early.is_empty(),
        "plain stores posted before the fence: {early:x?}"
    );
    drop(seen);
    // b's row was released: the next client gets it at once.
    let before = world.now();
    let d = world.connect();
    assert_eq!(d.writer(), b.writer());
    assert!(world.now() - before < world.lease().observer_wait_ns());
}

/// A fabric whose client stops right before its first batch that stores into one of
/// the words `at`: that batch and every later one are held, unapplied, until
/// [`StopsAt::land`] (the client wakes up). Its control flow goes on meanwhile, as if
/// it had posted them: only their landing is late.
struct StopsAt {
    inner: Paced,
    at: Vec<u64>,
    stopped: Cell<bool>,
    held: std::cell::RefCell<Vec<Held>>,
}

/// A batch held unapplied (taken when it lands), and its inner ticket once landed.
type Held = (Option<(NodeId, Batch)>, Option<Ticket>);

const STOPPED: u32 = 1 << 31;

impl StopsAt {
    fn land(&self) {
        for entry in self.held.borrow_mut().iter_mut() {
            if let Some((node, batch)) = entry.0.take() {
                entry.1 = Some(self.inner.post(node, batch));
            }
        }
    }
}

impl Fabric for StopsAt {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let touches = batch.ops().iter().any(|op| match op {
            swarm_core::fabric::Op::Read { .. } => false,
            swarm_core::fabric::Op::Write { addr, .. }
            | swarm_core::fabric::Op::Cas { addr, .. } => self.at.contains(addr),
        });
        if touches {
            self.stopped.set(true);
        }
        if !self.stopped.get() {
            return self.inner.post(node, batch);
        }
        let mut held = self.held.borrow_mut();
        held.push((Some((node, batch)), None));
        Ticket(STOPPED | (held.len() as u32 - 1))
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 & STOPPED == 0 {
            return self.inner.poll(ticket);
        }
        match self.held.borrow()[(ticket.0 & !STOPPED) as usize].1 {
            Some(inner) => self.inner.poll(inner),
            None => Poll::Pending,
        }
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & STOPPED == 0 {
            self.inner.forget(ticket);
        } else if let Some(inner) = self.held.borrow()[(ticket.0 & !STOPPED) as usize].1 {
            self.inner.forget(inner);
        }
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline);
    }
}

/// Two reclaimers release one dead row. One stops right before its first store into
/// the row's claim word or guard word (once it killed the lease); the other releases
/// the row, a new client registers
/// on it and raises its own guard. The stopped one wakes up: nothing it stores may
/// lower the new owner's guard (a write-back could then land in a reused log slot,
/// `swarm_core::write_back_guard`). docs/pauses.md, H5.
#[test]
fn a_stopped_reclaimer_never_lowers_the_next_owners_guard() {
    let world = World::new(1);
    let a = world.connect();
    insert(&a, "k", "v").expect("inserted");
    let row = world.layout.client_row(a.writer());
    let guard = row + crate::membership::writer_ids::WRITE_BACK_GUARD;
    let lease = world.lease();
    // a stops for good (its process is gone). r1 kills its lease and stops.
    let r1 = StopsAt {
        inner: world.fabric(),
        at: vec![row, guard],
        stopped: Cell::new(false),
        held: std::cell::RefCell::default(),
    };
    let _ = block_on(
        &r1,
        take_over_expired(
            &r1,
            &world.layout,
            &lease,
            None,
            None,
            OwnerLiveness::Unknown,
        ),
    );
    // r2 finds the lease killed, and releases the row.
    let r2 = world.fabric();
    let released = block_on(
        &r2,
        take_over_expired(
            &r2,
            &world.layout,
            &lease,
            None,
            None,
            OwnerLiveness::Unknown,
        ),
    )
    .expect("a reclaim pass");
    assert_eq!(released.released, vec![a.writer()]);
    // n registers on the row and raises its guard (a write-back in progress).
    let n = world.connect();
    assert_eq!(n.writer(), a.writer());
    let raised = 0x1234_5000u64;
    let f = world.fabric();
    for node in 0..3u16 {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(
                NodeId(node),
                Batch::write(guard, raised.to_le_bytes().to_vec()),
            )
            .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    // r1 wakes up.
    r1.land();
    let up = (0..3u16)
        .filter(|&node| {
            let word = block_on_future(&f, async {
                let s = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(&f, &s);
                rt.post(NodeId(node), Batch::read(guard, 8)).unwrap();
                rt.wait(1).await.unwrap();
                let bytes = rt.replies()[0].1.read(0).unwrap().to_vec();
                u64::from_le_bytes(bytes.try_into().unwrap())
            })
            .unwrap();
            word == raised
        })
        .count();
    assert_eq!(up, 3, "a stopped reclaimer lowered the new owner's guard");
}

/// Polls `future` on `fabric` until it is ready or `polls` polls went by (it waits
/// on batches a [`StopsAt`] holds: its client is stopped).
fn poll_for<T>(
    fabric: &impl Fabric,
    future: &mut core::pin::Pin<&mut impl core::future::Future<Output = T>>,
    polls: usize,
    mut between: impl FnMut(),
) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..polls {
        between();
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        fabric.progress();
    }
    None
}

/// The word at `addr` on each of the three nodes.
fn words(world: &World, addr: u64) -> Vec<u64> {
    let f = world.fabric();
    (0..3u16)
        .map(|node| {
            block_on_future(&f, async {
                let s = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(&f, &s);
                rt.post(NodeId(node), Batch::read(addr, 8)).unwrap();
                rt.wait(1).await.unwrap();
                let bytes = rt.replies()[0].1.read(0).unwrap().to_vec();
                u64::from_le_bytes(bytes.try_into().unwrap())
            })
            .unwrap()
        })
        .collect()
}

/// A registrant x stops right before its first store into the row's owner-identity
/// word (word 2), which an earlier owner left naming a process that is gone. A
/// reclaimer y, on this host, kills x's lease, finds no running owner named, takes
/// the row over, registers and raises its write-back guard. x wakes up: it must not
/// come out of its registration holding the row, nor lower y's guard, nor leave its
/// identity in place of y's. docs/pauses.md, H4.
#[test]
fn a_registrant_stopped_before_its_identity_never_shares_the_row() {
    use crate::membership::owner_process::{identity, this_process};
    use crate::membership::writer_ids::{WRITE_BACK_GUARD, register};
    let world = World::new(1);
    let row = world.layout.client_row(0);
    let pid_at = row + 16;
    let guard = row + WRITE_BACK_GUARD;
    let f = world.fabric();
    // An earlier owner, gone: this process's pid with another start time.
    let me = this_process();
    let gone = identity(std::process::id(), (me >> 32) + 1);
    for node in 0..3u16 {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(
                NodeId(node),
                Batch::write(pid_at, gone.to_le_bytes().to_vec()),
            )
            .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    let x = StopsAt {
        inner: world.fabric(),
        at: vec![pid_at],
        stopped: Cell::new(false),
        held: std::cell::RefCell::default(),
    };
    let x_owner = identity(1, 7);
    let xs = register(
        &x,
        &world.layout,
        3,
        0x0A11_CE01,
        x_owner,
        OwnerLiveness::ThisHost,
        0,
    );
    let mut xs = core::pin::pin!(xs);
    assert!(
        poll_for(&x, &mut xs, 10_000, || {}).is_none(),
        "x stops at its identity store"
    );
    assert!(x.stopped.get(), "x reached its identity store");
    // y registers: every row is claimed, so it reclaims x's (an expired lease, and
    // word 2 names a process that is gone).
    let (y, _lease) = block_on(
        &f,
        register(
            &f,
            &world.layout,
            3,
            0x0B0B_0001,
            me,
            OwnerLiveness::ThisHost,
            0,
        ),
    )
    .expect("y takes the row over");
    assert_eq!(y.writer, 0);
    assert_eq!(words(&world, pid_at), vec![me; 3], "y's identity");
    // y raises its guard (a write-back in progress).
    let raised = 0x1234_5000u64;
    for node in 0..3u16 {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(
                NodeId(node),
                Batch::write(guard, raised.to_le_bytes().to_vec()),
            )
            .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    // x wakes up, and everything it posts lands.
    let woke = poll_for(&x, &mut xs, 100_000, || x.land());
    x.land();
    assert!(
        !matches!(woke, Some(Ok(_))),
        "x came out of its registration holding y's row"
    );
    assert_eq!(
        words(&world, guard),
        vec![raised; 3],
        "x lowered y's write-back guard"
    );
    assert_eq!(
        words(&world, pid_at),
        vec![me; 3],
        "x's identity replaced y's"
    );
}

/// A fabric on which registrant x, which claimed the only row, names itself in the
/// row (word 2, on every node) right before the reclaimer's first kill lands: after
/// the reclaimer observed the table, before it judged the owner.
struct NamesBeforeKill {
    inner: Paced,
    lease_word: u64,
    pid_at: u64,
    identity: u64,
    done: Cell<bool>,
}

impl Fabric for NamesBeforeKill {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let kills = batch.ops().iter().any(|op| {
            matches!(op, swarm_core::fabric::Op::Cas { addr, new, .. }
                if *addr == self.lease_word && crate::membership::lease::is_killed(*new))
        });
        if kills && !self.done.replace(true) {
            for n in 0..3u16 {
                let mut named = Batch::write(self.pid_at, self.identity.to_le_bytes().to_vec());
                self.inner.post_detached(NodeId(n), &mut named);
            }
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
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

/// A registrant that named itself after a reclaimer observed the table (and stopped
/// before it renewed: its lease is killed) still runs: the reclaimer, on this host,
/// reads the identity again once its claim landed, and leaves the row to it.
/// docs/pauses.md, H4.
#[test]
fn a_reclaimer_leaves_a_row_named_by_a_running_process_after_its_observation() {
    use crate::membership::owner_process::this_process;
    let world = World::new(1);
    let row = world.layout.client_row(0);
    let f = world.fabric();
    // x claims the row on every node and stops before it names itself.
    for node in 0..3u16 {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(NodeId(node), Batch::cas(row, 0, 0x0A11_CE01))
                .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    let r = NamesBeforeKill {
        inner: world.fabric(),
        lease_word: row + crate::membership::lease_renewal::LEASE_WORD,
        pid_at: row + 16,
        identity: this_process(),
        done: Cell::new(false),
    };
    if crate::membership::owner_process::alive(this_process()).is_none() {
        eprintln!("no /proc on this host: process liveness is unknown here");
        return;
    }
    let lease = world.lease();
    let pass = block_on(
        &r,
        take_over_expired(
            &r,
            &world.layout,
            &lease,
            Some(0x0B0B_0001),
            None,
            OwnerLiveness::ThisHost,
        ),
    )
    .expect("a reclaim pass");
    assert!(r.done.get(), "the reclaimer killed x's lease");
    assert_eq!(pass.taken, None, "the row of a running process was taken");
    assert_eq!(pass.running, vec![0]);
    assert_eq!(words(&world, row), vec![0x0A11_CE01; 3], "x's claim");
}

/// `swarm evict --force` of a client that closes during the eviction's wait, while a
/// new client registers the same writer id: the eviction ends there and leaves the
/// new owner's lease alone (before, its retry loop killed the new owner too).
#[test]
fn a_forced_eviction_leaves_the_next_owner_of_the_writer_id_alone() {
    let world = World::new(1);
    let a = world.connect();
    insert(&a, "k", "v").expect("inserted");
    let f = world.fabric();
    let mut eviction = core::pin::pin!(crate::membership::writer_ids::evict(
        &f,
        &world.layout,
        a.writer(),
        true,
        OwnerLiveness::Unknown,
    ));
    // The eviction kills a's lease and waits out the longest lease a may believe in;
    // meanwhile a closes.
    assert!(crate::test_support::poll_once(eviction.as_mut()).is_pending());
    a.close();
    let b = world.connect();
    assert_eq!(b.writer(), 0, "the only writer id, given back by a");
    let evicted = block_on_future(&f, eviction).expect("a run");
    assert!(evicted.is_ok(), "{evicted:?}");
    insert(&b, "k2", "w").expect("the next owner keeps its lease");
    assert_eq!(get(&b, "k").expect("read"), Some(b"v".to_vec()));
}

/// A fabric whose client is stopped once (a SIGSTOP) for [`StopsInWait::stop`] ns of
/// the shared clock, as it next goes to sleep for a deadline.
struct StopsInWait {
    inner: Paced,
    stop: Cell<Nanos>,
}

impl Fabric for StopsInWait {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        let stop = self.stop.take();
        self.inner.time.set(self.inner.time.get() + stop);
        self.inner.wake_at(deadline);
    }
}

/// An insert that finds no free register waits for its client's retired ones to pass
/// their grace; stopped meanwhile for longer than its patience and its lease (the
/// soak, seed 734914983: a churn client SIGSTOPped for 2.5 s in that wait), it wakes
/// up with registers due whose resets could not start under a lapsed lease. It
/// renews the lease and resets them, instead of failing with `RegistersFull`: a
/// stall is not a full register area (issue 43, §4).
#[test]
fn an_insert_stopped_while_it_waits_for_a_register_renews_and_gets_one() {
    // Six chunks of four registers.
    let world = World::with_params(1, |params| ClusterParams {
        registers: 24,
        chunk_registers: 4,
        ..params
    });
    let a = KvClient::connect(
        StopsInWait {
            inner: world.fabric(),
            stop: Cell::new(0),
        },
        FixedClock(1_000),
        world.layout,
        KvConfig::new(0, 1),
    )
    .expect("a writer id");
    let mut keys = 0;
    loop {
        match insert(&a, &format!("k{keys}"), "v") {
            Ok(()) => keys += 1,
            Err(KvError::RegistersFull { .. }) => break,
            Err(error) => panic!("insert k{keys}: {error}"),
        }
    }
    assert!(keys > 8, "{keys} keys fit");
    for i in 0..4 {
        let deleted = block_on(
            a.fabric(),
            a.delete(format!("k{i}").as_bytes(), &OpStats::new()),
        );
        assert!(matches!(deleted, Ok(DeleteOutcome::Removed)), "{deleted:?}");
    }
    let params = world.layout.params;
    let stop = 2 * (params.lease_ns + params.register_grace_ns());
    a.fabric().stop.set(stop);
    let before = world.now();
    insert(&a, "x", "v").expect("a register once the stopped insert renewed and reset");
    assert!(
        world.now() - before >= stop,
        "the insert was not stopped: the test tests nothing"
    );
    assert_eq!(get(&a, "x").expect("a read"), Some(b"v".to_vec()));
}
