//! Updates: `insert`, `remove` and `replace` as Paxos proposers (module docs of
//! [`super`], "updates").
//!
//! Every attempt promises a fresh ballot on the buckets it needs (reading them back
//! in the same batch), first finds out whether one of its own earlier proposals took
//! effect, then settles whatever change is in flight, decides on the settled state,
//! and proposes its change. An insert first fences the candidate bucket it does not
//! modify by accepting a no-op there. Before all that, an insert whose read allows
//! it tries a fast round (`fast.rs`), which decides its change in one step.

use swarm_core::fabric::{Nanos, NodeId, OpOutput};
use swarm_core::{Fabric, OpStats};

use super::bucket::{Status, View, first_free_slot, free_slots};
use super::engine::{Engine, MAX_BUCKETS, Settled};
use super::error::HeaderProblem;
use super::fast;
use super::hash::{HashedKey, KeyHash};
use super::header;
use super::lookup::{candidates, settled};
use super::watch::Fate;
use super::word::{Ballot, Proposal, SlotState};
use super::{Index, IndexError, InsertOutcome, MappingTag, RegisterId, Withdrawal};

/// Acknowledgement waits for other operations' changes.
///
/// A change is named by its proposal *and* the tag its applied copies carry: a `SET
/// slot := register` repeats when a register comes back to the key it mapped, into the
/// same slot (a later life of the mapping, module docs of [`super`]), and the later
/// life is another change, applied under a newer tag (newer than the change that ended
/// the earlier life), whose owner has not seen it yet. Taking it for the earlier life,
/// whose wait had run out, replaced it at once: its owner, seeing neither it nor its
/// proposal any more and a newer value accepted by a quorum, took its insert for never
/// decided and proposed it again, so one insert started two lives of its mapping
/// (`tests/index_sim.rs`,
/// `a_later_life_of_an_unacknowledged_change_is_waited_for_again`). Not by its ballot:
/// every insert that fences the bucket accepts the change again under a ballot of its
/// own, and a wait restarted at each would never end while inserts keep coming.
#[derive(Debug, Default)]
struct Owner {
    unacked: [Option<(Ballot, Proposal, Nanos)>; MAX_BUCKETS],
}

impl Owner {
    /// How much longer to wait before replacing someone's unacknowledged change `p`,
    /// whose applied copies carry `tag`, in `bucket` (zero: go ahead).
    fn ack_wait_left(
        &mut self,
        bucket: usize,
        (tag, p): (Ballot, Proposal),
        now: Nanos,
        ack_wait: Nanos,
    ) -> Nanos {
        let since = match self.unacked[bucket] {
            Some((t, q, since)) if t == tag && q == p => since,
            _ => {
                self.unacked[bucket] = Some((tag, p, now));
                now
            }
        };
        (since.saturating_add(ack_wait)).saturating_sub(now)
    }
}

/// Finishes one of our proposals found as the newest value of bucket `i`.
async fn finish<F: Fabric>(
    eng: &mut Engine<'_, F>,
    i: usize,
    view: &View,
    ours: Ballot,
    proposal: Proposal,
    fp: u32,
) -> Result<bool, IndexError> {
    match view.status() {
        Status::Open { .. } => {
            if eng.accept(i, ours, proposal).await? {
                eng.apply(i, ours, proposal, Some(fp), true).await?;
                Ok(true)
            } else {
                Ok(false)
            }
        }
        Status::Decided { ballot, .. }
        | Status::Partial { ballot, .. }
        | Status::Unacked { ballot, .. } => {
            eng.apply(i, ballot, proposal, Some(fp), true).await?;
            Ok(true)
        }
        Status::Free => Ok(true),
    }
}

/// What became of our earlier proposals, as far as an attempt is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Earlier {
    /// One took effect (it is now finished and marked): the operation is done.
    TookEffect,
    /// None did (so far): carry on with this attempt.
    None,
    /// One may still be decided but finishing it failed: start a new attempt.
    Retry,
}

/// Whether one of our earlier proposals took effect, judging from what the engine
/// observed and from the views of a promise; finishes it if it is still open.
async fn earlier<F: Fabric>(
    eng: &mut Engine<'_, F>,
    views: &[Option<View>; MAX_BUCKETS],
    ballots: &[Option<Ballot>; MAX_BUCKETS],
    fp: u32,
) -> Result<Earlier, IndexError> {
    match eng.fate(views) {
        Fate::None => Ok(Earlier::None),
        Fate::Unknown => Err(IndexError::OutcomeUnknown {
            ack_wait_ns: eng.index().config.ack_wait_ns,
        }),
        Fate::Latest(i, proposal) => {
            let (Some(view), Some(ours)) = (&views[i], ballots[i]) else {
                return Ok(Earlier::Retry);
            };
            eng.watch(i, proposal, ours);
            if finish(eng, i, view, ours, proposal, fp).await? {
                Ok(Earlier::TookEffect)
            } else {
                Ok(Earlier::Retry)
            }
        }
        Fate::Applied(i, proposal, tag) => {
            eng.apply(i, tag, proposal, Some(fp), true).await?;
            Ok(Earlier::TookEffect)
        }
    }
}

/// Settles every promised bucket; returns the unacknowledged changes (with the tag of
/// their applied copies, [`unacked_tag`]), or `None` if something was helped along
/// (the caller starts a new attempt).
async fn settle_all<F: Fabric>(
    eng: &mut Engine<'_, F>,
    views: &[Option<View>; MAX_BUCKETS],
    ballots: &[Option<Ballot>; MAX_BUCKETS],
) -> Result<Option<[Option<(Ballot, Proposal)>; MAX_BUCKETS]>, IndexError> {
    let mut unacked = [None; MAX_BUCKETS];
    let mut progressed = false;
    for i in 0..eng.len() {
        let Some(view) = &views[i] else { continue };
        let before = view.status();
        match eng.settle(i, view, ballots[i]).await? {
            Settled::Free => {}
            Settled::Unacked(_, p) => unacked[i] = Some((unacked_tag(view, p), p)),
            Settled::Progress => {
                if let (Status::Open { proposal, .. }, Some(ours)) = (before, ballots[i]) {
                    eng.superseded(i, proposal, ours);
                }
                progressed = true;
            }
            Settled::Lost => progressed = true,
        }
    }
    Ok((!progressed).then_some(unacked))
}

/// Makes sure that none of this operation's proposals can take effect after it
/// reports that its change did not happen (an insert's `Exists`, a replace's or a
/// remove's `false`), on the views of its last promise, which settled every bucket
/// it promised ([`settle_all`]: each is free or holds an unacknowledged change).
///
/// A proposal of ours that is neither decided nor ruled out may still be accepted on
/// some nodes: a fast round's value on the nodes that took it, or an accept that a
/// newer promise preempted. A promise moves no accepted value, and a quorum read
/// that meets it later on every copy (a fast value) or as the newest accepted value
/// (a classic one) must take it for possibly decided and finish it (Paxos). If the
/// operation had reported it undone, that finish maps a register its caller retires,
/// or a second register for the key (`tests/index_sim.rs`, seed 1829915152: an insert
/// that found its key in the other bucket left its fast value behind, and a reader
/// finished it once the key was removed). So, in every bucket where one is alive, a
/// quorum accepts under our promise what keeps the bucket as it is: the no-op, or
/// the unacknowledged change again (as the fence of an insert does: replacing it
/// before its owner's acknowledgement would hide a decided change from its owner,
/// `Owner`). Once that is accepted by a quorum, every later quorum read meets a
/// newer accepted value, and our proposal is dead. False if an accept failed (a
/// newer promise): the caller starts a new attempt, which judges our proposals again.
///
/// With `unwatched`, every bucket is treated so: proposals of earlier calls, which
/// this engine never watched, may be alive in any of them ([`withdraw`]).
async fn rule_out_own<F: Fabric>(
    eng: &mut Engine<'_, F>,
    ballots: &[Option<Ballot>; MAX_BUCKETS],
    unacked: &[Option<(Ballot, Proposal)>; MAX_BUCKETS],
    unwatched: bool,
) -> Result<bool, IndexError> {
    for i in 0..eng.len() {
        if !unwatched && !eng.alive_in(i) {
            continue;
        }
        let Some(ballot) = ballots[i] else {
            return Ok(false);
        };
        let value = unacked[i].map_or(Proposal::Noop, |(_, p)| p);
        if !eng.accept(i, ballot, value).await? {
            return Ok(false);
        }
        eng.superseded(i, value, ballot);
        eng.refresh(i, None, ballot)?;
    }
    Ok(true)
}

/// The tag of the applied copies of `p`, the unacknowledged change `view` shows: its
/// slot's newest copy (an unacknowledged change is applied on a quorum and nothing
/// newer is in its slot). What tells one life of a mapping from another ([`Owner`]).
fn unacked_tag(view: &View, p: Proposal) -> Ballot {
    p.slot().map_or(Ballot::default(), |s| view.slots[s].tag)
}

/// Waits (re-reading) until bucket `i`'s unacknowledged change `(tag, p)` is
/// acknowledged or replaced (a later life of the same proposal is another change), or
/// `left` passed.
async fn wait_ack<F: Fabric>(
    eng: &mut Engine<'_, F>,
    i: usize,
    (tag, p): (Ballot, Proposal),
    left: Nanos,
) -> Result<(), IndexError> {
    let deadline = eng.now().saturating_add(left);
    let step = eng.index().config.retry_delay_ns.max(1);
    loop {
        eng.pause(step.min(deadline.saturating_sub(eng.now()).max(1)))
            .await;
        let views = eng.read().await?;
        let still = views.get(i).is_some_and(
            |v| matches!(v.status(), Status::Unacked { proposal, .. } if proposal == p && unacked_tag(v, p) == tag),
        );
        if !still || eng.now() >= deadline {
            return Ok(());
        }
    }
}

/// An insert whose first read is done ([`Index::read_for_insert`]), kept until the
/// caller is ready to index the register (its key header on a majority).
#[derive(Debug)]
pub struct InsertRead<'a, F: Fabric> {
    eng: Engine<'a, F>,
    views: heapless::Vec<View, MAX_BUCKETS>,
    key: HashedKey<'a>,
    register: RegisterId,
}

/// `Index::insert`.
pub async fn insert<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: HashedKey<'_>,
    register: RegisterId,
    deadline: Nanos,
) -> Result<InsertOutcome, IndexError> {
    let read = read_for_insert(ix, fabric, stats, key, register, deadline).await?;
    finish_insert(read, stats).await
}

/// The engine of an insert of the key of `hash` → `register` (both checked).
fn hashed_insert_engine<'a, F: Fabric>(
    ix: &'a Index,
    fabric: &'a F,
    stats: &'a OpStats,
    hash: KeyHash,
    register: RegisterId,
    deadline: Nanos,
) -> Engine<'a, F> {
    Engine::new(
        ix,
        fabric,
        stats,
        &hash.buckets(),
        register ^ u64::from(hash.fp),
    )
    .until(deadline)
}

/// The first step of an insert: reads the key's candidate buckets (one roundtrip).
pub async fn read_for_insert<'a, F: Fabric>(
    ix: &'a Index,
    fabric: &'a F,
    stats: &'a OpStats,
    key: HashedKey<'a>,
    register: RegisterId,
    deadline: Nanos,
) -> Result<InsertRead<'a, F>, IndexError> {
    ix.check_register(register)?;
    let mut eng = hashed_insert_engine(ix, fabric, stats, key.hash(), register, deadline);
    let views = eng.read().await?;
    Ok(InsertRead {
        eng,
        views,
        key,
        register,
    })
}

/// `Index::blind_insert`.
pub fn blind_insert(
    ix: &Index,
    key: &HashedKey<'_>,
    register: RegisterId,
) -> Result<fast::BlindInsert, IndexError> {
    let hash = key.hash();
    ix.check_register(register)?;
    Ok(fast::BlindInsert::new(
        hash,
        ix.layout.bucket(hash.first),
        register,
    ))
}

/// `Index::finish_blind`.
#[allow(clippy::too_many_arguments)]
pub async fn finish_blind<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: HashedKey<'_>,
    deadline: Nanos,
    blind: fast::BlindInsert,
    sent: Nanos,
    took: &[(NodeId, OpOutput)],
) -> Result<InsertOutcome, IndexError> {
    // `blind_insert` hashed the key and checked the register.
    debug_assert_eq!(key.hash(), blind.hash, "another key's round");
    let (hash, register) = (blind.hash, blind.register);
    let mut eng = hashed_insert_engine(ix, fabric, stats, hash, register, deadline);
    if eng.learn_blind(&blind, took, sent) {
        eng.apply_blind(&blind, hash.fp).await?;
        return Ok(InsertOutcome::Inserted);
    }
    let views = eng.read().await?;
    finish_insert(
        InsertRead {
            eng,
            views,
            key,
            register,
        },
        stats,
    )
    .await
}

impl<'a, F: Fabric> InsertRead<'a, F> {
    /// Indexes the register for the key read: what [`Index::insert_until`] does
    /// after its read, counting roundtrips in `stats`.
    pub async fn finish(self, stats: &'a OpStats) -> Result<InsertOutcome, IndexError> {
        finish_insert(self, stats).await
    }
}

/// The rest of an insert after its read: a fast round when the read allows one
/// (`fast`), else (or if it is not decided) promise both buckets, fence, accept;
/// counts its roundtrips in `stats`.
async fn finish_insert<'a, F: Fabric>(
    read: InsertRead<'a, F>,
    stats: &'a OpStats,
) -> Result<InsertOutcome, IndexError> {
    let InsertRead {
        mut eng,
        views,
        key,
        register,
    } = read;
    let hash = key.hash();
    let key = key.bytes();
    eng.stats = stats;
    let ix = eng.index();
    let fabric = eng.fabric;
    let config = ix.config;
    // A fast round only while no proposal of this insert may have taken effect
    // unseen (the blind round it follows, `finish_blind`): a round of the same register
    // over one that was decided, applied and removed while this client was stopped
    // would map a register that the remover owns now (two owners). The classic
    // attempts below judge such a proposal first (`earlier`), and report
    // `OutcomeUnknown` when they cannot.
    if config.fast_inserts
        && eng.none_pending()
        && let Some(plan) = fast::plan(&eng, &views, &hash, register)
    {
        // Watched from now on: if the fast round is not decided but someone finishes
        // it anyway, the classic attempts below learn it like any proposal of theirs.
        let (ballot, proposal) = (plan.ballot, plan.proposal);
        eng.watch(0, proposal, ballot);
        if eng.fast_accept(plan).await? {
            eng.apply(0, ballot, proposal, Some(hash.fp), false).await?;
            return Ok(InsertOutcome::Inserted);
        }
    }
    let mut owner = Owner::default();
    let mut known_keys: Vec<(RegisterId, bool)> = Vec::new();
    for attempt in 0..config.max_attempts {
        if attempt > 0 {
            eng.backoff_and_reread(attempt).await?;
        }
        let ballots = eng.next_ballots();
        let promised = eng.promise(ballots, None).await?;
        let views = promised.views;
        match earlier(&mut eng, &views, &ballots, hash.fp).await? {
            Earlier::TookEffect => return Ok(InsertOutcome::Inserted),
            Earlier::Retry => continue,
            Earlier::None => {}
        }
        if !promised.ok.iter().take(eng.len()).all(|ok| *ok) {
            continue;
        }
        let Some(unacked) = settle_all(&mut eng, &views, &ballots).await? else {
            continue;
        };
        let Some(states) = views
            .iter()
            .take(eng.len())
            .map(|v| v.map(|v| v.slots))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        // Is the key already there?
        let found = candidates(&states, &hash);
        if found.iter().any(|(_, _, r)| *r == register) {
            // Our register is mapped: only this call (or an earlier call with the
            // same register) can have mapped it.
            return Ok(InsertOutcome::Inserted);
        }
        let unknown: Vec<RegisterId> = found
            .iter()
            .map(|(_, _, r)| *r)
            .filter(|r| !known_keys.iter().any(|(k, _)| k == r))
            .collect();
        if !unknown.is_empty() {
            let same = header::verify(ix, fabric, stats, &unknown, key).await?;
            known_keys.extend(unknown.into_iter().zip(same));
        }
        if let Some((_, _, r)) = found
            .iter()
            .find(|(_, _, r)| known_keys.iter().any(|(k, same)| k == r && *same))
        {
            // Reported present, the register must stay unmapped for good: the caller
            // retires it.
            if !rule_out_own(&mut eng, &ballots, &unacked, false).await? {
                continue;
            }
            return Ok(InsertOutcome::Exists(*r));
        }
        // Where to put it: the bucket with more free slots, avoiding one whose last
        // change still waits for its owner's acknowledgement.
        let free: Vec<usize> = states.iter().map(free_slots).collect();
        let Some(target) = (0..eng.len())
            .filter(|&i| free[i] > 0)
            .max_by_key(|&i| (unacked[i].is_none(), free[i], core::cmp::Reverse(i)))
        else {
            return Err(IndexError::Full {
                first: hash.first,
                second: hash.second,
            });
        };
        if let Some(p) = unacked[target] {
            let left = owner.ack_wait_left(target, p, eng.now(), config.ack_wait_ns);
            if left > 0 {
                wait_ack(&mut eng, target, p, left).await?;
                continue;
            }
        }
        // Fence the other candidate bucket.
        if eng.len() == 2 {
            let other = 1 - target;
            let value = unacked[other].map_or(Proposal::Noop, |(_, p)| p);
            let Some(ballot) = ballots[other] else {
                continue;
            };
            if !eng.accept(other, ballot, value).await? {
                continue;
            }
            eng.superseded(other, value, ballot);
            eng.refresh(other, None, ballot)?;
        }
        let Some(slot) = first_free_slot(&states[target]) else {
            continue;
        };
        let proposal = Proposal::Set {
            slot: slot as u8,
            register,
        };
        let Some(ballot) = ballots[target] else {
            continue;
        };
        eng.watch(target, proposal, ballot);
        if eng.accept(target, ballot, proposal).await? {
            // Apply and mark in the background, unless a helper may be applying it
            // under its own ballot: then wait, so that the mark lands on its copy.
            let contested = eng.contested();
            eng.apply(target, ballot, proposal, Some(hash.fp), contested)
                .await?;
            return Ok(InsertOutcome::Inserted);
        }
    }
    Err(IndexError::Contention {
        attempts: config.max_attempts,
        bucket: hash.first,
    })
}

/// `Index::withdraw_until_hashed`: rules out every proposal of `register` for the key
/// of `key` that calls before this one may have left accepted, unless the key maps
/// `register` now.
///
/// Why that suffices (with the promise and the fence of [`rule_out_own`]): a proposal
/// that some later reader could finish is, in the views of a quorum, the newest
/// accepted value of its bucket. Our promise's quorum meets it there if it already is
/// on a quorum, and then [`settle_all`] finishes it (the next attempt sees the key
/// mapped); once our no-op (or the bucket's unacknowledged change) is accepted by a
/// quorum under our ballot, newer than every ballot accepted before (a quorum promised
/// it), every later quorum read meets that instead. A fast value needs every copy of
/// a quorum, and the nodes that accepted ours exclude it.
pub async fn withdraw<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: HashedKey<'_>,
    register: RegisterId,
    deadline: Nanos,
) -> Result<Withdrawal, IndexError> {
    ix.check_register(register)?;
    let hash = key.hash();
    let mut eng = hashed_insert_engine(ix, fabric, stats, hash, register, deadline);
    let config = ix.config;
    for attempt in 0..config.max_attempts {
        if attempt > 0 {
            eng.backoff_and_reread(attempt).await?;
        }
        let ballots = eng.next_ballots();
        let promised = eng.promise(ballots, None).await?;
        if !promised.ok.iter().take(eng.len()).all(|ok| *ok) {
            continue;
        }
        let views = promised.views;
        let Some(unacked) = settle_all(&mut eng, &views, &ballots).await? else {
            continue;
        };
        let states: Vec<_> = views
            .iter()
            .take(eng.len())
            .flatten()
            .map(|v| v.slots)
            .collect();
        if candidates(&states, &hash)
            .iter()
            .any(|(_, _, r)| *r == register)
        {
            return Ok(Withdrawal::Mapped);
        }
        if rule_out_own(&mut eng, &ballots, &unacked, true).await? {
            return Ok(Withdrawal::Withdrawn);
        }
    }
    Err(IndexError::Contention {
        attempts: config.max_attempts,
        bucket: hash.first,
    })
}

/// What [`change`] does to a key's mapping: unmap `old` (`new == None`, `Index::remove`)
/// or map the key to `new` in its place (`Index::replace`); with `tag`, only the
/// mapping whose slot still carries it (`Index::remove_tagged_until`).
pub struct Change {
    /// The register the key must map to.
    pub old: RegisterId,
    /// The register it maps to afterwards (`None`: unmapped).
    pub new: Option<RegisterId>,
    /// The slot (bucket and tag) the mapping must still be in.
    pub tag: Option<MappingTag>,
}

/// `Index::remove` (`new == None`) and `Index::replace` (`new == Some(_)`): changes
/// the slot mapping `old`, if `key` maps to it.
pub async fn change<F: Fabric>(
    ix: &Index,
    fabric: &F,
    stats: &OpStats,
    key: &HashedKey<'_>,
    change: Change,
    deadline: Nanos,
) -> Result<bool, IndexError> {
    let Change { old, new, tag } = change;
    let hash = key.hash();
    let key = key.bytes();
    ix.check_register(old)?;
    if let Some(new) = new {
        ix.check_register(new)?;
        if new == old {
            return Err(IndexError::SameRegister(old));
        }
    }
    let config = ix.config;
    let mut eng =
        Engine::new(ix, fabric, stats, &hash.buckets(), old ^ u64::from(hash.fp)).until(deadline);
    // Which bucket maps `old`? Registers never move, so a settled read tells.
    let states = settled(&mut eng).await?;
    let Some(i) = states
        .iter()
        .position(|s| s.iter().any(|slot| slot.register() == Some(old)))
    else {
        return Ok(false);
    };
    let (holders, holders_quorum, loc) = ix.header_holders(fabric, old)?;
    // The promise's batch probes one address on every index node: the header's,
    // when it is the same on every replica.
    let header_at = loc
        .same_offset()
        .and_then(|at| at.checked_sub(ix.layout.params.key_header_bytes()));
    let nonce = ix.next_nonce();
    let mut owner = Owner::default();
    let mut same_key: Option<bool> = None;
    // With a metadata group (`crate::layout::ClusterParams::metadata_nodes`) the
    // header's holders may be outside the index's nodes, where the promise's batch
    // cannot probe it: read from a majority of them first (one more roundtrip). The
    // header never changes while `old` is indexed, as for the probe. So too when a
    // placement record puts it at another offset on each replica.
    if header_at.is_none() || holders.iter().any(|node| node.index() >= ix.nodes) {
        let same = header::verify(ix, fabric, stats, &[old], key).await?;
        same_key = same.first().copied();
    }
    // Probes whose header copies disagreed, read again as `header::verify` does.
    let mut torn_probes = 0;
    for attempt in 0..config.max_attempts {
        if attempt > 0 {
            eng.backoff_and_reread(attempt).await?;
        }
        let mut ballots = [None; MAX_BUCKETS];
        ballots[i] = Some(eng.next_ballot(i));
        let probe = header_at
            .filter(|_| same_key.is_none())
            .map(|at| (at, header::read_len(key.len())));
        let promised = eng.promise(ballots, probe).await?;
        // The header's copies are those of `old`'s replicas: a majority of them.
        let copies: Vec<&[u8]> = promised
            .headers
            .iter()
            .filter(|(node, _)| holders.contains(node))
            .map(|(_, bytes)| bytes.as_slice())
            .collect();
        if probe.is_some() && copies.len() >= holders_quorum {
            match header::judge(&copies, key, ix.layout.params.key_max, holders_quorum) {
                Ok(same) => same_key = Some(same),
                // A copy read while its write landed (`header`'s module docs): the
                // next attempt, after its backoff, reads the header again.
                Err(HeaderProblem::Inconsistent) if torn_probes < header::HEADER_REREADS => {
                    torn_probes += 1;
                    tracing::debug!(
                        register = old,
                        attempt,
                        "index: key header copies disagree (one read while its write landed); probing again"
                    );
                }
                Err(problem) => {
                    return Err(IndexError::KeyHeader {
                        register: old,
                        problem,
                    });
                }
            }
        }
        if same_key == Some(false) {
            // `old` is another key's register.
            return Ok(false);
        }
        let views = promised.views;
        match earlier(&mut eng, &views, &ballots, hash.fp).await? {
            Earlier::TookEffect => return Ok(true),
            Earlier::Retry => continue,
            Earlier::None => {}
        }
        if !promised.ok[i] {
            continue;
        }
        let Some(unacked) = settle_all(&mut eng, &views, &ballots).await? else {
            continue;
        };
        let Some(view) = &views[i] else { continue };
        let Some(slot) = view.slots.iter().position(|s| {
            matches!(s.state, SlotState::Used { fp, register } if register == old && hash.matches(fp))
        }) else {
            // Unmapped by someone else: ours must not be finished later.
            if !rule_out_own(&mut eng, &ballots, &unacked, false).await? {
                continue;
            }
            return Ok(false);
        };
        if tag.is_some_and(|tag| tag.bucket != eng.bucket(i) || view.slots[slot].tag != tag.ballot)
        {
            // Another life of the mapping: unmapped and mapped again since the
            // caller's lookup. Not the one the caller decided to remove.
            if !rule_out_own(&mut eng, &ballots, &unacked, false).await? {
                continue;
            }
            return Ok(false);
        }
        if same_key.is_none() {
            continue;
        }
        if let Some(p) = unacked[i] {
            let left = owner.ack_wait_left(i, p, eng.now(), config.ack_wait_ns);
            if left > 0 {
                wait_ack(&mut eng, i, p, left).await?;
                continue;
            }
        }
        let proposal = match new {
            None => Proposal::Clear {
                slot: slot as u8,
                nonce,
            },
            Some(register) => Proposal::Set {
                slot: slot as u8,
                register,
            },
        };
        let Some(ballot) = ballots[i] else { continue };
        eng.watch(i, proposal, ballot);
        if eng.accept(i, ballot, proposal).await? {
            let contested = eng.contested();
            eng.apply(i, ballot, proposal, Some(hash.fp), contested)
                .await?;
            return Ok(true);
        }
    }
    Err(IndexError::Contention {
        attempts: config.max_attempts,
        bucket: hash.first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgement_waits_count_from_the_first_sighting() {
        let mut owner = Owner::default();
        let p = Proposal::Set {
            slot: 1,
            register: 9,
        };
        let q = Proposal::Clear { slot: 1, nonce: 3 };
        let (b, later) = (Ballot(13), Ballot(24));
        assert_eq!(owner.ack_wait_left(0, (b, p), 100, 50), 50);
        assert_eq!(owner.ack_wait_left(0, (b, p), 130, 50), 20);
        assert_eq!(owner.ack_wait_left(0, (b, p), 170, 50), 0);
        // Another change restarts the wait; buckets are independent.
        assert_eq!(owner.ack_wait_left(0, (b, q), 170, 50), 50);
        assert_eq!(owner.ack_wait_left(1, (b, p), 180, 50), 50);
        // The same proposal applied again under a newer tag (a later life of the
        // mapping: the register came back to its key, in the same slot) is another
        // change: its owner gets a whole wait too.
        assert_eq!(owner.ack_wait_left(1, (b, p), 230, 50), 0);
        assert_eq!(owner.ack_wait_left(1, (later, p), 230, 50), 50);
    }

    /// An insert that reports its key present rules out its own proposal first
    /// (`rule_out_own`; docs/pauses.md, "Found at the index level"). Our earlier
    /// attempt's `SET slot 0 := R` in the key's first bucket was accepted under
    /// ballot 5 by node 0 only (nodes 1 and 2 had promised 6 to someone, with a no-op
    /// accepted under 3); the key is mapped to `E` in its second bucket. Node 0 is
    /// slow to us, so our next promise and its view (nodes 1 and 2) do not show our
    /// `SET`, and the insert reports `Exists(E)`. Later a reader whose quorum is
    /// nodes 0 and 1 meets our `SET` as the newest accepted value: unless a newer
    /// value was accepted on a quorum, it must finish it (Paxos), mapping `R`, which
    /// the caller retired on `Exists`.
    #[test]
    fn an_insert_that_reports_its_key_present_rules_out_its_own_proposal() {
        use super::super::IndexConfig;
        use super::super::bucket::applied_slot;
        use super::super::word::Meta;
        use crate::test_support::Holding;
        use swarm_core::{Batch, MemCluster, NodeId, block_on};

        let ix = crate::index::tiny_test_index(IndexConfig::new(3));
        let cluster = MemCluster::new(3, ix.layout().end() as usize);
        let setup = cluster.client();
        let write = |node: u16, at: u64, data: Vec<u8>| {
            let ticket = setup.post(NodeId(node), Batch::write(at, data));
            assert!(matches!(setup.poll(ticket), core::task::Poll::Ready(Ok(_))));
        };
        // A key whose two candidate buckets differ.
        let (key, hash) = (0..64)
            .map(|k| format!("k{k}").into_bytes())
            .map(|k| {
                let hash = ix.hash_key(&k).expect("a key").hash();
                (k, hash)
            })
            .find(|(_, h)| h.buckets().len() == 2)
            .expect("a key with two buckets");
        let (first, second) = (
            ix.layout().bucket(hash.first),
            ix.layout().bucket(hash.second),
        );
        let (mine, existing): (u64, u64) = (9, 12);
        for r in [mine, existing] {
            let at = ix.layout().key_header(r).expect("a register");
            for node in 0..3 {
                write(node, at, crate::layout::encode_key_header(&key));
            }
        }
        let ours = Proposal::Set {
            slot: 0,
            register: mine,
        };
        let meta = |promised: u16, accepted: (u16, Proposal)| {
            Meta {
                promised: Ballot(promised),
                accepted: Some((Ballot(accepted.0), accepted.1)),
                fast: false,
            }
            .encode()
        };
        write(0, first, meta(5, (5, ours)).to_le_bytes().to_vec());
        for node in 1..3 {
            write(
                node,
                first,
                meta(6, (3, Proposal::Noop)).to_le_bytes().to_vec(),
            );
        }
        let theirs = Proposal::Set {
            slot: 0,
            register: existing,
        };
        let mapped = applied_slot(Ballot(3), theirs, Some(hash.fp)).encode();
        for node in 0..3 {
            write(node, second, meta(3, (3, theirs)).to_le_bytes().to_vec());
            write(node, second + 8, mapped.to_le_bytes().to_vec());
        }

        // Our insert, node 0 slow to it, watching its earlier attempt's `SET`.
        let slow_0 = Holding::new(cluster.client(), &[0]);
        let stats = OpStats::new();
        let hashed = ix.hash_key(&key).expect("a key");
        let outcome = block_on(&slow_0, async {
            let mut eng = hashed_insert_engine(&ix, &slow_0, &stats, hash, mine, Nanos::MAX);
            eng.watch(0, ours, Ballot(5));
            let views = eng.read().await?;
            let read = InsertRead {
                eng,
                views,
                key: hashed,
                register: mine,
            };
            finish_insert(read, &stats).await
        });
        assert_eq!(outcome, Ok(InsertOutcome::Exists(existing)));

        // A reader whose quorum is nodes 0 and 1 (node 2 slow to it).
        let slow_2 = Holding::new(cluster.client(), &[2]);
        let found = block_on(
            &slow_2,
            super::super::lookup::lookup(&ix, &slow_2, &stats, &ix.hash_key(&key).expect("a key")),
        )
        .expect("a lookup");
        assert!(
            !found.registers.contains(&mine),
            "the register our insert reported not mapped is mapped: {found:?}"
        );
    }

    /// The schedule of `tests/delete_race_sim.rs`'s seed 797, as the owner saw it.
    /// Our insert's accept of `SET slot 2 := 7` under ballot 10 took on one node only
    /// (the others had promised another insert's ballot). That insert then decided
    /// its `SET` on the other two nodes, and its client deleted the key (a `CLEAR`
    /// under ballot 14, applied). Meanwhile our next promise, ballot 12, reached the
    /// node holding our accept and one of the others before those changes; its
    /// read-back of the latter's slots came after them. So the promise view shows
    /// our `SET` as the newest accepted value and a newer change in its slot, and
    /// nothing proves our `SET` decided: it must not be taken for done (it was
    /// reported inserted, and the get that followed through the cache returned a
    /// value of a key that was absent), and nobody may write it into a slot.
    #[test]
    fn an_owner_does_not_take_its_change_superseded_unproven_for_done() {
        use super::super::IndexConfig;
        use super::super::bucket::{NodeBucket, applied_slot};
        use super::super::word::{Meta, SLOTS, Slot};
        use swarm_core::{MemCluster, block_on};

        const MINE: Proposal = Proposal::Set {
            slot: 2,
            register: 7,
        };
        let ix = crate::index::tiny_test_index(IndexConfig::new(3));
        let cluster = MemCluster::new(3, ix.layout().end() as usize);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let fp = 11;
        let mut eng = Engine::new(&ix, &fabric, &stats, &[1], 0);
        eng.watch(0, MINE, Ballot(10));

        let empty = [Slot::EMPTY; SLOTS];
        let promised = |accepted: (u16, Proposal)| Meta {
            promised: Ballot(12),
            accepted: Some((Ballot(accepted.0), accepted.1)),
            fast: false,
        };
        let mut moved_on = empty;
        moved_on[2] = applied_slot(Ballot(14), Proposal::Clear { slot: 2, nonce: 5 }, Some(9));
        let copies = [
            NodeBucket::of(promised((10, MINE)), empty),
            NodeBucket::of(promised((9, Proposal::Noop)), moved_on),
        ];
        let view = View::merge(&copies, 2).unwrap();
        assert!(view.superseded_unproven());
        assert!(matches!(view.status(), Status::Open { .. }));

        eng.observe(0, fabric.now(), &copies);
        let views = [Some(view), None];
        let ballots = [Some(Ballot(12)), None];
        assert_eq!(eng.fate(&views), Fate::None);
        let judged = block_on(&fabric, earlier(&mut eng, &views, &ballots, fp));
        assert_eq!(judged, Ok(Earlier::None), "not taken for done");
        // Nothing was applied: no slot holds it.
        let read = block_on(&fabric, async { eng.read().await.map(|v| v[0].slots[2]) });
        assert_eq!(read, Ok(Slot::EMPTY));

        // Not seen again for longer than the acknowledgement wait: had it been
        // decided, it could have been applied and overwritten unseen.
        let later = fabric.now() + ix.config.ack_wait_ns;
        fabric.wake_at(later);
        while fabric.now() < later {
            fabric.progress();
        }
        eng.observe(0, fabric.now(), &copies);
        assert_eq!(eng.fate(&views), Fate::Unknown);
    }
}
