//! End-to-end tests over a real RDMA device: memory nodes and a client in one
//! process, connected through the device's loopback (hardware, or soft-RoCE:
//! `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev lo` works on most
//! kernels).
//!
//! Where no device exists, every device test prints one line on stderr,
//! `SKIPPED <test>: no RDMA device found (...)`, and returns; set
//! `SWARM_RDMA_REQUIRE_DEVICE=1` (on machines that do have one) to make a missing
//! device a failure instead. The daemon binary's no-device behaviour is checked with
//! the binary, in swarm-cli's `tests/memnode.rs`.

use std::io::Write;
use std::process::Command;
use std::task::Poll;
use std::time::{Duration, Instant};

use swarm_core::fabric::{Batch, Completion, FabricError, NodeId, Op};
use swarm_core::header::{ENCODED_LEN, HEADER_SIZE, NodeHeader};
use swarm_core::{Fabric, block_on_future};
use swarm_core::{OpStats, Roundtrip};
use swarm_rdma::auth::Token;
use swarm_rdma::bootstrap::ServerLimits;
use swarm_rdma::config::PathConfig;
use swarm_rdma::fabric::NodeStatus;
use swarm_rdma::lease_watch::{KILLED, MIN_STALL_NS, RevokeRequest, WatchRequest};
use swarm_rdma::wr::ReadOrdering;
use swarm_rdma::{Memnode, MemnodeConfig, RdmaCluster, RdmaConfig, RdmaError, RdmaFabric};

/// `Some(device names)` when a device exists; otherwise prints the skip line
/// (bypassing the test harness' output capture, so it shows in every run).
fn require_device(test: &str) -> Option<Vec<String>> {
    match swarm_rdma::device_names() {
        Ok(names) => Some(names),
        Err(error) => {
            let reason = match &error {
                RdmaError::NoDevice { detail } => format!("no RDMA device found ({detail})"),
                other => other.to_string(),
            };
            if std::env::var_os("SWARM_RDMA_REQUIRE_DEVICE").is_some() {
                panic!("{test}: SWARM_RDMA_REQUIRE_DEVICE is set but {reason}");
            }
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
            None
        }
    }
}

const NODE_BYTES: u64 = 4 << 20;
const DATA: u64 = HEADER_SIZE;

fn node_config(token: &Token, id: u16, count: u16) -> MemnodeConfig {
    MemnodeConfig {
        listen: "127.0.0.1:0".into(),
        size: NODE_BYTES,
        device: None,
        path: PathConfig::default(),
        token: token.clone(),
        node_id: id,
        node_count: count,
        cluster_id: 0x5eed,
        epoch_unix_ns: 1_700_000_000_000_000_000,
        tick_ns: 1000,
        huge_pages: false,
        limits: ServerLimits::default(),
    }
}

/// Waits until `node` has the status `wanted` on `fabric`, driving progress and
/// posting a read to `node` now and then (a failure is only noticed through a
/// request).
fn wait_status(fabric: &RdmaFabric, node: NodeId, wanted: NodeStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut probe = None;
    while fabric.node_status(node) != wanted {
        assert!(
            Instant::now() < deadline,
            "node {node} did not become {wanted:?} in 20 s (it is {:?})",
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

fn start_nodes(token: &Token, count: u16) -> Vec<Memnode> {
    (0..count)
        .map(|id| Memnode::start(node_config(token, id, count)).expect("memory node starts"))
        .collect()
}

/// `count` memory nodes started with a fresh token, the cluster opened on them, and
/// a client thread's fabric (drop order: fabric, cluster, nodes).
fn nodes_and_client(count: u16) -> (Vec<Memnode>, RdmaCluster, RdmaFabric) {
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, count);
    let cluster = RdmaCluster::open(client_config(&nodes, &token)).unwrap();
    let fabric = cluster.client().unwrap();
    (nodes, cluster, fabric)
}

fn client_config(nodes: &[Memnode], token: &Token) -> RdmaConfig {
    let mut config = RdmaConfig::new(
        nodes.iter().map(|n| n.local_addr().to_string()).collect(),
        token.clone(),
    );
    // Fail fast when a node disappears: ~1 ms per try, one retry.
    config.ack_timeout = 8;
    config.retry_count = 1;
    config
}

fn wait(fabric: &RdmaFabric, ticket: swarm_core::Ticket) -> Result<Completion, FabricError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Poll::Ready(result) = fabric.poll(ticket) {
            return result;
        }
        fabric.progress();
        assert!(Instant::now() < deadline, "batch did not complete in 10 s");
    }
}

fn batch(ops: Vec<Op>) -> Batch {
    let mut batch = Batch::new();
    for op in ops {
        batch.push(op).unwrap();
    }
    batch
}

#[test]
fn read_write_cas_batches_over_the_device() {
    if require_device("read_write_cas_batches_over_the_device").is_none() {
        return;
    }
    let (_nodes, _cluster, fabric) = nodes_and_client(1);
    let node = NodeId(0);
    // Small (inline) and large (staged) writes, a CAS that succeeds, one that fails,
    // and reads that must observe the earlier updates of their own chain.
    let ticket = fabric.post(
        node,
        batch(vec![
            Op::Write {
                addr: DATA,
                data: vec![0xab; 16].into(),
            },
            Op::Write {
                addr: DATA + 64,
                data: (0..=255).collect::<Vec<u8>>().into(),
            },
            Op::Cas {
                addr: DATA + 1024,
                expected: 0,
                new: 41,
            },
            Op::Read {
                addr: DATA,
                len: 64 + 256,
            },
        ]),
    );
    let completion = wait(&fabric, ticket).unwrap();
    assert_eq!(completion.cas(2), Some(0));
    let read = completion.read(3).unwrap();
    assert_eq!(&read[..16], &[0xab; 16]);
    assert_eq!(&read[64..], (0..=255).collect::<Vec<u8>>().as_slice());
    let ticket = fabric.post(
        node,
        batch(vec![
            Op::Cas {
                addr: DATA + 1024,
                expected: 0,
                new: 99,
            },
            Op::Read {
                addr: DATA + 1024,
                len: 8,
            },
        ]),
    );
    let completion = wait(&fabric, ticket).unwrap();
    assert_eq!(
        completion.cas(0),
        Some(41),
        "the failed CAS returns the value found"
    );
    // The CAS result and a READ of the word agree (little-endian host words).
    assert_eq!(completion.read(1), Some(&41u64.to_le_bytes()[..]));
}

#[test]
fn the_cas_self_test_finds_the_native_byte_order_on_this_device() {
    if require_device("the_cas_self_test_finds_the_native_byte_order_on_this_device").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, 1);
    let cluster = RdmaCluster::open(client_config(&nodes, &token)).unwrap();
    // soft-RoCE and mlx5 return CAS results in host order (mlx4 would not).
    assert_eq!(
        cluster.cas_reply_order(),
        swarm_rdma::wr::CasReplyOrder::Native
    );
}

#[test]
fn the_header_read_over_rdma_matches_the_bootstrap() {
    if require_device("the_header_read_over_rdma_matches_the_bootstrap").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, 3);
    let fabric = RdmaCluster::open(client_config(&nodes, &token))
        .unwrap()
        .client()
        .unwrap();
    for (i, node) in nodes.iter().enumerate() {
        let ticket = fabric.post(NodeId(i as u16), Batch::read(0, ENCODED_LEN as u32));
        let completion = wait(&fabric, ticket).unwrap();
        let header = NodeHeader::decode(completion.read(0).unwrap(), NODE_BYTES).unwrap();
        assert_eq!(header, node.region().header);
        assert_eq!(Some(header), fabric.headers()[i]);
    }
}

#[test]
fn strict_ordering_keeps_reads_before_later_writes() {
    if require_device("strict_ordering_keeps_reads_before_later_writes").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, 1);
    let mut config = client_config(&nodes, &token);
    config.ordering = ReadOrdering::Strict;
    let fabric = RdmaCluster::open(config).unwrap().client().unwrap();
    for round in 1..=200u8 {
        let ticket = fabric.post(
            NodeId(0),
            batch(vec![
                Op::Read {
                    addr: DATA,
                    len: 4096,
                },
                Op::Write {
                    addr: DATA,
                    data: vec![round; 4096].into(),
                },
            ]),
        );
        let completion = wait(&fabric, ticket).unwrap();
        let read = completion.read(0).unwrap();
        assert!(
            read.iter().all(|&b| b == round - 1),
            "round {round}: the read observed the later write"
        );
    }
}

#[test]
fn many_batches_in_flight_complete_in_order_per_node() {
    if require_device("many_batches_in_flight_complete_in_order_per_node").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, 3);
    let mut config = client_config(&nodes, &token);
    // Small staging and queues: chains wait for credits and are posted later.
    config.staging_bytes = 16 << 10;
    config.send_queue_depth = 8;
    let fabric = RdmaCluster::open(config).unwrap().client().unwrap();
    let mut tickets = Vec::new();
    for i in 0..300u64 {
        for n in 0..3u16 {
            tickets.push(fabric.post(
                NodeId(n),
                Batch::write(DATA + 8 * (i % 64), (i + 1).to_le_bytes().to_vec()),
            ));
        }
    }
    for ticket in tickets {
        wait(&fabric, ticket).unwrap();
    }
    for n in 0..3u16 {
        let completion = wait(&fabric, fabric.post(NodeId(n), Batch::read(DATA, 512))).unwrap();
        let words: Vec<u64> = completion
            .read(0)
            .unwrap()
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        // Slot k was last written by i = 256 + k (k < 44) or 192 + k.
        for (k, word) in words.iter().enumerate() {
            let last = if k < 44 { 256 + k } else { 192 + k } as u64;
            assert_eq!(*word, last + 1, "node {n} slot {k}");
        }
    }
}

#[test]
fn a_dead_memory_node_is_a_failed_node_and_the_majority_continues() {
    if require_device("a_dead_memory_node_is_a_failed_node_and_the_majority_continues").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let mut nodes = start_nodes(&token, 3);
    let fabric = RdmaCluster::open(client_config(&nodes, &token))
        .unwrap()
        .client()
        .unwrap();
    nodes.pop().unwrap().shutdown();
    let stats = OpStats::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Keep writing to all three, waiting for two, until node 2 is reported failed.
    while !fabric.is_failed(NodeId(2)) {
        let reached = block_on_future(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for n in 0..3 {
                rt.post(NodeId(n), Batch::write(DATA, vec![7; 8])).unwrap();
            }
            rt.wait(2).await
        })
        .unwrap();
        assert_eq!(reached, Ok(()), "the majority must keep answering");
        fabric.progress();
        assert!(Instant::now() < deadline, "node 2 never reported failed");
    }
    let ticket = fabric.post(NodeId(2), Batch::read(DATA, 8));
    assert!(matches!(
        fabric.poll(ticket),
        Poll::Ready(Err(FabricError::NodeFailed {
            node: NodeId(2),
            ..
        }))
    ));
}

#[test]
fn a_node_that_drops_its_clients_is_reconnected_with_its_memory() {
    if require_device("a_node_that_drops_its_clients_is_reconnected_with_its_memory").is_none() {
        return;
    }
    let (nodes, _cluster, fabric) = nodes_and_client(3);
    let node = NodeId(1);
    let incarnation = fabric.incarnations()[1];
    assert!(incarnation.is_some_and(|i| i != 0));
    let write = batch(vec![Op::Write {
        addr: DATA,
        data: vec![7; 8].into(),
    }]);
    wait(&fabric, fabric.post(node, write)).unwrap();
    // The node registers a client's connection right after its side of the
    // handshake, which the client may finish (and write over) first: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match nodes[1].disconnect_clients() {
            0 => {
                assert!(
                    Instant::now() < deadline,
                    "the node never registered the client"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            n => {
                assert_eq!(n, 1);
                break;
            }
        }
    }
    wait_status(&fabric, node, NodeStatus::Reconnecting);
    wait_status(&fabric, node, NodeStatus::Live);
    // Same process, same memory: the write is still there.
    let read = wait(&fabric, fabric.post(node, Batch::read(DATA, 8))).unwrap();
    assert_eq!(read.read(0), Some(&[7u8; 8][..]));
    assert_eq!(fabric.incarnations()[1], incarnation);
}

/// A node given up on (as when soft-RoCE holds a queue pair's chain) is alive: the
/// client reconnects it at once, and the batches posted meanwhile are parked, then
/// posted in order on the new queue pair, instead of failing.
#[test]
fn posts_to_a_node_given_up_on_wait_for_its_reconnect() {
    if require_device("posts_to_a_node_given_up_on_wait_for_its_reconnect").is_none() {
        return;
    }
    let (_nodes, _cluster, fabric) = nodes_and_client(3);
    let node = NodeId(1);
    let first = batch(vec![Op::Write {
        addr: DATA,
        data: vec![7; 8].into(),
    }]);
    wait(&fabric, fabric.post(node, first)).unwrap();
    fabric.give_up_on(node);
    assert_eq!(fabric.node_status(node), NodeStatus::Reconnecting);
    assert_eq!(fabric.lost_chain_failures(), 1);
    // Only batches with an operation deadline are parked.
    let due = Some(fabric.now() + 10_000_000_000);
    let mut second = batch(vec![Op::Write {
        addr: DATA + 8,
        data: vec![8; 8].into(),
    }]);
    second.set_deadline(due);
    let mut read = Batch::read(DATA, 16);
    read.set_deadline(due);
    let write = fabric.post(node, second);
    let read = fabric.post(node, read);
    assert!(fabric.poll(write).is_pending(), "parked, not failed");
    wait(&fabric, write).unwrap();
    let read = wait(&fabric, read).unwrap();
    let mut expected = vec![7u8; 8];
    expected.extend([8u8; 8]);
    assert_eq!(read.read(0), Some(&expected[..]), "posted in order");
    assert_eq!(fabric.node_status(node), NodeStatus::Live);
    let parking = fabric.park_stats();
    assert_eq!(
        (parking.parked_batches, parking.revived, parking.failed),
        (2, 1, 0)
    );
}

#[test]
fn a_client_whose_lease_word_stops_changing_is_cut_off_by_the_memory_node() {
    if require_device("a_client_whose_lease_word_stops_changing_is_cut_off_by_the_memory_node")
        .is_none()
    {
        return;
    }
    let (_nodes, cluster, fabric) = nodes_and_client(1);
    let node = NodeId(0);
    let lease = DATA + 4096;
    let renew = |value: u64| {
        let write = batch(vec![Op::Write {
            addr: lease,
            data: value.to_le_bytes().to_vec().into(),
        }]);
        wait(&fabric, fabric.post(node, write))
    };
    renew(1).unwrap();
    let request = WatchRequest {
        offset: lease,
        stall_ns: 4 * MIN_STALL_NS,
        base: 1,
    };
    assert_eq!(fabric.watch_lease_word(request), 1);
    // Renewing well within the stall time keeps the queue pair.
    for value in 2..40 {
        renew(value).expect("a renewing client is served");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The client stops renewing (hung): the node cuts its queue pair, and a late
    // write fails instead of landing.
    std::thread::sleep(Duration::from_nanos(3 * request.stall_ns));
    let late = renew(1000);
    assert!(
        late.is_err(),
        "a write landed after the lease stalled: {late:?}"
    );
    // A reclaimer kills the lease: reconnecting cannot revive the client there.
    let reclaimer = cluster.client().unwrap();
    let kill = batch(vec![Op::Write {
        addr: lease,
        data: (39 | KILLED).to_le_bytes().to_vec().into(),
    }]);
    wait(&reclaimer, reclaimer.post(node, kill)).unwrap();
    wait_status(&fabric, node, NodeStatus::Retired);
}

/// A reclaimer's revocation over real verbs: once the memory node acknowledged it,
/// the revoked client's next write fails instead of landing (its queue pair was
/// destroyed first), and it can never reconnect; the lease watch polls once an hour
/// here, so only the revocation can have cut it.
#[test]
fn a_revoked_client_lands_nothing_once_the_revocation_is_acknowledged() {
    if require_device("a_revoked_client_lands_nothing_once_the_revocation_is_acknowledged")
        .is_none()
    {
        return;
    }
    let token = Token::generate().unwrap();
    let mut config = node_config(&token, 0, 1);
    config.limits.watch_period = Duration::from_secs(3600);
    let nodes = vec![Memnode::start(config).expect("memory node starts")];
    let cluster = RdmaCluster::open(client_config(&nodes, &token)).unwrap();
    let fabric = cluster.client().unwrap();
    let node = NodeId(0);
    let lease = DATA + 4096;
    let write = |fabric: &RdmaFabric, addr: u64, value: u64| {
        let write = batch(vec![Op::Write {
            addr,
            data: value.to_le_bytes().to_vec().into(),
        }]);
        wait(fabric, fabric.post(node, write))
    };
    write(&fabric, lease, 5).unwrap();
    let request = WatchRequest {
        offset: lease,
        stall_ns: 1000 * MIN_STALL_NS,
        base: 5,
    };
    assert_eq!(fabric.watch_lease_word(request), 1);
    let reclaimer = cluster.client().unwrap();
    let revoke = RevokeRequest {
        offset: lease,
        floor: 5,
    };
    // Not killed yet: nothing is revoked.
    assert_eq!(reclaimer.revoke_lease_word(revoke), vec![(node, Some(5))]);
    write(&fabric, DATA, 1).expect("the client is still served");
    write(&reclaimer, lease, 5 | KILLED).unwrap();
    assert!(
        reclaimer.revoke_lease_word(revoke).is_empty(),
        "acknowledged"
    );
    let late = write(&fabric, DATA + 8, 0x0bad);
    assert!(
        late.is_err(),
        "a revoked client's write completed: {late:?}"
    );
    let read = wait(&reclaimer, reclaimer.post(node, Batch::read(DATA + 8, 8))).unwrap();
    assert_ne!(read.read(0), Some(&0x0badu64.to_le_bytes()[..]));
    // A new owner renews over the kill; the revoked client still cannot come back.
    write(&reclaimer, lease, 6).unwrap();
    wait_status(&fabric, node, NodeStatus::Retired);
}

#[test]
fn a_restarted_node_is_never_used_again() {
    if require_device("a_restarted_node_is_never_used_again").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let mut nodes = start_nodes(&token, 3);
    let cluster = RdmaCluster::open(client_config(&nodes, &token)).unwrap();
    let fabric = cluster.client().unwrap();
    let node = NodeId(1);
    let old = nodes.remove(1);
    let listen = old.local_addr().to_string();
    let old_incarnation = old.region().incarnation;
    old.shutdown();
    // The same node (same id, address and cluster) restarts with empty memory.
    let mut config = node_config(&token, 1, 3);
    config.listen = listen;
    let restarted = Memnode::start(config).expect("the node restarts on its address");
    assert_ne!(restarted.region().incarnation, old_incarnation);
    wait_status(&fabric, node, NodeStatus::Retired);
    assert!(wait(&fabric, fabric.post(node, Batch::read(DATA, 8))).is_err());
    assert!(
        fabric.memory_lost(node, old_incarnation),
        "the old incarnation's memory is known lost"
    );
    assert!(!fabric.memory_lost(NodeId(0), fabric.incarnations()[0].unwrap()));
    // The other two still serve.
    for other in [0, 2] {
        wait(&fabric, fabric.post(NodeId(other), Batch::read(DATA, 8))).unwrap();
    }
    drop(restarted);
}

/// Takes the network interface under the RDMA device down and up again, so it runs
/// only where that is harmless: the soft-RoCE VM of `scripts/softroce/test.sh` sets
/// `SWARM_TEST_FLAP_NETDEV` to its interface. The port's asynchronous events must
/// fail every node at once (no batch left hanging) and bring them back.
#[test]
fn a_port_that_goes_down_and_up_fails_every_node_then_reconnects_them() {
    let name = "a_port_that_goes_down_and_up_fails_every_node_then_reconnects_them";
    if require_device(name).is_none() {
        return;
    }
    let Some(netdev) = std::env::var_os("SWARM_TEST_FLAP_NETDEV") else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {name}: set SWARM_TEST_FLAP_NETDEV=<interface> where taking it down is harmless"
        );
        return;
    };
    let link = |state: &str| {
        let status = Command::new("ip")
            .args(["link", "set"])
            .arg(&netdev)
            .arg(state)
            .status()
            .expect("ip runs");
        assert!(status.success(), "ip link set {netdev:?} {state} failed");
    };
    let (_nodes, cluster, fabric) = nodes_and_client(3);
    let port_usable = |wanted: bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.port_usable() != wanted {
            assert!(Instant::now() < deadline, "no port event in 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert!(cluster.port_usable());
    link("down");
    port_usable(false);
    for node in 0..3 {
        wait_status(&fabric, NodeId(node), NodeStatus::Reconnecting);
    }
    link("up");
    port_usable(true);
    for node in 0..3 {
        wait_status(&fabric, NodeId(node), NodeStatus::Live);
        wait(&fabric, fabric.post(NodeId(node), Batch::read(DATA, 8))).unwrap();
    }
}

#[test]
fn wrong_token_and_unknown_device_are_refused() {
    if require_device("wrong_token_and_unknown_device_are_refused").is_none() {
        return;
    }
    let token = Token::generate().unwrap();
    let nodes = start_nodes(&token, 1);
    let config = client_config(&nodes, &Token::generate().unwrap());
    let error = RdmaCluster::open(config).unwrap().client().unwrap_err();
    assert!(error.to_string().contains("token"), "{error}");
    let mut config = client_config(&nodes, &token);
    config.device = Some("no-such-device".into());
    assert!(matches!(
        RdmaCluster::open(config),
        Err(RdmaError::UnknownDevice { .. })
    ));
}
