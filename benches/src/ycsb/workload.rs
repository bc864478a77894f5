//! What a YCSB client does: the operation mix of core workloads A, B and C, the keys
//! it names (YCSB's `user<hash>` keys, padded), the key chooser, and the values it
//! writes.
//!
//! Keys follow YCSB's `CoreWorkload.buildKeyName` with hashed insert order: key
//! number `i` is `"user"` followed by the decimal FNV hash of `i`, zero-padded here to
//! the requested key size (the paper uses 24 B keys, §7). Requests pick the key
//! number with YCSB's scrambled Zipfian law over `[0, keys]` (drawn from a table, see
//! [`super::zipf`]) and redraw the one value past the last loaded key, as
//! `CoreWorkload.nextKeynum` does.
//!
//! Values are not random bytes as in YCSB: each begins with a tag naming the client
//! and that client's operation number, so that every value written in a run is
//! distinct. The linearizability checker relies on it to tell which write a read
//! observed.

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::error::BenchError;
use super::zipf::{ScrambledZipfian, fnv_hash64};

/// The shortest key size: `"user"` and the up to 19 digits of a 63-bit hash.
pub const MIN_KEY_SIZE: usize = 4 + 19;

/// A YCSB core workload (SWARM §7 runs A and B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Update heavy: 50 % gets, 50 % updates.
    A,
    /// Read mostly: 95 % gets, 5 % updates.
    B,
    /// Read only: 100 % gets.
    C,
    /// Update only: 100 % updates. Not a YCSB core workload: the contention experiment
    /// (SWARM §7.8) runs it on one key with more and more writers.
    U,
    /// Churn: a sliding window of `--keys` live keys over an ever-new key sequence.
    /// Operation `2j` inserts key `j`; operation `2j + 1` deletes key `j - keys` (a
    /// get of key `j` while the window fills). Nothing is loaded first. Over a run,
    /// `ops / 2` distinct keys are inserted (names wrap after [`CHURN_SPACE`] windows),
    /// many times the cluster's register capacity, while at most about `--keys` are
    /// live at once. Not a YCSB workload: it exercises memory recycling (SWARM §5.4).
    Churn,
}

impl Workload {
    /// The fraction of operations that are gets; the rest are updates.
    pub fn get_proportion(self) -> f64 {
        match self {
            Self::A => 0.5,
            Self::B => 0.95,
            Self::C => 1.0,
            Self::U | Self::Churn => 0.0,
        }
    }

    /// Whether the keys are loaded (inserted) before the measured phase: all but
    /// churn, which inserts and deletes them as it goes.
    pub fn loads_keys(self) -> bool {
        self != Self::Churn
    }

    /// `"a"`, `"b"`, `"c"` or `"u"`, as in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Self::A => "a",
            Self::B => "b",
            Self::C => "c",
            Self::U => "u",
            Self::Churn => "churn",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::U => f.write_str("update-only"),
            Self::Churn => f.write_str("churn"),
            _ => write!(f, "YCSB-{}", self.name().to_uppercase()),
        }
    }
}

/// The kind of a benchmark operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// Read a key.
    Get,
    /// Overwrite a present key.
    Update,
    /// Insert a key (the load phase; churn).
    Insert,
    /// Delete a key (churn).
    Delete,
}

impl OpType {
    /// Every kind, in report order.
    pub const ALL: [Self; 4] = [Self::Get, Self::Update, Self::Insert, Self::Delete];

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `"get"`, `"update"` or `"insert"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::Update => "update",
            Self::Insert => "insert",
            Self::Delete => "delete",
        }
    }
}

impl std::fmt::Display for OpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// YCSB key `keynum` padded to `key_size` bytes: `user`, zeros, the FNV hash of
/// `keynum`. Keys never come out shorter than their digits: sizes below
/// [`MIN_KEY_SIZE`] are refused by [`KeySpace::new`].
pub fn key_name(keynum: u64, key_size: usize) -> String {
    let digits = fnv_hash64(keynum).to_string();
    let zeros = key_size.saturating_sub(4 + digits.len());
    let mut key = String::with_capacity(key_size.max(4 + digits.len()));
    key.push_str("user");
    key.extend(std::iter::repeat_n('0', zeros));
    key.push_str(&digits);
    key
}

/// The names of keys `0..keys`, built once and shared by every client: YCSB keys
/// `offset..offset + keys` (see [`KeySpace::with_offset`]).
#[derive(Clone, Debug)]
pub struct KeySpace {
    keys: u64,
    key_size: usize,
    names: String,
}

impl KeySpace {
    /// Names `keys` keys of `key_size` bytes (YCSB keys, see the module docs).
    pub fn new(keys: u64, key_size: usize) -> Result<Self, BenchError> {
        Self::with_offset(keys, key_size, 0)
    }

    /// Names `keys` keys of `key_size` bytes, key `k` named like YCSB key `offset + k`
    /// (`swarm bench --key-offset`): spaces whose ranges of key numbers do not
    /// overlap name distinct keys (up to a collision of the 63-bit key hash, as
    /// unlikely between two spaces as within one).
    pub fn with_offset(keys: u64, key_size: usize, offset: u64) -> Result<Self, BenchError> {
        if key_size < MIN_KEY_SIZE {
            return Err(BenchError::KeySizeTooSmall {
                size: key_size,
                min: MIN_KEY_SIZE,
            });
        }
        if keys == 0 {
            return Err(BenchError::InvalidConfig(
                "the key count must be at least 1".into(),
            ));
        }
        let bytes = usize::try_from(keys)
            .ok()
            .and_then(|k| k.checked_mul(key_size))
            .ok_or_else(|| {
                BenchError::InvalidConfig(format!(
                    "{keys} keys of {key_size} B do not fit in memory"
                ))
            })?;
        if offset.checked_add(keys).is_none() {
            return Err(BenchError::InvalidConfig(format!(
                "key offset {offset} plus {keys} keys overflows 64 bits"
            )));
        }
        let mut names = String::with_capacity(bytes);
        for keynum in offset..offset + keys {
            names.push_str(&key_name(keynum, key_size));
        }
        Ok(Self {
            keys,
            key_size,
            names,
        })
    }

    /// The number of keys.
    pub fn len(&self) -> u64 {
        self.keys
    }

    /// Whether there are no keys (never: [`Self::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// The name of key `keynum` (`keynum < len()`; others are clamped to the last key).
    pub fn key(&self, keynum: u64) -> &str {
        let keynum = keynum.min(self.keys - 1) as usize;
        &self.names[keynum * self.key_size..(keynum + 1) * self.key_size]
    }
}

/// YCSB's request key chooser for a loaded store of `keys` keys.
#[derive(Clone, Debug)]
pub struct KeyChooser {
    keys: u64,
    zipf: ScrambledZipfian,
}

impl KeyChooser {
    /// Scrambled Zipfian over `[0, keys]`, redrawing `keys` itself (YCSB sizes the
    /// chooser for one key more than it loaded, then rejects keys not yet inserted).
    pub fn new(keys: u64) -> Result<Self, BenchError> {
        let zipf = ScrambledZipfian::new(0, keys)
            .filter(|_| keys > 0)
            .ok_or_else(|| BenchError::InvalidConfig(format!("cannot draw keys among {keys}")))?;
        Ok(Self { keys, zipf })
    }

    /// The next key number, in `[0, keys)`.
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        loop {
            let keynum = self.zipf.next(rng);
            if keynum < self.keys {
                return keynum;
            }
        }
    }
}

/// How many windows of `--keys` names the churn workload cycles through: key `j`
/// is named like key `j mod (CHURN_SPACE x keys)`. A name comes back long after its
/// earlier key left the window (was deleted).
pub const CHURN_SPACE: u64 = 16;

/// Draws the operations of a workload: kind (YCSB's `DiscreteGenerator` over the
/// read and update proportions), then key; for churn, the next step of the sliding
/// window (see [`Workload::Churn`]), shared by every client of the run.
#[derive(Clone, Debug)]
pub struct OpChooser {
    get_proportion: f64,
    mode: KeyMode,
}

#[derive(Clone, Debug)]
enum KeyMode {
    /// YCSB's scrambled Zipfian over the loaded keys.
    Ycsb(KeyChooser),
    /// Churn: a window of `window` live keys; `issued` numbers the operations of
    /// every client that shares this chooser.
    Churn {
        window: u64,
        issued: std::sync::Arc<std::sync::atomic::AtomicU64>,
    },
}

impl OpChooser {
    /// Operations of `workload` over `keys` keys (loaded, or the churn window).
    pub fn new(workload: Workload, keys: u64) -> Result<Self, BenchError> {
        let mode = if workload == Workload::Churn {
            if keys == 0 {
                return Err(BenchError::InvalidConfig(
                    "churn needs at least one key".into(),
                ));
            }
            KeyMode::Churn {
                window: keys,
                issued: Default::default(),
            }
        } else {
            KeyMode::Ycsb(KeyChooser::new(keys)?)
        };
        Ok(Self {
            get_proportion: workload.get_proportion(),
            mode,
        })
    }

    /// The next operation: its kind and key number.
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> (OpType, u64) {
        match &self.mode {
            KeyMode::Churn { window, issued } => {
                let number = issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let space = window.saturating_mul(CHURN_SPACE);
                let j = number / 2;
                if number % 2 == 0 {
                    (OpType::Insert, j % space)
                } else if j >= *window {
                    (OpType::Delete, (j - window) % space)
                } else {
                    (OpType::Get, j % space)
                }
            }
            KeyMode::Ycsb(keys) => {
                let u: f64 = rng.random();
                let op = if u < self.get_proportion {
                    OpType::Get
                } else {
                    OpType::Update
                };
                (op, keys.next(rng))
            }
        }
    }
}

/// The tag that starts the value written by `client` as its operation `seq`:
/// `<client hex>.<seq hex>.`. The dots make tags prefix-free, so values with distinct
/// tags differ.
fn value_tag(client: u32, seq: u64) -> String {
    format!("{client:x}.{seq:x}.")
}

/// The length of the value tag of `client`'s operation `seq`; tags grow with both,
/// so the largest client and sequence number give the longest.
pub fn value_tag_len(client: u32, seq: u64) -> usize {
    value_tag(client, seq).len()
}

/// The value `client` writes as its operation `seq`: the tag, then lowercase letters
/// drawn from a hash of the tag up to `size` bytes. `None` if `size` is too small
/// for the tag (see [`value_tag_len`]). Printable ASCII, so it is also a JSON string.
pub fn value(client: u32, seq: u64, size: usize) -> Option<Vec<u8>> {
    let tag = value_tag(client, seq);
    if tag.len() > size {
        return None;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(tag.as_bytes());
    let mut state = fnv_hash64(u64::from(client) << 48 ^ seq) | 1;
    while out.len() < size {
        // xorshift64: cheap filler so values are not runs of one byte.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let take = (size - out.len()).min(8);
        out.extend(state.to_le_bytes()[..take].iter().map(|b| b'a' + b % 26));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    use super::*;

    #[test]
    fn keys_are_ycsb_names_padded_to_size() {
        let h = fnv_hash64(0).to_string();
        assert_eq!(key_name(0, 0), format!("user{h}"));
        let padded = key_name(0, 24);
        assert_eq!(padded.len(), 24);
        assert!(padded.starts_with("user0"));
        assert!(padded.ends_with(&h));
        let space = KeySpace::new(100_000, 24).unwrap();
        let mut seen = HashSet::new();
        for k in 0..space.len() {
            let key = space.key(k);
            assert_eq!(key.len(), 24);
            assert_eq!(key, key_name(k, 24));
            assert!(seen.insert(key), "duplicate key {key}");
        }
        assert!(matches!(
            KeySpace::new(10, 22),
            Err(BenchError::KeySizeTooSmall { size: 22, min: 23 })
        ));
        assert!(KeySpace::new(0, 24).is_err());
    }

    #[test]
    fn offset_spaces_name_disjoint_keys() {
        let base = KeySpace::new(3000, 24).unwrap();
        let shifted = KeySpace::with_offset(1000, 24, 3000).unwrap();
        let overlapping = KeySpace::with_offset(1000, 24, 2500).unwrap();
        let names = |s: &KeySpace| {
            (0..s.len())
                .map(|k| s.key(k).to_owned())
                .collect::<HashSet<_>>()
        };
        let (b, s, o) = (names(&base), names(&shifted), names(&overlapping));
        assert!(b.is_disjoint(&s));
        assert_eq!(b.intersection(&o).count(), 500);
        assert_eq!(shifted.key(0), key_name(3000, 24));
        assert_eq!(KeySpace::with_offset(5, 24, 0).unwrap().key(4), base.key(4));
        assert!(KeySpace::with_offset(2, 24, u64::MAX - 1).is_err());
    }

    #[test]
    fn workload_mixes_match_ycsb() {
        let seed = 5;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        for (workload, expected) in [(Workload::A, 0.5), (Workload::B, 0.95), (Workload::C, 1.0)] {
            let chooser = OpChooser::new(workload, 1000).unwrap();
            let draws = 100_000;
            let mut gets = 0;
            for _ in 0..draws {
                let (op, key) = chooser.next(&mut rng);
                assert!(key < 1000, "seed {seed}: key {key}");
                gets += usize::from(op == OpType::Get);
            }
            let frac = gets as f64 / f64::from(draws);
            assert!(
                (frac - expected).abs() < 0.01,
                "seed {seed}: {workload} get fraction {frac}"
            );
        }
    }

    #[test]
    fn churn_keeps_a_window_of_live_keys_over_many_distinct_keys() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        let window = 100;
        let chooser = OpChooser::new(Workload::Churn, window).unwrap();
        // Replay the operations in order and track the live set.
        let mut live = std::collections::HashSet::new();
        let (mut inserted, mut max_live) = (0u64, 0usize);
        for _ in 0..4 * window * CHURN_SPACE {
            let (op, key) = chooser.next(&mut rng);
            assert!(key < window * CHURN_SPACE);
            match op {
                OpType::Insert => {
                    assert!(live.insert(key), "key {key} inserted while live");
                    inserted += 1;
                }
                OpType::Delete => assert!(live.remove(&key), "key {key} deleted while absent"),
                OpType::Get => assert!(live.contains(&key)),
                OpType::Update => panic!("churn never updates"),
            }
            max_live = max_live.max(live.len());
        }
        assert_eq!(max_live as u64, window + 1);
        // Many times the window, and the names wrapped around.
        assert_eq!(inserted, 2 * window * CHURN_SPACE);
        // Clones share the sequence (one chooser per run, cloned per client).
        let other = chooser.clone();
        let (a, b) = (chooser.next(&mut rng).1, other.next(&mut rng).1);
        assert_ne!(a, b);
        assert!(!Workload::Churn.loads_keys() && Workload::A.loads_keys());
        assert!(OpChooser::new(Workload::Churn, 0).is_err());
    }

    #[test]
    fn key_chooser_stays_in_range_even_with_one_key() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let chooser = KeyChooser::new(1).unwrap();
        for _ in 0..1000 {
            assert_eq!(chooser.next(&mut rng), 0);
        }
        assert!(KeyChooser::new(0).is_err());
    }

    #[test]
    fn values_are_unique_sized_and_printable() {
        let mut seen = HashSet::new();
        for client in [0u32, 1, 15, 16, 255] {
            for seq in (0..2000u64).chain([u64::MAX]) {
                let v = value(client, seq, 64).unwrap();
                assert_eq!(v.len(), 64);
                assert!(v.iter().all(|b| b.is_ascii_graphic()));
                assert!(seen.insert(v), "duplicate value for ({client}, {seq})");
            }
        }
        assert_eq!(value_tag_len(0xff, 0x1000), "ff.1000.".len());
        assert_eq!(value(0xff, 0x1000, 8).unwrap(), b"ff.1000.");
        assert_eq!(value(0xff, 0x1000, 7), None);
        assert_eq!(value(1, 2, 16), value(1, 2, 16));
    }
}
