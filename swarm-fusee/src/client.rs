//! A FUSEE client: SEARCH (get), INSERT, UPDATE and DELETE over SNAPSHOT-replicated
//! RACE hashing with out-of-place objects (FUSEE §4, Figure 9).
//!
//! Roundtrips in the common case, as in FUSEE's Figure 9 and SWARM's Table 2:
//!
//! * **get**: read the primary slot and, with the index cache, the cached object in
//!   the same roundtrip (1 RT); if the slot moved (another client wrote the key) read
//!   the new object (2 RT). A cache miss reads both candidate buckets, then the
//!   matching objects (2 RT).
//! * **update / delete / insert**: ① write the object (with its log entry) to every
//!   replica and read the primary slot (or buckets); ② CAS the backup slots; ③ write the
//!   old value into the log entry; ④ CAS the primary slot: 4 RT (rule 1). Rule 2 or 3
//!   fixes the backups in ③'s roundtrip (5 RT with rule 3's extra primary read), and a
//!   cache miss adds the candidate objects' read. Losers poll the primary until the last
//!   writer moved it (FUSEE Algorithm 1, line 17).
//!
//! Semantics (checked by the linearizability checker in the tests): insert sets the
//! value whether or not the key exists; update sets it only if the key exists and says
//! whether it did; delete removes it and says whether it existed. A loser of a round is
//! linearized just before the last writer, except a delete that lost to a write: it
//! runs another round, since deleting "before" a write would leave the write's value.
//! Keys stay in the slot they first took: delete installs a tombstone object.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use swarm_core::fabric::INLINE_BATCH_OPS;
use swarm_core::{Batch, Completion, Fabric, NodeId, Op, OpStats, post_background};
use tracing::trace;

use crate::alloc::{Allocation, Slab};
use crate::error::FuseeError;
use crate::layout::FuseeLayout;
use crate::master::{Failure, Master, View, all_or_failed};
use crate::object::{self, Kind, LogEntry, OLD_PRESENT, USED, offset};
use crate::rules::{self, Verdict};
use crate::slot::{KeyHash, SLOTS_PER_BUCKET, SlotValue};
use swarm_core::sleep as pause;

/// Client settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseeConfig {
    /// A memory node that does not answer a step within this long is reported to the
    /// master as failed (FUSEE detects it by lease expiry).
    pub fail_timeout_ns: u64,
    /// A loser that waited this long for the last writer to CAS the primary asks the
    /// master to settle the slot (the last writer may have crashed; FUSEE's master
    /// learns it from the client's lease). Longer than a scheduling hiccup.
    pub unfinished_timeout_ns: u64,
    /// Use the index cache (FUSEE §4.6): gets read the cached object with the slot.
    pub use_cache: bool,
}

impl Default for FuseeConfig {
    fn default() -> Self {
        Self {
            fail_timeout_ns: 10_000_000,
            unfinished_timeout_ns: 100_000_000,
            use_cache: true,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct CacheEntry {
    slot: u64,
    word: u64,
}

/// Why a step did not complete.
enum StepError {
    /// These nodes did not answer in time.
    Failed(u16),
    /// The membership changed (or is changing): re-read it.
    ViewChanged,
    /// The last writer of the slot's round did not finish in time.
    Unfinished,
    /// Not recoverable.
    Fatal(FuseeError),
}

impl From<FuseeError> for StepError {
    fn from(e: FuseeError) -> Self {
        Self::Fatal(e)
    }
}

impl From<Failure> for StepError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Nodes(mask) => Self::Failed(mask),
            Failure::Fatal(e) => Self::Fatal(e),
        }
    }
}

type Step<T> = Result<T, StepError>;

/// How a write round ended for this writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// This writer's value is in the primary.
    Won,
    /// Another value won: the primary holds it.
    Lost(u64),
}

/// What a write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Insert,
    Update,
    Delete,
}

/// Where a key is.
enum Lookup {
    Found {
        slot: u64,
        word: u64,
        object: object::Object,
    },
    Absent {
        first_empty: Option<u64>,
    },
}

/// One client thread's handle on a FUSEE store.
#[derive(Debug)]
pub struct FuseeClient<F: Fabric> {
    fabric: F,
    layout: FuseeLayout,
    master: Arc<Master>,
    id: u16,
    config: FuseeConfig,
    cache: RefCell<HashMap<Vec<u8>, CacheEntry>>,
    slab: RefCell<Slab>,
}

fn word_of(completion: &Completion, i: usize) -> u64 {
    completion
        .read(i)
        .and_then(|b| b.get(..8))
        .map(|b| {
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            u64::from_le_bytes(w)
        })
        .unwrap_or(0)
}

fn reply(replies: &[(NodeId, Completion)], node: NodeId) -> Result<&Completion, StepError> {
    replies
        .iter()
        .find(|(n, _)| *n == node)
        .map(|(_, c)| c)
        .ok_or(StepError::Failed(1 << node.0))
}

impl<F: Fabric> FuseeClient<F> {
    /// A client of the store described by `layout` and `master`, over `fabric`.
    pub fn new(
        fabric: F,
        layout: FuseeLayout,
        master: Arc<Master>,
        config: FuseeConfig,
    ) -> Result<Self, FuseeError> {
        let id = master.register_client()?;
        let p = layout.params();
        let cursor = u64::from(id) * p.blocks / u64::from(p.max_clients);
        Ok(Self {
            fabric,
            layout,
            master,
            id,
            config,
            cache: RefCell::new(HashMap::new()),
            slab: RefCell::new(Slab::new(cursor)),
        })
    }

    /// The fabric handle.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// This client's id (its log head and block-table entries).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The master.
    pub fn master(&self) -> &Arc<Master> {
        &self.master
    }

    fn check(&self, key: &[u8], value: &[u8]) -> Result<(), FuseeError> {
        let p = self.layout.params();
        if key.is_empty() || key.len() > p.key_max as usize {
            return Err(FuseeError::KeySize {
                len: key.len(),
                max: p.key_max,
            });
        }
        if value.len() > p.value_max as usize {
            return Err(FuseeError::ValueSize {
                len: value.len(),
                max: p.value_max,
            });
        }
        Ok(())
    }

    /// The membership, once no change is being prepared.
    async fn current_view(&self) -> View {
        while self.master.is_preparing() {
            pause(&self.fabric, 2_000).await;
        }
        self.master.view()
    }

    /// One roundtrip under `view`: every batch of `posts` must complete.
    async fn step(
        &self,
        view: View,
        posts: Vec<(NodeId, Batch)>,
        stats: &OpStats,
    ) -> Step<Vec<(NodeId, Completion)>> {
        let Some(_guard) = self.master.enter(view.epoch) else {
            return Err(StepError::ViewChanged);
        };
        Ok(all_or_failed(&self.fabric, stats, posts, self.config.fail_timeout_ns).await?)
    }

    /// Runs the master's recovery for nodes `mask` that did not answer and/or a `slot`
    /// whose round nobody finished, seen under `view`.
    async fn ask_master(&self, view: View, mask: u16, slot: Option<u64>) -> Result<(), FuseeError> {
        self.master
            .recover(
                &self.fabric,
                &self.layout,
                view.epoch,
                mask,
                slot,
                self.config.fail_timeout_ns,
            )
            .await
    }

    /// Deals with a step that failed before this operation changed anything.
    async fn recover(&self, view: View, e: StepError) -> Result<(), FuseeError> {
        match e {
            StepError::Failed(mask) => self.ask_master(view, mask, None).await,
            StepError::ViewChanged => Ok(()),
            StepError::Unfinished => Ok(()),
            StepError::Fatal(e) => Err(e),
        }
    }

    fn decode(&self, bytes: Option<&[u8]>, addr: u64) -> Result<object::Object, FuseeError> {
        object::decode(bytes.unwrap_or_default(), addr, self.layout.object_bytes())
    }

    fn object_addr(&self, slot: u64, word: u64) -> Result<u64, FuseeError> {
        match SlotValue::decode(word) {
            Some(v) if self.layout.is_object(v.addr) => Ok(v.addr),
            _ => Err(FuseeError::CorruptSlot { slot, word }),
        }
    }

    fn read_object_op(&self, addr: u64) -> Op {
        Op::Read {
            addr,
            len: self.layout.object_bytes() as u32,
        }
    }

    fn remember(&self, key: &[u8], slot: u64, word: u64) {
        if self.config.use_cache {
            self.cache
                .borrow_mut()
                .insert(key.to_vec(), CacheEntry { slot, word });
        }
    }

    fn cached(&self, key: &[u8]) -> Option<CacheEntry> {
        if !self.config.use_cache {
            return None;
        }
        self.cache.borrow().get(key).copied()
    }

    /// The value of `key`, `None` if absent (FUSEE SEARCH).
    pub async fn get(&self, key: &[u8], stats: &OpStats) -> Result<Option<Vec<u8>>, FuseeError> {
        self.check(key, &[])?;
        loop {
            let view = self.current_view().await;
            match self.try_get(view, key, stats).await {
                Ok(value) => return Ok(value),
                Err(e) => self.recover(view, e).await?,
            }
        }
    }

    async fn try_get(&self, view: View, key: &[u8], stats: &OpStats) -> Step<Option<Vec<u8>>> {
        if let Some(c) = self.cached(key) {
            let addr = self.object_addr(c.slot, c.word)?;
            let mut batch = Batch::read(c.slot, 8);
            batch
                .push(self.read_object_op(addr))
                .map_err(FuseeError::from)?;
            let replies = self.step(view, vec![(view.primary, batch)], stats).await?;
            let primary = reply(&replies, view.primary)?;
            let word = word_of(primary, 0);
            if word == c.word {
                let object = self.decode(primary.read(1), addr)?;
                if object.key == key {
                    return Ok(value_of(object));
                }
            } else if SlotValue::decode(word).is_some() {
                // Moved by another client: follow the slot (second roundtrip).
                let addr = self.object_addr(c.slot, word)?;
                let batch = Batch::read(addr, self.layout.object_bytes() as u32);
                let replies = self.step(view, vec![(view.primary, batch)], stats).await?;
                let object = self.decode(reply(&replies, view.primary)?.read(0), addr)?;
                if object.key == key {
                    self.remember(key, c.slot, word);
                    return Ok(value_of(object));
                }
            }
            self.cache.borrow_mut().remove(key);
        }
        match self.lookup(view, key, stats).await? {
            Lookup::Found { slot, word, object } => {
                self.remember(key, slot, word);
                Ok(value_of(object))
            }
            Lookup::Absent { .. } => Ok(None),
        }
    }

    /// Reads both candidate buckets of `key` on the primary, then the objects whose
    /// fingerprint matches.
    async fn lookup(&self, view: View, key: &[u8], stats: &OpStats) -> Step<Lookup> {
        let hash = KeyHash::of(key, self.layout.params().buckets);
        let mut batch = Batch::new();
        self.push_bucket_reads(&mut batch, hash)?;
        let replies = self.step(view, vec![(view.primary, batch)], stats).await?;
        let words = self.bucket_words(reply(&replies, view.primary)?, 0, hash);
        self.find(view, key, hash, &words, stats).await
    }

    /// Appends the reads of `hash`'s two candidate buckets to `batch`.
    fn push_bucket_reads(&self, batch: &mut Batch, hash: KeyHash) -> Result<(), FuseeError> {
        for b in hash.buckets {
            batch.push(Op::Read {
                addr: self.layout.bucket(b),
                len: (SLOTS_PER_BUCKET * 8) as u32,
            })?;
        }
        Ok(())
    }

    /// The slots of both candidate buckets, read as ops `first` and `first + 1`.
    fn bucket_words(
        &self,
        completion: &Completion,
        first: usize,
        hash: KeyHash,
    ) -> Vec<(u64, u64)> {
        let mut words = Vec::with_capacity(2 * SLOTS_PER_BUCKET);
        for (i, b) in hash.buckets.into_iter().enumerate() {
            let base = self.layout.bucket(b);
            let bytes = completion.read(first + i).unwrap_or_default();
            for s in 0..SLOTS_PER_BUCKET {
                let w = bytes
                    .get(s * 8..s * 8 + 8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .unwrap_or(0);
                words.push((base + 8 * s as u64, w));
            }
        }
        words
    }

    /// Finds `key` among bucket slots `words` (read from the primary).
    async fn find(
        &self,
        view: View,
        key: &[u8],
        hash: KeyHash,
        words: &[(u64, u64)],
        stats: &OpStats,
    ) -> Step<Lookup> {
        let first_empty = words.iter().find(|(_, w)| *w == 0).map(|(slot, _)| *slot);
        let mut candidates = Vec::new();
        for &(slot, word) in words {
            if let Some(v) = SlotValue::decode(word)
                && v.fingerprint == hash.fingerprint
            {
                candidates.push((slot, word, self.object_addr(slot, word)?));
            }
        }
        for chunk in candidates.chunks(INLINE_BATCH_OPS) {
            let mut batch = Batch::new();
            for &(_, _, addr) in chunk {
                batch
                    .push(self.read_object_op(addr))
                    .map_err(FuseeError::from)?;
            }
            let replies = self.step(view, vec![(view.primary, batch)], stats).await?;
            let primary = reply(&replies, view.primary)?;
            for (i, &(slot, word, addr)) in chunk.iter().enumerate() {
                let object = self.decode(primary.read(i), addr)?;
                if object.key == key {
                    return Ok(Lookup::Found { slot, word, object });
                }
            }
        }
        Ok(Lookup::Absent { first_empty })
    }

    /// Sets `key` to `value`, whether or not it exists (FUSEE INSERT).
    pub async fn insert(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
    ) -> Result<(), FuseeError> {
        self.write(key, value, Mode::Insert, stats)
            .await
            .map(|_| ())
    }

    /// Sets `key` to `value` if it exists; returns whether it did (FUSEE UPDATE).
    pub async fn update(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
    ) -> Result<bool, FuseeError> {
        self.write(key, value, Mode::Update, stats).await
    }

    /// Removes `key`; returns whether it existed (FUSEE DELETE).
    pub async fn delete(&self, key: &[u8], stats: &OpStats) -> Result<bool, FuseeError> {
        self.write(key, &[], Mode::Delete, stats).await
    }

    async fn write(
        &self,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        stats: &OpStats,
    ) -> Result<bool, FuseeError> {
        self.check(key, value)?;
        loop {
            let view = self.current_view().await;
            match self.try_write(view, key, value, mode, stats).await {
                Ok(Some(present)) => return Ok(present),
                Ok(None) => {}
                Err(e) => self.recover(view, e).await?,
            }
        }
    }

    /// One attempt; `Ok(None)`: start again.
    async fn try_write(
        &self,
        view: View,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        stats: &OpStats,
    ) -> Step<Option<bool>> {
        let hash = KeyHash::of(key, self.layout.params().buckets);
        let alloc = self.allocate(view, stats).await?;
        let kind = if mode == Mode::Delete {
            Kind::Tombstone
        } else {
            Kind::Value
        };
        let v_new = SlotValue {
            addr: alloc.addr,
            fingerprint: hash.fingerprint,
            tombstone: kind == Kind::Tombstone,
        }
        .encode()
        .ok_or(FuseeError::CorruptSlot {
            slot: 0,
            word: alloc.addr,
        })?;
        let ob = self.layout.object_bytes();
        let log = LogEntry {
            prev: alloc.prev,
            next: alloc.next,
            slot: 0,
            old: 0,
        };
        let bytes = object::encode(ob, alloc.addr, key, value, kind, log);
        let cached = self.cached(key);
        // ① The object to every replica; the primary slot (or buckets) read after it.
        let mut posts = Vec::new();
        for node in view.nodes() {
            let mut batch = Batch::write(alloc.addr, bytes.clone());
            batch
                .push(Op::Write {
                    addr: alloc.addr + offset::used(ob),
                    data: USED.to_le_bytes().to_vec().into(),
                })
                .map_err(FuseeError::from)?;
            if node == view.primary {
                match cached {
                    Some(c) => {
                        batch
                            .push(Op::Read {
                                addr: c.slot,
                                len: 8,
                            })
                            .map_err(FuseeError::from)?;
                    }
                    None => self.push_bucket_reads(&mut batch, hash)?,
                }
            }
            posts.push((node, batch));
        }
        let replies = self.step(view, posts, stats).await?;
        let primary = reply(&replies, view.primary)?;
        let found = match cached {
            Some(c) => Some((c.slot, word_of(primary, 2))),
            None => {
                let words = self.bucket_words(primary, 2, hash);
                match self.find(view, key, hash, &words, stats).await? {
                    Lookup::Found { slot, word, .. } => Some((slot, word)),
                    Lookup::Absent { first_empty } => match mode {
                        Mode::Insert => Some((first_empty.ok_or(FuseeError::IndexFull)?, 0)),
                        Mode::Update | Mode::Delete => None,
                    },
                }
            }
        };
        let absent = match found {
            None => true,
            Some((_, word)) => SlotValue::decode(word).is_none_or(|v| v.tombstone),
        };
        let Some((slot, v_old)) = found.filter(|_| mode == Mode::Insert || !absent) else {
            self.discard(view, alloc.addr);
            return Ok(Some(false));
        };
        if v_old != 0 {
            // A cached slot may hold another key only if memory is corrupted.
            self.object_addr(slot, v_old)?;
        }
        match self
            .round(view, slot, v_old, v_new, alloc.addr, stats)
            .await?
        {
            Round::Won => {
                self.remember(key, slot, v_new);
                Ok(Some(!absent || mode == Mode::Insert))
            }
            Round::Lost(winner) => {
                self.discard(view, alloc.addr);
                if v_old == 0 {
                    // We raced for an empty slot: was the winner our key?
                    let addr = self.object_addr(slot, winner)?;
                    let batch = Batch::read(addr, ob as u32);
                    let view = self.current_view().await;
                    let replies = self.step(view, vec![(view.primary, batch)], stats).await?;
                    let object = self.decode(reply(&replies, view.primary)?.read(0), addr)?;
                    if object.key != key {
                        trace!(
                            slot,
                            "FUSEE insert lost its empty slot to another key: retry"
                        );
                        return Ok(None);
                    }
                }
                let winner_deleted = SlotValue::decode(winner).is_some_and(|v| v.tombstone);
                if mode == Mode::Delete && !winner_deleted {
                    return Ok(None);
                }
                self.remember(key, slot, winner);
                Ok(Some(match mode {
                    Mode::Delete => false,
                    Mode::Insert | Mode::Update => true,
                }))
            }
        }
    }

    /// Marks an object this client will not link as unused (FUSEE §4.5), off the
    /// critical path.
    fn discard(&self, view: View, addr: u64) {
        let at = addr + offset::used(self.layout.object_bytes());
        for node in view.nodes() {
            post_background(
                &self.fabric,
                node,
                Batch::write(at, 0u64.to_le_bytes().to_vec()),
            );
        }
    }

    /// The SNAPSHOT write of `v_new` over `v_old` in `slot` (Algorithms 1, 2 and 4).
    ///
    /// A round interrupted by a membership change, a failed node or a last writer
    /// that never finished is simply run again under the new membership, after the
    /// master made every alive copy of the slot equal to some value `s` (or left the
    /// slot alone, if the change was about another one). Every step is idempotent for
    /// the same `(v_old, v_new)`: a backup CAS returns what the copy holds, so the
    /// snapshot and the verdict are the same as before, or reflect `s`: `s = v_new`
    /// (this writer won; its primary CAS returns `v_new`), `s = v_old` (nobody's
    /// value was kept: the round starts afresh among the same writers) or another
    /// value (lost, learnt from the primary). This is Algorithm 4's "retry WRITE"
    /// without a fresh object, and it needs no further settling, so one recovery does
    /// not set off others.
    async fn round(
        &self,
        mut view: View,
        slot: u64,
        v_old: u64,
        v_new: u64,
        object: u64,
        stats: &OpStats,
    ) -> Step<Round> {
        loop {
            let recovery = match self
                .round_steps(view, slot, v_old, v_new, object, stats)
                .await
            {
                // The master may have installed this writer's own value while it was
                // parked (it was a backup's value), and another write may even have
                // replaced it since: its linearization point was the installation.
                Ok(Round::Lost(winner)) if winner == v_new || self.master.installed(v_new) => {
                    return Ok(Round::Won);
                }
                Ok(round) => return Ok(round),
                Err(StepError::Fatal(e)) => return Err(StepError::Fatal(e)),
                Err(StepError::ViewChanged) => None,
                Err(StepError::Failed(mask)) => Some((mask, None)),
                Err(StepError::Unfinished) => Some((0, Some(slot))),
            };
            if let Some((mask, settle)) = recovery {
                self.ask_master(view, mask, settle).await?;
            }
            view = self.current_view().await;
            if self.master.installed(v_new) {
                return Ok(Round::Won);
            }
        }
    }

    async fn round_steps(
        &self,
        view: View,
        slot: u64,
        v_old: u64,
        v_new: u64,
        object: u64,
        stats: &OpStats,
    ) -> Step<Round> {
        let backups: Vec<NodeId> = view.backups().collect();
        // ② CAS every backup from v_old to v_new.
        let mut v_list: Vec<Option<u64>> = Vec::with_capacity(backups.len());
        if !backups.is_empty() {
            let posts = backups
                .iter()
                .map(|&b| (b, Batch::cas(slot, v_old, v_new)))
                .collect();
            let replies = self.step(view, posts, stats).await?;
            for &b in &backups {
                v_list.push(reply(&replies, b)?.cas(0));
            }
        }
        let verdict = rules::evaluate(&mut v_list, v_old, v_new);
        let won_by_rule_1 = match verdict {
            Verdict::Rule1 => true,
            Verdict::Rule2 => false,
            Verdict::CheckPrimary => {
                let replies = self
                    .step(view, vec![(view.primary, Batch::read(slot, 8))], stats)
                    .await?;
                let v_check = word_of(reply(&replies, view.primary)?, 0);
                match rules::rule3(&v_list, v_old, v_new, v_check) {
                    Some(true) => false,
                    Some(false) => return self.lose(view, slot, v_old, stats).await,
                    None => return Ok(Round::Lost(v_check)),
                }
            }
            Verdict::Lose => return self.lose(view, slot, v_old, stats).await,
            Verdict::Fail => return Err(StepError::Failed(0)),
        };
        // ③ The old value into the log entry (with the slot it belongs to), and for
        // rules 2 and 3 the backups that hold another writer's value.
        let ob = self.layout.object_bytes();
        let mut posts = Vec::new();
        for node in view.nodes() {
            let mut batch = Batch::write(object + offset::slot(ob), slot.to_le_bytes().to_vec());
            batch
                .push(Op::Write {
                    addr: object + offset::old(ob),
                    data: (OLD_PRESENT | v_old).to_le_bytes().to_vec().into(),
                })
                .map_err(FuseeError::from)?;
            if !won_by_rule_1
                && let Some(i) = backups.iter().position(|&b| b == node)
                && let Some(current) = v_list[i]
                && current != v_new
            {
                batch
                    .push(Op::Cas {
                        addr: slot,
                        expected: current,
                        new: v_new,
                    })
                    .map_err(FuseeError::from)?;
            }
            posts.push((node, batch));
        }
        self.step(view, posts, stats).await?;
        // ④ CAS the primary.
        let replies = self
            .step(
                view,
                vec![(view.primary, Batch::cas(slot, v_old, v_new))],
                stats,
            )
            .await?;
        let previous = reply(&replies, view.primary)?.cas(0).unwrap_or(0);
        Ok(if previous == v_old || previous == v_new {
            Round::Won
        } else {
            Round::Lost(previous)
        })
    }

    /// A loser waits until the last writer moved the primary (Algorithm 1, line 17).
    async fn lose(&self, view: View, slot: u64, v_old: u64, stats: &OpStats) -> Step<Round> {
        let start = self.fabric.now();
        let mut backoff = 500;
        loop {
            let replies = self
                .step(view, vec![(view.primary, Batch::read(slot, 8))], stats)
                .await?;
            let word = word_of(reply(&replies, view.primary)?, 0);
            if word != v_old {
                return Ok(Round::Lost(word));
            }
            if self.fabric.now().saturating_sub(start) > self.config.unfinished_timeout_ns {
                return Err(StepError::Unfinished);
            }
            pause(&self.fabric, backoff).await;
            backoff = (backoff * 2).min(20_000);
        }
    }

    /// The next object, claiming blocks as needed.
    async fn allocate(&self, view: View, stats: &OpStats) -> Step<Allocation> {
        loop {
            {
                let mut slab = self.slab.borrow_mut();
                if let Some(a) = slab.allocate(&self.layout) {
                    return Ok(a);
                }
            }
            let block = self.claim_block(view, stats).await?;
            self.slab.borrow_mut().add_block(block);
        }
    }

    /// Claims a block on every alive node (FUSEE's MN-side ALLOC, here a CAS).
    async fn claim_block(&self, view: View, stats: &OpStats) -> Step<u64> {
        let blocks = self.layout.params().blocks;
        let (start, started) = {
            let slab = self.slab.borrow();
            (slab.cursor, slab.started)
        };
        let owner = u64::from(self.id) + 1;
        for i in 0..blocks {
            let b = (start + i) % blocks;
            let mut posts = Vec::new();
            for node in view.nodes() {
                let mut batch = Batch::cas(self.layout.block_entry(b), 0, owner);
                if !started {
                    batch
                        .push(Op::Write {
                            addr: self.layout.log_head(self.id),
                            data: self.layout.object(b, 0).to_le_bytes().to_vec().into(),
                        })
                        .map_err(FuseeError::from)?;
                }
                posts.push((node, batch));
            }
            let replies = self.step(view, posts, stats).await?;
            if replies.iter().all(|(_, c)| c.cas(0) == Some(0)) {
                let mut slab = self.slab.borrow_mut();
                slab.cursor = (b + 1) % blocks;
                slab.started = true;
                return Ok(b);
            }
        }
        Err(StepError::Fatal(FuseeError::OutOfBlocks))
    }
}

fn value_of(object: object::Object) -> Option<Vec<u8>> {
    match object.kind {
        Kind::Value => Some(object.value),
        Kind::Tombstone => None,
    }
}
