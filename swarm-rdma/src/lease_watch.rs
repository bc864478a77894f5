//! A memory node's watch on a client's lease word: when to cut a client off.
//!
//! SWARM-KV clients hold leases in the memory nodes' own memory (swarm-kv's
//! `lease` module: a renewal counter that only grows while the owner lives, bit 63
//! set once a reclaimer killed it). A client whose lease expired fences itself (it
//! posts nothing after its operation deadline). On RDMA a memory node can add
//! defence in depth: cut the client's queue pair, so that a partitioned or hung
//! client that wakes up late cannot write through a queue pair it still holds even
//! if its self-fence were wrong (issue 11 item 1).
//!
//! The memory node runs no protocol code and knows nothing of swarm-kv's layout
//! (SWARM §2.1), so the client names the word itself: "watch the 8-byte word at
//! offset `offset` of your memory; cut me off if it has bit 63 set, or if it does not
//! change for `stall_ns`". This module is that rule, pure (times are plain
//! nanoseconds on the memory node's monotonic clock), so it is tested without a
//! device or a socket:
//!
//! * [`WatchRequest::check`] bounds what a client may ask: an 8-byte aligned word
//!   inside the served region, past the node header, and a stall time in
//!   [`MIN_STALL_NS`]..=[`MAX_STALL_NS`] (the watcher's work per client is one word
//!   read per period, and its state per client is one [`WordWatch`]: bounded by the
//!   client limit).
//! * [`WordWatch::arm`] refuses a word that is already killed: a client whose lease a
//!   reclaimer killed must not get a fresh queue pair by reconnecting.
//! * [`WordWatch::observe`] keeps the client while the word changes and is not
//!   killed, and cuts it once the word is killed or has not changed for `stall_ns`.
//!
//! Why this is safe for live clients: the client picks `stall_ns` at least as long
//! as a reclaimer waits before it may kill the lease (swarm-kv: `lease·(1 + 1/8) +
//! grace`, the observer's wait), so the stall rule only fires once the owner's own
//! clock says its lease ran out, whatever the clock drift within the stated bound.
//! An idle owner whose lease merely lapsed (not killed) may revive it; a cut owner
//! reconnects and re-arms, which [`WordWatch::arm`] allows unless the word is killed.
//!
//! # Revocation: why a takeover never races a stopped owner's stores
//!
//! The watch alone is not enough for a takeover. A lease bounds when a client
//! *starts* stores, not when they land: a client stopped after its last fence check
//! (SIGSTOP, a VM's stolen time) holds queue pairs with requests it posted, or is
//! about to post, and they land whenever it runs again. rTX (seed `rtx.txt`) calls
//! such a store a "fly WRITE": it can land after its lease expired, even with
//! perfect clocks, so a lease's expiry alone must never release anything. The watch
//! polls (every 10 ms), so a kill followed at once by a takeover is not even seen in
//! time. So a reclaimer that killed a lease on a majority *revokes* it on every node
//! before it takes the row over or releases it, and waits for each node's
//! acknowledgement ([`RevokeRequest`], swarm-kv's `writer_takeover`):
//!
//! * The client names, with its watch, the first lease counter of its generation
//!   ([`WatchRequest::base`]; every counter it writes is at or above it).
//! * On a revocation of word `W` up to counter `floor`, the node reads `W`. Not
//!   killed there: it revokes nothing and says so with the word (the reclaimer kills
//!   it from that value and asks again; a kill is final for the owner's generation,
//!   so the owner renews nothing on that node afterwards). Killed: it records the
//!   floor (the larger of the request's and the killed counter), destroys the queue
//!   pair of every client watching `W` with a base at or below it, and only then
//!   acknowledges ([`Revocations::revoke`]). A destroyed queue pair's requests,
//!   queued or still to be posted, are executed by nobody.
//! * From then on the node refuses to watch `W` for a base at or below the floor
//!   ([`Revocations::admits`]): the revoked owner cannot come back through a
//!   reconnect, whatever the word holds later. A new owner's base is above every
//!   counter it saw, the floors included, so it is watched.
//!
//! Why a request and a reply on the bootstrap connection rather than an
//! acknowledgement word in node memory: the node needs a request anyway to know what
//! to revoke; the reply comes once the cut is done, with no polling by the reclaimer;
//! it is proved over the session transcript like every message there; and no word
//! of the served memory is ever written by the node's CPU while the NIC serves it
//! (CPU stores and NIC atomics on one word are not atomic with each other).
//!
//! A client fences itself before it stores anything under its row (swarm-kv's
//! `register`, right after its first renewal): before that it stores nothing but
//! CASes, harmless whenever they land. Paused between its claim and its first
//! renewal, it may renew over the kill aimed at it and fence itself above a floor
//! already acknowledged; the reclaimer revokes it again, up to the counters it reads
//! once its own claim landed, before it uses the row (swarm-kv's `writer_takeover`,
//! "A registration paused before its fence").
//! A node that restarted has no queue pair of the owner and no memory of it: while
//! the reclaimer holds that incarnation lost it does not ask it. Once a repair
//! rebuilt it and the reclaimer admitted the new incarnation, it asks it like any
//! other (the revoked owner may have fenced itself there:
//! `RdmaFabric::revoke_lease_word`). A node that does not answer stalls the
//! takeover, which is liveness, not safety. The floors are per word (one per writer
//! row that was ever revoked, at most [`MAX_REVOKED_WORDS`]), and lost with the
//! process, with the queue pairs they guard: a node a repair admits after the
//! reclaimer read the configuration knows none (ARCHITECTURE.md, "Limitations").

use swarm_core::header::HEADER_SIZE;

/// Bit 63 of a watched word: the lease was killed (swarm-kv's convention, which the
/// client states by asking for the watch).
pub const KILLED: u64 = 1 << 63;
/// The shortest stall time a client may ask for (the watcher checks every few ms).
pub const MIN_STALL_NS: u64 = 50_000_000;
/// The longest stall time a client may ask for (one hour).
pub const MAX_STALL_NS: u64 = 3_600_000_000_000;
/// Bytes of an encoded [`WatchRequest`].
pub const WATCH_REQUEST_LEN: usize = 24;
/// Bytes of an encoded [`RevokeRequest`].
pub const REVOKE_REQUEST_LEN: usize = 16;
/// How many distinct words a memory node remembers revocations of (one per writer
/// row ever revoked); a revocation of one more is refused (the takeover waits).
pub const MAX_REVOKED_WORDS: usize = 1 << 16;

/// A client's request: watch the word at `offset`, cut after `stall_ns` unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchRequest {
    /// Offset of the watched word in the node's memory (from byte 0 of the region).
    pub offset: u64,
    /// How long the word may stay unchanged before the client is cut off, ns.
    pub stall_ns: u64,
    /// The first lease counter of the client's generation: a revocation of the word
    /// up to a counter at or above it cuts the client (module docs, "Revocation").
    pub base: u64,
}

/// A reclaimer's request: revoke every client watching the word at `offset` with a
/// base at or below `floor`, if the word is killed (module docs, "Revocation").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevokeRequest {
    /// Offset of the lease word in the node's memory.
    pub offset: u64,
    /// The largest lease counter the reclaimer saw in the word.
    pub floor: u64,
}

/// Why a watch request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The offset is not a multiple of 8.
    #[error("watched word offset {offset:#x} is not 8-byte aligned")]
    Unaligned {
        /// The offset asked for.
        offset: u64,
    },
    /// The word is not inside the served region past the node header.
    #[error(
        "watched word offset {offset:#x} is outside the served memory ({HEADER_SIZE}..{size} bytes)"
    )]
    OutOfRegion {
        /// The offset asked for.
        offset: u64,
        /// Bytes served.
        size: u64,
    },
    /// The stall time is outside the accepted range.
    #[error(
        "lease stall time {stall_ns} ns is outside {MIN_STALL_NS}..={MAX_STALL_NS} ns: \
         ask for the lease duration plus its drift and grace margin"
    )]
    BadStall {
        /// The stall time asked for.
        stall_ns: u64,
    },
    /// The word is already killed: the client's lease expired and was taken over.
    #[error("the watched lease word is killed (bit 63 set): the client's lease expired")]
    Killed,
    /// A reclaimer revoked this client's generation of the word: it may never be
    /// watched (nor served) again.
    #[error(
        "the client's lease was revoked (generation base {base} is at or below the \
         revoked counter {floor}): its writer id was taken over"
    )]
    Revoked {
        /// The generation base asked for.
        base: u64,
        /// The node's revocation floor for the word.
        floor: u64,
    },
    /// The node remembers revocations of as many words as it may
    /// ([`MAX_REVOKED_WORDS`]).
    #[error("the memory node already remembers revocations of {MAX_REVOKED_WORDS} words")]
    TooManyRevoked,
}

/// The little-endian word at `at` of `bytes` (in bounds by construction).
fn word_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Checks that `offset` names an aligned word inside a region of `size` bytes, past
/// the node header.
fn check_word(offset: u64, size: u64) -> Result<(), WatchError> {
    if !offset.is_multiple_of(8) {
        return Err(WatchError::Unaligned { offset });
    }
    let inside = offset >= HEADER_SIZE && offset.checked_add(8).is_some_and(|end| end <= size);
    if !inside {
        return Err(WatchError::OutOfRegion { offset, size });
    }
    Ok(())
}

impl RevokeRequest {
    /// The encoded form (sealed on the bootstrap connection): offset, floor, LE.
    pub fn to_bytes(&self) -> [u8; REVOKE_REQUEST_LEN] {
        let mut out = [0u8; REVOKE_REQUEST_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..].copy_from_slice(&self.floor.to_le_bytes());
        out
    }

    /// Decodes an encoded request (any bytes decode; [`RevokeRequest::check`] judges).
    pub fn from_bytes(bytes: &[u8; REVOKE_REQUEST_LEN]) -> Self {
        Self {
            offset: word_at(bytes, 0),
            floor: word_at(bytes, 8),
        }
    }

    /// Checks the request against a node serving `size` bytes.
    pub fn check(&self, size: u64) -> Result<(), WatchError> {
        check_word(self.offset, size)
    }
}

/// What a node does with a revocation, given the word it reads now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeVerdict {
    /// The word is not killed on this node: nothing revoked (the reclaimer kills it
    /// from this value and asks again).
    NotKilled {
        /// The word read.
        word: u64,
    },
    /// Cut every client watching the word with a base at or below `floor`
    /// ([`Revocations::cuts`]), then acknowledge.
    Revoke {
        /// The word's revocation floor now.
        floor: u64,
    },
}

/// A memory node's revocation floors, per watched word (module docs, "Revocation").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocations {
    floors: std::collections::HashMap<u64, u64>,
}

impl Revocations {
    /// No revocation yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges a checked revocation whose word reads `word` now: records the floor
    /// (never lowered) if the word is killed.
    pub fn revoke(
        &mut self,
        request: RevokeRequest,
        word: u64,
    ) -> Result<RevokeVerdict, WatchError> {
        if word & KILLED == 0 {
            return Ok(RevokeVerdict::NotKilled { word });
        }
        let asked = request.floor.max(word & !KILLED);
        let known = self.floors.get(&request.offset).copied();
        if known.is_none() && self.floors.len() >= MAX_REVOKED_WORDS {
            return Err(WatchError::TooManyRevoked);
        }
        let floor = known.map_or(asked, |f| f.max(asked));
        self.floors.insert(request.offset, floor);
        Ok(RevokeVerdict::Revoke { floor })
    }

    /// Whether a client watching with `request` may be served: not if its word was
    /// revoked at or above its base.
    pub fn admits(&self, request: &WatchRequest) -> Result<(), WatchError> {
        match self.floors.get(&request.offset) {
            Some(&floor) if request.base <= floor => Err(WatchError::Revoked {
                base: request.base,
                floor,
            }),
            _ => Ok(()),
        }
    }

    /// Whether a revocation of `offset` up to `floor` cuts a client watching with
    /// `request`.
    pub fn cuts(offset: u64, floor: u64, request: &WatchRequest) -> bool {
        request.offset == offset && request.base <= floor
    }

    /// Words with a revocation floor.
    pub fn len(&self) -> usize {
        self.floors.len()
    }

    /// Whether no word was revoked.
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
    }
}

impl WatchRequest {
    /// The encoded form (sealed on the bootstrap connection): offset, stall, base,
    /// LE.
    pub fn to_bytes(&self) -> [u8; WATCH_REQUEST_LEN] {
        let mut out = [0u8; WATCH_REQUEST_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..16].copy_from_slice(&self.stall_ns.to_le_bytes());
        out[16..].copy_from_slice(&self.base.to_le_bytes());
        out
    }

    /// Decodes an encoded request (any bytes decode; [`WatchRequest::check`] judges).
    pub fn from_bytes(bytes: &[u8; WATCH_REQUEST_LEN]) -> Self {
        Self {
            offset: word_at(bytes, 0),
            stall_ns: word_at(bytes, 8),
            base: word_at(bytes, 16),
        }
    }

    /// Checks the request against a node serving `size` bytes.
    pub fn check(&self, size: u64) -> Result<(), WatchError> {
        check_word(self.offset, size)?;
        if !(MIN_STALL_NS..=MAX_STALL_NS).contains(&self.stall_ns) {
            return Err(WatchError::BadStall {
                stall_ns: self.stall_ns,
            });
        }
        Ok(())
    }
}

/// Why a client was cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutReason {
    /// The word has bit 63 set: a reclaimer killed the lease.
    Killed {
        /// The word read.
        word: u64,
    },
    /// A reclaimer revoked the client's generation of the word (module docs,
    /// "Revocation").
    Revoked {
        /// The word's revocation floor.
        floor: u64,
    },
    /// The word did not change for at least the requested stall time.
    Stalled {
        /// The word read.
        word: u64,
        /// How long it has not changed, ns.
        for_ns: u64,
    },
}

impl std::fmt::Display for CutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Killed { word } => write!(f, "its lease word {word:#x} was killed"),
            Self::Revoked { floor } => write!(
                f,
                "a reclaimer revoked its lease (counters up to {floor}) to take its writer id over"
            ),
            Self::Stalled { word, for_ns } => write!(
                f,
                "its lease word stayed {word:#x} for {} ms (not renewed)",
                for_ns / 1_000_000
            ),
        }
    }
}

/// What to do with a watched client after one observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The lease is alive (or still within its stall time): keep the client.
    Keep,
    /// Cut the client's queue pair.
    Cut(CutReason),
}

/// The watch on one client's word: the value last seen and since when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WordWatch {
    request: WatchRequest,
    value: u64,
    since_ns: u64,
}

impl WordWatch {
    /// Arms a checked request whose word reads `word` at `now_ns`; refuses a killed
    /// word.
    pub fn arm(request: WatchRequest, now_ns: u64, word: u64) -> Result<Self, WatchError> {
        if word & KILLED != 0 {
            return Err(WatchError::Killed);
        }
        Ok(Self {
            request,
            value: word,
            since_ns: now_ns,
        })
    }

    /// The request being watched.
    pub fn request(&self) -> WatchRequest {
        self.request
    }

    /// Records that the word reads `word` at `now_ns` (monotonic) and judges it.
    pub fn observe(&mut self, now_ns: u64, word: u64) -> Verdict {
        if word & KILLED != 0 {
            return Verdict::Cut(CutReason::Killed { word });
        }
        if word != self.value {
            self.value = word;
            self.since_ns = now_ns;
            return Verdict::Keep;
        }
        let for_ns = now_ns.saturating_sub(self.since_ns);
        if for_ns >= self.request.stall_ns {
            Verdict::Cut(CutReason::Stalled { word, for_ns })
        } else {
            Verdict::Keep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SIZE: u64 = 1 << 20;
    const STALL: u64 = 100_000_000;

    fn request() -> WatchRequest {
        WatchRequest {
            offset: 4096,
            stall_ns: STALL,
            base: 10,
        }
    }

    #[test]
    fn a_stalled_word_is_cut_once_its_stall_time_has_passed() {
        let mut watch = WordWatch::arm(request(), 1_000, 7).unwrap();
        assert_eq!(watch.observe(1_000 + STALL - 1, 7), Verdict::Keep);
        assert_eq!(
            watch.observe(1_000 + STALL, 7),
            Verdict::Cut(CutReason::Stalled {
                word: 7,
                for_ns: STALL
            })
        );
    }

    #[test]
    fn an_advancing_word_is_kept_and_restarts_the_stall_clock() {
        let mut watch = WordWatch::arm(request(), 0, 7).unwrap();
        for step in 1..50u64 {
            // Each renewal lands just before the stall time runs out.
            let now = step * (STALL - 1);
            assert_eq!(watch.observe(now, 7 + step), Verdict::Keep, "step {step}");
        }
        // Then it stops: cut one stall time after the last change.
        let last = 49 * (STALL - 1);
        assert_eq!(watch.observe(last + STALL - 1, 7 + 49), Verdict::Keep);
        assert!(matches!(
            watch.observe(last + STALL, 7 + 49),
            Verdict::Cut(CutReason::Stalled { .. })
        ));
    }

    #[test]
    fn a_killed_word_is_cut_at_once_and_cannot_be_armed() {
        let mut watch = WordWatch::arm(request(), 0, 7).unwrap();
        assert_eq!(
            watch.observe(1, 7 | KILLED),
            Verdict::Cut(CutReason::Killed { word: 7 | KILLED })
        );
        assert_eq!(
            WordWatch::arm(request(), 0, 8 | KILLED),
            Err(WatchError::Killed)
        );
    }

    #[test]
    fn a_clock_that_seems_to_go_back_never_cuts() {
        let mut watch = WordWatch::arm(request(), 5 * STALL, 7).unwrap();
        assert_eq!(watch.observe(0, 7), Verdict::Keep);
    }

    #[test]
    fn bad_addresses_and_stall_times_are_refused() {
        assert_eq!(request().check(SIZE), Ok(()));
        let last = WatchRequest {
            offset: SIZE - 8,
            ..request()
        };
        assert_eq!(last.check(SIZE), Ok(()));
        let cases = [
            (4097, STALL, WatchError::Unaligned { offset: 4097 }),
            (
                0,
                STALL,
                WatchError::OutOfRegion {
                    offset: 0,
                    size: SIZE,
                },
            ),
            (
                HEADER_SIZE - 8,
                STALL,
                WatchError::OutOfRegion {
                    offset: HEADER_SIZE - 8,
                    size: SIZE,
                },
            ),
            (
                SIZE,
                STALL,
                WatchError::OutOfRegion {
                    offset: SIZE,
                    size: SIZE,
                },
            ),
            (
                u64::MAX - 7,
                STALL,
                WatchError::OutOfRegion {
                    offset: u64::MAX - 7,
                    size: SIZE,
                },
            ),
            (4096, 0, WatchError::BadStall { stall_ns: 0 }),
            (
                4096,
                MIN_STALL_NS - 1,
                WatchError::BadStall {
                    stall_ns: MIN_STALL_NS - 1,
                },
            ),
            (
                4096,
                MAX_STALL_NS + 1,
                WatchError::BadStall {
                    stall_ns: MAX_STALL_NS + 1,
                },
            ),
        ];
        for (offset, stall_ns, error) in cases {
            let request = WatchRequest {
                offset,
                stall_ns,
                base: 1,
            };
            assert_eq!(request.check(SIZE), Err(error), "{request:?}");
            // Every refusal says what to fix.
            assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn a_revocation_needs_the_word_killed_and_records_the_larger_floor() {
        let mut revoked = Revocations::new();
        let revoke = RevokeRequest {
            offset: 4096,
            floor: 12,
        };
        // Not killed on this node: nothing is revoked, and the reclaimer learns the
        // word to kill it from.
        assert_eq!(
            revoked.revoke(revoke, 13),
            Ok(RevokeVerdict::NotKilled { word: 13 })
        );
        assert!(revoked.is_empty());
        assert_eq!(revoked.admits(&request()), Ok(()));
        // Killed at counter 13 (the owner renewed once more on this node than the
        // reclaimer saw): the floor is the larger of the two.
        assert_eq!(
            revoked.revoke(revoke, 13 | KILLED),
            Ok(RevokeVerdict::Revoke { floor: 13 })
        );
        // A later revocation of the same word with a lower floor never lowers it.
        let lower = RevokeRequest { floor: 2, ..revoke };
        assert_eq!(
            revoked.revoke(lower, 3 | KILLED),
            Ok(RevokeVerdict::Revoke { floor: 13 })
        );
        assert_eq!(revoked.len(), 1);
    }

    #[test]
    fn a_revoked_generation_is_cut_and_never_watched_again_but_the_next_one_is() {
        let mut revoked = Revocations::new();
        let owner = request(); // base 10
        let Ok(RevokeVerdict::Revoke { floor }) = revoked.revoke(
            RevokeRequest {
                offset: owner.offset,
                floor: 11,
            },
            11 | KILLED,
        ) else {
            panic!("a killed word is revoked");
        };
        assert!(Revocations::cuts(owner.offset, floor, &owner));
        // Another word (another writer row) is not touched.
        let other = WatchRequest {
            offset: 4104,
            ..owner
        };
        assert!(!Revocations::cuts(owner.offset, floor, &other));
        assert_eq!(revoked.admits(&other), Ok(()));
        // The revoked owner reconnecting: refused, whatever the word holds by then
        // (a new owner's counter is not killed).
        assert_eq!(
            revoked.admits(&owner),
            Err(WatchError::Revoked {
                base: 10,
                floor: 11
            })
        );
        let at_floor = WatchRequest { base: 11, ..owner };
        assert!(revoked.admits(&at_floor).is_err());
        assert!(Revocations::cuts(owner.offset, floor, &at_floor));
        // The next owner's base is above every counter it saw: served, and not cut.
        let next = WatchRequest { base: 12, ..owner };
        assert_eq!(revoked.admits(&next), Ok(()));
        assert!(!Revocations::cuts(owner.offset, floor, &next));
    }

    #[test]
    fn a_node_remembers_a_bounded_number_of_revoked_words() {
        let mut revoked = Revocations::new();
        for i in 0..MAX_REVOKED_WORDS as u64 {
            let request = RevokeRequest {
                offset: 4096 + 8 * i,
                floor: 1,
            };
            assert!(revoked.revoke(request, KILLED | 1).is_ok());
        }
        let one_more = RevokeRequest {
            offset: 4096 + 8 * MAX_REVOKED_WORDS as u64,
            floor: 1,
        };
        assert_eq!(
            revoked.revoke(one_more, KILLED | 1),
            Err(WatchError::TooManyRevoked)
        );
        // A word already remembered is revoked again.
        let again = RevokeRequest {
            offset: 4096,
            floor: 5,
        };
        assert_eq!(
            revoked.revoke(again, KILLED | 1),
            Ok(RevokeVerdict::Revoke { floor: 5 })
        );
    }

    proptest! {
        /// Revocation requests roundtrip, and any 16 bytes decode without
        /// panicking into a request that `check` accepts only inside the region.
        #[test]
        fn revocations_roundtrip_and_any_bytes_are_judged(bytes: [u8; REVOKE_REQUEST_LEN], size in 0u64..(1 << 40)) {
            let request = RevokeRequest::from_bytes(&bytes);
            prop_assert_eq!(request.to_bytes(), bytes);
            if request.check(size).is_ok() {
                prop_assert!(request.offset.is_multiple_of(8));
                prop_assert!(request.offset >= HEADER_SIZE && request.offset + 8 <= size);
            }
        }

        /// A client is cut by a revocation exactly when it would be refused
        /// afterwards: its word, and a base at or below the floor.
        #[test]
        fn cut_and_refused_agree(base in 0u64..100, floor in 0u64..100, killed in 0u64..100) {
            let mut revoked = Revocations::new();
            let owner = WatchRequest { base, ..request() };
            let verdict = revoked.revoke(RevokeRequest { offset: owner.offset, floor }, killed | KILLED);
            let Ok(RevokeVerdict::Revoke { floor: now }) = verdict else {
                return Err(TestCaseError::fail("a killed word is revoked"));
            };
            prop_assert_eq!(now, floor.max(killed));
            prop_assert_eq!(Revocations::cuts(owner.offset, now, &owner), revoked.admits(&owner).is_err());
        }

        /// Encoding roundtrips, and any 16 bytes decode without panicking into a
        /// request that `check` either accepts (then it names a word inside the
        /// region) or refuses.
        #[test]
        fn requests_roundtrip_and_any_bytes_are_judged(bytes: [u8; WATCH_REQUEST_LEN], size in 0u64..(1 << 40)) {
            let request = WatchRequest::from_bytes(&bytes);
            prop_assert_eq!(request.to_bytes(), bytes);
            if request.check(size).is_ok() {
                prop_assert!(request.offset.is_multiple_of(8));
                prop_assert!(request.offset >= HEADER_SIZE && request.offset + 8 <= size);
                prop_assert!((MIN_STALL_NS..=MAX_STALL_NS).contains(&request.stall_ns));
            }
        }

        /// A word that changes at least once per stall time is never cut; a word
        /// that stops changing is cut exactly when its stall time has passed.
        #[test]
        fn the_verdict_follows_the_last_change(gaps in proptest::collection::vec(1u64..STALL, 1..40), stop in 0u64..(2 * STALL)) {
            let mut watch = WordWatch::arm(request(), 0, 1).unwrap();
            let mut now = 0;
            for (i, gap) in gaps.iter().enumerate() {
                now += gap;
                prop_assert_eq!(watch.observe(now, 2 + i as u64), Verdict::Keep);
            }
            let word = 1 + gaps.len() as u64;
            let verdict = watch.observe(now + stop, word);
            if stop >= STALL {
                prop_assert_eq!(verdict, Verdict::Cut(CutReason::Stalled { word, for_ns: stop }));
            } else {
                prop_assert_eq!(verdict, Verdict::Keep);
            }
        }
    }
}
