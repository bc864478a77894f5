//! Per-chunk placement records: where a chunk of registers lives when that is not
//! where the layout computes it (issue 46; ARCHITECTURE.md, "Per-replica
//! placement", step 1).
//!
//! **Why.** A chunk's computed place ([`NodeLayout::placement`]: a replica group and
//! a band, the same offset on every replica) is fixed by the cluster's size at
//! `swarm init`. Adding a node, moving a chunk off a node and growing a node all need
//! a chunk to live on other nodes, at other offsets per node: swarm-core already
//! posts every replica's batches to that replica's own offset
//! ([`RegisterLoc::placed`]). This module says which.
//!
//! **Where.** Superblock version 10 ([`crate::layout::FLAG_PLACEMENT_TABLE`]) puts a
//! *placement table* after the chunk table on the metadata group: one record of
//! [`RECORD_BYTES`] per chunk ([`record`] has the encoding). A record names the
//! chunk's `r` replicas as (node, slot) pairs; slot `s` of a node is band `s` of its
//! register area ([`NodeLayout::slot_key_header`]), so register `o` of the chunk is
//! at `slot start + o · register slot` there. An unset record (zeros, what a new
//! table holds) and every cluster before version 10 mean the computed place, so
//! old clusters open unchanged. A *reserve chunk* (superblock version 11,
//! [`NodeLayout::reserve_chunks`]) has no computed place: unset, it has no memory,
//! and no client claims it (`crate::registers::alloc`); add-node records it in free
//! slots, which is how an add gives the cluster keys ([`Placements::capacity`]).
//!
//! **Names.** A register keeps the identity its computed place gives it (that
//! address, [`NodeLayout::register`]) wherever a record puts it: log records' owner
//! tags, slot trackers and resumes keep naming it through a move (the design's
//! `8 · (id + 1)` would rename a chunk's registers when it is first recorded, and a
//! log record written before would then name nothing). Identities stay unique and
//! below 32 GiB exactly as before, since they are the computed addresses.
//!
//! **Which copy.** Records are written by configuration changes only (add-node,
//! rebalance: the next steps), under the repair lock, to a majority of the metadata
//! group before the configuration epoch that publishes them. A client reads the whole
//! table from a majority ([`read`]) when it connects and whenever it follows a newer
//! configuration (`KvClient::follow_configuration`), and adopts per chunk the record
//! of highest epoch at most its own: one published by a configuration it follows is
//! on a majority, so on one of the copies it read; one written for a later epoch is
//! not used before that epoch. A copy whose checksum fails was read while its write
//! landed: the table is read again. Reading the table is never part of an operation,
//! which still takes one roundtrip.
//!
//! **Checked.** A table is adopted only if every record fits the cluster (its
//! replica count, nodes that exist, slots of the register area) and no two chunks
//! share memory: no (node, slot) named twice, and none that an unrecorded chunk's
//! computed place uses ([`Placements::adopt`]). The joint state of a move (step 3)
//! is refused by this build.

mod add_node;
mod record;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use swarm_core::fabric::{Batch, Nanos};
use swarm_core::quorum::{broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Fabric, NodeId, OpStats, RegisterLoc, Replicas};
use xxhash_rust::xxh3::xxh3_64;

pub(crate) use add_node::is_hold_token;
pub use add_node::{AddNodeError, AddNodeOptions, AddNodeReport, add_node};
pub use record::{PlacementRecord, RECORD_BYTES, RecordError, Spot};

use crate::layout::NodeLayout;
use crate::{KvError, RegisterId};

/// Reads of the table [`read`] makes while copies keep failing their checksum
/// (being written), before it fails.
pub const TABLE_REREADS: u32 = 8;

/// Why a placement table was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A copy of a record is malformed (not a checksum failure, which is reread).
    #[error("chunk {chunk}'s placement record on node {node}: {error}")]
    Record {
        /// The chunk.
        chunk: u64,
        /// The node whose copy it is.
        node: NodeId,
        /// What is wrong.
        error: RecordError,
    },
    /// Copies kept failing their checksum over every reread.
    #[error(
        "chunk {chunk}'s placement record kept failing its checksum over {TABLE_REREADS} reads: a writer of the table stopped mid-write, or the table is corrupted; retry, and check the cluster with `swarm stat`"
    )]
    Torn {
        /// The chunk.
        chunk: u64,
    },
    /// A record does not fit the cluster.
    #[error(
        "chunk {chunk}'s placement record does not fit this cluster ({why}): the table is corrupted or written for another cluster"
    )]
    Misfit {
        /// The chunk.
        chunk: u64,
        /// What does not fit.
        why: &'static str,
    },
    /// Two chunks would share memory on a node.
    #[error(
        "chunk {chunk}'s placement record names slot {slot} of node {node}, which chunk {other} uses: the table is corrupted"
    )]
    Overlap {
        /// The chunk.
        chunk: u64,
        /// The node.
        node: u8,
        /// The slot.
        slot: u32,
        /// The chunk already there.
        other: u64,
    },
    /// A chunk is being moved (a joint record): this build cannot take part.
    #[error(
        "chunk {chunk} is being moved (a joint placement record), which this build does not support: use a build with rebalancing"
    )]
    Joint {
        /// The chunk.
        chunk: u64,
    },
}

/// The placement table a client follows: per chunk, the record it adopted, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placements {
    records: Vec<Option<PlacementRecord>>,
}

impl Placements {
    /// No records: every chunk where the layout computes it (clusters without a
    /// table, and tables with no record set).
    pub fn computed() -> Self {
        Self::default()
    }

    /// Chunks with a record.
    pub fn recorded(&self) -> usize {
        self.records.iter().flatten().count()
    }

    /// Keys the cluster holds under this table: the computed registers, and those
    /// of every reserve chunk with a record (`NodeLayout::reserve_chunks`).
    pub fn capacity(&self, layout: &NodeLayout) -> u64 {
        let reserve: u64 = (layout.computed_chunks()..layout.chunks())
            .filter(|&chunk| self.record(chunk).is_some())
            .map(|chunk| layout.chunk_register_ids(chunk).count() as u64)
            .sum();
        layout.params.registers + reserve
    }

    /// Chunk `chunk`'s record, if it has one.
    pub fn record(&self, chunk: u64) -> Option<&PlacementRecord> {
        self.records.get(usize::try_from(chunk).ok()?)?.as_ref()
    }

    /// Adopts, per chunk, the record of highest epoch at most `own_epoch` among
    /// `copies` (per node that answered, the whole table as read), then checks the
    /// result against the cluster of `nodes` nodes (module docs, "Checked").
    pub fn adopt(
        layout: &NodeLayout,
        nodes: usize,
        copies: &[(NodeId, &[u8])],
        own_epoch: u64,
    ) -> Result<Self, PlacementError> {
        let chunks = layout.chunks();
        let mut records: Vec<Option<PlacementRecord>> = vec![None; chunks as usize];
        for (chunk, adopted) in records.iter_mut().enumerate() {
            let at = chunk * RECORD_BYTES;
            for &(node, table) in copies {
                let copy = table.get(at..at + RECORD_BYTES).unwrap_or_default();
                let record = PlacementRecord::decode(copy).map_err(|error| match error {
                    RecordError::Checksum => PlacementError::Torn {
                        chunk: chunk as u64,
                    },
                    error => PlacementError::Record {
                        chunk: chunk as u64,
                        node,
                        error,
                    },
                })?;
                let Some(record) = record else { continue };
                let newer = adopted.as_ref().is_none_or(|a| record.epoch > a.epoch);
                if u64::from(record.epoch) <= own_epoch && newer {
                    *adopted = Some(record);
                }
            }
        }
        if records.iter().all(Option::is_none) {
            // Nothing recorded: no table to look registers up in.
            records.clear();
        }
        let placements = Self { records };
        placements.check(layout, nodes)?;
        Ok(placements)
    }

    /// Checks every record against the cluster (module docs, "Checked").
    fn check(&self, layout: &NodeLayout, nodes: usize) -> Result<(), PlacementError> {
        let mut used: HashMap<(u8, u32), u64> = HashMap::new();
        for (chunk, record) in self.records.iter().enumerate() {
            let chunk = chunk as u64;
            let Some(record) = record else { continue };
            let misfit = |why| PlacementError::Misfit { chunk, why };
            if record.destination.is_some() {
                return Err(PlacementError::Joint { chunk });
            }
            if record.replicas.len() != usize::from(layout.params.replicas) {
                return Err(misfit("another replica count"));
            }
            for spot in &record.replicas {
                if usize::from(spot.node) >= nodes {
                    return Err(misfit("a node the cluster does not have"));
                }
                if u64::from(spot.slot) >= layout.slots() {
                    return Err(misfit("a slot beyond the register area"));
                }
                let overlap = |other| PlacementError::Overlap {
                    chunk,
                    node: spot.node,
                    slot: spot.slot,
                    other,
                };
                if let Some(&other) = used.get(&(spot.node, spot.slot)) {
                    return Err(overlap(other));
                }
                used.insert((spot.node, spot.slot), chunk);
                // The chunk the layout computes in this band on this node, unless
                // it is recorded elsewhere (or is this one).
                let band = u64::from(spot.slot);
                if let Some(j) = layout.group_of(usize::from(spot.node), band) {
                    let computed = band * layout.params.groups() + j;
                    if computed < layout.computed_chunks() && self.record(computed).is_none() {
                        return Err(overlap(computed));
                    }
                }
            }
        }
        Ok(())
    }

    /// Where register `register` lives in a cluster of `nodes` nodes: its record's
    /// replicas, each at its own slot's offset, rotated by a hash of its id (as a
    /// replica group is) so that primaries vary; or, unrecorded, its computed place
    /// ([`crate::client::register_loc_for`]). Its identity is its computed address
    /// either way (module docs, "Names").
    pub fn loc(
        &self,
        layout: &NodeLayout,
        nodes: usize,
        register: RegisterId,
    ) -> Result<RegisterLoc, KvError> {
        let per = u64::from(layout.params.chunk_registers);
        let Some(record) = self.record(register / per) else {
            return crate::client::register_loc_for(layout, nodes, register);
        };
        let corrupted = || KvError::Corrupted { register };
        let id = layout.identity(register).ok_or_else(corrupted)?;
        let hash = xxh3_64(&register.to_le_bytes());
        let r = record.replicas.len();
        let (start, rotation) = ((hash % r as u64) as usize, hash / r as u64);
        let mut chosen = [NodeId(0); swarm_core::MAX_NODES + 1];
        let mut offsets = [(NodeId(0), 0u64); swarm_core::MAX_NODES + 1];
        let r = r.min(chosen.len());
        for i in 0..r {
            let spot = record.replicas[(start + i) % r];
            let node = NodeId(u16::from(spot.node));
            let header = layout
                .slot_key_header(u64::from(spot.slot), register % per)
                .ok_or_else(corrupted)?;
            chosen[i] = node;
            offsets[i] = (node, header + layout.params.key_header_bytes());
        }
        Ok(RegisterLoc::placed(
            id,
            Replicas::new(&chosen[..r], rotation)?,
            &offsets[..r],
        )?)
    }
}

/// Reads the placement table from a majority of the metadata group `0..meta`
/// (waiting `straggler_ns` for the others) and adopts it for a client at
/// configuration epoch `own_epoch` ([`Placements::adopt`]). A cluster without a
/// table has no records. Copies read while a record was written are read again,
/// after a growing pause, [`TABLE_REREADS`] times.
pub async fn read<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    meta: usize,
    own_epoch: u64,
    straggler_ns: Nanos,
) -> Result<Placements, KvError> {
    let Some(at) = layout.placements_at else {
        return Ok(Placements::computed());
    };
    let bytes = u32::try_from(layout.chunks() * RECORD_BYTES as u64)
        .map_err(|_| KvError::Unsupported("a placement table larger than 4 GiB"))?;
    let nodes = fabric.node_count();
    let mut pause = straggler_ns.max(1_000);
    let mut reread = 0;
    loop {
        let rt = broadcast_until_among(
            fabric,
            stats,
            node_ids(meta),
            majority(meta),
            straggler_ns,
            |_| Ok(Some(Batch::read(at, bytes))),
            |replies| replies.len() == meta,
        )
        .await?;
        let copies: Vec<(NodeId, &[u8])> = rt
            .replies()
            .iter()
            .map(|(node, completion)| (*node, completion.read(0).unwrap_or_default()))
            .collect();
        match Placements::adopt(layout, nodes, &copies, own_epoch) {
            Err(PlacementError::Torn { chunk }) if reread < TABLE_REREADS => {
                tracing::debug!(
                    chunk,
                    reread,
                    "placement record read while written: reading the table again"
                );
                reread += 1;
                drop(rt);
                swarm_core::sleep(fabric, pause).await;
                pause = pause.saturating_mul(2);
            }
            adopted => return Ok(adopted?),
        }
    }
}

/// [`read`] at the configuration a majority of the metadata group holds now (for
/// tools, which follow no configuration).
pub async fn read_current<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
) -> Result<Placements, KvError> {
    let stats = OpStats::new();
    let meta = layout.metadata_nodes(fabric.node_count());
    let straggler_ns = swarm_core::ProtocolConfig::default().slow_after_ns;
    let config = crate::repair::read_configuration_within(
        fabric,
        &stats,
        meta,
        majority(meta),
        straggler_ns,
    )
    .await?;
    read(fabric, &stats, layout, meta, config.epoch, straggler_ns).await
}

/// Writes `record` as chunk `chunk`'s placement on every node of the metadata group
/// `0..meta` (tests, and the coming writers of the table: add-node, rebalance),
/// waiting for each. Fails if the cluster has no table or the record no encoding.
#[doc(hidden)]
pub async fn write_record<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    meta: usize,
    chunk: u64,
    record: &PlacementRecord,
) -> Result<(), KvError> {
    let at = layout.placement_record(chunk).ok_or(KvError::Unsupported(
        "a placement record on a cluster without a table",
    ))?;
    let bytes = record.encode().ok_or(KvError::Unsupported(
        "a placement record without an encoding",
    ))?;
    swarm_core::quorum::broadcast(fabric, stats, node_ids(meta), meta, |_| {
        Ok(Batch::write(at, bytes.to_vec()))
    })
    .await?;
    Ok(())
}

/// Whether the copies of a chunk's placement record that a won claim read
/// (`crate::membership::claim::claim_reading`, on the nodes whose chunk word it
/// counted) show the record the claimer follows, `followed` (`None`: the computed
/// place): the newest of them must be exactly it. A copy that fails to decode (a
/// record being written) or two different records of one epoch also say no: the
/// claimer gives the chunk back rather than guess (`crate::registers::alloc`).
pub(crate) fn claimed_as_followed(copies: &[Vec<u8>], followed: Option<&PlacementRecord>) -> bool {
    let mut newest: Option<PlacementRecord> = None;
    for copy in copies {
        let Ok(record) = PlacementRecord::decode(copy) else {
            return false;
        };
        let Some(record) = record else { continue };
        match &newest {
            Some(n) if n.epoch > record.epoch => {}
            Some(n) if n.epoch == record.epoch && *n != record => return false,
            _ => newest = Some(record),
        }
    }
    newest.as_ref() == followed
}

/// The placement table a client follows, shared by its register paths and its index
/// (which reads key headers at a register's offsets): replaced whole when the client
/// follows a newer configuration, read on every location built.
#[derive(Clone, Debug, Default)]
pub struct SharedPlacements(Arc<RwLock<Arc<Placements>>>);

impl SharedPlacements {
    /// The table followed now.
    pub fn get(&self) -> Arc<Placements> {
        // A panic while holding the lock left a whole table (set replaces it at once).
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Follows `placements` from now on.
    pub fn set(&self, placements: Placements) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(placements);
    }

    /// [`Placements::loc`] in the table followed now.
    pub fn loc(
        &self,
        layout: &NodeLayout,
        nodes: usize,
        register: RegisterId,
    ) -> Result<RegisterLoc, KvError> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .loc(layout, nodes, register)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ClusterParams;

    /// 7 nodes of 3 replicas: two groups per band, one node of each band free
    /// (`NodeLayout::group_of`), 4 registers per chunk.
    fn layout() -> NodeLayout {
        NodeLayout::new(ClusterParams {
            placement_nodes: 7,
            placement_table: true,
            chunk_registers: 4,
            registers: 4 * 40,
            key_max: 8,
            value_max: 8,
            ..ClusterParams::default()
        })
        .unwrap()
    }

    /// The node band `band` leaves free.
    fn free(layout: &NodeLayout, band: u64) -> u8 {
        (0..7u8)
            .find(|&n| layout.group_of(usize::from(n), band).is_none())
            .unwrap()
    }

    /// A settled record of `epoch` on the free spots of bands `bands`.
    fn on_free(layout: &NodeLayout, epoch: u32, bands: [u64; 3]) -> PlacementRecord {
        PlacementRecord {
            epoch,
            replicas: bands
                .iter()
                .map(|&b| Spot {
                    node: free(layout, b),
                    slot: b as u32,
                })
                .collect(),
            destination: None,
        }
    }

    /// A table copy with `records` set.
    fn table(layout: &NodeLayout, records: &[(u64, &PlacementRecord)]) -> Vec<u8> {
        let mut bytes = vec![0u8; layout.chunks() as usize * RECORD_BYTES];
        for (chunk, record) in records {
            let at = *chunk as usize * RECORD_BYTES;
            bytes[at..at + RECORD_BYTES].copy_from_slice(&record.encode().unwrap());
        }
        bytes
    }

    fn adopt(
        layout: &NodeLayout,
        copies: &[Vec<u8>],
        own: u64,
    ) -> Result<Placements, PlacementError> {
        let copies: Vec<(NodeId, &[u8])> = copies
            .iter()
            .enumerate()
            .map(|(i, c)| (NodeId(i as u16), c.as_slice()))
            .collect();
        Placements::adopt(layout, 7, &copies, own)
    }

    /// Per chunk, the record of highest epoch at most the client's own among the
    /// copies read: a newer one on one copy only wins once the client follows its
    /// epoch, never before.
    #[test]
    fn the_highest_record_at_most_the_own_epoch_is_adopted() {
        let l = layout();
        let (old, new) = (on_free(&l, 1, [0, 1, 2]), on_free(&l, 2, [3, 4, 5]));
        let with_old = table(&l, &[(9, &old)]);
        let with_new = table(&l, &[(9, &new)]);
        let copies = [with_old.clone(), with_new, with_old];
        assert_eq!(adopt(&l, &copies, 1).unwrap().record(9), Some(&old));
        assert_eq!(adopt(&l, &copies, 2).unwrap().record(9), Some(&new));
        assert_eq!(adopt(&l, &copies, 0).unwrap().recorded(), 0);
        let none = adopt(&l, &[table(&l, &[])], 5).unwrap();
        assert_eq!(none, Placements::computed());
    }

    /// A recorded register lives where its record says: its record's nodes, each
    /// at its own slot, named by its computed address; an unrecorded one where the
    /// layout computes it.
    #[test]
    fn a_recorded_register_is_at_its_slots_and_keeps_its_name() {
        let l = layout();
        let record = on_free(&l, 1, [0, 1, 2]);
        let placements = adopt(&l, &[table(&l, &[(9, &record)])], 1).unwrap();
        let register = 9 * 4 + 3;
        let loc = placements.loc(&l, 7, register).unwrap();
        assert_eq!(Some(loc.id), l.register(register));
        for spot in &record.replicas {
            let node = NodeId(u16::from(spot.node));
            let header = l.slot_key_header(u64::from(spot.slot), 3).unwrap();
            assert_eq!(
                loc.offset_on(node),
                Some(header + l.params.key_header_bytes())
            );
            assert_eq!(l.header_on(&loc, node), Some(header));
        }
        let computed = crate::client::register_loc_for(&l, 7, 8 * 4).unwrap();
        assert_eq!(placements.loc(&l, 7, 8 * 4).unwrap(), computed);
    }

    /// Records that do not fit the cluster, or that would share memory with another
    /// chunk (recorded, or computed and unrecorded), are refused, as is a move.
    #[test]
    fn records_that_do_not_fit_or_overlap_are_refused() {
        let l = layout();
        let ok = on_free(&l, 1, [0, 1, 2]);
        let refused = |records: &[(u64, &PlacementRecord)]| adopt(&l, &[table(&l, records)], 1);
        assert!(refused(&[(9, &ok)]).is_ok());
        assert!(matches!(
            refused(&[(9, &ok), (10, &ok)]),
            Err(PlacementError::Overlap { other: 9, .. })
        ));
        // Band 0's node 0 holds chunk 0 (computed, unrecorded): taken.
        let mut on_computed = ok.clone();
        on_computed.replicas[0] = Spot { node: 0, slot: 0 };
        assert!(matches!(
            refused(&[(9, &on_computed)]),
            Err(PlacementError::Overlap { other: 0, .. })
        ));
        // Unless chunk 0 is recorded elsewhere: its computed memory is free then.
        let zero_moved = on_free(&l, 1, [3, 4, 5]);
        assert!(refused(&[(9, &on_computed), (0, &zero_moved)]).is_ok());
        let mut far = ok.clone();
        far.replicas[1].slot = l.slots() as u32;
        assert!(matches!(
            refused(&[(9, &far)]),
            Err(PlacementError::Misfit { .. })
        ));
        let mut absent = ok.clone();
        absent.replicas[1].node = 7;
        assert!(matches!(
            refused(&[(9, &absent)]),
            Err(PlacementError::Misfit { .. })
        ));
        let one = PlacementRecord {
            replicas: ok.replicas[..1].to_vec(),
            ..ok.clone()
        };
        assert!(matches!(
            refused(&[(9, &one)]),
            Err(PlacementError::Misfit { .. })
        ));
        let joint = PlacementRecord {
            destination: Some(on_free(&l, 1, [3, 4, 5]).replicas),
            ..ok.clone()
        };
        assert!(matches!(
            refused(&[(9, &joint)]),
            Err(PlacementError::Joint { chunk: 9 })
        ));
        // A copy read while written is reread, not skipped.
        let mut torn = table(&l, &[(9, &ok)]);
        torn[9 * RECORD_BYTES + 9] ^= 1;
        assert!(matches!(
            adopt(&l, &[table(&l, &[(9, &ok)]), torn], 1),
            Err(PlacementError::Torn { chunk: 9 })
        ));
    }

    /// The table as clients read it from a cluster: records written to the metadata
    /// group are adopted at their epoch; a cluster without a table (before version
    /// 10) has none and reads nothing.
    #[test]
    fn a_written_table_is_read_back_and_a_cluster_without_one_reads_nothing() {
        use swarm_core::block_on;
        let l = layout();
        let cluster = swarm_core::MemCluster::new(7, l.end() as usize);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let record = on_free(&l, 2, [0, 1, 2]);
        block_on(&fabric, write_record(&fabric, &stats, &l, 7, 9, &record)).unwrap();
        let at = |own| block_on(&fabric, read(&fabric, &stats, &l, 7, own, 1_000_000)).unwrap();
        assert_eq!(at(1).recorded(), 0, "not published at epoch 1");
        assert_eq!(at(2).record(9), Some(&record));
        let old = NodeLayout::new(ClusterParams {
            placement_table: false,
            ..l.params
        })
        .unwrap();
        assert_eq!(old.placements_at, None);
        assert_eq!(
            block_on(&fabric, read(&fabric, &stats, &old, 7, 2, 1_000_000)).unwrap(),
            Placements::computed()
        );
    }
}
