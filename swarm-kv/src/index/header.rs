//! Telling keys apart: reading the key headers of fingerprint matches.
//!
//! A slot holds a 20-bit fingerprint, not the key. When an update must know whether
//! a slot's register belongs to *its* key (an insert finding the key already there, a
//! remove checking the register it was given), it reads the register's key header
//! (`crate::layout::NodeLayout::key_header`), which the KV layer writes to a majority
//! of the register's replicas before indexing the register and never changes while
//! it is indexed.
//!
//! A replica may lag behind the header write, so a majority of the replicas is read
//! and judged together: unwritten copies are ignored, and written ones must agree.
//! The replicas, not the index's nodes: on a cluster with more nodes than replicas,
//! a majority of all nodes may hold no copy at all (`Index::header_holders`; an
//! insert of a present key failed with `KeyHeader { problem: Missing }` there).
//!
//! A copy read while its write is still landing may be *torn* (writes tear at 8-byte
//! granularity, SWARM §2.1): its length there and some key bytes not yet, or still
//! the key of the register's earlier life (a reset blanks only word 0,
//! `crate::registers::reset`). The majority read holds a whole copy (the header reached a majority before the register was indexed), so a
//! torn copy can only disagree with it, never decide alone. [`judge`] lets a quorum
//! of byte-identical copies outvote it (torn copies are fewer than a quorum), and
//! reports the disagreement otherwise; [`verify`] then reads every replica's copy
//! again, after a growing pause, until a quorum agrees or the write has landed
//! ([`HEADER_REREADS`] times at most). So a copy torn for good (a writer that died
//! mid-write) costs one more roundtrip while a quorum of whole copies is reachable.
//! Found by the randomized `tests/delete_race_sim.rs`, where late header writes land
//! word by word in random order. The `u32`
//! after the length is the register's *holder tag* (`crate::registers::limbo`), which its retiree
//! sets once the register is unmapped: it is ignored here (a register's header is
//! written once per life, and a reset blanks every copy before the next life).

use swarm_core::fabric::{Batch, FabricError, NodeId, Op};
use swarm_core::quorum::{broadcast_until_among, preferred_step_reporting_late};
use swarm_core::{Fabric, OpStats};

use super::error::HeaderProblem;
use super::{Index, IndexError};

/// Bytes of a key header to read to compare it with a key of `key_len` bytes.
pub fn read_len(key_len: usize) -> u32 {
    (8 + key_len).next_multiple_of(8) as u32
}

/// What one copy of a key header says about `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Copy {
    /// Not (yet) written on that node, or garbage.
    Blank,
    /// A header, for `key` or not.
    Written { same: bool },
}

fn judge_copy(bytes: &[u8], key: &[u8], key_max: u32) -> Copy {
    let field = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    // Bytes 4..8 (the holder tag) are not judged.
    let (Some(len), Some(_tag)) = (field(0), field(4)) else {
        return Copy::Blank;
    };
    if len == 0 || len > key_max {
        return Copy::Blank;
    }
    let same = len as usize == key.len() && bytes.get(8..8 + key.len()) == Some(key);
    Copy::Written { same }
}

/// Whether copies of one register's key header (at least `quorum` of its replicas'
/// copies) name `key`.
///
/// Unwritten copies are ignored, and written ones that agree decide. Written copies
/// that disagree mean a torn copy (module docs): then a header that `quorum` copies
/// hold byte for byte (length and key; the holder tag aside) decides, since at most
/// `replicas - quorum` copies can be torn (the header was whole on a majority before
/// the register was indexed, and a whole copy stays whole for the register's life),
/// fewer than a quorum. Otherwise [`HeaderProblem::Inconsistent`]: read more copies,
/// or again.
pub fn judge<C: AsRef<[u8]>>(
    copies: &[C],
    key: &[u8],
    key_max: u32,
    quorum: usize,
) -> Result<bool, HeaderProblem> {
    let written: Vec<(&[u8], bool)> = copies
        .iter()
        .map(AsRef::as_ref)
        .filter_map(|copy| match judge_copy(copy, key, key_max) {
            Copy::Written { same } => Some((copy, same)),
            Copy::Blank => None,
        })
        .collect();
    let Some(&(_, first)) = written.first() else {
        return Err(HeaderProblem::Missing);
    };
    if written.iter().all(|&(_, same)| same == first) {
        return Ok(first);
    }
    // The length and the key, not the holder tag between them.
    let same_header = |a: &[u8], b: &[u8]| a.get(..4) == b.get(..4) && a.get(8..) == b.get(8..);
    written
        .iter()
        .find(|&&(copy, _)| {
            written
                .iter()
                .filter(|&&(other, _)| same_header(copy, other))
                .count()
                >= quorum
        })
        .map(|&(_, same)| same)
        .ok_or(HeaderProblem::Inconsistent)
}

/// How many times the index reads a majority of a register's key header copies again
/// when they disagree (a copy read while its write was landing) before an insert,
/// remove or replace fails with [`HeaderProblem::Inconsistent`]
/// ([`super::IndexError::KeyHeader`]). An insert's pauses double from
/// [`super::IndexConfig::retry_delay_ns`] up to its `max_backoff_ns`: with the
/// defaults, about a third of a millisecond in all, hundreds of times a write's
/// delivery; a remove or replace reads again at each of its next attempts, after
/// their backoff.
pub const HEADER_REREADS: u32 = 8;

/// Reads the key headers of `registers` from a majority of each one's replicas (one
/// roundtrip per four registers replicated on every node, else per register; one
/// more per re-read of copies that disagree) and tells, for each, whether it names
/// `key`.
pub async fn verify<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    registers: &[u64],
    key: &[u8],
) -> Result<Vec<bool>, IndexError> {
    let len = read_len(key.len());
    let key_max = ix.layout.params.key_max;
    let mut out = Vec::with_capacity(registers.len());
    let mut rest = registers;
    while let Some(&first) = rest.first() {
        // A header lives on its register's replicas only. Registers on every node
        // share them: up to four headers per batch then.
        let (order, q, _) = ix.header_holders(fabric, first)?;
        let take = if order.len() == ix.cluster_nodes && order.len() == ix.nodes {
            rest.len().min(swarm_core::fabric::INLINE_BATCH_OPS)
        } else {
            1
        };
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        // Each register's location: its header sits before its offset on each
        // replica, the same on every one unless a placement record says otherwise.
        let mut locs = Vec::with_capacity(chunk.len());
        for &register in chunk {
            locs.push(ix.header_holders(fabric, register)?.2);
        }
        let read = |node: NodeId| {
            let mut batch = Batch::new();
            for loc in &locs {
                // Every register of a chunk of several is on every node.
                let addr = ix
                    .layout
                    .header_on(loc, node)
                    .ok_or(FabricError::UnplacedReplica { node })?;
                batch.push(Op::Read { addr, len })?;
            }
            Ok(batch)
        };
        let mut pause = ix.config.retry_delay_ns;
        for reread in 0..=HEADER_REREADS {
            // First a preferred majority; once copies disagreed, every holder, so
            // that a quorum of whole copies can outvote a torn one (`judge`).
            let rt = if reread == 0 {
                preferred_step_reporting_late(
                    fabric,
                    stats,
                    &order,
                    q,
                    ix.config.slow_after_ns,
                    read,
                    |replies| replies.len() >= q,
                    |node| ix.late(fabric, node),
                )
                .await?
            } else {
                broadcast_until_among(
                    fabric,
                    stats,
                    order.iter().copied(),
                    q,
                    ix.config.slow_after_ns,
                    |node| read(node).map(Some),
                    |replies| replies.len() == order.len(),
                )
                .await?
            };
            let judged: Result<Vec<bool>, (u64, HeaderProblem)> = chunk
                .iter()
                .enumerate()
                .map(|(k, &register)| {
                    let copies: Vec<&[u8]> =
                        rt.replies().iter().filter_map(|(_, c)| c.read(k)).collect();
                    judge(&copies, key, key_max, q).map_err(|problem| (register, problem))
                })
                .collect();
            match judged {
                Ok(same) => {
                    out.extend(same);
                    break;
                }
                // A copy read mid-write (module docs): read again once it landed.
                Err((register, HeaderProblem::Inconsistent)) if reread < HEADER_REREADS => {
                    tracing::debug!(
                        register,
                        reread,
                        "index: key header copies disagree (one read while its write landed); reading again"
                    );
                    drop(rt);
                    swarm_core::sleep(fabric, pause).await;
                    pause = pause.saturating_mul(2).min(ix.config.max_backoff_ns);
                }
                Err((register, problem)) => {
                    return Err(IndexError::KeyHeader { register, problem });
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::encode_key_header;
    use proptest::prelude::*;

    fn header(key: &[u8], tag: u32) -> Vec<u8> {
        let mut h = encode_key_header(key);
        h[4..8].copy_from_slice(&tag.to_le_bytes());
        h
    }

    #[test]
    fn written_copies_decide_and_the_holder_tag_is_ignored() {
        let key = b"apple";
        let blank = vec![0u8; 16];
        assert_eq!(
            judge(&[header(key, 0), blank.clone()], key, 64, 2),
            Ok(true)
        );
        assert_eq!(
            judge(&[blank.clone(), header(b"pear", 0)], key, 64, 2),
            Ok(false)
        );
        assert_eq!(
            judge(&[blank.clone(), blank.clone()], key, 64, 2),
            Err(HeaderProblem::Missing)
        );
        // A retiree tagged one copy: the key is still judged the same.
        assert_eq!(
            judge(&[header(key, 0x8000_0001), header(key, 0)], key, 64, 2),
            Ok(true)
        );
        assert_eq!(
            judge(
                &[header(b"pear", 0x8000_0001), header(b"pear", 0)],
                key,
                64,
                2
            ),
            Ok(false)
        );
        assert_eq!(
            judge(&[header(key, 1), header(b"other", 0)], key, 64, 2),
            Err(HeaderProblem::Inconsistent)
        );
        // Copies that disagree: one read torn (its length landed, its key not yet,
        // or still a resetter's token). A quorum of whole copies outvotes it; one
        // whole copy against a torn one decides nothing.
        let mut torn = header(key, 0);
        torn[8..].fill(0);
        let mut token = header(key, 0);
        token[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
        for torn in [&torn, &token] {
            let whole = header(key, 0);
            let tagged = header(key, 0x8000_0001);
            assert_eq!(judge(&[&whole, torn, &tagged], key, 64, 2), Ok(true));
            assert_eq!(
                judge(&[&whole, torn], key, 64, 2),
                Err(HeaderProblem::Inconsistent)
            );
        }
        // Another key's header, one copy torn: the whole ones still say "not this key".
        let pear = header(b"pear", 0);
        let mut torn_pear = pear.clone();
        torn_pear[8..].fill(0);
        assert_eq!(judge(&[&torn_pear, &pear, &pear], key, 64, 2), Ok(false));
        assert_eq!(judge(&[&torn_pear, &pear, &pear], b"pear", 64, 2), Ok(true));
        // Longer than the limit: garbage.
        assert_eq!(
            judge(&[header(key, 0)], key, 4, 1),
            Err(HeaderProblem::Missing)
        );
        assert_eq!(read_len(5), 16);
        assert_eq!(read_len(8), 16);
        assert_eq!(read_len(9), 24);
    }

    proptest! {
        #[test]
        fn judging_garbage_never_panics(copies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
                                        key in proptest::collection::vec(any::<u8>(), 0..20)) {
            let _ = judge(&copies, &key, 32, 2);
        }
    }
}
