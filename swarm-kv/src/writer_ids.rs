//! The client table: writer ids and leases in disaggregated memory (LOCO's
//! one-row-per-client idea; its place on a node is in [`crate::layout`]).
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
//! used row *resumes* its log: it scans the log on every node that answers
//! ([`swarm_core::resume::scan_log`], waiting [`RESUME_STRAGGLER_NS`] for
//! nodes beyond a majority, since a write the earlier client abandoned may sit on one
//! node only), marks every slot holding a record or a lock as used, and starts its
//! timestamps above the largest one it finds, so no buffer that a register may still
//! point to is overwritten and no timestamp repeats ([`swarm_core::Client::resume`]).
//! Rows of clients that crashed keep their claim until an operator gives them back
//! with `swarm evict` ([`evict`], after the lease has been idle long enough);
//! automatic reclaim needs self-fencing leases, which are not built yet.

use swarm_core::fabric::Nanos;
use swarm_core::quorum::{broadcast, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, NodeId, OpStats, Roundtrip};

use crate::KvError;
use crate::claim::{Claim, claim};
use crate::layout::NodeLayout;

/// Word offsets inside a row.
const LEASE: u64 = 8;
const USED: u64 = 24;

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
        // Was the row used before? Read the used word from a majority: a client writes
        // it to a majority (below) before it writes anything to its log.
        let rt = broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
            Ok(Batch::read(at + USED, 8))
        })
        .await?;
        let reused = rt
            .replies()
            .iter()
            .any(|(_, c)| c.read(0).is_some_and(|b| b.iter().any(|&x| x != 0)));
        drop(rt);
        let mut info = Vec::with_capacity(24);
        info.extend_from_slice(&now_unix_ns.to_le_bytes());
        info.extend_from_slice(&pid.to_le_bytes());
        info.extend_from_slice(&1u64.to_le_bytes());
        broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
            Ok(Batch::write(at + LEASE, info.clone()))
        })
        .await?;
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
        swarm_core::post_background(
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

/// What [`evict`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Eviction {
    /// The writer id was not registered: nothing to do.
    NotRegistered,
    /// The row was given back on behalf of its owner, idle this long.
    Released {
        /// Seconds since the owner's last lease renewal.
        idle_secs: f64,
    },
}

/// Gives back the row of `writer`, registered by a client that crashed (its lease
/// was last renewed at least `min_idle_ns` ago on the caller's clock), so that a new
/// client can claim the writer id; the next owner resumes its log like after a clean
/// stop. Nothing stops a client that is only paused: it keeps the id it believes it
/// holds, and two clients with one writer id break linearizability. Hence the idle
/// time, which should exceed any pause the deployment expects plus the clock skew
/// between hosts. (Automatic reclaim with self-fencing leases is not built yet.)
pub async fn evict<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
    min_idle_ns: u64,
    now_unix_ns: u64,
) -> Result<Eviction, KvError> {
    if writer >= layout.params.writers {
        return Err(KvError::NoSuchWriter {
            writer,
            writers: layout.params.writers,
        });
    }
    let stats = OpStats::new();
    let at = layout.client_row(writer);
    let rt = broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::read(at, 16))
    })
    .await?;
    let (mut token, mut lease) = (0, 0);
    for (_, completion) in rt.replies() {
        let bytes = completion.read(0).unwrap_or_default();
        let word = |i: usize| {
            bytes
                .get(i * 8..i * 8 + 8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        };
        // A claim is won on a majority: any non-zero token seen is the owner's.
        token = token.max(word(0));
        lease = lease.max(word(1));
    }
    drop(rt);
    if token == 0 {
        return Ok(Eviction::NotRegistered);
    }
    let idle_ns = now_unix_ns.saturating_sub(lease);
    if idle_ns < min_idle_ns {
        return Err(KvError::LeaseFresh {
            writer,
            idle_secs: idle_ns as f64 / 1e9,
            min_idle_secs: min_idle_ns / 1_000_000_000,
        });
    }
    broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::cas(at, token, 0))
    })
    .await?;
    Ok(Eviction::Released {
        idle_secs: idle_ns as f64 / 1e9,
    })
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
            block_on(&fabric, register(&fabric, &layout, 3, token, 1, 0)).expect("a free row")
        };
        let first = register(11);
        assert_eq!((first.writer, first.reused), (0, false));
        assert_eq!(register(22).writer, 1, "row 0 is taken");
        unregister(&fabric, &layout, 3, first.writer, 11);
        let again = register(33);
        assert_eq!((again.writer, again.reused), (0, true));
    }

    #[test]
    fn a_crashed_clients_row_is_evicted_only_once_its_lease_is_idle_long_enough() {
        const S: u64 = 1_000_000_000;
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        // A client registers with its lease at t = 100 s, then crashes (never gives
        // its row back); the next client gets another row.
        let crashed =
            block_on(&fabric, register(&fabric, &layout, 3, 11, 1, 100 * S)).expect("a free row");
        assert_eq!(crashed.writer, 0);
        let next = block_on(&fabric, register(&fabric, &layout, 3, 22, 2, 100 * S));
        assert_eq!(next.expect("a free row").writer, 1);
        let evict_at =
            |writer, now| block_on(&fabric, evict(&fabric, &layout, 3, writer, 60 * S, now));
        // Idle 30 s: presumed alive.
        assert!(matches!(
            evict_at(0, 130 * S),
            Err(KvError::LeaseFresh {
                writer: 0,
                min_idle_secs: 60,
                ..
            })
        ));
        assert!(matches!(evict_at(2, 130 * S), Ok(Eviction::NotRegistered)));
        assert!(matches!(
            evict_at(64, 130 * S),
            Err(KvError::NoSuchWriter { writer: 64, .. })
        ));
        // Idle 61 s: given back; the next client resumes its log.
        assert!(matches!(
            evict_at(0, 161 * S),
            Ok(Eviction::Released { idle_secs }) if idle_secs == 61.0
        ));
        let again = block_on(&fabric, register(&fabric, &layout, 3, 33, 3, 162 * S));
        assert_eq!(again.ok().map(|r| (r.writer, r.reused)), Some((0, true)));
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
