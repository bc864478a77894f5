//! A delete that reaches a register through the client's location cache when that
//! register is no longer the key's (`KvClient::delete`): another client deleted it
//! while a node missed that delete, and the key was inserted again into another
//! register. The cached register then looks exactly like one that two deletes race
//! on: the delete finds another client's tombstone first on one replica and
//! installs its own on the node that missed it. It must ask the index, and delete
//! the key's register of now, or fail with `DeleteUndecided` when a node it needs
//! to decide is down; never report a delete of a value that is still there. And
//! when the key moved while the delete ran, a delete whose tombstone is first on a
//! majority of the old register may be the one that removed the old value: it must
//! not remove the new one too.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use swarm_core::encoding::{Flag, Timestamp, Tsp, WriterId};
use swarm_core::fabric::{Crash, Op, Traced, Tracer};
use swarm_core::{Batch, NodeId, OpStats, Roundtrip, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::SystemClock;
use swarm_kv::{DeleteOutcome, KvClient, KvConfig, KvError, ShmStore};
use swarm_shm::EmulatedFabric;
use swarm_shm::ScratchDir;

type Client = KvClient<EmulatedFabric, SystemClock>;

fn store(dir: &ScratchDir) -> ShmStore {
    let params = ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        replicas: 3,
        ..ClusterParams::default()
    };
    ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create")
}

fn client(store: &ShmStore, config: KvConfig) -> Client {
    let header = *store.header();
    KvClient::connect(
        store.fabric(),
        SystemClock::new(header.epoch_unix_ns, header.tick_ns),
        *store.layout(),
        config,
    )
    .expect("connect")
}

/// Three clients of `store` with its default configuration.
fn three_clients(store: &ShmStore) -> (Client, Client, Client) {
    let config = store.config();
    (
        client(store, config),
        client(store, config),
        client(store, config),
    )
}

/// The key's register and its replicas in preference order.
fn replicas(c: &Client, key: &[u8]) -> Vec<NodeId> {
    let f = c.fabric();
    let register = block_on(f, c.index().resolve(f, &OpStats::new(), key))
        .unwrap()
        .expect("mapped");
    c.register_loc(register).unwrap().replicas.nodes().to_vec()
}

/// `a` caches the key's register; `b`, which cannot reach the register's second
/// replica, deletes the key (its tombstone lands on the first and third); `c`
/// inserts the key again, into a fresh register. Returns the old register's
/// replicas.
fn stale_cache_behind_a_missed_delete(a: &Client, b: &Client, c: &Client) -> Vec<NodeId> {
    let stats = OpStats::new();
    block_on(a.fabric(), a.insert(b"k", b"old", &stats)).unwrap();
    assert_eq!(
        block_on(a.fabric(), a.get(b"k", &stats)).unwrap(),
        Some(b"old".to_vec())
    );
    let old = replicas(a, b"k");
    b.fabric().fail_node_as(old[1], Crash::Erroring);
    assert_eq!(
        block_on(b.fabric(), b.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Removed
    );
    block_on(c.fabric(), c.insert(b"k", b"new", &stats)).unwrap();
    assert_ne!(replicas(c, b"k"), Vec::new());
    old
}

#[test]
fn a_delete_through_a_stale_cache_deletes_the_keys_register_of_now() {
    let dir = ScratchDir::new("kv-stale-delete").unwrap();
    let store = store(&dir);
    let (a, b, c) = three_clients(&store);
    stale_cache_behind_a_missed_delete(&a, &b, &c);
    // `a` finds b's tombstone on the first replica and installs its own on the second:
    // a race, as far as the register can tell. The index says the key moved, and the
    // third replica shows b's tombstone: `a` is not first on a majority of the old
    // register, so it deletes the new one.
    let stats = OpStats::new();
    assert_eq!(
        block_on(a.fabric(), a.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Removed
    );
    assert_eq!(block_on(c.fabric(), c.get(b"k", &stats)).unwrap(), None);
}

#[test]
fn a_delete_through_a_stale_cache_that_cannot_decide_changes_nothing() {
    let dir = ScratchDir::new("kv-stale-undecided").unwrap();
    let store = store(&dir);
    let (a, b, c) = three_clients(&store);
    let old = stale_cache_behind_a_missed_delete(&a, &b, &c);
    // Now `a` cannot reach the third replica: whether its tombstone is first on a
    // majority of the old register (then it may be the delete that removed the old
    // value, and must not remove the new one) hinges on that node.
    a.fabric().fail_node_as(old[2], Crash::Erroring);
    let stats = OpStats::new();
    match block_on(a.fabric(), a.delete(b"k", &stats)) {
        Err(KvError::DeleteUndecided { .. }) => {}
        other => panic!("expected DeleteUndecided, got {other:?}"),
    }
    assert_eq!(
        block_on(c.fabric(), c.get(b"k", &stats)).unwrap(),
        Some(b"new".to_vec()),
        "the undecided delete left the key's value of now alone"
    );
}

#[test]
fn a_second_delete_of_a_key_whose_unmap_waits_finds_it_absent() {
    let dir = ScratchDir::new("kv-delete-twice").unwrap();
    let store = store(&dir);
    let config = KvConfig {
        deferred_unmaps: 8,
        ..store.config()
    };
    let a = client(&store, config);
    let stats = OpStats::new();
    block_on(a.fabric(), a.insert(b"k", b"v", &stats)).unwrap();
    assert_eq!(
        block_on(a.fabric(), a.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Removed
    );
    assert!(a.has_deferred_unmaps(), "the unmap waits");
    // The index still maps the key to the tombstoned register, which reads as
    // absent: the delete stops there, without writing a second tombstone of this
    // writer (which could not tell this delete from the first).
    assert_eq!(
        block_on(a.fabric(), a.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Absent
    );
    block_on(a.fabric(), a.run_deferred_unmaps()).unwrap();
    assert_eq!(
        block_on(a.fabric(), a.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Absent
    );
}

/// A tracer that runs its hook once, right after the first batch that CASes word
/// `watch` was posted (shared memory completes a batch inside `post`): another
/// client's operation landing inside this client's.
#[derive(Default)]
struct Hook {
    watch: Cell<Option<u64>>,
    /// The batch just shown CASes the watched word.
    hit: Cell<bool>,
    hook: RefCell<Option<Box<dyn FnOnce()>>>,
}

impl Tracer for Hook {
    fn batch(&self, _: NodeId, batch: &Batch) {
        let hit = self.watch.get().is_some_and(|watch| {
            batch
                .ops()
                .iter()
                .any(|op| matches!(op, Op::Cas { addr, .. } if *addr == watch))
        });
        self.hit.set(hit);
    }
    fn posted(&self, _: NodeId) {
        if self.hit.take()
            && let Some(hook) = self.hook.borrow_mut().take()
        {
            self.watch.set(None);
            hook();
        }
    }
}

#[test]
fn a_delete_first_on_a_majority_of_the_old_register_leaves_the_new_one_alone() {
    let dir = ScratchDir::new("kv-stale-first").unwrap();
    let store = store(&dir);
    let header = *store.header();
    let a = KvClient::connect(
        Traced::new(store.fabric(), Hook::default()),
        SystemClock::new(header.epoch_unix_ns, header.tick_ns),
        *store.layout(),
        store.config(),
    )
    .expect("connect");
    let c = Rc::new(client(&store, store.config()));
    let stats = OpStats::new();
    block_on(a.fabric(), a.insert(b"k", b"old", &stats)).unwrap();
    let f = a.fabric();
    let register = block_on(f, a.index().resolve(f, &stats, b"k"))
        .unwrap()
        .expect("mapped");
    let loc = a.register_loc(register).unwrap();
    let old = loc.replicas.nodes().to_vec();
    let delete_word = a.layout().swarm.delete_word_addr(loc.offset(1));
    // Another client's delete reached the second replica only, and that client
    // crashed: its tombstone is there, on no majority, and the key still reads "old".
    let raw = store.fabric();
    let other = Tsp::new(
        Timestamp::tombstone(WriterId::new(7).unwrap()),
        Flag::Verified,
    );
    block_on(&raw, async {
        let mut rt = Roundtrip::start(&raw, &stats);
        rt.post(old[1], Batch::cas(delete_word, 0, other.word()))?;
        rt.wait(1).await
    })
    .unwrap();
    // `a` deletes through its cache. Right after its tombstone landed on the first
    // replica (a majority now holds tombstones), `c` inserts the key again: it finds
    // the old register deleted and maps the key to a fresh one.
    let inserter = Rc::clone(&c);
    *f.tracer().hook.borrow_mut() = Some(Box::new(move || {
        block_on(
            inserter.fabric(),
            inserter.insert(b"k", b"new", &OpStats::new()),
        )
        .unwrap();
    }));
    f.tracer().watch.set(Some(delete_word));
    // `a` came first on the first replica and, once it completed its delete there,
    // on the third: a majority. It may be the delete that removed "old" (the crashed
    // one may never count), so it must not remove "new" as well.
    assert_eq!(
        block_on(f, a.delete(b"k", &stats)).unwrap(),
        DeleteOutcome::Raced
    );
    assert!(
        f.tracer().hook.borrow().is_none(),
        "the insert ran inside the delete"
    );
    assert_eq!(
        block_on(c.fabric(), c.get(b"k", &stats)).unwrap(),
        Some(b"new".to_vec())
    );
}
