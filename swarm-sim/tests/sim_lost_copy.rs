//! A wait-freedom defect found by `sim_recycling`'s
//! `reads_find_an_intact_copy_when_one_node_lost_its_records` (seed 2718334, about one
//! seed in 200): a read failed with `Corrupted` although a majority of replicas was
//! correct, because the maximum it saw was a write whose only copy was lost.
//!
//! Schedule: writer W writes `a` (on n0 and n1, in place on n0). W's links to n0 and
//! n2 then become 1000 times slower, and W writes `b`: its batch lands on n1 at
//! once, on the others a millisecond later. Node n1's copies of W's records are then
//! overwritten (the simulator's `Faults::wiped_copies`), so `b`'s metadata word on n1
//! points at a buffer that fails validation, and `b` is on no other replica yet.
//! Reader R reads in between: its majority read sees `b` on n1 only, and the value
//! fetch finds n1's copy unusable. R used to read every replica again
//! `SUPERSEDED_RETRIES` times, seeing the same `b` each time (nobody rewrites that
//! buffer), and report `Corrupted`. A re-read now leaves out n1's reply of `b`: n0
//! and n2 are a majority, whose maximum `a` R returns, before `b`'s write, which has
//! not completed (`swarm_core`'s `maxreg` module docs, "Lost copies").

use std::cell::Cell;
use std::rc::Rc;

use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Batch, Op};
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::{Layout, SLOT_LOCK_BYTES};
use swarm_core::{
    Client, Fabric, NodeId, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc,
    Replicas,
};
use swarm_sim::{Fault, Latency, SimClock, SimConfig, SimRunner, SimWorld};

#[test]
fn a_read_leaves_out_a_replica_whose_only_copy_of_the_maximum_was_lost() {
    let shape = |log_base| {
        Layout::builder()
            .payload_max(32)
            .meta_words(2)
            .log_base(log_base)
            .writers(2)
            .slots_per_writer(8)
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
    let (writer, reader) = (Rc::new(client(0)), Rc::new(client(1)));
    let writer_id = writer.fabric().id();
    let reader_id = reader.fabric().id();
    // When W's write of `b` returned, in virtual time.
    let b_written = Rc::new(Cell::new(None));
    {
        let (writer, reg, b_written) = (writer.clone(), reg.clone(), b_written.clone());
        runner.spawn(writer_id, async move {
            let mut cache = RegisterCache::default();
            let a = writer.write(&reg, &mut cache, &OpStats::new(), b"a").await;
            a.expect("a fault-free write");
            writer.fabric().sleep(100_000 - writer.fabric().now()).await;
            let b = writer.write(&reg, &mut cache, &OpStats::new(), b"b").await;
            b.expect("a slow write");
            b_written.set(Some(writer.fabric().now()));
        });
    }
    for node in [0, 2] {
        runner.at(50_000, Fault::SlowLink(writer_id, NodeId(node), 1_000));
    }
    // At 120 µs, W's batch to n1 has landed; its others land after 1 ms. Overwrite the
    // record header of each of W's log slots on n1, as `Faults::wiped_copies` does.
    let wiper = world.client();
    runner.spawn_at(120_000, wiper.id(), async move {
        let writer = WriterId::new(0).expect("valid writer");
        let mut batch = Batch::new();
        for slot in 0..layout.slots_per_writer() {
            let addr = layout.slot_addr(writer, slot).expect("a slot of the log");
            batch
                .push(Op::Write {
                    addr: addr + u64::from(SLOT_LOCK_BYTES),
                    data: vec![0; 16].into(),
                })
                .expect("room in the batch");
        }
        let ticket = wiper.post(NodeId(1), batch);
        wiper.forget(ticket);
    });
    let early = {
        let (reader, reg) = (reader.clone(), reg.clone());
        runner.spawn_at(150_000, reader_id, async move {
            let mut cache = RegisterCache::default();
            let stats = OpStats::new();
            let value = reader.read(&reg, &mut cache, &stats).await;
            (value, reader.fabric().now(), stats.recycled_fetches())
        })
    };
    let late = runner.spawn_at(5_000_000, reader_id, async move {
        let mut cache = RegisterCache::default();
        reader.read(&reg, &mut cache, &OpStats::new()).await
    });
    runner.time_limit(100_000_000);
    runner.run().expect("a majority answers every request");
    let (value, returned, met) = early.take().expect("the early read finished");
    let b_written = b_written.get().expect("the write of b finished");
    assert!(
        returned < b_written,
        "the early read ({returned} ns) must overlap the write of b ({b_written} ns)"
    );
    assert!(met > 0, "the early read did not meet the lost copy");
    assert_eq!(
        value.expect("a read must not fail while a majority is correct"),
        ReadValue::Value(b"a".to_vec()),
        "the write of b has not completed: the read returns a"
    );
    assert_eq!(
        late.take()
            .expect("the late read finished")
            .expect("no error"),
        ReadValue::Value(b"b".to_vec()),
        "b completed on n0 and n2, whose copies are intact"
    );
}
