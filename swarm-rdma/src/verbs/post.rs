//! Posting a planned chain: one linked list of `ibv_send_wr`, one `ibv_post_send`.
//!
//! Everything about the chain was decided by [`crate::wr::plan`]; this only
//! transcribes it. One call per chain means one doorbell per memory node per
//! roundtrip.
//!
//! The finished list goes through [`SendQueue`], the one boundary between the
//! transport and a verbs provider: a real [`QueuePair`] hands it to `ibv_post_send`,
//! the emulated provider ([`crate::emu`]) executes the very same structures, so the
//! code that builds them runs in every test.

use rdma_sys::{atomic_t, ibv_post_send, ibv_send_wr, ibv_sge, ibv_wr_opcode, rdma_t};
use swarm_core::fabric::{Batch, MAX_BATCH_OPS, Op};

use crate::verbs::qp::QueuePair;
use crate::wr::{Chain, Local, Opcode, wr_id};

/// Why a chain could not be posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostFailure {
    /// The errno `ibv_post_send` returned.
    pub errno: i32,
    /// How many requests of the chain were posted before the failing one.
    pub posted: usize,
}

/// Where a chain's staging slice is in local registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingSlice {
    /// Address of the slice's first byte.
    pub addr: u64,
    /// Local key of the registered memory holding it.
    pub lkey: u32,
}

/// Where a built list of work requests is posted: a verbs provider's send queue.
pub trait SendQueue {
    /// Posts the NULL-terminated list starting at `wr`, as `ibv_post_send` does:
    /// returns 0, or an errno with `*bad` pointing at the first request not posted.
    ///
    /// # Safety
    ///
    /// `wr` must be a well-formed list of `ibv_send_wr` whose `next` and `sg_list`
    /// pointers (and, for inline requests, the memory their entries name) stay
    /// valid for the duration of the call, and `bad` must be a valid out-pointer.
    unsafe fn post_send(&self, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32;
}

impl SendQueue for QueuePair {
    unsafe fn post_send(&self, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
        // SAFETY: the queue pair is alive; the caller vouches for the list.
        unsafe { ibv_post_send(self.as_ptr(), wr, bad) }
    }
}

/// Posts `chain` (planned from `batch`) on `qp` as chain number `seq`. On failure,
/// reports the errno and how many requests (a prefix) the provider did post.
pub fn post_chain(
    qp: &impl SendQueue,
    chain: &Chain,
    batch: &Batch,
    staging: StagingSlice,
    seq: u64,
) -> Result<(), PostFailure> {
    let requests = chain.requests();
    if requests.is_empty() {
        return Ok(());
    }
    // SAFETY: ibv_sge and ibv_send_wr are plain data, pointers and unions of those;
    // all-zero (null pointers, zero lengths) is valid for every field not set below.
    let mut sges: [ibv_sge; MAX_BATCH_OPS] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut wrs: [ibv_send_wr; MAX_BATCH_OPS] = unsafe { std::mem::zeroed() };
    for (i, request) in requests.iter().enumerate() {
        let sge = &mut sges[i];
        let num_sge = match request.local {
            Local::None => 0,
            Local::Inline => {
                let Some(Op::Write { data, .. }) = batch.ops().get(request.op) else {
                    return Err(PostFailure {
                        errno: libc::EINVAL,
                        posted: 0,
                    });
                };
                // The provider copies inline payloads during ibv_post_send; `batch`
                // outlives the call.
                sge.addr = data.as_ptr() as u64;
                sge.length = data.len() as u32;
                sge.lkey = 0;
                1
            }
            Local::Staged { offset, len } => {
                sge.addr = staging.addr + offset;
                sge.length = len;
                sge.lkey = staging.lkey;
                1
            }
        };
        let wr = &mut wrs[i];
        wr.wr_id = wr_id(seq, i);
        wr.num_sge = num_sge;
        wr.send_flags = request.flags.bits();
        match request.opcode {
            Opcode::Read | Opcode::Write => {
                wr.opcode = if request.opcode == Opcode::Read {
                    ibv_wr_opcode::IBV_WR_RDMA_READ
                } else {
                    ibv_wr_opcode::IBV_WR_RDMA_WRITE
                };
                wr.wr.rdma = rdma_t {
                    remote_addr: request.remote_addr,
                    rkey: request.rkey,
                };
            }
            Opcode::CompareSwap => {
                wr.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = atomic_t {
                    remote_addr: request.remote_addr,
                    compare_add: request.compare,
                    swap: request.swap,
                    rkey: request.rkey,
                };
            }
        }
    }
    // Link the list last, through raw pointers only, so that no later access to the
    // arrays invalidates them.
    let n = requests.len();
    let sge_base = sges.as_mut_ptr();
    let wr_base = wrs.as_mut_ptr();
    for i in 0..n {
        // SAFETY: `i < n <= MAX_BATCH_OPS`, so every offset is inside its array.
        unsafe {
            let wr = wr_base.add(i);
            if (*wr).num_sge > 0 {
                (*wr).sg_list = sge_base.add(i);
            }
            if i + 1 < n {
                (*wr).next = wr_base.add(i + 1);
            }
        }
    }
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    // SAFETY: `wrs[0..n]` is a well-formed NULL-terminated list whose scatter/gather
    // entries point into registered staging memory (or, for inline requests, into
    // the batch's payloads); both arrays outlive the call.
    let rc = unsafe { qp.post_send(wr_base, &mut bad) };
    if rc != 0 {
        // `bad` points at the first request not posted (or is null if unknown).
        let posted = if bad.is_null() {
            0
        } else {
            (bad as usize).saturating_sub(wr_base as usize) / std::mem::size_of::<ibv_send_wr>()
        };
        return Err(PostFailure {
            errno: rc,
            posted: posted.min(n),
        });
    }
    Ok(())
}
