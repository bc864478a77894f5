//! FUSEE on the simulated fabric: random concurrent inserts, updates, gets and deletes
//! on a few hot keys (so SNAPSHOT's rules 1, 2 and 3 and its losers all run), with
//! random latencies and tails, crashed clients, and a crashed memory node; every
//! history must be linearizable. A failing seed is printed (`SWARM_SIM_SEED=N` reruns it).

use std::rc::Rc;
use std::sync::Arc;

use swarm_checker::{OpKind, Recorder};
use swarm_core::{NodeId, OpStats};
use swarm_fusee::{FuseeClient, FuseeConfig, FuseeLayout, FuseeParams, Master, recover_client};
use swarm_sim::{Fault, Latency, SimConfig, SimRng, SimRunner, SimWorld, for_each_seed};

const NODES: usize = 3;
const KEYS: u64 = 3;

struct Setup {
    world: SimWorld,
    layout: FuseeLayout,
    master: Arc<Master>,
}

fn setup(seed: u64, clients: u16) -> Setup {
    setup_with(seed, clients, 16)
}

/// `buckets` index buckets: 2 makes every key share both candidate buckets, so
/// inserts of different keys race for the same empty slots.
fn setup_with(seed: u64, clients: u16, buckets: u64) -> Setup {
    let mut params = FuseeParams::for_workload(64, 4096, 16, 32, clients + 1);
    params.buckets = buckets;
    let layout = FuseeLayout::new(params).expect("valid layout");
    let latency = Latency::new(1_000, 400).with_tail_upto(0.05, 20_000);
    let config = SimConfig::new(NODES, layout.node_bytes() as usize).latency(latency);
    Setup {
        world: SimWorld::new(seed, config),
        layout,
        master: Arc::new(Master::new(NODES, clients + 1).expect("valid")),
    }
}

fn config() -> FuseeConfig {
    FuseeConfig {
        fail_timeout_ns: 200_000,
        unfinished_timeout_ns: 400_000,
        use_cache: true,
    }
}

/// Runs `clients` clients doing `ops` random operations each; returns the recorder.
fn run_random(
    seed: u64,
    clients: u16,
    ops: usize,
    faults: impl FnOnce(&SimRunner, &[swarm_sim::ClientId]),
) -> Rc<Recorder> {
    run_random_on(setup(seed, clients), seed, clients, ops, KEYS, faults)
}

fn run_random_on(
    s: Setup,
    seed: u64,
    clients: u16,
    ops: usize,
    keys: u64,
    faults: impl FnOnce(&SimRunner, &[swarm_sim::ClientId]),
) -> Rc<Recorder> {
    let mut runner = SimRunner::new(&s.world);
    let recorder = Rc::new(Recorder::new());
    let mut ids = Vec::new();
    for c in 0..clients {
        let client = FuseeClient::new(s.world.client(), s.layout, s.master.clone(), config())
            .expect("client");
        let id = client.fabric().id();
        ids.push(id);
        let recorder = recorder.clone();
        let world = s.world.clone();
        let mut rng = SimRng::new(seed.wrapping_mul(31).wrapping_add(u64::from(c)));
        runner.spawn(id, async move {
            for i in 0..ops {
                let key = format!("k{}", rng.below(keys));
                let value = format!("c{c}-{i}");
                let stats = OpStats::new();
                let roll = rng.below(100);
                let kind = match roll {
                    0..=29 => OpKind::Get,
                    30..=49 => OpKind::Insert,
                    50..=89 => OpKind::Update,
                    _ => OpKind::Delete,
                };
                let written =
                    matches!(kind, OpKind::Insert | OpKind::Update).then_some(value.as_str());
                let op = recorder.begin(u64::from(c), kind, &key, written, world.now());
                let (ok, read) = match kind {
                    OpKind::Get => {
                        let v = client.get(key.as_bytes(), &stats).await.expect("get");
                        (true, v.map(|v| String::from_utf8(v).expect("utf8")))
                    }
                    OpKind::Insert => {
                        client
                            .insert(key.as_bytes(), value.as_bytes(), &stats)
                            .await
                            .expect("insert");
                        (true, None)
                    }
                    OpKind::Update => (
                        client
                            .update(key.as_bytes(), value.as_bytes(), &stats)
                            .await
                            .expect("update"),
                        None,
                    ),
                    _ => (
                        client.delete(key.as_bytes(), &stats).await.expect("delete"),
                        None,
                    ),
                };
                recorder
                    .end(op, ok, read.as_deref(), world.now())
                    .expect("recorded once");
            }
        });
    }
    faults(&runner, &ids);
    runner.time_limit(2_000_000_000);
    runner
        .run()
        .unwrap_or_else(|e| panic!("seed {seed}: the run did not finish: {e}"));
    recorder
}

fn assert_linearizable(seed: u64, recorder: &Recorder) {
    let history = recorder.history().expect("valid history");
    // Kept for `swarm check` and a closer look.
    let path = std::env::temp_dir().join(format!("fusee-sim-seed-{seed}.jsonl"));
    swarm_checker::assert_linearizable_keeping(&history, &format!("seed {seed}"), Some(&path));
}

#[test]
fn concurrent_writers_on_hot_keys_are_linearizable() {
    for_each_seed(200, |seed| {
        let recorder = run_random(seed, 4, 25, |_, _| {});
        assert_linearizable(seed, &recorder);
    });
}

#[test]
fn inserts_of_different_keys_racing_for_one_empty_slot_are_linearizable() {
    for_each_seed(200, |seed| {
        let recorder = run_random_on(setup_with(seed, 4, 2), seed, 4, 20, 6, |_, _| {});
        assert_linearizable(seed, &recorder);
    });
}

#[test]
fn a_crashed_client_does_not_block_the_others_and_histories_stay_linearizable() {
    for_each_seed(1500, |seed| {
        let mut rng = SimRng::new(seed ^ 0xC0FFEE);
        let at = rng.between(1_000, 60_000);
        let recorder = run_random(seed, 4, 20, |runner, ids| {
            runner.at(at, Fault::CrashClient(ids[0]))
        });
        assert_linearizable(seed, &recorder);
    });
}

#[test]
fn a_crashed_primary_memory_node_is_replaced_by_the_master() {
    for_each_seed(1500, |seed| {
        let mut rng = SimRng::new(seed ^ 0xDEAD);
        let at = rng.between(5_000, 80_000);
        let node = NodeId(rng.below(NODES as u64) as u16);
        let recorder = run_random(seed, 4, 30, |runner, _| runner.at(at, Fault::Crash(node)));
        assert_linearizable(seed, &recorder);
    });
}

#[test]
fn recovery_finishes_or_discards_the_write_of_a_client_crashed_at_any_point() {
    // Client A updates k0 and crashes at a varying point of its four roundtrips; then the
    // master recovers A from its log, and B's get and update go through.
    for crash_at in (0..12_000).step_by(500) {
        let s = setup(7, 3);
        let mut runner = SimRunner::new(&s.world);
        let a =
            FuseeClient::new(s.world.client(), s.layout, s.master.clone(), config()).expect("a");
        let b =
            FuseeClient::new(s.world.client(), s.layout, s.master.clone(), config()).expect("b");
        let m =
            FuseeClient::new(s.world.client(), s.layout, s.master.clone(), config()).expect("m");
        let a_id = a.fabric().id();
        let a_cid = a.id();
        runner.spawn(a_id, async move {
            let stats = OpStats::new();
            a.insert(b"k0", b"old", &stats).await.expect("insert");
            a.update(b"k0", b"new", &stats).await.expect("update");
        });
        let insert_done = 20_000;
        runner.at(insert_done + crash_at, Fault::CrashClient(a_id));
        let layout = s.layout;
        let master = s.master.clone();
        let recovered = runner.spawn_at(insert_done + 50_000, m.fabric().id(), async move {
            recover_client(m.fabric(), &layout, &master, a_cid, 200_000).await
        });
        let read = runner.spawn_at(insert_done + 100_000, b.fabric().id(), async move {
            let stats = OpStats::new();
            let before = b.get(b"k0", &stats).await.expect("get");
            let updated = b.update(b"k0", b"b", &stats).await.expect("update");
            let after = b.get(b"k0", &stats).await.expect("get");
            (before, updated, after)
        });
        runner.time_limit(1_000_000_000);
        runner
            .run()
            .unwrap_or_else(|e| panic!("crash at +{crash_at} ns: {e}"));
        recovered
            .take()
            .expect("recovery ran")
            .expect("recovery succeeded");
        let (before, updated, after) = read.take().expect("B finished");
        assert!(
            matches!(before.as_deref(), Some(b"old") | Some(b"new")),
            "crash at +{crash_at} ns: B read {before:?}"
        );
        assert!(updated, "crash at +{crash_at} ns: the key exists");
        assert_eq!(after.as_deref(), Some(&b"b"[..]));
        // Every replica of the index agrees after recovery and B's update.
        let (base, len) = layout.index();
        let copies: Vec<Vec<u8>> = (0..NODES as u16)
            .map(|n| s.world.peek(NodeId(n), base, len as usize).expect("peek"))
            .collect();
        assert!(
            copies.windows(2).all(|w| w[0] == w[1]),
            "crash at +{crash_at} ns: copies differ"
        );
    }
}
