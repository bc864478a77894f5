//! Lowe's memoization: the set of configurations (linearized set, state) already seen.
//!
//! A configuration is stored as the key `[p, state, extra...]` where `p` is the
//! smallest id not linearized (all of `0..p` are) and `extra` the sorted linearized ids
//! above `p` (see [`Frontier`]); this is an exact encoding of the set, typically a few
//! words where a bitset over the key's history would take thousands.
//!
//! Configurations exactly at a quiescent cut live in their own set, kept for the whole
//! search: they are the "possible states at the cut". The others are garbage-collected
//! when the search crosses a cut: dropping a memo entry is always sound (the memo only
//! prunes), it can at worst cost re-exploring part of one segment if the search later
//! backtracks across that cut, which it does at most once per configuration at the cut.
//!
//! A history without quiescent points (clients hammering one key nonstop) never
//! crosses a cut, so the main set is also capped at [`CAP`] entries (some 40 to 80
//! bytes each, see `keyset.rs`): past it, the configurations behind the current one (smaller `p`) are
//! dropped, and if that does not free half of it (a refutation backtracking through
//! everything), the whole main set is. Memory stays bounded whatever the history; the
//! price is possible re-exploration, i.e. time, which a budget can bound.

use std::vec::Vec;

use super::keyset::KeySet;
use super::model::ValueId;

/// The set of linearized operation ids, as "everything below `p`, plus `extra`".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Frontier {
    /// The smallest id not linearized.
    pub(crate) p: u32,
    /// Linearized ids above `p`, sorted.
    pub(crate) extra: Vec<u32>,
}

/// How to undo [`Frontier::add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undo {
    /// The id went into `extra`.
    Inserted,
    /// The id was `p`; `p` then also swallowed this many ids from `extra`.
    Advanced(u32),
}

impl Frontier {
    /// Marks `id` linearized. Ids from `limit` on (crashed operations) never join
    /// the prefix: `p` stops at `limit`, which means "every completed one is linearized".
    pub(crate) fn add(&mut self, id: u32, limit: u32) -> Undo {
        if id != self.p {
            let at = self.extra.partition_point(|&x| x < id);
            self.extra.insert(at, id);
            return Undo::Inserted;
        }
        self.p += 1;
        let swallowed = self
            .extra
            .iter()
            .zip(self.p..)
            .take_while(|(x, want)| **x == *want && *want < limit)
            .count();
        self.extra.drain(..swallowed);
        self.p += swallowed as u32;
        Undo::Advanced(swallowed as u32)
    }

    pub(crate) fn undo(&mut self, id: u32, undo: Undo) {
        match undo {
            Undo::Inserted => {
                if let Ok(at) = self.extra.binary_search(&id) {
                    self.extra.remove(at);
                }
            }
            Undo::Advanced(swallowed) => {
                self.extra.splice(0..0, id + 1..=id + swallowed);
                self.p = id;
            }
        }
    }

    /// Whether `id` is linearized.
    pub(crate) fn contains(&self, id: u32) -> bool {
        id < self.p || self.extra.binary_search(&id).is_ok()
    }

    /// How many ids below `completed` are linearized.
    pub(crate) fn depth(&self, completed: u32) -> u32 {
        self.p + self.extra.partition_point(|&x| x < completed) as u32
    }
}

/// Entries the main set may hold before a cut triggers a collection.
const GC_MIN: usize = 1 << 14;

/// Entries the main set may hold, cut or no cut (some 40 to 80 bytes each).
pub(crate) const CAP: usize = 1 << 23;

/// The configurations seen so far in one key's search.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// Configurations strictly between cuts.
    seen: KeySet,
    /// Configurations exactly at a quiescent cut: kept for the whole search.
    at_cuts: KeySet,
    /// Scratch keys.
    buf: Vec<u32>,
    smaller: Vec<u32>,
    /// Collect `seen` at the next cut once it holds this many entries.
    gc_at: usize,
    /// The cap on `seen` ([`CAP`]; smaller in tests).
    cap: usize,
    /// Configurations recorded (the search's work).
    pub(crate) visited: u64,
}

impl Memo {
    pub(crate) fn new() -> Self {
        Self {
            gc_at: GC_MIN,
            cap: CAP,
            ..Self::default()
        }
    }

    /// Records a configuration; `false` if it (or one that dominates it) was seen.
    ///
    /// `crashed_from` is the first crashed-operation id. A configuration that differs
    /// from a seen one only by having applied one more crashed operation is dominated:
    /// not applying a crashed operation is always allowed, so from the smaller set the
    /// search can do everything it could from the larger one (the state being equal).
    pub(crate) fn visit(
        &mut self,
        frontier: &Frontier,
        state: ValueId,
        crashed_from: u32,
        at_cut: bool,
    ) -> bool {
        self.buf.clear();
        self.buf.push(frontier.p);
        self.buf.push(state);
        self.buf.extend_from_slice(&frontier.extra);
        let set = if at_cut {
            &mut self.at_cuts
        } else {
            &mut self.seen
        };
        if set.contains(&self.buf[..]) {
            return false;
        }
        let first_crashed = 2 + frontier.extra.partition_point(|&x| x < crashed_from);
        for skip in first_crashed..self.buf.len() {
            self.smaller.clear();
            self.smaller.extend_from_slice(&self.buf[..skip]);
            self.smaller.extend_from_slice(&self.buf[skip + 1..]);
            if set.contains(&self.smaller[..]) {
                return false;
            }
        }
        set.insert(&self.buf);
        self.visited += 1;
        let full = self.seen.len() >= self.cap;
        if (at_cut && self.seen.len() >= self.gc_at) || full {
            let p = frontier.p;
            self.seen.retain(|key| key[0] >= p);
            if full && self.seen.len() >= self.cap / 2 {
                self.seen.clear();
            }
            self.gc_at = GC_MIN.max(2 * self.seen.len());
        }
        true
    }

    /// How many configurations the memo currently holds.
    pub(crate) fn len(&self) -> usize {
        self.seen.len() + self.at_cuts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontier_add_and_undo_round_trip() {
        let mut f = Frontier::default();
        let mut log = Vec::new();
        for id in [2, 4, 0, 1, 3, 7] {
            let undo = f.add(id, 6);
            log.push((id, undo, f.clone()));
        }
        assert_eq!(
            f,
            Frontier {
                p: 5,
                extra: std::vec![7]
            }
        );
        assert!(f.contains(3) && f.contains(7) && !f.contains(5));
        assert_eq!(f.depth(6), 5);
        assert_eq!(f.depth(8), 6);
        for (id, undo, after) in log.into_iter().rev() {
            assert_eq!(f, after);
            f.undo(id, undo);
        }
        assert_eq!(f, Frontier::default());
    }

    #[test]
    fn the_prefix_stops_before_crashed_ids() {
        // Completed ids 0..2, crashed ids 2 and 3.
        let mut f = Frontier::default();
        f.add(2, 2);
        f.add(3, 2);
        f.add(0, 2);
        let undo = f.add(1, 2);
        assert_eq!(
            f,
            Frontier {
                p: 2,
                extra: std::vec![2, 3]
            }
        );
        f.undo(1, undo);
        assert_eq!(
            f,
            Frontier {
                p: 1,
                extra: std::vec![2, 3]
            }
        );
    }

    #[test]
    fn memo_dedups_and_prunes_dominated_crashed_applications() {
        let mut memo = Memo::new();
        let f = Frontier {
            p: 3,
            extra: std::vec![5],
        };
        assert!(memo.visit(&f, 1, 10, false));
        assert!(!memo.visit(&f, 1, 10, false));
        assert!(
            memo.visit(&f, 2, 10, false),
            "another state is another configuration"
        );
        // The same plus crashed op 11: dominated.
        let g = Frontier {
            p: 3,
            extra: std::vec![5, 11],
        };
        assert!(!memo.visit(&g, 1, 10, false));
        // The same plus a completed op 6: not dominated.
        let h = Frontier {
            p: 3,
            extra: std::vec![5, 6],
        };
        assert!(memo.visit(&h, 1, 10, false));
        assert_eq!(memo.visited, 3);
    }

    #[test]
    fn collection_at_a_cut_keeps_later_configurations() {
        let mut memo = Memo::new();
        memo.gc_at = 2;
        for p in [1, 2, 9] {
            assert!(memo.visit(
                &Frontier {
                    p,
                    extra: std::vec![]
                },
                0,
                100,
                false
            ));
        }
        assert!(memo.visit(
            &Frontier {
                p: 5,
                extra: std::vec![]
            },
            0,
            100,
            true
        ));
        assert_eq!(memo.len(), 2, "only p=9 and the cut configuration survive");
        assert!(!memo.visit(
            &Frontier {
                p: 9,
                extra: std::vec![]
            },
            0,
            100,
            false
        ));
        assert!(!memo.visit(
            &Frontier {
                p: 5,
                extra: std::vec![]
            },
            0,
            100,
            true
        ));
    }

    #[test]
    fn the_cap_drops_configurations_behind_then_everything() {
        let at = |p: u32| Frontier {
            p,
            extra: std::vec![],
        };
        let mut memo = Memo::new();
        memo.cap = 6;
        assert!(memo.visit(&at(8), 0, 100, false));
        for state in 0..4 {
            assert!(memo.visit(&at(1), state, 100, false));
        }
        assert!(memo.visit(&at(2), 0, 100, false));
        assert_eq!(
            memo.len(),
            2,
            "the four configurations at p=1 were behind p=2"
        );
        assert!(memo.visit(&at(1), 0, 100, false), "and are forgotten");
        for p in [9, 10, 0] {
            assert!(memo.visit(&at(p), 0, 100, false));
        }
        assert_eq!(memo.len(), 0, "nothing was behind p=0: all dropped");
    }
}
