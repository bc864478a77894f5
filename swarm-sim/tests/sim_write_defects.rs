//! Scripted schedules of three defects of an earlier Safe-Guess WRITE (issue 10),
//! each fixed since; the tests keep them fixed. Three nodes, all alive throughout.
//!
//! * **A, wait-freedom** (Lemma C.5 case (ii)): a write whose weak read saw a tuple
//!   above its guess on one node only, and that crashed after winning the WRITE lock
//!   on its guess, left its guess the GUESSED maximum of a majority forever: a reader
//!   failed its READ lock on every iteration and gave up (`ReadBoundExceeded`). The
//!   slow path now reads strongly (writing what it found back to a majority) before
//!   it locks.
//! * **B, `Deleted` outcomes**: a write that saw a tombstone on one node only reported
//!   [`WriteOutcome::Deleted`] (a failed update) although the delete had not taken
//!   effect; a later write on another majority then succeeded. The write now puts the
//!   tombstone on a majority first.
//! * **C, one writer, two writes in flight** (appendix C Assumption 2): two writes of
//!   one writer id on one register, in flight together, let a reader return the
//!   older one's value before the newer's, and then the older again. A client now
//!   runs one write at a time per register; the other waits.

mod support;

use std::rc::Rc;

use support::{AfterFirstLock, MS, Script, Step, US, finished};
use swarm_core::{NodeId, WriteOutcome};
use swarm_sim::{Fault, SimRunner};

/// A link this many times slower than normal delivers in 100 ms: never, for a script.
const NEVER: u32 = 100_000;

#[test]
fn a_read_returns_after_a_slow_path_writer_crashes_holding_its_write_lock() {
    let script = Script::new(4);
    let mut runner = SimRunner::new(&script.world);

    // R prefers n0 and n1 but reaches n0 late: it suspects n0 and reads n1 and n2.
    let r_fabric = script.world.client();
    let r_id = r_fabric.id();
    runner.at(0, Fault::SlowLink(r_id, NodeId(0), NEVER));
    // Y's clock is 1 ms ahead; its write reaches n0 only (n1 is slow for it and it
    // crashes before falling back to n2).
    let y_fabric = script.world.client();
    let y_id = y_fabric.id();
    runner.at(0, Fault::SlowLink(y_id, NodeId(1), NEVER));
    runner.at(105 * US, Fault::CrashClient(y_id));
    // X writes on n0 and n1, finds Y's tuple above its guess on n0, takes the slow
    // path, wins the WRITE lock on its guess and crashes before its next batch.
    let x_fabric = AfterFirstLock::new(&script.world, &script.layout);
    let x_id = x_fabric.id();
    let x_crashed = x_fabric.crashed();

    let y = script.client(y_fabric, 1, MS as i64);
    let x = script.client(x_fabric, 0, 0);
    let r = script.client(r_fabric, 2, 0);
    let always = || true;
    let y_task = script.spawn(&runner, 100 * US, y_id, y, Step::Write("y"), always);
    let x_alive = {
        let crashed = x_crashed.clone();
        move || !crashed.get()
    };
    let x_task = script.spawn(&runner, 120 * US, x_id, x, Step::Write("x"), x_alive);
    let read = script.spawn(&runner, 200 * US, r_id, r, Step::Read, always);
    runner.time_limit(50 * MS);
    runner.run().expect("the script runs to its end");

    // The schedule went as scripted: Y never returned, X crashed after its lock.
    assert!(y_task.take().is_none(), "Y crashed mid-write");
    assert!(
        x_crashed.get(),
        "X took the slow path and crashed after its lock"
    );
    assert!(x_task.take().is_none(), "X crashed mid-write");
    // The property: R returns with every node alive, within the paper's bound.
    let read = finished(&read, "R");
    assert_eq!(read.error, None, "R must return with a live majority");
    assert!(read.iterations <= 2 * 4 + 1, "{read:?}");
    assert!(
        read.value.is_some(),
        "someone's write is on a majority: {read:?}"
    );
    script.assert_linearizable();
}

#[test]
fn a_write_reports_deleted_only_once_the_delete_took_effect() {
    let script = Script::new(5);
    let mut runner = SimRunner::new(&script.world);
    let always = || true;

    // W inserts `x` everywhere.
    let w = script.sim_client(0);
    let w_id = w.fabric().id();
    let insert = script.spawn(&runner, 0, w_id, w, Step::Insert("x"), always);
    // D deletes at 100 µs; its tombstone reaches n0 only (n1 and n2 are far for it),
    // and D crashes before it returns.
    let d = script.sim_client(1);
    let d_id = d.fabric().id();
    runner.at(0, Fault::SlowLink(d_id, NodeId(1), NEVER));
    runner.at(0, Fault::SlowLink(d_id, NodeId(2), NEVER));
    runner.at(150 * US, Fault::CrashClient(d_id));
    let d_task = script.spawn(&runner, 100 * US, d_id, d, Step::Delete, always);
    // U1 updates on n0 and n1 and finds the tombstone on n0.
    let u1 = script.sim_client(2);
    let u1_id = u1.fabric().id();
    let u1_task = script.spawn(&runner, 200 * US, u1_id, u1, Step::Update("u1"), always);
    // U2, later, reaches n0 late: it updates on n1 and n2.
    let u2 = script.sim_client(3);
    let u2_id = u2.fabric().id();
    runner.at(0, Fault::SlowLink(u2_id, NodeId(0), NEVER));
    let u2_task = script.spawn(&runner, 400 * US, u2_id, u2, Step::Update("u2"), always);
    runner.time_limit(50 * MS);
    runner.run().expect("the script runs to its end");

    assert_eq!(finished(&insert, "W").outcome, Some(WriteOutcome::Written));
    let u1 = finished(&u1_task, "U1");
    assert_eq!(
        u1.outcome,
        Some(WriteOutcome::Deleted),
        "U1 saw the tombstone"
    );
    assert!(d_task.take().is_none(), "D crashed mid-delete");
    let u2 = finished(&u2_task, "U2");
    assert_eq!(
        u2.outcome,
        Some(WriteOutcome::Deleted),
        "U1 reported the delete, so it must be visible to U2's majority"
    );
    script.assert_linearizable();
}

#[test]
fn two_writes_of_one_writer_in_flight_on_one_register_stay_linearizable() {
    let script = Script::new(4);
    let mut runner = SimRunner::new(&script.world);
    let always = || true;

    // Writer 0 runs A(`x`) at 100 µs and B(`y`) at 101 µs from one client: B's guess
    // is above A's. The client's links change in between, so that A reaches n1 only
    // after B did there (A's weak read sees B's tuple: A's guess was stale) and B
    // reaches n0 5 µs after A did (n0's maximum is A's tuple in between). From
    // 102 µs on, the client's links are four times slower: A's slow path takes long.
    let writer = Rc::new(script.sim_client(0));
    let w = writer.fabric().id();
    runner.at(99 * US, Fault::SlowLink(w, NodeId(1), 5));
    runner.at(100 * US + 500, Fault::SlowLink(w, NodeId(1), 1));
    runner.at(100 * US + 500, Fault::SlowLink(w, NodeId(0), 5));
    for node in 0..3 {
        runner.at(102 * US, Fault::SlowLink(w, NodeId(node), 4));
        runner.at(120 * US, Fault::SlowLink(w, NodeId(node), 8));
    }
    let a = script.spawn(
        &runner,
        100 * US,
        w,
        writer.clone(),
        Step::Write("x"),
        always,
    );
    let b = script.spawn(&runner, 101 * US, w, writer, Step::Write("y"), always);
    // R1 suspects n1 since a first read and reads n0 and n2: A's tuple, then (its
    // link to n0 slower) B's.
    let r = Rc::new(script.sim_client(1));
    let r_id = r.fabric().id();
    runner.at(0, Fault::SlowLink(r_id, NodeId(1), NEVER));
    runner.at(108 * US, Fault::SlowLink(r_id, NodeId(0), 7));
    runner.at(109 * US, Fault::SlowLink(r_id, NodeId(0), 1));
    script.spawn(&runner, 50 * US, r_id, r.clone(), Step::Read, always);
    let r1 = script.spawn(&runner, 102 * US + 500, r_id, r, Step::Read, always);
    // R2 reads B's verified tuple after R1 returned; R3 reads last. Without the
    // per-register write exclusion, R1 returns `x` by the same-writer rule (B's tuple
    // after A's), A's slow path then wins its WRITE lock and rewrites `x` above B's
    // tuple, after R2 returned `y`: R3 returns `x` again.
    let r2 = script.sim_client(2);
    let r2_id = r2.fabric().id();
    let r2 = script.spawn(&runner, 180 * US, r2_id, r2, Step::Read, always);
    let r3 = script.sim_client(3);
    let r3_id = r3.fabric().id();
    let r3 = script.spawn(&runner, 300 * US, r3_id, r3, Step::Read, always);
    runner.time_limit(50 * MS);
    runner.run().expect("no fault: every operation returns");

    let (a, b) = (finished(&a, "A"), finished(&b, "B"));
    assert!(a.error.is_none() && b.error.is_none(), "{a:?} {b:?}");
    assert!(a.end > 101 * US, "A overlapped B's invocation ({a:?})");
    for (name, read) in [("R1", &r1), ("R2", &r2), ("R3", &r3)] {
        let read = finished(read, name);
        assert!(read.error.is_none(), "{name}: {read:?}");
    }
    script.assert_linearizable();
}
