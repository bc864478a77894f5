//! Wait-freedom under the two shapes that once broke it, explored at random.
//!
//! **A write's slow path** (Lemma C.5 case (ii)). Uniformly random schedules almost
//! never crash or stall a writer exactly between its WRITE lock and its rewrite, so
//! the shape is fixed and everything else is random per seed: on three nodes,
//!
//! - writer Y, its clock ahead by 50 µs to 2 ms, writes; its batch to n1 is very
//!   slow, and Y often crashes before falling back to n2: its tuple may sit on n0
//!   only (a new-old inversion);
//! - writer X writes just after, on n0 and n1; its weak read may see Y's tuple above
//!   its guess and send it to the slow path; right after its WRITE lock it crashes,
//!   or its links become very slow (its rewrite lands late);
//! - reader R reaches n0 late (it suspects n0 after a first read and reads n1, n2),
//!   reader R2 comes later at full speed.
//!
//! Every read must return (with a live majority, a read may not give up:
//! `ReadBoundExceeded` fails the test) and the history must be linearizable. A write
//! that took its WRITE lock before a tuple above its guess was on a majority left its
//! guess the GUESSED maximum of R's majority while it could not rewrite: R failed its
//! READ lock on every iteration (scripts/mutants:
//! `safeguess-slow-path-locks-before-strong-read`).
//!
//! **A read over slow links**: a value fetch whose holders all answer slower than
//! `slow_after_ns` must wait longer on every retry, or the read livelocks
//! (`maxreg-fetch-patience-never-grows`; `tests/sim_slow_reader.rs` is one schedule).

mod support;

use std::rc::Rc;

use support::{AfterFirstLock, AfterLock, MS, Script, Step, US};
use swarm_core::NodeId;
use swarm_sim::{Fault, SimRng, SimRunner, for_each_seed};

/// Runs one slow-path episode; panics (with the seed printed) if it goes wrong.
fn slow_path_episode(seed: u64) {
    let mut rng = SimRng::new(seed);
    let script = Script::seeded(4, seed, 300);
    let mut runner = SimRunner::new(&script.world);
    let always = || true;

    let y_start = 100 * US;
    let x_start = y_start + rng.between(2 * US, 40 * US);
    let r_start = x_start + rng.between(0, 60 * US);
    let r2_start = r_start + rng.between(50 * US, 400 * US);

    let y_fabric = script.world.client();
    let y_id = y_fabric.id();
    let y_slow = rng.between(200, 20_000) as u32;
    runner.at(0, Fault::SlowLink(y_id, NodeId(1), y_slow));
    if rng.chance(0.7) {
        let crash = y_start + rng.between(US, 20 * US);
        runner.at(crash, Fault::CrashClient(y_id));
    }
    let skew = rng.between(50 * US, 2 * MS) as i64;
    let y = script.client(y_fabric, 1, skew);
    script.spawn(&runner, y_start, y_id, y, Step::Write("y"), always);

    let then = if rng.chance(0.5) {
        AfterLock::Crash
    } else {
        AfterLock::Slow(rng.between(100, 5_000) as u32)
    };
    let x_fabric = AfterFirstLock::then(&script.world, &script.layout, then);
    let x_id = x_fabric.id();
    let x_crashed = x_fabric.crashed();
    let x = script.client(x_fabric, 0, 0);
    let x_alive = move || !x_crashed.get();
    script.spawn(&runner, x_start, x_id, x, Step::Write("x"), x_alive);

    let r = Rc::new(script.sim_client(2));
    let r_id = r.fabric().id();
    runner.at(
        0,
        Fault::SlowLink(r_id, NodeId(0), rng.between(20, 2_000) as u32),
    );
    script.spawn(&runner, 0, r_id, r.clone(), Step::Read, always);
    let read = script.spawn(&runner, r_start, r_id, r, Step::Read, always);
    let r2 = script.sim_client(3);
    let r2_id = r2.fabric().id();
    let read2 = script.spawn(&runner, r2_start, r2_id, r2, Step::Read, always);

    runner.time_limit(2_000 * MS);
    runner
        .run()
        .expect("every client that did not crash finishes");
    for (name, handle) in [("R", &read), ("R2", &read2)] {
        let done = support::finished(handle, name);
        assert_eq!(done.error, None, "{name} must return with every node alive");
    }
    script.assert_linearizable();
}

#[test]
fn reads_return_while_slow_path_writers_crash_or_stall_after_their_lock() {
    for_each_seed(300, slow_path_episode);
}

/// One writer writes; the primary (the only in-place copy) crashes; a reader whose
/// links to the two other nodes are 1 to 60 times slower than normal reads.
fn slow_reader_episode(seed: u64) {
    let mut rng = SimRng::new(seed);
    let script = Script::seeded(2, seed, 300);
    let mut runner = SimRunner::new(&script.world);
    let always = || true;
    let w = script.sim_client(0);
    let w_id = w.fabric().id();
    script.spawn(&runner, 0, w_id, w, Step::Write("x"), always);
    runner.at(50 * US, Fault::Crash(NodeId(0)));
    let r = script.sim_client(1);
    let r_id = r.fabric().id();
    for node in [1, 2] {
        let factor = rng.between(1, 60) as u32;
        runner.at(50 * US, Fault::SlowLink(r_id, NodeId(node), factor));
    }
    let read = script.spawn(&runner, 100 * US, r_id, r, Step::Read, always);
    runner.time_limit(100 * MS);
    runner
        .run()
        .expect("a majority answers every request: the read returns");
    let done = support::finished(&read, "the read");
    assert_eq!(done.error, None);
    assert_eq!(done.value.as_deref(), Some("x"));
    script.assert_linearizable();
}

#[test]
fn reads_over_slow_links_return() {
    for_each_seed(100, slow_reader_episode);
}
