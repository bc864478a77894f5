//! The lease owner's I/O: renewals posted in the background of a client's
//! operations, and the synchronous renewal an operation falls back to when the lease
//! is about to run out (the arithmetic and the argument are in [`crate::membership::lease`]).
//!
//! A renewal is one batch per node, `[CAS lease word expected → next, read the claim
//! word, read the configuration epoch, write the owner's wall clock (row word 5,
//! informational: `swarm stat`; only once the owner is fenced,
//! [`LeaseHolder::fenced`])]`: it counts on a node only if the CAS swapped and the claim word still held
//! the owner's token ([`LeaseKeeper::absorb`]). Background renewals
//! are posted with [`Fabric::post`] and their tickets polled when the next operation
//! starts, so they cost no roundtrip on the critical path; at most one renewal is
//! outstanding (a newer one forgets the older one's tickets: a late CAS of the older
//! one fails or lands below the newer counter, both harmless).
//!
//! Each renewal batch also reads the epoch of the node's configuration record
//! (`crate::configuration`): a client learns within a renewal period that a repair
//! admitted a rebuilt node ([`LeaseHolder::config_epoch_seen`], `crate::repair`).

use core::future::poll_fn;
use core::task::Poll;

use swarm_core::fabric::{Nanos, Ticket};
use swarm_core::quorum::majority;
use swarm_core::{Batch, Fabric, NodeId, Op};

use crate::membership::lease::{LeaseKeeper, LeaseParams};

/// Row word offsets (bytes) the owner writes.
pub(crate) const LEASE_WORD: u64 = 8;
/// The owner's wall clock at its last renewal, Unix ns (informational).
pub(crate) const RENEWED_UNIX: u64 = 40;
/// The epoch word of a node's configuration record.
const CONFIG_EPOCH_AT: u64 = crate::configuration::CONFIG_AT + 16;

/// A renewal in flight.
#[derive(Debug)]
struct Pending {
    sent_at: Nanos,
    next: u64,
    /// `(node, expected word, ticket while unanswered)`.
    posts: Vec<(usize, u64, Option<Ticket>)>,
    /// Answers whose CAS counted (swapped, and the claim word held the owner's token).
    successes: usize,
    acknowledged: bool,
    /// `(node, word)`: nodes whose copy of the row's claim word held another word
    /// than the owner's token (see [`LeaseHolder`], "stale claim copies").
    stale_claims: Vec<(usize, u64)>,
}

impl Pending {
    fn answered(&self) -> bool {
        self.posts.iter().all(|(_, _, t)| t.is_none())
    }
}

/// A client's lease: what it knows of its lease word, and its renewal in flight.
///
/// **Stale claim copies.** A renewal counts on a node only where the row's claim word
/// holds the owner's token. A client that registered while a repair was copying a
/// node (after the copy had read the client table) claimed its row on the other nodes
/// only, and the admitted node keeps the copy it was rebuilt with (0, or an earlier
/// owner's token): its renewals would count on a bare majority for ever, and the loss
/// of any other node would cost it the lease. So once a renewal is acknowledged by a
/// majority (the claim word read in the same batches held the owner's token there),
/// the owner takes every other copy it read by CAS from the word read to its token,
/// as a claim that wins does (`crate::membership::claim`): nobody else can hold the
/// word on a majority while it does, so such a copy is stale.
///
/// A copy that holds 0 (unclaimed) is taken sooner: as soon as a renewal's CAS
/// counted on some node (the lease word moved there and the claim word read after it
/// held the owner's token), acknowledged by a majority or not. Taking an unclaimed
/// word takes nothing from anyone: no token holds a word that holds 0, so every other
/// token keeps the words it has, and the owner reaches a majority of claim words only
/// where no other token has one (two majorities share a word, and a word holds one
/// token). A CAS from 0 that lands late, after another claim took the word, fails.
/// Without it, a client that follows the admission late (a long insert) and then
/// loses one of the two nodes it registered on finds itself with one node counting
/// and one stale copy it may take only under a majority: its lease would lapse for
/// good although two nodes answer.
#[derive(Debug)]
pub struct LeaseHolder {
    keeper: LeaseKeeper,
    row_at: u64,
    token: u64,
    nodes: usize,
    pending: Option<Pending>,
    last_sent: Option<Nanos>,
    renewals: u64,
    /// The highest configuration epoch a renewal read.
    config_epoch_seen: u64,
    /// Renewal answers taken so far (successful or not), one per node and renewal.
    answers: u64,
    /// Whether the owner is fenced on the memory nodes ([`LeaseHolder::fenced`]):
    /// until then a renewal stores nothing but its CAS.
    fenced: bool,
    /// Before this time (owner clock) a [`LeaseHolder::tick`] has nothing to do and
    /// no answer was taken since the last one ([`LeaseHolder::quiet_until`]): 0 from
    /// a post until a tick finds no renewal pending (answers come only while one is).
    quiet_until: Nanos,
    /// Whether the loss of the lease ([`LeaseHolder::lost`]) was logged.
    loss_logged: bool,
}

impl LeaseHolder {
    /// The lease of the row at `row_at`, claimed with `token`, whose words were read
    /// as in `keeper`.
    pub fn new(keeper: LeaseKeeper, row_at: u64, token: u64, nodes: usize) -> Self {
        Self {
            keeper,
            row_at,
            token,
            nodes,
            pending: None,
            last_sent: None,
            renewals: 0,
            config_epoch_seen: 0,
            answers: 0,
            fenced: false,
            quiet_until: 0,
            loss_logged: false,
        }
    }

    /// Records that the owner fenced itself (`swarm_core::Fabric::fence_owner`):
    /// renewals from now on also write its wall clock (row word 5). Before the fence
    /// a renewal is a CAS and reads only, so that nothing it posts is a plain store
    /// a revocation could not stop (`crate::membership::writer_takeover`, "A
    /// registration paused before its fence").
    pub fn fenced(&mut self) {
        self.fenced = true;
    }

    /// The lease parameters.
    pub fn params(&self) -> &LeaseParams {
        self.keeper.params()
    }

    /// The highest configuration epoch any renewal read (0 before the first
    /// answer, or on a store without configurations).
    pub fn config_epoch_seen(&self) -> u64 {
        self.config_epoch_seen
    }

    /// Renewal answers taken so far: a caller that acted on
    /// [`Self::config_epoch_seen`] waits for a newer answer before acting again.
    pub fn renewal_answers(&self) -> u64 {
        self.answers
    }

    /// Renewals acknowledged by a majority so far.
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Whether the lease is valid at `now` for `for_ns` more (owner clock).
    pub fn valid_for(&self, now: Nanos, for_ns: Nanos) -> bool {
        self.keeper.valid_for(now, for_ns)
    }

    /// Until when the lease is valid (owner clock), if it ever was.
    pub fn valid_until(&self) -> Option<Nanos> {
        self.keeper.valid_until()
    }

    /// Whether a reclaimer killed this lease, or another client took the row, on a
    /// majority: the lease can never be renewed.
    pub fn lost(&self) -> bool {
        self.keeper.lost_nodes() >= majority(self.nodes)
    }

    /// Non-blocking upkeep at the start of an operation: takes the answers of the
    /// renewal in flight, and posts the next one once a renewal period has passed.
    pub fn tick<F: Fabric + ?Sized>(&mut self, fabric: &F, now: Nanos) {
        self.collect(fabric);
        let renew_ns = self.keeper.params().renew_ns;
        let due = self
            .last_sent
            .is_none_or(|sent| now.saturating_sub(sent) >= renew_ns);
        // Renewals ride on the owner's ticks (its operations and waits): a gap of
        // several periods means that nothing ticked (an idle client, a thread that
        // waited elsewhere, a stopped process), which a reclaimer may take for death.
        if let Some(sent) = self.last_sent.filter(|_| due)
            && now.saturating_sub(sent) >= renew_ns.saturating_mul(3)
        {
            tracing::debug!(
                since_last_ms = now.saturating_sub(sent) / 1_000_000,
                valid = self.keeper.valid_for(now, 0),
                "lease renewal late: nothing ticked the lease for several renewal periods"
            );
        }
        if due && !self.lost() {
            self.post(fabric, now);
            // A fabric that completes batches inside `post` (shared memory) has
            // answered already.
            self.collect(fabric);
        }
        // The caller looks at what this tick took (`config_epoch_seen`,
        // `renewal_answers`) now: until the next renewal is due, a tick has nothing
        // more to do, unless a renewal is still in flight (its answers come in
        // later ticks) or another path takes answers (`collect`).
        self.quiet_until = match (&self.pending, self.last_sent) {
            (None, Some(sent)) => sent.saturating_add(renew_ns),
            _ => 0,
        };
    }

    /// Before this time (owner clock), [`Self::tick`] would do nothing and nothing
    /// was learned since the last tick: no renewal in flight, none due, no answer
    /// taken by another path (a synchronous renewal, [`renew_now`]). A caller that
    /// acts on what a tick learns (`swarm-kv`'s upkeep follows a newer configuration)
    /// may skip both the tick and that before then.
    pub fn quiet_until(&self) -> Nanos {
        self.quiet_until
    }

    /// Posts a renewal now (forgetting the one in flight, if any).
    fn post<F: Fabric + ?Sized>(&mut self, fabric: &F, now: Nanos) {
        self.collect(fabric);
        if let Some(old) = self.pending.take() {
            for ticket in old.posts.into_iter().filter_map(|(_, _, t)| t) {
                fabric.forget(ticket);
            }
        }
        let renewal = self.keeper.renewal();
        let unix = crate::clock::SystemClock::unix_ns();
        let fenced = self.fenced;
        let posts = renewal
            .cas
            .iter()
            .map(|&(node, expected)| {
                let mut batch = Batch::cas(self.row_at + LEASE_WORD, expected, renewal.next);
                // A fresh one-op batch has room for three more operations.
                let _ = batch.push(Op::Read {
                    addr: self.row_at,
                    len: 8,
                });
                let _ = batch.push(Op::Read {
                    addr: CONFIG_EPOCH_AT,
                    len: 8,
                });
                if fenced {
                    let _ = batch.push(Op::Write {
                        addr: self.row_at + RENEWED_UNIX,
                        data: unix.to_le_bytes().to_vec().into(),
                    });
                }
                let ticket = fabric.post(NodeId(node as u16), batch);
                (node, expected, Some(ticket))
            })
            .collect();
        tracing::trace!(next = renewal.next, "lease renewal posted");
        self.pending = Some(Pending {
            sent_at: now,
            next: renewal.next,
            posts,
            successes: 0,
            acknowledged: false,
            stale_claims: Vec::new(),
        });
        self.last_sent = Some(now);
        // Its answers are taken by the next ticks (or by `renew_now`, whose
        // caller's next tick must then look at them): while a renewal is pending, or
        // answers were taken since the last tick, no tick is skipped.
        self.quiet_until = 0;
    }

    /// Takes whatever answers of the renewal in flight have arrived.
    fn collect<F: Fabric + ?Sized>(&mut self, fabric: &F) {
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        for (node, expected, ticket) in &mut pending.posts {
            let Some(t) = *ticket else { continue };
            match fabric.poll(t) {
                Poll::Pending => continue,
                Poll::Ready(Ok(completion)) => {
                    let epoch = completion
                        .read(2)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes);
                    self.config_epoch_seen = self.config_epoch_seen.max(epoch);
                    self.answers += 1;
                    let claim = completion
                        .read(1)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes);
                    if let Some(word) = claim
                        && word != self.token
                    {
                        pending.stale_claims.push((*node, word));
                    }
                    if let Some(previous) = completion.cas(0)
                        && self.keeper.absorb(
                            *node,
                            *expected,
                            pending.next,
                            previous,
                            claim == Some(self.token),
                        )
                    {
                        pending.successes += 1;
                    }
                }
                Poll::Ready(Err(error)) => {
                    tracing::debug!(%error, node, "lease renewal failed on a memory node");
                }
            }
            *ticket = None;
        }
        if !pending.acknowledged && pending.successes >= majority(self.nodes) {
            pending.acknowledged = true;
            self.keeper.acknowledged(pending.sent_at);
            self.renewals += 1;
            tracing::trace!(next = pending.next, "lease renewal acknowledged");
        }
        if pending.answered() && !pending.acknowledged {
            tracing::debug!(
                next = pending.next,
                successes = pending.successes,
                lost_nodes = self.keeper.lost_nodes(),
                "lease renewal not acknowledged by a majority (nodes failed, or the words \
                 moved: the next renewal CASes from what they showed)"
            );
        }
        if !self.loss_logged && self.keeper.lost_nodes() >= majority(self.nodes) {
            self.loss_logged = true;
            tracing::warn!(
                row_at = self.row_at,
                "lease lost: killed by a reclaimer, or the row taken over, on a majority \
                 of the memory nodes; this client can never renew it (reconnect)"
            );
        }
        // Stale claim copies (see [`LeaseHolder`]): any word under a majority's
        // acknowledgment, an unclaimed one once the lease counted on some node.
        let acknowledged = pending.acknowledged;
        if acknowledged || pending.successes > 0 {
            pending.stale_claims.retain(|&(node, stale)| {
                let take = acknowledged || stale == 0;
                if take {
                    tracing::info!(
                        node,
                        stale,
                        acknowledged,
                        "the row's claim word held another word on this node: taking the copy"
                    );
                    fabric.post_detached(
                        NodeId(node as u16),
                        &mut Batch::cas(self.row_at, stale, self.token),
                    );
                }
                !take
            });
        }
        if pending.answered() {
            self.pending = None;
        }
    }

    /// Whether the renewal in flight is over: acknowledged, or every node answered.
    fn settled(&self) -> bool {
        self.pending
            .as_ref()
            .is_none_or(|p| p.acknowledged || p.answered())
    }
}

/// Renews `holder`'s lease synchronously: waits for the renewal in flight, if any,
/// then, if the lease is still not valid for `for_ns` more, posts a renewal and waits
/// until a majority acknowledged it, every node answered, or a renewal period passed
/// (the caller then checks [`LeaseHolder::valid_for`]). Never holds the borrow across
/// an await.
pub async fn renew_now<F: Fabric + ?Sized>(
    holder: &core::cell::RefCell<LeaseHolder>,
    fabric: &F,
    for_ns: Nanos,
) {
    for fresh in [false, true] {
        let deadline = {
            let mut h = holder.borrow_mut();
            h.collect(fabric);
            let now = fabric.now();
            if h.lost() || h.valid_for(now, for_ns) {
                return;
            }
            if fresh || h.pending.is_none() {
                h.post(fabric, now);
            }
            now.saturating_add(h.params().renew_ns)
        };
        fabric.wake_at(deadline);
        poll_fn(|cx| {
            let mut h = holder.borrow_mut();
            h.collect(fabric);
            if h.settled() || fabric.now() >= deadline {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
    }
    // Answers that arrive later are taken by the next `tick`.
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use swarm_core::fabric::FailNodes;
    use swarm_core::{Completion, FabricError, MemCluster, MemFabric};

    use super::*;
    use crate::layout::ClusterParams;

    /// In-memory nodes whose clock is set by hand, counting posts; while `hold` is
    /// set, answers are not ready yet (a renewal in flight).
    struct Counted {
        inner: FailNodes<MemFabric>,
        now: Cell<Nanos>,
        posts: Cell<usize>,
        hold: Cell<bool>,
    }

    impl Fabric for Counted {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> Ticket {
            self.posts.set(self.posts.get() + 1);
            self.inner.post(node, batch)
        }
        fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
            if self.hold.get() {
                return Poll::Pending;
            }
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: Ticket) {
            self.inner.forget(ticket)
        }
        fn progress(&self) -> bool {
            self.hold.set(false);
            true
        }
        fn now(&self) -> Nanos {
            self.now.get()
        }
        fn wake_at(&self, _deadline: Nanos) {}
    }

    const ROW: u64 = 4096;
    const TOKEN: u64 = 0x7077;

    fn holder() -> (Counted, LeaseHolder) {
        holder_with_claims([TOKEN; 3], vec![Some(0); 3])
    }

    /// A holder whose row's claim word holds `claims[n]` on node `n`, and whose
    /// keeper read the lease words as `seen`.
    fn holder_with_claims(claims: [u64; 3], seen: Vec<Option<u64>>) -> (Counted, LeaseHolder) {
        let cluster = MemCluster::new(3, 1 << 20);
        let fabric = Counted {
            inner: FailNodes::new(cluster.client()),
            now: Cell::new(1_000),
            posts: Cell::new(0),
            hold: Cell::new(false),
        };
        for (node, claim) in claims.into_iter().enumerate() {
            let ticket = fabric.inner.post(
                NodeId(node as u16),
                Batch::write(ROW, claim.to_le_bytes().to_vec()),
            );
            fabric.inner.forget(ticket);
        }
        let keeper = LeaseKeeper::new(LeaseParams::from_params(&ClusterParams::default()), seen);
        (fabric, LeaseHolder::new(keeper, ROW, TOKEN, 3))
    }

    /// The word at `at` on `node`.
    fn word(fabric: &Counted, node: u16, at: u64) -> u64 {
        let ticket = fabric.inner.post(NodeId(node), Batch::read(at, 8));
        match fabric.inner.poll(ticket) {
            Poll::Ready(Ok(c)) => u64::from_le_bytes(c.read(0).unwrap().try_into().unwrap()),
            other => panic!("node {node} did not answer: {other:?}"),
        }
    }

    /// Ticks `h` once per renewal period, `times` times; the time of the last tick.
    fn tick_renewals(fabric: &Counted, h: &mut LeaseHolder, times: usize) -> Nanos {
        let renew_ns = h.params().renew_ns;
        for _ in 0..times {
            fabric.now.set(fabric.now() + renew_ns);
            h.tick(fabric, fabric.now());
        }
        fabric.now()
    }

    /// The soak's lapsed janitor (seed 469185149): a client registered on nodes 0 and
    /// 1 while node 2 was being rebuilt (the copy holds the row unclaimed), followed
    /// node 2's admission late, and lost node 1 before a majority had acknowledged a
    /// renewal with node 2's answer in it. Its lease counts on node 0 alone, and a
    /// stale copy is taken under a majority only; an unclaimed one is taken at once,
    /// so nodes 0 and 2 keep the lease.
    #[test]
    fn an_unclaimed_copy_is_taken_without_a_majority_and_two_nodes_keep_the_lease() {
        let (fabric, mut h) = holder_with_claims([TOKEN, TOKEN, 0], vec![Some(0), Some(0), None]);
        fabric.inner.fail_node(NodeId(1));
        let now = tick_renewals(&fabric, &mut h, 3);
        assert_eq!(
            word(&fabric, 2, ROW),
            TOKEN,
            "node 2's unclaimed copy is taken"
        );
        assert!(h.valid_for(now, 0), "renewed on nodes 0 and 2");
        assert!(!h.lost());
    }

    /// Another token's copy is not taken without a majority: it may be a live owner's
    /// (a row taken over on nodes 1 and 2), and the lease is not renewed.
    #[test]
    fn another_tokens_copy_is_left_alone_without_a_majority() {
        const OTHER: u64 = 0x5055;
        let (fabric, mut h) =
            holder_with_claims([TOKEN, TOKEN, OTHER], vec![Some(0), Some(0), None]);
        fabric.inner.fail_node(NodeId(1));
        let now = tick_renewals(&fabric, &mut h, 3);
        assert_eq!(word(&fabric, 2, ROW), OTHER);
        assert!(!h.valid_for(now, 0), "one node counts");
    }

    /// A tick before [`LeaseHolder::quiet_until`] would have done nothing (no post,
    /// no answer); from it on, a tick posts the next renewal; and a renewal in
    /// flight, or answers another path took, make the next tick run.
    #[test]
    fn a_tick_before_quiet_until_has_nothing_to_do() {
        let (fabric, mut h) = holder();
        let renew_ns = h.params().renew_ns;
        assert_eq!(h.quiet_until(), 0, "the first tick runs");
        let t0 = fabric.now();
        h.tick(&fabric, t0);
        assert_eq!((fabric.posts.get(), h.renewals()), (3, 1));
        assert_eq!(h.quiet_until(), t0 + renew_ns);
        for t in [t0 + 1, t0 + renew_ns / 2, t0 + renew_ns - 1] {
            let answers = h.renewal_answers();
            h.tick(&fabric, t);
            assert_eq!(fabric.posts.get(), 3, "nothing due at {t}");
            assert_eq!(h.renewal_answers(), answers);
            assert_eq!(h.quiet_until(), t0 + renew_ns);
        }
        // Due: the next renewal is posted and, on this fabric, answered at once.
        let t1 = t0 + renew_ns;
        h.tick(&fabric, t1);
        assert_eq!((fabric.posts.get(), h.renewals()), (6, 2));
        assert_eq!(h.quiet_until(), t1 + renew_ns);
        // A renewal whose answers have not come: every tick looks for them.
        fabric.hold.set(true);
        let t2 = t1 + renew_ns;
        h.tick(&fabric, t2);
        assert_eq!((fabric.posts.get(), h.renewals()), (9, 2));
        assert_eq!(h.quiet_until(), 0, "answers to collect");
        fabric.hold.set(false);
        h.tick(&fabric, t2 + 1);
        assert_eq!((fabric.posts.get(), h.renewals()), (9, 3));
        assert_eq!(h.quiet_until(), t2 + renew_ns);
        // Answers taken outside a tick (a synchronous renewal): the next tick's
        // caller must see them.
        let holder = core::cell::RefCell::new(h);
        fabric.now.set(t2 + 100 * renew_ns);
        swarm_core::block_on_future(&fabric, renew_now(&holder, &fabric, renew_ns))
            .expect("no stall");
        assert_eq!(holder.borrow().renewals(), 4);
        assert_eq!(holder.borrow().quiet_until(), 0, "answers unseen by a tick");
    }
}
