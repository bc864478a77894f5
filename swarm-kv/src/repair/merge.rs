//! What a rebuilt node holds, word by word: the merge of its donors' copies.
//!
//! Every function here takes the copies of one object read from the donors (every
//! member node but the one being rebuilt, read after the quiescence wait: see the
//! parent module) and returns what the rebuilt node gets. Copies are untrusted bytes;
//! nothing here panics on any input. The rules, by kind of word, and why each is
//! safe (the parent module's docs give the common argument: the result must be a
//! value the node could hold as an ordinary node that *missed* some operations, and
//! every value decided on a majority must survive):
//!
//! * **Max registers** (register metadata words, the generation, tick-ceiling, used
//!   and clock words of a client-table row): every change of such a word on a node
//!   raises it (a register's reset too: it installs a life marker above every
//!   earlier word, `crate::registers::reset`). The maximum of the donors is
//!   at least every value written on a majority (a majority that included the lost
//!   node still has a donor in it) and is a value some node holds: [`max_word`].
//! * **Delete words** (after a register's metadata words) hold the node's first
//!   tombstone, written once: which one is first tells racing deletes what to report
//!   (`swarm_core::protocol::delete`). Donors that agree give their word. Donors
//!   that disagree (tombstones of two writers, or one tombstone and an empty word)
//!   give [`swarm_core::UNOWNED_TOMBSTONE`]: the register is deleted there (a
//!   tombstone on a majority shows in a donor, and one on a donor only belongs to a
//!   delete that never completed, which may take effect), but no delete can count
//!   the node as its own or as one other writer's, which copying either word could
//!   make it do wrongly. [`delete_word`].
//! * **Lease words** go up in the order `(counter, killed)` (a renewal raises the
//!   counter, a kill sets bit 63 on the same counter, a new owner starts above every
//!   counter it saw, `crate::membership::lease`), so they are max registers in that order:
//!   [`lease_word`].
//! * **Claim words** (a client-table row's owner token, a chunk's claim token) go
//!   `0 → token → 0`: no order. If the donors agree, or show one token besides zeros,
//!   the node gets it: a token owned on a majority shows up in a donor, and two
//!   distinct tokens cannot both be owned. If the donors show two distinct tokens
//!   the node gets [`POISON_TOKEN`], a token no client has (tokens are odd): for that
//!   word the node then answers like a crashed one, which the claim protocol
//!   tolerates, instead of possibly handing a majority to a token that lost.
//!   [`claim_word`]. Key-header holder tags follow the same rule ([`holder_tag`]).
//! * **Timestamp-lock words** (the first word of a log slot, SWARM §3.3): a word
//!   never changes its mode for a timestamp and only climbs to higher ones, so the
//!   donors' maximum is safe *unless* the donors show both modes at the top
//!   timestamp. Copying either mode could then give that mode a majority it never
//!   had while the other mode's TRYLOCK already returned true (two modes winning is
//!   exactly what Theorem B.2 forbids). The node then gets a word just above that
//!   timestamp ([`swarm_core::encoding::LockWord::above`]): every TRYLOCK of that
//!   timestamp fails on it (a failed TRYLOCK is always safe: the read or write takes
//!   its slow path), and later timestamps of the slot's writer climb over it.
//!   [`lock_word`].
//! * **Index acceptors** (a bucket's meta word, one Paxos acceptor per node): the
//!   highest promise and the accepted value a proposer would have to finish, by the
//!   index's own rule (`crate::index::bucket::newest_accepted`: the value of the
//!   newest ballot, or nothing if that is a fast-round value some donor lacks). That
//!   is the
//!   classic rebuild of an acceptor from a majority: any value chosen is accepted on a
//!   majority, so a donor shows it or a higher-ballot proposal (which carries the same
//!   value), and any promise made on a majority shows in a donor. A fast-round value
//!   that not every donor holds is not copied: it is not decided, and copying it could
//!   hand it a unanimity it never had; nor is any older value, all of which are done
//!   or dead once a fast round replaced them. [`meta_word`].
//!   Index slots hold decided changes with serial-number tags: the newest tag wins,
//!   as in a lookup's merge ([`slot_word`]).
//! * **Records** (a register's in-place block, a log slot's record): each validates
//!   itself (tsp and xxh3-128); the valid copy with the highest tsp wins, and no valid
//!   copy gives zeros (a node that never received the record): [`record`].
//! * **Key headers**: the key written before the register is published, and blanked
//!   (length 0 in word 0) on every replica by a reset; donors that disagree on a non-empty key cannot
//!   happen while resets need every replica, and give zeros if they do
//!   ([`key_header`]). Word 0 (length and holder tag) is one state of one life,
//!   `(0, t)` pooled, `(len, 0)` keyed, `(len, t)` retired, `(0, t)` reset again, so a
//!   kept key takes the holder tag of the donors that show that key only. A blank
//!   donor beside a keyed one is an inserter's write that did not reach it (an
//!   inserter stopped between its writes, whose mapping was decided anyway) or a
//!   reset still on its way: its pool tag combined with the key would read as a
//!   retirement that never happened, and a reclaimer takes a keyed register whose
//!   tag is gone (`crate::registers::limbo`, rule 2) while the index still maps it.
//! * **Log summaries**: the valid copy with the highest stamp (stamps are
//!   generations, which only go up), else zeros ([`summary`]).

use swarm_core::encoding::{LockMode, LockWord};
use swarm_core::layout::decode_record;
use swarm_core::summary::LogSummary;

use crate::index::bucket::newest_accepted;
use crate::index::word::{Ballot, Meta, Slot};
use crate::membership::lease::{counter, is_killed};

/// The claim token a rebuilt node gets where its donors show two distinct owners:
/// even, so no client's token (always odd) ever equals it.
pub const POISON_TOKEN: u64 = 2;

/// The holder tag a rebuilt node gets where its donors show two distinct holders:
/// bit 31 clear, so it is no client's tag, and bit 30 clear, so it is no donation's
/// (`crate::registers::limbo::is_donated`).
pub const POISON_TAG: u32 = 1;

/// How many words a merge could not copy safely and poisoned instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conflicts {
    /// Claim words and holder tags given a poison value.
    pub claims: u64,
    /// Lock words that showed both modes at their top timestamp.
    pub locks: u64,
    /// Key headers whose donors named different keys.
    pub keys: u64,
}

impl Conflicts {
    /// All conflicts.
    pub fn total(&self) -> u64 {
        self.claims + self.locks + self.keys
    }
}

/// A register's delete word: the donors' word if they agree, else a tombstone that
/// is no writer's first (see the module docs).
pub fn delete_word(copies: &[u64]) -> u64 {
    match copies.split_first() {
        None => 0,
        Some((first, rest)) if rest.iter().all(|w| w == first) => *first,
        Some(_) => swarm_core::UNOWNED_TOMBSTONE.word(),
    }
}

/// The largest word.
pub fn max_word(copies: &[u64]) -> u64 {
    copies.iter().copied().max().unwrap_or(0)
}

/// The most advanced lease word, in the order `(counter, killed)`.
pub fn lease_word(copies: &[u64]) -> u64 {
    copies
        .iter()
        .copied()
        .max_by_key(|w| (counter(*w), is_killed(*w)))
        .unwrap_or(0)
}

/// A claim word (see the module docs).
pub fn claim_word(copies: &[u64], conflicts: &mut Conflicts) -> u64 {
    sole_owner(copies, POISON_TOKEN, conflicts)
}

/// A key header's holder tag (same rule as [`claim_word`]).
pub fn holder_tag(copies: &[u32], conflicts: &mut Conflicts) -> u32 {
    sole_owner(copies, POISON_TAG, conflicts)
}

/// The one non-zero value among `copies` (zero if none), or `poison` if there are
/// two distinct ones.
fn sole_owner<T: Copy + Eq + Default>(copies: &[T], poison: T, conflicts: &mut Conflicts) -> T {
    let mut owner = T::default();
    for &c in copies.iter().filter(|c| **c != T::default()) {
        if owner == T::default() {
            owner = c;
        } else if owner != c {
            conflicts.claims += 1;
            return poison;
        }
    }
    owner
}

/// A timestamp-lock word (see the module docs).
pub fn lock_word(copies: &[u64], conflicts: &mut Conflicts) -> u64 {
    let top = copies
        .iter()
        .map(|w| LockWord::from_word(*w))
        .max()
        .unwrap_or(LockWord::BOTTOM);
    let Some(ts) = top.ts() else {
        return 0;
    };
    let both = [LockMode::Read, LockMode::Write]
        .iter()
        .all(|m| copies.contains(&LockWord::new(ts, *m).word()));
    if both {
        conflicts.locks += 1;
        return LockWord::above(ts).word();
    }
    top.word()
}

/// An index bucket's meta word: the highest promise among the copies that decode,
/// and the accepted value a proposer holding them would have to finish (an empty
/// acceptor if none decodes).
pub fn meta_word(copies: &[u64]) -> u64 {
    let metas = copies.iter().filter_map(|w| Meta::decode(*w).ok());
    let Some(mut promised) = metas.clone().map(|m| m.promised).reduce(Ballot::newest) else {
        return Meta::EMPTY.encode();
    };
    // Two values under one classic ballot only come from corrupted memory: keep
    // the first one seen rather than nothing.
    let accepted = newest_accepted(metas.clone()).unwrap_or_else(|_| {
        metas
            .filter(|m| !m.fast)
            .filter_map(|m| m.accepted)
            .reduce(|a, b| if b.0.is_newer_than(a.0) { b } else { a })
            .map(|(b, p)| (b, p, false))
    });
    if let Some((ballot, _, _)) = accepted {
        promised = promised.newest(ballot);
    }
    Meta {
        promised,
        accepted: accepted.map(|(b, p, _)| (b, p)),
        fast: accepted.is_some_and(|a| a.2),
    }
    .encode()
}

/// An index slot word: the copy with the newest tag among those that decode.
pub fn slot_word(copies: &[u64]) -> u64 {
    copies
        .iter()
        .filter_map(|w| Some((*w, Slot::decode(*w).ok()?)))
        .reduce(|a, b| if b.1.tag.is_newer_than(a.1.tag) { b } else { a })
        .map_or(0, |(w, _)| w)
}

/// A record area (a register's in-place block, a log slot after its lock word):
/// the valid copy with the highest tsp, or zeros. `out` has the area's length.
pub fn record(copies: &[&[u8]], payload_max: u32, out: &mut [u8]) {
    let mut best: Option<(u64, usize)> = None;
    let mut scratch = vec![0u8; out.len()];
    for (i, copy) in copies.iter().enumerate() {
        let Some(bytes) = copy.get(..out.len()) else {
            continue;
        };
        scratch.copy_from_slice(bytes);
        if let Some(r) = decode_record(&mut scratch, payload_max) {
            let tsp = r.tsp.word();
            if best.is_none_or(|(b, _)| tsp > b) {
                best = Some((tsp, i));
            }
        }
    }
    match best {
        Some((_, i)) => out.copy_from_slice(&copies[i][..out.len()]),
        None => out.fill(0),
    }
}

/// A key header (`[len u32 | holder tag u32 | key]`): the one key the donors name
/// (zeros if none, or if they name different ones) with the merged holder tag.
pub fn key_header(copies: &[&[u8]], key_max: u32, out: &mut [u8], conflicts: &mut Conflicts) {
    out.fill(0);
    let len_of = |c: &[u8]| -> Option<u32> {
        let len = u32::from_le_bytes(c.get(0..4)?.try_into().ok()?);
        (len != 0 && len <= key_max && 8 + len as usize <= out.len()).then_some(len)
    };
    let mut key: Option<&[u8]> = None;
    let mut disagree = false;
    for c in copies {
        let Some(len) = len_of(c) else { continue };
        let k = &c[..8 + len as usize];
        match key {
            None => key = Some(k),
            Some(prev) if prev[..4] != k[..4] || prev[8..] != k[8..] => disagree = true,
            Some(_) => {}
        }
    }
    let tag_of = |c: &[u8]| Some(u32::from_le_bytes(c.get(4..8)?.try_into().ok()?));
    // Length and tag are one word of one life's state: a kept key takes the tag of
    // the copies that show it, never a blank copy's pool or reset tag (module docs).
    let tags: Vec<u32> = match key {
        Some(k) if !disagree => copies
            .iter()
            .filter(|c| len_of(c).is_some() && c[..4] == k[..4] && c.get(8..k.len()) == k.get(8..))
            .filter_map(|c| tag_of(c))
            .collect(),
        _ => copies.iter().filter_map(|c| tag_of(c)).collect(),
    };
    if disagree {
        conflicts.keys += 1;
    } else if let Some(k) = key {
        out[..4].copy_from_slice(&k[..4]);
        out[8..k.len()].copy_from_slice(&k[8..]);
    }
    let tag = holder_tag(&tags, conflicts);
    out[4..8].copy_from_slice(&tag.to_le_bytes());
}

/// A writer's log-summary area: the valid copy with the highest stamp, or zeros.
pub fn summary(copies: &[&[u8]], slots: u32, out: &mut [u8]) {
    let stamp = |c: &[u8]| -> Option<u64> {
        let s = u64::from_le_bytes(c.get(8..16)?.try_into().ok()?);
        LogSummary::decode(c, s, slots).ok().map(|_| s)
    };
    let best = copies
        .iter()
        .filter_map(|c| Some((stamp(c)?, *c)))
        .max_by_key(|(s, _)| *s);
    out.fill(0);
    if let Some((_, c)) = best {
        let n = out.len().min(c.len());
        out[..n].copy_from_slice(&c[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::word::Proposal;
    use proptest::prelude::*;
    use swarm_core::encoding::{Flag, Timestamp, Tsp, WriterId};
    use swarm_core::layout::encode_record;

    fn ts(ticks: u64, writer: u16) -> Timestamp {
        Timestamp::new(ticks, WriterId::new(u32::from(writer)).unwrap()).unwrap()
    }

    #[test]
    fn claims_copy_one_owner_and_poison_two() {
        let mut c = Conflicts::default();
        assert_eq!(claim_word(&[0, 0], &mut c), 0);
        assert_eq!(claim_word(&[0, 7], &mut c), 7);
        assert_eq!(claim_word(&[7, 7], &mut c), 7);
        assert_eq!(c.total(), 0);
        assert_eq!(claim_word(&[7, 9], &mut c), POISON_TOKEN);
        assert_eq!(holder_tag(&[0x8000_0001, 0x8000_0002], &mut c), POISON_TAG);
        // Two donations of one register write two words: a rebuilt node never
        // shows the earlier donation's word beside a donor with the later one's.
        let (first, second) = (
            crate::registers::limbo::donated_tag(5),
            crate::registers::limbo::donated_tag(9),
        );
        assert_eq!(holder_tag(&[first, first], &mut c), first);
        assert_eq!(holder_tag(&[first, second], &mut c), POISON_TAG);
        assert!(!crate::registers::limbo::is_donated(POISON_TAG));
        assert_eq!(c.claims, 3);
    }

    #[test]
    fn lease_words_order_kills_after_their_counter_and_new_owners_above() {
        use crate::membership::lease::KILLED;
        assert_eq!(lease_word(&[5, 5 | KILLED]), 5 | KILLED);
        assert_eq!(
            lease_word(&[5 | KILLED, 6]),
            6,
            "a new owner's counter is above"
        );
        assert_eq!(lease_word(&[3, 9, 4]), 9);
    }

    #[test]
    fn lock_words_take_the_top_unless_both_modes_hold_it() {
        let mut c = Conflicts::default();
        let r = LockWord::new(ts(10, 3), LockMode::Read).word();
        let w = LockWord::new(ts(10, 3), LockMode::Write).word();
        let older = LockWord::new(ts(9, 3), LockMode::Write).word();
        assert_eq!(lock_word(&[0, 0], &mut c), 0);
        assert_eq!(lock_word(&[r, older], &mut c), r);
        assert_eq!(lock_word(&[w, 0], &mut c), w);
        assert_eq!(c.locks, 0);
        let poisoned = LockWord::from_word(lock_word(&[r, w], &mut c));
        assert_eq!(c.locks, 1);
        assert!(
            poisoned.ts() > Some(ts(10, 3)),
            "both TRYLOCKs of ts fail on it"
        );
        assert!(
            poisoned.ts() < Some(ts(11, 3)),
            "the writer's next ts climbs over it"
        );
        let last = swarm_core::encoding::MAX_WRITERS - 1;
        let top = LockWord::above(ts(10, last));
        assert!(top.ts() > Some(ts(10, last)) && top.ts() < Some(ts(11, last)));
    }

    #[test]
    fn acceptors_take_the_highest_promise_and_accepted_value() {
        let set = |slot, register| Proposal::Set { slot, register };
        let a = Meta {
            promised: Ballot(7),
            accepted: Some((Ballot(5), set(1, 40))),
            fast: false,
        };
        let b = Meta::accepting(Ballot(6), set(2, 80), false);
        let garbage = 5; // nothing accepted, but a value: does not decode
        let merged = Meta::decode(meta_word(&[a.encode(), b.encode(), garbage])).unwrap();
        assert_eq!(merged.promised, Ballot(7));
        assert_eq!(merged.accepted, Some((Ballot(6), set(2, 80))));
        assert_eq!(meta_word(&[garbage]), Meta::EMPTY.encode());
        // A fast-round value some donor lacks is not decided, and what it replaced was
        // done: nothing is copied but the promise.
        let fast = Meta::accepting(Ballot(9), set(3, 90), true);
        let merged = Meta::decode(meta_word(&[a.encode(), fast.encode()])).unwrap();
        assert_eq!((merged.promised, merged.accepted), (Ballot(9), None));
        assert!(!merged.fast);
        // Every donor holds it: it may be decided, and is copied as it is.
        let merged = Meta::decode(meta_word(&[fast.encode(), fast.encode()])).unwrap();
        assert_eq!(merged, fast);
    }

    #[test]
    fn index_slots_take_the_newest_tag() {
        use crate::index::word::SlotState;
        let slot = |tag, register| {
            Slot {
                tag: Ballot(tag),
                state: SlotState::Used { fp: 3, register },
            }
            .encode()
        };
        assert_eq!(
            slot_word(&[slot(4, 10), slot(9, 20), slot(7, 30)]),
            slot(9, 20)
        );
        // Serial-number order: 2 is newer than 65,530 (the ballots wrapped).
        assert_eq!(slot_word(&[slot(65_530, 10), slot(2, 20)]), slot(2, 20));
        assert_eq!(slot_word(&[]), 0);
    }

    #[test]
    fn records_take_the_newest_valid_copy() {
        let len = encode_record(Tsp::new(ts(1, 0), Flag::Guessed), b"x").len() + 16;
        let pad = |mut v: Vec<u8>| {
            v.resize(len, 0);
            v
        };
        let old = pad(encode_record(Tsp::new(ts(3, 1), Flag::Guessed), b"old"));
        let new = pad(encode_record(Tsp::new(ts(4, 1), Flag::Guessed), b"new"));
        let mut torn = new.clone();
        torn[33] ^= 1;
        let mut out = vec![9u8; len];
        record(&[&old, &torn], 64, &mut out);
        assert_eq!(out, old, "a torn newer copy does not win");
        record(&[&old, &new], 64, &mut out);
        assert_eq!(out, new);
        record(&[&torn, &vec![0; len]], 64, &mut out);
        assert!(out.iter().all(|b| *b == 0));
    }

    #[test]
    fn delete_words_are_copied_only_when_the_donors_agree() {
        use swarm_core::encoding::{Flag, Timestamp, Tsp, WriterId};
        let tomb = |w| {
            Tsp::new(
                Timestamp::tombstone(WriterId::new(w).unwrap()),
                Flag::Verified,
            )
        };
        let (t1, t2) = (tomb(1).word(), tomb(2).word());
        let unowned = swarm_core::UNOWNED_TOMBSTONE.word();
        assert_eq!(delete_word(&[t1, t1]), t1);
        assert_eq!(delete_word(&[0, 0]), 0);
        assert_eq!(
            delete_word(&[t1, 0]),
            unowned,
            "one donor's first is not ours"
        );
        assert_eq!(delete_word(&[t2, t1]), unowned, "not the larger one either");
        assert!(
            Tsp::from_word(unowned).is_tombstone(),
            "the register is deleted"
        );
        assert_eq!(delete_word(&[]), 0);
    }

    #[test]
    fn key_headers_keep_the_one_key() {
        let mut c = Conflicts::default();
        let mut h = crate::layout::encode_key_header(b"key");
        h.resize(24, 0);
        h[4..8].copy_from_slice(&0x8000_0005u32.to_le_bytes());
        let zero = vec![0u8; 24];
        let mut out = vec![0u8; 24];
        key_header(&[&zero, &h], 16, &mut out, &mut c);
        assert_eq!(out, h);
        let mut other = crate::layout::encode_key_header(b"kez");
        other.resize(24, 0);
        key_header(&[&other, &h], 16, &mut out, &mut c);
        assert_eq!(&out[..4], &[0; 4], "different keys: no key");
        assert_eq!(c.keys, 1);
    }

    #[test]
    fn a_kept_key_takes_the_tag_of_the_donors_that_show_it() {
        let header = |key: &[u8], tag: u32| {
            let mut h = crate::layout::encode_key_header(key);
            h.resize(24, 0);
            h[4..8].copy_from_slice(&tag.to_le_bytes());
            h
        };
        let tag_of = |h: &[u8]| u32::from_le_bytes(h[4..8].try_into().unwrap());
        let mut c = Conflicts::default();
        let mut out = vec![0u8; 24];
        // Keyed, and blank with a pool's tag (an insert write that did not reach it):
        // keyed, not retired.
        let mut pooled = vec![0u8; 24];
        pooled[4..8].copy_from_slice(&0x8000_0007u32.to_le_bytes());
        key_header(&[&header(b"key", 0), &pooled], 16, &mut out, &mut c);
        assert_eq!(out, header(b"key", 0));
        key_header(&[&pooled, &header(b"key", 0)], 16, &mut out, &mut c);
        assert_eq!(out, header(b"key", 0));
        // Retired on one donor, reset on the other (a reset on its way): retired.
        key_header(
            &[&header(b"key", 0x8000_0005), &pooled],
            16,
            &mut out,
            &mut c,
        );
        assert_eq!(out, header(b"key", 0x8000_0005));
        // A retirement mark that reached one of two keyed donors is kept.
        key_header(
            &[&header(b"key", 0), &header(b"key", 0x8000_0005)],
            16,
            &mut out,
            &mut c,
        );
        assert_eq!(tag_of(&out), 0x8000_0005);
        // Blank donors only: the one tag, as for claims.
        key_header(&[&[0u8; 24], &pooled], 16, &mut out, &mut c);
        assert_eq!(out, pooled);
        assert_eq!(c.claims, 0);
    }

    proptest! {
        #[test]
        fn merges_never_panic(words in proptest::collection::vec(any::<u64>(), 0..5),
                              bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut c = Conflicts::default();
            let _ = (max_word(&words), lease_word(&words), claim_word(&words, &mut c));
            let _ = (lock_word(&words, &mut c), meta_word(&words), slot_word(&words));
            let _ = delete_word(&words);
            let copies = [&bytes[..], &bytes[..bytes.len() / 2]];
            let mut out = vec![0u8; 64];
            record(&copies, 16, &mut out);
            key_header(&copies, 16, &mut out, &mut c);
            summary(&copies, 64, &mut out);
        }

        #[test]
        fn the_merge_of_max_words_is_at_least_every_copy(words in proptest::collection::vec(any::<u64>(), 1..5)) {
            let m = max_word(&words);
            prop_assert!(words.iter().all(|w| *w <= m) && words.contains(&m));
            let mut c = Conflicts::default();
            let l = lock_word(&words, &mut c);
            let top = words.iter().map(|w| LockWord::from_word(*w)).max().unwrap();
            prop_assert!(LockWord::from_word(l) >= top);
        }
    }
}
