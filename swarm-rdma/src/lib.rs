//! # swarm-rdma
//!
//! SWARM's fabric over RDMA verbs, and the memory-node daemon.
//!
//! SWARM (§2.1) needs from disaggregated memory non-atomic reads and writes, an
//! atomic 8-byte compare-and-swap, and ordered pipelines of operations to one node
//! that complete in one roundtrip. Over RDMA these are one-sided `RDMA READ`,
//! `RDMA WRITE` and `ATOMIC_CMP_AND_SWP` on reliable-connected queue pairs, and a
//! pipeline is one chain of work requests posted with one doorbell. Memory nodes
//! are passive: a tiny daemon registers memory and hands out queue pairs, then its
//! CPU sleeps (SWARM §2.1: no code runs next to the data).
//!
//! ## Layout
//!
//! Pure logic, tested everywhere:
//! - [`wr`]: a batch → a chain of work requests (opcodes, signaling, inline, fences
//!   per the InfiniBand ordering rules), address translation and bounds checks;
//! - [`staging`]: the client's registered staging buffer, shared by chains in flight;
//! - [`fabric::engine`]: tickets, back-pressure, completions, node failure — tested
//!   on the emulated provider's NIC ([`emu::EmuNic`], RC semantics);
//! - [`status`]: verbs statuses → [`swarm_core::FabricError::NodeFailed`];
//! - [`wire`], [`auth`], [`bootstrap`]: the authenticated TCP bootstrap (tested on
//!   loopback);
//! - [`config`]: node lists, sizes, the cluster file;
//! - [`emu`]: an emulated verbs provider below [`verbs::post::SendQueue`] (reordering
//!   within the IBA rules, errors mid-chain, CAS reply byte order), so that the real
//!   chains `post.rs` builds run in tests, protocol histories included;
//! - [`fabric::RdmaFabric`]'s own logic (reconnects, incarnation checks,
//!   configuration changes, [`fabric::transport`]), over that provider behind the
//!   real bootstrap ([`emu::EmulatedMemnode`], [`emu::EmuTransport`]).
//!
//! The unsafe verbs layer, [`verbs`], and what is built on it — [`fabric::RdmaFabric`]
//! over [`fabric::VerbsTransport`], and [`memnode`] — need a device; `tests/device.rs`
//! runs them where one exists (hardware or soft-RoCE) and prints a `SKIPPED` line
//! elsewhere.
//!
//! ## Entry points
//!
//! - Memory node (`swarm memnode --listen ADDR:PORT --size 4GiB [--device NAME]`):
//!   [`memnode::serve`] with [`memnode::MemnodeOptions`], or
//!   [`memnode::MemnodeConfig::from_cluster`] then [`memnode::Memnode::start`].
//! - Clients (`--rdma HOST:PORT,...` or a cluster file): [`config::parse_nodes`] or
//!   [`config::ClusterConfig::load`], then [`fabric::RdmaConfig`],
//!   [`fabric::RdmaCluster::open`] once per process and
//!   [`fabric::RdmaCluster::client`] once per thread; the result implements
//!   [`swarm_core::Fabric`].
//! - `swarm init`: [`auth::Token::generate`] and [`config::ClusterConfig::render`].
//!
//! Without an RDMA device, both entry points fail with [`RdmaError::NoDevice`], whose
//! message starts with `no RDMA device found:`.

#[cfg(target_endian = "big")]
compile_error!(
    "swarm-rdma assumes little-endian hosts: RDMA atomics operate on host-order words \
     that the core also reads as little-endian bytes"
);

pub mod auth;
pub mod bootstrap;
pub mod config;
pub mod emu;
pub mod error;
pub mod fabric;
pub mod lease_watch;
pub mod memnode;
pub mod staging;
pub mod status;
pub mod verbs;
pub mod wire;
pub mod wr;

pub use error::RdmaError;
pub use fabric::{RdmaCluster, RdmaConfig, RdmaFabric};
pub use memnode::{Memnode, MemnodeConfig};
pub use verbs::device::{device_names, open_device};
