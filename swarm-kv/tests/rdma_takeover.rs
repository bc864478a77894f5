//! Over RDMA, a writer id is taken over only once every memory node has cut its
//! earlier owner (issue 43: safety for a client paused at any instruction for any
//! time). Emulated memory nodes behind the real bootstrap
//! (`swarm_rdma::emu::EmulatedMemnode`), the real `RdmaStore` and `RdmaFabric`.
//!
//! Client A holds the only writer id. It is "paused" with stores queued on its queue
//! pairs, unexecuted (an emulated NIC that holds them, as a requester asleep on a
//! request, or a process stopped right after posting). Its lease lapses; client B
//! finds every writer id taken, watches, kills A's lease and takes the id over. The
//! memory nodes' lease watch polls once an hour here, so the kill and the takeover
//! fall within one watch period: only the revocation the takeover waits for can cut
//! A in time. Then A's held stores are released. They must not land: the memory
//! node destroyed A's queue pairs before it acknowledged, so nothing executes them.
//! And A's reconnects must be refused for good, whatever its lease word holds later.
#![cfg(feature = "rdma")]

use std::sync::Arc;
use std::time::Duration;

use swarm_core::header::NodeHeader;
use swarm_core::{Batch, Fabric, NodeId, OpStats, block_on};
use swarm_kv::{ClusterParams, RdmaStore, Store};
use swarm_rdma::auth::Token;
use swarm_rdma::bootstrap::ServerLimits;
use swarm_rdma::emu::{EmuOptions, EmuTransport, EmuWire, EmulatedMemnode, Mode};
use swarm_rdma::fabric::NodeStatus;

const NODE_BYTES: u64 = 16 << 20;
const MS: u64 = 1_000_000;
/// What A's held stores write into its row's owner-identity word (word 2), which B
/// owns once it took the id over.
const MARKER: u64 = 0x0bad_5eed_0bad_5eed;

fn header(node_id: u16, epoch_unix_ns: u64) -> NodeHeader {
    NodeHeader {
        node_id,
        node_count: 3,
        size: NODE_BYTES,
        cluster_id: 0x7a4e,
        epoch_unix_ns,
        tick_ns: 1000,
    }
}

/// Three emulated memory nodes whose lease watch polls every `watch_period`, and a
/// store with one writer id and short leases formatted on them.
fn start(watch_period: Duration) -> (Vec<EmulatedMemnode>, RdmaStore<Arc<EmuTransport>>) {
    let (nodes, store, _) = start_with_access(watch_period);
    (nodes, store)
}

/// What a process needs to open its own handle on the emulated memory nodes.
type Access = (Arc<EmuWire>, Token);

/// [`start`], with the [`Access`] to the nodes.
fn start_with_access(
    watch_period: Duration,
) -> (Vec<EmulatedMemnode>, RdmaStore<Arc<EmuTransport>>, Access) {
    let wire = EmuWire::new();
    let token = Token::generate().unwrap();
    let limits = ServerLimits {
        handshake_deadline: Duration::from_secs(2),
        watch_period,
        ..ServerLimits::default()
    };
    let epoch = swarm_kv::SystemClock::unix_ns();
    let nodes: Vec<_> = (0..3u16)
        .map(|i| {
            EmulatedMemnode::start_with_limits(
                wire.clone(),
                token.clone(),
                header(i, epoch),
                0x7a4e_0000 + u64::from(i),
                limits,
            )
            .expect("emulated memory node starts")
        })
        .collect();
    let addrs = nodes.iter().map(EmulatedMemnode::addr).collect();
    let transport = Arc::new(EmuTransport::new(
        wire.clone(),
        addrs,
        token.clone(),
        EmuOptions::default(),
    ));
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 1,
        lease_ns: 300 * MS,
        lease_renew_ns: 50 * MS,
        max_op_ns: 100 * MS,
        cache_ttl_ns: 20 * MS,
        ..ClusterParams::default()
    };
    let store = RdmaStore::format_on(transport, params).expect("format");
    (nodes, store, (wire, token))
}

/// A handle of its own on `nodes` (another process's), opening the store there.
fn open_handle(nodes: &[EmulatedMemnode], (wire, token): &Access) -> RdmaStore<Arc<EmuTransport>> {
    let addrs = nodes.iter().map(EmulatedMemnode::addr).collect();
    let transport = Arc::new(EmuTransport::new(
        wire.clone(),
        addrs,
        token.clone(),
        EmuOptions::default(),
    ));
    RdmaStore::open_on(transport).expect("the store opens")
}

fn word_at(node: &EmulatedMemnode, addr: u64) -> u64 {
    let at = addr as usize;
    node.memory()
        .expect("the node runs")
        .with(|bytes| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()))
}

/// A's stores of [`MARKER`] at `identity`, whose outcomes are `results`, failed and
/// landed on no node.
fn assert_nothing_landed(nodes: &[EmulatedMemnode], identity: u64, results: &[bool]) {
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(
            word_at(node, identity),
            MARKER,
            "A's store landed on node {i} after B took its writer id over"
        );
    }
    assert_eq!(
        results, [false; 3],
        "A's stores completed after the takeover"
    );
}

fn held_stores_of_a_taken_over_owner_never_land(watch_period: Duration) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (nodes, store) = start(watch_period);
    let a = store.client().expect("A registers");
    assert_eq!(a.writer(), 0, "the only writer id");
    block_on(a.fabric(), a.insert(b"k", b"v", &OpStats::new())).expect("A inserts");
    let identity = store.layout().client_row(0) + 16;

    // A is paused with one store per node queued on its queue pairs, unexecuted.
    let f = a.fabric();
    f.with_nic(|nic| (0..3).for_each(|i| nic.set_mode(i, Mode::Silent)));
    let tickets: Vec<_> = (0..3u16)
        .map(|i| {
            f.post(
                NodeId(i),
                Batch::write(identity, MARKER.to_le_bytes().to_vec()),
            )
        })
        .collect();
    for _ in 0..10 {
        f.progress();
    }
    f.with_nic(|nic| {
        for i in 0..3 {
            assert!(nic.qp(i).queued() > 0, "A's store to node {i} is held");
        }
    });

    // B finds the writer id taken, waits out A's lease, kills it and takes it over.
    let b = store.client().expect("B takes the writer id over");
    assert_eq!(b.writer(), 0, "B took A's writer id");
    let owner = word_at(&nodes[0], identity);
    assert_ne!(owner, MARKER);

    // A runs again: its held stores are released.
    f.with_nic(|nic| (0..3).for_each(|i| nic.set_mode(i, Mode::Up)));
    let mut results = Vec::new();
    for ticket in tickets {
        let result = loop {
            f.progress();
            if let std::task::Poll::Ready(result) = f.poll(ticket) {
                break result;
            }
        };
        results.push(result.is_ok());
    }
    assert_nothing_landed(&nodes, identity, &results);
    // A's reconnects are refused for good: the nodes never fence its generation
    // again, whatever its lease word holds now (B's counters).
    let started = std::time::Instant::now();
    while (0..3u16).any(|i| f.node_status(NodeId(i)) != NodeStatus::Retired) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "A's reconnects were not all refused: {:?}",
            (0..3u16)
                .map(|i| f.node_status(NodeId(i)))
                .collect::<Vec<_>>()
        );
        f.progress();
        // B is not paused: it keeps driving its own queue pairs (emulated requests
        // execute only while their client polls).
        b.fabric().progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    // B works on.
    block_on(b.fabric(), b.insert(b"k2", b"w", &OpStats::new())).expect("B inserts");
    assert_eq!(
        block_on(b.fabric(), b.get(b"k", &OpStats::new())).expect("B reads"),
        Some(b"v".to_vec())
    );
}

/// The kill and the takeover within one period of the memory nodes' lease watch (it
/// polls once an hour): the watch never sees the kill, only the revocation cuts A.
#[test]
fn a_takeover_within_one_watch_period_waits_for_the_owner_to_be_cut() {
    held_stores_of_a_taken_over_owner_never_land(Duration::from_secs(3600));
}

/// The same with the memory nodes' default watch (every 10 ms), which cuts A once
/// its word is killed; without the revocation A's reconnects are served again once B
/// renewed over the kill (the word is no longer killed), and A is back in service.
#[test]
fn a_takeover_with_the_default_watch_waits_for_the_owner_to_be_cut() {
    held_stores_of_a_taken_over_owner_never_land(ServerLimits::default().watch_period);
}

/// A client's fabric on the emulated nodes.
type EmuFabric = <RdmaStore<Arc<EmuTransport>> as Store>::Fabric;

/// B's fabric, which runs `hook` once, right after the first revocation it asked for
/// was acknowledged: what a client paused anywhere in its own registration does while
/// B is between its revocation and its claim.
struct Hooked {
    inner: EmuFabric,
    hook: std::cell::RefCell<Option<Box<dyn FnOnce()>>>,
}

impl Fabric for Hooked {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> swarm_core::fabric::Ticket {
        self.inner.post(node, batch)
    }
    fn poll(
        &self,
        ticket: swarm_core::fabric::Ticket,
    ) -> std::task::Poll<Result<swarm_core::Completion, swarm_core::FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: swarm_core::fabric::Ticket) {
        self.inner.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> swarm_core::fabric::Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: swarm_core::fabric::Nanos) {
        self.inner.wake_at(deadline)
    }
    fn admit(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.admit(node, incarnation)
    }
    fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        self.inner.memory_lost(node, incarnation)
    }
    fn fence_owner(&self, fence: swarm_core::fabric::OwnerFence) -> usize {
        self.inner.fence_owner(fence)
    }
    fn revoke_owner(&self, lease_word: u64, floor: u64) -> swarm_core::fabric::Revocation {
        let revocation = self.inner.revoke_owner(lease_word, floor);
        if revocation == swarm_core::fabric::Revocation::Acknowledged
            && let Some(hook) = self.hook.borrow_mut().take()
        {
            hook();
        }
        revocation
    }
}

/// One roundtrip of `batch` to each node on `f`; the completions, by node.
fn each_node(f: &EmuFabric, batch: impl Fn() -> Batch) -> Vec<swarm_core::Completion> {
    (0..3u16)
        .map(|i| {
            block_on(f, async {
                let stats = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(f, &stats);
                rt.post(NodeId(i), batch()).expect("posted");
                rt.wait(1).await.expect("answered");
                Ok::<_, swarm_core::FabricError>(rt.replies()[0].1.clone())
            })
            .expect("the node answers")
        })
        .collect()
}

/// A registration paused before its fence must not outlive a takeover (issue 43,
/// "a client paused inside its own registration"). A claims the only writer id
/// and pauses before it reads its row. B waits out the lease, kills it (A never
/// renewed: the word is the free row's 0) and revokes it: nothing is fenced under
/// it yet, so every node acknowledges at once. Then, before B's claim CAS, A runs
/// again: it reads the killed word, takes the kill for an earlier owner's (its
/// generation base is above it), renews over it (its claim still holds) and fences
/// itself with that base, above the floor the nodes acknowledged. B takes the id
/// over. A store A posts then must not land: B revokes A's generation again once
/// its claim landed, up to the counter A renewed to.
#[test]
fn a_registration_paused_before_its_fence_is_revoked_with_its_renewal() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (nodes, store) = start(Duration::from_secs(3600));
    let row = store.layout().client_row(0);
    let lease_word = row + 8;
    let identity = row + 16;
    const TOKEN_A: u64 = 0x00a0_00a0_00a0_00a1;

    // A claims the row on every node, and pauses.
    let a = std::rc::Rc::new(store.fabric().expect("A's fabric"));
    for c in each_node(&a, || Batch::cas(row, 0, TOKEN_A)) {
        assert_eq!(c.cas(0), Some(0), "the row was free");
    }

    // A's registration goes on while B is between its revocation and its claim.
    let fenced = std::rc::Rc::new(std::cell::Cell::new(usize::MAX));
    let hook = {
        let (a, fenced) = (a.clone(), fenced.clone());
        move || {
            let seen: Vec<u64> = each_node(&a, || Batch::read(lease_word, 8))
                .iter()
                .map(|c| u64::from_le_bytes(c.read(0).unwrap().try_into().unwrap()))
                .collect();
            assert!(
                seen.iter().all(|w| w >> 63 == 1),
                "B killed the lease: {seen:?}"
            );
            let base = seen.iter().map(|w| w & !(1 << 63)).max().unwrap() + 1;
            for (i, c) in each_node(&a, || {
                let mut batch = Batch::cas(lease_word, seen[0], base);
                batch
                    .push(swarm_core::Op::Read { addr: row, len: 8 })
                    .unwrap();
                batch
            })
            .iter()
            .enumerate()
            {
                assert_eq!(
                    c.cas(0),
                    Some(seen[i]),
                    "A renewed over the kill on node {i}"
                );
                let claim = u64::from_le_bytes(c.read(1).unwrap().try_into().unwrap());
                assert_eq!(claim, TOKEN_A, "A's renewal counts on node {i}");
            }
            let count = a.fence_owner(swarm_core::fabric::OwnerFence {
                lease_word,
                stall_ns: 3_600_000_000_000,
                base,
            });
            fenced.set(count);
        }
    };
    let b_fabric = Hooked {
        inner: store.fabric().expect("B's fabric"),
        hook: std::cell::RefCell::new(Some(Box::new(hook))),
    };
    let clock = swarm_kv::SystemClock::new(store.header().epoch_unix_ns, store.header().tick_ns);
    let b = swarm_kv::KvClient::connect(b_fabric, clock, *store.layout(), store.config())
        .expect("B takes the writer id over");
    assert_eq!(b.writer(), 0);
    assert_eq!(
        fenced.get(),
        3,
        "A fenced itself on every node before B's claim"
    );

    // A stores into the row it believes it holds.
    let results: Vec<bool> = (0..3u16)
        .map(|i| {
            block_on(a.as_ref(), async {
                let stats = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(a.as_ref(), &stats);
                rt.post(
                    NodeId(i),
                    Batch::write(identity, MARKER.to_le_bytes().to_vec()),
                )?;
                rt.wait(1).await
            })
            .is_ok()
        })
        .collect();
    assert_nothing_landed(&nodes, identity, &results);
    // B works on.
    block_on(b.fabric(), b.insert(b"k2", b"w", &OpStats::new())).expect("B inserts");
}

/// A node rebuilt and admitted while the reclaimer's handle holds its old memory as
/// lost is asked too (issue 43, "a node rebuilt by a repair and admitted while the
/// reclaimer still holds it as lost"). B's handle is opened, then node 2 restarts
/// empty and is rebuilt (node 0's memory copied, a configuration admitting its new
/// incarnation written), as `swarm repair` leaves it. A opens a handle of its own,
/// registers the only writer id on all three nodes (fenced on the rebuilt one too)
/// and stops. B's fabric found node 2's pinned incarnation gone (lost) and admitted
/// the new one when it read the configuration; it takes A's id over. A's store to
/// the rebuilt node must not land: B revoked A there as well.
#[test]
fn a_rebuilt_node_the_reclaimer_admitted_is_asked_to_revoke_too() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (mut nodes, store, access) = start_with_access(Duration::from_secs(3600));
    const REBUILT: u64 = 0x7a4e_0b02;
    nodes[2].restart(REBUILT).expect("node 2 restarts empty");
    let from = swarm_kv::testing::SUPERBLOCK_AT as usize;
    let image = nodes[0]
        .memory()
        .unwrap()
        .with(|bytes| bytes[from..].to_vec());
    nodes[2]
        .memory()
        .unwrap()
        .with(|to| to[from..].copy_from_slice(&image));
    let at = swarm_kv::testing::CONFIG_AT as usize;
    let mut config = nodes[0].memory().unwrap().with(|bytes| {
        swarm_kv::testing::Configuration::decode(&bytes[at..]).expect("a configuration")
    });
    config.epoch += 1;
    config.incarnations[2] = REBUILT;
    let record = config.encode();
    for node in &nodes {
        node.memory()
            .unwrap()
            .with(|to| to[at..at + record.len()].copy_from_slice(&record));
    }

    // A, on a handle of its own made after the rebuild, holds the only writer id.
    let store_a = open_handle(&nodes, &access);
    let a = store_a.client().expect("A registers");
    assert_eq!(a.writer(), 0);
    assert_eq!(
        a.fabric().node_status(NodeId(2)),
        NodeStatus::Live,
        "A serves the rebuilt node"
    );
    block_on(a.fabric(), a.insert(b"k", b"v", &OpStats::new())).expect("A inserts");
    let identity = store.layout().client_row(0) + 16;
    // A's last batches (its background lease renewal) complete before it stops:
    // emulated requests run only while their client polls, and A's engine would
    // give up on a queue pair whose chain stayed in flight that long.
    let idle = std::time::Instant::now() + Duration::from_millis(50);
    while std::time::Instant::now() < idle {
        a.fabric().progress();
    }

    // B, on the handle opened before the rebuild, takes the id over.
    let b = store.client().expect("B takes the writer id over");
    assert_eq!(b.writer(), 0, "B took A's writer id");

    let f = a.fabric();
    let results: Vec<bool> = (0..3u16)
        .map(|i| {
            block_on(f, async {
                let stats = OpStats::new();
                let mut rt = swarm_core::Roundtrip::start(f, &stats);
                rt.post(
                    NodeId(i),
                    Batch::write(identity, MARKER.to_le_bytes().to_vec()),
                )?;
                rt.wait(1).await
            })
            .is_ok()
        })
        .collect();
    assert_nothing_landed(&nodes, identity, &results);
    block_on(b.fabric(), b.insert(b"k2", b"w", &OpStats::new())).expect("B inserts");
}

/// A node that restarted empty and was never rebuilt stalls no takeover (the
/// soft-RoCE flood step: every writer id stayed taken). Node 2 restarts empty; A
/// and B then open handles of their own, which find node 2's member incarnation
/// replaced (lost) and the node without a store. A holds the only writer id and
/// stops; B takes it over. Node 2 is not asked to revoke A: no client can have
/// fenced itself on memory that holds no store, and its old incarnation's queue
/// pairs died with its process.
#[test]
fn a_node_restarted_empty_and_never_rebuilt_stalls_no_takeover() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (mut nodes, _store, access) = start_with_access(Duration::from_secs(3600));
    nodes[2]
        .restart(0x7a4e_0e02)
        .expect("node 2 restarts empty");
    let store_a = open_handle(&nodes, &access);
    let a = store_a.client().expect("A registers");
    assert_eq!(a.writer(), 0);
    block_on(a.fabric(), a.insert(b"k", b"v", &OpStats::new())).expect("A inserts");
    let idle = std::time::Instant::now() + Duration::from_millis(50);
    while std::time::Instant::now() < idle {
        a.fabric().progress();
    }

    let store_b = open_handle(&nodes, &access);
    let started = std::time::Instant::now();
    let b = store_b.client().expect("B takes the writer id over");
    assert_eq!(b.writer(), 0, "B took A's writer id");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the takeover took {:?}",
        started.elapsed()
    );
    assert_eq!(
        block_on(b.fabric(), b.get(b"k", &OpStats::new())).expect("B reads"),
        Some(b"v".to_vec())
    );
}
