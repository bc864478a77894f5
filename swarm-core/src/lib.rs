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

pub mod clock;
pub mod encoding;
pub mod exec;
pub mod fabric;
pub mod header;
pub mod layout;
pub mod mem;
pub mod protocol;
pub mod roundtrip;
mod sync;

pub use clock::Clock;
pub use exec::{LocalExecutor, block_on};
pub use fabric::{Batch, Completion, Fabric, FabricError, NodeId, Op, OpOutput, Ticket};
pub use protocol::{
    Client, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, SwarmError,
    WriteOutcome,
};
pub use roundtrip::{OpStats, Roundtrip, WaitOutcome};
