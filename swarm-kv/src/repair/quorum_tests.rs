//! A quorum counted across a repair (docs/pauses.md, H3'): the repair's quiescence
//! wait assumes that whatever a client did on an observation of the lost memory has
//! landed on the donors by the end of the wait, which a stopped client breaks.

use swarm_core::fabric::FailNodes;
use swarm_core::{
    Batch, Fabric, FixedClock, NodeId, OpStats, Roundtrip, block_on, block_on_future,
};

use crate::test_support::{Holding, poll_once, small_cluster};
use crate::{KvClient, KvConfig};

const NODE_BYTES: u32 = 1 << 20;

/// A client updates a key. Its write lands on node X, then the client stops before
/// its post to the other replica of its quorum. X loses its memory and is rebuilt
/// from a donor, which does not hold the write, after the repair's quiescence wait
/// (longer than an operation's deadline). The client wakes up: its late post lands,
/// and it could count X's answer from before the loss and the late one. The update
/// must not be acknowledged then (it reports `Fenced`, outcome unknown); if it were,
/// a reader that uses X and the donor must still see it. Before the fix the update
/// returned `Ok(true)` and such a reader got `v1`.
#[test]
fn an_update_counted_across_a_repair_is_never_lost() {
    let (cluster, layout) = small_cluster(400 * crate::test_support::MS);
    let c = KvClient::connect(
        Holding::new(cluster.client(), &[]),
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a writer id");
    let s = OpStats::new();
    block_on(c.fabric(), c.insert(b"k", b"v1", &s)).expect("inserted");
    assert_eq!(
        block_on(c.fabric(), c.get(b"k", &s)).expect("a get"),
        Some(b"v1".to_vec())
    );
    // The update's first post goes through, then c stops.
    c.fabric().stop_after(1);
    let su = OpStats::new();
    let mut update = core::pin::pin!(c.update(b"k", b"v2", &su));
    assert!(
        poll_once(update.as_mut()).is_pending(),
        "c stopped mid-step"
    );
    let x = c.fabric().last_passed.get().expect("one post went through");
    let held = c.fabric().held_nodes();
    let donor = (0..3u16)
        .map(NodeId)
        .find(|n| *n != x && !held.contains(n))
        .expect("the step posted to a majority only");
    // X loses its memory and is rebuilt from the donor (a repair's copy, with its
    // quiescence wait over: c has been stopped all along).
    let f = cluster.client();
    let donor_memory = block_on_future(&f, async {
        let s = OpStats::new();
        let mut rt = Roundtrip::start(&f, &s);
        rt.post(donor, Batch::read(0, NODE_BYTES)).unwrap();
        rt.wait(1).await.unwrap();
        rt.replies()[0].1.read(0).unwrap().to_vec()
    })
    .unwrap();
    block_on_future(&f, async {
        let s = OpStats::new();
        let mut rt = Roundtrip::start(&f, &s);
        rt.post(x, Batch::write(0, donor_memory)).unwrap();
        rt.wait(1).await.unwrap();
    })
    .unwrap();
    // c wakes up, the quiescence wait (more than `max_op_ns`) later on its clock.
    c.fabric().sleep(3 * 50 * crate::test_support::MS);
    c.fabric().land();
    let acknowledged = loop {
        if let core::task::Poll::Ready(result) = poll_once(update.as_mut()) {
            break result;
        }
        c.fabric().progress();
    };
    match acknowledged {
        // Counted across the repair: the outcome is unknown, and the caller told so.
        Err(error) if error.is_fenced() => return,
        // Acknowledged: then it must not be lost (checked below).
        Ok(true) => {}
        other => panic!("unexpected outcome of the update: {other:?}"),
    }
    // A reader that hears only X and the donor.
    let reader_fabric = FailNodes::new(cluster.client());
    for node in &held {
        reader_fabric.fail_node(*node);
    }
    let r = KvClient::connect(
        reader_fabric,
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a writer id");
    let got = block_on(r.fabric(), r.get(b"k", &OpStats::new()));
    assert_eq!(
        got.expect("a get"),
        Some(b"v2".to_vec()),
        "an acknowledged update was lost"
    );
}
