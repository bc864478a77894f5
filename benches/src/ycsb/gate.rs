//! A reusable barrier that can be opened for good: the phase boundaries of a run.
//!
//! Client threads and the coordinating thread meet at every phase boundary (load,
//! warm-up, measured) so that each phase is timed on its own. `std::sync::Barrier`
//! cannot be cancelled: if one client thread never arrives (it could not be spawned),
//! everyone else would wait forever. [`Gate::abort`] releases every waiter, now and
//! later, and tells them to stop.
//!
//! The gate also says *when* it opened: the instant the last party arrived. A phase
//! is timed from those instants, not from when the coordinating thread happens to be
//! scheduled again (with more client threads than cores, that can be much later).

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct State {
    arrived: usize,
    generation: u64,
    opened_at: Instant,
    aborted: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct Gate {
    parties: usize,
    state: Mutex<State>,
    opened: Condvar,
}

impl Gate {
    /// A gate that opens each time `parties` threads wait at it.
    pub fn new(parties: usize) -> Self {
        Self {
            parties: parties.max(1),
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                opened_at: Instant::now(),
                aborted: false,
            }),
            opened: Condvar::new(),
        }
    }

    /// Waits until every party arrived; `false` if the gate was aborted (stop).
    /// (Client threads use [`Self::wait_ticking`].)
    #[cfg(test)]
    pub fn wait(&self) -> bool {
        self.wait_timed().is_some()
    }

    /// [`Self::wait`], calling `tick` every `every` while it waits (and once before):
    /// a client thread keeps its lease while the others finish their phase.
    pub fn wait_ticking(&self, every: Duration, mut tick: impl FnMut()) -> bool {
        tick();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.aborted {
            return false;
        }
        state.arrived += 1;
        if state.arrived == self.parties {
            self.open(&mut state);
            return true;
        }
        let generation = state.generation;
        while state.generation == generation && !state.aborted {
            state = self
                .opened
                .wait_timeout(state, every)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if state.generation == generation && !state.aborted {
                // Not under the lock: the others arrive meanwhile.
                drop(state);
                tick();
                state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            }
        }
        state.generation != generation
    }

    /// Opens the gate: the last party arrived.
    fn open(&self, state: &mut State) {
        state.arrived = 0;
        state.generation += 1;
        state.opened_at = Instant::now();
        self.opened.notify_all();
    }

    /// Waits until every party arrived and returns when the last one did; `None` if
    /// the gate was aborted (stop).
    pub fn wait_timed(&self) -> Option<Instant> {
        // The state stays consistent if a holder panicked: recover it.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.aborted {
            return None;
        }
        state.arrived += 1;
        if state.arrived == self.parties {
            self.open(&mut state);
            return Some(state.opened_at);
        }
        let generation = state.generation;
        while state.generation == generation && !state.aborted {
            state = self
                .opened
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // A gate opened before an abort still counts as opened.
        (state.generation != generation).then_some(state.opened_at)
    }

    /// Releases every waiter, now and later, with `false`.
    pub fn abort(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.aborted = true;
        self.opened.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn opens_once_everyone_arrived_and_is_reusable() {
        let gate = Gate::new(3);
        let passed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..5 {
                        assert!(gate.wait());
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            let mut last = None;
            for round in 0..5 {
                let opened = gate.wait_timed().expect("not aborted");
                assert!(last.is_none_or(|t| t < opened));
                last = Some(opened);
                // Nobody passes round `r + 1` before the main thread arrives there.
                assert!(passed.load(Ordering::SeqCst) <= 2 * (round + 1));
            }
        });
        assert_eq!(passed.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn a_ticking_waiter_ticks_until_the_gate_opens() {
        let gate = Gate::new(2);
        let ticks = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                gate.wait_ticking(Duration::from_millis(5), || {
                    ticks.fetch_add(1, Ordering::SeqCst);
                })
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(gate.wait());
            assert!(waiter.join().unwrap());
        });
        assert!(ticks.load(Ordering::SeqCst) >= 3, "ticked while it waited");
        // Reusable, and the last party to arrive opens it at once.
        std::thread::scope(|s| {
            s.spawn(|| assert!(gate.wait()));
            std::thread::sleep(Duration::from_millis(20));
            assert!(gate.wait_ticking(Duration::from_secs(60), || {}));
        });
    }

    #[test]
    fn abort_releases_waiters_now_and_later() {
        let gate = Gate::new(3);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| gate.wait());
            std::thread::sleep(std::time::Duration::from_millis(20));
            gate.abort();
            assert!(!waiter.join().unwrap());
        });
        assert!(!gate.wait());
    }
}
