//! Regressions found by the soak (`scripts/soak.sh`: client processes under a nemesis
//! that loses, corrupts and repairs nodes), replayed deterministically in one process.

use std::time::{Duration, Instant};

use swarm_core::fabric::{Batch, Completion, Crash, Submitted};
use swarm_core::{Fabric, NodeId, OpStats, block_on};
use swarm_kv::admin::RepairOptions;
use swarm_kv::{ClusterParams, ShmStore, Store};
use swarm_shm::{ScratchDir, ShmCluster};

const MS: u64 = 1_000_000;

/// The soak's short leases: a lost majority shows within a second.
fn params() -> ClusterParams {
    ClusterParams {
        key_max: 32,
        value_max: 64,
        writers: 8,
        lease_ns: 1_000 * MS,
        lease_renew_ns: 200 * MS,
        max_op_ns: 200 * MS,
        cache_ttl_ns: 1_000 * MS,
        ..ClusterParams::default()
    }
}

const NO_WAIT: RepairOptions = RepairOptions {
    quiesce_ns: Some(0),
    replace: false,
    ..RepairOptions::DEFAULT
};

/// A process that opened the cluster while a repair copied node 1 registered its
/// writer id on nodes 0 and 2 only: the copy had read the client table already. Once
/// node 1 is admitted, its copy of the row's claim word is not the client's, so its
/// lease renewals counted on nodes 0 and 2 alone, and the loss of node 2 then cost it
/// its lease ("could not be renewed"), although nodes 0 and 1 are a majority. The
/// owner of a row on a majority takes the stale copies, as a claim that wins does.
#[test]
fn a_client_registered_during_a_repair_keeps_its_lease_when_another_node_is_lost() {
    let dir = ScratchDir::new("kv-soak-register-during-repair").unwrap();
    let path = dir.path().to_path_buf();
    let store = ShmStore::create(&path, 3, 32 << 20, params()).unwrap();
    ShmCluster::retire_node(&path, 1).unwrap();
    // The first piece of the copy is the client table: the client registers after it.
    let mut late = None;
    ShmStore::repair(&path, 1, NO_WAIT, |_, _| {
        if late.is_none() {
            let opened = ShmStore::open(&path).unwrap();
            let c = opened.client().unwrap();
            block_on(c.fabric(), c.insert(b"k", b"v", &OpStats::new())).unwrap();
            late = Some((opened, c));
        }
    })
    .unwrap();
    drop(store);
    let (opened, c) = late.expect("the repair copied more than one piece");
    let put = |n: u64| {
        let value = format!("v{n}");
        block_on(
            c.fabric(),
            c.insert(b"k", value.as_bytes(), &OpStats::new()),
        )
    };
    // The client follows the admission within a renewal period.
    let admitted = ShmCluster::open(&path)
        .unwrap()
        .incarnation_of(NodeId(1))
        .unwrap();
    let start = Instant::now();
    let mut n = 0;
    while opened.shm().incarnation_of(NodeId(1)) != Some(admitted) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the client never admitted node 1"
        );
        put(n).unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // A few renewals with node 1 in service.
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        put(n).unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    ShmCluster::retire_node(&path, 2).unwrap();
    // Three leases on nodes 0 and 1 alone.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Err(error) = put(n) {
            panic!("operation {n} on nodes 0 and 1 failed: {error}");
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let value = block_on(c.fabric(), c.get(b"k", &OpStats::new())).unwrap();
    assert_eq!(value, Some(format!("v{}", n - 1).into_bytes()));
}

/// Reads the word at `at` on `node` of the cluster in `path` (a raw fabric: no client).
fn word_on(path: &std::path::Path, node: u16, at: u64) -> u64 {
    let raw = std::sync::Arc::new(ShmCluster::open_quietly(path).unwrap());
    let fabric = raw.client();
    let mut batch = Batch::read(at, 8);
    let mut reply = Completion::new();
    match fabric.submit(NodeId(node), &mut batch, &mut reply) {
        Submitted::Done => u64::from_le_bytes(reply.read(0).unwrap().try_into().unwrap()),
        other => panic!("not executed at once: {other:?}"),
    }
}

/// Writes `word` at `at` on `node` of the cluster in `path`.
fn write_on(path: &std::path::Path, node: u16, at: u64, word: u64) {
    let raw = std::sync::Arc::new(ShmCluster::open_quietly(path).unwrap());
    let fabric = raw.client();
    let mut batch = Batch::write(at, word.to_le_bytes().to_vec());
    let mut reply = Completion::new();
    assert!(matches!(
        fabric.submit(NodeId(node), &mut batch, &mut reply),
        Submitted::Done
    ));
}

/// A client hands a journaled register out once the repair cleared its entry: the
/// clear must mean that the rebuilt node holds the register's reset. The repair skips
/// the copy of a register that a donor does not show blank (a late store of an earlier
/// life, a torn read, a stale entry), and used to clear that entry all the same: the
/// client then pooled the register while the rebuilt node kept its earlier life, and
/// its next insert there found another life's marker (the soak's `Recycled` on an
/// insert). A skipped entry is kept now (its client resets the register again on
/// every replica once the node is admitted); a blank register's entry is cleared.
#[test]
fn a_journal_entry_whose_register_a_donor_shows_in_use_is_not_cleared() {
    let dir = ScratchDir::new("kv-soak-journal-skip").unwrap();
    let path = dir.path().to_path_buf();
    let store = ShmStore::create(&path, 3, 32 << 20, params()).unwrap();
    let layout = *store.layout();
    drop(store);
    let (used, blank) = (7, 8);
    // Register 7 holds a key header on donor 2 (a late insert write, say); 8 is blank.
    write_on(&path, 2, layout.key_header(used).unwrap(), 5);
    // Writer 3's journal row on the journal node of a repair of node 1 (node 0).
    let journal = swarm_kv::testing::journal::journal_node(NodeId(1), 3).unwrap();
    let slot = |s| layout.journal_slot(3, s).unwrap();
    write_on(
        &path,
        journal.0,
        slot(0),
        swarm_kv::testing::journal::entry(
            used,
            swarm_core::encoding::Tsp::reset_marker(1).unwrap(),
            layout.params.registers,
        ),
    );
    write_on(
        &path,
        journal.0,
        slot(1),
        swarm_kv::testing::journal::entry(
            blank,
            swarm_core::encoding::Tsp::reset_marker(1).unwrap(),
            layout.params.registers,
        ),
    );
    ShmCluster::retire_node(&path, 1).unwrap();
    let report = ShmStore::repair(&path, 1, NO_WAIT, |_, _| {}).unwrap();
    assert_eq!(report.journaled, 1, "{report:?}");
    assert_eq!(
        word_on(&path, journal.0, slot(0)),
        swarm_kv::testing::journal::entry(
            used,
            swarm_core::encoding::Tsp::reset_marker(1).unwrap(),
            layout.params.registers,
        ),
        "the entry of a register the repair did not copy was cleared"
    );
    assert_eq!(
        word_on(&path, journal.0, slot(1)),
        0,
        "a blank register's entry"
    );
}

/// While a node is out, resets donate nothing (`crate::registers::recycle`,
/// "donations"), so a client that deletes what it inserted piles its registers up in
/// its pool, and nothing ever made the pool give them up once the node was back: the
/// soak's new processes found "0 free, N reclaimable: registers still in a live
/// client's hands", and running ones "register area is full". A pool above its bound
/// donates the rest once every node serves again.
#[test]
fn a_pool_that_grew_while_a_node_was_out_is_donated_once_it_is_back() {
    let dir = ScratchDir::new("kv-soak-pool-shed").unwrap();
    let path = dir.path().to_path_buf();
    // Small chunks: a pool sheds above 24 chunks' worth, down to 16.
    let params = ClusterParams {
        writers: 4,
        chunk_registers: 32,
        ..params()
    };
    let store = ShmStore::create(&path, 3, 6 << 20, params).unwrap();
    let registers = store.layout().params.registers;
    assert!(registers >= 2048, "{registers} registers");
    let c = store.client().unwrap();
    let op = |result: Result<(), swarm_kv::KvError>, what: &str| {
        if let Err(error) = result {
            panic!("{what}: {error}");
        }
    };
    ShmCluster::retire_node(&path, 2).unwrap();
    // Node 2 lost: most of the area goes through c's pool.
    let first = registers * 7 / 10;
    for i in 0..first {
        let key = format!("c{i}");
        op(
            block_on(c.fabric(), c.insert(key.as_bytes(), b"v", &OpStats::new())),
            "insert",
        );
    }
    for i in 0..first {
        let key = format!("c{i}");
        block_on(c.fabric(), c.delete(key.as_bytes(), &OpStats::new())).unwrap();
    }
    // Past the register grace, resets (without node 2) fill c's pool.
    let until = Instant::now() + Duration::from_millis(2_500);
    let mut n = 0;
    while Instant::now() < until {
        op(
            block_on(
                c.fabric(),
                c.insert(b"one", format!("{n}").as_bytes(), &OpStats::new()),
            ),
            "insert",
        );
        n += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    ShmStore::repair(&path, 2, NO_WAIT, |_, _| {}).unwrap();
    // c follows the admission and keeps writing.
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        op(
            block_on(
                c.fabric(),
                c.insert(b"one", format!("{n}").as_bytes(), &OpStats::new()),
            ),
            "insert",
        );
        n += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    // Another client needs more than the chunks nobody claimed.
    let d = store.client().unwrap();
    let second = registers * 6 / 10;
    for i in 0..second {
        let key = format!("d{i}");
        op(
            block_on(d.fabric(), d.insert(key.as_bytes(), b"v", &OpStats::new())),
            &format!("insert {i} of {second} by a second client ({registers} registers)"),
        );
    }
}

/// A deferred unmap that failed (a node out, a stall past its deadline on a loaded
/// host) was dropped: the key stayed mapped to its tombstone for good, and `swarm
/// stat` counted it as a key after every process had drained its namespace (the
/// soak's "keys left"). An unmap may run again at any time (it checks the mapping's tag
/// and the register's value first), so a failed one is queued again for a later run.
#[test]
fn a_deferred_unmap_that_failed_runs_again_later() {
    let dir = ScratchDir::new("kv-soak-unmap-retry").unwrap();
    let store = ShmStore::create(dir.path(), 3, 16 << 20, params()).unwrap();
    let a = store
        .client_with(swarm_kv::KvConfig {
            deferred_unmaps: 4,
            ..store.config()
        })
        .unwrap();
    let f = a.fabric();
    block_on(f, a.insert(b"k", b"v", &OpStats::new())).unwrap();
    assert_eq!(
        block_on(f, a.delete(b"k", &OpStats::new())).unwrap(),
        swarm_kv::DeleteOutcome::Removed
    );
    assert!(a.has_deferred_unmaps());
    // Nodes 1 and 2 out for this client: the unmap cannot reach a majority.
    f.fail_node_as(NodeId(1), Crash::Erroring);
    f.fail_node_as(NodeId(2), Crash::Erroring);
    let _ = block_on(f, async {
        Ok::<_, swarm_core::FabricError>(a.run_deferred_unmaps().await)
    });
    assert!(
        a.has_deferred_unmaps(),
        "the failed unmap was dropped: the mapping to the tombstone stays for good"
    );
    f.recover_node(NodeId(1));
    f.recover_node(NodeId(2));
    block_on(f, async {
        Ok::<_, swarm_core::FabricError>(a.run_deferred_unmaps().await)
    })
    .unwrap()
    .unwrap();
    assert!(!a.has_deferred_unmaps());
    let b = store.client().unwrap();
    let mapped = block_on(
        b.fabric(),
        b.index().resolve(b.fabric(), &OpStats::new(), b"k"),
    )
    .unwrap();
    assert_eq!(mapped, None, "the key is still mapped to its tombstone");
}

/// A process that opened the cluster while a node's header was corrupted left the
/// node out, without knowing its memory lost: its register resets then needed that
/// node, failed there, and nothing came back to its pool until the repair admitted
/// the rebuilt node (the soak's janitor waited 30 s for one register and failed with
/// "register area is full"). A repair announced for the node says its member memory
/// is gone: the resets go through the repair journal.
#[test]
fn a_client_that_left_a_corrupted_node_out_recycles_through_its_repair() {
    let dir = ScratchDir::new("kv-soak-corrupt-left-out").unwrap();
    let path = dir.path().to_path_buf();
    drop(ShmStore::create(&path, 3, 32 << 20, params()).unwrap());
    // Flip a byte of node 0's checksummed header fields.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path.join("node-0.swarm"))
            .unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, 20).unwrap();
        file.write_all_at(&[byte[0] ^ 0x5a], 20).unwrap();
    }
    let opened = ShmStore::open(&path).unwrap();
    assert!(
        opened.unusable_nodes().iter().any(|(n, _)| n.0 == 0),
        "node 0 is left out"
    );
    let c = opened.client().unwrap();
    let f = c.fabric();
    for i in 0..200 {
        let key = format!("k{i}");
        block_on(f, c.insert(key.as_bytes(), b"v", &OpStats::new())).unwrap();
        block_on(f, c.delete(key.as_bytes(), &OpStats::new())).unwrap();
    }
    // Past the register grace: the resets are due.
    std::thread::sleep(Duration::from_millis(1_800));
    let before = c.recycle_stats().recycled;
    let mut n = 0u64;
    ShmStore::repair(&path, 0, NO_WAIT, |_, _| {
        // The client runs (and renews, and resets) during the copy.
        block_on(
            f,
            c.insert(b"x", format!("{n}").as_bytes(), &OpStats::new()),
        )
        .unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    })
    .unwrap();
    let during = c.recycle_stats().recycled - before;
    assert!(
        during >= 100,
        "{during} registers recycled during the repair (of 200 retired before it)"
    );
}

/// A client killed with a delete's unmap deferred leaves `key → tombstone` in the
/// index (a SIGKILLed churn process, whose namespace a janitor then drained). A
/// delete through the index read that mapping as absent and returned, leaving it:
/// only a re-insert of the key replaced it, so the soak's janitors left the key (and
/// its register) for ever, and `swarm stat` counted "1 keys left" after every
/// namespace was drained. A delete that finds its key mapped to a tombstone unmaps it
/// (conditional on the slot's tag and the key header) and retires the register.
#[test]
fn a_delete_unmaps_a_mapping_to_a_tombstone_that_a_crashed_deleter_left() {
    let dir = ScratchDir::new("kv-soak-unmap-tombstone").unwrap();
    let store = ShmStore::create(dir.path(), 3, 32 << 20, params()).unwrap();
    let layout = *store.layout();
    let count = || swarm_kv::admin::count_keys(&store.fabric(), &layout).unwrap();
    let killed = store
        .client_with(swarm_kv::KvConfig {
            deferred_unmaps: 4,
            ..store.config()
        })
        .unwrap();
    let f = killed.fabric();
    block_on(f, killed.insert(b"k", b"v", &OpStats::new())).unwrap();
    assert_eq!(
        block_on(f, killed.delete(b"k", &OpStats::new())).unwrap(),
        swarm_kv::DeleteOutcome::Removed
    );
    assert!(killed.has_deferred_unmaps());
    // Killed: its queued unmap never runs.
    drop(killed);
    assert_eq!(count(), 1, "the mapping to the tombstone stays");

    let janitor = store.client().unwrap();
    let f = janitor.fabric();
    assert_eq!(
        block_on(f, janitor.delete(b"k", &OpStats::new())).unwrap(),
        swarm_kv::DeleteOutcome::Absent
    );
    assert_eq!(count(), 0, "the delete left the mapping to the tombstone");
    assert_eq!(
        janitor.recycle_stats().retired,
        1,
        "the delete that unmapped the register retires it"
    );
    assert_eq!(
        block_on(f, janitor.get(b"k", &OpStats::new())).unwrap(),
        None
    );
    // The key lives again, in another register or the same one once recycled.
    block_on(f, janitor.insert(b"k", b"w", &OpStats::new())).unwrap();
    assert_eq!(
        block_on(f, janitor.get(b"k", &OpStats::new())).unwrap(),
        Some(b"w".to_vec())
    );
    assert_eq!(count(), 1);
    janitor.close();
}

/// A remove decided on a quorum of a bucket's meta words whose apply never landed (its
/// client stopped right after the accept: a fill's drain fenced on the loaded host)
/// leaves the key in every slot copy, although every lookup finds it absent (a
/// decided change is laid over the slots). `swarm stat` counted one node's slot
/// copies, so the soak found "1 keys left" after every namespace was drained (seed
/// 4343). Keys are counted as lookups read them.
#[test]
fn a_decided_remove_not_applied_yet_is_not_counted_as_a_key() {
    use swarm_kv::testing::index::{Ballot, Meta, Proposal, SLOTS};
    let dir = ScratchDir::new("kv-soak-count-decided").unwrap();
    let path = dir.path().to_path_buf();
    let store = ShmStore::create(&path, 3, 32 << 20, params()).unwrap();
    let layout = *store.layout();
    let count = || swarm_kv::admin::count_keys(&store.fabric(), &layout).unwrap();
    let c = store.client().unwrap();
    block_on(c.fabric(), c.insert(b"k", b"v", &OpStats::new())).unwrap();
    assert_eq!(count(), 1);
    // The key's slot, on node 0.
    let hash = c.index().key_hash(b"k").unwrap();
    let (bucket, slot, tag) = [hash.first, hash.second]
        .into_iter()
        .find_map(|b| {
            (0..SLOTS).find_map(|s| {
                let w = word_on(&path, 0, layout.bucket(b) + 8 * (s as u64 + 1));
                ((w >> 47) & 1 == 1).then_some((b, s, (w >> 48) as u16))
            })
        })
        .expect("the key's slot");
    // A remove accepted on every node under the next ballot, and never applied.
    let meta = Meta::accepting(
        Ballot(tag + 1),
        Proposal::Clear {
            slot: slot as u8,
            nonce: 7,
        },
        false,
    )
    .encode();
    for node in 0..3 {
        write_on(&path, node, layout.bucket(bucket), meta);
    }
    assert_eq!(
        count(),
        0,
        "a key whose remove is decided was counted (every slot copy still maps it)"
    );
    let other = store.client().unwrap();
    assert_eq!(
        block_on(other.fabric(), other.get(b"k", &OpStats::new())).unwrap(),
        None,
        "lookups find the key absent"
    );
}

/// A key header's word 0 is `(length, holder tag)`, and its life goes `(0, t)` (in
/// `t`'s pool) → `(len, 0)` (keyed: published or being published) → `(len, t')`
/// (retired) → `(0, t'')` (reset). An inserter stopped between its header writes (a
/// killed process, a fill fenced on the loaded host) leaves a node it did not reach
/// with the pool's `(0, t)` while a majority holds `(len, 0)`, and its mapping is
/// decided all the same (a helper applies it, with fingerprint 0). The repair used
/// to merge the length and the tag separately: the key from the keyed donor, the one
/// non-zero tag from the other, so the rebuilt node got `(len, t)`, a retirement that
/// never happened. Once `t`'s client was gone, a reclaimer took the register as a
/// gone retiree's limbo (`limbo.rs`, rule 2), reset and reused or donated it while
/// the index still mapped it: the 30-minute soak's index slots mapping registers
/// whose key headers were blank with the donated tag on every node, on which every
/// insert into those buckets failed ("key header ... missing on a majority").
#[test]
fn a_header_keyed_on_one_donor_and_pooled_on_the_other_is_not_rebuilt_retired() {
    let dir = ScratchDir::new("kv-soak-header-merge").unwrap();
    let path = dir.path().to_path_buf();
    let store = ShmStore::create(&path, 3, 32 << 20, params()).unwrap();
    let layout = *store.layout();
    let c = store.client().unwrap();
    block_on(c.fabric(), c.insert(b"k", b"v", &OpStats::new())).unwrap();
    let hash = c.index().key_hash(b"k").unwrap();
    let register = [hash.first, hash.second]
        .into_iter()
        .find_map(|b| {
            (0..swarm_kv::testing::index::SLOTS).find_map(|s| {
                let w = word_on(&path, 0, layout.bucket(b) + 8 * (s as u64 + 1));
                ((w >> 47) & 1 == 1).then_some(w & ((1 << 27) - 1))
            })
        })
        .expect("the key's slot");
    c.close();
    drop(store);
    let header = layout.key_header(register).unwrap();
    let keyed = word_on(&path, 0, header);
    assert_eq!(
        keyed, 1,
        "word 0 of the key header of \"k\": (len 1, no tag)"
    );
    // Node 1 kept the pool's reset: the tag of an inserter that is gone.
    let gone_tag: u64 = 0x8000_0abc;
    write_on(&path, 1, header, gone_tag << 32);
    // Node 2 is lost and rebuilt from nodes 0 and 1.
    ShmCluster::retire_node(&path, 2).unwrap();
    ShmStore::repair(&path, 2, NO_WAIT, |_, _| {}).unwrap();
    let store = ShmStore::open(&path).unwrap();
    let census = swarm_kv::admin::census(&store.fabric(), store.layout()).unwrap();
    assert_eq!(
        census.retired_gone, 0,
        "a reclaimer would take the mapped register as a gone retiree's: {census:?}"
    );
    let rebuilt = word_on(&path, 2, header);
    assert_eq!(
        rebuilt, keyed,
        "the rebuilt header {rebuilt:#x} is not the keyed donor's word: a tag on a keyed \
         header marks the register retired, and a gone tag makes it reclaimable"
    );
    let c = store.client().unwrap();
    assert_eq!(
        block_on(c.fabric(), c.get(b"k", &OpStats::new())).unwrap(),
        Some(b"v".to_vec())
    );
}
