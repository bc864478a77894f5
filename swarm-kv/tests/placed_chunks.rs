//! Chunks placed by placement records (`swarm_kv`'s `placement` module;
//! ARCHITECTURE.md, "Per-replica placement", step 1), on shared memory: 7 nodes of 3
//! replicas, where each band of the register area leaves one node free. Records put
//! the chunks the clients claim first on three such free spots each (other nodes
//! than their computed group, another slot on each node), before any client
//! connects; concurrent clients then insert, update, get and delete shared keys,
//! with registers recycled, and the history must be linearizable. The recorded
//! chunks' registers must be where the records say, and their computed places must
//! stay untouched (zeros): a path that still posted a computed address, or one
//! replica's offset to another, would write there, or miss the values it reads.

use std::collections::BTreeSet;

use swarm_checker::OpKind;
use swarm_core::fabric::Batch;
use swarm_core::{Fabric, NodeId, OpStats, Roundtrip, block_on};
use swarm_kv::admin::{RepairError, RepairOptions};
use swarm_kv::testing::placement::{PlacementRecord, Spot, write_record};
use swarm_kv::{ClusterParams, KvError, ShmStore};
use swarm_shm::ScratchDir;

mod history_support;
use history_support::{Lcg, run_checked_threads, run_recorded};

const NODES: u16 = 7;
const THREADS: u64 = 4;
/// Chunks recorded from each client's first chunk on (the allocator's cursor).
const RECORDED_PER_WRITER: u64 = 12;

fn params() -> ClusterParams {
    ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 8,
        chunk_registers: 4,
        // Retired registers come back after about 90 ms, within the run.
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

/// Records the chunks each writer id claims first (its allocator's cursor on) on
/// the free spots of consecutive bands, three distinct nodes each; returns them.
fn record_chunks(store: &ShmStore) -> BTreeSet<u64> {
    let layout = store.layout();
    let p = layout.params;
    let chunks = layout.chunks();
    let free: Vec<Spot> = (0..layout.slots())
        .flat_map(|band| {
            (0..NODES)
                .filter(move |&n| layout.group_of(usize::from(n), band).is_none())
                .map(move |n| Spot {
                    node: n as u8,
                    slot: band as u32,
                })
        })
        .collect();
    let mut wanted = BTreeSet::new();
    for writer in 0..u64::from(p.writers) {
        let cursor = (writer * 0x9E37_79B9) % chunks;
        wanted.extend((0..RECORDED_PER_WRITER).map(|i| (cursor + i) % chunks));
    }
    let fabric = store.fabric();
    let stats = OpStats::new();
    let meta = layout.metadata_nodes(usize::from(NODES));
    let mut spots = free.chunks_exact(3);
    for &chunk in &wanted {
        let replicas = spots
            .next()
            .expect("free spots for every recorded chunk")
            .to_vec();
        let record = PlacementRecord {
            epoch: 1,
            replicas,
            destination: None,
        };
        block_on(
            &fabric,
            write_record(&fabric, &stats, layout, meta, chunk, &record),
        )
        .unwrap();
    }
    wanted
}

#[test]
fn recorded_chunks_serve_linearizable_operations_at_their_recorded_slots() {
    let dir = ScratchDir::new("kv-placed-chunks").unwrap();
    let store = ShmStore::create(dir.path(), NODES, 8 << 20, params()).unwrap();
    let layout = *store.layout();
    assert!(layout.placements_at.is_some(), "a version-10 cluster");
    assert_eq!(layout.params.groups(), 2);
    let recorded = record_chunks(&store);
    let per = u64::from(layout.params.chunk_registers);
    let in_recorded = |register: u64| recorded.contains(&(register / per));

    // Every client follows the records, and a recorded register's location differs
    // from its computed one: other nodes, its own offset on each.
    {
        let c = store.client().unwrap();
        assert_eq!(c.recorded_chunks(), recorded.len());
        let &chunk = recorded.iter().next().unwrap();
        let loc = c.register_loc(chunk * per + 1).unwrap();
        let computed =
            swarm_kv::testing::register_loc_for(&layout, usize::from(NODES), chunk * per + 1)
                .unwrap();
        assert_eq!(loc.id, computed.id, "the identity is the computed address");
        assert_eq!(loc.same_offset(), None, "an offset per replica");
        let offsets: BTreeSet<u64> = loc
            .replicas
            .nodes()
            .iter()
            .map(|n| loc.offset_on(*n).unwrap())
            .collect();
        assert_eq!(offsets.len(), 3, "three slots");
        let nodes: BTreeSet<NodeId> = loc.replicas.nodes().iter().copied().collect();
        let computed_nodes: BTreeSet<NodeId> = computed.replicas.nodes().iter().copied().collect();
        assert_ne!(nodes, computed_nodes);
        c.close();
    }

    // Concurrent clients on shared keys, with deletes (so registers retire, are
    // reset and come back) and inserts (each takes a fresh register).
    let used: Vec<(BTreeSet<u64>, u64, u64)> = run_checked_threads(THREADS, |t, origin, ops| {
        let c = store.client().unwrap();
        let f = c.fabric();
        let seed = 0x5eed ^ (t * 7919);
        println!("thread {t}: seed {seed:#x}");
        let mut rng = Lcg(seed);
        let mut registers = BTreeSet::new();
        for i in 0..400u64 {
            let x = rng.next();
            let key = format!("k{}", (x >> 33) % 24);
            let value = format!("t{t}-{i}");
            let kind = match (x >> 20) % 10 {
                0..=2 => OpKind::Get,
                3 => OpKind::Update,
                4..=6 => OpKind::Insert,
                _ => OpKind::Delete,
            };
            ops.push(run_recorded(&c, t, kind, key.clone(), value, origin));
            if let Some(register) =
                block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes())).unwrap()
            {
                registers.insert(register);
            }
            if i % 50 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let stats = c.recycle_stats();
        c.close();
        (registers, stats.recycled, stats.reset_failures)
    });
    let recycled: u64 = used.iter().map(|(_, r, _)| r).sum();
    let reset_failures: u64 = used.iter().map(|(_, _, f)| f).sum();
    let used: BTreeSet<u64> = used.into_iter().flat_map(|(r, _, _)| r).collect();
    assert!(recycled > 0, "registers were recycled during the run");
    // Every replica answers: a reset that kept failing read or wrote the wrong words.
    assert_eq!(reset_failures, 0, "resets failed");
    let placed: Vec<u64> = used.iter().copied().filter(|r| in_recorded(*r)).collect();
    println!(
        "{} registers mapped during the run, {} of them in recorded chunks; {recycled} recycled",
        used.len(),
        placed.len()
    );
    assert!(
        placed.len() >= 8,
        "the run went through recorded chunks: {placed:?}"
    );

    // Memory: every recorded chunk's computed place is untouched on its computed
    // nodes, and a mapped register's key header is at its recorded offsets.
    let fabric = store.fabric();
    let c = store.client().unwrap();
    for &chunk in &recorded {
        let computed =
            swarm_kv::testing::register_loc_for(&layout, usize::from(NODES), chunk * per).unwrap();
        let at = layout.key_header(chunk * per).unwrap();
        let bytes = (per * layout.register_slot_bytes) as u32;
        for &node in computed.replicas.nodes() {
            let memory = node_bytes(&fabric, node, at, bytes);
            assert!(
                memory.iter().all(|b| *b == 0),
                "chunk {chunk}'s computed place on node {node} was written"
            );
        }
    }
    let f = c.fabric();
    let mut checked = 0;
    for k in 0..24 {
        let key = format!("k{k}");
        let Some(register) =
            block_on(f, c.index().resolve(f, &OpStats::new(), key.as_bytes())).unwrap()
        else {
            continue;
        };
        if !in_recorded(register) {
            continue;
        }
        // The header was written to a majority of the replicas at least, each at
        // its own offset.
        let loc = c.register_loc(register).unwrap();
        let holding = loc
            .replicas
            .nodes()
            .iter()
            .filter(|&&node| {
                let header_at = loc.offset_on(node).unwrap() - layout.params.key_header_bytes();
                node_bytes(&fabric, node, header_at, 8 + key.len() as u32)[8..] == *key.as_bytes()
            })
            .count();
        assert!(
            holding >= loc.replicas.quorum(),
            "{key}'s header is on {holding} replicas"
        );
        checked += 1;
    }
    println!("{checked} mapped keys checked at their recorded offsets");
    c.close();
}

/// A repair copies chunks from their computed places only (step 3 makes it follow
/// the records): on a cluster with records it refuses before it announces
/// anything, and the node stays out of service rather than come back without its
/// recorded chunks.
#[test]
fn a_repair_refuses_a_cluster_with_placement_records() {
    let dir = ScratchDir::new("kv-placed-repair").unwrap();
    let store = ShmStore::create(dir.path(), NODES, 8 << 20, params()).unwrap();
    let recorded = record_chunks(&store);
    drop(store);
    assert!(swarm_shm::ShmCluster::retire_node(dir.path(), 3).unwrap());
    let refused = ShmStore::repair(dir.path(), 3, RepairOptions::DEFAULT, |_, _| {});
    assert!(
        matches!(
            refused,
            Err(KvError::Repair(RepairError::Placed { chunks })) if chunks == recorded.len()
        ),
        "{refused:?}"
    );
}
