//! The two kinds of 8-byte words of an index bucket, and the ballots they carry.
//!
//! A bucket is 64 bytes ([`crate::layout::BUCKET_BYTES`]): one **meta word** (the
//! bucket's Paxos acceptor on this node, see the module docs of [`super`]) followed
//! by [`SLOTS`] **slot words**. Every word is read and CAS'd as a whole, so each one
//! is self-describing: a bucket read torn across words is still a set of valid words.
//!
//! ```text
//! meta  63..48 promised ballot | 47..32 accepted ballot | 31..28 kind | 27 fast
//!       | 26..0 value
//!       kind 0 = nothing accepted (ballot and value 0), 1 = no-op (value 0),
//!       2..=8 = SET slot kind-2 := register `value`, 9..=15 = CLEAR slot kind-9, nonce `value`
//!       fast = the value was accepted in a fast round (a one-roundtrip insert,
//!       `super::fast`): decided only if every node took it; 0 when nothing is accepted
//! slot  63..48 tag (ballot of the change that wrote it) | 47 used | 46..27 fingerprint
//!       | 26..0 value (register if used, nonce of the clearing remove otherwise)
//!       an unused slot's fingerprint field is 1 if its owner wrote it, else 0
//! ```
//!
//! All-zero memory decodes as an empty bucket: nothing promised or accepted, seven
//! empty slots with tag 0. Decoders never panic and refuse non-canonical words, so
//! garbage read from a node is reported, never interpreted.

/// Slot words per bucket (the eighth word is the meta word).
pub const SLOTS: usize = 7;
/// Bits of a register id (and of a removal nonce) in both words.
pub const VALUE_BITS: u32 = 27;
/// Register ids must be below this bound: `2^27` registers per cluster.
pub const MAX_REGISTERS: u64 = 1 << VALUE_BITS;
/// Bits of a key fingerprint in a slot word.
pub const FP_BITS: u32 = 20;
/// Mask of a fingerprint; fingerprint 0 means "unknown" and matches every key.
pub const FP_MASK: u32 = (1 << FP_BITS) - 1;

const VALUE_MASK: u64 = MAX_REGISTERS - 1;
const KIND_NOTHING: u64 = 0;
const KIND_NOOP: u64 = 1;
const KIND_SET: u64 = 2;
const KIND_CLEAR: u64 = 2 + SLOTS as u64;

/// A Paxos ballot (and a slot's tag), compared with 16-bit serial-number arithmetic
/// (RFC 1982): `a` is newer than `b` iff `a - b`, wrapping, is in `1..2^15`. Ballots
/// of one bucket only grow, so they never run out; the comparison is meaningful while
/// the ballots being compared are less than `2^15` apart (see the module docs of
/// `crate::index` for what that requires of a memory node that comes back after a long
/// outage).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ballot(pub u16);

impl Ballot {
    /// The ballot after this one.
    pub fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// Whether `self` is strictly newer than `other`.
    pub fn is_newer_than(self, other: Self) -> bool {
        (self.0.wrapping_sub(other.0) as i16) > 0
    }

    /// Whether `self` is `other` or newer.
    pub fn at_least(self, other: Self) -> bool {
        self == other || self.is_newer_than(other)
    }

    /// The newer of the two.
    pub fn newest(self, other: Self) -> Self {
        if other.is_newer_than(self) {
            other
        } else {
            self
        }
    }
}

/// A value a bucket's Paxos instance can accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proposal {
    /// No change: what an insert accepts in the candidate bucket it does not modify,
    /// to fence it (module docs, "two buckets").
    Noop,
    /// Map slot `slot` to register `register` (insert, replace).
    Set {
        /// Slot index, `0..SLOTS`.
        slot: u8,
        /// The register.
        register: u64,
    },
    /// Empty slot `slot` (remove); the nonce identifies the remove call that did it.
    Clear {
        /// Slot index, `0..SLOTS`.
        slot: u8,
        /// Unique per remove call (27 bits).
        nonce: u32,
    },
}

impl Proposal {
    /// The slot a change writes, `None` for a no-op.
    pub fn slot(&self) -> Option<usize> {
        match self {
            Self::Noop => None,
            Self::Set { slot, .. } | Self::Clear { slot, .. } => Some(usize::from(*slot)),
        }
    }

    /// What the changed slot holds once the change is applied (`None` for a no-op).
    pub fn content(&self) -> Option<Content> {
        match *self {
            Self::Noop => None,
            Self::Set { register, .. } => Some(Content::Used(register)),
            Self::Clear { nonce, .. } => Some(Content::Cleared(nonce)),
        }
    }

    /// Whether the fields fit their bit widths.
    pub fn is_valid(&self) -> bool {
        match *self {
            Self::Noop => true,
            Self::Set { slot, register } => usize::from(slot) < SLOTS && register < MAX_REGISTERS,
            Self::Clear { slot, nonce } => {
                usize::from(slot) < SLOTS && u64::from(nonce) < MAX_REGISTERS
            }
        }
    }
}

/// The identity of a slot's content, without its tag and fingerprint: a register is
/// mapped by at most one slot, and a nonce names one remove call, so equal contents
/// mean the same change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Content {
    /// The slot maps this register.
    Used(u64),
    /// The slot is empty, cleared by the remove with this nonce (0: never used).
    Cleared(u32),
}

/// A decoded meta word: the acceptor state of one node for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Highest ballot promised.
    pub promised: Ballot,
    /// Highest ballot accepted and its value, if any.
    pub accepted: Option<(Ballot, Proposal)>,
    /// The accepted value was CAS'd in by a fast round (`super::fast`), not by the
    /// owner of its ballot: it is decided only if every node took it, so a quorum
    /// holding it proves nothing. Always false when nothing is accepted.
    pub fast: bool,
}

/// Why a word does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    /// A meta word that accepted nothing carries a ballot, a value or the fast flag,
    /// or a no-op carries a value.
    #[error("non-canonical meta word {0:#018x}")]
    NonCanonical(u64),
    /// An empty slot's fingerprint field is neither 0 nor 1.
    #[error("empty slot word {0:#018x} has a fingerprint")]
    EmptyWithFingerprint(u64),
}

impl Meta {
    /// Nothing promised, nothing accepted: all-zero memory.
    pub const EMPTY: Self = Self {
        promised: Ballot(0),
        accepted: None,
        fast: false,
    };

    /// The state an acceptor moves to when it accepts `proposal` under `ballot`
    /// (which it then also promises); `fast` for a fast round.
    pub fn accepting(ballot: Ballot, proposal: Proposal, fast: bool) -> Self {
        Self {
            promised: ballot,
            accepted: Some((ballot, proposal)),
            fast,
        }
    }

    /// The word. Fields wider than their bits are masked: callers pass valid
    /// proposals ([`Proposal::is_valid`]).
    pub fn encode(&self) -> u64 {
        debug_assert!(self.accepted.is_none_or(|(_, p)| p.is_valid()));
        let promised = u64::from(self.promised.0) << 48;
        let (accepted, kind, value) = match self.accepted {
            None => (0, KIND_NOTHING, 0),
            Some((ballot, proposal)) => {
                let (kind, value) = match proposal {
                    Proposal::Noop => (KIND_NOOP, 0),
                    Proposal::Set { slot, register } => (KIND_SET + u64::from(slot), register),
                    Proposal::Clear { slot, nonce } => {
                        (KIND_CLEAR + u64::from(slot), u64::from(nonce))
                    }
                };
                (u64::from(ballot.0), kind, value)
            }
        };
        let fast = u64::from(self.fast && self.accepted.is_some());
        promised | accepted << 32 | (kind & 0xF) << 28 | fast << 27 | (value & VALUE_MASK)
    }

    /// Decodes a word read from a node (untrusted).
    pub fn decode(word: u64) -> Result<Self, WordError> {
        let fast = (word >> 27) & 1 != 0;
        let promised = Ballot((word >> 48) as u16);
        let ballot = Ballot((word >> 32) as u16);
        let kind = (word >> 28) & 0xF;
        let value = word & VALUE_MASK;
        let proposal = match kind {
            KIND_NOTHING => {
                if ballot.0 != 0 || value != 0 || fast {
                    return Err(WordError::NonCanonical(word));
                }
                return Ok(Self {
                    promised,
                    accepted: None,
                    fast: false,
                });
            }
            KIND_NOOP if value != 0 => return Err(WordError::NonCanonical(word)),
            KIND_NOOP => Proposal::Noop,
            k if k < KIND_CLEAR => Proposal::Set {
                slot: (k - KIND_SET) as u8,
                register: value,
            },
            k => Proposal::Clear {
                slot: (k - KIND_CLEAR) as u8,
                nonce: value as u32,
            },
        };
        Ok(Self {
            promised,
            accepted: Some((ballot, proposal)),
            fast,
        })
    }

    /// The same acceptor state with `ballot` promised.
    pub fn with_promise(self, ballot: Ballot) -> Self {
        Self {
            promised: ballot,
            ..self
        }
    }
}

/// What a slot holds, besides its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Maps a register; `fp` is the key's fingerprint, 0 if unknown (a slot applied by
    /// a helper, who does not know the key).
    Used {
        /// Fingerprint, `0..=FP_MASK`.
        fp: u32,
        /// The register.
        register: u64,
    },
    /// Free. `nonce` names the remove that cleared it (0 if never used);
    /// `by_owner` tells that the remove itself (not a helper) wrote the slot.
    Empty {
        /// Nonce of the clearing remove.
        nonce: u32,
        /// Written by the remove that cleared it.
        by_owner: bool,
    },
}

/// A decoded slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Ballot of the change that wrote this slot last (0 initially).
    pub tag: Ballot,
    /// Its content.
    pub state: SlotState,
}

impl Slot {
    /// An initial slot: all-zero memory.
    pub const EMPTY: Self = Self {
        tag: Ballot(0),
        state: SlotState::Empty {
            nonce: 0,
            by_owner: false,
        },
    };

    /// The word (fields masked to their widths).
    pub fn encode(&self) -> u64 {
        let tag = u64::from(self.tag.0) << 48;
        match self.state {
            SlotState::Used { fp, register } => {
                tag | 1 << 47 | u64::from(fp & FP_MASK) << 27 | (register & VALUE_MASK)
            }
            SlotState::Empty { nonce, by_owner } => {
                tag | u64::from(by_owner) << 27 | (u64::from(nonce) & VALUE_MASK)
            }
        }
    }

    /// Decodes a word read from a node (untrusted).
    pub fn decode(word: u64) -> Result<Self, WordError> {
        let tag = Ballot((word >> 48) as u16);
        let fp = ((word >> 27) as u32) & FP_MASK;
        let value = word & VALUE_MASK;
        let state = if (word >> 47) & 1 == 1 {
            SlotState::Used {
                fp,
                register: value,
            }
        } else {
            if fp > 1 {
                return Err(WordError::EmptyWithFingerprint(word));
            }
            SlotState::Empty {
                nonce: value as u32,
                by_owner: fp == 1,
            }
        };
        Ok(Self { tag, state })
    }

    /// The content, without tag and fingerprint.
    pub fn content(&self) -> Content {
        match self.state {
            SlotState::Used { register, .. } => Content::Used(register),
            SlotState::Empty { nonce, .. } => Content::Cleared(nonce),
        }
    }

    /// Whether the change's owner wrote it (a known fingerprint, or a clear by its
    /// remove): the owner has learned that its change took effect.
    pub fn by_owner(&self) -> bool {
        match self.state {
            SlotState::Used { fp, .. } => fp != 0,
            SlotState::Empty { by_owner, .. } => by_owner,
        }
    }

    /// The register this slot maps, if any.
    pub fn register(&self) -> Option<u64> {
        match self.state {
            SlotState::Used { register, .. } => Some(register),
            SlotState::Empty { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn proposal() -> impl Strategy<Value = Proposal> {
        let slot = 0..SLOTS as u8;
        prop_oneof![
            Just(Proposal::Noop),
            (
                slot.clone(),
                prop_oneof![Just(0u64), Just(MAX_REGISTERS - 1), 0..MAX_REGISTERS]
            )
                .prop_map(|(slot, register)| Proposal::Set { slot, register }),
            (
                slot,
                prop_oneof![
                    Just(0u32),
                    Just((MAX_REGISTERS - 1) as u32),
                    0..MAX_REGISTERS as u32
                ]
            )
                .prop_map(|(slot, nonce)| Proposal::Clear { slot, nonce }),
        ]
    }

    fn ballot() -> impl Strategy<Value = Ballot> {
        prop_oneof![
            Just(Ballot(0)),
            Just(Ballot(u16::MAX)),
            any::<u16>().prop_map(Ballot)
        ]
    }

    #[test]
    fn zero_memory_is_an_empty_bucket() {
        assert_eq!(Meta::decode(0), Ok(Meta::EMPTY));
        assert_eq!(Slot::decode(0), Ok(Slot::EMPTY));
        assert_eq!(Meta::EMPTY.encode(), 0);
        assert_eq!(Slot::EMPTY.encode(), 0);
    }

    #[test]
    fn serial_ballots_wrap() {
        assert!(Ballot(1).is_newer_than(Ballot(0)));
        assert!(Ballot(0).is_newer_than(Ballot(u16::MAX)));
        assert!(Ballot(5).is_newer_than(Ballot(u16::MAX - 5)));
        assert!(!Ballot(3).is_newer_than(Ballot(3)));
        assert!(Ballot(3).at_least(Ballot(3)));
        assert_eq!(Ballot(u16::MAX).next(), Ballot(0));
        assert_eq!(Ballot(7).newest(Ballot(9)), Ballot(9));
        assert_eq!(Ballot(1).newest(Ballot(u16::MAX)), Ballot(1));
        // Exactly half the space apart: neither is newer.
        assert!(!Ballot(0).is_newer_than(Ballot(0x8000)));
        assert!(!Ballot(0x8000).is_newer_than(Ballot(0)));
    }

    #[test]
    fn non_canonical_meta_words_are_refused() {
        // Nothing accepted, but the fast flag, a ballot or a value.
        assert_eq!(Meta::decode(1 << 27), Err(WordError::NonCanonical(1 << 27)));
        assert!(matches!(
            Meta::decode(1 << 32),
            Err(WordError::NonCanonical(_))
        ));
        assert!(matches!(Meta::decode(5), Err(WordError::NonCanonical(_))));
        // A no-op with a value.
        assert!(matches!(
            Meta::decode(KIND_NOOP << 28 | 9),
            Err(WordError::NonCanonical(_))
        ));
        // An empty slot with a fingerprint above the owner marker.
        assert!(matches!(
            Slot::decode(2 << 27),
            Err(WordError::EmptyWithFingerprint(_))
        ));
    }

    proptest! {
        #[test]
        fn meta_roundtrips_at_the_extremes(promised in ballot(), accepted in proptest::option::of((ballot(), proposal())), fast in any::<bool>()) {
            let meta = Meta { promised, accepted, fast: fast && accepted.is_some() };
            prop_assert_eq!(Meta::decode(meta.encode()), Ok(meta));
        }

        #[test]
        fn slot_roundtrips_at_the_extremes(tag in ballot(),
                                           used in any::<bool>(),
                                           fp in prop_oneof![Just(0u32), Just(FP_MASK), 0..=FP_MASK],
                                           value in prop_oneof![Just(0u64), Just(MAX_REGISTERS - 1), 0..MAX_REGISTERS],
                                           by_owner in any::<bool>()) {
            let state = if used {
                SlotState::Used { fp, register: value }
            } else {
                SlotState::Empty { nonce: value as u32, by_owner }
            };
            let slot = Slot { tag, state };
            prop_assert_eq!(Slot::decode(slot.encode()), Ok(slot));
        }

        #[test]
        fn decoders_never_panic_and_reencode_what_they_accept(word in any::<u64>()) {
            if let Ok(meta) = Meta::decode(word) {
                prop_assert_eq!(meta.encode(), word);
            }
            if let Ok(slot) = Slot::decode(word) {
                prop_assert_eq!(slot.encode(), word);
            }
        }

        #[test]
        fn promising_keeps_the_accepted_value(meta_word in any::<u64>(), ballot in ballot()) {
            if let Ok(meta) = Meta::decode(meta_word) {
                let promised = meta.with_promise(ballot);
                prop_assert_eq!(promised.accepted, meta.accepted);
                prop_assert_eq!(promised.fast, meta.fast);
                prop_assert_eq!(Meta::decode(promised.encode()), Ok(promised));
            }
        }
    }
}
