//! The repair lock: at most one repair writes configuration records and copies into
//! a node at a time, and a repair's place is taken only once it is known gone.
//!
//! # Why
//!
//! A repair's configuration records (`e + 1`, `e + 2`) and its copy are plain
//! writes. A `swarm repair` can stop between any two of its instructions (SIGSTOP, a
//! long preemption) and wake up any time later, and the writes it had posted or was
//! about to post land then. If a second repair of the same node ran meanwhile, the
//! late records lowered the epoch on the donors below the second repair's admission
//! (docs/pauses.md, H3 part c): a client opening with the donors left the admitted
//! node out, or journaled its resets for a repair that no longer ran. Over RDMA the
//! late piece writes also landed on the node the second repair had admitted, which
//! serves quorums (part a). A record is bigger than the 8 bytes a CAS installs, so
//! the records alone cannot refuse a late copy; instead, nobody writes records or
//! copies while an earlier repair may still do so.
//!
//! # How
//!
//! The lock is the word [`REPAIR_LOCK_AT`] on every donor (the repair needs all of
//! them anyway; the node being rebuilt holds none of it). A repair takes it before
//! it reads the configuration and gives it back after its last record landed (or
//! after it failed): CAS 0 → its token on every donor. A token is unique per repair:
//! the process's pid and start time (as `crate::membership::owner_process` records
//! writer ids' owners) and a per-process sequence number. A copy that shows another
//! token is taken over (CAS that token → own) only if its repair is *known gone*:
//!
//! * a repair of this process is gone once it returned (a registry of the running
//!   ones: exact);
//! * on shared memory ([`OwnerLiveness::ThisHost`]) every repair is a process of this
//!   host, and one is gone once no process with its pid and start time runs. A
//!   process that is gone stores nothing more: on shared memory its stores happen
//!   synchronously, in the process;
//! * otherwise (RDMA: repairs run on any host) this host cannot tell, and the repair
//!   refuses with [`RepairError::Locked`], unless the operator asserts that the
//!   earlier repair is gone ([`super::RepairOptions::break_lock`], `swarm repair
//!   --break-lock`): like `swarm evict --force`, an override that gives up the
//!   argument if that repair still runs.
//!
//! A repair that finds a copy held by a repair that runs (or may run) gives back the
//! copies it took and stops with [`RepairError::Locked`]; nothing else has been
//! written. A token keeps 22 bits of the pid (Linux's limit) and 26 of the start
//! time (7.7 days of 100 Hz ticks): a later process with the same pid, started a
//! multiple of that later, reads as the holder, which only refuses; a holder that
//! runs never reads as gone.
//!
//! # Why it is correct, stops included
//!
//! A repair counts its lock over time: a stop between two of its CASes lets others
//! act in between. The lock still has one holder at a time, by the claim argument
//! (`crate::membership::claim`): a copy holding token `T` leaves `T` only by `T`'s
//! own repair (a give-back, after its round or its work) or by a taker that judged
//! `T`'s repair gone, which then stores nothing more, so its round never ends. So
//! when a round ends with every donor's copy, all of them hold its token at once,
//! and no other repair holds them all until it gives them back. A repair posts its
//! records and copies only between the end of its round and its give-back, and on
//! every node one repair's stores land in program order before its give-back (shared
//! memory executes a batch inside `submit`; the repair waits for every write's
//! completion before it gives back, except after a failure over RDMA, where a write
//! still in flight lands within the transport's delivery bound, long before a next
//! repair's copy, which follows its quiescence wait). A repair stopped before or inside its round
//! holds nothing yet, and when it wins it reads the configuration after its round,
//! so it sees what every earlier repair admitted: the node's incarnation is a member
//! ([`RepairError::AlreadyMember`]), or (shared memory) its own mapping of the node
//! is a retired file, which a probe of the node before the announcement finds
//! crashed ([`RepairError::Donor`]). So a late record or piece lands only while its
//! repair holds the lock: no configuration a later repair installed is ever
//! replaced, and no admitted node receives a stopped repair's copy.
//!
//! Limits: a repair of a build before this lock ignores it (mixed builds keep the
//! hole). Over RDMA the earlier repair's queue pairs are not revoked: a repair is not
//! fenced under a lease word as clients are (`Fabric::fence_owner`), so nothing tells
//! the memory nodes which queue pairs are its; the operator's `--break-lock` asserts
//! that its process is gone, and the transport's delivery bound covers what it had
//! posted.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use swarm_core::fabric::{Batch, NodeId};
use swarm_core::{Fabric, OpStats};

use super::{RepairError, rt_all};
use crate::configuration::REPAIR_LOCK_AT;
use crate::membership::owner_process::{self, OwnerLiveness};

const PID_BITS: u32 = 22;
const START_BITS: u32 = 26;
const SEQ_BITS: u32 = 15;
const PID_MASK: u64 = (1 << PID_BITS) - 1;
const START_MASK: u64 = (1 << START_BITS) - 1;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Set in every token, so that none is 0.
const TOKEN_BIT: u64 = 1 << 63;

/// Rounds of CASes before a repair that keeps meeting changed copies gives up.
const ROUNDS: usize = 3;

/// The tokens of this process's repairs that have not returned.
static RUNNING: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// This process's next repair sequence number.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A token: `[1 | seq: 15 | start: 26 | pid: 22]` (pid and start time as in
/// `owner_process`, the start time's low bits; 0 where unknown).
fn token(pid: u64, start: u64, seq: u64) -> u64 {
    TOKEN_BIT
        | (seq & SEQ_MASK) << (PID_BITS + START_BITS)
        | (start & START_MASK) << PID_BITS
        | (pid & PID_MASK)
}

fn pid_of(token: u64) -> u64 {
    token & PID_MASK
}

fn start_of(token: u64) -> u64 {
    (token >> PID_BITS) & START_MASK
}

/// What the holder of a token is, as far as this process can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Its repair returned or its process is gone: it stores nothing more.
    Gone,
    /// Its repair runs (this process), or its process runs (this host).
    Running,
    /// This host cannot tell (another host's process, no `/proc`).
    Unknown,
}

/// Judges the holder of `word` (a non-zero lock copy that is not the caller's).
pub(crate) fn judge(word: u64, liveness: OwnerLiveness) -> Holder {
    let me = owner_process::this_process();
    let (my_pid, my_start) = (me & 0xFFFF_FFFF, me >> 32);
    if pid_of(word) == my_pid & PID_MASK && start_of(word) == my_start & START_MASK {
        let running = RUNNING.lock().map(|r| r.contains(&word)).unwrap_or(true);
        return if running {
            Holder::Running
        } else {
            Holder::Gone
        };
    }
    if liveness != OwnerLiveness::ThisHost
        || word & TOKEN_BIT == 0
        || !std::path::Path::new("/proc/self/stat").exists()
    {
        return Holder::Unknown;
    }
    let Ok(pid) = u32::try_from(pid_of(word)) else {
        return Holder::Unknown;
    };
    match owner_process::identity_of(pid) {
        None => Holder::Gone,
        // No start time recorded: the pid alone decides.
        Some(_) if start_of(word) == 0 => Holder::Running,
        Some(identity) if (identity >> 32) & START_MASK == start_of(word) => Holder::Running,
        Some(_) => Holder::Gone,
    }
}

/// The lock while this process's repair holds it (or tries to): its token is in
/// the registry of running repairs until dropped.
pub(crate) struct RepairLock {
    token: u64,
}

impl RepairLock {
    /// The lock's token (unique: never recurs).
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    fn new() -> Self {
        let me = owner_process::this_process();
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        let token = token(me & 0xFFFF_FFFF, me >> 32, seq);
        if let Ok(mut running) = RUNNING.lock() {
            running.push(token);
        }
        Self { token }
    }
}

impl Drop for RepairLock {
    fn drop(&mut self) {
        if let Ok(mut running) = RUNNING.lock() {
            running.retain(|t| *t != self.token);
        }
    }
}

/// Takes the repair lock on every donor (see the module docs), or gives back what it
/// took and says who holds it.
pub(crate) async fn take<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    donors: &[NodeId],
    liveness: OwnerLiveness,
    break_lock: bool,
) -> Result<RepairLock, RepairError> {
    let lock = RepairLock::new();
    let mut expected: Vec<Option<u64>> = vec![Some(0); donors.len()];
    let mut refused = None;
    for _ in 0..ROUNDS {
        let pending: Vec<NodeId> = donors
            .iter()
            .zip(&expected)
            .filter(|(_, e)| e.is_some())
            .map(|(n, _)| *n)
            .collect();
        let index = |node: NodeId| donors.iter().position(|n| *n == node).unwrap_or(0);
        let replies = match rt_all(fabric, stats, &pending, |node| {
            Batch::cas(
                REPAIR_LOCK_AT,
                expected[index(node)].unwrap_or(0),
                lock.token,
            )
        })
        .await
        {
            Ok(replies) => replies,
            Err(error) => {
                give_back(fabric, stats, donors, &lock).await;
                return Err(error);
            }
        };
        for (node, completion) in &replies {
            let i = index(*node);
            let Some(want) = expected[i] else { continue };
            let seen = completion.cas(0).unwrap_or(u64::MAX);
            if seen == want || seen == lock.token {
                expected[i] = None;
                continue;
            }
            let holder = if break_lock {
                Holder::Gone
            } else {
                judge(seen, liveness)
            };
            match holder {
                Holder::Gone => expected[i] = Some(seen),
                Holder::Running | Holder::Unknown => {
                    refused = Some((*node, seen, holder));
                }
            }
        }
        if refused.is_some() {
            break;
        }
        if expected.iter().all(Option::is_none) {
            tracing::info!(token = lock.token, "repair lock taken");
            return Ok(lock);
        }
    }
    give_back(fabric, stats, donors, &lock).await;
    let (node, holder, judged) = refused.unwrap_or((donors[0], 0, Holder::Unknown));
    Err(RepairError::Locked {
        node,
        pid: pid_of(holder) as u32,
        why: if holder == 0 {
            "the lock kept changing hands: run the repair again"
        } else {
            why(judged)
        },
    })
}

/// Whether [`take`] would refuse now, read only: a repair that would replace the
/// node's memory first (`ShmStore::repair`) asks, so that a refused repair leaves
/// the memory of the one that runs alone. Advisory: [`take`] decides.
pub(crate) async fn check<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    donors: &[NodeId],
    liveness: OwnerLiveness,
    break_lock: bool,
) -> Result<(), RepairError> {
    if break_lock {
        return Ok(());
    }
    let replies = rt_all(fabric, stats, donors, |_| Batch::read(REPAIR_LOCK_AT, 8)).await?;
    for (node, completion) in &replies {
        let word = completion
            .read(0)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        if word == 0 {
            continue;
        }
        let judged = judge(word, liveness);
        if judged != Holder::Gone {
            return Err(RepairError::Locked {
                node: *node,
                pid: pid_of(word) as u32,
                why: why(judged),
            });
        }
    }
    Ok(())
}

/// What to do about a lock held by a repair judged `judged`.
fn why(judged: Holder) -> &'static str {
    match judged {
        Holder::Running => {
            "it runs (this host): wait for it to end, or stop it (kill the process) and run the repair again"
        }
        _ => {
            "this host cannot tell whether it still runs (it may run on another host): once it is gone (killed, its host down), run the repair again with --break-lock"
        }
    }
}

/// Gives the lock back on every donor that answers (CAS own token → 0: a late one
/// finds another word, since tokens never recur) and drops it from the registry.
pub(crate) async fn give_back<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    donors: &[NodeId],
    lock: &RepairLock,
) {
    let token = lock.token;
    for &node in donors {
        if let Err(error) = rt_all(fabric, stats, &[node], |_| {
            Batch::cas(REPAIR_LOCK_AT, token, 0)
        })
        .await
        {
            tracing::debug!(%node, %error, "cannot give the repair lock back there");
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The token of a repair in a process that is gone (a child, reaped), if this
    /// host can tell.
    pub(crate) fn a_gone_processs_token() -> Option<u64> {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return None;
        }
        let mut child = std::process::Command::new("sleep").arg("30").spawn().ok()?;
        let identity = owner_process::identity_of(child.id());
        child.kill().ok()?;
        child.wait().ok()?;
        let identity = identity?;
        let token = token(identity & 0xFFFF_FFFF, identity >> 32, 1);
        (judge(token, OwnerLiveness::ThisHost) == Holder::Gone).then_some(token)
    }

    #[test]
    fn tokens_name_their_process_and_a_returned_repair_is_gone() {
        let lock = RepairLock::new();
        assert_ne!(lock.token, 0);
        assert_eq!(judge(lock.token, OwnerLiveness::Unknown), Holder::Running);
        let other = RepairLock::new();
        assert_ne!(other.token, lock.token, "one token per repair");
        let returned = lock.token;
        drop(lock);
        assert_eq!(
            judge(returned, OwnerLiveness::Unknown),
            Holder::Gone,
            "a repair of this process that returned"
        );
        assert_eq!(judge(other.token, OwnerLiveness::ThisHost), Holder::Running);
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let identity = owner_process::identity_of(child.id()).expect("the child runs");
        let theirs = token(identity & 0xFFFF_FFFF, identity >> 32, 5);
        assert_eq!(judge(theirs, OwnerLiveness::ThisHost), Holder::Running);
        assert_eq!(
            judge(theirs, OwnerLiveness::Unknown),
            Holder::Unknown,
            "another host's process cannot be judged"
        );
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert_eq!(judge(theirs, OwnerLiveness::ThisHost), Holder::Gone);
    }
}
