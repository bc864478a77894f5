//! Deletes racing re-inserts through stale caches, on the simulated fabric, found by
//! randomized schedules rather than scripted ones (`delete_stale_cache.rs` scripts
//! each case; the review's lesson: a randomized test must reach them too).
//!
//! Four clients hammer two keys with deletes, inserts, updates and gets, over
//! latencies whose tails hold single messages back for up to
//! [`TAIL_NS`] (tens of operations). So a delete's tombstone often reaches one
//! replica late, after the key was inserted again into another register, and a
//! client whose cache still names the old register deletes through it. That delete
//! finds another client's tombstone first on some replicas and installs its own on
//! the one the first delete has not reached yet: it must ask the index and delete
//! the key's register of now, unless its own tombstone may be first on a majority
//! of the old one (`KvClient::delete`). Node stalls (a node that answers nothing for
//! a while) leave some of those questions undecidable: such a delete ends
//! `KvError::DeleteUndecided`, recorded as crashed (its outcome unknown). This
//! scenario also found an insert failing on a key header copy read while its write
//! landed word by word (`index/header.rs`, "torn").
//!
//! The same with **two operations in flight per client** (lanes sharing its cache and
//! writer id): a client's get can put back in its cache a register its own delete
//! just tombstoned, so its next delete through the cache finds its own tombstone
//! there, an earlier delete's, and must still delete the key's register of now.
//!
//! The same on **five nodes**, each register on three of them: it would have found
//! key headers read from a majority of all nodes instead of the register's replicas
//! (`Index::header_holders`).
//!
//! Another scenario runs several clients on **one hot key** over steady latencies:
//! every insert meets the others' changes of the key's index buckets, and retries.
//! It found index calls that starved until their operation deadline (their retries
//! promised against bucket words as old as their backoff, `Engine::backoff_and_reread`).
//!
//! The history must be linearizable; nothing else may fail. Every randomized test
//! prints its seed on failure; replay one with
//! `SWARM_SIM_SEED=N cargo test -p swarm-kv --test delete_race_sim`.

mod index_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use index_support::{Log, kv_sim_params};
use swarm_checker::OpKind;
use swarm_core::OpStats;
use swarm_core::fabric::Nanos;
use swarm_kv::ClusterParams;
use swarm_kv::admin::NodeLayout;
use swarm_kv::admin::write_superblock;
use swarm_kv::testing::Configuration;
use swarm_kv::testing::write_configuration;
use swarm_kv::{DeleteOutcome, KvClient, KvConfig, KvError};
use swarm_sim::{
    Latency, SEED_VAR, SeedGuard, SimClock, SimConfig, SimFabric, SimRng, SimRunner, SimWorld,
    for_each_seed,
};

const MS: u64 = 1_000_000;
const TICK_NS: u64 = 1_000;
/// The longest extra delay of a late message.
const TAIL_NS: u64 = 150_000;
/// Simulated time each run lasts.
const RUN_NS: u64 = 40 * MS;

/// The shape of one run.
#[derive(Clone, Copy)]
struct Scenario {
    /// Memory nodes; registers have three replicas among them.
    nodes: usize,
    /// Clients, each its own executor task and cache.
    clients: u64,
    /// Keys they share: few, so that deletes and re-inserts of one key overlap.
    keys: u64,
    /// Per-message latency.
    latency: Latency,
    /// Probability that a node stalls (answers nothing for up to 400 µs).
    stall_probability: f64,
    /// Where gets, inserts and updates end among 100 rolls (the rest are deletes).
    mix: [u64; 3],
    /// Whether a lane gets the key again right after half of its deletes (what its
    /// client sees of its own delete).
    get_after_delete: bool,
    /// Operations each client keeps in flight: its lanes share its cache and its
    /// writer id, each a process of the history.
    lanes: u64,
}

/// Late messages at every distance from their batch's others (uniform tails), and
/// now and then a node that answers nothing for a while: stale caches.
const STALE_CACHES: Scenario = Scenario {
    nodes: 3,
    clients: 4,
    keys: 2,
    latency: Latency::new(1_000, 300).with_tail_upto(0.08, TAIL_NS),
    stall_probability: 0.002,
    mix: [25, 55, 65],
    get_after_delete: false,
    lanes: 1,
};

/// Stale caches on five nodes, each register on three of them: a key header lives on
/// its register's replicas only (`Index::header_holders`).
const FIVE_NODES: Scenario = Scenario {
    nodes: 5,
    keys: 3,
    ..STALE_CACHES
};

/// Several clients on one key, steady latencies: contention in the index.
const ONE_HOT_KEY: Scenario = Scenario {
    nodes: 3,
    clients: 5,
    keys: 1,
    latency: Latency::new(1_000, 300),
    stall_probability: 0.0,
    mix: [25, 55, 65],
    get_after_delete: false,
    lanes: 1,
};

/// Stale caches with two operations in flight per client: a get that read the key's
/// register before this client's own delete tombstoned it puts it back in the cache
/// after the delete flushed it, so a later delete through that cache finds this
/// writer's own tombstone first there, put by the earlier delete, not by itself (and
/// two deletes of one writer race each other). More gets, and a get right after half
/// of the deletes, so that a delete that did not take effect shows.
const TWO_LANES: Scenario = Scenario {
    clients: 3,
    lanes: 2,
    mix: [45, 65, 75],
    get_after_delete: true,
    ..STALE_CACHES
};

type Client = KvClient<SimFabric, SimClock>;

fn layout() -> NodeLayout {
    // Its cache lifetime (20 ms) is long enough that a client's cache outlives the
    // key's register.
    let params = ClusterParams {
        registers: 8_192,
        chunk_registers: 128,
        index_buckets: 64,
        ..kv_sim_params()
    };
    NodeLayout::new(params).expect("a valid layout")
}

/// What the clients share: the history and what did not go as it should.
#[derive(Default)]
struct Shared {
    log: Log,
    /// Operations that failed other than undecided deletes: start, end, why.
    failed: RefCell<Vec<(Nanos, Nanos, String)>>,
    /// Deletes by outcome, to show the run reached the races it is about.
    removed: Cell<u64>,
    raced: Cell<u64>,
    absent: Cell<u64>,
    undecided: Cell<u64>,
}

async fn client_task(
    world: SimWorld,
    shared: Rc<Shared>,
    client: Rc<Client>,
    (c, keys, lanes, mix, get_after_delete): (u64, u64, u64, [u64; 3], bool),
    seed: u64,
) {
    let mut rng = SimRng::new(seed);
    let log = &shared.log;
    let mut n = 0u64;
    // A get of the key a delete just returned for, when the scenario asks for one.
    let mut get_next: Option<String> = None;
    while world.now() < RUN_NS {
        n += 1;
        let follow_up = get_next.take();
        let k = follow_up
            .clone()
            .unwrap_or_else(|| format!("k{}", rng.below(keys)));
        let value = format!("c{c}.{n}");
        // With several lanes, each operation yields after its memory hints, as
        // operations in flight together on one thread do.
        let stats = if lanes > 1 {
            OpStats::interleaved()
        } else {
            OpStats::new()
        };
        let start = world.now();
        let roll = match follow_up {
            Some(_) => 0,
            None => rng.below(100),
        };
        let result = if roll < mix[0] {
            let id = log.begin(c, OpKind::Get, &k, None, start);
            client.get(k.as_bytes(), &stats).await.map(|v| {
                let v = v.map(|v| String::from_utf8(v).expect("values are text"));
                log.end(id, OpKind::Get, v, true, world.now());
            })
        } else if roll < mix[1] {
            let id = log.begin(c, OpKind::Insert, &k, Some(&value), start);
            client
                .insert(k.as_bytes(), value.as_bytes(), &stats)
                .await
                .map(|()| log.end(id, OpKind::Insert, Some(value), true, world.now()))
        } else if roll < mix[2] {
            let id = log.begin(c, OpKind::Update, &k, Some(&value), start);
            client
                .update(k.as_bytes(), value.as_bytes(), &stats)
                .await
                .map(|updated| match updated {
                    true => log.end(id, OpKind::Update, Some(value), true, world.now()),
                    // Absent: an observation that the key was absent.
                    false => log.end(id, OpKind::Get, None, true, world.now()),
                })
        } else {
            let id = log.begin(c, OpKind::Delete, &k, None, start);
            if get_after_delete && rng.chance(0.5) {
                get_next = Some(k.clone());
            }
            client.delete(k.as_bytes(), &stats).await.map(|outcome| {
                let end = world.now();
                match outcome {
                    DeleteOutcome::Removed => {
                        shared.removed.set(shared.removed.get() + 1);
                        log.end(id, OpKind::Delete, None, true, end);
                    }
                    // Raced: which delete removed the value is undecided, so the
                    // outcome is unknown (it must still take effect).
                    DeleteOutcome::Raced => {
                        shared.raced.set(shared.raced.get() + 1);
                        log.end(id, OpKind::Delete, None, None, end);
                    }
                    // Absent: an observation that the key was absent.
                    DeleteOutcome::Absent => {
                        shared.absent.set(shared.absent.get() + 1);
                        log.end(id, OpKind::Get, None, true, end);
                    }
                }
            })
        };
        match result {
            Ok(()) => {}
            // Left as crashed in the history: it may or may not have taken effect.
            Err(KvError::DeleteUndecided { .. }) => {
                shared.undecided.set(shared.undecided.get() + 1);
            }
            Err(e) => shared.failed.borrow_mut().push((
                start,
                world.now(),
                format!(
                    "c{c} {k} (roll {roll}, {} roundtrips): {e:?}",
                    stats.roundtrips()
                ),
            )),
        }
    }
    // Each key once more, after every other client's last operation began: a value
    // that a delete reported removed but left mapped shows here.
    let wait_for_the_others = 2 * MS;
    client.fabric().sleep(wait_for_the_others).await;
    for index in 0..keys {
        let k = format!("k{index}");
        let start = world.now();
        let id = log.begin(c, OpKind::Get, &k, None, start);
        match client.get(k.as_bytes(), &OpStats::new()).await {
            Ok(v) => log.end(
                id,
                OpKind::Get,
                v.map(|v| String::from_utf8(v).expect("values are text")),
                true,
                world.now(),
            ),
            Err(e) => shared.failed.borrow_mut().push((
                start,
                world.now(),
                format!("c{c} final get {k}: {e:?}"),
            )),
        }
    }
}

fn run(scenario: Scenario, seed: u64) -> [u64; 4] {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let layout = layout();
    let config = SimConfig::new(scenario.nodes, layout.end() as usize)
        .latency(scenario.latency)
        .stalls(scenario.stall_probability, 400_000)
        .keep_trace(false);
    let world = SimWorld::new(seed, config);
    let mut rng = SimRng::new(seed ^ 0x0de1_e7e5);
    let setup = world.client();
    write_superblock(&setup, &layout.params).expect("format");
    let incarnations = (11..).take(scenario.nodes).collect();
    write_configuration(&setup, &Configuration::new(1, incarnations)).expect("configuration");
    let shared = Rc::new(Shared::default());
    let mut runner = SimRunner::new(&world);
    for c in 0..scenario.clients {
        let fabric = world.client();
        let id = fabric.id();
        let client = KvClient::connect(
            fabric,
            SimClock::new(&world, TICK_NS),
            layout,
            KvConfig::new(0, TICK_NS),
        )
        .expect("connect");
        let client = Rc::new(client);
        for lane in 0..scenario.lanes {
            let task = client_task(
                world.clone(),
                Rc::clone(&shared),
                Rc::clone(&client),
                (
                    c * scenario.lanes + lane,
                    scenario.keys,
                    scenario.lanes,
                    scenario.mix,
                    scenario.get_after_delete,
                ),
                rng.next_u64(),
            );
            runner.spawn(id, task);
        }
    }
    runner.run().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let failed = shared.failed.borrow();
    assert!(
        failed.is_empty(),
        "seed {seed}: {} operations failed with every node up, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    let deletes = [
        &shared.removed,
        &shared.raced,
        &shared.absent,
        &shared.undecided,
    ]
    .map(|count| count.get());
    let report = swarm_checker::check(&shared.log.history());
    assert!(
        report.is_linearizable(),
        "seed {seed}: not linearizable (deletes removed/raced/absent/undecided: {deletes:?}):\n{report}"
    );
    eprintln!("seed {seed}: deletes removed/raced/absent/undecided: {deletes:?}");
    deletes
}

/// Seeds of [`STALE_CACHES`] that once failed, replayed after the others unless
/// `SWARM_SIM_SEED` names one. 797: an insert whose `SET` one node had accepted took
/// a newer change in that slot (another client's insert and delete of the key) for
/// proof that its own was decided, reported the key inserted, and its client's get
/// then returned that value through its cache while the key was absent
/// (`swarm_kv::index`, "superseded unproven" in `bucket.rs` and `watch.rs`).
const STALE_CACHES_REPLAYS: [u64; 1] = [797];

/// 64 seeds (about a second): a delete through a stale cache that decides wrongly
/// shows in a few percent of the seeds (`kv-delete-undecided-deletes-new`, 4 of the
/// first 60), so fewer would miss it. Then [`STALE_CACHES_REPLAYS`].
#[test]
fn deletes_racing_reinserts_through_stale_caches_stay_linearizable() {
    let mut raced = 0;
    for_each_seed(64, |seed| raced += run(STALE_CACHES, seed)[1]);
    if std::env::var(SEED_VAR).is_err() {
        for seed in STALE_CACHES_REPLAYS {
            let _guard = SeedGuard::new(seed);
            run(STALE_CACHES, seed);
        }
    }
    assert!(
        raced > 0,
        "no delete raced another: the runs missed what they test"
    );
}

/// 64 seeds (a few seconds). A delete through a stale cache that finds its writer's
/// own tombstone first on the old register, put there by an earlier delete of the
/// same client, must not take it for its own win there and leave the key's new
/// register alone: a delete that reports `Raced` took effect, and the get after it
/// shows the new value if it did not. That mistake
/// (`delete-first-deleter-takes-own-tombstone-as-mine`) shows in about one seed in
/// fourteen, so fewer seeds would miss it.
#[test]
fn two_operations_in_flight_per_client_stay_linearizable() {
    for_each_seed(64, |seed| {
        run(TWO_LANES, seed);
    });
}

#[test]
fn five_nodes_with_three_replicas_each_stay_linearizable() {
    for_each_seed(8, |seed| {
        run(FIVE_NODES, seed);
    });
}

#[test]
fn one_hot_key_inserted_and_deleted_by_several_clients_makes_progress() {
    for_each_seed(8, |seed| {
        run(ONE_HOT_KEY, seed);
    });
}
