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
use std::time::Instant;

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
    pub fn wait(&self) -> bool {
        self.wait_timed().is_some()
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
            state.arrived = 0;
            state.generation += 1;
            state.opened_at = Instant::now();
            self.opened.notify_all();
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
