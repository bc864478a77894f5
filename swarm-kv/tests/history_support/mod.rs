//! Recording SWARM-KV operations for the linearizability checker, shared by the KV
//! integration tests that run concurrent clients.

#![allow(dead_code)]

use std::time::Instant;

use swarm_checker::{OpKind, Operation};
use swarm_core::{Clock, Fabric, OpStats, block_on};
use swarm_kv::KvClient;

/// Runs one operation of `kind` on `key` (an insert or update writes `value`) with
/// client `c` of thread `thread`, and returns it as the checker records it, with
/// start and end times measured from `origin`. Panics on an error: these tests run
/// without faults.
pub fn run_recorded<F: Fabric, C: Clock>(
    c: &KvClient<F, C>,
    thread: u64,
    kind: OpKind,
    key: String,
    value: String,
    origin: Instant,
) -> Operation {
    let f = c.fabric();
    let s = OpStats::new();
    let start = origin.elapsed().as_nanos() as u64;
    let (ok, value) = match kind {
        OpKind::Get => {
            let v = block_on(f, c.get(key.as_bytes(), &s)).unwrap();
            (true, v.map(|v| String::from_utf8(v).unwrap()))
        }
        OpKind::Update => (
            block_on(f, c.update(key.as_bytes(), value.as_bytes(), &s)).unwrap(),
            Some(value),
        ),
        OpKind::Insert => {
            block_on(f, c.insert(key.as_bytes(), value.as_bytes(), &s)).unwrap();
            (true, Some(value))
        }
        OpKind::Delete => (block_on(f, c.delete(key.as_bytes(), &s)).unwrap(), None),
        other => panic!("{other:?} is not a key-value operation"),
    };
    let end = origin.elapsed().as_nanos() as u64;
    Operation::completed(thread, kind, key, value.as_deref(), ok, start, end)
}
