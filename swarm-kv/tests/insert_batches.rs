//! What an insert posts to its fresh register (SWARM §5.3.1, "Clients pre-allocate
//! cleared buffers so that this step completes in one roundtrip"): one batch to each
//! replica of the preferred majority that reads the metadata words, writes the record's out-of-place buffer,
//! writes the key header together with the value in place, and CASes the writer's
//! metadata word to the write, VERIFIED (`swarm_core`'s `Client::write_fresh`). No
//! other batch touches the register during the insert: no separate header write, no
//! guessed write round, no background VERIFIED mark.
//!
//! Checked on shared memory through a traced fabric (`Traced`) that records every
//! batch, waited for or in the background. The insert's answer is checked too.

use std::cell::RefCell;

use swarm_core::fabric::{Op, Traced, Tracer};
use swarm_core::{Batch, NodeId, OpStats, block_on};
use swarm_kv::clock::SystemClock;
use swarm_kv::layout::{ClusterParams, encode_key_header};
use swarm_kv::{KvClient, ShmStore};
use swarm_shm::ScratchDir;

/// One recorded batch: its node, whether it was posted in the background, and its
/// operations.
#[derive(Clone, Debug)]
struct Posted {
    node: NodeId,
    detached: bool,
    ops: Vec<Op>,
}

/// A tracer that records every batch, in order.
#[derive(Default)]
struct Recorder {
    posted: RefCell<Vec<Posted>>,
}

impl Recorder {
    fn record(&self, node: NodeId, batch: &Batch, detached: bool) {
        self.posted.borrow_mut().push(Posted {
            node,
            detached,
            ops: batch.ops().to_vec(),
        });
    }
}

impl Tracer for Recorder {
    fn batch(&self, node: NodeId, batch: &Batch) {
        self.record(node, batch, false);
    }
    fn detached(&self, node: NodeId, batch: &Batch) {
        self.record(node, batch, true);
    }
}

fn op_range(op: &Op) -> (u64, u64) {
    match op {
        Op::Read { addr, len } => (*addr, *addr + u64::from(*len)),
        Op::Write { addr, data } => (*addr, *addr + data.len() as u64),
        Op::Cas { addr, .. } => (*addr, *addr + 8),
    }
}

#[test]
fn an_insert_writes_its_register_in_one_batch_per_replica_and_nothing_else() {
    let dir = ScratchDir::new("insert-batches").expect("scratch dir");
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 4,
        replicas: 3,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(dir.path(), 3, 16 << 20, params).expect("create");
    let header = *store.header();
    let layout = *store.layout();
    let client = KvClient::connect(
        Traced::new(store.fabric(), Recorder::default()),
        SystemClock::new(header.epoch_unix_ns, header.tick_ns),
        layout,
        store.config(),
    )
    .expect("connect");
    let fabric = client.fabric();
    // A first insert claims the client's chunk; the one checked takes a pooled register.
    block_on(fabric, client.insert(b"warm-up", b"w", &OpStats::new())).expect("insert");
    fabric.tracer().posted.borrow_mut().clear();
    let (key, value) = (b"checked-key", [0x5Au8; 20]);
    block_on(fabric, client.insert(key, &value, &OpStats::new())).expect("insert");
    let got = block_on(fabric, client.get(key, &OpStats::new())).expect("get");
    assert_eq!(got.as_deref(), Some(&value[..]));

    let posted = fabric.tracer().posted.borrow().clone();
    let key_header = encode_key_header(key);
    // The batches that write the key header: the fresh write's, one per replica of
    // the preferred majority (the third replica only if one of them is slow).
    let fresh: Vec<&Posted> = posted
        .iter()
        .filter(|p| {
            p.ops
                .iter()
                .any(|op| matches!(op, Op::Write { data, .. } if data.starts_with(&key_header)))
        })
        .collect();
    assert_eq!(fresh.len(), 2, "one header write per replica: {fresh:#?}");
    assert_ne!(fresh[0].node, fresh[1].node);
    for p in &fresh {
        assert!(!p.detached, "the fresh write is waited for");
        let kinds: Vec<&str> = p
            .ops
            .iter()
            .map(|op| match op {
                Op::Read { .. } => "read",
                Op::Write { .. } => "write",
                Op::Cas { .. } => "cas",
            })
            .collect();
        assert_eq!(kinds, ["read", "write", "write", "cas"], "{p:#?}");
    }
    let slot_at = op_range(&fresh[0].ops[2]).0;
    let slot = slot_at..slot_at + layout.register_slot_bytes;
    for p in &fresh {
        let Op::Write { addr, data } = &p.ops[2] else {
            unreachable!()
        };
        assert_eq!(
            *addr, slot.start,
            "every replica has the register at one address"
        );
        assert!(
            data.windows(value.len()).any(|w| w == value),
            "the value goes in place with the header"
        );
        assert!(
            [&p.ops[0], &p.ops[3]]
                .iter()
                .all(|op| slot.contains(&op_range(op).0)),
            "the metadata read and the CAS are the register's"
        );
    }
    // Nothing else touches the register during the insert: only the get after it.
    let touching = posted
        .iter()
        .filter(|p| {
            p.ops.iter().any(|op| {
                let (start, end) = op_range(op);
                start < slot.end && slot.start < end
            })
        })
        .count();
    let get_batches = 2; // the get's read of a preferred majority
    assert_eq!(
        touching,
        fresh.len() + get_batches,
        "batches touching the register: {:#?}",
        posted
    );
}
