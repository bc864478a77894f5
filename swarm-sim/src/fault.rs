//! The faults a simulation can inject, now or at a virtual time.
//!
//! They are the failures of SWARM §2.2: memory nodes crash (a minority may, and the
//! protocol must not wait for them), the interconnect partitions and heals (a node
//! comes back with its memory), some nodes are slow (a preferred majority may have to
//! be abandoned for a fallback node), some links are slow (clients disagree on which
//! nodes answer first), and clients crash mid-operation, leaving
//! half-done work in memory for others to cope with.

use core::fmt;

use super::fabric::ClientId;
use swarm_core::fabric::NodeId;

/// A fault to inject (see [`super::SimWorld::apply`] and [`super::SimWorld::at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node stops answering: batches in flight to or from it, or executing on it,
    /// are lost, and so are batches arriving later; a lost batch fails a queue pair
    /// timeout after its post (`SimConfig::qp_timeout_ns`), or never completes
    /// without one. Its memory is kept as it was at the crash (a write can be left
    /// half applied).
    Crash(NodeId),
    /// The node answers again, with the memory it had. Batches lost while it was down
    /// stay lost. Models a partition or outage of a node whose memory survived.
    Recover(NodeId),
    /// Multiplies every latency and execution time of the node by the factor, for
    /// messages sent from now on (1 restores full speed; 0 counts as 1).
    Slow(NodeId, u32),
    /// Multiplies the latency of the messages between one client and one node by the
    /// factor, for messages sent from now on (1 restores it; 0 counts as 1): an
    /// asymmetric network, where one client reaches a node late while others reach
    /// it at once, so clients see different majorities in different orders.
    SlowLink(ClientId, NodeId, u32),
    /// The client crashes: the runner stops polling its tasks (dropping them). Its
    /// batches already posted still execute, as on real hardware.
    CrashClient(ClientId),
    /// The client's machine crashes as it makes its `n`-th post from now (`n` ≥ 1; 0
    /// counts as 1): that batch and every later one never leave it, each batch it
    /// posted earlier that has not reached its node yet is lost with probability 1/2
    /// (its network card had not sent it, in no set order), the others execute, and
    /// its tasks are dropped as by [`Fault::CrashClient`]. A writer that dies so in
    /// the middle of a roundtrip leaves its write on any subset of the replicas (an
    /// abandoned write on a minority).
    CrashClientAtPost(ClientId, u32),
    /// The next batch any client posts to `node` with a write into `from..to` is
    /// held on its way (a slow queue pair): it arrives once a later batch that
    /// writes into the same bytes of that node has executed there (it lands right
    /// over that batch's writes), or `max_ns` after its post, whichever comes first.
    /// The fabric contract orders the operations of one batch only, not two batches
    /// to one node, so a batch may be that late: a writer's record batch to a slow
    /// replica landing after the writer reused its slot (docs/pauses.md, H9), or a
    /// reader's write-back batch landing after the writer recycled the slot it
    /// copies into (H7). A crash of its node or its client loses it as any batch
    /// on its way. While a batch to another node is held, the hold waits: one node
    /// is slow so at a time, and a majority still answers.
    HoldWrite {
        /// The node the held batch goes to.
        node: NodeId,
        /// First byte of the range a held batch writes into.
        from: u64,
        /// End (exclusive) of that range.
        to: u64,
        /// Longest hold, from the batch's post.
        max_ns: u64,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Crash(node) => write!(f, "crash n{node}"),
            Self::Recover(node) => write!(f, "recover n{node}"),
            Self::Slow(node, factor) => write!(f, "slow n{node} x{factor}"),
            Self::SlowLink(client, node, factor) => {
                write!(f, "slow link c{}-n{node} x{factor}", client.0)
            }
            Self::CrashClient(client) => write!(f, "crash client c{}", client.0),
            Self::CrashClientAtPost(client, n) => {
                write!(f, "crash client c{} at its post {n} from now", client.0)
            }
            Self::HoldWrite {
                node,
                from,
                to,
                max_ns,
            } => write!(
                f,
                "hold the next write into {from:#x}..{to:#x} to n{node} for up to {max_ns} ns"
            ),
        }
    }
}
