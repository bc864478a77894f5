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
//! Once retired, a register is unreachable for new operations: the index no longer
//! maps it (decided on a majority), and the only other way to name it is a location
//! cache entry. Entries are used only while younger than `cache_ttl_ns` after the
//! index lookup that vouched for them began (`crate::cache`), and that lookup began
//! before the unmapping. An operation posts nothing after its start + `max_op_ns`
//! (the operation deadline, contract "fence"). So no operation that can name the
//! register posts anything later than `cache_ttl_ns + max_op_ns` after it was
//! retired, measured on the other clients' clocks. The owner waits
//! `swarm_core::reclaim::grace_ns(cache_ttl_ns + max_op_ns)` on its own clock: the sum plus an eighth
//! (clock rates differ by less than 1/8) plus 10 ms for batches still in flight.
//!
//! Who enforces the deadline: the KV client between its steps
//! (`KvClient::fence`), the index before each CAS (`Index::remove_until` and
//! friends), and the register protocol inside its own steps: `swarm_core`'s
//! operation fence (the deadline armed on the operation's `OpStats`, checked by
//! `Roundtrip::post` and `post_background_for`), so that a client paused *inside* a
//! register read or write (say before a read's write-back CAS) posts nothing to a
//! register that may have been recycled meanwhile.
//!
//! # How: the reset, on every replica
//!
//! After the grace the owner *resets* the register on **all** its replicas: key
//! header, in-place record header and metadata words back to zero, as fresh memory
//! is. A quorum is not enough: a replica that kept the old metadata (a tombstone with
//! a high timestamp) would, in some later quorum, make the next key's value read as
//! deleted or older. A replica that does not answer keeps the register out of the
//! pool (a failed one makes the owner retire it again and retry after another
//! grace; a silent one keeps it forever: a leak bounded by what that node holds,
//! never a safety problem). Only then is the register handed to the allocator as
//! *pre-cleared* (`crate::register_alloc`), which is what an insert needs to write it
//! in one roundtrip (SWARM §5.3.1).
//!
//! # Why a reused register is never confused with its old life
//!
//! * *Stale blind writes and stale CAS expectations*: by the grace, no operation
//!   that could name the register posts anything to it any more (above). Without
//!   that, a write with an expectation of the old metadata words could land on the
//!   new key, since a reset brings the words back down.
//! * *Read as the old key*: payloads carry their key and a read checks it; the key
//!   header is zeroed on every replica by the reset and rewritten by the next insert
//!   before the register is indexed, so the index's header checks see the new key
//!   only.
//! * *Slot recycling* (contract 4): metadata words only ever go up, except by this
//!   reset, which happens only once no operation can reach the register.
//!
//! # What is not recycled (leaks, counted nowhere yet)
//!
//! * a delete whose unmap failed (contention, a lost majority, the deadline): the
//!   mapping `key → tombstone` stays until an insert of that key replaces it (then
//!   the replacer retires the register) or an update/delete of it unmaps it; a key
//!   never touched again keeps its register;
//! * an insert whose index call could not tell whether it mapped the fresh register
//!   (`OutcomeUnknown`, contention, an error): the register may be published, so it
//!   is kept;
//! * the limbo queue and the pool live in the client's memory: a client that dies
//!   *or closes* loses them. The unused rest of its chunks, and its pooled registers
//!   that lie in its own chunks, come back through chunk adoption
//!   ([`crate::orphans`], which relies on the holder mark the reset leaves); its
//!   limbo (registers still holding a key) does not, so a one-shot `swarm delete`
//!   process still leaks the register it retired.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::task::Poll;

use swarm_core::fabric::{Batch, Nanos, NodeId, Op, Ticket};
use swarm_core::layout::RECORD_HEADER;
use swarm_core::{Fabric, RegisterLoc};

use crate::RegisterId;
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
    /// Found free in a dead client's chunk that this client adopted
    /// (`crate::orphans`).
    Adopted,
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
}

#[derive(Debug)]
struct Limbo {
    register: RegisterId,
    due: Nanos,
}

#[derive(Debug)]
struct Reset {
    register: RegisterId,
    /// Replicas whose reset has not answered yet.
    pending: Vec<(NodeId, Ticket)>,
    failed: bool,
}

#[derive(Debug, Default)]
struct State {
    limbo: VecDeque<Limbo>,
    resetting: Vec<Reset>,
    stats: RecycleStats,
}

/// One client's retired registers: see the module docs.
#[derive(Debug)]
pub struct Recycler {
    grace_ns: Nanos,
    /// The owner's incarnation token, left in every register it resets (the holder
    /// mark, see [`reset_batch`]).
    holder: u64,
    state: RefCell<State>,
}

impl Recycler {
    /// A recycler that waits `grace_ns` before resetting a retired register, for the
    /// client incarnation whose token is `holder`.
    pub fn new(grace_ns: Nanos, holder: u64) -> Self {
        Self {
            grace_ns,
            holder,
            state: RefCell::new(State::default()),
        }
    }

    /// The grace, ns.
    pub fn grace_ns(&self) -> Nanos {
        self.grace_ns
    }

    /// The counters.
    pub fn stats(&self) -> RecycleStats {
        self.state.borrow().stats
    }

    /// Registers retired and not yet handed back (in limbo or being reset).
    pub fn in_limbo(&self) -> usize {
        let s = self.state.borrow();
        s.limbo.len() + s.resetting.len()
    }

    /// When the oldest retired register is due for its reset, if any is waiting.
    pub fn next_due(&self) -> Option<Nanos> {
        self.state.borrow().limbo.front().map(|l| l.due)
    }

    /// Whether resets are in flight (a caller waiting for a register polls again).
    pub fn resetting(&self) -> bool {
        !self.state.borrow().resetting.is_empty()
    }

    /// Retires `register` at time `now` (see the module docs for who may).
    pub fn retire(&self, register: RegisterId, now: Nanos, why: Retired) {
        let mut s = self.state.borrow_mut();
        s.stats.retired += 1;
        let due = now.saturating_add(self.grace_ns);
        tracing::trace!(register, ?why, due, "register retired");
        s.limbo.push_back(Limbo { register, due });
    }

    /// Polls the resets in flight and starts those of registers whose grace passed.
    /// Returns the registers now reset on every replica: pre-cleared, ready for the
    /// allocator. Never waits. `loc` gives a register's replicas and address.
    ///
    /// `may_start`: whether the owner's lease is valid now. A reset is a write that
    /// no operation deadline covers, so it is started only under a valid lease: then
    /// a client whose lease was killed (a zombie) posts no reset after its lease
    /// ended, and a reclaimer that adopts its chunks (`crate::orphans`) can rely on
    /// the lease argument (`crate::lease`) for resets too.
    pub fn step<F: Fabric>(
        &self,
        fabric: &F,
        layout: &NodeLayout,
        may_start: bool,
        loc: impl Fn(RegisterId) -> Option<RegisterLoc>,
    ) -> Vec<RegisterId> {
        let mut s = self.state.borrow_mut();
        if s.limbo.is_empty() && s.resetting.is_empty() {
            // The common case: no clock read.
            return Vec::new();
        }
        let now = fabric.now();
        // Start the resets that are due.
        let mut started = 0;
        while may_start
            && started < RESETS_PER_STEP
            && s.limbo.front().is_some_and(|l| l.due <= now)
            && let Some(Limbo { register, .. }) = s.limbo.pop_front()
        {
            started += 1;
            let (Some(loc), Some(batch)) =
                (loc(register), reset_batch(layout, register, self.holder))
            else {
                // Not a register of this layout: nothing to recycle.
                tracing::warn!(register, "recycler: no such register; dropped");
                continue;
            };
            let pending = loc
                .replicas
                .nodes()
                .iter()
                .map(|&node| (node, fabric.post(node, batch.clone())))
                .collect();
            s.resetting.push(Reset {
                register,
                pending,
                failed: false,
            });
        }
        // Collect what answered.
        let mut ready = Vec::new();
        let mut i = 0;
        while i < s.resetting.len() {
            let reset = &mut s.resetting[i];
            reset.pending.retain(|&(node, ticket)| match fabric.poll(ticket) {
                Poll::Pending => true,
                Poll::Ready(Ok(_)) => false,
                Poll::Ready(Err(error)) => {
                    tracing::debug!(register = reset.register, node = node.index(), %error, "recycler: reset failed on a replica");
                    reset.failed = true;
                    false
                }
            });
            if !reset.pending.is_empty() {
                i += 1;
                continue;
            }
            let done = s.resetting.swap_remove(i);
            if done.failed {
                // Some replica may keep the old metadata: try again after a grace.
                s.stats.reset_failures += 1;
                s.limbo.push_back(Limbo {
                    register: done.register,
                    due: now.saturating_add(self.grace_ns),
                });
            } else {
                s.stats.recycled += 1;
                tracing::trace!(
                    register = done.register,
                    "register reset on every replica: recycled"
                );
                ready.push(done.register);
            }
        }
        ready
    }

    /// Forgets the resets in flight (the client is going away; the registers leak).
    pub fn abandon<F: Fabric>(&self, fabric: &F) {
        let mut s = self.state.borrow_mut();
        for reset in s.resetting.drain(..) {
            for (_, ticket) in reset.pending {
                fabric.forget(ticket);
            }
        }
    }
}

/// The batch that resets register `register` on one replica: in-place record header
/// and metadata words to zero, and the key header to *blank with a holder mark*:
/// length 0 (no key: the index and `decode_key_header` read it as unwritten) and the
/// resetting client's token `holder` in bytes 8..16, where a key's first bytes go.
/// The mark tells a register reset (and pooled) by a client from one never used,
/// which is what lets a reclaimer of a dead client's chunk hand out its never-used
/// registers without taking a live client's pooled ones (`crate::orphans`). The next
/// insert's key header (at least 16 bytes) overwrites the mark. (The in-place payload
/// bytes need no clearing: a record is valid only with its header and hash.)
pub fn reset_batch(layout: &NodeLayout, register: RegisterId, holder: u64) -> Option<Batch> {
    let header_at = layout.key_header(register)?;
    let register_at = layout.register(register)?;
    let swarm = &layout.swarm;
    let header_bytes = layout.params.key_header_bytes() as usize;
    let record_bytes = (RECORD_HEADER as u64).min(swarm.record_bytes()) as usize;
    let meta_bytes = 8 * usize::from(swarm.meta_words());
    let mut header = vec![0; header_bytes];
    header
        .get_mut(8..16)?
        .copy_from_slice(&holder.to_le_bytes());
    let mut batch = Batch::write(header_at, header);
    batch
        .push(Op::Write {
            addr: register_at,
            data: vec![0; record_bytes],
        })
        .ok()?;
    batch
        .push(Op::Write {
            addr: register_at + swarm.meta_offset(),
            data: vec![0; meta_bytes],
        })
        .ok()?;
    Some(batch)
}

#[cfg(test)]
mod tests {
    /// The register grace is the shared reclamation grace of its window.
    #[test]
    fn the_grace_covers_the_window_drift_and_flight() {
        assert_eq!(swarm_core::reclaim::grace_ns(0), 10_000_000);
        assert_eq!(swarm_core::reclaim::grace_ns(8_000_000_000), 9_010_000_000);
        assert_eq!(swarm_core::reclaim::grace_ns(u64::MAX), u64::MAX);
    }
}
