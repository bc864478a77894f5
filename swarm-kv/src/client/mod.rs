//! A SWARM-KV client: one per client thread (SWARM §5.3).
//!
//! * **get** — find the key's register in the location cache (or, on a miss, through
//!   the index: one roundtrip), then one Safe-Guess read. The payload carries the key,
//!   so a register that does not hold this key is never mistaken for it. A tombstone
//!   means the cached location is stale: flush it and go through the index again.
//! * **update** — locate, then one Safe-Guess write; fails if the key is absent. A
//!   write that finds a tombstone changed nothing (the protocol locks its guess out):
//!   flush, unmap the dead register in case its deleter crashed, and retry.
//! * **insert** — write the key header and the value into a fresh pre-cleared register
//!   (one roundtrip, one batch per replica of a majority: `swarm_core`'s
//!   `Client::write_fresh`), then map the key to it in the index.
//!   If the key already maps to a live register the insert becomes an update of that
//!   register; if it maps to a deleted one, the mapping is replaced (§5.3.1).
//!   Writing the value *before* publishing the mapping means an indexed register is
//!   never empty, so readers never see a half-inserted key.
//! * **delete** — a Safe-Guess write of the tombstone (§5.3.2), then the mapping is
//!   removed. Clients holding the location in their cache see the tombstone, flush and
//!   retry through the index. With [`KvConfig::deferred_unmaps`] the delete returns at
//!   its tombstone and the unmap runs afterwards ([`KvClient::run_deferred_unmaps`];
//!   `deferred_unmap` has the argument).
//!
//! Every operation starts with a lease check (self-fencing, [`crate::membership::lease`]): it runs
//! only while the client's lease is provably valid for the cluster's operation
//! deadline (`max_op_ns`, superblock), renewing it synchronously if it is about to run
//! out, and fails with [`KvError::LeaseExpired`] otherwise. Renewals are posted in the
//! background of operations, so an idle client's lease lapses: its next operation
//! revives it first (retrying for up to [`KvConfig::lease_revive_ns`] while the
//! transport reconnects nodes that cut the client off), unless a reclaimer killed
//! it meanwhile ([`crate::membership::lease`], "Idle clients").
//!
//! # Recycling (SWARM §5.4)
//!
//! The client whose index remove (or replace) unmapped a deleted register, and the
//! client whose insert turned into an update (its fresh register was never
//! published), *retire* that register; after a grace covering every cached location
//! (`cache_ttl_ns`, superblock) and every operation (`max_op_ns`, superblock) that
//! may still name it, the register is reset on all its replicas and handed out
//! again (`crate::registers::recycle` has the argument). Two things make the grace sufficient
//! and are enforced here: cache entries expire `cache_ttl_ns` after the index
//! vouched for them (`crate::cache`), and an operation stops at its deadline
//! (start + `max_op_ns`) with [`KvError::Fenced`] before posting its next step, and
//! the index posts no CAS after it (`Index::remove_until`), and the register
//! protocol posts no batch after it (`swarm_core`'s operation fence, `OpStats`).
//!
//! Operations take `&self` and can be kept in flight several at a time on one thread
//! ([`swarm_core::LocalExecutor`]); the location cache is only borrowed between
//! awaits.

use std::cell::{Cell, RefCell};

use swarm_core::ProtocolConfig;
use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Nanos, Op};
use swarm_core::quorum::broadcast;
use swarm_core::resume::scan_log;
use swarm_core::{
    Batch, Carried, Client, Clock, DeleteOutcome, DeleteVotes, Fabric, FirstDeleter, FreshOutcome,
    NodeId, OpStats, ReadValue, RegisterCache, RegisterLoc, Replicas, WriteOutcome, yield_now,
};
use xxhash_rust::xxh3::xxh3_64;

use crate::cache::{Location, LocationCache};
use crate::configuration::Configuration;
use crate::index::{BlindInsert, Index, IndexConfig, IndexError, InsertOutcome};
use crate::layout::{NodeLayout, decode_payload, encode_key_header, encode_payload};
use crate::membership::lease_renewal::{LeaseHolder, renew_now};
use crate::membership::writer_ids::{self, Registration, Resume};
use crate::registers::alloc::RegisterAllocator;
use crate::registers::recycle::{RecycleStats, Recycler, ReplicaStatus, Retired};
use crate::{KvError, RegisterId};

/// Attempts an operation makes when one runs past its deadline (a stall longer than
/// `max_op_ns`: preemption, a page fault on a disk-backed node file, a paused
/// process), before it reports [`KvError::Fenced`]. Each attempt is an operation of
/// its own, with its own lease check and deadline.
pub const FENCED_ATTEMPTS: u32 = 4;

mod blind_policy;
mod deferred_unmap;

use blind_policy::BlindPolicy;
pub use deferred_unmap::DeferredUnmapStats;
use deferred_unmap::DeferredUnmaps;

/// How many times an operation re-resolves a key that keeps moving under it.
const MAX_RETRIES: u32 = 16;
/// Registers per background slot-recycling check of the log (`Client::recycle_slots_tick`, at
/// most one check per `ProtocolConfig::slot_recycling_interval_ns`).
const SLOT_RECYCLING_BUDGET: usize = 8;
/// Log slots a write waits for before it starts: an insert may write two registers
/// (its fresh one, then the key's existing one).
const WRITE_SLOTS: u32 = 2;

/// How long an insert waits for a register while a repair is announced, at most:
/// from the announcement to the admission, registers come back only once the
/// repair copied them to the node it rebuilds (`crate::registers::journal`), or, on a cluster
/// without a journal, once the node is admitted (a repair's wait and copy:
/// seconds). A repair that failed after its announcement leaves the bit set until
/// another one completes; inserts that find no register then fail with
/// `RegistersFull` after this long.
const REPAIR_WAIT_NS: Nanos = 30_000_000_000;

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
    /// `0`: one synchronous renewal, then fail ([`crate::membership::lease`], "Idle clients").
    pub lease_revive_ns: Nanos,
    /// Index unmaps a client's deletes may leave to run after they return (SWARM
    /// §5.3.2: a delete returns at its tombstone), at most; `0` (the default): every
    /// delete unmaps before it returns. The caller must then keep
    /// [`KvClient::run_deferred_unmaps`] running next to the operations; a delete
    /// that finds this many waiting unmaps before it returns, and
    /// [`KvClient::close`] runs those left.
    pub deferred_unmaps: usize,
}

/// Default [`KvConfig::lease_revive_ns`]: 5 s, room for several reconnect attempts
/// to every memory node (RDMA: a bootstrap takes milliseconds, its first retry
/// 100 ms after a failure).
pub const DEFAULT_LEASE_REVIVE_NS: Nanos = 5_000_000_000;

/// Pause between two attempts to revive a lapsed lease (the transport reconnects
/// meanwhile: the pause drives its progress).
const REVIVE_RETRY_NS: Nanos = 20_000_000;

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

/// An operation that passed its lease check: its start and deadline on the fabric
/// clock, and the deadline armed on its `OpStats` until it ends.
struct Started<'s> {
    start: Nanos,
    deadline: Nanos,
    _scope: swarm_core::DeadlineScope<'s>,
}

/// How an insert's fresh register ended.
enum Published {
    /// The key now maps to it.
    Yes,
    /// The key was present: the insert updated the existing register instead.
    No,
}

/// See the module docs.
pub struct KvClient<F: Fabric, C: Clock> {
    swarm: Client<F, C>,
    layout: NodeLayout,
    nodes: usize,
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
    /// [`LeaseHolder::renewal_answers`] when the configuration was last read: a
    /// renewal that saw a newer epoch than the configuration a majority then held
    /// (a record being written) triggers one more read per renewal, not per operation.
    config_checked: Cell<u64>,
    /// The configuration this client last followed (`None`: not read yet): its
    /// nodes are admitted; a renewal that reads a higher epoch makes the next
    /// operation follow that one ([`KvClient::followed_epoch`]).
    followed: RefCell<Option<Configuration>>,
    /// Index unmaps of deletes that returned at their tombstone.
    deferred: RefCell<DeferredUnmaps>,
    /// Whether inserts try the index's blind fast round (`blind_policy`).
    blind: BlindPolicy,
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

fn token_for(pid: u64) -> u64 {
    let now = crate::clock::SystemClock::unix_ns();
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&now.to_le_bytes());
    bytes[8..16].copy_from_slice(&pid.to_le_bytes());
    let stack = &bytes as *const _ as u64;
    bytes[16..].copy_from_slice(&stack.to_le_bytes());
    xxh3_64(&bytes) | 1
}

/// The replicas of register `register` in a cluster of `nodes` nodes (see
/// [`KvClient::register_loc`]).
pub fn register_loc_for(
    layout: &NodeLayout,
    nodes: usize,
    register: RegisterId,
) -> Result<RegisterLoc, KvError> {
    let addr = layout
        .register(register)
        .ok_or(KvError::Corrupted { register })?;
    let hash = xxh3_64(&register.to_le_bytes());
    let n = nodes;
    let r = usize::from(layout.params.replicas);
    let start = (hash % n as u64) as usize;
    // On the stack: this runs once per operation. More replicas than a batch can
    // reach are refused by `Replicas::new` (given at most one too many here).
    let mut chosen = [NodeId(0); swarm_core::MAX_NODES + 1];
    let r = r.min(chosen.len());
    for (i, node) in chosen[..r].iter_mut().enumerate() {
        *node = NodeId(((start + i) % n) as u16);
    }
    Ok(RegisterLoc {
        addr,
        replicas: Replicas::new(&chosen[..r], hash / n as u64)?,
    })
}

/// The location of the register whose SWARM register starts at `addr` (an address
/// read from a log record: untrusted), if any.
fn locate_register(layout: &NodeLayout, nodes: usize, addr: u64) -> Option<RegisterLoc> {
    register_at(layout, addr).and_then(|r| register_loc_for(layout, nodes, r).ok())
}

/// The register whose SWARM register starts at `addr` (an address read from a log
/// record: untrusted), if any.
fn register_at(layout: &NodeLayout, addr: u64) -> Option<RegisterId> {
    let offset = addr
        .checked_sub(layout.registers_at)?
        .checked_sub(layout.params.key_header_bytes())?;
    let register = offset / layout.register_slot_bytes;
    (offset % layout.register_slot_bytes == 0 && layout.register(register) == Some(addr))
        .then_some(register)
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Registers a writer id in the client table and returns a client using it.
    /// Blocks until the registration is done (a few roundtrips, driven on `fabric`).
    pub fn connect(
        fabric: F,
        clock: C,
        layout: NodeLayout,
        config: KvConfig,
    ) -> Result<Self, KvError> {
        let nodes = fabric.node_count();
        if nodes < usize::from(layout.params.replicas) {
            return Err(KvError::TooFewNodes {
                nodes,
                replicas: layout.params.replicas,
            });
        }
        // The configuration first: a node whose incarnation is not the member's (a
        // memory node that restarted with empty memory) must not count towards the
        // quorums of the registration or of the first operations. Until a client has
        // followed a configuration every node counts as in service (`replica_status`).
        let followed = Self::follow_initial_configuration(&fabric)?;
        let pid = u64::from(std::process::id());
        let token = token_for(pid);
        let (registration, lease) = swarm_core::block_on(
            &fabric,
            writer_ids::register(&fabric, &layout, nodes, token, pid),
        )?;
        let writer =
            WriterId::new(u32::from(registration.writer)).map_err(swarm_core::SwarmError::from)?;
        // The earlier incarnations' log: from a sealed summary, else a whole-log scan
        // (`crate::membership::writer_ids`, "Resuming a log").
        let summary = match registration.resume {
            Resume::Summary { stamp } => swarm_core::block_on(
                &fabric,
                writer_ids::read_summary(&fabric, &layout, nodes, registration.writer, stamp),
            )?,
            Resume::Fresh | Resume::Scan => None,
        };
        // After a crash (no sealed summary), a cluster with tick ceilings resumes the
        // log lazily above the ceiling; an older one scans it whole first.
        let crashed = registration.reused && summary.is_none();
        let scan = if crashed && !layout.params.tick_ceilings {
            let stats = OpStats::new();
            tracing::info!(
                writer = registration.writer,
                "resuming the writer id's log by a whole-log scan (no sealed summary)"
            );
            Some(swarm_core::block_on(
                &fabric,
                scan_log(
                    &fabric,
                    &stats,
                    &layout.swarm,
                    writer,
                    writer_ids::RESUME_STRAGGLER_NS,
                ),
            )?)
        } else {
            None
        };
        // The fence is cluster-wide: recycling waits a grace computed from it.
        // So are the delivery margin and so the grace.
        let protocol = config
            .protocol
            .with_max_op_ns(layout.params.max_op_ns)
            .with_delivery_margin_ns(layout.params.delivery_margin_ns);
        let swarm = Client::new(fabric, clock, layout.swarm, writer, protocol)?;
        // Index and key-header reads avoid the nodes the register protocol suspects.
        let index = Index::new(
            &layout,
            nodes,
            IndexConfig {
                client_id: registration.writer,
                ..config.index
            },
        )?
        .with_suspicion(swarm.suspicion().clone());
        if layout.params.tick_ceilings {
            // About a second of ticks past each timestamp that needs a raise (one
            // more roundtrip per second of timestamps), plus the log's slots (an
            // allocation bumps ticks until its slot is free).
            let headroom = (1_000_000_000 / config.tick_ns.max(1))
                .saturating_add(u64::from(layout.params.log_slots));
            swarm.set_tick_ceiling(
                layout.client_row(registration.writer) + writer_ids::TICK_CEILING,
                registration.ceiling,
                headroom,
            );
            if crashed {
                tracing::info!(
                    writer = registration.writer,
                    ceiling = registration.ceiling,
                    "resuming a crashed writer id's log lazily, above its tick ceiling"
                );
                swarm.resume_crashed(registration.ceiling, move |addr| {
                    locate_register(&layout, nodes, addr)
                });
            }
        }
        if let Some(scan) = scan {
            // The earlier incarnation's buffers are tracked by register, so that the
            // ones superseded since are recycled (`swarm_core::resume`).
            swarm.resume_scan(&scan, |addr| locate_register(&layout, nodes, addr));
        }
        if let Some(summary) = summary {
            tracing::debug!(
                writer = registration.writer,
                carried = summary.in_use(),
                "resumed the writer id's log from its sealed summary"
            );
            swarm.resume_summary(&summary, move |addr| locate_register(&layout, nodes, addr));
        }
        if swarm.slots_in_use() >= layout.params.log_slots {
            // Every operation would fence waiting for a slot's grace (one-shot clients
            // that each inherit the same full log would never get one): wait for it
            // here, before any operation starts.
            tracing::info!(
                writer = registration.writer,
                "resumed a full log: waiting for a superseded slot's grace"
            );
            if !swarm_core::block_on_future(swarm.fabric(), swarm.make_room())? {
                tracing::warn!(
                    writer = registration.writer,
                    "every slot of the resumed log holds a live value: writes will fail"
                );
            }
        }
        Ok(Self {
            alloc: RegisterAllocator::new(&layout, registration.writer, token),
            swarm,
            layout,
            nodes,
            index,
            recycler: Recycler::new(
                layout.params.register_grace_ns(),
                registration.writer,
                token,
                crate::registers::limbo::holder_tag(registration.writer, token),
            ),
            max_op_ns: layout.params.max_op_ns,
            cache: RefCell::new(LocationCache::new(
                config.cache_bytes,
                layout.params.cache_ttl_ns,
            )),
            token,
            registration,
            protocol: config.register_protocol,
            lease: RefCell::new(lease),
            lease_revive_ns: config.lease_revive_ns,
            next_adoption: Cell::new(0),
            donations_left: Cell::new(0),
            // Clients that run dry at once (the clients of one `swarm bench`) would
            // race for the same registers from the same start: each writer id starts
            // its scans at its own share of the registers.
            reclaim_resume_at: Cell::new(
                layout.params.registers / u64::from(layout.params.writers.max(1))
                    * u64::from(registration.writer),
            ),
            config_checked: Cell::new(0),
            followed: RefCell::new(Some(followed)),
            deferred: RefCell::new(DeferredUnmaps::new(config.deferred_unmaps)),
            blind: BlindPolicy::new(),
        })
    }

    /// Reads the configuration from a majority and asks `fabric` to admit every
    /// member incarnation ([`Fabric::admit`]), before the client registers: the
    /// transport then leaves out (and reports lost, once it reconnects) every node
    /// that runs another incarnation, as it does for a configuration followed later
    /// ([`Self::follow_configuration`]). A legacy configuration (epoch 0) admits
    /// nothing.
    fn follow_initial_configuration(fabric: &F) -> Result<Configuration, KvError> {
        let stats = OpStats::new();
        let config =
            swarm_core::block_on(fabric, crate::repair::read_configuration(fabric, &stats))?;
        if config.epoch > 0 {
            for (i, &member) in config.incarnations.iter().enumerate() {
                fabric.admit(NodeId(i as u16), member);
            }
        }
        Ok(config)
    }

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

    /// The index.
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

    /// This client's holder tag (`crate::registers::limbo`).
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

    /// Gives the writer id back (its log is resumed by the next client that takes it).
    /// Registers in limbo and in the pool are left to others: they carry this client's
    /// holder tag, which is gone once the row is given back, so a client that runs out
    /// of registers reclaims them (`crate::registers::limbo`, "a clean close"). Waits up to
    /// [`crate::membership::writer_takeover::STRAGGLER_NS`] for retire marks still in flight.
    pub fn close(self) {
        if self.has_deferred_unmaps() {
            let fabric = self.swarm.fabric();
            if let Err(error) = swarm_core::block_on_future(fabric, self.run_deferred_unmaps())
                .map_err(KvError::from)
                .and_then(|ran| ran)
            {
                tracing::warn!(
                    writer = self.registration.writer,
                    waiting = self.deferred_unmap_stats().waiting,
                    %error,
                    "closing: deferred index unmaps could not run; their keys read as absent"
                );
            }
        }
        self.swarm.cancel_slot_recycling();
        let fabric = self.swarm.fabric();
        if self.recycler.marks_in_flight(fabric) > 0 {
            let until = fabric
                .now()
                .saturating_add(crate::membership::writer_takeover::STRAGGLER_NS);
            let _ = swarm_core::block_on_future(fabric, async {
                while self.recycler.marks_in_flight(fabric) > 0 && fabric.now() < until {
                    swarm_core::sleep(fabric, 100_000).await;
                }
            });
        }
        let log = self.swarm.slot_counters();
        tracing::info!(
            writer = self.registration.writer,
            in_use = log.in_use,
            in_limbo = log.in_limbo,
            recycled = log.recycled,
            "closing: out-of-place log slots in use, waiting out the grace, recycled"
        );
        self.recycler.abandon(self.swarm.fabric());
        match self.seal_log_summary() {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                writer = self.registration.writer,
                "no log summary left: the next client of this writer id scans the whole log"
            ),
            Err(error) => tracing::info!(
                writer = self.registration.writer,
                %error,
                "log summary not sealed: the next client of this writer id scans the whole log"
            ),
        }
        writer_ids::unregister(
            self.swarm.fabric(),
            &self.layout,
            self.nodes,
            self.registration.writer,
            self.token,
        );
        // Let the release reach the nodes.
        let _ = swarm_core::block_on_future(self.swarm.fabric(), async {});
    }

    /// Leaves this client's log summary for the next client of its writer id
    /// ([`writer_ids::seal_summary`]), if the cluster has summary areas and the lease
    /// covers the whole seal (it posts nothing after `max_op_ns` from now). Returns
    /// whether the summary was sealed.
    fn seal_log_summary(&self) -> Result<bool, KvError> {
        let fabric = self.swarm.fabric();
        let now = fabric.now();
        let max_op_ns = self.layout.params.max_op_ns;
        if self.layout.summaries_at.is_none() || !self.lease.borrow().valid_for(now, max_op_ns) {
            return Ok(false);
        }
        let stats = OpStats::new();
        let _deadline = stats.arm_deadline(now.saturating_add(max_op_ns));
        let summary = self.swarm.log_summary();
        let sealed = swarm_core::block_on(
            fabric,
            writer_ids::seal_summary(
                fabric,
                &stats,
                &self.layout,
                self.nodes,
                self.registration.writer,
                self.registration.generation,
                &summary,
            ),
        )?;
        if sealed {
            tracing::debug!(
                writer = self.registration.writer,
                generation = self.registration.generation,
                used_slots = summary.in_use(),
                "log summary sealed"
            );
        }
        Ok(sealed)
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

    /// Puts in service the memory nodes that a newer configuration admits: a renewal
    /// (whose answers so far are `answers`) read a higher epoch on some node, so a
    /// repair rebuilt a node and admitted its new incarnation (`crate::repair`).
    /// Reads the configuration from a majority (one roundtrip) and asks the fabric to
    /// admit every member incarnation ([`Fabric::admit`]: a no-op for the nodes in
    /// use). The epoch followed is the one read, not the one a renewal saw: a renewal
    /// may read the epoch of a record still being written (its checksum not yet), so
    /// the next renewal answer triggers another read until they agree.
    async fn follow_configuration(&self, answers: u64) {
        let fabric = self.swarm.fabric();
        let stats = OpStats::new();
        self.config_checked.set(answers);
        // A silent node must not hold the operation that follows: wait for stragglers
        // only as long as the protocol waits for a slow node.
        let straggler_ns = self.swarm.config().slow_after_ns;
        match crate::repair::read_configuration_within(fabric, &stats, 1, straggler_ns).await {
            Ok(config) => {
                let followed = self.followed_epoch();
                if config.epoch > 0 && config.epoch > followed {
                    let admitted: Vec<usize> = (0..config.incarnations.len())
                        .filter(|&i| fabric.admit(NodeId(i as u16), config.incarnations[i]))
                        .collect();
                    tracing::info!(
                        writer = self.registration.writer,
                        epoch = config.epoch,
                        ?admitted,
                        "following the cluster configuration"
                    );
                }
                if config.epoch >= followed {
                    self.followed.replace(Some(config));
                }
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read the configuration yet");
            }
        }
    }

    /// The epoch of the configuration this client follows (0: none read yet).
    fn followed_epoch(&self) -> u64 {
        self.followed.borrow().as_ref().map_or(0, |c| c.epoch)
    }

    /// Between operations, and while an insert waits for a register: takes the
    /// answers of the lease renewal in flight and posts the next one when due, and
    /// follows a newer configuration a renewal saw (`follow_configuration`). A client
    /// that waits for retired registers (whose resets need every replica) must still
    /// admit a repaired node, or it would wait for a reset that only the admission
    /// lets complete. Returns whether it followed a configuration (a roundtrip: the
    /// clock has moved).
    async fn upkeep(&self, now: Nanos) -> bool {
        let (seen, answers) = {
            let mut lease = self.lease.borrow_mut();
            lease.tick(self.swarm.fabric(), now);
            (lease.config_epoch_seen(), lease.renewal_answers())
        };
        let follow = seen > self.followed_epoch() && answers > self.config_checked.get();
        if follow {
            self.follow_configuration(answers).await;
        }
        follow
    }

    /// Starts an operation (self-fencing, [`crate::membership::lease`]): takes the answers of the
    /// lease renewal in flight and posts the next one when due, off the critical path;
    /// the operation may start only if the lease is valid for the whole operation
    /// deadline (`max_op_ns`, superblock) — if not, a synchronous renewal, retried
    /// for up to [`KvConfig::lease_revive_ns`] while the lease is not lost (an idle
    /// client whose memory nodes cut it off waits for the transport to reconnect
    /// them), then [`KvError::LeaseExpired`]. Returns the operation's deadline on the
    /// fabric clock (it must post nothing after it: `KvClient::begin` arms it on the
    /// operation's `OpStats`, which the register protocol and the index check before
    /// posting).
    async fn begin_op(&self) -> Result<Nanos, KvError> {
        let fabric = self.swarm.fabric();
        let max_op_ns = self.layout.params.max_op_ns;
        let now = fabric.now();
        // Background log recycling: bounded, never waits.
        self.swarm.recycle_slots_tick_at(SLOT_RECYCLING_BUDGET, now);
        self.swarm.examine_carried_tick(now);
        // Following a configuration took a roundtrip: the operation starts after it.
        // Otherwise the reading above serves (only synchronous work came since: a
        // deadline from it is, if anything, early).
        let now = if self.upkeep(now).await {
            fabric.now()
        } else {
            now
        };
        let lapsed_since = {
            let lease = self.lease.borrow();
            if lease.valid_for(now, max_op_ns) {
                return Ok(now.saturating_add(max_op_ns));
            }
            // `Some`: the lease had already ended (an idle client, not one whose
            // lease merely runs short of a whole operation).
            lease.valid_until().filter(|until| *until <= now)
        };
        tracing::debug!(
            writer = self.registration.writer,
            "lease about to run out: renewing synchronously"
        );
        renew_now(&self.lease, fabric, max_op_ns).await;
        let started = now;
        let give_up = started.saturating_add(self.lease_revive_ns);
        let mut attempts = 1u32;
        loop {
            let now = fabric.now();
            let (valid, lost) = {
                let lease = self.lease.borrow();
                (lease.valid_for(now, max_op_ns), lease.lost())
            };
            if valid {
                if let Some(until) = lapsed_since {
                    tracing::info!(
                        writer = self.registration.writer,
                        lapsed_ms = now.saturating_sub(until) / 1_000_000,
                        attempts,
                        waited_ms = now.saturating_sub(started) / 1_000_000,
                        "idle client revived: its lease had lapsed (not killed) and is renewed \
                         on a majority again"
                    );
                }
                return Ok(now.saturating_add(max_op_ns));
            }
            // A lease killed by a reclaimer (or a row taken over) on a majority is
            // final: the writer id may belong to someone else now.
            if lost || now >= give_up {
                break;
            }
            // Not acknowledged by a majority (nodes unreachable or reconnecting):
            // let the transport make progress, then renew again.
            swarm_core::sleep(fabric, REVIVE_RETRY_NS.min(give_up - now)).await;
            // A renewal answer may show a configuration that admits a repaired node,
            // without which no majority may answer (an idle client across a repair
            // and the loss of another node).
            let _ = self.upkeep(fabric.now()).await;
            renew_now(&self.lease, fabric, max_op_ns).await;
            attempts += 1;
        }
        let lease = self.lease.borrow();
        tracing::warn!(
            writer = self.registration.writer,
            lost = lease.lost(),
            attempts,
            waited_ms = fabric.now().saturating_sub(started) / 1_000_000,
            "lease expired and could not be renewed on a majority: the client stops issuing \
             operations"
        );
        Err(KvError::LeaseExpired {
            writer: self.registration.writer,
        })
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

    /// The replicas of register `register`: `replicas` consecutive nodes starting at a
    /// hash of its id, in preference order (the first is its primary, §6).
    pub fn register_loc(&self, register: RegisterId) -> Result<RegisterLoc, KvError> {
        register_loc_for(&self.layout, self.nodes, register)
    }

    /// For an operation interleaved with others on this thread
    /// ([`OpStats::interleaved`]): hints the location cache's slot for `key`, yields,
    /// hints the entry that slot names, and yields again, so that the lookup that
    /// follows finds both in the processor's cache while the other operations'
    /// misses overlap these (`cache` module docs, "Interleaved lookups").
    async fn hint_cached(&self, key: &[u8], stats: &OpStats) {
        if stats.is_interleaved() {
            let hash = self.cache.borrow().hint_slot(key);
            yield_now(self.fabric()).await;
            self.cache.borrow().hint_entry(hash);
            yield_now(self.fabric()).await;
        }
    }

    /// The cached location of `key` at time `now` (expired entries are dropped).
    fn cached_at(&self, key: &[u8], now: Nanos) -> Result<Option<Located>, KvError> {
        let Some(location) = self.cache.borrow_mut().get(key, now) else {
            return Ok(None);
        };
        Ok(Some(Located {
            register: location.register,
            loc: self.register_loc(location.register)?,
            knowledge: location.knowledge,
            vouched_at: location.vouched_at,
        }))
    }

    fn remember(&self, key: &[u8], located: &Located) {
        self.cache.borrow_mut().put(
            key,
            Location {
                register: located.register,
                knowledge: located.knowledge.clone(),
                vouched_at: located.vouched_at,
            },
        );
    }

    /// Fails with [`KvError::Fenced`] once `deadline` passed: the caller is about to
    /// post a step, and memory it may name could be recycled after the deadline.
    fn fence(&self, deadline: Nanos) -> Result<(), KvError> {
        if self.swarm.fabric().now() > deadline {
            return Err(KvError::Fenced {
                max_op_ns: self.max_op_ns,
            });
        }
        Ok(())
    }

    /// Hands the registers whose reset completed to the allocator, and starts the
    /// resets that are due. Never waits.
    fn recycle_step(&self) {
        let now = self.swarm.fabric().now();
        let may_start = self.lease.borrow().valid_for(now, 0);
        // A pool of a chunk's worth is enough: registers reset beyond it go to any
        // client that runs out (`crate::registers::recycle`, "donations"); not while a node is out
        // of service, when pools are what inserts live on until the repair. Asked only
        // when a reset starts, not on every insert and delete.
        let donate = || {
            self.alloc.pooled() >= u64::from(self.layout.params.chunk_registers)
                && !self.repair_announced()
                && (0..self.nodes)
                    .all(|n| self.replica_status(NodeId(n as u16)) == ReplicaStatus::InService)
        };
        let ready = self.recycler.step(
            self.swarm.fabric(),
            &self.layout,
            may_start,
            donate,
            |r| self.register_loc(r).ok(),
            |node| self.replica_status(node),
        );
        for register in ready {
            self.alloc.give_back(register);
        }
    }

    /// Whether a repair is announced in the configuration this client follows (its
    /// resets wait for the node being rebuilt until the node is admitted).
    fn repair_announced(&self) -> bool {
        self.followed
            .borrow()
            .as_ref()
            .is_some_and(|config| config.repairing != 0)
    }

    /// What a register reset does about `node` (`crate::registers::recycle`, "a node out of
    /// service"). It may leave the node out only when the memory of its member
    /// incarnation, in the configuration this client follows, is known lost and no
    /// lease renewal has shown a newer configuration since (a repair's announcement
    /// reaches this client through its renewals; `crate::repair`, steps 1 and 2).
    /// Then, with no repair of the node announced, the reset simply does without
    /// it; with one announced, it goes through the repair journal
    /// ([`crate::registers::journal`]), or waits on a cluster without one.
    fn replica_status(&self, node: NodeId) -> ReplicaStatus {
        let followed = self.followed.borrow();
        let Some(config) = followed.as_ref() else {
            return ReplicaStatus::InService;
        };
        let Some(&member) = config.incarnations.get(node.index()) else {
            return ReplicaStatus::InService;
        };
        if config.epoch == 0 || !self.swarm.fabric().memory_lost(node, member) {
            return ReplicaStatus::InService;
        }
        if self.lease.borrow().config_epoch_seen() > config.epoch {
            return ReplicaStatus::Undecided;
        }
        if !config.is_repairing(node.index()) {
            return ReplicaStatus::Lost;
        }
        match crate::registers::journal::journal_node(node, self.nodes) {
            Some(journal) if self.layout.journal_at.is_some() => {
                ReplicaStatus::Repairing { journal }
            }
            _ => ReplicaStatus::Undecided,
        }
    }

    /// A pre-cleared register for an insert. When every chunk is claimed and the
    /// pool is empty, runs a reclamation pass (paced: [`Self::reclaim_gone_registers`]) if this
    /// client has no retired register of its own to wait for, or if its last pass
    /// left donations on offer (taken, they are ready after the delivery margin,
    /// sooner than its own pass their grace); otherwise waits for its retired
    /// registers or for the next pass (before the operation starts: the wait posts
    /// nothing but resets), up to two graces.
    async fn allocate_register(&self, stats: &OpStats) -> Result<RegisterId, KvError> {
        let fabric = self.swarm.fabric();
        let started = fabric.now();
        let mut give_up = started.saturating_add(self.recycler.grace_ns().saturating_mul(2));
        loop {
            self.recycle_step();
            let r = self
                .alloc
                .allocate(fabric, stats, &self.layout, self.nodes)
                .await;
            let Err(KvError::RegistersFull { .. }) = r else {
                return r;
            };
            let now = fabric.now();
            let in_limbo = self.recycler.in_limbo();
            let offer = self.donations_left.get() > 0;
            if now >= self.next_adoption.get() && (in_limbo == 0 || offer) {
                self.reclaim_gone_registers().await?;
                // What the pass took waits a whole grace from now, however long
                // the pass took.
                give_up = fabric
                    .now()
                    .saturating_add(self.recycler.grace_ns().saturating_mul(2));
                if self.recycler.in_limbo() == 0 {
                    return r;
                }
                continue;
            }
            let may_wait = now < give_up
                || (self.repair_announced() && now < started.saturating_add(REPAIR_WAIT_NS));
            if !may_wait || (in_limbo == 0 && !offer) {
                return r;
            }
            tracing::debug!(
                in_limbo,
                donations_left = self.donations_left.get(),
                "insert: no free register; waiting for retired ones to pass their grace, or for the next reclamation pass to take donated ones"
            );
            self.wait_for_resets(offer.then(|| self.next_adoption.get()))
                .await;
        }
    }

    /// Sleeps until the next retired register of this client is due for its reset
    /// (a millisecond while resets are in flight, or with none retired), or until
    /// `or_until` if that is sooner; renews the lease first if it lapsed (resets
    /// start only under a valid lease). Call `recycle_step` after.
    async fn wait_for_resets(&self, or_until: Option<Nanos>) {
        let fabric = self.swarm.fabric();
        let _ = self.upkeep(fabric.now()).await;
        if !self.lease.borrow().valid_for(fabric.now(), 0) {
            renew_now(&self.lease, fabric, 0).await;
        }
        let now = fabric.now();
        let resetting = self.recycler.resetting();
        let resets = match self.recycler.next_due() {
            Some(due) if !resetting => due,
            None if !resetting && or_until.is_some() => Nanos::MAX,
            // Resets in flight: look again in a millisecond.
            _ => now.saturating_add(1_000_000),
        };
        let until = resets.min(or_until.unwrap_or(Nanos::MAX));
        swarm_core::sleep(fabric, until.saturating_sub(now).max(1)).await;
    }

    /// Adopts the chunks of clients that are no longer registered and takes the
    /// registers that gone clients held (their limbos and pools, in any chunk, and the
    /// never-used registers of adopted chunks) into this client's limbo
    /// (`crate::registers::limbo`): they are handed out after the register grace (donated ones
    /// after the delivery margin). At most one round per lease period (or register
    /// grace, if shorter), and only under a valid lease (renewed first if needed):
    /// the takes are CASes that no operation deadline covers otherwise.
    async fn reclaim_gone_registers(&self) -> Result<(), KvError> {
        let fabric = self.swarm.fabric();
        let max_op = self.layout.params.max_op_ns;
        // A client living on donations needs a pass about as often as registers pass
        // their grace, where that is shorter than a lease.
        let interval = self
            .layout
            .params
            .lease_ns
            .min(self.layout.params.register_grace_ns());
        self.next_adoption
            .set(fabric.now().saturating_add(interval));
        // A pass stops when the lease runs short (its takes are CASes no operation
        // deadline covers): renewed now unless half a lease is left, it gets at
        // least that long, and the next pass goes on where this one stopped.
        let lease_ns = self.layout.params.lease_ns;
        if !self.lease.borrow().valid_for(fabric.now(), lease_ns / 2) {
            renew_now(&self.lease, fabric, lease_ns / 2).await;
        }
        // A chunk's worth of donations per pass shares scarce ones among the clients
        // that run dry; half of what the last pass left lets one client drain a
        // large offer (every register a gone client held, donated as its reclaimer
        // resets them) in a few passes, not a chunk per `interval`, while leaving
        // as much to the others.
        let me = crate::registers::limbo::Reclaimer {
            token: self.token,
            tag: self.recycler.tag(),
            max_donations: u64::from(self.layout.params.chunk_registers)
                .max(self.donations_left.get() / 2),
            resume_at: self.reclaim_resume_at.get(),
        };
        let reclaimed = crate::registers::limbo::reclaim_gone_registers(
            fabric,
            &self.layout,
            me,
            || self.lease.borrow().valid_for(fabric.now(), max_op),
            |r| self.register_loc(r).ok(),
        )
        .await?;
        self.donations_left.set(reclaimed.donations_left);
        self.reclaim_resume_at.set(reclaimed.resume_at);
        for chunk in &reclaimed.chunks {
            self.alloc.adopt(*chunk);
        }
        let now = fabric.now();
        let settled = now.saturating_add(crate::registers::limbo::settle_ns(&self.layout));
        for (register, kind) in reclaimed.taken {
            let why = match kind {
                crate::registers::limbo::Verdict::Limbo => Retired::ReclaimedLimbo,
                crate::registers::limbo::Verdict::Pool => Retired::ReclaimedPool,
                crate::registers::limbo::Verdict::Donated => {
                    self.recycler.take_donation(register, settled);
                    continue;
                }
                crate::registers::limbo::Verdict::Fresh
                | crate::registers::limbo::Verdict::Keep => Retired::Adopted,
            };
            self.recycler.retire(register, now, why);
        }
        Ok(())
    }

    /// Runs a reclamation pass ([`Self::reclaim_gone_registers`], which paces them) when this
    /// writer's log is seven-eighths full of slots its own recycling is not about to
    /// give back (in use, not in limbo); with no room left for a write, waits for
    /// the resets of the registers it retired or took, which free slots.
    ///
    /// Such a log holds, besides the values of live keys, the last values of
    /// registers that clients which came and went had retired but not reset yet:
    /// each client resets its retired registers only after the register grace, and
    /// leaves the rest to a reclamation pass when it closes. Those slots come back
    /// only once the registers are reset (slot-recycling checks then find their writes on
    /// no replica, `swarm_core::slot_recycling`, rule 3), and passes otherwise run
    /// only in a client that runs out of registers. A store whose clients come and
    /// go (one `swarm bench` after another on one cluster) filled a writer's log
    /// with them first, and its writes waited on a trickle of slots for minutes.
    async fn relieve_log(&self) {
        let fabric = self.swarm.fabric();
        let slots = self.layout.params.log_slots;
        let log = self.swarm.slot_counters();
        let pressed = log.in_use.saturating_sub(log.in_limbo) >= slots - slots / 8;
        if pressed && fabric.now() >= self.next_adoption.get() {
            tracing::debug!(
                writer = self.registration.writer,
                in_use = log.in_use,
                in_limbo = log.in_limbo,
                carried = log.carried,
                "log nearly full: reclaiming the registers of gone clients, whose resets free slots"
            );
            if let Err(error) = self.reclaim_gone_registers().await {
                tracing::info!(
                    writer = self.registration.writer,
                    %error,
                    "log nearly full: the reclamation pass failed; writes wait for slots"
                );
            }
        }
        // What a pass took is reset after the register grace. With no room left for
        // this write, wait for those resets (up to two graces, as an insert waits for
        // a register); `make_room_for` then finds the freed slots. (A pass frees no
        // slot itself: `log` still tells whether there is room.)
        let room = |in_use: u32| in_use.saturating_add(WRITE_SLOTS) <= slots;
        if room(log.in_use) || self.recycler.in_limbo() == 0 {
            return;
        }
        let give_up = fabric
            .now()
            .saturating_add(self.recycler.grace_ns().saturating_mul(2));
        tracing::debug!(
            writer = self.registration.writer,
            registers_in_limbo = self.recycler.in_limbo(),
            "log full: waiting for retired registers' resets, which free the slots of their values"
        );
        let resets_done = || {
            let stats = self.recycler.stats();
            stats.recycled + stats.donated
        };
        let mut checked_at = resets_done();
        while !room(self.swarm.slot_counters().in_use)
            && self.recycler.in_limbo() > 0
            && fabric.now() < give_up
        {
            self.recycle_step();
            self.wait_for_resets(None).await;
            self.recycle_step();
            // A reset register's value is on no replica any more: a check of every
            // tracked register frees it (after the slot grace, which `make_room_for`
            // waits out). Only once resets ended since the last one: a whole check
            // reads every register this writer has a value in.
            if resets_done() > checked_at {
                checked_at = resets_done();
                let _ = self.swarm.recycle_slots_step(usize::MAX).await;
                let _ = self.swarm.make_room_for(WRITE_SLOTS).await;
            }
        }
    }

    /// Runs one reclamation pass now, whatever the allocator holds (tests and tools;
    /// clients run it by themselves when they run out of registers).
    pub async fn reclaim_gone_registers_now(&self) -> Result<(), KvError> {
        self.reclaim_gone_registers().await
    }

    /// This client's incarnation token (tests of `crate::registers::limbo`).
    #[cfg(test)]
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    async fn read_register(
        &self,
        located: &mut Located,
        stats: &OpStats,
    ) -> Result<ReadValue, KvError> {
        Ok(match self.protocol {
            RegisterProtocol::SafeGuess => {
                self.swarm
                    .read(&located.loc, &mut located.knowledge, stats)
                    .await?
            }
            RegisterProtocol::Abd => {
                self.swarm
                    .abd_read(&located.loc, &mut located.knowledge, stats)
                    .await?
            }
            RegisterProtocol::Raw => {
                let value = self.swarm.raw_read(&located.loc, stats).await?;
                if matches!(value, ReadValue::Value(_)) {
                    // RAW keeps no metadata; remember that the register holds a value.
                    located.knowledge = RegisterCache::holding_raw_value();
                }
                value
            }
        })
    }

    /// Writes `payload` into the fresh, unpublished register `fresh` with its key
    /// `header` (at `header_at`), both on a majority of its replicas. Safe-Guess does
    /// both in one batch per replica (`swarm_core`'s `write_fresh`: the register races
    /// nothing before it is published); the baselines write the header next to an
    /// ordinary write.
    ///
    /// With `carried` (Safe-Guess only), that operation rides after the write in every
    /// replica's batch (`swarm_core`'s `write_fresh_carrying`); returns what it
    /// returned on each replica that answered (empty without it).
    async fn write_fresh(
        &self,
        fresh: &mut Located,
        stats: &OpStats,
        header_at: u64,
        mut header: Vec<u8>,
        payload: &[u8],
        carried: Option<Op>,
    ) -> Result<Carried, KvError> {
        let header_len = header.len();
        let fabric = self.swarm.fabric();
        if self.protocol == RegisterProtocol::SafeGuess {
            // The header area ends where the register starts: the header, zero-padded
            // to it, goes in the same write as the value's in-place copy.
            let area = fresh.loc.addr.saturating_sub(header_at) as usize;
            if header_len > area {
                return Err(KvError::Corrupted {
                    register: fresh.register,
                });
            }
            header.resize(area, 0);
            let (outcome, outputs) = match carried {
                None => {
                    let outcome = self
                        .swarm
                        .write_fresh(&fresh.loc, &mut fresh.knowledge, stats, payload, &header)
                        .await?;
                    (outcome, Carried::new())
                }
                Some(op) => {
                    self.swarm
                        .write_fresh_carrying(
                            &fresh.loc,
                            &mut fresh.knowledge,
                            stats,
                            payload,
                            &header,
                            op,
                        )
                        .await?
                }
            };
            if outcome == FreshOutcome::Written {
                return Ok(outputs);
            }
            // Not cleared (a recycling bug): the ordinary write handles any state.
            // The header is already where the replicas answered.
            let _ = self.write_register(fresh, stats, payload).await?;
            return Ok(outputs);
        }
        let replicas = fresh.loc.replicas.clone();
        // The header goes to every replica: let their cache misses overlap (the value
        // write hints its own bytes, `swarm_core`'s write round).
        let header = &header[..header_len];
        for &node in replicas.nodes() {
            fabric.prefetch(node, header_at, header_len as u64);
        }
        let (header_stats, value_stats) = (stats.branch(), stats.branch());
        let write_header = async {
            let nodes = replicas.nodes().iter().copied();
            broadcast(fabric, &header_stats, nodes, replicas.quorum(), |_| {
                Ok(Batch::write(header_at, header.to_vec()))
            })
            .await
            .map(drop)
        };
        let write_value = self.write_register(fresh, &value_stats, payload);
        let (header_written, value_written) = swarm_core::join(write_header, write_value).await;
        stats.join_branches(&[&header_stats, &value_stats]);
        header_written?;
        value_written?;
        Ok(Carried::new())
    }

    async fn write_register(
        &self,
        located: &mut Located,
        stats: &OpStats,
        payload: &[u8],
    ) -> Result<WriteOutcome, KvError> {
        Ok(match self.protocol {
            RegisterProtocol::SafeGuess => {
                self.swarm
                    .write(&located.loc, &mut located.knowledge, stats, payload)
                    .await?
            }
            RegisterProtocol::Abd => {
                self.swarm
                    .abd_write(&located.loc, &mut located.knowledge, stats, payload)
                    .await?
            }
            RegisterProtocol::Raw => {
                self.swarm.raw_write(&located.loc, stats, payload).await?;
                // RAW keeps no metadata; remember that the register holds a value.
                located.knowledge = RegisterCache::holding_raw_value();
                WriteOutcome::Written
            }
        })
    }

    /// Reads `located`'s register and checks that it holds `key`. `Ok(None)`: the
    /// register is deleted, empty, or holds another key.
    async fn read_checked(
        &self,
        key: &[u8],
        located: &mut Located,
        stats: &OpStats,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let value = self.read_register(located, stats).await?;
        let ReadValue::Value(payload) = value else {
            return Ok(None);
        };
        match decode_payload(&payload) {
            Some((k, v)) if k == key => Ok(Some(v.to_vec())),
            _ => Ok(None),
        }
    }

    /// The register of `key` for an update or a delete: the cached one if the cache
    /// knows it holds a write, otherwise the one the index resolves (`None`: absent).
    /// `now` is the current time (the cache entry's age is judged at it); the flag
    /// tells whether the index was asked (time passed: fence before the next step).
    async fn locate_written(
        &self,
        key: &[u8],
        stats: &OpStats,
        now: Nanos,
    ) -> Result<(Option<Located>, bool), KvError> {
        match self.cached_at(key, now)? {
            Some(located) if located.knowledge.knows_a_write() => Ok((Some(located), false)),
            // Boxed, here and on the other rare paths (a get's miss, an insert's
            // publication, an unmap): inline, they would make every operation's future
            // as large as the largest of them, and executors move futures when they
            // spawn them (`tests/kv_semantics.rs`, `operation_futures_stay_small`).
            _ => Ok((
                Box::pin(self.resolve(key, stats))
                    .await?
                    .map(|(located, _)| located),
                true,
            )),
        }
    }

    /// Starts an operation: the lease check ([`Self::begin_op`]), then its deadline
    /// armed on `stats`, so that every step (index, registers) is fenced from the
    /// start. Returns the start and the deadline on the fabric clock.
    async fn begin<'s>(&self, stats: &'s OpStats) -> Result<Started<'s>, KvError> {
        let deadline = self.begin_op().await?;
        Ok(Started {
            start: deadline.saturating_sub(self.max_op_ns),
            deadline,
            _scope: stats.arm_deadline(deadline),
        })
    }

    /// [`Self::begin`] for an operation that writes: while this writer's log is full,
    /// it first waits, with no deadline armed and nothing posted but reads, for a
    /// superseded slot's grace to pass (`swarm_core::Client::make_room`). A writer
    /// faster than its log recycles (`log_slots / grace` writes per second, about
    /// 6,300 on a 32 MiB cluster with 64 writers) is throttled instead of failing
    /// with `Fenced`: the grace is longer than the operation deadline, so a write
    /// that waited inside its operation would run out of time.
    /// An insert may write two registers (its fresh one, then the key's existing
    /// one), so writes wait for [`WRITE_SLOTS`] free slots.
    async fn begin_write<'s>(&self, stats: &'s OpStats) -> Result<Started<'s>, KvError> {
        self.relieve_log().await;
        self.swarm.make_room_for(WRITE_SLOTS).await;
        self.begin(stats).await
    }

    /// The current time for attempt `attempt` of an operation that started at
    /// `start` (the first attempt runs at its start: no clock read), after fencing
    /// later attempts.
    fn attempt_now(&self, attempt: u32, start: Nanos, deadline: Nanos) -> Result<Nanos, KvError> {
        if attempt == 0 {
            return Ok(start);
        }
        self.fence(deadline)?;
        Ok(self.swarm.fabric().now())
    }

    /// Finds `key` through the index: the first candidate register that holds it.
    async fn resolve(
        &self,
        key: &[u8],
        stats: &OpStats,
    ) -> Result<Option<(Located, Vec<u8>)>, KvError> {
        let asked = self.swarm.fabric().now();
        let candidates = self.index.lookup(self.swarm.fabric(), stats, key).await?;
        for register in candidates.registers {
            let mut located = Located {
                register,
                loc: self.register_loc(register)?,
                knowledge: RegisterCache::new(),
                vouched_at: asked,
            };
            if let Some(value) = self.read_checked(key, &mut located, stats).await? {
                self.remember(key, &located);
                return Ok(Some((located, value)));
            }
        }
        Ok(None)
    }

    /// The key's current value, or `None` if it is absent.
    ///
    /// An attempt that ran past its deadline (a stall: preemption, a page fault, a
    /// paused process) is retried, up to [`FENCED_ATTEMPTS`] attempts in all: a read
    /// that stopped changed nothing a reader could tell.
    pub async fn get(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        let mut attempt = 1;
        loop {
            match self.get_once(key, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "get: stalled past its deadline; retrying");
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    async fn get_once(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        self.check_key(key)?;
        self.hint_cached(key, stats).await;
        let started = self.begin(stats).await?;
        if let Some(mut located) = self.cached_at(key, started.start)? {
            if let Some(value) = self.read_checked(key, &mut located, stats).await? {
                self.remember(key, &located);
                return Ok(Some(value));
            }
            // Deleted (or never this key's): the cached location is stale.
            self.cache.borrow_mut().remove(key);
        }
        Ok(Box::pin(self.resolve(key, stats))
            .await?
            .map(|(_, value)| value))
    }

    /// Replaces the value of a present key; `Ok(false)` if the key is absent.
    ///
    /// An attempt that ran past its deadline is retried (up to [`FENCED_ATTEMPTS`]
    /// in all): writing the same value again within the call is safe. If a retry
    /// finds the key absent, an earlier attempt may have written the value before a
    /// delete: that is [`KvError::OutcomeUnknown`], not `false`.
    pub async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, KvError> {
        let mut attempt = 1;
        loop {
            match self.update_once(key, value, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "update: stalled past its deadline; retrying");
                    attempt += 1;
                }
                Ok(false) if attempt > 1 => {
                    return Err(KvError::OutcomeUnknown {
                        op: "update",
                        attempts: attempt,
                    });
                }
                outcome => return outcome,
            }
        }
    }

    async fn update_once(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
    ) -> Result<bool, KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let payload = encode_payload(key, value);
        self.hint_cached(key, stats).await;
        let started = self.begin_write(stats).await?;
        let (start, deadline) = (started.start, started.deadline);
        for attempt in 0..MAX_RETRIES {
            let now = self.attempt_now(attempt, start, deadline)?;
            let (located, resolved) = self.locate_written(key, stats, now).await?;
            let Some(mut located) = located else {
                return Ok(false);
            };
            if resolved {
                self.fence(deadline)?;
            }
            match self.write_register(&mut located, stats, &payload).await? {
                WriteOutcome::Written => {
                    self.remember(key, &located);
                    return Ok(true);
                }
                WriteOutcome::Deleted => {
                    Box::pin(self.forget_deleted(key, located.register, stats, deadline)).await?;
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Inserts `key` (an insert of a present key becomes an update).
    ///
    /// An attempt that ran past its deadline is retried (up to [`FENCED_ATTEMPTS`]
    /// in all): the key ends up holding the value either way.
    pub async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), KvError> {
        let mut attempt = 1;
        loop {
            match self.insert_once(key, value, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "insert: stalled past its deadline; retrying");
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    async fn insert_once(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let payload = encode_payload(key, value);
        // The operation starts once it has its register: waiting for one (for
        // retired registers to pass their grace) posts nothing but chunk claims and
        // resets, which no operation deadline protects.
        let register = self.allocate_register(&OpStats::new()).await?;
        let started = self.begin_write(stats).await?;
        let (start, deadline) = (started.start, started.deadline);
        let mut fresh = Located {
            register,
            loc: self.register_loc(register)?,
            knowledge: RegisterCache::new(),
            vouched_at: start,
        };
        // Set when an index call could not tell whether it mapped `register`.
        let uncertain = Cell::new(false);
        let result =
            Box::pin(self.publish(key, &payload, &mut fresh, stats, deadline, &uncertain)).await;
        match &result {
            Ok(Published::Yes) => {}
            // Never published: nobody else can know the register (recycle.rs).
            Ok(Published::No) | Err(_) if !uncertain.get() => {
                self.retire_marked(register, key.len(), Retired::Unpublished, deadline);
            }
            _ => {
                tracing::debug!(
                    register,
                    "insert: the index could not tell whether the fresh register was mapped; it is not recycled"
                );
            }
        }
        result.map(drop)
    }

    /// The blind fast round an insert of `key` → `register` carries in its register
    /// write (index module docs, "one-roundtrip inserts"), or `None` where there is
    /// none to try: a baseline protocol (no fresh-register write to carry it), fast
    /// inserts turned off, registers on fewer nodes than the index (the round is
    /// decided only by every node, and it may only run on a node after the register's
    /// write there), a node suspected (the round needs every node), or too few of this
    /// client's recent rounds decided for one more to pay (`blind_policy`).
    fn blind_insert(
        &self,
        key: &[u8],
        register: RegisterId,
    ) -> Result<Option<BlindInsert>, KvError> {
        if self.protocol != RegisterProtocol::SafeGuess
            || !self.index.config.fast_inserts
            || usize::from(self.layout.params.replicas) != self.nodes
            || self.swarm.suspicion().any()
            || !self.blind.should_try()
        {
            return Ok(None);
        }
        Ok(Some(self.index.blind_insert(key, register)?))
    }

    /// One roundtrip (§5.3.1, index "one-roundtrip inserts"): writes `fresh` (key
    /// `header` at `header_at`, and `payload`) with the index's `blind` fast round
    /// last in its batch to every node, so that no node maps the register before it
    /// holds the header and the value. Returns what the blind CAS found on each node
    /// that answered, and when it was sent.
    async fn write_fresh_blind(
        &self,
        fresh: &mut Located,
        stats: &OpStats,
        header_at: u64,
        header: Vec<u8>,
        payload: &[u8],
        blind: &BlindInsert,
    ) -> Result<(Carried, Nanos), KvError> {
        // Watched from a recent reading: from a little earlier than the send is the
        // cautious side (`index::watch`).
        let sent = self.swarm.fabric().recent_now();
        let took = self
            .write_fresh(fresh, stats, header_at, header, payload, Some(blind.op()))
            .await?;
        self.blind.record(self.index.blind_decided(&took));
        Ok((took, sent))
    }

    /// Writes `fresh` (key header and value) and maps `key` to it, or updates the
    /// key's existing register if it is present. Sets `uncertain` when an index call
    /// could not tell whether it mapped `fresh`.
    async fn publish(
        &self,
        key: &[u8],
        payload: &[u8],
        fresh: &mut Located,
        stats: &OpStats,
        deadline: Nanos,
        uncertain: &Cell<bool>,
    ) -> Result<Published, KvError> {
        let fabric = self.swarm.fabric();
        let register = fresh.register;
        let header_at = self
            .layout
            .key_header(register)
            .ok_or(KvError::Corrupted { register })?;
        let header = encode_key_header(key);
        let mut first = if let Some(blind) = self.blind_insert(key, register)? {
            let written = self.write_fresh_blind(fresh, stats, header_at, header, payload, &blind);
            let (took, sent) = match written.await {
                Ok(written) => written,
                Err(e) => {
                    // The CAS may have taken on every node.
                    uncertain.set(true);
                    return Err(e);
                }
            };
            if let Err(e) = self.fence(deadline) {
                uncertain.set(true);
                return Err(e);
            }
            let attempt = self
                .index
                .finish_blind(fabric, stats, key, deadline, blind, sent, &took)
                .await;
            Some((attempt, sent))
        } else {
            // Two steps in flight together, one roundtrip: the key header with the
            // value, and the read of the key's index buckets (§5.3.1). The index
            // changes only once the header is on a majority (a register is never
            // indexed before its key header), in one more roundtrip on the fast path
            // (`index::fast`).
            let (write_stats, read_stats) = (stats.branch(), stats.branch());
            let write = self.write_fresh(fresh, &write_stats, header_at, header, payload, None);
            let read_sent = fabric.now();
            let read_index =
                self.index
                    .read_for_insert(fabric, &read_stats, key, register, deadline);
            let (written, index_read) = swarm_core::join(write, read_index).await;
            stats.join_branches(&[&write_stats, &read_stats]);
            written?;
            // Nothing was proposed if the read failed: the register was not mapped.
            let read = index_read?;
            self.fence(deadline)?;
            Some((read.finish(stats).await, read_sent))
        };
        for _ in 0..MAX_RETRIES {
            let (attempt, asked) = match first.take() {
                Some(first) => first,
                None => {
                    self.fence(deadline)?;
                    let asked = fabric.now();
                    let attempt = self
                        .index
                        .insert_until(fabric, stats, key, register, deadline)
                        .await;
                    (attempt, asked)
                }
            };
            let outcome = match attempt {
                Ok(outcome) => outcome,
                // The index could not tell whether our mapping took effect (this client
                // stalled past its acknowledgement window): ask it.
                Err(IndexError::OutcomeUnknown { .. }) => {
                    uncertain.set(true);
                    match self.index.resolve(fabric, stats, key).await? {
                        Some(r) if r == register => InsertOutcome::Inserted,
                        Some(other) => InsertOutcome::Exists(other),
                        None => continue,
                    }
                }
                Err(e) => {
                    uncertain.set(true);
                    return Err(e.into());
                }
            };
            match outcome {
                InsertOutcome::Inserted => {
                    self.remember(key, fresh);
                    return Ok(Published::Yes);
                }
                InsertOutcome::Exists(existing) => {
                    let mut old = Located {
                        register: existing,
                        loc: self.register_loc(existing)?,
                        knowledge: RegisterCache::new(),
                        vouched_at: asked,
                    };
                    self.fence(deadline)?;
                    let value = self.read_register(&mut old, stats).await?;
                    if value == ReadValue::Deleted {
                        self.fence(deadline)?;
                        // Re-insert over a deleted key: take over its mapping.
                        let replaced = match self
                            .index
                            .replace_until(fabric, stats, key, existing, register, deadline)
                            .await
                        {
                            Ok(replaced) => replaced,
                            // As for the insert above: ask the index what happened.
                            Err(IndexError::OutcomeUnknown { .. }) => {
                                uncertain.set(true);
                                self.index.resolve(fabric, stats, key).await? == Some(register)
                            }
                            // Others keep changing the key's bucket: look again.
                            Err(IndexError::Contention { .. }) => {
                                uncertain.set(true);
                                false
                            }
                            Err(e) => {
                                uncertain.set(true);
                                return Err(e.into());
                            }
                        };
                        if replaced {
                            self.remember(key, fresh);
                            // This call unmapped the deleted register: it owns it.
                            self.retire_marked(existing, key.len(), Retired::Unmapped, deadline);
                            return Ok(Published::Yes);
                        }
                        continue;
                    }
                    // The key is present: the insert becomes an update (§5.3.1).
                    self.fence(deadline)?;
                    match self.write_register(&mut old, stats, payload).await? {
                        WriteOutcome::Written => {
                            self.remember(key, &old);
                            return Ok(Published::No);
                        }
                        WriteOutcome::Deleted => continue,
                    }
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Deletes `key`: [`DeleteOutcome::Removed`] if this call removed its value,
    /// [`DeleteOutcome::Absent`] if the key was absent, and [`DeleteOutcome::Raced`] if
    /// another delete of the same value ran at the same time: the key is absent either
    /// way, and which of the racing deletes removed the value is undecided (deciding
    /// it is consensus, which no wait-free protocol over crash-prone memory nodes
    /// solves; `swarm_core::protocol::delete`).
    ///
    /// A register found in this client's cache may no longer be the key's: deleted
    /// by another client, the key re-inserted into another register since. Its
    /// delete then finds another tombstone first on some replica, exactly as if
    /// another delete were racing it. So a delete through the cache that did not
    /// remove the value asks the index: if the key still maps to that register (or
    /// to nothing), the outcome stands; if it maps to another one, this delete
    /// deletes that one, unless its tombstone may be first on a majority of the
    /// cached register (then it may be the delete that removed the value there, and
    /// reports [`DeleteOutcome::Raced`]). If a memory node does not answer, that
    /// may be undecidable: [`KvError::DeleteUndecided`], rare, with nothing changed
    /// but perhaps that value.
    ///
    /// An attempt that ran past its deadline is retried (up to [`FENCED_ATTEMPTS`]
    /// in all). The attempt that stopped may have removed the value, so a retry that
    /// finds the key absent reports [`DeleteOutcome::Raced`]: deleted, by this call or
    /// another, undecided.
    pub async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, KvError> {
        let mut attempt = 1;
        loop {
            match self.delete_once(key, stats).await {
                Err(error) if error.is_fenced() && attempt < FENCED_ATTEMPTS => {
                    tracing::debug!(%error, attempt, "delete: stalled past its deadline; retrying");
                    attempt += 1;
                }
                Ok(DeleteOutcome::Absent) if attempt > 1 => return Ok(DeleteOutcome::Raced),
                outcome => return outcome,
            }
        }
    }

    async fn delete_once(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, KvError> {
        self.check_key(key)?;
        if self.protocol == RegisterProtocol::Raw {
            return Err(KvError::Unsupported(
                "delete with the RAW baseline protocol",
            ));
        }
        self.hint_cached(key, stats).await;
        let started = self.begin_write(stats).await?;
        // Hand out the registers whose reset completed and start the resets due
        // (never waits): deletes retire registers, so they also move them along.
        // After the lease check: resets start only under a valid lease.
        self.recycle_step();
        let (start, deadline) = (started.start, started.deadline);
        // A register this call found deleted and could not unmap.
        let mut found_deleted = None;
        // A register reached through the cache whose delete did not report `Removed`,
        // with where it is and that outcome: the index decides next whether it was
        // still the key's register (see the method docs).
        let mut from_cache: Option<(RegisterId, RegisterLoc, DeleteOutcome, DeleteVotes)> = None;
        for attempt in 0..MAX_RETRIES {
            let now = self.attempt_now(attempt, start, deadline)?;
            let (located, resolved) = self.locate_written(key, stats, now).await?;
            let Some(mut located) = located else {
                // The key maps to nothing now: it was absent at that moment, which
                // agrees with either outcome of a delete of a cached register.
                return Ok(from_cache.map_or(DeleteOutcome::Absent, |(_, _, outcome, _)| outcome));
            };
            if resolved && found_deleted == Some(located.register) {
                // The index, read just now, still maps the key to the register found
                // deleted: the key was absent when the index was read.
                return Ok(DeleteOutcome::Absent);
            }
            if resolved {
                self.fence(deadline)?;
            }
            let known = match from_cache.take() {
                // Still the key's register: its delete's outcome stands.
                Some((register, _, outcome, votes)) if register == located.register => {
                    Some((outcome, votes))
                }
                // The key moved to another register. If this delete's tombstone may be
                // first on a majority of the cached one, it may be the delete that
                // removed the value there, and must not remove another.
                Some((register, loc, DeleteOutcome::Raced, votes)) => {
                    match self.swarm.first_deleter(&loc, &votes, stats).await? {
                        FirstDeleter::NotMe => None,
                        FirstDeleter::Me => return Ok(DeleteOutcome::Raced),
                        FirstDeleter::Unknown => {
                            return Err(KvError::DeleteUndecided { register });
                        }
                    }
                }
                _ => None,
            };
            let (outcome, votes) = match known {
                Some(known) => known,
                None => {
                    self.swarm
                        .delete_with_votes(&located.loc, &mut located.knowledge, stats)
                        .await?
                }
            };
            if !resolved && outcome != DeleteOutcome::Removed {
                // Another delete's tombstone was there first somewhere: perhaps long
                // ago, and the key lives elsewhere now. Ask the index.
                self.cache.borrow_mut().remove(key);
                from_cache = Some((located.register, located.loc.clone(), outcome, votes));
                continue;
            }
            match outcome {
                outcome @ (DeleteOutcome::Removed | DeleteOutcome::Raced) => {
                    // The tombstone is the delete's linearization point (SWARM
                    // §5.3.2): the key is gone whatever the unmap does. An index
                    // that cannot unmap now (contention, a stalled client, a lost
                    // majority, the deadline) leaves `key → tombstone`, which reads
                    // as absent and which the next insert of the key replaces. So
                    // the unmap may also wait until after the delete returned
                    // (`deferred_unmap`).
                    if self.deferred.borrow_mut().defer(key, located.register) {
                        self.cache.borrow_mut().remove(key);
                        return Ok(outcome);
                    }
                    if let Err(error) =
                        Box::pin(self.forget_deleted(key, located.register, stats, deadline)).await
                    {
                        tracing::debug!(%error, register = located.register, "delete: unmapping the tombstoned register failed; the mapping stays (it reads as absent)");
                    }
                    return Ok(outcome);
                }
                // Already deleted by someone else: the key may live elsewhere now.
                DeleteOutcome::Absent => {
                    match Box::pin(self.forget_deleted(key, located.register, stats, deadline))
                        .await
                    {
                        Ok(()) => {}
                        // The unmap raced other index operations on the key's bucket
                        // (its deleter's own unmap, a re-insert): look the key up again.
                        Err(KvError::Index(
                            error @ (IndexError::OutcomeUnknown { .. }
                            | IndexError::Contention { .. }),
                        )) => {
                            tracing::debug!(%error, register = located.register, "delete: unmapping a register found deleted did not settle; looking the key up again");
                            found_deleted = Some(located.register);
                        }
                        Err(error) => return Err(error),
                    }
                }
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Flushes a deleted register from the cache and unmaps it from the index (a
    /// no-op if its deleter already did, or a re-insert replaced it). If this call's
    /// remove is the one that unmapped it, this client owns the register and retires
    /// it (`crate::registers::recycle`).
    async fn forget_deleted(
        &self,
        key: &[u8],
        register: RegisterId,
        stats: &OpStats,
        deadline: Nanos,
    ) -> Result<(), KvError> {
        self.cache.borrow_mut().remove(key);
        self.fence(deadline)?;
        let fabric = self.swarm.fabric();
        if self
            .index
            .remove_until(fabric, stats, key, register, deadline)
            .await?
        {
            self.retire_marked(register, key.len(), Retired::Unmapped, deadline);
        }
        Ok(())
    }

    /// Retires `register`, whose key header holds a key of `key_len` bytes, after
    /// tagging it as this client's on every replica (`crate::registers::limbo`): if this client
    /// goes away before the register's grace, another reclaims it. The mark is posted
    /// only before the operation's `deadline`.
    fn retire_marked(&self, register: RegisterId, key_len: usize, why: Retired, deadline: Nanos) {
        let fabric = self.swarm.fabric();
        if let Ok(loc) = self.register_loc(register) {
            self.recycler.mark(
                fabric,
                &self.layout,
                register,
                key_len,
                loc.replicas.nodes(),
                deadline,
            );
        }
        self.recycler.retire(register, fabric.now(), why);
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
}
