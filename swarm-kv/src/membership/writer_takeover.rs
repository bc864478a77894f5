//! Taking over the writer ids of dead clients: watch, kill, take over or release.
//!
//! A client that finds no free row in the client table (or `swarm evict`) reads the
//! table on every node that answers, waits [`LeaseParams::observer_wait_ns`] on its own
//! clock from the read's completion, and then *kills* the lease word of each row still
//! claimed by the same token, by CAS from the value it read to that value with the
//! kill bit ([`crate::membership::lease::KILLED`]). A row whose lease was killed on a majority
//! belonged to a client that can no longer act: [`crate::membership::lease`] proves that its
//! owner's lease ended, and its last batches landed, before the kill was posted. The
//! reclaimer then takes such a row over (CAS of the claim word from the dead token to
//! its own, on a majority, as in [`crate::membership::claim`]) and resumes its log like any reused
//! row ([`crate::membership::writer_ids`]); other dead rows are released (claim word back to 0) so
//! that the next client claims them without waiting.
//!
//! A kill that does not reach a majority means the owner renewed in time: the row is
//! left to its owner (the kills that landed are final, and only cost the owner those
//! nodes' votes until it goes away).
//!
//! # Why a takeover never races a stopped owner's stores
//!
//! The kill proves that the owner's lease ended, not that its stores stopped: a
//! lease bounds when a client *starts* stores, not when they land. A client stopped
//! after its last fence check (SIGSTOP, a VM's stolen time, a long preemption) lands
//! what it was about to store whenever it runs again: an insert's key header and
//! record, a retire mark, a reset, its owner-identity word, its log writes. rTX
//! (seed `rtx.txt`) calls such a store a "fly WRITE" and never lets a lease's expiry
//! alone release anything. So between the kill and the claim CAS (or the release),
//! the reclaimer makes sure the owner can land nothing more, and only then touches
//! the claim word, which is what hands the row, its log, its registers
//! (`crate::registers::limbo`) and its chunks (`crate::registers::orphans`) to others:
//!
//! * **On shared memory** ([`OwnerLiveness::ThisHost`]) it waits for the owner's
//!   process to be gone ([`crate::membership::owner_process`]).
//! * **Over RDMA** it revokes the owner ([`Fabric::revoke_owner`]): every memory node
//!   that may serve again destroys the queue pairs the owner fenced under its lease
//!   word (`register` fences them right after the first renewal, before it stores
//!   anything under the row) and refuses to fence that generation again, and only
//!   then acknowledges (`swarm_rdma::lease_watch`, "Revocation"). A node revokes only
//!   where the word is killed: a node that answers with a live word gets it killed
//!   (from that value, while the row's claim there still holds the dead token) and is
//!   asked again. A node that does not answer stalls the takeover
//!   ([`REVOKE_PATIENCE_NS`], then the row is left for a later pass,
//!   [`Reclaimed::pending`]): timing bounds liveness, never safety.
//!
//! Register chunks claimed by a dead client keep its token in their claim words: they
//! are not reclaimed here but adopted, once its row no longer holds its token, by the
//! next client that runs out of chunks ([`crate::registers::orphans`]).

use swarm_core::fabric::{Nanos, Revocation};
use swarm_core::quorum::{broadcast_until, majority};
use swarm_core::{Batch, Fabric, NodeId, OpStats, Roundtrip, WaitOutcome};

use crate::KvError;
use crate::layout::{CLIENT_ROW_BYTES, NodeLayout};
use crate::membership::lease::{KILLED, LeaseParams, counter, is_killed};
use crate::membership::lease_renewal::LEASE_WORD;
use crate::membership::owner_process::{self, OwnerLiveness};

/// How long a reclaimer waits for nodes beyond a majority at each step.
pub const STRAGGLER_NS: Nanos = 50_000_000;

/// How long a reclaimer keeps asking for a revocation's acknowledgements (driving
/// reconnects to nodes that failed) before it leaves the row for a later pass.
pub const REVOKE_PATIENCE_NS: Nanos = 2_000_000_000;

/// A row of the client table as read from every node that answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRow {
    /// The writer id.
    pub writer: u16,
    /// The token held on a majority of all nodes (0: none).
    pub token: u64,
    /// The lease word on each node (`None`: no answer).
    pub lease: Vec<Option<u64>>,
    /// The owner process identities (word 2) the nodes showed, distinct, non-zero
    /// ([`crate::membership::owner_process`]).
    pub owners: Vec<u64>,
}

/// What a takeover pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// The row taken over for the caller, with its lease words as last seen.
    pub taken: Option<ObservedRow>,
    /// Rows found dead and released (claim word back to 0).
    pub released: Vec<u16>,
    /// Rows whose owner renewed during the watch: alive.
    pub alive: Vec<u16>,
    /// Rows whose lease lapsed (and is now killed) but whose owner process still
    /// runs on this host ([`OwnerLiveness::ThisHost`]): left to it, since a stopped
    /// process may still store into what the row holds when it is continued.
    pub running: Vec<u16>,
    /// Rows whose lease is killed but whose owner not every memory node has cut yet
    /// ([`Fabric::revoke_owner`]: a node did not answer, or the row changed hands
    /// meanwhile): neither taken nor released.
    pub pending: Vec<u16>,
    /// The largest lease counter the taken row was revoked up to: the taker's lease
    /// generation must start above it (`LeaseKeeper::raise_base`).
    pub floor: u64,
}

/// Reads the whole client table on every node that answers (a majority at least).
pub async fn observe<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
) -> Result<Vec<ObservedRow>, KvError> {
    let nodes = fabric.node_count();
    let writers = usize::from(layout.params.writers);
    let bytes = u32::try_from(writers as u64 * CLIENT_ROW_BYTES)
        .map_err(|_| KvError::Unsupported("a client table larger than 4 GiB"))?;
    let stats = OpStats::new();
    let rt = broadcast_until(
        fabric,
        &stats,
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(layout.clients_at, bytes))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut rows: Vec<ObservedRow> = (0..writers)
        .map(|w| ObservedRow {
            writer: w as u16,
            token: 0,
            lease: vec![None; nodes],
            owners: Vec::new(),
        })
        .collect();
    let mut tokens: Vec<Vec<u64>> = vec![Vec::new(); writers];
    for (node, completion) in rt.replies() {
        let data = completion.read(0).unwrap_or_default();
        for (w, row) in rows.iter_mut().enumerate() {
            let word = |i: usize| {
                let at = w * CLIENT_ROW_BYTES as usize + i * 8;
                data.get(at..at + 8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            };
            if let (Some(token), Some(lease)) = (word(0), word(1)) {
                tokens[w].push(token);
                if let Some(slot) = row.lease.get_mut(node.index()) {
                    *slot = Some(lease);
                }
            }
            if let Some(owner) = word(2).filter(|&o| o != 0)
                && !row.owners.contains(&owner)
            {
                row.owners.push(owner);
            }
        }
    }
    for (row, seen) in rows.iter_mut().zip(tokens) {
        row.token = seen
            .iter()
            .copied()
            .find(|t| *t != 0 && seen.iter().filter(|s| *s == t).count() >= majority(nodes))
            .unwrap_or(0);
    }
    Ok(rows)
}

/// CASes `word(node)` at `addr` on every node `build` gives a batch for, waiting for
/// all of them (stragglers up to [`STRAGGLER_NS`]); returns `(node, previous)`.
async fn cas_all<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    posts: &[(NodeId, u64, u64, u64)],
) -> Result<Vec<(NodeId, u64)>, KvError> {
    let mut out = Vec::new();
    for chunk in posts.chunks(swarm_core::MAX_NODES) {
        let mut rt = Roundtrip::start(fabric, stats);
        for &(node, addr, expected, new) in chunk {
            rt.post(node, Batch::cas(addr, expected, new))?;
        }
        let deadline = fabric.now().saturating_add(STRAGGLER_NS);
        if rt.wait_until(chunk.len(), deadline).await == WaitOutcome::Short {
            tracing::debug!("reclaim: some memory nodes did not answer a CAS in time");
        }
        out.extend(
            rt.replies()
                .iter()
                .filter_map(|(node, c)| c.cas(0).map(|p| (*node, p))),
        );
    }
    Ok(out)
}

/// Kills the lease of `row` from the values observed; returns whether it is now
/// killed on a majority (kills by other reclaimers of the same values count).
async fn kill<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
) -> Result<bool, KvError> {
    let nodes = fabric.node_count();
    let addr = layout.client_row(row.writer) + LEASE_WORD;
    let mut killed = 0;
    let mut posts = Vec::new();
    for (node, word) in row.lease.iter().enumerate() {
        match word {
            Some(w) if is_killed(*w) => killed += 1,
            Some(w) => posts.push((NodeId(node as u16), addr, *w, *w | KILLED)),
            None => {}
        }
    }
    let stats = OpStats::new();
    for (node, previous) in cas_all(fabric, &stats, &posts).await? {
        let observed = row.lease.get(node.index()).copied().flatten();
        if observed.is_some_and(|w| previous == w || previous == w | KILLED) {
            killed += 1;
        }
    }
    Ok(killed >= majority(nodes))
}

/// Revokes the owner of `row`, whose lease is killed on a majority, on every memory
/// node that may serve again (module docs, "Why a takeover never races a stopped
/// owner's stores"); returns the counter it was revoked up to, or `None` if some node
/// did not acknowledge within [`REVOKE_PATIENCE_NS`] or the row changed hands.
async fn revoke<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
) -> Result<Option<u64>, KvError> {
    let row_at = layout.client_row(row.writer);
    let addr = row_at + LEASE_WORD;
    let mut floor = row
        .lease
        .iter()
        .flatten()
        .map(|w| counter(*w))
        .max()
        .unwrap_or(0);
    let started = fabric.now();
    let stats = OpStats::new();
    loop {
        let missing = match fabric.revoke_owner(addr, floor) {
            Revocation::NotNeeded | Revocation::Acknowledged => return Ok(Some(floor)),
            Revocation::Incomplete(missing) => missing,
        };
        // A node that answered with a live word: the kill did not reach it (it
        // needs only a majority), or the owner's stale renewal landed there after
        // the observation (a kill is final for its generation, so it renews nothing
        // over one). Kill it from that value, but only where the row's claim still
        // holds the dead token: another reclaimer that took the row over meanwhile
        // renews over our kills, and its lease is not ours to end.
        let live: Vec<(NodeId, u64)> = missing
            .iter()
            .filter_map(|&(node, word)| word.map(|w| (node, w)))
            .collect();
        for &(node, word) in &live {
            let mut rt = Roundtrip::start(fabric, &stats);
            if rt.post(node, Batch::read(row_at, 8)).is_err() {
                continue;
            }
            let deadline = fabric.now().saturating_add(STRAGGLER_NS);
            if rt.wait_until(1, deadline).await == WaitOutcome::Short {
                continue;
            }
            let Some(Some(claim)) = rt.replies().first().map(|(_, c)| {
                c.read(0)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
            }) else {
                continue;
            };
            if claim != row.token {
                tracing::info!(
                    writer = row.writer,
                    %node,
                    "the row changed hands while its owner was being revoked: left alone"
                );
                return Ok(None);
            }
            floor = floor.max(counter(word));
            cas_all(fabric, &stats, &[(node, addr, word, word | KILLED)]).await?;
        }
        if fabric.now().saturating_sub(started) >= REVOKE_PATIENCE_NS {
            tracing::warn!(
                writer = row.writer,
                ?missing,
                "memory nodes did not acknowledge the revocation of a dead client's lease: \
                 its writer id is left for a later pass"
            );
            return Ok(None);
        }
        if live.is_empty() {
            // Silent nodes: give the transport time to reconnect them.
            swarm_core::sleep(fabric, 20_000_000).await;
        }
    }
}

/// Watches the rows claimed on a majority (only `only`, if given) for a lease period,
/// kills those whose owner did not renew, and takes the first dead one over for
/// `taker` (a token; `None`: release them all). Rows already killed on a majority (an
/// earlier reclaim stopped half way) are not waited for. With
/// [`OwnerLiveness::ThisHost`], a row whose owner process still runs is killed but
/// neither taken nor released ([`Reclaimed::running`]).
pub async fn take_over_expired<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    lease: &LeaseParams,
    taker: Option<u64>,
    only: Option<u16>,
    owners: OwnerLiveness,
) -> Result<Reclaimed, KvError> {
    let nodes = fabric.node_count();
    let observed = observe(fabric, layout).await?;
    let watched_at = fabric.now();
    let candidates: Vec<ObservedRow> = observed
        .into_iter()
        .filter(|r| r.token != 0 && only.is_none_or(|w| w == r.writer))
        .collect();
    let mut result = Reclaimed::default();
    if candidates.is_empty() {
        return Ok(result);
    }
    let all_killed = candidates
        .iter()
        .all(|r| r.lease.iter().flatten().filter(|w| is_killed(**w)).count() >= majority(nodes));
    if !all_killed {
        let wait = lease.observer_wait_ns();
        tracing::info!(
            rows = candidates.len(),
            wait_ms = wait / 1_000_000,
            "watching claimed writer ids for expired leases"
        );
        let elapsed = fabric.now().saturating_sub(watched_at);
        swarm_core::sleep(fabric, wait.saturating_sub(elapsed)).await;
    }
    let stats = OpStats::new();
    for row in candidates {
        if !kill(fabric, layout, &row).await? {
            tracing::debug!(writer = row.writer, "lease renewed while watched: alive");
            result.alive.push(row.writer);
            continue;
        }
        if owners == OwnerLiveness::ThisHost
            && row
                .owners
                .iter()
                .any(|&o| owner_process::alive(o) == Some(true))
        {
            // Killed: if it is only stopped, it finds out at its next renewal and
            // stops; until its process is gone its late stores may still land.
            tracing::info!(
                writer = row.writer,
                owners = ?row.owners,
                "lease lapsed, but the owner process still runs: its writer id is left to it"
            );
            result.running.push(row.writer);
            continue;
        }
        // Nothing of the dead owner may land once the claim word changes: that hands
        // its row, log, registers and chunks to others (module docs).
        let Some(floor) = revoke(fabric, layout, &row).await? else {
            result.pending.push(row.writer);
            continue;
        };
        let claim_at = layout.client_row(row.writer);
        if let (Some(token), None) = (taker, &result.taken) {
            let posts: Vec<_> = (0..nodes)
                .map(|n| (NodeId(n as u16), claim_at, row.token, token))
                .collect();
            let won = cas_all(fabric, &stats, &posts)
                .await?
                .iter()
                .filter(|(_, prev)| *prev == row.token || *prev == token)
                .count();
            if won >= majority(nodes) {
                tracing::info!(
                    writer = row.writer,
                    "took over the writer id of a dead client"
                );
                result.floor = floor;
                result.taken = Some(row);
                continue;
            }
            // Split with another reclaimer: give our copies back to the dead token.
            crate::membership::claim::give_back(fabric, nodes, claim_at, token, row.token);
        }
        // A write-back guard the dead client left up stays up until the row's next
        // owner registers and lowers it (`crate::membership::writer_ids`): one slot
        // of some writer kept out of use meanwhile. Not lowered here: this is a plain
        // store, and a reclaimer stopped right before it would land it after another
        // reclaimer released the row and a new owner raised its own guard, which a
        // write-back relies on (`swarm_core::write_back_guard`; docs/pauses.md).
        let posts: Vec<_> = (0..nodes)
            .map(|n| (NodeId(n as u16), claim_at, row.token, 0))
            .collect();
        cas_all(fabric, &stats, &posts).await?;
        tracing::info!(
            writer = row.writer,
            "released the writer id of a dead client"
        );
        result.released.push(row.writer);
    }
    Ok(result)
}

/// Kills the lease of `writer` now, whatever its age, then waits out the longest
/// lease its owner may still believe in, and releases the row (`swarm evict
/// --force`). Returns whether the row was registered. A live owner finds its lease
/// killed at its next renewal and stops with [`KvError::LeaseExpired`].
pub async fn evict_now<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    lease: &LeaseParams,
    writer: u16,
) -> Result<bool, KvError> {
    let nodes = fabric.node_count();
    // The owner may renew between our read and our kill: read again and retry.
    for _ in 0..16 {
        let observed = observe(fabric, layout).await?;
        let Some(row) = observed.into_iter().find(|r| r.writer == writer) else {
            return Ok(false);
        };
        if row.token == 0 {
            return Ok(false);
        }
        if !kill(fabric, layout, &row).await? {
            continue;
        }
        // Every renewal a majority acknowledged was sent before the kill completed.
        swarm_core::sleep(fabric, lease.observer_wait_ns()).await;
        // Its queue pairs are cut before the row is released (module docs).
        if revoke(fabric, layout, &row).await?.is_none() {
            return Err(KvError::OwnerNotCut { writer });
        }
        let posts: Vec<_> = (0..nodes)
            .map(|n| (NodeId(n as u16), layout.client_row(writer), row.token, 0))
            .collect();
        cas_all(fabric, &OpStats::new(), &posts).await?;
        return Ok(true);
    }
    Err(KvError::Contended { attempts: 16 })
}
