//! The fault schedule: crashed and slow memory nodes, slow client-node links, late
//! messages, clock skew (SWARM §2.2), scheduled on the simulator's runner, and the
//! simulator settings a scenario implies.

use std::vec::Vec;

use crate::{ClientId, Fault, SimConfig, SimFabric, SimRng, SimRunner, SimWorld};
use swarm_core::Fabric;
use swarm_core::encoding::WriterId;
use swarm_core::fabric::{Batch, INLINE_BATCH_OPS, NodeId, Op};
use swarm_core::layout::Layout;

use super::config::Scenario;

/// [`Faults::wiped_copies`]: at each of `times`, overwrites the record header (its
/// timestamp word and length) of every log slot of every writer on `node` with
/// zeros, leaving the timestamp-lock words that precede the records alone.
pub(super) async fn wipe_copies(
    fabric: SimFabric,
    layout: Layout,
    node: NodeId,
    mut times: Vec<u64>,
) {
    times.sort_unstable();
    for at in times {
        fabric.sleep(at.saturating_sub(fabric.now())).await;
        for writer in 0..layout.writers() {
            let Ok(writer) = WriterId::new(u32::from(writer)) else {
                continue;
            };
            let slots: Vec<u32> = (0..layout.slots_per_writer()).collect();
            for chunk in slots.chunks(INLINE_BATCH_OPS) {
                let mut batch = Batch::new();
                for &slot in chunk {
                    let Some(addr) = layout.slot_addr(writer, slot) else {
                        continue;
                    };
                    let record = addr + u64::from(swarm_core::layout::SLOT_LOCK_BYTES);
                    // At most INLINE_BATCH_OPS operations: cannot fail.
                    let _ = batch.push(Op::Write {
                        addr: record,
                        data: std::vec![0; 16].into(),
                    });
                }
                let ticket = fabric.post(node, batch);
                fabric.forget(ticket);
            }
        }
    }
}

/// Probability that a message is late under [`Faults::late_messages`].
const LATE_PROBABILITY: f64 = 0.125;

/// Longest extra delay of a late message: each draws its own in `0..=LATE_MAX_NS`,
/// a few roundtrips to a few slow-path timeouts.
const LATE_MAX_NS: u64 = 40_000;

/// The simulated cluster: late messages and stalls per [`Faults`].
pub(super) fn sim_config(scenario: &Scenario, node_bytes: usize) -> SimConfig {
    let mut config = SimConfig::new(usize::from(scenario.replicas), node_bytes).keep_trace(false);
    if scenario.faults.late_messages {
        for node in &mut config.nodes {
            node.latency = node.latency.with_tail_upto(LATE_PROBABILITY, LATE_MAX_NS);
        }
    }
    if scenario.faults.node_stalls {
        config = config.stalls(0.2, 5_000);
    }
    config
}

/// A skew in `±max_ns`.
pub(super) fn random_skew(rng: &mut SimRng, max_ns: u64) -> i64 {
    let max = max_ns.min(i64::MAX as u64 / 2);
    rng.between(0, 2 * max) as i64 - max as i64
}

pub(super) fn schedule_faults(
    scenario: &Scenario,
    runner: &SimRunner,
    rng: &mut SimRng,
    span: u64,
) {
    let n = scenario.replicas;
    let mut nodes: Vec<u16> = (0..n).collect();
    rng.shuffle(&mut nodes);
    if scenario.faults.crash_minority {
        for &node in nodes.iter().take(usize::from((n - 1) / 2)) {
            runner.at(rng.between(0, span / 2), Fault::Crash(NodeId(node)));
        }
    }
    if scenario.faults.slow_node {
        let node = NodeId(nodes[usize::from(n - 1)]);
        let from = rng.between(0, span / 2);
        runner.at(from, Fault::Slow(node, 20));
        runner.at(from + span / 4, Fault::Slow(node, 1));
    }
    if scenario.faults.slow_spells {
        // About one spell every 20 µs of the run, each on a random node.
        for _ in 0..span / 20_000 + 1 {
            let node = NodeId(rng.below(u64::from(n)) as u16);
            let from = rng.between(0, span);
            let factor = rng.between(5, 40) as u32;
            runner.at(from, Fault::Slow(node, factor));
            runner.at(from + rng.between(5_000, 50_000), Fault::Slow(node, 1));
        }
    }
}

/// Slows a third of `client`'s links from `from` (virtual time), then redraws one of
/// them every 40 µs or so until `until`, when they all heal.
pub(super) fn schedule_slow_links(
    scenario: &Scenario,
    world: &SimWorld,
    rng: &mut SimRng,
    client: ClientId,
    from: u64,
    until: u64,
) {
    let draw = |rng: &mut SimRng| match rng.below(10) {
        0..4 => 1,
        4..7 => rng.between(2, 4) as u32,
        _ => rng.between(10, 30) as u32,
    };
    for node in 0..scenario.replicas {
        world.at(from, Fault::SlowLink(client, NodeId(node), draw(rng)));
    }
    for _ in 0..until.saturating_sub(from) / 40_000 {
        let node = NodeId(rng.below(u64::from(scenario.replicas)) as u16);
        let at = rng.between(from, until);
        world.at(at, Fault::SlowLink(client, node, draw(rng)));
    }
    // Every link heals by the end: a read whose holders all answer slower than
    // `slow_after_ns` retries until one answers in time (see the report of issue 10).
    for node in 0..scenario.replicas {
        world.at(until.max(from), Fault::SlowLink(client, NodeId(node), 1));
    }
}
