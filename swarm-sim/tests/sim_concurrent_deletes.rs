//! Two concurrent deletes of a present key must not both report that they removed it
//! (SWARM-KV §5.3.2; `swarm_core::protocol::delete`). Found by the randomized
//! key-value scenarios (`sim_protocol::deletes_and_reinserts_mixed_with_writes_stay_linearizable`)
//! when deletes decided their outcome from their pipelined read alone.
//!
//! Schedule, fixed latencies, no fault: writer 0 writes `x`; then writers 1 and 2
//! delete at the same instant. Both batches reach each node together, so both
//! pipelined reads run before either tombstone CAS and see no tombstone: only the
//! CAS of the delete word tells the two apart. The first batch to run on each node
//! wins that node, and with equal latencies that is the same delete everywhere: one
//! delete reports Removed and the other Absent, and the history is linearizable.

use std::cell::RefCell;
use std::rc::Rc;

use swarm_checker::{self as checker, History, OpKind, Operation};
use swarm_core::encoding::WriterId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Client, DeleteOutcome, OpStats, ProtocolConfig, RegisterCache, RegisterLoc, Replicas,
    WriteOutcome,
};
use swarm_sim::{Latency, SimClock, SimConfig, SimRunner, SimWorld};

#[test]
fn two_concurrent_deletes_cannot_both_remove_the_key() {
    let shape = |log_base| {
        Layout::builder()
            .payload_max(32)
            .meta_words(2)
            .log_base(log_base)
            .writers(3)
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
    let history = Rc::new(RefCell::new(Vec::new()));
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    for writer in 0..3u16 {
        let fabric = world.client();
        let id = fabric.id();
        let clock = SimClock::new(&world, 100);
        let writer_id = WriterId::new(u32::from(writer)).expect("valid writer");
        let client = Client::new(fabric, clock, layout, writer_id, ProtocolConfig::default())
            .expect("client");
        let (history, reg, world) = (history.clone(), reg.clone(), world.clone());
        let outcomes = outcomes.clone();
        // Writer 0 inserts at 0; writers 1 and 2 delete together once it is done.
        let start = if writer == 0 { 0 } else { 50_000 };
        runner.spawn_at(start, id, async move {
            let (mut cache, stats) = (RegisterCache::default(), OpStats::new());
            let begin = world.now();
            let op = if writer == 0 {
                let outcome = client.write(&reg, &mut cache, &stats, b"x").await;
                assert_eq!(outcome.expect("write"), WriteOutcome::Written);
                Operation::completed(0, OpKind::Insert, "k", Some("x"), true, begin, world.now())
            } else {
                let outcome = client.delete(&reg, &mut cache, &stats).await;
                let outcome = outcome.expect("delete");
                outcomes.borrow_mut().push(outcome);
                let removed = outcome == DeleteOutcome::Removed;
                let client_id = u64::from(writer);
                Operation::completed(
                    client_id,
                    OpKind::Delete,
                    "k",
                    None,
                    removed,
                    begin,
                    world.now(),
                )
            };
            history.borrow_mut().push(op);
        });
    }
    runner.run().expect("no fault: nothing stalls");
    let mut checked = History::new();
    for op in history.borrow().iter() {
        checked.push(op.clone()).expect("well-formed operation");
    }
    let report = checker::check(&checked);
    assert!(
        report.is_linearizable(),
        "two concurrent deletes both removed the key:\n{report}"
    );
    let mut outcomes = outcomes.borrow().clone();
    outcomes.sort_by_key(|o| *o as u8);
    assert_eq!(
        outcomes,
        [DeleteOutcome::Removed, DeleteOutcome::Absent],
        "one delete came first on every node"
    );
}
