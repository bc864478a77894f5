//! A cluster of more memory nodes than one roundtrip posts to (`swarm_core::MAX_NODES`
//! = 16), on shared memory: 32 nodes, registers in replica groups of three over all
//! of them, the index, client table, journal, chunk table and configuration on a
//! metadata group of the first five (`ClusterParams::metadata_nodes`). Clients write
//! while a register-only node and then a metadata node are lost and rebuilt
//! (`crate::repair`, with its quiescence wait); every acknowledged write must be
//! there, also once a third node is lost. In a test binary of its own, like
//! `node_repair_groups.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use swarm_core::{NodeId, OpStats, block_on};
use swarm_kv::admin::RepairOptions;
use swarm_kv::{ClusterParams, ShmStore, Store};
use swarm_shm::{ScratchDir, ShmCluster};

const NODES: u16 = 32;

fn params() -> ClusterParams {
    ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        chunk_registers: 16,
        ..ClusterParams::default()
    }
}

/// Rebuilds `node` (its memory retired first) with the default quiescence wait,
/// while the writers run.
fn lose_and_rebuild(dir: &std::path::Path, node: u16) -> u64 {
    assert!(ShmCluster::retire_node(dir, node).unwrap());
    let report = ShmStore::repair(dir, node, RepairOptions::DEFAULT, |_, _| {}).unwrap();
    assert_eq!(report.node, node);
    assert_eq!(report.conflicts.total(), 0, "{report:?}");
    report.epoch
}

#[test]
fn thirty_two_nodes_keep_every_acknowledged_write_through_two_repairs() {
    // `RUST_LOG=swarm_kv=info` shows what a failed operation logged.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = ScratchDir::new("kv-many-nodes").unwrap();
    let store = ShmStore::create(dir.path(), NODES, 8 << 20, params()).unwrap();
    let p = store.layout().params;
    assert_eq!(p.placement_nodes, NODES);
    assert_eq!(p.metadata_nodes, 5, "the default metadata group");
    assert_eq!(p.groups(), 10);
    {
        // Registers are placed over every node, beyond the first 16 too.
        let c = store.client().unwrap();
        let mut used = [false; NODES as usize];
        for chunk in 0..p.registers / u64::from(p.chunk_registers) {
            let loc = c
                .register_loc(chunk * u64::from(p.chunk_registers))
                .unwrap();
            for n in loc.replicas.nodes() {
                used[n.index()] = true;
            }
        }
        assert!(used.iter().all(|u| *u), "{used:?}");
        c.close();
    }
    // Writers, each on its own keys: the last acknowledged value of each key.
    let acked: Arc<Mutex<HashMap<String, Option<Vec<u8>>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let store = Arc::new(store);
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, acked, stop) = (store.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let c = store.client().unwrap();
                let mut round = 0u32;
                let mut errors = 0u32;
                while !stop.load(Ordering::Relaxed) || round < 2 {
                    for i in 0..60 {
                        let key = format!("w{w}-k{i}");
                        let value = format!("v{round}-{i}").into_bytes();
                        let s = OpStats::new();
                        let result = if round % 3 == 2 && i % 4 == 0 {
                            block_on(c.fabric(), c.delete(key.as_bytes(), &s)).map(|_| None)
                        } else {
                            block_on(c.fabric(), c.insert(key.as_bytes(), &value, &s))
                                .map(|_| Some(value))
                        };
                        match result {
                            Ok(v) => {
                                acked.lock().unwrap().insert(key, v);
                            }
                            // An unacknowledged write may or may not have taken
                            // effect: the key's value is not known any more.
                            Err(e) => {
                                errors += 1;
                                eprintln!("writer {w}: {key}: {e}");
                                acked.lock().unwrap().remove(&key);
                            }
                        }
                    }
                    round += 1;
                }
                c.close();
                (round, errors)
            })
        })
        .collect();
    // Node 27 holds registers only; node 1 is in the metadata group.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(lose_and_rebuild(dir.path(), 27), 3);
    assert_eq!(lose_and_rebuild(dir.path(), 1), 5);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let (rounds, errors) = w.join().unwrap();
        assert!(rounds >= 2);
        // Each failed write's key is dropped from the check (its outcome is not
        // known). A few may fail: one run in three under a loaded host saw two
        // inserts meet a register of the client's pool in another life (`Recycled`),
        // the soak's open case (ARCHITECTURE.md, "Limitations"). Not more.
        assert!(
            errors * 100 <= rounds * 60,
            "{errors} of {} writes failed while nodes were rebuilt",
            rounds * 60
        );
    }
    drop(store);
    let expected = acked.lock().unwrap().clone();
    assert!(expected.len() >= 100, "{}", expected.len());
    let check = |why: &str| {
        let store = ShmStore::open(dir.path()).unwrap();
        let c = store.client().unwrap();
        let mut wrong = Vec::new();
        for (key, value) in &expected {
            let got = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
            if &got != value {
                wrong.push(format!("{key}: {got:?}, expected {value:?}"));
            }
        }
        c.close();
        assert!(
            wrong.is_empty(),
            "{why}: {} keys wrong, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(3)]
        );
        store
    };
    let rebuilt = check("after the repairs");
    assert!(rebuilt.unusable_nodes().is_empty());
    drop(rebuilt);
    // Node 2 goes too (a metadata node, a replica of some of 1's and 27's groups):
    // the rebuilt nodes hold what it held with them.
    ShmCluster::retire_node(dir.path(), 2).unwrap();
    let survivors = check("after losing node 2");
    assert_eq!(survivors.unusable_nodes()[0].0, NodeId(2));
}
