//! Roundtrips: the one place where protocol code waits on the fabric.
//!
//! A *roundtrip* (SWARM §2.1) is one step "post ordered batches to some nodes, wait
//! for `k` of them". Protocol code can only obtain fabric results through a
//! [`Roundtrip`], and creating one increments the operation's [`OpStats`], so the
//! roundtrip count (the paper's Table 2) cannot be forgotten or faked. Extending a
//! step to fallback nodes after a timeout ([`Roundtrip::escalate`]) counts as one more
//! roundtrip: it costs the caller about one more network delay.
//!
//! A roundtrip waits for a quorum, never for all (SWARM §2.2: only a majority of memory
//! nodes is assumed alive): batches still outstanding when the quorum is reached are
//! *forgotten* when the roundtrip is dropped; they still execute, their results are
//! discarded.
//!
//! **Fast path.** Batches are posted with [`Fabric::submit`]: on a transport that
//! completes them inside the call (shared memory, [`crate::MemCluster`]) the reply
//! lands in the roundtrip at once, with no ticket, and a step whose quorum already
//! answered returns `Ready` from its first poll. Replies of up to [`INLINE_REPLIES`]
//! nodes (the preferred majority of a three-replica register) are stored inline, so
//! such a step allocates nothing of its own.

use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::future::{Future, poll_fn};
use core::pin::Pin;
use core::task::{Context, Poll};

use crate::fabric::{
    Batch, Completion, Fabric, FabricError, InPlaceReply, Nanos, NodeId, Submitted, Ticket,
};

/// The most nodes one roundtrip can address (replication factors up to 15): a
/// per-roundtrip batch limit, not a cluster limit ([`MAX_CLUSTER_NODES`]).
pub const MAX_NODES: usize = 16;

/// The most memory nodes a cluster can have (node ids `0..MAX_CLUSTER_NODES`). A
/// roundtrip still posts to at most [`MAX_NODES`] of them: an operation reaches its
/// register's replicas, and a store keeps what every client reaches (SWARM-KV's
/// index and client table) on at most that many.
pub const MAX_CLUSTER_NODES: usize = 64;

/// Replies a roundtrip stores without a heap allocation: the majority of a
/// three-replica register that a quorum step asks first (SWARM §6). More spill to
/// the heap. Kept small on purpose: a roundtrip lives in the state of every
/// operation future, which is moved, so each inline reply costs a copy too (three
/// measured slower than two).
pub const INLINE_REPLIES: usize = 2;

/// The replies of one roundtrip: inline up to [`INLINE_REPLIES`], then on the heap.
/// Large inline on purpose: avoiding the allocation is the point.
///
/// The inline slots always hold a completion (empty past `len`), so that a reply is
/// written where it stays ([`Replies::push_blank`], the fast path of
/// [`Fabric::submit`]) instead of being built elsewhere and moved in.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Replies {
    Inline {
        slots: [(NodeId, Completion); INLINE_REPLIES],
        len: usize,
    },
    Heap(Vec<(NodeId, Completion)>),
}

impl Replies {
    const fn new() -> Self {
        Self::Inline {
            slots: [const { (NodeId(0), Completion::new()) }; INLINE_REPLIES],
            len: 0,
        }
    }

    /// Appends an empty reply from `node`, for a transport to fill in place
    /// ([`Fabric::submit`]), and returns it; [`Replies::discard_last`] takes it back
    /// if the transport did not complete the batch.
    #[inline]
    fn push_blank(&mut self, node: NodeId) -> &mut Completion {
        if let Self::Inline { slots, len } = self
            && *len == INLINE_REPLIES
        {
            let mut heap = Vec::with_capacity(2 * INLINE_REPLIES);
            heap.extend(slots.iter_mut().map(|(n, c)| (*n, core::mem::take(c))));
            *self = Self::Heap(heap);
        }
        match self {
            Self::Inline { slots, len } => {
                let slot = &mut slots[*len];
                *len += 1;
                slot.0 = node;
                &mut slot.1
            }
            Self::Heap(heap) => {
                heap.push((node, Completion::new()));
                &mut heap.last_mut().expect("just pushed").1
            }
        }
    }

    /// Removes the reply [`Replies::push_blank`] added last.
    #[inline]
    fn discard_last(&mut self) {
        match self {
            Self::Inline { slots, len } => {
                *len -= 1;
                slots[*len].1.clear();
            }
            Self::Heap(heap) => drop(heap.pop()),
        }
    }

    fn push(&mut self, (node, completion): (NodeId, Completion)) {
        *self.push_blank(node) = completion;
    }

    fn as_slice(&self) -> &[(NodeId, Completion)] {
        match self {
            Self::Inline { slots, len } => &slots[..*len],
            Self::Heap(heap) => heap,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [(NodeId, Completion)] {
        match self {
            Self::Inline { slots, len } => &mut slots[..*len],
            Self::Heap(heap) => heap,
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Inline { len, .. } => *len,
            Self::Heap(heap) => heap.len(),
        }
    }
}

/// No deadline (see [`OpStats::deadline`]).
const NO_DEADLINE: Nanos = Nanos::MAX;

/// How often a pending [`Roundtrip::wait`] checks its operation's deadline: every
/// this many polls.
const FENCE_CHECK_POLLS: u32 = 32;

/// Statistics of one protocol operation (its roundtrip count), and its deadline.
///
/// The deadline is the operation *fence* (see [`crate::slot_recycling`]): no batch of the
/// operation is posted once the fabric clock is past it ([`Roundtrip::post`] fails
/// with [`FabricError::Fenced`], [`post_background_for`] drops the batch). Memory an
/// operation may have observed is recycled only a grace period after it became
/// unreachable, which every fenced operation has stopped posting by.
#[derive(Debug)]
pub struct OpStats {
    roundtrips: Cell<u32>,
    iterations: Cell<u32>,
    recycled_fetches: Cell<u32>,
    deadline: Cell<Nanos>,
    /// The budget of a deadline armed at the first post ([`OpStats::arm_at_first_post`])
    /// and not armed yet; [`NO_DEADLINE`] for none.
    pending: Cell<Nanos>,
    /// Whether the operation yields after hinting its memory
    /// ([`OpStats::interleaved`]).
    interleaved: bool,
}

/// The deadline of one operation on an [`OpStats`], armed by
/// [`OpStats::arm_deadline`] and disarmed (the previous deadline restored) on drop.
#[derive(Debug)]
#[must_use = "the deadline is disarmed when the scope is dropped"]
pub struct DeadlineScope<'a> {
    stats: &'a OpStats,
    previous: Nanos,
    previous_pending: Nanos,
}

impl Drop for DeadlineScope<'_> {
    fn drop(&mut self) {
        self.stats.deadline.set(self.previous);
        self.stats.pending.set(self.previous_pending);
    }
}

impl Default for OpStats {
    fn default() -> Self {
        Self::new()
    }
}

impl OpStats {
    /// Fresh statistics, zero roundtrips, no deadline yet (a [`crate::Client`]
    /// operation arms one from its `max_op_ns` when it starts).
    pub const fn new() -> Self {
        Self {
            roundtrips: Cell::new(0),
            iterations: Cell::new(0),
            recycled_fetches: Cell::new(0),
            deadline: Cell::new(NO_DEADLINE),
            pending: Cell::new(NO_DEADLINE),
            interleaved: false,
        }
    }

    /// Fresh statistics for an operation that runs next to others on its thread
    /// ([`crate::SlotExecutor`], [`crate::LocalExecutor`]): each of its protocol
    /// steps that hints memory to the fabric ([`crate::Fabric::prefetch`]) yields to
    /// the executor ([`crate::yield_now`]) after the hints and before it posts.
    ///
    /// On a fabric that completes batches inside `post` (shared memory, CXL), an
    /// operation otherwise runs from start to end in one poll, and the cache misses
    /// of the operations in flight come one after another. With the yield, each of
    /// them hints its lines, then the others run while those lines arrive, so their
    /// misses overlap (memory-level parallelism). On a fabric with latency the yield
    /// costs one poll. With one operation per thread it only costs: use
    /// [`OpStats::new`] there.
    ///
    /// A yield tells the fabric ([`crate::Fabric::yielded`]), so that an executor
    /// does not take a round in which tasks only yielded for a stall.
    pub const fn interleaved() -> Self {
        Self {
            interleaved: true,
            ..Self::new()
        }
    }

    /// Whether the operation yields after hinting its memory
    /// ([`OpStats::interleaved`]): a store that hints memory of its own (an index
    /// bucket, a cache entry) yields there too when this is set.
    pub const fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// Fresh statistics for an operation that must post nothing after `deadline` on
    /// the fabric's clock ([`crate::Fabric::now`]).
    pub const fn with_deadline(deadline: Nanos) -> Self {
        Self {
            deadline: Cell::new(deadline),
            ..Self::new()
        }
    }

    /// The instant after which the operation posts nothing, if it has one.
    pub fn deadline(&self) -> Option<Nanos> {
        let deadline = self.deadline.get();
        (deadline != NO_DEADLINE).then_some(deadline)
    }

    /// Arms the deadline of an operation that starts now, for as long as the returned
    /// scope lives: `deadline`, unless an enclosing operation's earlier one is armed
    /// already (an operation made of several steps keeps the deadline of its start).
    /// Dropping the scope restores the deadline it found, so one `OpStats` can count
    /// the roundtrips of many operations in a row, each fenced from its own start.
    /// One operation at a time per `OpStats`: scopes must be dropped in the reverse
    /// order of their creation (they are, when held by nested `async fn`s).
    pub fn arm_deadline(&self, deadline: Nanos) -> DeadlineScope<'_> {
        let (previous, previous_pending) = (self.deadline.get(), self.pending.get());
        if deadline < previous {
            self.deadline.set(deadline);
            // An armed deadline replaces one waiting for the first post.
            self.pending.set(NO_DEADLINE);
        }
        DeadlineScope {
            stats: self,
            previous,
            previous_pending,
        }
    }

    /// Arms the deadline of an operation that starts now, but at its first post: the
    /// first fence check ([`OpStats::check_fence`], which every post runs) reads the
    /// fabric clock and makes the deadline that reading plus `budget`. So the reading
    /// that arms the fence also checks it, and an operation whose posts come in one
    /// burst reads the clock once. Nothing changes if a deadline is armed (or waits
    /// for its first post) already. Dropping the scope restores what it found.
    ///
    /// Only for an operation that has observed nothing of the memory nodes before its
    /// first post, so that everything it learns comes after its deadline's start:
    /// the fence's argument ([`crate::slot_recycling`]) needs a deadline at most
    /// `budget` after the operation's first observation, and this one is at most
    /// `budget` after its first post. A Safe-Guess read or write starts with a post.
    pub fn arm_at_first_post(&self, budget: Nanos) -> DeadlineScope<'_> {
        let scope = DeadlineScope {
            stats: self,
            previous: self.deadline.get(),
            previous_pending: self.pending.get(),
        };
        if !self.is_armed() {
            self.pending.set(budget);
        }
        scope
    }

    /// Whether a deadline is armed, or waits for the operation's first post
    /// ([`OpStats::arm_at_first_post`]).
    pub fn is_armed(&self) -> bool {
        self.deadline.get() != NO_DEADLINE || self.pending.get() != NO_DEADLINE
    }

    /// Whether the operation may no longer post at fabric time `now`.
    pub fn is_fenced(&self, now: Nanos) -> bool {
        now > self.deadline.get()
    }

    /// Fails with [`FabricError::Fenced`] when the deadline has passed on `fabric`'s
    /// clock (one compare, and no clock read without a deadline). A deadline armed at
    /// the first post ([`OpStats::arm_at_first_post`]) is armed here, from the same
    /// clock reading: the check passes.
    #[inline]
    pub fn check_fence<F: Fabric + ?Sized>(&self, fabric: &F) -> Result<(), FabricError> {
        if self.deadline.get() != NO_DEADLINE {
            if self.is_fenced(fabric.now()) {
                return Err(FabricError::Fenced);
            }
        } else if self.pending.get() != NO_DEADLINE {
            self.arm_pending(fabric.now());
        }
        Ok(())
    }

    /// Arms a deadline that waited for the first post, from the clock reading `now`.
    fn arm_pending(&self, now: Nanos) {
        self.deadline
            .set(now.saturating_add(self.pending.get()).min(NO_DEADLINE - 1));
        self.pending.set(NO_DEADLINE);
    }

    /// Statistics for one of several steps this operation runs concurrently: the
    /// same deadline and interleaving, counts of its own. Fold the branches back with
    /// [`OpStats::join_branches`].
    pub fn branch(&self) -> OpStats {
        let branch = OpStats {
            interleaved: self.interleaved,
            ..OpStats::new()
        };
        branch.deadline.set(self.deadline.get());
        branch.pending.set(self.pending.get());
        branch
    }

    /// Adds the counts of steps that ran concurrently ([`OpStats::branch`]): the
    /// largest roundtrip count among them (they overlapped in time), and every
    /// iteration and recycled fetch. A deadline this operation waited to arm at its
    /// first post takes the earliest one its branches armed at theirs: what they
    /// observed, it goes on from.
    pub fn join_branches(&self, branches: &[&OpStats]) {
        if self.pending.get() != NO_DEADLINE
            && let Some(earliest) = branches
                .iter()
                .map(|b| b.deadline.get())
                .filter(|&d| d != NO_DEADLINE)
                .min()
        {
            self.deadline.set(earliest);
            self.pending.set(NO_DEADLINE);
        }
        let longest = branches.iter().map(|b| b.roundtrips()).max().unwrap_or(0);
        self.roundtrips
            .set(self.roundtrips.get().saturating_add(longest));
        for b in branches {
            self.iterations
                .set(self.iterations.get().saturating_add(b.iterations()));
            self.recycled_fetches.set(
                self.recycled_fetches
                    .get()
                    .saturating_add(b.recycled_fetches()),
            );
        }
    }

    /// Roundtrips the operation has waited for so far.
    pub fn roundtrips(&self) -> u32 {
        self.roundtrips.get()
    }

    /// Iterations of the operation's Safe-Guess read loops, summed over its reads
    /// (appendix C bounds each read's by `2·writers + 1`); zero for an operation that
    /// read no register.
    pub fn iterations(&self) -> u32 {
        self.iterations.get()
    }

    /// Value fetches of the operation that found the buffer of the write they
    /// wanted recycled (another write's record, or an invalid one) and read the
    /// register again. Zero for an operation with a deadline whose cluster
    /// recycles by the rules of [`crate::slot_recycling`]: tests assert it.
    pub fn recycled_fetches(&self) -> u32 {
        self.recycled_fetches.get()
    }

    /// Counts one more fetch that found a recycled buffer.
    pub fn count_recycled_fetch(&self) {
        self.recycled_fetches
            .set(self.recycled_fetches.get().saturating_add(1));
    }

    /// Counts one more read-loop iteration; returns the new count.
    pub fn count_iteration(&self) -> u32 {
        let next = self.iterations.get().saturating_add(1);
        self.iterations.set(next);
        next
    }

    fn count(&self) {
        self.roundtrips.set(self.roundtrips.get().saturating_add(1));
    }
}

/// How a bounded wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// At least `k` nodes answered successfully.
    Reached,
    /// The deadline passed first, or too few posted nodes can still answer: time to
    /// post to fallback nodes.
    Short,
}

/// One quorum step of a protocol operation. See the module docs.
#[derive(Debug)]
pub struct Roundtrip<'a, F: Fabric + ?Sized> {
    fabric: &'a F,
    stats: &'a OpStats,
    outstanding: heapless::Vec<(NodeId, Ticket), MAX_NODES>,
    replies: Replies,
    // Empty, hence unallocated, unless a node failed.
    failures: Vec<(NodeId, FabricError)>,
    /// The fence was checked since the step last waited: the posts of one burst
    /// (no await between them) share one clock read.
    fence_checked: bool,
    /// Where the tickets still outstanding go when the step is dropped, instead of
    /// being forgotten ([`Self::keep_outstanding_in`]).
    keeper: Option<&'a RefCell<Vec<Ticket>>>,
}

impl<'a, F: Fabric + ?Sized> Roundtrip<'a, F> {
    /// Starts a roundtrip and counts it in `stats`.
    pub fn start(fabric: &'a F, stats: &'a OpStats) -> Self {
        stats.count();
        Self {
            fabric,
            stats,
            outstanding: heapless::Vec::new(),
            replies: Replies::new(),
            failures: Vec::new(),
            fence_checked: false,
            keeper: None,
        }
    }

    /// Hands the tickets of the batches still outstanding when this step is dropped
    /// to `keeper` rather than forgetting them: a caller that must know when every
    /// batch it posted completed (a write-back under its guard,
    /// `protocol::write_back_guard`) polls them there.
    pub fn keep_outstanding_in(&mut self, keeper: &'a RefCell<Vec<Ticket>>) {
        self.keeper = Some(keeper);
    }

    /// Posts `batch` to `node` as part of this step. Fails with
    /// [`FabricError::Fenced`], posting nothing, once the operation's deadline has
    /// passed ([`OpStats::deadline`]).
    ///
    /// A transport that completes it inside [`Fabric::submit`] has answered when this returns.
    #[inline]
    pub fn post(&mut self, node: NodeId, mut batch: Batch) -> Result<(), FabricError> {
        self.may_post()?;
        self.submit(node, &mut batch);
        Ok(())
    }

    /// [`Self::post`] of the batch `build` fills in (it is handed an empty one).
    /// The batch is built where it is submitted instead of elsewhere and moved in: a
    /// batch of writes is a few hundred bytes, and the hot steps
    /// (`Client::quorum_step`) post one per replica. Posts nothing if the step is
    /// fenced (checked before `build` runs) or if `build` fails.
    #[inline]
    pub fn post_with(
        &mut self,
        node: NodeId,
        build: impl FnOnce(&mut Batch) -> Result<(), FabricError>,
    ) -> Result<(), FabricError> {
        self.may_post()?;
        let mut batch = Batch::new();
        build(&mut batch)?;
        self.submit(node, &mut batch);
        Ok(())
    }

    /// Whether one more batch may be posted: the fence, then the step's capacity.
    #[inline]
    fn may_post(&mut self) -> Result<(), FabricError> {
        // One clock read per burst of posts: the posts between two waits of a step
        // follow each other within microseconds, which the recycling grace's
        // delivery margin covers (`crate::slot_recycling`).
        if !self.fence_checked {
            self.stats.check_fence(self.fabric)?;
            self.fence_checked = true;
        }
        if self.outstanding.len() + self.replies.len() + self.failures.len() >= MAX_NODES {
            return Err(FabricError::TooManyPosts { max: MAX_NODES });
        }
        Ok(())
    }

    /// Submits `batch` to `node` and files the outcome: a reply, a failure, or a
    /// ticket to poll.
    #[inline]
    fn submit(&mut self, node: NodeId, batch: &mut Batch) {
        // A transport that queues the batch must not start it after the deadline.
        batch.set_deadline(self.stats.deadline());
        // The reply is written where the step keeps it: no copy on a fast path.
        let reply = self.replies.push_blank(node);
        match self.fabric.submit(node, batch, reply) {
            Submitted::Done => {}
            Submitted::Failed(error) => {
                self.replies.discard_last();
                self.failures.push((node, error));
            }
            // Capacity checked by `may_post`.
            Submitted::Posted(ticket) => {
                self.replies.discard_last();
                let _ = self.outstanding.push((node, ticket));
            }
        }
    }

    /// The operation this step counts into.
    pub fn stats(&self) -> &'a OpStats {
        self.stats
    }

    /// Counts one more roundtrip: the caller is about to post to fallback nodes
    /// because the preferred ones were slow or failed.
    pub fn escalate(&mut self) {
        self.stats.count();
    }

    /// Whether `node` was already posted to in this step.
    pub fn contacted(&self, node: NodeId) -> bool {
        self.outstanding.iter().any(|(n, _)| *n == node)
            || self.replies().iter().any(|(n, _)| *n == node)
            || self.failures.iter().any(|(n, _)| *n == node)
    }

    /// Successful replies received so far, in arrival order.
    pub fn replies(&self) -> &[(NodeId, Completion)] {
        self.replies.as_slice()
    }

    /// Mutable access to the replies (to take read buffers out of them).
    pub fn replies_mut(&mut self) -> &mut [(NodeId, Completion)] {
        self.replies.as_mut_slice()
    }

    /// Nodes that answered with an error in this step.
    pub fn failures(&self) -> &[(NodeId, FabricError)] {
        &self.failures
    }

    /// Collects whatever completed; returns how many successes there are now.
    #[inline]
    fn collect(&mut self) -> usize {
        // Called at every poll of a wait: posts after it check the fence again.
        self.fence_checked = false;
        if self.outstanding.is_empty() {
            return self.replies.len();
        }
        let mut i = 0;
        while i < self.outstanding.len() {
            let (node, ticket) = self.outstanding[i];
            match self.fabric.poll(ticket) {
                Poll::Pending => i += 1,
                Poll::Ready(result) => {
                    self.outstanding.swap_remove(i);
                    match result {
                        Ok(completion) => self.replies.push((node, completion)),
                        Err(error) => self.failures.push((node, error)),
                    }
                }
            }
        }
        self.replies.len()
    }

    /// Whether `k` posted nodes have answered successfully already, without waiting.
    /// Lets a caller skip work (such as reading the clock for a deadline) when a
    /// fabric completes batches inside `post`, as shared memory does.
    pub fn reached(&mut self, k: usize) -> bool {
        self.collect() >= k
    }

    /// Waits until `k` posted nodes answered successfully. Fails with
    /// [`FabricError::NotEnoughLiveNodes`] as soon as too few can still answer, and
    /// with [`FabricError::Fenced`] when it is polled past the operation's deadline
    /// ([`OpStats::deadline`]) with fewer than `k` answers.
    ///
    /// The fence bounds the wait because a batch may never complete: one posted to a
    /// node that was down is lost for good (the fabric contract), even once the node
    /// is back, so a step whose majority lost batches that way would otherwise wait
    /// for ever, however many nodes serve again. Past its deadline an operation may
    /// post nothing more anyway; it fails, and its caller treats the outcome as
    /// unknown, as for any failed write. The deadline is checked when the wait is
    /// polled, not announced to the fabric ([`Fabric::wake_at`]): a fabric with
    /// nothing else to do still reports a stall at once. It is checked every 32nd
    /// poll, not at each: a transport whose clock reading costs a system call (RDMA)
    /// pays it that much less while a step is pending.
    ///
    /// The future is a plain struct, not an `async fn`'s: a step whose replies are in
    /// already (a fabric that completes batches inside `submit`) is `Ready` at its
    /// first poll without an `async fn`'s state machine around it.
    pub fn wait(&mut self, k: usize) -> Wait<'_, 'a, F> {
        Wait {
            rt: self,
            k,
            polls: 0,
        }
    }

    /// Waits until `k` posted nodes answered, the fabric clock reaches `deadline`, or
    /// too few posted nodes can still answer, whichever comes first.
    pub async fn wait_until(&mut self, k: usize, deadline: Nanos) -> WaitOutcome {
        self.fabric.wake_at(deadline);
        poll_fn(|cx| {
            // The clock is read *before* collecting: a thread preempted between the
            // two (more client threads than cores) must not find the deadline passed
            // while its completions, due long ago, sit uncollected. A recent reading
            // does (`Fabric::recent_now`): completions due by it are collected, and a
            // fallback one executor round late costs nothing but that round.
            let now = self.fabric.recent_now();
            let ok = self.collect();
            if ok >= k {
                return Poll::Ready(WaitOutcome::Reached);
            }
            if ok + self.outstanding.len() < k || now >= deadline {
                return Poll::Ready(WaitOutcome::Short);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    /// Waits until every posted batch answered or failed, or the fabric clock
    /// reaches `deadline`; [`WaitOutcome::Reached`] if none is left outstanding.
    /// Unlike [`Roundtrip::wait_until`] with the number posted, a node that fails
    /// early does not end the wait for the others: for a step that counts every
    /// answer it can get (a reclaimer's CASes on every node).
    pub async fn settle_until(&mut self, deadline: Nanos) -> WaitOutcome {
        self.fabric.wake_at(deadline);
        poll_fn(|cx| {
            // Read before collecting, as in `wait_until`.
            let now = self.fabric.recent_now();
            self.collect();
            if self.outstanding.is_empty() {
                return Poll::Ready(WaitOutcome::Reached);
            }
            if now >= deadline {
                return Poll::Ready(WaitOutcome::Short);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }
}

/// The future of [`Roundtrip::wait`]: `k` successful answers, or the error that ends
/// the wait.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Wait<'r, 'a, F: Fabric + ?Sized> {
    rt: &'r mut Roundtrip<'a, F>,
    k: usize,
    /// Polls so far: the deadline is checked every [`FENCE_CHECK_POLLS`]th.
    polls: u32,
}

impl<F: Fabric + ?Sized> Future for Wait<'_, '_, F> {
    type Output = Result<(), FabricError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (rt, k) = (&mut *this.rt, this.k);
        let ok = rt.collect();
        if ok >= k {
            return Poll::Ready(Ok(()));
        }
        if ok + rt.outstanding.len() < k {
            return Poll::Ready(Err(FabricError::NotEnoughLiveNodes {
                needed: k,
                live: ok + rt.outstanding.len(),
            }));
        }
        this.polls = this.polls.wrapping_add(1);
        if this.polls.is_multiple_of(FENCE_CHECK_POLLS)
            && rt
                .stats
                .deadline()
                .is_some_and(|d| rt.fabric.recent_now() > d)
        {
            return Poll::Ready(Err(FabricError::Fenced));
        }
        // Our futures are driven by re-polling after `Fabric::progress`; ask any other
        // executor to poll again too.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<F: Fabric + ?Sized> Drop for Roundtrip<'_, F> {
    fn drop(&mut self) {
        if !self.outstanding.is_empty() {
            if let Some(keeper) = self.keeper {
                let mut kept = keeper.borrow_mut();
                kept.extend(self.outstanding.drain(..).map(|(_, ticket)| ticket));
            }
            for (_, ticket) in self.outstanding.drain(..) {
                self.fabric.forget(ticket);
            }
        }
        // The read buffers nobody took go back to the fabric, for its next reads
        // (`Fabric::give_back`): a steady stream of steps allocates none.
        for (_, reply) in self.replies.as_mut_slice() {
            reply.give_back_reads(|buffer| self.fabric.give_back(buffer));
        }
    }
}

/// A step whose every batch completes inside [`Fabric::submit`] (a fabric that says
/// [`Fabric::completes_in_submit`]), each reply handed to the caller as it comes
/// back, to fold into its own state at once: no tickets, no reply slots, no wait.
/// It counts its roundtrip once complete ([`Immediate::complete`]); one that the
/// fence stops counts it too, as a [`Roundtrip`] would have. A caller whose batch
/// did not complete after all (a crashed node) drops it, counted nothing, and takes
/// the general path with a [`Roundtrip`] for what is left: for steps that change
/// nothing (reads), posting them again is harmless; a step that stores (a write
/// round, [`Immediate::start_storing`]) asks only the replicas that did not answer,
/// and a batch that did not complete inside its post never executes on such a
/// fabric ([`Fabric::completes_in_submit`]).
///
/// **When the fence is checked.** An operation inside an enclosing deadline (every
/// SWARM-KV operation: `KvClient::begin` arms it from the reading it starts with)
/// reads the clock once, *after* the burst ([`Immediate::complete`]), not before
/// it: a step that only reads stores nothing, so posting it late is harmless, but
/// answers taken after a stop inside the burst may straddle a repair's copy
/// (`crate::protocol::maxreg`, "Quorums counted across a repair"), and the reading
/// after the last answer is the one that rules them out. An operation whose
/// deadline is armed at its first post ([`OpStats::arm_at_first_post`]: a
/// standalone register read, under which no repair runs) reads it before, which
/// arms the deadline.
pub(crate) struct Immediate<'a, F: Fabric + ?Sized> {
    fabric: &'a F,
    stats: &'a OpStats,
    /// The reply to the last batch: one completion, reused.
    reply: Completion,
    /// The fence is checked in [`Immediate::complete`] (a deadline was armed before
    /// the step started) rather than in [`Immediate::start`].
    check_after: bool,
}

impl<'a, F: Fabric + ?Sized> Immediate<'a, F> {
    /// Starts a step about to post a burst of reads. Without a deadline armed yet, the
    /// fence is checked (and a deadline waiting for the first post armed) once for the
    /// burst, as [`Roundtrip::post`] does ([`FabricError::Fenced`] past the
    /// operation's deadline, and nothing may be posted); with one, in
    /// [`Immediate::complete`] (type docs, "When the fence is checked").
    #[inline]
    pub(crate) fn start(fabric: &'a F, stats: &'a OpStats) -> Result<Self, FabricError> {
        let check_after = stats.deadline().is_some();
        if !check_after && let Err(error) = stats.check_fence(fabric) {
            stats.count();
            return Err(error);
        }
        Ok(Self {
            fabric,
            stats,
            reply: Completion::new(),
            check_after,
        })
    }

    /// Starts a step about to post a burst of batches that store (a write round's):
    /// the fence is checked (and a deadline waiting for the first post armed) once
    /// before the burst, as [`Roundtrip::post`] does, whether a deadline is armed or
    /// not: a store posted past the deadline may land in a recycled slot
    /// (`crate::protocol::slot_recycling`). [`FabricError::Fenced`] past the
    /// operation's deadline, counting the step's roundtrip, and nothing may be
    /// posted. The caller checks the clock after the answers as it would after a
    /// [`Roundtrip`] (`Client::settle`).
    #[inline]
    pub(crate) fn start_storing(fabric: &'a F, stats: &'a OpStats) -> Result<Self, FabricError> {
        if let Err(error) = stats.check_fence(fabric) {
            stats.count();
            return Err(error);
        }
        Ok(Self {
            fabric,
            stats,
            reply: Completion::new(),
            check_after: false,
        })
    }

    /// Submits `batch` to `node`; its reply if the fabric completed it inside the
    /// call, `None` otherwise (a failure, or a ticket, which is forgotten). The
    /// previous reply's read buffers go back to the fabric first.
    #[inline]
    pub(crate) fn submit(&mut self, node: NodeId, batch: &mut Batch) -> Option<&mut Completion> {
        self.reply
            .give_back_reads(|buffer| self.fabric.give_back(buffer));
        self.reply.clear();
        batch.set_deadline(self.stats.deadline());
        match self.fabric.submit(node, batch, &mut self.reply) {
            Submitted::Done => Some(&mut self.reply),
            Submitted::Failed(_) => None,
            Submitted::Posted(ticket) => {
                self.fabric.forget(ticket);
                None
            }
        }
    }

    /// Executes `batch` on `node` as one more batch of the step, its results left in
    /// `reply` rather than in the step's completion ([`Fabric::submit_in_place`]);
    /// `None` when the fabric does not, and the caller [`Immediate::submit`]s the
    /// batch instead.
    #[inline]
    pub(crate) fn submit_in_place(
        &mut self,
        node: NodeId,
        batch: &mut Batch,
        reply: &mut InPlaceReply<'_>,
    ) -> Option<Result<(), FabricError>> {
        batch.set_deadline(self.stats.deadline());
        self.fabric.submit_in_place(node, batch, reply)
    }

    /// Reads `out.len()` bytes at `addr` of `node` into `out` as one more batch of
    /// the step, without a batch or a reply ([`Fabric::read_direct`]); `None` when
    /// the fabric does not, and the caller [`Immediate::submit`]s the read instead.
    #[inline]
    pub(crate) fn read_direct(
        &mut self,
        node: NodeId,
        addr: u64,
        out: &mut [u8],
    ) -> Option<Result<(), FabricError>> {
        self.fabric.read_direct(node, addr, out)
    }

    /// Every batch of the step completed: counts its roundtrip, and fails with
    /// [`FabricError::Fenced`] if the fence is checked after the burst and the
    /// operation's deadline passed before this reading (its answers may straddle a
    /// stop: the caller must not return from them).
    #[inline]
    pub(crate) fn complete(self) -> Result<(), FabricError> {
        self.stats.count();
        if self.check_after {
            self.stats.check_fence(self.fabric)?;
        }
        Ok(())
    }
}

impl<F: Fabric + ?Sized> Drop for Immediate<'_, F> {
    #[inline]
    fn drop(&mut self) {
        self.reply
            .give_back_reads(|buffer| self.fabric.give_back(buffer));
    }
}

/// Posts `batch` to `node` without waiting for it: background work such as a lazy
/// in-place write or marking a tuple VERIFIED (SWARM §3.2, §4.3). Costs no roundtrip.
/// Through [`Fabric::post_detached`]: a transport that completes it inside the call has
/// executed it on return (its result is dropped); on the others it is in flight and
/// its ticket forgotten.
#[inline]
pub fn post_background<F: Fabric + ?Sized>(fabric: &F, node: NodeId, mut batch: Batch) {
    fabric.post_detached(node, &mut batch);
}

/// [`post_background`] on behalf of the operation of `stats`: dropped (and `false`
/// returned) once its deadline has passed, so that a fenced operation posts nothing,
/// not even background work.
pub fn post_background_for<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    node: NodeId,
    batch: Batch,
) -> bool {
    if stats.check_fence(fabric).is_err() {
        tracing::debug!(
            node = node.index(),
            "operation past its deadline: background batch dropped (fenced)"
        );
        return false;
    }
    let mut batch = batch;
    batch.set_deadline(stats.deadline());
    post_background(fabric, node, batch);
    true
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mem::{MemCluster, MemFabric};
    use core::pin::pin;
    use core::task::{Context, Waker};

    #[test]
    fn concurrent_branches_count_as_their_longest() {
        let stats = OpStats::new();
        stats.count();
        let _scope = stats.arm_deadline(50);
        let (a, b) = (stats.branch(), stats.branch());
        assert_eq!(
            a.deadline(),
            Some(50),
            "a branch keeps the operation's fence"
        );
        a.count();
        b.count();
        b.count();
        b.count_iteration();
        stats.join_branches(&[&a, &b]);
        assert_eq!(stats.roundtrips(), 3);
        assert_eq!(stats.iterations(), 1);
    }

    /// Counts the calls a roundtrip makes besides `submit`.
    struct Counting {
        inner: MemFabric,
        polls: Cell<u32>,
        progress: Cell<u32>,
        forgets: Cell<u32>,
    }

    impl Fabric for Counting {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> Ticket {
            self.inner.post(node, batch)
        }
        fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
            self.inner.submit(node, batch, reply)
        }
        fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
            self.polls.set(self.polls.get() + 1);
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: Ticket) {
            self.forgets.set(self.forgets.get() + 1);
            self.inner.forget(ticket);
        }
        fn progress(&self) -> bool {
            self.progress.set(self.progress.get() + 1);
            self.inner.progress()
        }
        fn now(&self) -> Nanos {
            self.inner.now()
        }
        fn wake_at(&self, deadline: Nanos) {
            self.inner.wake_at(deadline);
        }
    }

    /// The fast path: on a fabric that completes batches inside `submit`, a quorum
    /// step is complete before its first poll, with no ticket polled or forgotten,
    /// and background posts leave nothing behind either.
    #[test]
    fn a_synchronous_fabric_completes_a_step_without_tickets_or_progress() {
        let cluster = MemCluster::new(3, 64);
        let fabric = Counting {
            inner: cluster.client(),
            polls: Cell::new(0),
            progress: Cell::new(0),
            forgets: Cell::new(0),
        };
        let stats = OpStats::new();
        let mut step = pin!(async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            for n in 0..3 {
                rt.post(NodeId(n), Batch::write(8, alloc::vec![n as u8 + 1; 8]))
                    .unwrap();
            }
            rt.wait(2).await.unwrap();
            rt.replies().len()
        });
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(step.as_mut().poll(&mut cx), Poll::Ready(3));
        post_background(&fabric, NodeId(1), Batch::cas(0, 0, 9));
        assert_eq!(
            (
                fabric.polls.get(),
                fabric.progress.get(),
                fabric.forgets.get()
            ),
            (0, 0, 0),
            "polls, progress calls and forgets of a synchronous step"
        );
        assert_eq!(stats.roundtrips(), 1);
        // The effects are those of post + poll: each node got its own write, and the
        // background CAS was executed.
        let check = cluster.client();
        let t = check.post(NodeId(1), Batch::read(0, 16));
        let Poll::Ready(Ok(done)) = check.poll(t) else {
            panic!("the in-process fabric completes at once");
        };
        let mut expected = [0u8; 16];
        expected[0] = 9;
        expected[8..].fill(2);
        assert_eq!(done.read(0), Some(&expected[..]));
    }

    /// More replies than fit inline move to the heap, keeping their order.
    #[test]
    fn replies_beyond_the_inline_capacity_are_kept_in_order() {
        let nodes = INLINE_REPLIES + 2;
        let cluster = MemCluster::new(nodes, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let mut rt = Roundtrip::start(&fabric, &stats);
        for n in 0..nodes {
            rt.post(NodeId(n as u16), Batch::read(0, 8)).unwrap();
        }
        assert!(rt.reached(nodes));
        let order: alloc::vec::Vec<u16> = rt.replies().iter().map(|(n, _)| n.0).collect();
        assert_eq!(order, (0..nodes as u16).collect::<alloc::vec::Vec<_>>());
        assert!(rt.contacted(NodeId(nodes as u16 - 1)));
    }

    /// A reply slot handed to `submit` is taken back when the batch failed at once
    /// or went behind a ticket: the replies are exactly the completed batches', with
    /// their own outputs, inline and after spilling to the heap.
    #[test]
    fn replies_hold_only_batches_that_completed_in_place() {
        use crate::fabric::FailNodes;
        let nodes = INLINE_REPLIES + 3;
        let cluster = MemCluster::new(nodes, 64);
        let setup = cluster.client();
        for n in 0..nodes {
            setup.post(
                NodeId(n as u16),
                Batch::write(0, alloc::vec![n as u8 + 1; 8]),
            );
        }
        let fabric = FailNodes::new(cluster.client());
        fabric.fail_node(NodeId(2));
        let stats = OpStats::new();
        let mut rt = Roundtrip::start(&fabric, &stats);
        for n in 0..nodes as u16 {
            // Node 1's read is out of bounds (refused at once), node 2 is failed (a
            // ticket that never completes).
            let addr = if n == 1 { 64 } else { 0 };
            rt.post(NodeId(n), Batch::read(addr, 8)).unwrap();
        }
        let got: alloc::vec::Vec<(u16, u8)> = rt
            .replies()
            .iter()
            .map(|(n, c)| (n.0, c.read(0).expect("a read")[0]))
            .collect();
        let want: alloc::vec::Vec<(u16, u8)> =
            [0u16, 3, 4].iter().map(|&n| (n, n as u8 + 1)).collect();
        assert_eq!(got, want);
        assert!(rt.replies().iter().all(|(_, c)| c.outputs().len() == 1));
        assert_eq!(rt.failures().len(), 1);
        assert!(
            rt.contacted(NodeId(2)),
            "the failed node's batch is in flight"
        );
        assert!(!rt.reached(4));
    }

    #[test]
    fn a_roundtrip_refuses_more_posts_than_it_can_track() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let mut step = Roundtrip::start(&fabric, &stats);
        for _ in 0..MAX_NODES {
            step.post(NodeId(0), Batch::read(0, 8)).unwrap();
        }
        assert_eq!(
            step.post(NodeId(0), Batch::read(0, 8)),
            Err(FabricError::TooManyPosts { max: MAX_NODES })
        );
    }

    /// A batch to a silently failed node never completes; a wait that needs it ends
    /// at the operation's deadline (while other tasks keep the executor going) with
    /// `Fenced`, instead of waiting for ever, and a wait without a deadline is still
    /// reported as a stall.
    #[test]
    fn a_wait_for_a_lost_batch_ends_at_the_operations_deadline() {
        use crate::exec::{LocalExecutor, yield_now};
        use crate::fabric::FailNodes;
        let cluster = MemCluster::new(3, 64);
        let fabric = FailNodes::new(cluster.client());
        fabric.fail_node(NodeId(1));
        let deadline = 50;
        let stats = OpStats::with_deadline(deadline);
        let outcome = core::cell::RefCell::new(None);
        let waited_until = core::cell::Cell::new(0);
        let mut executor = LocalExecutor::new();
        executor.spawn(async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            rt.post(NodeId(0), Batch::read(0, 8)).unwrap();
            rt.post(NodeId(1), Batch::read(0, 8)).unwrap();
            let result = rt.wait(2).await;
            *outcome.borrow_mut() = Some(result);
            waited_until.set(fabric.now());
        });
        // Another operation keeps the thread busy meanwhile, for long enough.
        executor.spawn(async {
            for _ in 0..10 * deadline {
                if outcome.borrow().is_some() {
                    break;
                }
                yield_now(&fabric).await;
            }
        });
        executor.run(&fabric, |_, ()| {}).unwrap();
        assert_eq!(outcome.take(), Some(Err(FabricError::Fenced)));
        let late = waited_until.get() - deadline;
        assert!(
            late <= 2 * u64::from(FENCE_CHECK_POLLS),
            "ended {late} ticks late"
        );
        // Without a deadline, the same wait alone is a stall, as before.
        let plain = OpStats::new();
        let stalled = crate::exec::block_on_future(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &plain);
            rt.post(NodeId(0), Batch::read(0, 8)).unwrap();
            rt.post(NodeId(1), Batch::read(0, 8)).unwrap();
            rt.wait(2).await
        });
        assert_eq!(stalled, Err(FabricError::Stalled));
    }

    /// A deadline armed at the first post comes from that post's fence check, which
    /// reads the clock once for the burst; it fences later steps like any other, is
    /// kept by nested arms, and is disarmed with its scope. Branches posting first
    /// arm the operation's deadline when they are joined.
    #[test]
    fn a_deadline_armed_at_the_first_post_fences_from_that_post() {
        let cluster = MemCluster::new(2, 64);
        let fabric = cluster.client();
        let stats = OpStats::new();
        {
            let _scope = stats.arm_at_first_post(10);
            assert!(stats.is_armed());
            assert_eq!(stats.deadline(), None, "not before the first post");
            // A nested operation keeps it.
            {
                let _nested = stats.arm_at_first_post(1);
                assert_eq!(stats.deadline(), None);
            }
            for _ in 0..5 {
                fabric.progress();
            }
            assert_eq!(fabric.now(), 5);
            let mut step = Roundtrip::start(&fabric, &stats);
            step.post(NodeId(0), Batch::read(0, 8)).unwrap();
            assert_eq!(
                stats.deadline(),
                Some(15),
                "armed from the first post's reading"
            );
            step.post(NodeId(1), Batch::read(0, 8)).unwrap();
            assert_eq!(stats.deadline(), Some(15));
            drop(step);
            for _ in 0..11 {
                fabric.progress();
            }
            let mut late = Roundtrip::start(&fabric, &stats);
            assert_eq!(
                late.post(NodeId(0), Batch::read(0, 8)),
                Err(FabricError::Fenced)
            );
            assert!(!post_background_for(
                &fabric,
                &stats,
                NodeId(0),
                Batch::write(0, alloc::vec![1; 8])
            ));
        }
        assert!(!stats.is_armed(), "disarmed with the scope");
        // An eager deadline armed later replaces one waiting for the first post.
        {
            let _lazy = stats.arm_at_first_post(10);
            let _eager = stats.arm_deadline(100);
            assert_eq!(stats.deadline(), Some(100));
            let mut step = Roundtrip::start(&fabric, &stats);
            step.post(NodeId(0), Batch::read(0, 8)).unwrap();
            assert_eq!(stats.deadline(), Some(100));
        }
        // Branches that post first arm the operation's deadline at the join.
        let _scope = stats.arm_at_first_post(10);
        let (a, b) = (stats.branch(), stats.branch());
        let now = fabric.now();
        let mut step = Roundtrip::start(&fabric, &a);
        step.post(NodeId(0), Batch::read(0, 8)).unwrap();
        drop(step);
        assert_eq!(a.deadline(), Some(now + 10));
        assert_eq!(b.deadline(), None, "b posted nothing");
        stats.join_branches(&[&a, &b]);
        assert_eq!(stats.deadline(), Some(now + 10));
    }

    #[test]
    fn nothing_is_posted_after_the_deadline() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        fabric.progress(); // logical time 1
        assert_eq!(fabric.now(), 1);
        // At the deadline itself the operation may still post.
        let on_time = OpStats::with_deadline(1);
        assert_eq!(on_time.deadline(), Some(1));
        let mut step = Roundtrip::start(&fabric, &on_time);
        assert_eq!(step.post(NodeId(0), Batch::read(0, 8)), Ok(()));
        let late = OpStats::with_deadline(0);
        let mut fenced = Roundtrip::start(&fabric, &late);
        assert_eq!(
            fenced.post(NodeId(0), Batch::read(0, 8)),
            Err(FabricError::Fenced)
        );
        assert!(!post_background_for(
            &fabric,
            &late,
            NodeId(0),
            Batch::write(0, alloc::vec![1; 8])
        ));
        assert!(post_background_for(
            &fabric,
            &on_time,
            NodeId(0),
            Batch::write(0, alloc::vec![1; 8])
        ));
        // Without a deadline nothing is fenced; an earlier deadline wins.
        let stats = OpStats::new();
        assert_eq!(stats.deadline(), None);
        assert_eq!(stats.check_fence(&fabric), Ok(()));
        {
            let _operation = stats.arm_deadline(100);
            {
                let _step = stats.arm_deadline(200);
                assert_eq!(stats.deadline(), Some(100));
            }
            assert_eq!(stats.deadline(), Some(100));
            assert!(!stats.is_fenced(100));
            assert!(stats.is_fenced(101));
        }
        // The next operation on the same statistics gets its own deadline.
        assert_eq!(stats.deadline(), None);
        let _next = stats.arm_deadline(300);
        assert_eq!(stats.deadline(), Some(300));
    }
}
