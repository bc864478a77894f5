//! Resuming a writer id's out-of-place log after an earlier incarnation of it.
//!
//! The paper never reuses a writer id (a client that crashes is gone for good), but a
//! deployment that hands writer ids out again (a key-value store whose clients come
//! and go) must make the new holder of an id behave as if it were the same writer
//! continuing. Two facts about the earlier incarnation must carry over:
//!
//! * **Its timestamps.** Every timestamp of a writer is used once (appendix C relies
//!   on `(ticks, writer)` naming one write), and a timestamp lock (§3.3) lives in the
//!   slot of that timestamp and is never unlocked: reusing a timestamp would find a
//!   lock taken by a reader of the earlier write, and a timestamp below an earlier
//!   lock word would lose every `TRYLOCK`. The new incarnation starts above both.
//! * **Its slots.** A slot holds the buffer of one write until recycled (§4.3); a
//!   register whose metadata names an earlier write still needs its buffer to be
//!   read. The new incarnation marks every slot the earlier one wrote as used.
//!
//! [`scan_log`] reads the writer's whole log for that. It must not read only a
//! majority: a write the earlier incarnation abandoned (its operation failed or was
//! dropped, its process stopped) may have reached one node only, yet a reader whose
//! majority contains that node sees the write as the register's maximum and needs
//! its buffer and a fresh lock. So the scan posts to every node, waits for a
//! majority (the most it can insist on while `f` nodes may have failed), then waits
//! for each other node up to a deadline and takes the union of everything that
//! arrived. A node that stays silent past the deadline is treated as failed for the
//! rest of the scan; if it was only slow and held the single copy of an abandoned
//! write, that write can still be missed: the deadline is the price of not blocking
//! on a failed node, so it should be generous (a scan runs once, when a client
//! starts).
//!
//! **Recycling its slots.** A slot of the earlier incarnation is taken only while its
//! buffer may still be needed. Each record names the register it was written for
//! (its owner tag, [`crate::layout::encode_record_for`]), so the scan also reports,
//! per slot, the newest valid record of this writer and its register
//! ([`LogScan::resumed`]); [`super::Client::resume_scan`] tracks those as writes of
//! unknown outcome, which the slot-recycling checks free once a majority of their register
//! holds something above them, like any failed write, or once every replica of it
//! holds something below them: the register was reset for reuse since, and no
//! batch of an earlier incarnation can land any more ([`super::slot_recycling`], rule 3).
//! Without that second way out, a log full of the last values of registers that
//! were retired and reset later (a store whose clients come and go) would stay full
//! until those registers happened to be written again. Only older
//! records in the same slot are dead for sure (the slot was reused after them). A
//! slot with no valid record naming its register on any node that answered (a torn
//! or lock-only slot, a register past the owner tag's 32 GiB) stays taken for good.
//!
//! **Bounded resume.** [`scan_log`] reads the whole log on every node (one READ per
//! 4 MiB). A writer that stops *cleanly* knows everything the scan would learn (its
//! used-slot bitmap and its last tick count) and hands it on as a
//! [`super::summary::LogSummary`]; the next incarnation then starts from that bitmap
//! ([`super::Client::resume_summary`]) and examines the slots it marks lazily, in the
//! background. The store decides which summary is trustworthy (swarm-kv's
//! `writer_ids`: a generation word sealed after the summary reached a majority).
//! [`scan_slots`] reads given slot ranges only.
//!
//! **Crash resume** ([`super::Client::resume_crashed`]). A writer that crashed (or
//! was evicted) leaves no summary, but its successor need not read the log first
//! either, if the store keeps a *tick ceiling* per writer id:
//!
//! * **Slots: every slot carried.** The successor marks every slot of the log used
//!   and queues every slot but the tombstone's for the lazy examination of
//!   `carried.rs` (SWARM §4.3: a slot is taken until known free). A slot examined
//!   *empty on every node that answered* (no record, no lock word: any non-zero word
//!   counts as use, as in [`scan_log`]; a majority answered, the others up to the
//!   examination's deadline) is given back at once: no metadata word names a
//!   timestamp of this slot, since a write's buffer reaches each node in the same
//!   ordered batch as, and before, its metadata word, so no operation can fetch,
//!   lock in or write back to it. A slot whose record names a register is tracked
//!   as a write of unknown outcome and freed by slot-recycling checks once superseded,
//!   after the grace (SWARM §4.5, [`super::slot_recycling`]); a slot with no usable record
//!   stays taken (and passes on, like every slot not examined yet, in this writer's
//!   own summary if it stops cleanly). **The straggler caveat is [`scan_log`]'s:**
//!   a node silent past the deadline may hold the single copy of an abandoned write
//!   in a slot the others show empty, and that slot is then reused.
//! * **Timestamps: above a persisted ceiling.** Per-slot knowledge is *not* enough.
//!   Raising the guesser above every tick of a slot before reusing it keeps the
//!   slot's lock word below every new write in it (what `tslock.rs` needs) and keeps
//!   timestamps unique (a timestamp has exactly one slot). But Safe-Guess reads also
//!   rely on a writer's timestamps growing with real time *per register* (appendix
//!   C, Assumption 2: a reader that saw `(t1, w)` and then a larger `(t2, w)`
//!   returns `t1`'s value, concluding that `w` finished `t1` before writing `t2`).
//!   A successor that writes `t1` on register `R` below an abandoned `t2` of its
//!   predecessor on one node of `R`, whose slot it has not examined yet, breaks
//!   that: a reader sees `t1`, then `t2` (its strong read writes `t2` back to a
//!   majority) and returns `t1`; another reader returns `t2` after it (the dead
//!   writer never WRITE-locks `t2`, so a READ lock succeeds); the successor's slow
//!   path then WRITE-locks `t1` (nobody READ-locked it) and rewrites `t1`'s value
//!   above `t2`, which a third reader returns: `v1, v2, v1` in real-time order, with
//!   one write of each value, is not linearizable. So the successor must start above
//!   *every* tick its predecessor used before its first write, which a lazy
//!   examination cannot give. The store therefore keeps a ceiling word per writer id
//!   on every node: [`super::Client::set_tick_ceiling`] makes the writer raise it on
//!   a majority (by CAS, never lowering it on any node) before it uses a timestamp
//!   above it, `headroom` ticks at a time, and the successor reads it from a majority
//!   and resumes above the largest value (a lock word names only a timestamp its
//!   writer used, so locks are covered too). This has no straggler caveat: every
//!   raise reached a majority, and every majority read meets it. The examination
//!   still raises the guesser per examined slot before freeing it (for a caller that
//!   resumes from a lower bound).
//!
//! Start-up then costs the ceiling read and, since the log is full (every slot is
//! carried), examination steps of 64 KiB per node (`carried.rs`) until a slot is
//! free or one is in limbo (`Client::wait_for_slot`), not the log. [`scan_log`]
//! remains for stores without a ceiling (swarm-kv clusters made before superblock
//! version 4), for the checker and for tests.
//!
//! A bound on the *slots* read by ticks instead (the successor scanning the slots
//! [`slots_of_ticks`] of the earlier incarnation's tick range) does not work with
//! this log: the slot of write `ts` is `xxh3(ts) mod slots`, so a long-lived
//! writer's tick range covers the whole log, and the carried slots of still earlier
//! incarnations must be persisted anyway. After a crash, every slot is carried.
//!
//! A scan's result feeds [`super::Client::resume`] or [`super::Client::resume_scan`].

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::encoding::{LockWord, Timestamp, Tsp, WriterId};
use crate::fabric::{Batch, Fabric, FabricError, Nanos};
use crate::layout::{Layout, SLOT_LOCK_BYTES, decode_record};
use crate::roundtrip::{MAX_CLUSTER_NODES, OpStats};

use super::quorum::{broadcast_until, majority};

/// Bytes read per READ while scanning a log (whole slots only).
const SCAN_CHUNK: u64 = 4 << 20;

/// What one copy of a log slot says about its use (bytes from untrusted memory: no
/// validation beyond reading two words, and any non-zero word counts as use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotUse {
    /// The timestamp-lock word, if any reader or writer ever locked in this slot.
    pub lock: LockWord,
    /// The tsp of the record in the slot, [`Tsp::EMPTY`] if none was ever written.
    pub record: Tsp,
}

impl SlotUse {
    /// Reads one copy of a slot: its lock word, then its record, whose tsp is the
    /// record's first word (see [`crate::layout`]). Missing bytes read as zero.
    pub fn parse(slot: &[u8]) -> Self {
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            if let Some(src) = slot.get(at..at + 8) {
                bytes.copy_from_slice(src);
            }
            u64::from_le_bytes(bytes)
        };
        Self {
            lock: LockWord::from_word(word(0)),
            record: Tsp::from_word(word(SLOT_LOCK_BYTES as usize)),
        }
    }

    /// Whether the slot was ever written or locked in.
    pub fn is_used(&self) -> bool {
        self.lock != LockWord::BOTTOM || !self.record.is_empty()
    }

    /// The largest tick count of a timestamp of `writer` that this copy names, in
    /// its record or its lock word (tombstones excluded: their timestamp is the same
    /// for every delete and above every write). Words naming another writer are
    /// garbage in `writer`'s log and are ignored here (the slot still counts as used).
    pub fn ticks_of(&self, writer: WriterId) -> Option<u64> {
        let record = (!self.record.is_empty()).then(|| self.record.ts());
        [record, self.lock.ts()]
            .into_iter()
            .flatten()
            .filter(|ts: &Timestamp| ts.writer() == writer && !ts.is_tombstone())
            .map(Timestamp::ticks)
            .max()
    }
}

/// What an earlier incarnation left in a writer's log: the input of
/// [`super::Client::resume`] and [`super::Client::resume_scan`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    /// Slots written or locked in on some node that answered, in increasing order.
    pub used_slots: Vec<u32>,
    /// The largest tick count of a timestamp of this writer found in a record or a
    /// lock word (0 if none).
    pub last_ticks: u64,
    /// Per used slot with one, the newest valid record of this writer (tombstones
    /// excluded) that names its register, in increasing slot order.
    pub resumed: Vec<ResumedWrite>,
}

/// A write of an earlier incarnation found in its log (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumedWrite {
    /// The slot holding its buffer.
    pub slot: u32,
    /// The write's timestamp.
    pub ts: Timestamp,
    /// The identity of the register it was written for ([`crate::RegisterLoc::id`];
    /// from untrusted memory: the caller maps it to a register or ignores it).
    pub register: u64,
}

/// Scans `writer`'s log on every node of `fabric` (see the module docs): waits for a
/// majority of nodes per READ, then for each straggler up to `straggler_ns` on the
/// fabric's clock; a node that misses a deadline is not waited for again in this
/// scan. Returns an empty scan if `writer` has no log in `layout`.
///
/// Fails with [`FabricError::NotEnoughLiveNodes`] (or stalls, on a fabric whose
/// failed nodes never answer) when no majority of nodes answers.
pub async fn scan_log<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    layout: &Layout,
    writer: WriterId,
    straggler_ns: Nanos,
) -> Result<LogScan, FabricError> {
    let all = 0..layout.slots_per_writer();
    let ranges = core::slice::from_ref(&all);
    scan_slots(fabric, stats, layout, writer, ranges, straggler_ns).await
}

/// The slots that the writes of `writer` with ticks in `ticks` can occupy, as sorted,
/// disjoint, coalesced ranges: `[0, slots)` when the range has at least as many ticks
/// as the log has slots. This is the part of the log that a bounded resume must read
/// for an incarnation whose timestamps are known to lie in `ticks` (see the module
/// docs, "Towards a bounded scan"); ticks outside `1..=MAX_TICKS` have no slot.
pub fn slots_of_ticks(
    layout: &Layout,
    writer: WriterId,
    ticks: core::ops::RangeInclusive<u64>,
) -> Vec<Range<u32>> {
    let slots = layout.slots_per_writer();
    let (first, last) = (
        *ticks.start(),
        (*ticks.end()).min(crate::encoding::MAX_TICKS),
    );
    let first = first.max(1);
    if first > last {
        return Vec::new();
    }
    if last - first >= u64::from(slots) - 1 {
        return alloc::vec![Range {
            start: 0,
            end: slots,
        }];
    }
    let mut hit: Vec<u32> = (first..=last)
        .filter_map(|t| Timestamp::new(t, writer).ok())
        .map(|ts| layout.slot_of(ts))
        .collect();
    hit.sort_unstable();
    hit.dedup();
    let mut ranges: Vec<Range<u32>> = Vec::new();
    for slot in hit {
        match ranges.last_mut() {
            Some(r) if r.end == slot => r.end = slot + 1,
            _ => ranges.push(slot..slot + 1),
        }
    }
    ranges
}

/// Like [`scan_log`], but reads only the slots in `ranges` (sorted, disjoint; parts
/// beyond the log are ignored): slots outside them are neither read nor reported.
/// Reads `slot_bytes` times the slots in `ranges` from each node, in READs of at most
/// 4 MiB.
pub async fn scan_slots<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    layout: &Layout,
    writer: WriterId,
    ranges: &[Range<u32>],
    straggler_ns: Nanos,
) -> Result<LogScan, FabricError> {
    let Some(first) = layout.slot_addr(writer, 0) else {
        return Ok(LogScan::default());
    };
    let n = fabric.node_count();
    let slot_bytes = layout.slot_bytes();
    let slots = u64::from(layout.slots_per_writer());
    let total = slots * slot_bytes;
    let per_read = (SCAN_CHUNK / slot_bytes).max(1) * slot_bytes;
    let mut used = vec![false; slots as usize];
    let mut newest: Vec<Option<(Timestamp, u64)>> = vec![None; slots as usize];
    let mut record = Vec::new();
    let mut last_ticks = 0;
    // Nodes that missed a deadline earlier in this scan: read, but not waited for.
    let mut late = [false; MAX_CLUSTER_NODES];
    let reads = ranges.iter().flat_map(|r| {
        let start = u64::from(r.start) * slot_bytes;
        let end = (u64::from(r.end) * slot_bytes).min(total);
        (start..end)
            .step_by(per_read as usize)
            .map(move |offset| (offset, per_read.min(end - offset)))
    });
    for (offset, len) in reads {
        let rt = broadcast_until(
            fabric,
            stats,
            majority(n),
            straggler_ns,
            |_| Ok(Some(Batch::read(first + offset, len as u32))),
            |replies| {
                (0..n)
                    .filter(|&i| !late.get(i).copied().unwrap_or(true))
                    .all(|i| replies.iter().any(|(node, _)| node.index() == i))
            },
        )
        .await?;
        for (i, flag) in late.iter_mut().enumerate().take(n) {
            *flag |= !rt.replies().iter().any(|(node, _)| node.index() == i);
        }
        let first_slot = (offset / slot_bytes) as usize;
        for (_, completion) in rt.replies() {
            let Some(data) = completion.read(0) else {
                continue;
            };
            for (i, bytes) in data.chunks(slot_bytes as usize).enumerate() {
                let slot = SlotUse::parse(bytes);
                if slot.is_used() {
                    used[first_slot + i] = true;
                }
                if let Some(ticks) = slot.ticks_of(writer) {
                    last_ticks = last_ticks.max(ticks);
                }
                // The newest valid record of this writer naming its register.
                if let Some((ts, register)) = record_in_slot(bytes, layout, writer, &mut record)
                    && newest[first_slot + i].is_none_or(|(seen, _)| ts > seen)
                {
                    newest[first_slot + i] = Some((ts, register));
                }
            }
        }
    }
    Ok(LogScan {
        used_slots: (0u32..)
            .zip(&used)
            .filter(|(_, used)| **used)
            .map(|(slot, _)| slot)
            .collect(),
        last_ticks,
        resumed: (0u32..)
            .zip(&newest)
            .filter_map(|(slot, found)| {
                found.map(|(ts, register)| ResumedWrite { slot, ts, register })
            })
            .collect(),
    })
}

/// The write of `writer` (not a tombstone) whose valid record one copy of a slot
/// (`slot`: lock word then record, from untrusted memory) holds, with the register its
/// record names; `None` for an empty, torn, foreign or ownerless record. `scratch` is
/// reused between calls.
pub(crate) fn record_in_slot(
    slot: &[u8],
    layout: &Layout,
    writer: WriterId,
    scratch: &mut Vec<u8>,
) -> Option<(Timestamp, u64)> {
    scratch.clear();
    scratch.extend_from_slice(slot.get(SLOT_LOCK_BYTES as usize..).unwrap_or(&[]));
    let record = decode_record(scratch, layout.payload_max())?;
    let register = record.owner?;
    let ts = record.tsp.ts();
    (ts.writer() == writer && !ts.is_tombstone()).then_some((ts, register))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::encoding::{Flag, LockMode};
    use crate::exec::{block_on, block_on_future};
    use crate::fabric::NodeId;
    use crate::layout::{encode_record, encode_record_for};
    use crate::mem::MemCluster;
    use crate::roundtrip::Roundtrip;

    fn layout() -> Layout {
        Layout::builder()
            .payload_max(16)
            .meta_words(1)
            .log_base(0)
            .writers(2)
            .slots_per_writer(8)
            .build()
            .unwrap()
    }

    fn ts(ticks: u64, writer: u32) -> Timestamp {
        Timestamp::new(ticks, WriterId::new(writer).unwrap()).unwrap()
    }

    fn poke(fabric: &impl Fabric, node: u16, addr: u64, data: Vec<u8>) {
        let stats = OpStats::new();
        block_on_future(fabric, async {
            let mut rt = Roundtrip::start(fabric, &stats);
            rt.post(NodeId(node), Batch::write(addr, data)).unwrap();
            rt.wait(1).await.unwrap();
        })
        .unwrap();
    }

    #[test]
    fn a_slot_is_used_by_a_record_or_a_lock_and_names_its_ticks() {
        let w = WriterId::new(1).unwrap();
        assert_eq!(SlotUse::parse(&[0; 64]), SlotUse::default());
        assert!(!SlotUse::parse(&[0; 64]).is_used());
        assert_eq!(
            SlotUse::parse(&[]).ticks_of(w),
            None,
            "short copies read as 0"
        );

        let mut slot = vec![0u8; 8];
        slot.extend(encode_record(Tsp::new(ts(40, 1), Flag::Verified), b"v"));
        let parsed = SlotUse::parse(&slot);
        assert!(parsed.is_used());
        assert_eq!(parsed.ticks_of(w), Some(40));

        let locked = LockWord::new(ts(70, 1), LockMode::Read)
            .word()
            .to_le_bytes();
        slot[..8].copy_from_slice(&locked);
        assert_eq!(
            SlotUse::parse(&slot).ticks_of(w),
            Some(70),
            "the lock is later"
        );
        assert_eq!(
            SlotUse::parse(&locked).ticks_of(w),
            Some(70),
            "a lock without a record"
        );

        let tomb = Tsp::new(Timestamp::tombstone(w), Flag::Verified);
        let mut slot = vec![0u8; 8];
        slot.extend(encode_record(tomb, b""));
        assert!(SlotUse::parse(&slot).is_used());
        assert_eq!(
            SlotUse::parse(&slot).ticks_of(w),
            None,
            "tombstones have no ticks"
        );

        let mut slot = vec![0u8; 8];
        slot.extend(encode_record(Tsp::new(ts(90, 0), Flag::Guessed), b""));
        assert!(SlotUse::parse(&slot).is_used());
        assert_eq!(
            SlotUse::parse(&slot).ticks_of(w),
            None,
            "another writer's tsp in this log is garbage"
        );
    }

    #[test]
    fn the_scan_takes_the_union_of_every_node_that_answers() {
        let layout = layout();
        let cluster = MemCluster::new(3, 4096);
        let fabric = crate::fabric::FailNodes::new(cluster.client());
        let w = WriterId::new(1).unwrap();
        let slot = |s| layout.slot_addr(w, s).unwrap();
        // Slot 2 holds a record on node 0 only, slot 5 a lock on node 2 only, and
        // writer 0's log (not scanned) a later record.
        poke(
            &fabric,
            0,
            slot(2) + 8,
            encode_record(Tsp::new(ts(30, 1), Flag::Guessed), b"x"),
        );
        poke(
            &fabric,
            2,
            slot(5),
            LockWord::new(ts(55, 1), LockMode::Write)
                .word()
                .to_le_bytes()
                .to_vec(),
        );
        let other = layout.slot_addr(WriterId::new(0).unwrap(), 3).unwrap();
        poke(
            &fabric,
            1,
            other + 8,
            encode_record(Tsp::new(ts(99, 0), Flag::Guessed), b"y"),
        );
        let stats = OpStats::new();
        let scan = block_on(&fabric, scan_log(&fabric, &stats, &layout, w, 1_000)).unwrap();
        assert_eq!(
            scan,
            LogScan {
                used_slots: vec![2, 5],
                last_ticks: 55,
                resumed: vec![],
            }
        );

        // A failed node is waited for until the deadline only, once.
        fabric.fail_node(NodeId(2));
        let scan = block_on(&fabric, scan_log(&fabric, &stats, &layout, w, 1_000)).unwrap();
        assert_eq!(scan.used_slots, [2]);
        assert_eq!(scan.last_ticks, 30);

        // A writer without a log has nothing to resume.
        let none = WriterId::new(7).unwrap();
        let scan = block_on(&fabric, scan_log(&fabric, &stats, &layout, none, 1_000)).unwrap();
        assert_eq!(scan, LogScan::default());
    }

    /// Counts the bytes READ through it (the cost of a scan).
    struct CountReads<F> {
        inner: F,
        bytes: core::cell::Cell<u64>,
    }

    impl<F: Fabric> Fabric for CountReads<F> {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> crate::fabric::Ticket {
            for op in batch.ops() {
                if let crate::fabric::Op::Read { len, .. } = op {
                    self.bytes.set(self.bytes.get() + u64::from(*len));
                }
            }
            self.inner.post(node, batch)
        }
        fn poll(
            &self,
            ticket: crate::fabric::Ticket,
        ) -> core::task::Poll<Result<crate::fabric::Completion, FabricError>> {
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: crate::fabric::Ticket) {
            self.inner.forget(ticket)
        }
        fn progress(&self) -> bool {
            self.inner.progress()
        }
        fn now(&self) -> Nanos {
            self.inner.now()
        }
        fn wake_at(&self, deadline: Nanos) {
            self.inner.wake_at(deadline)
        }
    }

    #[test]
    fn slots_of_ticks_covers_each_tick_and_falls_back_to_the_whole_log() {
        let layout = layout();
        let w = WriterId::new(1).unwrap();
        let ranges = slots_of_ticks(&layout, w, 100..=102);
        let covered = |slot: u32| ranges.iter().any(|r| r.contains(&slot));
        for t in 100..=102 {
            assert!(covered(layout.slot_of(ts(t, 1))), "tick {t} not covered");
        }
        // Exactly the slots of those ticks: a superset would read slots in vain.
        let mut want: Vec<u32> = (100..=102).map(|t| layout.slot_of(ts(t, 1))).collect();
        want.sort_unstable();
        want.dedup();
        let got: Vec<u32> = ranges.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(got, want, "{ranges:?}");
        let six = slots_of_ticks(&layout, w, 200..=205);
        let mut want: Vec<u32> = (200..=205).map(|t| layout.slot_of(ts(t, 1))).collect();
        want.sort_unstable();
        want.dedup();
        let got: Vec<u32> = six.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(got, want, "{six:?}");
        assert!(
            ranges.windows(2).all(|p| p[0].end < p[1].start),
            "{ranges:?}"
        );
        assert_eq!(
            slots_of_ticks(&layout, w, 1..=8),
            [Range { start: 0, end: 8 }]
        );
        assert!(
            slots_of_ticks(&layout, w, 0..=0).is_empty(),
            "tick 0 is no write"
        );
        let (hi, lo) = (9, 5);
        assert!(slots_of_ticks(&layout, w, hi..=lo).is_empty());
    }

    #[test]
    fn a_bounded_scan_reads_and_reports_only_its_slots() {
        let layout = layout();
        let cluster = MemCluster::new(3, 4096);
        let fabric = CountReads {
            inner: cluster.client(),
            bytes: core::cell::Cell::new(0),
        };
        let w = WriterId::new(1).unwrap();
        let slot = |s| layout.slot_addr(w, s).unwrap();
        for (s, ticks) in [(1, 11), (3, 33), (6, 66)] {
            poke(
                &fabric,
                1,
                slot(s) + 8,
                encode_record_for(Tsp::new(ts(ticks, 1), Flag::Guessed), Some(4096), b"v"),
            );
        }
        let stats = OpStats::new();
        fabric.bytes.set(0);
        let scan = block_on(
            &fabric,
            scan_slots(&fabric, &stats, &layout, w, &[0..2, 3..4], 1_000),
        )
        .unwrap();
        assert_eq!(scan.used_slots, [1, 3], "slot 6 is outside the ranges");
        assert_eq!(scan.last_ticks, 33);
        assert_eq!(scan.resumed.len(), 2);
        assert_eq!(
            fabric.bytes.get(),
            3 * 3 * layout.slot_bytes(),
            "three slots from each of three nodes"
        );

        fabric.bytes.set(0);
        let whole = block_on(&fabric, scan_log(&fabric, &stats, &layout, w, 1_000)).unwrap();
        assert_eq!(whole.used_slots, [1, 3, 6]);
        assert_eq!(fabric.bytes.get(), 3 * 8 * layout.slot_bytes());
    }
}
