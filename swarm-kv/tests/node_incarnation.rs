//! Node incarnations on shared memory (issue 12, item 2): a node file re-created with
//! a new incarnation is never read as a replica, even when its superblock pages look
//! right (copied from another node, as a half-finished repair or an operator's `cp`
//! would leave them), because the configuration lists another incarnation for it.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use swarm_core::{NodeId, OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::Store;
use swarm_kv::testing::{SUPERBLOCK_AT, SUPERBLOCK_BYTES};
use swarm_kv::{KvError, ShmStore};
use swarm_shm::{ScratchDir, ShmCluster, node_file_name};

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

/// Copies node `from`'s superblock area (parameters and configuration) onto node `to`.
fn copy_superblock(dir: &Path, from: u16, to: u16) {
    let mut area = vec![0u8; SUPERBLOCK_BYTES as usize];
    let open = |n: u16| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(node_file_name(n)))
            .unwrap()
    };
    open(from).read_exact_at(&mut area, SUPERBLOCK_AT).unwrap();
    open(to).write_all_at(&area, SUPERBLOCK_AT).unwrap();
}

const KEYS: u32 = 8;

/// A write on {A, X}; X re-created (new incarnation, superblock copied from A); a
/// read that can only reach {B, X} must fail, never miss the write.
#[test]
fn a_recreated_node_is_never_read_as_a_replica() {
    let dir = ScratchDir::new("kv-incarnation").unwrap();
    {
        let store = store(&dir);
        assert!(store.unusable_nodes().is_empty());
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(1));
        for i in 0..KEYS {
            let key = format!("k{i}");
            block_on(f, c.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
        }
    }
    ShmCluster::replace_node(dir.path(), 2).unwrap();
    copy_superblock(dir.path(), 0, 2);

    let store = ShmStore::open(dir.path()).expect("a majority is left");

    let reader = store.client().unwrap();
    let f = reader.fabric();
    f.fail_node(NodeId(0));
    for i in 0..KEYS {
        let key = format!("k{i}");
        let got = block_on(f, reader.get(key.as_bytes(), &OpStats::new()));
        assert!(
            got.is_err(),
            "{key}: read on {{B, X}} returned {got:?}: the re-created node served as a replica"
        );
    }
    // With the old majority reachable, every write is there.
    let reader = store.client().unwrap();
    for i in 0..KEYS {
        let key = format!("k{i}");
        assert_eq!(
            block_on(reader.fabric(), reader.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"v".to_vec()),
            "{key}"
        );
    }
    let unusable = store.unusable_nodes();
    assert_eq!(unusable.len(), 1, "{unusable:?}");
    assert_eq!(unusable[0].0, NodeId(2));
    assert!(unusable[0].1.contains("incarnation"), "{}", unusable[0].1);
}

/// Replacing a node of a cluster that lost another one: no majority of members, a
/// clear error naming both.
#[test]
fn two_unusable_nodes_of_three_are_refused_naming_them() {
    let dir = ScratchDir::new("kv-incarnation-2").unwrap();
    drop(store(&dir));
    ShmCluster::replace_node(dir.path(), 1).unwrap();
    copy_superblock(dir.path(), 0, 1);
    std::fs::remove_file(dir.path().join(node_file_name(2))).unwrap();
    let err = ShmStore::open(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            KvError::NoMajority {
                usable: 1,
                nodes: 3,
                ..
            }
        ) && text.contains("node 1: unknown incarnation")
            && text.contains("node 2"),
        "{text}"
    );
}
