//! A liveness defect found by the randomized scenarios with slow client-node links
//! (`Faults::slow_links`): a read whose roundtrips to the replicas holding the value
//! all take longer than `slow_after_ns` never returned, although a majority was alive
//! and answered every request.
//!
//! Schedule: writer W writes `x` (VERIFIED, in place on n0); n0 crashes; reader R,
//! whose links to n1 and n2 are 30 times slower (60 µs roundtrips, above the
//! 10 µs `slow_after_ns`), reads. n1 has no in-place copy (in-place data lives on
//! the primary only, §6), so the read fetches `x`'s out-of-place buffer;
//! `fetch_value` gave up when no holder answered within `slow_after_ns` and
//! `max_read` read the metadata again, forever: every retry had the same deadline, so
//! the simulation hit its time limit (a livelock). `max_read` now doubles the fetch's
//! patience on every retry.

use swarm_core::encoding::WriterId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Client, NodeId, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas,
};
use swarm_sim::{Fault, Latency, SimClock, SimConfig, SimRunner, SimWorld};

#[test]
fn a_read_over_slow_links_returns_while_a_majority_answers() {
    let shape = |log_base| {
        Layout::builder()
            .payload_max(32)
            .meta_words(2)
            .log_base(log_base)
            .writers(2)
            .slots_per_writer(64)
            .build()
    };
    let register_bytes = shape(0).expect("valid layout").register_bytes();
    let layout = shape((HEADER_SIZE + register_bytes).next_multiple_of(4096)).expect("valid");
    let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
    let config = SimConfig::new(3, node_bytes).latency(Latency::new(1_000, 0));
    let world = SimWorld::new(1, config);
    let mut runner = SimRunner::new(&world);
    let reg = RegisterLoc::at(HEADER_SIZE, Replicas::all(3, 0).expect("three replicas"));
    let protocol = ProtocolConfig::default()
        .with_slow_after_ns(10_000)
        .with_suspect_ns(1_000_000);
    let client = |writer: u32| {
        let fabric = world.client();
        let clock = SimClock::new(&world, 100);
        let writer = WriterId::new(writer).expect("valid writer");
        Client::new(fabric, clock, layout, writer, protocol).expect("client")
    };
    let (writer, reader) = (client(0), client(1));
    let reader_id = reader.fabric().id();
    let write_reg = reg.clone();
    runner.spawn(writer.fabric().id(), async move {
        let mut cache = RegisterCache::default();
        let stats = OpStats::new();
        let outcome = writer.write(&write_reg, &mut cache, &stats, b"x").await;
        outcome.expect("a fault-free write");
    });
    runner.at(50_000, Fault::Crash(NodeId(0)));
    for node in [1, 2] {
        runner.at(50_000, Fault::SlowLink(reader_id, NodeId(node), 30));
    }
    let read = runner.spawn_at(100_000, reader_id, async move {
        let mut cache = RegisterCache::default();
        reader.read(&reg, &mut cache, &OpStats::new()).await
    });
    runner.time_limit(100_000_000);
    runner
        .run()
        .expect("a majority answers every request: the read must return");
    let value = read.take().expect("the read finished");
    assert_eq!(value.expect("no error"), ReadValue::Value(b"x".to_vec()));
}
