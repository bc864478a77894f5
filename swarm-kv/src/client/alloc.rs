//! A fresh register for an insert (SWARM §5.4): from the client's pool or a new
//! chunk (`crate::registers::alloc`); when both are dry, from a pass that reclaims the
//! registers of gone clients, or after the grace of the registers this client retired.

use swarm_core::encoding::Tsp;
use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, OpStats};

use crate::{KvError, RegisterId};

use super::KvClient;

/// How long an insert waits for a register while a repair is announced, at most:
/// from the announcement to the admission, registers come back only once the
/// repair copied them to the node it rebuilds (`crate::registers::journal`), or, on a cluster
/// without a journal, once the node is admitted (a repair's wait and copy:
/// seconds). A repair that failed after its announcement leaves the bit set until
/// another one completes; inserts that find no register then fail with
/// `RegistersFull` after this long.
const REPAIR_WAIT_NS: Nanos = 30_000_000_000;

/// How many chunks placed by a newer configuration an insert meets, following the
/// configuration after each, before it fails with `KvError::PlacementBehind`.
const PLACEMENT_RETRIES: u32 = 4;

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// A pre-cleared register for an insert. When every chunk is claimed and the
    /// pool is empty, runs a reclamation pass (paced: [`Self::reclaim_gone_registers`]) if this
    /// client has no retired register of its own to wait for, or if its last pass
    /// left donations on offer (taken, they are ready after the delivery margin,
    /// sooner than its own pass their grace); otherwise waits for its retired
    /// registers or for the next pass (before the operation starts: the wait posts
    /// nothing but resets), up to two graces (three lease renewals, if longer); once
    /// more as long if it then finds registers due or resets under way (it was
    /// stopped, or its lease lapsed, while it waited: a stall, not a full area).
    /// Returns the register and its life marker (`None` for a fresh chunk's, never
    /// reset as far as this client knows).
    pub(super) async fn allocate_register(
        &self,
        stats: &OpStats,
    ) -> Result<(RegisterId, Option<Tsp>), KvError> {
        let fabric = self.swarm.fabric();
        let started = fabric.now();
        // Two graces, or three lease renewals if longer: a reset that left a lost node
        // out waits for two renewals before it hands its register out
        // (`crate::registers::recycle`, "a node out of service").
        let patience = (self.recycler.grace_ns().saturating_mul(2))
            .max(self.layout.params.lease_renew_ns.saturating_mul(3));
        let mut give_up = started.saturating_add(patience);
        let mut woke_late = false;
        let mut behind = 0;
        let mut checked_growth = false;
        loop {
            self.recycle_step();
            let r = self
                .alloc
                .allocate(fabric, stats, &self.layout, self.meta, &self.placements)
                .await;
            if let Err(KvError::PlacementBehind { .. }) = r
                && behind < PLACEMENT_RETRIES
            {
                // A chunk placed by a configuration published since this client
                // last followed one (`crate::registers::alloc`): follow it now.
                behind += 1;
                self.follow_configuration_now().await;
                continue;
            }
            let Err(KvError::RegistersFull { .. }) = r else {
                return r;
            };
            if !checked_growth && self.layout.reserve_chunks() > 0 {
                // Room to grow: an add-node may have recorded reserve chunks since
                // this client last followed a configuration (its renewals ride on
                // operations, and none started without a register). Follow it and
                // scan again; the allocator claims a reserve chunk only once its
                // record is followed (`crate::registers::alloc`).
                checked_growth = true;
                let followed = self.followed_epoch();
                self.follow_configuration_now().await;
                if self.followed_epoch() > followed {
                    continue;
                }
            }
            self.log_holdings("insert found no free register");
            let now = fabric.now();
            let in_limbo = self.recycler.in_limbo();
            let offer = self.donations_left.get() > 0;
            // A pass cut short by its lease scanned part of the cluster only: the
            // next one goes on from there, so nothing is known to be out of reach.
            let cut_short = self.reclaim_cut_short.get();
            // Registers of its own limbo due now are reset first (a few per step):
            // another pass would only take more while they wait.
            let due_now = self.recycler.next_due().is_some_and(|due| due <= now);
            if now >= self.next_adoption.get() && !due_now && (in_limbo == 0 || offer || cut_short)
            {
                self.reclaim_gone_registers().await?;
                if self.recycler.in_limbo() > 0 {
                    // What the pass took waits a whole grace from now, however
                    // long the pass took.
                    give_up = fabric.now().saturating_add(patience);
                    continue;
                }
                // Nothing taken: fail only once a whole pass found nothing, not
                // while the scan still has chunks to go (waited for below, within
                // the insert's patience from its start or its last useful pass).
                if !self.reclaim_cut_short.get() {
                    return r;
                }
                continue;
            }
            let may_wait = now < give_up
                || (self.repair_announced() && now < started.saturating_add(REPAIR_WAIT_NS));
            if in_limbo == 0 && !offer && !cut_short {
                return r;
            }
            if !may_wait {
                // Out of patience with registers due or resets under way: the loop
                // was stopped (a SIGSTOP, a long preemption) past the graces it
                // waited for, and the lease may have lapsed meanwhile, so that their
                // resets could not start. That is a stall, not a full register area:
                // renew (in the wait below), reset them and give them one more
                // patience, once.
                let due = self.recycler.next_due().is_some_and(|due| due <= now);
                if woke_late || !(due || self.recycler.resetting()) {
                    return r;
                }
                woke_late = true;
                give_up = now.saturating_add(patience);
                tracing::info!(
                    in_limbo,
                    lease_valid = self.lease.borrow().valid_for(now, 0),
                    "insert: out of patience with registers due; renewing and resetting them before giving up"
                );
            }
            tracing::debug!(
                in_limbo,
                donations_left = self.donations_left.get(),
                cut_short,
                "insert: no free register; waiting for retired ones to pass their grace, or for the next reclamation pass to take donated ones or finish its scan"
            );
            self.wait_for_resets((offer || cut_short).then(|| self.next_adoption.get()))
                .await;
        }
    }
}
