//! A write's first round on a fabric that completes batches inside `submit`
//! (`Client::write_round_now`) when a replica of its preferred majority does not
//! answer inside its post: the round goes on on the general path with the replicas
//! that did not answer, and the write completes and is read back.

use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Crash, FailNodes};
use swarm_core::layout::Layout;
use swarm_core::{
    Client, FixedClock, MemCluster, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc,
    Replicas, WriteOutcome, block_on_future,
};

fn client(
    cluster: &MemCluster,
    writer: u32,
) -> Client<FailNodes<swarm_core::MemFabric>, FixedClock> {
    let layout = Layout::builder()
        .payload_max(64)
        .meta_words(8)
        .log_base(1 << 16)
        .writers(4)
        .slots_per_writer(64)
        .build()
        .unwrap();
    Client::new(
        FailNodes::new(cluster.client()),
        FixedClock(1_000 + u64::from(writer)),
        layout,
        WriterId::new(writer).unwrap(),
        ProtocolConfig::default().with_slow_after_ns(1_000),
    )
    .unwrap()
}

#[test]
fn a_write_whose_preferred_replica_does_not_answer_completes_on_the_others() {
    let reg = RegisterLoc::at(4096, Replicas::all(3, 0).unwrap());
    // Each replica of the preferred majority (positions 0 and 1), each way of not
    // answering: a batch that never completes, or fails inside its post.
    for position in [0, 1] {
        for crash in [Crash::Silent, Crash::Erroring] {
            let what = format!("replica {position} crashed {crash:?}");
            let cluster = MemCluster::new(3, 1 << 20);
            let writer = client(&cluster, 1);
            let fabric = writer.fabric();
            fabric.fail_node_as(reg.replicas.node(position), crash);
            let mut cache = RegisterCache::new();
            for i in 0..3u8 {
                let stats = OpStats::new();
                let written =
                    block_on_future(fabric, writer.write(&reg, &mut cache, &stats, &[i; 40]));
                assert_eq!(written, Ok(Ok(WriteOutcome::Written)), "{what}, write {i}");
                assert!(
                    stats.roundtrips() <= 2,
                    "{what}, write {i}: {}",
                    stats.roundtrips()
                );
                // Another client, with every node answering, reads it back.
                let reader = client(&cluster, 2);
                let stats = OpStats::new();
                let read = block_on_future(
                    reader.fabric(),
                    reader.read(&reg, &mut RegisterCache::new(), &stats),
                );
                assert_eq!(
                    read,
                    Ok(Ok(ReadValue::Value(vec![i; 40]))),
                    "{what}, read {i}"
                );
            }
        }
    }
}
