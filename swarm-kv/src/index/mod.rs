//! The replicated, linearizable index of SWARM-KV: key → register (SWARM §5.2).
//!
//! SWARM-KV finds a key's register through an index that must be linearizable,
//! survive a crashed minority of memory nodes and any number of crashed clients, and
//! answer a lookup in one roundtrip in the common case (SWARM §5.2: "reliable and
//! allows clients to set and get the replicas associated to a key in a single
//! roundtrip in the common case"). Unlike SWARM registers it cannot be wait-free:
//! two inserts of one key must agree on a winner, which is consensus. This module is
//! obstruction-free: an update finishes once contention stops (randomised backoff),
//! while a majority of nodes is alive. An attempt that was preempted backs off and
//! reads the buckets again before it promises (`Engine::backoff_and_reread`): its
//! promise CASes the bucket's meta word from the value it last saw, and one seen
//! before the pause is stale whenever others changed the bucket meanwhile, so under
//! steady changes (one hot key) such an update never finished.
//!
//! # Shape: RACE hashing, replicated on every node
//!
//! The index area of every memory node holds `index_buckets` buckets of 64 bytes
//! (FUSEE §4.2, RACE hashing): a key hashes to two candidate buckets ([`hash`]) and
//! lives in a slot of one of them. Slots are 8-byte words `tag | used | fingerprint
//! | register` ([`word`]); a fingerprint match is only a candidate, told apart by the
//! register's key header (`crate::layout::NodeLayout::key_header`, `header.rs`). The
//! first word of each bucket is not a slot but the bucket's **meta word**, so a bucket
//! has [`word::SLOTS`] = 7 slots.
//!
//! # Why not SNAPSHOT as it is
//!
//! FUSEE replicates RACE with SNAPSHOT (FUSEE §4.3): writers CAS the backups, a winner
//! is picked by unanimity, majority or smallest value, and the winner CASes the
//! primary, which readers read. Rules 1 and 3 need an answer from *every* backup, and
//! everything else (a crashed primary, no decidable winner, a last writer that
//! crashed before updating the primary) goes to a fault-tolerant master (FUSEE §5.2,
//! §5.3). Without a master, any client must be able to finish any half-done update
//! with a majority of nodes: that is consensus, and the classic way to get it from
//! passive memory is Paxos with one acceptor per memory node whose state is a word
//! updated by CAS (as in disk Paxos and RDMA consensus). So each bucket runs the
//! single-decree Paxos of Lamport's "Paxos made simple", change after change:
//!
//! * the **meta word** of a bucket on node *i* is acceptor *i*: `promised` ballot,
//!   `accepted` ballot and value. A value (a [`word::Proposal`]) is one *change*:
//!   `SET slot := register` (insert, replace), `CLEAR slot` (remove, tagged with a
//!   nonce naming the remove call), or a no-op;
//! * **phase 1** (promise): CAS `promised` to a new ballot `b` on every node, reading
//!   the bucket back in the same ordered batch. A proposer *owns* `b` once a quorum
//!   of its CASes took (each node moves to `b` once, so one proposer at most); the
//!   CAS returns the acceptor state, and the quorum's newest accepted value is what
//!   Paxos obliges it to propose if there is one;
//! * **phase 2** (accept): CAS `(promised, accepted) := (b, b, value)` on every node
//!   that has not promised a newer ballot. A quorum of successes decides the value;
//! * **apply** (`apply.rs`): a decided change is written into its slot, tagged with
//!   its ballot, by a CAS that only moves tags forward: idempotent, so the proposer,
//!   helpers and late duplicates may all do it (rTX's idempotent CAS commit, rTX
//!   §4.3). Only decided changes are applied, so *every slot word is a decided value*.
//!
//! Ballots are per bucket, 16-bit with serial-number comparison ([`word::Ballot`]):
//! they never run out.
//!
//! **Eras.** The meta word holds one change at a time. A proposer may replace the
//! newest accepted change by its own only once that change is *done*: applied on a
//! quorum of slot copies, where its effect is durable without the meta word.
//! Otherwise it must first finish it (propose it under its own ballot, which Paxos
//! demands anyway, then apply it). That is how the half-done update of a crashed or
//! stalled client is repaired: by whoever touches the bucket next (rTX's repair by
//! the next client, rTX §4.3; FUSEE's master job, §5.2-5.3, without a master). A no-op
//! is only accepted when the newest accepted value is done or absent, so it never
//! displaces a change that may be decided.
//!
//! # Reads
//!
//! A lookup reads both candidate buckets from a preferred majority (one batch per
//! node, one roundtrip) and merges the copies (`bucket::View`): per slot, the copy
//! with the newest tag (each is a decided value, and each change was applied on a
//! quorum before the next could be proposed, so a quorum read sees every change done
//! before it began); plus the newest accepted change, *if provably decided*:
//! accepted under one classic ballot by a quorum of the replies, or applied in some
//! copy (a fast-round value never counts as proven: see "fast inserts").
//! If the newest accepted change is only accepted somewhere (an update is in flight),
//! the bucket is *open*: the lookup re-reads a couple of times, then settles it with
//! a Paxos round of its own (promise, propose the newest accepted value, apply), and
//! reads again. No node plays a primary, so a crashed node 0 changes nothing.
//!
//! # Two buckets (insert)
//!
//! An insert must check that the key is in neither candidate bucket and write one of
//! them. It promises ballots on both, decides on the state both promise quorums
//! report, then **fences** the bucket it does not modify, `Y`, by having a quorum
//! accept a no-op (or re-accept its done change) under its ballot there, and only
//! then proposes its `SET` in the other, `X`. Two inserts of one key cannot both
//! win: if one (I₂) modifies `Y` while I₁ modifies `X`, then I₂'s phase 1 on `X`
//! either follows I₁'s accept on `X` at a common node (so I₂ sees I₁'s change and
//! reports the key as present), or precedes it, in which case I₁'s accept needs a
//! newer ballot and I₁'s phase 1 on `X` followed I₂'s fence on `X`; symmetrically on
//! `Y`. Chaining the real-time orders (each proposer's phase 1 completes before its
//! phase 2 starts) yields a cycle. Removes and replaces touch one bucket: a register
//! is mapped by one slot and never moves.
//!
//! # Fast inserts
//!
//! The classic insert needs three roundtrips after its read. When the read shows
//! the key's *first* bucket settled, with the same meta word on every node read and
//! no promise beyond its accepted ballot, and the key in neither bucket (no
//! fingerprint match), the insert CASes that word on every node straight to its
//! `SET`, accepted under the next ballot with the word's **fast** flag: phase 1 and
//! phase 2 in one step, a fast round of Fast Paxos whose fast quorum is every node
//! (`fast.rs`). Taken by every node, the change is decided (one roundtrip after the
//! read, which the KV layer overlaps with its register write: two in all); taken by
//! fewer, the classic insert takes over, watching the fast value like any proposal
//! of its own. Readers and proposers judge fast values by one rule
//! (`bucket::newest_accepted`): a fast value counts only if every copy of the
//! quorum holds it (it may then be decided, and is finished like an open change);
//! otherwise it is not decided, and since a fast round only replaces a settled word,
//! nothing older needs finishing either. A fast value is never *proven* decided by
//! copies (a quorum may be all it reached): only an applied slot or a Paxos round
//! settles it, so lookups that race a fast insert re-read or settle as for any open
//! change. Why it needs no fence of the second bucket, and the one ordering a fence
//! would have caught (a classic insert of the same key into the second bucket that
//! already fenced the first): `fast.rs`. The fast round targets only the first
//! bucket, so that two inserts of one key that both try it race on the same words;
//! when the first bucket is fuller than the second and more than half full, the
//! classic insert's choice of the emptier bucket runs instead.
//!
//! # One-roundtrip inserts
//!
//! The fast round's CAS follows a read because it must expect the word each node
//! holds. One word needs no read: that of a bucket where **nothing was ever
//! accepted** and no promise is outstanding, all zeros (a meta word that accepted
//! anything keeps a non-zero kind for ever, `word.rs`; only a promise-only history
//! whose ballots wrapped around could bring one back to zero, and a proposer holding
//! that promise then finds the word changed and fails its accept). A *blind* fast round
//! ([`Index::blind_insert`]) CASes the key's first bucket's meta word on every node
//! from zero to the `SET` of slot 0 accepted under ballot 1 with the fast flag: the
//! exact CAS a read-first fast round sends after reading zeros everywhere, minus the
//! read. The KV layer runs it in the batch that writes the register's key header and
//! value, after them, on every node (SWARM §5.3.1: value and mapping "in parallel"),
//! and hands what each node answered to [`Index::finish_blind`]:
//!
//! * **Taken by every node: decided, and the key was absent.** Every node's word was
//!   still zero when the CAS landed, so nothing was ever accepted in that bucket and
//!   no promise was outstanding on any node: no change of it was ever decided (so the
//!   key is not in it), and no classic insert of the key had promised it, which it must do before
//!   it accepts anything in the key's *second* bucket (so the key is not there
//!   either, and no such insert is between its fence and its accept: the fence would
//!   have changed the word). A classic insert of the key that promises the bucket
//!   later reads the fast value on its whole quorum, finishes it and finds the key,
//!   as for a read-first fast round (`fast.rs`). The slot is applied in the
//!   background: one roundtrip in all.
//! * **Taken by fewer: the insert goes on from a read**, as a read-first insert after
//!   an undecided fast round, watching the blind proposal (sent at the batch's post
//!   time) like any of its own. What the blind CAS left is a fast value on the nodes
//!   whose word was still zero, the same state a read-first fast round leaves when a
//!   racing change lands between its read and its CAS, and it is judged by the same
//!   rule (`bucket::newest_accepted`).
//! * **Why the register must be written first, on the same node.** A reader counts
//!   a fast value only where every copy of its quorum holds it; each of those nodes
//!   ran the register's write before the CAS, in one ordered batch (SWARM §2.1), so
//!   the key header and the value are on that quorum by the time any reader can find
//!   the mapping. The round is decided only by every node, and runs on a node only
//!   in the register's batch there, so the KV layer tries it only when the
//!   register's replicas are all the index's nodes (and not while it suspects a
//!   node).
//! * **How often.** A load phase's insert finds its first bucket never used with
//!   probability about `(m/n)(1 − e^(−n/m))` for `n` inserts into `m` buckets (each
//!   decided blind insert touches one bucket). A bucket that ever changed stays
//!   non-zero, so a key re-inserted after a delete, or whose first bucket another
//!   key used, fails its blind round and goes on from a read: three roundtrips,
//!   where the read-first path alone takes two. The KV client therefore tries blind
//!   rounds only while more than half of its recent ones were decided (its
//!   `blind_policy`), and otherwise one insert in 32.
//!
//! # Knowing one's fate (exactly once)
//!
//! A proposer whose accept was preempted does not know whether a helper decided its
//! change, and must neither report a change that did not happen nor propose it again
//! after it happened (a remove in between would be undone). Its changes are unique
//! while it runs (a register, which no other insert or replace is given meanwhile, or
//! a remove's nonce `client id | counter`; but see "lives of a mapping" below for what
//! others may mistake for them), and it watches them
//! (`watch.rs`) in every quorum observation of the bucket (reads, and the read-backs
//! of its promises): a slot holding one means it took effect; being the newest
//! accepted value means it may be decided, so the next attempt finishes it under its
//! own ballot; a different value accepted by a quorum under a newer ballot, while
//! it is not visible, means it never will be. A newer change in its slot proves
//! nothing about it: the newest accepted value whose slot some copy shows moved on,
//! with no copy holding it and no quorum of classic accepts, is not visible
//! (*superseded unproven*, `bucket.rs`), is applied by nobody, and only the
//! observation windows tell its owner whether it was decided before.
//!
//! Why "not visible" means "not decided": once decided, a change is the newest
//! accepted value of a quorum until it is applied on a quorum, and its owner
//! *acknowledges* it by applying it itself (with the key's fingerprint, or an owner
//! mark for a remove; helpers write fingerprint 0). Proposers wait up to
//! [`IndexConfig::ack_wait_ns`] for that mark before replacing an unacknowledged
//! change, so a decided change stays visible to every quorum read for at least that
//! long. An owner that observed its bucket at least that often cannot miss it; one
//! that went longer without an observation (a stalled client) returns
//! [`IndexError::OutcomeUnknown`] instead of guessing. A crashed owner never marks:
//! the next change of that bucket waits `ack_wait_ns`, once.
//!
//! Knowing is not enough when the answer is "not done": a proposal of ours that is
//! neither decided nor ruled out may still be accepted on some nodes, and a later
//! reader that meets it as the newest accepted value must finish it (Paxos). So an
//! operation that reports its change undone (an insert's `Exists`, a replace's or a
//! remove's `false`) first has a quorum accept, under its own promise, what keeps each
//! bucket where one of its proposals is alive as it is (`update::rule_out_own`).
//!
//! # Lives of a mapping
//!
//! A `SET slot := register` names no life. Registers are recycled (SWARM §5.4, which
//! the paper's implementation left out, §6), so a key may map to the same register
//! again, in the same slot: a later *life* of the mapping, proposed as exactly the
//! same value as the earlier one. FUSEE's SNAPSHOT (FUSEE §4.3) tells conflicting
//! writers apart by the values they write, relying on "the out-of-place modification
//! characteristic of RACE hashing": a slot's new value points to a freshly written
//! object, so no value comes back; with recycled registers it does. The register
//! words answer the stores of an earlier life with words that never repeat
//! (`crate::registers::reset`, after rTX's "fly WRITE", seed `rtx.txt`); here the
//! slot tag plays that part. The changes of a bucket are decided one era after the
//! other, each applied on a quorum before the next is proposed ("eras"), so the
//! earlier life's copies carry tags older than the change that ended it, and the
//! later life's copies tags newer than that. (Not the ballot alone: a done change is
//! accepted again under newer ballots, by every insert that fences its bucket, without
//! becoming another change.) Every judgement that names another client's change
//! tells the lives apart:
//!
//! * **Slot copies** of the same content under a tag older than another copy's
//!   change of that slot are an earlier life, and do not hold the newest accepted
//!   change (`bucket.rs`, "lives of a mapping"); `apply.rs` overwrites them like any
//!   older word. Counting a lagging copy of the earlier life as the later one applied
//!   made a lookup read past a decided `SET` accepted by one copy of its quorum and
//!   report the key absent after its insert had returned (`tests/index_sim.rs`,
//!   `an_earlier_life_on_a_lagging_copy_is_not_the_later_one`). A view that holds no
//!   copy of the change between the lives cannot tell them apart (`bucket.rs`).
//! * **Acknowledgement waits** run per change, named by value and the tag of its
//!   applied copies (`update.rs`, `Owner`): a proposer that waited out the earlier
//!   life's wait must wait again for the later one, which is what keeps the later
//!   one visible to its owner for `ack_wait_ns` ("knowing one's fate"). Taking it for
//!   the earlier one, a remove replaced it at once; its insert, seeing neither its
//!   value nor its slot any more and a newer value accepted by a quorum, took itself
//!   for never decided and proposed its `SET` again: one insert, two lives, and three
//!   removes that returned `true`
//!   (`a_later_life_of_an_unacknowledged_change_is_waited_for_again`).
//! * **Tagged removes** name a life by its bucket and its slot's tag
//!   ([`MappingTag`]): tags are ballots, which count per bucket, so a later life in
//!   the key's other bucket may carry the earlier life's tag.
//!
//! A proposer's *own* watch may compare values alone: while its insert or replace
//! runs, nobody else is given its register, so no other life of its `SET` can be
//! proposed; the earlier life was done (applied on a quorum) before it proposed, so
//! a quorum's newest slot copy never shows the earlier life again.

//! # Why it is linearizable (sketch)
//!
//! 1. *Per era, Paxos safety* ("Paxos made simple", P2c): once a change is decided
//!    under ballot `b`, every value accepted under a newer ballot is that change, until
//!    it is done. No-ops do not break this (they are only proposed over done or absent
//!    values), nor do fast rounds: a fast value is decided only on every node, so a
//!    classic proposer's quorum that does not hold it everywhere may ignore it (Fast
//!    Paxos's recovery rule with every node as the fast quorum), and a fast round
//!    only starts from a settled word; replacing a done change ends the era, and the
//!    change stays in the slots.
//! 2. *Slots*: a slot word tagged `t` holds the change decided under `t`; changes of
//!    a bucket are decided one era after the other with growing ballots, each applied
//!    on a quorum before the next is proposed. So the newest-tag copy of a slot among
//!    a quorum read is the last change of that slot done before the read began, or a
//!    later decided one.
//! 3. *Linearization points*: an update at the instant its change is decided (a
//!    quorum accepted it); an insert that finds the key, and a remove or replace that
//!    finds no mapping, at their phase 1 (which reported the state they acted on); a
//!    lookup at a point between its start and the instant it read the newest change
//!    it reports (it reports no undecided change, and every change done before it
//!    began). A key occupies at most one slot at a time (two buckets, above), so
//!    per-slot linearizability gives per-key linearizability; a lookup that races a
//!    remove and re-insert of the same key may see both slots and lists the newer
//!    first ([`Candidates`]).
//! 4. *No loss*: a decided change is never undone (1, 2), and an update returns
//!    success only once its change is decided.
//!
//! # Costs (roundtrips)
//!
//! | operation | common case | in flight / failures |
//! |---|---|---|
//! | `lookup` | 1 | +1 if a preferred node is slow or dead; a couple of re-reads, then 2-3 to settle a change left open |
//! | `resolve` | 1 (no candidate) or 2 | as lookup |
//! | `insert` | 2: read, fast round (the KV layer overlaps the read with its register write: [`Index::read_for_insert`]); 4 when the fast round is not tried or not decided: read, promise both, fence, accept | +1 to check a fingerprint match; +1-3 per change helped along; under contention, a backoff and a re-read of the buckets before each new attempt |
//! | `remove`, `replace` | 3: read, promise + key header, accept | as insert |
//!
//! Slot writes after a decision are posted in the background and cost no roundtrip
//! (unless the accept met a newer promise: a helper may be applying the change too,
//! and the owner waits for its mark to land, +1). Updates broadcast every CAS phase
//! and wait for a quorum, so a crashed or slow memory node costs them nothing; reads
//! pay one escalation when it is in their preferred majority. A client that crashes
//! mid-update leaves a change that the next client touching the bucket finishes (2-3
//! roundtrips), and, if the change was decided, delays the next change of that bucket
//! by `ack_wait_ns`, once. Measured on the simulated fabric (3 nodes, ~1 µs one way,
//! `tests/index_sim.rs`): with 200 keys and no faults, 95% of resolves take one
//! roundtrip and read-first inserts take 2 (4 without the fast round, p99 5; a blind
//! fast round takes 1, `common_case_roundtrips_on_the_simulated_fabric`); with 5 clients
//! hammering 3 keys, updates take
//! 3-4 roundtrips at the median and up to ~15 when preempted, plus backoff.
//!
//! # Limits
//!
//! * Register ids below 2^27 ([`word::MAX_REGISTERS`]), checked by [`Index::new`].
//! * Ballots and slot tags are 16-bit serial numbers. Updates rewrite slots whose tag
//!   fell 2^13 ballots behind (`apply.rs`), so that untouched slots keep comparing as
//!   older than new ballots while the bucket's ballots wrap around. A memory node that
//!   comes back (a healed partition) after missing 2^15 ballots of a bucket may have
//!   a copy that looks newer than it is. A scrub ([`Index::scrub`], `swarm scrub
//!   --every`) moves a lagging node's slot copies forward before they fall that far
//!   behind. A node that fell behind anyway must not be wiped and reused (a wiped
//!   node that served would form quorums with a lagging node and hide a completed
//!   insert): it is *repaired* (`swarm repair --replace`, [`crate::repair`]), which
//!   retires its memory, rebuilds it from the other nodes and admits it with a
//!   configuration change.
//! * Inserts take one roundtrip only into a never-used first bucket (see
//!   "one-roundtrip inserts"); otherwise two in the common case, since the fast
//!   round's CAS must expect the word a node holds, so it follows a read. A cached
//!   word from an earlier read would not do: a classic insert may have fenced the
//!   bucket since, which only a fresh read of the second bucket shows (`fast.rs`).
//!   An earlier fast path CAS'd *both* candidate buckets (the `SET` and a fence)
//!   and was withdrawn: a node may take one of the two CASes and not the other, so
//!   the `SET` could reach every node while its fence failed, and a concurrent
//!   insert of the same key into the other bucket won too (found by a 3,000-seed run
//!   of `tests/index_sim.rs`). Fast rounds touch the first bucket only.
//! * Liveness is obstruction-freedom: proposers that keep preempting each other back
//!   off (randomised, exponential); [`IndexConfig::max_attempts`] bounds the retries.
//!   A lookup that races an update may settle the update's change itself, which
//!   preempts the updater (it then finds its change decided): correct, a bit slower.
//! * A roundtrip waits for a quorum of the nodes it posted to; a batch lost to a node
//!   that was down never completes, so a node coming back does not count for
//!   roundtrips already in flight (as in `swarm_core`). Such a wait ends at the
//!   operation's fence (`Roundtrip::wait` fails with `Fenced`), and the caller treats
//!   the update's outcome as unknown (an insert's register is then not recycled).
//! * Key headers: the KV layer must write a register's header to a majority of its
//!   replicas (the index reads them there, `Index::header_holders`) before
//!   indexing it and not change it while it is indexed. A recycled register's header
//!   is blanked on every replica before reuse (`crate::registers::recycle`), so an old header
//!   never competes with the new one. The `u32` after the length is the holder tag
//!   (`crate::registers::limbo`), set by the retiree after the register is unmapped; `header.rs`
//!   ignores it.

mod apply;
pub(crate) mod bucket;
mod config;
mod engine;
mod error;
mod fast;
pub mod hash;
mod header;
mod lookup;
mod schedule;
mod scrub;
mod update;
mod watch;
pub mod word;

pub use fast::BlindInsert;
pub use scrub::ScrubReport;
pub use update::InsertRead;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use swarm_core::MAX_REPLICAS;
use swarm_core::encoding::MAX_WRITERS;
use swarm_core::fabric::{Nanos, NodeId, OpOutput};
use swarm_core::{Fabric, OpStats, ProtocolConfig, RegisterLoc, Suspicion};

pub use bucket::BucketError;
pub use config::IndexConfig;
pub use error::{HeaderProblem, IndexError};
pub use header::HEADER_REREADS;
pub use word::{MAX_REGISTERS, SLOTS};

use crate::layout::NodeLayout;
use hash::{HashedKey, KeyHash};

/// A register slot number in the register area (`NodeLayout::register`).
pub type RegisterId = u64;

/// Registers whose fingerprint matches a key, newest mapping first. The caller tells
/// them apart by the key stored with the value (or with [`Index::resolve`]). More
/// than one candidate holds the key only while a remove and re-insert of that key
/// race the lookup; the first is then the newer mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates {
    /// Candidate registers, newest first.
    pub registers: Vec<RegisterId>,
    /// The tag of each candidate's slot (same order as `registers`), which tells one
    /// life of a mapping `key → register` from a later one (see
    /// [`Index::remove_tagged_until`]).
    pub tags: Vec<MappingTag>,
}

/// What names one life of a mapping `key → register`: the bucket of its slot and the
/// ballot of the change that mapped it there (the slot's tag). Ballots count per
/// bucket, so a later life in the key's other bucket may carry the same ballot: the
/// bucket tells them apart (`tests/index_sim.rs`, seed 281 of
/// `updates_with_unknown_outcomes_withdrawn_never_map_later`: a late tagged remove
/// unmapped the later life).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MappingTag {
    /// The bucket number of the slot.
    pub bucket: u64,
    /// The slot's tag: the ballot of the change that mapped the register there.
    pub ballot: word::Ballot,
}

/// What an insert found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The key now maps to the given register.
    Inserted,
    /// The key already mapped to this register; nothing changed.
    Exists(RegisterId),
}

/// What [`Index::withdraw_until_hashed`] left of an earlier insert or replace of a
/// register whose call could not tell whether it took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// The key maps to the register: one of those proposals took effect.
    Mapped,
    /// No slot of the key's buckets maps the register, and no proposal made before
    /// the call can map it any more. Whether one did and was undone since (a delete
    /// unmapped it) the index cannot tell: the register's content can.
    Withdrawn,
}

/// A handle on the index: geometry, node count and tunables. Cheap to clone; each
/// client thread uses its own (its [`IndexConfig::client_id`] names its removes).
#[derive(Clone, Debug)]
pub struct Index {
    pub(crate) layout: NodeLayout,
    /// The nodes holding the index: `0..nodes`, the metadata group
    /// (`NodeLayout::metadata_nodes`; every node without one).
    pub(crate) nodes: usize,
    /// The cluster's memory nodes (registers are placed over all of them).
    pub(crate) cluster_nodes: usize,
    pub(crate) config: IndexConfig,
    nonces: Arc<AtomicU32>,
    /// The nodes this client suspects: lookups and key-header reads order them last
    /// and suspect the ones that miss `slow_after_ns` (SWARM §6), sharing the table of
    /// the client's register protocol ([`Index::with_suspicion`]).
    suspicion: Arc<Suspicion>,
    /// Where registers live (their key headers with them): the placement table the
    /// client follows ([`Index::with_placements`]; computed places by default).
    placements: crate::placement::SharedPlacements,
}

impl Index {
    /// The index of a cluster of `nodes` memory nodes laid out by `layout` (the
    /// index is replicated on all of them, or on its metadata group,
    /// `NodeLayout::metadata_nodes`).
    pub fn new(layout: &NodeLayout, nodes: usize, config: IndexConfig) -> Result<Self, IndexError> {
        let params = &layout.params;
        let cluster_nodes = nodes;
        let nodes = layout.metadata_nodes(nodes);
        if nodes == 0 || nodes > MAX_REPLICAS {
            return Err(IndexError::Config(format!(
                "{nodes} memory nodes: the index needs 1 to {MAX_REPLICAS}"
            )));
        }
        if layout.register_ids() > MAX_REGISTERS {
            return Err(IndexError::Config(format!(
                "{} registers: slots hold register ids below {MAX_REGISTERS}; use fewer, larger registers",
                layout.register_ids()
            )));
        }
        if params.index_buckets == 0 || !params.index_buckets.is_power_of_two() {
            return Err(IndexError::Config(format!(
                "{} index buckets: must be a power of two",
                params.index_buckets
            )));
        }
        let gap = config
            .max_backoff_ns
            .saturating_add(config.slow_after_ns)
            .saturating_mul(2);
        if config.ack_wait_ns < gap {
            return Err(IndexError::Config(format!(
                "ack_wait_ns ({}) must be at least twice max_backoff_ns + slow_after_ns ({gap}): \
                 an update observes its buckets about that often and must not lose track of \
                 its own changes",
                config.ack_wait_ns
            )));
        }
        if config.client_id >= MAX_WRITERS {
            return Err(IndexError::Config(format!(
                "client id {}: must be below {MAX_WRITERS} (use the writer id)",
                config.client_id
            )));
        }
        Ok(Self {
            layout: *layout,
            nodes,
            cluster_nodes,
            config,
            nonces: Arc::new(AtomicU32::new(0)),
            suspicion: Arc::new(Suspicion::new(ProtocolConfig::default().suspect_ns)),
            placements: Default::default(),
        })
    }

    /// Shares `placements` (the client's followed table): key headers are read
    /// where a register's record puts it.
    pub(crate) fn with_placements(
        mut self,
        placements: crate::placement::SharedPlacements,
    ) -> Self {
        self.placements = placements;
        self
    }

    /// Shares `suspicion` (a register client's, [`swarm_core::Client::suspicion`]): a
    /// node either path found late is ordered last by both.
    pub fn with_suspicion(mut self, suspicion: Arc<Suspicion>) -> Self {
        self.suspicion = suspicion;
        self
    }

    /// The nodes to read from, `start`'s rotation with suspected nodes last.
    pub(crate) fn order<F: Fabric + ?Sized>(&self, fabric: &F, start: u64) -> Vec<NodeId> {
        let mut order = schedule::rotation(self.nodes, start);
        if self.suspicion.any() {
            self.suspicion.trusted_first(&mut order, fabric.now());
        }
        order
    }

    /// Where `register`'s key header lives, in the order to read it, and how many of
    /// those copies make a majority: the register's replicas
    /// (`crate::placement::Placements::loc`), which are every node of the index when
    /// registers are replicated on all of them (then in `register`'s rotation, as
    /// [`Index::order`]); suspected nodes last. With the register's location: the
    /// header sits before its offset on each replica (`NodeLayout::header_on`).
    pub(crate) fn header_holders<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        register: RegisterId,
    ) -> Result<(Vec<NodeId>, usize, RegisterLoc), IndexError> {
        let loc = self
            .placements
            .loc(&self.layout, self.cluster_nodes, register)
            .map_err(|_| IndexError::NoSuchRegister {
                register,
                registers: self.layout.register_ids(),
            })?;
        // Registers replicated on every node of the index (a recorded chunk may
        // have moved a replica to an added node: not then).
        if usize::from(self.layout.params.replicas) >= self.cluster_nodes
            && loc.replicas.nodes().iter().all(|n| n.index() < self.nodes)
        {
            return Ok((self.order(fabric, register), self.quorum(), loc));
        }
        let mut order = loc.replicas.nodes().to_vec();
        if self.suspicion.any() {
            self.suspicion.trusted_first(&mut order, fabric.now());
        }
        let quorum = loc.replicas.quorum();
        Ok((order, quorum, loc))
    }

    /// Suspects `node`, which missed `slow_after_ns` in a preferred step.
    pub(crate) fn late<F: Fabric + ?Sized>(&self, fabric: &F, node: NodeId) {
        if self.suspicion.suspect(node, fabric.now()) {
            tracing::info!(
                node = node.index(),
                suspect_ns = self.suspicion.suspect_ns(),
                "index: memory node did not answer within slow_after_ns: suspected, read from the others first"
            );
        }
    }

    /// The cluster layout.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// Memory nodes holding the index.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The tunables.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// A majority of the nodes.
    pub fn quorum(&self) -> usize {
        swarm_core::quorum::majority(self.nodes)
    }

    /// The candidate buckets and fingerprint of `key`, after checking its length.
    pub fn key_hash(&self, key: &[u8]) -> Result<KeyHash, IndexError> {
        self.hash(key)
    }

    pub(crate) fn hash(&self, key: &[u8]) -> Result<KeyHash, IndexError> {
        self.hash_key(key).map(|key| key.hash())
    }

    /// `key` with its candidate buckets and fingerprint, after checking its length:
    /// hashed once for the `..._hashed` calls of one operation.
    pub fn hash_key<'k>(&self, key: &'k [u8]) -> Result<HashedKey<'k>, IndexError> {
        if key.is_empty() {
            return Err(IndexError::EmptyKey);
        }
        if key.len() > self.layout.params.key_max as usize {
            return Err(IndexError::KeyTooLong {
                len: key.len(),
                max: self.layout.params.key_max,
            });
        }
        Ok(HashedKey::new(key, self.layout.params.index_buckets))
    }

    pub(crate) fn check_register(&self, register: RegisterId) -> Result<(), IndexError> {
        if register >= self.layout.register_ids() {
            return Err(IndexError::NoSuchRegister {
                register,
                registers: self.layout.register_ids(),
            });
        }
        Ok(())
    }

    /// A nonce naming one remove call: `client id << 16 | counter` (11 + 16 bits,
    /// within the 27-bit value field), counter `1..=65_535`, so never 0 ("never
    /// cleared").
    ///
    /// # What uniqueness is needed, and why this gives it
    ///
    /// A nonce is only ever compared inside one remove call: the call watches its
    /// proposal `CLEAR slot, nonce` (`watch.rs`) in the meta words and slots it
    /// observes, and takes a match as "my remove took effect", which makes it return
    /// `true`, and the register recycler's ownership hangs on that (`crate::registers::recycle`:
    /// exactly one remover of a mapping owns the register). Two calls with equal
    /// proposals would both return `true` if one of them is decided: so nonces must
    /// differ between removes **of the same mapping (same bucket slot) that run at the
    /// same time**. A proposal from an earlier era cannot be mistaken either: once a
    /// slot moved on (a later change was decided over it) its old values never come
    /// back as the newest accepted value or the newest slot copy.
    ///
    /// * One client: the counter repeats after 65 535 calls; far fewer are ever in
    ///   flight at once.
    /// * Two clients: their client ids (writer ids) differ.
    /// * Two incarnations of one writer id: the later one gets the id only after the
    ///   earlier one closed (no operation in flight) or its lease expired (contract
    ///   3), and every operation of the earlier one posts no CAS after its deadline
    ///   ([`Index::remove_until`]) and fails rather than returning `true` then. So a
    ///   remove of the later incarnation overlaps no remove of the earlier one that
    ///   can still decide something; if it meets an accepted-but-undecided `CLEAR`
    ///   left by it with the same nonce (the same mapping, since it is still mapped),
    ///   finishing that proposal is exactly what its own remove would do, and nobody
    ///   else returns `true` for it.
    ///
    /// So the counter need not survive writer-id reuse; what must is the deadline.
    pub(crate) fn next_nonce(&self) -> u32 {
        const { assert!((MAX_WRITERS as u64) << 16 <= word::MAX_REGISTERS) };
        let counter = self.nonces.fetch_add(1, Ordering::Relaxed) % 0xFFFF + 1;
        u32::from(self.config.client_id) << 16 | counter
    }

    fn check_fabric<F: Fabric>(&self, fabric: &F) -> Result<(), IndexError> {
        // A node added since the index was built only adds slots past these.
        if fabric.node_count() < self.cluster_nodes {
            return Err(IndexError::NodeCount {
                fabric: fabric.node_count(),
                index: self.cluster_nodes,
            });
        }
        Ok(())
    }

    /// The registers `key` may map to (fingerprint matches), newest first. One
    /// roundtrip in the common case.
    pub async fn lookup<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
    ) -> Result<Candidates, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.lookup_hashed(fabric, stats, &key).await
    }

    /// [`Index::lookup`] of a key hashed already ([`Index::hash_key`]).
    pub async fn lookup_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &HashedKey<'_>,
    ) -> Result<Candidates, IndexError> {
        self.check_fabric(fabric)?;
        lookup::lookup(self, fabric, stats, key).await
    }

    /// The register `key` maps to, if any: a lookup, then the candidates' key headers
    /// (one more roundtrip when there are candidates).
    pub async fn resolve<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
    ) -> Result<Option<RegisterId>, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.resolve_hashed(fabric, stats, &key).await
    }

    /// [`Index::resolve`] of a key hashed already ([`Index::hash_key`]).
    pub async fn resolve_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &HashedKey<'_>,
    ) -> Result<Option<RegisterId>, IndexError> {
        self.check_fabric(fabric)?;
        lookup::resolve(self, fabric, stats, key).await
    }

    /// Maps `key` to `register` if the key is absent; otherwise reports the register
    /// it maps to. The key header of `register` must already hold `key` on a majority
    /// of nodes. `register` must not be passed to another concurrent insert or
    /// replace.
    pub async fn insert<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        register: RegisterId,
    ) -> Result<InsertOutcome, IndexError> {
        self.insert_until(fabric, stats, key, register, Nanos::MAX)
            .await
    }

    /// [`Index::insert`], posting no CAS after `deadline` on the fabric's clock
    /// ([`IndexError::Fenced`]; the insert may or may not have taken effect).
    pub async fn insert_until<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<InsertOutcome, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.insert_until_hashed(fabric, stats, key, register, deadline)
            .await
    }

    /// [`Index::insert_until`] of a key hashed already ([`Index::hash_key`]).
    pub async fn insert_until_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: HashedKey<'_>,
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<InsertOutcome, IndexError> {
        self.check_fabric(fabric)?;
        update::insert(self, fabric, stats, key, register, deadline).await
    }

    /// Ends, for good, an insert or replace of `key` → `register` whose call could not
    /// tell whether it took effect ([`IndexError::OutcomeUnknown`], or
    /// [`IndexError::Contention`] after its accepts): its proposals may still be
    /// accepted on some nodes, where a later reader would finish them, unwatched by
    /// anyone. This call promises both of the key's buckets, finishes whatever change
    /// is in flight, and then either finds the key mapping `register`
    /// ([`Withdrawal::Mapped`]) or has a quorum of each bucket accept a newer value
    /// (the no-op, or the bucket's unacknowledged change again), after which none of
    /// those proposals can take effect ([`Withdrawal::Withdrawn`]). The caller then
    /// judges by the register's content whether one took effect and was undone before
    /// (docs/pauses.md, H10). No CAS after `deadline`.
    pub async fn withdraw_until_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: HashedKey<'_>,
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<Withdrawal, IndexError> {
        self.check_fabric(fabric)?;
        update::withdraw(self, fabric, stats, key, register, deadline).await
    }

    /// The first roundtrip of [`Index::insert_until`] (reading the key's candidate
    /// buckets), for a caller that runs it alongside other work: the KV layer reads
    /// while it writes the register's value and key header (SWARM §5.3.1), then
    /// calls [`InsertRead::finish`] once the header is on a majority. `stats` counts
    /// this roundtrip (a branch of the operation's, [`OpStats::branch`]).
    pub async fn read_for_insert<'a, F: Fabric>(
        &'a self,
        fabric: &'a F,
        stats: &'a OpStats,
        key: &'a [u8],
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<InsertRead<'a, F>, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.read_for_insert_hashed(fabric, stats, key, register, deadline)
            .await
    }

    /// [`Index::read_for_insert`] of a key hashed already ([`Index::hash_key`]).
    pub async fn read_for_insert_hashed<'a, F: Fabric>(
        &'a self,
        fabric: &'a F,
        stats: &'a OpStats,
        key: HashedKey<'a>,
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<InsertRead<'a, F>, IndexError> {
        self.check_fabric(fabric)?;
        update::read_for_insert(self, fabric, stats, key, register, deadline).await
    }

    /// The blind fast round of a one-roundtrip insert of `key` → `register` (module
    /// docs, "one-roundtrip inserts"): a CAS ([`BlindInsert::op`]) the caller runs on
    /// every node, in the batch that writes the register's value and key header there
    /// and after that write, then hands to [`Index::finish_blind`].
    pub fn blind_insert(
        &self,
        key: &[u8],
        register: RegisterId,
    ) -> Result<BlindInsert, IndexError> {
        self.blind_insert_hashed(&self.hash_key(key)?, register)
    }

    /// [`Index::blind_insert`] of a key hashed already ([`Index::hash_key`]).
    pub fn blind_insert_hashed(
        &self,
        key: &HashedKey<'_>,
        register: RegisterId,
    ) -> Result<BlindInsert, IndexError> {
        update::blind_insert(self, key, register)
    }

    /// Whether a blind fast round whose CAS answered `took` on the nodes that
    /// answered is decided: every node of the index took it.
    pub fn blind_decided(&self, took: &[(NodeId, OpOutput)]) -> bool {
        fast::blind_taken(took) >= self.nodes
    }

    /// Ends the insert of `key` whose blind fast round `blind` (from
    /// [`Index::blind_insert`] of the same key) was sent at `sent` and answered
    /// `took` on the nodes that answered: what each one's CAS returned, as
    /// [`swarm_core::Client::write_fresh_carrying`] reports it. Decided when every
    /// node took it (the mapping is then applied in the background, no roundtrip);
    /// otherwise the insert goes on as [`Index::insert_until`] after its read, and
    /// learns whatever became of the blind round. The register's value and key
    /// header must be on a majority (the batches that carried the CAS wrote them).
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_blind<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        deadline: Nanos,
        blind: BlindInsert,
        sent: Nanos,
        took: &[(NodeId, OpOutput)],
    ) -> Result<InsertOutcome, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.finish_blind_hashed(fabric, stats, key, deadline, blind, sent, took)
            .await
    }

    /// [`Index::finish_blind`] of a key hashed already ([`Index::hash_key`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn finish_blind_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: HashedKey<'_>,
        deadline: Nanos,
        blind: BlindInsert,
        sent: Nanos,
        took: &[(NodeId, OpOutput)],
    ) -> Result<InsertOutcome, IndexError> {
        self.check_fabric(fabric)?;
        update::finish_blind(self, fabric, stats, key, deadline, blind, sent, took).await
    }

    /// Unmaps `key` if it maps to `register`; `Ok(false)` if it did not. Of several
    /// concurrent removes of one mapping, exactly one returns `true`; calling it again
    /// after it returned is harmless.
    pub async fn remove<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        register: RegisterId,
    ) -> Result<bool, IndexError> {
        self.remove_until(fabric, stats, key, register, Nanos::MAX)
            .await
    }

    /// [`Index::remove`], posting no CAS after `deadline` on the fabric's clock
    /// ([`IndexError::Fenced`]; the remove may or may not have taken effect, and
    /// returned `true` to nobody if it did).
    pub async fn remove_until<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.remove_until_hashed(fabric, stats, &key, register, deadline)
            .await
    }

    /// [`Index::remove_until`] of a key hashed already ([`Index::hash_key`]).
    pub async fn remove_until_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &HashedKey<'_>,
        register: RegisterId,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        self.check_fabric(fabric)?;
        let change = update::Change {
            old: register,
            new: None,
            tag: None,
        };
        update::change(self, fabric, stats, key, change, deadline).await
    }

    /// [`Index::remove_until`], but only of the mapping whose slot still carries
    /// `tag` (from [`Candidates::tags`]): `Ok(false)` if `key → register` was
    /// unmapped and mapped again since that lookup, so that a remove decided on an
    /// earlier life of the mapping never unmaps a later one, however late it runs.
    /// A slot whose tag an update refreshed meanwhile (it fell 2^13 ballots behind,
    /// the module docs' "Limits") is not removed either: a remove that could have been, left
    /// to a later unmap or re-insert, never one that should not. (Tags are 16-bit
    /// ballots: a later life in the same bucket carries the same tag only after 65,536
    /// changes of the bucket between the lookup and the remove.)
    pub async fn remove_tagged_until<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        register: RegisterId,
        tag: MappingTag,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        let key = self.hash_key(key)?;
        self.remove_tagged_until_hashed(fabric, stats, &key, register, tag, deadline)
            .await
    }

    /// [`Index::remove_tagged_until`] of a key hashed once by its operation.
    pub async fn remove_tagged_until_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &HashedKey<'_>,
        register: RegisterId,
        tag: MappingTag,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        self.check_fabric(fabric)?;
        let change = update::Change {
            old: register,
            new: None,
            tag: Some(tag),
        };
        update::change(self, fabric, stats, key, change, deadline).await
    }

    /// Replaces the mapping `key → old` by `key → new` in place (SWARM §5.3.1:
    /// re-inserting over a deleted key); `Ok(false)` if `key` no longer maps to `old`.
    /// `new`'s key header must already hold `key`.
    pub async fn replace<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        old: RegisterId,
        new: RegisterId,
    ) -> Result<bool, IndexError> {
        self.replace_until(fabric, stats, key, old, new, Nanos::MAX)
            .await
    }

    /// [`Index::replace`], posting no CAS after `deadline` on the fabric's clock
    /// ([`IndexError::Fenced`]; the replace may or may not have taken effect).
    pub async fn replace_until<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &[u8],
        old: RegisterId,
        new: RegisterId,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        self.check_fabric(fabric)?;
        let key = self.hash_key(key)?;
        self.replace_until_hashed(fabric, stats, &key, old, new, deadline)
            .await
    }

    /// [`Index::replace_until`] of a key hashed already ([`Index::hash_key`]).
    pub async fn replace_until_hashed<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        key: &HashedKey<'_>,
        old: RegisterId,
        new: RegisterId,
        deadline: Nanos,
    ) -> Result<bool, IndexError> {
        self.check_fabric(fabric)?;
        let change = update::Change {
            old,
            new: Some(new),
            tag: None,
        };
        update::change(self, fabric, stats, key, change, deadline).await
    }

    /// Number of mapped slots, as lookups read them: every bucket's copies on the
    /// nodes that answer (a quorum at least) merged, a decided change not applied yet
    /// included. Reads the whole index area of every node, 256 KiB of each per
    /// roundtrip. Changes in flight meanwhile may or may not be counted.
    pub async fn count<F: Fabric>(&self, fabric: &F, stats: &OpStats) -> Result<u64, IndexError> {
        self.check_fabric(fabric)?;
        lookup::count(self, fabric, stats).await
    }
}

/// An index over three nodes of a tiny cluster (64 registers, 4 buckets), for unit
/// tests of the protocol's pieces.
#[cfg(test)]
pub(crate) fn tiny_test_index(config: IndexConfig) -> Index {
    let params = crate::layout::ClusterParams {
        registers: 64,
        chunk_registers: 16,
        index_buckets: 4,
        log_slots: 16,
        writers: 4,
        ..crate::layout::ClusterParams::default()
    };
    let layout = crate::layout::NodeLayout::new(params).expect("a valid tiny layout");
    Index::new(&layout, 3, config).expect("a valid tiny index")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ClusterParams;

    #[test]
    fn nonces_fit_their_field_are_never_zero_and_name_their_client() {
        let layout = NodeLayout::new(ClusterParams::default()).unwrap();
        let ix = |client_id| {
            Index::new(
                &layout,
                3,
                IndexConfig {
                    client_id,
                    ..IndexConfig::default()
                },
            )
            .unwrap()
        };
        let (first, last) = (ix(0), ix(MAX_WRITERS - 1));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..0xFFFF {
            let (a, b) = (first.next_nonce(), last.next_nonce());
            assert!(a != 0 && u64::from(b) < word::MAX_REGISTERS);
            assert_eq!(b >> 16, u32::from(MAX_WRITERS - 1));
            assert!(
                seen.insert(a) && seen.insert(b),
                "repeated within 65 535 calls"
            );
        }
        // Then the counter wraps around (module docs: only overlapping removes of
        // one mapping need distinct nonces).
        assert!(seen.contains(&first.next_nonce()));
    }
}
