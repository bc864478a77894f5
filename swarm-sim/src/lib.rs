//! # swarm-sim
//!
//! The deterministic, fault-injecting simulated fabric for `swarm-core`.
//!
//! Every protocol test runs here: the fabric contract of SWARM §2.1 executed with
//! seeded randomness, under the failures of SWARM §2.2, in virtual time, so that a
//! failing interleaving replays exactly from its seed. [`scenario`] runs seeded
//! closed-loop workloads of Safe-Guess or DM-ABD registers on it and checks their
//! histories with `swarm-checker`.
//!
//! # The model
//!
//! - **Memory nodes** are zeroed byte arrays ([`SimConfig::node_bytes`]).
//! - **Messages.** A batch travels to its node and its completion travels back, each
//!   after its own random one-way delay drawn from the node's [`Latency`]
//!   (`base ± jitter`, optional tail, times the node's and the link's slow
//!   factors). Independent draws reorder batches across nodes, and also across
//!   batches to one node: the contract only orders operations *within* a batch, so
//!   neither does the simulation.
//! - **Execution at the node.** The operations of a batch run strictly in order
//!   (SWARM §2.1, third property: "if the second update is visible, so is the
//!   first"): the next starts `op_ns` after the previous one finished, or later if
//!   the node stalls ([`SimConfig::stalls`]), sometimes long enough for a whole
//!   roundtrip of another client to land between two operations of one batch. A
//!   read and a CAS each happen at one instant; a write is applied one
//!   8-byte-aligned chunk at a time, `word_ns` apart, **in a seeded random order**. Batches of other
//!   clients interleave with it freely, so a read overlapping a write returns it
//!   torn, at 8-byte granularity and never below (SWARM §2.1, first property; §4).
//!   A CAS on an aligned word is atomic (second property). Out-of-bounds or
//!   misaligned batches are refused whole by [`swarm_core::fabric::check_batch`] and
//!   complete with the error.
//! - **Faults** ([`Fault`]), each for a reason of SWARM §2.2:
//!   [`Fault::Crash`] (a node stops answering; batches to, on, or from it are lost
//!   and fail a queue pair timeout after their post, as over RDMA
//!   ([`SimConfig::qp_timeout_ns`]), so quorum waits must not need it),
//!   [`Fault::Recover`] (the node answers again with its memory: a healed partition
//!   or an outage of a node whose memory survived; lost batches stay lost),
//!   [`Fault::Slow`] (a straggler, which makes protocols abandon a preferred
//!   majority for a fallback node after a timeout), [`Fault::SlowLink`] (one
//!   client reaches one node late: clients disagree on which majority answers
//!   first), [`Fault::CrashClient`] and [`Fault::CrashClientAtPost`] (the client's tasks are dropped
//!   mid-operation, but what it posted still executes, leaving half-done work for
//!   others, as real hardware does), [`Fault::HoldWrite`] (one write batch to a
//!   node held on its way until a later batch has written the same bytes there, or
//!   for a long bound: a slow queue pair whose batch lands after its slot's reuse,
//!   which the contract allows, as it orders only the operations of one batch).
//! - **Time** is a virtual clock in nanoseconds. Events wait in a queue ordered by
//!   `(time, sequence number)`. [`SimWorld::step`] runs one;
//!   [`SimWorld::progress`] (which is [`swarm_core::Fabric::progress`]) runs them up to
//!   the next one a client can observe, and returns `false` only when the queue is
//!   empty: nothing outstanding can complete, so executors report a stall. Deadlines
//!   ([`swarm_core::Fabric::wake_at`], [`SimWorld::sleep`]) are timer events, so a
//!   protocol waiting for a timeout is never mistaken for a stalled one.
//!   [`SimClock`] turns virtual time into timestamp ticks with a per-client skew,
//!   to make Safe-Guess timestamp guesses stale on purpose.
//!
//! Not simulated: bandwidth and queueing (delays do not grow with load), message
//! loss other than by crashes, corruption, nodes that lose their memory (wipe one
//! with [`SimWorld::poke`] if a test needs it), and clock drift (skew only changes
//! when a test changes it).
//!
//! # Determinism and debugging
//!
//! All randomness comes from one [`SimRng`] seeded with the world's seed, events
//! at the same instant run in scheduling order, and [`SimRunner`] polls tasks in
//! spawn order, so a run is a function of its seed and of the test's code. Every
//! post, operation, completion, loss and fault is recorded in the [`Trace`] with
//! its virtual time, and the trace is folded into [`SimWorld::trace_digest`].
//! Randomized tests iterate over [`seeds`] (or [`for_each_seed`]): a failure
//! prints `simulation failed with seed N (rerun with SWARM_SIM_SEED=N)`, and a
//! world dropped during the panic prints the tail of its trace.
//!
//! # Example
//!
//! Three nodes, a write replicated to a majority while one node crashes:
//!
//! ```
//! use swarm_sim::{Fault, SimRunner, SimWorld, for_each_seed};
//! use swarm_core::{Batch, NodeId, OpStats, Roundtrip};
//!
//! for_each_seed(10, |seed| {
//!     let world = SimWorld::with_seed(seed); // 3 nodes, ~1 µs one way
//!     let mut runner = SimRunner::new(&world);
//!     let client = world.client();
//!     let write = runner.spawn(client.id(), async move {
//!         let stats = OpStats::new();
//!         let mut step = Roundtrip::start(&client, &stats);
//!         for node in 0..3 {
//!             step.post(NodeId(node), Batch::write(64, vec![7; 16]))?;
//!         }
//!         step.wait(2).await // a majority, never all
//!     });
//!     runner.at(500, Fault::Crash(NodeId(2))); // mid-flight
//!     runner.run().expect("a majority is alive, so nothing stalls");
//!     assert_eq!(write.take(), Some(Ok(())));
//!     assert_eq!(world.peek(NodeId(0), 64, 16).unwrap(), vec![7; 16]);
//! });
//! ```

#![warn(missing_docs)]

extern crate alloc;

mod clock;
mod config;
mod digest;
mod engine;
mod error;
mod fabric;
mod fault;
mod node;
mod rng;
mod runner;
mod seeds;
mod trace;
mod world;

pub mod scenario;

pub use clock::{CLOCK_EPOCH_NS, SimClock};
pub use config::{Latency, NodeConfig, QP_TIMEOUT_NS, SimConfig};
pub use engine::PostObserver;
pub use error::SimError;
pub use fabric::{ClientId, RATE_UNIT, SimFabric};
pub use fault::Fault;
pub use rng::SimRng;
pub use runner::{RunReport, SimRunner, Spawner, TaskHandle};
pub use seeds::{SEED_BASE_VAR, SEED_VAR, SEEDS_VAR, SeedGuard, for_each_seed, seed_base, seeds};
pub use trace::{BatchId, BatchRef, OpSummary, Trace, TraceEvent, TraceKind, TraceTail};
pub use world::{SimWorld, Sleep};
