//! Two writes of one writer id on one register, in flight together, explored at
//! random (appendix C, Assumption 2: a writer has one operation outstanding).
//!
//! The rule "a newer tuple from the same writer means its older write completed"
//! (Safe-Guess READ) is sound only under that assumption; `Client::write_slot` makes
//! a client run its writes of one register one at a time. Uniformly random schedules
//! rarely produce the race, so its shape is fixed (the schedule of
//! `sim_write_defects::two_writes_of_one_writer_in_flight_on_one_register_stay_linearizable`)
//! and its timings are random per seed: one client writes A then B a few hundred
//! nanoseconds apart while its links change, so that A's weak read may see B's tuple
//! (A's guess is stale) and a node may hold A's tuple alone for a while; reader R1
//! may see A's tuple, then B's; reader R2 and R3 read later. Without the per-register
//! exclusion, R1 can return A's value by the same-writer rule, A then wins its WRITE
//! lock and rewrites it above B's after R2 returned B's: R3 returns A's again
//! (scripts/mutants: `client-writes-of-one-writer-overlap`).

mod support;

use std::rc::Rc;

use support::{Script, Step, US, finished};
use swarm_core::NodeId;
use swarm_sim::{Fault, SimRng, SimRunner, for_each_seed};

/// A link this many times slower than normal delivers in 100 ms: never, for R1's
/// suspected node.
const NEVER: u32 = 100_000;

fn episode(seed: u64) {
    let mut rng = SimRng::new(seed);
    let script = Script::seeded(4, seed, 100);
    let mut runner = SimRunner::new(&script.world);
    let always = || true;
    let factor = |rng: &mut SimRng, low: u64, high: u64| rng.between(low, high) as u32;

    let writer = Rc::new(script.sim_client(0));
    let w = writer.fabric().id();
    let a_start = 100 * US;
    let b_start = a_start + rng.between(300, 2_000);
    // A's batch to n1 is slow, B's to n0 is; then every link of the writer slows down.
    runner.at(
        a_start - 500,
        Fault::SlowLink(w, NodeId(1), factor(&mut rng, 3, 8)),
    );
    runner.at(a_start + 200, Fault::SlowLink(w, NodeId(1), 1));
    runner.at(
        a_start + 200,
        Fault::SlowLink(w, NodeId(0), factor(&mut rng, 3, 8)),
    );
    let slow_from = b_start + rng.between(200, 2_000);
    let slow = factor(&mut rng, 1, 10);
    for node in 0..3 {
        runner.at(slow_from, Fault::SlowLink(w, NodeId(node), slow));
    }
    let a = script.spawn(
        &runner,
        a_start,
        w,
        writer.clone(),
        Step::Write("x"),
        always,
    );
    let b = script.spawn(&runner, b_start, w, writer, Step::Write("y"), always);

    // R1 suspects n1 since a first read, and reaches n0 late for a short while.
    let r1 = Rc::new(script.sim_client(1));
    let r1_id = r1.fabric().id();
    runner.at(0, Fault::SlowLink(r1_id, NodeId(1), NEVER));
    let r1_start = b_start + rng.between(0, 3_000);
    let r1_slow = r1_start + rng.between(3_000, 8_000);
    runner.at(
        r1_slow,
        Fault::SlowLink(r1_id, NodeId(0), factor(&mut rng, 2, 9)),
    );
    runner.at(r1_slow + 1_000, Fault::SlowLink(r1_id, NodeId(0), 1));
    script.spawn(&runner, 50 * US, r1_id, r1.clone(), Step::Read, always);
    let read1 = script.spawn(&runner, r1_start, r1_id, r1, Step::Read, always);

    let r2 = script.sim_client(2);
    let r2_id = r2.fabric().id();
    let r2_start = r1_start + rng.between(10 * US, 150 * US);
    let read2 = script.spawn(&runner, r2_start, r2_id, r2, Step::Read, always);
    let r3 = script.sim_client(3);
    let r3_id = r3.fabric().id();
    let read3 = script.spawn(&runner, 600 * US, r3_id, r3, Step::Read, always);

    runner.time_limit(200_000 * US);
    runner.run().expect("no fault: every operation returns");
    for (name, handle) in [
        ("A", &a),
        ("B", &b),
        ("R1", &read1),
        ("R2", &read2),
        ("R3", &read3),
    ] {
        let done = finished(handle, name);
        assert_eq!(done.error, None, "{name} failed with every node alive");
    }
    script.assert_linearizable();
}

#[test]
fn two_writes_of_one_client_on_one_register_stay_linearizable() {
    for_each_seed(400, episode);
}
