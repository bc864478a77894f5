//! An insert stopped past its deadline ends with an unknown outcome; its fresh
//! register must come back (retired, if never mapped) or stay with its owner (the
//! key, or the client that unmapped it), never be leaked or given two owners.

use swarm_core::{DeleteOutcome, Fabric, OpStats, block_on};

use crate::KvError;
use crate::test_support::{MS, poll_once, run_until_stopped, stoppable_pair};

/// What one run ended with.
#[derive(Debug, Default)]
struct Reached {
    /// Runs whose insert ended undecided (queued for judgement).
    undecided: usize,
    /// Of those, registers retired by the judgement, and left to another owner.
    retired: usize,
    owned_elsewhere: usize,
    /// Runs where B recycled the register it unmapped into a new life before A
    /// judged it.
    reused: usize,
}

/// One run: A inserts `k` and stops after `posts` answered posts (posts to `slow`
/// wait unapplied); meanwhile B, if `b_deletes`, deletes `k` if the index maps it
/// (retiring the register it unmaps). A wakes up past its operation's deadline, so
/// its insert ends `Fenced`, and if it could not tell whether it mapped its register,
/// A judges that register: it must end mapped, in B's limbo, or in A's limbo,
/// exactly one of them.
fn run(
    used: bool,
    slow: Option<u16>,
    posts: usize,
    b_deletes: bool,
    reached: &mut Reached,
) -> bool {
    let (_cluster, a, b) = stoppable_pair(used, slow);
    let s = OpStats::new();
    a.fabric().mute_after(posts);
    let sa = OpStats::new();
    let mut insert = core::pin::pin!(a.insert(b"k", b"a", &sa));
    if !run_until_stopped(a.fabric(), insert.as_mut()) {
        return false;
    }
    let b_limbo = b.registers_in_limbo();
    let mapped = block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k")).expect("a lookup");
    if b_deletes && mapped.is_some() {
        let deleted = block_on(b.fabric(), b.delete(b"k", &s)).expect("a delete");
        assert_eq!(deleted, DeleteOutcome::Removed, "B deletes A's value");
    }
    let b_unmapped = b.registers_in_limbo() > b_limbo;
    if b_unmapped {
        // B lets the register's grace pass, resets it, and inserts another key, into
        // that register if it is the first its pool hands out: a new life A's
        // judgement must not take for its insert's value.
        let grace = b.layout().params.register_grace_ns() + 5 * MS;
        swarm_core::block_on_future(b.fabric(), swarm_core::sleep(b.fabric(), grace))
            .expect("a sleep");
        for _ in 0..8 {
            let absent = block_on(b.fabric(), b.delete(b"absent", &s)).expect("a delete");
            assert_eq!(absent, DeleteOutcome::Absent);
        }
        block_on(b.fabric(), b.insert(b"k2", b"b", &s)).expect("an insert");
        let k2 = block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k2")).expect("a lookup");
        reached.reused += usize::from(k2.is_some() && k2 == mapped);
    }
    // A wakes up past its deadline (50 ms).
    a.fabric().sleep(60 * MS);
    a.fabric().wake();
    let result = loop {
        if let core::task::Poll::Ready(result) = poll_once(insert.as_mut()) {
            break result;
        }
        a.fabric().sleep(10_000);
        a.fabric().progress();
    };
    let Some(register) = a.undecided_registers().first().copied() else {
        return true; // The insert knew what it did.
    };
    assert!(
        matches!(result, Err(KvError::Swarm(_) | KvError::Index(_))),
        "an undecided insert reports an unknown outcome (a fence, an index error), not {result:?}"
    );
    reached.undecided += 1;
    let a_limbo = a.registers_in_limbo();
    let judged = block_on(a.fabric(), a.judge_undecided_inserts()).expect("a judgement");
    assert_eq!(judged, 1, "the register is judged once every node answers");
    let stats = a.undecided_insert_stats();
    assert_eq!(stats.waiting, 0);
    let now = block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k")).expect("a lookup");
    let owners = [
        now == Some(register),
        b_unmapped && mapped == Some(register),
        a.registers_in_limbo() > a_limbo,
    ];
    assert_eq!(
        owners.iter().filter(|o| **o).count(),
        1,
        "used {used}, slow {slow:?}, stop after {posts} posts, B deletes {b_deletes}: register \
         {register} (mapped now, B unmapped it, A retired it) = {owners:?}, judged {stats:?}"
    );
    reached.retired += usize::from(stats.retired == 1);
    reached.owned_elsewhere += usize::from(stats.owned_elsewhere == 1);
    true
}

/// Every stop point of an insert, with and without a delete by another client while
/// it is stopped (which then recycles the register into another key's life). Before the queue of undecided inserts, the register of an insert
/// that stalled past its deadline was neither mapped nor anybody's: a leak for good.
#[test]
fn an_insert_with_an_unknown_outcome_leaves_its_register_to_exactly_one_owner() {
    let mut reached = Reached::default();
    for used in [false, true] {
        for slow in [None, Some(0), Some(2)] {
            for b_deletes in [false, true] {
                for posts in 0..64 {
                    if !run(used, slow, posts, b_deletes, &mut reached) {
                        break;
                    }
                }
            }
        }
    }
    assert!(
        reached.retired > 0 && reached.owned_elsewhere > 0 && reached.reused > 0,
        "the stop points never gave both verdicts, so the test tests too little: {reached:?}"
    );
}
