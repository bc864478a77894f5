//! Registers whose replicas sit at different offsets on different nodes
//! ([`RegisterLoc::placed`]; ARCHITECTURE.md, "Per-replica placement"): every batch
//! to a replica goes to that replica's own offset, and the register keeps one
//! identity (its log records' owner tag, its slot tracker entry) apart from all of
//! them. The offsets here differ per node and from the identity, so a path that
//! posted the identity, or another replica's offset, reads or writes bytes nobody
//! else looks at: its operation misses the value, or the memory checks below fail.

mod support;

use support::{GRACE, pass};
use swarm_core::encoding::{Tsp, WriterId};
use swarm_core::fabric::FailNodes;
use swarm_core::layout::Layout;
use swarm_core::resume::scan_log;
use swarm_core::{
    Batch, Client, DeleteOutcome, FixedClock, FreshOutcome, MemCluster, MemFabric, NodeId, OpStats,
    ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, Roundtrip, block_on,
};

fn layout() -> Layout {
    Layout::builder()
        .payload_max(16)
        .meta_words(2)
        .log_base(1 << 16)
        .writers(4)
        .slots_per_writer(16)
        .build()
        .unwrap()
}

/// Register `i`'s identity: where [`support::reg`] would put it on every node.
fn id(i: u64) -> u64 {
    4096 + i * 512
}

/// Register `i`'s offset on node `n`: a region of its own per node, none at the
/// identity or at another node's offset.
fn offset(i: u64, n: u16) -> u64 {
    12288 * (u64::from(n) + 1) + i * 512
}

/// Register `i`, placed at [`offset`] on each of the three nodes.
fn placed(i: u64) -> RegisterLoc {
    let offsets: Vec<(NodeId, u64)> = (0..3u16).map(|n| (NodeId(n), offset(i, n))).collect();
    RegisterLoc::placed(id(i), Replicas::all(3, i).unwrap(), &offsets).unwrap()
}

fn client(cluster: &MemCluster, writer: u32) -> Client<FailNodes<MemFabric>, FixedClock> {
    Client::new(
        FailNodes::new(cluster.client()),
        FixedClock(100),
        layout(),
        WriterId::new(writer).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap()
}

/// `len` bytes at `addr` on `node`, read directly.
fn node_bytes(cluster: &MemCluster, node: NodeId, addr: u64, len: u32) -> Vec<u8> {
    let fabric = cluster.client();
    let stats = OpStats::new();
    block_on(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        rt.post(node, Batch::read(addr, len))?;
        rt.wait(1).await?;
        Ok::<_, swarm_core::FabricError>(rt.replies_mut()[0].1.take_read(0).unwrap())
    })
    .unwrap()
}

/// The largest metadata word (or delete word) of `reg` on `node`, at its offset
/// there.
fn max_word(cluster: &MemCluster, reg: &RegisterLoc, node: NodeId) -> Tsp {
    let l = layout();
    let at = reg.offset_on(node).unwrap() + l.meta_offset();
    node_bytes(cluster, node, at, l.meta_bytes() as u32)
        .chunks_exact(8)
        .map(|w| Tsp::from_word(u64::from_le_bytes(w.try_into().unwrap())))
        .max()
        .unwrap()
}

/// Whether `len` bytes at `addr` on every node are zero.
fn zero_everywhere(cluster: &MemCluster, addr: u64, len: u32) -> bool {
    (0..3).all(|n| {
        node_bytes(cluster, NodeId(n), addr, len)
            .iter()
            .all(|b| *b == 0)
    })
}

fn read(c: &Client<FailNodes<MemFabric>, FixedClock>, r: &RegisterLoc) -> ReadValue {
    let stats = OpStats::new();
    block_on(c.fabric(), c.read(r, &mut RegisterCache::new(), &stats)).unwrap()
}

fn write(c: &Client<FailNodes<MemFabric>, FixedClock>, r: &RegisterLoc, v: &[u8]) {
    let stats = OpStats::new();
    block_on(c.fabric(), c.write(r, &mut RegisterCache::new(), &stats, v)).unwrap();
}

#[test]
fn a_placed_register_is_written_and_read_at_each_replicas_own_offset() {
    let cluster = MemCluster::new(3, 1 << 20);
    let (a, b) = (client(&cluster, 1), client(&cluster, 2));
    let r = placed(0);
    write(&a, &r, b"one");
    assert_eq!(read(&b, &r), ReadValue::Value(b"one".to_vec()));
    // The metadata is at each node's own offset, nothing at the identity, and
    // nothing at another node's offset.
    let l = layout();
    let held = (0..3)
        .filter(|&n| !max_word(&cluster, &r, NodeId(n)).is_empty())
        .count();
    assert!(held >= 2, "on a majority, at their own offsets");
    assert!(zero_everywhere(&cluster, r.id, l.register_bytes() as u32));
    for n in 0..3u16 {
        for other in (0..3u16).filter(|&o| o != n) {
            let bytes = node_bytes(&cluster, NodeId(n), offset(0, other), 8);
            assert!(
                bytes.iter().all(|b| *b == 0),
                "node {n} at node {other}'s offset"
            );
        }
    }
    // Another writer's write and the second one of the first; then without the
    // primary: the other replicas' metadata and buffers, at their offsets.
    write(&b, &r, b"two");
    write(&a, &r, b"three");
    assert_eq!(read(&b, &r), ReadValue::Value(b"three".to_vec()));
    let c = client(&cluster, 3);
    c.fabric().fail_node(r.replicas.node(0));
    assert_eq!(read(&c, &r), ReadValue::Value(b"three".to_vec()));
    write(&c, &r, b"four");
    c.fabric().recover_node(r.replicas.node(0));
    assert_eq!(read(&a, &r), ReadValue::Value(b"four".to_vec()));
}

#[test]
fn a_fresh_write_puts_its_prefix_before_each_replicas_offset() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = client(&cluster, 1);
    let r = placed(1);
    let stats = OpStats::new();
    let out = block_on(
        a.fabric(),
        a.write_fresh(&r, &mut RegisterCache::new(), &stats, b"v", b"key"),
    )
    .unwrap();
    assert_eq!(out, FreshOutcome::Written);
    let with_prefix = (0..3u16)
        .filter(|&n| node_bytes(&cluster, NodeId(n), offset(1, n) - 3, 3) == b"key")
        .count();
    assert!(
        with_prefix >= 2,
        "the prefix on a majority, each before its offset"
    );
    assert!(zero_everywhere(&cluster, r.id - 3, 3));
    assert_eq!(read(&a, &r), ReadValue::Value(b"v".to_vec()));
    // RAW and ABD use the same offsets.
    let raw = placed(2);
    block_on(a.fabric(), a.raw_write(&raw, &stats, b"raw")).unwrap();
    assert_eq!(
        block_on(a.fabric(), a.raw_read(&raw, &stats)).unwrap(),
        ReadValue::Value(b"raw".to_vec())
    );
    let abd = placed(3);
    let mut cache = RegisterCache::new();
    block_on(a.fabric(), a.abd_write(&abd, &mut cache, &stats, b"abd")).unwrap();
    let got = block_on(
        a.fabric(),
        a.abd_read(&abd, &mut RegisterCache::new(), &stats),
    );
    assert_eq!(got.unwrap(), ReadValue::Value(b"abd".to_vec()));
}

#[test]
fn a_placed_register_is_deleted_at_each_replicas_delete_word() {
    let cluster = MemCluster::new(3, 1 << 20);
    let (a, b) = (client(&cluster, 1), client(&cluster, 2));
    let r = placed(4);
    write(&a, &r, b"gone");
    let stats = OpStats::new();
    let out = block_on(a.fabric(), a.delete(&r, &mut RegisterCache::new(), &stats)).unwrap();
    assert_eq!(out, DeleteOutcome::Removed);
    let l = layout();
    let tombstoned = (0..3u16)
        .filter(|&n| {
            let word = node_bytes(&cluster, NodeId(n), l.delete_word_addr(offset(4, n)), 8);
            Tsp::from_word(u64::from_le_bytes(word.try_into().unwrap())).is_tombstone()
        })
        .count();
    assert!(tombstoned >= 2, "a tombstone on a majority of delete words");
    assert_eq!(read(&b, &r), ReadValue::Deleted);
}

/// Slot recycling tracks the register by its identity and checks it at the
/// replicas' offsets: a check that read anywhere else would find empty words and
/// free the slot of the register's current value. A new incarnation finds the
/// identity in its log's records and locates the register through it.
#[test]
fn slots_of_a_placed_register_are_recycled_by_checks_at_its_offsets() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = support::client(&cluster, layout(), 1, 100);
    let b = support::client(&cluster, layout(), 2, 100);
    let (r0, r1) = (placed(5), placed(6));
    let write = |c: &Client<MemFabric, FixedClock>, r: &RegisterLoc, v: &[u8]| {
        let stats = OpStats::new();
        block_on(c.fabric(), c.write(r, &mut RegisterCache::new(), &stats, v)).unwrap();
    };
    let reserved = a.slot_counters().in_use; // the tombstone slot
    write(&a, &r0, b"x1");
    write(&a, &r0, b"x2"); // supersedes x1
    write(&a, &r1, b"y1");
    pass(&a, GRACE);
    let c = support::step(&a, 8);
    // x1 freed; x2 and y1 are their registers' values, which the check (at the
    // replicas' offsets) found there.
    assert_eq!((c.in_use, c.in_limbo, c.recycled), (reserved + 2, 0, 1));
    write(&b, &r1, b"z1");
    let stats = OpStats::new();
    block_on(a.fabric(), a.delete(&r0, &mut RegisterCache::new(), &stats)).unwrap();
    let c = support::step(&a, 8);
    assert_eq!(c.in_limbo, 2, "x2 (tombstone) and y1 (check): {c:?}");
    pass(&a, GRACE);
    let c = support::step(&a, 8);
    assert_eq!((c.in_use, c.recycled), (reserved, 3));

    // A later incarnation of writer 2 finds z1's record naming r1 by its identity.
    let w = WriterId::new(2).unwrap();
    let scan = block_on(b.fabric(), scan_log(b.fabric(), &stats, &layout(), w, 10)).unwrap();
    assert!(!scan.resumed.is_empty());
    assert!(
        scan.resumed.iter().all(|w| w.register == r1.id),
        "records name their register by its identity"
    );
    let b2 = support::client(&cluster, layout(), 2, 100);
    b2.resume_scan(&scan, |tag| (tag == r1.id).then(|| r1.clone()));
    assert_eq!(b2.slot_counters().tracked_registers, 1);
    // z1 is r1's value at its offsets: the check keeps it (and frees any older
    // write of the same writer there).
    support::step(&b2, 8);
    pass(&b2, GRACE);
    let c = support::step(&b2, 8);
    assert_eq!(c.tracked_registers, 1, "z1 kept: {c:?}");
    assert_eq!(c.recycled as usize, scan.resumed.len() - 1, "{c:?}");
}
