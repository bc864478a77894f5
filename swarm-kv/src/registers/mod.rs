//! Where a key's register comes from and where it goes (SWARM §5.4).
//!
//! * [`alloc`] — two-level allocation: chunks of registers claimed by CAS, then a
//!   client's own pool of pre-cleared registers for its inserts.
//! * [`recycle`] — registers a client retired (unmapped by its delete, or written by
//!   an insert that became an update) wait out a grace in its limbo, are reset on
//!   their replicas and go back to a pool.
//! * [`orphans`], [`limbo`] — what gone clients held: their chunks are adopted, and
//!   the registers in their limbos and pools reclaimed, by holder tags in key headers.
//! * [`give_back`] — what a client that closes cleanly never used: chunks it handed
//!   nothing out of go back to the chunk table, its other unused registers and its
//!   pool are donated.
//! * [`reset`] — what a reset stores: a life marker above every earlier word, by CAS,
//!   so that no late store of an earlier life lands on the next one.
//! * [`journal`] — how recycled registers keep coming back while a repair rebuilds a
//!   node.
//!
//! Who a client is (writer ids, leases) is [`crate::membership`].

pub mod alloc;
pub mod give_back;
pub mod journal;
pub mod limbo;
pub mod orphans;
pub mod recycle;
pub mod reset;
