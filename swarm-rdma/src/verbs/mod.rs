//! The thin unsafe layer over `rdma-sys`: devices, memory registration, completion
//! queues, queue pairs and posting.
//!
//! Every `unsafe` block of the crate's verbs use lives here, in small functions with
//! a `// SAFETY:` comment each; ownership (an `Arc<Device>` in every object, an
//! `Arc<CompletionQueue>` in every queue pair) makes verbs objects die in the order
//! verbs requires. None of it can run on a machine without an RDMA device; it is
//! exercised by `tests/device.rs`, which skips (visibly) elsewhere.

pub mod cq;
pub mod device;
pub mod events;
pub mod gid;
pub mod memlock;
pub mod memory;
pub mod post;
pub mod qp;
pub mod selftest;
