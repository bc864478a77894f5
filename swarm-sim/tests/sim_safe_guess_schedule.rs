//! One hand-built schedule on the simulated fabric that Safe-Guess survives only
//! because its reads lock what they return (SWARM §3.2 lines 14–17, Lemma C.5).
//!
//! Random schedules rarely produce it, so it is scripted here with fixed latencies
//! and a slow window on one node:
//!
//! 1. Node n2 is down from the start; the register lives on n0, n1, n2.
//! 2. Writer A writes `x` with a guessed timestamp `tA`. Its batch to n1 is sent while
//!    n1 is slow and arrives ten milliseconds later; its batch to n0 lands at once.
//! 3. Reader R1 finds `tA` on n0, writes it back to n1, reads it again, locks `tA` in
//!    READ mode and returns `x`.
//! 4. Writer B writes `y` with `tB > tA` on n0 and n1; reader R2 returns `y`.
//! 5. A's slow batch reaches n1: its read there finds `tB > tA`, so A's guess was
//!    stale. A tries to lock `tA` in WRITE mode, fails (R1 holds it), and must *not*
//!    write `x` again above `tB`.
//! 6. Reader R3 returns `y`.
//!
//! A read that returned a GUESSED tuple without reading it twice, or without locking
//! it, would let A win the lock and rewrite `x`: R3 would return `x` after R2 returned
//! `y`, which the checker rejects. The test also asserts each step went as scripted,
//! so that it cannot pass vacuously if timing changes elsewhere.

mod support;

use support::{MS, Script, Step, finished};
use swarm_core::NodeId;
use swarm_sim::{Fault, SimRunner, TaskHandle};

/// n1 is this much slower for messages sent in its slow window: ten milliseconds.
const SLOW_FACTOR: u32 = 10_000;

/// Spawns `step` by a fresh client with writer id `writer` at `start`.
fn spawn(
    script: &Script,
    runner: &SimRunner,
    writer: u16,
    start: u64,
    step: Step,
) -> TaskHandle<support::Done> {
    let client = script.sim_client(writer);
    let id = client.fabric().id();
    script.spawn(runner, start, id, client, step, || true)
}

#[test]
fn a_read_locks_the_guessed_write_it_returns_so_a_stale_writer_cannot_rewrite_it() {
    let script = Script::new(5);
    let mut runner = SimRunner::new(&script.world);
    runner.at(0, Fault::Crash(NodeId(2)));
    // Every message sent to n1 in [50 µs, 500 µs) takes ten milliseconds: only A's.
    runner.at(50_000, Fault::Slow(NodeId(1), SLOW_FACTOR));
    runner.at(500_000, Fault::Slow(NodeId(1), 1));

    let a = spawn(&script, &runner, 0, 100_000, Step::Write("x"));
    let r1 = spawn(&script, &runner, 2, MS, Step::Read);
    let b = spawn(&script, &runner, 1, 2 * MS, Step::Write("y"));
    let r2 = spawn(&script, &runner, 3, 3 * MS, Step::Read);
    let r3 = spawn(&script, &runner, 4, 20 * MS, Step::Read);
    runner.time_limit(100 * MS);
    runner
        .run()
        .expect("every operation completes with n0 and n1 alive");

    let (a, r1, b, r2, r3) = (
        finished(&a, "A"),
        finished(&r1, "R1"),
        finished(&b, "B"),
        finished(&r2, "R2"),
        finished(&r3, "R3"),
    );

    // The property: A lost the lock to R1 and did not write `x` again above `y`.
    assert_eq!(
        r3.value.as_deref(),
        Some("y"),
        "R3 must not see A's value again after R2 saw B's (A rewrote a value a reader \
         had returned)"
    );
    script.assert_linearizable();

    // The schedule went as scripted.
    assert!(
        a.end > r2.end && a.end < 20 * MS,
        "A must finish after R2 and before R3 (A ended at {} ns, R2 at {} ns)",
        a.end,
        r2.end
    );
    assert!(
        a.roundtrips >= 2,
        "A's guess must be found stale, costing a TRYLOCK roundtrip (took {} roundtrips)",
        a.roundtrips
    );
    assert_eq!(r1.value.as_deref(), Some("x"), "R1 reads A's guessed write");
    assert_eq!(
        r1.iterations, 2,
        "R1 returns a GUESSED tuple only after reading it twice"
    );
    assert!(b.end < r2.end, "B finished before R2");
    assert_eq!(r2.value.as_deref(), Some("y"), "R2 reads B's write");
}
