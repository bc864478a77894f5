//! # swarm-fusee: FUSEE, SWARM's main baseline, on SWARM's fabric contract
//!
//! FUSEE (Shen et al., FAST '23) is a fully memory-disaggregated key-value store: the
//! index and the allocation metadata live on the memory nodes and clients manage them
//! with one-sided operations. SWARM's evaluation (SWARM §7) compares SWARM-KV with it:
//! FUSEE's gets take 1-2 roundtrips and its updates at least 4, and it pauses while a
//! master recovers from a memory-node failure, where SWARM-KV does not. This crate
//! implements it on [`swarm_core::Fabric`], so it runs on shared memory, the simulator
//! and RDMA like SWARM-KV, in the same benchmark harness (`swarm bench --system fusee`).
//!
//! The pieces, each in its own file, after FUSEE's sections:
//! * `slot`: RACE hashing slots and buckets (§4.2);
//! * `rules`: SNAPSHOT's three conflict-resolution rules (§4.3, Algorithm 2);
//! * `client`: SEARCH / INSERT / UPDATE / DELETE and the SNAPSHOT write (§4.3, Figure 9)
//!   with the index cache (§4.6);
//! * `alloc`: two-level memory management, client side (§4.4);
//! * `object`: out-of-place objects with the embedded operation log (§4.5);
//! * `master`: membership and recovery from memory-node failures and unfinished rounds
//!   (§5.2, Algorithms 3 and 4);
//! * `recovery`: a crashed client's operations finished from its embedded log (§5.3);
//! * `layout` and `store`: where things live on a node; a shared-memory store.
//!
//! What differs from the paper, and why, is said in each module: memory nodes run no
//! code here (block allocation is a CAS), objects are not recycled, the master is an
//! object shared by a process's clients, deletes leave a tombstone in the key's slot.

mod alloc;
mod client;
mod error;
mod layout;
mod master;
mod object;
mod recovery;
mod rules;
mod slot;
mod store;

pub use client::{FuseeClient, FuseeConfig};
pub use error::FuseeError;
pub use layout::{FuseeLayout, FuseeParams};
pub use master::{Master, StepGuard, View};
pub use recovery::recover_client;
pub use store::FuseeStore;
