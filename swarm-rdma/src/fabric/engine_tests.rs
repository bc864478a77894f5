//! The RDMA engine ([`super::engine`]) without RDMA hardware: over the emulated
//! provider's NIC ([`crate::emu::EmuNic`]), with RC semantics (chains executed in
//! posting order per queue pair, in a seeded random order across nodes, request by
//! request; only signaled requests complete on success; a crashing node fails one
//! request with `IBV_WC_RETRY_EXC_ERR` and flushes every later one), the real
//! planner and the real `post_chain` below the engine. These tests are about the
//! engine (pipelining, staging and credits, failures, give-ups, parking,
//! deadlines), so the emulator's overtaking of unfenced requests is off here; the
//! ordering rules and the planner's fences are tested in `crate::emu`'s tests.

use std::sync::Arc;
use std::task::Poll;

use proptest::prelude::*;
use rdma_sys::ibv_wc_status as s;
use swarm_core::MemCluster;
use swarm_core::fabric::{Batch, Completion, FabricError, FailureCause, NodeId, Op};
use swarm_core::{Fabric, block_on_future};
use swarm_core::{OpStats, Roundtrip};

use super::engine::{Engine, EngineFabric, MAX_PARK_NS, NodeLink, ParkStats};
use crate::emu::{EmuConnection, EmuNic, EmuNode, EmuQp, Mode};
use crate::wr::{CasReplyOrder, ChainLimits, ReadOrdering, RemoteRegion};

const SIZE: usize = 4096;
const BASE: u64 = 0x7f00_0000_0000;
/// The largest inline payload of the tests' queue pairs.
const MAX_INLINE: u32 = 16;

/// One client's NIC on `nodes` emulated memory nodes of `SIZE` bytes: queue pairs
/// of `depth` requests, `staging` bytes of staging, the cross-node schedule drawn
/// from `seed`, no overtaking (see the module docs).
fn nic(nodes: usize, staging: usize, depth: u32, seed: u64) -> EmuNic {
    let nodes = (0..nodes)
        .map(|i| {
            Arc::new(EmuNode::new(
                BASE + ((i as u64) << 32),
                0x100 + i as u32,
                SIZE,
            ))
        })
        .collect();
    let mut nic = EmuNic::new(
        nodes,
        depth,
        MAX_INLINE,
        staging,
        CasReplyOrder::Native,
        seed,
    )
    .expect("the staging buffer is mapped");
    nic.overtake_percent = 0;
    nic
}

fn link(nic: &EmuNic, node: usize, depth: u32) -> NodeLink {
    let target = nic.node(node);
    NodeLink {
        region: RemoteRegion {
            addr: target.base,
            rkey: target.rkey,
            size: target.size(),
        },
        limits: ChainLimits {
            max_inline: MAX_INLINE,
            max_message: 1 << 30,
            ordering: ReadOrdering::Concurrent,
            cas_reply: CasReplyOrder::Native,
        },
        depth,
    }
}

fn fabric(nodes: usize, staging: usize, depth: u32, seed: u64) -> EngineFabric<EmuNic> {
    let nic = nic(nodes, staging, depth, seed);
    let links = (0..nodes).map(|i| Some(link(&nic, i, depth))).collect();
    EngineFabric::new(Engine::new(nic, links))
}

/// Node `node`'s memory, as the client's NIC reaches it.
fn memory(f: &EngineFabric<EmuNic>, node: usize) -> Vec<u8> {
    f.engine().nic_mut().node(node).with(|bytes| bytes.clone())
}

/// A fresh queue pair to node `node` in place of the old one (as after a
/// reconnect): requests posted on the old one are gone, never completed.
fn replace_qp(nic: &mut EmuNic, node: usize) {
    let fresh = EmuConnection {
        qp: EmuQp::new(0x100 + node as u32, 64, MAX_INLINE),
        node: Arc::clone(nic.node(node)),
    };
    nic.replace_connection(node, fresh);
}

fn wait(f: &EngineFabric<EmuNic>, ticket: swarm_core::Ticket) -> Result<Completion, FabricError> {
    for _ in 0..10_000 {
        if let Poll::Ready(result) = f.poll(ticket) {
            return result;
        }
        f.progress();
    }
    panic!("ticket {ticket:?} never completed");
}

/// A task that yielded with nothing in flight (`Fabric::yielded`) gets one more
/// `progress` that returns `true`, then the engine is idle again.
#[test]
fn a_yield_gives_one_more_round() {
    let f = fabric(1, 4096, 8, 1);
    assert!(!f.progress(), "nothing is outstanding");
    f.yielded();
    assert!(f.progress(), "the yielded task is polled again");
    assert!(!f.progress(), "and only once");
}

/// Like `wait`, for tickets that complete only after the engine's overdue limits
/// (wall-clock time): up to 5 s.
fn wait_timed(
    f: &EngineFabric<EmuNic>,
    ticket: swarm_core::Ticket,
) -> Result<Completion, FabricError> {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(5) {
        if let Poll::Ready(result) = f.poll(ticket) {
            return result;
        }
        f.progress();
    }
    panic!("ticket {ticket:?} did not complete within 5 s");
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..SIZE as u64, 0u32..100).prop_map(|(addr, len)| Op::Read { addr, len }),
        (
            0u64..SIZE as u64,
            proptest::collection::vec(any::<u8>(), 0..100)
        )
            .prop_map(|(addr, data)| Op::Write {
                addr,
                data: data.into()
            }),
        (0u64..520, 0u64..3, 0u64..3).prop_map(|(w, expected, new)| Op::Cas {
            addr: w * 8,
            expected,
            new
        }),
    ]
}

fn arb_batch() -> impl Strategy<Value = (u16, Batch)> {
    (0u16..3, proptest::collection::vec(arb_op(), 0..=4)).prop_map(|(node, ops)| {
        let mut batch = Batch::new();
        for op in ops {
            batch.push(op).unwrap();
        }
        (node, batch)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Many batches in flight at once across three nodes, with a tiny staging
    /// buffer and shallow queues (so chains wait and are posted later), give the
    /// same results as the reference fabric executing them one by one. The seed
    /// of the NIC's cross-node order is part of the (printed) failing input.
    #[test]
    fn pipelined_batches_match_the_reference(
        batches in proptest::collection::vec(arb_batch(), 1..40),
        seed: u64,
    ) {
        let f = fabric(3, 512, 6, seed);
        let reference = MemCluster::new(3, SIZE).client();
        let tickets: Vec<_> = batches.iter().map(|(n, b)| f.post(NodeId(*n), b.clone())).collect();
        for ((node, batch), ticket) in batches.iter().zip(tickets) {
            let expected = reference.post(NodeId(*node), batch.clone());
            let Poll::Ready(expected) = reference.poll(expected) else { unreachable!() };
            prop_assert_eq!(wait(&f, ticket), expected);
        }
        for _ in 0..100 { f.progress(); }
        {
            let engine = f.engine();
            prop_assert_eq!(engine.in_flight(), 0);
            prop_assert_eq!(engine.staging_in_use(), 0);
        }
        for node in 0..3u16 {
            // The final memory matches too.
            let t = reference.post(NodeId(node), Batch::read(0, SIZE as u32));
            let Poll::Ready(Ok(c)) = reference.poll(t) else { unreachable!() };
            prop_assert!(memory(&f, usize::from(node)) == c.read(0).unwrap());
        }
    }
}

#[test]
fn a_revived_node_gets_a_fresh_queue_pair_and_its_old_chains_are_forgotten() {
    let f = fabric(3, 4096, 64, 7);
    f.engine().nic_mut().set_mode(2, Mode::Silent);
    let stuck = f.post(NodeId(2), Batch::read(0, 64));
    for _ in 0..10 {
        f.progress();
    }
    assert!(f.poll(stuck).is_pending());
    assert!(!f.engine().any_dead());
    // The port went down: every node fails, the stuck chain with it, but its
    // staging stays lent out (the old queue pair may still write into it).
    f.engine().kill_all();
    assert!(matches!(f.poll(stuck), Poll::Ready(Err(_))));
    assert!(f.engine().any_dead());
    assert_eq!(f.engine().staging_in_use(), 64);
    // Node 2 reconnects: fresh queue pair, the old chain forgotten.
    {
        let mut engine = f.engine();
        replace_qp(engine.nic_mut(), 2);
        let fresh = link(engine.nic_mut(), 2, 64);
        engine.revive(NodeId(2), fresh);
        assert_eq!(engine.staging_in_use(), 0);
        assert_eq!(engine.in_flight(), 0);
        assert!(!engine.is_dead(NodeId(2)) && engine.is_dead(NodeId(0)));
    }
    let mut write = Batch::new();
    write
        .push(Op::Write {
            addr: 8,
            data: vec![5; 8].into(),
        })
        .unwrap();
    write.push(Op::Read { addr: 8, len: 8 }).unwrap();
    let done = wait(&f, f.post(NodeId(2), write)).unwrap();
    assert_eq!(done.read(1), Some(&[5u8; 8][..]));
    assert!(wait(&f, f.post(NodeId(0), Batch::read(0, 8))).is_err());
    // Reviving a live node changes nothing; the other two still count as dead.
    let again = link(f.engine().nic_mut(), 2, 64);
    f.engine().revive(NodeId(2), again);
    assert!(f.engine().any_dead());
    for node in [0, 1] {
        let mut engine = f.engine();
        replace_qp(engine.nic_mut(), node);
        let fresh = link(engine.nic_mut(), node, 64);
        engine.revive(NodeId(node as u16), fresh);
    }
    assert!(!f.engine().any_dead());
}

#[test]
fn a_crashed_minority_fails_its_batches_and_the_majority_carries_on() {
    let f = fabric(3, 4096, 64, 7);
    f.engine().nic_mut().set_mode(2, Mode::CrashAfter(0));
    let stats = OpStats::new();
    let reached = block_on_future(&f, async {
        let mut rt = Roundtrip::start(&f, &stats);
        for n in 0..3 {
            let mut batch = Batch::new();
            batch
                .push(Op::Write {
                    addr: 64,
                    data: vec![1; 40].into(),
                })
                .unwrap();
            batch
                .push(Op::Cas {
                    addr: 8,
                    expected: 0,
                    new: 9,
                })
                .unwrap();
            rt.post(NodeId(n), batch).unwrap();
        }
        rt.wait(2).await.map(|()| rt.replies().len())
    })
    .unwrap();
    assert_eq!(reached, Ok(2));
    // The crashed node's batch failed with its verbs status...
    let t = f.post(NodeId(2), Batch::read(0, 8));
    // ...and from now on batches to it fail at once, without touching the NIC.
    assert_eq!(
        f.poll(t),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(2),
            cause: FailureCause::Disconnected
        }))
    );
    assert!(f.engine().is_dead(NodeId(2)));
    while f.progress() {}
    assert_eq!(f.engine().in_flight(), 0, "flushes release every chain");
    assert_eq!(f.engine().staging_in_use(), 0);
}

#[test]
fn the_first_error_status_reaches_the_batch() {
    let f = fabric(1, 4096, 64, 3);
    f.engine().nic_mut().set_mode(0, Mode::CrashAfter(0));
    let mut batch = Batch::new();
    batch.push(Op::Read { addr: 0, len: 100 }).unwrap();
    batch
        .push(Op::Write {
            addr: 0,
            data: vec![1; 100].into(),
        })
        .unwrap();
    let first = f.post(NodeId(0), batch.clone());
    let second = f.post(NodeId(0), batch);
    assert_eq!(
        wait(&f, first),
        Err(FabricError::NodeFailed {
            node: NodeId(0),
            cause: FailureCause::Transport(s::IBV_WC_RETRY_EXC_ERR)
        })
    );
    // The second was in flight on the same queue pair: failed with the same
    // cause as soon as the node was known dead.
    assert!(matches!(
        f.poll(second),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(0),
            ..
        }))
    ));
}

#[test]
fn a_silent_node_leaves_its_ticket_pending_and_progress_busy() {
    let f = fabric(3, 4096, 64, 5);
    f.engine().nic_mut().set_mode(1, Mode::Silent);
    let stats = OpStats::new();
    let reached = block_on_future(&f, async {
        let mut rt = Roundtrip::start(&f, &stats);
        for n in 0..3 {
            rt.post(NodeId(n), Batch::read(0, 8)).unwrap();
        }
        rt.wait(2).await
    })
    .unwrap();
    assert_eq!(reached, Ok(()));
    // The silent node's batch was forgotten by the roundtrip but still counts:
    // RC retries will eventually report it.
    assert!(f.progress());
    assert_eq!(f.engine().in_flight(), 1);
    // When the node finally errors out, the forgotten ticket is cleaned up.
    f.engine().nic_mut().set_mode(1, Mode::CrashAfter(0));
    while f.progress() {}
    assert_eq!(f.engine().in_flight(), 0);
    assert_eq!(f.engine().staging_in_use(), 0);
}

#[test]
fn a_chain_the_nic_never_answers_is_reported_once_past_the_limit() {
    let nic = nic(3, 4096, 64, 3);
    let links = (0..3).map(|i| Some(link(&nic, i, 64))).collect();
    let engine = Engine::new(nic, links).warn_overdue_after(50_000_000);
    let f = EngineFabric::new(engine);
    f.engine().nic_mut().set_mode(2, Mode::Silent);
    // Timed from before the post: the chain's age counts from its post, and the
    // thread may be preempted between the post and a later clock read.
    let started = std::time::Instant::now();
    let answered = f.post(NodeId(0), Batch::read(0, 8));
    let lost = f.post(NodeId(2), Batch::read(0, 8));
    assert!(wait(&f, answered).is_ok());
    while f.engine().overdue_warnings() == 0 {
        assert!(f.progress(), "the lost chain is still pending");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "no warning about the lost chain"
        );
    }
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(50),
        "warned before the limit"
    );
    // Once per chain; the chain stays pending (a diagnostic, not a failure).
    let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
    while std::time::Instant::now() < until {
        f.progress();
    }
    assert_eq!(f.engine().overdue_warnings(), 1);
    assert!(f.poll(lost).is_pending());
    assert!(!f.engine().is_dead(NodeId(2)));
    assert_eq!(f.engine().in_flight(), 2, "the lost chain and its nudge");
}

#[test]
fn the_nudge_wakes_a_queue_pair_holding_a_chain() {
    let nic = nic(3, 4096, 64, 4);
    let links = (0..3).map(|i| Some(link(&nic, i, 64))).collect();
    let engine = Engine::new(nic, links)
        .warn_overdue_after(50_000_000)
        .fail_overdue_after(5_000_000_000);
    let f = EngineFabric::new(engine);
    f.engine().nic_mut().set_mode(2, Mode::Held);
    // Posts wake a held queue pair: hold it once the chain is posted.
    let started = std::time::Instant::now();
    let held = f.post(NodeId(2), Batch::read(0, 8));
    f.engine().nic_mut().set_mode(2, Mode::Held);
    assert!(
        wait_timed(&f, held).is_ok(),
        "the nudge woke the queue pair"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(50));
    assert_eq!(f.engine().overdue_warnings(), 1);
    assert!(!f.engine().is_dead(NodeId(2)));
    while f.progress() {}
    assert_eq!(f.engine().in_flight(), 0, "the nudge completed too");
}

/// An idle client (no progress calls) whose queue pair holds a write past the
/// give-up limit: its next post must not wake the queue pair and let the held
/// write land late, so the engine gives up on it before posting.
#[test]
fn a_post_after_an_idle_gap_gives_up_on_a_held_queue_pair_first() {
    let nic = nic(3, 4096, 64, 6);
    let links = (0..3).map(|i| Some(link(&nic, i, 64))).collect();
    let engine = Engine::new(nic, links)
        .warn_overdue_after(50_000_000)
        .fail_overdue_after(150_000_000);
    let f = EngineFabric::new(engine);
    let held = f.post(NodeId(1), Batch::write(64, vec![7; 8]));
    f.engine().nic_mut().set_mode(1, Mode::Held);
    // One progress call, then the client idles past the limit.
    f.progress();
    std::thread::sleep(std::time::Duration::from_millis(400));
    let next = f.post(NodeId(1), Batch::read(0, 8));
    assert!(f.engine().is_dead(NodeId(1)), "given up on before the post");
    assert!(matches!(f.poll(held), Poll::Ready(Err(_))));
    // The post itself is parked until the node is reconnected (or the window
    // passes: then it fails).
    assert!(f.engine().is_parked(NodeId(1)));
    assert!(wait_timed(&f, next).is_err(), "never reconnected");
    while f.progress() {}
    assert_eq!(
        &memory(&f, 1)[64..72],
        &[0; 8],
        "the held write never landed"
    );
}

#[test]
fn a_chain_lost_past_the_give_up_limit_fails_its_node() {
    let nic = nic(3, 4096, 64, 5);
    let links = (0..3).map(|i| Some(link(&nic, i, 64))).collect();
    let engine = Engine::new(nic, links)
        .warn_overdue_after(50_000_000)
        .fail_overdue_after(250_000_000);
    let f = EngineFabric::new(engine);
    f.engine().nic_mut().set_mode(2, Mode::Silent);
    let started = std::time::Instant::now();
    let lost = f.post(NodeId(2), Batch::read(0, 8));
    assert_eq!(wait_timed(&f, lost), Err(given_up_error(NodeId(2))));
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    assert!(f.engine().is_dead(NodeId(2)));
    assert_eq!(f.engine().lost_chain_failures(), 1);
    // The queue pair was aborted: its chains (the lost one and its nudge) come
    // back flushed and their staging is released.
    while f.progress() {}
    assert_eq!(f.engine().in_flight(), 0);
    assert_eq!(f.engine().staging_in_use(), 0);
    // Later posts to the node are parked until a reconnect revives it or the
    // park window (the give-up limit) passes, then fail at once.
    assert!(f.engine().is_parked(NodeId(2)));
    assert!(
        f.poll(f.post(NodeId(2), op_batch(&f, Batch::read(0, 8))))
            .is_pending()
    );
    std::thread::sleep(std::time::Duration::from_millis(250));
    f.progress();
    assert!(!f.engine().is_parked(NodeId(2)));
    assert!(f.poll(f.post(NodeId(2), Batch::read(0, 8))).is_ready());
}

/// Three nodes whose node `node` was given up on (its queue pair held a write
/// past the `give_up_ns` limit): the held write failed, the node is dead and
/// parked. No overdue warning, hence no nudge (which would wake the queue pair).
fn given_up_on(node: usize, give_up_ns: u64, seed: u64) -> EngineFabric<EmuNic> {
    let nic = nic(3, 4096, 64, seed);
    let links = (0..3).map(|i| Some(link(&nic, i, 64))).collect();
    let f = EngineFabric::new(Engine::new(nic, links).fail_overdue_after(give_up_ns));
    let id = NodeId(node as u16);
    let held = f.post(id, Batch::write(64, vec![7; 8]));
    f.engine().nic_mut().set_mode(node, Mode::Held);
    assert_eq!(wait_timed(&f, held), Err(given_up_error(id)));
    assert!(f.engine().is_dead(id) && f.engine().is_parked(id));
    f
}

/// The error of the batches of a node the engine gave up on.
fn given_up_error(node: NodeId) -> FabricError {
    FabricError::NodeFailed {
        node,
        cause: FailureCause::TimedOut,
    }
}

/// What the fabric does once a reconnect attempt succeeds: a fresh queue pair
/// in place of the old one, then the revive.
fn reconnect(f: &EngineFabric<EmuNic>, node: usize) {
    let mut engine = f.engine();
    replace_qp(engine.nic_mut(), node);
    let fresh = link(engine.nic_mut(), node, 64);
    engine.revive(NodeId(node as u16), fresh);
}

/// `batch` as an operation posts it: with a deadline (ten seconds ahead). Only
/// such batches are parked.
fn op_batch(f: &EngineFabric<EmuNic>, mut batch: Batch) -> Batch {
    batch.set_deadline(Some(f.now() + 10_000_000_000));
    batch
}

/// Polls `future` once, as an executor would between two progress calls.
fn poll_once<T>(future: std::pin::Pin<&mut impl Future<Output = T>>) -> Poll<T> {
    future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// Soft-RoCE held a queue pair's chain and the engine gave up on its (live)
/// node while another node was down: operations posted while it is being
/// reconnected wait for it instead of failing for want of a majority.
#[test]
fn a_post_to_a_node_given_up_on_waits_for_its_reconnect_and_completes() {
    let f = given_up_on(1, 150_000_000, 21);
    f.engine().fail_node(NodeId(2));
    assert!(!f.engine().is_parked(NodeId(2)), "only give-ups park");
    let write = f.post(NodeId(1), op_batch(&f, Batch::write(128, vec![9; 8])));
    let read = f.post(NodeId(1), op_batch(&f, Batch::read(128, 8)));
    // Background work without a deadline is not parked: it fails at once.
    assert!(f.poll(f.post(NodeId(1), Batch::read(0, 8))).is_ready());
    // An operation that needs both nodes left.
    let stats = OpStats::new();
    let _armed = stats.arm_deadline(f.now() + 10_000_000_000);
    let mut operation = std::pin::pin!(async {
        let mut rt = Roundtrip::start(&f, &stats);
        for n in 0..3 {
            rt.post(NodeId(n), Batch::read(64, 8)).unwrap();
        }
        rt.wait(2).await
    });
    for _ in 0..20 {
        assert!(poll_once(operation.as_mut()).is_pending(), "it waits");
        assert!(f.progress(), "parked batches are pending");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(f.poll(write).is_pending() && f.poll(read).is_pending());
    assert_eq!(f.engine().in_flight(), 0, "parked, not posted");
    reconnect(&f, 1);
    assert!(!f.engine().is_parked(NodeId(1)));
    let reached = loop {
        if let Poll::Ready(reached) = poll_once(operation.as_mut()) {
            break reached;
        }
        f.progress();
    };
    assert_eq!(reached, Ok(()));
    assert!(wait(&f, write).is_ok());
    // Posted in order: the read sees the write.
    assert_eq!(wait(&f, read).unwrap().read(0), Some(&[9u8; 8][..]));
    assert_eq!(
        &memory(&f, 1)[64..72],
        &[0; 8],
        "the held write was aborted, never landed"
    );
    assert_eq!(
        f.engine().park_stats(),
        ParkStats {
            parked_nodes: 1,
            parked_batches: 3,
            revived: 1,
            failed: 0
        }
    );
    while f.progress() {}
    assert_eq!(f.engine().in_flight(), 0);
    assert_eq!(f.engine().staging_in_use(), 0);
}

/// The delivery-margin contract: a parked batch is posted before its
/// operation's deadline or never, whether the deadline passes before the revive
/// or between the revive and the next progress call.
#[test]
fn a_parked_batch_past_its_deadline_is_fenced_and_never_lands() {
    let f = given_up_on(1, 1_000_000_000, 22);
    let mut late = Batch::write(256, vec![3; 8]);
    late.set_deadline(Some(f.now() + 30_000_000));
    let late = f.post(NodeId(1), late);
    let open = f.post(NodeId(1), op_batch(&f, Batch::write(320, vec![4; 8])));
    assert!(f.poll(late).is_pending());
    std::thread::sleep(std::time::Duration::from_millis(40));
    f.progress();
    assert_eq!(
        f.poll(late),
        Poll::Ready(Err(FabricError::Fenced)),
        "failed as soon as its deadline passed, before the revive"
    );
    assert!(f.poll(open).is_pending(), "still parked");
    // Revived before the deadline, which passes before the next progress call.
    let mut later = Batch::write(384, vec![5; 8]);
    later.set_deadline(Some(f.now() + 20_000_000));
    let later = f.post(NodeId(1), later);
    reconnect(&f, 1);
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(wait(&f, open).is_ok());
    assert_eq!(wait(&f, later), Err(FabricError::Fenced));
    while f.progress() {}
    let memory = memory(&f, 1);
    assert_eq!(&memory[256..264], &[0; 8], "the late batch never landed");
    assert_eq!(&memory[384..392], &[0; 8], "nor the later one");
    assert_eq!(&memory[320..328], &[4; 8]);
}

#[test]
fn parking_ends_in_failure_when_the_window_passes() {
    let f = given_up_on(0, 150_000_000, 23);
    assert_eq!(f.engine().park_window_ns(), 150_000_000);
    let started = std::time::Instant::now();
    let parked = f.post(NodeId(0), op_batch(&f, Batch::read(0, 8)));
    assert_eq!(wait_timed(&f, parked), Err(given_up_error(NodeId(0))));
    // The window started at the give-up, a moment before the post.
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    assert!(!f.engine().is_parked(NodeId(0)));
    assert_eq!(f.engine().park_stats().failed, 1);
    assert!(f.poll(f.post(NodeId(0), Batch::read(0, 8))).is_ready());
    // Without a give-up limit the window is still bounded.
    let nic = nic(1, 4096, 64, 1);
    let links = vec![Some(link(&nic, 0, 64))];
    assert_eq!(Engine::new(nic, links).park_window_ns(), MAX_PARK_NS);
}

#[test]
fn parking_ends_in_failure_when_the_reconnect_fails_or_the_node_fails_again() {
    // The reconnect attempt failed (or the node was retired): the fabric stops
    // parking; the parked batches fail with the give-up's error.
    let f = given_up_on(2, 1_000_000_000, 24);
    let parked = f.post(NodeId(2), op_batch(&f, Batch::read(0, 8)));
    f.progress();
    assert!(f.poll(parked).is_pending());
    f.engine()
        .stop_parking(NodeId(2), "the reconnect attempt failed");
    assert_eq!(f.poll(parked), Poll::Ready(Err(given_up_error(NodeId(2)))));
    assert!(f.poll(f.post(NodeId(2), Batch::read(0, 8))).is_ready());
    // Failed again while parked (the device went down): that failure's error.
    let f = given_up_on(2, 1_000_000_000, 25);
    let parked = f.post(NodeId(2), op_batch(&f, Batch::read(0, 8)));
    f.engine().kill_all();
    assert_eq!(
        f.poll(parked),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(2),
            cause: FailureCause::Disconnected
        }))
    );
    assert!(!f.engine().is_parked(NodeId(2)));
    assert_eq!(f.engine().park_stats().failed, 1);
}

/// Only give-ups park: a node failed by an error completion is not known to be
/// up, and posts to it fail at once, as before.
#[test]
fn a_node_failed_by_an_error_completion_still_fails_posts_at_once() {
    let f = fabric(3, 4096, 64, 26);
    f.engine().nic_mut().set_mode(1, Mode::CrashAfter(0));
    assert_eq!(
        wait(&f, f.post(NodeId(1), Batch::read(0, 8))),
        Err(FabricError::NodeFailed {
            node: NodeId(1),
            cause: FailureCause::Transport(s::IBV_WC_RETRY_EXC_ERR)
        })
    );
    assert!(!f.engine().is_parked(NodeId(1)));
    let t = f.post(NodeId(1), Batch::write(64, vec![1; 8]));
    assert_eq!(
        f.poll(t),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(1),
            cause: FailureCause::Disconnected
        })),
        "failed at once, not parked"
    );
    // With node 2 failed too, an operation fails for want of a majority at once.
    f.engine().fail_node(NodeId(2));
    let stats = OpStats::new();
    let reached = block_on_future(&f, async {
        let mut rt = Roundtrip::start(&f, &stats);
        for n in 0..3 {
            rt.post(NodeId(n), Batch::read(0, 8)).unwrap();
        }
        rt.wait(2).await
    })
    .unwrap();
    assert!(matches!(
        reached,
        Err(FabricError::NotEnoughLiveNodes { .. })
    ));
    assert_eq!(f.engine().park_stats(), ParkStats::default());
}

#[test]
fn post_failures_kill_the_node() {
    let f = fabric(2, 4096, 64, 1);
    f.engine().nic_mut().qp(1).refuse_posts(libc::EINVAL, 0);
    let t = f.post(NodeId(1), Batch::read(0, 8));
    assert_eq!(
        f.poll(t),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(1),
            cause: FailureCause::Disconnected
        }))
    );
    assert!(f.engine().is_dead(NodeId(1)));
    assert_eq!(
        f.engine().staging_in_use(),
        0,
        "nothing was posted: slice returned"
    );
    // A partial post keeps its slice away from later chains.
    f.engine().nic_mut().qp(0).refuse_posts(libc::ENOMEM, 1);
    let mut batch = Batch::new();
    batch.push(Op::Read { addr: 0, len: 8 }).unwrap();
    batch.push(Op::Read { addr: 8, len: 8 }).unwrap();
    let t = f.post(NodeId(0), batch);
    assert!(matches!(
        f.poll(t),
        Poll::Ready(Err(FabricError::NodeFailed { .. }))
    ));
    assert_eq!(f.engine().staging_in_use(), 16);
}

#[test]
fn rejected_batches_never_reach_the_nic() {
    let f = fabric(2, 64, 64, 1);
    let cases = [
        (NodeId(5), Batch::read(0, 8)),
        (NodeId(0), Batch::read(SIZE as u64, 1)),
        (NodeId(0), Batch::cas(3, 0, 1)),
        // Needs 72 staging bytes, the client registered 64.
        (NodeId(0), Batch::read(0, 72)),
    ];
    for (node, batch) in cases {
        let t = f.post(node, batch);
        assert!(matches!(f.poll(t), Poll::Ready(Err(_))), "{node}");
    }
    let t = f.post(NodeId(0), Batch::new());
    assert_eq!(f.poll(t), Poll::Ready(Ok(Completion::new())));
    assert_eq!(f.engine().in_flight(), 0);
    assert!(!f.progress());
}

/// Over soft-RoCE, every `swarm put` stalled at client start: `progress` reported
/// "nothing pending" in the very call that delivered a roundtrip's last
/// completions, and the executor took it for a stall before the operation could
/// post its next step. Whether it made progress is what `progress` must say.
#[test]
fn progress_that_delivers_the_last_completion_reports_progress() {
    let f = fabric(2, 64, 64, 1);
    let stats = OpStats::new();
    // Three sequential roundtrips in one operation, as `register` does.
    let result = swarm_core::block_on(&f, async {
        for step in 0..3u64 {
            let mut rt = Roundtrip::start(&f, &stats);
            rt.post(NodeId(0), Batch::cas(0, step, step + 1))?;
            rt.post(NodeId(1), Batch::read(0, 8))?;
            rt.wait(2).await?;
        }
        Ok::<_, FabricError>(stats.roundtrips())
    });
    assert_eq!(result, Ok(3));
    // A lone batch: the call that delivers it says so; the next finds nothing.
    let t = f.post(NodeId(0), Batch::read(0, 8));
    assert!(f.progress(), "the call that delivered the completion");
    assert!(matches!(f.poll(t), Poll::Ready(Ok(_))));
    assert!(!f.progress(), "nothing left");
}

#[test]
fn unconnected_nodes_are_failed_from_the_start() {
    let nic = EmuNic::with_connections(vec![None, None], 4096, CasReplyOrder::Native, 1)
        .expect("the staging buffer is mapped");
    let f = EngineFabric::new(Engine::new(nic, vec![None, None]));
    let t = f.post(NodeId(0), Batch::read(0, 8));
    assert!(matches!(
        f.poll(t),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(0),
            ..
        }))
    ));
}

#[test]
fn forgotten_background_writes_still_execute_and_free_their_slices() {
    let f = fabric(1, 4096, 64, 9);
    for i in 0..20u64 {
        let t = f.post(NodeId(0), Batch::write(i * 64, vec![i as u8 + 1; 64]));
        f.forget(t);
    }
    while f.progress() {}
    let t = f.post(NodeId(0), Batch::read(0, 20 * 64));
    let read = wait(&f, t).unwrap();
    let bytes = read.read(0).unwrap();
    for i in 0..20 {
        assert!(
            bytes[i * 64..(i + 1) * 64]
                .iter()
                .all(|&b| b == i as u8 + 1)
        );
    }
    assert_eq!(f.engine().staging_in_use(), 0);
}

#[test]
fn waiting_chains_keep_their_posting_order() {
    // 64 staging bytes: one 40-byte staged write fits at a time, the others wait.
    let f = fabric(1, 64, 64, 11);
    let tickets: Vec<_> = (1..=10u8)
        .map(|i| f.post(NodeId(0), Batch::write(128, vec![i; 40])))
        .collect();
    assert_eq!(f.engine().in_flight(), 1);
    let read = f.post(NodeId(0), Batch::read(128, 40));
    for t in tickets {
        assert!(wait(&f, t).is_ok());
    }
    assert_eq!(wait(&f, read).unwrap().read(0), Some(&[10u8; 40][..]));
    // Send-queue credits: a depth of 4 holds one 4-request chain at a time.
    let f = fabric(1, 4096, 4, 11);
    let four = || {
        let mut b = Batch::new();
        for i in 0..4 {
            b.push(Op::Read {
                addr: i * 8,
                len: 8,
            })
            .unwrap();
        }
        b
    };
    let (a, b) = (f.post(NodeId(0), four()), f.post(NodeId(0), four()));
    assert_eq!(f.engine().in_flight(), 1);
    assert!(wait(&f, a).is_ok() && wait(&f, b).is_ok());
}

#[test]
fn a_queued_batch_past_its_deadline_is_fenced_and_never_lands() {
    // 64 staging bytes: the first 40-byte write takes the staging, the second waits
    // behind it in the engine's queue, not on the queue pair.
    let f = fabric(1, 64, 64, 13);
    let first = f.post(NodeId(0), Batch::write(128, vec![1; 40]));
    let mut late = Batch::write(256, vec![2; 40]);
    late.set_deadline(Some(f.now()));
    let late = f.post(NodeId(0), late);
    let mut open = Batch::write(512, vec![3; 40]);
    open.set_deadline(Some(u64::MAX));
    let open = f.post(NodeId(0), open);
    assert_eq!(f.engine().in_flight(), 1, "the others wait for staging");
    // The deadline passes while the batch is queued.
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(wait(&f, first).is_ok());
    assert_eq!(wait(&f, late), Err(FabricError::Fenced));
    assert!(
        wait(&f, open).is_ok(),
        "a batch within its deadline is posted"
    );
    let memory = memory(&f, 0);
    assert!(memory[256..296].iter().all(|&b| b == 0), "never written");
    assert!(memory[512..552].iter().all(|&b| b == 3));
}

#[test]
fn progress_reports_deadlines() {
    let f = fabric(1, 4096, 64, 1);
    assert!(!f.progress());
    f.wake_at(f.now() + 50_000_000);
    assert!(f.progress());
}

/// A ticket that fails never lands afterwards, whatever failed its node: a chain
/// held by a silent queue pair when the fabric fails the node for another reason (a
/// cut notice, a lease watch that would not arm) is aborted with it, so it does not
/// land once the queue pair wakes up. A write-back guard goes down on such a failure
/// (`swarm_core::write_back_guard`, "The lower").
#[test]
fn a_chain_failed_with_its_node_never_lands_afterwards() {
    let f = fabric(3, 4096, 64, 31);
    f.engine().nic_mut().set_mode(2, Mode::Silent);
    let held = f.post(NodeId(2), Batch::write(128, vec![7; 8]));
    for _ in 0..10 {
        f.progress();
    }
    assert!(f.poll(held).is_pending(), "held by the silent queue pair");
    f.engine().fail_node(NodeId(2));
    assert!(matches!(f.poll(held), Poll::Ready(Err(_))));
    // The queue pair wakes up: what it held was flushed, nothing lands.
    f.engine().nic_mut().set_mode(2, Mode::Up);
    for _ in 0..10 {
        f.progress();
    }
    assert_eq!(&memory(&f, 2)[128..136], &[0; 8], "the failed write landed");
}
