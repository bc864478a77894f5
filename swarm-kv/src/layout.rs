//! Where everything lives on a SWARM-KV memory node.
//!
//! Every memory node of a cluster has the same layout, so a register is at the same
//! offset on each of its replicas and one address names it everywhere. Since
//! superblock version 8 the register area is split into *replica groups*
//! ([`NodeLayout::placement`]): each band of the area is shared by `n / r` groups
//! of `r` disjoint nodes, so that the cluster holds `n / r` times one node's
//! registers; each group's registers are shifted by 8 bytes per group in the band,
//! so that an address still names one register of the cluster.
//! Offsets are bytes from the start of the node; areas are 4 KiB aligned.
//!
//! ```text
//! 0            node header (swarm_core::header): magic, node id, epoch, tick, ...
//! 4 KiB        KV superblock: the cluster parameters below, with a checksum
//! client table one 64-byte row per writer id: claim word, lease word, pid
//! journal      one repair-journal row per writer id (superblock version 5, crate::registers::journal)
//! chunk table  one claim word per chunk of registers (two-level allocation, FUSEE §4.4)
//! index        the replicated hash index (see crate::index)
//! registers    register slots: [key header | SWARM register (in-place block, W words)]
//! logs         one out-of-place log per writer id (swarm_core::layout)
//! summaries    one log summary per writer id (superblock version 3 and later)
//! ```
//!
//! * A **register slot** starts with an immutable *key header* `[key length u32 |
//!   reserved u32 | key bytes]`, written before the slot is published in the index,
//!   so that the index can tell keys apart without reading register values. The
//!   SWARM register that follows holds the payload `[key length u16 | key | value]`:
//!   a read checks the key it gets back, so a stale cache entry can never return
//!   another key's value.
//! * Sizes come from [`ClusterParams`], chosen at `swarm init` and stored in the
//!   superblock; every client reads them from there and refuses a superblock that
//!   does not validate.

use swarm_core::encoding::MAX_WRITERS;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::{Layout, LayoutError};
use swarm_core::summary::{LogSummary, SUMMARY_HEADER_BYTES};
use xxhash_rust::xxh3::xxh3_64;

/// Alignment of every area.
pub const AREA_ALIGN: u64 = 4096;
/// Offset of the KV superblock.
pub const SUPERBLOCK_AT: u64 = HEADER_SIZE;
/// Bytes reserved for the superblock.
pub const SUPERBLOCK_BYTES: u64 = 4096;
/// Bytes of one client-table row.
pub const CLIENT_ROW_BYTES: u64 = 64;
/// Bytes of one index bucket.
pub const BUCKET_BYTES: u64 = 64;
/// Magic bytes of the superblock.
pub const KV_MAGIC: [u8; 8] = *b"SWARMKV\0";
/// Superblock format version written by this build (2: lease parameters and the
/// operation deadline; 3: the flags word, whose bit 0 says the node has a log-summary
/// area; 4: bit 1 of the flags word, tick ceilings in the client table; 5: bit 2,
/// the repair journal; 6: registers are reset to life markers, not zeros,
/// `crate::registers::reset`, which builds that read version 5 at most must not
/// write or misread; 7: bit 3, cached locations checked by their register's life, so
/// registers are reused one operation deadline after retirement, which builds that
/// read version 6 at most, whose cached locations rely on the cache lifetime, must
/// not share). Versions 1 to 6 are still read, with the defaults, no summaries (1,
/// 2), no tick ceilings (1 to 3), no repair journal (1 to 4) and the grace that
/// waits for the cache lifetime (1 to 6); 8: bit 4, replica groups
/// ([`ClusterParams::placement_nodes`], [`NodeLayout::placement`]), which builds
/// that read version 7 at most would place every register on the wrong nodes; 9:
/// bit 5, a metadata group ([`ClusterParams::metadata_nodes`]), written only by a
/// cluster that has one (other clusters still write version 8), which builds that
/// read version 8 at most would look for on every node; 10: bit 6, a placement table
/// ([`ClusterParams::placement_table`], `crate::placement`), written only by a
/// cluster that has one, which builds that read version 9 at most would ignore,
/// placing recorded chunks where they are not; 11: bit 7, reserve chunks for
/// growth to [`ClusterParams::max_nodes`] nodes (at offset 54), written only by a
/// cluster that has them, whose chunk table, placement table and index are longer
/// than builds that read version 10 at most would think.
pub const KV_VERSION: u32 = 11;
/// Bit of the superblock's flags word: the layout has a log-summary area.
pub const FLAG_LOG_SUMMARIES: u64 = 1;
/// Bit of the superblock's flags word: every client keeps a tick ceiling in its
/// client-table row (`crate::membership::writer_ids`), so that a crashed client's successor
/// resumes its log without reading it first. Only builds that keep the ceiling
/// read a cluster with this bit (version 4 and later).
pub const FLAG_TICK_CEILINGS: u64 = 2;
/// Bit of the superblock's flags word: the layout has a repair journal after the
/// client table ([`crate::registers::journal`]), so that registers keep coming back while a
/// repair rebuilds a node (version 5 and later).
pub const FLAG_REPAIR_JOURNAL: u64 = 4;
/// Bit of the superblock's flags word: every client of the cluster checks a cached
/// location by its register's life, so a retired register is reused one operation
/// deadline after retirement, not after the location cache's lifetime
/// ([`ClusterParams::register_grace_ns`]; version 7 and later).
pub const FLAG_CACHED_LIVES: u64 = 8;
/// Bit of the superblock's flags word: registers are placed in replica groups over
/// [`ClusterParams::placement_nodes`] nodes, whose count is at offset 26
/// ([`NodeLayout::placement`]; version 8 and later).
pub const FLAG_REPLICA_GROUPS: u64 = 16;
/// Bit of the superblock's flags word: the index, client table, repair journal,
/// chunk table and configuration live on the first [`ClusterParams::metadata_nodes`]
/// nodes only, whose count is at offset 52 (version 9 and later).
pub const FLAG_METADATA_GROUP: u64 = 32;
/// Bit of the superblock's flags word: the metadata group holds a placement table
/// after the chunk table, one record per chunk (`crate::placement`; version 10 and
/// later).
pub const FLAG_PLACEMENT_TABLE: u64 = 64;
/// Bit of the superblock's flags word: the cluster has *reserve chunks* for growth
/// to [`ClusterParams::max_nodes`] nodes, whose count is at offset 54
/// ([`NodeLayout::reserve_chunks`]; version 11 and later).
pub const FLAG_RESERVE_CHUNKS: u64 = 128;
/// Identities of registers ([`NodeLayout::identity`]) stay below this: a log
/// record's owner tag names its register in units of 8 bytes in 32 bits
/// (`swarm_core::layout`).
pub const MAX_IDENTITY: u64 = 8 << 32;
/// The metadata group `swarm init` gives a cluster of more than
/// [`swarm_core::MAX_NODES`] nodes (at least its replica count): its first this many
/// nodes ([`ClusterParams::metadata_nodes`]).
pub const DEFAULT_METADATA_NODES: u16 = 5;

/// The metadata group of a new cluster of `nodes` nodes with `replicas` replicas:
/// none (every node, as before version 9) up to [`swarm_core::MAX_NODES`] nodes,
/// else [`DEFAULT_METADATA_NODES`] or `replicas` nodes, whichever is more.
pub fn default_metadata_nodes(nodes: u16, replicas: u16) -> u16 {
    if usize::from(nodes) <= swarm_core::MAX_NODES {
        0
    } else {
        DEFAULT_METADATA_NODES.max(replicas)
    }
}

/// The node count a new cluster of `nodes` nodes reserves room to grow to
/// ([`ClusterParams::max_nodes`]) unless told otherwise: twice its nodes, at most
/// [`swarm_core::MAX_CLUSTER_NODES`]. What it costs is index buckets and table
/// words for the keys of the added nodes, taken from the logs' share
/// ([`ClusterParams::for_node_size`]; ARCHITECTURE.md, "Reserve chunks").
pub fn default_max_nodes(nodes: u16) -> u16 {
    nodes
        .saturating_mul(2)
        .min(swarm_core::MAX_CLUSTER_NODES as u16)
}
/// Bytes of an encoded superblock (version 2; version 1 used the first 64).
pub const SUPERBLOCK_ENCODED_BYTES: usize = 128;
/// Default lease duration (`swarm init --lease`).
pub const DEFAULT_LEASE_NS: u64 = 2_000_000_000;
/// Default lease renewal period (`swarm init --lease-renew`).
pub const DEFAULT_LEASE_RENEW_NS: u64 = 250_000_000;
/// Default operation deadline (`swarm init --max-op`): an operation never posts a
/// batch later than this after it started (the fence the recycling code relies on,
/// `swarm_core::slot_recycling`). Operations take microseconds (milliseconds with failed
/// nodes, and up to about 100 ms for a client thread descheduled on an overloaded
/// machine: a 100 ms fence failed one operation in a few hundred thousand on a 2-core
/// machine running four builds); a superseded log slot returns to its writer about
/// `max_op · 9/7 + 10 ms · 9/8` later (`swarm_core::slot_recycling::grace_ns`), so the fence
/// also bounds the backlog of slots waiting to be recycled: about 268 ms of a
/// writer's writes with 200 ms, beyond
/// which a writer with a full log waits (a 500 ms fence made YCSB A on a 64 MiB
/// cluster wait for its logs: 320 kops/s instead of 870). An operation that runs
/// longer fails with `KvError::Fenced` (or the register protocol's `Fenced`) and may
/// be retried.
pub const DEFAULT_MAX_OP_NS: u64 = 200_000_000;
/// Default location-cache entry lifetime (`swarm init --cache-ttl`): a client uses a
/// cached key → register location for at most this long after the index vouched for
/// it, then asks the index again. A freshness bound only: recycling does not wait for
/// it, since a cached location carries its register's life and an operation through
/// it detects a recycled register (`crate::cache`, `crate::registers::recycle`).
pub const DEFAULT_CACHE_TTL_NS: u64 = 10_000_000_000;
/// Largest delivery margin a superblock may carry (`swarm init --delivery-margin`):
/// every recycling grace includes it, so a larger one would hold memory for minutes.
pub const MAX_DELIVERY_MARGIN_NS: u64 = 60_000_000_000;

/// Bytes a writer's summary takes beyond its bitmap, at most: the header and the
/// padding to 64 bytes (see [`NodeLayout::summary_bytes`]).
const SUMMARY_SLACK: u64 = (SUMMARY_HEADER_BYTES as u64) + 8 + 64;

const fn align(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Why cluster parameters or a superblock were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// A parameter is out of its range.
    #[error("invalid cluster parameter: {0}")]
    Invalid(String),
    /// The node is too small for even a minimal store.
    #[error(
        "{node_bytes} B per node is too small: at least {needed} B are needed for these parameters"
    )]
    TooSmall {
        /// Bytes per node offered.
        node_bytes: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The register geometry is invalid.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The superblock is not a SWARM-KV superblock (never initialised, or another tool's).
    #[error("no SWARM-KV superblock on this cluster (bad magic): run `swarm init` first")]
    NotInitialized,
    /// The superblock was written by another format version.
    #[error(
        "SWARM-KV superblock version {0} is not supported (this build reads versions 1 to {KV_VERSION}): use a matching `swarm` build"
    )]
    Version(u32),
    /// The superblock's checksum does not match: it is corrupted.
    #[error("SWARM-KV superblock is corrupted (checksum mismatch)")]
    Checksum,
    /// Nodes disagree on the parameters.
    #[error("memory nodes disagree on the SWARM-KV parameters: the cluster is inconsistent")]
    Disagree,
}

/// The parameters of a SWARM-KV cluster, identical on every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterParams {
    /// Longest key, bytes.
    pub key_max: u32,
    /// Largest value, bytes.
    pub value_max: u32,
    /// Metadata words per register (`W`, SWARM §4.4).
    pub meta_words: u16,
    /// Writer ids (client threads) the cluster has logs and client-table rows for.
    pub writers: u16,
    /// Replicas per key (`2f + 1`, at most the node count).
    pub replicas: u16,
    /// Register slots (key capacity).
    pub registers: u64,
    /// Registers per allocation chunk.
    pub chunk_registers: u32,
    /// Memory nodes the registers are placed over in replica groups (superblock
    /// version 8 and later, [`NodeLayout::placement`]): each band of a node's
    /// register area is shared by `placement_nodes / replicas` groups of `replicas`
    /// disjoint nodes, so [`Self::registers`] counts registers of the whole
    /// cluster. Must be the cluster's node count. `0`: the layout of earlier
    /// versions, where every node has a slot for every register and a register's
    /// replicas are consecutive nodes from a hash of its id.
    pub placement_nodes: u16,
    /// The *metadata group* (superblock version 9): the index, the client table,
    /// the repair journal, the chunk table, the configuration and the repair lock
    /// live on nodes `0..metadata_nodes` only, and every round that reaches "all
    /// nodes" for them reaches these (at most [`swarm_core::MAX_NODES`], what one
    /// roundtrip posts to). The other nodes hold their node header, superblock
    /// and register bands (their metadata areas are reserved, never used).
    /// Needs replica groups, at least [`Self::replicas`] nodes and at most
    /// [`Self::placement_nodes`]. `0`: every node (every version before 9).
    pub metadata_nodes: u16,
    /// Index buckets (a power of two).
    pub index_buckets: u64,
    /// Out-of-place log slots per writer.
    pub log_slots: u32,
    /// Lease duration, ns: a client whose renewals stop is presumed dead (and its
    /// writer id reclaimable) this long after its last renewal, plus the clock-drift
    /// allowance and the reclamation grace (see `crate::membership::lease`).
    pub lease_ns: u64,
    /// Lease renewal period, ns (less than half the lease).
    pub lease_renew_ns: u64,
    /// Operation deadline, ns: an operation never posts a batch later than this after
    /// it started, so that memory it may reference can be recycled after a grace
    /// derived from it. Cluster-wide, since recyclers wait for every client's.
    pub max_op_ns: u64,
    /// Location-cache entry lifetime, ns: how long a client may use a cached key
    /// location after the index vouched for it. A freshness bound, not part of any
    /// recycling grace: an entry carries its register's life, and an operation
    /// through an entry whose register was recycled since detects it and asks the
    /// index (`crate::cache`).
    pub cache_ttl_ns: u64,
    /// Delivery margin, ns: how long after its post a batch may still take effect on a
    /// memory node (the transport's worst case: on RDMA the queue pair's retry window,
    /// `ack timeout × (retry count + 1)`, plus scheduling). Recycled memory waits
    /// this on top of the operation deadline (`swarm_core::slot_recycling`). Cluster-wide: a
    /// writer recycles its log slots on the margin of every client that may write
    /// them back, so a client whose transport can deliver later refuses to connect.
    pub delivery_margin_ns: u64,
    /// Whether each writer has a log-summary area after the logs (clusters made
    /// before superblock version 3 have none): a client that stops cleanly leaves
    /// its summary there, and the next client of its writer id resumes the log from
    /// it instead of scanning the whole log (`crate::membership::writer_ids`).
    pub log_summaries: bool,
    /// Whether every client persists a tick ceiling in its client-table row
    /// (superblock version 4 and later): a client that takes over the writer id of
    /// a crashed one then resumes its log lazily, starting above the ceiling,
    /// instead of reading the whole log first (`crate::membership::writer_ids`).
    pub tick_ceilings: bool,
    /// Whether the layout has a repair journal (superblock version 5 and later):
    /// while a repair rebuilds a node, clients reset recycled registers without it
    /// and have the repair bring the rebuilt copy along through the journal
    /// (`crate::registers::journal`); without the journal, resets wait for the admission.
    pub repair_journal: bool,
    /// Whether every client checks cached locations by their register's life
    /// (superblock version 7 and later): a retired register then waits one operation
    /// deadline before its reset, not the location cache's lifetime as well
    /// ([`ClusterParams::register_grace_ns`]). Clusters made before have clients
    /// whose stale cached locations only the cache lifetime keeps out of a reused
    /// register.
    pub cached_lives: bool,
    /// Whether the metadata group holds a placement table (superblock version 10,
    /// `crate::placement`): one record per chunk, after the chunk table, saying on
    /// which nodes and in which slots of their register areas the chunk lives when
    /// that is not its computed place ([`NodeLayout::placement`]). Needs replica
    /// groups. Clusters without one place every chunk where it is computed.
    pub placement_table: bool,
    /// The node count the cluster keeps room to grow to by `swarm add-node`
    /// (superblock version 11): the chunk table, the placement table and the index
    /// have room for the *reserve chunks* ([`NodeLayout::reserve_chunks`]) that
    /// many nodes hold beyond the computed ones. Reserve chunks have no computed
    /// place: one exists only through a placement record (`crate::placement`).
    /// Needs a placement table; at least [`Self::placement_nodes`], at most
    /// [`swarm_core::MAX_CLUSTER_NODES`]. `0`: no reserve (every version before 11).
    pub max_nodes: u16,
}

/// Defaults for `swarm init`.
impl Default for ClusterParams {
    fn default() -> Self {
        Self {
            key_max: 128,
            value_max: 1024,
            meta_words: 8,
            writers: 64,
            replicas: 3,
            registers: 1 << 16,
            chunk_registers: 256,
            placement_nodes: 0,
            metadata_nodes: 0,
            index_buckets: 1 << 14,
            log_slots: 1 << 14,
            lease_ns: DEFAULT_LEASE_NS,
            lease_renew_ns: DEFAULT_LEASE_RENEW_NS,
            max_op_ns: DEFAULT_MAX_OP_NS,
            cache_ttl_ns: DEFAULT_CACHE_TTL_NS,
            delivery_margin_ns: swarm_core::slot_recycling::DEFAULT_DELIVERY_MARGIN_NS,
            log_summaries: true,
            tick_ceilings: true,
            repair_journal: true,
            cached_lives: true,
            placement_table: false,
            max_nodes: 0,
        }
    }
}

impl ClusterParams {
    /// How long a retired register waits before it is reset and reused: the
    /// reclamation grace of one operation deadline, with this cluster's delivery
    /// margin (`swarm_core::slot_recycling::grace_with_margin_ns`): every operation
    /// that found the register through the index before it was unmapped has stopped
    /// posting by then. Cached locations need no wait: they carry the register's life
    /// (`crate::registers::recycle`, "When: the grace").
    /// On a cluster made before version 7 ([`Self::cached_lives`] unset), whose
    /// older clients rely on it, the window also holds the cache lifetime.
    pub fn register_grace_ns(&self) -> u64 {
        let window = if self.cached_lives {
            self.max_op_ns
        } else {
            self.cache_ttl_ns.saturating_add(self.max_op_ns)
        };
        swarm_core::slot_recycling::grace_with_margin_ns(window, self.delivery_margin_ns)
    }

    /// How long a superseded out-of-place log slot waits before its writer reuses it
    /// (`swarm_core::slot_recycling`): the operation deadline, its drift allowance and the
    /// delivery margin.
    pub fn slot_grace_ns(&self) -> u64 {
        swarm_core::slot_recycling::grace_with_margin_ns(self.max_op_ns, self.delivery_margin_ns)
    }

    /// Bytes of a register's payload: `[key length u16 | key | value]`.
    pub fn payload_max(&self) -> u32 {
        2 + self.key_max + self.value_max
    }

    /// Bytes of a key header: length, reserved, key, padded to 8.
    pub fn key_header_bytes(&self) -> u64 {
        align(8 + u64::from(self.key_max), 8)
    }

    /// Replica groups per band of the register area: `placement_nodes / replicas`,
    /// or 1 without replica groups.
    pub fn groups(&self) -> u64 {
        if self.placement_nodes == 0 {
            1
        } else {
            (u64::from(self.placement_nodes) / u64::from(self.replicas.max(1))).max(1)
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamsError> {
        let bad = |what: &str| Err(ParamsError::Invalid(what.to_string()));
        if self.key_max == 0 || self.key_max > 4096 {
            return bad("the key limit must be 1 B to 4 KiB");
        }
        if self.value_max == 0 || self.value_max > 1 << 20 {
            return bad("the value limit must be 1 B to 1 MiB");
        }
        if self.writers == 0 || self.writers > MAX_WRITERS {
            return bad("writers must be 1 to 2047");
        }
        if self.replicas == 0 || self.replicas.is_multiple_of(2) || self.replicas > 15 {
            return bad("replicas must be odd, 1 to 15 (2f+1)");
        }
        if self.registers == 0 || self.chunk_registers == 0 || self.log_slots == 0 {
            return bad("registers, chunk size and log slots must be positive");
        }
        if !self.index_buckets.is_power_of_two() {
            return bad("index buckets must be a power of two");
        }
        if self.placement_nodes != 0 && self.placement_nodes < self.replicas {
            return bad("the register placement needs at least as many nodes as replicas");
        }
        if usize::from(self.placement_nodes) > swarm_core::MAX_CLUSTER_NODES {
            return bad("a cluster has at most 64 memory nodes");
        }
        if self.metadata_nodes != 0
            && (self.placement_nodes == 0
                || self.metadata_nodes < self.replicas
                || self.metadata_nodes > self.placement_nodes
                || usize::from(self.metadata_nodes) > swarm_core::MAX_NODES)
        {
            return bad(
                "the metadata group needs replica groups, at least as many nodes as replicas, \
                 at most the cluster's nodes and at most 16",
            );
        }
        if self.placement_table && self.placement_nodes == 0 {
            return bad("a placement table needs replica groups");
        }
        if self.max_nodes != 0
            && (!self.placement_table
                || self.max_nodes < self.placement_nodes
                || usize::from(self.max_nodes) > swarm_core::MAX_CLUSTER_NODES)
        {
            return bad(
                "room to grow (--max-nodes) needs a placement table, and at least the \
                 cluster's nodes and at most 64",
            );
        }
        if self.metadata_nodes == 0 && usize::from(self.placement_nodes) > swarm_core::MAX_NODES {
            return bad("a cluster of more than 16 nodes needs a metadata group of at most 16");
        }
        crate::membership::lease::LeaseParams::from_params(self)
            .validate()
            .map_err(|e| ParamsError::Invalid(e.to_string()))?;
        if self.cache_ttl_ns == 0 {
            return bad("the location-cache lifetime (--cache-ttl) must be positive");
        }
        if self.delivery_margin_ns == 0 || self.delivery_margin_ns > MAX_DELIVERY_MARGIN_NS {
            return bad("the delivery margin (--delivery-margin) must be positive and at most 60s");
        }
        Ok(())
    }

    /// Picks capacities that fill `node_bytes`: about a third of the free space for
    /// registers (and their index), the rest for the writers' logs. With replica
    /// groups ([`Self::placement_nodes`]) each row of a node's register area holds
    /// [`Self::groups`] registers of the cluster, and the index, on every node, has
    /// room for all of them.
    pub fn for_node_size(self, node_bytes: u64) -> Result<Self, ParamsError> {
        match self.sized(node_bytes, false) {
            // Many groups (a cluster of tens of nodes with small values): their index
            // buckets leave the logs too little; size with every group's bucket in
            // each row's cost instead.
            Err(ParamsError::TooSmall { .. }) if self.groups() > 2 => self.sized(node_bytes, true),
            sized => sized,
        }
    }

    /// [`Self::for_node_size`], each row of the register area costing one index
    /// bucket, or (`every_bucket`) one per group.
    fn sized(mut self, node_bytes: u64, every_bucket: bool) -> Result<Self, ParamsError> {
        self.registers = 1;
        self.log_slots = 1;
        self.index_buckets = 1;
        self.validate()?;
        // What every layout needs besides its registers: measured with one register
        // slot, not the whole band a replica-group layout gives even one register.
        let fixed = NodeLayout::new(Self {
            placement_nodes: 0,
            metadata_nodes: 0,
            placement_table: false,
            max_nodes: 0,
            ..self
        })?
        .end();
        let free = node_bytes.checked_sub(fixed).ok_or(ParamsError::TooSmall {
            node_bytes,
            needed: fixed,
        })?;
        let swarm = NodeLayout::new(self)?.swarm;
        let groups = self.groups();
        // Per row of the register area: one slot and one index bucket. With replica
        // groups a row holds `groups` registers of the cluster and the index (on
        // every node) `groups` buckets for them: the buckets beyond the first come
        // out of the logs' share below, so that registers, the memory that grows
        // with the cluster, keep their third (the groups' 8-byte shifts, per band,
        // are negligible: `NodeLayout::band_bytes`).
        // Room to grow (`max_nodes`): a row holds up to `max_nodes / r` registers
        // then, and its buckets beyond the first come out of the logs' share too.
        let grown = groups.max(u64::from(self.max_nodes) / u64::from(self.replicas.max(1)));
        let buckets = if every_bucket { grown } else { 1 };
        let register_cost =
            self.key_header_bytes() + swarm.register_bytes() + buckets * BUCKET_BYTES;
        let rows = (free / 3) / register_cost;
        let chunks = rows / u64::from(self.chunk_registers) * groups;
        if chunks == 0 {
            return Err(ParamsError::TooSmall {
                node_bytes,
                needed: fixed + 3 * register_cost * u64::from(self.chunk_registers),
            });
        }
        self.registers = chunks * u64::from(self.chunk_registers);
        // One bucket per register or more (the budget above counts one each), rounded
        // up to a power of two. RACE-style two-choice placement over 7-slot buckets
        // would keep the fullest bucket below 7 at 100% fill with half as many; the
        // rest keeps first buckets unused longer, and an insert into a never-used
        // first bucket takes one roundtrip (`crate::index`, "One-roundtrip inserts").
        // Reserve chunks (`max_nodes`) get their buckets too: the index does not grow.
        self.index_buckets = NodeLayout::new(self)?
            .register_ids()
            .next_power_of_two()
            .max(2);
        let used = NodeLayout::new(self)?.end();
        let left = node_bytes.saturating_sub(used + AREA_ALIGN);
        // Each writer's log, and its summary (one bit per slot, a header, padding).
        let per_writer = (left / u64::from(self.writers)).saturating_sub(if self.log_summaries {
            SUMMARY_SLACK
        } else {
            0
        });
        let bits_per_slot = 8 * swarm.slot_bytes() + u64::from(self.log_summaries);
        self.log_slots = (8 * per_writer / bits_per_slot).min(u64::from(u32::MAX)) as u32;
        if self.log_slots < 16 {
            return Err(ParamsError::TooSmall {
                node_bytes,
                needed: used + 16 * u64::from(self.writers) * swarm.slot_bytes(),
            });
        }
        self.validate()?;
        Ok(self)
    }

    /// Encodes the superblock (version `KV_VERSION`): the version-1 fields at the
    /// same offsets, then `lease_ns` at 56, `lease_renew_ns` at 64, `max_op_ns` at 72,
    /// `cache_ttl_ns` at 80, `delivery_margin_ns` at 88, the flags word at 96
    /// (`FLAG_LOG_SUMMARIES`), and an xxh3-64 of bytes `0..120` at 120.
    pub fn encode(&self) -> [u8; SUPERBLOCK_ENCODED_BYTES] {
        let mut out = [0u8; SUPERBLOCK_ENCODED_BYTES];
        out[0..8].copy_from_slice(&KV_MAGIC);
        // Version 10 only with a placement table, 9 only with a metadata group:
        // other clusters stay readable by the builds of the version before.
        let version: u32 = if self.max_nodes != 0 {
            11
        } else if self.placement_table {
            10
        } else if self.metadata_nodes != 0 {
            9
        } else {
            8
        };
        out[8..12].copy_from_slice(&version.to_le_bytes());
        out[12..16].copy_from_slice(&self.key_max.to_le_bytes());
        out[16..20].copy_from_slice(&self.value_max.to_le_bytes());
        out[20..22].copy_from_slice(&self.meta_words.to_le_bytes());
        out[22..24].copy_from_slice(&self.writers.to_le_bytes());
        out[24..26].copy_from_slice(&self.replicas.to_le_bytes());
        out[26..28].copy_from_slice(&self.placement_nodes.to_le_bytes());
        out[28..32].copy_from_slice(&self.chunk_registers.to_le_bytes());
        out[32..40].copy_from_slice(&self.registers.to_le_bytes());
        out[40..48].copy_from_slice(&self.index_buckets.to_le_bytes());
        out[48..52].copy_from_slice(&self.log_slots.to_le_bytes());
        out[52..54].copy_from_slice(&self.metadata_nodes.to_le_bytes());
        out[54..56].copy_from_slice(&self.max_nodes.to_le_bytes());
        out[56..64].copy_from_slice(&self.lease_ns.to_le_bytes());
        out[64..72].copy_from_slice(&self.lease_renew_ns.to_le_bytes());
        out[72..80].copy_from_slice(&self.max_op_ns.to_le_bytes());
        out[80..88].copy_from_slice(&self.cache_ttl_ns.to_le_bytes());
        out[88..96].copy_from_slice(&self.delivery_margin_ns.to_le_bytes());
        let flags = if self.log_summaries {
            FLAG_LOG_SUMMARIES
        } else {
            0
        } | if self.tick_ceilings {
            FLAG_TICK_CEILINGS
        } else {
            0
        } | if self.repair_journal {
            FLAG_REPAIR_JOURNAL
        } else {
            0
        } | if self.cached_lives {
            FLAG_CACHED_LIVES
        } else {
            0
        } | if self.placement_nodes != 0 {
            FLAG_REPLICA_GROUPS
        } else {
            0
        } | if self.metadata_nodes != 0 {
            FLAG_METADATA_GROUP
        } else {
            0
        } | if self.placement_table {
            FLAG_PLACEMENT_TABLE
        } else {
            0
        } | if self.max_nodes != 0 {
            FLAG_RESERVE_CHUNKS
        } else {
            0
        };
        out[96..104].copy_from_slice(&flags.to_le_bytes());
        let sum = xxh3_64(&out[..120]);
        out[120..128].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes and validates a superblock read from untrusted memory (versions 1 and
    /// 2; a version-1 superblock gets the default lease parameters and deadline).
    pub fn decode(bytes: &[u8]) -> Result<Self, ParamsError> {
        if bytes.get(0..8) != Some(&KV_MAGIC[..]) {
            return Err(ParamsError::NotInitialized);
        }
        let version = bytes
            .get(8..12)
            .map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]))
            .ok_or(ParamsError::NotInitialized)?;
        let encoded = match version {
            1 => 64,
            2..=KV_VERSION => SUPERBLOCK_ENCODED_BYTES,
            other => return Err(ParamsError::Version(other)),
        };
        let bytes: &[u8; SUPERBLOCK_ENCODED_BYTES] = &{
            let mut padded = [0u8; SUPERBLOCK_ENCODED_BYTES];
            padded[..encoded]
                .copy_from_slice(bytes.get(..encoded).ok_or(ParamsError::NotInitialized)?);
            padded
        };
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if u64_at(encoded - 8) != xxh3_64(&bytes[..encoded - 8]) {
            return Err(ParamsError::Checksum);
        }
        let (lease_ns, lease_renew_ns, max_op_ns, cache_ttl_ns, delivery_margin_ns) =
            if version == 1 {
                (
                    DEFAULT_LEASE_NS,
                    DEFAULT_LEASE_RENEW_NS,
                    DEFAULT_MAX_OP_NS,
                    DEFAULT_CACHE_TTL_NS,
                    swarm_core::slot_recycling::DEFAULT_DELIVERY_MARGIN_NS,
                )
            } else {
                (u64_at(56), u64_at(64), u64_at(72), u64_at(80), u64_at(88))
            };
        // Flags a later version may add are refused by the version check above.
        let log_summaries = version >= 3 && u64_at(96) & FLAG_LOG_SUMMARIES != 0;
        let tick_ceilings = version >= 4 && u64_at(96) & FLAG_TICK_CEILINGS != 0;
        let repair_journal = version >= 5 && u64_at(96) & FLAG_REPAIR_JOURNAL != 0;
        let cached_lives = version >= 7 && u64_at(96) & FLAG_CACHED_LIVES != 0;
        let grouped = version >= 8 && u64_at(96) & FLAG_REPLICA_GROUPS != 0;
        let placement_nodes = if grouped { u16_at(26) } else { 0 };
        let metadata_group = version >= 9 && u64_at(96) & FLAG_METADATA_GROUP != 0;
        let metadata_nodes = if metadata_group { u16_at(52) } else { 0 };
        let placement_table = version >= 10 && u64_at(96) & FLAG_PLACEMENT_TABLE != 0;
        let reserve = version >= 11 && u64_at(96) & FLAG_RESERVE_CHUNKS != 0;
        let max_nodes = if reserve { u16_at(54) } else { 0 };
        if reserve && max_nodes == 0 {
            return Err(ParamsError::Invalid(
                "room to grow to 0 nodes in the superblock".into(),
            ));
        }
        if metadata_group && metadata_nodes == 0 {
            return Err(ParamsError::Invalid(
                "a metadata group of 0 nodes in the superblock".into(),
            ));
        }
        if grouped && placement_nodes == 0 {
            return Err(ParamsError::Invalid(
                "replica groups over 0 nodes in the superblock".into(),
            ));
        }
        let params = Self {
            key_max: u32_at(12),
            value_max: u32_at(16),
            meta_words: u16_at(20),
            writers: u16_at(22),
            replicas: u16_at(24),
            chunk_registers: u32_at(28),
            placement_nodes,
            metadata_nodes,
            registers: u64_at(32),
            index_buckets: u64_at(40),
            log_slots: u32_at(48),
            lease_ns,
            lease_renew_ns,
            max_op_ns,
            cache_ttl_ns,
            delivery_margin_ns,
            log_summaries,
            tick_ceilings,
            repair_journal,
            cached_lives,
            placement_table,
            max_nodes,
        };
        params.validate()?;
        Ok(params)
    }
}

/// Byte offsets of every area of a node, derived from [`ClusterParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    /// The parameters.
    pub params: ClusterParams,
    /// First client-table row.
    pub clients_at: u64,
    /// First writer's repair-journal row, if the cluster has the journal
    /// ([`ClusterParams::repair_journal`]).
    pub journal_at: Option<u64>,
    /// First chunk-claim word.
    pub chunks_at: u64,
    /// First placement record, if the cluster has the table
    /// ([`ClusterParams::placement_table`]; `crate::placement`).
    pub placements_at: Option<u64>,
    /// First index bucket.
    pub index_at: u64,
    /// First register slot.
    pub registers_at: u64,
    /// Bytes of one register slot (key header + register).
    pub register_slot_bytes: u64,
    /// Bytes of one band of the register area with replica groups: a chunk's slots,
    /// and 8 bytes of shift per group but the first ([`Self::placement`]); with
    /// one group (no replica groups), a chunk's slots.
    pub band_bytes: u64,
    /// The SWARM register and log geometry (logs start after the registers).
    pub swarm: Layout,
    /// First writer's log summary, if the cluster has the area
    /// ([`ClusterParams::log_summaries`]).
    pub summaries_at: Option<u64>,
    /// Reserve chunks ([`Self::reserve_chunks`]).
    reserve: u64,
}

impl NodeLayout {
    /// The layout for `params`.
    pub fn new(params: ClusterParams) -> Result<Self, ParamsError> {
        params.validate()?;
        let clients_at = SUPERBLOCK_AT + SUPERBLOCK_BYTES;
        let clients_end = clients_at + u64::from(params.writers) * CLIENT_ROW_BYTES;
        let journal_at = params
            .repair_journal
            .then(|| align(clients_end, AREA_ALIGN));
        let journal_end = journal_at.map_or(clients_end, |at| {
            at + u64::from(params.writers) * crate::registers::journal::ROW_BYTES
        });
        let chunks_at = align(journal_end, AREA_ALIGN);
        let computed = params.registers.div_ceil(u64::from(params.chunk_registers));
        let reserve = reserve_chunks(&params, computed);
        let chunks = computed + reserve;
        let chunks_end = chunks_at + 8 * chunks;
        let placements_at = params
            .placement_table
            .then(|| align(chunks_end, AREA_ALIGN));
        let placements_end = placements_at.map_or(chunks_end, |at| {
            at + chunks * crate::placement::RECORD_BYTES as u64
        });
        let index_at = align(placements_end, AREA_ALIGN);
        let registers_at = align(index_at + params.index_buckets * BUCKET_BYTES, AREA_ALIGN);
        let probe = Layout::builder()
            .payload_max(params.payload_max())
            .meta_words(params.meta_words)
            .log_base(0)
            .writers(params.writers)
            .slots_per_writer(params.log_slots)
            .build()?;
        let register_slot_bytes = params.key_header_bytes() + probe.register_bytes();
        let groups = params.groups();
        if (groups - 1) * 8 >= register_slot_bytes {
            return Err(ParamsError::Invalid(format!(
                "{groups} replica groups need register slots of more than {} B (these are {register_slot_bytes} B)",
                (groups - 1) * 8
            )));
        }
        let band_bytes = u64::from(params.chunk_registers)
            .checked_mul(register_slot_bytes)
            .and_then(|b| b.checked_add((groups - 1) * 8))
            .ok_or(ParamsError::Invalid("too many registers".into()))?;
        let registers_bytes = if params.placement_nodes == 0 {
            params.registers.checked_mul(register_slot_bytes)
        } else {
            computed.div_ceil(groups).checked_mul(band_bytes)
        }
        .ok_or(ParamsError::Invalid("too many registers".into()))?;
        let logs_at = align(registers_at + registers_bytes, AREA_ALIGN);
        let swarm = Layout::builder()
            .payload_max(params.payload_max())
            .meta_words(params.meta_words)
            .log_base(logs_at)
            .writers(params.writers)
            .slots_per_writer(params.log_slots)
            .write_back_guards(
                clients_at + crate::membership::writer_ids::WRITE_BACK_GUARD,
                CLIENT_ROW_BYTES,
            )
            .build()?;
        let summaries_at = params
            .log_summaries
            .then(|| align(swarm.log_base() + swarm.log_bytes(), 64));
        let layout = Self {
            params,
            clients_at,
            journal_at,
            chunks_at,
            placements_at,
            index_at,
            registers_at,
            register_slot_bytes,
            band_bytes,
            swarm,
            summaries_at,
            reserve,
        };
        let last = layout.register_ids().saturating_sub(1);
        if reserve > 0 && layout.identity(last).is_none_or(|id| id >= MAX_IDENTITY) {
            return Err(ParamsError::Invalid(format!(
                "room to grow to {} nodes names registers beyond 32 GiB: give --max-nodes a smaller count",
                params.max_nodes
            )));
        }
        Ok(layout)
    }

    /// Where register `register` lives, if it exists: the address of its key header
    /// (the same on each of its replicas) and the first node of its replica group,
    /// `None` without replica groups ([`ClusterParams::placement_nodes`] = 0: every
    /// node has a slot for every register).
    ///
    /// With replica groups, chunk `c` (of `chunk_registers` registers) is group
    /// `j = c mod g` of band `b = c / g`, `g` = [`ClusterParams::groups`]. Band `b`
    /// takes [`Self::band_bytes`] of every node; its groups are `g` runs of `r`
    /// consecutive nodes (modulo `n`) starting at node `b·g·r mod n`, so that when
    /// `r` does not divide `n` the nodes left over in one band are used in the next
    /// ones. Register `o` of the chunk is at `band start + 8·j + o·slot` on each of
    /// its group's nodes: groups sharing a band sit on disjoint nodes, and the
    /// 8-byte shift keeps one address per register across the cluster, so a log
    /// record's owner tag (an address) still names one register.
    pub fn placement(&self, register: u64) -> Option<(u64, Option<usize>)> {
        let p = &self.params;
        if register >= p.registers {
            return None;
        }
        if p.placement_nodes == 0 {
            return Some((
                self.registers_at + register * self.register_slot_bytes,
                None,
            ));
        }
        let per = u64::from(p.chunk_registers);
        let g = p.groups();
        let (chunk, o) = (register / per, register % per);
        let (band, j) = (chunk / g, chunk % g);
        let at = self.registers_at + band * self.band_bytes + 8 * j + o * self.register_slot_bytes;
        let n = u64::from(p.placement_nodes);
        let r = u64::from(p.replicas);
        let first = ((band % n) * g * r + j * r) % n;
        Some((at, Some(first as usize)))
    }

    /// The register whose SWARM register starts at `addr` (an address read from a
    /// log record: untrusted), if any: the inverse of [`Self::register`].
    pub fn register_at(&self, addr: u64) -> Option<u64> {
        let offset = addr
            .checked_sub(self.registers_at)?
            .checked_sub(self.params.key_header_bytes())?;
        let register = if self.params.placement_nodes == 0 {
            (offset % self.register_slot_bytes == 0).then_some(offset / self.register_slot_bytes)?
        } else {
            let (band, within) = (offset / self.band_bytes, offset % self.band_bytes);
            let (o, shift) = (
                within / self.register_slot_bytes,
                within % self.register_slot_bytes,
            );
            let g = self.params.groups();
            let per = u64::from(self.params.chunk_registers);
            if shift % 8 != 0 || shift / 8 >= g || o >= per {
                return None;
            }
            band.checked_mul(g)?
                .checked_add(shift / 8)?
                .checked_mul(per)?
                .checked_add(o)?
        };
        (self.identity(register) == Some(addr)).then_some(register)
    }

    /// The nodes of the metadata group in a cluster of `nodes` nodes: nodes
    /// `0..` this ([`ClusterParams::metadata_nodes`]; without one, the nodes the
    /// cluster was created with, [`ClusterParams::placement_nodes`], or every node
    /// before replica groups). Fixed for the cluster's life: a node added later
    /// (`crate::placement::add_node`) holds registers only, so every client and tool
    /// counts majorities of the same metadata nodes however many it has mapped.
    pub fn metadata_nodes(&self, nodes: usize) -> usize {
        match (self.params.metadata_nodes, self.params.placement_nodes) {
            (0, 0) => nodes,
            (0, m) | (m, _) => usize::from(m).min(nodes),
        }
    }

    /// Whether node `node` holds the metadata areas (index, client table, journal,
    /// chunk table, configuration) in a cluster of `nodes` nodes.
    pub fn holds_metadata(&self, node: usize, nodes: usize) -> bool {
        node < self.metadata_nodes(nodes)
    }

    /// Whether node `node` holds chunk `chunk`'s registers: always without replica
    /// groups, else when it is in the chunk's group ([`Self::placement`]).
    pub fn chunk_on(&self, chunk: u64, node: usize) -> bool {
        if self.params.placement_nodes == 0 {
            return true;
        }
        let g = self.params.groups();
        self.group_of(node, chunk / g) == Some(chunk % g)
    }

    /// Bytes of a node's register area.
    pub fn register_area_bytes(&self) -> u64 {
        if self.params.placement_nodes == 0 {
            self.params.registers * self.register_slot_bytes
        } else {
            self.bands() * self.band_bytes
        }
    }

    /// Bands of the register area with replica groups (see [`Self::placement`]).
    pub fn bands(&self) -> u64 {
        self.computed_chunks().div_ceil(self.params.groups())
    }

    /// The group of band `band` that node `node` belongs to, if any (see
    /// [`Self::placement`]; `None` also without replica groups).
    pub fn group_of(&self, node: usize, band: u64) -> Option<u64> {
        let n = u64::from(self.params.placement_nodes);
        if n == 0 || node as u64 >= n {
            return None;
        }
        let g = self.params.groups();
        let r = u64::from(self.params.replicas);
        let start = ((band % n) * g * r) % n;
        let j = (node as u64 + n - start) % n / r;
        (j < g).then_some(j)
    }

    /// First byte past the last area: the node size this layout needs.
    pub fn end(&self) -> u64 {
        match self.summaries_at {
            Some(at) => at + u64::from(self.params.writers) * self.summary_bytes(),
            None => self.swarm.log_base() + self.swarm.log_bytes(),
        }
    }

    /// Bytes of one writer's log-summary area (an encoded
    /// [`swarm_core::summary::LogSummary`] of its log, padded to 64).
    pub fn summary_bytes(&self) -> u64 {
        align(LogSummary::encoded_len(self.params.log_slots) as u64, 64)
    }

    /// Address of writer `writer`'s log summary, if the cluster has summaries and the
    /// writer exists.
    pub fn summary(&self, writer: u16) -> Option<u64> {
        let at = self.summaries_at?;
        (writer < self.params.writers).then(|| at + u64::from(writer) * self.summary_bytes())
    }

    /// Number of register chunks: the computed ones, then the reserve ones (the
    /// chunk table's and the placement table's length).
    pub fn chunks(&self) -> u64 {
        self.computed_chunks() + self.reserve
    }

    /// Chunks with a computed place ([`Self::placement`]): `0..` this, holding
    /// registers `0..registers`.
    pub fn computed_chunks(&self) -> u64 {
        self.params
            .registers
            .div_ceil(u64::from(self.params.chunk_registers))
    }

    /// *Reserve chunks*: chunks `computed_chunks()..chunks()`, for growth to
    /// [`ClusterParams::max_nodes`] nodes. One has no computed place and no memory
    /// of its own: it exists only once a placement record puts it in free slots
    /// (`crate::placement`, recorded by add-node), and no client claims it before
    /// it follows that record (`crate::registers::alloc`). As many as `max_nodes`
    /// nodes of [`Self::slots`] slots hold beyond the computed chunks.
    pub fn reserve_chunks(&self) -> u64 {
        self.reserve
    }

    /// Whether chunk `chunk` is a reserve chunk ([`Self::reserve_chunks`]).
    pub fn is_reserve(&self, chunk: u64) -> bool {
        chunk >= self.computed_chunks()
    }

    /// Register ids of the cluster: `0..` this. The computed registers
    /// (`0..registers`), then, with reserve chunks, `chunk_registers` ids per
    /// reserve chunk from the first id past the last computed chunk. Every register
    /// id a client hands out, an index slot or a journal entry names is below it.
    pub fn register_ids(&self) -> u64 {
        if self.reserve == 0 {
            self.params.registers
        } else {
            self.chunks() * u64::from(self.params.chunk_registers)
        }
    }

    /// The register ids of chunk `chunk` (empty if it does not exist).
    pub fn chunk_register_ids(&self, chunk: u64) -> std::ops::Range<u64> {
        let per = u64::from(self.params.chunk_registers);
        let first = chunk.saturating_mul(per);
        let end = if self.is_reserve(chunk) {
            first.saturating_add(per).min(self.register_ids())
        } else {
            first.saturating_add(per).min(self.params.registers)
        };
        first..end.max(first)
    }

    /// The identity of register `register` ([`swarm_core::RegisterLoc::id`]: log
    /// records' owner tags, slot trackers), wherever a placement record puts it:
    /// its computed address ([`Self::register`]); for a reserve register, the
    /// address the same formula gives past the register area (bands beyond
    /// [`Self::bands`]), never memory anybody accesses there, so that identities
    /// stay unique, multiples of 8 and inverted by [`Self::register_at`].
    pub fn identity(&self, register: u64) -> Option<u64> {
        if register < self.params.registers {
            return self.register(register);
        }
        if register >= self.register_ids() {
            return None;
        }
        let per = u64::from(self.params.chunk_registers);
        let g = self.params.groups();
        let (chunk, o) = (register / per, register % per);
        let (band, j) = (chunk / g, chunk % g);
        Some(
            self.registers_at
                + band * self.band_bytes
                + 8 * j
                + o * self.register_slot_bytes
                + self.params.key_header_bytes(),
        )
    }

    /// Keys the cluster holds at most, once it grew to
    /// [`ClusterParams::max_nodes`] nodes: every register id.
    pub fn capacity_max(&self) -> u64 {
        if self.reserve == 0 {
            self.params.registers
        } else {
            self.params.registers + self.reserve * u64::from(self.params.chunk_registers)
        }
    }

    /// Address of the claim word of chunk `chunk`.
    pub fn chunk_word(&self, chunk: u64) -> u64 {
        self.chunks_at + 8 * chunk
    }

    /// Address of chunk `chunk`'s placement record, if the cluster has the table and
    /// the chunk exists (`crate::placement`).
    pub fn placement_record(&self, chunk: u64) -> Option<u64> {
        let at = self.placements_at?;
        (chunk < self.chunks()).then(|| at + chunk * crate::placement::RECORD_BYTES as u64)
    }

    /// Slots of a node's register area: chunk-sized areas a placement record
    /// names (`crate::placement`). Slot `s` is band `s` of [`Self::placement`] on
    /// the node, so a recorded chunk in slot `s` overlaps exactly the chunk its
    /// computed placement puts in that band on that node, if any.
    pub fn slots(&self) -> u64 {
        self.bands()
    }

    /// Where the key header of register `o` of a chunk recorded in slot `slot`
    /// starts on the nodes that record names, if both exist.
    pub fn slot_key_header(&self, slot: u64, o: u64) -> Option<u64> {
        (slot < self.slots() && o < u64::from(self.params.chunk_registers))
            .then(|| self.registers_at + slot * self.band_bytes + o * self.register_slot_bytes)
    }

    /// Where the key header of the register `loc` locates starts on `node`, if
    /// `node` is one of its replicas: its offset there, less the key header.
    pub fn header_on(
        &self,
        loc: &swarm_core::RegisterLoc,
        node: swarm_core::NodeId,
    ) -> Option<u64> {
        loc.offset_on(node)?
            .checked_sub(self.params.key_header_bytes())
    }

    /// Address of client-table row `writer`.
    pub fn client_row(&self, writer: u16) -> u64 {
        self.clients_at + u64::from(writer) * CLIENT_ROW_BYTES
    }

    /// Address of slot `slot` of writer `writer`'s repair-journal row, if the
    /// cluster has the journal and both exist (`crate::registers::journal`).
    pub fn journal_slot(&self, writer: u16, slot: usize) -> Option<u64> {
        let at = self.journal_at?;
        (writer < self.params.writers && slot < crate::registers::journal::SLOTS).then(|| {
            at + u64::from(writer) * crate::registers::journal::ROW_BYTES + 8 * slot as u64
        })
    }

    /// Address of index bucket `bucket`.
    pub fn bucket(&self, bucket: u64) -> u64 {
        self.index_at + (bucket % self.params.index_buckets) * BUCKET_BYTES
    }

    /// Address of the key header of register slot `register`, if it exists (the
    /// same on each of its replicas, [`Self::placement`]).
    pub fn key_header(&self, register: u64) -> Option<u64> {
        self.placement(register).map(|(at, _)| at)
    }

    /// Address of the SWARM register of slot `register`, if it exists.
    pub fn register(&self, register: u64) -> Option<u64> {
        self.key_header(register)
            .map(|at| at + self.params.key_header_bytes())
    }
}

/// Reserve chunks of a cluster of `params` whose computed chunks are `computed`
/// ([`NodeLayout::reserve_chunks`]): what `max_nodes` nodes of as many slots as
/// these have hold, `r` slots a chunk, beyond the computed chunks.
fn reserve_chunks(params: &ClusterParams, computed: u64) -> u64 {
    if params.max_nodes == 0 {
        return 0;
    }
    let slots = computed.div_ceil(params.groups());
    (u64::from(params.max_nodes) * slots / u64::from(params.replicas.max(1)))
        .saturating_sub(computed)
}

/// Encodes a key header: `[length u32 | reserved u32 | key]`, padded to 8 bytes.
pub fn encode_key_header(key: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; align(8 + key.len() as u64, 8) as usize];
    out[0..4].copy_from_slice(&(key.len() as u32).to_le_bytes());
    out[8..8 + key.len()].copy_from_slice(key);
    out
}

/// The key in a key header read from untrusted memory, if well formed.
#[cfg(test)]
pub fn decode_key_header(bytes: &[u8], key_max: u32) -> Option<&[u8]> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    if len == 0 || len > key_max {
        return None;
    }
    bytes.get(8..8 + len as usize)
}

/// Encodes a register payload: `[key length u16 | key | value]`.
pub fn encode_payload(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + key.len() + value.len());
    encode_payload_into(&mut out, key, value);
    out
}

/// [`encode_payload`] into `out`, replacing its content (its allocation is reused).
pub fn encode_payload_into(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.clear();
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Splits a payload into key and value, if well formed.
pub fn decode_payload(payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u16::from_le_bytes(payload.get(0..2)?.try_into().ok()?) as usize;
    let key = payload.get(2..2 + len)?;
    Some((key, &payload[2 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizing_fills_a_node_without_overflowing_it() {
        for size in [64u64 << 20, 1 << 30, 4 << 30] {
            let p = ClusterParams::default().for_node_size(size).unwrap();
            let l = NodeLayout::new(p).unwrap();
            assert!(l.end() <= size, "{size}: layout ends at {}", l.end());
            assert!(l.end() > size / 2, "{size}: layout wastes space");
            assert!(l.clients_at < l.chunks_at && l.chunks_at < l.index_at);
            assert!(l.index_at < l.registers_at && l.registers_at < l.swarm.log_base());
            assert_eq!(l.register(0).unwrap() % 8, 0);
            assert_eq!(l.register(p.registers), None);
        }
        assert!(matches!(
            ClusterParams::default().for_node_size(1 << 20),
            Err(ParamsError::TooSmall { .. })
        ));
    }

    #[test]
    fn superblock_roundtrips_and_refuses_corruption() {
        let p = ClusterParams::default().for_node_size(256 << 20).unwrap();
        let bytes = p.encode();
        assert_eq!(ClusterParams::decode(&bytes), Ok(p));
        assert_eq!(
            ClusterParams::decode(&[0; 64]),
            Err(ParamsError::NotInitialized)
        );
        assert_eq!(
            ClusterParams::decode(&bytes[..10]),
            Err(ParamsError::NotInitialized)
        );
        let mut bad = bytes;
        bad[33] ^= 1;
        assert_eq!(ClusterParams::decode(&bad), Err(ParamsError::Checksum));
        let mut bad = bytes;
        bad[8] = 12;
        assert_eq!(ClusterParams::decode(&bad), Err(ParamsError::Version(12)));
        let mut bad = bytes;
        bad[70] ^= 1;
        assert_eq!(
            ClusterParams::decode(&bad),
            Err(ParamsError::Checksum),
            "the lease fields are covered by the checksum"
        );
    }

    #[test]
    fn lease_parameters_roundtrip_and_a_version_1_superblock_gets_the_defaults() {
        let p = ClusterParams {
            lease_ns: 400_000_000,
            lease_renew_ns: 50_000_000,
            max_op_ns: 200_000_000,
            delivery_margin_ns: 547_000_000,
            ..ClusterParams::default().for_node_size(64 << 20).unwrap()
        };
        assert_eq!(ClusterParams::decode(&p.encode()), Ok(p));
        // A version-1 superblock, as the previous build wrote it: 56 bytes of fields
        // and their checksum.
        let mut v1 = [0u8; 64];
        v1[..56].copy_from_slice(&p.encode()[..56]);
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let sum = xxh3_64(&v1[..56]);
        v1[56..64].copy_from_slice(&sum.to_le_bytes());
        let old = ClusterParams::decode(&v1).unwrap();
        assert_eq!(
            (old.lease_ns, old.lease_renew_ns, old.max_op_ns),
            (DEFAULT_LEASE_NS, DEFAULT_LEASE_RENEW_NS, DEFAULT_MAX_OP_NS)
        );
        assert_eq!(
            old.delivery_margin_ns,
            swarm_core::slot_recycling::DEFAULT_DELIVERY_MARGIN_NS
        );
        assert_eq!(old.registers, p.registers);
        // A renewal period of half the lease is refused with the reason.
        let bad = ClusterParams {
            lease_renew_ns: 200_000_000,
            ..p
        };
        assert!(
            matches!(bad.validate(), Err(ParamsError::Invalid(why)) if why.contains("less than half the lease"))
        );
    }

    /// A version-2 superblock (clusters made before log summaries) decodes without
    /// them, and its layout is the old one: the logs where they were, nothing after.
    #[test]
    fn a_version_2_superblock_has_no_summary_area_and_keeps_its_layout() {
        let p = ClusterParams {
            log_summaries: false,
            tick_ceilings: false,
            repair_journal: false,
            cached_lives: false,
            ..ClusterParams::default()
        }
        .for_node_size(64 << 20)
        .unwrap();
        let mut v2 = p.encode();
        v2[8..12].copy_from_slice(&2u32.to_le_bytes());
        v2[96..104].fill(0);
        let sum = xxh3_64(&v2[..120]);
        v2[120..128].copy_from_slice(&sum.to_le_bytes());
        let old = ClusterParams::decode(&v2).unwrap();
        assert_eq!(old, p);
        let l = NodeLayout::new(old).unwrap();
        assert_eq!(l.summaries_at, None);
        assert_eq!(l.end(), l.swarm.log_base() + l.swarm.log_bytes());
        // With summaries, the same parameters put the area after the logs.
        let with = NodeLayout::new(ClusterParams {
            log_summaries: true,
            ..p
        })
        .unwrap();
        assert_eq!(with.swarm, l.swarm, "the logs do not move");
        let at = with.summary(p.writers - 1).unwrap();
        assert!(at >= l.end() && at + with.summary_bytes() <= with.end());
        assert_eq!(with.summary(p.writers), None);
        assert!(
            with.summary_bytes() as usize >= LogSummary::encoded_len(p.log_slots),
            "a summary fits its area"
        );
        let p3 = ClusterParams::decode(&with.params.encode()).unwrap();
        assert!(p3.log_summaries, "version 3 carries the flag");
        // A version-3 superblock has no tick ceilings, whatever its flags say.
        let mut v3 = with.params.encode();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        v3[96..104].copy_from_slice(&(FLAG_LOG_SUMMARIES | FLAG_TICK_CEILINGS).to_le_bytes());
        let sum = xxh3_64(&v3[..120]);
        v3[120..128].copy_from_slice(&sum.to_le_bytes());
        let old = ClusterParams::decode(&v3).unwrap();
        assert!(old.log_summaries && !old.tick_ceilings);
        let v4 = ClusterParams {
            tick_ceilings: true,
            ..with.params
        };
        assert!(
            ClusterParams::decode(&v4.encode()).unwrap().tick_ceilings,
            "version 4 carries the flag"
        );
        // A version-4 superblock has no repair journal, whatever its flags say; a
        // version-5 one carries the flag, and the journal sits between the client
        // table and the chunk table.
        let v5 = ClusterParams {
            repair_journal: true,
            ..v4
        };
        let mut as_v4 = v5.encode();
        as_v4[8..12].copy_from_slice(&4u32.to_le_bytes());
        let sum = xxh3_64(&as_v4[..120]);
        as_v4[120..128].copy_from_slice(&sum.to_le_bytes());
        let old = ClusterParams::decode(&as_v4).unwrap();
        assert!(old.tick_ceilings && !old.repair_journal);
        assert_eq!(NodeLayout::new(old).unwrap().journal_at, None);
        let new = ClusterParams::decode(&v5.encode()).unwrap();
        assert!(new.repair_journal, "version 5 carries the flag");
        let l5 = NodeLayout::new(new).unwrap();
        let first = l5.journal_slot(0, 0).unwrap();
        let last = l5
            .journal_slot(new.writers - 1, crate::registers::journal::SLOTS - 1)
            .unwrap();
        assert!(first >= l5.clients_at + u64::from(new.writers) * CLIENT_ROW_BYTES);
        assert!(last + 8 <= l5.chunks_at);
        assert_eq!(l5.journal_slot(new.writers, 0), None);
        assert_eq!(l5.journal_slot(0, crate::registers::journal::SLOTS), None);
        // A version-6 superblock does not check cached lives, whatever its flags
        // say: its registers wait for the cache lifetime too. Version 7 carries the
        // flag, and then they wait one operation deadline.
        let v7 = ClusterParams {
            cached_lives: true,
            ..v5
        };
        let mut as_v6 = v7.encode();
        as_v6[8..12].copy_from_slice(&6u32.to_le_bytes());
        let sum = xxh3_64(&as_v6[..120]);
        as_v6[120..128].copy_from_slice(&sum.to_le_bytes());
        let old = ClusterParams::decode(&as_v6).unwrap();
        assert!(old.repair_journal && !old.cached_lives);
        let new = ClusterParams::decode(&v7.encode()).unwrap();
        assert!(new.cached_lives, "version 7 carries the flag");
        assert_eq!(
            new.register_grace_ns(),
            swarm_core::slot_recycling::grace_with_margin_ns(new.max_op_ns, new.delivery_margin_ns)
        );
        assert_eq!(
            old.register_grace_ns(),
            swarm_core::slot_recycling::grace_with_margin_ns(
                old.cache_ttl_ns + old.max_op_ns,
                old.delivery_margin_ns
            )
        );
    }

    #[test]
    fn the_delivery_margin_enters_every_grace_and_is_bounded() {
        let p = ClusterParams {
            max_op_ns: 200_000_000,
            cache_ttl_ns: 10_000_000_000,
            delivery_margin_ns: 547_000_000,
            ..ClusterParams::default()
        };
        // max_op · 9/7 (rounded up) + margin · 9/8 (rounded up).
        assert_eq!(
            p.slot_grace_ns(),
            200_000_000 + 57_142_858 + 547_000_000 + 68_375_000
        );
        // Registers: the same (cached locations carry their register's life); on a
        // cluster made before version 7, the cache lifetime as well.
        assert_eq!(p.register_grace_ns(), p.slot_grace_ns());
        let old = ClusterParams {
            cached_lives: false,
            ..p
        };
        assert_eq!(
            old.register_grace_ns(),
            10_200_000_000 + 2_914_285_715 + 547_000_000 + 68_375_000
        );
        let lease = crate::membership::lease::LeaseParams::from_params(&p);
        assert_eq!(
            lease.observer_wait_ns(),
            p.lease_ns + p.lease_ns / 8 + p.slot_grace_ns()
        );
        for bad in [0, MAX_DELIVERY_MARGIN_NS + 1] {
            let p = ClusterParams {
                delivery_margin_ns: bad,
                ..p
            };
            assert!(
                matches!(p.validate(), Err(ParamsError::Invalid(why)) if why.contains("--delivery-margin"))
            );
        }
    }

    /// Capacity grows with the cluster: at one node size, 6 nodes of 3 replicas
    /// hold twice the registers of 3 nodes (less chunk rounding), and the layout
    /// still fits the node.
    #[test]
    fn replica_groups_multiply_capacity_at_one_node_size() {
        for size in [64u64 << 20, 256 << 20] {
            let on = |nodes: u16| {
                ClusterParams {
                    placement_nodes: nodes,
                    ..ClusterParams::default()
                }
                .for_node_size(size)
                .unwrap()
            };
            let (three, six, nine) = (on(3), on(6), on(9));
            for p in [three, six, nine] {
                assert!(NodeLayout::new(p).unwrap().end() <= size);
                assert_eq!(ClusterParams::decode(&p.encode()), Ok(p));
            }
            assert_eq!(three.groups(), 1);
            assert_eq!(six.groups(), 2);
            let ratio = six.registers as f64 / three.registers as f64;
            assert!(ratio >= 1.95, "{size}: 6 nodes hold {ratio:.3} x 3 nodes");
            let ratio = nine.registers as f64 / three.registers as f64;
            assert!(ratio >= 2.9, "{size}: 9 nodes hold {ratio:.3} x 3 nodes");
            // Small values: the index is a larger share, and still not the registers'.
            let small = |nodes: u16| {
                ClusterParams {
                    placement_nodes: nodes,
                    value_max: 128,
                    writers: 8,
                    ..ClusterParams::default()
                }
                .for_node_size(size)
                .unwrap()
            };
            let ratio = small(6).registers as f64 / small(3).registers as f64;
            assert!(
                ratio >= 1.95,
                "{size}, small values: 6 nodes hold {ratio:.3} x 3 nodes"
            );
            // Without groups (a cluster made before version 8) the node count
            // changes nothing, and one group lays registers out as before.
            let legacy = ClusterParams::default().for_node_size(size).unwrap();
            assert_eq!(
                legacy,
                ClusterParams {
                    placement_nodes: 0,
                    ..three
                }
            );
            let (l, g) = (
                NodeLayout::new(legacy).unwrap(),
                NodeLayout::new(three).unwrap(),
            );
            for r in [0, 1, 255, 256, legacy.registers - 1] {
                assert_eq!(l.register(r), g.register(r));
            }
        }
    }

    /// One replica group sizes a node as before, small nodes with big values too
    /// (where one band is a large share of the node).
    #[test]
    fn one_replica_group_sizes_a_node_as_before() {
        for (size, value_max) in [(8u64 << 20, 8192), (32 << 20, 64), (64 << 20, 1024)] {
            let base = ClusterParams {
                value_max,
                writers: 4,
                ..ClusterParams::default()
            };
            let legacy = base.for_node_size(size).unwrap();
            let grouped = ClusterParams {
                placement_nodes: 3,
                ..base
            }
            .for_node_size(size)
            .unwrap();
            assert_eq!(
                legacy,
                ClusterParams {
                    placement_nodes: 0,
                    ..grouped
                },
                "{size}"
            );
        }
    }

    /// A version-7 superblock has no replica groups, whatever its byte 26 and
    /// flags say; version 8 carries them.
    #[test]
    fn a_version_7_superblock_has_no_replica_groups() {
        let p = ClusterParams {
            placement_nodes: 6,
            ..ClusterParams::default()
        }
        .for_node_size(64 << 20)
        .unwrap();
        let mut v7 = p.encode();
        v7[8..12].copy_from_slice(&7u32.to_le_bytes());
        let sum = xxh3_64(&v7[..120]);
        v7[120..128].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(ClusterParams::decode(&v7).unwrap().placement_nodes, 0);
        assert_eq!(
            ClusterParams::decode(&p.encode()).unwrap().placement_nodes,
            6
        );
    }

    /// A metadata group (more nodes than one roundtrip reaches) is version 9, with
    /// its count at offset 52 and flag bit 5; a cluster without one still writes
    /// version 8, byte for byte as before; a version-8 superblock has no group,
    /// whatever its byte 52 says; and the group's bounds are checked.
    #[test]
    fn a_metadata_group_is_version_9_and_other_clusters_stay_version_8() {
        let grouped = ClusterParams {
            placement_nodes: 32,
            metadata_nodes: default_metadata_nodes(32, 3),
            writers: 8,
            ..ClusterParams::default()
        }
        .for_node_size(16 << 20)
        .unwrap();
        assert_eq!(grouped.metadata_nodes, 5);
        let bytes = grouped.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 9);
        assert_eq!(u16::from_le_bytes(bytes[52..54].try_into().unwrap()), 5);
        assert_ne!(u64_at(&bytes, 96) & FLAG_METADATA_GROUP, 0);
        assert_eq!(ClusterParams::decode(&bytes), Ok(grouped));
        let layout = NodeLayout::new(grouped).unwrap();
        assert_eq!(layout.metadata_nodes(32), 5);
        assert!(layout.holds_metadata(4, 32) && !layout.holds_metadata(5, 32));

        let six = ClusterParams {
            placement_nodes: 6,
            ..ClusterParams::default()
        };
        assert_eq!(default_metadata_nodes(6, 3), 0, "16 nodes or fewer: none");
        let bytes = six.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 8);
        assert_eq!(&bytes[52..54], &[0, 0]);
        assert_eq!(NodeLayout::new(six).unwrap().metadata_nodes(6), 6);
        // A version-8 superblock whose byte 52 and bit 5 are set has no group.
        let mut v8 = grouped.encode();
        v8[8..12].copy_from_slice(&8u32.to_le_bytes());
        let sum = xxh3_64(&v8[..120]);
        v8[120..128].copy_from_slice(&sum.to_le_bytes());
        assert!(
            ClusterParams::decode(&v8).is_err(),
            "32 nodes without a metadata group are refused"
        );

        // Tens of groups with small values: sized so that the logs keep room.
        for nodes in [17u16, 32, 64] {
            let p = ClusterParams {
                placement_nodes: nodes,
                metadata_nodes: default_metadata_nodes(nodes, 3),
                value_max: 128,
                writers: 8,
                ..ClusterParams::default()
            }
            .for_node_size(256 << 20)
            .unwrap();
            assert!(NodeLayout::new(p).unwrap().end() <= 256 << 20, "{nodes}");
            assert!(
                p.registers >= u64::from(nodes / 3) * 40_000,
                "{nodes}: {p:?}"
            );
        }

        for (placement_nodes, metadata_nodes) in
            [(32, 0), (32, 17), (32, 1), (0, 5), (4, 5), (65, 5)]
        {
            let p = ClusterParams {
                placement_nodes,
                metadata_nodes,
                ..ClusterParams::default()
            };
            assert!(
                matches!(p.validate(), Err(ParamsError::Invalid(_))),
                "{placement_nodes} nodes, a group of {metadata_nodes}"
            );
        }
    }

    /// Room to grow is version 11 (flag bit 7, the node count at 54): reserve
    /// chunks after the computed ones in the chunk and placement tables, their
    /// buckets in the index, ids after the computed registers' and identities past
    /// the register area, unique and inverted by `register_at`; the register area
    /// and every computed register stay where they were. A cluster without it keeps
    /// version 10, and a version-10 superblock has none whatever its flags say.
    #[test]
    fn room_to_grow_is_version_11_and_other_clusters_keep_their_layout() {
        let base = ClusterParams {
            placement_nodes: 3,
            placement_table: true,
            key_max: 16,
            value_max: 64,
            writers: 4,
            ..ClusterParams::default()
        };
        let without = base.for_node_size(16 << 20).unwrap();
        let with = ClusterParams {
            max_nodes: 6,
            ..base
        }
        .for_node_size(16 << 20)
        .unwrap();
        assert_eq!(with.registers, without.registers, "no computed key lost");
        assert!(with.index_buckets >= 2 * with.registers);
        let bytes = with.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 11);
        assert_ne!(u64_at(&bytes, 96) & FLAG_RESERVE_CHUNKS, 0);
        assert_eq!(ClusterParams::decode(&bytes), Ok(with));
        assert_eq!(
            u32::from_le_bytes(without.encode()[8..12].try_into().unwrap()),
            10
        );
        let mut v10 = bytes;
        v10[8..12].copy_from_slice(&10u32.to_le_bytes());
        let sum = xxh3_64(&v10[..120]);
        v10[120..128].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(ClusterParams::decode(&v10).unwrap().max_nodes, 0);

        let (old, new) = (
            NodeLayout::new(without).unwrap(),
            NodeLayout::new(with).unwrap(),
        );
        assert_eq!(old.reserve_chunks(), 0);
        assert_eq!(old.register_ids(), without.registers);
        assert_eq!(new.computed_chunks(), old.chunks());
        // Six nodes of as many slots as three hold twice the chunks.
        assert_eq!(new.reserve_chunks(), new.computed_chunks());
        assert_eq!(new.capacity_max(), 2 * with.registers);
        assert_eq!(new.slots(), old.slots());
        assert!(new.placement_record(new.chunks() - 1).unwrap() + 256 <= new.index_at);
        assert_eq!(new.placement(with.registers), None, "no computed place");
        let per = u64::from(with.chunk_registers);
        let first_reserve = new.computed_chunks();
        assert!(new.is_reserve(first_reserve) && !new.is_reserve(first_reserve - 1));
        assert_eq!(
            new.chunk_register_ids(first_reserve),
            first_reserve * per..(first_reserve + 1) * per
        );
        let mut seen = std::collections::HashSet::new();
        for register in 0..new.register_ids() {
            let id = new.identity(register).unwrap();
            assert!(seen.insert(id), "identity {id} twice");
            assert_eq!(new.register_at(id), Some(register));
            if register < with.registers {
                assert_eq!(Some(id), new.register(register));
            } else {
                assert!(id >= new.registers_at + new.register_area_bytes());
            }
        }
        assert_eq!(new.identity(new.register_ids()), None);
        let no_table = ClusterParams {
            placement_table: false,
            ..with
        };
        assert!(
            no_table.validate().is_err(),
            "growth needs a placement table"
        );
        let fewer = ClusterParams {
            max_nodes: 2,
            ..with
        };
        assert!(fewer.validate().is_err(), "no fewer than the nodes it has");
    }

    /// A placement table is version 10 (flag bit 6), after the chunk table and
    /// before the index; a cluster without one keeps its version and its layout
    /// byte for byte, and a version-9 superblock has no table whatever its flags say.
    #[test]
    fn a_placement_table_is_version_10_and_other_clusters_keep_their_layout() {
        let without = ClusterParams {
            placement_nodes: 6,
            ..ClusterParams::default()
        }
        .for_node_size(64 << 20)
        .unwrap();
        let with = ClusterParams {
            placement_table: true,
            ..without
        };
        let bytes = with.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 10);
        assert_ne!(u64_at(&bytes, 96) & FLAG_PLACEMENT_TABLE, 0);
        assert_eq!(ClusterParams::decode(&bytes), Ok(with));
        let (old, new) = (
            NodeLayout::new(without).unwrap(),
            NodeLayout::new(with).unwrap(),
        );
        assert_eq!(old.placements_at, None);
        assert_eq!(old.placement_record(0), None);
        let at = new.placements_at.unwrap();
        assert!(at >= new.chunks_at + 8 * new.chunks());
        let last = new.placement_record(new.chunks() - 1).unwrap();
        assert!(last + crate::placement::RECORD_BYTES as u64 <= new.index_at);
        assert_eq!(new.placement_record(new.chunks()), None);
        // Without a table: version 8 as before, and the index where it was.
        let bytes = without.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 8);
        assert_eq!(
            old.index_at,
            align(old.chunks_at + 8 * old.chunks(), AREA_ALIGN)
        );
        let mut v9 = with.encode();
        v9[8..12].copy_from_slice(&9u32.to_le_bytes());
        let sum = xxh3_64(&v9[..120]);
        v9[120..128].copy_from_slice(&sum.to_le_bytes());
        assert!(!ClusterParams::decode(&v9).unwrap().placement_table);
        // Slots are the bands: slot `s` of a node is where band `s` starts there.
        assert_eq!(new.slots(), new.bands());
        assert_eq!(
            new.slot_key_header(1, 0),
            Some(new.registers_at + new.band_bytes)
        );
        assert_eq!(new.slot_key_header(new.slots(), 0), None);
        assert_eq!(
            new.slot_key_header(0, u64::from(with.chunk_registers)),
            None
        );
        let no_groups = ClusterParams {
            placement_nodes: 0,
            ..with
        };
        assert!(
            no_groups.validate().is_err(),
            "a table needs replica groups"
        );
    }

    fn u64_at(bytes: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    proptest! {
        /// The placement is a bijection: no two registers share a (node, byte), an
        /// address names one register (`register_at` inverts it), a register's
        /// replicas are `r` distinct nodes of the cluster, and every node holds
        /// about the same number of registers.
        #[test]
        fn replica_group_placement_is_a_balanced_bijection(
            nodes in prop::sample::select(vec![1u16, 2, 3, 4, 5, 6, 7, 9, 16, 17, 32, 64]),
            replicas in prop::sample::select(vec![1u16, 3, 5]),
            chunk_registers in 1u32..=8,
            chunks in 1u64..=40,
        ) {
            prop_assume!(replicas <= nodes);
            // More groups than these 144-byte slots have room to shift by are refused.
            prop_assume!(nodes / replicas <= 16);
            let params = ClusterParams {
                placement_nodes: nodes,
                metadata_nodes: default_metadata_nodes(nodes, replicas),
                replicas,
                chunk_registers,
                registers: chunks * u64::from(chunk_registers),
                key_max: 8,
                value_max: 8,
                ..ClusterParams::default()
            };
            let layout = NodeLayout::new(params).unwrap();
            let span = layout.register_slot_bytes;
            let mut taken = std::collections::HashMap::new();
            let mut per_node = vec![0u64; usize::from(nodes)];
            for register in 0..params.registers {
                let loc = crate::client::register_loc_for(&layout, usize::from(nodes), register)
                    .unwrap();
                let header = layout.key_header(register).unwrap();
                let addr = header + params.key_header_bytes();
                // One offset on every replica, and it names the register.
                prop_assert_eq!(loc.same_offset(), Some(addr));
                prop_assert_eq!(loc.id, addr);
                prop_assert_eq!(layout.register_at(loc.id), Some(register));
                prop_assert_eq!(loc.replicas.nodes().len(), usize::from(replicas));
                prop_assert!(header >= layout.registers_at);
                prop_assert!(header + span <= layout.registers_at + layout.register_area_bytes());
                for node in loc.replicas.nodes() {
                    prop_assert!(node.index() < usize::from(nodes));
                    prop_assert!(layout.chunk_on(register / u64::from(chunk_registers), node.index()));
                    per_node[node.index()] += 1;
                    // Every 8-byte word of the slot on this node is this register's.
                    for word in (header..header + span).step_by(8) {
                        if let Some(other) = taken.insert((node.index(), word), register) {
                            prop_assert!(false, "register {} and {} share node {} byte {}", other, register, node.index(), word);
                        }
                    }
                }
            }
            // Balance: over whole cycles of bands, every node holds the same
            // number; any prefix is off by at most a band's worth.
            let (min, max) = (per_node.iter().min().unwrap(), per_node.iter().max().unwrap());
            let band = u64::from(chunk_registers);
            prop_assert!(max - min <= band * u64::from(replicas).max(1),
                "unbalanced: {:?}", per_node);
            let total: u64 = per_node.iter().sum();
            prop_assert_eq!(total, params.registers * u64::from(replicas));
        }

        #[test]
        fn payload_and_key_header_roundtrip(key in proptest::collection::vec(any::<u8>(), 1..128),
                                            value in proptest::collection::vec(any::<u8>(), 0..300)) {
            let payload = encode_payload(&key, &value);
            prop_assert_eq!(decode_payload(&payload), Some((&key[..], &value[..])));
            let header = encode_key_header(&key);
            prop_assert_eq!(decode_key_header(&header, 128), Some(&key[..]));
            prop_assert_eq!(decode_key_header(&header, key.len() as u32 - 1), None);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = ClusterParams::decode(&bytes);
            let _ = decode_payload(&bytes);
            let _ = decode_key_header(&bytes, 64);
        }
    }
}
