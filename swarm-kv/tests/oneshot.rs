//! One-shot clients (issue 43 §5): many short-lived clients, each inserting one key and
//! closing, on a shared-memory store with far fewer register chunks than clients.
//!
//! Each client claims a whole chunk and uses one register of it. Before a clean close
//! gave back what it never used (`swarm_kv::registers::give_back`), the rest came back
//! only by adoption, a register grace later (about 13 s here), while the clients that
//! waited for it held every writer id: `swarm put` in batches of 40 failed with "all 8
//! writer ids are taken" after about 180 keys on a 64 MiB cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use swarm_core::{OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::ShmStore;
use swarm_kv::admin::{self, Census};
use swarm_shm::ScratchDir;

/// Threads, each running one-shot clients one after another (one writer id each).
const THREADS: usize = 8;
/// One-shot clients in all.
const CLIENTS: usize = 200;
/// How many times one client retries an insert stopped at its deadline (`Fenced`: a
/// stall on a loaded host, its outcome unknown; an insert is an upsert, so a retry is
/// the same write).
const FENCED_RETRIES: usize = 5;

fn census_of(store: &ShmStore) -> Census {
    admin::census(&store.fabric(), store.layout()).expect("a census")
}

/// 200 one-shot clients on 8 writer ids and a store of 24 chunks (of 64 registers)
/// all succeed, and afterwards every register of the store holds one of the keys, is
/// donated (free for the next client at once) or was never used: none is held back by
/// a gone client, so no client waits for a grace. (The test reports the slowest
/// client's time, for comparison with a register grace, but asserts no timing.)
#[test]
fn one_shot_clients_give_back_what_they_never_used() {
    let scratch = ScratchDir::new("swarm-kv-oneshot").expect("a scratch dir");
    let params = ClusterParams {
        writers: THREADS as u16,
        value_max: 64,
        key_max: 32,
        chunk_registers: 64,
        // A grace that holds the cache lifetime (10 s), as on a cluster made before
        // superblock version 7: a client that waited for one would blow its budget.
        cached_lives: false,
        ..ClusterParams::default()
    };
    let store = Arc::new(
        ShmStore::create(&scratch.path().join("kv"), 3, 2 << 20, params).expect("a store"),
    );
    let p = store.layout().params;
    // The computed chunks: reserve ones have no place before a node is added.
    let chunks = store.layout().computed_chunks();
    assert!(
        chunks < CLIENTS as u64 / 4,
        "far fewer chunks than clients: {chunks} chunks of {}, {} registers",
        p.chunk_registers,
        p.registers
    );

    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || -> Result<Duration, String> {
                let mut slowest = Duration::ZERO;
                for i in (t..CLIENTS).step_by(THREADS) {
                    let began = Instant::now();
                    let client = store.client().map_err(|e| format!("client {i}: {e}"))?;
                    let key = format!("key{i}");
                    let value = format!("value{i}");
                    let mut inserted = Ok(());
                    for _ in 0..=FENCED_RETRIES {
                        inserted = block_on(
                            client.fabric(),
                            client.insert(key.as_bytes(), value.as_bytes(), &OpStats::new()),
                        );
                        if !inserted.as_ref().is_err_and(|e| e.is_fenced()) {
                            break;
                        }
                    }
                    client.close();
                    let took = began.elapsed();
                    if let Err(error) = inserted {
                        return Err(format!("client {i} after {took:?}: {error}"));
                    }
                    slowest = slowest.max(took);
                }
                Ok(slowest)
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for worker in workers {
        slowest = slowest.max(
            worker
                .join()
                .expect("a worker thread")
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    eprintln!(
        "{CLIENTS} one-shot clients in {:?}, slowest {slowest:?} (a register grace is {} ms)",
        started.elapsed(),
        p.register_grace_ns() / 1_000_000
    );

    let after = census_of(&store);
    eprintln!("{after:?}");
    assert_eq!(after.keyed, CLIENTS as u64, "{after:?}");
    assert_eq!(after.retired_live + after.retired_gone, 0, "{after:?}");
    assert_eq!(after.pooled_live, 0, "no client is left: {after:?}");
    assert_eq!(after.unknown, 0, "{after:?}");
    assert_eq!(
        after.pooled_gone, after.donated,
        "nothing waits for a grace: {after:?}"
    );
    assert_eq!(
        after.keyed + after.donated + after.fresh,
        p.registers,
        "every register holds a key, is donated or was never used: {after:?}"
    );

    let reader = store.client().expect("a client");
    for i in 0..CLIENTS {
        let got = block_on(
            reader.fabric(),
            reader.get(format!("key{i}").as_bytes(), &OpStats::new()),
        )
        .expect("a get");
        assert_eq!(got, Some(format!("value{i}").into_bytes()), "key{i}");
    }
    reader.close();
}
