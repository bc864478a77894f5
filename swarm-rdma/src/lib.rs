//! SWARM fabric over RDMA verbs (work in progress).
pub mod auth;
pub mod bootstrap;
pub mod error;
pub mod wire;

pub use error::RdmaError;
