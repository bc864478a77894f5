//! The hook of [`Fabric::fence_owner`] and [`Fabric::revoke_owner`] (see [`OwnerFence`]).
//!
//! [`Fabric::fence_owner`]: super::Fabric::fence_owner
//! [`Fabric::revoke_owner`]: super::Fabric::revoke_owner

use alloc::vec::Vec;

use super::{Nanos, NodeId};

/// What a client asks memory nodes to fence it under ([`Fabric::fence_owner`]).
///
/// A lease bounds when a client *starts* stores, not when they land: a client paused
/// between its last lease check and its stores (SIGSTOP, a VM's stolen time, a long
/// preemption) lands them whenever it wakes up. rTX (seed `rtx.txt`) calls such a
/// store a "fly WRITE" and never lets a lease's expiry alone release anything. A
/// store (SWARM-KV) therefore takes a dead client's writer row over, or releases it,
/// only once nothing that client posted can land any more. How that is known depends
/// on the transport:
///
/// * **On one host** (shared memory) a process that is gone stores nothing more, so
///   the store waits for the owner's process to be gone (`swarm_kv`'s
///   `owner_process`); the transport needs no hook ([`Revocation::NotNeeded`], the
///   default).
/// * **Over RDMA** a client's stores reach a memory node only through its queue pairs
///   to that node. The client asks each node to *fence* it under its lease word
///   ([`Fabric::fence_owner`]); a reclaimer that killed the lease asks every node to
///   *revoke* it ([`Fabric::revoke_owner`]): the node destroys the queue pairs fenced
///   under that word (the responder then executes none of their requests) and refuses
///   to fence a new one for that owner, and only then acknowledges. The takeover
///   proceeds once every node that may serve again acknowledged. A node that does not
///   answer stalls the takeover: timing bounds liveness here, never safety.
///
/// The protocol core does no I/O: both methods are the transport's, and their
/// defaults say that the transport needs neither.
///
/// **Where a revocation blocks.** [`Fabric::revoke_owner`] is synchronous: over RDMA
/// it waits for every node's answer on the bootstrap connections, each within a
/// bootstrap timeout (the nodes are asked in parallel, so one call lasts one
/// timeout at most). It is called only while a writer row is taken over or released:
/// inside a client's registration (`swarm_kv`'s `KvClient::connect`, which blocks its
/// thread anyway, for a whole lease watch; an `AsyncKv` registers on its own worker
/// thread) and `swarm evict`. A fabric serves one client thread, so the call stalls
/// that thread's registration only, never another client of the process.
///
/// [`Fabric::fence_owner`]: super::Fabric::fence_owner
/// [`Fabric::revoke_owner`]: super::Fabric::revoke_owner
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerFence {
    /// Address of the client's lease word (the same on every node).
    pub lease_word: u64,
    /// How long the word may stay unchanged before a node may cut the client on its
    /// own (at least a reclaimer's wait before it may kill the lease).
    pub stall_ns: Nanos,
    /// The first lease counter of this owner's generation: a revocation of the word
    /// up to a counter at or above it revokes this owner.
    pub base: u64,
}

/// How far a revocation got ([`Fabric::revoke_owner`]).
///
/// [`Fabric::revoke_owner`]: super::Fabric::revoke_owner
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revocation {
    /// The transport needs no revocation: the caller judges the owner by other
    /// means (on shared memory: its process).
    NotNeeded,
    /// Every memory node that may serve again acknowledged that no queue pair fenced
    /// under the word with a base at or below the floor exists any more, and that it
    /// refuses to fence one.
    Acknowledged,
    /// Some nodes did not acknowledge: `(node, Some(word))` holds the lease word
    /// `word`, not killed, so it revoked nothing (kill it from `word` and ask again);
    /// `(node, None)` did not answer (a silent node stalls the takeover).
    Incomplete(Vec<(NodeId, Option<u64>)>),
}
