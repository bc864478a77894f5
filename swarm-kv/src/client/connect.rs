//! Joining and leaving the cluster: [`KvClient::connect`] reads the cluster
//! configuration and has the fabric admit its members (so that a node running
//! another incarnation serves neither the registration nor the first operations),
//! registers a writer id in the client table (`crate::membership::writer_ids`) and
//! resumes that writer's out-of-place log (from a sealed summary, lazily above its
//! tick ceiling, or by a whole-log scan); [`KvClient::close`] runs the deferred
//! unmaps left, judges the inserts whose outcome stayed unknown, gives the retired
//! registers' marks time to land, seals the log summary for the next client of the
//! writer id, and gives the id back.

use std::cell::{Cell, RefCell};

use swarm_core::encoding::WriterId;
use swarm_core::resume::scan_log;
use swarm_core::{Client, Clock, Fabric, NodeId, OpStats};
use xxhash_rust::xxh3::xxh3_64;

use crate::cache::LocationCache;
use crate::configuration::Configuration;
use crate::index::{Index, IndexConfig};
use crate::layout::NodeLayout;
use crate::membership::writer_ids::{self, Resume};
use crate::registers::alloc::RegisterAllocator;
use crate::registers::recycle::Recycler;
use crate::{KvError, RegisterId};

use super::blind_policy::BlindPolicy;
use super::deferred_unmap::DeferredUnmaps;
use super::{KvClient, KvConfig, locate_register};
use crate::placement::SharedPlacements;

/// How long a closing client waits for resets due soon (taken donations, due the
/// delivery margin after the reclamation pass that took them) so that it can donate
/// them with the rest of its pool, at most.
pub(super) const CLOSE_RESET_WAIT_NS: swarm_core::fabric::Nanos = 50_000_000;

fn token_for(pid: u64) -> u64 {
    let now = crate::clock::SystemClock::unix_ns();
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&now.to_le_bytes());
    bytes[8..16].copy_from_slice(&pid.to_le_bytes());
    let stack = &bytes as *const _ as u64;
    bytes[16..].copy_from_slice(&stack.to_le_bytes());
    xxh3_64(&bytes) | 1
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Registers a writer id in the client table and returns a client using it.
    /// Blocks until the registration is done (a few roundtrips, driven on `fabric`).
    /// First reads the configuration from a majority (one roundtrip) and follows it
    /// ([`Fabric::admit`] for every member incarnation): the registration and every
    /// operation then see the nodes the configuration has in service, and a
    /// register reset or a donation sees a repair it announced.
    pub fn connect(
        fabric: F,
        clock: C,
        layout: NodeLayout,
        config: KvConfig,
    ) -> Result<Self, KvError> {
        let nodes = fabric.node_count();
        if nodes < usize::from(layout.params.replicas) {
            return Err(KvError::TooFewNodes {
                nodes,
                replicas: layout.params.replicas,
            });
        }
        // The configuration first: a node whose incarnation is not the member's (a
        // memory node that restarted with empty memory, a node file re-created) must
        // not count towards the quorums of the registration or of the first
        // operations, and a client that has followed no configuration counts every
        // node as in service and sees no repair (`KvClient::replica_status`).
        // The metadata group: the client table, the index, the chunk table and the
        // configuration are on nodes `0..meta` (`NodeLayout::metadata_nodes`).
        let meta = layout.metadata_nodes(nodes);
        let followed = Self::follow_initial_configuration(&fabric, &config, meta)?;
        // The node slots with every member admitted (nodes added since this process
        // mapped the cluster among them).
        let nodes = fabric.node_count();
        // Then where chunks live, at that configuration's epoch: before the log is
        // resumed, whose write-backs go to its registers' replicas.
        let placements = SharedPlacements::default();
        placements.set(swarm_core::block_on(
            &fabric,
            crate::placement::read(
                &fabric,
                &OpStats::new(),
                &layout,
                meta,
                followed.epoch,
                config.protocol.slow_after_ns,
            ),
        )?);
        let owner = crate::membership::owner_process::this_process();
        let token = token_for(owner);
        let (registration, lease) = swarm_core::block_on(
            &fabric,
            writer_ids::register(
                &fabric,
                &layout,
                meta,
                token,
                owner,
                config.owners,
                config.writer_wait_ns,
            ),
        )?;
        let writer =
            WriterId::new(u32::from(registration.writer)).map_err(swarm_core::SwarmError::from)?;
        // The earlier incarnations' log: from a sealed summary, else a whole-log scan
        // (`crate::membership::writer_ids`, "Resuming a log").
        let summary = match registration.resume {
            Resume::Summary { stamp } => swarm_core::block_on(
                &fabric,
                writer_ids::read_summary(&fabric, &layout, meta, registration.writer, stamp),
            )?,
            Resume::Fresh | Resume::Scan => None,
        };
        // After a crash (no sealed summary), a cluster with tick ceilings resumes the
        // log lazily above the ceiling; an older one scans it whole first.
        let crashed = registration.reused && summary.is_none();
        let scan = if crashed && !layout.params.tick_ceilings {
            let stats = OpStats::new();
            tracing::info!(
                writer = registration.writer,
                "resuming the writer id's log by a whole-log scan (no sealed summary)"
            );
            Some(swarm_core::block_on(
                &fabric,
                scan_log(
                    &fabric,
                    &stats,
                    &layout.swarm,
                    writer,
                    writer_ids::RESUME_STRAGGLER_NS,
                ),
            )?)
        } else {
            None
        };
        // The fence is cluster-wide: recycling waits a grace computed from it.
        // So are the delivery margin and so the grace.
        let protocol = config
            .protocol
            .with_table_nodes(meta)
            .with_max_op_ns(layout.params.max_op_ns)
            .with_delivery_margin_ns(layout.params.delivery_margin_ns);
        let swarm = Client::new(fabric, clock, layout.swarm, writer, protocol)?;
        // Index and key-header reads avoid the nodes the register protocol suspects.
        let index = Index::new(
            &layout,
            nodes,
            IndexConfig {
                client_id: registration.writer,
                ..config.index
            },
        )?
        .with_suspicion(swarm.suspicion().clone())
        .with_placements(placements.clone());
        if layout.params.tick_ceilings {
            // About a second of ticks past each timestamp that needs a raise (one
            // more roundtrip per second of timestamps), plus the log's slots (an
            // allocation bumps ticks until its slot is free).
            let headroom = (1_000_000_000 / config.tick_ns.max(1))
                .saturating_add(u64::from(layout.params.log_slots));
            swarm.set_tick_ceiling(
                layout.client_row(registration.writer) + writer_ids::TICK_CEILING,
                registration.ceiling,
                headroom,
            );
            if crashed {
                tracing::info!(
                    writer = registration.writer,
                    ceiling = registration.ceiling,
                    "resuming a crashed writer id's log lazily, above its tick ceiling"
                );
                let placements = placements.clone();
                swarm.resume_crashed(registration.ceiling, move |addr| {
                    locate_register(&layout, nodes, &placements, addr)
                });
            }
        }
        if let Some(scan) = scan {
            // The earlier incarnation's buffers are tracked by register, so that the
            // ones superseded since are recycled (`swarm_core::resume`).
            swarm.resume_scan(&scan, |addr| {
                locate_register(&layout, nodes, &placements, addr)
            });
        }
        if let Some(summary) = summary {
            tracing::debug!(
                writer = registration.writer,
                carried = summary.in_use(),
                "resumed the writer id's log from its sealed summary"
            );
            let placements = placements.clone();
            swarm.resume_summary(&summary, move |addr| {
                locate_register(&layout, nodes, &placements, addr)
            });
        }
        if swarm.slots_in_use() >= layout.params.log_slots {
            // Every operation would fence waiting for a slot's grace (one-shot clients
            // that each inherit the same full log would never get one): wait for it
            // here, before any operation starts.
            tracing::info!(
                writer = registration.writer,
                "resumed a full log: waiting for a superseded slot's grace"
            );
            if !swarm_core::block_on_future(swarm.fabric(), swarm.make_room())? {
                tracing::warn!(
                    writer = registration.writer,
                    "every slot of the resumed log holds a live value: writes will fail"
                );
            }
        }
        Ok(Self {
            alloc: RegisterAllocator::new(&layout, registration.writer, token),
            swarm,
            layout,
            nodes,
            meta,
            index,
            recycler: Recycler::new(
                layout.params.register_grace_ns(),
                registration.writer,
                crate::registers::limbo::holder_tag(registration.writer, token),
            ),
            max_op_ns: layout.params.max_op_ns,
            cache: RefCell::new(LocationCache::new(
                config.cache_bytes,
                layout.params.cache_ttl_ns,
            )),
            token,
            registration,
            protocol: config.register_protocol,
            lease: RefCell::new(lease),
            lease_revive_ns: config.lease_revive_ns,
            next_adoption: Cell::new(0),
            donations_left: Cell::new(0),
            // Clients that run dry at once (the clients of one `swarm bench`) would
            // race for the same registers from the same start: each writer id starts
            // its scans at its own share of the registers.
            reclaim_resume_at: Cell::new(
                layout.params.registers / u64::from(layout.params.writers.max(1))
                    * u64::from(registration.writer),
            ),
            reclaim_cut_short: Cell::new(false),
            config_checked: Cell::new(0),
            next_holdings_log: Cell::new(0),
            next_relief: Cell::new(0),
            relief_passes: Cell::new(0),
            header_missing_logged: Cell::new(None),
            epoch_followed: Cell::new(followed.epoch),
            followed: RefCell::new(Some(followed)),
            placements,
            deferred: RefCell::new(DeferredUnmaps::new(config.deferred_unmaps)),
            undecided: RefCell::default(),
            blind: BlindPolicy::new(),
            payload_buffer: Cell::new(Vec::new()),
        })
    }

    /// Reads the configuration from a majority, waiting for the other nodes only as
    /// long as the protocol waits for a slow node, and asks `fabric` to admit every
    /// member incarnation ([`Fabric::admit`]), before the client registers: the
    /// transport then leaves out every node that runs another incarnation (RDMA
    /// fails it and reconnects expecting the member), as for a configuration
    /// followed later (`KvClient::follow_configuration`). A legacy configuration
    /// (epoch 0, no record) admits nothing.
    fn follow_initial_configuration(
        fabric: &F,
        config: &KvConfig,
        meta: usize,
    ) -> Result<Configuration, KvError> {
        let stats = OpStats::new();
        let straggler_ns = config.protocol.slow_after_ns;
        let read = swarm_core::block_on(
            fabric,
            crate::repair::read_configuration_within(
                fabric,
                &stats,
                meta,
                swarm_core::quorum::majority(meta),
                straggler_ns,
            ),
        )?;
        if read.epoch > 0 {
            // Every member, also one added since this process mapped the cluster.
            let refused: Vec<usize> = (0..read.incarnations.len())
                .filter(|&i| !fabric.admit(NodeId(i as u16), read.incarnations[i]))
                .collect();
            if !refused.is_empty() {
                tracing::debug!(
                    epoch = read.epoch,
                    ?refused,
                    "connecting: members the transport cannot reach as their incarnation"
                );
            }
        }
        Ok(read)
    }

    /// Gives the writer id back (its log is resumed by the next client that takes it).
    /// First gives back what it never used (`crate::registers::give_back`): chunks
    /// none of whose registers it handed out go back to the chunk table, the other
    /// registers it never handed out and its recycled pool are donated, for any client
    /// to take without a grace. Registers in limbo are left to others: they carry this
    /// client's holder tag, which is gone once the row is given back, so a client that
    /// runs out of registers reclaims them (`crate::registers::limbo`, "a clean close").
    /// Waits up to `crate::membership::writer_takeover::STRAGGLER_NS` for retire
    /// marks still in flight, and as long for the batches a write-back guard's lower
    /// waits for. Bounded in time; a node error never fails it.
    pub fn close(self) {
        if self.has_deferred_unmaps() {
            let fabric = self.swarm.fabric();
            // Unmaps that fail are queued again (a stall, a node out): a few rounds,
            // a millisecond apart.
            let run = async {
                let mut result = self.run_deferred_unmaps().await;
                for _ in 1..super::deferred_unmap::UNMAP_ATTEMPTS {
                    if result.is_err() || !self.has_deferred_unmaps() {
                        break;
                    }
                    swarm_core::sleep(fabric, 1_000_000).await;
                    result = self.run_deferred_unmaps().await;
                }
                result
            };
            if let Err(error) = swarm_core::block_on_future(fabric, run)
                .map_err(KvError::from)
                .and_then(|ran| ran)
            {
                tracing::warn!(
                    writer = self.registration.writer,
                    waiting = self.deferred_unmap_stats().waiting,
                    %error,
                    "closing: deferred index unmaps could not run; their keys read as absent"
                );
            }
        }
        if !self.undecided.borrow().is_empty() {
            let fabric = self.swarm.fabric();
            let judged = swarm_core::block_on_future(fabric, self.judge_undecided_inserts())
                .map_err(KvError::from)
                .and_then(|judged| judged);
            let waiting = self.undecided_insert_stats().waiting;
            if judged.is_err() || waiting > 0 {
                tracing::warn!(
                    writer = self.registration.writer,
                    waiting,
                    error = ?judged.err(),
                    "closing: inserts whose outcome stayed unknown could not all be judged; their registers stay taken"
                );
            }
        }
        self.swarm.cancel_slot_recycling();
        self.give_back_unused();
        let fabric = self.swarm.fabric();
        if self.recycler.marks_in_flight(fabric) > 0 {
            let until = fabric
                .now()
                .saturating_add(crate::membership::writer_takeover::STRAGGLER_NS);
            let _ = swarm_core::block_on_future(fabric, async {
                while self.recycler.marks_in_flight(fabric) > 0 && fabric.now() < until {
                    swarm_core::sleep(fabric, 100_000).await;
                }
            });
        }
        // A write-back guard whose lower waits for batches still in flight
        // (`swarm_core`'s write-back guards, "The lower"; never on shared memory):
        // lowered once they are done, so that it does not keep a slot of another
        // writer out of use until this writer id is registered again. Best effort,
        // within the same bound.
        if !self.swarm.lower_guard_if_done() {
            let until = fabric
                .now()
                .saturating_add(crate::membership::writer_takeover::STRAGGLER_NS);
            let _ = swarm_core::block_on_future(fabric, async {
                while !self.swarm.lower_guard_if_done() && fabric.now() < until {
                    swarm_core::sleep(fabric, 100_000).await;
                }
            });
        }
        let log = self.swarm.slot_counters();
        tracing::info!(
            writer = self.registration.writer,
            in_use = log.in_use,
            in_limbo = log.in_limbo,
            recycled = log.recycled,
            "closing: out-of-place log slots in use, waiting out the grace, recycled"
        );
        self.recycler.abandon(self.swarm.fabric());
        match self.seal_log_summary() {
            Ok(true) => {}
            Ok(false) => tracing::debug!(
                writer = self.registration.writer,
                "no log summary left: the next client of this writer id scans the whole log"
            ),
            Err(error) => tracing::info!(
                writer = self.registration.writer,
                %error,
                "log summary not sealed: the next client of this writer id scans the whole log"
            ),
        }
        writer_ids::unregister(
            self.swarm.fabric(),
            &self.layout,
            self.meta,
            self.registration.writer,
            self.token,
        );
        // Let the release reach the nodes.
        let _ = swarm_core::block_on_future(self.swarm.fabric(), async {});
    }

    /// Gives back what this client never used (`crate::registers::give_back`), best
    /// effort, under its lease: first finishes the resets due within
    /// `CLOSE_RESET_WAIT_NS` (taken donations wait only the delivery margin: left
    /// in limbo, they would come back to others only after a grace), then releases
    /// the chunks it handed nothing out of and donates its other unused registers and
    /// its pool, all within one operation deadline (`max_op_ns`). Errors are logged at
    /// debug level: what was not given back stays to be adopted or reclaimed.
    fn give_back_unused(&self) {
        let fabric = self.swarm.fabric();
        let max_op_ns = self.layout.params.max_op_ns;
        let started = fabric.now();
        if !self.lease.borrow().valid_for(started, max_op_ns) {
            tracing::debug!(
                writer = self.registration.writer,
                "closing: lease too short to give back unused registers; they are adopted or reclaimed later"
            );
            return;
        }
        // Resets due soon: taken donations (due the delivery margin after their
        // pass). Every step runs under the lease, as `recycle_step` requires.
        let until = started.saturating_add(CLOSE_RESET_WAIT_NS);
        let due_soon = || {
            self.recycler.resetting() || self.recycler.next_due().is_some_and(|due| due <= until)
        };
        if due_soon() {
            let _ = swarm_core::block_on_future(fabric, async {
                loop {
                    self.recycle_step();
                    let now = fabric.now();
                    if !due_soon() || now >= until || !self.lease.borrow().valid_for(now, max_op_ns)
                    {
                        break;
                    }
                    let next = match self.recycler.next_due() {
                        Some(due) if !self.recycler.resetting() => due.min(until),
                        _ => now.saturating_add(100_000),
                    };
                    swarm_core::sleep(fabric, next.saturating_sub(now).max(1)).await;
                }
            });
        }
        let unused = self.alloc.take_unused();
        if unused.chunks.is_empty() && unused.fresh.is_empty() && unused.recycled.is_empty() {
            return;
        }
        let now = fabric.now();
        if !self.lease.borrow().valid_for(now, max_op_ns) {
            return;
        }
        // Donations only while every node serves and no repair is announced, as at
        // reset time (`crate::registers::recycle`, "donations").
        let may_donate = !self.repair_announced()
            && (0..self.nodes).all(|n| {
                self.replica_status(NodeId(n as u16))
                    == crate::registers::recycle::ReplicaStatus::InService
            });
        let stats = OpStats::new();
        let _deadline = stats.arm_deadline(now.saturating_add(max_op_ns));
        let tag = self.recycler.tag();
        let mut registers: Vec<(RegisterId, u64, Option<swarm_core::encoding::Tsp>)> = Vec::new();
        if may_donate {
            registers.extend(unused.fresh.iter().map(|r| (*r, 0, None)));
            let pooled = crate::registers::limbo::header_word(0, tag);
            registers.extend(
                unused
                    .recycled
                    .iter()
                    .map(|(r, marker)| (*r, pooled, Some(*marker))),
            );
        }
        let given = swarm_core::block_on(fabric, async {
            let chunks = crate::registers::give_back::release_chunks(
                fabric,
                &stats,
                &self.layout,
                &unused.chunks,
                self.token,
            )
            .await?;
            let (donated, incomplete) = crate::registers::give_back::donate(
                fabric,
                &stats,
                &self.layout,
                &registers,
                |r| self.register_loc(r).ok(),
            )
            .await?;
            Ok::<_, KvError>(crate::registers::give_back::GivenBack {
                chunks,
                donated,
                incomplete,
            })
        });
        match given {
            Ok(given) => tracing::debug!(
                writer = self.registration.writer,
                chunks = given.chunks,
                of_chunks = unused.chunks.len(),
                donated = given.donated,
                incomplete = given.incomplete,
                kept = (unused.fresh.len() + unused.recycled.len()) - registers.len(),
                in_limbo = self.recycler.in_limbo(),
                "closing: gave back the chunks and registers never used"
            ),
            Err(error) => tracing::debug!(
                writer = self.registration.writer,
                %error,
                "closing: giving back unused registers failed; they are adopted or reclaimed later"
            ),
        }
    }

    /// Leaves this client's log summary for the next client of its writer id
    /// ([`writer_ids::seal_summary`]), if the cluster has summary areas and the lease
    /// covers the whole seal (it posts nothing after `max_op_ns` from now). Returns
    /// whether the summary was sealed.
    fn seal_log_summary(&self) -> Result<bool, KvError> {
        let fabric = self.swarm.fabric();
        let now = fabric.now();
        let max_op_ns = self.layout.params.max_op_ns;
        if self.layout.summaries_at.is_none() || !self.lease.borrow().valid_for(now, max_op_ns) {
            return Ok(false);
        }
        let stats = OpStats::new();
        let _deadline = stats.arm_deadline(now.saturating_add(max_op_ns));
        let summary = self.swarm.log_summary();
        let sealed = swarm_core::block_on(
            fabric,
            writer_ids::seal_summary(
                fabric,
                &stats,
                &self.layout,
                self.meta,
                self.registration.writer,
                self.registration.generation,
                &summary,
            ),
        )?;
        if sealed {
            tracing::debug!(
                writer = self.registration.writer,
                generation = self.registration.generation,
                used_slots = summary.in_use(),
                "log summary sealed"
            );
        }
        Ok(sealed)
    }
}
