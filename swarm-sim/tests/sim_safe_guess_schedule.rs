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

use std::rc::Rc;

use swarm_checker::{OpKind, Recorder};
use swarm_core::encoding::WriterId;
use swarm_core::header::HEADER_SIZE;
use swarm_core::layout::Layout;
use swarm_core::{
    Client, NodeId, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas,
};
use swarm_sim::{Fault, Latency, SimClock, SimConfig, SimFabric, SimRunner, SimWorld};

const KEY: &str = "k";
/// One-way latency of every message, fixed so the script is exact.
const ONE_WAY_NS: u64 = 1_000;
/// n1 is this much slower for messages sent in its slow window: ten milliseconds.
const SLOW_FACTOR: u32 = 10_000;

/// What a scripted operation reports back to the test.
#[derive(Debug, Default, Clone)]
struct Done {
    value: Option<String>,
    roundtrips: u32,
    iterations: u32,
    end: u64,
}

struct Script {
    world: SimWorld,
    layout: Layout,
    reg: RegisterLoc,
    recorder: Rc<Recorder>,
}

impl Script {
    fn new() -> Self {
        let writers = 5;
        let shape = |log_base| {
            Layout::builder()
                .payload_max(32)
                .meta_words(2)
                .log_base(log_base)
                .writers(writers)
                .slots_per_writer(64)
                .build()
        };
        let register_bytes = shape(0).expect("valid layout").register_bytes();
        let log_base = (HEADER_SIZE + register_bytes).next_multiple_of(4096);
        let layout = shape(log_base).expect("valid layout");
        let node_bytes = (layout.log_base() + layout.log_bytes()) as usize;
        let config = SimConfig::new(3, node_bytes).latency(Latency::new(ONE_WAY_NS, 0));
        Self {
            world: SimWorld::new(7, config),
            layout,
            reg: RegisterLoc {
                addr: HEADER_SIZE,
                replicas: Replicas::all(3, 0).expect("three replicas"),
            },
            recorder: Rc::new(Recorder::new()),
        }
    }

    /// A protocol client with writer id `writer` on its own simulated connection.
    fn client(&self, writer: u16) -> Client<SimFabric, SimClock> {
        let config = ProtocolConfig::default()
            .with_slow_after_ns(10_000)
            .with_suspect_ns(100_000_000);
        Client::new(
            self.world.client(),
            SimClock::new(&self.world, 100),
            self.layout,
            WriterId::new(writer.into()).expect("valid writer id"),
            config,
        )
        .expect("client")
    }

    /// Spawns a write of `value` by a fresh client at `start`.
    fn write(
        &self,
        runner: &SimRunner,
        writer: u16,
        start: u64,
        value: &'static str,
    ) -> swarm_sim::TaskHandle<Done> {
        let client = self.client(writer);
        let (reg, recorder, world) = (self.reg.clone(), self.recorder.clone(), self.world.clone());
        runner.spawn_at(start, client.fabric().id(), async move {
            let stats = OpStats::new();
            let id = recorder.begin(writer.into(), OpKind::Write, KEY, Some(value), world.now());
            let mut cache = RegisterCache::default();
            client
                .write(&reg, &mut cache, &stats, value.as_bytes())
                .await
                .expect("a majority is alive: the write completes");
            let end = world.now();
            recorder.end(id, true, None, end).expect("recorded once");
            Done {
                value: None,
                roundtrips: stats.roundtrips(),
                iterations: stats.iterations(),
                end,
            }
        })
    }

    /// Spawns a read by a fresh client at `start`.
    fn read(&self, runner: &SimRunner, writer: u16, start: u64) -> swarm_sim::TaskHandle<Done> {
        let client = self.client(writer);
        let (reg, recorder, world) = (self.reg.clone(), self.recorder.clone(), self.world.clone());
        runner.spawn_at(start, client.fabric().id(), async move {
            let stats = OpStats::new();
            let id = recorder.begin(writer.into(), OpKind::Read, KEY, None, world.now());
            let mut cache = RegisterCache::default();
            let read = client
                .read(&reg, &mut cache, &stats)
                .await
                .expect("a majority is alive: the read completes");
            let value = match read {
                ReadValue::Value(bytes) => Some(String::from_utf8(bytes).expect("utf-8 value")),
                ReadValue::Empty | ReadValue::Deleted => None,
            };
            let end = world.now();
            recorder
                .end(id, true, value.as_deref(), end)
                .expect("recorded once");
            Done {
                value,
                roundtrips: stats.roundtrips(),
                iterations: stats.iterations(),
                end,
            }
        })
    }
}

#[test]
fn a_read_locks_the_guessed_write_it_returns_so_a_stale_writer_cannot_rewrite_it() {
    const MS: u64 = 1_000_000;
    let script = Script::new();
    let mut runner = SimRunner::new(&script.world);
    runner.at(0, Fault::Crash(NodeId(2)));
    // Every message sent to n1 in [50 µs, 500 µs) takes ten milliseconds: only A's.
    runner.at(50_000, Fault::Slow(NodeId(1), SLOW_FACTOR));
    runner.at(500_000, Fault::Slow(NodeId(1), 1));

    let a = script.write(&runner, 0, 100_000, "x");
    let r1 = script.read(&runner, 2, MS);
    let b = script.write(&runner, 1, 2 * MS, "y");
    let r2 = script.read(&runner, 3, 3 * MS);
    let r3 = script.read(&runner, 4, 20 * MS);
    runner.time_limit(100 * MS);
    runner
        .run()
        .expect("every operation completes with n0 and n1 alive");

    let take = |h: &swarm_sim::TaskHandle<Done>, what: &str| {
        h.take().unwrap_or_else(|| panic!("{what} did not finish"))
    };
    let (a, r1, b, r2, r3) = (
        take(&a, "A"),
        take(&r1, "R1"),
        take(&b, "B"),
        take(&r2, "R2"),
        take(&r3, "R3"),
    );

    // The property: A lost the lock to R1 and did not write `x` again above `y`.
    assert_eq!(
        r3.value.as_deref(),
        Some("y"),
        "R3 must not see A's value again after R2 saw B's (A rewrote a value a reader \
         had returned)"
    );
    let history = script.recorder.history().expect("well-formed history");
    let report = swarm_checker::check(&history);
    assert!(report.is_linearizable(), "not linearizable:\n{report}");

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
