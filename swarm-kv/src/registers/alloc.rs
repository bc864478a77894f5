//! Two-level allocation of register slots (FUSEE §4.4).
//!
//! Coarse level: the register area is cut into chunks of
//! [`ClusterParams::chunk_registers`](crate::layout::ClusterParams) slots, and a
//! client claims a whole chunk from the memory nodes with a majority CAS on the
//! chunk's claim word ([`crate::membership::claim`]). Fine level: the client hands out the slots of
//! its chunks locally, with no remote access, so that an insert needs no allocation
//! roundtrip. Every slot handed out is *pre-cleared*: its metadata words are empty,
//! which is what lets an insert write into it in one roundtrip (SWARM §5.3.1). A slot
//! is pre-cleared either because it was never used (memory starts zeroed) or because
//! the register recycler (`crate::registers::recycle`) reset it on every replica after its
//! grace and gave it back ([`RegisterAllocator::give_back`]); given-back slots are
//! handed out first, so a client that deletes as much as it inserts claims no new
//! chunks.
//!
//! A claim scan first reads the chunk table from a majority (one roundtrip) and
//! claims only chunks that some node of it shows free: a claim waits up to a
//! straggler window for a node that does not answer, so CASing every chunk with one
//! node down cost `chunks × 50 ms`. Once every chunk is claimed, a failed scan is not
//! repeated on every insert: the allocator remembers the area as exhausted and only
//! hands out given-back slots.
//!
//! A chunk is filled only under the placement its claim read: each claim's batch
//! reads the chunk's placement record after its CAS, and a won chunk whose record
//! there is not the one the client follows is given back at once
//! ([`KvError::PlacementBehind`]: the client follows the newer configuration and
//! retries). `crate::placement::add_node` records a chunk while it holds the chunk
//! word itself and frees the word only after the record is on every node of the
//! metadata group, so a client stopped for any time between reading the table and
//! claiming never fills a chunk under the placement it had before.
//!
//! A *reserve chunk* (`NodeLayout::reserve_chunks`: room for keys of nodes added
//! later) has no computed place: a client never claims one its table has no record
//! for, so it fills a reserve chunk only once it follows the configuration that
//! published the chunk's record, and then (the check above) only if that record is
//! still the newest. The area is exhausted only for the table it was scanned
//! with: a client that follows a newer one scans again, and claims the reserve
//! chunks an add-node recorded.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use swarm_core::encoding::Tsp;
use swarm_core::quorum::{broadcast, majority, nodes as node_ids};
use swarm_core::{Batch, Fabric, OpStats};

use crate::layout::NodeLayout;
use crate::membership::claim::{Claim, claim_reading, release};
use crate::placement::{Placements, RECORD_BYTES, SharedPlacements, claimed_as_followed};
use crate::{KvError, RegisterId};

/// The chunk table's words as each node of a majority holds them (one roundtrip).
async fn read_chunk_tables<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    nodes: usize,
) -> Result<Vec<Vec<u64>>, KvError> {
    let table_bytes = u32::try_from(8 * layout.chunks())
        .map_err(|_| KvError::Unsupported("a chunk table larger than 4 GiB"))?;
    let rt = broadcast(fabric, stats, node_ids(nodes), majority(nodes), |_| {
        Ok(Batch::read(layout.chunks_at, table_bytes))
    })
    .await?;
    Ok(rt
        .replies()
        .iter()
        .map(|(_, completion)| {
            completion
                .read(0)
                .unwrap_or_default()
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .collect()
        })
        .collect())
}

/// How many register chunks clients have claimed so far (an upper bound: a chunk
/// counts if a majority of nodes answered and any of them shows a claim, so partial
/// claims count too). Reads the chunk table of a majority of nodes in one roundtrip.
pub async fn claimed_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
) -> Result<u64, KvError> {
    let tables = read_chunk_tables(
        fabric,
        stats,
        layout,
        layout.metadata_nodes(fabric.node_count()),
    )
    .await?;
    let mut claimed = vec![false; layout.chunks() as usize];
    for table in &tables {
        for (flag, word) in claimed.iter_mut().zip(table) {
            *flag |= *word != 0;
        }
    }
    Ok(claimed.iter().filter(|c| **c).count() as u64)
}

/// For each chunk, whether every node of a majority shows it claimed by another
/// token than `token`: a claim of it cannot win (it needs `0` or `token` on a
/// majority). `None` if the table could not be read (then every chunk is tried).
async fn taken_chunks<F: Fabric>(
    fabric: &F,
    stats: &OpStats,
    layout: &NodeLayout,
    nodes: usize,
    token: u64,
) -> Option<Vec<bool>> {
    let tables = read_chunk_tables(fabric, stats, layout, nodes).await.ok()?;
    let mut taken = vec![true; layout.chunks() as usize];
    for table in &tables {
        if table.len() != taken.len() {
            return None;
        }
        for (flag, word) in taken.iter_mut().zip(table) {
            *flag &= *word != 0 && *word != token;
        }
    }
    Some(taken)
}

/// A client's pool of claimed register slots.
///
/// Several operations of one client may allocate at once (`--inflight`): each chunk
/// claim picks its chunk index synchronously, before its first await, so concurrent
/// claims of one client never race for the same chunk. (They would both win it —
/// a claim is idempotent for its own token — and hand out its registers twice: two
/// keys in one register, one of them lost. A load with 8 inserts in flight did
/// exactly that.) Every claimed chunk's slots go into the pool, none is dropped.
#[derive(Debug)]
pub struct RegisterAllocator {
    state: RefCell<State>,
}

#[derive(Debug)]
struct State {
    /// Slots claimed and not handed out, as `start..end` ranges in claim order.
    free: VecDeque<(u64, u64)>,
    /// The next chunk a claim tries (spreads clients over the area; advanced by
    /// every attempt, so concurrent attempts try different chunks).
    cursor: u64,
    /// Chunks this client claimed. A claim is idempotent for its own token, so a
    /// cursor that wraps around would "win" them again and hand their (used) slots
    /// out a second time: they are skipped.
    owned: HashSet<u64>,
    /// This client incarnation's claim token.
    token: u64,
    /// Recycled slots (reset on every replica), with the life marker their reset
    /// installed, handed out before fresh ones.
    recycled: Vec<(RegisterId, Tsp)>,
    /// A claim scan with this placement table found every chunk taken: do not scan
    /// again until the client follows another table (one that may record reserve
    /// chunks).
    exhausted: Option<Arc<Placements>>,
    /// Registers per chunk.
    per: u64,
}

/// What a client's pool holds that it never handed out, taken out of the pool on a
/// clean close ([`RegisterAllocator::take_unused`], `crate::registers::give_back`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unused {
    /// Chunks this client claimed (not adopted) none of whose registers it handed out.
    pub chunks: Vec<u64>,
    /// The never-handed-out registers of chunks it claimed and partly used.
    pub fresh: Vec<RegisterId>,
    /// Registers of its recycled pool: reset on every replica, with their markers.
    pub recycled: Vec<(RegisterId, Tsp)>,
}

impl RegisterAllocator {
    /// An empty pool for the client whose claim token is `token` (unique per client
    /// incarnation); `writer` spreads where different clients look for chunks.
    pub fn new(layout: &NodeLayout, writer: u16, token: u64) -> Self {
        let chunks = layout.chunks().max(1);
        Self {
            state: RefCell::new(State {
                free: VecDeque::new(),
                cursor: (u64::from(writer) * 0x9E37_79B9) % chunks,
                owned: HashSet::new(),
                token,
                recycled: Vec::new(),
                exhausted: None,
                per: u64::from(layout.params.chunk_registers).max(1),
            }),
        }
    }

    /// Chunks this client has claimed.
    #[cfg(test)]
    pub fn chunks_claimed(&self) -> u64 {
        self.state.borrow().owned.len() as u64
    }

    /// Records `chunk` as this client's (adopted from a dead client,
    /// `crate::registers::orphans`): its slots are not handed out as fresh ones (some hold live
    /// data; the free ones come back through the recycler), and the claim scan skips
    /// it, since a claim is idempotent for the owner's token and would "win" it.
    pub fn adopt(&self, chunk: u64) {
        self.state.borrow_mut().owned.insert(chunk);
    }

    /// Whether every chunk was found claimed (only given-back slots are handed out).
    #[cfg(test)]
    pub fn exhausted(&self) -> bool {
        self.state.borrow().exhausted.is_some()
    }

    /// Gives back a slot reset on every replica with life marker `marker`
    /// (`crate::registers::reset`): the next allocations hand it out before fresh slots.
    pub fn give_back(&self, register: RegisterId, marker: Tsp) {
        self.state.borrow_mut().recycled.push((register, marker));
    }

    /// Recycled slots in the pool ([`Self::give_back`]), not handed out.
    pub fn recycled(&self) -> usize {
        self.state.borrow().recycled.len()
    }

    /// Takes up to `max` recycled slots out of the pool beyond the `keep` most
    /// recently given back, with their markers: the client donates them
    /// (`KvClient::shed_pool`), and they are never handed out by this client again.
    pub fn take_recycled_beyond(&self, keep: usize, max: usize) -> Vec<(RegisterId, Tsp)> {
        let mut s = self.state.borrow_mut();
        let excess = s.recycled.len().saturating_sub(keep).min(max);
        s.recycled.drain(..excess).collect()
    }

    /// Chunks this client holds (claimed or adopted), and fresh slots of its claimed
    /// chunks not handed out yet (for logs and diagnostics).
    pub fn chunks_and_fresh(&self) -> (usize, u64) {
        let s = self.state.borrow();
        (
            s.owned.len(),
            s.free.iter().map(|(a, b)| b - a).sum::<u64>(),
        )
    }

    /// Slots in the pool: claimed or given back, not handed out.
    pub fn pooled(&self) -> u64 {
        let s = self.state.borrow();
        s.recycled.len() as u64 + s.free.iter().map(|(a, b)| b - a).sum::<u64>()
    }

    /// A pre-cleared register slot and its life marker: a given-back one (with the
    /// marker its reset installed), else a fresh one of a claimed chunk (`None`: never
    /// reset, as far as this client knows); claims a new chunk when the pool is
    /// empty. `RegistersFull` once every chunk is claimed and the pool is empty.
    pub async fn allocate<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        layout: &NodeLayout,
        nodes: usize,
        placements: &SharedPlacements,
    ) -> Result<(RegisterId, Option<Tsp>), KvError> {
        loop {
            if let Some(register) = self.take() {
                return Ok(register);
            }
            let table = placements.get();
            if self
                .state
                .borrow()
                .exhausted
                .as_ref()
                .is_some_and(|scanned| Arc::ptr_eq(scanned, &table))
            {
                return Err(KvError::RegistersFull {
                    registers: table.capacity(layout),
                });
            }
            self.claim_chunk(fabric, stats, layout, nodes, placements)
                .await?;
        }
    }

    /// Empties the pool (the client is closing): what it never handed out, sorted
    /// into whole chunks, fresh registers of partly used chunks, and recycled
    /// registers ([`Unused`]). Only ranges of chunks this client claimed are in the
    /// pool (adopted chunks add none), and a range starts at its chunk's first
    /// register until its first register is handed out, so a range that still does
    /// is a chunk none of whose registers was handed out.
    pub fn take_unused(&self) -> Unused {
        let mut s = self.state.borrow_mut();
        let per = s.per;
        let mut unused = Unused {
            recycled: std::mem::take(&mut s.recycled),
            ..Unused::default()
        };
        for (start, end) in std::mem::take(&mut s.free) {
            if start % per == 0 && start < end {
                let chunk = start / per;
                s.owned.remove(&chunk);
                unused.chunks.push(chunk);
            } else {
                unused.fresh.extend(start..end);
            }
        }
        unused
    }

    /// The next free slot of the pool, if any.
    fn take(&self) -> Option<(RegisterId, Option<Tsp>)> {
        let mut s = self.state.borrow_mut();
        if let Some((register, marker)) = s.recycled.pop() {
            return Some((register, Some(marker)));
        }
        let (start, end) = s.free.front_mut()?;
        let register = *start;
        *start += 1;
        if *start >= *end {
            s.free.pop_front();
        }
        Some((register, None))
    }

    async fn claim_chunk<F: Fabric>(
        &self,
        fabric: &F,
        stats: &OpStats,
        layout: &NodeLayout,
        nodes: usize,
        placements: &SharedPlacements,
    ) -> Result<(), KvError> {
        let chunks = layout.chunks();
        let table = placements.get();
        // One read of the chunk table first: a claim of a chunk that a majority shows
        // taken cannot win, and a claim waits up to a straggler window for a node
        // that does not answer, so a full scan of claims with one node down took
        // chunks × 50 ms.
        let token = self.state.borrow().token;
        let taken = taken_chunks(fabric, stats, layout, nodes, token).await;
        for _ in 0..chunks {
            // Reserve the index before awaiting: no other operation of this client
            // tries the same chunk while this claim is in flight.
            let (chunk, token) = {
                let mut s = self.state.borrow_mut();
                let chunk = s.cursor % chunks;
                s.cursor = (chunk + 1) % chunks;
                // A reserve chunk exists only through its record: not claimed
                // before this client follows it (module docs).
                if layout.is_reserve(chunk) && table.record(chunk).is_none() {
                    continue;
                }
                if s.owned.contains(&chunk)
                    || taken
                        .as_ref()
                        .is_some_and(|t| t.get(chunk as usize) == Some(&true))
                {
                    continue;
                }
                (chunk, s.token)
            };
            let record_at = layout.placement_record(chunk);
            let (outcome, records) = claim_reading(
                fabric,
                stats,
                nodes,
                layout.chunk_word(chunk),
                token,
                layout.params.max_op_ns,
                record_at.map(|at| (at, RECORD_BYTES as u32)),
            )
            .await?;
            if outcome == Claim::Won
                && record_at.is_some()
                && !claimed_as_followed(&records, table.record(chunk))
            {
                // Placed by a configuration this client does not follow yet (module
                // docs): not filled under the placement it has.
                release(fabric, nodes, layout.chunk_word(chunk), token);
                tracing::debug!(
                    chunk,
                    "claimed a chunk placed by a newer configuration: given back"
                );
                return Err(KvError::PlacementBehind { chunk });
            }
            if outcome == Claim::Won {
                let ids = layout.chunk_register_ids(chunk);
                let mut s = self.state.borrow_mut();
                if s.owned.insert(chunk) {
                    s.free.push_back((ids.start, ids.end));
                }
                return Ok(());
            }
        }
        let registers = table.capacity(layout);
        self.state.borrow_mut().exhausted = Some(table);
        Err(KvError::RegistersFull { registers })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use swarm_core::fabric::EmulatedRtt;
    use swarm_core::{MemCluster, block_on, join};

    use super::*;

    use crate::test_support::small_layout as layout;

    #[test]
    fn concurrent_allocations_of_one_client_never_share_a_register() {
        let computed = SharedPlacements::default();
        let layout = layout();
        let cluster = MemCluster::new(3, layout.end() as usize);
        // Emulated latency: the claims are really in flight together.
        let fabric = EmulatedRtt::new(cluster.client(), 1_000);
        let alloc = RegisterAllocator::new(&layout, 1, 0xabc);
        let stats = OpStats::new();
        let one = || alloc.allocate(&fabric, &stats, &layout, 3, &computed);
        let mut seen = HashSet::new();
        for _ in 0..5 {
            let ((a, b), (c, d)) = block_on(&fabric, async {
                Ok::<_, swarm_core::FabricError>(join(join(one(), one()), join(one(), one())).await)
            })
            .unwrap();
            for register in [a, b, c, d] {
                let register = register.unwrap().0;
                assert!(
                    seen.insert(register),
                    "register {register} handed out twice"
                );
            }
        }
        // Four concurrent claims took four chunks; every slot of them is used.
        assert_eq!(seen.len(), 20);
    }

    /// A client that runs out while every chunk is another's does not CAS them one
    /// by one (each claim waits a straggler window for a node that does not
    /// answer): one read of the chunk table tells it no claim can win.
    #[test]
    fn a_scan_of_chunks_others_hold_is_one_read() {
        let computed = SharedPlacements::default();
        let layout = layout();
        let cluster = MemCluster::new(3, layout.end() as usize);
        let fabric = cluster.client();
        let other = RegisterAllocator::new(&layout, 2, 0xdef);
        let stats = OpStats::new();
        while block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                other.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap()
        .is_ok()
        {}
        let me = RegisterAllocator::new(&layout, 1, 0xabc);
        let stats = OpStats::new();
        let full = block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                me.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap();
        assert!(
            matches!(full, Err(KvError::RegistersFull { .. })),
            "{full:?}"
        );
        assert_eq!(
            stats.roundtrips(),
            1,
            "one read of the chunk table, no claim"
        );
        assert!(me.exhausted());
    }

    #[test]
    fn a_full_area_is_full_not_reused() {
        let computed = SharedPlacements::default();
        let layout = layout();
        let cluster = MemCluster::new(3, layout.end() as usize);
        let fabric = cluster.client();
        let alloc = RegisterAllocator::new(&layout, 2, 0xdef);
        let stats = OpStats::new();
        let mut seen = HashSet::new();
        loop {
            match block_on(&fabric, async {
                Ok::<_, swarm_core::FabricError>(
                    alloc.allocate(&fabric, &stats, &layout, 3, &computed).await,
                )
            })
            .unwrap()
            {
                Ok((register, _)) => assert!(seen.insert(register), "register {register} reused"),
                Err(KvError::RegistersFull { .. }) => break,
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(seen.len() as u64, layout.params.registers);
        assert_eq!(alloc.chunks_claimed(), layout.chunks());
        // Full, and no chunk scan any more; given-back slots are handed out again.
        let stats = OpStats::new();
        let full = block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                alloc.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap();
        assert!(matches!(full, Err(KvError::RegistersFull { .. })));
        assert_eq!(
            stats.roundtrips(),
            0,
            "an exhausted area is not scanned again"
        );
        let marker = Tsp::reset_marker(7).unwrap();
        alloc.give_back(3, marker);
        assert_eq!(alloc.pooled(), 1);
        let again = block_on(&fabric, async {
            Ok::<_, swarm_core::FabricError>(
                alloc.allocate(&fabric, &stats, &layout, 3, &computed).await,
            )
        })
        .unwrap();
        assert_eq!(again.unwrap(), (3, Some(marker)));
    }

    /// A reserve chunk exists only through its record: a client claims none its
    /// table has no record for, whether no record exists yet (a cluster nobody
    /// added a node to: it fills the computed chunks, then is full) or one was
    /// published by a configuration it does not follow yet (an add while it was
    /// stopped: it is full until it follows). The reserve chunks' words stay free.
    #[test]
    fn a_client_never_claims_a_reserve_chunk_it_has_no_record_for() {
        use crate::layout::ClusterParams;
        use crate::placement::{PlacementRecord, Spot, write_record};
        let layout = NodeLayout::new(ClusterParams {
            placement_nodes: 3,
            placement_table: true,
            max_nodes: 6,
            chunk_registers: 4,
            registers: 4 * 10,
            key_max: 8,
            value_max: 8,
            ..ClusterParams::default()
        })
        .unwrap();
        assert_eq!(layout.reserve_chunks(), 10);
        let cluster = MemCluster::new(3, layout.end() as usize);
        let fabric = cluster.client();
        let stats = OpStats::new();
        let behind = SharedPlacements::default();
        let fill = |alloc: &RegisterAllocator| {
            let mut seen = HashSet::new();
            loop {
                match block_on(&fabric, async {
                    Ok::<_, swarm_core::FabricError>(
                        alloc.allocate(&fabric, &stats, &layout, 3, &behind).await,
                    )
                })
                .unwrap()
                {
                    Ok((register, _)) => assert!(seen.insert(register)),
                    Err(KvError::RegistersFull { registers }) => {
                        assert_eq!(registers, layout.params.registers);
                        return seen;
                    }
                    Err(other) => panic!("{other}"),
                }
            }
        };
        let reserve_words_free = || {
            let tables = block_on(&fabric, read_chunk_tables(&fabric, &stats, &layout, 3)).unwrap();
            tables.iter().all(|t| {
                t[layout.computed_chunks() as usize..]
                    .iter()
                    .all(|w| *w == 0)
            })
        };
        let first = RegisterAllocator::new(&layout, 1, 0xabc);
        let seen = fill(&first);
        assert_eq!(seen.len() as u64, layout.params.registers);
        assert!(seen.iter().all(|r| *r < layout.params.registers));
        assert!(reserve_words_free());
        // Every reserve chunk recorded by a configuration the client does not follow.
        for chunk in layout.computed_chunks()..layout.chunks() {
            let record = PlacementRecord {
                epoch: 2,
                replicas: (0..3).map(|node| Spot { node, slot: 0 }).collect(),
                destination: None,
            };
            block_on(
                &fabric,
                write_record(&fabric, &stats, &layout, 3, chunk, &record),
            )
            .unwrap();
        }
        let second = RegisterAllocator::new(&layout, 2, 0xdef);
        assert!(fill(&second).is_empty());
        assert!(reserve_words_free());
    }
}
