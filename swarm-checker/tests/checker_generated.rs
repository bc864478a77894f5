//! Generated histories: random executions of the sequential objects with random
//! overlapping intervals (linearizable by construction), the same with one read
//! corrupted (never linearizable), a brute-force cross-check on tiny arbitrary
//! histories, and scale runs shaped like the YCSB benchmark.

use std::collections::HashMap;
use std::time::Instant;

use proptest::prelude::*;
use swarm_checker::{CheckOptions, History, OpKind, Operation, Verdict, check, check_with};

/// splitmix64: small, seedable, good enough to shape test histories.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// Zipfian choice of `0..n` with exponent `s`, by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cdf = (1..=n)
            .map(|i| {
                total += 1.0 / (i as f64).powf(s);
                total
            })
            .collect();
        Self { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let total = self.cdf.last().copied().unwrap_or(0.0);
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// The shape of a generated history.
#[derive(Clone, Debug)]
struct Shape {
    ops: usize,
    keys: usize,
    clients: u64,
    /// Zipfian key choice with this exponent, uniform if `None`.
    zipf: Option<f64>,
    /// Per mille of operations whose client crashes during them.
    crash_per_mille: u64,
    /// Idle time between a client's operations: `0..max_gap` ns.
    max_gap: u64,
    /// Operation duration: `1..=max_len` ns.
    max_len: u64,
    /// Key-value keys only (`Some(true)`), registers only (`Some(false)`), or both
    /// (`None`: even keys key-value, odd keys registers).
    kv: Option<bool>,
}

fn key_name(k: usize) -> String {
    format!("key{k}")
}

/// A random concurrent execution: each client runs operations one at a time; each
/// operation takes effect at a random instant inside its interval, and the results
/// come from applying them in the order of those instants (so the history is
/// linearizable). A crashed operation takes effect (or not) and its client is
/// replaced by a new one.
fn generate(shape: &Shape, seed: u64) -> Vec<Operation> {
    let mut rng = Rng(seed);
    let zipf = shape.zipf.map(|s| Zipf::new(shape.keys, s));
    // (client id, time its next operation may start)
    let mut clients: Vec<(u64, u64)> = (0..shape.clients)
        .map(|c| (c, rng.below(shape.max_len)))
        .collect();
    let mut next_client = shape.clients;
    let mut ops = Vec::with_capacity(shape.ops);
    // (instant it takes effect, operation index) for operations that take effect
    let mut effects = Vec::with_capacity(shape.ops);
    for i in 0..shape.ops {
        let slot = (0..clients.len())
            .min_by_key(|&c| clients[c].1)
            .unwrap_or(0);
        let (client, free) = clients[slot];
        let start = free + rng.below(shape.max_gap.max(1));
        let end = start + 1 + rng.below(shape.max_len);
        let k = match &zipf {
            Some(z) => z.sample(&mut rng),
            None => rng.below(shape.keys as u64) as usize,
        };
        let roll = rng.below(100);
        let op = if shape.kv.unwrap_or(k % 2 == 0) {
            match roll {
                0..50 => OpKind::Get,
                50..80 => OpKind::Update,
                80..92 => OpKind::Insert,
                _ => OpKind::Delete,
            }
        } else if roll < 50 {
            OpKind::Read
        } else {
            OpKind::Write
        };
        let value = op.writes_value().then(|| format!("{client}.{i}"));
        let crashed = rng.chance(shape.crash_per_mille);
        let at = start + rng.below(end - start + 1);
        if !crashed || rng.chance(500) {
            effects.push((at, i));
        }
        ops.push(Operation {
            client,
            op,
            key: key_name(k),
            value,
            ok: Some(true),
            start,
            end: (!crashed).then_some(end),
        });
        clients[slot] = if crashed {
            next_client += 1;
            (next_client - 1, end)
        } else {
            (client, end)
        };
    }
    effects.sort_unstable();
    let mut state: HashMap<String, String> = HashMap::new();
    for (_, i) in effects {
        let op = &mut ops[i];
        let present = state.contains_key(&op.key);
        match op.op {
            OpKind::Read | OpKind::Get => op.value = state.get(&op.key).cloned(),
            OpKind::Write | OpKind::Insert => {
                state.insert(op.key.clone(), op.value.clone().unwrap_or_default());
            }
            OpKind::Update => {
                op.ok = Some(present);
                if present {
                    state.insert(op.key.clone(), op.value.clone().unwrap_or_default());
                }
            }
            OpKind::Delete => {
                // Some deletes do not know their outcome, as SWARM deletes that race
                // another delete of the same value.
                op.ok = (!rng.chance(100)).then_some(present);
                state.remove(&op.key);
            }
        }
    }
    ops
}

fn history(ops: &[Operation]) -> History {
    let mut h = History::new();
    for op in ops {
        h.push(op.clone()).expect("generated operations are valid");
    }
    h
}

/// Replaces the value returned by one completed read or get (chosen by `pick`) with a
/// value no operation writes; returns its key, or `None` if there is no such read.
fn corrupt_one_read(ops: &mut [Operation], pick: usize) -> Option<String> {
    let reads: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].op.is_observer() && !ops[i].is_crashed())
        .collect();
    let &i = reads.get(pick % reads.len().max(1))?;
    ops[i].value = Some("never written".into());
    Some(ops[i].key.clone())
}

fn small_shape() -> impl Strategy<Value = Shape> {
    (
        1usize..120,
        1usize..4,
        1u64..6,
        0u64..150,
        1u64..40,
        1u64..60,
    )
        .prop_map(
            |(ops, keys, clients, crash_per_mille, max_gap, max_len)| Shape {
                ops,
                keys,
                clients,
                zipf: None,
                crash_per_mille,
                max_gap,
                max_len,
                kv: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn executions_are_accepted(shape in small_shape(), seed in any::<u64>()) {
        let ops = generate(&shape, seed);
        let report = check(&history(&ops));
        prop_assert!(report.is_linearizable(), "{report}");
    }

    #[test]
    fn executions_with_a_read_of_a_value_never_written_are_rejected(
        shape in small_shape(),
        seed in any::<u64>(),
        pick in any::<usize>(),
    ) {
        let mut ops = generate(&shape, seed);
        let Some(key) = corrupt_one_read(&mut ops, pick) else { return Ok(()) };
        let report = check(&history(&ops));
        let bad: Vec<&str> = report.violations().map(|v| &*v.key).collect();
        prop_assert_eq!(bad, vec![key.as_str()], "{}", report);
    }
}

// ---- brute force ----------------------------------------------------------------

/// The sequential semantics, written independently of the checker's: the next state
/// (`None` = null/absent), or `Err` if the recorded result is impossible.
fn apply(op: &Operation, state: &Option<String>) -> Result<Option<String>, ()> {
    let present = state.is_some();
    let known = op.end.and(op.ok);
    match (op.op, known) {
        (OpKind::Read | OpKind::Get, Some(true)) if op.value == *state => Ok(state.clone()),
        (OpKind::Read | OpKind::Get, None) => Ok(state.clone()),
        (OpKind::Write | OpKind::Insert, Some(true) | None) => Ok(op.value.clone()),
        (OpKind::Update, Some(true)) if present => Ok(op.value.clone()),
        (OpKind::Update, Some(false)) if !present => Ok(None),
        (OpKind::Update, None) => Ok(if present { op.value.clone() } else { None }),
        (OpKind::Delete, Some(true)) if present => Ok(None),
        (OpKind::Delete, Some(false)) if !present => Ok(None),
        (OpKind::Delete, None) => Ok(None),
        _ => Err(()),
    }
}

/// Tries every sequence directly from the definition: next may come any operation
/// not yet placed such that no unplaced completed operation returned before it was
/// called; crashed operations may be skipped forever.
fn brute_force(ops: &[Operation], placed: &mut Vec<bool>, state: &Option<String>) -> bool {
    if ops
        .iter()
        .zip(placed.iter())
        .all(|(o, &p)| p || o.is_crashed())
    {
        return true;
    }
    for i in 0..ops.len() {
        if placed[i] {
            continue;
        }
        let blocked = ops
            .iter()
            .zip(placed.iter())
            .any(|(q, &p)| !p && q.end.is_some_and(|e| e < ops[i].start));
        if blocked {
            continue;
        }
        if let Ok(next) = apply(&ops[i], state) {
            placed[i] = true;
            let found = brute_force(ops, placed, &next);
            placed[i] = false;
            if found {
                return true;
            }
        }
    }
    false
}

fn arbitrary_op(kv: bool) -> impl Strategy<Value = Operation> {
    let kinds = if kv {
        vec![OpKind::Get, OpKind::Insert, OpKind::Update, OpKind::Delete]
    } else {
        vec![OpKind::Read, OpKind::Write]
    };
    (
        proptest::sample::select(kinds),
        0u64..4,
        proptest::option::of(prop_oneof![Just("a"), Just("b")]),
        any::<bool>(),
        0u64..20,
        proptest::option::of(0u64..8),
    )
        .prop_map(|(op, client, value, ok, start, len)| {
            let value = if op.writes_value() {
                Some(value.unwrap_or("a"))
            } else {
                value
            };
            let value = if op == OpKind::Delete { None } else { value };
            let ok = ok || op.is_observer() || matches!(op, OpKind::Write | OpKind::Insert);
            // A delete's outcome is sometimes unknown (one that raced another).
            let ok = (op != OpKind::Delete || start % 4 != 0).then_some(ok);
            Operation {
                client,
                op,
                key: "k".into(),
                value: value.map(String::from),
                ok,
                start,
                end: len.map(|l| start + l),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn agrees_with_brute_force_on_tiny_histories(
        ops in any::<bool>().prop_flat_map(|kv| proptest::collection::vec(arbitrary_op(kv), 1..10)),
    ) {
        let expected = brute_force(&ops, &mut vec![false; ops.len()], &None);
        let report = check(&history(&ops));
        prop_assert_eq!(report.is_linearizable(), expected, "{}", report);
    }
}

// ---- scale ----------------------------------------------------------------------

fn bench_like(ops: usize, keys: usize, clients: u64) -> Shape {
    Shape {
        ops,
        keys,
        clients,
        zipf: Some(0.99),
        crash_per_mille: 1,
        max_gap: 300,
        max_len: 2_000,
        kv: None,
    }
}

fn timed_check(ops: &[Operation]) -> (History, swarm_checker::Report) {
    let built = Instant::now();
    let h = history(ops);
    let build_time = built.elapsed();
    let report = check(&h);
    eprintln!("built in {:.3} s; {report}", build_time.as_secs_f64());
    (h, report)
}

#[test]
fn a_200k_operation_zipfian_history_is_accepted_and_corrupted_reads_caught() {
    let seed = 0x5eed_0001;
    let mut ops = generate(&bench_like(200_000, 20_000, 16), seed);
    let (h, report) = timed_check(&ops);
    assert!(report.is_linearizable(), "seed {seed:#x}: {report}");
    assert!(
        h.crashed_count() > 0,
        "the shape includes crashed operations"
    );
    let hot = report.keys().iter().max_by_key(|k| k.operations).unwrap();
    assert!(
        hot.operations > 5_000,
        "the hottest key is hot: {}",
        hot.operations
    );
    assert!(
        hot.cuts > 0,
        "a hot key with 16 clients still has quiescent cuts"
    );

    // A stale read late on the hottest key: it returns the key's first value, long
    // overwritten. Refuting it makes the search exhaust every configuration before it.
    let hot_key = hot.key.to_string();
    let on_hot = |o: &Operation| o.key == hot_key && !o.is_crashed();
    let first = ops
        .iter()
        .position(|o| on_hot(o) && o.op.writes_value())
        .unwrap();
    let last_read = ops
        .iter()
        .rposition(|o| on_hot(o) && o.op.is_observer())
        .unwrap();
    let (first_end, read_start) = (ops[first].end.unwrap(), ops[last_read].start);
    let overwritten = ops.iter().any(|o| {
        on_hot(o)
            && matches!(o.op, OpKind::Write | OpKind::Insert | OpKind::Update)
            && o.ok == Some(true)
            && o.value != ops[first].value
            && o.start > first_end
            && o.end.is_some_and(|e| e < read_start)
    });
    assert!(
        overwritten,
        "the first value was overwritten before the read"
    );
    let mut stale = ops.clone();
    stale[last_read].value = ops[first].value.clone();
    let (_, report) = timed_check(&stale);
    let bad: Vec<&str> = report.violations().map(|v| &*v.key).collect();
    assert_eq!(bad, [hot_key.as_str()], "seed {seed:#x}: {report}");

    // A read of a value never written: rejected without exhausting anything.
    ops[last_read].value = Some("never written".into());
    let (_, report) = timed_check(&ops);
    let bad: Vec<&str> = report.violations().map(|v| &*v.key).collect();
    assert_eq!(bad, [hot_key.as_str()], "seed {seed:#x}: {report}");
}

#[test]
fn verdicts_do_not_depend_on_the_thread_count() {
    let seed = 0x5eed_0004;
    let mut ops = generate(&bench_like(20_000, 500, 8), seed);
    let read = ops
        .iter()
        .rposition(|o| o.op.is_observer() && !o.is_crashed())
        .unwrap();
    ops[read].value = Some("never written".into());
    let h = history(&ops);
    let one = check_with(&h, &CheckOptions::new().threads(1));
    let four = check_with(&h, &CheckOptions::new().threads(4));
    assert_eq!(one.keys(), four.keys(), "seed {seed:#x}");
    assert_eq!(one.violations().count(), 1, "seed {seed:#x}: {one}");
}

/// Extreme contention (SWARM §7.8): 16 clients hammer one key with no pause, so every
/// operation overlaps some 30 others and the history is never quiescent.
#[test]
fn sixteen_clients_on_one_key() {
    for (seed, kv) in [(0x5eed_0002, true), (0x5eed_0003, false)] {
        let mut shape = bench_like(8_000, 1, 16);
        shape.max_gap = 50;
        shape.kv = Some(kv);
        shape.crash_per_mille = 2;
        let ops = generate(&shape, seed);
        let (_, report) = timed_check(&ops);
        assert!(report.is_linearizable(), "seed {seed:#x}: {report}");
        let key = &report.keys()[0];
        assert_eq!(key.cuts, 0, "no quiescent point");
        assert!(
            key.configurations < 100 * ops.len() as u64,
            "seed {seed:#x}: the search stays near-linear: {} configurations",
            key.configurations
        );
    }
}

/// The benchmark's scale: 1M operations over 100k keys, 16 clients. Run with
/// `cargo test --release -p swarm-checker --test checker_generated -- --ignored --nocapture`.
/// With `CHECKER_DUMP=path` it also writes the history as JSON Lines (to try the
/// `check-history` example on).
#[test]
#[ignore = "a minute in debug builds; run in release to measure"]
fn a_million_operations_like_the_benchmark() {
    let seed = 0x5eed_0003;
    let ops = generate(&bench_like(1_000_000, 100_000, 16), seed);
    let (h, report) = timed_check(&ops);
    assert!(report.is_linearizable(), "seed {seed:#x}: {report}");
    let single = check_with(&h, &CheckOptions::new().threads(1));
    eprintln!("single thread: {:.3} s", single.elapsed().as_secs_f64());
    assert!(matches!(single.keys()[0].verdict, Verdict::Linearizable));
    if let Some(path) = std::env::var_os("CHECKER_DUMP") {
        let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        h.write_jsonl(file).unwrap();
    }
}

/// Checks one generated history of a shape given by the environment, to explore the
/// checker's cost: `OPS`, `KEYS`, `CLIENTS`, `CRASH` (per mille), `GAP` and `LEN`
/// (ns), `KV` (0 registers, 1 key-value, 2 both), `SEED`, `BUDGET`; with `CORRUPT=1`
/// the last read of the hottest key returns a value never written, with `CORRUPT=2`
/// the key's first value (stale, if overwritten since: then the history must be
/// rejected). For example
/// `OPS=10000 KEYS=1 cargo test --release -p swarm-checker --test
/// checker_generated -- --ignored --nocapture generated_shape_from_the_environment`.
#[test]
#[ignore = "a tool for measuring, driven by environment variables"]
fn generated_shape_from_the_environment() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let shape = Shape {
        ops: env("OPS", 100_000) as usize,
        keys: env("KEYS", 10_000) as usize,
        clients: env("CLIENTS", 16),
        zipf: Some(0.99),
        crash_per_mille: env("CRASH", 1),
        max_gap: env("GAP", 300),
        max_len: env("LEN", 2_000),
        kv: match env("KV", 2) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        },
    };
    let seed = env("SEED", 1);
    let mut ops = generate(&shape, seed);
    let corrupt = env("CORRUPT", 0);
    if corrupt > 0 {
        let hot = key_name(0);
        let on_hot = |o: &Operation| o.key == hot && !o.is_crashed();
        let last = ops.iter().rposition(|o| on_hot(o) && o.op.is_observer());
        let first = ops.iter().position(|o| on_hot(o) && o.op.writes_value());
        let (last, first) = (
            last.expect("the hottest key is read"),
            first.expect("and written"),
        );
        ops[last].value = match corrupt {
            1 => Some("never written".into()),
            _ => ops[first].value.clone(),
        };
    }
    let h = history(&ops);
    let options = CheckOptions::new().budget_per_key(env("BUDGET", 50_000_000));
    let report = check_with(&h, &options);
    eprintln!("{shape:?}, seed {seed}: {report}");
    assert_eq!(
        report.is_linearizable(),
        corrupt == 0,
        "seed {seed}: {report}"
    );
}
