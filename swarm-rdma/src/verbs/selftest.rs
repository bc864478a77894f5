//! The CAS byte-order self-test a client runs when it opens a device.
//!
//! SWARM's metadata words live and die by compare-and-swap, and the transport
//! decodes the original value a CAS returns. The InfiniBand spec returns it in the
//! byte order of the memory it operates on — on our little-endian hosts, the host's:
//! mlx5 and soft-RoCE do. ConnectX-3 (mlx4) returns it big-endian while operating
//! on memory correctly; read natively, every CAS result would look like a value
//! nobody wrote, and every comparison the protocol makes would fail. So before any
//! client connects, [`cas_byte_order`] writes a word `W` whose eight bytes are all
//! distinct, CASes it from `W` to `W'`, and reads it back, in one chain over a
//! loopback connection to the device itself:
//!
//! * the READ must return `W'` in host order (the swap happened, as on any device);
//! * the CAS reply is `W` in host order ([`CasReplyOrder::Native`]) or byte-swapped
//!   ([`CasReplyOrder::BigEndian`]): the transport then decodes every CAS reply
//!   accordingly ([`crate::wr::ChainLimits::cas_reply`]) — detect and decode rather
//!   than refuse, since the quirk is fully known;
//! * anything else is a device the transport cannot trust: refused with
//!   [`RdmaError::Unsupported`].
//!
//! The decision is [`judge`]; the sequence runs against anything that implements
//! [`Loopback`]: the device ([`DeviceLoopback`]) or the emulated provider
//! ([`crate::emu`], whose tests run it in both byte orders and against garbage).

use std::sync::Arc;
use std::time::{Duration, Instant};

use swarm_core::fabric::{Batch, NodeId, Op};

use crate::error::RdmaError;
use crate::verbs::cq::{CompletionQueue, WorkCompletion};
use crate::verbs::device::{Device, PortInfo};
use crate::verbs::memory::{Access, Mapping, MemoryRegion};
use crate::verbs::post::{SendQueue, StagingSlice, post_chain};
use crate::verbs::qp::{QpSettings, QueuePair, Role};
use crate::wr::{self, CasReplyOrder, ChainLimits, Local, ReadOrdering, RemoteRegion};

/// The word written first: eight distinct bytes, so a byte swap is unmistakable.
pub const WRITTEN: u64 = 0x0102_0304_0506_0708;
/// The word the CAS stores.
pub const SWAPPED: u64 = 0x1122_3344_5566_7788;
/// How long the chain may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// What the self-test's CAS `reply` and READ-back `after` say about the device.
pub fn judge(reply: [u8; 8], after: [u8; 8]) -> Result<CasReplyOrder, String> {
    if after != SWAPPED.to_ne_bytes() {
        return Err(format!(
            "a CAS from {WRITTEN:#018x} to {SWAPPED:#018x} left {:#018x} in memory",
            u64::from_ne_bytes(after)
        ));
    }
    if reply == WRITTEN.to_ne_bytes() {
        Ok(CasReplyOrder::Native)
    } else if reply == WRITTEN.to_be_bytes() {
        Ok(CasReplyOrder::BigEndian)
    } else {
        Err(format!(
            "a CAS of {WRITTEN:#018x} returned the bytes {reply:02x?}, which is that value in \
             no byte order"
        ))
    }
}

/// A connection from the device to memory it also owns, for the self-test.
pub trait Loopback {
    /// The send queue requests are posted on.
    type Queue: SendQueue;
    /// The send queue.
    fn queue(&self) -> &Self::Queue;
    /// The target memory, as the queue's peer exposes it (at least 8 bytes).
    fn target(&self) -> RemoteRegion;
    /// Largest inline payload of the queue.
    fn max_inline(&self) -> u32;
    /// The local registered buffer (64 bytes at least) and its bytes.
    fn staging(&mut self) -> (StagingSlice, &mut [u8]);
    /// Drains completions into `out`.
    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32>;
}

/// Runs the self-test over `loopback` (see the module docs); `device` names the
/// device in errors.
pub fn cas_byte_order(
    loopback: &mut impl Loopback,
    device: &str,
) -> Result<CasReplyOrder, RdmaError> {
    let refuse = |what: String| RdmaError::Unsupported {
        device: device.to_owned(),
        what: format!("its CAS self-test failed: {what}"),
    };
    let mut batch = Batch::new();
    for op in [
        Op::Write {
            addr: 0,
            data: WRITTEN.to_ne_bytes().to_vec().into(),
        },
        Op::Cas {
            addr: 0,
            expected: WRITTEN,
            new: SWAPPED,
        },
        Op::Read { addr: 0, len: 8 },
    ] {
        batch.push(op).map_err(|e| refuse(e.to_string()))?;
    }
    let limits = ChainLimits {
        max_inline: loopback.max_inline(),
        max_message: 1 << 20,
        ordering: ReadOrdering::Strict,
        cas_reply: CasReplyOrder::Native,
    };
    let chain = wr::plan(NodeId(0), &batch, &loopback.target(), &limits)
        .map_err(|e| refuse(e.to_string()))?;
    let staged = |index: usize| match chain.requests()[index].local {
        Local::Staged { offset, .. } => Some(offset as usize),
        _ => None,
    };
    let (Some(reply_at), Some(read_at)) = (staged(1), staged(2)) else {
        return Err(refuse("the chain has no staging for its results".into()));
    };
    let slice = {
        let (slice, bytes) = loopback.staging();
        let bytes = bytes
            .get_mut(..chain.staging_len() as usize)
            .ok_or_else(|| refuse("the staging buffer is too small".into()))?;
        bytes.fill(0);
        chain.fill_staging(&batch, bytes);
        slice
    };
    post_chain(loopback.queue(), &chain, &batch, slice, 0)
        .map_err(|f| refuse(format!("posting failed with errno {}", f.errno)))?;
    let last = chain.requests().len() - 1;
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    loop {
        loopback
            .poll(&mut out)
            .map_err(|code| refuse(format!("polling failed with {code}")))?;
        if let Some(bad) = out.iter().find(|wc| wc.status != 0) {
            return Err(refuse(format!(
                "a request failed with {}",
                crate::status::name(bad.status)
            )));
        }
        if out.iter().any(|wc| wr::split_wr_id(wc.wr_id).1 == last) {
            break;
        }
        if Instant::now() > deadline {
            return Err(refuse(format!("no completion in {DEADLINE:?}")));
        }
    }
    let (_, bytes) = loopback.staging();
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        w
    };
    judge(word(reply_at), word(read_at)).map_err(refuse)
}

/// The self-test's loopback on a real device: two RC queue pairs of one port
/// connected to each other, a small region with remote access that only the
/// second one serves, and a local buffer; all dropped after the test.
#[derive(Debug)]
pub struct DeviceLoopback {
    // Drop order: queue pairs, then memory, then the completion queue.
    requester: QueuePair,
    _responder: QueuePair,
    target: MemoryRegion,
    local: MemoryRegion,
    cq: Arc<CompletionQueue>,
}

impl DeviceLoopback {
    /// Sets the loopback up on `port` of `device`.
    pub fn new(device: &Arc<Device>, port: PortInfo) -> Result<Self, RdmaError> {
        let cq = Arc::new(CompletionQueue::new(device.clone(), 16)?);
        let settings = |role| QpSettings {
            role,
            port,
            send_depth: 8,
            max_inline: 0,
            responder_depth: 1,
            initiator_depth: 1,
            ack_timeout: 14,
            retry_count: 3,
            traffic_class: 0,
            service_level: 0,
        };
        let mut requester = QueuePair::new(cq.clone(), settings(Role::Client))?;
        let mut responder = QueuePair::new(cq.clone(), settings(Role::MemoryNode))?;
        requester.connect(&responder.info())?;
        responder.connect(&requester.info())?;
        let target =
            MemoryRegion::register(device.clone(), Mapping::new(4096, false)?, Access::Remote)?;
        let local =
            MemoryRegion::register(device.clone(), Mapping::new(4096, false)?, Access::Local)?;
        Ok(Self {
            requester,
            _responder: responder,
            target,
            local,
            cq,
        })
    }
}

impl Loopback for DeviceLoopback {
    type Queue = QueuePair;

    fn queue(&self) -> &QueuePair {
        &self.requester
    }

    fn target(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.target.memory().addr(),
            rkey: self.target.rkey(),
            size: self.target.memory().len() as u64,
        }
    }

    fn max_inline(&self) -> u32 {
        self.requester.max_inline()
    }

    fn staging(&mut self) -> (StagingSlice, &mut [u8]) {
        let slice = StagingSlice {
            addr: self.local.memory().addr(),
            lkey: self.local.lkey(),
        };
        let len = self.local.memory().len();
        (
            slice,
            self.local
                .memory_mut()
                .slice_mut(0, len)
                .unwrap_or_default(),
        )
    }

    fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<(), i32> {
        self.cq.poll(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_tell_the_byte_order_and_garbage_is_refused() {
        let after = SWAPPED.to_ne_bytes();
        assert_eq!(
            judge(WRITTEN.to_ne_bytes(), after),
            Ok(CasReplyOrder::Native)
        );
        assert_eq!(
            judge(WRITTEN.to_be_bytes(), after),
            Ok(CasReplyOrder::BigEndian)
        );
        assert!(judge([0; 8], after).unwrap_err().contains("no byte order"));
        let unswapped = WRITTEN.to_ne_bytes();
        assert!(
            judge(WRITTEN.to_ne_bytes(), unswapped)
                .unwrap_err()
                .contains("left")
        );
        // The test words cannot be mistaken for each other in any byte order.
        assert_ne!(WRITTEN.to_ne_bytes(), WRITTEN.to_be_bytes());
    }
}
