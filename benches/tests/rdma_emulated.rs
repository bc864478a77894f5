//! SWARM-KV over the emulated verbs provider (`swarm_rdma::emu`): the real RDMA
//! transport — planner, `post_chain`'s work requests, engine — on a provider that
//! lets unfenced requests overtake outstanding READs and ATOMICs, interleaves the
//! nodes' queue pairs at random, and crashes a node in the middle of a chain. The
//! YCSB harness runs clients with several operations in flight and records the
//! history; the checker must find it linearizable (what soft-RoCE cannot exercise,
//! see `swarm-rdma/README.md`).
#![cfg(feature = "rdma")]

mod ycsb_support;

use std::sync::atomic::{AtomicU64, Ordering};

use std::task::Poll;

use swarm_benches::ycsb::sizing::cluster_for;
use swarm_benches::ycsb::{BenchConfig, System, Workload, run_on};
use swarm_core::header::NodeHeader;
use swarm_core::{Batch, Fabric, NodeId};
use swarm_kv::admin::{NodeLayout, write_superblock};
use swarm_kv::{KvError, Store, SystemClock};
use swarm_rdma::emu::{EmuOptions, EmulatedCluster, EmulatedFabric, Mode};
use swarm_rdma::wr::CasReplyOrder;
use ycsb_support::{assert_clean, assert_linearizable, small};

/// A SWARM-KV store on emulated RDMA memory nodes.
struct EmuStore {
    cluster: EmulatedCluster,
    layout: NodeLayout,
    header: NodeHeader,
    seeds: AtomicU64,
    /// Every client's queue pair to this node crashes after this many requests.
    crash: Option<(usize, u32)>,
}

impl EmuStore {
    fn new(config: &BenchConfig, options: EmuOptions, crash: Option<(usize, u32)>) -> Self {
        let (params, node_bytes) = cluster_for(config, 3).expect("sized");
        let params = params.for_node_size(node_bytes).expect("fits");
        let cluster = EmulatedCluster::new(3, node_bytes as usize, options);
        let epoch_unix_ns = SystemClock::unix_ns();
        let mut header = None;
        for (i, node) in cluster.nodes().iter().enumerate() {
            let h = NodeHeader {
                node_id: i as u16,
                node_count: 3,
                size: node_bytes,
                cluster_id: 0x5eed,
                epoch_unix_ns,
                tick_ns: 1000,
            };
            node.with(|bytes| bytes[..h.encode().len()].copy_from_slice(&h.encode()));
            header.get_or_insert(h);
        }
        let fabric = cluster.client(config.seed).expect("client");
        write_superblock(&fabric, &params).expect("superblock");
        Self {
            cluster,
            layout: NodeLayout::new(params).expect("layout"),
            header: header.expect("three nodes"),
            seeds: AtomicU64::new(config.seed),
            crash,
        }
    }
}

impl Store for EmuStore {
    type Fabric = EmulatedFabric;

    fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    fn header(&self) -> &NodeHeader {
        &self.header
    }

    fn fabric(&self) -> Result<EmulatedFabric, KvError> {
        let seed = self.seeds.fetch_add(1, Ordering::Relaxed);
        let fabric = self.cluster.client(seed).map_err(KvError::Rdma)?;
        if let Some((node, after)) = self.crash {
            fabric
                .engine()
                .nic_mut()
                .set_mode(node, Mode::CrashAfter(after));
        }
        Ok(fabric)
    }
}

fn run_and_check(
    config: &BenchConfig,
    options: EmuOptions,
    crash: Option<(usize, u32)>,
) -> EmuStore {
    let dir = swarm_shm::ScratchDir::new("rdma-emulated").unwrap();
    let mut config = config.clone();
    let path = dir.path().join("history.jsonl");
    config.history = Some(path.clone());
    let store = EmuStore::new(&config, options, crash);
    let report =
        run_on(&store, &config).unwrap_or_else(|e| panic!("seed {}: run failed: {e}", config.seed));
    assert_clean(&report);
    assert_linearizable(&path, &report);
    store
}

#[test]
fn ycsb_a_with_operations_in_flight_is_linearizable_over_the_emulated_provider() {
    let mut config = small(System::Swarm, Workload::A, 200, 3_000, 3);
    config.inflight = 4;
    run_and_check(&config, EmuOptions::default(), None);
}

#[test]
fn contention_on_ten_keys_is_linearizable_over_the_emulated_provider() {
    let mut config = small(System::Swarm, Workload::A, 10, 3_000, 4);
    config.inflight = 2;
    run_and_check(&config, EmuOptions::default(), None);
}

#[test]
fn a_node_crashing_mid_chain_for_every_client_is_masked() {
    let config = small(System::Swarm, Workload::A, 200, 3_000, 3);
    // Each client's queue pair to node 2 fails after 300 requests: during the load
    // for some, during the measured phase for others, mid-chain for most.
    let store = run_and_check(&config, EmuOptions::default(), Some((2, 300)));
    // Every client's node 2 did crash: a client of the store sees it after its
    // 300th request (each client of the run posted thousands).
    let fabric = store.fabric().unwrap();
    let outcomes: Vec<bool> = (0..301)
        .map(|_| {
            let ticket = fabric.post(NodeId(2), Batch::read(0, 8));
            loop {
                if let Poll::Ready(result) = fabric.poll(ticket) {
                    return result.is_ok();
                }
                fabric.progress();
            }
        })
        .collect();
    assert!(outcomes[..300].iter().all(|ok| *ok) && !outcomes[300]);
}

#[test]
fn a_device_with_big_endian_cas_replies_works_once_detected() {
    let options = EmuOptions {
        device_cas_reply: CasReplyOrder::BigEndian,
        decode_cas_reply: CasReplyOrder::BigEndian,
        ..EmuOptions::default()
    };
    let config = small(System::Swarm, Workload::A, 100, 2_000, 2);
    run_and_check(&config, options, None);
}
