//! Reclaiming the registers that gone clients held: their limbos and pools (SWARM §5.4).
//! (Not their writer ids: [`crate::membership::writer_takeover`]; nor log slots:
//! `swarm_core::slot_recycling`.)
//!
//! A client that retires a register ([`crate::registers::recycle`]) keeps it in an in-memory
//! *limbo* for the register grace, then resets it and keeps it in an in-memory *pool*.
//! Both die with the client. Without a trace in memory, a dead client's limbo register
//! (unmapped, but still holding its key header) cannot be told from live data or from a
//! live client's limbo, so it leaked forever: one register per one-shot `swarm delete`.
//! This module leaves that trace and acts on it.
//!
//! # The holder tag
//!
//! The key header's second 32-bit field (bytes 4..8, reserved until now: the index
//! ignores it, `crate::index::header`) is the register's **holder tag**: 0, or the tag
//! of the client incarnation that holds the register outside the index
//! ([`holder_tag`]: the writer id in the low 11 bits, 20 bits of a hash of the
//! incarnation token, bit 31 set). Together with the key length it forms word 0 of the
//! header, one aligned 8-byte word, so it is written by CAS and read untorn. A header
//! copy is in one of four states:
//!
//! | word 0 | meaning |
//! |---|---|
//! | `(0, 0)` | never used (or reset by a build older than this module) |
//! | `(len, 0)` | holds a key: indexed, or being published, or retired with its mark missing |
//! | `(len, t)` | **retired** (unmapped or never published) and held by `t`: in `t`'s limbo |
//! | `(0, t)` | reset (or taken while blank) and held by `t`: in `t`'s limbo or pool |
//! | `(0, d)` | reset and given up by a client whose pool held enough, or given back at its close: donated, free for any reclaimer ([`donated_tag`]: one word per donation) |
//!
//! Who writes a tag, and when:
//!
//! * **the retiree**, right after it retires a register (its index remove returned
//!   `true`, or its insert definitely did not publish the fresh register): a CAS
//!   `(len, 0) → (len, tag)` on every replica, posted in the background of the
//!   operation and before its deadline ([`crate::registers::recycle::Recycler::mark`]). So a tag
//!   `(len, t)` on any copy proves that the register's current life ended: it is not
//!   mapped and never will be again until it is reset (the index's "knowing one's
//!   fate" property, `crate::index`, which the grace-then-reset recycling relies on too);
//! * **the reset** ([`crate::registers::reset`]) CASes word 0 to `(0, tag)` of the resetter on
//!   every replica: the register is in the resetter's pool; or `(0, donated_tag(M))`
//!   when the resetter's pool holds enough (a *donation*, `crate::registers::recycle`): the
//!   resetter gives the register up for good, before the reset is posted;
//! * **a reclaimer** that takes the register ([`take`]): a CAS from the word it observed
//!   to `(observed len, its tag)` on each replica.
//!
//! An insert overwrites the header with `(len, 0)` and the key only in a register of its
//! own pool, i.e. after a reset that reached every replica. Every tag of a life is
//! therefore written after that life's retirement or reset, and a reset wipes every
//! tag, so a tag is never a stale leftover of an earlier life.
//!
//! # Liveness: the same rule as chunk adoption
//!
//! A tag is *gone* when no copy of the client table read on a majority holds a
//! registered token whose tag it is ([`Registered`]; the rule of [`crate::registers::orphans`]).
//! The comparison is on 32 bits: two tokens with equal tags make a gone client's tag
//! look alive (a leak, never a theft), while a live client's tag is always found, since
//! it registered on a majority before it wrote any tag. The table is read **after** the
//! headers whose tags it judges, so a tag written by a client that registered during
//! the scan is judged alive too.
//!
//! # Late batches of the dead: the settle wait
//!
//! A closing client gives its row back without waiting for its last batches (a mark, a
//! reset) to land, and a taken-over zombie's batches land within the grace of the end
//! of its lease ([`crate::membership::lease`]). A reclaimer therefore reads the client table first,
//! waits [`settle_ns`] (the delivery margin plus drift), and only then reads headers: a
//! client absent from that first table posted everything before the read, so all of it
//! has landed. Otherwise a late reset of the dead client could overwrite a copy the
//! reclaimer took and make the register look free to a second reclaimer.
//!
//! # Which registers a reclaimer takes ([`judge`])
//!
//! From the header copies of at least a majority of the register's replicas (every
//! replica that answers is read, so a mark that reached a single replica counts):
//!
//! 1. never if a copy shows a live tag (its own included), a malformed length, or, in
//!    the old format, a blank copy whose holder word (bytes 8..16) is a live token;
//! 2. **a gone retiree's limbo**: some copy is `(len, t)` with `t` gone. Its other
//!    copies may be `(len, 0)` (the mark did not land there) or blank (a replica that
//!    missed the key header); the tagged copy alone proves the register is unmapped.
//!    A gone reclaimer's limbo looks the same;
//! 3. **a gone client's pool**: *every* copy is blank and some copy is `(0, t)` with `t`
//!    gone. All copies must be blank here: a register of that pool that its holder then
//!    published has its key header on a majority, so a majority read sees a `(len, 0)`.
//!    A donated register is such a pool: a donated tag is nobody's. Its donor never
//!    uses it again, and a copy its reset has not reached yet shows the donor's tag
//!    (rule 1) or a key, so a reclaimer takes it only where the reset landed on every
//!    copy it reads. When every copy read is donated ([`Verdict::Donated`]), the taker
//!    waits the delivery margin ([`settle_ns`]) instead of the register grace: the
//!    donor reset the register a grace after its last life ended, so no cache entry
//!    or operation names it any more; only the donor's reset itself may still be on
//!    its way to a replica the taker did not read, and it must land before the
//!    taker's own reset (on every replica, as always), which precedes any use;
//! 4. **never used**: every copy `(0, 0)`, only in a chunk this reclaimer has just
//!    adopted (its owner is gone, and so is its fresh-register pool; `crate::registers::orphans`).
//!
//! So live data (`(len, 0)` on a majority, no tag), a live client's limbo (its tag) and
//! a live client's pool (its tag, or fresh registers of its own chunks) are never taken.
//!
//! # Exactly one taker: claim-word ownership by CAS
//!
//! Several reclaimers may find the same register. Each CASes word 0 of every copy it
//! read from what it saw to `(len, its tag)` and owns the register only when a majority
//! of the replicas answered with the expected value (or its own tag), as claims do
//! ([`crate::membership::claim`]); a loser hands the copies it took back. Tags carry the writer id
//! and two live clients never share one, so two live takers never write equal words; a
//! taker skips a register whose tag equals its own. A CAS only succeeds on the value it
//! observed, and an observed word never comes back (ABA) through a whole new life,
//! however long a taker stops between its posts (a stop inside the burst makes it count
//! answers from both sides of the stop, `docs/pauses.md`): `(len, t)` and `(0, t)` of a
//! gone tag are not written again, and a donated word `(0, donated_tag(M))` carries the
//! ticks of the life marker `M` of the reset that donated it (or of the life the pooled
//! register was given back in; 0 for a never-used one). Markers only grow, and each
//! marker is donated at most once (a reset that donates installs a new one; a taker
//! resets before any use), so a later donation of the register writes another word
//! (up to ticks equal modulo 2^30: about 18 minutes of 1 µs ticks apart to the tick).
//! With one word for every donation (`DONATED_TAG`, as older builds still write), a
//! take stopped after one node's CAS counted a majority with the next donation's
//! copies while that donation's taker counted one too.
//!
//! The winner retires the register into its own limbo ([`crate::registers::recycle`]): it is reset
//! and pooled only after the register grace, which covers any location-cache entry and
//! operation of other clients that may still name it.
//!
//! # Where it runs, and where registers are found
//!
//! A client runs a pass ([`reclaim_gone_registers`]) where it runs out of registers, next to chunk
//! adoption (`KvClient::allocate_register`), under a valid lease. The pass scans the
//! headers of every claimed chunk, not only dead clients' chunks: client U may retire a
//! register of T's chunk, so a dead client's limbo and pool lie anywhere. Headers are
//! read in contiguous spans, [`SPANS_PER_BATCH`] spans of up to [`SPAN_BYTES`] per node
//! per roundtrip.
//!
//! A pass stops where the reclaimer's lease runs short (its takes are CASes that only
//! the lease argument covers, [`crate::membership::lease`]); the reclaimer's next pass starts
//! there ([`Reclaimer::resume_at`]) and goes round, so that passes cover a cluster
//! too large for one lease between them.
//!
//! # A clean close
//!
//! A closing client leaves its limbo marked for others (it waits a little for its
//! marks to land, `KvClient::close`): flushing would mean waiting out the register
//! grace (13 s by default) before exiting, which a one-shot `swarm delete` cannot
//! afford, and the marks already make every retired register reclaimable. What it
//! never used, its pool and the registers of its chunks it never handed out, it
//! donates ([`donated_tag`], rule 3), and chunks it handed nothing out of go back to the
//! chunk table ([`crate::registers::give_back`], which has the argument): a client
//! that runs dry takes those after the delivery margin, not a grace.
//!
//! # What stays leaked
//!
//! * A register whose retire mark landed on no replica that answers the reclaimer (the
//!   retiree's nodes failed, or its operation's deadline passed before the mark was
//!   posted): it reads `(len, 0)` like live data.
//! * The fresh register of an insert whose index call could not tell whether it mapped
//!   it (`OutcomeUnknown`, contention or an error), also once its client is gone: the
//!   register holds the key's header and value, and it may be the key's live mapping,
//!   or an accepted Paxos value that a later proposer of the bucket completes. Telling
//!   would need a decision of the key's bucket that excludes it for good; nothing takes
//!   it.
//! * A crashed client's insert that died between writing a fresh register and learning
//!   the index outcome: the same, for the same reason.
//! * A register whose reset left a lagging replica blank with a live client's tag while
//!   a later life retired it: it is reclaimed only once that client is gone too.

use std::collections::HashSet;

use swarm_core::fabric::{Nanos, Op};
use swarm_core::quorum::{broadcast, broadcast_until_among, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, NodeId, OpStats, RegisterLoc, post_background};
use xxhash_rust::xxh3::xxh3_64;

use crate::layout::{CLIENT_ROW_BYTES, NodeLayout};
use crate::membership::writer_takeover::STRAGGLER_NS;
use crate::{KvError, RegisterId};

/// Bytes of a key header a reclaimer reads: word 0 (length, tag) and word 1 (the first
/// key bytes, or the old-format holder token of a blank header).
pub const HEADER_PROBE: usize = 16;
/// Largest contiguous span of the register area read by one operation of a scan.
pub const SPAN_BYTES: u64 = 32 << 10;
/// Spans per batch (at most `swarm_core::fabric::INLINE_BATCH_OPS`, a batch without a heap allocation).
pub const SPANS_PER_BATCH: usize = 4;

/// The holder tag of the client incarnation on row `writer` with token `token` (see
/// the module docs): never 0.
pub fn holder_tag(writer: u16, token: u64) -> u32 {
    let hash = xxh3_64(&token.to_le_bytes()) as u32;
    0x8000_0000 | (hash & 0x7FFF_F800) | (u32::from(writer) & 0x7FF)
}

/// The writer id a client's [`holder_tag`] carries in its low bits.
pub fn tag_writer(tag: u32) -> u16 {
    (tag & 0x7FF) as u16
}

/// The one donated holder tag that builds before [`donated_tag`] wrote for every
/// donation. Still read as donated ([`is_donated`]); never written any more: a
/// take that straddled two donations found the same word in both (module docs,
/// "Exactly one taker"). Tests only: this build reads it through [`is_donated`].
#[cfg(test)]
pub const DONATED_TAG: u32 = 0x7FFF_FFFF;

/// Bits of a donated holder tag ([`donated_tag`]): bit 31 clear (no client's
/// [`holder_tag`]), bit 30 set (never 0, nor `crate::repair::merge::POISON_TAG`).
const DONATED_BITS: u32 = 0x4000_0000;

/// The holder tag of a *donated* register whose current life marker has `ticks`
/// ticks (0: a register never used, whose words are still zeros): reset on every
/// replica by a client whose pool held enough, or given back at close, and given up
/// for any client to take (`crate::registers::recycle`, "donations";
/// `crate::registers::give_back`). Bit 31 is clear, so it is no client's
/// [`holder_tag`]: [`judge`] finds it held by nobody alive, and a copy set
/// `(0, donated_tag(..))` is a pool like a gone client's (rule 3). The low 30 bits
/// are the marker's ticks, which grow with every life of the register, so each
/// donation of a register writes its own word (module docs, "Exactly one taker").
pub const fn donated_tag(ticks: u64) -> u32 {
    DONATED_BITS | (ticks as u32 & (DONATED_BITS - 1))
}

/// Whether `tag` is a donated holder tag ([`donated_tag`], or the one word older
/// builds wrote for every donation, `DONATED_TAG` = `0x7FFF_FFFF`).
pub const fn is_donated(tag: u32) -> bool {
    tag & 0xC000_0000 == DONATED_BITS
}

/// Word 0 of a key header: the key length in bytes 0..4, the holder tag in 4..8.
pub const fn header_word(len: u32, tag: u32) -> u64 {
    (len as u64) | ((tag as u64) << 32)
}

/// How long a reclaimer waits between reading the client table and reading headers,
/// on its own clock: the delivery margin plus the clock-drift allowance (module docs).
pub fn settle_ns(layout: &NodeLayout) -> Nanos {
    let margin = layout.params.delivery_margin_ns;
    margin.saturating_add(margin / crate::membership::lease::DRIFT_DIV)
}

/// One copy of a key header's first 16 bytes, read from untrusted memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderCopy {
    /// Key length (0: blank).
    pub len: u32,
    /// Holder tag (0: none).
    pub tag: u32,
    /// Bytes 8..16: the first key bytes, or the old-format holder token when blank.
    pub word1: u64,
}

impl HeaderCopy {
    /// Parses the first 16 bytes of a header copy; `None` if fewer were read.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let u32_at = |at: usize| {
            bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let word1 = bytes
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)?;
        Some(Self {
            len: u32_at(0)?,
            tag: u32_at(4)?,
            word1,
        })
    }

    /// Word 0 as it is in memory.
    pub fn word0(&self) -> u64 {
        header_word(self.len, self.tag)
    }
}

/// The clients registered in the copies of the client table that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registered {
    /// Tokens (non-zero) in any copy.
    pub tokens: HashSet<u64>,
    /// Their holder tags.
    pub tags: HashSet<u32>,
}

impl Registered {
    /// Adds every row of a copy of the client table.
    pub fn add_table(&mut self, table: &[u8]) {
        for (row, bytes) in table.chunks_exact(CLIENT_ROW_BYTES as usize).enumerate() {
            let token = bytes
                .get(0..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            if token != 0 {
                self.tokens.insert(token);
                self.tags.insert(holder_tag(row as u16, token));
            }
        }
    }

    /// Everything registered in `self` or `other`.
    pub fn union(mut self, other: &Registered) -> Self {
        self.tokens.extend(other.tokens.iter().copied());
        self.tags.extend(other.tags.iter().copied());
        self
    }
}

/// Reads the client table on every node that answers (a majority at least, stragglers
/// up to [`STRAGGLER_NS`]).
pub async fn read_registered<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
) -> Result<Registered, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let bytes = u32::try_from(u64::from(layout.params.writers) * CLIENT_ROW_BYTES)
        .map_err(|_| KvError::Unsupported("a client table larger than 4 GiB"))?;
    let rt = broadcast_until_among(
        fabric,
        stats,
        swarm_core::quorum::nodes(nodes),
        majority(nodes),
        STRAGGLER_NS,
        |_| Ok(Some(Batch::read(layout.clients_at, bytes))),
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut registered = Registered::default();
    for (_, completion) in rt.replies() {
        registered.add_table(completion.read(0).unwrap_or_default());
    }
    Ok(registered)
}

/// What a reclaimer may do with a register, from its header copies (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Held by nobody alive: a gone client's limbo (retired, still keyed).
    Limbo,
    /// Held by nobody alive: a gone client's pool (blank).
    Pool,
    /// Donated: blank, and every copy read carries one donation's tag ([`is_donated`]).
    Donated,
    /// Never used, in a chunk the reclaimer adopted.
    Fresh,
    /// Live data, a live client's register, or not enough evidence: left alone.
    Keep,
}

/// Judges the header copies of one register (at least `quorum` of its replicas) for
/// the reclaimer whose tag is `mine`; `fresh_ok` when the register lies in a chunk the
/// reclaimer adopted. See the module docs for the rules.
pub fn judge(
    copies: &[HeaderCopy],
    quorum: usize,
    live: &Registered,
    mine: u32,
    fresh_ok: bool,
    key_max: u32,
) -> Verdict {
    if copies.len() < quorum || copies.is_empty() {
        return Verdict::Keep;
    }
    let live_tag = |t: u32| t != 0 && (t == mine || live.tags.contains(&t));
    let held = copies.iter().any(|c| {
        c.len > key_max
            || live_tag(c.tag)
            || (c.len == 0 && c.tag == 0 && c.word1 != 0 && live.tokens.contains(&c.word1))
    });
    if held {
        return Verdict::Keep;
    }
    if copies.iter().any(|c| c.len != 0 && c.tag != 0) {
        return Verdict::Limbo;
    }
    if copies.iter().all(|c| c.len == 0) {
        // One donation's word on every copy. Two donations' words side by side (a
        // copy the later one's reset has not reached) are a pool, through the grace.
        let first = copies[0].tag;
        if is_donated(first) && copies.iter().all(|c| c.tag == first) {
            return Verdict::Donated;
        }
        if copies.iter().any(|c| c.tag != 0) {
            return Verdict::Pool;
        }
        if fresh_ok {
            return Verdict::Fresh;
        }
    }
    Verdict::Keep
}

/// Takes the register `loc` locates for the reclaimer whose tag is `mine`: CASes word
/// 0 of each copy in `observed` (node, word seen), at the register's offset on that
/// node, to `(seen length, mine)`. Whether a majority of its replicas now holds
/// `mine`; a loser hands the copies it took back (module docs).
pub async fn take<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    loc: &RegisterLoc,
    observed: &[(NodeId, u64)],
    mine: u32,
) -> Result<bool, KvError> {
    let quorum = loc.replicas.quorum();
    // Word 0 of the header, at the register's offset on each replica.
    let addr = |node: NodeId| layout.header_on(loc, node);
    if observed.len() < quorum {
        return Ok(false);
    }
    let expected = |node: NodeId| observed.iter().find(|(n, _)| *n == node).map(|(_, w)| *w);
    let new = |word: u64| header_word(word as u32, mine);
    // Every copy's answer (stragglers up to `STRAGGLER_NS`): a copy taken but not
    // counted would stay with this tag if the take is lost.
    let rt = broadcast_until_among(
        fabric,
        stats,
        loc.replicas.nodes().iter().copied(),
        quorum,
        STRAGGLER_NS,
        |node| {
            Ok(expected(node)
                .zip(addr(node))
                .map(|(seen, at)| Batch::cas(at, seen, new(seen))))
        },
        |replies| replies.len() == observed.len(),
    )
    .await?;
    let mut won = Vec::new();
    for (node, completion) in rt.replies() {
        let Some(seen) = expected(*node) else {
            continue;
        };
        if completion
            .cas(0)
            .is_some_and(|previous| previous == seen || previous == new(seen))
        {
            won.push((*node, seen));
        }
    }
    if won.len() >= quorum {
        return Ok(true);
    }
    for (node, seen) in won {
        if let Some(at) = addr(node) {
            post_background(fabric, node, Batch::cas(at, new(seen), seen));
        }
    }
    Ok(false)
}

/// Header copies of the registers `first..end`, read in one roundtrip from every node
/// that answers: for each register, `(node, copy)` for its replicas among them.
/// `loc` gives a register's replicas. Spans: at most [`SPANS_PER_BATCH`] of
/// [`SPAN_BYTES`]; the caller keeps `end - first` within one batch
/// ([`registers_per_roundtrip`]).
pub async fn read_headers<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    first: RegisterId,
    end: RegisterId,
    loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
) -> Result<Vec<Vec<(NodeId, HeaderCopy)>>, KvError> {
    let nodes = fabric.node_count();
    let per_span = registers_per_span(layout);
    let spans: Vec<(RegisterId, RegisterId)> = if layout.params.placement_nodes == 0 {
        (first..end)
            .step_by(per_span as usize)
            .map(|s| (s, (s + per_span).min(end)))
            .collect()
    } else {
        // With replica groups only a chunk's registers are contiguous: spans are
        // aligned to `per_span`, which divides the chunk size.
        let mut spans = Vec::new();
        let mut s = first;
        while s < end {
            let e = ((s / per_span + 1) * per_span).min(end);
            spans.push((s, e));
            s = e;
        }
        spans
    };
    if spans.len() > SPANS_PER_BATCH {
        return Err(KvError::Unsupported(
            "a header scan step larger than a batch",
        ));
    }
    // A span is contiguous on each of its chunk's replicas, from its first
    // register's header there (its offset on that node: a placement record may give
    // each replica its own); other nodes read it at its computed place, unused.
    // A reserve chunk has no computed place: other nodes read it where its first
    // replica has it (memory every node has, the layout being the same).
    let span_read = |(s, e): (RegisterId, RegisterId)| -> Option<(Option<RegisterLoc>, u64, u32)> {
        let loc = loc(s);
        let at = match layout.key_header(s) {
            Some(at) => at,
            None => {
                let l = loc.as_ref()?;
                layout.header_on(l, *l.replicas.nodes().first()?)?
            }
        };
        let last = e.checked_sub(1)?.checked_sub(s)? * layout.register_slot_bytes;
        let len = u32::try_from(last + HEADER_PROBE as u64).ok()?;
        Some((loc, at, len))
    };
    let mut reads = Vec::with_capacity(spans.len());
    for span in &spans {
        reads
            .push(span_read(*span).ok_or(KvError::Unsupported("a header span out of the layout"))?);
    }
    // Every node; with a metadata group (more nodes than one roundtrip reaches),
    // the replicas of the registers read only (a few chunks' groups).
    let targets: Vec<NodeId> = if layout.params.metadata_nodes == 0 {
        node_ids(nodes).collect()
    } else {
        let mut targets: Vec<NodeId> = Vec::new();
        for (s, _) in &spans {
            for node in loc(*s).iter().flat_map(|l| l.replicas.nodes().iter()) {
                if !targets.contains(node) {
                    targets.push(*node);
                }
            }
        }
        targets.sort_unstable();
        targets
    };
    let nodes = targets.len();
    let rt = broadcast_until_among(
        fabric,
        stats,
        targets,
        majority(nodes),
        STRAGGLER_NS,
        |node| {
            let mut batch = Batch::new();
            for (loc, computed, len) in &reads {
                let addr = loc
                    .as_ref()
                    .and_then(|l| layout.header_on(l, node))
                    .unwrap_or(*computed);
                batch.push(Op::Read { addr, len: *len })?;
            }
            Ok(Some(batch))
        },
        |replies| replies.len() == nodes,
    )
    .await?;
    let mut out = vec![Vec::new(); (end - first) as usize];
    for (i, (s, e)) in spans.iter().enumerate() {
        for register in *s..*e {
            let Some(replicas) = loc(register) else {
                continue;
            };
            let offset = ((register - s) * layout.register_slot_bytes) as usize;
            for (node, completion) in rt.replies() {
                if !replicas.replicas.nodes().contains(node) {
                    continue;
                }
                let copy = completion
                    .read(i)
                    .and_then(|data| data.get(offset..offset + HEADER_PROBE))
                    .and_then(HeaderCopy::parse);
                if let (Some(copy), Some(slot)) = (copy, out.get_mut((register - first) as usize)) {
                    slot.push((*node, copy));
                }
            }
        }
    }
    Ok(out)
}

fn registers_per_span(layout: &NodeLayout) -> u64 {
    let fit = (SPAN_BYTES / layout.register_slot_bytes.max(1)).max(1);
    if layout.params.placement_nodes == 0 {
        return fit;
    }
    // With replica groups, a divisor of the chunk size, so that aligned spans
    // never cross from one chunk (contiguous) to the next (elsewhere).
    let per = u64::from(layout.params.chunk_registers).max(1);
    (1..=fit.min(per))
        .rev()
        .find(|d| per.is_multiple_of(*d))
        .unwrap_or(1)
}

/// How many consecutive registers [`read_headers`] reads in one roundtrip.
pub fn registers_per_roundtrip(layout: &NodeLayout) -> u64 {
    let spans = if layout.params.placement_nodes == 0 {
        SPANS_PER_BATCH
    } else {
        // One span more when the first is not aligned.
        SPANS_PER_BATCH - 1
    };
    registers_per_span(layout) * spans as u64
}

/// Chunks claimed on any copy of the chunk table of the nodes that answered.
pub async fn claimed_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
) -> Result<Vec<u64>, KvError> {
    let nodes = layout.metadata_nodes(fabric.node_count());
    let bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| KvError::Unsupported("a chunk table larger than 4 GiB"))?;
    let rt = broadcast(fabric, stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::read(layout.chunks_at, bytes))
    })
    .await?;
    let mut claimed = vec![false; layout.chunks() as usize];
    for (_, completion) in rt.replies() {
        let words = completion.read(0).unwrap_or_default();
        for (flag, word) in claimed.iter_mut().zip(words.chunks_exact(8)) {
            *flag |= word.iter().any(|b| *b != 0);
        }
    }
    Ok((0..layout.chunks())
        .filter(|c| claimed[*c as usize])
        .collect())
}

/// The reclaiming client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reclaimer {
    /// Its incarnation token.
    pub token: u64,
    /// Its holder tag ([`holder_tag`]).
    pub tag: u32,
    /// Donated registers to take at most in one pass (`crate::registers::recycle`,
    /// "donations"). A pass that took every donation would hoard them, and leave the
    /// next client that runs dry none; `KvClient` takes a chunk's worth, or half of
    /// what its previous pass left on offer if that is more.
    pub max_donations: u64,
    /// Registers to take in one pass, donations included: a pass stops at the first
    /// group of registers it reaches with that many taken (so it may take one
    /// group's worth more), like one cut short by its lease ([`Reclaimed::stopped`]),
    /// and the next goes on from there: what it leaves stays reclaimable by any
    /// client. A pass that took everything gone clients held put most of the
    /// cluster's registers in one client's limbo (a soak's reader of 3,000 keys
    /// took 171,000 in one pass), where they wait for that one client's resets
    /// while every other client finds none.
    pub max_takes: u64,
    /// The register to start the scan at, going round: where the reclaimer's last
    /// pass stopped ([`Reclaimed::resume_at`]), so that passes cut short by the
    /// lease still cover the whole cluster between them.
    pub resume_at: RegisterId,
    /// Take only retired registers ([`Verdict::Limbo`]): adopt no chunk, take no
    /// pool, fresh or donated register (donations are counted in
    /// [`Reclaimed::donations_left`]). For a pass run because the reclaimer's log is
    /// nearly full, not because it ran out of registers (`KvClient::relieve_log`):
    /// only the resets of retired registers free log slots (of their values), and
    /// whatever else it took would sit in its limbo and pool while clients that
    /// run dry find nothing to take. (A fill's thread whose log reached seven
    /// eighths took 20,000 donated registers in five seconds that way, and its
    /// three siblings, dry, failed their inserts.)
    pub retired_only: bool,
}

/// What one reclamation pass found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Chunks of gone clients adopted ([`crate::registers::orphans`]).
    pub chunks: Vec<u64>,
    /// Registers taken, with what they were: to retire into the reclaimer's limbo.
    pub taken: Vec<(RegisterId, Verdict)>,
    /// Registers a take was tried for and lost (another reclaimer won, or no majority).
    pub lost: u64,
    /// Donated registers the pass found and left on offer: over
    /// [`Reclaimer::max_donations`], or whose take failed (past the group's
    /// deadline). Not those another reclaimer won.
    pub donations_left: u64,
    /// Whether the pass stopped early (the reclaimer's lease ran short).
    pub stopped: bool,
    /// Where the next pass should start: the first register this one did not scan
    /// if it stopped early, 0 otherwise.
    pub resume_at: RegisterId,
}

impl Reclaimed {
    /// Taken registers of the given kind.
    pub fn count(&self, kind: Verdict) -> u64 {
        self.taken.iter().filter(|(_, v)| *v == kind).count() as u64
    }
}

/// The register ranges of `chunks` (sorted, `per` registers each, `registers` in
/// all) in the order a pass scans them: from `resume_at` to the end, then from the
/// start up to `resume_at`.
fn scan_order<'a>(
    chunks: &'a [u64],
    ids: impl Fn(u64) -> std::ops::Range<RegisterId> + Copy + 'a,
    resume_at: RegisterId,
) -> impl Iterator<Item = (RegisterId, RegisterId)> + 'a {
    let range = move |c: &u64| {
        let r = ids(*c);
        (r.start, r.end)
    };
    let after = chunks
        .iter()
        .map(range)
        .filter(move |&(_, end)| end > resume_at)
        .map(move |(first, end)| (first.max(resume_at), end));
    let before = chunks
        .iter()
        .map(range)
        .filter(move |&(first, _)| first < resume_at)
        .map(move |(first, end)| (first, end.min(resume_at)));
    after.chain(before)
}

/// One reclamation pass for `me` (module docs): adopts the chunks of gone clients,
/// waits [`settle_ns`], then scans the headers of every claimed chunk and takes the
/// registers no live client holds. `may_act()` is asked before each step that posts
/// takes (the caller's lease must be valid for `max_op_ns`); `loc` gives a register's
/// replicas.
pub async fn reclaim_gone_registers<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    me: Reclaimer,
    may_act: impl Fn() -> bool,
    loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
) -> Result<Reclaimed, KvError> {
    let stats = OpStats::new();
    let mut out = Reclaimed::default();
    if !may_act() {
        // Nothing scanned: the next pass starts where this one would have.
        out.stopped = true;
        out.resume_at = me.resume_at;
        return Ok(out);
    }
    let before = read_registered(fabric, &stats, layout).await?;
    // An adopted chunk's never-used registers are taken only by its adopter (no other
    // reclaimer judges them fresh): a pass that takes retired registers only must not
    // adopt, or they would stay with a live client that never takes them.
    if !me.retired_only {
        out.chunks = crate::registers::orphans::adopt_orphan_chunks(
            fabric, &stats, layout, &before, me.token,
        )
        .await?;
    }
    swarm_core::sleep(fabric, settle_ns(layout)).await;
    let adopted: HashSet<u64> = out.chunks.iter().copied().collect();
    // Donated registers taken so far (`Reclaimer::max_donations`).
    let mut donations = 0u64;
    let per = u64::from(layout.params.chunk_registers);
    let step = registers_per_roundtrip(layout);
    let chunks = claimed_chunks(fabric, &stats, layout).await?;
    for (first, end) in scan_order(&chunks, |c| layout.chunk_register_ids(c), me.resume_at) {
        let mut at = first;
        while at < end {
            let full = out.taken.len() as u64 >= me.max_takes;
            if full || !may_act() {
                tracing::debug!(
                    at,
                    taken = out.taken.len(),
                    donations_left = out.donations_left,
                    full,
                    "reclamation pass stopped: it took its share, or the lease runs short; the next one goes on from here"
                );
                out.stopped = true;
                out.resume_at = at;
                return Ok(out);
            }
            let stop = (at + step).min(end);
            // One group: headers, then the table (module docs: the order matters),
            // then the takes, all before the group's deadline.
            let op = OpStats::new();
            let _deadline = op.arm_deadline(fabric.now().saturating_add(layout.params.max_op_ns));
            let read = async {
                let copies = read_headers(fabric, &op, layout, at, stop, &loc).await?;
                let live = read_registered(fabric, &op, layout).await?;
                Ok::<_, KvError>((copies, live.union(&before)))
            };
            let (copies, live) = match read.await {
                Ok(read) => read,
                // Past the group's deadline (a stalled process) or too few nodes: this
                // group waits for the next pass.
                Err(error) => {
                    tracing::debug!(first = at, end = stop, %error, "reclaim: a group could not be read");
                    at = stop;
                    continue;
                }
            };
            for (i, copies) in copies.iter().enumerate() {
                let register = at + i as u64;
                let Some(replicas) = loc(register) else {
                    continue;
                };
                let parsed: Vec<HeaderCopy> = copies.iter().map(|(_, c)| *c).collect();
                let verdict = judge(
                    &parsed,
                    replicas.replicas.quorum(),
                    &live,
                    me.tag,
                    adopted.contains(&(register / per)),
                    layout.params.key_max,
                );
                if verdict == Verdict::Keep {
                    continue;
                }
                if me.retired_only && verdict != Verdict::Limbo {
                    out.donations_left += u64::from(verdict == Verdict::Donated);
                    continue;
                }
                if verdict == Verdict::Donated && donations >= me.max_donations {
                    out.donations_left += 1;
                    continue;
                }
                let observed: Vec<(NodeId, u64)> =
                    copies.iter().map(|(n, c)| (*n, c.word0())).collect();
                match take(fabric, &op, layout, &replicas, &observed, me.tag).await {
                    Ok(true) => {
                        donations += u64::from(verdict == Verdict::Donated);
                        out.taken.push((register, verdict));
                    }
                    // Another reclaimer won it (or no majority answered): not on
                    // offer any more, as far as this pass can tell.
                    Ok(false) => out.lost += 1,
                    // Past the group's deadline (or nodes gone): leave the rest.
                    Err(error) => {
                        tracing::debug!(register, %error, "reclaim: a take failed");
                        out.lost += 1;
                        out.donations_left += u64::from(verdict == Verdict::Donated);
                    }
                }
            }
            let group: Vec<_> = out
                .taken
                .iter()
                .filter(|(r, _)| (at..stop).contains(r))
                .collect();
            if !group.is_empty() {
                tracing::debug!(
                    first = at,
                    end = stop,
                    taken = group.len(),
                    "reclaimed registers of gone clients in this group"
                );
            }
            at = stop;
        }
    }
    if !out.taken.is_empty() || !out.chunks.is_empty() {
        tracing::info!(
            chunks = out.chunks.len(),
            limbo = out.count(Verdict::Limbo),
            pool = out.count(Verdict::Pool),
            donated = out.count(Verdict::Donated),
            fresh = out.count(Verdict::Fresh),
            lost = out.lost,
            donations_left = out.donations_left,
            "reclaimed registers of gone clients (they go through the register grace) and donated ones"
        );
    } else {
        tracing::debug!(
            lost = out.lost,
            donations_left = out.donations_left,
            "reclamation pass: nothing taken"
        );
    }
    Ok(out)
}

/// How the registers of a cluster are held, by their key headers (`swarm stat`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Registers with a key header and no tag: live keys, inserts in flight, and leaks
    /// (unpublished inserts of unknown outcome, retirements whose mark was lost).
    pub keyed: u64,
    /// Retired registers in a live client's limbo.
    pub retired_live: u64,
    /// Retired registers held by gone clients: reclaimable.
    pub retired_gone: u64,
    /// Blank registers held by live clients (pools, limbos of taken ones).
    pub pooled_live: u64,
    /// `pooled_live` by the writer id of the live holder's tag (the first live tag of
    /// the copies), most first: which client hoards free registers.
    pub pooled_live_by_writer: Vec<(u16, u64)>,
    /// Blank registers held by gone clients, or donated (`is_donated`): reclaimable.
    pub pooled_gone: u64,
    /// Of `pooled_gone`, the donated ones (every copy read `(0, d)` for one donated tag `d`): a
    /// reclaimer takes them after the delivery margin, not a register grace.
    pub donated: u64,
    /// Registers never used (blank, no tag).
    pub fresh: u64,
    /// Registers too few replicas answered for.
    pub unknown: u64,
}

impl Census {
    /// Registers holding data: a key, or a retired key not reset yet.
    pub fn holding_data(&self) -> u64 {
        self.keyed + self.retired_live + self.retired_gone
    }

    /// Registers in claimed chunks that a client running out takes back: retired or
    /// pooled by gone clients, or donated.
    pub fn reclaimable(&self) -> u64 {
        self.retired_gone + self.pooled_gone
    }
}

/// Counts the registers of every claimed chunk by header state (read-only).
pub async fn census<F: Fabric>(
    fabric: &F,
    layout: &NodeLayout,
    loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
) -> Result<Census, KvError> {
    let stats = OpStats::new();
    let mut out = Census::default();
    let step = registers_per_roundtrip(layout);
    let chunks = claimed_chunks(fabric, &stats, layout).await?;
    out.fresh = layout.params.registers.saturating_sub(
        chunks
            .iter()
            .filter(|&&c| !layout.is_reserve(c))
            .map(|&c| layout.chunk_register_ids(c).count() as u64)
            .sum::<u64>(),
    );
    for chunk in chunks {
        let ids = layout.chunk_register_ids(chunk);
        let (first, end) = (ids.start, ids.end);
        let mut at = first;
        while at < end {
            let stop = (at + step).min(end);
            let copies = read_headers(fabric, &stats, layout, at, stop, &loc).await?;
            let live = read_registered(fabric, &stats, layout).await?;
            for (i, copies) in copies.iter().enumerate() {
                let quorum = loc(at + i as u64).map_or(usize::MAX, |l| l.replicas.quorum());
                if copies.len() < quorum {
                    out.unknown += 1;
                    continue;
                }
                let is_live = |t: u32| live.tags.contains(&t);
                let keyed_tags: Vec<u32> = copies
                    .iter()
                    .filter(|(_, c)| c.len != 0 && c.tag != 0)
                    .map(|(_, c)| c.tag)
                    .collect();
                let tags: Vec<u32> = copies
                    .iter()
                    .filter(|(_, c)| c.tag != 0)
                    .map(|(_, c)| c.tag)
                    .collect();
                if !keyed_tags.is_empty() {
                    if tags.iter().any(|t| is_live(*t)) {
                        out.retired_live += 1;
                    } else {
                        out.retired_gone += 1;
                    }
                } else if copies.iter().any(|(_, c)| c.len != 0) {
                    out.keyed += 1;
                } else if tags.is_empty() {
                    out.fresh += 1;
                } else if let Some(tag) = tags.iter().copied().find(|t| is_live(*t)) {
                    out.pooled_live += 1;
                    let writer = tag_writer(tag);
                    match out
                        .pooled_live_by_writer
                        .iter_mut()
                        .find(|(w, _)| *w == writer)
                    {
                        Some((_, n)) => *n += 1,
                        None => out.pooled_live_by_writer.push((writer, 1)),
                    }
                } else {
                    out.pooled_gone += 1;
                    out.donated += u64::from(copies.first().is_some_and(|(_, first)| {
                        is_donated(first.tag) && copies.iter().all(|(_, c)| c.tag == first.tag)
                    }));
                }
            }
            at = stop;
        }
    }
    out.pooled_live_by_writer
        .sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarm_core::{FixedClock, MemCluster, MemFabric, block_on, block_on_future};

    use crate::KvClient;
    use crate::client::register_loc_for;
    use crate::test_support::{MS, census_of, connect, small_cluster};

    type Client = KvClient<MemFabric, FixedClock>;

    fn cluster() -> (MemCluster, NodeLayout) {
        small_cluster(400 * MS)
    }

    fn insert(c: &Client, key: &str, value: &str) -> Result<(), KvError> {
        block_on(
            c.fabric(),
            c.insert(key.as_bytes(), value.as_bytes(), &OpStats::new()),
        )
    }

    /// Whether the delete removed the key's value (one client at a time: never raced).
    fn delete(c: &Client, key: &str) -> bool {
        let outcome = block_on(c.fabric(), c.delete(key.as_bytes(), &OpStats::new()));
        outcome.expect("a delete") == swarm_core::DeleteOutcome::Removed
    }

    fn get(c: &Client, key: &str) -> Option<Vec<u8>> {
        block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).expect("a get")
    }

    fn reclaim_gone_registers_now(c: &Client) {
        block_on(c.fabric(), c.reclaim_gone_registers_now()).expect("a reclamation pass");
    }

    /// Lets the register grace pass on the client's clock, then runs no-op deletes so
    /// that its recycler resets what is due.
    fn after_grace(c: &Client) {
        let grace = c.layout().params.register_grace_ns() + 5 * MS;
        block_on_future(c.fabric(), swarm_core::sleep(c.fabric(), grace)).expect("a sleep");
        for _ in 0..8 {
            assert!(!delete(c, "absent"));
        }
    }

    /// The word 0 of `register`'s key header on `node`, and a way to set it.
    fn word0(f: &MemFabric, layout: &NodeLayout, register: RegisterId, node: u16) -> u64 {
        let at = layout.key_header(register).unwrap();
        block_on_future(f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(f, &s);
            rt.post(NodeId(node), Batch::cas(at, 0, 0)).unwrap();
            rt.wait(1).await.unwrap();
            rt.replies()[0].1.cas(0).unwrap()
        })
        .unwrap()
    }

    fn set_word0(f: &MemFabric, layout: &NodeLayout, register: RegisterId, node: u16, to: u64) {
        let at = layout.key_header(register).unwrap();
        let from = word0(f, layout, register, node);
        block_on_future(f, async {
            let s = OpStats::new();
            let mut rt = swarm_core::Roundtrip::start(f, &s);
            rt.post(NodeId(node), Batch::cas(at, from, to)).unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }

    #[test]
    fn a_scan_starts_where_the_last_pass_stopped_and_goes_round() {
        let order = |resume_at| {
            scan_order(&[0, 2, 3], |c| c * 8..((c + 1) * 8).min(30), resume_at).collect::<Vec<_>>()
        };
        assert_eq!(order(0), [(0, 8), (16, 24), (24, 30)]);
        assert_eq!(order(19), [(19, 24), (24, 30), (0, 8), (16, 19)]);
        assert_eq!(order(8), [(16, 24), (24, 30), (0, 8)]);
        assert_eq!(order(30), [(0, 8), (16, 24), (24, 30)]);
    }

    /// Passes cut short by the lease go on where the last one stopped: between them
    /// they cover every claimed chunk. Before, every pass started at the first
    /// chunk, and in a cluster too large for one lease (a 1 GiB cluster's pass met
    /// its lease's end about a third of the way) the last registers were never
    /// reclaimed: here, four passes took 8 of the 16.
    #[test]
    fn passes_cut_short_by_the_lease_go_on_where_the_last_one_stopped() {
        let (cluster, layout) = cluster();
        let a = connect(&cluster, layout);
        let keys = 4 * u64::from(layout.params.chunk_registers);
        for i in 0..keys {
            insert(&a, &format!("k{i}"), "v").expect("inserted");
        }
        for i in 0..keys {
            assert!(delete(&a, &format!("k{i}")));
        }
        a.close();
        let b = connect(&cluster, layout);
        let f = b.fabric();
        let (mut resume_at, mut taken, mut stops) = (0, 0, 0);
        for _ in 0..4 {
            // The pass's first look and two chunks (a group each here), then the
            // lease "runs short".
            let budget = core::cell::Cell::new(3u32);
            let may_act = || {
                let left = budget.get();
                budget.set(left.saturating_sub(1));
                left > 0
            };
            let me = Reclaimer {
                token: b.token(),
                tag: b.recycler_tag(),
                max_donations: 0,
                max_takes: u64::MAX,
                resume_at,
                retired_only: false,
            };
            let loc = |r| register_loc_for(&layout, 3, r).ok();
            let out =
                block_on(f, reclaim_gone_registers(f, &layout, me, may_act, loc)).expect("a pass");
            taken += out.count(Verdict::Limbo);
            stops += u32::from(out.stopped);
            resume_at = out.resume_at;
        }
        assert!(stops >= 2, "the passes were cut short: {stops}");
        assert_eq!(taken, keys, "every retired register was taken");
    }

    /// A dry client's pass takes its share (16 chunks' worth) of what gone clients
    /// held and leaves the rest reclaimable by the others: in a soak, one pass of a
    /// reader of 3,000 keys took 171,000 registers, and every other client found
    /// none while that one reset them a few at a time.
    #[test]
    fn a_pass_takes_its_share_and_leaves_the_rest_to_the_others() {
        let (cluster, layout) = cluster();
        let share = 16 * u64::from(layout.params.chunk_registers);
        let keys = share + 36;
        let a = connect(&cluster, layout);
        for i in 0..keys {
            insert(&a, &format!("k{i}"), "v").expect("inserted");
        }
        for i in 0..keys {
            assert!(delete(&a, &format!("k{i}")));
        }
        a.close();
        let b = connect(&cluster, layout);
        assert_eq!(census_of(&b).retired_gone, keys);
        reclaim_gone_registers_now(&b);
        let by_b = b.recycle_stats().reclaimed_limbo;
        assert!(
            (share..share + u64::from(layout.params.chunk_registers)).contains(&by_b),
            "b took {by_b} of {keys}, its share being {share}"
        );
        assert_eq!(census_of(&b).retired_gone, keys - by_b, "the rest is left");
        let c = connect(&cluster, layout);
        reclaim_gone_registers_now(&c);
        assert_eq!(c.recycle_stats().reclaimed_limbo, keys - by_b);
        assert_eq!(census_of(&c).retired_gone, 0);
    }

    /// A client deletes keys and closes before their grace; another reclaims those
    /// registers, the deleted keys stay deleted, the live ones keep their values, and
    /// the registers in use come back to what the live keys need.
    #[test]
    fn a_closed_clients_limbo_is_reclaimed_and_live_keys_are_untouched() {
        let (cluster, layout) = cluster();
        let registers = layout.params.registers;
        let a = connect(&cluster, layout);
        for i in 0..6 {
            insert(&a, &format!("k{i}"), &format!("v{i}")).expect("inserted");
        }
        for i in 0..3 {
            assert!(delete(&a, &format!("k{i}")));
        }
        assert_eq!(a.registers_in_limbo(), 3);
        a.close();
        let b = connect(&cluster, layout);
        let before = census_of(&b);
        assert_eq!(before.retired_gone, 3, "{before:?}");
        assert_eq!(before.keyed, 3, "{before:?}");
        reclaim_gone_registers_now(&b);
        let stats = b.recycle_stats();
        assert_eq!(stats.reclaimed_limbo, 3, "{stats:?}");
        assert_eq!(census_of(&b).retired_gone, 0);
        for i in 0..3 {
            assert_eq!(get(&b, &format!("k{i}")), None, "k{i} came back");
        }
        for i in 3..6 {
            assert_eq!(
                get(&b, &format!("k{i}")),
                Some(format!("v{i}").into_bytes())
            );
        }
        after_grace(&b);
        assert_eq!(
            b.recycle_stats().recycled,
            stats.retired,
            "{:?}",
            b.recycle_stats()
        );
        let after = census_of(&b);
        assert_eq!(
            after.holding_data(),
            3,
            "only the live keys hold data: {after:?}"
        );
        // Every register but the live keys' can be filled again.
        let mut inserted = 0;
        loop {
            match insert(&b, &format!("n{inserted}"), "N") {
                Ok(()) => inserted += 1,
                Err(KvError::RegistersFull { .. }) => break,
                Err(other) => panic!("insert n{inserted}: {other}"),
            }
            assert!(inserted <= registers, "more keys than registers");
        }
        assert_eq!(inserted, registers - 3, "registers: {registers}");
        for i in 3..6 {
            assert_eq!(
                get(&b, &format!("k{i}")),
                Some(format!("v{i}").into_bytes())
            );
        }
        for i in 0..inserted {
            assert_eq!(get(&b, &format!("n{i}")).as_deref(), Some(&b"N"[..]));
        }
    }

    /// The race: a reclaimer runs while the retiree is alive and mid-grace. Its limbo,
    /// and then its pool, are left alone; once it closes, its pool is reclaimed.
    #[test]
    fn a_live_clients_limbo_and_pool_are_never_taken() {
        let (cluster, layout) = cluster();
        let a = connect(&cluster, layout);
        let b = connect(&cluster, layout);
        insert(&b, "b", "B").expect("inserted");
        for i in 0..3 {
            insert(&a, &format!("k{i}"), "A").expect("inserted");
            assert!(delete(&a, &format!("k{i}")));
        }
        assert_eq!(census_of(&b).retired_live, 3);
        reclaim_gone_registers_now(&b);
        assert_eq!(
            b.recycle_stats().reclaimed_limbo,
            0,
            "a live limbo was taken"
        );
        assert_eq!(b.recycle_stats().reclaimed_pool, 0);
        // a's grace passes: a recycles its own registers into its pool.
        after_grace(&a);
        assert_eq!(a.recycle_stats().recycled, 3);
        assert_eq!(census_of(&b).pooled_live, 3, "a's recycled three");
        reclaim_gone_registers_now(&b);
        assert_eq!(b.recycle_stats().reclaimed_pool, 0, "a live pool was taken");
        // a still uses its pool: its inserts land in its recycled registers.
        for i in 0..3 {
            insert(&a, &format!("again{i}"), "A2").expect("a's pool");
        }
        for i in 0..3 {
            assert!(delete(&a, &format!("again{i}")));
        }
        a.close();
        reclaim_gone_registers_now(&b);
        let stats = b.recycle_stats();
        assert_eq!(stats.reclaimed_limbo, 3, "a's second limbo: {stats:?}");
        assert_eq!(get(&b, "b").as_deref(), Some(&b"B"[..]));
        for i in 0..3 {
            assert_eq!(get(&b, &format!("k{i}")), None);
            assert_eq!(get(&b, &format!("again{i}")), None);
        }
    }

    /// A retiree whose mark reached one replica only: that copy is enough. With no
    /// mark at all the register is left alone (it reads like live data).
    #[test]
    fn a_mark_on_one_replica_is_enough_and_no_mark_is_a_leak() {
        let (cluster, layout) = cluster();
        let a = connect(&cluster, layout);
        insert(&a, "one", "1").expect("inserted");
        insert(&a, "none", "0").expect("inserted");
        let f = cluster.client();
        let resolve = |key: &str| {
            block_on(&f, a.index().resolve(&f, &OpStats::new(), key.as_bytes()))
                .expect("resolve")
                .expect("mapped")
        };
        let (one, none) = (resolve("one"), resolve("none"));
        assert!(delete(&a, "one"));
        assert!(delete(&a, "none"));
        a.close();
        let untagged = |len: u32| header_word(len, 0);
        for node in 1..3 {
            set_word0(&f, &layout, one, node, untagged(3));
        }
        for node in 0..3 {
            set_word0(&f, &layout, none, node, untagged(4));
        }
        assert_ne!(word0(&f, &layout, one, 0) >> 32, 0, "node 0 keeps the mark");
        let b = connect(&cluster, layout);
        reclaim_gone_registers_now(&b);
        assert_eq!(b.recycle_stats().reclaimed_limbo, 1);
        let c = census_of(&b);
        assert_eq!(c.keyed, 1, "the unmarked register stays: {c:?}");
        let tag = b.recycler_tag();
        for node in 0..3 {
            assert_eq!(
                word0(&f, &layout, one, node),
                header_word(3, tag),
                "node {node}"
            );
        }
    }

    /// Two reclaimers race for one register: exactly one owns it, the loser hands back
    /// the copy it took.
    #[test]
    fn two_reclaimers_racing_for_a_register_never_both_win() {
        let (cluster, layout) = cluster();
        let a = connect(&cluster, layout);
        insert(&a, "k", "v").expect("inserted");
        let f = cluster.client();
        let r = block_on(&f, a.index().resolve(&f, &OpStats::new(), b"k"))
            .expect("resolve")
            .expect("mapped");
        assert!(delete(&a, "k"));
        a.close();
        // What each copy holds: the key header tagged by its retiree where the header
        // landed (a majority: the insert's write), a blank word where it did not.
        let observed: Vec<(NodeId, u64)> = (0..3)
            .map(|n| (NodeId(n), word0(&f, &layout, r, n)))
            .collect();
        let tagged = observed
            .iter()
            .filter(|(_, w)| w >> 32 != 0 && *w as u32 == 1);
        assert!(tagged.count() >= 2, "tagged by its retiree: {observed:x?}");
        let gone = observed[0].1;
        let loc = register_loc_for(&layout, 3, r).unwrap();
        let (tag_b, tag_c) = (holder_tag(1, 0xB), holder_tag(2, 0xC));
        // c's CAS landed first on node 0 only.
        set_word0(&f, &layout, r, 0, header_word(1, tag_c));
        let s = OpStats::new();
        let b_won = block_on(&f, take(&f, &s, &layout, &loc, &observed, tag_b)).unwrap();
        let c_won = block_on(&f, take(&f, &s, &layout, &loc, &observed, tag_c)).unwrap();
        assert!(b_won, "b holds nodes 1 and 2");
        assert!(!c_won, "c holds node 0 only and must lose");
        assert_eq!(word0(&f, &layout, r, 0), gone, "c handed its copy back");
        for (node, seen) in &observed[1..] {
            assert_eq!(
                word0(&f, &layout, r, node.0),
                header_word(*seen as u32, tag_b)
            );
        }
        // A third reclaimer with the same stale view wins nothing either.
        let d_won = block_on(
            &f,
            take(&f, &s, &layout, &loc, &observed, holder_tag(3, 0xD)),
        )
        .unwrap();
        assert!(!d_won);
    }

    /// A take straddling two donations of one register. Reclaimer x judged the
    /// register donated and posted its takes; only node 0's landed before x stopped.
    /// A second reclaimer, which did not hear node 0 in time, took it from nodes 1
    /// and 2, reset it (node 0's copy included) and used it; a later reset donated it
    /// again. A third reclaimer now takes nodes 0 and 1, and x wakes up. When every
    /// donation wrote the same word (`DONATED_TAG`), x's late take found it on node
    /// 2 and, with node 0's answer from before its stop, counted a majority too: both
    /// held the register. Each donation now writes its own word, from the life marker
    /// its reset installed ([`donated_tag`]), so x's late CAS fails.
    #[test]
    fn a_take_paused_between_its_posts_never_shares_a_register() {
        use crate::test_support::{Holding, poll_once};
        use swarm_core::encoding::Tsp;
        let (cluster, layout) = cluster();
        let f = cluster.client();
        let r: RegisterId = 5;
        let loc = register_loc_for(&layout, 3, r).unwrap();
        // The first donation: a reset whose marker has 5 ticks.
        let first = Tsp::reset_marker(5).unwrap();
        let donated = header_word(0, donated_tag(first.ts().ticks()));
        for node in 0..3 {
            set_word0(&f, &layout, r, node, donated);
        }
        let everywhere: Vec<(NodeId, u64)> = (0..3).map(|n| (NodeId(n), donated)).collect();
        let (tag_x, tag_y, tag_z) = (holder_tag(1, 0xA), holder_tag(2, 0xB), holder_tag(3, 0xC));
        // x posts its takes; node 0's lands, then x stops.
        let x = Holding::new(cluster.client(), &[1, 2]);
        let sx = OpStats::new();
        let mut fx = core::pin::pin!(take(&x, &sx, &layout, &loc, &everywhere, tag_x));
        assert!(poll_once(fx.as_mut()).is_pending());
        // y judged from nodes 1 and 2 and wins them.
        let s = OpStats::new();
        let y_won = block_on(&f, take(&f, &s, &layout, &loc, &everywhere[1..], tag_y));
        assert!(matches!(y_won, Ok(true)));
        // y's reset (every copy: node 0's x tag included), a life, then a reset that
        // donates it again: its marker is above every word of the life before, the
        // first donation's marker included.
        for node in 0..3 {
            set_word0(&f, &layout, r, node, header_word(0, tag_y));
        }
        let seen = crate::registers::reset::Seen {
            header: header_word(0, tag_y),
            words: vec![first.word(), first.word()],
        };
        let again = crate::registers::reset::marker_above([&seen]).unwrap();
        let donated_again = header_word(0, donated_tag(again.ts().ticks()));
        for node in 0..3 {
            set_word0(&f, &layout, r, node, donated_again);
        }
        // z takes the second donation; its node-2 CAS is slow.
        let everywhere_again: Vec<(NodeId, u64)> =
            (0..3).map(|n| (NodeId(n), donated_again)).collect();
        let z = Holding::new(cluster.client(), &[2]);
        let sz = OpStats::new();
        let mut fz = core::pin::pin!(take(&z, &sz, &layout, &loc, &everywhere_again, tag_z));
        assert!(poll_once(fz.as_mut()).is_pending());
        // x wakes up.
        x.land();
        let x_won = matches!(poll_once(fx.as_mut()), core::task::Poll::Ready(Ok(true)));
        z.land();
        let z_won = matches!(poll_once(fz.as_mut()), core::task::Poll::Ready(Ok(true)));
        assert!(!(x_won && z_won), "two reclaimers both took the register");
        assert!(z_won && !x_won, "the second donation's taker holds it");
    }

    fn copy(len: u32, tag: u32, word1: u64) -> HeaderCopy {
        HeaderCopy { len, tag, word1 }
    }

    fn live(pairs: &[(u16, u64)]) -> Registered {
        let mut r = Registered::default();
        for (writer, token) in pairs {
            r.tokens.insert(*token);
            r.tags.insert(holder_tag(*writer, *token));
        }
        r
    }

    #[test]
    fn tags_are_never_zero_and_carry_the_writer_id() {
        for writer in [0u16, 1, 7, 2047] {
            for token in [0u64, 1, u64::MAX, 0xdead_beef] {
                let tag = holder_tag(writer, token);
                assert_ne!(tag, 0);
                assert_eq!(tag & 0x7FF, u32::from(writer));
            }
        }
        assert_eq!(header_word(3, 0xAB), 3 | (0xAB << 32));
        let parsed = HeaderCopy::parse(&[3, 0, 0, 0, 0xAB, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parsed, Some(copy(3, 0xAB, 1)));
        assert_eq!(parsed.unwrap().word0(), header_word(3, 0xAB));
        assert_eq!(HeaderCopy::parse(&[0; 15]), None, "short read");
    }

    #[test]
    fn only_registers_no_live_client_holds_are_taken() {
        let alive = live(&[(1, 0x111)]);
        let live_tag = holder_tag(1, 0x111);
        let gone = holder_tag(1, 0x999);
        let mine = holder_tag(2, 0x222);
        let j = |copies: &[HeaderCopy], fresh_ok| judge(copies, 2, &alive, mine, fresh_ok, 16);
        // A gone retiree's limbo, its mark on one copy only.
        assert_eq!(j(&[copy(3, gone, 0), copy(3, 0, 0)], false), Verdict::Limbo);
        assert_eq!(
            j(&[copy(3, gone, 0), copy(0, 0, 0), copy(3, 0, 0)], false),
            Verdict::Limbo,
            "a replica that missed the key header"
        );
        // A live retiree's limbo, a live client's pool, this reclaimer's own.
        assert_eq!(
            j(&[copy(3, live_tag, 0), copy(3, 0, 0)], false),
            Verdict::Keep
        );
        assert_eq!(
            j(&[copy(0, live_tag, 0), copy(0, live_tag, 0)], true),
            Verdict::Keep
        );
        assert_eq!(
            j(&[copy(3, mine, 0), copy(3, mine, 0)], false),
            Verdict::Keep
        );
        // A live taker's copy beside a gone retiree's: kept.
        assert_eq!(
            j(&[copy(3, gone, 0), copy(3, live_tag, 0)], false),
            Verdict::Keep
        );
        // Live data: keyed, no tag.
        assert_eq!(j(&[copy(3, 0, 0), copy(3, 0, 0)], true), Verdict::Keep);
        // A gone client's pool: every copy blank.
        assert_eq!(
            j(&[copy(0, gone, 0), copy(0, gone, 0)], false),
            Verdict::Pool
        );
        // ...but a lagging blank copy of a register that was then published is not.
        assert_eq!(j(&[copy(0, gone, 0), copy(3, 0, 0)], true), Verdict::Keep);
        // Never used: only in an adopted chunk.
        assert_eq!(j(&[copy(0, 0, 0), copy(0, 0, 0)], true), Verdict::Fresh);
        assert_eq!(j(&[copy(0, 0, 0), copy(0, 0, 0)], false), Verdict::Keep);
        // Old-format holder marks: a live one keeps, a gone one is fresh in a dead chunk.
        assert_eq!(j(&[copy(0, 0, 0x111), copy(0, 0, 0)], true), Verdict::Keep);
        assert_eq!(j(&[copy(0, 0, 0x999), copy(0, 0, 0)], true), Verdict::Fresh);
        // Too few copies, a malformed length.
        assert_eq!(j(&[copy(3, gone, 0)], false), Verdict::Keep);
        assert_eq!(
            j(&[copy(99, gone, 0), copy(3, gone, 0)], false),
            Verdict::Keep
        );
    }

    /// A donated register is a pool nobody holds once its reset landed on every copy
    /// read; a copy the donor's reset has not reached (its tag, or the key it held)
    /// keeps it.
    #[test]
    fn a_donated_register_is_taken_only_where_its_reset_landed() {
        let donor = holder_tag(1, 0x111);
        let alive = live(&[(1, 0x111)]);
        let mine = holder_tag(2, 0x222);
        let j = |copies: &[HeaderCopy]| judge(copies, 2, &alive, mine, false, 16);
        let tag = donated_tag(7);
        assert!(!alive.tags.contains(&tag) && tag & 0x8000_0000 == 0 && tag != 0);
        assert!(is_donated(tag) && !is_donated(mine) && !is_donated(0));
        let donated = copy(0, tag, 0);
        assert_eq!(j(&[donated, donated]), Verdict::Donated);
        assert_eq!(j(&[donated, donated, donated]), Verdict::Donated);
        // Each donation its own word; the word older builds wrote for every one
        // is still a donation.
        assert_ne!(donated_tag(7), donated_tag(8));
        assert_ne!(donated_tag(0), donated_tag(1));
        let legacy = copy(0, DONATED_TAG, 0);
        assert_eq!(j(&[legacy, legacy]), Verdict::Donated);
        assert_eq!(
            j(&[donated, copy(0, donated_tag(9), 0)]),
            Verdict::Pool,
            "two donations' words: a later donation's reset not landed; through the grace"
        );
        let gone = holder_tag(3, 0x333);
        assert_eq!(
            j(&[donated, copy(0, gone, 0)]),
            Verdict::Pool,
            "taken by a client that is gone since: its pool, through the grace"
        );
        assert_eq!(
            j(&[donated, copy(3, donor, 0)]),
            Verdict::Keep,
            "retired by the donor, reset not landed"
        );
        assert_eq!(
            j(&[donated, copy(3, 0, 0)]),
            Verdict::Keep,
            "the key it held, mark missing"
        );
        assert_eq!(j(&[donated, copy(0, donor, 0)]), Verdict::Keep);
        assert_eq!(
            j(&[donated, copy(0, mine, 0)]),
            Verdict::Keep,
            "taken by this reclaimer already"
        );
    }
}
