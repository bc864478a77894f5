//! Following this operation's own proposals until their fate is known (module docs
//! of [`super`], "knowing one's fate").
//!
//! A proposer whose accept was preempted does not know whether a helper decided its
//! change. Every quorum observation of a bucket (a read, or the read-back of a
//! promise) tells it: a slot holding the change's unique content means it took
//! effect; the change being the newest accepted value means it may still be decided;
//! a different value accepted by a quorum under a newer classic ballot means it
//! never will be (a fast-round value held by a quorum is not taken as proof: it may
//! be held by no more than that quorum, and watching longer is always safe). A
//! decided change stays visible to every quorum read for at least the
//! acknowledgement wait, so observation windows shorter than that miss none.
//!
//! A change that is the newest accepted value while some copy already shows a newer
//! change in its slot, no copy holding it and no quorum having accepted it under one
//! classic ballot, is *superseded unproven* (`View::superseded_unproven`): it is not
//! visible, neither finished nor taken for done. Its era is over, and whether it was
//! decided first only the windows tell. The meta words of that observation still
//! show it newest, so the first change after it was accepted after the observation
//! began (by a node of its quorum whose word had not moved yet). Had ours been
//! decided, it was applied on a quorum and then left there for an acknowledgement
//! wait (we, its owner, never marked it) before that change could replace it. So
//! if less than the acknowledgement wait passed since the previous observation
//! began, that one fell between the apply and the replacement and saw our change in
//! its slot ([`Fate::Applied`]); otherwise the window was too long
//! ([`Fate::Unknown`]); with no previous observation, the window runs from our
//! accept, before any apply, and is too long. Taking the newer change for proof,
//! as the view's `applied` count does for readers, made an insert whose `SET` one
//! node had accepted report the key mapped while no slot ever held it
//! (`tests/delete_race_sim.rs`, seed 797).

use swarm_core::Fabric;
use swarm_core::fabric::Nanos;

use super::bucket::{NodeBucket, View};
use super::engine::{Engine, MAX_BUCKETS};
use super::word::{Ballot, Proposal};

/// What became of this operation's own proposals (module docs of [`super`],
/// "knowing one's fate").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// One is the newest accepted value of its bucket in the promise views: finish
    /// it.
    Latest(usize, Proposal),
    /// One was seen applied in its slot (with this tag): it took effect.
    Applied(usize, Proposal, Ballot),
    /// This operation went longer than the acknowledgement wait without a quorum
    /// observation of a bucket while a proposal of its was alive: one may have been
    /// decided, applied and overwritten unseen.
    Unknown,
    /// None took effect so far (or none was sent).
    None,
}

/// One of this operation's proposals, watched until the operation ends.
#[derive(Clone, Copy, Debug)]
pub(super) struct Watch {
    bucket: usize,
    proposal: Proposal,
    /// Our newest ballot for it.
    ballot: Ballot,
    /// Start of the current observation window: the send time of the last quorum
    /// observation of its bucket (or of its accept).
    since: Nanos,
    /// A window lasted an acknowledgement wait or more.
    uncertain: bool,
    /// Tag of a slot copy seen holding it: only decided changes are applied, so it
    /// took effect.
    applied: Option<Ballot>,
    /// A different value was accepted by a quorum under a newer ballot of the same
    /// bucket: it can never be decided.
    dead: bool,
}

impl<F: Fabric> Engine<'_, F> {
    /// Starts (or renews) watching our own `proposal` for bucket `i`, about to be sent
    /// under `ballot`. A proposal ruled out under an older ballot (dead) is alive again
    /// once sent again: its new accept may be decided, so it is watched from now on.
    pub fn watch(&mut self, i: usize, proposal: Proposal, ballot: Ballot) {
        let now = self.fabric.now();
        self.watch_since(i, proposal, ballot, now);
    }

    /// [`Self::watch`] for a proposal that was sent at `sent` (by another step: a
    /// blind fast round rides on the register's write, `super::fast`).
    pub fn watch_since(&mut self, i: usize, proposal: Proposal, ballot: Ballot, sent: Nanos) {
        let now = sent;
        match self
            .watches
            .iter_mut()
            .find(|w| w.bucket == i && w.proposal == proposal)
        {
            Some(w) => {
                if w.dead {
                    w.dead = false;
                    w.since = now;
                }
                w.ballot = ballot;
            }
            None => self.watches.push(Watch {
                bucket: i,
                proposal,
                ballot,
                since: now,
                uncertain: false,
                applied: None,
                dead: false,
            }),
        }
    }

    /// A quorum of bucket `i` accepted `value` under `ballot`: our other proposals
    /// there, all under older ballots, are dead.
    pub fn superseded(&mut self, i: usize, value: Proposal, ballot: Ballot) {
        for w in &mut self.watches {
            if w.bucket == i && w.proposal != value && ballot.is_newer_than(w.ballot) {
                w.dead = true;
            }
        }
    }

    /// Notes a quorum observation of bucket `i` (copies read between `sent` and
    /// now): a decided proposal of ours is visible to every quorum read for at least
    /// an acknowledgement wait, so windows shorter than that miss none.
    pub(super) fn observe(&mut self, i: usize, sent: Nanos, copies: &[NodeBucket]) {
        let q = self.quorum();
        if copies.len() < q || !self.watches.iter().any(|w| w.bucket == i && !w.dead) {
            return;
        }
        let Ok(view) = View::merge(copies, q) else {
            return;
        };
        let now = self.fabric.now();
        let wait = self.ix.config.ack_wait_ns;
        // A change superseded unproven is not visible: newest in the meta words, its
        // slot already moved on (`View::superseded_unproven`).
        let superseded = view.superseded_unproven();
        for w in self.watches.iter_mut().filter(|w| w.bucket == i && !w.dead) {
            let latest = !superseded && view.latest.is_some_and(|l| l.proposal == w.proposal);
            let applied = match (w.proposal.slot(), w.proposal.content()) {
                (Some(s), Some(c)) if view.slots[s].content() == c => Some(view.slots[s].tag),
                _ => None,
            };
            w.applied = w.applied.or(applied);
            let visible = latest || applied.is_some();
            if !visible && now.saturating_sub(w.since) >= wait {
                w.uncertain = true;
            }
            // Not visible to a quorum read in time: not decided so far. A different
            // value accepted by a quorum under a newer ballot then rules it out.
            if let Some(l) = view.latest
                && !visible
                && !w.uncertain
                && l.same >= q
                && !l.fast
                && l.proposal != w.proposal
                && l.ballot.is_newer_than(w.ballot)
            {
                w.dead = true;
            }
            w.since = sent;
        }
    }

    /// Whether a proposal of ours for bucket `i` is alive: sent, and not ruled out.
    pub fn alive_in(&self, i: usize) -> bool {
        self.watches.iter().any(|w| w.bucket == i && !w.dead)
    }

    /// Whether none of our proposals may have taken effect unseen: each was ruled
    /// out, or watched with no window as long as an acknowledgement wait and never seen
    /// applied. A proposal sent again while this is false could redo a change that
    /// was decided, applied and undone while we were stopped; [`Self::fate`] judges
    /// it first.
    pub fn none_pending(&self) -> bool {
        !self
            .watches
            .iter()
            .any(|w| !w.dead && (w.uncertain || w.applied.is_some()))
    }

    /// The fate of our proposals: applied (seen in a slot), still the newest accepted
    /// value in the views of a successful promise (`views`), or lost track of.
    pub fn fate(&self, views: &[Option<View>; MAX_BUCKETS]) -> Fate {
        let alive = || self.watches.iter().filter(|w| !w.dead);
        if let Some(w) = alive().find(|w| w.applied.is_some()) {
            return Fate::Applied(w.bucket, w.proposal, w.applied.unwrap_or_default());
        }
        for w in alive() {
            if views[w.bucket].is_some_and(|v| {
                !v.superseded_unproven() && v.latest.is_some_and(|l| l.proposal == w.proposal)
            }) {
                return Fate::Latest(w.bucket, w.proposal);
            }
        }
        if alive().any(|w| w.uncertain) {
            Fate::Unknown
        } else {
            Fate::None
        }
    }
}

#[cfg(test)]
mod tests {
    use swarm_core::MemCluster;
    use swarm_core::{Fabric, OpStats};

    use super::*;
    use crate::index::bucket::applied_slot;
    use crate::index::word::{Meta, SLOTS, Slot};
    use crate::index::{Index, IndexConfig};

    const MINE: Proposal = Proposal::Set {
        slot: 2,
        register: 7,
    };
    const OTHER: Proposal = Proposal::Set {
        slot: 3,
        register: 8,
    };

    fn copy(accepted: Option<(u16, Proposal)>, slots: [Slot; SLOTS]) -> NodeBucket {
        let meta = Meta {
            promised: Ballot(accepted.map_or(0, |a| a.0)),
            accepted: accepted.map(|(b, p)| (Ballot(b), p)),
            fast: false,
        };
        NodeBucket::of(meta, slots)
    }

    fn index() -> Index {
        crate::index::tiny_test_index(IndexConfig {
            ack_wait_ns: 100,
            slow_after_ns: 10,
            retry_delay_ns: 1,
            max_backoff_ns: 10,
            ..IndexConfig::default()
        })
    }

    #[test]
    fn fate_follows_observations() {
        let ix = index();
        let cluster = MemCluster::new(3, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let advance = |ticks: u64| {
            fabric.wake_at(fabric.now() + ticks);
            for _ in 0..ticks {
                fabric.progress();
            }
        };
        let empty = [Slot::EMPTY; SLOTS];
        let mut applied = empty;
        applied[2] = applied_slot(Ballot(5), MINE, None);
        let none = [None; MAX_BUCKETS];

        // Sent, then seen as the newest accepted value: maybe decided.
        let mut eng = Engine::new(&ix, &fabric, &stats, &[1], 0);
        eng.watch(0, MINE, Ballot(5));
        let seen = [copy(Some((5, MINE)), empty), copy(None, empty)];
        eng.observe(0, fabric.now(), &seen);
        assert_eq!(
            eng.fate(&none),
            Fate::None,
            "no promise view: nothing to finish yet"
        );
        let view = View::merge(&seen, 2).unwrap();
        assert_eq!(eng.fate(&[Some(view), None]), Fate::Latest(0, MINE));
        // Seen applied in its slot: it took effect, for good.
        eng.observe(0, fabric.now(), &[copy(None, applied), copy(None, empty)]);
        assert_eq!(eng.fate(&none), Fate::Applied(0, MINE, Ballot(5)));

        // Not visible, observed often enough, then a newer value decided: dead.
        let mut eng = Engine::new(&ix, &fabric, &stats, &[1], 0);
        eng.watch(0, MINE, Ballot(5));
        advance(50);
        let other = [copy(Some((9, OTHER)), empty), copy(Some((9, OTHER)), empty)];
        eng.observe(0, fabric.now(), &other);
        assert_eq!(eng.fate(&none), Fate::None);
        advance(500);
        eng.observe(0, fabric.now(), &other);
        assert_eq!(
            eng.fate(&none),
            Fate::None,
            "a dead proposal cannot be lost track of"
        );
        // Sent again under a newer ballot, it is alive again: seen applied, it took
        // effect (an insert that retries with the same slot and register, after its
        // first accept was ruled out, must not miss its second one being decided).
        eng.watch(0, MINE, Ballot(12));
        let mut applied_again = empty;
        applied_again[2] = applied_slot(Ballot(12), MINE, None);
        eng.observe(
            0,
            fabric.now(),
            &[copy(None, applied_again), copy(None, empty)],
        );
        assert_eq!(eng.fate(&none), Fate::Applied(0, MINE, Ballot(12)));

        // Not visible after a window longer than the acknowledgement wait: unknown.
        let mut eng = Engine::new(&ix, &fabric, &stats, &[1], 0);
        eng.watch(0, MINE, Ballot(5));
        advance(50);
        let lone = [copy(Some((9, OTHER)), empty), copy(None, empty)];
        eng.observe(0, fabric.now(), &lone);
        assert_eq!(eng.fate(&none), Fate::None);
        advance(150);
        eng.observe(0, fabric.now(), &lone);
        assert_eq!(eng.fate(&none), Fate::Unknown);

        // A quorum accepting another value under a newer ballot after we did so
        // ourselves (a fence) kills our older proposals there.
        let mut eng = Engine::new(&ix, &fabric, &stats, &[1], 0);
        eng.watch(0, MINE, Ballot(5));
        eng.superseded(0, Proposal::Noop, Ballot(6));
        advance(500);
        eng.observe(0, fabric.now(), &lone);
        assert_eq!(eng.fate(&none), Fate::None);
    }
}
