//! Online repair: rebuilding a memory node that lost its memory, from the others,
//! while clients keep running, and admitting it back with a configuration change
//! (issue 12, item 3).
//!
//! # Why a lost node cannot simply be wiped and reused
//!
//! Quorum protocols tolerate a node that *missed* operations, never one that forgot
//! them: a write acknowledged by `{A, X}`, then `X` restarted empty, then a read on
//! `{B, X}` misses it. So a node whose memory was lost stays out of service
//! ([`crate::configuration`]: its new incarnation is not a member) until this module
//! has rebuilt it into a state it could have reached as an ordinary node that merely
//! missed some operations, with every value decided on a majority restored. Then a
//! configuration change (epoch `e + 2`, listing its new incarnation) admits it.
//!
//! # The procedure ([`repair_node`])
//!
//! 0. **Lock**: take the repair lock on every donor ([`lock`]), and give it back at
//!    the end, whatever the outcome. Every step below runs under it, so that a
//!    repair stopped anywhere (SIGSTOP) and waking up later never lands a
//!    configuration record or a piece after a later repair's: a later repair waits
//!    until this one is known gone. The node must answer before the announcement.
//! 1. Read the configuration `e` (a majority's newest copy); the node's new
//!    incarnation must not be a member yet. The *donors* are every other node (with
//!    a metadata group, `crate::layout::ClusterParams::metadata_nodes`, the lock, the
//!    configuration records and the metadata areas are those of the group's other
//!    nodes only, and a node outside the group gets no metadata: a value decided on
//!    a majority of the group is on one of its other nodes): all must answer (a majority would do for the argument below in clusters where every
//!    node holds every register; asking all keeps one rule for registers placed on a
//!    subset of nodes, at the price of not repairing while a second node is down).
//!    **Announce** the repair: write configuration `e + 1`, the same members with the
//!    node's *repairing* bit set, to every donor. While a node is out of service,
//!    clients reset recycled registers on the other replicas only
//!    ([`crate::registers::recycle`], "a node out of service"); a reset that lands on the donors
//!    after the copy read them would leave the rebuilt node with the register's old
//!    words. Clients see the announcement in their lease renewals, and before the
//!    wait below ends they journal every reset that leaves the node out
//!    ([`crate::registers::journal`]): the repair reads the journal between the pieces of its
//!    copy (and during the wait), copies each journaled register again, and only
//!    then lets its client reuse it.
//! 2. **Quiesce**: wait [`quiescence_ns`] on the fabric's clock: a lease observer's
//!    whole wait (`lease·(1 + 1/8)` plus a grace) plus an operation's deadline, the
//!    drift allowance and the delivery margin. A client whose lease is valid after
//!    the wait renewed it after the announcement, so it saw the repairing bit; the
//!    resets it posted before have landed. The lost memory was gone before the
//!    repair started (the node was replaced, or its file retired, `swarm-shm`), so
//!    every action taken on an *observation* of the lost memory — an operation that
//!    counted its reply towards a quorum, a reclaimer that read its lease word and
//!    will kill it after its wait — has landed on the donors by then. Without this
//!    wait, a TRYLOCK that counted the lost node's WRITE and then wrote a donor after
//!    the copy read it could leave both lock modes winning.
//! 3. **Copy**, area by area, in pieces of up to 1 MiB: read the piece from every
//!    donor, merge the copies word by word ([`merge`] has the rule for each kind of
//!    word and its argument), write the result to the node. Areas: the superblock
//!    (re-encoded from the parameters), the client table, the chunk table, the index,
//!    the registers the node replicates (others stay zero), the logs, the log
//!    summaries.
//! 4. **Admit**: write the configuration `e + 2` (the node's new incarnation listed,
//!    its repairing bit clear) to every donor — a majority of the members of `e` — then to the node itself.
//!    Running clients see the new epoch in their next lease renewal and admit the
//!    node ([`swarm_core::Fabric::admit`]); new clients open with it.
//!
//! A repair that fails after its announcement and before its admission (a donor
//! or the node stops answering) **withdraws** the announcement: configuration
//! `e + 2` with the same members and the repairing bit clear, on the donors that
//! answer. Clients then treat the node as lost again, and the registers whose resets
//! they journaled come back; the entries stay for the next repair, which services
//! them. Running `swarm repair` again resumes from there.
//!
//! # Why it is correct
//!
//! *Every decided value survives.* A value decided on a majority `M` (a write, an
//! index change, a claim, a lock, a kill) either had the lost node in `M` — then
//! `M` minus that node is at least a majority minus one of the donors, so every
//! donor set that is a majority of the cluster without the node meets it — or not,
//! and then it is on the donors themselves. Each merge rule keeps any value that
//! shows in one donor and was decided (max registers keep the largest, claims keep a
//! sole owner, acceptors keep the highest accepted proposal).
//!
//! *Writes racing the copy.* Until step 4, no client uses the node (its incarnation
//! is not a member), so every operation that completes during the copy is decided on
//! a majority of the *other* nodes. The node may end up without it (its piece was
//! copied before): it is then exactly a node that missed that operation, and every
//! later quorum that includes it also includes one of the nodes the operation
//! reached. The merge of a piece reads the donors at slightly different times, so
//! its result may combine states of different moments; each rule is per word and
//! yields a value some donor held, or a *poison* that makes the node answer like a
//! crashed one for that word (claims and lock words whose donors disagree).
//!
//! *Registers recycled during the repair* come back through the journal: the
//! argument is in [`crate::registers::journal`] (a journaled reset landed on every donor
//! before its entry was written; the register is reused only after the repair
//! copied it again, between two pieces, or after the admission once its client
//! reset it on the node).
//!
//! *A client with the old configuration* treats the node as failed: its quorums are
//! majorities of the other nodes, which is always safe. A client with the new one
//! reads the node as a lagging replica.
//!
//! *A second failure during the repair.* A donor that does not answer stops the
//! repair with [`RepairError::Donor`] before anything is admitted; the node stays
//! out, and the repair can be run again once the donor is back (the copy is
//! idempotent: it overwrites the node's pieces). A failure of the node itself stops
//! the repair likewise. Losing a donor *after* the new configuration reached a
//! majority is an ordinary failure of a member.
//!
//! *A stopped repair.* Configuration records and pieces are plain writes: a stopped
//! repair's late ones would replace what a second repair of the node installed
//! (the donors' epoch lowered below its admission, a rebuilt node overwritten while
//! it serves). The repair lock ([`lock`], which has the argument) lets no second
//! repair start until the first is known gone, and a repair that wins it after a
//! stop reads the configuration afresh.
//!
//! *Index scrub.* The rebuilt node's index slots may lag behind operations that
//! raced the copy, as a node that was down would; `swarm scrub`
//! (`index/scrub.rs`) moves them forward.

pub(crate) mod lock;
#[cfg(test)]
mod lock_tests;
pub mod merge;
#[cfg(test)]
mod quorum_tests;

use std::time::Instant;

use std::task::Poll;

use swarm_core::encoding::Tsp;
use swarm_core::fabric::{Batch, FabricError, INLINE_BATCH_OPS, NodeId, Op, Ticket};
use swarm_core::quorum::{broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Fabric, OpStats, Roundtrip};
use tracing::Instrument;

use crate::client::register_loc_for;
use crate::configuration::{CONFIG_AT, CONFIG_READ_BYTES, Configuration};
use crate::layout::{BUCKET_BYTES, CLIENT_ROW_BYTES, NodeLayout, SUPERBLOCK_AT};
use crate::membership::lease::LeaseParams;
use crate::membership::owner_process::OwnerLiveness;
use merge::Conflicts;

/// Bytes read from every donor together (and written) per step, at most: pieces of
/// 1 MiB, smaller in clusters of more than four nodes, so that a step fits an RDMA
/// client's staging buffer (8 MiB by default, `swarm_rdma::RdmaConfig`).
const STEP_BYTES: u64 = 4 << 20;

/// How long the repair sleeps when the journal was empty (see [`crate::registers::journal`]),
/// during the quiescence wait, while clients journal resets (something was
/// serviced in the last [`JOURNAL_BUSY_NS`]); during the copy it reads the journal
/// after every piece. Short, since a client has only [`crate::registers::journal::SLOTS`]
/// entries in flight: 3 ms kept a 2-client churn at about half its throughput
/// through the wait, 10 ms at a fifth.
const JOURNAL_POLL_NS: u64 = 3_000_000;

/// How long the repair sleeps when nothing was journaled for [`JOURNAL_BUSY_NS`]
/// (no churn: a shared-memory wait of a few milliseconds spins its last one).
const JOURNAL_IDLE_POLL_NS: u64 = 20_000_000;

/// See [`JOURNAL_POLL_NS`].
const JOURNAL_BUSY_NS: u64 = 100_000_000;

/// How long a configuration read waits for nodes beyond the first majority.
const CONFIG_STRAGGLER_NS: u64 = 50_000_000;

/// Why a repair stopped. The node stays out of service; running the repair again
/// once the cause is gone starts over.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The cluster predates configurations (epoch 0): it cannot admit a node.
    #[error(
        "this store predates node configurations (epoch 0), so a rebuilt node cannot be admitted: create the store again with this build"
    )]
    Legacy,
    /// The node's memory is already a member: nothing to repair.
    #[error(
        "node {node}'s incarnation {incarnation:#x} is already a member (configuration epoch {epoch}): it does not need a repair"
    )]
    AlreadyMember {
        /// The node.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
        /// The configuration epoch.
        epoch: u64,
    },
    /// A node of the cluster that the repair needs did not answer.
    #[error(
        "node {node} did not answer during the repair ({error}): a repair reads every other node and writes the rebuilt one; bring it back and run the repair again"
    )]
    Donor {
        /// The node.
        node: NodeId,
        /// What the fabric reported.
        error: FabricError,
    },
    /// No such node.
    #[error("node {node} does not exist: the cluster has nodes 0 to {}", .nodes - 1)]
    NoSuchNode {
        /// The node asked for.
        node: NodeId,
        /// The node count.
        nodes: usize,
    },
    /// Another repair holds the repair lock (`crate::repair::lock`): it runs, or this host cannot
    /// tell that it is gone. Nothing was written.
    #[error("another repair (process {pid}) holds the repair lock on node {node}: {why}")]
    Locked {
        /// A donor whose lock copy it holds.
        node: NodeId,
        /// Its process id (on the host that runs it).
        pid: u32,
        /// What to do.
        why: &'static str,
    },
    /// Chunks have placement records (`crate::placement`), which this build's copy
    /// does not follow: it copies each chunk from its computed place only.
    #[error(
        "{chunks} chunks are placed by placement records, which this build's repair does not copy yet: use a build whose repair follows them"
    )]
    Placed {
        /// Chunks with a record.
        chunks: usize,
    },
    /// The placement table could not be read (`crate::placement::read`).
    #[error("cannot read the placement table: {0}")]
    PlacementTable(String),
    /// Another fabric failure.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// The node rebuilt.
    pub node: u16,
    /// The configuration epoch that admitted it.
    pub epoch: u64,
    /// Bytes written to the node.
    pub bytes: u64,
    /// Words that donors disagreed on and that the node got a poison value for.
    pub conflicts: Conflicts,
    /// Time spent waiting for quiescence, ms.
    pub quiesce_ms: u64,
    /// Time spent copying, ms.
    pub copy_ms: u64,
    /// Journal entries serviced: registers that clients reset during the repair and
    /// that it copied again (`crate::registers::journal`).
    pub journaled: u64,
}

/// What a repair waits before it copies (see the module docs, step 2).
pub fn quiescence_ns(layout: &NodeLayout) -> u64 {
    let lease = LeaseParams::from_params(&layout.params);
    lease
        .observer_wait_ns()
        .saturating_add(swarm_core::slot_recycling::grace_with_margin_ns(
            layout.params.max_op_ns,
            layout.params.delivery_margin_ns,
        ))
}

/// Options of a repair.
#[derive(Clone, Copy, Debug, Default)]
pub struct RepairOptions {
    /// Wait this long before copying instead of [`quiescence_ns`] (tests with no
    /// client running; never shorter in production).
    pub quiesce_ns: Option<u64>,
    /// Declare the node's memory lost and rebuild it even if it is a member in good
    /// shape: for a node that fell too far behind (its index copies missed `2^15`
    /// ballots, `crate::index`, "Limits"). The transport retires the memory first
    /// (shared memory: `ShmCluster::replace_node`).
    pub replace: bool,
    /// Whether every repair of the cluster is a process of this host (shared memory:
    /// `ShmStore::repair` sets it), so that a repair lock held by a process that is
    /// gone is taken over (`crate::repair::lock`). `Unknown` (RDMA): a lock held by another
    /// process is taken only with [`Self::break_lock`].
    pub liveness: OwnerLiveness,
    /// Take the repair lock whatever holds it: the operator asserts that the earlier
    /// repair is gone (killed, its host down). An override, like `swarm evict
    /// --force`: if that repair still runs, its late records and copies can land
    /// after this one's (`crate::repair::lock`).
    pub break_lock: bool,
}

impl RepairOptions {
    /// The defaults ([`Default`]), usable in constants.
    pub const DEFAULT: Self = Self {
        quiesce_ns: None,
        replace: false,
        liveness: OwnerLiveness::Unknown,
        break_lock: false,
    };
}

/// Rebuilds `node`, whose memory now has incarnation `incarnation`, from every other
/// node, and admits it with a configuration change (see the module docs). `fabric`
/// must reach the node (a raw fabric: the store's clients leave it out), and
/// `progress` is called after every piece with the bytes done and the total.
pub async fn repair_node<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    node: NodeId,
    incarnation: u64,
    options: RepairOptions,
    progress: impl FnMut(u64, u64),
) -> Result<RepairReport, RepairError> {
    let nodes = fabric.node_count();
    if node.index() >= nodes {
        return Err(RepairError::NoSuchNode { node, nodes });
    }
    let stats = OpStats::new();
    let donors: Vec<NodeId> = (0..nodes as u16)
        .map(NodeId)
        .filter(|n| *n != node)
        .collect();
    // The metadata group's donors: the lock, the configuration records and the
    // metadata areas are theirs (every other node without a metadata group).
    let meta_donors = metadata_donors(layout, nodes, node);
    // Records and copies only under the repair lock, read from the configuration on:
    // a late record of a stopped repair never lands after a later repair's (`lock`).
    let held = lock::take(
        fabric,
        &stats,
        &meta_donors,
        options.liveness,
        options.break_lock,
    )
    .await?;
    let result = repair_locked(
        fabric,
        layout,
        node,
        incarnation,
        options,
        &stats,
        Donors {
            all: &donors,
            meta: &meta_donors,
        },
        progress,
    )
    .await;
    lock::give_back(fabric, &stats, &meta_donors, &held).await;
    drop(held);
    result
}

/// The donors of the repair of `node` that hold the metadata areas, the
/// configuration and the repair lock: the metadata group's nodes other than `node`
/// (`NodeLayout::metadata_nodes`; every other node without a metadata group).
pub(crate) fn metadata_donors(layout: &NodeLayout, nodes: usize, node: NodeId) -> Vec<NodeId> {
    (0..layout.metadata_nodes(nodes) as u16)
        .map(NodeId)
        .filter(|n| *n != node)
        .collect()
}

/// The donors of a repair: every other node (registers, logs), and those of them
/// in the metadata group ([`metadata_donors`]).
#[derive(Clone, Copy)]
struct Donors<'a> {
    all: &'a [NodeId],
    meta: &'a [NodeId],
}

/// [`repair_node`] once it holds the repair lock.
#[allow(clippy::too_many_arguments)]
async fn repair_locked<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    node: NodeId,
    incarnation: u64,
    options: RepairOptions,
    stats: &OpStats,
    donors: Donors<'_>,
    mut progress: impl FnMut(u64, u64),
) -> Result<RepairReport, RepairError> {
    let nodes = fabric.node_count();
    let meta = layout.metadata_nodes(nodes);
    // A node outside the metadata group holds no configuration, index, client
    // table, journal nor chunk table: only its register bands and logs are copied.
    let holds_meta = node.index() < meta;
    let config = read_configuration(fabric, stats, meta).await?;
    if config.epoch == 0 {
        return Err(RepairError::Legacy);
    }
    if config.incarnations.get(node.index()) == Some(&incarnation) {
        return Err(RepairError::AlreadyMember {
            node,
            incarnation,
            epoch: config.epoch,
        });
    }
    // The copy below rebuilds chunks at their computed places only: a recorded chunk
    // would come back empty on the node, so such a cluster is refused (issue 46,
    // step 3 makes the copy follow the records).
    let placements = crate::placement::read(
        fabric,
        stats,
        layout,
        meta,
        config.epoch,
        CONFIG_STRAGGLER_NS,
    )
    .await
    .map_err(|e| RepairError::PlacementTable(e.to_string()))?;
    if placements.recorded() > 0 {
        return Err(RepairError::Placed {
            chunks: placements.recorded(),
        });
    }
    // The node must answer before anything is announced: a repair that won the lock
    // after a stop may map memory a later repair retired (shared memory), and must
    // not leave an announcement behind for a repair that cannot run (`lock`).
    rt_all(fabric, stats, &[node], |_| Batch::read(CONFIG_AT, 8)).await?;
    // The span is entered only while the repair's own future runs (`instrument`):
    // entered across an await, it would label whatever else the thread polls then.
    let span = tracing::info_span!("repair", %node, epoch = config.epoch);
    async {
        // Announce the repair (epoch e + 1, the node's repairing bit) on every donor
        // before the wait: from the end of the wait on, no client leaves the node's
        // lost memory out of a register reset (step 1, `crate::registers::recycle`).
        let mut announced = config.clone();
        announced.epoch += 1;
        announced.set_repairing(node.index(), true);
        let record = announced.encode();
        rt_all(fabric, stats, donors.meta, |_| {
            Batch::write(CONFIG_AT, record.clone())
        })
        .await?;
        tracing::info!(epoch = announced.epoch, "repair announced");
        let wait = options.quiesce_ns.unwrap_or_else(|| quiescence_ns(layout));
        tracing::info!(
            wait_ms = wait / 1_000_000,
            "waiting for every action on the lost memory to land"
        );
        let mut copier = Copier {
            fabric,
            stats,
            layout,
            donors: donors.all,
            meta_donors: donors.meta,
            holds_meta,
            target: node,
            journal: layout
                .journal_at
                .and_then(|_| crate::registers::journal::journal_node(node, meta)),
            nodes,
            conflicts: Conflicts::default(),
            done: 0,
            total: copy_bytes(layout),
            journaled: 0,
        };
        let copied = async {
            let started = Instant::now();
            // Clients that saw the announcement journal their resets from now on:
            // service them during the wait too, so that their registers keep coming
            // back.
            let wait_until = fabric.now().saturating_add(wait);
            let mut busy_at = 0;
            loop {
                let serviced = copier.service_journal().await?;
                let now = fabric.now();
                if now >= wait_until {
                    break;
                }
                if serviced > 0 {
                    busy_at = now;
                } else {
                    let poll = if now.saturating_sub(busy_at) < JOURNAL_BUSY_NS {
                        JOURNAL_POLL_NS
                    } else {
                        JOURNAL_IDLE_POLL_NS
                    };
                    swarm_core::sleep(fabric, (wait_until - now).min(poll)).await;
                }
            }
            let quiesce_ms = started.elapsed().as_millis() as u64;
            let copy_started = Instant::now();
            copier
                .write(SUPERBLOCK_AT, layout.params.encode().to_vec())
                .await?;
            copier.copy_all(&mut progress).await?;
            copier.service_journal().await?;
            Ok::<_, RepairError>((quiesce_ms, copy_started.elapsed().as_millis() as u64))
        }
        .await;
        let (quiesce_ms, copy_ms) = match copied {
            Ok(times) => times,
            Err(error) => {
                withdraw(fabric, stats, donors.meta, &announced, node).await;
                return Err(error);
            }
        };
        let (bytes, conflicts, journaled) = (copier.done, copier.conflicts, copier.journaled);

        // Admit: the new configuration on every donor (a majority of the old members),
        // then on the node.
        let mut next = announced;
        next.epoch += 1;
        next.incarnations[node.index()] = incarnation;
        next.set_repairing(node.index(), false);
        let record = next.encode();
        rt_all(fabric, stats, donors.meta, |_| {
            Batch::write(CONFIG_AT, record.clone())
        })
        .await?;
        if holds_meta {
            rt_all(fabric, stats, &[node], |_| {
                Batch::write(CONFIG_AT, record.clone())
            })
            .await?;
        }
        tracing::info!(
            epoch = next.epoch,
            bytes,
            conflicts = conflicts.total(),
            copy_ms,
            journaled,
            "memory node rebuilt and admitted"
        );
        Ok::<_, RepairError>(RepairReport {
            node: node.0,
            epoch: next.epoch,
            bytes,
            conflicts,
            quiesce_ms,
            copy_ms,
            journaled,
        })
    }
    .instrument(span)
    .await
}

/// How long a failed repair waits for the donors to take its withdrawal.
const WITHDRAW_WAIT_NS: u64 = 1_000_000_000;

/// Withdraws the announcement of a repair that failed before its admission: the
/// configuration `announced + 1`, the same members with the node's repairing bit
/// clear, on every donor that answers. Without it, the bit stayed until another
/// repair of the node ran: clients journaled every reset that left the node out,
/// and those registers waited for a repair that no longer ran. With it, clients
/// treat the node as lost again (`crate::registers::recycle`, "a node out of
/// service"): their journaled registers come back, their entries left for the next
/// repair, which copies those registers from the donors the resets reached.
/// Best effort, under the repair lock: if no donor takes it, the next repair of the
/// node announces itself above it and services the journal.
async fn withdraw<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    donors: &[NodeId],
    announced: &Configuration,
    node: NodeId,
) {
    let mut withdrawn = announced.clone();
    withdrawn.epoch += 1;
    withdrawn.set_repairing(node.index(), false);
    let record = withdrawn.encode();
    let mut rt = Roundtrip::start(fabric, stats);
    let mut posted = 0;
    for &donor in donors {
        if rt
            .post(donor, Batch::write(CONFIG_AT, record.clone()))
            .is_ok()
        {
            posted += 1;
        }
    }
    if posted > 0 {
        let _ = rt
            .settle_until(fabric.now().saturating_add(WITHDRAW_WAIT_NS))
            .await;
    }
    let took = rt.replies().len();
    if took == 0 {
        tracing::warn!(
            epoch = withdrawn.epoch,
            "the failed repair's announcement could not be withdrawn: run the repair again"
        );
    } else {
        tracing::info!(
            epoch = withdrawn.epoch,
            donors = took,
            "repair failed before its admission: announcement withdrawn"
        );
    }
}

/// The newest valid configuration among a majority's copies (and stragglers').
pub(crate) async fn read_configuration<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    meta: usize,
) -> Result<Configuration, FabricError> {
    read_configuration_within(fabric, stats, meta, majority(meta), CONFIG_STRAGGLER_NS).await
}

/// [`read_configuration`] from at least `quorum` of the nodes `0..meta` that hold it
/// (the metadata group, `crate::layout::NodeLayout::metadata_nodes`), waiting
/// `straggler_ns` for the others. A client that follows a configuration change needs one answer: a
/// valid copy that lists a rebuilt node's new incarnation exists only once the
/// rebuild finished (it is written to the donors after the copy), and a client with one node lost and the rebuilt
/// one not admitted yet may reach a single node.
pub(crate) async fn read_configuration_within<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    meta: usize,
    quorum: usize,
    straggler_ns: u64,
) -> Result<Configuration, FabricError> {
    let nodes = fabric.node_count();
    let rt = broadcast_until_among(
        fabric,
        stats,
        node_ids(meta.min(nodes)),
        quorum,
        straggler_ns,
        |_| Ok(Some(Batch::read(CONFIG_AT, CONFIG_READ_BYTES as u32))),
        |_| false,
    )
    .await?;
    let copies: Vec<_> = rt
        .replies()
        .iter()
        .map(|(_, c)| Configuration::decode(c.read(0).unwrap_or_default()))
        .collect();
    Ok(Configuration::newest(&copies, nodes))
}

/// Posts `build(node)` to each of `nodes` and waits for all of them. A node that
/// fails is named ([`RepairError::Donor`]: the user must bring that one back), also
/// when its failure is what leaves the roundtrip short of replies. More nodes than
/// one roundtrip posts to ([`swarm_core::MAX_NODES`]: the logs of a cluster of more
/// nodes are read from every other node) take one roundtrip per
/// [`swarm_core::MAX_NODES`] of them, one after the other.
async fn rt_all<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    nodes: &[NodeId],
    mut build: impl FnMut(NodeId) -> Batch,
) -> Result<Vec<(NodeId, swarm_core::Completion)>, RepairError> {
    let mut out = Vec::with_capacity(nodes.len());
    for group in nodes.chunks(swarm_core::MAX_NODES) {
        let mut rt = Roundtrip::start(fabric, stats);
        for &node in group {
            rt.post(node, build(node)).map_err(|error| match error {
                FabricError::NodeFailed { .. } => RepairError::Donor { node, error },
                error => RepairError::Fabric(error),
            })?;
        }
        let waited = rt.wait(group.len()).await;
        if let Some((node, error)) = rt.failures().first() {
            return Err(RepairError::Donor {
                node: *node,
                error: error.clone(),
            });
        }
        waited.map_err(RepairError::Fabric)?;
        out.extend_from_slice(rt.replies());
    }
    Ok(out)
}

/// Posts every batch at once and waits for all of them; their completions, in order.
/// A node that fails is named, like [`rt_all`].
async fn post_all<F: Fabric>(
    fabric: &F,
    posts: Vec<(NodeId, Batch)>,
) -> Result<Vec<swarm_core::Completion>, RepairError> {
    let mut pending: Vec<(NodeId, Option<Ticket>)> = posts
        .into_iter()
        .map(|(node, batch)| (node, Some(fabric.post(node, batch))))
        .collect();
    let mut done: Vec<Option<swarm_core::Completion>> = pending.iter().map(|_| None).collect();
    core::future::poll_fn(|cx| {
        for ((node, ticket), out) in pending.iter_mut().zip(done.iter_mut()) {
            let Some(t) = *ticket else { continue };
            match fabric.poll(t) {
                Poll::Pending => {}
                Poll::Ready(Ok(c)) => {
                    *ticket = None;
                    *out = Some(c);
                }
                Poll::Ready(Err(error)) => {
                    *ticket = None;
                    return Poll::Ready(Err(RepairError::Donor { node: *node, error }));
                }
            }
        }
        if pending.iter().all(|(_, t)| t.is_none()) {
            return Poll::Ready(Ok(()));
        }
        // Driven by re-polling after `Fabric::progress`, like `Roundtrip::wait`.
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
    .inspect_err(|_| {
        for (_, ticket) in &pending {
            if let Some(t) = ticket {
                fabric.forget(*t);
            }
        }
    })?;
    Ok(done.into_iter().flatten().collect())
}

/// Bytes the copy writes (for progress reports).
fn copy_bytes(layout: &NodeLayout) -> u64 {
    layout.end() - (SUPERBLOCK_AT + crate::layout::SUPERBLOCK_BYTES)
}

/// How one element of an area is merged.
#[derive(Clone, Copy)]
enum Area {
    ClientRows,
    Chunks,
    Index,
    Registers,
    Logs,
    Summaries,
}

struct Copier<'a, F: Fabric> {
    fabric: &'a F,
    stats: &'a OpStats,
    layout: &'a NodeLayout,
    /// Every other node: the logs' donors (and the registers' without replica
    /// groups).
    donors: &'a [NodeId],
    /// The metadata group's other nodes: the donors of the client table, the chunk
    /// table, the index and the log summaries ([`metadata_donors`]).
    meta_donors: &'a [NodeId],
    /// Whether the node is in the metadata group (else its metadata areas are
    /// left alone: no one reads them).
    holds_meta: bool,
    target: NodeId,
    /// The node whose repair journal clients use, if the cluster has one.
    journal: Option<NodeId>,
    nodes: usize,
    conflicts: Conflicts,
    done: u64,
    total: u64,
    /// Journal entries serviced.
    journaled: u64,
}

impl<F: Fabric> Copier<'_, F> {
    async fn write(&mut self, at: u64, data: Vec<u8>) -> Result<(), RepairError> {
        let len = data.len() as u64;
        let mut data = Some(data);
        rt_all(self.fabric, self.stats, &[self.target], |_| {
            Batch::write(at, data.take().unwrap_or_default())
        })
        .await?;
        self.done += len;
        Ok(())
    }

    async fn copy_all(&mut self, progress: &mut impl FnMut(u64, u64)) -> Result<(), RepairError> {
        let l = *self.layout;
        let p = &l.params;
        let areas = [
            (
                Area::ClientRows,
                l.clients_at,
                CLIENT_ROW_BYTES,
                u64::from(p.writers),
            ),
            (Area::Chunks, l.chunks_at, 8, l.chunks()),
            (Area::Index, l.index_at, BUCKET_BYTES, p.index_buckets),
            (
                Area::Registers,
                l.registers_at,
                l.register_slot_bytes,
                p.registers,
            ),
            (
                Area::Logs,
                l.swarm.log_base(),
                l.swarm.slot_bytes(),
                u64::from(p.writers) * u64::from(p.log_slots),
            ),
        ];
        for (area, start, elem, count) in areas {
            let metadata = matches!(area, Area::ClientRows | Area::Chunks | Area::Index);
            if metadata && !self.holds_meta {
                continue;
            }
            if matches!(area, Area::Registers) && p.placement_nodes != 0 {
                self.copy_grouped_registers(progress).await?;
                continue;
            }
            self.copy_area(area, start, elem, count, progress).await?;
        }
        if let Some(at) = l.summaries_at.filter(|_| self.holds_meta) {
            self.copy_area(
                Area::Summaries,
                at,
                l.summary_bytes(),
                u64::from(p.writers),
                progress,
            )
            .await?;
        }
        Ok(())
    }

    async fn copy_area(
        &mut self,
        area: Area,
        start: u64,
        elem: u64,
        count: u64,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<(), RepairError> {
        let piece = (STEP_BYTES / self.nodes as u64).clamp(64 << 10, 1 << 20);
        let per_piece = (piece / elem).max(1);
        let mut first = 0;
        while first < count {
            let n = per_piece.min(count - first);
            let at = start + first * elem;
            let len = (n * elem) as u32;
            let donors = match area {
                Area::ClientRows | Area::Chunks | Area::Index | Area::Summaries => self.meta_donors,
                Area::Registers | Area::Logs => self.donors,
            };
            let replies = rt_all(self.fabric, self.stats, donors, |_| Batch::read(at, len)).await?;
            let copies: Vec<&[u8]> = replies
                .iter()
                .map(|(_, c)| c.read(0).unwrap_or_default())
                .collect();
            let mut out = vec![0u8; len as usize];
            for i in 0..n as usize {
                let range = i * elem as usize..(i + 1) * elem as usize;
                let element: Vec<&[u8]> = copies
                    .iter()
                    .map(|c| c.get(range.clone()).unwrap_or_default())
                    .collect();
                // Donors that agree byte for byte (most of memory): every rule keeps
                // a value all donors hold, so the copy is the merge.
                let agreed = element.len() > 1
                    && element[0].len() == range.len()
                    && element.windows(2).all(|w| w[0] == w[1]);
                if agreed && !matches!(area, Area::Registers) {
                    out[range].copy_from_slice(element[0]);
                    continue;
                }
                self.merge(area, first + i as u64, &element, &mut out[range]);
            }
            drop(replies);
            self.write(at, out).await?;
            first += n;
            progress(self.done, self.total);
            self.service_journal().await?;
        }
        Ok(())
    }

    /// The register area with replica groups (`NodeLayout::placement`): in each
    /// band, the chunk of the group the node belongs to (if any), read from that
    /// group's other replicas only, in pieces like [`Self::copy_area`]. A value
    /// decided on a majority of the group's `r` replicas is on one of the `r - 1`
    /// others at least, and each merge rule keeps it. What the node holds outside
    /// its groups' chunks is read by no one.
    async fn copy_grouped_registers(
        &mut self,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<(), RepairError> {
        let l = *self.layout;
        let per = u64::from(l.params.chunk_registers);
        let elem = l.register_slot_bytes;
        let per_piece = ((1 << 20) / elem).max(1);
        for band in 0..l.bands() {
            let Some(j) = l.group_of(self.target.index(), band) else {
                continue;
            };
            let chunk_first = (band * l.params.groups() + j) * per;
            let chunk_end = (chunk_first + per).min(l.params.registers);
            let Ok(loc) = register_loc_for(&l, self.nodes, chunk_first) else {
                continue;
            };
            let group: Vec<NodeId> = loc
                .replicas
                .nodes()
                .iter()
                .copied()
                .filter(|&n| n != self.target)
                .collect();
            let mut first = chunk_first;
            while first < chunk_end {
                let n = per_piece.min(chunk_end - first);
                let Some(at) = l.key_header(first) else {
                    break;
                };
                let len = (n * elem) as u32;
                let replies =
                    rt_all(self.fabric, self.stats, &group, |_| Batch::read(at, len)).await?;
                let copies: Vec<&[u8]> = replies
                    .iter()
                    .map(|(_, c)| c.read(0).unwrap_or_default())
                    .collect();
                let mut out = vec![0u8; len as usize];
                for i in 0..n as usize {
                    let range = i * elem as usize..(i + 1) * elem as usize;
                    let element: Vec<&[u8]> = copies
                        .iter()
                        .map(|c| c.get(range.clone()).unwrap_or_default())
                        .collect();
                    self.merge(Area::Registers, first + i as u64, &element, &mut out[range]);
                }
                drop(replies);
                self.write(at, out).await?;
                first += n;
                progress(self.done, self.total);
                self.service_journal().await?;
            }
        }
        Ok(())
    }

    /// Reads the repair journal once and services every entry in it: copies the
    /// register it names from the donors to the node, like the copy does, then
    /// clears the entry (see [`crate::registers::journal`]); an entry whose register is
    /// not blank on every donor is neither copied nor cleared. Between pieces of the
    /// copy, so that no piece read before a journaled reset is written after its entry
    /// was serviced. Returns the entries serviced (copied and cleared).
    async fn service_journal(&mut self) -> Result<usize, RepairError> {
        let (Some(journal), Some(at)) = (self.journal, self.layout.journal_at) else {
            return Ok(0);
        };
        let len = u64::from(self.layout.params.writers) * crate::registers::journal::ROW_BYTES;
        let mut replies = rt_all(self.fabric, self.stats, &[journal], |_| {
            Batch::read(at, len as u32)
        })
        .await?;
        let row = replies
            .first_mut()
            .and_then(|(_, c)| c.take_read(0))
            .unwrap_or_default();
        let entries: Vec<(u64, u64)> = row
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(i, w)| {
                let word = u64::from_le_bytes(w.try_into().ok()?);
                (word != 0).then_some((at + 8 * i as u64, word))
            })
            .collect();
        let registers = self.layout.register_ids();
        let slot_bytes = self.layout.register_slot_bytes as usize;
        // Every chunk's reads, writes and clears go out together: three roundtrips
        // per pass, however many entries (a churn journals thousands per second).
        // Each batch of entries: (address, word, the register it names if any).
        type Entry = (u64, u64, Option<u64>);
        let chunks: Vec<Vec<Entry>> = entries
            .chunks(INLINE_BATCH_OPS)
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|&(addr, word)| {
                        let named = crate::registers::journal::entry_register(word, registers);
                        (addr, word, named)
                    })
                    .collect()
            })
            .collect();
        let mut reads = Vec::new();
        for chunk in &chunks {
            let mut read = Batch::new();
            for register in chunk.iter().filter_map(|e| e.2) {
                let addr = self.layout.key_header(register).unwrap_or_default();
                read.push(Op::Read {
                    addr,
                    len: slot_bytes as u32,
                })?;
            }
            if !read.is_empty() {
                reads.extend(self.donors.iter().map(|&donor| (donor, read.clone())));
            }
        }
        let copies = post_all(self.fabric, reads).await?;
        let mut writes = Vec::new();
        // The entries to clear: those whose register was copied, and those naming
        // no register at all.
        let mut done: Vec<Vec<(u64, u64)>> = Vec::with_capacity(chunks.len());
        let mut copies = copies.chunks(self.donors.len());
        for chunk in &chunks {
            let mut cleared: Vec<(u64, u64)> = chunk
                .iter()
                .filter(|e| e.2.is_none())
                .map(|e| (e.0, e.1))
                .collect();
            if chunk.iter().all(|e| e.2.is_none()) {
                done.push(cleared);
                continue;
            }
            let donors = copies.next().unwrap_or_default();
            let mut write = Batch::new();
            let named = chunk.iter().filter_map(|e| e.2.map(|r| (e.0, e.1, r)));
            for (k, (addr, word, register)) in named.enumerate() {
                // With replica groups, only the register's replicas hold it (the
                // same address on another node is another register's or unused).
                let replicas = (self.layout.params.placement_nodes != 0)
                    .then(|| register_loc_for(self.layout, self.nodes, register).ok())
                    .flatten();
                let element: Vec<&[u8]> = donors
                    .iter()
                    .zip(self.donors)
                    .filter(|(_, node)| {
                        replicas
                            .as_ref()
                            .is_none_or(|loc| loc.replicas.position(**node).is_some())
                    })
                    .map(|(c, _)| c.read(k).unwrap_or_default())
                    .collect();
                // A journaled register is blank on every donor (reset, not reused
                // before its entry is cleared). Any other state means a stale entry
                // (its client gone, the register reset and reused by another), a
                // torn read, or a late store of an earlier life on a donor: copying a
                // live register's words here, without the log slots they name, could
                // leave the node with words whose buffer it lacks. Skipped, and the
                // entry is *not* cleared: a client hands a register out on seeing its
                // entry cleared, which must mean that the node holds the reset. A
                // live client's entry then waits for the admission, and the client
                // resets the register again on every replica, the node included
                // (`crate::registers::recycle`); a stale one stays for a later pass.
                if !element.iter().all(|copy| self.is_blank(copy)) {
                    tracing::debug!(
                        register,
                        "repair journal: register not blank; entry skipped and kept"
                    );
                    continue;
                }
                let mut out = vec![0u8; slot_bytes];
                self.merge(Area::Registers, register, &element, &mut out);
                write.push(Op::Write {
                    addr: self.layout.key_header(register).unwrap_or_default(),
                    data: out.into(),
                })?;
                cleared.push((addr, word));
            }
            if !write.is_empty() {
                writes.push((self.target, write));
            }
            done.push(cleared);
        }
        post_all(self.fabric, writes).await?;
        // Only now, with the node holding the registers' current state, the entries
        // are cleared (a client hands a register out on seeing its entry gone).
        let mut clears = Vec::new();
        for chunk in &done {
            let mut clear = Batch::new();
            for &(addr, word) in chunk {
                clear.push(Op::Cas {
                    addr,
                    expected: word,
                    new: 0,
                })?;
            }
            if !clear.is_empty() {
                clears.push((journal, clear));
            }
        }
        post_all(self.fabric, clears).await?;
        let serviced = done.iter().map(Vec::len).sum::<usize>();
        if !entries.is_empty() {
            tracing::debug!(entries = entries.len(), serviced, "repair journal serviced");
        }
        self.journaled += serviced as u64;
        Ok(serviced)
    }

    /// Whether a register slot read from a donor is blank: no key, every metadata
    /// word and the delete word one reset's marker (`crate::registers::reset`), or
    /// zero (never used); the holder tag may stay. The in-place record is not looked
    /// at: a late in-place write of an earlier life (a VERIFIED mark's copy) may land
    /// there after the reset, and is harmless, since a read takes an in-place record
    /// only when its tsp is the maximum's, which no earlier life's is. Requiring it
    /// zero would skip such a register's entry for the whole repair (a skipped entry
    /// is kept, and its client resets the register again after the admission).
    fn is_blank(&self, slot: &[u8]) -> bool {
        let key_bytes = self.layout.params.key_header_bytes() as usize;
        let meta_at = key_bytes + self.layout.swarm.meta_offset() as usize;
        let meta_bytes = self.layout.swarm.meta_bytes() as usize;
        slot.len() == self.layout.register_slot_bytes as usize
            && slot[0..4] == [0; 4]
            && slot.get(meta_at..meta_at + meta_bytes).is_some_and(|meta| {
                let mut words = meta
                    .chunks_exact(8)
                    .map(|w| Tsp::from_word(u64::from_le_bytes(w.try_into().unwrap_or_default())));
                let first = words.next().unwrap_or(Tsp::EMPTY);
                first.is_void() && words.all(|w| w == first)
            })
    }

    /// Merges the donors' copies of element `index` of `area` into `out`.
    fn merge(&mut self, area: Area, index: u64, copies: &[&[u8]], out: &mut [u8]) {
        let c = &mut self.conflicts;
        match area {
            Area::ClientRows => {
                for (w, chunk) in out.chunks_exact_mut(8).enumerate() {
                    let words = words_at(copies, 8 * w);
                    let merged = match w {
                        0 => merge::claim_word(&words, c),
                        1 => merge::lease_word(&words),
                        _ => merge::max_word(&words),
                    };
                    chunk.copy_from_slice(&merged.to_le_bytes());
                }
            }
            Area::Chunks => {
                let merged = merge::claim_word(&words_at(copies, 0), c);
                out.copy_from_slice(&merged.to_le_bytes());
            }
            Area::Index => {
                for (w, chunk) in out.chunks_exact_mut(8).enumerate() {
                    let words = words_at(copies, 8 * w);
                    let merged = if w == 0 {
                        merge::meta_word(&words)
                    } else {
                        merge::slot_word(&words)
                    };
                    chunk.copy_from_slice(&merged.to_le_bytes());
                }
            }
            Area::Registers => {
                let replicated = register_loc_for(self.layout, self.nodes, index)
                    .is_ok_and(|loc| loc.replicas.position(self.target).is_some());
                if !replicated {
                    out.fill(0);
                    return;
                }
                if copies.len() > 1
                    && copies[0].len() == out.len()
                    && copies.windows(2).all(|w| w[0] == w[1])
                {
                    out.copy_from_slice(copies[0]);
                    return;
                }
                let key_bytes = self.layout.params.key_header_bytes() as usize;
                let record_bytes = self.layout.swarm.record_bytes() as usize;
                let (header, register) = out.split_at_mut(key_bytes);
                let (block, meta) = register.split_at_mut(record_bytes);
                let part = |from: usize, to: usize| -> Vec<&[u8]> {
                    copies
                        .iter()
                        .map(|c| c.get(from..to).unwrap_or_default())
                        .collect()
                };
                merge::key_header(&part(0, key_bytes), self.layout.params.key_max, header, c);
                merge::record(
                    &part(key_bytes, key_bytes + record_bytes),
                    self.layout.swarm.payload_max(),
                    block,
                );
                let delete_word = usize::from(self.layout.swarm.meta_words());
                for (w, chunk) in meta.chunks_exact_mut(8).enumerate() {
                    let words = words_at(copies, key_bytes + record_bytes + 8 * w);
                    let merged = if w == delete_word {
                        merge::delete_word(&words)
                    } else {
                        merge::max_word(&words)
                    };
                    chunk.copy_from_slice(&merged.to_le_bytes());
                }
            }
            Area::Logs => {
                let (lock, record) = out.split_at_mut(8);
                let merged = merge::lock_word(&words_at(copies, 0), c);
                lock.copy_from_slice(&merged.to_le_bytes());
                let records: Vec<&[u8]> = copies
                    .iter()
                    .map(|c| c.get(8..).unwrap_or_default())
                    .collect();
                merge::record(&records, self.layout.swarm.payload_max(), record);
            }
            Area::Summaries => merge::summary(copies, self.layout.params.log_slots, out),
        }
    }
}

/// The little-endian word at `offset` of each copy (copies too short are skipped).
fn words_at(copies: &[&[u8]], offset: usize) -> Vec<u64> {
    copies
        .iter()
        .filter_map(|c| {
            Some(u64::from_le_bytes(
                c.get(offset..offset + 8)?.try_into().ok()?,
            ))
        })
        .collect()
}
