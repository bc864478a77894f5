//! On shared memory a writer id is taken over only once its owner's process is gone
//! (`swarm_kv::membership::owner_process`): a process whose lease lapsed while it was
//! stopped may still store into what its writer id holds when it is continued, so
//! its id is left to it until it exits.
//!
//! The owner here is a real process (`sleep`), whose identity a registration leaves
//! in the row as its own; the cluster has one writer id, so a new client must take
//! that row over.

use std::process::Command;

use swarm_core::block_on;
use swarm_kv::ClusterParams;
use swarm_kv::admin::OwnerLiveness;
use swarm_kv::testing::owner_process;
use swarm_kv::testing::register_writer;
use swarm_kv::{KvError, ShmStore};
use swarm_shm::ScratchDir;

const MS: u64 = 1_000_000;

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 16,
        value_max: 16,
        writers: 1,
        chunk_registers: 4,
        lease_ns: 400 * MS,
        lease_renew_ns: 100 * MS,
        max_op_ns: 100 * MS,
        cache_ttl_ns: 10 * MS,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 1 << 20, params).expect("create")
}

#[test]
fn a_stopped_owner_keeps_its_writer_id_until_its_process_is_gone() {
    if owner_process::alive(owner_process::this_process()).is_none() {
        eprintln!("skipped: no /proc on this host, process liveness is unknown");
        return;
    }
    let dir = ScratchDir::new("kv-owner-process").unwrap();
    let store = store(&dir);
    assert_eq!(store.config().owners, OwnerLiveness::ThisHost);
    // A process that holds the only writer id and never renews: stopped, as far as
    // the cluster can tell.
    let mut owner = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let identity = owner_process::identity_of(owner.id()).expect("the owner runs");
    let fabric = store.fabric();
    let layout = *store.layout();
    let writer = block_on(
        &fabric,
        register_writer(
            &fabric,
            &layout,
            3,
            0x0abc_0001,
            identity,
            OwnerLiveness::ThisHost,
        ),
    )
    .expect("the owner registers");
    assert_eq!(writer, 0);

    // Its lease lapses, but its process runs: the id is not taken over (and no
    // waiting for it to close).
    let no_wait = swarm_kv::KvConfig {
        writer_wait_ns: 0,
        ..store.config()
    };
    match store.client_with(no_wait) {
        Err(KvError::WritersFull { .. }) => {}
        Err(other) => panic!("expected WritersFull, got {other}"),
        Ok(_) => panic!("a running owner's writer id was taken over"),
    }
    match swarm_kv::admin::evict(&fabric, &layout, 0, false, OwnerLiveness::ThisHost) {
        Err(KvError::OwnerRunning { writer: 0 }) => {}
        other => panic!("expected OwnerRunning, got {other:?}"),
    }

    // Once the process is gone, the next client takes the id over.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let client = store
        .client()
        .expect("the id of a gone process is taken over");
    assert_eq!(client.writer(), 0);
}

#[test]
fn where_processes_cannot_be_seen_the_lease_alone_decides() {
    let dir = ScratchDir::new("kv-owner-unknown").unwrap();
    let store = store(&dir);
    let owner = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let identity = owner_process::identity(owner.id(), 0);
    let fabric = store.fabric();
    let layout = *store.layout();
    block_on(
        &fabric,
        register_writer(
            &fabric,
            &layout,
            3,
            0x0abc_0003,
            identity,
            OwnerLiveness::Unknown,
        ),
    )
    .expect("the owner registers");
    let config = swarm_kv::KvConfig {
        owners: OwnerLiveness::Unknown,
        ..store.config()
    };
    let client = store
        .client_with(config)
        .expect("the lapsed lease is taken over");
    assert_eq!(client.writer(), 0);
    let mut owner = owner;
    owner.kill().unwrap();
    owner.wait().unwrap();
}
