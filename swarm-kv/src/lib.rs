//! # SWARM-KV
//!
//! A replicated key-value store on disaggregated memory (SWARM §5). Memory nodes are
//! passive — shared-memory files on one host ([`ShmStore`]) or RDMA memory nodes
//! (`RdmaStore`, feature `rdma`) — and clients run the whole protocol: every key is a
//! register replicated on `2f + 1` memory nodes, found through a replicated index and
//! cached by clients, so that gets and updates take one memory roundtrip in the
//! common case. Every operation is linearizable, and keeps working while a minority of
//! memory nodes is down.
//!
//! ## Quickstart
//!
//! Create a store of three memory nodes (here, files in a temporary directory), write
//! from one thread, read and delete from another:
//!
//! ```
//! use swarm_kv::{ClusterParams, DeleteOutcome, ShmStore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Three memory nodes of 32 MiB. In production put them on a tmpfs (/dev/shm),
//! // hugetlbfs or DAX mount; other processes open them with `ShmStore::open(dir)`.
//! let dir = std::env::temp_dir().join(format!("swarm-kv-quickstart-{}", std::process::id()));
//! let store = ShmStore::create(&dir, 3, 32 << 20, ClusterParams::default())?;
//!
//! // The store is a cheap, `Send + Sync` handle: each thread connects its own client.
//! let writer = std::thread::spawn({
//!     let store = store.clone();
//!     move || -> Result<(), swarm_kv::KvError> {
//!         let kv = store.connect()?;
//!         kv.put("user:42", "Ada")?; // insert or update
//!         Ok(())
//!     } // dropping `kv` gives its writer id back
//! });
//! writer.join().expect("the writer thread")?;
//!
//! let kv = store.connect()?;
//! assert_eq!(kv.get("user:42")?.as_deref(), Some(&b"Ada"[..]));
//! assert!(kv.update("user:42", "Ada Lovelace")?); // only if present
//! assert_eq!(kv.delete("user:42")?, DeleteOutcome::Removed);
//! assert_eq!(kv.get("user:42")?, None);
//! println!("{:.2} roundtrips per operation", kv.stats().roundtrips_per_operation());
//!
//! drop((kv, store));
//! std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! ## The API
//!
//! * **Stores**: [`ShmStore::create`] / [`ShmStore::open`] (shared-memory node files),
//!   `RdmaStore::open_cluster_file` / `RdmaStore::format` (feature `rdma`); both implement
//!   [`Store`]. [`ClusterParams`] sets a new cluster's limits (key and value sizes,
//!   replicas, writer ids, leases); the `swarm` command creates, inspects and repairs
//!   clusters too (`docs/cli.md`).
//! * **Clients**: [`Kv`], blocking (`get`, `put`, `insert`, `update`, `delete`, `stats`;
//!   `get_into` reads into the caller's buffer and, on shared memory, allocates
//!   nothing); [`AsyncKv`], the same operations as `Send` futures (no `get_into`); [`KvClient`], the low-level
//!   client they wrap (operations as `async fn`s to drive on a SWARM executor, several
//!   in flight per thread), configured by [`KvConfig`], with timestamps from the
//!   [`SystemClock`].
//! * **Outcomes**: [`KvError`], [`DeleteOutcome`], [`Stats`].
//!
//! `put` inserts or updates; `insert` inserts an absent key only (`false` if it
//! held a value); `update` changes a present key only (`false` if absent); `delete` reports [`DeleteOutcome::Removed`], [`DeleteOutcome::Absent`],
//! or [`DeleteOutcome::Raced`] (another delete of the same value ran at the same time:
//! the key is gone, and which delete removed it is undecided). Keys and values are
//! bytes (`impl AsRef<[u8]>`), up to the cluster's [`ClusterParams::key_max`] and
//! [`ClusterParams::value_max`].
//!
//! ## Sharing across threads
//!
//! A store ([`ShmStore`], `RdmaStore`) is `Clone + Send + Sync`: clone it into every
//! thread, or share it by reference. A client is per thread: [`Kv`] is `Send` (it can
//! move to another thread) but not `Sync`, because it owns a fabric handle and a
//! location cache that it uses without locks. Each thread connects its own with
//! [`ShmStore::connect`] and keeps it for as long as it runs: connecting takes a few
//! roundtrips, and the location cache is what makes operations take one.
//!
//! Each connected client holds one of the cluster's writer ids
//! ([`ClusterParams::writers`], 64 by default, shared by every process); when all
//! are taken by running clients, connecting waits for one to be given back, up to
//! [`KvConfig::writer_wait_ns`] (10 s), then fails with [`KvError::WritersFull`]. A client gives its id back
//! when it is dropped or closed ([`Kv::close`]). Leases are renewed by operations,
//! with no background thread: when every id is taken, a connecting client waits a
//! lease period (about 2.5 s by default) and takes over the id of a client that did
//! nothing meanwhile — one that crashed, or one merely idle, whose next operation then
//! fails with [`KvError::LeaseExpired`] (connect a new client). So size
//! [`ClusterParams::writers`] for the clients you keep connected, and close the ones
//! you no longer need.
//!
//! ## From async code
//!
//! SWARM-KV operations spin on the memory while they wait (a roundtrip is
//! microseconds), so they must not run on an async executor's threads. [`AsyncKv`]
//! runs them on a worker thread of its own and hands the outcomes back as `Send`
//! futures that any executor (tokio, async-std, ...) can await; this crate depends on
//! none. One `AsyncKv` is one thread, one writer id, and one operation at a time: its
//! docs have the cost model. `examples/tokio.rs` shows it under `#[tokio::main]`.
//! Alternatively, call a [`Kv`] from `tokio::task::spawn_blocking` or a thread of
//! your own.
//!
//! ## Errors
//!
//! Every fallible call returns [`KvError`], whose messages say what failed and what
//! to do. Three kinds matter to an application: bad input ([`KvError::EmptyKey`],
//! [`KvError::KeyTooLong`], [`KvError::ValueTooLarge`]: fix the call); a full cluster
//! ([`KvError::RegistersFull`], [`KvError::WritersFull`]: delete keys, close clients,
//! or create a larger cluster); and faults (a majority of memory nodes unreachable,
//! [`KvError::LeaseExpired`]: reconnect; [`KvError::Contended`]: retry;
//! [`KvError::Fenced`]: the operation stalled past its deadline — a get retries
//! stalls itself before reporting it; a write's outcome is then unknown, so read the
//! key before writing again).
//!
//! ## Features
//!
//! - `rdma` (off by default): SWARM-KV over RDMA memory nodes (`RdmaStore`, see
//!   `examples/rdma.rs`). It builds `swarm-rdma`, which needs the rdma-core headers
//!   and libclang, and links libibverbs. Without it the crate needs no system library.
//!
//! ## Operating a store
//!
//! The [`admin`] module is the operator's API that the `swarm` command and the
//! benchmark harness use: counting keys and registers, the writer-id table and
//! eviction, the index scrub, node repair's options and report, and the types that
//! the settings and errors above mention. The rest (the replicated index, register
//! allocation and recycling, limbos, leases and writer ids, the repair journal) is
//! private; ARCHITECTURE.md maps it to the paper.
#![warn(missing_docs)]

pub mod admin;
mod api;
mod cache;
mod client;
mod clock;
mod configuration;
mod error;
mod index;
mod layout;
mod membership;
mod placement;
#[cfg(feature = "rdma")]
mod rdma;
mod registers;
mod repair;
mod shm;
mod store;
#[cfg(test)]
mod test_support;
#[doc(hidden)]
pub mod testing;

pub use api::{AsyncKv, Kv, Stats};
pub use client::{KvClient, KvConfig};
pub use clock::SystemClock;
pub use error::KvError;
pub use layout::ClusterParams;
#[cfg(feature = "rdma")]
pub use rdma::RdmaStore;
pub use shm::ShmStore;
pub use store::Store;
pub use swarm_core::DeleteOutcome;

#[cfg(test)]
use client::DEFAULT_LEASE_REVIVE_NS;
use index::RegisterId;

/// The README's code blocks, compiled and run by `cargo test --doc` (its `rust`
/// blocks only: the others are `sh` and `text`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}
