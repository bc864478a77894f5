//! Reliable-connected queue pairs and their state machine (RESET → INIT → RTR → RTS).
//!
//! One RC queue pair per (client thread, memory node): RC gives in-order, reliable,
//! exactly-once execution of one-sided READ, WRITE and atomics, which is what makes a
//! chain an ordered pipeline (SWARM §2.1). The memory node creates the other end per
//! client during the bootstrap and then never touches it.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ibv_access_flags, ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_qp, ibv_qp_attr,
    ibv_qp_attr_mask as mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
};

use crate::error::RdmaError;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::device::PortInfo;
use crate::verbs::gid::{self, LinkLayer};
use crate::wire::QpInfo;

/// Which end of a client ↔ memory-node connection a queue pair is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Issues READs, WRITEs and CAS.
    Client,
    /// Serves them, passively.
    MemoryNode,
}

/// How to build and connect a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSettings {
    /// Which end this is.
    pub role: Role,
    /// The local port.
    pub port: PortInfo,
    /// Send queue depth (work requests outstanding at once).
    pub send_depth: u32,
    /// Inline payload asked for; the device may grant less (see
    /// [`QueuePair::max_inline`]).
    pub max_inline: u32,
    /// Outstanding READs/atomics accepted as a responder.
    pub responder_depth: u8,
    /// Outstanding READs/atomics issued as a requester.
    pub initiator_depth: u8,
    /// Local ACK timeout exponent: 4.096 µs · 2^timeout before a retry.
    pub ack_timeout: u8,
    /// Transport retries before the request fails with `IBV_WC_RETRY_EXC_ERR`.
    pub retry_count: u8,
    /// Traffic class of the GRH (RoCE: the DSCP/ECN byte; lossless classes on PFC
    /// fabrics are picked by it).
    pub traffic_class: u8,
    /// Service level (InfiniBand SL; RoCE maps it to the VLAN priority).
    pub service_level: u8,
}

/// An RC queue pair; destroyed on drop.
#[derive(Debug)]
pub struct QueuePair {
    qp: NonNull<ibv_qp>,
    psn: u32,
    max_inline: u32,
    settings: QpSettings,
    cq: Arc<CompletionQueue>,
}

// SAFETY: the QP is only used through verbs, which are thread-safe.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// Creates an RC queue pair on `cq` and moves it to INIT.
    pub fn new(cq: Arc<CompletionQueue>, settings: QpSettings) -> Result<Self, RdmaError> {
        let device = cq.device().clone();
        let psn = random_psn()?;
        let create = |max_inline: u32| {
            // SAFETY: ibv_qp_init_attr is plain data and pointers; zero (null
            // pointers) is valid for every field we do not set.
            let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = cq.as_ptr();
            init.recv_cq = cq.as_ptr();
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.sq_sig_all = 0;
            init.cap.max_send_wr = settings.send_depth;
            init.cap.max_recv_wr = 1;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = max_inline;
            // SAFETY: the PD and CQ are alive (we hold Arcs); `init` is valid.
            let qp = unsafe { ibv_create_qp(device.pd(), &mut init) };
            NonNull::new(qp).map(|qp| (qp, init.cap.max_inline_data))
        };
        // Some devices refuse any inline data: retry without before giving up.
        let (qp, max_inline) = create(settings.max_inline)
            .or_else(|| create(0))
            .ok_or_else(|| RdmaError::last_os("ibv_create_qp (reliable connected)"))?;
        let mut qp = Self {
            qp,
            psn,
            max_inline,
            settings,
            cq,
        };
        qp.modify_to_init()?;
        Ok(qp)
    }

    /// Inline payload the device granted.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP is alive; qp_num is set at creation and never changes.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// What the other side needs to connect to this queue pair.
    pub fn info(&self) -> QpInfo {
        QpInfo {
            lid: self.settings.port.lid,
            gid: self.settings.port.gid,
            qpn: self.qpn(),
            psn: self.psn,
            mtu: self.settings.port.active_mtu,
            // What the other side needs: a client's requester depth bounds nothing on
            // the node, a node's responder depth bounds the client's requester depth.
            max_rd_atomic: match self.settings.role {
                Role::Client => self.settings.initiator_depth,
                Role::MemoryNode => self.settings.responder_depth,
            }
            .max(1),
        }
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        bits: mask,
        what: &'static str,
    ) -> Result<(), RdmaError> {
        // SAFETY: the QP is alive; `attr` is valid for the fields named by `bits`.
        let rc = unsafe { ibv_modify_qp(self.as_ptr(), attr, bits.0 as i32) };
        if rc != 0 {
            return Err(RdmaError::code(what, rc));
        }
        Ok(())
    }

    fn modify_to_init(&mut self) -> Result<(), RdmaError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = self.settings.port.port;
        attr.qp_access_flags = remote_access(self.settings.role).0;
        self.modify(
            &mut attr,
            mask::IBV_QP_STATE
                | mask::IBV_QP_PKEY_INDEX
                | mask::IBV_QP_PORT
                | mask::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp (to INIT)",
        )
    }

    /// Moves the queue pair to the error state: it sends nothing more, and every
    /// request it holds completes with a flush error.
    pub fn to_error(&mut self) -> Result<(), RdmaError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, mask::IBV_QP_STATE, "ibv_modify_qp (to ERR)")
    }

    /// Connects to `remote` and moves to RTS (ready to send and to serve).
    pub fn connect(&mut self, remote: &QpInfo) -> Result<(), RdmaError> {
        let port = self.settings.port;
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = u32::from(port.active_mtu.min(remote.mtu));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = self.settings.responder_depth.max(1);
        attr.min_rnr_timer = 12;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = self.settings.service_level;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = port.port;
        if port.link_layer == LinkLayer::Ethernet && remote.gid == [0; 16] {
            return Err(RdmaError::Addressing {
                device: self.cq.device().name().to_owned(),
                port: port.port,
                detail: "the peer sent an all-zero GID, which RoCE cannot address: its port \
                         has no IP address for the GID index it uses"
                    .into(),
            });
        }
        if gid::needs_grh(port.link_layer, &port.gid, &remote.gid) {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = port.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
            attr.ah_attr.grh.traffic_class = self.settings.traffic_class;
        }
        self.modify(
            &mut attr,
            mask::IBV_QP_STATE
                | mask::IBV_QP_AV
                | mask::IBV_QP_PATH_MTU
                | mask::IBV_QP_DEST_QPN
                | mask::IBV_QP_RQ_PSN
                | mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | mask::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp (to RTR)",
        )?;
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = self.settings.ack_timeout;
        attr.retry_cnt = self.settings.retry_count;
        attr.rnr_retry = 7;
        attr.sq_psn = self.psn;
        attr.max_rd_atomic = self
            .settings
            .initiator_depth
            .min(remote.max_rd_atomic)
            .max(1);
        self.modify(
            &mut attr,
            mask::IBV_QP_STATE
                | mask::IBV_QP_TIMEOUT
                | mask::IBV_QP_RETRY_CNT
                | mask::IBV_QP_RNR_RETRY
                | mask::IBV_QP_SQ_PSN
                | mask::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp (to RTS)",
        )
    }
}

/// What the remote side of a queue pair may do to this side's memory through it.
/// Only a memory node serves one-sided verbs; a client's queue pair lets its peer
/// do nothing (its staging buffers are registered for local access only, and a
/// client QP that granted remote access would let whoever controls the memory
/// node's end read or write them as soon as an rkey leaked).
fn remote_access(role: Role) -> ibv_access_flags {
    match role {
        Role::Client => ibv_access_flags(0),
        Role::MemoryNode => {
            ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC
        }
    }
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data (integers, unions of integers); all-zero is
    // a valid value and ibv_modify_qp reads only the fields named in the mask.
    unsafe { std::mem::zeroed() }
}

/// A random 24-bit initial packet sequence number (never a fixed fallback: a
/// predictable PSN makes injecting packets into the connection easier).
fn random_psn() -> Result<u32, RdmaError> {
    let [a, b, c] = crate::auth::random_bytes()
        .map_err(|e| RdmaError::io("cannot draw a packet sequence number", e))?;
    Ok(u32::from_le_bytes([a, b, c, 0]))
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, before its CQ (held by Arc).
        let rc = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_destroy_qp failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memory_node_queue_pairs_grant_remote_access() {
        assert_eq!(remote_access(Role::Client).0, 0);
        let node = remote_access(Role::MemoryNode).0;
        for flag in [
            ibv_access_flags::IBV_ACCESS_REMOTE_READ,
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
            ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        ] {
            assert_ne!(node & flag.0, 0);
        }
    }
}
