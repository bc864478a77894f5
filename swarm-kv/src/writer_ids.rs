//! The client table: writer ids and leases in disaggregated memory (LOCO's
//! one-row-per-client idea; its place on a node is in [`crate::layout`]).
//!
//! Every client thread that writes needs a writer id: it names the thread's
//! out-of-place log and breaks timestamp ties (SWARM §3.2). Two live clients must never
//! share one, so a client claims a row of the table on a majority of nodes
//! ([`crate::claim`]) with a token unique to its incarnation, and holds it with a
//! lease ([`crate::lease`]): it stops issuing operations when it cannot prove its lease
//! valid, so that a row whose lease expired can be taken over ([`crate::reclaim`]).
//!
//! Row layout (64 bytes, same on every node):
//!
//! | word | meaning |
//! |---:|---|
//! | 0 | claim: 0 free, else the owner's incarnation token |
//! | 1 | lease word: renewal counter, bit 63 set once killed by a reclaimer ([`crate::lease`]) |
//! | 2 | pid of the owner (informational) |
//! | 3 | 1 once the row has ever been used (its log may hold live buffers) |
//! | 4 | reserved: the writer's timestamp floor (reserved for a bounded log resume, not used yet) |
//! | 5 | the owner's wall clock at its last renewal, Unix ns (informational: `swarm stat`) |
//! | 6, 7 | reserved for leases |
//!
//! A client that stops cleanly gives its row back. A client that finds every row
//! claimed watches them for a lease period and takes over one whose owner did not
//! renew ([`crate::reclaim::reclaim_expired`]). The next client of a used row,
//! given back or taken over, *resumes* its log: it scans the log on every node that
//! answers ([`swarm_core::resume::scan_log`], waiting [`RESUME_STRAGGLER_NS`] for
//! nodes beyond a majority, since a write the earlier client abandoned may sit on one
//! node only), marks every slot holding a record or a lock as used, and starts its
//! timestamps above the largest one it finds, so no buffer that a register may still
//! point to is overwritten and no timestamp repeats ([`swarm_core::Client::resume`]):
//! a dead client's values that are still current stay readable.

use swarm_core::fabric::Nanos;
use swarm_core::quorum::{broadcast, broadcast_until, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, NodeId, OpStats, Roundtrip};

use crate::KvError;
use crate::claim::{Claim, claim};
use crate::layout::NodeLayout;
use crate::lease::{LeaseKeeper, LeaseParams};
use crate::lease_renewal::{LeaseHolder, RENEWED_UNIX, renew_now};
use crate::reclaim::{STRAGGLER_NS, reclaim_expired};

/// Word offsets inside a row.
const PID: u64 = 16;

/// How long resuming a log waits for each node beyond the first majority, on the
/// fabric's clock. Generous: it is paid once per client start, and only when a node
/// is down; a node slower than this is read as if it had failed (see the module docs).
pub const RESUME_STRAGGLER_NS: Nanos = 100_000_000;

/// A claimed row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The writer id (row number).
    pub writer: u16,
    /// Whether the row was used before: its log must be resumed.
    pub reused: bool,
}

/// Claims a free row for the incarnation `token`, or, when every row is claimed,
/// takes over the row of a client whose lease expired (which takes a lease period:
/// [`LeaseParams::observer_wait_ns`]). Returns the row and its lease, renewed.
pub async fn register<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    pid: u64,
) -> Result<(Registration, LeaseHolder), KvError> {
    let lease = LeaseParams::from_params(&layout.params);
    let stats = OpStats::new();
    let mut row = claim_free_row(fabric, layout, nodes, token, &stats).await?;
    if row.is_none() {
        tracing::info!("every writer id is claimed: looking for clients whose lease expired");
        let reclaimed = reclaim_expired(fabric, layout, &lease, Some(token), None).await?;
        row = reclaimed.taken.map(|r| r.writer);
        if row.is_none() && !reclaimed.released.is_empty() {
            // Another reclaimer took the dead row we tried and released the others
            // before us: they are free now.
            row = claim_free_row(fabric, layout, nodes, token, &stats).await?;
        }
    }
    let Some(writer) = row else {
        return Err(KvError::WritersFull {
            writers: layout.params.writers,
        });
    };
    let at = layout.client_row(writer);
    // The row's lease words and used flag, from every node that answers: a client
    // writes the used flag to a majority (below) before it writes to its log.
    let rt = broadcast_until(
        fabric,
        &stats,
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(at, 32))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut seen = vec![None; nodes];
    let mut reused = false;
    for (node, completion) in rt.replies() {
        let bytes = completion.read(0).unwrap_or_default();
        let word = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        };
        if let Some(slot) = seen.get_mut(node.index()) {
            *slot = word(1);
        }
        reused |= word(3).is_some_and(|w| w != 0);
    }
    drop(rt);
    let holder = core::cell::RefCell::new(LeaseHolder::new(
        LeaseKeeper::new(lease, seen),
        at,
        token,
        nodes,
    ));
    // The first renewal may meet a reclaimer's kill of the previous owner's lease,
    // which teaches the words to CAS from: a few attempts.
    for _ in 0..4 {
        renew_now(&holder, fabric, 0).await;
        if holder.borrow().valid_until().is_some() {
            break;
        }
    }
    if holder.borrow().valid_until().is_none() {
        crate::claim::release(fabric, nodes, at, token);
        return Err(KvError::LeaseExpired { writer });
    }
    let mut info = Vec::with_capacity(16);
    info.extend_from_slice(&pid.to_le_bytes());
    info.extend_from_slice(&1u64.to_le_bytes());
    broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::write(at + PID, info.clone()))
    })
    .await?;
    Ok((Registration { writer, reused }, holder.into_inner()))
}

/// Claims the first free row for `token`, if any.
async fn claim_free_row<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    stats: &OpStats,
) -> Result<Option<u16>, KvError> {
    for writer in 0..layout.params.writers {
        if claim(fabric, stats, nodes, layout.client_row(writer), token).await? == Claim::Won {
            return Ok(Some(writer));
        }
    }
    Ok(None)
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

/// What [`evict`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Eviction {
    /// The writer id was not registered: nothing to do.
    NotRegistered,
    /// The row was given back: its owner's lease had expired (or was killed, with
    /// `force`), and the longest lease it may still believe in has passed.
    Released,
}

/// Gives back the row of `writer` so that a new client can claim it; the next owner
/// resumes its log like after a clean stop. Without `force`, the row is watched for a
/// lease period ([`LeaseParams::observer_wait_ns`]) and released only if its owner did
/// not renew ([`KvError::LeaseFresh`] otherwise). With `force`, the lease is killed at
/// once (a live owner stops at its next renewal with [`KvError::LeaseExpired`]) and
/// the row released after the same wait. Either way two clients never share an id.
pub async fn evict<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    writer: u16,
    force: bool,
) -> Result<Eviction, KvError> {
    if writer >= layout.params.writers {
        return Err(KvError::NoSuchWriter {
            writer,
            writers: layout.params.writers,
        });
    }
    let lease = LeaseParams::from_params(&layout.params);
    if force {
        return Ok(
            if crate::reclaim::evict_now(fabric, layout, &lease, writer).await? {
                Eviction::Released
            } else {
                Eviction::NotRegistered
            },
        );
    }
    let reclaimed = reclaim_expired(fabric, layout, &lease, None, Some(writer)).await?;
    if reclaimed.released.contains(&writer) {
        Ok(Eviction::Released)
    } else if reclaimed.alive.contains(&writer) {
        Err(KvError::LeaseFresh {
            writer,
            watched_secs: lease.observer_wait_ns() as f64 / 1e9,
        })
    } else {
        Ok(Eviction::NotRegistered)
    }
}

/// A row as read from one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The writer id.
    pub writer: u16,
    /// Owner token (0: free).
    pub token: u64,
    /// The lease word (renewal counter; bit 63: killed).
    pub lease: u64,
    /// The owner's wall clock at its last renewal, Unix ns (0: never renewed).
    pub renewed_unix_ns: u64,
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
            lease: word(row, 1),
            renewed_unix_ns: word(row, (RENEWED_UNIX / 8) as usize),
            pid: word(row, 2),
            used: word(row, 3) != 0,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use swarm_core::FixedClock;
    use swarm_core::encoding::WriterId;
    use swarm_core::resume::scan_log;
    use swarm_core::{MemCluster, MemFabric};
    use swarm_core::{OpStats, block_on};

    use super::*;
    use crate::layout::ClusterParams;
    use crate::{KvClient, KvConfig};

    const NODE_BYTES: u64 = 4 << 20;

    fn cluster() -> (MemCluster, NodeLayout) {
        let params = ClusterParams::default()
            .for_node_size(NODE_BYTES)
            .expect("a 4 MiB node fits a small cluster");
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, NODE_BYTES as usize);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        (cluster, layout)
    }

    fn connect(cluster: &MemCluster, layout: NodeLayout) -> KvClient<MemFabric, FixedClock> {
        // Every incarnation reads the same clock: without resuming, the second one
        // would guess the very timestamps (and slots) the first one used.
        KvClient::connect(
            cluster.client(),
            FixedClock(1_000),
            layout,
            KvConfig::new(0, 1),
        )
        .expect("a free writer id")
    }

    /// Every slot of `writer`'s log that holds anything, with its bytes on each node.
    fn log_contents(fabric: &MemFabric, layout: &NodeLayout, writer: u16) -> Vec<Vec<u8>> {
        let w = WriterId::new(u32::from(writer)).expect("a writer id");
        let stats = OpStats::new();
        let scan = block_on(fabric, scan_log(fabric, &stats, &layout.swarm, w, 0))
            .expect("three live nodes");
        let slot_bytes = layout.swarm.slot_bytes() as u32;
        let mut contents = Vec::new();
        for slot in scan.used_slots {
            let at = layout.swarm.slot_addr(w, slot).expect("in the log");
            let rt = block_on(
                fabric,
                broadcast(fabric, &stats, node_ids(3), 3, |_| {
                    Ok(Batch::read(at, slot_bytes))
                }),
            )
            .expect("three live nodes");
            for node in node_ids(3) {
                let (_, completion) = rt
                    .replies()
                    .iter()
                    .find(|(n, _)| *n == node)
                    .expect("every node answered");
                contents.push(completion.read(0).unwrap_or_default().to_vec());
            }
        }
        contents
    }

    #[test]
    fn a_row_given_back_is_claimed_again_as_used() {
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        let register = |token| {
            block_on(&fabric, register(&fabric, &layout, 3, token, 1))
                .expect("a free row")
                .0
        };
        let first = register(11);
        assert_eq!((first.writer, first.reused), (0, false));
        assert_eq!(register(22).writer, 1, "row 0 is taken");
        unregister(&fabric, &layout, 3, first.writer, 11);
        let again = register(33);
        assert_eq!((again.writer, again.reused), (0, true));
    }

    #[test]
    fn evicting_a_row_nobody_holds_or_that_does_not_exist() {
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        assert!(matches!(
            block_on(&fabric, evict(&fabric, &layout, 2, false)),
            Ok(Eviction::NotRegistered)
        ));
        assert!(matches!(
            block_on(&fabric, evict(&fabric, &layout, 64, true)),
            Err(KvError::NoSuchWriter { writer: 64, .. })
        ));
    }

    #[test]
    fn a_reused_writer_id_leaves_the_earlier_log_alone() {
        let (cluster, layout) = cluster();
        let stats = OpStats::new();
        let first = connect(&cluster, layout);
        for key in [&b"a"[..], b"b"] {
            block_on(first.fabric(), first.insert(key, b"first", &stats)).expect("inserted");
        }
        let writer = first.writer();
        first.close();
        let fabric = cluster.client();
        let before = log_contents(&fabric, &layout, writer);
        assert!(!before.is_empty(), "the first client wrote to its log");

        let second = connect(&cluster, layout);
        assert_eq!(second.writer(), writer, "the row was given back and reused");
        for key in [&b"c"[..], b"d"] {
            block_on(second.fabric(), second.insert(key, b"second", &stats)).expect("inserted");
        }
        let after = log_contents(&fabric, &layout, writer);
        assert!(after.len() > before.len(), "the second client wrote too");
        for slot in &before {
            assert!(
                after.contains(slot),
                "a slot of the first client was overwritten by the second"
            );
        }
        for key in [&b"a"[..], b"b"] {
            assert_eq!(
                block_on(second.fabric(), second.get(key, &stats)).expect("read"),
                Some(b"first".to_vec())
            );
        }
    }
}
