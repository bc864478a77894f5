//! The tests' one assertion of linearizability: every test that records a history
//! (simulations, multi-process runs, baselines, benchmarks) checks it here, so that a
//! failure always reads the same way: the checker's whole [`Report`], and where the
//! history was kept for `swarm check` and a closer look.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::{History, Report, check};

/// Checks `history` and returns the checker's report; panics with the report if the
/// history is not linearizable.
#[track_caller]
pub fn assert_linearizable(history: &History) -> Report {
    assert_linearizable_keeping(history, "history", None)
}

/// [`assert_linearizable`], naming the history `what` in the panic message (a test, a
/// seed and how to replay it), and, if `keep` is given, first writing the history
/// there as JSON Lines.
#[track_caller]
pub fn assert_linearizable_keeping(history: &History, what: &str, keep: Option<&Path>) -> Report {
    let report = check(history);
    if report.is_linearizable() {
        return report;
    }
    let kept = keep.map_or_else(String::new, |path| {
        File::create(path)
            .and_then(|file| history.write_jsonl(BufWriter::new(file)))
            .map_or_else(
                |e| format!("\nhistory: could not save it to {}: {e}", path.display()),
                |()| format!("\nhistory saved to {}", path.display()),
            )
    });
    panic!("{what}: not linearizable:\n{report}{kept}");
}
