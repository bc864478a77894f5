//! Shared helpers of the index tests: a small cluster layout, key headers, and a
//! history recorder that maps index operations onto the checker's key-value model.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;

use swarm_checker::{History, OpKind, Operation};
use swarm_core::MemCluster;
use swarm_core::fabric::{Batch, NodeId};
use swarm_core::{OpStats, Roundtrip, block_on_future};
use swarm_kv::ClusterParams;
use swarm_kv::admin::IndexConfig;
use swarm_kv::admin::NodeLayout;
use swarm_kv::testing::encode_key_header;
use swarm_kv::testing::index::Index;
use swarm_sim::SimWorld;

/// Parameters of a KV cluster on the simulated microsecond fabric (the KV tests that
/// run whole clients there): short leases and operation fence (20 ms), a 1 ms
/// delivery margin, three replicas. Tests set the register and bucket counts.
pub fn kv_sim_params() -> ClusterParams {
    const MS: u64 = 1_000_000;
    ClusterParams {
        key_max: 16,
        value_max: 16,
        meta_words: 2,
        writers: 8,
        replicas: 3,
        log_slots: 4096,
        lease_ns: 60 * MS,
        lease_renew_ns: 2 * MS,
        max_op_ns: 20 * MS,
        cache_ttl_ns: 20 * MS,
        delivery_margin_ns: MS,
        ..ClusterParams::default()
    }
}

/// A small cluster: `registers` registers, `buckets` index buckets, each register on
/// three nodes.
pub fn layout(registers: u64, buckets: u64) -> NodeLayout {
    layout_on(3, registers, buckets)
}

/// [`layout`] with each register on `nodes` nodes (every node of a cluster of that
/// many), as tests that write key headers on every node and crash any minority of
/// the nodes need: the index reads a header from its register's replicas only.
pub fn layout_on(nodes: usize, registers: u64, buckets: u64) -> NodeLayout {
    let mut layout = layout_params(registers, buckets);
    layout.replicas = nodes as u16;
    NodeLayout::new(layout).expect("test layout is valid")
}

fn layout_params(registers: u64, buckets: u64) -> ClusterParams {
    ClusterParams {
        key_max: 32,
        value_max: 32,
        meta_words: 2,
        writers: 16,
        replicas: 3,
        registers,
        chunk_registers: 16,
        index_buckets: buckets,
        log_slots: 16,
        ..ClusterParams::default()
    }
}

/// Index tunables for a simulated microsecond fabric. Every third client inserts
/// without the fast round, so fast and classic inserts race each other.
pub fn sim_config(client_id: u16) -> IndexConfig {
    IndexConfig {
        client_id,
        slow_after_ns: 10_000,
        retry_delay_ns: 1_000,
        max_backoff_ns: 40_000,
        read_retries: 2,
        ack_wait_ns: 200_000,
        max_attempts: 2_000,
        fast_inserts: client_id % 3 != 2,
    }
}

/// Index tunables for the in-process fabric, whose clock ticks once per progress call
/// (fast and classic inserts mixed as in [`sim_config`]).
pub fn mem_config(client_id: u16) -> IndexConfig {
    IndexConfig {
        client_id,
        slow_after_ns: 50,
        retry_delay_ns: 2,
        max_backoff_ns: 200,
        read_retries: 2,
        ack_wait_ns: 5_000,
        max_attempts: 10_000,
        fast_inserts: client_id % 3 != 2,
    }
}

/// Writes `key` as the key header of `register` on every node of a simulated world
/// (instantly, as the KV layer does before indexing a register).
pub fn sim_header(world: &SimWorld, layout: &NodeLayout, register: u64, key: &[u8]) {
    let at = layout.key_header(register).expect("register exists");
    for n in 0..world.node_count() {
        world
            .poke(NodeId(n as u16), at, &encode_key_header(key))
            .expect("header fits");
    }
}

/// Writes `key` as the key header of `register` on every node of an in-process cluster.
pub fn mem_header(
    cluster: &MemCluster,
    nodes: usize,
    layout: &NodeLayout,
    register: u64,
    key: &[u8],
) {
    let fabric = cluster.client();
    let at = layout.key_header(register).expect("register exists");
    let stats = OpStats::new();
    block_on_future(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        for n in 0..nodes {
            rt.post(NodeId(n as u16), Batch::write(at, encode_key_header(key)))
                .expect("post");
        }
        rt.wait(nodes).await.expect("all nodes write");
    })
    .expect("no stall");
}

/// An index for `nodes` nodes.
pub fn index(layout: &NodeLayout, nodes: usize, config: IndexConfig) -> Index {
    Index::new(layout, nodes, config).expect("index parameters are valid")
}

/// The value recorded for register `r`.
pub fn value(r: u64) -> String {
    format!("r{r}")
}

/// Index operations recorded as key-value operations (see the task brief):
/// insert → `insert r<id>` when inserted, `get r<id>` when it existed; resolve →
/// `get`; remove → `delete` when it removed; replace → `update r<new>` when it
/// replaced. Removes and replaces that changed nothing are dropped; operations that
/// failed or never returned stay as crashed (may or may not have taken effect).
#[derive(Clone, Default)]
pub struct Log {
    ops: Rc<RefCell<Vec<Option<Operation>>>>,
}

impl Log {
    /// Records the call of an operation.
    pub fn begin(
        &self,
        client: u64,
        op: OpKind,
        key: &str,
        value: Option<&str>,
        start: u64,
    ) -> usize {
        let mut ops = self.ops.borrow_mut();
        ops.push(Some(Operation::crashed(client, op, key, value, start)));
        ops.len() - 1
    }

    /// Records its return, as `op` with `value` (for observers) and `ok` (`None`: an
    /// outcome the client could not know, as a delete that raced another).
    pub fn end(
        &self,
        id: usize,
        op: OpKind,
        value: Option<String>,
        ok: impl Into<Option<bool>>,
        end: u64,
    ) {
        if let Some(Some(o)) = self.ops.borrow_mut().get_mut(id) {
            o.op = op;
            if op.is_observer() || op.writes_value() {
                o.value = value;
            }
            o.ok = ok.into();
            o.end = Some(end);
        }
    }

    /// Forgets an operation that had no effect.
    pub fn drop_op(&self, id: usize) {
        if let Some(slot) = self.ops.borrow_mut().get_mut(id) {
            *slot = None;
        }
    }

    /// The history.
    pub fn history(&self) -> History {
        let mut history = History::new();
        for op in self.ops.borrow().iter().flatten() {
            history
                .push(op.clone())
                .expect("recorded operations are well formed");
        }
        history
    }

    /// Operations recorded (dropped ones excluded).
    pub fn len(&self) -> usize {
        self.ops.borrow().iter().flatten().count()
    }
}
