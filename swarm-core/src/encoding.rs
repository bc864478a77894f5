//! The 64-bit words SWARM stores in disaggregated memory (SWARM §3.2, §3.3, §4.3).
//!
//! Three kinds of word are compared and swapped by memory nodes that cannot run
//! code, so their order must be the plain `u64` order:
//!
//! * a [`Tsp`] ("timestamp + flag"), stored in In-n-Out's metadata words and at the
//!   head of every data buffer (SWARM §4.3): the Safe-Guess tuple order of §3.2 is
//!   timestamp first, then writer id (ties), then `GUESSED < VERIFIED`;
//! * a [`LockWord`], the CAS object of a timestamp lock (§3.3, appendix B): a
//!   timestamp and a lock mode, or ⊥;
//! * their common part, a [`Timestamp`] `(ticks, writer)`.
//!
//! ```text
//!  63                                          12 11          1   0
//! +----------------------------------------------+-------------+---+
//! |            ticks (52 bits)                   | writer (11) | f |
//! +----------------------------------------------+-------------+---+
//! ```
//!
//! * **ticks** count timestamp ticks since the cluster epoch (both recorded in the
//!   node header). With the default 1 µs tick the horizon is 142 years; any tick of at
//!   least [`MIN_TICK_NS`] keeps it above five years. `0` means "no write yet" and the
//!   all-ones value is the delete tombstone (SWARM §5.3.2); writes past
//!   [`MAX_TICKS`] fail with [`EncodingError::PastHorizon`], they never wrap.
//! * **writer**: 2,048 writer ids.
//! * **f**: the Safe-Guess flag (`0` GUESSED, `1` VERIFIED) in a [`Tsp`], the lock
//!   mode (`0` READ, `1` WRITE) in a [`LockWord`].
//!
//! The word does not name the out-of-place buffer directly: the buffer of a write is
//! slot `hash(writer, ticks) mod slots` of the writer's log (see [`crate::layout`]),
//! so the log needs no index bits and its slots can be recycled; every buffer carries
//! its full word so that a reader detects a reused slot.

use core::fmt;

/// Bits of the tick count.
pub const TICK_BITS: u32 = 52;
/// Bits of the writer id.
pub const WRITER_BITS: u32 = 11;
/// Bits of the flag / mode.
pub const FLAG_BITS: u32 = 1;

const WRITER_SHIFT: u32 = FLAG_BITS;
const TICK_SHIFT: u32 = FLAG_BITS + WRITER_BITS;
const WRITER_MASK: u64 = (1 << WRITER_BITS) - 1;

/// Number of writer ids a client may have: `0..MAX_WRITERS`. The last id the
/// encoding can hold, [`RESET_WRITER`], is no client's: it marks the words of a reset
/// register ([`Tsp::reset_marker`]).
pub const MAX_WRITERS: u16 = (1 << WRITER_BITS) - 1;
/// The writer id of a register reset ([`Tsp::reset_marker`]): no client has it.
pub const RESET_WRITER: WriterId = WriterId(MAX_WRITERS);
/// The tick value reserved for delete tombstones (all ones).
pub const TOMBSTONE_TICKS: u64 = (1 << TICK_BITS) - 1;
/// The largest tick count a write may use.
pub const MAX_TICKS: u64 = TOMBSTONE_TICKS - 1;
/// Five years in nanoseconds (365.25-day years): the shortest acceptable horizon.
pub const FIVE_YEARS_NS: u64 = 5 * 365 * 24 * 3600 * 1_000_000_000 + 5 * 6 * 3600 * 1_000_000_000;
/// The shortest tick length that keeps the horizon at five years or more.
pub const MIN_TICK_NS: u64 = FIVE_YEARS_NS.div_ceil(MAX_TICKS);
/// The default tick length: 1 µs, a horizon of about 142 years.
pub const DEFAULT_TICK_NS: u64 = 1_000;

/// Why a word could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodingError {
    /// The writer id does not fit in [`WRITER_BITS`].
    #[error("writer id {0} is out of range: at most {MAX_WRITERS} writers are supported")]
    WriterOutOfRange(u32),
    /// The clock is past the cluster's timestamp horizon.
    #[error(
        "timestamp {0} is past the cluster's horizon of {MAX_TICKS} ticks: create a cluster with a new epoch"
    )]
    PastHorizon(u64),
    /// A tick length too short for a five-year horizon.
    #[error("tick length {0} ns gives a horizon under five years: use at least {MIN_TICK_NS} ns")]
    TickTooShort(u64),
}

/// Checks that a tick length gives at least a five-year horizon.
pub const fn check_tick_ns(tick_ns: u64) -> Result<(), EncodingError> {
    if tick_ns < MIN_TICK_NS {
        Err(EncodingError::TickTooShort(tick_ns))
    } else {
        Ok(())
    }
}

/// A writer id (a client thread that writes): `0..MAX_WRITERS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriterId(u16);

impl WriterId {
    /// Writer id 0.
    pub const FIRST: Self = Self(0);

    /// The writer id `id`, if it is in range.
    pub const fn new(id: u32) -> Result<Self, EncodingError> {
        if id < MAX_WRITERS as u32 {
            Ok(Self(id as u16))
        } else {
            Err(EncodingError::WriterOutOfRange(id))
        }
    }

    /// The id as an integer.
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for WriterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// A Safe-Guess timestamp: ticks, then writer id to break ties (SWARM §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    ticks: u64,
    writer: WriterId,
}

impl Timestamp {
    /// The timestamp `(ticks, writer)` of a write; `ticks` must be in `1..=MAX_TICKS`
    /// (0 is "never written" and is bumped to 1).
    pub const fn new(ticks: u64, writer: WriterId) -> Result<Self, EncodingError> {
        if ticks > MAX_TICKS {
            return Err(EncodingError::PastHorizon(ticks));
        }
        Ok(Self {
            ticks: if ticks == 0 { 1 } else { ticks },
            writer,
        })
    }

    /// The delete tombstone of `writer` (SWARM §5.3.2): above every write.
    pub const fn tombstone(writer: WriterId) -> Self {
        Self {
            ticks: TOMBSTONE_TICKS,
            writer,
        }
    }

    /// Ticks since the cluster epoch.
    pub const fn ticks(self) -> u64 {
        self.ticks
    }

    /// The writer that created this timestamp.
    pub const fn writer(self) -> WriterId {
        self.writer
    }

    /// Whether this is a delete tombstone.
    pub const fn is_tombstone(self) -> bool {
        self.ticks == TOMBSTONE_TICKS
    }

    const fn bits(self) -> u64 {
        (self.ticks << TICK_SHIFT) | ((self.writer.0 as u64) << WRITER_SHIFT)
    }

    const fn from_bits(word: u64) -> Self {
        Self {
            ticks: word >> TICK_SHIFT,
            writer: WriterId(((word >> WRITER_SHIFT) & WRITER_MASK) as u16),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_tombstone() {
            write!(f, "(tombstone,{})", self.writer)
        } else {
            write!(f, "({},{})", self.ticks, self.writer)
        }
    }
}

/// The Safe-Guess flag of a tuple (SWARM §3.2): `GUESSED < VERIFIED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Flag {
    /// The timestamp was guessed and may not be fresh.
    Guessed = 0,
    /// The timestamp is known fresh; readers may return the value at once.
    Verified = 1,
}

/// A tuple's order key as stored in memory: timestamp and flag in one word, ordered as
/// a plain `u64`. [`Tsp::EMPTY`] (0) is an empty register.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tsp(u64);

impl Tsp {
    /// The empty register: below every tuple.
    pub const EMPTY: Self = Self(0);

    /// The word for `(ts, flag)`.
    pub const fn new(ts: Timestamp, flag: Flag) -> Self {
        Self(ts.bits() | flag as u64)
    }

    /// Reinterprets a word read from memory.
    pub const fn from_word(word: u64) -> Self {
        Self(word)
    }

    /// The word to store.
    pub const fn word(self) -> u64 {
        self.0
    }

    /// Whether the register was never written.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The timestamp (meaningless for [`Tsp::EMPTY`]).
    pub const fn ts(self) -> Timestamp {
        Timestamp::from_bits(self.0)
    }

    /// The flag.
    pub const fn flag(self) -> Flag {
        if self.0 & 1 == 1 {
            Flag::Verified
        } else {
            Flag::Guessed
        }
    }

    /// The same timestamp with another flag.
    pub const fn with_flag(self, flag: Flag) -> Self {
        Self((self.0 & !1) | flag as u64)
    }

    /// Whether both words name the same write, whatever their flags: the `≈` an
    /// In-n-Out read uses to match the in-place record against the maximum (SWARM §4.3).
    pub const fn same_write(self, other: Self) -> bool {
        self.0 | 1 == other.0 | 1
    }

    /// Whether this is a delete tombstone.
    pub const fn is_tombstone(self) -> bool {
        !self.is_empty() && self.ts().is_tombstone()
    }

    /// The word a register reset leaves in every metadata word and in the delete
    /// word of every replica (`swarm-kv`'s recycling): "no value", at `ticks`, which
    /// the reset takes above every word the register held, so that no word ever goes
    /// down and none ever repeats a value of an earlier life (a CAS that expects an
    /// earlier life's word fails, however late it lands). Writes of the next life
    /// order above it like above any write. `None` past the horizon.
    pub const fn reset_marker(ticks: u64) -> Option<Self> {
        if ticks == 0 || ticks > MAX_TICKS {
            return None;
        }
        Some(Self::new(
            Timestamp {
                ticks,
                writer: RESET_WRITER,
            },
            Flag::Verified,
        ))
    }

    /// Whether this word is a reset's marker ([`Tsp::reset_marker`]).
    pub const fn is_reset(self) -> bool {
        !self.is_empty() && !self.is_tombstone() && self.ts().writer.0 == RESET_WRITER.0
    }

    /// Whether this word stands for no value: never written, or reset.
    pub const fn is_void(self) -> bool {
        self.is_empty() || self.is_reset()
    }
}

impl fmt::Debug for Tsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("⊥");
        }
        if self.is_reset() {
            return write!(f, "⊥@{}", self.ts().ticks());
        }
        let flag = match self.flag() {
            Flag::Guessed => "G",
            Flag::Verified => "V",
        };
        write!(f, "{}{}", self.ts(), flag)
    }
}

/// A timestamp lock mode (SWARM §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// A reader deems the guessed timestamp fresh: its writer must not rewrite it.
    Read = 0,
    /// The writer will rewrite the value: no reader may return the guessed tuple.
    Write = 1,
}

impl LockMode {
    /// The other mode.
    pub const fn opposite(self) -> Self {
        match self {
            Self::Read => Self::Write,
            Self::Write => Self::Read,
        }
    }
}

/// The CAS object of a timestamp lock (SWARM appendix B): `(ts, mode)` or ⊥ (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LockWord(u64);

impl LockWord {
    /// ⊥: never locked, below every `(ts, mode)`.
    pub const BOTTOM: Self = Self(0);

    /// The word for `(ts, mode)`.
    pub const fn new(ts: Timestamp, mode: LockMode) -> Self {
        Self(ts.bits() | mode as u64)
    }

    /// Reinterprets a word read from memory.
    pub const fn from_word(word: u64) -> Self {
        Self(word)
    }

    /// The word to store.
    pub const fn word(self) -> u64 {
        self.0
    }

    /// The locked timestamp, or `None` for ⊥.
    pub const fn ts(self) -> Option<Timestamp> {
        if self.0 == 0 {
            None
        } else {
            Some(Timestamp::from_bits(self.0))
        }
    }

    /// A word just above both modes of `ts` and below every later timestamp of
    /// `ts`'s writer: the next timestamp in `(ticks, writer)` order, mode READ. On a
    /// lock word, every `TRYLOCK(ts, ·)` fails (it sees a higher timestamp) while the
    /// writer's later timestamps climb over it as over any older lock. A node rebuilt
    /// from donors that hold both modes at `ts` gets it (`swarm_kv::repair`): copying
    /// either mode could give that mode a majority after the other won. No writer
    /// ever locks it: a slot's lock word only ever locks timestamps of the slot's
    /// writer.
    pub const fn above(ts: Timestamp) -> Self {
        Self((ts.bits() | 1).saturating_add(1))
    }

    /// The lock mode (meaningless for ⊥).
    pub const fn mode(self) -> LockMode {
        if self.0 & 1 == 1 {
            LockMode::Write
        } else {
            LockMode::Read
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn writer() -> impl Strategy<Value = WriterId> {
        (0..u32::from(MAX_WRITERS)).prop_map(|w| WriterId::new(w).unwrap())
    }

    fn extremes_ticks() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(1u64),
            Just(2),
            Just(MAX_TICKS),
            Just(MAX_TICKS - 1),
            1..=MAX_TICKS
        ]
    }

    fn extremes_writer() -> impl Strategy<Value = WriterId> {
        prop_oneof![
            Just(WriterId::new(0).unwrap()),
            Just(WriterId::new(u32::from(MAX_WRITERS) - 1).unwrap()),
            writer()
        ]
    }

    #[test]
    fn constants_meet_the_requirements() {
        const { assert!(MAX_WRITERS >= 1024) };
        const { assert!(TICK_BITS + WRITER_BITS + FLAG_BITS == 64) };
        assert!(u128::from(MAX_TICKS) * u128::from(MIN_TICK_NS) >= u128::from(FIVE_YEARS_NS));
        assert!(u128::from(MAX_TICKS) * u128::from(MIN_TICK_NS - 1) < u128::from(FIVE_YEARS_NS));
        assert!(check_tick_ns(DEFAULT_TICK_NS).is_ok());
        assert!(check_tick_ns(MIN_TICK_NS - 1).is_err());
        assert!(WriterId::new(u32::from(MAX_WRITERS)).is_err());
    }

    #[test]
    fn past_horizon_is_an_error_not_a_wrap() {
        let w = WriterId::new(3).unwrap();
        assert_eq!(
            Timestamp::new(MAX_TICKS + 1, w),
            Err(EncodingError::PastHorizon(MAX_TICKS + 1))
        );
        assert_eq!(
            Timestamp::new(u64::MAX, w),
            Err(EncodingError::PastHorizon(u64::MAX))
        );
        assert_eq!(
            Timestamp::new(0, w).unwrap().ticks(),
            1,
            "tick 0 is reserved"
        );
    }

    #[test]
    fn tombstone_beats_every_write_and_empty_is_below_all() {
        let top_writer = WriterId::new(u32::from(MAX_WRITERS) - 1).unwrap();
        let max_write = Tsp::new(
            Timestamp::new(MAX_TICKS, top_writer).unwrap(),
            Flag::Verified,
        );
        let tomb = Tsp::new(
            Timestamp::tombstone(WriterId::new(0).unwrap()),
            Flag::Guessed,
        );
        assert!(tomb > max_write);
        assert!(tomb.is_tombstone() && !max_write.is_tombstone());
        assert!(
            Tsp::EMPTY
                < Tsp::new(
                    Timestamp::new(1, WriterId::new(0).unwrap()).unwrap(),
                    Flag::Guessed
                )
        );
        assert!(!Tsp::EMPTY.is_tombstone());
        assert_eq!(LockWord::BOTTOM.ts(), None);
    }

    proptest! {
        #[test]
        fn tsp_roundtrips_at_extremes(t in extremes_ticks(), w in extremes_writer(), v: bool) {
            let flag = if v { Flag::Verified } else { Flag::Guessed };
            let ts = Timestamp::new(t, w).unwrap();
            let word = Tsp::new(ts, flag);
            let back = Tsp::from_word(word.word());
            prop_assert_eq!(back.ts(), ts);
            prop_assert_eq!(back.flag(), flag);
            prop_assert!(!back.is_empty());
            prop_assert!(back.same_write(word.with_flag(Flag::Guessed)));
        }

        #[test]
        fn lock_word_roundtrips(t in extremes_ticks(), w in extremes_writer(), m: bool) {
            let mode = if m { LockMode::Write } else { LockMode::Read };
            let ts = Timestamp::new(t, w).unwrap();
            let word = LockWord::from_word(LockWord::new(ts, mode).word());
            prop_assert_eq!(word.ts(), Some(ts));
            prop_assert_eq!(word.mode(), mode);
        }

        #[test]
        fn u64_order_is_tuple_order(t1 in extremes_ticks(), w1 in extremes_writer(), f1: bool,
                                    t2 in extremes_ticks(), w2 in extremes_writer(), f2: bool) {
            let flag = |v| if v { Flag::Verified } else { Flag::Guessed };
            let a = (Timestamp::new(t1, w1).unwrap(), flag(f1));
            let b = (Timestamp::new(t2, w2).unwrap(), flag(f2));
            let (x, y) = (Tsp::new(a.0, a.1), Tsp::new(b.0, b.1));
            prop_assert_eq!(x.word().cmp(&y.word()), a.cmp(&b));
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
        }
    }
}
