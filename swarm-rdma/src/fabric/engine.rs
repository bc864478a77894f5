//! The transport engine: tickets, staging, send-queue credits, completions and
//! node failure, independent of how chains reach the wire.
//!
//! The engine turns [`Fabric`] calls into chains ([`crate::wr::plan`]) and hands them
//! to a [`Nic`]; completions come back through [`Nic::poll`] and complete tickets in
//! the core's [`TicketSlab`]. The real NIC is verbs ([`super::nic::VerbsNic`]); the
//! tests use the emulated provider's NIC ([`crate::emu::EmuNic`], RC semantics), so
//! everything here — including failure handling — is tested on machines without RDMA.
//!
//! * **Tickets.** Each chain gets a fresh sequence number, encoded with the request
//!   index in every work-request id. The signaled last request completes the ticket;
//!   an error on any request fails it.
//! * **Back-pressure.** A chain is posted only when its queue pair has send-queue room
//!   and the staging buffer has room for it; otherwise it waits in a per-node FIFO and
//!   is posted from [`Fabric::progress`], in order, so batches to one node keep
//!   their posting order. `post` never blocks.
//! * **Failure.** The first error completion (or post failure) on a queue pair marks
//!   the node dead: every batch waiting for it fails at once with
//!   [`FabricError::NodeFailed`], and later batches to it fail immediately (unless it
//!   is *parked*, below). Chains in flight fail only after their queue pair was moved
//!   to the error state ([`Nic::abort`]), whatever failed the node: a failed ticket
//!   never lands afterwards (write-back guards rely on it). The protocol then carries on with a majority, as with any
//!   failed node (SWARM §2.1). A staging slice is reused only once the chain's last
//!   request reported back (success or flush), so the NIC never writes into memory
//!   lent to a newer chain.
//! * **Overdue chains.** An RC queue pair completes or fails every request within
//!   its retry window; a chain that does neither for much longer (the NIC lost it)
//!   would leave its operation waiting forever with nothing in the log. Soft-RoCE
//!   does lose chains: under CPU starvation its requester was seen holding a request
//!   for seconds (the responder had executed it), and for good when nothing else was
//!   posted on the queue pair, which stayed in RTS all along. Worse for recycling, a
//!   held write lands whenever the requester wakes up. The engine looks at its
//!   chains in flight every [`OVERDUE_SCAN_NS`] (from `progress`, and before a post):
//!   - past [`Engine::warn_overdue_after`] (twice the retry window) it warns once per
//!     chain and *nudges* the queue pair with an 8-byte read of the node's first
//!     word: a post wakes a soft-RoCE requester that sleeps on a request, and costs a
//!     healthy NIC one read;
//!   - past [`Engine::fail_overdue_after`] it gives up: the queue pair is moved to the
//!     error state ([`Nic::abort`]: it sends nothing more and flushes what it holds)
//!     and the node is failed as after an error completion, so the operation waiting
//!     carries on with the other nodes and the fabric reconnects the node with a new
//!     queue pair, at once (the node is believed alive). This is what bounds how late
//!     this client's writes can land, the bound a SWARM-KV cluster's delivery margin
//!     states. The batches in flight or waiting at that moment fail
//!     ([`FailureCause::TimedOut`]); later posts to the node are parked.
//! * **Parking.** A node given up on this way is alive, and back a moment later (a
//!   reconnect is one bootstrap exchange, about 200 ms in an emulated VM); failing
//!   every post to it meanwhile would fail every operation for want of a majority
//!   when another node is down too. So until it is revived ([`Engine::revive`]) the
//!   node is *parked*: a post to it does not fail but queues the batch in the
//!   node's waiting FIFO with a pending ticket, and the operation waits for it as
//!   for any batch in flight. The revive plans the parked batches again for the new
//!   queue pair, and `progress` posts them in order, failing with
//!   [`FabricError::Fenced`] (never posting) each one whose operation deadline
//!   ([`Batch::deadline`]) has passed, as for any waiting batch; a parked batch past
//!   its deadline is failed so even before the revive. So a parked batch is posted
//!   before its operation's deadline or never, and the delivery margin holds as for
//!   a batch that waited for staging. Only batches with a deadline are parked: one
//!   without (background work such as an index apply or a claim's give-back) could
//!   reach the node a whole window late, then be in flight up to the give-up limit,
//!   past the margin; it fails at once, as before parking existed. Parking ends in
//!   failure (every parked batch fails with the give-up's error, and later posts
//!   fail at once again) when the window passes ([`Engine::park_window_ns`]: the
//!   give-up limit, at most [`MAX_PARK_NS`]; a parked batch waits no longer than one
//!   in flight may before the engine gives up on it), when the fabric's reconnect
//!   attempt fails or the node is retired ([`Engine::stop_parking`]), or when the
//!   node is failed again for any reason
//!   (the device went down). Only give-ups park: a node failed by an error
//!   completion, a post failure, a cut notice or never reached is not known to be
//!   up, and posts to it still fail at once. [`Engine::park_stats`] counts what
//!   parking did; the node's parking, revive with its parked batches, and parking
//!   that ends in failure are logged (target `swarm_rdma`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::task::Poll;
use std::time::Instant;

use swarm_core::fabric::{
    Batch, Completion, Fabric, FabricError, FailureCause, Nanos, NodeId, Ticket, TicketSlab,
};

use crate::staging::{Extent, StagingAllocator};
use crate::status::{self, StatusClass};
use crate::verbs::cq::WorkCompletion;
pub use crate::verbs::post::PostFailure;
use crate::wr::{self, Chain, ChainLimits, RemoteRegion};

/// What the engine needs from a NIC: one queue pair per node, one completion queue,
/// one registered staging buffer.
pub trait Nic {
    /// Bytes of staging buffer.
    fn staging_capacity(&self) -> u64;

    /// The staging bytes `[offset, offset + len)` (inside the capacity), for the CPU.
    fn staging_mut(&mut self, offset: u64, len: u64) -> &mut [u8];

    /// Posts `chain` (planned from `batch`) on `node`'s queue pair as chain `seq`,
    /// its staging slice starting at `staging_offset`.
    fn post(
        &mut self,
        node: usize,
        seq: u64,
        chain: &Chain,
        batch: &Batch,
        staging_offset: u64,
    ) -> Result<(), PostFailure>;

    /// Drains available completions into `out` (cleared first).
    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32>;

    /// Moves `node`'s queue pair to the error state: it sends nothing more and
    /// flushes every request it holds. The engine gives up on the node this way when
    /// a chain is lost (see the module docs); the fabric then reconnects it with a
    /// new queue pair.
    fn abort(&mut self, node: usize);
}

/// What the engine knows about one memory node.
#[derive(Debug)]
pub struct NodeLink {
    /// The node's memory.
    pub region: RemoteRegion,
    /// Chain limits of the node's queue pair.
    pub limits: ChainLimits,
    /// Send-queue depth of the node's queue pair.
    pub depth: u32,
}

#[derive(Debug)]
struct NodeState {
    /// `None`: never connected.
    link: Option<NodeLink>,
    dead: bool,
    /// Work requests posted and not yet reported back.
    outstanding: u32,
    /// Chains not handed to the NIC yet: waiting for send-queue room or staging on a
    /// live node, or parked on a dead one.
    waiting: VecDeque<Waiting>,
    /// The node was given up on while believed alive and is being reconnected:
    /// posts to it are parked in `waiting` (see the module docs). Only ever `Some`
    /// on a dead node.
    parked: Option<Park>,
}

/// A parking window (see the module docs).
#[derive(Debug)]
struct Park {
    /// When the node was given up on (engine clock).
    since: Nanos,
    /// When parking ends in failure unless the node was revived (engine clock).
    until: Nanos,
    /// What the parked batches fail with if parking ends in failure: the give-up's.
    error: FabricError,
    /// Batches parked in this window so far.
    batches: u64,
}

#[derive(Debug)]
struct Waiting {
    ticket: Ticket,
    batch: Batch,
    chain: Chain,
    /// A nudge (see the module docs): never warned about or nudged itself.
    nudge: bool,
}

#[derive(Debug)]
struct InFlight {
    ticket: Ticket,
    node: usize,
    chain: Chain,
    extent: Extent,
    /// The ticket already got its result (an error before the last completion).
    reported: bool,
    /// The NIC may still touch the staging slice even after the last completion (a
    /// failed post left part of the chain behind): never reuse it.
    leak: bool,
    /// When it was handed to the NIC (engine clock, [`Engine::clock`]).
    posted_at: Nanos,
    /// An overdue warning was logged for it (or it is a nudge, which gets none).
    warned: bool,
}

/// How often the engine looks for overdue chains (see the module docs).
pub const OVERDUE_SCAN_NS: Nanos = 100_000_000;

/// The longest parking window (see the module docs), whatever the give-up limit
/// (which is unbounded unless set): a reconnect of a live node takes one bootstrap
/// exchange (about 100 to 200 ms in an emulated VM), so this leaves room for several
/// slow ones, while a batch without a deadline (a background write) does not hold
/// its caller for long on a node that does not come back.
pub const MAX_PARK_NS: Nanos = 2_000_000_000;

/// The engine. See the module docs.
#[derive(Debug)]
pub struct Engine<N: Nic> {
    nic: N,
    nodes: Vec<NodeState>,
    slab: TicketSlab<()>,
    inflight: HashMap<u64, InFlight>,
    staging: StagingAllocator,
    next_seq: u64,
    completions: Vec<WorkCompletion>,
    /// Nodes marked dead.
    dead: usize,
    /// Warn about chains in flight for longer than this (`Nanos::MAX`: never).
    overdue_after_ns: Nanos,
    /// The next overdue scan, engine clock.
    next_overdue_scan: Nanos,
    /// Overdue warnings logged so far.
    overdue_warnings: u64,
    /// Fail the node of a chain in flight for longer than this (`Nanos::MAX`: never).
    give_up_after_ns: Nanos,
    /// The engine clock: the latest time a post or a progress call was made at.
    clock: Nanos,
    /// Nodes failed because a chain was lost, so far.
    gave_up: u64,
    /// Parking statistics (see [`ParkStats`]).
    parking: ParkStats,
}

/// What parking did so far (see the module docs), for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkStats {
    /// Nodes parked (one per give-up).
    pub parked_nodes: u64,
    /// Batches posted while their node was parked (each waited for the revive).
    pub parked_batches: u64,
    /// Parked nodes revived, their parked batches then posted in order.
    pub revived: u64,
    /// Parking windows that ended in failure (window passed, reconnect attempt
    /// failed, node retired or failed otherwise), their parked batches failed.
    pub failed: u64,
}

impl<N: Nic> Engine<N> {
    /// An engine over `nic`; `links[i]` is node `i` (`None`: could not be connected,
    /// treated as failed).
    pub fn new(nic: N, links: Vec<Option<NodeLink>>) -> Self {
        let staging = StagingAllocator::new(nic.staging_capacity());
        let dead = links.iter().filter(|l| l.is_none()).count();
        let nodes = links
            .into_iter()
            .map(|link| NodeState {
                dead: link.is_none(),
                link,
                outstanding: 0,
                waiting: VecDeque::new(),
                parked: None,
            })
            .collect();
        Self {
            nic,
            nodes,
            slab: TicketSlab::new(),
            inflight: HashMap::new(),
            staging,
            next_seq: 0,
            completions: Vec::new(),
            dead,
            overdue_after_ns: Nanos::MAX,
            next_overdue_scan: 0,
            overdue_warnings: 0,
            give_up_after_ns: Nanos::MAX,
            gave_up: 0,
            clock: 0,
            parking: ParkStats::default(),
        }
    }

    /// Warns (once per chain) about chains in flight for longer than `after_ns`:
    /// past the queue pairs' retry window, the NIC should have completed or failed
    /// them (see the module docs).
    pub fn warn_overdue_after(mut self, after_ns: Nanos) -> Self {
        self.overdue_after_ns = after_ns;
        self
    }

    /// Chains warned about as overdue so far (for tests and diagnostics; one warning
    /// line per node and scan covers them).
    pub fn overdue_warnings(&self) -> u64 {
        self.overdue_warnings
    }

    /// Gives up on a chain in flight for longer than `after_ns` (at least the warning
    /// limit): its node's queue pair is aborted and the node failed (see the module
    /// docs).
    pub fn fail_overdue_after(mut self, after_ns: Nanos) -> Self {
        self.set_fail_overdue_after(after_ns);
        self
    }

    /// [`Self::fail_overdue_after`] on a running engine.
    pub fn set_fail_overdue_after(&mut self, after_ns: Nanos) {
        self.give_up_after_ns = after_ns;
    }

    /// Nodes failed because one of their chains was lost, so far.
    pub fn lost_chain_failures(&self) -> u64 {
        self.gave_up
    }

    /// What parking did so far (see the module docs).
    pub fn park_stats(&self) -> ParkStats {
        self.parking
    }

    /// How long posts to a node given up on are parked at most: the give-up limit
    /// itself, at most [`MAX_PARK_NS`] (see the module docs).
    pub fn park_window_ns(&self) -> Nanos {
        self.give_up_after_ns.min(MAX_PARK_NS)
    }

    /// Whether posts to `node` are parked: it was given up on while believed alive
    /// and is being reconnected (see the module docs).
    pub fn is_parked(&self, node: NodeId) -> bool {
        self.nodes
            .get(node.index())
            .is_some_and(|n| n.parked.is_some())
    }

    /// Ends `node`'s parking window, if any, in failure: every parked batch fails
    /// with the error of the give-up, and later posts to the node fail at once
    /// again. `why` is logged. The fabric calls it when a reconnect attempt fails
    /// or the node is retired.
    pub fn stop_parking(&mut self, node: NodeId, why: &str) {
        if node.index() < self.nodes.len() {
            self.end_park(node.index(), why, None);
        }
    }

    /// Ends `node`'s parking window, if any, in failure: its parked batches fail with
    /// `error`, or the give-up's error if `None`.
    fn end_park(&mut self, node: usize, why: &str, error: Option<&FabricError>) {
        let Some(park) = self.nodes[node].parked.take() else {
            return;
        };
        self.parking.failed += 1;
        let waiting = std::mem::take(&mut self.nodes[node].waiting);
        tracing::warn!(
            node = %NodeId(node as u16),
            batches = waiting.len(),
            parked_ms = self.clock.saturating_sub(park.since) / 1_000_000,
            why,
            "parking ended in failure: the parked batches fail and later posts to the \
             node fail at once"
        );
        let error = error.unwrap_or(&park.error);
        for w in waiting {
            self.slab.complete(w.ticket, Err(error.clone()));
        }
    }

    /// Gives up on live `node`'s queue pair as the overdue scan does when it holds a
    /// chain past the give-up limit: aborts it, fails the node with
    /// [`FailureCause::TimedOut`] (every batch waiting for it or in flight fails)
    /// and parks later posts to it (see the module docs). Public for tests that
    /// cannot make a real NIC hold a chain.
    pub fn give_up_on(&mut self, node: NodeId) {
        if self.nodes.get(node.index()).is_some_and(|n| !n.dead) {
            let now = self.clock;
            self.give_up(node.index(), now);
        }
    }

    fn give_up(&mut self, node: usize, now: Nanos) {
        self.gave_up += 1;
        self.nic.abort(node);
        let error = FabricError::NodeFailed {
            node: NodeId(node as u16),
            cause: FailureCause::TimedOut,
        };
        self.kill(node, &error);
        // The node itself is believed alive: only its queue pair held a chain.
        self.park(node, now, error);
    }

    /// Starts parking posts to `node`, just given up on (see the module docs).
    fn park(&mut self, node: usize, now: Nanos, error: FabricError) {
        let window = self.park_window_ns();
        self.parking.parked_nodes += 1;
        tracing::info!(
            node = %NodeId(node as u16),
            window_ms = window / 1_000_000,
            "parking posts to the node given up on until it is reconnected"
        );
        self.nodes[node].parked = Some(Park {
            since: now,
            until: now.saturating_add(window),
            error,
            batches: 0,
        });
    }

    /// Ends a parking window that passed, or fails (with
    /// [`FabricError::Fenced`]) the parked batches whose deadline passed: they could
    /// only be fenced once the node is back.
    fn check_park(&mut self, node: usize, now: Nanos) -> bool {
        let Some(park) = &self.nodes[node].parked else {
            return false;
        };
        if now >= park.until {
            self.end_park(
                node,
                "the park window passed before the node was reconnected",
                None,
            );
            return true;
        }
        let mut fenced = false;
        let slab = &mut self.slab;
        self.nodes[node].waiting.retain(|w| {
            if w.batch.deadline().is_some_and(|deadline| now > deadline) {
                tracing::debug!(
                    node,
                    ticket = w.ticket.0,
                    "parked batch past its operation's deadline: failed, never posted"
                );
                slab.complete(w.ticket, Err(FabricError::Fenced));
                fenced = true;
                false
            } else {
                true
            }
        });
        fenced
    }

    /// Warns about (and nudges the queue pairs of) chains in flight for longer than
    /// the overdue limit and gives up on those in flight for longer than the give-up
    /// limit, at most once per [`OVERDUE_SCAN_NS`] (see the module docs).
    fn scan_overdue(&mut self, now: Nanos) {
        self.clock = self.clock.max(now);
        let limit = self.overdue_after_ns.min(self.give_up_after_ns);
        if limit == Nanos::MAX || now < self.next_overdue_scan {
            return;
        }
        self.next_overdue_scan = now.saturating_add(OVERDUE_SCAN_NS);
        // Per node: chains newly overdue, and the longest time one was in flight.
        let mut overdue: Vec<(usize, u32, Nanos)> = Vec::new();
        let mut lost: Vec<(usize, u64, Nanos)> = Vec::new();
        for (seq, entry) in self.inflight.iter_mut() {
            let for_ns = now.saturating_sub(entry.posted_at);
            // A chain whose ticket already failed (its node is dead) keeps nobody
            // waiting.
            if entry.reported || for_ns < limit {
                continue;
            }
            if for_ns >= self.give_up_after_ns {
                lost.push((entry.node, *seq, for_ns));
                continue;
            }
            if entry.warned {
                continue;
            }
            entry.warned = true;
            self.overdue_warnings += 1;
            match overdue.iter_mut().find(|(node, ..)| *node == entry.node) {
                Some((_, chains, longest)) => {
                    *chains += 1;
                    *longest = (*longest).max(for_ns);
                }
                None => overdue.push((entry.node, 1, for_ns)),
            }
        }
        lost.sort_unstable();
        lost.dedup_by_key(|(node, ..)| *node);
        for &(node, seq, for_ns) in &lost {
            tracing::warn!(
                node = %NodeId(node as u16),
                seq,
                in_flight_ms = for_ns / 1_000_000,
                limit_ms = self.give_up_after_ns / 1_000_000,
                "the NIC lost a work request chain (neither completed nor failed long past \
                 the queue pair's retry window): aborting the queue pair and failing the \
                 node, which is reconnected in the background (later posts to it are \
                 parked meanwhile)"
            );
            self.give_up(node, now);
        }
        for (node, chains, longest) in overdue {
            if self.nodes[node].dead {
                continue;
            }
            tracing::warn!(
                node = %NodeId(node as u16),
                chains,
                in_flight_ms = longest / 1_000_000,
                limit_ms = self.overdue_after_ns / 1_000_000,
                "work request chains neither completed nor failed within twice the queue \
                 pair's retry window: nudging the queue pair (the NIC is slow or holds them)"
            );
            let ticket = self.post_as(NodeId(node as u16), Batch::read(0, 8), true);
            self.slab.forget(ticket);
        }
    }

    /// The NIC (tests inject faults through it).
    pub fn nic_mut(&mut self) -> &mut N {
        &mut self.nic
    }

    /// Whether `node` is considered failed by this client.
    pub fn is_dead(&self, node: NodeId) -> bool {
        self.nodes.get(node.index()).is_none_or(|n| n.dead)
    }

    /// Whether any node is considered failed (one load: the fabric checks it on
    /// every progress call before looking for nodes to reconnect).
    pub fn any_dead(&self) -> bool {
        self.dead > 0
    }

    /// Marks `node` failed, failing everything waiting on it.
    pub fn fail_node(&mut self, node: NodeId) {
        if node.index() < self.nodes.len() {
            self.kill(node.index(), &status::post_error(node));
        }
    }

    /// Marks every node failed (the device or its port went down).
    pub fn kill_all(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node, &status::post_error(NodeId(node as u16)));
        }
    }

    /// Puts a failed `node` back in service over `link`, a fresh queue pair the
    /// caller has already swapped into the NIC in place of the old one (which must
    /// be destroyed by now: it never completes its chains, and the NIC no longer
    /// touches their staging slices, which are given back here). Every ticket of
    /// the old queue pair was already failed when the node was marked dead; late
    /// completions of its chains name sequence numbers that are gone and are ignored.
    pub fn revive(&mut self, node: NodeId, link: NodeLink) {
        let Some(state) = self.nodes.get_mut(node.index()) else {
            return;
        };
        if !state.dead {
            return;
        }
        state.dead = false;
        state.outstanding = 0;
        let park = state.parked.take();
        let parked = std::mem::take(&mut state.waiting);
        self.dead -= 1;
        let staging = &mut self.staging;
        self.inflight.retain(|_, entry| {
            if entry.node != node.index() {
                return true;
            }
            staging.release(entry.extent);
            false
        });
        tracing::info!(%node, "memory node back in service");
        if let Some(park) = park {
            // Planned for the old queue pair: plan them again for the new one (same
            // memory, but its address, key and limits come from the new connection).
            let mut waiting = VecDeque::with_capacity(parked.len());
            for mut w in parked {
                match self.plan(node, &w.batch, &link) {
                    Ok(Some(chain)) => {
                        w.chain = chain;
                        waiting.push_back(w);
                    }
                    Ok(None) => {
                        self.slab.complete(w.ticket, Ok(Completion::new()));
                    }
                    Err(error) => {
                        self.slab.complete(w.ticket, Err(error));
                    }
                }
            }
            self.parking.revived += 1;
            tracing::info!(
                %node,
                batches = waiting.len(),
                parked = park.batches,
                parked_ms = self.clock.saturating_sub(park.since) / 1_000_000,
                "memory node given up on is reconnected: posting its parked batches in order"
            );
            self.nodes[node.index()].waiting = waiting;
        } else {
            // Empty: failing the node failed its waiting batches.
            self.nodes[node.index()].waiting = parked;
        }
        self.nodes[node.index()].link = Some(link);
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// See [`Fabric::post`].
    pub fn post(&mut self, node: NodeId, batch: Batch) -> Ticket {
        self.post_as(node, batch, false)
    }

    /// [`Self::post`]; a `nudge` is never warned about itself.
    fn post_as(&mut self, node: NodeId, batch: Batch, nudge: bool) -> Ticket {
        let nodes = self.nodes.len();
        if node.index() >= nodes {
            return self
                .slab
                .insert_done(Err(FabricError::NoSuchNode { node, nodes }));
        }
        let clock = self.clock;
        self.check_park(node.index(), clock);
        let state = &self.nodes[node.index()];
        let parked = state.parked.is_some();
        if let Some(park) = &state.parked
            && batch.deadline().is_none()
        {
            // Only batches with an operation deadline wait (see the module docs).
            return self.slab.insert_done(Err(park.error.clone()));
        }
        let link = match &state.link {
            // A parked node's batches are planned for its old queue pair, to reject
            // what it would reject now, and again when it is revived.
            Some(link) if !state.dead || parked => link,
            _ => return self.slab.insert_done(Err(status::post_error(node))),
        };
        let chain = match self.plan(node, &batch, link) {
            Ok(Some(chain)) => chain,
            // Nothing to wait for, but no answer from a node that is not back.
            Ok(None) => match &state.parked {
                Some(park) => return self.slab.insert_done(Err(park.error.clone())),
                None => return self.slab.insert_done(Ok(Completion::new())),
            },
            Err(error) => return self.slab.insert_done(Err(error)),
        };
        let ticket = self.slab.insert_pending(());
        tracing::trace!(
            %node,
            ticket = ticket.0,
            ops = batch.ops().len(),
            requests = chain.requests().len(),
            staging = chain.staging_len(),
            "batch posted"
        );
        let waiting = Waiting {
            ticket,
            batch,
            chain,
            nudge,
        };
        if let Some(park) = &mut self.nodes[node.index()].parked {
            park.batches += 1;
            self.parking.parked_batches += 1;
            tracing::debug!(
                %node,
                ticket = ticket.0,
                "batch parked until the node given up on is reconnected"
            );
            self.nodes[node.index()].waiting.push_back(waiting);
        } else if self.nodes[node.index()].waiting.is_empty() {
            if let Some(waiting) = self.try_post(node.index(), waiting) {
                self.nodes[node.index()].waiting.push_back(waiting);
            }
        } else {
            self.nodes[node.index()].waiting.push_back(waiting);
        }
        ticket
    }

    /// `batch` planned as a chain for `node` over `link`: `None` if it has nothing to
    /// post; an error if the link or the staging buffer cannot take it.
    fn plan(
        &self,
        node: NodeId,
        batch: &Batch,
        link: &NodeLink,
    ) -> Result<Option<Chain>, FabricError> {
        let chain = wr::plan(node, batch, &link.region, &link.limits)?;
        if chain.is_empty() {
            return Ok(None);
        }
        if chain.staging_len() > self.staging.capacity() {
            tracing::error!(
                %node,
                needed = chain.staging_len(),
                capacity = self.staging.capacity(),
                "batch needs more staging memory than the client registered; raise RdmaConfig::staging_bytes"
            );
            return Err(FabricError::OutOfBounds {
                node,
                addr: 0,
                len: chain.staging_len(),
                size: self.staging.capacity(),
            });
        }
        Ok(Some(chain))
    }

    /// Posts `w` now if its queue pair and the staging buffer have room; gives it
    /// back otherwise. A post failure kills the node (and fails `w`).
    fn try_post(&mut self, node: usize, w: Waiting) -> Option<Waiting> {
        let state = &self.nodes[node];
        let Some(link) = &state.link else {
            return Some(w);
        };
        let requests = w.chain.requests().len() as u32;
        if state.outstanding + requests > link.depth {
            return Some(w);
        }
        let Some(extent) = self.staging.allocate(w.chain.staging_len()) else {
            return Some(w);
        };
        w.chain.fill_staging(
            &w.batch,
            self.nic.staging_mut(extent.offset, w.chain.staging_len()),
        );
        let seq = self.next_seq;
        self.next_seq += 1;
        match self.nic.post(node, seq, &w.chain, &w.batch, extent.offset) {
            Ok(()) => {
                self.nodes[node].outstanding += requests;
                self.inflight.insert(
                    seq,
                    InFlight {
                        ticket: w.ticket,
                        node,
                        chain: w.chain,
                        extent,
                        reported: false,
                        leak: false,
                        posted_at: self.clock,
                        warned: w.nudge,
                    },
                );
            }
            Err(failure) => {
                let node_id = NodeId(node as u16);
                let error = status::post_error(node_id);
                tracing::warn!(
                    node = %node_id,
                    errno = failure.errno,
                    "ibv_post_send failed; treating the memory node as failed"
                );
                self.slab.complete(w.ticket, Err(error.clone()));
                if failure.posted == 0 {
                    self.staging.release(extent);
                } else {
                    // A prefix of the chain is on the queue pair: it completes (or is
                    // flushed) without a signaled request; keep its slice forever.
                    self.nodes[node].outstanding += failure.posted as u32;
                    self.inflight.insert(
                        seq,
                        InFlight {
                            ticket: w.ticket,
                            node,
                            chain: w.chain,
                            extent,
                            reported: true,
                            leak: true,
                            posted_at: self.clock,
                            warned: false,
                        },
                    );
                }
                self.kill(node, &error);
            }
        }
        None
    }

    /// Marks `node` failed and fails everything waiting on it. A chain in flight on
    /// its queue pair fails only once that queue pair can execute nothing more: it is
    /// moved to the error state first ([`Nic::abort`]; a no-op on one an error
    /// completion put there already). So a failed ticket, like a completed one, means
    /// its chain lands no more, which a write-back guard's lower waits for
    /// (`swarm_core::write_back_guard`, "The lower").
    fn kill(&mut self, node: usize, error: &FabricError) {
        if self
            .inflight
            .values()
            .any(|entry| entry.node == node && !entry.reported)
        {
            self.nic.abort(node);
        }
        let state = &mut self.nodes[node];
        if !state.dead {
            tracing::warn!(node, %error, "memory node failed; continuing with the others");
            self.dead += 1;
        }
        state.dead = true;
        // Failed again while parked (device down): the parked batches fail with this
        // failure's error.
        self.end_park(node, "the node failed while parked", Some(error));
        for waiting in std::mem::take(&mut self.nodes[node].waiting) {
            self.slab.complete(waiting.ticket, Err(error.clone()));
        }
        for entry in self.inflight.values_mut() {
            if entry.node == node && !entry.reported {
                entry.reported = true;
                self.slab.complete(entry.ticket, Err(error.clone()));
            }
        }
    }

    fn on_completion(&mut self, wc: WorkCompletion) {
        let (seq, index) = wr::split_wr_id(wc.wr_id);
        let Some(entry) = self.inflight.get_mut(&seq) else {
            tracing::debug!(wr_id = wc.wr_id, "completion of an unknown chain ignored");
            return;
        };
        let node = entry.node;
        let node_id = NodeId(node as u16);
        let last = index + 1 == entry.chain.requests().len();
        tracing::trace!(
            node = %node_id,
            seq,
            index,
            last,
            status = wc.status,
            ticket = entry.ticket.0,
            "work completion"
        );
        let mut failed = None;
        if wc.status != 0 {
            let error = status::completion_error(node_id, wc.status);
            match status::classify(wc.status) {
                StatusClass::Flushed => {
                    tracing::debug!(node = %node_id, "work request flushed")
                }
                class => tracing::warn!(
                    node = %node_id,
                    status = status::name(wc.status),
                    vendor_err = wc.vendor_err,
                    ?class,
                    "work request failed"
                ),
            }
            if !entry.reported {
                entry.reported = true;
                self.slab.complete(entry.ticket, Err(error.clone()));
            }
            failed = Some(error);
        } else if last && !entry.reported {
            entry.reported = true;
            let len = entry.chain.staging_len();
            let completion = entry
                .chain
                .complete(self.nic.staging_mut(entry.extent.offset, len));
            self.slab.complete(entry.ticket, Ok(completion));
        }
        if last && let Some(entry) = self.inflight.remove(&seq) {
            let requests = entry.chain.requests().len() as u32;
            let state = &mut self.nodes[node];
            state.outstanding = state.outstanding.saturating_sub(requests);
            if !entry.leak {
                self.staging.release(entry.extent);
            }
        }
        // On a dead node, the error (a flush, after a give-up's abort) comes from the
        // queue pair that failed it: nothing new, and no reason to end its parking.
        if let Some(error) = failed
            && !self.nodes[node].dead
        {
            self.kill(node, &error);
        }
    }

    /// See [`Fabric::progress`]: drains the completion queue, then posts waiting
    /// chains. Returns whether it delivered a completion or a batch is still pending:
    /// a call that completed the last pending batches made progress (the caller's
    /// next poll takes their results), and reporting "nothing pending" then would
    /// read as a stall (the first run over soft-RoCE stalled on exactly that).
    ///
    /// A waiting chain whose batch has a deadline before `now` is failed with
    /// [`FabricError::Fenced`] instead of posted: its operation gave up on it, and
    /// the memory it writes may be recycled (the operation fence, see
    /// [`swarm_core::slot_recycling`]).
    pub fn progress(&mut self, now: Nanos) -> bool {
        self.clock = self.clock.max(now);
        let mut delivered = false;
        loop {
            let mut completions = std::mem::take(&mut self.completions);
            if let Err(code) = self.nic.poll(&mut completions) {
                tracing::error!(code, "ibv_poll_cq failed; every memory node is unreachable");
                self.kill_all();
                completions.clear();
            }
            let drained = completions.is_empty();
            delivered |= !drained;
            for wc in completions.drain(..) {
                self.on_completion(wc);
            }
            self.completions = completions;
            if drained {
                break;
            }
        }
        for node in 0..self.nodes.len() {
            if self.nodes[node].dead {
                delivered |= self.check_park(node, now);
                continue;
            }
            while let Some(waiting) = self.nodes[node].waiting.pop_front() {
                if waiting
                    .batch
                    .deadline()
                    .is_some_and(|deadline| now > deadline)
                {
                    tracing::debug!(
                        node,
                        ticket = waiting.ticket.0,
                        "queued batch past its operation's deadline: failed, not posted"
                    );
                    self.slab.complete(waiting.ticket, Err(FabricError::Fenced));
                    delivered = true;
                    continue;
                }
                if let Some(waiting) = self.try_post(node, waiting) {
                    self.nodes[node].waiting.push_front(waiting);
                    break;
                }
            }
        }
        self.scan_overdue(now);
        delivered || self.slab.pending_count() > 0
    }

    /// See [`Fabric::poll`].
    pub fn poll(&mut self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.slab.poll(ticket)
    }

    /// See [`Fabric::forget`].
    pub fn forget(&mut self, ticket: Ticket) {
        self.slab.forget(ticket);
    }

    /// Chains posted and not reported back yet (for tests and diagnostics).
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Staging bytes lent to chains (for tests and diagnostics).
    pub fn staging_in_use(&self) -> u64 {
        self.staging.in_use()
    }
}

/// An engine with a real-time clock, implementing [`Fabric`].
#[derive(Debug)]
pub struct EngineFabric<N: Nic> {
    engine: RefCell<Engine<N>>,
    started: Instant,
    wake: Cell<Nanos>,
    /// A task yielded since the last `progress` ([`Fabric::yielded`]).
    yielded: Cell<bool>,
}

impl<N: Nic> EngineFabric<N> {
    /// Wraps `engine`.
    pub fn new(engine: Engine<N>) -> Self {
        Self {
            engine: RefCell::new(engine),
            started: Instant::now(),
            wake: Cell::new(0),
            yielded: Cell::new(false),
        }
    }

    /// Borrows the engine.
    pub fn engine(&self) -> std::cell::RefMut<'_, Engine<N>> {
        self.engine.borrow_mut()
    }
}

impl<N: Nic> Fabric for EngineFabric<N> {
    fn node_count(&self) -> usize {
        self.engine.borrow().node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        let now = self.now();
        let mut engine = self.engine.borrow_mut();
        // Before anything new goes out: a post would wake a requester holding a
        // request that the engine must give up on first (module docs).
        engine.scan_overdue(now);
        engine.post(node, batch)
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.engine.borrow_mut().poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.engine.borrow_mut().forget(ticket);
    }

    fn progress(&self) -> bool {
        let now = self.now();
        let pending = self.engine.borrow_mut().progress(now);
        // A pending batch on a silent node still ends: RC retries give up with
        // IBV_WC_RETRY_EXC_ERR. Until then, and until any deadline asked for, keep
        // the executor spinning.
        let more = pending || self.yielded.replace(false) || self.now() < self.wake.get();
        if !more {
            let engine = self.engine.borrow();
            tracing::trace!(
                in_flight = engine.in_flight(),
                staging_in_use = engine.staging_in_use(),
                "progress: no batch pending and no deadline ahead"
            );
        }
        more
    }

    fn now(&self) -> Nanos {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn wake_at(&self, deadline: Nanos) {
        self.wake.set(self.wake.get().max(deadline));
    }

    // A flag, not a deadline: `progress` keeps spinning only while `now < wake`, and
    // a deadline one nanosecond ahead may have passed by then.
    fn yielded(&self) {
        self.yielded.set(true);
    }
}
