//! Log slot recycling on the in-process fabric (SWARM §4.5, `swarm_core::slot_recycling`):
//! which events free a slot, that nothing is freed before the grace, and that a new
//! incarnation of a writer id recycles the slots its predecessor left.

mod support;

use support::{GRACE, pass, reg, write};
use swarm_core::encoding::WriterId;
use swarm_core::layout::Layout;
use swarm_core::resume::scan_log;
use swarm_core::{
    Client, Fabric, FixedClock, MemCluster, MemFabric, OpStats, RegisterCache, RegisterLoc,
    Replicas, block_on, block_on_future,
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

fn client(cluster: &MemCluster, writer: u32) -> Client<MemFabric, FixedClock> {
    support::client(cluster, layout(), writer, 100)
}

/// One reclaim step of `c`, run to its end.
fn step(c: &Client<MemFabric, FixedClock>) -> swarm_core::slot_recycling::SlotCounters {
    support::step(c, 8)
}

#[test]
fn own_writes_deletes_and_checks_free_slots_after_the_grace() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = client(&cluster, 1);
    let b = client(&cluster, 2);
    let (r0, r1) = (reg(0), reg(1));
    let reserved = a.slot_counters().in_use; // the tombstone slot
    write(&a, &r0, b"x1");
    write(&a, &r0, b"x2"); // supersedes x1
    write(&a, &r1, b"y1");
    let c = a.slot_counters();
    assert_eq!((c.in_use, c.in_limbo, c.recycled), (reserved + 3, 1, 0));
    // Not before the grace.
    step(&a);
    assert_eq!(a.slot_counters().recycled, 0, "released before the grace");
    pass(&a, GRACE);
    let c = step(&a);
    assert_eq!((c.in_use, c.in_limbo, c.recycled), (reserved + 2, 0, 1));
    // Another writer overwrites r1: only a check of a majority tells a.
    write(&b, &r1, b"z1");
    // a's delete of r0 supersedes x2 by its tombstone.
    let stats = OpStats::new();
    block_on(a.fabric(), a.delete(&r0, &mut RegisterCache::new(), &stats)).unwrap();
    let c = step(&a);
    assert_eq!(
        c.in_limbo, 2,
        "x2 (tombstone) and y1 (check) superseded: {c:?}"
    );
    assert_eq!(c.tracked_registers, 0);
    pass(&a, GRACE);
    let c = step(&a);
    assert_eq!((c.in_use, c.recycled), (reserved, 3));
}

#[test]
fn a_new_incarnation_recycles_its_predecessors_superseded_slots() {
    let cluster = MemCluster::new(3, 1 << 20);
    let (r0, r1) = (reg(0), reg(1));
    {
        // The first incarnation of writer 1 writes x1, y1, x2 and crashes before
        // x1's grace passed: its limbo is lost with it.
        let a = client(&cluster, 1);
        write(&a, &r0, b"x1");
        write(&a, &r1, b"y1");
        write(&a, &r0, b"x2");
        assert_eq!(a.slot_counters().in_limbo, 1);
    }
    let b = client(&cluster, 1);
    let w = WriterId::new(1).unwrap();
    let stats = OpStats::new();
    let scan = block_on(b.fabric(), scan_log(b.fabric(), &stats, &layout(), w, 10)).unwrap();
    assert_eq!(scan.used_slots.len(), 3);
    assert_eq!(scan.resumed.len(), 3, "every record names its register");
    let locate = |addr: u64| [reg(0), reg(1)].into_iter().find(|r| r.id == addr);
    b.resume_scan(&scan, locate);
    let before = b.slot_counters();
    assert_eq!(before.tracked_registers, 2);
    // x1 is below x2 on a majority of r0: superseded; x2 and y1 are live.
    step(&b);
    pass(&b, GRACE);
    let after = step(&b);
    assert_eq!(after.recycled, 1, "{after:?}");
    assert_eq!(after.in_use, before.in_use - 1);
    assert_eq!(
        after.tracked_registers, 2,
        "x2 and y1 stay: they are current"
    );
    // Without the registers (the old resume), every slot stays taken.
    let c = client(&cluster, 3);
    c.resume(scan.used_slots.iter().copied(), scan.last_ticks);
    let taken = c.slot_counters().in_use;
    step(&c);
    pass(&c, GRACE);
    let c = step(&c);
    assert_eq!((c.in_use, c.recycled), (taken, 0));
}

/// A predecessor's write of unknown outcome whose register was reset since (a
/// store recycled the register) is on no replica: the new incarnation frees its
/// slot once every replica shows the reset, never while one may still hold it.
#[test]
fn a_new_incarnation_recycles_the_slots_of_its_predecessors_reset_registers() {
    let cluster = MemCluster::new(3, 1 << 20);
    let r1 = reg(1);
    {
        let a = client(&cluster, 1);
        write(&a, &r1, b"y1");
    }
    let b = client(&cluster, 1);
    let w = WriterId::new(1).unwrap();
    let stats = OpStats::new();
    let scan = block_on(b.fabric(), scan_log(b.fabric(), &stats, &layout(), w, 10)).unwrap();
    b.resume_scan(&scan, |addr| (addr == r1.id).then(|| r1.clone()));
    let taken = b.slot_counters().in_use;
    // y1 is r1's value: it stays.
    step(&b);
    pass(&b, GRACE);
    assert_eq!(step(&b).recycled, 0);
    // Reset on two replicas of three: the third may still hold y1 (as far as b
    // can tell, a write of unknown outcome sits on a minority), so it stays.
    reset_register(&cluster, &r1, &[0, 1]);
    step(&b);
    pass(&b, GRACE);
    assert_eq!(step(&b).recycled, 0, "freed while a replica held it");
    // Reset everywhere: y1 is nowhere, its slot comes back after the grace.
    reset_register(&cluster, &r1, &[2]);
    let c = step(&b);
    assert_eq!((c.in_limbo, c.recycled), (1, 0), "not before the grace");
    pass(&b, GRACE);
    let c = step(&b);
    assert_eq!(
        (c.in_use, c.recycled, c.tracked_registers),
        (taken - 1, 1, 0)
    );
}

/// Zeroes `r`'s memory (metadata, in-place copy) on `nodes`, as a store's
/// register reset does.
fn reset_register(cluster: &MemCluster, r: &RegisterLoc, nodes: &[u16]) {
    let zeros = vec![0; layout().register_bytes() as usize];
    let fabric = cluster.client();
    for &node in nodes {
        let ticket = fabric.post(
            swarm_core::NodeId(node),
            swarm_core::Batch::write(r.offset(0), zeros.clone()),
        );
        block_on_future(&fabric, core::future::poll_fn(|_| fabric.poll(ticket)))
            .unwrap()
            .unwrap();
    }
}

/// A clean stop hands its log summary to the next incarnation, which reads no log
/// slot to start (`swarm_core::summary`), writes above every earlier timestamp, never
/// reuses a carried slot unexamined, and recycles the superseded ones once the
/// background examination learned what they hold (`carried.rs`).
#[test]
fn a_summary_resume_examines_carried_slots_lazily_and_recycles_the_superseded() {
    let cluster = MemCluster::new(3, 1 << 20);
    let (r0, r1) = (reg(0), reg(1));
    let summary = {
        let a = client(&cluster, 1);
        write(&a, &r0, b"x1");
        write(&a, &r1, b"y1");
        write(&a, &r0, b"x2");
        // x1 is recycled: its slot (and timestamp's slot) is free again.
        step(&a);
        pass(&a, GRACE);
        assert_eq!(step(&a).recycled, 1);
        a.log_summary()
    };
    let reserved = client(&cluster, 3).slot_counters().in_use; // the tombstone slot
    assert_eq!(summary.in_use(), reserved + 2);
    // Round trip through memory, as a store does.
    let summary =
        swarm_core::summary::LogSummary::decode(&summary.encode(7), 7, layout().slots_per_writer())
            .unwrap();

    let b = client(&cluster, 1);
    let locate = |addr: u64| [reg(0), reg(1)].into_iter().find(|r| r.id == addr);
    b.resume_summary(&summary, locate);
    let c = b.slot_counters();
    assert_eq!(
        (c.in_use, c.carried, c.tracked_registers),
        (reserved + 2, 2, 0)
    );
    // Same clock as `a`: without the summary's last ticks, b would guess x1's
    // timestamp again (its slot is free), a timestamp used twice.
    write(&b, &r0, b"x3");
    assert!(b.log_summary().last_ticks > summary.last_ticks);
    let stats = OpStats::new();
    assert_eq!(read_value(&b, &r0, &stats), b"x3");
    write(&b, &r1, b"y2");
    assert_eq!(
        b.slot_counters().in_use,
        reserved + 4,
        "no carried slot reused"
    );

    // The examination runs between operations, a read at a time.
    for _ in 0..100 {
        if b.carried_remaining() == 0 {
            break;
        }
        b.examine_carried_tick(b.fabric().now());
        b.fabric().progress();
    }
    assert_eq!(b.carried_remaining(), 0);
    // x2 and y1 are now known, and superseded (by x3 and y2).
    step(&b);
    pass(&b, GRACE);
    let c = step(&b);
    assert_eq!(c.recycled, 2, "{c:?}");
    assert_eq!(c.in_use, reserved + 2, "x3 and y2 stay");
    assert_eq!(read_value(&b, &r1, &stats), b"y2");
}

/// Wipes node `node`'s copy of every log buffer, as a write landing late in a
/// recycled slot would overwrite one (see `swarm_core::slot_recycling`).
fn wipe_logs(cluster: &MemCluster, node: u16) {
    let layout = layout();
    let wipe = swarm_core::Batch::write(layout.log_base(), vec![0; layout.log_bytes() as usize]);
    let fabric = cluster.client();
    let ticket = fabric.post(swarm_core::NodeId(node), wipe);
    block_on_future(&fabric, core::future::poll_fn(|_| fabric.poll(ticket)))
        .unwrap()
        .unwrap();
}

/// `reg(0)` with the replicas ranked from node `first`: a reader's preferred
/// majority and primary.
fn ranked_from(first: u64) -> RegisterLoc {
    RegisterLoc::at(reg(0).id, Replicas::all(3, first).unwrap())
}

fn read_value(c: &Client<MemFabric, FixedClock>, r: &RegisterLoc, stats: &OpStats) -> Vec<u8> {
    match block_on(c.fabric(), c.read(r, &mut RegisterCache::new(), stats)) {
        Ok(swarm_core::ReadValue::Value(v)) => v,
        other => panic!("a majority holds the write and one copy is intact: {other:?}"),
    }
}

#[test]
fn a_holder_whose_copy_was_overwritten_is_passed_over_for_one_that_holds_the_write() {
    let cluster = MemCluster::new(3, 1 << 20);
    let writer = client(&cluster, 0);
    // The write lands on the writer's preferred majority, nodes 0 and 1.
    write(&writer, &reg(0), b"value");
    wipe_logs(&cluster, 1);
    // A reader ranking node 1 first reads nodes 1 and 2: only node 1 holds the write,
    // and its copy is gone. The reader has no in-place copy on node 1 (the writer's
    // primary is node 0), so it must find node 0's copy by asking every replica.
    let reader = client(&cluster, 1);
    let stats = OpStats::new();
    assert_eq!(read_value(&reader, &ranked_from(1), &stats), b"value");
    assert_eq!(stats.recycled_fetches(), 1, "one re-read, of every replica");
    // That read wrote the value back to node 2 (buffer and metadata; the in-place
    // copy only to its primary, node 1). Now node 2's copy is wiped: a reader ranking
    // node 2 first reads nodes 2 and 0, both hold the write, and the value fetch
    // passes over node 2's copy for node 0's without reading the register again.
    wipe_logs(&cluster, 2);
    let stats = OpStats::new();
    assert_eq!(read_value(&reader, &ranked_from(2), &stats), b"value");
    assert_eq!(stats.recycled_fetches(), 0, "found in the same fetch");
}

/// A write that needs two slots (a KV insert of a present key writes its fresh
/// register, then the key's) waits, before its deadline is armed, until two are free
/// (`Client::make_room_for`). Here the full log holds one slot in limbo and two
/// whose values another writer superseded, unknown to this one until a check: once
/// the limbo slot came back, the wait must learn of the others rather than return
/// with one free slot. It did return (a 32-node `swarm bench` resuming a nearly full
/// log): the insert then found the log full at its second write, with the next slot
/// back only after its deadline, and failed with `Fenced`.
#[test]
fn room_for_two_writes_is_made_past_the_first_slot_that_comes_back() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = client(&cluster, 1);
    let b = client(&cluster, 2);
    let slots = layout().slots_per_writer();
    write(&a, &reg(0), b"x1");
    write(&a, &reg(0), b"x2"); // x1's slot goes into limbo
    let mut i = 1;
    while a.slots_in_use() < slots {
        write(&a, &reg(i), b"y");
        i += 1;
    }
    let c = a.slot_counters();
    assert_eq!(
        (c.in_use, c.in_limbo),
        (slots, 1),
        "full, one slot in limbo"
    );
    // Another writer supersedes two of a's values: only a check tells a.
    write(&b, &reg(1), b"z");
    write(&b, &reg(2), b"z");
    assert!(block_on_future(a.fabric(), a.make_room_for(2)).unwrap());
    assert!(
        a.slots_in_use() + 2 <= slots,
        "room for two writes: {:?}",
        a.slot_counters()
    );
    // Both writes go through without waiting inside an operation.
    write(&a, &reg(20), b"w1");
    write(&a, &reg(21), b"w2");
}
