//! Histories recorded by the YCSB harness pass the linearizability checker (SWARM
//! §7): plain runs, runs with several operations in flight per client, a memory-node
//! crash mid-run (§7.7), and extreme contention (§7.8: 16 clients on 10 keys, also
//! with four operations in flight each).

mod ycsb_support;

use swarm_benches::ycsb::{FailPlan, OpType, System, Workload};
use ycsb_support::{assert_clean, assert_linearizable, run_fresh, small};

fn history_path(dir: &swarm_shm::ScratchDir) -> std::path::PathBuf {
    dir.path().join("history.jsonl")
}

#[test]
fn plain_run_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::A, 200, 3_000, 4);
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn run_with_operations_in_flight_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::A, 50, 3_000, 2);
    config.inflight = 3;
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

/// With emulated latency, operations in flight really interleave, the load phase's
/// inserts included: eight inserts of one client claiming register chunks at once
/// once handed one register to several keys (each claim "won" the same chunk).
#[test]
fn a_load_with_eight_inserts_in_flight_per_client_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::B, 2_000, 4_000, 2);
    config.inflight = 8;
    config.rtt_ns = 2_000;
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn run_with_a_node_crash_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::A, 100, 3_000, 4);
    config.fail = Some(FailPlan {
        node: 0,
        after_ops: 1_000,
    });
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert!(report.fail_node.is_some_and(|f| f.triggered));
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn sixteen_clients_on_ten_keys_are_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::A, 10, 3_000, 16);
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

/// `swarm bench --clients 16 --inflight 4` on 10 keys: several operations of one
/// writer id on one key at once (appendix C, Assumption 2: one write per writer and
/// register at a time, which `Client::write_slot` enforces).
#[test]
fn sixteen_clients_with_four_in_flight_on_ten_keys_are_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::A, 10, 4_000, 16);
    config.inflight = 4;
    // Shared memory completes a batch inside `post`: an emulated roundtrip keeps a
    // client's operations in flight together.
    config.rtt_ns = 2_000;
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn dm_abd_run_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Abd, Workload::A, 10, 2_000, 8);
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn fusee_run_with_contention_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Fusee, Workload::A, 10, 3_000, 8);
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

/// FUSEE's primary memory node crashes mid-run: the master reconfigures (FUSEE §5.2)
/// and no operation fails; the history stays linearizable.
#[test]
fn fusee_run_through_a_primary_crash_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Fusee, Workload::A, 100, 3_000, 4);
    config.fail = Some(FailPlan {
        node: 0,
        after_ops: 1_000,
    });
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert!(report.fail_node.is_some_and(|f| f.triggered));
    assert_linearizable(&history_path(&dir), &report);
}

#[test]
fn fusee_run_with_operations_in_flight_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Fusee, Workload::A, 20, 3_000, 4);
    config.inflight = 3;
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

/// The issue's own case: `swarm bench --system fusee --workload b`, history checked.
#[test]
fn fusee_ycsb_b_run_is_linearizable() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Fusee, Workload::B, 50, 3_000, 4);
    config.history = Some(history_path(&dir));
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_linearizable(&history_path(&dir), &report);
}

/// Churn: a sliding window of live keys, nothing loaded; only the sampled key range is
/// recorded, and its history is complete and linearizable. (This one stays within the
/// register capacity; `tests/recycle.rs` churns through ten times it.)
#[test]
fn a_churn_run_records_its_sample_key_range_linearizably() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut config = small(System::Swarm, Workload::Churn, 64, 400, 2);
    config.inflight = 2;
    config.history = Some(history_path(&dir));
    config.history_keys = Some(16);
    let report = run_fresh(&config);
    assert_eq!(report.errors, 0, "seed {}:\n{report}", config.seed);
    assert_eq!(report.load.ops, 0, "churn loads nothing");
    // A window of 64 live keys: 200 inserts, 64 gets while it fills, 136 deletes.
    let count = |op| report.op(op).map_or(0, |r| r.count);
    assert_eq!(
        (
            count(OpType::Insert),
            count(OpType::Get),
            count(OpType::Delete)
        ),
        (200, 64, 136),
        "seed {}:\n{report}",
        config.seed
    );
    // Deletes returned at their tombstone; each client's background task unmapped
    // them next to its operations in flight.
    assert!(
        report.deferred_unmaps > 0 && report.deferred_unmaps <= 136,
        "seed {}:\n{report}",
        config.seed
    );
    let file = std::fs::File::open(history_path(&dir)).unwrap();
    let history = swarm_checker::History::from_jsonl(std::io::BufReader::new(file)).unwrap();
    let ops = history.operations();
    assert!(!ops.is_empty() && ops.len() < 400, "{} recorded", ops.len());
    let keys = swarm_benches::ycsb::workload::KeySpace::new(16, config.key_size).unwrap();
    let sample: Vec<&str> = (0..16).map(|k| keys.key(k)).collect();
    assert!(
        ops.iter().all(|o| sample.contains(&o.op.key.as_str())),
        "only the sampled keys are recorded"
    );
    assert!(
        ops.iter()
            .any(|o| o.op.op == swarm_checker::OpKind::Delete && o.op.ok == Some(true)),
        "some delete removed a present key"
    );
    let verdict = swarm_checker::check(&history);
    assert!(verdict.is_linearizable(), "seed {}: {verdict}", config.seed);
}

/// Two runs share one cluster in disjoint key namespaces (`--key-offset`), each
/// draining its keys at the end (`--drain`): each one's history is checkable alone,
/// the drain's deletes are in it, and the cluster is left with no key.
#[test]
fn offset_runs_share_a_cluster_and_drain_their_keys() {
    let dir = swarm_shm::ScratchDir::new("ycsb-history").unwrap();
    let mut churn = small(System::Swarm, Workload::Churn, 64, 400, 2);
    churn.history = Some(dir.path().join("churn.jsonl"));
    churn.history_keys = Some(16);
    churn.key_offset = 1_000_000;
    churn.drain = true;
    let mut a = small(System::Swarm, Workload::A, 100, 1_000, 2);
    a.history = Some(dir.path().join("a.jsonl"));
    a.key_offset = 2_000_000;
    a.drain = true;
    let store = swarm_benches::ycsb::TempStore::new(&a, 3, 3).expect("temporary cluster");
    for config in [&churn, &a] {
        let report = swarm_benches::ycsb::run(store.store(), config)
            .unwrap_or_else(|e| panic!("seed {}: run failed: {e}", config.seed));
        assert_eq!(report.errors, 0, "seed {}:\n{report}", config.seed);
        let drain = report.drain.as_ref().expect("a drain line");
        assert_eq!(
            drain.ops,
            config.key_numbers(),
            "seed {}:\n{report}",
            config.seed
        );
        assert_eq!(
            report.memory_end.map(|m| m.keys),
            Some(0),
            "seed {}: the drain left keys:\n{report}",
            config.seed
        );
        let path = config.history.as_ref().unwrap();
        let file = std::fs::File::open(path).unwrap();
        let history = swarm_checker::History::from_jsonl(std::io::BufReader::new(file)).unwrap();
        let names = swarm_benches::ycsb::workload::KeySpace::with_offset(
            config.key_numbers(),
            config.key_size,
            config.key_offset,
        )
        .unwrap();
        let ops = history.operations();
        assert!(
            ops.iter()
                .all(|o| (0..names.len()).any(|k| names.key(k) == o.op.key)),
            "only the run's own keys are recorded"
        );
        assert!(
            ops.iter()
                .any(|o| o.op.op == swarm_checker::OpKind::Delete && o.op.ok == Some(true)),
            "the drain removed present keys"
        );
        let verdict = swarm_checker::check(&history);
        assert!(verdict.is_linearizable(), "seed {}: {verdict}", config.seed);
    }
}
