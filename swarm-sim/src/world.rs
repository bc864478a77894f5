//! [`SimWorld`]: the simulated cluster, its clock, its faults and its trace.

use alloc::vec::Vec;
use core::cell::RefCell;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::rc::Rc;

use super::config::SimConfig;
use super::engine::{State, Stepped};
use super::fabric::{ClientId, SimFabric};
use super::fault::Fault;
use super::trace::{BatchRef, Trace, TraceKind};
use swarm_core::fabric::{Batch, FabricError, Nanos, NodeId, check_bounds};

/// A simulated cluster of memory nodes and the clients talking to them.
///
/// Cloning a `SimWorld` gives another handle on the same world (it is an `Rc`
/// inside): the world is single-threaded and every client, clock and runner shares
/// it. Everything random in it is drawn from one generator seeded by the `seed`
/// given to [`SimWorld::new`], so a run replays exactly from its seed.
#[derive(Clone)]
pub struct SimWorld {
    pub(crate) state: Rc<RefCell<State>>,
}

impl core::fmt::Debug for SimWorld {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.state.try_borrow() {
            Ok(state) => f
                .debug_struct("SimWorld")
                .field("seed", &state.seed)
                .field("now", &state.now)
                .field("nodes", &state.nodes.len())
                .field("clients", &state.client_count())
                .field("events_run", &state.events_run)
                .finish(),
            Err(_) => f.write_str("SimWorld { <busy> }"),
        }
    }
}

impl SimWorld {
    /// A world shaped by `config`, every random choice derived from `seed`.
    pub fn new(seed: u64, config: SimConfig) -> Self {
        Self {
            state: Rc::new(RefCell::new(State::new(seed, config))),
        }
    }

    /// A default world (three 1 MiB nodes, ~1 µs one-way latency) from `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self::new(seed, SimConfig::default())
    }

    /// A new client: its own fabric handle, with its own tickets.
    pub fn client(&self) -> SimFabric {
        let id = self.state.borrow_mut().add_client();
        SimFabric::new(self.clone(), id)
    }

    /// The seed this world was created with.
    pub fn seed(&self) -> u64 {
        self.state.borrow().seed
    }

    /// The configuration this world was created with.
    pub fn config(&self) -> SimConfig {
        self.state.borrow().cfg.clone()
    }

    /// The virtual clock, in nanoseconds since the world was created.
    pub fn now(&self) -> Nanos {
        self.state.borrow().now
    }

    /// Number of memory nodes.
    pub fn node_count(&self) -> usize {
        self.state.borrow().nodes.len()
    }

    /// Number of clients created so far.
    pub fn client_count(&self) -> usize {
        self.state.borrow().client_count()
    }

    /// Number of events executed so far.
    pub fn events_run(&self) -> u64 {
        self.state.borrow().events_run
    }

    /// Whether any event (message, operation step, fault, timer) is scheduled.
    pub fn has_events(&self) -> bool {
        self.state.borrow().has_events()
    }

    /// Batches `client` posted that have not completed (including forgotten ones and
    /// those lost to a crash, which complete only at their queue pair timeout, or
    /// never without one).
    pub fn pending(&self, client: ClientId) -> usize {
        self.state.borrow().pending(client)
    }

    /// The batches `client` posted that have not completed, oldest first: what a
    /// stalled client waits for (forgotten and lost batches included).
    pub fn pending_batches(&self, client: ClientId) -> Vec<BatchRef> {
        self.state.borrow().pending_batches(client)
    }

    /// Nodes currently crashed.
    pub fn crashed_nodes(&self) -> Vec<NodeId> {
        let state = self.state.borrow();
        (0..state.nodes.len())
            .filter(|n| state.nodes[*n].crashed)
            .map(|n| NodeId(n as u16))
            .collect()
    }

    /// Runs the next event (one message arrival, one operation step, one
    /// completion, ...) and advances the clock to it. Returns `false` when no event
    /// is scheduled.
    pub fn step(&self) -> bool {
        self.state.borrow_mut().step_event() != Stepped::Idle
    }

    /// Runs events until one that clients can observe: a completion delivered, a
    /// timer fired, a fault applied. Returns `false` when no event is scheduled:
    /// nothing outstanding can complete any more unless a client posts. This is
    /// [`swarm_core::Fabric::progress`]; executors poll their tasks after each call
    /// (polling them between events they cannot observe would change nothing).
    pub fn progress(&self) -> bool {
        self.state.borrow_mut().progress()
    }

    /// Runs every scheduled event, including the background batches nobody waits
    /// for. Useful before inspecting memory at the end of a test.
    pub fn drain(&self) {
        while self.state.borrow_mut().step_event() != Stepped::Idle {}
    }

    /// Runs every event scheduled up to `time`, then sets the clock to `time` (if it
    /// is later than now).
    pub fn advance_to(&self, time: Nanos) {
        self.state.borrow_mut().advance_to(time);
    }

    /// A future that completes once the virtual clock reached `now + ns`. A timer
    /// event makes sure the clock gets there.
    pub fn sleep(&self, ns: Nanos) -> Sleep {
        let deadline = self.now().saturating_add(ns);
        self.wake_at(deadline);
        Sleep {
            world: self.clone(),
            deadline,
        }
    }

    /// Schedules a timer event at `time` (if later than now), so that the clock
    /// reaches it: this is [`swarm_core::Fabric::wake_at`].
    pub fn wake_at(&self, time: Nanos) {
        self.state.borrow_mut().wake_at(time);
    }

    // ---- faults --------------------------------------------------------------

    fn validate(&self, fault: Fault) {
        let state = self.state.borrow();
        match fault {
            Fault::Crash(node)
            | Fault::Recover(node)
            | Fault::Slow(node, _)
            | Fault::HoldWrite { node, .. } => assert!(
                node.index() < state.nodes.len(),
                "fault {fault} names node {node}, but the world has {} nodes",
                state.nodes.len()
            ),
            Fault::CrashClient(client) | Fault::CrashClientAtPost(client, _) => assert!(
                (client.0 as usize) < state.client_count(),
                "fault {fault} names client {}, but the world has {} clients",
                client.0,
                state.client_count()
            ),
            Fault::SlowLink(client, node, _) => assert!(
                (client.0 as usize) < state.client_count() && node.index() < state.nodes.len(),
                "fault {fault} names client {} and node {node}, but the world has {} clients \
                 and {} nodes",
                client.0,
                state.client_count(),
                state.nodes.len()
            ),
        }
    }

    /// Applies `fault` now.
    ///
    /// # Panics
    /// If the fault names a node or client that does not exist (a bug in the test).
    pub fn apply(&self, fault: Fault) {
        self.validate(fault);
        self.state.borrow_mut().apply(fault);
    }

    /// Schedules `fault` at virtual time `time` (now, if `time` is past).
    ///
    /// # Panics
    /// If the fault names a node or client that does not exist (a bug in the test).
    pub fn at(&self, time: Nanos, fault: Fault) {
        self.validate(fault);
        self.state.borrow_mut().fault_at(time, fault);
    }

    /// Crashes `node` now (see [`Fault::Crash`]).
    pub fn crash(&self, node: NodeId) {
        self.apply(Fault::Crash(node));
    }

    /// Brings `node` back now, memory intact (see [`Fault::Recover`]).
    pub fn recover(&self, node: NodeId) {
        self.apply(Fault::Recover(node));
    }

    /// Makes `node` `factor` times slower from now on (see [`Fault::Slow`]).
    pub fn set_slow(&self, node: NodeId, factor: u32) {
        self.apply(Fault::Slow(node, factor));
    }

    /// Has `observe` see every batch that leaves a client from now on, as it is
    /// posted (replacing any earlier observer): the posting client, the destination
    /// node and the batch. Posts a crashed client drops
    /// ([`Fault::CrashClientAtPost`]) are not seen. It runs inside the world: it must
    /// not call back into it.
    pub fn observe_posts(&self, observe: impl FnMut(ClientId, NodeId, &Batch) + 'static) {
        self.state.borrow_mut().observer.0 = Some(Box::new(observe));
    }

    /// Crashes `client` now (see [`Fault::CrashClient`]).
    pub fn crash_client(&self, client: ClientId) {
        self.apply(Fault::CrashClient(client));
    }

    /// Whether `node` is crashed.
    pub fn is_crashed(&self, node: NodeId) -> bool {
        self.state
            .borrow()
            .nodes
            .get(node.index())
            .is_some_and(|n| n.crashed)
    }

    /// Whether `client` crashed.
    pub fn client_crashed(&self, client: ClientId) -> bool {
        self.state.borrow().client_crashed(client)
    }

    // ---- memory --------------------------------------------------------------

    /// Reads node memory directly, outside virtual time and untraced (for test
    /// assertions).
    pub fn peek(&self, node: NodeId, addr: u64, len: usize) -> Result<Vec<u8>, FabricError> {
        let state = self.state.borrow();
        let mem = Self::node(&state, node)?;
        check_bounds(node, addr, len as u64, mem.size())?;
        Ok(mem.read(addr, len))
    }

    /// Writes node memory directly and atomically, outside virtual time (for test
    /// setup). Traced as a fault-free instant write.
    pub fn poke(&self, node: NodeId, addr: u64, data: &[u8]) -> Result<(), FabricError> {
        let mut state = self.state.borrow_mut();
        let size = Self::node(&state, node)?.size();
        check_bounds(node, addr, data.len() as u64, size)?;
        state.nodes[node.index()].store(addr, data);
        let now = state.now;
        state.trace.record(
            now,
            TraceKind::Poke {
                node,
                addr,
                len: data.len() as u64,
            },
        );
        Ok(())
    }

    fn node(state: &State, node: NodeId) -> Result<&super::node::Node, FabricError> {
        state
            .nodes
            .get(node.index())
            .ok_or(FabricError::NoSuchNode {
                node,
                nodes: state.nodes.len(),
            })
    }

    // ---- trace ---------------------------------------------------------------

    /// A copy of the trace so far.
    pub fn trace(&self) -> Trace {
        self.state.borrow().trace.snapshot()
    }

    /// The last `n` trace events (what to print when a test fails).
    pub fn trace_tail(&self, n: usize) -> Trace {
        self.state.borrow().trace.tail(n)
    }

    /// The xxh3 digest of the whole trace so far: equal digests mean equal runs.
    pub fn trace_digest(&self) -> u64 {
        self.state.borrow().trace.digest()
    }
}

/// A virtual-time sleep (see [`SimWorld::sleep`]).
#[derive(Debug)]
pub struct Sleep {
    world: SimWorld,
    deadline: Nanos,
}

impl Sleep {
    /// When the sleep ends.
    pub fn deadline(&self) -> Nanos {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.world.now() >= self.deadline {
            Poll::Ready(())
        } else {
            // Driven by re-polling after each world step, like a roundtrip.
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}
