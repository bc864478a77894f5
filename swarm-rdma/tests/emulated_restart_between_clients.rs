//! A memory node that restarts with empty memory *between* two clients of one
//! cluster handle (issue 47, item 1): the second client's own bootstrap sees only the
//! new incarnation, so without the handle's pinned incarnations
//! (`swarm_rdma::fabric::reconnect::IncarnationPins`) it would take the empty node
//! as a replica. Emulated memory nodes behind the real bootstrap, as in
//! `tests/emulated_reconnect.rs`.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use swarm_core::fabric::{Batch, Completion, FabricError, Ticket};
use swarm_core::header::NodeHeader;
use swarm_core::{Fabric, NodeId};
use swarm_rdma::auth::Token;
use swarm_rdma::emu::{EmuOptions, EmuTransport, EmuWire, EmulatedMemnode};
use swarm_rdma::fabric::NodeStatus;
use swarm_rdma::{RdmaError, RdmaFabric};

const NODE_BYTES: u64 = 64 << 10;
const DATA: u64 = 8192;
const NODE: NodeId = NodeId(2);
const FIRST: u64 = 0xa2a2_0001;
const SECOND: u64 = 0xb2b2_0002;

type Client = RdmaFabric<EmuTransport>;

fn header(node_id: u16) -> NodeHeader {
    NodeHeader {
        node_id,
        node_count: 3,
        size: NODE_BYTES,
        cluster_id: 0x5eed,
        epoch_unix_ns: 1_700_000_000_000_000_000,
        tick_ns: 1000,
    }
}

fn start() -> (Vec<EmulatedMemnode>, Arc<EmuTransport>) {
    let wire = EmuWire::new();
    let token = Token::generate().unwrap();
    let nodes: Vec<_> = (0..3u16)
        .map(|i| {
            EmulatedMemnode::start(
                wire.clone(),
                token.clone(),
                header(i),
                FIRST - 2 + u64::from(i),
            )
            .expect("emulated memory node starts")
        })
        .collect();
    let addrs = nodes.iter().map(EmulatedMemnode::addr).collect();
    let transport = Arc::new(EmuTransport::new(wire, addrs, token, EmuOptions::default()));
    (nodes, transport)
}

fn wait(fabric: &Client, ticket: Ticket) -> Result<Completion, FabricError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Poll::Ready(result) = fabric.poll(ticket) {
            return result;
        }
        fabric.progress();
        assert!(Instant::now() < deadline, "batch did not complete in 10 s");
    }
}

fn write(fabric: &Client, node: NodeId, word: u64) -> Result<(), FabricError> {
    let batch = Batch::write(DATA, word.to_le_bytes().to_vec());
    wait(fabric, fabric.post(node, batch)).map(|_| ())
}

/// Drives `fabric` until `node` has the status `wanted` (10 s at most).
fn wait_status(fabric: &Client, node: NodeId, wanted: NodeStatus) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fabric.node_status(node) != wanted {
        assert!(
            Instant::now() < deadline,
            "node {node} did not become {wanted:?} in 10 s (it is {:?})",
            fabric.node_status(node)
        );
        fabric.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_client_made_after_a_node_restarted_empty_leaves_it_out() {
    let (mut nodes, transport) = start();
    let first = transport.client(1).expect("a majority is reachable");
    assert_eq!(first.incarnations()[2], Some(FIRST));
    write(&first, NODE, 0x1111).unwrap();

    nodes[2].restart(SECOND).unwrap();
    let fresh = nodes[2].memory().unwrap().clone();

    // The second client reaches the restarted node, but the cluster handle knows
    // its memory is not the one the first client wrote to.
    let second = transport
        .client(2)
        .expect("the other two nodes are a majority");
    assert_eq!(
        second.node_status(NODE),
        NodeStatus::Retired,
        "a new client took the restarted, empty node as a replica"
    );
    assert!(second.memory_lost(NODE, FIRST));
    assert!(!second.memory_lost(NODE, SECOND));
    assert!(write(&second, NODE, 0x2222).is_err());
    for other in [NodeId(0), NodeId(1)] {
        write(&second, other, 0x0707).expect("the other nodes serve");
    }
    let untouched = fresh.with(|bytes| {
        bytes[swarm_core::header::ENCODED_LEN..]
            .iter()
            .all(|b| *b == 0)
    });
    assert!(untouched, "a client wrote to the restarted node");

    // A configuration change that admits the new incarnation (after a repair) puts
    // it back, and moves the pin: a third client uses it from the start.
    assert!(second.admit(NODE, SECOND));
    wait_status(&second, NODE, NodeStatus::Live);
    write(&second, NODE, 0x3333).expect("the admitted node serves");
    let third = transport.client(3).expect("all nodes are reachable");
    assert_eq!(third.node_status(NODE), NodeStatus::Live);
    assert_eq!(third.incarnations()[2], Some(SECOND));
}

#[test]
fn a_majority_restarted_since_the_first_client_leaves_no_majority() {
    let (mut nodes, transport) = start();
    drop(transport.client(1).expect("a majority is reachable"));
    nodes[1].restart(SECOND).unwrap();
    nodes[2].restart(SECOND + 1).unwrap();
    match transport.client(2) {
        Err(RdmaError::NoMajority { live: 1, .. }) => {}
        other => panic!("expected no majority, got {other:?}"),
    }
}
