//! Explaining a failed search: the longest linearizable prefix found, and why nothing
//! can follow it.
//!
//! The search remembers the first configuration that linearized the most completed
//! operations (`d`). Every completed candidate there is impossible in that state:
//! were one possible, the search would have reached depth `d + 1` (through it, or
//! through an equal or dominating configuration seen before). So the window "last
//! operations of the prefix, the state, the pending operations and why each one does
//! not fit" is a faithful, local account of the violation.

use core::fmt;
use std::collections::HashSet;
use std::format;
use std::string::String;
use std::sync::Arc;
use std::vec::Vec;

use super::history::{History, KeyLog};
use super::model::{Mismatch, NULL, Outcome, ValueId, mismatch};
use super::op::{Model, NumberedOp};
use super::prepare::Prepared;
use super::search::Deepest;

/// An operation pending at the point where the search got stuck, and why it cannot be
/// linearized there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The operation.
    pub op: NumberedOp,
    /// Why it cannot take effect next, in words.
    pub why: String,
}

/// Why one key's sub-history is not linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The key.
    pub key: Arc<str>,
    /// The key's object model.
    pub model: Model,
    /// Completed operations on the key.
    pub completed: usize,
    /// Completed operations in the longest linearizable prefix found.
    pub linearized: usize,
    /// The value after that prefix (`None`: null, or absent).
    pub state: Option<String>,
    /// Every value possible (over all prefixes found) while `stuck` is the earliest
    /// pending return, when there are several.
    pub possible: Vec<Option<String>>,
    /// The last operations of that prefix, in linearization order.
    pub last: Vec<NumberedOp>,
    /// The pending operation that returned first: it must be linearized before anything
    /// called after it returned, but it cannot be, nor can anything concurrent with it.
    pub stuck: Pending,
    /// The other operations that could have come next (called before `stuck`
    /// returned), crashed ones included.
    pub pending: Vec<Pending>,
    /// Further observations, such as a read of a value no operation wrote.
    pub notes: Vec<String>,
}

/// Builds the explanation for `log` from the search's deepest configuration.
pub(crate) fn explain(
    history: &History,
    log: &KeyLog,
    prep: &Prepared,
    deepest: &Deepest,
) -> Violation {
    let completed = prep.completed;
    let numbered = |id: u32| history.numbered(log, &log.ops[prep.ops[id as usize].src as usize]);
    let render = |value: ValueId| render_value(history, log.model, value);
    let state = deepest.state;
    let stuck_id = deepest.frontier.p.min(completed.saturating_sub(1));
    let stuck_end = prep.ops[stuck_id as usize].end;

    let why = |id: u32| {
        let o = prep.ops[id as usize];
        let value = render(o.value);
        let now = render(state);
        match mismatch(o.kind, o.outcome, o.value, state) {
            Mismatch::Returned if state == NULL && log.model == Model::KeyValue => {
                format!("returns {value}, but the key is absent")
            }
            Mismatch::Returned => format!("returns {value}, but the value is {now}"),
            Mismatch::CannotFail => format!("reports ok: false, but a {} cannot fail", o.kind),
            Mismatch::SucceededOnAbsent => "reports ok: true, but the key is absent".into(),
            Mismatch::FailedOnPresent => format!("reports ok: false, but the key holds {now}"),
            Mismatch::None if id >= prep.completed => {
                "crashed: taking effect here or later does not help".into()
            }
            Mismatch::None if o.outcome == Outcome::Unknown => {
                "outcome unknown: taking effect here does not help".into()
            }
            Mismatch::None => "could take effect here, but nothing can follow it".into(),
        }
    };

    let mut pending: Vec<(u64, u32)> = (deepest.frontier.p..prep.ops.len() as u32)
        .filter(|&id| id != stuck_id && !deepest.frontier.contains(id))
        .filter(|&id| prep.ops[id as usize].start <= stuck_end)
        .map(|id| (prep.ops[id as usize].start, id))
        .collect();
    pending.sort_unstable();
    let pending_op = |id: u32| Pending {
        op: numbered(id),
        why: why(id),
    };

    let written: HashSet<ValueId> = log
        .ops
        .iter()
        .filter(|o| o.kind.writes_value())
        .map(|o| o.value)
        .collect();
    let notes = core::iter::once(stuck_id)
        .chain(pending.iter().map(|&(_, id)| id))
        .map(|id| prep.ops[id as usize])
        .filter(|o| o.kind.is_observer() && o.value != NULL && !written.contains(&o.value))
        .map(|o| {
            format!(
                "line {} returns {}, which no operation on this key writes",
                log.ops[o.src as usize].line,
                render(o.value)
            )
        })
        .collect();

    Violation {
        key: Arc::clone(&log.name),
        model: log.model,
        completed: completed as usize,
        linearized: deepest.depth as usize,
        state: history.value(state).map(String::from),
        possible: if deepest.states.len() > 1 {
            deepest
                .states
                .iter()
                .map(|&s| history.value(s).map(String::from))
                .collect()
        } else {
            Vec::new()
        },
        last: deepest.tail.iter().map(|&id| numbered(id)).collect(),
        stuck: pending_op(stuck_id),
        pending: pending.iter().map(|&(_, id)| pending_op(id)).collect(),
        notes,
    }
}

/// A value in words: quoted, or `null` (register) / `absent` (key-value).
fn render_value(history: &History, model: Model, value: ValueId) -> String {
    match history.value(value) {
        Some(v) => quoted(v),
        None if model == Model::Register => "null".into(),
        None => "absent".into(),
    }
}

fn quoted(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| format!("{value:?}"))
}

impl Violation {
    fn state_in_words(&self) -> String {
        match (&self.state, self.model) {
            (Some(v), _) => format!("the value is {}", quoted(v)),
            (None, Model::Register) => "the value is null".into(),
            (None, Model::KeyValue) => "the key is absent".into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {}: NOT linearizable ({}, {} completed operations)",
            quoted(&self.key),
            self.model,
            self.completed
        )?;
        writeln!(
            f,
            "  the longest linearizable prefix found has {} of them{}",
            self.linearized,
            if self.last.is_empty() {
                "."
            } else {
                ", ending with:"
            }
        )?;
        for op in &self.last {
            writeln!(f, "    {op}")?;
        }
        write!(f, "  after it {}", self.state_in_words())?;
        if !self.possible.is_empty() {
            let values: Vec<String> = self
                .possible
                .iter()
                .map(|v| match (v, self.model) {
                    (Some(v), _) => quoted(v),
                    (None, Model::Register) => "null".into(),
                    (None, Model::KeyValue) => "absent".into(),
                })
                .collect();
            write!(
                f,
                "; the prefixes found up to this point can leave any of {}",
                values.join(", ")
            )?;
        }
        writeln!(f, ".")?;
        writeln!(
            f,
            "  next must come line {} (the earliest to return of the operations left) or an operation called before it returned:",
            self.stuck.op.line
        )?;
        writeln!(f, "    {}", self.stuck.op)?;
        for p in &self.pending {
            writeln!(f, "    {}", p.op)?;
        }
        writeln!(f, "  none fits:")?;
        for p in core::iter::once(&self.stuck).chain(&self.pending) {
            writeln!(f, "    line {}: {}", p.op.line, p.why)?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}
