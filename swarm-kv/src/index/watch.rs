//! Following this operation's own proposals until their fate is known (module docs
//! of [`super`], "knowing one's fate").
//!
//! A proposer whose accept was preempted does not know whether a helper decided its
//! change. Every quorum observation of a bucket (a read, or the read-back of a
//! promise) tells it: a slot holding the change's unique content means it took
//! effect; the change being the newest accepted value means it may still be decided;
//! a different value accepted by a quorum under a newer ballot means it never will
//! be. A decided change stays visible to every quorum read for at least the
//! acknowledgement wait, so observation windows shorter than that miss none.

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
    /// under `ballot`.
    pub fn watch(&mut self, i: usize, proposal: Proposal, ballot: Ballot) {
        let now = self.fabric.now();
        match self
            .watches
            .iter_mut()
            .find(|w| w.bucket == i && w.proposal == proposal)
        {
            Some(w) => w.ballot = ballot,
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
        for w in self.watches.iter_mut().filter(|w| w.bucket == i && !w.dead) {
            let latest = view.latest.is_some_and(|l| l.proposal == w.proposal);
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
                && l.proposal != w.proposal
                && l.ballot.is_newer_than(w.ballot)
            {
                w.dead = true;
            }
            w.since = sent;
        }
    }

    /// The fate of our proposals: applied (seen in a slot), still the newest accepted
    /// value in the views of a successful promise (`views`), or lost track of.
    pub fn fate(&self, views: &[Option<View>; MAX_BUCKETS]) -> Fate {
        let alive = || self.watches.iter().filter(|w| !w.dead);
        if let Some(w) = alive().find(|w| w.applied.is_some()) {
            return Fate::Applied(w.bucket, w.proposal, w.applied.unwrap_or_default());
        }
        for w in alive() {
            if views[w.bucket].is_some_and(|v| v.latest.is_some_and(|l| l.proposal == w.proposal)) {
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
