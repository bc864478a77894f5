//! The YCSB harness on real (shared-memory) SWARM-KV clusters: runs complete with no
//! error, count what they say, and reproduce the roundtrip counts of the paper's
//! Table 2 (SWARM §7.1).

mod ycsb_support;

use swarm_benches::ycsb::config::FailMode;
use swarm_benches::ycsb::{BenchError, FailPlan, OpType, System, TempStore, Workload, run};
use ycsb_support::{assert_clean, run_fresh, small};

#[test]
fn every_system_runs_every_workload_without_error() {
    for system in System::ALL {
        for workload in [Workload::A, Workload::B, Workload::C] {
            let config = small(system, workload, 500, 2_000, 4);
            let report = run_fresh(&config);
            assert_clean(&report);
            assert_eq!((report.system, report.workload), (system, workload));
            assert!(report.throughput_ops_s > 0.0);
            let gets = report.op(OpType::Get).map_or(0, |r| r.count) as f64;
            let expected = workload.get_proportion() * 2_000.0;
            assert!(
                (gets - expected).abs() <= 0.05 * 2_000.0,
                "seed {}: {gets} gets\n{report}",
                config.seed
            );
            if workload == Workload::C {
                assert!(report.op(OpType::Update).is_none());
            }
            // The cache warm-up read every key from every client.
            assert_eq!(report.warmup.ops, 4 * 500, "seed {}\n{report}", config.seed);
            // Every measured operation is in the timeline: timed on its client's fabric
            // clock shifted onto the run's origin, it ended within the measured phase
            // (but for one per client ending within the shift's error of its end).
            let timed: u64 = report.timeline.iter().map(|p| p.ops).sum();
            let completed: u64 = report.ops_by_type.values().map(|r| r.count).sum();
            assert!(
                timed <= completed && timed + 4 >= completed,
                "seed {}: {timed} of {completed} operations in the timeline\n{report}",
                config.seed
            );
        }
    }
}

/// The fraction of `system`'s `op`s under YCSB B (4 clients) that took `roundtrips`
/// roundtrips.
fn ycsb_b_fraction(system: System, op: OpType, roundtrips: usize) -> (f64, String) {
    let config = small(system, Workload::B, 1_000, 6_000, 4);
    let report = run_fresh(&config);
    assert_clean(&report);
    let r = report
        .op(op)
        .unwrap_or_else(|| panic!("seed {}: no {op}s\n{report}", config.seed));
    let fractions = [
        r.roundtrips.zero,
        r.roundtrips.one,
        r.roundtrips.two,
        r.roundtrips.three,
        r.roundtrips.four_plus,
    ];
    (fractions[roundtrips.min(4)], report.to_string())
}

fn assert_table_2(system: System, op: OpType, roundtrips: usize) {
    let (fraction, report) = ycsb_b_fraction(system, op, roundtrips);
    assert!(
        fraction >= 0.99,
        "{system} {op}s in {roundtrips} roundtrip(s): {:.2}% (Table 2 says >= 99%)\n{report}",
        100.0 * fraction
    );
}

/// Table 2: with 4 clients under YCSB B, SWARM-KV's gets and updates take one
/// roundtrip in the common case (>= 99 %), DM-ABD's take two.
#[test]
fn ycsb_b_roundtrips_match_table_2() {
    for op in [OpType::Get, OpType::Update] {
        assert_table_2(System::Swarm, op, 1);
        assert_table_2(System::Abd, op, 2);
    }
    assert_table_2(System::Raw, OpType::Get, 1);
}

/// The load phase's inserts are reported with their roundtrips. A SWARM-KV insert
/// whose first index bucket was never used takes one (SWARM §5.3.1): the value, the
/// key header and the index's blind fast round in one batch per node
/// (`swarm_kv::index`, "One-roundtrip inserts"). One whose bucket another key used
/// first goes on from a read: three roundtrips with a fast round, more with the
/// classic one. 500 keys in this store's index leave almost every first bucket
/// unused.
#[test]
fn load_inserts_report_their_roundtrips() {
    let config = small(System::Swarm, Workload::B, 500, 1_000, 2);
    let report = run_fresh(&config);
    assert_clean(&report);
    let inserts = report.load_inserts.as_ref().expect("the load's inserts");
    assert_eq!(inserts.count, 500, "{report}");
    assert!(
        (1.0..1.3).contains(&inserts.roundtrips_mean),
        "inserts took {} roundtrips on average\n{report}",
        inserts.roundtrips_mean
    );
    assert!(report.to_string().contains("insert*"), "{report}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["load_inserts"]["count"], 500);
}

/// Deletes return at their tombstone (SWARM §5.3.2): one roundtrip for a key whose
/// location the client cached (one client inserts and deletes every key of a churn),
/// the index unmap run by the client's background task and reported apart: a lookup
/// and a read of the register (a late unmap must not unmap a later life of its key,
/// `swarm_kv::client::deferred_unmap`), then the remove's three; with
/// `deferred_unmaps = 0` every delete pays for its unmap.
#[test]
fn deletes_return_at_their_tombstone_and_report_their_unmaps_apart() {
    let mut config = small(System::Swarm, Workload::Churn, 64, 2_000, 1);
    let report = run_fresh(&config);
    assert_eq!(report.errors, 0, "{report}");
    let deletes = report.op(OpType::Delete).expect("deletes");
    assert_eq!(deletes.roundtrips.one, 1.0, "{report}");
    assert_eq!(report.deferred_unmaps, deletes.count, "{report}");
    let per_unmap = report.deferred_unmap_roundtrips as f64 / report.deferred_unmaps as f64;
    assert!((4.5..6.0).contains(&per_unmap), "{per_unmap}\n{report}");
    assert!(
        report.to_string().contains("index unmaps ran after"),
        "{report}"
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["deferred_unmaps"], deletes.count);

    config.deferred_unmaps = 0;
    let report = run_fresh(&config);
    assert_eq!(report.errors, 0, "{report}");
    let deletes = report.op(OpType::Delete).expect("deletes");
    assert!(deletes.roundtrips_mean > 3.5, "{report}");
    assert_eq!(report.deferred_unmaps, 0, "{report}");
}

/// Table 2 and FUSEE §4.6: FUSEE's gets take one roundtrip when the cached object is
/// still current and two otherwise; its updates take four in the common case (rule 1:
/// object + primary read, backup CASes, log, primary CAS) and more under conflicts,
/// except for a writer that took no backup in a conflict: it loses after three
/// (`swarm_fusee::rules`), which 4 clients on 1000 keys make rare but possible.
///
/// How many updates conflict depends on how the host schedules the 4 clients (a
/// loaded CI host once made the mean 4.6), so the common case's count is checked
/// with one client, where nothing conflicts: four roundtrips, plus one now and then
/// for claiming a fresh block of objects (`claim_block`).
#[test]
fn fusee_roundtrips_match_its_paper() {
    let config = small(System::Fusee, Workload::B, 1_000, 6_000, 4);
    let report = run_fresh(&config);
    assert_clean(&report);
    let gets = report.op(OpType::Get).expect("gets");
    assert!(gets.roundtrips.one >= 0.9, "{report}");
    assert!(
        gets.roundtrips.one + gets.roundtrips.two >= 0.999,
        "{report}"
    );
    let updates = report.op(OpType::Update).expect("updates");
    assert!(updates.roundtrips.four_plus >= 0.95, "{report}");
    assert_eq!(
        updates.roundtrips.three + updates.roundtrips.four_plus,
        1.0,
        "{report}"
    );

    let alone = run_fresh(&small(System::Fusee, Workload::B, 1_000, 6_000, 1));
    assert_clean(&alone);
    let updates = alone.op(OpType::Update).expect("updates");
    assert_eq!(
        updates.roundtrips.four_plus, 1.0,
        "no conflict: rule 1\n{alone}"
    );
    assert!(
        updates.roundtrips_mean < 4.1,
        "no conflict: rule 1\n{alone}"
    );
}

/// Table 2: RAW updates take one roundtrip.
#[test]
fn raw_updates_take_one_roundtrip() {
    assert_table_2(System::Raw, OpType::Update, 1);
}

#[test]
fn several_operations_in_flight_per_client() {
    let mut config = small(System::Swarm, Workload::A, 500, 4_000, 2);
    config.inflight = 4;
    let report = run_fresh(&config);
    assert_clean(&report);
    assert_eq!(report.inflight, 4);
}

#[test]
fn node_crash_mid_run_costs_no_operation() {
    let mut config = small(System::Swarm, Workload::A, 500, 3_000, 4);
    config.fail = Some(FailPlan {
        node: 1,
        after_ops: 1_000,
    });
    let report = run_fresh(&config);
    assert_clean(&report);
    assert!(report.fail_node.is_some_and(|f| f.triggered), "{report}");
}

/// Issue 12's timeline: a node crashes with its memory and is repaired online while
/// the bench runs; no operation fails, and the report marks the repair.
#[test]
fn a_node_lost_and_repaired_mid_run_costs_no_operation() {
    let mut config = small(System::Swarm, Workload::A, 500, u64::MAX, 2);
    config.duration_ns = Some(5_000_000_000);
    config.fail = Some(FailPlan {
        node: 1,
        after_ops: 2_000,
    });
    config.fail_mode = FailMode::Repair;
    let report = run_fresh(&config);
    assert_eq!(report.errors, 0, "seed {}: {report}", report.seed);
    let marks = report.repair.clone().expect("the repair ran");
    assert!(marks.error.is_none(), "{marks:?}");
    let done_ns = marks.done_ns.expect("the node was admitted before the end");
    assert!(marks.started_ns < done_ns && marks.bytes > 0, "{marks:?}");
    // Idle intervals are not asserted: on this small cluster a debug build stalls
    // about 120 ms in every 240 ms from the start, with or without the failure (260
    // of 501 intervals idle in a run without it): writers fill their small logs and
    // wait for superseded slots' grace (`KvClient::begin_write`). Larger clusters
    // and release builds show none (0 idle intervals of 801 in the crash and repair
    // run ARCHITECTURE.md quotes).
    let _ = done_ns;
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["repair"]["done_ns"].is_u64(), "{json}");
}

#[test]
fn misconfigured_runs_are_refused_before_starting() {
    let config = small(System::Swarm, Workload::B, 100, 100, 2);
    let store = TempStore::new(&config, 3, 3).unwrap();
    let mut bad = config.clone();
    bad.fail = Some(FailPlan {
        node: 3,
        after_ops: 1,
    });
    let err = run(store.store(), &bad).unwrap_err();
    assert!(
        matches!(err, BenchError::InvalidConfig(_)) && err.to_string().contains("nodes 0 to 2"),
        "{err}"
    );
    let mut big = config.clone();
    big.keys = 10_000_000;
    assert!(matches!(
        run(store.store(), &big),
        Err(BenchError::Capacity(_))
    ));
    let mut long_values = config.clone();
    long_values.value_size = 4096;
    let err = run(store.store(), &long_values).unwrap_err();
    assert!(err.to_string().contains("--value-size"), "{err}");
    // Nothing was left registered: a valid run still gets every writer id it needs.
    let report = run(store.store(), &config).unwrap();
    assert_clean(&report);
}

/// `--duration`: the measured phase ends after that long when no operation count is
/// given, or at the count when it comes first; the report shows memory in use before
/// and after, and the clients' lease renewals.
#[test]
fn a_duration_run_stops_on_time_and_reports_memory_and_leases() {
    // YCSB B, with logs sized for 1 000 000 operations.
    let sized = small(System::Swarm, Workload::B, 300, 1_000_000, 2);
    let store = TempStore::new(&sized, 3, 3).expect("temporary cluster");
    let mut config = sized.clone();
    config.ops = u64::MAX;
    config.duration_ns = Some(100_000_000);
    let report = run(store.store(), &config)
        .unwrap_or_else(|e| panic!("seed {}: run failed: {e}", config.seed));
    assert_eq!(report.errors, 0, "seed {}:\n{report}", config.seed);
    assert_eq!(report.duration_ns, Some(100_000_000));
    let completed: u64 = report.ops_by_type.values().map(|r| r.count).sum();
    assert!(completed > 0, "seed {}:\n{report}", config.seed);
    let (start, end) = (
        report.memory_start.expect("memory before"),
        report.memory_end.expect("memory after"),
    );
    assert_eq!((start.keys, end.keys), (0, 300));
    assert_eq!(start.registers_claimed, 0);
    assert!(end.registers_claimed >= 300, "{end:?}");
    // Not counted before the run; afterwards, what the clients' logs held: at least
    // the live value of every key one of them wrote last.
    assert_eq!(start.log_slots_in_use, None);
    assert!(end.log_slots_in_use.is_some_and(|n| n >= 300), "{end:?}");
    // Every client renewed at least once (when it registered).
    assert!(report.lease_renewals >= 2, "{}", report.lease_renewals);
    // Nothing is deleted: no register is recycled.
    assert_eq!(report.recycled_registers, 0);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    for field in [
        "memory_start",
        "memory_end",
        "lease_renewals",
        "recycled_slots",
        "recycled_registers",
        "duration_ns",
    ] {
        assert!(json.get(field).is_some(), "{field} missing from the JSON");
    }
    assert!(report.to_string().contains("keys 0 -> 300"), "{report}");

    // With an operation count that comes first, the run stops at the count.
    let mut config = small(System::Swarm, Workload::B, 300, 1_000, 2);
    config.duration_ns = Some(600_000_000_000);
    let report = run(store.store(), &config).expect("run");
    let completed: u64 = report.ops_by_type.values().map(|r| r.count).sum();
    assert_eq!(completed, 1_000, "seed {}:\n{report}", config.seed);
}
