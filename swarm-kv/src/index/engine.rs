//! The Paxos steps on one key's candidate buckets: read, promise, accept, settle
//! (module docs of [`super`]); applying decided changes is in `apply`, following
//! one's own proposals in `watch`.
//!
//! An [`Engine`] lives for one index operation. It remembers the last word it saw
//! from each node for each bucket, so that its CASes expect the right values, and it
//! builds [`View`]s from quorums of copies. It decides nothing by itself: callers
//! (`lookup`, `update`) look at the views and choose the next step.

use core::cell::Cell;

use swarm_core::fabric::{Batch, Completion, Nanos, NodeId, Op};
use swarm_core::quorum::{broadcast_until_among, preferred_step_reporting_late};
use swarm_core::{Fabric, OpStats, yield_now};

use super::bucket::{BucketError, NodeBucket, Status, View};
use super::schedule::{Jitter, sleep};
use super::watch::Watch;
use super::word::{Ballot, Meta, Proposal, SLOTS, Slot};
use super::{Index, IndexError};
use crate::layout::BUCKET_BYTES;

/// The most buckets one operation touches: a key's two candidates.
pub const MAX_BUCKETS: usize = 2;

/// The last words seen from one node for one bucket.
#[derive(Clone, Copy, Debug, Default)]
struct Known {
    meta: Option<u64>,
    slots: Option<[u64; SLOTS]>,
}

/// What a promise step achieved.
#[derive(Debug)]
pub struct Promised {
    /// Per bucket: whether the ballot is now owned (promised by a quorum).
    pub ok: [bool; MAX_BUCKETS],
    /// Per owned bucket: the view of the promising quorum, acceptor states as of the
    /// promise (what Paxos phase 1 reports).
    pub views: [Option<View>; MAX_BUCKETS],
    /// Key-header bytes read along, from each replying node.
    pub headers: Vec<(NodeId, Vec<u8>)>,
}

/// How [`Engine::settle`] left a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// No change in flight.
    Free,
    /// The latest change is applied but its owner has not acknowledged it.
    Unacked(Ballot, Proposal),
    /// A change was helped along; look again.
    Progress,
    /// Our ballot was beaten while helping; retry.
    Lost,
}

/// One planned operation of a promise batch.
#[derive(Clone, Copy, Debug)]
enum Planned {
    Promise {
        bucket: usize,
        expected: u64,
        new: u64,
    },
    ReadBucket {
        bucket: usize,
    },
    ReadHeader,
}

/// One index operation's view of a key's buckets.
#[derive(Debug)]
pub struct Engine<'a, F: Fabric> {
    pub(super) ix: &'a Index,
    pub(super) fabric: &'a F,
    pub(super) stats: &'a OpStats,
    buckets: heapless::Vec<u64, MAX_BUCKETS>,
    known: Vec<[Known; MAX_BUCKETS]>,
    jitter: Jitter,
    pub(super) watches: Vec<Watch>,
    /// The last accept met a newer promise somewhere: a helper may be deciding and
    /// applying the same value under its own ballot.
    contested: bool,
    /// No CAS is posted after this instant on the fabric's clock (the caller's
    /// operation deadline; `Nanos::MAX`: none).
    deadline: Nanos,
}

impl<'a, F: Fabric> Engine<'a, F> {
    /// An engine for `buckets` (one or two distinct bucket numbers).
    pub fn new(
        ix: &'a Index,
        fabric: &'a F,
        stats: &'a OpStats,
        buckets: &[u64],
        seed: u64,
    ) -> Self {
        let buckets = buckets.iter().copied().take(MAX_BUCKETS).collect();
        let jitter = Jitter::new(seed ^ fabric.now() ^ u64::from(ix.config.client_id) << 40);
        Self {
            ix,
            fabric,
            stats,
            buckets,
            known: vec![[Known::default(); MAX_BUCKETS]; ix.nodes],
            jitter,
            watches: Vec::new(),
            contested: false,
            deadline: Nanos::MAX,
        }
    }

    /// This engine, posting no CAS after `deadline` (fabric clock): the operation
    /// deadline that makes register recycling safe (`crate::registers::recycle`). A paused
    /// remove that resumed after the register it names was reused for the same key
    /// would otherwise unmap the live mapping.
    pub fn until(mut self, deadline: Nanos) -> Self {
        self.deadline = deadline;
        self
    }

    /// Fails with [`IndexError::Fenced`] once the deadline passed.
    pub(super) fn fence(&self) -> Result<(), IndexError> {
        if self.fabric.now() > self.deadline {
            return Err(IndexError::Fenced {
                deadline: self.deadline,
            });
        }
        Ok(())
    }

    /// The index this engine works for.
    pub fn index(&self) -> &'a Index {
        self.ix
    }

    /// Number of buckets.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Bucket number of bucket index `i`.
    pub fn bucket(&self, i: usize) -> u64 {
        self.buckets[i]
    }

    /// The fabric's clock.
    pub fn now(&self) -> Nanos {
        self.fabric.now()
    }

    pub(super) fn meta_addr(&self, i: usize) -> u64 {
        self.ix.layout.bucket(self.buckets[i])
    }

    pub(super) fn slot_addr(&self, i: usize, slot: usize) -> u64 {
        self.meta_addr(i) + 8 * (slot as u64 + 1)
    }

    pub(super) fn quorum(&self) -> usize {
        self.ix.quorum()
    }

    fn registers(&self) -> u64 {
        self.ix.layout.register_ids()
    }

    /// Sleeps a randomised, exponentially growing pause before attempt `attempt`.
    pub async fn backoff(&mut self, attempt: u32) {
        let c = &self.ix.config;
        let ns = self
            .jitter
            .backoff(attempt, c.retry_delay_ns, c.max_backoff_ns);
        sleep(self.fabric, ns).await;
    }

    /// Backs off before attempt `attempt` ([`Engine::backoff`]), then reads the
    /// buckets again (one roundtrip). What the last attempt learned of them is as old
    /// as the pause, and the next promise's CASes expect those words: under steady
    /// changes by others (one hot key inserted and deleted by several clients), CASes
    /// expecting the words of before the pause never took, and a call retried until
    /// its operation deadline (`tests/delete_race_sim.rs`, one hot key).
    pub async fn backoff_and_reread(&mut self, attempt: u32) -> Result<(), IndexError> {
        self.backoff(attempt).await;
        self.read().await.map(drop)
    }

    /// Sleeps `ns`.
    pub async fn pause(&self, ns: Nanos) {
        sleep(self.fabric, ns).await;
    }

    /// A fresh ballot ([`Self::next_ballot`]) for every bucket, to promise them all.
    pub fn next_ballots(&self) -> [Option<Ballot>; MAX_BUCKETS] {
        let mut ballots = [None; MAX_BUCKETS];
        for (i, b) in ballots.iter_mut().enumerate().take(self.len()) {
            *b = Some(self.next_ballot(i));
        }
        ballots
    }

    /// The ballot after every promise seen for bucket `i`.
    pub fn next_ballot(&self, i: usize) -> Ballot {
        let mut max: Option<Ballot> = None;
        for k in &self.known {
            if let Some(Ok(meta)) = k[i].meta.map(Meta::decode) {
                max = Some(max.map_or(meta.promised, |m| m.newest(meta.promised)));
            }
        }
        max.unwrap_or_default().next()
    }

    /// The meta word node `node` probably holds for bucket `i`: the last one seen
    /// there, else the one most nodes were seen with, else all-zero.
    pub(super) fn expected_meta(&self, node: usize, i: usize) -> u64 {
        if let Some(word) = self.known.get(node).and_then(|k| k[i].meta) {
            return word;
        }
        mode(self.known.iter().filter_map(|k| k[i].meta)).unwrap_or(0)
    }

    /// The meta word of bucket `i` every node seen so far showed, if they agree.
    pub(super) fn agreed_meta(&self, i: usize) -> Option<u64> {
        let mut words = self.known.iter().filter_map(|k| k[i].meta);
        let first = words.next()?;
        words.all(|w| w == first).then_some(first)
    }

    /// The slot word node `node` probably holds for slot `s` of bucket `i`.
    pub(super) fn expected_slot(&self, node: usize, i: usize, s: usize) -> u64 {
        if let Some(words) = self.known.get(node).and_then(|k| k[i].slots) {
            return words[s];
        }
        mode(self.known.iter().filter_map(|k| k[i].slots.map(|w| w[s]))).unwrap_or(0)
    }

    fn learn_copy(&mut self, node: NodeId, i: usize, copy: &NodeBucket) {
        if let Some(k) = self.known.get_mut(node.index()) {
            k[i].meta = Some(copy.meta_word);
            k[i].slots = Some(copy.slot_words);
        }
    }

    pub(super) fn learn_meta(&mut self, node: NodeId, i: usize, word: u64) {
        if let Some(k) = self.known.get_mut(node.index()) {
            k[i].meta = Some(word);
        }
    }

    /// Learns bucket `i`'s meta word at `node` from a CAS of it from `expected` to
    /// `new` that found `previous` there (`None`: no answer, nothing learned).
    pub(super) fn learn_cas(
        &mut self,
        node: NodeId,
        i: usize,
        expected: Option<u64>,
        previous: Option<u64>,
        new: u64,
    ) {
        match previous {
            Some(p) if Some(p) == expected => self.learn_meta(node, i, new),
            Some(p) => self.learn_meta(node, i, p),
            None => {}
        }
    }

    /// The newest copy of slot `s` of bucket `i` among the words last seen from every
    /// node.
    pub(super) fn newest_known(&self, i: usize, s: usize) -> Option<Slot> {
        let mut newest: Option<Slot> = None;
        for words in self.known.iter().filter_map(|k| k[i].slots) {
            if let Ok(slot) = Slot::decode(words[s])
                && newest.is_none_or(|n| slot.tag.is_newer_than(n.tag))
            {
                newest = Some(slot);
            }
        }
        newest
    }

    pub(super) fn learn_slot(&mut self, node: NodeId, i: usize, s: usize, word: u64) {
        if let Some(Some(words)) = self.known.get_mut(node.index()).map(|k| &mut k[i].slots) {
            words[s] = word;
        }
    }

    fn corrupted(
        &self,
        i: usize,
        bad: Option<(NodeId, BucketError)>,
        error: swarm_core::FabricError,
    ) -> IndexError {
        match bad {
            Some((node, detail)) => IndexError::Corrupted {
                bucket: self.buckets[i],
                node,
                detail,
            },
            None => error.into(),
        }
    }

    /// Reads every bucket from a preferred majority (one roundtrip in the common
    /// case) and returns their views.
    pub async fn read(&mut self) -> Result<heapless::Vec<View, MAX_BUCKETS>, IndexError> {
        let q = self.quorum();
        let registers = self.registers();
        let count = self.buckets.len();
        let addrs: heapless::Vec<u64, MAX_BUCKETS> =
            (0..count).map(|i| self.meta_addr(i)).collect();
        let order = self.ix.order(self.fabric, self.buckets[0]);
        // The nodes asked first: let the cache misses of all their buckets overlap.
        for &node in order.iter().take(q) {
            for &addr in &addrs {
                self.fabric.prefetch(node, addr, BUCKET_BYTES);
            }
        }
        // And those of the other operations in flight on this thread
        // (`OpStats::interleaved`).
        if self.stats.is_interleaved() {
            yield_now(self.fabric).await;
        }
        let sent = self.fabric.now();
        let bad: Cell<Option<(usize, NodeId, BucketError)>> = Cell::new(None);
        let result = preferred_step_reporting_late(
            self.fabric,
            self.stats,
            &order,
            q,
            self.ix.config.slow_after_ns,
            |_| {
                let mut batch = Batch::new();
                for &addr in &addrs {
                    batch.push(Op::Read {
                        addr,
                        len: BUCKET_BYTES as u32,
                    })?;
                }
                Ok(batch)
            },
            |replies| {
                (0..count).all(|i| {
                    replies
                        .iter()
                        .filter(|(node, c)| match parse_read(c, i, registers) {
                            Ok(_) => true,
                            Err(e) => {
                                bad.set(Some((i, *node, e)));
                                false
                            }
                        })
                        .count()
                        >= q
                })
            },
            |node| self.ix.late(self.fabric, node),
        )
        .await;
        let rt = match result {
            Ok(rt) => rt,
            Err(error) => {
                let bad = bad.get();
                let i = bad.map_or(0, |b| b.0);
                return Err(self.corrupted(i, bad.map(|b| (b.1, b.2)), error));
            }
        };
        let mut copies: [Vec<NodeBucket>; MAX_BUCKETS] = Default::default();
        let replies: Vec<(NodeId, Completion)> = rt.replies().to_vec();
        drop(rt);
        for (node, completion) in &replies {
            for (i, list) in copies.iter_mut().enumerate().take(count) {
                if let Ok(copy) = parse_read(completion, i, registers) {
                    list.push(copy);
                    self.learn_copy(*node, i, &copy);
                }
            }
        }
        let mut views = heapless::Vec::new();
        for (i, list) in copies.iter().enumerate().take(count) {
            self.observe(i, sent, list);
            let view = View::merge(list, q).map_err(|detail| IndexError::Corrupted {
                bucket: self.buckets[i],
                node: replies.first().map_or(NodeId(0), |r| r.0),
                detail,
            })?;
            let _ = views.push(view);
        }
        Ok(views)
    }

    /// Paxos phase 1: promises `ballots[i]` for each bucket `i` that has one, on
    /// every node, and reads the buckets back in the same batch (after the CAS). With
    /// `header`, also reads `len` bytes at `addr` (a key header) from every node.
    pub async fn promise(
        &mut self,
        ballots: [Option<Ballot>; MAX_BUCKETS],
        header: Option<(u64, u32)>,
    ) -> Result<Promised, IndexError> {
        self.fence()?;
        let q = self.quorum();
        let registers = self.registers();
        let nodes = self.ix.nodes;
        let mut plans: Vec<heapless::Vec<Planned, 4>> = vec![heapless::Vec::new(); nodes];
        for (node, plan) in plans.iter_mut().enumerate() {
            for (i, ballot) in ballots.iter().enumerate().take(self.buckets.len()) {
                let Some(ballot) = ballot else { continue };
                let expected = self.expected_meta(node, i);
                let Ok(meta) = Meta::decode(expected) else {
                    // A copy we cannot decode cannot be CAS'd meaningfully; just read it.
                    let _ = plan.push(Planned::ReadBucket { bucket: i });
                    continue;
                };
                let new = meta.with_promise(*ballot).encode();
                let _ = plan.push(Planned::Promise {
                    bucket: i,
                    expected,
                    new,
                });
                let _ = plan.push(Planned::ReadBucket { bucket: i });
            }
            if header.is_some() {
                let _ = plan.push(Planned::ReadHeader);
            }
        }
        let addrs: heapless::Vec<u64, MAX_BUCKETS> =
            (0..self.buckets.len()).map(|i| self.meta_addr(i)).collect();
        let wanted: heapless::Vec<usize, MAX_BUCKETS> = (0..self.buckets.len())
            .filter(|&i| ballots[i].is_some())
            .collect();
        let sent = self.fabric.now();
        let successes =
            |plans: &[heapless::Vec<Planned, 4>], replies: &[(NodeId, Completion)], i: usize| {
                replies
                    .iter()
                    .filter(|(node, c)| {
                        plans[node.index()].iter().enumerate().any(|(k, p)| {
                            matches!(p, Planned::Promise { bucket, expected, .. }
                            if *bucket == i && c.cas(k) == Some(*expected))
                        })
                    })
                    .count()
            };
        let rt = broadcast_until_among(
            self.fabric,
            self.stats,
            swarm_core::quorum::nodes(self.ix.nodes),
            q,
            self.ix.config.slow_after_ns,
            |node| {
                let mut batch = Batch::new();
                for p in &plans[node.index()] {
                    match *p {
                        Planned::Promise {
                            bucket,
                            expected,
                            new,
                        } => batch.push(Op::Cas {
                            addr: addrs[bucket],
                            expected,
                            new,
                        })?,
                        Planned::ReadBucket { bucket } => batch.push(Op::Read {
                            addr: addrs[bucket],
                            len: BUCKET_BYTES as u32,
                        })?,
                        Planned::ReadHeader => {
                            let (addr, len) = header.unwrap_or((0, 0));
                            batch.push(Op::Read { addr, len })?
                        }
                    };
                }
                Ok((!batch.is_empty()).then_some(batch))
            },
            |replies| wanted.iter().all(|&i| successes(&plans, replies, i) >= q),
        )
        .await?;
        let replies: Vec<(NodeId, Completion)> = rt.replies().to_vec();
        drop(rt);
        let mut copies: [Vec<NodeBucket>; MAX_BUCKETS] = Default::default();
        let mut as_read: [Vec<NodeBucket>; MAX_BUCKETS] = Default::default();
        let mut headers = Vec::new();
        let mut bad = None;
        for (node, completion) in &replies {
            let plan = &plans[node.index()];
            let mut promised_word: [Option<u64>; MAX_BUCKETS] = [None; MAX_BUCKETS];
            for (k, p) in plan.iter().enumerate() {
                match *p {
                    Planned::Promise {
                        bucket,
                        expected,
                        new,
                    } => {
                        if completion.cas(k) == Some(expected) {
                            promised_word[bucket] = Some(new);
                        }
                    }
                    Planned::ReadBucket { bucket } => {
                        let Some(bytes) = completion.read(k) else {
                            continue;
                        };
                        match NodeBucket::parse(bytes, registers) {
                            Ok(copy) => {
                                self.learn_copy(*node, bucket, &copy);
                                as_read[bucket].push(copy);
                                if let Some(word) = promised_word[bucket] {
                                    match copy.with_meta(word, registers) {
                                        Ok(at_promise) => copies[bucket].push(at_promise),
                                        Err(e) => bad = Some((bucket, *node, e)),
                                    }
                                }
                            }
                            Err(e) => bad = Some((bucket, *node, e)),
                        }
                    }
                    Planned::ReadHeader => {
                        if let Some(bytes) = completion.read(k) {
                            headers.push((*node, bytes.to_vec()));
                        }
                    }
                }
            }
        }
        for &i in &wanted {
            self.observe(i, sent, &as_read[i]);
        }
        let mut out = Promised {
            ok: [false; MAX_BUCKETS],
            views: [None; MAX_BUCKETS],
            headers,
        };
        for &i in &wanted {
            if copies[i].len() >= q {
                let view = View::merge(&copies[i], q).map_err(|detail| IndexError::Corrupted {
                    bucket: self.buckets[i],
                    node: replies.first().map_or(NodeId(0), |r| r.0),
                    detail,
                })?;
                out.ok[i] = true;
                out.views[i] = Some(view);
            } else if let Some((b, node, detail)) = bad
                && b == i
                && successes(&plans, &replies, i) >= q
            {
                // A quorum promised but too few copies were readable.
                return Err(IndexError::Corrupted {
                    bucket: self.buckets[i],
                    node,
                    detail,
                });
            }
        }
        Ok(out)
    }

    /// Whether the last [`Engine::accept`] met a newer promise on some node.
    pub fn contested(&self) -> bool {
        self.contested
    }

    /// Paxos phase 2: asks every node that has not promised a newer ballot to
    /// accept `proposal` under `ballot` for bucket `i`. True when a quorum accepted:
    /// the proposal is decided.
    pub async fn accept(
        &mut self,
        i: usize,
        ballot: Ballot,
        proposal: Proposal,
    ) -> Result<bool, IndexError> {
        self.fence()?;
        let q = self.quorum();
        let addr = self.meta_addr(i);
        let new = Meta::accepting(ballot, proposal, false).encode();
        let expected: Vec<Option<u64>> = (0..self.ix.nodes)
            .map(|node| {
                let word = self.expected_meta(node, i);
                match Meta::decode(word) {
                    Ok(meta) if !meta.promised.is_newer_than(ballot) => Some(word),
                    _ => None,
                }
            })
            .collect();
        if expected.iter().flatten().count() < q {
            return Ok(false);
        }
        let ok = |replies: &[(NodeId, Completion)]| {
            replies
                .iter()
                .filter(|(node, c)| c.cas(0).is_some_and(|p| Some(p) == expected[node.index()]))
                .count()
        };
        // Nodes that promised a newer ballot only get a read of the meta word: every
        // node gets a batch, so a live majority always answers.
        let rt = broadcast_until_among(
            self.fabric,
            self.stats,
            swarm_core::quorum::nodes(self.ix.nodes),
            q,
            self.ix.config.slow_after_ns,
            |node| {
                Ok(Some(match expected[node.index()] {
                    Some(e) => Batch::cas(addr, e, new),
                    None => Batch::read(addr, 8),
                }))
            },
            |replies| ok(replies) >= q,
        )
        .await?;
        let accepted = ok(rt.replies());
        self.contested = rt.replies().iter().any(|(_, c)| {
            c.cas(0)
                .and_then(|w| Meta::decode(w).ok())
                .is_some_and(|m| m.promised.is_newer_than(ballot))
        });
        let replies: Vec<(NodeId, Option<u64>)> = rt
            .replies()
            .iter()
            .map(|(n, c)| {
                let read = c
                    .read(0)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes);
                (*n, c.cas(0).or(read))
            })
            .collect();
        drop(rt);
        for (node, previous) in replies {
            self.learn_cas(node, i, expected[node.index()], previous, new);
        }
        Ok(accepted >= q)
    }

    /// Moves bucket `i` past whatever change a view shows in flight, helping it with
    /// our owned `ballot` if it is open (Paxos: propose the newest accepted value),
    /// applying it if it is decided.
    pub async fn settle(
        &mut self,
        i: usize,
        view: &View,
        ballot: Option<Ballot>,
    ) -> Result<Settled, IndexError> {
        match view.status() {
            Status::Free => Ok(Settled::Free),
            Status::Unacked { ballot, proposal } => Ok(Settled::Unacked(ballot, proposal)),
            Status::Partial { ballot, proposal } | Status::Decided { ballot, proposal } => {
                self.apply(i, ballot, proposal, None, true).await?;
                Ok(Settled::Progress)
            }
            Status::Open { proposal, .. } => {
                let Some(ours) = ballot else {
                    return Ok(Settled::Lost);
                };
                if self.accept(i, ours, proposal).await? {
                    self.apply(i, ours, proposal, None, true).await?;
                    Ok(Settled::Progress)
                } else {
                    Ok(Settled::Lost)
                }
            }
        }
    }
}

/// Parses read number `i` of a completion as a bucket.
fn parse_read(c: &Completion, i: usize, registers: u64) -> Result<NodeBucket, BucketError> {
    NodeBucket::parse(c.read(i).unwrap_or_default(), registers)
}

/// The most frequent value (first seen wins ties).
fn mode(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for v in values {
        match counts.iter_mut().find(|(x, _)| *x == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((v, 1)),
        }
    }
    let mut best: Option<(u64, usize)> = None;
    for (v, n) in counts {
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((v, n));
        }
    }
    best.map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_picks_the_most_frequent_value() {
        assert_eq!(mode([3, 5, 5, 3, 5].into_iter()), Some(5));
        assert_eq!(mode([7].into_iter()), Some(7));
        assert_eq!(mode([1, 2].into_iter()), Some(1));
        assert_eq!(mode(core::iter::empty()), None);
    }
}
