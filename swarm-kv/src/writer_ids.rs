//! The client table: writer ids and leases in disaggregated memory (DESIGN.md §5,
//! LOCO's one-row-per-client idea).
//!
//! Every client thread that writes needs a writer id: it names the thread's
//! out-of-place log and breaks timestamp ties (SWARM §3.2). Two live clients must never
//! share one, so a client claims a row of the table on a majority of nodes
//! ([`crate::claim`]) with a token unique to its incarnation.
//!
//! Row layout (64 bytes, same on every node):
//!
//! | word | meaning |
//! |---:|---|
//! | 0 | claim: 0 free, else the owner's incarnation token |
//! | 1 | lease: Unix ns of the owner's last heartbeat |
//! | 2 | pid of the owner (informational) |
//! | 3 | 1 once the row has ever been used (its log may hold live buffers) |
//!
//! A client that stops cleanly gives its row back. The next client that claims a
//! used row *resumes* its log: it scans the log on a majority of nodes and marks every
//! slot holding a record as used, and starts its timestamps above the largest one it
//! finds, so no buffer that a register may still point to is overwritten
//! ([`swarm_core::Client::resume`]). Rows of clients that crashed keep their claim;
//! they are reclaimed by memory recycling (a later issue), which can tell when their
//! buffers are no longer referenced.

use swarm_core::encoding::Tsp;
use swarm_core::{Batch, Fabric, FabricError, NodeId, OpStats, Roundtrip};

use crate::KvError;
use crate::claim::{Claim, claim};
use crate::layout::NodeLayout;

/// Word offsets inside a row.
const LEASE: u64 = 8;
const USED: u64 = 24;

/// Bytes read per READ while scanning a log.
const SCAN_CHUNK: u64 = 4 << 20;

/// A claimed row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The writer id (row number).
    pub writer: u16,
    /// Whether the row was used before: its log must be resumed.
    pub reused: bool,
}

/// Claims a free row for the incarnation `token`.
pub async fn register<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    pid: u64,
    now_unix_ns: u64,
) -> Result<Registration, KvError> {
    let stats = OpStats::new();
    for row in 0..layout.params.writers {
        let at = layout.client_row(row);
        if claim(fabric, &stats, nodes, at, token).await? != Claim::Won {
            continue;
        }
        // Was the row used before? Read the used word from a majority.
        let mut rt = Roundtrip::start(fabric, &stats);
        for node in 0..nodes {
            rt.post(NodeId(node as u16), Batch::read(at + USED, 8))?;
        }
        rt.wait(nodes / 2 + 1).await?;
        let reused = rt
            .replies()
            .iter()
            .any(|(_, c)| c.read(0).is_some_and(|b| b.iter().any(|&x| x != 0)));
        drop(rt);
        let mut info = Vec::with_capacity(24);
        info.extend_from_slice(&now_unix_ns.to_le_bytes());
        info.extend_from_slice(&pid.to_le_bytes());
        info.extend_from_slice(&1u64.to_le_bytes());
        let mut rt = Roundtrip::start(fabric, &stats);
        for node in 0..nodes {
            rt.post(NodeId(node as u16), Batch::write(at + LEASE, info.clone()))?;
        }
        rt.wait(nodes / 2 + 1).await?;
        return Ok(Registration {
            writer: row,
            reused,
        });
    }
    Err(KvError::WritersFull {
        writers: layout.params.writers,
    })
}

/// Renews the lease of `writer` (posted, not awaited).
pub fn heartbeat<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
    now_unix_ns: u64,
) {
    for node in 0..nodes {
        swarm_core::roundtrip::post_background(
            fabric,
            NodeId(node as u16),
            Batch::write(
                layout.client_row(writer) + LEASE,
                now_unix_ns.to_le_bytes().to_vec(),
            ),
        );
    }
}

/// Gives the row back (clean shutdown).
pub fn unregister<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
    token: u64,
) {
    crate::claim::release(fabric, nodes, layout.client_row(writer), token);
}

/// A row as read from one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The writer id.
    pub writer: u16,
    /// Owner token (0: free).
    pub token: u64,
    /// Last heartbeat, Unix ns.
    pub lease_unix_ns: u64,
    /// Owner pid.
    pub pid: u64,
    /// Ever used.
    pub used: bool,
}

/// Reads the whole client table from `node` (for `swarm stat`).
pub async fn read_table<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    node: NodeId,
) -> Result<Vec<Row>, FabricError> {
    let stats = OpStats::new();
    let bytes = u64::from(layout.params.writers) * crate::layout::CLIENT_ROW_BYTES;
    let mut rt = Roundtrip::start(fabric, &stats);
    rt.post(node, Batch::read(layout.clients_at, bytes as u32))?;
    rt.wait(1).await?;
    let data = rt.replies()[0].1.read(0).unwrap_or_default().to_vec();
    let word = |row: usize, w: usize| {
        let at = row * 64 + w * 8;
        data.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .unwrap_or(0)
    };
    Ok((0..usize::from(layout.params.writers))
        .map(|row| Row {
            writer: row as u16,
            token: word(row, 0),
            lease_unix_ns: word(row, 1),
            pid: word(row, 2),
            used: word(row, 3) != 0,
        })
        .collect())
}

/// What an earlier incarnation left in a writer's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    /// Slots holding a record on some node.
    pub used_slots: Vec<u32>,
    /// The largest tick count of any record.
    pub last_ticks: u64,
}

/// Scans `writer`'s log on a majority of nodes (see the module docs).
pub async fn scan_log<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
) -> Result<LogScan, KvError> {
    let swarm = &layout.swarm;
    let Some(first) = swarm_core::encoding::WriterId::new(u32::from(writer))
        .ok()
        .and_then(|w| swarm.slot_addr(w, 0))
    else {
        return Ok(LogScan::default());
    };
    let slot_bytes = swarm.slot_bytes();
    let slots = u64::from(swarm.slots_per_writer());
    let total = slots * slot_bytes;
    let per_read = (SCAN_CHUNK / slot_bytes).max(1) * slot_bytes;
    let mut used = vec![false; slots as usize];
    let mut last_ticks = 0;
    let stats = OpStats::new();
    let mut offset = 0;
    while offset < total {
        let len = per_read.min(total - offset);
        let mut rt = Roundtrip::start(fabric, &stats);
        for node in 0..nodes {
            rt.post(NodeId(node as u16), Batch::read(first + offset, len as u32))?;
        }
        rt.wait(nodes / 2 + 1).await?;
        for (_, completion) in rt.replies() {
            let Some(data) = completion.read(0) else {
                continue;
            };
            for (i, slot) in data.chunks(slot_bytes as usize).enumerate() {
                // The record's tsp is the word after the lock word.
                let Some(word) = slot.get(8..16) else {
                    continue;
                };
                let tsp = Tsp::from_word(u64::from_le_bytes(word.try_into().unwrap_or([0; 8])));
                if !tsp.is_empty() {
                    used[(offset / slot_bytes) as usize + i] = true;
                    if !tsp.is_tombstone() {
                        last_ticks = last_ticks.max(tsp.ts().ticks());
                    }
                }
            }
        }
        offset += len;
    }
    Ok(LogScan {
        used_slots: used
            .iter()
            .enumerate()
            .filter(|(_, u)| **u)
            .map(|(i, _)| i as u32)
            .collect(),
        last_ticks,
    })
}
