//! The event engine behind [`super::SimWorld`]: a virtual clock, a queue of events
//! ordered by `(time, sequence number)`, and what each event does.
//!
//! A batch's life is a chain of events:
//!
//! 1. `Arrive` after a one-way latency drawn for its node: a crashed node loses the
//!    batch (as it loses every batch on its way to it, executing on it or on its way
//!    back when it crashes); otherwise the whole batch is checked ([`check_batch`]) and a refused
//!    batch goes straight to step 3 with the error.
//! 2. One `Exec` per operation step, strictly in batch order: a read or a CAS is
//!    one instant; a write is one instant per 8-byte chunk, `word_ns` apart, in a
//!    seeded random order (the contract promises nothing about the order, so the
//!    simulation picks the most adversarial one). The next operation starts `op_ns`
//!    after the previous one finished, plus, sometimes, a stall
//!    ([`SimConfig::stall_probability`]), so batch order holds (SWARM §2.1, third
//!    property), while other batches, to this node or others, interleave freely,
//!    and sometimes a whole roundtrip of another client fits between two operations.
//! 3. `Deliver` after another one-way latency: the result lands in the client's
//!    [`TicketSlab`].
//!
//! A batch held by [`Fault::HoldWrite`] waits before step 1 until a later batch that
//! writes some of the same bytes of its node has executed there (it then arrives at
//! once, and lands over those bytes), or for the hold's bound after its post.
//!
//! A batch lost to a crashed node fails as an RDMA queue pair fails it: `Expire`
//! completes its ticket with [`FailureCause::TimedOut`] a queue pair timeout
//! ([`SimConfig::qp_timeout_ns`]) after its own post; nothing of it lands afterwards
//! (the simulation removed it). Without a timeout, its ticket never completes.
//!
//! A batch is *settled* ([`State::settled`], `Fabric::settled`) once nothing of it
//! can land any more: it was lost, refused, or fully executed (its completion on its
//! way back). The simulation knows it before the client could; a write-back guard
//! uses it to go down without waiting for a late completion of a batch that landed.
//!
//! The sequence number breaks ties between events at the same instant in scheduling
//! order, and every random choice comes from the one seeded [`SimRng`], so a run is a
//! pure function of its seed and of what the clients do.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;
use core::task::Poll;

use super::config::SimConfig;
use super::fabric::ClientId;
use super::fault::Fault;
use super::node::{Chunk, Node, chunks};
use super::rng::SimRng;
use super::trace::{BatchId, BatchRef, OpSummary, TraceKind, TraceLog, read_summary};
use swarm_core::fabric::{
    Batch, Completion, FabricError, FailureCause, Nanos, NodeId, Op, OpOutput, Ticket, TicketSlab,
    check_batch,
};

/// Something that happens at a virtual instant.
#[derive(Debug)]
enum Event {
    Arrive(BatchId),
    Exec(BatchId),
    Deliver(BatchId),
    /// A lost batch's queue pair timeout ran out: its ticket fails.
    Expire(BatchRef, Ticket),
    /// A held batch's longest hold ran out ([`Fault::HoldWrite`]): it arrives.
    Release(BatchId),
    Fault(Fault),
    Wake,
}

impl Event {
    fn batch(&self) -> Option<BatchId> {
        match self {
            Self::Arrive(id) | Self::Exec(id) | Self::Deliver(id) | Self::Release(id) => Some(*id),
            Self::Expire(..) | Self::Fault(_) | Self::Wake => None,
        }
    }
}

#[derive(Debug)]
struct ClientState {
    /// Pending entries remember which batch they wait for.
    slab: TicketSlab<BatchRef>,
    crashed: bool,
    /// Posts left before the client crashes (see [`Fault::CrashClientAtPost`]).
    crash_at_post: Option<u32>,
    /// Per node: the slow factor of the link to it (see [`Fault::SlowLink`]), if set.
    links: BTreeMap<NodeId, u32>,
}

/// A write being applied chunk by chunk.
#[derive(Debug)]
struct WriteProgress {
    order: Vec<Chunk>,
    applied: usize,
}

/// A posted batch that has neither completed nor been lost.
#[derive(Debug)]
struct InFlight {
    at: BatchRef,
    ticket: Ticket,
    batch: Batch,
    next_op: usize,
    write: Option<WriteProgress>,
    completion: Completion,
    /// Set when the node refused the batch.
    refused: Option<FabricError>,
    /// Whether it reached its node (a client crash can still lose it before).
    arrived: bool,
    /// When it was posted (virtual time).
    posted_at: Nanos,
    /// Its node is done with it (executed or refused): its completion is on its way
    /// back, and nothing of it lands any more.
    executed: bool,
    /// Held on its way ([`Fault::HoldWrite`]) and not released yet.
    held: bool,
}

/// A [`Fault::HoldWrite`] waiting for the batch it holds.
#[derive(Clone, Copy, Debug)]
struct HoldRequest {
    node: NodeId,
    from: u64,
    to: u64,
    max_ns: Nanos,
}

/// The byte ranges a batch writes, `(start, end)`.
fn written_ranges(batch: &Batch) -> impl Iterator<Item = (u64, u64)> + '_ {
    batch.ops().iter().filter_map(|op| match op {
        Op::Write { addr, data } => Some((*addr, addr.saturating_add(data.len() as u64))),
        Op::Read { .. } | Op::Cas { .. } => None,
    })
}

/// What running one event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stepped {
    /// No event was scheduled.
    Idle,
    /// An event only the nodes see (a batch arrived, an operation step ran).
    Internal,
    /// An event clients can observe: a completion, a timer, a fault.
    Visible,
}

/// What an execution step leads to.
enum Next {
    /// The current operation finished; the next one may start at this time.
    OpDone(Nanos),
    /// The current write has more chunks; the next one lands at this time.
    Chunk(Nanos),
}

/// The whole simulated world. Single-threaded; shared behind `Rc<RefCell<_>>`.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) seed: u64,
    pub(crate) cfg: SimConfig,
    rng: SimRng,
    pub(crate) now: Nanos,
    seq: u64,
    queue: BTreeMap<(Nanos, u64), Event>,
    pub(crate) nodes: Vec<Node>,
    clients: Vec<ClientState>,
    batches: BTreeMap<BatchId, InFlight>,
    next_batch: u64,
    pub(crate) trace: TraceLog,
    /// Instants at which a timer event is scheduled.
    wakes: BTreeSet<Nanos>,
    pub(crate) events_run: u64,
    /// Sees every batch that leaves a client ([`super::SimWorld::observe_posts`]).
    pub(crate) observer: Observer,
    /// [`Fault::HoldWrite`]s waiting for a batch to hold, oldest first.
    holds: Vec<HoldRequest>,
}

/// A callback that sees every batch a client sends, before it travels: the client,
/// the destination node and the batch (posts of crashed clients excluded).
pub type PostObserver = Box<dyn FnMut(ClientId, NodeId, &Batch)>;

/// The [`PostObserver`], if any.
#[derive(Default)]
pub(crate) struct Observer(pub(crate) Option<PostObserver>);

impl core::fmt::Debug for Observer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Observer(Some)"
        } else {
            "Observer(None)"
        })
    }
}

impl State {
    pub(crate) fn new(seed: u64, cfg: SimConfig) -> Self {
        let nodes = cfg
            .nodes
            .iter()
            .map(|node| Node::new(cfg.node_bytes, *node))
            .collect();
        Self {
            seed,
            rng: SimRng::new(seed),
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes,
            clients: Vec::new(),
            batches: BTreeMap::new(),
            next_batch: 0,
            trace: TraceLog::new(cfg.keep_trace),
            wakes: BTreeSet::new(),
            events_run: 0,
            observer: Observer::default(),
            holds: Vec::new(),
            cfg,
        }
    }

    fn record(&mut self, kind: TraceKind) {
        self.trace.record(self.now, kind);
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.insert((at.max(self.now), self.seq), event);
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A one-way message delay between `client` and `node`.
    fn delay(&mut self, client: ClientId, node: NodeId) -> Nanos {
        let Node { latency, slow, .. } = self.nodes[node.index()];
        let low = latency.base_ns.saturating_sub(latency.jitter_ns);
        let high = latency.base_ns.saturating_add(latency.jitter_ns);
        let mut delay = self.rng.between(low, high);
        if latency.tail_probability > 0.0 && self.rng.chance(latency.tail_probability) {
            let tail = if latency.tail_uniform {
                self.rng.between(0, latency.tail_ns)
            } else {
                latency.tail_ns
            };
            delay = delay.saturating_add(tail);
        }
        let link = self.clients[client.0 as usize]
            .links
            .get(&node)
            .copied()
            .unwrap_or(1);
        delay.saturating_mul(u64::from(slow).saturating_mul(u64::from(link)))
    }

    // ---- clients -------------------------------------------------------------

    pub(crate) fn add_client(&mut self) -> ClientId {
        self.clients.push(ClientState {
            slab: TicketSlab::new(),
            crashed: false,
            crash_at_post: None,
            links: BTreeMap::new(),
        });
        ClientId(self.clients.len() as u32 - 1)
    }

    pub(crate) fn client_count(&self) -> usize {
        self.clients.len()
    }

    pub(crate) fn client_crashed(&self, client: ClientId) -> bool {
        self.clients
            .get(client.0 as usize)
            .is_some_and(|c| c.crashed)
    }

    pub(crate) fn pending(&self, client: ClientId) -> usize {
        self.clients
            .get(client.0 as usize)
            .map_or(0, |c| c.slab.pending_count())
    }

    /// The batches `client` posted that have not completed (forgotten ones and ones
    /// lost to a crash included), in posting order.
    pub(crate) fn pending_batches(&self, client: ClientId) -> Vec<BatchRef> {
        let mut batches: Vec<BatchRef> = self
            .clients
            .get(client.0 as usize)
            .map(|c| c.slab.pending_iter().map(|(_, at)| *at).collect())
            .unwrap_or_default();
        batches.sort_unstable_by_key(|at| at.batch);
        batches
    }

    /// Whether `client` is crashed, or crashes at this post
    /// ([`Fault::CrashClientAtPost`]).
    fn crashes_at_post(&mut self, client: ClientId) -> bool {
        let state = &mut self.clients[client.0 as usize];
        if let Some(left) = state.crash_at_post.as_mut() {
            *left -= 1;
            if *left == 0 {
                state.crash_at_post = None;
                state.crashed = true;
                self.record(TraceKind::Fault(Fault::CrashClient(client)));
                self.lose_unsent_batches_of(client);
            }
        }
        self.clients[client.0 as usize].crashed
    }

    fn slab(&mut self, client: ClientId) -> &mut TicketSlab<BatchRef> {
        // Client ids are only minted by `add_client`.
        &mut self.clients[client.0 as usize].slab
    }

    pub(crate) fn post(&mut self, client: ClientId, node: NodeId, batch: Batch) -> Ticket {
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        let at = BatchRef {
            client,
            node,
            batch: id,
        };
        let ops = batch.ops().iter().map(OpSummary::from).collect();
        self.record(TraceKind::Post { at, ops });
        if self.crashes_at_post(client) {
            // It never left the client: pending for good, as if lost.
            self.record(TraceKind::Lost { at });
            return self.slab(client).insert_pending(at);
        }
        if let Some(observe) = self.observer.0.as_mut() {
            observe(client, node, &batch);
        }
        if node.index() >= self.nodes.len() {
            let error = FabricError::NoSuchNode {
                node,
                nodes: self.nodes.len(),
            };
            self.record(TraceKind::Complete {
                at,
                result: Err(error.clone()),
            });
            return self.slab(client).insert_done(Err(error));
        }
        let ticket = self.slab(client).insert_pending(at);
        // A batch held on its way makes its node slow for its client; only one node
        // holds batches at a time, so that a majority always answers.
        let holding_elsewhere = |node: NodeId| {
            self.batches
                .values()
                .any(|flight| flight.held && flight.at.node != node)
        };
        let hold = self.holds.iter().position(|hold| {
            hold.node == node
                && written_ranges(&batch).any(|(addr, _)| (hold.from..hold.to).contains(&addr))
                && !holding_elsewhere(node)
        });
        let hold = hold.map(|index| self.holds.remove(index));
        let arrival = self.now.saturating_add(self.delay(client, node));
        self.batches.insert(
            id,
            InFlight {
                at,
                ticket,
                batch,
                next_op: 0,
                write: None,
                completion: Completion::new(),
                refused: None,
                arrived: false,
                posted_at: self.now,
                executed: false,
                held: hold.is_some(),
            },
        );
        match hold {
            Some(hold) => {
                let release = self.now.saturating_add(hold.max_ns);
                self.schedule(release, Event::Release(id));
            }
            None => self.schedule(arrival, Event::Arrive(id)),
        }
        ticket
    }

    /// Whether nothing of the batch behind `client`'s pending `ticket` can land any
    /// more (module docs): lost, refused, or fully executed. `false` for a ticket
    /// that is not pending.
    pub(crate) fn settled(&mut self, client: ClientId, ticket: Ticket) -> bool {
        let Some(at) = self.slab(client).pending_mut(ticket).map(|at| *at) else {
            return false;
        };
        self.batches
            .get(&at.batch)
            .is_none_or(|flight| flight.executed)
    }

    pub(crate) fn poll(
        &mut self,
        client: ClientId,
        ticket: Ticket,
    ) -> Poll<Result<Completion, FabricError>> {
        self.slab(client).poll(ticket)
    }

    pub(crate) fn forget(&mut self, client: ClientId, ticket: Ticket) {
        self.slab(client).forget(ticket);
    }

    // ---- time ----------------------------------------------------------------

    /// Runs the earliest event, if any, and says whether clients can observe it.
    pub(crate) fn step_event(&mut self) -> Stepped {
        let Some(((time, _), event)) = self.queue.pop_first() else {
            return Stepped::Idle;
        };
        self.now = self.now.max(time);
        self.events_run += 1;
        match event {
            Event::Arrive(id) => self.arrive(id),
            Event::Exec(id) => self.exec(id),
            Event::Release(id) => self.release(id, self.now),
            Event::Deliver(id) => {
                self.deliver(id);
                return Stepped::Visible;
            }
            Event::Expire(at, ticket) => {
                if self.expire(at, ticket) {
                    return Stepped::Visible;
                }
            }
            Event::Fault(fault) => {
                self.apply(fault);
                return Stepped::Visible;
            }
            Event::Wake => {
                self.wakes.remove(&time);
                self.record(TraceKind::Wake);
                return Stepped::Visible;
            }
        }
        Stepped::Internal
    }

    /// Runs events until one that clients can observe (a completion, a timer, a
    /// fault); `false` if the queue ran dry first.
    pub(crate) fn progress(&mut self) -> bool {
        loop {
            match self.step_event() {
                Stepped::Idle => return false,
                Stepped::Visible => return true,
                Stepped::Internal => {}
            }
        }
    }

    /// Runs every event up to `time`, then sets the clock to `time`.
    pub(crate) fn advance_to(&mut self, time: Nanos) {
        while self
            .queue
            .first_key_value()
            .is_some_and(|((t, _), _)| *t <= time)
        {
            self.step_event();
        }
        self.now = self.now.max(time);
    }

    /// Makes sure an event happens at `time` (one timer per instant is enough).
    pub(crate) fn wake_at(&mut self, time: Nanos) {
        if time > self.now && self.wakes.insert(time) {
            self.schedule(time, Event::Wake);
        }
    }

    pub(crate) fn fault_at(&mut self, time: Nanos, fault: Fault) {
        self.schedule(time, Event::Fault(fault));
    }

    // ---- faults --------------------------------------------------------------

    pub(crate) fn apply(&mut self, fault: Fault) {
        self.record(TraceKind::Fault(fault));
        match fault {
            Fault::Crash(node) => {
                self.nodes[node.index()].crashed = true;
                self.lose_batches_of(node);
            }
            Fault::Recover(node) => self.nodes[node.index()].crashed = false,
            Fault::Slow(node, factor) => self.nodes[node.index()].slow = factor.max(1),
            Fault::SlowLink(client, node, factor) => {
                let links = &mut self.clients[client.0 as usize].links;
                if factor > 1 {
                    links.insert(node, factor);
                } else {
                    links.remove(&node);
                }
            }
            Fault::CrashClient(client) => self.clients[client.0 as usize].crashed = true,
            Fault::CrashClientAtPost(client, n) => {
                self.clients[client.0 as usize].crash_at_post = Some(n.max(1));
            }
            Fault::HoldWrite {
                node,
                from,
                to,
                max_ns,
            } => self.holds.push(HoldRequest {
                node,
                from,
                to,
                max_ns,
            }),
        }
    }

    /// A client that crashes at a post ([`Fault::CrashClientAtPost`]) loses each of
    /// its batches still travelling to their node with probability 1/2: the crash of
    /// its machine takes what its network card had not sent yet, in no set order.
    fn lose_unsent_batches_of(&mut self, client: ClientId) {
        let unsent: Vec<BatchId> = self
            .batches
            .iter()
            .filter(|(_, flight)| flight.at.client == client && !flight.arrived)
            .map(|(id, _)| *id)
            .collect();
        for id in unsent {
            if self.rng.chance(0.5)
                && let Some(flight) = self.batches.remove(&id)
            {
                self.record(TraceKind::Lost { at: flight.at });
            }
        }
        let batches = &self.batches;
        self.queue
            .retain(|_, event| event.batch().is_none_or(|id| batches.contains_key(&id)));
    }

    /// A crashed node answers nothing: every batch travelling to it, executing on
    /// it or travelling back from it is lost.
    fn lose_batches_of(&mut self, node: NodeId) {
        let lost: Vec<BatchId> = self
            .batches
            .iter()
            .filter(|(_, flight)| flight.at.node == node)
            .map(|(id, _)| *id)
            .collect();
        for id in &lost {
            if let Some(flight) = self.batches.remove(id) {
                self.record(TraceKind::Lost { at: flight.at });
                self.time_out(&flight);
            }
        }
        let batches = &self.batches;
        self.queue
            .retain(|_, event| event.batch().is_none_or(|id| batches.contains_key(&id)));
    }

    // ---- a batch's life ------------------------------------------------------

    fn arrive(&mut self, id: BatchId) {
        let Some(flight) = self.batches.get(&id) else {
            return;
        };
        let at = flight.at;
        let node = &self.nodes[at.node.index()];
        if node.crashed {
            if let Some(flight) = self.batches.remove(&id) {
                self.record(TraceKind::Lost { at });
                self.time_out(&flight);
            }
            return;
        }
        let checked = check_batch(at.node, &flight.batch, node.size());
        let empty = flight.batch.is_empty();
        if let Some(flight) = self.batches.get_mut(&id) {
            flight.arrived = true;
        }
        self.record(TraceKind::Arrive { at });
        match checked {
            Err(error) => {
                if let Some(flight) = self.batches.get_mut(&id) {
                    flight.refused = Some(error);
                }
                self.send_back(id, self.now);
            }
            Ok(()) if empty => self.send_back(id, self.now),
            Ok(()) => self.schedule(self.now, Event::Exec(id)),
        }
    }

    /// Executes one instantaneous step of the batch's current operation.
    fn exec(&mut self, id: BatchId) {
        let now = self.now;
        let Some(flight) = self.batches.get_mut(&id) else {
            return;
        };
        let at = flight.at;
        let index = flight.next_op;
        let node = &mut self.nodes[at.node.index()];
        let slow = u64::from(node.slow);
        let op_done = now.saturating_add(self.cfg.op_ns.saturating_mul(slow));
        let Some(op) = flight.batch.ops().get(index) else {
            return;
        };
        let (output, next) = match op {
            Op::Read { addr, len } => {
                let bytes = node.read(*addr, *len as usize);
                let (head, hash) = read_summary(&bytes);
                self.trace.record(
                    now,
                    TraceKind::Read {
                        at,
                        index: index as u8,
                        addr: *addr,
                        len: *len,
                        head,
                        hash,
                    },
                );
                (Some(OpOutput::Read(bytes)), Next::OpDone(op_done))
            }
            Op::Cas {
                addr,
                expected,
                new,
            } => {
                let previous = node.cas(*addr, *expected, *new);
                self.trace.record(
                    now,
                    TraceKind::Cas {
                        at,
                        index: index as u8,
                        addr: *addr,
                        expected: *expected,
                        new: *new,
                        previous,
                    },
                );
                (Some(OpOutput::Cas(previous)), Next::OpDone(op_done))
            }
            Op::Write { addr, data } => {
                let (addr, len) = (*addr, data.len() as u64);
                let progress = flight.write.get_or_insert_with(|| {
                    let mut order = chunks(addr, data.len());
                    self.rng.shuffle(&mut order);
                    self.trace.record(
                        now,
                        TraceKind::WriteBegin {
                            at,
                            index: index as u8,
                            addr,
                            len,
                        },
                    );
                    WriteProgress { order, applied: 0 }
                });
                if let Some(chunk) = progress.order.get(progress.applied) {
                    node.store(chunk.addr, &data[chunk.data.clone()]);
                    progress.applied += 1;
                }
                if progress.applied < progress.order.len() {
                    let gap = self.cfg.word_ns.saturating_mul(slow);
                    (None, Next::Chunk(now.saturating_add(gap)))
                } else {
                    flight.write = None;
                    self.trace.record(
                        now,
                        TraceKind::WriteEnd {
                            at,
                            index: index as u8,
                            addr,
                            len,
                        },
                    );
                    (Some(OpOutput::Written), Next::OpDone(op_done))
                }
            }
        };
        if let Some(output) = output {
            // A completion has room for one output per operation of the batch.
            let _ = flight.completion.push(output);
            flight.next_op += 1;
        }
        let more_ops = flight.next_op < flight.batch.len();
        match next {
            Next::Chunk(t) => self.schedule(t, Event::Exec(id)),
            Next::OpDone(t) if more_ops => {
                let stall = self.stall().saturating_mul(slow);
                self.schedule(t.saturating_add(stall), Event::Exec(id));
            }
            Next::OpDone(t) => self.send_back(id, t),
        }
    }

    /// A node's pause before the next operation of a batch (0 unless stalls are on;
    /// no random draw then, so runs without stalls keep their traces).
    fn stall(&mut self) -> Nanos {
        let SimConfig {
            stall_probability,
            stall_ns,
            ..
        } = self.cfg;
        if stall_probability > 0.0 && self.rng.chance(stall_probability) {
            self.rng.between(0, stall_ns)
        } else {
            0
        }
    }

    /// A batch lost to a crashed node fails a queue pair timeout after its post, if
    /// the world has one ([`SimConfig::qp_timeout_ns`]): as an RDMA client's queue
    /// pair gives up on a node that stopped answering.
    fn time_out(&mut self, flight: &InFlight) {
        if let Some(timeout) = self.cfg.qp_timeout_ns {
            let at = flight.posted_at.saturating_add(timeout);
            self.schedule(at, Event::Expire(flight.at, flight.ticket));
        }
    }

    /// A lost batch's queue pair timeout ran out: its ticket fails (nothing of the
    /// batch lands afterwards: it is gone from the world). Returns `true`.
    fn expire(&mut self, at: BatchRef, ticket: Ticket) -> bool {
        let error = FabricError::NodeFailed {
            node: at.node,
            cause: FailureCause::TimedOut,
        };
        self.record(TraceKind::Complete {
            at,
            result: Err(error.clone()),
        });
        self.slab(at.client).complete(ticket, Err(error));
        true
    }

    /// The node is done with the batch at `time`: its completion travels back, and
    /// every batch held for its node ([`Fault::HoldWrite`]) that writes some of the
    /// bytes it wrote arrives then, to land over them.
    fn send_back(&mut self, id: BatchId, time: Nanos) {
        let Some(flight) = self.batches.get_mut(&id) else {
            return;
        };
        flight.executed = true;
        let at = flight.at;
        let arrival = time.saturating_add(self.delay(at.client, at.node));
        self.schedule(arrival, Event::Deliver(id));
        let Some(flight) = self.batches.get(&id) else {
            return;
        };
        if flight.refused.is_some() {
            return;
        }
        let overlaps = |held: &InFlight| {
            written_ranges(&held.batch).any(|(start, end)| {
                written_ranges(&flight.batch).any(|(s, e)| start < e && s < end)
            })
        };
        let released: Vec<BatchId> = self
            .batches
            .iter()
            .filter(|(held_id, held)| {
                // Batch ids follow posting order: only a *later* batch's writes are
                // landed over.
                **held_id < id && held.held && held.at.node == at.node && overlaps(held)
            })
            .map(|(held, _)| *held)
            .collect();
        for held in released {
            self.release(held, time);
        }
    }

    /// A held batch goes on to its node, arriving at `time` ([`Fault::HoldWrite`]);
    /// nothing if it was released or lost already.
    fn release(&mut self, id: BatchId, time: Nanos) {
        if let Some(flight) = self.batches.get_mut(&id)
            && flight.held
        {
            flight.held = false;
            self.schedule(time, Event::Arrive(id));
        }
    }

    fn deliver(&mut self, id: BatchId) {
        let Some(flight) = self.batches.remove(&id) else {
            return;
        };
        let result = match flight.refused {
            Some(error) => Err(error),
            None => Ok(flight.completion),
        };
        self.record(TraceKind::Complete {
            at: flight.at,
            result: result.as_ref().map(|_| ()).map_err(Clone::clone),
        });
        self.slab(flight.at.client).complete(flight.ticket, result);
    }
}

/// Trace events a world prints when it is dropped during a panic.
const PANIC_TRACE_TAIL: usize = 40;

impl Drop for State {
    /// A failing test unwinds through the world: show what it was doing.
    fn drop(&mut self) {
        if std::thread::panicking() && !self.trace.is_empty() {
            let tail = self.trace.tail(PANIC_TRACE_TAIL);
            std::eprintln!(
                "simulation (seed {}) at {} ns, last {} of {} events:\n{}",
                self.seed,
                self.now,
                tail.len(),
                tail.recorded(),
                tail
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Latency;

    /// Posts `batch` from `client` to `node` and runs the world until it completes;
    /// returns the virtual time it took.
    fn roundtrip(state: &mut State, client: ClientId, node: NodeId, batch: Batch) -> Nanos {
        let start = state.now;
        let ticket = state.post(client, node, batch);
        while state.poll(client, ticket).is_pending() {
            assert!(state.progress(), "the world stalled");
        }
        state.now - start
    }

    fn fixed(nodes: usize) -> SimConfig {
        SimConfig::new(nodes, 4096).latency(Latency::new(1_000, 0))
    }

    /// A batch lost to a crashed node fails its queue pair timeout after its post
    /// (with one), and is settled once lost; a batch whose node executed it is settled
    /// before its completion comes back.
    #[test]
    fn lost_batches_fail_at_their_timeout_and_executed_ones_are_settled() {
        let mut state = State::new(1, fixed(2).qp_timeout(Some(50_000)));
        let client = state.add_client();
        state.apply(Fault::Crash(NodeId(1)));
        let start = state.now;
        let lost = state.post(client, NodeId(1), Batch::write(0, alloc::vec![1; 8]));
        assert!(!state.settled(client, lost), "on its way");
        state.advance_to(start + 1_500);
        assert!(state.settled(client, lost), "lost: nothing of it lands");
        while state.poll(client, lost).is_pending() {
            assert!(state.progress(), "the timeout is scheduled");
        }
        assert_eq!(state.now - start, 50_000);
        let ticket = state.post(client, NodeId(0), Batch::write(0, alloc::vec![2; 8]));
        assert!(!state.settled(client, ticket), "on its way");
        state.advance_to(state.now + 1_500);
        assert!(state.poll(client, ticket).is_pending());
        assert!(
            state.settled(client, ticket),
            "executed, completion on its way"
        );
        // Without a timeout, a lost batch never completes.
        let mut state = State::new(1, fixed(2).qp_timeout(None));
        let client = state.add_client();
        state.apply(Fault::Crash(NodeId(1)));
        let lost = state.post(client, NodeId(1), Batch::read(0, 8));
        while state.progress() {}
        assert!(state.poll(client, lost).is_pending());
        assert!(state.settled(client, lost));
    }

    /// A held write lands right after a later batch that wrote the same bytes of its
    /// node, over them; without one, it arrives at its hold's bound. While one node
    /// holds a batch, a hold of another node's waits.
    #[test]
    fn a_held_write_lands_over_a_later_write_of_its_bytes_or_at_its_bound() {
        let mut state = State::new(1, fixed(2));
        let client = state.add_client();
        let hold = |node| Fault::HoldWrite {
            node: NodeId(node),
            from: 64,
            to: 128,
            max_ns: 100_000,
        };
        state.apply(hold(0));
        state.apply(hold(1));
        let start = state.now;
        let held = state.post(client, NodeId(0), Batch::write(64, alloc::vec![1; 8]));
        // Node 1's hold waits while node 0 holds a batch: this write is not held.
        let other = roundtrip(
            &mut state,
            client,
            NodeId(1),
            Batch::write(64, alloc::vec![3; 8]),
        );
        assert_eq!(other, 2_020);
        // A later write elsewhere on node 0 does not release it.
        roundtrip(
            &mut state,
            client,
            NodeId(0),
            Batch::write(8, alloc::vec![4; 8]),
        );
        assert!(state.poll(client, held).is_pending());
        assert!(!state.settled(client, held));
        let later = roundtrip(
            &mut state,
            client,
            NodeId(0),
            Batch::write(64, alloc::vec![2; 8]),
        );
        assert_eq!(later, 2_020);
        while state.poll(client, held).is_pending() {
            assert!(state.progress(), "released");
        }
        assert!(state.now - start < 100_000, "released by the later write");
        assert_eq!(
            state.nodes[0].read(64, 8),
            alloc::vec![1; 8],
            "landed over it"
        );
        // Node 1's hold takes its next write now, which arrives at the bound.
        let start = state.now;
        let bound = roundtrip(
            &mut state,
            client,
            NodeId(1),
            Batch::write(72, alloc::vec![5; 8]),
        );
        assert_eq!(state.now - start, bound);
        assert_eq!(bound, 100_000 + 1_020);
    }

    #[test]
    fn a_slow_link_slows_only_its_client_and_node() {
        let mut state = State::new(1, fixed(2));
        let (slow, other) = (state.add_client(), state.add_client());
        state.apply(Fault::SlowLink(slow, NodeId(0), 5));
        let read = || Batch::read(0, 8);
        assert_eq!(roundtrip(&mut state, slow, NodeId(0), read()), 10_020);
        assert_eq!(roundtrip(&mut state, slow, NodeId(1), read()), 2_020);
        assert_eq!(roundtrip(&mut state, other, NodeId(0), read()), 2_020);
        state.apply(Fault::SlowLink(slow, NodeId(0), 1));
        assert_eq!(roundtrip(&mut state, slow, NodeId(0), read()), 2_020);
    }

    #[test]
    fn a_spread_tail_draws_each_extra_delay_up_to_its_bound() {
        let config = fixed(1).latency(Latency::new(1_000, 0).with_tail_upto(1.0, 10_000));
        let mut state = State::new(3, config);
        let client = state.add_client();
        let times: BTreeSet<Nanos> = (0..20)
            .map(|_| roundtrip(&mut state, client, NodeId(0), Batch::read(0, 8)))
            .collect();
        assert!(
            times.iter().all(|&t| (2_020..=22_020).contains(&t)),
            "{times:?}"
        );
        assert!(times.len() > 10, "extra delays vary: {times:?}");
    }

    #[test]
    fn stalls_delay_the_next_operation_of_a_batch_only() {
        let batch = || {
            let mut batch = Batch::read(0, 8);
            batch.push(Op::Read { addr: 8, len: 8 }).expect("room");
            batch
        };
        let mut calm = State::new(5, fixed(1));
        let client = calm.add_client();
        assert_eq!(roundtrip(&mut calm, client, NodeId(0), batch()), 2_040);
        let mut stalling = State::new(5, fixed(1).stalls(1.0, 50_000));
        let client = stalling.add_client();
        let times: BTreeSet<Nanos> = (0..10)
            .map(|_| roundtrip(&mut stalling, client, NodeId(0), batch()))
            .collect();
        assert!(
            times.iter().all(|&t| (2_040..=52_040).contains(&t)),
            "{times:?}"
        );
        assert!(times.iter().any(|&t| t > 12_040), "{times:?}");
        // A one-operation batch has no gap to stall in.
        assert_eq!(
            roundtrip(&mut stalling, client, NodeId(0), Batch::read(0, 8)),
            2_020
        );
    }
}
