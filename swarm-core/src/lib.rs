//! # swarm-core
//!
//! The SWARM replication protocol (“SWARM: Replicating Shared Disaggregated-Memory
//! Data in No Time”) without any I/O: wait-free, linearizable registers replicated
//! over `n = 2f + 1` passive memory nodes, with one-roundtrip reads and writes in the
//! common case.
//!
//! The crate is `#![no_std]` (it needs an allocator) and knows nothing of any
//! transport. Everything it needs from disaggregated memory is the [`Fabric`]
//! contract of SWARM §2.1: non-atomic reads and writes, an atomic 8-byte CAS, ordered
//! batches to one node, and quorum waits. Transports (`swarm-shm`, `swarm-rdma`, the
//! deterministic simulated fabric of `swarm-sim`) implement it; protocol code is
//! written as `async fn`s over it and driven by the small executor in [`exec`].
//!
//! Time is an input: timestamps come from a caller-supplied [`Clock`], timeouts from
//! [`Fabric::now`]. The core reads no clock, spawns no thread and does no I/O.
//!
//! ## Example
//!
//! Three memory nodes in this process ([`mem::MemCluster`]), one register replicated
//! on all three, written and read by a client through Safe-Guess (SWARM §3.2): both
//! operations take one roundtrip in the common case (SWARM Table 2).
//!
//! ```
//! use swarm_core::FixedClock;
//! use swarm_core::encoding::WriterId;
//! use swarm_core::MemCluster;
//! use swarm_core::{
//!     Client, Layout, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc,
//!     Replicas, WriteOutcome, block_on,
//! };
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Registers of up to 64 B with 4 metadata words each; the out-of-place logs of
//! // 8 writers (256 slots each) start at 64 KiB on every node.
//! let layout = Layout::builder()
//!     .payload_max(64)
//!     .meta_words(4)
//!     .log_base(64 << 10)
//!     .writers(8)
//!     .slots_per_writer(256)
//!     .build()?;
//! let cluster = MemCluster::new(3, 1 << 20);
//!
//! // One client per thread: its own fabric handle, a timestamp clock, a writer id.
//! let client = Client::new(
//!     cluster.client(),
//!     FixedClock(1_000), // a real deployment passes a synchronised clock
//!     layout,
//!     WriterId::new(0).expect("writer ids go up to 2047"),
//!     ProtocolConfig::default(),
//! )?;
//!
//! // The register at byte 4096 of nodes 0, 1 and 2; the key's hash picks the primary.
//! let register = RegisterLoc::at(4096, Replicas::all(3, 42)?);
//! let mut cache = RegisterCache::new(); // what this client knows of the register
//!
//! // `block_on` returns the operation's own result; a stall (every node it waits
//! // on failed) comes back as `SwarmError::Fabric(FabricError::Stalled)`.
//! let stats = OpStats::new();
//! let write = client.write(&register, &mut cache, &stats, b"hello");
//! let written = block_on(client.fabric(), write)?;
//! assert_eq!(written, WriteOutcome::Written);
//! println!("write: {} roundtrip(s)", stats.roundtrips());
//!
//! let stats = OpStats::new();
//! let read = block_on(client.fabric(), client.read(&register, &mut cache, &stats))?;
//! assert_eq!(read, ReadValue::Value(b"hello".to_vec()));
//! println!("read: {} roundtrip(s)", stats.roundtrips());
//! assert_eq!(stats.roundtrips(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! [`block_on`] suits one operation at a time; [`LocalExecutor`] keeps several of one
//! thread in flight, and [`SlotExecutor`] several of one future type, without an
//! allocation per operation. The [`exec`] module states the executor contract, including what
//! to do on a foreign executor such as tokio.
//!
//! ## Where things are
//!
//! The root holds what an application needs: [`Client`] and its operations' types,
//! [`Layout`], [`Replicas`]/[`RegisterLoc`], [`OpStats`], [`block_on`] and
//! [`LocalExecutor`], the in-process fabric [`MemCluster`], the [`Clock`] trait, and
//! the error types. Six modules are public on purpose: [`fabric`] (the transport
//! contract) and [`header`] for transport implementers, [`encoding`] and [`layout`]
//! for the on-memory formats, [`exec`] for the executor contract, and [`units`]
//! (`units::parse_size`) for the tools that size memory nodes, kept off the root,
//! which is the protocol's; [`quorum`] and [`resume`] are the quorum steps and the
//! log scan that stores built on the core
//! (SWARM-KV) reuse. The protocol layers themselves (max register, In-n-Out,
//! timestamp locks, Safe-Guess, DM-ABD) are private: their behaviour is [`Client`]'s.
//!
//! ## Features
//! - `std`: implement `std::error::Error` for the error types.
//!
//! Without features the crate builds for `no_std` targets with an allocator. The
//! simulator and the linearizability checker live in their own crates (`swarm-sim`,
//! `swarm-checker`). Building with `RUSTFLAGS="--cfg loom"` runs the word-level code
//! on `loom`'s model-checked atomics (`tests/loom.rs`).
#![no_std]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

// Formats and contracts that transports and tools build on are public modules; the
// rest is private and re-exported below, deliberately.
pub mod encoding;
pub mod exec;
pub mod fabric;
pub mod header;
pub mod layout;
pub mod units;
pub mod words;

mod clock;
mod mem;
mod protocol;
mod roundtrip;
mod sync;

pub use clock::{Clock, FixedClock};
pub use exec::{
    LocalExecutor, SlotExecutor, TaskId, block_on, block_on_future, join, sleep, step_rounds,
    yield_now,
};
pub use fabric::{
    Batch, Completion, Fabric, FabricError, FailureCause, NodeId, Op, OpOutput, Payload, Submitted,
    Ticket,
};
pub use layout::{Layout, LayoutBuilder, LayoutError};
pub use mem::{MemCluster, MemFabric};
#[cfg(loom)]
#[doc(hidden)]
pub use protocol::inout::max_on_node;
pub use protocol::{
    Carried, Client, DeleteOutcome, DeleteVotes, FirstDeleter, FreshOutcome, MAX_REPLICAS,
    PendingRead, ProtocolConfig, ReadInPlace, ReadStart, ReadValue, RegisterCache, RegisterLoc,
    Replicas, Suspicion, SwarmError, UNOWNED_TOMBSTONE, WriteOutcome, quorum, resume,
    slot_recycling, summary, write_back_guard,
};
pub use roundtrip::{
    DeadlineScope, MAX_CLUSTER_NODES, MAX_NODES, OpStats, Roundtrip, Wait, WaitOutcome,
    post_background, post_background_for,
};
