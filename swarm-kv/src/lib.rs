//! # SWARM-KV
//!
//! A replicated key-value store on disaggregated memory (SWARM §5): every key is a
//! SWARM register replicated on `2f + 1` memory nodes, found through a replicated
//! index and cached by clients, so that gets and updates take one roundtrip in the
//! common case.
#![warn(missing_docs)]

pub mod layout;
pub mod ycsb;
