//! The history of a run, for the linearizability checker (`swarm check`,
//! [`swarm_checker`]).
//!
//! Every operation of every phase is recorded, the load included, so the history
//! starts from an empty store, as the checker's key-value model assumes. One JSON
//! Lines record per operation, in the checker's own format
//! ([`Operation::to_json`]): `client`, `op` (`get`, `insert`, `update`), string `key`
//! and `value` (`null` for a get that found nothing), `ok` (`false` for an update of
//! an absent key), `start` and `end` in ns since one `Instant` shared by all threads.
//! An operation that failed with an error may or may not have taken effect: it is
//! recorded without an end (`"end": null`), as the checker expects.
//!
//! Each client thread writes its own part file, after taking the operation's end
//! time, so recording adds nothing to a measured latency and threads share no lock;
//! the parts are concatenated when the run ends (the checker does not need the lines
//! in time order).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use swarm_checker::Operation;

use super::error::BenchError;

/// One client thread's part of the history.
#[derive(Debug)]
pub(crate) struct HistoryPart {
    path: PathBuf,
    out: BufWriter<File>,
    /// The first write error; later records are skipped.
    error: Option<io::Error>,
}

fn output_error(path: &Path, source: io::Error) -> BenchError {
    BenchError::Output {
        what: "history",
        path: path.to_path_buf(),
        source,
    }
}

impl HistoryPart {
    /// Creates part `index` of the history that will be written to `dest`, next to it.
    pub(crate) fn create(dest: &Path, index: usize) -> Result<Self, BenchError> {
        let mut name = dest.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".part{index}"));
        let path = dest.with_file_name(name);
        let file = File::create(&path).map_err(|e| output_error(&path, e))?;
        Ok(Self {
            path,
            out: BufWriter::with_capacity(1 << 16, file),
            error: None,
        })
    }

    /// Appends one operation.
    pub(crate) fn record(&mut self, op: &Operation) {
        if self.error.is_none() {
            let line = op.to_json(None);
            if let Err(e) = self
                .out
                .write_all(line.as_bytes())
                .and_then(|()| self.out.write_all(b"\n"))
            {
                self.error = Some(e);
            }
        }
    }

    /// Flushes the part; its path, or the first write error.
    pub(crate) fn finish(mut self) -> Result<PathBuf, BenchError> {
        if let Some(e) = self.error.take() {
            return Err(output_error(&self.path, e));
        }
        self.out.flush().map_err(|e| output_error(&self.path, e))?;
        Ok(self.path)
    }
}

/// Concatenates `parts` into `dest` and removes them.
pub(crate) fn merge(parts: &[PathBuf], dest: &Path) -> Result<(), BenchError> {
    let file = File::create(dest).map_err(|e| output_error(dest, e))?;
    let mut out = BufWriter::new(file);
    for part in parts {
        let mut input = File::open(part).map_err(|e| output_error(part, e))?;
        io::copy(&mut input, &mut out).map_err(|e| output_error(dest, e))?;
    }
    out.flush().map_err(|e| output_error(dest, e))?;
    for part in parts {
        // Best effort: a leftover part is only clutter next to the history.
        let _ = fs::remove_file(part);
    }
    Ok(())
}

/// Removes parts of an abandoned run.
pub(crate) fn discard(parts: Vec<HistoryPart>) {
    for part in parts {
        let path = part.path.clone();
        drop(part);
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use swarm_checker::{History, OpKind};

    use super::*;

    #[test]
    fn parts_merge_into_a_checkable_history() {
        let dir = swarm_shm::ScratchDir::new("ycsb-history-test").unwrap();
        let dest = dir.path().join("h.jsonl");
        let mut a = HistoryPart::create(&dest, 0).unwrap();
        let mut b = HistoryPart::create(&dest, 1).unwrap();
        a.record(&Operation::completed(
            0,
            OpKind::Insert,
            "k",
            Some("v1"),
            true,
            0,
            10,
        ));
        b.record(&Operation::completed(
            1,
            OpKind::Get,
            "k",
            Some("v1"),
            true,
            11,
            12,
        ));
        b.record(&Operation::crashed(1, OpKind::Update, "k", Some("v2"), 13));
        a.record(&Operation::completed(
            0,
            OpKind::Update,
            "j",
            Some("x"),
            false,
            14,
            15,
        ));
        let parts = vec![a.finish().unwrap(), b.finish().unwrap()];
        merge(&parts, &dest).unwrap();
        assert!(parts.iter().all(|p| !p.exists()));
        let history = History::from_jsonl(&fs::read(&dest).unwrap()[..]).unwrap();
        assert_eq!(history.len(), 4);
        assert_eq!(history.crashed_count(), 1);
        assert!(history.check().is_linearizable());
    }

    #[test]
    fn unwritable_destination_is_a_clear_error() {
        let err = HistoryPart::create(Path::new("/nonexistent-dir/h.jsonl"), 0).unwrap_err();
        assert!(
            err.to_string().contains("cannot write the history"),
            "{err}"
        );
    }
}
