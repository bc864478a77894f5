//! # swarm-shm: the SWARM fabric over shared-memory files (emulated CXL)
//!
//! SWARM needs nothing from disaggregated memory but the setting of SWARM §2.1:
//! non-atomic reads and writes, an atomic 8-byte compare-and-swap, ordered pipelines
//! of operations to one memory node, and operations on several nodes in parallel.
//! CXL fabric-attached memory offers exactly that to every host that maps it:
//! loads and stores to cache-coherent shared memory, with no code running next to the
//! data. This crate emulates such a fabric on one host:
//!
//! - A **cluster** is a directory holding one file per memory node,
//!   `DIR/node-<i>.swarm` (tmpfs `/dev/shm` for speed, or a DAX-backed file for real
//!   CXL memory). Each file starts with the [`swarm_core::header`] page (magic,
//!   version, node id and count, size, cluster id, epoch, tick length, checksum);
//!   node addresses are byte offsets from the start of the file. See [`ShmCluster`].
//! - Every client **process** maps every node file with `memmap2::MmapRaw`
//!   (`MAP_SHARED`), so all processes that open the cluster share the memory, like
//!   hosts sharing a CXL memory pool. No daemon runs anywhere.
//! - Each client **thread** talks to the nodes through its own [`ShmFabric`], which
//!   implements [`swarm_core::Fabric`]: it executes batches synchronously (the memory
//!   is local). [`ShmCluster::client_with`] wraps it in the core's fault injectors:
//!   an emulated roundtrip time (`rtt_ns`: ~300 ns for CXL-like, ~1500 ns for
//!   RDMA-like latency) and nodes failed for one client, to test protocols against a
//!   crashed minority.
//!
//! ```
//! use std::sync::Arc;
//! use swarm_core::header::HEADER_SIZE;
//! use swarm_core::{Batch, Fabric, NodeId, OpStats, Roundtrip, block_on};
//! use swarm_shm::{ScratchDir, ShmCluster};
//!
//! let dir = ScratchDir::new("swarm-shm-doc")?;
//! // Three memory nodes of 64 KiB; another process would `ShmCluster::open` the dir.
//! let cluster = Arc::new(ShmCluster::create(dir.path(), 3, 64 << 10)?);
//! let fabric = cluster.client_with(300);
//!
//! // One roundtrip: write to all three nodes, wait for a majority.
//! let stats = OpStats::new();
//! block_on(&fabric, async {
//!     let mut rt = Roundtrip::start(&fabric, &stats);
//!     for node in 0..3 {
//!         rt.post(NodeId(node), Batch::write(HEADER_SIZE, b"replicated".to_vec()))?;
//!     }
//!     rt.wait(2).await
//! })?;
//! assert_eq!(stats.roundtrips(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The `swarm-shm-demo` example (`cargo run --release -p swarm-shm --example
//! swarm-shm-demo -- --help`) creates a cluster and exercises all of the above.
//!
//! ## Memory access and the ordering argument
//!
//! All accesses to node memory are 8-byte aligned atomic operations on
//! [`std::sync::atomic::AtomicU64`] words (see [`NodeMemory`]): reads are `Relaxed`
//! word loads, writes are `Relaxed` word stores (partial words at the edges of a
//! write are merged with a CAS loop, so bytes outside the written range are never
//! clobbered), and CAS is `compare_exchange(AcqRel, Acquire)`. Consequently a read
//! concurrent with a write may return data torn **at 8-byte granularity**, which is
//! what the fabric contract allows (§2.1, first property) and what SWARM's hashes and
//! timestamps detect; the CAS is atomic (second property).
//!
//! The third property — *if a later operation of a batch is visible, so are the
//! earlier ones* — comes from an `AcqRel` fence after every operation. For a writer
//! batch `[write data, CAS word]` the fence is a release fence between the data
//! stores and the CAS; for a reader batch `[read word, read data]` (or two batches in
//! sequence) the fence after the first read is an acquire fence. By the fence-to-fence
//! synchronisation rule, a reader that observes the CAS's value also observes the data
//! written before it. The fence also orders a thread's successive batches, and costs
//! nothing on x86 (where it only constrains the compiler). Store-to-load order inside a
//! batch is not part of the contract (a read has no visible effect) and is not paid for.
//!
//! ## Untrusted memory
//!
//! Node files are shared with other processes that may be buggy, crashed mid-write,
//! or hostile, so their content is data, never trusted structure:
//!
//! - [`ShmCluster::open`] reads every header with `pread` and checks the file length
//!   with `metadata` *before* mapping, refusing bad magic, version, checksum, node
//!   count, node id, cluster id and any length mismatch with a clear [`ShmError`], so a
//!   short file is never mapped and touched past its end (no `SIGBUS`).
//! - Every operation is bounds-checked against the mapping
//!   ([`swarm_core::fabric::check_batch`]), and a CAS target must be 8-byte aligned.
//! - No Rust reference to node bytes (`&[u8]`) is ever created: memory another
//!   process may change at any time would break the immutability a `&[u8]` promises.
//!   The only view is a slice of atomic words, which permits concurrent mutation. All
//!   `unsafe` code of the crate lives in four small private modules, each block
//!   justified there: the mapping (`mapping`), cache hints (`hint`), the clock
//!   (`monotonic`) and the filesystem check (`backing`, [`Backing`]: node files
//!   on a disk-backed filesystem are read ahead at open, and creating a cluster
//!   there warns).
//!
//! What the crate cannot prevent: a process with write access that *truncates* a node
//! file after others mapped it makes their next access to the lost pages raise
//! `SIGBUS`. [`ShmCluster::create`] therefore never truncates or rewrites files in
//! place: it builds new files and renames them over old ones, so processes that still
//! map an old cluster keep their (now unlinked) memory.
//!
//! Unix only; the host must be little-endian (the protocol encodes CAS words and
//! headers as little-endian bytes).

#[cfg(not(unix))]
compile_error!("swarm-shm maps node files with Unix APIs and supports Unix hosts only");
#[cfg(not(target_endian = "little"))]
compile_error!("swarm-shm needs a little-endian host: memory words are encoded little-endian");

mod backing;
mod cluster;
mod error;
mod fabric;
mod hint;
mod mapping;
mod monotonic;
mod node;
pub mod scratch;

pub use backing::Backing;
pub use cluster::{AbsentNode, CreateOptions, DEFAULT_TICK_NS, ShmCluster, node_file_name};
pub use error::ShmError;
pub use fabric::{EmulatedFabric, ShmFabric};
pub use hint::prefetch_local;
pub use node::NodeMemory;
pub use scratch::ScratchDir;
