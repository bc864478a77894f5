//! What an insert posts (SWARM §5.3.1: the value and the index mapping "in
//! parallel", and "Clients pre-allocate cleared buffers so that this step completes
//! in one roundtrip"): one batch to every replica that reads the metadata words,
//! writes the record's out-of-place buffer, writes the key header together with the
//! value in place, CASes the writer's metadata word to the write, VERIFIED
//! (`swarm_core`'s `Client::write_fresh_carrying`), and last CASes the key's first
//! index bucket from a never-used word (the index's blind fast round). One
//! roundtrip. No other batch touches the register during the insert: no separate
//! header write, no guessed write round, no background VERIFIED mark; and no other
//! batch is waited for.
//!
//! Checked on shared memory through a traced fabric (`Traced`) that records every
//! batch, waited for or in the background. The insert's answer is checked too.

use std::cell::RefCell;

use swarm_core::fabric::{Op, Traced, Tracer};
use swarm_core::{Batch, NodeId, OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::SystemClock;
use swarm_kv::testing::encode_key_header;
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
    let stats = OpStats::new();
    block_on(fabric, client.insert(key, &value, &stats)).expect("insert");
    assert_eq!(stats.roundtrips(), 1, "the insert takes one roundtrip");
    let during_insert = fabric.tracer().posted.borrow().len();
    let got = block_on(fabric, client.get(key, &OpStats::new())).expect("get");
    assert_eq!(got.as_deref(), Some(&value[..]));

    let posted = fabric.tracer().posted.borrow().clone();
    let key_header = encode_key_header(key);
    // The batches that write the key header: the fresh write's, one per replica.
    let fresh: Vec<&Posted> = posted
        .iter()
        .filter(|p| {
            p.ops
                .iter()
                .any(|op| matches!(op, Op::Write { data, .. } if data.starts_with(&key_header)))
        })
        .collect();
    assert_eq!(fresh.len(), 3, "one header write per replica: {fresh:#?}");
    let mut nodes: Vec<NodeId> = fresh.iter().map(|p| p.node).collect();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one batch to each replica");

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
        assert_eq!(kinds, ["read", "write", "write", "cas", "cas"], "{p:#?}");
    }
    // The last CAS, the same on every node: the index's, from a never-used word.
    let Op::Cas {
        addr: index_at,
        expected: 0,
        new,
    } = fresh[0].ops[4]
    else {
        panic!("the index CAS expects a never-used bucket: {:#?}", fresh[0]);
    };
    assert!(fresh.iter().all(|p| p.ops[4] == fresh[0].ops[4]));
    assert_ne!(new, 0);
    // The insert waited for nothing else in the key's bucket: the mapping's slot is
    // written in the background.
    let bucket = index_at..index_at + 64;
    let in_bucket: Vec<&Posted> = posted[..during_insert]
        .iter()
        .filter(|p| {
            !p.detached
                && p.ops.iter().any(|op| {
                    let (start, end) = op_range(op);
                    start < bucket.end && bucket.start < end
                })
        })
        .collect();
    assert_eq!(
        in_bucket.len(),
        3,
        "waited for in the bucket: {in_bucket:#?}"
    );
    assert!(
        posted[..during_insert]
            .iter()
            .any(|p| p.detached && p.ops.iter().any(|op| bucket.contains(&op_range(op).0))),
        "the slot is applied in the background"
    );
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
    assert!(!slot.contains(&index_at), "the last CAS is the index's");
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
