//! Synchronisation primitives, swappable for `loom`'s model-checked ones.
//!
//! Word-level code (the in-process [`crate::mem`] fabric, and through it the MAX and
//! TRYLOCK algorithms) imports its atomics from here, so that the same code runs on
//! `loom` when the `loom` feature is on (as in tokio and concurrent-queue).

#[cfg(feature = "loom")]
pub use loom::sync::Arc;
#[cfg(feature = "loom")]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

#[cfg(not(feature = "loom"))]
pub use alloc::sync::Arc;
#[cfg(not(feature = "loom"))]
pub use core::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
