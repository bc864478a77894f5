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

use swarm_core::header::HEADER_SIZE;

/// Bit 63 of a watched word: the lease was killed (swarm-kv's convention, which the
/// client states by asking for the watch).
pub const KILLED: u64 = 1 << 63;
/// The shortest stall time a client may ask for (the watcher checks every few ms).
pub const MIN_STALL_NS: u64 = 50_000_000;
/// The longest stall time a client may ask for (one hour).
pub const MAX_STALL_NS: u64 = 3_600_000_000_000;
/// Bytes of an encoded [`WatchRequest`].
pub const WATCH_REQUEST_LEN: usize = 16;

/// A client's request: watch the word at `offset`, cut after `stall_ns` unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchRequest {
    /// Offset of the watched word in the node's memory (from byte 0 of the region).
    pub offset: u64,
    /// How long the word may stay unchanged before the client is cut off, ns.
    pub stall_ns: u64,
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
}

impl WatchRequest {
    /// The encoded form (sealed on the bootstrap connection): offset, stall, LE.
    pub fn to_bytes(&self) -> [u8; WATCH_REQUEST_LEN] {
        let mut out = [0u8; WATCH_REQUEST_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..].copy_from_slice(&self.stall_ns.to_le_bytes());
        out
    }

    /// Decodes an encoded request (any bytes decode; [`WatchRequest::check`] judges).
    pub fn from_bytes(bytes: &[u8; WATCH_REQUEST_LEN]) -> Self {
        let mut offset = [0u8; 8];
        let mut stall = [0u8; 8];
        offset.copy_from_slice(&bytes[..8]);
        stall.copy_from_slice(&bytes[8..]);
        Self {
            offset: u64::from_le_bytes(offset),
            stall_ns: u64::from_le_bytes(stall),
        }
    }

    /// Checks the request against a node serving `size` bytes.
    pub fn check(&self, size: u64) -> Result<(), WatchError> {
        if !self.offset.is_multiple_of(8) {
            return Err(WatchError::Unaligned {
                offset: self.offset,
            });
        }
        let inside =
            self.offset >= HEADER_SIZE && self.offset.checked_add(8).is_some_and(|end| end <= size);
        if !inside {
            return Err(WatchError::OutOfRegion {
                offset: self.offset,
                size,
            });
        }
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
            let request = WatchRequest { offset, stall_ns };
            assert_eq!(request.check(SIZE), Err(error), "{request:?}");
            // Every refusal says what to fix.
            assert!(!error.to_string().is_empty());
        }
    }

    proptest! {
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
