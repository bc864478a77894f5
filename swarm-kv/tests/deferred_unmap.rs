//! Deletes that return at their tombstone (`KvConfig::deferred_unmaps`, SWARM §5.3.2):
//! one roundtrip, the index unmap run afterwards; what readers, re-inserts, a full
//! queue and `close` see meanwhile; and concurrent histories with unmaps left
//! waiting for many operations, checked for linearizability.

use swarm_checker::OpKind;
use swarm_core::{OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::SystemClock;
use swarm_kv::{DeleteOutcome, KvClient, KvConfig, ShmStore};
use swarm_shm::{EmulatedFabric, ScratchDir};

mod history_support;
use history_support::{Lcg, run_checked_threads, run_recorded};

type Client = KvClient<EmulatedFabric, SystemClock>;

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 16,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

/// A client whose deletes may leave `deferred` unmaps waiting.
fn client(store: &ShmStore, deferred: usize) -> Client {
    store
        .client_with(KvConfig {
            deferred_unmaps: deferred,
            ..store.config()
        })
        .expect("client")
}

/// The register the index maps `key` to, asked by `c`.
fn mapped(c: &Client, key: &[u8]) -> Option<u64> {
    block_on(
        c.fabric(),
        c.index().resolve(c.fabric(), &OpStats::new(), key),
    )
    .unwrap()
}

#[test]
fn a_deferred_delete_takes_one_roundtrip_and_its_unmap_runs_later() {
    let dir = ScratchDir::new("kv-deferred").unwrap();
    let store = store(&dir);
    let a = client(&store, 4);
    let b = client(&store, 0);
    let f = a.fabric();
    block_on(f, a.insert(b"k", b"v", &OpStats::new())).unwrap();
    let register = mapped(&a, b"k").expect("mapped");

    let s = OpStats::new();
    assert_eq!(
        block_on(f, a.delete(b"k", &s)).unwrap(),
        DeleteOutcome::Removed
    );
    assert_eq!(
        s.roundtrips(),
        1,
        "a cached delete returns at its tombstone"
    );
    assert!(a.has_deferred_unmaps());
    assert_eq!(
        mapped(&a, b"k"),
        Some(register),
        "the mapping stays until the unmap"
    );
    // The mapping to the tombstone reads as absent, through the cache or the index.
    assert_eq!(block_on(f, a.get(b"k", &OpStats::new())).unwrap(), None);
    assert_eq!(
        block_on(b.fabric(), b.get(b"k", &OpStats::new())).unwrap(),
        None
    );
    assert!(!block_on(b.fabric(), b.update(b"k", b"late", &OpStats::new())).unwrap());
    assert_eq!(
        block_on(f, a.delete(b"k", &OpStats::new())).unwrap(),
        DeleteOutcome::Absent
    );
    assert_eq!(a.recycle_stats().retired, 0, "retired only once unmapped");

    assert_eq!(block_on(f, a.run_deferred_unmaps()).unwrap(), 1);
    let stats = a.deferred_unmap_stats();
    assert_eq!((stats.waiting, stats.ran, stats.unmapped), (0, 1, 1));
    assert!(stats.roundtrips >= 1, "{stats:?}");
    assert_eq!(mapped(&a, b"k"), None);
    assert_eq!(
        a.recycle_stats().retired,
        1,
        "the unmapper retires the register"
    );
    assert_eq!(block_on(f, a.run_deferred_unmaps()).unwrap(), 0);
    a.close();
    b.close();
}

#[test]
fn a_reinsert_before_the_unmap_keeps_its_mapping_and_the_register_is_retired_once() {
    let dir = ScratchDir::new("kv-deferred-reinsert").unwrap();
    let store = store(&dir);
    let a = client(&store, 4);
    let b = client(&store, 0);
    let (fa, fb) = (a.fabric(), b.fabric());
    for (key, reinserter) in [(&b"mine"[..], &a), (&b"theirs"[..], &b)] {
        block_on(fa, a.insert(key, b"v1", &OpStats::new())).unwrap();
        assert_eq!(
            block_on(fa, a.delete(key, &OpStats::new())).unwrap(),
            DeleteOutcome::Removed
        );
        block_on(
            reinserter.fabric(),
            reinserter.insert(key, b"v2", &OpStats::new()),
        )
        .unwrap();
    }
    let fresh = (mapped(&a, b"mine"), mapped(&a, b"theirs"));
    assert_eq!(block_on(fa, a.run_deferred_unmaps()).unwrap(), 2);
    let stats = a.deferred_unmap_stats();
    assert_eq!(
        (stats.ran, stats.unmapped),
        (2, 0),
        "the re-inserts unmapped the tombstoned registers first"
    );
    assert_eq!((mapped(&a, b"mine"), mapped(&a, b"theirs")), fresh);
    for key in [&b"mine"[..], b"theirs"] {
        assert_eq!(
            block_on(fb, b.get(key, &OpStats::new())).unwrap(),
            Some(b"v2".to_vec())
        );
        assert_eq!(
            block_on(fa, a.get(key, &OpStats::new())).unwrap(),
            Some(b"v2".to_vec())
        );
    }
    // Each tombstoned register was retired once, by its re-inserter.
    assert_eq!(a.recycle_stats().retired, 1);
    assert_eq!(b.recycle_stats().retired, 1);
    a.close();
    b.close();
}

#[test]
fn a_delete_that_finds_the_queue_full_unmaps_before_it_returns() {
    let dir = ScratchDir::new("kv-deferred-full").unwrap();
    let store = store(&dir);
    let a = client(&store, 1);
    let f = a.fabric();
    for key in [b"k1", b"k2"] {
        block_on(f, a.insert(key, b"v", &OpStats::new())).unwrap();
    }
    let first = OpStats::new();
    assert_eq!(
        block_on(f, a.delete(b"k1", &first)).unwrap(),
        DeleteOutcome::Removed
    );
    let second = OpStats::new();
    assert_eq!(
        block_on(f, a.delete(b"k2", &second)).unwrap(),
        DeleteOutcome::Removed
    );
    assert_eq!(first.roundtrips(), 1);
    assert!(second.roundtrips() > 1, "the full queue's delete unmapped");
    assert!(mapped(&a, b"k1").is_some());
    assert_eq!(mapped(&a, b"k2"), None);
    let stats = a.deferred_unmap_stats();
    assert_eq!((stats.waiting, stats.overflowed), (1, 1));
    a.close();
}

#[test]
fn close_runs_the_unmaps_left() {
    let dir = ScratchDir::new("kv-deferred-close").unwrap();
    let store = store(&dir);
    let a = client(&store, 8);
    let f = a.fabric();
    for key in [b"k1", b"k2", b"k3"] {
        block_on(f, a.insert(key, b"v", &OpStats::new())).unwrap();
        assert_eq!(
            block_on(f, a.delete(key, &OpStats::new())).unwrap(),
            DeleteOutcome::Removed
        );
    }
    assert_eq!(a.deferred_unmap_stats().waiting, 3);
    a.close();
    let b = client(&store, 0);
    for key in [b"k1", b"k2", b"k3"] {
        assert_eq!(mapped(&b, key), None, "close unmapped {key:?}");
    }
    b.close();
}

/// Six threads on five keys, deletes deferred; each thread runs its waiting unmaps
/// only now and then (after a pseudo-random number of its operations), so mappings
/// to tombstones live across many operations of every client.
#[test]
fn concurrent_clients_with_unmaps_left_waiting_are_linearizable() {
    let dir = ScratchDir::new("kv-deferred-conc").unwrap();
    let store = store(&dir);
    let deferred: u64 = run_checked_threads(6, |t, origin, ops| {
        let c = client(&store, 3);
        let f = c.fabric();
        let mut rng = Lcg(t * 11 + 5);
        for i in 0..300u64 {
            let x = rng.next();
            if (x >> 40).is_multiple_of(7) {
                block_on(f, c.run_deferred_unmaps()).unwrap();
            }
            let key = format!("k{}", (x >> 33) % 5);
            let value = format!("t{t}-{i}");
            let kind = match (x >> 20) % 10 {
                0..=2 => OpKind::Get,
                3..=4 => OpKind::Update,
                5..=6 => OpKind::Insert,
                _ => OpKind::Delete,
            };
            ops.push(run_recorded(&c, t, kind, key, value, origin));
        }
        let stats = c.deferred_unmap_stats();
        c.close();
        stats.ran
    })
    .into_iter()
    .sum();
    assert!(deferred > 0, "some unmap ran after its delete returned");
}
