//! An insert that stopped after its index change landed and before it read the
//! answers: others may map, delete and unmap its register meanwhile, and the unmapper
//! owns it from then on (`crate::registers::recycle`). Whatever the insert does when
//! it wakes up, it must never map that register again.

use swarm_core::{DeleteOutcome, Fabric, OpStats, block_on};

use crate::test_support::{MS, poll_once, run_until_stopped, stoppable_pair};

/// One run: a fresh cluster; with `used`, the key's buckets saw a change before (so
/// that the insert reads them first, not a blind round). Client A inserts `k` and
/// stops after `posts` answered posts: its later posts land unanswered, but those to
/// node `slow` (if any), which wait on their way, unapplied. While A is stopped, B looks `k` up
/// (finishing A's change if a quorum holds it, as any lookup may), deletes it and
/// unmaps A's register, which B then owns. A wakes up 5 ms later (past the index's
/// acknowledgement wait, within its operation deadline): its held posts land, and it
/// finishes. Returns `None` if A finished before it stopped, else whether B unmapped
/// A's register while A was stopped.
fn run(used: bool, slow: Option<u16>, posts: usize) -> Option<bool> {
    let (_cluster, a, b) = stoppable_pair(used, slow);
    let s = OpStats::new();
    a.fabric().mute_after(posts);
    let sa = OpStats::new();
    let mut insert = core::pin::pin!(a.insert(b"k", b"a", &sa));
    if !run_until_stopped(a.fabric(), insert.as_mut()) {
        return None;
    }
    // A is stopped. B finds the key (or not), deletes it and unmaps its register.
    let mapped = block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k")).expect("a lookup");
    let mut unmapped = None;
    if let Some(register) = mapped {
        let deleted = block_on(b.fabric(), b.delete(b"k", &s)).expect("a delete");
        assert_eq!(deleted, DeleteOutcome::Removed, "B deletes A's value");
        assert_eq!(
            block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k")).expect("a lookup"),
            None,
            "B's delete unmapped the key"
        );
        assert!(
            b.registers_in_limbo() >= 1,
            "B retired the register it unmapped"
        );
        unmapped = Some(register);
    }
    // A wakes up and finishes its insert.
    a.fabric().sleep(5 * MS);
    a.fabric().wake();
    let result = loop {
        if let core::task::Poll::Ready(result) = poll_once(insert.as_mut()) {
            break result;
        }
        // Time passes while A waits for its slow node.
        a.fabric().sleep(10_000);
        a.fabric().progress();
    };
    let now = block_on(b.fabric(), b.index.resolve(b.fabric(), &s, b"k")).expect("a lookup");
    if let Some(register) = unmapped {
        assert_ne!(
            now,
            Some(register),
            "used {used}, stop after {posts} posts: A's insert ({result:?}) mapped register \
             {register} again after B unmapped it and retired it: one register, two owners"
        );
    }
    Some(unmapped.is_some())
}

/// Every stop point of an insert, into a never-used bucket (a blind round) and into
/// a used one (read first). Before the fix, an insert that stopped right after its
/// index change landed woke up to an unknown outcome (`IndexError::OutcomeUnknown`),
/// looked the key up, found it unmapped by B, and inserted the same register again,
/// which B had retired: B's reset then blanked the key header of a mapped register
/// (the soak's "key header missing on a majority").
#[test]
fn an_insert_stopped_past_its_acknowledgement_never_maps_its_register_again() {
    let mut reached = 0;
    for used in [false, true] {
        for slow in [None, Some(0), Some(1), Some(2)] {
            for posts in 0..64 {
                match run(used, slow, posts) {
                    None => break,
                    Some(unmapped) => reached += usize::from(unmapped),
                }
            }
        }
    }
    assert!(
        reached > 0,
        "no stop point let B unmap A's register while A was stopped: the test tests nothing"
    );
}
