//! The sequential specifications: how one operation changes one key's state.
//!
//! Both models share one state space: [`NULL`] (a register never written, an absent
//! key-value entry) or the id of an interned value. A register is a key-value entry
//! that is never deleted, so a single step function serves both; the history rejects
//! keys that mix the two families of operations.

use super::op::OpKind;

/// A key's state, or an operation's value: `NULL` or a value id.
pub(crate) type ValueId = u32;

/// `null`: a register's initial value, an absent key-value entry.
pub(crate) const NULL: ValueId = 0;

/// The outcome of an operation as the search sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Returned `ok: true`.
    Ok,
    /// Returned `ok: false`.
    Failed,
    /// The client crashed: when applied, the operation does whatever the state dictates.
    Unknown,
}

/// Applies `kind(value)` with `outcome` to `state`: the next state, or `None` if the
/// recorded outcome (or returned value) is impossible in `state`.
///
/// This is SWARM-KV §5.3: insert always succeeds and overwrites (an insert of a present
/// key turns into an update); update and delete fail, changing nothing, on an absent key.
/// Register writes always succeed; reads and gets return the state.
pub(crate) fn step(
    kind: OpKind,
    outcome: Outcome,
    value: ValueId,
    state: ValueId,
) -> Option<ValueId> {
    use OpKind::*;
    use Outcome::*;
    let present = state != NULL;
    match (kind, outcome) {
        (Read | Get, Ok) => (state == value).then_some(state),
        // A failed read cannot happen; a crashed one has no effect and observed nothing
        // (the search drops those before it starts).
        (Read | Get, Failed) => None,
        (Read | Get, Unknown) => Some(state),
        (Write | Insert, Ok | Unknown) => Some(value),
        (Write | Insert, Failed) => None,
        (Update, Ok) => present.then_some(value),
        (Update, Failed) => (!present).then_some(state),
        (Update, Unknown) => Some(if present { value } else { state }),
        (Delete, Ok) => present.then_some(NULL),
        (Delete, Failed) => (!present).then_some(NULL),
        (Delete, Unknown) => Some(NULL),
    }
}

/// Whether `kind` with `outcome` leaves the state unchanged in every state where it is
/// possible: reads and gets, failed updates and deletes. (A write of the current
/// value is a no-op here, but not wherever else it could be placed.)
pub(crate) fn is_pure(kind: OpKind, outcome: Outcome) -> bool {
    kind.is_observer()
        || (outcome == Outcome::Failed && matches!(kind, OpKind::Update | OpKind::Delete))
}

/// Why `step(kind, outcome, value, state)` is `None`, for explanations. The caller
/// renders `value` and `state` itself; this gives the shape of the sentence.
pub(crate) fn mismatch(kind: OpKind, outcome: Outcome, value: ValueId, state: ValueId) -> Mismatch {
    use OpKind::*;
    match (kind, outcome) {
        (Read | Get, Outcome::Ok) if value != state => Mismatch::Returned,
        (Read | Get | Write | Insert, Outcome::Failed) => Mismatch::CannotFail,
        (Update | Delete, Outcome::Ok) if state == NULL => Mismatch::SucceededOnAbsent,
        (Update | Delete, Outcome::Failed) if state != NULL => Mismatch::FailedOnPresent,
        _ => Mismatch::None,
    }
}

/// The reason an operation cannot be applied to a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// It can be applied.
    None,
    /// A read or get returned something other than the state.
    Returned,
    /// It reports `ok: false` but this kind of operation always succeeds.
    CannotFail,
    /// An update or delete succeeded although the key is absent.
    SucceededOnAbsent,
    /// An update or delete failed although the key is present.
    FailedOnPresent,
}

#[cfg(test)]
mod tests {
    use super::OpKind::*;
    use super::Outcome::*;
    use super::*;

    const A: ValueId = 1;
    const B: ValueId = 2;

    #[test]
    fn register_semantics() {
        assert_eq!(step(Read, Ok, NULL, NULL), Some(NULL));
        assert_eq!(step(Read, Ok, A, NULL), None);
        assert_eq!(step(Read, Ok, A, A), Some(A));
        assert_eq!(step(Read, Failed, A, A), None);
        assert_eq!(step(Write, Ok, B, A), Some(B));
        assert_eq!(step(Write, Unknown, B, NULL), Some(B));
        assert_eq!(step(Write, Failed, B, A), None);
    }

    #[test]
    fn key_value_semantics() {
        assert_eq!(step(Get, Ok, NULL, NULL), Some(NULL));
        assert_eq!(step(Get, Ok, A, B), None);
        assert_eq!(step(Insert, Ok, A, NULL), Some(A));
        assert_eq!(
            step(Insert, Ok, A, B),
            Some(A),
            "insert of a present key updates"
        );
        assert_eq!(step(Update, Ok, A, B), Some(A));
        assert_eq!(step(Update, Ok, A, NULL), None);
        assert_eq!(step(Update, Failed, A, NULL), Some(NULL));
        assert_eq!(step(Update, Failed, A, B), None);
        assert_eq!(step(Delete, Ok, NULL, A), Some(NULL));
        assert_eq!(step(Delete, Ok, NULL, NULL), None);
        assert_eq!(step(Delete, Failed, NULL, NULL), Some(NULL));
        assert_eq!(step(Delete, Failed, NULL, A), None);
    }

    #[test]
    fn crashed_operations_do_what_the_state_dictates() {
        assert_eq!(step(Insert, Unknown, A, B), Some(A));
        assert_eq!(step(Update, Unknown, A, B), Some(A));
        assert_eq!(step(Update, Unknown, A, NULL), Some(NULL));
        assert_eq!(step(Delete, Unknown, NULL, A), Some(NULL));
        assert_eq!(step(Delete, Unknown, NULL, NULL), Some(NULL));
    }

    #[test]
    fn pure_operations_never_change_the_state() {
        let kinds = [Read, Write, Get, Insert, Update, Delete];
        for kind in kinds {
            for outcome in [Ok, Failed] {
                let changes = [NULL, A, B].iter().any(|&state| {
                    [NULL, A].iter().any(|&value| {
                        step(kind, outcome, value, state).is_some_and(|next| next != state)
                    })
                });
                assert!(!(is_pure(kind, outcome) && changes), "{kind} {outcome:?}");
            }
        }
        assert!(
            is_pure(Read, Ok)
                && is_pure(Get, Ok)
                && is_pure(Update, Failed)
                && is_pure(Delete, Failed)
        );
        assert!(
            !is_pure(Write, Ok)
                && !is_pure(Insert, Ok)
                && !is_pure(Update, Ok)
                && !is_pure(Delete, Ok)
        );
    }

    #[test]
    fn every_impossible_step_has_a_reason() {
        let kinds = [Read, Write, Get, Insert, Update, Delete];
        for kind in kinds {
            for outcome in [Ok, Failed] {
                for value in [NULL, A] {
                    for state in [NULL, A, B] {
                        let possible = step(kind, outcome, value, state).is_some();
                        let reason = mismatch(kind, outcome, value, state);
                        assert_eq!(
                            possible,
                            reason == Mismatch::None,
                            "{kind} {outcome:?} {value} on {state}: {reason:?}"
                        );
                    }
                }
            }
        }
    }
}
