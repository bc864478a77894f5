//! Faults of SWARM §2.2 in the simulated fabric: crashed minorities do not block a
//! majority, crashed majorities stall (or fail at the queue pair timeout), slow
//! nodes answer late, recovered nodes answer
//! with their memory, and crashed clients leave their posted work behind.

use std::task::Poll;

use swarm_core::fabric::{Completion, Fabric, FabricError, Ticket};
use swarm_core::{Batch, NodeId, OpStats, Roundtrip, WaitOutcome, block_on_future};
use swarm_sim::{
    Fault, Latency, SimConfig, SimError, SimFabric, SimRunner, SimWorld, TraceKind, for_each_seed,
};

/// Posts `batch` to every node of `nodes` and waits for `k` of them.
async fn quorum(
    fabric: &SimFabric,
    nodes: &[u16],
    k: usize,
    batch: Batch,
) -> Result<Vec<NodeId>, FabricError> {
    let stats = OpStats::new();
    let mut step = Roundtrip::start(fabric, &stats);
    for node in nodes {
        step.post(NodeId(*node), batch.clone())?;
    }
    step.wait(k).await?;
    Ok(step.replies().iter().map(|(node, _)| *node).collect())
}

fn complete(fabric: &SimFabric, ticket: Ticket) -> Result<Completion, FabricError> {
    loop {
        if let Poll::Ready(result) = fabric.poll(ticket) {
            return result;
        }
        assert!(
            fabric.progress(),
            "the world stalled before the ticket completed"
        );
    }
}

#[test]
fn a_majority_wait_completes_with_a_crashed_minority() {
    for_each_seed(30, |seed| {
        let world = SimWorld::new(seed, SimConfig::new(5, 4096));
        world.crash(NodeId(1));
        let mut runner = SimRunner::new(&world);
        let client = world.client();
        let write = runner.spawn(client.id(), async move {
            quorum(&client, &[0, 1, 2, 3, 4], 3, Batch::write(0, vec![5; 8])).await
        });
        // The second crash happens while the batches are in flight.
        runner.at(600, Fault::Crash(NodeId(3)));
        runner.run().expect("three of five nodes are alive");
        let replied = write.take().unwrap().unwrap();
        assert_eq!(replied.len(), 3);
        assert!(!replied.contains(&NodeId(1)) && !replied.contains(&NodeId(3)));
        let lost = world
            .trace()
            .events()
            .iter()
            .filter(|e| matches!(e.kind, TraceKind::Lost { .. }))
            .count();
        assert_eq!(lost, 2, "one batch lost to each crashed node");
    });
}

#[test]
fn a_majority_wait_stalls_with_a_crashed_majority() {
    // Without a queue pair timeout: a lost batch never completes.
    let config = SimConfig::default().qp_timeout(None);
    for_each_seed(10, |seed| {
        let world = SimWorld::new(seed, config.clone());
        let mut runner = SimRunner::new(&world);
        let client = world.client();
        let id = client.id();
        let _write = runner.spawn(id, async move {
            quorum(&client, &[0, 1, 2], 2, Batch::write(0, vec![5; 8])).await
        });
        runner.at(0, Fault::Crash(NodeId(0)));
        runner.at(0, Fault::Crash(NodeId(2)));
        match runner.run() {
            Err(SimError::Stalled {
                seed: s,
                tasks,
                clients,
                pending,
                crashed,
                ..
            }) => {
                assert_eq!((s, tasks), (seed, 1));
                assert_eq!(clients, vec![id]);
                assert_eq!(crashed, [NodeId(0), NodeId(2)]);
                let stuck: Vec<NodeId> = pending.iter().map(|at| at.node).collect();
                assert_eq!(stuck, crashed, "the batches lost to the crashes");
            }
            other => panic!("expected a stall, got {other:?}"),
        }
        // The single-client executor of the core sees the same stall.
        let client = world.client();
        let result = block_on_future(&client, quorum(&client, &[0, 1, 2], 2, Batch::read(0, 8)));
        assert_eq!(result, Err(FabricError::Stalled));
    });
}

/// With a queue pair timeout (the default), the batches lost to a crashed majority
/// fail that long after their post, as over RDMA, and the wait fails.
#[test]
fn a_majority_wait_fails_at_the_queue_pair_timeout_with_a_crashed_majority() {
    for_each_seed(10, |seed| {
        let world = SimWorld::with_seed(seed);
        world.crash(NodeId(0));
        world.crash(NodeId(2));
        let client = world.client();
        let start = world.now();
        let result = block_on_future(&client, quorum(&client, &[0, 1, 2], 2, Batch::read(0, 8)));
        assert!(
            matches!(result, Ok(Err(FabricError::NotEnoughLiveNodes { .. }))),
            "{result:?}"
        );
        assert_eq!(world.now() - start, swarm_sim::QP_TIMEOUT_NS);
    });
}

#[test]
fn a_deadline_is_not_a_stall_and_a_fallback_node_saves_the_step() {
    // The preferred majority {0, 1} includes a crashed node; after a timeout the
    // step escalates to node 2, as Safe-Guess does (SWARM §5).
    for_each_seed(10, |seed| {
        let world = SimWorld::with_seed(seed);
        world.crash(NodeId(1));
        let mut runner = SimRunner::new(&world);
        let client = world.client();
        let step = runner.spawn(client.id(), async move {
            let stats = OpStats::new();
            let mut step = Roundtrip::start(&client, &stats);
            step.post(NodeId(0), Batch::read(0, 8)).unwrap();
            step.post(NodeId(1), Batch::read(0, 8)).unwrap();
            let deadline = client.now() + 10_000;
            let first = step.wait_until(2, deadline).await;
            let timed_out_at = client.now();
            step.escalate();
            step.post(NodeId(2), Batch::read(0, 8)).unwrap();
            step.wait(2).await.unwrap();
            (first, timed_out_at, deadline, stats.roundtrips())
        });
        runner.run().expect("the deadline keeps the run alive");
        let (first, timed_out_at, deadline, roundtrips) = step.take().unwrap();
        assert_eq!(first, WaitOutcome::Short);
        assert_eq!(
            timed_out_at, deadline,
            "the timer fires exactly at the deadline"
        );
        assert_eq!(roundtrips, 2);
    });
}

#[test]
fn a_slow_node_answers_later() {
    for_each_seed(20, |seed| {
        let world = SimWorld::with_seed(seed);
        world.set_slow(NodeId(1), 10);
        let mut runner = SimRunner::new(&world);
        let handles: Vec<_> = (0..3u16)
            .map(|node| {
                let client = world.client();
                runner.spawn(client.id(), async move {
                    quorum(&client, &[node], 1, Batch::read(0, 8))
                        .await
                        .unwrap()
                })
            })
            .collect();
        runner.run().unwrap();
        let times: Vec<u64> = handles.iter().map(|h| h.finished_at().unwrap()).collect();
        // Default latency 1000 ± 300 ns each way: at most ~2.7 µs unslowed, at
        // least 14 µs ten times slower.
        assert!(
            times[1] >= 5 * times[0].max(times[2]),
            "slow node finished at {times:?}"
        );
        // Back to full speed.
        world.set_slow(NodeId(1), 1);
        let client = world.client();
        let start = world.now();
        let t = client.post(NodeId(1), Batch::read(0, 8));
        assert!(complete(&client, t).is_ok());
        assert!(world.now() - start < 3_000);
    });
}

#[test]
fn a_node_configured_slow_is_slow_from_the_start() {
    let config = SimConfig::default()
        .latency(Latency::new(1_000, 0))
        .slow(NodeId(0), 3);
    let world = SimWorld::new(1, config);
    let client = world.client();
    let t = client.post(NodeId(0), Batch::read(0, 8));
    assert!(complete(&client, t).is_ok());
    // Both messages and the read are three times slower: 3 × (1000 + 20 + 1000).
    assert_eq!(world.now(), 6_060);
}

#[test]
fn a_recovered_node_answers_again_with_its_memory() {
    // Without a queue pair timeout: a lost batch never completes.
    let world = SimWorld::new(7, SimConfig::default().qp_timeout(None));
    let client = world.client();
    let t = client.post(NodeId(0), Batch::write(16, vec![0xAB; 8]));
    assert!(complete(&client, t).is_ok());

    world.crash(NodeId(0));
    assert!(world.is_crashed(NodeId(0)));
    let lost = client.post(NodeId(0), Batch::read(16, 8));
    world.drain();
    assert_eq!(
        client.poll(lost),
        Poll::Pending,
        "a crashed node never answers"
    );
    assert!(!client.progress(), "nothing left that can complete");

    world.recover(NodeId(0));
    let t = client.post(NodeId(0), Batch::read(16, 8));
    let mut c = complete(&client, t).unwrap();
    assert_eq!(c.take_read(0).unwrap(), vec![0xAB; 8], "memory survived");
    world.drain();
    assert_eq!(client.poll(lost), Poll::Pending, "lost batches stay lost");
    assert_eq!(world.pending(client.id()), 1);
}

#[test]
fn a_crash_mid_write_leaves_it_partly_applied() {
    // Fixed latencies and 1 µs between chunks: the write's 8 chunks land at
    // 1000, 2000, ..., 8000 ns; the crash at 4500 ns stops it after four.
    let config = SimConfig::default()
        .latency(Latency::new(1_000, 0))
        .costs(20, 1_000);
    for_each_seed(10, |seed| {
        let world = SimWorld::new(seed, config.clone());
        let client = world.client();
        let t = client.post(NodeId(2), Batch::write(0, vec![0xFF; 64]));
        world.at(4_500, Fault::Crash(NodeId(2)));
        world.drain();
        // Lost: it fails at its queue pair timeout, and nothing more of it lands.
        assert!(matches!(
            client.poll(t),
            Poll::Ready(Err(FabricError::NodeFailed { .. }))
        ));
        world.recover(NodeId(2));
        let words = world.peek(NodeId(2), 0, 64).unwrap();
        let written = words.chunks(8).filter(|w| *w == [0xFF; 8]).count();
        let untouched = words.chunks(8).filter(|w| *w == [0; 8]).count();
        assert_eq!((written, untouched), (4, 4));
    });
}

#[test]
fn a_crashed_client_stops_but_its_posted_batches_still_execute() {
    for_each_seed(10, |seed| {
        let world = SimWorld::with_seed(seed);
        let mut runner = SimRunner::new(&world);
        let doomed = world.client();
        let survivor = world.client();
        let doomed_id = doomed.id();
        let write = runner.spawn(doomed_id, async move {
            quorum(&doomed, &[0, 1, 2], 2, Batch::write(8, vec![9; 8])).await
        });
        let other = runner.spawn(survivor.id(), async move {
            quorum(&survivor, &[0, 1, 2], 2, Batch::read(0, 8)).await
        });
        // Before any batch arrives (one-way latency is at least 700 ns).
        runner.at(100, Fault::CrashClient(doomed_id));
        let report = runner.run().unwrap();
        assert_eq!((report.finished, report.cancelled), (1, 1));
        assert!(write.is_cancelled() && !write.is_finished());
        assert!(other.take().unwrap().is_ok());
        assert!(world.client_crashed(doomed_id));
        world.drain();
        for node in 0..3 {
            assert_eq!(world.peek(NodeId(node), 8, 8).unwrap(), vec![9; 8]);
        }
    });
}

#[test]
#[should_panic(expected = "names node 3, but the world has 3 nodes")]
fn faults_on_missing_nodes_are_test_bugs() {
    SimWorld::with_seed(0).at(10, Fault::Crash(NodeId(3)));
}
