//! # SWARM-KV
//!
//! A replicated key-value store on disaggregated memory (SWARM §5): every key is a
//! SWARM register replicated on `2f + 1` memory nodes, found through a replicated
//! index and cached by clients, so that gets and updates take one roundtrip in the
//! common case.
//!
//! * [`layout`] — where everything lives on a memory node.
//! * [`index`] — the replicated, linearizable index (key → register).
//! * [`register_alloc`], [`claim`], [`writer_ids`], [`lease`] — register chunks, writer ids and
//!   leases, claimed from the memory nodes by CAS.
//! * [`orphans`], [`limbo`] — adopting dead clients' register chunks, and reclaiming
//!   the registers gone clients held in their limbos and pools (holder tags, §5.4).
//! * [`cache`] — the client's location cache.
//! * [`client`] — the operations: get, insert, update, delete (§5.3).
//! * [`shm`], `rdma`, [`store`] — clusters on shared-memory files or RDMA memory
//!   nodes, behind one [`Store`] trait.
//!
//! ## Features
//! - `rdma` (off by default): SWARM-KV over RDMA memory nodes (`rdma::RdmaStore`). It
//!   builds `swarm-rdma`, which needs the rdma-core headers and libclang, and links
//!   libibverbs. Without it the crate needs no system library.
#![warn(missing_docs)]

pub mod cache;
pub mod claim;
pub mod client;
pub mod clock;
pub mod configuration;
pub mod duration;
mod error;
pub mod index;
pub mod journal;
pub mod layout;
pub mod lease;
pub mod lease_renewal;
#[cfg(test)]
mod lease_tests;
pub mod limbo;
pub mod orphans;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod reclaim;
pub mod recycle;
pub mod register_alloc;
pub mod repair;
pub mod shm;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod writer_ids;

pub use client::{DEFAULT_LEASE_REVIVE_NS, KvClient, KvConfig};
pub use error::KvError;
#[cfg(feature = "rdma")]
pub use rdma::RdmaStore;
pub use shm::ShmStore;
pub use store::Store;
pub use swarm_core::DeleteOutcome;

pub use index::RegisterId;
