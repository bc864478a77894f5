//! The engine's NIC over the emulated provider: the real planner and the real
//! `post_chain` feed [`EmuQp`]s, whose completions the engine polls.

use std::sync::Arc;

use swarm_core::fabric::Batch;

use super::memory::EmuNode;
use super::queue::{EmuQp, LocalRegion, Mode, Step};
use crate::fabric::engine::{Nic, PostFailure};
use crate::verbs::cq::WorkCompletion;
use crate::verbs::memory::Mapping;
use crate::verbs::post::{StagingSlice, post_chain};
use crate::wr::{CasReplyOrder, Chain};

/// xorshift64*: a small seeded generator, so a failing schedule can be replayed.
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A client's emulated queue pair and the memory node it reaches: what a queue
/// pair number routes to on a real fabric.
#[derive(Debug)]
pub struct EmuConnection {
    /// The client's queue pair.
    pub qp: EmuQp,
    /// The memory its requests execute on.
    pub node: Arc<EmuNode>,
}

/// One emulated client's verbs objects: a queue pair per node, a registered
/// staging buffer, a seeded schedule.
#[derive(Debug)]
pub struct EmuNic {
    /// Per node; `None`: never connected.
    connections: Vec<Option<EmuConnection>>,
    staging: Mapping,
    lkey: u32,
    cas_reply: CasReplyOrder,
    rng: Rng,
    /// Most requests executed per poll (at least 1): fewer means completions trail
    /// further behind posts.
    pub steps_per_poll: u64,
    /// Percent of the chances to overtake an outstanding READ/ATOMIC that are
    /// taken.
    pub overtake_percent: u64,
    /// A broken device: every CAS reply is zero.
    pub broken_cas_replies: bool,
}

impl EmuNic {
    /// Queue pairs (send queue `depth`, inline up to `max_inline`) to each of
    /// `nodes`, a staging buffer of `staging` bytes, CAS replies in `cas_reply`
    /// order, and a schedule drawn from `seed`.
    pub fn new(
        nodes: Vec<Arc<EmuNode>>,
        depth: u32,
        max_inline: u32,
        staging: usize,
        cas_reply: CasReplyOrder,
        seed: u64,
    ) -> Result<Self, crate::RdmaError> {
        let connections = nodes
            .into_iter()
            .enumerate()
            .map(|(i, node)| {
                Some(EmuConnection {
                    qp: EmuQp::new(0x100 + i as u32, depth, max_inline),
                    node,
                })
            })
            .collect();
        Self::with_connections(connections, staging, cas_reply, seed)
    }

    /// A NIC over queue pairs already connected (`connections[i]`: node `i`'s, if
    /// it was reached), a staging buffer of `staging` bytes, CAS replies in
    /// `cas_reply` order, and a schedule drawn from `seed`.
    pub fn with_connections(
        connections: Vec<Option<EmuConnection>>,
        staging: usize,
        cas_reply: CasReplyOrder,
        seed: u64,
    ) -> Result<Self, crate::RdmaError> {
        let mut rng = Rng::new(seed);
        let lkey = (rng.next() as u32) | 1;
        Ok(Self {
            connections,
            staging: Mapping::new(staging, false)?,
            lkey,
            cas_reply,
            rng,
            steps_per_poll: 4,
            overtake_percent: 50,
            broken_cas_replies: false,
        })
    }

    /// Node `node`'s queue pair (tests post to it directly). Panics if the node
    /// was never connected.
    pub fn qp(&self, node: usize) -> &EmuQp {
        &self.connection(node).qp
    }

    /// The memory node behind node `node`'s queue pair. Panics if the node was never
    /// connected.
    pub fn node(&self, node: usize) -> &Arc<EmuNode> {
        &self.connection(node).node
    }

    /// Changes how node `node` behaves for this client. Panics if the node was
    /// never connected.
    pub fn set_mode(&self, node: usize, mode: Mode) {
        self.connection(node).qp.set_mode(mode);
    }

    /// Puts `connection` in place of node `node`'s (after a reconnect) and returns
    /// the old one.
    pub fn replace_connection(
        &mut self,
        node: usize,
        connection: EmuConnection,
    ) -> Option<EmuConnection> {
        self.connections
            .get_mut(node)
            .and_then(|slot| slot.replace(connection))
    }

    fn connection(&self, node: usize) -> &EmuConnection {
        self.connections[node]
            .as_ref()
            .unwrap_or_else(|| panic!("node {node} was never connected"))
    }

    /// The staging buffer's address and key (where a chain's local buffers are).
    pub fn staging_slice(&self, offset: u64) -> StagingSlice {
        StagingSlice {
            addr: self.staging.addr() + offset,
            lkey: self.lkey,
        }
    }

    /// Runs up to `steps` requests, each on a queue pair drawn at random among
    /// those with work, into `out`.
    pub fn run(&mut self, steps: u64, out: &mut Vec<WorkCompletion>) {
        let addr = self.staging.addr();
        let len = self.staging.len();
        let Some(bytes) = self.staging.slice_mut(0, len) else {
            return;
        };
        let mut local = LocalRegion {
            addr,
            lkey: self.lkey,
            bytes,
        };
        for _ in 0..steps {
            let ready: Vec<&EmuConnection> = self
                .connections
                .iter()
                .flatten()
                .filter(|c| c.qp.ready())
                .collect();
            if ready.is_empty() {
                break;
            }
            let connection = ready[self.rng.below(ready.len() as u64) as usize];
            let overtake = self.rng.below(100) < self.overtake_percent;
            connection.qp.step(&mut Step {
                local: &mut local,
                node: &connection.node,
                cas_reply: self.cas_reply,
                broken_cas_replies: self.broken_cas_replies,
                overtake,
                out,
            });
        }
    }
}

impl Nic for EmuNic {
    fn staging_capacity(&self) -> u64 {
        self.staging.len() as u64
    }

    fn staging_mut(&mut self, offset: u64, len: u64) -> &mut [u8] {
        self.staging.extent_mut(offset, len)
    }

    fn post(
        &mut self,
        node: usize,
        seq: u64,
        chain: &Chain,
        batch: &Batch,
        staging_offset: u64,
    ) -> Result<(), PostFailure> {
        let slice = self.staging_slice(staging_offset);
        let Some(Some(EmuConnection { qp, .. })) = self.connections.get(node) else {
            return Err(PostFailure {
                errno: libc::ENOTCONN,
                posted: 0,
            });
        };
        post_chain(qp, chain, batch, slice, seq)
    }

    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32> {
        out.clear();
        let steps = 1 + self.rng.below(self.steps_per_poll.max(1));
        self.run(steps, out);
        Ok(())
    }

    fn abort(&mut self, node: usize) {
        if let Some(Some(connection)) = self.connections.get(node) {
            connection.qp.to_error();
        }
    }
}
