//! Word-level memory: the fabric's three operations executed on a memory node that
//! is an array of 8-byte atomic words (SWARM §2.1). One implementation, used by the
//! in-process fabric ([`crate::MemCluster`]) and by shared-memory nodes (`swarm-shm`,
//! over a mapped file), and model-checked by `loom` (`tests/loom.rs`): built with
//! `RUSTFLAGS="--cfg loom"`, [`AtomicU64`] is loom's.
//!
//! # Memory orderings, once
//!
//! What the fabric contract promises, and nothing more:
//!
//! * **A CAS is atomic** on its word: `compare_exchange`, `AcqRel` on success and
//!   `Acquire` on failure.
//! * **Reads and writes are not atomic**: they go word by word with `Relaxed` loads
//!   and stores, so a read concurrent with a write may see it torn at 8-byte
//!   granularity, as on RDMA and CXL. A partial word at either end of a write is
//!   merged with a CAS loop, so bytes outside the range written, and CASes on the same
//!   word, are never clobbered.
//! * **The operations of a batch take effect in order**: every operation ends with an
//!   `AcqRel` fence. If an operation of a later batch (or a later operation of the same
//!   batch) on another thread observes the effect of operation `k`, it also observes
//!   every operation before `k` in `k`'s batch: the writer's release fence sits between
//!   operation `k - 1`'s stores and operation `k`'s, and the reader's acquire fence
//!   between the load that saw operation `k` and its next operation's loads. This is
//!   what In-n-Out needs (§4.3): a reader that sees a metadata word set by a write's
//!   CAS finds that write's buffer, written earlier in the same batch, when it reads
//!   it in its next roundtrip. Inside one read operation there is no such promise.
//!
//! What this does not promise: that a write is visible to a read that starts later
//! in *real time* on another thread with which the writer has not synchronised (the
//! language's memory model gives no real-time bound; on x86 the gap is a store buffer's
//! few nanoseconds). RDMA does give it once the write completed. The shared-memory
//! tests check linearizability against wall-clock times and have not seen the gap; a
//! `SeqCst` fence per operation would be the price of closing it.
//!
//! # Bounds
//!
//! The functions index the word slice directly and panic on an address outside it:
//! transports check every batch first with [`crate::fabric::check_batch`] (memory
//! mapped from a shared file is untrusted, so its size comes from the mapping, never
//! from its contents).

use crate::fabric::{Batch, Completion, InPlaceReply, Op, OpOutput, ReadBuffers};
use crate::sync::{Ordering, fence};

/// The word type: `core`'s `AtomicU64`, or `loom`'s under `--cfg loom`.
pub use crate::sync::AtomicU64;

/// Copies the bytes at `addr..addr + out.len()` out of `words`: a partial first word,
/// whole words, a partial last word. Not atomic (see the module docs).
pub fn read(words: &[AtomicU64], addr: usize, out: &mut [u8]) {
    let (mut index, offset) = (addr / 8, addr % 8);
    let mut out = out;
    if offset != 0 && !out.is_empty() {
        let take = (8 - offset).min(out.len());
        let value = words[index].load(Ordering::Relaxed).to_le_bytes();
        let (head, rest) = out.split_at_mut(take);
        head.copy_from_slice(&value[offset..offset + take]);
        out = rest;
        index += 1;
    }
    let mut chunks = out.chunks_exact_mut(8);
    let whole = chunks.len();
    for (chunk, word) in (&mut chunks).zip(&words[index..index + whole]) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let value = words[index + whole].load(Ordering::Relaxed).to_le_bytes();
        tail.copy_from_slice(&value[..tail.len()]);
    }
    fence(Ordering::AcqRel);
}

/// Stores `data` at `addr..addr + data.len()` into `words`: whole words are stored,
/// partial words at either end are merged. Not atomic (see the module docs).
pub fn write(words: &[AtomicU64], addr: usize, data: &[u8]) {
    let (mut index, offset) = (addr / 8, addr % 8);
    let mut data = data;
    if offset != 0 && !data.is_empty() {
        let take = (8 - offset).min(data.len());
        let (head, rest) = data.split_at(take);
        merge(&words[index], offset, head);
        data = rest;
        index += 1;
    }
    let chunks = data.chunks_exact(8);
    let whole = chunks.len();
    let tail = chunks.remainder();
    for (chunk, word) in chunks.zip(&words[index..index + whole]) {
        let mut value = [0u8; 8];
        value.copy_from_slice(chunk);
        word.store(u64::from_le_bytes(value), Ordering::Relaxed);
    }
    if !tail.is_empty() {
        merge(&words[index + whole], 0, tail);
    }
    fence(Ordering::AcqRel);
}

/// Replaces the word at byte `addr` (8-byte aligned) by `new` if it equals `expected`;
/// returns the previous value either way.
pub fn cas(words: &[AtomicU64], addr: usize, expected: u64, new: u64) -> u64 {
    let word = &words[addr / 8];
    let previous = match word.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(previous) | Err(previous) => previous,
    };
    fence(Ordering::AcqRel);
    previous
}

/// Executes `batch` in order on `words` (already checked with
/// [`crate::fabric::check_batch`]).
pub fn execute(words: &[AtomicU64], batch: &Batch) -> Completion {
    let mut completion = Completion::new();
    execute_into(words, batch, &mut completion);
    completion
}

/// [`execute`], appending the outputs to `out` (empty on entry): the fast path of
/// [`crate::Fabric::submit`], which writes a reply where its caller keeps it.
#[inline]
pub fn execute_into(words: &[AtomicU64], batch: &Batch, out: &mut Completion) {
    execute_reusing(words, batch, out, &ReadBuffers::new());
}

/// [`execute_into`], each read's output filled into a buffer from `buffers` (a
/// spare one given back earlier, [`crate::Fabric::give_back`]) instead of a new
/// allocation.
#[inline]
pub fn execute_reusing(
    words: &[AtomicU64],
    batch: &Batch,
    out: &mut Completion,
    buffers: &ReadBuffers,
) {
    for op in batch.ops() {
        let output = match op {
            Op::Read { addr, len } => {
                let mut buf = buffers.take_for_read(*len as usize);
                read(words, *addr as usize, &mut buf);
                OpOutput::Read(buf)
            }
            Op::Write { addr, data } => {
                write(words, *addr as usize, data);
                OpOutput::Written
            }
            Op::Cas {
                addr,
                expected,
                new,
            } => OpOutput::Cas(cas(words, *addr as usize, *expected, *new)),
        };
        // Batches and completions share the same capacity.
        let _ = out.push(output);
    }
}

/// [`execute_into`], the results left in `reply` ([`crate::Fabric::submit_in_place`]):
/// each read's bytes one after the other in its buffer, each CAS's answer by index.
/// `batch` was checked, and its reads fit in `reply` ([`InPlaceReply::fits`]).
#[inline]
pub fn execute_in_place(words: &[AtomicU64], batch: &Batch, reply: &mut InPlaceReply<'_>) {
    for (i, op) in batch.ops().iter().enumerate() {
        match op {
            Op::Read { addr, len } => read(words, *addr as usize, reply.next_read(*len as usize)),
            Op::Write { addr, data } => write(words, *addr as usize, data),
            Op::Cas {
                addr,
                expected,
                new,
            } => reply.set_cas(i, cas(words, *addr as usize, *expected, *new)),
        }
    }
}

/// [`execute_reusing`] for a batch whose result nobody looks at
/// ([`crate::Fabric::post_detached`]): the same writes and CASes in the same order,
/// each ending with its fence, and no outputs. A read changes no memory, so a read
/// of such a batch is skipped (nobody would see its bytes).
#[inline]
pub fn execute_effects(words: &[AtomicU64], batch: &Batch) {
    for op in batch.ops() {
        match op {
            Op::Read { .. } => {}
            Op::Write { addr, data } => write(words, *addr as usize, data),
            Op::Cas {
                addr,
                expected,
                new,
            } => {
                cas(words, *addr as usize, *expected, *new);
            }
        }
    }
}

/// Writes `bytes` at byte `offset` of `word`, keeping its other bytes: a CAS loop, so
/// that concurrent writers of the other bytes (and CASes on the word) are not
/// clobbered.
fn merge(word: &AtomicU64, offset: usize, bytes: &[u8]) {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        let mut value = current.to_le_bytes();
        value[offset..offset + bytes.len()].copy_from_slice(bytes);
        match word.compare_exchange_weak(
            current,
            u64::from_le_bytes(value),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(actual) => current = actual,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    fn words(bytes: usize) -> Vec<AtomicU64> {
        (0..bytes / 8).map(|_| AtomicU64::new(0)).collect()
    }

    fn snapshot(words: &[AtomicU64]) -> Vec<u8> {
        let mut out = alloc::vec![0; words.len() * 8];
        read(words, 0, &mut out);
        out
    }

    #[test]
    fn unaligned_writes_do_not_clobber_neighbours() {
        let mem = words(32);
        write(&mem, 0, &[0xAA; 32]);
        write(&mem, 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let out = snapshot(&mem);
        assert_eq!(&out[..3], &[0xAA; 3]);
        assert_eq!(&out[3..13], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(&out[13..], &[0xAA; 19]);
    }

    #[test]
    fn bytes_are_little_endian_words() {
        let mem = words(16);
        write(&mem, 8, &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(mem[1].load(Ordering::Relaxed), 0x0102_0304_0506_0708);
    }

    #[test]
    fn cas_returns_the_previous_word_and_swaps_only_on_a_match() {
        let mem = words(16);
        assert_eq!(cas(&mem, 8, 0, 5), 0);
        assert_eq!(cas(&mem, 8, 0, 6), 5, "no swap: the word is 5");
        assert_eq!(mem[1].load(Ordering::Relaxed), 5);
    }

    /// A detached batch leaves memory exactly as the same batch executed for its
    /// outputs does.
    #[test]
    fn effects_only_match_a_full_execution() {
        let (full, effects) = (words(64), words(64));
        let mut batch = Batch::new();
        batch
            .push(Op::Write {
                addr: 3,
                data: alloc::vec![7u8; 20].into(),
            })
            .unwrap()
            .push(Op::Read { addr: 0, len: 32 })
            .unwrap()
            .push(Op::Cas {
                addr: 40,
                expected: 0,
                new: 9,
            })
            .unwrap()
            .push(Op::Cas {
                addr: 48,
                expected: 1,
                new: 9,
            })
            .unwrap();
        let mut out = Completion::new();
        execute_reusing(&full, &batch, &mut out, &ReadBuffers::new());
        execute_effects(&effects, &batch);
        assert_eq!(snapshot(&full), snapshot(&effects));
        assert_eq!(
            effects[5].load(Ordering::Relaxed),
            9,
            "the CAS that matched"
        );
        assert_eq!(
            effects[6].load(Ordering::Relaxed),
            0,
            "the one that did not"
        );
    }

    /// A batch executed in place has the effects and answers of the same batch
    /// executed into a completion.
    #[test]
    fn in_place_matches_a_full_execution() {
        let (full, in_place) = (words(64), words(64));
        for mem in [&full, &in_place] {
            write(mem, 0, &[3u8; 64]);
        }
        let mut batch = Batch::read(4, 12);
        batch
            .push(Op::Write {
                addr: 8,
                data: alloc::vec![7u8; 20].into(),
            })
            .unwrap()
            .push(Op::Cas {
                addr: 40,
                expected: 0x0303_0303_0303_0303,
                new: 9,
            })
            .unwrap()
            .push(Op::Read { addr: 36, len: 12 })
            .unwrap();
        let mut out = Completion::new();
        execute_reusing(&full, &batch, &mut out, &ReadBuffers::new());
        let mut bytes = [0u8; 32];
        let mut reply = InPlaceReply::new(&mut bytes);
        assert!(reply.fits(&batch));
        execute_in_place(&in_place, &batch, &mut reply);
        assert_eq!(snapshot(&full), snapshot(&in_place));
        let reads: Vec<u8> = [out.read(0).unwrap(), out.read(3).unwrap()].concat();
        assert_eq!(reply.reads(), &reads[..]);
        assert_eq!(reply.cas(2), out.cas(2));
        assert_eq!((reply.cas(0), reply.cas(1)), (None, None));
    }

    proptest! {
        /// Any sequence of writes followed by any read agrees with a plain byte array.
        #[test]
        fn matches_a_byte_array_model(
            writes in proptest::collection::vec(
                (0usize..200, proptest::collection::vec(any::<u8>(), 0..60)),
                0..20,
            ),
            read_at in 0usize..256,
            read_len in 0usize..256,
        ) {
            let mem = words(256);
            let mut model = alloc::vec![0u8; 256];
            for (addr, data) in &writes {
                let len = data.len().min(256 - addr);
                write(&mem, *addr, &data[..len]);
                model[*addr..addr + len].copy_from_slice(&data[..len]);
            }
            let len = read_len.min(256 - read_at);
            let mut out = alloc::vec![0; len];
            read(&mem, read_at, &mut out);
            prop_assert_eq!(&out[..], &model[read_at..read_at + len]);
        }
    }
}
