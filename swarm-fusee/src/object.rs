//! Out-of-place KV objects with their embedded operation log entry (FUSEE §4.4-4.5).
//!
//! ```text
//! 0         header word: key length (u16) | value length (u32) | kind (u8) | 0
//! 8         key, then value, zero padded
//! OB - 48   checksum: xxh3-64 of everything before it, seeded with the object's address
//! OB - 40   log: prev           (this client's previous object, 0 for the first)
//! OB - 32   log: next           (the object this client allocates next)
//! OB - 24   log: slot address   (0 until the last writer records it with the old value)
//! OB - 16   log: old value      (0 until the last writer records the primary's old value)
//! OB - 8    used word           (written last, in the same ordered batch)
//! ```
//!
//! One ordered batch writes everything up to the log's old value, then the used word:
//! a reader or the master that sees the used word sees the whole object (the fabric's
//! batch order, like FUSEE's reliance on RDMA_WRITE order). The old value is an
//! aligned 8-byte word written alone, which the fabric writes atomically at 8-byte
//! granularity, so FUSEE's 1-byte CRC of it is not needed. The checksum is seeded with
//! the object's address: memory read from a node is untrusted, and an object copied
//! to another address does not validate there.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::FuseeError;

const HEADER: usize = 8;
const TRAILER: u64 = 48;
/// The used word's value.
pub const USED: u64 = 0x4445_5355_4545_5346; // "FSEEUSED"
/// A log entry whose operation the master finished (FUSEE §5.2: "a special value").
pub const COMMITTED: u64 = u64::MAX;
/// Flag of a recorded old value (the old value itself may be 0: an empty slot).
pub const OLD_PRESENT: u64 = 1 << 63;

/// What an object maps its key to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value.
    Value = 0,
    /// A delete's tombstone: the key is absent.
    Tombstone = 1,
}

/// Bytes of an object holding keys and values up to these sizes.
pub fn object_bytes(key_max: u32, value_max: u32) -> u64 {
    (HEADER as u64 + u64::from(key_max) + u64::from(value_max)).next_multiple_of(8) + TRAILER
}

/// Offsets of the log fields and the used word within an object of `object_bytes`.
pub mod offset {
    /// The slot address.
    pub fn slot(object_bytes: u64) -> u64 {
        object_bytes - 24
    }
    /// The old value.
    pub fn old(object_bytes: u64) -> u64 {
        object_bytes - 16
    }
    /// The used word.
    pub fn used(object_bytes: u64) -> u64 {
        object_bytes - 8
    }
}

/// The embedded log entry of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The index slot the operation writes.
    pub slot: u64,
    /// The client's previous object.
    pub prev: u64,
    /// The client's next object.
    pub next: u64,
    /// 0, [`OLD_PRESENT`] | old slot value, or [`COMMITTED`].
    pub old: u64,
}

/// The bytes of an object at `addr`, without its used word (written after them).
pub fn encode(
    object_bytes: u64,
    addr: u64,
    key: &[u8],
    value: &[u8],
    kind: Kind,
    log: LogEntry,
) -> Vec<u8> {
    let ob = object_bytes as usize;
    let mut b = vec![0u8; ob - 8];
    b[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    b[2..6].copy_from_slice(&(value.len() as u32).to_le_bytes());
    b[6] = kind as u8;
    b[HEADER..HEADER + key.len()].copy_from_slice(key);
    b[HEADER + key.len()..HEADER + key.len() + value.len()].copy_from_slice(value);
    let sum_at = ob - TRAILER as usize;
    let sum = xxh3_64_with_seed(&b[..sum_at], addr);
    b[sum_at..sum_at + 8].copy_from_slice(&sum.to_le_bytes());
    for (i, word) in [log.prev, log.next, log.slot, log.old]
        .into_iter()
        .enumerate()
    {
        let at = sum_at + 8 + 8 * i;
        b[at..at + 8].copy_from_slice(&word.to_le_bytes());
    }
    b
}

/// A validated object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Value or tombstone.
    pub kind: Kind,
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a tombstone).
    pub value: Vec<u8>,
    /// The log entry.
    pub log: LogEntry,
    /// Whether the used word is set.
    pub used: bool,
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes the `object_bytes` bytes read at `addr`, checking lengths and checksum.
pub fn decode(bytes: &[u8], addr: u64, object_bytes: u64) -> Result<Object, FuseeError> {
    let ob = object_bytes as usize;
    let corrupt = |why: &'static str| FuseeError::CorruptObject { addr, why };
    if bytes.len() != ob {
        return Err(corrupt("short read"));
    }
    let key_len = usize::from(u16::from_le_bytes([bytes[0], bytes[1]]));
    let value_len = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as usize;
    let sum_at = ob - TRAILER as usize;
    if HEADER + key_len + value_len > sum_at {
        return Err(corrupt("lengths overflow the object"));
    }
    let kind = match bytes[6] {
        0 => Kind::Value,
        1 => Kind::Tombstone,
        _ => return Err(corrupt("unknown kind")),
    };
    if xxh3_64_with_seed(&bytes[..sum_at], addr) != word(bytes, sum_at) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(Object {
        kind,
        key: bytes[HEADER..HEADER + key_len].to_vec(),
        value: bytes[HEADER + key_len..HEADER + key_len + value_len].to_vec(),
        log: LogEntry {
            prev: word(bytes, sum_at + 8),
            next: word(bytes, sum_at + 16),
            slot: word(bytes, sum_at + 24),
            old: word(bytes, sum_at + 32),
        },
        used: word(bytes, ob - 8) == USED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn objects_round_trip_and_any_flipped_data_byte_is_caught(
            key in proptest::collection::vec(any::<u8>(), 1..24),
            value in proptest::collection::vec(any::<u8>(), 0..64),
            flip in 0usize..80,
        ) {
            let ob = object_bytes(24, 64);
            let log = LogEntry { slot: 4096 + 64, prev: 0, next: 9000, old: 0 };
            let mut bytes = encode(ob, 1 << 20, &key, &value, Kind::Value, log);
            bytes.extend_from_slice(&USED.to_le_bytes());
            let o = decode(&bytes, 1 << 20, ob).expect("valid");
            prop_assert_eq!(&o.key, &key);
            prop_assert_eq!(&o.value, &value);
            prop_assert_eq!(o.log, log);
            prop_assert!(o.used);
            // Another address does not validate.
            prop_assert!(decode(&bytes, (1 << 20) + ob, ob).is_err());
            let at = flip % (ob as usize - TRAILER as usize);
            bytes[at] ^= 0x40;
            prop_assert!(decode(&bytes, 1 << 20, ob).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, 4096, object_bytes(24, 64));
        }
    }
}
