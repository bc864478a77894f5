//! Seeds for randomized simulation tests, and reproducing a failing one.
//!
//! A randomized test runs a scenario for many seeds. When one fails, the panic
//! message alone is useless without the seed, so every seed runs under a
//! [`SeedGuard`] that prints
//! `simulation failed with seed N (rerun with SWARM_SIM_SEED=N)` while the panic
//! unwinds (and the world prints the tail of its trace, see
//! [`super::SimWorld`]). Setting that variable makes [`seeds`] yield exactly that
//! seed; `SWARM_SIM_SEEDS=K` runs `K` seeds instead of the test's default count
//! (a longer soak on demand); `SWARM_SIM_SEED_BASE=B` runs seeds from `B` on
//! instead of from 0, so that each CI run explores new schedules (CI picks a random
//! base and prints it; a failure prints its seed, which `SWARM_SIM_SEED` replays).

use alloc::string::String;
use alloc::vec::Vec;
use core::ops::Range;

/// Environment variable naming the one seed to run.
pub const SEED_VAR: &str = "SWARM_SIM_SEED";
/// Environment variable overriding how many seeds to run.
pub const SEEDS_VAR: &str = "SWARM_SIM_SEEDS";
/// Environment variable moving the first seed of every run (0 by default).
pub const SEED_BASE_VAR: &str = "SWARM_SIM_SEED_BASE";

/// What the environment asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    One(u64),
    Many(Range<u64>),
}

fn parse_u64(var: &str, value: &str) -> Result<u64, String> {
    value.trim().parse().map_err(|_| {
        alloc::format!(
            "{var} must be an unsigned 64-bit integer, got {value:?}; unset it or fix it"
        )
    })
}

/// Decides which seeds to run from the three variables' values.
fn plan(
    seed: Option<&str>,
    count: Option<&str>,
    base: Option<&str>,
    default: u64,
) -> Result<Plan, String> {
    if let Some(seed) = seed {
        return parse_u64(SEED_VAR, seed).map(Plan::One);
    }
    let count = match count {
        Some(count) => parse_u64(SEEDS_VAR, count)?,
        None => default,
    };
    let base = match base {
        Some(base) => parse_u64(SEED_BASE_VAR, base)?,
        None => 0,
    };
    Ok(Plan::Many(base..base.saturating_add(count)))
}

/// The first seed of a run: `$SWARM_SIM_SEED_BASE`, or 0. For tests that draw
/// their own seeds (a fixed list of regression seeds plus a few others): add it to
/// the others.
///
/// # Panics
/// If the variable is set but is not an unsigned integer.
pub fn seed_base() -> u64 {
    match std::env::var(SEED_BASE_VAR) {
        Ok(base) => parse_u64(SEED_BASE_VAR, &base).unwrap_or_else(|message| panic!("{message}")),
        Err(_) => 0,
    }
}

/// The seeds a randomized test should run: `0..count` by default,
/// `0..$SWARM_SIM_SEEDS` if that is set, starting at `$SWARM_SIM_SEED_BASE`
/// instead of 0 if that is set, only `$SWARM_SIM_SEED` if that is set.
///
/// # Panics
/// If either variable is set but is not an unsigned integer: running other seeds
/// than the ones asked for would silently hide the reproduction.
pub fn seeds(count: u64) -> Vec<u64> {
    let seed = std::env::var(SEED_VAR).ok();
    let many = std::env::var(SEEDS_VAR).ok();
    let base = std::env::var(SEED_BASE_VAR).ok();
    match plan(seed.as_deref(), many.as_deref(), base.as_deref(), count) {
        Ok(Plan::One(seed)) => alloc::vec![seed],
        Ok(Plan::Many(range)) => range.collect(),
        Err(message) => panic!("{message}"),
    }
}

/// Runs `scenario` once per seed of [`seeds`]`(count)`, each under a [`SeedGuard`].
pub fn for_each_seed(count: u64, mut scenario: impl FnMut(u64)) {
    for seed in seeds(count) {
        let _guard = SeedGuard::new(seed);
        scenario(seed);
    }
}

/// The line printed when the run of `seed` fails.
fn hint(seed: u64) -> String {
    alloc::format!("simulation failed with seed {seed} (rerun with {SEED_VAR}={seed})")
}

/// Prints how to reproduce a simulation if it is dropped during a panic.
#[derive(Debug)]
pub struct SeedGuard {
    seed: u64,
}

impl SeedGuard {
    /// Guards the run of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The guarded seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::eprintln!("{}", hint(self.seed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_follows_the_variables() {
        assert_eq!(plan(None, None, None, 5), Ok(Plan::Many(0..5)));
        assert_eq!(plan(None, Some("12"), None, 5), Ok(Plan::Many(0..12)));
        assert_eq!(
            plan(None, None, Some("1000"), 5),
            Ok(Plan::Many(1000..1005))
        );
        assert_eq!(plan(None, Some("2"), Some("7"), 5), Ok(Plan::Many(7..9)));
        assert_eq!(
            plan(Some(" 42 "), Some("12"), Some("7"), 5),
            Ok(Plan::One(42)),
            "one seed asked for wins"
        );
        let error = plan(Some("x"), None, None, 5).unwrap_err();
        assert!(error.contains("SWARM_SIM_SEED"), "{error}");
        assert!(plan(None, Some("-1"), None, 5).is_err());
        let error = plan(None, None, Some("base"), 5).unwrap_err();
        assert!(error.contains("SWARM_SIM_SEED_BASE"), "{error}");
    }

    #[test]
    fn guard_is_silent_without_a_panic_and_reports_with_one() {
        assert_eq!(
            hint(17),
            "simulation failed with seed 17 (rerun with SWARM_SIM_SEED=17)"
        );
        let guard = SeedGuard::new(9);
        assert_eq!(guard.seed(), 9);
        drop(guard);
        let result = std::panic::catch_unwind(|| {
            let _guard = SeedGuard::new(17);
            panic!("scenario failed");
        });
        assert!(result.is_err());
    }
}
