//! Reading histories from JSON Lines, one operation per line:
//!
//! ```text
//! {"client": 3, "op": "write", "key": "k", "value": "v", "ok": true, "start": 10, "end": 25}
//! ```
//!
//! `op` is one of `read`, `write`, `get`, `insert`, `update`, `delete`; `value` is a
//! string or `null` (a missing `value` is `null`); `end: null` (or a missing `end`)
//! marks a crashed operation, whose `ok` may be `null`. A completed operation needs
//! `ok`: `true`, `false`, or `null` for an outcome its client could not know (it took
//! effect within its interval, as the state dictates). Unknown fields are ignored and
//! blank lines skipped. Any other deviation is an error naming the line.

use std::borrow::Cow;
use std::io::{self, BufRead};
use std::string::{String, ToString};

use serde::Deserialize;

use super::history::{History, InvalidOperation, StoredParts};
use super::op::OpKind;

/// Why a JSON Lines history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Reading the input failed (including input that is not UTF-8).
    #[error("line {line}: cannot read the history: {source}")]
    Io {
        /// The line being read.
        line: u64,
        /// The underlying error.
        source: io::Error,
    },
    /// A line is not a JSON operation record of the expected shape.
    #[error(
        "line {line}, column {column}: {message}; expected an object like \
         {{\"client\": 1, \"op\": \"write\", \"key\": \"k\", \"value\": \"v\", \"ok\": true, \"start\": 10, \"end\": 20}}"
    )]
    Json {
        /// The offending line.
        line: u64,
        /// The column in that line where serde_json gave up.
        column: usize,
        /// What serde_json found wrong, without its position.
        message: String,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A completed operation without its `ok` outcome.
    #[error(
        "line {line}: a completed operation (non-null \"end\") needs \"ok\": true, false, or null for an unknown outcome"
    )]
    MissingOk {
        /// The offending line.
        line: u64,
    },
    /// The record is well-formed but not a valid operation.
    #[error("line {line}: {source}")]
    Invalid {
        /// The offending line.
        line: u64,
        /// What is wrong with it.
        source: InvalidOperation,
    },
}

impl ParseError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> u64 {
        match self {
            Self::Io { line, .. }
            | Self::Json { line, .. }
            | Self::MissingOk { line }
            | Self::Invalid { line, .. } => *line,
        }
    }
}

fn json_error(line: u64, source: serde_json::Error) -> ParseError {
    let message = source.to_string();
    // serde_json appends " at line 1 column N", relative to the one line it saw.
    let message = match message.rfind(" at line ") {
        Some(at) => message[..at].into(),
        None => message,
    };
    ParseError::Json {
        line,
        column: source.column(),
        message,
        source,
    }
}

/// One record as it appears on a line; strings are borrowed unless they hold escapes.
#[derive(Deserialize)]
struct Record<'a> {
    client: u64,
    op: OpKind,
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    value: Option<Cow<'a, str>>,
    /// Absent: `None`; `null`: `Some(None)` (an unknown outcome).
    #[serde(default, deserialize_with = "present")]
    ok: Option<Option<bool>>,
    start: u64,
    #[serde(default)]
    end: Option<u64>,
}

/// Deserializes a field that is present (possibly `null`) as `Some`, so that a
/// missing field (`None`, from `default`) and `null` differ.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

impl History {
    /// Reads a JSON Lines history. Lines are numbered from 1; blank lines are skipped.
    pub fn from_jsonl(mut reader: impl BufRead) -> Result<Self, ParseError> {
        let mut history = Self::new();
        let mut buf = String::new();
        let mut line = 0u64;
        loop {
            line += 1;
            buf.clear();
            match reader.read_line(&mut buf) {
                Ok(0) => return Ok(history),
                Ok(_) => {}
                Err(source) => return Err(ParseError::Io { line, source }),
            }
            let text = buf.trim();
            if text.is_empty() {
                continue;
            }
            let record: Record<'_> =
                serde_json::from_str(text).map_err(|source| json_error(line, source))?;
            let ok = match (record.end, record.ok) {
                (Some(_), None) => return Err(ParseError::MissingOk { line }),
                (_, ok) => ok.flatten(),
            };
            let parts = StoredParts {
                client: record.client,
                kind: record.op,
                value: record.value.as_deref(),
                ok,
                start: record.start,
                end: record.end,
                line,
            };
            history
                .push_parts(&record.key, parts)
                .map_err(|source| ParseError::Invalid { line, source })?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Operation;
    use std::string::ToString;
    use std::vec::Vec;

    #[test]
    fn parses_records_skipping_blank_lines_and_unknown_fields() {
        let text = r#"{"client": 1, "op": "write", "key": "k", "value": "v", "ok": true, "start": 1, "end": 2, "extra": [1, {"x": 2}]}

{"client": 2, "op": "read", "key": "k", "value": "v\u0021", "ok": true, "start": 3, "end": 4}
{"client": 3, "op": "delete", "key": "d", "start": 5, "end": null, "ok": null}
"#;
        let h = History::from_jsonl(text.as_bytes()).unwrap();
        let ops: Vec<_> = h.operations();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[1].line, 3);
        assert_eq!(ops[1].op.value.as_deref(), Some("v!"));
        assert_eq!(
            ops[2].op,
            Operation::crashed(3, OpKind::Delete, "d", None, 5)
        );
    }

    #[test]
    fn a_completed_operation_of_unknown_outcome_must_take_effect() {
        let text = r#"{"client": 1, "op": "insert", "key": "k", "value": "a", "ok": true, "start": 1, "end": 2}
{"client": 2, "op": "delete", "key": "k", "ok": null, "start": 3, "end": 4}
{"client": 1, "op": "get", "key": "k", "value": "a", "ok": true, "start": 5, "end": 6}
"#;
        let h = History::from_jsonl(text.as_bytes()).unwrap();
        assert_eq!(
            h.operations()[1].op,
            Operation::completed_unknown(2, OpKind::Delete, "k", None, 3, 4)
        );
        assert_eq!(
            h.operations()[1].op.to_json(None),
            r#"{"client":2,"op":"delete","key":"k","value":null,"ok":null,"start":3,"end":4}"#
        );
        // Taking effect before it returned, the delete hides the value from the get.
        assert!(!crate::check(&h).is_linearizable());
        // Had its client crashed instead, it could take effect after the get.
        let crashed = text.replace(r#""ok": null, "start": 3, "end": 4"#, r#""start": 3"#);
        assert!(crate::check(&History::from_jsonl(crashed.as_bytes()).unwrap()).is_linearizable());
        // With the get gone, the unknown delete is fine on a present or absent key.
        let last = text.lines().take(2).collect::<Vec<_>>().join("\n");
        assert!(crate::check(&History::from_jsonl(last.as_bytes()).unwrap()).is_linearizable());
        let absent = text.lines().nth(1).unwrap_or_default().to_string();
        assert!(crate::check(&History::from_jsonl(absent.as_bytes()).unwrap()).is_linearizable());
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("{\"client\": 1}\n", 1, "missing field"),
            (
                "\n{\"client\": 1, \"op\": \"frob\", \"key\": \"k\", \"start\": 1}",
                2,
                "unknown variant",
            ),
            (
                "{\"client\": -1, \"op\": \"read\", \"key\": \"k\", \"start\": 1, \"end\": 2, \"ok\": true}",
                1,
                "client",
            ),
            (
                "{\"client\": 1, \"op\": \"read\", \"key\": \"k\", \"start\": 1, \"end\": 2}",
                1,
                "needs \"ok\"",
            ),
            (
                "{\"client\": 1, \"op\": \"write\", \"key\": \"k\", \"start\": 3, \"end\": 2, \"ok\": true, \"value\": \"v\"}",
                1,
                "before its start",
            ),
            ("not json", 1, "expected an object like"),
        ];
        for (text, line, needle) in cases {
            let err = History::from_jsonl(text.as_bytes()).unwrap_err();
            assert_eq!(err.line(), line, "{text}: {err}");
            let msg = err.to_string();
            assert!(msg.starts_with(&std::format!("line {line}")), "{msg}");
            assert!(!msg.contains("at line"), "{msg}");
            assert!(msg.contains(needle), "{text}: {msg}");
        }
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let bytes: &[u8] = b"{\"client\": 1, \"op\": \"read\", \"key\": \"\xff\", \"start\": 1}\n";
        let err = History::from_jsonl(bytes).unwrap_err();
        assert!(matches!(err, ParseError::Io { line: 1, .. }), "{err}");
    }
}
