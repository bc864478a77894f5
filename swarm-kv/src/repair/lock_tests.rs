//! A stopped repair while a second repair of the same node runs (docs/pauses.md, H3
//! part c): the stopped repair's configuration records are plain writes, and landing
//! late they must never replace the configuration a later repair admitted. And a
//! repair that fails after its announcement withdraws it.

use core::cell::{Cell, RefCell};
use core::task::Poll;

use swarm_core::fabric::{Completion, FailNodes, Op, Ticket};
use swarm_core::{Batch, Fabric, FabricError, MemFabric, NodeId, OpStats, block_on_future};

use super::{RepairError, RepairOptions, read_configuration_within, repair_node};
use crate::configuration::{CONFIG_AT, Configuration, REPAIR_LOCK_AT};
use crate::store::write_configuration;
use crate::test_support::{MS, poll_once, small_cluster};

/// A repair's fabric that, once armed, holds every batch that writes a configuration
/// record, unapplied and unanswered, until [`HoldRecords::land`]: the repair was
/// stopped (SIGSTOP, a long preemption) after its fence and before its record posts
/// reached the nodes.
struct HoldRecords {
    inner: MemFabric,
    armed: Cell<bool>,
    held: RefCell<Vec<Held>>,
}

/// A batch held unapplied (taken when it lands), and its inner ticket once landed.
type Held = (Option<(NodeId, Batch)>, Option<Ticket>);

const HELD: u32 = 1 << 31;

impl HoldRecords {
    fn new(inner: MemFabric) -> Self {
        Self {
            inner,
            armed: Cell::new(true),
            held: RefCell::default(),
        }
    }

    fn holding(&self) -> usize {
        self.held.borrow().iter().filter(|e| e.0.is_some()).count()
    }

    /// The repair wakes up: its held records land now, in posting order.
    fn land(&self) {
        self.armed.set(false);
        for entry in self.held.borrow_mut().iter_mut() {
            if let Some((node, batch)) = entry.0.take() {
                entry.1 = Some(self.inner.post(node, batch));
            }
        }
    }
}

impl Fabric for HoldRecords {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let record = batch
            .ops()
            .iter()
            .any(|op| matches!(op, Op::Write { addr, .. } if *addr == CONFIG_AT));
        if self.armed.get() && record {
            let mut held = self.held.borrow_mut();
            held.push((Some((node, batch)), None));
            return Ticket(HELD | (held.len() as u32 - 1));
        }
        self.inner.post(node, batch)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        if ticket.0 & HELD == 0 {
            return self.inner.poll(ticket);
        }
        match self.held.borrow()[(ticket.0 & !HELD) as usize].1 {
            Some(inner) => self.inner.poll(inner),
            None => Poll::Pending,
        }
    }
    fn forget(&self, ticket: Ticket) {
        if ticket.0 & HELD == 0 {
            self.inner.forget(ticket);
        } else if let Some(inner) = self.held.borrow()[(ticket.0 & !HELD) as usize].1 {
            self.inner.forget(inner);
        }
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn wake_at(&self, deadline: u64) {
        self.inner.wake_at(deadline);
    }
}

const NO_WAIT: RepairOptions = RepairOptions {
    quiesce_ns: Some(0),
    replace: false,
    ..RepairOptions::DEFAULT
};

/// The configuration that a new client which hears only `nodes` adopts.
fn opened_with(cluster: &swarm_core::MemCluster, nodes: &[u16]) -> Configuration {
    let f = FailNodes::new(cluster.client());
    for n in (0..3).filter(|n| !nodes.contains(n)) {
        f.fail_node(NodeId(n));
    }
    block_on_future(&f, read_configuration_within(&f, &OpStats::new(), 3, 1, MS))
        .expect("a run")
        .expect("a configuration")
}

/// Repair r1 of node 2 (its memory now incarnation 21) is stopped with its
/// announcement posted and not landed. A second repair r2 of node 2 (incarnation 22,
/// the file replaced meanwhile, say) runs. Then r1 wakes up and its announcement
/// lands on the donors. A new client that hears the donors (a majority) must then
/// adopt a configuration that admits what a repair admitted last, and that
/// announces no repair which no longer runs. Before the fix, r2 admitted 22 at epoch
/// 3 and r1's late announcement put epoch 2 back on both donors: a client opening
/// with them left node 2 out (incarnation 13 listed) and journaled its resets for a
/// repair that no longer ran. With the fix, r2 refuses while r1 holds the repair
/// lock and runs, and r1 finishes.
#[test]
fn a_stopped_repairs_late_record_never_replaces_a_later_admission() {
    let (cluster, layout) = small_cluster(400 * MS);
    write_configuration(&cluster.client(), &Configuration::new(1, vec![11, 12, 13]))
        .expect("configuration");
    let r1_fabric = HoldRecords::new(cluster.client());
    let mut r1 = core::pin::pin!(repair_node(
        &r1_fabric,
        &layout,
        NodeId(2),
        21,
        NO_WAIT,
        |_, _| {}
    ));
    for _ in 0..1000 {
        assert!(poll_once(r1.as_mut()).is_pending(), "r1 is stopped");
        if r1_fabric.holding() > 0 {
            break;
        }
        r1_fabric.progress();
    }
    assert!(r1_fabric.holding() > 0, "r1 posted its announcement");

    let f = cluster.client();
    let r2 = block_on_future(
        &f,
        repair_node(&f, &layout, NodeId(2), 22, NO_WAIT, |_, _| {}),
    )
    .expect("a run");
    let admitted_by_r2 = match r2 {
        Ok(report) => Some(report.epoch),
        Err(RepairError::Locked { .. }) => None,
        Err(other) => panic!("r2: unexpected error {other}"),
    };

    // r1 wakes up: its announcement lands on the donors.
    r1_fabric.land();
    r1_fabric.progress();
    if let Some(epoch) = admitted_by_r2 {
        let seen = opened_with(&cluster, &[0, 1]);
        assert!(
            seen.epoch >= epoch && seen.admits(2, 22) && !seen.is_repairing(2),
            "a client opening with the donors adopts {seen:?}, below r2's admission at epoch {epoch}"
        );
    }
    let r1 = loop {
        if let Poll::Ready(result) = poll_once(r1.as_mut()) {
            break result;
        }
        r1_fabric.progress();
    };
    let member = match (r1, admitted_by_r2) {
        (Ok(_), None) => 21,
        (Ok(_), Some(_)) => 21,
        (Err(_), Some(_)) => 22,
        (Err(error), None) => panic!("neither repair admitted the node: {error}"),
    };
    // Every majority agrees on what the repair that finished last admitted.
    for nodes in [[0, 1], [0, 2], [1, 2]] {
        let seen = opened_with(&cluster, &nodes);
        assert!(
            seen.admits(2, member) && !seen.is_repairing(2),
            "a client opening with nodes {nodes:?} adopts {seen:?}"
        );
    }
}

/// The lock words of nodes 0 to 2.
fn lock_words(cluster: &swarm_core::MemCluster) -> Vec<u64> {
    let f = cluster.client();
    (0..3u16)
        .map(|n| {
            block_on_future(&f, async {
                let s = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(&f, &s);
                rt.post(NodeId(n), Batch::read(REPAIR_LOCK_AT, 8)).unwrap();
                rt.wait(1).await.unwrap();
                let bytes = rt.replies()[0].1.read(0).unwrap();
                u64::from_le_bytes(bytes.try_into().unwrap())
            })
            .unwrap()
        })
        .collect()
}

/// A repair that died holding the lock (its process gone) leaves its token on the
/// donors. Where this host can tell that its process is gone (shared memory), the
/// next repair takes the lock over; where it cannot (RDMA), it refuses and writes
/// nothing, unless the operator breaks the lock. Every repair gives the lock back.
#[test]
fn a_lock_is_taken_over_only_from_a_repair_known_gone() {
    let Some(dead) = super::lock::tests::a_gone_processs_token() else {
        eprintln!("no /proc on this host: process liveness is unknown here");
        return;
    };
    let (cluster, layout) = small_cluster(400 * MS);
    write_configuration(&cluster.client(), &Configuration::new(1, vec![11, 12, 13]))
        .expect("configuration");
    let f = cluster.client();
    for n in [0, 1] {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(NodeId(n), Batch::cas(REPAIR_LOCK_AT, 0, dead))
                .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    let run = |options: RepairOptions, incarnation: u64| {
        block_on_future(
            &f,
            repair_node(&f, &layout, NodeId(2), incarnation, options, |_, _| {}),
        )
        .expect("a run")
    };
    let refused = run(NO_WAIT, 21);
    assert!(
        matches!(refused, Err(RepairError::Locked { .. })),
        "this host cannot tell: {refused:?}"
    );
    assert_eq!(opened_with(&cluster, &[0, 1]).epoch, 1, "nothing written");
    assert_eq!(lock_words(&cluster), vec![dead, dead, 0], "nothing taken");

    let on_this_host = RepairOptions {
        liveness: crate::membership::owner_process::OwnerLiveness::ThisHost,
        ..NO_WAIT
    };
    let report = run(on_this_host, 21).expect("the dead repair's lock is taken over");
    assert_eq!(report.epoch, 3);
    assert_eq!(lock_words(&cluster), vec![0, 0, 0], "given back");

    for n in [0, 1] {
        block_on_future(&f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(&f, &s);
            rt.post(NodeId(n), Batch::cas(REPAIR_LOCK_AT, 0, dead))
                .unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }
    let broken = RepairOptions {
        break_lock: true,
        ..NO_WAIT
    };
    let report = run(broken, 31).expect("the operator broke the lock");
    assert_eq!(report.epoch, 5);
    assert_eq!(lock_words(&cluster), vec![0, 0, 0], "given back");
    assert!(opened_with(&cluster, &[0, 1]).admits(2, 31));
}

/// A repair that fails after its announcement (node 2 fails during the copy)
/// withdraws it: every majority's configuration then shows the node out of service
/// with no repairing bit, at a newer epoch, so clients stop journaling their resets
/// for a repair that no longer runs and their registers come back. Before, the bit
/// stayed until another repair of the node ran.
#[test]
fn a_repair_that_fails_before_its_admission_withdraws_its_announcement() {
    let (cluster, layout) = small_cluster(400 * MS);
    write_configuration(&cluster.client(), &Configuration::new(1, vec![11, 12, 13]))
        .expect("configuration");
    // Node 2 fails once the first piece of the copy is written to it.
    let f = FailNodes::new(cluster.client());
    let outcome = block_on_future(
        &f,
        repair_node(&f, &layout, NodeId(2), 21, NO_WAIT, |_, _| {
            f.fail_node_as(NodeId(2), swarm_core::fabric::Crash::Erroring)
        }),
    )
    .expect("a run");
    assert!(
        outcome.is_err(),
        "the copy cannot write node 2: {outcome:?}"
    );
    let seen = opened_with(&cluster, &[0, 1]);
    assert!(
        !seen.is_repairing(2) && !seen.admits(2, 21) && seen.epoch >= 3,
        "a client opening with the donors adopts {seen:?}"
    );
    // The next repair of the node runs as usual and admits it.
    let g = cluster.client();
    let report = block_on_future(
        &g,
        repair_node(&g, &layout, NodeId(2), 21, NO_WAIT, |_, _| {}),
    )
    .expect("a run")
    .expect("the second repair admits the node");
    let seen = opened_with(&cluster, &[0, 1]);
    assert!(seen.admits(2, 21) && !seen.is_repairing(2) && seen.epoch == report.epoch);
}
