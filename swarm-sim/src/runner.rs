//! [`SimRunner`]: many simulated clients, each running protocol operations as tasks.
//!
//! The runner is the multi-client counterpart of [`swarm_core::LocalExecutor`]: it polls
//! every live task, then runs world events up to the next one clients can observe
//! ([`SimWorld::progress`]: a completion, a timer, a fault), and repeats until every
//! task finished.
//! Tasks are tagged with the client that runs them, so that crashing a client
//! (SWARM §2.2: "any number of application threads can fail") drops exactly its
//! tasks mid-operation, while the batches they already posted still execute at the
//! nodes. When tasks remain but nothing can happen any more, `run` reports
//! [`SimError::Stalled`] instead of looping: that is how a protocol that waits for a
//! crashed node shows up. A virtual time limit catches livelocks.
//!
//! Tasks may spawn further tasks through a [`Spawner`], now or at a virtual time,
//! but the usual closed-loop client is a single task running its operations in
//! sequence.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Waker};
use std::rc::Rc;

use super::error::SimError;
use super::fabric::ClientId;
use super::fault::Fault;
use super::world::SimWorld;
use swarm_core::fabric::Nanos;

type Task = Pin<Box<dyn Future<Output = ()>>>;

struct Queued {
    start: Nanos,
    client: ClientId,
    task: Task,
}

struct Live {
    client: ClientId,
    task: Task,
}

struct Slot<T> {
    value: Option<T>,
    finished_at: Option<Nanos>,
    cancelled: bool,
}

/// Marks the task cancelled if its future is dropped before it finished.
struct CancelGuard<T>(Rc<RefCell<Slot<T>>>);

impl<T> Drop for CancelGuard<T> {
    fn drop(&mut self) {
        if let Ok(mut slot) = self.0.try_borrow_mut()
            && slot.finished_at.is_none()
        {
            slot.cancelled = true;
        }
    }
}

/// The outcome of a spawned task: its value and when it finished.
pub struct TaskHandle<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

impl<T> core::fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let slot = self.slot.borrow();
        f.debug_struct("TaskHandle")
            .field("finished_at", &slot.finished_at)
            .field("cancelled", &slot.cancelled)
            .finish()
    }
}

impl<T> TaskHandle<T> {
    /// Whether the task ran to completion.
    pub fn is_finished(&self) -> bool {
        self.slot.borrow().finished_at.is_some()
    }

    /// Whether the task was dropped unfinished (its client crashed).
    pub fn is_cancelled(&self) -> bool {
        self.slot.borrow().cancelled
    }

    /// Virtual time at which the task finished.
    pub fn finished_at(&self) -> Option<Nanos> {
        self.slot.borrow().finished_at
    }

    /// Takes the task's value (once).
    pub fn take(&self) -> Option<T> {
        self.slot.borrow_mut().value.take()
    }
}

/// Spawns tasks into a [`SimRunner`]; cheap to clone into tasks themselves.
#[derive(Clone)]
pub struct Spawner {
    world: SimWorld,
    queue: Rc<RefCell<Vec<Queued>>>,
}

impl core::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Spawner")
            .field("queued", &self.queue.borrow().len())
            .finish()
    }
}

impl Spawner {
    /// Runs `future` as a task of `client`, first polled in the runner's next round.
    pub fn spawn<T: 'static>(
        &self,
        client: ClientId,
        future: impl Future<Output = T> + 'static,
    ) -> TaskHandle<T> {
        self.spawn_at(self.world.now(), client, future)
    }

    /// Runs `future` as a task of `client` from virtual time `start` on.
    pub fn spawn_at<T: 'static>(
        &self,
        start: Nanos,
        client: ClientId,
        future: impl Future<Output = T> + 'static,
    ) -> TaskHandle<T> {
        let slot = Rc::new(RefCell::new(Slot {
            value: None,
            finished_at: None,
            cancelled: false,
        }));
        let guard = CancelGuard(slot.clone());
        let world = self.world.clone();
        let task = async move {
            let guard = guard;
            let value = future.await;
            let mut slot = guard.0.borrow_mut();
            slot.value = Some(value);
            slot.finished_at = Some(world.now());
        };
        if start > self.world.now() {
            self.world.wake_at(start);
        }
        self.queue.borrow_mut().push(Queued {
            start,
            client,
            task: Box::pin(task),
        });
        TaskHandle { slot }
    }
}

/// What one successful [`SimRunner::run`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// Tasks that ran to completion.
    pub finished: usize,
    /// Tasks dropped because their client crashed.
    pub cancelled: usize,
    /// Virtual time when the last task finished.
    pub now: Nanos,
    /// World events executed during the run.
    pub events: u64,
}

/// Runs tasks of many simulated clients over one [`SimWorld`]. See the module docs.
pub struct SimRunner {
    world: SimWorld,
    spawner: Spawner,
    live: Vec<Live>,
    time_limit: Nanos,
    finished: usize,
    cancelled: usize,
}

impl core::fmt::Debug for SimRunner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimRunner")
            .field("live", &self.live.len())
            .field("time_limit", &self.time_limit)
            .field("finished", &self.finished)
            .field("cancelled", &self.cancelled)
            .finish()
    }
}

impl SimRunner {
    /// Default limit on virtual time: one second is ~10^5 roundtrips.
    pub const DEFAULT_TIME_LIMIT: Nanos = 1_000_000_000;

    /// A runner with no task over `world`.
    pub fn new(world: &SimWorld) -> Self {
        Self {
            world: world.clone(),
            spawner: Spawner {
                world: world.clone(),
                queue: Rc::new(RefCell::new(Vec::new())),
            },
            live: Vec::new(),
            time_limit: Self::DEFAULT_TIME_LIMIT,
            finished: 0,
            cancelled: 0,
        }
    }

    /// The world the runner drives.
    pub fn world(&self) -> &SimWorld {
        &self.world
    }

    /// A handle to spawn tasks from inside tasks.
    pub fn spawner(&self) -> Spawner {
        self.spawner.clone()
    }

    /// Runs `future` as a task of `client` (see [`Spawner::spawn`]).
    pub fn spawn<T: 'static>(
        &self,
        client: ClientId,
        future: impl Future<Output = T> + 'static,
    ) -> TaskHandle<T> {
        self.spawner.spawn(client, future)
    }

    /// Runs `future` as a task of `client` from virtual time `start` on.
    pub fn spawn_at<T: 'static>(
        &self,
        start: Nanos,
        client: ClientId,
        future: impl Future<Output = T> + 'static,
    ) -> TaskHandle<T> {
        self.spawner.spawn_at(start, client, future)
    }

    /// Schedules `fault` at virtual time `time` (see [`SimWorld::at`]).
    pub fn at(&self, time: Nanos, fault: Fault) {
        self.world.at(time, fault);
    }

    /// Crashes `client` now: its tasks are dropped before the next poll.
    pub fn crash_client(&self, client: ClientId) {
        self.world.crash_client(client);
    }

    /// Sets the virtual time past which [`SimRunner::run`] gives up with
    /// [`SimError::TimeLimit`].
    pub fn time_limit(&mut self, limit: Nanos) -> &mut Self {
        self.time_limit = limit;
        self
    }

    /// Tasks spawned and not yet finished or cancelled.
    pub fn live_tasks(&self) -> usize {
        self.live.len() + self.spawner.queue.borrow().len()
    }

    /// Drops the tasks of crashed clients, queued ones included.
    fn cancel_crashed(&mut self) {
        let world = &self.world;
        let crashed = |client: &ClientId| world.client_crashed(*client);
        let any_doomed = self.live.iter().any(|e| crashed(&e.client))
            || self
                .spawner
                .queue
                .borrow()
                .iter()
                .any(|e| crashed(&e.client));
        if !any_doomed {
            return;
        }
        let (doomed, kept): (Vec<Live>, Vec<Live>) = core::mem::take(&mut self.live)
            .into_iter()
            .partition(|entry| world.client_crashed(entry.client));
        self.live = kept;
        let (doomed_queued, kept_queued): (Vec<Queued>, Vec<Queued>) =
            core::mem::take(&mut *self.spawner.queue.borrow_mut())
                .into_iter()
                .partition(|entry| world.client_crashed(entry.client));
        *self.spawner.queue.borrow_mut() = kept_queued;
        self.cancelled += doomed.len() + doomed_queued.len();
        // Dropping a task drops its roundtrips, which forget their tickets: no world
        // or queue borrow may be held here.
        drop(doomed);
        drop(doomed_queued);
    }

    /// Moves queued tasks that are due into the live set, in spawn order.
    fn admit(&mut self) -> usize {
        let now = self.world.now();
        let mut queue = self.spawner.queue.borrow_mut();
        let mut admitted = 0;
        let mut i = 0;
        while i < queue.len() {
            if queue[i].start <= now {
                let entry = queue.remove(i);
                self.live.push(Live {
                    client: entry.client,
                    task: entry.task,
                });
                admitted += 1;
            } else {
                i += 1;
            }
        }
        admitted
    }

    /// Polls every live task once; returns how many finished.
    fn poll_all(&mut self) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        let before = self.live.len();
        self.live
            .retain_mut(|entry| entry.task.as_mut().poll(&mut cx).is_pending());
        let done = before - self.live.len();
        self.finished += done;
        done
    }

    fn all_done(&self) -> bool {
        self.live.is_empty() && self.spawner.queue.borrow().is_empty()
    }

    fn clients(&self) -> Vec<ClientId> {
        let mut clients: Vec<ClientId> = self.live.iter().map(|e| e.client).collect();
        clients.extend(self.spawner.queue.borrow().iter().map(|e| e.client));
        clients.sort_unstable();
        clients.dedup();
        clients
    }

    fn report(&self, before: RunReport) -> RunReport {
        RunReport {
            finished: self.finished - before.finished,
            cancelled: self.cancelled - before.cancelled,
            now: self.world.now(),
            events: self.world.events_run() - before.events,
        }
    }

    /// Runs until every task finished (or was cancelled by its client's crash).
    /// Batches nobody waits for (background writes) may still be in flight
    /// afterwards; [`SimWorld::drain`] lets them land.
    ///
    /// Panics raised by tasks propagate, so `assert!`s inside tasks fail the test.
    pub fn run(&mut self) -> Result<RunReport, SimError> {
        let before = RunReport {
            finished: self.finished,
            cancelled: self.cancelled,
            now: self.world.now(),
            events: self.world.events_run(),
        };
        loop {
            self.cancel_crashed();
            self.admit();
            self.poll_all();
            if self.all_done() {
                return Ok(self.report(before));
            }
            if self.world.now() > self.time_limit {
                return Err(SimError::TimeLimit {
                    seed: self.world.seed(),
                    limit: self.time_limit,
                    tasks: self.live_tasks(),
                    clients: self.clients(),
                });
            }
            if self.world.progress() {
                continue;
            }
            // Nothing can happen any more. One last round may still finish a task
            // (with what the last event delivered) or post new batches.
            self.cancel_crashed();
            let admitted = self.admit();
            let finished = self.poll_all();
            if self.all_done() {
                return Ok(self.report(before));
            }
            let due = {
                let now = self.world.now();
                self.spawner.queue.borrow().iter().any(|q| q.start <= now)
            };
            if finished == 0 && admitted == 0 && !due && !self.world.has_events() {
                let clients = self.clients();
                let pending = clients
                    .iter()
                    .flat_map(|c| self.world.pending_batches(*c))
                    .collect();
                return Err(SimError::Stalled {
                    seed: self.world.seed(),
                    at: self.world.now(),
                    tasks: self.live_tasks(),
                    clients,
                    pending,
                    crashed: self.world.crashed_nodes(),
                });
            }
        }
    }
}

impl Drop for SimRunner {
    fn drop(&mut self) {
        // Queued tasks may hold spawners that hold the queue: break the cycle.
        let queued = core::mem::take(&mut *self.spawner.queue.borrow_mut());
        drop(queued);
    }
}
