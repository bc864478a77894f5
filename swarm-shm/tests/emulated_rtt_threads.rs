//! Regression test: a roundtrip through `ShmCluster::client_with` (an emulated
//! roundtrip time) never reports a deadline missed while its completions are due,
//! even when client threads outnumber cores. `Roundtrip::wait_until` read the clock
//! after collecting: a thread preempted between the two found the deadline passed
//! with completions due long ago still uncollected, and FUSEE's clients took that for
//! failed memory nodes (SWARM-KV for slow ones).

use std::sync::Arc;

use swarm_core::header::HEADER_SIZE;
use swarm_core::{
    Batch, Fabric, NodeId, OpStats, Roundtrip, WaitOutcome, block_on_future, post_background,
};
use swarm_shm::{ScratchDir, ShmCluster};

#[test]
fn every_roundtrip_completes_with_more_threads_than_cores() {
    let dir = ScratchDir::new("emulated-rtt-threads").unwrap();
    let cluster = Arc::new(ShmCluster::create(dir.path(), 3, 1 << 20).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let cluster = cluster.clone();
            std::thread::spawn(move || {
                let f = cluster.client_with(1500);
                let mut short = 0;
                for i in 0..5_000u64 {
                    let stats = OpStats::new();
                    let outcome = block_on_future(&f, async {
                        let mut rt = Roundtrip::start(&f, &stats);
                        for n in 0..3 {
                            rt.post(NodeId(n), Batch::cas(HEADER_SIZE + 8 * t, i, i + 1))
                                .expect("three posts fit");
                        }
                        if i % 3 == 0 {
                            post_background(
                                &f,
                                NodeId(1),
                                Batch::write(HEADER_SIZE + 512, vec![1; 8]),
                            );
                        }
                        // Completions are collected before the deadline is checked, so a
                        // thread descheduled past it still sees them: only a completion
                        // that never arrives makes the wait short.
                        let deadline = f.now() + 10_000_000;
                        rt.wait_until(3, deadline).await
                    })
                    .expect("no stall");
                    short += u32::from(outcome == WaitOutcome::Short);
                }
                short
            })
        })
        .collect();
    let short: u32 = threads.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(short, 0, "roundtrips whose completions never arrived");
}
