//! Reconnecting to memory nodes that failed: when, and whether to trust them again.
//!
//! A client marks a memory node failed at its first error completion (a flapping
//! link, a memory node that dropped the connection, a port reset). Without a way
//! back, a long-running client thread would lose one node per incident until it has
//! no majority left. So a failed node is retried in the background — a fresh queue
//! pair and a fresh bootstrap on a short-lived thread, never on the client's
//! progress path — with exponential backoff ([`FIRST_RETRY`] doubling to
//! [`MAX_RETRY`]). A node known to be up is tried at once instead: one that cut the
//! client off (it said so), and one the client gave up on because its queue pair held
//! a chain (the engine parks the posts to it until it is back, see
//! [`super::engine`]).
//!
//! **Whether the node may serve again** is decided by its incarnation
//! ([`crate::wire::RegionInfo::incarnation`]): a memory node process draws a random
//! one at start, and its memory lives exactly as long as the process. Same
//! incarnation, same memory: the node merely missed some of this client's batches,
//! which the protocol already treats like messages that never arrived (SWARM's
//! model is asynchronous; a failed batch may or may not have executed), so putting
//! it back in service is safe. A different incarnation means the node restarted
//! with empty memory: it would answer reads with zeros and could form a quorum that
//! misses acknowledged writes, so it is *not* put back ([`Verdict::Restarted`]);
//! it needs repair first. A node this client never reached has no known
//! incarnation and is not retried either, for the same reason.
//!
//! **Across the clients of one process.** A client thread's baseline is not its own
//! bootstrap: each cluster handle (an [`crate::RdmaCluster`], or the emulated
//! [`crate::emu::EmuTransport`]) pins every node's incarnation the first time one of
//! its clients reaches the node ([`IncarnationPins`]), and every later client checks
//! the incarnation its own bootstrap reports against that pin. A node that restarted
//! with empty memory between two `client()` calls is therefore left out by the
//! second client (and its pinned memory reported lost, [`swarm_core::Fabric::memory_lost`])
//! exactly as by a client that saw the restart on a reconnect. A configuration change
//! that admits a rebuilt node ([`swarm_core::Fabric::admit`]) moves the pin once a
//! client reconnects to the admitted incarnation.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use swarm_core::header::NodeHeader;

/// Delay before the first attempt to reconnect a node that just failed.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest delay between two attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(5);

/// What a client knew about a memory node when it first connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    /// The node's header.
    pub header: NodeHeader,
    /// The node process's incarnation.
    pub incarnation: u64,
}

/// Per memory node, the incarnation the clients of one cluster handle may use: the
/// first one any of them reached, or the one a configuration change admitted since
/// (module docs, "Across the clients of one process").
#[derive(Debug)]
pub struct IncarnationPins {
    pins: Mutex<Vec<Option<u64>>>,
}

impl IncarnationPins {
    /// No node pinned yet, for a cluster of `nodes` nodes.
    pub fn new(nodes: usize) -> Self {
        Self {
            pins: Mutex::new(vec![None; nodes]),
        }
    }

    /// Checks the incarnation `incarnation` that node `index` reported to a new
    /// client: pins it if the node had no pin (`Ok`); `Ok` if it is the pinned one;
    /// otherwise the pinned incarnation, whose memory is gone (`Err`). A node index
    /// out of range is never pinned (`Ok`).
    pub fn check(&self, index: usize, incarnation: u64) -> Result<(), u64> {
        let mut pins = self.lock();
        match pins.get_mut(index) {
            None => Ok(()),
            Some(pin @ None) => {
                *pin = Some(incarnation);
                Ok(())
            }
            Some(Some(pinned)) if *pinned == incarnation => Ok(()),
            Some(Some(pinned)) => Err(*pinned),
        }
    }

    /// The incarnation pinned for node `index`, if any.
    pub fn get(&self, index: usize) -> Option<u64> {
        self.lock().get(index).copied().flatten()
    }

    /// Moves node `index`'s pin to `incarnation`, which a configuration change
    /// admitted and a client found running ([`swarm_core::Fabric::admit`]).
    pub fn admit(&self, index: usize, incarnation: u64) {
        if let Some(pin) = self.lock().get_mut(index) {
            *pin = Some(incarnation);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<u64>>> {
        self.pins.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a node that answered a reconnect is the one the client knew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same process, same memory: back in service.
    Same,
    /// The node process restarted: its memory is empty.
    Restarted {
        /// The incarnation the client knew.
        old: u64,
        /// The one it has now.
        new: u64,
    },
    /// Another node answered at that address (another cluster, id or size).
    Other,
}

/// Judges a reconnected node against what the client knew.
pub fn judge(known: &Known, header: &NodeHeader, incarnation: u64) -> Verdict {
    if *header != known.header {
        Verdict::Other
    } else if incarnation != known.incarnation {
        Verdict::Restarted {
            old: known.incarnation,
            new: incarnation,
        }
    } else {
        Verdict::Same
    }
}

/// The delay after `previous` (doubling, capped at [`MAX_RETRY`]).
pub fn next_backoff(previous: Duration) -> Duration {
    (previous * 2).clamp(FIRST_RETRY, MAX_RETRY)
}

/// Where one node stands, as far as reconnecting goes.
#[derive(Debug)]
pub enum Slot<A> {
    /// In service (or never reached: then nothing is tried).
    Live,
    /// Failed; the next attempt starts at `at`.
    Waiting {
        /// When to try.
        at: Instant,
        /// The delay that led here.
        backoff: Duration,
    },
    /// An attempt is running; `attempt` reports its outcome.
    Trying {
        /// The running attempt (a channel from its thread).
        attempt: A,
        /// The delay that led here.
        backoff: Duration,
    },
    /// Never again: the node restarted, or is another node, or the device died.
    Retired,
}

impl<A> Slot<A> {
    /// A node that just failed: first attempt after [`FIRST_RETRY`].
    pub fn failed(now: Instant) -> Self {
        Self::Waiting {
            at: now + FIRST_RETRY,
            backoff: FIRST_RETRY,
        }
    }

    /// After a failed attempt that had waited `backoff`: wait longer.
    pub fn retry_later(now: Instant, backoff: Duration) -> Self {
        let backoff = next_backoff(backoff);
        Self::Waiting {
            at: now + backoff,
            backoff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> NodeHeader {
        NodeHeader {
            node_id: 1,
            node_count: 3,
            size: 1 << 20,
            cluster_id: 9,
            epoch_unix_ns: 5,
            tick_ns: 1000,
        }
    }

    #[test]
    fn only_the_same_incarnation_of_the_same_node_serves_again() {
        let known = Known {
            header: header(),
            incarnation: 0xaaaa,
        };
        assert_eq!(judge(&known, &header(), 0xaaaa), Verdict::Same);
        assert_eq!(
            judge(&known, &header(), 0xbbbb),
            Verdict::Restarted {
                old: 0xaaaa,
                new: 0xbbbb
            }
        );
        let mut other = header();
        other.cluster_id = 10;
        assert_eq!(judge(&known, &other, 0xaaaa), Verdict::Other);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(next_backoff(FIRST_RETRY), FIRST_RETRY * 2);
        assert_eq!(next_backoff(Duration::ZERO), FIRST_RETRY);
        assert_eq!(next_backoff(MAX_RETRY), MAX_RETRY);
        let now = Instant::now();
        let Slot::<()>::Waiting { at, backoff } = Slot::retry_later(now, Duration::from_secs(4))
        else {
            panic!("not waiting")
        };
        assert_eq!((at - now, backoff), (MAX_RETRY, MAX_RETRY));
    }
}
