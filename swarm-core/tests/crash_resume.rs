//! Resuming the log of a writer id whose previous holder crashed, without reading
//! the log first (`swarm_core::resume`, "Crash resume"): every slot carried, the
//! examination frees the never-written ones and tracks the written ones, a full log
//! examines only until a slot can come back, and timestamps start above the tick
//! ceiling the crashed holder persisted.

mod support;

use support::{GRACE, pass, reg, write};
use swarm_core::encoding::{Flag, LockMode, LockWord, Timestamp, Tsp, WriterId};
use swarm_core::layout::{Layout, encode_record_for};
use swarm_core::{
    Batch, Client, Fabric, FixedClock, MemCluster, MemFabric, NodeId, OpStats, RegisterCache,
    RegisterLoc, block_on, block_on_future,
};

/// Where writer 1 keeps its tick ceiling (below the logs, above the registers).
const CEILING_AT: u64 = 60 << 10;

fn layout(slots: u32) -> Layout {
    Layout::builder()
        .payload_max(16)
        .meta_words(2)
        .log_base(64 << 10)
        .writers(4)
        .slots_per_writer(slots)
        .build()
        .unwrap()
}

fn client(cluster: &MemCluster, layout: Layout, clock: u64) -> Client<MemFabric, FixedClock> {
    support::client(cluster, layout, 1, clock)
}

fn locate(addr: u64) -> Option<RegisterLoc> {
    (0..40).map(reg).find(|r| r.id == addr)
}

fn read_value(c: &Client<MemFabric, FixedClock>, r: &RegisterLoc) -> Vec<u8> {
    let stats = OpStats::new();
    match block_on(c.fabric(), c.read(r, &mut RegisterCache::new(), &stats)) {
        Ok(swarm_core::ReadValue::Value(v)) => v,
        other => panic!("{other:?}"),
    }
}

fn step(c: &Client<MemFabric, FixedClock>) -> swarm_core::slot_recycling::SlotCounters {
    support::step(c, 64)
}

/// Runs one request to one node to its end.
fn run(fabric: &MemFabric, node: u16, batch: Batch) -> swarm_core::fabric::Completion {
    let ticket = fabric.post(NodeId(node), batch);
    block_on_future(fabric, core::future::poll_fn(|_| fabric.poll(ticket)))
        .unwrap()
        .unwrap()
}

/// The ceiling word as each node holds it.
fn ceilings(cluster: &MemCluster) -> Vec<u64> {
    let fabric = cluster.client();
    (0..3)
        .map(|node| {
            let mut c = run(&fabric, node, Batch::read(CEILING_AT, 8));
            let bytes = c.take_read(0).unwrap();
            u64::from_le_bytes(bytes[..8].try_into().unwrap())
        })
        .collect()
}

/// The largest ceiling held by a majority (here: the second largest of three).
fn ceiling_on_majority(cluster: &MemCluster) -> u64 {
    let mut words = ceilings(cluster);
    words.sort_unstable();
    words[1]
}

/// A crashed holder wrote three values; its successor starts from a full, carried
/// log, reads one examination step to make room (not the log), writes at once, and
/// gives back the never-written slots as it examines them.
#[test]
fn a_crash_resume_makes_room_in_one_step_and_frees_never_written_slots() {
    let layout = layout(4096);
    let cluster = MemCluster::new(3, 4 << 20);
    let last = {
        let a = client(&cluster, layout, 100);
        a.set_tick_ceiling(CEILING_AT, 0, 10);
        write(&a, &reg(0), b"x1");
        write(&a, &reg(1), b"y1");
        write(&a, &reg(0), b"x2");
        a.log_summary().last_ticks
        // Dropped without a summary: a crash.
    };
    assert!(
        ceiling_on_majority(&cluster) >= last,
        "no timestamp is used before a majority holds a ceiling above it"
    );
    let b = client(&cluster, layout, 100);
    let held = ceilings(&cluster).into_iter().max().unwrap();
    b.set_tick_ceiling(CEILING_AT, held, 10);
    b.resume_crashed(held, locate);
    let slots = layout.slots_per_writer();
    assert_eq!(b.slots_in_use(), slots, "every slot carried");
    assert_eq!(
        b.carried_remaining(),
        slots as usize - 1,
        "but the tombstone's"
    );
    assert!(block_on_future(b.fabric(), b.make_room()).unwrap());
    // `carried.rs`: 64 KiB per examination step.
    let per_step = ((64 << 10) / layout.slot_bytes()) as usize;
    let examined = slots as usize - 1 - b.carried_remaining();
    assert!(
        examined <= per_step,
        "room is made by one step ({per_step} slots), not the log: {examined} examined"
    );
    assert!(b.slots_in_use() < slots);
    write(&b, &reg(2), b"z1");
    assert_eq!(read_value(&b, &reg(0)), b"x2");
    assert_eq!(read_value(&b, &reg(1)), b"y1");

    // The background examination goes through the rest: the three written slots
    // (and b's own) stay until proven superseded, every other slot comes back.
    for _ in 0..10_000 {
        if b.carried_remaining() == 0 {
            break;
        }
        b.examine_carried_tick(b.fabric().now());
        b.fabric().progress();
    }
    assert_eq!(b.carried_remaining(), 0);
    let c = b.slot_counters();
    assert_eq!(c.tracked_registers, 3, "r0, r1 (a's) and r2 (b's)");
    // Tombstone, x1, y1, x2, z1.
    assert_eq!(c.in_use, 5, "{c:?}");
    // x1 is superseded by x2 on a majority: recycled after the grace; x2 and y1,
    // the registers' current values, are not.
    step(&b);
    pass(&b, GRACE);
    let c = step(&b);
    assert_eq!((c.in_use, c.recycled), (4, 1), "{c:?}");
    assert_eq!(read_value(&b, &reg(0)), b"x2");
    assert_eq!(read_value(&b, &reg(1)), b"y1");
}

/// A small log that the successor fills: the slots of the crashed holder's current
/// values are never handed out, whatever the successor writes.
#[test]
fn a_crash_resume_never_frees_a_slot_holding_a_current_value() {
    let layout = layout(16);
    let cluster = MemCluster::new(3, 4 << 20);
    {
        let a = client(&cluster, layout, 100);
        a.set_tick_ceiling(CEILING_AT, 0, 10);
        write(&a, &reg(0), b"x1");
        write(&a, &reg(1), b"y1");
        write(&a, &reg(0), b"x2");
    }
    let b = client(&cluster, layout, 100);
    let held = ceilings(&cluster).into_iter().max().unwrap();
    b.set_tick_ceiling(CEILING_AT, held, 10);
    b.resume_crashed(held, locate);
    assert!(block_on_future(b.fabric(), b.make_room()).unwrap());
    // Tombstone, x2 and y1 stay; x1 and the 12 never-written slots come back (x1
    // after its grace): 13 writes to 13 other registers fit, each a current value.
    for i in 0..13 {
        let stats = OpStats::new();
        let r = reg(10 + i);
        let v = [b'a' + i as u8];
        // A full log waits for the grace of x1 (the in-process clock advances as
        // the write polls).
        block_on(
            b.fabric(),
            b.write(&r, &mut RegisterCache::new(), &stats, &v),
        )
        .unwrap();
        b.recycle_slots_tick(64);
    }
    assert_eq!(read_value(&b, &reg(0)), b"x2");
    assert_eq!(read_value(&b, &reg(1)), b"y1");
    for i in 0..13 {
        assert_eq!(read_value(&b, &reg(10 + i)), [b'a' + i as u8]);
    }
}

/// Timestamps of the successor lie above the persisted ceiling, and above every
/// tick found in an examined slot before that slot is reused, even when the caller
/// resumes below it (a ceiling lower than what the log holds): the per-slot raise.
#[test]
fn a_crash_resumed_writer_times_above_every_tick_it_examined() {
    let layout = layout(16);
    let cluster = MemCluster::new(3, 4 << 20);
    let w = WriterId::new(1).unwrap();
    // A record far ahead of the clock in one slot, a lock word further ahead in
    // another, on one node each (what an abandoned write and a reader leave).
    let fabric = cluster.client();
    let rec = Timestamp::new(5_000, w).unwrap();
    run(
        &fabric,
        0,
        Batch::write(
            layout.buffer_addr(rec).unwrap() + 8,
            encode_record_for(Tsp::new(rec, Flag::Guessed), Some(reg(0).id), b"old"),
        ),
    );
    let locked = Timestamp::new(7_000, w).unwrap();
    run(
        &fabric,
        2,
        Batch::write(
            layout.buffer_addr(locked).unwrap(),
            LockWord::new(locked, LockMode::Read)
                .word()
                .to_le_bytes()
                .to_vec(),
        ),
    );
    let b = client(&cluster, layout, 100);
    b.resume_crashed(0, locate);
    assert!(block_on_future(b.fabric(), b.make_room()).unwrap());
    write(&b, &reg(3), b"new");
    let last = b.log_summary().last_ticks;
    assert!(
        last > 7_000,
        "a write after the examination reuses no tick it found: {last}"
    );
}

/// The ceiling a crashed holder leaves covers every timestamp it used, however far
/// its guesses ran ahead of the clock: its successor, resumed above the ceiling,
/// writes above all of them at once, before examining the slot that holds one.
#[test]
fn the_ceiling_covers_every_timestamp_before_it_is_used() {
    let layout = layout(4096);
    let cluster = MemCluster::new(3, 4 << 20);
    let last = {
        // A clock far ahead: every write needs a raise.
        let a = client(&cluster, layout, 1 << 30);
        a.set_tick_ceiling(CEILING_AT, 0, 1);
        for i in 0..5 {
            write(&a, &reg(i), b"ahead");
            assert!(a.tick_ceiling().unwrap() >= a.log_summary().last_ticks);
        }
        a.log_summary().last_ticks
    };
    let held = ceilings(&cluster).into_iter().max().unwrap();
    assert!(ceiling_on_majority(&cluster) >= last);
    let b = client(&cluster, layout, 100);
    b.set_tick_ceiling(CEILING_AT, held, 1);
    b.resume_crashed(held, locate);
    assert!(block_on_future(b.fabric(), b.make_room()).unwrap());
    assert!(b.carried_remaining() > 0, "not everything examined");
    write(&b, &reg(0), b"mine");
    assert!(b.log_summary().last_ticks > last);
    assert_eq!(read_value(&b, &reg(0)), b"mine");
    // Another writer's read of a register the crashed holder wrote still sees it.
    assert_eq!(read_value(&b, &reg(4)), b"ahead");
}
