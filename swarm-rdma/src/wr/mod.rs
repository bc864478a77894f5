//! From an ordered batch to one chain of verbs work requests, as plain data.
//!
//! SWARM §2.1 asks the fabric to *pipeline* operations to one memory node: they
//! execute in order ("if the second update is visible, so is the first") and
//! complete in one roundtrip. On RDMA that is one chain of work requests on one
//! reliable-connected queue pair, posted with a single `ibv_post_send` (one
//! doorbell). This module decides everything about that chain — opcode, remote
//! address, local buffer, flags — without touching verbs, so it is unit-tested
//! here; [`crate::verbs::post`] only transcribes it into `ibv_send_wr`s.
//!
//! # Flags
//!
//! * **SIGNALED** on the last request only: one completion per batch. RC completions
//!   of one send queue arrive in order, so the last one implies the others; a request
//!   that fails is reported even when unsignaled, and so are the requests flushed
//!   after it.
//! * **INLINE** on writes of at most `max_inline` bytes (the queue pair's capability):
//!   the payload is copied into the work request, no staging copy or local key needed.
//! * **FENCE** where the InfiniBand ordering rules require one. What the rules give
//!   and take on one RC queue pair (IBA Vol. 1, §10.8.3.3, Table 79 "Work Request
//!   Operation Ordering", as summarised by rdmamojo.com's "Fence" article and
//!   discussed in openucx/ucx issues #7215 and #8221; LOCO §2.2 states the write
//!   rule citing RFC 5040):
//!   - Requests are executed by the responder in order, and an RDMA WRITE is fully
//!     placed before a *later* RDMA READ or ATOMIC on the same queue pair executes.
//!     So WRITE → WRITE, WRITE → READ and WRITE → CAS need no flag: In-n-Out's
//!     "write the buffer, then CAS the metadata" (SWARM §4.2) is ordered as is.
//!     A fence could not help there anyway: it only waits for earlier READs and
//!     ATOMICs.
//!   - A request that follows an RDMA READ or ATOMIC may begin before that READ or
//!     ATOMIC has completed ("fence when an RDMA Read or Atomic is followed by a
//!     Send, RDMA Write or Atomic and the first one can be outstanding"). So a WRITE
//!     or CAS after a CAS gets FENCE, or the second update could land before the
//!     first.
//!   - A READ after a CAS also gets FENCE. Whether the responder already orders
//!     ATOMIC → READ is not something the sources above state explicitly, so we do
//!     not rely on it. No SWARM batch has that shape, so it costs nothing in practice.
//!   - An update after a READ may be executed before the READ has read its bytes, so
//!     the READ may observe an update that comes *later* in its own batch. SWARM's
//!     contract orders updates only, and Safe-Guess' write batch ("read the metadata
//!     ∥ write the buffer, then CAS the metadata", SWARM §3.2) does not care, so the
//!     default [`ReadOrdering::Concurrent`] leaves it unfenced; a fence there would
//!     stall the batch for a full extra network roundtrip. [`ReadOrdering::Strict`]
//!     fences it, for program order exactly like the shared-memory fabric.
//!
//!   Caveats: these rules assume the memory region is *not* registered with relaxed
//!   ordering (`IBV_ACCESS_RELAXED_ORDERING`, which we never set) and that the NIC
//!   places RDMA WRITEs in order (newer NVIDIA NICs can place data out of order when
//!   a queue pair opts in through vendor extensions, see openucx/ucx PR #10658; plain
//!   verbs, as used here, never opt in). The primary text of Table 79 was not
//!   available to us, only the secondary sources above. `tests/device.rs` checks
//!   write → read, CAS → read and (strict) read → write on hardware or soft-RoCE,
//!   which can catch a violation but not prove its absence.
//!
//! # Across chains
//!
//! Fence state does not carry over from one chain to the next, even on one queue
//! pair: a CAS at the start of a chain may execute before a CAS at the end of the
//! previous chain has. This is the fabric contract (no order between batches,
//! [`swarm_core::fabric`] item 3), which the protocols honour by waiting for a
//! batch's completion before they post anything that depends on it; fencing every
//! chain's first request would instead stall back-to-back batches (a background
//! VERIFIED mark behind a CAS) for a full roundtrip.
//!
//! # Addresses and local buffers
//!
//! The core's addresses are byte offsets in a node's memory. A node's memory is one
//! memory region starting at the node header, so the remote address is the region's
//! base plus the offset, after [`swarm_core::fabric::check_batch`]'s bounds checks.
//! Reads, CAS results and non-inline write payloads live in the client's registered
//! staging buffer; the plan lays them out at 8-byte aligned offsets relative to the
//! chain's own staging slice.

use swarm_core::fabric::{Batch, Completion, FabricError, NodeId, Op, OpOutput, check_batch};

/// Where a memory node's memory is, as seen by one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Remote virtual address of offset 0.
    pub addr: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
    /// Bytes in the region (the node size).
    pub size: u64,
}

impl RemoteRegion {
    /// The remote address of `[offset, offset + len)`, checked against the region.
    pub fn translate(&self, node: NodeId, offset: u64, len: u64) -> Result<u64, FabricError> {
        swarm_core::fabric::check_bounds(node, offset, len, self.size)?;
        self.addr
            .checked_add(offset)
            .ok_or(FabricError::OutOfBounds {
                node,
                addr: offset,
                len,
                size: self.size,
            })
    }
}

/// The verbs operation of one work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap,
}

bitflags::bitflags! {
    /// Send flags, with the bit values of `ibv_send_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier READs and ATOMICs to complete.
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED`: generate a completion on success.
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_INLINE`: the payload is copied into the work request.
        const INLINE = 1 << 3;
    }
}

/// The local side of a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Nothing moves (a zero-length read or write: no scatter/gather entry).
    None,
    /// The payload is the write's own bytes, carried inline.
    Inline,
    /// A slice of the chain's staging buffer: where a read or a CAS result lands, or
    /// where a write's payload is copied first.
    Staged {
        /// Byte offset from the start of the chain's staging slice (8-aligned).
        offset: u64,
        /// Bytes.
        len: u32,
    },
}

/// One work request of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Index of the batch operation this request carries out.
    pub op: usize,
    /// The verbs operation.
    pub opcode: Opcode,
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// The local buffer.
    pub local: Local,
    /// Send flags.
    pub flags: SendFlags,
    /// CAS: the value expected.
    pub compare: u64,
    /// CAS: the value stored if the comparison succeeds.
    pub swap: u64,
}

/// Whether a READ in a batch may observe updates that come later in the same batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadOrdering {
    /// SWARM's contract (§2.1): updates are ordered among themselves and reads see
    /// earlier updates, but a read may also observe a *later* update of its batch.
    /// No extra roundtrip.
    #[default]
    Concurrent,
    /// Full program order: an update after a read is fenced until the read is done
    /// (one more network roundtrip for such batches).
    Strict,
}

/// The byte order in which a device returns a CAS's original value.
///
/// The InfiniBand spec has atomics operate on (and return) 64-bit values in the
/// byte order of the memory they target, which on our little-endian hosts is the
/// host's: mlx5 and soft-RoCE do that. ConnectX-3 (mlx4) returns the original value
/// in network (big-endian) byte order while operating correctly on memory. A
/// self-test at start ([`crate::verbs::selftest`]) tells which one a device is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CasReplyOrder {
    /// The host's byte order.
    #[default]
    Native,
    /// Big-endian (mlx4).
    BigEndian,
}

impl CasReplyOrder {
    /// The value of a CAS reply's 8 bytes.
    pub fn decode(self, bytes: [u8; 8]) -> u64 {
        match self {
            Self::Native => u64::from_ne_bytes(bytes),
            Self::BigEndian => u64::from_be_bytes(bytes),
        }
    }
}

/// Per-queue-pair limits and choices that shape a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainLimits {
    /// Largest write carried inline (the queue pair's `max_inline_data`; 0: never).
    pub max_inline: u32,
    /// Largest single message the port accepts (`ibv_port_attr::max_msg_sz`).
    pub max_message: u32,
    /// Read ordering within a batch.
    pub ordering: ReadOrdering,
    /// How the device returns CAS results.
    pub cas_reply: CasReplyOrder,
}

/// Staging slots are 8-byte aligned (atomics need an aligned result buffer).
pub const STAGING_ALIGN: u64 = 8;

/// A planned chain: what to post for one batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    wrs: heapless::Vec<WorkRequest, { swarm_core::fabric::MAX_BATCH_OPS }>,
    staging_len: u64,
    cas_reply: CasReplyOrder,
}

impl Chain {
    /// The work requests, in posting order (one per batch operation).
    pub fn requests(&self) -> &[WorkRequest] {
        &self.wrs
    }

    /// Bytes of staging buffer the chain needs (a multiple of [`STAGING_ALIGN`]).
    pub fn staging_len(&self) -> u64 {
        self.staging_len
    }

    /// Whether there is nothing to post (an empty batch).
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Copies the payload of every staged (non-inline) write into `staging`, the
    /// chain's staging slice. Call before posting.
    pub fn fill_staging(&self, batch: &Batch, staging: &mut [u8]) {
        for wr in &self.wrs {
            if let (Opcode::Write, Local::Staged { offset, len }, Some(Op::Write { data, .. })) =
                (wr.opcode, wr.local, batch.ops().get(wr.op))
            {
                let at = offset as usize;
                staging[at..at + len as usize].copy_from_slice(data);
            }
        }
    }

    /// Assembles the batch's completion from `staging` once the chain completed.
    pub fn complete(&self, staging: &[u8]) -> Completion {
        let mut completion = Completion::new();
        for wr in &self.wrs {
            let output = match (wr.opcode, wr.local) {
                (Opcode::Read, Local::Staged { offset, len }) => {
                    let at = offset as usize;
                    OpOutput::Read(staging[at..at + len as usize].to_vec())
                }
                (Opcode::Read, _) => OpOutput::Read(Vec::new()),
                (Opcode::Write, _) => OpOutput::Written,
                (Opcode::CompareSwap, Local::Staged { offset, .. }) => {
                    let at = offset as usize;
                    let mut word = [0u8; 8];
                    word.copy_from_slice(&staging[at..at + 8]);
                    OpOutput::Cas(self.cas_reply.decode(word))
                }
                (Opcode::CompareSwap, _) => OpOutput::Cas(0),
            };
            // A chain has one request per batch operation, and a completion has
            // the same capacity as a batch.
            let _ = completion.push(output);
        }
        completion
    }
}

/// Bits of a work-request id that hold the request's index in its chain.
pub const WR_INDEX_BITS: u32 = 3;
const _: () = assert!(swarm_core::fabric::MAX_BATCH_OPS <= 1 << WR_INDEX_BITS);

/// The id of request `index` of chain number `seq`: completions name their chain and
/// their position in it (an error may be reported on any request of a chain).
/// Chain numbers are never reused, so a late completion cannot be mistaken for one of
/// a newer chain.
pub fn wr_id(seq: u64, index: usize) -> u64 {
    (seq << WR_INDEX_BITS) | index as u64
}

/// Splits a work-request id into its chain number and index.
pub fn split_wr_id(id: u64) -> (u64, usize) {
    (
        id >> WR_INDEX_BITS,
        (id & ((1 << WR_INDEX_BITS) - 1)) as usize,
    )
}

/// Plans the chain for `batch` to `node`, whose memory is `region`.
///
/// Fails like every transport does on a bad batch (out of bounds, misaligned CAS),
/// and with [`FabricError::OutOfBounds`] (whose `size` is then the port's message
/// limit) for a single operation larger than one RDMA message.
pub fn plan(
    node: NodeId,
    batch: &Batch,
    region: &RemoteRegion,
    limits: &ChainLimits,
) -> Result<Chain, FabricError> {
    check_batch(node, batch, region.size)?;
    let mut chain = Chain::default();
    // Earlier READs / ATOMICs not yet behind a fence (see the module docs).
    let mut open_read = false;
    let mut open_atomic = false;
    let mut staging = 0u64;
    let mut stage = |len: u32| {
        let offset = staging;
        staging += u64::from(len).next_multiple_of(STAGING_ALIGN);
        Local::Staged { offset, len }
    };
    for (index, op) in batch.ops().iter().enumerate() {
        let (opcode, addr, len) = match op {
            Op::Read { addr, len } => (Opcode::Read, *addr, u64::from(*len)),
            Op::Write { addr, data } => (Opcode::Write, *addr, data.len() as u64),
            Op::Cas { addr, .. } => (Opcode::CompareSwap, *addr, 8),
        };
        if len > u64::from(limits.max_message) {
            return Err(FabricError::OutOfBounds {
                node,
                addr,
                len,
                size: u64::from(limits.max_message),
            });
        }
        // Lengths fit in u32 now: max_message is a u32.
        let len32 = len as u32;
        let remote_addr = region.translate(node, addr, len)?;
        let mut flags = SendFlags::empty();
        let is_update = opcode != Opcode::Read;
        if open_atomic || (limits.ordering == ReadOrdering::Strict && is_update && open_read) {
            flags |= SendFlags::FENCE;
            open_read = false;
            open_atomic = false;
        }
        let (local, compare, swap) = match op {
            Op::Read { .. } if len32 == 0 => (Local::None, 0, 0),
            Op::Read { .. } => (stage(len32), 0, 0),
            Op::Write { .. } if len32 == 0 => (Local::None, 0, 0),
            Op::Write { .. } if len32 <= limits.max_inline => {
                flags |= SendFlags::INLINE;
                (Local::Inline, 0, 0)
            }
            Op::Write { .. } => (stage(len32), 0, 0),
            Op::Cas { expected, new, .. } => (stage(8), *expected, *new),
        };
        match opcode {
            Opcode::Read => open_read = true,
            Opcode::CompareSwap => open_atomic = true,
            Opcode::Write => {}
        }
        // The batch has at most as many operations as the chain can hold.
        let _ = chain.wrs.push(WorkRequest {
            op: index,
            opcode,
            remote_addr,
            rkey: region.rkey,
            local,
            flags,
            compare,
            swap,
        });
    }
    if let Some(last) = chain.wrs.last_mut() {
        last.flags |= SendFlags::SIGNALED;
    }
    chain.staging_len = staging;
    chain.cas_reply = limits.cas_reply;
    Ok(chain)
}

#[cfg(test)]
mod tests;
