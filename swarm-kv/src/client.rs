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
//!   (one roundtrip, both in flight together), then map the key to it in the index.
//!   If the key already maps to a live register the insert becomes an update of that
//!   register; if it maps to a deleted one, the mapping is replaced (§5.3.1).
//!   Writing the value *before* publishing the mapping means an indexed register is
//!   never empty, so readers never see a half-inserted key.
//! * **delete** — a Safe-Guess write of the tombstone (§5.3.2), then the mapping is
//!   removed. Clients holding the location in their cache see the tombstone, flush and
//!   retry through the index.
//!
//! Operations take `&self` and can be kept in flight several at a time on one thread
//! ([`swarm_core::LocalExecutor`]); the location cache is only borrowed between
//! awaits.

use std::cell::{Cell, RefCell};

use swarm_core::ProtocolConfig;
use swarm_core::encoding::WriterId;
use swarm_core::fabric::Nanos;
use swarm_core::quorum::broadcast;
use swarm_core::resume::scan_log;
use swarm_core::{
    Batch, Client, Clock, Fabric, NodeId, OpStats, ReadValue, RegisterCache, RegisterLoc, Replicas,
    WriteOutcome,
};
use xxhash_rust::xxh3::xxh3_64;

use crate::cache::{Location, LocationCache};
use crate::index::{Index, IndexConfig, IndexError, InsertOutcome};
use crate::layout::{NodeLayout, decode_payload, encode_key_header, encode_payload};
use crate::register_alloc::RegisterAllocator;
use crate::writer_ids::{self, Registration};
use crate::{KvError, RegisterId};

/// How often a client renews its lease in the client table.
const HEARTBEAT_NS: Nanos = 1_000_000_000;
/// How many times an operation re-resolves a key that keeps moving under it.
const MAX_RETRIES: u32 = 16;

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
}

impl KvConfig {
    /// Defaults for a cluster with the given epoch and tick: 64 MiB of cache.
    pub fn new(epoch_unix_ns: u64, tick_ns: u64) -> Self {
        Self {
            cache_bytes: 64 << 20,
            protocol: ProtocolConfig::default(),
            index: IndexConfig::default(),
            epoch_unix_ns,
            tick_ns,
            register_protocol: RegisterProtocol::SafeGuess,
        }
    }
}

/// A located key: its register, replicas and what the client knows of it.
struct Located {
    register: RegisterId,
    loc: RegisterLoc,
    knowledge: RegisterCache,
}

/// See the module docs.
pub struct KvClient<F: Fabric, C: Clock> {
    swarm: Client<F, C>,
    layout: NodeLayout,
    nodes: usize,
    index: Index,
    alloc: RegisterAllocator,
    cache: RefCell<LocationCache>,
    token: u64,
    registration: Registration,
    protocol: RegisterProtocol,
    last_heartbeat: Cell<Nanos>,
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
        let pid = u64::from(std::process::id());
        let token = token_for(pid);
        let now = crate::clock::SystemClock::unix_ns();
        let registration = swarm_core::block_on(
            &fabric,
            writer_ids::register(&fabric, &layout, nodes, token, pid, now),
        )?;
        let writer =
            WriterId::new(u32::from(registration.writer)).map_err(swarm_core::SwarmError::from)?;
        let scan = if registration.reused {
            let stats = OpStats::new();
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
        let swarm = Client::new(fabric, clock, layout.swarm, writer, config.protocol)?;
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
        if let Some(scan) = scan {
            swarm.resume(scan.used_slots, scan.last_ticks);
        }
        let now = swarm.fabric().now();
        Ok(Self {
            alloc: RegisterAllocator::new(&layout, registration.writer, token),
            swarm,
            layout,
            nodes,
            index,
            cache: RefCell::new(LocationCache::new(config.cache_bytes)),
            token,
            registration,
            protocol: config.register_protocol,
            last_heartbeat: Cell::new(now),
        })
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

    /// Gives the writer id back (its log is resumed by the next client that takes it).
    pub fn close(self) {
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

    fn tick(&self) {
        let now = self.swarm.fabric().now();
        if now.saturating_sub(self.last_heartbeat.get()) >= HEARTBEAT_NS {
            self.last_heartbeat.set(now);
            let unix = crate::clock::SystemClock::unix_ns();
            writer_ids::heartbeat(
                self.swarm.fabric(),
                &self.layout,
                self.nodes,
                self.registration.writer,
                unix,
            );
        }
    }

    /// The replicas of register `register`: `replicas` consecutive nodes starting at a
    /// hash of its id, in preference order (the first is its primary, §6).
    pub fn register_loc(&self, register: RegisterId) -> Result<RegisterLoc, KvError> {
        let addr = self
            .layout
            .register(register)
            .ok_or(KvError::Corrupted { register })?;
        let hash = xxh3_64(&register.to_le_bytes());
        let n = self.nodes;
        let r = usize::from(self.layout.params.replicas);
        let start = (hash % n as u64) as usize;
        let nodes: Vec<NodeId> = (0..r).map(|i| NodeId(((start + i) % n) as u16)).collect();
        Ok(RegisterLoc {
            addr,
            replicas: Replicas::new(&nodes, hash / n as u64)?,
        })
    }

    fn cached(&self, key: &[u8]) -> Result<Option<Located>, KvError> {
        let Some(location) = self.cache.borrow_mut().get(key) else {
            return Ok(None);
        };
        Ok(Some(Located {
            register: location.register,
            loc: self.register_loc(location.register)?,
            knowledge: location.knowledge,
        }))
    }

    fn remember(&self, key: &[u8], located: &Located) {
        self.cache.borrow_mut().put(
            key,
            Location {
                register: located.register,
                knowledge: located.knowledge.clone(),
            },
        );
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
    async fn locate_written(
        &self,
        key: &[u8],
        stats: &OpStats,
    ) -> Result<Option<Located>, KvError> {
        match self.cached(key)? {
            Some(located) if located.knowledge.knows_a_write() => Ok(Some(located)),
            _ => Ok(self.resolve(key, stats).await?.map(|(located, _)| located)),
        }
    }

    /// Finds `key` through the index: the first candidate register that holds it.
    async fn resolve(
        &self,
        key: &[u8],
        stats: &OpStats,
    ) -> Result<Option<(Located, Vec<u8>)>, KvError> {
        let candidates = self.index.lookup(self.swarm.fabric(), stats, key).await?;
        for register in candidates.registers {
            let mut located = Located {
                register,
                loc: self.register_loc(register)?,
                knowledge: RegisterCache::new(),
            };
            if let Some(value) = self.read_checked(key, &mut located, stats).await? {
                self.remember(key, &located);
                return Ok(Some((located, value)));
            }
        }
        Ok(None)
    }

    /// The key's current value, or `None` if it is absent.
    pub async fn get(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, KvError> {
        self.check_key(key)?;
        self.tick();
        if let Some(mut located) = self.cached(key)? {
            if let Some(value) = self.read_checked(key, &mut located, stats).await? {
                self.remember(key, &located);
                return Ok(Some(value));
            }
            // Deleted (or never this key's): the cached location is stale.
            self.cache.borrow_mut().remove(key);
        }
        Ok(self.resolve(key, stats).await?.map(|(_, value)| value))
    }

    /// Replaces the value of a present key; `Ok(false)` if the key is absent.
    pub async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        self.tick();
        let payload = encode_payload(key, value);
        for _ in 0..MAX_RETRIES {
            let Some(mut located) = self.locate_written(key, stats).await? else {
                return Ok(false);
            };
            match self.write_register(&mut located, stats, &payload).await? {
                WriteOutcome::Written => {
                    self.remember(key, &located);
                    return Ok(true);
                }
                WriteOutcome::Deleted => self.forget_deleted(key, located.register, stats).await?,
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Inserts `key` (an insert of a present key becomes an update).
    pub async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        self.tick();
        let payload = encode_payload(key, value);
        let fabric = self.swarm.fabric();
        let register = self
            .alloc
            .allocate(fabric, stats, &self.layout, self.nodes)
            .await?;
        let mut fresh = Located {
            register,
            loc: self.register_loc(register)?,
            knowledge: RegisterCache::new(),
        };
        // The key header and the value, in flight together (§5.3.1).
        let header_at = self
            .layout
            .key_header(register)
            .ok_or(KvError::Corrupted { register })?;
        let header = encode_key_header(key);
        let replicas = fresh.loc.replicas.clone();
        let write_header = async {
            let nodes = replicas.nodes().iter().copied();
            broadcast(fabric, stats, nodes, replicas.quorum(), |_| {
                Ok(Batch::write(header_at, header.clone()))
            })
            .await
            .map(drop)
        };
        let write_value = self.write_register(&mut fresh, stats, &payload);
        let (header_written, value_written) = swarm_core::join(write_header, write_value).await;
        header_written?;
        value_written?;
        for _ in 0..MAX_RETRIES {
            let outcome = match self.index.insert(fabric, stats, key, register).await {
                Ok(outcome) => outcome,
                // The index could not tell whether our mapping took effect (this client
                // stalled past its acknowledgement window): ask it.
                Err(IndexError::OutcomeUnknown { .. }) => {
                    match self.index.resolve(fabric, stats, key).await? {
                        Some(r) if r == register => InsertOutcome::Inserted,
                        Some(other) => InsertOutcome::Exists(other),
                        None => continue,
                    }
                }
                Err(e) => return Err(e.into()),
            };
            match outcome {
                InsertOutcome::Inserted => {
                    self.remember(key, &fresh);
                    return Ok(());
                }
                InsertOutcome::Exists(existing) => {
                    let mut old = Located {
                        register: existing,
                        loc: self.register_loc(existing)?,
                        knowledge: RegisterCache::new(),
                    };
                    let value = self.read_register(&mut old, stats).await?;
                    if value == ReadValue::Deleted {
                        // Re-insert over a deleted key: take over its mapping.
                        let replaced = match self
                            .index
                            .replace(fabric, stats, key, existing, register)
                            .await
                        {
                            Ok(replaced) => replaced,
                            // As for the insert above: ask the index what happened.
                            Err(IndexError::OutcomeUnknown { .. }) => {
                                self.index.resolve(fabric, stats, key).await? == Some(register)
                            }
                            // Others keep changing the key's bucket: look again.
                            Err(IndexError::Contention { .. }) => false,
                            Err(e) => return Err(e.into()),
                        };
                        if replaced {
                            self.remember(key, &fresh);
                            return Ok(());
                        }
                        continue;
                    }
                    // The key is present: the insert becomes an update (§5.3.1).
                    match self.write_register(&mut old, stats, &payload).await? {
                        WriteOutcome::Written => {
                            self.remember(key, &old);
                            return Ok(());
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

    /// Deletes `key`; `Ok(false)` if it was absent.
    pub async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<bool, KvError> {
        self.check_key(key)?;
        if self.protocol == RegisterProtocol::Raw {
            return Err(KvError::Unsupported(
                "delete with the RAW baseline protocol",
            ));
        }
        self.tick();
        for _ in 0..MAX_RETRIES {
            let Some(mut located) = self.locate_written(key, stats).await? else {
                return Ok(false);
            };
            match self
                .swarm
                .delete(&located.loc, &mut located.knowledge, stats)
                .await?
            {
                WriteOutcome::Written => {
                    // The tombstone is the delete's linearization point (SWARM
                    // §5.3.2): the key is gone whatever the unmap does. An index
                    // that cannot unmap now (contention, a stalled client, a lost
                    // majority) leaves `key → tombstone`, which reads as absent and
                    // which the next insert of the key replaces.
                    if let Err(error) = self.forget_deleted(key, located.register, stats).await {
                        tracing::debug!(%error, register = located.register, "delete: unmapping the tombstoned register failed; the mapping stays (it reads as absent)");
                    }
                    return Ok(true);
                }
                // Already deleted by someone else: the key may live elsewhere now.
                WriteOutcome::Deleted => self.forget_deleted(key, located.register, stats).await?,
            }
        }
        Err(KvError::Contended {
            attempts: MAX_RETRIES,
        })
    }

    /// Flushes a deleted register from the cache and unmaps it from the index (a
    /// no-op if its deleter already did, or a re-insert replaced it).
    async fn forget_deleted(
        &self,
        key: &[u8],
        register: RegisterId,
        stats: &OpStats,
    ) -> Result<(), KvError> {
        self.cache.borrow_mut().remove(key);
        self.index
            .remove(self.swarm.fabric(), stats, key, register)
            .await?;
        Ok(())
    }
}
