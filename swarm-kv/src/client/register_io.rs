//! Reading and writing a key's register with the client's [`RegisterProtocol`]:
//! SWARM's Safe-Guess (one roundtrip in the common case, SWARM §3.2), or one of the
//! paper's baselines (§7). A fresh register's first write carries its key header (and,
//! for a one-roundtrip insert, the index's blind round) in the same batch.

use swarm_core::fabric::{FabricError, Op};
use swarm_core::quorum::broadcast;
use swarm_core::{
    Batch, Carried, Clock, Fabric, FreshOutcome, OpStats, ReadValue, RegisterCache, WriteOutcome,
};

use crate::KvError;
use crate::layout::decode_payload;

use super::{KvClient, Located, RegisterProtocol};

/// What a register read for a key holds ([`KvClient::read_keyed`]).
pub(super) enum Keyed {
    /// A value of the key.
    Holds(Vec<u8>),
    /// A tombstone: some key's deleted life (a tombstone does not name its key).
    Deleted,
    /// Nothing, another key's value, or a newer life (reset since it was located).
    Not,
}

impl<F: Fabric, C: Clock> KvClient<F, C> {
    pub(super) async fn read_register(
        &self,
        located: &mut Located,
        stats: &OpStats,
    ) -> Result<ReadValue, KvError> {
        Ok(match self.protocol {
            RegisterProtocol::SafeGuess => {
                self.swarm
                    .read(&located.loc, &mut located.knowledge, stats)
                    .await?
            }
            RegisterProtocol::Abd => {
                self.swarm
                    .abd_read(&located.loc, &mut located.knowledge, stats)
                    .await?
            }
            RegisterProtocol::Raw => {
                let value = self.swarm.raw_read(&located.loc, stats).await?;
                if matches!(value, ReadValue::Value(_)) {
                    // RAW keeps no metadata; remember that the register holds a value.
                    located.knowledge = RegisterCache::holding_raw_value();
                }
                value
            }
        })
    }

    /// Writes `payload` into the fresh, unpublished register `fresh` with its key
    /// `header` (just before the register on each replica), both on a majority of its
    /// replicas. Safe-Guess does
    /// both in one batch per replica (`swarm_core`'s `write_fresh`: the register races
    /// nothing before it is published); the baselines write the header next to an
    /// ordinary write.
    ///
    /// With `carried` (Safe-Guess only), that operation rides after the write in every
    /// replica's batch (`swarm_core`'s `write_fresh_carrying`); returns what it
    /// returned on each replica that answered (empty without it).
    pub(super) async fn write_fresh(
        &self,
        fresh: &mut Located,
        stats: &OpStats,
        mut header: Vec<u8>,
        payload: &[u8],
        carried: Option<Op>,
    ) -> Result<Carried, KvError> {
        let header_len = header.len();
        let fabric = self.swarm.fabric();
        if self.protocol == RegisterProtocol::SafeGuess {
            // The header area ends where the register starts on each replica: the
            // header, zero-padded to it, goes in the same write as the value's
            // in-place copy (`swarm_core`'s fresh-write prefix, at each replica's
            // offset).
            let area = self.layout.params.key_header_bytes() as usize;
            if header_len > area {
                return Err(KvError::Corrupted {
                    register: fresh.register,
                });
            }
            header.resize(area, 0);
            let (outcome, outputs) = match carried {
                None => {
                    let outcome = self
                        .swarm
                        .write_fresh(&fresh.loc, &mut fresh.knowledge, stats, payload, &header)
                        .await?;
                    (outcome, Carried::new())
                }
                Some(op) => {
                    self.swarm
                        .write_fresh_carrying(
                            &fresh.loc,
                            &mut fresh.knowledge,
                            stats,
                            payload,
                            &header,
                            op,
                        )
                        .await?
                }
            };
            if outcome == FreshOutcome::Written {
                return Ok(outputs);
            }
            // Not cleared (a recycling bug): the ordinary write handles any state.
            // The header is already where the replicas answered.
            let _ = self.write_register(fresh, stats, payload).await?;
            return Ok(outputs);
        }
        let replicas = fresh.loc.replicas.clone();
        // The header goes to every replica: let their cache misses overlap (the value
        // write hints its own bytes, `swarm_core`'s write round).
        let header = &header[..header_len];
        let loc = &fresh.loc.clone();
        let header_on = |node| self.layout.header_on(loc, node);
        for &node in replicas.nodes() {
            if let Some(at) = header_on(node) {
                fabric.prefetch(node, at, header_len as u64);
            }
        }
        let (header_stats, value_stats) = (stats.branch(), stats.branch());
        let write_header = async {
            let nodes = replicas.nodes().iter().copied();
            broadcast(fabric, &header_stats, nodes, replicas.quorum(), |node| {
                let at = header_on(node).ok_or(FabricError::UnplacedReplica { node })?;
                Ok(Batch::write(at, header.to_vec()))
            })
            .await
            .map(drop)
        };
        let write_value = self.write_register(fresh, &value_stats, payload);
        let (header_written, value_written) = swarm_core::join(write_header, write_value).await;
        stats.join_branches(&[&header_stats, &value_stats]);
        header_written?;
        value_written?;
        Ok(Carried::new())
    }

    pub(super) async fn write_register(
        &self,
        located: &mut Located,
        stats: &OpStats,
        payload: &[u8],
    ) -> Result<WriteOutcome, KvError> {
        Ok(match self.protocol {
            RegisterProtocol::SafeGuess => {
                self.swarm
                    .write(&located.loc, &mut located.knowledge, stats, payload)
                    .await?
            }
            RegisterProtocol::Abd => {
                self.swarm
                    .abd_write(&located.loc, &mut located.knowledge, stats, payload)
                    .await?
            }
            RegisterProtocol::Raw => {
                self.swarm.raw_write(&located.loc, stats, payload).await?;
                // RAW keeps no metadata; remember that the register holds a value.
                located.knowledge = RegisterCache::holding_raw_value();
                WriteOutcome::Written
            }
        })
    }

    /// Reads `located`'s register and checks that it holds `key`. `Ok(None)`: the
    /// register is deleted, empty, or holds another key.
    pub(super) async fn read_checked(
        &self,
        key: &[u8],
        located: &mut Located,
        stats: &OpStats,
    ) -> Result<Option<Vec<u8>>, KvError> {
        Ok(match self.read_keyed(key, located, stats).await? {
            Keyed::Holds(value) => Some(value),
            Keyed::Deleted | Keyed::Not => None,
        })
    }

    /// [`Self::read_checked`], telling a tombstone apart from an empty register or
    /// another key's value.
    pub(super) async fn read_keyed(
        &self,
        key: &[u8],
        located: &mut Located,
        stats: &OpStats,
    ) -> Result<Keyed, KvError> {
        let value = match self.read_register(located, stats).await {
            Ok(value) => value,
            // Reset for another life since it was located: not the key's (any more).
            Err(error) if error.is_recycled() => return Ok(Keyed::Not),
            Err(error) => return Err(error),
        };
        let mut payload = match value {
            ReadValue::Value(payload) => payload,
            ReadValue::Deleted => return Ok(Keyed::Deleted),
            ReadValue::Empty => return Ok(Keyed::Not),
        };
        let value_at = match decode_payload(&payload) {
            Some((k, v)) if k == key => payload.len() - v.len(),
            _ => return Ok(Keyed::Not),
        };
        // The value moves to the front of the payload's buffer, which becomes the
        // value: no allocation and copy of its own.
        payload.copy_within(value_at.., 0);
        payload.truncate(payload.len() - value_at);
        Ok(Keyed::Holds(payload))
    }
}
