//! Online repair of a memory node that lost its memory (issue 12, item 3), on shared
//! memory: the rebuilt node must hold every acknowledged write — including those that
//! only the lost node and one other had — so that losing *another* node afterwards
//! loses nothing; and clients that run through the loss and the repair must keep
//! working and pick the node up without restarting.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use swarm_core::{NodeId, OpStats, block_on};
use swarm_kv::KvError;
use swarm_kv::ShmStore;
use swarm_kv::layout::ClusterParams;
use swarm_kv::repair::{RepairError, RepairOptions};
use swarm_kv::store::Store;
use swarm_shm::{ScratchDir, ShmCluster};

fn params() -> ClusterParams {
    ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        ..ClusterParams::default()
    }
}

const NO_WAIT: RepairOptions = RepairOptions {
    quiesce_ns: Some(0),
    replace: false,
};

fn get(store: &ShmStore, key: &str) -> Option<Vec<u8>> {
    let c = store.client().unwrap();
    let value = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
    c.close();
    value
}

/// Writes acknowledged by `{0, 1}` only (node 2 crashed for the writer); node 1 lost
/// and rebuilt; then node 0 lost: `{1, 2}` still hold every write, delete and update.
#[test]
fn a_rebuilt_node_restores_writes_that_only_it_and_one_other_held() {
    let dir = ScratchDir::new("kv-repair-quorum").unwrap();
    let mut expected: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    {
        let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(2));
        let s = OpStats::new;
        for i in 0..200 {
            let key = format!("k{i}");
            block_on(
                f,
                c.insert(key.as_bytes(), format!("v{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("v{i}").into_bytes()));
        }
        for i in (0..200).step_by(3) {
            let key = format!("k{i}");
            block_on(
                f,
                c.update(key.as_bytes(), format!("u{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("u{i}").into_bytes()));
        }
        for i in (1..200).step_by(5) {
            let key = format!("k{i}");
            assert!(block_on(f, c.delete(key.as_bytes(), &s())).unwrap());
            expected.insert(key, None);
        }
    }
    // Node 1's memory is lost (every mapper sees it crashed, openers refuse it).
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    let degraded = ShmStore::open(dir.path()).unwrap();
    assert_eq!(degraded.unusable_nodes().len(), 1);
    let report = ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}).unwrap();
    assert_eq!(report.node, 1);
    assert_eq!(report.epoch, 2, "created at epoch 1, admitted at 2");
    assert_eq!(report.conflicts.total(), 0, "{report:?}");
    let repaired = ShmStore::open(dir.path()).unwrap();
    assert!(
        repaired.unusable_nodes().is_empty(),
        "{:?}",
        repaired.unusable_nodes()
    );
    assert!(matches!(
        ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}),
        Err(KvError::Repair(RepairError::AlreadyMember { .. }))
    ));

    // Now node 0 goes: only {1, 2} are left, and node 2 never saw these writes.
    ShmCluster::retire_node(dir.path(), 0).unwrap();
    let survivors = ShmStore::open(dir.path()).unwrap();
    assert_eq!(survivors.unusable_nodes()[0].0, NodeId(0));
    let c = survivors.client().unwrap();
    for (key, value) in &expected {
        let got = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
        assert_eq!(&got, value, "{key} after losing node 0");
    }
    c.close();
    // And the store takes new writes on them.
    let c = survivors.client().unwrap();
    block_on(c.fabric(), c.insert(b"after", b"x", &OpStats::new())).unwrap();
    assert_eq!(get(&survivors, "after"), Some(b"x".to_vec()));
}

/// A client keeps writing through the loss of node 1 and its repair (with the real
/// quiescence wait): no operation fails, it admits the rebuilt node without
/// restarting, and after node 0 is lost too every acknowledged write is there.
#[test]
fn clients_run_through_a_loss_and_an_online_repair() {
    let dir = ScratchDir::new("kv-repair-online").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    const KEYS: usize = 64;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (store, stop, done) = (store.clone(), Arc::clone(&stop), Arc::clone(&done));
        std::thread::spawn(move || {
            let c = store.client().unwrap();
            let mut last: Vec<Option<u64>> = vec![None; KEYS];
            let mut failures = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = (n as usize) % KEYS;
                let key = format!("k{k}");
                let value = format!("v{n}");
                let s = OpStats::new();
                // Inserts the first time round, updates then (an insert over an existing
                // key writes a fresh register first, whose slot is only freed once the
                // register is recycled, after the cache lifetime).
                let result = if (n as usize) < KEYS {
                    block_on(c.fabric(), c.insert(key.as_bytes(), value.as_bytes(), &s)).map(drop)
                } else {
                    block_on(c.fabric(), c.update(key.as_bytes(), value.as_bytes(), &s)).map(drop)
                };
                match result {
                    Ok(()) => last[k] = Some(n),
                    Err(e) => failures.push(format!("op {n}: {e}")),
                }
                n += 1;
                done.store(n, Ordering::Relaxed);
            }
            (last, failures)
        })
    };
    let wait_ops = |more: u64| {
        let target = done.load(Ordering::Relaxed) + more;
        let start = Instant::now();
        while done.load(Ordering::Relaxed) < target {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the writer stalled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_ops(500);
    ShmCluster::retire_node(dir.path(), 1).unwrap();
    wait_ops(500);
    let report = ShmStore::repair(dir.path(), 1, RepairOptions::default(), |_, _| {}).unwrap();
    assert!(report.quiesce_ms >= 2_000, "{report:?}");
    // The running client follows the new configuration within a renewal period.
    let start = Instant::now();
    let new = ShmCluster::open(dir.path())
        .unwrap()
        .incarnation_of(NodeId(1))
        .unwrap();
    while store.shm().incarnation_of(NodeId(1)) != Some(new) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the client never admitted node 1"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_ops(500);
    stop.store(true, Ordering::Relaxed);
    let (last, failures) = writer.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} operations failed, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );

    ShmCluster::retire_node(dir.path(), 0).unwrap();
    let survivors = ShmStore::open(dir.path()).unwrap();
    for (k, n) in last.iter().enumerate() {
        let want = n.map(|n| format!("v{n}").into_bytes());
        assert_eq!(get(&survivors, &format!("k{k}")), want, "k{k}");
    }
}
