//! DM-ABD: the ABD baseline on disaggregated memory (SWARM §2.3, §7 "Baselines").
//!
//! ```text
//! WRITE(v): m = M.READ_weak(); M.WRITE(((m.ts.counter+1, tid), v))   # 2 roundtrips
//! READ():   return M.READ().v                                        # 2 roundtrips
//! ```
//!
//! It uses the same reliable max register and In-n-Out words as Safe-Guess but keeps
//! data out of place only, so a read needs the metadata first and the buffer second.
//! Every tuple is written VERIFIED: ABD timestamps are always fresh.

use crate::clock::Clock;
use crate::encoding::{Flag, Tsp};
use crate::fabric::Fabric;
use crate::roundtrip::OpStats;

use super::maxreg::WriteProgress;
use super::register::{RegisterCache, RegisterLoc};
use super::{Client, ReadValue, SwarmError, WriteOutcome};

impl<F: Fabric, C: Clock> Client<F, C> {
    /// DM-ABD `WRITE(payload)`.
    pub async fn abd_write(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        payload: &[u8],
    ) -> Result<WriteOutcome, SwarmError> {
        self.check_payload(payload)?;
        let _deadline = self.arm_deadline(stats);
        let _slot = self.write_slot(reg).await;
        let m = self.max_read_weak(reg, cache, stats).await?;
        if m.is_tombstone() {
            // The weak read may have seen the tombstone on a minority only: make the
            // delete take effect before reporting it (one more roundtrip, this path only).
            self.inner_write(reg, cache, stats, m, &[], &mut WriteProgress::default())
                .await?;
            self.settle(reg, stats, m)?;
            return Ok(WriteOutcome::Deleted);
        }
        let next = if m.is_empty() { 1 } else { m.ts().ticks() + 1 };
        let ts = self
            .allocate_waiting(stats, || self.allocate_ts(next))
            .await?;
        self.track(reg, ts);
        let v = Tsp::new(ts, Flag::Verified);
        self.inner_write(reg, cache, stats, v, payload, &mut WriteProgress::default())
            .await?;
        // `v` is on a majority: this writer's earlier writes here are superseded.
        self.settle(reg, stats, v)?;
        Ok(WriteOutcome::Written)
    }

    /// DM-ABD `READ()`.
    pub async fn abd_read(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
    ) -> Result<ReadValue, SwarmError> {
        let _deadline = self.arm_deadline(stats);
        let (m, value) = self.max_read(reg, cache, stats, false).await?;
        Ok(if m.is_void() {
            ReadValue::Empty
        } else if m.is_tombstone() {
            ReadValue::Deleted
        } else {
            ReadValue::Value(value)
        })
    }
}
