//! An emulated reliable-connected queue pair: the send queue as a provider keeps it
//! (depth, inline copies, the error state) and the responder that executes it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdma_sys::{ibv_send_wr, ibv_wc_status as s, ibv_wr_opcode};

use super::memory::EmuNode;
use crate::verbs::cq::WorkCompletion;
use crate::verbs::post::SendQueue;
use crate::wr::{CasReplyOrder, SendFlags};

/// How the emulated memory node behind a queue pair behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Executes requests.
    Up,
    /// Executes nothing (retries not exhausted yet): requests stay outstanding.
    Silent,
    /// Executes nothing until the next post on the queue pair, then is `Up`: a
    /// soft-RoCE requester asleep on a request until a post wakes it (what the
    /// engine's nudge is for).
    Held,
    /// Executes this many more requests, then the next one fails with
    /// `IBV_WC_RETRY_EXC_ERR` (in the middle of a chain if it falls there) and the
    /// queue pair is in the error state.
    CrashAfter(u32),
}

impl Mode {
    /// Whether a queue pair not in the error state executes nothing in this mode.
    fn executes_nothing(self) -> bool {
        matches!(self, Mode::Silent | Mode::Held)
    }
}

/// The verbs operation of a posted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Read,
    Write,
    CompareSwap,
    /// An opcode the emulator does not serve (`IBV_WC_LOC_QP_OP_ERR`).
    Other,
}

/// A posted request, as the provider captured it from its `ibv_send_wr`.
#[derive(Clone, Debug)]
struct Posted {
    wr_id: u64,
    verb: Verb,
    flags: SendFlags,
    /// Local buffer (address, length, key) of the first scatter/gather entry.
    local: Option<(u64, u32, u32)>,
    /// An inline payload, copied at post time.
    inline: Option<Vec<u8>>,
    remote_addr: u64,
    rkey: u32,
    compare: u64,
    swap: u64,
}

/// The local memory a queue pair's requests may name: one registered region.
#[derive(Debug)]
pub struct LocalRegion<'a> {
    /// Address of byte 0.
    pub addr: u64,
    /// Local key.
    pub lkey: u32,
    /// The bytes.
    pub bytes: &'a mut [u8],
}

impl LocalRegion<'_> {
    fn slice(&mut self, addr: u64, len: u32, lkey: u32) -> Option<&mut [u8]> {
        let offset = usize::try_from(addr.checked_sub(self.addr)?).ok()?;
        let end = offset.checked_add(len as usize)?;
        if lkey != self.lkey {
            return None;
        }
        self.bytes.get_mut(offset..end)
    }
}

/// What a step of execution may use and produce.
#[derive(Debug)]
pub struct Step<'a, 'b> {
    /// The client's registered staging memory.
    pub local: &'a mut LocalRegion<'b>,
    /// The memory node.
    pub node: &'a EmuNode,
    /// How CAS replies are written.
    pub cas_reply: CasReplyOrder,
    /// A broken device: CAS replies are zero whatever the memory held.
    pub broken_cas_replies: bool,
    /// Whether an unfenced request may overtake an outstanding READ or ATOMIC
    /// before it (the InfiniBand ordering rules allow it; the emulator exercises it).
    pub overtake: bool,
    /// Completions produced.
    pub out: &'a mut Vec<WorkCompletion>,
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Posted>,
    /// Requests occupying the send queue: posted and not yet covered by a
    /// completion (an unsignaled request frees its slot only when a later
    /// completion is generated, as on hardware).
    occupied: u32,
    /// Executed requests whose slots the next completion frees.
    uncovered: u32,
    error: bool,
    mode: Mode,
    /// Injected post failures ([`EmuQp::refuse_posts`]): every `post_send` accepts
    /// this many requests, then refuses the next with this errno.
    refuse: Option<(i32, usize)>,
}

/// An emulated RC queue pair; see the module docs.
#[derive(Debug)]
pub struct EmuQp {
    qp_num: u32,
    depth: u32,
    max_inline: u32,
    state: RefCell<State>,
    /// Whether the memory node's end of the connection still exists: `false` once
    /// the node destroyed it (the client's bootstrap connection closed, or the node
    /// process stopped). `None`: a queue pair with no bootstrap behind it, whose
    /// node never goes away.
    peer: Option<Arc<AtomicBool>>,
}

impl EmuQp {
    /// A queue pair numbered `qp_num` with a send queue of `depth` requests and
    /// inline payloads of up to `max_inline` bytes.
    pub fn new(qp_num: u32, depth: u32, max_inline: u32) -> Self {
        Self {
            qp_num,
            depth,
            max_inline,
            state: RefCell::new(State {
                queue: VecDeque::new(),
                occupied: 0,
                uncovered: 0,
                error: false,
                mode: Mode::Up,
                refuse: None,
            }),
            peer: None,
        }
    }

    /// A queue pair connected to the node's queue pair whose existence `peer`
    /// tells: once it is gone, the next request fails with `IBV_WC_RETRY_EXC_ERR`
    /// (nothing acknowledges it) and the queue pair is in the error state.
    pub fn connected(qp_num: u32, depth: u32, max_inline: u32, peer: Arc<AtomicBool>) -> Self {
        Self {
            peer: Some(peer),
            ..Self::new(qp_num, depth, max_inline)
        }
    }

    /// Changes how the node behind this queue pair behaves from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.state.borrow_mut().mode = mode;
    }

    /// From now on, every post accepts at most `accepted` requests of its list and
    /// refuses the next with `errno`, reporting it as `ibv_post_send` does (`bad`
    /// at the first request not posted): a provider out of resources (`ENOMEM`) or
    /// refusing a request (`EINVAL`). The accepted ones execute.
    pub fn refuse_posts(&self, errno: i32, accepted: usize) {
        self.state.borrow_mut().refuse = Some((errno, accepted));
    }

    /// Moves the queue pair to the error state (`ibv_modify_qp` to ERR): every
    /// request still queued, and every later one, is flushed.
    pub fn to_error(&self) {
        self.state.borrow_mut().error = true;
    }

    /// Whether there are requests that a step would execute.
    pub fn ready(&self) -> bool {
        let state = self.state.borrow();
        !state.queue.is_empty() && (!state.mode.executes_nothing() || state.error)
    }

    /// Requests posted and not executed.
    pub fn queued(&self) -> usize {
        self.state.borrow().queue.len()
    }

    /// Executes the request at the head of the send queue — or, when `overtake`
    /// and the head is a READ or ATOMIC followed by an unfenced request, that
    /// request first — and reports completions in posting order.
    pub fn step(&self, step: &mut Step<'_, '_>) {
        let mut state = self.state.borrow_mut();
        if self
            .peer
            .as_ref()
            .is_some_and(|peer| !peer.load(Ordering::Acquire))
        {
            state.mode = Mode::CrashAfter(0);
        }
        if !state.error && state.mode.executes_nothing() {
            return;
        }
        let Some(head) = state.queue.pop_front() else {
            return;
        };
        let may_overtake = matches!(head.verb, Verb::Read | Verb::CompareSwap)
            && state
                .queue
                .front()
                .is_some_and(|next| !next.flags.contains(SendFlags::FENCE));
        let mut done = Vec::with_capacity(2);
        if step.overtake && may_overtake {
            let next = state.queue.pop_front().expect("checked above");
            let next_status = execute(&mut state, &next, step);
            let head_status = execute(&mut state, &head, step);
            done.push((head, head_status));
            done.push((next, next_status));
        } else {
            let status = execute(&mut state, &head, step);
            done.push((head, status));
        }
        for (wr, status) in done {
            state.uncovered += 1;
            if status != s::IBV_WC_SUCCESS || wr.flags.contains(SendFlags::SIGNALED) {
                state.occupied -= state.uncovered;
                state.uncovered = 0;
                step.out.push(WorkCompletion {
                    wr_id: wr.wr_id,
                    status,
                    vendor_err: 0,
                    qp_num: self.qp_num,
                });
            }
        }
    }
}

/// Executes one request against the node and the local region; its status.
fn execute(state: &mut State, wr: &Posted, step: &mut Step<'_, '_>) -> u32 {
    if state.error {
        return s::IBV_WC_WR_FLUSH_ERR;
    }
    if let Mode::CrashAfter(left) = state.mode {
        if left == 0 {
            state.error = true;
            return s::IBV_WC_RETRY_EXC_ERR;
        }
        state.mode = Mode::CrashAfter(left - 1);
    }
    let status = access(wr, step);
    if status != s::IBV_WC_SUCCESS {
        state.error = true;
    }
    status
}

/// The request's effect, with verbs' checks: local key and bounds, remote key and
/// bounds, atomic alignment.
fn access(wr: &Posted, step: &mut Step<'_, '_>) -> u32 {
    let local_len = wr.local.map_or(0, |(_, len, _)| len);
    match wr.verb {
        Verb::Other => s::IBV_WC_LOC_QP_OP_ERR,
        Verb::Read => {
            let Some(at) = step
                .node
                .check(wr.rkey, wr.remote_addr, u64::from(local_len))
            else {
                return s::IBV_WC_REM_ACCESS_ERR;
            };
            let Some((addr, len, lkey)) = wr.local else {
                return s::IBV_WC_SUCCESS;
            };
            let Some(dest) = step.local.slice(addr, len, lkey) else {
                return s::IBV_WC_LOC_PROT_ERR;
            };
            step.node
                .with(|bytes| dest.copy_from_slice(&bytes[at..at + len as usize]));
            s::IBV_WC_SUCCESS
        }
        Verb::Write => {
            let data: Vec<u8> = match (&wr.inline, wr.local) {
                (Some(inline), _) => inline.clone(),
                (None, Some((addr, len, lkey))) => match step.local.slice(addr, len, lkey) {
                    Some(source) => source.to_vec(),
                    None => return s::IBV_WC_LOC_PROT_ERR,
                },
                (None, None) => Vec::new(),
            };
            let Some(at) = step.node.check(wr.rkey, wr.remote_addr, data.len() as u64) else {
                return s::IBV_WC_REM_ACCESS_ERR;
            };
            step.node
                .with(|bytes| bytes[at..at + data.len()].copy_from_slice(&data));
            s::IBV_WC_SUCCESS
        }
        Verb::CompareSwap => {
            let Some((addr, len, lkey)) = wr.local else {
                return s::IBV_WC_LOC_LEN_ERR;
            };
            if len != 8 {
                return s::IBV_WC_LOC_LEN_ERR;
            }
            if !wr.remote_addr.is_multiple_of(8) {
                return s::IBV_WC_REM_INV_REQ_ERR;
            }
            let Some(at) = step.node.check(wr.rkey, wr.remote_addr, 8) else {
                return s::IBV_WC_REM_ACCESS_ERR;
            };
            let Some(dest) = step.local.slice(addr, len, lkey) else {
                return s::IBV_WC_LOC_PROT_ERR;
            };
            let old = step.node.with(|bytes| {
                let mut word = [0u8; 8];
                word.copy_from_slice(&bytes[at..at + 8]);
                let old = u64::from_ne_bytes(word);
                if old == wr.compare {
                    bytes[at..at + 8].copy_from_slice(&wr.swap.to_ne_bytes());
                }
                old
            });
            dest.copy_from_slice(&match step.cas_reply {
                _ if step.broken_cas_replies => [0; 8],
                CasReplyOrder::Native => old.to_ne_bytes(),
                CasReplyOrder::BigEndian => old.to_be_bytes(),
            });
            s::IBV_WC_SUCCESS
        }
    }
}

impl SendQueue for EmuQp {
    unsafe fn post_send(&self, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
        let mut state = self.state.borrow_mut();
        if state.mode == Mode::Held {
            state.mode = Mode::Up;
        }
        let mut current = wr;
        let mut accepted = 0;
        while !current.is_null() {
            // SAFETY: the caller vouches that the list and its entries are valid for
            // the call; every field is read through the pointer, nothing is kept.
            let posted = unsafe { capture(current) };
            let refuse = |errno: i32| {
                // SAFETY: `bad` is a valid out-pointer (the caller's contract).
                unsafe { *bad = current };
                errno
            };
            if let Some((errno, limit)) = state.refuse
                && accepted == limit
            {
                return refuse(errno);
            }
            let Some(posted) = posted else {
                return refuse(libc::EINVAL);
            };
            if posted
                .inline
                .as_ref()
                .is_some_and(|data| data.len() > self.max_inline as usize)
            {
                return refuse(libc::EINVAL);
            }
            if state.occupied >= self.depth {
                return refuse(libc::ENOMEM);
            }
            state.occupied += 1;
            accepted += 1;
            state.queue.push_back(posted);
            // SAFETY: as above.
            current = unsafe { (*current).next };
        }
        0
    }
}

/// Reads one work request, copying an inline payload. `None` for a request that
/// names more than one scatter/gather entry (the transport never builds one).
///
/// # Safety
///
/// `wr` and what its `sg_list` (and, when inline, the entry's buffer) point to must
/// be valid for reads.
unsafe fn capture(wr: *const ibv_send_wr) -> Option<Posted> {
    // SAFETY: the caller's contract (every field is a plain integer or pointer).
    let (wr_id, opcode, flags, num_sge, sg_list) = unsafe {
        (
            (*wr).wr_id,
            (*wr).opcode,
            (*wr).send_flags,
            (*wr).num_sge,
            (*wr).sg_list,
        )
    };
    let flags = SendFlags::from_bits_truncate(flags);
    let verb = match opcode {
        o if o == ibv_wr_opcode::IBV_WR_RDMA_READ => Verb::Read,
        o if o == ibv_wr_opcode::IBV_WR_RDMA_WRITE => Verb::Write,
        o if o == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP => Verb::CompareSwap,
        _ => Verb::Other,
    };
    let local = match num_sge {
        0 => None,
        1 if !sg_list.is_null() => {
            // SAFETY: one valid entry (the caller's contract).
            let sge = unsafe { *sg_list };
            Some((sge.addr, sge.length, sge.lkey))
        }
        _ => return None,
    };
    let inline = match (flags.contains(SendFlags::INLINE), local) {
        (true, Some((addr, len, _))) => {
            // SAFETY: an inline entry names `len` readable bytes for the duration
            // of the post (the caller's contract); they are copied now, as a
            // provider does.
            Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec())
        }
        (true, None) => Some(Vec::new()),
        (false, _) => None,
    };
    // SAFETY: the union member matching the opcode is the one post.rs wrote; both
    // members start with the remote address, and rkey/compare/swap are plain
    // integers, so reading either is defined for any bits.
    let (remote_addr, rkey, compare, swap) = unsafe {
        if verb == Verb::CompareSwap {
            let atomic = (*wr).wr.atomic;
            (
                atomic.remote_addr,
                atomic.rkey,
                atomic.compare_add,
                atomic.swap,
            )
        } else {
            let rdma = (*wr).wr.rdma;
            (rdma.remote_addr, rdma.rkey, 0, 0)
        }
    };
    Some(Posted {
        wr_id,
        verb,
        flags,
        local: if flags.contains(SendFlags::INLINE) {
            None
        } else {
            local
        },
        inline,
        remote_addr,
        rkey,
        compare,
        swap,
    })
}
