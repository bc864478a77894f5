//! The client table: writer ids and leases in disaggregated memory (LOCO's
//! one-row-per-client idea; its place on a node is in [`crate::layout`]).
//!
//! Every client thread that writes needs a writer id: it names the thread's
//! out-of-place log and breaks timestamp ties (SWARM §3.2). Two live clients must never
//! share one, so a client claims a row of the table on a majority of nodes
//! ([`crate::membership::claim`]) with a token unique to its incarnation, and holds it with a
//! lease ([`crate::membership::lease`]): it stops issuing operations when it cannot prove its lease
//! valid, so that a row whose lease expired can be taken over ([`crate::membership::writer_takeover`]).
//!
//! Row layout (64 bytes, same on every node):
//!
//! | word | meaning |
//! |---:|---|
//! | 0 | claim: 0 free, else the owner's incarnation token |
//! | 1 | lease word: renewal counter, bit 63 set once killed by a reclaimer ([`crate::membership::lease`]) |
//! | 2 | the owner's process: pid, start time in the high 32 bits ([`crate::membership::owner_process`]) |
//! | 3 | 1 once the row has ever been used (its log may hold live buffers) |
//! | 4 | resume generation: `generation << 1 \| sealed` (see "Resuming a log" below) |
//! | 5 | the owner's wall clock at its last renewal, Unix ns (informational: `swarm stat`) |
//! | 6 | tick ceiling: no incarnation of this writer id used a timestamp above it (superblock version 4; see "Resuming a log") |
//! | 7 | write-back guard: the write this client is writing back into another writer's log, or 0 ([`swarm_core::write_back_guard`]) |
//!
//! A client that stops cleanly gives its row back. A client that finds every row
//! claimed watches them for a lease period and takes over one whose owner did not
//! renew ([`crate::membership::writer_takeover::take_over_expired`]). The next client of a used row,
//! given back or taken over, *resumes* its log, so that no buffer that a register may
//! still point to is overwritten and no timestamp repeats: a dead client's values
//! that are still current stay readable.
//!
//! # Resuming a log
//!
//! * **After a clean stop**, from the earlier client's log summary
//!   ([`swarm_core::summary`]): its used-slot bitmap and last tick count, one bit per
//!   slot in the summary area ([`NodeLayout::summary`]). The next client reads that
//!   (a few KiB to a few tens of KiB) instead of the log (tens of MiB), and examines
//!   the slots it marks lazily ([`swarm_core::Client::resume_summary`]).
//! * **After a crash or an eviction**, on a cluster with tick ceilings (superblock
//!   version 4): every client raises its row's tick-ceiling word (word 6) on a
//!   majority before it uses a timestamp above it ([`swarm_core::Client::set_tick_ceiling`],
//!   about a second of ticks at a time), so the next client reads the largest
//!   ceiling with the row, starts its timestamps above it, carries every slot of the
//!   log and examines them lazily ([`swarm_core::Client::resume_crashed`]), freeing
//!   the never-written ones: its start reads one or a few 64 KiB steps of the log,
//!   not the log ([`swarm_core::resume`], "Crash resume", has the argument and the
//!   straggler caveat).
//! * **Otherwise** (a cluster that predates tick ceilings or summaries), by scanning
//!   the whole log on every node that answers
//!   ([`swarm_core::resume::scan_log`], waiting [`RESUME_STRAGGLER_NS`] for nodes
//!   beyond a majority, since a write the earlier client abandoned may sit on one
//!   node only): every slot holding a record or a lock is marked used, and
//!   timestamps start above the largest one found.
//!
//! Which summary may be trusted is decided by the row's *generation word* (word 4),
//! `generation << 1 | sealed`, which only ever goes up on each node (every change is
//! a CAS from the value the node holds to a larger one, so a delayed change cannot
//! lower it):
//!
//! 1. A client that registers reads word 4 from a majority (stragglers included,
//!    up to [`STRAGGLER_NS`]), takes the largest value `g << 1 | s`, and raises the
//!    word to `(g + 1) << 1` on a majority **before it writes anything to the log**.
//!    Any later registration's majority meets that one, so it sees generation
//!    `g + 1` or later: a client that crashed after writing to its log is never
//!    mistaken for one that sealed.
//! 2. A client that stops cleanly, with its lease valid for the whole stop (nothing
//!    it posts can land after a reclaimer could take the row over), writes its
//!    summary stamped `g + 1` to every node, waits for a majority, and only then
//!    raises word 4 to `(g + 1) << 1 | 1` (*sealed*), and finally gives the row back.
//! 3. The next client resumes from the summary only if the largest word it read is
//!    sealed: then that generation's summary reached a majority before the seal was
//!    posted, and a majority read of the summary area finds an intact copy with that
//!    stamp (the checksum rejects torn copies, the stamp older ones). Any other case
//!    (unsealed, never set, no intact copy found) is a whole-log scan.
//!
//! A summary carries everything a whole-log scan would learn that matters: every slot
//! the writer had not recycled (it may hold a live buffer, a write abandoned on one
//! node, or a lock), and a tick count above every timestamp it used (a lock word
//! names only a timestamp its writer used).

use swarm_core::fabric::Nanos;
use swarm_core::quorum::{broadcast, broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, FabricError, NodeId, OpStats, Roundtrip};

use crate::KvError;
use crate::layout::NodeLayout;
use crate::membership::claim::{Claim, claim};
use crate::membership::lease::{LeaseKeeper, LeaseParams};
use crate::membership::lease_renewal::{LEASE_WORD, LeaseHolder, RENEWED_UNIX, renew_now};
use crate::membership::owner_process::OwnerLiveness;
use crate::membership::writer_takeover::{STRAGGLER_NS, take_over_expired};
use swarm_core::summary::LogSummary;

/// Offset in a row of the owner's process identity ([`crate::membership::owner_process`]).
pub(crate) const PID: u64 = 16;

/// Offset in a row of the used flag (see the module docs).
const USED: u64 = 24;

/// How long resuming a log waits for each node beyond the first majority, on the
/// fabric's clock. Generous: it is paid once per client start, and only when a node
/// is down; a node slower than this is read as if it had failed (see the module docs).
pub const RESUME_STRAGGLER_NS: Nanos = 100_000_000;

/// Largest piece of a log summary read or written in one batch.
const SUMMARY_PIECE: usize = 4 << 20;

/// Offset of the resume-generation word in a row (see the module docs).
pub const GENERATION: u64 = 32;

/// Offset of the tick-ceiling word in a row (see the module docs).
pub const TICK_CEILING: u64 = 48;

/// Offset in a row of its write-back guard word ([`swarm_core::write_back_guard`]).
pub const WRITE_BACK_GUARD: u64 = 56;

/// A claimed row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The writer id (row number).
    pub writer: u16,
    /// Whether the row was used before: its log must be resumed.
    pub reused: bool,
    /// How to resume the log (see the module docs).
    pub resume: Resume,
    /// This incarnation's generation: its summary's stamp.
    pub generation: u64,
    /// The largest tick ceiling read from the row (every node that answered, a
    /// majority at least): at or above every timestamp an earlier incarnation used,
    /// on a cluster with tick ceilings (see the module docs).
    pub ceiling: u64,
}

/// How a new client of a row resumes its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The row was never used: nothing to resume.
    Fresh,
    /// From the summary stamped with this generation, sealed by a clean stop.
    Summary {
        /// The summary's stamp.
        stamp: u64,
    },
    /// By scanning the whole log (no sealed summary).
    Scan,
}

/// The first pause of a registration waiting for a live client's writer id to be
/// given back ([`register`]); it doubles up to 16 times this.
const REGISTER_POLL_NS: Nanos = 10_000_000;

/// Polls for a free row until `deadline`: sleeps `pause` (doubling up to 16 times
/// [`REGISTER_POLL_NS`]) between claims. `None` if none was freed in time.
#[allow(clippy::too_many_arguments)]
async fn poll_free_row<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    stats: &OpStats,
    pause: &mut Nanos,
    deadline: Nanos,
) -> Result<Option<u16>, KvError> {
    while fabric.now().saturating_add(*pause) < deadline {
        swarm_core::sleep(fabric, *pause).await;
        if let Some(row) = claim_free_row(fabric, layout, nodes, token, stats).await? {
            return Ok(Some(row));
        }
        *pause = (*pause * 2).min(16 * REGISTER_POLL_NS);
    }
    Ok(None)
}

/// Claims a free row for the incarnation `token`, or, when every row is claimed,
/// takes over the row of a client whose lease expired (which takes a lease period:
/// [`LeaseParams::observer_wait_ns`]). Returns the row and its lease, renewed.
///
/// `owner` is the registering process's identity, left in the row
/// ([`crate::membership::owner_process`]) by CAS from the word read, on a majority,
/// before the first lease renewal: a reclaimer that finds it naming a running
/// process never takes the row, and a registrant whose CAS failed (the row changed
/// hands after its read) gives up with [`KvError::LeaseExpired`]. An earlier
/// owner's write-back guard is lowered by CAS from the word read, never a later
/// owner's. `owners` says whether a takeover may judge other rows' owners by theirs.
///
/// When every row is held by a live client, it waits up to `wait_ns` for one to be
/// given back (short-lived clients close within milliseconds), polling the table,
/// before it fails with [`KvError::WritersFull`].
#[allow(clippy::too_many_arguments)]
pub async fn register<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
    owner: u64,
    owners: OwnerLiveness,
    wait_ns: Nanos,
) -> Result<(Registration, LeaseHolder), KvError> {
    let started = fabric.now();
    let lease = LeaseParams::from_params(&layout.params);
    let stats = OpStats::new();
    let mut row = claim_free_row(fabric, layout, nodes, token, &stats).await?;
    // The counter an earlier owner of a taken-over row was revoked up to.
    let mut floor = 0;
    // Every row claimed: first wait a little for a live client to close (a script's
    // one-shot commands hold an id for milliseconds), which is cheaper than watching
    // every lease for a lease period.
    let mut pause = REGISTER_POLL_NS + token % REGISTER_POLL_NS;
    if row.is_none() {
        let first_wait = started.saturating_add(wait_ns.min(lease.lease_ns / 2));
        row = poll_free_row(fabric, layout, nodes, token, &stats, &mut pause, first_wait).await?;
    }
    if row.is_none() {
        tracing::info!("every writer id is claimed: looking for clients whose lease expired");
        let reclaimed =
            take_over_expired(fabric, layout, &lease, Some(token), None, owners).await?;
        floor = reclaimed.floor;
        row = reclaimed.taken.map(|r| r.writer);
        if row.is_none() {
            // Another reclaimer took the dead row we tried and released the others
            // before us, or live clients closed during the watch: free rows now.
            row = claim_free_row(fabric, layout, nodes, token, &stats).await?;
        }
        // Every row is a live client's: wait for one to close, polling (spread over
        // the waiting clients by their token), for at most `wait_ns` in all.
        if row.is_none() {
            let deadline = started.saturating_add(wait_ns);
            row = poll_free_row(fabric, layout, nodes, token, &stats, &mut pause, deadline).await?;
        }
    }
    let Some(writer) = row else {
        return Err(KvError::WritersFull {
            writers: layout.params.writers,
        });
    };
    let at = layout.client_row(writer);
    // The row's lease words, used flag and generation word, from every node that
    // answers: a client writes the used flag and raises the generation on a majority
    // (below) before it writes to its log.
    let rt = broadcast_until_among(
        fabric,
        &stats,
        swarm_core::quorum::nodes(nodes),
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(at, 64))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut seen = vec![None; nodes];
    let mut generations = vec![None; nodes];
    let mut identities = vec![None; nodes];
    let mut guards = vec![None; nodes];
    let mut reused = false;
    let mut ceiling = 0;
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
        if let Some(slot) = generations.get_mut(node.index()) {
            *slot = word(4);
        }
        if let Some(slot) = identities.get_mut(node.index()) {
            *slot = word(2);
        }
        if let Some(slot) = guards.get_mut(node.index()) {
            *slot = word(7);
        }
        reused |= word(3).is_some_and(|w| w != 0);
        ceiling = ceiling.max(word(6).unwrap_or(0));
    }
    drop(rt);
    let newest = generations.iter().flatten().copied().max().unwrap_or(0);
    let resume = match (reused, newest & 1 == 1) {
        (false, _) => Resume::Fresh,
        (true, true) => Resume::Summary { stamp: newest >> 1 },
        (true, false) => Resume::Scan,
    };
    let generation = (newest >> 1) + 1;
    let mut keeper = LeaseKeeper::new(lease, seen);
    keeper.raise_base(floor);
    let base = keeper.base();
    let holder = core::cell::RefCell::new(LeaseHolder::new(keeper, at, token, nodes));
    // The owner's identity, on a majority before the first renewal, by CAS from the
    // word read: a reclaimer on this host takes the row only once it found the
    // identity of every process that may have renewed on it gone
    // ([`crate::membership::writer_takeover`], "A registration paused before its
    // fence"). A CAS that fails met a later registrant of the row: it is not ours.
    let named = match name_owner(fabric, &stats, nodes, at + PID, &identities, owner).await {
        Ok(named) => named,
        Err(e) => {
            crate::membership::claim::release(fabric, nodes, at, token);
            return Err(e.into());
        }
    };
    let give_up = || {
        unname_owner(fabric, at + PID, &named, owner);
        crate::membership::claim::release(fabric, nodes, at, token);
    };
    if named.len() < majority(nodes) {
        give_up();
        return Err(KvError::LeaseExpired { writer });
    }
    // The first renewal may meet a reclaimer's kill of the previous owner's lease,
    // which teaches the words to CAS from: a few attempts.
    for _ in 0..4 {
        renew_now(&holder, fabric, 0).await;
        if holder.borrow().valid_until().is_some() {
            break;
        }
    }
    if holder.borrow().valid_until().is_none() {
        give_up();
        return Err(KvError::LeaseExpired { writer });
    }
    // Fenced before anything is stored under the row: a reclaimer that takes it over
    // later revokes this fence, so that nothing this client posted lands after that
    // (`crate::membership::writer_takeover`, "Why a takeover never races a stopped
    // owner's stores"). Until here it stored nothing but CASes on its claim and lease
    // words, harmless whenever they land; and a reclaimer that revoked this client
    // before this fence revokes it again once its claim landed, up to this
    // generation's counters ("A registration paused before its fence" there).
    let fenced = fabric.fence_owner(swarm_core::fabric::OwnerFence {
        lease_word: at + LEASE_WORD,
        stall_ns: lease.observer_wait_ns(),
        base,
    });
    tracing::debug!(writer, fenced, base, "lease fenced on the memory nodes");
    holder.borrow_mut().fenced();
    // The used flag only ever goes from 0 to 1 (a late copy marks a row used that
    // is, which costs the next owner a log scan at most).
    broadcast(fabric, &stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::write(at + USED, 1u64.to_le_bytes().to_vec()))
    })
    .await?;
    // A guard an earlier owner left up would keep one slot of some writer out of use
    // for good; that owner is gone (it closed, or its row was taken over), so lower
    // it, by CAS from the word read: never a later owner's guard.
    for (node, raised) in guards.iter().enumerate() {
        if let Some(raised) = raised.filter(|&g| g != 0) {
            fabric.post_detached(
                NodeId(node as u16),
                &mut Batch::cas(at + WRITE_BACK_GUARD, raised, 0),
            );
        }
    }
    // Before any write to the log: a later registration must see this generation.
    if let Err(e) = raise_word(
        fabric,
        &stats,
        nodes,
        at + GENERATION,
        generation << 1,
        &generations,
    )
    .await
    {
        give_up();
        return Err(e.into());
    }
    tracing::debug!(writer, generation, ?resume, "writer id registered");
    let registration = Registration {
        writer,
        reused,
        resume,
        generation,
        ceiling,
    };
    Ok((registration, holder.into_inner()))
}

/// Writes `owner` into the owner-identity word at `addr` by CAS from the word each
/// node showed (`read`, by node index; a node that did not answer is left alone),
/// once: a CAS that fails met another registrant's identity, which is not
/// overwritten. Returns the nodes where it swapped, with the word they held.
async fn name_owner<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    nodes: usize,
    addr: u64,
    read: &[Option<u64>],
    owner: u64,
) -> Result<Vec<(NodeId, u64)>, FabricError> {
    let posted = read.iter().flatten().count();
    let rt = broadcast_until_among(
        fabric,
        stats,
        swarm_core::quorum::nodes(nodes),
        majority(nodes).min(posted),
        STRAGGLER_NS,
        |node| {
            Ok(read
                .get(node.index())
                .copied()
                .flatten()
                .map(|was| Batch::cas(addr, was, owner)))
        },
        |replies| replies.len() == posted,
    )
    .await?;
    Ok(rt
        .replies()
        .iter()
        .filter_map(|(node, c)| {
            let was = read.get(node.index()).copied().flatten()?;
            (c.cas(0) == Some(was)).then_some((*node, was))
        })
        .collect())
}

/// Gives back the owner-identity word on the nodes `named` swapped (a registration
/// that failed): CAS `owner` → the word it replaced, posted, not awaited. Where a
/// later registrant named itself already, the CAS fails.
fn unname_owner<F: Fabric + ?Sized>(fabric: &F, addr: u64, named: &[(NodeId, u64)], owner: u64) {
    for &(node, was) in named {
        if was != owner {
            fabric.post_detached(node, &mut Batch::cas(addr, owner, was));
        }
    }
}

/// Raises the word at `addr` to at least `target` on the nodes, never lowering it:
/// a CAS from the value each node is known to hold (`known`, by node index; 0 if
/// unknown) to `target`, again from the value a failed CAS returned while it is below
/// `target` (a few rounds). Succeeds once a majority holds `target` or more; fails
/// with [`FabricError::NotEnoughLiveNodes`] otherwise.
pub(crate) async fn raise_word<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    nodes: usize,
    addr: u64,
    target: u64,
    known: &[Option<u64>],
) -> Result<(), FabricError> {
    let mut held: Vec<u64> = (0..nodes)
        .map(|i| known.get(i).copied().flatten().unwrap_or(0))
        .collect();
    let needed = majority(nodes);
    for _ in 0..4 {
        let done = held.iter().filter(|&&w| w >= target).count();
        if done >= needed {
            return Ok(());
        }
        let rt = broadcast_until_among(
            fabric,
            stats,
            swarm_core::quorum::nodes(nodes),
            needed - done,
            STRAGGLER_NS,
            |node| {
                let held = held.get(node.index()).copied().unwrap_or(target);
                Ok((held < target).then(|| Batch::cas(addr, held, target)))
            },
            |_| false,
        )
        .await?;
        for (node, completion) in rt.replies() {
            if let (Some(slot), Some(previous)) = (held.get_mut(node.index()), completion.cas(0)) {
                *slot = if previous == *slot { target } else { previous };
            }
        }
    }
    let live = held.iter().filter(|&&w| w >= target).count();
    if live >= needed {
        Ok(())
    } else {
        Err(FabricError::NotEnoughLiveNodes { needed, live })
    }
}

/// Seals a clean stop (see the module docs, step 2): writes `summary`, stamped with
/// this incarnation's `generation`, to writer `writer`'s summary area on every node,
/// waits for a majority (stragglers up to [`STRAGGLER_NS`]), then raises the row's
/// generation word to sealed on a majority. Posts nothing after `stats`' deadline:
/// the caller arms one its lease covers. Returns `false` if the cluster has no summary
/// area; fails if a step did not reach a majority. Either way the next client then
/// scans the whole log.
pub async fn seal_summary<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
    generation: u64,
    summary: &LogSummary,
) -> Result<bool, FabricError> {
    let Some(at) = layout.summary(writer) else {
        return Ok(false);
    };
    let bytes = summary.encode(generation);
    // In pieces a transport's staging buffer takes (a summary is one bit per slot:
    // 4 MiB covers 32 Mi slots).
    let mut offset = 0;
    for piece in bytes.chunks(SUMMARY_PIECE) {
        broadcast_until_among(
            fabric,
            stats,
            swarm_core::quorum::nodes(nodes),
            majority(nodes),
            STRAGGLER_NS,
            |_| Ok(Some(Batch::write(at + offset, piece.to_vec()))),
            |replies| replies.len() == nodes,
        )
        .await?;
        offset += piece.len() as u64;
    }
    let unsealed = vec![Some(generation << 1); nodes];
    raise_word(
        fabric,
        stats,
        nodes,
        layout.client_row(writer) + GENERATION,
        (generation << 1) | 1,
        &unsealed,
    )
    .await?;
    Ok(true)
}

/// Reads writer `writer`'s log summary stamped `stamp` from every node that answers
/// (a majority, then stragglers up to [`RESUME_STRAGGLER_NS`]; in pieces of at most
/// 4 MiB), and returns the first intact copy; `None` (with the reason logged) if no
/// copy is intact.
pub async fn read_summary<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    nodes: usize,
    writer: u16,
    stamp: u64,
) -> Result<Option<LogSummary>, FabricError> {
    let Some(at) = layout.summary(writer) else {
        return Ok(None);
    };
    let stats = OpStats::new();
    let slots = layout.params.log_slots;
    let len = LogSummary::encoded_len(slots);
    // Each node's copy, read in pieces; a node that misses a piece is dropped.
    let mut copies: Vec<Option<Vec<u8>>> = vec![Some(Vec::with_capacity(len)); nodes];
    let mut offset = 0;
    while offset < len {
        let piece = SUMMARY_PIECE.min(len - offset);
        let rt = broadcast_until_among(
            fabric,
            &stats,
            swarm_core::quorum::nodes(nodes),
            majority(nodes),
            RESUME_STRAGGLER_NS,
            |node| {
                let wanted = copies.get(node.index()).is_some_and(Option::is_some);
                Ok(wanted.then(|| Batch::read(at + offset as u64, piece as u32)))
            },
            |replies| replies.len() == nodes,
        )
        .await?;
        for (i, copy) in copies.iter_mut().enumerate() {
            let got = rt
                .replies()
                .iter()
                .find(|(node, _)| node.index() == i)
                .and_then(|(_, completion)| completion.read(0));
            match (copy.as_mut(), got) {
                (Some(copy), Some(bytes)) => copy.extend_from_slice(bytes),
                _ => *copy = None,
            }
        }
        offset += piece;
    }
    let mut why = None;
    for (node, copy) in copies.iter().enumerate() {
        let Some(copy) = copy else { continue };
        match LogSummary::decode(copy, stamp, slots) {
            Ok(summary) => return Ok(Some(summary)),
            Err(e) => why = Some((node, e)),
        }
    }
    tracing::warn!(
        writer,
        stamp,
        ?why,
        "no intact copy of the sealed log summary: scanning the whole log instead"
    );
    Ok(None)
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
        let row = layout.client_row(writer);
        let budget = layout.params.max_op_ns;
        if claim(fabric, stats, nodes, row, token, budget).await? == Claim::Won {
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
    crate::membership::claim::release(fabric, nodes, layout.client_row(writer), token);
}

/// What [`crate::admin::evict`] did.
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
///
/// Without `force` and with [`OwnerLiveness::ThisHost`], a row whose owner process
/// still runs is not released ([`KvError::OwnerRunning`]): stop or kill that process.
pub async fn evict<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    writer: u16,
    force: bool,
    owners: OwnerLiveness,
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
            if crate::membership::writer_takeover::evict_now(fabric, layout, &lease, writer).await?
            {
                Eviction::Released
            } else {
                Eviction::NotRegistered
            },
        );
    }
    let reclaimed = take_over_expired(fabric, layout, &lease, None, Some(writer), owners).await?;
    if reclaimed.released.contains(&writer) {
        Ok(Eviction::Released)
    } else if reclaimed.running.contains(&writer) {
        Err(KvError::OwnerRunning { writer })
    } else if reclaimed.pending.contains(&writer) {
        Err(KvError::OwnerNotCut { writer })
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
    /// The resume-generation word: `generation << 1 | sealed` (see the module docs).
    pub generation: u64,
}

impl Row {
    /// Whether the row's last incarnation left a sealed log summary (its next client
    /// resumes without reading the log).
    pub fn sealed(&self) -> bool {
        self.generation & 1 == 1
    }
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
            pid: word(row, 2) & 0xFFFF_FFFF,
            used: word(row, 3) != 0,
            generation: word(row, (GENERATION / 8) as usize),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use swarm_core::encoding::WriterId;
    use swarm_core::resume::scan_log;
    use swarm_core::{MemCluster, MemFabric};
    use swarm_core::{OpStats, block_on};

    use super::*;
    use crate::layout::ClusterParams;
    use crate::test_support::{cluster_with, connect};
    use swarm_core::summary::LogSummary;

    const NODE_BYTES: u64 = 4 << 20;

    fn cluster() -> (MemCluster, NodeLayout) {
        cluster_with(ClusterParams::default(), NODE_BYTES as usize)
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
            block_on(
                &fabric,
                register(&fabric, &layout, 3, token, 1, OwnerLiveness::Unknown, 0),
            )
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

    /// The generation word decides how the next client resumes: a sealed summary
    /// only if the newest incarnation sealed one; an incarnation that stopped without
    /// sealing (a crash, an eviction) after resuming from a summary makes the next
    /// one scan, never trust the older summary that misses its writes.
    #[test]
    fn only_the_newest_incarnations_sealed_summary_is_trusted() {
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        let stats = OpStats::new();
        let register = |token| {
            block_on(
                &fabric,
                register(&fabric, &layout, 3, token, 1, OwnerLiveness::Unknown, 0),
            )
            .expect("a free row")
            .0
        };
        let slots = layout.params.log_slots;
        let first = register(11);
        assert_eq!((first.resume, first.generation), (Resume::Fresh, 1));
        let summary = LogSummary::new(slots, vec![0b1010], 500);
        assert!(
            block_on(
                &fabric,
                seal_summary(&fabric, &stats, &layout, 3, 0, first.generation, &summary)
            )
            .expect("three live nodes")
        );
        unregister(&fabric, &layout, 3, 0, 11);

        let second = register(22);
        assert_eq!(second.writer, 0);
        assert_eq!(
            (second.resume, second.generation),
            (Resume::Summary { stamp: 1 }, 2)
        );
        let read =
            block_on(&fabric, read_summary(&fabric, &layout, 3, 0, 1)).expect("three live nodes");
        assert_eq!(read, Some(summary), "the sealed summary is read back");
        // Gone without sealing.
        unregister(&fabric, &layout, 3, 0, 22);

        let third = register(33);
        assert_eq!((third.resume, third.generation), (Resume::Scan, 3));
    }

    /// A summary that reached a majority is found even where one node missed it and
    /// holds an older incarnation's copy.
    #[test]
    fn a_summary_copy_missing_on_one_node_is_read_from_another() {
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        let stats = OpStats::new();
        let slots = layout.params.log_slots;
        let old = LogSummary::new(slots, vec![1], 10).encode(1);
        let new = LogSummary::new(slots, vec![6], 20);
        let at = layout.summary(0).expect("summaries are on");
        block_on(
            &fabric,
            broadcast(&fabric, &stats, node_ids(3), 3, |node| {
                Ok(Batch::write(
                    at,
                    if node.index() == 0 {
                        old.clone()
                    } else {
                        new.encode(2)
                    },
                ))
            }),
        )
        .expect("three live nodes");
        let read =
            block_on(&fabric, read_summary(&fabric, &layout, 3, 0, 2)).expect("three live nodes");
        assert_eq!(read, Some(new));
        let none =
            block_on(&fabric, read_summary(&fabric, &layout, 3, 0, 3)).expect("three live nodes");
        assert_eq!(none, None, "no copy has stamp 3");
    }

    /// End to end: a client that closes cleanly hands its log on by summary; the next
    /// one starts without a whole-log scan (its log's slots are *carried*), keeps the
    /// earlier values readable and examines the carried slots between operations.
    #[test]
    fn a_clean_close_hands_the_log_on_by_summary() {
        let (cluster, layout) = cluster();
        let stats = OpStats::new();
        let first = connect(&cluster, layout);
        for key in [&b"a"[..], b"b", b"c"] {
            block_on(first.fabric(), first.insert(key, b"first", &stats)).expect("inserted");
        }
        let used = first.log_counters().in_use;
        first.close();

        let second = connect(&cluster, layout);
        let log = second.log_counters();
        assert_eq!(
            log.in_use, used,
            "every slot of the first client is carried"
        );
        assert_eq!(
            log.carried + 1,
            used,
            "all but the tombstone slot await examination"
        );
        for _ in 0..50 {
            block_on(second.fabric(), second.get(b"a", &stats)).expect("read");
        }
        assert_eq!(
            second.log_counters().carried,
            0,
            "examined between operations"
        );
        assert_eq!(
            second.log_counters().tracked_registers,
            3,
            "the three buffers are tracked again"
        );
        for key in [&b"a"[..], b"b", b"c"] {
            assert_eq!(
                block_on(second.fabric(), second.get(key, &stats)).expect("read"),
                Some(b"first".to_vec())
            );
        }
    }

    /// One-shot clients that each inherit a log full of superseded buffers (none
    /// lived through a grace) still write: the next client makes room at connect,
    /// before any operation and its deadline.
    #[test]
    fn a_client_resuming_a_full_log_makes_room_before_its_first_operation() {
        const MS: u64 = 1_000_000;
        let params = ClusterParams {
            key_max: 16,
            value_max: 16,
            writers: 2,
            registers: 256,
            chunk_registers: 16,
            index_buckets: 128,
            log_slots: 16,
            lease_ns: 200 * MS,
            lease_renew_ns: 20 * MS,
            max_op_ns: MS,
            cache_ttl_ns: 10 * MS,
            delivery_margin_ns: MS,
            ..ClusterParams::default()
        };
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, layout.end() as usize);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        let stats = OpStats::new();
        let first = connect(&cluster, layout);
        block_on(first.fabric(), first.insert(b"k", b"v0", &stats)).expect("inserted");
        let mut i = 0;
        // A writer waits for two free slots before each write (`KvClient::begin_write`),
        // so it fills its log up to one slot short.
        while first.log_counters().in_use < params.log_slots - 1 {
            i += 1;
            block_on(
                first.fabric(),
                first.update(b"k", format!("v{i}").as_bytes(), &OpStats::new()),
            )
            .expect("updated: the log is not full yet");
        }
        first.close();

        let second = connect(&cluster, layout);
        assert!(
            second.log_counters().in_use < params.log_slots,
            "room was made at connect: {:?}",
            second.log_counters()
        );
        block_on(second.fabric(), second.update(b"k", b"second", &stats))
            .expect("the first operation finds a free slot");
        assert_eq!(
            block_on(second.fabric(), second.get(b"k", &stats)).expect("read"),
            Some(b"second".to_vec())
        );
    }

    #[test]
    fn evicting_a_row_nobody_holds_or_that_does_not_exist() {
        let (cluster, layout) = cluster();
        let fabric = cluster.client();
        assert!(matches!(
            block_on(
                &fabric,
                evict(&fabric, &layout, 2, false, OwnerLiveness::Unknown)
            ),
            Ok(Eviction::NotRegistered)
        ));
        assert!(matches!(
            block_on(
                &fabric,
                evict(&fabric, &layout, 64, true, OwnerLiveness::Unknown)
            ),
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
