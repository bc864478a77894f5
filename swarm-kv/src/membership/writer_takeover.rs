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
//! # A running owner's lease is not killed (shared memory)
//!
//! With [`OwnerLiveness::ThisHost`] a row whose observed owner identity (word 2)
//! names a running process is neither taken nor released (above), so the reclaimer
//! does not kill its lease either: it only reads the lease words again, to tell a
//! lapsed lease ([`Reclaimed::running`]) from a renewed one ([`Reclaimed::alive`]).
//! A kill there would gain the reclaimer nothing, and would cost the owner its id
//! for good: a kill is final, so every later operation of a client that merely did
//! not renew for a watch (idle between operations, a thread waiting for its
//! siblings, a client connected first while the same process connects its others
//! and watches the table, a stopped process continued) would fail with
//! `LeaseExpired` although its lease only lapsed and no one could take its row.
//! Instead it revives the lapsed lease at its next operation
//! ([`crate::membership::lease`], "Idle clients").
//!
//! Safety does not rest on the kill here. A row changes hands only through
//! [`hand_over`], after a kill on a majority and once no process named by the row
//! runs; skipping the kill of a row that is then left alone changes nothing for it.
//! An owner identity never names a running process again once that process is gone
//! (pid and start time), so a row skipped because its process ran is killed, taken
//! or released by a later pass once the process is gone; and a registrant that
//! named itself after the observation is judged again after the claim, in
//! [`hand_over`], as before. The cost: once the owner's process is gone, the next
//! reclaimer watches the row for a whole observer's wait instead of finding it
//! killed already.
//!
//! # A registration paused before its fence
//!
//! A client fences itself only once it holds the row and an acknowledged lease
//! (`crate::membership::writer_ids::register`), so a revocation acknowledged before
//! its fence cut nothing of it. Two things keep such a client harmless, however it
//! pauses:
//!
//! * **Nothing it posts before its fence is a plain store**: the claim CASes (from
//!   0, or from a stale copy's token), its lease renewals (CAS from a word it read;
//!   the owner's wall-clock write rides on renewals only once it is fenced), the
//!   release of a claim it gave up, and, as a reclaimer itself, kills, claims and
//!   releases by CAS (a released row's write-back guard is lowered by its next owner,
//!   fenced, not by the reclaimer). Landing after the row changed hands, each fails
//!   (its expected word is gone for good: lease words never repeat, tokens are
//!   unique) or sets a minority copy of a claim word that the row's owner takes back
//!   at its next renewal; none counts for a lease (a renewal counts only where the
//!   claim read after it holds the renewer's token).
//! * **Its generation is revoked whenever it renewed.** The dead client may be
//!   registering the very row being taken over: paused between its claim and its
//!   read of the lease words for longer than the watch, it then reads the
//!   reclaimer's kill, takes it for an earlier owner's (its base is above it), renews
//!   over it and fences itself with that base, above the floor of the revocation
//!   already acknowledged. So the reclaimer, after its claim CAS landed on a majority
//!   ([`hand_over`]), reads the lease word on every node where it landed. An
//!   acknowledged renewal of the dead client counted on a majority, each time before
//!   the reclaimer's claim landed there (the claim read after the renewal's CAS held
//!   the dead token), so one of those nodes shows its counter, at or above its base.
//!   A word not killed, or killed above the floor, is killed and revoked again up to
//!   its counter, before the row is used or released. After the claim no renewal of
//!   the dead client counts on a majority again, so its base is at or below the final
//!   floor: every node that acknowledged refuses its fence or cut it. A release goes
//!   the same way, through a token of the reclaimer's own (`reclaimer_token`), then
//!   back to 0.
//! * **On shared memory, its identity is read after the claim.** Nothing is revoked
//!   there, so the owner check above must cover such a registrant too. A registrant
//!   names itself in word 2 on a majority, by CAS from the word it read, before its
//!   first renewal (`crate::membership::writer_ids::register`), and a CAS that fails
//!   (a later registrant named itself) ends its registration. So once the
//!   reclaimer's claim is on a majority, the identity of every process whose renewal
//!   counted before it is on one of the nodes it swapped (or was replaced, by CAS,
//!   by a later registrant's, itself judged), and no renewal counts after it. The
//!   reclaimer reads word 2 there and, if a named process runs, hands the copies
//!   back to the dead token and leaves the row ([`Reclaimed::running`]). A registrant
//!   that read the word before the reclaimer's successor named itself finds its CAS
//!   failed, and never renews: it stores nothing plain under a row that is not its
//!   own (docs/pauses.md).
//!
//! # A kill counted across a repair
//!
//! A kill stops revivals only while a majority of copies is killed *at once*: no
//! renewal counts on a majority after that (`crate::membership::lease`, "Idle
//! clients"). A node that loses its memory is rebuilt with the most advanced lease
//! word its donors show (`crate::repair::merge::lease_word`): killed if the kill
//! reached one of them before the repair's copy read it, live otherwise. A kill round
//! counts its answers one by one, so a reclaimer that counted node X's kill and
//! stopped before its kill of node Y landed could wake up after a repair rebuilt X
//! from donors that the kill had not reached, and count X (from before the loss) and
//! Y: a majority, while only Y is killed. The owner then revives on X and the third
//! node, and the reclaimer takes over a row whose owner holds a renewed lease
//! (`docs/pauses.md`, H3'; test `a_kill_counted_across_a_repair_is_undecided`). On
//! shared memory with [`OwnerLiveness::ThisHost`] that owner's process is gone, so
//! nothing revives; over RDMA the revocation finds the live words and cuts the
//! owner; but where the lease alone decides (a transport that revokes nothing with
//! [`OwnerLiveness::Unknown`], `swarm evict --force`), two clients would hold the
//! row. So [`kill`]:
//!
//! * counts only answers of its own round: a copy observed killed already is CASed
//!   onto itself (a read), since the observation is older than the watch, and a
//!   pass that handles many rows reaches a later row's kill long after it, stops or
//!   not (`a_kill_observed_before_a_repair_counts_only_if_still_there`);
//! * counts them only if a clock reading after the last one is within `max_op_ns`
//!   of the round's start, as a claim round does (`crate::membership::claim`, "A
//!   round that straddles a repair"); otherwise the row is left for a later pass
//!   ([`Reclaimed::pending`]). Every answer it counts landed after the start, and a
//!   repair copies a node only a quiescence (longer than `max_op_ns`) after the
//!   node's loss, so no copy began between two counted answers. A node that lost its
//!   memory after its kill landed is rebuilt from donors that include another node
//!   the round counted killed, and it comes back killed.
//!
//! # The takeover's other rounds, across a repair
//!
//! Safe by structure, not fenced:
//!
//! * **The take** ([`hand_over`]: CAS dead token → own, counted on a majority) can
//!   count a win across a repair just as a claim could (X's answer from before its
//!   loss, a donor's late answer), while a second reclaimer won X, rebuilt showing
//!   the dead token, and the other donor. Both believe they hold the row, but the
//!   stopped one's copies are no majority: the second one's all hold its token when
//!   both rounds end (no reclaimer takes another's copies). The stopped one, as a
//!   taker, registers, and its first lease renewal reads the claim word in its own
//!   batch and counts only where it holds its token, so it gives the row back
//!   before it stores anything under it (`crate::membership::writer_ids`; at worst
//!   its owner-identity CAS made the second one give up too: both leave the row;
//!   `a_take_counted_across_a_repair_leaves_the_row_to_one_taker`); as a
//!   releaser it sets back to 0 only its own copy, a minority (a claimer that counts
//!   it finds the row [`crate::membership::claim::Claim::Taken`]). Over RDMA its
//!   lease read after the take may find the second one's renewal on X and revoke
//!   that generation: the second reclaimer then loses its writer id (it fails with
//!   `LeaseExpired`), a cost in liveness, never a second owner.
//! * **The give-back** (own → dead token) and **the release** (own → 0) are posted,
//!   not counted, and change only copies that hold the reclaimer's own token, which
//!   is unique. A copy set back to the dead token is taken again only by a take
//!   from it, under the argument above.
//! * **Revocations** count the memory nodes' acknowledgements; a node rebuilt between
//!   them is the transport's business (`swarm_rdma`, revocation floors).
//!
//! Register chunks claimed by a dead client keep its token in their claim words: they
//! are not reclaimed here but adopted, once its row no longer holds its token, by the
//! next client that runs out of chunks ([`crate::registers::orphans`]).

use swarm_core::fabric::{Nanos, Revocation};
use swarm_core::quorum::{broadcast_until_among, majority};
use swarm_core::{Batch, Fabric, NodeId, OpStats, Roundtrip, WaitOutcome};

use crate::KvError;
use crate::layout::{CLIENT_ROW_BYTES, NodeLayout};
use crate::membership::lease::{KILLED, LeaseParams, counter, is_killed};
use crate::membership::lease_renewal::LEASE_WORD;
use crate::membership::owner_process::{self, OwnerLiveness};
use crate::membership::writer_ids::PID;

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
    /// Rows whose lease lapsed but whose owner process still runs on this host
    /// ([`OwnerLiveness::ThisHost`]): left to it, since a stopped process may still
    /// store into what the row holds when it is continued, and its lease not killed
    /// (module docs, "A running owner's lease is not killed"; killed only where the
    /// running process was found after the kill, a registrant that named itself
    /// after the observation).
    pub running: Vec<u16>,
    /// Rows whose lease is killed but whose owner not every memory node has cut yet
    /// ([`Fabric::revoke_owner`]: a node did not answer, or the row changed hands
    /// meanwhile), or whose kill round ran past its fence (module docs, "A kill
    /// counted across a repair"): neither taken nor released.
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
    let nodes = layout.metadata_nodes(fabric.node_count());
    let writers = usize::from(layout.params.writers);
    let bytes = u32::try_from(writers as u64 * CLIENT_ROW_BYTES)
        .map_err(|_| KvError::Unsupported("a client table larger than 4 GiB"))?;
    let stats = OpStats::new();
    let rt = broadcast_until_among(
        fabric,
        &stats,
        swarm_core::quorum::nodes(nodes),
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
    cas_all_within(fabric, stats, posts, STRAGGLER_NS).await
}

/// [`cas_all`], waiting up to `straggle` for each chunk of posts.
async fn cas_all_within<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    posts: &[(NodeId, u64, u64, u64)],
    straggle: Nanos,
) -> Result<Vec<(NodeId, u64)>, KvError> {
    let mut out = Vec::new();
    for chunk in posts.chunks(swarm_core::MAX_NODES) {
        let mut rt = Roundtrip::start(fabric, stats);
        for &(node, addr, expected, new) in chunk {
            rt.post(node, Batch::cas(addr, expected, new))?;
        }
        let deadline = fabric.now().saturating_add(straggle);
        if rt.settle_until(deadline).await == WaitOutcome::Short {
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

/// How a kill round ([`kill`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// Killed on a majority at once: no renewal of the owner counts any more.
    Killed,
    /// The owner renewed in time on enough nodes: the row is left to it.
    Alive,
    /// The round's answers came past its fence (module docs, "A kill counted across
    /// a repair"): they prove nothing; the row is left for a later pass.
    Undecided,
}

/// Kills the lease of `row` from the values observed; returns whether it is now
/// killed on a majority (kills by other reclaimers of the same values count). Every
/// node counted answered this round: a word observed killed already is CASed onto
/// itself, which only reads it. The round counts nothing if a clock reading after its
/// last answer is past `max_op_ns` from its start (module docs, "A kill counted
/// across a repair").
async fn kill<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    lease: &LeaseParams,
    row: &ObservedRow,
) -> Result<Kill, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let addr = layout.client_row(row.writer) + LEASE_WORD;
    let posts: Vec<_> = row
        .lease
        .iter()
        .enumerate()
        .filter_map(|(node, word)| word.map(|w| (NodeId(node as u16), addr, w, w | KILLED)))
        .collect();
    let stats = OpStats::new();
    let started = fabric.now();
    // Stragglers within the fence (a quarter of it), as a claim round waits.
    let straggle = STRAGGLER_NS.min(lease.max_op_ns / 4);
    let answers = cas_all_within(fabric, &stats, &posts, straggle).await?;
    if fabric.now().saturating_sub(started) > lease.max_op_ns {
        tracing::debug!(
            writer = row.writer,
            "kill round ran past its fence: undecided, left for a later pass"
        );
        return Ok(Kill::Undecided);
    }
    let killed = answers
        .iter()
        .filter(|&&(node, previous)| {
            let observed = row.lease.get(node.index()).copied().flatten();
            observed.is_some_and(|w| previous == w || previous == w | KILLED)
        })
        .count();
    Ok(if killed >= majority(nodes) {
        Kill::Killed
    } else {
        Kill::Alive
    })
}

/// Whether the lease of `row` did not move since it was observed: on a majority of
/// the nodes it still holds the word observed there, or a killed word (a kill is
/// final). Reads only: what [`kill`] decides, without the kill.
async fn lapsed<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
) -> Result<bool, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let addr = layout.client_row(row.writer) + LEASE_WORD;
    let posted = row.lease.iter().flatten().count();
    let stats = OpStats::new();
    let rt = broadcast_until_among(
        fabric,
        &stats,
        swarm_core::quorum::nodes(nodes),
        majority(nodes).min(posted),
        STRAGGLER_NS,
        |node| {
            Ok(row
                .lease
                .get(node.index())
                .copied()
                .flatten()
                .map(|_| Batch::read(addr, 8)))
        },
        |replies| replies.len() == posted,
    )
    .await?;
    let unmoved = rt
        .replies()
        .iter()
        .filter(|(node, c)| {
            let word = c
                .read(0)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes);
            let observed = row.lease.get(node.index()).copied().flatten();
            word.is_some_and(|w| is_killed(w) || Some(w) == observed)
        })
        .count();
    Ok(unmoved >= majority(nodes))
}

/// Revokes the owner of `row`, whose lease is killed on a majority, on every memory
/// node that may serve again (module docs, "Why a takeover never races a stopped
/// owner's stores"), up to `floor` at least; returns the counter it was revoked up
/// to, or `None` if some node did not acknowledge within [`REVOKE_PATIENCE_NS`] or
/// the row changed hands. A node that answers with a live word gets it killed: with
/// `claimed_by` `Some(token)` only where the row's claim word there holds `token`,
/// with `None` wherever (the caller holds the row on a majority, so that no other
/// client's renewal can count any more, [`hand_over`]).
async fn revoke<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
    floor: u64,
    claimed_by: Option<u64>,
) -> Result<Option<u64>, KvError> {
    let row_at = layout.client_row(row.writer);
    let addr = row_at + LEASE_WORD;
    let mut floor = row
        .lease
        .iter()
        .flatten()
        .map(|w| counter(*w))
        .fold(floor, u64::max);
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
        // over one). Kill it from that value, but (before the caller holds the row)
        // only where the row's claim still holds the dead token: another reclaimer
        // that took the row over meanwhile renews over our kills, and its lease is
        // not ours to end.
        let live: Vec<(NodeId, u64)> = missing
            .iter()
            .filter_map(|&(node, word)| word.map(|w| (node, w)))
            .collect();
        for &(node, word) in &live {
            if let Some(token) = claimed_by {
                match read_word(fabric, &stats, node, row_at).await {
                    None => continue,
                    Some(claim) if claim != token => {
                        tracing::info!(
                            writer = row.writer,
                            %node,
                            "the row changed hands while its owner was being revoked: left alone"
                        );
                        return Ok(None);
                    }
                    Some(_) => {}
                }
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
        // Silent nodes: give the transport time to reconnect them. Live words: the
        // kills above need a moment to land, and asking again at once would load
        // the nodes with revocations (a kill to a node this client cannot reach
        // never lands).
        swarm_core::sleep(fabric, 20_000_000).await;
    }
}

/// The word at `addr` on `node`, if it answers within [`STRAGGLER_NS`].
async fn read_word<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    node: NodeId,
    addr: u64,
) -> Option<u64> {
    let mut rt = Roundtrip::start(fabric, stats);
    rt.post(node, Batch::read(addr, 8)).ok()?;
    let deadline = fabric.now().saturating_add(STRAGGLER_NS);
    if rt.wait_until(1, deadline).await == WaitOutcome::Short {
        return None;
    }
    rt.replies().first().and_then(|(_, c)| {
        c.read(0)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    })
}

/// How [`hand_over`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandOver {
    /// The row's claim word holds the new token on a majority, and every generation
    /// of the earlier owner is revoked up to this counter.
    Done(u64),
    /// Another reclaimer's claim split the copies: ours went back to the dead token.
    Split,
    /// A second revocation (below) did not complete: our copies went back to the
    /// dead token, and the row is left for a later pass.
    Uncut,
    /// On this host, a process that may have renewed on the row still runs (its
    /// identity was read after our claim): our copies went back to the dead token.
    Running,
}

/// Hands `row`, whose owner is revoked up to `floor`, to the token `to`: CASes the
/// claim word from the dead token to `to` on every node and, once a majority
/// swapped, reads the lease word on every node that swapped. A word the revocation
/// did not cover (not killed, or killed above `floor`) is the dead owner's
/// *registration*, paused before its fence, that renewed over the kill after the
/// revocation was acknowledged (module docs, "A registration paused before its
/// fence"): that word is killed and the owner revoked again up to it, before the
/// row is used or released.
///
/// With [`OwnerLiveness::ThisHost`] it also reads the owner-identity word on those
/// nodes: a registrant names itself there on a majority before its first renewal
/// (`crate::membership::writer_ids::register`), so the identity of every process
/// whose renewal counted before our claim is on one of them. If one still runs, the
/// row goes back to the dead token ([`HandOver::Running`]).
async fn hand_over<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
    floor: u64,
    to: u64,
    owners: OwnerLiveness,
) -> Result<HandOver, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let stats = OpStats::new();
    let claim_at = layout.client_row(row.writer);
    let posts: Vec<_> = (0..nodes)
        .map(|n| (NodeId(n as u16), claim_at, row.token, to))
        .collect();
    let swapped: Vec<NodeId> = cas_all(fabric, &stats, &posts)
        .await?
        .into_iter()
        .filter(|&(_, prev)| prev == row.token || prev == to)
        .map(|(node, _)| node)
        .collect();
    if swapped.len() < majority(nodes) {
        crate::membership::claim::give_back(fabric, nodes, claim_at, to, row.token);
        return Ok(HandOver::Split);
    }
    if owners == OwnerLiveness::ThisHost {
        for &node in &swapped {
            let identity = read_word(fabric, &stats, node, claim_at + PID).await;
            if identity.is_some_and(|o| owner_process::alive(o) == Some(true)) {
                tracing::info!(
                    writer = row.writer,
                    %node,
                    "a process named by the row still runs: its writer id is left to it"
                );
                crate::membership::claim::give_back(fabric, nodes, claim_at, to, row.token);
                return Ok(HandOver::Running);
            }
        }
    }
    // Every node whose claim we swapped: an acknowledged renewal of the dead owner
    // counted on a majority, each before our claim landed there, so one of them is
    // here, read after our claim.
    let mut seen = vec![None; nodes];
    for &node in &swapped {
        match read_word(fabric, &stats, node, claim_at + LEASE_WORD).await {
            Some(word) => seen[node.index()] = Some(word),
            None => {
                crate::membership::claim::give_back(fabric, nodes, claim_at, to, row.token);
                return Ok(HandOver::Uncut);
            }
        }
    }
    let covered = seen
        .iter()
        .flatten()
        .all(|&w| is_killed(w) && counter(w) <= floor);
    if covered {
        return Ok(HandOver::Done(floor));
    }
    tracing::warn!(
        writer = row.writer,
        ?seen,
        floor,
        "the dead owner's lease moved after its revocation (a registration paused before \
         its fence): revoking it again"
    );
    let again = ObservedRow {
        lease: seen,
        ..row.clone()
    };
    match revoke(fabric, layout, &again, floor, None).await? {
        Some(floor) => Ok(HandOver::Done(floor)),
        None => {
            crate::membership::claim::give_back(fabric, nodes, claim_at, to, row.token);
            Ok(HandOver::Uncut)
        }
    }
}

/// A token for a reclaimer that releases a row: the row is handed to it first
/// ([`hand_over`]), then given back to 0. Unique like a client's incarnation token,
/// and never a client's (it is never used to register).
fn reclaimer_token(writer: u16) -> u64 {
    static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    let mut bytes = [0u8; 26];
    bytes[..8].copy_from_slice(&crate::clock::SystemClock::unix_ns().to_le_bytes());
    bytes[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    let n = NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    bytes[16..24].copy_from_slice(&n.to_le_bytes());
    bytes[24..].copy_from_slice(&writer.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes) | 1
}

/// Releases `row`, whose owner is revoked up to `floor`: hands it to a reclaimer
/// token ([`hand_over`]), then CASes that token back to 0 on every node. Returns how
/// the hand-over ended (released if [`HandOver::Done`]).
async fn release_row<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    row: &ObservedRow,
    floor: u64,
    owners: OwnerLiveness,
) -> Result<HandOver, KvError> {
    let mine = reclaimer_token(row.writer);
    let handed = hand_over(fabric, layout, row, floor, mine, owners).await?;
    if !matches!(handed, HandOver::Done(_)) {
        return Ok(handed);
    }
    let nodes = layout.metadata_nodes(fabric.node_count());
    let claim_at = layout.client_row(row.writer);
    let posts: Vec<_> = (0..nodes)
        .map(|n| (NodeId(n as u16), claim_at, mine, 0))
        .collect();
    cas_all(fabric, &OpStats::new(), &posts).await?;
    Ok(handed)
}

/// Watches the rows claimed on a majority (only `only`, if given) for a lease period,
/// kills those whose owner did not renew, and takes the first dead one over for
/// `taker` (a token; `None`: release them all). Rows already killed on a majority (an
/// earlier reclaim stopped half way) are not waited for. With
/// [`OwnerLiveness::ThisHost`], a row whose owner process still runs is neither
/// killed, taken nor released ([`Reclaimed::running`] if its lease lapsed; module
/// docs, "A running owner's lease is not killed").
pub async fn take_over_expired<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    lease: &LeaseParams,
    taker: Option<u64>,
    only: Option<u16>,
    owners: OwnerLiveness,
) -> Result<Reclaimed, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
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
    for row in candidates {
        // On this host a row named by a running process is never taken, so its lease
        // is not killed either (module docs, "A running owner's lease is not
        // killed"): the owner revives it at its next operation. Only read.
        if owners == OwnerLiveness::ThisHost
            && row
                .owners
                .iter()
                .any(|&o| owner_process::alive(o) == Some(true))
        {
            if lapsed(fabric, layout, &row).await? {
                tracing::info!(
                    writer = row.writer,
                    owners = ?row.owners,
                    "lease lapsed, but the owner process still runs: its writer id and its \
                     lease are left to it (not killed: it revives at its next operation)"
                );
                result.running.push(row.writer);
            } else {
                tracing::debug!(writer = row.writer, "lease renewed while watched: alive");
                result.alive.push(row.writer);
            }
            continue;
        }
        match kill(fabric, layout, lease, &row).await? {
            Kill::Killed => {}
            Kill::Alive => {
                tracing::debug!(writer = row.writer, "lease renewed while watched: alive");
                result.alive.push(row.writer);
                continue;
            }
            Kill::Undecided => {
                result.pending.push(row.writer);
                continue;
            }
        }
        // Nothing of the dead owner may land once the claim word changes: that hands
        // its row, log, registers and chunks to others (module docs).
        let Some(floor) = revoke(fabric, layout, &row, 0, Some(row.token)).await? else {
            result.pending.push(row.writer);
            continue;
        };
        if let (Some(token), None) = (taker, &result.taken) {
            match hand_over(fabric, layout, &row, floor, token, owners).await? {
                HandOver::Done(floor) => {
                    tracing::info!(
                        writer = row.writer,
                        "took over the writer id of a dead client"
                    );
                    result.floor = floor;
                    result.taken = Some(row);
                    continue;
                }
                // Split with another reclaimer: our copies went back to the dead
                // token; release the row instead (below).
                HandOver::Split => {
                    tracing::debug!(
                        writer = row.writer,
                        "takeover split with another reclaimer: releasing"
                    );
                }
                HandOver::Uncut => {
                    tracing::debug!(
                        writer = row.writer,
                        "takeover left for a later pass: a node did not answer after the claim"
                    );
                    result.pending.push(row.writer);
                    continue;
                }
                HandOver::Running => {
                    result.running.push(row.writer);
                    continue;
                }
            }
        }
        // A write-back guard the dead client left up keeps one slot of some writer
        // out of use until the row's next owner lowers it when it registers, fenced
        // (a plain store of ours could land after that owner raised its own guard).
        match release_row(fabric, layout, &row, floor, owners).await? {
            HandOver::Done(_) => {}
            HandOver::Running => {
                result.running.push(row.writer);
                continue;
            }
            HandOver::Split | HandOver::Uncut => {
                result.pending.push(row.writer);
                continue;
            }
        }
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
///
/// It evicts the incarnation it first observed, and only that one: once the row
/// shows another token (the owner closed, and a new client registered), the owner
/// is gone, and the new client is left alone.
pub async fn evict_now<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &NodeLayout,
    lease: &LeaseParams,
    writer: u16,
) -> Result<bool, KvError> {
    let mut target: Option<u64> = None;
    // The owner may renew between our read and our kill: read again and retry.
    for _ in 0..16 {
        let observed = observe(fabric, layout).await?;
        let Some(row) = observed.into_iter().find(|r| r.writer == writer) else {
            return Ok(target.is_some());
        };
        if row.token == 0 {
            return Ok(target.is_some());
        }
        if *target.get_or_insert(row.token) != row.token {
            tracing::info!(
                writer,
                "the evicted client's writer id changed hands meanwhile: its new owner is left alone"
            );
            return Ok(true);
        }
        if kill(fabric, layout, lease, &row).await? != Kill::Killed {
            continue;
        }
        // Every renewal a majority acknowledged was sent before the kill completed.
        swarm_core::sleep(fabric, lease.observer_wait_ns()).await;
        // Its queue pairs are cut before the row is released (module docs).
        let Some(floor) = revoke(fabric, layout, &row, 0, Some(row.token)).await? else {
            return Err(KvError::OwnerNotCut { writer });
        };
        // An operator's override: the owner process is not asked (docs/cli.md).
        match release_row(fabric, layout, &row, floor, OwnerLiveness::Unknown).await? {
            HandOver::Done(_) => return Ok(true),
            // Another reclaimer's claim split the copies: look again.
            HandOver::Split => continue,
            HandOver::Uncut | HandOver::Running => return Err(KvError::OwnerNotCut { writer }),
        }
    }
    Err(KvError::Contended { attempts: 16 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{Holding, MS, poll_once, small_cluster};
    use swarm_core::block_on_future;

    /// The dead owner's token in the tests' claim word.
    const DEAD: u64 = 0xD0D1;
    /// The lease counter the dead owner last renewed to.
    const SEEN: u64 = 5;

    /// CASes the word at `addr` on `node` from `from` to `to`; returns what it found.
    fn cas_on<F: Fabric>(fabric: &F, node: u16, addr: u64, from: u64, to: u64) -> u64 {
        let s = OpStats::new();
        block_on_future(fabric, async {
            let mut rt = Roundtrip::start(fabric, &s);
            rt.post(NodeId(node), Batch::cas(addr, from, to)).unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.cas(0).unwrap()
        })
        .unwrap()
    }

    /// Row 0 claimed by [`DEAD`], its lease at [`SEEN`] on every node; the row as a
    /// reclaimer that heard nodes 0 and 1 only observed it (`lease` on each).
    fn dead_row<F: Fabric>(fabric: &F, layout: &NodeLayout, lease: [u64; 2]) -> ObservedRow {
        let row = layout.client_row(0);
        for node in 0..3 {
            assert_eq!(cas_on(fabric, node, row, 0, DEAD), 0);
            assert_eq!(cas_on(fabric, node, row + LEASE_WORD, 0, SEEN), 0);
        }
        ObservedRow {
            writer: 0,
            token: DEAD,
            lease: vec![Some(lease[0]), Some(lease[1]), None],
            owners: Vec::new(),
        }
    }

    /// How many nodes take the dead owner's revival, a renewal CAS from the counter
    /// it last saw (`crate::membership::lease`, "Idle clients").
    fn revival<F: Fabric>(fabric: &F, layout: &NodeLayout) -> usize {
        let at = layout.client_row(0) + LEASE_WORD;
        (0..3)
            .filter(|&node| cas_on(fabric, node, at, SEEN, SEEN + 1) == SEEN)
            .count()
    }

    /// A reclaimer's kill lands on node 0 and the reclaimer stops before its kill of
    /// node 1 lands. Node 0 loses its memory and a repair rebuilds it from donors
    /// whose lease words are live (the kill had reached none of them). The reclaimer
    /// wakes up: its late kill lands on node 1. With node 0's answer from before the
    /// loss it counts a majority, but the kill is on node 1 alone: the owner revives
    /// on nodes 0 and 2, and the reclaimer would take over a row whose owner holds a
    /// renewed lease (where the lease decides: shared memory with no `/proc`, or a
    /// transport that revokes nothing). The round must not count (module docs, "A
    /// kill counted across a repair").
    #[test]
    fn a_kill_counted_across_a_repair_is_undecided() {
        let (cluster, layout) = small_cluster(200 * MS);
        let admin = cluster.client();
        let lease = LeaseParams::from_params(&layout.params);
        let row = dead_row(&admin, &layout, [SEEN, SEEN]);
        let r = Holding::new(cluster.client(), &[1]);
        let mut round = core::pin::pin!(kill(&r, &layout, &lease, &row));
        assert!(poll_once(round.as_mut()).is_pending());
        // Node 0 rebuilt from nodes 1 and 2, whose words are live.
        let at = layout.client_row(0) + LEASE_WORD;
        let donors = [SEEN, SEEN];
        assert_eq!(
            cas_on(
                &admin,
                0,
                at,
                SEEN | KILLED,
                crate::repair::merge::lease_word(&donors)
            ),
            SEEN | KILLED
        );
        // The reclaimer stopped through the repair's quiescence.
        r.sleep(crate::repair::quiescence_ns(&layout));
        r.land();
        let outcome = poll_once(round.as_mut());
        assert_eq!(
            revival(&admin, &layout),
            2,
            "the owner revives on the rebuilt node and node 2"
        );
        assert!(
            matches!(outcome, core::task::Poll::Ready(Ok(Kill::Undecided))),
            "a kill counted across a repair: {outcome:?}"
        );
    }

    /// The reclaimer observed node 0's lease killed (an earlier reclaimer's kill,
    /// node 1's word live). Node 0 then loses its memory and is rebuilt from donors
    /// the kill had not reached, and the reclaimer's own kill lands on node 1, in a
    /// round within its fence. Counting node 0 as killed from the observation would
    /// make a majority of a kill that is on node 1 alone; the round asks node 0 again
    /// (a CAS of the killed word onto itself) and finds it live.
    #[test]
    fn a_kill_observed_before_a_repair_counts_only_if_still_there() {
        let (cluster, layout) = small_cluster(200 * MS);
        let admin = cluster.client();
        let lease = LeaseParams::from_params(&layout.params);
        let row = dead_row(&admin, &layout, [SEEN | KILLED, SEEN]);
        let outcome = swarm_core::block_on(&admin, kill(&admin, &layout, &lease, &row));
        assert_eq!(
            revival(&admin, &layout),
            2,
            "the owner revives on nodes 0 and 2"
        );
        assert_eq!(
            outcome.expect("a kill round"),
            Kill::Alive,
            "a kill counted from an observation"
        );
    }

    /// Polls `future` until it is ready (its held batches landed, or its waits ran
    /// out on its clock: `fabric` sleeps a straggler's wait between polls).
    fn finish<T>(
        fabric: &Holding,
        mut future: core::pin::Pin<&mut impl core::future::Future<Output = T>>,
    ) -> T {
        for _ in 0..64 {
            if let core::task::Poll::Ready(out) = poll_once(future.as_mut()) {
                return out;
            }
            fabric.sleep(STRAGGLER_NS + 1);
        }
        panic!("the future never finished");
    }

    /// Whether `token`, having taken the row over, gets its lease: the first
    /// renewals of a registration (`crate::membership::writer_ids::register`).
    fn renews<F: Fabric>(fabric: &F, layout: &NodeLayout, token: u64, floor: u64) -> bool {
        use crate::membership::lease::LeaseKeeper;
        use crate::membership::lease_renewal::{LeaseHolder, renew_now};
        let seen: Vec<Option<u64>> = (0..3)
            .map(|node| {
                Some(cas_on(
                    fabric,
                    node,
                    layout.client_row(0) + LEASE_WORD,
                    0,
                    0,
                ))
            })
            .collect();
        let mut keeper = LeaseKeeper::new(LeaseParams::from_params(&layout.params), seen);
        keeper.raise_base(floor);
        let holder =
            core::cell::RefCell::new(LeaseHolder::new(keeper, layout.client_row(0), token, 3));
        for _ in 0..4 {
            block_on_future(fabric, renew_now(&holder, fabric, 0)).expect("a renewal ran");
            if holder.borrow().valid_until().is_some() {
                return true;
            }
        }
        false
    }

    /// The take ([`hand_over`]) is not fenced: module docs, "The takeover's other
    /// rounds, across a repair". Reclaimer r1's take lands on node 0 and r1 stops
    /// before its takes of nodes 1 and 2 land. Node 0 loses its memory and is rebuilt
    /// from donors that show the dead token; r2 takes nodes 0 and 1 (its take of node
    /// 2 is slow). r1 wakes up: its late take wins node 2, and with node 0's answer
    /// from before the loss it may count a majority. Whatever it counted, its token
    /// is then on node 2 alone, and its first lease renewal, which counts only where
    /// the claim word holds its token, fails: only r2 gets the row.
    #[test]
    fn a_take_counted_across_a_repair_leaves_the_row_to_one_taker() {
        const T1: u64 = 0x1111;
        const T2: u64 = 0x2223;
        let (cluster, layout) = small_cluster(200 * MS);
        let admin = cluster.client();
        let claim_at = layout.client_row(0);
        let row = dead_row(&admin, &layout, [SEEN, SEEN]);
        // Killed everywhere (and revoked: nothing to revoke in memory) up to SEEN.
        for node in 0..3 {
            cas_on(&admin, node, claim_at + LEASE_WORD, SEEN, SEEN | KILLED);
        }
        let r1 = Holding::new(cluster.client(), &[1, 2]);
        let mut take1 = core::pin::pin!(hand_over(
            &r1,
            &layout,
            &row,
            SEEN,
            T1,
            OwnerLiveness::Unknown
        ));
        assert!(poll_once(take1.as_mut()).is_pending());
        // Node 0 rebuilt from nodes 1 and 2: the dead token, killed at SEEN.
        let donors = [DEAD, DEAD];
        let rebuilt = crate::repair::merge::claim_word(&donors, &mut Default::default());
        assert_eq!(cas_on(&admin, 0, claim_at, T1, rebuilt), T1);
        let r2 = Holding::new(cluster.client(), &[2]);
        let take2 = core::pin::pin!(hand_over(
            &r2,
            &layout,
            &row,
            SEEN,
            T2,
            OwnerLiveness::Unknown
        ));
        assert_eq!(finish(&r2, take2).expect("r2's take"), HandOver::Done(SEEN));
        // r1 stopped through the repair's quiescence; its takes land.
        r1.sleep(crate::repair::quiescence_ns(&layout));
        r1.land();
        let r1_took = finish(&r1, take1).expect("r1's take") == HandOver::Done(SEEN);
        r2.land();
        let holders: Vec<u64> = (0..3)
            .map(|node| cas_on(&admin, node, claim_at, 0, 0))
            .collect();
        assert_eq!(holders, vec![T2, T2, T1], "r1's late take won node 2 only");
        // r1 registers first (the worse order): its renewal counts on node 2 alone.
        assert!(
            !renews(&admin, &layout, T1, SEEN),
            "a taker whose take was counted across a repair got the lease (its take \
             reported done: {r1_took})"
        );
        assert!(renews(&admin, &layout, T2, SEEN), "r2 holds the row");
    }
}
