//! A SWARM-KV client: one per client thread (SWARM §5.3).
//!
//! [`KvClient`] holds what one client knows and owns: its SWARM register client
//! (`swarm_core::Client`, over its writer id), the index, the location cache, its
//! register allocator and recycler, its lease and the configuration it follows. This
//! file holds the struct, its settings ([`KvConfig`]), the accessors, and where a
//! register lives ([`register_loc_for`]); each of the rooms below holds one purpose:
//!
//! * `connect` — joining (a writer id, its log resumed) and leaving ([`KvClient::close`]).
//! * `begin` — how an operation starts and where it must stop: the lease check
//!   (self-fencing, [`crate::membership::lease`]), its deadline, the fence.
//! * `locate`, `register_io` — finding a key's register (location cache, then index)
//!   and reading or writing it with the chosen [`RegisterProtocol`].
//! * `get`, `update`, `insert`, `delete` — the operations (SWARM §5.3.4, §5.3.3,
//!   §5.3.1, §5.3.2), each with its retries after a stall.
//! * `alloc`, `publish` — an insert's fresh register, and its publication in the index.
//! * `upkeep` — what runs between operations: lease renewal and following the
//!   configuration, register recycling steps (SWARM §5.4), reclaiming the registers
//!   of gone clients, relieving a full log.
//!
//! Every operation starts with a lease check: it runs only while the client's lease
//! is provably valid for the cluster's operation deadline (`max_op_ns`, superblock),
//! and fails with [`KvError::LeaseExpired`] otherwise. Operations take `&self` and can
//! be kept in flight several at a time on one thread ([`swarm_core::LocalExecutor`]);
//! the location cache is only borrowed between awaits.
//!
//! # Recycling (SWARM §5.4)
//!
//! The client whose index remove (or replace) unmapped a deleted register, and the
//! client whose insert turned into an update (its fresh register was never
//! published), *retire* that register; after a grace covering every operation
//! (`max_op_ns`, superblock) that may have found it through the index, the register
//! is reset on all its replicas and handed out again (`crate::registers::recycle` has
//! the argument). Cached locations need no wait: they carry the register's life, and
//! an operation through one that meets another life, or a tombstone it cannot place,
//! asks the index before it acts (`crate::cache`, "Stale entries"). What is enforced
//! here: an operation stops at its deadline (start + `max_op_ns`) with
//! [`KvError::Fenced`] before posting its next step, the index posts no CAS after it
//! (`Index::remove_until`), and the register protocol posts no batch after it
//! (`swarm_core`'s operation fence, `OpStats`).

use std::cell::{Cell, RefCell};

use swarm_core::ProtocolConfig;
use swarm_core::fabric::Nanos;
use swarm_core::{Client, Clock, Fabric, NodeId, RegisterCache, RegisterLoc, Replicas};
use xxhash_rust::xxh3::xxh3_64;

use crate::cache::LocationCache;
use crate::configuration::Configuration;
use crate::index::{Index, IndexConfig};
use crate::layout::NodeLayout;
use crate::membership::lease_renewal::LeaseHolder;
use crate::membership::writer_ids::Registration;
use crate::placement::SharedPlacements;
use crate::registers::alloc::RegisterAllocator;
use crate::registers::recycle::{RecycleStats, Recycler};
use crate::{KvError, RegisterId};

/// Attempts a get makes when one runs past its deadline (a stall longer than
/// `max_op_ns`: preemption, a page fault on a disk-backed node file, a paused
/// process), before it reports [`KvError::Fenced`]. Each attempt is an operation of
/// its own, with its own lease check and deadline. Writes are not retried: their
/// outcome is unknown after a stall (`KvClient::update`).
pub const FENCED_ATTEMPTS: u32 = 4;

mod alloc;
mod begin;
mod blind_policy;
mod connect;
mod deferred_unmap;
mod delete;
mod get;
mod insert;
mod locate;
mod publish;
#[cfg(test)]
mod publish_tests;
mod register_io;
mod undecided;
#[cfg(test)]
mod undecided_tests;
mod update;
mod upkeep;

use blind_policy::BlindPolicy;
pub use deferred_unmap::DeferredUnmapStats;
use deferred_unmap::DeferredUnmaps;
use undecided::UndecidedInserts;
pub use undecided::{UNDECIDED_CAPACITY, UndecidedStats};

/// How many times an operation re-resolves a key that keeps moving under it.
const MAX_RETRIES: u32 = 16;
/// Log slots a write waits for before it starts: an insert may write two registers
/// (its fresh one, then the key's existing one).
const WRITE_SLOTS: u32 = 2;

/// The register protocol a client uses: SWARM, or one of the paper's baselines (§7),
/// so that all of them run on the same store, index and cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RegisterProtocol {
    /// Safe-Guess over In-n-Out: SWARM-KV.
    #[default]
    SafeGuess,
    /// DM-ABD: ABD with out-of-place data, two roundtrips per get and update.
    Abd,
    /// RAW: unreplicated, in place on the register's primary, no concurrency
    /// control. A latency floor only: no fault tolerance, no deletes.
    Raw,
}

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct KvConfig {
    /// Bytes of location cache.
    pub cache_bytes: usize,
    /// The replication protocol's tunables.
    pub protocol: ProtocolConfig,
    /// The index's tunables.
    pub index: IndexConfig,
    /// Unix ns of the cluster epoch (node header), for leases.
    pub epoch_unix_ns: u64,
    /// Timestamp tick length in ns (node header).
    pub tick_ns: u64,
    /// The register protocol (SWARM by default).
    pub register_protocol: RegisterProtocol,
    /// How long an operation that finds the lease lapsed (not killed) keeps trying
    /// to revive it before failing with [`KvError::LeaseExpired`], ns: long enough
    /// for a transport to reconnect the memory nodes that cut an idle client off
    /// (RDMA: `swarm_rdma::lease_watch`). Only an operation after a lapse waits;
    /// `0`: one synchronous renewal, then fail (`crate::membership::lease`, "Idle clients").
    pub lease_revive_ns: Nanos,
    /// Index unmaps a client's deletes may leave to run after they return (SWARM
    /// §5.3.2: a delete returns at its tombstone), at most; `0` (the default): every
    /// delete unmaps before it returns. The caller must then keep
    /// [`KvClient::run_deferred_unmaps`] running next to the operations; a delete
    /// that finds this many waiting unmaps before it returns, and
    /// [`KvClient::close`] runs those left.
    pub deferred_unmaps: usize,
    /// Whether every client of the cluster is a process of this host (shared memory):
    /// then a writer id is taken over only once its owner's process is gone
    /// (`crate::membership::owner_process`). [`crate::ShmStore`] sets it.
    pub owners: crate::membership::owner_process::OwnerLiveness,
    /// How long [`KvClient::connect`] waits for a writer id when live clients hold
    /// every one (they may close soon: a script's one-shot commands), ns, before it
    /// fails with [`KvError::WritersFull`]. Default `DEFAULT_WRITER_WAIT_NS` (10 s).
    pub writer_wait_ns: Nanos,
}

/// Default [`KvConfig::writer_wait_ns`]: 10 s.
pub const DEFAULT_WRITER_WAIT_NS: Nanos = 10_000_000_000;

/// Default [`KvConfig::lease_revive_ns`]: 5 s, room for several reconnect attempts
/// to every memory node (RDMA: a bootstrap takes milliseconds, its first retry
/// 100 ms after a failure).
pub const DEFAULT_LEASE_REVIVE_NS: Nanos = 5_000_000_000;

impl KvConfig {
    /// Defaults for a cluster with the given epoch and tick: 64 MiB of cache. The
    /// operation fence (`ProtocolConfig::max_op_ns`) is the cluster's, from its
    /// superblock: [`KvClient::connect`] sets it.
    pub fn new(epoch_unix_ns: u64, tick_ns: u64) -> Self {
        Self {
            cache_bytes: 64 << 20,
            protocol: ProtocolConfig::default(),
            index: IndexConfig::default(),
            epoch_unix_ns,
            tick_ns,
            register_protocol: RegisterProtocol::SafeGuess,
            lease_revive_ns: DEFAULT_LEASE_REVIVE_NS,
            deferred_unmaps: 0,
            owners: crate::membership::owner_process::OwnerLiveness::Unknown,
            writer_wait_ns: DEFAULT_WRITER_WAIT_NS,
        }
    }
}

/// A located key: its register, replicas and what the client knows of it.
struct Located {
    register: RegisterId,
    loc: RegisterLoc,
    knowledge: RegisterCache,
    /// When the index (or this client's insert) vouched for the location.
    vouched_at: Nanos,
}

/// The low-level SWARM-KV client that [`crate::Kv`] and [`crate::AsyncKv`] wrap: one
/// writer id of the cluster, a location cache, and the register protocol's client,
/// over any fabric `F` (shared memory, RDMA, the simulator) with timestamps from `C`.
///
/// Its operations ([`KvClient::get`], [`KvClient::insert`] (an upsert),
/// [`KvClient::insert_if_absent`], [`KvClient::update`], [`KvClient::delete`]) are
/// `async fn`s that take the [`swarm_core::OpStats`] to count roundtrips into; drive
/// them with `swarm_core::block_on(client.fabric(), ...)`, or run several in flight on
/// one thread with a SWARM executor. The client is not `Sync`: one per thread.
/// [`KvClient::close`] gives its writer id back (the wrappers do it on drop).
pub struct KvClient<F: Fabric, C: Clock> {
    swarm: Client<F, C>,
    layout: NodeLayout,
    nodes: usize,
    /// The metadata group: nodes `0..meta` hold the client table, the index, the
    /// chunk table, the journal and the configuration
    /// ([`crate::layout::NodeLayout::metadata_nodes`]; `nodes` without one).
    meta: usize,
    index: Index,
    alloc: RegisterAllocator,
    recycler: Recycler,
    max_op_ns: Nanos,
    cache: RefCell<LocationCache>,
    token: u64,
    registration: Registration,
    protocol: RegisterProtocol,
    lease: RefCell<LeaseHolder>,
    /// [`KvConfig::lease_revive_ns`].
    lease_revive_ns: Nanos,
    /// No adoption of dead clients' chunks before this time (fabric clock): a round
    /// that found nothing is not repeated on every insert.
    next_adoption: Cell<Nanos>,
    /// Donated registers this client's last reclamation pass found and left to
    /// others ([`crate::registers::limbo::Reclaimed::donations_left`]): its next pass may take
    /// half of them ([`Self::reclaim_gone_registers`]), and a dry insert waits for that pass
    /// rather than fail.
    donations_left: Cell<u64>,
    /// Where this client's next reclamation pass starts its scan: where the last
    /// one stopped ([`crate::registers::limbo::Reclaimed::resume_at`]).
    reclaim_resume_at: Cell<RegisterId>,
    /// Whether this client's last reclamation pass stopped before it had scanned
    /// every chunk (its lease ran short, [`crate::registers::limbo::Reclaimed::stopped`]):
    /// a dry insert then waits for the next pass, which goes on from there, rather
    /// than fail.
    reclaim_cut_short: Cell<bool>,
    /// [`LeaseHolder::renewal_answers`] when the configuration was last read: a
    /// renewal that saw a newer epoch than the configuration a majority then held
    /// (a record being written) triggers one more read per renewal, not per operation.
    config_checked: Cell<u64>,
    /// No log of where this client's registers are before this time (fabric clock;
    /// [`KvClient::log_holdings`]).
    next_holdings_log: Cell<Nanos>,
    /// No reclamation pass for a nearly full log before this time (fabric clock;
    /// `KvClient::relieve_log`).
    next_relief: Cell<Nanos>,
    /// Reclamation passes run for a nearly full log so far.
    relief_passes: Cell<u64>,
    /// The last mapped register an insert found with no key header on a majority
    /// (its replicas are logged once per register in a row).
    header_missing_logged: Cell<Option<RegisterId>>,
    /// The configuration this client last followed (read first by `connect`): its
    /// nodes are admitted; a renewal that reads a higher epoch makes the next
    /// operation follow that one ([`KvClient::followed_epoch`]).
    followed: RefCell<Option<Configuration>>,
    /// Its epoch (0: none), read by every operation's start (`KvClient::begin_quiet`).
    epoch_followed: Cell<u64>,
    /// Where chunks live: the placement table adopted at the followed configuration's
    /// epoch (`crate::placement`), shared with the index.
    placements: SharedPlacements,
    /// Index unmaps of deletes that returned at their tombstone.
    deferred: RefCell<DeferredUnmaps>,
    /// Fresh registers of inserts whose outcome stayed unknown, to judge later.
    undecided: RefCell<UndecidedInserts>,
    /// Whether inserts try the index's blind fast round (`blind_policy`).
    blind: BlindPolicy,
    /// The payload buffer of the last update, for the next one to encode into
    /// (empty while an update holds it: one in flight at once allocates its own).
    payload_buffer: Cell<Vec<u8>>,
}

impl<F: Fabric, C: Clock> std::fmt::Debug for KvClient<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvClient")
            .field("writer", &self.registration.writer)
            .field("nodes", &self.nodes)
            .field("cache", &self.cache.borrow())
            .finish()
    }
}

/// The computed place of register `register` in a cluster of `nodes` nodes, where
/// it lives unless a placement record says otherwise ([`KvClient::register_loc`],
/// `crate::placement`): with replica groups
/// ([`crate::layout::NodeLayout::placement`]), its group's `replicas` nodes;
/// otherwise `replicas` consecutive nodes from a hash of its id. Either way in an
/// order rotated by that hash, so that primaries vary.
pub fn register_loc_for(
    layout: &NodeLayout,
    nodes: usize,
    register: RegisterId,
) -> Result<RegisterLoc, KvError> {
    let (at, group) = layout
        .placement(register)
        .ok_or(KvError::Corrupted { register })?;
    let addr = at + layout.params.key_header_bytes();
    let hash = xxh3_64(&register.to_le_bytes());
    let r = usize::from(layout.params.replicas);
    // Without groups: a run of `r` from a hash of the id, over every node. With
    // groups: a rotation of the group's run, over `placement_nodes` nodes (the
    // cluster's: checked when it is opened).
    let (n, base, start, rotation) = match group {
        None => (
            nodes,
            0,
            (hash % nodes as u64) as usize,
            hash / nodes as u64,
        ),
        Some(first) => (
            usize::from(layout.params.placement_nodes),
            first,
            (hash % r as u64) as usize,
            hash / r as u64,
        ),
    };
    // On the stack: this runs once per operation. More replicas than a batch can
    // reach are refused by `Replicas::new` (given at most one too many here).
    let mut chosen = [NodeId(0); swarm_core::MAX_NODES + 1];
    let r = r.min(chosen.len());
    for (i, node) in chosen[..r].iter_mut().enumerate() {
        let offset = match group {
            None => start + i,
            Some(_) => (start + i) % r,
        };
        *node = NodeId(((base + offset) % n) as u16);
    }
    // One offset on every replica, which also names the register (log owner tags,
    // slot trackers). A chunk with a placement record has an offset per replica and
    // keeps this name (`crate::placement::Placements::loc`).
    Ok(RegisterLoc::at(
        addr,
        Replicas::new(&chosen[..r], rotation)?,
    ))
}

/// The location of the register whose identity is `addr` (an owner tag read from a
/// log record: untrusted), if any, where `placements` puts it.
fn locate_register(
    layout: &NodeLayout,
    nodes: usize,
    placements: &SharedPlacements,
    addr: u64,
) -> Option<RegisterLoc> {
    register_at(layout, addr).and_then(|r| placements.loc(layout, nodes, r).ok())
}

/// The register whose SWARM register starts at `addr` (an address read from a log
/// record: untrusted), if any.
fn register_at(layout: &NodeLayout, addr: u64) -> Option<RegisterId> {
    layout.register_at(addr)
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// This client's writer id.
    pub fn writer(&self) -> u16 {
        self.registration.writer
    }

    /// The cluster layout.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// The fabric.
    pub fn fabric(&self) -> &F {
        self.swarm.fabric()
    }

    /// The index (tests only: its type is not part of the API).
    #[doc(hidden)]
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Keys in the location cache.
    pub fn cached_keys(&self) -> usize {
        self.cache.borrow().len()
    }

    /// This client's out-of-place log: slots in use, in limbo, recycled so far.
    pub fn log_counters(&self) -> swarm_core::slot_recycling::SlotCounters {
        self.swarm.slot_counters()
    }

    /// Registers this client retired and has not handed out again yet (waiting for
    /// their grace or their reset).
    pub fn registers_in_limbo(&self) -> usize {
        self.recycler.in_limbo()
    }

    /// Registers in this client's pool: given back after a reset, or never used in
    /// its chunks (`crate::registers::alloc`).
    pub fn registers_pooled(&self) -> u64 {
        self.alloc.pooled()
    }

    /// This client's holder tag (`crate::registers::limbo`; tests only).
    #[doc(hidden)]
    pub fn recycler_tag(&self) -> u32 {
        self.recycler.tag()
    }

    /// Register recycling counters of this client.
    pub fn recycle_stats(&self) -> RecycleStats {
        self.recycler.stats()
    }

    /// Location-cache entries dropped because they outlived `cache_ttl_ns`.
    pub fn cache_expired(&self) -> u64 {
        self.cache.borrow().expired()
    }

    fn check_key(&self, key: &[u8]) -> Result<(), KvError> {
        if key.is_empty() {
            return Err(KvError::EmptyKey);
        }
        if key.len() > self.layout.params.key_max as usize {
            return Err(KvError::KeyTooLong {
                len: key.len(),
                max: self.layout.params.key_max,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<(), KvError> {
        if value.len() > self.layout.params.value_max as usize {
            return Err(KvError::ValueTooLarge {
                len: value.len(),
                max: self.layout.params.value_max,
            });
        }
        Ok(())
    }

    /// Lease renewals a majority acknowledged since the client started.
    pub fn lease_renewals(&self) -> u64 {
        self.lease.borrow().renewals()
    }

    /// Whether the client's lease is valid now for a whole operation.
    pub fn lease_valid(&self) -> bool {
        let now = self.swarm.fabric().now();
        self.lease
            .borrow()
            .valid_for(now, self.layout.params.max_op_ns)
    }

    /// Where register `register` lives: its replicas in preference order (the
    /// first is its primary, §6) and its offset on each, from the placement table
    /// this client follows (`crate::placement`; [`register_loc_for`] for a chunk
    /// without a record).
    #[doc(hidden)]
    pub fn register_loc(&self, register: RegisterId) -> Result<RegisterLoc, KvError> {
        self.placements.loc(&self.layout, self.nodes, register)
    }

    /// Chunks whose placement record this client follows (tests only).
    #[doc(hidden)]
    pub fn recorded_chunks(&self) -> usize {
        self.placements.get().recorded()
    }

    /// This client's incarnation token (tests of `crate::registers::limbo`).
    #[cfg(test)]
    pub(crate) fn token(&self) -> u64 {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ClusterParams;

    #[test]
    fn a_log_records_register_address_maps_back_to_its_register_only() {
        let params = ClusterParams::default().for_node_size(64 << 20).unwrap();
        let layout = NodeLayout::new(params).unwrap();
        for register in [0, 1, 7, params.registers - 1] {
            let addr = layout.register(register).unwrap();
            assert_eq!(register_at(&layout, addr), Some(register));
            assert_eq!(register_at(&layout, addr + 8), None);
            assert_eq!(register_at(&layout, addr - 8), None);
        }
        let past = layout.register(params.registers - 1).unwrap() + layout.register_slot_bytes;
        assert_eq!(register_at(&layout, past), None);
        assert_eq!(register_at(&layout, 0), None);
        assert_eq!(register_at(&layout, u64::MAX), None);
    }

    /// Each operation hashes its key for the index at most once and hands the hash to
    /// every index call it makes (`HashedKey`): an insert that reads the buckets, maps
    /// the key, finds it present or replaces a deleted register, a get or an update
    /// through the index, a delete and its unmap. A get or an update served by the
    /// cache needs no index hash at all.
    #[test]
    fn every_operation_hashes_its_key_once() {
        use crate::index::hash::hashed_on_this_thread;
        use swarm_core::{DeleteOutcome, OpStats, block_on};

        let (cluster, layout) = crate::test_support::small_cluster(1_000 * crate::test_support::MS);
        let client = crate::test_support::connect(&cluster, layout);
        let hashes = |op: &dyn Fn()| {
            let before = hashed_on_this_thread();
            op();
            hashed_on_this_thread() - before
        };
        let stats = OpStats::new();
        let insert = |value: &[u8]| {
            block_on(client.fabric(), client.insert(b"k", value, &stats)).expect("an insert")
        };
        assert_eq!(hashes(&|| insert(b"v1")), 1, "an insert of an absent key");
        assert_eq!(hashes(&|| insert(b"v2")), 1, "an insert of a present key");
        let get = || {
            let got = block_on(client.fabric(), client.get(b"k", &stats)).expect("a get");
            assert_eq!(got.as_deref(), Some(&b"v2"[..]));
        };
        assert_eq!(hashes(&get), 0, "a get through the cache");
        client.cache.borrow_mut().remove(b"k");
        assert_eq!(hashes(&get), 1, "a get through the index");
        let update = || {
            let updated = block_on(client.fabric(), client.update(b"k", b"v3", &stats));
            assert!(updated.expect("an update"));
        };
        assert_eq!(hashes(&update), 0, "an update through the cache");
        client.cache.borrow_mut().remove(b"k");
        assert_eq!(hashes(&update), 1, "an update through the index");
        let delete = || {
            let deleted = block_on(client.fabric(), client.delete(b"k", &stats));
            assert_eq!(deleted.expect("a delete"), DeleteOutcome::Removed);
        };
        assert_eq!(hashes(&delete), 1, "a delete and its unmap");
        assert_eq!(hashes(&|| insert(b"v4")), 1, "an insert after a delete");
    }
}
