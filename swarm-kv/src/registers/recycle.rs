//! Register recycling (SWARM §5.4): deleted keys' registers, and registers written by
//! an insert that turned into an update, go back to the allocator after a grace.
//!
//! # Who may recycle a register
//!
//! A register is *retired* by exactly one client, the one that knows nobody else
//! can retire it:
//!
//! * the client whose index remove (or replace, for a re-insert over a deleted key)
//!   returned `true`: the unmapping is a Paxos decision and of several removes of
//!   one mapping exactly one returns `true` (`crate::index`, "knowing one's fate");
//!   the register holds a tombstone (the remover saw it, or wrote it);
//! * the client whose insert turned into an update of an existing register: the
//!   fresh register it allocated and wrote was never published (every index call
//!   with it returned a definite "not mapped"; if one could not tell, the register
//!   is *not* retired and stays leaked, see below), so nobody else knows it.
//!
//! # When: the grace
//!
//! Once retired, a register is unreachable for new operations through the index
//! (the unmapping is decided on a majority). Two kinds of operations may still name
//! it:
//!
//! * **Through a location-cache entry, however old.** No wait covers those: an
//!   entry carries the register's life, and an operation through it either meets
//!   that life (then the register is still the key's, or deleted in that life) or
//!   detects another one and asks the index, acting on nothing it found there
//!   (`crate::cache`, "Stale entries", has the case analysis). Its CASes expect words
//!   of its life, which a reset moves above for good: late or timely, they fail in
//!   any later life.
//! * **Through the index, within one operation.** An operation that found the
//!   register through an index lookup also acts on it after the lookup: a get
//!   returns its value as the key's, an update or a delete that finds it deleted
//!   unmaps `key → register` (a remove conditional on the register only), an insert
//!   replaces a mapping to it. Those steps assume the register is in the life the
//!   lookup saw mapped. A retiree resets the register only `grace` after the
//!   unmapping, the lookup began before the unmapping, and an operation posts
//!   nothing after its start + `max_op_ns` (the fence); so the whole operation sees
//!   one life, as long as `grace` covers `max_op_ns` on the other clients' clocks
//!   and the delivery margin. The owner waits
//!   `swarm_core::slot_recycling::grace_with_margin_ns(max_op_ns, margin)`
//!   ([`crate::layout::ClusterParams::register_grace_ns`]): `max_op_ns · 9/7` (each
//!   clock's rate within 1/8 of real time,
//!   `swarm_core::slot_recycling::CLOCK_DRIFT_DIV`) plus the delivery margin `· 9/8`:
//!   about 270 ms with the defaults. (Clusters made before superblock version 7 wait
//!   the location cache's lifetime as well: their older clients' cached locations
//!   rely on it.)
//!
//! What the grace buys is this one-life view of an index-resolved operation, which
//! makes its later steps (an unmap, a "the key maps here" conclusion) right; it is
//! not what keeps the register's words safe from a stale store. A client paused
//! between its check and its store, for longer than any grace, breaks every bound
//! above: its CASes fail (below, "why a reused register is never confused with its
//! old life") and its index CASes expect bucket words that changed; a paused
//! operation is past its deadline and stops at its next step. Going below one
//! operation deadline would need every such later step to check the life it acts
//! on (as the deferred unmap does with its tagged remove), not just its CASes.
//!
//! Who enforces the deadline: the KV client between its steps
//! (`KvClient::fence`), the index before each CAS (`Index::remove_until` and
//! friends), and the register protocol inside its own steps: `swarm_core`'s
//! operation fence (the deadline armed on the operation's `OpStats`, checked by
//! `Roundtrip::post` and `post_background_for`).
//!
//! # How: the reset, on every replica
//!
//! After the grace the owner *resets* the register on **all** its replicas
//! ([`crate::registers::reset`]): it reads every replica, tombstones any delete word
//! that holds none, then CASes every metadata word and delete word from what it read
//! to the next life's *marker*, a word above every word the register ever held, and
//! key-header word 0 to "blank, held by the resetter". A reset is a write, not an
//! erasure: no word goes down, so no CAS of an earlier life ever finds its expected
//! value again, however late it lands (below). A quorum is not enough: a replica that
//! kept the old metadata (a tombstone) would, in some later quorum, make the next key's
//! value read as deleted. A replica that does not answer keeps the register out of
//! the pool (a failed one makes the owner retire it again and retry after another
//! grace; a silent one keeps it forever: a leak bounded by what that node holds,
//! never a safety problem). A CAS that finds another word than the read showed (a
//! late store landed in between) makes the reset read again. Only then is the
//! register handed to the allocator with its marker, *pre-cleared*
//! (`crate::registers::alloc`), which is what an insert needs to write it in one
//! roundtrip (SWARM §5.3.1): the insert's CASes expect the marker and its write goes
//! above it.
//!
//! # Donations: pools do not drift apart
//!
//! A reset register goes to the pool of the client that reset it, and an insert
//! takes one from its own client's pool. So the pools drift with the mix of work:
//! a client that mostly inserts runs dry (`RegistersFull`, once every chunk is
//! claimed) while one that mostly deletes piles up free registers, and in a store
//! that runs for months the drift is unbounded. A client whose pool already holds a
//! chunk's worth of registers ([`crate::layout::ClusterParams::chunk_registers`],
//! counting the fresh ones of its chunks) therefore *donates* the registers it
//! resets: the reset writes a donated holder tag ([`crate::registers::limbo::donated_tag`], from the
//! marker it installs, one word per donation) instead of
//! its own, and the register never comes back to it, whatever the replicas answer.
//! A client that runs dry takes donated registers as it takes a gone client's pool
//! (`crate::registers::limbo`, rule 3), at most a chunk's worth per pass, or half of what its
//! previous pass left on offer if that is more (taking all would hoard them; a
//! chunk's worth alone drains a large offer a chunk per pass), and resets them once
//! the donor's reset has surely landed (the delivery margin, not a whole grace:
//! `Recycler::take_donation`). A donation whose reset a
//! replica in service missed leaves that copy with the donor's tag: nobody takes the
//! register until the donor is gone (`RecycleStats::donations_incomplete`). Nothing
//! is donated while a node is out of service or a repair is announced: resets then
//! wait for the repair (below), and pools are what inserts live on meanwhile.
//!
//! A donating reset that reads again (a CAS of its install found a late store)
//! counts as its own trace only its tag and the one donation word it installs (fixed
//! at its first install), never another donation's word: stopped before that read,
//! the donor may find the register taken, reset and donated again by others, and
//! its install over that donation would bring its first word back, which a taker
//! stopped inside its burst may still expect (a take counted over two donations of
//! one word: two owners, `docs/pauses.md`, H8). It finds another holder's word on
//! every copy and leaves the register alone. The reset of a taken donation still
//! counts its donor's word on a copy its take missed.
//!
//! # A node out of service
//!
//! A replica whose memory is *lost* needs no reset: that memory never answers again
//! (`swarm_core::Fabric::memory_lost`: a retired node file, a memory node that came
//! back with another incarnation), and the node serves again only as a new
//! incarnation that a repair rebuilt from the other replicas (`crate::repair`). So
//! while a node is out, registers keep coming back: a reset that every other replica
//! acknowledged is complete when the failed one is a lost member
//! (`KvClient::reset_may_skip`). Without this, a churn workload would run out of
//! registers while a node waits for its repair.
//!
//! The repair is what makes it safe, and it needs one thing from resets: none may
//! land on the donors after the copy read them unless the repair copies the
//! register again, or the rebuilt node would keep the register's old words (a
//! tombstone at the top timestamp) under the next key. A repair therefore
//! *announces* itself (configuration `e + 1` with the node's repairing bit) before
//! its quiescence wait. A client leaves the node out of a reset plainly
//! ([`ReplicaStatus::Lost`]) only while the configuration it follows is the newest
//! its lease renewals have shown and has no repairing bit for the node. A client
//! whose lease is still valid at the end of the wait renewed after the
//! announcement (the lease argument), so resets posted before have landed within
//! the delivery margin, which the wait includes, and from then on its resets go
//! through the *repair journal* ([`ReplicaStatus::Repairing`], [`crate::registers::journal`]):
//! reset on the others, the register waits until the repair copied it to the node
//! (or until the node is admitted and this client reset it there), then comes back.
//! On a cluster without a journal (superblock version 4 and older) they wait for the
//! admission instead. A client with a lapsed lease starts no reset at all
//! (`lease_valid`).
//!
//! The quiescence wait is a timing argument, and a client paused between its status
//! check and its batches lands them whenever it wakes up, after the copy perhaps. So
//! a reset that left a lost node out is not trusted on what its client knew when it
//! posted: it comes back only once two more of the client's lease renewals were
//! acknowledged by a majority (`Recycler::step`, `renewals`). Renewals go one at a
//! time, so the second was posted after the reset's batches completed, that is after
//! they landed, and each renewal reads the configuration on the nodes it reaches. The
//! repair's announcement is on every donor before its copy begins, and a majority
//! holds a donor: if the announcement came before that renewal's reads, the client's
//! status for the node is no longer "lost", and the register is reset again on what
//! the replicas are then; if it came after, the reset landed before the copy read the
//! donors, and the rebuilt node gets it. Either way, whatever the pauses.
//!
//! # A reset counted across a repair
//!
//! A reset that every replica answered is complete only if its answers all come from
//! the same side of any repair. Its client may count node X's install from before X
//! lost its memory, stop, and wake up after a repair rebuilt X from donors that the
//! install had not reached yet; its late installs then land on the donors, and X
//! keeps the register's old words under the next key (`docs/pauses.md`, H3'). So
//! `Recycler::step` counts an install only if the lease is still valid at a clock
//! reading taken after its last answer: every answer landed before the lease ran
//! out, which is before the repair's quiescence wait (a lease and more) ends after
//! X's loss, since the reset was started under that lease before X answered. A reset
//! that fails the check is reset again, on what the replicas are then.
//!
//! # Why a reused register is never confused with its old life
//!
//! Whatever the timing: a client may be paused for any time between its last check
//! (its deadline, its lease) and its stores, and its stores then land on the next
//! life. What each of them does there:
//!
//! * *CASes on metadata words and the delete word* (a write's MAX, a read's
//!   write-back, a tombstone, a VERIFIED mark) expect a word of the client's life.
//!   Every word of a later life is its marker or above it, and the marker is above
//!   every word of the earlier lives: the CAS fails and changes nothing.
//! * *Rounds after a failed CAS*: the operation reads the delete word in the same
//!   batch, after the CAS, and every read of the register reads it too. The delete
//!   word holds the life's marker until the life's first tombstone; another marker
//!   means another life, and the operation stops with `SwarmError::Recycled` (the KV
//!   client then asks the index, `KvClient::update`, `KvClient::delete`, and a get
//!   takes the register for not the key's). A read torn across a replica's words that
//!   sees a word of the next life with a delete word from before the reset sees a
//!   tombstone there (the reset tombstones every delete word first): "deleted",
//!   never a value taken for its own life's.
//! * *Plain writes*: the in-place record (a VERIFIED write's copy on the primary) is
//!   used by a read only when its tsp is the maximum's, which no record of an earlier
//!   life is. The reset's own zeroing of the record header is likewise harmless.
//! * *Read as the old key*: payloads carry their key and a read checks it; an index
//!   that finds the register by fingerprint reads its key header, which a reset blanks
//!   on every replica and the next insert rewrites before the register is indexed.
//! * *Slot recycling* (contract 4): metadata words only ever go up.
//!
//! What still leans on timing, for safety (ARCHITECTURE.md, "Limitations"): the
//! plain writes an insert makes into a register of its own pool (key header and
//! in-place record), and the resets its owner posts, are safe while that client owns
//! its pool and limbo, which a takeover of its writer id (a lapsed lease) ends; a
//! reset that finds another holder's tag on a majority stops
//! ([`RecycleStats::reset_abandoned`]), but a paused owner's insert or reset can
//! still land after a takeover. Log slots have their own grace
//! (`swarm_core::slot_recycling`).
//!
//! # What is not recycled (leaks; `swarm stat` counts registers holding a key)
//!
//! * a delete whose unmap failed (contention, a lost majority, the deadline): the
//!   mapping `key → tombstone` stays until an insert of that key replaces it (then
//!   the replacer retires the register) or an update/delete of it unmaps it; a key
//!   never touched again keeps its register;
//! * an insert whose index call could not tell whether it mapped the fresh register
//!   (`OutcomeUnknown`, contention, an error): the register may be published, so it
//!   is kept;
//! * the limbo queue and the pool live in the client's memory: a client that dies
//!   *or closes* loses them. They come back through the holder tags in the key
//!   headers ([`crate::registers::limbo`]): the retiree tags each register it retires on every
//!   replica ([`Recycler::mark`]) and the reset tags the registers it pools
//!   ([`crate::registers::reset`]), so a client that runs out of registers finds those held by
//!   gone clients, takes them by CAS and recycles them after its own grace (a client
//!   that closes cleanly donates its pool instead, [`crate::registers::give_back`]). Still
//!   leaked: a retired register whose mark reached no replica, and the cases above
//!   (`crate::registers::limbo`, "what stays leaked");
//! * a retired register whose mark reached no keyed copy while a copy that an insert
//!   from this client's pool missed still shows the pool's tag (a fenced insert's
//!   fresh register, whose mark is not posted past the deadline): the reset takes
//!   such a copy for its trace only if no keyed copy is of a later life
//!   (`Recycler::next_phase`; `docs/pauses.md`, "Found by the soak"), so it leaves
//!   the register alone.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::task::Poll;

use swarm_core::encoding::Tsp;
use swarm_core::fabric::{Batch, Completion, Nanos, NodeId, Op, Submitted, Ticket};
use swarm_core::{Fabric, RegisterLoc};

use crate::RegisterId;
use crate::configuration::{CONFIG_AT, CONFIG_READ_BYTES, Configuration};
use crate::layout::NodeLayout;

/// Registers whose reset starts per call of [`Recycler::step`], so that one operation
/// does not post an unbounded number of resets.
const RESETS_PER_STEP: usize = 8;

/// Why a register was retired (for tracing and statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retired {
    /// This client's remove (or replace) unmapped it from the index.
    Unmapped,
    /// This client's insert turned into an update: the fresh register was never
    /// published.
    Unpublished,
    /// Never used, in a dead client's chunk that this client adopted
    /// (`crate::registers::orphans`, `crate::registers::limbo`).
    Adopted,
    /// Taken from a gone client's limbo: retired by it, not reset yet (`crate::registers::limbo`).
    ReclaimedLimbo,
    /// Taken from a gone client's pool: reset by it, blank (`crate::registers::limbo`).
    ReclaimedPool,
}

/// How a register came into this client's limbo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Came {
    /// Retired by this client ([`Recycler::retire`]).
    Retired(Retired),
    /// Taken from another client's donation ([`Recycler::take_donation`]).
    Donation,
}

/// How the reset that pooled a register completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetPath {
    /// Installed on every replica.
    Everywhere,
    /// Installed on every replica but those of lost nodes, confirmed by two lease
    /// renewals ("a node out of service" in the module docs).
    WithoutLost,
    /// Installed on every replica but one being rebuilt, whose repair copied it
    /// ([`crate::registers::journal`]).
    Journal,
}

/// Where a register this recycler handed back to the pool came from
/// ([`Recycler::take_origin`]): an insert that finds a register of its pool in
/// another life logs it, so that the path that pooled it is known (two owners of one
/// register are a safety bug: `docs/pauses.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOrigin {
    /// How it came into the limbo.
    pub came: Came,
    /// When (a taken donation: when its reset was due).
    pub entered: Nanos,
    /// Resets started for it since (the last one pooled it).
    pub resets: u32,
    /// How the last reset completed.
    pub path: ResetPath,
    /// When it was handed back to the pool.
    pub pooled: Nanos,
}

/// What a register's limbo entry, reset, journal entry or confirmation carries to
/// its [`PoolOrigin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Provenance {
    came: Came,
    entered: Nanos,
    resets: u32,
}

impl Provenance {
    fn pooled(self, path: ResetPath, now: Nanos) -> PoolOrigin {
        PoolOrigin {
            came: self.came,
            entered: self.entered,
            resets: self.resets,
            path,
            pooled: now,
        }
    }
}

/// Counters of one client's recycler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecycleStats {
    /// Registers retired (entered the limbo queue).
    pub retired: u64,
    /// Registers reset on every replica and handed back to the allocator.
    pub recycled: u64,
    /// Reset attempts that failed on some replica (the register waits another grace).
    pub reset_failures: u64,
    /// Registers taken from gone clients' limbos (retired, still keyed).
    pub reclaimed_limbo: u64,
    /// Registers taken from gone clients' pools (reset, blank).
    pub reclaimed_pool: u64,
    /// Retire marks that failed on a replica, or found a keyed copy there with another
    /// word than the retiree wrote (that copy keeps no tag). A blank copy, which the
    /// insert's fresh write did not reach, is not counted.
    pub mark_failures: u64,
    /// Of `recycled`, registers reset without a replica whose memory was lost (the
    /// node out of service, "a node out of service" in the module docs).
    pub reset_without_lost: u64,
    /// Of `reset_without_lost`, registers whose reset a repair brought to the node
    /// it was rebuilding through the journal, or that this client reset there after
    /// the admission (`crate::registers::journal`).
    pub reset_through_journal: u64,
    /// Registers reset for any client instead of this one's pool, because the pool
    /// held enough ("donations" in the module docs). Not counted in `recycled`.
    pub donated: u64,
    /// Of `donated`, resets that some replica in service did not take: the register
    /// is reclaimable only once this client is gone.
    pub donations_incomplete: u64,
    /// Registers taken from other clients' donations.
    pub reclaimed_donations: u64,
    /// Resets given up because the register's key header shows another holder's
    /// tag on a majority (a reclaimer took it from this client while it was
    /// presumed gone), or this client's nowhere (its retire mark, posted only
    /// before its operation's deadline, reached no replica): that may be another
    /// client's life of the register, so nothing is stored. Leaked until a
    /// reclaimer finds it.
    pub reset_abandoned: u64,
}

/// Adds `entry` to the limbo queue, which stays in due order: a retired register
/// (due a grace from now) goes last, a taken donation (due after the delivery
/// margin) ahead of those waiting for a grace.
fn enqueue(limbo: &mut VecDeque<Limbo>, entry: Limbo) {
    let at = limbo
        .iter()
        .rposition(|l| l.due <= entry.due)
        .map_or(0, |i| i + 1);
    limbo.insert(at, entry);
}

/// What a reset does about a replica that did not take it (asked of the owner,
/// `KvClient::replica_status`; see the module docs, "a node out of service").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaStatus {
    /// In service: the reset needs it (a failed reset is tried again after a grace).
    InService,
    /// Its memory is lost and no repair of it is announced: the reset does without
    /// it (the repair's copy will read the reset from the others).
    Lost,
    /// Its memory is lost and a repair of it is announced: the reset does without
    /// it, and the register waits until the repair copied it to the node through
    /// the journal on node `journal` ([`crate::registers::journal`]), or until the node is in
    /// service again and this client reset it there.
    Repairing {
        /// The journal node ([`crate::registers::journal::journal_node`]).
        journal: NodeId,
        /// The epoch of the configuration that announces the repair (the one this
        /// client follows): an entry's clear counts as that repair's copy only while
        /// the journal node still holds it ([`crate::registers::journal`], "Whose
        /// clear").
        epoch: u64,
    },
    /// Not known yet (a newer configuration is pending, or a repair is announced on
    /// a cluster without a journal): the reset waits for it.
    Undecided,
}

/// Whether a clear of an entry journaled for the repair of `node` announced at
/// `epoch`, seen in a row read, was that repair's: the configuration record read
/// after the row on the journal node is still that announcement, with no other
/// repair announced ([`crate::registers::journal`], "Whose clear"). A later repair
/// (of another node, after this one's admission or withdrawal) announces a higher
/// epoch on the journal node before it services the journal, so its clears fail
/// this check; a clear by the repair itself that is read only after its admission
/// fails it too, and costs one more reset.
fn clear_is_the_repairs(config: &Configuration, node: NodeId, epoch: u64) -> bool {
    let bit = 1u64.checked_shl(u32::from(node.0)).unwrap_or(0);
    bit != 0 && config.epoch == epoch && config.repairing == bit
}

impl ReplicaStatus {
    /// Whether a reset may complete without this replica.
    fn skippable(self) -> bool {
        matches!(self, Self::Lost | Self::Repairing { .. })
    }
}

#[derive(Debug)]
struct Limbo {
    register: RegisterId,
    due: Nanos,
    /// Never donated: taken from a donation because this client ran dry.
    keep: bool,
    prov: Provenance,
}

/// Where a reset is ([`crate::registers::reset`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reading every replica's key-header word 0, metadata words and delete word.
    Read,
    /// Tombstoning the delete words that held none.
    Tombstone,
    /// CASing what was read to the next life's marker and the holder tag.
    Install,
}

/// Read rounds a reset may take before it waits another grace: a read runs again
/// after a tombstone round, or when a late store of an earlier life moved a word.
const RESET_READS: u32 = 4;

#[derive(Debug)]
struct Reset {
    register: RegisterId,
    /// The reset gives the register away ([`crate::registers::limbo::donated_tag`]): once it
    /// is posted, the register never comes back to this client.
    donated: bool,
    /// The donated tag a donating reset writes: fixed at its first install, from the
    /// marker installed then, so that an install read again after a late store
    /// (`moved`) leaves the same word (that marker is donated by no other reset).
    donation_tag: Option<u32>,
    /// Carried over from its [`Limbo`] entry.
    keep: bool,
    phase: Phase,
    /// Read rounds so far.
    reads: u32,
    /// What each replica's last read showed.
    seen: Vec<(NodeId, crate::registers::reset::Seen)>,
    /// The marker being installed.
    marker: Tsp,
    /// A CAS of this phase found another word than the read showed.
    moved: bool,
    /// Batches that have not answered yet, with what their CASes expect (install).
    pending: Vec<(
        NodeId,
        Ticket,
        Option<crate::registers::reset::InstallBatch>,
    )>,
    /// Replicas whose batch failed in this phase.
    failed: Vec<NodeId>,
    prov: Provenance,
}

impl Reset {
    fn new(register: RegisterId, donated: bool, keep: bool, prov: Provenance) -> Self {
        Self {
            register,
            donated,
            donation_tag: None,
            keep,
            prov,
            phase: Phase::Read,
            reads: 0,
            seen: Vec::new(),
            marker: Tsp::EMPTY,
            moved: false,
            pending: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Posts this phase's batches: `Some(false)` if one could not be built (not a
    /// register of this layout).
    fn post<F: Fabric>(
        &mut self,
        fabric: &F,
        layout: &NodeLayout,
        loc: &RegisterLoc,
        tag: u32,
    ) -> bool {
        use crate::registers::reset;
        self.moved = false;
        match self.phase {
            Phase::Read => {
                // Replicas that fail a later phase stay failed until the next read:
                // the reset is complete only with every one it did not reach skippable.
                self.failed.clear();
                self.reads += 1;
                self.seen.clear();
                for (p, &node) in loc.replicas.nodes().iter().enumerate() {
                    let Some(batch) = reset::read_batch(layout, loc.offset(p)) else {
                        return false;
                    };
                    self.pending.push((node, fabric.post(node, batch), None));
                }
            }
            Phase::Tombstone => {
                for (node, seen) in &self.seen {
                    let Some(at) = loc.offset_on(*node) else {
                        return false;
                    };
                    if let Some(batch) = reset::tombstone_batch(layout, at, seen) {
                        self.pending.push((*node, fabric.post(*node, batch), None));
                    }
                }
            }
            Phase::Install => {
                let tag = if self.donated {
                    *self
                        .donation_tag
                        .get_or_insert(crate::registers::limbo::donated_tag(
                            self.marker.ts().ticks(),
                        ))
                } else {
                    tag
                };
                for (node, seen) in &self.seen {
                    let Some(batches) = loc
                        .offset_on(*node)
                        .and_then(|at| reset::install_batches(layout, at, seen, self.marker, tag))
                    else {
                        return false;
                    };
                    for install in batches {
                        let ticket = fabric.post(*node, install.batch.clone());
                        self.pending.push((*node, ticket, Some(install)));
                    }
                }
            }
        }
        true
    }

    /// Takes the answers that arrived.
    fn poll<F: Fabric>(&mut self, fabric: &F, layout: &NodeLayout) {
        let (register, phase) = (self.register, self.phase);
        let (seen, failed, moved) = (&mut self.seen, &mut self.failed, &mut self.moved);
        self.pending
            .retain(|(node, ticket, install)| match fabric.poll(*ticket) {
                Poll::Pending => true,
                Poll::Ready(Ok(completion)) => {
                    match phase {
                        Phase::Read => {
                            match crate::registers::reset::parse_read(layout, &completion) {
                                Some(view) => seen.push((*node, view)),
                                None => failed.push(*node),
                            }
                        }
                        // A tombstone CAS that found something else: read again anyway.
                        Phase::Tombstone => {}
                        Phase::Install => {
                            if install.as_ref().is_some_and(|i| !i.took(&completion)) {
                                *moved = true;
                            }
                        }
                    }
                    false
                }
                Poll::Ready(Err(error)) => {
                    tracing::debug!(register, node = node.index(), %error, ?phase, "recycler: reset failed on a replica");
                    if !failed.contains(node) {
                        failed.push(*node);
                    }
                    false
                }
            });
    }
}

/// A register reset on every replica but one being rebuilt (see [`crate::registers::journal`]).
#[derive(Debug)]
struct Journaled {
    register: RegisterId,
    /// The life marker the reset installed.
    marker: Tsp,
    /// The node being rebuilt.
    node: NodeId,
    stage: Stage,
    prov: Provenance,
}

#[derive(Debug)]
enum Stage {
    /// Waiting for a free slot in this client's journal row.
    NoSlot,
    /// The entry's CAS into `slot` on `journal` is in flight.
    Posting {
        journal: NodeId,
        slot: usize,
        ticket: Ticket,
        epoch: u64,
    },
    /// In the journal on `journal`, waiting for the repair announced at `epoch` to
    /// clear it. Only row reads numbered above `since` (posted after the entry
    /// landed) can tell.
    Posted {
        journal: NodeId,
        slot: usize,
        since: u64,
        epoch: u64,
    },
}

/// This client's row of the repair journal (see [`crate::registers::journal`]).
#[derive(Debug)]
struct JournalRow {
    /// Slots this incarnation may write (zero as far as it knows).
    free: Vec<usize>,
    /// A read of the row in flight: where, and its number.
    reading: Option<(NodeId, Ticket, u64)>,
    /// Row reads posted so far.
    reads_posted: u64,
    /// When the row may be read again.
    next_read: Nanos,
    /// Slot clears in flight after the node was admitted.
    clearing: Vec<(usize, Ticket)>,
}

impl Default for JournalRow {
    fn default() -> Self {
        Self {
            free: (0..crate::registers::journal::SLOTS).rev().collect(),
            reading: None,
            reads_posted: 0,
            next_read: 0,
            clearing: Vec::new(),
        }
    }
}

/// What a reset does once a phase's batches answered.
enum Next {
    /// Post the next phase's batches.
    Post,
    /// Drop the register: not this client's to reset (see
    /// [`RecycleStats::reset_abandoned`]).
    Abandon,
    /// Done: installed, or failed (the caller tells which).
    Finish,
}

/// A reset installed on every replica but those of lost nodes, waiting until a lease
/// renewal posted after its last batch landed tells whether a repair of those nodes
/// was announced meanwhile (module docs, "a node out of service").
#[derive(Debug)]
struct Confirming {
    register: RegisterId,
    marker: Tsp,
    /// The lost nodes it left out.
    left_out: Vec<NodeId>,
    /// Carried over from its [`Limbo`] entry.
    keep: bool,
    /// Confirmed once the owner's acknowledged renewals reach this count.
    after_renewals: u64,
    prov: Provenance,
}

/// How often a client waiting for the repair reads its journal row.
const JOURNAL_POLL_NS: Nanos = 1_000_000;

#[derive(Debug, Default)]
struct State {
    limbo: VecDeque<Limbo>,
    resetting: Vec<Reset>,
    journaled: Vec<Journaled>,
    /// Resets that left a lost node out, waiting for a lease renewal posted after
    /// they landed (module docs, "a node out of service").
    confirming: Vec<Confirming>,
    row: JournalRow,
    /// Retire marks in flight (`Recycler::mark`).
    marking: Vec<(NodeId, Ticket, RegisterId, u64)>,
    stats: RecycleStats,
    /// Where the registers handed back came from, until [`Recycler::take_origin`]
    /// (at most one entry per register: an entry of a register that left the pool
    /// otherwise is replaced when it comes back).
    origins: HashMap<RegisterId, PoolOrigin>,
}

/// One client's retired registers: see the module docs.
#[derive(Debug)]
pub struct Recycler {
    grace_ns: Nanos,
    /// The owner's writer id (its journal row).
    writer: u16,
    /// The owner's holder tag (`crate::registers::limbo::holder_tag`).
    tag: u32,
    state: RefCell<State>,
}

impl Recycler {
    /// A recycler that waits `grace_ns` before resetting a retired register, for the
    /// client incarnation of writer id `writer` whose holder tag is `tag`.
    pub fn new(grace_ns: Nanos, writer: u16, tag: u32) -> Self {
        Self {
            grace_ns,
            writer,
            tag,
            state: RefCell::new(State::default()),
        }
    }

    /// Decides what `reset` does after a phase whose batches all answered (or failed:
    /// `blocked` if a replica in service failed). See [`crate::registers::reset`].
    fn next_phase(&self, reset: &mut Reset, blocked: bool) -> Next {
        use crate::registers::limbo::is_donated;
        if blocked {
            return Next::Finish;
        }
        match reset.phase {
            Phase::Read => {
                // This client's trace (its retire mark, its take, its own reset) on
                // some copy, and no other holder's tag on a majority: a client presumed
                // gone may have lost the register to a reclaimer, whose life of it this
                // reset must not touch. (A minority copy may keep the tag of the pool
                // the register's last life came from: that insert missed it.)
                // A taken donation's copies that the take missed show its donor's
                // word; a donating reset's trace is its own tag or, once it
                // installed, its own donation's word, never another donation's: a
                // donor stopped before it read again (`moved`) may find the register
                // taken, reset and donated again meanwhile, and installing its own
                // word over that donation would bring back a word that a taker
                // stopped inside its burst still expects (docs/pauses.md, H8).
                let keep = reset.keep;
                let own_donation = reset.donation_tag;
                let mine =
                    |t: u32| t == self.tag || (keep && is_donated(t)) || own_donation == Some(t);
                let foreign = reset
                    .seen
                    .iter()
                    .filter(|(_, v)| v.tag() != 0 && !mine(v.tag()))
                    .count();
                // A blank copy with this client's tag is the pool a register's life
                // came from, or this client's own reset of it: a trace of *this*
                // life only if no keyed copy is of a later life than it (words above
                // its marker). A keyed copy above it was written by an insert from
                // that pool that missed this copy; that life's retirement, if this
                // client's, left its mark or take on a keyed copy. Without this, a
                // register in this client's limbo by mistake while its key is
                // mapped, with the copy the insert missed among those read (another
                // node lost), was reset under its key: the soak's "key header
                // missing" (docs/pauses.md, "Found by the soak").
                let top = |v: &crate::registers::reset::Seen| {
                    v.words
                        .iter()
                        .map(|w| swarm_core::encoding::Tsp::from_word(*w))
                        .filter(|w| !w.is_tombstone())
                        .max()
                        .unwrap_or(swarm_core::encoding::Tsp::EMPTY)
                };
                let keyed_top = reset
                    .seen
                    .iter()
                    .filter(|(_, v)| v.key_len() != 0)
                    .map(|(_, v)| top(v))
                    .max();
                let traced = reset.seen.iter().any(|(_, v)| {
                    mine(v.tag()) && (v.key_len() != 0 || keyed_top.is_none_or(|k| top(v) >= k))
                });
                if !traced && reset.seen.iter().any(|(_, v)| mine(v.tag())) {
                    // Only the pool a keyed life came from: this client holds the
                    // register by mistake (a second owner, or a retirement of a
                    // mapped register). Logged with how it entered the limbo, for
                    // the soak's open finding (docs/pauses.md).
                    tracing::warn!(
                        register = reset.register,
                        came = ?reset.prov.came,
                        resets = reset.prov.resets,
                        entered_at = reset.prov.entered,
                        seen = ?reset
                            .seen
                            .iter()
                            .map(|(n, v)| (n.index(), v.key_len(), format!("{:#x}", v.tag()), top(v)))
                            .collect::<Vec<_>>(),
                        "recycler: a register in the limbo holds a keyed life above this client's pool trace; not reset (a leak, never a second owner)"
                    );
                }
                if !traced || foreign > reset.seen.len() / 2 {
                    tracing::debug!(
                        register = reset.register,
                        traced,
                        foreign,
                        "recycler: the register shows another holder, or no trace of this client; not reset"
                    );
                    return Next::Abandon;
                }
                if reset.seen.is_empty() {
                    return Next::Finish;
                }
                let untombstoned = reset
                    .seen
                    .iter()
                    .any(|(_, v)| !v.delete_word().is_tombstone());
                if untombstoned {
                    if reset.reads >= RESET_READS {
                        return Next::Finish;
                    }
                    reset.phase = Phase::Tombstone;
                    return Next::Post;
                }
                match crate::registers::reset::marker_above(reset.seen.iter().map(|(_, v)| v)) {
                    Some(marker) => {
                        reset.marker = marker;
                        reset.phase = Phase::Install;
                        Next::Post
                    }
                    None => {
                        tracing::warn!(
                            register = reset.register,
                            "recycler: the register's words reached the timestamp horizon; not reused"
                        );
                        Next::Abandon
                    }
                }
            }
            Phase::Tombstone => {
                reset.phase = Phase::Read;
                Next::Post
            }
            Phase::Install if reset.moved && reset.reads < RESET_READS => {
                reset.phase = Phase::Read;
                Next::Post
            }
            Phase::Install => Next::Finish,
        }
    }

    /// Tags `register`, which this client is retiring and whose key header holds a key
    /// of `key_len` bytes, as retired by this client on each of its replicas (`loc`):
    /// a CAS of header word 0 (at each replica's offset) from `(key_len, 0)` to `(key_len, tag)`
    /// (`crate::registers::limbo`), posted in the background and carrying the operation's
    /// `deadline`. Nothing is posted once the deadline passed (returns `false`): the
    /// register then stays untagged (a leak if this client goes away before its
    /// grace). Call it before [`Recycler::retire`].
    pub fn mark<F: Fabric>(
        &self,
        fabric: &F,
        layout: &NodeLayout,
        register: RegisterId,
        key_len: usize,
        loc: &RegisterLoc,
        deadline: Nanos,
    ) -> bool {
        let Ok(len) = u32::try_from(key_len) else {
            return false;
        };
        if key_len == 0 || fabric.now() > deadline {
            tracing::debug!(
                register,
                "retire mark not posted: past the operation deadline"
            );
            return false;
        }
        let (from, to) = (
            crate::registers::limbo::header_word(len, 0),
            crate::registers::limbo::header_word(len, self.tag),
        );
        let mut s = self.state.borrow_mut();
        for &node in loc.replicas.nodes() {
            let Some(at) = layout.header_on(loc, node) else {
                continue;
            };
            let mut batch = Batch::cas(at, from, to);
            batch.set_deadline(Some(deadline));
            let mut reply = Completion::new();
            match fabric.submit(node, &mut batch, &mut reply) {
                Submitted::Posted(ticket) => s.marking.push((node, ticket, register, from)),
                Submitted::Done => note_mark(&mut s.stats, register, node, from, Ok(reply)),
                Submitted::Failed(error) => {
                    note_mark(&mut s.stats, register, node, from, Err(error));
                }
            }
        }
        true
    }

    /// Retire marks still in flight, after taking the answers that arrived.
    pub fn marks_in_flight<F: Fabric>(&self, fabric: &F) -> usize {
        let mut s = self.state.borrow_mut();
        let State { marking, stats, .. } = &mut *s;
        marking.retain(
            |&(node, ticket, register, from)| match fabric.poll(ticket) {
                Poll::Pending => true,
                Poll::Ready(result) => {
                    note_mark(stats, register, node, from, result);
                    false
                }
            },
        );
        marking.len()
    }

    /// Where `register`, which this recycler handed back to the pool, came from, if
    /// it did (the record is dropped: call it when the register leaves the pool).
    pub fn take_origin(&self, register: RegisterId) -> Option<PoolOrigin> {
        self.state.borrow_mut().origins.remove(&register)
    }

    /// The holder tag this recycler leaves.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// The grace, ns.
    pub fn grace_ns(&self) -> Nanos {
        self.grace_ns
    }

    /// The counters.
    pub fn stats(&self) -> RecycleStats {
        self.state.borrow().stats
    }

    /// Registers retired and not yet handed back (in limbo, being reset, waiting for
    /// a repair to copy them, [`crate::registers::journal`], or for a lease renewal
    /// to confirm a reset that left a lost node out).
    pub fn in_limbo(&self) -> usize {
        let s = self.state.borrow();
        s.limbo.len() + s.resetting.len() + s.journaled.len() + s.confirming.len()
    }

    /// How many registers wait at each step of recycling, for logs and diagnostics:
    /// `(waiting for their due time, of those already due at `now`, resets in flight,
    /// waiting for a repair's journal, waiting for a lease renewal to confirm)`.
    pub fn queues(&self, now: Nanos) -> (usize, usize, usize, usize, usize) {
        let s = self.state.borrow();
        let due = s.limbo.iter().take_while(|l| l.due <= now).count();
        (
            s.limbo.len(),
            due,
            s.resetting.len(),
            s.journaled.len(),
            s.confirming.len(),
        )
    }

    /// When the oldest retired register is due for its reset, if any is waiting.
    pub fn next_due(&self) -> Option<Nanos> {
        self.state.borrow().limbo.front().map(|l| l.due)
    }

    /// Whether resets are in flight, wait for a repair or for a lease renewal (a
    /// caller waiting for a register polls again).
    pub fn resetting(&self) -> bool {
        let s = self.state.borrow();
        !s.resetting.is_empty() || !s.journaled.is_empty() || !s.confirming.is_empty()
    }

    /// Retires `register` at time `now` (see the module docs for who may).
    pub fn retire(&self, register: RegisterId, now: Nanos, why: Retired) {
        let mut s = self.state.borrow_mut();
        s.stats.retired += 1;
        match why {
            Retired::ReclaimedLimbo => s.stats.reclaimed_limbo += 1,
            Retired::ReclaimedPool => s.stats.reclaimed_pool += 1,
            Retired::Unmapped | Retired::Unpublished | Retired::Adopted => {}
        }
        let due = now.saturating_add(self.grace_ns);
        tracing::trace!(register, ?why, due, "register retired");
        enqueue(
            &mut s.limbo,
            Limbo {
                register,
                due,
                keep: false,
                prov: Provenance {
                    came: Came::Retired(why),
                    entered: now,
                    resets: 0,
                },
            },
        );
    }

    /// Takes `register`, which this client took from another client's donation
    /// (`crate::registers::limbo::donated_tag`), to reset it at `due` and pool it: not a
    /// grace after now, since its donor reset it a grace after its last life ended,
    /// but once the donor's reset has landed on every replica (the caller passes
    /// the delivery margin, `crate::registers::limbo::settle_ns`: a replica that missed the
    /// donor's reset when this client read it may still receive it, and it must not
    /// land on this client's reset, nor on the next key). It is never donated again.
    pub fn take_donation(&self, register: RegisterId, due: Nanos) {
        let mut s = self.state.borrow_mut();
        s.stats.retired += 1;
        s.stats.reclaimed_donations += 1;
        tracing::trace!(register, due, "donated register taken");
        enqueue(
            &mut s.limbo,
            Limbo {
                register,
                due,
                keep: true,
                prov: Provenance {
                    came: Came::Donation,
                    entered: due,
                    resets: 0,
                },
            },
        );
    }

    /// Polls the resets in flight and starts those of registers whose grace passed.
    /// Returns the registers now reset on every replica: pre-cleared, ready for the
    /// allocator. Never waits. `loc` gives a register's replicas and address.
    ///
    /// `lease_valid(t)`: whether the owner's lease is valid at instant `t` of the
    /// fabric clock. A reset is a write that no operation deadline covers, so it is
    /// started (and each phase posted) only under a valid lease: then a client whose
    /// lease was killed (a zombie) posts no reset after its lease ended, and a
    /// reclaimer that adopts its chunks (`crate::registers::orphans`) can rely on the
    /// lease argument (`crate::membership::lease`) for resets too. A reset also counts
    /// its install only if the lease is still valid at a clock reading taken after its
    /// last answer (module docs, "A reset counted across a repair"); otherwise it
    /// resets the register again.
    ///
    /// `donate()`: whether the owner's pool holds enough registers, so that the resets
    /// started now give theirs to any client instead (module docs, "donations"):
    /// they are never returned. Asked once per call, and only when a reset starts.
    ///
    /// `status(node)`: what a reset does about `node` when it failed there or the
    /// other replicas have answered ([`ReplicaStatus`]; see the module docs, "a node
    /// out of service").
    ///
    /// `renewals`: the lease renewals of the owner acknowledged by a majority so far
    /// (`LeaseHolder::renewals`). A reset that left a lost node out comes back only
    /// once two more were, so that `status` judges it on a configuration read after
    /// its batches landed.
    #[allow(clippy::too_many_arguments)]
    pub fn step<F: Fabric>(
        &self,
        fabric: &F,
        layout: &NodeLayout,
        lease_valid: impl Fn(Nanos) -> bool,
        donate: impl Fn() -> bool,
        loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
        status: impl Fn(NodeId) -> ReplicaStatus,
        renewals: u64,
    ) -> Vec<(RegisterId, Tsp)> {
        if !self.state.borrow().marking.is_empty() {
            self.marks_in_flight(fabric);
        }
        let mut s = self.state.borrow_mut();
        if s.limbo.is_empty()
            && s.resetting.is_empty()
            && s.journaled.is_empty()
            && s.confirming.is_empty()
            && s.row.clearing.is_empty()
        {
            // The common case: no clock read.
            return Vec::new();
        }
        let now = fabric.now();
        let may_start = lease_valid(now);
        // Start the resets that are due.
        let mut started = 0;
        let mut donating: Option<bool> = None;
        while may_start
            && started < RESETS_PER_STEP
            && s.limbo.front().is_some_and(|l| l.due <= now)
            && let Some(Limbo {
                register,
                keep,
                mut prov,
                ..
            }) = s.limbo.pop_front()
        {
            started += 1;
            // A donated register carries the tag any reclaimer may take.
            let donated = !keep && *donating.get_or_insert_with(&donate);
            prov.resets = prov.resets.saturating_add(1);
            let mut reset = Reset::new(register, donated, keep, prov);
            // A donating reset writes its donation's tag instead (`Reset::post`).
            if !loc(register).is_some_and(|loc| reset.post(fabric, layout, &loc, self.tag)) {
                // Not a register of this layout: nothing to recycle.
                tracing::warn!(register, "recycler: no such register; dropped");
                continue;
            }
            s.resetting.push(reset);
        }
        // Collect what answered.
        let mut ready = Vec::new();
        let mut i = 0;
        while i < s.resetting.len() {
            let reset = &mut s.resetting[i];
            reset.poll(fabric, layout);
            // A lost node out of service may never answer (a silent RDMA node):
            // once only such nodes are pending, they count as failed.
            if !reset
                .pending
                .iter()
                .all(|&(node, _, _)| status(node).skippable())
            {
                i += 1;
                continue;
            }
            for (node, ticket, _) in reset.pending.drain(..) {
                fabric.forget(ticket);
                if !reset.failed.contains(&node) {
                    reset.failed.push(node);
                }
            }
            let tag = self.tag;
            // Every phase posts under a valid lease, like the reset's start.
            let blocked = !may_start || reset.failed.iter().any(|&node| !status(node).skippable());
            match self.next_phase(reset, blocked) {
                Next::Post => {
                    let posted = loc(reset.register)
                        .is_some_and(|loc| reset.post(fabric, layout, &loc, tag));
                    if !posted {
                        s.resetting.swap_remove(i);
                    }
                    // Polled again at once (without `i += 1`): a fabric that executes
                    // batches as they are posted (shared memory) answers already, so
                    // a reset takes one step there. The phases are bounded
                    // (`RESET_READS`).
                    continue;
                }
                Next::Abandon => {
                    s.stats.reset_abandoned += 1;
                    s.resetting.swap_remove(i);
                    continue;
                }
                Next::Finish => {}
            }
            let done = s.resetting.swap_remove(i);
            if !done.donated && !lease_valid(fabric.now()) {
                // The install's answers were counted past the lease: some may be from
                // before a repair rebuilt their node from donors that lacked them
                // (module docs, "A reset counted across a repair"). Reset it again,
                // on what the replicas are now; its grace has passed.
                tracing::debug!(
                    register = done.register,
                    "recycler: reset finished past the lease; resetting again"
                );
                s.stats.reset_failures += 1;
                s.limbo.push_back(Limbo {
                    register: done.register,
                    due: now,
                    keep: done.keep,
                    prov: done.prov,
                });
                continue;
            }
            if done.donated {
                // Given away whatever the replicas did: every reclaimer resets a
                // register on every replica before it uses it, and a copy the reset
                // missed shows this client's tag (or a key), so nobody takes the
                // register while this client lives. Never retried: once some copy
                // shows the donation, a reclaimer may own it.
                s.stats.donated += 1;
                let missed = done
                    .failed
                    .iter()
                    .any(|&node| status(node) != ReplicaStatus::Lost);
                s.stats.donations_incomplete += u64::from(missed);
                tracing::trace!(
                    register = done.register,
                    missed,
                    "register reset and donated"
                );
                continue;
            }
            // Every other replica answered: those of lost nodes out of service are
            // left to the repair that rebuilds them.
            // What the replicas that did not take it allow: skipped all (lost
            // nodes), one of them through the journal, or none.
            let mut skip_all = true;
            let mut repairing: Option<NodeId> = None;
            for &node in &done.failed {
                match status(node) {
                    ReplicaStatus::Repairing { .. } if repairing.is_none() => {
                        repairing = Some(node);
                    }
                    ReplicaStatus::Lost => {}
                    _ => skip_all = false,
                }
            }
            if !skip_all || done.phase != Phase::Install || done.moved {
                // Some replica may keep the old metadata: try again after a grace.
                s.stats.reset_failures += 1;
                s.limbo.push_back(Limbo {
                    register: done.register,
                    due: now.saturating_add(self.grace_ns),
                    keep: done.keep,
                    prov: done.prov,
                });
            } else if let Some(node) = repairing {
                tracing::debug!(
                    register = done.register,
                    node = node.index(),
                    "recycler: reset without a node being rebuilt; journaled for its repair"
                );
                s.journaled.push(Journaled {
                    register: done.register,
                    marker: done.marker,
                    node,
                    stage: Stage::NoSlot,
                    prov: done.prov,
                });
            } else if !done.failed.is_empty() {
                // Left out of a lost node: judged again on a configuration read after
                // its batches landed (module docs, "a node out of service"). The
                // renewal in flight now may have been posted before they landed; the
                // one after it was not.
                s.confirming.push(Confirming {
                    register: done.register,
                    marker: done.marker,
                    left_out: done.failed,
                    keep: done.keep,
                    after_renewals: renewals.saturating_add(2),
                    prov: done.prov,
                });
            } else {
                s.stats.recycled += 1;
                tracing::trace!(
                    register = done.register,
                    "register reset on every replica: recycled"
                );
                s.origins
                    .insert(done.register, done.prov.pooled(ResetPath::Everywhere, now));
                ready.push((done.register, done.marker));
            }
        }
        let mut i = 0;
        while i < s.confirming.len() {
            if s.confirming[i].after_renewals > renewals {
                i += 1;
                continue;
            }
            let done = s.confirming.swap_remove(i);
            if done
                .left_out
                .iter()
                .all(|&node| status(node) == ReplicaStatus::Lost)
            {
                // No repair of those nodes was announced before the reset landed:
                // a later repair's copy reads it from the others.
                for node in &done.left_out {
                    tracing::debug!(
                        register = done.register,
                        node = node.index(),
                        "recycler: reset without a lost node out of service (its repair rebuilds it)"
                    );
                }
                s.stats.recycled += 1;
                s.stats.reset_without_lost += 1;
                s.origins
                    .insert(done.register, done.prov.pooled(ResetPath::WithoutLost, now));
                ready.push((done.register, done.marker));
            } else {
                // A repair was announced (or the node admitted) meanwhile: its copy
                // may have read the register before the reset landed. Reset it again,
                // on what the replicas are now (its grace has passed).
                s.stats.reset_failures += 1;
                s.limbo.push_back(Limbo {
                    register: done.register,
                    due: now,
                    keep: done.keep,
                    prov: done.prov,
                });
            }
        }
        if !s.journaled.is_empty() || !s.row.clearing.is_empty() {
            self.journal_step(&mut s, fabric, layout, may_start, &status, now, &mut ready);
        }
        ready
    }

    /// Moves the registers waiting for a repair along (see [`crate::registers::journal`]): posts
    /// their entries, reads this client's row to see which the repair cleared, and
    /// once the node is in service again resets them there. Registers done go to
    /// `ready`.
    #[allow(clippy::too_many_arguments)]
    fn journal_step<F: Fabric>(
        &self,
        s: &mut State,
        fabric: &F,
        layout: &NodeLayout,
        may_start: bool,
        status: &impl Fn(NodeId) -> ReplicaStatus,
        now: Nanos,
        ready: &mut Vec<(RegisterId, Tsp)>,
    ) {
        let State {
            journaled,
            row,
            stats,
            limbo,
            origins,
            ..
        } = s;
        // Slot clears after an admission.
        row.clearing
            .retain(|&(slot, ticket)| match fabric.poll(ticket) {
                Poll::Pending => true,
                Poll::Ready(_) => {
                    row.free.push(slot);
                    false
                }
            });
        // The row read: which posted entries the repair of their node cleared
        // (`cleared`), and which some clear emptied that the configuration read after
        // the row does not show to be that repair's (`unconfirmed`: journal.rs, "Whose
        // clear").
        let mut cleared: Vec<(NodeId, usize)> = Vec::new();
        let mut unconfirmed: Vec<(NodeId, usize)> = Vec::new();
        if let Some((journal, ticket, number)) = row.reading
            && let Poll::Ready(result) = fabric.poll(ticket)
        {
            row.reading = None;
            if let Ok(completion) = result
                && let Some(bytes) = completion.read(0)
            {
                let config = completion
                    .read(1)
                    .and_then(|b| Configuration::decode(b).ok());
                for j in journaled.iter() {
                    if let Stage::Posted {
                        journal: at,
                        slot,
                        since,
                        epoch,
                    } = j.stage
                        && at == journal
                        && number > since
                        && bytes
                            .get(8 * slot..8 * slot + 8)
                            .and_then(|w| w.try_into().ok())
                            .map(u64::from_le_bytes)
                            // Exactly zero: a repair's CAS cleared it. Anything else
                            // but the entry is a read torn by that CAS (not cleared yet).
                            .is_some_and(|word| word == 0)
                    {
                        if config
                            .as_ref()
                            .is_some_and(|c| clear_is_the_repairs(c, j.node, epoch))
                        {
                            cleared.push((at, slot));
                        } else {
                            unconfirmed.push((at, slot));
                        }
                    }
                }
            }
        }
        let mut poll_row: Option<NodeId> = None;
        let mut known: Option<(NodeId, ReplicaStatus)> = None;
        let mut i = 0;
        while i < journaled.len() {
            let j = &mut journaled[i];
            // Once per node and step (every entry names the node being rebuilt).
            let node_status = match known {
                Some((node, st)) if node == j.node => st,
                _ => {
                    let st = status(j.node);
                    known = Some((j.node, st));
                    st
                }
            };
            let mut done = false;
            let mut back_to_limbo = false;
            let mut redo = false;
            match j.stage {
                Stage::Posted { journal, slot, .. } if cleared.contains(&(journal, slot)) => {
                    // The repair copied the register to the node, then cleared it.
                    row.free.push(slot);
                    done = true;
                }
                Stage::Posted { journal, slot, .. } if unconfirmed.contains(&(journal, slot)) => {
                    // Cleared, perhaps by the repair of another node after this one's
                    // admission, which copied nothing to this node: reset the
                    // register again on every replica (the slot is free again).
                    tracing::debug!(
                        register = j.register,
                        node = j.node.index(),
                        "recycler: journal entry cleared, not shown to be by its node's repair; reset again"
                    );
                    row.free.push(slot);
                    redo = true;
                }
                Stage::Posting {
                    journal,
                    slot,
                    ticket,
                    epoch,
                } => match fabric.poll(ticket) {
                    Poll::Pending => {}
                    Poll::Ready(Ok(c)) if c.cas(0) == Some(0) => {
                        j.stage = Stage::Posted {
                            journal,
                            slot,
                            since: row.reads_posted,
                            epoch,
                        };
                    }
                    Poll::Ready(Ok(_)) => {
                        // A slot an earlier incarnation left: not this one's.
                        tracing::debug!(slot, "journal slot in use by an earlier incarnation");
                        j.stage = Stage::NoSlot;
                    }
                    Poll::Ready(Err(error)) => {
                        // The entry may or may not be there: the slot stays out of
                        // use, the register goes through a whole reset again.
                        tracing::debug!(register = j.register, %error, "journal entry failed");
                        back_to_limbo = true;
                    }
                },
                Stage::NoSlot | Stage::Posted { .. } => match node_status {
                    ReplicaStatus::Repairing { journal, epoch } => {
                        if let Stage::Posted { journal: at, .. } = j.stage {
                            poll_row = Some(at);
                        } else if may_start && let Some(slot) = row.free.pop() {
                            match layout.journal_slot(self.writer, slot) {
                                Some(at) => {
                                    let ticket = fabric.post(
                                        journal,
                                        Batch::cas(
                                            at,
                                            0,
                                            crate::registers::journal::entry(
                                                j.register,
                                                j.marker,
                                                layout.params.registers,
                                            ),
                                        ),
                                    );
                                    j.stage = Stage::Posting {
                                        journal,
                                        slot,
                                        ticket,
                                        epoch,
                                    };
                                }
                                None => back_to_limbo = true,
                            }
                        }
                    }
                    // In service again (admitted) before the repair copied it: reset
                    // the register again on every replica (the node's words must be
                    // the others' marker or above it, which only a whole reset
                    // decides), at once: its grace has passed.
                    ReplicaStatus::InService => {
                        if let Stage::Posted { journal, slot, .. } = j.stage {
                            match layout.journal_slot(self.writer, slot) {
                                Some(at) => row.clearing.push((
                                    slot,
                                    fabric.post(
                                        journal,
                                        Batch::cas(
                                            at,
                                            crate::registers::journal::entry(
                                                j.register,
                                                j.marker,
                                                layout.params.registers,
                                            ),
                                            0,
                                        ),
                                    ),
                                )),
                                None => row.free.push(slot),
                            }
                        }
                        redo = true;
                    }
                    // Lost with no repair announced any more: a later repair's copy
                    // reads the reset from the others.
                    ReplicaStatus::Lost => {
                        if let Stage::Posted { slot, .. } = j.stage {
                            // The entry stays for that repair to service; the slot is
                            // not reused by this incarnation.
                            tracing::debug!(slot, "journal entry left for a later repair");
                        }
                        done = true;
                    }
                    ReplicaStatus::Undecided => {}
                },
            }
            if done || back_to_limbo || redo {
                let j = journaled.swap_remove(i);
                if redo {
                    stats.reset_through_journal += 1;
                    enqueue(
                        limbo,
                        Limbo {
                            register: j.register,
                            due: now,
                            keep: false,
                            prov: j.prov,
                        },
                    );
                } else if done {
                    stats.recycled += 1;
                    stats.reset_without_lost += 1;
                    stats.reset_through_journal += 1;
                    tracing::trace!(
                        register = j.register,
                        "register reset, the rebuilt node included: recycled"
                    );
                    origins.insert(j.register, j.prov.pooled(ResetPath::Journal, now));
                    ready.push((j.register, j.marker));
                } else {
                    stats.reset_failures += 1;
                    limbo.push_back(Limbo {
                        register: j.register,
                        due: now.saturating_add(self.grace_ns),
                        keep: false,
                        prov: j.prov,
                    });
                }
            } else {
                i += 1;
            }
        }
        if let Some(journal) = poll_row
            && row.reading.is_none()
            && now >= row.next_read
            && let Some(at) = layout.journal_slot(self.writer, 0)
        {
            row.next_read = now.saturating_add(JOURNAL_POLL_NS);
            row.reads_posted += 1;
            // The row, then the configuration record, in one ordered batch: the
            // record is read after every clear the row shows (journal.rs, "Whose
            // clear").
            let mut batch = Batch::read(at, crate::registers::journal::ROW_BYTES as u32);
            if batch
                .push(Op::Read {
                    addr: CONFIG_AT,
                    len: CONFIG_READ_BYTES as u32,
                })
                .is_ok()
            {
                row.reading = Some((journal, fabric.post(journal, batch), row.reads_posted));
            }
        }
    }

    /// Forgets the resets and marks in flight (the client is going away: its limbo and
    /// pool stay tagged with its tag, for others to reclaim, `crate::registers::limbo`).
    pub fn abandon<F: Fabric>(&self, fabric: &F) {
        let mut s = self.state.borrow_mut();
        for (_, ticket, _, _) in s.marking.drain(..) {
            fabric.forget(ticket);
        }
        for reset in s.resetting.drain(..) {
            for (_, ticket, _) in reset.pending {
                fabric.forget(ticket);
            }
        }
        for j in s.journaled.drain(..) {
            match j.stage {
                Stage::Posting { ticket, .. } => fabric.forget(ticket),
                Stage::NoSlot | Stage::Posted { .. } => {}
            }
        }
        if let Some((_, ticket, _)) = s.row.reading.take() {
            fabric.forget(ticket);
        }
        for (_, ticket) in s.row.clearing.drain(..) {
            fabric.forget(ticket);
        }
    }
}

fn note_mark(
    stats: &mut RecycleStats,
    register: RegisterId,
    node: NodeId,
    expected: u64,
    result: Result<swarm_core::Completion, swarm_core::FabricError>,
) {
    match result {
        Err(error) => {
            stats.mark_failures += 1;
            tracing::debug!(register, node = node.index(), %error, "retire mark failed on a replica");
        }
        // A blank copy (key length 0) is one the insert's fresh write did not reach
        // (it writes a majority): nothing to mark there. A keyed copy that kept
        // another word kept no mark.
        Ok(reply) => match reply.cas(0) {
            Some(found) if found != expected && found as u32 != 0 => {
                stats.mark_failures += 1;
                tracing::debug!(
                    register,
                    node = node.index(),
                    found = format_args!("{found:#x}"),
                    expected = format_args!("{expected:#x}"),
                    "retire mark found another key-header word on a replica"
                );
            }
            _ => {}
        },
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::task::Poll;

    use swarm_core::fabric::{
        Batch, Completion, FabricError, FailureCause, Nanos, NodeId, Op, Ticket,
    };
    use swarm_core::{Fabric, MemFabric, RegisterLoc};

    use super::{JOURNAL_POLL_NS, Recycler, ReplicaStatus};
    use crate::configuration::{CONFIG_AT, Configuration};
    use crate::layout::NodeLayout;
    use crate::registers::journal;
    use crate::test_support::small_cluster;

    /// An in-memory fabric on which one node can refuse every batch (a node out of
    /// service), whose clock the test moves, and whose reads of node 0 (the
    /// journal's) may be held back: they execute when posted but report their
    /// completion only once released, after later batches completed (a transport
    /// that reorders completions, as the simulator's late messages do).
    struct Refusing {
        inner: MemFabric,
        refused: Cell<Option<NodeId>>,
        now: Cell<Nanos>,
        hold: Cell<bool>,
        held: RefCell<Vec<Ticket>>,
        /// Runs before every batch posted to a node in service (a test's other
        /// clients, acting between two batches of the recycler's).
        hook: RefCell<Option<Hook>>,
    }

    const REFUSED: u32 = 1 << 31;

    /// What [`Refusing`] runs before a batch: the node and the batch.
    type Hook = Box<dyn FnMut(NodeId, &Batch)>;

    impl Refusing {
        /// Node 2 refused, the clock at 1 µs, no read held back.
        fn new(inner: MemFabric) -> Self {
            Self {
                inner,
                refused: Cell::new(Some(NodeId(2))),
                now: Cell::new(1_000),
                hold: Cell::new(false),
                held: RefCell::new(Vec::new()),
                hook: RefCell::new(None),
            }
        }
    }

    impl Fabric for Refusing {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> Ticket {
            if self.refused.get() == Some(node) {
                return Ticket(REFUSED | u32::from(node.0));
            }
            if let Some(hook) = self.hook.borrow_mut().as_mut() {
                hook(node, &batch);
            }
            // A journal row read (with the configuration record after it).
            let read = !batch.ops().is_empty()
                && batch.ops().iter().all(|op| matches!(op, Op::Read { .. }));
            let ticket = self.inner.post(node, batch);
            if read && node == NodeId(0) && self.hold.get() {
                self.held.borrow_mut().push(ticket);
            }
            ticket
        }
        fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
            if ticket.0 & REFUSED != 0 {
                return Poll::Ready(Err(FabricError::NodeFailed {
                    node: NodeId((ticket.0 & !REFUSED) as u16),
                    cause: FailureCause::Crashed,
                }));
            }
            if self.held.borrow().contains(&ticket) {
                return Poll::Pending;
            }
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: Ticket) {
            if ticket.0 & REFUSED == 0 {
                self.held.borrow_mut().retain(|&t| t != ticket);
                self.inner.forget(ticket);
            }
        }
        fn progress(&self) -> bool {
            self.inner.progress()
        }
        fn now(&self) -> Nanos {
            self.now.get()
        }
        fn wake_at(&self, deadline: Nanos) {
            self.inner.wake_at(deadline);
        }
    }

    fn word(fabric: &MemFabric, node: u16, at: u64) -> u64 {
        let ticket = fabric.post(NodeId(node), Batch::read(at, 8));
        let Poll::Ready(Ok(c)) = fabric.poll(ticket) else {
            panic!("read")
        };
        u64::from_le_bytes(c.read(0).unwrap().try_into().unwrap())
    }

    fn write_word(fabric: &MemFabric, node: u16, at: u64, value: u64) {
        let ticket = fabric.post(NodeId(node), Batch::write(at, value.to_le_bytes().to_vec()));
        assert!(matches!(fabric.poll(ticket), Poll::Ready(Ok(_))));
    }

    /// The epoch of the configuration that announces node 2's repair in the journal
    /// tests.
    const ANNOUNCED: u64 = 2;

    /// Node 2 under repair, its journal on node 0, announced at [`ANNOUNCED`].
    const REPAIRING_2: ReplicaStatus = ReplicaStatus::Repairing {
        journal: NodeId(0),
        epoch: ANNOUNCED,
    };

    /// Writes a configuration record of `epoch` with the repairing bits `repairing`
    /// on node 0 (the journal node), as a repair's announcement or admission does.
    fn announce(fabric: &MemFabric, epoch: u64, repairing: u64) {
        let mut config = Configuration::new(epoch, vec![1; 3]);
        config.repairing = repairing;
        let ticket = fabric.post(NodeId(0), Batch::write(CONFIG_AT, config.encode()));
        assert!(matches!(fabric.poll(ticket), Poll::Ready(Ok(_))));
    }

    /// `steps` recycling steps (renewals `0..steps`) with node 2 lost: what came back.
    fn steps_with_node_2_lost(
        recycler: &Recycler,
        fabric: &Refusing,
        layout: &NodeLayout,
        steps: u64,
    ) -> Vec<u64> {
        (0..steps)
            .flat_map(|renewals| {
                step_node_2(recycler, fabric, layout, ReplicaStatus::Lost, renewals)
            })
            .collect()
    }

    /// One recycler step on a cluster whose node 2 has `status` (the others are in
    /// service); the registers that came back.
    fn step_node_2(
        recycler: &Recycler,
        fabric: &Refusing,
        layout: &NodeLayout,
        status: ReplicaStatus,
        renewals: u64,
    ) -> Vec<u64> {
        let back = recycler.step(
            fabric,
            layout,
            |_| true,
            || false,
            |r| loc(layout, r),
            |n| {
                if n == NodeId(2) {
                    status
                } else {
                    ReplicaStatus::InService
                }
            },
            renewals,
        );
        for (_, marker) in &back {
            assert!(
                marker.is_reset(),
                "a reset register comes back with its marker"
            );
        }
        back.into_iter().map(|(r, _)| r).collect()
    }

    /// Retires `register` for the recycler whose tag is 7, as a delete does: its
    /// key header marked with that tag on every replica.
    fn retire_marked(recycler: &Recycler, raw: &MemFabric, layout: &NodeLayout, register: u64) {
        let header = layout.key_header(register).unwrap();
        for node in 0..3 {
            write_word(
                raw,
                node,
                header,
                crate::registers::limbo::header_word(3, 7),
            );
        }
        recycler.retire(register, 0, super::Retired::Unmapped);
    }

    /// `steps` recycling steps of `recycler`, every replica in service, none of
    /// which hands a register back: what it retired is donated, not pooled.
    fn steps_giving_nothing_back<F: Fabric>(
        recycler: &Recycler,
        fabric: &F,
        layout: &NodeLayout,
        steps: usize,
    ) {
        for _ in 0..steps {
            let back = recycler.step(
                fabric,
                layout,
                |_| true,
                || true,
                |r| loc(layout, r),
                |_| ReplicaStatus::InService,
                0,
            );
            assert!(back.is_empty(), "a donated register stays given away");
        }
    }

    fn is_marker(word: u64) -> bool {
        swarm_core::encoding::Tsp::from_word(word).is_reset()
    }

    fn loc(layout: &NodeLayout, register: u64) -> Option<RegisterLoc> {
        crate::client::register_loc_for(layout, 3, register).ok()
    }

    /// Writes `register`'s key-header word 0 and every metadata word and the delete
    /// word on `node` (a marker's word, say).
    fn write_register(
        raw: &MemFabric,
        layout: &NodeLayout,
        register: u64,
        node: u16,
        header: u64,
        words: u64,
    ) {
        write_word(raw, node, layout.key_header(register).unwrap(), header);
        let meta = layout.register(register).unwrap() + layout.swarm.meta_offset();
        for i in 0..layout.swarm.meta_bytes() / 8 {
            write_word(raw, node, meta + 8 * i, words);
        }
    }

    /// The soak's "key header missing": a register its client had reset (tag 7,
    /// marker `M`) and pooled, then inserted a key into, whose header and value reached
    /// nodes 0 and 2 only (node 1 kept the blank copy `(0, 7)` at `M`), and which
    /// came back into the client's limbo while its key stayed mapped. With node 2
    /// lost, the reset read node 0's keyed copy and node 1's blank one, took the blank
    /// one for its trace, tombstoned and blanked the mapped register: two owners. A
    /// blank copy is a trace of the register's current life only if no keyed copy
    /// holds words above its marker; here the reset leaves the register alone. A blank
    /// copy above a keyed one (a rebuilt node's stale copy of the life the reset
    /// ends) is still its trace.
    #[test]
    fn a_reset_leaves_a_keyed_life_alone_whose_only_trace_is_the_pool_it_came_from() {
        use swarm_core::encoding::Tsp;
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        // Node 2 lost: refused.
        let fabric = Refusing::new(cluster.client());
        let recycler = Recycler::new(0, 1, 7);
        let (pooled, newer) = (
            Tsp::reset_marker(100).unwrap().word(),
            Tsp::reset_marker(200).unwrap().word(),
        );
        let keyed = crate::registers::limbo::header_word(3, 0);
        let blank = crate::registers::limbo::header_word(0, 7);
        // The victim: keyed above the blank copy's marker.
        let victim = 5;
        write_register(&raw, &layout, victim, 0, keyed, newer);
        write_register(&raw, &layout, victim, 1, blank, pooled);
        recycler.retire(victim, 0, super::Retired::Unmapped);
        // A register whose blank copy is above the stale keyed one: reset.
        let stale = 6;
        write_register(&raw, &layout, stale, 0, keyed, pooled);
        write_register(&raw, &layout, stale, 1, blank, newer);
        recycler.retire(stale, 0, super::Retired::Unmapped);
        let back = steps_with_node_2_lost(&recycler, &fabric, &layout, 6);
        let header = layout.key_header(victim).unwrap();
        assert_eq!(
            word(&raw, 0, header),
            keyed,
            "the mapped register's key header was blanked"
        );
        let delete_at = layout.register(victim).unwrap()
            + layout.swarm.meta_offset()
            + layout.swarm.meta_bytes()
            - 8;
        assert_eq!(
            word(&raw, 0, delete_at),
            newer,
            "the mapped register was tombstoned"
        );
        assert_eq!(recycler.stats().reset_abandoned, 1);
        assert_eq!(
            back,
            vec![stale],
            "the stale keyed copy's register comes back"
        );
        assert_eq!(
            word(&raw, 0, layout.key_header(stale).unwrap()),
            blank,
            "reset on node 0 too"
        );
    }

    /// A register handed back says how it came into the pool (what an insert that
    /// finds it in another life logs): retired or a taken donation, how many resets,
    /// and whether the last one reached every replica or left a lost node out; the
    /// record goes once taken.
    #[test]
    fn a_pooled_register_says_how_it_came_into_the_pool() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        fabric.refused.set(None);
        let recycler = Recycler::new(0, 1, 7);
        let (a, b) = (5, 6);
        retire_marked(&recycler, &raw, &layout, a);
        let mut back = Vec::new();
        for _ in 0..4 {
            back.extend(step_node_2(
                &recycler,
                &fabric,
                &layout,
                ReplicaStatus::InService,
                0,
            ));
        }
        assert_eq!(back, vec![a]);
        let origin = recycler.take_origin(a).expect("recorded");
        assert_eq!(
            (origin.came, origin.path, origin.resets),
            (
                super::Came::Retired(super::Retired::Unmapped),
                super::ResetPath::Everywhere,
                1
            )
        );
        assert_eq!(recycler.take_origin(a), None, "taken once");
        // A taken donation, reset while node 2 is lost: back after two renewals.
        let header = layout.key_header(b).unwrap();
        for node in 0..3 {
            write_word(
                &raw,
                node,
                header,
                crate::registers::limbo::header_word(0, 7),
            );
        }
        recycler.take_donation(b, 0);
        fabric.refused.set(Some(swarm_core::fabric::NodeId(2)));
        let back = steps_with_node_2_lost(&recycler, &fabric, &layout, 4);
        assert_eq!(back, vec![b]);
        let origin = recycler.take_origin(b).expect("recorded");
        assert_eq!(
            (origin.came, origin.path),
            (super::Came::Donation, super::ResetPath::WithoutLost)
        );
    }

    /// A reset whose install answers are all in, but whose lease ran out by the clock
    /// reading after the last of them (its client stopped inside the reset, perhaps
    /// across a repair that rebuilt a node from donors the install had not reached),
    /// does not hand its register out: it resets it again, and hands it out (with a
    /// life marker, `step_node_2`) once a reset finishes under a valid lease.
    #[test]
    fn a_reset_finished_past_its_lease_resets_again() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        fabric.refused.set(None);
        let recycler = Recycler::new(0, 1, 7);
        let register = 5;
        retire_marked(&recycler, &raw, &layout, register);
        // The lease is valid when each step starts, never after an install's answers.
        let readings = core::cell::Cell::new(0u32);
        let lapsing = |_: Nanos| {
            readings.set(readings.get() + 1);
            readings.get() % 2 == 1
        };
        for _ in 0..4 {
            let back = recycler.step(
                &fabric,
                &layout,
                lapsing,
                || false,
                |r| loc(&layout, r),
                |_| ReplicaStatus::InService,
                0,
            );
            assert!(
                back.is_empty(),
                "a reset counted past its lease hands out nothing"
            );
        }
        assert!(
            recycler.stats().reset_failures >= 1,
            "{:?}",
            recycler.stats()
        );
        let mut back = Vec::new();
        for _ in 0..4 {
            back.extend(step_node_2(
                &recycler,
                &fabric,
                &layout,
                ReplicaStatus::InService,
                0,
            ));
        }
        assert_eq!(back, vec![register], "reset again under a valid lease");
    }

    /// A donating reset that reads again (a CAS of its install found a late store)
    /// takes only its own donation's word for its trace, never another donation's
    /// (docs/pauses.md, H8). Here the donor stops between its install and its read
    /// again; meanwhile a taker took the register, reset it and donated it again. The
    /// read shows that donation's word on every replica: the donor must leave it,
    /// not install its own first word over it, which would bring a word back that a
    /// taker stopped inside its burst still expects (H2: a take counted over two
    /// donations of one word, two owners).
    #[test]
    fn a_donating_reset_read_again_leaves_a_later_donation_alone() {
        use crate::registers::limbo::{donated_tag, header_word};
        use swarm_core::encoding::Tsp;
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        fabric.refused.set(None);
        let r = 5;
        let meta_at = layout.register(r).unwrap() + layout.swarm.meta_offset();
        let delete_at = layout.swarm.delete_word_addr(layout.register(r).unwrap());
        let header = layout.key_header(r).unwrap();
        let words = layout.swarm.meta_bytes() / 8;
        let later = Tsp::reset_marker((1 << 40) + 12_345).unwrap();
        let later_donation = header_word(0, donated_tag(later.ts().ticks()));
        // The donor's install: a late store of an earlier life moves one metadata
        // word of the first replica it reaches, so the donor reads again. Before
        // that read, the register went through a taker's life and was donated
        // again: every replica shows that donation.
        let stage = std::rc::Rc::new(Cell::new(0));
        let hook_stage = stage.clone();
        let hook_raw = cluster.client();
        *fabric.hook.borrow_mut() = Some(Box::new(move |node: NodeId, batch: &Batch| {
            match (hook_stage.get(), batch.ops().first()) {
                (0, Some(Op::Cas { addr, new, .. }))
                    if *addr == delete_at && Tsp::from_word(*new).is_reset() =>
                {
                    let moved = word(&hook_raw, node.0, meta_at) + (1 << 12);
                    write_word(&hook_raw, node.0, meta_at, moved);
                    hook_stage.set(1);
                }
                (1, Some(Op::Read { addr, .. })) if *addr == header => {
                    for n in 0..3 {
                        for w in 0..words {
                            write_word(&hook_raw, n, meta_at + 8 * w, later.word());
                        }
                        write_word(&hook_raw, n, header, later_donation);
                    }
                    hook_stage.set(2);
                }
                _ => {}
            }
        }));
        let donor = Recycler::new(0, 1, 7);
        for node in 0..3 {
            write_word(&raw, node, header, header_word(3, 7));
        }
        donor.retire(r, 0, super::Retired::Unmapped);
        steps_giving_nothing_back(&donor, &fabric, &layout, 4);
        assert_eq!(
            stage.get(),
            2,
            "the donor read again after the later donation"
        );
        for node in 0..3 {
            assert_eq!(
                word(&raw, node, header),
                later_donation,
                "node {node}: the later donation's word was replaced"
            );
            assert_eq!(word(&raw, node, meta_at), later.word(), "node {node}");
        }
    }

    /// A donating reset writes its donation's own word, from the marker it
    /// installed, on every replica; the register's next donation, after a life in
    /// another client, writes another one (`crate::registers::limbo`, "Exactly one
    /// taker": a take stopped inside its burst never finds its word again).
    #[test]
    fn each_donation_of_a_register_writes_its_own_word() {
        use crate::registers::limbo::{donated_tag, header_word};
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        fabric.refused.set(None);
        let r = 5;
        let meta_at = layout.register(r).unwrap() + layout.swarm.meta_offset();
        let header = layout.key_header(r).unwrap();
        let donate = |recycler: &Recycler, tag: u32| {
            for node in 0..3 {
                write_word(&raw, node, header, header_word(3, tag));
            }
            recycler.retire(r, 0, super::Retired::Unmapped);
            steps_giving_nothing_back(recycler, &fabric, &layout, 8);
            assert_eq!(recycler.stats().donated, 1);
            let marker = swarm_core::encoding::Tsp::from_word(word(&raw, 0, meta_at));
            assert!(marker.is_reset());
            let donated = header_word(0, donated_tag(marker.ts().ticks()));
            for node in 0..3 {
                assert_eq!(word(&raw, node, header), donated, "node {node}");
            }
            donated
        };
        let first = donate(&Recycler::new(0, 1, 7), 7);
        // A taker resets it, and its life writes above the marker.
        for node in 0..3 {
            write_word(&raw, node, meta_at, word(&raw, node, meta_at) + (1 << 20));
        }
        let second = donate(&Recycler::new(0, 2, 9), 9);
        assert_ne!(first, second, "two donations, one word");
    }

    /// A register reset while node 2 is being rebuilt waits in the journal until
    /// the repair clears its entry, then comes back; another one still waiting
    /// when node 2 is admitted is reset there by its client, then comes back.
    #[test]
    fn a_journaled_register_comes_back_once_serviced_or_reset_on_the_admitted_node() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        let status = Cell::new(REPAIRING_2);
        announce(&raw, ANNOUNCED, 1 << 2);
        let writer = 1;
        let recycler = Recycler::new(0, writer, 7);
        // Registers placed on node 2 too (every register is, with 3 replicas of 3).
        let (a, b) = (5, 6);
        let meta_at = |r: u64| layout.register(r).unwrap() + layout.swarm.meta_offset();
        for r in [a, b] {
            for node in 0..3 {
                write_word(&raw, node, meta_at(r), 0xdead);
            }
            retire_marked(&recycler, &raw, &layout, r);
        }
        let step = || step_node_2(&recycler, &fabric, &layout, status.get(), 0);
        let slot_of = |r: u64| -> Option<usize> {
            (0..journal::SLOTS).find(|&i| {
                journal::entry_register(
                    word(&raw, 0, layout.journal_slot(writer, i).unwrap()),
                    layout.params.registers,
                ) == Some(r)
            })
        };
        // Reset on nodes 0 and 1 (read, tombstone, read, install), journaled on
        // node 0; nothing comes back yet.
        for _ in 0..8 {
            assert!(
                step().is_empty(),
                "a register came back before the repair copied it"
            );
        }
        assert!(is_marker(word(&raw, 0, meta_at(a))), "reset on node 0");
        assert_eq!(
            word(&raw, 2, meta_at(a)),
            0xdead,
            "node 2 refused the reset"
        );
        let (slot_a, slot_b) = (
            slot_of(a).expect("a journaled"),
            slot_of(b).expect("b journaled"),
        );
        assert_eq!(recycler.in_limbo(), 2);
        // The repair services `a`'s entry: it comes back at the next row read.
        write_word(&raw, 0, layout.journal_slot(writer, slot_a).unwrap(), 0);
        fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
        let mut back = Vec::new();
        for _ in 0..3 {
            back.extend(step());
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
        }
        assert_eq!(back, vec![a]);
        assert_eq!(recycler.stats().reset_through_journal, 1);
        let origin = recycler.take_origin(a).expect("where `a` came from");
        assert_eq!(
            (origin.came, origin.path, origin.resets),
            (
                super::Came::Retired(super::Retired::Unmapped),
                super::ResetPath::Journal,
                1
            )
        );
        // Node 2 is admitted before the repair serviced `b`: its client clears its
        // own entry and resets it again on every replica, and only then hands it out.
        fabric.refused.set(None);
        status.set(ReplicaStatus::InService);
        let mut back = Vec::new();
        for _ in 0..10 {
            back.extend(step());
        }
        assert_eq!(back, vec![b]);
        assert!(
            is_marker(word(&raw, 2, meta_at(b))),
            "reset on the admitted node"
        );
        assert_eq!(
            word(&raw, 0, meta_at(b)),
            word(&raw, 2, meta_at(b)),
            "one marker on every replica"
        );
        assert_eq!(
            word(&raw, 0, layout.journal_slot(writer, slot_b).unwrap()),
            0,
            "the entry is cleared"
        );
        assert_eq!(recycler.in_limbo(), 0);
        assert_eq!(recycler.stats().reset_through_journal, 2);
        assert_eq!(recycler.stats().recycled, 2);
    }

    /// A stopped repair's late journal clear never hands out a later life's register
    /// (docs/pauses.md, H3 part b). A repair reads register `r`'s entry, copies it
    /// and stops before its clear lands. A second repair services and clears the
    /// entry, `r` comes back, is used, retired and reset again while a repair still
    /// runs, and its client journals it again in the same slot. The stopped repair's
    /// clear, the CAS from the word it read to zero, now lands: it must fail, or the
    /// client hands `r` out although no repair copied this reset to the node.
    #[test]
    fn a_stopped_repairs_late_clear_never_frees_a_later_lifes_entry() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        let writer = 1;
        let recycler = Recycler::new(0, writer, 7);
        let r = 5;
        let journaling = REPAIRING_2;
        announce(&raw, ANNOUNCED, 1 << 2);
        let step = || step_node_2(&recycler, &fabric, &layout, journaling, 0);
        let entry_of = |r: u64| -> Option<(usize, u64)> {
            (0..journal::SLOTS).find_map(|i| {
                let w = word(&raw, 0, layout.journal_slot(writer, i).unwrap());
                (w != 0 && journal::entry_register(w, layout.params.registers) == Some(r))
                    .then_some((i, w))
            })
        };
        let journal_it = || {
            for _ in 0..8 {
                assert!(step().is_empty(), "came back before a repair copied it");
            }
            entry_of(r).expect("journaled")
        };
        // First life's reset, journaled; the stopped repair read this word.
        retire_marked(&recycler, &raw, &layout, r);
        let (slot, stale) = journal_it();
        // The second repair copies `r` and clears the entry: `r` comes back.
        write_word(&raw, 0, layout.journal_slot(writer, slot).unwrap(), 0);
        let mut back = Vec::new();
        for _ in 0..3 {
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
            back.extend(step());
        }
        assert_eq!(back, vec![r]);
        // A later life of `r` is retired and reset while a repair runs: journaled
        // again, in the same slot.
        retire_marked(&recycler, &raw, &layout, r);
        let (again, _) = journal_it();
        assert_eq!(again, slot, "the freed slot is reused first");
        // The stopped repair's clear lands now.
        let at = layout.journal_slot(writer, slot).unwrap();
        let ticket = raw.post(NodeId(0), Batch::cas(at, stale, 0));
        assert!(matches!(raw.poll(ticket), Poll::Ready(Ok(_))));
        for _ in 0..5 {
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
            assert!(
                step().is_empty(),
                "a stale clear handed out a register whose reset the node lacks"
            );
        }
        assert_eq!(entry_of(r).map(|e| e.0), Some(slot), "the entry stands");
        assert_eq!(recycler.in_limbo(), 1);
    }

    /// A row read posted before a register's journal entry landed cannot tell that
    /// the repair cleared the entry, even when its completion arrives after the
    /// entry's: it read the row before the entry was there. Here register `b`'s
    /// entry is in the journal and a row read for it is in flight (held back) when
    /// register `a` is reset and journaled; the read, released, shows `a`'s slot
    /// empty, which must not hand `a` out before the repair copied it.
    #[test]
    fn a_row_read_posted_before_an_entry_landed_does_not_clear_it() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        let writer = 1;
        let recycler = Recycler::new(0, writer, 7);
        let (a, b) = (5, 6);
        let journaling = REPAIRING_2;
        let step = || step_node_2(&recycler, &fabric, &layout, journaling, 0);
        let journaled = |r: u64| {
            (0..journal::SLOTS).any(|i| {
                journal::entry_register(
                    word(&raw, 0, layout.journal_slot(writer, i).unwrap()),
                    layout.params.registers,
                ) == Some(r)
            })
        };
        // `b` journaled, and a row read for it posted and held back.
        retire_marked(&recycler, &raw, &layout, b);
        for _ in 0..8 {
            assert!(step().is_empty());
            if journaled(b) {
                break;
            }
        }
        fabric.hold.set(true);
        for _ in 0..3 {
            assert!(step().is_empty());
        }
        assert!(journaled(b));
        assert_eq!(fabric.held.borrow().len(), 1, "one row read in flight");
        // `a` reset and journaled while that read is in flight.
        fabric.hold.set(false);
        retire_marked(&recycler, &raw, &layout, a);
        for _ in 0..8 {
            assert!(step().is_empty());
        }
        assert!(journaled(a));
        // The read completes now: it shows `a`'s slot empty (it ran before the
        // entry landed). Later reads show the entry, which no repair cleared.
        fabric.held.borrow_mut().clear();
        for _ in 0..4 {
            assert!(
                !step().contains(&a),
                "a register came back before the repair copied it"
            );
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
        }
        assert!(journaled(a) && journaled(b));
        assert_eq!(recycler.stats().reset_through_journal, 0);
    }

    /// A journal entry cleared by the repair of *another* node never hands its
    /// register out (docs/pauses.md, "Found by the soak", the journal side; seen in
    /// `tests/many_nodes.rs`). Register `r` is reset on nodes 0 and 1 while node 2's
    /// repair is announced, and journaled on node 0. That repair admits node 2
    /// before it serviced the entry, and this client has not followed the admission
    /// yet. The next repair, of node 1 (its journal on node 0 too), announces itself
    /// and services every entry on node 0: it copies `r` to node 1, which copies
    /// nothing to node 2, and clears the entry. Taking that clear for node 2's copy
    /// handed `r` out with node 2 still holding the earlier life: the next insert's
    /// fresh write met it there (`Recycled`), and a key mapped to `r` could read
    /// that life's words from a quorum with node 2.
    #[test]
    fn a_journal_entry_cleared_by_another_nodes_repair_is_reset_again() {
        let (cluster, layout) = small_cluster(200 * crate::test_support::MS);
        let raw = cluster.client();
        let fabric = Refusing::new(cluster.client());
        let writer = 1;
        let recycler = Recycler::new(0, writer, 7);
        let r = 5;
        let meta_at = layout.register(r).unwrap() + layout.swarm.meta_offset();
        for node in 0..3 {
            write_word(&raw, node, meta_at, 0xdead);
        }
        announce(&raw, ANNOUNCED, 1 << 2);
        let status = Cell::new(REPAIRING_2);
        let step = || step_node_2(&recycler, &fabric, &layout, status.get(), 0);
        let slot_of = |r: u64| -> Option<usize> {
            (0..journal::SLOTS).find(|&i| {
                journal::entry_register(
                    word(&raw, 0, layout.journal_slot(writer, i).unwrap()),
                    layout.params.registers,
                ) == Some(r)
            })
        };
        retire_marked(&recycler, &raw, &layout, r);
        for _ in 0..8 {
            assert!(step().is_empty(), "came back before a repair copied it");
        }
        let slot = slot_of(r).expect("journaled");
        assert_eq!(word(&raw, 2, meta_at), 0xdead, "node 2 refused the reset");
        // Node 2 admitted (epoch 3), then node 1's repair announced (epoch 4): it
        // clears the entry without copying anything to node 2.
        announce(&raw, ANNOUNCED + 1, 0);
        announce(&raw, ANNOUNCED + 2, 1 << 1);
        write_word(&raw, 0, layout.journal_slot(writer, slot).unwrap(), 0);
        // This client still follows node 2's announcement.
        for _ in 0..6 {
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
            assert!(
                step().is_empty(),
                "a register came back whose reset node 2 lacks"
            );
        }
        assert_eq!(word(&raw, 2, meta_at), 0xdead);
        assert!(slot_of(r).is_some(), "reset again and journaled again");
        assert_eq!(recycler.in_limbo(), 1);
        // Once node 2 is in service for this client, it is reset there too.
        fabric.refused.set(None);
        status.set(ReplicaStatus::InService);
        let mut back = Vec::new();
        for _ in 0..12 {
            back.extend(step());
            fabric.now.set(fabric.now.get() + JOURNAL_POLL_NS);
        }
        assert_eq!(back, vec![r]);
        assert!(is_marker(word(&raw, 2, meta_at)), "reset on node 2");
        assert_eq!(word(&raw, 0, meta_at), word(&raw, 2, meta_at));
    }

    /// The register grace is the shared reclamation grace of its window.
    #[test]
    fn the_grace_covers_the_window_drift_and_flight() {
        assert_eq!(swarm_core::slot_recycling::grace_ns(0), 11_250_000);
        // 7 s · 9/7 + 10 ms · 9/8.
        assert_eq!(
            swarm_core::slot_recycling::grace_ns(7_000_000_000),
            9_011_250_000
        );
        assert_eq!(swarm_core::slot_recycling::grace_ns(u64::MAX), u64::MAX);
    }
}
