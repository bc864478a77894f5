//! The Wing–Gong search with Lowe's memoization, over one key (see the module docs of
//! [`crate`] for the why).
//!
//! The search walks a doubly linked list of call and return entries in time order.
//! The operations whose call precedes the first remaining return are exactly those
//! that may be linearized next (any of them could take effect before that return);
//! crashed operations that were called by then are candidates too. Linearizing an
//! operation applies it to the state and *lifts* its two entries from the list;
//! backtracking puts them back (dancing links). A configuration (linearized set,
//! state) already explored is never explored again.
//!
//! Each configuration on the current path has a *level*: its candidates, computed
//! once when it is reached, and how many were tried. Two refinements keep the
//! branching down:
//! * A *free* candidate, possible in the current state and of a kind that never
//!   changes the state (a read or get of the current value, a failed update or delete
//!   of an absent key), is linearized without branching: in any valid continuation it
//!   can be moved to the front (it was called before every pending operation
//!   returned, so real time allows it; it changed nothing where it was, so every
//!   other operation still sees the same states; and it is possible here). If the
//!   configuration after it fails, so does this one. A write of the current value is
//!   not free: where the continuation placed it, it may have changed the state.
//! * Otherwise the candidates are tried "just in time": first `p`, the operation
//!   that returns earliest (it must be linearized before anything called after its
//!   return), and the candidates after which `p` becomes possible (the write that a
//!   stuck read returns); then the other completed candidates by return; crashed
//!   ones last, by call. Any order is complete; this one follows the order in which
//!   operations must take effect, so the first path tried is usually right.
//!
//! Invariant behind the compact memo key: if `p` is the completed operation with the
//! earliest return among those not linearized, every linearized operation with a
//! larger id was called before `p` returned (it was a candidate while `p` was
//! pending). So the linearized set is `0..p` plus operations concurrent with `p`'s
//! return: at most one per other client, plus applied crashed operations.

use std::vec::Vec;

use super::memo::{Frontier, Memo, Undo};
use super::model::{NULL, ValueId, is_pure, step};
use super::prepare::Prepared;

/// How many linearized operations a failure report shows before the stuck point.
pub(crate) const TAIL: usize = 8;

/// The search's verdict on one key.
#[derive(Debug)]
pub(crate) enum Found {
    /// A linearization exists.
    Linearizable,
    /// No linearization exists; the deepest configuration reached explains why.
    Violation(Deepest),
    /// The configuration budget ran out first.
    BudgetExhausted,
}

/// The configuration with the most completed operations linearized, first reached.
#[derive(Clone, Debug, Default)]
pub(crate) struct Deepest {
    /// Completed operations linearized.
    pub(crate) depth: u32,
    pub(crate) frontier: Frontier,
    pub(crate) state: ValueId,
    /// The last linearized ids, in linearization order.
    pub(crate) tail: Vec<u32>,
    /// Every state (up to [`STATES`]) of a configuration whose first pending completed
    /// operation is the same as this one's: the values possible while it is pending.
    pub(crate) states: Vec<ValueId>,
}

/// How many possible states a failure report lists.
pub(crate) const STATES: usize = 8;

/// What the search did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SearchStats {
    /// Configurations explored.
    pub(crate) configurations: u64,
    /// The largest memo, in configurations.
    pub(crate) peak_memo: usize,
}

/// One configuration on the search path: its candidates and how many were tried.
#[derive(Clone, Copy, Debug)]
struct Level {
    /// Where its candidates start in `Search::candidates`.
    from: u32,
    /// How many candidates it has.
    len: u32,
    /// How many were tried.
    tried: u32,
}

/// One linearized operation on the search path.
#[derive(Clone, Copy, Debug)]
struct Frame {
    op: u32,
    prev_state: ValueId,
    undo: Undo,
}

/// The doubly linked list of entries, with sentinels `head = n`, `tail = n + 1`.
struct List {
    next: Vec<u32>,
    prev: Vec<u32>,
}

impl List {
    fn new(n: usize) -> Self {
        let (head, tail) = (n as u32, n as u32 + 1);
        let mut next = std::vec![tail; n + 2];
        let mut prev = std::vec![head; n + 2];
        let order: Vec<u32> = core::iter::once(head)
            .chain(0..n as u32)
            .chain(core::iter::once(tail))
            .collect();
        for pair in order.windows(2) {
            next[pair[0] as usize] = pair[1];
            prev[pair[1] as usize] = pair[0];
        }
        Self { next, prev }
    }

    fn first(&self) -> u32 {
        self.next[self.next.len() - 2]
    }

    fn unlink(&mut self, x: u32) {
        let (p, n) = (self.prev[x as usize], self.next[x as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
    }

    fn relink(&mut self, x: u32) {
        let (p, n) = (self.prev[x as usize], self.next[x as usize]);
        self.next[p as usize] = x;
        self.prev[n as usize] = x;
    }
}

/// Searches one key for a linearization, exploring at most `budget` configurations.
pub(crate) fn search(prep: &Prepared, budget: Option<u64>) -> (Found, SearchStats) {
    let mut search = Search::new(prep);
    let found = search.run(budget);
    let stats = SearchStats {
        configurations: search.memo.visited,
        peak_memo: search.peak_memo,
    };
    (found, stats)
}

struct Search<'a> {
    prep: &'a Prepared,
    list: List,
    memo: Memo,
    frontier: Frontier,
    state: ValueId,
    /// The linearized operations, in order.
    stack: Vec<Frame>,
    /// The configurations on the path: one more than `stack`.
    levels: Vec<Level>,
    /// The candidates of all levels, back to back.
    candidates: Vec<u32>,
    crashed_applied: Vec<bool>,
    deepest: Deepest,
    /// The largest `p` of any configuration, and the states seen with it.
    max_p: u32,
    states_at_max_p: Vec<ValueId>,
    peak_memo: usize,
}

impl<'a> Search<'a> {
    fn new(prep: &'a Prepared) -> Self {
        Self {
            prep,
            list: List::new(prep.entries.len()),
            memo: Memo::new(),
            frontier: Frontier::default(),
            state: NULL,
            stack: Vec::new(),
            levels: Vec::new(),
            candidates: Vec::new(),
            crashed_applied: std::vec![false; prep.crashed().len()],
            deepest: Deepest::default(),
            max_p: 0,
            states_at_max_p: std::vec![NULL],
            peak_memo: 0,
        }
    }

    fn run(&mut self, budget: Option<u64>) -> Found {
        let completed = self.prep.completed;
        self.memo
            .visit(&self.frontier, self.state, completed, false);
        self.enter();
        loop {
            if self.frontier.p == completed {
                return Found::Linearizable;
            }
            if self.prep.impossible == Some(self.frontier.p) {
                // The first pending return is impossible in every state: so is every
                // continuation of every configuration. This one explains it as well
                // as any.
                self.note_deepest(true);
                return self.violation();
            }
            if budget.is_some_and(|b| self.memo.visited > b) {
                return Found::BudgetExhausted;
            }
            let Some(level) = self.levels.last_mut() else {
                return self.violation();
            };
            if level.tried < level.len {
                let op = self.candidates[(level.from + level.tried) as usize];
                level.tried += 1;
                if self.try_linearize(op) {
                    self.enter();
                }
            } else {
                self.backtrack();
            }
        }
    }

    /// Computes the candidates of the configuration just reached and pushes its level.
    fn enter(&mut self) {
        let from = self.candidates.len();
        if self.frontier.p == self.prep.completed {
            // Done: the search loop stops before looking at this level.
            return self.push_level(from);
        }
        let mut e = self.list.first();
        // While some completed operation is pending its return entry is listed, so
        // the walk meets a return before the tail sentinel.
        let mut limit = u64::MAX;
        while let Some(entry) = self.prep.entries.get(e as usize) {
            if !entry.is_call {
                limit = entry.time;
                break;
            }
            let o = self.prep.ops[entry.op as usize];
            if is_pure(o.kind, o.outcome) && step(o.kind, o.outcome, o.value, self.state).is_some()
            {
                // A free candidate: the only one this configuration needs to try.
                self.candidates.truncate(from);
                self.candidates.push(entry.op);
                return self.push_level(from);
            }
            self.candidates.push(entry.op);
            e = self.list.next[e as usize];
        }
        self.order_candidates(from);
        let completed = self.prep.completed;
        let crashed = self.prep.crashed();
        let called = crashed.partition_point(|o| o.start <= limit);
        for i in 0..called {
            if !self.crashed_applied[i] {
                self.candidates.push(completed + i as u32);
            }
        }
        self.push_level(from);
    }

    /// Orders the completed candidates from `from` on: first those after which `p`
    /// (the first to return, which must be linearized before anything called after
    /// that) is possible, `p` itself first; then the others; each group by return.
    fn order_candidates(&mut self, from: usize) {
        let prep = self.prep;
        let p = prep.ops[self.frontier.p as usize];
        let state = self.state;
        let enables_p = |id: u32| {
            let o = prep.ops[id as usize];
            step(o.kind, o.outcome, o.value, state)
                .and_then(|next| step(p.kind, p.outcome, p.value, next))
                .is_some()
        };
        self.candidates[from..].sort_unstable_by_key(|&id| (!enables_p(id), id));
    }

    fn push_level(&mut self, from: usize) {
        self.levels.push(Level {
            from: from as u32,
            len: (self.candidates.len() - from) as u32,
            tried: 0,
        });
    }

    fn violation(&mut self) -> Found {
        let mut deepest = core::mem::take(&mut self.deepest);
        if deepest.frontier.p == self.max_p {
            deepest.states = core::mem::take(&mut self.states_at_max_p);
        }
        Found::Violation(deepest)
    }

    /// Linearizes `op` next if the model allows it and the resulting configuration is
    /// new; returns whether it did.
    fn try_linearize(&mut self, op: u32) -> bool {
        let o = self.prep.ops[op as usize];
        let Some(next_state) = step(o.kind, o.outcome, o.value, self.state) else {
            return false;
        };
        let completed = self.prep.completed;
        if op >= completed && next_state == self.state {
            // Applying a crashed operation that changes nothing is dominated by not
            // applying it (yet). (A completed one of unknown outcome must take effect.)
            return false;
        }
        let undo = self.frontier.add(op, completed);
        let at_cut = self.prep.is_cut[self.frontier.p as usize];
        if !self
            .memo
            .visit(&self.frontier, next_state, completed, at_cut)
        {
            self.frontier.undo(op, undo);
            return false;
        }
        self.peak_memo = self.peak_memo.max(self.memo.len());
        self.stack.push(Frame {
            op,
            prev_state: self.state,
            undo,
        });
        self.state = next_state;
        if op < completed {
            let call = self.prep.call_entry[op as usize];
            self.list.unlink(call);
            self.list.unlink(self.prep.entries[call as usize].partner);
        } else {
            self.crashed_applied[(op - completed) as usize] = true;
        }
        self.note_progress();
        true
    }

    /// Remembers what a failure report needs about the configuration just reached.
    fn note_progress(&mut self) {
        let p = self.frontier.p;
        if p > self.max_p {
            self.max_p = p;
            self.states_at_max_p.clear();
        }
        if p == self.max_p
            && self.states_at_max_p.len() < STATES
            && !self.states_at_max_p.contains(&self.state)
        {
            self.states_at_max_p.push(self.state);
        }
        self.note_deepest(false);
    }

    /// Records the current configuration as the deepest if it is (or if `force`).
    fn note_deepest(&mut self, force: bool) {
        let depth = self.frontier.depth(self.prep.completed);
        if force || depth > self.deepest.depth {
            let from = self.stack.len().saturating_sub(TAIL);
            self.deepest = Deepest {
                depth,
                frontier: self.frontier.clone(),
                state: self.state,
                tail: self.stack[from..].iter().map(|f| f.op).collect(),
                states: Vec::new(),
            };
        }
    }

    /// Leaves the current configuration, all of whose candidates failed: drops its
    /// level and undoes the linearization that led to it.
    fn backtrack(&mut self) {
        if let Some(level) = self.levels.pop() {
            self.candidates.truncate(level.from as usize);
        }
        let Some(frame) = self.stack.pop() else {
            return;
        };
        self.state = frame.prev_state;
        self.frontier.undo(frame.op, frame.undo);
        let completed = self.prep.completed;
        if frame.op < completed {
            let call = self.prep.call_entry[frame.op as usize];
            self.list.relink(self.prep.entries[call as usize].partner);
            self.list.relink(call);
        } else {
            self.crashed_applied[(frame.op - completed) as usize] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_links_entries_between_sentinels() {
        for n in [0usize, 1, 5] {
            let mut list = List::new(n);
            let walk = |list: &List| {
                let mut seen = Vec::new();
                let mut e = list.first();
                while e as usize != n + 1 {
                    seen.push(e);
                    e = list.next[e as usize];
                }
                seen
            };
            assert_eq!(walk(&list), (0..n as u32).collect::<Vec<_>>());
            if n == 5 {
                list.unlink(1);
                list.unlink(3);
                assert_eq!(walk(&list), [0, 2, 4]);
                list.relink(3);
                list.relink(1);
                assert_eq!(walk(&list), [0, 1, 2, 3, 4]);
                list.unlink(0);
                list.unlink(4);
                assert_eq!(walk(&list), [1, 2, 3]);
                list.relink(4);
                list.relink(0);
                assert_eq!(walk(&list), [0, 1, 2, 3, 4]);
            }
        }
    }
}
