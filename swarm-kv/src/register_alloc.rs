//! Two-level allocation of register slots (FUSEE §4.4).
//!
//! Coarse level: the register area is cut into chunks of
//! [`ClusterParams::chunk_registers`](crate::layout::ClusterParams) slots, and a
//! client claims a whole chunk from the memory nodes with a majority CAS on the
//! chunk's claim word ([`crate::claim`]). Fine level: the client hands out the slots of
//! its chunks locally, with no remote access, so that an insert needs no allocation
//! roundtrip. Memory starts zeroed and slots are never reused until memory recycling
//! exists, so every slot handed out is *pre-cleared*: its metadata words are empty,
//! which is what lets an insert write into it in one roundtrip (SWARM §5.3.1).

use std::cell::RefCell;

use swarm_core::quorum::{broadcast, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, OpStats};

use crate::claim::{Claim, claim};
use crate::layout::NodeLayout;
use crate::{KvError, RegisterId};

/// How many register chunks clients have claimed so far (an upper bound: a chunk
/// counts if a majority of nodes answered and any of them shows a claim, so partial
/// claims count too). Reads the chunk table of a majority of nodes in one roundtrip.
pub async fn claimed_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
) -> Result<u64, KvError> {
    let nodes = fabric.node_count();
    let table_bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| KvError::Unsupported("a chunk table larger than 4 GiB"))?;
    let rt = broadcast(fabric, stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::read(layout.chunks_at, table_bytes))
    })
    .await?;
    let mut claimed = vec![false; layout.chunks() as usize];
    for (_, completion) in rt.replies() {
        let words = completion.read(0).unwrap_or_default();
        for (flag, word) in claimed.iter_mut().zip(words.chunks_exact(8)) {
            *flag |= word.iter().any(|b| *b != 0);
        }
    }
    Ok(claimed.iter().filter(|c| **c).count() as u64)
}

/// A client's pool of claimed register slots.
#[derive(Debug)]
pub struct RegisterAllocator {
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    /// Slots claimed and not handed out: `next..end` of the current chunk.
    next: u64,
    end: u64,
    /// Where the next chunk search starts (spread clients over the area).
    cursor: u64,
    /// Chunks claimed so far.
    claimed: u64,
    /// This client incarnation's claim token.
    token: u64,
}

impl RegisterAllocator {
    /// An empty pool for the client whose claim token is `token` (unique per client
    /// incarnation); `writer` spreads where different clients look for chunks.
    pub fn new(layout: &NodeLayout, writer: u16, token: u64) -> Self {
        let chunks = layout.chunks().max(1);
        Self {
            state: RefCell::new(State {
                next: 0,
                end: 0,
                cursor: (u64::from(writer) * 0x9E37_79B9) % chunks,
                claimed: 0,
                token,
            }),
        }
    }

    /// Chunks this client has claimed.
    pub fn chunks_claimed(&self) -> u64 {
        self.state.borrow().claimed
    }

    /// A fresh, pre-cleared register slot; claims a new chunk when the pool is empty.
    pub async fn allocate<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        layout: &NodeLayout,
        nodes: usize,
    ) -> Result<RegisterId, KvError> {
        loop {
            {
                let mut s = self.state.borrow_mut();
                if s.next < s.end {
                    s.next += 1;
                    return Ok(s.next - 1);
                }
            }
            self.claim_chunk(fabric, stats, layout, nodes).await?;
        }
    }

    async fn claim_chunk<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        layout: &NodeLayout,
        nodes: usize,
    ) -> Result<(), KvError> {
        let chunks = layout.chunks();
        let (start, token) = {
            let s = self.state.borrow();
            (s.cursor, s.token)
        };
        for step in 0..chunks {
            let chunk = (start + step) % chunks;
            let outcome = claim(fabric, stats, nodes, layout.chunk_word(chunk), token).await?;
            if outcome == Claim::Won {
                let per = u64::from(layout.params.chunk_registers);
                let first = chunk * per;
                let mut s = self.state.borrow_mut();
                // Another operation of this client may have claimed one meanwhile;
                // keep both (the older remainder is simply dropped: never reused).
                s.next = first;
                s.end = (first + per).min(layout.params.registers);
                s.cursor = (chunk + 1) % chunks;
                s.claimed += 1;
                return Ok(());
            }
        }
        Err(KvError::RegistersFull {
            registers: layout.params.registers,
        })
    }
}
