//! Recording SWARM-KV operations for the linearizability checker, shared by the KV
//! integration tests that run concurrent clients.

#![allow(dead_code)]

use std::time::Instant;

use swarm_checker::{History, OpKind, Operation};
use swarm_core::{Clock, Fabric, OpStats, block_on};
use swarm_kv::KvClient;

/// Runs one operation of `kind` on `key` (an insert or update writes `value`) with
/// client `c` of thread `thread`, and returns it as the checker records it, with
/// start and end times measured from `origin`. Panics on an error: these tests run
/// without faults.
pub fn run_recorded<F: Fabric, C: Clock>(
    c: &KvClient<F, C>,
    thread: u64,
    kind: OpKind,
    key: String,
    value: String,
    origin: Instant,
) -> Operation {
    let f = c.fabric();
    let s = OpStats::new();
    let start = origin.elapsed().as_nanos() as u64;
    let (ok, value) = match kind {
        OpKind::Get => {
            let v = block_on(f, c.get(key.as_bytes(), &s)).unwrap();
            (Some(true), v.map(|v| String::from_utf8(v).unwrap()))
        }
        OpKind::Update => (
            Some(block_on(f, c.update(key.as_bytes(), value.as_bytes(), &s)).unwrap()),
            Some(value),
        ),
        OpKind::Insert => {
            block_on(f, c.insert(key.as_bytes(), value.as_bytes(), &s)).unwrap();
            (Some(true), Some(value))
        }
        // A delete that raced another reports neither answer (an unknown outcome).
        OpKind::Delete => (
            block_on(f, c.delete(key.as_bytes(), &s)).unwrap().removed(),
            None,
        ),
        other => panic!("{other:?} is not a key-value operation"),
    };
    let end = origin.elapsed().as_nanos() as u64;
    match ok {
        Some(ok) => Operation::completed(thread, kind, key, value.as_deref(), ok, start, end),
        None => Operation::completed_unknown(thread, kind, key, value.as_deref(), start, end),
    }
}

/// Runs `threads` threads of `body(thread, origin, ops)` at once, each pushing the
/// operations it ran (`run_recorded`, timed from `origin`) to `ops`, then checks the
/// history of all of them for linearizability. Returns what each thread returned,
/// in thread order.
pub fn run_checked_threads<R: Send>(
    threads: u64,
    body: impl Fn(u64, Instant, &mut Vec<Operation>) -> R + Sync,
) -> Vec<R> {
    let origin = Instant::now();
    let (results, ops): (Vec<R>, Vec<Vec<Operation>>) = std::thread::scope(|scope| {
        let body = &body;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut ops = Vec::new();
                    let result = body(t, origin, &mut ops);
                    (result, ops)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).unzip()
    });
    let mut history = History::new();
    for op in ops.into_iter().flatten() {
        history.push(op).unwrap();
    }
    let report = swarm_checker::check(&history);
    assert!(report.is_linearizable(), "{report}");
    results
}

/// A 64-bit linear congruential generator: the tests' cheap, seedable choice of
/// keys and operations (use the high bits).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }
}
