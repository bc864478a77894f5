//! Seeded protocol scenarios on the simulated fabric, checked for linearizability.
//!
//! A scenario runs closed-loop clients, each issuing reads and writes on a few
//! replicated registers through Safe-Guess (or DM-ABD, for comparison), over a
//! [`SimWorld`](crate::SimWorld) with the failures of SWARM §2.2 injected ([`Faults`]): a crashed
//! minority of memory nodes, slow nodes, slow spells and slow client-node links,
//! late messages, nodes that stall between the operations of a batch, clock skew
//! and clock jumps that make timestamp guesses stale, clients that crash
//! mid-operation, and torn reads (the simulation tears every write that overlaps a
//! read). A client may keep several operations in flight on one writer id
//! ([`Scenario::inflight`]), and keys may be deleted and re-inserted
//! ([`Scenario::delete_percent`]), which turns the history into a key-value one.
//! Every operation is recorded in a [`History`](swarm_checker::History) for the linearizability checker
//! (`swarm-checker`), with its roundtrips and, for Safe-Guess reads, its loop
//! iterations (appendix C bounds them by `2·writers + 1`).
//!
//! The protocol tests and the `sim-history` example are thin wrappers around
//! [`run`], so that any failing test can be replayed from the command line with the
//! seed it prints.
//!
//! The scenario's rooms: `config` (its knobs: [`Scenario`], [`Faults`],
//! [`Recycling`], [`Protocol`]), `workload` (the closed-loop lanes of each client and
//! the operations they issue), `faults` (the fault schedule and the simulator's own
//! settings), `incarnations` (clients that crash and restart on their writer id, and
//! the check of the writes their incarnations sent), `outcome` ([`Outcome`], the
//! history and its measures) and `run` ([`run`]: the world, the tasks, the glue).

mod config;
mod faults;
mod incarnations;
mod outcome;
mod run;
mod workload;

pub use config::{Faults, Protocol, Recycling, Scenario};
pub use outcome::{Outcome, RoundtripHistogram};
pub use run::run;
