//! How a simulation run can fail.

use alloc::vec::Vec;

use super::fabric::ClientId;
use crate::fabric::Nanos;

/// Why [`super::SimRunner::run`] stopped before every task finished.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Tasks remain, but no event can happen any more: they wait on batches that can
    /// never complete. With a live majority this is a wait-freedom violation; with a
    /// crashed majority it is expected (SWARM §2.2).
    #[error(
        "simulation (seed {seed}) stalled at {at} ns: {tasks} task(s) of clients {clients:?} \
         wait on batches that can never complete; check that a majority of nodes is alive, \
         otherwise the protocol waits for a node it must not wait for"
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
