//! Tunables of the index.

use swarm_core::fabric::Nanos;

/// How an [`super::Index`] handle behaves. Times are on the fabric's clock
/// ([`swarm_core::Fabric::now`]); only durations are measured, so client clocks need
/// not be synchronised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexConfig {
    /// Identifies this client among all clients of the cluster (use its writer id,
    /// below 2048). Remove calls name themselves with it, so two clients must never
    /// share one.
    pub client_id: u16,
    /// How long a read waits for its preferred majority before also asking the other
    /// nodes, and how long a broadcast step waits for stragglers once a quorum
    /// answered.
    pub slow_after_ns: Nanos,
    /// Base of the randomised exponential backoff between contended attempts, and the
    /// pause before a reader re-reads a bucket with a change in flight.
    pub retry_delay_ns: Nanos,
    /// Cap of the backoff.
    pub max_backoff_ns: Nanos,
    /// How many times a lookup re-reads a bucket whose latest change is still open
    /// before running a Paxos round to settle it.
    pub read_retries: u32,
    /// How long a proposer waits for the owner of a decided change to acknowledge it
    /// before replacing it. A client stalled for longer than this in the middle of an
    /// update may get [`super::IndexError::OutcomeUnknown`]; a crashed client delays
    /// the next update of each bucket it touched by this much, once. Must be at
    /// least twice `max_backoff_ns + slow_after_ns` (checked by
    /// [`super::Index::new`]).
    pub ack_wait_ns: Nanos,
    /// Attempts before an update gives up with [`super::IndexError::Contention`].
    pub max_attempts: u32,
    /// Try a fast round (one roundtrip after the read) before the classic insert
    /// when the key's first bucket is settled (module docs of `crate::index`,
    /// "fast inserts"). Off, every insert promises, fences and accepts.
    pub fast_inserts: bool,
}

impl IndexConfig {
    /// Defaults for client `client_id`.
    pub fn new(client_id: u16) -> Self {
        Self {
            client_id,
            ..Self::default()
        }
    }
}

impl Default for IndexConfig {
    /// Client 0; timeouts sized for a microsecond-scale fabric.
    fn default() -> Self {
        Self {
            client_id: 0,
            slow_after_ns: 50_000,
            retry_delay_ns: 2_000,
            max_backoff_ns: 100_000,
            read_retries: 2,
            ack_wait_ns: 1_000_000,
            max_attempts: 10_000,
            fast_inserts: true,
        }
    }
}
