//! Where SWARM's data lives on a memory node, and how it is validated.
//!
//! In-n-Out (SWARM §4.3, Figure 3) keeps, for each replicated register, on each of its
//! memory nodes:
//!
//! ```text
//!  register at `addr` (same offset on every replica):
//!  +---------------- in-place block ----------------+---------- metadata ----------+
//!  | record: tsp | len | hash | payload (padded)     | word 0 .. word W-1 | delete |
//!  +-------------------------------------------------+------------------------------+
//!
//!  writer w's log, slot s (one log per writer on every node):
//!  +-----------+---------------- record ----------------+
//!  | lock word | tsp | len | hash | payload (padded)     |
//!  +-----------+---------------------------------------+
//! ```
//!
//! * The in-place block and the metadata words are contiguous, so one READ fetches
//!   both (§4.3). Only the register's primary replica keeps in-place data (§6).
//! * The metadata holds `W` words (§4.4, §7.9); writer `w` CASes word `w mod W` and
//!   readers take the maximum of all `W`, which takes contention off the MAX.
//! * After them comes the **delete word** (SWARM-KV §5.3.2), the only place a
//!   tombstone is ever written: written once, by a CAS expecting it empty, whether by
//!   a delete or by a read or write that writes a tombstone back. It holds each
//!   node's first tombstone from then on, which tells racing deletes which of them
//!   came first where (`protocol/delete.rs`). Readers take it into the maximum
//!   like the `W` words.
//! * A *record* is the same on both sides: the write's [`Tsp`] with its flag cleared,
//!   the payload length, an xxh3-128 hash of the record, and the payload. A record is
//!   valid only if its hash matches, so a read torn by a concurrent write is detected
//!   (in-place data is written without any lock, §4.2).
//! * The slot of write `(ticks, w)` in `w`'s log is `xxh3(ts) mod slots` (see
//!   [`crate::encoding`]): the metadata word names the buffer without any index bits.
//!   The writer keeps a bitmap of the slots it has used ([`SlotAllocator`]) and bumps
//!   its guessed timestamp by one tick until it lands on a free slot. A slot is
//!   dedicated to one write until it is recycled ([`crate::slot_recycling`]: a grace period
//!   after the write was superseded), and a reader checks the record's tsp, so a
//!   reused slot is detected, never misread.
//! * The first word of a slot is the CAS object of the timestamp lock for that write
//!   (§3.3): one lock per writer timestamp, costing no memory per key. Data writes
//!   start after it and never touch it.

use alloc::vec::Vec;

use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use crate::encoding::{Flag, Timestamp, Tsp, WriterId};

/// Bytes of a record before its payload: tsp (8), len (4), owner tag (4), hash (16).
pub const RECORD_HEADER: u32 = 32;
/// Bytes of a log slot before its record: the timestamp-lock word.
pub const SLOT_LOCK_BYTES: u32 = 8;

const fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Why a layout was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `W` must be between 1 and 64.
    #[error("{0} metadata words per register is out of range: use 1 to 64")]
    MetaWords(u16),
    /// A payload limit of zero or above 16 MiB.
    #[error("payload limit {0} B is out of range: use 1 B to 16 MiB")]
    PayloadMax(u32),
    /// A log must have at least one writer and one slot.
    #[error("a log needs at least one writer and one slot per writer")]
    EmptyLog,
    /// The log does not fit in the address space.
    #[error("the out-of-place log does not fit in a 64-bit address space")]
    LogTooLarge,
    /// The write-back guard table is misaligned, its stride is not a whole number of
    /// words, or it does not fit in the address space.
    #[error(
        "write-back guard table at {base:#x} with stride {stride} B is invalid: \
         use an 8-byte aligned base and a stride that is a nonzero multiple of 8"
    )]
    GuardTable {
        /// The table's first word.
        base: u64,
        /// Bytes from one writer's guard word to the next.
        stride: u64,
    },
}

/// Where the writers' *write-back guards* live on every node: writer `w`'s guard word
/// at `base + w · stride` ([`crate::write_back_guard`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardTable {
    /// Address of writer 0's guard word.
    pub base: u64,
    /// Bytes from one writer's guard word to the next (8 for a dense table).
    pub stride: u64,
}

/// The cluster-wide shape of registers and logs: every client must use the same.
///
/// Built with [`Layout::builder`], which names each parameter:
///
/// ```
/// use swarm_core::layout::{Layout, LayoutError};
///
/// let layout = Layout::builder()
///     .payload_max(64)
///     .meta_words(4)
///     .log_base(1 << 16)
///     .writers(8)
///     .slots_per_writer(256)
///     .build()?;
/// assert_eq!(layout.writers(), 8);
/// assert_eq!(
///     Layout::builder().meta_words(0).build(),
///     Err(LayoutError::MetaWords(0))
/// );
/// # Ok::<(), LayoutError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    payload_max: u32,
    meta_words: u16,
    log_base: u64,
    writers: u16,
    slots_per_writer: u32,
    guards: Option<GuardTable>,
}

/// Names the parameters of a [`Layout`]; [`LayoutBuilder::build`] validates them.
///
/// Unset parameters keep their defaults: 64-byte payloads, one metadata word, one
/// writer with one log slot, and the log at byte 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LayoutBuilder {
    payload_max: u32,
    meta_words: u16,
    log_base: u64,
    writers: u16,
    slots_per_writer: u32,
    guards: Option<GuardTable>,
}

impl Default for LayoutBuilder {
    fn default() -> Self {
        Self {
            payload_max: 64,
            meta_words: 1,
            log_base: 0,
            writers: 1,
            slots_per_writer: 1,
            guards: None,
        }
    }
}

impl LayoutBuilder {
    /// Largest payload a register holds, in bytes (1 B to 16 MiB).
    pub const fn payload_max(mut self, bytes: u32) -> Self {
        self.payload_max = bytes;
        self
    }

    /// Metadata words per register, `W` (1 to 64; SWARM §4.4, §7.9).
    pub const fn meta_words(mut self, words: u16) -> Self {
        self.meta_words = words;
        self
    }

    /// Byte offset of the out-of-place logs on every node.
    pub const fn log_base(mut self, addr: u64) -> Self {
        self.log_base = addr;
        self
    }

    /// Writers that have a log (at least one).
    pub const fn writers(mut self, writers: u16) -> Self {
        self.writers = writers;
        self
    }

    /// Slots in each writer's log (at least one).
    pub const fn slots_per_writer(mut self, slots: u32) -> Self {
        self.slots_per_writer = slots;
        self
    }

    /// Writers announce their write-backs into other writers' log slots in a table
    /// of guard words at `base`, `stride` bytes apart, on every node
    /// ([`crate::write_back_guard`]); writers then reuse a slot only once no guard
    /// names its write. Without a table (the default), slot reuse rests on the grace
    /// alone ([`crate::slot_recycling`]).
    pub const fn write_back_guards(mut self, base: u64, stride: u64) -> Self {
        self.guards = Some(GuardTable { base, stride });
        self
    }

    /// The layout, or why these parameters cannot make one.
    pub fn build(self) -> Result<Layout, LayoutError> {
        let Self {
            payload_max,
            meta_words,
            log_base,
            writers,
            slots_per_writer,
            guards,
        } = self;
        if !(1..=64).contains(&meta_words) {
            return Err(LayoutError::MetaWords(meta_words));
        }
        if payload_max == 0 || payload_max > 16 << 20 {
            return Err(LayoutError::PayloadMax(payload_max));
        }
        if writers == 0 || slots_per_writer == 0 {
            return Err(LayoutError::EmptyLog);
        }
        if let Some(GuardTable { base, stride }) = guards {
            let fits = stride
                .checked_mul(u64::from(writers))
                .and_then(|span| span.checked_add(base))
                .is_some();
            if base % 8 != 0 || stride == 0 || stride % 8 != 0 || !fits {
                return Err(LayoutError::GuardTable { base, stride });
            }
        }
        let layout = Layout {
            payload_max,
            meta_words,
            log_base,
            writers,
            slots_per_writer,
            guards,
        };
        layout
            .slot_bytes()
            .checked_mul(u64::from(slots_per_writer))
            .and_then(|per_writer| per_writer.checked_mul(u64::from(writers)))
            .and_then(|total| total.checked_add(log_base))
            .ok_or(LayoutError::LogTooLarge)?;
        Ok(layout)
    }
}

impl Layout {
    /// A builder with the defaults of [`LayoutBuilder`].
    pub fn builder() -> LayoutBuilder {
        LayoutBuilder::default()
    }

    /// Largest payload a register holds.
    pub const fn payload_max(&self) -> u32 {
        self.payload_max
    }

    /// Metadata words per register (`W`).
    pub const fn meta_words(&self) -> u16 {
        self.meta_words
    }

    /// Writers that have a log.
    pub const fn writers(&self) -> u16 {
        self.writers
    }

    /// Slots in each writer's log.
    pub const fn slots_per_writer(&self) -> u32 {
        self.slots_per_writer
    }

    /// Bytes of a record holding `payload_max` bytes.
    pub const fn record_bytes(&self) -> u64 {
        pad8(RECORD_HEADER as u64 + self.payload_max as u64)
    }

    /// Offset of the metadata words from the register's address.
    pub const fn meta_offset(&self) -> u64 {
        self.record_bytes()
    }

    /// Bytes of one register: in-place block and metadata.
    pub const fn register_bytes(&self) -> u64 {
        self.record_bytes() + self.meta_bytes()
    }

    /// Bytes of a register's metadata: the `W` words and the delete word, which one
    /// read fetches together.
    pub const fn meta_bytes(&self) -> u64 {
        8 * (self.meta_words as u64 + 1)
    }

    /// Bytes of one log slot.
    pub const fn slot_bytes(&self) -> u64 {
        SLOT_LOCK_BYTES as u64 + self.record_bytes()
    }

    /// First byte of the logs.
    pub const fn log_base(&self) -> u64 {
        self.log_base
    }

    /// Bytes of all logs together.
    pub const fn log_bytes(&self) -> u64 {
        self.slot_bytes() * self.slots_per_writer as u64 * self.writers as u64
    }

    /// The write-back guard table, if the layout has one.
    pub const fn guards(&self) -> Option<GuardTable> {
        self.guards
    }

    /// Address of `writer`'s write-back guard word, if the layout has a guard table
    /// and `writer` a log.
    pub fn guard_addr(&self, writer: WriterId) -> Option<u64> {
        let table = self.guards?;
        (writer.get() < self.writers).then(|| table.base + u64::from(writer.get()) * table.stride)
    }

    /// The bytes one read of the whole guard table covers, `(address, length)`, if the
    /// layout has one (`None` too if it would not fit in one read).
    pub fn guard_span(&self) -> Option<(u64, u32)> {
        let table = self.guards?;
        let len = (u64::from(self.writers) - 1) * table.stride + 8;
        Some((table.base, u32::try_from(len).ok()?))
    }

    /// Address of the metadata word writer `w` CASes in the register at `addr`.
    pub const fn meta_word_addr(&self, addr: u64, writer: WriterId) -> u64 {
        addr + self.meta_offset() + 8 * (writer.get() % self.meta_words) as u64
    }

    /// Address of the delete word of the register at `addr`: the word after the `W`
    /// metadata words, CASed by deletes only (see the module docs).
    pub const fn delete_word_addr(&self, addr: u64) -> u64 {
        addr + self.meta_offset() + 8 * self.meta_words as u64
    }

    /// The slot that write `ts` uses in its writer's log.
    pub fn slot_of(&self, ts: Timestamp) -> u32 {
        let word = Tsp::new(ts, Flag::Guessed).word();
        (xxh3_64(&word.to_le_bytes()) % u64::from(self.slots_per_writer)) as u32
    }

    /// Address of slot `slot` of writer `w`'s log, if `w` has a log.
    pub fn slot_addr(&self, writer: WriterId, slot: u32) -> Option<u64> {
        if writer.get() >= self.writers || slot >= self.slots_per_writer {
            return None;
        }
        let index = u64::from(writer.get()) * u64::from(self.slots_per_writer) + u64::from(slot);
        Some(self.log_base + index * self.slot_bytes())
    }

    /// Address of the buffer (lock word first) of write `ts`.
    pub fn buffer_addr(&self, ts: Timestamp) -> Option<u64> {
        self.slot_addr(ts.writer(), self.slot_of(ts))
    }
}

/// Encodes a record: `tsp` (flag cleared), length, hash, payload, padded to 8 bytes;
/// no owner (see [`encode_record_for`]).
pub fn encode_record(tsp: Tsp, payload: &[u8]) -> Vec<u8> {
    encode_record_for(tsp, None, payload)
}

/// The owner tag of a record: the identity of the register it belongs to
/// ([`crate::RegisterLoc::id`], its address in a store that places every replica at
/// one offset), in units of 8 bytes, or 0 (unknown) for an identity at or beyond 32 GiB.
fn owner_tag(register: Option<u64>) -> u32 {
    register
        .filter(|addr| addr % 8 == 0)
        .and_then(|addr| u32::try_from(addr / 8).ok())
        .unwrap_or(0)
}

/// Encodes a record of a write to the register at `register` (its owner): the tsp
/// (flag cleared), the length, the owner tag (bytes 12..16, covered by the hash),
/// the hash and the payload, padded to 8 bytes. The owner tag lets a new incarnation
/// of the writer id find which register a buffer of its log belongs to
/// ([`crate::resume`]), so that it can recycle it.
pub fn encode_record_for(tsp: Tsp, register: Option<u64>, payload: &[u8]) -> Vec<u8> {
    // `with_capacity` + `resize`, not `vec![0; len]` (`calloc`, which bypasses
    // glibc's thread cache: see `words::execute_into`).
    #[allow(clippy::slow_vector_initialization)]
    let mut record = {
        let len = record_len(payload.len());
        let mut record = Vec::with_capacity(len);
        record.resize(len, 0);
        record
    };
    encode_record_into(tsp, register, payload, &mut record);
    record
}

/// The length of the record of a `payload_len`-byte payload: the header and the
/// payload, padded to 8 bytes.
pub fn record_len(payload_len: usize) -> usize {
    pad8(u64::from(RECORD_HEADER) + payload_len as u64) as usize
}

/// [`encode_record_for`] into `record`, zeroed and [`record_len`]`(payload.len())`
/// bytes long (the caller owns the buffer: a write shares one `Arc` among its
/// replicas' batches, `Client::inner_write`).
///
/// # Panics
///
/// If `record` is shorter than the record.
pub fn encode_record_into(tsp: Tsp, register: Option<u64>, payload: &[u8], record: &mut [u8]) {
    record[0..8].copy_from_slice(&tsp.with_flag(Flag::Guessed).word().to_le_bytes());
    record[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    record[12..16].copy_from_slice(&owner_tag(register).to_le_bytes());
    record[32..32 + payload.len()].copy_from_slice(payload);
    let hash = xxh3_128(record);
    record[16..32].copy_from_slice(&hash.to_le_bytes());
}

/// A record that passed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The write it holds (flag cleared).
    pub tsp: Tsp,
    /// Its payload.
    pub payload: &'a [u8],
    /// The identity of the register it was written for, if the record names it.
    pub owner: Option<u64>,
}

/// Validates a record read from untrusted memory (torn, stale, garbage): returns it
/// only if its length is within `payload_max` and the bytes it claims, and its hash
/// matches. `bytes` is modified (the hash field is zeroed to recompute the hash).
pub fn decode_record(bytes: &mut [u8], payload_max: u32) -> Option<Record<'_>> {
    if bytes.len() < RECORD_HEADER as usize {
        return None;
    }
    let word = u64::from_le_bytes(bytes[0..8].try_into().ok()?);
    let len = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
    if word == 0 || len > payload_max {
        return None;
    }
    let end = pad8(u64::from(RECORD_HEADER) + u64::from(len)) as usize;
    if end > bytes.len() {
        return None;
    }
    let stored = u128::from_le_bytes(bytes[16..32].try_into().ok()?);
    bytes[16..32].fill(0);
    if xxh3_128(&bytes[..end]) != stored {
        return None;
    }
    let tag = u32::from_le_bytes(bytes[12..16].try_into().ok()?);
    Some(Record {
        tsp: Tsp::from_word(word),
        payload: &bytes[32..32 + len as usize],
        owner: (tag != 0).then_some(u64::from(tag) * 8),
    })
}

/// Why no log slot could be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// Every slot of this writer's log is in use. Each live value holds a slot of the
    /// log of the writer that wrote it last, until a later write or a delete
    /// supersedes it, so one writer holds at most this many live values.
    #[error(
        "the out-of-place log of writer {0} is full ({1} slots): every value this writer wrote last holds one of its slots until it is overwritten or deleted, so one writer keeps at most {1} live values; delete or overwrite keys, spread writes over more clients, or create the cluster with fewer writer ids (`swarm init --writers`), which gives each a larger log"
    )]
    LogFull(WriterId, u32),
    /// The writer has no log in this layout.
    #[error("writer {0} has no log: the cluster was created for fewer writers")]
    NoLog(WriterId),
    /// Bumping the timestamp to find a free slot went past the horizon.
    #[error(transparent)]
    Encoding(#[from] crate::encoding::EncodingError),
}

/// A writer's local record of which of its log slots hold live buffers.
///
/// Allocation is local (no remote access, SWARM §4.3): starting from a wanted
/// timestamp, bump the ticks until the slot of `(ticks, writer)` is free.
#[derive(Clone, Debug)]
pub struct SlotAllocator {
    writer: WriterId,
    used: Vec<u64>,
    slots: u32,
    in_use: u32,
}

impl SlotAllocator {
    /// An allocator with every slot free, for `writer` in `layout`.
    pub fn new(layout: &Layout, writer: WriterId) -> Result<Self, SlotError> {
        if writer.get() >= layout.writers() {
            return Err(SlotError::NoLog(writer));
        }
        let slots = layout.slots_per_writer();
        Ok(Self {
            writer,
            used: alloc::vec![0; slots.div_ceil(64) as usize],
            slots,
            in_use: 0,
        })
    }

    /// Slots currently in use.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// The used-slot bitmap: bit `s % 64` of word `s / 64` is set when slot `s` is used.
    pub fn bitmap(&self) -> &[u64] {
        &self.used
    }

    fn is_used(&self, slot: u32) -> bool {
        self.used[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    /// Reserves a slot for a write at a timestamp of at least `min_ticks`; returns
    /// the timestamp actually used (ticks bumped until its slot was free).
    pub fn allocate(&mut self, layout: &Layout, min_ticks: u64) -> Result<Timestamp, SlotError> {
        if self.in_use >= self.slots {
            return Err(SlotError::LogFull(self.writer, self.slots));
        }
        let mut ticks = min_ticks.max(1);
        loop {
            let ts = Timestamp::new(ticks, self.writer)?;
            let slot = layout.slot_of(ts);
            if !self.is_used(slot) {
                self.used[slot as usize / 64] |= 1 << (slot % 64);
                self.in_use += 1;
                return Ok(ts);
            }
            ticks += 1;
        }
    }

    /// Marks the slot of `ts` used without allocating a timestamp (the tombstone
    /// slot, whose content is the same for every delete).
    pub fn reserve(&mut self, layout: &Layout, ts: Timestamp) {
        let slot = layout.slot_of(ts);
        if !self.is_used(slot) {
            self.used[slot as usize / 64] |= 1 << (slot % 64);
            self.in_use += 1;
        }
    }

    /// Marks slot `slot` used (resuming an earlier incarnation's log).
    pub fn mark_used(&mut self, slot: u32) {
        if slot < self.slots && !self.is_used(slot) {
            self.used[slot as usize / 64] |= 1 << (slot % 64);
            self.in_use += 1;
        }
    }

    /// Returns the slot of `ts` to the free pool (memory recycling).
    pub fn release(&mut self, layout: &Layout, ts: Timestamp) {
        self.release_slot(layout.slot_of(ts));
    }

    /// Returns slot `slot` to the free pool (a carried slot found never written,
    /// `swarm_core::protocol::carried`).
    pub fn release_slot(&mut self, slot: u32) {
        if slot < self.slots && self.is_used(slot) {
            self.used[slot as usize / 64] &= !(1 << (slot % 64));
            self.in_use -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout() -> Layout {
        Layout::builder()
            .payload_max(100)
            .meta_words(4)
            .log_base(1 << 20)
            .writers(8)
            .slots_per_writer(64)
            .build()
            .unwrap()
    }

    #[test]
    fn layout_rejects_bad_parameters() {
        assert_eq!(
            Layout::builder()
                .payload_max(8)
                .meta_words(0)
                .log_base(0)
                .writers(1)
                .slots_per_writer(1)
                .build(),
            Err(LayoutError::MetaWords(0))
        );
        assert_eq!(
            Layout::builder()
                .payload_max(0)
                .meta_words(1)
                .log_base(0)
                .writers(1)
                .slots_per_writer(1)
                .build(),
            Err(LayoutError::PayloadMax(0))
        );
        assert_eq!(
            Layout::builder()
                .payload_max(8)
                .meta_words(1)
                .log_base(0)
                .writers(0)
                .slots_per_writer(1)
                .build(),
            Err(LayoutError::EmptyLog)
        );
        assert_eq!(
            Layout::builder()
                .payload_max(8)
                .meta_words(1)
                .log_base(u64::MAX - 8)
                .writers(1)
                .slots_per_writer(1)
                .build(),
            Err(LayoutError::LogTooLarge)
        );
    }

    #[test]
    fn addresses_are_aligned_and_disjoint() {
        let l = layout();
        assert_eq!(l.record_bytes() % 8, 0);
        // Four metadata words and the delete word after them.
        assert_eq!(l.register_bytes(), l.record_bytes() + 40);
        let w = |i| WriterId::new(i).unwrap();
        assert_eq!(l.meta_word_addr(0, w(5)), l.meta_offset() + 8);
        assert_eq!(l.delete_word_addr(0), l.meta_offset() + 32);
        assert_eq!(l.delete_word_addr(0) + 8, l.register_bytes());
        assert_eq!(l.slot_addr(w(0), 0), Some(1 << 20));
        assert_eq!(l.slot_addr(w(1), 0), Some((1 << 20) + 64 * l.slot_bytes()));
        assert_eq!(l.slot_addr(w(8), 0), None);
        assert_eq!(l.slot_addr(w(0), 64), None);
    }

    #[test]
    fn allocator_bumps_to_free_slots_and_reports_full() {
        let l = layout();
        let w = WriterId::new(2).unwrap();
        let mut a = SlotAllocator::new(&l, w).unwrap();
        let mut seen = alloc::collections::BTreeSet::new();
        let mut ticks = 10;
        for _ in 0..64 {
            let ts = a.allocate(&l, ticks).unwrap();
            assert!(ts.ticks() >= ticks);
            assert!(seen.insert(l.slot_of(ts)), "slot handed out twice");
            ticks = ts.ticks() + 1;
        }
        assert_eq!(a.allocate(&l, ticks), Err(SlotError::LogFull(w, 64)));
        let some = Timestamp::new(ticks - 1, w).unwrap();
        a.release(&l, some);
        assert!(a.allocate(&l, ticks).is_ok());
        assert!(SlotAllocator::new(&l, WriterId::new(8).unwrap()).is_err());
    }

    proptest! {
        #[test]
        fn records_roundtrip_and_detect_any_corruption(
            payload in proptest::collection::vec(any::<u8>(), 0..100),
            ticks in 1u64..crate::encoding::MAX_TICKS, flip in any::<prop::sample::Index>(), bit in 0u8..8,
        ) {
            let ts = Timestamp::new(ticks, WriterId::new(7).unwrap()).unwrap();
            let tsp = Tsp::new(ts, Flag::Verified);
            let record = encode_record(tsp, &payload);
            let mut bytes = record.clone();
            let decoded = decode_record(&mut bytes, 100).unwrap();
            prop_assert!(decoded.tsp.same_write(tsp));
            prop_assert_eq!(decoded.payload, &payload[..]);
            prop_assert_eq!(decoded.owner, None);
            let mut owned = encode_record_for(tsp, Some(4096), &payload);
            prop_assert_eq!(decode_record(&mut owned, 100).unwrap().owner, Some(4096));
            let mut far = encode_record_for(tsp, Some(64 << 30), &payload);
            prop_assert_eq!(decode_record(&mut far, 100).unwrap().owner, None);
            // Flip one bit anywhere in the meaningful bytes: never accepted as is.
            let meaningful = 32 + payload.len();
            let mut bad = record.clone();
            let i = flip.index(meaningful);
            bad[i] ^= 1 << bit;
            if let Some(r) = decode_record(&mut bad, 100) {
                prop_assert!(false, "corrupted record accepted: {:?}", r);
            }
        }

        #[test]
        fn decode_never_panics_on_garbage(mut bytes in proptest::collection::vec(any::<u8>(), 0..200), max in 0u32..300) {
            let _ = decode_record(&mut bytes, max);
        }
    }
}
