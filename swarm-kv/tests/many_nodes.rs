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

/// Per key, the values of its writes that stopped at their deadline since its last
/// acknowledged one (`None`: a delete).
type Unknown = HashMap<String, Vec<Option<Vec<u8>>>>;

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
    // No two keys, no lock word with both modes. A holder tag may be poisoned: the
    // copy reads the donors one after the other while clients write, and a blank
    // register read in the middle of a donation or of a take shows a donated tag on
    // one donor and a client's on another (about one run in seven, before and
    // after the journal fix); the merge's poison is its answer (`repair/merge.rs`).
    let c = report.conflicts;
    assert_eq!((c.keys, c.locks), (0, 0), "{report:?}");
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
    // Writers, each on its own keys: the last acknowledged value of each key, and
    // the values of writes since then that stopped at their deadline (`Fenced`:
    // outcome unknown, so the key may hold one of them instead).
    let acked: Arc<Mutex<HashMap<String, Option<Vec<u8>>>>> = Arc::default();
    let unknown: Arc<Mutex<Unknown>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let store = Arc::new(store);
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, acked, stop) = (store.clone(), acked.clone(), stop.clone());
            let unknown = unknown.clone();
            std::thread::spawn(move || {
                let c = store.client().unwrap();
                let mut round = 0u32;
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) || round < 2 {
                    for i in 0..60 {
                        let key = format!("w{w}-k{i}");
                        let value = format!("v{round}-{i}").into_bytes();
                        let s = OpStats::new();
                        let delete = round % 3 == 2 && i % 4 == 0;
                        let written = (!delete).then_some(value.clone());
                        let result = if delete {
                            block_on(c.fabric(), c.delete(key.as_bytes(), &s)).map(drop)
                        } else {
                            block_on(c.fabric(), c.insert(key.as_bytes(), &value, &s))
                        };
                        match result {
                            Ok(()) => {
                                unknown.lock().unwrap().remove(&key);
                                acked.lock().unwrap().insert(key, written);
                            }
                            // Stopped at its deadline (a stall of this loaded host):
                            // it took effect or not, and the check allows both.
                            Err(e) if e.is_fenced() => {
                                unknown
                                    .lock()
                                    .unwrap()
                                    .entry(key)
                                    .or_default()
                                    .push(written);
                            }
                            // No other failure: a register of a pool in another life
                            // (`Recycled`) was a journal entry cleared by the next
                            // repair (`registers/journal.rs`, "Whose clear").
                            Err(e) => errors.push(format!("writer {w}: {key}: {e}")),
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
        assert!(
            errors.is_empty(),
            "{} of {} writes failed while nodes were rebuilt, e.g. {:?}",
            errors.len(),
            rounds * 60,
            &errors[..errors.len().min(3)]
        );
    }
    drop(store);
    let expected = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    assert!(expected.len() >= 100, "{}", expected.len());
    let check = |why: &str| {
        let store = ShmStore::open(dir.path()).unwrap();
        let c = store.client().unwrap();
        let mut wrong = Vec::new();
        for (key, value) in &expected {
            let got = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
            if &got != value && !unknown.get(key).is_some_and(|u| u.contains(&got)) {
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
