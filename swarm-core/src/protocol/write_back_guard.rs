//! Write-back guards: no reader, however long it is paused, writes into a log slot
//! that its writer reused (SWARM §4.5, appendix A).
//!
//! # The hazard
//!
//! A read whose maximum `t` is not known to be on a majority writes it back
//! (`inner_write(t)`, appendix A): it copies `t`'s record into `t`'s slot in the log
//! of `t`'s writer `W` on the replicas that lack it, then MAXes their metadata words.
//! Those buffer writes are plain stores into memory that `W` reuses once `t` is
//! superseded ([`super::slot_recycling`]). The grace there covers a read that posts
//! before its deadline, but nothing bounds how long a thread stays stopped between its
//! deadline check and its stores (SIGSTOP, preemption, a page fault, a VM's stolen
//! time). A write-back that lands after `W` reused the slot garbles the new write's
//! copy on that node. Readers detect a garbled copy (hash and tsp) and never misread
//! it, but enough late write-backs would leave a write with intact copies on fewer
//! than a majority: an acknowledged write lost.
//!
//! # The guard
//!
//! Every writer has a *guard word* on every node ([`crate::layout::GuardTable`];
//! SWARM-KV uses word 7 of the writer's client-table row). A reader that writes back
//! a record of another writer:
//!
//! 1. **raises** its guard: writes `t` into its guard word and waits until a majority
//!    of the nodes acknowledged;
//! 2. **re-reads** a majority of the register's replicas, and gives the write-back
//!    up (the read starts over) if any reply is above `t`;
//! 3. writes `t` back as before;
//! 4. **lowers** the guard (zero on every node, never fenced) once the write-back
//!    returned, failed or was dropped *and* every batch of it completed (below, "The
//!    lower").
//!
//! A client keeps one guard up at a time; a second write-back of the same client waits
//! for the first, and for its lower to complete (below, "The lower"). The writer, before it hands a slot of its limbo
//! back to its allocator, once the slot's grace is over:
//!
//! 5. **reads the guard table** on a majority of the nodes (the first majority to
//!    answer), and keeps every slot whose write some other writer's guard names there;
//! 6. hands the others back a delivery margin after that read completed.
//!
//! # Why no slot is reused under a write-back
//!
//! Say `W` learned at time `T₁` that `t` is superseded (a majority `M₁` of the register's
//! replicas holds words above `t`; words never go down, a reset included), read the
//! guard table at `T₂ > T₁` on a majority `M₂` without finding `t`, and reused `t`'s
//! slot. Take a reader `R` whose write-back of `t` passed step 2. Its guard was on a
//! majority `M₃` of the nodes before its re-read was posted. A node `X` of `M₂ ∩ M₃`
//! answered `W`'s guard read without `t`, so it did so before `R`'s raise reached it,
//! or after `R`'s lower did:
//!
//! * before the raise: `R`'s re-read was posted after its raise completed, so after
//!   `T₂ > T₁`; it read a majority of the register's replicas, which meets `M₁`, and
//!   found a word above `t`; so `R` gave the write-back up at step 2. Contradiction;
//! * after the lower: the lower was posted only once every batch of `R`'s write-back
//!   had completed, or could no longer land (below), so each of those stores landed,
//!   if ever, before the lower's post, hence before `X` answered `W`'s guard read,
//!   which is before `W` reuses the slot (step 6).
//!
//! Neither case depends on how long `R` stops between any two of its instructions: a
//! stop before step 1 or 2 ends in a re-read that sees `t` superseded; a stop after
//! step 2 keeps the guard up, and the slot out of use, for as long as it lasts, and a
//! stop with a write-back batch still in flight keeps it up too (the lower waits for
//! that batch). Neither case assumes anything about time, on any transport: the
//! second rests on an *event* (a completion), never on a delivery margin. A
//! write-back posted by `W` itself needs no guard: `W` reuses a slot only once each
//! of its own batches into it completed or is settled (`OwnBatches` in
//! [`super::slot_recycling`]; docs/pauses.md, H9).
//!
//! # The lower
//!
//! A write-back returns once a majority holds `t`; its batches to the other replicas
//! (the first burst's, a fallback's) may still be in flight: in a queue pair behind a
//! slowly acknowledged request, and over RDMA nothing bounds how late they land while
//! `R`'s process is stopped (its engine gives a queue pair up only while it runs, and
//! the NIC bounds each request's retries, not a queue of requests). So the rounds of
//! a guarded write-back keep the tickets of their batches still outstanding
//! (`Roundtrip::keep_outstanding_in`), and the guard goes down only once each of
//! them is *done*: its completion came back (acknowledged or failed), or the fabric
//! says it can no longer land ([`Fabric::settled`]: a batch that never left the
//! client). A completion is an event that rules the batch out for good: over RDMA a
//! failed ticket means the queue pair went to the error state or was destroyed (the
//! engine aborts it before failing what it holds), so nothing posted on it lands
//! afterwards. The simulator knows more than a client could: it settles a batch
//! once its node executed it or it was lost to a crash (and can fail a lost batch a
//! queue pair timeout after its post, as RDMA does). No time alone lowers a guard.
//!
//! The lower is *deferred*, not awaited: the operation returns with its majority,
//! and a guard whose batches are not all done stays up (with this client's guard
//! busy) until a later look finds them done: the client's next guarded write-back
//! (which must wait for it: one guard word per writer), and its slot-recycling ticks
//! ([`Client::recycle_slots_tick`], a store's per-operation upkeep). So a straggler
//! delays nothing but this client's next write-back of another writer's record, and
//! that one only until the straggler completes: each transport completes a batch
//! within its own bound *from that batch's post* (RDMA: the queue pair's retry
//! window, or the engine's give-up limit under the delivery margin), not from any
//! operation's deadline. A batch whose ticket
//! never completes (a transport that drops a crashed node's batches silently and
//! cannot tell) keeps the guard up, and the writer's slot out of use, for good:
//! liveness, never safety. The raise's batches still in flight are waited for too,
//! though a late raise is safe (it only names `t`): two batches to one node are not
//! ordered (the fabric contract), and a raise landing after the lower would leave the
//! guard naming `t`, its slot out of use, until this client's next raise and lower.
//!
//! The lower itself is waited for too: the guard is free for this client's next
//! raise only once every batch of the lower completed (or is settled). Two batches
//! to one node are not ordered, so a lower still in flight could land after the next
//! raise reached that node and leave the guard word zero there while the next
//! write-back is under way: if it did so on a majority, the writer's guard check
//! would find no guard naming the next `t`, and that write-back's late stores could
//! land in `t`'s reused slot (docs/pauses.md, "Found by the held batches";
//! `sim_recycling`'s held batches met it at seeds 1268, 1906 and 2000, and
//! `tests/write_back_guard.rs` scripts it). The raise's argument above ("its guard
//! was on a majority `M₃` before its re-read was posted") needs the raise to *stay*
//! there until the lower that follows it, which only this client posts.
//!
//! # What it costs, and what it leaves
//!
//! Two roundtrips more on the write-back path only (raise, re-read), which a read
//! takes when its maximum is not yet on a majority: a write in progress or a writer
//! that failed mid-write. The common one-roundtrip read and write are untouched. The
//! writer reads the guard table (one READ of `writers × stride` bytes per node) once
//! per batch of slots leaving their grace. A reader stopped for ever with its guard
//! up holds one slot of one writer out of use until its writer id is taken over (the
//! new owner lowers the guard when it registers). A guard whose lower waits for a
//! batch in flight keeps that slot out of use until the batch completes, and holds
//! this client's next guarded write-back as long (measured in the simulator:
//! docs/measurements.md). Shared memory executes every batch inside the call that
//! posts it: nothing is ever in flight there, and the lower is posted at once, as
//! before.

use alloc::vec::Vec;

use crate::clock::Clock;
use crate::encoding::{Timestamp, Tsp, WriterId};
use crate::fabric::{Batch, Completion, Fabric, Nanos, Submitted, Ticket};
use crate::layout::Layout;
use crate::roundtrip::OpStats;

use super::maxreg::WriteProgress;
use super::quorum::{broadcast, majority, nodes};
use super::register::{RegisterCache, RegisterLoc};
use super::{Client, SwarmError};

/// What a guarded write-back did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GuardedWriteBack {
    /// `t` is on a majority now.
    Written,
    /// A replica holds something above `t`: `t`'s slot may be reused, so nothing was
    /// written back; read the register again.
    Superseded,
}

/// A raised guard: lowered when dropped, whatever the operation's fate, once every
/// batch of its raise and write-back completed ([`Client::finish_guard_lower`]).
struct Raised<'a, F: Fabric, C: Clock> {
    client: &'a Client<F, C>,
    addr: u64,
}

impl<F: Fabric, C: Clock> Drop for Raised<'_, F, C> {
    fn drop(&mut self) {
        // The write-back's steps were dropped before this guard (they live in the
        // futures it awaited, or were dropped with the operation first: the guard is
        // the first local of `guarded_write_back`), so their batches still in flight
        // are in `guard_tickets` by now.
        self.client.guard_lowering.set(Some(self.addr));
        self.client.finish_guard_lower();
    }
}

impl<F: Fabric, C: Clock> Client<F, C> {
    /// Lowers the guard whose lower waits (step 4), if every batch of its raise and
    /// write-back has completed, successfully or not, or can no longer land
    /// ([`Fabric::settled`]); otherwise leaves it up, for a later call (the next
    /// write-back of this client, the slot-recycling tick). The guard is free again
    /// only once the lower's own batches are done as well (module docs, "The
    /// lower"): a lower still in flight could land over this client's next raise.
    /// Returns whether no lower waits or is in flight any more. Never waits.
    pub(crate) fn finish_guard_lower(&self) -> bool {
        if !self.guard_lower_pending() {
            return true;
        }
        let mut tickets = self.guard_tickets.borrow_mut();
        tickets.retain(|&ticket| match self.fabric.poll(ticket) {
            core::task::Poll::Ready(_) => false,
            core::task::Poll::Pending if self.fabric.settled(ticket) => {
                self.fabric.forget(ticket);
                false
            }
            core::task::Poll::Pending => true,
        });
        if !tickets.is_empty() {
            return false;
        }
        if let Some(addr) = self.guard_lowering.take() {
            // Never fenced: a late lower only lets the writer reuse a slot sooner, and
            // it is posted after every batch of the write-back completed.
            for node in nodes(self.table_nodes()) {
                let mut batch = Batch::write(addr, 0u64.to_le_bytes().to_vec());
                if let Submitted::Posted(ticket) =
                    self.fabric.submit(node, &mut batch, &mut Completion::new())
                {
                    tickets.push(ticket);
                }
            }
            if !tickets.is_empty() {
                self.guard_lower_landing.set(true);
                return false;
            }
        }
        self.guard_lower_landing.set(false);
        self.guard_busy.set(false);
        true
    }

    /// Whether this client's guard waits to go down, or its lower is in flight
    /// ([`Self::finish_guard_lower`] has work left).
    pub(crate) fn guard_lower_pending(&self) -> bool {
        self.guard_lowering.get().is_some() || self.guard_lower_landing.get()
    }

    /// Posts the lower of this client's write-back guard if it waits for batches
    /// that are all done now (module docs, "The lower"); returns whether no lower
    /// waits any more. The slot-recycling ticks do it; a client about to stop for
    /// good calls it, driving its fabric between calls, until it returns `true`
    /// (each transport completes a batch within a bound from its post), so that its
    /// guard does not keep a slot of another writer out of use until its writer id
    /// is registered again. Never waits.
    pub fn lower_guard_if_done(&self) -> bool {
        self.finish_guard_lower()
    }

    /// Where this client's guard word is, if a write-back of `t` needs one: the
    /// layout has a guard table and `t` is another writer's.
    pub(crate) fn write_back_guard(&self, t: Tsp) -> Option<u64> {
        if t.ts().writer() == self.writer {
            return None;
        }
        self.layout.guard_addr(self.writer)
    }

    /// Writes `t` (whose payload is `value`) back to a majority of `reg` under this
    /// client's guard word at `guard` (steps 1 to 4 of the module docs).
    pub(crate) async fn guarded_write_back(
        &self,
        reg: &RegisterLoc,
        cache: &mut RegisterCache,
        stats: &OpStats,
        t: Tsp,
        value: &[u8],
        guard: u64,
    ) -> Result<GuardedWriteBack, SwarmError> {
        let _raised = self.raise_guard(stats, t, guard).await?;
        let views = self.read_views(reg, cache, stats, false).await?;
        if views.max().ts() > t.ts() {
            tracing::debug!(
                writer = self.writer.get(),
                tsp = ?t,
                "write-back given up: superseded while the guard went up"
            );
            return Ok(GuardedWriteBack::Superseded);
        }
        let mut progress = WriteProgress::default();
        progress.guarded = true;
        self.inner_write(reg, cache, stats, t, value, &mut progress)
            .await?;
        Ok(GuardedWriteBack::Written)
    }

    /// Raises this client's guard to `t` on a majority of the nodes, once no other
    /// operation of this client has its guard up.
    async fn raise_guard(
        &self,
        stats: &OpStats,
        t: Tsp,
        guard: u64,
    ) -> Result<Raised<'_, F, C>, SwarmError> {
        let busy = &self.guard_busy;
        core::future::poll_fn(|cx| {
            // A guard whose lower waits for its write-back's last batches is free once
            // they completed: an event of the transport, which completes (or gives
            // up) each batch within its own bound from its own post, not a time.
            if !busy.get() || (self.guard_lower_pending() && self.finish_guard_lower()) {
                busy.set(true);
                return core::task::Poll::Ready(Ok(()));
            }
            if let Err(error) = stats.check_fence(&self.fabric) {
                return core::task::Poll::Ready(Err(error));
            }
            // Busy re-poll, as everywhere in this crate (see `crate::exec`).
            cx.waker().wake_by_ref();
            core::task::Poll::Pending
        })
        .await?;
        let raised = Raised {
            client: self,
            addr: guard,
        };
        let n = self.table_nodes();
        let word = t.word().to_le_bytes().to_vec();
        let mut rt = broadcast(&self.fabric, stats, nodes(n), majority(n), |_| {
            Ok(Batch::write(guard, word.clone()))
        })
        .await?;
        rt.keep_outstanding_in(&self.guard_tickets);
        Ok(raised)
    }
}

/// A writer's read of the guard table (steps 5 and 6 of the module docs), judging
/// the slots that left their grace before it was posted.
#[derive(Debug)]
pub(crate) struct GuardCheck {
    started: Nanos,
    /// The writes whose slots this check judges.
    judged: Vec<Timestamp>,
    outstanding: Vec<Ticket>,
    /// The nodes read: `0..nodes` (the guard table's).
    nodes: usize,
    answered: usize,
    /// Writes of this writer that some other writer's guard names.
    named: Vec<Timestamp>,
}

/// What a finished [`GuardCheck`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct GuardVerdict {
    /// Writes whose slots no guard names: reusable a delivery margin from now.
    pub(crate) clear: Vec<Timestamp>,
    /// Writes still named by a guard, or not judged (too few nodes answered).
    pub(crate) kept: Vec<Timestamp>,
}

impl GuardCheck {
    /// Posts a read of the guard table to every node, judging `judged` (`None` if the
    /// layout has no guard table).
    pub(crate) fn start<F: Fabric + ?Sized>(
        fabric: &F,
        layout: &Layout,
        judged: Vec<Timestamp>,
        now: Nanos,
        table_nodes: usize,
    ) -> Option<Self> {
        let (addr, len) = layout.guard_span()?;
        let outstanding = nodes(table_nodes)
            .map(|node| fabric.post(node, Batch::read(addr, len)))
            .collect();
        Some(Self {
            started: now,
            judged,
            outstanding,
            nodes: table_nodes,
            answered: 0,
            named: Vec::new(),
        })
    }

    /// How many writes it judges.
    pub(crate) fn judged(&self) -> usize {
        self.judged.len()
    }

    /// Collects replies; once a majority of the nodes answered (any majority meets
    /// the one each raised guard reached), or `timeout` passed since the check
    /// started, returns the verdict on the slots it judged.
    pub(crate) fn poll<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        layout: &Layout,
        me: WriterId,
        now: Nanos,
        timeout: Nanos,
    ) -> Option<GuardVerdict> {
        let Self {
            outstanding,
            answered,
            named,
            ..
        } = self;
        outstanding.retain(|&ticket| match fabric.poll(ticket) {
            core::task::Poll::Pending => true,
            core::task::Poll::Ready(result) => {
                if let Ok(mut completion) = result
                    && let Some(bytes) = completion.take_read(0)
                {
                    *answered += 1;
                    named.extend(guards_naming(layout, me, &bytes));
                }
                false
            }
        });
        let majority_answered = self.answered >= majority(self.nodes);
        if !majority_answered && now < self.started.saturating_add(timeout) {
            return None;
        }
        for ticket in self.outstanding.drain(..) {
            fabric.forget(ticket);
        }
        let judged = core::mem::take(&mut self.judged);
        if !majority_answered {
            return Some(GuardVerdict {
                clear: Vec::new(),
                kept: judged,
            });
        }
        let (kept, clear) = judged.into_iter().partition(|ts| self.named.contains(ts));
        Some(GuardVerdict { clear, kept })
    }

    /// Abandons the check (the client is going away).
    pub(crate) fn cancel<F: Fabric + ?Sized>(self, fabric: &F) {
        for ticket in self.outstanding {
            fabric.forget(ticket);
        }
    }
}

/// The writes of writer `me` that the guard words in `table` (a read of
/// [`Layout::guard_span`], untrusted) name, other than `me`'s own guard.
fn guards_naming<'a>(
    layout: &'a Layout,
    me: WriterId,
    table: &'a [u8],
) -> impl Iterator<Item = Timestamp> + 'a {
    let stride = layout.guards().map_or(8, |g| g.stride) as usize;
    (0..usize::from(layout.writers()))
        .filter(move |&w| w != usize::from(me.get()))
        .filter_map(move |w| {
            let bytes = table.get(w * stride..w * stride + 8)?;
            let word = u64::from_le_bytes(bytes.try_into().ok()?);
            let t = Tsp::from_word(word);
            (word != 0 && t.ts().writer() == me).then(|| t.ts())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::Flag;
    use alloc::vec;

    fn layout() -> Layout {
        Layout::builder()
            .writers(4)
            .slots_per_writer(8)
            .log_base(1 << 16)
            .write_back_guards(4096, 64)
            .build()
            .unwrap()
    }

    fn ts(ticks: u64, writer: u32) -> Timestamp {
        Timestamp::new(ticks, WriterId::new(writer).unwrap()).unwrap()
    }

    #[test]
    fn a_guard_names_only_writes_of_the_writer_judging() {
        let layout = layout();
        let (addr, len) = layout.guard_span().unwrap();
        assert_eq!((addr, len), (4096, 3 * 64 + 8));
        let mut table = vec![0u8; len as usize];
        let mut put = |w: usize, t: Timestamp| {
            table[w * 64..w * 64 + 8]
                .copy_from_slice(&Tsp::new(t, Flag::Guessed).word().to_le_bytes());
        };
        put(0, ts(10, 1)); // writer 0 writes back writer 1's write 10
        put(2, ts(20, 3)); // writer 2 writes back writer 3's write 20
        put(1, ts(30, 1)); // writer 1's own guard never names its own slots
        let me = WriterId::new(1).unwrap();
        let named: Vec<_> = guards_naming(&layout, me, &table).collect();
        assert_eq!(named, vec![ts(10, 1)]);
        // A short or garbled table names nothing it does not hold.
        assert_eq!(guards_naming(&layout, me, &table[..5]).count(), 0);
    }

    #[test]
    fn the_guard_table_is_checked_when_the_layout_is_built() {
        let bad = |base, stride| {
            Layout::builder()
                .writers(4)
                .write_back_guards(base, stride)
                .build()
        };
        assert!(bad(4096, 0).is_err());
        assert!(bad(4095, 64).is_err());
        assert!(bad(4096, 12).is_err());
        assert!(bad(u64::MAX - 8, 64).is_err());
        let layout = bad(4096, 8).unwrap();
        assert_eq!(
            layout.guard_addr(WriterId::new(3).unwrap()),
            Some(4096 + 24)
        );
        assert_eq!(layout.guard_addr(WriterId::new(4).unwrap()), None);
    }
}
