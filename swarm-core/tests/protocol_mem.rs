//! Protocol sanity on the in-process fabric: roundtrip counts in the common case,
//! deletes, and a crashed minority.

use std::cell::Cell;
use std::task::Poll;
use swarm_core::FixedClock;
use swarm_core::encoding::WriterId;
use swarm_core::encoding::{Flag, Timestamp, Tsp};

use swarm_core::fabric::{FailNodes, Nanos, Ticket};
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Completion, DeleteOutcome, Fabric, FabricError, FailureCause, FirstDeleter,
    FreshOutcome, NodeId, Op, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc,
    Replicas, Roundtrip, Submitted, WriteOutcome, block_on, block_on_future,
};
use swarm_core::{MemCluster, MemFabric};

fn layout() -> Layout {
    Layout::builder()
        .payload_max(64)
        .meta_words(4)
        .log_base(1 << 16)
        .writers(8)
        .slots_per_writer(256)
        .build()
        .unwrap()
}

fn setup(
    writer: u32,
    clock: u64,
    cluster: &MemCluster,
) -> Client<FailNodes<MemFabric>, FixedClock> {
    Client::new(
        FailNodes::new(cluster.client()),
        FixedClock(clock),
        layout(),
        WriterId::new(writer).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap()
}

fn reg() -> RegisterLoc {
    RegisterLoc::at(4096, Replicas::all(3, 7).unwrap())
}

#[test]
fn safe_guess_common_case_is_one_roundtrip() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 100, &cluster);
    let b = setup(1, 200, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    let f = a.fabric();
    let s = OpStats::new();
    assert_eq!(
        block_on_future(f, a.read(&reg, &mut ca, &s)).unwrap(),
        Ok(ReadValue::Empty)
    );
    assert_eq!(s.roundtrips(), 1);
    for i in 0..5u8 {
        let s = OpStats::new();
        let out = block_on_future(f, a.write(&reg, &mut ca, &s, &[i; 10])).unwrap();
        assert_eq!(out, Ok(WriteOutcome::Written));
        assert_eq!(s.roundtrips(), 1, "write {i}");
        let s = OpStats::new();
        let got = block_on_future(b.fabric(), b.read(&reg, &mut cb, &s)).unwrap();
        assert_eq!(got, Ok(ReadValue::Value(vec![i; 10])));
        assert_eq!(s.roundtrips(), 1, "read {i}");
    }
    // b writes with a larger clock: still one roundtrip, and a reads it.
    let s = OpStats::new();
    block_on(b.fabric(), b.write(&reg, &mut cb, &s, b"from b")).unwrap();
    assert_eq!(s.roundtrips(), 1);
    let s = OpStats::new();
    let got = block_on(f, a.read(&reg, &mut ca, &s)).unwrap();
    assert_eq!(got, ReadValue::Value(b"from b".to_vec()));
}

#[test]
fn stale_guess_takes_the_slow_path_and_still_wins() {
    let cluster = MemCluster::new(3, 1 << 20);
    let ahead = setup(0, 1_000_000, &cluster);
    let behind = setup(1, 10, &cluster);
    let (reg, mut c0, mut c1) = (reg(), RegisterCache::new(), RegisterCache::new());
    block_on(
        ahead.fabric(),
        ahead.write(&reg, &mut c0, &OpStats::new(), b"old"),
    )
    .unwrap();
    let s = OpStats::new();
    block_on(behind.fabric(), behind.write(&reg, &mut c1, &s, b"new")).unwrap();
    assert!(
        s.roundtrips() >= 3,
        "stale guess: read+write, lock, rewrite"
    );
    let got = block_on(ahead.fabric(), ahead.read(&reg, &mut c0, &OpStats::new())).unwrap();
    assert_eq!(got, ReadValue::Value(b"new".to_vec()));
    // The guesser re-synchronised: the next write of the lagging writer is fast.
    let s = OpStats::new();
    block_on(behind.fabric(), behind.write(&reg, &mut c1, &s, b"newer")).unwrap();
    assert_eq!(s.roundtrips(), 1);
}

/// The read bound (`2·writers + 1` iterations, appendix C) holds per read, not per
/// operation: an operation that reads several registers, or one register several
/// times (a KV insert that retries), sums their iterations in its `OpStats`, and a
/// read late in it must not give up for the iterations its earlier reads took.
#[test]
fn the_read_bound_counts_one_reads_iterations_not_its_operations() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 100, &cluster);
    let b = setup(1, 200, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    // a's write misses the third replica, and b reads without the first: the maximum
    // b reads is on one replica of two, so b's read goes past its common case.
    a.fabric().fail_node(reg.replicas.node(2));
    block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"x")).unwrap();
    b.fabric().fail_node(reg.replicas.node(0));
    let s = OpStats::new();
    let bound = 2 * u32::from(layout().writers()) + 1;
    // What the operation's earlier reads counted.
    for _ in 0..bound {
        s.count_iteration();
    }
    let got = block_on(b.fabric(), b.read(&reg, &mut cb, &s));
    assert_eq!(got, Ok(ReadValue::Value(b"x".to_vec())));
    assert!(s.iterations() > bound, "the read went past its common case");
}

#[test]
fn abd_takes_two_roundtrips_and_raw_one() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let (reg, mut c) = (reg(), RegisterCache::new());
    let f = a.fabric();
    let s = OpStats::new();
    block_on(f, a.abd_write(&reg, &mut c, &s, b"abd")).unwrap();
    assert_eq!(s.roundtrips(), 2);
    let s = OpStats::new();
    let got = block_on(f, a.abd_read(&reg, &mut c, &s)).unwrap();
    assert_eq!(got, ReadValue::Value(b"abd".to_vec()));
    assert_eq!(s.roundtrips(), 2);
    let raw = RegisterLoc::at(8192, reg.replicas.clone());
    let s = OpStats::new();
    block_on(f, a.raw_write(&raw, &s, b"raw")).unwrap();
    let got = block_on(f, a.raw_read(&raw, &s)).unwrap();
    assert_eq!(got, ReadValue::Value(b"raw".to_vec()));
    assert_eq!(s.roundtrips(), 2);
}

/// A RAW read that keeps finding a torn record (a writer preempted in the middle of
/// it) waits for the writer instead of giving up after a burst of re-reads: here the
/// record is repaired 20 ms later on the fabric clock, which neither 64 back-to-back
/// re-reads (one clock tick each on this fabric) nor pauses that stop doubling reach
/// (the read's patience is about 50 ms).
#[test]
fn a_raw_read_waits_out_a_torn_record() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let f = a.fabric();
    let raw = RegisterLoc::at(8192, reg().replicas);
    let torn = vec![0xAB; 32];
    block_on_future(f, async {
        let s = OpStats::new();
        let mut rt = swarm_core::Roundtrip::start(f, &s);
        rt.post(
            raw.replicas.node(0),
            swarm_core::Batch::write(raw.offset(0), torn),
        )
        .unwrap();
        rt.wait(1).await.unwrap();
    })
    .unwrap();
    let (read, written) = block_on_future(
        f,
        swarm_core::join(a.raw_read(&raw, &OpStats::new()), async {
            swarm_core::sleep(f, 20_000_000).await;
            a.raw_write(&raw, &OpStats::new(), b"whole").await
        }),
    )
    .unwrap();
    written.unwrap();
    assert_eq!(read.unwrap(), ReadValue::Value(b"whole".to_vec()));
}

/// `raw_read_now_with`, RAW's read as a plain function: the validated payload goes to
/// the caller's `consume` in place, from the client's read buffer where the fabric
/// reads in place (small and large records alike), as a batch otherwise; `consume`
/// runs only for a read that counts (a validated record, the fence passed), and
/// whatever does not apply (no deadline armed, a torn record, a crashed primary)
/// is `Ok(None)` with nothing consumed.
#[test]
fn a_raw_read_now_hands_only_a_validated_payload_to_its_caller() {
    use swarm_core::ReadInPlace;
    let cluster = MemCluster::new(3, 1 << 22);
    let small = setup(0, 5, &cluster);
    let large_layout = Layout::builder()
        .payload_max(1024)
        .meta_words(4)
        .log_base(1 << 16)
        .writers(8)
        .slots_per_writer(256)
        .build()
        .unwrap();
    let large = Client::new(
        FailNodes::new(cluster.client()),
        FixedClock(5),
        large_layout,
        WriterId::new(1).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap();
    for (client, addr, payload) in [
        (&small, 8192u64, b"in a stack copy".to_vec()),
        (&large, 1 << 21, vec![0x5A; 1024]),
    ] {
        let raw = RegisterLoc::at(addr, reg().replicas);
        let f = client.fabric();
        let consumed = Cell::new(0);
        let consume = |bytes: &[u8]| {
            consumed.set(consumed.get() + 1);
            bytes.to_vec()
        };
        // No deadline armed: not applicable.
        let s = OpStats::new();
        assert_eq!(client.raw_read_now_with(&raw, &s, consume).unwrap(), None);
        // Never written.
        let _armed = s.arm_deadline(u64::MAX / 2);
        assert_eq!(
            client.raw_read_now_with(&raw, &s, consume).unwrap(),
            Some(ReadInPlace::Empty)
        );
        assert_eq!((consumed.get(), s.roundtrips()), (0, 1));
        block_on(f, client.raw_write(&raw, &OpStats::new(), &payload)).unwrap();
        let s = OpStats::new();
        let _armed = s.arm_deadline(u64::MAX / 2);
        assert_eq!(
            client.raw_read_now_with(&raw, &s, consume).unwrap(),
            Some(ReadInPlace::Value(payload.clone()))
        );
        assert_eq!((consumed.get(), s.roundtrips()), (1, 1));
        // Past the deadline: fenced, nothing consumed.
        block_on_future(f, swarm_core::sleep(f, 1_000)).unwrap();
        let s = OpStats::new();
        let _armed = s.arm_deadline(f.now() - 1);
        assert!(client.raw_read_now_with(&raw, &s, consume).is_err());
        assert_eq!(consumed.get(), 1);
        // A crashed primary: the general path's business.
        let s = OpStats::new();
        let _armed = s.arm_deadline(u64::MAX / 2);
        f.fail_node(raw.replicas.node(0));
        assert_eq!(client.raw_read_now_with(&raw, &s, consume).unwrap(), None);
        f.recover_node(raw.replicas.node(0));
        // A torn record (one byte of the payload flipped): not validated.
        let mut bytes = node_bytes(&cluster, raw.replicas.node(0), raw.offset(0), 64);
        bytes[40] ^= 1;
        on_node(
            &cluster,
            raw.replicas.node(0),
            Batch::write(raw.offset(0), bytes),
        );
        assert_eq!(client.raw_read_now_with(&raw, &s, consume).unwrap(), None);
        assert_eq!((consumed.get(), s.roundtrips()), (1, 0));
    }
}

/// `read_start_with` hands its `consume` the payload of the in-place record only
/// when the read settles at once and that record is the maximum's write, validated
/// and past the fence, from the client's read buffer (registers of two sizes). A
/// read it leaves pending (no deadline armed, a torn or stale
/// in-place record) consumes nothing and finishes on the general path.
#[test]
fn a_read_start_with_hands_only_the_maximums_validated_payload_to_its_caller() {
    use swarm_core::{ReadInPlace, ReadStart};
    let cluster = MemCluster::new(3, 1 << 23);
    let small = setup(0, 5, &cluster);
    let reader = setup(1, 7, &cluster);
    let large_layout = Layout::builder()
        .payload_max(1024)
        .meta_words(4)
        .log_base(1 << 16)
        .writers(8)
        .slots_per_writer(256)
        .build()
        .unwrap();
    let large = |writer| {
        Client::new(
            FailNodes::new(cluster.client()),
            FixedClock(5),
            large_layout,
            WriterId::new(writer).unwrap(),
            ProtocolConfig::default(),
        )
        .unwrap()
    };
    let (large_writer, large_reader) = (large(2), large(3));
    for (writer, reader, addr, payloads) in [
        (&small, &reader, 4096u64, [vec![1; 40], vec![2; 50]]),
        (
            &large_writer,
            &large_reader,
            1 << 22,
            [vec![3; 1000], vec![4; 900]],
        ),
    ] {
        let reg = RegisterLoc::at(addr, reg().replicas);
        let f = reader.fabric();
        let consumed = Cell::new(0);
        let consume = |bytes: &[u8]| {
            consumed.set(consumed.get() + 1);
            bytes.to_vec()
        };
        let start = |cache: &mut RegisterCache, s: &OpStats| match reader
            .read_start_with(&reg, cache, s, consume)
        {
            Ok(ReadStart::Done(read)) => Ok(Some(read)),
            Ok(ReadStart::Pending(_)) => Ok(None),
            Err(error) => Err(error),
        };
        // No deadline armed: pending, nothing read.
        let s = OpStats::new();
        assert_eq!(start(&mut RegisterCache::new(), &s).unwrap(), None);
        assert_eq!(s.roundtrips(), 0);
        // Never written.
        let _armed = s.arm_deadline(u64::MAX / 2);
        let empty = start(&mut RegisterCache::new(), &s).unwrap();
        assert_eq!(
            (empty, consumed.get(), s.roundtrips()),
            (Some(ReadInPlace::Empty), 0, 1)
        );
        let mut cw = RegisterCache::new();
        block_on(
            writer.fabric(),
            writer.write(&reg, &mut cw, &OpStats::new(), &payloads[0]),
        )
        .unwrap();
        let primary = reg.replicas.node(0);
        let record_bytes = writer.layout().record_bytes() as u32;
        let first_record = node_bytes(&cluster, primary, reg.offset(0), record_bytes);
        let s = OpStats::new();
        let _armed = s.arm_deadline(u64::MAX / 2);
        let read = start(&mut RegisterCache::new(), &s).unwrap();
        assert_eq!(read, Some(ReadInPlace::Value(payloads[0].clone())));
        assert_eq!((consumed.get(), s.roundtrips()), (1, 1));
        // Past the deadline: fenced, nothing consumed.
        block_on_future(f, swarm_core::sleep(f, 1_000)).unwrap();
        let s = OpStats::new();
        let _armed = s.arm_deadline(f.now() - 1);
        assert!(start(&mut RegisterCache::new(), &s).is_err());
        assert_eq!(consumed.get(), 1);
        // The second write's in-place record replaced by the first's, which validates
        // but is not the maximum's write: pending, and the general path fetches the
        // maximum's buffer.
        block_on(
            writer.fabric(),
            writer.write(&reg, &mut cw, &OpStats::new(), &payloads[1]),
        )
        .unwrap();
        on_node(&cluster, primary, Batch::write(reg.offset(0), first_record));
        let s = OpStats::new();
        let _armed = s.arm_deadline(u64::MAX / 2);
        let mut cache = RegisterCache::new();
        let ReadStart::Pending(pending) = reader
            .read_start_with(&reg, &mut cache, &s, consume)
            .unwrap()
        else {
            panic!("a stale in-place record settled the read");
        };
        assert_eq!(consumed.get(), 1);
        let rest = block_on(f, reader.read_finish(&reg, &mut cache, &s, pending)).unwrap();
        assert_eq!(rest, ReadValue::Value(payloads[1].clone()));
        // A torn in-place record (eight bytes of its hash): pending as well.
        on_node(
            &cluster,
            primary,
            Batch::write(reg.offset(0) + 16, vec![0xEE; 8]),
        );
        let s = OpStats::new();
        let _armed = s.arm_deadline(u64::MAX / 2);
        assert_eq!(start(&mut RegisterCache::new(), &s).unwrap(), None);
        assert_eq!(consumed.get(), 1);
    }
}

#[test]
fn delete_hides_the_value_and_blocks_later_writes() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 50, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"v")).unwrap();
    let out = block_on(b.fabric(), b.delete(&reg, &mut cb, &OpStats::new())).unwrap();
    assert_eq!(out, DeleteOutcome::Removed);
    let again = block_on(a.fabric(), a.delete(&reg, &mut ca, &OpStats::new())).unwrap();
    assert_eq!(again, DeleteOutcome::Absent);
    let got = block_on(a.fabric(), a.read(&reg, &mut ca, &OpStats::new())).unwrap();
    assert_eq!(got, ReadValue::Deleted);
    let w = block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"late")).unwrap();
    assert_eq!(w, WriteOutcome::Deleted);
    let got = block_on(b.fabric(), b.read(&reg, &mut cb, &OpStats::new())).unwrap();
    assert_eq!(got, ReadValue::Deleted);
}

/// `batch` run on `node` alone, outside any client: what a crashed client left
/// behind, or a look at a node's memory.
fn on_node(cluster: &MemCluster, node: NodeId, batch: Batch) -> swarm_core::Completion {
    let fabric = cluster.client();
    let stats = OpStats::new();
    block_on(&fabric, async {
        let mut rt = Roundtrip::start(&fabric, &stats);
        rt.post(node, batch)?;
        rt.wait(1).await?;
        Ok::<_, swarm_core::FabricError>(std::mem::take(&mut rt.replies_mut()[0].1))
    })
    .unwrap()
}

/// `len` bytes at `addr` on `node`, read directly.
fn node_bytes(cluster: &MemCluster, node: NodeId, addr: u64, len: u32) -> Vec<u8> {
    on_node(cluster, node, Batch::read(addr, len))
        .take_read(0)
        .unwrap()
}

/// Writer `writer`'s tombstone in the delete word of `reg` on `node` only: what a
/// delete leaves behind when its batch reached that replica and its client crashed.
fn tombstone_on(cluster: &MemCluster, reg: &RegisterLoc, node: NodeId, writer: u32) {
    let tombstone = Tsp::new(
        Timestamp::tombstone(WriterId::new(writer).unwrap()),
        Flag::Verified,
    );
    let addr = layout().delete_word_addr(reg.offset(0));
    on_node(cluster, node, Batch::cas(addr, 0, tombstone.word()));
}

/// The three outcomes of a delete that meets another's tombstone (module docs of
/// `swarm_core::protocol::delete`), and whether it may have been first on a majority.
#[test]
fn a_delete_reports_what_it_knows_about_racing_deletes() {
    for (reached, expected, first) in [
        // Writer 2's delete reached both replicas b contacts first: b came second.
        (&[0, 1][..], DeleteOutcome::Absent, FirstDeleter::NotMe),
        // It reached b's second replica only: each came first somewhere (and b is
        // first on the third replica once `first_deleter` completed it there).
        (&[1], DeleteOutcome::Raced, FirstDeleter::Me),
        // It reached the replica b does not contact: b came first on all it heard.
        (&[2], DeleteOutcome::Removed, FirstDeleter::Me),
    ] {
        let cluster = MemCluster::new(3, 1 << 20);
        let a = setup(0, 5, &cluster);
        let b = setup(1, 50, &cluster);
        let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
        block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"v")).unwrap();
        for &p in reached {
            tombstone_on(&cluster, &reg, reg.replicas.node(p), 2);
        }
        let (out, votes) = block_on(
            b.fabric(),
            b.delete_with_votes(&reg, &mut cb, &OpStats::new()),
        )
        .unwrap();
        assert_eq!(
            out, expected,
            "writer 2's tombstone on replicas {reached:?}"
        );
        let who = block_on(b.fabric(), b.first_deleter(&reg, &votes, &OpStats::new())).unwrap();
        assert_eq!(who, first, "writer 2's tombstone on replicas {reached:?}");
        let got = block_on(a.fabric(), a.read(&reg, &mut ca, &OpStats::new())).unwrap();
        assert_eq!(got, ReadValue::Deleted);
    }
}

/// The words of `reg` on `node` after its in-place block: the metadata words, then
/// the delete word.
fn meta_words(cluster: &MemCluster, reg: &RegisterLoc, node: NodeId) -> Vec<Tsp> {
    let l = layout();
    let bytes = node_bytes(
        cluster,
        node,
        reg.offset(0) + l.meta_offset(),
        l.meta_bytes() as u32,
    );
    bytes
        .chunks_exact(8)
        .map(|w| Tsp::from_word(u64::from_le_bytes(w.try_into().unwrap())))
        .collect()
}

/// A read that finds a tombstone on a minority writes it back into the delete words,
/// never into a metadata word: a node's first tombstone is the one it keeps, whoever
/// carried it there, and a later delete counts it as its writer's.
#[test]
fn a_tombstone_written_back_lands_in_the_delete_word_only() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 50, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"v")).unwrap();
    // Writer 2's delete reached the first replica, then its client crashed.
    tombstone_on(&cluster, &reg, reg.replicas.node(0), 2);
    let got = block_on(a.fabric(), a.read(&reg, &mut ca, &OpStats::new())).unwrap();
    assert_eq!(got, ReadValue::Deleted);
    let tomb2 = Tsp::new(
        Timestamp::tombstone(WriterId::new(2).unwrap()),
        Flag::Verified,
    );
    for p in 0..2 {
        let words = meta_words(&cluster, &reg, reg.replicas.node(p));
        let (delete, meta) = words.split_last().unwrap();
        assert_eq!(*delete, tomb2, "replica {p}'s delete word");
        assert!(
            meta.iter().all(|w| !w.is_tombstone()),
            "replica {p}'s metadata words hold no tombstone: {meta:?}"
        );
    }
    let out = block_on(b.fabric(), b.delete(&reg, &mut cb, &OpStats::new())).unwrap();
    assert_eq!(out, DeleteOutcome::Absent, "writer 2 is first on both");
}

/// The in-process fabric, on which chosen replicas fail every batch holding a CAS:
/// a node that failed between two steps of one operation, as the second step sees
/// it (the first one's reads reached it).
struct RefusesCas {
    inner: MemFabric,
    /// By node.
    refusing: Cell<[bool; 3]>,
}

impl RefusesCas {
    /// From now on the replicas of `reg` at `positions` refuse CASes, the others
    /// take them.
    fn refuse(&self, reg: &RegisterLoc, positions: &[usize]) {
        let mut refusing = [false; 3];
        for &p in positions {
            refusing[reg.replicas.node(p).index()] = true;
        }
        self.refusing.set(refusing);
    }
}

impl Fabric for RefusesCas {
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.inner.post(node, batch)
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        let cas = batch.ops().iter().any(|op| matches!(op, Op::Cas { .. }));
        if cas && self.refusing.get()[node.index()] {
            let cause = FailureCause::Crashed;
            return Submitted::Failed(FabricError::NodeFailed { node, cause });
        }
        self.inner.submit(node, batch, reply)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.inner.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.inner.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.inner.progress()
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.inner.wake_at(deadline)
    }
}

/// A delete counts a replica only once its own CAS answered there, even where the
/// client's cache knows a tombstone on it already (`tombstone_round` with votes): a
/// cache may know one replica's tombstone only, from a read whose write-back failed,
/// and a delete that skipped that replica would judge who came first from the other
/// replicas alone. Here writer 2's tombstone is first on replicas 0 and 2 and a read
/// reported the value deleted; a delete that counted replica 0 from the cache and
/// then found replica 1 clean would report that it removed the value.
#[test]
fn a_delete_counts_only_the_replicas_its_own_cas_answered_on() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let c = setup(3, 70, &cluster);
    let refusing = RefusesCas {
        inner: cluster.client(),
        refusing: Cell::new([false; 3]),
    };
    let b = Client::new(
        refusing,
        FixedClock(50),
        layout(),
        WriterId::new(1).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap();
    let reg = reg();
    let (mut ca, mut cb, mut cc) = (
        RegisterCache::new(),
        RegisterCache::new(),
        RegisterCache::new(),
    );
    block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"v")).unwrap();
    // Writer 2's delete reached replica 0, then its client crashed.
    tombstone_on(&cluster, &reg, reg.replicas.node(0), 2);
    // b reads; its write-back of the tombstone fails on replicas 1 and 2: b's cache
    // knows replica 0's tombstone only.
    b.fabric().refuse(&reg, &[1, 2]);
    let _ = block_on(b.fabric(), b.read(&reg, &mut cb, &OpStats::new()));
    assert!(cb.known_max(0).is_tombstone());
    assert!(!cb.known_max(1).is_tombstone() && !cb.known_max(2).is_tombstone());
    // A read without replica 1 writes the tombstone back on replica 2 and reports
    // the value deleted.
    c.fabric().fail_node(reg.replicas.node(1));
    let read = block_on(c.fabric(), c.read(&reg, &mut cc, &OpStats::new())).unwrap();
    assert_eq!(read, ReadValue::Deleted);
    // Replica 1 takes CASes again, replica 2 still refuses them.
    b.fabric().refuse(&reg, &[2]);
    let (out, _) = block_on(
        b.fabric(),
        b.delete_with_votes(&reg, &mut cb, &OpStats::new()),
    )
    .unwrap();
    assert_eq!(
        out,
        DeleteOutcome::Raced,
        "writer 2 came first on replica 0, b on replica 1, and the value was reported \
         deleted before b's delete began"
    );
}

#[test]
fn a_crashed_minority_is_masked_and_a_crashed_majority_stalls() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 9, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    // The primary fails for a: fall back to the third replica.
    a.fabric().fail_node(reg.replicas.node(0));
    let s = OpStats::new();
    block_on(a.fabric(), a.write(&reg, &mut ca, &s, b"x")).unwrap();
    assert_eq!(s.roundtrips(), 2, "one timeout fallback");
    let got = block_on(b.fabric(), b.read(&reg, &mut cb, &OpStats::new())).unwrap();
    assert_eq!(got, ReadValue::Value(b"x".to_vec()));
    a.fabric().fail_node(NodeId(reg.replicas.node(1).0));
    let stalled = block_on_future(a.fabric(), a.read(&reg, &mut ca, &OpStats::new()));
    assert!(matches!(stalled, Err(_) | Ok(Err(_))), "{stalled:?}");
}

#[test]
fn reads_repair_the_in_place_copy_on_a_new_primary() {
    let cluster = MemCluster::new(3, 1 << 20);
    let writer = setup(0, 5, &cluster);
    let reader = setup(1, 9, &cluster);
    let (reg, mut cw, mut cr) = (reg(), RegisterCache::new(), RegisterCache::new());
    block_on(
        writer.fabric(),
        writer.write(&reg, &mut cw, &OpStats::new(), b"x"),
    )
    .unwrap();
    // The primary (in-place data lives there only, §6) fails for the reader.
    reader.fabric().fail_node(reg.replicas.node(0));
    let mut read = |what: &str| {
        let s = OpStats::new();
        let got = block_on(reader.fabric(), reader.read(&reg, &mut cr, &s)).unwrap();
        assert_eq!(got, ReadValue::Value(b"x".to_vec()), "{what}");
        s.roundtrips()
    };
    // A timeout, then the value from an out-of-place buffer.
    assert!(read("read through the timeout") >= 2);
    // The next primary is asked for the value in place, does not have it, and is
    // repaired in the background while the value comes from a buffer.
    assert_eq!(read("read from the new primary"), 2);
    // From now on the new primary answers in place: one roundtrip.
    assert_eq!(read("read after the repair"), 1);
    assert_eq!(read("read after the repair, again"), 1);
}

/// The first write of a fresh register (SWARM §5.3.1): one roundtrip, VERIFIED at
/// once, its prefix and the value in place on the preferred majority, so that a
/// reader takes one roundtrip whichever of them it treats as the primary.
#[test]
fn a_fresh_write_takes_one_roundtrip_and_leaves_a_verified_value_in_place_on_a_majority() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 9, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    let prefix = [0xC3u8; 24];
    let s = OpStats::new();
    let out = block_on(
        a.fabric(),
        a.write_fresh(&reg, &mut ca, &s, b"first", &prefix),
    )
    .unwrap();
    assert_eq!(out, FreshOutcome::Written);
    assert_eq!(s.roundtrips(), 1);
    let verified = Tsp::new(
        Timestamp::new(5, WriterId::new(0).unwrap()).unwrap(),
        Flag::Verified,
    );
    for p in 0..3 {
        let node = reg.replicas.node(p);
        let before = node_bytes(&cluster, node, reg.offset(0) - 24, 24);
        let holds = meta_words(&cluster, &reg, node).contains(&verified);
        // The preferred majority, as any write round (the third on a timeout only).
        let asked = p < 2;
        assert_eq!(before == prefix, asked, "replica {p}'s prefix");
        assert_eq!(holds, asked, "replica {p} holds the write, VERIFIED");
    }
    // Readers return it at once, also with the usual primary out of reach.
    let s = OpStats::new();
    let got = block_on(b.fabric(), b.read(&reg, &mut cb, &s)).unwrap();
    assert_eq!(got, ReadValue::Value(b"first".to_vec()));
    assert_eq!(s.roundtrips(), 1);
    let c = setup(2, 9, &cluster);
    c.fabric().fail_node(reg.replicas.node(0));
    let mut cc = RegisterCache::new();
    let mut read = |what: &str| {
        let s = OpStats::new();
        let got = block_on(c.fabric(), c.read(&reg, &mut cc, &s)).unwrap();
        assert_eq!(got, ReadValue::Value(b"first".to_vec()), "{what}");
        s.roundtrips()
    };
    assert!(read("read through the timeout") >= 2);
    // The next primary already holds the value in place: no buffer fetch, no repair
    // (after an ordinary write this read takes two, `reads_repair_the_in_place_copy_on_a_new_primary`).
    assert_eq!(read("read from the new primary"), 1);
    // Later writes, by the fresh writer and another one, go the common way.
    for (i, (w, cache)) in [(&a, &mut ca), (&b, &mut cb)].into_iter().enumerate() {
        let s = OpStats::new();
        let out = block_on_future(w.fabric(), w.write(&reg, cache, &s, &[i as u8; 3])).unwrap();
        assert_eq!(out, Ok(WriteOutcome::Written));
        assert_eq!(s.roundtrips(), 1, "write {i}");
        let got = block_on(
            c.fabric(),
            c.read(&reg, &mut RegisterCache::new(), &OpStats::new()),
        );
        assert_eq!(got.unwrap(), ReadValue::Value(vec![i as u8; 3]));
    }
}

/// A register that is not fresh is never overwritten below what it holds: the write
/// reports it, and the value it held is still there.
#[test]
fn a_fresh_write_into_a_used_register_reports_it_and_loses_nothing() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 50, &cluster);
    let b = setup(1, 5, &cluster);
    let (reg, mut ca, mut cb) = (reg(), RegisterCache::new(), RegisterCache::new());
    block_on(a.fabric(), a.write(&reg, &mut ca, &OpStats::new(), b"kept")).unwrap();
    let out = block_on(
        b.fabric(),
        b.write_fresh(&reg, &mut cb, &OpStats::new(), b"lost?", &[]),
    )
    .unwrap();
    assert_eq!(out, FreshOutcome::NotFresh);
    let got = block_on(
        a.fabric(),
        a.read(&reg, &mut RegisterCache::new(), &OpStats::new()),
    );
    assert_eq!(got.unwrap(), ReadValue::Value(b"kept".to_vec()));
    // The ordinary write that follows still takes effect.
    let out = block_on(b.fabric(), b.write(&reg, &mut cb, &OpStats::new(), b"next")).unwrap();
    assert_eq!(out, WriteOutcome::Written);
    let got = block_on(
        a.fabric(),
        a.read(&reg, &mut RegisterCache::new(), &OpStats::new()),
    );
    assert_eq!(got.unwrap(), ReadValue::Value(b"next".to_vec()));
}

/// A crashed replica is masked as in any write round: the write needs a majority
/// only, and asks the third replica once one of the preferred two is late.
#[test]
fn a_fresh_write_masks_a_crashed_replica_and_rejects_a_prefix_before_address_0() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let (reg, mut ca) = (reg(), RegisterCache::new());
    a.fabric().fail_node(reg.replicas.node(1));
    let s = OpStats::new();
    let out = block_on(a.fabric(), a.write_fresh(&reg, &mut ca, &s, b"x", b"key"));
    assert_eq!(out.unwrap(), FreshOutcome::Written);
    assert_eq!(s.roundtrips(), 2, "one timeout fallback");
    // With the crashed replica suspected now, the next fresh write asks the others
    // first: one roundtrip.
    let next = RegisterLoc::at(reg.offset(0) + 2048, reg.replicas.clone());
    let s = OpStats::new();
    let out = block_on(
        a.fabric(),
        a.write_fresh(&next, &mut RegisterCache::new(), &s, b"y", b"key"),
    );
    assert_eq!(out.unwrap(), FreshOutcome::Written);
    assert_eq!(s.roundtrips(), 1, "the suspect asked last");
    let got = block_on(
        a.fabric(),
        a.read(&reg, &mut RegisterCache::new(), &OpStats::new()),
    );
    assert_eq!(got.unwrap(), ReadValue::Value(b"x".to_vec()));
    let low = RegisterLoc::at(8, reg.replicas.clone());
    let out = block_on_future(
        a.fabric(),
        a.write_fresh(
            &low,
            &mut RegisterCache::new(),
            &OpStats::new(),
            b"x",
            &[0; 16],
        ),
    )
    .unwrap();
    assert_eq!(
        out,
        Err(swarm_core::SwarmError::PrefixTooLong { len: 16, addr: 8 })
    );
}

/// The out-of-place buffer backs the in-place copies: a reader that finds the
/// in-place copy torn (a write still landing there, or a repair) fetches the buffer.
#[test]
fn a_fresh_write_is_read_from_its_buffer_when_the_in_place_copies_are_torn() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 9, &cluster);
    let (reg, mut ca) = (reg(), RegisterCache::new());
    let out = block_on(
        a.fabric(),
        a.write_fresh(&reg, &mut ca, &OpStats::new(), b"from the buffer", &[]),
    );
    assert_eq!(out.unwrap(), FreshOutcome::Written);
    for p in 0..3 {
        // Eight bytes of the record's hash: its check fails.
        let torn = Batch::write(reg.offset(0) + 16, vec![0xEE; 8]);
        on_node(&cluster, reg.replicas.node(p), torn);
    }
    let s = OpStats::new();
    let got = block_on(b.fabric(), b.read(&reg, &mut RegisterCache::new(), &s)).unwrap();
    assert_eq!(got, ReadValue::Value(b"from the buffer".to_vec()));
    assert_eq!(s.roundtrips(), 2, "the register, then the buffer");
}

/// `read_into` replaces the caller's buffer with the value, whether the common case
/// copies it where it was read or the general path fetches it (a torn in-place
/// copy), and empties it for a register never written.
#[test]
fn read_into_replaces_the_callers_buffer_on_either_path() {
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 9, &cluster);
    let (reg, mut ca) = (reg(), RegisterCache::new());
    let mut value = b"left over".to_vec();
    let read = |value: &mut Vec<u8>| {
        let s = OpStats::new();
        let got = block_on(
            b.fabric(),
            b.read_into(&reg, &mut RegisterCache::new(), &s, value),
        );
        (got.unwrap(), s.roundtrips())
    };
    assert_eq!(read(&mut value), (ReadValue::Empty, 1));
    assert!(value.is_empty());
    block_on(
        a.fabric(),
        a.write(&reg, &mut ca, &OpStats::new(), b"in place"),
    )
    .unwrap();
    value.extend_from_slice(b"left over");
    assert_eq!(read(&mut value), (ReadValue::Value(Vec::new()), 1));
    assert_eq!(value, b"in place");
    // Eight bytes of the in-place record's hash: the buffer is fetched.
    on_node(
        &cluster,
        reg.replicas.node(0),
        Batch::write(reg.offset(0) + 16, vec![0xEE; 8]),
    );
    assert_eq!(read(&mut value), (ReadValue::Value(Vec::new()), 2));
    assert_eq!(value, b"in place");
}

/// A fresh write carrying a store's operation: one batch to every replica at once,
/// the carried operation last in each, what it returned reported per replica, and
/// the write itself as without it. A crashed replica is waited for a patience only:
/// the write still needs a majority, and the carried operation's answers are those
/// of the replicas that answered.
#[test]
fn a_fresh_write_carries_an_operation_to_every_replica_after_the_write() {
    use swarm_core::fabric::{Op, OpOutput};
    let cluster = MemCluster::new(3, 1 << 20);
    let a = setup(0, 5, &cluster);
    let b = setup(1, 9, &cluster);
    let (reg, mut ca) = (reg(), RegisterCache::new());
    // A word of the store's own, far from the register: the carried CAS sets it.
    let flag_at = 1 << 19;
    let carried = Op::Cas {
        addr: flag_at,
        expected: 0,
        new: 7,
    };
    let s = OpStats::new();
    let (out, answers) = block_on(
        a.fabric(),
        a.write_fresh_carrying(&reg, &mut ca, &s, b"first", b"key", carried.clone()),
    )
    .unwrap();
    assert_eq!(out, FreshOutcome::Written);
    assert_eq!(s.roundtrips(), 1);
    let mut nodes: Vec<NodeId> = answers.iter().map(|(n, _)| *n).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [NodeId(0), NodeId(1), NodeId(2)],
        "every replica answered"
    );
    assert!(answers.iter().all(|(_, o)| *o == OpOutput::Cas(0)));
    for node in 0..3 {
        let node = NodeId(node);
        assert_eq!(node_bytes(&cluster, node, flag_at, 8), 7u64.to_le_bytes());
        // The prefix and the VERIFIED word are on every replica, not a majority only.
        assert_eq!(node_bytes(&cluster, node, reg.offset(0) - 3, 3), b"key");
        assert!(
            meta_words(&cluster, &reg, node)
                .iter()
                .any(|t| t.flag() == Flag::Verified)
        );
    }
    let got = block_on(b.fabric(), b.read(&reg, &mut RegisterCache::new(), &s));
    assert_eq!(got.unwrap(), ReadValue::Value(b"first".to_vec()));

    // A crashed replica: the carried operation's answers are the others'.
    let next = RegisterLoc::at(reg.offset(0) + 2048, reg.replicas.clone());
    let down = next.replicas.node(2);
    a.fabric().fail_node(down);
    let s = OpStats::new();
    let (out, answers) = block_on(
        a.fabric(),
        a.write_fresh_carrying(&next, &mut RegisterCache::new(), &s, b"y", b"", carried),
    )
    .unwrap();
    assert_eq!(out, FreshOutcome::Written);
    assert_eq!(answers.len(), 2);
    assert!(
        answers
            .iter()
            .all(|(n, o)| *n != down && *o == OpOutput::Cas(7))
    );
    assert_eq!(s.roundtrips(), 1, "a majority answered at once");
}

/// The fabric `F` as an asynchronous transport would look to the protocol: it
/// forwards everything but [`Fabric::completes_in_submit`] (the default, `false`),
/// so that protocol steps take their general path, with a `Roundtrip`.
struct GeneralPath<F>(F);

impl<F: Fabric> Fabric for GeneralPath<F> {
    fn node_count(&self) -> usize {
        self.0.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.0.post(node, batch)
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        self.0.submit(node, batch, reply)
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.0.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.0.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.0.progress()
    }
    fn now(&self) -> Nanos {
        self.0.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.0.wake_at(deadline)
    }
}

/// A Safe-Guess read whose majority read completes inside `submit` (one plain
/// function, no `Roundtrip`) finds what the general path finds, in as many
/// roundtrips: in the common case, after a write by another writer, and with a
/// crashed replica that holds a post back (the step gives up and the general path
/// times out and falls back) or fails it at once.
#[test]
fn an_immediate_majority_read_matches_the_general_path() {
    use swarm_core::fabric::Crash;
    fn client<F: Fabric>(fabric: F) -> Client<F, FixedClock> {
        Client::new(
            fabric,
            FixedClock(9),
            layout(),
            WriterId::new(1).unwrap(),
            ProtocolConfig::default().with_slow_after_ns(1_000),
        )
        .unwrap()
    }
    // A crash for the readers, or for the writer only: a write that missed replica
    // `crashed` leaves the readers' majority read a maximum that is not known to be
    // on a majority (a write-back), or not in place (a value fetch).
    for (crash, for_writer) in [
        (None, false),
        (Some(Crash::Silent), false),
        (Some(Crash::Erroring), false),
        (Some(Crash::Silent), true),
    ] {
        for crashed in 0..3 {
            // One cluster each, written alike: a read may write back and repair.
            let clusters = [MemCluster::new(3, 1 << 20), MemCluster::new(3, 1 << 20)];
            let reg = reg();
            for cluster in &clusters {
                let writer = setup(0, 5, cluster);
                if let Some(crash) = crash.filter(|_| for_writer) {
                    writer
                        .fabric()
                        .fail_node_as(reg.replicas.node(crashed), crash);
                }
                block_on(
                    writer.fabric(),
                    writer.write(&reg, &mut RegisterCache::new(), &OpStats::new(), b"x"),
                )
                .unwrap();
            }
            let immediate = client(FailNodes::new(clusters[0].client()));
            let general = client(FailNodes::new(GeneralPath(clusters[1].client())));
            assert!(immediate.fabric().completes_in_submit());
            assert!(!general.fabric().completes_in_submit());
            if let Some(crash) = crash.filter(|_| !for_writer) {
                immediate
                    .fabric()
                    .fail_node_as(reg.replicas.node(crashed), crash);
                general
                    .fabric()
                    .fail_node_as(reg.replicas.node(crashed), crash);
            }
            let (mut ci, mut cg) = (RegisterCache::new(), RegisterCache::new());
            for round in 0..3 {
                let (si, sg) = (OpStats::new(), OpStats::new());
                let got_i = block_on(immediate.fabric(), immediate.read(&reg, &mut ci, &si));
                let got_g = block_on(general.fabric(), general.read(&reg, &mut cg, &sg));
                let what =
                    format!("{crash:?} at position {crashed} (writer: {for_writer}), read {round}");
                assert_eq!(got_i.unwrap(), ReadValue::Value(b"x".to_vec()), "{what}");
                assert_eq!(got_g.unwrap(), ReadValue::Value(b"x".to_vec()), "{what}");
                assert_eq!(si.roundtrips(), sg.roundtrips(), "{what}");
                assert_eq!(si.iterations(), sg.iterations(), "{what}");
                assert_eq!(ci, cg, "what the two learned, {what}");
            }
            if crash.is_none() {
                break;
            }
        }
    }
}

/// The fabric `F` without [`Fabric::submit_in_place`] (the default, `None`): a
/// write's first round still runs without a `Roundtrip` (`completes_in_submit`),
/// each batch's answer coming back in a [`Completion`].
struct NoInPlace<F>(F);

impl<F: Fabric> Fabric for NoInPlace<F> {
    fn node_count(&self) -> usize {
        self.0.node_count()
    }
    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.0.post(node, batch)
    }
    fn submit(&self, node: NodeId, batch: &mut Batch, reply: &mut Completion) -> Submitted {
        self.0.submit(node, batch, reply)
    }
    fn completes_in_submit(&self) -> bool {
        self.0.completes_in_submit()
    }
    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.0.poll(ticket)
    }
    fn forget(&self, ticket: Ticket) {
        self.0.forget(ticket)
    }
    fn progress(&self) -> bool {
        self.0.progress()
    }
    fn now(&self) -> Nanos {
        self.0.now()
    }
    fn wake_at(&self, deadline: Nanos) {
        self.0.wake_at(deadline)
    }
}

/// A write's first round whose batches execute in place (`Fabric::submit_in_place`:
/// the metadata words and the CAS answers on the stack) learns what the same
/// batches answer in completions: the same outcomes, roundtrips, cache and memory,
/// through a CAS that finds another writer's tuple in the shared metadata word (a
/// retry), a stale guess (the slow path), and a tombstone (the delete-word probe).
#[test]
fn a_write_round_in_place_learns_what_its_completions_say() {
    fn client<F: Fabric>(fabric: F, writer: u32, clock: u64) -> Client<F, FixedClock> {
        Client::new(
            fabric,
            FixedClock(clock),
            layout(),
            WriterId::new(writer).unwrap(),
            ProtocolConfig::default(),
        )
        .unwrap()
    }
    let reg = reg();
    let clusters = [MemCluster::new(3, 1 << 20), MemCluster::new(3, 1 << 20)];
    let in_place = client(clusters[0].client(), 1, 9);
    let completions = client(NoInPlace(clusters[1].client()), 1, 9);
    assert!(completions.fabric().completes_in_submit());
    let (mut ci, mut cc) = (RegisterCache::new(), RegisterCache::new());
    // Writer 5 shares writer 1's metadata word (4 words); writer 2 writes ahead.
    let others = |cluster: &MemCluster, step: u8| {
        let (writer, clock) = match step {
            1 => (5, 20),
            3 => (2, 90),
            _ => return,
        };
        let other = client(cluster.client(), writer, clock);
        let s = OpStats::new();
        let written = block_on(
            other.fabric(),
            other.write(&reg, &mut RegisterCache::new(), &s, &[step; 8]),
        );
        assert_eq!(written, Ok(WriteOutcome::Written), "writer {writer}");
    };
    for step in 0..6u8 {
        if step == 5 {
            for cluster in &clusters {
                let deleter = client(cluster.client(), 3, 100);
                let s = OpStats::new();
                block_on(
                    deleter.fabric(),
                    deleter.delete(&reg, &mut RegisterCache::new(), &s),
                )
                .unwrap();
            }
        }
        clusters.iter().for_each(|cluster| others(cluster, step));
        let (si, sc) = (OpStats::new(), OpStats::new());
        let got_i = block_on(
            in_place.fabric(),
            in_place.write(&reg, &mut ci, &si, &[step; 20]),
        );
        let got_c = block_on(
            completions.fabric(),
            completions.write(&reg, &mut cc, &sc, &[step; 20]),
        );
        let what = format!("write {step}");
        assert_eq!(got_i, got_c, "{what}");
        let expected = if step == 5 {
            WriteOutcome::Deleted
        } else {
            WriteOutcome::Written
        };
        assert_eq!(got_i, Ok(expected), "{what}");
        assert_eq!(si.roundtrips(), sc.roundtrips(), "{what}");
        assert_eq!(ci, cc, "what the two learned, {what}");
        for p in 0..3 {
            let node = reg.replicas.node(p);
            assert_eq!(
                node_bytes(&clusters[0], node, 0, 1 << 17),
                node_bytes(&clusters[1], node, 0, 1 << 17),
                "{what}: node {node}"
            );
        }
    }
}
