//! **insert** (SWARM §5.3.1): write the key header and the value into a fresh
//! pre-cleared register (one roundtrip, one batch per replica of a majority:
//! `swarm_core`'s `Client::write_fresh`), then map the key to it in the index
//! (`publish`). If the key already maps to a live register the insert becomes an
//! update of that register; if it maps to a deleted one, the mapping is replaced.
//! Writing the value *before* publishing the mapping means an indexed register is
//! never empty, so readers never see a half-inserted key. A fresh register that was
//! never published is retired (SWARM §5.4): nobody else can know it.

use std::cell::Cell;

use swarm_core::{Clock, Fabric, OpStats, RegisterCache};

use crate::KvError;
use crate::layout::encode_payload;
use crate::registers::recycle::{PoolOrigin, Retired};

use super::publish::{IfPresent, Published};
use super::{KvClient, Located};

impl<F: Fabric, C: Clock> KvClient<F, C> {
    /// Inserts `key` (an insert of a present key becomes an update).
    ///
    /// An insert that runs past its deadline (a stall) stops with
    /// [`KvError::Fenced`]: its outcome is unknown. It is not retried here: a second
    /// write of the value, after another client's write or delete, would make one
    /// insert take effect twice.
    pub async fn insert(&self, key: &[u8], value: &[u8], stats: &OpStats) -> Result<(), KvError> {
        self.insert_once(key, value, stats, IfPresent::Update)
            .await
            .map(drop)
    }

    /// Inserts `key` only if it is absent: `Ok(true)` if this call inserted it,
    /// `Ok(false)` if the key held a value (which is left as it was). A key whose
    /// register holds a tombstone (deleted, not unmapped yet) is absent. A stall past
    /// the deadline stops it with [`KvError::Fenced`], outcome unknown, as
    /// [`Self::insert`].
    pub async fn insert_if_absent(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
    ) -> Result<bool, KvError> {
        let published = self.insert_once(key, value, stats, IfPresent::Keep).await?;
        Ok(published == Published::Yes)
    }

    async fn insert_once(
        &self,
        key: &[u8],
        value: &[u8],
        stats: &OpStats,
        if_present: IfPresent,
    ) -> Result<Published, KvError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let payload = encode_payload(key, value);
        // An earlier insert's unknown outcome, judged first so that its register,
        // if never mapped, goes back to the pool (`undecided`). Its failure is
        // this insert's only when no operation can start. Boxed: it is rare, and
        // inline it would more than double every insert future.
        if !self.undecided.borrow().is_empty() {
            Box::pin(self.judge_one_undecided()).await?;
        }
        // The key is hashed once, for the cache's misses and every index call.
        let key = &self.index.hash_key(key)?;
        // The operation starts once it has its register: waiting for one (for
        // retired registers to pass their grace) posts nothing but chunk claims and
        // resets, which no operation deadline protects.
        let (register, life) = self.allocate_register(&OpStats::new()).await?;
        // Where a recycled register came from: logged if it shows another life.
        let origin = life.and_then(|_| self.recycler.take_origin(register));
        let started = self.begin_write(stats).await?;
        let (start, deadline) = (started.start, started.deadline);
        let mut fresh = Located {
            register,
            loc: self.register_loc(register)?,
            // What the register's reset left on every replica, if it was reset.
            knowledge: life.map_or_else(RegisterCache::new, |marker| {
                RegisterCache::after_reset(marker, usize::from(self.layout.params.replicas))
            }),
            vouched_at: start,
        };
        // Set when an index call could not tell whether it mapped `register`.
        let uncertain = Cell::new(false);
        let result = Box::pin(self.publish(
            key, &payload, &mut fresh, stats, deadline, &uncertain, if_present,
        ))
        .await;
        // A mapped register whose key header is blank on a majority: logged with what
        // each replica holds (the holder tags name the client whose reset blanked it:
        // only a reset's install blanks a key length on a node in service), whether
        // or not the index call could tell what it did (an index error sets
        // `uncertain`, and this one comes from the index).
        if let Err(KvError::Index(crate::index::IndexError::KeyHeader {
            register: mapped,
            problem: crate::index::HeaderProblem::Missing,
        })) = &result
            && self.header_missing_logged.replace(Some(*mapped)) != Some(*mapped)
        {
            tracing::warn!(
                register = *mapped,
                key = ?String::from_utf8_lossy(key.bytes()),
                "insert: a register the index maps has no key header on a majority"
            );
            self.log_replicas(
                *mapped,
                "insert: a replica of the mapped register with no key header",
            )
            .await;
        }
        match &result {
            Ok(Published::Yes) => {}
            // The register's words are another life's than its reset left: it is not
            // this client's to retire (another client may hold it). Left alone: a
            // leak, never a second owner.
            Err(error) if error.is_recycled() => {
                tracing::warn!(
                    register,
                    %error,
                    "insert: a pooled register shows another life; dropped from the pool"
                );
                self.log_other_life(register, life, origin).await;
            }
            // Never published: nobody else can know the register (recycle.rs).
            Ok(Published::No | Published::Present) | Err(_) if !uncertain.get() => {
                self.retire_marked(register, key.bytes().len(), Retired::Unpublished, deadline);
            }
            // Judged later, as an operation of its own (`undecided`).
            _ => {
                tracing::debug!(
                    register,
                    "insert: the index could not tell whether the fresh register was mapped; judged later"
                );
                self.undecided.borrow_mut().push(key.bytes(), &fresh);
            }
        }
        result
    }

    /// Logs what a register of this client's pool that showed another life holds on
    /// each replica, and how it came into the pool ([`PoolOrigin`]): two owners of one
    /// register are a safety bug, and the holder tags name the other one (a tag's low
    /// 11 bits are its writer id, `crate::registers::limbo::holder_tag`; a donated tag
    /// has bit 31 clear). Only on that path: one read of each replica.
    async fn log_other_life(
        &self,
        register: crate::RegisterId,
        life: Option<swarm_core::encoding::Tsp>,
        origin: Option<PoolOrigin>,
    ) {
        let fabric = self.swarm.fabric();
        let now = fabric.now();
        let ms = |at: u64| now.saturating_sub(at) / 1_000_000;
        tracing::warn!(
            register,
            expected = ?life,
            came = ?origin.map(|o| o.came),
            path = ?origin.map(|o| o.path),
            resets = origin.map_or(0, |o| o.resets),
            entered_ms_ago = origin.map(|o| ms(o.entered)),
            pooled_ms_ago = origin.map(|o| ms(o.pooled)),
            own_tag = format_args!("{:#x}", self.recycler.tag()),
            "insert: how the register that shows another life came into this client's pool"
        );
        self.log_replicas(
            register,
            "insert: a replica of the register that shows another life",
        )
        .await;
    }

    /// Logs (warn) what each replica of `register` holds: its key header's length and
    /// holder tag (with the tag's writer id: a tag's low 11 bits,
    /// `crate::registers::limbo::holder_tag`; a donated tag has bit 31 clear), its
    /// delete word and top metadata word; `what` names the line. One read of each
    /// replica; for failure paths only.
    async fn log_replicas(&self, register: crate::RegisterId, what: &'static str) {
        let fabric = self.swarm.fabric();
        let Ok(loc) = self.register_loc(register) else {
            return;
        };
        let Some(seen) = crate::registers::reset::inspect(fabric, &self.layout, &loc).await else {
            tracing::warn!(
                register,
                "{what}: the register's replicas could not be read"
            );
            return;
        };
        for (node, view) in seen {
            let tag = view.tag();
            let top = view
                .words
                .iter()
                .take(view.words.len().saturating_sub(1))
                .map(|w| swarm_core::encoding::Tsp::from_word(*w))
                .max();
            tracing::warn!(
                register,
                node = node.index(),
                key_len = view.header as u32,
                tag = format_args!("{tag:#x}"),
                tag_writer = tag & 0x7FF,
                donated = crate::registers::limbo::is_donated(tag),
                delete_word = %view.delete_word(),
                top_meta_word = ?top,
                "{what}"
            );
        }
    }
}
