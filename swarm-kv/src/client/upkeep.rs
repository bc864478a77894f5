//! What a client does besides its operations: keeping its lease and following the
//! cluster's configuration (a repaired node's admission), and recycling registers
//! (SWARM §5.4) — retiring them with a holder mark, stepping their resets, reclaiming
//! the registers gone clients held (`crate::registers::limbo`), and relieving a log
//! filled with the values of registers not reset yet.

use swarm_core::fabric::Nanos;
use swarm_core::{Clock, Fabric, NodeId, OpStats};

use crate::membership::lease_renewal::renew_now;
use crate::registers::recycle::{ReplicaStatus, Retired};
use crate::{KvError, RegisterId};

use super::{KvClient, WRITE_SLOTS};

/// A recycled pool sheds registers ([`KvClient::shed_pool`]) once it holds more than
/// this many chunks' worth (above what one reclamation pass takes, so that a dry client
/// does not give back what it has just taken)...
const POOL_SHED_CHUNKS: usize = 24;
/// ...down to this many.
const POOL_KEEP_CHUNKS: usize = 16;
/// The most donated registers one reclamation pass takes, in chunks' worth
/// ([`KvClient::reclaim_gone_registers`]).
const DONATIONS_PER_PASS_CHUNKS: u64 = 16;
/// The most registers one reclamation pass of a dry client takes, donations
/// included, in chunks' worth (`crate::registers::limbo::Reclaimer::max_takes`); a
/// pass for a nearly full log takes every retired register it finds.
const TAKES_PER_PASS_CHUNKS: u64 = 16;
/// A pass for a nearly full log ([`KvClient::relieve_log`]) waits this many times
/// as long as the last one took before it runs again.
const RELIEF_PACE: u64 = 8;

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Puts in service the memory nodes that a newer configuration admits: a renewal
    /// (whose answers so far are `answers`) read a higher epoch on some node, so a
    /// repair rebuilt a node and admitted its new incarnation (`crate::repair`).
    /// Reads the configuration from a majority (one roundtrip) and asks the fabric to
    /// admit every member incarnation ([`Fabric::admit`]: a no-op for the nodes in
    /// use). The epoch followed is the one read, not the one a renewal saw: a renewal
    /// may read the epoch of a record still being written (its checksum not yet), so
    /// the next renewal answer triggers another read until they agree. A newer epoch
    /// is followed together with the placement table at that epoch
    /// (`crate::placement`), read in one more roundtrip.
    async fn follow_configuration(&self, answers: u64) {
        let fabric = self.swarm.fabric();
        let stats = OpStats::new();
        self.config_checked.set(answers);
        // A silent node must not hold the operation that follows: wait for stragglers
        // only as long as the protocol waits for a slow node.
        let straggler_ns = self.swarm.config().slow_after_ns;
        match crate::repair::read_configuration_within(fabric, &stats, self.meta, 1, straggler_ns)
            .await
        {
            Ok(config) => {
                let followed = self.followed_epoch();
                // Members first: the records of the new epoch may name a node added
                // since this process mapped the cluster (`crate::placement::add_node`).
                let admitted: Vec<usize> = if config.epoch > 0 && config.epoch > followed {
                    (0..config.incarnations.len())
                        .filter(|&i| fabric.admit(NodeId(i as u16), config.incarnations[i]))
                        .collect()
                } else {
                    Vec::new()
                };
                if config.epoch > followed && self.layout.placements_at.is_some() {
                    // The configuration and the placement records it publishes are
                    // followed together (`crate::placement`): not the epoch without
                    // its records.
                    match crate::placement::read(
                        fabric,
                        &stats,
                        &self.layout,
                        self.meta,
                        config.epoch,
                        straggler_ns,
                    )
                    .await
                    {
                        Ok(placements) => self.placements.set(placements),
                        Err(error) => {
                            tracing::warn!(%error, epoch = config.epoch, "cannot read the placement table of a newer configuration yet");
                            return;
                        }
                    }
                }
                if config.epoch > 0 && config.epoch > followed {
                    tracing::info!(
                        writer = self.registration.writer,
                        epoch = config.epoch,
                        ?admitted,
                        "following the cluster configuration"
                    );
                }
                if config.epoch >= followed {
                    self.epoch_followed.set(config.epoch);
                    self.followed.replace(Some(config));
                }
            }
            Err(error) => {
                tracing::debug!(%error, "cannot read the configuration yet");
            }
        }
    }

    /// Reads the configuration and follows it if it is newer than the one this
    /// client follows, whatever the lease renewals saw: for a client that met a
    /// chunk placed by a newer configuration (`crate::registers::alloc`).
    pub(super) async fn follow_configuration_now(&self) {
        self.follow_configuration(self.config_checked.get()).await;
    }

    /// The epoch of the configuration this client follows (0: none read yet).
    pub(super) fn followed_epoch(&self) -> u64 {
        self.epoch_followed.get()
    }

    /// Between operations, and while an insert waits for a register: takes the
    /// answers of the lease renewal in flight and posts the next one when due, and
    /// follows a newer configuration a renewal saw (`follow_configuration`). A client
    /// that waits for retired registers (whose resets need every replica) must still
    /// admit a repaired node, or it would wait for a reset that only the admission
    /// lets complete. Returns whether it followed a configuration (a roundtrip: the
    /// clock has moved).
    pub(super) async fn upkeep(&self, now: Nanos) -> bool {
        let (seen, answers) = {
            let mut lease = self.lease.borrow_mut();
            lease.tick(self.swarm.fabric(), now);
            (lease.config_epoch_seen(), lease.renewal_answers())
        };
        let follow = seen > self.followed_epoch() && answers > self.config_checked.get();
        if follow {
            self.follow_configuration(answers).await;
        }
        follow
    }

    /// Keeps the lease without an operation: takes the answers of the renewal in
    /// flight and posts the next one when due, and renews synchronously (for up to a
    /// renewal period) if the lease lapsed. For a thread that waits elsewhere for
    /// longer than a lease (a benchmark's client at a phase boundary, waiting for the
    /// others): renewals ride on operations, and a lease that does not move for a
    /// reclaimer's watch may be killed by it where owner processes cannot be judged
    /// (RDMA; `crate::membership::writer_takeover`). Returns whether the lease is
    /// valid now.
    pub async fn keep_lease(&self) -> bool {
        let fabric = self.swarm.fabric();
        let _ = self.upkeep(fabric.now()).await;
        if !self.lease.borrow().valid_for(fabric.now(), 0) {
            renew_now(&self.lease, fabric, 0).await;
        }
        self.lease.borrow().valid_for(fabric.now(), 0)
    }

    /// Whether this client's lease is lost for good: killed by a reclaimer, or its
    /// row taken over, on a majority of the memory nodes. Every operation then fails
    /// with [`KvError::LeaseExpired`]: connect a new client.
    pub fn lease_lost(&self) -> bool {
        self.lease.borrow().lost()
    }

    /// Hands the registers whose reset completed to the allocator, and starts the
    /// resets that are due. Never waits.
    pub(super) fn recycle_step(&self) {
        // A pool of a chunk's worth is enough: registers reset beyond it go to any
        // client that runs out (`crate::registers::recycle`, "donations"); not while a node is out
        // of service, when pools are what inserts live on until the repair. Asked only
        // when a reset starts, not on every insert and delete.
        let donate = || {
            self.alloc.pooled() >= u64::from(self.layout.params.chunk_registers)
                && !self.repair_announced()
                && (0..self.nodes)
                    .all(|n| self.replica_status(NodeId(n as u16)) == ReplicaStatus::InService)
        };
        let ready = self.recycler.step(
            self.swarm.fabric(),
            &self.layout,
            |at| self.lease.borrow().valid_for(at, 0),
            donate,
            |r| self.register_loc(r).ok(),
            |node| self.replica_status(node),
            self.lease.borrow().renewals(),
        );
        for (register, marker) in ready {
            self.alloc.give_back(register, marker);
        }
    }

    /// Donates what the recycled pool holds beyond [`POOL_KEEP_CHUNKS`] chunks' worth,
    /// once it holds more than [`POOL_SHED_CHUNKS`] chunks' worth, a chunk's worth per
    /// call (between operations, before a write's deadline is armed): by CAS of
    /// key-header word 0 from `(0, its tag)` to `(0, donated_tag(marker))` on every replica
    /// (`crate::registers::give_back::donate`, whose argument covers a pooled
    /// register: reset on every replica a grace after its last life ended, and not
    /// handed out since; it is out of the allocator before the CAS is posted).
    ///
    /// A reset donates only while the pool holds less than a chunk's worth, and not
    /// at all while a node is out of service or a repair is announced, so a pool
    /// grows without bound then (and with the donations a dry client takes, half of
    /// what is on offer): it held most of the cluster's free registers after a
    /// repair, and new clients found none. Under the same conditions as donations at
    /// reset time, and under a valid lease. A register whose donation reached some
    /// replicas only is not taken back (a reclaimer may own it): it stays tagged with
    /// this client's tag where the CAS missed, and is reclaimed once the client is
    /// gone.
    pub(super) async fn shed_pool(&self) {
        let chunk = usize::try_from(self.layout.params.chunk_registers)
            .unwrap_or(usize::MAX)
            .max(1);
        if self.alloc.recycled() <= POOL_SHED_CHUNKS.saturating_mul(chunk) {
            return;
        }
        let fabric = self.swarm.fabric();
        let max_op_ns = self.layout.params.max_op_ns;
        let now = fabric.now();
        if !self.lease.borrow().valid_for(now, max_op_ns)
            || self.repair_announced()
            || !(0..self.nodes)
                .all(|n| self.replica_status(NodeId(n as u16)) == ReplicaStatus::InService)
        {
            return;
        }
        let shed = self
            .alloc
            .take_recycled_beyond(POOL_KEEP_CHUNKS.saturating_mul(chunk), chunk);
        let pooled = crate::registers::limbo::header_word(0, self.recycler.tag());
        let registers: Vec<(RegisterId, u64, Option<swarm_core::encoding::Tsp>)> = shed
            .iter()
            .map(|(r, marker)| (*r, pooled, Some(*marker)))
            .collect();
        let stats = OpStats::new();
        let _deadline = stats.arm_deadline(now.saturating_add(max_op_ns));
        match crate::registers::give_back::donate(fabric, &stats, &self.layout, &registers, |r| {
            self.register_loc(r).ok()
        })
        .await
        {
            Ok((donated, incomplete)) => tracing::debug!(
                writer = self.registration.writer,
                donated,
                incomplete,
                pooled = self.alloc.recycled(),
                "pool above its bound: registers donated"
            ),
            Err(error) => tracing::debug!(
                writer = self.registration.writer,
                registers = registers.len(),
                %error,
                "pool above its bound: donation stopped; what it did not reach is reclaimed once this client is gone"
            ),
        }
    }

    /// Logs (at info level, at most once a second per client) where the registers
    /// this client holds are: its pool (recycled and fresh), its chunks, and each
    /// step of recycling (waiting for the grace, due, resetting, journaled for a
    /// repair, confirming), with the donations its last pass left on offer; `why`
    /// says what the client was doing. For diagnosing a client that runs dry while
    /// others hold registers.
    pub fn log_holdings(&self, why: &'static str) {
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        let now = self.swarm.fabric().now();
        if now < self.next_holdings_log.get() {
            return;
        }
        self.next_holdings_log
            .set(now.saturating_add(1_000_000_000));
        let (chunks, fresh) = self.alloc.chunks_and_fresh();
        let (limbo, due, resetting, journaled, confirming) = self.recycler.queues(now);
        let stats = self.recycler.stats();
        let log = self.swarm.slot_counters();
        tracing::info!(
            writer = self.registration.writer,
            why,
            log_in_use = log.in_use,
            log_in_limbo = log.in_limbo,
            log_carried = log.carried,
            recycled_pool = self.alloc.recycled(),
            fresh_pool = fresh,
            chunks,
            limbo,
            due,
            resetting,
            journaled,
            confirming,
            donations_left = self.donations_left.get(),
            relief_passes = self.relief_passes.get(),
            repair_announced = self.repair_announced(),
            lease_valid = self.lease.borrow().valid_for(now, 0),
            retired = stats.retired,
            recycled = stats.recycled,
            donated = stats.donated,
            reset_failures = stats.reset_failures,
            reset_abandoned = stats.reset_abandoned,
            reclaimed_limbo = stats.reclaimed_limbo,
            reclaimed_pool = stats.reclaimed_pool,
            reclaimed_donations = stats.reclaimed_donations,
            "registers held"
        );
    }

    /// Whether a repair is announced in the configuration this client follows (its
    /// resets wait for the node being rebuilt until the node is admitted).
    pub(super) fn repair_announced(&self) -> bool {
        self.followed
            .borrow()
            .as_ref()
            .is_some_and(|config| config.repairing != 0)
    }

    /// What a register reset does about `node` (`crate::registers::recycle`, "a node out of
    /// service"). It may leave the node out only when the memory of its member
    /// incarnation, in the configuration this client follows, is known lost (or a
    /// repair of the node is announced there) and no lease renewal has shown a newer
    /// configuration since (a repair's announcement
    /// reaches this client through its renewals; `crate::repair`, steps 1 and 2).
    /// Then, with no repair of the node announced, the reset simply does without
    /// it; with one announced, it goes through the repair journal
    /// ([`crate::registers::journal`]), or waits on a cluster without one.
    pub(super) fn replica_status(&self, node: NodeId) -> ReplicaStatus {
        let followed = self.followed.borrow();
        let Some(config) = followed.as_ref() else {
            return ReplicaStatus::InService;
        };
        let Some(&member) = config.incarnations.get(node.index()) else {
            return ReplicaStatus::InService;
        };
        if config.epoch == 0 {
            return ReplicaStatus::InService;
        }
        // A repair is announced only for a node whose member memory is gone: the
        // repair refuses a member in good shape (`RepairError::AlreadyMember`) and
        // retires the memory it replaces before it announces itself
        // (`ShmStore::repair`, `RepairOptions::replace`). So nobody serves from that
        // memory any more, even where this client cannot tell (a node it left out
        // when it opened the cluster: a corrupted header, say), and its resets go
        // through the journal instead of failing there until the admission.
        if !config.is_repairing(node.index()) && !self.swarm.fabric().memory_lost(node, member) {
            return ReplicaStatus::InService;
        }
        if self.lease.borrow().config_epoch_seen() > config.epoch {
            return ReplicaStatus::Undecided;
        }
        if !config.is_repairing(node.index()) {
            return ReplicaStatus::Lost;
        }
        match crate::registers::journal::journal_node(node, self.meta) {
            Some(journal) if self.layout.journal_at.is_some() => ReplicaStatus::Repairing {
                journal,
                epoch: config.epoch,
            },
            _ => ReplicaStatus::Undecided,
        }
    }

    /// Sleeps until the next retired register of this client is due for its reset
    /// (a millisecond while resets are in flight, or with none retired), or until
    /// `or_until` if that is sooner; renews the lease first if it lapsed (resets
    /// start only under a valid lease). Call `recycle_step` after.
    pub(super) async fn wait_for_resets(&self, or_until: Option<Nanos>) {
        let fabric = self.swarm.fabric();
        let _ = self.upkeep(fabric.now()).await;
        if !self.lease.borrow().valid_for(fabric.now(), 0) {
            renew_now(&self.lease, fabric, 0).await;
        }
        let now = fabric.now();
        let resetting = self.recycler.resetting();
        let resets = match self.recycler.next_due() {
            Some(due) if !resetting => due,
            None if !resetting && or_until.is_some() => Nanos::MAX,
            // Resets in flight: look again in a millisecond.
            _ => now.saturating_add(1_000_000),
        };
        let until = resets.min(or_until.unwrap_or(Nanos::MAX));
        swarm_core::sleep(fabric, until.saturating_sub(now).max(1)).await;
    }

    /// Adopts the chunks of clients that are no longer registered and takes the
    /// registers that gone clients held (their limbos and pools, in any chunk, and the
    /// never-used registers of adopted chunks) into this client's limbo
    /// (`crate::registers::limbo`): they are handed out after the register grace (donated ones
    /// after the delivery margin). At most one round per lease period (or register
    /// grace, if shorter), and only under a valid lease (renewed first if needed):
    /// the takes are CASes that no operation deadline covers otherwise.
    pub(super) async fn reclaim_gone_registers(&self) -> Result<(), KvError> {
        self.reclaim(false).await
    }

    /// [`Self::reclaim_gone_registers`]; with `retired_only`, a pass that takes only
    /// retired registers, for a log nearly full ([`Self::relieve_log`]:
    /// `crate::registers::limbo::Reclaimer::retired_only`).
    async fn reclaim(&self, retired_only: bool) -> Result<(), KvError> {
        let fabric = self.swarm.fabric();
        let max_op = self.layout.params.max_op_ns;
        // A client living on donations needs a pass about as often as registers pass
        // their grace, where that is shorter than a lease.
        let interval = self
            .layout
            .params
            .lease_ns
            .min(self.layout.params.register_grace_ns());
        self.next_adoption
            .set(fabric.now().saturating_add(interval));
        // A pass stops when the lease runs short (its takes are CASes no operation
        // deadline covers): renewed now unless half a lease is left, it gets at
        // least that long, and the next pass goes on where this one stopped.
        let lease_ns = self.layout.params.lease_ns;
        if !self.lease.borrow().valid_for(fabric.now(), lease_ns / 2) {
            renew_now(&self.lease, fabric, lease_ns / 2).await;
        }
        // A lost lease never comes back: say so, rather than let the insert waiting
        // for this pass report a full register area.
        if self.lease.borrow().lost() {
            return Err(KvError::LeaseExpired {
                writer: self.registration.writer,
            });
        }
        // A chunk's worth of donations per pass shares scarce ones among the clients
        // that run dry; half of what the last pass left lets one client drain a
        // large offer (every register a gone client held, donated as its reclaimer
        // resets them) in a few passes, not a chunk per `interval`, while leaving
        // as much to the others. At most `DONATIONS_PER_PASS_CHUNKS` chunks' worth:
        // half of a large offer is far more than a dry client needs (in the soak,
        // the pools of live clients took 140,000 donated registers within seconds
        // while a node was out), and a pool cannot shed its surplus while a node is
        // out (`shed_pool`), when the others need it most.
        let chunk = u64::from(self.layout.params.chunk_registers);
        let me = crate::registers::limbo::Reclaimer {
            token: self.token,
            tag: self.recycler.tag(),
            max_donations: chunk.max(
                (self.donations_left.get() / 2)
                    .min(chunk.saturating_mul(DONATIONS_PER_PASS_CHUNKS)),
            ),
            max_takes: if retired_only {
                u64::MAX
            } else {
                chunk.saturating_mul(TAKES_PER_PASS_CHUNKS)
            },
            resume_at: self.reclaim_resume_at.get(),
            retired_only,
        };
        let reclaimed = crate::registers::limbo::reclaim_gone_registers(
            fabric,
            &self.layout,
            me,
            || self.lease.borrow().valid_for(fabric.now(), max_op),
            |r| self.register_loc(r).ok(),
        )
        .await?;
        self.donations_left.set(reclaimed.donations_left);
        self.reclaim_resume_at.set(reclaimed.resume_at);
        self.reclaim_cut_short.set(reclaimed.stopped);
        for chunk in &reclaimed.chunks {
            self.alloc.adopt(*chunk);
        }
        tracing::info!(
            writer = self.registration.writer,
            chunks = reclaimed.chunks.len(),
            taken = reclaimed.taken.len(),
            lost = reclaimed.lost,
            donations_left = reclaimed.donations_left,
            stopped = reclaimed.stopped,
            retired_only,
            "reclamation pass done"
        );
        let now = fabric.now();
        let settled = now.saturating_add(crate::registers::limbo::settle_ns(&self.layout));
        for (register, kind) in reclaimed.taken {
            let why = match kind {
                crate::registers::limbo::Verdict::Limbo => Retired::ReclaimedLimbo,
                crate::registers::limbo::Verdict::Pool => Retired::ReclaimedPool,
                crate::registers::limbo::Verdict::Donated => {
                    self.recycler.take_donation(register, settled);
                    continue;
                }
                crate::registers::limbo::Verdict::Fresh
                | crate::registers::limbo::Verdict::Keep => Retired::Adopted,
            };
            self.recycler.retire(register, now, why);
        }
        Ok(())
    }

    /// Runs a reclamation pass that takes retired registers only
    /// (`crate::registers::limbo::Reclaimer::retired_only`) when this writer's log is
    /// seven-eighths full of slots its own recycling is not about to give back (in
    /// use, not in limbo), at most once per pass interval and `RELIEF_PACE` times
    /// as long as the last one took; with no room left for a write, waits for the
    /// resets of the registers it retired or took, which free slots.
    ///
    /// Such a log holds, besides the values of live keys, the last values of
    /// registers that clients which came and went had retired but not reset yet:
    /// each client resets its retired registers only after the register grace, and
    /// leaves the rest to a reclamation pass when it closes. Those slots come back
    /// only once the registers are reset (slot-recycling checks then find their writes on
    /// no replica, `swarm_core::slot_recycling`, rule 3), and passes otherwise run
    /// only in a client that runs out of registers. A store whose clients come and
    /// go (one `swarm bench` after another on one cluster) filled a writer's log
    /// with them first, and its writes waited on a trickle of slots for minutes.
    ///
    /// A log may also be nearly full of live values (a writer that inserted most of
    /// its log's worth of keys, as a fill's thread does): no pass frees anything
    /// then, hence the pace; and the client has registers, hence no pool, fresh or
    /// donated register taken (a pass as a dry client's took up to 16 chunks' worth
    /// of donations each, which sat in this client's limbo while others ran dry).
    pub(super) async fn relieve_log(&self) {
        let fabric = self.swarm.fabric();
        let slots = self.layout.params.log_slots;
        let log = self.swarm.slot_counters();
        let pressed = log.in_use.saturating_sub(log.in_limbo) >= slots - slots / 8;
        // The common case, with no clock read: the log has room.
        let started = if pressed {
            self.log_holdings("log nearly full");
            fabric.now()
        } else {
            0
        };
        if pressed && started >= self.next_adoption.get() && started >= self.next_relief.get() {
            tracing::debug!(
                writer = self.registration.writer,
                in_use = log.in_use,
                in_limbo = log.in_limbo,
                carried = log.carried,
                "log nearly full: reclaiming the registers of gone clients, whose resets free slots"
            );
            // Only retired registers: their resets free the slots of their values;
            // this client is not out of registers, and what else it took would be
            // missing to those that are.
            if let Err(error) = self.reclaim(true).await {
                tracing::info!(
                    writer = self.registration.writer,
                    %error,
                    "log nearly full: the reclamation pass failed; writes wait for slots"
                );
            }
            // A log may be nearly full of live values (a writer that inserted most
            // of its log's worth of keys): then no pass frees anything, and each
            // costs a read of every claimed register's header. The next one waits
            // `RELIEF_PACE` times as long as this one took, so that passes take at
            // most a ninth of the writer's time.
            let ended = fabric.now();
            self.relief_passes.set(self.relief_passes.get() + 1);
            self.next_relief.set(
                ended.saturating_add(ended.saturating_sub(started).saturating_mul(RELIEF_PACE)),
            );
        }
        // What a pass took is reset after the register grace. With no room left for
        // this write, wait for those resets (up to two graces, as an insert waits for
        // a register); `make_room_for` then finds the freed slots. (A pass frees no
        // slot itself: `log` still tells whether there is room.)
        let room = |in_use: u32| in_use.saturating_add(WRITE_SLOTS) <= slots;
        if room(log.in_use) || self.recycler.in_limbo() == 0 {
            return;
        }
        let give_up = fabric
            .now()
            .saturating_add(self.recycler.grace_ns().saturating_mul(2));
        tracing::debug!(
            writer = self.registration.writer,
            registers_in_limbo = self.recycler.in_limbo(),
            "log full: waiting for retired registers' resets, which free the slots of their values"
        );
        let resets_done = || {
            let stats = self.recycler.stats();
            stats.recycled + stats.donated
        };
        let mut checked_at = resets_done();
        while !room(self.swarm.slot_counters().in_use)
            && self.recycler.in_limbo() > 0
            && fabric.now() < give_up
        {
            self.recycle_step();
            self.wait_for_resets(None).await;
            self.recycle_step();
            // A reset register's value is on no replica any more: a check of every
            // tracked register frees it (after the slot grace, which `make_room_for`
            // waits out). Only once resets ended since the last one: a whole check
            // reads every register this writer has a value in.
            if resets_done() > checked_at {
                checked_at = resets_done();
                let _ = self.swarm.recycle_slots_step(usize::MAX).await;
                let _ = self.swarm.make_room_for(WRITE_SLOTS).await;
            }
        }
    }

    /// Runs one reclamation pass now, whatever the allocator holds (tests and tools;
    /// clients run it by themselves when they run out of registers).
    #[doc(hidden)]
    pub async fn reclaim_gone_registers_now(&self) -> Result<(), KvError> {
        self.reclaim_gone_registers().await
    }

    /// Retires `register`, whose key header holds a key of `key_len` bytes, after
    /// tagging it as this client's on every replica (`crate::registers::limbo`): if this client
    /// goes away before the register's grace, another reclaims it. The mark is posted
    /// only before the operation's `deadline`.
    pub(super) fn retire_marked(
        &self,
        register: RegisterId,
        key_len: usize,
        why: Retired,
        deadline: Nanos,
    ) {
        let fabric = self.swarm.fabric();
        if let Ok(loc) = self.register_loc(register) {
            self.recycler
                .mark(fabric, &self.layout, register, key_len, &loc, deadline);
        }
        self.recycler.retire(register, fabric.now(), why);
    }
}

#[cfg(test)]
mod tests {
    use swarm_core::{
        Fabric, FixedClock, MemCluster, MemFabric, OpStats, block_on, block_on_future,
    };

    use crate::KvClient;
    use crate::layout::{ClusterParams, NodeLayout};
    use crate::test_support::{MS, census_of, connect};

    type Client = KvClient<MemFabric, FixedClock>;

    /// Log slots per writer: a pass for a nearly full log runs from 28 in use.
    const LOG_SLOTS: u32 = 32;

    /// Three 1 MiB nodes with chunks of 4 registers and logs of [`LOG_SLOTS`] slots;
    /// a delivery margin of `margin_ns` (a reclamation pass waits a little longer
    /// than that before it reads the headers).
    fn cluster(margin_ns: u64) -> (MemCluster, NodeLayout) {
        let params = ClusterParams {
            key_max: 16,
            value_max: 16,
            writers: 4,
            chunk_registers: 4,
            lease_ns: 400 * MS,
            lease_renew_ns: 20 * MS,
            max_op_ns: 50 * MS,
            cache_ttl_ns: 10 * MS,
            delivery_margin_ns: margin_ns,
            ..ClusterParams::default()
        }
        .for_node_size(1 << 20)
        .expect("the parameters fit the node size");
        let params = ClusterParams {
            log_slots: LOG_SLOTS,
            ..params
        };
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, 1 << 20);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        (cluster, layout)
    }

    fn insert(c: &Client, key: &str) {
        block_on(c.fabric(), c.insert(key.as_bytes(), b"v", &OpStats::new()))
            .unwrap_or_else(|error| panic!("insert {key}: {error}"));
    }

    /// Inserts keys `prefix0`, `prefix1`, ... until the client's log holds seven
    /// eighths of its slots (live values): its next write runs a pass for it.
    fn fill_log(c: &Client, prefix: &str) -> usize {
        let mut i = 0;
        while c.log_counters().in_use < LOG_SLOTS - LOG_SLOTS / 8 {
            insert(c, &format!("{prefix}{i}"));
            i += 1;
        }
        i
    }

    /// A client whose log is nearly full of live values, and which has registers,
    /// runs a reclamation pass for its log: only the resets of retired registers
    /// free slots. In the soak, such passes (a fill's thread past seven eighths of
    /// its log) took a chunk's worth of donated registers or more each, 20,000 in
    /// five seconds, while the fill's other threads, dry, failed their inserts. The
    /// pass takes no donation: it stays on offer for clients that run dry.
    #[test]
    fn a_pass_for_a_nearly_full_log_leaves_donations_on_offer() {
        let (cluster, layout) = cluster(10 * MS);
        let a = connect(&cluster, layout);
        fill_log(&a, "a");
        // Another client claims a chunk, uses one register of it and closes: the
        // other three are donated.
        let b = connect(&cluster, layout);
        insert(&b, "b");
        b.close();
        let offered = census_of(&a).donated;
        assert!(offered > 0, "b's close donated its unused registers");
        assert_eq!(a.relief_passes.get(), 0);
        insert(&a, "a-next");
        assert_eq!(
            a.relief_passes.get(),
            1,
            "the insert ran a pass for its log"
        );
        assert_eq!(
            a.recycle_stats().reclaimed_donations,
            0,
            "a client with registers took donated ones for its log"
        );
        assert_eq!(
            census_of(&a).donated,
            offered,
            "the donations are still on offer"
        );
        // A client that runs dry still finds them.
        let c = connect(&cluster, layout);
        block_on(c.fabric(), c.reclaim_gone_registers_now()).expect("a pass");
        assert_eq!(c.recycle_stats().reclaimed_donations, offered);
    }

    /// A log nearly full of live values stays so (no pass frees anything there), and
    /// a pass reads every claimed register's header. They ran back to back in the
    /// soak (each took most of the register grace, which paces them): a fill's
    /// thread inserted a key or two per second. A pass for the log now waits eight
    /// times as long as the last one took.
    #[test]
    fn passes_for_a_log_full_of_live_values_take_a_small_share_of_the_writers_time() {
        // A pass waits the delivery margin (and a little more) before it reads.
        let margin = 40 * MS;
        let (cluster, layout) = cluster(margin);
        let a = connect(&cluster, layout);
        fill_log(&a, "a");
        // Over a second and a half of the writer's time, a write every 10 ms (one
        // key written again: its superseded values' slots come back after their
        // grace, the others stay live).
        let f = a.fabric();
        let until = f.now() + 1_500 * MS;
        while f.now() < until {
            insert(&a, "a0");
            block_on_future(f, swarm_core::sleep(f, 10 * MS)).expect("a sleep");
        }
        let passes = a.relief_passes.get();
        // Each pass takes over 40 ms; at most a ninth of 1.5 s, and the first.
        assert!(
            (1..=5).contains(&passes),
            "{passes} passes for the log in 1.5 s"
        );
    }

    /// An insert that finds no free register while its client's last reclamation
    /// pass was cut short by the lease (part of the cluster unscanned) waits for the
    /// next pass, which goes on from there, instead of failing at once: the soak saw
    /// inserts fail with `RegistersFull` while gone clients' registers lay in the
    /// part of the scan a pass had not reached.
    #[test]
    fn a_dry_insert_waits_for_the_pass_after_one_cut_short() {
        // Six chunks of four registers.
        let (_, big) = cluster(MS);
        let params = ClusterParams {
            registers: 24,
            ..big.params
        };
        let layout = NodeLayout::new(params).expect("a valid layout");
        let cluster = MemCluster::new(3, 1 << 20);
        crate::store::write_superblock(&cluster.client(), &params).expect("three live nodes");
        let a = connect(&cluster, layout);
        let b = connect(&cluster, layout);
        // b claims every chunk and uses every register, then deletes a few keys (its
        // limbo, tagged for others) and closes.
        let mut n = 0;
        loop {
            let key = format!("b{n}");
            match block_on(b.fabric(), b.insert(key.as_bytes(), b"v", &OpStats::new())) {
                Ok(()) => n += 1,
                Err(crate::KvError::RegistersFull { .. }) => break,
                Err(error) => panic!("insert {key}: {error}"),
            }
        }
        assert!(n > 8, "{n} keys fit");
        for i in 0..8 {
            let key = format!("b{i}");
            block_on(b.fabric(), b.delete(key.as_bytes(), &OpStats::new()))
                .unwrap_or_else(|error| panic!("delete {key}: {error}"));
        }
        b.close();
        // a's last pass stopped early (its lease ran short) just now: the next one,
        // due in 10 ms, goes on where it stopped.
        let f = a.fabric();
        a.next_adoption.set(f.now() + 10 * MS);
        a.reclaim_cut_short.set(true);
        block_on(f, a.insert(b"a", b"v", &OpStats::new()))
            .expect("the insert waits for the next pass, which takes b's retired registers");
        assert!(a.recycle_stats().reclaimed_limbo > 0 || a.recycle_stats().recycled > 0);
    }
}
