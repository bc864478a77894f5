//! Parsing one node's copy of a bucket, and merging the copies of a quorum into what
//! the bucket holds ([`View`]) and how settled it is ([`Status`]).
//!
//! This is the pure part of the protocol (module docs of [`super`]): every decision a
//! reader or a proposer takes is a function of a [`View`], so it is unit-tested here
//! without a fabric.
//!
//! **What proves a change decided.** A quorum's acceptance under one classic ballot,
//! or a slot copy holding the change itself (only decided changes are applied). A
//! *newer* change in its slot does not: it shows that the change's era is over
//! (the newer change could only be decided once the meta words moved past it), not
//! whether it was decided before. The copies of a view are not read at one instant,
//! so a view can show a change newest in the meta words while its slot already
//! holds a newer one: [`View::superseded_unproven`]. Such a change is applied by
//! nobody, and its owner does not take it for done (`watch`). Counting the newer
//! change as proof made an insert whose `SET` one node had accepted report the key
//! mapped to a register no index slot ever held, after another client's insert and
//! delete of the key had gone through: `tests/delete_race_sim.rs`, seed 797.
//!
//! **Lives of a mapping.** A `SET slot := register` is not unique: registers are
//! recycled, and a key may map to the same register again, in the same slot (a later
//! *life* of the mapping), so a slot copy showing the register may show an earlier
//! life. The changes of a bucket are decided one era after the other, each done
//! (applied on a quorum) before the next is proposed (module docs of [`super`],
//! "eras"), so the change that ended the earlier life was decided and applied before
//! the later `SET` was first accepted, and while that `SET` is the newest accepted
//! value no other change of its slot is decided. So a copy of the same content under
//! a tag older than another copy's change of that slot (one not newer than the
//! `SET`'s ballot: [`earlier_life_floor`]) is an earlier life, and does not hold the
//! newest change ([`holds_change`]); nor does `apply.rs` take it for applied. Tags
//! alone would not do: a done change is accepted again under newer ballots (an
//! insert's fence of the other bucket), so its copies' tags are older than its
//! ballot without being another life. Counting the earlier life's lagging copy made a
//! lookup take a `SET` accepted by one copy of its quorum for applied
//! ([`Status::Partial`]) and report the key absent after the insert that decided it
//! had returned (`tests/index_sim.rs`,
//! `an_earlier_life_on_a_lagging_copy_is_not_the_later_one`). What this cannot tell:
//! a view none of whose copies shows a change of the slot between the two lives (one
//! copy of the later life, one lagging copy of the earlier one, the copies of the
//! change that ended it all out of the view); the earlier life's copy then counts.

use super::word::{Ballot, Content, Meta, Proposal, SLOTS, Slot, SlotState, WordError};
use crate::layout::BUCKET_BYTES;

/// Why a bucket copy (or a set of copies) is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// The read returned the wrong number of bytes.
    #[error("bucket read returned {0} bytes instead of {BUCKET_BYTES}")]
    Length(usize),
    /// The meta word does not decode.
    #[error("meta word: {0}")]
    Meta(WordError),
    /// A slot word does not decode.
    #[error("slot {slot}: {error}")]
    Slot {
        /// Slot index.
        slot: usize,
        /// What is wrong with it.
        error: WordError,
    },
    /// A register id past the register area.
    #[error("register {register} is past the register area ({registers} registers)")]
    Register {
        /// The register found.
        register: u64,
        /// Registers in the cluster.
        registers: u64,
    },
    /// Two copies hold different contents under the same tag: impossible unless
    /// memory was corrupted (a tag names one decided change).
    #[error("two nodes hold different contents for slot {slot} under the same tag {tag}")]
    SlotConflict {
        /// Slot index.
        slot: usize,
        /// The tag.
        tag: u16,
    },
    /// Two copies accepted different values under the same ballot: impossible unless
    /// memory was corrupted (one proposer owns a ballot).
    #[error("two nodes accepted different values under the same ballot {0}")]
    BallotConflict(u16),
}

/// One node's copy of a bucket: raw words (for CAS expectations) and decoded ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeBucket {
    /// The meta word as read.
    pub meta_word: u64,
    /// The meta word decoded.
    pub meta: Meta,
    /// The slot words as read.
    pub slot_words: [u64; SLOTS],
    /// The slot words decoded.
    pub slots: [Slot; SLOTS],
}

impl NodeBucket {
    /// Parses a 64-byte bucket read from a node (untrusted). Register ids must be
    /// below `registers`.
    pub fn parse(bytes: &[u8], registers: u64) -> Result<Self, BucketError> {
        if bytes.len() != BUCKET_BYTES as usize {
            return Err(BucketError::Length(bytes.len()));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        let meta_word = word(0);
        let meta = check_meta(meta_word, registers)?;
        let mut slot_words = [0u64; SLOTS];
        let mut slots = [Slot::EMPTY; SLOTS];
        for s in 0..SLOTS {
            slot_words[s] = word(s + 1);
            let slot = Slot::decode(slot_words[s])
                .map_err(|error| BucketError::Slot { slot: s, error })?;
            if let Some(register) = slot.register()
                && register >= registers
            {
                return Err(BucketError::Register {
                    register,
                    registers,
                });
            }
            slots[s] = slot;
        }
        Ok(Self {
            meta_word,
            meta,
            slot_words,
            slots,
        })
    }

    /// A copy holding exactly `meta` and `slots` (tests build views from these).
    #[cfg(test)]
    pub(crate) fn of(meta: Meta, slots: [Slot; SLOTS]) -> Self {
        Self {
            meta_word: meta.encode(),
            meta,
            slot_words: slots.map(|s| s.encode()),
            slots,
        }
    }

    /// The same copy with another meta word (the acceptor state at promise time).
    pub fn with_meta(self, meta_word: u64, registers: u64) -> Result<Self, BucketError> {
        Ok(Self {
            meta_word,
            meta: check_meta(meta_word, registers)?,
            ..self
        })
    }
}

/// Decodes a meta word and checks the register it may name.
pub fn check_meta(word: u64, registers: u64) -> Result<Meta, BucketError> {
    let meta = Meta::decode(word).map_err(BucketError::Meta)?;
    if let Some((_, Proposal::Set { register, .. })) = meta.accepted
        && register >= registers
    {
        return Err(BucketError::Register {
            register,
            registers,
        });
    }
    Ok(meta)
}

/// The most recent value accepted by any copy of a view, and how far it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latest {
    /// Its ballot: the newest accepted ballot among the copies.
    pub ballot: Ballot,
    /// The value.
    pub proposal: Proposal,
    /// Accepted in a fast round (held by every copy merged, see [`newest_accepted`]):
    /// only a Paxos round or an applied copy can tell whether it is decided.
    pub fast: bool,
    /// Copies that accepted exactly this value under exactly this ballot.
    pub same: usize,
    /// Copies whose slot shows the change applied, or a newer change.
    pub applied: usize,
    /// Copies whose slot holds the change itself (of `applied`): its content, not an
    /// earlier life of it ([`holds_change`]). Only decided changes are applied, so one
    /// such copy proves it decided. A newer change in the slot proves only that the
    /// change's era is over ([`View::superseded_unproven`]).
    pub held: usize,
    /// Some copy shows the change written by its owner, or a newer change in its slot:
    /// the owner no longer needs the meta word to learn its fate.
    pub marked: bool,
}

/// How settled a bucket is, from a quorum's copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No change in flight: the slots are the state.
    Free,
    /// The latest change is applied on a quorum but its owner has not marked it yet;
    /// replacing it in the meta word must wait (module docs, "knowing one's fate").
    Unacked {
        /// Ballot of the change.
        ballot: Ballot,
        /// The change.
        proposal: Proposal,
    },
    /// The latest change is decided (a copy holds it, or a quorum accepted it under
    /// one classic ballot) and applied, or superseded by a newer change, on some
    /// copies, not yet a quorum.
    Partial {
        /// Ballot of the change.
        ballot: Ballot,
        /// The change.
        proposal: Proposal,
    },
    /// The latest change was accepted by a quorum under one classic ballot (decided)
    /// but is applied nowhere yet.
    Decided {
        /// Ballot of the change.
        ballot: Ballot,
        /// The change.
        proposal: Proposal,
    },
    /// The latest change was accepted somewhere but may or may not be decided: only a
    /// Paxos round can tell. Also a change [superseded unproven](View::superseded_unproven),
    /// until the meta words show the change that superseded it.
    Open {
        /// Ballot of the change.
        ballot: Ballot,
        /// The change.
        proposal: Proposal,
    },
}

/// What a quorum of copies says about a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Copies merged.
    pub copies: usize,
    /// The quorum size the statuses are judged against.
    pub quorum: usize,
    /// The newest promised ballot.
    pub max_promised: Ballot,
    /// The newest accepted value, if any copy accepted one.
    pub latest: Option<Latest>,
    /// Per slot, the copy with the newest tag: every slot word is a decided value,
    /// so the newest one seen is the slot's state.
    pub slots: [Slot; SLOTS],
}

impl View {
    /// Merges copies. Fails only on contradictions that corrupted memory can cause.
    pub fn merge(copies: &[NodeBucket], quorum: usize) -> Result<Self, BucketError> {
        let mut max_promised: Option<Ballot> = None;
        let mut slots: [Option<Slot>; SLOTS] = [None; SLOTS];
        let newest = newest_accepted(copies.iter().map(|c| c.meta))?;
        for copy in copies {
            max_promised =
                Some(max_promised.map_or(copy.meta.promised, |p| p.newest(copy.meta.promised)));
            for (s, merged) in slots.iter_mut().enumerate() {
                let slot = copy.slots[s];
                *merged = Some(match *merged {
                    None => slot,
                    Some(m) if slot.tag.is_newer_than(m.tag) => slot,
                    Some(m) if slot.tag == m.tag => {
                        if slot.content() != m.content() {
                            return Err(BucketError::SlotConflict {
                                slot: s,
                                tag: slot.tag.0,
                            });
                        }
                        if slot.by_owner() { slot } else { m }
                    }
                    Some(m) => m,
                });
            }
        }
        let slots = slots.map(|s| s.unwrap_or(Slot::EMPTY));
        let latest = newest.map(|(ballot, proposal, fast)| {
            let same = copies
                .iter()
                .filter(|c| c.meta.accepted == Some((ballot, proposal)) && c.meta.fast == fast)
                .count();
            let (mut applied, mut held, mut marked) = (0, 0, false);
            if let (Some(s), Some(content)) = (proposal.slot(), proposal.content()) {
                let floor = earlier_life_floor(copies.iter().map(|c| c.slots[s]), ballot, content);
                for copy in copies {
                    let slot = copy.slots[s];
                    let newer = slot.tag.is_newer_than(ballot) && slot.content() != content;
                    // Not a copy of an earlier life of the mapping ("lives of a
                    // mapping" above).
                    let holds = holds_change(slot, content, floor);
                    if holds {
                        held += 1;
                    }
                    if holds || newer {
                        applied += 1;
                    }
                    marked |= newer || (holds && slot.by_owner());
                }
            }
            Latest {
                ballot,
                proposal,
                fast,
                same,
                applied,
                held,
                marked,
            }
        });
        Ok(Self {
            copies: copies.len(),
            quorum,
            max_promised: max_promised.unwrap_or_default(),
            latest,
            slots,
        })
    }

    /// Whether the newest accepted change is *superseded unproven*: some copy shows a
    /// newer change in its slot, no copy holds the change itself, and no quorum
    /// accepted it under one classic ballot. Its era is over, since a newer change of
    /// its slot was decided (a change replaces a decided one only once it is done,
    /// `super` "eras"), but whether it was decided first is unknown: it was done
    /// and then overwritten, or it never reached a quorum and never will. The copies
    /// of one view are not read at one instant (a node's meta word as of a promise,
    /// its slots read after, or nodes read at different times), so a view may show a
    /// change still newest in the meta words whose slot already moved on.
    ///
    /// No caller may apply such a change (its slot would then hold a value perhaps
    /// never decided, which readers and its owner would take for decided): it is
    /// [`Status::Open`] while fewer than a quorum of copies show its slot moved on,
    /// and [`Status::Free`] once a quorum does (nothing is left to finish). Nor may
    /// its owner take it for done: only a copy holding it, or the owner's own
    /// observations, tell (`watch`).
    pub fn superseded_unproven(&self) -> bool {
        self.latest.is_some_and(|l| {
            // Superseded in some copy's slot, held by none, and not accepted by a
            // quorum under one classic ballot (which would prove it decided).
            let classic_quorum = l.same >= self.quorum && !l.fast;
            l.applied > 0 && l.held == 0 && !classic_quorum
        })
    }

    /// How settled the bucket is.
    pub fn status(&self) -> Status {
        let Some(l) = self.latest else {
            return Status::Free;
        };
        let (ballot, proposal) = (l.ballot, l.proposal);
        if proposal == Proposal::Noop {
            Status::Free
        } else if l.applied >= self.quorum {
            if l.marked {
                Status::Free
            } else {
                Status::Unacked { ballot, proposal }
            }
        } else if self.superseded_unproven() {
            Status::Open { ballot, proposal }
        } else if l.applied > 0 {
            Status::Partial { ballot, proposal }
        } else if l.same >= self.quorum && !l.fast {
            Status::Decided { ballot, proposal }
        } else {
            Status::Open { ballot, proposal }
        }
    }

    /// The bucket's state as a reader may report it: the merged slots, with a decided
    /// but unapplied change laid over them. `None` while a change is open.
    pub fn readable(&self) -> Option<[Slot; SLOTS]> {
        match self.status() {
            Status::Free | Status::Unacked { .. } | Status::Partial { .. } => Some(self.slots),
            Status::Decided { ballot, proposal } => {
                let mut slots = self.slots;
                if let Some(s) = proposal.slot() {
                    slots[s] = applied_slot(ballot, proposal, None);
                }
                Some(slots)
            }
            Status::Open { .. } => None,
        }
    }
}

/// The accepted value that acceptor states `metas` oblige a proposer to finish, with
/// its ballot and whether it was accepted in a fast round: Paxos's "value of the
/// newest ballot", adapted to fast rounds whose fast quorum is every node (module
/// docs of [`super`], "fast inserts").
///
/// The newest accepted ballot decides, a classic value winning a tie. A classic
/// ballot has one owner, so its value is unique. A fast round lets each node take
/// whichever fast proposal reaches it first, so a fast value is decided only if
/// *every* node took it: if `metas` (a quorum's states as of its promises) do not
/// all hold it, it is not decided and never will be. Nothing older needs finishing
/// either: a fast round only replaces a word that every node it read agreed on,
/// whose change was done and whose promise was its accepted ballot (`super::fast`),
/// so every change under an older ballot is done or can no longer be decided. The
/// result is then `None`, as for a bucket that accepted nothing. (Falling back to
/// the newest classic value instead would resurrect a value that lost its era: a
/// stale undecided `SET` on the one node the fast round did not reach, once the
/// done change that superseded it was overwritten everywhere else.)
///
/// Fails with [`BucketError::BallotConflict`] when two states hold different values
/// under one classic ballot (only corrupted memory does that).
pub fn newest_accepted(
    metas: impl Iterator<Item = Meta> + Clone,
) -> Result<Option<(Ballot, Proposal, bool)>, BucketError> {
    let mut newest: Option<(Ballot, Proposal, bool)> = None;
    for m in metas.clone() {
        let Some((ballot, proposal)) = m.accepted else {
            continue;
        };
        match newest {
            Some((b, p, false)) if b == ballot && !m.fast && p != proposal => {
                return Err(BucketError::BallotConflict(ballot.0));
            }
            Some((b, _, fast)) if b == ballot && fast && !m.fast => {
                newest = Some((ballot, proposal, false));
            }
            Some((b, _, _)) if !ballot.is_newer_than(b) => {}
            _ => newest = Some((ballot, proposal, m.fast)),
        }
    }
    match newest {
        Some((ballot, proposal, true)) => {
            let unanimous = metas
                .into_iter()
                .all(|m| m.fast && m.accepted == Some((ballot, proposal)));
            Ok(unanimous.then_some((ballot, proposal, true)))
        }
        other => Ok(other),
    }
}

/// The newest tag, among `slots` (copies of one slot), of a change of that slot other
/// than the newest accepted change, `content` accepted under `ballot`, and not newer
/// than it: a copy of `content` under a tag no newer than that is an earlier life of
/// the mapping (module docs, "lives of a mapping"). `None` if no copy shows one.
pub fn earlier_life_floor(
    slots: impl Iterator<Item = Slot>,
    ballot: Ballot,
    content: Content,
) -> Option<Ballot> {
    slots
        .filter(|slot| slot.content() != content && !slot.tag.is_newer_than(ballot))
        .map(|slot| slot.tag)
        .reduce(Ballot::newest)
}

/// Whether `slot` holds the newest accepted change, whose content is `content`, given
/// the [`earlier_life_floor`] of the copies of its slot: its content, under a tag
/// newer than any other change of the slot that preceded it.
pub fn holds_change(slot: Slot, content: Content, floor: Option<Ballot>) -> bool {
    slot.content() == content && floor.is_none_or(|floor| slot.tag.is_newer_than(floor))
}

/// How many of a bucket's slots are free.
pub fn free_slots(slots: &[Slot; SLOTS]) -> usize {
    slots.iter().filter(|s| s.register().is_none()).count()
}

/// The first free slot of a bucket, if any: where an insert into it goes.
pub fn first_free_slot(slots: &[Slot; SLOTS]) -> Option<usize> {
    slots.iter().position(|s| s.register().is_none())
}

/// The slot a change leaves behind: tagged with its ballot; `owner_fp` is the key's
/// fingerprint when the change's owner writes it (`Some(_)` also marks a clear as
/// written by its owner), `None` for a helper.
pub fn applied_slot(ballot: Ballot, proposal: Proposal, owner_fp: Option<u32>) -> Slot {
    let state = match proposal {
        Proposal::Set { register, .. } => SlotState::Used {
            fp: owner_fp.unwrap_or(0),
            register,
        },
        Proposal::Clear { nonce, .. } => SlotState::Empty {
            nonce,
            by_owner: owner_fp.is_some(),
        },
        Proposal::Noop => SlotState::Empty {
            nonce: 0,
            by_owner: false,
        },
    };
    Slot { tag: ballot, state }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REGS: u64 = 1000;

    fn copy(meta: Meta, slots: [Slot; SLOTS]) -> NodeBucket {
        NodeBucket::of(meta, slots)
    }

    fn bytes(meta: Meta, slots: [Slot; SLOTS]) -> Vec<u8> {
        let mut out = meta.encode().to_le_bytes().to_vec();
        for s in slots {
            out.extend_from_slice(&s.encode().to_le_bytes());
        }
        out
    }

    fn accepted(ballot: u16, proposal: Proposal) -> Meta {
        Meta::accepting(Ballot(ballot), proposal, false)
    }

    const SET: Proposal = Proposal::Set {
        slot: 2,
        register: 7,
    };

    #[test]
    fn parse_checks_length_words_and_registers() {
        let empty = [Slot::EMPTY; SLOTS];
        let ok = bytes(accepted(3, SET), empty);
        let parsed = NodeBucket::parse(&ok, REGS).unwrap();
        assert_eq!(parsed.meta, accepted(3, SET));
        assert_eq!(
            NodeBucket::parse(&ok[..63], REGS),
            Err(BucketError::Length(63))
        );
        assert!(matches!(
            NodeBucket::parse(&ok, 7),
            Err(BucketError::Register { register: 7, .. })
        ));
        let mut slots = empty;
        slots[4] = applied_slot(
            Ballot(2),
            Proposal::Set {
                slot: 4,
                register: 5000,
            },
            Some(9),
        );
        assert!(matches!(
            NodeBucket::parse(&bytes(Meta::EMPTY, slots), REGS),
            Err(BucketError::Register { .. })
        ));
        let mut bad = bytes(Meta::EMPTY, empty);
        bad[3] |= 0x08; // the fast flag, with nothing accepted
        assert!(matches!(
            NodeBucket::parse(&bad, REGS),
            Err(BucketError::Meta(WordError::NonCanonical(_)))
        ));
    }

    #[test]
    fn statuses_follow_the_latest_change() {
        let empty = [Slot::EMPTY; SLOTS];
        let mut done = empty;
        done[2] = applied_slot(Ballot(3), SET, None);
        let mut marked = empty;
        marked[2] = applied_slot(Ballot(3), SET, Some(11));
        let q = 2;
        let view = |copies: &[NodeBucket]| View::merge(copies, q).unwrap();

        assert_eq!(
            view(&[copy(Meta::EMPTY, empty), copy(Meta::EMPTY, empty)]).status(),
            Status::Free
        );
        let noop = accepted(4, Proposal::Noop);
        assert_eq!(
            view(&[copy(noop, empty), copy(Meta::EMPTY, empty)]).status(),
            Status::Free
        );

        let acc = accepted(3, SET);
        let open = view(&[copy(acc, empty), copy(Meta::EMPTY, empty)]);
        assert_eq!(
            open.status(),
            Status::Open {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        assert_eq!(open.readable(), None);

        let decided = view(&[copy(acc, empty), copy(acc, empty)]);
        assert_eq!(
            decided.status(),
            Status::Decided {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        assert_eq!(decided.readable().unwrap()[2].register(), Some(7));

        let partial = view(&[copy(acc, done), copy(Meta::EMPTY, empty)]);
        assert_eq!(
            partial.status(),
            Status::Partial {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        assert_eq!(partial.readable().unwrap()[2].register(), Some(7));

        let unacked = view(&[copy(acc, done), copy(Meta::EMPTY, done)]);
        assert_eq!(
            unacked.status(),
            Status::Unacked {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        let acked = view(&[copy(acc, marked), copy(Meta::EMPTY, done)]);
        assert_eq!(acked.status(), Status::Free);
        assert_eq!(
            acked.slots[2],
            applied_slot(Ballot(3), SET, Some(11)),
            "the marked copy wins a tie"
        );

        // A newer change in the slot supersedes the latest accepted value.
        let mut newer = empty;
        newer[2] = applied_slot(Ballot(9), Proposal::Clear { slot: 2, nonce: 5 }, None);
        let superseded = view(&[copy(acc, newer), copy(acc, newer)]);
        assert_eq!(superseded.status(), Status::Free);
        assert_eq!(superseded.slots[2].tag, Ballot(9));

        // Superseded unproven (`tests/delete_race_sim.rs`, seed 797): one copy accepted
        // the change, the other shows a newer change in its slot. Its era is over, but
        // nothing proves it decided: open, applied by nobody.
        let older = accepted(2, Proposal::Noop);
        let unproven = view(&[copy(acc, empty), copy(older, newer)]);
        assert!(unproven.superseded_unproven());
        assert_eq!(
            unproven.status(),
            Status::Open {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        assert_eq!(unproven.readable(), None);
        // A copy holding it proves it decided.
        let held = view(&[copy(acc, done), copy(older, newer)]);
        assert!(!held.superseded_unproven());
        assert_eq!(held.status(), Status::Free);
        // So does a quorum of classic accepts: decided, and its slot moved on somewhere.
        let decided_then_superseded = view(&[copy(acc, empty), copy(acc, newer)]);
        assert!(!decided_then_superseded.superseded_unproven());
        assert_eq!(
            decided_then_superseded.status(),
            Status::Partial {
                ballot: Ballot(3),
                proposal: SET
            }
        );
        // A fast value on every copy is no proof.
        let fast = Meta::accepting(Ballot(3), SET, true);
        let fast_unproven = view(&[copy(fast, empty), copy(fast, newer)]);
        assert!(fast_unproven.superseded_unproven());
        assert!(matches!(fast_unproven.status(), Status::Open { .. }));
    }

    /// `tests/index_sim.rs`'s seed 9004570, as a lookup saw it: a register came back
    /// to its key, in the same slot. One copy accepted the later life's `SET` (ballot
    /// 5) and shows the remove that ended the earlier life (ballot 4) in the slot; the
    /// other missed both and still shows the earlier life itself (ballot 3). That copy
    /// does not hold the later `SET`: it is open, not applied anywhere (taken for
    /// partial, the lookup read the slot empty after the insert had returned).
    #[test]
    fn an_earlier_life_of_the_same_mapping_does_not_hold_the_later_one() {
        let empty = [Slot::EMPTY; SLOTS];
        let mut cleared = empty;
        cleared[2] = applied_slot(Ballot(4), Proposal::Clear { slot: 2, nonce: 9 }, Some(11));
        let mut earlier = empty;
        earlier[2] = applied_slot(Ballot(3), SET, Some(11));
        let later = accepted(5, SET).with_promise(Ballot(5));
        let lagging = accepted(3, SET).with_promise(Ballot(4));
        let v = View::merge(&[copy(later, cleared), copy(lagging, earlier)], 2).unwrap();
        let latest = v.latest.unwrap();
        assert_eq!((latest.held, latest.applied, latest.marked), (0, 0, false));
        assert_eq!(
            v.status(),
            Status::Open {
                ballot: Ballot(5),
                proposal: SET
            }
        );
        assert_eq!(
            v.readable(),
            None,
            "the lookup settles it, it does not read past it"
        );
        // A done change accepted again under a newer ballot (an insert's fence of
        // the bucket) is still held by the copies applied under its first one: no
        // change of the slot came between.
        let mut applied = empty;
        applied[2] = applied_slot(Ballot(5), SET, None);
        let fenced = accepted(9, SET);
        let v = View::merge(
            &[
                copy(fenced, applied),
                copy(fenced, applied),
                copy(later, cleared),
            ],
            2,
        )
        .unwrap();
        let latest = v.latest.unwrap();
        assert_eq!((latest.held, latest.applied), (2, 2));
        assert_eq!(
            v.status(),
            Status::Unacked {
                ballot: Ballot(9),
                proposal: SET
            }
        );
    }

    #[test]
    fn contradictions_are_reported() {
        let empty = [Slot::EMPTY; SLOTS];
        let other = Proposal::Set {
            slot: 2,
            register: 8,
        };
        assert_eq!(
            View::merge(
                &[
                    copy(accepted(3, SET), empty),
                    copy(accepted(3, other), empty)
                ],
                2
            ),
            Err(BucketError::BallotConflict(3))
        );
        let mut a = empty;
        a[2] = applied_slot(Ballot(3), SET, None);
        let mut b = empty;
        b[2] = applied_slot(Ballot(3), other, None);
        assert_eq!(
            View::merge(&[copy(Meta::EMPTY, a), copy(Meta::EMPTY, b)], 2),
            Err(BucketError::SlotConflict { slot: 2, tag: 3 })
        );
    }

    #[test]
    fn fast_values_count_only_where_every_copy_holds_them() {
        let empty = [Slot::EMPTY; SLOTS];
        let fast = |b: u16, p: Proposal| Meta::accepting(Ballot(b), p, true);
        let other = Proposal::Set {
            slot: 4,
            register: 9,
        };
        let newest = |metas: &[Meta]| newest_accepted(metas.iter().copied());
        // Every copy holds it: it may be decided, so it is the value to finish,
        // but a quorum of copies does not make it decided (only a Paxos round or an
        // applied copy can tell).
        assert_eq!(
            newest(&[fast(5, SET), fast(5, SET)]),
            Ok(Some((Ballot(5), SET, true)))
        );
        let view = View::merge(&[copy(fast(5, SET), empty); 2], 2).unwrap();
        assert_eq!(
            view.status(),
            Status::Open {
                ballot: Ballot(5),
                proposal: SET
            }
        );
        assert_eq!(view.readable(), None);
        let mut done = empty;
        done[2] = applied_slot(Ballot(5), SET, Some(11));
        let view = View::merge(&[copy(fast(5, SET), done); 2], 2).unwrap();
        assert_eq!(view.status(), Status::Free);
        assert_eq!(view.slots[2].register(), Some(7));
        // A copy lacks it: not decided, and what it replaced was done (nothing older
        // comes back, not even a newer-looking stale classic value).
        assert_eq!(newest(&[fast(5, SET), accepted(3, other)]), Ok(None));
        assert_eq!(newest(&[fast(5, SET), fast(5, other)]), Ok(None));
        assert_eq!(newest(&[fast(5, SET), Meta::EMPTY]), Ok(None));
        // A classic value under the same ballot has an owner that promised it on a
        // quorum, so the fast one was not decided; a newer classic value wins as usual.
        assert_eq!(
            newest(&[fast(5, SET), accepted(5, other)]),
            Ok(Some((Ballot(5), other, false)))
        );
        assert_eq!(
            newest(&[accepted(5, other), fast(5, SET)]),
            Ok(Some((Ballot(5), other, false)))
        );
        assert_eq!(
            newest(&[fast(5, SET), accepted(6, other)]),
            Ok(Some((Ballot(6), other, false)))
        );
        // Two fast values under one ballot are a race, not corruption.
        assert!(View::merge(&[copy(fast(5, SET), empty), copy(fast(5, other), empty)], 2).is_ok());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..80), registers in 0u64..2000) {
            if let Ok(parsed) = NodeBucket::parse(&data, registers) {
                let view = View::merge(&[parsed, parsed], 2).unwrap();
                let _ = view.status();
                let _ = view.readable();
            }
        }

        #[test]
        fn merge_of_arbitrary_words_never_panics(words in proptest::collection::vec(any::<u64>(), 24)) {
            let copies: Vec<NodeBucket> = words
                .chunks(8)
                .filter_map(|w| {
                    let b: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
                    NodeBucket::parse(&b, u64::MAX).ok()
                })
                .collect();
            if let Ok(view) = View::merge(&copies, 2) {
                let _ = view.readable();
            }
        }
    }
}
