//! Synchronisation primitives, swappable for `loom`'s model-checked ones.
//!
//! Word-level code ([`crate::words`], which the in-process fabric and `swarm-shm`
//! execute batches with) imports its atomics from here, so that the same code runs on
//! `loom` when the crate is built with `RUSTFLAGS="--cfg loom"` (the convention of
//! tokio and concurrent-queue; see `tests/loom.rs`).

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub use loom::sync::atomic::AtomicU64;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{Ordering, fence};

#[cfg(not(loom))]
pub(crate) use alloc::sync::Arc;
#[cfg(not(loom))]
pub use core::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{Ordering, fence};
