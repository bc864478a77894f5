//! The emulated provider under the real planner, `post_chain` and engine.

use std::task::Poll;

use proptest::prelude::*;
use rdma_sys::ibv_wc_status as s;
use swarm_core::fabric::{Batch, Completion, FabricError, FailureCause, NodeId, Op};
use swarm_core::{Fabric, MemCluster, Ticket};

use super::*;
use crate::verbs::cq::WorkCompletion;
use crate::verbs::post::post_chain;
use crate::wr::{self, split_wr_id};

const SIZE: usize = 4096;

fn wait(f: &EmulatedFabric, ticket: Ticket) -> Result<Completion, FabricError> {
    for _ in 0..100_000 {
        if let Poll::Ready(result) = f.poll(ticket) {
            return result;
        }
        f.progress();
    }
    panic!("ticket {ticket:?} never completed");
}

fn batch(ops: Vec<Op>) -> Batch {
    let mut batch = Batch::new();
    for op in ops {
        batch.push(op).unwrap();
    }
    batch
}

fn arb_op() -> impl Strategy<Value = Op> {
    // A small area, so that requests of one batch overlap and reordering shows.
    prop_oneof![
        (0u64..256, 0u32..64).prop_map(|(addr, len)| Op::Read { addr, len }),
        (0u64..256, proptest::collection::vec(any::<u8>(), 0..100)).prop_map(|(addr, data)| {
            Op::Write {
                addr,
                data: data.into(),
            }
        }),
        (0u64..8, 0u64..3, 0u64..3).prop_map(|(w, expected, new)| Op::Cas {
            addr: w * 8,
            expected,
            new
        }),
    ]
}

fn arb_batch() -> impl Strategy<Value = (u16, Batch)> {
    (0u16..3, proptest::collection::vec(arb_op(), 1..=4)).prop_map(|(node, ops)| (node, batch(ops)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// With strict read ordering the planner fences every request whose order
    /// matters, so however far the emulator lets unfenced requests overtake, each
    /// batch gives what executing it alone and in order gives. A planner that
    /// forgets the FENCE after a CAS fails this (its next update overtakes). The
    /// seed of the schedule is part of the (printed) failing input.
    #[test]
    fn fenced_chains_give_program_order_however_requests_overtake(
        batches in proptest::collection::vec(arb_batch(), 1..24),
        seed: u64,
    ) {
        let options = EmuOptions { ordering: ReadOrdering::Strict, ..EmuOptions::default() };
        let cluster = EmulatedCluster::new(3, SIZE, options);
        let f = cluster.client(seed).unwrap();
        f.engine().nic_mut().overtake_percent = 100;
        let reference = MemCluster::new(3, SIZE).client();
        for (node, batch) in &batches {
            // One batch at a time: batches are not ordered with each other.
            let got = wait(&f, f.post(NodeId(*node), batch.clone()));
            let expected = reference.post(NodeId(*node), batch.clone());
            let Poll::Ready(expected) = reference.poll(expected) else { unreachable!() };
            prop_assert_eq!(got, expected);
        }
        let engine = f.engine();
        prop_assert_eq!(engine.in_flight(), 0);
        prop_assert_eq!(engine.staging_in_use(), 0);
    }
}

#[test]
fn a_crash_in_the_middle_of_a_chain_fails_the_batch_and_flushes_the_rest() {
    let cluster = EmulatedCluster::new(3, SIZE, EmuOptions::default());
    let f = cluster.client(1).unwrap();
    // The first request of the next chain executes, the second finds the node gone.
    f.engine().nic_mut().set_mode(0, Mode::CrashAfter(1));
    let three = batch(vec![
        Op::Write {
            addr: 64,
            data: vec![9; 8].into(),
        },
        Op::Cas {
            addr: 8,
            expected: 0,
            new: 1,
        },
        Op::Read { addr: 64, len: 8 },
    ]);
    let error = wait(&f, f.post(NodeId(0), three)).unwrap_err();
    assert_eq!(
        error,
        FabricError::NodeFailed {
            node: NodeId(0),
            cause: FailureCause::Transport(s::IBV_WC_RETRY_EXC_ERR)
        }
    );
    for _ in 0..100 {
        f.progress();
    }
    {
        let engine = f.engine();
        assert!(engine.is_dead(NodeId(0)));
        assert_eq!(engine.in_flight(), 0, "the flushed request reported back");
        assert_eq!(engine.staging_in_use(), 0);
    }
    // The first request did execute (a crash does not undo what landed).
    cluster.nodes()[0].with(|bytes| assert_eq!(&bytes[64..72], &[9; 8]));
    cluster.nodes()[0].with(|bytes| assert_eq!(&bytes[8..16], &[0; 8]));
    // Later batches fail at once; the other nodes serve.
    assert!(wait(&f, f.post(NodeId(0), Batch::read(0, 8))).is_err());
    assert!(wait(&f, f.post(NodeId(1), Batch::read(0, 8))).is_ok());
}

#[test]
fn a_queue_pair_holding_a_chain_past_the_give_up_limit_is_aborted_and_its_node_failed() {
    let cluster = EmulatedCluster::new(3, SIZE, EmuOptions::default());
    let f = cluster.client(2).unwrap();
    f.engine().set_fail_overdue_after(200_000_000);
    f.engine().nic_mut().set_mode(1, Mode::Silent);
    // Timed from before the post: the chain's age counts from its post, and the
    // thread may be preempted between the post and a later clock read.
    let started = std::time::Instant::now();
    let held = f.post(NodeId(1), Batch::write(64, vec![7; 8]));
    let result = loop {
        if let Poll::Ready(result) = f.poll(held) {
            break result;
        }
        assert!(started.elapsed().as_secs() < 5, "never given up on");
        f.progress();
    };
    assert!(
        started.elapsed().as_millis() >= 200,
        "given up before the limit"
    );
    assert_eq!(
        result,
        Err(FabricError::NodeFailed {
            node: NodeId(1),
            cause: FailureCause::TimedOut
        })
    );
    // Aborted: the held write is flushed, never executed, even once the node
    // would answer again.
    f.engine().nic_mut().set_mode(1, Mode::Up);
    for _ in 0..100 {
        f.progress();
    }
    let engine = f.engine();
    assert!(engine.is_dead(NodeId(1)));
    assert_eq!(engine.lost_chain_failures(), 1);
    assert_eq!(engine.in_flight(), 0, "the flushed request reported back");
    assert_eq!(engine.staging_in_use(), 0);
    cluster.nodes()[1].with(|bytes| assert_eq!(&bytes[64..72], &[0; 8]));
}

/// Posts `batch`'s chain straight to node 0's emulated queue pair and runs it to
/// the end; the completions, in order.
fn post_raw(
    nic: &mut EmuNic,
    region: RemoteRegion,
    batch: &Batch,
    lkey_offset: u32,
) -> Result<Vec<WorkCompletion>, crate::verbs::post::PostFailure> {
    let limits = ChainLimits {
        max_inline: 16,
        max_message: 1 << 30,
        ordering: ReadOrdering::Concurrent,
        cas_reply: CasReplyOrder::Native,
    };
    let chain = wr::plan(NodeId(0), batch, &region, &limits).unwrap();
    let mut slice = nic.staging_slice(0);
    slice.lkey = slice.lkey.wrapping_add(lkey_offset);
    post_chain(nic.qp(0), &chain, batch, slice, 7)?;
    let mut out = Vec::new();
    nic.run(1000, &mut out);
    Ok(out)
}

fn raw_nic(cluster: &EmulatedCluster, depth: u32, max_inline: u32) -> EmuNic {
    EmuNic::new(
        cluster.nodes().to_vec(),
        depth,
        max_inline,
        4096,
        CasReplyOrder::Native,
        3,
    )
    .unwrap()
}

fn region_of(node: &EmuNode) -> RemoteRegion {
    RemoteRegion {
        addr: node.base,
        rkey: node.rkey,
        size: node.size(),
    }
}

#[test]
fn only_signaled_requests_complete_on_success() {
    let cluster = EmulatedCluster::new(1, SIZE, EmuOptions::default());
    let mut nic = raw_nic(&cluster, 16, 16);
    let four = batch(vec![
        Op::Write {
            addr: 0,
            data: vec![1; 8].into(),
        },
        Op::Write {
            addr: 8,
            data: vec![2; 40].into(),
        },
        Op::Cas {
            addr: 0,
            expected: 0,
            new: 1,
        },
        Op::Read { addr: 0, len: 48 },
    ]);
    let out = post_raw(&mut nic, region_of(&cluster.nodes()[0]), &four, 0).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].status, split_wr_id(out[0].wr_id)),
        (s::IBV_WC_SUCCESS, (7, 3))
    );
}

#[test]
fn bad_keys_and_bounds_are_error_completions_then_flushes() {
    let cluster = EmulatedCluster::new(1, SIZE, EmuOptions::default());
    let node = &cluster.nodes()[0];
    let two = batch(vec![
        Op::Read { addr: 0, len: 8 },
        Op::Read { addr: 8, len: 8 },
    ]);
    let statuses = |out: Vec<WorkCompletion>| out.iter().map(|c| c.status).collect::<Vec<_>>();
    // A wrong remote key.
    let mut nic = raw_nic(&cluster, 16, 16);
    let wrong_key = RemoteRegion {
        rkey: node.rkey + 1,
        ..region_of(node)
    };
    let out = post_raw(&mut nic, wrong_key, &two, 0).unwrap();
    assert_eq!(
        statuses(out),
        [s::IBV_WC_REM_ACCESS_ERR, s::IBV_WC_WR_FLUSH_ERR]
    );
    // The queue pair stays in the error state: the next chain is flushed whole.
    let out = post_raw(&mut nic, region_of(node), &two, 0).unwrap();
    assert_eq!(
        statuses(out),
        [s::IBV_WC_WR_FLUSH_ERR, s::IBV_WC_WR_FLUSH_ERR]
    );
    // Past the end of the region (the client believes it is larger).
    let mut nic = raw_nic(&cluster, 16, 16);
    let larger = RemoteRegion {
        size: 2 * SIZE as u64,
        ..region_of(node)
    };
    let beyond = batch(vec![Op::Read {
        addr: SIZE as u64,
        len: 8,
    }]);
    let out = post_raw(&mut nic, larger, &beyond, 0).unwrap();
    assert_eq!(statuses(out), [s::IBV_WC_REM_ACCESS_ERR]);
    // A wrong local key.
    let mut nic = raw_nic(&cluster, 16, 16);
    let out = post_raw(&mut nic, region_of(node), &two, 1).unwrap();
    assert_eq!(
        statuses(out),
        [s::IBV_WC_LOC_PROT_ERR, s::IBV_WC_WR_FLUSH_ERR]
    );
}

#[test]
fn the_send_queue_has_a_depth_and_inline_payloads_a_limit() {
    let cluster = EmulatedCluster::new(1, SIZE, EmuOptions::default());
    let region = region_of(&cluster.nodes()[0]);
    let three = batch(vec![
        Op::Read { addr: 0, len: 8 },
        Op::Read { addr: 8, len: 8 },
        Op::Read { addr: 16, len: 8 },
    ]);
    let mut nic = raw_nic(&cluster, 2, 16);
    let failure = post_raw(&mut nic, region, &three, 0).unwrap_err();
    assert_eq!((failure.errno, failure.posted), (libc::ENOMEM, 2));
    // The planner inlines up to 16 bytes; this queue pair takes 4.
    let mut nic = raw_nic(&cluster, 16, 4);
    let small = batch(vec![Op::Write {
        addr: 0,
        data: vec![1; 8].into(),
    }]);
    let failure = post_raw(&mut nic, region, &small, 0).unwrap_err();
    assert_eq!((failure.errno, failure.posted), (libc::EINVAL, 0));
}

#[test]
fn big_endian_cas_replies_are_right_only_when_decoded_as_such() {
    let cas = |device, decode| {
        let options = EmuOptions {
            device_cas_reply: device,
            decode_cas_reply: decode,
            ..EmuOptions::default()
        };
        let cluster = EmulatedCluster::new(1, SIZE, options);
        cluster.nodes()[0]
            .with(|bytes| bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_ne_bytes()));
        let f = cluster.client(5).unwrap();
        let done = wait(
            &f,
            f.post(
                NodeId(0),
                batch(vec![Op::Cas {
                    addr: 8,
                    expected: 0x0102_0304_0506_0708,
                    new: 7,
                }]),
            ),
        )
        .unwrap();
        // Memory is right whatever the reply's byte order.
        cluster.nodes()[0].with(|bytes| assert_eq!(&bytes[8..16], &7u64.to_ne_bytes()));
        done.cas(0).unwrap()
    };
    use CasReplyOrder::{BigEndian, Native};
    assert_eq!(cas(Native, Native), 0x0102_0304_0506_0708);
    assert_eq!(cas(BigEndian, BigEndian), 0x0102_0304_0506_0708);
    assert_eq!(
        cas(BigEndian, Native),
        0x0807_0605_0403_0201,
        "undetected mlx4 quirk"
    );
}

#[test]
fn a_silent_node_keeps_its_batches_outstanding() {
    let cluster = EmulatedCluster::new(3, SIZE, EmuOptions::default());
    let f = cluster.client(9).unwrap();
    f.engine().nic_mut().set_mode(2, Mode::Silent);
    let stuck = f.post(NodeId(2), Batch::read(0, 8));
    assert!(wait(&f, f.post(NodeId(1), Batch::read(0, 8))).is_ok());
    for _ in 0..1000 {
        f.progress();
    }
    assert!(f.poll(stuck).is_pending());
}

/// The self-test's loopback on the emulator: node 0 is the target memory.
struct EmuLoopback {
    nic: EmuNic,
    target: RemoteRegion,
}

impl crate::verbs::selftest::Loopback for EmuLoopback {
    type Queue = EmuQp;

    fn queue(&self) -> &EmuQp {
        self.nic.qp(0)
    }

    fn target(&self) -> RemoteRegion {
        self.target
    }

    fn max_inline(&self) -> u32 {
        16
    }

    fn staging(&mut self) -> (crate::verbs::post::StagingSlice, &mut [u8]) {
        let slice = self.nic.staging_slice(0);
        (
            slice,
            crate::fabric::engine::Nic::staging_mut(&mut self.nic, 0, 64),
        )
    }

    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32> {
        crate::fabric::engine::Nic::poll(&mut self.nic, out)
    }
}

#[test]
fn the_cas_self_test_tells_native_from_big_endian_and_refuses_garbage() {
    use crate::verbs::selftest::cas_byte_order;
    let run = |device: CasReplyOrder, broken: bool| {
        let cluster = EmulatedCluster::new(1, SIZE, EmuOptions::default());
        let mut nic = EmuNic::new(cluster.nodes().to_vec(), 16, 16, 4096, device, 11).unwrap();
        nic.broken_cas_replies = broken;
        nic.overtake_percent = 100;
        let target = region_of(&cluster.nodes()[0]);
        cas_byte_order(&mut EmuLoopback { nic, target }, "emu0")
    };
    assert_eq!(
        run(CasReplyOrder::Native, false).unwrap(),
        CasReplyOrder::Native
    );
    assert_eq!(
        run(CasReplyOrder::BigEndian, false).unwrap(),
        CasReplyOrder::BigEndian
    );
    let error = run(CasReplyOrder::Native, true).unwrap_err().to_string();
    assert!(
        error.contains("emu0") && error.contains("CAS self-test"),
        "{error}"
    );
}
