//! SWARM fabric over RDMA verbs (work in progress).
pub mod auth;
pub mod bootstrap;
pub mod config;
pub mod error;
pub mod fabric;
pub mod staging;
pub mod status;
pub mod verbs;
pub mod wire;
pub mod wr;

pub use error::RdmaError;
