//! Completion queues: where a client learns that its chains finished.
//!
//! Each client thread polls its own completion queue from
//! [`swarm_core::Fabric::progress`] — busy polling, as the paper's implementation
//! does (§6): the core's executor re-polls its operations after every progress call,
//! so completions wake them without any interrupt or waker.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_cq, ibv_create_cq, ibv_destroy_cq, ibv_poll_cq, ibv_wc};

use crate::error::RdmaError;
use crate::verbs::device::Device;

/// Entries drained per `ibv_poll_cq` call.
pub const POLL_BATCH: usize = 16;

/// The fields of a work completion the transport uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request id (see [`crate::fabric`] for its encoding).
    pub wr_id: u64,
    /// The `ibv_wc_status` code.
    pub status: u32,
    /// Vendor-specific error detail (meaningful only on error).
    pub vendor_err: u32,
    /// The local queue pair number.
    pub qp_num: u32,
}

/// A completion queue, destroyed on drop (after every queue pair using it: each
/// holds an `Arc` to it).
#[derive(Debug)]
pub struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    device: Arc<Device>,
}

// SAFETY: a CQ is used only through verbs, which are thread-safe.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above; concurrent ibv_poll_cq calls on one CQ are serialised by the
// provider's CQ lock.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a completion queue of at least `entries` entries.
    pub fn new(device: Arc<Device>, entries: u32) -> Result<Self, RdmaError> {
        let max = device.caps().max_cqe;
        if entries > max {
            return Err(RdmaError::Unsupported {
                device: device.name().to_owned(),
                what: format!(
                    "a completion queue of {entries} entries is needed but the device allows {max}: lower the send queue depth or the node count"
                ),
            });
        }
        let entries = i32::try_from(entries.max(1)).unwrap_or(i32::MAX);
        // SAFETY: the context is open; no completion channel or context pointer is
        // attached.
        let cq = unsafe {
            ibv_create_cq(
                device.context(),
                entries,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| RdmaError::last_os("ibv_create_cq"))?;
        Ok(Self { cq, device })
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// The device the queue belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Drains up to [`POLL_BATCH`] completions into `out` (cleared first). Returns
    /// the `ibv_poll_cq` error code if polling itself failed.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<(), i32> {
        out.clear();
        // SAFETY: ibv_wc is plain data (integers and a union of integers); zero is a
        // valid value for ibv_poll_cq to overwrite.
        let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: the CQ is alive; `wcs` has room for POLL_BATCH entries.
        let n = unsafe { ibv_poll_cq(self.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(n);
        }
        out.extend(wcs[..n as usize].iter().map(|wc| WorkCompletion {
            wr_id: wc.wr_id,
            status: wc.status,
            vendor_err: wc.vendor_err,
            qp_num: wc.qp_num,
        }));
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, after every QP using it (they
        // hold Arcs to this queue).
        let rc = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_destroy_cq failed");
        }
    }
}
