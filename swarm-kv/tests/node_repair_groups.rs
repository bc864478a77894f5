//! Online repair with replica groups (`NodeLayout::placement`) on shared memory: a
//! six-node cluster of two groups of three, node 1 lost and rebuilt from its group's
//! other replicas, then a second node of that group lost: every acknowledged write
//! must be there. In a test binary of its own: the repairs of `node_repair.rs` check
//! which tracing span their events carry, which a concurrent repair in the same
//! process (callsite interest caching) can disturb.

use std::collections::HashMap;

use swarm_core::{NodeId, OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::ShmStore;
use swarm_kv::Store;
use swarm_kv::admin::{RepairError, RepairOptions};
use swarm_kv::{DeleteOutcome, KvError};
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
    ..RepairOptions::DEFAULT
};

fn get(store: &ShmStore, key: &str) -> Option<Vec<u8>> {
    let c = store.client().unwrap();
    let value = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
    c.close();
    value
}

/// `node_repair.rs`'s scenario on `nodes` nodes: writes acknowledged by `{0, 1}`
/// only, then `{1, 2}` only; node 1 lost and rebuilt; then `lose` lost too. With
/// six, in replica groups of three (`NodeLayout::placement`), nodes 0, 1, 2 are one
/// group in every band, and small chunks spread the keys over both groups.
fn rebuilt_node_restores_on(nodes: u16, params: ClusterParams, lose: u16) {
    let dir = ScratchDir::new("kv-repair-quorum").unwrap();
    let mut expected: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    {
        let store = ShmStore::create(dir.path(), nodes, 32 << 20, params).unwrap();
        if nodes == 6 {
            let c = store.client().unwrap();
            let groups: Vec<Vec<NodeId>> = (0..64)
                .map(|r| c.register_loc(r).unwrap().replicas.nodes().to_vec())
                .collect();
            for g in &groups {
                let mut sorted = g.clone();
                sorted.sort();
                let first = sorted[0].0;
                assert!(first == 0 || first == 3, "{g:?}");
                assert_eq!(sorted, (first..first + 3).map(NodeId).collect::<Vec<_>>());
            }
            c.close();
        }
        let s = OpStats::new;
        // Phase A on {0, 1}.
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(2));
        for i in 0..150 {
            let key = format!("k{i}");
            block_on(
                f,
                c.insert(key.as_bytes(), format!("v{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("v{i}").into_bytes()));
        }
        for i in (1..150).step_by(7) {
            let key = format!("k{i}");
            assert_eq!(
                block_on(f, c.delete(key.as_bytes(), &s())).unwrap(),
                DeleteOutcome::Removed
            );
            expected.insert(key, None);
        }
        c.close();
        // Phase B on {1, 2}: newer values of some keys, deletes, new keys.
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(0));
        for i in (0..150).step_by(3) {
            let key = format!("k{i}");
            block_on(
                f,
                c.insert(key.as_bytes(), format!("u{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("u{i}").into_bytes()));
        }
        for i in (2..150).step_by(5) {
            let key = format!("k{i}");
            block_on(f, c.delete(key.as_bytes(), &s())).unwrap();
            expected.insert(key, None);
        }
        for i in 0..50 {
            let key = format!("n{i}");
            block_on(f, c.insert(key.as_bytes(), b"new", &s())).unwrap();
            expected.insert(key, Some(b"new".to_vec()));
        }
        c.close();
    }
    // Node 1's memory is lost (every mapper sees it crashed, openers refuse it).
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    let degraded = ShmStore::open(dir.path()).unwrap();
    assert_eq!(degraded.unusable_nodes().len(), 1);
    let report = ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}).unwrap();
    assert_eq!(report.node, 1);
    assert_eq!(
        report.epoch, 3,
        "created at epoch 1, announced at 2, admitted at 3"
    );
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

    // Now another node goes: the rebuilt one and the last one must hold everything.
    ShmCluster::retire_node(dir.path(), lose).unwrap();
    let survivors = ShmStore::open(dir.path()).unwrap();
    assert_eq!(survivors.unusable_nodes()[0].0, NodeId(lose));
    let c = survivors.client().unwrap();
    let mut wrong = Vec::new();
    for (key, value) in &expected {
        let got = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
        if &got != value {
            wrong.push(format!("{key}: {got:?}, expected {value:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys wrong after losing node {lose}, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    // And the store takes new writes on them.
    block_on(c.fabric(), c.insert(b"after", b"x", &OpStats::new())).unwrap();
    c.close();
    assert_eq!(get(&survivors, "after"), Some(b"x".to_vec()));
}

/// Six nodes in two replica groups of three: node 1 rebuilt from its group's
/// other replicas (0 and 2), then node 2 lost too; keys in the other group's
/// chunks stay where they were.
#[test]
fn six_nodes_in_replica_groups_a_rebuilt_node_then_the_loss_of_node_2() {
    let params = ClusterParams {
        chunk_registers: 16,
        ..params()
    };
    rebuilt_node_restores_on(6, params, 2);
}
