//! How a simulated cluster is shaped: nodes, memory, latencies, execution costs.

use alloc::vec;
use alloc::vec::Vec;

use swarm_core::fabric::{Nanos, NodeId};

/// The one-way latency between any client and one memory node.
///
/// Each message (request or completion) draws its own delay, uniformly in
/// `base_ns ± jitter_ns`, plus `tail_ns` with probability `tail_probability` (a
/// congested switch, a PCIe hiccup), all multiplied by the node's slow factor. Two
/// independent draws per batch are what reorder batches across nodes, and across
/// batches to one node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Median one-way delay.
    pub base_ns: Nanos,
    /// Half-width of the uniform spread around `base_ns`.
    pub jitter_ns: Nanos,
    /// Probability that a message also suffers `tail_ns`.
    pub tail_probability: f64,
    /// Extra delay of a tail message.
    pub tail_ns: Nanos,
    /// Whether each tail message draws its extra delay uniformly in `0..=tail_ns`
    /// instead of taking all of it: late messages then overtake each other and
    /// land at every distance from their batch's other messages.
    pub tail_uniform: bool,
}

impl Latency {
    /// `base_ns ± jitter_ns`, no tail.
    pub const fn new(base_ns: Nanos, jitter_ns: Nanos) -> Self {
        Self {
            base_ns,
            jitter_ns,
            tail_probability: 0.0,
            tail_ns: 0,
            tail_uniform: false,
        }
    }

    /// Adds a tail: with probability `probability`, `extra_ns` more.
    pub const fn with_tail(mut self, probability: f64, extra_ns: Nanos) -> Self {
        self.tail_probability = probability;
        self.tail_ns = extra_ns;
        self
    }

    /// Adds a spread tail: with probability `probability`, a uniform draw in
    /// `0..=max_extra_ns` more.
    pub const fn with_tail_upto(mut self, probability: f64, max_extra_ns: Nanos) -> Self {
        self.tail_probability = probability;
        self.tail_ns = max_extra_ns;
        self.tail_uniform = true;
        self
    }
}

impl Default for Latency {
    /// About one microsecond one way, as on an RDMA fabric (SWARM §7: 1.9 µs RAW gets).
    fn default() -> Self {
        Self::new(1_000, 300)
    }
}

/// One memory node's behaviour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeConfig {
    /// Its one-way latency distribution.
    pub latency: Latency,
    /// Its initial slow factor (see [`super::Fault::Slow`]); 0 counts as 1.
    pub slow: u32,
}

impl Default for NodeConfig {
    /// Default latency, full speed.
    fn default() -> Self {
        Self {
            latency: Latency::default(),
            slow: 1,
        }
    }
}

/// The shape of a simulated cluster. Fields are public; the builder methods are
/// shorthands.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Bytes of memory per node (rounded up to a multiple of 8). Memory starts zeroed.
    pub node_bytes: usize,
    /// One entry per memory node.
    pub nodes: Vec<NodeConfig>,
    /// Time a node spends on a read or a CAS, and between two operations of a batch.
    pub op_ns: Nanos,
    /// Time between the 8-byte chunks of a write: a write of `k` chunks is applied
    /// over `(k - 1) * word_ns`, and reads in that window may see it torn.
    pub word_ns: Nanos,
    /// Probability that a node stalls between two operations of one batch (a PCIe
    /// hiccup, a descheduled memory-node thread). 0 by default.
    pub stall_probability: f64,
    /// Longest such stall; each one lasts a uniform draw in `0..=stall_ns`, times the
    /// node's slow factor. Stalls are what let another client's batch land between a
    /// buffer write and the CAS that publishes it (SWARM §2.1, third property).
    pub stall_ns: Nanos,
    /// Keep every trace event in memory (the digest is computed either way). Turn
    /// off for very long runs.
    pub keep_trace: bool,
    /// How long after its post a batch lost to a crashed node fails, with
    /// `FailureCause::TimedOut`: an RDMA client's queue pair retries a silent node
    /// for its retry window, then goes to the error state and fails what it holds
    /// (a SWARM-KV store's delivery margin covers that window). `None`: such a
    /// batch never completes (a node that drops what it gets). [`QP_TIMEOUT_NS`] by
    /// default. Either way the batch is settled once lost (`Fabric::settled`):
    /// nothing of it lands.
    pub qp_timeout_ns: Option<Nanos>,
}

/// The default [`SimConfig::qp_timeout_ns`]: 5 ms, several operation deadlines of
/// the simulated scenarios (2 ms), as an RDMA queue pair's retry window (547 ms by
/// default) exceeds SWARM-KV's operation deadline (200 ms): an operation that
/// needed such a batch has run out of time before it fails. Shorter timeouts fenced
/// more operations in `sim_crash_resume` (docs/measurements.md).
pub const QP_TIMEOUT_NS: Nanos = 5_000_000;

impl Default for SimConfig {
    /// Three nodes (`f = 1`) of 1 MiB each with default latencies.
    fn default() -> Self {
        Self::new(3, 1 << 20)
    }
}

impl SimConfig {
    /// `nodes` nodes of `node_bytes` bytes each, default latencies and costs.
    pub fn new(nodes: usize, node_bytes: usize) -> Self {
        Self {
            node_bytes,
            nodes: vec![NodeConfig::default(); nodes],
            op_ns: 20,
            word_ns: 10,
            stall_probability: 0.0,
            stall_ns: 0,
            keep_trace: true,
            qp_timeout_ns: Some(QP_TIMEOUT_NS),
        }
    }

    /// Number of memory nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn node_mut(&mut self, node: NodeId) -> &mut NodeConfig {
        let count = self.nodes.len();
        match self.nodes.get_mut(node.index()) {
            Some(config) => config,
            None => panic!("SimConfig has {count} nodes, there is no node {node} to configure"),
        }
    }

    /// Sets the latency of every node.
    pub fn latency(mut self, latency: Latency) -> Self {
        for node in &mut self.nodes {
            node.latency = latency;
        }
        self
    }

    /// Sets the latency of one node.
    ///
    /// # Panics
    /// If `node` does not exist (a bug in the test).
    pub fn node_latency(mut self, node: NodeId, latency: Latency) -> Self {
        self.node_mut(node).latency = latency;
        self
    }

    /// Makes one node `factor` times slower from the start (see
    /// [`super::Fault::Slow`]).
    ///
    /// # Panics
    /// If `node` does not exist (a bug in the test).
    pub fn slow(mut self, node: NodeId, factor: u32) -> Self {
        self.node_mut(node).slow = factor;
        self
    }

    /// Sets the per-operation and per-word execution costs at the nodes.
    pub fn costs(mut self, op_ns: Nanos, word_ns: Nanos) -> Self {
        self.op_ns = op_ns;
        self.word_ns = word_ns;
        self
    }

    /// Makes nodes stall between the operations of a batch: with `probability`, for
    /// up to `max_ns` (see [`SimConfig::stall_ns`]).
    pub fn stalls(mut self, probability: f64, max_ns: Nanos) -> Self {
        self.stall_probability = probability;
        self.stall_ns = max_ns;
        self
    }

    /// Sets how long after its post a batch lost to a crashed node fails
    /// ([`SimConfig::qp_timeout_ns`]; `None`: never).
    pub fn qp_timeout(mut self, timeout_ns: Option<Nanos>) -> Self {
        self.qp_timeout_ns = timeout_ns;
        self
    }

    /// Sets whether every trace event is kept in memory.
    pub fn keep_trace(mut self, keep: bool) -> Self {
        self.keep_trace = keep;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_configure_the_named_nodes() {
        let config = SimConfig::new(3, 64)
            .latency(Latency::new(500, 0))
            .node_latency(NodeId(2), Latency::new(9, 1).with_tail(0.5, 7))
            .slow(NodeId(0), 4)
            .costs(1, 2)
            .stalls(0.25, 900)
            .keep_trace(false);
        assert_eq!(config.node_count(), 3);
        assert_eq!(config.nodes[0].slow, 4);
        assert_eq!(config.nodes[1].latency, Latency::new(500, 0));
        assert_eq!(config.nodes[1].slow, 1);
        assert_eq!(config.nodes[2].latency.tail_ns, 7);
        assert_eq!(
            (config.op_ns, config.word_ns, config.keep_trace),
            (1, 2, false)
        );
        assert_eq!((config.stall_probability, config.stall_ns), (0.25, 900));
    }

    #[test]
    #[should_panic(expected = "there is no node 3 to configure")]
    fn configuring_a_missing_node_is_a_test_bug() {
        let _ = SimConfig::new(3, 64).slow(NodeId(3), 2);
    }
}
