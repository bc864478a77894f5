//! An emulated verbs provider, below the verbs boundary, for what soft-RoCE cannot
//! show.
//!
//! The soft-RoCE VM ([`crate`]'s README) runs the real stack, but rxe neither
//! reorders what the InfiniBand ordering rules allow, nor returns CAS results in
//! another byte order (ConnectX-3 does), nor fails in the middle of a chain on
//! demand. This provider does all three, deterministically from a seed, while the
//! transport above it is the real one: [`crate::wr::plan`] builds the chain,
//! [`crate::verbs::post::post_chain`] builds the actual `ibv_send_wr` list and hands
//! it through [`crate::verbs::post::SendQueue`], and [`EmuQp`] captures those
//! structures as a provider would. What it models (see `queue.rs`):
//!
//! * **send queue**: a depth, counted until a completion covers a request (an
//!   unsignaled request frees its slot only with a later completion); posting past
//!   it fails with `ENOMEM` and the first request not posted. Inline payloads are
//!   copied at post time, refused (`EINVAL`) above the queue pair's limit; staged
//!   payloads are read when the request executes, as DMA does;
//! * **checks**: local key and bounds (`IBV_WC_LOC_PROT_ERR`), remote key and bounds
//!   (`IBV_WC_REM_ACCESS_ERR`), CAS alignment (`IBV_WC_REM_INV_REQ_ERR`) — an error
//!   completion, never a panic;
//! * **completions**: only signaled requests complete on success; the first error
//!   completes with its status and every later request of the queue pair (this
//!   chain's and later ones') is flushed (`IBV_WC_WR_FLUSH_ERR`): the error state;
//! * **ordering**: a queue pair executes in order, except that a request without
//!   FENCE may overtake an outstanding READ or ATOMIC right before it (IBA's rule, as
//!   summarised in [`crate::wr`]): a planner that forgets a fence produces a
//!   visible reordering. Queue pairs to different nodes progress in a seeded random
//!   interleaving, a few requests per poll;
//! * **faults**: a node silent (nothing executes), held (nothing executes until the
//!   next post on the queue pair wakes it, as a soft-RoCE requester asleep on a
//!   request), or crashing after `n` more requests (`IBV_WC_RETRY_EXC_ERR`, possibly
//!   mid-chain, then flushes); posts refused after a given number of requests
//!   (`EmuQp::refuse_posts`);
//! * **CAS replies** in native or big-endian byte order ([`CasReplyOrder`]).
//!
//! It is the only software NIC of this crate: the engine's own tests
//! (`fabric/engine_tests.rs`) run on an [`EmuNic`] too, with overtaking off.
//!
//! [`EmulatedCluster`] holds memory nodes shared by any number of clients (one
//! [`EmulatedFabric`] per thread), so protocol histories run over it exactly as over
//! shared memory, with the checker. Those clients are the engine alone: no
//! bootstrap, no reconnects.
//!
//! [`EmulatedMemnode`]s go one layer up: each is a memory node *process* behind the
//! real bootstrap server (loopback TCP, the cluster token, its incarnation in the
//! sealed `Accept`), which can drop its clients, stop, and restart with zeroed
//! memory under another incarnation at the same address. Their clients are
//! [`crate::RdmaFabric`]s over [`EmuTransport`], so the fabric's reconnects,
//! incarnation checks, admissions and lost-memory reports run as over verbs
//! (`tests/emulated_reconnect.rs`).

mod memnode;
mod memory;
mod nic;
mod queue;
mod transport;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use memnode::{EmuWire, EmulatedMemnode, Route};
pub use memory::EmuNode;
pub use nic::{EmuConnection, EmuNic};
pub use queue::{EmuQp, LocalRegion, Mode, Step};
pub use transport::EmuTransport;

use crate::fabric::engine::{Engine, EngineFabric, NodeLink};
use crate::wr::{CasReplyOrder, ChainLimits, ReadOrdering, RemoteRegion};

/// A fabric over the emulated provider (the real engine on an [`EmuNic`]).
pub type EmulatedFabric = EngineFabric<EmuNic>;

/// How emulated clients connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuOptions {
    /// Send-queue depth per queue pair.
    pub depth: u32,
    /// Largest inline payload.
    pub max_inline: u32,
    /// Staging bytes per client.
    pub staging: usize,
    /// Read ordering the planner uses.
    pub ordering: ReadOrdering,
    /// How the emulated device returns CAS results.
    pub device_cas_reply: CasReplyOrder,
    /// How the transport decodes them (what a self-test would have found).
    pub decode_cas_reply: CasReplyOrder,
}

impl Default for EmuOptions {
    fn default() -> Self {
        Self {
            depth: 64,
            max_inline: 64,
            staging: 1 << 20,
            ordering: ReadOrdering::Concurrent,
            device_cas_reply: CasReplyOrder::Native,
            decode_cas_reply: CasReplyOrder::Native,
        }
    }
}

/// Emulated memory nodes, shared by the clients made from it.
#[derive(Debug)]
pub struct EmulatedCluster {
    nodes: Vec<Arc<EmuNode>>,
    options: EmuOptions,
}

impl EmulatedCluster {
    /// `nodes` zeroed memory nodes of `size` bytes each.
    pub fn new(nodes: usize, size: usize, options: EmuOptions) -> Self {
        Self {
            nodes: (0..nodes)
                .map(|i| {
                    let base = 0x7f00_0000_0000 + ((i as u64) << 36);
                    Arc::new(EmuNode::new(base, 0x5000 + i as u32, size))
                })
                .collect(),
            options,
        }
    }

    /// The memory nodes.
    pub fn nodes(&self) -> &[Arc<EmuNode>] {
        &self.nodes
    }

    /// A client handle (one per thread) whose schedule is drawn from `seed`.
    pub fn client(&self, seed: u64) -> Result<EmulatedFabric, crate::RdmaError> {
        let o = self.options;
        let nic = EmuNic::new(
            self.nodes.clone(),
            o.depth,
            o.max_inline,
            o.staging,
            o.device_cas_reply,
            seed,
        )?;
        let links = self
            .nodes
            .iter()
            .map(|node| {
                Some(NodeLink {
                    region: RemoteRegion {
                        addr: node.base,
                        rkey: node.rkey,
                        size: node.size(),
                    },
                    limits: ChainLimits {
                        max_inline: o.max_inline,
                        max_message: 1 << 30,
                        ordering: o.ordering,
                        cas_reply: o.decode_cas_reply,
                    },
                    depth: o.depth,
                })
            })
            .collect();
        Ok(EngineFabric::new(Engine::new(nic, links)))
    }
}
