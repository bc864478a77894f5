//! A tiny executor: one client thread, several protocol operations in flight.
//!
//! Protocol operations are `async fn`s over a [`Fabric`]. They never block: a
//! roundtrip that is not complete returns `Pending`. The executor polls every task,
//! then lets the fabric make progress ([`Fabric::progress`]: poll a completion queue,
//! advance virtual time, spin out an emulated latency), and repeats. There are no
//! wakers to juggle and no allocation per poll; with a handful of tasks per thread,
//! polling them all is cheaper than tracking which one to wake.
//!
//! When no task finished in a round and the fabric reports that nothing outstanding
//! can complete any more, the executor stops with [`FabricError::Stalled`] instead of
//! spinning forever: the operations wait on failed nodes only.
//!
//! # The executor contract
//!
//! * **Who calls [`Fabric::progress`].** Whoever drives the futures, between polls.
//!   Protocol futures never block and never wait for an interrupt: a [`Roundtrip`]
//!   that is not complete returns `Pending`, and only `progress` moves the transport
//!   on (polls an RDMA completion queue, advances simulated time, spins out an
//!   emulated latency). Some fabrics complete batches inside [`Fabric::post`] (the
//!   in-process [`crate::MemCluster`] fabric, shared memory without emulated latency), but
//!   code must not rely on it.
//! * **[`block_on`]** runs one operation on the calling thread: poll, `progress`, poll
//!   again, until it is ready, and returns the operation's own `Result`. A stall
//!   (`progress` reports that nothing outstanding can complete: every batch waits on a
//!   failed node, and no deadline asked for with [`Fabric::wake_at`] is pending) comes
//!   back as the operation's error, converted from [`FabricError::Stalled`].
//!   [`block_on_future`] does the same for a future that returns no `Result`.
//! * **[`LocalExecutor`]** does the same for several futures of one client thread,
//!   polling each live task once per round, then calling `progress` once.
//! * **Fabric handles are per thread.** Transports hand out one handle per client
//!   thread (typically `!Sync`), and a [`crate::Client`] owns one; its futures borrow
//!   the client and stay on that thread.
//! * **Wakers.** A pending roundtrip wakes its own task at once
//!   (`wake_by_ref` before returning `Pending`), so any executor re-polls it; that
//!   is a busy poll, not a notification, and nothing calls `progress` for you.
//!
//! **On a foreign executor** (tokio, async-std, an embedded one): the futures run, but
//! unless something calls `progress` on the same fabric handle, a transport that
//! needs it never completes a batch, and the task spins. Do one of:
//!
//! 1. Give each client a thread of its own and call [`block_on`] or
//!    [`LocalExecutor::run`] there; from tokio, that is `spawn_blocking` (or a
//!    dedicated thread) with the client created inside it.
//! 2. Drive the operation yourself: poll it, call `fabric.progress()` whenever it is
//!    `Pending`, and yield to your executor between rounds if other tasks share the
//!    thread. This is what [`block_on`] does, minus the yield.
//!
//! Either way a client's operations spin while they wait; that is the point of
//! one-sided memory access (a roundtrip is microseconds), and the reason the core
//! does not sleep or park.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::{Pin, pin};
use core::task::{Context, Poll, Waker};

use crate::fabric::{Fabric, FabricError};
#[cfg(doc)]
use crate::roundtrip::Roundtrip;

/// Runs one operation to completion on `fabric` and returns its result.
///
/// Polls the operation and calls [`Fabric::progress`] whenever it is pending. If
/// nothing can complete any more (every batch it waits for is on a failed node), the
/// operation stalled: that is reported as the operation's own error type, through
/// `From<FabricError>` ([`FabricError::Stalled`]), so callers handle one `Result`.
/// Futures that return no `Result` use [`block_on_future`].
// Inlined so that the operation's future (kilobytes of state for a Safe-Guess
// operation) is built where it is polled instead of being copied into this frame.
#[inline(always)]
pub fn block_on<F, T, E>(fabric: &F, operation: impl Future<Output = Result<T, E>>) -> Result<T, E>
where
    F: Fabric + ?Sized,
    E: From<FabricError>,
{
    block_on_future(fabric, operation)?
}

/// Runs any future to completion on `fabric`, like [`block_on`]; `Err` only if it
/// stalled ([`FabricError::Stalled`]).
#[inline(always)]
pub fn block_on_future<F, T>(fabric: &F, future: impl Future<Output = T>) -> Result<T, FabricError>
where
    F: Fabric + ?Sized,
{
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return Ok(value);
        }
        if !fabric.progress() {
            // Nothing is in flight any more. One more poll takes what this progress
            // delivered, and may post the operation's next step (a fabric that
            // completes batches in `progress`, as RDMA does, ends a roundtrip here);
            // only if that posted nothing either is the operation stalled.
            if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return Ok(value);
            }
            if !fabric.progress() {
                return Err(FabricError::Stalled);
            }
        }
    }
}

/// Identifies a task spawned on a [`LocalExecutor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub usize);

type Task<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Several operations of one client thread in flight at once.
pub struct LocalExecutor<'a, T> {
    tasks: Vec<Option<Task<'a, T>>>,
    live: usize,
}

impl<T> core::fmt::Debug for LocalExecutor<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LocalExecutor")
            .field("live", &self.live)
            .finish()
    }
}

impl<T> Default for LocalExecutor<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a, T> LocalExecutor<'a, T> {
    /// An executor with no task.
    pub const fn new() -> Self {
        Self {
            tasks: Vec::new(),
            live: 0,
        }
    }

    /// Adds a task; it is first polled by the next [`Self::poll_once`].
    pub fn spawn(&mut self, future: impl Future<Output = T> + 'a) -> TaskId {
        self.live += 1;
        let task: Task<'a, T> = Box::pin(future);
        if let Some(index) = self.tasks.iter().position(Option::is_none) {
            self.tasks[index] = Some(task);
            TaskId(index)
        } else {
            self.tasks.push(Some(task));
            TaskId(self.tasks.len() - 1)
        }
    }

    /// Tasks not yet finished.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Polls every live task once; calls `done` for each task that finished.
    /// Returns how many finished.
    pub fn poll_once(&mut self, mut done: impl FnMut(TaskId, T)) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        let mut finished = 0;
        for (index, slot) in self.tasks.iter_mut().enumerate() {
            let Some(task) = slot else { continue };
            if let Poll::Ready(value) = task.as_mut().poll(&mut cx) {
                *slot = None;
                self.live -= 1;
                finished += 1;
                done(TaskId(index), value);
            }
        }
        finished
    }

    /// Runs every task to completion on `fabric`, calling `done` as each finishes.
    /// Stops with [`FabricError::Stalled`] if the remaining tasks can never finish.
    pub fn run<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        mut done: impl FnMut(TaskId, T),
    ) -> Result<(), FabricError> {
        while self.live > 0 {
            self.step(fabric, &mut done)?;
        }
        Ok(())
    }

    /// Polls every live task once and drives `fabric` one step, for callers that
    /// run their own loop (and spawn tasks as others finish). Returns how many
    /// tasks finished; [`FabricError::Stalled`] if live tasks remain that can never
    /// finish: nothing finished, the fabric has nothing in flight and no wake-up
    /// due, and one more poll neither finished a task nor gave the fabric work
    /// (that poll may take what the last `progress` delivered, or end a sleep, and
    /// post the next batches: not a stall).
    pub fn step<F: Fabric + ?Sized>(
        &mut self,
        fabric: &F,
        mut done: impl FnMut(TaskId, T),
    ) -> Result<usize, FabricError> {
        if self.live == 0 {
            fabric.progress();
            return Ok(0);
        }
        step_rounds(fabric, || self.poll_once(&mut done))
    }
}

/// One step of an executor loop over live tasks, whatever holds them: `round` polls
/// each live task once and returns how many finished; then `fabric` is driven. The
/// rule of [`LocalExecutor::step`], for callers that keep their own tasks (a
/// [`SlotExecutor`] and a task beside it): returns how many finished, or
/// [`FabricError::Stalled`] if nothing finished, the fabric has nothing in flight and
/// no wake-up due, and one more round neither finished a task nor gave the fabric
/// work. Call it only while some task is live.
pub fn step_rounds<F: Fabric + ?Sized>(
    fabric: &F,
    mut round: impl FnMut() -> usize,
) -> Result<usize, FabricError> {
    let finished = round();
    if finished > 0 || fabric.progress() {
        return Ok(finished);
    }
    let finished = round();
    if finished == 0 && !fabric.progress() {
        return Err(FabricError::Stalled);
    }
    Ok(finished)
}

/// Operations of one future type in flight in a fixed set of slots: what a client
/// thread that keeps `n` operations of one `async fn` going uses instead of a
/// [`LocalExecutor`]. Each slot's memory is allocated once; starting an operation
/// moves its future into its slot. A [`LocalExecutor`] boxes every task it spawns:
/// an allocation (operation futures are kilobytes, beyond the allocator's small-size
/// caches) and a copy of the future per operation, which a benchmark issuing millions
/// of one-roundtrip operations pays for visibly.
pub struct SlotExecutor<Fut> {
    slots: Vec<Pin<Box<Option<Fut>>>>,
    live: usize,
}

impl<Fut> core::fmt::Debug for SlotExecutor<Fut> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SlotExecutor")
            .field("slots", &self.slots.len())
            .field("live", &self.live)
            .finish()
    }
}

impl<Fut: Future> SlotExecutor<Fut> {
    /// An executor of `slots` empty slots.
    pub fn new(slots: usize) -> Self {
        Self {
            slots: (0..slots).map(|_| Box::pin(None)).collect(),
            live: 0,
        }
    }

    /// Slots holding an operation not yet finished.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Whether `slot` holds an operation not yet finished.
    pub fn is_busy(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|s| s.is_some())
    }

    /// Starts `future` in `slot` (first polled by the next [`Self::poll_once`]),
    /// dropping the operation the slot held, if any.
    ///
    /// # Panics
    ///
    /// If there is no slot `slot`.
    // Inlined so that the future is built where it is moved into the slot.
    #[inline(always)]
    pub fn start(&mut self, slot: usize, future: Fut) {
        let mut held = self.slots[slot].as_mut();
        if held.is_none() {
            self.live += 1;
        }
        held.set(Some(future));
    }

    /// Drops every operation in flight.
    pub fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.as_mut().set(None);
        }
        self.live = 0;
    }

    /// Polls every busy slot once; calls `done` with the slot of each operation that
    /// finished (the slot is free again). Returns how many finished.
    pub fn poll_once(&mut self, mut done: impl FnMut(usize, Fut::Output)) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        let mut finished = 0;
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let Some(future) = slot.as_mut().as_pin_mut() else {
                continue;
            };
            if let Poll::Ready(value) = future.poll(&mut cx) {
                slot.as_mut().set(None);
                self.live -= 1;
                finished += 1;
                done(index, value);
            }
        }
        finished
    }
}

/// Waits `ns` on the fabric's clock, asking the fabric to wake up then
/// ([`Fabric::wake_at`]), so that an executor keeps driving it (and a simulated fabric
/// advances its virtual time) instead of reporting a stall: backoff between contended
/// attempts, a loser polling for the winner, a client waiting for a membership change.
pub async fn sleep<F: Fabric + ?Sized>(fabric: &F, ns: crate::fabric::Nanos) {
    let deadline = fabric.now().saturating_add(ns);
    fabric.wake_at(deadline);
    core::future::poll_fn(|cx| {
        if fabric.now() >= deadline {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Returns `Pending` once, waking its task at once, then `Ready`: lets the other
/// tasks of the thread run before the caller goes on. An operation that hinted its
/// memory to the fabric does it so that the others in flight hint theirs before
/// any of them touches its own ([`crate::OpStats::interleaved`]). Tells `fabric`
/// ([`Fabric::yielded`]), so that an executor does not take the round for a stall
/// when the task has nothing in flight.
pub async fn yield_now<F: Fabric + ?Sized>(fabric: &F) {
    let mut yielded = false;
    core::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            fabric.yielded();
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Runs two futures concurrently on the current task and returns both outputs: the
/// way an operation keeps two protocol steps in flight at once (for example an
/// insert writing a key header and replicating the value in the same roundtrip).
pub async fn join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    core::future::poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    match (ra, rb) {
        (Some(a), Some(b)) => (a, b),
        _ => unreachable!("the poll loop returns only once both outputs are present"),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::fabric::{Batch, Completion, NodeId, Ticket};
    use crate::mem::{MemCluster, MemFabric};
    use crate::roundtrip::{OpStats, Roundtrip};
    use core::cell::RefCell;

    /// Completes a batch in the second `progress` call after it was posted (its
    /// completion reaches the queue between the two), and reports whether any batch
    /// is still pending, as the RDMA fabric does after draining its completion queue.
    struct CompletesInProgress {
        inner: MemFabric,
        /// Batches not delivered yet, and whether a `progress` call saw them.
        held: RefCell<Vec<(Ticket, bool)>>,
    }

    impl Fabric for CompletesInProgress {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> Ticket {
            let ticket = self.inner.post(node, batch);
            self.held.borrow_mut().push((ticket, false));
            ticket
        }
        fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
            if self.held.borrow().iter().any(|(held, _)| *held == ticket) {
                return Poll::Pending;
            }
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: Ticket) {
            self.inner.forget(ticket);
        }
        fn progress(&self) -> bool {
            let mut held = self.held.borrow_mut();
            held.retain(|(_, seen)| !seen);
            held.iter_mut().for_each(|(_, seen)| *seen = true);
            !held.is_empty()
        }
        fn now(&self) -> crate::fabric::Nanos {
            self.inner.now()
        }
        fn wake_at(&self, deadline: crate::fabric::Nanos) {
            self.inner.wake_at(deadline);
        }
    }

    async fn two_roundtrips(fabric: &CompletesInProgress) -> Result<u32, FabricError> {
        let stats = OpStats::new();
        for _ in 0..2 {
            let mut rt = Roundtrip::start(fabric, &stats);
            rt.post(NodeId(0), Batch::read(0, 8))?;
            rt.wait(1).await?;
        }
        Ok(stats.roundtrips())
    }

    /// The first run over real verbs stalled here: the poll after a `progress` that
    /// delivered a roundtrip's last completion posts the next roundtrip, which is not
    /// a stall.
    #[test]
    fn an_operation_that_posts_after_its_last_completion_is_not_stalled() {
        let cluster = MemCluster::new(1, 64);
        let fabric = CompletesInProgress {
            inner: cluster.client(),
            held: RefCell::new(Vec::new()),
        };
        assert_eq!(block_on(&fabric, two_roundtrips(&fabric)), Ok(2));
        let mut exec = LocalExecutor::new();
        exec.spawn(two_roundtrips(&fabric));
        exec.spawn(two_roundtrips(&fabric));
        let mut results = Vec::new();
        exec.run(&fabric, |_, r| results.push(r)).unwrap();
        assert_eq!(results, [Ok(2), Ok(2)]);
        // A future that waits for nothing the fabric can deliver still stalls.
        let never = block_on_future(&fabric, core::future::pending::<()>());
        assert_eq!(never, Err(FabricError::Stalled));
    }

    /// Reports no wake-up once its clock reaches the deadline asked for (as a
    /// real-time fabric does), so a sleep ends in the poll after a `progress` that
    /// returned `false`.
    struct StrictWake {
        inner: MemFabric,
        wake: core::cell::Cell<crate::fabric::Nanos>,
    }

    impl Fabric for StrictWake {
        fn node_count(&self) -> usize {
            self.inner.node_count()
        }
        fn post(&self, node: NodeId, batch: Batch) -> Ticket {
            self.inner.post(node, batch)
        }
        fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
            self.inner.poll(ticket)
        }
        fn forget(&self, ticket: Ticket) {
            self.inner.forget(ticket);
        }
        fn progress(&self) -> bool {
            self.inner.progress();
            self.inner.now() < self.wake.get()
        }
        fn now(&self) -> crate::fabric::Nanos {
            self.inner.now()
        }
        fn wake_at(&self, deadline: crate::fabric::Nanos) {
            self.wake.set(self.wake.get().max(deadline));
        }
    }

    /// A task that backs off twice: the poll that ends the first sleep starts the
    /// second, which is not a stall (a benchmark loop once reported it as one).
    #[test]
    fn a_task_whose_sleep_ends_after_the_last_progress_is_not_stalled() {
        let cluster = MemCluster::new(1, 64);
        let fabric = StrictWake {
            inner: cluster.client(),
            wake: core::cell::Cell::new(0),
        };
        let backoff_twice = || async {
            sleep(&fabric, 3).await;
            sleep(&fabric, 3).await;
            5u32
        };
        let mut exec = LocalExecutor::new();
        exec.spawn(backoff_twice());
        let mut done = alloc::vec::Vec::new();
        while exec.live() > 0 {
            exec.step(&fabric, |_, v| done.push(v))
                .expect("not stalled");
        }
        assert_eq!(done, [5]);
        exec.spawn(backoff_twice());
        exec.run(&fabric, |_, v| done.push(v)).expect("not stalled");
        assert_eq!(done, [5, 5]);
        exec.spawn(core::future::pending());
        assert_eq!(exec.step(&fabric, |_, _| {}), Err(FabricError::Stalled));
    }

    #[test]
    fn join_waits_for_both_and_stall_is_reported() {
        let cluster = MemCluster::new(1, 64);
        let fabric = cluster.client();
        let (a, b) = block_on_future(&fabric, join(async { 1 }, async { "two" })).unwrap();
        assert_eq!((a, b), (1, "two"));
        let mut exec: LocalExecutor<'_, u32> = LocalExecutor::new();
        exec.spawn(async { 7 });
        exec.spawn(core::future::pending());
        let mut done = alloc::vec::Vec::new();
        assert_eq!(
            exec.run(&fabric, |_, v| done.push(v)),
            Err(FabricError::Stalled)
        );
        assert_eq!(done, [7]);
    }

    /// A future that is pending `polls` times, then ready with `value`; drops count
    /// in `dropped`.
    struct Countdown<'a> {
        polls: u32,
        value: u32,
        dropped: &'a core::cell::Cell<u32>,
    }

    impl Future for Countdown<'_> {
        type Output = u32;
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u32> {
            if self.polls == 0 {
                return Poll::Ready(self.value);
            }
            self.polls -= 1;
            Poll::Pending
        }
    }

    impl Drop for Countdown<'_> {
        fn drop(&mut self) {
            self.dropped.set(self.dropped.get() + 1);
        }
    }

    #[test]
    fn slots_run_their_operations_and_are_reused() {
        let dropped = core::cell::Cell::new(0);
        let countdown = |polls, value| Countdown {
            polls,
            value,
            dropped: &dropped,
        };
        let mut slots = SlotExecutor::new(3);
        assert_eq!(slots.live(), 0);
        slots.start(0, countdown(0, 10));
        slots.start(2, countdown(2, 12));
        assert!(slots.is_busy(0) && !slots.is_busy(1) && slots.is_busy(2));
        assert!(!slots.is_busy(3), "no such slot");
        let mut done = alloc::vec::Vec::new();
        assert_eq!(slots.poll_once(|slot, v| done.push((slot, v))), 1);
        assert_eq!(done, [(0, 10)]);
        assert_eq!(
            (slots.live(), dropped.get()),
            (1, 1),
            "a finished future is dropped"
        );
        // The freed slot takes the next operation.
        slots.start(0, countdown(1, 20));
        assert_eq!(slots.poll_once(|slot, v| done.push((slot, v))), 0);
        assert_eq!(slots.poll_once(|slot, v| done.push((slot, v))), 2);
        assert_eq!(done, [(0, 10), (0, 20), (2, 12)]);
        assert_eq!(slots.live(), 0);
        // Starting over a busy slot drops what it held; clear drops the rest.
        slots.start(1, countdown(5, 0));
        slots.start(1, countdown(5, 1));
        assert_eq!((slots.live(), dropped.get()), (1, 4));
        slots.start(2, countdown(5, 2));
        slots.clear();
        assert_eq!((slots.live(), dropped.get()), (0, 6));
        assert_eq!(slots.poll_once(|_, _| panic!("nothing runs")), 0);
    }
}
