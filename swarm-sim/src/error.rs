//! How a simulation run can fail.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use super::fabric::ClientId;
use super::trace::BatchRef;
use swarm_core::fabric::{Nanos, NodeId};

/// How many stuck batches a stall message lists.
const LISTED: usize = 8;

/// Lists batches as `c0 b190 -> n1, ...`.
fn list(batches: &[BatchRef]) -> String {
    let mut out = String::new();
    for (i, at) in batches.iter().take(LISTED).enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(out, "{sep}c{} b{} -> n{}", at.client.0, at.batch.0, at.node);
    }
    if batches.len() > LISTED {
        let _ = write!(out, ", ... ({} in all)", batches.len());
    }
    if out.is_empty() {
        out.push_str("none");
    }
    out
}

/// Why [`super::SimRunner::run`] stopped before every task finished.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Tasks remain, but no event can happen any more: they wait on batches that can
    /// never complete. With a live majority this is a wait-freedom violation; with a
    /// crashed majority it is expected (SWARM §2.2).
    #[error(
        "simulation (seed {seed}) stalled at {at} ns: {tasks} task(s) of clients {clients:?} \
         wait on batches that can never complete (pending: {}; crashed nodes: {crashed:?}); \
         with a live majority, the protocol waits for a node it must not wait for",
        list(.pending)
    )]
    Stalled {
        /// The world's seed.
        seed: u64,
        /// Virtual time of the stall.
        at: Nanos,
        /// Unfinished tasks.
        tasks: usize,
        /// Their clients (sorted, deduplicated).
        clients: Vec<ClientId>,
        /// The batches those clients posted that never completed, oldest first
        /// (background batches nobody waits for included).
        pending: Vec<BatchRef>,
        /// The nodes crashed at the time of the stall.
        crashed: Vec<NodeId>,
    },
    /// Virtual time passed the runner's limit with tasks unfinished: a livelock (an
    /// operation that keeps retrying), or a legitimately long run.
    #[error(
        "simulation (seed {seed}) passed its virtual time limit of {limit} ns with {tasks} \
         task(s) of clients {clients:?} unfinished: a livelock, or raise SimRunner::time_limit"
    )]
    TimeLimit {
        /// The world's seed.
        seed: u64,
        /// The limit in virtual nanoseconds.
        limit: Nanos,
        /// Unfinished tasks.
        tasks: usize,
        /// Their clients (sorted, deduplicated).
        clients: Vec<ClientId>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BatchId;
    use alloc::string::ToString;

    #[test]
    fn a_stall_names_what_it_waits_for() {
        let at = |batch| BatchRef {
            client: ClientId(2),
            node: NodeId(1),
            batch: BatchId(batch),
        };
        let stall = SimError::Stalled {
            seed: 4,
            at: 100,
            tasks: 1,
            clients: alloc::vec![ClientId(2)],
            pending: alloc::vec![at(190)],
            crashed: alloc::vec![NodeId(1)],
        };
        let text = stall.to_string();
        assert!(text.contains("seed 4"), "{text}");
        assert!(
            text.contains("pending: c2 b190 -> n1; crashed nodes: [NodeId(1)]"),
            "{text}"
        );
        let many: Vec<BatchRef> = (0..10).map(at).collect();
        assert!(list(&many).ends_with("c2 b7 -> n1, ... (10 in all)"));
        assert_eq!(list(&[]), "none");
    }
}
