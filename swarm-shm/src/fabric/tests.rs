use std::time::Duration;

use swarm_core::fabric::FailNodes;
use swarm_core::header::HEADER_SIZE;
use swarm_core::{Op, OpStats, Roundtrip, WaitOutcome, block_on, block_on_future};

use super::*;
use crate::ScratchDir;

const DATA: u64 = HEADER_SIZE;

fn cluster(nodes: u16) -> (ScratchDir, Arc<ShmCluster>) {
    let dir = ScratchDir::new("swarm-shm-fabric-test").expect("scratch directory");
    let cluster =
        ShmCluster::create(dir.path(), nodes, HEADER_SIZE + 4096).expect("create cluster");
    (dir, Arc::new(cluster))
}

/// One roundtrip: `batch` to each of `nodes`, waiting for `k` replies.
fn roundtrip<F: Fabric>(
    fabric: &F,
    nodes: &[u16],
    batch: &Batch,
    k: usize,
) -> Result<Vec<(NodeId, Completion)>, FabricError> {
    let stats = OpStats::new();
    block_on(fabric, async {
        let mut rt = Roundtrip::start(fabric, &stats);
        for &n in nodes {
            rt.post(NodeId(n), batch.clone())?;
        }
        rt.wait(k).await?;
        Ok(rt.replies().to_vec())
    })
}

/// The 8 bytes at `addr` on `node`, read directly from the mapping.
fn word_at(cluster: &ShmCluster, node: u16, addr: u64) -> [u8; 8] {
    let mut word = [0; 8];
    cluster
        .node(NodeId(node))
        .expect("the node exists")
        .read(addr, &mut word)
        .expect("the address is in bounds");
    word
}

fn ready<F: Fabric>(fabric: &F, ticket: Ticket) -> Result<Completion, FabricError> {
    match fabric.poll(ticket) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("ticket {ticket:?} is still pending"),
    }
}

#[test]
fn batch_executes_in_order_and_reports_cas_previous() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    let mut batch = Batch::new();
    batch
        .push(Op::Write {
            addr: DATA + 8,
            data: vec![7; 8].into(),
        })
        .unwrap()
        .push(Op::Cas {
            addr: DATA,
            expected: 0,
            new: 5,
        })
        .unwrap()
        .push(Op::Read {
            addr: DATA,
            len: 16,
        })
        .unwrap()
        .push(Op::Cas {
            addr: DATA,
            expected: 0,
            new: 9,
        })
        .unwrap();
    let replies = roundtrip(&fabric, &[0], &batch, 1).unwrap();
    let completion = &replies[0].1;
    assert_eq!(completion.outputs()[0], swarm_core::OpOutput::Written);
    assert_eq!(completion.cas(1), Some(0));
    let read = completion.read(2).unwrap();
    assert_eq!(u64::from_le_bytes(read[..8].try_into().unwrap()), 5);
    assert_eq!(&read[8..], &[7; 8]);
    // The failed CAS returns what it found and changes nothing.
    assert_eq!(completion.cas(3), Some(5));
    let word = word_at(&cluster, 0, DATA);
    assert_eq!(u64::from_le_bytes(word), 5);
}

#[test]
fn writes_are_shared_between_clients() {
    let (_dir, cluster) = cluster(2);
    let writer = cluster.client();
    let t = writer.post(NodeId(1), Batch::write(DATA + 3, b"shared bytes".to_vec()));
    ready(&writer, t).unwrap();

    // Another thread with its own handle, and another mapping of the same files.
    let reopened = Arc::new(ShmCluster::open(cluster.dir()).unwrap());
    std::thread::spawn(move || {
        let reader = reopened.client();
        let t = reader.post(NodeId(1), Batch::read(DATA + 3, 12));
        assert_eq!(
            ready(&reader, t).unwrap().read(0),
            Some(&b"shared bytes"[..])
        );
    })
    .join()
    .unwrap();
}

#[test]
fn invalid_batches_are_errors_and_have_no_effect() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    let size = cluster.node(NodeId(0)).unwrap().size();

    let t = fabric.post(NodeId(0), Batch::read(size - 4, 8));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::OutOfBounds { .. })
    ));
    let t = fabric.post(NodeId(0), Batch::read(u64::MAX, 2));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::OutOfBounds { .. })
    ));
    let t = fabric.post(NodeId(0), Batch::cas(DATA + 4, 0, 1));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::Misaligned { .. })
    ));
    let t = fabric.post(NodeId(0), Batch::cas(size, 0, 1));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::OutOfBounds { .. })
    ));
    let t = fabric.post(NodeId(1), Batch::read(DATA, 8));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::NoSuchNode { nodes: 1, .. })
    ));

    // A valid write followed by an invalid op: the whole batch is refused.
    let mut batch = Batch::new();
    batch
        .push(Op::Write {
            addr: DATA,
            data: vec![1; 8].into(),
        })
        .unwrap()
        .push(Op::Cas {
            addr: DATA + 1,
            expected: 0,
            new: 1,
        })
        .unwrap();
    let t = fabric.post(NodeId(0), batch);
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::Misaligned { .. })
    ));
    let t = fabric.post(NodeId(0), Batch::read(DATA, 8));
    assert_eq!(ready(&fabric, t).unwrap().read(0), Some(&[0u8; 8][..]));

    // The last byte and the last word are reachable.
    let t = fabric.post(NodeId(0), Batch::write(size - 1, vec![9]));
    ready(&fabric, t).unwrap();
    let t = fabric.post(NodeId(0), Batch::cas(size - 8, 9 << 56, 1));
    assert_eq!(ready(&fabric, t).unwrap().cas(0), Some(9 << 56));
}

#[test]
fn tickets_are_redeemed_once() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    let t = fabric.post(NodeId(0), Batch::read(DATA, 8));
    ready(&fabric, t).unwrap();
    assert!(matches!(
        fabric.poll(t),
        Poll::Ready(Err(FabricError::UnknownTicket(_)))
    ));
    assert!(!fabric.progress(), "nothing is outstanding");
}

#[test]
fn majority_wait_survives_a_crashed_minority_and_stalls_without_majority() {
    let (_dir, cluster) = cluster(3);
    let fabric = cluster.client_with(0);
    fabric.fail_node(NodeId(2));
    assert!(fabric.is_failed(NodeId(2)) && !fabric.is_failed(NodeId(0)));
    let write = Batch::write(DATA, vec![4; 8]);
    let replies = roundtrip(&fabric, &[0, 1, 2], &write, 2).unwrap();
    let mut answered: Vec<u16> = replies.iter().map(|(n, _)| n.0).collect();
    answered.sort();
    assert_eq!(answered, [0, 1]);
    // The failed node was not written: it is crashed for this client.
    let word = word_at(&cluster, 2, DATA);
    assert_eq!(word, [0; 8]);

    // Waiting for all three can never finish.
    assert_eq!(
        roundtrip(&fabric, &[0, 1, 2], &write, 3).unwrap_err(),
        FabricError::Stalled
    );

    fabric.fail_node(NodeId(1));
    assert_eq!(
        roundtrip(&fabric, &[0, 1, 2], &write, 2).unwrap_err(),
        FabricError::Stalled
    );
    // Nothing is left that could complete.
    assert!(!fabric.progress());
    assert_eq!(fabric.inner().inner().slab.borrow().pending_count(), 0);
}

#[test]
fn failing_a_node_loses_its_batches_in_flight() {
    let (_dir, cluster) = cluster(2);
    let fabric = cluster.client_with(1_000_000); // 1 ms
    let lost = fabric.post(NodeId(1), Batch::read(DATA, 8));
    fabric.fail_node(NodeId(1));
    fabric.fail_node(NodeId(0));
    // Progress runs out once the batch's roundtrip has elapsed: it never completes.
    let rounds = (0..10).take_while(|_| fabric.progress()).count();
    assert!(rounds < 10, "progress never ran out");
    assert_eq!(fabric.poll(lost), Poll::Pending);
    fabric.fail_node(NodeId(9)); // unknown: ignored
}

#[test]
fn emulated_rtt_delays_completion() {
    const RTT: u64 = 2_000_000; // 2 ms: far above scheduling noise in the lower bound
    let (_dir, cluster) = cluster(3);
    let fabric = cluster.client_with(RTT);
    assert_eq!(fabric.inner().rtt_ns(), RTT);

    let start = fabric.now();
    let t = fabric.post(NodeId(0), Batch::write(DATA, vec![1; 8]));
    // The effect is visible at once (memory is shared), the completion is not.
    let word = word_at(&cluster, 0, DATA);
    assert_eq!(word, [1; 8]);
    if fabric.now() - start < RTT {
        assert_eq!(fabric.poll(t), Poll::Pending);
    }
    assert!(fabric.progress());
    assert!(
        fabric.now() - start >= RTT,
        "progress returned before the rtt elapsed"
    );
    ready(&fabric, t).unwrap();

    // Three nodes in one roundtrip overlap: all complete one rtt after posting.
    let stats = OpStats::new();
    let start = fabric.now();
    let replies = block_on_future(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        for n in 0..3 {
            rt.post(NodeId(n), Batch::read(DATA, 8)).unwrap();
        }
        rt.wait(3).await.unwrap();
        rt.replies().len()
    })
    .unwrap();
    let elapsed = fabric.now() - start;
    assert_eq!(replies, 3);
    assert!(elapsed >= RTT, "completed after {elapsed} ns");
    assert_eq!(stats.roundtrips(), 1);
}

#[test]
fn rtt_errors_are_reported_at_once() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client_with(1_000_000_000);
    let t = fabric.post(NodeId(0), Batch::cas(DATA + 1, 0, 1));
    assert!(matches!(
        ready(&fabric, t),
        Err(FabricError::Misaligned { .. })
    ));
}

#[test]
fn forgotten_batches_still_execute() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client_with(1000);
    swarm_core::post_background(&fabric, NodeId(0), Batch::cas(DATA, 0, 3));
    assert_eq!(fabric.inner().inner().slab.borrow().pending_count(), 0);
    let word = word_at(&cluster, 0, DATA);
    assert_eq!(u64::from_le_bytes(word), 3);
}

#[test]
fn deadlines_keep_progress_going_until_they_pass() {
    let (_dir, cluster) = cluster(3);
    let fabric = FailNodes::new(cluster.client());
    fabric.fail_node(NodeId(0));
    fabric.fail_node(NodeId(1));
    let stats = OpStats::new();
    let deadline = fabric.now() + Duration::from_millis(2).as_nanos() as u64;
    // Only node 2 answers: the wait falls short at the deadline instead of stalling.
    let outcome = block_on_future(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        for n in 0..3 {
            rt.post(NodeId(n), Batch::read(DATA, 8)).unwrap();
        }
        rt.wait_until(2, deadline).await
    })
    .unwrap();
    assert_eq!(outcome, WaitOutcome::Short);
    assert!(fabric.now() >= deadline);
    assert!(
        !fabric.progress(),
        "the deadline passed: nothing more to wait for"
    );
}

#[test]
fn now_is_monotonic() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    let a = fabric.now();
    std::thread::sleep(Duration::from_millis(1));
    let b = fabric.now();
    assert!(b >= a + 1_000_000);
}

#[test]
fn handles_are_send_and_clusters_are_shared() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<ShmFabric>();
    send_sync::<ShmCluster>();
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    assert_eq!(fabric.node_count(), 1);
    assert!(format!("{fabric:?}").contains("dir"));
}

/// A prefetch is a hint: ranges anywhere (past the end of the node, on a node that
/// does not exist, reaching beyond the mapping or the address space) change nothing
/// and do not panic, and a batch then reads what it would have read without it.
#[test]
fn prefetch_is_only_a_hint() {
    let (_dir, cluster) = cluster(2);
    let fabric = ShmFabric::new(cluster.clone());
    let size = HEADER_SIZE + 4096;
    roundtrip(&fabric, &[0], &Batch::write(DATA + 3, vec![7; 61]), 1).unwrap();
    let wild = [
        (DATA + 3, 61),
        (size - 8, u64::MAX),
        (u64::MAX - 3, 64),
        (0, 0),
    ];
    for node in [0, 1, 9] {
        for (addr, len) in wild {
            fabric.prefetch(NodeId(node), addr, len);
        }
    }
    assert_eq!(word_at(&cluster, 0, DATA), [0, 0, 0, 7, 7, 7, 7, 7]);
    let read = roundtrip(&fabric, &[0], &Batch::read(DATA + 3, 61), 1).unwrap();
    assert_eq!(read[0].1.read(0), Some(&[7u8; 61][..]));
}

/// `read_direct` reads in place exactly what a one-read batch reads, refuses what
/// the batch path refuses (out of the mapping, however wild the address), and
/// leaves an absent or retired node to the batch path, which fails it.
#[test]
fn read_direct_is_a_one_read_batch() {
    let (dir, cluster) = cluster(2);
    let fabric = ShmFabric::new(cluster.clone());
    let size = HEADER_SIZE + 4096;
    roundtrip(&fabric, &[0], &Batch::write(DATA + 3, vec![7; 61]), 1).unwrap();
    let mut out = [0u8; 70];
    assert_eq!(fabric.read_direct(NodeId(0), DATA, &mut out), Some(Ok(())));
    let read = roundtrip(&fabric, &[0], &Batch::read(DATA, 70), 1).unwrap();
    assert_eq!(read[0].1.read(0), Some(&out[..]));
    assert_eq!(&out[..3], &[0; 3]);
    assert_eq!(&out[3..64], &[7; 61][..]);
    for addr in [size - 69, u64::MAX - 3, size] {
        assert!(
            matches!(
                fabric.read_direct(NodeId(0), addr, &mut out),
                Some(Err(FabricError::OutOfBounds { .. }))
            ),
            "read of 70 bytes at {addr}"
        );
    }
    assert_eq!(fabric.read_direct(NodeId(9), DATA, &mut out), None);
    // Buffers for direct reads come from those given back.
    let mut buffer = fabric.take_buffer(16);
    assert_eq!(buffer.len(), 16);
    assert_eq!(
        fabric.read_direct(NodeId(0), DATA, &mut buffer),
        Some(Ok(()))
    );
    assert_eq!(buffer[..], out[..16]);
    let at = buffer.as_ptr();
    fabric.give_back(buffer);
    let again = fabric.take_buffer(8);
    assert_eq!((again.as_ptr(), again.len()), (at, 8), "the spare, reused");
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    assert_eq!(fabric.read_direct(NodeId(1), DATA, &mut out), None);
    assert!(matches!(
        roundtrip(&fabric, &[1], &Batch::read(DATA, 8), 1),
        Err(FabricError::NotEnoughLiveNodes { .. })
    ));
}

/// `submit_in_place` executes a batch as `submit` does (the same effects, its
/// read's bytes and CAS answer in the reply), refuses what the batch path refuses
/// (out of the mapping: nothing executed), fails it on a retired node, and
/// declines (`None`) an absent node or reads that do not fit in the reply.
#[test]
fn submit_in_place_is_a_submitted_batch() {
    let (dir, cluster) = cluster(2);
    let fabric = ShmFabric::new(cluster.clone());
    let size = HEADER_SIZE + 4096;
    let batch = |addr: u64| {
        let mut batch = Batch::write(addr, vec![7; 16]);
        batch
            .push(Op::Read { addr, len: 24 })
            .unwrap()
            .push(Op::Cas {
                addr,
                expected: u64::from_le_bytes([7; 8]),
                new: 9,
            })
            .unwrap();
        batch
    };
    let mut bytes = [0u8; 24];
    let mut reply = InPlaceReply::new(&mut bytes);
    assert_eq!(
        fabric.submit_in_place(NodeId(0), &batch(DATA), &mut reply),
        Some(Ok(()))
    );
    assert_eq!(&reply.reads()[..16], &[7; 16]);
    assert_eq!(reply.cas(2), Some(u64::from_le_bytes([7; 8])));
    let submitted = roundtrip(&fabric, &[1], &batch(DATA), 1).unwrap();
    assert_eq!(submitted[0].1.read(1), Some(reply.reads()));
    assert_eq!(word_at(&cluster, 0, DATA), word_at(&cluster, 1, DATA));
    assert_eq!(word_at(&cluster, 0, DATA), 9u64.to_le_bytes());
    let mut reply = InPlaceReply::new(&mut bytes);
    assert!(matches!(
        fabric.submit_in_place(NodeId(0), &batch(size - 16), &mut reply),
        Some(Err(FabricError::OutOfBounds { .. }))
    ));
    assert_eq!(
        word_at(&cluster, 0, size - 16),
        [0; 8],
        "nothing of a refused batch"
    );
    assert_eq!(
        fabric.submit_in_place(NodeId(9), &batch(DATA), &mut reply),
        None
    );
    let mut short = [0u8; 23];
    assert_eq!(
        fabric.submit_in_place(NodeId(0), &batch(DATA), &mut InPlaceReply::new(&mut short)),
        None
    );
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    assert!(matches!(
        fabric.submit_in_place(NodeId(1), &batch(DATA), &mut reply),
        Some(Err(FabricError::NodeFailed { .. }))
    ));
}

/// A task that yielded with nothing in flight (`Fabric::yielded`) gets one more
/// `progress` that returns `true`, then the fabric is idle again: on the plain
/// fabric and under an emulated latency, whose `progress` asks this one first.
#[test]
fn a_yield_gives_one_more_round() {
    let (_dir, cluster) = cluster(1);
    let plain = cluster.client();
    let delayed = cluster.client_with(1000);
    for fabric in [&plain as &dyn Fabric, &delayed] {
        assert!(!fabric.progress(), "nothing is outstanding");
        fabric.yielded();
        assert!(fabric.progress(), "the yielded task is polled again");
        assert!(!fabric.progress(), "and only once");
    }
}

/// A detached batch has the effects of the same batch submitted, fills no reply
/// (no read buffer taken for its reads), and an invalid one has none at all, as
/// `submit` then `forget` would leave it; an absent node is ignored.
#[test]
fn detached_batches_have_the_effects_of_submitted_ones() {
    let (_dir, cluster) = cluster(1);
    let fabric = cluster.client();
    let size = cluster.node(NodeId(0)).unwrap().size();
    fabric.give_back(vec![0; 64]);
    let mut batch = Batch::new();
    batch
        .push(Op::Write {
            addr: DATA + 3,
            data: vec![5; 13].into(),
        })
        .unwrap()
        .push(Op::Read {
            addr: DATA,
            len: 64,
        })
        .unwrap()
        .push(Op::Cas {
            addr: DATA + 16,
            expected: 0,
            new: 7,
        })
        .unwrap();
    fabric.post_detached(NodeId(0), &mut batch);
    assert_eq!(fabric.buffers.spares(), 1, "no buffer taken for the read");
    assert_eq!(word_at(&cluster, 0, DATA), [0, 0, 0, 5, 5, 5, 5, 5]);
    assert_eq!(word_at(&cluster, 0, DATA + 8), [5; 8]);
    assert_eq!(u64::from_le_bytes(word_at(&cluster, 0, DATA + 16)), 7);
    // A valid write followed by an invalid CAS: nothing of it lands.
    let mut batch = Batch::new();
    batch
        .push(Op::Write {
            addr: DATA + 24,
            data: vec![1; 8].into(),
        })
        .unwrap()
        .push(Op::Cas {
            addr: size,
            expected: 0,
            new: 1,
        })
        .unwrap();
    fabric.post_detached(NodeId(0), &mut batch);
    assert_eq!(word_at(&cluster, 0, DATA + 24), [0; 8]);
    fabric.post_detached(NodeId(3), &mut Batch::write(DATA, vec![9; 8]));
    assert_eq!(word_at(&cluster, 0, DATA)[0], 0);
}
