//! The trace digest: every trace event, encoded field by field, folded into xxh3.
//!
//! Hashing a fixed binary encoding instead of the printed text keeps the digest
//! cheap enough to compute for every event of long runs (formatting dominated the
//! simulation's profile), while still covering every field: two traces have the
//! same digest exactly when (up to hash collisions) they hold the same events.

use core::fmt;

use xxhash_rust::xxh3::Xxh3Default;

use super::fault::Fault;
use super::trace::{BatchRef, OpSummary, TraceEvent, TraceKind};

/// A running digest of trace events.
#[derive(Clone)]
pub(crate) struct TraceDigest(Xxh3Default);

impl fmt::Debug for TraceDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceDigest({:016x})", self.value())
    }
}

/// Feeds formatted text into the hasher, without allocating (for error messages).
struct TextFeed<'a>(&'a mut Xxh3Default);

impl fmt::Write for TextFeed<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

impl TraceDigest {
    pub(crate) fn new() -> Self {
        Self(Xxh3Default::new())
    }

    pub(crate) fn value(&self) -> u64 {
        self.0.digest()
    }

    fn u64(&mut self, value: u64) {
        self.0.update(&value.to_le_bytes());
    }

    fn tag(&mut self, tag: u8) {
        self.0.update(&[tag]);
    }

    fn at(&mut self, at: &BatchRef) {
        self.u64(u64::from(at.client.0));
        self.u64(u64::from(at.node.0));
        self.u64(at.batch.0);
    }

    fn op(&mut self, op: &OpSummary) {
        match *op {
            OpSummary::Read { addr, len } => {
                self.tag(0);
                self.u64(addr);
                self.u64(u64::from(len));
            }
            OpSummary::Write { addr, len } => {
                self.tag(1);
                self.u64(addr);
                self.u64(len);
            }
            OpSummary::Cas {
                addr,
                expected,
                new,
            } => {
                self.tag(2);
                self.u64(addr);
                self.u64(expected);
                self.u64(new);
            }
        }
    }

    fn fault(&mut self, fault: &Fault) {
        match *fault {
            Fault::Crash(node) => {
                self.tag(0);
                self.u64(u64::from(node.0));
            }
            Fault::Recover(node) => {
                self.tag(1);
                self.u64(u64::from(node.0));
            }
            Fault::Slow(node, factor) => {
                self.tag(2);
                self.u64(u64::from(node.0));
                self.u64(u64::from(factor));
            }
            Fault::CrashClient(client) => {
                self.tag(3);
                self.u64(u64::from(client.0));
            }
            Fault::SlowLink(client, node, factor) => {
                self.tag(4);
                self.u64(u64::from(client.0));
                self.u64(u64::from(node.0));
                self.u64(u64::from(factor));
            }
            Fault::CrashClientAtPost(client, n) => {
                self.tag(5);
                self.u64(u64::from(client.0));
                self.u64(u64::from(n));
            }
            Fault::HoldWrite {
                node,
                from,
                to,
                max_ns,
            } => {
                self.tag(6);
                self.u64(u64::from(node.0));
                self.u64(from);
                self.u64(to);
                self.u64(max_ns);
            }
        }
    }

    /// Folds one event into the digest.
    pub(crate) fn add(&mut self, event: &TraceEvent) {
        self.u64(event.time);
        match &event.kind {
            TraceKind::Post { at, ops } => {
                self.tag(0);
                self.at(at);
                self.u64(ops.len() as u64);
                for op in ops {
                    self.op(op);
                }
            }
            TraceKind::Arrive { at } => {
                self.tag(1);
                self.at(at);
            }
            TraceKind::Read {
                at,
                index,
                addr,
                len,
                head: _,
                hash,
            } => {
                // `head` is a prefix of the bytes `hash` covers.
                self.tag(2);
                self.at(at);
                self.tag(*index);
                self.u64(*addr);
                self.u64(u64::from(*len));
                self.u64(*hash);
            }
            TraceKind::WriteBegin {
                at,
                index,
                addr,
                len,
            }
            | TraceKind::WriteEnd {
                at,
                index,
                addr,
                len,
            } => {
                let begin = matches!(event.kind, TraceKind::WriteBegin { .. });
                self.tag(if begin { 3 } else { 4 });
                self.at(at);
                self.tag(*index);
                self.u64(*addr);
                self.u64(*len);
            }
            TraceKind::Cas {
                at,
                index,
                addr,
                expected,
                new,
                previous,
            } => {
                self.tag(5);
                self.at(at);
                self.tag(*index);
                for value in [*addr, *expected, *new, *previous] {
                    self.u64(value);
                }
            }
            TraceKind::Complete { at, result } => {
                self.tag(6);
                self.at(at);
                match result {
                    Ok(()) => self.tag(0),
                    Err(error) => {
                        self.tag(1);
                        // Rare: the message identifies the error and its fields.
                        let _ = fmt::write(&mut TextFeed(&mut self.0), format_args!("{error}"));
                    }
                }
            }
            TraceKind::Lost { at } => {
                self.tag(7);
                self.at(at);
            }
            TraceKind::Poke { node, addr, len } => {
                self.tag(8);
                self.u64(u64::from(node.0));
                self.u64(*addr);
                self.u64(*len);
            }
            TraceKind::Fault(fault) => {
                self.tag(9);
                self.fault(fault);
            }
            TraceKind::Wake => self.tag(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchId, ClientId};
    use swarm_core::fabric::NodeId;

    fn digest(events: &[TraceEvent]) -> u64 {
        let mut d = TraceDigest::new();
        for e in events {
            d.add(e);
        }
        d.value()
    }

    fn lost(client: u32, node: u16, batch: u64) -> TraceEvent {
        TraceEvent {
            time: 5,
            kind: TraceKind::Lost {
                at: BatchRef {
                    client: ClientId(client),
                    node: NodeId(node),
                    batch: BatchId(batch),
                },
            },
        }
    }

    #[test]
    fn every_field_and_the_order_matter() {
        let base = [lost(1, 2, 3), lost(4, 5, 6)];
        let d = digest(&base);
        assert_eq!(d, digest(&base.clone()));
        assert_ne!(d, digest(&[lost(4, 5, 6), lost(1, 2, 3)]));
        assert_ne!(d, digest(&[lost(1, 2, 3), lost(4, 5, 7)]));
        assert_ne!(d, digest(&[lost(1, 2, 3), lost(4, 6, 6)]));
        assert_ne!(d, digest(&[lost(1, 2, 3), lost(3, 5, 6)]));
        let mut later = base.clone();
        later[1].time = 6;
        assert_ne!(d, digest(&later));
        let crash = |node| TraceEvent {
            time: 0,
            kind: TraceKind::Fault(Fault::Crash(NodeId(node))),
        };
        let recover = TraceEvent {
            time: 0,
            kind: TraceKind::Fault(Fault::Recover(NodeId(1))),
        };
        assert_ne!(digest(&[crash(1)]), digest(&[recover]));
        assert_ne!(digest(&[crash(1)]), digest(&[crash(2)]));
    }
}
