//! The runner glue: [`run`] builds the simulated world, spawns each client's lanes
//! and background tasks, drives the simulation to its end and gathers the
//! [`super::Outcome`].

use std::cell::RefCell;
use std::rc::Rc;
use std::vec::Vec;

use crate::{Fault, RATE_UNIT, SimClock, SimError, SimFabric, SimRng, SimRunner, SimWorld};
use swarm_checker::History;
use swarm_core::fabric::NodeId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{Batch, Client, Fabric};
use swarm_core::{ProtocolConfig, RegisterLoc, Replicas};

use super::config::{Recycling, Scenario};
use super::faults::{random_skew, schedule_faults, schedule_slow_links, sim_config, wipe_copies};
use super::incarnations::{Incarnations, SentWrites, crash_restart_writes, incarnations_task};
use super::outcome::{Outcome, Record};

/// The register a log record names, from its identity (untrusted: checked).
pub(super) fn locate(
    layout: &Layout,
    replicas: u16,
    placed: bool,
    addr: u64,
) -> Option<RegisterLoc> {
    let offset = addr.checked_sub(HEADER_SIZE)?;
    let index = u32::try_from(offset / layout.register_bytes()).ok()?;
    (offset % layout.register_bytes() == 0).then(|| register(layout, replicas, placed, index))
}

/// The register slot that node `node` keeps register `index` in: the same for
/// every node, or with [`Scenario::placed_offsets`] one of four per node.
pub(super) fn slot_on(placed: bool, node: NodeId, index: u32) -> u32 {
    if placed {
        index ^ u32::from(node.0 % 4)
    } else {
        index
    }
}

/// Register number `index` of a scenario's layout, named by its slot's address; with
/// `placed` each replica at its node's slot ([`slot_on`]).
pub(super) fn register(layout: &Layout, replicas: u16, placed: bool, index: u32) -> RegisterLoc {
    let at = |slot: u32| HEADER_SIZE + u64::from(slot) * layout.register_bytes();
    let replicas = Replicas::all(usize::from(replicas), u64::from(index))
        .unwrap_or_else(|_| Replicas::all(3, u64::from(index)).expect("3 replicas are valid"));
    if !placed {
        return RegisterLoc::at(at(index), replicas);
    }
    let offsets: Vec<(NodeId, u64)> = replicas
        .nodes()
        .iter()
        .map(|&node| (node, at(slot_on(true, node, index))))
        .collect();
    RegisterLoc::placed(at(index), replicas, &offsets).expect("an offset per replica")
}

/// Which register holds each key now, in the key-value model: a key absent from
/// the start or after a delete has none until an insert publishes a fresh register
/// with the value already written (as SWARM-KV's index does, §5.3.1). Publishing is
/// an atomic compare-and-set in virtual time, so it is the insert's linearization
/// point, and every operation on a register started before the key moved away
/// from it.
pub(super) struct Directory {
    pub(super) current: Vec<Option<u32>>,
    next_free: u32,
    capacity: u32,
}

impl Directory {
    fn new(keys: u32, capacity: u32) -> Self {
        Self {
            current: (0..keys).map(|_| None).collect(),
            next_free: 0,
            capacity,
        }
    }

    pub(super) fn allocate(&mut self) -> Option<u32> {
        (self.next_free < self.capacity).then(|| {
            self.next_free += 1;
            self.next_free - 1
        })
    }
}

/// Runs `scenario`; fails only if the simulation stalls or exceeds its time limit
/// (a wait-freedom violation while a majority is alive).
pub fn run(scenario: &Scenario) -> Result<Outcome, SimError> {
    let writers = scenario.clients.max(1) as u16;
    // Without recycling every write uses a fresh log slot, a rewrite or an insert
    // into a fresh register one more: size the logs for it.
    let slots = match scenario.recycling {
        Some(r) => r.log_slots,
        None => (scenario.ops_per_client * 3 + 16).next_power_of_two(),
    };
    // With deletes, a key may move to a fresh register at every insert.
    let registers = if scenario.key_value() {
        scenario.clients * scenario.ops_per_client + scenario.keys
    } else {
        scenario.keys
    };
    // Placed offsets move a register within its aligned group of four slots.
    let registers = if scenario.placed_offsets {
        registers.next_multiple_of(4)
    } else {
        registers
    };
    let shape = |log_base, guards: Option<u64>| {
        let builder = Layout::builder()
            .payload_max(scenario.payload_max)
            .meta_words(scenario.meta_words)
            .log_base(log_base)
            .writers(writers)
            .slots_per_writer(slots);
        match guards {
            Some(at) => builder.write_back_guards(at, 8),
            None => builder,
        }
        .build()
    };
    let register_bytes = shape(0, None)
        .expect("scenario layouts are valid")
        .register_bytes();
    let registers_end = HEADER_SIZE + u64::from(registers) * register_bytes;
    // The tick-ceiling words of crash restarts, one per writer id, after the registers.
    let ceilings = registers_end.next_multiple_of(8);
    let ceilings_end = if scenario.crash_restarts {
        ceilings + 8 * u64::from(writers)
    } else {
        registers_end
    };
    // With slot recycling, the writers' write-back guards, one word per writer id
    // (`swarm_core::write_back_guard`), as SWARM-KV has them. A guard that a crashed
    // client left up is lowered later, as SWARM-KV's takeover of its writer id does
    // (`lower_guards_of_the_dead`).
    let guards = scenario
        .recycling
        .is_some()
        .then(|| ceilings_end.next_multiple_of(8));
    let logs_from = guards.map_or(ceilings_end, |at| at + 8 * u64::from(writers));
    let layout =
        shape(logs_from.next_multiple_of(4096), guards).expect("scenario layouts are valid");
    let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
    let mut rng = SimRng::new(scenario.seed ^ 0x5ca1_ab1e);
    let config = sim_config(scenario, node_bytes);
    let world = SimWorld::new(scenario.seed, config);
    let sent = Rc::new(RefCell::new(SentWrites::default()));
    if scenario.crash_restarts {
        let sent = sent.clone();
        let placed = scenario.placed_offsets;
        world.observe_posts(move |client, node, batch| {
            sent.borrow_mut()
                .see(&layout, ceilings, placed, client, node, batch);
        });
    }
    let mut runner = SimRunner::new(&world);
    let record = Rc::new(RefCell::new(Record::default()));
    let directory = Rc::new(RefCell::new(Directory::new(scenario.keys, registers)));
    if !scenario.key_value() {
        // One register per key, for good.
        let mut dir = directory.borrow_mut();
        for key in 0..scenario.keys {
            dir.current[key as usize] = dir.allocate();
        }
    }
    // Rough length of the run, to place faults inside it. Crash restarts run about
    // fifteen times longer: each successor starts with a full log, and the tiny logs
    // they run with make writes wait for slots to come back.
    let mut span = u64::from(scenario.ops_per_client) * (3_000 + scenario.think_ns);
    if scenario.crash_restarts {
        span *= 16;
    }
    schedule_faults(scenario, &runner, &mut rng, span);

    // Clock rates come from a generator of their own: drawing them from `rng` would
    // move every later random choice, and with it the seed's whole schedule.
    let mut rates = SimRng::new(scenario.seed ^ 0xc10c_4a7e_d41f_7000);
    // Clients that crash for good, and when.
    let mut crashes = Vec::new();
    for c in 0..scenario.clients {
        let fabric = world.client();
        let id = fabric.id();
        if scenario.faults.clock_rates {
            let unit = u64::from(RATE_UNIT);
            let rate = rates.between(unit * 7 / 8, unit * 9 / 8);
            fabric.set_clock_rate(u32::try_from(rate).unwrap_or(RATE_UNIT));
        }
        if scenario.faults.crash_clients && !scenario.crash_restarts && c % 4 == 3 {
            let at = rng.between(span / 4, span);
            runner.at(at, Fault::CrashClient(id));
            crashes.push((c, at));
        }
        if scenario.faults.slow_links {
            schedule_slow_links(scenario, &world, &mut rng, id, 0, span);
        }
        let skew = if scenario.faults.clock_skew {
            random_skew(&mut rng, scenario.max_skew_ns)
        } else {
            0
        };
        let clock = SimClock::new(&world, scenario.tick_ns).with_skew(skew);
        let mut config = ProtocolConfig::default()
            .with_slow_after_ns(10_000)
            .with_suspect_ns(200_000);
        if let Some(r) = scenario.recycling {
            config = config
                .with_max_op_ns(r.max_op_ns)
                .with_delivery_margin_ns(r.delivery_margin_ns)
                .with_slot_recycling_interval_ns(r.interval_ns);
        }
        runner.spawn(
            id,
            incarnations_task(Incarnations {
                scenario: *scenario,
                spawner: runner.spawner(),
                fabric,
                clock,
                config,
                index: c,
                layout,
                directory: directory.clone(),
                record: record.clone(),
                seed: rng.next_u64(),
                ceilings,
                span,
            }),
        );
    }
    if let (Some(at), Some(r)) = (guards, scenario.recycling)
        && !crashes.is_empty()
    {
        let fabric = world.client();
        let id = fabric.id();
        // After the crash, a takeover waits out the owner (its lease, or its
        // process) before anything else: four operation deadlines and margins here.
        let after = 4 * (r.max_op_ns + r.delivery_margin_ns);
        let lowers = crashes
            .iter()
            .map(|&(c, crashed_at)| (at + 8 * u64::from(c), crashed_at + after))
            .collect();
        runner.spawn(id, lower_guards_of_the_dead(fabric, lowers));
    }
    if scenario.faults.wiped_copies {
        let fabric = world.client();
        let id = fabric.id();
        let end = span * u64::from(scenario.stretch.max(1));
        let times: Vec<u64> = (0..scenario.wipes)
            .map(|_| rng.between(span / 16, end))
            .collect();
        runner.spawn(id, wipe_copies(fabric, layout, NodeId(1), times));
    }
    if let (true, Some(r)) = (scenario.faults.held_batches, scenario.recycling) {
        // From a generator of its own, so the other faults keep the seed's schedule.
        let mut holds = SimRng::new(scenario.seed ^ 0x401d_ba7c_4e5d_0000);
        let (from, to) = (layout.log_base(), layout.log_base() + layout.log_bytes());
        let end = span * u64::from(scenario.stretch.max(1)) * 3 / 4;
        for _ in 0..end / HOLD_EVERY_NS + 1 {
            let node = NodeId(if holds.chance(0.5) { 0 } else { 2 });
            let fault = Fault::HoldWrite {
                node,
                from,
                to,
                max_ns: 4 * r.max_op_ns,
            };
            runner.at(holds.between(0, end), fault);
        }
    }
    // A livelock guard only: slow links and spells stretch operations to tens of
    // microseconds, hundreds with retries.
    runner.time_limit(span * 400 + 10_000_000);
    let report = runner.run()?;
    let record = Rc::try_unwrap(record)
        .map(RefCell::into_inner)
        .unwrap_or_else(|shared| core::mem::take(&mut *shared.borrow_mut()));
    let (partial_writes, ticks_not_above_predecessors) =
        crash_restart_writes(&record.incarnations, &sent.borrow(), scenario.replicas);
    let mut history = History::new();
    for op in record.history {
        // Operations built by this module are always well formed.
        let _ = history.push(op);
    }
    Ok(Outcome {
        history,
        reads: record.reads,
        writes: record.writes,
        max_read_iterations: record.max_iterations,
        errors: record.errors,
        run: report,
        recycled_slots: record.recycled,
        max_slots_in_use: record.max_in_use,
        longest_op_ns: record.longest_op_ns,
        recycled_fetches: record.recycled_fetches,
        raced_deletes: record.raced_deletes,
        summary_resumes: record.summary_resumes,
        carried_slots: record.carried_slots,
        carried_examined: record.carried_examined,
        crash_resumes: record.crash_resumes,
        partial_writes,
        min_writes_after_crash: record.min_writes_after_crash.unwrap_or(u64::MAX),
        ticks_not_above_predecessors,
    })
}

/// One [`Faults::held_batches`](super::Faults::held_batches) hold for about every
/// this many nanoseconds of the run's first three quarters. Denser holds fence more
/// operations (a held write-back keeps its reader's next guarded write-back waiting)
/// and reach the held-batch schedules less often: sim_recycling's
/// `batches_held_past_their_slots_reuse_never_garble_a_current_value` failed with the
/// mutant `write-slot-reused-with-its-record-batch-in-flight` on 22 seeds of 100 at a
/// hold every 250 µs, 37 at 150 µs, 40 at 100 µs (with up to 54 of 1600 operations
/// fenced unmutated), 10 at 50 µs (2026-11-29).
const HOLD_EVERY_NS: u64 = 150_000;

/// What a client's background recycling needs.
pub(super) struct SlotRecycling {
    pub(super) client: Rc<Client<SimFabric, SimClock>>,
    pub(super) recycling: Recycling,
    pub(super) lanes_left: Rc<core::cell::Cell<u32>>,
    pub(super) record: Rc<RefCell<Record>>,
}

/// A client's background recycling: a slot-recycling tick (and a step of the examination
/// of carried slots) every `interval_ns` while its lanes run, then the client's log
/// counters into the record.
pub(super) async fn slot_recycling_task(ctx: SlotRecycling) {
    let SlotRecycling {
        client,
        recycling,
        lanes_left,
        record,
    } = ctx;
    let carried = client.carried_remaining();
    while lanes_left.get() > 0 {
        client.recycle_slots_tick(recycling.budget);
        client.examine_carried_tick(client.fabric().now());
        client.fabric().sleep(recycling.interval_ns).await;
    }
    // A clean stop: the write-back guard goes down once its last batches are in.
    while !client.lower_guard_if_done() {
        client.fabric().sleep(recycling.interval_ns).await;
    }
    record.borrow_mut().carried_examined += (carried - client.carried_remaining()) as u64;
    client.cancel_slot_recycling();
    let counters = client.slot_counters();
    let mut r = record.borrow_mut();
    r.recycled += counters.recycled;
    r.max_in_use = r.max_in_use.max(counters.in_use);
}

/// Lowers each `(guard word, time)` of `lowers` on every node at that time: the
/// write-back guard of a client that crashed for good, as SWARM-KV's takeover of its
/// writer id does.
async fn lower_guards_of_the_dead(fabric: SimFabric, mut lowers: Vec<(u64, u64)>) {
    lowers.sort_unstable_by_key(|&(_, at)| at);
    for (guard, at) in lowers {
        fabric.sleep(at.saturating_sub(fabric.now())).await;
        for node in 0..fabric.node_count() {
            let ticket = fabric.post(
                NodeId(node as u16),
                Batch::write(guard, 0u64.to_le_bytes().to_vec()),
            );
            fabric.forget(ticket);
        }
    }
}
