//! Recording a history in process, from a simulation or a multi-threaded test.
//!
//! A client calls [`Recorder::begin`] just before invoking an operation and
//! [`Recorder::end`] right after it returns, with times from a clock shared by all
//! clients (the simulation's virtual clock, or a monotonic clock). Operations that never
//! end, because their client crashed or was abandoned, become crashed operations.

use std::string::String;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::vec::Vec;

use super::history::{History, InvalidOperation};
use super::op::{OpKind, Operation};

/// Identifies an operation begun on a [`Recorder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(usize);

/// Misuse of a [`Recorder`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The id was not returned by this recorder's `begin`.
    #[error("operation id {0} was not begun on this recorder")]
    UnknownId(usize),
    /// The operation was already ended.
    #[error("operation id {0} was already ended; end each operation once")]
    AlreadyEnded(usize),
}

/// Collects operations as clients run them; shareable between threads.
#[derive(Debug, Default)]
pub struct Recorder {
    ops: Mutex<Vec<Operation>>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    fn ops(&self) -> MutexGuard<'_, Vec<Operation>> {
        // A client that panicked mid-record leaves the vector consistent.
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the call of an operation at `start`. `value` is the value written by a
    /// write, insert or update (`None` otherwise).
    pub fn begin(
        &self,
        client: u64,
        op: OpKind,
        key: &str,
        value: Option<&str>,
        start: u64,
    ) -> OpId {
        let mut ops = self.ops();
        ops.push(Operation::crashed(client, op, key, value, start));
        OpId(ops.len() - 1)
    }

    /// Records the return of operation `id` at `end` with outcome `ok` (a `bool`, or
    /// `None` for an outcome the client could not know, see [`Operation::ok`]). `value`
    /// is the value a read or get returned (`None` for null or absent); it is ignored
    /// for the other operations, which keep the value given to [`begin`](Self::begin).
    pub fn end(
        &self,
        id: OpId,
        ok: impl Into<Option<bool>>,
        value: Option<&str>,
        end: u64,
    ) -> Result<(), RecordError> {
        let mut ops = self.ops();
        let op = ops.get_mut(id.0).ok_or(RecordError::UnknownId(id.0))?;
        if op.end.is_some() {
            return Err(RecordError::AlreadyEnded(id.0));
        }
        op.end = Some(end);
        op.ok = ok.into();
        if op.op.is_observer() {
            op.value = value.map(String::from);
        }
        Ok(())
    }

    /// How many operations were begun.
    pub fn len(&self) -> usize {
        self.ops().len()
    }

    /// Whether no operation was begun.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The history recorded so far, operations not yet ended counting as crashed.
    pub fn history(&self) -> Result<History, InvalidOperation> {
        let mut history = History::new();
        for op in self.ops().iter() {
            history.push(op.clone())?;
        }
        Ok(history)
    }

    /// The history, operations never ended counting as crashed.
    pub fn into_history(self) -> Result<History, InvalidOperation> {
        let ops = self
            .ops
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let mut history = History::new();
        for op in ops {
            history.push(op)?;
        }
        Ok(history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_completed_and_crashed_operations() {
        let rec = Recorder::new();
        let w = rec.begin(1, OpKind::Write, "k", Some("a"), 0);
        let r = rec.begin(2, OpKind::Read, "k", None, 1);
        let crashed = rec.begin(3, OpKind::Write, "k", Some("b"), 2);
        rec.end(r, true, Some("a"), 5).unwrap();
        rec.end(w, true, Some("ignored"), 4).unwrap();
        assert_eq!(rec.end(w, true, None, 6), Err(RecordError::AlreadyEnded(0)));
        assert_eq!(
            rec.end(OpId(9), true, None, 6),
            Err(RecordError::UnknownId(9))
        );
        let _ = crashed;
        let ops = rec.into_history().unwrap().operations();
        let ops: Vec<Operation> = ops.into_iter().map(|n| n.op).collect();
        assert_eq!(
            ops,
            [
                Operation::completed(1, OpKind::Write, "k", Some("a"), true, 0, 4),
                Operation::completed(2, OpKind::Read, "k", Some("a"), true, 1, 5),
                Operation::crashed(3, OpKind::Write, "k", Some("b"), 2),
            ]
        );
    }
}
