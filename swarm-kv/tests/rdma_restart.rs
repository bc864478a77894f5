//! A memory node that restarts with empty memory while a process has the store open
//! (issue 47, item 1), over emulated RDMA memory nodes behind the real bootstrap
//! (`swarm_rdma::emu::EmulatedMemnode`) and the real `RdmaStore`: a client made after
//! the restart must never use the restarted node as a replica. A writer on {A, X},
//! X restarted, then a client that can only reach {B, X} must not start (it would
//! register on {B, X}, which never saw the writer's row), and a read that can only
//! reach {B, X} must fail or find the write, never miss it. A process whose handle
//! reaches X only after the restart (it pins the new incarnation) learns from the
//! configuration, which `KvClient::connect` reads before registering, that X is out.
#![cfg(feature = "rdma")]

use std::sync::Arc;

use swarm_core::header::NodeHeader;
use swarm_core::{Fabric, NodeId, OpStats, block_on};
use swarm_kv::testing::{SUPERBLOCK_AT, SUPERBLOCK_BYTES};
use swarm_kv::{ClusterParams, KvClient, RdmaStore, Store, SystemClock};
use swarm_rdma::auth::Token;
use swarm_rdma::emu::{EmuOptions, EmuTransport, EmuWire, EmulatedMemnode};
use swarm_rdma::fabric::NodeStatus;

const NODE_BYTES: u64 = 16 << 20;
const KEYS: u32 = 8;
/// The incarnation node 2 runs at first, and after its restart.
const FIRST: u64 = 0xa2a2_0001;
const SECOND: u64 = 0xb2b2_0002;

fn header(node_id: u16) -> NodeHeader {
    NodeHeader {
        node_id,
        node_count: 3,
        size: NODE_BYTES,
        cluster_id: 0x5eed,
        epoch_unix_ns: swarm_kv::SystemClock::unix_ns(),
        tick_ns: 1000,
    }
}

/// Three emulated memory nodes (node 2 runs [`FIRST`]) and a store formatted on them.
fn start() -> (Vec<EmulatedMemnode>, RdmaStore<Arc<EmuTransport>>) {
    let (nodes, store, _) = start_with_wire();
    (nodes, store)
}

/// What a process needs to open its own handle on the emulated memory nodes.
type Access = (Arc<EmuWire>, Token);

/// [`start`], with the [`Access`] to the nodes.
fn start_with_wire() -> (Vec<EmulatedMemnode>, RdmaStore<Arc<EmuTransport>>, Access) {
    let wire = EmuWire::new();
    let token = Token::generate().unwrap();
    let first = header(0);
    let nodes: Vec<_> = (0..3u16)
        .map(|i| {
            let header = NodeHeader {
                node_id: i,
                ..first
            };
            EmulatedMemnode::start(
                wire.clone(),
                token.clone(),
                header,
                FIRST - 2 + u64::from(i),
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
        key_max: 32,
        value_max: 64,
        writers: 8,
        ..ClusterParams::default()
    };
    let store = RdmaStore::format_on(transport, params).expect("format");
    assert!(store.unusable_nodes().is_empty());
    (nodes, store, (wire, token))
}

/// Copies node 0's superblock area (parameters and configuration) onto node 2's
/// running memory, as a half-finished repair or an operator would leave it.
fn copy_superblock(nodes: &[EmulatedMemnode]) {
    let area = SUPERBLOCK_AT as usize..(SUPERBLOCK_AT + SUPERBLOCK_BYTES) as usize;
    let bytes = nodes[0]
        .memory()
        .unwrap()
        .with(|bytes| bytes[area.clone()].to_vec());
    nodes[2]
        .memory()
        .unwrap()
        .with(|to| to[area].copy_from_slice(&bytes));
}

fn restart_between_clients(copy: bool) {
    let (mut nodes, store) = start();
    // A client that cannot reach B: its writer row and its writes are on {A, X}.
    nodes[1].refuse_clients(true);
    let writer = store.client().expect("A and X are a majority");
    nodes[1].refuse_clients(false);
    let f = writer.fabric();
    assert_eq!(f.incarnations()[2], Some(FIRST));
    for i in 0..KEYS {
        let key = format!("k{i}");
        block_on(f, writer.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
    }
    // X restarts with empty memory while the process keeps the store open.
    nodes[2].restart(SECOND).unwrap();
    if copy {
        copy_superblock(&nodes);
    }

    // A client made now that cannot reach A reaches {B, X}: X is not a member any
    // more, so it has no majority. Registering on {B, X} would find the live
    // writer's row free (B never saw it) and could take its writer id.
    nodes[0].refuse_clients(true);
    match store.client() {
        Err(_) => {}
        Ok(reader) => panic!(
            "a client made after X restarted registered on {{B, X}} as writer {} (the live \
             writer is {}): the restarted node served as a replica",
            reader.writer(),
            writer.writer()
        ),
    }
    nodes[0].refuse_clients(false);

    // A client that reaches {A, B, X} and then loses A: a read can only reach
    // {B, X}. It must fail or find the write, never miss it.
    let reader = store.client().expect("A and B are a majority");
    let f = reader.fabric();
    f.retire(NodeId(0));
    for i in 0..KEYS {
        let key = format!("k{i}");
        let got = block_on(f, reader.get(key.as_bytes(), &OpStats::new()));
        assert!(
            got.as_ref()
                .map_or(true, |v| v.as_deref() == Some(&b"v"[..])),
            "{key}: read on {{B, X}} returned {got:?}: the restarted node served as a replica"
        );
    }
    // The restarted node is out for every new client, its old memory known lost,
    // and with A and B every write is there.
    let reader = store.client().unwrap();
    let f = reader.fabric();
    assert_ne!(f.node_status(NodeId(2)), NodeStatus::Live);
    assert!(f.memory_lost(NodeId(2), FIRST));
    for i in 0..KEYS {
        let key = format!("k{i}");
        assert_eq!(
            block_on(f, reader.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"v".to_vec()),
            "{key}"
        );
    }
    // Nothing was written to the restarted node (no writer row, no index).
    let touched = nodes[2].memory().unwrap().with(|bytes| {
        bytes[(SUPERBLOCK_AT + SUPERBLOCK_BYTES) as usize..]
            .iter()
            .any(|b| *b != 0)
    });
    assert!(!touched, "a client wrote to the restarted node");
}

#[test]
fn a_node_restarted_empty_between_two_clients_is_never_a_replica() {
    restart_between_clients(false);
}

#[test]
fn a_node_restarted_with_a_copied_superblock_between_two_clients_is_never_a_replica() {
    restart_between_clients(true);
}

/// A cluster handle made after X restarted (a process that connects a [`KvClient`]
/// on a fabric of its own, without `RdmaStore::open`'s check) pins X's new
/// incarnation: only the configuration, read by `KvClient::connect` before it
/// registers, tells it that X is not a member. With a copied superblock X looks like
/// a replica in every other respect.
#[test]
fn a_client_connected_on_a_fresh_handle_follows_the_configuration_before_registering() {
    let (mut nodes, store, (wire, token)) = start_with_wire();
    nodes[1].refuse_clients(true);
    let writer = store.client().expect("A and X are a majority");
    nodes[1].refuse_clients(false);
    for i in 0..KEYS {
        let key = format!("k{i}");
        block_on(
            writer.fabric(),
            writer.insert(key.as_bytes(), b"v", &OpStats::new()),
        )
        .unwrap();
    }
    nodes[2].restart(SECOND).unwrap();
    copy_superblock(&nodes);
    let fresh = || {
        let addrs = nodes.iter().map(EmulatedMemnode::addr).collect();
        let transport = Arc::new(EmuTransport::new(
            wire.clone(),
            addrs,
            token.clone(),
            EmuOptions::default(),
        ));
        let fabric = transport.client(7).expect("a fabric");
        let header = *store.header();
        let clock = SystemClock::new(header.epoch_unix_ns, header.tick_ns);
        (transport, fabric, clock)
    };

    // Only B and X reachable: registering there would take the live writer's id.
    nodes[0].refuse_clients(true);
    let (_transport, fabric, clock) = fresh();
    assert_eq!(
        fabric.incarnations()[2],
        Some(SECOND),
        "the handle pins X's new incarnation"
    );
    match KvClient::connect(fabric, clock, *store.layout(), store.config()) {
        Err(_) => {}
        Ok(reader) => panic!(
            "a client connected on a fresh handle registered on {{B, X}} as writer {} (the \
             live writer is {}): the restarted node served as a replica",
            reader.writer(),
            writer.writer()
        ),
    }
    nodes[0].refuse_clients(false);

    // Every node reachable: the client registers and operates on A and B only.
    let (_transport, fabric, clock) = fresh();
    let reader = KvClient::connect(fabric, clock, *store.layout(), store.config())
        .expect("A and B are a majority");
    assert_ne!(reader.writer(), writer.writer());
    let f = reader.fabric();
    assert_ne!(f.node_status(NodeId(2)), NodeStatus::Live);
    for i in 0..KEYS {
        let key = format!("k{i}");
        assert_eq!(
            block_on(f, reader.get(key.as_bytes(), &OpStats::new())).unwrap(),
            Some(b"v".to_vec()),
            "{key}"
        );
        let key = format!("new{i}");
        block_on(f, reader.insert(key.as_bytes(), b"w", &OpStats::new())).unwrap();
    }
    let touched = nodes[2].memory().unwrap().with(|bytes| {
        bytes[(SUPERBLOCK_AT + SUPERBLOCK_BYTES) as usize..]
            .iter()
            .any(|b| *b != 0)
    });
    assert!(!touched, "a client wrote to the restarted node");
}
