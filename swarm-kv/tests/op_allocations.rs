//! Heap allocations of steady-state operations on shared memory, counted by a global
//! allocator: a get of a cached key, and an update of one, through `Kv` and
//! `KvClient`. Counts, not timings: they are deterministic, so a change that adds an
//! allocation to the hot path fails here.
//!
//! Periodic upkeep is kept out of the counted operations: the background slot-recycling
//! check (at most one per `ProtocolConfig::slot_recycling_interval_ns`, 1 ms by
//! default, a few dozen allocations each) and the lease renewal (every
//! `lease_renew_ns`) are set far apart here. Their allocations are amortized over
//! thousands of operations, but they are not zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use swarm_core::{OpStats, block_on};

use swarm_kv::{ClusterParams, Kv, KvConfig, ShmStore};
use swarm_shm::ScratchDir;

/// The system allocator, counting the allocations (and reallocations) of the
/// calling thread, so that tests running in parallel do not count each other's.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the thread's counter may be gone while the thread exits.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged,
// which upholds `GlobalAlloc`'s contract as `System` does; counting touches only a
// thread-local `Cell` with a const initializer (it allocates nothing).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged (see the impl's comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations per call of `op`, averaged over [`COUNTED`] calls after
/// [`WARM_UP`] calls (the first calls fill caches, claim registers and grow the
/// client's bookkeeping).
///
/// Each write leaves its superseded log slot in the client's queue of slots waiting
/// for their grace (about a second), a queue that grows by doubling until the writes
/// of one grace fit: after [`WARM_UP`] writes it has room for 2,048, which the
/// [`COUNTED`] writes after them do not reach.
fn per_op(mut op: impl FnMut(u64)) -> f64 {
    for i in 0..WARM_UP {
        op(i);
    }
    let before = allocations();
    for i in 0..COUNTED {
        op(i);
    }
    (allocations() - before) as f64 / COUNTED as f64
}

/// Calls of an operation before its allocations are counted.
const WARM_UP: u64 = 1100;
/// Calls of an operation whose allocations are counted.
const COUNTED: u64 = 500;

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        // No lease renewal while the operations are counted.
        lease_ns: 600_000_000_000,
        lease_renew_ns: 200_000_000_000,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

/// The store's client settings without slot-recycling checks while operations are
/// counted (see the module docs).
fn config(store: &ShmStore) -> KvConfig {
    let mut config = store.config();
    config.protocol = config
        .protocol
        .with_slot_recycling_interval_ns(600_000_000_000);
    config
}

const KEYS: u64 = 16;

fn key(i: u64) -> [u8; 24] {
    let mut key = [b'k'; 24];
    key[16..].copy_from_slice(&(i % KEYS).to_be_bytes());
    key
}

fn counts() -> [(&'static str, f64); 5] {
    let dir = ScratchDir::new("kv-allocs").unwrap();
    let store = store(&dir);
    let kv = Kv::connect_with(&store, config(&store)).unwrap();
    let value = [0x5Au8; 64];
    for i in 0..KEYS {
        kv.put(key(i), value).unwrap();
    }
    let mut buf = Vec::with_capacity(64);
    let kv_get = per_op(|i| assert!(kv.get_into(key(i), &mut buf).unwrap()));
    let kv_update = per_op(|i| assert!(kv.update(key(i), value).unwrap()));
    let kv_get_vec = per_op(|i| assert!(kv.get(key(i)).unwrap().is_some()));
    drop(kv);
    let client = store.client_with(config(&store)).unwrap();
    let fabric = client.fabric();
    for i in 0..KEYS {
        block_on(fabric, client.get(&key(i), &OpStats::new())).unwrap();
    }
    let client_get = per_op(|i| {
        let stats = OpStats::new();
        assert!(block_on(fabric, client.get_into(&key(i), &mut buf, &stats)).unwrap());
    });
    let client_update = per_op(|i| {
        let stats = OpStats::new();
        assert!(block_on(fabric, client.update(&key(i), &value, &stats)).unwrap());
    });
    [
        ("Kv::get (the value it returns)", kv_get_vec),
        ("Kv::get_into", kv_get),
        ("Kv::update", kv_update),
        ("KvClient::get_into", client_get),
        ("KvClient::update", client_update),
    ]
}

/// A steady-state get (of a key in the location cache, into the caller's buffer)
/// and update allocate nothing on shared memory; a get that returns its value
/// allocates that value only.
#[test]
fn steady_state_gets_and_updates_allocate_nothing() {
    let counts = counts();
    for (op, n) in counts {
        eprintln!("{op}: {n} allocations per operation");
    }
    let [(_, get_vec), rest @ ..] = counts;
    assert_eq!(get_vec, 1.0, "Kv::get allocates only the value it returns");
    for (op, n) in rest {
        assert_eq!(n, 0.0, "{op} allocates {n} times per operation");
    }
}
