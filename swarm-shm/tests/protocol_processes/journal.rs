//! A per-process history journal that survives `SIGKILL`.
//!
//! A client process appends one JSON Lines record (the checker's format,
//! `swarm_checker`) when it calls an operation — as a crashed operation, with
//! `"end": null` — and another when the operation returns, in its final form. Each
//! record is one `write(2)` on an unbuffered file, so whatever the process has
//! journaled is in the kernel's page cache when it is killed, and the file is never
//! more than one record behind the process.
//!
//! Reading a journal back pairs the records: a call followed by its return is the
//! returned operation; a call with no return (the process died mid-operation) stays
//! a crashed operation, which the checker may or may not take into effect. A last
//! line without its newline was being written when the process died: it is dropped,
//! which is sound either way (a lost call record belongs to an operation that was
//! not invoked yet; a lost return record leaves its call record, a crashed operation).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use swarm_checker::{History, Operation};

/// The journal file of writer `writer` in `dir`.
pub fn path(dir: &Path, writer: u32) -> PathBuf {
    dir.join(format!("journal-{writer}.jsonl"))
}

/// The writing side, in the client process.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
}

impl Journal {
    /// Creates the journal at `path` (which must not exist yet).
    pub fn create(path: PathBuf) -> io::Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(Self { file, path })
    }

    /// Appends `op` as one record with a single `write(2)`.
    pub fn record(&mut self, op: &Operation) {
        let mut line = op.to_json(None);
        line.push('\n');
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            panic!("cannot append to the journal {}: {e}", self.path.display());
        }
    }
}

/// A journal read back.
#[derive(Debug, Default)]
pub struct Entries {
    /// Every operation, in call order; unfinished ones as crashed.
    pub ops: Vec<Operation>,
    /// Operations whose call was journaled but not their return.
    pub unfinished: usize,
    /// Whether the last line was cut short (dropped).
    pub torn_tail: bool,
}

impl Entries {
    /// Operations that returned (successfully or not).
    pub fn returned(&self) -> usize {
        self.ops.len() - self.unfinished
    }
}

/// Reads the journal at `path`; see the module docs for how records pair up.
pub fn read(path: &Path) -> Result<Entries, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the journal {}: {e}", path.display()))?;
    let mut entries = Entries::default();
    let complete = match text.rfind('\n') {
        Some(last) => &text[..=last],
        None => "",
    };
    entries.torn_tail = complete.len() < text.len();
    let mut open_call = false;
    for (index, line) in complete.lines().enumerate() {
        let at = || format!("{} line {}", path.display(), index + 1);
        let op = parse_record(line).map_err(|e| format!("{}: {e}", at()))?;
        if open_call {
            let call = entries.ops.last_mut().expect("an open call is recorded");
            if !same_call(call, &op) {
                return Err(format!(
                    "{}: the return {op} does not match the open call {call}",
                    at()
                ));
            }
            *call = op;
            open_call = false;
        } else {
            if !op.is_crashed() {
                return Err(format!("{}: a return {op} without a call record", at()));
            }
            entries.ops.push(op);
            open_call = true;
        }
    }
    entries.unfinished = usize::from(open_call);
    Ok(entries)
}

/// Parses one record with the checker's own JSON Lines reader.
fn parse_record(line: &str) -> Result<Operation, String> {
    let history = History::from_jsonl(line.as_bytes()).map_err(|e| e.to_string())?;
    match history.operations().as_slice() {
        [one] => Ok(one.op.clone()),
        other => Err(format!("expected one operation, found {}", other.len())),
    }
}

/// Whether `ret` is the return record of the call record `call`.
fn same_call(call: &Operation, ret: &Operation) -> bool {
    call.client == ret.client
        && call.op == ret.op
        && call.key == ret.key
        && call.start == ret.start
        && (!call.op.writes_value() || call.value == ret.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarm_checker::OpKind;

    fn write_journal(lines: &str) -> (swarm_shm::ScratchDir, PathBuf) {
        let dir = swarm_shm::ScratchDir::new("swarm-shm-journal-test").expect("scratch");
        let path = path(dir.path(), 1);
        std::fs::write(&path, lines).expect("write the journal");
        (dir, path)
    }

    #[test]
    fn pairs_calls_with_returns_and_keeps_the_unfinished_call() {
        let call = Operation::crashed(1, OpKind::Write, "r0", Some("w1-0"), 10);
        let mut done = call.clone();
        done.end = Some(20);
        done.ok = Some(true);
        let unfinished = Operation::crashed(1, OpKind::Read, "r1", None, 30);
        let text = format!("{call}\n{done}\n{unfinished}\n{{\"client\": 1, \"op\"");
        let (_dir, path) = write_journal(&text);
        let entries = read(&path).expect("a valid journal");
        assert_eq!(entries.ops, vec![done, unfinished]);
        assert_eq!((entries.returned(), entries.unfinished), (1, 1));
        assert!(entries.torn_tail);
    }

    #[test]
    fn rejects_records_out_of_order() {
        let call = Operation::crashed(1, OpKind::Write, "r0", Some("w1-0"), 10);
        let other = Operation::completed(1, OpKind::Write, "r0", Some("w1-1"), true, 10, 20);
        let (_dir, path) = write_journal(&format!("{call}\n{other}\n"));
        assert!(read(&path).unwrap_err().contains("does not match"));
        let (_dir, path) = write_journal(&format!("{other}\n"));
        assert!(read(&path).unwrap_err().contains("without a call"));
    }
}
