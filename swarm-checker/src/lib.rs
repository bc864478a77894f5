//! # swarm-checker
//!
//! A linearizability checker for recorded histories.
//!
//! SWARM's claim is that its registers, and SWARM-KV's keys, are **linearizable**
//! (paper §3, §5): every operation appears to take effect atomically at one instant
//! between its call and its return. This crate checks that claim on histories
//! recorded by simulations (`swarm-sim`), multi-process runs and benchmarks
//! (`swarm-kv`'s `swarm check`). It is independent of the protocol: it knows only
//! operations on keys, so it lives apart from the `no_std` core (`swarm-core`).
//!
//! ```
//! use swarm_checker::{History, check};
//!
//! let history = History::from_jsonl(&br#"
//! {"client": 1, "op": "write", "key": "k", "value": "a", "ok": true, "start": 0, "end": 10}
//! {"client": 2, "op": "read", "key": "k", "value": "a", "ok": true, "start": 5, "end": 8}
//! {"client": 2, "op": "read", "key": "k", "value": null, "ok": true, "start": 12, "end": 15}
//! "#[..])?;
//! let report = check(&history);
//! assert!(!report.is_linearizable()); // the second read is stale: the write returned
//! # Ok::<(), swarm_checker::ParseError>(())
//! ```
//!
//! # Histories and models
//!
//! A history is a set of operations `(client, op, key, value, ok, start, end)`, read
//! from JSON Lines ([`History::from_jsonl`]) or built in process ([`History::push`],
//! [`Recorder`]). `end` is absent when the client crashed: such an operation may or may
//! not have taken effect, and if it did, at any instant after its call. Each key is one
//! object: a register (`read`/`write`, initially `null`) or a SWARM-KV entry
//! (`get`/`insert`/`update`/`delete`, SWARM-KV §5.3, initially absent); the exact
//! sequential semantics are in `model.rs`.
//!
//! A history is linearizable when its operations (the crashed ones optionally) can be
//! put in one sequence that (1) respects real time: if `a` returned before `b` was
//! called, `a` comes first; and (2) is legal: replaying the sequence on the sequential
//! object gives exactly the recorded results. Intervals that merely touch
//! (`a.end == b.start`) count as concurrent, so coarse clocks cannot cause false alarms.
//!
//! # P-compositionality: one key at a time
//!
//! Linearizability is local (Herlihy & Wing 1990): a history is linearizable iff each
//! object's sub-history is. Horn & Kroening (2015) call the checker-side use of this
//! *P-compositionality*: the history is partitioned by key and each key is searched
//! alone, on all cores ([`check_with`], biggest keys first). A search is exponential in
//! the worst case, so cutting a history of a million operations into 100 000 small
//! problems is the single most important optimisation.
//!
//! # Wing & Gong's search
//!
//! Wing & Gong (1993) search depth-first for the sequence: at each step, any operation
//! not yet linearized and called before the earliest pending return may take effect
//! next (it is *minimal* in real-time order); the search tries each one whose recorded
//! result matches the current state, applies it, and recurses; when none fits it
//! backtracks. The implementation follows Lowe's formulation, also used by porcupine:
//! calls and returns form a doubly linked list in time order, the candidates are the
//! calls before the first return, and linearizing an operation *lifts* its two entries
//! out of the list (and backtracking puts them back).
//!
//! Two refinements keep the branching down on highly concurrent keys (`search.rs`):
//!
//! * **Free operations.** A candidate that is possible in the current state and of a
//!   kind that never changes the state (a read or get of the current value, a failed
//!   update or delete of an absent key) is linearized at once, without trying the
//!   alternatives: in any valid continuation it could be moved to the front (real time
//!   allows it, being a candidate; it changed nothing where it was; it is possible
//!   here). This partial-order reduction removes the branching over reads, half of a
//!   typical workload. (A write of the current value does not qualify: placed later,
//!   it may restore that value after another write.)
//! * **Just-in-time order.** The other candidates are tried in an order that follows
//!   how operations must take effect, in the spirit of Lowe's just-in-time
//!   linearization: first the operation that returns earliest (it must be linearized
//!   before anything called after its return), or the candidates after which it
//!   becomes possible (the write a stuck read returns); then the others by return
//!   time; crashed operations last. Any order is complete; this one makes the first
//!   path tried usually right.
//!
//! # Lowe's memoization
//!
//! Lowe ("Testing for linearizability", 2017) observed that what the search can still
//! do depends only on the *configuration*: the set of operations linearized and the
//! resulting state. Two orders of the same concurrent writes that end in the same
//! state lead to the same subproblem; remembering the configurations already explored
//! (all of which failed, or the search would have stopped) prunes those repetitions,
//! which otherwise make the search explode on concurrent histories.
//!
//! Storing the linearized set as a bitset would cost `n` bits per configuration on a
//! key with `n` operations: tens of thousands for a Zipfian hot key. Instead, completed
//! operations are numbered by return time; if `p` is the first one not linearized,
//! every linearized operation numbered above `p` was called before `p` returned
//! (otherwise `p` would have had to come first). So a configuration is
//! `(p, state, the few linearized ids above p)`, a handful of words: one id per other
//! concurrent client, plus crashed operations already applied. States are interned
//! value ids. The memo is an exact hash set of these keys, stored back to back in one
//! arena (`memo.rs`, `keyset.rs`).
//!
//! Without cuts (below), the memo of a key hammered nonstop by many clients would
//! grow with its history; past a cap (8M configurations, a few hundred MB) the configurations
//! behind the current one are dropped, or all of them if that is not enough. That is
//! sound since the memo only prunes, and keeps memory bounded on any input.
//!
//! # Quiescent cuts
//!
//! An instant where no completed operation is pending (everything called before it
//! returned before it) is a *quiescent cut*: every linearization orders all operations
//! that returned before it ahead of all operations called after it. The search crosses
//! a cut exactly when it has linearized everything before it, and the configurations
//! found there are the *possible states at the cut*. There may be several: two
//! concurrent writes that both returned before the cut, unobserved, leave either
//! value. So the checker does not commit to the first state it finds there. Computing
//! the full set of possible states segment by segment would, however, mean exploring
//! every order of every segment (2^k configurations for k concurrent writers), while a
//! depth-first search usually needs one. So the cuts are used lazily: configurations
//! at a cut are memoized for the whole search (each possible state at a cut is
//! explored at most once, however the search arrives there), and when the search
//! crosses a cut, the memo entries of the segment behind it are dropped. That keeps
//! memory proportional to a segment, not to the key's history, and is sound because
//! the memo only prunes: if the search later backtracks across the cut, it may
//! re-explore some of that segment, at most once per configuration at the cut.
//!
//! # Crashed operations
//!
//! A crashed operation has no return, so it never stops the history from being
//! quiescent (cuts are defined by completed operations only) and it stays a candidate
//! from its call to the end of the history: it may take effect at any later point, or
//! never. The search ends successfully once every *completed* operation is linearized;
//! crashed operations still unapplied then never took effect. Which crashed operations
//! were applied is part of the configuration (their ids sort after all completed ones,
//! in the "few ids above p"), so the possible states at a cut carry them along: a
//! crashed write applied before a cut is not available after it, and one not applied
//! still is. Applying one is only tried after the completed candidates, only when it
//! changes the state (otherwise not applying it is as good), and a configuration that
//! differs from an explored one only by one more applied crashed operation is pruned
//! (the explored one could do all it can). A crashed operation's outcome is unknown,
//! so when applied it does what the state dictates (an update of an absent key fails).
//!
//! Some crashed operations are dropped before the search, because no linearization
//! needs them: crashed reads and gets (they observed nothing and changed nothing),
//! and crashed writes and updates of a value that no completed read or get returns
//! (applying one changes only a value nobody observes; an update does not change
//! whether the key is present). Crashed inserts and deletes stay: presence is
//! observed by the outcome of updates and deletes. Simulations with crashing clients
//! produce many crashed operations, and most are such unobserved writes.
//!
//! # Refuting
//!
//! To reject a key, the search must exhaust every configuration before the point of
//! violation, which is where the exponential worst case lives (for `k` unobserved
//! concurrent writes, `k * 2^(k-1)` configurations). Quiescent cuts keep this local
//! in practice. One common case is short-circuited: an operation that no reachable
//! state allows (a read of a value no operation on the key writes, as a torn read
//! would return; a write reporting failure; a successful update of a key never
//! inserted) dooms every configuration, so the search stops the first time it is
//! the earliest pending return, with that prefix as the explanation.
//!
//! # Scale
//!
//! Measured on this project's 2-core machine, release build: a generated
//! benchmark-like history (1M operations, 100k keys chosen Zipfian 0.99, 16 clients,
//! ~1000 crashed operations; the hottest key has 78k operations and 27k quiescent
//! cuts) is read from JSON Lines in about 1.4 s and checked in 0.3 s; 2M operations
//! check in 0.7 s. Sixteen clients hammering one key without pause (no quiescent
//! point at all) cost 40-70 configurations per operation: 10k operations in about a
//! second. Refuting a stale read there costs far more (about 2000 configurations
//! per operation before the violation), hence [`CheckOptions::budget_per_key`].
//!
//! # Reports
//!
//! [`check`] returns a [`Report`]: per-key [`Verdict`]s, totals and time. When a key
//! has no linearization, its [`Violation`] shows the longest linearizable prefix the
//! search found (its last operations and the state after it), the operations that
//! could have come next, and why none fits, all as JSON Lines with a `"line"` field
//! pointing back into the input. A search can be bounded ([`CheckOptions`]); a key that
//! exhausts the bound is [`Verdict::Undecided`], never reported linearizable.

#![warn(missing_docs)]

mod assert;
mod explain;
mod history;
mod keyset;
mod memo;
mod model;
mod op;
mod parse;
mod prepare;
mod recorder;
mod report;
mod run;
mod search;

pub use assert::{assert_linearizable, assert_linearizable_keeping};
pub use explain::{Pending, Violation};
pub use history::{History, InvalidOperation};
pub use op::{Model, NumberedOp, OpKind, Operation};
pub use parse::ParseError;
pub use recorder::{OpId, RecordError, Recorder};
pub use report::{KeyReport, Report, Verdict};
pub use run::{CheckOptions, check, check_with};
