//! Scripted schedules on the simulated fabric: one register on three nodes, clients
//! with chosen writer ids, clock skews and fabrics, operations spawned at chosen
//! instants and recorded for the linearizability checker.
//!
//! Latencies are fixed (one microsecond one way, no jitter), so a script is exact;
//! each test also asserts that its schedule went as scripted, so that it cannot pass
//! vacuously if timing changes elsewhere.

#![allow(dead_code)] // Each test binary uses part of it.

use std::borrow::Borrow;
use std::cell::Cell;
use std::rc::Rc;
use std::task::Poll;

use swarm_checker::{OpKind, Recorder};
use swarm_core::encoding::WriterId;
use swarm_core::fabric::Nanos;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Completion, DeleteOutcome, Fabric, FabricError, NodeId, Op, OpStats,
    ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, Ticket, WriteOutcome,
};
use swarm_sim::{Fault, Latency, SimClock, SimConfig, SimFabric, SimRunner, SimWorld, TaskHandle};

pub const KEY: &str = "k";
/// One-way latency of every message, fixed so a script is exact.
pub const ONE_WAY_NS: u64 = 1_000;
pub const US: u64 = 1_000;
pub const MS: u64 = 1_000_000;

/// An operation of a script.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// Register write (register model).
    Write(&'static str),
    /// Register read (register model).
    Read,
    /// Key-value insert: a write that must succeed.
    Insert(&'static str),
    /// Key-value update: a write that fails if it finds the register deleted.
    Update(&'static str),
    /// Key-value delete: succeeds if it removed a present value.
    Delete,
    /// Key-value get: a read; deleted and empty are both absent.
    Get,
}

/// What a scripted operation reports back to the test.
#[derive(Debug, Default, Clone)]
pub struct Done {
    /// The value a read returned.
    pub value: Option<String>,
    /// What a write reported.
    pub outcome: Option<WriteOutcome>,
    /// What a delete reported.
    pub deleted: Option<DeleteOutcome>,
    /// The protocol error, if the operation failed.
    pub error: Option<String>,
    pub roundtrips: u32,
    pub iterations: u32,
    pub end: u64,
}

pub struct Script {
    pub world: SimWorld,
    pub layout: Layout,
    pub reg: RegisterLoc,
    pub recorder: Rc<Recorder>,
}

impl Script {
    /// Three nodes, one register replicated on all of them, room for `writers`;
    /// exact latencies.
    pub fn new(writers: u16) -> Self {
        Self::seeded(writers, 7, 0)
    }

    /// Like [`Script::new`], with the world's `seed` and `jitter_ns` of latency jitter.
    pub fn seeded(writers: u16, seed: u64, jitter_ns: u64) -> Self {
        let shape = |log_base| {
            Layout::builder()
                .payload_max(32)
                .meta_words(2)
                .log_base(log_base)
                .writers(writers)
                .slots_per_writer(64)
                .build()
        };
        let register_bytes = shape(0).expect("valid layout").register_bytes();
        let log_base = (HEADER_SIZE + register_bytes).next_multiple_of(4096);
        let layout = shape(log_base).expect("valid layout");
        let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
        let config = SimConfig::new(3, node_bytes)
            .latency(Latency::new(ONE_WAY_NS, jitter_ns))
            .keep_trace(false);
        Self {
            world: SimWorld::new(seed, config),
            layout,
            reg: RegisterLoc::at(HEADER_SIZE, Replicas::all(3, 0).expect("three replicas")),
            recorder: Rc::new(Recorder::new()),
        }
    }

    /// A protocol client with writer id `writer` on `fabric`, its clock `skew_ns`
    /// ahead of simulated time. Replies slower than 10 µs are slow (fallback).
    pub fn client<F: Fabric>(&self, fabric: F, writer: u16, skew_ns: i64) -> Client<F, SimClock> {
        let config = ProtocolConfig::default()
            .with_slow_after_ns(10 * US)
            .with_suspect_ns(100 * MS);
        Client::new(
            fabric,
            SimClock::new(&self.world, 100).with_skew(skew_ns),
            self.layout,
            WriterId::new(writer.into()).expect("valid writer id"),
            config,
        )
        .expect("client")
    }

    /// A client on its own simulated connection, with an exact clock.
    pub fn sim_client(&self, writer: u16) -> Client<SimFabric, SimClock> {
        self.client(self.world.client(), writer, 0)
    }

    /// Spawns `step` on `client` (owned, or shared with other tasks through an `Rc`)
    /// at `start`, on behalf of simulated client `task`
    /// (the id crash faults name). The operation is recorded for the checker; its
    /// return is recorded only if it succeeded and `alive()` still holds (a client
    /// that crashed mid-operation never returns: the checker keeps it pending).
    pub fn spawn<F: Fabric + 'static>(
        &self,
        runner: &SimRunner,
        start: u64,
        task: swarm_sim::ClientId,
        client: impl Borrow<Client<F, SimClock>> + 'static,
        step: Step,
        alive: impl Fn() -> bool + 'static,
    ) -> TaskHandle<Done> {
        let (reg, recorder, world) = (self.reg.clone(), self.recorder.clone(), self.world.clone());
        let who = u64::from(client.borrow().writer().get());
        runner.spawn_at(start, task, async move {
            let client = client.borrow();
            let (stats, mut cache) = (OpStats::new(), RegisterCache::default());
            let (kind, value) = match step {
                Step::Write(v) => (OpKind::Write, Some(v)),
                Step::Insert(v) => (OpKind::Insert, Some(v)),
                Step::Update(v) => (OpKind::Update, Some(v)),
                Step::Read => (OpKind::Read, None),
                Step::Get => (OpKind::Get, None),
                Step::Delete => (OpKind::Delete, None),
            };
            let id = recorder.begin(who, kind, KEY, value, world.now());
            let mut done = Done::default();
            let ok = match step {
                Step::Read | Step::Get => match client.read(&reg, &mut cache, &stats).await {
                    Ok(read) => {
                        done.value = match read {
                            ReadValue::Value(bytes) => {
                                Some(String::from_utf8(bytes).expect("utf-8 value"))
                            }
                            ReadValue::Empty | ReadValue::Deleted => None,
                        };
                        Ok(Some(true))
                    }
                    Err(e) => Err(e),
                },
                Step::Delete => client.delete(&reg, &mut cache, &stats).await.map(|o| {
                    done.deleted = Some(o);
                    // Raced: an unknown outcome.
                    o.removed()
                }),
                Step::Write(v) | Step::Insert(v) | Step::Update(v) => client
                    .write(&reg, &mut cache, &stats, v.as_bytes())
                    .await
                    .map(|o| Some(record_outcome(&mut done, o))),
            };
            done.end = world.now();
            done.roundtrips = stats.roundtrips();
            done.iterations = stats.iterations();
            match ok {
                Ok(ok) if alive() => {
                    recorder
                        .end(id, ok, done.value.as_deref(), done.end)
                        .expect("recorded once");
                }
                Ok(_) => {}
                Err(e) => done.error = Some(format!("{e} ({} iterations)", done.iterations)),
            }
            done
        })
    }

    /// Checks the recorded history; panics with the checker's report if it is not
    /// linearizable.
    pub fn assert_linearizable(&self) {
        let history = self.recorder.history().expect("well-formed history");
        swarm_checker::assert_linearizable(&history);
    }
}

fn record_outcome(done: &mut Done, outcome: WriteOutcome) -> bool {
    done.outcome = Some(outcome);
    outcome == WriteOutcome::Written
}

/// Takes a finished task's result, or panics naming the task.
pub fn finished(handle: &TaskHandle<Done>, what: &str) -> Done {
    handle
        .take()
        .unwrap_or_else(|| panic!("{what} did not finish"))
}

/// What happens to a client right after its first timestamp lock (at the first
/// batch it posts after the lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterLock {
    /// It crashes: that batch is replaced by a harmless one-word read, so memory
    /// never sees it, and the client's tasks are dropped.
    Crash,
    /// Its links to every node become this many times slower, from that batch on.
    Slow(u32),
}

/// A client fabric that injects [`AfterLock`] right after the client's first
/// timestamp lock. Lock words live in log slots (`TRYLOCK` CASes a slot's first
/// word): the only single-CAS batches at or above the log base.
pub struct AfterFirstLock {
    inner: SimFabric,
    world: SimWorld,
    log_base: u64,
    then: AfterLock,
    locked: Cell<bool>,
    triggered: Cell<bool>,
    crashed: Rc<Cell<bool>>,
}

impl AfterFirstLock {
    /// Crashes the client after its first lock.
    pub fn new(world: &SimWorld, layout: &Layout) -> Self {
        Self::then(world, layout, AfterLock::Crash)
    }

    /// Does `then` after the client's first lock.
    pub fn then(world: &SimWorld, layout: &Layout, then: AfterLock) -> Self {
        Self {
            inner: world.client(),
            world: world.clone(),
            log_base: layout.log_base(),
            then,
            locked: Cell::new(false),
            triggered: Cell::new(false),
            crashed: Rc::new(Cell::new(false)),
        }
    }

    /// The simulated client crash faults name.
    pub fn id(&self) -> swarm_sim::ClientId {
        self.inner.id()
    }

    /// Set once the client crashed.
    pub fn crashed(&self) -> Rc<Cell<bool>> {
        self.crashed.clone()
    }

    fn is_lock(&self, batch: &Batch) -> bool {
        matches!(batch.ops(), [Op::Cas { addr, .. }] if *addr >= self.log_base)
    }
}

impl Fabric for AfterFirstLock {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        if self.is_lock(&batch) {
            self.locked.set(true);
        } else if self.locked.get() && !self.triggered.replace(true) {
            match self.then {
                AfterLock::Crash => {
                    self.crashed.set(true);
                    self.world.crash_client(self.inner.id());
                }
                AfterLock::Slow(factor) => {
                    for node in 0..self.inner.node_count() {
                        let fault = Fault::SlowLink(self.inner.id(), NodeId(node as u16), factor);
                        self.world.apply(fault);
                    }
                }
            }
        }
        if self.crashed.get() {
            return self.inner.post(node, Batch::read(0, 8));
        }
        self.inner.post(node, batch)
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }

    fn settled(&self, ticket: Ticket) -> bool {
        self.inner.settled(ticket)
    }

    fn progress(&self) -> bool {
        self.inner.progress()
    }

    fn now(&self) -> Nanos {
        self.inner.now()
    }

    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline)
    }
}
