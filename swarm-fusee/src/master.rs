//! FUSEE's master: membership, and the recovery path clients fall back to
//! (FUSEE §5.2 and Appendix A.4, Algorithms 3 and 4).
//!
//! FUSEE relies on a fault-tolerant master with lease-based membership: clients learn
//! the live memory nodes from it, and when a memory node fails (or a client gives up
//! waiting for a last writer that may have crashed) the master
//!
//! 1. **disconnects** the clients: `member_prepare_change`, then waits until no client
//!    can still modify the index under the old membership (a lease expiry);
//! 2. **modifies** the slots: picks each slot's value from an alive backup (backups never
//!    hold a value older than the last committed one, since conflicts are resolved on
//!    the backups before the primary changes) and writes it to every alive copy,
//!    committing the log of operations it finished on a client's behalf;
//! 3. **notifies**: a new membership (epoch), with a new primary if the old one failed.
//!
//! Clients stop at every step while a change is prepared, and every operation that was
//! interrupted learns its fate from the primary of the new membership (Algorithm 4,
//! lines 35-38): its own value (it won), the old value (retry), or another (it lost).
//!
//! **What this implementation simplifies.** The master is an object shared by the
//! clients of one process, and its recovery runs on the fabric handle of the client
//! that asked for it (a "master-like recovery path"), so it works the same on shared
//! memory, the simulator and RDMA. The lease wait of step 1 is exact here: each
//! client step holds a [`StepGuard`] for the time of one roundtrip (bounded by the
//! failure timeout), and the master waits until none is held. A multi-process
//! deployment would need the lease and its clock assumptions. Memory nodes that fail
//! never rejoin. Like FUSEE, the index pauses for writes between a failure and the
//! new membership: detection (a timeout) plus recovery, tens of milliseconds in the
//! paper (SWARM §7.7 measures that pause).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, PoisonError};

use swarm_core::{Batch, Fabric, NodeId, Op, OpStats, Roundtrip, WaitOutcome};
use tracing::{debug, info, warn};

use crate::error::FuseeError;
use crate::layout::FuseeLayout;
use crate::object::{COMMITTED, offset};
use crate::slot::SlotValue;
use swarm_core::sleep as pause;

/// A membership: who is alive and who holds the primary index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Bumped by every change.
    pub epoch: u32,
    /// The node holding the primary index replica.
    pub primary: NodeId,
    /// Bit `i` set: node `i` is alive.
    pub alive: u16,
}

impl View {
    fn encode(self) -> u64 {
        (u64::from(self.epoch) << 32) | (u64::from(self.primary.0) << 16) | u64::from(self.alive)
    }

    fn decode(word: u64) -> Self {
        Self {
            epoch: (word >> 32) as u32,
            primary: NodeId((word >> 16) as u16),
            alive: word as u16,
        }
    }

    /// Alive nodes, primary first.
    pub fn nodes(self) -> impl Iterator<Item = NodeId> {
        core::iter::once(self.primary).chain(self.backups())
    }

    /// Alive nodes holding a backup index replica.
    pub fn backups(self) -> impl Iterator<Item = NodeId> {
        (0..16u16)
            .filter(move |&n| self.alive & (1 << n) != 0 && n != self.primary.0)
            .map(NodeId)
    }
}

/// The master's state, shared by every client of a store.
#[derive(Debug)]
pub struct Master {
    view: AtomicU64,
    preparing: AtomicBool,
    recovering: AtomicBool,
    active: AtomicUsize,
    next_client: AtomicU16,
    max_clients: u16,
    recoveries: AtomicU64,
    /// Slot values a recovery installed on a writer's behalf (from a backup): a writer
    /// interrupted by that recovery learns here that it won, even if a later write
    /// already replaced its value. Values are unique forever, so entries never lie;
    /// the set grows by at most the index's occupied slots per memory-node failure.
    installed: Mutex<HashSet<u64>>,
}

/// A client step in progress under the current membership; see the module docs.
#[derive(Debug)]
pub struct StepGuard<'a>(&'a Master);

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, SeqCst);
    }
}

/// Recovery needs this many bytes per read.
const RECOVERY_READ: u64 = 1 << 20;

impl Master {
    /// A master for `nodes` memory nodes (at most 16), node 0 primary, all alive.
    pub fn new(nodes: usize, max_clients: u16) -> Result<Self, FuseeError> {
        if nodes == 0 || nodes > 16 {
            return Err(FuseeError::InvalidParams(format!(
                "FUSEE runs on 1 to 16 memory nodes, not {nodes}"
            )));
        }
        let view = View {
            epoch: 0,
            primary: NodeId(0),
            alive: ((1u32 << nodes) - 1) as u16,
        };
        Ok(Self {
            view: AtomicU64::new(view.encode()),
            preparing: AtomicBool::new(false),
            recovering: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            next_client: AtomicU16::new(0),
            max_clients,
            recoveries: AtomicU64::new(0),
            installed: Mutex::new(HashSet::new()),
        })
    }

    /// The current membership.
    pub fn view(&self) -> View {
        View::decode(self.view.load(SeqCst))
    }

    /// Whether a membership change is being prepared (clients must not start steps).
    pub fn is_preparing(&self) -> bool {
        self.preparing.load(SeqCst)
    }

    /// Recoveries run so far.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(SeqCst)
    }

    /// Whether a recovery installed the slot value `value` on its writer's behalf.
    pub fn installed(&self, value: u64) -> bool {
        self.installed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&value)
    }

    /// A fresh client id.
    pub fn register_client(&self) -> Result<u16, FuseeError> {
        self.next_client
            .fetch_update(SeqCst, SeqCst, |c| (c < self.max_clients).then_some(c + 1))
            .map_err(|_| FuseeError::TooManyClients {
                max: self.max_clients,
            })
    }

    /// Starts a step under membership `epoch`; `None` if a change is being prepared or
    /// the membership moved on.
    pub fn enter(&self, epoch: u32) -> Option<StepGuard<'_>> {
        if self.is_preparing() {
            return None;
        }
        self.active.fetch_add(1, SeqCst);
        let guard = StepGuard(self);
        if self.is_preparing() || self.view().epoch != epoch {
            return None;
        }
        Some(guard)
    }

    /// Recovers from a failure seen under membership `seen_epoch`: `suspects` (a node
    /// mask) did not answer in time, and/or `slot` has a round nobody finished. If
    /// another client is already recovering, or did since `seen_epoch`, waits for the
    /// new membership instead. Must be called without holding a [`StepGuard`].
    pub async fn recover<F: Fabric + ?Sized>(
        &self,
        fabric: &F,
        layout: &FuseeLayout,
        seen_epoch: u32,
        suspects: u16,
        slot: Option<u64>,
        timeout_ns: u64,
    ) -> Result<(), FuseeError> {
        // A node failure seen under an old membership was handled by that change; an
        // unfinished round is settled whatever happened since.
        let done = || slot.is_none() && self.view().epoch != seen_epoch;
        loop {
            if done() {
                return Ok(());
            }
            if self
                .recovering
                .compare_exchange(false, true, SeqCst, SeqCst)
                .is_ok()
            {
                break;
            }
            pause(fabric, 2_000).await;
        }
        if done() {
            self.recovering.store(false, SeqCst);
            return Ok(());
        }
        // 1. Disconnect: no new steps, and wait for the steps in flight.
        self.preparing.store(true, SeqCst);
        while self.active.load(SeqCst) > 0 {
            pause(fabric, 1_000).await;
        }
        let old = self.view();
        let mut alive = old.alive & !suspects;
        info!(
            epoch = old.epoch,
            suspects,
            ?slot,
            "FUSEE master: membership change prepared"
        );
        // 2. Modify: make every alive copy equal (a node failing meanwhile is removed too).
        let result = loop {
            if alive == 0 {
                break Err(FuseeError::NoLiveNodes);
            }
            let view = View {
                epoch: old.epoch,
                primary: if alive & (1 << old.primary.0) != 0 {
                    old.primary
                } else {
                    NodeId(alive.trailing_zeros() as u16)
                },
                alive,
            };
            let ranges = match slot {
                Some(slot) if suspects == 0 => vec![(slot, 8)],
                _ => index_ranges(layout),
            };
            match make_consistent(fabric, layout, old.primary, view, &ranges, timeout_ns).await {
                Ok((fixed, installed)) => {
                    debug!(
                        fixed,
                        installed = installed.len(),
                        "FUSEE master: slot copies made consistent"
                    );
                    self.installed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend(installed);
                    break Ok(view);
                }
                Err(Failure::Nodes(mask)) => {
                    warn!(mask, "FUSEE master: memory nodes failed during recovery");
                    alive &= !mask;
                }
                Err(Failure::Fatal(e)) => break Err(e),
            }
        };
        // 3. Notify.
        let outcome = result.map(|view| {
            let new = View {
                epoch: old.epoch.wrapping_add(1),
                ..view
            };
            self.view.store(new.encode(), SeqCst);
            self.recoveries.fetch_add(1, SeqCst);
            info!(
                epoch = new.epoch,
                primary = new.primary.0,
                alive = new.alive,
                "FUSEE master: new membership"
            );
        });
        self.preparing.store(false, SeqCst);
        self.recovering.store(false, SeqCst);
        outcome
    }
}

fn index_ranges(layout: &FuseeLayout) -> Vec<(u64, u64)> {
    let (base, len) = layout.index();
    (0..len.div_ceil(RECOVERY_READ))
        .map(|i| {
            let start = base + i * RECOVERY_READ;
            (start, RECOVERY_READ.min(base + len - start))
        })
        .collect()
}

pub(crate) enum Failure {
    Nodes(u16),
    Fatal(FuseeError),
}

/// One roundtrip to every node of `posts`; the nodes that did not answer in time.
pub(crate) async fn all_or_failed<F: Fabric + ?Sized>(
    fabric: &F,
    stats: &OpStats,
    posts: Vec<(NodeId, Batch)>,
    timeout_ns: u64,
) -> Result<Vec<(NodeId, swarm_core::Completion)>, Failure> {
    let mut rt = Roundtrip::start(fabric, stats);
    let mut asked = 0u16;
    let n = posts.len();
    for (node, batch) in posts {
        asked |= 1 << node.0;
        rt.post(node, batch).map_err(|e| Failure::Fatal(e.into()))?;
    }
    let deadline = fabric.now().saturating_add(timeout_ns);
    if rt.wait_until(n, deadline).await == WaitOutcome::Reached {
        let mut replies = rt.replies_mut().to_vec();
        replies.sort_by_key(|(node, _)| node.0);
        return Ok(replies);
    }
    if let Some((_, e)) = rt.failures().iter().find(|(_, e)| e.is_local()) {
        return Err(Failure::Fatal(e.clone().into()));
    }
    let answered = rt
        .replies()
        .iter()
        .fold(0u16, |m, (node, _)| m | (1 << node.0));
    Err(Failure::Nodes(asked & !answered))
}

/// Makes every alive copy of the slots in `ranges` equal to the first alive backup's
/// (or the primary's when no backup is alive), and commits the logs of the values it
/// installed. Returns how many slot copies it changed, and the values it may have
/// installed on a writer's behalf: those that differed from some alive copy, and,
/// when the primary is gone (its copy unknown), every chosen value.
async fn make_consistent<F: Fabric + ?Sized>(
    fabric: &F,
    layout: &FuseeLayout,
    old_primary: NodeId,
    view: View,
    ranges: &[(u64, u64)],
    timeout_ns: u64,
) -> Result<(usize, Vec<u64>), Failure> {
    let stats = OpStats::new();
    let primary_lost = view.alive & (1 << old_primary.0) == 0;
    let mut installed = Vec::new();
    let nodes: Vec<NodeId> = (0..16u16)
        .filter(|&n| view.alive & (1 << n) != 0)
        .map(NodeId)
        .collect();
    let source = nodes.iter().position(|&n| n != old_primary).unwrap_or(0);
    let mut fixed = 0;
    for &(base, len) in ranges {
        let posts = nodes
            .iter()
            .map(|&n| (n, Batch::read(base, len as u32)))
            .collect();
        let mut replies = all_or_failed(fabric, &stats, posts, timeout_ns).await?;
        let copies: Vec<Vec<u8>> = replies
            .iter_mut()
            .map(|(_, c)| c.take_read(0).unwrap_or_default())
            .collect();
        if copies.iter().any(|c| c.len() as u64 != len) {
            return Err(Failure::Fatal(FuseeError::CorruptSlot {
                slot: base,
                word: 0,
            }));
        }
        let word = |copy: &[u8], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&copy[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let mut fixes: Vec<(NodeId, Op)> = Vec::new();
        let mut commits: Vec<u64> = Vec::new();
        for i in 0..(len / 8) as usize {
            let chosen = word(&copies[source], i);
            let addr = base + 8 * i as u64;
            let mut differs = false;
            for (k, &node) in nodes.iter().enumerate() {
                let current = word(&copies[k], i);
                if current != chosen {
                    differs = true;
                    fixes.push((
                        node,
                        Op::Cas {
                            addr,
                            expected: current,
                            new: chosen,
                        },
                    ));
                }
            }
            if differs && let Some(v) = SlotValue::decode(chosen) {
                commits.push(v.addr);
            }
            if chosen != 0 && (differs || primary_lost) {
                installed.push(chosen);
            }
        }
        fixed += fixes.len();
        for chunk in fixes.chunks(swarm_core::fabric::INLINE_BATCH_OPS) {
            let mut posts: Vec<(NodeId, Batch)> = Vec::new();
            for (node, op) in chunk {
                match posts.iter_mut().find(|(n, _)| n == node) {
                    Some((_, batch)) => {
                        let _ = batch.push(op.clone());
                    }
                    None => {
                        let mut batch = Batch::new();
                        let _ = batch.push(op.clone());
                        posts.push((*node, batch));
                    }
                }
            }
            all_or_failed(fabric, &stats, posts, timeout_ns).await?;
        }
        for addr in commits {
            if !layout.is_object(addr) {
                continue;
            }
            let at = addr + offset::old(layout.object_bytes());
            let posts = nodes
                .iter()
                .map(|&n| (n, Batch::write(at, COMMITTED.to_le_bytes().to_vec())))
                .collect();
            all_or_failed(fabric, &stats, posts, timeout_ns).await?;
        }
    }
    Ok((fixed, installed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_round_trip_and_list_the_primary_first() {
        let v = View {
            epoch: 7,
            primary: NodeId(1),
            alive: 0b1011,
        };
        assert_eq!(View::decode(v.encode()), v);
        let nodes: Vec<u16> = v.nodes().map(|n| n.0).collect();
        assert_eq!(nodes, [1, 0, 3]);
    }

    #[test]
    fn no_step_starts_while_a_change_is_prepared_or_after_the_epoch_moved() {
        let m = Master::new(3, 2).expect("valid");
        let g = m.enter(0).expect("no change prepared");
        assert_eq!(m.active.load(SeqCst), 1);
        drop(g);
        assert!(m.enter(1).is_none(), "a step of another epoch");
        m.preparing.store(true, SeqCst);
        assert!(m.enter(0).is_none());
        assert_eq!(m.active.load(SeqCst), 0);
    }

    #[test]
    fn client_ids_run_out_with_a_clear_error() {
        let m = Master::new(3, 2).expect("valid");
        assert_eq!(m.register_client(), Ok(0));
        assert_eq!(m.register_client(), Ok(1));
        assert_eq!(
            m.register_client(),
            Err(FuseeError::TooManyClients { max: 2 })
        );
    }
}
