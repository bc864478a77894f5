//! Turning one key's operations into the search's input: ops indexed by return order,
//! the time-ordered list of call and return entries, and the quiescent cuts.
//!
//! * Completed operations get ids `0..completed` in order of their return (ties by
//!   call, then line). With this numbering every set of operations the search can have
//!   linearized is "a prefix of ids plus a few more" (see `search`), which is what
//!   makes its memo keys small.
//! * Crashed operations that may change the state get ids `completed..` in call order.
//!   Crashed reads and gets are dropped: they observed nothing and change nothing.
//!   So are crashed writes and updates of a value that no completed read or get
//!   returns: in any linearization that applies one, removing it changes only a value
//!   nobody observes (an update does not change whether the key is present, a register
//!   has no such notion). Crashed inserts and deletes stay: they can make a key present
//!   or absent, which failed or successful updates and deletes observe.
//! * Entries are the calls and returns of completed operations sorted by time, calls
//!   before returns at equal times: two operations whose intervals merely touch are
//!   treated as concurrent, so clock granularity can never cause a false alarm.
//! * Cut `c` (for `0 < c < completed`) is quiescent when every operation with id `< c`
//!   returned strictly before every completed operation with id `>= c` was called.
//! * The first completed operation that is impossible in every state the key can
//!   reach (a read of a value nothing writes, a write reporting failure, a successful
//!   update of a key never inserted) dooms the search: once it is the first pending
//!   return, the search stops instead of exhausting every configuration before it.

use std::collections::HashSet;
use std::vec::Vec;

use super::history::KeyLog;
use super::model::{NULL, Outcome, ValueId, step};
use super::op::{Model, OpKind};

/// One operation as the search sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchOp {
    pub(crate) kind: OpKind,
    pub(crate) outcome: Outcome,
    pub(crate) value: ValueId,
    pub(crate) start: u64,
    /// `u64::MAX` for crashed operations.
    pub(crate) end: u64,
    /// Index of the operation in its [`KeyLog`].
    pub(crate) src: u32,
}

/// A call or a return of a completed operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub(crate) op: u32,
    pub(crate) time: u64,
    /// The call's return entry, or the return's call entry.
    pub(crate) partner: u32,
    pub(crate) is_call: bool,
}

/// One key, ready to search.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// Completed operations by return order, then crashed ones by call order.
    pub(crate) ops: Vec<SearchOp>,
    /// How many of `ops` completed.
    pub(crate) completed: u32,
    /// Call and return entries of the completed operations, in time order.
    pub(crate) entries: Vec<Entry>,
    /// The index in `entries` of each completed operation's call.
    pub(crate) call_entry: Vec<u32>,
    /// `is_cut[c]`: whether `c` is a quiescent cut (length `completed + 1`).
    pub(crate) is_cut: Vec<bool>,
    /// The number of quiescent cuts.
    pub(crate) cuts: usize,
    /// The first completed operation possible in no reachable state, if any.
    pub(crate) impossible: Option<u32>,
}

impl Prepared {
    pub(crate) fn new(log: &KeyLog) -> Self {
        let observed: HashSet<ValueId> = log
            .ops
            .iter()
            .filter(|o| o.kind.is_observer() && o.end.is_some())
            .map(|o| o.value)
            .collect();
        let mut completed = Vec::new();
        let mut crashed = Vec::new();
        for (src, op) in log.ops.iter().enumerate() {
            let search_op = SearchOp {
                kind: op.kind,
                outcome: op.outcome(),
                value: op.value,
                start: op.start,
                end: op.end.unwrap_or(u64::MAX),
                // The history caps a key's operations below u32::MAX.
                src: src as u32,
            };
            match op.end {
                Some(_) => completed.push(search_op),
                None if op.kind.is_observer() => {}
                None if matches!(op.kind, OpKind::Write | OpKind::Update)
                    && !observed.contains(&op.value) => {}
                None => crashed.push(search_op),
            }
        }
        completed.sort_unstable_by_key(|o| (o.end, o.start, o.src));
        crashed.sort_unstable_by_key(|o| (o.start, o.src));
        let n = completed.len();

        let mut is_cut = std::vec![false; n + 1];
        let mut min_start = u64::MAX;
        for c in (1..n).rev() {
            min_start = min_start.min(completed[c].start);
            is_cut[c] = completed[c - 1].end < min_start;
        }
        let cuts = is_cut.iter().filter(|&&c| c).count();

        // (time, is_return, op): calls sort before returns at equal times.
        let mut events: Vec<(u64, bool, u32)> = Vec::with_capacity(2 * n);
        for (id, op) in completed.iter().enumerate() {
            events.push((op.start, false, id as u32));
            events.push((op.end, true, id as u32));
        }
        events.sort_unstable();
        let mut call_at = std::vec![0u32; n];
        let mut return_at = std::vec![0u32; n];
        for (pos, &(_, is_return, op)) in events.iter().enumerate() {
            if is_return {
                return_at[op as usize] = pos as u32;
            } else {
                call_at[op as usize] = pos as u32;
            }
        }
        let entries = events
            .iter()
            .map(|&(time, is_return, op)| Entry {
                op,
                time,
                partner: if is_return {
                    call_at[op as usize]
                } else {
                    return_at[op as usize]
                },
                is_call: !is_return,
            })
            .collect();

        let impossible = first_impossible(log.model, &completed, &crashed);
        let completed_count = n as u32;
        completed.extend(crashed);
        Self {
            ops: completed,
            completed: completed_count,
            entries,
            call_entry: call_at,
            is_cut,
            cuts,
            impossible,
        }
    }

    /// The crashed operations that may change the state, in call order.
    pub(crate) fn crashed(&self) -> &[SearchOp] {
        &self.ops[self.completed as usize..]
    }
}

/// The first of `completed` (in id order) that no state the key can reach allows.
///
/// The reachable states are among `null` and the values written; a key-value entry
/// that is never inserted (not even by a crashed insert) can only be absent. A read
/// or get is possible only in the state it returns; whether any other operation is
/// possible depends only on whether the key is present.
fn first_impossible(model: Model, completed: &[SearchOp], crashed: &[SearchOp]) -> Option<u32> {
    let all = || completed.iter().chain(crashed);
    let present_ever = model == Model::Register || all().any(|o| o.kind == OpKind::Insert);
    let written: HashSet<ValueId> = all()
        .filter(|o| present_ever && o.kind.writes_value())
        .map(|o| o.value)
        .collect();
    let present = written.iter().next().copied();
    let possible = |o: &SearchOp| {
        if o.kind.is_observer() {
            (o.value == NULL || written.contains(&o.value))
                && step(o.kind, o.outcome, o.value, o.value).is_some()
        } else {
            core::iter::once(NULL)
                .chain(present)
                .any(|s| step(o.kind, o.outcome, o.value, s).is_some())
        }
    };
    completed
        .iter()
        .position(|o| !possible(o))
        .map(|id| id as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::StoredOp;
    use crate::op::Model;
    use std::sync::Arc;

    fn op(kind: OpKind, start: u64, end: Option<u64>) -> StoredOp {
        StoredOp {
            client: 0,
            start,
            end,
            line: 0,
            value: 1,
            kind,
            ok: Some(true),
        }
    }

    fn log(ops: Vec<StoredOp>) -> KeyLog {
        KeyLog {
            name: Arc::from("k"),
            model: Model::Register,
            ops,
        }
    }

    #[test]
    fn orders_by_return_and_drops_crashed_reads() {
        let p = Prepared::new(&log(std::vec![
            op(OpKind::Write, 0, Some(10)),
            op(OpKind::Read, 1, Some(5)),
            op(OpKind::Write, 2, None),
            op(OpKind::Read, 3, None),
        ]));
        assert_eq!(p.completed, 2);
        let srcs: Vec<u32> = p.ops.iter().map(|o| o.src).collect();
        assert_eq!(srcs, [1, 0, 2]);
        assert_eq!(p.crashed().len(), 1);
        // Entries: call 0 (t=0), call 1 (t=1), return 1 (t=5), return 0 (t=10).
        let shape: Vec<(u32, bool)> = p.entries.iter().map(|e| (e.op, e.is_call)).collect();
        assert_eq!(shape, [(1, true), (0, true), (0, false), (1, false)]);
        for (i, e) in p.entries.iter().enumerate() {
            assert_eq!(p.entries[e.partner as usize].partner as usize, i);
        }
    }

    #[test]
    fn drops_crashed_writes_of_values_nobody_reads() {
        let unread = StoredOp {
            value: 2,
            ..op(OpKind::Write, 2, None)
        };
        let insert = StoredOp {
            value: 2,
            ..op(OpKind::Insert, 2, None)
        };
        let p = Prepared::new(&log(std::vec![
            op(OpKind::Read, 0, Some(1)),
            unread,
            insert
        ]));
        let kinds: Vec<OpKind> = p.crashed().iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [OpKind::Insert]);
    }

    #[test]
    fn finds_the_first_operation_impossible_in_every_state() {
        let read = |value, start, end| StoredOp {
            value,
            ..op(OpKind::Read, start, Some(end))
        };
        let p = Prepared::new(&log(std::vec![
            op(OpKind::Write, 0, Some(1)),
            read(1, 2, 3),
            read(NULL, 4, 5),
            read(7, 6, 9),
            read(8, 6, 8),
        ]));
        assert_eq!(p.impossible, Some(3), "the read of 8 returns first");
        let update = StoredOp {
            kind: OpKind::Update,
            ..op(OpKind::Update, 0, Some(1))
        };
        let mut kv = log(std::vec![update]);
        kv.model = Model::KeyValue;
        assert_eq!(Prepared::new(&kv).impossible, Some(0), "never inserted");
        kv.ops.push(StoredOp {
            kind: OpKind::Insert,
            ..op(OpKind::Insert, 5, None)
        });
        assert_eq!(
            Prepared::new(&kv).impossible,
            None,
            "a crashed insert may have run"
        );
    }

    #[test]
    fn finds_quiescent_cuts_ignoring_crashed_operations() {
        let p = Prepared::new(&log(std::vec![
            op(OpKind::Write, 0, Some(10)),
            op(OpKind::Read, 5, Some(12)),
            // Quiescent between 12 and 13, although the crashed write spans it.
            op(OpKind::Write, 1, None),
            op(OpKind::Read, 13, Some(20)),
            // Touching intervals are concurrent: no cut at 20.
            op(OpKind::Read, 20, Some(30)),
        ]));
        assert_eq!(p.is_cut, [false, false, true, false, false]);
        assert_eq!(p.cuts, 1);
    }
}
