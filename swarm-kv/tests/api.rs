//! The application API (`Kv`, `AsyncKv`, `Stats`, the store handles): which types
//! cross threads, that clients give their writer ids back when dropped, the async
//! client under tokio, and the examples run to completion.
//!
//! `cargo test` builds a package's examples beside its tests; a run of this test alone
//! (`cargo test -p swarm-kv --test api`) needs `cargo build -p swarm-kv --examples`
//! first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use swarm_kv::{AsyncKv, ClusterParams, DeleteOutcome, Kv, KvConfig, KvError, ShmStore, Stats};
use swarm_shm::ScratchDir;

const fn assert_send<T: Send>() {}
const fn assert_sync<T: Sync>() {}
const fn assert_clone<T: Clone>() {}
const fn assert_error<T: std::error::Error + Send + Sync + 'static>() {}

// The store handle is what threads share; a blocking client moves between threads
// but is used by one at a time; the async client is shared by tasks.
const _: () = {
    assert_send::<ShmStore>();
    assert_sync::<ShmStore>();
    assert_clone::<ShmStore>();
    assert_send::<Kv>();
    assert_send::<AsyncKv>();
    assert_sync::<AsyncKv>();
    assert_send::<Stats>();
    assert_sync::<Stats>();
    assert_error::<KvError>();
};

#[cfg(feature = "rdma")]
const _: () = {
    assert_send::<swarm_kv::RdmaStore>();
    assert_sync::<swarm_kv::RdmaStore>();
    assert_clone::<swarm_kv::RdmaStore>();
};

/// The async client's futures are `Send` (tokio's multi-thread `spawn` needs it).
#[allow(dead_code)]
fn async_futures_are_send(kv: &AsyncKv, store: &ShmStore) {
    fn send<T: Send>(_: &T) {}
    send(&kv.get("k"));
    send(&kv.put("k", "v"));
    send(&kv.update("k", "v"));
    send(&kv.delete("k"));
    send(&store.connect_async());
    send(&AsyncKv::connect(store));
}

/// A three-node store with room for `writers` writer ids.
fn store(scratch: &ScratchDir, writers: u16) -> ShmStore {
    let params = ClusterParams {
        writers,
        value_max: 64,
        key_max: 32,
        ..ClusterParams::default()
    };
    ShmStore::create(&scratch.path().join("kv"), 3, 32 << 20, params).expect("create a store")
}

#[test]
fn the_blocking_client_puts_gets_updates_deletes_and_counts() {
    let scratch = ScratchDir::new("kv-api-ops").unwrap();
    let store = store(&scratch, 4);
    let kv = store.connect().unwrap();
    assert_eq!(kv.get("a").unwrap(), None);
    assert!(!kv.update("a", "1").unwrap(), "update does not insert");
    assert_eq!(kv.get("a").unwrap(), None);
    kv.put("a", "1").unwrap();
    kv.put(b"a", b"2").unwrap();
    assert_eq!(kv.get("a").unwrap(), Some(b"2".to_vec()));
    assert!(kv.update("a", vec![0u8, 255]).unwrap());
    assert_eq!(kv.get("a").unwrap(), Some(vec![0, 255]));
    assert_eq!(kv.delete("a").unwrap(), DeleteOutcome::Removed);
    assert_eq!(kv.delete("a").unwrap(), DeleteOutcome::Absent);
    // Bad input is an error, not a panic, and is counted.
    assert!(matches!(kv.put("", "x"), Err(KvError::EmptyKey)));
    assert!(matches!(
        kv.put("k", [0u8; 65]),
        Err(KvError::ValueTooLarge { len: 65, max: 64 })
    ));
    let stats = kv.stats();
    assert_eq!(
        (stats.gets, stats.puts, stats.updates, stats.deletes),
        (4, 4, 2, 2)
    );
    assert_eq!(stats.errors, 2);
    assert_eq!(stats.operations(), 12);
    assert!(stats.roundtrips >= 8, "{stats:?}");
    kv.close();
}

/// Insert-if-absent: inserts an absent key (never written, or deleted), leaves a
/// present one as it was, and the fresh register it did not use is not leaked.
#[test]
fn insert_inserts_only_an_absent_key() {
    let scratch = ScratchDir::new("kv-api-insert").unwrap();
    let store = store(&scratch, 4);
    let kv = store.connect().unwrap();
    let other = store.connect().unwrap();
    assert!(kv.insert("k", "first").unwrap(), "absent: inserted");
    assert!(!kv.insert("k", "second").unwrap(), "present: kept");
    assert!(
        !other.insert("k", "third").unwrap(),
        "present for another client too"
    );
    assert_eq!(other.get("k").unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(kv.delete("k").unwrap(), DeleteOutcome::Removed);
    assert!(other.insert("k", "again").unwrap(), "deleted: absent again");
    assert_eq!(kv.get("k").unwrap().as_deref(), Some(&b"again"[..]));
    for i in 0..50 {
        assert!(!kv.insert("k", format!("no{i}")).unwrap());
    }
    assert_eq!(kv.get("k").unwrap().as_deref(), Some(&b"again"[..]));
    let stats = kv.stats();
    assert_eq!(stats.inserts, 52, "{stats:?}");
    // 51 fresh registers this client wrote and did not publish, plus the deleted
    // key's register if its own unmap (not the other client's re-insert) ended that
    // mapping: each one retired, to be reset and reused, none leaked.
    let retired = kv.client().recycle_stats().retired;
    assert!(
        (51..=52).contains(&retired),
        "{:?}",
        kv.client().recycle_stats()
    );
}

/// Clients racing to insert one absent key: exactly one inserts it, and the key
/// holds that one's value.
#[test]
fn racing_inserts_if_absent_have_one_winner() {
    let scratch = ScratchDir::new("kv-api-insert-race").unwrap();
    let store = store(&scratch, 8);
    for round in 0..20 {
        let key = format!("race{round}");
        let winners: Vec<(usize, bool)> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..3)
                .map(|t| {
                    let (store, key) = (&store, &key);
                    scope.spawn(move || {
                        let kv = store.connect().unwrap();
                        (t, kv.insert(key, format!("by{t}")).unwrap())
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let won: Vec<usize> = winners
            .iter()
            .filter(|(_, w)| *w)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {winners:?}");
        let kv = store.connect().unwrap();
        assert_eq!(
            kv.get(&key).unwrap(),
            Some(format!("by{}", won[0]).into_bytes()),
            "round {round}"
        );
    }
}

/// Connects a client while another holds the only other writer id: the connect
/// must find a free id at once (a full table would make it wait a lease period and
/// take over an idle client's id instead).
fn connect_at_once(store: &ShmStore, busy: &Kv) -> Kv {
    let started = std::time::Instant::now();
    let kv = store.connect().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "no free writer id: the connect waited {:?} to take over one",
        started.elapsed()
    );
    assert_ne!(kv.writer(), busy.writer());
    busy.put("busy", "still serving")
        .expect("the other client kept its id");
    kv
}

#[test]
fn clients_give_their_writer_ids_back_when_dropped_or_closed() {
    let scratch = ScratchDir::new("kv-api-drop").unwrap();
    let store = store(&scratch, 2);
    let a = store.connect().unwrap();
    let b = Kv::connect(&store).unwrap();
    assert_ne!(a.writer(), b.writer());
    drop(a);
    let c = connect_at_once(&store, &b);
    c.close();
    let d = connect_at_once(&store, &b);
    drop(d);
    assert_eq!(b.get("busy").unwrap(), Some(b"still serving".to_vec()));
}

#[test]
fn deferred_unmaps_are_refused_by_the_convenience_clients() {
    let scratch = ScratchDir::new("kv-api-deferred").unwrap();
    let store = store(&scratch, 2);
    let config = KvConfig {
        deferred_unmaps: 4,
        ..store.config()
    };
    assert!(matches!(
        Kv::connect_with(&store, config),
        Err(KvError::Unsupported(_))
    ));
    let refused = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(AsyncKv::connect_with(&store, config));
    assert!(matches!(refused, Err(KvError::Unsupported(_))));
    // Nothing was taken: both ids are free.
    let (_a, _b) = (store.connect().unwrap(), store.connect().unwrap());
}

#[test]
fn threads_share_a_store_and_each_connects_its_own_client() {
    let scratch = ScratchDir::new("kv-api-threads").unwrap();
    let store = store(&scratch, 8);
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                let kv = store.connect().unwrap();
                for i in 0..20 {
                    kv.put(format!("t{t}:{i}"), format!("{i}")).unwrap();
                }
            });
        }
    });
    // A client made on one thread can move to another.
    let kv = store.connect().unwrap();
    let kv = std::thread::spawn(move || {
        assert_eq!(kv.get("t3:19").unwrap(), Some(b"19".to_vec()));
        kv
    })
    .join()
    .unwrap();
    assert_eq!(kv.get("t0:0").unwrap(), Some(b"0".to_vec()));
}

#[test]
fn the_async_client_serves_concurrent_tokio_tasks_and_closes() {
    let scratch = ScratchDir::new("kv-api-async").unwrap();
    let store = store(&scratch, 2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    runtime.block_on(async {
        let kv = Arc::new(store.connect_async().await.unwrap());
        let tasks: Vec<_> = (0..6)
            .map(|t| {
                let kv = Arc::clone(&kv);
                tokio::spawn(async move {
                    for i in 0..10 {
                        kv.put(format!("t{t}:{i}"), [t as u8, i]).await?;
                    }
                    kv.get(format!("t{t}:9")).await
                })
            })
            .collect();
        for (t, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await.unwrap().unwrap(), Some(vec![t as u8, 9]));
        }
        assert!(kv.update("t0:0", "x").await.unwrap());
        assert!(!kv.update("none", "x").await.unwrap());
        assert_eq!(kv.delete("t0:0").await.unwrap(), DeleteOutcome::Removed);
        assert!(matches!(kv.get("").await, Err(KvError::EmptyKey)));
        let stats = kv.stats();
        assert_eq!((stats.puts, stats.gets, stats.errors), (60, 7, 1));
        // With both ids taken, a connect would wait a lease period to take over
        // an idle one: a closed client's id is free at once.
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let other = store.connect_async().await.unwrap();
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
            assert_ne!(other.writer(), kv.writer());
            other.close().await;
        }
        Arc::try_unwrap(kv)
            .expect("the tasks are done")
            .close()
            .await;
    });
}

/// An example's binary: `target/<profile>/examples/NAME`, beside this test's
/// `target/<profile>/deps/api-<hash>`, where `cargo test` leaves it.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test -p swarm-kv` (which builds the examples), or \
         `cargo build -p swarm-kv --examples` before this test alone",
        bin.display()
    );
    bin
}

fn run_example(name: &str) -> String {
    let out = Command::new(example(name))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the {name} example: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the {name} example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_blocking_example_runs() {
    let out = run_example("blocking");
    assert!(out.contains("blocking example: ok"), "{out}");
}

#[test]
fn the_tokio_example_runs() {
    let out = run_example("tokio");
    assert!(out.contains("tokio example: ok"), "{out}");
}
