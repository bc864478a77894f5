//! Adding a memory node online (`ShmStore::add_node`, `swarm_kv`'s
//! `placement::add_node`; ARCHITECTURE.md, "Per-replica placement", step 2), on
//! shared memory: a 3-node cluster of 3 replicas gets a fourth node while
//! clients of this process keep inserting, updating, getting and deleting. Every
//! operation must succeed and the history be linearizable; the running clients
//! follow the new configuration (their fabric reaches the new node), the
//! unclaimed chunks the tool moved are filled on the new node, at the slots their
//! records name (checked in the new node's memory), by the running clients and by
//! a client connected afterwards.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use swarm_checker::OpKind;
use swarm_core::fabric::Batch;
use swarm_core::{Fabric, NodeId, OpStats, Roundtrip, block_on};
use swarm_kv::admin::AddNodeOptions;
use swarm_kv::{ClusterParams, ShmStore};
use swarm_shm::ScratchDir;

mod history_support;
use history_support::{Lcg, run_checked_threads, run_recorded};

const NODES: u16 = 3;
const THREADS: u64 = 3;
/// Operations each running client issues after the add returned: enough for its
/// allocator to come back to the chunks the add held (it skipped them meanwhile).
const OPS_AFTER: u64 = 2500;

fn params() -> ClusterParams {
    ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 8,
        chunk_registers: 4,
        // A short quiescence (a lease observer's wait, an operation deadline and
        // the delivery margin), and registers recycled within the run.
        lease_ns: 300_000_000,
        lease_renew_ns: 50_000_000,
        max_op_ns: 50_000_000,
        delivery_margin_ns: 10_000_000,
        ..ClusterParams::default()
    }
}

/// `len` bytes at `addr` on `node`, read directly.
fn node_bytes(fabric: &impl Fabric, node: NodeId, addr: u64, len: u32) -> Vec<u8> {
    let stats = OpStats::new();
    block_on(fabric, async {
        let mut rt = Roundtrip::start(fabric, &stats);
        rt.post(node, Batch::read(addr, len))?;
        rt.wait(1).await?;
        Ok::<_, swarm_core::FabricError>(rt.replies_mut()[0].1.take_read(0).unwrap())
    })
    .unwrap()
}

#[test]
fn a_node_added_while_clients_run_serves_new_chunks_and_the_history_is_linearizable() {
    let dir = ScratchDir::new("kv-add-node").unwrap();
    let store = ShmStore::create(dir.path(), NODES, 4 << 20, params()).unwrap();
    let layout = *store.layout();
    let per = u64::from(layout.params.chunk_registers);
    println!("{} chunks of {per} registers", layout.chunks());

    let added = AtomicBool::new(false);
    let report = std::sync::Mutex::new(None);
    let per_thread: Vec<(BTreeSet<u64>, usize)> = std::thread::scope(|scope| {
        scope.spawn(|| {
            // Let the clients connect and claim their first chunks.
            std::thread::sleep(std::time::Duration::from_millis(100));
            let r = ShmStore::add_node(dir.path(), AddNodeOptions::default()).unwrap();
            println!(
                "added node {} at epoch {}: {} chunks moved",
                r.node,
                r.epoch,
                r.moved.len()
            );
            *report.lock().unwrap() = Some(r);
            added.store(true, Ordering::Release);
        });
        run_checked_threads(THREADS, |t, origin, ops| {
            let c = store.client().unwrap();
            let f = c.fabric();
            let seed = 0xadd ^ (t * 7919);
            println!("thread {t}: seed {seed:#x}");
            let mut rng = Lcg(seed);
            let mut inserted_after = BTreeSet::new();
            let (mut i, mut after) = (0u64, 0u64);
            while after < OPS_AFTER {
                let done = added.load(Ordering::Acquire);
                let x = rng.next();
                // Shared keys (deletes recycle registers) and keys of this thread's
                // own, never deleted, so that it keeps claiming chunks.
                let (kind, key) = match (x >> 20) % 10 {
                    0..=1 => (OpKind::Get, format!("k{}", (x >> 33) % 16)),
                    2 => (OpKind::Update, format!("k{}", (x >> 33) % 16)),
                    3..=4 => (OpKind::Insert, format!("k{}", (x >> 33) % 16)),
                    5..=7 => (OpKind::Delete, format!("k{}", (x >> 33) % 16)),
                    _ => (OpKind::Insert, format!("t{t}-{i}")),
                };
                // Paced: the cluster must not fill up before the add.
                std::thread::sleep(std::time::Duration::from_micros(300));
                ops.push(run_recorded(
                    &c,
                    t,
                    kind,
                    key.clone(),
                    format!("v{t}-{i}"),
                    origin,
                ));
                if done && kind == OpKind::Insert && key.starts_with('t') {
                    let register =
                        block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes()))
                            .unwrap()
                            .unwrap();
                    inserted_after.insert(register);
                }
                i += 1;
                after += u64::from(done);
            }
            let nodes = f.node_count();
            c.close();
            (inserted_after, nodes)
        })
    });
    let report = report.into_inner().unwrap().expect("the add ran");
    assert_eq!(report.node, NodeId(NODES));
    assert!(!report.moved.is_empty(), "unclaimed chunks were moved");
    let moved: BTreeSet<u64> = report.moved.iter().copied().collect();
    for (t, (_, nodes)) in per_thread.iter().enumerate() {
        assert_eq!(
            *nodes,
            usize::from(NODES) + 1,
            "thread {t} reaches the new node"
        );
    }
    let placed_by_running: usize = per_thread
        .iter()
        .flat_map(|(r, _)| r)
        .filter(|r| moved.contains(&(*r / per)))
        .count();
    println!("running clients filled {placed_by_running} registers of moved chunks");
    assert!(
        placed_by_running > 0,
        "the running clients claimed chunks on the new node"
    );

    // A client connected now follows the records and fills moved chunks on the
    // new node: its key headers are in the new node's memory, at the slots.
    let fresh = ShmStore::open(dir.path()).unwrap();
    let c = fresh.client().unwrap();
    assert_eq!(c.recorded_chunks(), moved.len() + report.reserve.len());
    let f = c.fabric();
    let fabric = fresh.fabric();
    let mut on_new = 0;
    for i in 0..400 {
        let key = format!("after-{i}");
        block_on(f, c.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
        let register = block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes()))
            .unwrap()
            .unwrap();
        if !moved.contains(&(register / per)) {
            continue;
        }
        // The header is on a majority of the replicas (a write reaches its
        // preferred majority), each at its own offset; count the new node's.
        let loc = c.register_loc(register).unwrap();
        assert!(
            loc.offset_on(NodeId(NODES)).is_some(),
            "a moved chunk has a replica on the new node"
        );
        let holding: Vec<NodeId> = loc
            .replicas
            .nodes()
            .iter()
            .copied()
            .filter(|&node| {
                let at = loc.offset_on(node).unwrap() - layout.params.key_header_bytes();
                node_bytes(&fabric, node, at, 8 + key.len() as u32)[8..] == *key.as_bytes()
            })
            .collect();
        assert!(
            holding.len() >= loc.replicas.quorum(),
            "{key}'s header is on {holding:?}"
        );
        assert_eq!(
            block_on(f, c.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"v".to_vec())
        );
        on_new += usize::from(holding.contains(&NodeId(NODES)));
    }
    println!("{on_new} keys of a new client found in the new node's memory");
    assert!(
        on_new > 0,
        "a new client filled moved chunks on the new node"
    );
    c.close();
}

/// A client that still follows the configuration before the add (its next lease
/// renewal is seconds away, as for a client stopped between reading its table and
/// claiming) claims a chunk the add moved: its claim reads the chunk's record, so
/// it follows the new configuration and fills the chunk where the record says,
/// never at its computed place. A client connected afterwards reads every key back.
#[test]
fn a_client_behind_the_configuration_fills_a_moved_chunk_only_where_its_record_says() {
    let dir = ScratchDir::new("kv-add-node-behind").unwrap();
    let params = ClusterParams {
        lease_ns: 20_000_000_000,
        lease_renew_ns: 5_000_000_000,
        ..params()
    };
    let store = ShmStore::create(dir.path(), NODES, 2 << 20, params).unwrap();
    let layout = *store.layout();
    let per = u64::from(layout.params.chunk_registers);
    // Writer ids spread their first chunks over the table: some start in moved ones.
    let clients: Vec<_> = (0..4).map(|_| store.client().unwrap()).collect();
    let report = ShmStore::add_node(
        dir.path(),
        AddNodeOptions {
            quiesce_ns: Some(0),
            ..AddNodeOptions::default()
        },
    )
    .unwrap();
    let moved: BTreeSet<u64> = report.moved.iter().copied().collect();
    let mut behind_in_moved = 0;
    for (i, c) in clients.iter().enumerate() {
        assert_eq!(c.recorded_chunks(), 0, "client {i} follows the old table");
        let f = c.fabric();
        let key = format!("behind-{i}");
        block_on(f, c.insert(key.as_bytes(), key.as_bytes(), &OpStats::new())).unwrap();
        let register = block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes()))
            .unwrap()
            .unwrap();
        if moved.contains(&(register / per)) {
            behind_in_moved += 1;
            assert_eq!(
                c.recorded_chunks(),
                moved.len() + report.reserve.len(),
                "client {i} followed the add"
            );
        }
    }
    println!("{behind_in_moved} clients behind the configuration filled moved chunks");
    assert!(behind_in_moved > 0, "a client behind claimed a moved chunk");
    let fresh = ShmStore::open(dir.path()).unwrap();
    let c = fresh.client().unwrap();
    let f = c.fabric();
    for i in 0..clients.len() {
        let key = format!("behind-{i}");
        assert_eq!(
            block_on(f, c.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(key.clone().into_bytes()),
            "{key} reads back where its chunk's record says"
        );
    }
    c.close();
    for c in clients {
        c.close();
    }
}

/// A client whose lease renewals read a newer configuration that it cannot follow
/// (its placement table keeps failing its checksum, as a record being written
/// would) starts no operation with the table it has: it fails with
/// `ConfigurationBehind`, and serves again once it can follow.
#[test]
fn a_client_that_cannot_follow_a_newer_configuration_starts_no_operation() {
    use swarm_kv::KvError;
    use swarm_kv::testing::{Configuration, read_configuration, write_configuration};
    let dir = ScratchDir::new("kv-add-node-unfollowed").unwrap();
    let store = ShmStore::create(dir.path(), NODES, 2 << 20, params()).unwrap();
    let layout = *store.layout();
    let c = store.client().unwrap();
    let f = c.fabric();
    block_on(f, c.insert(b"k", b"v", &OpStats::new())).unwrap();
    let fabric = store.fabric();
    let record_at = layout.placement_record(0).unwrap();
    let write_record = |bytes: Vec<u8>| {
        let stats = OpStats::new();
        block_on(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for node in 0..NODES {
                rt.post(NodeId(node), Batch::write(record_at, bytes.clone()))?;
            }
            rt.wait(usize::from(NODES)).await
        })
        .unwrap();
    };
    write_record(vec![0xab; 256]);
    let config = read_configuration(&fabric).unwrap();
    let next = Configuration {
        epoch: config.epoch + 1,
        ..config
    };
    write_configuration(&fabric, &next).unwrap();
    let mut behind = false;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        match block_on(f, c.get(b"k", &OpStats::new())) {
            Ok(value) => assert_eq!(value.as_deref(), Some(&b"v"[..])),
            Err(KvError::ConfigurationBehind { seen, .. }) => {
                assert_eq!(seen, next.epoch);
                behind = true;
                break;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(
        behind,
        "the client started operations behind the configuration"
    );
    write_record(vec![0; 256]);
    assert_eq!(
        block_on(f, c.get(b"k", &OpStats::new()))
            .unwrap()
            .as_deref(),
        Some(&b"v"[..]),
        "it follows the mended table and serves again"
    );
    c.close();
}

/// Inserts distinct keys `prefix-i` with `c` until the cluster is full (several
/// `RegistersFull` in a row, `tries` apart by `pause`: a client that has not
/// followed an add yet finds the area full until its next lease renewal), and
/// returns how many it inserted.
fn fill(
    c: &swarm_kv::KvClient<swarm_shm::EmulatedFabric, swarm_kv::SystemClock>,
    prefix: &str,
    tries: u32,
    pause_ms: u64,
) -> u64 {
    let f = c.fabric();
    let (mut inserted, mut full) = (0u64, 0);
    while full < tries {
        let key = format!("{prefix}-{inserted}");
        match block_on(f, c.insert(key.as_bytes(), b"v", &OpStats::new())) {
            Ok(()) => {
                inserted += 1;
                full = 0;
            }
            Err(swarm_kv::KvError::RegistersFull { .. }) => {
                full += 1;
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
            }
            Err(other) => panic!("insert {key}: {other}"),
        }
    }
    inserted
}

/// An add-node gives the cluster keys: a 3-node cluster of 3 replicas made with
/// room to grow, half full, gets a fourth node; the running client then inserts
/// more keys than the cluster held before the add (into reserve chunks the add
/// recorded, on the new node and in the slots its moves freed), and every key
/// reads back from a client connected afterwards.
#[test]
fn after_an_add_clients_fill_more_keys_than_the_cluster_held_before() {
    let dir = ScratchDir::new("kv-add-node-grows").unwrap();
    // Two writer ids: longer logs for one client's inserts back to back.
    let params = ClusterParams {
        writers: 2,
        ..params()
    };
    let store = ShmStore::create(dir.path(), NODES, 2 << 20, params).unwrap();
    let layout = *store.layout();
    let before = layout.params.registers;
    println!(
        "{before} keys before, room for {} ({} reserve chunks)",
        layout.capacity_max(),
        layout.reserve_chunks()
    );
    assert!(layout.reserve_chunks() > 0, "room to grow by default");
    let c = store.client().unwrap();
    let f = c.fabric();
    for i in 0..before / 2 {
        let key = format!("k-{i}");
        block_on(f, c.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
    }
    let report = ShmStore::add_node(dir.path(), AddNodeOptions::default()).unwrap();
    println!(
        "added node {}: {} chunks moved, {} reserve chunks recorded",
        report.node,
        report.moved.len(),
        report.reserve.len()
    );
    assert!(
        !report.reserve.is_empty(),
        "the add recorded reserve chunks"
    );
    let after = before + report.reserve.len() as u64 * u64::from(layout.params.chunk_registers);
    let more = fill(&c, "m", 20, 25);
    let inserted = before / 2 + more;
    println!("{inserted} keys inserted; capacity {before} before the add, {after} after");
    assert!(inserted > before, "the cluster holds more keys than before");
    assert!(inserted <= after);
    assert_eq!(
        c.recorded_chunks(),
        report.moved.len() + report.reserve.len()
    );
    c.close();

    let fresh = ShmStore::open(dir.path()).unwrap();
    let c = fresh.client().unwrap();
    let f = c.fabric();
    let per = u64::from(layout.params.chunk_registers);
    let mut in_reserve = 0;
    let keys = (0..before / 2)
        .map(|i| format!("k-{i}"))
        .chain((0..more).map(|i| format!("m-{i}")));
    for (i, key) in keys.enumerate() {
        assert_eq!(
            block_on(f, c.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"v".to_vec()),
            "{key}"
        );
        if i % 16 == 0 {
            let register = block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes()))
                .unwrap()
                .unwrap();
            in_reserve += usize::from(layout.is_reserve(register / per));
        }
    }
    assert!(in_reserve > 0, "keys live in reserve chunks");
    c.close();
}

/// A client that still follows the configuration before an add (its next lease
/// renewal is seconds away), with every computed chunk taken, fills the reserve
/// chunks the add recorded only after following it, and where their records say:
/// finding the cluster full, it follows the newer configuration first (the
/// allocator never claims a reserve chunk its table has no record for:
/// `registers::alloc`'s unit tests).
#[test]
fn a_client_behind_the_configuration_fills_reserve_chunks_only_after_following_it() {
    let dir = ScratchDir::new("kv-add-node-reserve-behind").unwrap();
    let params = ClusterParams {
        lease_ns: 6_000_000_000,
        lease_renew_ns: 1_500_000_000,
        writers: 2,
        ..params()
    };
    let store = ShmStore::create(dir.path(), NODES, 2 << 20, params).unwrap();
    let layout = *store.layout();
    let behind = store.client().unwrap();
    let report = ShmStore::add_node(
        dir.path(),
        AddNodeOptions {
            quiesce_ns: Some(0),
            ..AddNodeOptions::default()
        },
    )
    .unwrap();
    assert!(!report.reserve.is_empty());
    // Every computed chunk taken, with a configuration change's hold (no
    // reclamation pass adopts it).
    let fabric = store.fabric();
    let stats = OpStats::new();
    let words = |chunks: std::ops::Range<u64>| -> Vec<u64> {
        let len = (8 * (chunks.end - chunks.start)) as u32;
        node_bytes(&fabric, NodeId(0), layout.chunk_word(chunks.start), len)
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect()
    };
    block_on(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        for node in 0..NODES {
            let taken = vec![0xf0u8; 8 * layout.computed_chunks() as usize];
            rt.post(NodeId(node), Batch::write(layout.chunk_word(0), taken))?;
        }
        rt.wait(usize::from(NODES)).await
    })
    .unwrap();
    let f = behind.fabric();
    assert_eq!(behind.recorded_chunks(), 0, "behind");
    assert!(
        words(layout.computed_chunks()..layout.chunks())
            .iter()
            .all(|w| *w == 0)
    );
    // Once it follows the add, it fills the reserve chunks where their records say.
    let inserted = fill(&behind, "behind", 3, 10);
    println!("{inserted} keys inserted once it followed the add");
    assert!(behind.recorded_chunks() > 0, "it followed the add");
    assert_eq!(
        inserted,
        report.reserve.len() as u64 * u64::from(layout.params.chunk_registers)
    );
    let per = u64::from(layout.params.chunk_registers);
    let register = block_on(f, behind.index().resolve(f, &OpStats::new(), b"behind-0"))
        .unwrap()
        .unwrap();
    assert!(report.reserve.contains(&(register / per)));
    let loc = behind.register_loc(register).unwrap();
    let holding = loc
        .replicas
        .nodes()
        .iter()
        .filter(|&&node| {
            let at = loc.offset_on(node).unwrap() - layout.params.key_header_bytes();
            node_bytes(&fabric, node, at, 16)[8..16] == *b"behind-0"
        })
        .count();
    assert!(
        holding >= loc.replicas.quorum(),
        "its header is at the record's slots"
    );
    behind.close();
}
