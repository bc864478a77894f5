//! Who may write: a client's membership in the cluster.
//!
//! A client joins by claiming a row of the client table by CAS on a majority of the
//! memory nodes ([`claim`]); the row is its writer id ([`writer_ids`]), the id its
//! SWARM writes carry (SWARM §4.3, one out-of-place log per writer). It keeps the id
//! only while it renews the row's lease ([`lease`] has the arithmetic and the
//! argument, [`lease_renewal`] the I/O), and stops issuing operations once the lease
//! ran out (self-fencing). The writer ids of clients whose lease ended are taken over
//! or released by the next client that finds the table full ([`writer_takeover`]),
//! on shared memory only once the owner's process is gone ([`owner_process`]).
//!
//! The registers a client holds are another matter: [`crate::registers`].

pub mod claim;
pub mod lease;
pub mod lease_renewal;
#[cfg(test)]
mod lease_tests;
pub mod owner_process;
pub mod writer_ids;
pub mod writer_takeover;
