//! Operations as they appear in a history: what was called, on which key, with which
//! value and outcome, and when it was called and returned.

use core::fmt;
use std::string::String;

use serde::{Deserialize, Serialize};

/// The kind of an operation. Register operations (`read`, `write`) and key-value
/// operations (`get`, `insert`, `update`, `delete`) may share a history but never a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Register read: returns the current value (`null` if never written).
    Read,
    /// Register write: sets the value.
    Write,
    /// Key-value get: returns the value, `null` when the key is absent.
    Get,
    /// Key-value insert: always succeeds and sets the value (an insert of a present key
    /// acts as an update, SWARM-KV §5.3.1).
    Insert,
    /// Key-value update: sets the value if the key is present (`ok: true`), otherwise
    /// fails (`ok: false`) and changes nothing (SWARM-KV §5.3.3).
    Update,
    /// Key-value delete: removes a present key (`ok: true`); fails on an absent key
    /// (`ok: false`) (SWARM-KV §5.3.2).
    Delete,
}

impl OpKind {
    /// The object model this kind of operation belongs to.
    pub const fn model(self) -> Model {
        match self {
            Self::Read | Self::Write => Model::Register,
            Self::Get | Self::Insert | Self::Update | Self::Delete => Model::KeyValue,
        }
    }

    /// Whether the operation carries the value it writes (as opposed to returning one,
    /// or carrying none, like `delete`).
    pub const fn writes_value(self) -> bool {
        matches!(self, Self::Write | Self::Insert | Self::Update)
    }

    /// Whether the operation only observes the state (`read`, `get`).
    pub const fn is_observer(self) -> bool {
        matches!(self, Self::Read | Self::Get)
    }

    /// The name used in JSON Lines histories.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Get => "get",
            Self::Insert => "insert",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The sequential object a key holds. Keys are independent objects, so a history is
/// linearizable exactly when each key's sub-history is (P-compositionality).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Model {
    /// A read/write register whose initial value is `null`.
    Register,
    /// A key-value entry, absent at first, with SWARM-KV's insert/update/delete/get.
    KeyValue,
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Register => "register",
            Self::KeyValue => "key-value",
        })
    }
}

/// One operation of a history, as recorded by a client.
///
/// `value` is the value written (`write`, `insert`, `update`) or returned (`read`,
/// `get`; `None` for `null`/absent); it is ignored for `delete`. `ok` is the outcome
/// (`true` for every operation that cannot fail), `None` when the operation returned
/// without knowing it: it took effect inside its interval, with whichever outcome the
/// state dictates (a SWARM delete that raced another delete of the same value,
/// [`Operation::completed_unknown`]). `end` is `None` when the client crashed before
/// the operation returned: the operation may or may not have taken effect, and its
/// `ok` and returned value are unknown (ignored).
///
/// An operation that may not have taken effect for another reason (a timeout, an
/// error after which it may still take effect) must be recorded as crashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client (process, thread) that issued the operation.
    pub client: u64,
    /// What was called.
    pub op: OpKind,
    /// The key (object) operated on.
    pub key: String,
    /// The value written or returned, `None` for `null`.
    pub value: Option<String>,
    /// The outcome: `None` if unknown; ignored for crashed operations.
    pub ok: Option<bool>,
    /// When the operation was called, in nanoseconds on a clock shared by all clients.
    pub start: u64,
    /// When it returned, `None` if the client crashed first.
    pub end: Option<u64>,
}

impl Operation {
    /// A completed operation.
    pub fn completed(
        client: u64,
        op: OpKind,
        key: impl Into<String>,
        value: Option<&str>,
        ok: bool,
        start: u64,
        end: u64,
    ) -> Self {
        Self {
            ok: Some(ok),
            ..Self::completed_unknown(client, op, key, value, start, end)
        }
    }

    /// A completed operation whose outcome its client cannot know: it took effect
    /// between `start` and `end` with the outcome the state dictates there (a delete
    /// that raced another delete of the same value reports neither "removed" nor
    /// "absent").
    pub fn completed_unknown(
        client: u64,
        op: OpKind,
        key: impl Into<String>,
        value: Option<&str>,
        start: u64,
        end: u64,
    ) -> Self {
        Self {
            client,
            op,
            key: key.into(),
            value: value.map(String::from),
            ok: None,
            start,
            end: Some(end),
        }
    }

    /// An operation whose client crashed after calling it: it may or may not take
    /// effect. `value` is the value it was writing (if it writes one).
    pub fn crashed(
        client: u64,
        op: OpKind,
        key: impl Into<String>,
        value: Option<&str>,
        start: u64,
    ) -> Self {
        Self {
            client,
            op,
            key: key.into(),
            value: value.map(String::from),
            ok: None,
            start,
            end: None,
        }
    }

    /// Whether the client crashed before the operation returned.
    pub fn is_crashed(&self) -> bool {
        self.end.is_none()
    }

    /// The operation as one JSON Lines record (without a trailing newline), tagged with
    /// `line` when given. Crashed operations get `"ok": null, "end": null`, completed
    /// ones of unknown outcome `"ok": null`.
    pub fn to_json(&self, line: Option<u64>) -> String {
        let record = JsonRecord {
            client: self.client,
            op: self.op,
            key: &self.key,
            value: self.value.as_deref(),
            ok: self.end.and(self.ok),
            start: self.start,
            end: self.end,
            line,
        };
        // Serializing plain integers, strings and options cannot fail.
        serde_json::to_string(&record).unwrap_or_default()
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json(None))
    }
}

/// The JSON Lines form of an operation, borrowed (for output).
#[derive(Serialize)]
struct JsonRecord<'a> {
    client: u64,
    op: OpKind,
    key: &'a str,
    value: Option<&'a str>,
    ok: Option<bool>,
    start: u64,
    end: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
}

/// An operation together with its position in the history: its line in the JSON
/// Lines input, or its 1-based position among the pushed operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumberedOp {
    /// Line (or push position) of the operation.
    pub line: u64,
    /// The operation.
    pub op: Operation,
}

impl fmt::Display for NumberedOp {
    /// One JSON Lines record with an extra `"line"` field, which parsers of this
    /// format ignore, so the output can be fed back to the checker.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.op.to_json(Some(self.line)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_of_completed_and_crashed_operations() {
        let op = Operation::completed(3, OpKind::Write, "k", Some("v"), true, 10, 20);
        assert_eq!(
            op.to_json(None),
            r#"{"client":3,"op":"write","key":"k","value":"v","ok":true,"start":10,"end":20}"#
        );
        let op = Operation::crashed(1, OpKind::Delete, "k\"", None, 5);
        assert_eq!(
            op.to_json(Some(7)),
            r#"{"client":1,"op":"delete","key":"k\"","value":null,"ok":null,"start":5,"end":null,"line":7}"#
        );
    }

    #[test]
    fn kinds_belong_to_one_model() {
        for kind in [OpKind::Read, OpKind::Write] {
            assert_eq!(kind.model(), Model::Register);
        }
        for kind in [OpKind::Get, OpKind::Insert, OpKind::Update, OpKind::Delete] {
            assert_eq!(kind.model(), Model::KeyValue);
        }
    }
}
