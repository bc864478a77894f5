//! Online repair of a memory node that lost its memory (issue 12, item 3), on shared
//! memory: the rebuilt node must hold every acknowledged write — including those that
//! only the lost node and one other had — so that losing *another* node afterwards
//! loses nothing; and clients that run through the loss and the repair must keep
//! working and pick the node up without restarting.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use swarm_core::encoding::{Flag, Timestamp, Tsp, WriterId};
use swarm_core::fabric::{Crash, FailNodes};
use swarm_core::{Batch, Fabric, NodeId, OpStats, UNOWNED_TOMBSTONE, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::ShmStore;
use swarm_kv::Store;
use swarm_kv::admin::{RepairError, RepairOptions};
use swarm_kv::{DeleteOutcome, KvError};
use swarm_shm::{ScratchDir, ShmCluster};

fn params() -> ClusterParams {
    ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        ..ClusterParams::default()
    }
}

const NO_WAIT: RepairOptions = RepairOptions {
    quiesce_ns: Some(0),
    replace: false,
    ..RepairOptions::DEFAULT
};

fn get(store: &ShmStore, key: &str) -> Option<Vec<u8>> {
    let c = store.client().unwrap();
    let value = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
    c.close();
    value
}

/// Writes acknowledged by `{0, 1}` only (node 2 crashed for the writer), then later
/// ones by `{1, 2}` only (node 0 crashed for the writer); node 1 lost and rebuilt from
/// nodes 0 and 2; then `lose` (0 or 2) lost too: the two nodes left hold every
/// acknowledged write, delete and update, so the rebuilt node must have merged both
/// donors (newest value of each word), not copied one.
fn rebuilt_node_restores_what_only_it_and_one_other_held(lose: u16) {
    let dir = ScratchDir::new("kv-repair-quorum").unwrap();
    let mut expected: HashMap<String, Option<Vec<u8>>> = HashMap::new();
    {
        let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
        let s = OpStats::new;
        // Phase A on {0, 1}.
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(2));
        for i in 0..150 {
            let key = format!("k{i}");
            block_on(
                f,
                c.insert(key.as_bytes(), format!("v{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("v{i}").into_bytes()));
        }
        for i in (1..150).step_by(7) {
            let key = format!("k{i}");
            assert_eq!(
                block_on(f, c.delete(key.as_bytes(), &s())).unwrap(),
                DeleteOutcome::Removed
            );
            expected.insert(key, None);
        }
        c.close();
        // Phase B on {1, 2}: newer values of some keys, deletes, new keys.
        let c = store.client().unwrap();
        let f = c.fabric();
        f.fail_node(NodeId(0));
        for i in (0..150).step_by(3) {
            let key = format!("k{i}");
            block_on(
                f,
                c.insert(key.as_bytes(), format!("u{i}").as_bytes(), &s()),
            )
            .unwrap();
            expected.insert(key, Some(format!("u{i}").into_bytes()));
        }
        for i in (2..150).step_by(5) {
            let key = format!("k{i}");
            block_on(f, c.delete(key.as_bytes(), &s())).unwrap();
            expected.insert(key, None);
        }
        for i in 0..50 {
            let key = format!("n{i}");
            block_on(f, c.insert(key.as_bytes(), b"new", &s())).unwrap();
            expected.insert(key, Some(b"new".to_vec()));
        }
        c.close();
    }
    // Node 1's memory is lost (every mapper sees it crashed, openers refuse it).
    assert!(ShmCluster::retire_node(dir.path(), 1).unwrap());
    let degraded = ShmStore::open(dir.path()).unwrap();
    assert_eq!(degraded.unusable_nodes().len(), 1);
    let report = ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}).unwrap();
    assert_eq!(report.node, 1);
    assert_eq!(
        report.epoch, 3,
        "created at epoch 1, announced at 2, admitted at 3"
    );
    assert_eq!(report.conflicts.total(), 0, "{report:?}");
    let repaired = ShmStore::open(dir.path()).unwrap();
    assert!(
        repaired.unusable_nodes().is_empty(),
        "{:?}",
        repaired.unusable_nodes()
    );
    assert!(matches!(
        ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}),
        Err(KvError::Repair(RepairError::AlreadyMember { .. }))
    ));

    // Now another node goes: the rebuilt one and the last one must hold everything.
    ShmCluster::retire_node(dir.path(), lose).unwrap();
    let survivors = ShmStore::open(dir.path()).unwrap();
    assert_eq!(survivors.unusable_nodes()[0].0, NodeId(lose));
    let c = survivors.client().unwrap();
    let mut wrong = Vec::new();
    for (key, value) in &expected {
        let got = block_on(c.fabric(), c.get(key.as_bytes(), &OpStats::new())).unwrap();
        if &got != value {
            wrong.push(format!("{key}: {got:?}, expected {value:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys wrong after losing node {lose}, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    // And the store takes new writes on them.
    block_on(c.fabric(), c.insert(b"after", b"x", &OpStats::new())).unwrap();
    c.close();
    assert_eq!(get(&survivors, "after"), Some(b"x".to_vec()));
}

#[test]
fn a_rebuilt_node_then_the_loss_of_node_0() {
    rebuilt_node_restores_what_only_it_and_one_other_held(0);
}

#[test]
fn a_rebuilt_node_then_the_loss_of_node_2() {
    rebuilt_node_restores_what_only_it_and_one_other_held(2);
}

/// A client keeps writing through the loss of node 1 and its repair (with the real
/// quiescence wait): no operation fails, it admits the rebuilt node without
/// restarting, and after node 0 is lost too every acknowledged write is there.
#[test]
fn clients_run_through_a_loss_and_an_online_repair() {
    let dir = ScratchDir::new("kv-repair-online").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    const KEYS: usize = 64;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writer = {
        let (store, stop, done) = (store.clone(), Arc::clone(&stop), Arc::clone(&done));
        std::thread::spawn(move || {
            let c = store.client().unwrap();
            let mut last: Vec<Option<u64>> = vec![None; KEYS];
            let mut failures = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = (n as usize) % KEYS;
                let key = format!("k{k}");
                let value = format!("v{n}");
                let s = OpStats::new();
                // Inserts the first time round, updates then (an insert over an existing
                // key writes a fresh register first, whose slot is only freed once the
                // register is recycled, after the cache lifetime).
                let result = if (n as usize) < KEYS {
                    block_on(c.fabric(), c.insert(key.as_bytes(), value.as_bytes(), &s)).map(drop)
                } else {
                    block_on(c.fabric(), c.update(key.as_bytes(), value.as_bytes(), &s)).map(drop)
                };
                match result {
                    Ok(()) => last[k] = Some(n),
                    Err(e) => failures.push(format!("op {n}: {e}")),
                }
                n += 1;
                done.store(n, Ordering::Relaxed);
            }
            (last, failures)
        })
    };
    let wait_ops = |more: u64| {
        let target = done.load(Ordering::Relaxed) + more;
        let start = Instant::now();
        while done.load(Ordering::Relaxed) < target {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the writer stalled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_ops(500);
    ShmCluster::retire_node(dir.path(), 1).unwrap();
    wait_ops(500);
    let report = ShmStore::repair(dir.path(), 1, RepairOptions::default(), |_, _| {}).unwrap();
    assert!(report.quiesce_ms >= 2_000, "{report:?}");
    // The running client follows the new configuration within a renewal period.
    let start = Instant::now();
    let new = ShmCluster::open(dir.path())
        .unwrap()
        .incarnation_of(NodeId(1))
        .unwrap();
    while store.shm().incarnation_of(NodeId(1)) != Some(new) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the client never admitted node 1"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_ops(500);
    stop.store(true, Ordering::Relaxed);
    let (last, failures) = writer.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} operations failed, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );

    ShmCluster::retire_node(dir.path(), 0).unwrap();
    let survivors = ShmStore::open(dir.path()).unwrap();
    for (k, n) in last.iter().enumerate() {
        let want = n.map(|n| format!("v{n}").into_bytes());
        assert_eq!(get(&survivors, &format!("k{k}")), want, "k{k}");
    }
}

/// A second failure during the repair: donor node 2 fails in the middle of node 1's
/// copy. The repair stops with `RepairError::Donor` and admits nothing (node 1 stays
/// out, clients serve from nodes 0 and 2 and do not read the half-copied node), and
/// withdraws its announcement on the donor that answers (the repairing bit clear at
/// a newer epoch, which a majority's newest copy shows); once node 2 answers again,
/// the repair runs again (on a fresh file), admits the node, and the rebuilt node
/// then holds every key alone with node 2 (node 0 lost).
#[test]
fn a_donor_failing_during_the_copy_stops_the_repair_and_a_second_repair_admits_the_node() {
    let dir = ScratchDir::new("kv-repair-donor-lost").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    let c = store.client().unwrap();
    for i in 0..200 {
        let key = format!("k{i}");
        block_on(c.fabric(), c.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
    }
    c.close();
    ShmStore::replace_node_file(dir.path(), 1).unwrap();

    // The copy's fabric loses node 2 after the first piece.
    let raw = Arc::new(ShmCluster::open_quietly(dir.path()).unwrap());
    let incarnation = raw.incarnation_of(NodeId(1)).expect("node 1's new file");
    let fabric = FailNodes::new(raw.client());
    let mut pieces = 0;
    let failed = block_on(
        &fabric,
        swarm_kv::testing::repair_node(
            &fabric,
            store.layout(),
            NodeId(1),
            incarnation,
            NO_WAIT,
            |_, _| {
                pieces += 1;
                fabric.fail_node_as(NodeId(2), Crash::Erroring);
            },
        ),
    );
    assert!(
        matches!(
            failed,
            Err(RepairError::Donor {
                node: NodeId(2),
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(
        pieces, 1,
        "the repair stopped at the first piece after the failure"
    );
    let config = swarm_kv::testing::read_configuration(&raw.client()).unwrap();
    assert!(!config.admits(1, incarnation), "{config:?}");
    assert!(!config.is_repairing(1), "withdrawn: {config:?}");
    drop(raw);
    // Clients serve without the half-copied node.
    assert_eq!(get(&store, "k7"), Some(b"v".to_vec()));

    // Node 2 answers again: the repair runs again and admits node 1.
    let report = ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}).unwrap();
    assert!(report.bytes > 0);
    let raw = Arc::new(ShmCluster::open_quietly(dir.path()).unwrap());
    let config = swarm_kv::testing::read_configuration(&raw.client()).unwrap();
    // The half-copied file was left out when the store opened: the second repair
    // rebuilt a fresh one.
    let rebuilt = raw.incarnation_of(NodeId(1)).expect("node 1's file");
    assert!(config.admits(1, rebuilt), "{config:?}");
    assert!(!config.admits(1, incarnation), "{config:?}");
    assert!(!config.is_repairing(1), "{config:?}");
    drop(raw);

    ShmStore::replace_node_file(dir.path(), 0).unwrap();
    let store = ShmStore::open(dir.path()).unwrap();
    for i in 0..200 {
        assert_eq!(get(&store, &format!("k{i}")), Some(b"v".to_vec()), "k{i}");
    }
}

/// Records each event's message and whether a span named `repair` was in scope.
struct SpanScopes(Arc<std::sync::Mutex<Vec<(String, bool)>>>);

impl<S> tracing_subscriber::Layer<S> for SpanScopes
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        let in_repair = ctx
            .event_scope(event)
            .is_some_and(|mut scope| scope.any(|span| span.name() == "repair"));
        self.0.lock().unwrap().push((message, in_repair));
    }
}

/// The repair's `repair` span labels the repair's own log lines only: another task
/// polled on the same thread while the repair waits (a client of the same process)
/// logs outside it. (A span entered across an await stays entered while the thread
/// polls everything else.)
#[test]
fn the_repair_span_labels_only_the_repairs_own_events() {
    use tracing_subscriber::layer::SubscriberExt;

    let dir = ScratchDir::new("kv-repair-span").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    let c = store.client().unwrap();
    block_on(c.fabric(), c.insert(b"k", b"v", &OpStats::new())).unwrap();
    c.close();
    ShmStore::replace_node_file(dir.path(), 1).unwrap();
    let raw = Arc::new(ShmCluster::open_quietly(dir.path()).unwrap());
    let incarnation = raw.incarnation_of(NodeId(1)).expect("node 1's new file");
    let fabric = raw.client();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(SpanScopes(events.clone()));
    let options = RepairOptions {
        quiesce_ns: Some(2_000_000),
        replace: false,
        ..RepairOptions::DEFAULT
    };
    tracing::subscriber::with_default(subscriber, || {
        block_on(&fabric, async {
            let repair = swarm_kv::testing::repair_node(
                &fabric,
                store.layout(),
                NodeId(1),
                incarnation,
                options,
                |_, _| {},
            );
            let other = async {
                for _ in 0..100 {
                    tracing::info!("another task");
                    swarm_core::yield_now(&fabric).await;
                }
            };
            let (report, ()) = swarm_core::join(repair, other).await;
            report
        })
        .expect("the repair completes");
    });
    let events = events.lock().unwrap();
    let scope = |message: &str| {
        let scopes: Vec<bool> = events
            .iter()
            .filter(|(m, _)| m == message)
            .map(|(_, in_repair)| *in_repair)
            .collect();
        assert!(!scopes.is_empty(), "no event {message:?}: {events:?}");
        scopes
    };
    assert!(scope("repair announced").iter().all(|&s| s));
    assert!(scope("memory node rebuilt and admitted").iter().all(|&s| s));
    let other = scope("another task");
    assert!(
        other.iter().all(|&s| !s),
        "{} of {} events of another task were logged in the repair's span",
        other.iter().filter(|&&s| s).count(),
        other.len()
    );
}

/// The word at `at` on `node`, read through `fabric` (which completes at once).
fn word_on(fabric: &impl Fabric, node: u16, at: u64) -> u64 {
    let ticket = fabric.post(NodeId(node), Batch::read(at, 8));
    let std::task::Poll::Ready(Ok(read)) = fabric.poll(ticket) else {
        panic!("a read of node {node} did not complete")
    };
    u64::from_le_bytes(read.read(0).unwrap().try_into().unwrap())
}

/// A register whose donors hold different first tombstones in its delete word (each
/// writer's delete came first on one of them) is rebuilt with the unowned tombstone
/// (`repair::merge::delete_word`): which delete came first on the lost node is
/// unknown, so no writer may count it as its own. One where they agree keeps theirs.
#[test]
fn a_delete_word_the_donors_disagree_on_is_rebuilt_unowned() {
    let dir = ScratchDir::new("kv-repair-delete-word").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    let tomb = |writer| {
        Tsp::new(
            Timestamp::tombstone(WriterId::new(writer).unwrap()),
            Flag::Verified,
        )
        .word()
    };
    let delete_word = |r: u64| {
        let layout = store.layout();
        layout.swarm.delete_word_addr(layout.register(r).unwrap())
    };
    let (disagree, agree) = (3, 4);
    {
        let raw = Arc::new(ShmCluster::open_quietly(dir.path()).unwrap());
        let fabric = raw.client();
        for (node, writer) in [(0, 1), (2, 2)] {
            let ticket = fabric.post(
                NodeId(node),
                Batch::cas(delete_word(disagree), 0, tomb(writer)),
            );
            assert!(fabric.poll(ticket).is_ready());
            let ticket = fabric.post(NodeId(node), Batch::cas(delete_word(agree), 0, tomb(5)));
            assert!(fabric.poll(ticket).is_ready());
        }
    }
    ShmStore::replace_node_file(dir.path(), 1).unwrap();
    ShmStore::repair(dir.path(), 1, NO_WAIT, |_, _| {}).unwrap();
    let raw = Arc::new(ShmCluster::open_quietly(dir.path()).unwrap());
    let fabric = raw.client();
    assert_eq!(
        Tsp::from_word(word_on(&fabric, 1, delete_word(disagree))),
        UNOWNED_TOMBSTONE,
        "donors held writer 1's and writer 2's tombstones"
    );
    assert_eq!(word_on(&fabric, 1, delete_word(agree)), tomb(5));
    assert_eq!(
        word_on(&fabric, 0, delete_word(disagree)),
        tomb(1),
        "donors unchanged"
    );
}
