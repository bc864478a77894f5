//! A history: the operations recorded by all clients, stored per key.
//!
//! Operations are partitioned by key as they arrive, since the checker handles each
//! key on its own (P-compositionality, see the crate docs). Keys and values are
//! interned so a history of millions of operations stays compact: an operation is a
//! few integers.

use std::collections::HashMap;
use std::io::{self, Write};
use std::string::{String, ToString};
use std::sync::Arc;
use std::vec::Vec;

use super::model::{NULL, Outcome, ValueId};
use super::op::{Model, NumberedOp, OpKind, Operation};

/// Why an operation cannot be added to a history.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidOperation {
    /// The operation returned before it was called.
    #[error(
        "the operation ends at {end} ns, before its start at {start} ns; record the call time as start and the return time as end"
    )]
    EndBeforeStart {
        /// The call time.
        start: u64,
        /// The return time.
        end: u64,
    },
    /// A write, insert or update without the value it writes.
    #[error("a {op} needs the string value it writes, found null")]
    MissingValue {
        /// The kind of operation.
        op: OpKind,
    },
    /// A key used with both register and key-value operations.
    #[error(
        "key {key:?} is a {model} (from line {first_line}) but this is a {op}; register and key-value operations cannot share a key"
    )]
    MixedModels {
        /// The key.
        key: String,
        /// The model the key's first operation chose.
        model: Model,
        /// Where that first operation is.
        first_line: u64,
        /// The offending operation's kind.
        op: OpKind,
    },
    /// More operations (or distinct values) than the checker's 32-bit indices hold.
    #[error(
        "the history is too large: more than {limit} operations on one key or distinct values; split it"
    )]
    TooLarge {
        /// The limit that was exceeded.
        limit: u64,
    },
}

/// The most operations on one key, or distinct values, a history may hold: the search
/// indexes operations, their call and return entries (twice as many) and values with
/// `u32`, with headroom.
const MAX_IDS: usize = (u32::MAX / 4) as usize;

/// One recorded operation, compact: its key is implied by the [`KeyLog`] holding it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredOp {
    pub(crate) client: u64,
    pub(crate) start: u64,
    /// `None` if the client crashed.
    pub(crate) end: Option<u64>,
    /// Line in the input, or 1-based push position.
    pub(crate) line: u64,
    /// Value written or returned ([`NULL`] for null).
    pub(crate) value: ValueId,
    pub(crate) kind: OpKind,
    /// `None`: unknown (crashed, or completed without knowing it).
    pub(crate) ok: Option<bool>,
}

impl StoredOp {
    /// The outcome the search must respect.
    pub(crate) fn outcome(&self) -> Outcome {
        match (self.end, self.ok) {
            (None, _) | (Some(_), None) => Outcome::Unknown,
            (Some(_), Some(true)) => Outcome::Ok,
            (Some(_), Some(false)) => Outcome::Failed,
        }
    }
}

/// All operations on one key, in the order they were added.
#[derive(Debug)]
pub(crate) struct KeyLog {
    pub(crate) name: Arc<str>,
    pub(crate) model: Model,
    pub(crate) ops: Vec<StoredOp>,
}

/// A concurrent history over many keys, ready to [`check`](super::check).
///
/// Build one from JSON Lines with [`History::from_jsonl`](History::from_jsonl), or
/// in-process with [`History::push`] (or a [`Recorder`](super::Recorder)).
#[derive(Debug, Default)]
pub struct History {
    keys: Vec<KeyLog>,
    key_ids: HashMap<Arc<str>, u32>,
    /// Interned values; value id `i + 1` is `values[i]` (id 0 is null).
    values: Vec<Arc<str>>,
    value_ids: HashMap<Arc<str>, ValueId>,
    len: usize,
    crashed: usize,
    last_line: u64,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an operation, numbered after the last one added.
    pub fn push(&mut self, op: Operation) -> Result<(), InvalidOperation> {
        let line = self.last_line + 1;
        self.push_parts(
            &op.key,
            StoredParts {
                client: op.client,
                kind: op.op,
                value: op.value.as_deref(),
                ok: op.ok,
                start: op.start,
                end: op.end,
                line,
            },
        )
    }

    /// Adds an operation given by parts (the parser's allocation-free path).
    pub(crate) fn push_parts(
        &mut self,
        key: &str,
        op: StoredParts<'_>,
    ) -> Result<(), InvalidOperation> {
        if let Some(end) = op.end
            && end < op.start
        {
            return Err(InvalidOperation::EndBeforeStart {
                start: op.start,
                end,
            });
        }
        if op.kind.writes_value() && op.value.is_none() {
            return Err(InvalidOperation::MissingValue { op: op.kind });
        }
        let model = op.kind.model();
        let key_id = match self.key_ids.get(key) {
            Some(&id) => {
                let log = &self.keys[id as usize];
                if log.model != model {
                    return Err(InvalidOperation::MixedModels {
                        key: key.to_string(),
                        model: log.model,
                        first_line: log.ops.first().map_or(0, |o| o.line),
                        op: op.kind,
                    });
                }
                if log.ops.len() >= MAX_IDS {
                    return Err(too_large());
                }
                id
            }
            None => {
                let id = u32::try_from(self.keys.len()).map_err(|_| too_large())?;
                let name: Arc<str> = Arc::from(key);
                self.key_ids.insert(Arc::clone(&name), id);
                self.keys.push(KeyLog {
                    name,
                    model,
                    ops: Vec::new(),
                });
                id
            }
        };
        // A crashed read observed nothing, and a delete carries no value.
        let keeps_value = op.kind.writes_value() || (op.kind.is_observer() && op.end.is_some());
        let value = match op.value {
            Some(v) if keeps_value => self.intern(v)?,
            _ => NULL,
        };
        self.keys[key_id as usize].ops.push(StoredOp {
            client: op.client,
            start: op.start,
            end: op.end,
            line: op.line,
            value,
            kind: op.kind,
            ok: op.ok,
        });
        self.len += 1;
        self.crashed += usize::from(op.end.is_none());
        self.last_line = self.last_line.max(op.line);
        Ok(())
    }

    fn intern(&mut self, value: &str) -> Result<ValueId, InvalidOperation> {
        if let Some(&id) = self.value_ids.get(value) {
            return Ok(id);
        }
        if self.values.len() >= MAX_IDS {
            return Err(too_large());
        }
        let value: Arc<str> = Arc::from(value);
        self.values.push(Arc::clone(&value));
        let id = self.values.len() as ValueId;
        self.value_ids.insert(value, id);
        Ok(id)
    }

    /// The number of operations.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the history holds no operation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of distinct keys.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The number of crashed operations (without an end).
    pub fn crashed_count(&self) -> usize {
        self.crashed
    }

    /// The keys, in order of first appearance.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| &*k.name)
    }

    /// All operations with their line numbers, in line order.
    pub fn operations(&self) -> Vec<NumberedOp> {
        let mut all: Vec<NumberedOp> = self
            .keys
            .iter()
            .flat_map(|log| log.ops.iter().map(move |op| self.numbered(log, op)))
            .collect();
        all.sort_by_key(|n| n.line);
        all
    }

    /// Writes the history as JSON Lines (with `"line"` fields), in line order.
    pub fn write_jsonl(&self, mut out: impl Write) -> io::Result<()> {
        for op in self.operations() {
            writeln!(out, "{op}")?;
        }
        Ok(())
    }

    pub(crate) fn key_logs(&self) -> &[KeyLog] {
        &self.keys
    }

    /// The string of a value id, `None` for null.
    pub(crate) fn value(&self, id: ValueId) -> Option<&str> {
        match id {
            NULL => None,
            id => self.values.get(id as usize - 1).map(|v| &**v),
        }
    }

    /// Rebuilds the public form of a stored operation.
    pub(crate) fn numbered(&self, log: &KeyLog, op: &StoredOp) -> NumberedOp {
        NumberedOp {
            line: op.line,
            op: Operation {
                client: op.client,
                op: op.kind,
                key: log.name.to_string(),
                value: self.value(op.value).map(String::from),
                ok: op.ok,
                start: op.start,
                end: op.end,
            },
        }
    }
}

fn too_large() -> InvalidOperation {
    InvalidOperation::TooLarge {
        limit: MAX_IDS as u64,
    }
}

/// An operation by parts, borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredParts<'a> {
    pub(crate) client: u64,
    pub(crate) kind: OpKind,
    pub(crate) value: Option<&'a str>,
    pub(crate) ok: Option<bool>,
    pub(crate) start: u64,
    pub(crate) end: Option<u64>,
    pub(crate) line: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, value: &str, start: u64, end: u64) -> Operation {
        Operation::completed(1, OpKind::Write, key, Some(value), true, start, end)
    }

    #[test]
    fn operations_are_partitioned_by_key_and_values_interned() {
        let mut h = History::new();
        h.push(write("a", "x", 0, 1)).unwrap();
        h.push(write("b", "x", 2, 3)).unwrap();
        h.push(Operation::completed(
            2,
            OpKind::Read,
            "a",
            Some("x"),
            true,
            4,
            5,
        ))
        .unwrap();
        h.push(Operation::crashed(3, OpKind::Write, "a", Some("y"), 6))
            .unwrap();
        assert_eq!((h.len(), h.key_count(), h.crashed_count()), (4, 2, 1));
        assert_eq!(h.values.len(), 2);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["a", "b"]);
        let lines: Vec<u64> = h.operations().iter().map(|o| o.line).collect();
        assert_eq!(lines, [1, 2, 3, 4]);
        assert_eq!(
            h.operations()[3].op,
            Operation::crashed(3, OpKind::Write, "a", Some("y"), 6)
        );
    }

    #[test]
    fn invalid_operations_are_refused() {
        let mut h = History::new();
        assert_eq!(
            h.push(write("a", "x", 5, 4)),
            Err(InvalidOperation::EndBeforeStart { start: 5, end: 4 })
        );
        let no_value = Operation::completed(1, OpKind::Update, "a", None, true, 0, 1);
        assert_eq!(
            h.push(no_value),
            Err(InvalidOperation::MissingValue { op: OpKind::Update })
        );
        h.push(write("a", "x", 0, 1)).unwrap();
        let get = Operation::completed(1, OpKind::Get, "a", None, true, 0, 1);
        let err = h.push(get).unwrap_err();
        assert!(matches!(
            err,
            InvalidOperation::MixedModels {
                model: Model::Register,
                first_line: 1,
                ..
            }
        ));
        assert!(err.to_string().contains("cannot share a key"), "{err}");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn values_of_deletes_and_crashed_reads_are_dropped() {
        let mut h = History::new();
        h.push(Operation::completed(
            1,
            OpKind::Delete,
            "k",
            Some("junk"),
            false,
            0,
            1,
        ))
        .unwrap();
        h.push(Operation::crashed(1, OpKind::Get, "k", Some("junk"), 2))
            .unwrap();
        assert!(h.values.is_empty());
    }
}
