//! Fixtures shared by this crate's unit tests: a small formatted in-memory cluster
//! and a client of it.

use swarm_core::{Fabric, FixedClock, MemCluster, MemFabric};

use crate::layout::{ClusterParams, NodeLayout};
use crate::{KvClient, KvConfig};

pub(crate) const MS: u64 = 1_000_000;

/// Three in-memory nodes of `node_bytes` each, formatted with `params` (fitted to
/// the node size).
pub(crate) fn cluster_with(params: ClusterParams, node_bytes: usize) -> (MemCluster, NodeLayout) {
    let params = params
        .for_node_size(node_bytes as u64)
        .expect("the parameters fit the node size");
    let layout = NodeLayout::new(params).expect("a valid layout");
    let cluster = MemCluster::new(3, node_bytes);
    crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
    (cluster, layout)
}

/// The small cluster of the recycling tests: 1 MiB nodes, keys and values of up to
/// 16 B, 4 writers, chunks of 4 registers, a lease of `lease_ns` renewed every
/// 20 ms, and a 50 ms operation fence, hence a short grace (each client's in-memory
/// fabric has its own logical clock).
pub(crate) fn small_cluster(lease_ns: u64) -> (MemCluster, NodeLayout) {
    let params = ClusterParams {
        key_max: 16,
        value_max: 16,
        writers: 4,
        chunk_registers: 4,
        lease_ns,
        lease_renew_ns: 20 * MS,
        max_op_ns: 50 * MS,
        cache_ttl_ns: 10 * MS,
        ..ClusterParams::default()
    };
    cluster_with(params, 1 << 20)
}

/// The layout of a 1 MiB node with keys and values of up to 16 B, 4 writers and
/// chunks of 4 registers (no cluster formatted: the allocation tests' fixture).
pub(crate) fn small_layout() -> NodeLayout {
    let params = ClusterParams {
        key_max: 16,
        value_max: 16,
        writers: 4,
        chunk_registers: 4,
        ..ClusterParams::default()
    }
    .for_node_size(1 << 20)
    .expect("the parameters fit the node size");
    NodeLayout::new(params).expect("a valid layout")
}

/// A client of `cluster` with writer preference 0. Every client reads the same
/// frozen clock: without resuming its writer id's log, a later one would guess the
/// very timestamps (and slots) an earlier one used.
pub(crate) fn connect(cluster: &MemCluster, layout: NodeLayout) -> KvClient<MemFabric, FixedClock> {
    KvClient::connect(
        cluster.client(),
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a free writer id")
}

/// The census of the registers of `client`'s cluster (3 replicas), as a reclamation
/// pass sees them (`crate::registers::limbo::census`).
pub(crate) fn census_of(
    client: &KvClient<MemFabric, FixedClock>,
) -> crate::registers::limbo::Census {
    let layout = *client.layout();
    swarm_core::block_on(
        client.fabric(),
        crate::registers::limbo::census(client.fabric(), &layout, |r| {
            crate::client::register_loc_for(&layout, 3, r).ok()
        }),
    )
    .expect("a census")
}

/// A fabric that holds the batches it is given for some nodes, unapplied and
/// unanswered, until [`Holding::land`]: its client was stopped (SIGSTOP, a long
/// preemption) between two posts of one step. A step reads the clock once per
/// burst of posts (`Roundtrip::may_post`), so the held posts passed their fence
/// check before the pause.
pub(crate) struct Holding {
    inner: swarm_core::MemFabric,
    hold: core::cell::RefCell<Vec<swarm_core::NodeId>>,
    /// With `Some(n)`: `n` more posts go through, and every later one is held.
    passes: core::cell::Cell<Option<usize>>,
    /// The node of the last post that went through.
    pub(crate) last_passed: core::cell::Cell<Option<swarm_core::NodeId>>,
    held: core::cell::RefCell<Vec<Held>>,
    /// Added to the inner clock: the time the client spent stopped ([`Self::sleep`]).
    slept: core::cell::Cell<u64>,
}

/// A batch held unapplied (taken when it lands), and its inner ticket once landed.
type Held = (
    Option<(swarm_core::NodeId, swarm_core::Batch)>,
    Option<swarm_core::fabric::Ticket>,
);

const HELD: u32 = 1 << 31;

impl Holding {
    pub(crate) fn new(inner: swarm_core::MemFabric, hold: &[u16]) -> Self {
        Self {
            inner,
            hold: core::cell::RefCell::new(hold.iter().copied().map(swarm_core::NodeId).collect()),
            passes: core::cell::Cell::new(None),
            last_passed: core::cell::Cell::new(None),
            held: core::cell::RefCell::default(),
            slept: core::cell::Cell::new(0),
        }
    }

    /// `ns` pass on the client's clock while it is stopped.
    pub(crate) fn sleep(&self, ns: u64) {
        self.slept.set(self.slept.get() + ns);
    }

    /// The client stops after `posts` more posts: every later batch is held.
    pub(crate) fn stop_after(&self, posts: usize) {
        self.passes.set(Some(posts));
    }

    /// The nodes of the batches held now, distinct.
    pub(crate) fn held_nodes(&self) -> Vec<swarm_core::NodeId> {
        let mut nodes: Vec<swarm_core::NodeId> = self
            .held
            .borrow()
            .iter()
            .filter_map(|e| e.0.as_ref().map(|(n, _)| *n))
            .collect();
        nodes.sort_unstable_by_key(|n| n.0);
        nodes.dedup();
        nodes
    }

    /// The client wakes up: its held batches land now, in posting order.
    pub(crate) fn land(&self) {
        self.hold.borrow_mut().clear();
        self.passes.set(None);
        for entry in self.held.borrow_mut().iter_mut() {
            if let Some((node, batch)) = entry.0.take() {
                entry.1 = Some(self.inner.post(node, batch));
            }
        }
    }
}

impl swarm_core::Fabric for Holding {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(
        &self,
        node: swarm_core::NodeId,
        batch: swarm_core::Batch,
    ) -> swarm_core::fabric::Ticket {
        let stopped = match self.passes.get() {
            Some(0) => true,
            Some(n) => {
                self.passes.set(Some(n - 1));
                false
            }
            None => false,
        };
        if stopped || self.hold.borrow().contains(&node) {
            let mut held = self.held.borrow_mut();
            held.push((Some((node, batch)), None));
            return swarm_core::fabric::Ticket(HELD | (held.len() as u32 - 1));
        }
        self.last_passed.set(Some(node));
        self.inner.post(node, batch)
    }
    fn poll(
        &self,
        ticket: swarm_core::fabric::Ticket,
    ) -> core::task::Poll<Result<swarm_core::fabric::Completion, swarm_core::FabricError>> {
        if ticket.0 & HELD == 0 {
            return self.inner.poll(ticket);
        }
        match self.held.borrow()[(ticket.0 & !HELD) as usize].1 {
            Some(inner) => self.inner.poll(inner),
            None => core::task::Poll::Pending,
        }
    }
    fn forget(&self, ticket: swarm_core::fabric::Ticket) {
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
        self.inner.now() + self.slept.get()
    }
    fn wake_at(&self, deadline: u64) {
        self.inner
            .wake_at(deadline.saturating_sub(self.slept.get()));
    }
}

/// A fabric whose client stops right after some of its posts landed, before it read
/// their answers: on shared memory a batch executes inside the call that posts it, so
/// a client stopped (SIGSTOP, a long preemption) after its posts has changed memory
/// that it has not seen the result of. After [`Muted::mute_after`]`(n)`, `n` more
/// posts are answered as usual; every later one to a node not named by `slow` executes
/// at once but its completion stays unread until [`Muted::wake`], and every later one
/// to a `slow` node waits unapplied until then (it was still on its way).
pub(crate) struct Muted {
    inner: swarm_core::MemFabric,
    slow: Vec<swarm_core::NodeId>,
    /// With `Some(n)`: `n` more posts are answered, every later one is muted.
    passes: core::cell::Cell<Option<usize>>,
    /// Tickets of posts that landed while the client was stopped.
    unread: core::cell::RefCell<Vec<swarm_core::fabric::Ticket>>,
    /// Posts to slow nodes while the client was stopped: the batch until it lands,
    /// then the inner ticket.
    held: core::cell::RefCell<Vec<Held>>,
    /// Added to the inner clock: the time the client spent stopped ([`Self::sleep`]).
    slept: core::cell::Cell<u64>,
}

impl Muted {
    pub(crate) fn new(inner: swarm_core::MemFabric, slow: &[u16]) -> Self {
        Self {
            inner,
            slow: slow.iter().copied().map(swarm_core::NodeId).collect(),
            passes: core::cell::Cell::new(None),
            unread: core::cell::RefCell::default(),
            held: core::cell::RefCell::default(),
            slept: core::cell::Cell::new(0),
        }
    }

    /// The client stops after `posts` more answered posts.
    pub(crate) fn mute_after(&self, posts: usize) {
        self.passes.set(Some(posts));
    }

    /// Whether the client stopped with posts it has not read the answers of.
    pub(crate) fn stopped(&self) -> bool {
        !self.unread.borrow().is_empty() || self.held.borrow().iter().any(|h| h.0.is_some())
    }

    /// `ns` pass on the client's clock while it is stopped.
    pub(crate) fn sleep(&self, ns: u64) {
        self.slept.set(self.slept.get() + ns);
    }

    /// The client wakes up: its posts to slow nodes land, in posting order, and it
    /// reads the answers of all its posts.
    pub(crate) fn wake(&self) {
        self.passes.set(None);
        self.unread.borrow_mut().clear();
        for entry in self.held.borrow_mut().iter_mut() {
            if let Some((node, batch)) = entry.0.take() {
                entry.1 = Some(self.inner.post(node, batch));
            }
        }
    }
}

impl swarm_core::Fabric for Muted {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(
        &self,
        node: swarm_core::NodeId,
        batch: swarm_core::Batch,
    ) -> swarm_core::fabric::Ticket {
        match self.passes.get() {
            Some(0) if self.slow.contains(&node) => {
                let mut held = self.held.borrow_mut();
                held.push((Some((node, batch)), None));
                return swarm_core::fabric::Ticket(HELD | (held.len() as u32 - 1));
            }
            Some(0) => {
                let ticket = self.inner.post(node, batch);
                self.unread.borrow_mut().push(ticket);
                return ticket;
            }
            Some(n) => self.passes.set(Some(n - 1)),
            None => {}
        }
        self.inner.post(node, batch)
    }
    fn poll(
        &self,
        ticket: swarm_core::fabric::Ticket,
    ) -> core::task::Poll<Result<swarm_core::fabric::Completion, swarm_core::FabricError>> {
        if ticket.0 & HELD != 0 {
            return match self.held.borrow()[(ticket.0 & !HELD) as usize].1 {
                Some(inner) => self.inner.poll(inner),
                None => core::task::Poll::Pending,
            };
        }
        if self.unread.borrow().contains(&ticket) {
            return core::task::Poll::Pending;
        }
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: swarm_core::fabric::Ticket) {
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
        self.inner.now() + self.slept.get()
    }
    fn wake_at(&self, deadline: u64) {
        self.inner
            .wake_at(deadline.saturating_sub(self.slept.get()));
    }
}

/// Polls `future` once.
pub(crate) fn poll_once<T>(
    future: core::pin::Pin<&mut impl Future<Output = T>>,
) -> core::task::Poll<T> {
    future.poll(&mut core::task::Context::from_waker(
        core::task::Waker::noop(),
    ))
}

/// Two clients of a fresh [`small_cluster`] with a 400 ms lease: `a` behind a
/// [`Muted`] fabric whose posts to `slow` wait unapplied once it stops, `b` plain.
/// With `used`, `b` inserts and deletes `k` first, so that an insert of `k` reads its
/// buckets rather than trying a blind round. The tests of an insert stopped
/// mid-way (`client::publish_tests`, `client::undecided_tests`).
pub(crate) fn stoppable_pair(
    used: bool,
    slow: Option<u16>,
) -> (
    MemCluster,
    KvClient<Muted, FixedClock>,
    KvClient<MemFabric, FixedClock>,
) {
    let (cluster, layout) = small_cluster(400 * MS);
    let held: Vec<u16> = slow.into_iter().collect();
    let a = KvClient::connect(
        Muted::new(cluster.client(), &held),
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a writer id");
    let b = KvClient::connect(
        cluster.client(),
        FixedClock(1_000),
        layout,
        KvConfig::new(0, 1),
    )
    .expect("a writer id");
    if used {
        let s = swarm_core::OpStats::new();
        swarm_core::block_on(b.fabric(), b.insert(b"k", b"old", &s)).expect("an insert");
        let deleted = swarm_core::block_on(b.fabric(), b.delete(b"k", &s)).expect("a delete");
        assert_eq!(deleted, swarm_core::DeleteOutcome::Removed);
    }
    (cluster, a, b)
}

/// Polls `op` of the client behind `fabric` until that client stops (its posts
/// after [`Muted::mute_after`] land unanswered); `false` if `op` finished first.
pub(crate) fn run_until_stopped<T>(
    fabric: &Muted,
    mut op: core::pin::Pin<&mut impl Future<Output = T>>,
) -> bool {
    while !fabric.stopped() {
        if poll_once(op.as_mut()).is_ready() {
            return false;
        }
        fabric.progress();
    }
    true
}
