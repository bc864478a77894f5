//! Finishing a crashed client's operations from its embedded operation log (FUSEE §5.3,
//! Algorithm 3's RecoverClient).
//!
//! A client's objects are linked in allocation order from its log head (`prev`/`next`
//! in every object, §4.5), and allocation order is the order of its writes. A write
//! that crashed left one of:
//!
//! * an object whose log holds the old value (the client was the last writer and
//!   crashed before or after CASing the primary): if the primary still holds that old
//!   value, the round is unfinished and the master settles the slot (every alive copy
//!   takes a backup's value, which is the client's own after rules 1-3);
//! * an object without an old value (it crashed in ① or ②): if its value reached a
//!   backup copy of one of the key's candidate slots, losers of that round may wait for
//!   it forever, so the master settles that slot too;
//! * or nothing at all to do.
//!
//! Settled logs are marked committed by the master, so a second recovery does nothing.
//! Losers that wait too long also ask the master to settle their slot, so recovery is
//! not needed for liveness; it finishes crashed writes without waiting for the next
//! writer of the key. The walk reads every object of the client: like FUSEE's log
//! scan, it costs one roundtrip per object.

use swarm_core::{Batch, Fabric, NodeId, OpStats};

use crate::error::FuseeError;
use crate::layout::FuseeLayout;
use crate::master::{Failure, Master, all_or_failed};
use crate::object::{self, COMMITTED, OLD_PRESENT};
use crate::slot::{KeyHash, SLOTS_PER_BUCKET, SlotValue};
use swarm_core::sleep as pause;

/// Finishes the unfinished writes of crashed client `cid`; returns how many slots were
/// settled. Call it only for a client that will not run again.
pub async fn recover_client<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &FuseeLayout,
    master: &Master,
    cid: u16,
    timeout_ns: u64,
) -> Result<usize, FuseeError> {
    let stats = OpStats::new();
    let mut settled = 0;
    let read =
        |node: NodeId, addr: u64, len: u64| read_at(fabric, &stats, node, addr, len, timeout_ns);
    while master.is_preparing() {
        pause(fabric, 2_000).await;
    }
    let view = master.view();
    let head = word(&read(view.primary, layout.log_head(cid), 8).await?);
    let ob = layout.object_bytes();
    let mut addr = head;
    let mut prev = 0;
    let total = layout.params().blocks * u64::from(layout.params().objects_per_block);
    for _ in 0..total {
        if !layout.is_object(addr) {
            break;
        }
        let bytes = read(master.view().primary, addr, ob).await?;
        let Ok(o) = object::decode(&bytes, addr, ob) else {
            break; // never written: the end of the log
        };
        if o.log.prev != prev {
            break;
        }
        if o.used && o.log.old != COMMITTED {
            let hash = KeyHash::of(&o.key, layout.params().buckets);
            let v_new = SlotValue {
                addr,
                fingerprint: hash.fingerprint,
                tombstone: o.kind == object::Kind::Tombstone,
            }
            .encode();
            let mut slots = Vec::new();
            if o.log.old & OLD_PRESENT != 0 && layout.is_slot(o.log.slot) {
                let v_old = o.log.old & !OLD_PRESENT;
                let s0 = word(&read(master.view().primary, o.log.slot, 8).await?);
                if s0 == v_old {
                    slots.push(o.log.slot);
                }
            } else {
                for b in hash.buckets {
                    let base = layout.bucket(b);
                    for node in master.view().nodes() {
                        let bucket = read(node, base, (SLOTS_PER_BUCKET * 8) as u64).await?;
                        for (s, chunk) in bucket.chunks_exact(8).enumerate() {
                            let slot = base + 8 * s as u64;
                            if Some(word(chunk)) == v_new && !slots.contains(&slot) {
                                slots.push(slot);
                            }
                        }
                    }
                }
            }
            for slot in slots {
                let epoch = master.view().epoch;
                master
                    .recover(fabric, layout, epoch, 0, Some(slot), timeout_ns)
                    .await?;
                settled += 1;
            }
        }
        prev = addr;
        addr = o.log.next;
    }
    Ok(settled)
}

async fn read_at<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    node: NodeId,
    addr: u64,
    len: u64,
    timeout_ns: u64,
) -> Result<Vec<u8>, FuseeError> {
    let posts = vec![(node, Batch::read(addr, len as u32))];
    match all_or_failed(fabric, stats, posts, timeout_ns).await {
        Ok(mut r) => Ok(r.remove(0).1.take_read(0).unwrap_or_default()),
        Err(Failure::Fatal(e)) => Err(e),
        Err(Failure::Nodes(mask)) => Err(FuseeError::NodesUnreachable { mask }),
    }
}

fn word(bytes: &[u8]) -> u64 {
    bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .unwrap_or(0)
}
