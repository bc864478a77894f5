//! Incarnation checks and configuration changes of [`RdmaFabric`] without a device:
//! the real fabric (reconnects, [`Fabric::admit`], [`Fabric::memory_lost`]), the
//! real authenticated bootstrap on loopback TCP and the real planner and engine, over
//! the emulated verbs provider (`swarm_rdma::emu`). Memory nodes are
//! [`EmulatedMemnode`]s: stopping one destroys its clients' queue pairs and its
//! memory; restarting it serves zeroed memory under a new incarnation at the same
//! address, as `swarm memnode` does after a restart. `tests/device.rs` covers the
//! same paths over real verbs where a device exists.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use swarm_core::fabric::{Batch, Completion, FabricError, Ticket};
use swarm_core::header::NodeHeader;
use swarm_core::{Fabric, NodeId};
use swarm_rdma::RdmaFabric;
use swarm_rdma::auth::Token;
use swarm_rdma::emu::{EmuNode, EmuOptions, EmuTransport, EmuWire, EmulatedMemnode};
use swarm_rdma::fabric::NodeStatus;

/// Bytes of each node's memory.
const NODE_BYTES: u64 = 64 << 10;
/// Where the tests read and write, past the node header.
const DATA: u64 = 8192;
/// Node 2, the one that restarts.
const NODE: NodeId = NodeId(2);
/// The incarnations node 2 runs in turn: at first, after a restart, after another.
const FIRST: u64 = 0xa2a2_0001;
const SECOND: u64 = 0xb2b2_0002;
const THIRD: u64 = 0xc2c2_0003;

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

/// Three emulated memory nodes (node `i` first runs incarnation `FIRST - 2 + i`, so
/// node 2 runs [`FIRST`]) and how clients reach them.
struct Cluster {
    nodes: Vec<EmulatedMemnode>,
    transport: Arc<EmuTransport>,
}

impl Cluster {
    fn start() -> Self {
        let wire = EmuWire::new();
        let token = Token::generate().unwrap();
        let nodes: Vec<_> = (0..3u16)
            .map(|i| {
                let incarnation = FIRST - 2 + u64::from(i);
                EmulatedMemnode::start(wire.clone(), token.clone(), header(i), incarnation)
                    .expect("emulated memory node starts")
            })
            .collect();
        let addrs = nodes.iter().map(EmulatedMemnode::addr).collect();
        let transport = Arc::new(EmuTransport::new(wire, addrs, token, EmuOptions::default()));
        Self { nodes, transport }
    }

    fn client(&self) -> Client {
        self.transport.client(7).expect("a majority is reachable")
    }

    /// Node 2's memory in its running incarnation.
    fn memory(&self) -> Arc<EmuNode> {
        self.nodes[2].memory().expect("node 2 runs").clone()
    }

    fn restart(&mut self, incarnation: u64) {
        self.nodes[2].restart(incarnation).expect("node 2 restarts");
    }
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

fn read(fabric: &Client, node: NodeId) -> Result<u64, FabricError> {
    let completion = wait(fabric, fabric.post(node, Batch::read(DATA, 8)))?;
    let bytes = completion.read(0).expect("a read's output");
    Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
}

/// The word at [`DATA`] in `memory`.
fn word(memory: &EmuNode) -> u64 {
    memory.with(|bytes| {
        let at = DATA as usize;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    })
}

/// Whether `memory` holds nothing but its header: no client wrote to it.
fn untouched(memory: &EmuNode) -> bool {
    memory.with(|bytes| {
        bytes[swarm_core::header::ENCODED_LEN..]
            .iter()
            .all(|b| *b == 0)
    })
}

/// Drives `fabric` until `node` has the status `wanted`, posting a read to it now
/// and then (a failure is only noticed through a request).
fn wait_status(fabric: &Client, node: NodeId, wanted: NodeStatus) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probe = None;
    while fabric.node_status(node) != wanted {
        assert!(
            Instant::now() < deadline,
            "node {node} did not become {wanted:?} in 10 s (it is {:?})",
            fabric.node_status(node)
        );
        let ticket = *probe.get_or_insert_with(|| fabric.post(node, Batch::read(DATA, 8)));
        if fabric.poll(ticket).is_ready() {
            probe = None;
        }
        fabric.progress();
    }
    if let Some(ticket) = probe {
        fabric.forget(ticket);
    }
}

/// Drives `fabric` (no posts) for `duration`.
fn drive_for(fabric: &Client, duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        fabric.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The other two nodes serve whatever happens to node 2.
fn others_serve(fabric: &Client) {
    for other in [NodeId(0), NodeId(1)] {
        write(fabric, other, 0x0707).expect("the other nodes serve");
    }
}

#[test]
fn a_node_restarted_with_another_incarnation_is_known_lost_and_never_used_again() {
    let mut cluster = Cluster::start();
    let fabric = cluster.client();
    assert_eq!(fabric.incarnations()[2], Some(FIRST));
    write(&fabric, NODE, 0x1111).unwrap();
    assert_eq!(word(&cluster.memory()), 0x1111, "the write reached node 2");
    assert!(!fabric.memory_lost(NODE, FIRST));

    cluster.restart(SECOND);
    let fresh = cluster.memory();
    // The old queue pair is gone with the old process: the write fails, and the
    // reconnect finds the new incarnation.
    assert!(write(&fabric, NODE, 0x2222).is_err());
    wait_status(&fabric, NODE, NodeStatus::Retired);
    assert!(
        fabric.memory_lost(NODE, FIRST),
        "the first incarnation's memory is known lost"
    );
    assert!(
        !fabric.memory_lost(NODE, SECOND),
        "nothing is known about the running incarnation's memory"
    );
    assert!(!fabric.memory_lost(NodeId(1), FIRST - 1));
    // Never used as the old replica: batches fail at once, the new memory keeps
    // nothing but its header, and the node stays out.
    for attempt in 0..3u64 {
        assert!(write(&fabric, NODE, 0x3333 + attempt).is_err());
        assert!(read(&fabric, NODE).is_err());
    }
    drive_for(&fabric, Duration::from_millis(300));
    assert_eq!(fabric.node_status(NODE), NodeStatus::Retired);
    assert!(untouched(&fresh), "a client wrote to the restarted node");
    others_serve(&fabric);
}

#[test]
fn a_node_that_is_only_down_is_not_known_lost_until_it_comes_back_restarted() {
    let mut cluster = Cluster::start();
    let fabric = cluster.client();
    cluster.nodes[2].stop().unwrap();
    assert!(write(&fabric, NODE, 0x1111).is_err());
    assert_eq!(fabric.node_status(NODE), NodeStatus::Reconnecting);
    // Reconnect attempts fail (nobody listens): the node may come back with its
    // memory, so its memory is not known lost.
    drive_for(&fabric, Duration::from_millis(400));
    assert_eq!(fabric.node_status(NODE), NodeStatus::Reconnecting);
    assert!(!fabric.memory_lost(NODE, FIRST));
    cluster.restart(SECOND);
    wait_status(&fabric, NODE, NodeStatus::Retired);
    assert!(fabric.memory_lost(NODE, FIRST));
    assert!(untouched(&cluster.memory()));
}

#[test]
fn the_admitted_incarnation_serves_from_then_on() {
    let mut cluster = Cluster::start();
    let fabric = cluster.client();
    cluster.restart(SECOND);
    assert!(write(&fabric, NODE, 0x1111).is_err());
    wait_status(&fabric, NODE, NodeStatus::Retired);
    // A repair rebuilt the node's memory from the others.
    let rebuilt = cluster.memory();
    rebuilt.with(|bytes| bytes[DATA as usize..][..8].copy_from_slice(&0x4242u64.to_le_bytes()));

    assert!(fabric.admit(NODE, SECOND), "the admission is scheduled");
    assert!(!fabric.memory_lost(NODE, SECOND));
    wait_status(&fabric, NODE, NodeStatus::Live);
    assert_eq!(
        read(&fabric, NODE),
        Ok(0x4242),
        "reads reach the rebuilt memory"
    );
    write(&fabric, NODE, 0x5555).unwrap();
    assert_eq!(word(&rebuilt), 0x5555, "writes reach the rebuilt memory");
    assert!(!fabric.memory_lost(NODE, SECOND));
    assert!(
        fabric.memory_lost(NODE, FIRST),
        "the first incarnation's memory stays lost"
    );

    // Admitting it again changes nothing.
    assert!(fabric.admit(NODE, SECOND));
    assert_eq!(fabric.node_status(NODE), NodeStatus::Live);
    write(&fabric, NODE, 0x6666).unwrap();

    // From then on: a later reconnect (the node drops its clients) expects the
    // admitted incarnation, not the one the client first connected to.
    assert!(cluster.nodes[2].disconnect_clients().unwrap() >= 1);
    assert!(write(&fabric, NODE, 0x7777).is_err());
    wait_status(&fabric, NODE, NodeStatus::Live);
    write(&fabric, NODE, 0x8888).unwrap();
    assert_eq!(word(&rebuilt), 0x8888);
    assert!(!fabric.memory_lost(NODE, SECOND));
    others_serve(&fabric);
}

#[test]
fn admitting_an_incarnation_the_node_does_not_run_keeps_it_out() {
    let mut cluster = Cluster::start();
    let fabric = cluster.client();
    cluster.restart(SECOND);
    assert!(write(&fabric, NODE, 0x1111).is_err());
    wait_status(&fabric, NODE, NodeStatus::Retired);
    // The node restarts once more before the repair of the second incarnation is
    // admitted: it runs a third, whose memory the configuration does not name.
    cluster.restart(THIRD);
    let third = cluster.memory();

    assert!(fabric.admit(NODE, SECOND), "a reconnect is scheduled");
    assert_eq!(fabric.node_status(NODE), NodeStatus::Reconnecting);
    wait_status(&fabric, NODE, NodeStatus::Retired);
    assert!(write(&fabric, NODE, 0x2222).is_err());
    assert!(read(&fabric, NODE).is_err());
    drive_for(&fabric, Duration::from_millis(300));
    assert_eq!(fabric.node_status(NODE), NodeStatus::Retired);
    assert!(
        untouched(&third),
        "the third incarnation served as the second"
    );
    assert!(
        fabric.memory_lost(NODE, SECOND),
        "the reconnect found the admitted incarnation gone"
    );
    assert!(!fabric.memory_lost(NODE, THIRD));

    // Admitting the incarnation it runs puts it back.
    assert!(fabric.admit(NODE, THIRD));
    wait_status(&fabric, NODE, NodeStatus::Live);
    write(&fabric, NODE, 0x3333).unwrap();
    assert_eq!(word(&third), 0x3333);
    others_serve(&fabric);
}

#[test]
fn admitting_another_incarnation_takes_the_node_out_of_service_at_once() {
    let cluster = Cluster::start();
    let fabric = cluster.client();
    let first = cluster.memory();
    write(&fabric, NODE, 0x1111).unwrap();
    // A configuration names another incarnation of node 2 while this client still
    // reaches the first: its memory must not be served under the new one.
    assert!(fabric.admit(NODE, SECOND));
    assert_ne!(fabric.node_status(NODE), NodeStatus::Live);
    assert!(write(&fabric, NODE, 0x2222).is_err());
    wait_status(&fabric, NODE, NodeStatus::Retired);
    assert!(write(&fabric, NODE, 0x3333).is_err());
    assert_eq!(
        word(&first),
        0x1111,
        "the first incarnation served as the second"
    );
    others_serve(&fabric);
}

#[test]
fn admitting_the_incarnation_in_service_changes_nothing() {
    let cluster = Cluster::start();
    let fabric = cluster.client();
    let ticket = fabric.post(NODE, Batch::write(DATA, 0x1111u64.to_le_bytes().to_vec()));
    assert!(fabric.admit(NODE, FIRST));
    assert_eq!(fabric.node_status(NODE), NodeStatus::Live);
    assert!(wait(&fabric, ticket).is_ok(), "the batch in flight failed");
    write(&fabric, NODE, 0x2222).unwrap();
    assert_eq!(word(&cluster.memory()), 0x2222);
    assert!(!fabric.admit(NodeId(3), FIRST), "there is no node 3");
}

#[test]
fn a_node_unreachable_when_the_client_started_serves_once_admitted() {
    let mut cluster = Cluster::start();
    cluster.nodes[2].stop().unwrap();
    let fabric = cluster.client();
    assert_eq!(fabric.node_status(NODE), NodeStatus::Retired);
    assert_eq!(fabric.incarnations()[2], None);
    assert!(
        !fabric.memory_lost(NODE, FIRST),
        "nothing is known about it"
    );
    // It comes back rebuilt (a repair) and a configuration admits it.
    cluster.restart(SECOND);
    let rebuilt = cluster.memory();
    assert!(fabric.admit(NODE, SECOND));
    wait_status(&fabric, NODE, NodeStatus::Live);
    write(&fabric, NODE, 0x1111).unwrap();
    assert_eq!(word(&rebuilt), 0x1111);
    assert!(!fabric.memory_lost(NODE, SECOND));
}
