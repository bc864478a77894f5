//! Repair on the simulated fabric (issue 12): a KV workload of inserts, updates,
//! deletes and gets runs while one node is down for a while (the others take the
//! writes), then, as it comes back lagging, another node crashes and loses its
//! memory, restarts empty, is rebuilt by `repair_node` from the lagging node and the
//! one that kept up (racing the workload) and admitted by a configuration change
//! that each client follows on its own; then the node that kept up crashes for good,
//! so the rest of the run depends on what the merge put on the rebuilt node. The
//! history must be linearizable and every acknowledged write must survive. A delete
//! that reached a stale cached register while a node was out may end
//! `KvError::DeleteUndecided` (outcome unknown, kept as crashed; at most 1% of
//! deletes); nothing else may fail. A second scenario runs the soak's churn (inserts
//! and deletes of a few keys shared by every client, unmaps deferred) through one
//! node's loss and repair, and checks at the end that every index slot maps a register
//! whose key header a majority of the nodes holds.
//!
//! Every randomized test prints its seed on failure; replay one with
//! `SWARM_SIM_SEED=N cargo test -p swarm-kv --test repair_sim`.

mod index_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::Poll;

use index_support::{Log, kv_sim_params};
use swarm_checker::OpKind;
use swarm_core::fabric::{Batch, Completion, FabricError, FailureCause, Nanos, NodeId, Ticket};
use swarm_core::{Fabric, OpStats};
use swarm_kv::ClusterParams;
use swarm_kv::admin::NodeLayout;
use swarm_kv::admin::RepairOptions;
use swarm_kv::admin::write_superblock;
use swarm_kv::testing::Configuration;
use swarm_kv::testing::repair_node;
use swarm_kv::testing::write_configuration;
use swarm_kv::{DeleteOutcome, KvClient, KvConfig, KvError};
use swarm_sim::{
    ClientId, Fault, SimClock, SimConfig, SimFabric, SimRng, SimRunner, SimWorld, for_each_seed,
};

const MS: u64 = 1_000_000;
const TICK_NS: u64 = 1_000;

/// The layout of a cluster of `nodes`: three nodes as clusters made before
/// replica groups; more in replica groups of three (`NodeLayout::placement`).
fn layout(nodes: u16) -> NodeLayout {
    layout_with(nodes, 0)
}

/// [`layout`] with the index, client table, journal, chunk table and
/// configuration on a metadata group of the first `meta` nodes (0: every node;
/// `ClusterParams::metadata_nodes`).
fn layout_with(nodes: u16, meta: u16) -> NodeLayout {
    let params = ClusterParams {
        registers: 16_384,
        chunk_registers: 256,
        // The witness inserts keys of its own for as long as the lagging node is
        // down: an index on three nodes takes them faster than one on six.
        index_buckets: if meta == 0 { 256 } else { 4096 },
        placement_nodes: if nodes == 3 { 0 } else { nodes },
        metadata_nodes: meta,
        ..kv_sim_params()
    };
    NodeLayout::new(params).expect("a valid layout")
}

/// One client's view of the membership, as a store gives it: batches to a node left
/// out fail at once, as to a crashed node, until a configuration admits the
/// incarnation the node now has ([`Fabric::admit`], which `KvClient` calls when a
/// lease renewal shows a newer configuration).
struct Member {
    inner: SimFabric,
    /// The node left out, if any, and the incarnation its memory has now.
    out: LeftOut,
    admitted: Rc<Cell<bool>>,
    refused: RefCell<Vec<Option<NodeId>>>,
}

/// The node a client leaves out and the incarnation its memory has now, if any.
type LeftOut = Rc<Cell<Option<(u16, u64)>>>;

const REFUSED: u32 = 1 << 31;

impl Fabric for Member {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.out.get().is_some_and(|(n, _)| n == node.0) {
            let mut refused = self.refused.borrow_mut();
            refused.push(Some(node));
            return Ticket(REFUSED | (refused.len() as u32 - 1));
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 & REFUSED == 0 {
            return self.inner.poll(ticket);
        }
        let node = self.refused.borrow_mut()[(ticket.0 & !REFUSED) as usize].take();
        Poll::Ready(match node {
            Some(node) => Err(FabricError::NodeFailed {
                node,
                cause: FailureCause::Crashed,
            }),
            None => Err(FabricError::UnknownTicket(ticket.0)),
        })
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & REFUSED == 0 {
            self.inner.forget(ticket);
        }
    }
    fn settled(&self, ticket: Ticket) -> bool {
        ticket.0 & REFUSED != 0 || self.inner.settled(ticket)
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
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        match self.out.get() {
            Some((n, now)) if n == node.0 && now == incarnation => {
                self.out.set(None);
                self.admitted.set(true);
                true
            }
            Some((n, _)) if n == node.0 => false,
            _ => true,
        }
    }
    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        // The node left out lost the memory of every incarnation but its new one:
        // clients reset registers without it until a repair announces itself.
        self.out
            .get()
            .is_some_and(|(n, now)| n == node.0 && incarnation != now)
    }
}

type Client = KvClient<Member, SimClock>;

#[derive(Default)]
struct Shared {
    log: Log,
    /// Operations that failed (they stay in the history as crashed): start, end, why.
    failed: RefCell<Vec<(Nanos, Nanos, String)>>,
    repaired: Cell<Option<Nanos>>,
    /// Whether the repair started (its announcement is about to be written).
    repair_started: Cell<bool>,
    /// When the node that kept up crashed for good.
    keeper_crashed: Cell<Option<Nanos>>,
    /// When the lost node crashed (as the lagging one came back).
    lost_crashed: Cell<Option<Nanos>>,
    /// Whether the lagging node is down now.
    lagging_down: Cell<bool>,
    /// Deletes, and those that ended with `KvError::DeleteUndecided` (outcome unknown:
    /// they stay in the history as crashed).
    deletes: Cell<u64>,
    undecided: Cell<u64>,
}

fn key(k: u64) -> String {
    format!("k{k}")
}

async fn client_task(
    world: SimWorld,
    shared: Rc<Shared>,
    client: Client,
    c: u64,
    until: Nanos,
    keys: u64,
    seed: u64,
) {
    let mut rng = SimRng::new(seed);
    let log = &shared.log;
    let mut n = 0u64;
    // Until `until`, or shortly after the last crash: with a node down for good no
    // register reset can complete (they need every replica), so a workload that
    // keeps inserting would run out of registers (a known limit, ARCHITECTURE.md).
    let running = |now: Nanos| {
        now < until
            && shared
                .keeper_crashed
                .get()
                .is_none_or(|at| now < at + 30 * MS)
    };
    while running(world.now()) {
        n += 1;
        let index = rng.below(keys);
        let k = key(index);
        let value = format!("c{c}.{n}");
        let stats = OpStats::new();
        let start = world.now();
        let roll = rng.below(100);
        let (op, result) = if roll < 40 {
            let id = log.begin(c, OpKind::Get, &k, None, start);
            let r = client.get(k.as_bytes(), &stats).await;
            (
                id,
                r.map(|v| {
                    (
                        OpKind::Get,
                        v.map(|v| String::from_utf8(v).unwrap()),
                        Some(true),
                    )
                }),
            )
        } else if roll < 65 {
            let id = log.begin(c, OpKind::Insert, &k, Some(&value), start);
            let r = client.insert(k.as_bytes(), value.as_bytes(), &stats).await;
            (
                id,
                r.map(|()| (OpKind::Insert, Some(value.clone()), Some(true))),
            )
        } else if roll < 85 {
            let id = log.begin(c, OpKind::Update, &k, Some(&value), start);
            match client.update(k.as_bytes(), value.as_bytes(), &stats).await {
                Ok(true) => (id, Ok((OpKind::Update, Some(value.clone()), Some(true)))),
                // Absent: an observation that the key was absent.
                Ok(false) => (id, Ok((OpKind::Get, None, Some(true)))),
                Err(e) => (id, Err(e)),
            }
        } else {
            // Any client deletes any key: a delete that raced another one of the same
            // value reports Raced, recorded as an unknown outcome.
            let id = log.begin(c, OpKind::Delete, &k, None, start);
            shared.deletes.set(shared.deletes.get() + 1);
            match client.delete(k.as_bytes(), &stats).await {
                Ok(DeleteOutcome::Removed) => (id, Ok((OpKind::Delete, None, Some(true)))),
                Ok(DeleteOutcome::Raced) => (id, Ok((OpKind::Delete, None, None))),
                // Absent: an observation that the key was absent.
                Ok(DeleteOutcome::Absent) => (id, Ok((OpKind::Get, None, Some(true)))),
                Err(e) => (id, Err(e)),
            }
        };
        match result {
            Ok((kind, v, ok)) => log.end(op, kind, v, ok, world.now()),
            // A delete through the cache that found a stale register's tombstone and
            // could not tell, with a node out, whether it removed a value: its outcome
            // is unknown by design (`KvClient::delete`).
            Err(KvError::DeleteUndecided { .. }) => {
                shared.undecided.set(shared.undecided.get() + 1);
            }
            Err(e) => shared.failed.borrow_mut().push((
                start,
                world.now(),
                format!("c{c} {roll} {k}: {e:?}"),
            )),
        }
    }
    // Once the keeper is gone for good, every key once more: the rebuilt node now
    // serves every quorum, so a register it copied in an old state (say a
    // tombstone from before a reset that it missed) shows here.
    if shared.keeper_crashed.get().is_some() {
        for index in 0..keys {
            recorded_get(&world, &shared, &client, c, &key(index), "final read").await;
        }
    }
}

/// Inserts keys of its own while the lagging node is down (so only the keeper and the
/// node about to be lost take them), touches them no more, and reads them all once
/// the keeper crashed for good: by then only the rebuilt node and the lagging one
/// are left, so the rebuilt node must have taken them from the keeper.
async fn witness_task(world: SimWorld, shared: Rc<Shared>, client: Client, c: u64) {
    let log = &shared.log;
    // A first insert claims a chunk of registers now: a claim waits for a silent
    // node's answer (up to 50 ms), longer than the lag window.
    let id = log.begin(c, OpKind::Insert, "w-warm", Some("warm"), world.now());
    client
        .insert(b"w-warm", b"warm", &OpStats::new())
        .await
        .expect("no fault yet");
    log.end(id, OpKind::Insert, Some("warm".into()), true, world.now());
    while !shared.lagging_down.get() {
        client.fabric().inner.sleep(50_000).await;
    }
    let mut written = 0u64;
    while shared.lagging_down.get() {
        let (k, value) = (format!("w{written}"), format!("witness{written}"));
        let start = world.now();
        let id = log.begin(c, OpKind::Insert, &k, Some(&value), start);
        match client
            .insert(k.as_bytes(), value.as_bytes(), &OpStats::new())
            .await
        {
            Ok(()) => log.end(id, OpKind::Insert, Some(value), true, world.now()),
            Err(e) => {
                shared
                    .failed
                    .borrow_mut()
                    .push((start, world.now(), format!("witness {k}: {e:?}")))
            }
        }
        written += 1;
    }
    // Through the repair: keys of its own again, among inserts and deletes of
    // scratch keys whose registers the repair's window recycles (through the
    // journal) and hands to later inserts. A register the rebuilt node holds in an
    // old state under a key written now shows once the keeper is gone.
    while !shared.repair_started.get() {
        client.fabric().inner.sleep(50_000).await;
    }
    let mut during = 0u64;
    let mut n = 0u64;
    while shared.repaired.get().is_none() {
        n += 1;
        let (k, value) = if n.is_multiple_of(4) && during < 400 {
            during += 1;
            (format!("r{}", during - 1), format!("repair{}", during - 1))
        } else {
            (format!("s{}", n % 8), format!("scratch{n}"))
        };
        let start = world.now();
        let id = log.begin(c, OpKind::Insert, &k, Some(&value), start);
        match client
            .insert(k.as_bytes(), value.as_bytes(), &OpStats::new())
            .await
        {
            Ok(()) => log.end(id, OpKind::Insert, Some(value), Some(true), world.now()),
            Err(e) => {
                shared
                    .failed
                    .borrow_mut()
                    .push((start, world.now(), format!("witness {k}: {e:?}")))
            }
        }
        if k.starts_with('s') {
            let start = world.now();
            let id = log.begin(c, OpKind::Delete, &k, None, start);
            match client.delete(k.as_bytes(), &OpStats::new()).await {
                Ok(DeleteOutcome::Removed) => {
                    log.end(id, OpKind::Delete, None, Some(true), world.now())
                }
                Ok(DeleteOutcome::Raced) => log.end(id, OpKind::Delete, None, None, world.now()),
                Ok(DeleteOutcome::Absent) => {
                    log.end(id, OpKind::Get, None, Some(true), world.now())
                }
                Err(e) => shared.failed.borrow_mut().push((
                    start,
                    world.now(),
                    format!("witness delete {k}: {e:?}"),
                )),
            }
        }
    }
    // Busy through the repair, the witness too must admit the rebuilt node before
    // the keeper goes (the fault task waits for it): it follows the configuration
    // between operations, so it reads on until then.
    while shared.keeper_crashed.get().is_none() {
        recorded_get(&world, &shared, &client, c, "w0", "witness get").await;
        client.fabric().inner.sleep(MS / 2).await;
    }
    assert!(
        written > 5,
        "the witness wrote {written} keys in the lag window"
    );
    let lagged = (0..written).map(|i| format!("w{i}"));
    for k in lagged.chain((0..during).map(|i| format!("r{i}"))) {
        recorded_get(&world, &shared, &client, c, &k, "witness get").await;
    }
}

/// A get of `k` by client `c`, recorded in the history (or, failed, among the
/// failures, with `what` and the error).
async fn recorded_get(
    world: &SimWorld,
    shared: &Shared,
    client: &Client,
    c: u64,
    k: &str,
    what: &str,
) {
    let start = world.now();
    let id = shared.log.begin(c, OpKind::Get, k, None, start);
    match client.get(k.as_bytes(), &OpStats::new()).await {
        Ok(v) => shared.log.end(
            id,
            OpKind::Get,
            v.map(|v| String::from_utf8(v).unwrap()),
            Some(true),
            world.now(),
        ),
        Err(e) => {
            shared
                .failed
                .borrow_mut()
                .push((start, world.now(), format!("c{c} {what} {k}: {e:?}")))
        }
    }
}

/// Node `lagging` is down for `lag` (writes then reach the other two only), and as it
/// comes back node `lost` crashes with its memory and restarts empty with incarnation
/// `new`: the two donors disagree, and only `keeper` holds the writes of that window.
/// After `out_for`, a repair rebuilds `lost`; once every client admitted it, `keeper` crashes for good,
/// so those writes must have reached the rebuilt node through the merge.
#[allow(clippy::too_many_arguments)]
async fn fault_task(
    world: SimWorld,
    shared: Rc<Shared>,
    raw: SimFabric,
    layout: NodeLayout,
    outs: Vec<LeftOut>,
    admitted: Vec<Rc<Cell<bool>>>,
    (lost, lagging, keeper, new): (u16, u16, u16, u64),
    (crash_at, lag, out_for): (Nanos, Nanos, Nanos),
) {
    raw.sleep(crash_at).await;
    world.apply(Fault::Crash(NodeId(lagging)));
    shared.lagging_down.set(true);
    raw.sleep(lag).await;
    world.apply(Fault::Recover(NodeId(lagging)));
    shared.lagging_down.set(false);
    world.apply(Fault::Crash(NodeId(lost)));
    shared.lost_crashed.set(Some(world.now()));
    // Its memory is gone: it restarts empty (only its node header would survive a
    // restart; this layer never reads it) with a new incarnation, which every client
    // leaves out, as a store that reads the configuration does.
    for out in &outs {
        out.set(Some((lost, new)));
    }
    let zeros = vec![0u8; 64 << 10];
    let mut at = 0u64;
    while at < layout.end() {
        let len = (layout.end() - at).min(zeros.len() as u64) as usize;
        world
            .poke(NodeId(lost), at, &zeros[..len])
            .expect("in the node");
        at += len as u64;
    }
    // Out of service for a while before the repair starts: long enough, in some
    // runs, for registers retired meanwhile to pass their grace and be reset
    // without the lost node (`swarm_kv::registers::recycle`, "a node out of service").
    raw.sleep(out_for).await;
    world.apply(Fault::Recover(NodeId(lost)));
    shared.repair_started.set(true);
    let report = repair_node(
        &raw,
        &layout,
        NodeId(lost),
        new,
        RepairOptions::default(),
        |_, _| {},
    )
    .await
    .expect("the repair completes with every other node up");
    assert_eq!(report.epoch, 3, "announced at 2, admitted at 3");
    shared.repaired.set(Some(world.now()));
    // Every client follows the new configuration within a renewal period or so.
    let deadline = world.now() + 40 * MS;
    while admitted.iter().any(|a| !a.get()) {
        assert!(
            world.now() < deadline,
            "a client never admitted the rebuilt node (repaired at {} ns, now {} ns, admitted {:?})",
            shared.repaired.get().unwrap_or(0),
            world.now(),
            admitted.iter().map(|a| a.get()).collect::<Vec<_>>()
        );
        raw.sleep(MS / 2).await;
    }
    world.apply(Fault::Crash(NodeId(keeper)));
    shared.keeper_crashed.set(Some(world.now()));
}

/// A client of the simulated cluster behind its own membership view: the client,
/// its simulated id, the node it leaves out and whether it admitted it.
fn connect(
    world: &SimWorld,
    layout: NodeLayout,
    skew_ns: i64,
) -> (Client, ClientId, LeftOut, Rc<Cell<bool>>) {
    let out = Rc::new(Cell::new(None));
    let done = Rc::new(Cell::new(false));
    let fabric = Member {
        inner: world.client(),
        out: Rc::clone(&out),
        admitted: Rc::clone(&done),
        refused: RefCell::new(Vec::new()),
    };
    let id = fabric.inner.id();
    let client = KvClient::connect(
        fabric,
        SimClock::new(world, TICK_NS).with_skew(skew_ns),
        layout,
        KvConfig::new(0, TICK_NS),
    )
    .expect("connect");
    (client, id, out, done)
}

fn run(seed: u64) {
    run_on(layout(3), seed);
}

/// [`run`] on `nodes` nodes: with more than three, the lost, lagging and keeper
/// nodes are one replica group of three (`NodeLayout::placement`), so that the
/// group's registers depend on the merge, and the index (on every node) sees the
/// same failures among more nodes.
fn run_on(layout: NodeLayout, seed: u64) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let nodes = layout.params.placement_nodes.max(3);
    let config = SimConfig::new(usize::from(nodes), layout.end() as usize).keep_trace(false);
    let world = SimWorld::new(seed, config);
    let mut rng = SimRng::new(seed ^ 0x005e_a1ed);
    let setup = world.client();
    write_superblock(&setup, &layout.params).expect("format");
    write_configuration(
        &setup,
        &Configuration::new(1, (0..u64::from(nodes)).map(|i| 11 + i).collect()),
    )
    .expect("configuration");
    let shared = Rc::new(Shared::default());
    let mut runner = SimRunner::new(&world);
    let clients = 3u64;
    let until = 400 * MS;
    let (mut outs, mut admitted) = (Vec::new(), Vec::new());
    for c in 0..=clients {
        // Clocks apart: a tombstone one client wrote can outrank the value another
        // writes into the same register after its reset, so a replica that missed
        // the reset reads the new key as deleted.
        let skew = rng.between(0, 120 * MS) as i64 - 60 * MS as i64;
        let (client, id, out, done) = connect(&world, layout, skew);
        outs.push(out);
        admitted.push(done);
        if c == clients {
            runner.spawn(
                id,
                witness_task(world.clone(), Rc::clone(&shared), client, c),
            );
        } else {
            let task = client_task(
                world.clone(),
                Rc::clone(&shared),
                client,
                c,
                until,
                6,
                rng.next_u64(),
            );
            runner.spawn(id, task);
        }
    }
    // The lost node's group of three (with groups of three consecutive nodes
    // from node 0 in every band when three divides the node count).
    let lost = rng.below(u64::from(nodes)) as u16;
    let base = lost / 3 * 3;
    let lagging = base + (lost - base + 1 + rng.below(2) as u16) % 3;
    let keeper = base + 3 - (lost - base) - (lagging - base);
    let raw = world.client();
    runner.spawn(
        raw.id(),
        fault_task(
            world.clone(),
            Rc::clone(&shared),
            raw.clone(),
            layout,
            outs,
            admitted,
            (lost, lagging, keeper, 0xabc),
            (
                rng.between(5 * MS, 20 * MS),
                rng.between(10 * MS, 30 * MS),
                rng.between(2 * MS, 120 * MS),
            ),
        ),
    );
    runner.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let repaired = shared.repaired.get().expect("the repair ran");
    // Nothing may fail while a majority is up and admitted: before the first crash,
    // while the node is out (two of three serve), after the repair. An operation in
    // flight when a node crashes silently may run out of time (it is recorded as
    // crashed: it may or may not have taken effect). So may one in flight when the
    // lost node crashed: a step it posted while the lagging node was down lost that
    // batch for good, and with the lost node's gone too it cannot reach a majority
    // and stops at its fence (`Roundtrip::wait`).
    let crashes = [shared.lost_crashed.get(), shared.keeper_crashed.get()];
    let failed = shared.failed.borrow();
    let unexplained: Vec<&(Nanos, Nanos, String)> = failed
        .iter()
        .filter(|(start, end, _)| !crashes.iter().flatten().any(|at| start <= at && at <= end))
        .collect();
    assert!(
        unexplained.is_empty(),
        "seed {seed}: {} operations failed (repair done at {repaired} ns, keeper crashed at {:?}, lost node crashed at {:?}), e.g. {:?}",
        unexplained.len(),
        shared.keeper_crashed.get(),
        shared.lost_crashed.get(),
        &unexplained[..unexplained.len().min(3)]
    );
    let (deletes, undecided) = (shared.deletes.get(), shared.undecided.get());
    assert!(
        undecided * 100 <= deletes,
        "seed {seed}: {undecided} of {deletes} deletes ended undecided: more than 1%"
    );
    let history = shared.log.history();
    let report = swarm_checker::check(&history);
    if std::env::var("DUMP").is_ok() {
        history
            .write_jsonl(std::fs::File::create("/tmp/h.jsonl").unwrap())
            .unwrap();
        eprintln!(
            "repaired {repaired} keeper {:?}",
            shared.keeper_crashed.get()
        );
    }
    assert!(
        report.is_linearizable(),
        "seed {seed}: not linearizable:\n{report}"
    );
}

#[test]
fn a_node_lost_repaired_online_then_another_lost_keeps_every_write() {
    for_each_seed(12, run);
}

/// The soak's shape around a lost node (`scripts/soak.sh`, `--nemesis repair`): a
/// churn of inserts and deletes over a few keys shared by every client, with deletes
/// returning at their tombstone (deferred unmaps) and registers recycled all along,
/// while one node loses its memory, stays out for several register graces (resets go
/// without it), is rebuilt by a repair racing the churn and admitted. No node
/// crashes besides: nothing may fail but a delete undecided with the node out, and
/// at the end every index slot must map a register whose key header a majority of
/// the nodes holds (an insert of a key whose slot maps a register with a blank
/// header fails for ever: `insert: key header of register R is missing on a
/// majority`, which a 30-minute soak met after a node's loss).
fn churn_run(seed: u64) {
    let layout = layout(3);
    let config = SimConfig::new(3, layout.end() as usize).keep_trace(false);
    let world = SimWorld::new(seed, config);
    let mut rng = SimRng::new(seed ^ 0x0c4e_a1ed);
    let setup = world.client();
    write_superblock(&setup, &layout.params).expect("format");
    write_configuration(&setup, &Configuration::new(1, vec![11, 12, 13])).expect("configuration");
    let shared = Rc::new(Shared::default());
    let mut runner = SimRunner::new(&world);
    let clients = 3u64;
    let keys = 4u64;
    let (mut outs, mut admitted) = (Vec::new(), Vec::new());
    let done = Rc::new(Cell::new(false));
    for c in 0..clients {
        let skew = rng.between(0, 40 * MS) as i64 - 20 * MS as i64;
        let out = Rc::new(Cell::new(None));
        let adm = Rc::new(Cell::new(false));
        let fabric = Member {
            inner: world.client(),
            out: Rc::clone(&out),
            admitted: Rc::clone(&adm),
            refused: RefCell::new(Vec::new()),
        };
        let id = fabric.inner.id();
        let mut kv = KvConfig::new(0, TICK_NS);
        kv.deferred_unmaps = 4;
        let client = KvClient::connect(
            fabric,
            SimClock::new(&world, TICK_NS).with_skew(skew),
            layout,
            kv,
        )
        .expect("connect");
        outs.push(out);
        admitted.push(adm);
        let (world2, shared2, done2) = (world.clone(), Rc::clone(&shared), Rc::clone(&done));
        let task_seed = rng.next_u64();
        runner.spawn(id, async move {
            let mut rng = SimRng::new(task_seed);
            let log = &shared2.log;
            let mut n = 0u64;
            while !done2.get() {
                n += 1;
                let k = key(rng.below(keys));
                let value = format!("c{c}.{n}");
                let stats = OpStats::new();
                let start = world2.now();
                let roll = rng.below(100);
                let (op, result) = if roll < 15 {
                    let id = log.begin(c, OpKind::Get, &k, None, start);
                    let r = client.get(k.as_bytes(), &stats).await;
                    (
                        id,
                        r.map(|v| {
                            (
                                OpKind::Get,
                                v.map(|v| String::from_utf8(v).unwrap()),
                                Some(true),
                            )
                        }),
                    )
                } else if roll < 60 {
                    let id = log.begin(c, OpKind::Insert, &k, Some(&value), start);
                    let r = client.insert(k.as_bytes(), value.as_bytes(), &stats).await;
                    (
                        id,
                        r.map(|()| (OpKind::Insert, Some(value.clone()), Some(true))),
                    )
                } else {
                    let id = log.begin(c, OpKind::Delete, &k, None, start);
                    shared2.deletes.set(shared2.deletes.get() + 1);
                    match client.delete(k.as_bytes(), &stats).await {
                        Ok(DeleteOutcome::Removed) => (id, Ok((OpKind::Delete, None, Some(true)))),
                        Ok(DeleteOutcome::Raced) => (id, Ok((OpKind::Delete, None, None))),
                        Ok(DeleteOutcome::Absent) => (id, Ok((OpKind::Get, None, Some(true)))),
                        Err(e) => (id, Err(e)),
                    }
                };
                match result {
                    Ok((kind, v, ok)) => log.end(op, kind, v, ok, world2.now()),
                    Err(KvError::DeleteUndecided { .. }) => {
                        shared2.undecided.set(shared2.undecided.get() + 1);
                    }
                    Err(e) => shared2.failed.borrow_mut().push((
                        start,
                        world2.now(),
                        format!("c{c} {roll} {k}: {e:?}"),
                    )),
                }
                if rng.below(4) == 0 {
                    let _ = client.run_deferred_unmaps().await;
                }
            }
            let _ = client.run_deferred_unmaps().await;
            for index in 0..keys {
                recorded_get(&world2, &shared2, &client, c, &key(index), "final read").await;
            }
        });
    }
    let lost = rng.below(3) as u16;
    let raw = world.client();
    let (crash_at, out_for, after) = (
        rng.between(5 * MS, 30 * MS),
        rng.between(30 * MS, 200 * MS),
        rng.between(20 * MS, 80 * MS),
    );
    {
        let (world, shared, raw2, done) = (
            world.clone(),
            Rc::clone(&shared),
            raw.clone(),
            Rc::clone(&done),
        );
        runner.spawn(raw.id(), async move {
            raw2.sleep(crash_at).await;
            world.apply(Fault::Crash(NodeId(lost)));
            shared.lost_crashed.set(Some(world.now()));
            for out in &outs {
                out.set(Some((lost, 0xabc)));
            }
            let zeros = vec![0u8; 64 << 10];
            let mut at = 0u64;
            while at < layout.end() {
                let len = (layout.end() - at).min(zeros.len() as u64) as usize;
                world
                    .poke(NodeId(lost), at, &zeros[..len])
                    .expect("in the node");
                at += len as u64;
            }
            raw2.sleep(out_for).await;
            world.apply(Fault::Recover(NodeId(lost)));
            shared.repair_started.set(true);
            repair_node(
                &raw2,
                &layout,
                NodeId(lost),
                0xabc,
                RepairOptions::default(),
                |_, _| {},
            )
            .await
            .expect("the repair completes with every other node up");
            shared.repaired.set(Some(world.now()));
            let deadline = world.now() + 40 * MS;
            while admitted.iter().any(|a| !a.get()) && world.now() < deadline {
                raw2.sleep(MS / 2).await;
            }
            raw2.sleep(after).await;
            done.set(true);
        });
    }
    runner.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let crash = shared.lost_crashed.get();
    let failed = shared.failed.borrow();
    let unexplained: Vec<&(Nanos, Nanos, String)> = failed
        .iter()
        .filter(|(start, end, _)| !crash.is_some_and(|at| *start <= at && at <= *end))
        .collect();
    // Every slot's newest copy maps a register whose key header is on a majority.
    let index_bytes = (layout.params.index_buckets * 64) as usize;
    let copies: Vec<Vec<u8>> = (0..3)
        .map(|n| {
            world
                .peek(NodeId(n), layout.index_at, index_bytes)
                .expect("index")
        })
        .collect();
    let word = |c: &[u8], i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap());
    let mut headless = Vec::new();
    for i in 0..index_bytes / 8 {
        if i % 8 == 0 {
            continue;
        }
        // The copy with the newest tag (16-bit serial numbers, as a lookup merges).
        let newest = (1..3)
            .map(|n| word(&copies[n], i))
            .fold(word(&copies[0], i), |best, w| {
                let (t, b) = ((w >> 48) as u16, (best >> 48) as u16);
                if t != b && t.wrapping_sub(b) < 0x8000 {
                    w
                } else {
                    best
                }
            });
        if newest >> 47 & 1 == 0 {
            continue;
        }
        let register = newest & 0x7ff_ffff;
        let at = layout.key_header(register).expect("a register");
        let keyed = (0..3)
            .filter(|&n| {
                let w = world.peek(NodeId(n), at, 8).expect("header");
                let len = u32::from_le_bytes(w[..4].try_into().unwrap());
                len != 0 && len <= layout.params.key_max
            })
            .count();
        if keyed < 2 {
            headless.push((i / 8, i % 8, register, keyed));
        }
    }
    assert!(
        unexplained.is_empty() && headless.is_empty(),
        "seed {seed}: lost node {lost} at {crash:?}, repaired at {:?}: {} operations failed, e.g. {:?}; slots mapping a register keyed on a minority (bucket, slot, register, keyed copies): {headless:?}",
        shared.repaired.get(),
        unexplained.len(),
        &unexplained[..unexplained.len().min(3)]
    );
    let history = shared.log.history();
    let report = swarm_checker::check(&history);
    assert!(
        report.is_linearizable(),
        "seed {seed}: not linearizable:\n{report}"
    );
}

#[test]
fn a_churn_through_a_lost_node_and_its_repair_keeps_every_mapped_header() {
    for_each_seed(4, churn_run);
}

/// The same on six nodes in two replica groups of three: the repair copies the
/// rebuilt node's group from that group's other replicas, the index and the
/// tables from all five others.
#[test]
fn six_nodes_in_replica_groups_a_node_lost_repaired_online_keeps_every_write() {
    let layout = layout(6);
    assert_eq!(layout.params.groups(), 2);
    for_each_seed(6, |seed| run_on(layout, seed));
}

/// The same with the index, the client table, the journal, the chunk table and the
/// configuration on a metadata group of nodes 0 to 2 only (as a cluster of more
/// than 16 nodes has: `ClusterParams::metadata_nodes`): the lost node is in the
/// group or not (the seed picks it), its repair copies the metadata from the
/// group's other two nodes, or none; nodes 3 to 5 hold registers and logs only.
#[test]
fn six_nodes_with_a_metadata_group_of_three_a_node_lost_repaired_online_keeps_every_write() {
    let layout = layout_with(6, 3);
    assert_eq!(layout.metadata_nodes(6), 3);
    for_each_seed(6, |seed| run_on(layout, seed));
}
