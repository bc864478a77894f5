//! SWARM-KV operations on a shared-memory cluster: semantics, roundtrips, bad input,
//! and a concurrent history checked for linearizability.

use swarm_checker::OpKind;
use swarm_core::fabric::Crash;
use swarm_core::{NodeId, OpStats, block_on, block_on_future};
use swarm_kv::ClusterParams;
use swarm_kv::SystemClock;
use swarm_kv::{DeleteOutcome, KvClient, KvError, ShmStore};
use swarm_shm::ScratchDir;

mod history_support;
use history_support::{Lcg, run_checked_threads, run_recorded};

/// Five nodes, each register on three of them.
fn five_node_store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        replicas: 3,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 5, 16 << 20, params).expect("create")
}

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 32,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

#[test]
fn insert_get_update_delete_and_their_roundtrips() {
    let dir = ScratchDir::new("kv-sem").unwrap();
    let store = store(&dir);
    let a = store.client().unwrap();
    let b = store.client().unwrap();
    let f = a.fabric();
    let s = OpStats::new();
    assert_eq!(block_on(f, a.get(b"k1", &s)).unwrap(), None);
    // A client's first register write takes one more roundtrip: warm it up.
    block_on(f, a.insert(b"k0", b"v0", &OpStats::new())).unwrap();
    let s = OpStats::new();
    block_on(f, a.insert(b"k1", b"v1", &s)).unwrap();
    assert_eq!(
        s.roundtrips(),
        1,
        "insert into a never-used bucket: value, key header and the index's blind fast \
         round in one batch per node"
    );
    let s = OpStats::new();
    assert_eq!(block_on(f, a.get(b"k1", &s)).unwrap(), Some(b"v1".to_vec()));
    assert_eq!(s.roundtrips(), 1, "cached get: one roundtrip");
    // b has an empty cache: one index roundtrip, then the read.
    let s = OpStats::new();
    assert_eq!(
        block_on(b.fabric(), b.get(b"k1", &s)).unwrap(),
        Some(b"v1".to_vec())
    );
    assert_eq!(s.roundtrips(), 2, "cache miss: index + read");
    let s = OpStats::new();
    assert!(block_on(f, a.update(b"k1", b"v2", &s)).unwrap());
    assert_eq!(s.roundtrips(), 1, "cached update: one roundtrip");
    let s = OpStats::new();
    assert_eq!(
        block_on(b.fabric(), b.get(b"k1", &s)).unwrap(),
        Some(b"v2".to_vec())
    );
    assert_eq!(s.roundtrips(), 1);
    // Update of an absent key fails; insert of a present key updates.
    assert!(!block_on(f, a.update(b"nope", b"x", &OpStats::new())).unwrap());
    block_on(b.fabric(), b.insert(b"k1", b"v3", &OpStats::new())).unwrap();
    assert_eq!(
        block_on(f, a.get(b"k1", &OpStats::new())).unwrap(),
        Some(b"v3".to_vec())
    );
    // Delete; b's cached location is stale and must not resurrect the key.
    assert_eq!(
        block_on(f, a.delete(b"k1", &OpStats::new())).unwrap(),
        DeleteOutcome::Removed
    );
    assert_eq!(
        block_on(f, a.delete(b"k1", &OpStats::new())).unwrap(),
        DeleteOutcome::Absent
    );
    assert_eq!(
        block_on(b.fabric(), b.get(b"k1", &OpStats::new())).unwrap(),
        None
    );
    assert!(!block_on(b.fabric(), b.update(b"k1", b"late", &OpStats::new())).unwrap());
    // Re-insert after delete: the key's first bucket was used, so the blind round
    // fails and the insert goes on from a read.
    let s = OpStats::new();
    block_on(b.fabric(), b.insert(b"k1", b"again", &s)).unwrap();
    assert!(
        s.roundtrips() >= 3,
        "blind round, read, fast or classic round"
    );
    assert_eq!(
        block_on(f, a.get(b"k1", &OpStats::new())).unwrap(),
        Some(b"again".to_vec())
    );
    a.close();
    b.close();
}

#[test]
fn bad_input_is_a_clear_error_and_nothing_is_lost() {
    let dir = ScratchDir::new("kv-bad").unwrap();
    let store = store(&dir);
    let c = store.client().unwrap();
    let f = c.fabric();
    block_on(f, c.insert(b"keep", b"safe", &OpStats::new())).unwrap();
    let long_key = vec![b'k'; 33];
    let big_value = vec![b'v'; 65];
    let err = block_on_future(f, c.insert(&long_key, b"x", &OpStats::new()))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, KvError::KeyTooLong { len: 33, max: 32 }),
        "{err}"
    );
    let err = block_on_future(f, c.insert(b"k", &big_value, &OpStats::new()))
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, KvError::ValueTooLarge { len: 65, max: 64 }),
        "{err}"
    );
    assert!(err.to_string().contains("--value-max"));
    let err = block_on_future(f, c.get(b"", &OpStats::new()))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, KvError::EmptyKey));
    let err = block_on_future(f, c.update(b"keep", &big_value, &OpStats::new()))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, KvError::ValueTooLarge { .. }));
    assert_eq!(
        block_on(f, c.get(b"keep", &OpStats::new())).unwrap(),
        Some(b"safe".to_vec())
    );
}

/// `get_into` and `get` of cached keys, on each of their paths through the cache:
/// the common one (one plain function, one roundtrip), an entry made stale by
/// another client's delete and re-insert (the read finds a tombstone, the general
/// path asks the index), and a suspected node (the read's common case does not
/// apply: the read is finished from where it stopped).
#[test]
fn cached_gets_on_every_path() {
    let dir = ScratchDir::new("kv-cached-get").unwrap();
    let store = store(&dir);
    let (a, b) = (store.client().unwrap(), store.client().unwrap());
    let (fa, fb) = (a.fabric(), b.fabric());
    for i in 0..6u32 {
        let key = format!("k{i}");
        block_on(fa, a.insert(key.as_bytes(), b"one", &OpStats::new())).unwrap();
    }
    let mut out = Vec::new();
    for i in 0..6u32 {
        let key = format!("k{i}");
        assert!(block_on(fb, b.get_into(key.as_bytes(), &mut out, &OpStats::new())).unwrap());
        assert_eq!(out, b"one");
        let s = OpStats::new();
        assert!(block_on(fb, b.get_into(key.as_bytes(), &mut out, &s)).unwrap());
        assert_eq!((out.as_slice(), s.roundtrips()), (&b"one"[..], 1), "cached");
        let s = OpStats::new();
        let got = block_on(fb, b.get(key.as_bytes(), &s)).unwrap();
        assert_eq!((got.as_deref(), s.roundtrips()), (Some(&b"one"[..]), 1));
    }
    // Stale entries: a deletes and inserts again (another register).
    for i in 0..3u32 {
        let key = format!("k{i}");
        block_on(fa, a.delete(key.as_bytes(), &OpStats::new())).unwrap();
        block_on(fa, a.insert(key.as_bytes(), b"two", &OpStats::new())).unwrap();
        let s = OpStats::new();
        assert!(block_on(fb, b.get_into(key.as_bytes(), &mut out, &s)).unwrap());
        assert_eq!(out, b"two");
        // The stale read, then the index (its lookup of a re-inserted key takes more
        // than one), then the new register: five here, as before the cached get was
        // one function.
        assert!(s.roundtrips() >= 3, "{} roundtrips", s.roundtrips());
        let s = OpStats::new();
        assert!(block_on(fb, b.get_into(key.as_bytes(), &mut out, &s)).unwrap());
        assert_eq!(
            (out.as_slice(), s.roundtrips()),
            (&b"two"[..], 1),
            "cached again"
        );
    }
    // Deleted for good: absent, and `out` emptied.
    block_on(fa, a.delete(b"k3", &OpStats::new())).unwrap();
    assert!(!block_on(fb, b.get_into(b"k3", &mut out, &OpStats::new())).unwrap());
    assert!(out.is_empty());
    assert_eq!(block_on(fb, b.get(b"k3", &OpStats::new())).unwrap(), None);
    // A crashed node: some keys' preferred majority includes it.
    fb.fail_node(NodeId(1));
    for i in [0u32, 1, 2, 4, 5] {
        let key = format!("k{i}");
        let want: &[u8] = if i < 3 { b"two" } else { b"one" };
        assert!(block_on(fb, b.get_into(key.as_bytes(), &mut out, &OpStats::new())).unwrap());
        assert_eq!(out, want);
        let got = block_on(fb, b.get(key.as_bytes(), &OpStats::new())).unwrap();
        assert_eq!(got.as_deref(), Some(want));
    }
}

#[test]
fn a_failed_node_is_masked() {
    let dir = ScratchDir::new("kv-fail").unwrap();
    let store = store(&dir);
    let c = store.client().unwrap();
    let f = c.fabric();
    for i in 0..20u32 {
        block_on(
            f,
            c.insert(format!("k{i}").as_bytes(), b"v", &OpStats::new()),
        )
        .unwrap();
    }
    f.fail_node(NodeId(1));
    for i in 0..20u32 {
        let key = format!("k{i}");
        assert!(block_on(f, c.update(key.as_bytes(), b"w", &OpStats::new())).unwrap());
        assert_eq!(
            block_on(f, c.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"w".to_vec())
        );
    }
    block_on(f, c.insert(b"new", b"n", &OpStats::new())).unwrap();
    let other = store.client().unwrap();
    assert_eq!(
        block_on(other.fabric(), other.get(b"new", &OpStats::new())).unwrap(),
        Some(b"n".to_vec())
    );
}

#[test]
fn concurrent_clients_are_linearizable() {
    let dir = ScratchDir::new("kv-conc").unwrap();
    let store = store(&dir);
    run_checked_threads(6, |t, origin, ops| {
        let c = store.client().unwrap();
        let mut rng = Lcg(t * 7 + 1);
        for i in 0..300u64 {
            let x = rng.next();
            let key = format!("k{}", (x >> 33) % 5);
            let value = format!("t{t}-{i}");
            let kind = match (x >> 20) % 10 {
                0..=3 => OpKind::Get,
                4..=6 => OpKind::Update,
                7..=8 => OpKind::Insert,
                _ => OpKind::Delete,
            };
            ops.push(run_recorded(&c, t, kind, key, value, origin));
        }
    });
}

#[test]
fn a_delete_whose_unmap_fails_still_deleted_the_key() {
    let dir = ScratchDir::new("kv-delete-unmap").unwrap();
    let store = five_node_store(&dir);
    let header = *store.header();
    let c = KvClient::connect(
        store.fabric(),
        SystemClock::new(header.epoch_unix_ns, header.tick_ns),
        *store.layout(),
        store.config(),
    )
    .unwrap();
    let f = c.fabric();
    let stats = OpStats::new();
    block_on(f, c.insert(b"gone", b"v", &stats)).unwrap();
    let register = block_on(f, c.index().resolve(f, &stats, b"gone"))
        .unwrap()
        .expect("mapped");
    let replicas = c.register_loc(register).unwrap().replicas.nodes().to_vec();
    // One replica and both other nodes fail: the register keeps a quorum (2 of 3),
    // the index, replicated on all 5 nodes, loses its majority. The tombstone is
    // written (the delete took effect), the unmap cannot be.
    f.fail_node_as(replicas[2], Crash::Erroring);
    for node in (0..5).map(NodeId).filter(|n| !replicas.contains(n)) {
        f.fail_node_as(node, Crash::Erroring);
    }
    assert_eq!(
        block_on(f, c.delete(b"gone", &stats)).unwrap(),
        DeleteOutcome::Removed
    );
    // With every node back (another client), the key is absent and can come back.
    let other = store.client().unwrap();
    let g = other.fabric();
    assert_eq!(block_on(g, other.get(b"gone", &stats)).unwrap(), None);
    block_on(g, other.insert(b"gone", b"again", &stats)).unwrap();
    assert_eq!(
        block_on(g, other.get(b"gone", &stats)).unwrap(),
        Some(b"again".to_vec())
    );
}

#[test]
fn claimed_chunks_count_what_clients_took() {
    let dir = ScratchDir::new("kv-claimed").unwrap();
    let store = store(&dir);
    let stats = OpStats::new();
    let fabric = store.fabric();
    let claimed = |f| swarm_kv::admin::claimed_chunks(f, store.layout()).unwrap();
    assert_eq!(claimed(&fabric), 0);
    let per_chunk = u64::from(store.layout().params.chunk_registers);
    for client in 0..2 {
        let c = store.client().unwrap();
        for i in 0..per_chunk + 1 {
            let key = format!("c{client}-{i}");
            block_on(c.fabric(), c.insert(key.as_bytes(), b"v", &stats)).unwrap();
        }
    }
    // Each client filled one chunk and started a second.
    assert_eq!(claimed(&fabric), 4);
}

/// An operation's future is what an application's executor moves when it spawns it
/// (the bench's does, once per operation): the rare paths (an index lookup on a cache
/// miss, an insert's publication, a delete's unmap, a synchronous lease renewal) are
/// boxed, so that no operation's future carries them inline. An insert's future was
/// 14 KB and moving it cost YCSB A about a sixth of its throughput.
#[test]
fn operation_futures_stay_small() {
    let dir = ScratchDir::new("kv-futures").unwrap();
    let store = store(&dir);
    let c = store.client().unwrap();
    let s = OpStats::new();
    let sizes = [
        ("get", std::mem::size_of_val(&c.get(b"k", &s))),
        ("update", std::mem::size_of_val(&c.update(b"k", b"v", &s))),
        ("insert", std::mem::size_of_val(&c.insert(b"k", b"v", &s))),
        ("delete", std::mem::size_of_val(&c.delete(b"k", &s))),
    ];
    // Today about 2.3 KB, most of it the register protocol's inline replies.
    let limit = 3 << 10;
    for (op, size) in sizes {
        assert!(size <= limit, "{op}: a {size}-byte future (limit {limit})");
    }
}

type Client = KvClient<swarm_shm::EmulatedFabric, SystemClock>;

/// A cluster of five nodes whose registers have three replicas: a key header lives on
/// its register's replicas only, so the index must read it there. It read a majority
/// of all five nodes, which may hold none of the copies: an insert of a present key
/// from a client without it cached failed with `KeyHeader { problem: Missing }`, and
/// so did the unmap of a delete.
#[test]
fn keys_are_told_apart_by_their_headers_on_their_registers_replicas() {
    let dir = ScratchDir::new("kv-five").unwrap();
    let store = five_node_store(&dir);
    let keys: Vec<String> = (0..200).map(|i| format!("key{i}")).collect();
    let run = |c: &Client, op: &dyn Fn(&Client, &[u8])| {
        for k in &keys {
            op(c, k.as_bytes());
        }
    };
    let (a, b, c) = (
        store.client().unwrap(),
        store.client().unwrap(),
        store.client().unwrap(),
    );
    run(&a, &|c, k| {
        block_on(c.fabric(), c.insert(k, b"one", &OpStats::new())).unwrap()
    });
    // Present, not in b's cache: the insert finds the key's index entry and reads
    // its header.
    run(&b, &|c, k| {
        block_on(c.fabric(), c.insert(k, b"two", &OpStats::new())).unwrap()
    });
    run(&c, &|c, k| {
        let outcome = block_on(c.fabric(), c.delete(k, &OpStats::new())).unwrap();
        assert_eq!(outcome, DeleteOutcome::Removed);
    });
    run(&b, &|c, k| {
        block_on(c.fabric(), c.insert(k, b"three", &OpStats::new())).unwrap()
    });
    run(&a, &|c, k| {
        let got = block_on(c.fabric(), c.get(k, &OpStats::new())).unwrap();
        assert_eq!(got.as_deref(), Some(&b"three"[..]));
    });
}
