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
    let transport = Arc::new(EmuTransport::new(wire, addrs, token, EmuOptions::default()));
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
    (nodes, store)
}

fn word_at(node: &EmulatedMemnode, addr: u64) -> u64 {
    let at = addr as usize;
    node.memory()
        .expect("the node runs")
        .with(|bytes| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()))
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
    for (i, node) in nodes.iter().enumerate() {
        assert_ne!(
            word_at(node, identity),
            MARKER,
            "A's store landed on node {i} after B took its writer id over"
        );
    }
    assert_eq!(
        results,
        vec![false; 3],
        "A's held stores completed after the takeover"
    );
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
