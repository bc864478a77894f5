//! The SWARM protocol: In-n-Out max registers replicated with Safe-Guess.
//!
//! Layering, bottom up, as in the paper:
//!
//! 1. [`inout`] — one fallible max register on one memory node (In-n-Out, §4): the
//!    batches that read a register and MAX a value into it, and their validation.
//! 2. [`maxreg`] — a reliable max register over `n = 2f + 1` replicas (§2.3,
//!    appendix A), with the client-side cache and the preferred-majority fallback (§6).
//! 3. [`tslock`] — timestamp locks (§3.3, appendix B).
//! 4. [`safeguess`] — Safe-Guess reads and writes (§3.2, appendix C); [`delete`] —
//!    deletes with the tombstone timestamp in a write-once delete word (§5.3.2), and
//!    what a delete that raced another one may report; `fresh` — the first write of
//!    a fresh, unpublished register ([`Client::write_fresh`], §5.3.1: one batch per
//!    replica of a majority, VERIFIED at once, since it races nothing; with
//!    [`Client::write_fresh_carrying`], one batch per replica that also carries a
//!    store's own operation after the write, such as SWARM-KV's index CAS).
//! 5. [`abd`] and [`raw`] — the DM-ABD and unreplicated baselines of §7.
//!
//! Beside the layers: [`quorum`], the broadcast and preferred-majority steps they
//! and embedders' own replicated structures are built from, and [`resume`] and
//! [`summary`], which let a new incarnation of a writer id continue an earlier one's
//! log.
//!
//! Every operation is an `async fn` on a [`Client`] (one per client thread) and takes
//! the register's [`RegisterLoc`], the client's [`RegisterCache`] for it and an
//! [`crate::OpStats`] that counts its roundtrips.

pub mod abd;
mod carried;
mod client;
pub mod delete;
mod error;
mod fresh;
pub mod guess;
pub mod inout;
pub mod maxreg;
pub mod quorum;
pub mod raw;
mod read_block;
pub mod register;
pub mod resume;
pub mod safeguess;
pub mod slot_recycling;
pub mod summary;
mod suspicion;
pub mod tslock;
pub mod write_back_guard;

pub use client::{Client, ProtocolConfig};
pub use delete::{DeleteOutcome, DeleteVotes, FirstDeleter, UNOWNED_TOMBSTONE};
pub use error::SwarmError;
pub use fresh::{Carried, FreshOutcome};
pub use register::{MAX_REPLICAS, RegisterCache, RegisterLoc, Replicas};
pub use safeguess::{PendingRead, ReadStart};
pub use suspicion::Suspicion;

use alloc::vec::Vec;

/// What a read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadValue {
    /// The register was never written (a pre-cleared register).
    Empty,
    /// The register holds this payload.
    Value(Vec<u8>),
    /// The register was deleted (tombstone, §5.3.2).
    Deleted,
}

/// What a read's common case made of the value it read in place, for a caller that
/// consumes the payload where it lies rather than taking an owned copy
/// ([`Client::raw_read_now_with`], [`Client::read_start_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadInPlace<R> {
    /// The register was never written.
    Empty,
    /// Its record validated: what the caller's `consume` made of the payload.
    Value(R),
}

/// How a write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The write took effect.
    Written,
    /// The register was deleted before the write could take effect; nothing changed.
    Deleted,
}
