//! The trace: every message, operation and fault of a simulation, in virtual time.
//!
//! A failing seed is only useful if one can see what happened. Every event the world
//! executes is recorded here with its virtual time, and the whole trace is folded into
//! an xxh3 digest as it grows (see `digest.rs`), so that two runs can be compared
//! cheaply (same seed ⇒ same digest is the determinism test) even when the events
//! themselves are not kept.

use alloc::vec::Vec;
use core::fmt;

use xxhash_rust::xxh3::xxh3_64;

use super::digest::TraceDigest;
use super::fabric::ClientId;
use super::fault::Fault;
use swarm_core::fabric::{FabricError, Nanos, NodeId, Op};

/// Identifies one posted batch across the whole simulation (posting order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// Which batch an event is about: who posted it, where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRef {
    /// The posting client.
    pub client: ClientId,
    /// The destination node.
    pub node: NodeId,
    /// The batch.
    pub batch: BatchId,
}

/// The shape of one operation of a posted batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpSummary {
    /// A read of `len` bytes at `addr`.
    Read {
        /// Byte offset.
        addr: u64,
        /// Bytes.
        len: u32,
    },
    /// A write of `len` bytes at `addr`.
    Write {
        /// Byte offset.
        addr: u64,
        /// Bytes.
        len: u64,
    },
    /// A CAS of the word at `addr`.
    Cas {
        /// Byte offset.
        addr: u64,
        /// Expected value.
        expected: u64,
        /// New value.
        new: u64,
    },
}

impl From<&Op> for OpSummary {
    fn from(op: &Op) -> Self {
        match op {
            Op::Read { addr, len } => Self::Read {
                addr: *addr,
                len: *len,
            },
            Op::Write { addr, data } => Self::Write {
                addr: *addr,
                len: data.len() as u64,
            },
            Op::Cas {
                addr,
                expected,
                new,
            } => Self::Cas {
                addr: *addr,
                expected: *expected,
                new: *new,
            },
        }
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// A client posted a batch; it is now travelling to the node.
    Post {
        /// The batch.
        at: BatchRef,
        /// Its operations, in order.
        ops: Vec<OpSummary>,
    },
    /// The batch reached its node, which starts executing it.
    Arrive {
        /// The batch.
        at: BatchRef,
    },
    /// Operation `index` of a batch read memory, at this one instant.
    Read {
        /// The batch.
        at: BatchRef,
        /// Position of the operation in the batch.
        index: u8,
        /// Byte offset.
        addr: u64,
        /// Bytes read.
        len: u32,
        /// The first (up to) 8 bytes read, in memory order, zero padded.
        head: [u8; 8],
        /// xxh3 of all the bytes read.
        hash: u64,
    },
    /// Operation `index` of a batch applied its first 8-byte chunk.
    WriteBegin {
        /// The batch.
        at: BatchRef,
        /// Position of the operation in the batch.
        index: u8,
        /// Byte offset.
        addr: u64,
        /// Bytes written.
        len: u64,
    },
    /// Operation `index` of a batch applied its last chunk: the write is complete.
    WriteEnd {
        /// The batch.
        at: BatchRef,
        /// Position of the operation in the batch.
        index: u8,
        /// Byte offset.
        addr: u64,
        /// Bytes written.
        len: u64,
    },
    /// Operation `index` of a batch was a CAS, executed atomically at this instant.
    Cas {
        /// The batch.
        at: BatchRef,
        /// Position of the operation in the batch.
        index: u8,
        /// Byte offset of the word.
        addr: u64,
        /// Expected value.
        expected: u64,
        /// New value.
        new: u64,
        /// The value found (it swapped iff equal to `expected`).
        previous: u64,
    },
    /// The completion reached the client (or the batch was refused at once).
    Complete {
        /// The batch.
        at: BatchRef,
        /// Success, or why it failed.
        result: Result<(), FabricError>,
    },
    /// The batch was lost to a node crash: it will never complete.
    Lost {
        /// The batch.
        at: BatchRef,
    },
    /// A test wrote node memory directly ([`super::SimWorld::poke`]).
    Poke {
        /// The node written.
        node: NodeId,
        /// Byte offset.
        addr: u64,
        /// Bytes written.
        len: u64,
    },
    /// A fault was applied.
    Fault(Fault),
    /// A timer fired (a sleep ended, a delayed task is due).
    Wake,
}

/// One trace event at a virtual time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Virtual time in nanoseconds.
    pub time: Nanos,
    /// What happened.
    pub kind: TraceKind,
}

impl TraceEvent {
    /// The batch the event is about, if any.
    pub fn batch(&self) -> Option<BatchRef> {
        match &self.kind {
            TraceKind::Post { at, .. }
            | TraceKind::Arrive { at }
            | TraceKind::Read { at, .. }
            | TraceKind::WriteBegin { at, .. }
            | TraceKind::WriteEnd { at, .. }
            | TraceKind::Cas { at, .. }
            | TraceKind::Complete { at, .. }
            | TraceKind::Lost { at } => Some(*at),
            TraceKind::Poke { .. } | TraceKind::Fault(_) | TraceKind::Wake => None,
        }
    }
}

impl fmt::Display for BatchRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{} n{} b{}", self.client.0, self.node, self.batch.0)
    }
}

impl fmt::Display for OpSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { addr, len } => write!(f, "read {addr:#x}+{len}"),
            Self::Write { addr, len } => write!(f, "write {addr:#x}+{len}"),
            Self::Cas {
                addr,
                expected,
                new,
            } => write!(f, "cas {addr:#x} {expected:#x}->{new:#x}"),
        }
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>12} ns  ", self.time)?;
        match &self.kind {
            TraceKind::Post { at, ops } => {
                write!(f, "{at} post [")?;
                for (i, op) in ops.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{op}")?;
                }
                f.write_str("]")
            }
            TraceKind::Arrive { at } => write!(f, "{at} arrive"),
            TraceKind::Read {
                at,
                index,
                addr,
                len,
                head,
                hash,
            } => {
                write!(f, "{at}.{index} read {addr:#x}+{len} = ")?;
                for byte in &head[..(*len as usize).min(8)] {
                    write!(f, "{byte:02x}")?;
                }
                let more = if *len > 8 { ".." } else { "" };
                write!(f, "{more} (xxh3 {hash:016x})")
            }
            TraceKind::WriteBegin {
                at,
                index,
                addr,
                len,
            } => write!(f, "{at}.{index} write {addr:#x}+{len} begins"),
            TraceKind::WriteEnd {
                at,
                index,
                addr,
                len,
            } => write!(f, "{at}.{index} write {addr:#x}+{len} ends"),
            TraceKind::Cas {
                at,
                index,
                addr,
                expected,
                new,
                previous,
            } => {
                let outcome = if previous == expected {
                    "swapped"
                } else {
                    "failed"
                };
                write!(
                    f,
                    "{at}.{index} cas {addr:#x} {expected:#x}->{new:#x} found {previous:#x} ({outcome})"
                )
            }
            TraceKind::Complete { at, result: Ok(()) } => write!(f, "{at} complete ok"),
            TraceKind::Complete {
                at,
                result: Err(error),
            } => write!(f, "{at} complete with error: {error}"),
            TraceKind::Lost { at } => write!(f, "{at} lost (node crashed)"),
            TraceKind::Poke { node, addr, len } => write!(f, "poke n{node} {addr:#x}+{len}"),
            TraceKind::Fault(fault) => write!(f, "fault: {fault}"),
            TraceKind::Wake => f.write_str("wake"),
        }
    }
}

/// The summary of read bytes kept in the trace: the first 8 bytes and a hash.
pub(crate) fn read_summary(bytes: &[u8]) -> ([u8; 8], u64) {
    let mut head = [0u8; 8];
    let n = bytes.len().min(8);
    head[..n].copy_from_slice(&bytes[..n]);
    (head, xxh3_64(bytes))
}

/// A snapshot of a simulation's trace (see [`super::SimWorld::trace`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    events: Vec<TraceEvent>,
    recorded: u64,
}

impl Trace {
    /// The events kept, oldest first (none if the world was configured not to keep
    /// them).
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// Number of events kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Number of events recorded, kept or not.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// The last `n` events, printable.
    pub fn tail(&self, n: usize) -> TraceTail<'_> {
        let start = self.events.len().saturating_sub(n);
        TraceTail(&self.events[start..])
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        TraceTail(&self.events).fmt(f)
    }
}

/// Some trace events, printed one per line.
#[derive(Clone, Copy, Debug)]
pub struct TraceTail<'a>(&'a [TraceEvent]);

impl fmt::Display for TraceTail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for event in self.0 {
            writeln!(f, "{event}")?;
        }
        Ok(())
    }
}

/// The world's recorder: keeps events (optionally) and folds each one into a
/// running digest.
#[derive(Debug)]
pub(crate) struct TraceLog {
    keep: bool,
    events: Vec<TraceEvent>,
    recorded: u64,
    digest: TraceDigest,
}

impl TraceLog {
    pub(crate) fn new(keep: bool) -> Self {
        Self {
            keep,
            events: Vec::new(),
            recorded: 0,
            digest: TraceDigest::new(),
        }
    }

    pub(crate) fn record(&mut self, time: Nanos, kind: TraceKind) {
        let event = TraceEvent { time, kind };
        self.digest.add(&event);
        self.recorded += 1;
        if self.keep {
            self.events.push(event);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub(crate) fn digest(&self) -> u64 {
        self.digest.value()
    }

    pub(crate) fn snapshot(&self) -> Trace {
        Trace {
            events: self.events.clone(),
            recorded: self.recorded,
        }
    }

    pub(crate) fn tail(&self, n: usize) -> Trace {
        let start = self.events.len().saturating_sub(n);
        Trace {
            events: self.events[start..].to_vec(),
            recorded: self.recorded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn at() -> BatchRef {
        BatchRef {
            client: ClientId(1),
            node: NodeId(2),
            batch: BatchId(3),
        }
    }

    #[test]
    fn events_print_one_readable_line() {
        let ops = vec![
            OpSummary::Read { addr: 0x40, len: 8 },
            OpSummary::Cas {
                addr: 0,
                expected: 0,
                new: 5,
            },
        ];
        let post = TraceEvent {
            time: 1_500,
            kind: TraceKind::Post { at: at(), ops },
        };
        assert_eq!(
            post.to_string(),
            "        1500 ns  c1 n2 b3 post [read 0x40+8, cas 0x0 0x0->0x5]"
        );
        let cas = TraceEvent {
            time: 7,
            kind: TraceKind::Cas {
                at: at(),
                index: 1,
                addr: 8,
                expected: 1,
                new: 2,
                previous: 3,
            },
        };
        assert!(
            cas.to_string()
                .ends_with("c1 n2 b3.1 cas 0x8 0x1->0x2 found 0x3 (failed)")
        );
        assert_eq!(cas.batch(), Some(at()));
        let wake = TraceEvent {
            time: 0,
            kind: TraceKind::Wake,
        };
        assert_eq!(wake.batch(), None);
    }

    #[test]
    fn digest_depends_on_every_event_and_not_on_keeping_them() {
        let mut kept = TraceLog::new(true);
        let mut dropped = TraceLog::new(false);
        for log in [&mut kept, &mut dropped] {
            log.record(1, TraceKind::Wake);
            log.record(2, TraceKind::Lost { at: at() });
        }
        assert_eq!(kept.digest(), dropped.digest());
        assert_eq!(kept.snapshot().len(), 2);
        assert_eq!(dropped.snapshot().recorded(), 2);
        assert!(dropped.snapshot().is_empty());
        let before = kept.digest();
        kept.record(3, TraceKind::Wake);
        assert_ne!(kept.digest(), before);
        assert_eq!(kept.tail(1).to_string(), "           3 ns  wake\n");
    }

    #[test]
    fn reads_print_their_first_bytes_in_memory_order() {
        let (head, hash) = read_summary(&[1, 2, 0xab]);
        assert_eq!(head, [1, 2, 0xab, 0, 0, 0, 0, 0]);
        assert_eq!(hash, xxh3_64(&[1, 2, 0xab]));
        let short = TraceEvent {
            time: 0,
            kind: TraceKind::Read {
                at: at(),
                index: 0,
                addr: 0,
                len: 3,
                head,
                hash,
            },
        };
        assert!(
            short.to_string().contains("read 0x0+3 = 0102ab (xxh3 "),
            "{short}"
        );
        let (head, hash) = read_summary(&[0xff; 16]);
        let long = TraceEvent {
            time: 0,
            kind: TraceKind::Read {
                at: at(),
                index: 2,
                addr: 8,
                len: 16,
                head,
                hash,
            },
        };
        assert!(
            long.to_string()
                .contains("b3.2 read 0x8+16 = ffffffffffffffff.. (xxh3"),
            "{long}"
        );
    }
}
