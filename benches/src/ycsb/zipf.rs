//! YCSB's scrambled Zipfian key chooser (Cooper et al., SoCC 2010;
//! `site.ycsb.generator.ScrambledZipfianGenerator`), which the SWARM paper's
//! workloads use (§7: "Zipfian (.99) key distribution"), drawn from a table.
//!
//! YCSB's scrambled generator does **not** draw a Zipfian rank over the key space
//! itself: it draws a rank over a fixed space of 10¹⁰ items (with that space's
//! precomputed zeta, [`YCSB_ZETAN`]) and folds it onto the key space with an FNV-1a
//! hash modulo the key count. Popular ranks thus land on keys spread all over the key
//! space, and the tail of 10¹⁰ ranks spreads almost uniformly: with 100 000 keys the
//! hottest key receives `1 / ζ(10¹⁰, 0.99) ≈ 3.78 %` of the requests, the next one
//! 1.89 %. That is the skew YCSB (and the paper) measure, so it is reproduced here,
//! constant and scramble included, rather than a textbook Zipfian over the keys.
//!
//! YCSB draws each rank with Gray et al.'s formula ("Quickly generating
//! billion-record synthetic databases", SIGMOD 1994: two uniform doubles and a power
//! of about 100), then hashes it: about 300 instructions a draw, as much as the
//! harness's whole recording of an operation. [`ScrambledZipfian`] instead computes
//! once the probability of every key under that law and draws from an alias table
//! (Walker; Vose's construction): one uniform 64-bit draw, one multiplication and
//! one table entry, about 20 instructions. The law per key (see
//! [`ScrambledZipfian::new`]): rank `r` (from 0) has probability
//! `(r + 1)^-θ / ζ(10¹⁰, θ)` (Zipf's law, which Gray's formula approximates and meets
//! exactly for the two hottest ranks) and lands on key `fnv(r) mod keys`; the ranks
//! past the first [`head_ranks`] are spread evenly over the keys (each key receives
//! thousands of them). A seed thus draws other keys than YCSB's generator would, with
//! the same distribution; the tests check that distribution, not YCSB's draws.
//!
//! Uniform draws come from a caller-seeded RNG instead of Java's `ThreadLocalRandom`,
//! so a run is reproducible from its seed.

use std::sync::Arc;

use rand::Rng;

/// YCSB's default Zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The rank space of YCSB's scrambled generator (`ScrambledZipfianGenerator.ITEM_COUNT`).
pub const YCSB_ITEM_COUNT: u64 = 10_000_000_000;

/// `ζ(10¹⁰, 0.99)`, precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`): summing
/// 10¹⁰ terms at start-up would take a minute. A unit test re-derives it.
pub const YCSB_ZETAN: f64 = 26.469_028_201_783_02;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// The most values a [`ScrambledZipfian`] draws among (its table indexes them with
/// 32 bits; a key space that large would not fit in memory as names anyway).
pub const MAX_ITEMS: u64 = 1 << 32;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of `value`, then
/// the absolute value as a Java `long`.
///
/// Java's `Math.abs(Long.MIN_VALUE)` stays negative, which would make YCSB index
/// outside its key space for that one hash value; here it maps to `2⁶³` instead.
pub fn fnv_hash64(value: u64) -> u64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for byte in value.to_le_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    (hash as i64).unsigned_abs()
}

/// `ζ(n, θ) = Σ_{i=1..n} 1 / i^θ` (YCSB's `zetastatic` from 0).
pub fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

/// How many of the hottest ranks [`ScrambledZipfian::new`] places one by one for
/// `items` values: 16 per value, at least 2²⁰ and at most 2²⁶ (the rest of the
/// 10¹⁰ ranks are spread evenly). Past it a rank's probability is below
/// `1 / (16·items·ζ)`, and each value receives about `10¹⁰ / items` of those ranks,
/// so their sum per value is close to its mean.
pub fn head_ranks(items: u64) -> u64 {
    items
        .saturating_mul(16)
        .clamp(1 << 20, 1 << 26)
        .min(YCSB_ITEM_COUNT)
}

/// One entry of the alias table: value `i` is drawn if the draw's fraction is below
/// `keep`, else `alias` is.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The share of entry `i`'s slot that is value `i`, in units of `2⁻³²`.
    keep: u32,
    /// The value drawn in the rest of the slot (`i` itself for a full slot).
    alias: u32,
}

/// YCSB's `ScrambledZipfianGenerator` with the Zipfian constant 0.99 (ranks over
/// [`YCSB_ITEM_COUNT`] items, hashed onto `[min, max]`), drawn from an alias table.
/// See the module docs for the law and the resulting skew. Clones share the table
/// (8 bytes per value).
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    table: Arc<[Entry]>,
}

impl ScrambledZipfian {
    /// Values in `[min, max]`; `None` if `max < min` or the range holds more than
    /// [`MAX_ITEMS`] values. Computes the probability of every value (the
    /// [`head_ranks`] hottest ranks one by one) and its alias table: linear in the
    /// value count, about 30 ms for 100 000 values.
    pub fn new(min: u64, max: u64) -> Option<Self> {
        let item_count = max.checked_sub(min)?.checked_add(1)?;
        if item_count > MAX_ITEMS {
            return None;
        }
        let probabilities = Self::law(item_count);
        Some(Self {
            min,
            item_count,
            table: alias_table(&probabilities).into(),
        })
    }

    /// The probability of each of `items` values (indexed from 0): the head ranks'
    /// Zipf probabilities where they land, the rest of the mass evenly.
    fn law(items: u64) -> Vec<f64> {
        let head = head_ranks(items);
        let mut probabilities = vec![0.0f64; items as usize];
        let mut placed = 0.0;
        for rank in 0..head {
            let p = ((rank + 1) as f64).powf(-ZIPFIAN_CONSTANT) / YCSB_ZETAN;
            probabilities[(fnv_hash64(rank) % items) as usize] += p;
            placed += p;
        }
        let spread = (1.0 - placed).max(0.0) / items as f64;
        for p in &mut probabilities {
            *p += spread;
        }
        probabilities
    }

    /// How many values the generator can return.
    pub fn item_count(&self) -> u64 {
        self.item_count
    }

    /// Where rank `rank` of the underlying Zipfian lands (rank 0 is the hottest).
    pub fn value_of_rank(&self, rank: u64) -> u64 {
        self.min + fnv_hash64(rank) % self.item_count
    }

    /// The next value: one uniform 64-bit draw picks a slot (its high part) and a
    /// point in it (its low part).
    #[inline]
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        let wide = u128::from(rng.next_u64()) * u128::from(self.item_count);
        // `wide >> 64 < item_count`, which the table's length is.
        let slot = (wide >> 64) as usize;
        let point = ((wide as u64) >> 32) as u32;
        let entry = self.table[slot];
        let index = if point < entry.keep {
            slot as u64
        } else {
            u64::from(entry.alias)
        };
        self.min + index
    }
}

/// Vose's alias table for `probabilities` (summing to 1, at most [`MAX_ITEMS`]).
fn alias_table(probabilities: &[f64]) -> Box<[Entry]> {
    let n = probabilities.len();
    let mut scaled: Vec<f64> = probabilities.iter().map(|p| p * n as f64).collect();
    let (mut small, mut large): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    for (i, &s) in scaled.iter().enumerate() {
        if s < 1.0 { &mut small } else { &mut large }.push(i as u32);
    }
    let mut table: Vec<Entry> = (0..n)
        .map(|i| Entry {
            keep: u32::MAX,
            alias: i as u32,
        })
        .collect();
    while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
        small.pop();
        let share = scaled[s as usize];
        table[s as usize] = Entry {
            keep: to_fraction(share),
            alias: l,
        };
        let rest = scaled[l as usize] - (1.0 - share);
        scaled[l as usize] = rest;
        if rest < 1.0 {
            large.pop();
            small.push(l);
        }
    }
    // What is left is full up to rounding: each keeps its whole slot (the initial
    // entries).
    table.into_boxed_slice()
}

/// `share` (in `[0, 1]`) in units of `2⁻³²`, saturated.
fn to_fraction(share: f64) -> u32 {
    (share.clamp(0.0, 1.0) * (1u64 << 32) as f64).min(u32::MAX as f64) as u32
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    use super::*;

    fn rng(seed: u64) -> Xoshiro256PlusPlus {
        Xoshiro256PlusPlus::seed_from_u64(seed)
    }

    /// FNV-1a over bytes, checked against the published test vectors.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(FNV_OFFSET_BASIS_64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(FNV_PRIME_64)
        })
    }

    #[test]
    fn fnv_is_ycsb_fnv1a_over_little_endian_bytes_then_abs() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let mut negated = 0;
        for v in (0..10_000u64).chain([u64::MAX, 1 << 63, 0xdead_beef]) {
            let raw = fnv1a(&v.to_le_bytes());
            let expected = if (raw as i64) < 0 {
                negated += 1;
                raw.wrapping_neg()
            } else {
                raw
            };
            assert_eq!(fnv_hash64(v), expected, "value {v}");
        }
        assert!(negated > 0, "Java's Math.abs path was never exercised");
        // Distinct ids give distinct hashes (keys are built from them).
        let mut seen = std::collections::HashSet::new();
        for i in 0..200_000u64 {
            assert!(seen.insert(fnv_hash64(i)), "fnv collision at {i}");
        }
    }

    /// YCSB's constant is `ζ(10¹⁰, 0.99)`: the first 10⁶ terms summed, the rest by
    /// Euler–Maclaurin (∫ + endpoint terms + first derivative correction; the next
    /// term is below 10⁻¹⁸).
    #[test]
    fn ycsb_zetan_is_zeta_of_ten_billion() {
        let theta = ZIPFIAN_CONSTANT;
        let m = 1_000_000f64;
        let n = YCSB_ITEM_COUNT as f64;
        let f = |x: f64| x.powf(-theta);
        let df = |x: f64| -theta * x.powf(-theta - 1.0);
        let head = zeta(999_999, theta);
        let integral = (n.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta);
        let tail = integral + (f(m) + f(n)) / 2.0 + (df(n) - df(m)) / 12.0;
        let computed = head + tail;
        assert!(
            (computed - YCSB_ZETAN).abs() < 1e-6,
            "ζ(1e10, 0.99) = {computed}, YCSB uses {YCSB_ZETAN}"
        );
    }

    #[test]
    fn refuses_bad_ranges() {
        assert!(ScrambledZipfian::new(1, 0).is_none());
        assert!(ScrambledZipfian::new(0, u64::MAX).is_none());
        assert!(ScrambledZipfian::new(0, MAX_ITEMS).is_none());
    }

    /// Each value's probability as the alias table splits it (indexed from 0).
    fn held(zipf: &ScrambledZipfian) -> Vec<f64> {
        let scale = (1u64 << 32) as f64;
        let mut held = vec![0.0; zipf.table.len()];
        for (i, entry) in zipf.table.iter().enumerate() {
            if entry.alias as usize == i {
                held[i] += 1.0;
            } else {
                let keep = f64::from(entry.keep) / scale;
                held[i] += keep;
                held[entry.alias as usize] += 1.0 - keep;
            }
        }
        held.iter().map(|h| h / zipf.table.len() as f64).collect()
    }

    /// Zipf's probability of rank `rank` (from 0) among YCSB's 10¹⁰.
    fn zipf_law(rank: u64) -> f64 {
        ((rank + 1) as f64).powf(-ZIPFIAN_CONSTANT) / YCSB_ZETAN
    }

    /// The table holds the law it was built from: each value's probability as the
    /// alias table splits it is the computed one, and they sum to 1.
    #[test]
    fn the_table_holds_the_law() {
        for items in [1u64, 2, 3, 1000, 10_001] {
            let zipf = ScrambledZipfian::new(5, 5 + items - 1).unwrap();
            let law = ScrambledZipfian::law(items);
            let table = held(&zipf);
            let mut total = 0.0;
            for (i, (&p, &held)) in law.iter().zip(&table).enumerate() {
                assert!(
                    (held - p).abs() <= 1e-9 * (1.0 + p * items as f64) / items as f64 + 1e-12,
                    "{items} items: value {i} has {held} in the table, {p} computed"
                );
                total += held;
            }
            assert!((total - 1.0).abs() < 1e-6, "{items} items: total {total}");
        }
    }

    /// The draws follow the law: the keys of the 20 hottest ranks (scrambled: where
    /// `fnv(rank) mod keys` puts them, not keys 0 to 19) are drawn with their Zipf
    /// probability, plus that of the other head ranks that land on them (summed
    /// here rank by rank, apart from the table's construction) and the even share of
    /// the tail; the three hottest in rank order; the coldest keys get about the
    /// even share and the head's average.
    #[test]
    fn draws_follow_the_scrambled_zipf_law() {
        let seed = 11;
        for keys in [10_001u64, 100_001] {
            let zipf = ScrambledZipfian::new(0, keys - 1).unwrap();
            let mut rng = rng(seed);
            let draws = 1_000_000u64;
            let mut counts = vec![0u32; keys as usize];
            for _ in 0..draws {
                let key = zipf.next(&mut rng);
                assert!(key < keys, "seed {seed}: key {key} out of range");
                counts[key as usize] += 1;
            }
            let hot: Vec<u64> = (0..20).map(|r| zipf.value_of_rank(r)).collect();
            assert_ne!(hot[..5], [0, 1, 2, 3, 4], "the ranks are not scrambled");
            let head_ranks = head_ranks(keys);
            let head: f64 = (0..head_ranks).map(zipf_law).sum();
            let even = (1.0 - head) / keys as f64;
            let mut landed = std::collections::HashMap::new();
            for rank in 0..head_ranks {
                let key = zipf.value_of_rank(rank);
                if hot.contains(&key) {
                    *landed.entry(key).or_insert(0.0) += zipf_law(rank);
                }
            }
            for (rank, &key) in hot.iter().enumerate() {
                let expected = landed[&key] + even;
                assert!(expected >= zipf_law(rank as u64) + even);
                let freq = f64::from(counts[key as usize]) / draws as f64;
                assert!(
                    (freq - expected).abs() < 0.1 * expected,
                    "seed {seed}, {keys} keys: rank {rank} (key {key}) drawn at {freq}, \
                     Zipf's law gives {expected} ({} for the rank alone)",
                    zipf_law(rank as u64) + even
                );
            }
            let mut by_count: Vec<u64> = (0..keys).collect();
            by_count.sort_by_key(|&k| std::cmp::Reverse(counts[k as usize]));
            assert_eq!(by_count[..3], hot[..3], "seed {seed}, {keys} keys");
            // The coldest half: below the average share of a key, above the even one.
            let cold = &by_count[keys as usize / 2..];
            let cold_freq = cold
                .iter()
                .map(|&k| f64::from(counts[k as usize]))
                .sum::<f64>()
                / draws as f64
                / cold.len() as f64;
            assert!(
                cold_freq < 1.0 / keys as f64 && cold_freq > 0.9 * even,
                "seed {seed}, {keys} keys: the coldest half drawn at {cold_freq} each, \
                 the even share is {even}"
            );
        }
    }

    #[test]
    fn reaches_every_key() {
        let seed = 3;
        let keys = 1000u64;
        let zipf = ScrambledZipfian::new(10, 10 + keys - 1).unwrap();
        let mut rng = rng(seed);
        let mut counts = vec![0u32; keys as usize];
        for _ in 0..200_000 {
            let key = zipf.next(&mut rng);
            assert!((10..10 + keys).contains(&key), "seed {seed}: key {key}");
            counts[(key - 10) as usize] += 1;
        }
        let unreached: Vec<usize> = (0..keys as usize).filter(|&k| counts[k] == 0).collect();
        assert!(
            unreached.is_empty(),
            "seed {seed}: keys never drawn: {unreached:?}"
        );
    }

    #[test]
    fn one_value_is_always_drawn() {
        let zipf = ScrambledZipfian::new(7, 7).unwrap();
        let mut rng = rng(1);
        assert!((0..1000).all(|_| zipf.next(&mut rng) == 7));
    }

    #[test]
    fn same_seed_same_sequence() {
        let zipf = ScrambledZipfian::new(0, 99_999).unwrap();
        let (mut a, mut b) = (rng(42), rng(42));
        let xs: Vec<u64> = (0..1000).map(|_| zipf.next(&mut a)).collect();
        let ys: Vec<u64> = (0..1000).map(|_| zipf.next(&mut b)).collect();
        assert_eq!(xs, ys);
        let mut c = rng(43);
        let zs: Vec<u64> = (0..1000).map(|_| zipf.next(&mut c)).collect();
        assert_ne!(xs, zs);
    }
}
