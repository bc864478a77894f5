//! How an operation begins, and where it must stop.
//!
//! Every operation starts with a lease check (self-fencing,
//! [`crate::membership::lease`]): it runs only while the client's lease is provably
//! valid for the cluster's operation deadline (`max_op_ns`, superblock), renewing it
//! synchronously if it is about to run out, and fails with [`KvError::LeaseExpired`]
//! otherwise. Renewals are posted in the background of operations, so an idle
//! client's lease lapses: its next operation revives it first (retrying for up to
//! [`KvConfig::lease_revive_ns`] while the transport reconnects nodes that cut the
//! client off), unless a takeover killed it meanwhile ([`crate::membership::lease`],
//! "Idle clients").
//!
//! The deadline (start + `max_op_ns`) is armed on the operation's `OpStats`, so the
//! register protocol and the index post nothing after it; the client's own steps check
//! it with `KvClient::fence` before posting (SWARM §5.4: memory an operation names
//! may be recycled after its deadline). A write first waits, outside its deadline,
//! for room in its writer's log.

use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, OpStats};

use crate::KvError;
use crate::membership::lease_renewal::renew_now;

use super::{KvClient, WRITE_SLOTS};

/// Registers per background slot-recycling check of the log (`Client::recycle_slots_tick`, at
/// most one check per `ProtocolConfig::slot_recycling_interval_ns`).
const SLOT_RECYCLING_BUDGET: usize = 8;

/// Pause between two attempts to revive a lapsed lease (the transport reconnects
/// meanwhile: the pause drives its progress).
const REVIVE_RETRY_NS: Nanos = 20_000_000;

/// An operation that passed its lease check: its start and deadline on the fabric
/// clock, and the deadline armed on its `OpStats` until it ends.
pub(super) struct Started<'s> {
    pub(super) start: Nanos,
    pub(super) deadline: Nanos,
    _scope: swarm_core::DeadlineScope<'s>,
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Starts an operation (self-fencing, [`crate::membership::lease`]): takes the answers of the
    /// lease renewal in flight and posts the next one when due, off the critical path;
    /// the operation may start only if the lease is valid for the whole operation
    /// deadline (`max_op_ns`, superblock) — if not, a synchronous renewal, retried
    /// for up to [`KvConfig::lease_revive_ns`] while the lease is not lost (an idle
    /// client whose memory nodes cut it off waits for the transport to reconnect
    /// them), then [`KvError::LeaseExpired`]. Returns the operation's deadline on the
    /// fabric clock (it must post nothing after it: `KvClient::begin` arms it on the
    /// operation's `OpStats`, which the register protocol and the index check before
    /// posting).
    ///
    /// `now` is the fabric clock read as the operation starts: [`Self::begin_quiet`]
    /// read it and found something due.
    async fn begin_op(&self, now: Nanos) -> Result<Nanos, KvError> {
        let deadline = self.begin_leased(now).await?;
        // A renewal saw a newer configuration that the client could not follow
        // yet: on a cluster with placement records, no operation starts with the
        // table of the older one (`crate::placement::add_node`, "Readers").
        let seen = self.lease.borrow().config_epoch_seen();
        if !self.behind_configuration(seen) {
            return Ok(deadline);
        }
        self.follow_configuration_now().await;
        if self.behind_configuration(seen) {
            return Err(KvError::ConfigurationBehind {
                seen,
                followed: self.followed_epoch(),
            });
        }
        // Following took roundtrips: the operation starts after them.
        self.begin_leased(self.swarm.fabric().now()).await
    }

    /// Whether this client follows an older configuration than `seen` (what its
    /// lease renewals read) on a cluster with a placement table.
    fn behind_configuration(&self, seen: u64) -> bool {
        self.layout.placements_at.is_some() && seen > self.followed_epoch()
    }

    /// [`Self::begin_op`]'s lease check and upkeep.
    async fn begin_leased(&self, now: Nanos) -> Result<Nanos, KvError> {
        let fabric = self.swarm.fabric();
        let max_op_ns = self.layout.params.max_op_ns;
        // Background log recycling: bounded, never waits.
        self.swarm.recycle_slots_tick_at(SLOT_RECYCLING_BUDGET, now);
        self.swarm.examine_carried_tick(now);
        // Following a configuration took a roundtrip: the operation starts after it.
        // Otherwise the reading above serves (only synchronous work came since: a
        // deadline from it is, if anything, early).
        let now = if self.upkeep(now).await {
            fabric.now()
        } else {
            now
        };
        let lapsed_since = {
            let lease = self.lease.borrow();
            if lease.valid_for(now, max_op_ns) {
                return Ok(now.saturating_add(max_op_ns));
            }
            // `Some`: the lease had already ended (an idle client, not one whose
            // lease merely runs short of a whole operation).
            lease.valid_until().filter(|until| *until <= now)
        };
        tracing::debug!(
            writer = self.registration.writer,
            "lease about to run out: renewing synchronously"
        );
        renew_now(&self.lease, fabric, max_op_ns).await;
        let started = now;
        let give_up = started.saturating_add(self.lease_revive_ns);
        let mut attempts = 1u32;
        loop {
            let now = fabric.now();
            let (valid, lost) = {
                let lease = self.lease.borrow();
                (lease.valid_for(now, max_op_ns), lease.lost())
            };
            if valid {
                if let Some(until) = lapsed_since {
                    tracing::info!(
                        writer = self.registration.writer,
                        lapsed_ms = now.saturating_sub(until) / 1_000_000,
                        attempts,
                        waited_ms = now.saturating_sub(started) / 1_000_000,
                        "idle client revived: its lease had lapsed (not killed) and is renewed \
                         on a majority again"
                    );
                }
                return Ok(now.saturating_add(max_op_ns));
            }
            // A lease killed by a reclaimer (or a row taken over) on a majority is
            // final: the writer id may belong to someone else now.
            if lost || now >= give_up {
                break;
            }
            // Not acknowledged by a majority (nodes unreachable or reconnecting):
            // let the transport make progress, then renew again.
            swarm_core::sleep(fabric, REVIVE_RETRY_NS.min(give_up - now)).await;
            // A renewal answer may show a configuration that admits a repaired node,
            // without which no majority may answer (an idle client across a repair
            // and the loss of another node).
            let _ = self.upkeep(fabric.now()).await;
            renew_now(&self.lease, fabric, max_op_ns).await;
            attempts += 1;
        }
        let lease = self.lease.borrow();
        tracing::warn!(
            writer = self.registration.writer,
            lost = lease.lost(),
            attempts,
            waited_ms = fabric.now().saturating_sub(started) / 1_000_000,
            "lease expired and could not be renewed on a majority: the client stops issuing \
             operations"
        );
        Err(KvError::LeaseExpired {
            writer: self.registration.writer,
        })
    }

    /// The common start, with no future of its own: nothing of [`Self::begin_op`]'s
    /// upkeep is due at the fabric clock's reading (no slot-recycling work, no
    /// carried slot to examine: `swarm_core::Client::background_quiet`; no lease
    /// renewal in flight or due and no renewal answer unseen:
    /// [`LeaseHolder::quiet_until`](crate::membership::lease_renewal::LeaseHolder::quiet_until)),
    /// and the lease is valid for the whole operation deadline: returns the
    /// deadline. Otherwise returns the reading, for `begin_op`. Skips exactly what
    /// `begin_op` would have found nothing to do for: the lease check is the same.
    pub(super) fn begin_quiet(&self) -> Result<Nanos, Nanos> {
        let now = self.swarm.fabric().now();
        let max_op_ns = self.layout.params.max_op_ns;
        if !self.swarm.background_quiet(now) {
            return Err(now);
        }
        let lease = self.lease.borrow();
        if now < lease.quiet_until()
            && lease.valid_for(now, max_op_ns)
            && !self.behind_configuration(lease.config_epoch_seen())
        {
            Ok(now.saturating_add(max_op_ns))
        } else {
            Err(now)
        }
    }

    /// Fails with [`KvError::Fenced`] once `deadline` passed: the caller is about to
    /// post a step, and memory it may name could be recycled after the deadline.
    pub(super) fn fence(&self, deadline: Nanos) -> Result<(), KvError> {
        if self.swarm.fabric().now() > deadline {
            return Err(KvError::Fenced {
                max_op_ns: self.max_op_ns,
            });
        }
        Ok(())
    }

    /// Starts an operation: the lease check ([`Self::begin_op`]), then its deadline
    /// armed on `stats`, so that every step (index, registers) is fenced from the
    /// start. Returns the start and the deadline on the fabric clock.
    pub(super) async fn begin<'s>(&self, stats: &'s OpStats) -> Result<Started<'s>, KvError> {
        let deadline = match self.begin_quiet() {
            Ok(deadline) => deadline,
            Err(now) => self.begin_op(now).await?,
        };
        Ok(Started {
            start: deadline.saturating_sub(self.max_op_ns),
            deadline,
            _scope: stats.arm_deadline(deadline),
        })
    }

    /// [`Self::begin`] for an operation that writes: while this writer's log is full,
    /// it first waits, with no deadline armed and nothing posted but reads, for a
    /// superseded slot's grace to pass (`swarm_core::Client::make_room`). A writer
    /// faster than its log recycles (`log_slots / grace` writes per second, about
    /// 6,300 on a 32 MiB cluster with 64 writers) is throttled instead of failing
    /// with `Fenced`: the grace is longer than the operation deadline, so a write
    /// that waited inside its operation would run out of time.
    /// An insert may write two registers (its fresh one, then the key's existing
    /// one), so writes wait for [`WRITE_SLOTS`] free slots.
    pub(super) async fn begin_write<'s>(&self, stats: &'s OpStats) -> Result<Started<'s>, KvError> {
        self.relieve_log().await;
        self.shed_pool().await;
        self.swarm.make_room_for(WRITE_SLOTS).await;
        self.begin(stats).await
    }

    /// The current time for attempt `attempt` of an operation that started at
    /// `start` (the first attempt runs at its start: no clock read), after fencing
    /// later attempts.
    pub(super) fn attempt_now(
        &self,
        attempt: u32,
        start: Nanos,
        deadline: Nanos,
    ) -> Result<Nanos, KvError> {
        if attempt == 0 {
            return Ok(start);
        }
        self.fence(deadline)?;
        Ok(self.swarm.fabric().now())
    }
}
