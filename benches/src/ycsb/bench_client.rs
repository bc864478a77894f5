//! What the harness needs from a system's client, so that SWARM-KV (and its register
//! protocol baselines RAW and DM-ABD) and FUSEE run through the same driver, phases,
//! statistics and history recording.

use swarm_core::fabric::{EmulatedRtt, FailNodes};
use swarm_core::{DeleteOutcome, Fabric, OpStats};
use swarm_fusee::{FuseeClient, FuseeError};
use swarm_shm::{EmulatedFabric, ShmFabric};

use swarm_kv::{KvClient, KvError, SystemClock};

/// Why a benchmark operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// A SWARM-KV (or RAW / DM-ABD) operation failed.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A FUSEE operation failed.
    #[error(transparent)]
    Fusee(#[from] FuseeError),
}

/// One client thread's handle on the system under test.
pub(crate) trait BenchClient {
    /// The transport under the fault injector.
    type Transport: Fabric;
    /// The fabric handle (to crash a node for this client, and drive progress).
    fn fabric(&self) -> &FailNodes<Self::Transport>;
    /// The value of `key` into `value` (its content replaced): whether `key` is
    /// present (absent: `value` emptied). A client thread reads every value into one
    /// buffer, as an application on the zero-allocation path does.
    async fn get_into(
        &self,
        key: &[u8],
        value: &mut Vec<u8>,
        stats: &OpStats,
    ) -> Result<bool, OpError>;
    /// Sets `key` if present; whether it was.
    async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, OpError>;
    /// Sets `key`.
    async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), OpError>;
    /// Deletes `key`: whether it removed the value, found it absent, or raced another
    /// delete of the same value (SWARM-KV only).
    async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, OpError>;
    /// Gives back what the client holds (its writer id).
    fn close(self);
    /// Whether work the client left past its operations' return waits (SWARM-KV:
    /// the index unmaps of deletes that returned at their tombstone).
    fn has_deferred_work(&self) -> bool {
        false
    }
    /// Runs the deferred work until none waits (the harness keeps it running next
    /// to the client's operations).
    async fn run_deferred_work(&self) {}
    /// Lease renewals acknowledged so far (systems without leases: 0).
    fn lease_renewals(&self) -> u64 {
        0
    }
    /// Keeps the client's lease while its thread runs no operation (waiting for the
    /// other clients at a phase boundary); systems without leases: nothing.
    fn keep_alive(&self) {}
    /// Whether the client's lease is lost for good (killed by a reclaimer): every
    /// later operation fails, so the harness connects a new client. Systems without
    /// leases: never.
    fn lease_lost(&self) -> bool {
        false
    }
    /// The writer id the client holds, for logs (systems without one: `None`).
    fn writer(&self) -> Option<u16> {
        None
    }
    /// What the client recycled so far, and the log slots it holds now (systems
    /// that recycle nothing: zeros and `None`).
    fn recycling(&self) -> Recycling {
        Recycling::default()
    }
}

/// One client's memory recycling, as [`BenchClient::recycling`] reports it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Recycling {
    /// Out-of-place log slots given back to the writer's log.
    pub slots: u64,
    /// Registers reset and handed out again.
    pub registers: u64,
    /// Registers taken from gone clients' limbos and pools (`swarm_kv::registers::limbo`).
    pub reclaimed_registers: u64,
    /// Registers reset for any client, beyond the pool a client keeps
    /// (`swarm_kv::registers::recycle`, "donations").
    pub donated_registers: u64,
    /// Log slots in use now (live values, writes in flight, slots waiting out the
    /// grace).
    pub log_slots_in_use: Option<u64>,
    /// Index unmaps run after their delete returned.
    pub deferred_unmaps: u64,
    /// Roundtrips those unmaps took, in all.
    pub deferred_unmap_roundtrips: u64,
}

impl<F: Fabric> BenchClient for KvClient<FailNodes<F>, SystemClock> {
    type Transport = F;
    fn fabric(&self) -> &FailNodes<F> {
        KvClient::fabric(self)
    }
    async fn get_into(
        &self,
        key: &[u8],
        value: &mut Vec<u8>,
        stats: &OpStats,
    ) -> Result<bool, OpError> {
        Ok(KvClient::get_into(self, key, value, stats).await?)
    }
    async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, OpError> {
        Ok(KvClient::update(self, key, value, stats).await?)
    }
    async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), OpError> {
        Ok(KvClient::insert(self, key, value, stats).await?)
    }
    async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, OpError> {
        Ok(KvClient::delete(self, key, stats).await?)
    }
    fn close(self) {
        KvClient::close(self);
    }
    fn has_deferred_work(&self) -> bool {
        self.has_deferred_unmaps()
    }
    async fn run_deferred_work(&self) {
        if let Err(error) = self.run_deferred_unmaps().await {
            tracing::debug!(%error, "deferred index unmaps stopped; they run again later");
        }
    }
    fn lease_renewals(&self) -> u64 {
        KvClient::lease_renewals(self)
    }
    fn keep_alive(&self) {
        // A renewal that cannot complete (nodes unreachable) waits a renewal period
        // at most; the next operation's lease check says what happened.
        let _ = swarm_core::block_on_future(KvClient::fabric(self), self.keep_lease());
        self.log_holdings("waiting at a phase boundary");
    }
    fn lease_lost(&self) -> bool {
        KvClient::lease_lost(self)
    }
    fn writer(&self) -> Option<u16> {
        Some(KvClient::writer(self))
    }
    fn recycling(&self) -> Recycling {
        let log = self.log_counters();
        let registers = self.recycle_stats();
        let unmaps = self.deferred_unmap_stats();
        Recycling {
            slots: log.recycled,
            registers: registers.recycled,
            reclaimed_registers: registers.reclaimed_limbo + registers.reclaimed_pool,
            donated_registers: registers.donated,
            log_slots_in_use: Some(u64::from(log.in_use)),
            deferred_unmaps: unmaps.ran,
            deferred_unmap_roundtrips: unmaps.roundtrips,
        }
    }
}

impl BenchClient for FuseeClient<EmulatedFabric> {
    type Transport = EmulatedRtt<ShmFabric>;
    fn fabric(&self) -> &EmulatedFabric {
        FuseeClient::fabric(self)
    }
    async fn get_into(
        &self,
        key: &[u8],
        value: &mut Vec<u8>,
        stats: &OpStats,
    ) -> Result<bool, OpError> {
        // FUSEE's get returns a value of its own: it takes the buffer's place.
        let read = FuseeClient::get(self, key, stats).await?;
        let present = read.is_some();
        *value = read.unwrap_or_default();
        Ok(present)
    }
    async fn update(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<bool, OpError> {
        Ok(FuseeClient::update(self, key, value, stats).await?)
    }
    async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), OpError> {
        Ok(FuseeClient::insert(self, key, value, stats).await?)
    }
    async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<DeleteOutcome, OpError> {
        // FUSEE's delete is decided by its index CAS: never raced.
        Ok(if FuseeClient::delete(self, key, stats).await? {
            DeleteOutcome::Removed
        } else {
            DeleteOutcome::Absent
        })
    }
    fn close(self) {}
}
