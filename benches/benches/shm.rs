//! Shared-memory transport micro-benchmarks: what one fabric operation costs on
//! emulated CXL memory, next to the physical floor.
//!
//! Groups `read`, `write` (8 B, 64 B, 1 KiB) and `cas` (8 B), each with four
//! variants, from the floor up:
//!
//! - `floor`: the same work on private memory — `copy_from_slice` between two
//!   private buffers, or an `AtomicU64::compare_exchange` on a private word;
//! - `node`: `NodeMemory` directly on the mapped file, no fabric: word-wise atomic
//!   copies, bounds checks and the ordering fence (reads copy into a reused buffer);
//! - `post-poll`: `ShmFabric::post` + `poll` of a one-operation batch, bypassing the
//!   executor: adds building the batch (an owned `Vec` for a write), the output
//!   `Vec` of a read, and ticket bookkeeping;
//! - `roundtrip`: what protocol code pays: `block_on` + `Roundtrip` (count, post,
//!   quorum wait of 1) around the same batch.
//!
//! One memory node, no emulated latency (rtt 0). The ratio of each variant to
//! `floor` is the transport's overhead.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use swarm_benches::ShmFixture;
use swarm_core::header::HEADER_SIZE;
use swarm_core::{Batch, Completion, Fabric, NodeId, OpStats, Roundtrip, block_on_future};
use swarm_shm::ShmFabric;

const NODE: NodeId = NodeId(0);
/// Start of the node's data, page aligned.
const DATA: u64 = HEADER_SIZE;
const SIZES: [usize; 3] = [8, 64, 1024];

fn fixture() -> ShmFixture {
    ShmFixture::new(1, HEADER_SIZE + 64 * 1024).expect("benchmark cluster")
}

/// `post` + `poll` of one batch; the shm fabric completes it inside `post`.
fn post_poll(fabric: &ShmFabric, batch: Batch) -> Completion {
    let ticket = fabric.post(NODE, batch);
    match fabric.poll(ticket) {
        Poll::Ready(Ok(completion)) => completion,
        other => panic!("a batch on a live node did not complete at once: {other:?}"),
    }
}

/// One protocol roundtrip of `batch` to one node, as protocol code runs it.
fn roundtrip(fabric: &ShmFabric, batch: Batch) -> Completion {
    let stats = OpStats::new();
    block_on_future(fabric, async {
        let mut rt = Roundtrip::start(fabric, &stats);
        rt.post(NODE, batch).expect("post");
        rt.wait(1).await.expect("a live node answers");
        std::mem::take(&mut rt.replies_mut()[0].1)
    })
    .expect("no stall")
}

fn read(c: &mut Criterion) {
    let fixture = fixture();
    let node = fixture.cluster.node(NODE).expect("node 0");
    let fabric = fixture.cluster.client();
    let mut group = c.benchmark_group("read");
    for size in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let private = vec![0xA5u8; size];
        let mut out = vec![0u8; size];
        group.bench_function(BenchmarkId::new("floor", size), |b| {
            b.iter(|| {
                out.copy_from_slice(black_box(&private));
                black_box(&mut out);
            })
        });
        group.bench_function(BenchmarkId::new("node", size), |b| {
            b.iter(|| {
                node.read(black_box(DATA), &mut out).expect("in bounds");
                black_box(&mut out);
            })
        });
        group.bench_function(BenchmarkId::new("post-poll", size), |b| {
            b.iter(|| post_poll(&fabric, Batch::read(black_box(DATA), size as u32)))
        });
        group.bench_function(BenchmarkId::new("roundtrip", size), |b| {
            b.iter(|| roundtrip(&fabric, Batch::read(black_box(DATA), size as u32)))
        });
    }
    group.finish();
}

fn write(c: &mut Criterion) {
    let fixture = fixture();
    let node = fixture.cluster.node(NODE).expect("node 0");
    let fabric = fixture.cluster.client();
    let mut group = c.benchmark_group("write");
    for size in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let data = vec![0x5Au8; size];
        let mut private = vec![0u8; size];
        group.bench_function(BenchmarkId::new("floor", size), |b| {
            b.iter(|| {
                private.copy_from_slice(black_box(&data));
                black_box(&mut private);
            })
        });
        group.bench_function(BenchmarkId::new("node", size), |b| {
            b.iter(|| {
                node.write(black_box(DATA), black_box(&data))
                    .expect("in bounds")
            })
        });
        // A batch owns its bytes, so every write pays for copying them into a `Vec`.
        group.bench_function(BenchmarkId::new("post-poll", size), |b| {
            b.iter(|| post_poll(&fabric, Batch::write(black_box(DATA), data.clone())))
        });
        group.bench_function(BenchmarkId::new("roundtrip", size), |b| {
            b.iter(|| roundtrip(&fabric, Batch::write(black_box(DATA), data.clone())))
        });
    }
    group.finish();
}

fn cas(c: &mut Criterion) {
    let fixture = fixture();
    let node = fixture.cluster.node(NODE).expect("node 0");
    let fabric = fixture.cluster.client();
    let mut group = c.benchmark_group("cas");
    group.throughput(Throughput::Bytes(8));
    // Every CAS must succeed: each iteration expects the value the previous one
    // stored and checks that it found it (the same cheap check in every variant).
    let private = AtomicU64::new(0);
    let mut word = SuccessfulCas::default();
    group.bench_function(BenchmarkId::new("floor", 8), |b| {
        b.iter(|| {
            let (expected, new) = word.next();
            let found = match private.compare_exchange(
                black_box(expected),
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(previous) | Err(previous) => previous,
            };
            word.check(found);
        })
    });
    let mut word = SuccessfulCas::default();
    group.bench_function(BenchmarkId::new("node", 8), |b| {
        b.iter(|| {
            let (expected, new) = word.next();
            word.check(node.cas(black_box(DATA), expected, new).expect("in bounds"));
        })
    });
    group.bench_function(BenchmarkId::new("post-poll", 8), |b| {
        b.iter(|| {
            let (expected, new) = word.next();
            let completion = post_poll(&fabric, Batch::cas(black_box(DATA), expected, new));
            word.check(completion.cas(0).expect("cas output"));
        })
    });
    group.bench_function(BenchmarkId::new("roundtrip", 8), |b| {
        b.iter(|| {
            let (expected, new) = word.next();
            let completion = roundtrip(&fabric, Batch::cas(black_box(DATA), expected, new));
            word.check(completion.cas(0).expect("cas output"));
        })
    });
    group.finish();
}

/// The value of a word that only successful increments by CAS ever change.
#[derive(Default)]
struct SuccessfulCas {
    value: u64,
}

impl SuccessfulCas {
    /// The `(expected, new)` pair of the next increment.
    fn next(&self) -> (u64, u64) {
        (self.value, self.value + 1)
    }

    /// Records the value the CAS found; it must be the expected one.
    fn check(&mut self, found: u64) {
        assert_eq!(
            found, self.value,
            "a CAS failed: the benchmark would measure failures"
        );
        self.value += 1;
    }
}

criterion_group!(benches, read, write, cas);
criterion_main!(benches);
