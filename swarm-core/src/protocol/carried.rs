//! Examining the slots a writer carried over from an earlier incarnation, in the
//! background.
//!
//! A writer resumed from a [`super::summary::LogSummary`] knows *which* slots of its
//! log the earlier incarnations left in use, but not what they hold: which write, for
//! which register; one resumed after a crash ([`super::Client::resume_crashed`])
//! knows nothing and carries every slot. Until it knows, it cannot tell when such a
//! slot's buffer is superseded (SWARM §4.5: a slot is reused once a majority of its
//! register holds a newer value, [`super::slot_recycling`]), so the slot stays taken.
//! Reading every carried slot when the client starts would make the start cost grow
//! with the log again (the very cost the summary and the crash resume remove), so
//! the carried slots are *examined* lazily instead: between operations, a bounded
//! read of a few carried slots at a time ([`EXAMINE_BYTES`] per read) is posted to
//! every node without waiting, and once a majority of nodes answered (or
//! [`CarriedSlots::tick`]'s timeout passed with a majority), for each slot:
//!
//! * its newest valid record of this writer that names its register is handed to
//!   the slot tracker as a write of unknown outcome, exactly as a whole-log resume
//!   does ([`super::Client::resume_scan`]);
//! * the guesser is raised above every tick of this writer in its records and lock
//!   words, before the slot can be freed (the per-slot order `tslock.rs` needs);
//! * a slot with neither a record nor a lock word on any copy read is given back to
//!   the allocator at once: it was never written (see [`super::resume`], "Crash
//!   resume", for why nothing can reach it, and the straggler caveat).
//!
//! Safety does not depend on the pace of the examination: a carried slot is marked
//! used in the allocator from the start and only the examination (empty slots) or
//! the tracker (after the slot-recycling check and the grace) ever frees it. A slot whose
//! copies hold no usable record (torn, locked only, a register the store cannot
//! name) simply stays used, as after a whole-log scan; a read that a majority does
//! not answer in time is retried later. A short-lived client that stops before
//! examining everything passes the rest on in its own summary, still marked used,
//! so successive one-shot clients each examine a bit more.
//!
//! A write that finds the log full with nothing in limbo does not wait for the lazy
//! pace (`Client::wait_for_slot`), and a store whose client resumes a full log makes
//! room before its first operation ([`super::Client::make_room`]): one-shot clients
//! that each inherit the same full log would otherwise never live through a grace.
//! Both examine one step at a time, each followed by a check of the tracked
//! registers, and stop as soon as the slots asked for are free or one is in limbo
//! (a wait for room then waits for it, and learns again if that is not enough): a
//! bounded number of reads, independent of the log's size, when the log holds free or
//! superseded slots (a log that holds only live values is examined to its end).

use alloc::vec::Vec;
use core::ops::Range;
use core::task::Poll;

use crate::encoding::{Timestamp, WriterId};
use crate::fabric::{Batch, Fabric, Nanos, NodeId, Ticket};
use crate::layout::Layout;

use super::quorum::majority;
use super::resume::{SlotUse, record_in_slot};

/// Bytes of log read per examination step on each node (whole slots, at least one).
pub const EXAMINE_BYTES: u64 = 64 << 10;

/// What one finished examination read learned about the slots it covered.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Examined {
    /// Per slot holding one, the newest valid record of this writer that names its
    /// register, on any copy: `(slot, timestamp, register identity)`, to track.
    pub(crate) writes: Vec<(u32, Timestamp, u64)>,
    /// Slots with neither a record nor a lock word on any copy read (a majority of
    /// nodes answered): never written, to free.
    pub(crate) empty: Vec<u32>,
    /// The largest tick count of a timestamp of this writer in a record or a lock
    /// word of any slot covered (0 if none), to raise the guesser above.
    pub(crate) max_ticks: u64,
}

/// The carried slots not examined yet, and the read in flight.
#[derive(Debug, Default)]
pub(crate) struct CarriedSlots {
    /// Carried slots, sorted; those before `next` are examined or being examined.
    pending: Vec<u32>,
    next: usize,
    reading: Option<Reading>,
}

#[derive(Debug)]
struct Reading {
    started: Nanos,
    /// The first slot read, and the indices in `pending` the read covers.
    first_slot: u32,
    covers: Range<usize>,
    outstanding: Vec<Ticket>,
    copies: Vec<Vec<u8>>,
}

impl CarriedSlots {
    /// Slots to examine (sorted, deduplicated by the caller).
    pub(crate) fn new(pending: Vec<u32>) -> Self {
        Self {
            pending,
            ..Self::default()
        }
    }

    /// Carried slots not examined yet (the read in flight included).
    pub(crate) fn remaining(&self) -> usize {
        let reading = self.reading.as_ref().map_or(0, |r| r.covers.len());
        self.pending.len() - self.next + reading
    }

    /// One step, never waiting: collects the replies of the read in flight and, once a
    /// majority of `nodes` answered and either every node did or `timeout` passed
    /// since it was posted, returns what it found (the writes to track) and ends it;
    /// then posts the next read if slots remain.
    pub(crate) fn tick<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        layout: &Layout,
        writer: WriterId,
        now: Nanos,
        timeout: Nanos,
    ) -> Examined {
        let nodes = fabric.node_count();
        let mut found = Examined::default();
        if let Some(reading) = self.reading.as_mut() {
            reading
                .outstanding
                .retain(|&ticket| match fabric.poll(ticket) {
                    Poll::Pending => true,
                    Poll::Ready(result) => {
                        if let Ok(mut completion) = result {
                            reading
                                .copies
                                .push(completion.take_read(0).unwrap_or_default());
                        }
                        false
                    }
                });
            let late = now >= reading.started.saturating_add(timeout);
            if (reading.outstanding.is_empty() || late)
                && let Some(reading) = self.reading.take()
            {
                for ticket in &reading.outstanding {
                    fabric.forget(*ticket);
                }
                if reading.copies.len() >= majority(nodes) {
                    found = self.records(layout, writer, &reading);
                } else {
                    // Not enough copies to learn anything: read these slots again.
                    self.next = reading.covers.start;
                }
            }
        }
        if self.reading.is_none() && self.next < self.pending.len() {
            self.post_next(fabric, layout, writer, now);
        }
        found
    }

    /// Abandons the read in flight (the client is going away).
    pub(crate) fn cancel<F: Fabric + ?Sized>(&mut self, fabric: &F) {
        if let Some(reading) = self.reading.take() {
            for ticket in reading.outstanding {
                fabric.forget(ticket);
            }
            self.next = reading.covers.start;
        }
    }

    fn post_next<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        layout: &Layout,
        writer: WriterId,
        now: Nanos,
    ) {
        let slot_bytes = layout.slot_bytes();
        let first_slot = self.pending[self.next];
        let Some(addr) = layout.slot_addr(writer, first_slot) else {
            // Not a slot of this log (cannot happen for a summary that decoded for
            // this log's size): nothing to examine.
            self.next = self.pending.len();
            return;
        };
        let span = (EXAMINE_BYTES / slot_bytes).max(1);
        let end = self.pending[self.next..]
            .iter()
            .position(|&slot| u64::from(slot - first_slot) >= span)
            .map_or(self.pending.len(), |i| self.next + i);
        let last_slot = self.pending[end - 1];
        let len = (u64::from(last_slot - first_slot) + 1) * slot_bytes;
        let outstanding = (0..fabric.node_count())
            .map(|node| fabric.post(NodeId(node as u16), Batch::read(addr, len as u32)))
            .collect();
        self.reading = Some(Reading {
            started: now,
            first_slot,
            covers: self.next..end,
            outstanding,
            copies: Vec::new(),
        });
        self.next = end;
    }

    /// What the copies of a finished read say about each slot it covers (see
    /// [`Examined`]).
    fn records(&self, layout: &Layout, writer: WriterId, reading: &Reading) -> Examined {
        let slot_bytes = layout.slot_bytes() as usize;
        let mut scratch = Vec::new();
        let mut found = Examined::default();
        for &slot in &self.pending[reading.covers.clone()] {
            let at = (slot - reading.first_slot) as usize * slot_bytes;
            let copies = || {
                reading
                    .copies
                    .iter()
                    .map(move |copy| copy.get(at..at + slot_bytes))
            };
            // A copy too short to hold the slot says nothing: the slot counts as used.
            let mut empty = true;
            for copy in copies() {
                let Some(bytes) = copy else {
                    empty = false;
                    continue;
                };
                let slot_use = SlotUse::parse(bytes);
                empty &= !slot_use.is_used();
                if let Some(ticks) = slot_use.ticks_of(writer) {
                    found.max_ticks = found.max_ticks.max(ticks);
                }
            }
            if empty {
                found.empty.push(slot);
                continue;
            }
            let newest = copies()
                .flatten()
                .filter_map(|bytes| record_in_slot(bytes, layout, writer, &mut scratch))
                .filter(|(ts, _)| layout.slot_of(*ts) == slot)
                .max_by_key(|(ts, _)| *ts);
            if let Some((ts, register)) = newest {
                found.writes.push((slot, ts, register));
            }
        }
        found
    }
}
