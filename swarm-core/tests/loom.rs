//! `loom` models of SWARM's word-level concurrency: the order of a batch's operations
//! (`swarm_core::words`, In-n-Out §4.3), MAX by CAS (§4.4) and the
//! timestamp lock's exclusion (§3.3, Theorem B.2), running the real protocol code on
//! the in-process fabric, whose words are loom atomics when built with `--cfg loom`.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p swarm-core --release --test loom`
//! (a target directory of its own, so that the cfg does not rebuild the normal one).
#![cfg(loom)]

use loom::thread;
use swarm_core::FixedClock;
use swarm_core::MemCluster;
use swarm_core::encoding::{Flag, LockMode, Timestamp, Tsp, WriterId};
use swarm_core::layout::Layout;
use swarm_core::max_on_node;
use swarm_core::{
    Batch, Client, Fabric, NodeId, OpStats, ProtocolConfig, RegisterLoc, Replicas, block_on,
};

fn tsp(ticks: u64, writer: u32) -> Tsp {
    Tsp::new(
        Timestamp::new(ticks, WriterId::new(writer).unwrap()).unwrap(),
        Flag::Guessed,
    )
}

fn word(cluster: &MemCluster, node: u16, addr: u64) -> u64 {
    let f = cluster.client();
    let t = f.post(NodeId(node), Batch::read(addr, 8));
    let std::task::Poll::Ready(Ok(c)) = f.poll(t) else {
        panic!("in-process reads complete at once")
    };
    u64::from_le_bytes(c.read(0).unwrap().try_into().unwrap())
}

#[test]
fn max_by_cas_ends_at_the_maximum_and_never_returns_early() {
    loom::model(|| {
        let cluster = MemCluster::new(1, 64);
        // Three writers MAX into one word, each starting from a stale expected value.
        let values = [tsp(3, 0), tsp(7, 1), tsp(5, 2)];
        let handles: Vec<_> = values
            .into_iter()
            .map(|v| {
                let cluster = cluster.clone();
                thread::spawn(move || {
                    let f = cluster.client();
                    let stats = OpStats::new();
                    let now =
                        block_on(&f, max_on_node(&f, &stats, NodeId(0), 8, Tsp::EMPTY, v)).unwrap();
                    assert!(now >= v, "MAX returned {now} below its value {v}");
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(Tsp::from_word(word(&cluster, 0, 8)), tsp(7, 1));
    });
}

#[test]
fn trylock_read_and_write_never_both_succeed() {
    loom::model(|| {
        let layout = Layout::builder()
            .payload_max(8)
            .meta_words(1)
            .log_base(1024)
            .writers(2)
            .slots_per_writer(4)
            .build()
            .unwrap();
        let cluster = MemCluster::new(3, 4096);
        let owner = WriterId::new(1).unwrap();
        let ts = Timestamp::new(42, owner).unwrap();
        let reg = RegisterLoc::at(0, Replicas::all(3, 0).unwrap());
        let lock = |mode: LockMode, writer: u32| {
            let cluster = cluster.clone();
            let reg = reg.clone();
            thread::spawn(move || {
                let client = Client::new(
                    cluster.client(),
                    FixedClock(1),
                    layout,
                    WriterId::new(writer).unwrap(),
                    ProtocolConfig::default(),
                )
                .unwrap();
                let stats = OpStats::new();
                block_on(client.fabric(), client.trylock(&reg, &stats, ts, mode)).unwrap()
            })
        };
        let reader = lock(LockMode::Read, 0);
        let writer = lock(LockMode::Write, 1);
        let (r, w) = (reader.join().unwrap(), writer.join().unwrap());
        assert!(
            !(r && w),
            "TRYLOCK(ts, READ) and TRYLOCK(ts, WRITE) both returned true"
        );
    });
}

#[test]
fn trylock_without_conflict_succeeds() {
    loom::model(|| {
        let layout = Layout::builder()
            .payload_max(8)
            .meta_words(1)
            .log_base(1024)
            .writers(2)
            .slots_per_writer(4)
            .build()
            .unwrap();
        let cluster = MemCluster::new(3, 4096);
        let reg = RegisterLoc::at(0, Replicas::all(3, 0).unwrap());
        let ts = Timestamp::new(9, WriterId::new(0).unwrap()).unwrap();
        let readers: Vec<_> = (0..2)
            .map(|w| {
                let (cluster, reg) = (cluster.clone(), reg.clone());
                thread::spawn(move || {
                    let client = Client::new(
                        cluster.client(),
                        FixedClock(1),
                        layout,
                        WriterId::new(w).unwrap(),
                        ProtocolConfig::default(),
                    )
                    .unwrap();
                    let stats = OpStats::new();
                    block_on(
                        client.fabric(),
                        client.trylock(&reg, &stats, ts, LockMode::Read),
                    )
                    .unwrap()
                })
            })
            .collect();
        // Two readers of the same timestamp never conflict (True safety, Theorem B.1).
        for r in readers {
            assert!(r.join().unwrap());
        }
    });
}

/// In-n-Out's write batch (§4.3): a buffer write, then the metadata CAS. A reader that
/// sees the CAS's value in one operation finds the whole buffer in its next one, in
/// every interleaving (`swarm_core::words`' fences), and a partial-word write never
/// clobbers the bytes around it.
#[test]
fn a_reader_that_sees_the_cas_of_a_batch_sees_the_writes_before_it() {
    use swarm_core::Op;
    use swarm_core::words::{self, AtomicU64};

    loom::model(|| {
        let memory: std::sync::Arc<Vec<AtomicU64>> =
            std::sync::Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let writer = {
            let memory = memory.clone();
            thread::spawn(move || {
                let mut batch = Batch::new();
                // Bytes 9..23: partial words at both ends.
                batch
                    .push(Op::Write {
                        addr: 9,
                        data: vec![0xAB; 14].into(),
                    })
                    .unwrap()
                    .push(Op::Cas {
                        addr: 0,
                        expected: 0,
                        new: 1,
                    })
                    .unwrap();
                words::execute(&memory, &batch);
            })
        };
        let mut meta = [0u8; 8];
        words::read(&memory, 0, &mut meta);
        if u64::from_le_bytes(meta) == 1 {
            let mut buffer = [0u8; 16];
            words::read(&memory, 8, &mut buffer);
            assert_eq!(buffer[0], 0, "byte 8 is outside the write");
            assert_eq!(&buffer[1..15], &[0xAB; 14], "saw the CAS, not the buffer");
            assert_eq!(buffer[15], 0, "byte 23 is outside the write");
        }
        writer.join().unwrap();
    });
}

/// Batch order holds across a thread's successive batches too: a writer that writes
/// a buffer in one batch and CASes the metadata word in the next, and a reader that
/// reads the word in one batch and the buffer in the next.
#[test]
fn batch_order_holds_across_a_threads_successive_batches() {
    use swarm_core::words::{self, AtomicU64};

    loom::model(|| {
        let memory: std::sync::Arc<Vec<AtomicU64>> =
            std::sync::Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
        let writer = {
            let memory = memory.clone();
            thread::spawn(move || {
                words::execute(&memory, &Batch::write(3, b"out-of-place buf".to_vec()));
                words::execute(&memory, &Batch::cas(24, 0, 1));
            })
        };
        let meta = words::execute(&memory, &Batch::read(24, 8));
        let buffer = words::execute(&memory, &Batch::read(3, 16));
        if meta.read(0) == Some(&1u64.to_le_bytes()[..]) {
            assert_eq!(buffer.read(0), Some(&b"out-of-place buf"[..]));
        }
        writer.join().unwrap();
    });
}

/// Writes of neighbouring bytes of one word merge their bytes (a CAS loop), so two
/// concurrent partial writes and an earlier CAS of the same word all survive.
#[test]
fn concurrent_writes_of_neighbouring_bytes_and_a_cas_all_survive() {
    use swarm_core::words::{self, AtomicU64};

    loom::model(|| {
        let memory: std::sync::Arc<Vec<AtomicU64>> = std::sync::Arc::new(vec![AtomicU64::new(0)]);
        words::cas(
            &memory,
            0,
            0,
            u64::from_le_bytes([0, 0, 0, 0, 0, 0, 0, 0xCC]),
        );
        let low = {
            let memory = memory.clone();
            thread::spawn(move || words::write(&memory, 0, &[0xAA; 3]))
        };
        words::write(&memory, 3, &[0xBB; 4]);
        low.join().unwrap();
        let mut out = [0u8; 8];
        words::read(&memory, 0, &mut out);
        assert_eq!(out, [0xAA, 0xAA, 0xAA, 0xBB, 0xBB, 0xBB, 0xBB, 0xCC]);
    });
}

/// A partial write concurrent with a CAS of another byte of the same word neither
/// loses its bytes nor undoes the CAS.
#[test]
fn a_partial_write_never_undoes_a_concurrent_cas() {
    use swarm_core::words::{self, AtomicU64};

    loom::model(|| {
        let memory: std::sync::Arc<Vec<AtomicU64>> = std::sync::Arc::new(vec![AtomicU64::new(0)]);
        let cas = {
            let memory = memory.clone();
            thread::spawn(move || words::cas(&memory, 0, 0, 0xCC << 56))
        };
        words::write(&memory, 0, &[0xAA; 3]);
        let found = cas.join().unwrap();
        let mut out = [0u8; 8];
        words::read(&memory, 0, &mut out);
        assert_eq!(&out[..3], &[0xAA; 3], "the write was lost");
        if found == 0 {
            assert_eq!(out[7], 0xCC, "the write undid the CAS");
        }
    });
}

/// A recycled log slot (SWARM §4.5): the slot's lock word still holds a lock of an
/// earlier write of the slot, a stale reader's `TRYLOCK(ts_old, READ)` (an
/// operation that observed the superseded write `ts_old`) races the new write's
/// `TRYLOCK(ts_new, WRITE)` and a fresh reader's `TRYLOCK(ts_new, READ)` on that
/// word. Lock words carry the whole timestamp and `ts_new > ts_old` (timestamps of
/// one writer only grow), so the stale lock is climbed over, never taken for
/// `ts_new`'s: the write and the fresh reader still exclude each other, and a
/// majority of words ends at `ts_new` or above (`swarm_core::protocol::tslock`).
#[test]
fn a_stale_trylock_on_a_recycled_slot_never_locks_the_new_write() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        // One slot per writer: every timestamp of writer 1 uses the same slot.
        let layout = Layout::builder()
            .payload_max(8)
            .meta_words(1)
            .log_base(1024)
            .writers(2)
            .slots_per_writer(1)
            .build()
            .unwrap();
        let cluster = MemCluster::new(3, 4096);
        let owner = WriterId::new(1).unwrap();
        let at = |ticks| Timestamp::new(ticks, owner).unwrap();
        let (ts_prev, ts_old, ts_new) = (at(10), at(20), at(30));
        let slot = layout.buffer_addr(ts_new).unwrap();
        assert_eq!(Some(slot), layout.buffer_addr(ts_old), "one recycled slot");
        // The slot's earlier life left a READ lock of `ts_prev` on every node.
        let prev = swarm_core::encoding::LockWord::new(ts_prev, LockMode::Read).word();
        for node in 0..3 {
            let f = cluster.client();
            let t = f.post(NodeId(node), Batch::cas(slot, 0, prev));
            assert!(f.poll(t).is_ready());
        }
        let reg = RegisterLoc::at(0, Replicas::all(3, 0).unwrap());
        let lock = |ts: Timestamp, mode: LockMode, writer: u32| {
            let cluster = cluster.clone();
            let reg = reg.clone();
            thread::spawn(move || {
                let client = Client::new(
                    cluster.client(),
                    FixedClock(1),
                    layout,
                    WriterId::new(writer).unwrap(),
                    ProtocolConfig::default(),
                )
                .unwrap();
                let stats = OpStats::new();
                block_on(client.fabric(), client.trylock(&reg, &stats, ts, mode)).unwrap()
            })
        };
        let stale = lock(ts_old, LockMode::Read, 0);
        let fresh = lock(ts_new, LockMode::Read, 0);
        let write = lock(ts_new, LockMode::Write, 1);
        let _ = stale.join().unwrap();
        let (r, w) = (fresh.join().unwrap(), write.join().unwrap());
        assert!(
            !(r && w),
            "TRYLOCK(ts_new, READ) and TRYLOCK(ts_new, WRITE) both returned true"
        );
        let at_new = (0..3)
            .map(|node| swarm_core::encoding::LockWord::from_word(word(&cluster, node, slot)))
            .filter(|l| l.ts() >= Some(ts_new))
            .count();
        assert!(at_new >= 2, "a majority of lock words reached ts_new");
    });
}

/// The same recycled slot without a fresh reader: the new write's
/// `TRYLOCK(ts_new, WRITE)` always succeeds, whenever the stale `TRYLOCK(ts_old,
/// READ)` lands (a lock of an older timestamp never costs the write its lock).
#[test]
fn a_stale_trylock_on_a_recycled_slot_never_fails_the_new_write() {
    loom::model(|| {
        let layout = Layout::builder()
            .payload_max(8)
            .meta_words(1)
            .log_base(1024)
            .writers(2)
            .slots_per_writer(1)
            .build()
            .unwrap();
        let cluster = MemCluster::new(3, 4096);
        let owner = WriterId::new(1).unwrap();
        let at = |ticks| Timestamp::new(ticks, owner).unwrap();
        let (ts_prev, ts_old, ts_new) = (at(10), at(20), at(30));
        let slot = layout.buffer_addr(ts_new).unwrap();
        let prev = swarm_core::encoding::LockWord::new(ts_prev, LockMode::Write).word();
        for node in 0..3 {
            let f = cluster.client();
            let t = f.post(NodeId(node), Batch::cas(slot, 0, prev));
            assert!(f.poll(t).is_ready());
        }
        let reg = RegisterLoc::at(0, Replicas::all(3, 0).unwrap());
        let lock = |ts: Timestamp, mode: LockMode, writer: u32| {
            let cluster = cluster.clone();
            let reg = reg.clone();
            thread::spawn(move || {
                let client = Client::new(
                    cluster.client(),
                    FixedClock(1),
                    layout,
                    WriterId::new(writer).unwrap(),
                    ProtocolConfig::default(),
                )
                .unwrap();
                let stats = OpStats::new();
                block_on(client.fabric(), client.trylock(&reg, &stats, ts, mode)).unwrap()
            })
        };
        let stale = lock(ts_old, LockMode::Read, 0);
        let write = lock(ts_new, LockMode::Write, 1);
        let _ = stale.join().unwrap();
        assert!(
            write.join().unwrap(),
            "a stale lock of an older timestamp failed the new write's lock"
        );
        let at_new = (0..3)
            .map(|node| swarm_core::encoding::LockWord::from_word(word(&cluster, node, slot)))
            .filter(|l| *l == swarm_core::encoding::LockWord::new(ts_new, LockMode::Write))
            .count();
        assert!(at_new >= 2, "a majority of lock words hold (ts_new, WRITE)");
    });
}
