//! Timestamp locks (SWARM §3.3, appendix B, Algorithm "split").
//!
//! ```text
//! TRYLOCK(ts, mode):
//!   for each node c in parallel:
//!     seen[c] = ⊥
//!     while seen[c].ts < ts:                 # a word never changes its mode for a ts
//!       prev = c.CAS(expected = seen[c], new = (ts, mode))
//!       seen[c] = (prev == seen[c]) ? (ts, mode) : prev
//!   wait until a majority of c have seen[c].ts >= ts
//!   if any seen[c].ts > ts: return false
//!   if any seen[c] == (ts, opposite(mode)): return false
//!   return true
//! ```
//!
//! Both modes race for a majority of CAS words; they cannot both own one, so
//! `TRYLOCK(ts, READ)` and `TRYLOCK(ts, WRITE)` never both return true (true
//! exclusion, Theorem B.2). Lock words are never unlocked, only relocked at higher
//! timestamps.
//!
//! Placement: Safe-Guess needs one lock per writer (footnote 2 of §3.2) and only ever
//! locks a timestamp that writer used. The CAS word for timestamp `ts` is therefore the
//! first word of `ts`'s out-of-place buffer (see [`crate::layout`]), on every replica
//! of the register: no memory per key, and since writes never touch that word, a
//! recycled slot simply holds an older lock that the loop above climbs over.
//!
//! **Recycled slots (SWARM §4.5, [`super::slot_recycling`]).** One word serves every write
//! that ever uses the slot, so a `TRYLOCK(ts_old, ·)` of an operation that observed a
//! superseded write `ts_old` may reach the word after the slot went to a new write
//! `ts_new`. It can never lock `ts_new`:
//!
//! * the lock word carries the *whole* timestamp (`LockWord` is `ticks | writer |
//!   mode`), and a CAS only ever installs the caller's own `(ts, mode)`;
//! * `ts_new > ts_old`: one writer's timestamps only grow (the guesser is strictly
//!   increasing, [`super::guess`]), and across writer-id reuse it holds *per slot*: a
//!   new incarnation hands a slot of its predecessors' log to its allocator only
//!   after it either scanned the whole log and resumed above every tick found in a
//!   record or a lock word, or examined that slot on a majority and raised its
//!   guesser above every tick of that slot (`carried.rs`); and a crash-resumed one
//!   starts above its predecessor's persisted tick ceiling, above every timestamp it
//!   used ([`super::resume`], "Crash resume"), which covers the lock words too;
//! * so the stale CAS either finds a word `>= ts_new` and stops (its own lock is lost,
//!   which only concerns the superseded `ts_old`), or finds an older word and installs
//!   `(ts_old, mode)` — still below `ts_new`, which `TRYLOCK(ts_new, ·)` climbs over
//!   like any older lock. A lock of `ts_new` is decided only by words holding
//!   `ts_new` itself, so exclusion between `ts_new`'s readers and writer (Theorem
//!   B.2) is untouched, and an older lock never makes `TRYLOCK(ts_new, WRITE)` fail.
//!
//! Besides, the fence and grace of [`super::slot_recycling`] keep stale operations from
//! posting to a slot by the time it is reused; the argument above holds without them.
//! `tests/loom.rs` model-checks both races on one recycled word
//! (`a_stale_trylock_on_a_recycled_slot_*`).

use crate::clock::Clock;
use crate::encoding::{LockMode, LockWord, Timestamp};
use crate::fabric::{Fabric, Op};
use crate::layout::SlotError;
use crate::roundtrip::OpStats;

use super::register::{MAX_REPLICAS, RegisterLoc};
use super::{Client, SwarmError};

impl<F: Fabric, C: Clock> Client<F, C> {
    /// `TRYLOCK(ts, mode)` on the timestamp lock of `ts`'s writer, over the replicas of
    /// `reg`.
    pub async fn trylock(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        ts: Timestamp,
        mode: LockMode,
    ) -> Result<bool, SwarmError> {
        let addr = self
            .layout
            .buffer_addr(ts)
            .ok_or(SwarmError::Slot(SlotError::NoLog(ts.writer())))?;
        let n = reg.replicas.len();
        let q = reg.replicas.quorum();
        let mine = LockWord::new(ts, mode);
        let mut seen = [LockWord::BOTTOM; MAX_REPLICAS];
        let mut failed = [false; MAX_REPLICAS];
        let reached = |seen: &[LockWord; MAX_REPLICAS], p: usize| seen[p].ts() >= Some(ts);
        loop {
            let have = (0..n).filter(|&p| reached(&seen, p)).count();
            if have >= q {
                break;
            }
            let candidates: heapless::Vec<usize, MAX_REPLICAS> = (0..n)
                .filter(|&p| !failed[p] && !reached(&seen, p))
                .collect();
            let expected = seen;
            let rt = self
                .quorum_step(stats, reg, &candidates, q - have, |p, batch| {
                    batch.push(Op::Cas {
                        addr,
                        expected: expected[p].word(),
                        new: mine.word(),
                    })?;
                    Ok(())
                })
                .await?;
            for (node, _) in rt.failures() {
                if let Some(p) = reg.replicas.position(*node) {
                    failed[p] = true;
                }
            }
            for (node, completion) in rt.replies() {
                let Some(p) = reg.replicas.position(*node) else {
                    continue;
                };
                let Some(previous) = completion.cas(0).map(LockWord::from_word) else {
                    continue;
                };
                seen[p] = if previous == expected[p] {
                    mine
                } else {
                    previous
                };
            }
        }
        let opposite = LockWord::new(ts, mode.opposite());
        let lost = seen[..n]
            .iter()
            .any(|s| s.ts() > Some(ts) || *s == opposite);
        Ok(!lost)
    }
}
