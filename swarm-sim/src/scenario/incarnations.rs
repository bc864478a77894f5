//! Clients that crash and restart on their writer id (SWARM §4.3: a new incarnation
//! resumes the earlier one's log): the incarnations task, their tick ceilings and
//! log summaries, and the check of the writes each incarnation sent
//! ([`crash_restart_writes`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::format;
use std::rc::Rc;
use std::string::{String, ToString};
use std::vec::Vec;

use crate::{ClientId, SimClock, SimFabric, SimRng};
use swarm_core::encoding::{Tsp, WriterId};
use swarm_core::fabric::{Batch, NodeId, Op};
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::quorum::{broadcast_until, majority};
use swarm_core::summary::LogSummary;
use swarm_core::{Client, Fabric, OpStats};
use swarm_core::{ProtocolConfig, SwarmError};

use super::config::Scenario;
use super::faults::{random_skew, schedule_slow_links};
use super::outcome::Record;
use super::run::{Directory, SlotRecycling, locate, slot_on, slot_recycling_task};
use super::workload::{CrashAt, Lane, lane_task};

/// The writes that left the clients, seen as they were posted (crash restarts only):
/// per timestamp (ticks, writer), the first client that sent a record with it, the
/// register, the record, and the nodes that client sent it to. A later batch with
/// the same timestamp is a write-back of that write by another operation (a read
/// copies the buffer to the nodes that lack it), unless its record differs.
#[derive(Default)]
pub(super) struct SentWrites {
    sent: BTreeMap<(u64, u16), SentWrite>,
    /// Timestamps sent again with another record (a timestamp used twice).
    reused: Vec<String>,
}

/// The first sending of one timestamp ([`SentWrites`]).
struct SentWrite {
    client: ClientId,
    register: u32,
    record: Vec<u8>,
    nodes: u32,
}

impl SentWrites {
    /// Notes `batch` if it writes a record: a record written into a log slot and a
    /// CAS of a register's metadata word to that record's timestamp.
    pub(super) fn see(
        &mut self,
        layout: &Layout,
        ceilings: u64,
        placed: bool,
        client: ClientId,
        node: NodeId,
        batch: &Batch,
    ) {
        let mut record = None;
        let mut register = None;
        for op in batch.ops() {
            match op {
                Op::Write { addr, data } if *addr >= layout.log_base() => record = Some(data),
                // The first CAS: the write's MAX (a delete-word probe may follow it).
                Op::Cas { addr, new, .. }
                    if (HEADER_SIZE..ceilings).contains(addr) && register.is_none() =>
                {
                    let slot = (addr - HEADER_SIZE) / layout.register_bytes();
                    // The slot's register on this node (its own inverse: an xor).
                    register = Some((slot_on(placed, node, slot as u32), *new));
                }
                _ => {}
            }
        }
        let (Some(record), Some((register, meta))) = (record, register) else {
            return;
        };
        let Some(word) = record.get(..8).and_then(|w| w.try_into().ok()) else {
            return;
        };
        let ts = Tsp::from_word(u64::from_le_bytes(word)).ts();
        if ts != Tsp::from_word(meta).ts() || ts.is_tombstone() {
            return;
        }
        let first = self
            .sent
            .entry((ts.ticks(), ts.writer().get()))
            .or_insert_with(|| SentWrite {
                client,
                register,
                record: record.to_vec(),
                nodes: 0,
            });
        if first.record[..] != record[..] || first.register != register {
            self.reused.push(format!(
                "{ts:?} sent by {client} for register {register}, first by {} for register {}",
                first.client, first.register
            ));
        } else if first.client == client {
            first.nodes += 1;
        }
    }
}

/// What the writes seen leaving the clients say about crash restarts: how many
/// writes of crashed incarnations left for some replicas only, and every write of an
/// incarnation whose timestamp is not above all those an earlier incarnation of its
/// writer id sent for the same register.
pub(super) fn crash_restart_writes(
    incarnations: &[(ClientId, u32, u32, bool)],
    sent: &SentWrites,
    replicas: u16,
) -> (u64, Vec<String>) {
    let of = |client: ClientId| incarnations.iter().find(|i| i.0 == client);
    let mut partial = 0;
    // Per (writer, register, incarnation): the ticks it used first.
    let mut ticks: BTreeMap<(u32, u32, u32), Vec<u64>> = BTreeMap::new();
    for (&(ticks_of, ts_writer), first) in &sent.sent {
        let Some(&(_, writer, k, crashed)) = of(first.client) else {
            continue;
        };
        if u32::from(ts_writer) != writer {
            continue;
        }
        if crashed && (first.nodes as usize) < majority(usize::from(replicas)) {
            partial += 1;
        }
        ticks
            .entry((writer, first.register, k))
            .or_default()
            .push(ticks_of);
    }
    let mut violations = sent.reused.clone();
    for (&(writer, register, k), later) in &ticks {
        for (&(w, r, earlier_k), earlier) in
            ticks.range((writer, register, 0)..(writer, register, k))
        {
            debug_assert!(w == writer && r == register && earlier_k < k);
            let highest = earlier.iter().copied().max().unwrap_or(0);
            for &t in later.iter().filter(|&&t| t <= highest) {
                violations.push(format!(
                    "writer {writer} register {register}: incarnation {k} wrote at tick {t}, \
                     incarnation {earlier_k} at tick {highest}"
                ));
            }
        }
    }
    (partial, violations)
}

/// What a client's incarnations share ([`Scenario::incarnations`]).
pub(super) struct Incarnations {
    pub(super) scenario: Scenario,
    pub(super) spawner: crate::runner::Spawner,
    pub(super) fabric: SimFabric,
    pub(super) clock: SimClock,
    pub(super) config: ProtocolConfig,
    pub(super) index: u32,
    pub(super) layout: Layout,
    pub(super) directory: Rc<RefCell<Directory>>,
    pub(super) record: Rc<RefCell<Record>>,
    pub(super) seed: u64,
    /// Address of writer 0's tick-ceiling word ([`Scenario::crash_restarts`]).
    pub(super) ceilings: u64,
    /// Rough length of the run.
    pub(super) span: u64,
}

/// Ticks a crash-restarting incarnation persists its tick ceiling beyond the
/// timestamp that needs a raise: at the scenarios' ticks of microseconds, a raise
/// every few operations (and operations that wait for another's raise), yet most
/// writes start with their own posts (where the crashes are placed).
const CEILING_HEADROOM: u64 = 256;

/// Runs a client's operations through its incarnations, one after the other (one
/// incarnation unless [`Scenario::incarnations`] says more): each runs its lanes and
/// its slot-recycling task, and, once its lanes are done, hands its log summary to the
/// next; or, with [`Scenario::crash_restarts`], crashes mid-write and leaves the
/// next one to take its writer id over.
pub(super) async fn incarnations_task(ctx: Incarnations) {
    let Incarnations {
        scenario,
        spawner,
        fabric,
        clock,
        config,
        index,
        layout,
        directory,
        record,
        seed,
        ceilings,
        span,
    } = ctx;
    let inflight = scenario.inflight.max(1);
    let incarnations = scenario.incarnations.max(1);
    let per = scenario.ops_per_client.div_ceil(incarnations);
    let writer = WriterId::new(index).expect("scenarios stay below the writer limit");
    let mut rng = SimRng::new(seed);
    let mut summary: Option<LogSummary> = None;
    let world = fabric.world().clone();
    // The skew of the last incarnation's clock when it stopped.
    let mut last_skew = clock.skew();
    for k in 0..incarnations {
        let first_op = k * per;
        if first_op >= scenario.ops_per_client {
            break;
        }
        // A restart may run on another host, whose clock may lag: later incarnations
        // get a clock of their own, skewed afresh under clock faults.
        let clock = if k > 0 && scenario.faults.clock_skew && scenario.crash_restarts {
            // The host a crashed writer id is taken over on lags the dead one's clock
            // (by up to twice the largest skew): without its predecessor's ticks, it
            // would guess below them.
            let lag = rng.between(0, 2 * scenario.max_skew_ns.min(i64::MAX as u64 / 4));
            SimClock::new(&world, scenario.tick_ns).with_skew(last_skew - lag as i64)
        } else if k > 0 && scenario.faults.clock_skew {
            SimClock::new(&world, scenario.tick_ns)
                .with_skew(random_skew(&mut rng, scenario.max_skew_ns))
        } else {
            clock.clone()
        };
        // A crash-restarting incarnation is a process of its own (crashing it drops
        // its tasks, not this one).
        let fabric = if scenario.crash_restarts {
            let own = world.client();
            if scenario.faults.slow_links {
                let now = world.now();
                schedule_slow_links(&scenario, &world, &mut rng, own.id(), now, span.max(now));
            }
            own
        } else {
            fabric.clone()
        };
        let id = fabric.id();
        let client = match Client::new(fabric.clone(), clock, layout, writer, config) {
            Ok(client) => Rc::new(client),
            Err(e) => {
                record.borrow_mut().errors.push(e.to_string());
                return;
            }
        };
        let replicas = scenario.replicas;
        let placed = scenario.placed_offsets;
        if scenario.crash_restarts {
            let addr = ceilings + 8 * u64::from(index);
            let held = match read_ceiling(&fabric, addr).await {
                Ok(held) => held,
                Err(e) => {
                    record.borrow_mut().errors.push(e.to_string());
                    return;
                }
            };
            if k > 0 {
                // As SWARM-KV's registration does, the next owner lowers a write-back
                // guard its predecessor left up: one whose lower still waited for a
                // batch in flight when it crashed (`swarm_core::write_back_guard`).
                // What the predecessor posted has landed by now (it was given the
                // writer id a delivery margin after the crash).
                if let Some(guard) = layout.guard_addr(writer) {
                    for node in 0..fabric.node_count() {
                        let mut lower = Batch::write(guard, 0u64.to_le_bytes().to_vec());
                        fabric.post_detached(NodeId(node as u16), &mut lower);
                    }
                }
                // As SWARM-KV's client does on a writer id whose holder crashed.
                client.resume_crashed(held, move |addr| locate(&layout, replicas, placed, addr));
                let mut r = record.borrow_mut();
                r.crash_resumes += 1;
                r.carried_slots += client.carried_remaining() as u64;
            }
            client.set_tick_ceiling(addr, held, CEILING_HEADROOM);
            let crashes = k + 1 < incarnations;
            record
                .borrow_mut()
                .incarnations
                .push((id, index, k, crashes));
        } else if let Some(summary) = &summary {
            client.resume_summary(summary, move |addr| locate(&layout, replicas, placed, addr));
            let mut r = record.borrow_mut();
            r.summary_resumes += 1;
            r.carried_slots += client.carried_remaining() as u64;
        }
        let ops = per.min(scenario.ops_per_client - first_op);
        // Where a crashing incarnation dies: at its first write from a random
        // operation of its last quarter on (lane 0), at one of that write's posts.
        let crash = (scenario.crash_restarts && k + 1 < incarnations).then(|| CrashAt {
            op: rng.between(u64::from(ops * 3 / 4), u64::from(ops.saturating_sub(1))) as u32,
            post: rng.between(1, u64::from(replicas)) as u32,
        });
        let lanes_left = Rc::new(core::cell::Cell::new(inflight));
        let writes_done = Rc::new(core::cell::Cell::new(0u64));
        if let Some(r) = scenario.recycling {
            spawner.spawn(
                id,
                slot_recycling_task(SlotRecycling {
                    client: client.clone(),
                    recycling: r,
                    lanes_left: lanes_left.clone(),
                    record: record.clone(),
                }),
            );
        }
        for lane in 0..inflight {
            let task = lane_task(Lane {
                scenario: Scenario {
                    ops_per_client: ops,
                    ..scenario
                },
                client: client.clone(),
                index,
                lane,
                first_op,
                layout,
                directory: directory.clone(),
                record: record.clone(),
                seed: rng.next_u64(),
                lanes_left: lanes_left.clone(),
                crash: if lane == 0 { crash } else { None },
                writes_done: writes_done.clone(),
            });
            spawner.spawn(id, task);
        }
        while lanes_left.get() > 0 {
            world.sleep(10_000).await;
        }
        last_skew = client.clock().skew();
        if scenario.crash_restarts {
            if k > 0 {
                let mut r = record.borrow_mut();
                let fewest = r.min_writes_after_crash.unwrap_or(u64::MAX);
                r.min_writes_after_crash = Some(fewest.min(writes_done.get()));
            }
            if crash.is_some() {
                // Dead for good, even if lane 0 found no write to die in.
                world.crash_client(id);
                // Its successor is given the writer id once what it posted landed
                // (as a lease that expired long after: a delivery margin here).
                let margin = scenario.recycling.map_or(100_000, |r| r.delivery_margin_ns);
                world.sleep(margin).await;
            }
            continue;
        }
        // A clean stop: every operation of this incarnation returned. Its summary
        // goes through its encoding, as a store hands it on through memory.
        let stamp = u64::from(k) + 1;
        let slots = layout.slots_per_writer();
        summary = LogSummary::decode(&client.log_summary().encode(stamp), stamp, slots).ok();
    }
}

/// Reads a writer's tick-ceiling word at `addr` from a majority of nodes (and every
/// other node that answers in time): the largest value read.
async fn read_ceiling(fabric: &SimFabric, addr: u64) -> Result<u64, SwarmError> {
    let stats = OpStats::new();
    let nodes = fabric.node_count();
    let rt = broadcast_until(
        fabric,
        &stats,
        majority(nodes),
        100_000,
        |_| Ok(Some(Batch::read(addr, 8))),
        |replies| replies.len() == nodes,
    )
    .await?;
    Ok(rt
        .replies()
        .iter()
        .filter_map(|(_, completion)| completion.read(0))
        .filter_map(|bytes| bytes.try_into().ok().map(u64::from_le_bytes))
        .max()
        .unwrap_or(0))
}
