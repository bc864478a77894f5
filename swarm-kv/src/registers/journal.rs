//! The repair journal: how recycled registers keep coming back while a repair
//! rebuilds a node (issue 12; superblock version 5, [`crate::layout`]).
//!
//! # The problem it solves
//!
//! A register's reset must reach every replica (`crate::registers::recycle`, "how: the reset"):
//! a replica that kept the old words (a tombstone at a high timestamp) would make the
//! next key on that register read as deleted. A replica whose memory is *lost* needs
//! no reset, since the repair that brings it back rebuilds it from the others; but a
//! reset that lands on those others *after the repair's copy read them* would leave
//! the rebuilt node with the old words. Until this journal, clients therefore stopped
//! leaving the node out of resets once a repair was announced, and no register came
//! back from the announcement to the admission: a lease and a half of waiting plus
//! the copy. A workload with inserts and deletes stalled once its spare registers
//! were gone (2.8 s on a 64 MiB cluster).
//!
//! # The journal
//!
//! Every writer id has a row of [`SLOTS`] words on every node, after the client
//! table. During a repair of node `X`, only the row on the *journal node*
//! [`journal_node`] (the lowest-numbered node other than `X`, the repair's first
//! donor) is used:
//!
//! 1. A client that follows a configuration announcing the repair of `X` resets a
//!    register `R` on its other replicas only. Once every one of them acknowledged
//!    the reset, it writes [`entry`]`(R, life)` into a free slot of its row (a CAS expecting
//!    zero, so that a slot left by an earlier incarnation of its writer id is never
//!    overwritten) and keeps `R` out of its pool.
//! 2. The repair reads the journal between the pieces of its copy (and throughout its
//!    quiescence wait). For every entry it copies `R`'s slot from the donors to `X`,
//!    exactly as the copy does (`crate::repair::merge`), and only then clears the
//!    entry (a CAS from the entry to zero). An entry whose register some donor does
//!    not show blank (a stale entry, a late store of an earlier life) is neither
//!    copied nor cleared: a cleared entry must mean that `X` holds the reset.
//! 3. The client sees its slot cleared, with the announcement still on the journal
//!    node ("Whose clear" below), and hands `R` to its allocator.
//! 4. If the client instead sees `X` admitted first (a configuration in which `X`'s
//!    new incarnation is a member), it resets `R` on `X` itself, then clears its slot.
//!
//! # Why the rebuilt node never keeps a reused register's old words
//!
//! A register `R` is reused only once its reset reached every live replica *and* the
//! rebuilt node holds the reset too (or a later state of `R`):
//!
//! * a reset posted by a client that had not seen the announcement left `X` out
//!   without a journal entry: it landed before the copy started, since the repair's
//!   quiescence wait covers a lease observer's wait and the delivery margin (the
//!   argument of `crate::repair`, steps 1 and 2), so the copy reads its result;
//! * a journaled reset had landed on every donor before its entry was written (the
//!   client writes it after their acknowledgements), so the repair's copy of `R`,
//!   taken after it read the entry, reads the reset (or, if the copy of `R`'s piece
//!   comes later, that piece reads it). The repair does this between pieces, in one
//!   task, so no piece can read `R` before the reset and write it after the entry's
//!   copy. `R` is not reused before the entry is cleared, so the copy sees no later
//!   life of `R` that it could make lag;
//! * an entry still waiting at the admission is the client's own business: it resets
//!   `R` on `X` before reusing it. Until then `R` is past its grace (no operation
//!   names it, `crate::registers::recycle`), so what `X` holds for it is never read.
//!
//! A repair's copy of a register is idempotent and yields a state some donor holds, so
//! an entry serviced twice, a stale entry from an earlier repair or a client that
//! died, or a torn read of an entry naming another register only copies a register
//! once more: harmless during a repair. Nothing is ever *written* to `X` for a
//! register outside a repair's copy, except by a client after the admission, on a
//! register of its own past its grace.
//!
//! # A stopped repair
//!
//! A repair process can stop after it read an entry and before its clear (a CAS
//! from the word it read to zero) lands, while a second repair of the same node
//! services and clears the entry and the client reuses the register, resets it
//! again during a repair and journals it again in the same slot (the first free
//! one). If the entry were the register alone, the late clear would find the new
//! entry and clear it, and the client would hand the register out although no
//! repair copied this reset to the node. So an [`entry`] carries the reset's life
//! (a hash of its marker, which every reset takes above every word it read,
//! `crate::registers::reset`): the new entry differs from the one the stale clear
//! expects, and the clear fails. Up to the 24-bit hash: two resets of one register
//! collide with probability `2^-24`. The stopped repair's other late stores (its
//! copies into the node, its configuration records) are `docs/pauses.md`'s hole H3,
//! parts a and c.
//!
//! # Whose clear
//!
//! Entries name no node, and one journal node serves the repairs of many nodes
//! (the lowest-numbered node other than the target: node 0 for every node but
//! itself). A repair services *every* entry it finds: it copies the register to
//! its own target, and clears the entry. So an entry journaled for node `X`'s
//! repair can be cleared by the repair of another node `Y` that runs after `X`'s
//! admission, when the client has not followed that admission yet (it polls its
//! row every millisecond, and follows configurations at its lease renewals):
//! nothing copied `R` to `X`, which keeps `R`'s words from before the reset. Taking
//! that clear for `X`'s copy handed `R` out with `X` lagging by a life: the next
//! fresh write of `R` met the earlier life's marker on `X` (`Recycled`), and a key
//! mapped to `R` could read that life from a quorum with `X`
//! (`tests/many_nodes.rs`, which loses node 27 and then node 1; `docs/pauses.md`,
//! "Found by the soak").
//!
//! The client therefore reads the configuration record after its row, in the same
//! ordered batch on the journal node, and takes a clear for `X`'s copy only if that
//! record is still the announcement it journaled under (the epoch of the
//! configuration it followed, with `X`'s repairing bit and no other,
//! `Recycler::journal_step`). Otherwise it resets `R` again on every replica, as
//! after an admission. Why that is enough, whatever anyone's pauses:
//!
//! * a repair writes its announcement to every donor, the journal node included,
//!   and services the journal only after those writes returned; records are
//!   written only under the repair lock, so they go up one repair at a time
//!   (`crate::repair::lock`). A clear by `Y`'s repair therefore lands after `Y`'s
//!   announcement, whose epoch is above `X`'s, on the journal node, and the record
//!   read after the row that shows the clear shows that epoch or a later one;
//! * a clear by `X`'s own repair read after its admission fails the check too: one
//!   more reset, never a register handed out early;
//! * a repair that died with its repairing bit set leaves that bit in the
//!   announcement of a later repair of another node: with two bits no clear
//!   counts, and the register is reset and journaled again until its node is
//!   admitted (work and a leak while it lasts, never a lagging life on `X`).
//!
//! # Pauses across a repair
//!
//! `docs/pauses.md`'s H3' is a step that counts answers of several nodes one by one,
//! so that a client stopped inside it counts node X's answer from before X lost its
//! memory with others landed after a repair copied them into the rebuilt X. None of
//! the journal's steps is such a count:
//!
//! * the reset that leaves the node out counts its replicas' answers, and it is
//!   journaled only if its lease was still valid at a clock reading after the last
//!   of them (`crate::registers::recycle`, "A reset counted across a repair");
//! * the entry's append, the client's reads of its row and its clear after the
//!   admission are each one CAS or one read on the journal node. A client stopped
//!   anywhere among them at worst finds the node admitted when it wakes, and resets
//!   the register on it again;
//! * the journal node is a donor of the repair. A node that loses its memory answers
//!   as failed from then on (a retired node file on shared memory; over RDMA a
//!   restarted node is left out until it is repaired), and a repair stops,
//!   withdrawing its announcement, when a donor stops answering (`crate::repair`):
//!   no repair admits the node after its journal node lost the entries. Once the
//!   repair is withdrawn, clients hand their journaled registers out, and the next
//!   repair's copy reads their resets on the donors;
//! * the repair's service (copy the register from every donor, then clear the entry)
//!   runs under the repair lock, so no donor is repaired between its reads and its
//!   clear (`docs/pauses.md`, H3).
//!
//! # What it costs
//!
//! One CAS per recycled register on the journal node while a repair runs, one read of
//! the client's row per millisecond while it waits, and for the repair one read of
//! the journal area per piece (`writers × 1 KiB`). Outside a repair nothing.
//!
//! # Limits
//!
//! A client has [`SLOTS`] entries in flight; more wait for a slot. A repair that
//! fails after its announcement leaves entries waiting until the next repair services
//! them or admits the node (running `swarm repair` again does both). Their registers
//! come back once the client sees the node lost with no repair announced (the next
//! repair's copy reads their resets on the donors), but their slots stay out of use
//! for the client's incarnation, at most [`SLOTS`] per client.

use swarm_core::encoding::Tsp;
use swarm_core::fabric::NodeId;
use xxhash_rust::xxh3::xxh3_64;

/// Entries per writer's row.
pub const SLOTS: usize = 128;

/// Bytes of one writer's row.
pub const ROW_BYTES: u64 = 8 * SLOTS as u64;

/// The node whose journal serves the repair of `target`: the lowest-numbered other
/// node (the repair's first donor), or `None` in a one-node cluster.
pub fn journal_node(target: NodeId, nodes: usize) -> Option<NodeId> {
    (0..nodes as u16).map(NodeId).find(|&n| n != target)
}

/// Low bits of an entry that name the register (plus one); the bits above carry the
/// life (see [`entry`]).
pub const REGISTER_BITS: u32 = 40;

const REGISTER_MASK: u64 = (1 << REGISTER_BITS) - 1;

/// The journal word naming `register` of a cluster of `registers` registers, reset to
/// the life marked `life` (never zero, so that zero is a free slot): `register + 1`
/// in the low 40 bits (`REGISTER_BITS`), and 24 bits of a hash of the marker above them.
/// A later reset of the same register journals another word (its marker is higher),
/// so the late clear of a stopped repair, which expects the word it read, fails on
/// it (see "A stopped repair" in the module docs). A cluster of `2^40 − 1` registers or
/// more (nodes of 64 TiB and more) journals `register + 1` alone.
pub fn entry(register: u64, life: Tsp, registers: u64) -> u64 {
    let named = register.wrapping_add(1);
    if registers >= REGISTER_MASK {
        return named;
    }
    let life_bits = xxh3_64(&life.word().to_le_bytes()) >> REGISTER_BITS;
    (named & REGISTER_MASK) | (life_bits << REGISTER_BITS)
}

/// The register a nonzero journal word read from untrusted memory names, if it names
/// one of the cluster's `registers` (whatever life it carries, [`entry`]).
pub fn entry_register(word: u64, registers: u64) -> Option<u64> {
    let named = if registers >= REGISTER_MASK {
        word
    } else {
        word & REGISTER_MASK
    };
    named.checked_sub(1).filter(|&r| r < registers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_node_is_the_lowest_other_node() {
        assert_eq!(journal_node(NodeId(0), 3), Some(NodeId(1)));
        assert_eq!(journal_node(NodeId(2), 3), Some(NodeId(0)));
        assert_eq!(journal_node(NodeId(0), 1), None);
    }

    #[test]
    fn entries_name_registers_and_never_zero() {
        let life = Tsp::reset_marker(1).unwrap();
        assert_eq!(entry_register(entry(0, life, 10), 10), Some(0));
        assert_eq!(entry_register(entry(9, life, 10), 10), Some(9));
        assert_eq!(entry_register(0, 10), None, "zero is a free slot");
        assert_eq!(
            entry_register(entry(10, life, 10), 10),
            None,
            "out of range"
        );
        assert_ne!(entry(u64::MAX - 1, life, u64::MAX), 0);
        assert_eq!(entry_register(entry(7, life, 1 << 41), 1 << 41), Some(7));
    }

    #[test]
    fn two_lives_of_one_register_journal_different_words() {
        let (one, two) = (Tsp::reset_marker(5).unwrap(), Tsp::reset_marker(6).unwrap());
        assert_ne!(entry(3, one, 10), entry(3, two, 10));
        assert_eq!(entry_register(entry(3, two, 10), 10), Some(3));
    }
}
