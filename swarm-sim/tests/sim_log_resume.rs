//! Resuming a writer id's log (`swarm_core::resume`) on the simulated
//! fabric: a write the earlier incarnation abandoned after it reached one node only
//! must still be found when that node is slower than the others, or the next
//! incarnation reuses its timestamp range and its slot (issue 10, "scan_log reads
//! only a majority").
//!
//! The abandoned write is planted directly in node memory (its record in the
//! writer's log and its tuple in a register's metadata word, on n0 only), exactly
//! what an operation that stopped after its first batch leaves behind; a reader whose
//! majority includes n0 would see it as the register's maximum.

use swarm_core::encoding::{Flag, Timestamp, Tsp, WriterId};
use swarm_core::layout::{Layout, encode_record};
use swarm_core::resume::{LogScan, scan_log};
use swarm_core::{
    Client, NodeId, OpStats, ProtocolConfig, RegisterCache, RegisterLoc, Replicas, block_on,
};
use swarm_sim::{SimClock, SimConfig, SimWorld, for_each_seed};

const N0: NodeId = NodeId(0);
/// The register the abandoned write and the resumed client write.
const REGISTER_AT: u64 = 4096;
/// How long the scan waits for a node beyond the majority.
const STRAGGLER_NS: u64 = 1_000_000;
/// Ticks of the abandoned write: far above what the simulated clock reads, so that a
/// resumed client that missed it would guess timestamps below it.
const ABANDONED_TICKS: u64 = 1 << 40;

fn layout() -> Layout {
    Layout::builder()
        .payload_max(32)
        .meta_words(2)
        .log_base(64 << 10)
        .writers(4)
        .slots_per_writer(64)
        .build()
        .expect("a valid layout")
}

/// Plants, on `node` only, a GUESSED write of writer `w` at `ticks`: its record in
/// its log slot and its tuple in `w`'s metadata word of the register.
fn plant_abandoned_write(world: &SimWorld, layout: &Layout, node: NodeId, w: WriterId, ticks: u64) {
    let ts = Timestamp::new(ticks, w).expect("ticks below the horizon");
    let tsp = Tsp::new(ts, Flag::Guessed);
    let buffer = layout.buffer_addr(ts).expect("w has a log");
    world
        .poke(node, buffer + 8, &encode_record(tsp, b"abandoned"))
        .expect("in bounds");
    world
        .poke(
            node,
            layout.meta_word_addr(REGISTER_AT, w),
            &tsp.word().to_le_bytes(),
        )
        .expect("in bounds");
}

fn scan(world: &SimWorld, layout: &Layout, w: WriterId) -> LogScan {
    let fabric = world.client();
    let stats = OpStats::new();
    block_on(&fabric, scan_log(&fabric, &stats, layout, w, STRAGGLER_NS))
        .expect("a majority answers")
}

#[test]
fn a_record_on_a_slow_minority_is_found_and_never_reused() {
    let layout = layout();
    let w = WriterId::new(1).expect("a writer id");
    for_each_seed(20, |seed| {
        // n0 answers about twenty times later than n1 and n2, well within the
        // straggler deadline: a scan that stopped at a majority would miss it.
        let world = SimWorld::new(seed, SimConfig::new(3, 1 << 20).slow(N0, 20));
        plant_abandoned_write(&world, &layout, N0, w, ABANDONED_TICKS);
        let abandoned = Timestamp::new(ABANDONED_TICKS, w).expect("valid");
        let scan = scan(&world, &layout, w);
        assert_eq!(
            scan.used_slots,
            [layout.slot_of(abandoned)],
            "seed {seed}: the abandoned record's slot"
        );
        assert_eq!(scan.last_ticks, ABANDONED_TICKS, "seed {seed}");

        // The next incarnation resumes and writes the same register: its timestamp
        // is above the abandoned one and its buffer elsewhere, so the abandoned
        // write's record, which readers of n0 may still need, is intact.
        let client = Client::new(
            world.client(),
            SimClock::new(&world, 1_000),
            layout,
            w,
            ProtocolConfig::default(),
        )
        .expect("a client");
        client.resume(scan.used_slots.iter().copied(), scan.last_ticks);
        let reg = RegisterLoc::at(REGISTER_AT, Replicas::all(3, 0).expect("three replicas"));
        let mut cache = RegisterCache::new();
        let stats = OpStats::new();
        block_on(
            client.fabric(),
            client.write(&reg, &mut cache, &stats, b"resumed"),
        )
        .expect("the write succeeds");
        world.drain();
        let meta = world
            .peek(NodeId(1), layout.meta_word_addr(REGISTER_AT, w), 8)
            .expect("in bounds");
        let written = Tsp::from_word(u64::from_le_bytes(meta.try_into().expect("8 bytes")));
        assert!(
            written.ts().ticks() > ABANDONED_TICKS,
            "seed {seed}: the resumed write used {written}, not above the abandoned one"
        );
        let record = world
            .peek(
                N0,
                layout.buffer_addr(abandoned).expect("w has a log") + 8,
                64,
            )
            .expect("in bounds");
        let planted = encode_record(Tsp::new(abandoned, Flag::Guessed), b"abandoned");
        assert_eq!(
            &record[..planted.len()],
            &planted[..],
            "seed {seed}: the abandoned write's buffer was overwritten"
        );
    });
}

#[test]
fn a_crashed_node_delays_the_scan_by_one_deadline_and_a_majority_suffices() {
    let layout = layout();
    let w = WriterId::new(2).expect("a writer id");
    for_each_seed(10, |seed| {
        let world = SimWorld::new(seed, SimConfig::new(3, 1 << 20));
        plant_abandoned_write(&world, &layout, NodeId(1), w, 500);
        world.crash(N0);
        let start = world.now();
        let scan = scan(&world, &layout, w);
        assert_eq!(scan.last_ticks, 500, "seed {seed}");
        assert_eq!(scan.used_slots.len(), 1, "seed {seed}");
        // The scan ended by giving up on n0, which takes its deadline (virtual time:
        // a property of the schedule, not of the machine running the test).
        assert!(
            world.now() - start >= STRAGGLER_NS,
            "seed {seed}: the scan returned before n0's deadline"
        );
    });
}

/// The claim a bounded resume rests on (`swarm_core::resume` module docs, "Towards a
/// bounded scan"): every slot an incarnation wrote is among
/// `slots_of_ticks(first..=last)` of its tick range, allocator bumps included, so a
/// scan of those slots finds what a whole-log scan finds, reading far fewer bytes.
#[test]
fn an_incarnations_writes_lie_in_the_slots_of_its_tick_range() {
    let layout = Layout::builder()
        .payload_max(32)
        .meta_words(2)
        .log_base(64 << 10)
        .writers(4)
        .slots_per_writer(16384)
        .build()
        .expect("a valid layout");
    let w = WriterId::new(3).expect("a writer id");
    for_each_seed(10, |seed| {
        let world = SimWorld::new(seed, SimConfig::new(3, 8 << 20));
        let client = Client::new(
            world.client(),
            SimClock::new(&world, 1_000),
            layout,
            w,
            ProtocolConfig::default(),
        )
        .expect("a client");
        let mut cache = RegisterCache::new();
        let mut ticks = Vec::new();
        for (i, addr) in [REGISTER_AT, REGISTER_AT + 512, REGISTER_AT + 1024]
            .into_iter()
            .cycle()
            .take(12)
            .enumerate()
        {
            let reg = RegisterLoc::at(addr, Replicas::all(3, 0).expect("three replicas"));
            let stats = OpStats::new();
            let value = format!("value {i}");
            block_on(
                client.fabric(),
                client.write(&reg, &mut cache, &stats, value.as_bytes()),
            )
            .expect("the write succeeds");
            world.drain();
            let meta = world
                .peek(NodeId(1), layout.meta_word_addr(addr, w), 8)
                .expect("in bounds");
            let written = Tsp::from_word(u64::from_le_bytes(meta.try_into().expect("8 bytes")));
            ticks.push(written.ts().ticks());
        }
        let (first, last) = (
            *ticks.iter().min().expect("writes"),
            *ticks.iter().max().expect("writes"),
        );
        let ranges = swarm_core::resume::slots_of_ticks(&layout, w, first..=last);
        let slots: u32 = ranges.iter().map(|r| r.end - r.start).sum();
        assert!(
            slots < layout.slots_per_writer() / 8,
            "seed {seed}: the writes spanned ticks {first}..={last}, too many for a bound"
        );
        let whole = scan(&world, &layout, w);
        let fabric = world.client();
        let stats = OpStats::new();
        let bounded = block_on(
            &fabric,
            swarm_core::resume::scan_slots(&fabric, &stats, &layout, w, &ranges, STRAGGLER_NS),
        )
        .expect("a majority answers");
        assert!(!whole.used_slots.is_empty(), "seed {seed}");
        assert_eq!(
            bounded, whole,
            "seed {seed}: ticks {first}..={last}, {ranges:?}"
        );
    });
}
