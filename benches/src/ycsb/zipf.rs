//! YCSB's Zipfian key choosers, ported exactly (Cooper et al., SoCC 2010; the
//! `site.ycsb.generator` package): `ZipfianGenerator` (Gray et al.'s "Quickly
//! generating billion-record synthetic databases", SIGMOD 1994) and
//! `ScrambledZipfianGenerator`, which the SWARM paper's workloads use (§7: "Zipfian
//! (.99) key distribution").
//!
//! The scrambled generator does **not** draw a Zipfian rank over the key space itself:
//! it draws a rank over a fixed space of 10¹⁰ items (with that space's precomputed
//! zeta, [`YCSB_ZETAN`]) and folds it onto the key space with an FNV-1a hash modulo
//! the key count. Popular ranks thus land on keys spread all over the key space,
//! and the tail of 10¹⁰ ranks spreads almost uniformly: with 100 000 keys the hottest
//! key receives `1 / ζ(10¹⁰, 0.99) ≈ 3.78 %` of the requests, the next one 1.89 %.
//! That is the skew YCSB (and the paper) measure, so it is reproduced here, constant
//! included, rather than a textbook Zipfian over the keys.
//!
//! Uniform doubles come from a caller-seeded RNG instead of Java's
//! `ThreadLocalRandom`, so a run is reproducible from its seed.

use rand::{Rng, RngExt};

/// YCSB's default Zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The rank space of YCSB's scrambled generator (`ScrambledZipfianGenerator.ITEM_COUNT`).
pub const YCSB_ITEM_COUNT: u64 = 10_000_000_000;

/// `ζ(10¹⁰, 0.99)`, precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`): summing
/// 10¹⁰ terms at start-up would take a minute. A unit test re-derives it.
pub const YCSB_ZETAN: f64 = 26.469_028_201_783_02;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

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

/// YCSB's `ZipfianGenerator`: ranks in `[min, max]`, rank `min` the most popular,
/// drawn with Gray et al.'s constant-time approximation of a Zipfian with exponent
/// `theta` (the two most popular ranks have their exact Zipfian probability).
#[derive(Clone, Debug)]
pub struct ZipfianGenerator {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    /// `1 + 0.5^θ`: below it (times ζ(n)), the draw is the second rank.
    second_rank_below: f64,
    /// `α` rounded, when it is an integer but for its last bits (`θ = 0.99` gives
    /// `α = 99.999…`): the draw's power is then taken by squaring (eight
    /// multiplications for 100) instead of a `powf`, about 200 instructions of the
    /// draw's 300. See [`int_power`] for how far the two differ.
    int_alpha: Option<u32>,
}

/// `α` as an integer if it is one within `1e-9` relative (and at most 4096).
fn integer_exponent(alpha: f64) -> Option<u32> {
    let rounded = alpha.round();
    let close = (alpha - rounded).abs() <= 1e-9 * rounded;
    (close && (1.0..=4096.0).contains(&rounded)).then_some(rounded as u32)
}

/// `x^n` by squaring. For `x` in `[0, 1]` (every draw's base) and `n` up to 4096 it is
/// within about `2·log2(n)` ulps of the exact power, and differs from
/// `x.powf(α)` by at most that plus `|ln(x^α)|·|α - n|/α` relative (about `10⁻¹³`
/// for θ = 0.99): a drawn rank `items·x^α` below `10¹⁰` moves by less than `10⁻³`,
/// so it changes only when it lies that close to an integer (for seed 7, 1 of
/// 1,000,000 draws: `integer_power_draws_the_keys_of_powf`).
#[inline]
fn int_power(mut x: f64, mut n: u32) -> f64 {
    if n == 100 {
        // θ = 0.99, YCSB's constant: x^64 · x^32 · x^4, unrolled.
        let x4 = (x * x) * (x * x);
        let x32 = {
            let x16 = (x4 * x4) * (x4 * x4);
            x16 * x16
        };
        return (x32 * x32) * x32 * x4;
    }
    let mut acc = 1.0;
    while n > 0 {
        if n & 1 == 1 {
            acc *= x;
        }
        x *= x;
        n >>= 1;
    }
    acc
}

impl ZipfianGenerator {
    /// Ranks `[min, max]` with exponent `theta`, computing `ζ(max - min + 1, θ)`
    /// (linear in the item count). `None` if `max < min`, or `theta` is not in
    /// `(0, 1)` (YCSB's formula divides by `1 - θ`).
    pub fn new(min: u64, max: u64, theta: f64) -> Option<Self> {
        let items = max.checked_sub(min)?.checked_add(1)?;
        Self::with_zetan(min, max, theta, zeta(items, theta))
    }

    /// Like [`Self::new`] with `ζ(max - min + 1, θ)` given (YCSB's constructor with
    /// `zetan`, used by the scrambled generator to skip the sum).
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Option<Self> {
        let items = max.checked_sub(min)?.checked_add(1)?;
        let valid = theta > 0.0 && theta < 1.0 && zetan.is_finite() && zetan >= 1.0;
        if !valid {
            return None;
        }
        let zeta2theta = zeta(2, theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Some(Self {
            base: min,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            second_rank_below: 1.0 + 0.5f64.powf(theta),
            int_alpha: integer_exponent(1.0 / (1.0 - theta)),
        })
    }

    /// The number of ranks.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The exponent.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// `ζ(items, θ)`: the most popular rank has probability `1 / zetan`.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The next rank (YCSB's `nextLong(items)`).
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.draw(rng, |base| match self.int_alpha {
            Some(n) => int_power(base, n),
            None => base.powf(self.alpha),
        })
    }

    /// [`Self::next`] with YCSB's `powf` always (the draw before the integer power):
    /// what the tests compare the integer power with.
    #[cfg(test)]
    fn next_powf<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.draw(rng, |base| base.powf(self.alpha))
    }

    /// One draw, with `power` raising its base to `α`.
    #[inline]
    fn draw<R: Rng + ?Sized>(&self, rng: &mut R, power: impl Fn(f64) -> f64) -> u64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < self.second_rank_below {
            return self.base + 1;
        }
        let rank = (self.items as f64 * power(self.eta * u - self.eta + 1.0)) as u64;
        self.base + rank
    }
}

/// YCSB's `ScrambledZipfianGenerator` with the Zipfian constant 0.99: a rank of a
/// Zipfian over [`YCSB_ITEM_COUNT`] items, hashed onto `[min, max]`. See the module
/// docs for the resulting skew.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    ranks: ZipfianGenerator,
}

impl ScrambledZipfian {
    /// Values in `[min, max]`; `None` if `max < min` or the range holds every `u64`.
    pub fn new(min: u64, max: u64) -> Option<Self> {
        let item_count = max.checked_sub(min)?.checked_add(1)?;
        // YCSB: `new ZipfianGenerator(0, ITEM_COUNT, 0.99, ZETAN)`.
        let ranks = ZipfianGenerator::with_zetan(0, YCSB_ITEM_COUNT, ZIPFIAN_CONSTANT, YCSB_ZETAN)?;
        Some(Self {
            min,
            item_count,
            ranks,
        })
    }

    /// How many values the generator can return.
    pub fn item_count(&self) -> u64 {
        self.item_count
    }

    /// Where rank `rank` of the underlying Zipfian lands (rank 0 is the hottest).
    pub fn value_of_rank(&self, rank: u64) -> u64 {
        self.min + fnv_hash64(rank) % self.item_count
    }

    /// The next value.
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.value_of_rank(self.ranks.next(rng))
    }

    /// [`Self::next`] with YCSB's `powf` (see [`ZipfianGenerator::next_powf`]).
    #[cfg(test)]
    fn next_powf<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.value_of_rank(self.ranks.next_powf(rng))
    }
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
    fn zipfian_top_ranks_have_their_exact_probability() {
        let seed = 7;
        let zipf = ZipfianGenerator::new(0, 999, ZIPFIAN_CONSTANT).unwrap();
        let mut rng = rng(seed);
        let draws = 400_000u64;
        let mut counts = vec![0u64; 1000];
        for _ in 0..draws {
            let rank = zipf.next(&mut rng);
            assert!(rank < 1000, "seed {seed}: rank {rank} out of range");
            counts[rank as usize] += 1;
        }
        let p0 = 1.0 / zipf.zetan();
        let p1 = 0.5f64.powf(ZIPFIAN_CONSTANT) / zipf.zetan();
        for (rank, p) in [(0, p0), (1, p1)] {
            let freq = counts[rank] as f64 / draws as f64;
            assert!(
                (freq - p).abs() < 0.05 * p,
                "seed {seed}: rank {rank} frequency {freq}, expected {p}"
            );
        }
        // Popularity decreases with rank (in aggregate over decades).
        let decade = |a: usize, b: usize| counts[a..b].iter().sum::<u64>() as f64 / (b - a) as f64;
        assert!(decade(2, 10) > decade(10, 100));
        assert!(decade(10, 100) > decade(100, 1000));
    }

    #[test]
    fn zipfian_refuses_bad_parameters() {
        assert!(ZipfianGenerator::new(5, 4, 0.99).is_none());
        assert!(ZipfianGenerator::new(0, 9, 1.0).is_none());
        assert!(ZipfianGenerator::new(0, 9, 0.0).is_none());
        assert!(ZipfianGenerator::new(0, 9, f64::NAN).is_none());
        assert!(ZipfianGenerator::new(0, u64::MAX, 0.5).is_none());
        assert!(ScrambledZipfian::new(1, 0).is_none());
        assert!(ScrambledZipfian::new(0, u64::MAX).is_none());
    }

    /// The hottest key (where rank 0 lands) gets `1/ζ(10¹⁰)` of the draws, plus about
    /// `1/keys` of the remaining mass from the tail ranks folded onto it.
    #[test]
    fn scrambled_hottest_key_has_the_ycsb_frequency() {
        let seed = 11;
        let keys = 100_000u64;
        let zipf = ScrambledZipfian::new(0, keys - 1).unwrap();
        let mut rng = rng(seed);
        let draws = 400_000u64;
        let mut counts = vec![0u32; keys as usize];
        for _ in 0..draws {
            let key = zipf.next(&mut rng);
            assert!(key < keys, "seed {seed}: key {key} out of range");
            counts[key as usize] += 1;
        }
        let hottest = zipf.value_of_rank(0);
        let observed_hottest = (0..keys as usize).max_by_key(|&k| counts[k]).unwrap();
        assert_eq!(observed_hottest as u64, hottest, "seed {seed}");
        let expected = 1.0 / YCSB_ZETAN + (1.0 - 1.0 / YCSB_ZETAN) / keys as f64;
        let freq = f64::from(counts[hottest as usize]) / draws as f64;
        assert!(
            (freq - expected).abs() < 0.05 * expected,
            "seed {seed}: hottest key frequency {freq}, expected {expected}"
        );
        let second = zipf.value_of_rank(1);
        let expected = 0.5f64.powf(ZIPFIAN_CONSTANT) / YCSB_ZETAN;
        let freq = f64::from(counts[second as usize]) / draws as f64;
        assert!(
            (freq - expected).abs() < 0.08 * expected,
            "seed {seed}: second key frequency {freq}, expected {expected}"
        );
    }

    #[test]
    fn scrambled_reaches_every_key() {
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
    fn integer_power_is_exact_enough() {
        assert_eq!(integer_exponent(1.0 / (1.0 - ZIPFIAN_CONSTANT)), Some(100));
        assert_eq!(integer_exponent(2.0), Some(2));
        assert_eq!(integer_exponent(1.0 / (1.0 - 0.5)), Some(2));
        assert_eq!(integer_exponent(1.0 / (1.0 - 0.7)), None);
        assert_eq!(integer_exponent(1e6), None);
        for n in [1u32, 2, 3, 7, 100, 4096] {
            for x in [0.0, 1e-3, 0.5, 0.9, 0.999_999, 1.0] {
                let (fast, exact) = (int_power(x, n), x.powf(f64::from(n)));
                assert!(
                    (fast - exact).abs() <= 1e-13 * exact,
                    "{x}^{n}: {fast} against {exact}"
                );
            }
        }
    }

    /// The draw with the integer power is YCSB's draw with `powf`: the same ranks for
    /// the same uniform draws but for a handful at integer boundaries, so the same
    /// sequence of keys and the same frequencies of the hottest keys.
    #[test]
    fn integer_power_draws_the_keys_of_powf() {
        let seed = 7;
        for keys in [10_000u64, 100_000] {
            let zipf = ScrambledZipfian::new(0, keys).unwrap();
            let (mut a, mut b) = (rng(seed), rng(seed));
            let draws = 1_000_000usize;
            let (mut fast, mut slow) =
                (vec![0u32; keys as usize + 1], vec![0u32; keys as usize + 1]);
            let mut differ = 0;
            for _ in 0..draws {
                let (x, y) = (zipf.next(&mut a), zipf.next_powf(&mut b));
                differ += usize::from(x != y);
                fast[x as usize] += 1;
                slow[y as usize] += 1;
            }
            eprintln!("seed {seed}, {keys} keys: {differ} of {draws} draws differ from powf's");
            assert!(
                differ <= draws / 100_000,
                "seed {seed}, {keys} keys: {differ} of {draws} draws differ"
            );
            let mut hottest: Vec<usize> = (0..slow.len()).collect();
            hottest.sort_by_key(|&k| std::cmp::Reverse(slow[k]));
            for &k in &hottest[..20] {
                let (f, s) = (f64::from(fast[k]), f64::from(slow[k]));
                assert!(
                    (f - s).abs() <= 0.01 * s,
                    "seed {seed}, {keys} keys: key {k} drawn {f} times, {s} with powf"
                );
            }
        }
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
