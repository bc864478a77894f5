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
//! The result feeds [`super::Client::resume`].

use alloc::vec;
use alloc::vec::Vec;

use crate::encoding::{LockWord, Timestamp, Tsp, WriterId};
use crate::fabric::{Batch, Fabric, FabricError, Nanos};
use crate::layout::{Layout, SLOT_LOCK_BYTES};
use crate::roundtrip::{MAX_NODES, OpStats};

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
/// [`super::Client::resume`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    /// Slots written or locked in on some node that answered, in increasing order.
    pub used_slots: Vec<u32>,
    /// The largest tick count of a timestamp of this writer found in a record or a
    /// lock word (0 if none).
    pub last_ticks: u64,
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
    let Some(first) = layout.slot_addr(writer, 0) else {
        return Ok(LogScan::default());
    };
    let n = fabric.node_count();
    let slot_bytes = layout.slot_bytes();
    let slots = u64::from(layout.slots_per_writer());
    let total = slots * slot_bytes;
    let per_read = (SCAN_CHUNK / slot_bytes).max(1) * slot_bytes;
    let mut used = vec![false; slots as usize];
    let mut last_ticks = 0;
    // Nodes that missed a deadline earlier in this scan: read, but not waited for.
    let mut late = [false; MAX_NODES];
    let mut offset = 0;
    while offset < total {
        let len = per_read.min(total - offset);
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
            for (i, slot) in data.chunks(slot_bytes as usize).enumerate() {
                let slot = SlotUse::parse(slot);
                if slot.is_used() {
                    used[first_slot + i] = true;
                }
                if let Some(ticks) = slot.ticks_of(writer) {
                    last_ticks = last_ticks.max(ticks);
                }
            }
        }
        offset += len;
    }
    Ok(LogScan {
        used_slots: (0u32..)
            .zip(&used)
            .filter(|(_, used)| **used)
            .map(|(slot, _)| slot)
            .collect(),
        last_ticks,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::encoding::{Flag, LockMode};
    use crate::exec::{block_on, block_on_future};
    use crate::fabric::NodeId;
    use crate::layout::encode_record;
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
                last_ticks: 55
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
}
