//! RAW: the unreplicated baseline with no concurrency control (SWARM §7).
//!
//! One node (the register's primary), data in place only: a write is one WRITE and a
//! read one READ. It gives no consistency under concurrency (a read may see a torn
//! write; this implementation re-reads until the record's hash validates, which is
//! the least a user would expect) and no fault tolerance; it is the latency floor the
//! replicated protocols are measured against.

use crate::clock::Clock;
use crate::encoding::{Flag, Timestamp, Tsp};
use crate::fabric::{Batch, Fabric, FabricError};
use crate::layout::{RECORD_HEADER, decode_record, encode_record};
use crate::roundtrip::{Immediate, OpStats, Roundtrip};

use super::register::RegisterLoc;
use super::{Client, ReadInPlace, ReadValue, SwarmError};

/// How many torn reads RAW retries before giving up.
const RAW_READ_ATTEMPTS: u32 = 64;
/// Torn reads retried at once; later retries first wait (doubling from 1 µs up to
/// [`RAW_MAX_PAUSE_NS`]), so that a writer descheduled in the middle of its record
/// (a client thread preempted on a loaded host) gets about 50 ms to finish it.
const RAW_EAGER_ATTEMPTS: u32 = 4;
/// Longest pause between two torn reads.
const RAW_MAX_PAUSE_NS: u64 = 1_000_000;

impl<F: Fabric, C: Clock> Client<F, C> {
    /// RAW write: the record, in place, on the primary.
    pub async fn raw_write(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        payload: &[u8],
    ) -> Result<(), SwarmError> {
        self.check_payload(payload)?;
        let tsp = Tsp::new(Timestamp::new(1, self.writer)?, Flag::Verified);
        let _deadline = self.arm_at_first_post(stats);
        let mut rt = Roundtrip::start(&self.fabric, stats);
        rt.post(
            reg.replicas.node(0),
            Batch::write(reg.offset(0), encode_record(tsp, payload)),
        )?;
        rt.wait(1).await?;
        Ok(())
    }

    /// [`Self::raw_read`]'s common case as a plain function, on a fabric that
    /// completes batches inside `submit` (shared memory) and with the operation's
    /// deadline armed already (as a SWARM-KV operation arms it from its start): one
    /// READ of the primary whose record validates, its payload handed to `consume`
    /// in place. The record is read into a buffer on the stack where the fabric reads
    /// in place ([`Fabric::read_direct`]), into the client's read buffer
    /// (`super::read_block`), so that no read buffer is zeroed, taken, moved or given
    /// back; otherwise as a batch. The same
    /// checks either way: the fabric's bounds checks of the read, the record's
    /// length against the layout's payload maximum and its xxh3 hash before any
    /// byte of the payload is used (shared memory is untrusted).
    ///
    /// `consume` runs only once the read counts: the record validated and the fence
    /// (checked after the read, as [`Self::read_start`] checks it) passed. `Ok(None)`,
    /// with `consume` not called, when the common case does not apply (another
    /// fabric, no deadline armed, a batch that did not complete, a torn record): the
    /// caller then runs [`Self::raw_read`], which reads again.
    pub fn raw_read_now_with<R>(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<ReadInPlace<R>>, SwarmError> {
        if !stats.is_armed() || !self.fabric.completes_in_submit() {
            return Ok(None);
        }
        let len = self.layout.record_bytes() as usize;
        let node = reg.replicas.node(0);
        let mut step = Immediate::start(&self.fabric, stats)?;
        let mut buffer = self.read_blocks.take();
        let bytes = &mut buffer[..len];
        match step.read_direct(node, reg.offset(0), bytes) {
            Some(Ok(())) => {
                if bytes.iter().take(8).all(|b| *b == 0) {
                    step.complete()?;
                    return Ok(Some(ReadInPlace::Empty));
                }
                let Some(record) = decode_record(bytes, self.layout.payload_max()) else {
                    return Ok(None);
                };
                step.complete()?;
                return Ok(Some(ReadInPlace::Value(consume(record.payload))));
            }
            // Refused or failed at once: as a batch that did not complete.
            Some(Err(_)) => return Ok(None),
            None => {}
        }
        let mut batch = Batch::read(reg.offset(0), len as u32);
        let Some(reply) = step.submit(node, &mut batch) else {
            return Ok(None);
        };
        let Some(bytes) = reply.read_mut(0) else {
            return Ok(None);
        };
        if bytes.iter().take(8).all(|b| *b == 0) {
            step.complete()?;
            return Ok(Some(ReadInPlace::Empty));
        }
        let Some(len) =
            decode_record(bytes, self.layout.payload_max()).map(|record| record.payload.len())
        else {
            return Ok(None);
        };
        // The reply's buffer leaves the step, which `complete` consumes; it goes back
        // to the fabric once consumed.
        let bytes = reply.take_read(0).unwrap_or_default();
        step.complete()?;
        let consumed = consume(&bytes[RECORD_HEADER as usize..RECORD_HEADER as usize + len]);
        self.fabric.give_back(bytes);
        Ok(Some(ReadInPlace::Value(consumed)))
    }

    /// RAW read: the in-place record of the primary.
    pub async fn raw_read(
        &self,
        reg: &RegisterLoc,
        stats: &OpStats,
    ) -> Result<ReadValue, SwarmError> {
        let _deadline = self.arm_at_first_post(stats);
        let node = reg.replicas.node(0);
        for attempt in 0..RAW_READ_ATTEMPTS {
            if let Some(doublings) = attempt.checked_sub(RAW_EAGER_ATTEMPTS) {
                let pause = (1_000u64 << doublings.min(10)).min(RAW_MAX_PAUSE_NS);
                crate::exec::sleep(&self.fabric, pause).await;
            }
            let mut rt = Roundtrip::start(&self.fabric, stats);
            rt.post(
                node,
                Batch::read(reg.offset(0), self.layout.record_bytes() as u32),
            )?;
            rt.wait(1).await?;
            let bytes = rt.replies_mut()[0].1.read_mut(0).unwrap_or_default();
            if bytes.iter().take(8).all(|b| *b == 0) {
                return Ok(ReadValue::Empty);
            }
            let Some(len) =
                decode_record(bytes, self.layout.payload_max()).map(|record| record.payload.len())
            else {
                continue;
            };
            // The payload moves to the front of the buffer it was read into, which
            // becomes the value: no allocation and copy of its own.
            let mut bytes = rt.replies_mut()[0].1.take_read(0).unwrap_or_default();
            bytes.copy_within(RECORD_HEADER as usize..RECORD_HEADER as usize + len, 0);
            bytes.truncate(len);
            return Ok(ReadValue::Value(bytes));
        }
        Err(SwarmError::Fabric(FabricError::NodeFailed {
            node,
            cause: crate::fabric::FailureCause::TimedOut,
        }))
    }
}
